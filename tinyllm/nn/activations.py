"""Activations and losses of torch.nn.functional, composed from Tensor ops (so every runtime and rewrite gets them,
and their gradients come from the primitives' rules). NaN in gives NaN out, as in torch. Where torch's gradient
at a kink differs from what the composition gives (hardtanh and relu6 pass none at their bounds), the composition
is written to match it. `inplace=` is accepted for torch's signatures; the graph is functional, so it changes
nothing. A branch that `where` does not take still gets its gradient computed (times 0), so no branch may
overflow: exponentials see 0 in place of x > 0.
"""
import math

from ..tensor import Tensor

SELU_ALPHA, SELU_SCALE = 1.6732632423543772, 1.0507009873554805


def _neg_part_exp(x, alpha=1.0):
    """alpha·(eˣ - 1) for x <= 0, with 0 in place of x > 0 so it never overflows (and gradient 1·eˣ at 0, as torch)."""
    return alpha * ((x > 0).where(0.0, x).exp() - 1.0)


def silu(x, inplace=False): return x * x.sigmoid()
def softsign(x): return x / (1.0 + x.abs())
def logsigmoid(x): return -softplus(-x)
def mish(x, inplace=False): return x * softplus(x).tanh()
def relu6(x, inplace=False): return hardtanh(x, 0.0, 6.0)
def hardsigmoid(x, inplace=False): return hardtanh(x + 3.0, 0.0, 6.0) / 6.0


def elu(x, alpha=1.0, inplace=False):
    """x for x > 0, alpha·(eˣ - 1) otherwise."""
    return (x > 0).where(x, _neg_part_exp(x, alpha))


def celu(x, alpha=1.0, inplace=False):
    """max(0, x) + min(0, alpha·(e^(x/alpha) - 1))."""
    return (x > 0).where(x, _neg_part_exp(x / alpha, alpha))


def selu(x, inplace=False):
    return SELU_SCALE * elu(x, SELU_ALPHA)


def softplus(x, beta=1.0, threshold=20.0):
    """log(1 + e^(βx))/β, and x itself where βx > threshold (as torch). Stable: max(βx, 0) + log(1 + e^-|βx|)."""
    bx = x * beta
    soft = (bx.maximum(0.0) + (-bx.abs()).exp().add(1.0).log()) / beta
    return (bx > threshold).where(x, soft)


def hardtanh(x, min_val=-1.0, max_val=1.0, inplace=False):
    """clamp(x, min_val, max_val), with torch's gradient: none at the bounds themselves."""
    if min_val > max_val:
        raise ValueError(f"hardtanh: min_val {min_val} must not exceed max_val {max_val}")
    inside = (x > min_val) & (x < max_val)
    return inside.where(x, (x <= min_val).where(min_val, (x >= max_val).where(max_val, x)))


def hardswish(x, inplace=False):
    """x · relu6(x + 3) / 6."""
    return x * hardsigmoid(x)


def leaky_relu(x, negative_slope=0.01, inplace=False):
    return (x > 0).where(x, x * negative_slope)


def normalize(x, p=2.0, dim=1, eps=1e-12):
    """x / max(‖x‖_p along dim, eps). The norm's gradient at a zero vector is 0, as torch's (a root of 0 alone would
    give inf · 0 = nan), so a zero vector's gradient is dy / eps."""
    total = x.abs().pow(p).sum(dim, keepdim=True) if p != 2.0 else x.square().sum(dim, keepdim=True)
    some = total > 0
    safe = some.where(total, 1.0)
    norm = some.where(safe.sqrt() if p == 2.0 else safe.pow(1.0 / p), 0.0)
    return x / norm.maximum(eps)


def softmin(x, dim=None):
    return (-x).softmax(-1 if dim is None else dim)


# ---- losses ----
def _reduce(loss, reduction, name, weight_sum=None):
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction != "mean":
        raise ValueError(f"{name}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    return loss.sum() / weight_sum if weight_sum is not None else loss.mean()


def _same_shape(x, y, name):
    if not isinstance(y, Tensor) or x.shape != y.shape:
        raise ValueError(f"{name}: target {getattr(y, 'shape', y)} must have the input's shape {x.shape}")


def l1_loss(input, target, reduction="mean"):
    _same_shape(input, target, "l1_loss")
    return _reduce((input - target).abs(), reduction, "l1_loss")


def binary_cross_entropy(input, target, weight=None, reduction="mean"):
    """-(t·log x + (1 - t)·log(1 - x)), each log at least -100 (as torch, so x = 0 or 1 gives a finite loss)."""
    _same_shape(input, target, "binary_cross_entropy")
    loss = -(target * input.log().maximum(-100.0) + (1.0 - target) * (1.0 - input).log().maximum(-100.0))
    return _reduce(loss if weight is None else loss * weight, reduction, "binary_cross_entropy")


def binary_cross_entropy_with_logits(input, target, weight=None, reduction="mean", pos_weight=None):
    """binary_cross_entropy(sigmoid(x), t), stable: (1 - t)·x + (1 + (pw - 1)·t)·softplus(-x)."""
    _same_shape(input, target, "binary_cross_entropy_with_logits")
    log_weight = 1.0 if pos_weight is None else 1.0 + (pos_weight - 1.0) * target
    loss = (1.0 - target) * input + log_weight * softplus(-input)
    return _reduce(loss if weight is None else loss * weight, reduction, "binary_cross_entropy_with_logits")


def one_hot(idx, num_classes):
    from ..tensor import arange
    return (idx.unsqueeze(-1) == arange(num_classes, device=idx.device)).long()


def nll_loss(input, target, weight=None, ignore_index=-100, reduction="mean"):
    """-input[target] (input holds log-probabilities, classes on axis 1 as torch, or the only axis), times the
    class weight; 'mean' divides by the weights of the targets not ignored."""
    if input.ndim > 2:
        input = input.permute(0, *range(2, input.ndim), 1)  # classes last
    n_classes = input.shape[-1]
    if input.shape[:-1] != target.shape:
        raise ValueError(f"nll_loss: input {input.shape} (classes last) and target {target.shape} don't fit")
    from ..tensor import arange
    valid = target != ignore_index
    safe = arange(n_classes, device=input.device)[valid.where(target, 0)]  # a GATHER: checks each target's range
    picked = one_hot(safe, n_classes).to(input.dtype)
    w = valid.to(input.dtype) if weight is None else valid.where((picked * weight).sum(-1), 0.0)
    loss = -(picked * input).sum(-1) * w
    return _reduce(loss, reduction, "nll_loss", w.sum() if reduction == "mean" else None)
