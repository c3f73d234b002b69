"""Creating tensors, with torch's names. Random numbers come from a Generator: the default one (seeded by
manual_seed) or the one passed as `generator=`."""
import copy

import numpy as np

from . import dtype as dt
from .graph import const
from .runtime import get as get_runtime
from .mixins import arange, cat  # noqa: F401  (torch.arange, torch.cat: the mixins use them too)
from .tensor import Tensor
from . import complex as _complex


class Generator:
    """A source of random numbers, as torch.Generator: `Generator().manual_seed(s)` makes whatever is drawn
    from it reproducible (`tinyllm.randn(..., generator=g)`, `tinyllm.sampling.sample(..., generator=g)`).
    It holds a NumPy Generator (PCG64), reseeded in place, so a reference to it stays valid; seed s gives the
    stream of `np.random.default_rng(s)`. Random numbers are drawn on the host whatever the device (`device`
    is accepted for torch's signature)."""

    def __init__(self, device=None):
        self._np = np.random.default_rng(0)
        self._initial_seed = 0

    def manual_seed(self, seed):
        """Seed it; returns the generator, as torch. A negative seed is taken modulo 2⁶⁴, as torch does."""
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"Generator.manual_seed: the seed must be an int, got {type(seed).__name__} {seed!r:.40}")
        seed = int(seed)
        if not -2 ** 63 <= seed < 2 ** 64:
            raise ValueError(f"Generator.manual_seed: seed {seed} is out of range [-2**63, 2**64)")
        seed %= 2 ** 64
        self._np.bit_generator.state = np.random.PCG64(seed).state
        self._initial_seed = seed
        return self

    def seed(self):
        """Seed it from the operating system's entropy; returns that seed (so it can be reported and reused)."""
        seed = int(np.random.SeedSequence().entropy) % 2 ** 64
        self.manual_seed(seed)
        return seed

    def initial_seed(self):
        """The seed it was last seeded with (0 for a generator never seeded)."""
        return self._initial_seed

    def get_state(self):
        """Its state, to restore later with set_state: NumPy's bit-generator state, a JSON-able dict (torch gives a
        byte tensor; this one can go into a checkpoint's JSON)."""
        return copy.deepcopy(self._np.bit_generator.state)

    def set_state(self, state):
        if not isinstance(state, dict) or state.get("bit_generator") != type(self._np.bit_generator).__name__:
            raise ValueError("Generator.set_state: expected a state returned by Generator.get_state(), got "
                             f"{type(state).__name__} {state!r:.60}")
        self._np.bit_generator.state = state
        return self

    def __repr__(self):
        return f"tinyllm.Generator(initial_seed={self._initial_seed})"


default_generator = Generator()


def manual_seed(seed):
    """Seed the default generator (what every random function draws from unless given `generator=`); returns it,
    as torch.manual_seed."""
    return default_generator.manual_seed(seed)


def generator():
    """The default generator's NumPy Generator (nn's initializers draw from it; a checkpoint saves its state)."""
    return default_generator._np


def numpy_generator(generator=None):
    """The NumPy Generator to draw from: the default one, a tinyllm.Generator's, or a numpy.random.Generator as is."""
    if generator is None:
        return default_generator._np
    if isinstance(generator, Generator):
        return generator._np
    if isinstance(generator, np.random.Generator):
        return generator
    kind = type(generator)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    raise TypeError(f"generator: expected a tinyllm.Generator (or a numpy.random.Generator), got {name}: make one "
                    "with tinyllm.Generator().manual_seed(seed)")


def _shape(size):
    return tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)


def tensor(data, dtype=None, device=None, requires_grad=False):
    if (dtype is not None and dt.to_dtype(dtype).is_complex) or np.iscomplexobj(data):
        return _complex.from_numpy(data, dtype, device, requires_grad)
    return Tensor(data, dtype=dtype, device=device, requires_grad=requires_grad)


def full(size, fill_value, dtype=None, device=None, requires_grad=False):
    """A constant: it takes no memory until something needs it as a buffer."""
    if (dtype is not None and dt.to_dtype(dtype).is_complex) or isinstance(fill_value, complex):
        out = _complex.full(size, fill_value, dtype, device)
        return out.requires_grad_() if requires_grad else out
    if dtype is None:
        dtype = dt.bool_ if isinstance(fill_value, bool) else dt.int64 if isinstance(fill_value, int) else dt.float32
    node = const(fill_value, tuple(size), dt.to_dtype(dtype))
    return Tensor._from_node(node, get_runtime(device).name, requires_grad=requires_grad)


def zeros(*size, dtype=dt.float32, device=None, requires_grad=False):
    return full(_shape(size), 0, dtype, device, requires_grad)


def ones(*size, dtype=dt.float32, device=None, requires_grad=False):
    return full(_shape(size), 1, dtype, device, requires_grad)


