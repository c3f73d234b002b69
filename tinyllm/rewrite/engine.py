"""Pattern matching and rewriting of the lazy graph, run to a fixed point (docs/rewrites.md: patterns, rules, how
`graph_rewrite` walks and the checks that stop a rule set from hanging).

Every rule that fires is recorded as Fired(pass_name, rule, op): in `trace` while TINYLLM_DEBUG is set, and in
the list a `tracing()` block yields.
"""
import contextlib
from collections import Counter, namedtuple

from ..env import debug_level
from ..ops import names
from ..graph import Node

ANY = object()
Fired = namedtuple("Fired", "pass_name rule op")
trace = []  # Fired(...) for every rewrite while TINYLLM_DEBUG is set (realizer.py prints and clears it)
_recorders = []  # the lists of the open tracing() blocks
MAX_CHAIN = 1000  # successive rewrites of one node before we call it a runaway rule


@contextlib.contextmanager
def tracing():
    """`with tracing() as fired:` records every rewrite made inside the block into the list `fired`."""
    fired = []
    _recorders.append(fired)
    try:
        yield fired
    finally:
        del _recorders[next(i for i, r in enumerate(_recorders) if r is fired)]  # by identity: lists compare by value


class Pat:
    """Matches a node.
    op:    a name or a set of names (None: any op)
    src:   a tuple of Pats, one per source (None: any sources)
    arg:   the required argument, or a predicate on it (ANY: any argument)
    dtype: a DType or a tuple of them (None: any)
    name:  capture the node under this name; a name used twice must capture the same node
    commutative: also try the two sources swapped
    A realized node (one with a buffer) is a leaf: a pattern never looks at its sources."""
    def __init__(self, op=None, src=None, arg=ANY, name=None, dtype=None, commutative=False):
        self.ops = None if op is None else names(*([op] if isinstance(op, str) else op))
        self.dtypes = None if dtype is None else tuple(dtype) if isinstance(dtype, (tuple, list, set)) else (dtype,)
        self.src, self.arg, self.name, self.commutative = src, arg, name, commutative

    def __repr__(self):
        return f"Pat({'|'.join(sorted(self.ops)) if self.ops else '*'}{' ' + self.name if self.name else ''})"

    def match(self, node, caps):
        """Yield every capture dict (extending `caps`) under which this pattern matches `node`."""
        if self.ops is not None and node.op not in self.ops:
            return
        if self.dtypes is not None and node.dtype not in self.dtypes:
            return
        if self.arg is not ANY and not (self.arg(node.arg) if callable(self.arg) else node.arg == self.arg):
            return
        if self.name is not None:
            if caps.get(self.name, node) is not node:
                return
            caps = {**caps, self.name: node}
        if self.src is None:
            yield caps
            return
        if node.buffer is not None or len(self.src) != len(node.src):
            return
        yield from _match_all(self.src, node.src, caps)
        if self.commutative and len(node.src) == 2 and node.src[0] is not node.src[1]:
            yield from _match_all(self.src, node.src[::-1], caps)


def _match_all(pats, nodes, caps):
    if not pats:
        yield caps
        return
    for c in pats[0].match(nodes[0], caps):
        yield from _match_all(pats[1:], nodes[1:], c)


class PatternMatcher:
    """An ordered list of rules; the first one whose function returns a node wins."""
    def __init__(self, rules):
        self.rules = [(r[0], r[1], r[2] if len(r) > 2 else r[1].__name__) for r in rules]
        self._for_op = {}

    def rules_for(self, op):
        if op not in self._for_op:
            self._for_op[op] = [r for r in self.rules if r[0].ops is None or op in r[0].ops]
        return self._for_op[op]

    def rewrite(self, node):
        """The first rule that fires on `node`: (replacement, rule name), or None."""
        for pat, fn, name in self.rules_for(node.op):
            for caps in pat.match(node, {}):
                new = fn(**caps)
                if new is not None and new is not node:
                    return new, name
        return None

    def __add__(self, other):
        return PatternMatcher(self.rules + other.rules)


SRCS, REBUILT = object(), "(rebuilt)"  # stack steps: see graph_rewrite


def graph_rewrite(roots, pm, name="rewrite"):
    """Rewrite every node reachable from `roots` until no rule of `pm` fires anywhere. Realized nodes are
    leaves: they are kept as they are and nothing under them is visited. Returns the new roots, in order."""
    sinks = _recorders + ([trace] if debug_level() else [])
    done, active = {}, set()  # node -> its final form; nodes whose rewrite is under way
    # The stack holds (node, step, new, depth). step None: first visit. step SRCS: the sources are final, so
    # rebuild the node on them or try the rules. Otherwise step names the rule (REBUILT for a rebuild) that
    # replaced node by `new`: node's final form is new's. depth counts the replacements that led to a node.
    stack = [(r, None, None, 0) for r in reversed(roots)]
    push, pop = stack.append, stack.pop
    for_op = pm._for_op  # op -> its rules (filled by pm.rules_for): an op with none needs no match
    while stack:
        node, step, new, depth = pop()
        if step is None:
            if node in done:
                continue
            if node in active:
                raise RuntimeError(_loop_message(name, node, stack))
            if node.buffer is not None or not node.src:  # a leaf
                done[node] = node
                continue
            active.add(node)
            push((node, SRCS, None, depth))
            for s in reversed(node.src):
                if s not in done:
                    push((s, None, None, 0))
        elif step is SRCS:
            src = tuple([done[s] for s in node.src])
            if src != node.src:
                new, rule = Node(node.op, src, node.arg, node.shape, node.dtype), REBUILT
            elif for_op.get(node.op) == [] or (hit := pm.rewrite(node)) is None:
                done[node] = node
                active.discard(node)
                continue
            else:
                new, rule = hit
                for sink in sinks:
                    sink.append(Fired(name, rule, node.op))
                if new.shape != node.shape or new.dtype is not node.dtype:
                    raise RuntimeError(f"pass {name}: rule {rule} turned {node} into {new}: a rewrite must keep "
                                       "shape and dtype")
            if depth >= MAX_CHAIN:
                top = Counter(e[1] for e in stack if isinstance(e[1], str) and e[1] != REBUILT).most_common(3)
                raise RuntimeError(f"pass {name}: no fixed point after {MAX_CHAIN} successive rewrites of one node; "
                                   "rules: " + ", ".join(f"{r}×{c}" for r, c in top))
            stack.append((node, rule, new, depth))
            stack.append((new, None, None, depth + 1))
        else:
            done[node] = done[new]
            active.discard(node)
    return [done[r] for r in roots]


def _loop_message(name, node, stack):
    at = max(i for i, e in enumerate(stack) if e[0] is node and e[1] is not None)
    rules = [e[1] for e in stack[at:] if isinstance(e[1], str) and e[1] != REBUILT]
    return (f"pass {name}: rewrite loop: rule{'s' if len(rules) > 1 else ''} {' -> '.join(rules) or '?'} "
            f"lead{'' if len(rules) > 1 else 's'} back to {node}, which is still being rewritten")
