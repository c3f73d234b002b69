"""Matmul and the views and copies that move elements: reshape, permute, expand, slices, flips, rolls, repeats."""
import functools
import math

import numpy as np

from .. import autocast_mode as _autocast, dtype as dt
from ..graph import Node, build, const
from ..rewrite import autocast as _autocast_pass
from ..views import is_contiguous, strides_of, view_strides
from . import MaxResult, TensorLike, arange, broadcast_shape, cat, from_node, new_tensor


class Movement(TensorLike):
    __slots__ = ()

    # ---- matmul ----
    def matmul(self, other):
        """torch.matmul: 1-D operands become a row / column, batch axes broadcast, and an N-D @ 2-D product
        runs as one 2-D product over all rows (so dW = Xᵀ dY is one product too)."""
        a, b = self, self._as(other)
        if not a.ndim or not b.ndim:
            raise RuntimeError(f"matmul: both arguments need at least 1 dimension, got shapes {a.shape} and {b.shape}")
        if a.shape[-1] != b.shape[-2 if b.ndim > 1 else 0]:
            raise RuntimeError(f"matmul: shapes {a.shape} and {b.shape} cannot be multiplied "
                               f"({a.shape[-1]} != {b.shape[-2 if b.ndim > 1 else 0]}): the last axis of the first "
                               "must equal the second-to-last of the second")
        dtype = dt.result_type(a.dtype, b.dtype)
        a, b = a.to(dtype)._float(), b.to(dtype)._float()
        a2 = a.unsqueeze(0) if a.ndim == 1 else a
        b2 = b.unsqueeze(-1) if b.ndim == 1 else b
        if b2.ndim == 2 and a2.ndim > 2:
            out = a2.reshape(-1, a2.shape[-1])._mm(b2).reshape(*a2.shape[:-1], b2.shape[-1])
        else:
            try:
                batch = broadcast_shape([a2.shape[:-2], b2.shape[:-2]], "matmul")
            except ValueError:
                raise RuntimeError(f"matmul: the batch dims {a2.shape[:-2]} of {a.shape} and {b2.shape[:-2]} of "
                                   f"{b.shape} cannot be broadcast together") from None
            out = a2.expand(*batch, *a2.shape[-2:])._mm(b2.expand(*batch, *b2.shape[-2:]))
        if b.ndim == 1:
            out = out.squeeze(-1)
        if a.ndim == 1:
            out = out.squeeze(-2 if b.ndim > 1 else -1)
        return out

    def _mm(self, b):
        a, b = self._autocast(), b._autocast()
        return a._make(build("MATMUL", a._node, b._node), b)

    def _autocast(self):
        """Inside tinyllm.autocast, this tensor marked as an input of a lower-precision op (tinyllm/autocast_mode.py)."""
        low = _autocast.current()
        if low is None or self.dtype not in (dt.float32, dt.float64):
            return self
        return self._make(_autocast_pass.marked(build("AUTOCAST", self._node, arg=low)))

    def _autocast_wide(self, fn):
        """fn(self) computed in float32 and rounded once to the dtype self has after the autocast pass, inside
        tinyllm.autocast (as torch's ops that are one op there and several here: gelu); fn(self) outside."""
        if _autocast.current() is None or self.dtype not in (dt.float32, dt.float64):
            return fn(self)
        wide = fn(self._make(_autocast_pass.marked(build("AUTOCAST", self._node, arg=dt.float32))))
        return wide._make(_autocast_pass.marked(build("AUTOCAST", wide._node, self._node, arg="like")), wide)

    # ---- movement ----
    def _shape_arg(self, shape, name):
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
        if shape.count(-1) > 1:
            raise RuntimeError(f"{name}: only one dimension can be -1, got {shape}")
        if -1 in shape:
            rest = math.prod(s for s in shape if s != -1)
            if rest == 0 or self.numel() % rest:
                raise RuntimeError(f"{name}: shape {shape} is invalid for a tensor of {self.numel()} elements {self.shape}")
            shape = tuple(self.numel() // rest if s == -1 else s for s in shape)
        if math.prod(shape) != self.numel():
            raise RuntimeError(f"{name}: shape {shape} is invalid for a tensor of {self.numel()} elements {self.shape}")
        return tuple(int(s) for s in shape)

    def view(self, *shape):
        shape = self._shape_arg(shape, "view")
        if view_strides(self.shape, self.stride(), shape) is None:
            raise RuntimeError(f"view: a tensor of shape {self.shape} with strides {self.stride()} cannot be viewed as "
                               f"{shape} without copying (it is not contiguous): use .reshape(), which copies when it "
                               "must, or .contiguous().view()")
        return self._make(build("RESHAPE", self._node, arg=shape)) if shape != self.shape else self

    def reshape(self, *shape):
        shape = self._shape_arg(shape, "reshape")
        if shape == self.shape:
            return self
        x = self if view_strides(self.shape, self.stride(), shape) is not None else self.contiguous()
        return x._make(build("RESHAPE", x._node, arg=shape))

    def contiguous(self):
        return self if self.is_contiguous() else self._unary("CONTIGUOUS")

    def permute(self, *dims):
        dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        if len(dims) != self.ndim:
            raise RuntimeError(f"permute: {len(dims)} dims given for a tensor of shape {self.shape}")
        order = tuple(self._dim(d, "permute") for d in dims)
        if sorted(order) != list(range(self.ndim)):
            raise RuntimeError(f"permute: {dims} repeats a dimension")
        return self if order == tuple(range(self.ndim)) else self._unary("PERMUTE", order)

    def transpose(self, dim0, dim1):
        order = list(range(self.ndim))
        a, b = self._dim(dim0, "transpose"), self._dim(dim1, "transpose")
        order[a], order[b] = order[b], order[a]
        return self.permute(*order)

    def t(self):
        if self.ndim > 2:
            raise RuntimeError(f"t: expects a tensor with <= 2 dimensions, got shape {self.shape}: use transpose()")
        return self.permute(*reversed(range(self.ndim)))

    def expand(self, *sizes):
        sizes = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else sizes
        if sizes == self._node.shape:  # (what the checks below come to for the same shape)
            return self
        if len(sizes) < self.ndim:
            raise RuntimeError(f"expand: the number of sizes {sizes} must be at least the number of dims {self.shape}")
        lead = len(sizes) - self.ndim
        if -1 in sizes[:lead]:
            raise RuntimeError(f"expand: size -1 (keep) in {sizes} is not allowed for a new leading dim of {self.shape}")
        shape = tuple(self.shape[i - lead] if s == -1 else s for i, s in enumerate(sizes))
        for i, s in enumerate(self.shape):
            if s != 1 and s != shape[lead + i]:
                raise RuntimeError(f"expand: the size {s} of dim {i} of {self.shape} must match {shape[lead + i]} "
                                   f"in {shape} (only size-1 dims expand)")
        x = self.reshape(*((1,) * lead + self.shape)) if lead else self
        return x if shape == x.shape else x._unary("EXPAND", shape)

    def expand_as(self, other): return self.expand(*other.shape)

    def unsqueeze(self, dim):
        d = dim if dim >= 0 else dim + self.ndim + 1
        if not 0 <= d <= self.ndim:
            raise IndexError(f"unsqueeze: dimension {dim} out of range for shape {self.shape}")
        return self.reshape(*self.shape[:d], 1, *self.shape[d:])

    def squeeze(self, dim=None):
        dims = self._dims(dim, "squeeze") if dim is not None else range(self.ndim)
        return self.reshape(*[s for i, s in enumerate(self.shape) if not (i in dims and s == 1)])

    def flatten(self, start_dim=0, end_dim=-1):
        if not self.ndim:
            return self.reshape(1)
        s, e = self._dim(start_dim, "flatten"), self._dim(end_dim, "flatten")
        if s > e:
            raise RuntimeError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for shape {self.shape}")
        return self.reshape(*self.shape[:s], -1, *self.shape[e + 1:])

    def _slice(self, dim, start, stop, step=1):
        arg = tuple((start, stop, step) if i == dim else (0, s, 1) for i, s in enumerate(self.shape))
        return self._unary("SHRINK", arg) if (start, stop, step) != (0, self.shape[dim], 1) else self

    def narrow(self, dim, start, length):
        d = self._dim(dim, "narrow")
        start = start + self.shape[d] if start < 0 else start
        if not (0 <= start and length >= 0 and start + length <= self.shape[d]):
            raise RuntimeError(f"narrow: start {start} and length {length} do not fit dim {d} of size {self.shape[d]} "
                               f"(shape {self.shape})")
        return self._slice(d, start, start + length)

    def split(self, split_size_or_sections, dim=0):
        d = self._dim(dim, "split")
        n = self.shape[d]
        if isinstance(split_size_or_sections, int):
            if split_size_or_sections <= 0:
                raise RuntimeError(f"split: split_size must be positive, got {split_size_or_sections}")
            sizes = [min(split_size_or_sections, n - i) for i in range(0, n, split_size_or_sections)]
        else:
            sizes = list(split_size_or_sections)
            if sum(sizes) != n:
                raise RuntimeError(f"split: sections {sizes} don't add up to {n}, the size of dim {d} of {self.shape}")
        out, start = [], 0
        for s in sizes:
            out.append(self._slice(d, start, start + s))
            start += s
        return tuple(out)

    def chunk(self, chunks, dim=0):
        n = self.shape[self._dim(dim, "chunk")]
        if chunks <= 0:
            raise RuntimeError(f"chunk: chunks must be positive, got {chunks}")
        return self.split(max(-(-n // chunks), 1), dim)

    def unflatten(self, dim, sizes):
        d = self._dim(dim, "unflatten")
        return self.reshape(*self.shape[:d], *sizes, *self.shape[d + 1:])

    def flip(self, *dims):
        """The elements in reverse order along `dims` (a gather of a reversed index per axis, so a copy, as torch)."""
        out = self
        for d in self._dims(dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims, "flip"):
            index = arange(self.shape[d] - 1, -1, -1, device=self.device)
            out = out[(slice(None),) * d + (index,)]
        return out

    def roll(self, shifts, dims=None):
        """Elements shifted cyclically by `shifts` along `dims` (flattened first when dims is None, as torch)."""
        if dims is None:
            return self.reshape(-1).roll(shifts, 0).reshape(*self.shape)
        shifts = shifts if isinstance(shifts, (tuple, list)) else (shifts,)
        dims = dims if isinstance(dims, (tuple, list)) else (dims,)
        if len(shifts) != len(dims):
            raise ValueError(f"roll: {len(shifts)} shifts for {len(dims)} dims")
        out = self
        for shift, dim in zip(shifts, dims):
            d = self._dim(dim, "roll")
            n = self.shape[d]
            k = shift % n if n else 0
            if k:
                out = cat([out._slice(d, n - k, n), out._slice(d, 0, n - k)], d)
        return out

    def repeat(self, *sizes):
        """The tensor tiled sizes[i] times along each axis (new leading axes where sizes is longer), as torch."""
        sizes = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else sizes
        if len(sizes) < self.ndim:
            raise RuntimeError(f"repeat: {len(sizes)} sizes for a {self.ndim}-D tensor: give at least {self.ndim}")
        x = self.reshape(*(1,) * (len(sizes) - self.ndim), *self.shape)
        tiled = x.reshape(*[v for s in x.shape for v in (1, s)])  # (1, s0, 1, s1, ...) -> (r0, s0, r1, s1, ...)
        tiled = tiled.expand(*[v for r, s in zip(sizes, x.shape) for v in (r, s)])
        return tiled.reshape(*[r * s for r, s in zip(sizes, x.shape)])

    def repeat_interleave(self, repeats, dim=None):
        """Each element repeated `repeats` (an int) times in place along `dim` (flattened when None)."""
        if not isinstance(repeats, int):
            raise NotImplementedError("repeat_interleave: only an int number of repeats is supported")
        if dim is None:
            return self.reshape(-1).repeat_interleave(repeats, 0)
        d = self._dim(dim, "repeat_interleave")
        x = self.unsqueeze(d + 1)
        return x.expand(*x.shape[:d + 1], repeats, *x.shape[d + 2:]).reshape(
            *self.shape[:d], self.shape[d] * repeats, *self.shape[d + 1:])

    def unfold(self, dimension, size, step):
        """Every window of `size` elements along `dimension`, `step` apart, as a new last axis (torch's
        Tensor.unfold): one GATHER by the windows' positions, so overlapping windows' gradients add up."""
        d = self._dim(dimension, "unfold")
        n = self.shape[d] if self.ndim else 1
        if not (isinstance(size, int) and isinstance(step, int)) or size < 0 or step <= 0 or size > n:
            raise RuntimeError(f"unfold: size {size} and step {step} do not fit dimension {d} of size {n} (shape "
                               f"{self.shape}): need 0 <= size <= {n} and step > 0")
        x = self if self.ndim else self.reshape(1)
        starts = arange(0, n - size + 1, step, device=self.device).reshape(-1, 1)
        windows = x[(slice(None),) * d + (starts + arange(size, device=self.device).reshape(1, -1),)]
        if not self.ndim:
            return windows.reshape(size)
        return windows.permute(*range(d + 1), *range(d + 2, windows.ndim), d + 1)

    def diagonal(self, offset=0, dim1=0, dim2=1):
        """The diagonal of the (dim1, dim2) planes, offset above (>0) or below (<0) the main one, as the last axis:
        the plane flattened and sliced with a step of (columns + 1), a view."""
        d1, d2 = self._dim(dim1, "diagonal"), self._dim(dim2, "diagonal")
        rest = [i for i in range(self.ndim) if i not in (d1, d2)]
        x = self.permute(*rest, d1, d2)
        rows, cols = x.shape[-2:]
        n = max(0, min(rows, cols - offset) if offset >= 0 else min(rows + offset, cols))
        start = offset if offset >= 0 else -offset * cols
        flat = x.reshape(*x.shape[:-2], rows * cols)
        if n == 0:
            return flat._slice(flat.ndim - 1, 0, 0)
        return flat._slice(flat.ndim - 1, start, start + (n - 1) * (cols + 1) + 1, cols + 1)

    def tril(self, diagonal=0): return self._triangle(diagonal, lower=True)
    def triu(self, diagonal=0): return self._triangle(diagonal, lower=False)

    def _triangle(self, k, lower):
        if self.ndim < 2:
            raise RuntimeError(f"{'tril' if lower else 'triu'}: needs at least 2 dims, got shape {self.shape}")
        r, c = self.shape[-2:]
        rows = arange(r, device=self.device).reshape(r, 1)
        cols = arange(c, device=self.device).reshape(1, c)
        keep = (cols <= rows + k) if lower else (cols >= rows + k)
        return keep.where(self, self._as(0, self.dtype))

    def __getitem__(self, index):
        from .indexing import getitem
        return getitem(self, index)

    def __iter__(self):
        return (self[i] for i in range(len(self)))
