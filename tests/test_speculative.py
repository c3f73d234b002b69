"""Speculative decoding (GPT.generate(draft_model=...)): the target's chunked forward over drafted tokens equals its
full forward, rolled-back caches forget the rejected tokens, greedy output is the target's own greedy output on every
runtime, and sampled sequences follow the target's joint law (chi-squared against exact probabilities from the
target's forward, on a 3-token vocabulary)."""
import itertools
import math

import numpy as np
import pytest
import torch

import tinyllm as tl
from helpers import spread_weights
from tinyllm.models import generation
from tinyllm.models.gpt import GPT, GPTConfig


def spread_model(seed, vocab_size=11, block_size=16, device=None, **shape):
    """A GPT whose weights put O(1) values through every nonlinearity, so a wrong position or stale key shows, with
    its own output matrix (tied to the embedding, a random GPT's greedy decode mostly repeats one token)."""
    tl.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=vocab_size, block_size=block_size, **shape))
    rng = spread_weights(model, seed, wte_std=None)
    head = rng.normal(0.0, 1.0, (vocab_size, shape["n_embd"])).astype(np.float32)
    model.lm_head.weight = tl.nn.Parameter(tl.tensor(head))
    model = model.to(device) if device else model
    model.eval()
    return model


def full_logits(model, ids):
    """The model's logits (B, L, V) at every position of ids, by its plain forward."""
    with tl.no_grad():
        return model.lm_head(model._features(tl.tensor(ids, device=model.lm_head.weight.device))).numpy()


@pytest.mark.usefixtures("each_runtime")
def test_chunks_and_rollbacks_equal_the_full_forward(each_runtime):
    """extend() over 1, 3 and 4 new tokens at once against the cache, and sync() back past tokens (a rejection),
    then on: every logit equals the full forward's at that position. After (4, 8, 5) the chunk at 5 would attend
    to the slots of positions 6 and 7 if the rollback left them."""
    model = spread_model(0, n_layer=2, n_head=2, n_embd=16, device=each_runtime)
    ids = np.random.default_rng(1).integers(0, 11, (1, 14))
    ref = full_logits(model, ids)
    rtol = 1e-4 if each_runtime == "wgsl" else 1e-5
    decoder = generation.Decoder(model, 1, model.lm_head.weight.device, use_cache=True)
    worst = 0.0
    with tl.no_grad():
        decoder.sync(ids, 2)
        for start, stop, back in ((2, 5, 4), (4, 8, 5), (5, 6, 6), (6, 10, 7), (7, 11, 11), (11, 14, 14)):
            got = decoder.extend(ids[:, :stop])  # positions start..stop-1
            want = ref[:, start:stop]
            worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
            decoder.sync(ids, back)  # slots back..stop-1 forgotten: the next chunk must not see them
    assert worst <= rtol, worst


@pytest.mark.usefixtures("each_runtime")
@pytest.mark.parametrize("k", [1, 3])
def test_greedy_speculative_output_is_the_targets_greedy_output(each_runtime, k):
    """Through block_size (16): the last steps, where no draft fits, are the target's alone."""
    target = spread_model(2, n_layer=2, n_head=2, n_embd=16, device=each_runtime)
    draft = spread_model(1, n_layer=1, n_head=1, n_embd=8, device=each_runtime)
    idx = tl.tensor([[1, 2, 3]], device=target.lm_head.weight.device)
    plain_stats, stats = {"stale": 1}, {}
    plain = target.generate(idx, 18, temperature=0, stats=plain_stats).numpy()
    spec = target.generate(idx, 18, temperature=0, draft_model=draft, num_speculative_tokens=k, stats=stats).numpy()
    np.testing.assert_array_equal(spec, plain)
    assert len(set(plain[0, 3:].tolist())) > 2  # a sequence, not one token repeated
    assert plain_stats == {"emitted": 18} and stats["emitted"] == 18
    assert stats is target.speculative_stats
    assert stats["rounds"] > 0 and 0 <= stats["accepted"] < stats["proposed"] <= k * stats["rounds"]
    assert stats["draft_acceptance_rate"] == stats["accepted"] / stats["proposed"]


@pytest.mark.parametrize("temperature", [0.0, 1.0, 1.5])
def test_a_draft_equal_to_the_target_is_always_accepted(temperature):
    """The same model drafting: q = p (up to the rounding of its one-position step against its chunked forward),
    so every draft is accepted, greedy or sampled: a rate of 1.0. Rounds of 3 drafts + 1 bonus token: 12 tokens
    take 3 rounds of 4 (the last token is the target's alone where fewer than 2 remain)."""
    target = spread_model(0, n_layer=1, n_head=2, n_embd=16)
    stats = {}
    stream = target.generate(tl.tensor([[1, 2]]), 12, temperature=temperature, draft_model=target,
                             num_speculative_tokens=3, generator=tl.Generator().manual_seed(0), stream=True,
                             stats=stats)
    assert stats["proposed"] == 0 and math.isnan(stats["draft_acceptance_rate"])  # nothing proposed yet
    assert len(list(stream)) == 12 == stats["emitted"]
    assert stats["accepted"] == stats["proposed"] == 9 and stats["rounds"] == 3
    assert stats["draft_acceptance_rate"] == 1.0


