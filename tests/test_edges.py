"""Edges where tinyllm must behave as torch, values and gradients, on every runtime (issue 43, point 3): reductions and
scans over zero-size axes, all/any of nothing, integer shifts at and past the type's width, max pooling with
ceil_mode, circular padding, acosh's gradient at 1, sign's gradient, logcumsumexp of large magnitudes, and
F.normalize of a zero vector.

Values and gradients: rtol 1e-5, atol 1e-6 (logcumsumexp's scan 1e-4: a log-add-exp per step in another order than
torch's loop); integers, bools, infinities and NaN exactly; errors: the same exception type as torch's."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import tinyllm as tl
import tinyllm.nn.functional as F

pytestmark = pytest.mark.usefixtures("each_runtime")


def _np(t):
    if isinstance(t, torch.Tensor):
        return t.detach().numpy()
    return t.numpy()


def check(fn, *arrays, grad=True, rtol=1e-5, atol=1e-6, w=None):
    """fn(lib, *tensors) in tinyllm and in torch: the same values and, for float inputs with grad, the same
    gradients of Σ out · w."""
    ours = [tl.tensor(a, requires_grad=grad and a.dtype.kind == "f") for a in arrays]
    theirs = [torch.tensor(a, requires_grad=grad and a.dtype.kind == "f") for a in arrays]
    got, want = fn(tl, *ours), fn(torch, *theirs)
    assert tuple(got.shape) == tuple(want.shape), f"shape {tuple(got.shape)}, torch {tuple(want.shape)}"
    assert str(got.dtype).split(".")[-1] == str(want.dtype).split(".")[-1], f"dtype {got.dtype}, torch {want.dtype}"
    np.testing.assert_allclose(_np(got), _np(want), rtol=rtol, atol=atol, equal_nan=True)
    if grad and any(a.dtype.kind == "f" for a in arrays) and want.requires_grad:
        wv = np.ones(want.shape, np.float32) if w is None else w
        (got * tl.tensor(wv)).sum().backward()
        (want * torch.tensor(wv)).sum().backward()
        for o, t in zip(ours, theirs):
            if t.grad is not None:
                assert o.grad is not None, "no gradient where torch has one"
                np.testing.assert_allclose(_np(o.grad), _np(t.grad), rtol=rtol, atol=atol, equal_nan=True)
    return got


def raises_as_torch(fn, *arrays):
    with pytest.raises(Exception) as theirs:
        fn(torch, *[torch.tensor(a) for a in arrays])
    with pytest.raises(theirs.type):
        fn(tl, *[tl.tensor(a) for a in arrays]).numpy()


EMPTY = [((0, 3), None), ((0, 3), 0), ((0, 3), 1), ((3, 0), 1), ((3, 0), 0), ((2, 0, 3), (0, 1))]


# ---- reductions and scans over nothing ----------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore")  # torch warns "degrees of freedom is <= 0" for var / std over nothing
@pytest.mark.parametrize("shape,dim", EMPTY)
@pytest.mark.parametrize("op", ["sum", "prod", "mean", "var", "std"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_reductions_with_identities_over_zero_size(op, shape, dim, keepdim):
    """sum 0, prod 1, mean / var / std nan over nothing; empty outputs where a kept axis is empty."""
    if op == "prod" and (isinstance(dim, tuple) or (dim is None and keepdim)):
        pytest.skip("torch's prod takes one dim")
    with np.errstate(all="ignore"):
        check(lambda m, x: getattr(x, op)() if dim is None and not keepdim else
              getattr(x, op)(dim if dim is not None else tuple(range(len(shape))), keepdim=keepdim),
              np.zeros(shape, np.float32))


@pytest.mark.parametrize("shape,dim", EMPTY)
@pytest.mark.parametrize("op", ["amax", "amin", "max", "min", "argmax", "argmin"])
def test_extrema_over_zero_size_raise_as_torch(op, shape, dim):
    """No identity: torch raises (IndexError naming the dim, RuntimeError / IndexError without one), unless the
    reduced axes are non-empty (then the result is empty)."""
    if op in ("max", "min", "argmax", "argmin") and isinstance(dim, tuple):
        dim = dim[0]

    def fn(m, x):
        r = getattr(x, op)() if dim is None else getattr(x, op)(dim)
        return r if isinstance(r, (tl.Tensor, torch.Tensor)) else r[0]
    a = np.zeros(shape, np.float32)
    reduced = range(len(shape)) if dim is None else [dim] if isinstance(dim, int) else dim
    if any(shape[d] == 0 for d in reduced):
        raises_as_torch(fn, a)
    else:
        check(fn, a, grad=False)


@pytest.mark.parametrize("shape,dim", [s for s in EMPTY if s[1] is not None])
def test_logsumexp_over_zero_size_is_minus_inf(shape, dim):
    check(lambda m, x: x.logsumexp(dim), np.zeros(shape, np.float32))


@pytest.mark.parametrize("shape,dim", EMPTY)
@pytest.mark.parametrize("op", ["all", "any"])
def test_all_any_of_nothing(op, shape, dim):
    """all of nothing is True, any of nothing False, as torch (bools, and numbers)."""
    for a in (np.zeros(shape, bool), np.zeros(shape, np.float32)):
        if isinstance(dim, tuple):
            fn = lambda m, x: getattr(x, op)(dim=dim)  # noqa: E731
        else:
            fn = lambda m, x: getattr(x, op)() if dim is None else getattr(x, op)(dim)  # noqa: E731
        check(fn, a, grad=False)
        if dim is not None and not isinstance(dim, tuple):
            check(lambda m, x: getattr(x, op)(dim, keepdim=True), a, grad=False)


@pytest.mark.parametrize("shape,dim", [((0, 3), 0), ((0, 3), 1), ((3, 0), 1), ((3, 0), 0)])
@pytest.mark.parametrize("op", ["cumsum", "cumprod", "logcumsumexp"])
def test_scans_over_zero_size(op, shape, dim):
    check(lambda m, x: getattr(x, op)(dim), np.zeros(shape, np.float32))


# ---- integer shifts --------------------------------------------------------------------------------------------

def test_shifts_at_and_past_the_width(each_runtime):
    """int64 x << n and x >> n for n at and past 64 (and negative n): torch's 0 / sign fill; int8 and uint8 wrap
    to their 8 bits (a Python int shift keeps the type)."""
    wide = each_runtime != "wgsl"  # WGSL stores int64 as i32: the 64-bit cases are the C and NumPy runtimes'
    x = np.array([1, -1, 5, -5, 2 ** 40 if wide else 2 ** 20, -(2 ** 20)], np.int64)
    for n in ([0, 1, 31, 32, 62, 63, 64, 65, 100, -1] if wide else [0, 1, 10]):
        nn = np.full_like(x, n)
        check(lambda m, a, b: a << b, x, nn)
        check(lambda m, a, b: a >> b, x, nn)
        check(lambda m, a, b: m.bitwise_left_shift(a, b), x, nn)
        check(lambda m, a, b: m.bitwise_right_shift(a, b), x, nn)
        check(lambda m, a: a >> n, x)
        check(lambda m, a: a << n, x)
    if not wide:
        return
    for dtype, vals in ((np.int8, [1, -1, 100, -128, 127]), (np.uint8, [1, 255, 100, 128, 0])):
        a = np.array(vals, dtype)
        for n in [0, 1, 7, 8, 9, 63, 64]:
            check(lambda m, t: t << n, a)
            check(lambda m, t: t >> n, a)
            check(lambda m, t, s: t << s, a, np.full_like(a, n))
            check(lambda m, t, s: t >> s, a, np.full_like(a, n))


# ---- pooling and padding ---------------------------------------------------------------------------------------

POOLS = [(2, 2, 0, 1), (3, 2, 1, 1), (2, 3, 1, 1), (3, 3, 1, 1), (4, 3, 2, 1), (3, 2, 1, 2), (2, 2, 1, 1)]


@pytest.mark.parametrize("k,s,p,dl", POOLS)
def test_max_pool_ceil_mode(k, s, p, dl):
    """ceil_mode rounds the output size up, dropping a last window that would start in the right padding, as
    torch; values, gradients and (2-d) indices."""
    rng = np.random.default_rng(k * 7 + s)
    a1 = rng.standard_normal((2, 3, 7)).astype(np.float32)
    a2 = rng.standard_normal((2, 3, 7, 6)).astype(np.float32)
    check(lambda m, x: (F if m is tl else TF).max_pool1d(x, k, s, p, dl, ceil_mode=True), a1)
    check(lambda m, x: (F if m is tl else TF).max_pool1d(x[0], k, s, p, dl, ceil_mode=True), a1)
    check(lambda m, x: (F if m is tl else TF).max_pool2d(x, k, s, p, dl, ceil_mode=True), a2)
    check(lambda m, x: (F if m is tl else TF).max_pool2d(x, k, s, p, dl, ceil_mode=True, return_indices=True)[1],
          a2, grad=False)
    check(lambda m, x: (F if m is tl else TF).max_pool1d(x, k, s, p, dl, ceil_mode=False), a1)


@pytest.mark.parametrize("pad", [(1, 2), (3, 0), (7, 7), (0, 0, 1, 2), (2, 1, 3, 2), (1, 1, 0, 6)])
def test_circular_padding_and_its_gradient(pad):
    """F.pad(mode="circular") wraps around, and its gradient adds each copy back onto the element it copies."""
    rng = np.random.default_rng(len(pad))
    a = rng.standard_normal((2, 3, 7) if len(pad) == 2 else (2, 3, 7, 6)).astype(np.float32)
    out = torch.nn.functional.pad(torch.tensor(a), pad, mode="circular").shape
    w = rng.standard_normal(tuple(out)).astype(np.float32)
    check(lambda m, x: (F if m is tl else TF).pad(x, pad, mode="circular"), a, w=w)


# ---- gradients at singular points ----------------------------------------------------------------------------

def test_acosh_gradient_near_one():
    """1/√(x²−1): inf at 1 exactly, large and finite just above, as torch."""
    a = np.array([1.0, 1.0000001, 1.001, 1.5, 3.0, 1e10], np.float32)
    check(lambda m, x: x.acosh(), a, rtol=1e-4)


def test_sign_has_a_zero_gradient():
    """sign's gradient is 0 everywhere (torch's), also through abs = x·sign(x) (whose gradient is sign(x))."""
    a = np.array([-2.0, 0.0, 3.0, -0.0, np.inf, -np.inf, np.nan], np.float32)
    check(lambda m, x: x.sign(), a)
    check(lambda m, x: x.sign() * x, a[:4])


def test_logcumsumexp_of_large_magnitudes():
    """A running log-add-exp: neither 1e30 nor -1e30 (nor ±1000) overflows or loses the smaller terms, as torch.
    Gradients on the rows of moderate magnitude: at ±1e30 torch's backward (e^x times a reverse running sum of
    e^-out) is off (it gives 1 to a -1e30 whose exact gradient is 0), where this scan's is the exact one."""
    a = np.array([[1000.0, 1001.0, -1000.0, 999.0, 0.0], [88.0, 89.0, 90.0, -88.0, 100.0]], np.float32)
    huge = np.array([[-1e30, 1e30, 0.0, 1.0, -1e30], [-1e30, -1e30, 5.0, -3.0, 2.0]], np.float32)
    check(lambda m, x: x.logcumsumexp(1), a, rtol=1e-4, atol=1e-5)
    check(lambda m, x: x.logcumsumexp(0), a, rtol=1e-4, atol=1e-5)
    check(lambda m, x: x.logcumsumexp(1), huge, rtol=1e-5, grad=False)
    check(lambda m, x: x.logcumsumexp(0), np.concatenate([a, huge]), rtol=1e-5, grad=False)
    check(lambda m, x: x.logcumsumexp(1), np.array([[-np.inf, -np.inf, 1.0, -np.inf]], np.float32), grad=False)


def test_normalize_of_a_zero_vector():
    """x / max(‖x‖, eps): a zero row stays zeros, its gradient dy / eps (finite), as torch."""
    a = np.zeros((3, 4), np.float32)
    a[1] = [1.0, 2.0, 0.0, -2.0]
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    check(lambda m, x: (F if m is tl else TF).normalize(x, dim=1), a, w=w)
    check(lambda m, x: (F if m is tl else TF).normalize(x, p=1.0, dim=1), a, w=w)
    check(lambda m, x: (F if m is tl else TF).normalize(x, dim=0), a, w=w)
    assert math.isfinite(float(np.abs(tl.tensor(a).numpy()).sum()))
