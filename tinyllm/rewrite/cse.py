"""Common-subexpression elimination. Hash-consing already makes equal nodes one node; this pass also makes
a+b and b+a one node, by putting the sources of commutative ops in one canonical order. Only ops whose result
is bit-for-bit the same either way qualify: not float MAX, since NumPy's max(-0.0, +0.0) returns its second
argument (and torch's its first)."""
from .. import dtype as dt
from ..graph import Node
from .engine import Pat, PatternMatcher


def _key(node):
    return (node.op, id(node))


def canonical_order(x):
    a, b = x.src
    if _key(a) <= _key(b):
        return None
    return Node(x.op, (b, a), x.arg, x.shape, x.dtype)


cse = PatternMatcher([
    (Pat({"ADD", "MUL", "CMPEQ"}, name="x"), canonical_order),
    (Pat("MAX", dtype=(dt.bool_, dt.int64), name="x"), canonical_order),
])
