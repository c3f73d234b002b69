"""tinyllm's Llama against Hugging Face's LlamaForCausalLM holding the same weights: state-dict names both ways,
logits, loss and every gradient on every runtime, 50 AdamW steps, greedy generation (cached, uncached and
speculative), Meta's interleaved rotary layout, FlashAttention firing, and the config's errors.

Metric: rel(a, b) = ‖a − b‖₂ / ‖b‖₂ over the whole array (b is HF's value); for the scalar loss, |a − b| / |b|.
"""
import numpy as np
import pytest
import torch
import transformers  # the test extra's reference: missing, this module fails (never skips)

import tinyllm as tl
from helpers import rel, spread_weights
from tinyllm.graph import toposort
from tinyllm.models.llama import Llama, LlamaConfig

pytestmark = pytest.mark.usefixtures("one_torch_thread")
each_runtime = pytest.mark.usefixtures("each_runtime")  # the forward, backward and decode step on every runtime;
# the rest (the same graphs again) on the default one

LOGITS_RTOL = 1e-4  # the bound; float32 through 2 layers measures ~3e-7
GRAD_RTOL = 1e-3    # measured ~7e-7
DRIFT_RTOL = 1e-3   # 50 AdamW steps: the losses agree to 0.1 % at every step
HF = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
          num_key_value_heads=2, max_position_embeddings=32, rope_theta=10000.0)


def hf_model(seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(**{**HF, **overrides}, attn_implementation="eager")
    return transformers.LlamaForCausalLM(cfg).float()


def make_pair(seed=0, spread=True, **overrides):
    """HF's model (weights spread so every nonlinearity sees O(1) inputs: HF's std-0.02 init keeps them near 0)
    and tinyllm's Llama loaded from its state dict with load_state_dict(strict=True)."""
    ref = hf_model(seed, **overrides)
    model = Llama(LlamaConfig.from_hf(ref.config))
    if spread:
        spread_weights(model, seed)
        ref.load_state_dict({k: torch.from_numpy(np.array(v.numpy())) for k, v in model.state_dict().items()})
    else:
        model.load_state_dict(ref.state_dict(), strict=True)
    return model, ref


def tokens(rng, shape, vocab=HF["vocab_size"]):
    return rng.integers(0, vocab, shape)


def test_state_dict_names_and_shapes_are_hfs():
    model, ref = make_pair(spread=False)
    assert list(model.state_dict()) == list(ref.state_dict())
    for k, v in ref.state_dict().items():
        assert model.state_dict()[k].shape == tuple(v.shape), k
    assert model.num_parameters() == sum(p.numel() for p in ref.parameters())
    tied, ref_tied = make_pair(spread=False, tie_word_embeddings=True)
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    assert tied.num_parameters() == sum(p.numel() for p in ref_tied.parameters())


@each_runtime
def test_logits_loss_and_every_gradient_match_hf():
    model, ref = make_pair()
    rng = np.random.default_rng(1)
    x, y = tokens(rng, (2, 12)), tokens(rng, (2, 12))
    logits, loss = model(tl.tensor(x), tl.tensor(y))
    loss.backward()
    out = ref(torch.from_numpy(x))
    tloss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, HF["vocab_size"]), torch.from_numpy(y).reshape(-1))
    tloss.backward()
    logits_err = rel(logits.numpy(), out.logits.detach().numpy())
    assert logits_err <= LOGITS_RTOL
    assert abs(loss.item() - tloss.item()) <= LOGITS_RTOL * abs(tloss.item())
    tparams = dict(ref.named_parameters())
    errs = {}
    for name, p in model.named_parameters():
        tg = tparams[name].grad.numpy()
        assert np.linalg.norm(tg) > 0, f"HF's gradient of {name} is zero: the check would be vacuous"
        errs[name] = rel(p.grad.numpy(), tg)
        assert errs[name] <= GRAD_RTOL, name
    worst = max(errs, key=errs.get)
    print(f"\n[parity] logits {logits_err:.1e}, worst gradient {errs[worst]:.1e} ({worst})")


