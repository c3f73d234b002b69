"""A GPT in nanoGPT's shape and with its parameter names, so its weights load into (and from) nanoGPT."""
import math
import numbers
import os
from dataclasses import dataclass

import numpy as np

from .. import factory, nn
from ..nn import functional as F
from ..nn.hooks import attention, point, point_expanded, point_heads
from ..utils.checkpoint import checkpoint
from ..utils.checks import whole_number
from .generation import GenerationMixin
from .kv_cache import attend_cached, decode_layers, positions
from .hooks import HookedMixin
from .pretrained import PreTrainedModel


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
        check_config("GPTConfig", self, ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"), "dropout")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_embd {self.n_embd} must be divisible by n_head {self.n_head}")
        if self.gelu not in GELU_FORMS:
            raise ValueError(f"GPTConfig: gelu must be one of {sorted(GELU_FORMS)} (\"exact\" is nanoGPT's erf GELU, "
                             f"\"tanh\" GPT-2's approximation), got {self.gelu!r}")


GELU_FORMS = {"exact": "none", "tanh": "tanh"}  # GPTConfig.gelu -> F.gelu's approximate=


def check_config(name, config, sizes, dropout):
    """A clear ValueError, naming the config and the field, for a size that is not a positive int or a dropout
    probability outside [0, 1): nothing would build, or the model would be silently wrong (n_layer=-1 has no
    layers). The fields' relations (heads dividing widths) are each config's own."""
    for field in sizes:
        whole_number(name, field, getattr(config, field), 1)
    p = getattr(config, dropout)
    if not isinstance(p, numbers.Real) or not 0.0 <= p < 1.0:
        raise ValueError(f"{name}: {dropout} must be a probability in [0, 1), got {p!r}")


class CausalSelfAttention(nn.Module):
    hook_points = ("hook_q", "hook_k", "hook_v", "hook_attn_scores", "hook_pattern", "hook_z")

    def __init__(self, config):
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout

    def _qkv(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        return (point_heads(self, name, t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2))  # (B, nh, T, hs)
                for name, t in (("hook_q", q), ("hook_k", k), ("hook_v", v)))

    def _out(self, y):
        B, _, T, _ = y.shape
        z = point(self, "hook_z", y.transpose(1, 2))  # (B, T, nh, hs)
        return self.resid_dropout(self.c_proj(z.reshape(B, T, self.n_embd)))

    def forward(self, x, cache=None):
        """With `cache` (a list to append to): also the keys and values of x's positions (B, nh, T, hs)."""
        q, k, v = self._qkv(x)
        if cache is not None:
            cache.extend((k, v))
        return self._out(attention(self, q, k, v, dropout_p=self.dropout if self.training else 0.0))

    def decode(self, x, k_cache, v_cache):
        """x (B, T, C) at the T positions after the cache's (kv_cache.attend_cached): y and x's cache rows."""
        y, k, v = attend_cached(*self._qkv(x), k_cache, v_cache)
        return self._out(y), k, v


class MLP(nn.Module):
    hook_points = ("hook_pre", "hook_post")

    def __init__(self, config):
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)
        self.approximate = GELU_FORMS[config.gelu]

    def forward(self, x):
        pre = point(self, "hook_pre", self.c_fc(x))
        return self.dropout(self.c_proj(point(self, "hook_post", F.gelu(pre, approximate=self.approximate))))


class Block(nn.Module):
    hook_points = ("hook_resid_pre", "hook_attn_out", "hook_resid_mid", "hook_mlp_out", "hook_resid_post")

    def __init__(self, config):
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, cache=None):
        x = point(self, "hook_resid_pre", x)
        x = point(self, "hook_resid_mid", x + point(self, "hook_attn_out", self.attn(self.ln_1(x), cache)))
        return point(self, "hook_resid_post", x + point(self, "hook_mlp_out", self.mlp(self.ln_2(x))))

    def decode(self, x, k_cache, v_cache):
        y, k, v = self.attn.decode(self.ln_1(x), k_cache, v_cache)
        x = x + y
        return x + self.mlp(self.ln_2(x)), k, v


