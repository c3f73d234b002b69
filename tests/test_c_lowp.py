"""float16 and bfloat16 in the C runtime's generated kernels (tinyllm/runtime/c/render.py, c_math.h), in their NumPy
execution (ops/kernel.py's run_kernel, where no compiler exists), and in FlashAttention and embeddings on the C
runtime, against torch with the same dtypes and against the NumPy runtime.

A fused C kernel widens 16-bit loads to float32, computes each op in float32 and rounds its result to the op's 16-bit
dtype, as torch and the NumPy runtime round after every op (tests/test_fusion_16bit.py: bit for bit the unfused
graph's). So a fused chain carries torch's rounding errors: where an intermediate rounded to 16 bits later cancels
(GELU's and tanh's derivatives: 1 − a² with a near 1) the error reaches several ulps, in torch as here.
Errors are measured in ulps of the dtype (eps: 2⁻⁷ for bfloat16, 2⁻¹⁰ for float16) of each expected value, floored
at an eighth of the largest one (values near zero left by cancellation, x − mean or a sum of signed terms, carry
the error of the large terms); "truth" is the same function in float64 on the same 16-bit inputs:
  conversions and casts    exact (bit for bit; NaN stays NaN)
  reductions               1 ulp of torch's and the NumPy runtime's (float32 sums in another order, each
                           rounded once)
  chains, softmax,         values within 2 ulps (layer_norm, computed in float32 and rounded once: 1) of the truth
  log_softmax, layer_norm  beyond the larger of torch's and the NumPy runtime's own errors, gradients within 6 (the
                           backward takes several kernels and reads 16-bit values the forward stored, where
                           cancellation follows); and as many ulps of torch's and the NumPy runtime's results
                           beyond the larger of their own errors, element by element (where one rounds its way far
                           from the truth, an intermediate that cancels, the C kernel may round as that one does)
  attention                1 ulp of the NumPy runtime's (both round the float32 result once); against torch in
                           float32 on the same 16-bit values 2 ulps, gradients 6 (FLASH_ATTN packs its
                           log-sum-exp into the 16-bit output, which the backward reads); bfloat16 on
                           vdpbf16ps, which rounds P and dS as torch's bfloat16 attention does: gradients 8 of
                           the NumPy runtime's, and 2 / 6 of torch's bfloat16 attention too
  embedding gradients      the NumPy runtime's exactly; 2 ulps of torch's (which rounds after each add)
"""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import tinyllm as tl
import tinyllm.nn.functional as F
from tinyllm.runtime.c import compiler
from tinyllm.runtime import get

pytestmark = pytest.mark.usefixtures("one_torch_thread")
LOW = {"bfloat16": (tl.bfloat16, torch.bfloat16), "float16": (tl.float16, torch.float16)}


def _compiles():
    return get("c").lib is not None and compiler.available()


def values(t):
    """A tensor's values as float32 (a 16-bit float widened exactly) or as they are."""
    if isinstance(t, np.ndarray):
        return t
    if isinstance(t, torch.Tensor):
        t = t.detach()
        return (t.float() if t.dtype in (torch.bfloat16, torch.float16) else t).numpy()
    v = t.numpy()
    return v.astype(np.float32) if v.dtype == np.float16 else v


def ulps(got, want, dtype, scale=None):
    """|got − want| element by element in ulps of `dtype` at `scale` (want's magnitude, floored at an eighth of its
    largest)."""
    got, want = values(got).astype(np.float64), values(want).astype(np.float64)
    assert got.shape == want.shape, f"shape {got.shape}, expected {want.shape}"
    if scale is None:
        scale = np.maximum(np.abs(want), max(np.max(np.abs(want), initial=0.0) / 8, tl.finfo(dtype).tiny))
    return np.abs(got - want) / (tl.finfo(dtype).eps * scale)


def close(got, want, dtype, within, what):
    assert np.array_equal(np.isnan(values(got)), np.isnan(values(want))), f"{what}: NaNs differ"
    err = np.nan_to_num(ulps(got, want, dtype))
    assert err.max(initial=0.0) <= within, f"{what}: {err.max():.2f} ulps of {dtype.name} (allowed {within})"


