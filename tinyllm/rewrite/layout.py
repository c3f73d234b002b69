"""Layout: a transposed product (A B)ᵀ computed as Bᵀ Aᵀ, which the matmul kernels read in place (docs/rewrites.md).
The weight gradient of `x @ W.T` is such a product; stored untransposed, the optimizer's kernels read it without
copying it first."""
from ..graph import build, consumers, toposort
from .engine import Pat, PatternMatcher, graph_rewrite


def _swaps_last_two(perm):
    n = len(perm)
    return n >= 2 and tuple(perm) == tuple(range(n - 2)) + (n - 1, n - 2)


def _transposed(x, swap):
    """xᵀ, folding a transpose of a transpose (simplify, which would, has run before this pass)."""
    if x.op == "PERMUTE":
        return x.src[0].permute(tuple(x.arg[i] for i in swap))
    return build("PERMUTE", x, arg=tuple(swap))


def layout(roots):
    users = consumers(toposort(roots, stop=lambda n: n.buffer is not None))

    def transposed_product(t, mm):
        if len(users.get(mm, ())) > 1:  # another user needs the product as it is: computing both costs a matmul
            return None  # (a product this pass built has no other user)
        a, b = mm.src
        return build("MATMUL", _transposed(b, t.arg), _transposed(a, t.arg))

    pm = PatternMatcher([(Pat("PERMUTE", src=(Pat("MATMUL", name="mm"),), arg=_swaps_last_two, name="t"),
                          transposed_product, "transposed_product")])
    return graph_rewrite(roots, pm, "layout")
