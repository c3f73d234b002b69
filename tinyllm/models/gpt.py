"""A GPT in nanoGPT's shape and with its parameter names, so its weights load into (and from) nanoGPT."""
import math
from dataclasses import dataclass

import numpy as np

from .. import factory, nn
from ..nn import functional as F
from ..utils.checkpoint import checkpoint
from ..sampling import sample
from ..tensor import no_grad


@dataclass
class GPTConfig:
    block_size: int = 256
    vocab_size: int = 65
    n_layer: int = 6
    n_head: int = 6
    n_embd: int = 384
    dropout: float = 0.0
    bias: bool = True
    checkpoint: bool = False  # recompute each block's activations in the backward pass (less memory)
    # the MLP's GELU: "exact" (erf, nanoGPT's nn.GELU(), the default) or "tanh" (GPT-2's and llm.c's approximation)
    gelu: str = "exact"

    def __post_init__(self):
        if self.gelu not in GELU_FORMS:
            raise ValueError(f"GPTConfig: gelu must be one of {sorted(GELU_FORMS)} (\"exact\" is nanoGPT's erf GELU, "
                             f"\"tanh\" GPT-2's approximation), got {self.gelu!r}")


GELU_FORMS = {"exact": "none", "tanh": "tanh"}  # GPTConfig.gelu -> F.gelu's approximate=
MASKED = -1e30  # an empty cache slot's score bias: finite (WGSL may assume no infinities); exp(MASKED·scale - max) = 0


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        if config.n_embd % config.n_head:
            raise ValueError(f"GPTConfig: n_embd {config.n_embd} must be divisible by n_head {config.n_head}")
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout

    def _qkv(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        return (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)

    def _out(self, y):
        B, _, T, _ = y.shape
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, self.n_embd)))

    def forward(self, x, cache=None):
        """With `cache` (a list to append to): also the keys and values of x's positions (B, nh, T, hs)."""
        q, k, v = self._qkv(x)
        if cache is not None:
            cache.extend((k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self._out(y)

    def decode(self, x, k_cache, v_cache):
        """T new positions x (B, T, C) against the cache: k_cache (B, nh, block, hs + 1), each slot's key and, last,
        its mask bias (0 for a written slot, MASKED for an empty one), and v_cache (B, nh, block, hs), in which x's
        own slots are still empty. Returns y and x's cache rows: its keys with bias 0 (B, nh, T, hs + 1) and its
        values.

        q gets a last component 1, so q·k adds each slot's bias to its score and the empty slots drop out of the
        softmax with no mask: the shapes are the same at every position. The scores of the cache and of x's own
        keys (causal among themselves: T > 1 is speculative decoding's verification) are put together as one
        softmax:
            y = (Σ_j e^(s_j - m) v_j + Σ_t e^(s_t - m) v_t) / (Σ_j e^(s_j - m) + Σ_t e^(s_t - m)),
        m the largest score, so the step reads the old caches only, and writing x's rows into them can come after
        it (_Decoder._step)."""
        q, k, v = self._qkv(x)
        B, nh, T, hs = q.shape
        scale = 1.0 / math.sqrt(hs)
        zero = factory.zeros(B, nh, T, 1, dtype=q.dtype, device=x.device)
        scores = (factory.cat([q, zero + 1.0], -1) @ k_cache.transpose(-2, -1)) * scale  # (B, nh, T, block)
        if T == 1:
            own = (q * k).sum(-1, keepdim=True) * scale  # (B, nh, 1, 1)
        else:  # position t sees the new positions up to t
            causal = np.triu(np.full((T, T), MASKED, np.float32), 1)
            own = (q @ k.transpose(-2, -1)) * scale + factory.tensor(causal, device=x.device)
        own_max = own if T == 1 else own.max(-1, keepdim=True).values
        m = scores.max(-1, keepdim=True).values.maximum(own_max).detach()
        e, e_own = (scores - m).exp(), (own - m).exp()
        own_v, own_sum = (e_own * v, e_own) if T == 1 else (e_own @ v, e_own.sum(-1, keepdim=True))
        y = (e @ v_cache + own_v) / (e.sum(-1, keepdim=True) + own_sum)
        return self._out(y), factory.cat([k, zero], -1), v


class MLP(nn.Module):
    def __init__(self, config):
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        self.approximate = GELU_FORMS[config.gelu]

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate=self.approximate)))


class Block(nn.Module):
    def __init__(self, config):
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, cache=None):
        x = x + self.attn(self.ln_1(x), cache)
        return x + self.mlp(self.ln_2(x))

    def decode(self, x, k_cache, v_cache):
        y, k, v = self.attn.decode(self.ln_1(x), k_cache, v_cache)
        x = x + y
        return x + self.mlp(self.ln_2(x)), k, v


