"""The FlashAttention rewrite (tinyllm/rewrite/flash.py) and its kernels (ops/attention.py, runtime_c/attention.c),
on every runtime: attention written the plain way must become one FLASH_ATTN node, and its values and gradients
must match torch's scaled_dot_product_attention and the unrewritten graph; near misses must stay as written."""
import gc
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import tinyllm as tl
from tinyllm.graph import build, const, toposort
from tinyllm.nn import functional as F
from tinyllm.ops import attention
from tinyllm.rewrite import flash, tracing
from tinyllm.autograd import gradients, prepare

from helpers import tiny_gpt_steps, wgsl_f16_or_skip

pytestmark = pytest.mark.usefixtures("each_runtime")

TOL = dict(rtol=2e-4, atol=2e-5)  # float32, against float64 references


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    """The NumPy reference walks keys 64 at a time; tiles of 8 let small shapes cross tiles and end ragged
    (the C kernels keep their 64: the longer sequences drawn below cross those)."""
    monkeypatch.setattr(attention, "TILE", 8)


def fired(fn):
    """Run fn(); the number of times the flash rule fired in it, and fn's result."""
    with tracing() as log:
        out = fn()
    return sum(1 for f in log if f.pass_name == "flash"), out


def has_flash(*tensors):
    return any(n.op == "FLASH_ATTN" for n in toposort([prepare(t.node) for t in tensors]))


def leaves(arrays):
    return [tl.Tensor(a, requires_grad=True) for a in arrays]


def run(attn, arrays, upstream, enabled=True):
    """attn(q, k, v) with tinyllm, backpropagating `upstream`: output, gradients, and how often flash fired."""
    def go():
        q, k, v = leaves(arrays)
        y = attn(q, k, v)
        y.backward(gradient=tl.Tensor(upstream))
        return [y.numpy(), q.grad.numpy(), k.grad.numpy(), v.grad.numpy()]
    if enabled:
        return fired(go)
    with flash.disabled():
        return fired(go)


def torch_sdpa(arrays, upstream, causal, scale):
    q, k, v = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    y.backward(torch.tensor(upstream, dtype=torch.float64))
    return [y.detach().numpy(), q.grad.numpy(), k.grad.numpy(), v.grad.numpy()]


def close(got, want, what, scale=1.0):
    for name, g, w in zip(("output", "dq", "dk", "dv"), got, want):
        assert g.shape == w.shape, f"{what}: {name} has shape {g.shape}, want {w.shape}"
        np.testing.assert_allclose(g, w, rtol=TOL["rtol"], atol=TOL["atol"] * scale, err_msg=f"{what}: {name}")


def draw_inputs(rng, batch, tq, tk, d, dv, spread):
    shapes = [(*batch, tq, d), (*batch, tk, d), (*batch, tk, dv)]
    arrays = [(rng.standard_normal(s) * spread).astype(np.float32) for s in shapes]
    return arrays, rng.standard_normal((*batch, tq, dv)).astype(np.float32)


# ---- properties -------------------------------------------------------------------------------------------------
@settings(max_examples=20)
@given(b=st.integers(1, 2), h=st.integers(1, 3), t=st.integers(1, 80), d=st.integers(1, 9),
       causal=st.booleans(), spread=st.sampled_from([0.5, 1.0, 4.0]), seed=st.integers(0, 2**31 - 1))
def test_sdpa_matches_torch_and_the_unrewritten_graph(b, h, t, d, causal, spread, seed):
    """Random shapes (lengths off the tile size, and 1), causal or not, logits up to ~|4·4·√d| (spread 4) so the
    online softmax's running max does real work; flash must fire exactly once."""
    arrays, up = draw_inputs(np.random.default_rng(seed), (b, h), t, t, d, d, spread)
    attn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
    n, got = run(attn, arrays, up)
    assert n == 1, f"the flash rewrite fired {n} times, want once"
    want = torch_sdpa(arrays, up, causal, 1 / math.sqrt(d))
    close(got, want, "flash vs torch", scale=spread ** 2)
    n_plain, plain = run(attn, arrays, up, enabled=False)
    assert n_plain == 0
    close(got, plain, "flash vs unrewritten", scale=spread ** 2)


