"""Row kernels: softmax, log_softmax and layer_norm over the last axis as one op each, made by the row-kernel pass
(tinyllm/rewrite/rowwise.py) after autograd, so they have no gradient rule. The result is packed: [..., :n] is y
and [..., n:] the row's STATS reductions, which the backward graph reads. The NumPy forwards follow, step for
step, the primitives they replace."""
import numpy as np

from .base import Op, register

STATS = 2  # reductions packed after each row


def _pack(y, *stats):
    return np.concatenate([y, *stats], axis=-1).astype(np.float32)


def softmax_forward(x):
    with np.errstate(all="ignore"):
        mx = x.max(-1, keepdims=True)
        e = np.exp(x + -mx)
        total = e.sum(-1, keepdims=True, dtype=np.float32)
        return _pack(e * (np.float32(1) / total), mx, total)


def log_softmax_forward(x):
    with np.errstate(all="ignore"):
        mx = x.max(-1, keepdims=True)
        s = x + -mx
        total = np.exp(s).sum(-1, keepdims=True, dtype=np.float32)
        return _pack(s + -np.log(total), mx, total)


def layer_norm_forward(x, *vectors, arg):
    eps, has_w, has_b = arg
    k = np.float32(1) / np.float32(x.shape[-1])
    with np.errstate(all="ignore"):
        s1 = x.sum(-1, keepdims=True, dtype=np.float32)
        c = x + -(s1 * k)
        s2 = (c * c).sum(-1, keepdims=True, dtype=np.float32)
        y = c * (np.float32(1) / np.sqrt(k * s2 + np.float32(eps)))
        vectors = [v.reshape(-1) for v in vectors]
        if has_w:
            y = y * vectors.pop(0)
        if has_b:
            y = y + vectors.pop(0)
        return _pack(y, s1, s2)


def _made_by_pass(op):
    raise TypeError(f"{op} nodes are made by the row-kernel pass (tinyllm/rewrite/rowwise.py), not built")


@register
class ROW_SOFTMAX(Op):
    """[softmax(x) | max x | Σ e^(x - max)] over the last axis; made after autograd, so no gradient rule."""
    autocast = "float32"
    def infer(src, arg): _made_by_pass("ROW_SOFTMAX")
    def forward(x): return softmax_forward(x)


@register
class ROW_LOG_SOFTMAX(Op):
    """[log_softmax(x) | max x | Σ e^(x - max)] over the last axis; made after autograd, so no gradient rule."""
    autocast = "float32"
    def infer(src, arg): _made_by_pass("ROW_LOG_SOFTMAX")
    def forward(x): return log_softmax_forward(x)


@register
class ROW_LAYER_NORM(Op):
    """[layer_norm(x)·w + b | Σx | Σ(x - mean)²] over the last axis (w, b present as arg = (eps, has_w, has_b)
    says); made after autograd, so no gradient rule."""
    autocast = "float32"
    def infer(src, arg): _made_by_pass("ROW_LAYER_NORM")
    def forward(x, *vectors, arg): return layer_norm_forward(x, *vectors, arg=arg)
