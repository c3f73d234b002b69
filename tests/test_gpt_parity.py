"""tinyllm's GPT against a nanoGPT-shaped torch model (tests/torch_nanogpt.py) holding the same weights:
logits, loss, every gradient, 50 AdamW steps, weight loading both ways, generate(), bias=False and dropout.

Run with `pytest -s` to see the measured parity figures.

Metric: rel(a, b) = ‖a − b‖₂ / ‖b‖₂ over the whole array (b is torch's value); for the scalar loss, |a − b| / |b|.
"""
import math
import sys

import numpy as np
import pytest
import torch

import tinyllm as tl
from helpers import rel, spread_weights
from tinyllm.models.gpt import GPT, GPTConfig

pytestmark = pytest.mark.usefixtures("each_runtime", "one_torch_thread")  # on every runtime (conftest.py)

import torch_nanogpt as ref

LOGITS_RTOL = 1e-5  # float32 forward through 2 blocks: both sides round the same ops, differences are ~1e-7
GRAD_RTOL = 1e-4    # float32 backward sums in a different order than torch's kernels; measured ~1e-6
DRIFT_RTOL = 1e-3   # 50 AdamW steps amplify rounding differences; the losses must still agree to 0.1 %
STEPS = 50

CFG = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=65)
BATCH = 4
FIGURES = {}


def report(name, value, limit):
    FIGURES[name] = value
    print(f"\n[parity] {name}: {value:.3e} (limit {limit:.0e})")
    assert value <= limit, f"{name} = {value:.3e} exceeds {limit:.0e}"


def to_torch_state(model):
    """tinyllm state_dict -> numpy -> torch tensors."""
    return {k: torch.from_numpy(np.array(v.numpy(), copy=True)) for k, v in model.state_dict().items()}


def make_pair(seed=0, spread=False, **overrides):
    """tinyllm's GPT and the torch model holding its weights. spread=True replaces GPT-2's small init
    (std 0.02, under which every GELU and softmax input is near 0 and nearly linear) by weights that put
    O(1) values through every nonlinearity, so a wrong formula anywhere shows in the figures."""
    cfg = {**CFG, **overrides}
    tl.manual_seed(seed)
    model = GPT(GPTConfig(**cfg))
    if spread:
        spread_weights(model, seed)
    torch.manual_seed(seed + 1)
    tmodel = ref.GPT(ref.GPTConfig(**cfg))
    tmodel.load_state_dict(to_torch_state(model))
    return model, tmodel


def batch(rng, block=CFG["block_size"], vocab=CFG["vocab_size"], b=BATCH):
    x = rng.integers(0, vocab, (b, block))
    y = rng.integers(0, vocab, (b, block))
    return x, y


def forward_backward(model, tmodel, x, y):
    logits, loss = model(tl.tensor(x), tl.tensor(y))
    loss.backward()
    tlogits, tloss = tmodel(torch.from_numpy(x), torch.from_numpy(y))
    tloss.backward()
    return logits.numpy(), loss.item(), tlogits.detach().numpy(), tloss.item()


def check_forward_backward(model, tmodel, x, y, tag=""):
    logits, loss, tlogits, tloss = forward_backward(model, tmodel, x, y)
    report(f"logits rel err{tag}", rel(logits, tlogits), LOGITS_RTOL)
    report(f"loss rel err{tag}", abs(loss - tloss) / abs(tloss), LOGITS_RTOL)
    tparams = dict(tmodel.named_parameters())
    names = [n for n, _ in model.named_parameters()]
    assert sorted(names) == sorted(tparams), "parameter names differ from nanoGPT's"
    errs = {}
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} got no gradient"
        tg = tparams[name].grad.numpy()
        assert np.linalg.norm(tg) > 0, f"torch's gradient of {name} is zero: the check would be vacuous"
        errs[name] = rel(p.grad.numpy(), tg)
    worst = max(errs, key=errs.get)
    print(f"\n[parity] worst gradient{tag}: {worst}")
    report(f"max grad rel err{tag}", errs[worst], GRAD_RTOL)


def test_state_dict_names_match_nanogpt():
    model, tmodel = make_pair()
    assert list(model.state_dict()) == list(tmodel.state_dict())
    for k, v in model.state_dict().items():
        assert v.shape == tuple(tmodel.state_dict()[k].shape), k
    assert model.lm_head.weight is model.transformer.wte.weight, "lm_head must be tied to wte"
    assert model.num_parameters() == sum(p.numel() for p in tmodel.parameters())


