"""tinyllm.einsum (tinyllm/einsum.py) against torch.einsum: values and gradients of every operand, on every runtime,
over the equation forms torch users write (matmul chains, batch axes, '...', diagonals, outer products, implicit
outputs, broadcast size-1 axes). Tolerance: float32 sums of at most 6 products: rtol 1e-5, atol 1e-5."""
import numpy as np
import pytest
import torch

import tinyllm as tl
from tinyllm.graph import toposort

pytestmark = pytest.mark.usefixtures("each_runtime")

CASES = [("ij,jk->ik", (3, 4), (4, 5)), ("bij,bjk->bik", (2, 3, 4), (2, 4, 5)), ("ii->i", (4, 4)), ("ii", (4, 4)),
         ("ij->", (3, 4)), ("ij->ji", (3, 4)), ("i,i->", (5,), (5,)), ("i,j->ij", (3,), (4,)),
         ("...ij,...jk->...ik", (2, 3, 4), (2, 4, 5)), ("bhqd,bhkd->bhqk", (2, 3, 4, 5), (2, 3, 6, 5)),
         ("ij,jk,kl->il", (2, 3), (3, 4), (4, 5)), ("ijk,ikl->ijl", (1, 3, 4), (2, 4, 5)), ("ij,kj", (3, 4), (5, 4)),
         ("iij->j", (3, 3, 4)), ("ab,ab->a", (3, 4), (1, 4)), ("...i,...i", (2, 3), (2, 3)),
         ("b i d, b j d -> b i j", (2, 3, 4), (2, 5, 4)), ("ij,ij,ij->i", (2, 3), (2, 3), (2, 3))]


@pytest.mark.parametrize("eq, shapes", [(c[0], c[1:]) for c in CASES], ids=[c[0] for c in CASES])
def test_einsum_matches_torch(eq, shapes):
    rng = np.random.default_rng(len(eq))
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    xs = [tl.tensor(a, requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]
    y, ty = tl.einsum(eq, *xs), torch.einsum(eq, *ts)
    np.testing.assert_allclose(y.numpy(), ty.detach().numpy(), rtol=1e-5, atol=1e-5)
    r = rng.standard_normal(ty.shape).astype(np.float32)
    (y * tl.tensor(r)).sum().backward()
    (ty * torch.tensor(r)).sum().backward()
    for x, t in zip(xs, ts):
        np.testing.assert_allclose(x.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_a_contraction_is_one_matmul():
    a, b = tl.randn(2, 3, 4), tl.randn(2, 4, 5)
    ops = [n.op for n in toposort([tl.einsum("bij,bjk->bik", a, b).node])]
    assert ops.count("MATMUL") == 1 and "SUM" not in ops


def test_bad_equations_say_what_is_wrong():
    a = tl.randn(2, 3)
    with pytest.raises(ValueError, match="names 2 operands, 1 given"):
        tl.einsum("ij,jk->ik", a)
    with pytest.raises(ValueError, match="has 3 subscripts but 2 dimensions"):
        tl.einsum("ijk->i", a)
    with pytest.raises(ValueError, match="appear in no operand"):
        tl.einsum("ij->iz", a)
    with pytest.raises(ValueError, match="subscript 'j' has sizes 3 and 4"):
        tl.einsum("ij,jk->ik", a, tl.randn(4, 2))
