"""GPT.generate with its key/value cache (tinyllm/models/gpt.py's _Decoder), on every runtime: cached logits equal a
full forward over the same window (also past block_size, where the window slides), greedy tokens equal the uncached
ones and a torch nanoGPT's, batches, streaming, the replay of the decode step; GPTConfig(gelu=) and
GPT.from_nanogpt_checkpoint.

Metric: rel(a, b) = ‖a − b‖₂ / ‖b‖₂ over a step's (B, V) logits.
"""
import sys

import numpy as np
import pytest
import torch

import tinyllm as tl
from helpers import rel, spread_weights, wgsl_f16_or_skip
from tinyllm import realizer
from tinyllm.models import generation, gpt as gpt_module
from tinyllm.models.gpt import GPT, GPTConfig

import torch_nanogpt as ref

pytestmark = pytest.mark.usefixtures("each_runtime", "one_torch_thread")  # on numpy, c and wgsl (conftest.py)

CFG = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=65)
RTOL = {"numpy": 1e-5, "c": 1e-5, "wgsl": 1e-4}


def spread_model(seed, **overrides):
    """Weights that put O(1) values through every nonlinearity (GPT-2's init keeps them near 0, where a wrong
    position or a stale key would hide), and a torch nanoGPT holding them."""
    cfg = {**CFG, **overrides}
    tl.manual_seed(seed)
    model = GPT(GPTConfig(**cfg))
    spread_weights(model, seed)
    tmodel = ref.GPT(ref.GPTConfig(**cfg))
    tmodel.load_state_dict({k: torch.from_numpy(np.array(v.numpy(), copy=True)) for k, v in model.state_dict().items()})
    return model, tmodel


def test_cached_logits_equal_full_recomputation(each_runtime):
    """Teacher-forced: the logits the decoder gives after each appended token (prefill, cached steps, then past
    block_size the sliding window) against the model's own full forward over the last block_size tokens."""
    model, tmodel = spread_model(seed=1)
    block = CFG["block_size"]
    ids = np.random.default_rng(2).integers(0, CFG["vocab_size"], (2, block + 6))
    decoder = generation.Decoder(model, 2, model.transformer.wte.weight.device, use_cache=True)
    worst = 0.0
    with tl.no_grad():
        for L in range(3, ids.shape[1] + 1):
            got = decoder.logits(ids[:, :L]).numpy()
            window = ids[:, max(0, L - block):L]
            want = model(tl.tensor(window))[0][:, -1].numpy()
            with torch.no_grad():
                twant = tmodel(torch.from_numpy(window))[0][:, -1].numpy()
            assert rel(want, twant) <= RTOL[each_runtime]
            err = rel(got, want)
            assert err <= RTOL[each_runtime], f"step with {L} tokens: cached logits {err:.2e} from recomputation"
            worst = max(worst, err)
    print(f"\n[generate] {each_runtime}: worst cached-vs-recomputed logits rel err {worst:.2e}")


