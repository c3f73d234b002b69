"""LoRA (tinyllm/nn/lora.py) against peft's on the same base weights and adapter values: outputs and the adapters'
gradients on every runtime, on a float and on a quantized base (QLoRA: peft on the dequantized weights); the
wrapped model unchanged at the start; merge / unmerge; save / load; every error for bad use.

Tolerances (rel(a, b) = ‖a − b‖₂ / ‖b‖₂, b the reference): logits 1e-5 (float32 forward through 2 blocks, the same
ops rounded in another order: ~1e-7 measured); gradients of A and B 1e-4 (float32 backward, sums in another
order: ~1e-6 measured); merged against unmerged logits 1e-5 (W + (α/r)·B A rounds once more in float32).
"""
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import tinyllm as tl
from tinyllm import nn, quantization as Q
from tinyllm.models.gpt import GPT, GPTConfig
from tinyllm.nn import lora
from tinyllm.utils import safetensors
from conftest import RUNTIMES, wgsl_skip_reason
from helpers import rel, spread_weights, reference_runtime  # noqa: F401 (autouse: numpy by default)

import torch_nanogpt as ref

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VALUE_RTOL, GRAD_RTOL, MERGE_RTOL = 1e-5, 1e-4, 1e-5
CFG = dict(n_layer=2, n_head=2, n_embd=32, block_size=8, vocab_size=65)
TARGETS = ("c_attn", "c_proj")
R, ALPHA = 4, 8
RNG = np.random.default_rng(0)
X, Y = RNG.integers(0, CFG["vocab_size"], (2, CFG["block_size"])), RNG.integers(0, CFG["vocab_size"], (2, 8))
WRAPPED = {f"transformer.h.{i}.{n}" for i in range(2) for n in ("attn.c_attn", "attn.c_proj", "mlp.c_proj")}


def gpt(seed=0, device=None, **overrides):
    """A small GPT whose weights put O(1) values through every nonlinearity (helpers.spread_weights)."""
    tl.manual_seed(seed)
    model = GPT(GPTConfig(**{**CFG, **overrides}))
    spread_weights(model, seed)
    return model.to(device) if device else model


def set_b(model, seed=1, std=0.2):
    """Nonzero B matrices (they start at zero, which makes dA zero and merge a no-op: vacuous checks)."""
    rng = np.random.default_rng(seed)
    for m in lora.layers(model).values():
        m.lora_B.weight.copy_(rng.normal(0, std, m.lora_B.weight.shape).astype(np.float32))


def run(model, device=None):
    """(logits, loss) of the fixed batch, as NumPy / float."""
    logits, loss = model(tl.tensor(X, device=device), tl.tensor(Y, device=device))
    return logits, loss


def peft_model(base_state, adapters, r=R, alpha=ALPHA, targets=TARGETS):
    """torch's nanoGPT holding `base_state`, wrapped by peft's LoRA holding `adapters` (our keys)."""
    import peft  # the test extra's reference: missing, these tests fail (never skip)
    torch.manual_seed(0)
    tmodel = ref.GPT(ref.GPTConfig(**CFG))
    tmodel.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in base_state.items()})  # strict: same names
    pm = peft.get_peft_model(tmodel, peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0,
                                                     target_modules=list(targets)))
    prefixed = {f"base_model.model.{k}": torch.from_numpy(np.array(v)) for k, v in adapters.items()}
    assert set(peft.get_peft_model_state_dict(pm)) == set(prefixed), "adapter keys differ from peft's"
    result = peft.set_peft_model_state_dict(pm, prefixed)
    assert not result.unexpected_keys
    return pm


def compare_with_peft(model, base_state, device=None):
    logits, loss = run(model, device)
    loss.backward()
    adapters = {k: v.numpy() for k, v in lora.state_dict(model).items()}
    pm = peft_model(base_state, adapters)
    tlogits, tloss = pm(torch.from_numpy(X), torch.from_numpy(Y))
    tloss.backward()
    assert rel(logits.numpy(), tlogits.detach().numpy()) <= VALUE_RTOL
    assert abs(loss.item() - tloss.item()) <= VALUE_RTOL * abs(tloss.item())
    tgrads = {k.replace(".default", "").removeprefix("base_model.model."): p.grad.numpy()
              for k, p in pm.named_parameters() if p.requires_grad}
    assert set(tgrads) == set(adapters)
    for name, p in lora.state_dict(model).items():
        assert np.linalg.norm(tgrads[name]) > 0, f"peft's gradient of {name} is zero: the check would be vacuous"
        assert rel(p.grad.numpy(), tgrads[name]) <= GRAD_RTOL, name
    frozen = [n for n, p in pm.named_parameters() if not p.requires_grad and p.grad is not None]
    assert not frozen


