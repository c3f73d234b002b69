"""Sparse autoencoders (tinyllm/interp/sae.py): the maps and gradients beside torch, recovery of planted feature
directions by both kinds, the training invariants (unit-norm decoder rows, encoder = decoder transpose at init,
resampling, AuxK), SAELens's metrics against NumPy formulas, ce_loss_score through a GPT's hooks, and errors."""

import numpy as np
import pytest
import torch

import tinyllm as tl
from helpers import reference_runtime  # noqa: F401 (numpy runtime for this module)
from tinyllm.interp.sae import (SparseAutoencoder, ce_loss_metrics, init_from_data, resample_dead, sae_metrics,
                                train_sae, train_step_loss)
from tinyllm.optim import Adam


def planted(n=20000, d=32, m=64, active=3, noise=0.01, seed=7):
    """n samples, each the sum of `active` of m random unit directions in d dimensions (coefficients 0.5..1.5) plus
    Gaussian noise; and the directions (m, d). (Not seed 0: the SAE of seed 0 would start at these directions.)"""
    rng = np.random.default_rng(seed)
    D = rng.standard_normal((m, d))
    D /= np.linalg.norm(D, axis=1, keepdims=True)
    idx = np.argsort(rng.random((n, m)), axis=1)[:, :active]
    coef = np.zeros((n, m))
    np.put_along_axis(coef, idx, rng.uniform(0.5, 1.5, (n, active)), 1)
    return (coef @ D + noise * rng.standard_normal((n, d))).astype(np.float32), D


def recovered(sae, directions, threshold=0.9):
    """The fraction of `directions` that some decoder row matches with |cosine| >= threshold."""
    W = sae.W_dec.numpy().astype(np.float64)
    W /= np.linalg.norm(W, axis=1, keepdims=True)
    return float((np.abs(directions @ W.T).max(1) >= threshold).mean())


def random_sae(kind, d_in=6, d_hidden=10, k=3, seed=0):
    """An SAE with random (not transposed) weights and biases, so that no term of the maps hides."""
    sae = SparseAutoencoder(d_in, d_hidden, kind=kind, k=k, l1=0.7, seed=seed)
    rng = np.random.default_rng(seed + 1)
    for p in (sae.W_enc, sae.W_dec, sae.b_enc, sae.b_dec):
        p.copy_(rng.normal(0, 0.5, p.shape).astype(np.float32))
    return sae


def numpy_encode(sae, x):
    W_enc, b_enc, b_dec = sae.W_enc.numpy(), sae.b_enc.numpy(), sae.b_dec.numpy()
    pre = (x - b_dec) @ W_enc + b_enc
    if sae.kind == "relu":
        return np.maximum(pre, 0)
    out = np.zeros_like(pre)
    top = np.argsort(-pre, axis=1)[:, :sae.k]
    np.put_along_axis(out, top, np.maximum(np.take_along_axis(pre, top, 1), 0), 1)
    return out


def torch_loss(sae, x):
    """The SAE's loss in torch, written from the formulas, with the parameters as leaf tensors."""
    params = {n: torch.tensor(getattr(sae, n).numpy(), requires_grad=True)
              for n in ("W_enc", "b_enc", "W_dec", "b_dec")}
    xt = torch.tensor(x)
    pre = (xt - params["b_dec"]) @ params["W_enc"] + params["b_enc"]
    if sae.kind == "relu":
        f = pre.relu()
    else:
        v, i = pre.topk(sae.k, dim=-1)
        f = torch.zeros_like(pre).scatter(-1, i, v.relu())
    recon = f @ params["W_dec"] + params["b_dec"]
    mse = ((recon - xt) ** 2).mean()
    if sae.kind == "relu":
        loss = mse * sae.d_in + sae.l1 * (f * params["W_dec"].norm(dim=-1)).sum(-1).mean()
    else:
        loss = mse
    loss.backward()
    return loss.item(), {n: p.grad.numpy() for n, p in params.items()}


