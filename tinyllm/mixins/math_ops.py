"""torch's elementwise math beyond arithmetic, as Tensor methods: trigonometric and hyperbolic functions and their
inverses, rounding, the rounding divisions and remainders, shifts and copysign, with torch's names, dtypes and
gradients.

Each is composed of primitives, so every runtime and rewrite gets it for free; five primitives serve where a
composition would be wrong or far slower: SIN, ATAN, FLOOR, FMOD (the exact float remainder) and IDIV (the exact
integer quotient).

The compositions stay accurate over the whole range (no cancellation near 0 or ±1, no overflow before the result
overflows) and give torch's gradients at the edges of the domains too (±inf at ±1 for asin, acos and atanh): a
where's untaken branch still receives a gradient, 0, and 0 times an infinite local slope is nan, so an untaken
branch is fed inputs where its slopes are finite. None relies on compensated arithmetic such as (1 + z) - 1, which
shader compilers reassociate (lavapipe folds that one to z); only the predecessor in _rounds_up takes a difference
c - (c - y) that a compiler could fold, which lavapipe does not (were one to, trunc division would miss some
round-ups to the next integer).
"""
import math


from .. import dtype as dt
from ..graph import build, const
from . import TensorLike, from_node

LN2 = math.log(2.0)


# ---- helpers (functions, not methods) ----
def _true(x):
    return from_node(const(True, x.shape, dt.bool_), x.device)


def _abs(x):
    """(x < 0, |x|) with |x| as where(x < 0, -x, x): slope ±1 everywhere, 1 at 0 (abs has 0 there, as torch's)."""
    neg = x < 0
    return neg, neg.where(-x, x)


def _signbit(x):
    """The sign bit of a float, by comparisons: x < 0, or x = -0.0 (1/-0.0 = -inf). A NaN's stays unseen (positive)."""
    return (x < 0) | ((x == 0) & (x.reciprocal() < 0))


def _zero_grad(value, *inputs):
    """`value`, computed from detached inputs, with a gradient of 0 to each of `inputs`, as torch gives step
    functions: a where on a constant true condition sends its other branch 0 (and simplify folds it away)."""
    for t in inputs:
        if t.requires_grad:
            value = _true(value).where(value, t)
    return value


def _small(x, bound):
    """(|x| < bound, x there and 0 elsewhere): a series branch sees only its own range, so its slopes stay finite
    where it is not taken."""
    small = (x < bound) & (x > -bound)
    return small, small.where(x, 0.0)


def _terms(x, float32, float64):
    return float64 if x.dtype is dt.float64 else float32


def _big(x):
    """Where t² + 1 is t² to rounding (1/(4t²) below the unit roundoff u), with t² far from overflow: 2^13 for
    float32, 2^28 for float64, 2^7 for float16."""
    u = dt.finfo(x.dtype).eps / 2
    return 2.0 ** (math.ceil(-math.log2(u) / 2) + 1)


def _log1p(z):
    """ln(1 + z), accurate near 0, by a series there: no compensation trick (Goldberg's ln w·z/(w - 1) needs
    (1 + z) - 1 computed as written, and shader compilers fold it to z). For |z| < 1/4, 2·atanh(s) with
    s = z/(2 + z), |s| ≤ 1/7, to the power where the rest is below rounding; past that ln(1 + z), where rounding
    1 + z costs little."""
    small, zs = _small(z, 0.25)
    s = zs / (zs + 2.0)
    n = _terms(z, 6, 11)
    s2, p = s * s, 1.0 / (2 * n - 1)
    for k in reversed(range(n - 1)):
        p = p * s2 + 1.0 / (2 * k + 1)
    return small.where(s * p * 2.0, (1.0 + z).log())


def _expm1(x):
    """eˣ - 1, accurate near 0: for |x| < 1/2 the Taylor series (Horner, to the power where the rest is below
    rounding), past that eˣ - 1, where the subtraction loses little."""
    small, xs = _small(x, 0.5)
    p = xs / float(_terms(x, 9, 15)) + 1.0
    for k in reversed(range(2, _terms(x, 9, 15))):
        p = p * xs / float(k) + 1.0
    return small.where(xs * p, x.exp() - 1.0)


