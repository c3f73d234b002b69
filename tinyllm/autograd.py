"""The gradient walker: gradients are more graph, built from each primitive's rule in `tinyllm.ops`, in one walk
in reverse topological order (broadcasting is undone by EXPAND's rule alone: docs/architecture.md).

Some rewrites must see the graph before the walk, because they change what the backward graph keeps
(FlashAttention's node recomputes the scores in its own rule). Autograd knows none of them: it runs the hooks
registered with `register_prepare_hook` (the pipeline's differentiate stage, tinyllm/rewrite/pipeline.py).
"""
from .graph import toposort
from .ops import rule_of

_prepare_hooks = []


def register_prepare_hook(fn):
    """fn(root) -> root's graph rewritten for differentiation (the same node when nothing applies)."""
    _prepare_hooks.append(fn)


def prepare(root):
    """`root`'s graph after the prepare hooks. Tensor.backward computes the loss through it, or the forward runs
    twice."""
    for hook in _prepare_hooks:
        root = hook(root)
    return root


def walk(root):
    """The nodes gradients() walks from `root` (already prepared), sources first: the walk stops at DETACH."""
    return toposort([root], stop=_detached)


def _detached(node):
    return node.op == "DETACH"


def gradients(root, root_grad, targets, order=None):
    """d root / d t for each node t in `targets`, as graph nodes (None where root does not depend on t).
    The walk starts from `prepare(root)`; `order`: walk(prepare(root)), where the caller has it."""
    root = prepare(root)
    targets = set(targets)
    if order is None or order[-1] is not root:
        order = walk(root)
    leads = set()  # nodes with a path to a target: only those need a gradient
    for node in order:
        if node in targets:
            leads.add(node)
            continue
        for s in node.src:
            if s in leads:
                leads.add(node)
                break
    grads = {root: root_grad}
    for node in reversed(order):
        dy = grads.get(node)
        if dy is None or not node.src or node not in leads:
            continue
        if node not in targets:
            del grads[node]  # keep only what is still needed
        src_grads = rule_of(node.op)(dy, node)
        for s, g in zip(node.src, src_grads):
            if g is None or s not in leads:
                continue
            if g.shape != s.shape:
                raise RuntimeError(f"gradient rule of {node.op} gave shape {g.shape} for an input of shape {s.shape}")
            grads[s] = g if s not in grads else grads[s] + g
    return {t: grads.get(t) for t in targets}