def test_caches_grow_with_the_sequence_and_keep_their_logits(each_runtime, monkeypatch):
    """The caches start at MIN_SLOTS slots and double (to a block of 160: 64, 128, then 160) as the sequence fills
    them: teacher-forced logits across each growth equal the full forward's, and a second sequence reuses the grown
    caches: nothing shrinks and the decode step's Python does not run again (its recordings are kept)."""
    block = 160
    model, _ = spread_model(seed=3, block_size=block)
    device = model.transformer.wte.weight.device
    ids = np.random.default_rng(4).integers(0, CFG["vocab_size"], (1, 150))
    decoder = generation.Decoder(model, 1, device, use_cache=True)
    assert decoder.caches[0].shape[2] == generation.MIN_SLOTS == 64
    sizes, checked = [], 0
    with tl.no_grad():
        for L in range(2, ids.shape[1] + 1):
            got = decoder.logits(ids[:, :L]).numpy()
            sizes.append(decoder.caches[0].shape[2])
            assert decoder.caches[1].shape[2] == sizes[-1] >= L
            if L in (30, 64, 65, 128, 129, ids.shape[1]):  # (each length a new forward: a few, at the growths)
                want = model(tl.tensor(ids[:, :L]))[0][:, -1].numpy()
                err = rel(got, want)
                assert err <= RTOL[each_runtime], f"{L} tokens, {sizes[-1]} slots: cached logits {err:.2e} off"
                checked += 1
        assert sorted(set(sizes)) == [64, 128, 160], sorted(set(sizes))
        decodes = []
        decode = gpt_module.Block.decode
        monkeypatch.setattr(gpt_module.Block, "decode", lambda self, *a: decodes.append(1) or decode(self, *a))
        decoder.length = None  # a new sequence, as generate() starts one
        for L in range(3, 12):
            got = decoder.logits(ids[:, :L]).numpy()
        assert decoder.caches[0].shape[2] == 160, "a new sequence shrank the caches"
        assert not decodes, "the next sequence ran the decode step's Python again"
        assert rel(got, model(tl.tensor(ids[:, :11]))[0][:, -1].numpy()) <= RTOL[each_runtime]
    print(f"\n[generate] {each_runtime}: caches grew 64 -> 128 -> 160 slots; {checked} positions checked")


def sharpened(seed, **overrides):
    """A spread model with a large final LayerNorm gain: next-token distributions far from uniform, so greedy
    tokens are not decided by rounding."""
    model, tmodel = spread_model(seed, **overrides)
    model.transformer.ln_f.weight.copy_(np.full(CFG["n_embd"], 8.0, np.float32))
    tmodel.load_state_dict({k: torch.from_numpy(np.array(v.numpy(), copy=True)) for k, v in model.state_dict().items()})
    return model, tmodel


def test_greedy_tokens_equal_uncached_and_torch():
    """Batch 2, past block_size (the window slides): temperature=0 and top_k=1, with and without the cache, are
    nanoGPT's greedy decode in torch."""
    model, tmodel = sharpened(seed=3)
    prompt = np.random.default_rng(4).integers(0, CFG["vocab_size"], (2, 5))
    n = CFG["block_size"] + 8
    want = ref.greedy_decode(tmodel, prompt, n)
    cached = model.generate(tl.tensor(prompt), n, temperature=0).numpy()
    np.testing.assert_array_equal(cached, want)
    np.testing.assert_array_equal(model.generate(tl.tensor(prompt), n, top_k=1).numpy(), want)
    np.testing.assert_array_equal(model.generate(tl.tensor(prompt), n, temperature=0, use_cache=False).numpy(), want)
    assert cached.dtype == np.int64 and cached.shape == (2, 5 + n)


def test_batch_rows_equal_single_rows():
    """A batch of two equal-length prompts decodes each row as it would alone."""
    model, _ = sharpened(seed=5)
    prompt = np.random.default_rng(6).integers(0, CFG["vocab_size"], (2, 3))
    both = model.generate(tl.tensor(prompt), 10, temperature=0).numpy()
    for row in range(2):
        alone = model.generate(tl.tensor(prompt[row:row + 1]), 10, temperature=0).numpy()
        np.testing.assert_array_equal(both[row:row + 1], alone)


def test_prompt_longer_than_block_is_cropped():
    model, tmodel = sharpened(seed=7)
    prompt = np.random.default_rng(8).integers(0, CFG["vocab_size"], (1, CFG["block_size"] + 3))
    out = model.generate(tl.tensor(prompt), 4, temperature=0).numpy()
    np.testing.assert_array_equal(out, ref.greedy_decode(tmodel, prompt, 4))


