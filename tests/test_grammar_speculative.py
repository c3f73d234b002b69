"""generate(grammar=g, draft_model=d): speculative decoding under a grammar is lossless with respect to the
target's constrained distribution (Pearson's chi-squared of whole 4-token outputs against the law enumerated over
the grammar's token tree from the target's plain forward, masked and renormalised at every position; the draft's
own constrained law is rejected), every output is in the language then end-of-text padding, greedy output equals
the target's own constrained greedy output (across rounds, rollbacks and the block's edge), and any batch size."""
import re

import numpy as np
import pytest

import tinyllm as tl
from helpers import chi2_pvalue
from test_speculative import full_logits, spread_model
from tinyllm.grammar import compile
from tinyllm.models.llama import Llama, LlamaConfig
from tinyllm.sampling import probs


class TinyTokenizer:
    """a, b, c and the merge ab (so "ab" has two tokenizations), end of text last."""

    def __init__(self, tokens=(b"a", b"b", b"c", b"ab")):
        self.tokens = list(tokens)
        self.n_vocab = len(tokens) + 1
        self.eot_token = len(tokens)

    def decode_single_token_bytes(self, i):
        return b"<|endoftext|>" if i == self.eot_token else self.tokens[i]


TOK = TinyTokenizer()
EOT = TOK.eot_token
PROMPT = [2, 0]


@pytest.fixture(scope="module")
def models():
    """Target and draft: different random models (the draft's constrained law is far from the target's)."""
    target = spread_model(0, vocab_size=TOK.n_vocab, block_size=16, n_layer=1, n_head=2, n_embd=8)
    draft = spread_model(5, vocab_size=TOK.n_vocab, block_size=16, n_layer=1, n_head=1, n_embd=4)
    return target, draft


def constrained_law(model, prompt, grammar, n_new, **sampling):
    """{the n_new new tokens: probability} of constrained sampling, enumerated over every path of the matcher:
    at each position probs() of the plain forward's logits with the tokens the grammar disallows at -inf (after
    end of text, end of text alone)."""
    law = {}

    def walk(m, seq, mass):
        new = tuple(seq[len(prompt):])
        if len(new) == n_new:
            law[new] = law.get(new, 0.0) + mass
            return
        done = m.is_terminated()
        mask = np.eye(TOK.n_vocab, dtype=bool)[EOT] if done else m.allowed()
        x = full_logits(model, np.array([seq]))[0, -1].astype(np.float64)
        p = probs(np.where(mask, x, -np.inf), **sampling)
        for t in np.flatnonzero(p > 0):
            if not done:
                m.accept(t)
            walk(m, seq + [int(t)], mass * p[t])
            if not done:
                m.rollback(1)

    walk(grammar.matcher(), list(prompt), 1.0)
    return law


def pvalue(counts, law, n):
    """chi2_pvalue over the law's outputs, the rarest pooled into one cell until it expects >= 5 draws."""
    cells = sorted(law, key=law.get)
    k = 0
    while k < len(cells) and sum(law[c] for c in cells[:k]) * n < 5:
        k += 1
    groups = ([cells[:k]] if k else []) + [[c] for c in cells[k:]]
    return chi2_pvalue([sum(counts.get(c, 0) for c in g) for g in groups], [sum(law[c] for c in g) for g in groups])


def text_of(row):
    """(the bytes before end of text, whether the row ended and is all end of text after)."""
    ends = np.flatnonzero(row == EOT)
    stop = ends[0] if len(ends) else len(row)
    return b"".join(TOK.decode_single_token_bytes(int(t)) for t in row[:stop]), bool(len(ends)) and \
        bool((row[stop:] == EOT).all())


@pytest.mark.slow
@pytest.mark.parametrize("regex, sampling", [("(ab|ba|aa)c?", {}), ("[ab]{1,3}", {}),
                                             ("(ab|ba|aa)c?", dict(temperature=0.8, top_k=3))])
def test_constrained_speculative_samples_follow_the_targets_constrained_law(models, regex, sampling):
    """2,000 rows (one call: each row its own speculative decode), 4 new tokens, k = 3: the outputs' frequencies
    against the target's enumerated constrained law; the draft's constrained law is rejected (the test has power),
    and drafts were rejected often (the rejection path ran)."""
    target, draft = models
    g = compile(TOK, regex=regex)
    n = 2000
    law = constrained_law(target, PROMPT, g, 4, **sampling)
    assert np.isclose(sum(law.values()), 1.0)
    stats = {}
    out = target.generate(tl.tensor([PROMPT] * n), 4, grammar=g, draft_model=draft, num_speculative_tokens=3,
                          generator=tl.Generator().manual_seed(7), stats=stats, **sampling).numpy()
    counts = {}
    for row in out[:, 2:]:
        counts[tuple(row.tolist())] = counts.get(tuple(row.tolist()), 0) + 1
    assert set(counts) <= set(law), set(counts) - set(law)
    assert pvalue(counts, law, n) > 1e-3, (counts, {c: law[c] * n for c in law})
    assert pvalue(counts, constrained_law(draft, PROMPT, g, 4, **sampling), n) < 1e-6
    assert stats["rounds"] > n and 0 < stats["accepted"] < 0.8 * stats["proposed"], stats