def as_exact(got, truth, others, dtype, what, within):
    """`got` within `within` ulps of the float64 `truth` beyond the largest error of `others` ({name: result that
    rounds after every op}), and each of them within `within` ulps beyond the others' own errors, element by
    element: where one of them rounds its way far from the truth (an intermediate that cancels) and `got` rounds
    as that one does, `got` may be as far from the others."""
    t = values(truth).astype(np.float64)
    scale = np.maximum(np.abs(t), max(np.max(np.abs(t), initial=0.0) / 8, tl.finfo(dtype).tiny))
    err = ulps(got, t, dtype, scale)
    owns = {name: np.nan_to_num(ulps(o, t, dtype, scale)) for name, o in others.items()}
    own = max((e.max(initial=0.0) for e in owns.values()), default=0.0)
    assert err.max(initial=0.0) <= within + own, \
        f"{what}: {err.max():.2f} ulps of {dtype.name} from float64 (the others' own: {own:.2f})"
    largest = np.maximum.reduce(list(owns.values()))
    for name, other in others.items():
        excess = ulps(got, other, dtype, scale) - largest
        assert excess.max(initial=0.0) <= within, \
            f"{what}: {excess.max():.2f} ulps of {dtype.name} from {name} beyond the others' own errors"


def bits(t, dtype):
    """The storage of a 16-bit tensor (tinyllm or torch) as uint16."""
    if isinstance(t, torch.Tensor):
        return t.detach().view(torch.int16).numpy().view(np.uint16)
    v = t.numpy()
    return v.view(np.uint16) if dtype is tl.float16 else (v.view(np.uint32) >> 16).astype(np.uint16)


# ---- conversions ---------------------------------------------------------------------------------------------

def _rounding_cases(dtype):
    """float32 values on and around every rounding boundary of `dtype`: each of its values, each midpoint between
    neighbours (a tie) and the floats just either side of it, NaNs, infinities, overflow and subnormals."""
    if dtype is tl.bfloat16:
        top = np.arange(1 << 16, dtype=np.uint32) << 16
        cases = np.concatenate([top, top | 0x8000, (top | 0x8000) + 1, (top | 0x8000) - 1, top | 0x7FFF])
        return cases.view(np.float32)
    grid = np.arange(1 << 15, dtype=np.uint16).view(np.float16).astype(np.float64)  # the non-negative halves
    grid = np.sort(grid[np.isfinite(grid)])
    grid = np.append(grid, 65536.0)  # the next step above the largest half: 65520 ties to inf
    mids = ((grid[1:] + grid[:-1]) / 2).astype(np.float32)  # exact in float32
    up, down = np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(0))
    cases = np.concatenate([grid.astype(np.float32), mids, up, down,
                            np.float32([np.inf, np.nan, 1e6, 3.4e38, 1e-30, 2.0 ** -25, 2.0 ** -24 * 1.5])])
    return np.concatenate([cases, -cases])


@pytest.mark.parametrize("low", LOW)
def test_stores_round_to_nearest_even_as_torch(cpu_path, low):
    """float32 -> 16-bit in a kernel (the store) gives torch's bits on every boundary case (NaN: a NaN)."""
    dtype, tdtype = LOW[low]
    x = _rounding_cases(dtype)
    got = tl.tensor(x, device="c").to(dtype)
    want = torch.from_numpy(x).to(tdtype)
    nan = np.isnan(values(want))
    assert np.array_equal(np.isnan(values(got)), nan), f"{low} on {cpu_path}: NaNs"
    mismatch = np.flatnonzero((bits(got, dtype) != bits(want, dtype)) & ~nan)
    assert not mismatch.size, f"{low} on {cpu_path}: {x[mismatch[:5]]} -> {bits(got, dtype)[mismatch[:5]]}, " \
                              f"torch {bits(want, dtype)[mismatch[:5]]}"


@pytest.mark.parametrize("low", LOW)
def test_a_stored_value_is_rounded_once(monkeypatch, low):
    """A 16-bit value that a kernel only stores is not rounded before its store too (render._unrounded_stores):
    the store's own rounding gives the same bits, which test_stores_round_to_nearest_even_as_torch checks on every
    boundary case through such a kernel."""
    dtype = LOW[low][0]
    sources = []
    real = compiler.load
    monkeypatch.setattr(compiler, "load", lambda s, *cpu: sources.extend(s.values()) or real(s, *cpu))
    x = np.random.default_rng(0).standard_normal(40000).astype(np.float32)
    y = (tl.tensor(x, device="c") * 2.71875).to(dtype)
    y.realize()  # a kernel with a 16-bit output: the product rounded, then stored
    np.testing.assert_array_equal(y.float().numpy(), (tl.tensor(x) * 2.71875).to(dtype).float().numpy())
    short = {"bfloat16": "bf16", "float16": "f16"}[low]  # c_math.h's names
    stores = [src for src in sources if f"tl_{short}_store(" in src]
    assert stores and not any(f"tl_{short}_round(" in src for src in stores), stores


