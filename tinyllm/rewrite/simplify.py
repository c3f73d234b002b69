"""Algebraic simplification and constant folding. Every rule is an exact identity in IEEE arithmetic, as in C compilers
without fast-math; docs/rewrites.md ("simplify") lists the rules and the identities deliberately left out.
"""
import math

import numpy as np

from .. import dtype as dt
from ..graph import const
from ..ops import Group
from ..ops.base import compute
from .engine import Pat, PatternMatcher

FOLDABLE = Group.ELEMENTWISE | {"CONTIGUOUS"}  # ops computed from their inputs' values alone (a copy too)
# x -> y is lossless, so CAST(CAST(x, mid), to) == CAST(x, to)
LOSSLESS = {(dt.bool_, dt.int64), (dt.bool_, dt.float32), (dt.bool_, dt.float64), (dt.float32, dt.float64),
            (dt.float16, dt.float32), (dt.float16, dt.float64), (dt.bfloat16, dt.float32), (dt.bfloat16, dt.float64),
            (dt.int8, dt.int64), (dt.uint8, dt.int64), (dt.int8, dt.float32), (dt.uint8, dt.float32)}


def _const(value, pred=lambda a: True):
    """A CONST of exactly `value` (bools are not numbers here), optionally with a further test of its arg."""
    return Pat("CONST", arg=lambda a: not isinstance(a, bool) and a == value and pred(a))


def fold_elementwise(x):
    """An elementwise op whose inputs are all constants is a constant, computed by the op's own forward."""
    if any(s.op != "CONST" for s in x.src):
        return None
    ins = [dt.encode(s.arg, s.dtype) for s in x.src]
    out = compute(x, ins)
    return const(dt.decode(np.asarray(out, dtype=x.dtype.np), x.dtype).item(), x.shape, x.dtype)


def fold_view(x):
    """Moving a constant around leaves a constant."""
    return const(x.src[0].arg, x.shape, x.dtype)


def fold_sum(c, x):
    """Σ of n copies of c is n·c, when that is exact: for floats, when every partial sum k·c is representable
    (then any summation order gives n·c). NumPy's sum starts from +0.0, so a sum of zeros is +0.0."""
    n = math.prod(c.shape[a] for a in x.arg)
    if c.dtype is dt.int64:
        return const((c.arg * n + 2 ** 63) % 2 ** 64 - 2 ** 63, x.shape, x.dtype)  # wraps as NumPy does
    if not c.dtype.is_float:
        return None
    v = float(dt.decode(dt.encode(c.arg, c.dtype), c.dtype))  # the value the runtime sees (a float32 CONST may hold 0.1)
    if v == 0 or n == 0:
        return const(0.0, x.shape, x.dtype)
    if not math.isfinite(v):
        return const(v, x.shape, x.dtype)
    num = v.as_integer_ratio()[0]
    while num % 2 == 0:  # v = num·2^k with num odd
        num //= 2
    bits = dt.finfo(c.dtype).nmant + 1
    if n * abs(num) >= 2 ** bits or n * abs(v) > dt.finfo(c.dtype).max:
        return None
    return const(v * n, x.shape, x.dtype)  # exact in float64, and representable in the dtype


def drop_marker(x): return x  # after autograd, DETACH has nothing left to stop, nor REPLICATE to all-reduce
def add_zero(x): return x
def mul_one(x): return x
def double_neg(x): return x
def same_cast(x, c): return x if c.arg is x.dtype else None
def where_same(c, a): return a
def where_const(c, a, b): return a if c.arg else b
def reshape_reshape(x, r): return x.reshape(r.shape)
def expand_expand(x, e): return x.expand(e.shape)
def noop_view(x, v): return x if x.shape == v.shape else None
def cast_cast(x, m, c): return x.cast(c.arg) if (x.dtype, m.arg) in LOSSLESS else None
def permute_permute(x, p, q): return x.permute(tuple(p.arg[i] for i in q.arg))


x = Pat(name="x")
simplify = PatternMatcher([
    (Pat(("DETACH", "REPLICATE"), src=(x,)), drop_marker),
    # x + (-0.0) is x for every x; x + 0 too for integers and bools
    (Pat("ADD", src=(x, _const(0, lambda a: isinstance(a, int) or math.copysign(1, a) < 0)), commutative=True),
     add_zero),
    (Pat("MUL", src=(x, _const(1)), commutative=True), mul_one),
    (Pat("NEG", src=(Pat("NEG", src=(x,)),)), double_neg),
    (Pat("CAST", src=(x,), name="c"), same_cast),
    (Pat("CAST", src=(Pat("CAST", src=(x,), name="m"),), name="c"), cast_cast),
    (Pat("WHERE", src=(Pat(name="c"), Pat(name="a"), Pat(name="a"))), where_same),
    (Pat(FOLDABLE, name="x"), fold_elementwise),
    (Pat("WHERE", src=(Pat("CONST", name="c"), Pat(name="a"), Pat(name="b"))), where_const),
    (Pat(Group.MOVEMENT, src=(Pat("CONST"),), name="x"), fold_view),
    (Pat("SUM", src=(Pat("CONST", name="c"),), name="x"), fold_sum),
    (Pat("RESHAPE", src=(Pat("RESHAPE", src=(x,)),), name="r"), reshape_reshape),
    (Pat("EXPAND", src=(Pat("EXPAND", src=(x,)),), name="e"), expand_expand),
    (Pat("PERMUTE", src=(Pat("PERMUTE", src=(x,), name="p"),), name="q"), permute_permute),
    (Pat({"RESHAPE", "EXPAND"}, src=(x,), name="v"), noop_view),
])
