"""Reductions: sums, means, variances, extrema, arg-extrema, logsumexp, softmax, and what gathers along a dim."""
import functools
import math

import numpy as np

from .. import autocast_mode as _autocast, dtype as dt
from ..graph import Node, build, const
from ..rewrite import autocast as _autocast_pass
from ..views import is_contiguous, strides_of, view_strides
from . import MaxResult, TensorLike, arange, broadcast_shape, cat, from_node, new_tensor


class Reduce(TensorLike):
    __slots__ = ()

    # ---- reductions ----
    def _dim(self, d, name):
        n = max(self.ndim, 1)
        if not isinstance(d, (int, np.integer)) or not -n <= d < n:
            raise IndexError(f"{name}: dimension {d} out of range for a tensor of shape {self.shape} "
                             f"(expected in [{-n}, {n - 1}])")
        return d % n

    def _dims(self, dim, name):
        if dim is None:
            return tuple(range(self.ndim))
        dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
        axes = [self._dim(d, name) for d in dims]
        if len(set(axes)) != len(axes):
            raise RuntimeError(f"{name}: dims {dims} name a dimension more than once (tensor of shape {self.shape})")
        return tuple(sorted(axes)) if self.ndim else ()

    def _reduce(self, op, dim, keepdim, name):
        axes = self._dims(dim, name)
        out = self._make(build(op, self._node, arg=axes)) if axes else self
        if keepdim:
            return out
        return out.reshape(*[s for i, s in enumerate(self.shape) if i not in axes])

    def sum(self, dim=None, keepdim=False, dtype=None):
        x = self if self.dtype.is_float or self.dtype is dt.int64 else self.long()
        x = x if dtype is None else x.to(dtype)
        return x._reduce("SUM", dim, keepdim, "sum")

    def prod(self, dim=None, keepdim=False, dtype=None):
        """Π over `dim` (integers and bools as int64, as torch): the reduced axes flattened into one, multiplied
        pairwise in ⌈log₂ n⌉ elementwise steps. Exact with zeros, so the gradient (the product rule through the
        steps) is torch's, where dy·y/x would be nan."""
        x = self if self.dtype.is_float else self.long()
        x = x if dtype is None else x.to(dtype)
        axes = self._dims(dim, "prod")
        kept = [a for a in range(self.ndim) if a not in axes]
        x = x.permute(*kept, *axes).reshape(*[self.shape[a] for a in kept], math.prod(self.shape[a] for a in axes))
        if x.shape[-1] == 0:  # the empty product: 1, through a sum of nothing so the (empty) gradient reaches x
            x = x.sum(-1, keepdim=True) + 1
        while x.shape[-1] != 1:
            if x.shape[-1] % 2:  # the odd one out meets a 1
                x = cat([x, from_node(const(1, x.shape[:-1] + (1,), x.dtype), x.device)], -1)
            x = x[..., 0::2] * x[..., 1::2]
        return x.reshape(*[1 if a in axes else s for a, s in enumerate(self.shape)]) if keepdim else x.squeeze(-1)

    def mean(self, dim=None, keepdim=False):
        """Σ / n; over nothing (n = 0) nan, as torch (0 / 0)."""
        axes = self._dims(dim, "mean")
        n = math.prod(self.shape[a] for a in axes)
        total = self._float().sum(axes, keepdim)
        return total / n if n else total * math.nan

    def var(self, dim=None, unbiased=None, keepdim=False, correction=None):
        correction = correction if correction is not None else (0 if unbiased is False else 1)
        axes = self._dims(dim, "var")
        x = self._float()
        d = x - x.mean(axes, keepdim=True)
        return (d * d).sum(axes, keepdim) / max(math.prod(self.shape[a] for a in axes) - correction, 0)

    def std(self, dim=None, unbiased=None, keepdim=False, correction=None):
        return self.var(dim, unbiased, keepdim, correction).sqrt()

    def std_mean(self, dim=None, unbiased=None, keepdim=False, correction=None):
        return self.std(dim, unbiased, keepdim, correction), self.mean(dim, keepdim)


    def lerp(self, end, weight):
        """self + weight·(end - self)."""
        return self + self._as(weight) * (self._as(end) - self)

    def isclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
        """|self - other| <= atol + rtol·|other| between finite values, as torch.isclose: equal values (equal
        infinities too) are close, an infinity is close to nothing else, NaN is close to NaN only with equal_nan."""
        if rtol < 0 or atol < 0:
            raise RuntimeError(f"isclose: {'rtol' if rtol < 0 else 'atol'} must be greater than or equal to zero, "
                               f"but got {rtol if rtol < 0 else atol}")
        other = self._as(other)
        close = self == other
        if self.dtype.is_float or other.dtype.is_float:
            finite = self.isfinite() & other.isfinite()
            close = close | (finite & ((self - other).abs() <= atol + rtol * other.abs()))
        elif self.dtype is not dt.bool_ and (rtol or atol):
            close = close | ((self - other).abs() <= atol + rtol * other.abs())
        return close | (self.isnan() & other.isnan()) if equal_nan else close

    def allclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
        """Whether every element is close (a Python bool: it reads the value, as torch's does)."""
        return bool(self.isclose(other, rtol, atol, equal_nan).all().item())

    def gather(self, dim, index):
        """out[..., i, ...] = self[..., index[..., i, ...], ...] along `dim` (torch.gather): one GATHER from the
        flattened tensor by the linear index, so the gradient is its scatter-add."""
        from .scatter import linear_index
        return self.reshape(-1)[linear_index(self, dim, index, "gather")]

    def diag(self, diagonal=0):
        """A 1-D tensor: the square matrix with it on the `diagonal`-th diagonal. A 2-D one: that diagonal."""
        if self.ndim == 2:
            return self.diagonal(diagonal)
        if self.ndim != 1:
            raise RuntimeError(f"diag: expected a 1-D or 2-D tensor, got shape {self.shape}")
        n = self.shape[0] + abs(diagonal)
        rows, cols = arange(n, device=self.device).reshape(n, 1), arange(n, device=self.device).reshape(1, n)
        on = (cols - rows) == diagonal
        pick = (rows if diagonal >= 0 else cols).expand(n, n).minimum(self.shape[0] - 1)  # v[r] or v[c]
        return on.where(self[pick.reshape(-1)].reshape(n, n), 0)

    def _nonempty(self, dim, name):
        """Raises as torch does where an extremum would reduce over nothing (it has no identity)."""
        if math.prod(self.shape) and all(self.shape[a] for a in self._dims(dim, name)):
            return
        if dim is None:
            error = IndexError if name in ("argmax", "argmin") else RuntimeError
            raise error(f"{name}(): Expected reduction dim to be specified for input.numel() == 0."
                        + ("" if error is IndexError else " Specify the reduction dim with the 'dim' argument."))
        for d in ((dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)):
            if self.shape[self._dim(d, name)] == 0:
                raise IndexError(f"{name}(): Expected reduction dim {d} to have non-zero size.")

    def _empty_fill(self, dim, keepdim, value, dtype):
        """The reduction over a zero-size axis of an op with an identity: `value` in the reduced shape."""
        axes = self._dims(dim, "reduce")
        shape = tuple(1 if a in axes else s for a, s in enumerate(self.shape)) if keepdim else \
            tuple(s for a, s in enumerate(self.shape) if a not in axes)
        return from_node(const(value, shape, dtype), self.device)

    def amax(self, dim=None, keepdim=False): return self._extreme(dim, keepdim, "amax")

    def _extreme(self, dim, keepdim, name, flip=False):
        self._nonempty(dim, name)
        if flip:
            return self._flip()._reduce("REDUCE_MAX", dim, keepdim, name)._flip()
        return self._reduce("REDUCE_MAX", dim, keepdim, name)

    def all(self, dim=None, keepdim=False):
        """Whether every element is true: over nothing True, as torch."""
        if any(self.shape[a] == 0 for a in self._dims(dim, "all")):
            return self._empty_fill(dim, keepdim, True, dt.bool_)
        return self.bool().amin(dim, keepdim)

    def any(self, dim=None, keepdim=False):
        """Whether some element is true: over nothing False, as torch."""
        if any(self.shape[a] == 0 for a in self._dims(dim, "any")):
            return self._empty_fill(dim, keepdim, False, dt.bool_)
        return self.bool().amax(dim, keepdim)

    def amin(self, dim=None, keepdim=False): return self._extreme(dim, keepdim, "amin", flip=True)

    def argmax(self, dim=None, keepdim=False):
        """Index of the first largest value (along `dim`, or of the flattened tensor)."""
        if dim is None:
            self._nonempty(None, "argmax")
            return self.reshape(-1).argmax(0)
        self._nonempty(dim, "argmax")
        d = self._dim(dim, "argmax")
        n = self.shape[d]
        rev = (n - 1) - arange(n, device=self.device).reshape(*[n if i == d else 1 for i in range(self.ndim)])
        hit = self == self.amax(d, keepdim=True)
        return (n - 1) - hit.where(rev, -1).amax(d, keepdim)

    def argmin(self, dim=None, keepdim=False):
        self._nonempty(dim, "argmin")
        return self._flip().argmax(dim, keepdim)

    def max(self, dim=None, keepdim=False):
        """max() is the largest value; max(dim) is (values, indices) along dim, as torch."""
        if isinstance(dim, TensorLike):
            return self.maximum(dim)
        if dim is None:
            return self._extreme(None, False, "max")
        self._nonempty(dim, "max")
        dim = self._dim(dim, "max")
        return MaxResult(self.amax(dim, keepdim), self.argmax(dim, keepdim))

    def min(self, dim=None, keepdim=False):
        if isinstance(dim, TensorLike):
            return self.minimum(dim)
        if dim is None:
            return self._extreme(None, False, "min", flip=True)
        self._nonempty(dim, "min")
        dim = self._dim(dim, "min")
        return MaxResult(self.amin(dim, keepdim), self.argmin(dim, keepdim))

    def logsumexp(self, dim, keepdim=False):
        """log Σ eˣ = m + log Σ e^(x-m) for the (constant) max m; where m is ±inf the shift is 0, so a row of
        -inf gives -inf (as torch) instead of -inf - -inf = nan, and so does a sum over nothing."""
        dim = self._dims(dim, "logsumexp")
        if any(self.shape[a] == 0 for a in dim):
            return self._float().sum(dim, keepdim) - math.inf
        m = self.amax(dim, keepdim=True).detach()
        m = (m.abs() < math.inf).where(m, 0.0)
        out = (self - m).exp().sum(dim, keepdim=True).log() + m
        return out if keepdim else out.squeeze(dim)

    def softmax(self, dim=-1):
        """eˣ / Σ eˣ, shifted by the (constant) row max so nothing overflows."""
        x, dim = self._float(), self._dim(dim, "softmax")
        e = (x - x.amax(dim, keepdim=True).detach()).exp()
        # e · (1/Σ) in x's dtype, not e / Σ (in 16 bits widened to float32): the graph the row and FlashAttention
        # rewrites match (tinyllm/rewrite/rowwise.py, flash.py)
        return e * e.sum(dim, keepdim=True).reciprocal()

    def log_softmax(self, dim=-1):
        x, dim = self._float(), self._dim(dim, "log_softmax")
        s = x - x.amax(dim, keepdim=True).detach()
        return s - s.exp().sum(dim, keepdim=True).log()