@settings(max_examples=10)
@given(tq=st.integers(1, 70), tk=st.integers(1, 70), d=st.integers(1, 6), dv=st.integers(1, 6),
       causal=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_queries_and_keys_of_different_lengths(tq, tk, d, dv, causal, seed):
    """Tq != Tk and D != Dv; causal follows torch's top-left convention (key j is kept for query i when j <= i)."""
    arrays, up = draw_inputs(np.random.default_rng(seed), (2,), tq, tk, d, dv, 1.0)
    n, got = run(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.3), arrays, up)
    assert n == 1
    close(got, torch_sdpa(arrays, up, causal, 0.3), "flash vs torch")


# ---- the forms people write -------------------------------------------------------------------------------------
T, D = 19, 4


def _tril(t):
    return tl.ones(t, t, dtype=tl.bool_).tril()


def nanogpt(q, k, v):
    """nanoGPT's manual path: a registered tril buffer, sliced, compared with 0."""
    bias = tl.tensor(np.tril(np.ones((32, 32), np.float32))).reshape(1, 1, 32, 32)
    t = q.shape[-2]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
    att = att.masked_fill(bias[:, :, :t, :t] == 0, float("-inf"))
    return F.softmax(att, dim=-1) @ v


def where_form(q, k, v):
    att = q @ k.mT / math.sqrt(q.shape[-1])
    return tl.where(_tril(q.shape[-2]), att, float("-inf")).softmax(-1) @ v


def scale_on_q(q, k, v):
    att = (q * 0.5) @ k.transpose(-2, -1)
    return att.masked_fill(~_tril(q.shape[-2]), float("-inf")).softmax(-1) @ v


def scale_on_k(q, k, v):
    att = q @ (k.transpose(-2, -1) * 0.5)
    return att.masked_fill(_tril(q.shape[-2]).logical_not(), float("-inf")).softmax(-1) @ v


def no_mask(q, k, v):
    return (q @ k.transpose(-2, -1) * 0.5).softmax(-1) @ v


def hand_softmax(q, k, v):
    """A softmax written out, its max not detached, the scale on the scores."""
    att = (q @ k.transpose(-2, -1)) * 0.5
    att = att.masked_fill(~_tril(q.shape[-2]), float("-inf"))
    e = (att - att.amax(-1, keepdim=True)).exp()
    return (e / e.sum(-1, keepdim=True)) @ v


def all_kept_mask(q, k, v):
    att = (q @ k.transpose(-2, -1)) * 0.5
    return att.masked_fill(tl.zeros(T, T, dtype=tl.bool_), float("-inf")).softmax(-1) @ v


FORMS = {"nanogpt": (nanogpt, True, 0.5), "where": (where_form, True, 0.5), "scale_on_q": (scale_on_q, True, 0.5),
         "scale_on_k": (scale_on_k, True, 0.5), "no_mask": (no_mask, False, 0.5),
         "hand_softmax": (hand_softmax, True, 0.5), "all_kept_mask": (all_kept_mask, False, 0.5)}


@pytest.mark.parametrize("form", FORMS)
def test_written_forms_are_rewritten(form):
    fn, causal, scale = FORMS[form]
    arrays, up = draw_inputs(np.random.default_rng(1), (2, 2), T, T, D, D, 2.0)
    n, got = run(fn, arrays, up)
    assert n == 1, f"{form}: flash fired {n} times"
    close(got, torch_sdpa(arrays, up, causal, scale), f"{form} vs torch", scale=4)
    close(got, run(fn, arrays, up, enabled=False)[1], f"{form} vs unrewritten", scale=4)


def upper_mask(q, k, v):
    att = q @ k.transpose(-2, -1) * 0.5
    return att.masked_fill(_tril(T), float("-inf")).softmax(-1) @ v  # drops the causal part: not causal


