"""Autocast as a graph rewrite (tinyllm/rewrite/autocast.py) against torch.autocast("cpu") on the same GPT.

Metric: rel(a, b) = ‖a − b‖₂ / ‖b‖₂ (helpers.rel), b torch's value under its own autocast.
Tolerances: bfloat16 keeps 8 significant bits (unit roundoff 2⁻⁹ ≈ 2e-3), float16 11 (2⁻¹² ≈ 2.4e-4). The two
libraries round at different places (torch once per op, tinyllm's fused C kernels once per kernel, its NumPy
reference once per primitive), so results differ by a few roundoffs accumulated over two blocks: measured ~1e-2 for
bfloat16 and ~1e-3 for float16 on spread weights. A graph check proves the pass did its job (a test of values alone
could not tell autocast from float32 at these tolerances).
"""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import tinyllm as tl
from helpers import rel, spread_weights
from tinyllm.graph import toposort
from tinyllm.models.gpt import GPT, GPTConfig
from tinyllm.rewrite import pipeline
import torch_nanogpt as ref

pytestmark = pytest.mark.usefixtures("one_torch_thread")
RUNTIMES = ["numpy", "c"]
DTYPES = [(tl.bfloat16, torch.bfloat16, 4e-2), (tl.float16, torch.float16, 5e-3)]
FP32_ONLY = {"SUM", "REDUCE_MAX", "EXP", "LOG", "RECIP", "SQRT", "POW"}


def pair(cfg, seed):
    tl.manual_seed(seed)
    model = GPT(GPTConfig(**cfg))
    spread_weights(model, seed)
    tmodel = ref.GPT(ref.GPTConfig(**cfg))
    tmodel.load_state_dict({k: torch.from_numpy(np.array(v.numpy())) for k, v in model.state_dict().items()})
    return model, tmodel


def batch(cfg, b, seed):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, cfg["vocab_size"], (b, cfg["block_size"])),
            rng.integers(0, cfg["vocab_size"], (b, cfg["block_size"])))


configs = st.fixed_dictionaries(dict(n_layer=st.integers(1, 2), n_head=st.sampled_from([1, 2]),
                                     n_embd=st.sampled_from([16, 32]), block_size=st.sampled_from([4, 8]),
                                     vocab_size=st.sampled_from([11, 65])))


