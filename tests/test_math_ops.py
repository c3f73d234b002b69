"""torch's elementwise math (tinyllm/math_ops.py and the SIN, ATAN, FLOOR, FMOD and IDIV primitives): values and
gradients against torch on every runtime, integers exactly, edge values (0, -0.0, ±inf, nan, ±1, halves, negative
divisors), integer division by zero, shifts, the function forms and the operators.

Hypothesis draws the values; shapes are fixed, since each new shape compiles new C and WGSL kernels.
Tolerances, float32: values rtol 1e-5 / atol 1e-6, gradients rtol 1e-4 / atol 1e-5. The compositions round a few
times (x/z is x·(1/z) here), and libm, NumPy's SIMD, lavapipe's sin (1.5 ulp) and the WGSL atan (3 ulp) differ by
a few ulp; cos = 1 - 2·sin²(x/2) has an absolute error near 6e-8 where cos x is near 0 (the atol), so tan's
relative error grows as 6e-8/|cos x|: its inputs keep |x| ≤ 1.4. Integers and rounding results compare exactly.
Edge values compare exactly, the sign of a zero included. Left out, as artifacts of torch's formulas rather than
values to match: copysign's gradient at x = ±inf or nan (torch: nan, from result/x), atan2's at infinite arguments
or where x² + y² underflows, acosh's below 1, and fmod/remainder where x/z overflows (torch's vectorised fmod
gives nan; C's fmod, here, the exact remainder: checked against NumPy). On the WGSL runtime sin's inputs stay
below 1e5 in size (lavapipe reduces larger arguments poorly).
"""
import math

import numpy as np
import pytest
import torch
from hypothesis import given

import tinyllm as tl
from helpers import SEEDS, compare, helper_test_op

pytestmark = pytest.mark.usefixtures("each_runtime")
TOL = {"forward": (1e-5, 1e-6), "grad": (1e-4, 1e-5)}
SHAPE, PAIR = (2, 3, 4), ((2, 3, 4), (3, 1))  # fixed (the second operand broadcast): each runtime compiles once
INF, NAN = math.inf, math.nan

# name -> the range its inputs are drawn from (off poles and domain edges; the edges have their own tests)
UNARY = {"sin": (-10, 10), "cos": (-10, 10), "tan": (-1.4, 1.4), "asin": (-0.99, 0.99), "acos": (-0.99, 0.99),
         "atan": (-20, 20), "sinh": (-6, 6), "cosh": (-6, 6), "asinh": (-50, 50), "acosh": (1.01, 50),
         "atanh": (-0.99, 0.99), "floor": (-5, 5), "ceil": (-5, 5), "trunc": (-5, 5), "round": (-5, 5),
         "frac": (-5, 5)}
ROUNDING = {"floor", "ceil", "trunc", "round"}
ALIASES = {"arcsin": "asin", "arccos": "acos", "arctan": "atan", "arctan2": "atan2", "arcsinh": "asinh",
           "arccosh": "acosh", "arctanh": "atanh", "fix": "trunc", "true_divide": "div"}


def test_aliases_are_the_same_methods():
    for alias, name in ALIASES.items():
        assert getattr(tl.Tensor, alias) is getattr(tl.Tensor, name), alias


def _draw(rng, shape, low, high, halves=False):
    a = rng.uniform(low, high, shape)
    if halves:  # rounding: exact halves and integers, where the ties are
        a = np.where(rng.random(shape) < 0.5, np.round(a * 2) / 2, a)
    return a.astype(np.float32)


@pytest.mark.parametrize("name", UNARY)
@given(seed=SEEDS)
def test_unary_matches_torch(name, seed):
    a = _draw(np.random.default_rng(seed), SHAPE, *UNARY[name], halves=name in ROUNDING)
    helper_test_op(None, lambda x: getattr(x, name)(), tol=TOL, arrays=[a])


@pytest.mark.parametrize("decimals", [1, 2, -1])
@given(seed=SEEDS)
def test_round_decimals(decimals, seed):
    # torch scales by 10^d and divides back; here the division is a product with 10^-d, an ulp away at most
    a = _draw(np.random.default_rng(seed), (7,), -500, 500)
    helper_test_op(None, lambda x: x.round(decimals=decimals), tol=TOL, arrays=[a])