def test_stream_yields_the_same_tokens_as_a_whole_call():
    model, _ = spread_model(seed=9)
    prompt = tl.tensor(np.random.default_rng(10).integers(0, CFG["vocab_size"], (2, 4)))
    n = CFG["block_size"] + 2
    tl.manual_seed(11)
    whole = model.generate(prompt, n, temperature=1.0, top_k=20).numpy()
    tl.manual_seed(11)
    stream = model.generate(prompt, n, temperature=1.0, top_k=20, stream=True)
    assert not isinstance(stream, tl.Tensor)
    steps = list(stream)
    assert len(steps) == n and all(isinstance(s, tl.Tensor) and s.shape == (2, 1) for s in steps)
    np.testing.assert_array_equal(np.concatenate([prompt.numpy()] + [s.numpy() for s in steps], 1), whole)
    assert tl.is_grad_enabled(), "a streamed generate must not leave no_grad on in its caller"


def test_interleaved_streams_keep_their_own_caches():
    model, _ = sharpened(seed=25)
    rng = np.random.default_rng(26)
    p1, p2 = (rng.integers(0, CFG["vocab_size"], (1, 3)) for _ in range(2))
    want1, want2 = (model.generate(tl.tensor(p), 10, temperature=0).numpy()[:, 3:] for p in (p1, p2))
    s1, s2 = (model.generate(tl.tensor(p), 10, temperature=0, stream=True) for p in (p1, p2))
    got1, got2 = zip(*[(a.numpy(), b.numpy()) for a, b in zip(s1, s2)])
    np.testing.assert_array_equal(np.concatenate(got1, 1), want1)
    np.testing.assert_array_equal(np.concatenate(got2, 1), want2)


def test_sampling_arguments_reach_the_sampler():
    """top_p, min_p and a tinyllm.Generator go to tinyllm.sampling.sample: the same generator seed gives the same
    tokens, cached or not, streamed or not."""
    model, _ = spread_model(seed=23)
    prompt = tl.tensor(np.random.default_rng(24).integers(0, CFG["vocab_size"], (2, 3)))
    kw = dict(temperature=0.9, top_p=0.9, min_p=0.01)
    a = model.generate(prompt, 20, generator=tl.Generator().manual_seed(7), **kw).numpy()
    b = model.generate(prompt, 20, generator=tl.Generator().manual_seed(7), use_cache=False, **kw).numpy()
    c = [t.numpy() for t in model.generate(prompt, 20, generator=tl.Generator().manual_seed(7), stream=True, **kw)]
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a[:, 3:], np.concatenate(c, 1))
    assert model.generate(prompt, 20, generator=tl.Generator().manual_seed(8), **kw).numpy().tolist() != a.tolist()


def test_nanogpt_signature_and_sampling_stay():
    """generate(idx, max_new_tokens, temperature, top_k) positionally, as nanoGPT calls it; samples stay in range."""
    model, _ = spread_model(seed=12)
    prompt = np.random.default_rng(13).integers(0, CFG["vocab_size"], (3, 2))
    tl.manual_seed(14)
    out = model.generate(tl.tensor(prompt), 6, 0.8, 5).numpy()
    assert out.shape == (3, 8) and out.min() >= 0 and out.max() < CFG["vocab_size"]
    np.testing.assert_array_equal(out[:, :2], prompt)


