"""Elementwise primitives: inputs of one shape and dtype (the front end broadcasts), output of that shape."""
import math

import numpy as np

from .. import dtype as dt
from ..graph import build, const
from .base import Binary, Identity, Op, Ternary, Unary, register


class FloatUnary(Unary):
    def infer(src, arg):
        (x,) = src
        if not x.dtype.is_float:
            raise TypeError(f"needs a floating-point input, got {x.dtype.name}: cast it with .float()")
        return x.shape, x.dtype


@register
class NEG(Unary):
    """y = -x  ⇒  dx = -dy"""
    def forward(x): return np.negative(x)
    def backward(dy, y): return (-dy,)


@register
class EXP(FloatUnary):
    """y = eˣ  ⇒  dx = dy · y"""
    autocast = "float32"
    def forward(x): return np.exp(x)
    def backward(dy, y): return (dy * y,)


@register
class LOG(FloatUnary):
    """y = ln x  ⇒  dx = dy / x"""
    autocast = "float32"
    def forward(x): return np.log(x)
    def backward(dy, y): return (dy / y.src[0],)


@register
class SQRT(FloatUnary):
    """y = √x  ⇒  dx = dy / (2y)"""
    autocast = "float32"
    def forward(x): return np.sqrt(x)
    def backward(dy, y): return (dy / (y * 2.0),)


@register
class RECIP(FloatUnary):
    """y = 1/x  ⇒  dx = -dy / x² = -dy · y²"""
    autocast = "float32"
    def forward(x): return np.reciprocal(x)
    def backward(dy, y): return (-(dy * y * y),)


@register
class TANH(FloatUnary):
    """y = tanh x  ⇒  dx = dy · (1 - y²)"""
    def forward(x): return np.tanh(x)
    def backward(dy, y): return (dy * (1.0 - y * y),)


def _erf_table(edges=(0.0, 0.75, 1.5, 2.25, 3.0, 4.0, 5.0, 6.0), degree=12):
    """Chebyshev interpolants of math.erf, one per interval of |x| (erf is 1 to float64 past 6): each is within
    ~1e-16 of math.erf on its interval, so rounded to float32 they give math.erf's float32 value (tests check)."""
    from numpy.polynomial import chebyshev
    coefs = [chebyshev.Chebyshev.interpolate(np.vectorize(math.erf, otypes=[float]), degree, domain=[a, b]).coef
             for a, b in zip(edges, edges[1:])]
    mid = np.array([(a + b) / 2 for a, b in zip(edges, edges[1:])])
    scale = np.array([2 / (b - a) for a, b in zip(edges, edges[1:])])
    return np.array(edges), [np.ascontiguousarray(c) for c in np.array(coefs).T], mid, scale


_ERF = []


def erf(x):
    """erf of a float array, in float64, vectorized (math.erf per element costs ~0.3 µs): Clenshaw's recurrence on
    each element's interval's interpolant, odd symmetry, and near 0, where the interpolant's absolute error would be
    a large relative one, erf's Taylor series to x⁹ (below 0.05 the next term is 1e-17 relative)."""
    if not _ERF:
        _ERF.append(_erf_table())
    edges, coefs, mid, scale = _ERF[0]
    x = np.asarray(x, np.float64)
    ax = np.minimum(np.abs(x), edges[-1])  # NaN stays NaN
    k = np.minimum(np.searchsorted(edges, ax, side="right") - 1, len(mid) - 1)
    t = (ax - mid[k]) * scale[k]
    b1, b2 = np.zeros_like(t), np.zeros_like(t)
    for c in coefs[:0:-1]:
        b1, b2 = c[k] + 2 * t * b1 - b2, b1
    y = np.copysign(coefs[0][k] + t * b1 - b2, x)
    x2 = x * x
    taylor = x * (2 / math.sqrt(math.pi)) * (1 - x2 * (1 / 3 - x2 * (1 / 10 - x2 * (1 / 42 - x2 / 216))))
    return np.where(np.abs(x) < 0.05, taylor, y)


@register
class ERF(FloatUnary):
    """y = erf x = (2/√π) ∫₀ˣ e^(-t²) dt  ⇒  dx = dy · (2/√π) · e^(-x²)"""
    def forward(x): return erf(x).astype(x.dtype)
    def backward(dy, y):
        x = y.src[0]
        return (dy * (-(x * x)).exp() * (2.0 / math.sqrt(math.pi)),)


@register
class SIN(FloatUnary):
    """y = sin x  ⇒  dx = dy · cos x, with cos x = 1 − 2·sin²(x/2): x/2 is exact, so cos needs no primitive of its
    own (and has none of the argument error that sin(x + π/2) has for large x)"""
    def forward(x): return np.sin(x)
    def backward(dy, y):
        s = build("SIN", y.src[0] * 0.5)
        return (dy * (1.0 - s * s * 2.0),)


@register
class ATAN(FloatUnary):
    """y = atan x  ⇒  dx = dy / (1 + x²)  (asin, acos and atan2 are built on it, each where it is exact)"""
    def forward(x): return np.arctan(x)
    def backward(dy, y):
        x = y.src[0]
        return (dy / (x * x + 1.0),)


