"""Integer and set operations that run on the host, as Tensor methods: bincount, histc, searchsorted, bucketize,
unique, unique_consecutive, isin and equal read their inputs' values now and compute with NumPy (no runtime has a
kernel for them; their results have no gradient, as torch's). Also what a tensor's memory is: data_ptr,
storage_offset, untyped_storage, element_size."""
import numpy as np

from .. import dtype as dt
from ..ops import Group
from . import TensorLike, from_node, new_tensor


class UntypedStorage:
    """What `Tensor.untyped_storage()` gives: the memory a tensor and its views share (torch.UntypedStorage)."""
    __slots__ = ("_address", "_nbytes", "device")

    def __init__(self, address, nbytes, device):
        self._address, self._nbytes, self.device = address, nbytes, device

    def nbytes(self): return self._nbytes
    def size(self): return self._nbytes
    def data_ptr(self): return self._address

    def __repr__(self):
        return f"tinyllm.UntypedStorage(nbytes={self._nbytes}, device='{self.device}')"


def _integers(x, name):
    """x's values as int64, refusing a float or bool tensor."""
    if x.dtype.is_float or x.dtype is dt.bool_:
        raise RuntimeError(f"{name}: expected an integer tensor, got {x.dtype.name}")
    return x.numpy().astype(np.int64)


