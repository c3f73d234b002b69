"""16-bit semantics that fusion must not change (issue 43, point 4). Rounding to an op's declared dtype is part of its
meaning: a fused kernel rounds every float16 / bfloat16 intermediate to its dtype, as the unfused graph does (and
torch, which computes a 16-bit elementwise op in float32 and rounds once per op), so overflow to inf, underflow to 0,
subnormals and sub-ulp cancellations come out the same bit for bit.

Random chains of elementwise ops on float16 and bfloat16, on values across the whole range of the dtype (large ones
whose exp or product overflows, tiny ones, subnormals, zeros, infinities, NaN), realized fused on the C runtime,
compared bit for bit (as uint16; all NaNs equal) with:
  the same chain unfused on the C runtime (each op realized alone)   exact
  the NumPy runtime                                                  exact (C's expf / tanhf and NumPy's round to the
                                                                     same 16-bit value on every 16-bit input: checked
                                                                     exhaustively below)
  torch                                                              exact for the correctly rounded ops (+, −, ·,
                                                                     sqrt, reciprocal, neg, abs, max); with exp, tanh or
                                                                     sigmoid, torch's own float32 kernels (and its
                                                                     sigmoid as one op, where tinyllm's rounds exp's
                                                                     result first) differ by an ulp on some inputs, which
                                                                     a chain can amplify: those are checked one op at a
                                                                     time on every 16-bit value, within 1 ulp (sigmoid 2);
                                                                     x / y (x·(1/y) in float32, rounded once) is torch's
                                                                     but for some subnormal quotients: compared on a
                                                                     grid by test_division_rounds_once_as_torch
On the WGSL runtime (float16 only: WGSL has no bfloat16) the shader computes in f16; its exp and tanh are the
adapter's, not correctly rounded, so chains of the correctly rounded ops are compared bit for bit and exp's overflow
to inf is checked.
"""
import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

import tinyllm as tl
from conftest import RUNTIMES

pytestmark = pytest.mark.usefixtures("one_torch_thread")
LOW = {"float16": (tl.float16, torch.float16), "bfloat16": (tl.bfloat16, torch.bfloat16)}

# name -> (f(lib, x, y), correctly rounded: torch's float32 result rounds to the same 16-bit value)
OPS = {
    "add": (lambda m, x, y: x + y, True),
    "sub": (lambda m, x, y: x - y, True),
    "mul": (lambda m, x, y: x * y, True),
    # x / y is x · (1/y) in float32, rounded once: torch's float32 x / y rounded, except a quotient within a float32
    # ulp of a midpoint between two 16-bit subnormals (1495 pairs of 10⁹ in float16), which may round the other way
    "div": (lambda m, x, y: x / y, False),
    "neg": (lambda m, x, y: -x, True),
    "abs": (lambda m, x, y: x.abs(), True),
    "maximum": (lambda m, x, y: m.maximum(x, y), True),
    "sqrt_abs": (lambda m, x, y: x.abs().sqrt(), True),
    "reciprocal": (lambda m, x, y: x.reciprocal(), True),
    "square": (lambda m, x, y: x * x, True),
    "exp": (lambda m, x, y: x.exp(), False),
    "tanh": (lambda m, x, y: x.tanh(), False),
    "sigmoid": (lambda m, x, y: x.sigmoid(), False),
}
EXACT = [name for name, (_, exact) in OPS.items() if exact]


def draw_values(rng, n, dtype):
    """n float32 values of `dtype` (rounded to it) from every part of its range: normal-sized ones, magnitudes
    log-uniform from the smallest subnormal to the largest finite value, exp's overflow edge, zeros, infinities, NaN."""
    fi = np.finfo(np.float16) if dtype == "float16" else None
    lo, hi = (np.log2(float(fi.smallest_subnormal)), np.log2(float(fi.max))) if fi else (-133.0, 127.9)
    kind = rng.integers(0, 6, n)
    x = np.where(kind == 0, rng.standard_normal(n) * 3, 0.0)
    x = np.where(kind == 1, np.exp2(rng.uniform(lo, hi, n)), x)
    x = np.where(kind == 2, np.exp2(rng.uniform(lo, lo + 12, n)), x)  # subnormals and the smallest normals
    x = np.where(kind == 3, rng.uniform(8, 12 if fi else 90, n), x)  # exp of these overflows near the top
    x = np.where(kind == 4, rng.choice([0.0, np.inf, np.nan, 1.0, 2.0 ** -12, 2.0 ** -9], n), x)
    x = np.where(kind == 5, rng.uniform(-4, 4, n), x)
    x = x * rng.choice([-1.0, 1.0], n)
    return tl.tensor(x.astype(np.float32), dtype=LOW[dtype][0]).float().numpy()  # rounded to the dtype


def bits(t):
    """A 16-bit result's storage as uint16, every NaN one pattern."""
    if isinstance(t, torch.Tensor):
        v = t.detach().float().numpy()
    else:
        v = t.float().numpy()
    b = (v.view(np.uint32) >> 16).astype(np.uint16) if t.dtype in (tl.bfloat16, torch.bfloat16) else \
        v.astype(np.float16).view(np.uint16)
    return np.where(np.isnan(v), np.uint16(0x7E00), b)


