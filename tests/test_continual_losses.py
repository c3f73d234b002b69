"""tinyllm.continual.losses against torch implementations of TRL's formulas (DPOTrainer.dpo_loss v0.28,
KTOTrainer.kto_loss), sequence_logprobs against torch's nanoGPT on the same weights, lora.disabled against a
frozen copy of the base model, and a bandit trained with dpo_loss against DPO's closed-form optimum.

Tolerances (rel(a, b) = ‖a − b‖₂ / ‖b‖₂, b the float64 torch reference): the losses' values, rewards and gradients
LOSS_RTOL 2e-6 (a few float32 ops: ≤ 5e-7 measured), gradients with an absolute allowance where they cancel
(grad_atol); sequence log-probabilities 1e-5 and their gradients 1e-4
(float32 forward and backward through a transformer block, sums in another order, as tests/test_lora.py).
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from hypothesis import given, strategies as st

import tinyllm as tl
from tinyllm import optim
from tinyllm.continual.losses import dpo_loss, kto_loss, sequence_logprobs
from tinyllm.models.gpt import GPT, GPTConfig
from tinyllm.nn import lora
from helpers import SEEDS, rel, spread_weights, reference_runtime  # noqa: F401 (autouse: numpy by default)

import torch_nanogpt as ref

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LOSS_RTOL, SEQ_RTOL, SEQ_GRAD_RTOL = 2e-6, 1e-5, 1e-4
CFG = dict(n_layer=1, n_head=2, n_embd=16, vocab_size=11, block_size=16)


def logps(rng, n, scale=3.0):
    return (rng.normal(0.0, scale, n) - 5.0).astype(np.float32)


def leaf(x):
    return tl.tensor(x, requires_grad=True)


def t64(x, grad=False):
    return torch.tensor(np.asarray(x, np.float64), requires_grad=grad)


def torch_dpo(pc, pr, rc, rr, beta, loss_type, eps):
    """TRL v0.28's dpo_loss, reference-based, for the three loss types."""
    z = (pc - pr) - (rc - rr)
    if loss_type == "sigmoid":
        losses = -TF.logsigmoid(beta * z) * (1 - eps) - TF.logsigmoid(-beta * z) * eps
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * z)
    else:
        losses = (z - 1 / (2 * beta)) ** 2
    return losses, beta * (pc - rc).detach(), beta * (pr - rr).detach()


def torch_kto(pc, pr, pk, rc, rr, rk, beta, wd, wu):
    """TRL's kto_loss with loss_type "kto" (empty sides give empty tensors)."""
    kl = (pk - rk).mean().detach().clamp(min=0)
    chosen = 1 - torch.sigmoid(beta * ((pc - rc) - kl))
    rejected = 1 - torch.sigmoid(beta * (kl - (pr - rr)))
    return torch.cat((wd * chosen, wu * rejected)), beta * (pc - rc).detach(), beta * (pr - rr).detach(), kl


def close(got, want, what, rtol=LOSS_RTOL, atol=0.0):
    """‖got − want‖ ≤ rtol·‖want‖ + atol."""
    got, want = np.asarray(got, np.float64), want.detach().numpy()
    assert got.shape == want.shape, (what, got.shape, want.shape)
    err = float(np.linalg.norm(got - want))
    assert err <= rtol * np.linalg.norm(want) + atol, (what, rel(got, want), err)


def grad_atol(beta, w):
    """Where the gradient cancels (label_smoothing 0.5: β/2·(σ(βz) − σ(−βz)) near z = 0) its relative error is
    unbounded: z itself is rounded to float32 (|z| error ~1e-6 for log-probabilities ~10), which moves each term
    by ~β²/4·1e-6 times its weight. An absolute allowance of that size."""
    return 1e-6 * beta * (1.0 + beta) * float(np.linalg.norm(w))