def test_logits_loss_and_gradients_match_torch():
    model, tmodel = make_pair(spread=True)
    check_forward_backward(model, tmodel, *batch(np.random.default_rng(1)))


def test_ignore_index_targets_match_torch():
    """nanoGPT masks targets with -1; those positions must add nothing to the loss or the gradients."""
    model, tmodel = make_pair(seed=3, spread=True)
    x, y = batch(np.random.default_rng(2))
    y[:, ::3] = -1
    check_forward_backward(model, tmodel, x, y, tag=" (ignore_index=-1)")


def test_inference_returns_last_position_logits():
    model, tmodel = make_pair()
    x, _ = batch(np.random.default_rng(4), block=7)
    logits, loss = model(tl.tensor(x))
    tlogits, _ = tmodel(torch.from_numpy(x))
    assert loss is None and logits.shape == (BATCH, 1, CFG["vocab_size"])
    assert rel(logits.numpy(), tlogits.detach().numpy()) <= LOGITS_RTOL


def test_too_long_sequence_raises():
    model, _ = make_pair()
    x = np.zeros((1, CFG["block_size"] + 1), np.int64)
    with pytest.raises(ValueError, match="block_size"):
        model(tl.tensor(x))


def test_bad_config_raises():
    with pytest.raises(ValueError, match="divisible"):
        GPT(GPTConfig(**{**CFG, "n_head": 3}))


def test_configure_optimizers_groups_as_nanogpt():
    model, tmodel = make_pair()
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3)
    topt = tmodel.configure_optimizers(weight_decay=0.1, learning_rate=1e-3)
    name_of = {id(p): n for n, p in model.named_parameters()}
    tname_of = {id(p): n for n, p in tmodel.named_parameters()}
    groups = [(g["weight_decay"], sorted(name_of[id(p)] for p in g["params"])) for g in opt.param_groups]
    tgroups = [(g["weight_decay"], sorted(tname_of[id(p)] for p in g["params"])) for g in topt.param_groups]
    assert groups == tgroups
    assert opt.param_groups[0]["betas"] == (0.9, 0.95)


def test_adamw_training_tracks_torch():
    """50 AdamW steps on fresh random batches: the losses stay together at every step."""
    model, tmodel = make_pair(seed=5)
    lr, wd = 3e-3, 0.1
    opt = model.configure_optimizers(weight_decay=wd, learning_rate=lr, betas=(0.9, 0.95))
    topt = tmodel.configure_optimizers(weight_decay=wd, learning_rate=lr, betas=(0.9, 0.95), eps=1e-8)
    assert opt.param_groups[0]["eps"] == topt.param_groups[0]["eps"]
    rng = np.random.default_rng(6)
    drift, losses = [], []
    for _ in range(STEPS):
        x, _ = batch(rng)
        y = (7 * x + 3) % CFG["vocab_size"]  # a learnable task (a fixed bigram map), so the loss falls
        _, loss = model(tl.tensor(x), tl.tensor(y))
        loss.backward()
        opt.step()
        opt.zero_grad()
        _, tloss = tmodel(torch.from_numpy(x), torch.from_numpy(y))
        tloss.backward()
        topt.step()
        topt.zero_grad()
        losses.append(tloss.item())
        drift.append(abs(loss.item() - tloss.item()) / abs(tloss.item()))
    # the run must actually train, or agreeing losses would say little
    assert losses[-1] < losses[0] - 0.1, f"loss did not fall: {losses[0]:.3f} -> {losses[-1]:.3f}"
    print(f"\n[parity] loss {losses[0]:.4f} -> {losses[-1]:.4f} over {STEPS} steps")
    report(f"max loss drift over {STEPS} steps", max(drift), DRIFT_RTOL)
    tparams = dict(tmodel.named_parameters())
    final = {n: rel(p.numpy(), tparams[n].detach().numpy()) for n, p in model.named_parameters()}
    worst = max(final, key=final.get)
    print(f"[parity] max parameter rel err after {STEPS} steps: {final[worst]:.3e} ({worst}; not asserted: "
          "the key bias's true gradient is 0, softmax being shift-invariant, and Adam's m/√v turns both sides' "
          "rounding noise there into lr-sized steps)")


