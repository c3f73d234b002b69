"""Memorization probes (tinyllm/interp/memorized.py): a tiny GPT overfit on a few hundred characters reproduces
them and not held-out text (Carlini et al. 2022's k-extractability); the Secret Sharer's exposure (Carlini et al.
2019) ranks the secret exactly among all candidates, checked against a per-candidate brute force; bad inputs name
the function and the fix; examples/interpret.py canaries runs end to end.
"""
import math

import numpy as np
import pytest

import tinyllm as tl
from helpers import reference_runtime, run_example, small_corpus, spread_weights  # noqa: F401 (a fixture)
from tinyllm.interp import memorized as mem
from tinyllm.models.gpt import GPT, GPTConfig
from tinyllm.models.llama import Llama, LlamaConfig

ALPHABET = "abcdefgh "  # the overfit test's random text: 9 characters, about 3.2 bits each


def random_text(n, seed):
    return "".join(np.random.default_rng(seed).choice(list(ALPHABET), n))


def encode(text):
    return np.array([ALPHABET.index(c) for c in text], dtype=np.int64)


@pytest.fixture(scope="module")
def overfit_model():
    """A 2-layer, 64-wide GPT trained for 700 AdamW steps on every 16-character window of 300 random characters:
    it learns them by heart. On device "cpu": the C runtime where it is built (a few seconds), else NumPy (about
    two minutes)."""
    data = encode(random_text(300, seed=0))
    tl.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=len(ALPHABET), n_layer=2, n_head=2, n_embd=64)).to(device="cpu")
    opt = tl.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    T = 16
    x_all = np.stack([data[i:i + T] for i in range(len(data) - T)])
    y_all = np.stack([data[i + 1:i + T + 1] for i in range(len(data) - T)])

    @tl.jit
    def step(x, y):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    rng = np.random.default_rng(1)
    for _ in range(700):
        ix = rng.integers(0, len(x_all), 32)
        loss = step(tl.tensor(x_all[ix], device="cpu"), tl.tensor(y_all[ix], device="cpu"))
    assert loss.item() < 0.6, f"the model did not fit its text (loss {loss.item():.3f}): the test proves nothing"
    return model.eval(), data


def test_overfit_model_reproduces_its_training_text_not_held_out(overfit_model):
    model, data = overfit_model
    train = mem.memorization(model, data, prefix_len=8, suffix_len=8, n=64, device="cpu")
    held = mem.memorization(model, encode(random_text(300, seed=1)), prefix_len=8, suffix_len=8, n=64, device="cpu")
    assert train.exact_match_rate >= 0.8, train
    assert held.exact_match_rate <= 0.1, held
    assert train.token_agreement > held.token_agreement + 0.5
    assert train.n == held.n == 64 and train.generated.shape == (64, 8)
    # the result's numbers are the generated tokens' agreement with the text, window by window
    truth = data[train.starts[:, None] + np.arange(8, 16)]
    np.testing.assert_array_equal(train.per_sample_agreement, (train.generated == truth).mean(1))
    assert train.exact_match_rate == np.mean(train.per_sample_agreement == 1.0)


def test_window_starts_are_distinct_sorted_and_cover_short_texts():
    starts = mem.window_starts(1000, 20, 50, seed=3)
    assert len(set(starts)) == 50 and np.all(np.diff(starts) > 0) and starts.max() <= 980
    np.testing.assert_array_equal(starts, mem.window_starts(1000, 20, 50, seed=3))
    np.testing.assert_array_equal(mem.window_starts(25, 20, 50), np.arange(6))  # every start when too few


def test_memorization_batches_agree_with_one_at_a_time():
    tl.manual_seed(0)
    model = GPT(GPTConfig(block_size=12, vocab_size=9, n_layer=1, n_head=2, n_embd=16))
    spread_weights(model, 0)
    tokens = encode(random_text(80, seed=2))
    a = mem.memorization(model, tokens, 5, 6, n=7, batch_size=3)
    b = mem.memorization(model, tokens, 5, 6, n=7, batch_size=1)
    np.testing.assert_array_equal(a.generated, b.generated)
    # and each continuation is greedy decoding's: the argmax of a full forward, token by token
    for start, gen in zip(a.starts, a.generated):
        seq = list(tokens[start:start + 5])
        for _ in range(6):
            logits, _ = model(tl.tensor(np.array([seq])))
            seq.append(int(np.argmax(logits.numpy()[0, -1])))
        np.testing.assert_array_equal(gen, seq[5:])


