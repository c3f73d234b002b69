"""Strides, as torch keeps them, for the zero-copy rules: which reshapes are views and which tensors are
contiguous. A node's strides follow from its movement ops over a row-major base."""
import math

from .ops import Group


def contiguous_strides(shape):
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return tuple(reversed(strides))


def view_strides(old_shape, old_strides, new_shape):
    """Strides that let `new_shape` view memory laid out as (old_shape, old_strides), or None when the
    reshape must copy. The same test as torch's `view`: each run of merged axes must be contiguous."""
    if math.prod(old_shape) == 0 or not old_shape:
        return contiguous_strides(new_shape)
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base = old_strides[-1]
    tensor_numel = view_numel = 1
    for d in range(len(old_shape) - 1, -1, -1):
        tensor_numel *= old_shape[d]
        if d == 0 or (old_shape[d - 1] != 1 and old_strides[d - 1] != tensor_numel * chunk_base):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_strides[view_d] = view_numel * chunk_base
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk_base = old_strides[d - 1]
                tensor_numel = view_numel = 1
    return tuple(new_strides) if view_d == -1 else None


def _own_strides(node, src_strides):
    if node.op == "PERMUTE":
        return tuple(src_strides[i] for i in node.arg)
    if node.op == "EXPAND":
        return tuple(0 if s != a else st for s, a, st in zip(node.src[0].shape, node.arg, src_strides))
    if node.op == "SHRINK":
        return tuple(st * step for st, (_, _, step) in zip(src_strides, node.arg))
    if node.op == "RESHAPE":
        return view_strides(node.src[0].shape, src_strides, node.shape) or contiguous_strides(node.shape)
    return src_strides  # DETACH, CHECKPOINT


def strides_of(node):
    """Element strides of `node`'s value as a CPU runtime lays it out (cached on the node)."""
    chain = []
    while node._strides is None:
        data = getattr(node.buffer or (node.arg if node.op == "LOAD" else None), "data", None)
        if data is not None and hasattr(data, "strides"):
            node._strides = tuple(s // max(data.itemsize, 1) for s in data.strides)
        elif node.op in Group.VIEW:
            chain.append(node)
            node = node.src[0]
        else:
            node._strides = contiguous_strides(node.shape)
    strides = node._strides
    for n in reversed(chain):
        strides = n._strides = _own_strides(n, strides)
    return strides


def is_contiguous(shape, strides):
    return all(st == c for s, st, c in zip(shape, strides, contiguous_strides(shape)) if s != 1)
