"""ZeroRedundancyOptimizer (ZeRO-1) on 2 ranks, run by tests/test_distributed.py under mpirun, on the NumPy and
C runtimes. The reference is computed on every rank inside the test: one process's plain optimizer on the full
batch, from rank 0's initial weights. Each check gathers its verdict to every rank and asserts there, so a failure
on one rank fails the test on both and never leaves the other waiting in a collective."""
import gc

import numpy as np
import pytest

import tinyllm as tl
from tinyllm import nn, optim
from tinyllm.distributed import ZeroRedundancyOptimizer
from tinyllm.distributed import process_group as pg

# float32 AdamW in the same arithmetic; the averaged gradient is summed in another order than the full batch's
# (two half-batch means, then halved), ~1 ulp per step, which AdamW's m/√v can amplify where v is tiny
TOL = dict(rtol=1e-5, atol=1e-6)
STEPS = 5
# 93 elements in buckets of >= 93 / Optimizer.CHUNKS: each weight alone (9·3 = 27, odd: a padded shard), both
# biases (9 + 3) in one flat bucket
BATCH, D_IN, D_HID, D_OUT = 8, 6, 9, 3


@pytest.fixture(scope="module", params=["numpy", "c"])
def runtime(request):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TINYLLM_RUNTIME", request.param)
        yield request.param


def agree(dist, check):
    """Run check() (which asserts) on every rank; every rank then fails with every rank's message if one failed."""
    try:
        check()
        message = None
    except Exception as e:
        message = f"{type(e).__name__}: {e}"
    messages = dist.process_group.comm().allgather(message)
    failed = [f"rank {r}: {m}" for r, m in enumerate(messages) if m is not None]
    assert not failed, "\n".join(failed)


def model(seed, d_hid=D_HID):
    tl.manual_seed(seed)
    return nn.Sequential(nn.Linear(D_IN, d_hid), nn.Tanh(), nn.Linear(d_hid, D_OUT))


def groups(m, weight_decay=0.1):
    """GPT.configure_optimizers' two groups: decay on matrices, none on biases."""
    ps = list(m.parameters())
    return [{"params": [p for p in ps if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in ps if p.ndim < 2], "weight_decay": 0.0}]


def batch(step):
    rng = np.random.default_rng(100 + step)
    return rng.standard_normal((BATCH, D_IN)).astype(np.float32), rng.standard_normal((BATCH, D_OUT)).astype(np.float32)


def train_step(m, opt, x, y, scheduler=None, clip=None):
    opt.zero_grad()
    ((m(tl.tensor(x)) - tl.tensor(y)) ** 2).mean().backward()
    if clip:
        clip()
    opt.step()
    if scheduler is not None:
        scheduler.step()


def half(dist, a):
    n = a.shape[0] // dist.get_world_size()
    return a[dist.get_rank() * n:(dist.get_rank() + 1) * n]


def arrays(m):
    return [p.numpy().copy() for p in m.parameters()]


def schedule(step):
    return [1.0, 0.5, 2.0, 0.25, 1.5, 1.0, 1.0][step]  # lr changes every step: it must reach the inner optimizer


@pytest.mark.parametrize("optimizer_class,options,clip", [(optim.AdamW, dict(lr=0.05), None),
                                                          (optim.AdamW, dict(lr=0.05), 0.9),
                                                          (optim.SGD, dict(lr=0.05, momentum=0.9), None)])
def test_matches_one_process_on_the_full_batch(dist, runtime, optimizer_class, options, clip):
    """Each rank's half batch through ZeRO-1 = one process's optimizer on the whole batch, with two param groups
    (one without weight decay), an LR schedule and, where `clip`, gradient clipping of the mean gradient; the
    parameters start as rank 0's (rank 1 starts elsewhere)."""
    ref = model(0)
    ref_opt = optimizer_class(groups(ref), **options)
    ref_sched = optim.LambdaLR(ref_opt, schedule)
    zm = model(dist.get_rank())  # rank 1's own initial weights: the broadcast must replace them
    zopt = ZeroRedundancyOptimizer(groups(zm), optimizer_class=optimizer_class, **options)
    zsched = optim.LambdaLR(zopt, schedule)
    start = arrays(zm)
    agree(dist, lambda: [np.testing.assert_array_equal(a, b) for a, b in zip(start, arrays(ref))])
    norms, ref_norms = [], []
    for step in range(STEPS):
        x, y = batch(step)
        train_step(ref, ref_opt, x, y, ref_sched,
                   clip=clip and (lambda: ref_norms.append(nn.clip_grad_norm_(ref.parameters(), clip).item())))
        train_step(zm, zopt, half(dist, x), half(dist, y), zsched,
                   clip=clip and (lambda: norms.append(zopt.clip_grad_norm_(clip).item())))
    got, want = arrays(zm), arrays(ref)
    agree(dist, lambda: [np.testing.assert_allclose(g, w, **TOL) for g, w in zip(got, want)])
    agree(dist, lambda: [np.testing.assert_(not np.array_equal(g, s), "a parameter did not move")
                         for g, s in zip(got, start)])
    agree(dist, lambda: np.testing.assert_allclose(norms, ref_norms, **TOL))
    assert not clip or max(norms) > clip > min(norms)  # it clipped in some steps, not in others
    assert zopt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"]


