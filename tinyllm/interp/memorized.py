"""Memorization probes: how much of its training text a language model reproduces, and how exposed a planted secret is.

Two measures from the literature, on any model with `generate` (GPT, Llama: tinyllm/models/generation.py):

- `memorization`: k-extractability (Carlini et al. 2022, "Quantifying Memorization Across Neural Language Models"):
  a window of text is memorized when greedy decoding from its first prefix_len tokens reproduces the next suffix_len
  tokens exactly. Run on training text and on held-out text, the gap is what the model memorized rather than
  learned to predict.
- `exposure` (Carlini et al. 2019, "The Secret Sharer"): a canary is a prefix and a random secret of `length` tokens
  from an `alphabet`; the candidate set R is every such secret, |R| = |alphabet|^length. The secret's rank is its
  place among all of R ordered by log-perplexity (1: the likeliest), and exposure = log2|R| - log2 rank: log2|R|
  bits when the model ranks the true secret first, about 1 bit for a secret the model never saw (a uniformly random
  rank r has E[log2|R| - log2 r] ≈ log2 e ≈ 1.44). Computed exactly, over all of R, not estimated from a sample.
  `extraction` asks the plainer question: does greedy decoding from the prefix produce the secret?
"""
import math
from dataclasses import dataclass, field

import numpy as np

from .. import factory
from ..tensor import Tensor, no_grad


# ---- checks ----------------------------------------------------------------------------------------------------
def _ids(fn, name, tokens, min_len=1):
    """tokens as a 1-D int64 NumPy array (a list, an array or a tinyllm Tensor of ids), or a clear error."""
    if isinstance(tokens, Tensor):
        tokens = tokens.numpy()
    arr = np.asarray(tokens)
    if arr.ndim != 1:
        raise ValueError(f"{fn}: {name} must be a 1-D sequence of token ids, got shape {arr.shape}"
                         + (": pass one row, e.g. tokens[0]" if arr.ndim == 2 else ""))
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{fn}: {name} must hold integer token ids, got dtype {arr.dtype}: encode the text with "
                        "the model's tokenizer (float ids would be truncated silently)")
    if len(arr) < min_len:
        raise ValueError(f"{fn}: {name} has {len(arr)} tokens, fewer than the {min_len} needed")
    return arr.astype(np.int64)


def _positive(fn, name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{fn}: {name} must be a positive whole number, got {value!r}")
    return int(value)


def _check_vocab(fn, name, ids, model):
    vocab = model.config.vocab_size
    if ids.size and (ids.min() < 0 or ids.max() >= vocab):
        bad = int(ids.min() if ids.min() < 0 else ids.max())
        raise IndexError(f"{fn}: {name} holds token id {bad}, out of range for the model's vocabulary of {vocab} "
                         f"tokens (0..{vocab - 1}): encode with the tokenizer the model was trained with")


def _check_context(fn, model, prefix_len, suffix_len, names=("prefix_len", "suffix_len")):
    """Every suffix token must be predicted from the whole prefix: the model reads prefix_len + suffix_len - 1
    tokens to predict the last one, which must fit its context (generate would crop the prefix's start). `names`:
    what the two lengths are called in fn's arguments."""
    need = prefix_len + suffix_len - 1
    if need > model.max_positions:
        raise ValueError(f"{fn}: {names[0]} {prefix_len} + {names[1]} {suffix_len} - 1 = {need} tokens are read to "
                         f"predict the last token, more than the model's context of {model.max_positions} "
                         f"({model.max_positions_field}): make {names[0]} or {names[1]} shorter")


class _EvalMode:
    """Run a block with the model in eval mode (no dropout), restoring its mode after."""

    def __init__(self, model):
        self.model = model

    def __enter__(self):
        self.was_training = self.model.training
        self.model.eval()

    def __exit__(self, *exc):
        self.model.train(self.was_training)


# ---- memorization (Carlini et al. 2022) ---------------------------------------------------------------------------
@dataclass
class MemorizationResult:
    """How much of a text greedy decoding reproduces (`memorization`).

    exact_match_rate: the fraction of windows whose whole suffix was reproduced (k-extractable, k = prefix_len);
    token_agreement: the mean over windows of the fraction of suffix positions reproduced (position by position, the
    decoded continuation against the true one); per_sample_agreement: that fraction for each window, whose first
    token is at `starts`."""
    exact_match_rate: float
    token_agreement: float
    n: int
    prefix_len: int
    suffix_len: int
    starts: np.ndarray = field(repr=False)
    per_sample_agreement: np.ndarray = field(repr=False)
    generated: np.ndarray = field(repr=False)  # (n, suffix_len): the decoded suffixes

    def __str__(self):
        return (f"exact match {self.exact_match_rate:.3f}, token agreement {self.token_agreement:.3f} "
                f"({self.n} windows of {self.prefix_len} + {self.suffix_len} tokens)")


def window_starts(n_tokens, window, n, seed=0):
    """The first token of each of n windows of `window` tokens in a text of n_tokens: n distinct starts drawn
    uniformly without replacement (NumPy's default_rng(seed)), sorted; all of them, in order, when the text has n
    or fewer. Windows may overlap, as Carlini et al. 2022 sample sequences of the training set."""
    count = n_tokens - window + 1
    if count <= n:
        return np.arange(count, dtype=np.int64)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(count, size=n, replace=False)).astype(np.int64)


