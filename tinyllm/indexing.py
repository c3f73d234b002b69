"""x[index] with torch's meaning: ints, slices (with positive steps), None, ..., and one integer tensor (the
embedding gather). Slices are zero-copy views (SHRINK); an integer tensor is a GATHER."""
import numpy as np

from . import dtype as dt
from .graph import build


def _normalize(x, index):
    items = list(index) if isinstance(index, tuple) else [index]
    consuming = sum(1 for i in items if i is not None and i is not Ellipsis)
    if sum(1 for i in items if i is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if consuming > x.ndim:
        raise IndexError(f"too many indices for a tensor of shape {x.shape}: {consuming} given")
    at = next((k for k, i in enumerate(items) if i is Ellipsis), None)  # `in` would compare tensors with ==
    if at is not None:
        items[at:at + 1] = [slice(None)] * (x.ndim - consuming)
    return items


def getitem(x, index):
    from .tensor import Tensor
    items = _normalize(x, index)
    tensor_items = [i for i in items if isinstance(i, (Tensor, list, np.ndarray))]
    if len(tensor_items) > 1:
        raise NotImplementedError("indexing with more than one integer tensor is not supported: index one axis at "
                                  "a time, e.g. x[i][:, j], or use gather-style code")
    out, dim = x, 0
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
        elif isinstance(item, (Tensor, list, np.ndarray)):
            idx = item if isinstance(item, Tensor) else Tensor(np.asarray(item), device=x.device)
            if idx.dtype is dt.bool_:
                raise NotImplementedError("boolean-mask indexing is not supported: use masked_fill or where")
            if idx.dtype is not dt.int64:
                raise TypeError(f"index: tensors used as indices must be int64 (long), got {idx.dtype.name} of shape "
                                f"{idx.shape} indexing a tensor of shape {x.shape}: use .long()")
            out = out._make(build("GATHER", out._node, idx._node, arg=dim))
            dim += idx.ndim
        else:
            raise TypeError(f"index of type {type(item).__name__} is not supported: use ints, slices, None, ..., "
                            "or an integer tensor")
    return out