def test_decode_replays_and_compiles_nothing_after_its_first_steps(monkeypatch):
    """A 200-token decode: new schedules (the only way anything compiles) appear only in the first steps of each
    phase (the cached steps, then the sliding window past block_size), and the decode step's Python runs on its
    first three calls only: tinyllm.jit replays it after."""
    block = 64
    model, _ = sharpened(seed=15, block_size=block)
    prompt = np.random.default_rng(16).integers(0, CFG["vocab_size"], (1, 4))
    step, misses, decodes = [0], [], []
    schedule, decode = realizer._schedule, gpt_module.Block.decode
    monkeypatch.setattr(realizer, "_schedule", lambda *a: misses.append(step[0]) or schedule(*a))
    monkeypatch.setattr(gpt_module.Block, "decode", lambda self, *a: decodes.append(step[0]) or decode(self, *a))
    n = 200
    for i, _ in enumerate(model.generate(tl.tensor(prompt), n, temperature=0, stream=True)):
        step[0] = i + 1
    first_window = block - prompt.shape[1] + 1  # the first step whose context is block + 1 tokens: the window slides
    late = [s for s in misses if 4 <= s < first_window or s >= first_window + 4]
    assert not late, f"new schedules at steps {late} (of {n})"
    assert sorted(set(decodes)) == [1, 2, 3], f"the decode step's Python ran at steps {sorted(set(decodes))}"
    print(f"\n[generate] 200 tokens: schedules made at steps {sorted(set(misses))} (the window slides at step "
          f"{first_window}); the decode step's Python ran at steps {sorted(set(decodes))}")
    # a second call replays the steps the first recorded: the decode step's Python does not run at all
    decodes.clear()
    again = model.generate(tl.tensor(prompt), 12, temperature=0).numpy()
    assert not decodes, "a second generate() ran the decode step's Python again"
    np.testing.assert_array_equal(again, model.generate(tl.tensor(prompt), 12, temperature=0, use_cache=False).numpy())


def test_cache_is_preallocated_and_written_in_place(each_runtime):
    """The cache is made once: the same tensors, of block_size slots (under MIN_SLOTS: they never grow), are
    assigned each step's values. On the C
    runtime the replayed step writes them in place (the writes are the last readers of the old caches, so they
    take over their memory) and then runs as one chain of C calls."""
    model, _ = sharpened(seed=17, block_size=32)
    decoder = generation.Decoder(model, 1, model.transformer.wte.weight.device, use_cache=True)
    tensors = list(decoder.caches)
    ids = np.random.default_rng(18).integers(0, CFG["vocab_size"], (1, 30))
    arrays = []
    hs = CFG["n_embd"] // CFG["n_head"]
    with tl.no_grad():
        for L in range(2, 30):
            decoder.logits(ids[:, :L])
            assert all(a is b for a, b in zip(decoder.caches, tensors))
            assert decoder.caches[0].shape == (1, CFG["n_head"], 32, hs + 1)  # keys and their slot's mask bias
            assert decoder.caches[1].shape == (1, CFG["n_head"], 32, hs)
            if each_runtime == "c":
                arrays.append([c.node.arg.numpy().ctypes.data for c in decoder.caches])
    if each_runtime == "c":
        assert all(a == arrays[6] for a in arrays[6:]), "the replayed steps made new cache arrays"
        tape, = decoder.step.tapes.values()
        assert tape.chain is not None, "the replayed step does not run as a chain"


# ---- GELU and nanoGPT checkpoints ---------------------------------------------------------------------------------
def test_gelu_default_is_exact_and_tanh_is_available():
    assert GPTConfig().gelu == "exact"
    x = np.random.default_rng(19).integers(0, CFG["vocab_size"], (2, 7))
    for form in ("exact", "tanh"):
        model, tmodel = spread_model(seed=20, gelu=form)
        with torch.no_grad():
            want = tmodel(torch.from_numpy(x))[0].numpy()
        assert rel(model(tl.tensor(x))[0].numpy(), want) <= 1e-5, form
    exact, _ = spread_model(seed=20)
    tanh, _ = spread_model(seed=20, gelu="tanh")
    assert rel(exact(tl.tensor(x))[0].numpy(), tanh(tl.tensor(x))[0].numpy()) > 1e-5, "the two forms must differ"


def test_gelu_value_is_checked():
    with pytest.raises(ValueError, match="gelu must be one of"):
        GPTConfig(gelu="erf")


