"""Operands with stride-0 (broadcast, expand) and size-1 axes, transposed and sliced, through every C kernel that
reads arrays in place through their strides (issue 20): the sgemm (runtime/c_views.py's matrix_layout and
batch_runs), the embedding gather and scatter-add, attention (runtime/c_attention.py), the copies
(runtime/c_copy.py) and the generated fused kernels. Values and gradients are compared with torch in float64.

A stride-0 axis of size > 1 stores one element: a kernel that took its stride for a real leading dimension read
past that element (`ones(1, 2) @ ones(2, 3)` gave 1s instead of 2s on C).

Tolerances: float32 kernels against float64 torch, sums of at most a few hundred terms of size <= 2:
rtol 1e-4, atol 1e-5 (attention, with its exp and online softmax: rtol 2e-4, atol 2e-5)."""
import math
import re
from typing import NamedTuple

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import tinyllm as tl
import tinyllm.nn.functional as F
from tinyllm.rewrite import tracing

TOL = dict(rtol=1e-4, atol=1e-5)
ATTN_TOL = dict(rtol=2e-4, atol=2e-5)


def close(got, want, what, tol=TOL):
    want = want.detach().numpy() if isinstance(want, torch.Tensor) else want
    assert got.shape == want.shape, f"{what}: shape {got.shape}, torch gives {want.shape}"
    np.testing.assert_allclose(got, want, err_msg=what, **tol)


# ---- the examples, on every runtime ---------------------------------------------------------------------

def test_ones_row_times_ones(each_runtime):
    """tinyllm.ones(1, 2) is one element read through strides (0, 0): the sgemm read the element after it."""
    got = (tl.ones(1, 2) @ tl.ones(2, 3)).numpy()
    np.testing.assert_array_equal(got, np.full((1, 3), 2, np.float32))
    got = (tl.ones(3, 2) @ tl.ones(2, 1)).numpy()  # the column case: a (3, 1) result, B one column of stride 0
    np.testing.assert_array_equal(got, np.full((3, 1), 2, np.float32))


@pytest.mark.parametrize("upstream", ["sum", "random"])
def test_vector_times_matrix_gradients(each_runtime, upstream):
    """The backward of (x @ w).sum() for a vector x: dY is a broadcast row of ones, read wrongly by both
    dx = dY wᵀ and dw = xᵀ dY."""
    rng = np.random.default_rng(0)
    x_np, w_np = rng.standard_normal(3).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    up = rng.standard_normal(4).astype(np.float32)
    x, w = tl.tensor(x_np, requires_grad=True), tl.tensor(w_np, requires_grad=True)
    xt, wt = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x_np, w_np))
    y, yt = x @ w, xt @ wt
    close(y.numpy(), yt, "x @ w")
    if upstream == "sum":
        y.sum().backward()
        yt.sum().backward()
    else:
        y.backward(gradient=tl.tensor(up))
        yt.backward(torch.tensor(up, dtype=torch.float64))
    close(x.grad.numpy(), xt.grad, "dx")
    close(w.grad.numpy(), wt.grad, "dw")


# ---- every sgemm path with a stride-0 operand (C) --------------------------------------------------------------
# (M, K, N, how A is made): "row" expands a (1, K) row to M rows (A read untransposed, ld 0), "col" a (M, 1)
# column to K columns (transposed, ld 0). Sizes reach full 6 x 16 tiles (A read in place when N <= 256, packed
# with AVX2 strips otherwise), a product run as its transpose (M <= 128, N > 256, K >= 8 M) and a split sum
# (transposed A, K >= 512).
SGEMM_CASES = [(1, 2, 3, "row"), (7, 20, 33, "row"), (7, 20, 33, "col"), (12, 40, 300, "row"), (12, 40, 300, "col"),
               (6, 20, 600, "col"), (13, 600, 5, "col"), (13, 600, 17, "row"), (300, 9, 20, "row")]