# ---- init, maps and gradients -------------------------------------------------------------------------------------
def test_init_encoder_is_decoder_transpose_and_rows_unit_norm():
    sae = SparseAutoencoder(12, 40, kind="topk", k=4, seed=3)
    W_enc, W_dec = sae.W_enc.numpy(), sae.W_dec.numpy()
    assert W_enc.shape == (12, 40) and W_dec.shape == (40, 12)
    np.testing.assert_array_equal(W_enc, W_dec.T)
    np.testing.assert_allclose(np.linalg.norm(W_dec, axis=1), 1, atol=1e-6)
    assert np.abs(W_dec @ W_dec.T - np.eye(40)).max() > 0.1  # random directions, not a fixed basis
    np.testing.assert_array_equal(sae.b_enc.numpy(), 0)
    np.testing.assert_array_equal(sae.b_dec.numpy(), 0)
    assert [n for n, _ in sae.named_parameters()] == ["W_dec", "W_enc", "b_enc", "b_dec"]


@pytest.mark.parametrize("kind", ["relu", "topk"])
def test_encode_decode_and_gradients_match_torch(kind):
    sae = random_sae(kind)
    x = np.random.default_rng(5).normal(0, 1, (9, 6)).astype(np.float32)
    f = sae.encode(tl.tensor(x)).numpy()
    np.testing.assert_allclose(f, numpy_encode(sae, x), rtol=1e-5, atol=1e-6)
    if kind == "topk":
        assert ((f > 0).sum(1) <= 3).all() and ((f > 0).sum(1) >= 1).any()
    recon = sae(tl.tensor(x)).numpy()
    np.testing.assert_allclose(recon, f @ sae.W_dec.numpy() + sae.b_dec.numpy(), rtol=1e-5, atol=1e-5)
    out = sae.loss_parts(tl.tensor(x))
    out.loss.backward()
    want_loss, want_grads = torch_loss(sae, x)
    assert out.loss.item() == pytest.approx(want_loss, rel=1e-5)
    for name, g in want_grads.items():
        np.testing.assert_allclose(getattr(sae, name).grad.numpy(), g, rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("d_hidden", [20, 160])  # the decoder: a masked product (20), a gather of k rows (160)
def test_training_step_of_topk_is_loss_parts(d_hidden):
    """train_step_loss (top-k chosen on the host, the decoder applied to those k) gives loss_parts' loss and
    gradients when no latent is dead, and reports which latents fired and the mean l0."""
    sae = random_sae("topk", d_in=8, d_hidden=d_hidden, k=4, seed=2)
    x = tl.tensor(np.random.default_rng(6).normal(0, 1, (11, 8)).astype(np.float32))
    loss, mse, fired, l0 = train_step_loss(sae, x)
    loss.backward()
    fast = {n: getattr(sae, n).grad.numpy() for n in ("W_enc", "b_enc", "W_dec", "b_dec")}
    sae.zero_grad()
    out = sae.loss_parts(x)
    out.loss.backward()
    assert loss.item() == pytest.approx(out.loss.item(), rel=1e-5)
    for name, g in fast.items():
        np.testing.assert_allclose(g, getattr(sae, name).grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)
    f = out.feats.numpy()
    np.testing.assert_array_equal(fired, (f > 0).any(0))
    assert l0 == pytest.approx((f > 0).sum(1).mean())


def test_auxk_gives_dead_latents_a_gradient():
    """Latents 8..15 have positive pre-activations that never reach the top k: without AuxK their encoder columns
    get no gradient; marked dead, AuxK's reconstruction of the error reaches them."""
    sae = SparseAutoencoder(6, 16, kind="topk", k=2, aux_k=3, seed=1)
    b_enc = np.where(np.arange(16) < 8, 5.0, 1.0).astype(np.float32)
    sae.b_enc.copy_(b_enc)
    x = tl.tensor(np.random.default_rng(0).normal(0, 0.1, (10, 6)).astype(np.float32))
    dead = np.arange(16) >= 8
    loss, _, fired, _ = train_step_loss(sae, x)
    assert not fired[8:].any()
    loss.backward()
    assert np.abs(sae.W_enc.grad.numpy()[:, 8:]).max() == 0
    sae.zero_grad()
    loss_aux, mse, _, _ = train_step_loss(sae, x, dead=dead)
    assert loss_aux.item() > mse.item()
    loss_aux.backward()
    g = np.abs(sae.W_enc.grad.numpy())
    assert (g[:, 8:].max(0) > 1e-6).sum() >= 3  # at least aux_k dead latents learn
    assert np.abs(sae.W_dec.grad.numpy()[8:]).max() > 1e-6


def test_wrong_width_is_a_clear_error():
    sae = SparseAutoencoder(32, 64, kind="topk", k=4)
    for call in (lambda: sae.encode(tl.zeros(5, 48)), lambda: sae(tl.zeros(2, 3, 48)),
                 lambda: sae_metrics(sae, np.zeros((5, 48), np.float32))):
        with pytest.raises(ValueError, match=r"SparseAutoencoder.*d_in=32.*got width 48"):
            call()
    with pytest.raises(ValueError, match="kind must be one of"):
        SparseAutoencoder(4, 8, kind="gated")
    with pytest.raises(ValueError, match="k must be an int in 1..d_hidden=8"):
        SparseAutoencoder(4, 8, kind="topk", k=9)


# ---- training ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind, options, min_ev", [("topk", dict(k=3, tokens=40_000), 0.85),
                                                   ("relu", dict(l1=2.0, tokens=60_000), 0.7)])
