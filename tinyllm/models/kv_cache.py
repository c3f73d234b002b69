"""The key/value cache of decoding (docs/architecture.md, "Generating"): attention of new positions against it
(attend_cached), and the Decoder that keeps it per model, batch and device and runs the recorded decode steps
(GenerationMixin's generate, in generation.py, drives it). The model hooks it calls are listed in generation.py."""
import math

import numpy as np

from .. import factory
from ..nn import functional as F
from ..tensor import Tensor


MASKED = -1e30  # an empty cache slot's score bias: finite (WGSL may assume no infinities); exp(MASKED·scale - max) = 0
# The fewest slots a growing cache has: a decode step's attention reads every slot (attend_cached), so the caches start
# this small and double as the sequence fills them (Decoder._capacity)
MIN_SLOTS = 64


def empty_slots(keys):
    """Key cache slots (B, H_kv, n, hs + 1) with the last column MASKED (empty), realized."""
    last = factory.arange(keys.shape[-1], device=keys.device) == keys.shape[-1] - 1
    return last.where(MASKED, keys).to(keys.dtype).realize()


def attend_cached(q, k, v, k_cache, v_cache):
    """Attention of T new positions against a layer's cache, and the cache rows they add.

    q (B, H, T, hs) are the new queries, k and v (B, H_kv, T, hs) their keys and values (H_kv divides H:
    grouped-query attention, query head h reading kv head h // (H / H_kv)); k_cache (B, H_kv, block, hs + 1) holds
    each slot's key and, last, its mask bias (0 for a written slot, MASKED for an empty one), v_cache
    (B, H_kv, block, hs) its value, and the new positions' own slots are still empty. Returns y (B, H, T, hs) and
    the new rows: the keys with bias 0 (B, H_kv, T, hs + 1) and the values.

    q gets a last component 1, so q·k adds each slot's bias to its score and no mask is needed. The scores of the
    cache and of the new keys (causal among themselves: T > 1 is speculative decoding's verification) are one softmax:
        y = (Σ_j e^(s_j - m) v_j + Σ_t e^(s_t - m) v_t) / (Σ_j e^(s_j - m) + Σ_t e^(s_t - m)),
    m the largest score, so the step reads the old caches only, and writing the new rows into them can come
    after it (Decoder._step). A group's g query heads are g·T rows against their one kv head, a view of q."""
    B, H, T, hs = q.shape
    H_kv = k.shape[1]
    g = H // H_kv
    rows = q.reshape(B, H_kv, g * T, hs) if g > 1 else q
    scale = 1.0 / math.sqrt(hs)
    zero = factory.zeros(B, H_kv, g * T, 1, dtype=q.dtype, device=q.device)
    scores = (factory.cat([rows, zero + 1.0], -1) @ k_cache.transpose(-2, -1)) * scale  # (B, H_kv, gT, block)
    if T == 1:
        own = (rows * k).sum(-1, keepdim=True) * scale  # (B, H_kv, g, 1)
    else:  # position t sees the new positions up to t
        causal = np.tile(np.triu(np.full((T, T), MASKED, np.float32), 1), (g, 1))
        own = (rows @ k.transpose(-2, -1)) * scale + factory.tensor(causal, device=q.device)
    own_max = own if T == 1 else own.max(-1, keepdim=True).values
    m = scores.max(-1, keepdim=True).values.maximum(own_max).detach()
    e, e_own = (scores - m).exp(), (own - m).exp()
    own_v, own_sum = (e_own * v, e_own) if T == 1 else (e_own @ v, e_own.sum(-1, keepdim=True))
    y = (e @ v_cache + own_v) / (e.sum(-1, keepdim=True) + own_sum)
    if g > 1:
        y = y.reshape(B, H, T, hs)
    bias = zero if g == 1 else factory.zeros(B, H_kv, T, 1, dtype=q.dtype, device=q.device)
    return y, factory.cat([k, bias], -1), v