@pytest.mark.parametrize("k", [1, 2, 4])
def test_every_row_is_in_the_language_then_padded(models, k):
    """Sampled rows, several rounds each: each ends with a string of the language and end-of-text padding."""
    target, draft = models
    regex = "[ab]{1,5}c"
    g = compile(TOK, regex=regex)
    out = target.generate(tl.tensor([PROMPT] * 40), 9, grammar=g, draft_model=draft, num_speculative_tokens=k,
                          generator=tl.Generator().manual_seed(k)).numpy()
    assert out.shape == (40, 11) and (out[:, :2] == PROMPT).all()
    for row in out[:, 2:]:
        text, padded = text_of(row)
        assert padded and re.fullmatch(regex, text.decode()), row


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_equals_the_targets_own_constrained_greedy(models, k):
    """temperature=0: the same tokens as generate without the draft, for a batch of prompts, with rows that end
    early (padding) and rows that run to max_new_tokens."""
    target, draft = models
    g = compile(TOK, regex="(a|b|ab)+c?")
    prompts = tl.tensor([[2, 0], [1, 1], [0, 3], [3, 2]])
    want = target.generate(prompts, 8, grammar=g, temperature=0.0).numpy()
    got = target.generate(prompts, 8, grammar=g, draft_model=draft, num_speculative_tokens=k,
                          temperature=0.0).numpy()
    np.testing.assert_array_equal(got, want)


def test_the_blocks_edge_uses_the_cropped_window():
    """block_size 8, a 4-token prompt and 9 new tokens: drafts stop fitting and the target goes on alone over
    its cropped window; greedy output equals the non-speculative one, cached and uncached."""
    target = spread_model(0, vocab_size=TOK.n_vocab, block_size=8, n_layer=1, n_head=2, n_embd=8)
    draft = spread_model(5, vocab_size=TOK.n_vocab, block_size=8, n_layer=1, n_head=1, n_embd=4)
    g = compile(TOK, regex="[ab]{1,20}c")
    idx = tl.tensor([[2, 0, 1, 3]])
    want = target.generate(idx, 9, grammar=g, temperature=0.0).numpy()
    np.testing.assert_array_equal(target.generate(idx, 9, grammar=g, temperature=0.0, use_cache=False).numpy(), want)
    got = target.generate(idx, 9, grammar=g, draft_model=draft, num_speculative_tokens=3, temperature=0.0)
    np.testing.assert_array_equal(got.numpy(), want)


def test_stream_seed_and_stats(models):
    target, draft = models
    g = compile(TOK, regex="[ab]{1,5}c")
    kw = dict(grammar=g, draft_model=draft, num_speculative_tokens=2)
    idx = tl.tensor([PROMPT])
    whole = target.generate(idx, 8, generator=tl.Generator().manual_seed(3), **kw).numpy()
    stats = {}
    streamed = list(target.generate(idx, 8, generator=tl.Generator().manual_seed(3), stream=True, stats=stats,
                                    **kw))
    assert [s.shape for s in streamed] == [(1, 1)] * 8 and stats["emitted"] == 8
    np.testing.assert_array_equal(whole[:, 2:], np.concatenate([s.numpy() for s in streamed], 1))
    assert stats is target.speculative_stats and stats["accepted"] <= stats["proposed"]


def test_llama_target_and_draft():
    """Llamas (GenerationMixin's other model): greedy constrained speculative output is the target's own."""
    def llama(seed, hidden):
        tl.manual_seed(seed)
        m = Llama(LlamaConfig(vocab_size=TOK.n_vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                              num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=16)).eval()
        rng = np.random.default_rng(seed)
        for p in m.parameters():
            p.copy_(rng.normal(0, 0.5, p.shape).astype(np.float32))
        return m

    target, draft = llama(0, 16), llama(1, 8)
    g = compile(TOK, regex="(a|b|ab)+c?")
    idx = tl.tensor([[2, 0], [1, 3]])
    want = target.generate(idx, 7, grammar=g, temperature=0.0).numpy()
    got = target.generate(idx, 7, grammar=g, draft_model=draft, num_speculative_tokens=3, temperature=0.0)
    np.testing.assert_array_equal(got.numpy(), want)


def test_a_choice_grammar_with_a_draft_samples_whole_options(models):
    """The choice path scores whole options and needs no draft; it takes any batch."""
    from test_grammar_choice import TOK as MERGES, OPTIONS, counts_of, option_law, gpt
    model = gpt()
    draft = spread_model(5, vocab_size=MERGES.n_vocab, block_size=16, n_layer=1, n_head=1, n_embd=4)
    out = model.generate(tl.tensor([[3, 7]] * 2000), 5, grammar=compile(MERGES, choice=OPTIONS), draft_model=draft,
                         generator=tl.Generator().manual_seed(0)).numpy()
    want = option_law(model, [3, 7])
    counts = counts_of(out, 2)
    assert pvalue(dict(enumerate(counts)), dict(enumerate(want)), 2000) > 1e-3, (counts, want * 2000)