def shifted_diagonal(q, k, v):
    att = q @ k.transpose(-2, -1) * 0.5
    keep = tl.ones(T, T, dtype=tl.bool_).tril(-1) | tl.ones(T, T, dtype=tl.bool_).triu(T - 1)  # no empty row
    return att.masked_fill(~keep, float("-inf")).softmax(-1) @ v


def random_mask(q, k, v):
    keep = np.random.default_rng(0).random((T, T)) < 0.7
    keep[:, 0] = True
    att = q @ k.transpose(-2, -1) * 0.5
    return att.masked_fill(~tl.tensor(keep), float("-inf")).softmax(-1) @ v


def softmax_over_queries(q, k, v):
    return (q @ k.transpose(-2, -1) * 0.5).softmax(-2) @ v


def additive_bias(q, k, v):
    bias = tl.tensor(np.random.default_rng(0).standard_normal((T, T)).astype(np.float32))
    return ((q @ k.transpose(-2, -1)) * 0.5 + bias).softmax(-1) @ v


def dropout_on_probs(q, k, v):
    p = (q @ k.transpose(-2, -1) * 0.5).softmax(-1)
    return (p * tl.tensor((np.random.default_rng(0).random((T, T)) < 0.8) / 0.8, dtype=tl.float32)) @ v


def tensor_scale(q, k, v):
    return ((q @ k.transpose(-2, -1)) * tl.tensor(0.5)).softmax(-1) @ v


def times_the_sum(q, k, v):
    """e · Σe instead of e / Σe: not a softmax."""
    att = q @ k.transpose(-2, -1) * 0.5
    e = (att - att.amax(-1, keepdim=True)).exp()
    return (e * e.sum(-1, keepdim=True)) @ v


NEAR_MISSES = [times_the_sum, upper_mask, shifted_diagonal, random_mask, softmax_over_queries, additive_bias,
               dropout_on_probs, tensor_scale]


@pytest.mark.parametrize("fn", NEAR_MISSES, ids=lambda f: f.__name__)
def test_near_misses_are_left_alone(fn):
    """A different mask, a softmax over another axis, a bias or dropout between: no rewrite, same values."""
    arrays, up = draw_inputs(np.random.default_rng(2), (1, 2), T, T, D, D, 1.0)
    n, got = run(fn, arrays, up)
    assert n == 0, f"{fn.__name__}: flash fired"
    q, k, v = leaves(arrays)
    assert not has_flash(fn(q, k, v))
    np.testing.assert_array_equal(got[0], run(fn, arrays, up, enabled=False)[1][0])


# ---- where the rewrite runs, and what it keeps ------------------------------------------------------------------
def test_backward_graph_holds_no_score_matrix():
    """After the rewrite, no node of the forward or backward graph has a T×T part: memory is linear in T."""
    t = 67
    q, k, v = leaves(draw_inputs(np.random.default_rng(3), (1, 2), t, t, D, D, 1.0)[0])
    loss = (F.scaled_dot_product_attention(q, k, v, is_causal=True) ** 2).sum()
    root = prepare(loss.node)
    grads = gradients(root, const(1.0, root.shape, root.dtype), [q.node, k.node, v.node])
    nodes = toposort([root, *grads.values()])
    assert any(n.op == "FLASH_ATTN_BWD" for n in nodes)
    square = [n for n in nodes if len(n.shape) >= 2 and n.shape[-2:] == (t, t)]
    assert not square, f"nodes with a T×T part: {square[:3]}"
    with flash.disabled():
        loss2 = (F.scaled_dot_product_attention(q, k, v, is_causal=True) ** 2).sum()
        assert any(len(n.shape) >= 2 and n.shape[-2:] == (t, t) for n in toposort([prepare(loss2.node)]))


def test_inference_graphs_are_rewritten_at_realize():
    arrays, _ = draw_inputs(np.random.default_rng(4), (2,), 9, 9, 3, 3, 1.0)
    with tl.no_grad():
        q, k, v = [tl.tensor(a) for a in arrays]
        n, y = fired(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).numpy())
    assert n == 1
    np.testing.assert_allclose(y, torch_sdpa(arrays, np.zeros_like(arrays[2]), True, 1 / math.sqrt(3))[0], **TOL)


