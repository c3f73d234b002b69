"""runtime_c/attention.c's 16-bit kernels (attention_forward_half, attention_backward_half) against the float32
ones: widening float16 or bfloat16 inputs to float32 is exact, so the 16-bit kernels, which widen each tile as
they read it, must give the bits of the float32 kernels run on the widened inputs with each result rounded to the
format (to nearest even) once. And a bfloat16 FLASH_ATTN in a graph runs them."""
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
       packed=st.booleans(), with_dl=st.booleans(), name=st.sampled_from(sorted(FMTS)),
       seed=st.integers(0, 2**31 - 1))
def test_half_kernels_are_the_float32_kernels_rounded(rt, b, h, tq, tk, d, dv, causal, portable, packed, with_dl,
                                                      name, seed):
    """Both paths (AVX and portable), ragged tiles, odd head sizes; `packed` reads q, k, v in place as the heads of
    one (b, t, 3, h, d) projection; dout with and without dL. Forward and backward, bit for bit."""
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
    try:
        views, batch = _views(rt, [q, k, v])
        rt.call(rt.lib.attention_forward_half, FORMATS[fmt], out, *views, *batch, tq, tk, d, dv, 0.4, int(causal))
        views, batch = _views(rt, wide)
        rt.call(rt.lib.attention_forward, out32, *views, *batch, tq, tk, d, dv, 0.4, int(causal))
        assert np.array_equal(out.view(np.uint16), dt.encode(out32, fmt).view(np.uint16))

        views, batch = _views(rt, [q, k, v, out, dout])
        rt.call(rt.lib.attention_backward_half, FORMATS[fmt], grads, *views, *batch, tq, tk, d, dv, 0.4,
                int(causal), int(with_dl))
        views, batch = _views(rt, wide + [_widened(out, fmt), _widened(dout, fmt)])
        rt.call(rt.lib.attention_backward, grads32, *views, *batch, tq, tk, d, dv, 0.4, int(causal), int(with_dl))
        assert np.array_equal(grads.view(np.uint16), dt.encode(grads32, fmt).view(np.uint16))
    finally:
        rt.lib.tl_force_portable(0)


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
