"""The row-kernel pass (tinyllm/rewrite/rowwise.py) and its WGSL kernels (runtime/wgsl/rowwise.py, wgsl/softmax.wgsl,
layer_norm.wgsl): softmax, log_softmax, cross_entropy and layer_norm over the last axis run as
one ROW_* kernel on the WGSL runtime, with the same values and gradients as torch; near misses are left alone.

Tolerances (float32, sums in another order than torch's): values and gradients at rtol 1e-4 and atol 1e-5 times
the size of the inputs (log_softmax of logits up to ±60 is up to ~120 in size, rounded to 2⁻²⁴ relative); for
layer_norm times the size over the smallest row deviation too (x - mean rounds at x's precision, and the
normalised value divides that by the deviation: rows shifted by 100 are tested).
"""
import os

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

import tinyllm as tl
import tinyllm.nn.functional as F
from tinyllm.runtime.wgsl.runtime import WGSLRuntime
from tinyllm.rewrite import rowwise
from conftest import wgsl_skip_reason

if not os.environ.get("CI") and wgsl_skip_reason():
    pytest.skip(wgsl_skip_reason(), allow_module_level=True)

SEEDS = st.integers(0, 2**32 - 1)
ROW_OPS = {"ROW_SOFTMAX", "ROW_LOG_SOFTMAX", "ROW_LAYER_NORM"}


@pytest.fixture(scope="module")
def ran():
    """The ops of every kernel the WGSL runtime executes (module-scoped for hypothesis: tests clear it)."""
    seen = []
    original = WGSLRuntime.execute

    def spy(self, schedule, feeds=()):
        seen.extend(n.op for n in schedule.kernels)
        return original(self, schedule, feeds)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(WGSLRuntime, "execute", spy)
        yield seen


def close(got, want, scale, what):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale, err_msg=what)


def compare(fn, torch_fn, arrays, grads=True, scale=None):
    """fn on the WGSL runtime against torch_fn on CPU: the value and, with grads, every input's gradient of
    Σ value · g for a fixed random g (finite outputs only: g is 0 where the value is ±inf)."""
    xs = [tl.tensor(a, requires_grad=grads, device="wgsl") for a in arrays]
    ts = [torch.tensor(a, requires_grad=grads) for a in arrays]
    want = torch_fn(*ts)
    g = np.random.default_rng(0).standard_normal(want.shape).astype(np.float32)
    g[~np.isfinite(want.detach().numpy())] = 0
    got = fn(*xs)
    if grads:
        (got * tl.tensor(g, device="wgsl")).sum().backward()
        torch.where(torch.isfinite(want), want * torch.tensor(g), 0.0).sum().backward()
    if scale is None:
        scale = 1 + max(float(np.max(np.abs(a[np.isfinite(a)]), initial=0)) for a in arrays)
    close(got.numpy(), want.detach().numpy(), scale, "value")
    if grads:
        for i, (x, t) in enumerate(zip(xs, ts)):
            close(x.grad.numpy(), t.grad.numpy(), scale, f"gradient of input {i}")


@st.composite
def logits(draw, neg_inf=False):
    """(rows, n) float32 with rows 1-8 and n 1-300 (around the workgroup widths 32-256), values N(0, 1) times
    1 or 30 (large logits), optionally some entries -inf (masked) and, with n > 1, one row all -inf."""
    rows, n = draw(st.integers(1, 8)), draw(st.sampled_from([1, 2, 7, 31, 32, 33, 64, 100, 129, 255, 256, 300]))
    rng = np.random.default_rng(draw(SEEDS))
    x = (rng.standard_normal((rows, n)) * draw(st.sampled_from([1.0, 30.0]))).astype(np.float32)
    if neg_inf and n > 1:
        x[rng.random((rows, n)) < 0.3] = -np.inf
        x[np.arange(rows), rng.integers(0, n, rows)] = 1.0  # each row keeps a finite entry
    return x


def fired(ran, op, n):
    # a row of length 1 has no broadcast back over the row in the graph, so the pattern (and the pass) needs n > 1
    assert (op in ran) == (n > 1), f"{op} {'not ' if n > 1 else ''}in the executed kernels {ran}"


