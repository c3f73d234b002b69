"""A GPT in nanoGPT's shape and with its parameter names, so its weights load into (and from) nanoGPT."""
import math
from dataclasses import dataclass

import numpy as np

from .. import factory, nn
from ..nn import functional as F
from ..utils.checkpoint import checkpoint
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


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        if config.n_embd % config.n_head:
            raise ValueError(f"GPTConfig: n_embd {config.n_embd} must be divisible by n_head {config.n_head}")
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        # GPT-2's GELU is the tanh approximation ("gelu_new"); it is also far cheaper than erf on NumPy.
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, config):
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


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

    def _features(self, idx):
        """The last layer norm's output at every position of idx (B, T)."""
        B, T = idx.shape
        if T > self.config.block_size:
            raise ValueError(f"GPT: sequence of length {T} is longer than block_size {self.config.block_size}")
        pos = factory.arange(T, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = checkpoint(block, x) if self.config.checkpoint and self.training else block(x)
        return self.transformer.ln_f(x)

    def configure_optimizers(self, weight_decay, learning_rate, betas=(0.9, 0.95)):
        """AdamW with decay on 2-D weights only (matmuls and embeddings), as nanoGPT groups them."""
        from ..optim import AdamW
        params = self.parameters()
        decay = [p for p in params if p.ndim >= 2]
        no_decay = [p for p in params if p.ndim < 2]
        return AdamW([{"params": decay, "weight_decay": weight_decay},
                      {"params": no_decay, "weight_decay": 0.0}], lr=learning_rate, betas=betas)

    @no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Extend idx (B, T) by max_new_tokens sampled tokens, feeding each prediction back in. Every step runs
        the model on a full block, the context padded on the right: causal attention keeps the padding out of
        the last real position's logits, and one shape means one cached schedule and one set of compiled kernels
        for the whole generation instead of one per context length."""
        from ..replay.jit import jit
        from ..tensor import Tensor
        ids, block, device = idx.numpy(), self.config.block_size, idx.device

        def last_logits(padded, last):
            return self.lm_head(self._features(padded)[:, last])[:, -1, :]
        if not self.training or self.config.dropout == 0:  # dropout's masks come from the host: no replay
            last_logits = jit(last_logits)  # from the fourth token on, the forward's recorded kernels replay
        for _ in range(max_new_tokens):
            context = ids[:, -block:]
            padded = np.zeros((ids.shape[0], block), dtype=np.int64)
            padded[:, :context.shape[1]] = context
            last = Tensor([context.shape[1] - 1], device=device)  # a tensor index: the schedule does not change with it
            logits = last_logits(Tensor(padded, device=device), last) / max(temperature, 1e-8)
            if top_k is not None:
                v, _ = logits.topk(min(top_k, logits.shape[-1]))
                logits = logits.masked_fill(logits < v[:, -1:], float("-inf"))
            nxt = factory.multinomial(logits.softmax(-1), num_samples=1)
            ids = np.concatenate([ids, nxt.numpy()], axis=1)
        return Tensor(ids, device=device)