def _sinh_cosh(t):
    """(sinh t, cosh t) for t ≥ 0 from E = eᵗ - 1: sinh = (E + E/(E + 1))/2 (eᵗ - e⁻ᵗ cancels near 0) and
    cosh = 1 + E·(E/(E + 1))/2. E is capped in the quotient (1 by then) so it is never inf/inf, by a where: the 0
    gradient a min sends its capped input would meet an infinite one and make nan."""
    e = _expm1(t)
    cap = (e > 2.0 ** 64).where(2.0 ** 64, e)
    v = cap / (cap + 1.0)
    return (e + v) * 0.5, 1.0 + e * v * 0.5


# ---- rounding ----
def _integral(x, name):
    """Integers are already rounded: the same values as a new tensor, as torch; bools are refused, as torch."""
    if x.dtype is dt.bool_:
        raise TypeError(f"{name}: not defined for bool tensors (torch refuses them too): cast with .long() or .float()")
    return x.clone()


class IntegerDivisionByZero(ZeroDivisionError, RuntimeError):
    """torch raises RuntimeError("ZeroDivisionError"): this is both, so either except clause catches it."""


def _divide(self, x, mode, name):
    """Quotient rounded ("trunc", "floor") or remainder ("remainder": the divisor's sign, as Python's %; "fmod":
    the dividend's, as C's) of the promoted operands."""
    a, b = self._broadcast(x, name=name)
    if a.dtype is dt.bool_:
        raise TypeError(f"{name}: not defined for two bool tensors (torch refuses them too): cast one with .long()")
    if a.dtype.is_float:
        return _float_divide(a, b, mode)
    if _has_zero(b):
        raise IntegerDivisionByZero(f"{name}: integer division by zero (the {b.dtype.name} divisor has a 0): divide "
                                   "floats (.float()) for inf and nan instead")
    return _int_divide(a, b, mode)


def _int_divide(a, b, mode):
    """The integer quotient or remainder (b has no 0): IDIV, the truncated quotient, and what follows from it."""
    q = a._make(build("IDIV", a._node, b._node))
    if mode == "trunc":
        return q
    r = a - q * b  # C's remainder, with a's sign (INT64_MIN / -1 wraps and leaves 0)
    if mode == "fmod":
        return r
    off = (r != 0) & ((r < 0) != (b < 0))  # signs differ: the floor is one lower, the remainder one b higher
    return off.where(q - 1, q) if mode == "floor" else off.where(r + b, r)


def _has_zero(b):
    """Whether an integer divisor has a 0: read off the graph for a constant (a Python number), else computed now,
    as torch does (it checks every integer divisor before dividing)."""
    node = b.node
    while node.op in ("EXPAND", "RESHAPE", "CAST") and node.buffer is None:
        node = node.src[0]
    if node.op == "CONST":
        return node.arg == 0
    return bool((b == 0).any().item())


def _float_divide(a, b, mode):
    if mode == "fmod":
        return a._make(build("FMOD", a._node, b._node), b)
    m = a.fmod(b)
    if mode == "remainder":  # torch's: fmod, plus b where the signs differ
        return ((m != 0) & ((m < 0) != (b < 0))).where(m + b, m)
    # Rounded quotients: step functions, computed from detached operands, torch's zero gradient attached after.
    # floor is torch's algorithm (fmod-based, so right where x·(1/z) rounds across an integer); trunc truncates the
    # rounded quotient fl(x/z), as torch's: the exact truncation, one further from 0 where x/z rounds up to that.
    x, z, m = a.detach(), b.detach(), m.detach()
    q = (x - m) / z  # the exact trunc(x/z), up to this division's rounding
    if mode == "floor":
        q = ((m != 0) & ((m < 0) != (z < 0))).where(q - 1.0, q)
    n = q.floor()
    n = (q - n > 0.5).where(n + 1.0, n)  # the integer q is within rounding of
    quotient = x / z
    if mode == "trunc":
        n = _rounds_up(n, m, z, x).where(n + (_signbit(x) != _signbit(z)).where(-1.0, 1.0), n)
    zero = _signbit(quotient).where(x._as(-0.0), x._as(0.0))  # 0 takes the quotient's sign, as torch
    n = ((q if mode == "floor" else n) == 0).where(zero, n)
    # z = 0 (and for trunc x = ±inf): the quotient itself (inf or nan), as torch
    n = (z == 0).where(quotient, n) if mode == "floor" else (m != m).where(quotient.trunc(), n)
    return _zero_grad(n, a, b)