BINARY = {"atan2": lambda x, y: x.atan2(y), "remainder": lambda x, y: x.remainder(y), "fmod": lambda x, y: x.fmod(y),
          "div_trunc": lambda x, y: x.div(y, rounding_mode="trunc"),
          "div_floor": lambda x, y: x.div(y, rounding_mode="floor"), "copysign": lambda x, y: x.copysign(y),
          "mod": lambda x, y: x % y, "rmod": lambda x, y: 3.5 % y}


@pytest.mark.parametrize("name", BINARY)
@given(seed=SEEDS)
def test_binary_matches_torch(name, seed):
    rng = np.random.default_rng(seed)
    a = _draw(rng, PAIR[0], -6, 6, halves=True)
    b = (_draw(rng, PAIR[1], 0.3, 3) * rng.choice([-1, 1], PAIR[1])).astype(np.float32)  # divisors off 0
    helper_test_op(None, BINARY[name], tol=TOL, arrays=[a, b], grad=name != "rmod")  # (torch: none for rmod)


@given(seed=SEEDS)
def test_floor_divide_values_and_zero_gradient(seed):
    rng = np.random.default_rng(seed)
    a = _draw(rng, PAIR[0], -6, 6, halves=True)
    b = (_draw(rng, PAIR[1], 0.3, 3) * rng.choice([-1, 1], PAIR[1])).astype(np.float32)
    x, y = tl.tensor(a, requires_grad=True), tl.tensor(b, requires_grad=True)
    for got in (x.floor_divide(y), x // y, tl.floor_divide(x, y)):
        compare("floor_divide", got.numpy(), torch.floor_divide(torch.tensor(a), torch.tensor(b)).numpy(), 0, 0)
    (x // y).sum().backward()  # torch has no gradient for floor_divide (it raises); div(floor)'s is 0, as here
    assert not x.grad.numpy().any() and not y.grad.numpy().any()


@given(seed=SEEDS)
def test_rounded_quotients_at_integer_boundaries(seed):
    """a = n·b (rounded), where x·(1/z) may fall on either side of n: the fmod-based quotients are torch's."""
    rng = np.random.default_rng(seed)
    b = (rng.uniform(0.1, 3, 40) * rng.choice([-1, 1], 40)).astype(np.float32)
    a = (b * rng.integers(-9, 10, 40)).astype(np.float32)
    ta, tb, x, y = torch.tensor(a), torch.tensor(b), tl.tensor(a), tl.tensor(b)
    compare("floor", x.div(y, rounding_mode="floor").numpy(), torch.div(ta, tb, rounding_mode="floor").numpy(), 0, 0)
    compare("trunc", x.div(y, rounding_mode="trunc").numpy(), torch.div(ta, tb, rounding_mode="trunc").numpy(), 0, 0)
    compare("remainder", (x % y).numpy(), (ta % tb).numpy(), 0, 0)
    compare("fmod", x.fmod(y).numpy(), ta.fmod(tb).numpy(), 0, 0)


# ---- integers ---------------------------------------------------------------------------------------------------
INT_OPS = {"remainder": lambda x, y: x.remainder(y), "fmod": lambda x, y: x.fmod(y),
           "floor_divide": lambda x, y: x.floor_divide(y), "floordiv": lambda x, y: x // y, "mod": lambda x, y: x % y,
           "div_trunc": lambda x, y: x.div(y, rounding_mode="trunc"),
           "div_floor": lambda x, y: x.div(y, rounding_mode="floor"),
           "rfloordiv": lambda x, y: 100 // y, "rmod": lambda x, y: -100 % y, "mod_scalar": lambda x, y: x % -7,
           "true_divide": lambda x, y: x.true_divide(y)}


@pytest.mark.parametrize("name", INT_OPS)
@given(seed=SEEDS)
def test_integer_division_is_exact(name, seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(-1000, 1000, PAIR[0])
    b = rng.integers(1, 30, PAIR[1]) * rng.choice([-1, 1], PAIR[1])
    helper_test_op(None, INT_OPS[name], tol=TOL, arrays=[a, b], grad=False)


@pytest.mark.parametrize("name", ["floor", "ceil", "trunc", "round", "fix"])
def test_rounding_leaves_integers_alone(name):
    x = tl.tensor([5, -5, 0, 2**30])
    y = getattr(x, name)()
    assert y is not x and y.dtype is tl.int64 and y.tolist() == [5, -5, 0, 2**30]


@pytest.mark.parametrize("dtype", [np.int64, np.bool_, np.float64])
@pytest.mark.parametrize("name", ["sin", "cos", "atan", "sinh", "asinh", "atanh", "asin"])
def test_dtypes_follow_torch(name, dtype):
    a = np.array([0, 1, 0, 1], dtype) if dtype is np.bool_ else np.array([0.25, -0.5, 0.75, 0], dtype)
    a = np.array([0, 1, -1, 0], dtype) if dtype is np.int64 else a
    compare(name, getattr(tl.tensor(a), name)().numpy(), getattr(torch.tensor(a), name)().numpy(),
            1e-12 if dtype is np.float64 else 1e-6, 1e-7)


@pytest.mark.parametrize("name", ["remainder", "fmod", "floor_divide", "atan2", "copysign"])
@pytest.mark.parametrize("other", [2, 2.5, "float64", "bool"])
def test_binary_dtypes_follow_torch(name, other, each_runtime):
    if other == "float64" and each_runtime == "wgsl":
        pytest.skip("WGSL runtime: no float64")
    a = np.array([7, -7, 3, 0])
    b = {"float64": np.array([2.0, -2.0, 2.0, 2.0]), "bool": np.array([True, True, True, True])}.get(other, other)
    got = getattr(tl.tensor(a), name)(tl.tensor(b) if isinstance(b, np.ndarray) else b)
    want = getattr(torch.tensor(a), name)(torch.tensor(b) if isinstance(b, np.ndarray) or name == "atan2" else b)
    compare(f"{name} int64 by {other}", got.numpy(), want.numpy(), 1e-6, 1e-7)


@pytest.mark.parametrize("name", ["remainder", "fmod", "floor_divide", "div_trunc", "div_floor"])
def test_integer_division_by_zero_raises(name):
    fn = {"div_trunc": lambda x, y: x.div(y, rounding_mode="trunc"),
          "div_floor": lambda x, y: x.div(y, rounding_mode="floor")}.get(name, lambda x, y: getattr(x, name)(y))
    op = name.split("_")[0] if name.startswith("div") else name
    x = tl.tensor([5, -6, 7])
    for divisor in (0, tl.tensor([1, 0, 2]), tl.tensor([3, 2, 1]) - 1):  # a number, a tensor, a computed tensor
        with pytest.raises(ZeroDivisionError, match=f"{op}: integer division by zero"):
            fn(x, divisor)
    with pytest.raises(RuntimeError):  # what torch raises: the error is both
        5 // tl.tensor([0, 1])
    floats = fn(x.float(), 0).numpy()  # floats divide by 0 without an error: inf, or nan for a remainder
    assert (np.isnan(floats) if name in ("remainder", "fmod") else np.isinf(floats)).all()


def test_integer_division_kernels_never_trap(each_runtime):
    """IDIV built straight into a graph (the front end refuses a zero divisor first): the NumPy reference raises,
    the generated C and WGSL kernels give x / 0 = x (as WGSL defines it) instead of trapping."""
    from tinyllm.graph import build
    x, z = tl.tensor([7, -8, 9]), tl.tensor([2, 0, -1])
    q = x._make(build("IDIV", x.node, z.node))
    if each_runtime == "numpy":
        with pytest.raises(ZeroDivisionError, match="IDIV: integer division by zero"):
            q.numpy()
    else:
        assert q.tolist() == [3, -8, -9]


def test_integer_quotient_wraps_at_the_minimum(each_runtime):
    """INT64_MIN / -1 overflows: C would trap, torch's CPU result is undefined; here it wraps (INT32_MIN on the
    WGSL runtime, whose int64 are 32-bit)."""
    low = -2**31 if each_runtime == "wgsl" else -2**63
    x, m = tl.tensor([low, low, low]), tl.tensor([-1, -1, 3])
    assert x.floor_divide(m).tolist()[:2] == [low, low] and x.fmod(m).tolist()[:2] == [0, 0]
    assert x.div(m, rounding_mode="trunc").tolist()[2] == -(-low // 3) and (x % m).tolist()[:2] == [0, 0]


# ---- shifts ---------------------------------------------------------------------------------------------------
@given(seed=SEEDS)
def test_shifts_match_torch(seed):
    rng = np.random.default_rng(seed)
    x, n = rng.integers(-2**20, 2**20, (3, 5)), rng.integers(0, 11, (3, 5))
    for fn in (lambda a, b: a << b, lambda a, b: a >> b, lambda a, b: a.bitwise_left_shift(b),
               lambda a, b: a.bitwise_right_shift(b), lambda a, b: a >> 3, lambda a, b: a << 2,
               lambda a, b: 1000 >> b, lambda a, b: -3 << b, lambda a, b: tl.bitwise_right_shift(a, b)
               if isinstance(a, tl.Tensor) else torch.bitwise_right_shift(a, b)):
        helper_test_op(None, fn, tol=TOL, arrays=[x, n], grad=False)


def test_shifts_out_of_range_as_torch(each_runtime):
    x = np.array([5, -5, 1, -1, 0, 2**30 - 1, -2**30])
    wide = each_runtime != "wgsl"  # the WGSL runtime's int64 are 32-bit: results must fit
    for n in [0, 1, 30, 31, 40, 62, 63, 64, 65, 100, -1, -64]:
        want_r = (torch.tensor(x) >> n).numpy()
        compare(f">> {n}", (tl.tensor(x) >> n).numpy(), want_r, 0, 0)
        compare(f">> tensor {n}", (tl.tensor(x) >> tl.tensor([n])).numpy(), want_r, 0, 0)
        want_l = (torch.tensor(x) << n).numpy()
        if wide or ((want_l >= -2**31) & (want_l < 2**31)).all():
            compare(f"<< {n}", (tl.tensor(x) << tl.tensor([n])).numpy(), want_l, 0, 0)


def test_shifts_refuse_floats_and_bools():
    with pytest.raises(TypeError, match="bitwise_left_shift: shifts need integer tensors, got float32"):
        tl.tensor([1.5]) << 1
    with pytest.raises(TypeError, match="bitwise_right_shift: shifts need integer tensors, got bool"):
        tl.tensor([True]) >> tl.tensor([True])
    assert (tl.tensor([True, False]) << 1).tolist() == [2, 0]  # a bool meets an int: int64, as torch


# ---- edge values ----------------------------------------------------------------------------------------------
EDGES = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -2.5, 1e-30, -1e-7, 3.0, -10.0, 100.0, -1e4, 3e38,
                  INF, -INF, NAN], np.float32)


def _same(name, got, want):
    """Equal, NaN where torch's is, and the sign of every zero as torch's."""
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype}, torch gives {want.dtype}"
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0, equal_nan=True, err_msg=name)
    assert (np.signbit(got) == np.signbit(want))[want == 0].all(), f"{name}: signs of zeros {got} vs {want}"


