"""Gradient checkpointing (tinyllm.checkpoint, rewrite/checkpoint.py, the schedule's order): on random layer stacks
and on the GPT, the checkpointed graph's outputs and gradients equal the unmarked graph's and match torch's, on
every runtime; the rewrite really fires (recomputed copies are in the schedule) and really lowers the peak memory.

Tolerances against torch: float32, a few layers: outputs 1e-5, gradients 1e-4 relative (as test_gpt_parity.py).
Against the unmarked graph: exactly equal on numpy and C: the copies run the same ops on the same values, and the
C runtime compiles without FMA contraction, so a recomputed value rounds like the original. A WGSL shader compiler
may contract a·b + c into one FMA, and the kernels' boundaries move with checkpointing, so there the values may
differ in their last bit: 1e-6 relative.
"""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import tinyllm as tl
from helpers import rel
from tinyllm.graph import toposort
from tinyllm.models.gpt import GPT, GPTConfig
from tinyllm.rewrite import tracing
from tinyllm.rewrite.checkpoint import POLICIES

import torch_nanogpt as ref

pytestmark = pytest.mark.usefixtures("each_runtime")
import tinyllm.realizer as realize_module
RTOL, GRAD_RTOL = 1e-5, 1e-4
SCHEDULES = []  # every Schedule built in this module, in order


@pytest.fixture(autouse=True, scope="module")
def spy_on_schedules():
    """Records the schedules into SCHEDULES; they are not cached, so each realize runs the passes."""
    original = realize_module.Schedule

    def spy(*args, **kwargs):
        SCHEDULES.append(original(*args, **kwargs))
        return SCHEDULES[-1]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(realize_module, "Schedule", spy)
        mp.setattr(realize_module, "CACHE_SCHEDULES", False)
        yield
    SCHEDULES.clear()


def recomputed(schedules):
    """The recompute markers in these schedules: one per region input or saved value that a copy reads."""
    return [n for s in schedules for n in s.kernels if n.op == "CHECKPOINT" and n.arg[0] == "recompute"]


def same_as_unmarked(got, want, what):
    if tl.runtime.get(None).name in ("numpy", "c"):
        np.testing.assert_array_equal(got, want, err_msg=f"{what} differs from the unmarked graph's")
    else:
        assert rel(got, want) <= 1e-6, f"{what} differs from the unmarked graph's"


# ---- random layer stacks ----------------------------------------------------------------------------------
LAYERS = ["linear_tanh", "layer_norm", "gelu_mlp", "softmax", "residual_square"]


def layer(kind, x, w, b, lib):
    """One layer of width n, written once for both libraries (they share torch's names)."""
    F = tl.nn.functional if lib is tl else torch.nn.functional
    if kind == "linear_tanh":
        return F.linear(x, w, b).tanh()
    if kind == "layer_norm":
        return F.layer_norm(F.linear(x, w), (x.shape[-1],), b + 1.0, b)
    if kind == "gelu_mlp":
        return x + F.gelu(F.linear(x, w, b), approximate="tanh")
    if kind == "softmax":
        return F.linear(x, w, b).softmax(-1) * x.shape[-1]
    return x + (x * b).exp() * w[0]


stacks = st.fixed_dictionaries(dict(
    kinds=st.lists(st.sampled_from(LAYERS), min_size=1, max_size=4),
    regions=st.lists(st.integers(1, 3), min_size=1, max_size=4),  # consecutive layers grouped per region
    marked=st.lists(st.booleans(), min_size=4, max_size=4),  # which regions are checkpointed
    policy=st.sampled_from(sorted(POLICIES)),
    shape=st.sampled_from([(3, 4), (2, 3, 4), (5, 8)]),
    seed=st.integers(0, 2**31 - 1),
))


def regions(spec):
    """(layer indices, checkpointed?) per region: consecutive layers in groups of the drawn sizes."""
    n, out, i = len(spec["kinds"]), [], 0
    for g, size in enumerate(spec["regions"] + [n]):
        if i < n:
            out.append((range(i, min(i + size, n)), spec["marked"][g % 4]))
            i += size
    return out


def run_stack(spec, lib, checkpoint, arrays):
    """Loss and the stack's output, the marked regions checkpointed."""
    x, up, *params = arrays
    h = x
    for members, marked in regions(spec):
        def region(h, members=members):
            for k in members:
                h = layer(spec["kinds"][k], h, params[2 * k], params[2 * k + 1], lib)
            return h
        h = tl.checkpoint(region, h, policy=spec["policy"]) if checkpoint and marked else region(h)
    return (h * up).sum(), h