def run_chain(lib, x, y, chain, each=False):
    """The chain's value; each=True realizes every op alone (the unfused graph)."""
    for name in chain:
        x = OPS[name][0](lib, x, y)
        if each:
            x.realize()
    return x


def assert_bits(got, want, what, values):
    g, w = bits(got), bits(want)
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, (f"{what}: {bad.size} values differ, e.g. at inputs {values[0][bad[:3]]}, "
                           f"{values[1][bad[:3]]}: {g[bad[:3]]} vs {w[bad[:3]]} (uint16)")


chains = st.lists(st.sampled_from(sorted(OPS)), min_size=1, max_size=6)


@pytest.mark.skipif("c" not in RUNTIMES, reason="no C runtime")
@given(low=st.sampled_from(sorted(LOW)), chain=chains, seed=st.integers(0, 2 ** 31))
def test_fused_chain_rounds_each_op_as_unfused_and_torch(low, chain, seed):
    rng = np.random.default_rng(seed)
    x, y = draw_values(rng, 96, low), draw_values(rng, 96, low)
    dtype, tdtype = LOW[low]
    fused = run_chain(tl, tl.tensor(x, device="c", dtype=dtype), tl.tensor(y, device="c", dtype=dtype), chain)
    unfused = run_chain(tl, tl.tensor(x, device="c", dtype=dtype), tl.tensor(y, device="c", dtype=dtype), chain,
                        each=True)
    ref = run_chain(tl, tl.tensor(x, device="numpy", dtype=dtype), tl.tensor(y, device="numpy", dtype=dtype), chain)
    what = f"{' → '.join(chain)} in {low}"
    assert_bits(fused, unfused, f"{what}: C fused vs C unfused", (x, y))
    assert_bits(fused, ref, f"{what}: C fused vs the NumPy runtime", (x, y))
    if all(OPS[name][1] for name in chain):
        want = run_chain(torch, torch.tensor(x).to(tdtype), torch.tensor(y).to(tdtype), chain)
        assert_bits(fused, want, f"{what}: C fused vs torch", (x, y))


@pytest.mark.skipif("c" not in RUNTIMES, reason="no C runtime")
@pytest.mark.parametrize("low", sorted(LOW))
@pytest.mark.parametrize("name", ["exp", "tanh", "sigmoid"])
def test_transcendentals_on_every_16_bit_value(low, name):
    """Each of exp, tanh and sigmoid, fused behind a multiply by 1 (so it is an intermediate), on every value of the
    dtype: the NumPy runtime's bit for bit, torch's within 1 ulp (inf and NaN where torch has them); sigmoid within 2
    (tinyllm's sigmoid is 1 / (1 + exp(−x)), each op rounding to the dtype; torch's is one op, rounded once)."""
    dtype, tdtype = LOW[low]
    every = np.arange(1 << 16, dtype=np.uint32)
    x = (every << 16).view(np.float32) if low == "bfloat16" else every.astype(np.uint16).view(np.float16).astype(
        np.float32)
    f = OPS[name][0]
    got = f(tl, tl.tensor(x, device="c", dtype=dtype) * 1.0, None) * 1.0
    want = f(tl, tl.tensor(x, device="numpy", dtype=dtype), None)
    assert_bits(got, want, f"{name} in {low}: C vs the NumPy runtime", (x, x))
    t = f(torch, torch.tensor(x).to(tdtype), None)
    g, w = bits(got).astype(np.int32), bits(t).astype(np.int32)
    tv = t.float().numpy()
    assert np.array_equal(np.isnan(got.float().numpy()), np.isnan(tv)), f"{name} in {low}: NaNs differ from torch's"
    assert np.array_equal(np.isinf(got.float().numpy()), np.isinf(tv)), f"{name} in {low}: infs differ from torch's"
    finite = ~np.isnan(tv)
    if name == "sigmoid":  # below −88.7 torch's exp(−x) overflows float32 and its sigmoid is 0; tinyllm's subnormal
        finite &= x > -88.5
    within = 2 if name == "sigmoid" else 1
    assert np.abs(g - w)[finite].max() <= within, f"{name} in {low}: more than {within} ulp from torch"


