"""Preference losses with TRL's names and semantics (DPOTrainer.dpo_loss as of TRL v0.28, KTOTrainer.kto_loss), and
`sequence_logprobs`, the summed log-probability of a completion that they take.

Each loss is built from tinyllm ops, so autograd derives its gradient. The reference log-probabilities usually come
from the same model with its adapters switched off (`with lora.disabled(model): ...`) and carry no gradient; NumPy
arrays and lists are accepted for them (and for any other argument) and converted to float32 Tensors.
"""
import math
import numbers
import warnings

import numpy as np

from ..factory import cat, tensor
from ..nn import functional as F
from ..tensor import Tensor

LOSS_TYPES = ("sigmoid", "ipo", "hinge")


def _logps(fn, name, x, device):
    """`x` as a 1-D float Tensor (a NumPy array or list converted to float32 on `device`), or a ValueError."""
    if not isinstance(x, Tensor):
        try:
            x = tensor(np.asarray(x, dtype=np.float32), device=device)
        except (TypeError, ValueError) as e:
            raise TypeError(f"{fn}: {name} must be a Tensor, NumPy array or list of numbers, got "
                            f"{type(x).__name__} ({e})") from None
    if not x.dtype.is_float:
        raise TypeError(f"{fn}: {name} must hold float log-probabilities, got {x.dtype.name}: use .float()")
    if x.ndim != 1:
        raise ValueError(f"{fn}: {name} must be 1-D, one log-probability per sequence (B,), got shape "
                         f"{tuple(x.shape)}: sum over the tokens first (sequence_logprobs), and squeeze a (B, 1)")
    return x


def _same_shapes(fn, names, values):
    """Equal shapes, checked rather than broadcast: (16,) against (16, 1) would silently give a (16, 16) loss."""
    shapes = [tuple(v.shape) for v in values]
    if len(set(shapes)) > 1:
        listed = ", ".join(f"{n} {s}" for n, s in zip(names, shapes))
        raise ValueError(f"{fn}: {listed} must have the same shape (B,), one entry per sequence")


def _inputs(fn, **named):
    device = next((v.device for v in named.values() if isinstance(v, Tensor)), None)
    return [_logps(fn, n, v, device) for n, v in named.items()]


def _positive(fn, name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{fn}: {name} must be a finite number > 0, got {value!r}: 0.1 to 0.5 are usual")


def _weight(fn, name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{fn}: {name} must be a finite number >= 0, got {value!r}")


def _logsigmoid(x):
    """log σ(x) = min(x, 0) − log(1 + e), e = e^(−|x|) in (0, 1]. F.logsigmoid rounds 1 + e first, which costs
    the loss of a well-separated pair its digits (all of them once e < 2⁻²⁴); torch's uses log1p. Here
    log(1 + e) = 2·atanh(s) = 2·Σ s^(2k+1)/(2k+1), s = e/(2 + e) ≤ 1/3: ten terms reach float32's rounding."""
    e = (-x.abs()).exp()
    s = e / (e + 2.0)
    s2, series = s * s, 1.0 / 19.0
    for k in reversed(range(9)):
        series = series * s2 + 1.0 / (2 * k + 1)
    return x.minimum(0.0) - s * series * 2.0


def dpo_loss(policy_chosen_logps, policy_rejected_logps, reference_chosen_logps, reference_rejected_logps, *,
             beta=0.1, loss_type="sigmoid", label_smoothing=0.0):
    """Per-pair preference losses, `(losses, chosen_rewards, rejected_rewards)`, each (B,).

    With the margin z = (log π(y_w) − log π(y_l)) − (log π_ref(y_w) − log π_ref(y_l)) of each pair (y_w chosen over
    y_l), as TRL's DPOTrainer.dpo_loss (v0.28):
      "sigmoid" (DPO, Rafailov et al. 2023, eq. 7): −(1−ε)·log σ(βz) − ε·log σ(−βz). Under a Bradley–Terry model
                the optimal policy of the KL-regularised reward objective is π* ∝ π_ref·exp(r/β), so r = β log π/π_ref
                + const and the reward model's likelihood becomes σ(βz); ε > 0 (label smoothing, "conservative DPO")
                assumes a fraction ε of the labels flipped.
      "ipo"     (IPO, Azar et al. 2023, eq. 17, β their τ): (z − 1/(2β))², which regresses z to a finite target
                instead of pushing it to infinity on deterministic preferences. Not length-normalised here: TRL
                divides the log-probabilities by the completion length before the loss; pass such averages to do so.
      "hinge"   (SLiC / RSO, Liu et al. 2023): max(0, 1 − βz).
    label_smoothing ε in [0, 0.5] applies to "sigmoid" only; "ipo" and "hinge" ignore it (with a warning, as TRL).
    Rewards β·(log π − log π_ref) of the chosen and of the rejected answers are detached (for logging)."""
    fn = "dpo_loss"
    pc, pr, rc, rr = _inputs(fn, policy_chosen_logps=policy_chosen_logps, policy_rejected_logps=policy_rejected_logps,
                             reference_chosen_logps=reference_chosen_logps,
                             reference_rejected_logps=reference_rejected_logps)
    _same_shapes(fn, ("policy_chosen_logps", "policy_rejected_logps", "reference_chosen_logps",
                      "reference_rejected_logps"), (pc, pr, rc, rr))
    _positive(fn, "beta", beta)
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"{fn}: unknown loss_type {loss_type!r}; the allowed ones are {', '.join(LOSS_TYPES)}")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, numbers.Real) \
            or not 0.0 <= label_smoothing <= 0.5:
        raise ValueError(f"{fn}: label_smoothing must be a number in [0, 0.5] (the assumed fraction of flipped "
                         f"labels), got {label_smoothing!r}")
    beta, eps = float(beta), float(label_smoothing)
    z = (pc - pr) - (rc - rr)
    if loss_type == "sigmoid":
        losses = -_logsigmoid(z * beta) * (1.0 - eps) - _logsigmoid(z * -beta) * eps
    else:
        if eps:
            warnings.warn(f"{fn}: loss_type {loss_type!r} does not use label smoothing; label_smoothing={eps} is "
                          "ignored (set it to 0.0)", stacklevel=2)
        losses = (z - 1.0 / (2.0 * beta)) ** 2 if loss_type == "ipo" else F.relu(1.0 - z * beta)
    return losses, ((pc - rc) * beta).detach(), ((pr - rr) * beta).detach()


