"""Composite ops, built from primitives in the front end (so every runtime gets them for free), with
torch.nn.functional's names and arguments."""
import math
import numbers

import numpy as np

from .. import autocast_mode as _autocast, dtype as dt
from ..factory import bernoulli_mask, ones
from ..tensor import Tensor


def relu(x): return x.relu()
def softmax(x, dim=-1): return x.softmax(dim)
def log_softmax(x, dim=-1): return x.log_softmax(dim)
def tanh(x): return x.tanh()
def sigmoid(x): return x.sigmoid()


def gelu(x, approximate="none"):
    """x·Φ(x) with Φ the normal CDF: exact through erf, or GPT-2's tanh approximation. In 16 bits it is computed in
    float32 and rounded once at the end, as torch's (its gradient too): one op there, where rounding each of the
    ops it is made of here would add their roundings (and, fused, cost a bfloat16 step a fifth of its time)."""
    if x.dtype in (dt.float16, dt.bfloat16):
        return gelu(x.float(), approximate).to(x.dtype)
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return x._autocast_wide(lambda x: _gelu(x, approximate))  # (under autocast: one rounding too)


def _gelu(x, approximate):
    if approximate == "tanh":
        return 0.5 * x * (1.0 + (math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)).tanh())
    return 0.5 * x * (1.0 + (x * (1.0 / math.sqrt(2.0))).erf())


def linear(x, weight, bias=None):
    """y = x Wᵀ + b, with W stored (out_features, in_features) as torch."""
    if x.shape[-1] != weight.shape[-1]:
        raise RuntimeError(f"linear: input of shape {x.shape} has {x.shape[-1]} features, the weight "
                           f"{weight.shape} expects {weight.shape[-1]}")
    y = x.matmul(weight.t())
    return y if bias is None else y + bias._autocast()  # under autocast the bias joins the product's dtype, as torch


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """(x - mean) / √(var + eps) over the trailing `normalized_shape` axes, then scale and shift. In 16 bits it is
    computed in float32 (weight and bias widened too) and rounded once at the end, as torch's."""
    normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if tuple(x.shape[-len(normalized_shape):]) != normalized_shape:
        raise RuntimeError(f"layer_norm: input of shape {x.shape} does not end in normalized_shape {normalized_shape}")
    out = x.dtype
    for v in (weight, bias):
        out = out if v is None else dt.result_type(out, v.dtype)
    if out in (dt.float16, dt.bfloat16):
        wide = [None if v is None else v.float() for v in (x, weight, bias)]
        return layer_norm(*wide[:1], normalized_shape, *wide[1:], eps=eps).to(out)
    dims = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean = x.mean(dims, keepdim=True)
    centered = x - mean
    var = (centered * centered).mean(dims, keepdim=True)
    y = centered * (var + eps).rsqrt()
    if weight is not None:
        y = y * weight
    return y if bias is None else y + bias


def rms_norm(x, normalized_shape, weight=None, eps=None):
    """x / √(mean(x², over the trailing `normalized_shape` axes) + eps), then times weight (Zhang & Sennrich 2019:
    LayerNorm without the centering). eps=None is the machine epsilon of the dtype the norm is computed in, as
    torch: x's own for float32/float64, float32's for 16-bit floats. A 16-bit x is normalised in float32 and cast
    back before the weight multiply, as Hugging Face's LlamaRMSNorm (torch's own rms_norm multiplies before the
    cast: the two differ by at most one rounding of the 16-bit result)."""
    normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not normalized_shape or tuple(x.shape[-len(normalized_shape):]) != normalized_shape:
        raise RuntimeError(f"rms_norm: input of shape {x.shape} does not end in normalized_shape {normalized_shape}")
    if weight is not None and tuple(weight.shape) != normalized_shape:
        raise RuntimeError(f"rms_norm: weight of shape {weight.shape} must have normalized_shape {normalized_shape}")
    if not x.dtype.is_float:
        raise TypeError(f"rms_norm: needs a floating-point input, got {x.dtype.name}: use .float()")
    xf = x.float() if x.dtype.is_low else x
    eps = dt.finfo(xf.dtype).eps if eps is None else eps
    dims = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    y = (xf * (xf * xf).mean(dims, keepdim=True).add(eps).rsqrt()).to(x.dtype)
    return y if weight is None else y * weight


