"""Collectives as graph nodes: values combined across the ranks of the MPI job (tinyllm/distributed), so the
scheduler places them among the kernels like any other op. On the CPU runtimes a buffer is host memory and goes
to MPI as it is (no copy when it is contiguous); the WGSL runtime reads it back first.

Gradients follow the convention of Megatron-LM's tensor parallelism: what a collective returns to every rank is
one replicated value, and the loss computed from it counts once (not once per rank). So
    y = Σ_r x_r on every rank            ⇒  dx_r = dy                (each rank holds all of dL/dy)
    y = x on every rank, read by rank-local work giving partial dL/dx_r   ⇒  dx = Σ_r dx_r   (REPLICATE)
    y = concat_r x_r on every rank       ⇒  dx_r = dy[r-th block]
    y_r = (Σ_s x_s)[r-th block]          ⇒  dx_r = concat_s dy_s     (each rank's block is its own)
    y = x_src on every rank              ⇒  dx_src = dy, dx_r = 0 elsewhere

IALLREDUCE and WAIT split an all-reduce in two so the scheduler can overlap it with other kernels (data parallel
gradients, tinyllm/nn/parallel.py): IALLREDUCE starts a non-blocking MPI_Iallreduce into a new array and returns
it while the ranks combine it; WAIT completes it. The schedule runs a START as soon as its input exists and a
WAIT after every kernel that does not need it (tinyllm/schedule.py); between kernels the runtimes let MPI make
progress (`progress`). On the C runtime these are host calls (CRuntime.host_call), so a schedule holding them is
recorded and replayed like any other. Neither has a gradient: they reduce gradients, outside autograd.
"""
import numpy as np

from .. import dtype as dt, process_group
from ..graph import build, const
from .base import Identity, Op, register

OPS = ("SUM", "AVG", "MAX")
# address of the array being reduced into -> (request, its input, the array, op). On the normal path the entry
# keeps the input alive; in a replayed C program they are views of its arena, which the schedule holds until the
# WAIT (a schedule whose all-reduce outlives it is not recorded: runtime/c/program.py)
_inflight = {}


class Collective(Op):
    """An op whose value depends on every rank's input. Its gradient rule is checked on 2 ranks against the
    convention above (tests/distributed/test_collectives.py), not by gradcheck's finite differences on one process.
    Each but WAIT has `into(x, out, arg)`, which does the MPI work, x and out row-major host arrays, out of the
    op's shape and dtype: the NumPy forward and the C runtime's kernel function (a recorded host call) both run it."""


def _made(into, x, shape, arg):
    """A forward: into(x, out, arg) on x made row-major and a new `out` of `shape`."""
    x = np.ascontiguousarray(x)
    out = np.empty(shape, x.dtype)
    into(x, out, arg)
    return out


def _check_op(arg, dtype):
    if arg not in OPS:
        raise ValueError(f"unknown reduce op {arg!r}: use one of {OPS} (tinyllm.distributed.ReduceOp)")
    if arg == "AVG" and not dtype.is_float:
        raise TypeError(f"ReduceOp.AVG needs a floating-point tensor, got {dtype.name}: use SUM and divide")


def _mpi_op(reduce_op):
    MPI = process_group.mpi()
    return MPI.MAX if reduce_op == "MAX" else MPI.SUM


def _finish(out, reduce_op):
    if reduce_op == "AVG":
        out /= out.dtype.type(process_group.get_world_size())
    return out


def _rank_block(dy, y):
    """dy's rows of this rank's block along axis 0, `y.src[0]`'s share of a gathered value."""
    n = y.src[0].shape[0]
    r = process_group.get_rank()
    return build("SHRINK", dy, arg=((r * n, (r + 1) * n, 1),) + tuple((0, s, 1) for s in dy.shape[1:]))


@register
class ALLREDUCE(Collective):
    """y = op over the ranks of x (SUM, AVG or MAX), the same on every rank  ⇒  dx = dy for SUM, dy / world for
    AVG (the loss counts once, module docstring); MAX has no gradient here."""
    def infer(src, arg):
        (x,) = src
        _check_op(arg, x.dtype)
        return x.shape, x.dtype
    @staticmethod
    def into(x, out, arg):
        process_group.comm().Allreduce(x, out, op=_mpi_op(arg))
        _finish(out, arg)
    def forward(x, arg): return _made(ALLREDUCE.into, x, x.shape, arg)
    def backward(dy, y):
        if y.arg == "MAX":
            raise NotImplementedError("all_reduce with ReduceOp.MAX has no gradient: detach its input")
        return (dy if y.arg == "SUM" else dy * (1.0 / process_group.get_world_size()),)


@register
class REPLICATE(Identity, Collective):
    """y = x, where x is the same on every rank and rank-local work reads it (Megatron's f): each rank's dy is
    the part of dL/dx through its own share of that work  ⇒  dx = Σ_r dy_r, an ALLREDUCE SUM of dy. The
    forward does nothing, so the schedule stage drops the marker (rewrite/simplify.py)."""
    def infer(src, arg):
        (x,) = src
        return x.shape, x.dtype
    def forward(x): return x
    def backward(dy, y): return (build("ALLREDUCE", dy, arg="SUM"),)