@pytest.mark.parametrize("low", LOW)
def test_loads_widen_every_value_exactly(cpu_path, low):
    """Every 16-bit pattern widened to float32 in a kernel (the load) is torch's float32, bit for bit."""
    dtype, tdtype = LOW[low]
    pattern = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    want = torch.from_numpy(pattern.view(np.int16)).view(tdtype).float().numpy()
    stored = pattern.view(np.float16) if dtype is tl.float16 else want  # tl.tensor stores these as the same bits
    got = tl.tensor(stored, dtype=dtype, device="c").float().numpy()
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32)), f"{low} on {cpu_path}"


def test_casts_in_a_kernel_are_torchs():
    """Casts between float32, the 16-bit floats, int64, int8, uint8 and bool inside fused kernels, and int8 and
    uint8 arithmetic (wrapping as torch's): exact, values and gradients through the casts."""
    if not _compiles():
        pytest.skip("no C compiler")
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 37)) * 40).astype(np.float32)  # |x| < 100: in int8's range, where C converts
    i8 = rng.integers(-128, 128, (3, 37)).astype(np.int8)
    u8 = rng.integers(0, 256, (3, 37)).astype(np.uint8)

    def run(lib, x, i8, u8):
        low = lib.bfloat16 if lib is tl else torch.bfloat16
        half = lib.float16 if lib is tl else torch.float16
        a = x.to(low)
        return [
            (a.float() * 3).to(half),  # float32 -> bfloat16 (rounds) -> float32 -> float16
            a.to(half).to(low),  # float16 -> bfloat16: widened exactly, then rounded
            a.long(), a.to(lib.int8), a.bool(), (a > 2).to(half), (a.long() + 1).to(low),
            i8.to(low) * 0.5, u8.to(half) + 1, (i8 * i8).to(low), (u8 * u8).to(lib.float32), (i8 * i8 - i8).to(half),
        ]

    tx = torch.from_numpy(x).requires_grad_()
    want = run(torch, tx, torch.from_numpy(i8), torch.from_numpy(u8))
    (want[0].float() * 2 + want[1].float()).sum().backward()
    for device in ("c", "numpy"):
        X = tl.tensor(x, device=device, requires_grad=True)
        got = run(tl, X, tl.tensor(i8, device=device), tl.tensor(u8, device=device))
        for j, (g, w) in enumerate(zip(got, want)):
            assert g.dtype.name == str(w.dtype).removeprefix("torch."), f"case {j} on {device}: {g.dtype}"
            np.testing.assert_array_equal(values(g), values(w), err_msg=f"case {j} on {device}")
        (got[0].float() * 2 + got[1].float()).sum().backward()
        np.testing.assert_array_equal(X.grad.numpy(), tx.grad.numpy(), err_msg=f"gradient on {device}")


# ---- kernels against torch and the NumPy runtime ------------------------------------------------------------

def chain(x, y, z, where):
    """Binary, unary and ternary ops and GELU's exact form, fused into one kernel on the C runtime."""
    a = (x * y + 0.5).tanh()
    b = where(x < y, a, (z * 0.5).exp())
    return 0.5 * b * (1 + (b * 0.7071067811865476).erf())