@pytest.mark.parametrize("m,k,n,kind", SGEMM_CASES)
def test_sgemm_paths_with_broadcast_operands(m, k, n, kind):
    rng = np.random.default_rng(m * k * n)
    a_np = rng.standard_normal((1, k) if kind == "row" else (m, 1)).astype(np.float32)
    b_np = rng.standard_normal((k, 1)).astype(np.float32)  # expanded to N columns: B has strides (4, 0)
    c_np = rng.standard_normal((k, n)).astype(np.float32)
    up = rng.standard_normal((m, n)).astype(np.float32)
    a, b, c = (tl.tensor(x, device="c", requires_grad=True) for x in (a_np, b_np, c_np))
    at, bt, ct = (torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in (a_np, b_np, c_np))
    y = a.expand(m, k) @ c + a.expand(m, k) @ b.expand(k, n)
    yt = at.expand(m, k) @ ct + at.expand(m, k) @ bt.expand(k, n)
    close(y.numpy(), yt, "y", tol=dict(rtol=1e-4, atol=1e-4))
    y.backward(gradient=tl.tensor(up, device="c"))
    yt.backward(torch.tensor(up, dtype=torch.float64))
    for name, g, gt in (("da", a, at), ("db", b, bt), ("dc", c, ct)):
        close(g.grad.numpy(), gt.grad, name, tol=dict(rtol=1e-4, atol=1e-3))  # sums of up to 600 x 600 terms


# ---- views: how a hypothesis test makes an operand --------------------------------------------------------------

class View(NamedTuple):
    """An operand of logical shape `shape` made from a stored array: sliced (`where`: every other element or all
    but the first along some axes), expanded from size 1 along others (stride 0), then (when `transposed`) its
    last two axes swapped, so it is read transposed."""
    stored: tuple
    where: tuple
    expanded: tuple
    transposed: bool

    @property
    def shape(self):
        s = list(self.expanded)
        if self.transposed:
            s[-1], s[-2] = s[-2], s[-1]
        return tuple(s)

    def make(self, x):
        """The view of x (a tinyllm or torch tensor of shape `stored`)."""
        if any(w != slice(None) for w in self.where):
            x = x[self.where]
        x = x.expand(*self.expanded)
        return x.transpose(-1, -2) if self.transposed else x


@st.composite
def views(draw, shape, transpose=True):
    shape = list(shape)
    transposed = transpose and len(shape) >= 2 and draw(st.booleans())
    if transposed:
        shape[-1], shape[-2] = shape[-2], shape[-1]
    stored, where = [], []
    for n in shape:
        kind = draw(st.sampled_from(["full", "broadcast", "broadcast", "step", "offset"]))
        if kind == "broadcast":
            stored.append(1)
            where.append(slice(None))
        elif kind == "step":
            stored.append(2 * n)
            where.append(slice(None, None, 2))
        elif kind == "offset":
            stored.append(n + 1)
            where.append(slice(1, None))
        else:
            stored.append(n)
            where.append(slice(None))
    return View(tuple(stored), tuple(where), tuple(shape), transposed)


def leaves(views_, seed):
    """(tinyllm leaves on C, torch float64 leaves) holding the same random stored arrays."""
    rng = np.random.default_rng(seed)
    arrays = [rng.uniform(-2, 2, v.stored).astype(np.float32) for v in views_]
    return ([tl.tensor(a, device="c", requires_grad=True) for a in arrays],
            [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays])


def backward_both(y, yt, upstream, seed):
    """Backpropagate from y and torch's yt: through .sum() (a broadcast upstream of ones, stride 0 everywhere)
    or a random upstream."""
    if upstream == "sum":
        y.sum().backward()
        yt.sum().backward()
        return
    up = np.random.default_rng(seed + 1).standard_normal(yt.shape).astype(np.float32)
    y.backward(gradient=tl.tensor(up, device="c"))
    yt.backward(torch.tensor(up, dtype=torch.float64))


def check_grads(ls, ts, what, tol=TOL):
    for i, (l, t) in enumerate(zip(ls, ts)):
        want = torch.zeros_like(t) if t.grad is None else t.grad
        got = np.zeros(t.shape, np.float32) if l.grad is None else l.grad.numpy()
        close(got, want, f"{what}: gradient of input {i}", tol)


SIDES = st.sampled_from([1, 1, 2, 3, 7])
UPSTREAM = st.sampled_from(["sum", "random"])
SEEDS = st.integers(0, 2**31 - 1)


# ---- matmul -----------------------------------------------------------------------------------------------------

