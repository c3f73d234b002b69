"""The autocast pass: AUTOCAST marks (tinyllm/autocast_mode.py) become casts, and the new dtypes flow through the graph,
one rule per kind of op following torch's autocast op lists (each op class's `autocast`, tinyllm/ops/). The rules,
and why a product with a stored operand becomes a checkpointing region: docs/rewrites.md, "Autocast".
"""
import weakref

from .. import dtype as dt
from ..graph import build, const, toposort
from ..ops import Group

_marks = weakref.WeakSet()  # live AUTOCAST nodes: without any, the pass has nothing to do


def marked(node):
    """Note an AUTOCAST node (the front end calls this), so the pass knows a graph may hold marks."""
    _marks.add(node)
    return node


def _weak(node):
    """A constant, or a view of one: it adopts the dtype of what it meets."""
    while node.op in Group.MOVEMENT and node.buffer is None:
        node = node.src[0]
    return node.op == "CONST" and node.buffer is None


def _retyped(node, dtype):
    """`node` in `dtype`: a weak constant is remade (its value rounded once), a stored value (a weight) seen through
    views is cast where it lies and viewed as before (_views_under), anything else is cast."""
    if node.dtype is dtype:
        return node
    if _weak(node):
        views = []
        while node.op != "CONST":
            views.append(node)
            node = node.src[0]
        return _viewed(const(node.arg, node.shape, dtype), views)
    base, views = _views_under(node)
    if views and _stored(base):
        return _viewed(build("CAST", base, arg=dtype), views)
    return build("CAST", node, arg=dtype)


# Views a cast commutes with that make no fewer elements: a weight's cast goes under them, so it reads and writes
# the weight in its own layout (a transposing cast is a strided read and scattered stores: `x @ W.T`'s weight cast
# took 5x a plain one in a config M bfloat16 step), the casts of W and of W.T are one, and the weight's gradient
# reaches the CAST's backward as a transposed product, which the layout pass computes untransposed (rewrite/layout.py)
_CAST_UNDER = ("PERMUTE", "RESHAPE", "EXPAND")


def _views_under(node):
    """(base, views): `node` is base seen through `views` (outermost first), each one of _CAST_UNDER."""
    views = []
    while node.op in _CAST_UNDER and node.buffer is None:
        views.append(node)
        node = node.src[0]
    return node, views


def _viewed(node, views):
    """`node` seen through `views` (outermost first), as they were over another node of its shape."""
    for v in reversed(views):
        node = build(v.op, node, arg=v.arg)
    return node


def _stored(node):
    """A value read from memory (a weight, an input), possibly through views: its cast is cheap to redo."""
    while node.op in Group.MOVEMENT and node.buffer is None:
        node = node.src[0]
    return not node.src or node.buffer is not None


# A stored operand's low copy (a weight's) would live from the forward product to the backward one: the product
# is made a gradient-checkpointing region (rewrite/checkpoint.py) entered at the stored operand and left at the
# product, so the backward pass recasts the weight instead of keeping its copy
ENTER, EXIT = ("enter", "nothing_saveable"), ("exit", "nothing_saveable")


def _weight_cast(node):
    """Whether `node` is a stored value's low cast, seen through views (_retyped's form)."""
    cast, _ = _views_under(node)
    return cast.op == "CAST" and cast.dtype.is_low and not cast.src[0].dtype.is_low and _stored(cast.src[0])


def _entered(node):
    """A weight cast (_weight_cast) whose checkpointing region is entered at the stored value under it."""
    cast, views = _views_under(node)
    return _viewed(build("CAST", build("CHECKPOINT", cast.src[0], arg=ENTER), arg=cast.arg), views)


def _rule(n, src):
    """The rewritten node for `n` over its rewritten sources `src`."""
    if n.op == "AUTOCAST":
        return _retyped(src[0], src[1].dtype if n.arg == "like" else n.arg) if src[0].dtype.is_float else src[0]
    lows = [s.dtype for s in src if s.dtype.is_low]
    if not lows:
        return build(n.op, *src, arg=n.arg)
    if n.op in Group.AUTOCAST_LOW:
        low = lows[0]
        src = [_retyped(s, low) if s.dtype.is_float else s for s in src]
        if n.op != "MATMUL" or not any(_weight_cast(s) for s in src):
            return build(n.op, *src, arg=n.arg)
        src = [_entered(s) if _weight_cast(s) else s for s in src]
        return build("CHECKPOINT", build(n.op, *src, arg=n.arg), arg=EXIT)
    if n.op in Group.AUTOCAST_FLOAT32:
        return build(n.op, *[_retyped(s, dt.float32) if s.dtype.is_low else s for s in src], arg=n.arg)
    if n.op in Group.ELEMENTWISE and n.op != "CAST" and len(src) > 1:
        floats = [s for s in src if s.dtype.is_float]
        strong = [s.dtype for s in floats if not _weak(s)] or [s.dtype for s in floats]
        target = strong[0]
        for d in strong[1:]:
            target = dt.result_type(target, d)
        return build(n.op, *[_retyped(s, target) if s.dtype.is_float else s for s in src], arg=n.arg)
    try:
        return build(n.op, *src, arg=n.arg)
    except TypeError:  # an op that needs one dtype (CAT of a low and a float32 input): float32, as torch promotes
        return build(n.op, *[_retyped(s, dt.float32) if s.dtype.is_low else s for s in src], arg=n.arg)


def autocast_pass(roots, key=None):
    """The pass on `roots` (a list of nodes); returns `roots` itself when the graph holds no AUTOCAST mark."""
    if not _marks:
        return roots
    order = toposort(roots, stop=lambda n: n.buffer is not None)
    if not any(n.op == "AUTOCAST" for n in order):
        return roots
    new = {}
    for n in order:
        if not n.src or n.buffer is not None:
            new[n] = n
            continue
        src = tuple(new[s] for s in n.src)
        new[n] = n if src == n.src and n.op != "AUTOCAST" else _rule(n, src)
    return [_retyped(new[r], r.dtype) if new[r].dtype is not r.dtype else new[r] for r in roots]
