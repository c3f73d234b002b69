"""Common-subexpression elimination. Hash-consing already makes equal nodes one node; this pass also makes
a+b and b+a one node, by putting the sources of commutative ops in one canonical order. Only ops whose result
is bit-for-bit the same either way qualify: not float MAX, since NumPy's max(-0.0, +0.0) returns its second
argument (and torch's its first)."""
import weakref

from .. import dtype as dt
from ..graph import Node, toposort
from ..ops import Group
from .engine import Pat, PatternMatcher


_ids = weakref.WeakKeyDictionary()  # node -> its structural id
_structures = {}  # (op, arg, shape, dtype, source ids) -> id, numbered in the order first seen


def _key(node):
    """A number that is equal for nodes of equal structure, so the canonical order, and with it every kernel
    built from the graph, is the same each training step (realize runs the passes on graphs whose inputs are
    numbered SLOTs, so equal steps give equal numbers). A buffer counts by identity, never kept alive."""
    if node not in _ids:
        for n in toposort([node], stop=lambda n: n in _ids):
            if n not in _ids:
                arg = id(n.arg) if n.op == "LOAD" else n.arg
                s = (n.op, arg, n.shape, n.dtype.name, tuple(_ids[x] for x in n.src))
                _ids[n] = _structures.setdefault(s, len(_structures))
    return _ids[node]


def canonical_order(x):
    a, b = x.src
    if _key(a) <= _key(b):
        return None
    return Node(x.op, (b, a), x.arg, x.shape, x.dtype)


cse = PatternMatcher([
    (Pat(Group.COMMUTATIVE, name="x"), canonical_order),
    (Pat("MAX", dtype=(dt.bool_, dt.int64), name="x"), canonical_order),
])