@pytest.mark.parametrize("name", sorted(set(UNARY) - {"sin", "cos", "tan"}) + ["sin", "cos", "tan"])
def test_unary_edge_values(name, each_runtime):
    a = EDGES
    if name in ("sin", "cos", "tan"):  # lavapipe's sin reduces its argument well only up to about 1e7
        a = a[np.abs(a) < 1e5] if each_runtime == "wgsl" else a
    _same(name, getattr(tl.tensor(a), name)().numpy(), getattr(torch.tensor(a), name)().numpy())


@pytest.mark.parametrize("name, at", [("asin", [1.0, -1.0, 0.0]), ("acos", [1.0, -1.0, 0.0]),
                                      ("atanh", [1.0, -1.0, 0.0]), ("acosh", [1.0, 1e10]),
                                      ("asinh", [0.0, 1e10, -INF]), ("atan", [INF, -INF, 1e30]),
                                      ("sinh", [INF, -INF, 100.0]), ("cosh", [INF, -INF, 100.0]),
                                      ("floor", [INF, 0.0, 2.0]), ("round", [0.5, -1.5, 2.5]),
                                      ("frac", [INF, -0.0, 3.0]), ("sin", [0.0, INF, NAN])])
def test_gradient_at_the_edges_as_torch(name, at):
    """At ±1 asin, acos and atanh have torch's infinite gradients (not nan), and rounding gives zeros, not None."""
    a = np.array(at, np.float32)
    x, tx = tl.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    getattr(x, name)().sum().backward()
    getattr(tx, name)().sum().backward()
    assert x.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, equal_nan=True, err_msg=name)