def test_graphs_without_attention_are_skipped_by_structure(monkeypatch):
    import tinyllm.realizer as realize
    calls = []
    monkeypatch.setattr(flash, "_plain", set())
    original = flash.graph_rewrite
    monkeypatch.setattr(flash, "graph_rewrite", lambda *a: calls.append(1) or original(*a))
    x = tl.randn(5, 7)
    key, _ = realize.structure([(x.softmax(-1) * 2).node])
    for _ in range(3):
        (x.softmax(-1) * 2).numpy()
    assert len(calls) == 1, "the pass walked a graph whose structure it had already found free of attention"
    assert key in flash._plain


def test_loss_is_computed_through_the_flash_node():
    """backward() moves the tensor onto the rewritten graph: the forward runs once, through FLASH_ATTN."""
    q, k, v = leaves(draw_inputs(np.random.default_rng(5), (1,), 12, 12, 4, 4, 1.0)[0])
    loss = F.scaled_dot_product_attention(q, k, v, is_causal=True).sum()
    loss.backward(retain_graph=True)
    assert any(n.op == "FLASH_ATTN" for n in toposort([loss.node]))
    assert loss.item() == pytest.approx(float(torch_sdpa([a.numpy() for a in (q, k, v)],
                                                         np.zeros((1, 12, 4), np.float32), True, 0.5)[0].sum()),
                                        rel=1e-5, abs=1e-5)


def test_switches_turn_it_off():
    q, k, v = leaves(draw_inputs(np.random.default_rng(6), (1,), 5, 5, 2, 2, 1.0)[0])
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with flash.disabled():
        assert not has_flash(y) and not flash.ENABLED
    assert flash.ENABLED and has_flash(y)


def test_gpt_uses_flash_attention_in_every_layer():
    from tinyllm.models.gpt import GPT, GPTConfig
    tl.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=11, n_layer=2, n_head=2, n_embd=8))
    idx = tl.tensor(np.random.default_rng(0).integers(0, 11, (2, 16)))
    _, loss = model(idx, idx)
    n, _ = fired(loss.backward)
    assert n == 2
    assert all(p.grad is not None for p in model.parameters())


def test_training_steps_keep_no_old_graph_alive():
    """Rewriting before autograd caches the rewritten graph by its root; the cache must not keep the graph (and
    the old parameters it reads) alive once the step is over: memory after each step stays the same."""
    gc.collect()  # earlier tests' garbage cycles, freed whenever the collector next runs, are no part of this
    held = [tl.memory_allocated() for _ in tiny_gpt_steps(4)]
    assert held[1] == held[2] == held[3], held


@pytest.mark.parametrize("with_dl", [True, False])
def test_backward_takes_dout_with_or_without_dl(with_dl):
    """FLASH_ATTN_BWD on each runtime with dout [dO | dL], dL nonzero, or dO alone (dL = 0, as the pads pass
    passes it): against the float64 reference."""
    rng = np.random.default_rng(5)
    (q, k, v), _ = draw_inputs(rng, (2, 2), 9, 11, 4, 6, 2.0)
    out = attention.attention_forward(q, k, v, 0.4, True).astype(np.float32)
    dout = rng.standard_normal((2, 2, 9, 6 + with_dl)).astype(np.float32)
    dev = tl.tensor(q).device
    node = build("FLASH_ATTN_BWD", *(tl.tensor(x).node for x in (q, k, v, out, dout)), arg=(0.4, True))
    got = tl.Tensor._from_node(node, dev).numpy()
    f64 = [x.astype(np.float64) for x in (q, k, v, out, dout)]
    want = attention.attention_backward(*f64, 0.4, True)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want).max()))
    if with_dl:  # dL enters: the same gradient without it differs
        assert not np.allclose(want, attention.attention_backward(*f64[:4], f64[4][..., :6], 0.4, True))


