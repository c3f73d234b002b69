"""tinyllm.interp.lens: the logit lens (nostalgebraist 2020) against a NumPy recomputation and TransformerLens's
unembed(ln_final(resid)); the tuned lens (Belrose et al. 2023): identity at init, and lower KL than the logit lens
at every layer once trained; Llama too; bad input; and examples/interpret.py lens as a user runs it."""
import math

import numpy as np
import pytest
import torch

import tinyllm as tl
from helpers import reference_runtime, run_example, small_corpus, spread_weights  # noqa: F401
from tinyllm.interp.lens import TunedLens, format_report, lens_report, logit_lens
from tinyllm.models.gpt import GPT, GPTConfig
from tinyllm.models.llama import Llama, LlamaConfig

VOCAB = 13


def spread_gpt(n_layer=2, seed=0):
    tl.manual_seed(seed)
    model = GPT(GPTConfig(block_size=16, vocab_size=VOCAB, n_layer=n_layer, n_head=2, n_embd=16))
    spread_weights(model, seed, wte_std=1.0)
    return model.eval()


def spread_llama(seed=0):
    tl.manual_seed(seed)
    model = Llama(LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16))
    spread_weights(model, seed, wte_std=1.0)
    return model.eval()


def ids(shape, seed=0):
    return tl.tensor(np.random.default_rng(seed).integers(0, VOCAB, shape))


