"""TransformerLens's HookedTransformer holding a tinyllm model's weights (no weight processing: no folded layer
norms, no centred unembedding), the reference the hook tests compare caches with, name by name."""
import numpy as np
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig


def _t(a):
    return torch.tensor(np.ascontiguousarray(a), dtype=torch.float32)


def _heads_in(w, heads):
    """A (heads · d_head, d_model) torch-layout weight as TransformerLens's (heads, d_model, d_head)."""
    d_model = w.shape[1]
    return w.T.reshape(d_model, heads, -1).transpose(1, 0, 2)


def hooked_gpt(model):
    """A HookedTransformer equal to a tinyllm GPT (nanoGPT's layout: c_attn holds q, k and v)."""
    c = model.config
    d_head = c.n_embd // c.n_head
    cfg = HookedTransformerConfig(n_layers=c.n_layer, d_model=c.n_embd, n_ctx=c.block_size, d_head=d_head,
                                  n_heads=c.n_head, d_mlp=4 * c.n_embd, d_vocab=c.vocab_size,
                                  act_fn={"exact": "gelu", "tanh": "gelu_new"}[c.gelu], normalization_type="LN",
                                  eps=1e-5, positional_embedding_type="standard", dtype=torch.float32)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    zero = np.zeros
    state = {"embed.W_E": sd["transformer.wte.weight"], "pos_embed.W_pos": sd["transformer.wpe.weight"],
             "ln_final.w": sd["transformer.ln_f.weight"],
             "ln_final.b": sd.get("transformer.ln_f.bias", zero(c.n_embd)),
             "unembed.W_U": sd["lm_head.weight"].T, "unembed.b_U": zero(c.vocab_size)}
    for l in range(c.n_layer):
        p, b = f"transformer.h.{l}.", f"blocks.{l}."
        bias = (lambda name, n: sd.get(p + name, zero(n)))
        w_qkv, b_qkv = sd[p + "attn.c_attn.weight"], bias("attn.c_attn.bias", 3 * c.n_embd)
        for i, m in enumerate("QKV"):
            state[b + f"attn.W_{m}"] = _heads_in(w_qkv[i * c.n_embd:(i + 1) * c.n_embd], c.n_head)
            state[b + f"attn.b_{m}"] = b_qkv[i * c.n_embd:(i + 1) * c.n_embd].reshape(c.n_head, d_head)
        state[b + "attn.W_O"] = sd[p + "attn.c_proj.weight"].T.reshape(c.n_head, d_head, c.n_embd)
        state[b + "attn.b_O"] = bias("attn.c_proj.bias", c.n_embd)
        for ln, ours in (("ln1", "ln_1"), ("ln2", "ln_2")):
            state[b + f"{ln}.w"] = sd[p + f"{ours}.weight"]
            state[b + f"{ln}.b"] = bias(f"{ours}.bias", c.n_embd)
        state[b + "mlp.W_in"] = sd[p + "mlp.c_fc.weight"].T
        state[b + "mlp.b_in"] = bias("mlp.c_fc.bias", 4 * c.n_embd)
        state[b + "mlp.W_out"] = sd[p + "mlp.c_proj.weight"].T
        state[b + "mlp.b_out"] = bias("mlp.c_proj.bias", c.n_embd)
    return _load(cfg, state)


def hooked_llama(model):
    """A HookedTransformer equal to a tinyllm Llama (Hugging Face's layout, rotate-half RoPE)."""
    c = model.config
    cfg = HookedTransformerConfig(n_layers=c.num_hidden_layers, d_model=c.hidden_size,
                                  n_ctx=c.max_position_embeddings, d_head=c.head_dim, n_heads=c.num_attention_heads,
                                  n_key_value_heads=c.num_key_value_heads, d_mlp=c.intermediate_size,
                                  d_vocab=c.vocab_size, act_fn="silu", normalization_type="RMS", eps=c.rms_norm_eps,
                                  positional_embedding_type="rotary", rotary_dim=c.head_dim,
                                  rotary_base=c.rope_theta, rotary_adjacent_pairs=c.rope_interleaved,
                                  gated_mlp=True, final_rms=True, dtype=torch.float32)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    state = {"embed.W_E": sd["model.embed_tokens.weight"], "ln_final.w": sd["model.norm.weight"],
             "unembed.W_U": sd["lm_head.weight"].T, "unembed.b_U": np.zeros(c.vocab_size)}
    for l in range(c.num_hidden_layers):
        p, b = f"model.layers.{l}.", f"blocks.{l}."
        state[b + "attn.W_Q"] = _heads_in(sd[p + "self_attn.q_proj.weight"], c.num_attention_heads)
        state[b + "attn._W_K"] = _heads_in(sd[p + "self_attn.k_proj.weight"], c.num_key_value_heads)
        state[b + "attn._W_V"] = _heads_in(sd[p + "self_attn.v_proj.weight"], c.num_key_value_heads)
        state[b + "attn.W_O"] = sd[p + "self_attn.o_proj.weight"].T.reshape(c.num_attention_heads, c.head_dim, -1)
        state[b + "ln1.w"] = sd[p + "input_layernorm.weight"]
        state[b + "ln2.w"] = sd[p + "post_attention_layernorm.weight"]
        state[b + "mlp.W_gate"] = sd[p + "mlp.gate_proj.weight"].T
        state[b + "mlp.W_in"] = sd[p + "mlp.up_proj.weight"].T
        state[b + "mlp.W_out"] = sd[p + "mlp.down_proj.weight"].T
    return _load(cfg, state)


def _load(cfg, state):
    tl_model = HookedTransformer(cfg)
    full = tl_model.state_dict()
    for k, v in state.items():
        assert full[k].shape == tuple(v.shape), (k, full[k].shape, v.shape)
        full[k] = _t(v)
    # biases this architecture has but tinyllm's does not (Llama's attention and MLP) stay zero
    for k in full:
        if k not in state and (".b_" in k or "._b_" in k or k.endswith(".b")):
            full[k] = torch.zeros_like(full[k])
    tl_model.load_state_dict(full)
    return tl_model.eval()
