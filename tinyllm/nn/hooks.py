"""Hook points with TransformerLens's names, as edits of the lazy graph.

A model's forward passes each activation TransformerLens hooks through `point(module, "hook_resid_pre", x)`; the
module's `hook_prefix` ("blocks.3", "blocks.3.attn", "" for the model itself, set by tinyllm/models/hooks.py) makes
the full name, "blocks.3.hook_resid_pre". Outside a hook session (`session(...)`, which run_with_hooks and
run_with_cache open) a point returns x itself: no node is added, and the graph is the one the model always builds.
Inside, a point is a graph edit made while the graph is still being built, before fusion and FlashAttention:
- a capture keeps the node, detached, as one more output of the realize (the rest of the graph is unchanged);
- a hook function's replacement is substituted for the node: everything downstream reads the replacement.
So a read-only hook leaves the logits' graph, and the logits, exactly as they were, and a point costs only what is
kept at it. The attention probabilities are the one activation the fused graph never holds (FlashAttention
computes them block by block): asking for them adds the plain scores and softmax beside the fused attention, which
stays unless a hook replaces them.
"""
import contextlib
import contextvars
import re

from ..tensor import Tensor
from . import functional as F

_session = contextvars.ContextVar("tinyllm_hook_session", default=None)
_LAYER = re.compile(r"^blocks\.(\d+)\.")


class HookPoint:
    """What a hook function receives as `hook`, as TransformerLens's: `hook.name` and `hook.layer()`."""

    def __init__(self, name):
        self.name = name

    def layer(self):
        """The block index of a point under blocks.{l}; a ValueError for the embedding and final points."""
        match = _LAYER.match(self.name)
        if match is None:
            raise ValueError(f"HookPoint {self.name!r} is not in a block, so it has no layer")
        return int(match.group(1))

    def __repr__(self):
        return f"HookPoint({self.name!r})"


class Session:
    """The hooks and captures of one run: `hooks` {name: [fn(activation, hook) -> replacement or None]}, `capture`
    a set of names, `cache` {name: detached activation}, filled in the order the points fire."""

    def __init__(self, hooks, capture):
        self.hooks, self.capture, self.cache = hooks, capture, {}

    def wants(self, name):
        return name in self.hooks or name in self.capture

    def apply(self, name, x):
        for fn in self.hooks.get(name, ()):
            out = fn(x, HookPoint(name))
            if out is not None:
                check_replacement(name, x, out)
                x = out
        if name in self.capture:
            self.cache[name] = x.detach()
        return x


@contextlib.contextmanager
def session(hooks=None, capture=()):
    """Hooks and captures active for the forwards run inside; nothing of them is left after it."""
    s = Session({name: list(fns) for name, fns in (hooks or {}).items()}, set(capture))
    token = _session.set(s)
    try:
        yield s
    finally:
        _session.reset(token)


def check_replacement(name, x, out):
    """A hook's replacement must be able to stand for the activation: a Tensor of its shape, dtype and device."""
    what = f"the hook function at {name}"
    if not isinstance(out, Tensor):
        raise TypeError(f"{what} returned a {type(out).__name__}: return a tinyllm Tensor of shape {x.shape} "
                        "(the replacement) or None (to leave the activation as it is)")
    if out.shape != x.shape:
        raise ValueError(f"{what} returned shape {out.shape}, but the activation has shape {x.shape}: a replacement "
                         "must have the activation's shape")
    if out.dtype is not x.dtype:
        raise TypeError(f"{what} returned {out.dtype.name}, but the activation is {x.dtype.name}: cast it, "
                        f"e.g. .to(tinyllm.{x.dtype.name})")
    if out.device != x.device:
        raise ValueError(f"{what} returned a tensor on {out.device}, but the activation is on {x.device}: "
                         f"move it with .to({x.device!r})")


def _name(module, local):
    prefix = getattr(module, "hook_prefix", None)
    if prefix is None:  # a module outside a hooked model: it has no points
        return None
    return f"{prefix}.{local}" if prefix else local


def wants(module, *locals_):
    """Whether the running session hooks or captures any of `module`'s points `locals_`."""
    s = _session.get()
    return s is not None and any(s.wants(_name(module, n)) for n in locals_ if _name(module, n))