@st.composite
def matmul_operands(draw):
    """Views for a @ b: 1-D operands, 2-D, or batched with batch axes that broadcast (1 or missing in one)."""
    m, k, n = draw(SIDES), draw(SIDES), draw(SIDES)
    batch = draw(st.lists(st.sampled_from([1, 2, 3]), max_size=2))
    a_batch, b_batch = list(batch), list(batch)
    for own in (a_batch, b_batch):
        for i in range(len(own)):
            if draw(st.booleans()):
                own[i] = 1
    a_batch, b_batch = a_batch[draw(st.integers(0, len(a_batch))):], b_batch[draw(st.integers(0, len(b_batch))):]
    a_shape = (k,) if not batch and draw(st.booleans()) else (*a_batch, m, k)
    b_shape = (k,) if not batch and len(a_shape) == 2 and draw(st.booleans()) else (*b_batch, k, n)
    return draw(views(a_shape)), draw(views(b_shape))


@settings(max_examples=60)
@given(operands=matmul_operands(), upstream=UPSTREAM, seed=SEEDS)
def test_matmul_of_strided_views_matches_torch(operands, upstream, seed):
    (a, b), (at, bt) = leaves(operands, seed)
    va, vb = operands
    y, yt = va.make(a) @ vb.make(b), va.make(at) @ vb.make(bt)
    what = f"{va.shape} @ {vb.shape}, {operands}"
    close(y.numpy(), yt, what)
    backward_both(y, yt, upstream, seed)
    check_grads((a, b), (at, bt), what)


# ---- embedding: F.embedding and indexing with a tensor ----------------------------------------------------------

@st.composite
def gathers(draw):
    rows, width = draw(st.sampled_from([1, 2, 5])), draw(SIDES)
    table = draw(views((rows, width)))
    idx_shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3]), min_size=1, max_size=2)))
    idx_view = draw(views(idx_shape, transpose=False))
    axis = draw(st.sampled_from([0, 1]))
    n = table.shape[axis]
    idx = draw(st.lists(st.integers(-n if axis == 1 else 0, n - 1), min_size=math.prod(idx_view.stored),
                        max_size=math.prod(idx_view.stored)))
    return table, idx_view, np.array(idx, np.int64).reshape(idx_view.stored), axis


@settings(max_examples=40)
@given(case=gathers(), upstream=UPSTREAM, seed=SEEDS)
def test_embedding_of_strided_views_matches_torch(case, upstream, seed):
    """GATHER and SCATTER_ADD on a broadcast / transposed / sliced table and broadcast / sliced indices, along
    axis 0 (F.embedding) or 1 (w[:, idx], negative indices too)."""
    table, idx_view, idx_np, axis = case
    (w,), (wt,) = leaves([table], seed)
    idx, idx_t = idx_view.make(tl.tensor(idx_np, device="c")), idx_view.make(torch.tensor(idx_np))
    if axis == 0:
        y, yt = F.embedding(idx, table.make(w)), torch.nn.functional.embedding(idx_t, table.make(wt))
    else:
        y, yt = table.make(w)[:, idx], table.make(wt)[:, idx_t]
    what = f"table {table}, indices {idx_np.tolist()} as {idx_view}, axis {axis}"
    close(y.numpy(), yt, what)
    backward_both(y, yt, upstream, seed)
    check_grads([w], [wt], what)


# ---- attention --------------------------------------------------------------------------------------------------

@st.composite
def attention_operands(draw):
    b, h, tq, tk = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2])), draw(SIDES), draw(SIDES)
    d, dv = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 3]))
    return draw(views((b, h, tq, d))), draw(views((b, h, tk, d))), draw(views((b, h, tk, dv)))


