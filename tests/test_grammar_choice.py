"""generate(grammar=compile(tok, choice=[...])) samples a whole option with probability ∝ the model's
p(option's tokens, then end of text | prompt): Pearson's chi-squared of many draws against those probabilities,
enumerated here from plain forwards, on options with multi-token encodings of different lengths and shared prefixes
("yes", "yesterday", "yet", "no"); token-by-token masking gives a different law (enumerated, and sampled)."""
import numpy as np
import pytest

import tinyllm as tl
from helpers import chi2_pvalue, spread_weights
from test_speculative import full_logits
from tinyllm.grammar import compile
from tinyllm.models.gpt import GPT, GPTConfig
from tinyllm.models.llama import Llama, LlamaConfig

OPTIONS = ["yes", "yesterday", "no", "yet"]
PROMPT = [3, 7]


class MergeTokenizer:
    """A few letters and merges, greedy longest-match encode: "yes" is [yes], "yesterday" [yes, ter, day], "yet"
    [ye, t], "no" [no], so the options share first tokens and differ in length; end of text last."""

    def __init__(self, letters=b"yestrdano", merges=("ye", "yes", "ter", "day", "no")):
        self.tokens = [bytes([c]) for c in letters] + [m.encode() for m in merges]
        self.n_vocab = len(self.tokens) + 1
        self.eot_token = self.n_vocab - 1
        self._ids = {t: i for i, t in enumerate(self.tokens)}

    def decode_single_token_bytes(self, i):
        return b"<|endoftext|>" if i == self.eot_token else self.tokens[i]

    def encode(self, text):
        rest, ids = text.encode(), []
        while rest:
            n = max(n for n in range(1, len(rest) + 1) if rest[:n] in self._ids)
            ids.append(self._ids[rest[:n]])
            rest = rest[n:]
        return ids


class NoEncode:
    def __init__(self, tok):
        self.n_vocab, self.eot_token = tok.n_vocab, tok.eot_token
        self.decode_single_token_bytes = tok.decode_single_token_bytes


TOK = MergeTokenizer()
EOT = TOK.eot_token


def gpt(seed=1, head_std=0.3, block_size=16):
    """A GPT whose option probabilities are all within a few orders of magnitude (a small output matrix)."""
    tl.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=TOK.n_vocab, block_size=block_size, n_layer=1, n_head=2, n_embd=16))
    rng = spread_weights(model, seed, wte_std=None)
    head = rng.normal(0.0, head_std, (TOK.n_vocab, 16)).astype(np.float32)
    model.lm_head.weight = tl.nn.Parameter(tl.tensor(head))
    return model.eval()


@pytest.fixture(scope="module")
def model():
    return gpt()


def log_softmax(model, seq):
    """log p(next token) at every position of seq, by the plain forward over the last block_size tokens before it
    (generate's crop)."""
    block = model.max_positions
    rows = []
    for t in range(len(seq)):
        window = seq[max(0, t + 1 - block):t + 1]
        x = full_logits(model, np.array([window]))[0, -1].astype(np.float64)
        rows.append(x - x.max() - np.log(np.exp(x - x.max()).sum()))
    return np.array(rows)


def option_law(model, prompt, options=OPTIONS, tok=TOK):
    """P(option) ∝ Π softmax over [its tokens, end of text] after the prompt."""
    scores = []
    for option in options:
        seq = list(prompt) + tok.encode(option) + [tok.eot_token]
        lp = log_softmax(model, seq)
        scores.append(sum(lp[t - 1, seq[t]] for t in range(len(prompt), len(seq))))
    p = np.exp(np.array(scores) - max(scores))
    return p / p.sum()


def token_by_token_law(model, prompt, grammar, options=OPTIONS):
    """The law of masking each token (every tokenization of every option: a walk over the matcher's tree)."""
    law = dict.fromkeys(options, 0.0)

    def walk(m, seq, mass):
        if m.is_terminated():
            law[b"".join(TOK.decode_single_token_bytes(t) for t in seq[len(prompt):-1]).decode()] += mass
            return
        allowed = m.allowed()
        q = np.where(allowed, np.exp(log_softmax(model, seq)[-1]), 0.0)
        for t in np.flatnonzero(allowed):
            m.accept(t)
            walk(m, seq + [int(t)], mass * q[t] / q.sum())
            m.rollback(1)

    walk(grammar.matcher(), list(prompt), 1.0)
    return np.array([law[o] for o in options])