def test_acceptance_rate_of_another_draft_is_below_one_and_counts_add_up():
    """A different model drafting, sampled: some drafts rejected. Every round emits its accepted drafts and one
    token of the target's, so emitted = accepted + rounds (+ the tokens past the last round, target alone)."""
    target = spread_model(0, n_layer=1, n_head=2, n_embd=16)
    draft = spread_model(1, n_layer=1, n_head=1, n_embd=8)
    stats = {}
    target.generate(tl.tensor([[4, 5]]), 13, temperature=1.0, draft_model=draft, num_speculative_tokens=4,
                    generator=tl.Generator().manual_seed(3), stats=stats)
    assert 0 < stats["draft_acceptance_rate"] < 1
    assert stats["draft_acceptance_rate"] == stats["accepted"] / stats["proposed"]
    assert stats["emitted"] == 13 and 0 <= 13 - stats["accepted"] - stats["rounds"] <= 1
    with pytest.raises(TypeError, match="generate: stats must be a dict"):
        target.generate(tl.tensor([[4, 5]]), 2, draft_model=draft, stats=[])


def test_stream_and_seed():
    target = spread_model(0, n_layer=1, n_head=2, n_embd=16)
    draft = spread_model(1, n_layer=1, n_head=1, n_embd=8)
    idx = tl.tensor([[4, 5]])
    kw = dict(draft_model=draft, top_k=5, temperature=1.3)
    whole = target.generate(idx, 10, generator=tl.Generator().manual_seed(7), **kw).numpy()
    again = target.generate(idx, 10, generator=tl.Generator().manual_seed(7), **kw).numpy()
    streamed = [t.numpy() for t in target.generate(idx, 10, generator=tl.Generator().manual_seed(7), stream=True,
                                                   **kw)]
    np.testing.assert_array_equal(whole, again)
    assert all(t.shape == (1, 1) for t in streamed)
    np.testing.assert_array_equal(whole[:, 2:], np.concatenate(streamed, 1))


def test_joint_law_of_speculative_samples_is_the_targets():
    """Three tokens after a 2-token prompt, k = 2 (so the first round can accept both drafts and add a bonus
    token), vocabulary of 3: the 27 sequences' frequencies against the exact P(a)P(b|a)P(c|ab) of the target's
    forward, chi-squared. The draft is another model, so rejections are common."""
    V, n = 3, 600
    target = spread_model(0, vocab_size=V, block_size=8, n_layer=1, n_head=2, n_embd=8)
    draft = spread_model(5, vocab_size=V, block_size=8, n_layer=1, n_head=1, n_embd=4)
    prompt = [2, 0]
    exact = {}
    for seq in itertools.product(range(V), repeat=3):
        logits = full_logits(target, np.array([prompt + list(seq)]))[0, 1:4].astype(np.float64)
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        exact[seq] = float(np.prod([p[i, seq[i]] for i in range(3)]))
    gen = tl.Generator().manual_seed(11)
    counts = dict.fromkeys(exact, 0)
    idx = tl.tensor([prompt])
    for _ in range(n):
        out = target.generate(idx, 3, draft_model=draft, num_speculative_tokens=2, generator=gen).numpy()
        counts[tuple(out[0, 2:].tolist())] += 1
    assert target.speculative_stats["accepted"] < target.speculative_stats["proposed"]
    stat, df = chi_squared(counts, exact, n)
    p_value = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                            torch.tensor(stat / 2, dtype=torch.float64)))
    assert p_value > 1e-4, (stat, df, counts)
    # the test has power: the draft's own law is rejected
    draft_law = {}
    for seq in exact:
        logits = full_logits(draft, np.array([prompt + list(seq)]))[0, 1:4].astype(np.float64)
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        draft_law[seq] = float(np.prod([p[i, seq[i]] for i in range(3)]))
    stat, df = chi_squared(counts, draft_law, n)
    assert float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64))) < 1e-6


def chi_squared(counts, probs, n):
    """Pearson's statistic and degrees of freedom, cells of expected count < 5 pooled into one."""
    small = [c for c in probs if probs[c] * n < 5]
    cells = [([c], probs[c]) for c in probs if c not in small] + ([(small, sum(probs[c] for c in small))]
                                                                  if small else [])
    stat = sum((sum(counts[c] for c in group) - p * n) ** 2 / (p * n) for group, p in cells)
    return stat, len(cells) - 1


@pytest.mark.parametrize("call, words", [
    (lambda t, d: t.generate(tl.tensor([[1], [2]]), 3, draft_model=d), ["B = 1"]),
    (lambda t, d: t.generate(tl.tensor([[1]]), 3, draft_model=spread_model(2, vocab_size=7, n_layer=1, n_head=1,
                                                                          n_embd=4)), ["vocab_size 7", "11"]),
    (lambda t, d: t.generate(tl.tensor([[1]]), 3, draft_model=d, num_speculative_tokens=0), ["positive int, got 0"]),
])
def test_bad_speculative_arguments(call, words):
    target = spread_model(0, n_layer=1, n_head=2, n_embd=16)
    draft = spread_model(1, n_layer=1, n_head=1, n_embd=8)
    with pytest.raises(ValueError) as e:
        call(target, draft)
    for word in words:
        assert word in str(e.value)