@settings(max_examples=40)
@given(qkv=attention_operands(), causal=st.booleans(), upstream=UPSTREAM, seed=SEEDS)
def test_attention_of_strided_views_matches_torch(qkv, causal, upstream, seed):
    """F.scaled_dot_product_attention on q, k, v with broadcast batch and head axes, broadcast rows (every query,
    key or value the same) and columns, transposed and sliced: FLASH_ATTN and FLASH_ATTN_BWD read them in place."""
    ls, ts = leaves(qkv, seed)
    yt = torch.nn.functional.scaled_dot_product_attention(*(v.make(x) for v, x in zip(qkv, ts)), is_causal=causal)
    with tracing() as log:  # the backward before the first read, so FLASH_ATTN_BWD runs (not the plain backward)
        y = F.scaled_dot_product_attention(*(v.make(x) for v, x in zip(qkv, ls)), is_causal=causal)
        backward_both(y, yt, upstream, seed)
        out = y.numpy()
    assert any(f.pass_name == "flash" for f in log), "the flash rewrite did not fire"
    what = f"q, k, v {qkv}, causal {causal}"
    close(out, yt, what, ATTN_TOL)
    check_grads(ls, ts, what, ATTN_TOL)


# ---- copies: CONTIGUOUS, RESHAPE, CAT, PAD ----------------------------------------------------------------------

@st.composite
def copy_operands(draw):
    shape = list(draw(st.lists(SIDES, min_size=1, max_size=4)))
    axis = draw(st.integers(0, len(shape) - 1))
    other = list(shape)
    other[axis] = draw(SIDES)
    return draw(views(tuple(shape))), draw(views(tuple(other))), axis


@settings(max_examples=40)
@given(case=copy_operands(), upstream=UPSTREAM, seed=SEEDS)
def test_copies_of_strided_views_match_torch(case, upstream, seed):
    """contiguous() and a flattening reshape of a view, and cat of two views then sliced (so the backward PADs a
    possibly broadcast gradient back), all of them on stride-0 and size-1 axes."""
    va, vb, axis = case
    (a, b), (at, bt) = leaves((va, vb), seed)

    def f(lib, x, y):
        x, y = va.make(x), vb.make(y)
        c = lib.cat([x, y], axis)
        cut = [slice(None)] * c.ndim
        cut[axis] = slice(1, None) if c.shape[axis] > 2 else slice(None, 1)
        flat = x.contiguous().reshape(-1)
        return (c[tuple(cut)] * 2).reshape(-1), flat + y.reshape(-1).sum()

    (c, flat), (ct, flat_t) = f(tl, a, b), f(torch, at, bt)
    what = f"{va}, {vb}, cat along {axis}"
    close(c.numpy(), ct, what)
    close(flat.numpy(), flat_t, what)
    y, yt = tl.cat([c, flat]), torch.cat([ct, flat_t])
    backward_both(y, yt, upstream, seed)
    check_grads((a, b), (at, bt), what)


# ---- a fused elementwise + reduction kernel ---------------------------------------------------------------------

@st.composite
def fused_operands(draw):
    shape = tuple(draw(st.lists(SIDES, min_size=1, max_size=4)))
    dims = draw(st.lists(st.integers(0, len(shape) - 1), unique=True, max_size=len(shape)))
    return draw(views(shape)), draw(views(shape)), tuple(sorted(dims)) or None


@settings(max_examples=40)
@given(case=fused_operands(), upstream=UPSTREAM, seed=SEEDS)
def test_fused_kernel_of_strided_views_matches_torch(case, upstream, seed):
    """One kernel of elementwise ops and the sum they feed, over views read through (strides, offset)."""
    va, vb, dims = case
    (a, b), (at, bt) = leaves((va, vb), seed)

    def f(x, y):
        x, y = va.make(x), vb.make(y)
        z = (x * y).tanh() + x * 0.5
        return z.sum() if dims is None else z.sum(dims)
    y, yt = f(a, b), f(at, bt)
    what = f"{va}, {vb}, sum over {dims}"
    close(y.numpy(), yt, what)
    backward_both(y, yt, upstream, seed)
    check_grads((a, b), (at, bt), what)


# ---- a generated kernel's input that is a realized view -----------------------------------------------------------

