"""Rotary position embeddings (RoPE, Su et al. 2021): position enters attention by rotating q and k.

Split a head's dim features into dim/2 pairs; pair i at position m is rotated by the angle m·θᵢ, with
θᵢ = base^(-2i/dim). Why the scores then depend only on the relative position: for one pair, with R(a) the 2-D
rotation by a, a query at position m and a key at position n give

    (R(mθ) q)ᵀ (R(nθ) k) = qᵀ R(mθ)ᵀ R(nθ) k = qᵀ R(-mθ) R(nθ) k = qᵀ R((n - m)θ) k

since a rotation's transpose is its inverse, R(a)ᵀ = R(-a), and rotations compose by adding angles. The score
q·k is a sum of such terms over the pairs, so it is a function of q, k and n - m alone: shifting every position
by the same constant changes no score.

Rotating the pair (a, b) by φ gives (a cos φ - b sin φ, b cos φ + a sin φ) = x·cos + rot(x)·sin with
rot(x)_a = -b, rot(x)_b = a. Two layouts of the pairs are in use, picked by `interleaved`:
    False  Hugging Face's rotate-half: pairs (i, i + dim/2); rot(x) = cat(-x[dim/2:], x[:dim/2]) and the tables
           hold cat(freqs, freqs) along the last axis.
    True   Meta's original llama: pairs (2i, 2i + 1), x viewed as (..., dim/2, 2) (a complex number per pair);
           rot(x) = (-x_odd, x_even) interleaved and the tables repeat each angle twice.
The two compute the same attention up to a permutation of the head dim (the interleaved layout's features
reordered as [0, 2, 4, …, 1, 3, 5, …] is the rotate-half layout), which is why a checkpoint's q and k
projections are permuted when converted from one to the other.
"""
import numpy as np

from .. import dtype as dt
from ..factory import cat, stack
from ..tensor import Tensor
from .module import Module


def _rotate(x, interleaved):
    """rot(x): each pair (a, b) of x's last axis becomes (-b, a)."""
    d = x.shape[-1]
    if interleaved:
        pairs = x.reshape(*x.shape[:-1], d // 2, 2)
        return stack([-pairs[..., 1], pairs[..., 0]], -1).reshape(x.shape)
    return cat([-x[..., d // 2:], x[..., :d // 2]], -1)


def apply_rotary_pos_emb(x, cos, sin, interleaved=False):
    """x (..., T, dim) rotated pair by pair: x·cos + rot(x)·sin, cos and sin (from RotaryEmbedding) broadcastable
    to x, e.g. (T, dim) or (B, 1, T, dim); they are cast to x's dtype first, as Hugging Face does.
    Hugging Face's `q, k = apply_rotary_pos_emb(q, k, cos, sin)` (cos, sin (B, T, dim), q and k (B, H, T, dim),
    unsqueeze_dim=1) is `apply_rotary_pos_emb(q, cos.unsqueeze(1), sin.unsqueeze(1))` and the same for k."""
    if not isinstance(x, Tensor) or x.ndim < 1 or x.shape[-1] % 2:
        raise ValueError(f"apply_rotary_pos_emb: x must be a tensor whose last axis (the head dim) is even, got "
                         f"shape {getattr(x, 'shape', type(x).__name__)}")
    if cos.shape != sin.shape or cos.shape[-1:] != x.shape[-1:]:
        raise ValueError(f"apply_rotary_pos_emb: cos {cos.shape} and sin {sin.shape} must have one shape ending "
                         f"in x's head dim {x.shape[-1]} (x {x.shape})")
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + _rotate(x, interleaved) * sin


class RotaryEmbedding(Module):
    """The cos and sin tables (max_position_embeddings, dim) of RoPE, computed in float32 as Hugging Face's
    LlamaRotaryEmbedding: inv_freq = 1 / base^(arange(0, dim, 2) / dim), angles = outer(positions, inv_freq).
    `rotary(position_ids)` (int64 positions of any shape, e.g. (T,) or (B, T)) gathers their rows: (cos, sin) of
    shape position_ids.shape + (dim,), float32. A GATHER, so the positions may be computed at run time (a decode
    step's) and a replayed graph serves every position. The tables are plain tensors, not parameters: no
    gradient, not in the state dict (Hugging Face's inv_freq is a non-persistent buffer too)."""
    def __init__(self, dim, max_position_embeddings=2048, base=10000.0, interleaved=False):
        if dim <= 0 or dim % 2:
            raise ValueError(f"RotaryEmbedding: dim must be a positive even number (pairs of features), got {dim}")
        if max_position_embeddings <= 0 or base <= 0:
            raise ValueError(f"RotaryEmbedding: max_position_embeddings ({max_position_embeddings}) and base "
                             f"({base}) must be positive")
        self.dim, self.max_position_embeddings, self.base = dim, max_position_embeddings, float(base)
        self.interleaved = interleaved
        exponent = np.arange(0, dim, 2).astype(np.float32) / np.float32(dim)
        # base^e rounded once to float32 (torch's float32 pow may differ from it in the last bit)
        self.inv_freq = np.float32(1.0) / (np.float64(base) ** exponent.astype(np.float64)).astype(np.float32)
        freqs = np.outer(np.arange(max_position_embeddings, dtype=np.float32), self.inv_freq).astype(np.float32)
        emb = np.repeat(freqs, 2, axis=-1) if interleaved else np.concatenate([freqs, freqs], axis=-1)
        self._tables = {}  # device -> (cos, sin) Tensors, made on first use there
        self._host = (np.cos(emb).astype(np.float32), np.sin(emb).astype(np.float32))

    def tables(self, device=None):
        """(cos, sin), each (max_position_embeddings, dim) float32, on `device`."""
        if device not in self._tables:
            self._tables[device] = tuple(Tensor(t, device=device) for t in self._host)
        return self._tables[device]

    def forward(self, position_ids):
        if not isinstance(position_ids, Tensor) or position_ids.dtype is not dt.int64:
            raise TypeError(f"RotaryEmbedding: position_ids must be an int64 tensor, got "
                            f"{getattr(position_ids, 'dtype', type(position_ids).__name__)!r}: use .long()")
        cos, sin = self.tables(position_ids.device)
        return cos[position_ids], sin[position_ids]

    def __repr__(self):
        return (f"RotaryEmbedding(dim={self.dim}, max_position_embeddings={self.max_position_embeddings}, "
                f"base={self.base}, interleaved={self.interleaved})")