def test_ranks_stay_bit_identical(dist, runtime):
    m = model(dist.get_rank())
    opt = ZeroRedundancyOptimizer(groups(m), lr=0.05)
    for step in range(3):
        x, y = batch(step)
        train_step(m, opt, half(dist, x), half(dist, y))
    everyone = pg.comm().allgather(arrays(m))

    def check():
        for r in range(1, dist.get_world_size()):
            for a, b in zip(everyone[0], everyone[r]):
                np.testing.assert_array_equal(a, b, err_msg=f"rank 0 and rank {r} differ")
    agree(dist, check)


def test_jit_replays_the_step(dist, runtime):
    """Under tinyllm.jit (replayed from the 4th call) with clipping and an LR schedule that changes the lr every
    step, the same parameters as eager steps, bit for bit."""
    result = []
    for jit in (False, True):
        m = model(0)
        opt = ZeroRedundancyOptimizer(groups(m), lr=0.05)
        sched = optim.LambdaLR(opt, schedule)

        def step(x, y):
            opt.zero_grad()
            loss = ((m(x) - y) ** 2).mean()
            loss.backward()
            opt.clip_grad_norm_(0.9)
            opt.step()
            return loss
        fn = tl.jit(step) if jit else step
        for i in range(6):
            x, y = batch(i)
            fn(tl.tensor(half(dist, x)), tl.tensor(half(dist, y)))
            sched.step()
        result.append(arrays(m))
    agree(dist, lambda: [np.testing.assert_array_equal(j, e) for j, e in zip(result[1], result[0])])


def state_elements(opt):
    return sum(v.numel() for s in opt.state.values() for v in s.values() if isinstance(v, tl.Tensor))


def state_bytes(m, make):
    """memory_allocated() after the optimizer's construction and first step minus before both: the memory the
    optimizer holds (the gradients exist before; the parameters are replaced by as many new ones)."""
    x, y = batch(0)
    ((m(tl.tensor(half(pg, x))) - tl.tensor(half(pg, y))) ** 2).mean().backward()
    tl.realize(*[p.grad for p in m.parameters()])
    gc.collect()
    before = tl.memory_allocated()
    tl.reset_peak_memory_stats()
    opt = make(m)
    opt.step()
    gc.collect()
    return opt, tl.memory_allocated() - before, tl.max_memory_allocated() - before