def greedy_continuations(model, prefixes, length, batch_size=64, device=None):
    """Greedy decoding (generate with temperature=0) of `length` tokens after each row of prefixes (N, P), in
    batches of batch_size rows: the (N, length) int64 NumPy array of the new tokens. The model runs in eval mode."""
    prefixes = np.asarray(prefixes, dtype=np.int64)
    out = np.empty((len(prefixes), length), dtype=np.int64)
    with _EvalMode(model):
        for i in range(0, len(prefixes), batch_size):
            idx = factory.tensor(prefixes[i:i + batch_size], device=device)
            out[i:i + batch_size] = model.generate(idx, length, temperature=0).numpy()[:, prefixes.shape[1]:]
    return out


def memorization(model, tokens, prefix_len=32, suffix_len=32, n=64, seed=0, batch_size=64, device=None):
    """How much of `tokens` (a 1-D array of token ids) the model reproduces: k-extractable memorization (Carlini
    et al. 2022, "Quantifying Memorization Across Neural Language Models", with k = prefix_len).

    n windows of prefix_len + suffix_len tokens are taken from tokens (`window_starts`: random distinct starts
    with `seed`, or every start when there are fewer than n); greedy decoding (temperature 0) continues each
    prefix by suffix_len tokens, batch_size prefixes per generate call; each continuation is compared with the
    true suffix. Returns a MemorizationResult: exact_match_rate (whole suffix reproduced) and token_agreement (mean
    fraction of suffix tokens reproduced). The whole window must fit the model's context (see _check_context).
    `device`: where the prefixes go (default: the default runtime, where the model is unless moved)."""
    fn = "memorization"
    prefix_len = _positive(fn, "prefix_len", prefix_len)
    suffix_len = _positive(fn, "suffix_len", suffix_len)
    n = _positive(fn, "n", n)
    batch_size = _positive(fn, "batch_size", batch_size)
    tokens = _ids(fn, "tokens", tokens)
    window = prefix_len + suffix_len
    if len(tokens) < window:
        raise ValueError(f"{fn}: tokens has {len(tokens)} tokens, fewer than one window of prefix_len {prefix_len} "
                         f"+ suffix_len {suffix_len} = {window}: give a longer text or shorter lengths")
    _check_context(fn, model, prefix_len, suffix_len)
    _check_vocab(fn, "tokens", tokens, model)
    starts = window_starts(len(tokens), window, n, seed)
    windows = tokens[starts[:, None] + np.arange(window)]  # (n, window)
    generated = greedy_continuations(model, windows[:, :prefix_len], suffix_len, batch_size, device)
    agree = (generated == windows[:, prefix_len:]).mean(axis=1)
    return MemorizationResult(exact_match_rate=float((agree == 1.0).mean()), token_agreement=float(agree.mean()),
                              n=len(starts), prefix_len=prefix_len, suffix_len=suffix_len, starts=starts,
                              per_sample_agreement=agree, generated=generated)


# ---- exposure (Carlini et al. 2019) -------------------------------------------------------------------------------
@no_grad()
def _log_probs(model, rows, device):
    """log-softmax of the model's logits at every position of rows (B, T): a (B, T, V) float64 NumPy array. The
    logits are lm_head over the final norm's output (the GenerationMixin contract, GPT's and Llama's alike)."""
    idx = factory.tensor(np.ascontiguousarray(rows, dtype=np.int64), device=device)
    logits = model.lm_head(model._features(idx)).numpy().astype(np.float64)
    logits -= logits.max(axis=-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))


