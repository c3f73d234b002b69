"""The collectives with torch.distributed's signatures: they run now and write their result into the tensors
passed, as torch's do. Each is one graph node (tinyllm/ops/collective.py) realized at once; the tensors keep
their identity (an optimizer or module that holds them sees the new value)."""
from .. import realizer
from ..graph import build
from ..tensor import Tensor, no_grad
from . import functional as F
from .. import process_group as pg
from ..process_group import ReduceOp


def _set(targets, values):
    with no_grad():
        realizer.assign(targets, [v.detach() for v in values])


class Work:
    """What async_op=True returns (torch's Work): the operation is in flight until wait()."""
    def __init__(self, target, started):
        self._target, self._started = target, started

    def is_completed(self):
        return self._started is None

    def wait(self):
        if self._started is not None:
            node = build("WAIT", self._started.node)
            _set([self._target], [Tensor._from_node(node, self._target.device)])
            self._started = None
        return True


def all_reduce(tensor, op=ReduceOp.SUM, async_op=False):
    """tensor ← op over the ranks of tensor. async_op=True starts a non-blocking all-reduce (float32/float64)
    and returns a Work whose wait() writes the result."""
    F._tensor(tensor, "all_reduce")
    if async_op:
        started = Tensor._from_node(build("IALLREDUCE", tensor.detach().node, arg=F._op(op)), tensor.device)
        realizer.realize(started)
        return Work(tensor, started)
    _set([tensor], [F.all_reduce(tensor.detach(), op)])
    return None


def broadcast(tensor, src=0, async_op=False):
    """tensor ← rank src's tensor."""
    _set([F._tensor(tensor, "broadcast")], [F.broadcast(tensor.detach(), src)])
    return _done(async_op)


def all_gather(tensor_list, tensor, async_op=False):
    """tensor_list[r] ← rank r's tensor, for every r (all tensors of tensor's shape)."""
    F._tensor(tensor, "all_gather")
    world = pg.get_world_size()
    if len(tensor_list) != world or any(t.shape != tensor.shape for t in tensor_list):
        raise ValueError(f"all_gather: tensor_list needs {world} tensors of shape {tuple(tensor.shape)} (one per "
                         f"rank), got {[tuple(t.shape) for t in tensor_list]}")
    gathered = F.all_gather(tensor.detach().reshape(1, *tensor.shape))
    _set(list(tensor_list), [gathered[r] for r in range(world)])
    return _done(async_op)


def all_gather_into_tensor(output_tensor, input_tensor, async_op=False):
    """output_tensor ← the ranks' input_tensor concatenated along dim 0."""
    gathered = F.all_gather(F._tensor(input_tensor, "all_gather_into_tensor").detach())
    _check_shape(output_tensor, gathered.shape, "all_gather_into_tensor")
    _set([output_tensor], [gathered])
    return _done(async_op)


def reduce_scatter(output, input_list, op=ReduceOp.SUM, async_op=False):
    """output ← op over the ranks of input_list[rank]."""
    world = pg.get_world_size()
    if len(input_list) != world or any(t.shape != output.shape for t in input_list):
        raise ValueError(f"reduce_scatter: input_list needs {world} tensors of the output's shape "
                         f"{tuple(output.shape)}, got {[tuple(t.shape) for t in input_list]}")
    from ..factory import stack
    stacked = stack([F._tensor(t, "reduce_scatter").detach() for t in input_list])
    _set([output], [F.reduce_scatter(stacked, op).reshape(output.shape)])
    return _done(async_op)


def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, async_op=False):
    """output ← this rank's block (dim 0) of op over the ranks of input."""
    reduced = F.reduce_scatter(F._tensor(input, "reduce_scatter_tensor").detach(), op)
    _check_shape(output, reduced.shape, "reduce_scatter_tensor")
    _set([output], [reduced])
    return _done(async_op)


def _check_shape(t, shape, what):
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{what}: the output has shape {tuple(t.shape)}, the result {tuple(shape)}")


def _done(async_op):
    return Work(None, None) if async_op else None