@pytest.mark.parametrize("device", [r for r in RUNTIMES if r != "wgsl"])
@pytest.mark.parametrize("low", sorted(LOW))
def test_overflow_underflow_and_cancellation_inside_a_kernel(device, low):
    """The cases that fail when a kernel rounds once, at its store: exp overflowing the dtype to inf inside a fused
    isinf(...).any(), a product underflowing to 0 (or to a subnormal) before it is divided back, and a sum below the
    dtype's ulp that cancels."""
    dtype, tdtype = LOW[low]
    big = [11.0, 12.0, -20.0] if low == "float16" else [88.0, 88.5, -100.0]  # exp(88.5) < float32's max
    ulp_half = 2.0 ** -12 if low == "float16" else 2.0 ** -9
    tiny = 2.0 ** -20 if low == "float16" else 2.0 ** -120
    cases = {
        "isinf(exp(x)).any()": (lambda m, x: m.isinf(m.exp(x)).any(), big),
        "exp(x) * 0.5": (lambda m, x: m.exp(x) * 0.5, big),
        "(x * x) * 2¹⁰": (lambda m, x: (x * x) * 1024.0, [tiny, 3 * tiny, 2.0 ** 9]),
        "(x + ulp/2) - x": (lambda m, x: (x + ulp_half) - x, [1.0, -1.0, 2.0]),
        "(x * 2¹²) * 2⁻¹²": (lambda m, x: (x * 4096.0) * 2.0 ** -12, [20.0, 1e35 if low == "bfloat16" else 7.0, 1e-3]),
    }
    for what, (f, v) in cases.items():
        want = f(torch, torch.tensor(v).to(tdtype))
        got = f(tl, tl.tensor(v, device=device, dtype=dtype))
        if want.dtype is torch.bool:
            assert got.item() == want.item(), f"{what} in {low} on {device}: {got.item()}, torch {want.item()}"
        else:
            assert_bits(got, want, f"{what} in {low} on {device}", (np.float32(v), np.float32(v)))


@pytest.mark.wgsl
@pytest.mark.skipif("wgsl" not in RUNTIMES, reason="no WGSL runtime")
@given(chain=st.lists(st.sampled_from(sorted(set(EXACT) - {"sqrt_abs", "reciprocal", "abs"})), min_size=1,
                      max_size=5), seed=st.integers(0, 2 ** 31))
def test_wgsl_fused_float16_chain_rounds_each_op(chain, seed):
    """WGSL computes float16 in f16 (each op rounds there): +, −, ·, neg, max chains bit for bit the NumPy
    runtime's, and exp overflows to inf inside a kernel. (Not abs: WGSL leaves the sign of a zero to the
    implementation, and this adapter folds abs's −0.0 + 0.0 to −0.0.)"""
    from tinyllm.runtime import get
    if not get("wgsl").has_f16:
        pytest.skip("WGSL adapter without shader-f16")
    rng = np.random.default_rng(seed)
    x, y = draw_values(rng, 96, "float16"), draw_values(rng, 96, "float16")
    got = run_chain(tl, tl.tensor(x, device="wgsl", dtype=tl.float16), tl.tensor(y, device="wgsl", dtype=tl.float16),
                    chain)
    want = run_chain(tl, tl.tensor(x, device="numpy", dtype=tl.float16),
                     tl.tensor(y, device="numpy", dtype=tl.float16), chain)
    assert_bits(got, want, f"{' → '.join(chain)} in float16: WGSL vs the NumPy runtime", (x, y))
    t = tl.tensor([11.0, 12.0], device="wgsl", dtype=tl.float16)
    assert tl.isinf(tl.exp(t) * 0.5).any().item()


@pytest.mark.parametrize("device", [r for r in RUNTIMES if r != "wgsl"])
@pytest.mark.parametrize("low", sorted(LOW))
def test_division_rounds_once_as_torch(device, low):
    """x / y in 16 bits is computed in float32 and rounded once, as torch: 1e-3 / 1e-5 is 100 in float16 (where
    1/y alone overflows to inf), subnormal divisors, zeros, infinities and NaN included, over every pair of a grid,
    bit for bit torch's; fused (one kernel: CAST, RECIP, MUL, CAST) as the same steps realized one by one."""
    dtype, tdtype = LOW[low]
    grid = [0.0, -0.0, 1e-5, -1e-5, 1e-3, 2.0 ** -24, 3 * 2.0 ** -24, 2.0 ** -15, 6e-5, 1e-4, 0.1, 1 / 3, 1.0, -3.0,
            7.0, 14.0, 1000.0, 65504.0, -65504.0, np.inf, -np.inf, np.nan]
    if low == "bfloat16":
        grid += [1e-38, 3e38, 1e-30]
    v = tl.tensor(np.array(grid, np.float32), dtype=dtype).float().numpy()  # rounded to the dtype
    x, y = np.repeat(v, v.size), np.tile(v, v.size)
    want = torch.tensor(x).to(tdtype) / torch.tensor(y).to(tdtype)
    a, b = tl.tensor(x, device=device, dtype=dtype), tl.tensor(y, device=device, dtype=dtype)
    got = a / b
    assert got.dtype is dtype
    steps = [a.float().realize(), b.float().realize()]
    steps.append(steps[1].reciprocal().realize())
    unfused = (steps[0] * steps[2]).realize().to(dtype)
    assert_bits(got, unfused, f"x / y in {low} on {device}: fused vs unfused", (x, y))
    assert_bits(got, want, f"x / y in {low} on {device} vs torch", (x, y))
    assert_bits(2.0 / b, 2.0 / torch.tensor(y).to(tdtype), f"2 / y in {low} on {device} vs torch", (y, y))
    if low == "float16":
        assert (tl.tensor([1e-3], device=device, dtype=dtype) / tl.tensor([1e-5], device=device, dtype=dtype)).item() \
            == (torch.tensor([1e-3]).half() / torch.tensor([1e-5]).half()).item() == 99.875
