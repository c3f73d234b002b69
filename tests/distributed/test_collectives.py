"""The collectives on 2 ranks (run by tests/test_distributed.py under mpirun): torch.distributed's in-place forms
on each runtime, checked against NumPy arithmetic of what every rank contributed (each rank can make every rank's
contribution: it is drawn from a seed and the rank), and the differentiable forms' gradients against the
convention of tinyllm/ops/collective.py. Each check gathers its verdict to every rank and asserts there, so a
failure on one rank fails the test on both and never leaves the other waiting in a collective."""
import numpy as np
import pytest
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

import tinyllm as tl
from tinyllm import dtype as dt
from tinyllm.graph import build
from tinyllm.tensor import Tensor

from tinyllm.distributed import ReduceOp

F32 = dict(rtol=1e-6, atol=1e-7)  # float32 sums of 2 values: one rounding each, in any order
BF16 = dict(rtol=2**-8, atol=0)  # bfloat16: the float32 result rounded once (half an ulp; an ulp for safety)
REDUCE = {ReduceOp.SUM: lambda v: np.sum(v, axis=0), ReduceOp.AVG: lambda v: np.mean(v, axis=0),
          ReduceOp.MAX: lambda v: np.max(v, axis=0)}


def part(rank, shape, seed=0):
    """What `rank` contributes: float32 values, the same wherever it is computed."""
    return np.random.default_rng([seed, rank]).standard_normal(shape).astype(np.float32)


def everyone(dist, shape, seed=0):
    return np.stack([part(r, shape, seed) for r in range(dist.get_world_size())])


def agree(dist, check):
    """Run check() (which asserts) on every rank; every rank then fails with every rank's message if one failed."""
    try:
        check()
        message = None
    except Exception as e:  # an assertion, or an error while reading the result
        message = f"{type(e).__name__}: {e}"
    messages = dist.process_group.comm().allgather(message)
    failed = [f"rank {r}: {m}" for r, m in enumerate(messages) if m is not None]
    assert not failed, "\n".join(failed)


def close(got, want, tol):
    return lambda: np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), **tol)


# ---------------------------------------------------------------------------------------------- in place, per runtime

@pytest.mark.parametrize("op", list(ReduceOp))
def test_all_reduce(dist, each_runtime, op):
    t = tl.tensor(part(dist.get_rank(), (3, 5)))
    same = t
    assert dist.all_reduce(t, op=op) is None
    assert t is same
    agree(dist, close(t.numpy(), REDUCE[op](everyone(dist, (3, 5))), F32))


@pytest.mark.parametrize("op", list(ReduceOp))
def test_all_reduce_bfloat16(dist, each_runtime, op):
    if each_runtime == "wgsl":
        pytest.skip("the WGSL runtime refuses bfloat16 (tests/test_wgsl_runtime.py)")
    values = everyone(dist, (4, 6))
    t = tl.tensor(values[dist.get_rank()]).to(tl.bfloat16)
    stored = dt.decode(dt.encode(values, dt.bfloat16), dt.bfloat16)  # what each rank holds, exactly
    want = dt.decode(dt.encode(REDUCE[op](stored), dt.bfloat16), dt.bfloat16)
    dist.all_reduce(t, op=op)
    agree(dist, lambda: (assert_dtype(t, tl.bfloat16), close(t.float().numpy(), want, BF16)()))


def assert_dtype(t, dtype):
    assert t.dtype is dtype, f"dtype {t.dtype.name}, expected {dtype.name}"


def test_broadcast_from_rank_1(dist, each_runtime):
    t = tl.tensor(part(dist.get_rank(), (2, 7)))
    dist.broadcast(t, src=1)
    agree(dist, close(t.numpy(), part(1, (2, 7)), dict(rtol=0, atol=0)))


def test_all_gather(dist, each_runtime):
    world = dist.get_world_size()
    out = [tl.zeros(3, 4) for _ in range(world)]
    dist.all_gather(out, tl.tensor(part(dist.get_rank(), (3, 4))))
    agree(dist, close(np.stack([o.numpy() for o in out]), everyone(dist, (3, 4)), dict(rtol=0, atol=0)))


def test_all_gather_into_tensor(dist, each_runtime):
    world = dist.get_world_size()
    out = tl.zeros(world * 3, 4)
    dist.all_gather_into_tensor(out, tl.tensor(part(dist.get_rank(), (3, 4))))
    agree(dist, close(out.numpy(), everyone(dist, (3, 4)).reshape(world * 3, 4), dict(rtol=0, atol=0)))


