"""Gradients of slices become concatenations: added pads of neighbouring slices are one pad of their CAT, a pad that
fills its shape is its input, and dO padded with a zero dL column reaches FLASH_ATTN_BWD as dO itself
(docs/rewrites.md, "pads"). Exact but for the sign of zero: -0.0 + 0.0 (the pad) is +0.0, while the
concatenation keeps -0.0."""
from ..graph import build
from .engine import Pat, PatternMatcher


def _joined(pa, pb):
    """The placement of pa's input followed by pb's along the one axis where they differ, or None."""
    (shape, wa), (_, wb) = pa.arg, pb.arg
    if pa.shape != pb.shape:
        return None
    differ = [d for d, (a, b) in enumerate(zip(wa, wb)) if a != b]
    if len(differ) != 1:
        return None
    d = differ[0]
    full = all(w == (0, n, 1) for i, (w, n) in enumerate(zip(wa, shape)) if i != d)
    (a0, a1, sa), (b0, b1, sb) = wa[d], wb[d]
    if not full or sa != 1 or sb != 1 or a1 != b0:
        return None
    return d, wa[:d] + ((a0, b1, 1),) + wa[d + 1:]


def pads_to_cat(a, b):
    for first, second in ((a, b), (b, a)):
        joined = _joined(first, second)
        if joined is not None:
            d, where = joined
            cat = build("CAT", first.src[0], second.src[0], arg=d)
            return build("PAD", cat, arg=(first.arg[0], where))
    return None


def regroup(y, a, b):
    """(y + pad a) + pad b, with a and b neighbours: (y + pad of both). Adds of disjoint pads commute exactly."""
    joined = pads_to_cat(a, b)
    return build("ADD", y, joined) if joined is not None else None


def full_pad(x, p):
    """A pad that fills its whole shape adds nothing."""
    return x if all(w == (0, n, 1) for w, n in zip(p.arg[1], p.shape)) else None


def flatten_cat(c):
    """CAT(CAT(a, b), c) along one axis is CAT(a, b, c): one copy instead of two."""
    srcs = []
    for s in c.src:
        srcs.extend(s.src if s.op == "CAT" and s.arg == c.arg and s.buffer is None else (s,))
    return build("CAT", *srcs, arg=c.arg) if len(srcs) != len(c.src) else None


def cat_of_merged(c):
    """CAT along axis d of reshapes that each merge axes d..e of their input x into axis d is that merge applied
    to the CAT of the inputs along d: each x's block of axes d..e stays one run of the flattened axis, in order.
    The inputs must agree on every axis but d, as the CAT needs."""
    d, xs = c.arg, []
    for y in c.src:
        if y.op != "RESHAPE" or y.buffer is not None:
            return None
        x = y.src[0]
        e = len(x.shape) - len(y.shape) + d  # x's axes d..e become y's axis d; the rest map one to one
        if e <= d or x.shape[:d] != y.shape[:d] or x.shape[e + 1:] != y.shape[d + 1:]:
            return None
        xs.append(x)
    if len({x.shape[:d] + x.shape[d + 1:] for x in xs}) != 1:
        return None
    return build("CAT", *xs, arg=d).reshape(c.shape)


def dout_without_dl(g, p):
    """FLASH_ATTN_BWD(q, k, v, out, pad of dO by one zero column) is FLASH_ATTN_BWD(q, k, v, out, dO): dL = 0."""
    *rows, last = p.arg[1]
    if last != (0, p.shape[-1] - 1, 1) or any(w != (0, n, 1) for w, n in zip(rows, p.shape)):
        return None
    return build("FLASH_ATTN_BWD", *g.src[:4], p.src[0], arg=g.arg)


pads = PatternMatcher([
    (Pat("ADD", src=(Pat("PAD", name="a"), Pat("PAD", name="b"))), pads_to_cat),
    (Pat("ADD", src=(Pat("ADD", src=(Pat(name="y"), Pat("PAD", name="a")), commutative=True), Pat("PAD", name="b")),
         commutative=True), regroup),
    (Pat("PAD", src=(Pat(name="x"),), name="p"), full_pad),
    (Pat("CAT", name="c"), flatten_cat),
    (Pat("CAT", name="c"), cat_of_merged),
    (Pat("FLASH_ATTN_BWD", src=(Pat(), Pat(), Pat(), Pat(), Pat("PAD", name="p")), name="g"), dout_without_dl),
])
