"""The feedback loop (tinyllm.continual.Loop) on a tiny GPT: rounds train the adapters only, rollback and the
forgetting gate restore them bit for bit, a new Loop resumes from its checkpoint directory, the reference under
lora.disabled is the base model (generation included), and bad input is refused clearly."""
import functools
import os

import numpy as np
import pytest

import tinyllm as tl
from tinyllm.continual import FeedbackStore, Loop
from tinyllm.models.gpt import GPT, GPTConfig
from tinyllm.nn import lora

TEXT = "the quick brown fox jumps over the lazy dog. " * 40


class Chars:
    """A character tokenizer over TEXT's letters (the interface the store and the loop read)."""

    def __init__(self, vocab=None):
        self.vocab = vocab or "".join(sorted(set(TEXT)))
        self.n_vocab = len(self.vocab)

    def encode_ordinary(self, text):
        try:
            return [self.vocab.index(c) for c in text]
        except ValueError:
            raise ValueError(f"{text!r} has a character outside the vocabulary") from None

    def decode(self, ids):
        return "".join(self.vocab[i] for i in ids)

    def decode_single_token_bytes(self, i):
        return self.vocab[i].encode()


@functools.lru_cache(maxsize=None)
def pretrained(seed):
    """A tiny GPT trained a little on TEXT (so that forgetting shows), as a state dict."""
    tl.manual_seed(seed)
    m = GPT(GPTConfig(vocab_size=Chars().n_vocab, block_size=32, n_layer=1, n_head=2, n_embd=16, dropout=0.0))
    ids, rng = np.array(Chars().encode_ordinary(TEXT)), np.random.default_rng(seed)
    opt = tl.optim.AdamW(m.parameters(), lr=1e-2)
    for _ in range(60):
        s = rng.integers(0, len(ids) - 33, 8)
        x, y = (tl.tensor(np.stack([ids[i + k:i + k + 32] for i in s])) for k in (0, 1))
        opt.zero_grad()
        m(x, y)[1].backward()
        opt.step()
    return {k: v.numpy().copy() for k, v in m.state_dict().items()}


def model(seed=0):
    m = GPT(GPTConfig(vocab_size=Chars().n_vocab, block_size=32, n_layer=1, n_head=2, n_embd=16, dropout=0.0))
    m.load_state_dict({k: tl.tensor(v) for k, v in pretrained(seed).items()})
    m.eval()
    return m


def vowels(prompt, text):
    return sum(c in "aeiou" for c in text) / max(1, len(text))


def feedback(store, n=8, seed=0, garbage_wins=False):
    """Pairs where the text's continuation beats garbage (or, garbage_wins, the reverse: forgetting guaranteed)."""
    rng = np.random.default_rng(seed)
    for _ in range(n):
        s = int(rng.integers(0, len(TEXT) - 20))
        prompt, a, b = TEXT[s:s + 6], TEXT[s + 6:s + 14], "zzz qwy xz"[:8]
        store.add_pair(prompt, *((b, a) if garbage_wins else (a, b)))


def adapters(m):
    return {k: v.numpy().copy() for k, v in lora.state_dict(m).items()}


def same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def new_loop(m, store, tmp_path=None, **kw):
    kw = {"steps": 6, "lr": 3e-2, "batch_size": 4, "heldout_text": TEXT[:300], "replay_text": TEXT,
          "heldout_prompts": [TEXT[i:i + 6] for i in range(0, 48, 6)], "judge": vowels, "max_new_tokens": 6,
          "checkpoint_dir": None if tmp_path is None else str(tmp_path / "adapters"), **kw}
    return Loop(m, Chars(), store, **kw)


def test_a_round_trains_the_adapters_only_and_rollback_restores_them(tmp_path):
    m = model()
    base = {k: v.numpy().copy() for k, v in m.state_dict().items() if "lora_" not in k}
    store = FeedbackStore(str(tmp_path / "f.tlfb"), tokenizer=Chars())
    loop = new_loop(m, store)
    before = adapters(m)
    with pytest.raises(ValueError, match="no new feedback"):
        loop.round()
    with pytest.raises(RuntimeError, match="no round to roll back"):
        loop.rollback()
    feedback(store)
    metrics = loop.round()
    assert metrics["pairs"] == 8 and metrics["position"] == 8 and metrics["version"] == 1
    assert metrics["reward_accuracy"] >= 0.75 and metrics["reward_margin"] > 0   # it learned the pairs
    assert 0 <= metrics["win_rate"] <= 1 and metrics["heldout_loss_base"] > 0
    assert not same(adapters(m), before)
    now = {k: v.numpy() for k, v in m.state_dict().items() if "lora_" not in k}
    assert all(np.array_equal(base[k], now[k]) for k in base)            # the base weights never change
    loop.rollback()
    assert same(adapters(m), before) and loop.position == 0 and loop.version == 0
    again = loop.round()                                                   # the same records, trained again
    assert again["position"] == 8