def log_softmax64(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def cached_resid_pre(model, idx, n):
    _, cache = model.run_with_cache(idx, names_filter=[f"blocks.{l}.hook_resid_pre" for l in range(n)])
    return [cache[f"blocks.{l}.hook_resid_pre"].numpy() for l in range(n)]


@pytest.fixture(scope="module", params=["gpt", "llama"])
def model(request):
    return spread_gpt() if request.param == "gpt" else spread_llama()


def test_shapes_and_layer_selection(model):
    idx = ids((3, 7))
    assert logit_lens(model, idx).shape == (3, 3, 7, VOCAB)
    assert logit_lens(model, idx, layers=[2, 0]).shape == (2, 3, 7, VOCAB)
    assert TunedLens(model)(model, idx).shape == (3, 3, 7, VOCAB)
    assert np.array_equal(logit_lens(model, idx, layers=[2, 0]).numpy(), logit_lens(model, idx).numpy()[[2, 0]])


def test_last_slice_is_the_models_own_log_softmax(model):
    idx = ids((2, 9), seed=1)
    logits, _ = model(idx, idx)  # with targets: the logits at every position
    got = logit_lens(model, idx).numpy()[-1]
    np.testing.assert_allclose(got, logits.log_softmax(-1).numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.exp(got).sum(-1), 1.0, atol=1e-5)


def test_each_layer_is_its_residual_through_the_final_norm_and_unembedding(model):
    """Slice l = log_softmax(lm_head(final_norm(resid_pre l))), recomputed in float64 NumPy from the cache."""
    idx = ids((2, 11), seed=2)
    got = logit_lens(model, idx).numpy()
    sd = {k: v.numpy().astype(np.float64) for k, v in model.state_dict().items()}
    for l, h in enumerate(cached_resid_pre(model, idx, 2)):
        h = h.astype(np.float64)
        if isinstance(model, GPT):
            c = h - h.mean(-1, keepdims=True)
            normed = c / np.sqrt((c * c).mean(-1, keepdims=True) + 1e-5) * sd["transformer.ln_f.weight"] \
                + sd["transformer.ln_f.bias"]
        else:
            eps = model.config.rms_norm_eps
            normed = h / np.sqrt((h * h).mean(-1, keepdims=True) + eps) * sd["model.norm.weight"]
        want = log_softmax64(normed @ sd["lm_head.weight"].T)
        np.testing.assert_allclose(got[l], want, rtol=0, atol=2e-5, err_msg=f"slice {l}")


def test_logit_lens_matches_transformer_lens():
    """Per layer, TransformerLens's unembed(ln_final(resid_pre)) on a HookedTransformer holding the same weights
    (its ln_final renormalizes each residual, as the logit lens does)."""
    from transformer_lens_reference import hooked_gpt
    model = spread_gpt()
    idx = ids((2, 10), seed=3)
    got = logit_lens(model, idx).numpy()
    tl_model = hooked_gpt(model)
    with torch.no_grad():
        _, cache = tl_model.run_with_cache(torch.tensor(idx.numpy()))
        for l in range(2):
            want = tl_model.unembed(tl_model.ln_final(cache[f"blocks.{l}.hook_resid_pre"])).log_softmax(-1)
            np.testing.assert_allclose(got[l], want.numpy(), rtol=0, atol=1e-4, err_msg=f"slice {l}")
        want = tl_model.unembed(tl_model.ln_final(cache["blocks.1.hook_resid_post"])).log_softmax(-1)
        np.testing.assert_allclose(got[2], want.numpy(), rtol=0, atol=1e-4, err_msg="the final slice")


def test_an_untrained_tuned_lens_is_the_logit_lens_exactly(model):
    idx = ids((2, 8), seed=4)
    assert np.array_equal(TunedLens(model)(model, idx).numpy(), logit_lens(model, idx).numpy())


def test_training_the_tuned_lens_beats_the_logit_lens_at_every_layer(model):
    """Trained on some tokens, reported on others: lower KL to the model's output than the logit lens at each layer
    below the last (where both are the model itself), and the model's weights untouched."""
    rng = np.random.default_rng(5)
    train, heldout = rng.integers(0, VOCAB, 400), rng.integers(0, VOCAB, 200)
    before = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    lens = TunedLens.train(model, train, steps=60, batch_size=4, lr=1e-2, progress=False)
    assert not model.training  # left as it was (eval)
    rows = lens_report(model, heldout, lens, windows=6, batch_size=3)
    assert lens.report(model, heldout, windows=6, batch_size=3) == rows
    table = format_report(rows)
    assert [r["layer"] for r in rows] == [0, 1, 2]
    for r in rows[:-1]:
        assert r["logit_kl"] > 0.05, table  # the logit lens is off at the early layers of a spread model...
        assert r["tuned_kl"] < 0.8 * r["logit_kl"], table  # ...and the tuned lens is clearly closer
    assert rows[-1]["logit_kl"] == pytest.approx(0, abs=1e-6) and rows[-1]["tuned_top1"] == 1.0, table
    assert all(math.isfinite(v) for r in rows for k, v in r.items() if k.endswith(("_kl", "_top1"))), table
    for k, v in model.state_dict().items():
        assert np.array_equal(v.numpy(), before[k]), f"TunedLens.train changed the model's {k}"
    assert all(p.requires_grad for p in model.parameters())
    assert not lens.training and lens.train() is lens and lens.training  # Module.train on an instance


def test_report_without_a_tuned_lens_has_the_logit_lens_only():
    model = spread_gpt()
    rows = lens_report(model, np.random.default_rng(6).integers(0, VOCAB, 100), windows=3)
    assert set(rows[0]) == {"layer", "name", "logit_kl", "logit_top1"}
    assert "tuned" not in format_report(rows)


def test_bad_input_is_named():
    model = spread_gpt()
    idx = ids((1, 4))
    with pytest.raises(ValueError, match=r"logit_lens: layer 7 is out of range: GPT has 2 layers"):
        logit_lens(model, idx, layers=[7])
    with pytest.raises(ValueError, match=r"layer -1 is out of range"):
        TunedLens(model)(model, idx, layers=[-1])
    with pytest.raises(ValueError, match=r"logit_lens: idx must be 2-D integer token ids \(B, T\), got shape \(4,\)"):
        logit_lens(model, tl.tensor(np.arange(4)))
    with pytest.raises(ValueError, match=r"2-D integer .* float32"):
        logit_lens(model, tl.tensor(np.zeros((1, 4), np.float32)))
    with pytest.raises(ValueError, match=r"idx has 17 positions, but the model reads 1 to 16"):
        logit_lens(model, np.zeros((1, 17), np.int64))
    with pytest.raises(ValueError, match=r"TunedLens.train: 10 tokens are fewer than one window .* \(16\)"):
        TunedLens.train(model, np.arange(10) % VOCAB, steps=1, progress=False)
    with pytest.raises(ValueError, match=r"1-D array of integer"):
        lens_report(model, np.zeros((2, 20), np.int64))
    other = GPT(GPTConfig(block_size=16, vocab_size=VOCAB, n_layer=3, n_head=2, n_embd=16))
    with pytest.raises(ValueError, match=r"made for 2 layers of width 16, but the model has 3"):
        TunedLens(model)(other, idx)


# ---- examples/interpret.py lens ---------------------------------------------------------------------------------
def run_lens(*flags, cwd):
    return run_example("interpret.py", "lens", *flags, cwd=cwd)


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("lens_example")
    corpus = small_corpus(root)
    r = run_example("gpt.py", "--tiny", "--data", str(corpus), "--ckpt-dir", str(root / "ckpt"), "--max-iters", "3",
                    "--sample-tokens", "0", cwd=root)
    assert r.returncode == 0, r.stderr
    return root


def test_example_prints_the_tables_and_writes_the_heatmaps(tiny_ckpt):
    out = tiny_ckpt / "out"
    r = run_lens("--ckpt-dir", str(tiny_ckpt / "ckpt"), "--prompt", "the fox",
                    "--tuned-steps", "3", "--report-windows", "2", "--out-dir", str(out), cwd=tiny_ckpt)
    assert r.returncode == 0, r.stderr
    for title in ("logit lens", "tuned lens"):
        assert f"{title}: the top token and its probability" in r.stdout, r.stdout
        png = out / f"{title.replace(' ', '_')}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    header = next(line for line in r.stdout.splitlines() if line.split() == list("the␣fox"))
    assert header
    body = r.stdout.split("logit lens: the top token")[1].split("\n\n")[0].splitlines()
    rows = [line.split() for line in body if line.startswith(("embed", "final"))]
    assert [row[0] for row in rows] == ["embed", "final"], r.stdout  # the tiny model's one layer, and its output
    for row in rows:  # 7 cells: a token and its probability
        assert len(row) == 1 + 2 * 7 and all(0 <= float(p) <= 1 for p in row[2::2]), r.stdout
    assert "tuned KL" in r.stdout and "logit top1" in r.stdout


def test_example_without_the_tuned_lens(tiny_ckpt):
    out = tiny_ckpt / "out-logit"
    r = run_lens("--ckpt-dir", str(tiny_ckpt / "ckpt"), "--prompt", "a cat", "--no-tuned",
                    "--report-windows", "2", "--out-dir", str(out), cwd=tiny_ckpt)
    assert r.returncode == 0, r.stderr
    assert (out / "logit_lens.png").exists() and not (out / "tuned_lens.png").exists()
    assert "tuned" not in r.stdout


@pytest.mark.parametrize("prompt, message", [("Zebra!", "--prompt: the text has .* not in the vocabulary"),
                                             ("the " * 10, "--prompt is 40 tokens, longer than the model's context")])
def test_example_rejects_a_bad_prompt_in_one_line(tiny_ckpt, prompt, message):
    import re
    r = run_lens("--ckpt-dir", str(tiny_ckpt / "ckpt"), "--prompt", prompt, "--no-tuned",
                    cwd=tiny_ckpt)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and re.search(message, r.stderr), r.stderr