# ---- dpo_loss --------------------------------------------------------------------------------------------------
@given(seed=SEEDS, n=st.integers(1, 9), beta=st.floats(0.05, 2.0),
       loss_type=st.sampled_from(["sigmoid", "ipo", "hinge"]),
       eps=st.sampled_from([0.0, 0.1, 0.25, 0.5]))
def test_dpo_loss_values_rewards_and_gradients_match_torch(seed, n, beta, loss_type, eps):
    rng = np.random.default_rng(seed)
    pc, pr, rc, rr = (logps(rng, n) for _ in range(4))
    w = rng.normal(0, 1, n).astype(np.float32)  # a weighted sum: each element's gradient, not only their total
    eps = eps if loss_type == "sigmoid" else 0.0
    a, b = leaf(pc), leaf(pr)
    losses, cr, rj = dpo_loss(a, b, rc, rr.tolist(), beta=beta, loss_type=loss_type, label_smoothing=eps)
    (losses * tl.tensor(w)).sum().backward()
    ta, tb = t64(pc, True), t64(pr, True)
    tlosses, tcr, trj = torch_dpo(ta, tb, t64(rc), t64(rr), beta, loss_type, eps)
    (tlosses * t64(w)).sum().backward()
    close(losses.numpy(), tlosses, "losses")
    close(cr.numpy(), tcr, "chosen rewards")
    close(rj.numpy(), trj, "rejected rewards")
    if np.linalg.norm(ta.grad.numpy()) > 0:  # hinge: every pair may sit past the margin
        close(a.grad.numpy(), ta.grad, "d/d policy_chosen", atol=grad_atol(beta, w))
        close(b.grad.numpy(), tb.grad, "d/d policy_rejected", atol=grad_atol(beta, w))
    assert not cr.requires_grad and not rj.requires_grad


@pytest.mark.parametrize("loss_type", ["ipo", "hinge"])
def test_dpo_label_smoothing_is_ignored_with_a_warning_by_ipo_and_hinge(loss_type):
    rng = np.random.default_rng(0)
    args = [logps(rng, 4) for _ in range(4)]
    plain = dpo_loss(*args, loss_type=loss_type)[0].numpy()
    with pytest.warns(UserWarning, match="does not use label smoothing"):
        smoothed = dpo_loss(*args, loss_type=loss_type, label_smoothing=0.3)[0].numpy()
    np.testing.assert_array_equal(plain, smoothed)


# ---- kto_loss --------------------------------------------------------------------------------------------------
@given(seed=SEEDS, n_c=st.integers(0, 5), n_r=st.integers(0, 5), n_kl=st.integers(1, 6), beta=st.floats(0.05, 2.0),
       wd=st.sampled_from([1.0, 0.0, 1.33]), wu=st.sampled_from([1.0, 0.5, 2.0]), kl_shift=st.floats(-2.0, 2.0))
def test_kto_loss_values_rewards_kl_and_gradients_match_torch(seed, n_c, n_r, n_kl, beta, wd, wu, kl_shift):
    if n_c == 0 and n_r == 0:
        n_c = 1
    rng = np.random.default_rng(seed)
    pc, rc, pr, rr = logps(rng, n_c), logps(rng, n_c), logps(rng, n_r), logps(rng, n_r)
    rk = logps(rng, n_kl)
    pk = (rk + kl_shift + rng.normal(0, 0.5, n_kl)).astype(np.float32)  # kl_shift < 0: the clamp at 0 acts
    w = rng.normal(0, 1, n_c + n_r).astype(np.float32)
    a, b, k = leaf(pc), leaf(pr), leaf(pk)
    losses, cr, rj, kl = kto_loss(a, b, k, rc, rr, rk, beta=beta, desirable_weight=wd, undesirable_weight=wu)
    (losses * tl.tensor(w)).sum().backward()
    ta, tb, tk = t64(pc, True), t64(pr, True), t64(pk, True)
    tlosses, tcr, trj, tkl = torch_kto(ta, tb, tk, t64(rc), t64(rr), t64(rk), beta, wd, wu)
    (tlosses * t64(w)).sum().backward()
    close(losses.numpy(), tlosses, "losses")
    close(cr.numpy(), tcr, "chosen rewards")
    close(rj.numpy(), trj, "rejected rewards")
    assert kl.shape == (1,) and abs(kl.item() - tkl.item()) <= LOSS_RTOL * max(abs(tkl.item()), 1e-6)
    for got, t, what in ((a, ta, "chosen"), (b, tb, "rejected")):
        if t.shape[0]:
            close(got.grad.numpy(), t.grad, f"d/d policy_{what}", atol=grad_atol(beta, w))
    assert k.grad is None or not np.any(k.grad.numpy())  # the reference point is detached, as TRL's
    assert not (cr.requires_grad or rj.requires_grad or kl.requires_grad)