def point(module, local, x):
    """x at `module`'s point `local`: x itself, or what the session's hooks replaced it with (captured if asked)."""
    s = _session.get()
    if s is None:
        return x
    name = _name(module, local)
    return s.apply(name, x) if name is not None and s.wants(name) else x


def point_heads(module, local, x):
    """point() for per-head activations held as (B, H, T, d): TransformerLens's layout is (B, T, H, d)."""
    if not wants(module, local):
        return x
    t = x.transpose(1, 2)
    out = point(module, local, t)
    return x if out is t else out.transpose(1, 2)


def point_expanded(module, local, x, shape):
    """point() for an activation broadcast over the batch, as the position embedding (T, d): TransformerLens's
    is expanded to (B, T, d)."""
    if not wants(module, local):
        return x
    e = x.expand(*shape)
    out = point(module, local, e)
    return x if out is e else out


# ---- the points inside functions: norms and attention ----
def layer_norm(module, x):
    """nn.LayerNorm's forward with hook_scale √(var + eps) (B, T, 1) and hook_normalized (x − mean) / scale, before
    the weight and bias: F.layer_norm's own graph unless a hook replaces one of them."""
    return _norm(module, x, centre=True, shift=module.bias)


def rms_norm(module, x):
    """nn.RMSNorm's forward with hook_scale √(mean x² + eps) and hook_normalized x / scale, before the weight."""
    return _norm(module, x, centre=False, shift=None)


def _norm(module, x, centre, shift):
    eps = module.eps
    low = x.dtype.is_low
    xf = x.float() if low else x
    if not centre and eps is None:  # rms_norm's default: the machine epsilon of the dtype it computes in
        from .. import dtype as dt
        eps = dt.finfo(xf.dtype).eps
    dims = tuple(range(x.ndim - len(module.normalized_shape), x.ndim))
    centred = xf - xf.mean(dims, keepdim=True) if centre else xf
    var_eps = ((centred * centred).mean(dims, keepdim=True) + eps) if centre else \
        (xf * xf).mean(dims, keepdim=True).add(eps)
    scale = var_eps.sqrt()
    new_scale = point(module, "hook_scale", scale)
    y = centred * var_eps.rsqrt() if new_scale is scale else centred / new_scale
    if not centre and low:  # rms_norm rounds to x's dtype before its weight (Hugging Face's LlamaRMSNorm)
        y = y.to(x.dtype)
    y = point(module, "hook_normalized", y)
    weight = module.weight
    if centre and low:  # layer_norm applies weight and bias in float32 and rounds once
        weight, shift = (None if v is None else v.float() for v in (weight, shift))
    if weight is not None:
        y = y * weight
    if shift is not None:
        y = y + shift
    return y.to(x.dtype) if centre and low else y


def attention(module, q, k, v, dropout_p=0.0):
    """Causal attention of q (B, H, T, d) over k, v (B, Hkv, T, d) with the points hook_attn_scores (the scaled
    scores, -inf where masked, (B, H, T, T)) and hook_pattern (their softmax). Unless a hook replaces one of them,
    the output is F.scaled_dot_product_attention's (the FlashAttention rewrite still applies) and the two are extra
    outputs computed beside it."""
    gqa = k.shape[1] != q.shape[1]
    if not wants(module, "hook_attn_scores", "hook_pattern"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p, enable_gqa=gqa)
    kx, vx = k, v
    if gqa:  # query head h reads key/value head h // g
        B, Hkv, T, _ = k.shape
        g = q.shape[1] // Hkv
        kx, vx = (t.unsqueeze(2).expand(B, Hkv, g, T, t.shape[-1]).reshape(B, Hkv * g, T, t.shape[-1]) for t in (k, v))
    scores = F.attention_scores(q, kx, is_causal=True)
    new_scores = point(module, "hook_attn_scores", scores)
    pattern = new_scores.softmax(-1)
    new_pattern = point(module, "hook_pattern", pattern)
    if new_scores is scores and new_pattern is pattern:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p, enable_gqa=gqa)
    return (F.dropout(new_pattern, dropout_p) if dropout_p else new_pattern) @ vx
