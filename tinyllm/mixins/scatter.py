"""Writing values at positions, as Tensor methods: torch's scatter family. Composed of primitives: a sum is
SCATTER_ADD (whose gradient is the GATHER back), a max, min or product a reduction over a one-hot of the index
along `dim` (an index of m positions into an axis of n costs m·n), so every runtime runs them and their
gradients are the primitives': ties in amax/amin share the gradient evenly, as torch's."""
import math

from .. import dtype as dt
from ..graph import build, const
from . import TensorLike, arange, cat, from_node

REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")


def _added(values, positions, n):
    """A flat tensor of n zeros with each of `values` added at its position (the SCATTER_ADD primitive)."""
    return values._make(build("SCATTER_ADD", values._node, positions._node, arg=(0, n)))


def _hits(x, positions):
    """How many of `positions` fall on each element of x (int64, x's shape)."""
    ones = x._make(const(1, (positions.numel(),), dt.int64))
    return _added(ones, positions, x.numel()).reshape(*x.shape)


def put(x, positions, values, accumulate):
    """x with `values` (1-D, x's dtype) written at the flat `positions`, or added there. Where a position repeats,
    the values written there add up (torch leaves that case undefined)."""
    scattered = _added(values, positions, x.numel()).reshape(*x.shape)
    return x + scattered if accumulate else (_hits(x, positions) > 0).where(scattered, x)


def linear_index(x, dim, index, name):
    """The flat position in x of each element of `index` read along `dim` (torch.gather's and scatter's
    addressing: index has x's dimensions and is no larger than x but along dim). Each index is checked and
    wrapped by a GATHER from arange(n), so one out of range raises naming it."""
    d = x._dim(dim, name)
    if not isinstance(index, TensorLike) or index.dtype is not dt.int64:
        got = index.dtype.name if isinstance(index, TensorLike) else type(index).__name__
        raise TypeError(f"{name}: index must be an int64 tensor, got {got}: use .long()")
    if index.ndim != x.ndim or any(i > s for k, (i, s) in enumerate(zip(index.shape, x.shape)) if k != d):
        raise RuntimeError(f"{name}: index {index.shape} must have the input's {x.ndim} dimensions and be no "
                           f"larger than the input {x.shape} except along dim {d}")
    strides = [math.prod(x.shape[k + 1:]) for k in range(x.ndim)]
    checked = arange(x.shape[d], device=x.device)[index]
    linear = from_node(const(0, index.shape, dt.int64), x.device)
    for k, n in enumerate(index.shape):
        coord = checked if k == d else arange(n, device=x.device).reshape(*[n if j == k else 1 for j in range(x.ndim)])
        linear = linear + coord * strides[k]
    return linear


def _source(x, index, src, name):
    """src (a tensor no smaller than index, or a number) cut to index's shape, in x's dtype."""
    if not isinstance(src, TensorLike):
        return from_node(const(src, index.shape, x.dtype), x.device)
    if src.ndim != index.ndim or any(i > s for i, s in zip(index.shape, src.shape)):
        raise RuntimeError(f"{name}: src {src.shape} must have index's {index.ndim} dimensions and be no smaller "
                           f"than index {index.shape} along each")
    for k, n in enumerate(index.shape):
        src = src._slice(k, 0, n)
    return src.to(x.dtype)


def _embed(x, region):
    """x with its leading corner (region's shape) replaced by region."""
    for k, (s, n) in enumerate(zip(region.shape, x.shape)):
        if s < n:
            rest = x
            for j, r in enumerate(region.shape):
                rest = rest._slice(j, s, n) if j == k else rest._slice(j, 0, r)
            region = cat([region, rest], k)
    return region


class Scatter(TensorLike):
    __slots__ = ()

    def scatter(self, dim, index, src=None, value=None, reduce=None):
        """self with src[i][j][k] written at self[index[i][j][k]][j][k] (dim 0; likewise for the others), as
        torch.scatter; `value` (or a number as src) writes one number. reduce="add" or "multiply" combines instead."""
        src = value if src is None else src
        if src is None:
            raise TypeError("scatter: give src (a tensor or a number) or value")
        if reduce is not None:
            modes = {"add": "sum", "multiply": "prod"}
            if reduce not in modes:
                raise ValueError(f"scatter: reduce must be 'add' or 'multiply', got {reduce!r} (scatter_reduce has more)")
            return self.scatter_reduce(dim, index, _source(self, index, src, "scatter"), modes[reduce])
        positions = linear_index(self, dim, index, "scatter").reshape(-1)
        return put(self, positions, _source(self, index, src, "scatter").reshape(-1), accumulate=False)

    def scatter_add(self, dim, index, src):
        """self with src added at the positions index gives along dim (torch.scatter_add)."""
        return self.scatter_reduce(dim, index, src, "sum")

    def scatter_reduce(self, dim, index, src, reduce, include_self=True):
        """self with the values of src that index sends to each position combined by `reduce` (sum, prod, mean,
        amax, amin), with what self holds there unless include_self=False, as torch.scatter_reduce."""
        if reduce not in REDUCTIONS:
            raise ValueError(f"scatter_reduce: reduce must be one of {', '.join(REDUCTIONS)}, got {reduce!r}")
        d = self._dim(dim, "scatter_reduce")
        src = _source(self, index, src, "scatter_reduce")
        if reduce in ("sum", "mean"):
            positions = linear_index(self, d, index, "scatter_reduce").reshape(-1)
            total, count = _added(src.reshape(-1), positions, self.numel()).reshape(*self.shape), _hits(self, positions)
            written = count > 0
            if include_self:
                total, count = total + self, count + 1
            if reduce == "sum":
                return total if include_self else written.where(total, self)
            count = count.maximum(1).to(self.dtype)
            mean = total / count if self.dtype.is_float else total.div(count, rounding_mode="floor")
            return written.where(mean, self)
        # amax, amin, prod: a reduction over axis d of the values sent to each position (a one-hot of the index)
        n, m = self.shape[d], index.shape[d]
        onehot = index.unsqueeze(d + 1) == arange(n, device=self.device).reshape(*[n if k == d + 1 else 1
                                                                                   for k in range(self.ndim + 1)])
        values = src.unsqueeze(d + 1).expand(*onehot.shape)
        region = self
        for k, s in enumerate(index.shape):
            if k != d:
                region = region._slice(k, 0, s)
        if reduce == "prod":
            combined = onehot.where(values, 1).prod(d)
            combined = combined * region if include_self else onehot.any(d).where(combined, region)
        else:
            if self.dtype.is_float:
                empty = -math.inf if reduce == "amax" else math.inf
            else:  # no bigger (smaller) than any value it meets; int64's extremes would not fit WGSL's i32
                empty = src.amin().minimum(region.amin()) if reduce == "amax" else src.amax().maximum(region.amax())
            filled = onehot.where(values, empty)
            if include_self:
                filled = cat([region.unsqueeze(d), filled], d)
            combined = getattr(filled, reduce)(d)
            if not include_self:
                combined = onehot.any(d).where(combined, region)
        return _embed(self, combined)