@pytest.mark.parametrize("op", list(ReduceOp))
def test_reduce_scatter(dist, each_runtime, op):
    """Rank r's output: op over the ranks s of their input_list[r] (here part(s, seed=r))."""
    world, rank = dist.get_world_size(), dist.get_rank()
    out = tl.zeros(3, 4)
    dist.reduce_scatter(out, [tl.tensor(part(rank, (3, 4), seed=j)) for j in range(world)], op=op)
    agree(dist, close(out.numpy(), REDUCE[op](everyone(dist, (3, 4), seed=rank)), F32))


@pytest.mark.parametrize("op", list(ReduceOp))
def test_reduce_scatter_tensor(dist, each_runtime, op):
    world, rank = dist.get_world_size(), dist.get_rank()
    out = tl.zeros(2, 5)
    dist.reduce_scatter_tensor(out, tl.tensor(part(rank, (world * 2, 5))), op=op)
    want = REDUCE[op](everyone(dist, (world * 2, 5)))[rank * 2:(rank + 1) * 2]
    agree(dist, close(out.numpy(), want, F32))


@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.AVG])
def test_all_reduce_async(dist, each_runtime, op):
    """async_op=True returns a Work; other work can run before wait(), which writes the all-reduced value."""
    t = tl.tensor(part(dist.get_rank(), (4, 8)))
    work = dist.all_reduce(t, op=op, async_op=True)
    other = (tl.tensor(part(7, (8, 8))) @ tl.tensor(part(8, (8, 8)))).numpy()  # while the all-reduce is in flight
    assert not work.is_completed()
    assert work.wait() is True
    assert work.is_completed()
    agree(dist, lambda: (close(t.numpy(), REDUCE[op](everyone(dist, (4, 8))), F32)(),
                         close(other, part(7, (8, 8)) @ part(8, (8, 8)), dict(rtol=1e-5, atol=1e-5))()))


def test_all_reduce_async_of_an_intermediate_repeated(dist):
    """An async all-reduce of a lazy value (an intermediate of its schedule), with other work replayed before each
    wait(), four times over on C (its schedule recorded on the 2nd run): MPI's input is never overwritten while the
    all-reduce is in flight, so every result is right."""
    rank = dist.get_rank()
    a, b = tl.tensor(part(3, (256, 256)), device="c"), tl.tensor(part(4, (256, 256)), device="c")
    for i in range(4):
        t = tl.tensor(part(rank, (512, 512), seed=i), device="c") * 2.0  # MPI reads it after its schedule ends
        work = dist.all_reduce(t, async_op=True)
        ((a * 3.0 + 1.0) @ (b * 5.0 - 2.0)).realize()  # intermediates in the replay arena
        work.wait()
        want = 2.0 * sum(part(r, (512, 512), seed=i).astype(np.float64) for r in range(dist.get_world_size()))
        agree(dist, close(t.numpy(), want, F32))


def test_bad_index_after_a_collective_in_a_replay(dist):
    """A replayed schedule whose embedding meets a bad index after its all-reduce ran raises the IndexError at
    once, on every rank, rather than rerunning the schedule (which would all-reduce a second time)."""
    table = tl.tensor(part(dist.get_rank(), (5, 3)), device="c")
    for k in (0, 1, 2, 3):
        rows = tl.tensor(np.array([0, 4, 9 if k == 3 else 2]), device="c")
        y = dist.functional.all_reduce(table)[rows]  # the gather reads the all-reduce's output
        if k < 3:
            want = sum(part(r, (5, 3)).astype(np.float64) for r in range(dist.get_world_size()))[[0, 4, 2]]
            agree(dist, close(y.numpy(), want, F32))
        else:  # the 4th run replays the recorded program
            with pytest.raises(IndexError, match="index 9 is out of range for 5 rows"):
                y.realize()
    agree(dist, close(dist.functional.all_reduce(table).numpy(),  # the ranks are still in step
                      sum(part(r, (5, 3)).astype(np.float64) for r in range(dist.get_world_size())), F32))


@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=5), seed=st.integers(0, 2**16))
def test_collectives_over_shapes(dist, shape, seed):
    """all_reduce, all_gather_into_tensor and reduce_scatter_tensor over drawn shapes (the same draws on every
    rank: distributed/conftest.py derandomizes hypothesis), on the default runtime."""
    world, rank = dist.get_world_size(), dist.get_rank()
    rows = (world * shape[0],) + shape[1:]
    parts = everyone(dist, rows, seed)
    reduced, gathered, scattered = tl.tensor(parts[rank]), tl.zeros(world * rows[0], *rows[1:]), tl.zeros(*shape)
    dist.all_reduce(reduced)
    dist.all_gather_into_tensor(gathered, tl.tensor(parts[rank]))
    dist.reduce_scatter_tensor(scattered, tl.tensor(parts[rank]))
    total = parts.sum(0)
    agree(dist, lambda: (close(reduced.numpy(), total, F32)(),
                         close(gathered.numpy(), parts.reshape(gathered.shape), dict(rtol=0, atol=0))(),
                         close(scattered.numpy(), total[rank * shape[0]:(rank + 1) * shape[0]], F32)()))