@settings(max_examples=40)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=4), data=st.data())
def test_read_in_place_reads_the_elements_the_kernel_reads_row_major(shape, data):
    """views.read_in_place rewrites a Kernel entry (input, strides, offset) over a row-major input into the same
    elements read where a view lies (a permutation and a slice of a bigger array), or leaves the kernel alone."""
    from tinyllm.ops.kernel import Kernel
    from tinyllm.runtime.c.views import read_in_place
    base = np.arange(int(np.prod(shape)) * 3, dtype=np.float32).reshape(*shape[:-1], shape[-1] * 3)
    view = base[..., 1::3]
    order = data.draw(st.permutations(range(len(shape))))
    view = view.transpose(order)
    row = [int(np.prod(view.shape[d + 1:])) for d in range(view.ndim)]
    skip = data.draw(st.integers(0, view.shape[0] - 1))  # the entry starts at row `skip` of the view's first axis
    it = (view.shape[0] - skip,) + view.shape[1:]
    kernel = Kernel(it, None, ((0, tuple(row), skip * row[0]),), (("IN", 0, (), "float32"),))
    want = np.ascontiguousarray(view).reshape(-1)[skip * row[0]:].copy()
    want = np.lib.stride_tricks.as_strided(want, it, [s * 4 for s in row])
    new, arrays = read_in_place(kernel, [view])
    if new is kernel:
        assert view.flags.c_contiguous or any(s < 0 for s in view.strides)
        return
    (i, strides, offset), = new.ins
    flat = base.reshape(-1)  # the memory: the view's first element, then the entry's offset and strides from it
    start = (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // 4 + offset
    got = np.lib.stride_tricks.as_strided(flat[start:], it, [st_ * 4 for st_ in strides])
    np.testing.assert_array_equal(got, want)


def test_an_autocast_step_copies_no_weight(monkeypatch):
    """A GPT training step under bfloat16 autocast casts each weight in its own layout (rewrite/autocast.py) and
    the optimizer reads untransposed gradients (rewrite/layout.py), so no weight-shaped array is copied row-major,
    even with views.read_in_place off; with it on or off, the same bits."""
    from tinyllm.models.gpt import GPT, GPTConfig
    from tinyllm.runtime.c import copy as ccopy, runtime as crt

    def run(in_place):
        if not in_place:
            monkeypatch.setattr(crt, "read_in_place", lambda kernel, arrays: (kernel, arrays))
        copies = []
        real = ccopy.copy_into
        monkeypatch.setattr(ccopy, "copy_into", lambda rt, d, s: copies.append(s.shape) or real(rt, d, s))
        tl.manual_seed(0)
        model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=40)).to("c")
        opt = tl.optim.AdamW(model.parameters(), lr=1e-2)
        idx = tl.tensor(np.random.default_rng(1).integers(0, 40, (2, 16)), device="c")
        with tl.autocast(dtype=tl.bfloat16):
            _, loss = model(idx, idx)
        loss.backward()
        opt.step()
        monkeypatch.undo()
        return [p.numpy().copy() for p in model.parameters()], copies
    params, copies = run(True)
    params0, copies0 = run(False)
    weights = {(40, 32), (32, 40), (96, 32), (32, 96), (128, 32), (32, 128), (32, 32)}
    assert not weights & set(copies), copies
    assert not weights & set(copies0), copies0
    for p, p0 in zip(params, params0):
        np.testing.assert_array_equal(p, p0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape, axes", [((300, 130), (1, 0)), ((3, 37, 400), (0, 2, 1)),
                                         ((2, 3, 50, 120), (0, 1, 3, 2))])
def test_kernels_reading_across_rows_vectorise_along_their_reads_with_the_same_values(monkeypatch, dtype, shape, axes):
    """An elementwise kernel that reads a permuted view across its rows (stride 1 on the loop outside the innermost)
    is vectorised along that loop in blocks of 16 (render._across), over sizes that are not multiples of the block,
    and gives exactly the values NumPy's reference gives (the same arithmetic per element)."""
    from tinyllm.runtime.c import compiler
    sources = []
    real = compiler.load
    monkeypatch.setattr(compiler, "load", lambda s, *cpu: sources.extend(s.values()) or real(s, *cpu))
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want, got = ((tl.tensor(x, device=d).permute(*axes) * 3.0 + 1.0).to(getattr(tl, dtype)).float().numpy()
                 for d in ("numpy", "c"))
    np.testing.assert_array_equal(got, want)
    assert any(re.search(r"for \(long t\d+ = 0; t\d+ < \w+; t\d+ \+= 16\)", s) for s in sources), \
        "no kernel vectorised along its reads was rendered"