class GPT(PreTrainedModel, GenerationMixin, HookedMixin, nn.Module):
    """nanoGPT's GPT. Weights come from a checkpoint directory, `GPT.from_pretrained(dir)` (examples/gpt.py's
    --ckpt-dir, or `model.save_pretrained(dir)`'s: tinyllm/models/pretrained.py), or from nanoGPT's ckpt.pt,
    `GPT.from_nanogpt_checkpoint(path)`. (nanoGPT's own `GPT.from_pretrained('gpt2')` downloads Hugging Face's
    GPT-2 weights; tinyllm's reads local directories only and downloads nothing.)"""
    model_type, config_class = "gpt", GPTConfig
    _pretrained_hint = ("; nanoGPT's ckpt.pt loads with GPT.from_nanogpt_checkpoint(path) (nanoGPT's "
                        "GPT.from_pretrained('gpt2') downloads GPT-2's weights, which tinyllm does not)")
    # Megatron's tensor-parallel split, by module name as HF's base_model_tp_plan (tinyllm.distributed.tensor_parallel
    # applies it): name pattern -> (style, groups). c_attn's columns hold q, k and v: a rank takes its heads of each.
    tp_plan = {"transformer.h.*.attn.c_attn": ("colwise", 3), "transformer.h.*.attn.c_proj": ("rowwise", 1),
               "transformer.h.*.mlp.c_fc": ("colwise", 1), "transformer.h.*.mlp.c_proj": ("rowwise", 1)}

    def get_num_params(self, non_embedding=True):
        """The parameter count, as nanoGPT's: non_embedding leaves out the position embeddings (the token
        embeddings count, since lm_head shares them)."""
        n = self.num_parameters()
        return n - self.transformer.wpe.weight.numel() if non_embedding else n

    def tp_split_sizes(self):
        """{what: size} that the ranks of a tensor-parallel split share equally."""
        return {"n_head": self.config.n_head, "4 * n_embd (the MLP's width)": 4 * self.config.n_embd}

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
        self._name_hook_points()

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
        self._check_forward(idx, targets)
        x = self._features(idx)
        if targets is None:
            return self._unembed(x[:, -1:, :]), None  # inference: only the last position is needed
        logits = self._unembed(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    def _features(self, idx, cache=None):
        """The last layer norm's output at every position of idx (B, T). With `cache` (a list), each layer's keys
        and values (B, nh, T, hs) are appended to it."""
        pos = self.transformer.wpe(factory.arange(idx.shape[1], device=idx.device))
        tok = point(self, "hook_embed", self.transformer.wte(idx))
        x = self.transformer.drop(tok + point_expanded(self, "hook_pos_embed", pos, tok.shape))
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
        if not os.path.isfile(path):
            raise FileNotFoundError(f"GPT.from_nanogpt_checkpoint: no file {path!s} (nanoGPT writes out_dir/ckpt.pt)")
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

    def configure_optimizers(self, weight_decay, learning_rate, betas=(0.9, 0.95), device_type=None):
        """AdamW with decay on 2-D weights only (matmuls and embeddings), as nanoGPT groups them; frozen parameters
        (requires_grad False: a LoRA model's base) are left out, as nanoGPT does. device_type is nanoGPT's
        signature (there it picks torch's fused AdamW); tinyllm's AdamW is one graph on any device."""
        from ..optim import AdamW
        params = [p for p in self.parameters() if p.requires_grad]
        decay = [p for p in params if p.ndim >= 2]
        no_decay = [p for p in params if p.ndim < 2]
        return AdamW([{"params": decay, "weight_decay": weight_decay},
                      {"params": no_decay, "weight_decay": 0.0}], lr=learning_rate, betas=betas)

    # ---- TransformerLens's hook points (tinyllm/models/hooks.py) ----
    hook_points = ("hook_embed", "hook_pos_embed", "unembed.hook_in", "unembed.hook_out")

    def _hook_modules(self):
        yield "", self
        for l, block in enumerate(self.transformer.h):
            yield from ((f"blocks.{l}", block), (f"blocks.{l}.ln1", block.ln_1), (f"blocks.{l}.attn", block.attn),
                        (f"blocks.{l}.ln2", block.ln_2), (f"blocks.{l}.mlp", block.mlp))
        yield "ln_final", self.transformer.ln_f

    # ---- generation's hooks (tinyllm/models/generation.py) ----
    max_positions_field = "block_size"

    def get_input_embeddings(self):
        return self.transformer.wte

    def _cache_shapes(self, batch):
        cfg = self.config
        hs = cfg.n_embd // cfg.n_head
        return [(batch, cfg.n_head, cfg.block_size, hs + extra) for _ in range(cfg.n_layer) for extra in (1, 0)]

    def _decode_features(self, toks, pos, caches):
        tr = self.transformer
        x = tr.drop(tr.wte(toks) + tr.wpe(positions(pos, toks.shape[1], toks.device)))
        x, rows = decode_layers(tr.h, x, caches)
        return tr.ln_f(x), rows
