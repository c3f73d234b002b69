"""A Llama in Hugging Face's shape and with its parameter names (LlamaForCausalLM), so its state dicts load both ways.

A pre-norm decoder as GPT's, with the changes Llama made (Touvron et al. 2023):
    RMSNorm for LayerNorm           x / √(mean x² + eps) · w: no centring, no bias
    rotary position embeddings      q and k rotated by their positions (nn.RotaryEmbedding), no position table
    SwiGLU for GELU                 down(silu(gate(x)) · up(x)) (nn.SwiGLU)
    grouped-query attention         num_key_value_heads ≤ num_attention_heads: a group of query heads shares
                                    one key/value head (smaller caches)
and no biases. `generate` is GPT's (tinyllm/models/generation.py): the same cache, samplers and speculative
decoding; the cache holds keys already rotated, so a decode step rotates only its own q and k.
"""
from dataclasses import dataclass, fields

import numpy as np

from .. import factory, nn
from ..nn import functional as F
from ..nn.hooks import attention, point, point_heads
from ..utils.checkpoint import checkpoint
from .generation import GenerationMixin
from .kv_cache import attend_cached, decode_layers, positions
from .gpt import GPT, Block, check_config
from .hooks import HookedMixin
from .pretrained import PreTrainedModel


@dataclass
class LlamaConfig:
    """Hugging Face's LlamaConfig fields (and defaults), plus tinyllm's own: rope_interleaved (Meta's pair layout
    instead of HF's rotate-half) and checkpoint (recompute each layer in the backward pass)."""
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = None  # None: num_attention_heads (no grouping)
    head_dim: int = None  # None: hidden_size // num_attention_heads
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_interleaved: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    attention_dropout: float = 0.0
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02
    checkpoint: bool = False

    def __post_init__(self):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        sizes = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "max_position_embeddings")
        check_config("LlamaConfig", self, sizes + (("head_dim",) if self.head_dim is not None else ()),
                     "attention_dropout")
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(f"LlamaConfig: hidden_size {self.hidden_size} must be divisible by "
                                 f"num_attention_heads {self.num_attention_heads} (or give head_dim)")
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"LlamaConfig: num_key_value_heads {self.num_key_value_heads} must divide "
                             f"num_attention_heads {self.num_attention_heads} (each kv head serves a group)")
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig: head_dim {self.head_dim} must be even (rotary embeddings turn pairs)")

    @classmethod
    def from_hf(cls, hf_config):
        """The config of a transformers.LlamaConfig (or its to_dict()): the fields both have. A rope scaling other
        than the default (Llama 3's "llama3", "yarn", …) is refused: tinyllm computes plain RoPE."""
        d = hf_config if isinstance(hf_config, dict) else hf_config.to_dict()
        kind = d.get("model_type", "llama")
        if kind not in ("llama", "mistral"):  # another family's fields: taking the common ones would be silently wrong
            raise ValueError(f"LlamaConfig.from_hf: a {kind!r} config, not a Llama's (model_type 'llama'): "
                             + ("tinyllm.models.GPT holds GPT-2's layers (GPT.from_nanogpt_checkpoint for nanoGPT's)"
                                if kind == "gpt2" else "tinyllm has no model of that family"))
        if d.get("sliding_window") is not None:
            raise NotImplementedError(f"LlamaConfig.from_hf: sliding_window={d['sliding_window']}: tinyllm's "
                                      "attention is over the whole context, so its logits would differ")
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind != "default":
            raise NotImplementedError(f"LlamaConfig.from_hf: rope_type {kind!r} is not supported, only the default "
                                      "rotary embedding")
        if d.get("hidden_act", "silu") != "silu":
            raise NotImplementedError(f"LlamaConfig.from_hf: hidden_act {d['hidden_act']!r}: only silu (SwiGLU)")
        theta = rope.get("rope_theta", d.get("rope_theta", cls.rope_theta))
        own = {f.name for f in fields(cls)} - {"rope_theta", "rope_interleaved", "checkpoint"}
        return cls(**{k: v for k, v in d.items() if k in own and v is not None}, rope_theta=float(theta))