def test_planted_directions_are_recovered(kind, options, min_ev):
    """64 unit directions in 32 dimensions, 3 active per sample: each kind (128 latents) recovers >= 90 % of them (a
    decoder row at |cosine| >= 0.9), its decoder rows stay unit norm, and the reconstruction explains most of the
    variance (relu's L1 shrinks the activations, so less)."""
    x, directions = planted()
    untrained = SparseAutoencoder(32, 128, kind=kind, k=3)
    assert recovered(untrained, directions) < 0.1  # the bar is not met by chance: not at random directions,
    init_from_data(untrained, x[:128] - x.mean(0))
    assert recovered(untrained, directions) < 0.1  # nor at train_sae's start, data points (3 directions each)
    sae = train_sae(x, d_hidden=128, kind=kind, batch_size=128, lr=1e-2, progress=False, seed=0, **options)
    assert recovered(sae, directions) >= 0.9
    np.testing.assert_allclose(np.linalg.norm(sae.W_dec.numpy(), axis=1), 1, atol=1e-5)
    m = sae_metrics(sae, x[:4000])
    assert m["explained_variance"] > min_ev and m["l0"] < 12
    steps = -(-options["tokens"] // 128)
    assert sae.train_log["tokens"] == steps * 128 and sae.train_log["history"][-1]["step"] == steps


def test_scale_is_folded_back():
    """train_sae trains on activations scaled to mean squared norm d_in and folds the scale into the biases: the
    SAE reconstructs the raw activations (a scaled copy of the data gives scaled biases and the same directions)."""
    x, _ = planted(n=4000)
    a = train_sae(x, d_hidden=64, k=3, tokens=4096, batch_size=128, progress=False, lr=3e-3)
    b = train_sae(x * 50, d_hidden=64, k=3, tokens=4096, batch_size=128, progress=False, lr=3e-3)
    np.testing.assert_allclose(b.W_dec.numpy(), a.W_dec.numpy(), atol=2e-3)
    np.testing.assert_allclose(b.b_dec.numpy(), 50 * a.b_dec.numpy(), rtol=1e-3, atol=1e-3)
    ev_a, ev_b = sae_metrics(a, x)["explained_variance"], sae_metrics(b, x * 50)["explained_variance"]
    assert ev_a > 0.3 and ev_b == pytest.approx(ev_a, abs=1e-3)


def test_resampling_reinitializes_dead_latents():
    """Towards Monosemanticity's resampling: a dead latent's decoder row becomes a normalized (input - b_dec), its
    encoder column that direction at 0.2 x the live columns' mean norm, its bias 0, its Adam moments 0."""
    sae = random_sae("relu", d_in=6, d_hidden=10)
    opt = Adam(sae.parameters(), lr=1e-2)
    x = np.random.default_rng(3).normal(0, 1, (50, 6)).astype(np.float32)
    sae.loss_parts(tl.tensor(x)).loss.backward()
    opt.step()
    dead = np.zeros(10, bool)
    dead[[2, 7]] = True
    live_norm = np.linalg.norm(sae.W_enc.numpy()[:, ~dead], axis=0).mean()
    before = sae.W_dec.numpy().copy()
    assert resample_dead(sae, opt, x, dead, np.random.default_rng(0)) == 2
    W_dec, W_enc, b_dec = sae.W_dec.numpy(), sae.W_enc.numpy(), sae.b_dec.numpy()
    np.testing.assert_array_equal(W_dec[~dead], before[~dead])
    inputs = (x - b_dec) / np.linalg.norm(x - b_dec, axis=1, keepdims=True)
    for i in (2, 7):
        assert np.abs(inputs @ W_dec[i] - 1).min() < 1e-5  # one of the inputs, normalized
        np.testing.assert_allclose(W_enc[:, i], 0.2 * live_norm * W_dec[i], rtol=1e-5, atol=1e-6)
    assert sae.b_enc.numpy()[[2, 7]].tolist() == [0, 0]
    for key in ("exp_avg", "exp_avg_sq"):
        assert not opt.state[sae.W_dec][key].numpy()[[2, 7]].any()
        assert opt.state[sae.W_dec][key].numpy()[~dead].any()
        assert not opt.state[sae.W_enc][key].numpy()[:, [2, 7]].any()


# ---- metrics ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["relu", "topk"])
def test_metrics_match_numpy(kind):
    sae = random_sae(kind, d_in=6, d_hidden=10, k=2)
    sae.b_enc.copy_(np.array([-9] * 3 + [0.1] * 7, np.float32))  # latents 0..2 never fire
    x = np.random.default_rng(8).normal(0, 1, (37, 6)).astype(np.float32) + 2.0
    f = numpy_encode(sae, x)
    recon = f @ sae.W_dec.numpy() + sae.b_dec.numpy()
    m = sae_metrics(sae, x, batch_size=8)  # several batches
    assert m["explained_variance"] == pytest.approx(1 - ((x - recon) ** 2).sum() / ((x - x.mean(0)) ** 2).sum(),
                                                    rel=1e-5)
    assert m["l0"] == pytest.approx((f > 0).sum(1).mean())
    assert m["l1"] == pytest.approx(np.abs(f).sum(1).mean(), rel=1e-5)
    assert m["mse"] == pytest.approx(((x - recon) ** 2).mean(), rel=1e-5)
    dead = int((~(f > 0).any(0)).sum())
    assert dead >= 3 and m["dead_features"] == dead and m["dead_fraction"] == pytest.approx(dead / 10)
    assert set(m) == {"explained_variance", "l0", "l1", "mse", "dead_features", "dead_fraction"}


# ---- through a model's hooks ----------------------------------------------------------------------------------------
HOOK = "blocks.0.hook_resid_post"


@pytest.fixture(scope="module")
def tiny_gpt():
    from helpers import spread_weights
    from tinyllm.models import GPT, GPTConfig
    tl.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, block_size=16, vocab_size=11))
    spread_weights(model, 0)
    model.eval()
    tokens = np.random.default_rng(0).integers(0, 11, 16 * 6)
    return model, tokens