def _chain_everywhere(low, shape, seed):
    """chain's value and gradients (x a float32 leaf cast to `low`, y and z 16-bit leaves) on the C and NumPy
    runtimes and in torch."""
    dtype, tdtype = LOW[low]
    rng = np.random.default_rng(seed)
    x, y, z = (rng.uniform(-2, 2, shape).astype(np.float32) for _ in range(3))
    w = rng.standard_normal(shape).astype(np.float32)
    tx = torch.from_numpy(x).requires_grad_()
    ty, tz = (torch.from_numpy(v).to(tdtype).requires_grad_() for v in (y, z))
    out = chain(tx.to(tdtype), ty, tz, torch.where)
    (out.float() * torch.from_numpy(w)).sum().backward()
    results = {"torch": [out, tx.grad, ty.grad, tz.grad]}
    exact = [torch.from_numpy(v).to(tdtype).double().requires_grad_() for v in (x, y, z)]
    out = chain(*exact, torch.where)
    (out * torch.from_numpy(w).double()).sum().backward()
    results["truth"] = [out] + [v.grad for v in exact]
    for device in ("c", "numpy"):
        X = tl.tensor(x, device=device, requires_grad=True)
        Y, Z = (tl.tensor(v, device=device, dtype=dtype, requires_grad=True) for v in (y, z))
        out = chain(X.to(dtype), Y, Z, tl.where)
        (out.float() * tl.tensor(w, device=device)).sum().backward()
        assert out.dtype is dtype and Y.grad.dtype is dtype and X.grad.dtype is tl.float32
        results[device] = [out, X.grad, Y.grad, Z.grad]
    return results


@settings(max_examples=6)
@given(low=st.sampled_from(list(LOW)), shape=st.sampled_from([(3, 8), (2, 3, 17)]), seed=st.integers(0, 2 ** 16))
def test_fused_chains_match_torch_and_the_numpy_runtime(low, shape, seed):
    if not _compiles():
        pytest.skip("no C compiler")
    results, dtype = _chain_everywhere(low, shape, seed), LOW[low][0]
    for i, name in enumerate(["value", "dx", "dy", "dz"]):
        as_exact(results["c"][i], results["truth"][i], {r: results[r][i] for r in ("torch", "numpy")}, dtype,
                 f"{low} {name}", within=2 if i == 0 else 6)


@pytest.mark.parametrize("low", LOW)
def test_fused_chains_on_each_cpu_path(cpu_path, low):
    """The chain's kernel (loads, float32 math, the store) on each path: ragged for 16 and 8 lanes, and on threads."""
    dtype, tdtype = LOW[low]
    x, y, z = (np.random.default_rng(i).uniform(-2, 2, (67, 515)).astype(np.float32) for i in range(3))
    got = chain(*(tl.tensor(v, device="c", dtype=dtype) for v in (x, y, z)), tl.where)
    want = chain(*(torch.from_numpy(v).to(tdtype) for v in (x, y, z)), torch.where)
    truth = chain(*(torch.from_numpy(v).to(tdtype).double() for v in (x, y, z)), torch.where)
    as_exact(got, truth, {"torch": want}, dtype, f"{low} on {cpu_path}", within=2)


REDUCTIONS = {  # (shape, what): each of the C renderer's reduction loops, over enough terms that a 16-bit
    # accumulator would lose several ulps
    "row sum": ((3, 2000), lambda x: x.sum(-1)),  # the reduced axis innermost: one accumulator per output
    "sliced column sum": ((2048, 20), lambda x: x.sum(0)),  # the outermost axis, in slices on the threads
    "column sum": ((1000, 3, 7), lambda x: x.sum(0)),  # accumulated in a float32 scratch array
    "axes sum": ((40, 5, 30), lambda x: x.sum((0, 2))),
    "mean": ((300, 4), lambda x: x.mean(0)),
    "row max": ((5, 300), lambda x: x.amax(-1)),
    "column max": ((3, 5, 7), lambda x: x.amax(0)),
    "total": ((9, 241), lambda x: x.sum()),
}


@pytest.mark.parametrize("low", LOW)
@pytest.mark.parametrize("case", REDUCTIONS)
def test_reductions_accumulate_in_float32(low, case):
    """Sums of 16-bit floats add in float32 and round once, as torch's: within an ulp of torch's (a 16-bit
    accumulator would be many ulps off over these lengths), and of the NumPy runtime's."""
    if not _compiles():
        pytest.skip("no C compiler")
    dtype, tdtype = LOW[low]
    shape, fn = REDUCTIONS[case]
    x = np.random.default_rng(len(case)).uniform(0.5, 2, shape).astype(np.float32)
    got = fn(tl.tensor(x, device="c", dtype=dtype))
    assert got.dtype is dtype
    close(got, fn(torch.from_numpy(x).to(tdtype)), dtype, 1, f"{case} in {low}: c vs torch")
    close(got, fn(tl.tensor(x, device="numpy", dtype=dtype)), dtype, 1, f"{case} in {low}: c vs numpy")