@register
class FLOOR(FloatUnary):
    """y = ⌊x⌋  ⇒  dx = 0, a step function: zeros (not None, as torch). ceil, trunc and round are built on it
    exactly; integers are their own floor, so the front end never builds it for them"""
    def forward(x): return np.floor(x)
    def backward(dy, y):
        # zeros through a where on dy, not a bare constant: hash-consing shares a constant with every graph that
        # builds it, so a realized gradient would leave its buffer (and device) on that shared node
        return (const(True, dy.shape, dt.bool_).where(const(0, dy.shape, dy.dtype), dy),)


@register
class CAST(Unary):
    """y = x converted to dtype `arg`  ⇒  dx = dy converted back (no gradient reaches integers or bools)"""
    def infer(src, arg):
        (x,) = src
        if not isinstance(arg, dt.DType):
            raise TypeError(f"needs a dtype, got {arg!r}")
        return x.shape, arg
    def forward(x, arg): return x.astype(arg.np)
    def backward(dy, y):
        x = y.src[0]
        return (dy.cast(x.dtype) if x.dtype.is_float else None,)


@register
class DETACH(Identity):
    """y = x, but no gradient flows back through it (torch's .detach())."""
    infer = Unary.infer
    def forward(x): return x
    def backward(dy, y): return (None,)


@register
class AUTOCAST(Identity):
    """y = x, marked by `tinyllm.autocast` for the autocast pass (tinyllm/rewrite/autocast.py), which replaces it
    by a CAST to dtype `arg` (float16 or bfloat16: a low op's input; float32: a region computed wide) before
    anything runs or differentiates; with a second source `like` and arg "like", a CAST to the dtype `like` has
    after the pass (the end of a wide region: back to its input's dtype). Should one survive, it is x itself."""
    def infer(src, arg):
        if arg not in ((dt.float16, dt.bfloat16, dt.float32) if len(src) == 1 else ("like",)):
            raise TypeError(f"autocasts to float16, bfloat16 or float32 (one source), or like its second source "
                            f"(arg 'like'), not {arg!r} with {len(src)} sources")
        return src[0].shape, src[0].dtype
    def forward(x, *like, arg): return x
    def backward(dy, y): return (dy,) + (None,) * (len(y.src) - 1)


@register
class CONTIGUOUS(Op):
    """y = x copied into a fresh row-major buffer  ⇒  dx = dy"""
    copies = True
    infer = Unary.infer
    def forward(x): return np.ascontiguousarray(x)
    def backward(dy, y): return (dy,)


@register
class ADD(Binary):
    """y = x + z  ⇒  dx = dy, dz = dy"""
    commutative = True
    def forward(x, z): return np.add(x, z)
    def backward(dy, y): return (dy, dy)


@register
class MUL(Binary):
    """y = x · z  ⇒  dx = dy · z, dz = dy · x"""
    commutative = True
    def forward(x, z): return np.multiply(x, z)
    def backward(dy, y):
        x, z = y.src
        return (dy * z, dy * x)


@register
class MAX(Binary):
    """y = max(x, z)  ⇒  dx = dy · ([x ≮ z] - ½[x = z]), dz = dy · ([z ≮ x] - ½[x = z]): ties split evenly, and
    where either is nan (so y is) both get dy, as torch"""
    def forward(x, z): return np.maximum(x, z)
    def backward(dy, y):
        x, z = y.src
        tie = x.eq(z).cast(dy.dtype) * 0.5
        return (dy * (1.0 - (x < z).cast(dy.dtype) - tie), dy * (1.0 - (z < x).cast(dy.dtype) - tie))


class Compare(Binary):
    def infer(src, arg):
        shape, _ = Binary.infer(src, arg)
        return shape, dt.bool_
    def backward(dy, y): return (None, None)  # a step function: zero gradient almost everywhere


@register
class CMPLT(Compare):
    """y = [x < z] (bool); no gradient"""
    def forward(x, z): return np.less(x, z)


@register
class CMPEQ(Compare):
    """y = [x = z] (bool); no gradient"""
    commutative = True
    def forward(x, z): return np.equal(x, z)


@register
class WHERE(Ternary):
    """y = c ? a : b  ⇒  da = c ? dy : 0, db = c ? 0 : dy (no gradient to the condition)"""
    def infer(src, arg):
        c, a, b = src
        if c.dtype is not dt.bool_:
            raise TypeError(f"needs a bool condition, got {c.dtype.name}")
        Binary.infer((a, b), arg)
        if c.shape != a.shape:
            raise ValueError(f"condition shape {c.shape} differs from the values' {a.shape}")
        return a.shape, a.dtype
    def forward(c, a, b): return np.where(c, a, b)
    def backward(dy, y):
        c = y.src[0]
        zero = const(0, dy.shape, dy.dtype)
        return (None, c.where(dy, zero), c.where(zero, dy))


