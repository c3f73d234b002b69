"""Common-subexpression elimination. Hash-consing already makes equal nodes one node; this pass also makes
a+b and b+a one node, by putting the sources of commutative ops in one canonical order."""
from ..graph import Node
from .engine import Pat, PatternMatcher

COMMUTATIVE = {"ADD", "MUL", "MAX", "CMPEQ"}


def _key(node):
    return (node.op, node.shape, node.dtype.name, id(node))


def canonical_order(x):
    a, b = x.src
    if _key(a) <= _key(b):
        return None
    return Node(x.op, (b, a), x.arg, x.shape, x.dtype)


cse = PatternMatcher([(Pat(COMMUTATIVE, name="x"), canonical_order)])
