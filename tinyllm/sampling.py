"""Drawing the next token from a model's logits: temperature, top-k, top-p (nucleus) and min-p filtering with
Hugging Face's meaning and order, the exponential race as the draw, and the accept/reject step of speculative
decoding (Leviathan et al. 2023; Chen et al. 2023).

Sampling runs on the host in NumPy on the realized logits: the chosen token has to reach the host every step
anyway (to stop on it, to print it, to feed it back), and the filters are sorts and selections over one row of
the vocabulary, cheap next to the forward that made the row. `probs` is the one home of the filtering:
`sample` draws from it, and speculative decoding compares the target's and the draft's filtered distributions,
so both decodings mean the same distribution.
"""
import math

import numpy as np

from . import factory
from .tensor import Tensor
from .utils.checks import whole_number


def _array(x, fn, what="logits", wide=True):
    """x (a Tensor or array-like) as a float64 NumPy array (with wide=False: as it is, for an argmax, which widening
    does not change), only read here (it may be a tensor's own buffer)."""
    if isinstance(x, Tensor):
        x = x.numpy()
    a = np.asarray(x)
    if a.dtype.kind not in "biuf":
        raise TypeError(f"{fn}: {what} must be numbers, got an array of {a.dtype}")
    return a.astype(np.float64, copy=False) if wide else a