class HostOps(TensorLike):
    __slots__ = ()

    def _out(self, values, dtype=dt.int64):
        return new_tensor(np.asarray(values), dtype=dtype, device=self.device)

    # ---- memory ----
    def _storage(self):
        base = self._node  # the views' base is realized first, so this tensor is realized as a view of it
        while base.op in Group.VIEW and base.buffer is None:
            base = base.src[0]
        if base is not self._node and base.op != "LOAD" and base.buffer is None:
            from_node(base, self.device).realize()
        self.realize()
        buf = self._node.buffer if self._node.op != "LOAD" else self._node.arg
        return buf.runtime.storage(buf)

    def element_size(self):
        return self.dtype.itemsize

    def data_ptr(self):
        """The address of the first element (realizes the tensor): views of one storage share its address, a
        transpose has its base's, a slice base + offset·itemsize, as torch's."""
        address, offset, _ = self._storage()
        return address + offset * self.dtype.itemsize

    def storage_offset(self):
        """Where the first element sits in the storage, in elements."""
        return self._storage()[1]

    def untyped_storage(self):
        address, _, nbytes = self._storage()
        return UntypedStorage(address, nbytes, self.device)

    # ---- comparisons ----
    def equal(self, other):
        """True when both have one shape and equal values (a Python bool; NaN is never equal), as torch.equal."""
        other = self._as(other)
        return self.shape == other.shape and bool((self == other).all().item())

    def isin(self, test_elements, *, assume_unique=False, invert=False):
        """Whether each element is among `test_elements` (a tensor or a number), as torch.isin."""
        test = test_elements.numpy() if isinstance(test_elements, TensorLike) else np.asarray(test_elements)
        return self._out(np.isin(self.numpy(), test, invert=invert), dt.bool_)

    # ---- counting ----
    def bincount(self, weights=None, minlength=0):
        """How often each value 0, 1, ..., max occurs in a 1-D non-negative integer tensor (at least `minlength`
        bins), or the sum of `weights` at each value, as torch.bincount."""
        if self.ndim != 1 or self.dtype.is_float or self.dtype is dt.bool_:
            raise RuntimeError(f"bincount only supports 1-d non-negative integral inputs (got a {self.ndim}-d "
                               f"{self.dtype.name} tensor)")
        if not isinstance(minlength, int) or minlength < 0:
            raise RuntimeError(f"bincount: minlength should be >= 0, got {minlength}")
        x = self.numpy().astype(np.int64)
        if x.size and x.min() < 0:
            raise RuntimeError(f"bincount only supports 1-d non-negative integral inputs (got the value {x.min()})")
        if weights is None:
            return self._out(np.bincount(x, minlength=minlength))
        if weights.shape != self.shape:
            raise RuntimeError(f"bincount: weights should be 1-d and have the same length as input, got shape "
                               f"{weights.shape} for input {self.shape}")
        out_dtype = dt.float32 if weights.dtype is dt.float32 else dt.float64  # torch's: float32 stays, the rest double
        return self._out(np.bincount(x, weights.numpy().astype(np.float64), minlength), out_dtype)

    def histc(self, bins=100, min=0, max=0):
        """The histogram of the values in `bins` equal bins over [min, max] (min = max = 0: the data's range);
        values outside it are left out, max itself goes in the last bin, as torch.histc."""
        if not self.dtype.is_float:
            raise RuntimeError(f"histc: expected a floating-point tensor, got {self.dtype.name}")
        if bins <= 0:
            raise RuntimeError(f"histc: bins must be > 0, but got {bins}")
        ftype = np.float64 if self.dtype is dt.float64 else np.float32  # torch's arithmetic, in the input's type
        x = self.numpy().astype(ftype).reshape(-1)
        lo, hi = ftype(min), ftype(max)
        if lo == hi and x.size:
            lo, hi = x.min(), x.max()
        if lo == hi:
            lo, hi = lo - 1, hi + 1
        if lo > hi:
            raise RuntimeError(f"histc: max must be larger than min, got min={min} max={max}")
        if not (np.isfinite(lo) and np.isfinite(hi)):
            raise RuntimeError(f"histc: range of [{lo}, {hi}] is not finite")
        x = x[(x >= lo) & (x <= hi)]
        with np.errstate(over="ignore", invalid="ignore"):
            pos = ((x - lo) * ftype(bins) / (hi - lo)).astype(np.int64)  # torch's linear interpolation, no search
        pos = np.minimum(pos, bins - 1)
        return self._out(np.bincount(pos, minlength=bins).astype(np.float64), self.dtype)

    # ---- searching ----
    def searchsorted(self, values, *, out_int32=False, right=False, side=None, sorter=None):
        """For each of `values`, where it would go in this sorted tensor (along its last axis; leading axes match
        `values`'), before equal elements (right=False / side="left") or after them, as torch.searchsorted."""
        if side is not None:
            if side not in ("left", "right"):
                raise RuntimeError(f"searchsorted: side can only be 'left' or 'right', got '{side}'")
            if right and side == "left":
                raise RuntimeError("searchsorted: side and right can't be set to opposites, got side of left "
                                   "while right was True")
            right = side == "right"
        side = "right" if right else "left"
        seq = self.numpy()
        scalar = not isinstance(values, TensorLike)
        vals = np.asarray(values) if scalar else values.numpy()
        if sorter is not None:
            seq = np.take_along_axis(seq, sorter.numpy().astype(np.int64), -1)
        if seq.ndim == 1:
            out = np.searchsorted(seq, vals, side=side)
        else:
            if scalar or seq.shape[:-1] != vals.shape[:-1]:
                raise RuntimeError(f"searchsorted: boundaries tensor should be 1 dimension or the first N-1 "
                                   f"dimensions of boundaries tensor and input value tensor must match, but we "
                                   f"got boundaries tensor {list(seq.shape)} and input value tensor "
                                   f"{list(np.shape(vals))}")
            rows, vrows = seq.reshape(-1, seq.shape[-1]), vals.reshape(-1, vals.shape[-1])
            out = np.stack([np.searchsorted(r, v, side=side) for r, v in zip(rows, vrows)]).reshape(vals.shape)
        return self._out(np.asarray(out).astype(np.int64), dt.int64)  # out_int32: int64 (tinyllm has no int32)

    def bucketize(self, boundaries, *, out_int32=False, right=False):
        """For each element, the index of its bucket among the sorted 1-D `boundaries`, as torch.bucketize:
        boundaries[i-1] < x <= boundaries[i] (right=True: boundaries[i-1] <= x < boundaries[i])."""
        if boundaries.ndim != 1:
            raise RuntimeError(f"bucketize: boundaries tensor must be 1 dimension, but got dim({boundaries.ndim})")
        return boundaries.searchsorted(self, right=right)

    # ---- sets ----
    def unique(self, sorted=True, return_inverse=False, return_counts=False, dim=None):
        """The distinct values, sorted (or distinct slices along `dim`); with return_inverse where each element
        went, with return_counts how often each occurs, as torch.unique."""
        x = self.numpy()
        axis = None if dim is None else self._dim(dim, "unique")
        values, inverse, counts = np.unique(x, return_inverse=True, return_counts=True, axis=axis)
        inverse = inverse.reshape(x.shape if axis is None else (x.shape[axis],))
        return self._set_result(values, inverse, counts, return_inverse, return_counts)

    def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
        """Each run of equal consecutive values (or slices along `dim`) kept once, as torch.unique_consecutive."""
        x = self.numpy()
        axis = 0 if dim is None else self._dim(dim, "unique_consecutive")
        flat = x.reshape(-1) if dim is None else np.moveaxis(x, axis, 0)
        n = flat.shape[0]
        if n:
            rows = flat.reshape(n, -1)
            new = np.concatenate([[True], (rows[1:] != rows[:-1]).any(1)])
        else:
            new = np.zeros(0, bool)
        starts = np.flatnonzero(new)
        values = flat[starts] if dim is None else np.moveaxis(flat[starts], 0, axis)
        inverse = (np.cumsum(new) - 1).reshape(x.shape if dim is None else (n,))
        counts = np.diff(np.append(starts, n))
        return self._set_result(values, inverse, counts, return_inverse, return_counts)

    def _set_result(self, values, inverse, counts, return_inverse, return_counts):
        out = (self._out(values, self.dtype),)
        if return_inverse:
            out += (self._out(inverse.astype(np.int64)),)
        if return_counts:
            out += (self._out(counts.astype(np.int64)),)
        return out[0] if len(out) == 1 else out
