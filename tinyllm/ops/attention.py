"""FlashAttention (FlashAttention-2, Dao 2023): softmax(q kᵀ · scale [causal]) v without the T×T score matrix.

Nobody builds these nodes by hand: the rewrite pass tinyllm/rewrite/flash.py finds attention written the plain
way and puts FLASH_ATTN in its place. The forward walks the keys in tiles with an online softmax (a running row
max m and denominator l) and keeps, besides the output O, only the row log-sum-exp L = m + log l. The backward
recomputes each tile of scores from q, k and L, so its memory is linear in the sequence length too.

A graph node has one output, so both carry several values packed together:
    FLASH_ATTN(q, k, v)                    -> (..., Tq, Dv + 1):  O in [..., :Dv], L in [..., Dv]
    FLASH_ATTN_BWD(q, k, v, out, dout)     -> (..., Tq·D + Tk·D + Tk·Dv):  dq, dk, dv flattened, one after another
and views (SHRINK, RESHAPE) take them apart. dout is [dO | dL], out's gradient, or dO alone, (..., Tq, Dv), for
dL = 0: the pads pass (rewrite/pads.py) reads the usual gradient, dO padded with a zero column, that way. `arg`
is (scale, causal); causal keeps key j for query i when j <= i, torch's top-left convention for Tq != Tk.

In 16 bits the kernels compute in float32 and round each result once; the C runtime's bfloat16 kernels on a CPU
with AVX512_BF16 multiply on vdpbf16ps instead, with P and dS rounded to bfloat16 before the products that take
them, as torch's CPU flash attention does (runtime_c/attention.c): that rounding apart, the NumPy runtime's values.
"""
import numpy as np

from ..graph import build
from .base import Op, register, fmt

TILE = 64  # keys per tile: the NumPy reference holds (..., Tq, TILE) scores at a time (tests shrink it)


def _check_arg(arg):
    if not (isinstance(arg, tuple) and len(arg) == 2 and isinstance(arg[0], float) and isinstance(arg[1], bool)):
        raise TypeError(f"arg must be (scale: float, causal: bool), got {arg!r}")


def _check_qkv(q, k, v):
    if len(q.shape) < 2 or len(k.shape) != len(q.shape) or len(v.shape) != len(q.shape) \
            or q.shape[:-2] != k.shape[:-2] or q.shape[:-2] != v.shape[:-2] or q.shape[-1] != k.shape[-1] \
            or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"q, k, v have shapes {fmt(q.shape, k.shape, v.shape)}: need (..., Tq, D), (..., Tk, D) "
                         "and (..., Tk, Dv) with equal batch axes")
    if k.shape[-2] == 0:
        raise ValueError(f"no keys (k has shape {k.shape}): softmax over zero keys is undefined")
    if not (q.dtype is k.dtype is v.dtype) or not q.dtype.is_float:
        raise TypeError(f"needs floating-point q, k, v of one dtype, got {q.dtype.name}, {k.dtype.name}, "
                        f"{v.dtype.name}")


def _masked(s, r0, k0, causal):
    """Scores of query rows r0.. against keys k0.., with the keys after each row's position set to -inf."""
    if causal:
        rows = np.arange(r0, r0 + s.shape[-2])[:, None]
        cols = np.arange(k0, k0 + s.shape[-1])[None, :]
        s = np.where(cols > rows, -np.inf, s)
    return s


def _tiles(tq, tk, tile, causal):
    """(r0, k0, k1) per tile of keys k0:k1. Causal (top-left), rows before r0 = k0 see none of it: they are
    skipped, and the walk ends at the first tile no row sees."""
    for k0 in range(0, tk, tile):
        r0 = k0 if causal else 0
        if r0 >= tq:
            return
        yield r0, k0, min(k0 + tile, tk)


def attention_forward(q, k, v, scale, causal, tile=None):
    """The tiled reference. For each tile of keys: m' = max(m, rowmax s), p = e^(s - m'), l = l·e^(m - m') + Σp,
    acc = acc·e^(m - m') + p v. Then O = acc / l and L = m + log l. Every row sees key 0, so m is finite after the
    first tile."""
    *batch, tq, _ = q.shape
    tk, dv, tile = k.shape[-2], v.shape[-1], tile or TILE
    acc = np.zeros((*batch, tq, dv), q.dtype)
    m = np.full((*batch, tq, 1), -np.inf, q.dtype)
    l = np.zeros((*batch, tq, 1), q.dtype)
    for r0, k0, k1 in _tiles(tq, tk, tile, causal):
        s = _masked(np.matmul(q[..., r0:, :], np.swapaxes(k[..., k0:k1, :], -1, -2)) * scale, r0, k0, causal)
        m_new = np.maximum(m[..., r0:, :], s.max(-1, keepdims=True))
        p = np.exp(s - m_new)
        alpha = np.exp(m[..., r0:, :] - m_new)
        l[..., r0:, :] = l[..., r0:, :] * alpha + p.sum(-1, keepdims=True)
        acc[..., r0:, :] = acc[..., r0:, :] * alpha + np.matmul(p, v[..., k0:k1, :])
        m[..., r0:, :] = m_new
    return np.concatenate([acc / l, m + np.log(l)], axis=-1)


