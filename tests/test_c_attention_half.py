"""runtime_c/attention.c's 16-bit kernels (attention_forward_half, attention_backward_half) against the float32
ones: widening float16 or bfloat16 inputs to float32 is exact, so the 16-bit kernels, which widen each tile as
they read it, must give the bits of the float32 kernels run on the widened inputs with each result rounded to the
format (to nearest even) once. And a bfloat16 FLASH_ATTN in a graph runs them.

Where the CPU has AVX512_BF16 (cpu.h's tl_cpu_bf16_dot), the bfloat16 forward multiplies on vdpbf16ps instead and
rounds P to bfloat16 before P V, as torch's CPU flash attention does: each P_j is off by at most 2^-9 P_j, so O
(P V / l, then rounded to bfloat16) is within

    |O - O_32| <= 2^-8 (sum_j P_j |V_j| / l + |O_32|) + 2^-20 sum_j P_j |V_j| / l

of the float32 kernel's O_32 (P's rounding, both roundings of O, and float32 sums in another order), which the
test computes in float64; L = m + log l has no rounded P in it (within 2^-8 |L_32| + 1e-6: its scores are summed in
pairs, in another order). With the instructions turned off (tl_cpu_set_dot(0)) the bits are the float32 kernel's."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tinyllm as tl
from tinyllm import dtype as dt
from tinyllm.runtime import get
from tinyllm.runtime.c.attention import FORMATS, _views

FMTS = {"float16": dt.float16, "bfloat16": dt.bfloat16}


@pytest.fixture(scope="module")
def rt():
    runtime = get("c")
    if runtime.lib is None:
        pytest.skip("no prebuilt C module")  # conftest: in CI a C runtime that failed to build is an error
    return runtime


def _widened(x, fmt):
    return np.ascontiguousarray(dt.decode(x, fmt), np.float32)


@settings(max_examples=25)
@given(b=st.integers(1, 2), h=st.integers(1, 3), tq=st.integers(1, 150), tk=st.integers(1, 150),
       d=st.integers(1, 40), dv=st.integers(1, 40), causal=st.booleans(), portable=st.booleans(),
       packed=st.booleans(), with_dl=st.booleans(), name=st.sampled_from(sorted(FMTS)), dot=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_half_kernels_are_the_float32_kernels_rounded(rt, b, h, tq, tk, d, dv, causal, portable, packed, with_dl,
                                                      name, dot, seed):
    """Both paths (AVX and portable), ragged tiles, odd head sizes; `packed` reads q, k, v in place as the heads of
    one (b, t, 3, h, d) projection; dout with and without dL; vdpbf16ps on or off. Forward and backward, bit for
    bit but for the bfloat16 forward on vdpbf16ps (the module docstring's bound)."""
    fmt = FMTS[name]
    rng = np.random.default_rng(seed)
    if packed:
        tk, dv = tq, d
        qkv = dt.encode(rng.standard_normal((b, tq, 3, h, d)) * 2.0, fmt)
        q, k, v = [qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3)]
    else:
        q, k, v = [dt.encode(rng.standard_normal((b, h, t, n)) * 2.0, fmt) for t, n in ((tq, d), (tk, d), (tk, dv))]
    dout = dt.encode(rng.standard_normal((b, h, tq, dv + with_dl)), fmt)
    out = np.empty((b, h, tq, dv + 1), fmt.np)
    grads = np.empty((b, h, tq * d + tk * (d + dv)), fmt.np)
    out32 = np.empty(out.shape, np.float32)
    grads32 = np.empty(grads.shape, np.float32)
    wide = [_widened(x, fmt) for x in (q, k, v)]
    rt.lib.tl_force_portable(int(portable))
    rt.lib.tl_cpu_set_dot(-1 if dot else 0)
    try:
        views, batch = _views(rt, [q, k, v])
        rt.call(rt.lib.attention_forward_half, FORMATS[fmt], out, *views, *batch, tq, tk, d, dv, 0.4, int(causal))
        views, batch = _views(rt, wide)
        rt.call(rt.lib.attention_forward, out32, *views, *batch, tq, tk, d, dv, 0.4, int(causal))
        pairs = name == "bfloat16" and d % 2 == 0 and rt.lib.tl_cpu_bf16_dot() and not portable
        if pairs:
            _check_pairs_bound(dt.decode(out, fmt), out32, *wide, 0.4, causal)
        else:
            assert np.array_equal(out.view(np.uint16), dt.encode(out32, fmt).view(np.uint16))

        views, batch = _views(rt, [q, k, v, out, dout])
        rt.call(rt.lib.attention_backward_half, FORMATS[fmt], grads, *views, *batch, tq, tk, d, dv, 0.4,
                int(causal), int(with_dl))
        views, batch = _views(rt, wide + [_widened(out, fmt), _widened(dout, fmt)])
        rt.call(rt.lib.attention_backward, grads32, *views, *batch, tq, tk, d, dv, 0.4, int(causal), int(with_dl))
        if pairs and dv % 2 == 0:
            _check_pairs_backward_bound(dt.decode(grads, fmt), grads32, *wide, _widened(out, fmt),
                                        _widened(dout, fmt), 0.4, causal, with_dl)
        else:
            assert np.array_equal(grads.view(np.uint16), dt.encode(grads32, fmt).view(np.uint16))
    finally:
        rt.lib.tl_force_portable(0)
        rt.lib.tl_cpu_set_dot(-1)


