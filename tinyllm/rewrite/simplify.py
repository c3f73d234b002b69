"""Algebraic simplification and constant folding. Every rule keeps values exactly (IEEE semantics included:
x·0 is not folded, since inf·0 is nan)."""
import numpy as np

from ..graph import OPS, const
from .engine import Pat, PatternMatcher

ELEMENTWISE = {"NEG", "EXP", "LOG", "SQRT", "RECIP", "TANH", "ERF", "CAST", "ADD", "MUL", "MAX", "CMPLT", "CMPEQ",
               "WHERE"}
VIEWS = {"RESHAPE", "EXPAND", "PERMUTE", "SHRINK"}


def _is(value):
    return Pat("CONST", arg=lambda a: a == value and not isinstance(a, bool))


def fold_elementwise(x):
    """An elementwise op whose inputs are all constants is a constant."""
    if not x.src or any(s.op != "CONST" for s in x.src):
        return None
    ins = [np.array(s.arg, dtype=s.dtype.np) for s in x.src]
    out = OPS[x.op].forward(*ins, arg=x.arg) if OPS[x.op].takes_arg else OPS[x.op].forward(*ins)
    return const(np.asarray(out).item(), x.shape, x.dtype)


def fold_view(x):
    """Moving a constant around leaves a constant."""
    return const(x.src[0].arg, x.shape, x.dtype)


def fold_sum(c, x):
    n = c.numel // x.numel
    return const(np.asarray(np.array(c.arg, dtype=c.dtype.np) * n).item(), x.shape, x.dtype)


def drop_detach(x): return x  # after autograd, DETACH has nothing left to stop
def add_zero(x): return x
def mul_one(x): return x
def double_neg(x): return x
def same_cast(x, c): return x if c.arg is x.dtype else None
def reshape_reshape(x, r): return x.reshape(r.shape)
def expand_expand(x, e): return x.expand(e.shape)
def noop_view(x, v): return x if v.op in ("RESHAPE", "EXPAND") and x.shape == v.shape else None


def permute_permute(x, p, q):
    return x.permute(tuple(p.arg[i] for i in q.arg))


simplify = PatternMatcher([
    (Pat("DETACH", src=(Pat(name="x"),)), drop_detach),
    (Pat("ADD", src=(Pat(name="x"), _is(0)), commutative=True), add_zero),
    (Pat("MUL", src=(Pat(name="x"), _is(1)), commutative=True), mul_one),
    (Pat("NEG", src=(Pat("NEG", src=(Pat(name="x"),)),)), double_neg),
    (Pat("CAST", src=(Pat(name="x"),), name="c"), same_cast),
    (Pat(ELEMENTWISE, name="x"), fold_elementwise),
    (Pat(VIEWS, src=(Pat("CONST"),), name="x"), fold_view),
    (Pat("SUM", src=(Pat("CONST", name="c"),), name="x"), fold_sum),
    (Pat("RESHAPE", src=(Pat("RESHAPE", src=(Pat(name="x"),)),), name="r"), reshape_reshape),
    (Pat("EXPAND", src=(Pat("EXPAND", src=(Pat(name="x"),)),), name="e"), expand_expand),
    (Pat("PERMUTE", src=(Pat("PERMUTE", src=(Pat(name="x"),), name="p"),), name="q"), permute_permute),
    (Pat({"RESHAPE", "EXPAND"}, src=(Pat(name="x"),), name="v"), noop_view),
])
