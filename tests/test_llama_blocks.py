"""Llama's building blocks in tinyllm.nn against torch and Hugging Face, on every runtime: RMSNorm, the SwiGLU MLP,
rotary position embeddings (both layouts) and grouped-query attention, values and gradients.

Tolerances (float32 against torch's float32 or float64): values rtol 1e-5 / atol 1e-6, gradients rtol 1e-4 /
atol 1e-5 (sums of a few dozen products, in another order). bfloat16 against Hugging Face's LlamaRMSNorm: equal
to the last bit, as both round the float32 norm once and then multiply by the weight."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from transformers.models.llama.configuration_llama import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as hf_apply_rotary_pos_emb

import tinyllm as tl
from tinyllm import nn
from tinyllm.nn import functional as F
from tinyllm.rewrite import tracing

from helpers import helper_test_op

pytestmark = pytest.mark.usefixtures("each_runtime", "one_torch_thread")

TOL = {"forward": (1e-5, 1e-6), "grad": (1e-4, 1e-5)}
rng = np.random.default_rng


def close(got, want, what, tol=TOL["forward"]):
    want = want.detach().numpy() if isinstance(want, torch.Tensor) else want
    got = got.numpy() if isinstance(got, tl.Tensor) else got
    assert got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"
    np.testing.assert_allclose(got, want, rtol=tol[0], atol=tol[1], err_msg=what)


# ---- RMSNorm ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,normalized,eps", [((3, 5, 8), (8,), None), ((2, 3, 4), (3, 4), 1e-6)])
def test_rms_norm_matches_torch(shape, normalized, eps):
    helper_test_op([shape, normalized],
                   lambda x, w: torch.nn.functional.rms_norm(x, normalized, w, eps),
                   lambda x, w: F.rms_norm(x, normalized, w, eps), tol=TOL)


def test_rms_norm_module_names_and_default_eps():
    norm = nn.RMSNorm(6)
    assert list(norm.state_dict()) == ["weight"] and norm.eps is None
    assert nn.RMSNorm(6, elementwise_affine=False).weight is None
    x = np.full((2, 6), 1e-4, np.float32)  # mean(x²) = 1e-8, below float32's eps: eps sets the scale
    want = torch.nn.RMSNorm(6)(torch.tensor(x))
    close(norm(tl.tensor(x)), want, "RMSNorm with eps=None (float32's machine epsilon)")


def test_rms_norm_bfloat16_equals_hugging_face(each_runtime):
    """Normalised in float32, rounded to bfloat16, then times the weight: LlamaRMSNorm to the last bit. torch's
    own rms_norm multiplies before rounding, which changes about a quarter of these elements by one ulp."""
    if each_runtime == "wgsl":  # WGSL has no bf16: the runtime refuses it, naming the fix
        with pytest.raises(TypeError, match="no bfloat16"):
            nn.RMSNorm(64).to(dtype=tl.bfloat16)(tl.ones(2, 64).to(tl.bfloat16)).numpy()
        return
    r = rng(3)
    x = torch.tensor(r.standard_normal((8, 64)) * 3, dtype=torch.bfloat16, requires_grad=True)
    w = torch.tensor(1 + r.standard_normal(64) * 0.5, dtype=torch.bfloat16)
    hf = LlamaRMSNorm(64, eps=1e-6).to(torch.bfloat16)
    hf.weight.data.copy_(w)
    want = hf(x)
    up = torch.tensor(r.standard_normal(want.shape), dtype=torch.bfloat16)
    want.backward(up)
    norm = nn.RMSNorm(64, eps=1e-6).to(dtype=tl.bfloat16)
    norm.weight.copy_(w.float().numpy())
    lx = tl.tensor(x.detach().float().numpy(), requires_grad=True)
    y = norm(lx.to(tl.bfloat16))
    assert y.dtype is tl.bfloat16
    got = y.detach().numpy().astype(np.float32)  # the bf16 values themselves (decoded)
    assert np.array_equal(got, want.detach().float().numpy()), "bf16 RMSNorm differs from LlamaRMSNorm"
    y.backward(gradient=tl.tensor(up.float().numpy()).to(tl.bfloat16))
    # gradients: bf16 rounding of each intermediate, in another order: a few bf16 ulps
    close(lx.grad, x.grad.float(), "dx", (3e-2, 3e-2))
    close(norm.weight.grad.detach().numpy().astype(np.float32), hf.weight.grad.float(), "dweight", (3e-2, 3e-2))


def test_rms_norm_errors_name_the_shapes():
    with pytest.raises(RuntimeError, match=r"rms_norm: input of shape \(2, 3\) does not end in normalized_shape"):
        F.rms_norm(tl.ones(2, 3), (4,))
    with pytest.raises(RuntimeError, match="rms_norm: weight of shape"):
        F.rms_norm(tl.ones(2, 3), 3, tl.ones(4))


# ---- SwiGLU -----------------------------------------------------------------------------------------------------
def test_swiglu_matches_llama_mlp():
    r = rng(4)
    cfg = LlamaConfig(hidden_size=12, intermediate_size=20, num_attention_heads=2, hidden_act="silu", mlp_bias=False)
    ref = LlamaMLP(cfg)
    mlp = nn.SwiGLU(12, 20)
    assert sorted(mlp.state_dict()) == sorted(ref.state_dict()), "child names differ from LlamaMLP's"
    mlp.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    x = r.standard_normal((2, 3, 12)).astype(np.float32)
    tx, lx = torch.tensor(x, requires_grad=True), tl.tensor(x, requires_grad=True)
    want, got = ref(tx), mlp(lx)
    close(got, want, "SwiGLU output")
    up = r.standard_normal(want.shape).astype(np.float32)
    want.backward(torch.tensor(up))
    got.backward(gradient=tl.tensor(up))
    close(lx.grad, tx.grad, "dx", TOL["grad"])
    params = dict(ref.named_parameters())
    for name, p in mlp.named_parameters():
        close(p.grad, params[name].grad, f"d{name}", TOL["grad"])


# ---- rotary embeddings ------------------------------------------------------------------------------------------
B, H, HKV, T, D = 2, 4, 2, 5, 8


def hf_rotary(positions, dim=D, base=10000.0, max_pos=64):
    cfg = LlamaConfig(hidden_size=dim * H, num_attention_heads=H, max_position_embeddings=max_pos, rope_theta=base)
    return LlamaRotaryEmbedding(cfg)(torch.zeros(1, dtype=torch.float32), torch.tensor(positions))


def test_rotary_tables_match_hugging_face():
    positions = rng(5).integers(0, 64, (B, T))
    want_cos, want_sin = hf_rotary(positions, base=500000.0)
    rot = nn.RotaryEmbedding(D, 64, base=500000.0)
    cos, sin = rot(tl.tensor(positions))
    assert cos.shape == (B, T, D) and cos.dtype is tl.float32 and not cos.requires_grad
    close(cos, want_cos, "cos", (0, 1e-6))
    close(sin, want_sin, "sin", (0, 1e-6))
    assert rot.state_dict() == {}, "the tables are not parameters"


def test_rotate_half_matches_hugging_face():
    """Values and the gradient of q and k, with HF's (B, T, dim) tables unsqueezed on the head axis."""
    r = rng(6)
    positions = r.integers(0, 64, (B, T))
    q, k = r.standard_normal((B, H, T, D)).astype(np.float32), r.standard_normal((B, HKV, T, D)).astype(np.float32)
    tq, tk = torch.tensor(q, requires_grad=True), torch.tensor(k, requires_grad=True)
    want_q, want_k = hf_apply_rotary_pos_emb(tq, tk, *hf_rotary(positions))
    cos, sin = nn.RotaryEmbedding(D, 64)(tl.tensor(positions))
    lq, lk = tl.tensor(q, requires_grad=True), tl.tensor(k, requires_grad=True)
    got_q = F.apply_rotary_pos_emb(lq, cos.unsqueeze(1), sin.unsqueeze(1))
    got_k = F.apply_rotary_pos_emb(lk, cos.unsqueeze(1), sin.unsqueeze(1))
    close(got_q, want_q, "rotated q")
    close(got_k, want_k, "rotated k")
    uq, uk = r.standard_normal(q.shape).astype(np.float32), r.standard_normal(k.shape).astype(np.float32)
    torch.autograd.backward([want_q, want_k], [torch.tensor(uq), torch.tensor(uk)])
    ((got_q * tl.tensor(uq)).sum() + (got_k * tl.tensor(uk)).sum()).backward()
    close(lq.grad, tq.grad, "dq", TOL["grad"])
    close(lk.grad, tk.grad, "dk", TOL["grad"])