@pytest.mark.parametrize("as_numpy", [False, True], ids=["torch-tensors", "numpy-arrays"])
def test_load_torch_weights_into_tinyllm(as_numpy):
    torch.manual_seed(7)
    tmodel = ref.GPT(ref.GPTConfig(**CFG))
    with torch.no_grad():  # non-trivial LayerNorm parameters and biases, so every tensor matters
        for n, p in tmodel.named_parameters():
            if n.endswith("bias") or ".ln_" in n:
                p.add_(0.1 * torch.randn_like(p))
    tl.manual_seed(8)
    model = GPT(GPTConfig(**CFG))
    state = {k: (v.numpy() if as_numpy else v) for k, v in tmodel.state_dict().items()}
    missing, unexpected = model.load_state_dict(state)
    assert not missing and not unexpected
    assert model.lm_head.weight is model.transformer.wte.weight, "loading must keep the tie"
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), tmodel.state_dict()[k].numpy(), err_msg=k)
    x, y = batch(np.random.default_rng(9))
    logits, loss = model(tl.tensor(x), tl.tensor(y))
    tlogits, tloss = tmodel(torch.from_numpy(x), torch.from_numpy(y))
    assert rel(logits.numpy(), tlogits.detach().numpy()) <= LOGITS_RTOL
    assert abs(loss.item() - tloss.item()) <= LOGITS_RTOL * abs(tloss.item())


def test_bias_false_matches_torch():
    model, tmodel = make_pair(seed=10, spread=True, bias=False)
    names = [n for n, _ in model.named_parameters()]
    assert not any(n.endswith("bias") for n in names)
    assert sorted(names) == sorted(n for n, _ in tmodel.named_parameters())
    check_forward_backward(model, tmodel, *batch(np.random.default_rng(11)), tag=" (bias=False)")


def test_dropout_eval_equals_no_dropout_and_train_differs():
    tl.manual_seed(12)
    drop = GPT(GPTConfig(**CFG, dropout=0.2))
    plain = GPT(GPTConfig(**CFG))
    plain.load_state_dict(drop.state_dict())
    x, y = batch(np.random.default_rng(13))
    drop.eval()
    assert all(not m.training for m in drop.modules())
    logits_eval, loss_eval = drop(tl.tensor(x), tl.tensor(y))
    logits_plain, loss_plain = plain(tl.tensor(x), tl.tensor(y))
    np.testing.assert_array_equal(logits_eval.numpy(), logits_plain.numpy())
    assert loss_eval.item() == loss_plain.item()
    # torch's eval-mode model with dropout agrees too
    tmodel = ref.GPT(ref.GPTConfig(**CFG, dropout=0.2))
    tmodel.load_state_dict(to_torch_state(drop))
    tmodel.eval()
    tlogits, _ = tmodel(torch.from_numpy(x), torch.from_numpy(y))
    assert rel(logits_eval.numpy(), tlogits.detach().numpy()) <= LOGITS_RTOL
    # in training mode dropout is live: the output changes, and from call to call
    drop.train()
    a, _ = drop(tl.tensor(x), tl.tensor(y))
    b, _ = drop(tl.tensor(x), tl.tensor(y))
    assert rel(a.numpy(), logits_plain.numpy()) > 1e-3
    assert rel(a.numpy(), b.numpy()) > 1e-3


# ---- generate ---------------------------------------------------------------------------------------------------

def sharpened_pair(seed):
    """A pair whose next-token distribution is far from uniform (a large final LayerNorm gain), so sampling
    checks can tell temperatures and top-k apart."""
    model, tmodel = make_pair(seed=seed)
    model.transformer.ln_f.weight.copy_(np.full(CFG["n_embd"], 40.0, np.float32))
    tmodel.load_state_dict(to_torch_state(model))
    return model, tmodel


def test_generate_shape_and_range():
    model, _ = make_pair(seed=14)
    prompt = np.random.default_rng(15).integers(0, CFG["vocab_size"], (3, 5))
    tl.manual_seed(16)
    n = CFG["block_size"] + 4  # runs past block_size: the context must be cropped
    out = model.generate(tl.tensor(prompt), n).numpy()
    assert out.shape == (3, 5 + n) and out.dtype == np.int64
    np.testing.assert_array_equal(out[:, :5], prompt)
    assert out.min() >= 0 and out.max() < CFG["vocab_size"]