def zeros_like(x, dtype=None): return full(x.shape, 0, dtype or x.dtype, x.device)
def ones_like(x, dtype=None): return full(x.shape, 1, dtype or x.dtype, x.device)
def full_like(x, value, dtype=None): return full(x.shape, value, dtype or x.dtype, x.device)


def randn(*size, dtype=dt.float32, device=None, requires_grad=False, generator=None):
    if dt.to_dtype(dtype).is_complex:  # as torch: real and imaginary parts each of variance 1/2
        data = numpy_generator(generator).standard_normal(_shape(size) + (2,), dtype=np.float64) * np.sqrt(0.5)
        return tensor(data[..., 0] + 1j * data[..., 1], dtype, device, requires_grad)
    data = numpy_generator(generator).standard_normal(_shape(size), dtype=np.float64)
    return Tensor(data, dtype=dtype, device=device, requires_grad=requires_grad)


def rand(*size, dtype=dt.float32, device=None, requires_grad=False, generator=None):
    data = numpy_generator(generator).random(_shape(size))
    return Tensor(data, dtype=dtype, device=device, requires_grad=requires_grad)


def randint(low, high=None, size=(), dtype=dt.int64, device=None, generator=None):
    if high is None:
        low, high = 0, low
    return Tensor(numpy_generator(generator).integers(low, high, size=tuple(size)), dtype=dtype, device=device)


def randn_like(x): return randn(*x.shape, dtype=x.dtype, device=x.device)
def rand_like(x): return rand(*x.shape, dtype=x.dtype, device=x.device)


def bernoulli_mask(shape, keep, device=None, generator=None):
    """A bool tensor, true with probability `keep` (dropout's mask)."""
    return Tensor(numpy_generator(generator).random(tuple(shape)) < keep, device=device)


def multinomial(probs, num_samples=1, generator=None):
    """Draw `num_samples` indices per row of `probs` (with replacement), as torch.multinomial. Eager: it reads
    the probabilities now; sampling has no gradient."""
    p = probs.detach().numpy().astype(np.float64)
    p2 = p.reshape(-1, p.shape[-1])
    if (p2 < 0).any() or not np.isfinite(p2).all() or (p2.sum(-1) <= 0).any():
        raise RuntimeError("multinomial: probabilities must be finite, non-negative and not all zero in a row")
    p2 = p2 / p2.sum(-1, keepdims=True)
    rng = numpy_generator(generator)
    out = np.stack([rng.choice(p2.shape[-1], size=num_samples, p=row) for row in p2])
    return Tensor(out.reshape(p.shape[:-1] + (num_samples,)), device=probs.device)


def stack(tensors, dim=0):
    tensors = list(tensors)
    if not tensors:
        raise ValueError("stack: expected a non-empty list of tensors")
    shapes = {t.shape for t in tensors}
    if len(shapes) > 1:
        raise RuntimeError(f"stack: all tensors must have one shape, got {sorted(shapes)}")
    d = dim if dim >= 0 else dim + tensors[0].ndim + 1
    return cat([t.unsqueeze(d) for t in tensors], d)


def where(condition, x, y):
    if any(isinstance(v, Tensor) and v.is_complex() for v in (x, y)):  # both parts chosen by one condition
        z = x if isinstance(x, Tensor) and x.is_complex() else y
        x, y = z._as_complex(x), z._as_complex(y)
        return _complex.complex(condition.where(x.real, y.real), condition.where(x.imag, y.imag))
    return condition.where(x, y)


def eye(n, m=None, dtype=dt.float32, device=None, requires_grad=False):
    """The n x m identity: ones where the row index equals the column index (a comparison, no memory until used)."""
    m = n if m is None else m
    rows, cols = arange(n, device=device).reshape(n, 1), arange(m, device=device).reshape(1, m)
    out = (rows == cols).to(dt.to_dtype(dtype))
    return out.requires_grad_() if requires_grad else out


def linspace(start, end, steps, dtype=None, device=None, requires_grad=False):
    """`steps` values from start to end, evenly spaced, as torch: the first half counted up from start, the second
    down from end, so both ends are exact."""
    if steps < 0:
        raise RuntimeError(f"linspace: number of steps must be non-negative, got {steps}")
    dtype = dt.to_dtype(dtype) if dtype is not None else dt.float32
    step = (end - start) / (steps - 1) if steps > 1 else 0.0
    i = np.arange(steps, dtype=np.float64)
    values = np.where(i < steps // 2, start + i * step, end - (steps - 1 - i) * step)
    return tensor(values, dtype=dtype, device=device, requires_grad=requires_grad)


def from_numpy(array):
    """A tensor of a NumPy array's values, its dtype kept (torch.from_numpy). The tensor holds a copy: tinyllm's
    buffers belong to their runtime, so later writes to the array do not reach it."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy: expected a numpy.ndarray, got {type(array).__name__} (tinyllm.tensor takes "
                        "lists and numbers)")
    return tensor(array) if array.dtype.kind == "c" else Tensor(array)
