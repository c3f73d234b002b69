"""`tinyllm.checkpoint(fn, *args)`: gradient checkpointing, with torch.utils.checkpoint's call signature.

The region fn(*args) runs as usual; its inputs and outputs are marked, and the checkpoint pass
(rewrite/checkpoint.py) makes the backward pass recompute the values inside it instead of keeping them from
the forward pass. The gradients are exactly those of fn(*args) unmarked: only memory and time change.
"""
from ..graph import build
from ..rewrite.checkpoint import POLICIES
from ..tensor import Tensor, is_grad_enabled

_depth = [0]  # regions open right now: a region inside a region adds nothing (the outer one recomputes it all)


def _mark(x, role, policy):
    if not isinstance(x, Tensor):
        return x
    return Tensor._from_node(build("CHECKPOINT", x.node, arg=(role, policy)), x.device,
                             leaf=not x.requires_grad)._mark(x.requires_grad)


def checkpoint(fn, *args, policy="nothing_saveable", **kwargs):
    """fn(*args, **kwargs), with the values inside it recomputed in the backward pass rather than kept.
    policy: what is kept after all, by name: "nothing_saveable" (recompute everything from the inputs) or
    "dots_saveable" (keep matmul outputs, recompute the cheap ops around them). Tensors in `args` are the
    region's inputs; fn may return a tensor or a tuple or list of them. Under no_grad it just calls fn."""
    if policy not in POLICIES:
        raise ValueError(f"checkpoint: unknown policy {policy!r}: use one of {', '.join(POLICIES)}")
    if not is_grad_enabled() or _depth[0]:
        return fn(*args, **kwargs)
    _depth[0] += 1
    try:
        out = fn(*(_mark(a, "enter", policy) for a in args), **kwargs)
    finally:
        _depth[0] -= 1
    if isinstance(out, (tuple, list)):
        return type(out)(_mark(o, "exit", policy) for o in out)
    return _mark(out, "exit", policy)