def check_options(fn, temperature, top_k, top_p, min_p):
    """A clear ValueError, naming `fn`, for sampling options no sampler takes (the examples check their flags so)."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.integer, np.floating)) \
            or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"{fn}: temperature must be a finite number >= 0 (0 means greedy), got {temperature!r}")
    if top_k is not None:
        whole_number(fn, "top_k", top_k, 1, " (None turns it off)")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float, np.integer, np.floating))
                              or not 0 < top_p <= 1):
        raise ValueError(f"{fn}: top_p must be in (0, 1] (None turns it off), got {top_p!r}")
    if min_p is not None and (isinstance(min_p, bool) or not isinstance(min_p, (int, float, np.integer, np.floating))
                              or not 0 <= min_p <= 1):
        raise ValueError(f"{fn}: min_p must be in [0, 1] (None turns it off), got {min_p!r}")


def _top_k(x, k):
    """The positions (ascending) of the k largest of x (V,) and of any tied with the k-th, as HF's TopK keeps.
    For k much smaller than V a strided sample gives a threshold t below the k-th largest (checked: at least k
    values >= t), and only the values >= t are partitioned: ~10x less than partitioning all of a 50257 row."""
    V = x.shape[0]
    stride = 16
    r = 2 * -(-k // stride) + 2  # about 2k + 32 values of x lie above the sample's r-th largest
    if V >= 1024 and 4 * r <= V // stride:
        sub = np.partition(x[::stride], -r)
        cand = np.flatnonzero(x >= sub[-r])
        if len(cand) >= k:  # every value outside cand is < t <= each of cand: the k largest are in cand
            z = x[cand]
            return cand[z >= np.partition(z, -k)[-k]]
    return np.flatnonzero(x >= np.partition(x, -k)[-k])


def _filter_row(x, temperature, top_k, top_p, min_p, fn, row):
    """(idx, w) for one row x (V,) of logits: the support kept by the filters (None: the whole vocabulary, in
    order) and its unnormalized weights w ∝ p, the largest exactly 1 (p = w / Σw). Past top-k or top-p the work is
    on the kept tokens only; the weights are never normalized here, as the race does not need it."""
    V = x.shape[0]
    m = x.max()  # NaN propagates through max, so one pass checks NaN, +inf and a row with nothing finite
    if not math.isfinite(m):
        what = "NaN" if math.isnan(m) else "+inf" if m > 0 else "only -inf (no token can be drawn)"
        raise ValueError(f"{fn}: logits row {row} contains {what}; logits must be finite or -inf, "
                         f"with at least one finite value per row")
    if temperature == 0:  # greedy: the first largest logit, as argmax
        return np.array([int(x.argmax())]), np.ones(1)
    idx, z = None, x  # the kept positions (None: all) and their logits
    if top_k is not None and top_k < V:
        idx = _top_k(x, top_k)
        z = x[idx]
    w = z - m  # softmax's numerator with the largest logit at exp(0) = 1: no overflow, and p_max = 1 / Σw
    if temperature != 1:
        w /= temperature
    np.exp(w, out=w)
    if top_p is not None and top_p < 1:
        mass = top_p * w.sum()  # top_p of the total, in units of w
        if idx is None and V <= 1024:
            idx = np.arange(V)
        elif idx is None:
            # Only tokens that can be in the nucleus are sorted: if the tokens with w >= t hold mass >= top_p,
            # the nucleus (a prefix of the descending order) lies among them.
            for t in (1e-2, 1e-4, 1e-8, 0.0):
                idx = np.flatnonzero(w >= t) if t else np.arange(V)
                if t == 0 or w[idx].sum() >= mass:
                    break
            w, z = w[idx], x[idx]
        # descending by logit (weights can round to ties the logits do not have); ties: the higher id first (HF)
        order = np.argsort(z, kind="stable")[::-1]
        cum = np.cumsum(w[order])
        # keep a token while the mass strictly before it is < top_p (HF: drop while the ascending cumulative
        # mass is <= 1 - top_p): the smallest prefix whose mass reaches top_p, and always the top token
        n = 1 + int(np.searchsorted(cum[:-1], mass, side="left"))
        keep = order[:n]
        idx, w = idx[keep], w[keep]
    if min_p:  # p >= min_p · p_max is w >= min_p (w_max = 1); renormalizing keeps the ratio, so this is HF's test
        keep = w >= min_p
        idx = np.flatnonzero(keep) if idx is None else idx[keep]
        w = w[keep]
    return idx, w


def _rows(logits, fn, ndim=None, wide=True):
    """(logits as float64 rows (N, V), their shape); `wide` as for _array."""
    x = _array(logits, fn, wide=wide)
    if (ndim is not None and x.ndim != ndim) or x.ndim < 1 or x.shape[-1] == 0:
        want = "(B, V)" if ndim == 2 else "(..., V)"
        raise ValueError(f"{fn}: expected logits of shape {want} with V >= 1, got shape {tuple(x.shape)}")
    return x.reshape(-1, x.shape[-1]), x.shape


def probs(logits, temperature=1.0, top_k=None, top_p=None, min_p=None):
    """The distribution `sample` draws from, as a float64 NumPy array of the logits' shape (..., V): softmax of
    logits / temperature, then filtered in Hugging Face's order (its Temperature, TopK, TopP, MinP warpers)
    and renormalized. Filtered tokens get exactly 0.

    - top_k: the k largest logits stay, and any tied with the k-th.
    - top_p: the smallest set of most likely tokens whose mass reaches top_p stays (the nucleus); the top
      token always does. Of tokens tied at the edge the higher ids stay (HF's ascending stable sort drops
      the lower first).
    - min_p: tokens with probability >= min_p × the top token's stay (on what top-k/top-p left).
    - temperature=0: greedy, all mass on the first largest logit (the filters cannot change it).
    """
    check_options("probs", temperature, top_k, top_p, min_p)
    x, shape = _rows(logits, "probs")
    out = np.zeros_like(x)
    for r in range(x.shape[0]):
        idx, w = _filter_row(x[r], temperature, top_k, top_p, min_p, "probs", r)
        if idx is None:
            out[r] = w / w.sum()
        else:
            out[r, idx] = w / w.sum()
    return out.reshape(shape)


def _check_probs(P, fn, what, mass=True):
    """A ValueError naming what is wrong with probabilities P (..., V), and the first row it is wrong in: a NaN or
    inf, a negative value (logits passed for probabilities, most often) or, with `mass`, a row summing to 0."""
    checks = ((~np.isfinite(P).all(-1), "has a NaN or inf"),
              ((P < 0).any(-1), "has a negative value (logits? pass probs(logits))"),
              (P.sum(-1) <= 0 if mass else False, "sums to 0: it has no mass"))
    for rows, why in checks:
        if np.any(rows):
            row = tuple(int(i) for i in np.argwhere(rows)[0])
            raise ValueError(f"{fn}: {what} must hold probabilities, but its row {row[0] if len(row) == 1 else row} "
                             f"{why}")


def _race(p, rng):
    """One draw from p (1-D, ∝ the distribution: scaling p does not change the winner) by the exponential race:
    the index of max p_i / E_i, E_i ~ Exp(1)."""
    while True:
        e = rng.standard_exponential(p.shape[0])
        j = int(np.argmax(np.divide(p, e, out=e)))
        if p[j] > 0:  # an E exactly 0 on a p = 0 token gives 0/0 = NaN, which argmax picks: draw again
            return j


def draw(p, generator=None):
    """One token per row of probabilities p (B, V), such as `probs` gives, by the exponential race (see `sample`):
    a (B,) int64 NumPy array."""
    P = _array(p, "draw", "p")
    if P.ndim != 2:
        raise ValueError(f"draw: expected probabilities p (B, V), got shape {tuple(P.shape)}")
    _check_probs(P, "draw", "p")
    rng = factory.numpy_generator(generator)
    return np.array([_race(row, rng) for row in P], dtype=np.int64)


def sample(logits, *, temperature=1.0, top_k=None, top_p=None, min_p=None, generator=None):
    """Draw one token per row of logits (B, V): a (B, 1) int64 tensor on the logits' device. The distribution is
    `probs(logits, temperature, top_k, top_p, min_p)` (Hugging Face's filters, in its order); temperature=0
    is greedy (argmax). `generator` (a tinyllm.Generator) makes the draw reproducible; default: the global one.

    The draw is the exponential race (as nano-vllm's sampler): with E_i ~ Exp(1) independent, the token is
    argmax_i p_i / E_i = argmin_i E_i / p_i. E_i / p_i ~ Exp(p_i) (an exponential of rate p_i), and of
    independent exponentials with rates λ_i the i-th is the smallest with probability λ_i / Σλ:
        P(i wins) = ∫ λ_i e^{-λ_i t} Π_{j≠i} e^{-λ_j t} dt = λ_i / Σ_j λ_j = p_i,
    and a filtered token (p_i = 0) has E_i / p_i = ∞, so it never wins. (Taking logs, it is the Gumbel-max
    trick: -log E is Gumbel.) One elementwise pass and an argmax, with no cumulative sum or search, and the
    same on any device. The race runs over the kept tokens only, so top-k sampling from 50257 draws k numbers.
    """
    check_options("sample", temperature, top_k, top_p, min_p)
    # greedy reads the logits as they are: a fresh float64 copy of a 50257-token row cost more than the argmax
    x, _ = _rows(logits, "sample", ndim=2, wide=temperature != 0)
    rng = factory.numpy_generator(generator)
    out = np.empty(x.shape[0], dtype=np.int64)
    for r in range(x.shape[0]):
        idx, w = _filter_row(x[r], temperature, top_k, top_p, min_p, "sample", r)
        j = _race(w, rng) if len(w) > 1 else 0
        out[r] = j if idx is None else idx[j]
    return Tensor(out.reshape(-1, 1), device=logits.device if isinstance(logits, Tensor) else None)


def speculative_accept(p, q, draft_tokens, generator=None):
    """The verification step of speculative sampling. p (B, k+1, V): the target's probabilities (rows summing to 1)
    at the k drafted positions and the one after them; q (B, k, V): the draft's, from which draft_tokens (B, k)
    were drawn. NumPy arrays or tensors; `generator` as for `sample`.
    Returns (num_accepted (B,), tokens (B, k+1)), int64 NumPy arrays: row b emits
    tokens[b, :num_accepted[b] + 1] (the accepted drafts, then one corrected or bonus token), then -1s.

    Left to right, draft x at position i is accepted with probability min(1, p_i(x) / q_i(x)). At the first
    rejection the token is drawn from r = max(0, p_i − q_i) / Σ max(0, p_i − q_i), and the rest is dropped;
    when all k are accepted, a bonus token is drawn from p_k. Each emitted token then follows the target:
        P(emit x) = q(x) · min(1, p(x)/q(x)) + P(reject) · r(x) = min(p, q)(x) + (1 − Σ min(p, q)) · r(x),
    and Σ max(0, p − q) = 1 − Σ min(p, q), so the second term is max(0, p − q)(x): the sum is p(x). By
    induction over positions the emitted sequence has the target's joint law (Leviathan et al. 2023, Thm 1).
    Pass probabilities from `probs` for both models, with the same filters, to sample the filtered target.
    """
    fn = "speculative_accept"
    P, Q = _array(p, fn, "p"), _array(q, fn, "q")
    d = np.asarray(draft_tokens.numpy() if isinstance(draft_tokens, Tensor) else draft_tokens)
    if P.ndim != 3 or Q.ndim != 3 or d.ndim != 2 or Q.shape != (P.shape[0], P.shape[1] - 1, P.shape[2]) \
            or d.shape != Q.shape[:2]:
        raise ValueError(f"{fn}: expected p (B, k+1, V), q (B, k, V) and draft_tokens (B, k), got shapes "
                         f"{tuple(P.shape)}, {tuple(Q.shape)}, {tuple(d.shape)}")
    B, k, V = Q.shape
    if d.dtype.kind not in "iu":
        raise ValueError(f"{fn}: draft_tokens must be integers in [0, {V}), got {d.dtype} values")
    if d.size and (d.min() < 0 or d.max() >= V):
        raise ValueError(f"{fn}: draft_tokens must be integers in [0, {V}), got {d.min() if d.min() < 0 else d.max()}")
    _check_probs(P, fn, "p")
    _check_probs(Q, fn, "q", mass=False)  # (a draft row may sum to 0 where nothing was drafted)
    rng = factory.numpy_generator(generator)
    rows = np.arange(B)
    u = rng.random((B, k))
    pos = np.arange(k)
    p_x, q_x = P[rows[:, None], pos, d], Q[rows[:, None], pos, d]
    accepted = u * q_x < p_x  # u < p/q without dividing; q(x) = 0 < p(x) accepts, p(x) = 0 always rejects
    n = np.cumprod(accepted, axis=1).sum(axis=1).astype(np.int64)  # accepted before the first rejection
    tokens = np.full((B, k + 1), -1, dtype=np.int64)
    for b in range(B):
        i = int(n[b])
        tokens[b, :i] = d[b, :i]
        if i < k:
            r = np.maximum(P[b, i] - Q[b, i], 0.0)
            if r.sum() <= 0:  # p == q up to rounding: then a rejection is (almost) never drawn; fall back to p
                r = P[b, i]
        else:
            r = P[b, k]
        tokens[b, i] = _race(r, rng)
    return n, tokens