class LlamaAttention(nn.Module):
    hook_points = ("hook_q", "hook_k", "hook_v", "hook_rot_q", "hook_rot_k", "hook_attn_scores", "hook_pattern",
                   "hook_z")  # TransformerLens's: q and k before and after the rotation

    def __init__(self, config):
        c = config
        self.n_head, self.n_kv_head, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * c.head_dim, bias=c.attention_bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=c.attention_bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * c.head_dim, bias=c.attention_bias)
        self.o_proj = nn.Linear(c.num_attention_heads * c.head_dim, c.hidden_size, bias=c.attention_bias)
        self.interleaved, self.dropout = c.rope_interleaved, c.attention_dropout

    def _qkv(self, x, cos, sin):
        """q (B, H, T, hd) and k, v (B, H_kv, T, hd), q and k rotated to their positions."""
        B, T, _ = x.shape
        q, k, v = (point_heads(self, name, proj(x).view(B, T, heads, self.head_dim).transpose(1, 2))
                   for name, proj, heads in (("hook_q", self.q_proj, self.n_head), ("hook_k", self.k_proj, self.n_kv_head),
                                             ("hook_v", self.v_proj, self.n_kv_head)))
        q, k = (point_heads(self, name, F.apply_rotary_pos_emb(t, cos, sin, self.interleaved))
                for name, t in (("hook_rot_q", q), ("hook_rot_k", k)))
        return q, k, v

    def _out(self, y):
        B, _, T, _ = y.shape
        z = point(self, "hook_z", y.transpose(1, 2))  # (B, T, H, hd)
        return self.o_proj(z.reshape(B, T, self.n_head * self.head_dim))

    def forward(self, x, cos, sin, cache=None):
        """With `cache` (a list to append to): also the keys and values of x's positions (B, H_kv, T, hd)."""
        q, k, v = self._qkv(x, cos, sin)
        if cache is not None:
            cache.extend((k, v))
        return self._out(attention(self, q, k, v, dropout_p=self.dropout if self.training else 0.0))

    def decode(self, x, cos, sin, k_cache, v_cache):
        """x (B, T, C) at the T positions after the cache's (kv_cache.attend_cached): y and x's cache rows."""
        y, k, v = attend_cached(*self._qkv(x, cos, sin), k_cache, v_cache)
        return self._out(y), k, v


class LlamaDecoderLayer(nn.Module):
    hook_points = Block.hook_points

    def __init__(self, config):  # in HF's order, so state dicts list the same keys in the same order
        self.self_attn = LlamaAttention(config)
        self.mlp = nn.SwiGLU(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, x, cos, sin, cache=None):
        x = point(self, "hook_resid_pre", x)
        attn_out = point(self, "hook_attn_out", self.self_attn(self.input_layernorm(x), cos, sin, cache))
        x = point(self, "hook_resid_mid", x + attn_out)
        mlp_out = point(self, "hook_mlp_out", self.mlp(self.post_attention_layernorm(x)))
        return point(self, "hook_resid_post", x + mlp_out)

    def decode(self, x, cos, sin, k_cache, v_cache):
        y, k, v = self.self_attn.decode(self.input_layernorm(x), cos, sin, k_cache, v_cache)
        x = x + y
        return x + self.mlp(self.post_attention_layernorm(x)), k, v


class LlamaModel(nn.Module):
    """The decoder stack (HF's LlamaModel): embed_tokens, layers, norm; the rotary tables are not parameters."""

    def __init__(self, config):
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = nn.RotaryEmbedding(config.head_dim, config.max_position_embeddings, config.rope_theta,
                                             interleaved=config.rope_interleaved)