@pytest.mark.parametrize("low", LOW)
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "layer_norm"])
def test_row_composites(low, op):
    """softmax, log_softmax and layer_norm (weight and bias 16-bit too) over rows, values and gradients."""
    if not _compiles():
        pytest.skip("no C compiler")
    dtype, tdtype = LOW[low]
    rng = np.random.default_rng(2)
    x, g, b = rng.standard_normal((6, 45)).astype(np.float32) * 2, rng.uniform(0.5, 1.5, 45), rng.standard_normal(45)
    w = rng.standard_normal((6, 45)).astype(np.float32)
    fns = {"softmax": lambda F, x, g, b: F.softmax(x, -1), "log_softmax": lambda F, x, g, b: F.log_softmax(x, -1),
           "layer_norm": lambda F, x, g, b: F.layer_norm(x, (45,), g, b)}
    results = {}
    for name, make, wide in [("torch", lambda v: torch.from_numpy(v).to(tdtype), torch.float32),
                             ("truth", lambda v: torch.from_numpy(v).to(tdtype).double(), torch.float64)]:
        leaves = [make(v.astype(np.float32)).requires_grad_() for v in (x, g, b)]
        out = fns[op](torch.nn.functional, *leaves)
        (out.to(wide) * torch.from_numpy(w).to(wide)).sum().backward()
        results[name] = [out] + [v.grad for v in leaves]
    for device in ("c", "numpy"):
        ours = [tl.tensor(v.astype(np.float32), device=device, dtype=dtype, requires_grad=True) for v in (x, g, b)]
        got = fns[op](F, *ours)
        (got.float() * tl.tensor(w, device=device)).sum().backward()
        results[device] = [got] + [v.grad if v.grad is not None else None for v in ours]
    for i, name in enumerate(["value", "dx", "dweight", "dbias"]):
        if results["truth"][i] is not None:
            # layer_norm computes in float32 and rounds once at the end, as torch's
            within = (1 if op == "layer_norm" else 2) if i == 0 else 6
            as_exact(results["c"][i], results["truth"][i], {r: results[r][i] for r in ("torch", "numpy")}, dtype,
                     f"{op} {name} in {low}", within=within)
            if i == 0:
                close(results["c"][i], results["numpy"][i], dtype, 0, f"{op} in {low}: c vs numpy")


def test_numpy_execution_of_kernels_rounds_as_c(monkeypatch):
    """Without a compiler the C runtime runs each FUSED kernel through run_kernel: the same float32 arithmetic,
    rounded once at the store, so bit for bit the compiled kernel's (for ops that are exact in both: +, ·, max,
    comparisons, casts)."""
    if not _compiles():
        pytest.skip("no C compiler")
    rng = np.random.default_rng(9)
    x, y = (rng.standard_normal(300).astype(np.float32) * 3 for _ in range(2))

    def fn(x, y, low):
        a, b = x.to(low), y.to(low)
        c = tl.where(a < b, a * b + 0.3, a.maximum(b * -1.5))
        return [c, (c.float() * 0.1).to(low), c.to(tl.float16) * 0.7, c.amax(-1)]

    for low in (tl.bfloat16, tl.float16):
        compiled = [(t.dtype, values(t)) for t in fn(tl.tensor(x, device="c"), tl.tensor(y, device="c"), low)]
        monkeypatch.setattr(get("c"), "compiles", False)
        # (1, n): a graph of its own, so no schedule compiled above is reused
        interpreted = [(t.dtype, values(t)) for t in fn(tl.tensor(x[None], device="c"), tl.tensor(y[None], device="c"),
                                                       low)]
        monkeypatch.setattr(get("c"), "compiles", True)
        for j, ((cd, c), (i_d, i)) in enumerate(zip(compiled, interpreted)):
            assert i_d is cd
            np.testing.assert_array_equal(i.reshape(-1), c.reshape(-1), err_msg=f"output {j} in {low.name}")


# ---- attention and embeddings --------------------------------------------------------------------------------

