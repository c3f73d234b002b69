"""The gradient walker: gradients are more graph, built from each primitive's rule in `tinyllm.ops`.

Walks the graph once in reverse topological order. Broadcasting needs no care here: the front end broadcasts
only through EXPAND, whose rule sums the gradient back (ops/movement.py), so it is undone in that one place.

Some rewrites must happen before the walk, because they change what the backward graph keeps: FlashAttention
replaces softmax(q kᵀ) v by a node whose own rule recomputes the scores, so the T×T probabilities are never
stored for the backward pass. `prepare` runs them; `Tensor.backward` computes the loss through its result.
"""
import time
import weakref

from .env import debug_level
from .graph import toposort
from .ops import rule_of
from .rewrite import flash
from .rewrite.engine import trace, tracing

_prepared = weakref.WeakKeyDictionary()  # root -> its rewritten graph (a backward with retain_graph reuses it)
_final = weakref.WeakSet()  # rewritten graphs: preparing one again changes nothing


def prepare(root):
    """`root`'s graph after the rewrites that run before differentiation (the same node when none applies)."""
    if not flash.ENABLED:
        return root
    if root in _final:
        return root
    done = _prepared.get(root)
    if done is None:
        start, mark = time.perf_counter(), len(trace)
        with tracing() as fired:
            done = flash.attention_pass([root])[0]
        _prepared[root] = done  # (not done -> done: a value that holds its own key keeps it alive forever)
        _final.add(done)
        if debug_level():
            del trace[mark:]  # printed here: the next realize prints only its own rewrites
        if debug_level() and fired:
            counts = {}
            for f in fired:
                counts[f"{f.pass_name}.{f.rule}"] = counts.get(f"{f.pass_name}.{f.rule}", 0) + 1
            print(f"[tinyllm] before autograd, {(time.perf_counter() - start) * 1e3:.1f} ms; rewrites: "
                  + ", ".join(f"{r}×{c}" for r, c in counts.items()))
    return done


def gradients(root, root_grad, targets):
    """d root / d t for each node t in `targets`, as graph nodes (None where root does not depend on t).
    The walk starts from `prepare(root)`: compute root's value through that node too, or the forward runs twice."""
    root = prepare(root)
    targets = set(targets)
    order = toposort([root], stop=lambda n: n.op == "DETACH")
    leads = set()  # nodes with a path to a target: only those need a gradient
    for node in order:
        if node in targets or any(s in leads for s in node.src):
            leads.add(node)
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