def kto_loss(policy_chosen_logps, policy_rejected_logps, policy_KL_logps, reference_chosen_logps,
             reference_rejected_logps, reference_KL_logps, *, beta=0.1, desirable_weight=1.0,
             undesirable_weight=1.0):
    """KTO (Ethayarajh et al. 2024, eq. 7) on unpaired feedback, `(losses, chosen_rewards, rejected_rewards, kl)`, as
    TRL's KTOTrainer.kto_loss with loss_type "kto".

    The reference point is z₀ = max(0, mean(log π(y') − log π_ref(y'))) over the KL batch (completions y' that do
    not belong to their prompts: an estimate of KL(π ‖ π_ref)), detached, so it shifts the value without a gradient.
    With r = log π(y) − log π_ref(y), a desirable (chosen) answer costs λ_D·(1 − σ(β(r − z₀))) and an undesirable
    (rejected) one λ_U·(1 − σ(β(z₀ − r))): a prospect-theory value that saturates on either side. `losses` holds the
    chosen losses then the rejected ones (concatenated, (n_chosen + n_rejected,)); either side may be empty (a
    (0,) input), not both. Rewards β·r of each side and kl, z₀ as a (1,) Tensor, are detached."""
    fn = "kto_loss"
    pc, pr, pk, rc, rr, rk = _inputs(
        fn, policy_chosen_logps=policy_chosen_logps, policy_rejected_logps=policy_rejected_logps,
        policy_KL_logps=policy_KL_logps, reference_chosen_logps=reference_chosen_logps,
        reference_rejected_logps=reference_rejected_logps, reference_KL_logps=reference_KL_logps)
    _same_shapes(fn, ("policy_chosen_logps", "reference_chosen_logps"), (pc, rc))
    _same_shapes(fn, ("policy_rejected_logps", "reference_rejected_logps"), (pr, rr))
    _same_shapes(fn, ("policy_KL_logps", "reference_KL_logps"), (pk, rk))
    if pk.shape[0] == 0:
        raise ValueError(f"{fn}: policy_KL_logps and reference_KL_logps are empty: the KL estimate needs at least "
                         "one mismatched (prompt, completion) pair")
    if pc.shape[0] == 0 and pr.shape[0] == 0:
        raise ValueError(f"{fn}: both the chosen and the rejected log-probabilities are empty: nothing to learn from")
    _positive(fn, "beta", beta)
    _weight(fn, "desirable_weight", desirable_weight)
    _weight(fn, "undesirable_weight", undesirable_weight)
    beta = float(beta)
    kl = (pk - rk).mean().detach().clamp(min=0.0).reshape(1)
    parts, rewards = [], []
    for p, r, weight, sign in ((pc, rc, desirable_weight, 1.0), (pr, rr, undesirable_weight, -1.0)):
        if p.shape[0] == 0:  # an empty side: no losses, no rewards (TRL's empty tensors)
            rewards.append(tensor(np.zeros(0, np.float32), device=p.device))
            continue
        ratio = p - r
        # 1 − σ(u) written σ(−u): the same value without cancelling to 0 where σ(u) rounds to 1
        parts.append(F.sigmoid((ratio - kl) * (-beta * sign)) * float(weight))
        rewards.append((ratio * beta).detach())
    losses = cat(parts) if len(parts) > 1 else parts[0]
    return losses, rewards[0], rewards[1], kl