def _rounds_up(n, m, z, x):
    """Whether x/z = n + f (n the exact truncation, m = fmod(x, z)) rounds to |n| + 1 in x's float type, decided
    exactly: f ≥ 1 - g/2, g the gap below |n| + 1, i.e. (g/2)·|z| ≥ |z| - |m| (exact: g/2 is a power of two, and
    Sterbenz makes the difference exact). g comes from Rump, Zimmermann, Boldo and Melquiond's predecessor,
    pred(c) = c - c·u(1 + 2u), u the unit roundoff. Quotients from 2^(p-1) on are left as they are."""
    u = dt.finfo(x.dtype).eps / 2
    t, az, am = n.abs(), z.abs(), m.abs()
    c = t + 1.0
    half_gap = (c - (c - c * (u * (1 + 2 * u)))) * 0.5
    return (am >= az * 0.5) & (half_gap * az >= az - am) & (t < 0.5 / u)


# ---- shifts ----
def _shift_operands(self, n, name):
    x, n = self._broadcast(n, name=name)
    if x.dtype.is_float or x.dtype is dt.bool_:
        raise TypeError(f"{name}: shifts need integer tensors, got {x.dtype.name} (torch refuses them too): "
                        f"{'multiply by 2**n' if x.dtype.is_float else 'cast with .long()'} instead")
    return x, n