def base_state(model):
    return {k: v.numpy() for k, v in model.state_dict().items()}


# ---- wrapping --------------------------------------------------------------------------------------------------
def test_apply_wraps_the_targets_keeps_names_freezes_the_rest_and_changes_nothing_at_the_start():
    model = gpt()
    before = run(model)[0].numpy()
    names = list(model.state_dict())
    lm_head = model.lm_head
    assert lora.apply(model, r=R, alpha=ALPHA, targets=TARGETS) is model
    assert set(lora.layers(model)) == WRAPPED
    assert np.array_equal(run(model)[0].numpy(), before)  # B = 0: exactly the base model
    adapter_keys = [f"{n}.lora_{ab}.weight" for n in sorted(WRAPPED) for ab in "AB"]
    assert sorted(model.state_dict()) == sorted(names + adapter_keys)  # the base keys are unchanged
    assert [id(p) for p in model.parameters() if p.requires_grad] == [id(p) for p in lora.parameters(model)]
    assert len(lora.parameters(model)) == 2 * len(WRAPPED)
    assert model.lm_head is lm_head and model.lm_head.weight is model.transformer.wte.weight  # untouched, tied
    layer = model.transformer.h[0].attn.c_attn
    assert isinstance(layer, lora.LoRALinear) and layer.scaling == ALPHA / R
    assert layer.lora_A.weight.shape == (R, 32) and layer.lora_B.weight.shape == (96, R)
    a = layer.lora_A.weight.numpy()
    assert np.abs(a).max() <= 1 / np.sqrt(32) and a.std() > 0.5 / np.sqrt(3 * 32)  # Kaiming-uniform(a=√5)
    assert not layer.lora_B.weight.numpy().any()


def test_lm_head_is_wrapped_only_when_named_and_stays_tied():
    model = gpt()
    lora.apply(model, r=2, alpha=2, targets=("lm_head",))
    assert isinstance(model.lm_head, lora.LoRALinear) and model.lm_head.weight is model.transformer.wte.weight
    assert not model.transformer.wte.weight.requires_grad
    set_b(model)
    with pytest.raises(RuntimeError, match="lm_head.weight is tied to transformer.wte.weight"):
        lora.merge(model)


def test_apply_again_wraps_more_layers_and_keeps_the_first_adapters_training():
    model = gpt()
    lora.apply(model, r=R, alpha=ALPHA, targets=("c_attn",))
    lora.apply(model, r=2, alpha=4, targets=("c_fc",))
    assert [id(p) for p in model.parameters() if p.requires_grad] == [id(p) for p in lora.parameters(model)]
    assert len(lora.parameters(model)) == 8


# ---- against peft ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", RUNTIMES)
def test_output_and_adapter_gradients_match_peft(device):
    if device == "wgsl" and not os.environ.get("CI") and wgsl_skip_reason():
        pytest.skip(wgsl_skip_reason())
    model = gpt(device=device)
    base = base_state(model)
    lora.apply(model, r=R, alpha=ALPHA, targets=TARGETS)
    set_b(model)
    compare_with_peft(model, base, device)


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_qlora_adapter_gradients_match_peft_on_the_dequantized_weights(fmt):
    model = gpt()
    Q.quantize_(model, fmt, 32)
    base = base_state(model)  # the float parameters; the quantized layers' weights are their dequantized values
    for name, layer in Q.quantized_layers(model).items():
        base[f"{name}.weight"] = layer.dequantized_weight()
    lora.apply(model, r=R, alpha=ALPHA, targets=TARGETS)
    layer = model.transformer.h[0].attn.c_attn
    assert isinstance(layer, lora.QuantizedLoRALinear) and isinstance(layer, Q.QuantizedLinear)
    assert set(Q.quantized_layers(model)) >= WRAPPED  # still seen as quantized (save, model_nbytes)
    set_b(model)
    compare_with_peft(model, base)
    assert layer.weight.grad is None and not layer.weight.requires_grad
    with pytest.raises(RuntimeError, match=f"base of .* is quantized \\({fmt}, group 32\\)"):
        lora.merge(model)