@pytest.mark.parametrize("device", RUNTIMES)
@pytest.mark.parametrize("dtype,tdtype,tol", DTYPES, ids=["bfloat16", "float16"])
@settings(max_examples=4)
@given(cfg=configs, b=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_values_and_gradients_match_torch_autocast(device, dtype, tdtype, tol, cfg, b, seed):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TINYLLM_RUNTIME", device)
        check_against_torch(dtype, tdtype, tol, cfg, b, seed)


def check_against_torch(dtype, tdtype, tol, cfg, b, seed):
    model, tmodel = pair(cfg, seed)
    x, y = batch(cfg, b, seed)
    with tl.autocast(dtype=dtype):
        logits, loss = model(tl.tensor(x), tl.tensor(y))
    loss.backward()
    with torch.autocast("cpu", dtype=tdtype):
        tlogits, tloss = tmodel(torch.from_numpy(x), torch.from_numpy(y))
    tloss.backward()
    assert logits.dtype is tl.float32 and loss.dtype is tl.float32  # the front end's dtypes are kept
    assert rel(logits.numpy(), tlogits.float().detach().numpy()) <= tol
    assert abs(loss.item() - tloss.item()) <= tol * abs(tloss.item())
    tgrads = dict(tmodel.named_parameters())
    for name, p in model.named_parameters():
        assert p.grad.dtype is tl.float32, f"{name}: the master weight's gradient must stay float32"
        assert rel(p.grad.numpy(), tgrads[name].grad.numpy()) <= tol, name


@pytest.mark.parametrize("dtype", [tl.bfloat16, tl.float16], ids=["bfloat16", "float16"])
def test_the_rewritten_graph_keeps_fp32_ops_in_fp32(dtype):
    """On the graph autograd differentiates: every matmul and FlashAttention reads the low dtype (torch's
    lower-precision list), every reduction, exp, log, reciprocal and square root runs in float32, so does GELU (one op
    in torch: one rounding), FlashAttention still fires, and each weight's low copy is made inside a checkpointing
    region (recast for the backward)."""
    cfg = dict(n_layer=2, n_head=2, n_embd=32, block_size=8, vocab_size=65)
    model, _ = pair(cfg, 0)
    x, y = batch(cfg, 2, 0)
    with tl.autocast(dtype=dtype):
        _, loss = model(tl.tensor(x), tl.tensor(y))
    rewritten = pipeline.before_differentiation(loss.node)
    nodes = toposort([rewritten])
    matmuls = [n for n in nodes if n.op == "MATMUL"]
    assert matmuls and all(s.dtype is dtype for n in matmuls for s in n.src)
    fp32 = [n for n in nodes if n.op in FP32_ONLY]
    assert fp32 and all(n.dtype is tl.float32 and all(not s.dtype.is_low for s in n.src) for n in fp32)
    flash = [n for n in nodes if n.op == "FLASH_ATTN"]
    assert len(flash) == cfg["n_layer"] and all(s.dtype is dtype for n in flash for s in n.src)
    regions = [n for n in nodes if n.op == "CHECKPOINT" and n.arg[0] == "exit"]
    assert len(regions) == 4 * cfg["n_layer"] + 1  # c_attn, c_proj, c_fc, mlp.c_proj per layer; lm_head
    assert not any(n.op == "AUTOCAST" for n in nodes) and rewritten.dtype is tl.float32
    erf = [n for n in nodes if n.op == "ERF"]  # GELU: one op in torch, computed wide and rounded once here too
    assert len(erf) == cfg["n_layer"] and all(n.dtype is tl.float32 and n.src[0].dtype is tl.float32 for n in erf)
    # nothing is marked outside the region, and float32 graphs pass through untouched
    _, loss32 = model(tl.tensor(x), tl.tensor(y))
    assert not any(n.dtype.is_low for n in toposort([pipeline.before_differentiation(loss32.node)]))


def test_a_weight_is_cast_where_it_lies():
    """`x @ W.T`'s weight is cast in its own layout and then transposed (the cast commutes with the view): a cast
    of W.T would read W strided and store scattered, and would keep the weight's gradient from being computed
    untransposed (rewrite/layout.py). Every linear layer's product reads PERMUTE(CAST(W)), never CAST(PERMUTE(W))."""
    cfg = dict(n_layer=2, n_head=2, n_embd=32, block_size=8, vocab_size=65)
    model, _ = pair(cfg, 0)
    x, y = batch(cfg, 2, 0)
    with tl.autocast(dtype=tl.bfloat16):
        _, loss = model(tl.tensor(x), tl.tensor(y))
    nodes = toposort([pipeline.before_differentiation(loss.node)])
    weight_casts = [n for n in nodes if n.op == "CAST" and n.dtype is tl.bfloat16 and n.src[0].op == "CHECKPOINT"]
    assert len(weight_casts) == 4 * cfg["n_layer"] + 1
    assert all(not n.src[0].src[0].src for n in weight_casts)  # the stored weight itself, no view between
    products = [n for n in nodes if n.op == "MATMUL" and n.src[1].op == "PERMUTE"]
    assert len(products) >= 4 * cfg["n_layer"] + 1 and all(n.src[1].src[0].op == "CAST" for n in products)


@pytest.mark.parametrize("dtype", [tl.bfloat16, tl.float16], ids=["bfloat16", "float16"])
def test_autocast_rounds_against_the_float32_graph(dtype):
    """The rewritten graph against the graph it replaces: close, but not equal (the low dtype was used)."""
    cfg = dict(n_layer=1, n_head=2, n_embd=32, block_size=8, vocab_size=65)
    model, _ = pair(cfg, 1)
    x, y = batch(cfg, 2, 1)
    with tl.autocast(dtype=dtype):
        low, _ = model(tl.tensor(x), tl.tensor(y))
    full, _ = model(tl.tensor(x), tl.tensor(y))
    unit = tl.finfo(dtype).eps / 2
    assert unit / 10 < rel(low.numpy(), full.numpy()) < 40 * unit


def test_autocast_api():
    a = tl.randn(3, 4)
    with tl.autocast(dtype=tl.bfloat16):
        assert tl.is_autocast_enabled() and tl.get_autocast_dtype() is tl.bfloat16
        with tl.autocast(enabled=False):
            assert not tl.is_autocast_enabled()
            assert not any(n.op == "AUTOCAST" for n in toposort([(a @ a.T).node]))
    assert not tl.is_autocast_enabled()

    @tl.autocast("cpu", dtype=tl.float16)
    def f(x):
        return x @ x.T
    assert any(n.op == "AUTOCAST" and n.arg is tl.float16 for n in toposort([f(a).node]))
    with pytest.raises(ValueError, match="bfloat16 or tinyllm.float16"):
        tl.autocast(dtype=tl.float64)


@pytest.mark.parametrize("device", RUNTIMES)
@pytest.mark.parametrize("dtype,tdtype,_", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_16_bit_gelu_rounds_once_as_torch(device, dtype, tdtype, _, approximate):
    """F.gelu of a 16-bit tensor is computed in float32 and rounded once, as torch's gelu and its gradient: each
    value and gradient is torch's or its neighbour in the 16-bit grid (the two compute erf and tanh to a few float32
    ulp apart), where rounding each of the ops gelu is made of was up to 74 % off. Far in gelu's left tail, where
    1 + erf(x/√2) (or 1 + tanh) cancels in float32 in both, the two are apart by that cancellation: under 1e-5."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(20000) * 3).astype(np.float32)
    g = rng.standard_normal(20000).astype(np.float32)
    xt = torch.tensor(x).to(tdtype).requires_grad_(True)
    torch.nn.functional.gelu(xt, approximate=approximate).backward(torch.tensor(g).to(tdtype))
    X = tl.tensor(x, device=device).to(dtype).detach().requires_grad_(True)
    y = tl.nn.functional.gelu(X, approximate)
    y.backward(tl.tensor(g, device=device).to(dtype))
    want_y = torch.nn.functional.gelu(xt.detach(), approximate=approximate)
    for got, want in ((y, want_y), (X.grad, xt.grad)):
        got, want = got.float().numpy(), want.float().numpy()
        ulp = np.spacing(np.abs(want).astype(np.float32)) * 2.0 ** (23 - (7 if dtype is tl.bfloat16 else 10))
        off = np.abs(got - want)
        assert np.all((off <= ulp * 1.001) | (off < 1e-5)), (np.max(off / ulp), np.max(off[off > ulp * 1.001]))