def check_dropout(p, fn="dropout"):
    """torch's check of a dropout probability (nn.Dropout makes it when built, F.dropout when called)."""
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{fn}: probability has to be between 0 and 1, got {p!r}")


def dropout(x, p=0.5, training=True):
    """Zero each element with probability p and scale the rest by 1/(1-p), in training only."""
    check_dropout(p)
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0.0
    keep = bernoulli_mask(x.shape, 1.0 - p, device=x.device)
    return keep.where(x * (1.0 / (1.0 - p)), 0.0)


def embedding(idx, weight):
    """Rows of `weight` picked by integer `idx` (a GATHER; its gradient is a scatter-add)."""
    if not isinstance(idx, Tensor) or idx.dtype is not dt.int64:
        raise TypeError(f"embedding: indices must be an int64 tensor, got "
                        f"{getattr(idx, 'dtype', type(idx)).__repr__()}: use .long()")
    n = weight.shape[0]
    _check_host_indices(idx, n, lambda i: f"embedding: index {i} is out of range for the {n} rows of the table "
                                          f"(indices must be in [0, {n}))")
    return weight[idx]  # (a negative index would wrap, as tensor indexing does; torch's embedding refuses it)


def cross_entropy(logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """-log softmax(logits)[target], 0 where target is `ignore_index`, averaged over the other targets (or their
    sum, or each: reduction 'sum', 'none'; label_smoothing as torch).
    logits (N, C) or (N, C, d...) as torch, or (..., C) with target (...) of int64 class indices; or, as torch's
    soft labels, a float target of the logits' own shape holding class probabilities (class axis 1, or 0 for 1-D
    logits): -Σ_c target_c log softmax(logits)_c, its 'mean' over the N·d... positions.
    A class index outside [0, C) other than ignore_index raises an IndexError, at the latest when the loss is
    computed (_checked_target)."""
    if not isinstance(logits, Tensor) or not isinstance(target, Tensor):
        raise TypeError(f"cross_entropy: logits and target must be tinyllm Tensors, got {type(logits).__name__} "
                        f"and {type(target).__name__}: make them with tinyllm.tensor(...)")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"cross_entropy: ignore_index must be an int (a class index that no target takes, -100 by "
                        f"default), got {ignore_index!r}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"cross_entropy: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be between 0.0 and 1.0, got {label_smoothing}")
    if target.dtype.is_float:
        return _cross_entropy_probs(logits, target, reduction, label_smoothing)
    if target.dtype is not dt.int64:
        raise TypeError(f"cross_entropy: target must hold int64 class indices, got {target.dtype.name}: use .long()")
    if logits.ndim > 2 and logits.shape[:1] + logits.shape[2:] == target.shape:
        logits = logits.permute(0, *range(2, logits.ndim), 1)  # class axis last
    if logits.shape[:-1] != target.shape:  # (torch: "Expected input batch_size (3) to match target batch_size (2)")
        raise ValueError(f"cross_entropy: logits {logits.shape} and target {target.shape} don't fit: expected "
                         "target shape equal to the logits' without the class axis")
    n_classes = logits.shape[-1]
    _check_host_indices(target, n_classes, lambda t: f"cross_entropy: Target {t} is out of bounds: the logits have "
                        f"{n_classes} classes, so targets must be in [0, {n_classes}) or ignore_index ({ignore_index})",
                        ignore_index)
    logp = logits.log_softmax(-1)
    valid = target != ignore_index
    picked = _checked_target(target, valid, n_classes).unsqueeze(-1) == _classes(n_classes, logits.device)
    nll = -(picked.where(logp, 0.0).sum(-1))
    if label_smoothing:
        nll = (1.0 - label_smoothing) * nll - label_smoothing * logp.mean(-1)
    nll = valid.where(nll, 0.0)
    if reduction == "none":
        return nll
    if reduction == "sum":
        return nll.sum()
    return nll.sum() / valid.float().sum()


def _classes(n, device):
    """arange(n) as float32 (exact up to 2**24) or int64 beyond: the values a checked target is compared with."""
    return Tensor(np.arange(n, dtype=np.float32 if n <= 1 << 24 else np.int64), device=device)


def _check_host_indices(idx, n, message, ignore_index=None):
    """torch's IndexError (message(the first bad index)) for an index outside [0, n) other than ignore_index, raised
    now where the indices already sit in host memory (a batch from the data, on the NumPy and C runtimes, seen
    through reshapes): a min and a max. Others are checked by GATHER when the values are computed."""
    node = idx._node
    while node.op == "RESHAPE":
        node = node.src[0]
    data = getattr(node.arg, "data", None) if node.op == "LOAD" else None
    if not isinstance(data, np.ndarray) or not data.size or (data.min() >= 0 and data.max() < n):
        return
    bad = (data < 0) | (data >= n)
    if ignore_index is not None:
        bad &= data != ignore_index
    if bad.any():
        raise IndexError(message(data[bad].flat[0]))


def _checked_target(target, valid, n):
    """The targets read through a GATHER from arange(n): the same values, but a target outside [0, n) raises
    GATHER's IndexError (naming the index) on every runtime, when the loss is computed: no host read in the step.
    Ignored targets read class 0; a negative one reads at t - n (GATHER wraps [-n, 0), so that is out of range)."""
    from ..graph import build
    idx = valid.where((target < 0).where(target - n, target), 0)
    table = _classes(n, target.device)
    return table._make(build("GATHER", table._node, idx._node, arg=0))


def _cross_entropy_probs(logits, target, reduction, label_smoothing):
    if target.shape != logits.shape:
        raise TypeError(f"cross_entropy: a float target holds class probabilities and must have the logits' shape "
                        f"{logits.shape}, got {target.shape} ({target.dtype.name}); class indices must be int64: "
                        "use .long()")
    if logits.ndim == 0:
        raise RuntimeError("cross_entropy: logits must have a class axis, got a 0-d tensor")
    axis = 1 if logits.ndim > 1 else 0
    n_classes = logits.shape[axis]
    if label_smoothing:
        target = target * (1.0 - label_smoothing) + label_smoothing / n_classes
    loss = -((logits.log_softmax(axis) * target).sum(axis))
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    return loss.mean() if loss.ndim else loss


def mse_loss(x, y, reduction="mean"):
    d = x - y
    return (d * d).mean() if reduction == "mean" else (d * d).sum() if reduction == "sum" else d * d


def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """softmax(q kᵀ · scale + mask) v, composed from primitives: the plain form a FlashAttention rewrite matches.
    enable_gqa (grouped-query attention, torch's semantics): k and v may have fewer heads (axis -3) than q, Hkv
    dividing Hq; query head h reads key/value head h // (Hq / Hkv), without copying the keys per group
    (_grouped_attention)."""
    if min(q.ndim, k.ndim, v.ndim) < 2 or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise RuntimeError(f"scaled_dot_product_attention: q {q.shape}, k {k.shape}, v {v.shape} don't fit: need "
                           "q (..., L, E), k (..., S, E), v (..., S, Ev)")
    if attn_mask is not None and not (attn_mask.dtype is dt.bool_ or attn_mask.dtype.is_float):
        raise RuntimeError(f"scaled_dot_product_attention: attn_mask must be bool (True: attend) or float (added to "
                           f"the scores), got {attn_mask.dtype.name}: an integer mask would be added as numbers")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if _autocast.current() is not None:  # one lower-precision op, as in torch: q, k and v are its inputs
        q, k, v = q._autocast(), k._autocast(), v._autocast()
        with _autocast.autocast(enabled=False):
            return scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    heads = _gqa_heads(q, k, v, enable_gqa)
    if heads is not None:
        return _grouped_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, *heads)
    att = attention_scores(q, k, attn_mask, is_causal, scale).softmax(-1)
    if dropout_p:
        att = dropout(att, dropout_p)
    return att @ v