def identity_sae(d):
    """A real SAE that reconstructs exactly: latents relu(x) and relu(-x), decoded by +I and -I."""
    sae = SparseAutoencoder(d, 2 * d, kind="relu")
    eye = np.eye(d, dtype=np.float32)
    sae.W_enc.copy_(np.concatenate([eye, -eye], 1))
    sae.W_dec.copy_(np.concatenate([eye, -eye], 0))
    return sae


def test_ce_loss_score_is_one_for_a_perfect_and_zero_for_a_zero_reconstruction(tiny_gpt):
    model, tokens = tiny_gpt
    perfect = ce_loss_metrics(identity_sae(16), model, HOOK, tokens, batch_windows=4)  # two batches
    assert perfect["ce_loss_score"] == pytest.approx(1.0, abs=1e-4)
    zero = identity_sae(16)
    zero.b_enc.copy_(np.full(32, -1e4, np.float32))  # no latent fires: the reconstruction is b_dec = 0
    ablated = ce_loss_metrics(zero, model, HOOK, tokens)
    assert ablated["ce_loss_score"] == pytest.approx(0.0, abs=1e-6)
    # the three cross-entropies: the model's own next-token loss, and zeroing the residual changes it (a random
    # model: not necessarily for the worse)
    idx = tl.tensor(tokens.reshape(6, 16))
    _, loss = model(idx[:, :-1], idx[:, 1:])
    assert perfect["ce_loss_without_sae"] == pytest.approx(loss.item(), rel=1e-5)
    assert perfect["ce_loss_with_sae"] == pytest.approx(loss.item(), rel=1e-4)
    assert abs(ablated["ce_loss_with_ablation"] - loss.item()) > 0.1
    half = identity_sae(16)  # half the reconstruction: a score between, by the formula
    half.W_dec.copy_(half.W_dec.numpy() * 0.5)
    m = ce_loss_metrics(half, model, HOOK, tokens)
    ablated = m["ce_loss_with_ablation"]
    want = (ablated - m["ce_loss_with_sae"]) / (ablated - m["ce_loss_without_sae"])
    assert m["ce_loss_score"] == pytest.approx(want) and abs(want - 1) > 1e-3 and abs(want) > 1e-3
    assert m["ce_loss_with_sae"] != pytest.approx(loss.item(), rel=1e-3)