def test_bad_inputs_are_named():
    q, k = tl.randn(2, 3, 4).node, tl.randn(2, 5, 3).node
    with pytest.raises(ValueError, match="FLASH_ATTN: q, k, v have shapes"):
        build("FLASH_ATTN", q, k, k, arg=(1.0, True))
    with pytest.raises(TypeError, match=r"FLASH_ATTN: arg must be \(scale"):
        build("FLASH_ATTN", q, q, q, arg=1.0)
    with pytest.raises(ValueError, match="no keys"):
        build("FLASH_ATTN", q, tl.randn(2, 0, 4).node, tl.randn(2, 0, 4).node, arg=(1.0, False))


# ---- the C kernels themselves, both paths -----------------------------------------------------------------------
@settings(max_examples=20)
@given(b=st.integers(1, 2), h=st.integers(1, 3), tq=st.integers(1, 150), tk=st.integers(1, 150),
       d=st.integers(1, 40), dv=st.integers(1, 40), causal=st.booleans(), portable=st.booleans(),
       packed=st.booleans(), with_dl=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_c_kernels_match_the_reference(each_runtime, b, h, tq, tk, d, dv, causal, portable, packed, with_dl, seed):
    """runtime_c/attention.c, AVX2 and portable paths, against the float64 NumPy reference: ragged tiles on
    both axes, odd head sizes (the masked edge of the 16-wide blocks). `packed` reads q, k and v in place as
    the heads of one (b, t, 3, h, d) projection, as a model splits them (strided batch and row axes). dout is
    [dO | dL] `with_dl`, else dO alone (dL = 0)."""
    if each_runtime != "c":
        pytest.skip("C kernels")
    from tinyllm.runtime import get
    from tinyllm.runtime.c.attention import _views
    rt = get("c")
    if rt.lib is None:
        pytest.skip("no prebuilt C module")
    rng = np.random.default_rng(seed)
    if packed:
        tk, dv = tq, d
        qkv = (rng.standard_normal((b, tq, 3, h, d)) * 2.0).astype(np.float32)
        q, k, v = [qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3)]
    else:
        (q, k, v), _ = draw_inputs(rng, (b, h), tq, tk, d, dv, 2.0)
    out = np.empty((b, h, tq, dv + 1), np.float32)
    dout = rng.standard_normal(out.shape[:-1] + (dv + with_dl,)).astype(np.float32)
    grads = np.empty((b, h, tq * d + tk * (d + dv)), np.float32)
    rt.lib.tl_force_portable(int(portable))
    try:
        views, batch = _views(rt, [q, k, v])
        rt.call(rt.lib.attention_forward, out, *views, *batch, tq, tk, d, dv, 0.4, int(causal))
        views, batch = _views(rt, [q, k, v, out, dout])
        rt.call(rt.lib.attention_backward, grads, *views, *batch, tq, tk, d, dv, 0.4, int(causal), int(with_dl))
    finally:
        rt.lib.tl_force_portable(0)
    f64 = [x.astype(np.float64) for x in (q, k, v)]
    want = attention.attention_forward(*f64, 0.4, causal)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    want_grads = attention.attention_backward(*f64, want, dout.astype(np.float64), 0.4, causal)
    np.testing.assert_allclose(grads, want_grads, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want_grads).max()))


def test_graph_export_shows_the_collapse(tmp_path):
    """examples/flash_graph.py writes the graph before and after: the softmax's ops in one, FLASH_ATTN in the other."""
    import runpy
    script = runpy.run_path(str(__import__("pathlib").Path(__file__).parents[1] / "examples" / "flash_graph.py"))
    before, after = [path for path in script["main"](["--out-dir", str(tmp_path)]) if path.endswith(".dot")]
    before, after = open(before).read(), open(after).read()
    assert "EXP" in before and "REDUCE_MAX" in before and "FLASH_ATTN" not in before
    assert "FLASH_ATTN" in after and "EXP" not in after and "MATMUL" not in after