def attention_scores(q, k, attn_mask=None, is_causal=False, scale=None):
    """The scores scaled_dot_product_attention takes the softmax of: (q kᵀ) · scale, -inf where a bool mask (or
    the causal one) drops a key, plus a float mask (TransformerLens's hook_attn_scores)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    att = (q @ k.transpose(-2, -1)) * scale
    if is_causal:
        L, S = q.shape[-2], k.shape[-2]
        keep = ones(L, S, dtype=dt.bool_, device=q.device).tril()
        att = att.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        att = att.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype is dt.bool_ else att + attn_mask
    return att


def _gqa_heads(q, k, v, enable_gqa):
    """(Hq, Hkv) when q's heads (axis -3) read shared key/value heads, None for plain (broadcast) attention."""
    hq = q.shape[-3] if q.ndim >= 3 else None
    hk, hv = (k.shape[-3], v.shape[-3]) if k.ndim >= 3 and v.ndim >= 3 else (None, None)
    if hq is None or hk is None or (hq == hk == hv):
        return None
    what = (f"scaled_dot_product_attention: q has {hq} heads, k {hk} and v {hv} (q {q.shape}, k {k.shape}, "
            f"v {v.shape})")
    if not enable_gqa:
        if hk in (1, hq) and hv in (1, hq):
            return None  # one key/value head broadcast to every query head: plain broadcasting, as torch
        raise RuntimeError(f"{what}: head counts differ, so pass enable_gqa=True for grouped-query attention, or "
                           "repeat k and v to q's heads")
    if hk != hv or hq % hk:
        raise RuntimeError(f"{what}: with enable_gqa=True, k and v need one head count that divides q's")
    return hq, hk


