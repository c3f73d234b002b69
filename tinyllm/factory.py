"""Creating tensors, with torch's names. Random numbers come from a Generator: the default one (seeded by
manual_seed) or the one passed as `generator=`."""
import numpy as np

from . import dtype as dt
from .graph import const
from .runtime import get as get_runtime
from .mixins import arange, cat  # noqa: F401  (torch.arange, torch.cat: the mixins use them too)
from .tensor import Tensor
from .random import Generator, default_generator, manual_seed, generator, numpy_generator  # noqa: F401
from . import complex as _complex


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


def multinomial(probs, num_samples=1, replacement=False, *, generator=None):
    """`num_samples` category indices per row of `probs` (1-D or 2-D, non-negative weights, not necessarily summing
    to 1), as torch.multinomial. Without replacement the draws are sequential, each from the categories not yet
    drawn in proportion to their weights; that is exactly the order of an exponential race (category i's key
    E_i / p_i, E_i ~ Exponential(1): the smallest keys first), which is how they are drawn. Eager: it reads the
    probabilities now; sampling has no gradient."""
    if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples <= 0:
        raise RuntimeError(f"multinomial: cannot sample n_sample <= 0 samples (got num_samples={num_samples})")
    if probs.ndim not in (1, 2):
        raise RuntimeError(f"multinomial: prob_dist must be 1 or 2 dim, got shape {probs.shape}")
    if not probs.dtype.is_float:
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: {probs.dtype.name}")
    p = probs.detach().numpy().astype(np.float64)
    p2 = p.reshape(-1, p.shape[-1])
    n = p2.shape[-1]
    if n == 0:
        raise RuntimeError("multinomial: number of categories cannot be zero")
    if not replacement and num_samples > n:
        raise RuntimeError("multinomial: cannot sample n_sample > prob_dist.size(-1) samples without replacement "
                           f"(n_sample={num_samples}, categories={n})")
    if (p2 < 0).any() or not np.isfinite(p2).all():
        raise RuntimeError("multinomial: probability tensor contains either `inf`, `nan` or element < 0")
    if (p2.sum(-1) <= 0).any():
        raise RuntimeError("multinomial: invalid multinomial distribution (sum of probabilities <= 0)")
    rng = numpy_generator(generator)
    if replacement:
        cum = np.cumsum(p2, -1)
        u = rng.random((p2.shape[0], num_samples)) * cum[:, -1:]
        out = np.stack([np.minimum(np.searchsorted(c, row, side="right"), n - 1) for c, row in zip(cum, u)])
    else:
        with np.errstate(divide="ignore"):  # p = 0: key inf, drawn only once the others are, lowest index first,
            keys = rng.standard_exponential(p2.shape) / p2  # as torch's
        out = np.argsort(keys, -1, kind="stable")[:, :num_samples]
    return Tensor(out.reshape(p.shape[:-1] + (num_samples,)), dtype=dt.int64, device=probs.device)


def empty(*size, dtype=dt.float32, device=None, requires_grad=False, memory_format=None):
    """torch.empty: torch leaves the values unset; tinyllm's are zeros (a constant, no memory until used)."""
    return full(_shape(size), 0, dtype, device, requires_grad)


def empty_like(x, dtype=None, device=None, requires_grad=False, memory_format=None):
    return full(x.shape, 0, dtype or x.dtype, device or x.device, requires_grad)


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


def _evenly_spaced(start, end, steps, name):
    """linspace's values in float64: the first half counted up from start, the second down from end, so both ends
    are exact (torch's)."""
    if steps < 0:
        raise RuntimeError(f"{name}: number of steps must be non-negative, got {steps}")
    step = (end - start) / (steps - 1) if steps > 1 else 0.0
    i = np.arange(steps, dtype=np.float64)
    return np.where(i < steps // 2, start + i * step, end - (steps - 1 - i) * step)


def linspace(start, end, steps, dtype=None, device=None, requires_grad=False):
    """`steps` values from start to end, evenly spaced, as torch, both ends exact."""
    dtype = dt.to_dtype(dtype) if dtype is not None else dt.float32
    values = _evenly_spaced(start, end, steps, "linspace")
    return tensor(values, dtype=dtype, device=device, requires_grad=requires_grad)


def logspace(start, end, steps, base=10.0, dtype=None, device=None, requires_grad=False):
    """`steps` values from base^start to base^end, their exponents evenly spaced (torch.logspace): base raised to
    linspace's exponents, each end exact."""
    dtype = dt.to_dtype(dtype) if dtype is not None else dt.float32
    values = np.power(float(base), _evenly_spaced(start, end, steps, "logspace"))
    if not dtype.is_float:
        values = np.trunc(values)
    return tensor(values, dtype=dtype, device=device, requires_grad=requires_grad)


def from_numpy(array):
    """A tensor of a NumPy array's values, its dtype kept (torch.from_numpy). The tensor holds a copy: tinyllm's
    buffers belong to their runtime, so later writes to the array do not reach it."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy: expected a numpy.ndarray, got {type(array).__name__} (tinyllm.tensor takes "
                        "lists and numbers)")
    return tensor(array) if array.dtype.kind == "c" else Tensor(array)