@given(x=logits(neg_inf=True))
def test_softmax(ran, x):
    ran.clear()
    compare(lambda t: t.softmax(-1), lambda t: t.softmax(-1), [x])
    fired(ran, "ROW_SOFTMAX", x.shape[-1])


@given(x=logits())
def test_log_softmax(ran, x):
    ran.clear()
    compare(lambda t: t.log_softmax(-1), lambda t: t.log_softmax(-1), [x])
    fired(ran, "ROW_LOG_SOFTMAX", x.shape[-1])


def test_softmax_of_masked_rows_is_torch_nan_and_zero(ran):
    """Masked (-inf) entries give 0, a fully masked row NaN, as torch; forward only (NaN has no gradient to
    compare). Also a batch of 3 axes: rows are every axis but the last."""
    ran.clear()
    x = np.random.default_rng(1).standard_normal((2, 3, 40)).astype(np.float32)
    x[0, 0] = -np.inf
    x[1, :, 5:] = -np.inf
    got = tl.tensor(x, device="wgsl").softmax(-1).numpy()
    np.testing.assert_allclose(got, torch.tensor(x).softmax(-1).numpy(), rtol=1e-5, atol=1e-7)
    assert np.isnan(got[0, 0]).all() and (got[1, :, 5:] == 0).all()
    assert "ROW_SOFTMAX" in ran


@given(x=logits(), seed=SEEDS, mean=st.booleans())
def test_cross_entropy(ran, x, seed, mean):
    """cross_entropy = log_softmax (the row kernel) and a one-hot pick (a fused reduction over its output)."""
    ran.clear()
    target = np.random.default_rng(seed).integers(0, x.shape[-1], x.shape[0])
    target[0] = -100  # ignore_index
    reduction = "mean" if mean else "sum"
    compare(lambda t: F.cross_entropy(t, tl.tensor(target, device="wgsl"), reduction=reduction),
            lambda t: torch.nn.functional.cross_entropy(t, torch.tensor(target), reduction=reduction), [x])
    fired(ran, "ROW_LOG_SOFTMAX", x.shape[-1])


@given(x=logits(), affine=st.sampled_from(["none", "weight", "bias", "both"]), seed=SEEDS,
       shift=st.sampled_from([0.0, 100.0]))
def test_layer_norm(ran, x, affine, seed, shift):
    """With and without weight and bias; shift moves the rows' mean far from 0 (the two-pass variance keeps it
    exact where E[x²] - E[x]² would cancel)."""
    ran.clear()
    n = x.shape[-1]
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.5, 2, n).astype(np.float32) if affine in ("weight", "both") else None
    b = rng.standard_normal(n).astype(np.float32) if affine in ("bias", "both") else None
    x = (x / 30 + shift if abs(x).max() > 10 else x + shift).astype(np.float32)
    arrays = [a for a in (x, w, b) if a is not None]

    def split(args):
        it = iter(args[1:])
        return args[0], next(it) if w is not None else None, next(it) if b is not None else None

    def ours(*args):
        t, tw, tb = split(args)
        return F.layer_norm(t, (n,), tw, tb)

    def theirs(*args):
        t, tw, tb = split(args)
        return torch.nn.functional.layer_norm(t, (n,), tw, tb)
    # x - mean rounds at |x|'s precision, and the normalised value divides that by √(var + eps)
    std = float(np.sqrt(x.astype(np.float64).var(-1) + 1e-5).min())
    compare(ours, theirs, arrays, scale=(1 + float(np.abs(x).max())) / min(std, 1.0))
    fired(ran, "ROW_LAYER_NORM", n)


