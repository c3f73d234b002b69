"""Running (cumulative) ops along one axis, as Tensor methods: composed of primitives, so every runtime runs them
and their gradients follow from the primitives' rules.

cumsum is a matmul with a triangle of ones (the sgemm runs it). The others are scans in ⌈log₂ n⌉ elementwise
steps (Hillis–Steele): at step s each element combines with the one s places before it, the first s combining
with the identity. A product stays exact with zeros, so its gradient (the product rule through the steps) is
torch's; cummax and cummin scan (value, index) pairs and then gather the values, so their gradient goes to the
index each output took, as torch's does.
"""
import math

from .. import dtype as dt
from ..graph import const
from . import MaxResult, TensorLike, arange, cat, from_node


def _along_last(x, dim, name, fn):
    """fn(x) with axis `dim` moved last (a 0-d tensor as one element), its result (a tensor or a tuple) moved back."""
    d = x._dim(dim, name)
    if x.ndim == 0:
        into, back = x.reshape(1), (lambda t: t.reshape())
    elif d != x.ndim - 1:
        into, back = x.transpose(d, -1), (lambda t: t.transpose(d, -1))
    else:
        into, back = x, (lambda t: t)
    y = fn(into)
    return tuple(back(t) for t in y) if isinstance(y, tuple) else back(y)


def _scan(values, combine, identity):
    """Inclusive scan along the last axis of the tensors in `values` (a tuple, combined together):
    combine(before, current) -> combined, identity[i] the neutral value of values[i]."""
    n, s = values[0].shape[-1], 1
    while s < n:
        before = tuple(cat([from_node(const(e, v.shape[:-1] + (s,), v.dtype), v.device), v[..., :n - s]], -1)
                       for v, e in zip(values, identity))
        values = combine(before, values)
        s *= 2
    return values


def _cumulative_extreme(x, dim, largest, name):
    """(values, indices) of the running max (or min): ties take the later index and the first NaN stays, as torch."""
    keep = x if x.dtype is not dt.bool_ else x.long()

    def combine(before, current):  # before's index -1 is the identity: nothing there yet
        (bv, bi), (cv, ci) = before, current
        beats = (cv >= bv) if largest else (cv <= bv)
        take = (bi < 0) | ((beats | cv.isnan()) & ~bv.isnan())
        return take.where(cv, bv), take.where(ci, bi)

    def run(v):
        _, idx = _scan((v, arange(v.shape[-1], device=v.device).expand(*v.shape)), combine, (0, -1))
        return v.gather(-1, idx), idx
    values, indices = _along_last(keep, dim, name, run)
    return MaxResult(values.to(x.dtype), indices)


class Cumulative(TensorLike):
    __slots__ = ()

    def cumsum(self, dim):
        """Running sums along `dim`: the axis times an upper-triangular matrix of ones (U[i, j] = [i <= j]), one
        matmul that the sgemm runs and whose gradient is the reverse running sum."""

        def run(x):
            n = x.shape[-1]
            upper = arange(n, device=x.device).reshape(n, 1) <= arange(n, device=x.device).reshape(1, n)
            if x.dtype.is_float:
                return x @ upper.to(x.dtype)
            return (x.to(dt.int64).unsqueeze(-1) * upper.to(dt.int64)).sum(-2)  # integers exactly: n² products
        return _along_last(self, dim, "cumsum", run)

    def cumprod(self, dim):
        """Running products along `dim` (integers and bools as int64, as torch)."""
        x = self if self.dtype.is_float else self.long()
        return _along_last(x, dim, "cumprod", lambda v: _scan((v,), lambda b, c: (b[0] * c[0],), (1,))[0])

    def logcumsumexp(self, dim):
        """log Σ_{i<=j} e^(x_i): a scan of logaddexp (each step shifted by the larger of its two operands), so
        neither a large nor a very negative magnitude overflows or underflows, as torch's running log-add-exp."""
        x = self._float()
        return _along_last(x, dim, "logcumsumexp",
                           lambda v: _scan((v,), lambda b, c: (b[0].logaddexp(c[0]),), (-math.inf,))[0])

    def cummax(self, dim): return _cumulative_extreme(self, dim, True, "cummax")

    def cummin(self, dim): return _cumulative_extreme(self, dim, False, "cummin")