class Decoder:
    """Next-token logits (B, V) for a sequence that grows by one token per call: `logits(ids)` with ids (B, L).

    A call that adds one token to the last call's sequence within the block is a decode step (`step`); any other
    call up to the block is a prefill (`_prefill`); past the block, and on every call when uncached, `window` runs
    a full forward over the last block tokens (docs/architecture.md, "Generating"). Uncached, shorter contexts
    are padded on the right, which causal attention keeps out of the last real position's logits.

    The caches have _capacity(L) slots for a sequence of L: a power of two from MIN_SLOTS up, grown (doubled, the new
    slots empty) when the sequence reaches it, so a step's reads and writes of the caches follow the sequence's
    length, not the block's. Each size is its own recording of the step. grow=False keeps the block's slots from the
    start: one recording for every position (tinyllm.export's page)."""

    def __init__(self, model, batch, device, use_cache, replayable=True, grow=True):
        from ..replay.jit import jit
        self.model, self.block, self.device, self.use_cache = model, model.max_positions, device, use_cache
        self.length = None  # the length of the sequence the cache holds
        self.busy = False  # a generation is using it
        wrap = jit if replayable else (lambda fn: fn)
        self.window, self.step, self.chunk, self.cut = (wrap(f) for f in (self._window, self._step, self._chunk,
                                                                          self._cut))
        self.grow = grow
        self.caches = []
        if use_cache:
            # keys and values as the model computes them: each write assigns the model's rows, so a model cast
            # between calls (or autocast) gives the caches its dtype at the next prefill, and tinyllm.jit, keyed on
            # the dtype and shape of each tensor a step assigns, records the step again
            dtype = model.get_input_embeddings().weight.dtype
            slots = self._capacity(1)
            self.caches = [factory.zeros(*shape[:2], slots, shape[3], dtype=dtype, device=device)
                           for shape in model._cache_shapes(batch)]
            self.caches = [empty_slots(c) if i % 2 == 0 else c.realize() for i, c in enumerate(self.caches)]
            self.slots = factory.arange(slots, device=device)

    def _capacity(self, n):
        """The slots a cache holding n positions has: the block when it does not grow, else the next power of two
        from MIN_SLOTS up (so the steps' traffic follows the sequence's length, and a sequence records log2(block /
        MIN_SLOTS) + 1 steps at most)."""
        if not self.grow:
            return self.block
        return min(self.block, max(MIN_SLOTS, 1 << (n - 1).bit_length()))

    def _room(self, n):
        """Make the caches hold n positions at least: past their slots, they grow to _capacity(n), the new slots
        empty (a key's bias MASKED). Never shrinks: the next sequence replays the steps recorded at this size."""
        have = self.slots.shape[0]
        want = self._capacity(n)
        if not self.use_cache or want <= have:
            return
        from ..realizer import assign
        B, H = self.caches[0].shape[:2]
        added = [factory.zeros(B, H, want - have, c.shape[-1], dtype=c.dtype, device=self.device) for c in self.caches]
        added = [empty_slots(a) if i % 2 == 0 else a for i, a in enumerate(added)]
        assign(self.caches, [factory.cat([c, a], 2) for c, a in zip(self.caches, added)])
        self.slots = factory.arange(want, device=self.device)

    def logits(self, ids):
        B, L = ids.shape
        if not self.use_cache or L > self.block:
            self.length = None
            context = ids[:, -self.block:]
            padded = np.zeros((B, self.block), dtype=np.int64)
            padded[:, :context.shape[1]] = context
            last = Tensor([context.shape[1] - 1], device=self.device)  # a tensor index: one schedule for every L
            return self.window(Tensor(padded, device=self.device), last)
        self._room(L)
        if self.length is not None and L == self.length + 1:
            self.length = L
            return self.step(Tensor(ids[:, -1:], device=self.device), Tensor([L - 1], device=self.device))
        self.length = L
        if L == 1:  # a one-token prompt: emptied and decoded by the recorded steps, no graph built
            self.cut(Tensor([0], device=self.device))
            return self.step(Tensor(ids, device=self.device), Tensor([0], device=self.device))
        return self._prefill(Tensor(ids, device=self.device))

    def extend(self, ids):
        """Logits (B, T, V), a NumPy array, at each of the T positions of ids (B, L) past the cache's `length`
        (1 <= T, L <= block): one forward over them against the cache, which then holds all of ids. The cache
        must hold ids' first `length` tokens (sync)."""
        B, L = ids.shape
        self._room(L)
        T, pos = L - self.length, Tensor([self.length], device=self.device)
        if T == 1:  # the decode step's own recording
            out = self.step(Tensor(ids[:, -1:], device=self.device), pos).numpy()[:, None]
        else:
            out = self.chunk(Tensor(ids[:, self.length:], device=self.device), pos).numpy()
        self.length = L
        return out

    def sync(self, ids, length):
        """Make the cache hold exactly the first `length` tokens of ids (B, L), of which it holds a prefix: forget
        what it holds past them (speculative decoding's rollback of rejected drafts), or add what it lacks."""
        if self.length is None:  # a new sequence: emptied, then filled by the recorded chunk steps (a prefill's
            self.cut(Tensor([0], device=self.device))  # graph is built anew for each prompt length)
            self.length = 0
        if self.length > length:
            self.cut(Tensor([length], device=self.device))
        elif self.length < length:
            self.extend(ids[:, :length])
        self.length = length

    def _window(self, padded, last):
        return self.model.lm_head(self.model._features(padded)[:, last])[:, -1, :]

    def _prefill(self, idx):
        from ..realizer import assign, realize
        model, kv = self.model, []
        logits = model.lm_head(model._features(idx, kv)[:, -1:])[:, -1, :]
        B, T = idx.shape
        slots = self.slots.shape[0]
        pad = slots - T
        kv = [F.pad(t, (0, 0, 0, pad)) if pad else t.contiguous() for t in kv]
        bias = (self.slots < T).reshape(1, 1, slots, 1).where(0.0, MASKED)  # the empty slots' score bias, in
        # the keys' dtype (as attend_cached's rows), so that a 16-bit model's key cache stays 16-bit
        kv = [factory.cat([t, bias.to(t.dtype).expand(*t.shape[:-1], 1)], -1) if i % 2 == 0 else t
              for i, t in enumerate(kv)]
        realize(logits, *kv)
        assign(self.caches, kv)
        return logits

    def _step(self, tok, pos):
        """One token (B, 1) at position pos (1,) against the caches: returns the logits and writes its keys and values
        into slot pos. The writes are a second realize and the old caches' last readers, so the C runtime's replay can
        write the caches in place (a donation) and run the step as one chain."""
        from ..realizer import assign, realize
        x, rows = self.model._decode_features(tok, pos, self.caches)
        logits = self.model.lm_head(x)[:, -1, :]
        realize(logits, *rows)
        write = (self.slots == pos).reshape(1, 1, -1, 1)  # the slot this position's key and value go to
        new = [write.where(row, cache) for row, cache in zip(rows, self.caches)]
        realize(*new)
        assign(self.caches, new)
        return logits

    def _chunk(self, toks, pos):
        """T tokens (B, T) at positions pos…pos+T-1 against the caches (speculative decoding's verification): as
        _step, with the logits of every position (B, T, V); slot pos + t takes row t."""
        from ..realizer import assign, realize
        T = toks.shape[1]
        x, rows = self.model._decode_features(toks, pos, self.caches)
        logits = self.model.lm_head(x)
        realize(logits, *rows)
        write = ((self.slots >= pos) & (self.slots < pos + T)).reshape(1, 1, -1, 1)
        row = (self.slots - pos).maximum(0).minimum(T - 1)  # the row each slot would take
        new = [write.where(r[:, :, row], cache) for r, cache in zip(rows, self.caches)]
        realize(*new)
        assign(self.caches, new)
        return logits

    def _cut(self, length):
        """Mark the slots from `length` on empty again: their keys' bias back to MASKED."""
        from ..realizer import assign
        keys = self.caches[0::2]
        hs1 = keys[0].shape[-1]
        stale = (self.slots >= length).reshape(1, 1, -1, 1) \
            & (factory.arange(hs1, device=self.device) == hs1 - 1).reshape(1, 1, 1, hs1)
        assign(keys, [stale.where(MASKED, k) for k in keys])


def decode_layers(layers, x, caches, *args):
    """x through each layer's decode(x, *args, k_cache, v_cache) against its two caches: the output and every
    layer's new cache rows [k, v, k, v, …]."""
    rows = []
    for i, layer in enumerate(layers):
        x, k, v = layer.decode(x, *args, caches[2 * i], caches[2 * i + 1])
        rows += [k, v]
    return x, rows


def positions(pos, T, device):
    """The positions pos…pos+T-1 of T new tokens, pos a (1,) int64 tensor (one decode step: pos itself)."""
    return pos if T == 1 else pos + factory.arange(T, device=device)