def log_perplexities(model, prefix, candidates, batch_size=256, device=None):
    """The log-perplexity of each candidate continuation given `prefix`, in bits: the Secret Sharer's
    Px(s) = -log2 Pr(s | prefix) = -Σ_i log2 Pr(s_i | prefix, s_<i), by teacher forcing (one forward per batch of
    batch_size candidates, reading the model's distribution at every position). prefix: 1-D token ids (at least
    one); candidates (N, L) token ids. Returns (N,) float64. The model runs in eval mode."""
    fn = "log_perplexities"
    prefix = _ids(fn, "prefix", prefix)
    candidates = np.asarray(candidates)
    if candidates.ndim != 2 or candidates.shape[1] == 0:
        raise ValueError(f"{fn}: candidates must be (N, L) token ids with L >= 1, got shape {candidates.shape}")
    if candidates.size and not np.issubdtype(candidates.dtype, np.integer):
        raise TypeError(f"{fn}: candidates must hold integer token ids, got dtype {candidates.dtype}")
    batch_size = _positive(fn, "batch_size", batch_size)
    P, L = len(prefix), candidates.shape[1]
    _check_context(fn, model, P, L, ("the prefix's length", "the candidates' length"))
    _check_vocab(fn, "prefix", prefix, model)
    _check_vocab(fn, "candidates", candidates, model)
    out = np.empty(len(candidates))
    with _EvalMode(model):
        for i in range(0, len(candidates), batch_size):
            cand = candidates[i:i + batch_size].astype(np.int64)
            rows = np.concatenate([np.broadcast_to(prefix, (len(cand), P)), cand[:, :-1]], axis=1)
            lp = _log_probs(model, rows, device)[:, P - 1:]  # (B, L, V): the distribution of each candidate token
            out[i:i + batch_size] = -np.take_along_axis(lp, cand[:, :, None], axis=2)[:, :, 0].sum(1) / math.log(2)
    return out


@no_grad()
def _prefix_state(model, prefix, device):
    """One forward over prefix (1-D ids): the log-probabilities (V,) of the token after it, and each layer's keys
    and values as the caches a decode step reads (kv_cache.attend_cached: keys (1, H_kv, P, hs + 1), their last
    component the slot's score bias, 0 for every written slot; values (1, H_kv, P, hs))."""
    kv = []
    idx = factory.tensor(prefix[None], device=device)
    logits = model.lm_head(model._features(idx, kv)[:, -1]).numpy()[0].astype(np.float64)
    caches = [factory.cat([t, factory.zeros(*t.shape[:-1], 1, dtype=t.dtype, device=t.device)], -1)
              if i % 2 == 0 else t for i, t in enumerate(kv)]
    logits -= logits.max()
    return logits - np.log(np.exp(logits).sum()), [c.realize() for c in caches]


@no_grad()
def _log_probs_after(model, caches, toks, pos, device):
    """log-softmax of the logits at each position of toks (B, T), which follow the P tokens the caches hold (B
    rows of them: the prefix's, shared): a (B, T, V) float64 NumPy array. A decode step's forward
    (_decode_features), so the prefix is not recomputed for every row."""
    B = toks.shape[0]
    rows = [c.expand(B, *c.shape[1:]) for c in caches]
    x, _ = model._decode_features(factory.tensor(np.ascontiguousarray(toks), device=device),
                                  factory.tensor([pos], device=device), rows)
    logits = model.lm_head(x).numpy().astype(np.float64)
    logits -= logits.max(axis=-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))