# ---- exposure ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def spread_gpt():
    """An untrained GPT whose weights spread its next-token distributions far from uniform."""
    tl.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=11, n_layer=2, n_head=2, n_embd=16))
    spread_weights(model, 1, wte_std=1.0)
    return model.eval()


def brute_force_log_perplexities(model, prefix, candidates):
    """Px in bits of each candidate after prefix: one forward (GPT's forward with targets: logits everywhere) per
    candidate, log-softmax in NumPy."""
    out = []
    for cand in candidates:
        seq = np.concatenate([prefix, cand])[None]
        logits, _ = model(tl.tensor(seq[:, :-1]), tl.tensor(seq[:, 1:]))
        z = logits.numpy()[0].astype(np.float64)
        logp = z - z.max(1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(1, keepdims=True))
        rows = np.arange(len(prefix) - 1, seq.shape[1] - 1)
        out.append(-logp[rows, seq[0, rows + 1]].sum() / math.log(2))
    return np.array(out)


def test_secret_log_perplexities_match_a_per_candidate_brute_force(spread_gpt):
    prefix, alphabet, length = np.array([3, 1, 4, 1]), np.array([2, 7, 5]), 3
    grid = mem.secret_log_perplexities(spread_gpt, prefix, alphabet, length, batch_size=4)  # batches of 4 of 9 rows
    assert grid.shape == (3, 3, 3)
    every = alphabet[np.indices((3,) * length).reshape(length, -1).T]  # the 27 secrets, in the grid's C order
    brute = brute_force_log_perplexities(spread_gpt, prefix, every)
    np.testing.assert_allclose(grid.ravel(), brute, rtol=1e-5)
    np.testing.assert_allclose(mem.log_perplexities(spread_gpt, prefix, every, batch_size=5), brute, rtol=1e-5)
    assert brute.max() - brute.min() > 1.0  # the candidates differ: the ranks below mean something
    one = mem.secret_log_perplexities(spread_gpt, prefix, alphabet, 1)  # secrets of one token: the prefix's forward
    np.testing.assert_allclose(one, brute_force_log_perplexities(spread_gpt, prefix, alphabet[:, None]), rtol=1e-5)
    # over the whole vocabulary the candidates are every continuation: their probabilities sum to 1
    whole = mem.secret_log_perplexities(spread_gpt, prefix, np.arange(11), 2, batch_size=4)
    np.testing.assert_allclose(np.exp2(-whole).sum(), 1.0, rtol=1e-5)


def test_exposure_is_log2_R_minus_log2_of_the_exact_rank(spread_gpt):
    prefix, alphabet = np.array([3, 1, 4, 1]), np.array([2, 7, 5])
    every = alphabet[np.indices((3, 3, 3)).reshape(3, -1).T]
    brute = brute_force_log_perplexities(spread_gpt, prefix, every)
    order = np.argsort(brute)
    for place in (0, 5, 26):  # the likeliest secret, one in the middle, the least likely
        secret = every[order[place]]
        result = mem.exposure(spread_gpt, prefix, secret, alphabet)
        assert result.n_candidates == 27 and result.rank == place + 1
        assert result.exposure == pytest.approx(math.log2(27) - math.log2(place + 1))
        assert result.log_perplexity == pytest.approx(brute[order[place]], rel=1e-5)
    assert mem.exposure(spread_gpt, prefix, every[order[0]], alphabet).exposure == pytest.approx(math.log2(27))
    assert mem.exposure(spread_gpt, prefix, every[order[-1]], alphabet).exposure == pytest.approx(0.0)


def test_rank_counts_ties_as_the_best_place():
    assert mem.rank_of(2.0, [3.0, 2.0, 1.0, 2.0]) == 2
    assert mem.exposure_from_log_perplexities(1.0, [1.0] * 8).exposure == 3.0  # all tied: every secret ranks first


def test_extraction_is_greedy_decoding_of_the_secret(spread_gpt):
    prefix = np.array([3, 1, 4])
    greedy = mem.greedy_continuations(spread_gpt, prefix[None], 3)[0]
    assert mem.extraction(spread_gpt, prefix, greedy)
    assert not mem.extraction(spread_gpt, prefix, (greedy + 1) % 11)