@pytest.mark.parametrize("a, expected", [([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, -0.4],
                                          [0.0, 2.0, 2.0, -0.0, -2.0, -2.0, 0.0, -0.0]),
                                         ([4194304.5, 4194305.5, 8388607.5, 8388609.0, 1e30, -1e-30],
                                          [4194304.0, 4194306.0, 8388608.0, 8388609.0, 1e30, -0.0])])
def test_round_halves_to_even(a, expected):
    a = np.array(a, np.float32)
    _same("round", tl.tensor(a).round().numpy(), torch.tensor(a).round().numpy())
    _same("round", tl.round(tl.tensor(a)).numpy(), np.array(expected, np.float32))


BINARY_EDGES = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, -7.0, 100.0, INF, -INF, NAN], np.float32)


@pytest.mark.parametrize("name", ["atan2", "remainder", "fmod", "floor_divide", "div_trunc", "div_floor", "copysign"])
def test_binary_edge_values(name):
    fn = {"div_trunc": lambda x, y: x.div(y, rounding_mode="trunc"),
          "div_floor": lambda x, y: x.div(y, rounding_mode="floor")}.get(name, lambda x, y: getattr(x, name)(y))
    a, b = (v.ravel() for v in np.meshgrid(BINARY_EDGES, BINARY_EDGES))
    _same(name, fn(tl.tensor(a), tl.tensor(b)).numpy(), fn(torch.tensor(a), torch.tensor(b)).numpy())