def test_graph_export_says_when_graphviz_is_missing(tmp_path, monkeypatch, capsys):
    """Without Graphviz's `dot` only the .dot files are written, and the example says why there is no .svg."""
    import runpy
    import shutil
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    script = runpy.run_path(str(__import__("pathlib").Path(__file__).parents[1] / "examples" / "flash_graph.py"))
    written = script["main"](["--out", str(tmp_path)])  # (--out: the old name of --out-dir)
    assert all(path.endswith(".dot") for path in written)
    assert "Graphviz's `dot` is not installed" in capsys.readouterr().out


def test_c_kernels_read_grouped_keys_through_the_view(each_runtime):
    """Grouped-query attention's k and v broadcast over the group (stride 0), v a head split of a projection
    (batch and head strides that don't merge): the kernels read all three in place, three batch runs, no copy."""
    if each_runtime != "c":
        pytest.skip("C kernels")
    from tinyllm.runtime import get
    from tinyllm.runtime.c.attention import _views
    rt = get("c")
    if rt.lib is None:
        pytest.skip("no prebuilt C module")
    rng = np.random.default_rng(11)
    b, hkv, g, t, d = 2, 2, 3, 70, 8
    q = rng.standard_normal((b, hkv, g, t, d)).astype(np.float32)
    kv = rng.standard_normal((b, t, 2, hkv, d)).astype(np.float32)  # one projection, k and v split out of it
    k, v = [np.broadcast_to(kv[:, :, i].transpose(0, 2, 1, 3)[:, :, None], (b, hkv, g, t, d)) for i in range(2)]
    views, batch = _views(rt, [q, k, v])
    assert batch == (b, hkv, g), f"batch runs {batch}"
    assert all(view.fields[0] is x for view, x in zip(views, (q, k, v))), "an input was copied"
    out = np.empty((b, hkv, g, t, d + 1), np.float32)
    rt.call(rt.lib.attention_forward, out, *views, *batch, t, t, d, d, 0.4, 1)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    grads = np.empty((b, hkv, g, t * 3 * d), np.float32)
    views, batch = _views(rt, [q, k, v, out, dout])
    rt.call(rt.lib.attention_backward, grads, *views, *batch, t, t, d, d, 0.4, 1, 1)
    f64 = [np.ascontiguousarray(x, np.float64) for x in (q, k, v)]
    want = attention.attention_forward(*f64, 0.4, True)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    want_grads = attention.attention_backward(*f64, want, dout.astype(np.float64), 0.4, True)
    np.testing.assert_allclose(grads, want_grads, rtol=1e-4, atol=1e-4 * np.abs(want_grads).max())