def secret_log_perplexities(model, prefix, alphabet, length, batch_size=256, device=None):
    """Px of every secret of `length` tokens from `alphabet` (1-D distinct token ids) after `prefix`: an array of
    shape (|alphabet|,) * length, entry [i_1, ..., i_L] the log-perplexity in bits of the secret alphabet[i_1] …
    alphabet[i_L]. Exact, and cheaper than log_perplexities over all |alphabet|^length secrets twice over: the
    prefix is run once and its keys and values shared by every row (a decode step over the secret's tokens), and
    one row per secret's first length - 1 tokens gives every conditional along it, its last position's
    distribution scoring all |alphabet| last tokens at once (|alphabet|^(length-1) rows of length - 1 tokens)."""
    fn = "secret_log_perplexities"
    prefix = _ids(fn, "prefix", prefix)
    alphabet = _ids(fn, "alphabet", alphabet, min_len=2)
    if len(np.unique(alphabet)) != len(alphabet):
        raise ValueError(f"{fn}: alphabet {alphabet.tolist()} repeats a token: each candidate must be counted once")
    length = _positive(fn, "length", length)
    batch_size = _positive(fn, "batch_size", batch_size)
    A, P = len(alphabet), len(prefix)
    _check_context(fn, model, P, length, ("the prefix's length", "the secret's length"))
    _check_vocab(fn, "prefix", prefix, model)
    _check_vocab(fn, "alphabet", alphabet, model)
    with _EvalMode(model):
        first, caches = _prefix_state(model, prefix, device)  # the first secret token's distribution: every row's
        if length == 1:
            return -first[alphabet] / math.log(2)
        # every secret's first length - 1 tokens, as alphabet indices, in C order of the result's first axes
        heads = np.indices((A,) * (length - 1)).reshape(length - 1, -1).T  # (A^(L-1), L-1)
        out = np.empty((len(heads), A))
        for i in range(0, len(heads), batch_size):
            head = heads[i:i + batch_size]
            after = _log_probs_after(model, caches, alphabet[head], P, device)[:, :, alphabet]  # (B, L-1, A)
            lp = np.concatenate([np.broadcast_to(first[alphabet], (len(head), 1, A)), after], axis=1)  # (B, L, A)
            along = np.take_along_axis(lp[:, :-1], head[:, :, None], axis=2)[:, :, 0].sum(1)  # the head's tokens
            out[i:i + batch_size] = -(along[:, None] + lp[:, -1]) / math.log(2)
    return out.reshape((A,) * length)


def rank_of(value, values):
    """The rank of `value` among `values` (which contain it) ordered from lowest: 1 + how many are strictly lower,
    so ties share the best rank."""
    return 1 + int(np.count_nonzero(np.asarray(values) < value))


@dataclass
class ExposureResult:
    """A canary's exposure (Carlini et al. 2019): log2|R| - log2 rank, in bits, with rank the secret's place among
    the |R| candidates ordered by log-perplexity (1: the likeliest). max_exposure = log2|R|."""
    exposure: float
    rank: int
    n_candidates: int
    log_perplexity: float  # the secret's, in bits
    max_exposure: float


def exposure_from_log_perplexities(secret_lp, candidate_lps):
    """Exposure of a secret of log-perplexity secret_lp among candidate_lps (every candidate's, the secret's among
    them): an ExposureResult."""
    candidate_lps = np.asarray(candidate_lps, dtype=np.float64).ravel()
    R, rank = candidate_lps.size, rank_of(secret_lp, candidate_lps)
    return ExposureResult(exposure=math.log2(R) - math.log2(rank), rank=rank, n_candidates=R,
                          log_perplexity=float(secret_lp), max_exposure=math.log2(R))


def exposure(model, prefix, secret, alphabet, batch_size=256, device=None):
    """The exposure of a canary (Carlini et al. 2019, "The Secret Sharer", section 4): prefix (1-D token ids) then
    secret (1-D token ids, each in alphabet). The candidate set R is every sequence of len(secret) tokens from
    alphabet, |R| = |alphabet|^len(secret); all are scored exactly (secret_log_perplexities), and
    exposure = log2|R| - log2 rank, rank the secret's among them by log-perplexity. Returns an ExposureResult."""
    fn = "exposure"
    secret = _ids(fn, "secret", secret)
    alphabet = _ids(fn, "alphabet", alphabet, min_len=2)
    where = {int(t): i for i, t in enumerate(alphabet)}
    missing = [int(t) for t in secret if int(t) not in where]
    if missing:
        raise ValueError(f"{fn}: secret token(s) {missing} are not in alphabet {alphabet.tolist()}: the secret must "
                         "be one of the candidates")
    lps = secret_log_perplexities(model, prefix, alphabet, len(secret), batch_size, device)
    return exposure_from_log_perplexities(lps[tuple(where[int(t)] for t in secret)], lps)


def extraction(model, prefix, secret, device=None):
    """Whether greedy decoding from prefix (1-D token ids) reproduces secret (1-D token ids) exactly: the canary is
    extractable (Carlini et al. 2019, section 8; k-extractable in Carlini et al. 2022's terms)."""
    fn = "extraction"
    prefix, secret = _ids(fn, "prefix", prefix), _ids(fn, "secret", secret)
    _check_context(fn, model, len(prefix), len(secret), ("the prefix's length", "the secret's length"))
    _check_vocab(fn, "prefix", prefix, model)
    return bool((greedy_continuations(model, prefix[None], len(secret), 1, device)[0] == secret).all())
