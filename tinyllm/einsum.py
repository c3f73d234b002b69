"""`tinyllm.einsum(equation, *operands)`, torch's einsum lowered to views, reductions and matmuls.

Operands are contracted two at a time, left to right. For a pair, every index is one of: in both and still
needed (a batch axis), in both and not needed (summed by the matmul), in one only (kept as a row or column of
the matmul, or summed first when nothing needs it). Each operand is permuted to (batch, kept, summed) and
reshaped to three axes, so the contraction is one batched matmul, which reaches the sgemm, and its gradient is
the matmul's. A repeated index in one operand ("ii->i") takes the diagonal: the two axes flattened and sliced with
a step of n + 1, a view.
"""
import math

from .graph import build
from .tensor import Tensor


def _parse(equation, operands):
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise ValueError(f"einsum: the equation {equation!r} names {len(terms)} operands, {len(operands)} given")
    ell = max((t.ndim - (len(term) - 3) for term, t in zip(terms, operands) if "..." in term), default=0)
    spare = [chr(c) for c in range(ord("A"), ord("Z") + 1) if chr(c) not in eq][:ell]  # stand-ins for "..."
    subs = []
    for term, t in zip(terms, operands):
        if not all(c.isalpha() for c in term.replace("...", "")):
            raise ValueError(f"einsum: subscripts must be letters (and one '...'), got {term!r}")
        if "..." in term:
            n = t.ndim - (len(term) - 3)
            term = term.replace("...", "".join(spare[ell - n:]))
        if len(term) != t.ndim:
            raise ValueError(f"einsum: operand {term!r} has {len(term)} subscripts but {t.ndim} dimensions "
                             f"(shape {t.shape})")
        subs.append(term)
    if arrow:
        out = rhs.replace("...", "".join(spare))
        if not all(c.isalpha() for c in out) or len(set(out)) != len(out):
            raise ValueError(f"einsum: the output {rhs!r} must name distinct letters")
        missing = set(out) - set("".join(subs))
        if missing:
            raise ValueError(f"einsum: output subscripts {sorted(missing)} appear in no operand")
    else:  # implicit output: "..." first, then the letters that appear once, sorted
        counts = {c: "".join(subs).count(c) for c in "".join(subs)}
        out = "".join(spare) + "".join(sorted(c for c, k in counts.items() if k == 1 and c not in spare))
    return subs, out


def _diagonal(t, sub):
    """Collapse a repeated subscript: (…, i, …, i, …) -> (…, i, …) with the diagonal's values."""
    while len(set(sub)) != len(sub):
        c = next(c for c in sub if sub.count(c) > 1)
        p, q = sub.index(c), sub.index(c, sub.index(c) + 1)
        n = t.shape[p]
        if t.shape[q] != n:
            raise ValueError(f"einsum: subscript {c!r} has sizes {n} and {t.shape[q]} in one operand")
        rest = [i for i in range(t.ndim) if i not in (p, q)]
        t = t.permute(*rest, p, q).reshape(*[t.shape[i] for i in rest], n * n)
        arg = tuple((0, s, 1) for s in t.shape[:-1]) + ((0, n * n, n + 1),)
        t = t._make(build("SHRINK", t._node, arg=arg))
        sub = "".join(sub[i] for i in rest) + c
    return t, sub


def _sum_unneeded(t, sub, needed):
    axes = [i for i, c in enumerate(sub) if c not in needed]
    if axes:
        t = t.sum(tuple(axes))
        sub = "".join(c for c in sub if c in needed)
    return t, sub


def _contract(a, sa, b, sb, needed):
    """a (subscripts sa) times b (sb), summing the shared subscripts not in `needed`: (tensor, its subscripts)."""
    a, sa = _sum_unneeded(a, sa, set(sb) | needed)
    b, sb = _sum_unneeded(b, sb, set(sa) | needed)
    batch = [c for c in sa if c in sb and c in needed]
    summed = [c for c in sa if c in sb and c not in needed]
    left = [c for c in sa if c not in sb]
    right = [c for c in sb if c not in sa]
    size = {}
    for t, s in ((a, sa), (b, sb)):
        for c, n in zip(s, t.shape):
            if size.setdefault(c, n) != n and 1 not in (n, size[c]):
                raise ValueError(f"einsum: subscript {c!r} has sizes {size[c]} and {n}")
            size[c] = max(size[c], n)
    for c in summed:
        if a.shape[sa.index(c)] != b.shape[sb.index(c)]:  # a summed axis broadcasts by its size-1 side
            a = a.expand(*[size[x] if x == c else n for x, n in zip(sa, a.shape)])
            b = b.expand(*[size[x] if x == c else n for x, n in zip(sb, b.shape)])
    bshape = [size[c] for c in batch]
    a = a.permute(*[sa.index(c) for c in batch + left + summed])
    b = b.permute(*[sb.index(c) for c in batch + summed + right])
    a = a.expand(*bshape, *a.shape[len(batch):]).reshape(
        *bshape, math.prod(size[c] for c in left), math.prod(size[c] for c in summed))
    b = b.expand(*bshape, *b.shape[len(batch):]).reshape(
        *bshape, math.prod(size[c] for c in summed), math.prod(size[c] for c in right))
    y = a.matmul(b).reshape(*bshape, *[size[c] for c in left], *[size[c] for c in right])
    return y, "".join(batch + left + right)


def einsum(equation, *operands):
    """torch.einsum: `einsum("bij,bjk->bik", a, b)`; operands may also be given as one list."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands or not all(isinstance(t, Tensor) for t in operands):
        raise TypeError("einsum: the operands must be tensors")
    subs, out = _parse(equation, operands)
    terms = [_diagonal(t, s) for t, s in zip(operands, subs)]
    t, s = terms[0]
    for k, (u, su) in enumerate(terms[1:], 1):
        needed = set(out) | set("".join(x for _, x in terms[k + 1:]))
        t, s = _contract(t, s, u, su, needed)
    t, s = _sum_unneeded(t, s, set(out))
    return t.permute(*[s.index(c) for c in out]) if s != out else t
