"""The FlashAttention pass: attention written the plain way, `softmax((q @ kᵀ) · scale [masked with -inf]) @ v`,
becomes one FLASH_ATTN node (tinyllm/ops/attention.py), the output a view of its packed result.

A mask qualifies when its value is the causal one (or keeps everything): the pass evaluates the mask's small
subgraph and compares, so it runs on graphs that still hold their buffers (the pipeline's differentiate and values
stages). docs/rewrites.md ("FlashAttention") lists what matches and what is left alone. Off: `TINYLLM_FLASH=0`,
`flash.ENABLED = False` or `with flash.disabled():`.
"""
import contextlib
import os
from collections import OrderedDict
import weakref

import numpy as np

from .. import dtype as dt
from ..graph import OPS, build, toposort
from .engine import Pat, PatternMatcher, graph_rewrite

ENABLED = os.environ.get("TINYLLM_FLASH", "1").strip().lower() not in ("0", "false", "no", "off")
MASK_MAX_NODES = 256  # a mask subgraph larger than this is not evaluated: no match
MASK_MAX_ELEMENTS = 1 << 26


@contextlib.contextmanager
def disabled():
    """`with disabled():` graphs built and realized inside keep their plain attention."""
    global ENABLED
    before, ENABLED = ENABLED, False
    try:
        yield
    finally:
        ENABLED = before


# ---- reading the pieces ----
def _const_value(node):
    """The number a constant (possibly expanded, reshaped or 1/constant) stands for, else None."""
    invert = False
    while True:
        if node.op in ("EXPAND", "RESHAPE") and node.buffer is None:
            node = node.src[0]
        elif node.op == "RECIP" and node.buffer is None:
            node, invert = node.src[0], not invert
        else:
            break
    if node.op != "CONST" or node.buffer is not None or not isinstance(node.arg, float):
        return None
    return 1.0 / node.arg if invert else node.arg


def _split_scale(node):
    """(x, c) for node = x · c with a constant c (either side), else (node, 1.0)."""
    if node.op == "MUL" and node.buffer is None:
        for x, c in (node.src, node.src[::-1]):
            value = _const_value(c)
            if value is not None:
                return x, value
    return node, 1.0


def _swaps_last(node):
    n = len(node.shape)
    return node.op == "PERMUTE" and node.arg == tuple(range(n - 2)) + (n - 1, n - 2)


def _scores(s):
    """(q, k, scale) for s = (q · c₁) @ (kᵀ · c₂) · c₃ (any cᵢ may be absent), else None."""
    mm, c3 = _split_scale(s)
    if mm.op != "MATMUL" or mm.buffer is not None:
        return None
    q, c1 = _split_scale(mm.src[0])
    kt, c2 = _split_scale(mm.src[1])
    if _swaps_last(kt):  # kᵀ written as k.transpose(-2, -1), possibly scaled before the transpose
        k, c4 = _split_scale(kt.src[0])
    else:
        k, c4 = kt.transpose_last(), 1.0
    return q, k, c1 * c2 * c3 * c4


def _is_neg_inf(node):
    value = _const_value(node)
    return value is not None and value == -np.inf


def _mask(x):
    """(scores, keep) for x = where(mask, -inf, scores) (keep = not mask) or where(keep, scores, -inf);
    (x, None) when x is not masked."""
    if x.op == "WHERE" and x.buffer is None:
        c, a, b = x.src
        if _is_neg_inf(a):
            return b, (c, False)
        if _is_neg_inf(b):
            return a, (c, True)
    return x, None


# ---- is the mask causal? ----
def _evaluate(node):
    """The value of a small graph whose leaves all have values (buffers, constants), computed with the ops'
    NumPy forwards; None if it has a leaf without a value or is too big."""
    order = toposort([node], stop=lambda n: n.buffer is not None)
    if len(order) > MASK_MAX_NODES or any(n.numel > MASK_MAX_ELEMENTS for n in order):
        return None
    vals = {}
    with np.errstate(all="ignore"):
        for n in order:
            if n.buffer is not None:
                vals[n] = n.buffer.numpy()
            elif n.op == "LOAD":
                vals[n] = n.arg.numpy()
            elif n.op == "CONST":
                vals[n] = np.broadcast_to(dt.decode(dt.encode(n.arg, n.dtype), n.dtype), n.shape)
            elif not n.src:  # a SLOT, or anything else whose value is not in the graph
                return None
            else:
                op, ins = OPS[n.op], [vals[s] for s in n.src]
                vals[n] = op.evaluate(*ins, arg=n.arg)
    return vals[node]


def _base(mask):
    """The mask under the expands and reshapes that only add batch axes: its (..., Tq, Tk) part."""
    while mask.op in ("EXPAND", "RESHAPE") and mask.buffer is None and len(mask.src[0].shape) >= 2 \
            and mask.src[0].shape[-2:] == mask.shape[-2:]:
        mask = mask.src[0]
    return mask


