"""The row-kernel pass (WGSL runtime): softmax, log_softmax and layer_norm over the last axis, as the front end
builds them from primitives, become one node each, run by a hand-written one-workgroup-per-row kernel
(runtime/wgsl/rowwise.py):

    softmax       e = exp(x + (-max x)),  y = e · (1 / Σe)
    log_softmax   s = x + (-max x),       y = s + (-log Σ exp(s))          (cross_entropy is built on it)
    layer_norm    c = x + (-(Σx · 1/n)),  y = c · (1 / √((1/n)·Σc² + eps)), then optionally · w and + b

with every reduction over the last axis of a float32 x (n = its length; w and b hold n values broadcast over the
rows). Anything else (another axis, eps outside the square root, another dtype) is left alone.

A ROW_* node's result is [..., :n] y and [..., n:] the row's reductions (max and Σe; Σx and Σc²). The pass
replaces each reduction node by a view of it too, so the backward gets them from the row kernel; what it needs
beyond them (e, c, …) is elementwise and fusion recomputes it. Runtime pass, after autograd: the nodes need a
forward only.
"""
from collections import namedtuple

import numpy as np

from .. import dtype as dt
from ..graph import Node, toposort
from ..ops.rowwise import STATS
from ..env import debug_level
from .engine import Fired, Pat, PatternMatcher, _recorders, trace

# A match: the packed node (its sources are still the unrewritten graph's), the output y, the reduction nodes
# it also hands back (in packed order), and the pattern's inner nodes (not to be matched on their own).
Match = namedtuple("Match", "packed out stats inner")


def _last(arg_of, x):
    return arg_of.arg == (len(x.shape) - 1,)


def _row_view(node, x):
    """A node whose value is x's broadcast row along the last axis, and under its EXPAND, numel n: the
    vector (n values) the kernel reads, else None."""
    n = x.shape[-1]
    v = node.src[0] if node.op == "EXPAND" and node.buffer is None else node
    if v.dtype is not dt.float32 or v.numel != n or not v.shape or v.shape[-1] != n or node.shape != x.shape:
        return None
    return v


def _inner(out, *leaves):
    return [n for n in toposort([out], stop=lambda n: n in leaves) if n not in leaves]


def _packed(op, x, srcs, arg=None):
    return Node(op, (x, *srcs), arg, x.shape[:-1] + (x.shape[-1] + STATS,), x.dtype)


def _shifted(x, mx):
    return x.dtype is dt.float32 and len(x.shape) >= 1 and x.numel > 0 and _last(mx, x)


def softmax(y, x, mx, total, **_):
    if not _shifted(x, mx) or not _last(total, x):
        return None
    return Match(_packed("ROW_SOFTMAX", x, ()), y, (mx, total), _inner(y, x))


def log_softmax(y, x, mx, total, **_):
    if not _shifted(x, mx) or not _last(total, x):
        return None
    return Match(_packed("ROW_LOG_SOFTMAX", x, ()), y, (mx, total), _inner(y, x))


def layer_norm(y, x, s1, s2, k1, k2, eps, w=None, b=None, **_):
    n = x.shape[-1] if x.shape else 0
    if x.dtype is not dt.float32 or not x.shape or not x.numel or not _last(s1, x) or not _last(s2, x):
        return None
    if k1.arg != k2.arg or k1.arg != float(np.float32(1) / np.float32(n)) or not isinstance(eps.arg, float):
        return None  # the mean is Σ · (1/n) in float32, as Tensor.mean builds it
    vectors = [_row_view(v, x) if v is not None else None for v in (w, b)]
    if any(v is None and raw is not None for v, raw in zip(vectors, (w, b))):
        return None
    wv, bv = vectors
    if {s1, s2} & set(toposort([v for v in vectors if v is not None])):
        return None  # a w or b computed from the row's own statistics would make the packed node its own input
    packed = _packed("ROW_LAYER_NORM", x, [v for v in vectors if v is not None],
                     (eps.arg, wv is not None, bv is not None))
    return Match(packed, y, (s1, s2), _inner(y, *[v for v in (x, w, b) if v is not None]))


def _ln_plain(xhat, **caps): return layer_norm(xhat, **caps)


def _bcast(pat):
    return Pat("EXPAND", src=(pat,))


x = Pat(name="x")
# x + (-max x): shared by softmax and log_softmax
_shift = Pat("ADD", src=(x, _bcast(Pat("NEG", src=(Pat("REDUCE_MAX", src=(x,), name="mx"),)))), commutative=True,
             name="s")