def _ids(fn, name, ids):
    """A list of B 1-D int64 arrays from a (B, T) Tensor / array or a list of B id sequences."""
    if isinstance(ids, Tensor):
        ids = ids.numpy()
    if isinstance(ids, np.ndarray):
        if ids.ndim != 2:
            raise ValueError(f"{fn}: {name} must be (B, T) ids or a list of B id lists, got shape {ids.shape}")
        rows = list(ids)
    elif isinstance(ids, (list, tuple)):
        rows = [np.asarray(row.numpy() if isinstance(row, Tensor) else row) for row in ids]
    else:
        raise TypeError(f"{fn}: {name} must be a (B, T) Tensor or array, or a list of B id lists, got "
                        f"{type(ids).__name__}")
    out = []
    for i, row in enumerate(rows):
        if row.size == 0:
            row = row.astype(np.int64)  # np.asarray([]) is float64
        if row.ndim != 1 or not np.issubdtype(row.dtype, np.integer):
            raise ValueError(f"{fn}: {name}[{i}] must be a 1-D sequence of integer token ids, got shape {row.shape} "
                             f"of {row.dtype}")
        out.append(row.astype(np.int64))
    return out


def sequence_logprobs(model, prompt_ids, completion_ids):
    """Σ_t log π(c_t | prompt, c_<t) of each completion c given its prompt, a (B,) Tensor differentiable in the
    model's parameters (the log-likelihood DPO and KTO compare).

    prompt_ids, completion_ids: (B, T) integer Tensors / arrays, or lists of B sequences of any lengths. Each
    prompt + completion is right-padded to the longest (causal attention: padding after a token never changes its
    logits) and all run in one forward; the token at position t is scored by the logits at t − 1, so the model reads
    len(prompt) + len(completion) − 1 tokens of each, at most its block size. Prompt and padding positions are
    masked out of the sum."""
    fn = "sequence_logprobs"
    prompts, completions = _ids(fn, "prompt_ids", prompt_ids), _ids(fn, "completion_ids", completion_ids)
    if len(prompts) != len(completions) or not prompts:
        raise ValueError(f"{fn}: prompt_ids has {len(prompts)} sequences and completion_ids {len(completions)}: "
                         "give one prompt per completion (repeat a shared prompt), at least one")
    config = getattr(model, "config", None)
    vocab, block = getattr(config, "vocab_size", None), getattr(model, "max_positions", None)
    if vocab is None or block is None:
        raise TypeError(f"{fn}: model must be a tinyllm language model (GPT, Llama) with config.vocab_size and a "
                        f"block size, got {type(model).__name__}")
    for i, (p, c) in enumerate(zip(prompts, completions)):
        if p.size == 0 or c.size == 0:
            what = "prompt" if p.size == 0 else "completion"
            raise ValueError(f"{fn}: sequence {i} has an empty {what}: a completion is scored given at least one "
                             "prompt token (start prompts with a BOS token) and needs at least one token")
        if p.size + c.size - 1 > block:
            raise ValueError(f"{fn}: sequence {i} has {p.size} prompt + {c.size} completion tokens; the model reads "
                             f"{p.size + c.size - 1}, more than its block size {block}: shorten the prompt (keep its "
                             "last tokens) or the completion")
        for name, seq in (("prompt_ids", p), ("completion_ids", c)):
            if seq.min() < 0 or seq.max() >= vocab:
                bad = seq[(seq < 0) | (seq >= vocab)][0]
                raise ValueError(f"{fn}: {name}[{i}] holds token id {bad}, outside the model's vocabulary "
                                 f"[0, {vocab}): tokenize with the model's tokenizer")
    lengths = [p.size + c.size for p, c in zip(prompts, completions)]
    T = max(lengths)
    seqs = np.zeros((len(prompts), T), np.int64)  # pad with id 0: valid, and never scored (masked)
    mask = np.zeros((len(prompts), T - 1), np.float32)  # mask[b, t]: token t + 1 belongs to b's completion
    for b, (p, c) in enumerate(zip(prompts, completions)):
        seqs[b, :lengths[b]] = np.concatenate([p, c])
        mask[b, p.size - 1:lengths[b] - 1] = 1.0
    device = next(iter(model.parameters())).device
    inputs, targets = tensor(seqs[:, :-1], device=device), tensor(seqs[:, 1:], device=device)
    # forward returns every position's logits only when given targets (else the last one); the loss it builds
    # is lazy and never computed
    logits, _ = model(inputs, targets)
    picked = logits.float().log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (B, T - 1)
    return (picked * tensor(mask, device=device)).sum(-1)