@pytest.mark.parametrize("low", LOW)
def test_flash_attention_in_16_bits(low, monkeypatch):
    """FLASH_ATTN and its backward with 16-bit q, k, v run runtime_c/attention.c's 16-bit kernels (float32
    arithmetic on each tile widened as it is read) and round each result once: as the NumPy runtime, and as torch
    in float32 on the same 16-bit values."""
    if not _compiles():
        pytest.skip("no C compiler")
    dtype, tdtype = LOW[low]
    rt = get("c")
    monkeypatch.setattr(rt, "replays", False)  # a recording made by an earlier test would run without rt.call
    called, real = [], type(rt).call
    monkeypatch.setattr(type(rt), "call", lambda self, fn, *a: called.append(getattr(fn, "__name__", "")) or
                        real(self, fn, *a))
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 2, 37, 16)).astype(np.float32) for _ in range(3))
    w = rng.standard_normal((2, 2, 37, 16)).astype(np.float32)
    tq, tk, tv = (torch.from_numpy(a).to(tdtype).float().requires_grad_() for a in (q, k, v))
    want = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
    (want.to(tdtype).float() * torch.from_numpy(w)).sum().backward()
    results = {}
    for device in ("c", "numpy"):
        xs = [tl.tensor(a, device=device, dtype=dtype, requires_grad=True) for a in (q, k, v)]
        y = F.scaled_dot_product_attention(*xs, is_causal=True)
        (y.float() * tl.tensor(w, device=device)).sum().backward()
        assert y.dtype is dtype
        results[device] = [y] + [x.grad for x in xs]
    assert {"attention_forward_half", "attention_backward_half"} <= set(called), "the C kernels did not run"
    # bfloat16 on vdpbf16ps rounds P and dS to bfloat16 before the products that take them, as torch's own bfloat16
    # flash attention does (runtime_c/attention.c); the NumPy runtime does not, and dQ and dK carry dS's
    # cancellation, so the gradients may differ from its by more than one rounding: measured 6.23 ulps here (dQ),
    # and from torch's bfloat16 attention 5.19 (dK, which itself is 3.61 from torch's float32 on the same values).
    pairs = low == "bfloat16" and rt.lib.tl_cpu_bf16_dot()
    if pairs:
        bq, bk, bv = (torch.from_numpy(a).to(tdtype).requires_grad_() for a in (q, k, v))
        yb = torch.nn.functional.scaled_dot_product_attention(bq, bk, bv, is_causal=True)
        (yb.float() * torch.from_numpy(w)).sum().backward()
    for i, name in enumerate(["output", "dq", "dk", "dv"]):
        close(results["c"][i], results["numpy"][i], dtype, 8 if pairs and i else 1,
              f"attention {name} in {low}: c vs numpy")
        close(results["c"][i], [want, tq.grad, tk.grad, tv.grad][i].to(tdtype), dtype, 2 if i == 0 else 6,
              f"attention {name} in {low}: c vs torch")
        if pairs:
            close(results["c"][i], [yb, bq.grad, bk.grad, bv.grad][i], dtype, 2 if i == 0 else 6,
                  f"attention {name} in {low}: c vs torch's bfloat16 attention")


@pytest.mark.parametrize("low", LOW)
def test_embeddings_of_16_bit_tables(low):
    """GATHER of a 16-bit table copies its rows in runtime_c/embedding.c, and SCATTER_ADD (float32 sums only
    there) falls back to NumPy: rows exact, gradients (repeated indices add up) as the NumPy runtime's and within
    2 ulps of torch's."""
    dtype, tdtype = LOW[low]
    rng = np.random.default_rng(6)
    table, idx = rng.standard_normal((11, 24)).astype(np.float32), np.array([[3, 0, 3], [10, 3, 5]])
    w = rng.standard_normal((2, 3, 24)).astype(np.float32)
    tt = torch.from_numpy(table).to(tdtype).requires_grad_()
    want = torch.nn.functional.embedding(torch.from_numpy(idx), tt)
    (want.float() * torch.from_numpy(w)).sum().backward()
    grads = {}
    for device in ("c", "numpy"):
        t = tl.tensor(table, device=device, dtype=dtype, requires_grad=True)
        got = F.embedding(tl.tensor(idx, device=device), t)
        (got.float() * tl.tensor(w, device=device)).sum().backward()
        assert got.dtype is dtype and t.grad.dtype is dtype
        np.testing.assert_array_equal(values(got), values(want), err_msg=device)
        close(t.grad, tt.grad, dtype, 2, f"embedding gradient in {low} on {device}")
        grads[device] = values(t.grad)
    np.testing.assert_array_equal(grads["c"], grads["numpy"])