_e = Pat("EXP", src=(_shift,), name="e")
_softmax = Pat("MUL", src=(_e, _bcast(Pat("RECIP", src=(Pat("SUM", src=(_e,), name="total"),)))),
               commutative=True, name="y")
_log_softmax = Pat("ADD", src=(_shift, _bcast(Pat("NEG", src=(Pat("LOG", src=(
    Pat("SUM", src=(Pat("EXP", src=(_shift,)),), name="total"),)),)))), commutative=True, name="y")
# c = x + (-(Σx · k)), var = k · Σ(c·c), xhat = c · (1 / √(var + eps)), k = 1/n
_c = Pat("ADD", src=(x, _bcast(Pat("NEG", src=(Pat("MUL", src=(Pat("SUM", src=(x,), name="s1"),
                                                                 Pat("CONST", name="k1")), commutative=True),)))),
         commutative=True, name="c")
_var = Pat("MUL", src=(Pat("SUM", src=(Pat("MUL", src=(_c, _c)),), name="s2"), Pat("CONST", name="k2")),
           commutative=True)
_rstd = Pat("RECIP", src=(Pat("SQRT", src=(Pat("ADD", src=(_var, Pat("CONST", name="eps")), commutative=True),)),))
_xhat = Pat("MUL", src=(_c, _bcast(_rstd)), commutative=True, name="xhat")
_scaled = Pat("MUL", src=(_xhat, Pat(name="w")), commutative=True)

rows = PatternMatcher([
    (_softmax, softmax, "softmax"),
    (_log_softmax, log_softmax, "log_softmax"),
    (Pat("ADD", src=(_scaled, Pat(name="b")), commutative=True, name="y"), layer_norm, "layer_norm_weight_bias"),
    (Pat("ADD", src=(_xhat, Pat(name="b")), commutative=True, name="y"), layer_norm, "layer_norm_bias"),
    (Pat("MUL", src=(_xhat, Pat(name="w")), commutative=True, name="y"), layer_norm, "layer_norm_weight"),
    (_xhat, _ln_plain, "layer_norm"),
])


def rowwise(roots):
    """The pass: find matches from the outputs down (so layer_norm's · w + b is matched before the plain
    normalisation inside it), then rebuild the graph once with y and the reductions as views of packed nodes."""
    order = toposort(roots, stop=lambda n: n.buffer is not None)
    matches, claimed = {}, set()  # node -> (Match, column); nodes inside a match
    for node in reversed(order):
        if node in claimed or node in matches or node.buffer is not None:
            continue
        hit = rows.rewrite(node)
        if hit is None:
            continue
        m, rule = hit
        for sink in _recorders + ([trace] if debug_level() else []):  # as graph_rewrite records its rules
            sink.append(Fired("rowwise", rule, node.op))
        claimed.update(m.inner)
        matches[m.out] = (m, slice(0, m.out.shape[-1]))
        for i, r in enumerate(m.stats):  # softmax and log_softmax of one x share their reductions: first wins
            matches.setdefault(r, (m, slice(m.out.shape[-1] + i, m.out.shape[-1] + i + 1)))
    if not matches:
        return roots
    return _rebuild(roots, matches)


def _rebuild(roots, matches):
    """The graph with each matched node replaced by a view of its match's packed node, built on the rebuilt
    sources. A matched node waits for its packed node's sources (which may come after it in `order`)."""
    new, packed = {}, {}
    deps = lambda n: matches[n][0].packed.src if n in matches else n.src  # noqa: E731
    stack = [(r, False) for r in reversed(roots)]
    while stack:
        n, ready = stack.pop()
        if n in new:
            continue
        if not ready and n.buffer is None:
            stack.append((n, True))
            stack.extend((s, False) for s in deps(n) if s not in new)
            continue
        if n in matches:
            m, cols = matches[n]
            if m.out not in packed:
                p = m.packed
                packed[m.out] = Node(p.op, tuple(new[s] for s in p.src), p.arg, p.shape, p.dtype)
            p = packed[m.out]
            new[n] = Node("SHRINK", (p,), tuple((0, s, 1) for s in p.shape[:-1]) + ((cols.start, cols.stop, 1),),
                          n.shape, n.dtype)
        else:
            src = tuple(new[s] for s in n.src) if n.buffer is None else n.src
            new[n] = n if src == n.src else Node(n.op, src, n.arg, n.shape, n.dtype)
    return [new[r] for r in roots]
