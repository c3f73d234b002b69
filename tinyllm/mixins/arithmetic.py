"""Arithmetic: +, -, *, /, comparisons, logical and bitwise ops, powers, exp and log, clamping and where."""
import functools
import math

import numpy as np

from .. import autocast_mode as _autocast, dtype as dt
from ..graph import Node, build, const
from ..rewrite import autocast as _autocast_pass
from ..views import is_contiguous, strides_of, view_strides
from . import MaxResult, TensorLike, arange, broadcast_shape, cat, from_node, new_tensor


class Arithmetic(TensorLike):
    __slots__ = ()

    # ---- arithmetic ----
    def add(self, x, alpha=1): return self._binary("ADD", x if alpha == 1 else self._as(x) * alpha, name="add")
    def sub(self, x, alpha=1): return self.add(-(self._as(x)) if alpha == 1 else self._as(x) * -alpha)
    def mul(self, x): return self._binary("MUL", x, name="mul")
    # div (x·reciprocal(z), or rounded), the remainders, trigonometric, hyperbolic, rounding, shifts, copysign
    def neg(self): return self._unary("NEG")
    def reciprocal(self): return self._float()._unary("RECIP")
    def maximum(self, x): return self._binary("MAX", x, name="maximum")
    def minimum(self, x): return self._flip().maximum(self._as(x)._flip())._flip()

    def _flip(self):
        """An order-reversing involution: -x, or not x for bools (which NEG does not take). min is flip∘max∘flip."""
        return self.logical_not() if self.dtype is dt.bool_ else -self
    def __add__(self, x): return self.add(x)
    def __radd__(self, x): return self._binary("ADD", x, reverse=True, name="add")
    def __sub__(self, x): return self.sub(x)
    def __rsub__(self, x): return self._as(x) + (-self)
    def __mul__(self, x): return self.mul(x)
    def __rmul__(self, x): return self._binary("MUL", x, reverse=True, name="mul")
    def __truediv__(self, x): return self.div(x)
    def __rtruediv__(self, x): return self._as(x).div(self)
    def __neg__(self): return self.neg()
    def __pow__(self, p): return self.pow(p)
    def __rpow__(self, base): return self._as(base).pow(self)
    def __matmul__(self, x): return self.matmul(x)
    def __rmatmul__(self, x): return self._as(x).matmul(self)
    def __lt__(self, x): return self._binary("CMPLT", x, name="lt")
    def __gt__(self, x): return self._binary("CMPLT", x, reverse=True, name="gt")
    def __le__(self, x): return (self < x).logical_or(self == x)  # (not ¬(x > y): false at NaN, as IEEE)
    def __ge__(self, x): return (self > x).logical_or(self == x)
    def __eq__(self, x): return self._binary("CMPEQ", x, name="eq")
    def __ne__(self, x): return (self == x).logical_not()
    def __invert__(self): return self.bitwise_not()
    def __and__(self, x): return self.bitwise_and(x)
    def __or__(self, x): return self.bitwise_or(x)
    def __xor__(self, x): return self.bitwise_xor(x)
    def __rand__(self, x): return self._as(x).bitwise_and(self)
    def __ror__(self, x): return self._as(x).bitwise_or(self)
    def __rxor__(self, x): return self._as(x).bitwise_xor(self)
    lt, gt, le, ge, eq, ne = __lt__, __gt__, __le__, __ge__, __eq__, __ne__

    def logical_not(self): return self._make(build("CMPEQ", self.bool()._node, const(False, self.shape, dt.bool_)))
    def logical_and(self, x): return self.bool()._binary("MUL", self._as(x).bool(), name="logical_and")
    def logical_or(self, x): return self.bool()._binary("MAX", self._as(x).bool(), name="logical_or")
    def logical_xor(self, x): return self.bool() != self._as(x).bool()

    def _bitwise(self, op, x, logical, name):
        """&, |, ^ as torch: bit by bit on integers, logical on bools (the same results), refused on floats."""
        a, b = self._broadcast(x, name=name)
        if a.dtype.is_float:
            raise TypeError(f"{name}: bitwise ops need integer or bool tensors, got {a.dtype.name}")
        return logical(a, b) if a.dtype is dt.bool_ else a._make(build(op, a._node, b._node), b)

    def bitwise_and(self, x): return self._bitwise("BITAND", x, Arithmetic.logical_and, "bitwise_and")
    def bitwise_or(self, x): return self._bitwise("BITOR", x, Arithmetic.logical_or, "bitwise_or")
    def bitwise_xor(self, x): return self._bitwise("BITXOR", x, Arithmetic.logical_xor, "bitwise_xor")

    def bitwise_not(self):
        if self.dtype.is_float:
            raise TypeError(f"bitwise_not: needs an integer or bool tensor, got {self.dtype.name}")
        return self.logical_not() if self.dtype is dt.bool_ else self._unary("BITNOT")

    def pow(self, p):
        """xᵖ with torch's semantics and dtypes (int ** int stays int64; a float exponent makes a float).
        x⁰ = 1 everywhere (nan⁰ too), with gradient 0; positive integer exponents multiply (exact, so negative
        bases work), -1, 0.5 and -0.5 are a reciprocal, square root and its reciprocal (as torch); the rest is the POW primitive (C's
        pow: (-inf)^0.3 = inf, a negative base to a non-integer exponent nan; gradient p·x^(p-1), inf at 0 for
        0 < p < 1)."""
        if isinstance(p, TensorLike):
            x, p = (t if t.dtype is not dt.bool_ else t.long() for t in self._broadcast(p, name="pow"))
            return x._make(build("POW", x._node, p._node), p)
        if not isinstance(p, (bool, int, float, np.number)):
            raise TypeError(f"pow: the exponent must be a number or a tensor, got {type(p).__name__}")
        x = self.long() if self.dtype is dt.bool_ else self
        if isinstance(p, (bool, int, np.integer)):
            if p < 0 and not x.dtype.is_float:
                raise RuntimeError("pow: integers to negative integer powers are not allowed")
        else:
            x = x._float()
        if p == 0:  # 1, also for nan and inf, and a gradient of 0 (a where, so it reaches x)
            return from_node(const(True, x.shape, dt.bool_), x.device).where(x._as(1, x.dtype), x)
        if float(p).is_integer() and 0 < p <= 64:
            n, result, base = int(p), None, x
            while n:
                if n & 1:
                    result = base if result is None else result * base
                n >>= 1
                if n:
                    base = base * base
            return result
        if p == -1:
            return x.reciprocal()
        if p == 0.5:
            return x.sqrt()
        if p == -0.5:
            return x.rsqrt()
        return x._binary("POW", x._as(p, x.dtype), name="pow")

    def exp(self): return self._float()._unary("EXP")
    def log(self): return self._float()._unary("LOG")
    def sqrt(self): return self._float()._unary("SQRT")
    def rsqrt(self): return self.sqrt().reciprocal()
    def tanh(self): return self._float()._unary("TANH")
    def erf(self): return self._float()._unary("ERF")
    def square(self): return self * self
    def log2(self): return self.log() * (1.0 / math.log(2.0))
    def log10(self): return self.log() * (1.0 / math.log(10.0))
    def exp2(self): return (self._float() * math.log(2.0)).exp()
    def isnan(self): return self != self
    def isinf(self): return self.abs() == math.inf if self.dtype.is_float else self != self
    def isfinite(self): return self.abs() < math.inf if self.dtype.is_float else self == self
    def logaddexp(self, x):
        """log(eˣ + eʸ), shifted by the larger so nothing overflows."""
        x = self._as(x)._float()
        m = self._float().maximum(x).detach()
        m = m.isfinite().where(m, 0.0)  # (−inf − −inf would be nan)
        return m + ((self - m).exp() + (x - m).exp()).log()
    def sigmoid(self):
        """σ(x) = 1/(1+e) for x ≥ 0 and e/(1+e) for x < 0, with e = e^(-|x|) ≤ 1: nothing overflows. The plain
        1/(1+e^(-x)) overflows to 1/inf for x ≪ 0, and its gradient there is 0·inf = nan."""
        x = self._float()
        neg = x < 0
        e = neg.where(x, -x).exp()  # -|x|, with the slope of the branch taken (also at 0, unlike abs)
        r = (1.0 + e).reciprocal()
        return neg.where(e * r, r)
    def relu(self):
        """x where x > 0 or x is nan (nan passes, with its gradient, as torch), else 0."""
        keep = (self > 0).logical_or(self != self) if self.dtype.is_float else self > 0
        return keep.where(self, 0.0 if self.dtype.is_float else 0)
    def abs(self):
        """x·sign(x), so the gradient at 0 is sign(0) = 0, as torch; + 0 makes abs(-0.0) +0.0, as torch's."""
        out = self * self.sign()
        return out + 0.0 if self.dtype.is_float else out
    def sign(self):
        """1, 0 or -1 (0 for nan, as torch), with a zero gradient (torch's): the comparisons alone would leave it
        outside the graph, so the value is taken through a WHERE whose other branch is x."""
        s = (self > 0).to(self.dtype) - (self < 0).to(self.dtype)
        if not self.requires_grad:
            return s
        return (self == self).logical_or(True).where(s, self)

    def sgn(self):
        """torch.sgn: sign() of a real tensor (z / |z| of a complex one: tinyllm/complex.py)."""
        return self.sign()
    def clamp(self, min=None, max=None):
        """min(max(x, min), max) as torch: the gradient passes where min ≤ x ≤ max (bounds included), nan stays
        nan (with gradient 0), and min > max gives max everywhere."""
        if min is None and max is None:
            raise RuntimeError("clamp: at least one of min and max must be given")
        out = self
        if self.dtype.is_float or any(isinstance(b, float) or getattr(b, "dtype", dt.int64).is_float
                                      for b in (min, max)):
            out = self._float()
            out = (out != out).where(out.detach(), out)  # nan: no gradient, as torch
        if min is not None:
            out = (out < min).where(min, out)
        if max is not None:
            out = (out > max).where(max, out)
        return out
    clip = clamp

    def where(self, x, y):
        """self ? x : y, as torch.where(self, x, y) with self a bool condition."""
        if self.dtype is not dt.bool_:
            raise TypeError(f"where: the condition must be bool, got {self.dtype.name}: compare first (x > 0, mask == 1)")
        ref = x if isinstance(x, TensorLike) else y if isinstance(y, TensorLike) else self
        x, y = ref._as(x)._broadcast(ref._as(y), name="where")
        shape = broadcast_shape([self.shape, x.shape], "where")
        c, x, y = self.expand(*shape), x.expand(*shape), y.expand(*shape)
        return x._make(build("WHERE", c._node, x._node, y._node), y)

    def masked_fill(self, mask, value):
        mask = self._as(mask)
        if mask.dtype is not dt.bool_:
            raise TypeError(f"masked_fill: the mask must be bool, got {mask.dtype.name}: use (mask == 0) or .bool()")
        if broadcast_shape([mask.shape, self.shape], "masked_fill") != self.shape:
            raise ValueError(f"masked_fill: a mask of shape {mask.shape} does not broadcast to the tensor's shape "
                             f"{self.shape}")
        return mask.where(self._as(value, self.dtype), self)