class Llama(PreTrainedModel, GenerationMixin, HookedMixin, nn.Module):
    """Hugging Face's LlamaForCausalLM: `model` (LlamaModel) and `lm_head`, tied to model.embed_tokens when
    config.tie_word_embeddings. model(idx) gives the logits at every position (B, T, V), as HF's;
    model(idx, targets) also the mean cross-entropy against targets (B, T) (the next tokens: unlike HF's
    `labels`, not shifted here, as GPT's), positions whose target is -100 left out. `Llama.from_pretrained(dir)`
    loads a tinyllm checkpoint directory (examples/gpt.py --model llama, or save_pretrained's); a transformers
    model converts with `Llama.from_hf(hf_model)`."""
    model_type, config_class = "llama", LlamaConfig
    _pretrained_hint = "; a Hugging Face LlamaForCausalLM converts with Llama.from_hf(hf_model)"

    # Megatron's tensor-parallel split (tinyllm.distributed.tensor_parallel applies it), HF's base_model_tp_plan
    tp_plan = {"model.layers.*.self_attn.q_proj": ("colwise", 1), "model.layers.*.self_attn.k_proj": ("colwise", 1),
               "model.layers.*.self_attn.v_proj": ("colwise", 1), "model.layers.*.self_attn.o_proj": ("rowwise", 1),
               "model.layers.*.mlp.gate_proj": ("colwise", 1), "model.layers.*.mlp.up_proj": ("colwise", 1),
               "model.layers.*.mlp.down_proj": ("rowwise", 1)}

    def tp_split_sizes(self):
        """{what: size} that the ranks of a tensor-parallel split share equally."""
        c = self.config
        return {"num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
                "intermediate_size": c.intermediate_size}

    def __init__(self, config):
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self._init_weights()
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self._name_hook_points()

    def _init_weights(self):
        """HF's init: N(0, initializer_range) for the embedding and every projection, 1 for the norms' weights,
        0 for biases."""
        rng = factory.generator()
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                value = np.zeros(p.shape, np.float32)
            elif name.endswith("norm.weight"):
                value = np.ones(p.shape, np.float32)
            else:
                value = rng.normal(0.0, self.config.initializer_range, size=p.shape).astype(np.float32)
            p.copy_(value)

    def forward(self, idx, targets=None):
        self._check_forward(idx, targets)
        logits = self._unembed(self._features(idx))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
        return logits, loss

    def _features(self, idx, cache=None):
        """The final norm's output at every position of idx (B, T); with `cache` (a list), each layer's keys and
        values (B, H_kv, T, hd), keys rotated, are appended to it."""
        cos, sin = self.model.rotary_emb(factory.arange(idx.shape[1], device=idx.device))
        x = point(self, "hook_embed", self.model.embed_tokens(idx))
        for layer in self.model.layers:
            if self.config.checkpoint and self.training and cache is None:
                x = checkpoint(layer, x, cos, sin)
            else:
                x = layer(x, cos, sin, cache)
        return self.model.norm(x)

    @classmethod
    def from_hf(cls, hf_model, device=None):
        """A Llama with the config and weights of a transformers LlamaForCausalLM (torch is read here, not
        imported: the weights come through .detach().numpy())."""
        model = cls(LlamaConfig.from_hf(hf_model.config))
        model.load_state_dict({k: v.detach().float().cpu().numpy() for k, v in hf_model.state_dict().items()})
        return model.to(device=device) if device is not None else model

    configure_optimizers = GPT.configure_optimizers  # AdamW, decay on the 2-D weights only

    # ---- TransformerLens's hook points (tinyllm/models/hooks.py) ----
    hook_points = ("hook_embed", "unembed.hook_in", "unembed.hook_out")

    def _hook_modules(self):
        yield "", self
        for l, layer in enumerate(self.model.layers):
            yield from ((f"blocks.{l}", layer), (f"blocks.{l}.ln1", layer.input_layernorm),
                        (f"blocks.{l}.attn", layer.self_attn), (f"blocks.{l}.ln2", layer.post_attention_layernorm),
                        (f"blocks.{l}.mlp", layer.mlp))
        yield "ln_final", self.model.norm

    # ---- generation's hooks (tinyllm/models/generation.py) ----
    max_positions_field = "max_position_embeddings"

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def _cache_shapes(self, batch):
        c = self.config
        return [(batch, c.num_key_value_heads, c.max_position_embeddings, c.head_dim + extra)
                for _ in range(c.num_hidden_layers) for extra in (1, 0)]

    def _decode_features(self, toks, pos, caches):
        cos, sin = self.model.rotary_emb(positions(pos, toks.shape[1], toks.device))
        x, rows = decode_layers(self.model.layers, self.model.embed_tokens(toks), caches, cos, sin)
        return self.model.norm(x), rows