# --------------------------------------------------------------------------- differentiable forms and their gradients

def test_all_reduce_gradient(dist, each_runtime):
    """y = Σ_r a_r·(r+1), L = Σ y² counted once  ⇒  on rank r  a.grad = 2y·(r+1)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    a = tl.tensor(part(rank, (3, 4)), requires_grad=True)
    y = dist.functional.all_reduce(a * float(rank + 1))
    (y * y).sum().backward()
    want_y = sum(part(r, (3, 4)).astype(np.float64) * (r + 1) for r in range(world))
    agree(dist, lambda: (close(y.numpy(), want_y, F32)(), close(a.grad.numpy(), 2 * want_y * (rank + 1), F32)()))


def test_all_reduce_avg_gradient(dist, each_runtime):
    """y = (1/W) Σ_r a_r, L = Σ y²  ⇒  a.grad = 2y / W on every rank."""
    rank, world = dist.get_rank(), dist.get_world_size()
    a = tl.tensor(part(rank, (5,)), requires_grad=True)
    y = dist.functional.all_reduce(a, ReduceOp.AVG)
    (y * y).sum().backward()
    want_y = everyone(dist, (5,)).astype(np.float64).mean(0)
    agree(dist, lambda: (close(y.numpy(), want_y, F32)(), close(a.grad.numpy(), 2 * want_y / world, F32)()))


def test_replicate_sums_the_ranks_gradients(dist, each_runtime):
    """Megatron's f then g: x the same on every rank, rank r scales it by its own w_r, the results are summed:
    y = x·Σ_r w_r, L = Σ y²  ⇒  x.grad = 2y·Σ_r w_r on every rank (REPLICATE's all-reduce of the partial
    gradients 2y·w_r), as if one process had computed it unsplit."""
    rank = dist.get_rank()
    x_value = part(99, (6,))
    w = everyone(dist, (6,), seed=1)
    x = tl.tensor(x_value, requires_grad=True)
    y = dist.functional.all_reduce(dist.functional.replicate(x) * tl.tensor(w[rank]))
    (y * y).sum().backward()
    w_sum = w.astype(np.float64).sum(0)
    want_y = x_value * w_sum
    agree(dist, lambda: (close(y.numpy(), want_y, F32)(), close(x.grad.numpy(), 2 * want_y * w_sum, F32)()))


def test_replicate_alone(dist, each_runtime):
    """L_r = Σ replicate(x)·w_r on each rank (rank-local losses that add up)  ⇒  x.grad = Σ_r w_r."""
    rank = dist.get_rank()
    w = everyone(dist, (2, 3), seed=2)
    x = tl.tensor(part(5, (2, 3)), requires_grad=True)
    (dist.functional.replicate(x) * tl.tensor(w[rank])).sum().backward()
    agree(dist, close(x.grad.numpy(), w.astype(np.float64).sum(0), F32))


def test_broadcast_gradient(dist, each_runtime):
    """y = a_1 on every rank, L = Σ y·m  ⇒  a.grad = m on rank 1, 0 on rank 0."""
    rank = dist.get_rank()
    a = tl.tensor(part(rank, (4,)), requires_grad=True)
    m = part(50, (4,))
    y = dist.functional.broadcast(a, src=1)
    (y * tl.tensor(m)).sum().backward()
    agree(dist, lambda: (close(y.numpy(), part(1, (4,)), dict(rtol=0, atol=0))(),
                         close(a.grad.numpy(), m if rank == 1 else np.zeros(4), dict(rtol=0, atol=0))()))


def test_all_gather_gradient(dist, each_runtime):
    """y = concat_r a_r (W·2 rows), L = Σ y·m  ⇒  a.grad on rank r = m's r-th block of rows."""
    rank, world = dist.get_rank(), dist.get_world_size()
    a = tl.tensor(part(rank, (2, 3)), requires_grad=True)
    m = part(60, (world * 2, 3))
    y = dist.functional.all_gather(a)
    (y * tl.tensor(m)).sum().backward()
    agree(dist, lambda: (close(y.numpy(), everyone(dist, (2, 3)).reshape(world * 2, 3), dict(rtol=0, atol=0))(),
                         close(a.grad.numpy(), m[rank * 2:(rank + 1) * 2], dict(rtol=0, atol=0))()))