def test_fmod_is_exact_where_the_quotient_is_huge():
    """C's fmod (and NumPy's): exact even where x/z overflows (torch's vectorised fmod gives nan there)."""
    a = np.array([3e38, -3e38, 1e30, 7.5e37, 1e-30], np.float32)
    b = np.array([0.5, 0.7, 3e-7, -1e-38, 3e-38], np.float32)
    _same("fmod", tl.tensor(a).fmod(tl.tensor(b)).numpy(), np.fmod(a, b))
    want_r = np.where((np.fmod(a, b) != 0) & ((np.fmod(a, b) < 0) != (b < 0)), np.fmod(a, b) + b, np.fmod(a, b))
    _same("remainder", tl.tensor(a).remainder(tl.tensor(b)).numpy(), want_r.astype(np.float32))


def test_fmod_subnormal_remainders_are_exact():
    """Remainders below the smallest normal float, of normal and subnormal divisors, bit for bit as NumPy's (zeros'
    signs too). OpenGL drivers flush a subnormal result of ldexp or a product to zero, so the WGSL kernel builds the
    remainder from its bits."""
    rng = np.random.default_rng(0)
    n = 512
    b = (rng.uniform(1e-40, 1e-37, n) * rng.choice([-1, 1], n)).astype(np.float32)
    a = np.where(rng.random(n) < 0.8, rng.uniform(-1e3, 1e3, n), rng.uniform(-1e-37, 1e-37, n)).astype(np.float32)
    a[:4] = [0.0, -0.0, 3 * b[2], -5 * b[3]]  # exact multiples: zero remainders, with a's sign
    want = np.fmod(a, b)
    assert (np.abs(want) < np.finfo(np.float32).tiny).sum() > n // 4  # most remainders are subnormal
    got = tl.tensor(a).fmod(tl.tensor(b)).numpy()
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32), err_msg="fmod's bits")


def test_copysign_gradient_is_zero_at_zero():
    a, s = np.array([0.0, -0.0, 2.0, -3.0], np.float32), np.array([-1.0, 1.0, -0.0, 5.0], np.float32)
    x, y = tl.tensor(a, requires_grad=True), tl.tensor(s, requires_grad=True)
    tx, ty = torch.tensor(a, requires_grad=True), torch.tensor(s, requires_grad=True)
    x.copysign(y).sum().backward()
    tx.copysign(ty).sum().backward()
    _same("copysign", x.copysign(y).numpy(), tx.copysign(ty).detach().numpy())
    np.testing.assert_array_equal(x.grad.numpy(), tx.grad.numpy())
    np.testing.assert_array_equal(y.grad.numpy(), ty.grad.numpy())  # zeros, not None