@settings(max_examples=15)
@given(k=st.integers(1, 6), n=st.integers(1, 6), r=st.integers(1, 4), alpha=st.sampled_from([1, 4, 16, 0.5]),
       lead=st.lists(st.integers(1, 3), max_size=2), bias=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_lora_linear_is_the_formula_and_merge_round_trips(k, n, r, alpha, lead, bias, seed):
    """y = x Wᵀ + b + (α/r)·x Aᵀ Bᵀ, its gradients those of torch's same expression, for any shapes; merge folds it
    into W (same y), unmerge restores W."""
    rng = np.random.default_rng(seed)
    tl.manual_seed(seed)
    layer = nn.Linear(k, n, bias=bias)
    w0 = layer.weight.numpy()
    holder = nn.ModuleList([layer])
    lora.apply(holder, r=r, alpha=alpha, targets=("0",))
    m = holder[0]
    m.lora_B.weight.copy_(rng.normal(0, 1, (n, r)).astype(np.float32))
    x = rng.normal(0, 1, (*lead, k)).astype(np.float32)
    y = m(tl.tensor(x))
    (y * y).sum().backward()
    tx = torch.from_numpy(x)
    tw, ta, tb = (torch.from_numpy(p.numpy()).requires_grad_(p.requires_grad)
                  for p in (m.weight, m.lora_A.weight, m.lora_B.weight))
    ty = tx @ tw.T + (alpha / r) * (tx @ ta.T) @ tb.T
    if bias:
        ty = ty + torch.from_numpy(m.bias.numpy())
    (ty * ty).sum().backward()
    assert rel(y.numpy(), ty.detach().numpy()) <= VALUE_RTOL
    assert rel(m.lora_A.weight.grad.numpy(), ta.grad.numpy()) <= GRAD_RTOL
    assert rel(m.lora_B.weight.grad.numpy(), tb.grad.numpy()) <= GRAD_RTOL
    assert m.weight.grad is None
    lora.merge(holder)
    assert rel(m(tl.tensor(x)).numpy(), ty.detach().numpy()) <= MERGE_RTOL
    lora.unmerge(holder)
    np.testing.assert_allclose(m.weight.numpy(), w0, rtol=0, atol=1e-5 * (1 + np.abs(m.delta_weight().numpy()).max()))


# ---- dropout ---------------------------------------------------------------------------------------------------
def test_dropout_applies_to_the_adapter_input_in_training_only():
    """With A = [1 … 1] (r = 1), B = [1 … 1]ᵀ and α = r, the adapter adds to each output the sum of its row of
    dropout(x): for x = 1, (number of kept inputs)/(1 − p), which only dropout on the input (not on A x) spreads
    between 0 and in/(1 − p)."""
    tl.manual_seed(0)
    holder = nn.ModuleList([nn.Linear(8, 4)])
    lora.apply(holder, r=1, alpha=1, dropout=0.25, targets=("0",))
    m = holder[0]
    x = tl.ones(512, 8)
    base = m._base_forward(x).numpy()
    assert np.array_equal(m(x).numpy(), base)  # B = 0: dropout or not, the output is the base's
    m.lora_A.weight.copy_(np.ones((1, 8), np.float32))
    m.lora_B.weight.copy_(np.ones((4, 1), np.float32))
    holder.eval()
    np.testing.assert_allclose(m(x).numpy() - base, 8.0, rtol=1e-5)
    holder.train()
    kept = (m(x).numpy() - base) * 0.75
    np.testing.assert_allclose(kept, np.rint(kept), atol=1e-4)
    kept = np.rint(kept).astype(int)
    assert np.all(kept == kept[:, :1])  # one mask per input row, shared by every output
    counts = np.bincount(kept[:, 0], minlength=9)
    # Binomial(8, 0.75) kept inputs: mean 6, P(4..8) = 0.09, 0.21, 0.31, 0.27, 0.10
    assert (counts[4:9] > 20).all() and abs(kept.mean() / 6 - 1) < 0.05


# ---- merge -----------------------------------------------------------------------------------------------------
def test_merged_logits_equal_unmerged_and_unmerge_restores_the_weights():
    model = gpt()
    lora.apply(model, r=R, alpha=ALPHA, targets=TARGETS)
    set_b(model)
    weights = {n: m.weight.numpy() for n, m in lora.layers(model).items()}
    unmerged = run(model)[0].numpy()
    assert rel(unmerged, run(gpt())[0].numpy()) > 1e-3  # the adapters change the output (else vacuous)
    assert lora.merge(model) is model
    assert all(m.merged for m in lora.layers(model).values())
    assert rel(run(model)[0].numpy(), unmerged) <= MERGE_RTOL
    assert not np.array_equal(model.transformer.h[0].attn.c_attn.weight.numpy(), weights["transformer.h.0.attn.c_attn"])
    with pytest.raises(RuntimeError, match="transformer.h.0.attn.c_attn is already merged .*unmerge"):
        lora.merge(model)
    assert lora.unmerge(model) is model
    for n, m in lora.layers(model).items():
        np.testing.assert_allclose(m.weight.numpy(), weights[n], rtol=0, atol=1e-6)
    with pytest.raises(RuntimeError, match="is not merged .*lora.merge"):
        lora.unmerge(model)
    with pytest.raises(RuntimeError, match="no LoRA layers: call lora.apply"):
        lora.merge(gpt())


def test_merge_keeps_a_bfloat16_weight_bfloat16():
    tl.manual_seed(0)
    holder = nn.ModuleList([nn.Linear(8, 8)]).to(tl.bfloat16)
    lora.apply(holder, r=2, alpha=2, targets=("0",))
    m = holder[0]
    assert m.lora_A.weight.dtype is tl.bfloat16
    set_b(holder)
    lora.merge(holder)
    assert m.weight.dtype is tl.bfloat16


# ---- save / load -----------------------------------------------------------------------------------------------
def test_save_writes_the_adapters_alone_with_their_config_and_load_rebuilds_them(tmp_path):
    model = gpt()
    lora.apply(model, r=R, alpha=ALPHA, targets=TARGETS)
    set_b(model)
    want = run(model)[0].numpy()
    path = tmp_path / "adapter.safetensors"
    lora.save(model, path)
    arrays, meta = safetensors.load_file(path), safetensors.load_metadata(path)
    sd = lora.state_dict(model)
    assert set(arrays) == set(sd) and all(np.array_equal(arrays[k], v.numpy()) for k, v in sd.items())
    assert meta["format"] == lora.FILE_FORMAT
    import json
    (group,) = json.loads(meta["config"])
    assert group["r"] == R and group["lora_alpha"] == ALPHA and group["lora_dropout"] == 0.0
    assert set(group["target_modules"]) == WRAPPED
    fresh = gpt()  # unwrapped: load applies from the file's config
    assert lora.load(fresh, path) is fresh
    assert set(lora.layers(fresh)) == WRAPPED and np.array_equal(run(fresh)[0].numpy(), want)
    wrapped = gpt()
    lora.apply(wrapped, r=R, alpha=ALPHA, targets=TARGETS)
    lora.load(wrapped, path)
    assert np.array_equal(run(wrapped)[0].numpy(), want)


def test_save_is_atomic(tmp_path, monkeypatch):
    model = gpt()
    lora.apply(model, r=R, alpha=ALPHA, targets=("c_attn",))
    path = tmp_path / "adapter.safetensors"
    lora.save(model, path)
    old = path.read_bytes()
    set_b(model)

    def crash(*args):
        raise OSError("disk full")
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        lora.save(model, path)
    assert path.read_bytes() == old and os.listdir(tmp_path) == ["adapter.safetensors"]


def test_load_refuses_other_shapes_naming_the_key_and_changes_nothing(tmp_path):
    model = gpt()
    lora.apply(model, r=R, alpha=ALPHA, targets=TARGETS)
    path = tmp_path / "adapter.safetensors"
    lora.save(model, path)
    other_r = gpt()
    lora.apply(other_r, r=2, alpha=ALPHA, targets=TARGETS)
    before = {k: v.numpy() for k, v in lora.state_dict(other_r).items()}
    with pytest.raises(ValueError, match=r"transformer.h.0.attn.c_attn.lora_A.weight has shape \(4, 32\) in .* but "
                                         r"\(2, 32\) in the model"):
        lora.load(other_r, path)
    assert all(np.array_equal(v.numpy(), before[k]) for k, v in lora.state_dict(other_r).items())
    wider = gpt(n_embd=64)
    with pytest.raises(ValueError, match=r"lora_A.weight has shape \(4, 32\) in .* but \(4, 64\) in the model"):
        lora.load(wider, path)
    assert not lora.layers(wider)  # not half wrapped
    other_alpha = gpt()
    lora.apply(other_alpha, r=R, alpha=2 * ALPHA, targets=TARGETS)
    with pytest.raises(ValueError, match="lora_alpha 8 in .* but 16 in the model"):
        lora.load(other_alpha, path)
    fewer = gpt()
    lora.apply(fewer, r=R, alpha=ALPHA, targets=("c_attn",))
    with pytest.raises(RuntimeError, match="does not hold the model's adapters: missing .*unexpected"):
        lora.load(fewer, path)
    merged = gpt()
    lora.load(merged, path)
    lora.merge(merged)
    with pytest.raises(RuntimeError, match="is merged .*unmerge"):
        lora.load(merged, path)
    not_lora = tmp_path / "weights.safetensors"
    safetensors.save_file({"x": np.zeros(2, np.float32)}, not_lora, metadata={"format": "other"})
    with pytest.raises(ValueError, match="not a LoRA adapter file"):
        lora.load(gpt(), not_lora)
    with pytest.raises(RuntimeError, match="no LoRA adapters: call lora.apply"):
        lora.save(gpt(), tmp_path / "none.safetensors")


# ---- bad input -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, error, match", [
    (dict(targets=("q_proj",)), ValueError, r"target 'q_proj' matches no module of GPT; its 9 Linear layers "
                                            r"are transformer.h.0.attn.c_attn, .*last names: c_attn, c_fc, c_proj, "
                                            r"lm_head"),
    (dict(targets=("attn",)), TypeError, "target .attn. matches transformer.h.0.attn, a CausalSelfAttention; LoRA "
                                         "wraps nn.Linear"),
    (dict(targets=()), TypeError, "targets must be module names"),
    (dict(targets=(3,)), TypeError, "targets must be module names"),
    (dict(r=0), ValueError, "r .* must be a positive int, got 0"),
    (dict(r=-2), ValueError, "r .* must be a positive int, got -2"),
    (dict(r=2.5), ValueError, "r .* must be a positive int, got 2.5"),
    (dict(alpha=0), ValueError, "alpha must be a positive number"),
    (dict(alpha=-1.0), ValueError, "alpha must be a positive number"),
    (dict(dropout=1.0), ValueError, r"dropout must be a probability in \[0, 1\), got 1.0"),
    (dict(dropout=-0.1), ValueError, r"dropout must be a probability in \[0, 1\)"),
])
def test_bad_arguments_are_clear_errors_before_anything_changes(kwargs, error, match):
    model = gpt()
    with pytest.raises(error, match=f"lora.apply: {match}"):
        lora.apply(model, **{**dict(r=R, alpha=ALPHA, targets=("c_attn", "c_fc")), **kwargs})
    assert not lora.layers(model) and all(p.requires_grad for p in model.parameters())