def test_adamw_training_tracks_hf():
    """50 AdamW steps on a learnable task (a fixed bigram map): the losses agree at every step."""
    model, ref = make_pair(seed=5, spread=False)
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=3e-3)
    topt = torch.optim.AdamW([{"params": [p for p in ref.parameters() if p.ndim >= 2], "weight_decay": 0.1},
                              {"params": [p for p in ref.parameters() if p.ndim < 2], "weight_decay": 0.0}],
                             lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
    rng = np.random.default_rng(6)
    drift, losses = [], []
    for _ in range(50):
        x = tokens(rng, (2, 16))
        y = (7 * x + 3) % HF["vocab_size"]
        _, loss = model(tl.tensor(x), tl.tensor(y))
        loss.backward()
        opt.step()
        opt.zero_grad()
        logits = ref(torch.from_numpy(x)).logits
        tloss = torch.nn.functional.cross_entropy(logits.reshape(-1, HF["vocab_size"]), torch.from_numpy(y).reshape(-1))
        tloss.backward()
        topt.step()
        topt.zero_grad()
        losses.append(tloss.item())
        drift.append(abs(loss.item() - tloss.item()) / abs(tloss.item()))
    assert losses[-1] < losses[0] - 0.5, f"the loss did not fall: {losses[0]:.3f} -> {losses[-1]:.3f}"
    print(f"\n[parity] loss {losses[0]:.3f} -> {losses[-1]:.3f} over 50 steps, max drift {max(drift):.2e}")
    assert max(drift) <= DRIFT_RTOL, f"loss drift {max(drift):.2e}"


def greedy_pair(seed=2):
    model, ref = make_pair(seed=seed)
    model.eval()
    prompt = tokens(np.random.default_rng(seed + 1), (1, 5))
    want = ref.generate(torch.from_numpy(prompt), max_new_tokens=8, do_sample=False).numpy()
    return model, tl.tensor(prompt), want


@each_runtime
def test_cached_greedy_generation_equals_hfs():
    model, prompt, want = greedy_pair()
    np.testing.assert_array_equal(model.generate(prompt, 8, temperature=0).numpy(), want)


def test_uncached_and_speculative_greedy_generation_equal_hfs():
    model, prompt, want = greedy_pair()
    np.testing.assert_array_equal(model.generate(prompt, 8, temperature=0, use_cache=False).numpy(), want)
    tl.manual_seed(4)
    draft = Llama(model.config)  # an untrained draft: most of its guesses are rejected
    got = model.generate(prompt, 8, temperature=0, draft_model=draft, num_speculative_tokens=3).numpy()
    np.testing.assert_array_equal(got, want)
    assert model.speculative_stats["proposed"] > 0


def test_generation_past_max_positions_recomputes_the_window():
    """Past max_position_embeddings the context is the last window, positions restarting at 0: the cached steps
    must equal the uncached ones."""
    model, _ = make_pair(seed=6, max_position_embeddings=8)
    model.eval()
    prompt = tl.tensor(tokens(np.random.default_rng(7), (2, 3)))
    cached = model.generate(prompt, 9, temperature=0).numpy()
    np.testing.assert_array_equal(cached, model.generate(prompt, 9, temperature=0, use_cache=False).numpy())


def test_metas_interleaved_layout_equals_hfs_rotate_half():
    """Meta's checkpoints rotate pairs (2i, 2i + 1); HF's conversion permutes the rows of q_proj and k_proj so
    that rotate-half pairs (i, i + d/2) hold the same values. Undoing that permutation and rotating interleaved
    must give HF's logits."""
    model, ref = make_pair(seed=8)
    cfg = LlamaConfig.from_hf(ref.config)
    cfg.rope_interleaved = True
    meta = Llama(cfg)
    d = cfg.head_dim
    to_meta = np.stack([np.arange(d // 2), np.arange(d // 2) + d // 2], 1).reshape(-1)  # row 2i <- i, 2i+1 <- i+d/2
    state = {}
    for k, v in model.state_dict().items():
        v = v.numpy()
        if k.endswith(("q_proj.weight", "k_proj.weight")):
            heads = v.shape[0] // d
            v = v.reshape(heads, d, -1)[:, to_meta].reshape(v.shape)
        state[k] = v
    meta.load_state_dict(state)
    x = tokens(np.random.default_rng(9), (2, 10))
    want = ref(torch.from_numpy(x)).logits.detach().numpy()
    assert rel(meta(tl.tensor(x))[0].numpy(), want) <= LOGITS_RTOL
    assert rel(model(tl.tensor(x))[0].numpy(), want) <= LOGITS_RTOL


def test_flash_attention_fires_in_the_training_graph():
    from tinyllm.rewrite import flash
    from tinyllm.rewrite.pipeline import pipeline
    assert flash.ENABLED, "run without TINYLLM_FLASH=0"
    model, _ = make_pair(spread=False)
    x = tokens(np.random.default_rng(10), (2, 8))
    _, loss = model(tl.tensor(x), tl.tensor(x))
    (root,) = pipeline([loss.node], "differentiate", None)
    assert sum(n.op == "FLASH_ATTN" for n in toposort([root])) == HF["num_hidden_layers"]


def test_config_errors():
    with pytest.raises(ValueError, match="num_key_value_heads 3 must divide num_attention_heads 4"):
        LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=3)
    with pytest.raises(ValueError, match="divisible"):
        LlamaConfig(hidden_size=66, num_attention_heads=4)
    with pytest.raises(NotImplementedError, match="rope_type 'llama3'"):
        LlamaConfig.from_hf({**HF, "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}})
    model = Llama(LlamaConfig(**{**HF, "max_position_embeddings": 8}))
    with pytest.raises(ValueError, match="max_position_embeddings 8"):
        model(tl.tensor(np.zeros((1, 9), np.int64)))


def test_from_hf_refuses_other_families_and_a_sliding_window():
    """A GPT-2 model or a Mistral config with a sliding window loaded as a Llama would silently compute something
    else (a default-size Llama, logits that differ past the window): each is a clear error. A Mistral without a
    window is a Llama, and loads."""
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=16))
    with pytest.raises(ValueError, match="a 'gpt2' config, not a Llama's.*tinyllm.models.GPT"):
        Llama.from_hf(gpt2)
    mistral = transformers.MistralConfig(**HF, sliding_window=16)
    with pytest.raises(NotImplementedError, match="sliding_window=16"):
        LlamaConfig.from_hf(mistral)
    assert LlamaConfig.from_hf(transformers.MistralConfig(**HF, sliding_window=None)).hidden_size == HF["hidden_size"]


def test_lora_on_llama_matches_peft():
    """lora.apply on q_proj and v_proj against peft's LoraConfig on HF's model: logits and the gradients of every A
    and B (B set nonzero so dA is not trivially zero), the adapters' names peft's own."""
    import peft
    from tinyllm.nn import lora
    model, ref = make_pair(seed=11)
    lora.apply(model, r=4, alpha=8, targets=("q_proj", "v_proj"))
    rng = np.random.default_rng(12)
    for layer in lora.layers(model).values():
        layer.lora_B.weight.copy_(rng.normal(0, 0.2, layer.lora_B.weight.shape).astype(np.float32))
    adapters = {k: v.numpy() for k, v in lora.state_dict(model).items()}
    pm = peft.get_peft_model(ref, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                  target_modules=["q_proj", "v_proj"]))
    prefixed = {f"base_model.model.{k}": torch.from_numpy(np.array(v)) for k, v in adapters.items()}
    assert set(peft.get_peft_model_state_dict(pm)) == set(prefixed)
    assert not peft.set_peft_model_state_dict(pm, prefixed).unexpected_keys
    x, y = tokens(rng, (2, 10)), tokens(rng, (2, 10))
    logits, loss = model(tl.tensor(x), tl.tensor(y))
    loss.backward()
    out = pm(input_ids=torch.from_numpy(x)).logits
    torch.nn.functional.cross_entropy(out.reshape(-1, HF["vocab_size"]), torch.from_numpy(y).reshape(-1)).backward()
    assert rel(logits.numpy(), out.detach().numpy()) <= LOGITS_RTOL
    grads = {k.replace(".default", "").removeprefix("base_model.model."): p.grad.numpy()
             for k, p in pm.named_parameters() if p.requires_grad}
    assert set(grads) == set(adapters)
    for name, p in lora.state_dict(model).items():
        assert np.linalg.norm(grads[name]) > 0, name
        assert rel(p.grad.numpy(), grads[name]) <= GRAD_RTOL, name