def test_the_forgetting_gate_rolls_a_round_back(tmp_path):
    m = model()
    store = FeedbackStore(str(tmp_path / "f.tlfb"))
    feedback(store, garbage_wins=True)
    loop = new_loop(m, store, max_heldout_increase=0.01, lr=0.3, steps=8, replay_text=None)
    before = adapters(m)
    metrics = loop.round()
    assert metrics["heldout_change"] > 0 and metrics["rolled_back"] and "held-out loss rose" in metrics["reason"]
    assert same(adapters(m), before) and loop.position == 0


def test_a_new_loop_resumes_from_its_directory(tmp_path):
    m = model()
    store = FeedbackStore(str(tmp_path / "f.tlfb"))
    feedback(store)
    loop = new_loop(m, store, tmp_path)
    v0 = adapters(m)
    loop.round()
    v1 = adapters(m)
    feedback(store, seed=1)
    loop.round()
    v2 = adapters(m)
    resumed_model = model()                         # the same base, no adapters: the checkpoint's are loaded
    resumed = new_loop(resumed_model, FeedbackStore(store.path), tmp_path)
    assert resumed.position == 16 and resumed.version == 2 and same(adapters(resumed_model), v2)
    with pytest.raises(ValueError, match="no new feedback"):
        resumed.round()
    resumed.rollback()                              # after a restart: the previous version's file
    assert resumed.version == 1 and resumed.position == 8 and same(adapters(resumed_model), v1)
    resumed.rollback()
    assert resumed.version == 0 and same(adapters(resumed_model), v0)
    with open(os.path.join(tmp_path, "adapters", "adapter-0000.safetensors"), "r+b") as f:
        f.write(b"garbage!")
    with pytest.raises(ValueError):
        new_loop(model(), FeedbackStore(store.path), tmp_path)


def test_each_kind_of_feedback_trains(tmp_path):
    store = FeedbackStore(str(tmp_path / "f.tlfb"))
    for i in range(6):
        s = 7 * i
        store.add(TEXT[s:s + 6], TEXT[s + 6:s + 12], 1 if i % 2 else -1)
        store.add_edit(TEXT[s:s + 6], "zzzzzz", TEXT[s + 6:s + 12])
    m = model()
    metrics = new_loop(m, store).round()
    assert metrics["desirable"] == 3 and metrics["undesirable"] == 3 and metrics["sft"] == 6
    assert metrics["kl"] >= 0 and np.isfinite(metrics["loss"])
    kto = new_loop(model(), store, method="kto").round()          # an edit is then a desirable and an undesirable
    assert kto["desirable"] == 9 and kto["undesirable"] == 9
    dpo = new_loop(model(), store, method="dpo").round()          # an edit is a pair; ratings compare nothing
    assert dpo["pairs"] == 6
    sft = new_loop(model(), store, method="sft").round()
    assert sft["sft"] == 9


def test_bad_input(tmp_path):
    m = model()
    store = FeedbackStore(str(tmp_path / "f.tlfb"), tokenizer=Chars())
    for kw, match in [(dict(method="ppo"), "method must be one of"), (dict(beta=0), "beta must be"),
                      (dict(steps=0), "steps must be"), (dict(lr=-1), "lr must be"),
                      (dict(max_heldout_increase=0.02, heldout_text=None), "needs heldout_text")]:
        with pytest.raises(ValueError, match=match):
            new_loop(m, store, **kw)
    other = Chars("".join(sorted(set(TEXT + "XYZ"))))
    with pytest.raises(ValueError, match="written for another tokenizer"):
        Loop(model(), other, store)
    with pytest.raises(TypeError, match="FeedbackStore"):
        Loop(model(), Chars(), str(tmp_path / "f.tlfb"))
    store.add("the ", "quick", 1)
    with pytest.raises(ValueError, match="finds nothing to learn"):
        new_loop(model(), store, method="dpo").round()


def test_generation_under_disabled_adapters_is_the_base_models(tmp_path):
    """A decode step recorded with the adapters on must not replay them once they are switched off."""
    m, frozen = model(), model()
    lora.apply(m, r=2, alpha=4)
    for p in lora.parameters(m):
        p.data = tl.randn(*p.shape) * 0.5
    idx = tl.tensor(np.array([[1, 2, 3]]))
    for _ in range(4):                              # (recorded and replayed by tinyllm.jit)
        adapted = m.generate(idx, 8, temperature=0, generator=tl.Generator().manual_seed(0)).numpy()
    with lora.disabled(m):
        off = m.generate(idx, 8, temperature=0).numpy()
    assert np.array_equal(off, frozen.generate(idx, 8, temperature=0).numpy())
    assert np.array_equal(m.generate(idx, 8, temperature=0).numpy(), adapted)