def test_wrapping_a_layer_twice_is_an_error():
    model = gpt()
    lora.apply(model, r=R, alpha=ALPHA, targets=("c_attn",))
    with pytest.raises(RuntimeError, match=r"transformer.h.0.attn.c_attn already has a LoRA adapter \(r=4\)"):
        lora.apply(model, r=R, alpha=ALPHA, targets=("c_fc", "attn.c_attn"))
    assert set(lora.layers(model)) == {"transformer.h.0.attn.c_attn", "transformer.h.1.attn.c_attn"}
    with pytest.raises(ValueError, match="target 'lora_A' matches no module"):  # (the adapters are not targets)
        lora.apply(model, targets=("lora_A",))
    with pytest.raises(TypeError, match="LoRALinear wraps a Linear, got a QuantizedLinear: use lora.apply"):
        lora.LoRALinear(Q.QuantizedLinear.from_linear(nn.Linear(32, 8), "int8"), r=2)


def test_module_requires_grad_freezes_and_unfreezes_every_parameter_keeping_ties():
    model = gpt()
    assert model.requires_grad_(False) is model
    assert not any(p.requires_grad for p in model.parameters())
    assert model.lm_head.weight is model.transformer.wte.weight
    _, loss = run(model)
    assert not loss.requires_grad
    model.requires_grad_()
    assert all(p.requires_grad for p in model.parameters())


def test_quantize_and_quantized_load_refuse_a_model_with_adapters(tmp_path):
    """Both replace Linear layers: an adapter would be dropped (load) or its base left in float32 (quantize_)."""
    model = Q.quantize_(gpt(), "int8")
    Q.save(model, tmp_path / "q.safetensors")
    lora.apply(model, r=2, alpha=4, targets=TARGETS)
    with pytest.raises(RuntimeError, match="has a LoRA adapter: quantize or load the base model first"):
        Q.load(model, tmp_path / "q.safetensors")
    assert set(lora.layers(model)) == WRAPPED
    with pytest.raises(RuntimeError, match="has a LoRA adapter"):
        Q.quantize_(lora.apply(gpt(), r=2, alpha=4, targets=TARGETS), "int8")


def test_configure_optimizers_leaves_the_frozen_base_out():
    model = lora.apply(gpt(), r=2, alpha=4, targets=TARGETS)
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3)
    given_ = [id(p) for g in opt.param_groups for p in g["params"]]
    assert sorted(given_) == sorted(id(p) for p in lora.parameters(model))