def counts_of(out, prompt_len, options=OPTIONS, tok=TOK):
    """How often each option was drawn; every row must be an option's exact tokens, then end of text only."""
    enc = [tok.encode(o) + [tok.eot_token] for o in options]
    counts = np.zeros(len(options), np.int64)
    for row in out[:, prompt_len:]:
        j = next(j for j, e in enumerate(enc) if list(row[:len(e)]) == e)
        assert (row[len(enc[j]):] == tok.eot_token).all(), row
        counts[j] += 1
    return counts


def pvalue(counts, want):
    """chi2_pvalue with the rarest cells pooled into one until it expects >= 5 draws (a rare option under a low
    temperature)."""
    counts, want = np.asarray(counts), np.asarray(want) / np.sum(want)
    order, n = np.argsort(want), counts.sum()
    k = int((want * n < 5).sum())
    if k == 0:
        return chi2_pvalue(counts, want)
    k += want[order[:k]].sum() * n < 5  # (and the next rarest, to bring the pool up to 5)
    pool, rest = order[:k], order[k:]
    return chi2_pvalue(np.append(counts[rest], counts[pool].sum()), np.append(want[rest], want[pool].sum()))


def draw(model, prompts, n_new=5, **kw):
    g = compile(TOK, choice=OPTIONS)
    out = model.generate(tl.tensor(np.asarray(prompts)), n_new, grammar=g,
                         generator=tl.Generator().manual_seed(kw.pop("seed", 0)), **kw).numpy()
    assert out.shape == (len(prompts), len(prompts[0]) + n_new)
    np.testing.assert_array_equal(out[:, :len(prompts[0])], prompts)
    return out


def test_whole_options_follow_the_models_option_probabilities(model):
    """20,000 rows of one prompt: the options' frequencies against the enumerated law (p ≈ .62, .004, .08, .30)."""
    n = 20_000
    want = option_law(model, PROMPT)
    assert want.min() > 1e-3
    counts = counts_of(draw(model, [PROMPT] * n), len(PROMPT))
    assert pvalue(counts, want) > 1e-3, (counts, want * n)


def test_token_by_token_masking_would_be_biased(model):
    """The token-by-token law (what regex="yes|yesterday|no|yet" samples) is far from the option law; sampled
    with the regex grammar its draws reject the option law, and the choice sampler's draws reject its."""
    exact = option_law(model, PROMPT)
    regex = compile(TOK, regex="|".join(OPTIONS))
    tokenwise = token_by_token_law(model, PROMPT, regex)
    assert np.isclose(tokenwise.sum(), 1.0)
    assert 0.5 * np.abs(tokenwise - exact).sum() > 0.3, (tokenwise, exact)
    out = model.generate(tl.tensor([PROMPT] * 2000), 10, grammar=regex,
                         generator=tl.Generator().manual_seed(3)).numpy()
    texts = [b"".join(TOK.decode_single_token_bytes(t) for t in row[:list(row).index(EOT)]).decode()
             for row in out[:, len(PROMPT):]]
    old = np.array([texts.count(o) for o in OPTIONS])
    assert old.sum() == 2000
    assert chi2_pvalue(old, tokenwise) > 1e-3, (old, tokenwise * 2000)
    assert chi2_pvalue(old[[0, 2, 3]], exact[[0, 2, 3]]) < 1e-6  # ("yesterday": too rare under exact for 2,000)
    choice = counts_of(draw(model, [PROMPT] * 20_000, seed=1), len(PROMPT))
    assert chi2_pvalue(choice, tokenwise) < 1e-6


def test_each_row_samples_its_own_prompt(model):
    """Two prompts, interleaved, 10,000 rows each: each row's options follow its own prompt's law."""
    prompts = [[3, 7], [1, 2]] * 10_000
    out = draw(model, prompts, seed=2)
    for r, prompt in enumerate(prompts[:2]):
        want = option_law(model, prompt)
        counts = counts_of(out[r::2], 2)
        assert pvalue(counts, want) > 1e-3, (prompt, counts, want * 10_000)
    assert not np.allclose(option_law(model, prompts[0]), option_law(model, prompts[1]), atol=0.05)


@pytest.mark.parametrize("kw", [dict(temperature=2.0), dict(temperature=0.5), dict(top_k=2), dict(top_p=0.7),
                                dict(min_p=0.1)])
