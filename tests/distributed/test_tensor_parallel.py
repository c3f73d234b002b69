"""Tensor parallelism on 2 ranks (tinyllm/rewrite/tensor_parallel.py, tinyllm.distributed.tensor_parallel): the
rewritten per-rank graph of a GPT against the unsplit graph of the same weights on the same rank, and torch's.

Split parameters: this rank's block of the gradient equals the unsplit one's block and the rest is exactly zero;
replicated parameters: the whole gradient. Every rank gathers every rank's failures and asserts on them, so a
failure on one rank fails both and no rank waits alone in a collective.

Metric: rel(a, b) = ‖a − b‖₂ / ‖b‖₂ (tests/helpers.py), b the unsplit (or torch's) value; |a − b| / |b| for a
loss.
"""
import numpy as np
import pytest
import torch
from hypothesis import Phase, given, settings, strategies as st

import tinyllm as tl
from helpers import rel, spread_weights
from tinyllm.distributed.tensor_parallel import deparallelize, gather_parameters, parallelize
from tinyllm.graph import toposort
from tinyllm.models.gpt import GPT, GPTConfig
from tinyllm.models.llama import Llama, LlamaConfig
from tinyllm.optim import AdamW
from tinyllm.realizer import realize
from tinyllm.rewrite import tensor_parallel as rewrite, tracing
from tinyllm.rewrite.pipeline import before_differentiation

import torch_nanogpt as torch_ref

pytestmark = pytest.mark.usefixtures("one_torch_thread", "numpy_runtime")

RTOL = 1e-5        # the split graph sums each product in two partial sums: float32 rounding, measured ≤ 2e-6
TORCH_RTOL = 1e-4  # against torch's kernels (tests/test_gpt_parity.py's gradient tolerance)


@pytest.fixture(scope="module")
def numpy_runtime():
    """The NumPy runtime unless a test picks one: it compiles nothing, so the many small shapes cost no builds."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TINYLLM_RUNTIME", "numpy")
        yield


def agree(dist, failures):
    """Assert, on every rank, that no rank failed."""
    everyone = dist.process_group.comm().allgather(failures)
    assert not any(everyone), "\n".join(f"rank {r}: {f}" for r, fs in enumerate(everyone) for f in fs)


def make_pair(seed, **cfg):
    """An unsplit GPT and a parallelized one with the same weights (spread: O(1) values through every GELU and
    softmax), the same on every rank."""
    ref = GPT(GPTConfig(dropout=0.0, **cfg))
    spread_weights(ref, seed)
    model = GPT(GPTConfig(dropout=0.0, **cfg))
    model.load_state_dict(ref.state_dict())
    return ref, parallelize(model)


def rank_block(style, groups, shape, world, rank):
    """(axis, indices) of this rank's block of a split parameter: its block of each of the groups."""
    axis = 0 if style == rewrite.COLWISE else 1
    per_group = shape[axis] // groups
    b = per_group // world
    return axis, np.concatenate([np.arange(g * per_group + rank * b, g * per_group + (rank + 1) * b)
                                 for g in range(groups)])


def compare_grads(ref, model, world, rank):
    """Failures: a split parameter's gradient against the unsplit one's in this rank's block (zero elsewhere), a
    replicated one's whole."""
    fails, marks = [], rewrite.marked()
    for (name, p0), (_, p1) in zip(ref.named_parameters(), model.named_parameters()):
        want, got = p0.grad.numpy(), p1.grad.numpy()
        if p1 in marks:
            axis, idx = rank_block(*marks[p1], want.shape, world, rank)
            err = rel(np.take(got, idx, axis), np.take(want, idx, axis))
            if np.any(np.delete(got, idx, axis) != 0):
                fails.append(f"{name}: gradient outside this rank's block is not zero")
        else:
            err = rel(got, want)
        if not err <= RTOL:
            fails.append(f"{name}: gradient rel err {err:.2e} > {RTOL}")
    return fails


def counts(root):
    """The ops of root's graph, its SHRINKs of marked parameters, its FLASH_ATTN nodes."""
    order = toposort([root])
    ops = [n.op for n in order]
    weights = {p.node for p in rewrite.marked()}
    shrinks = 0
    for n in order:
        if n.op == "SHRINK":
            base = n.src[0]
            while base.op == "RESHAPE" and base.buffer is None:
                base = base.src[0]
            shrinks += base in weights
    return ops, shrinks, [n for n in order if n.op == "FLASH_ATTN"]