@pytest.mark.parametrize("op", [ReduceOp.SUM, ReduceOp.AVG])
def test_reduce_scatter_gradient(dist, each_runtime, op):
    """y_r = (op_s x_s)'s r-th block, L = Σ_r Σ y_r·m_r (each rank's block its own)  ⇒  x.grad = concat_s m_s on
    every rank (divided by W for AVG)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    x = tl.tensor(part(rank, (world * 2, 3)), requires_grad=True)
    m = [part(70 + s, (2, 3)) for s in range(world)]
    y = dist.functional.reduce_scatter(x, op)
    (y * tl.tensor(m[rank])).sum().backward()
    scale = 1.0 / world if op is ReduceOp.AVG else 1.0
    want_y = REDUCE[op](everyone(dist, (world * 2, 3)))[rank * 2:(rank + 1) * 2]
    agree(dist, lambda: (close(y.numpy(), want_y, F32)(), close(x.grad.numpy(), np.concatenate(m) * scale, F32)()))


def test_max_has_no_gradient(dist):
    """A gradient through ReduceOp.MAX is refused with a message that says to detach (the same on every rank)."""
    a = tl.tensor(part(dist.get_rank(), (3,)), requires_grad=True)
    for y in (dist.functional.all_reduce(a, ReduceOp.MAX),
              dist.functional.reduce_scatter(tl.stack([a, a]).reshape(6), ReduceOp.MAX)):
        with pytest.raises(NotImplementedError, match="detach"):
            y.sum().backward()


def test_bad_arguments(dist):
    """Wrong arguments are refused before anything is sent, with what was expected, on every rank alike."""
    world = dist.get_world_size()
    x = tl.zeros(3, 4)
    with pytest.raises(TypeError, match="ReduceOp"):
        dist.all_reduce(x, op="sum")
    with pytest.raises(ValueError, match=f"0..{world - 1}"):
        dist.broadcast(x, src=world)
    with pytest.raises(ValueError, match=f"needs {world} tensors"):
        dist.all_gather([tl.zeros(3, 4)], x)
    with pytest.raises(ValueError, match="multiple of"):
        dist.functional.reduce_scatter(tl.zeros(world * 2 + 1, 2))
    with pytest.raises(TypeError, match="tinyllm.Tensor"):
        dist.all_reduce(np.zeros(3))


# ---------------------------------------------------------------------------------------- scheduling and zero copy

def test_iallreduce_wait_in_one_realize(dist, each_runtime):
    """An IALLREDUCE and its WAIT realized together with other work give what one ALLREDUCE gives."""
    rank = dist.get_rank()
    x = tl.tensor(part(rank, (4, 6)))
    b = tl.tensor(part(11, (6, 6)))
    started = build("IALLREDUCE", (x * 2.0).node, arg="SUM")
    waited = Tensor._from_node(build("WAIT", started), x.device) + 1.0
    other = (x @ b).sum(axis=0)
    tl.realize(waited, other)
    plain = dist.functional.all_reduce(x * 2.0) + 1.0
    agree(dist, lambda: (close(waited.numpy(), plain.numpy(), dict(rtol=0, atol=0))(),
                         close(waited.numpy(), 2 * everyone(dist, (4, 6)).astype(np.float64).sum(0) + 1, F32)(),
                         close(other.numpy(), (part(rank, (4, 6)) @ part(11, (6, 6))).sum(0), dict(rtol=1e-5,
                                                                                                  atol=1e-5))()))


class Recording:
    """COMM_WORLD with its calls recorded: (method name, args)."""
    def __init__(self, comm):
        self._comm, self.calls = comm, []

    def __getattr__(self, name):
        method = getattr(self._comm, name)
        if not callable(method):
            return method

        def record(*args, **kwargs):
            self.calls.append((name, args))
            return method(*args, **kwargs)
        return record


@pytest.mark.parametrize("runtime", ["numpy", "c"])
def test_contiguous_buffer_goes_to_mpi_without_copy(dist, monkeypatch, runtime):
    """On the CPU runtimes a realized contiguous buffer is the very array handed to MPI_Allreduce."""
    from tinyllm.distributed import process_group
    x = tl.tensor(part(dist.get_rank(), (8, 4)), device=runtime)
    x.realize()
    source = (x.node.arg if x.node.op == "LOAD" else x.node.buffer).data
    recording = Recording(process_group.comm())
    monkeypatch.setattr(process_group, "_comm", recording)
    y = dist.functional.all_reduce(x)
    value = y.numpy()
    monkeypatch.undo()
    sent = [args[0] for name, args in recording.calls if name == "Allreduce"]
    agree(dist, lambda: (assert_one_no_copy(sent, source),
                         close(value, everyone(dist, (8, 4)).sum(0), F32)()))


def assert_one_no_copy(sent, source):
    assert len(sent) == 1, f"{len(sent)} Allreduce calls, expected 1"
    assert isinstance(sent[0], np.ndarray) and np.shares_memory(sent[0], source), \
        "the all-reduce sent a copy of the buffer, not the buffer"