def _grouped_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, hq, hkv):
    """Grouped-query attention as plain attention over (..., Hkv, g, L, E) with k, v unsqueezed to (..., Hkv, 1,
    S, E): the product broadcasts them over the g query heads of each group without a copy."""
    g, lead = hq // hkv, q.shape[:-3]
    q5 = q.reshape(*lead, hkv, g, *q.shape[-2:])
    mask = attn_mask
    if mask is not None and mask.ndim >= 3:  # its head axis split as q's (or a size-1 one kept for both)
        mask = mask.reshape(*mask.shape[:-3], hkv, g, *mask.shape[-2:]) if mask.shape[-3] == hq > 1 \
            else mask.unsqueeze(-3)
    y = scaled_dot_product_attention(q5, k.unsqueeze(-3), v.unsqueeze(-3), mask, dropout_p, is_causal, scale)
    return y.reshape(*lead, hq, *y.shape[-2:])


from .conv import conv1d, conv2d, conv3d, conv_transpose2d, max_pool1d, max_pool2d, avg_pool2d  # noqa: E402,F401
from .resize import pad, interpolate  # noqa: E402,F401
from .activations import (one_hot, silu, softsign, logsigmoid, mish, relu6, hardsigmoid, elu,  # noqa: E402,F401
                          celu, selu, softplus, hardtanh, hardswish, leaky_relu, normalize, softmin, l1_loss, binary_cross_entropy,
                          binary_cross_entropy_with_logits, nll_loss)
from .rotary import apply_rotary_pos_emb  # noqa: E402,F401