def test_temperature_and_filters_act_on_the_options_distribution(model, kw):
    """p^(1/T) renormalised over the options; top_k / top_p / min_p keep options as they keep tokens (Hugging
    Face's order: temperature first)."""
    from tinyllm.sampling import probs
    n = 20_000
    p = option_law(model, PROMPT)
    want = probs(np.log(p)[None], **kw)[0]
    counts = counts_of(draw(model, [PROMPT] * n, **kw), len(PROMPT))
    assert counts[want == 0].sum() == 0
    if "temperature" in kw:
        t = kw["temperature"]
        np.testing.assert_allclose(want, p ** (1 / t) / (p ** (1 / t)).sum(), rtol=1e-9)
    else:
        assert (want == 0).any()
    assert pvalue(counts, want) > 1e-3, (kw, counts, want * n)


def test_greedy_takes_the_most_likely_option(model):
    out = draw(model, [PROMPT, [1, 2], [9, 9]], temperature=0.0)
    for row, prompt in zip(out, ([PROMPT, [1, 2], [9, 9]])):
        best = OPTIONS[int(np.argmax(option_law(model, prompt)))]
        assert list(row[2:]) == (TOK.encode(best) + [EOT] * 5)[:5]


@pytest.mark.parametrize("prompt", [[3, 7, 1, 0, 5, 2, 4], [3, 7, 1, 0, 5, 2, 4, 8, 6]])
def test_a_prompt_near_or_past_the_block_is_scored_on_generates_cropped_window(prompt):
    """block_size 8: after 7 prompt tokens the options' later tokens and their end of text are scored on the last
    8 tokens before each (one forward for the rest), after 9 every position is; as generate crops."""
    small = gpt(seed=4, block_size=8)
    want = option_law(small, prompt)
    counts = counts_of(draw(small, [prompt] * 20_000, seed=5), len(prompt))
    assert pvalue(counts, want) > 1e-3, (counts, want * 20_000)


def test_llama_stream_and_repeated_options():
    """A Llama samples whole options as well; stream=True yields the same tokens; a repeated option is one."""
    tl.manual_seed(0)
    llama = Llama(LlamaConfig(vocab_size=TOK.n_vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                              num_attention_heads=2, max_position_embeddings=16)).eval()
    for p in llama.parameters():
        p.copy_(np.random.default_rng(0).normal(0, 0.5, p.shape).astype(np.float32))
    g = compile(TOK, choice=OPTIONS + ["no", "yes"])
    n = 10_000
    idx = tl.tensor([PROMPT] * n)
    out = llama.generate(idx, 4, grammar=g, generator=tl.Generator().manual_seed(0)).numpy()
    counts = counts_of(out, 2)
    want = option_law(llama, PROMPT)
    assert pvalue(counts, want) > 1e-3, (counts, want * n)
    stats = {}
    streamed = list(llama.generate(idx[:5], 4, grammar=g, generator=tl.Generator().manual_seed(0), stream=True,
                                   stats=stats))
    assert [s.shape for s in streamed] == [(5, 1)] * 4 and stats["emitted"] == 4
    np.testing.assert_array_equal(np.concatenate([s.numpy() for s in streamed], 1),
                                  llama.generate(idx[:5], 4, grammar=g,
                                                 generator=tl.Generator().manual_seed(0)).numpy()[:, 2:])


def test_bad_input_is_a_clear_error(model):
    idx = tl.tensor([PROMPT])
    with pytest.raises(ValueError, match=r"'yesterday' needs 4 new tokens .*max_new_tokens 3: give max_new_tokens "
                                         r">= 4"):
        model.generate(idx, 3, grammar=compile(TOK, choice=OPTIONS))
    with pytest.raises(TypeError, match="NoEncode has no encode"):
        model.generate(idx, 5, grammar=compile(NoEncode(TOK), choice=OPTIONS))

    class Wrong(MergeTokenizer):
        def encode(self, text):
            return super().encode(text) + [self.eot_token]

    with pytest.raises(ValueError, match=r"Wrong.encode\('yes'\) gave \[10, 14\], which do not spell the option"):
        model.generate(idx, 5, grammar=compile(Wrong(), choice=OPTIONS))

    class Refuses(MergeTokenizer):
        def encode(self, text):
            raise ValueError("Encountered text corresponding to disallowed special token")

    with pytest.raises(ValueError, match=r"cannot encode the choice 'yes': Encountered text"):
        model.generate(idx, 5, grammar=compile(Refuses(), choice=OPTIONS))
    assert model.generate(idx, 0, grammar=compile(TOK, choice=OPTIONS)).shape == (1, 2)