_verdicts = weakref.WeakKeyDictionary()  # mask base node -> what _classify found
_by_content = OrderedDict()  # (structure, leaf bytes) -> verdict, for masks rebuilt every step from small buffers
CONTENT_MAX_LEAF = 1 << 16  # leaves up to this many elements key the content cache (aranges, not T×T buffers)


def _content_key(base):
    """A key for the mask's subgraph and the values of its (small) leaves, or None if a leaf is large."""
    order = toposort([base], stop=lambda n: n.buffer is not None or n.op == "LOAD")
    index, parts = {}, []
    for n in order:
        if n.buffer is not None or n.op == "LOAD":
            if n.numel > CONTENT_MAX_LEAF:
                return None
            array = (n.buffer or n.arg).numpy()
            parts.append(("LEAF", n.shape, n.dtype.name, np.ascontiguousarray(array).tobytes()))
        else:
            parts.append((n.op, n.arg, n.shape, n.dtype.name, tuple(index[s] for s in n.src)))
        index[n] = len(parts) - 1
    return tuple(parts)


def _classify(base):
    """What the mask's value is: "tril" (key j kept for query i iff j <= i), "triu" (its complement), "all"
    (every element true), "none" (every element false), or None (anything else, or not computable)."""
    value = _evaluate(base)
    if value is None or value.dtype != np.bool_:
        return None
    value = np.broadcast_to(value, base.shape)
    tril = np.broadcast_to(np.tri(*base.shape[-2:], dtype=bool), base.shape)
    if np.array_equal(value, tril):
        return "tril"
    if not value.any():
        return "none"
    if value.all():
        return "all"
    return "triu" if np.array_equal(value, ~tril) else None


def _causal(mask, keeps):
    """For a mask that marks the kept (`keeps`) or the dropped positions: True if it keeps exactly the causal
    ones, False if it keeps all, None otherwise."""
    base = _base(mask)
    kind = _verdicts.get(base, "?")
    if kind == "?":
        key = _content_key(base)
        kind = _by_content[key] if key in _by_content else _classify(base)
        if key is not None:
            _by_content[key] = kind
            while len(_by_content) > 64:
                _by_content.popitem(last=False)
        _verdicts[base] = kind
    return {"tril": True, "all": False}.get(kind) if keeps else {"triu": True, "none": False}.get(kind)


# ---- the rule ----
_seen = [False]  # set when a softmax @ v shape was found (whether or not it qualified): see attention_pass
_plain = set()  # structure keys of graphs with no attention pattern in them


def _under(node, *ops):
    """The node under a chain of `ops`, each skipped where present (in this order from the top). An EXPAND is
    absent when it would expand nothing (a size-1 axis)."""
    for op in ops:
        if node.op == op and node.buffer is None:
            node = node.src[0]
    return node


def flash_attention(e, denominator, shift, x, v):
    _seen[0] = True
    last = len(x.shape) - 1
    total = _under(denominator, "EXPAND", "RECIP")
    if _under(denominator, "EXPAND").op != "RECIP" or total.op != "SUM" or total.arg != (last,) \
            or total.src[0] is not e:
        return None
    mx = _under(shift, "EXPAND", "NEG", "DETACH")  # softmax shifts by a detached max; a hand-written one may not
    if _under(shift, "EXPAND").op != "NEG" or mx.op != "REDUCE_MAX" or mx.arg != (last,) or mx.src[0] is not x:
        return None
    s, mask = _mask(x)
    parts = _scores(s)
    if parts is None or len(x.shape) < 2 or not x.dtype.is_float or x.buffer is not None:
        return None
    q, k, scale = parts
    causal = False
    if mask is not None:
        causal = _causal(*mask)
        if causal is None:
            return None
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2] or k.shape[-2] == 0:
        return None
    out = build("FLASH_ATTN", q, k, v, arg=(float(scale), bool(causal)))
    dv = v.shape[-1]
    return build("SHRINK", out, arg=tuple((0, n, 1) for n in out.shape[:-1]) + ((0, dv, 1),))


# softmax(x) @ v as the front end builds it: exp(x + (-max x)) · (1 / Σ exp(...)), the rest checked by the rule
_exp = Pat("EXP", src=(Pat("ADD", src=(Pat(name="x"), Pat(name="shift")), commutative=True),), name="e")
_probs = Pat("MUL", src=(_exp, Pat(name="denominator")), commutative=True)
flash = PatternMatcher([(Pat("MATMUL", src=(_probs, Pat(name="v"))), flash_attention)])


def attention_pass(roots, key=None):
    """The pass on `roots` (a list of nodes). With `key` (the graph's structure, as realize computes it), a
    structure already seen without any attention pattern is skipped at once. Returns `roots` itself when
    nothing changed."""
    if not ENABLED or key in _plain:
        return roots
    _seen[0] = False
    new = graph_rewrite(roots, flash, "flash")
    if not _seen[0] and key is not None:
        _plain.add(key)
        if len(_plain) > 256:  # keys are whole graph structures: keep a few
            _plain.clear()
    return roots if all(a is b for a, b in zip(new, roots)) else new