def nanogpt_ckpt(path, compiled):
    """A ckpt.pt as nanoGPT's train.py writes it, from the torch reference model: `model` (with `_orig_mod.` keys
    when compiled, and the older `attn.bias` mask buffers), `model_args`, and the rest of what train.py saves."""
    cfg = dict(CFG, bias=True, dropout=0.0)
    torch.manual_seed(21)
    tmodel = ref.GPT(ref.GPTConfig(**cfg))
    with torch.no_grad():
        for n, p in tmodel.named_parameters():
            p.add_(0.3 * torch.randn_like(p))
    state = dict(tmodel.state_dict())
    for i in range(CFG["n_layer"]):
        state[f"transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(CFG["block_size"], CFG["block_size"])).view(
            1, 1, CFG["block_size"], CFG["block_size"])
    if compiled:
        state = {"_orig_mod." + k: v for k, v in state.items()}
    torch.save({"model": state, "optimizer": {}, "model_args": cfg, "iter_num": 10,
                "best_val_loss": torch.tensor(1.5), "config": {"dataset": "shakespeare_char"}}, path)
    return tmodel


@pytest.mark.parametrize("compiled", [False, True], ids=["plain", "compiled"])
def test_from_nanogpt_checkpoint_matches_torch(tmp_path, compiled):
    path = tmp_path / "ckpt.pt"
    tmodel = nanogpt_ckpt(path, compiled)
    model = GPT.from_nanogpt_checkpoint(path)
    assert model.config.gelu == "exact" and model.config.block_size == CFG["block_size"]
    assert model.lm_head.weight is model.transformer.wte.weight
    x = np.random.default_rng(22).integers(0, CFG["vocab_size"], (2, CFG["block_size"]))
    with torch.no_grad():
        want = tmodel(torch.from_numpy(x))[0].numpy()
    assert rel(model(tl.tensor(x))[0].numpy(), want) <= 1e-5
    out = model.generate(tl.tensor(x[:, :3]), 5, temperature=0).numpy()
    np.testing.assert_array_equal(out, ref.greedy_decode(tmodel, x[:, :3], 5))


def test_from_nanogpt_checkpoint_without_torch_says_so(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    with pytest.raises(ImportError, match="needs torch"):
        GPT.from_nanogpt_checkpoint(tmp_path / "ckpt.pt")


def test_from_nanogpt_checkpoint_rejects_other_files(tmp_path):
    path = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, path)
    with pytest.raises(ValueError, match="not a nanoGPT checkpoint"):
        GPT.from_nanogpt_checkpoint(path)


def test_a_half_precision_model_decodes_the_same_on_every_call(each_runtime):
    """A float16 or bfloat16 model (WGSL: float16 only) keeps its caches in its own dtype, so the decode step
    recorded by the first call replays right in the next ones: every call gives the uncached tokens."""
    if each_runtime == "wgsl":
        wgsl_f16_or_skip()
    for dtype in (tl.float16,) if each_runtime == "wgsl" else (tl.bfloat16, tl.float16):
        model, _ = spread_model(4)
        model = model.to(dtype=dtype)
        idx = tl.tensor(np.array([[3, 1]]))
        want = model.generate(idx, 12, temperature=0, use_cache=False).numpy().tolist()
        for _ in range(3):
            assert model.generate(idx, 12, temperature=0).numpy().tolist() == want, dtype


def test_a_model_cast_between_generate_calls_decodes_as_uncached(each_runtime):
    """The Decoder (and its caches, made in the first call's dtype) is kept between calls; after model.half() /
    .bfloat16() its caches take the new dtype at the next prefill, and tinyllm.jit records the decode step again
    (jit keys a Tape on the dtype of each tensor the step assigns)."""
    if each_runtime == "wgsl":
        wgsl_f16_or_skip()
    model, _ = spread_model(4)
    idx = tl.tensor(np.array([[3, 1]]))
    for dtype in (tl.float32, tl.float16, tl.float32) if each_runtime == "wgsl" else \
            (tl.float32, tl.bfloat16, tl.float16, tl.float32):
        model = model.to(dtype=dtype)
        want = model.generate(idx, 12, temperature=0, use_cache=False).numpy().tolist()
        for _ in range(2):
            assert model.generate(idx, 12, temperature=0).numpy().tolist() == want, dtype
