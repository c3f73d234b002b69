"""DistributedDataParallel: one model per rank, each on its own share of the batch, gradients averaged across
the ranks (tinyllm.distributed) so every rank takes the same optimizer step, as torch.nn.parallel's.

The averaging joins backward's graph (docs/architecture.md, "Collectives are graph nodes"): each bucket of about
`bucket_cap_mb` (torch's 25 MB) of gradients is joined into one flat array and averaged by a non-blocking
all-reduce (IALLREDUCE, then WAIT), which the schedule overlaps with the rest of the backward pass. The averaged
gradients are views of the buckets.
"""
import contextlib
import weakref

from .. import process_group as dist
from ..graph import build, const
from ..tensor import Tensor, grad_ready_hooks
from .module import Module

_live = weakref.WeakSet()  # the DistributedDataParallel wrappers alive: each averages its own parameters' grads


class DistributedDataParallel(Module):
    """Wraps `module`: parameters are broadcast from rank 0 now; after each backward() the gradients of its
    parameters are the mean over the ranks. `no_sync()` skips the averaging (gradient accumulation: the
    gradients summed locally are averaged by the first backward outside it). The wrapped model is `.module`."""
    def __init__(self, module, bucket_cap_mb=25, broadcast_buffers=True):
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel: expected a tinyllm.nn.Module, got {type(module).__name__}")
        if not bucket_cap_mb or bucket_cap_mb <= 0:
            raise ValueError(f"DistributedDataParallel: bucket_cap_mb must be positive, got {bucket_cap_mb}")
        self.world_size, self.rank = dist.get_world_size(), dist.get_rank()  # (a clear error before init)
        self.module = module
        self.bucket_cap_mb = bucket_cap_mb
        self.require_backward_grad_sync = True
        params = list(module.parameters())
        _broadcast(params)  # every rank starts from rank 0's weights
        self._ids = {id(p) for p in params if p.requires_grad}
        self._buckets = _buckets([p for p in params if p.requires_grad], bucket_cap_mb * 2 ** 20)
        _live.add(self)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate gradients on each rank without averaging them."""
        before, self.require_backward_grad_sync = self.require_backward_grad_sync, False
        try:
            yield
        finally:
            self.require_backward_grad_sync = before

    def _average(self, updated):
        """Replace the updated gradients of this wrapper's parameters by their mean over the ranks (lazily)."""
        if not self.require_backward_grad_sync or not any(id(t) in self._ids for t in updated):
            return []
        touched = []
        for bucket in self._buckets:
            grads = [p.grad.node if p.grad is not None else const(0.0, p.shape, p.dtype) for p in bucket]
            flat = [build("RESHAPE", g, arg=(g.numel,)) for g in grads]
            flat = flat[0] if len(flat) == 1 else build("CAT", *flat, arg=0)
            mean = build("WAIT", build("IALLREDUCE", flat, arg="AVG"))
            start = 0
            for p in bucket:
                view = build("SHRINK", mean, arg=((start, start + p.numel(), 1),))
                p.grad = Tensor._from_node(build("RESHAPE", view, arg=tuple(p.shape)), p.device)
                start += p.numel()
            touched += bucket
        return touched


LAST_BUCKET_BYTES = 2 ** 20  # the bucket reduced last: nothing of the backward pass is left to hide it behind


def _buckets(params, cap_bytes):
    """params (in module order) grouped into runs of one dtype and device, in the order backward finishes them
    (reverse module order), each of at most cap_bytes (a larger parameter alone). The first parameters' gradients
    come last, so their bucket is at most LAST_BUCKET_BYTES: its all-reduce is the one the step waits for."""
    buckets, size = [], 0
    for p in params:
        nbytes = p.numel() * p.dtype.itemsize
        last = buckets[-1] if buckets else None
        cap = min(cap_bytes, LAST_BUCKET_BYTES) if len(buckets) == 1 else cap_bytes
        if last is None or size + nbytes > cap or last[0].dtype is not p.dtype or last[0].device != p.device:
            buckets.append([p])
            size = nbytes
        else:
            last.append(p)
            size += nbytes
    return [bucket[::-1] for bucket in reversed(buckets)]


def _broadcast(params):
    """Every rank's params ← rank 0's, in one realize."""
    from .. import realizer
    from ..tensor import no_grad
    with no_grad():
        realizer.assign(params, [Tensor._from_node(build("BROADCAST", p.detach().node, arg=0), p.device)
                                 for p in params])


def _average_all(updated):
    touched = []
    for ddp in list(_live):
        touched += ddp._average(updated)
    return touched


grad_ready_hooks.append(_average_all)