# ---- bad input -------------------------------------------------------------------------------------------------
V4 = np.zeros(4, np.float32)


@pytest.mark.parametrize("call, error, match", [
    (lambda: dpo_loss(V4, V4, V4, np.zeros((4, 1))), ValueError, r"dpo_loss: .*must be 1-D.*\(4, 1\)"),
    (lambda: dpo_loss(V4, V4[:3], V4, V4), ValueError, r"dpo_loss: .*policy_rejected_logps \(3,\).*same shape"),
    (lambda: dpo_loss(np.float32(1), V4, V4, V4), ValueError, r"must be 1-D.*\(\)"),
    (lambda: dpo_loss(V4, V4, V4, V4, loss_type="kto"), ValueError, "sigmoid, ipo, hinge"),
    (lambda: dpo_loss(V4, V4, V4, V4, beta=0.0), ValueError, "beta must be a finite number > 0"),
    (lambda: dpo_loss(V4, V4, V4, V4, beta=float("inf")), ValueError, "beta must be a finite"),
    (lambda: dpo_loss(V4, V4, V4, V4, label_smoothing=0.6), ValueError, r"label_smoothing .*\[0, 0.5\]"),
    (lambda: dpo_loss(V4, V4, V4, V4, label_smoothing=-0.1), ValueError, "label_smoothing"),
    (lambda: kto_loss(V4, V4, V4, V4, V4[:2], V4), ValueError, r"kto_loss: policy_rejected_logps \(4,\), "
                                                                r"reference_rejected_logps \(2,\)"),
    (lambda: kto_loss(V4, V4, V4, V4, V4, V4.reshape(4, 1)), ValueError, "kto_loss: reference_KL_logps must be 1-D"),
    (lambda: kto_loss(V4, V4, V4[:0], V4, V4, V4[:0]), ValueError, "KL estimate needs"),
    (lambda: kto_loss(V4[:0], V4[:0], V4, V4[:0], V4[:0], V4), ValueError, "both the chosen and the rejected"),
    (lambda: kto_loss(V4, V4, V4, V4, V4, V4, desirable_weight=-1.0), ValueError, "desirable_weight .*>= 0"),
    (lambda: kto_loss(V4, V4, V4, V4, V4, V4, beta=-0.1), ValueError, "kto_loss: beta"),
])
def test_bad_loss_arguments_are_refused_clearly(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_a_column_against_a_row_does_not_broadcast():
    col = tl.tensor(np.zeros((16, 1), np.float32))
    with pytest.raises(ValueError, match=r"reference_chosen_logps must be 1-D.*\(16, 1\)"):
        dpo_loss(np.zeros(16), np.zeros(16), col, np.zeros(16))


# ---- sequence_logprobs -----------------------------------------------------------------------------------------
def gpt(seed=0):
    tl.manual_seed(seed)
    model = GPT(GPTConfig(**CFG))
    spread_weights(model, seed)
    return model


PROMPTS = [[1, 2, 3], [4], [5, 6, 7, 8, 9, 10], [0, 3]]
# the last pair: the model reads 15 tokens, block size - 1
COMPLETIONS = [[5, 6], [7, 8, 9, 1, 2], [3], [10, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]]


def test_sequence_logprobs_of_ragged_batches_match_torch_per_sequence_values_and_gradients():
    model = gpt()
    state = {k: torch.from_numpy(np.array(v.numpy())) for k, v in model.state_dict().items()}
    tmodel = ref.GPT(ref.GPTConfig(**CFG))
    tmodel.load_state_dict(state)
    w = np.array([0.7, -1.3, 0.4, 1.1], np.float32)
    got = sequence_logprobs(model, PROMPTS, COMPLETIONS)
    (got * tl.tensor(w)).sum().backward()
    want = []
    for p, c in zip(PROMPTS, COMPLETIONS):  # one unpadded sequence at a time
        seq = torch.tensor([p + c])
        logits, _ = tmodel(seq[:, :-1], seq[:, 1:])
        logp = torch.log_softmax(logits[0].double(), -1)[torch.arange(len(p) - 1, seq.shape[1] - 1), torch.tensor(c)]
        want.append(logp.sum())
    want = torch.stack(want)
    (want * torch.tensor(w, dtype=torch.float64)).sum().backward()
    assert got.shape == (4,) and rel(got.numpy(), want.detach().numpy()) <= SEQ_RTOL
    tparams = dict(tmodel.named_parameters())
    for name in ("transformer.wte.weight", "transformer.h.0.attn.c_attn.weight", "transformer.h.0.mlp.c_fc.bias"):
        mine = dict(model.named_parameters())[name].grad.numpy()
        assert np.linalg.norm(mine) > 0
        assert rel(mine, tparams[name].grad.numpy()) <= SEQ_GRAD_RTOL, name
    # a (B, T) array of equal lengths gives what the list of its rows gives
    same = sequence_logprobs(model, np.array([[1, 2], [3, 4]]), tl.tensor(np.array([[5, 6, 7], [8, 9, 10]])))
    rows = sequence_logprobs(model, [[1, 2], [3, 4]], [[5, 6, 7], [8, 9, 10]])
    np.testing.assert_allclose(same.numpy(), rows.numpy(), rtol=1e-6)


@pytest.mark.parametrize("prompts, completions, match", [
    ([[1]], [[]], "sequence 0 has an empty completion"),
    ([[]], [[1]], "sequence 0 has an empty prompt"),
    ([[1], [2]], [[3]], "prompt_ids has 2 sequences and completion_ids 1"),
    ([[1] * 10], [[2] * 8], "the model reads 17, more than its block size 16"),
    ([[1, 11]], [[2]], r"prompt_ids\[0\] holds token id 11, outside the model's vocabulary \[0, 11\)"),
    ([[1]], [[-1]], r"completion_ids\[0\] holds token id -1"),
    ([[1.5]], [[2]], "integer token ids"),
    (np.zeros(3, np.int64), [[1]], r"\(B, T\) ids"),
])
def test_sequence_logprobs_refuses_bad_ids(prompts, completions, match):
    with pytest.raises(ValueError, match=f"sequence_logprobs: .*{match}"):
        sequence_logprobs(gpt(), prompts, completions)


# ---- lora.disabled: the reference model ------------------------------------------------------------------------
def adapted():
    """A LoRA model whose adapters hold nonzero values (B = 0 would make disabling vacuous), and a frozen copy of
    its base weights in a second GPT (the second copy that lora.disabled spares)."""
    model = gpt()
    frozen = GPT(GPTConfig(**CFG))
    frozen.load_state_dict(model.state_dict())
    lora.apply(model, r=2, alpha=4, targets=("c_attn", "c_proj", "c_fc"))
    rng = np.random.default_rng(1)
    for m in lora.layers(model).values():
        m.lora_B.weight.copy_(rng.normal(0, 0.5, m.lora_B.weight.shape).astype(np.float32))
    return model, frozen


def test_disabled_model_is_bit_for_bit_the_frozen_base_and_the_adapters_act_again_after():
    model, frozen = adapted()
    adapted_before = sequence_logprobs(model, PROMPTS, COMPLETIONS).numpy()
    base = sequence_logprobs(frozen, PROMPTS, COMPLETIONS).numpy()
    assert np.abs(adapted_before - base).max() > 1e-2  # the adapters matter
    with lora.disabled(model) as same:
        assert same is model
        np.testing.assert_array_equal(sequence_logprobs(model, PROMPTS, COMPLETIONS).numpy(), base)
        with lora.disabled(model):  # nested
            np.testing.assert_array_equal(sequence_logprobs(model, PROMPTS, COMPLETIONS).numpy(), base)
        np.testing.assert_array_equal(sequence_logprobs(model, PROMPTS, COMPLETIONS).numpy(), base)
    np.testing.assert_array_equal(sequence_logprobs(model, PROMPTS, COMPLETIONS).numpy(), adapted_before)
    with pytest.raises(KeyError):
        with lora.disabled(model):
            raise KeyError("inside")
    assert not any(m.disable_adapters for m in lora.layers(model).values())
    np.testing.assert_array_equal(sequence_logprobs(model, PROMPTS, COMPLETIONS).numpy(), adapted_before)


def test_disabled_refuses_a_model_without_adapters_a_merged_one_and_merging_inside():
    with pytest.raises(RuntimeError, match="lora.disabled: GPT has no LoRA layers"):
        with lora.disabled(gpt()):
            pass
    model, _ = adapted()
    with lora.disabled(model):
        with pytest.raises(RuntimeError, match=r"lora.merge: .* inside lora.disabled"):
            lora.merge(model)
    lora.merge(model)
    with pytest.raises(RuntimeError, match="lora.disabled: .* is merged .*lora.unmerge"):
        with lora.disabled(model):
            pass


# ---- the bandit: DPO finds its closed-form optimum -------------------------------------------------------------
def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def tv(p, q):
    return 0.5 * float(np.abs(p - q).sum())


def test_dpo_on_a_bandit_converges_to_the_closed_form_optimum():
    """K answers, rewards r, Bradley–Terry preferences between pairs drawn from π_ref: the policy maximising
    E[r] − β·KL(π ‖ π_ref) is π* ∝ π_ref·exp(r/β) (Rafailov et al. 2023, eq. 4), and DPO's loss is minimised there
    (up to the sampling error of 100000 draws: ~0.01 in TV distance)."""
    beta, n = 0.5, 100000
    ref_logits = np.log(np.array([0.35, 0.25, 0.2, 0.12, 0.08]))
    r = np.array([0.0, 1.0, -0.5, 1.5, 0.5])
    rng = np.random.default_rng(0)
    a, b = rng.choice(5, n, p=softmax(ref_logits)), rng.choice(5, n, p=softmax(ref_logits))
    a, b = a[a != b], b[a != b]
    a_wins = rng.random(a.size) < 1.0 / (1.0 + np.exp(-(r[a] - r[b])))
    w, lose = np.where(a_wins, a, b), np.where(a_wins, b, a)
    ref_logp = ref_logits - np.log(np.exp(ref_logits).sum())
    theta = tl.tensor(ref_logits.astype(np.float32), requires_grad=True)  # the policy starts as the reference
    opt = optim.Adam([theta], lr=0.05)
    w_t, l_t = tl.tensor(w), tl.tensor(lose)
    for _ in range(300):
        logp = theta.log_softmax(-1)
        losses, _, _ = dpo_loss(logp[w_t], logp[l_t], ref_logp[w], ref_logp[lose], beta=beta)
        opt.zero_grad()
        losses.mean().backward()
        opt.step()
    pi = softmax(theta.numpy().astype(np.float64))
    star = softmax(ref_logits + r / beta)
    assert tv(pi, star) <= 0.03, tv(pi, star)
    # the check is not vacuous: without the reference term, or with the preferences' sign flipped, the optimum is
    # far from where we ended
    assert tv(pi, softmax(r / beta)) > 0.1 and tv(pi, softmax(ref_logits - r / beta)) > 0.3
    assert tv(pi, softmax(ref_logits)) > 0.1