# no shrinking: it is timed, so the ranks may shrink along different paths, and their collectives would no longer
# pair up (a hang until the conftest's timeout); a failure reports the first failing example as drawn
@settings(max_examples=8, phases=(Phase.explicit, Phase.generate))
@given(batch=st.integers(1, 3), seq=st.integers(1, 6), n_head=st.sampled_from([2, 4]), head_size=st.integers(2, 4),
       n_layer=st.integers(1, 2), bias=st.booleans(), seed=st.integers(0, 2**16))
def test_split_graph_equals_unsplit(dist, batch, seq, n_head, head_size, n_layer, bias, seed):
    """Loss, logits and every gradient of the per-rank graph against the unsplit graph (and torch's); the rewrite
    fired: one all-reduce and one REPLICATE per attention and per MLP, the weights read through SHRINKs,
    FlashAttention on this rank's heads."""
    world, rank = dist.get_world_size(), dist.get_rank()
    cfg = dict(n_layer=n_layer, n_head=n_head, n_embd=n_head * head_size, block_size=8, vocab_size=13, bias=bias)
    ref, model = make_pair(seed, **cfg)
    rng = np.random.default_rng(seed)
    x, y = rng.integers(0, 13, (batch, seq)), rng.integers(0, 13, (batch, seq))
    fails = []

    _, want = ref(tl.tensor(x), tl.tensor(y))
    want.backward()
    _, loss = model(tl.tensor(x), tl.tensor(y))
    ops, shrinks, flash = counts(before_differentiation(loss.node))
    loss.backward()
    err = abs(loss.item() - want.item()) / abs(want.item())
    if not err <= RTOL:
        fails.append(f"loss rel err {err:.2e}")
    fails += compare_grads(ref, model, world, rank)

    expected = {"ALLREDUCE": 2 * n_layer, "REPLICATE": 2 * n_layer}
    found = {op: ops.count(op) for op in expected}
    if found != expected:
        fails.append(f"collectives in the rewritten graph: {found}, expected {expected}")
    if shrinks != (6 if bias else 4) * n_layer:  # c_attn, c_fc (and their biases), attn.c_proj, mlp.c_proj
        fails.append(f"{shrinks} SHRINKs of split weights, expected {(6 if bias else 4) * n_layer}")
    if len(flash) != n_layer or any(f.src[0].shape[1] != n_head // world for f in flash):
        fails.append(f"FLASH_ATTN on this rank's {n_head // world} heads: {[f.src[0].shape for f in flash]}")

    logits, _ = model(tl.tensor(x))  # inference: the values stage rewrites the realized graph
    ref_logits, _ = ref(tl.tensor(x))
    if not rel(logits.numpy(), ref_logits.numpy()) <= RTOL:
        fails.append(f"inference logits rel err {rel(logits.numpy(), ref_logits.numpy()):.2e}")

    tmodel = torch_ref.GPT(torch_ref.GPTConfig(dropout=0.0, **cfg))
    tmodel.load_state_dict({k: torch.from_numpy(np.array(v.numpy())) for k, v in ref.state_dict().items()})
    _, tloss = tmodel(torch.from_numpy(x), torch.from_numpy(y))
    tloss.backward()
    if not abs(loss.item() - tloss.item()) <= TORCH_RTOL * abs(tloss.item()):
        fails.append(f"loss {loss.item()} against torch's {tloss.item()}")
    tgrads, marks = dict(tmodel.named_parameters()), rewrite.marked()
    for name, p in model.named_parameters():
        got, want = p.grad.numpy(), tgrads[name].grad.numpy()
        if p in marks:
            axis, idx = rank_block(*marks[p], want.shape, world, rank)
            got, want = np.take(got, idx, axis), np.take(want, idx, axis)
        if not rel(got, want) <= TORCH_RTOL:
            fails.append(f"{name}: gradient rel err against torch {rel(got, want):.2e}")
    agree(dist, fails)


def test_llama_split(dist):
    """A Llama (grouped-query attention, rotary embeddings, SwiGLU): the same loss and gradients split as unsplit."""
    world, rank = dist.get_world_size(), dist.get_rank()
    cfg = LlamaConfig(vocab_size=11, hidden_size=16, intermediate_size=12, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8)
    ref, model = Llama(cfg), Llama(cfg)
    rng = np.random.default_rng(3)
    ref.load_state_dict({k: rng.normal(0, 0.5, v.shape).astype(np.float32) for k, v in ref.state_dict().items()})
    model.load_state_dict(ref.state_dict())
    parallelize(model)
    x, y = rng.integers(0, 11, (2, 5)), rng.integers(0, 11, (2, 5))
    _, want = ref(tl.tensor(x), tl.tensor(y))
    want.backward()
    _, loss = model(tl.tensor(x), tl.tensor(y))
    ops, _, _ = counts(before_differentiation(loss.node))
    loss.backward()
    fails = compare_grads(ref, model, world, rank)
    if not abs(loss.item() - want.item()) <= RTOL * abs(want.item()):
        fails.append(f"loss {loss.item()} against unsplit {want.item()}")
    if ops.count("ALLREDUCE") != 2:
        fails.append(f"{ops.count('ALLREDUCE')} ALLREDUCEs, expected 2 (attention, MLP)")
    agree(dist, fails)


@pytest.mark.parametrize("runtime", ["numpy", "c"])
def test_adamw_steps(dist, runtime, monkeypatch):
    """A few AdamW steps: the same losses with tensor parallelism as without; after gather_parameters every rank
    holds the unsplit run's parameters, bit for bit the same on every rank (what rank 0 would save)."""
    from tinyllm.runtime import get
    if runtime == "c" and get("c").lib is None:
        pytest.skip("the C runtime's module was not built (pip install -e .)")
    monkeypatch.setenv("TINYLLM_RUNTIME", runtime)
    ref, model = make_pair(7, n_layer=2, n_head=2, n_embd=8, block_size=8, vocab_size=13)
    opts = [AdamW(m.parameters(), lr=1e-2, weight_decay=0.1) for m in (ref, model)]
    rng = np.random.default_rng(7)
    fails = []
    for step in range(3):
        x, y = rng.integers(0, 13, (2, 6)), rng.integers(0, 13, (2, 6))
        losses = []
        for m, opt in zip((ref, model), opts):
            _, loss = m(tl.tensor(x), tl.tensor(y))
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        if not abs(losses[1] - losses[0]) <= RTOL * abs(losses[0]):
            fails.append(f"{runtime} step {step}: loss {losses[1]} against unsplit {losses[0]}")
    gather_parameters(model)
    for (name, p0), (_, p1) in zip(ref.named_parameters(), model.named_parameters()):
        got, want = p1.numpy(), p0.numpy()
        if name.endswith("c_attn.bias"):  # q's and v's: the key bias's gradient is zero in exact arithmetic (a
            n = len(want) // 3            # shift of a row's scores), so AdamW makes full steps of its float noise
            got, want = np.delete(got, np.s_[n:2 * n]), np.delete(want, np.s_[n:2 * n])
        if not rel(got, want) <= RTOL:
            fails.append(f"{runtime} {name}: gathered parameter rel err {rel(got, want):.2e}")
    mine = [p.numpy().tobytes() for p in model.parameters()]
    if any(theirs != mine for theirs in dist.process_group.comm().allgather(mine)):
        fails.append(f"{runtime}: after gather_parameters the ranks' parameters differ")
    agree(dist, fails)


def test_generate(dist):
    """Greedy generation (no_grad, replayed steps) gives the unsplit model's tokens, with and without the cache;
    the MLPs are split in both, the attention only without the cache (the cache's keys and values leave the graph
    as roots: their regions are left whole)."""
    ref, model = make_pair(11, n_layer=2, n_head=2, n_embd=8, block_size=16, vocab_size=13)
    idx = tl.tensor(np.array([[1, 2, 3], [4, 5, 6]]))
    fails = []
    for use_cache, want in ((False, {"split": 4}), (True, {"split": 2, "left_whole": 2})):
        with tracing() as fired:
            tokens = model.generate(idx, 5, temperature=0, use_cache=use_cache).numpy()
        expected = ref.generate(idx, 5, temperature=0, use_cache=use_cache).numpy()
        if not np.array_equal(tokens, expected):
            fails.append(f"use_cache={use_cache}: tokens {tokens.tolist()}, unsplit {expected.tolist()}")
        rules = [f.rule for f in fired if f.pass_name == "tensor_parallel"]
        first = {r: rules[:4].count(r) for r in set(rules[:4])}  # the first realized forward's regions
        if first != want:
            fails.append(f"use_cache={use_cache}: regions {first}, expected {want}")
    agree(dist, fails)


class GatedMLP(tl.nn.Module):
    """proj(gelu(fc(x)) · gate(x)) with only fc and proj split: gate(x) is computed whole on every rank and sliced
    inside the region."""
    def __init__(self, c):
        self.fc, self.gate, self.proj = tl.nn.Linear(c, 4 * c), tl.nn.Linear(c, 4 * c), tl.nn.Linear(4 * c, c)

    def forward(self, x):
        return self.proj(tl.nn.functional.gelu(self.fc(x)) * self.gate(x))


def test_whole_value_inside_region(dist):
    """A value computed whole (an unsplit layer's output) and read inside a region enters through REPLICATE: its
    gradient, and its weights', are complete on every rank, as unsplit."""
    world, rank = dist.get_world_size(), dist.get_rank()
    rng = np.random.default_rng(5)
    ref, mlp = GatedMLP(4), GatedMLP(4)
    ref.load_state_dict({k: rng.normal(0, 0.5, v.shape).astype(np.float32) for k, v in ref.state_dict().items()})
    mlp.load_state_dict(ref.state_dict())
    for p in (mlp.fc.weight, mlp.fc.bias):
        rewrite.mark(p, rewrite.COLWISE)
    rewrite.mark(mlp.proj.weight, rewrite.ROWWISE)
    x = rng.normal(0, 1, (3, 4)).astype(np.float32)
    xs = [tl.tensor(x, requires_grad=True) for _ in range(2)]
    for m, xt in zip((ref, mlp), xs):
        (m(xt) ** 2).sum().backward()
    fails = compare_grads(ref, mlp, world, rank)
    if not rel(xs[1].grad.numpy(), xs[0].grad.numpy()) <= RTOL:
        fails.append(f"input gradient rel err {rel(xs[1].grad.numpy(), xs[0].grad.numpy()):.2e}")
    agree(dist, fails)


def test_unsplittable_region_left_whole(dist):
    """A region whose sharded value leaves the graph (here: the MLP's hidden activations as a second root) is
    computed unsplit, and the values are still right; a model not parallelized is not rewritten."""
    ref, model = make_pair(1, n_layer=1, n_head=2, n_embd=4, block_size=8, vocab_size=13)
    x = tl.tensor(np.arange(6).reshape(1, 6) % 13)
    block = model.transformer.h[0]
    h = block.mlp.c_fc(block.ln_2(model.transformer.wte(x)))
    out = block.mlp.c_proj(h)
    new = rewrite.tensor_parallel_pass([out.node, h.node])
    ops = [n.op for n in toposort(new)]
    fails = [] if ops.count("ALLREDUCE") == 0 else [f"the MLP was split though its hidden value is a root: {ops}"]
    alone = rewrite.tensor_parallel_pass([out.node])
    if [n.op for n in toposort(alone)].count("ALLREDUCE") != 1:
        fails.append("the MLP alone was not split")
    realize(out, h)  # both roots in one realize: the values stage leaves the MLP whole
    r = ref.transformer.h[0]
    want = r.mlp.c_proj(r.mlp.c_fc(r.ln_2(ref.transformer.wte(x))))
    if not rel(out.numpy(), want.numpy()) <= RTOL:
        fails.append(f"values rel err {rel(out.numpy(), want.numpy()):.2e}")
    plain = ref.transformer.h[0].mlp(tl.tensor(np.ones((1, 2, 4), np.float32)))
    if rewrite.tensor_parallel_pass([plain.node])[0] is not plain.node:
        fails.append("a model that is not parallelized was rewritten")
    deparallelize(model)
    if rewrite.tensor_parallel_pass([out.node])[0] is not out.node:
        fails.append("deparallelize left the model's weights marked")
    agree(dist, fails)


def test_uneven_split_errors(dist):
    """parallelize refuses heads or an MLP width that do not split evenly over the ranks, naming the size."""
    world = dist.get_world_size()
    gpt = GPT(GPTConfig(n_layer=1, n_head=3, n_embd=6, block_size=4, vocab_size=5))
    with pytest.raises(ValueError, match=rf"n_head = 3 does not split over {world} ranks"):
        parallelize(gpt)
    cfg = LlamaConfig(vocab_size=5, hidden_size=8, intermediate_size=5, num_hidden_layers=1, num_attention_heads=2,
                      max_position_embeddings=4)
    with pytest.raises(ValueError, match=rf"intermediate_size = 5 does not split over {world} ranks"):
        parallelize(Llama(cfg))
    with pytest.raises(TypeError, match="Linear declares no tp_plan"):
        parallelize(tl.nn.Linear(2, 2))
    marks = rewrite.marked()
    assert not any(p in marks for p in gpt.parameters()), "a refused model's weights were marked"