@register
class BROADCAST(Collective):
    """y = x of rank `arg` on every rank  ⇒  dx = dy on that rank, 0 on the others."""
    def infer(src, arg):
        (x,) = src
        if not isinstance(arg, int) or arg < 0:
            raise ValueError(f"src must be a rank (an int ≥ 0), got {arg!r}")
        return x.shape, x.dtype
    @staticmethod
    def into(x, out, arg):
        out[...] = x
        process_group.comm().Bcast(out, root=arg)
    def forward(x, arg): return _made(BROADCAST.into, x, x.shape, arg)
    def backward(dy, y):
        return (dy if process_group.get_rank() == y.arg else const(0.0, dy.shape, dy.dtype),)


@register
class ALLGATHER(Collective):
    """y = the ranks' x stacked along axis 0 in rank order (x (n, ...) → y (world·n, ...))  ⇒  dx = this rank's
    block of dy."""
    def infer(src, arg):
        (x,) = src
        if not x.shape:
            raise ValueError("all_gather needs a tensor with at least one axis (it stacks along axis 0)")
        return (arg * x.shape[0],) + x.shape[1:], x.dtype
    @staticmethod
    def into(x, out, arg): process_group.comm().Allgather(x, out)
    def forward(x, arg): return _made(ALLGATHER.into, x, (arg * x.shape[0],) + x.shape[1:], arg)
    def backward(dy, y): return (_rank_block(dy, y),)


@register
class REDUCE_SCATTER(Collective):
    """y = this rank's block (axis 0) of the sum (or AVG, MAX) over ranks of x (x (world·n, ...) → y (n, ...))
    ⇒  dx = the ranks' dy stacked along axis 0 (an ALLGATHER of dy)."""
    def infer(src, arg):
        (x,) = src
        op, world = arg
        _check_op(op, x.dtype)
        if not x.shape or x.shape[0] % world:
            raise ValueError(f"reduce_scatter of shape {x.shape} over {world} ranks: axis 0 must be a multiple of "
                             f"the world size")
        return (x.shape[0] // world,) + x.shape[1:], x.dtype
    @staticmethod
    def into(x, out, arg):
        process_group.comm().Reduce_scatter_block(x, out, op=_mpi_op(arg[0]))
        _finish(out, arg[0])
    def forward(x, arg): return _made(REDUCE_SCATTER.into, x, (x.shape[0] // arg[1],) + x.shape[1:], arg)
    def backward(dy, y):
        if y.arg[0] == "MAX":
            raise NotImplementedError("reduce_scatter with ReduceOp.MAX has no gradient: detach its input")
        g = build("ALLGATHER", dy, arg=y.arg[1])
        return (g if y.arg[0] == "SUM" else g * (1.0 / y.arg[1]),)


def _check_async(src, arg):
    (x,) = src
    _check_op(arg, x.dtype)
    if x.dtype not in (dt.float32, dt.float64):
        raise TypeError(f"a non-blocking all-reduce runs on float32 or float64 buffers, got {x.dtype.name}")
    return x.shape, x.dtype


@register
class IALLREDUCE(Collective):
    """Starts y = op over the ranks of x (MPI_Iallreduce); its value is complete only after a WAIT."""
    infer = staticmethod(_check_async)
    @staticmethod
    def into(x, out, arg):
        _inflight[_address(out)] = (process_group.comm().Iallreduce(x, out, op=_mpi_op(arg)), x, out, arg)
    def forward(x, arg): return _made(IALLREDUCE.into, x, x.shape, arg)


@register
class WAIT(Collective):
    """y = the completed all-reduce that its IALLREDUCE input started."""
    def infer(src, arg):
        (x,) = src
        return x.shape, x.dtype
    def forward(x):
        complete(x, pending(x))
        return x


def _address(a):
    """_inflight's key. By address, not by array: a replayed C program (runtime/c/program.py) hands the host
    calls new arrays over the same memory."""
    return a.__array_interface__["data"][0]


def _entry(out, take=False):
    entry = (_inflight.pop if take else _inflight.get)(_address(out), None)
    if entry is None:
        raise RuntimeError("WAIT: its input is not an all-reduce in flight (an IALLREDUCE's value, waited once)")
    return entry


def pending(out):
    """The input of the all-reduce in flight into `out` (MPI reads it until the all-reduce completes)."""
    return _entry(out)[1]


def complete(out, x):
    """Waits for the all-reduce of x into out and finishes it in place (AVG divides by the world size). x is
    passed only so that a recorded program keeps its memory until here."""
    request, _, _, op = _entry(out, take=True)
    request.Wait()
    _finish(out, op)


def progress():
    """Let MPI move the started all-reduces on (Open MPI's non-blocking collectives advance only inside MPI calls):
    the runtimes call this between kernels while any is in flight."""
    if _inflight:
        process_group.mpi().Request.Testall([entry[0] for entry in _inflight.values()])
