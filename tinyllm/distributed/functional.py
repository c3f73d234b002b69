"""Collectives as differentiable tensor functions (torch.distributed.nn.functional's role): each returns a new
lazy tensor whose node is the collective (tinyllm/ops/collective.py, with the gradient convention there), so a
model can use them inside its graph. The in-place forms with torch.distributed's signatures are in
tinyllm/distributed/collectives.py."""
from ..graph import build
from ..tensor import Tensor
from .. import process_group as pg
from ..process_group import ReduceOp


def _op(op):
    if isinstance(op, ReduceOp):
        return op.value
    raise TypeError(f"op must be a tinyllm.distributed.ReduceOp (SUM, AVG, MAX), got {op!r}")


def _tensor(x, what):
    if not isinstance(x, Tensor):
        raise TypeError(f"{what}: expected a tinyllm.Tensor, got {type(x).__name__}")
    pg.comm()  # a clear error before any graph is built, where the group is not initialized
    return x


def all_reduce(x, op=ReduceOp.SUM):
    """The ranks' x combined by `op`, the same on every rank."""
    x = _tensor(x, "all_reduce")
    return x._make(build("ALLREDUCE", x.node, arg=_op(op)), x)


def replicate(x):
    """x itself; its gradient is summed over the ranks (Megatron's f, before rank-local work on a shared x)."""
    x = _tensor(x, "replicate")
    return x._make(build("REPLICATE", x.node), x)


def broadcast(x, src=0):
    """Rank `src`'s x on every rank."""
    x = _tensor(x, "broadcast")
    _check_rank(src, "broadcast")
    return x._make(build("BROADCAST", x.node, arg=int(src)), x)


def all_gather(x):
    """The ranks' x concatenated along dim 0, in rank order (x (n, ...) → (world·n, ...))."""
    x = _tensor(x, "all_gather")
    if x.ndim == 0:
        x = x.reshape(1)
    return x._make(build("ALLGATHER", x.node, arg=pg.get_world_size()), x)


def reduce_scatter(x, op=ReduceOp.SUM):
    """This rank's block along dim 0 of the ranks' x combined by `op` (x (world·n, ...) → (n, ...))."""
    x = _tensor(x, "reduce_scatter")
    return x._make(build("REDUCE_SCATTER", x.node, arg=(_op(op), pg.get_world_size())), x)


def _check_rank(rank, what):
    world = pg.get_world_size()
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world:
        raise ValueError(f"{what}: src rank {rank!r} is not in 0..{world - 1} (world size {world})")