def _int_pow(x, p):
    """xᵖ for integers, exactly, wrapping as int64 does (as torch); a negative exponent gives the integer part
    of 1/xᵖ: 1 for x = 1, ±1 for x = -1, 0 otherwise (torch's result, 0 for x = 0 too)."""
    x, p = np.broadcast_arrays(np.asarray(x), np.asarray(p))
    out, base, e = np.ones(x.shape, x.dtype), x.copy(), np.where(p < 0, 0, p).astype(p.dtype)
    with np.errstate(over="ignore"):
        while e.any():
            out = np.where(e & 1, out * base, out)
            base, e = base * base, e >> 1
    neg = p < 0
    return np.where(neg, np.where(x == 1, 1, np.where(x == -1, np.where(p & 1, -1, 1), 0)), out).astype(x.dtype)


@register
class POW(Binary):
    """y = xᵖ (C's pow: 0⁰ = 1, (-inf)^0.3 = inf, a negative x to a non-integer p is nan; exact for integers)
    ⇒  dx = dy · p·x^(p-1), 0 where p = 0;  dp = dy · y·ln x, 0 where x = 0 and p ≥ 0 (torch's rules: so x^0.3
    has gradient inf at 0, and 0^p has no gradient to p where it is 0 or 1)"""
    autocast = "float32"
    def infer(src, arg):
        shape, dtype = Binary.infer(src, arg)
        if dtype is dt.bool_:
            raise TypeError("pow needs numbers, not bools: cast them with .long()")
        return shape, dtype
    def forward(x, p):
        if x.dtype.kind in "iu":
            return _int_pow(x, p)
        with np.errstate(all="ignore"):
            return np.power(x, p)
    def backward(dy, y):
        x, p = y.src
        zero = const(0, dy.shape, dy.dtype)
        dx = p.eq(0).where(zero, dy * p * build("POW", x, p - 1))
        stop = build("MUL", x.eq(0), build("MAX", p > 0, p.eq(0)))  # x = 0 and p ≥ 0 (bools: MUL and, MAX or)
        dp = stop.where(zero, dy * y * x.log())
        return (dx, dp)


@register
class FMOD(Binary):
    """y = fmod(x, z) = x − z·trunc(x/z), exactly (C's fmod: the remainder is always representable, while
    x − z·trunc(x/z) computed in floats rounds twice)  ⇒  dx = dy, dz = −dy·trunc(x/z) = −dy·(x − y)/z"""
    def infer(src, arg):
        shape, dtype = Binary.infer(src, arg)
        if not dtype.is_float:
            raise TypeError(f"needs floating-point operands, got {dtype.name}: integers divide with IDIV")
        return shape, dtype
    def forward(x, z):
        with np.errstate(all="ignore"):
            return np.fmod(x, z)
    def backward(dy, y):
        x, z = y.src
        q = (x - y) / z  # trunc(x/z) up to rounding; where that is nan (z = 0, x = ±inf), x/z (±inf), as torch's
        return (dy, -(dy * q.eq(q).where(q, x / z)))


@register
class IDIV(Binary):
    """y = trunc(x / z) for int64, exactly (C's /), the one exact integer quotient; no gradient. A zero divisor is
    an error (the front end raises before building; kernels give x there, as WGSL defines it, and never trap), and
    INT64_MIN / −1 wraps to INT64_MIN"""
    def infer(src, arg):
        shape, dtype = Binary.infer(src, arg)
        if dtype is not dt.int64:
            raise TypeError(f"needs int64 operands, got {dtype.name}: floats divide with FMOD and FLOOR")
        return shape, dtype
    def forward(x, z):
        if np.any(z == 0):
            raise ZeroDivisionError("IDIV: integer division by zero")
        with np.errstate(all="ignore"):  # INT64_MIN // -1 wraps
            q = np.floor_divide(x, z)
            return np.where((q * z != x) & ((x < 0) != (z < 0)), q + 1, q)  # floor -> toward zero
    def backward(dy, y): return (None, None)


class Bitwise(Binary):
    def infer(src, arg):
        shape, dtype = Binary.infer(src, arg)
        if dtype.is_float:
            raise TypeError(f"bitwise ops need integer or bool operands, got {dtype.name}")
        return shape, dtype
    def backward(dy, y): return (None, None)  # integers and bools carry no gradient


@register
class BITAND(Bitwise):
    """y = x & z, bit by bit (integers and bools); no gradient"""
    commutative = True
    def forward(x, z): return np.bitwise_and(x, z)


@register
class BITOR(Bitwise):
    """y = x | z, bit by bit (integers and bools); no gradient"""
    commutative = True
    def forward(x, z): return np.bitwise_or(x, z)


@register
class BITXOR(Bitwise):
    """y = x ^ z, bit by bit (integers and bools); no gradient"""
    commutative = True
    def forward(x, z): return np.bitwise_xor(x, z)


@register
class BITNOT(Unary):
    """y = ~x, every bit flipped (integers; logical not for bools); no gradient"""
    def infer(src, arg):
        (x,) = src
        if x.dtype.is_float:
            raise TypeError(f"bitwise not needs an integer or bool operand, got {x.dtype.name}")
        return x.shape, x.dtype
    def forward(x): return np.invert(x)
    def backward(dy, y): return (None,)