def test_near_misses_are_left_alone(ran):
    """Softmax over another axis, log_softmax over another axis, layer_norm with eps outside the square root
    and a mean over another axis: computed right, but not by a row kernel."""
    x = np.random.default_rng(2).standard_normal((5, 6)).astype(np.float32)
    t = torch.tensor(x)
    cases = [(lambda a: a.softmax(0), lambda a: a.softmax(0)),
             (lambda a: a.log_softmax(0), lambda a: a.log_softmax(0)),
             (lambda a: (a - a.mean(-1, keepdim=True)) / (a.var(-1, unbiased=False, keepdim=True).sqrt() + 1e-5),
              lambda a: (a - a.mean(-1, keepdim=True)) / (a.var(-1, unbiased=False, keepdim=True).sqrt() + 1e-5)),
             (lambda a: (a - a.mean(0, keepdim=True)) * (a.var(-1, unbiased=False, keepdim=True) + 1e-5).rsqrt(),
              lambda a: (a - a.mean(0, keepdim=True)) * (a.var(-1, unbiased=False, keepdim=True) + 1e-5).rsqrt())]
    for ours, theirs in cases:
        ran.clear()
        compare(ours, theirs, [x])
        assert not ROW_OPS & set(ran), f"a row kernel ran on a near miss: {ran}"
    ran.clear()
    y = tl.tensor(x, device="wgsl")
    assert np.allclose((y.softmax(-1) + y.softmax(0)).numpy(), (t.softmax(-1) + t.softmax(0)).numpy(), atol=1e-6)
    assert ran.count("ROW_SOFTMAX") == 1  # the last-axis one only


def test_pass_keeps_the_graph_exact():
    """On a forward + backward graph, the rewritten graph (run with the ops' NumPy forwards, the reference the
    kernels are tested against above) gives bit for bit what the original gives, and the reductions the
    backward reads come from the packed row node."""
    from tinyllm.graph import OPS, toposort
    rng = np.random.default_rng(3)
    x = tl.tensor(rng.standard_normal((3, 9)).astype(np.float32), requires_grad=True, device="numpy")
    w = tl.tensor(rng.uniform(0.5, 2, 9).astype(np.float32), requires_grad=True, device="numpy")
    h = F.layer_norm(x, (9,), w, None)
    loss = (h.softmax(-1) * h.log_softmax(-1)).sum()
    from tinyllm.autograd import gradients
    from tinyllm.graph import const
    from tinyllm.rewrite.pipeline import pipeline
    grads = gradients(loss.node, const(1.0), [x.node, w.node])
    roots = pipeline([loss.node, grads[x.node], grads[w.node]], "schedule")  # the passes before the runtime's

    def run(nodes):
        vals = {}
        for n in toposort(nodes, stop=lambda n: n.buffer is not None):
            if n.buffer is not None:
                vals[n] = n.buffer.numpy()
            elif n.op == "CONST":
                vals[n] = np.broadcast_to(np.array(n.arg, n.dtype.np), n.shape)
            else:
                op, ins = OPS[n.op], [vals[s] for s in n.src]
                vals[n] = op.forward(*ins, arg=n.arg) if op.takes_arg else op.forward(*ins)
        return [vals[r] for r in nodes]
    new = rowwise.rowwise(roots)
    ops = [n.op for n in toposort(new, stop=lambda n: n.buffer is not None)]
    assert {"ROW_SOFTMAX", "ROW_LOG_SOFTMAX", "ROW_LAYER_NORM"} <= set(ops)
    assert "REDUCE_MAX" not in ops
    for a, b in zip(run(roots), run(new)):
        np.testing.assert_array_equal(a, b)


def test_gpt_forward_backward_matches_numpy(ran):
    """A tiny GPT's loss and every gradient on the WGSL runtime (row kernels for its layer_norms and its
    cross_entropy) against the NumPy runtime (no row kernels) with the same weights."""
    ran.clear()
    from tinyllm.models.gpt import GPT, GPTConfig
    tl.manual_seed(0)
    cfg = GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=8, vocab_size=65)
    idx = np.random.default_rng(4).integers(0, 65, (2, 8))
    results = []
    for device in ("numpy", "wgsl"):
        tl.manual_seed(0)
        model = GPT(cfg).to(device=device)
        _, loss = model(tl.tensor(idx, device=device), tl.tensor(np.roll(idx, -1, 1), device=device))
        loss.backward()
        results.append((loss.item(), {k: p.grad.numpy() for k, p in model.named_parameters()}))
    (loss_np, grads_np), (loss_gpu, grads_gpu) = results
    np.testing.assert_allclose(loss_gpu, loss_np, rtol=1e-5)
    for k in grads_np:
        np.testing.assert_allclose(grads_gpu[k], grads_np[k], rtol=1e-3, atol=1e-5, err_msg=k)
    assert {"ROW_LAYER_NORM", "ROW_LOG_SOFTMAX"} <= set(ran)