class MathOps(TensorLike):
    __slots__ = ()

    # ---- trigonometric and hyperbolic ----
    def sin(self): return self._float()._unary("SIN")

    def cos(self):
        """1 - 2·sin²(x/2): x/2 is exact, so cos needs no primitive of its own and has none of the argument error that
        sin(x + π/2) has for large x."""
        s = (self._float() * 0.5).sin()
        return 1.0 - s * s * 2.0

    def tan(self): return self.sin() / self.cos()

    def asin(self):
        """2·atan(x / (1 + √(1-x)·√(1+x))): the argument stays in [-1, 1], 1 ± x are exact near ±1 (1 - x² rounds x²),
        and at x = ±1 the gradient is torch's inf: one root has an infinite slope, the other a finite one (√(1-x²)
        as one root would meet 0·inf)."""
        x = self._float()
        return (x / (1.0 + (1.0 - x).sqrt() * (1.0 + x).sqrt())).atan() * 2.0

    def acos(self):
        """acos|x| = 2·atan(√(1-|x|)/√(1+|x|)), and π - that for x < 0: every quotient finite, 1 - |x| exact near 1,
        and torch's gradient -inf at x = ±1."""
        neg, t = _abs(self._float())
        a = ((1.0 - t).sqrt() / (1.0 + t).sqrt()).atan() * 2.0
        return neg.where(math.pi - a, a)

    def atan(self): return self._float()._unary("ATAN")

    def atan2(self, other):
        """The angle of (other, self) in (-π, π], as torch.atan2(self, other) and C's atan2 (signed zeros and
        infinities included): atan of the smaller over the larger of |y|, |x| (never inf/inf), moved to the right
        quadrant. The gradient is (x·dy - y·dx)/(x² + y²), and 0 at (0, 0), as torch's."""
        y, x = self._broadcast(other, name="atan2")
        y, x = y._float(), x._float()
        zero = (x == 0) & (y == 0)
        xm = zero.where(1.0, x)  # the main branch away from (0, 0), where its slopes are infinite (torch's gradient: 0)
        swap = y.abs() > xm.abs()
        a = (swap.where(xm, y) / swap.where(y, xm)).atan()
        yneg, xneg = _signbit(y), _signbit(x)

        def signed(v):  # v with y's sign
            return yneg.where(x._as(-v), x._as(v))
        out = swap.where(signed(math.pi / 2) - a, xneg.where(a + signed(math.pi), a))  # |y| > |x|: ±π/2 - atan(x/y)
        out = (x.isinf() & y.isinf()).where(xneg.where(signed(3 * math.pi / 4), signed(math.pi / 4)), out)
        return zero.where(xneg.where(signed(math.pi), signed(0.0)), out)  # (±0, -0): ±π; (±0, +0): ±0

    def sinh(self):
        """sign(x)·sinh|x| (symmetric, so exact for negative x too); inf from |x| ≈ 88.7 on in float32, where eˣ
        overflows, as torch's."""
        neg, t = _abs(self._float())
        s = _sinh_cosh(t)[0]
        return neg.where(-s, s)

    def cosh(self): return _sinh_cosh(_abs(self._float())[1])[1]

    def asinh(self):
        """sign(x)·ln(t + √(t² + 1)), t = |x| (symmetric, so large negative x do not cancel): as
        log1p(t·(1 + t/(1 + √(1 + t²)))) up to _big (-0.0 stays -0.0), ln t + ln 2 past it (equal there to rounding;
        t² never overflows)."""
        neg, t = _abs(self._float())
        edge = _big(t)
        big = t > edge
        s = big.where(0.0, t)  # each branch gets inputs of its own range
        a = big.where(big.where(t, edge).log() + LN2, _log1p(s * (1.0 + s / (1.0 + (1.0 + s * s).sqrt()))))
        return neg.where(-a, a)

    def acosh(self):
        """ln(x + √(x² - 1)) = log1p(t + √t·√(t + 2)) with t = x - 1 (exact near 1, where the gradient is torch's inf)
        up to _big, ln x + ln 2 past it."""
        x = self._float()
        edge = _big(x)
        big = x > edge
        t = big.where(2.0, x) - 1.0
        return big.where(big.where(x, edge).log() + LN2, _log1p(t + t.sqrt() * (t + 2.0).sqrt()))

    def atanh(self):
        """(log1p(x) - log1p(-x))/2: accurate near 0 and near ±1 (where 1 ∓ x is exact), odd exactly, and ±inf with
        gradient inf at ±1, as torch."""
        x = self._float()
        return (_log1p(x) - _log1p(-x)) * 0.5

    def floor(self): return self._unary("FLOOR") if self.dtype.is_float else _integral(self, "floor")

    def ceil(self): return -(-self).floor() if self.dtype.is_float else _integral(self, "ceil")

    def trunc(self):
        """Toward zero: ceil below 0, floor above (so -0.5 gives -0.0, as torch)."""
        return (self < 0).where(self.ceil(), self.floor()) if self.dtype.is_float else _integral(self, "trunc")

    fix = trunc

    def round(self, decimals=0):
        """To the nearest integer, halves to even, as torch, from floor exactly: f = ⌊|x|⌋, d = |x| - f is exact, up
        where d > ½ or d = ½ and f is odd; |x| and the sign back after, so round(-0.4) is -0.0, as torch. `decimals`
        places (negative: tens, hundreds, ...) scale by 10^|decimals| first, as torch."""
        if not self.dtype.is_float:
            if decimals:
                raise TypeError(f"round: decimals={decimals} needs a floating-point tensor, got {self.dtype.name} (torch "
                                "refuses integers too): cast with .float()")
            return _integral(self, "round")
        if decimals:
            ten = 10.0 ** abs(decimals)
            return (self * ten).round() / ten if decimals > 0 else (self / ten).round() * ten
        neg, t = _abs(self)
        f = t.floor()
        d = t - f
        up = (d > 0.5) | ((d == 0.5) & ((f * 0.5).floor() * 2.0 != f))
        r = up.where(f + 1.0, f)
        return neg.where(-r, r)

    def frac(self):
        """x - trunc(x), with x's sign; gradient dy, as torch."""
        if not self.dtype.is_float:
            raise TypeError(f"frac: needs a floating-point tensor, got {self.dtype.name} (torch refuses integers too): "
                            "cast with .float()")
        return self - self.trunc()

    # ---- division with rounding, remainders ----
    def div(self, x, rounding_mode=None):
        """self / x, a float (for integers too), computed as self·(1/x); rounding_mode "trunc" rounds the quotient
        toward zero and "floor" down, as torch's (integers then stay int64, exact). A 16-bit quotient is computed in
        float32 and rounded once, as torch's: 1/x in float16 would round twice, and overflow for |x| < 2⁻¹⁶."""
        if rounding_mode is None:
            a, b = self._float(), self._as(x)._float()
            low = dt.result_type(a.dtype, b.dtype)
            if low in (dt.float16, dt.bfloat16):
                return (a.float() * b.float().reciprocal()).to(low)
            return a * b.reciprocal()
        if rounding_mode not in ("trunc", "floor"):
            raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
        return _divide(self, x, rounding_mode, "div")

    true_divide = div

    def floor_divide(self, x): return _divide(self, x, "floor", "floor_divide")

    def remainder(self, x): return _divide(self, x, "remainder", "remainder")

    def fmod(self, x): return _divide(self, x, "fmod", "fmod")

    def __floordiv__(self, x): return self.floor_divide(x)

    def __rfloordiv__(self, x): return self._as(x).floor_divide(self)

    def __mod__(self, x): return self.remainder(x)

    def __rmod__(self, x): return self._as(x).remainder(self)

    def bitwise_left_shift(self, n):
        """x·2ⁿ, wrapping as int64 does (the exact integer pow); n < 0 or n ≥ 64 gives 0, as torch."""
        if self.dtype in (dt.int8, dt.uint8) and type(n) is int:  # a Python int keeps the type, as torch
            return self.long().bitwise_left_shift(n).to(self.dtype)
        x, n = _shift_operands(self, n, "bitwise_left_shift")
        if x.dtype is not dt.int64:  # int8 / uint8: shifted as int64, then wrapped to the type's 8 bits, as torch
            return x.long().bitwise_left_shift(n.long()).to(x.dtype)
        return ((n < 0) | (n > 63)).where(0, x * x._as(2).pow(n.clamp(0, 63)))

    def bitwise_right_shift(self, n):
        """⌊x / 2ⁿ⌋, an arithmetic shift, in three floor divisions by at most 2²¹ (so each power of two fits the WGSL
        runtime's 32-bit integers too); n < 0 or n ≥ 63 gives 0 or -1 by x's sign, as torch."""
        if self.dtype in (dt.int8, dt.uint8) and type(n) is int:  # a Python int keeps the type, as torch
            return self.long().bitwise_right_shift(n).to(self.dtype)
        x, n = _shift_operands(self, n, "bitwise_right_shift")
        if x.dtype is not dt.int64:  # int8 / uint8: as int64 (the value fits the type again)
            return x.long().bitwise_right_shift(n.long()).to(x.dtype)
        out, rest = x, n.clamp(0, 62)
        for _ in range(3):
            k = rest.clamp(0, 21)
            out, rest = _int_divide(out, x._as(2).pow(k), "floor"), rest - k
        return ((n < 0) | (n > 62)).where((x < 0).where(-1, 0), out)

    def __lshift__(self, n): return self.bitwise_left_shift(n)

    def __rlshift__(self, x): return self._as(x).bitwise_left_shift(self)

    def __rshift__(self, n): return self.bitwise_right_shift(n)

    def __rrshift__(self, x): return self._as(x).bitwise_right_shift(self)

    # ---- signs ----
    def copysign(self, other):
        """|self| with the sign bit of `other` (-0.0 counts as negative, as torch; a NaN's sign bit is not seen, so it
        counts as positive). Gradient ±dy to self, 0 where self = 0 (torch's dy·result/self, masked there), 0 to other."""
        x, y = self._broadcast(other, name="copysign")
        x, y = x._float(), y._float()
        ny = _signbit(y)
        out = (_signbit(x) != ny).where(-x, x)
        out = (x == 0).where(ny.where(x._as(-0.0), x._as(0.0)), out)  # the same value, without a gradient
        return _zero_grad(out, y)

    arcsin, arccos, arctan, arctan2, arcsinh, arccosh, arctanh = asin, acos, atan, atan2, asinh, acosh, atanh