def test_state_is_sharded(dist, runtime):
    """Per rank, the AdamW moments of 1/world of the elements (plus padding), counted exactly and measured."""
    world = dist.get_world_size()
    shapes = [p.shape for p in model(0, d_hid=300).parameters()]
    plain, plain_bytes, plain_peak = state_bytes(model(0, d_hid=300), lambda m: optim.AdamW(groups(m)))
    zero, zero_bytes, zero_peak = state_bytes(model(0, d_hid=300), lambda m: ZeroRedundancyOptimizer(groups(m)))
    n = sum(int(np.prod(s)) for s in shapes)
    buckets = [sum(p.numel() for p in b.params) for b in zero._buckets]
    assert state_elements(plain) == 2 * n
    assert sum(buckets) == n and state_elements(zero.optim) == 2 * sum(-(-k // world) for k in buckets)
    print(f"\n[{runtime}] rank {dist.get_rank()}: AdamW state after construction and the first step {plain_bytes} B "
          f"(peak +{plain_peak} B), ZeRO-1 {zero_bytes} B (peak +{zero_peak} B), ratio {zero_bytes / plain_bytes:.3f}")
    agree(dist, lambda: np.testing.assert_array_less(zero_bytes, 0.55 * plain_bytes))
    agree(dist, lambda: np.testing.assert_array_less(0.45 * plain_bytes, zero_bytes))  # it did measure the moments


def test_state_dict_round_trip(dist, runtime):
    """consolidate_state_dict(to=0) then state_dict() on rank 0 is plain AdamW's state on the full batch; loaded
    into a new ZeRO optimizer on every rank, training goes on exactly as the original's does."""
    ref = model(0)
    ref_opt = optim.AdamW(groups(ref), lr=0.05)
    m = model(0)
    opt = ZeroRedundancyOptimizer(groups(m), lr=0.05)
    for step in range(3):
        x, y = batch(step)
        train_step(ref, ref_opt, x, y)
        train_step(m, opt, half(dist, x), half(dist, y))
    opt.consolidate_state_dict(to=0)
    saved = []

    def consolidated():
        if dist.get_rank() != 0:
            with pytest.raises(RuntimeError, match="not been consolidated on rank 1"):
                opt.state_dict()
            return
        sd = opt.state_dict()
        saved.append({"state": {i: {k: v.numpy() if isinstance(v, tl.Tensor) else v for k, v in s.items()}
                                for i, s in sd["state"].items()}, "param_groups": sd["param_groups"]})
        plain = opt.consolidated()  # the unsharded AdamW a checkpoint writer reads optimizer.state[p] of
        assert type(plain) is optim.AdamW and [g["weight_decay"] for g in plain.param_groups] == [0.1, 0.0]
        ps = [p for g in opt.param_groups for p in g["params"]]
        for i, p in enumerate(ps):  # its own copy of the state, the step an int again
            assert plain.state[p] is not sd["state"][i] and plain.state[p]["step"] == sd["state"][i]["step"].item() == 3
            for k in ("exp_avg", "exp_avg_sq"):
                np.testing.assert_array_equal(plain.state[p][k].numpy(), sd["state"][i][k].numpy())
    agree(dist, consolidated)
    sd = saved[0] if saved else None
    sd = pg.comm().bcast(sd, root=0)

    def matches_reference():
        ps = list(ref.parameters())
        ids = [p for g in ref_opt.param_groups for p in g["params"]]
        assert sorted(sd["state"]) == list(range(len(ps)))
        for i, p in enumerate(ids):
            want = ref_opt.state[p]
            assert sd["state"][i]["step"] == want["step"] == 3  # (a 0-d float32 as torch's: equal to 3)
            for k in ("exp_avg", "exp_avg_sq"):
                np.testing.assert_allclose(sd["state"][i][k], want[k].numpy(), **TOL, err_msg=f"param {i} {k}")
        assert [g["weight_decay"] for g in sd["param_groups"]] == [0.1, 0.0]
        assert [g["params"] for g in sd["param_groups"]] == [[0, 1], [2, 3]]
    agree(dist, matches_reference)

    def resumed(load):
        """A new model and ZeRO optimizer (other weights and options to begin with) given the saved state."""
        m2 = model(1)
        for p2, p in zip(m2.parameters(), m.parameters()):
            p2.copy_(p)
        opt2 = ZeroRedundancyOptimizer(groups(m2, weight_decay=0.5), lr=1.0)
        load(m2, opt2)
        assert [g["weight_decay"] for g in opt2.param_groups] == [0.1, 0.0] and opt2.param_groups[0]["lr"] == 0.05
        return m2, opt2

    def from_plain(m3, opt3):
        """As examples/gpt.py resumes: an unsharded AdamW's state restored per parameter, then sharded."""
        plain = optim.AdamW(groups(m3), lr=0.05)
        ps = [p for g in plain.param_groups for p in g["params"]]
        plain.state = {ps[i]: {k: tl.tensor(v) if isinstance(v, np.ndarray) else v for k, v in e.items()}
                       for i, e in sd["state"].items()}
        opt3.load_consolidated(plain)

    m2, opt2 = resumed(lambda m2, opt2: opt2.load_state_dict(sd))
    m3, opt3 = resumed(from_plain)
    for step in range(3, 5):
        x, y = batch(step)
        for mi, opti in ((m, opt), (m2, opt2), (m3, opt3)):
            train_step(mi, opti, half(dist, x), half(dist, y))
    got, got3, want = arrays(m2), arrays(m3), arrays(m)
    agree(dist, lambda: [np.testing.assert_array_equal(g, w) for g, w in zip(got + got3, want + want)])


def test_errors(dist, monkeypatch):
    m = model(0)
    with pytest.raises(TypeError, match="optimizer_class must be a tinyllm.optim.Optimizer subclass"):
        ZeroRedundancyOptimizer(m.parameters(), optimizer_class=dict)
    with pytest.raises(ValueError, match="ZeroRedundancyOptimizer: got an empty parameter list"):
        ZeroRedundancyOptimizer([])
    opt = ZeroRedundancyOptimizer(m.parameters())
    with pytest.raises(ValueError, match="consolidate_state_dict: to=2 is not a rank"):
        opt.consolidate_state_dict(to=2)
    with pytest.raises(ValueError, match=r"load_consolidated: the optimizer's param groups hold other parameters"):
        opt.load_consolidated(optim.AdamW(model(0).parameters()))
    monkeypatch.setattr(pg, "_comm", None)
    with pytest.raises(RuntimeError, match="ZeroRedundancyOptimizer: the process group is not initialized"):
        ZeroRedundancyOptimizer(m.parameters())
