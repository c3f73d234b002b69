"""Gradient checkpointing as a rewrite of the joint forward + backward graph: every node outside a region that reads
a value inside it gets a recomputed copy, built from the region's inputs read through CHECKPOINT("recompute").
docs/rewrites.md ("Gradient checkpointing") says why each part is there and what the schedule must do for the
saving.
"""
from ..graph import Node, toposort
from .engine import Pat, PatternMatcher, graph_rewrite

# policy name -> which values inside a region are saved for the backward pass rather than recomputed
POLICIES = {
    "nothing_saveable": lambda node: False,  # recompute everything from the region's inputs
    "dots_saveable": lambda node: node.op == "MATMUL",  # keep matmul outputs, recompute the cheap ops around them
}


def _stops(node):
    return node.op == "CHECKPOINT" or node.buffer is not None or not node.src


def _interior(exit_):
    """The nodes between a region's enter markers and `exit_` (those that depend on an enter marker), and the
    enter markers themselves. Walks stop at every marker, so regions never leak into each other."""
    inside, enters = set(), []
    for n in toposort([exit_.src[0]], stop=_stops):
        if n.op == "CHECKPOINT" and n.arg[0] == "enter":
            enters.append(n)
            inside.add(n)
        elif not _stops(n) and any(s in inside for s in n.src):
            inside.add(n)
    return inside.difference(enters), enters


def checkpoint(roots):
    """The pass: every node outside a region that reads a value inside it reads a recomputed copy instead."""
    markers = [n for n in toposort(roots, stop=lambda n: n.buffer is not None) if n.op == "CHECKPOINT"]
    if not markers:
        return roots
    exits = [n for n in markers if n.arg[0] == "exit"]
    interior, copies = set(), {}  # copies: node -> what a recomputed copy uses for it
    for x in exits:
        inside, enters = _interior(x)
        saved = POLICIES[x.arg[1]]
        interior |= inside
        # the copy reads the region's inputs and the values the policy saves through a marker, so it never
        # comes out equal to the original (e.g. tanh(saved matmul + b) would otherwise be the forward's node)
        for n in enters + [n for n in inside if saved(n)]:
            copies[n] = Node("CHECKPOINT", (n,), ("recompute", x.arg[1]), n.shape, n.dtype)

    def copy(node):
        for n in toposort([node], stop=lambda n: n in copies or n not in interior):
            if n not in copies:
                copies[n] = Node(n.op, tuple(copies.get(s, s) for s in n.src), n.arg, n.shape, n.dtype) \
                    if n in interior else n
        return copies[node]

    def recompute(x):
        """x reads values from inside a region it is not part of (a backward node): it reads copies instead."""
        if x in interior or x.op == "CHECKPOINT" or not any(s in interior for s in x.src):
            return None
        return Node(x.op, tuple(copy(s) if s in interior else s for s in x.src), x.arg, x.shape, x.dtype)

    roots = graph_rewrite(roots, PatternMatcher([(Pat(name="x"), recompute)]), "checkpoint")
    return graph_rewrite(roots, unmark, "checkpoint")


def drop_region_marker(x):
    return x.src[0]


# Once the copies exist, the enter and exit markers have told all they know: without them the forward pass is the
# unmarked graph's again, so fusion builds the same kernels for it (the same rounding in every value)
unmark = PatternMatcher([(Pat("CHECKPOINT", arg=lambda a: a[0] != "recompute", name="x"), drop_region_marker)])
