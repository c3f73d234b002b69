"""The marker of gradient checkpointing: an identity that tells the checkpoint pass (rewrite/checkpoint.py) where a
region starts and ends, and keeps a recomputed copy of a region apart from the original (equal nodes are one node)."""
from .base import Identity, register

ROLES = ("enter", "exit", "recompute")  # a region's input, its output, the input of its recomputed copy


@register
class CHECKPOINT(Identity):
    """y = x, marked: `arg` is (role, policy name) with role one of ROLES  ⇒  dx = dy"""
    def infer(src, arg):
        (x,) = src
        if not (isinstance(arg, tuple) and len(arg) == 2 and arg[0] in ROLES):
            raise ValueError(f"arg {arg!r} must be (role, policy) with role one of {ROLES}")
        return x.shape, x.dtype
    def forward(x, arg): return x
    def backward(dy, y): return (dy,)
