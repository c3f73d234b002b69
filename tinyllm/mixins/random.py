"""In-place random fills, as Tensor methods (torch's `exponential_`, `uniform_`, `normal_`, `bernoulli_`,
`geometric_`, `random_`): the values are drawn on the host from the default generator (`tinyllm.manual_seed`) or
the `generator=` passed, in float64, then rounded once to the tensor's dtype, and the tensor is rebound to them as
any in-place update is (they carry no gradient)."""
import numbers

import numpy as np

from .. import dtype as dt
from ..random import numpy_generator
from . import TensorLike, new_tensor


def _number(value, name, what):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: {what} must be a number, got {type(value).__name__} {value!r:.40}")
    return float(value)


class RandomFills(TensorLike):
    __slots__ = ()

    def _fill(self, values, name):
        return self._update(new_tensor(values, dtype=self.dtype, device=self.device), name)

    def _draw(self, generator):
        return numpy_generator(generator)

    def exponential_(self, lambd=1.0, *, generator=None):
        """Exponential(λ) values, density λe^(-λx), mean 1/λ."""
        lambd = _number(lambd, "exponential_", "lambd")
        if not lambd > 0:
            raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd:g}")
        return self._fill(self._draw(generator).exponential(1.0 / lambd, self.shape), "exponential_")

    def uniform_(self, a=0.0, b=1.0, *, generator=None):
        """Uniform values in [a, b)."""
        a, b = _number(a, "uniform_", "a"), _number(b, "uniform_", "b")
        if a > b:
            raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={a} > to={b}")
        return self._fill(a + (b - a) * self._draw(generator).random(self.shape), "uniform_")

    def normal_(self, mean=0.0, std=1.0, *, generator=None):
        """Normal(mean, std²) values."""
        mean, std = _number(mean, "normal_", "mean"), _number(std, "normal_", "std")
        if std < 0:
            raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
        return self._fill(mean + std * self._draw(generator).standard_normal(self.shape), "normal_")

    def bernoulli_(self, p=0.5, *, generator=None):
        """1 with probability p, else 0 (p a number, or a tensor of probabilities broadcast to this shape)."""
        if isinstance(p, TensorLike):
            p = np.broadcast_to(p.detach().numpy().astype(np.float64), self.shape)
            bad = (p < 0) | (p > 1) | np.isnan(p)
            if bad.any():
                raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p[bad].flat[0]}")
        else:
            p = _number(p, "bernoulli_", "p")
            if not 0 <= p <= 1:
                raise RuntimeError(f"bernoulli_ expects p to be in [0, 1], but got p={p}")
        return self._fill(self._draw(generator).random(self.shape) < p, "bernoulli_")

    def geometric_(self, p, *, generator=None):
        """The number of Bernoulli(p) trials up to the first success: 1, 2, ... (P(k) = (1-p)^(k-1) p)."""
        p = _number(p, "geometric_", "p")
        if not 0 < p < 1:
            raise RuntimeError(f"geometric_ expects p to be in (0, 1), but got p={p}")
        return self._fill(self._draw(generator).geometric(p, self.shape).astype(np.float64), "geometric_")

    def random_(self, from_=0, to=None, *, generator=None):
        """Integers drawn uniformly from [from_, to - 1]; `random_(to)` draws from [0, to - 1]; without bounds, from
        [0, 2^mantissa] for a float dtype (every integer it holds exactly) and [0, max] for an integer one, as torch."""
        if to is None and from_ != 0:
            from_, to = 0, from_
        if to is None:
            if self.dtype.is_float:
                to = 2 ** (dt.finfo(self.dtype).nmant + 1) + 1
            elif self.dtype is dt.bool_:
                to = 2
            else:
                to = int(np.iinfo(self.dtype.np).max) + 1
        from_, to = int(from_), int(to)
        if from_ >= to:
            raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={from_} >= to={to}")
        values = self._draw(generator).integers(from_, to, self.shape, dtype=np.int64, endpoint=False) \
            if to <= 2 ** 63 else self._draw(generator).integers(from_, to - 1, self.shape, endpoint=True)
        return self._fill(values, "random_")