def meta_apply_rotary_emb(x, positions, dim=D, base=10000.0):
    """Meta's llama: x's pairs (2i, 2i+1) as complex numbers, times e^(i·m·θᵢ)."""
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    angles = torch.outer(torch.tensor(positions, dtype=torch.float64), freqs)
    x_ = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(x_ * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


def test_interleaved_matches_metas_complex_multiply():
    r = rng(7)
    positions = np.array([3, 0, 7, 1, 30])
    x = r.standard_normal((B, H, T, D))
    tx = torch.tensor(x, requires_grad=True)
    want = meta_apply_rotary_emb(tx, positions)
    cos, sin = nn.RotaryEmbedding(D, 64, interleaved=True)(tl.tensor(positions))
    lx = tl.tensor(x.astype(np.float32), requires_grad=True)
    got = F.apply_rotary_pos_emb(lx, cos, sin, interleaved=True)
    close(got, want, "interleaved rotary (float64 reference)", (1e-5, 1e-5))
    up = r.standard_normal(x.shape)
    want.backward(torch.tensor(up))
    got.backward(gradient=tl.tensor(up.astype(np.float32)))
    close(lx.grad, tx.grad, "dx", TOL["grad"])


def test_interleaved_is_rotate_half_up_to_a_permutation():
    """Features [0, 2, 4, …, 1, 3, 5, …] of the interleaved layout are the rotate-half layout's."""
    r = rng(8)
    positions = tl.tensor(r.integers(0, 64, T))
    x = r.standard_normal((B, H, T, D)).astype(np.float32)
    perm = np.concatenate([np.arange(0, D, 2), np.arange(1, D, 2)])
    inter = F.apply_rotary_pos_emb(tl.tensor(x), *nn.RotaryEmbedding(D, 64, interleaved=True)(positions), True)
    half = F.apply_rotary_pos_emb(tl.tensor(x[..., perm]), *nn.RotaryEmbedding(D, 64)(positions))
    close(half, inter.numpy()[..., perm], "rotate-half of permuted x vs permuted interleaved")


@settings(max_examples=6, deadline=None)
@given(shift=st.integers(1, 40), interleaved=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_scores_depend_only_on_relative_position(shift, interleaved, seed):
    """q·k after RoPE is unchanged when every position moves by the same constant (docstring of nn/rotary.py)."""
    r = rng(seed)
    q, k = r.standard_normal((H, T, D)).astype(np.float32), r.standard_normal((H, T, D)).astype(np.float32)
    positions = r.integers(0, 20, T)
    rot = nn.RotaryEmbedding(D, 64, interleaved=interleaved)

    def scores(pos):
        cos, sin = rot(tl.tensor(pos))
        rq, rk = (F.apply_rotary_pos_emb(tl.tensor(a), cos, sin, interleaved) for a in (q, k))
        return (rq @ rk.transpose(-2, -1)).numpy()
    base, moved = scores(positions), scores(positions + shift)
    assert not np.allclose(base, (q @ k.transpose(0, 2, 1)), atol=1e-3), "the rotation did nothing"
    np.testing.assert_allclose(moved, base, rtol=1e-4, atol=1e-4)  # angles up to 60 rad: float32 rounding


def test_rotary_errors():
    with pytest.raises(ValueError, match="RotaryEmbedding: dim must be a positive even number"):
        nn.RotaryEmbedding(7)
    with pytest.raises(TypeError, match="position_ids must be an int64 tensor"):
        nn.RotaryEmbedding(8)(tl.tensor([0.0, 1.0]))
    cos, sin = nn.RotaryEmbedding(8)(tl.arange(3))
    with pytest.raises(ValueError, match=r"cos \(3, 8\) and sin \(3, 8\) must have one shape ending in x's head dim"):
        F.apply_rotary_pos_emb(tl.ones(3, 4), cos, sin)


# ---- grouped-query attention ------------------------------------------------------------------------------------
def flash_count(fn):
    with tracing() as log:
        out = fn()
    return sum(1 for f in log if f.pass_name == "flash"), out


@pytest.mark.parametrize("causal,mask,tq", [(True, None, T), (False, "per_head", T), (False, None, T),
                                             (False, None, 1)])
def test_gqa_matches_torch_and_fires_flash(causal, mask, tq):
    """torch's enable_gqa=True, values and dq, dk, dv (dk, dv summed over each group); FlashAttention takes the
    plain and causal forms (a general mask stays as written); tq=1 is a decode step's query."""
    r = rng(9)
    arrays = [r.standard_normal(s).astype(np.float32) for s in ((B, H, tq, D), (B, HKV, T, D), (B, HKV, T, D))]
    keep = r.random((1, H, tq, T)) > 0.3 if mask else None
    if keep is not None:
        keep[..., 0] = True  # every query sees a key
    up = r.standard_normal((B, H, tq, D)).astype(np.float32)
    tt = [torch.tensor(a, requires_grad=True) for a in arrays]
    want = torch.nn.functional.scaled_dot_product_attention(
        *tt, attn_mask=None if keep is None else torch.tensor(keep), is_causal=causal, enable_gqa=True)
    want.backward(torch.tensor(up))
    ts = [tl.tensor(a, requires_grad=True) for a in arrays]

    def go():
        y = F.scaled_dot_product_attention(*ts, attn_mask=None if keep is None else tl.tensor(keep),
                                           is_causal=causal, enable_gqa=True)
        y.backward(gradient=tl.tensor(up))
        return y.numpy()
    n, got = flash_count(go)
    assert n == (0 if mask else 1), f"FlashAttention fired {n} times"
    close(got, want, "GQA output")
    for name, l, t in zip(("dq", "dk", "dv"), ts, tt):
        close(l.grad, t.grad, name, TOL["grad"])


def test_rope_and_gqa_attention_block_fires_flash_and_matches_torch():
    """q, k, v split out of projections, RoPE on q and k, grouped heads: one FLASH_ATTN, torch's values and the
    gradients of the input and every weight."""
    r = rng(10)
    C = 16
    arrays = [r.standard_normal((B, T, C)).astype(np.float32)] + \
        [(r.standard_normal((C, n * D)) / math.sqrt(C)).astype(np.float32) for n in (H, HKV, HKV)]
    positions = np.arange(T) + 3
    up = r.standard_normal((B, H, T, D)).astype(np.float32)

    def block(x, wq, wk, wv, cos, sin, rope, sdpa):
        q, k, v = ((x @ w).reshape(B, T, n, D).transpose(1, 2) for w, n in ((wq, H), (wk, HKV), (wv, HKV)))
        return sdpa(rope(q, cos, sin), rope(k, cos, sin), v, is_causal=True, enable_gqa=True)
    tt = [torch.tensor(a, requires_grad=True) for a in arrays]
    cos_t, sin_t = hf_rotary(positions[None])
    want = block(*tt, cos_t, sin_t, lambda x, c, s: hf_apply_rotary_pos_emb(x, x, c, s)[0],
                 torch.nn.functional.scaled_dot_product_attention)
    want.backward(torch.tensor(up))
    ts = [tl.tensor(a, requires_grad=True) for a in arrays]

    def go():
        y = block(*ts, *nn.RotaryEmbedding(D, 64)(tl.tensor(positions)), F.apply_rotary_pos_emb,
                  F.scaled_dot_product_attention)
        y.backward(gradient=tl.tensor(up))
        return y.numpy()
    n, got = flash_count(go)
    assert n == 1, f"FlashAttention fired {n} times"
    close(got, want, "output")
    for name, l, t in zip(("dx", "dwq", "dwk", "dwv"), ts, tt):
        close(l.grad, t.grad, name, TOL["grad"])


def test_gqa_errors_say_how_to_fix():
    q, k = tl.ones(1, 6, 2, 4), tl.ones(1, 4, 2, 4)
    with pytest.raises(RuntimeError, match="q has 6 heads, k 4 and v 4.*enable_gqa=True, k and v need one head "
                                           "count that divides q's"):
        F.scaled_dot_product_attention(q, k, k, enable_gqa=True)
    with pytest.raises(RuntimeError, match="head counts differ, so pass enable_gqa=True"):
        F.scaled_dot_product_attention(tl.ones(1, 4, 2, 4), tl.ones(1, 2, 2, 4), tl.ones(1, 2, 2, 4))


def test_rotary_gather_replays_for_every_position():
    """A decode step's position is a tensor argument: tinyllm.jit replays one recorded graph for each of them."""
    rot = nn.RotaryEmbedding(D, 64)
    x = tl.tensor(rng(12).standard_normal((H, 1, D)).astype(np.float32))
    step = tl.jit(lambda x, pos: F.apply_rotary_pos_emb(x, *rot(pos)))
    for p in (0, 7, 3, 40, 12, 63):
        cos, sin = hf_rotary(np.array([[p]]))
        want = hf_apply_rotary_pos_emb(torch.tensor(x.numpy()), torch.tensor(x.numpy()), cos, sin)[0][0]
        close(step(x, tl.tensor(np.array([p]))), want, f"replayed rotation at position {p}")
