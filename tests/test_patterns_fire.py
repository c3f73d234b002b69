"""The pattern passes fire on what the front end builds today.

FlashAttention (rewrite/flash.py) and the row kernels (rewrite/rowwise.py) match the exact graph that
`Tensor.softmax`, `log_softmax`, `F.layer_norm`, `F.cross_entropy` and the attention forms build. A harmless-looking
edit of one of those functions would silently switch its rewrite off; these tests build each front-end function,
run the pipeline's stages in order (tinyllm/rewrite/pipeline.py) and assert, by pass name, that its rule fired.
They need no runtime: the lowering stage is asked for a runtime that runs row kernels.
"""
import math
from types import SimpleNamespace

import numpy as np
import pytest

import tinyllm as tl
import tinyllm.nn.functional as F
from tinyllm.autograd import gradients
from tinyllm.graph import const, toposort
from tinyllm.rewrite import flash, tracing
from tinyllm.rewrite.pipeline import pipeline

ROW_KERNELS = SimpleNamespace(row_kernels=True, fuses=False, multi_output_kernels=False, max_kernel_inputs=None)


def fired(nodes, stages, runtime=None):
    """{pass name: rules fired} over the given pipeline stages, run in order on `nodes`."""
    with tracing() as log:
        for stage in stages:
            nodes = pipeline(nodes, stage, runtime)
    out = {}
    for f in log:
        out.setdefault(f.pass_name, set()).add(f.rule)
    return out, nodes


def qkv(b=2, h=2, t=5, d=4, seed=0):
    rng = np.random.default_rng(seed)
    return [tl.tensor(rng.standard_normal((b, h, t, d)).astype(np.float32), requires_grad=True) for _ in range(3)]


def nanogpt_attention(q, k, v):
    t = q.shape[-2]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
    mask = tl.ones(t, t).tril().reshape(1, 1, t, t)
    att = att.masked_fill(mask == 0, float("-inf"))
    return att.softmax(-1) @ v


def where_attention(q, k, v):
    t = q.shape[-2]
    keep = tl.arange(t).reshape(t, 1) >= tl.arange(t).reshape(1, t)
    s = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-2, -1)
    return tl.where(keep, s, float("-inf")).softmax(-1) @ v


ATTENTION = {
    "sdpa_causal": lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    "sdpa_plain": lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
    "nanogpt_masked_fill": nanogpt_attention,
    "tril_where": where_attention,
    "softmax_matmul": lambda q, k, v: (q @ k.transpose(-2, -1)).softmax(-1) @ v,
}


@pytest.mark.parametrize("form", sorted(ATTENTION))
def test_flash_fires_before_differentiation(form):
    assert flash.ENABLED, "run without TINYLLM_FLASH=0"
    q, k, v = qkv()
    loss = ATTENTION[form](q, k, v).sum()
    rules, (root,) = fired([loss.node], ["differentiate"])
    assert "flash" in rules, f"FlashAttention did not fire on {form}: {rules}"
    assert any(n.op == "FLASH_ATTN" for n in toposort([root]))


@pytest.mark.parametrize("form", sorted(ATTENTION))
def test_flash_fires_on_an_inference_graph(form):
    q, k, v = qkv(seed=1)
    with tl.no_grad():
        y = ATTENTION[form](q.detach(), k.detach(), v.detach())
    rules, _ = fired([y.node], ["values"])
    assert "flash" in rules, f"FlashAttention did not fire on {form} at realize: {rules}"


def rows(seed=0, shape=(3, 6)):
    return tl.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), requires_grad=True)


def layer_norm(x):
    w = tl.tensor(np.linspace(0.5, 1.5, x.shape[-1], dtype=np.float32), requires_grad=True)
    b = tl.tensor(np.linspace(-1, 1, x.shape[-1], dtype=np.float32), requires_grad=True)
    return F.layer_norm(x, (x.shape[-1],), w, b)


ROWWISE = {  # front-end function -> the row-kernel rule it must meet
    "softmax": (lambda x: x.softmax(-1), "softmax"),
    "F.softmax": (lambda x: F.softmax(x, dim=-1), "softmax"),
    "log_softmax": (lambda x: x.log_softmax(-1), "log_softmax"),
    "cross_entropy": (lambda x: F.cross_entropy(x, tl.tensor(np.arange(x.shape[0]) % x.shape[-1])), "log_softmax"),
    "layer_norm_affine": (layer_norm, "layer_norm_weight_bias"),
    "layer_norm_plain": (lambda x: F.layer_norm(x, (x.shape[-1],)), "layer_norm"),
    "nn.LayerNorm": (lambda x: tl.nn.LayerNorm(x.shape[-1])(x), "layer_norm_weight_bias"),
}


@pytest.mark.parametrize("name", sorted(ROWWISE))
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "forward+backward"])
def test_rowwise_fires_after_the_schedule_stage(name, backward):
    fn, rule = ROWWISE[name]
    x = rows()
    y = fn(x)
    roots = [y.node]
    if backward:
        loss = (y * y).sum() if y.shape else y
        root = pipeline([loss.node], "differentiate")[0]
        roots = [root, gradients(root, const(1.0, (), loss.dtype), [x.node])[x.node]]
    rules, lowered = fired(roots, ["schedule", "lower"], ROW_KERNELS)
    assert rule in rules.get("rowwise", set()), f"the row-kernel pass did not fire on {name}: {rules}"
    assert any(n.op.startswith("ROW_") for n in toposort(lowered))


def rope_gqa_attention(seed, n_head=4, n_kv_head=2, t=5, d=8, interleaved=False):
    """Llama's attention: RoPE on q and k, then grouped-query SDPA (k, v with fewer heads)."""
    rng = np.random.default_rng(seed)
    q, k, v = [tl.tensor(rng.standard_normal((2, h, t, d)).astype(np.float32), requires_grad=True)
               for h in (n_head, n_kv_head, n_kv_head)]
    cos, sin = tl.nn.RotaryEmbedding(d, 16, interleaved=interleaved)(tl.arange(t))
    q, k = (F.apply_rotary_pos_emb(x, cos, sin, interleaved) for x in (q, k))
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


@pytest.mark.parametrize("interleaved", [False, True], ids=["rotate_half", "interleaved"])
def test_flash_fires_with_rope_and_gqa(interleaved):
    loss = rope_gqa_attention(0, interleaved=interleaved).sum()
    rules, (root,) = fired([loss.node], ["differentiate"])
    assert "flash" in rules, f"FlashAttention did not fire behind RoPE + GQA: {rules}"
    assert any(n.op == "FLASH_ATTN" for n in toposort([root]))
    with tl.no_grad():
        y = rope_gqa_attention(1, interleaved=interleaved)
    rules, _ = fired([y.node], ["values"])
    assert "flash" in rules, f"FlashAttention did not fire behind RoPE + GQA at realize: {rules}"
