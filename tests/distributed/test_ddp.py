"""DistributedDataParallel on 2 ranks: the same training as one process on the whole batch, ranks bit-identical,
weights broadcast at wrap time, gradient accumulation with no_sync, buckets, and the schedule's overlap."""
import numpy as np
import pytest

import tinyllm as tl
from tinyllm.models.gpt import GPT, GPTConfig
from tinyllm.nn.parallel import DistributedDataParallel as DDP

CONFIG = dict(block_size=8, vocab_size=16, n_layer=2, n_head=2, n_embd=16, dropout=0.0)
B = 4


def gathered(dist, array):
    """Every rank's `array`, on every rank."""
    out = [tl.zeros(array.size) for _ in range(dist.get_world_size())]
    dist.all_gather(out, tl.tensor(array.ravel().astype(np.float32)))
    return [o.numpy() for o in out]


def flat(model):
    return np.concatenate([p.numpy().ravel() for p in model.parameters()])


def batches(steps):
    rng = np.random.default_rng(7)
    return [(rng.integers(0, 16, (B, 8)), rng.integers(0, 16, (B, 8))) for _ in range(steps)]


@pytest.mark.parametrize("runtime", ["numpy", "c"])
def test_equals_one_process_on_the_whole_batch(dist, runtime, monkeypatch):
    """2 ranks × B/2 rows, 5 AdamW steps, against this rank training alone on all B rows from the same start: the
    losses (averaged over ranks) and weights agree to 1e-5; the ranks' weights are bit-identical. On C the backward
    pass with its all-reduces replays as a recorded program from the third step on (c_program.py)."""
    from tinyllm.runtime.c import program as c_program
    replayed, run = [], c_program.Program.run

    def spy(self, runtime, schedule, *args, **kwargs):
        if any(k.op == "IALLREDUCE" for k in schedule.kernels):
            replayed.append(schedule)
        return run(self, runtime, schedule, *args, **kwargs)
    monkeypatch.setattr(c_program.Program, "run", spy)
    r, w = dist.get_rank(), dist.get_world_size()
    tl.manual_seed(0)
    ref = GPT(GPTConfig(**CONFIG)).to(runtime)
    tl.manual_seed(0)
    model = GPT(GPTConfig(**CONFIG)).to(runtime)
    ddp = DDP(model, bucket_cap_mb=0.004)  # several buckets
    assert len(ddp._buckets) > 2
    opt, opt_ref = model.configure_optimizers(0.1, 1e-3), ref.configure_optimizers(0.1, 1e-3)
    rows = slice(r * B // w, (r + 1) * B // w)
    for x, y in batches(5):
        _, loss = ddp(tl.tensor(x[rows], device=runtime), tl.tensor(y[rows], device=runtime))
        loss.backward()
        opt.step()
        opt.zero_grad()
        _, loss_ref = ref(tl.tensor(x, device=runtime), tl.tensor(y, device=runtime))
        loss_ref.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        mean = tl.tensor([loss.item()], device=runtime)
        dist.all_reduce(mean, dist.ReduceOp.AVG)
        assert mean.item() == pytest.approx(loss_ref.item(), rel=1e-5)
    a, b = flat(model), flat(ref)
    assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max()
    ranks = gathered(dist, a)
    assert all(np.array_equal(ranks[0], x) for x in ranks)
    assert len(replayed) == (3 if runtime == "c" else 0)


def test_jit_replays_the_step(dist, monkeypatch):
    """Under tinyllm.jit on C (the step chained from its recorded programs, all-reduces included, from the 4th
    call), the same parameters as eager DDP steps, bit for bit, on every rank."""
    from tinyllm.runtime.c import chain as c_chain
    r, w = dist.get_rank(), dist.get_world_size()
    rows = slice(r * B // w, (r + 1) * B // w)
    result, chained, run = [], [], c_chain.Chain.run

    def spy(self, *args):
        out = run(self, *args)
        chained.append(out is not None)
        return out
    monkeypatch.setattr(c_chain.Chain, "run", spy)
    for jit in (False, True):
        tl.manual_seed(0)
        model = GPT(GPTConfig(**CONFIG)).to("c")
        ddp = DDP(model, bucket_cap_mb=0.004)
        opt = model.configure_optimizers(0.1, 1e-3)

        def step(x, y):
            _, loss = ddp(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        fn = tl.jit(step) if jit else step
        for x, y in batches(6):
            fn(tl.tensor(x[rows], device="c"), tl.tensor(y[rows], device="c"))
        result.append(flat(model))
    assert chained and all(chained)
    assert np.array_equal(result[0], result[1])
    ranks = gathered(dist, result[1])
    assert all(np.array_equal(ranks[0], x) for x in ranks)


def test_wrap_broadcasts_rank_0s_weights(dist):
    tl.manual_seed(dist.get_rank())  # different weights on each rank
    model = GPT(GPTConfig(**CONFIG))
    before = flat(model)
    DDP(model)
    ranks = gathered(dist, flat(model))
    assert all(np.array_equal(ranks[0], x) for x in ranks)
    assert np.array_equal(flat(model), before) == (dist.get_rank() == 0)


def test_no_sync_accumulates_then_averages(dist):
    """Two micro-batches, the first under no_sync: the gradients equal the mean over ranks of each rank's summed
    gradients, i.e. what one process gets by accumulating both micro-batches of every rank."""
    r, w = dist.get_rank(), dist.get_world_size()
    tl.manual_seed(0)
    model = GPT(GPTConfig(**CONFIG))
    ddp = DDP(model)
    (x1, y1), (x2, y2) = batches(2)
    rows = slice(r * B // w, (r + 1) * B // w)
    with ddp.no_sync():
        ddp(tl.tensor(x1[rows]), tl.tensor(y1[rows]))[1].backward()
    local = {id(p): p.grad.numpy().copy() for p in model.parameters()}
    ranks_local = gathered(dist, np.concatenate([g.ravel() for g in local.values()]))
    assert not np.array_equal(ranks_local[0], ranks_local[1])  # unsynced: each rank its own gradients
    ddp(tl.tensor(x2[rows]), tl.tensor(y2[rows]))[1].backward()
    tl.manual_seed(0)
    ref = GPT(GPTConfig(**CONFIG))
    for x, y in ((x1, y1), (x2, y2)):
        for k in range(w):  # every rank's rows, each loss weighted 1/w: the mean over ranks of the sums
            part = slice(k * B // w, (k + 1) * B // w)
            (ref(tl.tensor(x[part]), tl.tensor(y[part]))[1] * (1.0 / w)).backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_buckets_in_reverse_order_and_capped(dist):
    model = GPT(GPTConfig(**CONFIG))
    params = list(model.parameters())
    ddp = DDP(model, bucket_cap_mb=2048 / 2 ** 20)  # 2 KiB buckets
    order = [p for b in ddp._buckets for p in b]
    assert [id(p) for p in order] == [id(p) for p in reversed(params)]
    for b in ddp._buckets:
        assert len(b) == 1 or sum(p.numel() * 4 for p in b) <= 2048
    wide = GPT(GPTConfig(**{**CONFIG, "n_embd": 128}))  # 1.7 MB of weights
    big = DDP(wide)  # torch's 25 MB, but the bucket reduced last holds at most 1 MB
    assert len(big._buckets) == 2 and sum(p.numel() * 4 for p in big._buckets[-1]) <= 2 ** 20
    assert [id(p) for b in big._buckets for p in b] == [id(p) for p in reversed(list(wide.parameters()))]


def test_allreduces_overlap_the_backward_pass(dist, monkeypatch):
    """In the backward's schedule the work that only a bucket's all-reduce needs (its weight gradients, their
    copies into the bucket, the IALLREDUCE) runs as soon as its inputs exist: between a kernel of that work and its
    latest input runs nothing but such work. The first all-reduce starts before the backward pass's last matmul,
    and every WAIT comes after it."""
    from tinyllm.graph import consumers
    from tinyllm.runtime.numpy.runtime import NumpyRuntime
    seen = []
    run = NumpyRuntime.run_schedule

    def spy(self, schedule, vals):
        seen.append(list(schedule.kernels))
        return run(self, schedule, vals)
    monkeypatch.setattr(NumpyRuntime, "run_schedule", spy)
    model = GPT(GPTConfig(**CONFIG)).to("numpy")
    ddp = DDP(model, bucket_cap_mb=0.004)
    x, y = batches(1)[0]
    ddp(tl.tensor(x[:2], device="numpy"), tl.tensor(y[:2], device="numpy"))[1].backward()
    kernels = next(s for s in seen if any(k.op == "IALLREDUCE" for k in s))
    at, users = {k: i for i, k in enumerate(kernels)}, consumers(kernels)
    ops = [k.op for k in kernels]
    last_matmul = max(i for i, op in enumerate(ops) if op == "MATMUL")
    starts = [k for k in kernels if k.op == "IALLREDUCE"]
    waits = [i for i, op in enumerate(ops) if op == "WAIT"]
    assert len(starts) == len(waits) == len(ddp._buckets)
    assert at[starts[0]] < last_matmul < min(waits)
    only_for_allreduce = set()
    for start in starts:
        own = {start}
        for k in reversed(kernels[:at[start]]):
            if users[k] and all(u in own for u in users[k]):
                own.add(k)
        only_for_allreduce |= own
    late = []
    for k in only_for_allreduce:
        inputs = [at[s] for s in k.src if s in at]
        if inputs and any(j not in only_for_allreduce for j in kernels[max(inputs) + 1:at[k]]):
            late.append(k)
    assert not late


def test_errors(dist):
    with pytest.raises(TypeError, match="tinyllm.nn.Module"):
        DDP(lambda x: x)
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        DDP(GPT(GPTConfig(**CONFIG)), bucket_cap_mb=0)