def stack_arrays(spec):
    rng = np.random.default_rng(spec["seed"])
    n = spec["shape"][-1]
    arrays = [rng.uniform(-1, 1, spec["shape"]), rng.standard_normal(spec["shape"])]
    for _ in spec["kinds"]:
        arrays += [rng.uniform(-1, 1, (n, n)) / math.sqrt(n), rng.uniform(-0.5, 0.5, n)]
    return [a.astype(np.float32) for a in arrays]


def grads_of(spec, lib, checkpoint, arrays):
    if lib is tl:
        ts = [tl.tensor(a, requires_grad=i != 1) for i, a in enumerate(arrays)]
    else:
        ts = [torch.tensor(a, requires_grad=i != 1) for i, a in enumerate(arrays)]
    loss, out = run_stack(spec, lib, checkpoint, ts)
    loss.backward()
    return [loss.detach().numpy(), out.detach().numpy()] + [t.grad.numpy() for i, t in enumerate(ts) if i != 1]


@given(spec=stacks)
def test_stack_equals_unmarked_and_torch(spec):
    arrays = stack_arrays(spec)
    start = len(SCHEDULES)
    plain = grads_of(spec, tl, False, arrays)
    before = len(SCHEDULES)
    with tracing() as fired:
        marked = grads_of(spec, tl, True, arrays)
    want = grads_of(spec, torch, False, arrays)
    for k, (got, same, torch_value) in enumerate(zip(marked, plain, want)):
        same_as_unmarked(got, same, f"value {k}")
        if k:  # not the loss: a sum of terms of both signs, its relative error is unbounded
            assert rel(got, torch_value) <= (RTOL if k == 1 else GRAD_RTOL), f"value {k} differs from torch's"
    if any(marked for _, marked in regions(spec)):
        assert recomputed(SCHEDULES[before:]), "checkpointed regions but no recomputed copy in the schedule"
        assert any(f.pass_name == "checkpoint" for f in fired)
    assert not recomputed(SCHEDULES[start:before])


# ---- the GPT ------------------------------------------------------------------------------------------------
def gpt_pair(cfg, seed):
    """tinyllm's GPT (checkpointed and not) and nanoGPT in torch, all holding O(1)-spread weights (as
    test_gpt_parity.py's spread=True: GPT-2's init keeps every nonlinearity near 0, where errors hide)."""
    tl.manual_seed(seed)
    plain = GPT(GPTConfig(**cfg))
    rng = np.random.default_rng(seed)
    for name, p in plain.named_parameters():
        value = rng.normal(0, 1 / math.sqrt(p.shape[-1]), p.shape) if p.ndim == 2 else rng.normal(0.5, 0.2, p.shape)
        p.copy_(value.astype(np.float32))
    marked = GPT(GPTConfig(**cfg, checkpoint=True))
    marked.load_state_dict(plain.state_dict())
    tmodel = ref.GPT(ref.GPTConfig(**cfg))
    tmodel.load_state_dict({k: torch.from_numpy(np.array(v.numpy())) for k, v in plain.state_dict().items()})
    return plain, marked, tmodel


@settings(max_examples=8)
@given(n_layer=st.integers(1, 2), n_head=st.sampled_from([1, 2]), seed=st.integers(0, 2**31 - 1))
def test_gpt_checkpointed_equals_plain_and_torch(n_layer, n_head, seed):
    cfg = dict(n_layer=n_layer, n_head=n_head, n_embd=16, block_size=8, vocab_size=11)
    plain, marked, tmodel = gpt_pair(cfg, seed)
    rng = np.random.default_rng(seed)
    x, y = rng.integers(0, 11, (2, 8)), rng.integers(0, 11, (2, 8))
    results = []
    for model in (plain, marked):
        before = len(SCHEDULES)
        logits, loss = model(tl.tensor(x), tl.tensor(y))
        loss.backward()
        results.append((logits.numpy(), loss.item(), {n: p.grad.numpy() for n, p in model.named_parameters()}))
        assert bool(recomputed(SCHEDULES[before:])) == (model is marked)
    tlogits, tloss = tmodel(torch.from_numpy(x), torch.from_numpy(y))
    tloss.backward()
    tgrads = {n: p.grad.numpy() for n, p in tmodel.named_parameters()}
    (p_logits, p_loss, p_grads), (m_logits, m_loss, m_grads) = results
    same_as_unmarked(m_logits, p_logits, "logits")
    same_as_unmarked(m_loss, p_loss, "loss")
    assert rel(m_logits, tlogits.detach().numpy()) <= RTOL and abs(m_loss - tloss.item()) <= RTOL * abs(tloss.item())
    for name, g in m_grads.items():
        same_as_unmarked(g, p_grads[name], f"gradient of {name}")
        assert rel(g, tgrads[name]) <= GRAD_RTOL, name