def test_train_on_a_models_hook_and_report_metrics(tiny_gpt):
    """train_sae((model, hook_name, tokens)) reads the hook over windows of the context length; sae_metrics with
    the model adds ce_loss_score."""
    from tinyllm.interp.sae import collect_activations
    model, tokens = tiny_gpt
    acts = collect_activations(model, HOOK, tokens, batch_windows=4, progress=False)
    _, cache = model.run_with_cache(tl.tensor(tokens.reshape(6, 16)), names_filter=[HOOK])
    np.testing.assert_allclose(acts, cache[HOOK].numpy().reshape(-1, 16), rtol=1e-5, atol=1e-6)
    sae = train_sae((model, HOOK, tokens), expansion=4, k=4, tokens=2048, batch_size=32, progress=False, lr=3e-3)
    assert (sae.d_in, sae.d_hidden) == (16, 64)
    m = sae_metrics(sae, acts, model=model, hook_name=HOOK, tokens=tokens)
    assert m["l0"] <= 4 and 0.3 < m["explained_variance"] <= 1 and np.isfinite(m["ce_loss_score"])
    with pytest.raises(ValueError, match=r"SparseAutoencoder.*d_in=16.*got width 64"):
        sae_metrics(sae, np.zeros((4, 64), np.float32))


# ---- examples/interpret.py sae ----------------------------------------------------------------------------------
def test_interpret_sae_example(tmp_path):
    """On a checkpoint of examples/gpt.py --tiny: the metrics by SAELens's names, each feature's snippets, the PNG;
    a layer out of range is one line on stderr and exit code 2."""
    from helpers import run_example as run, small_corpus

    def interpret(*flags):
        return run("interpret.py", *flags, cwd=tmp_path)
    corpus = small_corpus(tmp_path)
    r = run("gpt.py", "--tiny", "--data", str(corpus), "--ckpt-dir", str(tmp_path / "m"), "--max-iters", "2",
            "--sample-tokens", "0", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    r = interpret("sae", "--ckpt-dir", str(tmp_path / "m"), "--layer", "0", "--tokens", "2048", "--collect", "1024",
                  "--features", "2", "--snippets", "2", "--out-dir", str(out))
    assert r.returncode == 0, r.stderr
    for name in ("explained_variance", "l0", "l1", "mse", "dead_features", "ce_loss_score"):
        assert f"  {name} " in r.stdout, r.stdout
    assert r.stdout.count("top activations (the token in [ ])") == 2
    png = out / "sae_features.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = interpret("sae", "--ckpt-dir", str(tmp_path / "m"), "--layer", "1", "--out-dir", str(out))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "--layer 1 is out of range: the model has 1 layer" in r.stderr