def attention_backward(q, k, v, out, dout, scale, causal, tile=None):
    """The tiled FA-2 backward. With P = e^(S - L) recomputed tile by tile and Δᵢ = Σ dOᵢ·Oᵢ - dLᵢ:
    dV = Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP - Δ), dQ = scale · dS K, dK = scale · dSᵀ Q.
    (dL: L = log Σⱼ e^Sᵢⱼ adds dLᵢ·Pᵢⱼ to dSᵢⱼ, hence the -dL in Δ.)"""
    tq, tk, dv, tile = q.shape[-2], k.shape[-2], v.shape[-1], tile or TILE
    o, lse = out[..., :dv], out[..., dv:]
    do, dl = dout[..., :dv], dout[..., dv:] if dout.shape[-1] > dv else 0  # dO alone: dL = 0
    delta = np.sum(do * o, axis=-1, keepdims=True) - dl
    dq, dk, dvv = np.zeros(q.shape, q.dtype), np.zeros(k.shape, q.dtype), np.zeros(v.shape, q.dtype)
    for r0, k0, k1 in _tiles(tq, tk, tile, causal):
        kt, vt, qr, dor = k[..., k0:k1, :], v[..., k0:k1, :], q[..., r0:, :], do[..., r0:, :]
        s = _masked(np.matmul(qr, np.swapaxes(kt, -1, -2)) * scale, r0, k0, causal)
        p = np.exp(s - lse[..., r0:, :])
        dvv[..., k0:k1, :] = np.matmul(np.swapaxes(p, -1, -2), dor)
        ds = p * (np.matmul(dor, np.swapaxes(vt, -1, -2)) - delta[..., r0:, :]) * scale
        dq[..., r0:, :] += np.matmul(ds, kt)
        dk[..., k0:k1, :] = np.matmul(np.swapaxes(ds, -1, -2), qr)
    return pack_grads(dq, dk, dvv)


def pack_grads(dq, dk, dv):
    batch = dq.shape[:-2]
    return np.concatenate([g.reshape(*batch, -1) for g in (dq, dk, dv)], axis=-1)


def unpack_grads(node, q, k, v):
    """Views of dq, dk, dv in a FLASH_ATTN_BWD node (or anything of its shape)."""
    batch = node.shape[:-1]
    grads, start = [], 0
    for x in (q, k, v):
        size = x.shape[-2] * x.shape[-1]
        part = build("SHRINK", node, arg=tuple((0, s, 1) for s in batch) + ((start, start + size, 1),))
        grads.append(part.reshape(x.shape))
        start += size
    return grads


@register
class FLASH_ATTN(Op):
    """out = [O | L] with O = softmax(q kᵀ · scale [causal]) v and L its row log-sum-exp  ⇒  the FA-2 backward:
    FLASH_ATTN_BWD recomputes P tile by tile from q, k and L (see attention_backward for the derivation)."""
    autocast = "low"
    def infer(src, arg):
        _check_arg(arg)
        q, k, v = src
        _check_qkv(q, k, v)
        return q.shape[:-1] + (v.shape[-1] + 1,), q.dtype

    def forward(q, k, v, arg):
        return attention_forward(q, k, v, *arg)

    def backward(dy, y):
        q, k, v = y.src
        return tuple(unpack_grads(build("FLASH_ATTN_BWD", q, k, v, y, dy, arg=y.arg), q, k, v))


@register
class FLASH_ATTN_BWD(Op):
    """[dq | dk | dv] of FLASH_ATTN given its inputs, its output and the output's gradient. Made only by
    FLASH_ATTN's rule, for first-order gradients: it has no gradient rule of its own."""
    def infer(src, arg):
        _check_arg(arg)
        q, k, v, out, dout = src
        _check_qkv(q, k, v)
        want = q.shape[:-1] + (v.shape[-1] + 1,)
        if out.shape != want or dout.shape not in (want, want[:-1] + (want[-1] - 1,)) or out.dtype is not q.dtype \
                or dout.dtype is not q.dtype:
            raise ValueError(f"out {out.shape} must be FLASH_ATTN's output {want} and dout {dout.shape} its gradient "
                             f"(or that without the last column) ({q.dtype.name})")
        size = q.shape[-2] * q.shape[-1] + k.shape[-2] * (k.shape[-1] + v.shape[-1])
        return q.shape[:-2] + (size,), q.dtype

    def forward(q, k, v, out, dout, arg):
        return attention_backward(q, k, v, out, dout, *arg)
