"""x[index] with torch's meaning: ints, slices (with positive steps), None, ..., integer tensors (advanced
indexing, several broadcast together) and bool masks (read now, as torch does: the result's shape depends on them). Slices are zero-copy views (SHRINK); one integer tensor is a GATHER,
several are composed into one GATHER by a linear index (see _advanced)."""
import numpy as np

from .. import dtype as dt
from ..graph import build
from . import TensorLike, arange, broadcast_shape, new_tensor


def _consumed(item):
    """How many axes an index item takes: a bool mask its ndim (x[mask, ...] as torch), anything else one."""
    if isinstance(item, (TensorLike, np.ndarray)) and item.dtype in (dt.bool_, np.bool_):
        return item.ndim
    return 1


def _normalize(x, index):
    items = list(index) if isinstance(index, tuple) else [index]
    consuming = sum(_consumed(i) for i in items if i is not None and i is not Ellipsis)
    if sum(1 for i in items if i is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if consuming > x.ndim:
        raise IndexError(f"too many indices for a tensor of shape {x.shape}: {consuming} given")
    at = next((k for k, i in enumerate(items) if i is Ellipsis), None)  # `in` would compare tensors with ==
    if at is not None:
        items[at:at + 1] = [slice(None)] * (x.ndim - consuming)
    return items


def getitem(x, index):
    items = _normalize(x, index)
    # ints, slices and None first, as views (torch applies an int as a select, so it is never an advanced index);
    # each index tensor keeps its axis for now and is applied at the end, at its axis of the view
    out, dim, tensors = x, 0, []  # tensors: (axis of `out`, int64 index tensor)
    for item in items:
        if item is None:
            out = out.unsqueeze(dim)
            dim += 1
        elif isinstance(item, (bool, np.bool_)):
            raise IndexError("indexing with a Python bool is not supported")
        elif isinstance(item, (int, np.integer)):
            n = out.shape[dim]
            if not -n <= item < n:
                raise IndexError(f"index {item} is out of bounds for dimension {dim} with size {n} (shape {x.shape})")
            i = int(item) % n
            out = out._slice(dim, i, i + 1).squeeze(dim)
        elif isinstance(item, slice):
            if item.step is not None and item.step <= 0:
                raise ValueError(f"slice step must be greater than zero, got {item.step}")
            start, stop, step = item.indices(out.shape[dim])
            stop = max(stop, start)
            out = out._slice(dim, start, stop, step)
            dim += 1
        elif isinstance(item, (TensorLike, list, np.ndarray)):
            idx = item if isinstance(item, TensorLike) else new_tensor(np.asarray(item), device=x.device)
            if idx.dtype is dt.bool_:  # a mask stands for the index tensors of its true positions, one per axis
                if idx.shape != out.shape[dim:dim + idx.ndim]:
                    raise IndexError(f"the mask of shape {idx.shape} does not match the indexed tensor's shape "
                                     f"{out.shape[dim:dim + idx.ndim]} at dimension {dim} (tensor of shape {x.shape})")
                for column in idx.nonzero(as_tuple=True):
                    tensors.append((dim, column))
                    dim += 1
                continue
            if idx.dtype is not dt.int64:
                raise TypeError(f"index: tensors used as indices must be int64 (long), got {idx.dtype.name} of shape "
                                f"{idx.shape} indexing a tensor of shape {x.shape}: use .long()")
            tensors.append((dim, idx))
            dim += 1
        else:
            raise TypeError(f"index of type {type(item).__name__} is not supported: use ints, slices, None, ..., "
                            "or an integer tensor")
    if len(tensors) == 1:
        (axis, idx), = tensors
        return out._make(build("GATHER", out._node, idx._node, arg=axis))
    return _advanced(x, out, tensors) if tensors else out


def _advanced(x, out, tensors):
    """out[i0, i1, ...] with several index tensors, as torch and NumPy: the indices broadcast together to a shape B;
    the indexed axes become B, in their place if they are adjacent, else first. Composed, not a primitive: each
    index is checked and wrapped (negative -> +n) by a GATHER from arange(n) along its own axis, so an index out
    of range raises GATHER's IndexError naming the index, the axis and its size on every runtime; the indexed
    axes (moved together) are flattened into one, and one GATHER by the linear index picks the elements, so the
    gradient is GATHER's SCATTER_ADD."""
    axes = [a for a, _ in tensors]
    shape = broadcast_shape([i.shape for _, i in tensors], "index")
    if axes != list(range(axes[0], axes[0] + len(axes))):  # not adjacent: the index axes go first
        rest = [a for a in range(out.ndim) if a not in axes]
        out, axes = out.permute(*axes, *rest), list(range(len(axes)))
    first, sizes = axes[0], [out.shape[a] for a in axes]
    linear, stride = None, 1
    for (axis, idx), n in reversed(list(zip(tensors, sizes))):
        # the table (n,) sits at `axis` (so GATHER's error names it) with size-1 axes before: (1, .., 1, n)
        table = new_tensor(np.arange(n, dtype=np.float32 if n <= 1 << 24 else np.int64).reshape((1,) * axis + (n,)),
                       device=x.device)
        checked = table._make(build("GATHER", table._node, idx._node, arg=axis)).reshape(idx.shape)
        term = checked.long() if checked.dtype is not dt.int64 else checked
        term = term if stride == 1 else term * stride
        linear = term if linear is None else term + linear
        stride *= n
    linear = linear.expand(*shape) if linear.shape != shape else linear
    flat = out.reshape(*out.shape[:first], stride, *out.shape[first + len(axes):])
    return flat._make(build("GATHER", flat._node, linear._node, arg=first))


class Indexing(TensorLike):
    __slots__ = ()

    def nonzero(self, as_tuple=False):
        """The indices of the nonzero elements, an int64 tensor (count, ndim) in row-major order, or with
        as_tuple=True one index tensor per axis. It reads the values now: the result's shape depends on them."""
        found = np.nonzero(self.numpy().reshape(self.shape or (1,)))
        if as_tuple:
            return tuple(new_tensor(i.astype(np.int64), device=self.device) for i in found)
        table = np.stack(found, 1) if self.ndim else np.zeros((len(found[0]), 0))  # a 0-d tensor: (count, 0)
        return new_tensor(table.astype(np.int64), device=self.device)

    def masked_select(self, mask):
        """The elements where mask (broadcast with the tensor) is true, 1-D; a gather, so gradients flow back."""
        mask = self._as(mask)
        if mask.dtype is not dt.bool_:
            raise TypeError(f"masked_select: the mask must be bool, got {mask.dtype.name}: use (mask != 0) or .bool()")
        shape = broadcast_shape([self.shape, mask.shape], "masked_select")
        return self.expand(*shape).reshape(-1)[mask.expand(*shape).reshape(-1)]