def _check_pairs_bound(got, out32, q, k, v, scale, causal):
    """The module docstring's bound on the bfloat16 forward on vdpbf16ps, against the float32 kernel's output."""
    s = np.einsum("bhid,bhjd->bhij", q.astype(np.float64), k.astype(np.float64)) * scale
    if causal:  # query i sees keys j <= i (queries and keys aligned at the start, as the kernel's mask)
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    p = np.nan_to_num(p)  # (a row that sees no key: the kernels give it 0 / 0 = NaN in both)
    spread = np.einsum("bhij,bhjd->bhid", p, np.abs(v.astype(np.float64)))
    o, o32 = got[..., :-1], out32[..., :-1].astype(np.float64)
    both_nan = np.isnan(o) & np.isnan(o32)
    assert np.all(both_nan | (np.abs(o - o32) <= 2.0 ** -8 * (spread + np.abs(o32)) + 2.0 ** -20 * spread))
    lse, lse32 = got[..., -1], out32[..., -1].astype(np.float64)
    assert np.all((np.isnan(lse) & np.isnan(lse32)) | (np.abs(lse - lse32) <= 2.0 ** -8 * np.abs(lse32) + 1e-6))


def _check_pairs_backward_bound(got, grads32, q, k, v, out, dout, scale, causal, with_dl):
    """The bfloat16 backward on vdpbf16ps against the float32 kernel on the same (widened) inputs. P and dS are
    rounded to bfloat16 (2^-9 each) in dV = P^T dO, dQ = dS K and dK = dS^T Q, and both results are rounded:

        |g - g_32| <= 2^-8 (spread + |g_32|) + 2 err + 2^-18 spread

    with spread the sum of the product's magnitudes (|dS| |K|, |dS| |Q|, P |dO|) and err what float32 sums in
    another order make of it: S's and dP's (e = 2^-24 (n + 4) per term of an n-long sum) carried through P, and dS
    = P (dP - Delta) scale, whose cancellation can leave dS far below the terms it came from. P, dS and the bounds
    in float64 from the kernels' definitions, with L and O from `out`."""
    q, k, v, out, dout = (x.astype(np.float64) for x in (q, k, v, out, dout))
    tq, tk, d, dv = q.shape[2], k.shape[2], q.shape[3], v.shape[3]
    s = np.einsum("bhid,bhjd->bhij", q, k) * scale
    p = np.exp(s - out[..., -1:])
    if causal:
        p = np.where(np.tril(np.ones((tq, tk), bool)), p, 0.0)
    do = dout[..., :dv]
    delta = (do * out[..., :dv]).sum(-1, keepdims=True) - (dout[..., dv:] if with_dl else 0.0)
    dp = np.einsum("bhic,bhjc->bhij", do, v)
    ds = p * (dp - delta) * scale
    p_err = p * 2.0 ** -24 * (d + 4) * np.einsum("bhid,bhjd->bhij", np.abs(q), np.abs(k)) * scale
    dp_err = 2.0 ** -24 * (dv + 4) * (np.einsum("bhic,bhjc->bhij", np.abs(do), np.abs(v)) + np.abs(delta))
    ds_err = (p_err * np.abs(dp - delta) + p * dp_err) * scale
    cases = [(np.abs(ds), ds_err, "bhij,bhjd->bhid", np.abs(k), (tq, d)),   # dQ = dS K
             (np.abs(ds), ds_err, "bhij,bhid->bhjd", np.abs(q), (tk, d)),   # dK = dS^T Q
             (p, p_err, "bhij,bhic->bhjc", np.abs(do), (tk, dv))]           # dV = P^T dO
    ends = np.cumsum([0, tq * d, tk * d, tk * dv])
    for part, (a, a_err, spec, b, shape) in enumerate(cases):
        spread, err = np.einsum(spec, a, b), np.einsum(spec, a_err, b)
        g = got[..., ends[part]:ends[part + 1]].reshape(got.shape[:2] + shape)
        g32 = grads32[..., ends[part]:ends[part + 1]].reshape(got.shape[:2] + shape).astype(np.float64)
        ok = np.abs(g - g32) <= 2.0 ** -8 * (spread + np.abs(g32)) + 2 * err + 2.0 ** -18 * spread
        assert np.all(ok | (np.isnan(g) & np.isnan(g32))), ("dq", "dk", "dv")[part]


def test_a_bfloat16_attention_step_runs_the_half_kernels(rt, monkeypatch):
    """Under bfloat16 autocast a GPT's attention runs the 16-bit kernels on its bfloat16 q, k, v (head splits of
    one projection), out and dout where they lie, never the float32 ones on widened copies."""
    from tinyllm.models.gpt import GPT, GPTConfig
    monkeypatch.setattr(rt, "replays", False)  # a recording made by an earlier test would run without rt.call
    called = []
    real = type(rt).call
    monkeypatch.setattr(type(rt), "call", lambda self, fn, *args, **kw: called.append(getattr(fn, "__name__", ""))
                        or real(self, fn, *args, **kw))
    tl.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=40)).to("c")
    idx = tl.tensor(np.random.default_rng(1).integers(0, 40, (2, 16)), device="c")
    with tl.autocast(dtype=tl.bfloat16):
        _, loss = model(idx, idx)
    loss.backward()
    assert all(np.isfinite(p.grad.numpy()).all() for p in model.parameters())
    attention = [name for name in called if name.startswith("attention_")]
    assert attention == ["attention_forward_half", "attention_backward_half"], attention
