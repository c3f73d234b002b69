"""Pattern matching and rewriting of the lazy graph, run to a fixed point.

A rule is (Pat, fn): the pattern matches a node on op, sources, argument and dtype and captures named parts;
`fn(**captures)` returns a replacement node or None (no change). `graph_rewrite` rebuilds the graph bottom-up,
applying rules to every node until none fires, and records which rule fired in `trace`.
"""
import os

from ..graph import Node, toposort

ANY = object()
trace = []  # (pass name, rule name, op) for every rewrite, while TINYLLM_DEBUG is set
MAX_REWRITES_PER_NODE = 100


class Pat:
    """Matches a node. op: a name or a set of names (None: any); src: a tuple of Pats for the sources (None:
    any); arg: a required argument, or a predicate on it; name: capture the node under that name;
    commutative: also try the two sources swapped."""
    def __init__(self, op=None, src=None, arg=ANY, name=None, dtype=None, commutative=False):
        self.ops = None if op is None else {op} if isinstance(op, str) else set(op)
        self.src, self.arg, self.name, self.dtype, self.commutative = src, arg, name, dtype, commutative

    def match(self, node, caps):
        if self.ops is not None and node.op not in self.ops:
            return False
        if self.dtype is not None and node.dtype is not self.dtype:
            return False
        if self.arg is not ANY and not (self.arg(node.arg) if callable(self.arg) else node.arg == self.arg):
            return False
        if self.name is not None:
            if self.name in caps and caps[self.name] is not node:
                return False
            caps[self.name] = node
        if self.src is None:
            return True
        if len(self.src) != len(node.src):
            return False
        orders = [node.src, node.src[::-1]] if self.commutative else [node.src]
        for srcs in orders:
            trial = dict(caps)
            if all(p.match(s, trial) for p, s in zip(self.src, srcs)):
                caps.update(trial)
                return True
        return False


class PatternMatcher:
    def __init__(self, rules):
        self.rules = rules
        self.by_op, self.any_op = {}, []
        for pat, fn in rules:
            if pat.ops is None:
                self.any_op.append((pat, fn))
            else:
                for op in pat.ops:
                    self.by_op.setdefault(op, []).append((pat, fn))

    def rewrite(self, node):
        """The first rule that fires on `node`: (replacement, rule name), or None."""
        for pat, fn in self.by_op.get(node.op, []) + self.any_op:
            caps = {}
            if pat.match(node, caps):
                new = fn(**caps)
                if new is not None and new is not node:
                    return new, fn.__name__
        return None


def _is_leaf(node):
    return node.buffer is not None or not node.src


def graph_rewrite(roots, pm, name="rewrite"):
    """Rewrite every node reachable from `roots` until no rule fires. Realized nodes are leaves: nothing under
    them is visited. Returns the new roots, in order."""
    debug = bool(int(os.environ.get("TINYLLM_DEBUG", "0") or 0))
    for _ in range(MAX_REWRITES_PER_NODE):
        changed, new_of = False, {}
        for node in toposort(roots, stop=_is_leaf):
            src = tuple(new_of.get(s, s) for s in node.src)
            new = node if src == node.src or _is_leaf(node) else Node(node.op, src, node.arg, node.shape, node.dtype)
            seen = {new}
            while (hit := pm.rewrite(new)) is not None:
                new, rule = hit
                if debug:
                    trace.append((name, rule, node.op))
                if new.shape != node.shape or new.dtype is not node.dtype:
                    raise RuntimeError(f"pass {name}: rule {rule} turned {node} into {new}")
                if new in seen:
                    raise RuntimeError(f"pass {name}: rule {rule} loops on {node}")
                seen.add(new)
                if len(seen) > MAX_REWRITES_PER_NODE:
                    raise RuntimeError(f"pass {name}: no fixed point for {node} after {MAX_REWRITES_PER_NODE} rewrites")
            if new is not node:
                new_of[node] = new
                changed = True
        roots = [new_of.get(r, r) for r in roots]
        if not changed:
            return roots
        # a replacement may hold new nodes whose sources were never visited: walk again until nothing changes
    raise RuntimeError(f"pass {name}: graph did not reach a fixed point")