def test_generate_top_k_1_is_greedy():
    model, tmodel = sharpened_pair(seed=17)
    prompt = np.random.default_rng(18).integers(0, CFG["vocab_size"], (2, 4))
    n = CFG["block_size"]  # also past block_size
    tl.manual_seed(19)
    out = model.generate(tl.tensor(prompt), n, top_k=1).numpy()
    np.testing.assert_array_equal(out, ref.greedy_decode(tmodel, prompt, n))
    # a near-zero temperature is greedy too
    out_cold = model.generate(tl.tensor(prompt), n, temperature=1e-6).numpy()
    np.testing.assert_array_equal(out_cold, ref.greedy_decode(tmodel, prompt, n))


def test_generate_replays_the_forward_after_three_tokens(monkeypatch):
    """generate(use_cache=False) runs the model's Python for the first three tokens only (tinyllm.jit records the
    forward on the second and third and replays it after), with the same tokens as the forward run every time (jit
    off). (The cached path's replay: tests/test_generate.py.)"""
    model, _ = sharpened_pair(seed=20)
    prompt = np.random.default_rng(21).integers(0, CFG["vocab_size"], (2, 3))
    calls = []
    features = GPT._features
    monkeypatch.setattr(GPT, "_features", lambda self, idx: calls.append(1) or features(self, idx))
    tl.manual_seed(22)
    out = model.generate(tl.tensor(prompt), 12, use_cache=False).numpy()
    assert len(calls) == 3
    monkeypatch.setattr(sys.modules["tinyllm.replay.jit"], "jit", lambda fn: fn)  # every token through the model's Python
    model.__dict__.pop("_decoders", None)  # (generate keeps its jitted steps between calls)
    tl.manual_seed(22)
    np.testing.assert_array_equal(model.generate(tl.tensor(prompt), 12, use_cache=False).numpy(), out)
    assert len(calls) == 3 + 12


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_generate_samples_softmax_of_logits_over_temperature(temperature):
    """One sampled token from many copies of one prompt: its histogram must match softmax(logits / T)."""
    model, tmodel = sharpened_pair(seed=20)
    prompt = np.random.default_rng(21).integers(0, CFG["vocab_size"], (1, 6))
    n = 4000
    tl.manual_seed(22)
    out = model.generate(tl.tensor(np.repeat(prompt, n, 0)), 1, temperature=temperature).numpy()
    hist = np.bincount(out[:, -1], minlength=CFG["vocab_size"]) / n
    with torch.no_grad():
        logits = tmodel(torch.from_numpy(prompt))[0][0, -1].double()
    want = torch.softmax(logits / temperature, -1).numpy()
    other = torch.softmax(logits / (2.5 - temperature), -1).numpy()  # the other temperature's distribution
    tv = 0.5 * np.abs(hist - want).sum()
    tv_other = 0.5 * np.abs(want - other).sum()
    # sampling noise: E[TV] ≈ ½ Σ √(p(1-p)/n)·√(2/π) < ½·√(V/n) ≈ 0.064 for V = 65 and n = 4000
    assert tv < 0.08, f"sampled histogram is {tv:.3f} (total variation) away from softmax(logits/{temperature})"
    assert tv_other > 0.2, "the two temperatures' distributions are too close for the check to mean anything"


def test_generate_top_k_restricts_to_k_best():
    model, tmodel = make_pair(seed=23)
    prompt = np.random.default_rng(24).integers(0, CFG["vocab_size"], (1, 6))
    k, n = 5, 2000
    tl.manual_seed(25)
    out = model.generate(tl.tensor(np.repeat(prompt, n, 0)), 1, temperature=1.0, top_k=k).numpy()[:, -1]
    with torch.no_grad():
        logits = tmodel(torch.from_numpy(prompt))[0][0, -1]
    best = set(torch.topk(logits, k).indices.tolist())
    assert set(out.tolist()) == best, "top_k sampling must use exactly the k most likely tokens"


def test_print_parity_summary():
    """Runs last (pytest keeps file order): one line with the figures the earlier tests measured."""
    keys = ["logits rel err", "max grad rel err", f"max loss drift over {STEPS} steps"]
    if all(k in FIGURES for k in keys):
        print("\n[parity] summary: " + ", ".join(f"{k} {FIGURES[k]:.2e}" for k in keys))
    assert all(math.isfinite(v) for v in FIGURES.values())
