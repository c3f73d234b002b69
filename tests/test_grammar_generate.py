"""generate(grammar=...): every row's continuation is a string of the language followed by end of text (padding
after it), and each token is drawn from the model's distribution renormalised over the allowed tokens (Pearson's
chi-squared against the masked softmax)."""
import numpy as np
import pytest

import tinyllm as tl
from tinyllm.grammar.matcher import compile
from tinyllm.models.gpt import GPT, GPTConfig
from tinyllm.sampling import probs

from helpers import chi2_pvalue, reference_runtime, spread_weights  # noqa: F401 (a fixture)
from test_grammar_matcher import TOK


@pytest.fixture(scope="module")
def model():
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=32, vocab_size=TOK.n_vocab))
    spread_weights(m, 0, wte_std=1.0)
    return m.eval()


def continuations(out, prompt_len):
    """Each row's bytes up to end of text, and whether the rest of the row is all end of text."""
    rows = []
    for row in out[:, prompt_len:]:
        ends = np.flatnonzero(row == TOK.eot_token)
        assert len(ends), f"row {row} never ended"
        text = b"".join(TOK.decode_single_token_bytes(int(t)) for t in row[:ends[0]])
        rows.append((text, bool((row[ends[0]:] == TOK.eot_token).all())))
    return rows


@pytest.mark.parametrize("options", [["yes", "no", "maybe", "中文", "😀"], ["a", "ab", "abc"]])
def test_every_row_is_in_the_language_then_padded(model, options):
    g = compile(TOK, regex="|".join(options))  # (choice= samples whole options: tests/test_grammar_choice.py)
    prompt = np.random.default_rng(1).integers(0, 256, (6, 4))
    for seed, kw in enumerate([dict(), dict(top_k=5), dict(top_p=0.8), dict(temperature=0.0)]):
        out = model.generate(tl.tensor(prompt), 12, grammar=g, generator=tl.Generator().manual_seed(seed),
                             **kw).numpy()
        assert out.shape == (6, 16) and (out[:, :4] == prompt).all()
        for text, padded in continuations(out, 4):
            assert text.decode() in options and padded


def test_masked_draws_follow_the_renormalised_distribution(model):
    """One step, 3,000 rows: the first token's frequencies against softmax(logits) restricted to the tokens the
    grammar allows and renormalised."""
    g = compile(TOK, regex="a1|ab|b|x-|12|-0|@")
    allowed = g.matcher().allowed()
    prompt = np.tile(np.array([[5, 17, 99]]), (3000, 1))
    out = model.generate(tl.tensor(prompt), 1, grammar=g, generator=tl.Generator().manual_seed(0)).numpy()
    logits, _ = model(tl.tensor(prompt[:1]))
    p = probs(logits[:, -1, :])[0]
    want = np.where(allowed, p, 0.0)
    counts = np.bincount(out[:, -1], minlength=TOK.n_vocab)
    assert counts[~allowed].sum() == 0
    assert chi2_pvalue(counts, want) > 1e-3


def test_bad_combinations_are_clear_errors(model):
    g = compile(TOK, choice=["a"])
    small = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=100))
    with pytest.raises(ValueError, match=r"has \d+ tokens, more than the model's vocab_size 100"):
        small.generate(tl.tensor([[1, 2]]), 2, grammar=g)