def test_gpt_checkpoint_only_in_training():
    _, marked, _ = gpt_pair(dict(n_layer=1, n_head=1, n_embd=8, block_size=4, vocab_size=5), 0)
    marked.eval()
    _, loss = marked(tl.tensor(np.zeros((1, 4), np.int64)), tl.tensor(np.zeros((1, 4), np.int64)))
    assert not any(n.op == "CHECKPOINT" for n in toposort([loss.node]))


# ---- memory: the point of it all ----------------------------------------------------------------------------
def test_checkpointing_lowers_peak_memory():
    """A deep stack of wide layers: kept, every layer's activations live until the backward pass reaches them;
    checkpointed per layer, only the layer inputs do (and one layer's recomputed values at a time)."""
    rng = np.random.default_rng(0)
    n, depth = 64, 8
    x_np = rng.standard_normal((64, n)).astype(np.float32)
    ws = [(rng.standard_normal((n, n)) / math.sqrt(n)).astype(np.float32) for _ in range(depth)]

    def peak(checkpoint):
        x = tl.tensor(x_np)
        params = [tl.tensor(w, requires_grad=True) for w in ws]

        def block(h, w):
            return h + ((h @ w).tanh() @ w).tanh()
        tl.reset_peak_memory_stats()
        start = tl.memory_allocated()
        h = x
        for w in params:
            h = tl.checkpoint(block, h, w) if checkpoint else block(h, w)
        h.sum().backward()
        return tl.max_memory_allocated() - start
    plain, marked = peak(False), peak(True)
    # the unit of memory here is one activation (64 x 64 floats): the marked graph saves more than `depth` of them
    assert marked < plain - depth * x_np.nbytes, (plain, marked)


def test_recomputed_values_are_computed_in_the_backward_pass():
    """The schedule computes a region's copy after the gradient reaching the region, not alongside the forward."""
    x, w = tl.randn(8, 8, requires_grad=True), tl.randn(8, 8, requires_grad=True)
    h = x
    for _ in range(3):
        h = tl.checkpoint(lambda h, w: (h @ w).tanh(), h, w)
    (h * h).sum().backward()
    schedule = SCHEDULES[-1]
    markers = [schedule.kernels.index(n) for n in recomputed([schedule])]
    loss_at = schedule.kernels.index(schedule.outputs[0])  # the loss is the forward pass's last value
    assert len(markers) >= 3 and min(markers) > loss_at  # one per region input (w is one input of all three)


# ---- the API ------------------------------------------------------------------------------------------------
def test_checkpoint_api():
    x = tl.randn(3, 4, requires_grad=True)
    a, b = tl.checkpoint(lambda x, k: (x * k, x.exp()), x, 2.0)
    assert {n.arg[0] for n in (a.node, b.node)} == {"exit"} and a.requires_grad
    with tl.no_grad():
        assert tl.checkpoint(lambda x: x * 2, x).node.op != "CHECKPOINT"
    inner = tl.checkpoint(lambda x: tl.checkpoint(lambda y: y.exp(), x) * 2, x)
    assert sum(n.op == "CHECKPOINT" for n in toposort([inner.node])) == 2  # the inner region adds no markers
    with pytest.raises(ValueError, match="unknown policy 'all'.*nothing_saveable"):
        tl.checkpoint(lambda x: x, x, policy="all")


def test_debug_output_names_the_pass(monkeypatch, capsys):
    monkeypatch.setenv("TINYLLM_DEBUG", "1")
    x = tl.randn(4, 4, requires_grad=True)
    tl.checkpoint(lambda x: x.tanh().exp(), x).sum().backward()
    assert "checkpoint.recompute" in capsys.readouterr().out


def test_markers_are_views():
    """A marker has its input's strides and value (a region's input may be any view)."""
    x = tl.randn(5, 3, requires_grad=True)
    y = tl.checkpoint(lambda x: x, x.T[1:])
    assert y.node.op == "CHECKPOINT" and y.stride() == x.T[1:].stride()
    np.testing.assert_array_equal(y.numpy(), x.numpy().T[1:])