def test_probes_run_on_a_llama():
    tl.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=11, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16))
    result = mem.memorization(model, np.arange(40) % 11, 4, 4, n=5)
    assert result.n == 5 and 0.0 <= result.token_agreement <= 1.0
    grid = mem.secret_log_perplexities(model, np.array([1, 2, 0]), np.arange(11), 2)  # every 2-token continuation
    every = np.indices((11, 11)).reshape(2, -1).T
    np.testing.assert_allclose(grid.ravel(), mem.log_perplexities(model, [1, 2, 0], every, batch_size=50), rtol=1e-5)
    assert mem.exposure(model, np.array([1, 2]), np.array([4, 3]), np.array([3, 4])).n_candidates == 4


# ---- errors ------------------------------------------------------------------------------------------------------
def test_bad_inputs_name_the_function_and_the_fix(spread_gpt):
    m = spread_gpt
    with pytest.raises(ValueError, match=r"memorization: tokens has 10 tokens, fewer than one window of prefix_len 6 "
                                         r"\+ suffix_len 6 = 12"):
        mem.memorization(m, np.arange(10), 6, 6)
    with pytest.raises(ValueError, match=r"memorization: tokens must be a 1-D .* shape \(2, 20\): pass one row"):
        mem.memorization(m, np.zeros((2, 20), dtype=np.int64), 4, 4)
    with pytest.raises(TypeError, match="memorization: tokens must hold integer token ids, got dtype float"):
        mem.memorization(m, np.zeros(40), 4, 4)
    with pytest.raises(ValueError, match=r"memorization: prefix_len 10 \+ suffix_len 8 - 1 = 17 tokens .* context "
                                         r"of 16 \(block_size\)"):
        mem.memorization(m, np.zeros(40, dtype=np.int64), 10, 8)
    with pytest.raises(ValueError, match="memorization: suffix_len must be a positive whole number, got 0"):
        mem.memorization(m, np.zeros(40, dtype=np.int64), 4, 0)
    with pytest.raises(IndexError, match="memorization: tokens holds token id 11, out of range .* 11 tokens"):
        mem.memorization(m, np.full(40, 11), 4, 4)
    with pytest.raises(ValueError, match=r"exposure: secret token\(s\) \[9\] are not in alphabet \[2, 7\]"):
        mem.exposure(m, [1, 2], [2, 9], [2, 7])
    with pytest.raises(ValueError, match=r"secret_log_perplexities: alphabet \[2, 2\] repeats a token"):
        mem.exposure(m, [1, 2], [2, 2], [2, 2])
    with pytest.raises(ValueError, match=r"log_perplexities: candidates must be \(N, L\) token ids"):
        mem.log_perplexities(m, [1], np.array([1, 2]))


# ---- the example -------------------------------------------------------------------------------------------------
def test_interpret_canaries_prints_its_table_and_writes_the_plot(tmp_path):
    corpus = small_corpus(tmp_path)
    out = tmp_path / "out"
    r = run_example("interpret.py", "canaries", "--data", str(corpus), "--out-dir", str(out), "--train-chars", "6000",
                    "--max-iters", "3", "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "24",
                    "--batch-size", "4", "--secret-len", "2", "--per-count", "2", "--counts", "1,4", "--windows", "4",
                    cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["duplicates", "mean"])
    table = [line.split() for line in lines[header + 1:header + 4]]
    assert [row[0] for row in table] == ["held", "1", "4"]
    for row in table:  # mean exposure within 0..log2|R| = log2 100, extraction rate within 0..1
        mean, max_possible, extracted = float(row[-4]), float(row[-2]), float(row[-1])
        assert max_possible == pytest.approx(math.log2(100), abs=0.01)
        assert 0.0 <= mean <= max_possible and 0.0 <= extracted <= 1.0
    assert "training text (canary-free part): exact match" in r.stdout and "held-out text:" in r.stdout
    png = out / "canaries.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_interpret_canaries_rejects_bad_counts(tmp_path):
    r = run_example("interpret.py", "canaries", "--counts", "4,x", cwd=tmp_path)
    assert r.returncode == 2 and "--counts '4,x': give distinct positive whole numbers" in r.stderr