def test_atan2_gradient_at_the_origin_as_torch():
    z = np.zeros(2, np.float32)
    y, x = tl.tensor(z, requires_grad=True), tl.tensor(np.array([0.0, -0.0], np.float32), requires_grad=True)
    y.atan2(x).sum().backward()
    assert not y.grad.numpy().any() and not x.grad.numpy().any()


# ---- forms, errors --------------------------------------------------------------------------------------------
NAMES = ["sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh", "atanh", "arcsin",
         "arccos", "arctan", "arctan2", "arcsinh", "arccosh", "arctanh", "floor", "ceil", "trunc", "round", "frac",
         "fix", "div", "true_divide", "floor_divide", "remainder", "fmod", "bitwise_left_shift",
         "bitwise_right_shift", "copysign"]


@pytest.mark.parametrize("name", NAMES)
def test_function_forms(name):
    binary = name in ("atan2", "arctan2", "div", "true_divide", "floor_divide", "remainder", "fmod", "copysign",
                      "bitwise_left_shift", "bitwise_right_shift")
    ints = name.startswith("bitwise")
    a = np.array([3, -4, 5]) if ints else np.array([0.25, -0.5, 1.5], np.float32)
    b = np.array([1, 2, 0]) if ints else np.array([2.0, -3.0, 0.5], np.float32)
    a = np.abs(a) + 1 if name in ("acosh", "arccosh") else a / 2 if name in ("asin", "acos", "atanh", "arcsin",
                                                                             "arccos", "arctanh") else a
    args = (tl.tensor(a), tl.tensor(b)) if binary else (tl.tensor(a),)
    got = getattr(tl, name)(*args)
    compare(name, got.numpy(), getattr(torch, name)(*[torch.tensor(v.numpy()) for v in args]).numpy(), 1e-6, 1e-7)
    compare(name, got.numpy(), getattr(args[0], name)(*args[1:]).numpy(), 0, 0)


def test_function_forms_take_numbers_first():
    t = tl.tensor([3, -4, 5])
    assert tl.remainder(7, t).tolist() == [1, -1, 2] == torch.remainder(7, torch.tensor([3, -4, 5])).tolist()
    assert tl.floor_divide(7, t).tolist() == [2, -2, 1]
    assert tl.round(tl.tensor([1.25, 2.75]), decimals=1).tolist() == torch.round(torch.tensor([1.25, 2.75]),
                                                                                 decimals=1).tolist()


def test_div_refuses_an_unknown_rounding_mode():
    with pytest.raises(ValueError, match="div: rounding_mode must be None, 'trunc' or 'floor', got 'round'"):
        tl.tensor([1.0]).div(2.0, rounding_mode="round")


@pytest.mark.parametrize("call, match", [
    (lambda: tl.tensor([1, 2]).frac(), "frac: needs a floating-point tensor"),
    (lambda: tl.tensor([True]).floor(), "floor: not defined for bool"),
    (lambda: tl.tensor([1]).round(decimals=1), "round: decimals=1 needs a float"),
    (lambda: tl.tensor([True]) % tl.tensor([True]), "remainder: not defined for two bool")])
def test_refusals_are_clear(call, match):
    with pytest.raises(TypeError, match=match):
        call()


def test_numpy_erf_is_math_erf():
    """The numpy runtime's vectorized erf (Chebyshev interpolants, Taylor near 0) against math.erf per element: within
    1e-12 relative over a dense sweep, the tails, tiny and signed zeros, ±inf and NaN, and equal once rounded to
    float32."""
    from tinyllm.ops.elementwise import erf
    xs = np.concatenate([np.linspace(-7, 7, 200_001), np.geomspace(1e-30, 1, 2_000), -np.geomspace(1e-30, 1, 2_000),
                         [0.0, -0.0, np.inf, -np.inf, 5e-324, 6.0, np.nextafter(6.0, 0), 0.05, np.nan]])
    ref = np.array([math.erf(v) for v in xs])
    got = erf(xs)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=0)
    np.testing.assert_array_equal(got.astype(np.float32), ref.astype(np.float32))
    assert np.signbit(erf(np.array([-0.0])))[0]