class GPT(nn.Module):
    def __init__(self, config):
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList(Block(config) for _ in range(config.n_layer)),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self._init_weights()
        self.lm_head.weight = self.transformer.wte.weight  # weight tying, as GPT-2

    def _init_weights(self):
        """GPT-2's init: N(0, 0.02) for weights (1 for the layer norms'), 0 for biases, and residual projections
        scaled by 1/√(2·n_layer) so the residual stream's variance does not grow with depth."""
        rng = factory.generator()
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                value = np.zeros(p.shape, np.float32)
            elif ".ln_" in name or name.startswith("transformer.ln_f"):
                value = np.ones(p.shape, np.float32)
            else:
                std = 0.02 / math.sqrt(2 * self.config.n_layer) if name.endswith("c_proj.weight") else 0.02
                value = rng.normal(0.0, std, size=p.shape).astype(np.float32)
            p.copy_(value)

    def forward(self, idx, targets=None):
        x = self._features(idx)
        if targets is None:
            return self.lm_head(x[:, -1:, :]), None  # inference: only the last position is needed
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def _features(self, idx, cache=None):
        """The last layer norm's output at every position of idx (B, T). With `cache` (a list), each layer's keys
        and values (B, nh, T, hs) are appended to it."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"GPT: sequence of length {T} is longer than block_size {self.config.block_size}")
        pos = factory.arange(T, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = checkpoint(block, x) if self.config.checkpoint and self.training and cache is None else block(x, cache)
        return self.transformer.ln_f(x)

    @classmethod
    def from_nanogpt_checkpoint(cls, path, *, gelu="exact", device=None, weights_only=True):
        """A GPT holding the weights of a checkpoint written by nanoGPT's train.py (`ckpt.pt`: a dict with `model`,
        its state dict, and `model_args`, its GPTConfig's fields). Keys prefixed `_orig_mod.` (a torch.compile'd
        model) are unprefixed, and older checkpoints' `attn.bias` causal-mask buffers are dropped. nanoGPT's GELU
        is the exact (erf) one, hence gelu="exact". The file is a torch pickle: it is read with torch
        (torch.load(weights_only=True) by default), imported here only, so it must be installed."""
        try:
            import torch
        except ImportError:
            raise ImportError("GPT.from_nanogpt_checkpoint: reading nanoGPT's ckpt.pt needs torch (it is a torch "
                              "pickle), and torch is not installed: `pip install torch` (the CPU wheel is enough)") \
                from None
        try:
            ckpt = torch.load(path, map_location="cpu", weights_only=weights_only)
        except Exception as e:
            raise RuntimeError(f"GPT.from_nanogpt_checkpoint: torch could not read {path!s} as a checkpoint ({e}); "
                               "if it is a trusted file that holds more than tensors and plain values, pass "
                               "weights_only=False") from e
        if not isinstance(ckpt, dict) or "model" not in ckpt or "model_args" not in ckpt:
            found = sorted(ckpt) if isinstance(ckpt, dict) else type(ckpt).__name__
            raise ValueError(f"GPT.from_nanogpt_checkpoint: {path!s} is not a nanoGPT checkpoint: expected a dict "
                             f"with 'model' and 'model_args', found {found}")
        fields = set(GPTConfig.__dataclass_fields__)
        config = GPTConfig(**{k: v for k, v in ckpt["model_args"].items() if k in fields and k != "gelu"}, gelu=gelu)
        state = {}
        for key, value in ckpt["model"].items():
            key = key[len("_orig_mod."):] if key.startswith("_orig_mod.") else key
            if key.endswith(".attn.bias") or key.endswith(".attn.masked_bias"):  # causal-mask buffers, not weights
                continue
            state[key] = value.detach().to("cpu", torch.float32).numpy() if hasattr(value, "detach") else value
        model = cls(config)
        model.load_state_dict(state)
        return model.to(device=device) if device is not None else model

    def configure_optimizers(self, weight_decay, learning_rate, betas=(0.9, 0.95)):
        """AdamW with decay on 2-D weights only (matmuls and embeddings), as nanoGPT groups them."""
        from ..optim import AdamW
        params = self.parameters()
        decay = [p for p in params if p.ndim >= 2]
        no_decay = [p for p in params if p.ndim < 2]
        return AdamW([{"params": decay, "weight_decay": weight_decay},
                      {"params": no_decay, "weight_decay": 0.0}], lr=learning_rate, betas=betas)

    @no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, *, top_p=None, min_p=None, generator=None,
                 use_cache=True, draft_model=None, num_speculative_tokens=4, stream=False):
        """Extend idx (B, T) by max_new_tokens tokens, each sampled from the model's next-token distribution given
        the last block_size tokens (nanoGPT's crop) and fed back in. Returns the (B, T + max_new_tokens) int64
        tensor; with stream=True, an iterator that yields each step's new tokens as a (B, 1) int64 tensor as soon
        as they are sampled (the same tokens, under the same seed, as stream=False).

        Sampling: tinyllm.sampling.sample with these arguments: temperature=0 is argmax (greedy); top_k, top_p and
        min_p filter as Hugging Face does; `generator` (tinyllm.Generator) makes the draws reproducible.

        use_cache=True (the default): one batched forward over the prompt (prefill) fills a per-layer key/value
        cache of block_size slots, then each token is one position's forward against it (_Decoder). That step
        has the same shapes at every position (the position is a tensor), so tinyllm.jit records it once and
        replays its kernels from the fourth token on. Past block_size the window slides: GPT's position
        embeddings are absolute, so after a crop every cached key belongs to another position and each step
        recomputes the whole window exactly, as nanoGPT does (still one replayed shape). use_cache=False
        recomputes the window on every step. Batched prompts are of equal length, as idx is one tensor.

        draft_model (a smaller GPT on the same tokens): speculative decoding, one sequence (B = 1). The draft
        proposes num_speculative_tokens tokens per round and this model verifies them in one forward; the tokens
        follow this model's own distribution exactly, faster when the draft guesses well (_speculative_steps).
        self.speculative_stats then holds the rounds and the proposed and accepted draft tokens."""
        if idx.ndim != 2:
            raise ValueError(f"GPT.generate: idx must be (B, T) token ids, got shape {idx.shape}")
        if idx.shape[1] == 0:
            raise ValueError("GPT.generate: the prompt is empty: give at least one token per row")
        sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
        if draft_model is None:
            steps = self._generate_steps(idx, max_new_tokens, sampling, generator, use_cache)
        else:
            steps = self._speculative_steps(draft_model, idx, max_new_tokens, num_speculative_tokens, sampling,
                                            generator)
        if stream:
            return steps
        from ..tensor import Tensor
        ids = idx.numpy()
        new = [t.numpy() for t in steps]
        return Tensor(np.concatenate([ids] + new, axis=1).astype(np.int64), device=idx.device)

    def _generate_steps(self, idx, max_new_tokens, sampling, generator, use_cache):
        """The generator behind generate(): no_grad around each step's work (a generator's body runs while its
        caller's code runs, so a no_grad spanning a yield would leak into the caller)."""
        from ..tensor import Tensor
        with no_grad():
            ids = idx.numpy().astype(np.int64)
            decoder = self._decoder(ids.shape[0], idx.device, use_cache)
        try:
            for _ in range(max_new_tokens):
                with no_grad():
                    logits = decoder.logits(ids)
                    nxt = sample(logits, **sampling, generator=generator).numpy().astype(np.int64)
                    ids = np.concatenate([ids, nxt], axis=1)
                yield Tensor(nxt, device=idx.device)
        finally:
            decoder.busy = False

    def _speculative_steps(self, draft, idx, max_new_tokens, k, sampling, generator):
        """generate() with a draft model (Leviathan et al. 2023; Chen et al. 2023). Each round the draft proposes
        up to k tokens, one cached step each; the target scores them all in one forward of k + 1 positions against
        its cache (_Decoder.extend) and speculative_accept keeps a prefix of them and adds one token of its own:
        the tokens follow the target's distribution exactly (its docstring has the proof), and greedy decoding
        gives the target's greedy tokens. Both caches then forget the rejected positions (_Decoder.sync). Near
        block_size, where no draft fits, the target goes on alone. The counts of the last call are in
        self.speculative_stats: rounds, proposed and accepted drafts."""
        from ..sampling import draw, probs, speculative_accept
        from ..tensor import Tensor
        if idx.shape[0] != 1:
            raise ValueError(f"GPT.generate: speculative decoding takes one sequence (B = 1), got B = {idx.shape[0]}: "
                             "generate each row on its own")
        if draft.config.vocab_size != self.config.vocab_size:
            raise ValueError(f"GPT.generate: the draft model's vocab_size {draft.config.vocab_size} is not the "
                             f"target's {self.config.vocab_size}: a draft must share the target's tokens")
        if k < 1:
            raise ValueError(f"GPT.generate: num_speculative_tokens must be at least 1, got {k}")
        block = min(self.config.block_size, draft.config.block_size)
        stats = self.speculative_stats = {"rounds": 0, "proposed": 0, "accepted": 0}
        with no_grad():
            ids = idx.numpy().astype(np.int64)
            target, drafter = self._decoder(1, idx.device, True), draft._decoder(1, idx.device, True)
        try:
            produced = 0
            while produced < max_new_tokens:
                with no_grad():
                    L = ids.shape[1]
                    n = min(k, max_new_tokens - produced - 1, block - L)
                    if n < 1:  # the last token, or no room for a draft in the block: the target alone
                        new = sample(target.logits(ids), **sampling, generator=generator).numpy()[0]
                    else:
                        target.sync(ids, L - 1)
                        drafter.sync(ids, L - 1)
                        seq, q = ids, []
                        for _ in range(n):
                            q.append(probs(drafter.extend(seq)[:, -1], **sampling))
                            seq = np.concatenate([seq, draw(q[-1], generator)[:, None]], axis=1)
                        p = probs(target.extend(seq), **sampling)  # (1, n + 1, V)
                        accepted, tokens = speculative_accept(p, np.stack(q, 1), seq[:, L:], generator)
                        new = tokens[0, :accepted[0] + 1]
                        stats["rounds"] += 1
                        stats["proposed"] += n
                        stats["accepted"] += int(accepted[0])
                    ids = np.concatenate([ids, new[None].astype(np.int64)], axis=1)
                    produced += len(new)
                for token in new:
                    yield Tensor(np.array([[token]], dtype=np.int64), device=idx.device)
        finally:
            target.busy = drafter.busy = False

    def _decoder(self, batch, device, use_cache):
        """The model's _Decoder for this batch size, device and mode, kept between generate() calls so that a new
        call replays the steps recorded by an earlier one (a weight changed since makes its recording stale, and
        tinyllm.jit records it again). Its cache is block_size slots per layer, reused by every call."""
        replayable = not self.training or self.config.dropout == 0  # dropout's masks come from the host
        key = (batch, device, use_cache, replayable)
        decoders = self.__dict__.setdefault("_decoders", {})
        if key not in decoders:
            while len(decoders) >= 4:  # a few shapes at a time: each holds a cache
                del decoders[next(iter(decoders))]
            decoders[key] = _Decoder(self, batch, device, use_cache, replayable)
        decoder = decoders[key]
        if decoder.busy:  # another generation (a stream not yet finished) is using its cache: one of its own
            decoder = _Decoder(self, batch, device, use_cache, replayable)
        decoder.length, decoder.busy = None, True  # a new sequence: the first step is a prefill
        return decoder


class _Decoder:
    """Next-token logits (B, V) for a sequence that grows by one token per call: `logits(ids)` with ids (B, L).

    Cached (use_cache): a call with a prefix of at most block_size tokens that is not the last call's sequence plus
    one token is a prefill: one forward over all of it, whose keys and values (B, nh, L, hs) fill the first slots
    of each layer's caches (keys (B, nh, block_size, hs + 1), values (B, nh, block_size, hs)). A call that adds
    one token within block_size is a decode step (step): that token's forward at position L - 1 writes its key and
    value into slot L - 1 (a `where` over the cache, whose result is assigned to the cache tensor) and attends to
    slots 0…L-1: the keys carry a bias column, MASKED in the empty slots, so the attention needs no mask
    (CausalSelfAttention.decode). The position is a tensor, so every step has one graph: tinyllm.jit records it
    on the 2nd and 3rd calls and replays it after. Past block_size the context is the last block_size tokens
    (nanoGPT's crop), whose positions all moved: the cached keys were made with other position embeddings, so the
    exact answer is a full forward over the window, which `window` does (one shape too, so it replays).

    Uncached: every call is that full-window forward; shorter contexts are padded on the right to block_size,
    which causal attention keeps out of the last real position's logits."""

    def __init__(self, model, batch, device, use_cache, replayable=True):
        from ..replay.jit import jit
        self.model, self.block, self.device, self.use_cache = model, model.config.block_size, device, use_cache
        self.length = None  # the length of the sequence the cache holds
        self.busy = False  # a generation is using it
        wrap = jit if replayable else (lambda fn: fn)
        self.window, self.step, self.chunk, self.cut = (wrap(f) for f in (self._window, self._step, self._chunk,
                                                                          self._cut))
        self.caches = []
        if use_cache:
            cfg = model.config
            hs = cfg.n_embd // cfg.n_head
            shapes = [(batch, cfg.n_head, cfg.block_size, hs + 1), (batch, cfg.n_head, cfg.block_size, hs)]
            dtype = model.transformer.wte.weight.dtype  # the caches hold keys and values as the model computes them
            self.caches = [factory.zeros(*shapes[i % 2], dtype=dtype, device=device).realize()
                           for i in range(2 * cfg.n_layer)]
            self.slots = factory.arange(cfg.block_size, device=device)

    def logits(self, ids):
        from ..tensor import Tensor
        B, L = ids.shape
        if not self.use_cache or L > self.block:
            self.length = None
            context = ids[:, -self.block:]
            padded = np.zeros((B, self.block), dtype=np.int64)
            padded[:, :context.shape[1]] = context
            last = Tensor([context.shape[1] - 1], device=self.device)  # a tensor index: one schedule for every L
            return self.window(Tensor(padded, device=self.device), last)
        if self.length is not None and L == self.length + 1:
            self.length = L
            return self.step(Tensor(ids[:, -1:], device=self.device), Tensor([L - 1], device=self.device))
        self.length = L
        return self._prefill(Tensor(ids, device=self.device))

    def extend(self, ids):
        """Logits (B, T, V), a NumPy array, at each of the T positions of ids (B, L) past the cache's `length`
        (1 <= T, L <= block_size): one forward over them against the cache, which then holds all of ids. The cache
        must hold ids' first `length` tokens (sync)."""
        from ..tensor import Tensor
        B, L = ids.shape
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
        from ..tensor import Tensor
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
        pad = self.block - T
        kv = [F.pad(t, (0, 0, 0, pad)) if pad else t.contiguous() for t in kv]
        bias = (self.slots < T).reshape(1, 1, self.block, 1).where(0.0, MASKED)  # the empty slots' score bias
        kv = [(factory.cat([t, bias.expand(*t.shape[:-1], 1)], -1) if i % 2 == 0 else t).to(cache.dtype)
              for i, (t, cache) in enumerate(zip(kv, self.caches))]
        realize(logits, *kv)
        assign(self.caches, kv)
        return logits

    def _step(self, tok, pos):
        """One token (B, 1) at position pos (1,) against the caches; writes its keys and values into slot pos of
        the caches, returns the logits. Two realizes: the forward, which reads the old caches and gives the logits
        and each layer's new rows, then the writes, `where`s over the caches assigned to them. As the last readers
        of the old caches, the writes may take over their memory: on the C runtime the replay writes the caches in
        place (a donation), and then runs the whole step as one chain of C calls (docs/architecture.md)."""
        from ..realizer import assign, realize
        model, tr = self.model, self.model.transformer
        x = tr.drop(tr.wte(tok) + tr.wpe(pos))
        rows = []
        for i, block in enumerate(tr.h):
            x, k, v = block.decode(x, self.caches[2 * i], self.caches[2 * i + 1])
            rows += [k, v]
        logits = model.lm_head(tr.ln_f(x))[:, -1, :]
        realize(logits, *rows)
        write = (self.slots == pos).reshape(1, 1, self.block, 1)  # the slot this position's key and value go to
        new = [write.where(row.to(cache.dtype), cache) for row, cache in zip(rows, self.caches)]
        realize(*new)
        assign(self.caches, new)
        return logits

    def _chunk(self, toks, pos):
        """T tokens (B, T) at positions pos…pos+T-1 against the caches (speculative decoding's verification): as
        _step, with the logits of every position (B, T, V); slot pos + t takes row t."""
        from ..realizer import assign, realize
        model, tr = self.model, self.model.transformer
        T = toks.shape[1]
        x = tr.drop(tr.wte(toks) + tr.wpe(pos + factory.arange(T, device=self.device)))
        rows = []
        for i, block in enumerate(tr.h):
            x, k, v = block.decode(x, self.caches[2 * i], self.caches[2 * i + 1])
            rows += [k, v]
        logits = model.lm_head(tr.ln_f(x))
        realize(logits, *rows)
        write = ((self.slots >= pos) & (self.slots < pos + T)).reshape(1, 1, self.block, 1)
        row = (self.slots - pos).maximum(0).minimum(T - 1)  # the row each slot would take
        new = [write.where(r[:, :, row].to(cache.dtype), cache) for r, cache in zip(rows, self.caches)]
        realize(*new)
        assign(self.caches, new)
        return logits

    def _cut(self, length):
        """Mark the slots from `length` on empty again: their keys' bias back to MASKED."""
        from ..realizer import assign
        keys = self.caches[0::2]
        hs1 = keys[0].shape[-1]
        stale = (self.slots >= length).reshape(1, 1, self.block, 1) \
            & (factory.arange(hs1, device=self.device) == hs1 - 1).reshape(1, 1, 1, hs1)
        assign(keys, [stale.where(MASKED, k) for k in keys])