@pytest.mark.wgsl
def test_wgsl_kernels_read_grouped_keys_through_the_view(monkeypatch):
    """On WGSL too: grouped-query attention's k and v broadcast over the group (stride 0), v a head split of a
    projection: FLASH_ATTN and FLASH_ATTN_BWD read q, k and v in place (no copy dispatched) and match float64."""
    if "wgsl" not in tl.runtime.available():
        pytest.skip("no WebGPU adapter (CI installs lavapipe, and there a missing adapter fails elsewhere)")
    from tinyllm.runtime.wgsl.runtime import WGSLRuntime
    rng = np.random.default_rng(12)
    b, hkv, g, t, d = 2, 2, 3, 37, 8
    qn = rng.standard_normal((b, hkv * g, t, d)).astype(np.float32)
    kvn = rng.standard_normal((b, t, 2 * hkv * d)).astype(np.float32)  # one projection, k and v split out of it
    q = tl.tensor(qn, device="wgsl", requires_grad=True)
    kv = tl.tensor(kvn, device="wgsl", requires_grad=True)
    k, v = (kv[..., i * hkv * d:(i + 1) * hkv * d].reshape(b, t, hkv, d).transpose(1, 2) for i in range(2))
    copies = []
    real = WGSLRuntime.copy_into
    monkeypatch.setattr(WGSLRuntime, "copy_into", lambda self, *a: copies.append(a[2].shape) or real(self, *a))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    (y * tl.tensor(dy, device="wgsl")).sum().backward()
    got = (y.numpy(), q.grad.numpy(), kv.grad.numpy())
    assert not [s for s in copies if len(s) >= 4 and s[-2:] == (t, d)], f"q, k or v was copied: {copies}"
    tq = torch.tensor(qn.astype(np.float64), requires_grad=True)
    tkv = torch.tensor(kvn.astype(np.float64), requires_grad=True)
    tk, tv = (tkv[..., i * hkv * d:(i + 1) * hkv * d].reshape(b, t, hkv, d).transpose(1, 2) for i in range(2))
    ty = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=True)
    (ty * torch.tensor(dy.astype(np.float64))).sum().backward()
    for ours, want in zip(got, (ty.detach().numpy(), tq.grad.numpy(), tkv.grad.numpy())):
        np.testing.assert_allclose(ours, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.wgsl
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
@settings(max_examples=20)
@given(b=st.integers(1, 2), hkv=st.integers(1, 2), g=st.integers(1, 3), tq=st.integers(1, 70),
       tk=st.integers(1, 70), d=st.integers(1, 40), dv=st.integers(1, 40), causal=st.booleans(),
       with_dl=st.booleans(), blocks=st.sampled_from([None, (1, 1), (4, 3), (16, 7)]), seed=st.integers(0, 2**31 - 1))
def test_wgsl_tiles_match_the_reference(each_runtime, dtype, b, hkv, g, tq, tk, d, dv, causal, with_dl, blocks, seed):
    """wgsl/flash_attention_*.wgsl, tiled through workgroup memory, against the float64 NumPy reference: lengths
    around the blocks (BR query rows per workgroup, BC staged rows; `blocks` shrinks both to make the ragged last
    blocks and the causal diagonal cross several of them), D != DV, grouped-query k and v broadcast over the group
    (stride 0, read in place), dout [dO | dL] or dO alone, float16 storage where the adapter has shader-f16."""
    if each_runtime != "wgsl":
        pytest.skip("WGSL kernels")
    if dtype is np.float16:
        wgsl_f16_or_skip()
    from tinyllm.runtime.wgsl import attention as wgsl_attention
    rng = np.random.default_rng(seed)
    scale, tol = 0.4, (1e-4 if dtype is np.float32 else 4e-3)
    q = rng.standard_normal((b, hkv, g, tq, d)).astype(dtype)
    k, v = (rng.standard_normal((b, hkv, 1, tk, w)).astype(dtype) for w in (d, dv))
    dout = rng.standard_normal((b, hkv, g, tq, dv + with_dl)).astype(dtype)
    f64 = [np.ascontiguousarray(np.broadcast_to(x, (b, hkv, g, tk, x.shape[-1])), np.float64) if x is not q
           else x.astype(np.float64) for x in (q, k, v)]
    want = attention.attention_forward(*f64, scale, causal)
    with pytest.MonkeyPatch.context() as mp:
        if blocks:
            mp.setattr(wgsl_attention, "BR_MAX", blocks[0])
            mp.setattr(wgsl_attention, "BC_MAX", blocks[1])
        tq_, tk_, tv_ = (tl.tensor(x, device="wgsl") for x in (q, k, v))
        tk_, tv_ = (x.expand(b, hkv, g, tk, x.shape[-1]) for x in (tk_, tv_))
        node = build("FLASH_ATTN", tq_.node, tk_.node, tv_.node, arg=(scale, causal))
        out = tl.Tensor._from_node(node, "wgsl").numpy()
        node = build("FLASH_ATTN_BWD", tq_.node, tk_.node, tv_.node, tl.tensor(out, device="wgsl").node,
                     tl.tensor(dout, device="wgsl").node, arg=(scale, causal))
        grads = tl.Tensor._from_node(node, "wgsl").numpy()
    assert out.dtype == grads.dtype == dtype
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol)
    # the backward against the reference given the same forward output (rounded to float16 where stored so)
    want_grads = attention.attention_backward(*f64, out.astype(np.float64), dout.astype(np.float64), scale, causal)
    np.testing.assert_allclose(grads, want_grads, rtol=tol, atol=tol * max(1.0, np.abs(want_grads).max()))
