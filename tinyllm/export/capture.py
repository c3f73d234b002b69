"""What the WGSL runtime dispatches for one call of a step, recorded so that a WebGPU page can dispatch it again.

The runtime is watched from outside: on the runtime instance (never its class) Device.dispatch is wrapped for the
block's length, and its replay plans are turned off, so that every kernel of a replayed jit step goes through
Device.dispatch with its WGSL source, its buffers (Storage objects, named by their `order`) and its workgroup counts.
A buffer whose first use in the step is a read holds state from before the step (a weight, a cache, a constant the
runtime uploaded, a tensor the Tape keeps): its bytes are read back right then, which is what the dispatch reads.
Any host round trip inside the step (an op without a WGSL kernel, a read-back, an upload of host data) would not be
in the dispatch list, so it is refused, naming the op.
"""
import contextlib

import numpy as np


class ExportError(ValueError):
    """A model, tokenizer or output directory the exporter cannot handle; the message names what and why."""


class Dispatch:
    __slots__ = ("source", "buffers", "read_only", "groups")

    def __init__(self, source, buffers, read_only, groups):
        self.source, self.buffers, self.read_only, self.groups = source, buffers, read_only, groups


class Recording:
    """One call's dispatches, in order. Buffers are numbered 0, 1, … by first use; `storages[i]` is buffer i's
    Storage, `state[i]` the bytes it held when the step first read it (buffers first written hold nothing)."""

    def __init__(self):
        self.dispatches, self.storages, self.state = [], [], {}
        self.index = {}  # Storage.order -> buffer number
        self.written = set()

    def number(self, storage):
        i = self.index.get(storage.order)
        if i is None:
            i = self.index[storage.order] = len(self.storages)
            self.storages.append(storage)
        return i

    def find(self, storage):
        """The buffer number of `storage` in this recording, or None when the step never bound it."""
        return self.index.get(storage.order)


@contextlib.contextmanager
def recording(rt, host_inputs=None):
    """Record what `rt` (a WGSLRuntime) dispatches inside the block; yields the Recording. With `host_inputs` (a
    list), uploads of host data are allowed and appended to it as (Storage, array): a training step's optimizer
    values, which the page computes itself."""
    rec, gpu = Recording(), rt.gpu
    dispatch, download, upload = gpu.dispatch, gpu.download, gpu.upload
    inside = [False]  # downloads of state made by the recorder itself are allowed

    def record(source, storages, read_only, groups):
        numbers = [rec.number(s) for s in storages]
        for n, s, ro in zip(numbers, storages, read_only):
            if ro and n not in rec.written and n not in rec.state:
                inside[0] = True
                try:
                    rec.state[n] = bytes(download(s, s.nbytes))
                finally:
                    inside[0] = False
        rec.written.update(n for n, ro in zip(numbers, read_only) if not ro)
        rec.dispatches.append(Dispatch(source, numbers, [bool(r) for r in read_only], tuple(int(g) for g in groups)))
        dispatch(source, storages, read_only, groups)

    def refuse_host(node, *args, **kwargs):
        raise ExportError(f"tinyllm.export: op {node.op} {tuple(node.shape)} has no WGSL kernel and runs on the host "
                          "in the WGSL runtime; an exported page can only dispatch kernels: use a model without it")

    def refuse_host_forward(op, node, ins):
        refuse_host(node)

    def refuse_download(storage, nbytes):
        if not inside[0]:
            raise ExportError(f"tinyllm.export: the step reads {nbytes} bytes back to the host while it runs (a value "
                              "read inside the step): the page could not repeat that")
        return download(storage, nbytes)

    def refuse_upload(array, pooled=True):
        if pooled and host_inputs is not None:
            storage = upload(array, pooled)
            host_inputs.append((storage, np.array(array)))
            return storage
        if pooled:
            raise ExportError(f"tinyllm.export: the step uploads host data of shape {np.shape(array)} while it runs "
                              "(a tensor made from host values inside the step): the page could not repeat that")
        return upload(array, pooled)

    plans, rt.plans = rt.plans, None
    gpu.submit()
    gpu.dispatch, gpu.download, gpu.upload = record, refuse_download, refuse_upload
    rt.on_host, rt.host_forward = refuse_host, refuse_host_forward
    try:
        yield rec
    finally:
        del gpu.dispatch, gpu.download, gpu.upload, rt.on_host, rt.host_forward  # back to the class's methods
        rt.plans = plans
        gpu.submit()


@contextlib.contextmanager
def binding_limit(rt, n):
    """Kernels any WebGPU adapter runs inside the block: at most `n` storage bindings (output and inputs), and no
    subgroup operations (an optional feature, which also needs `enable subgroups;` in Tint). The fusion pass is
    given the lower limit, the runtime's features lose "subgroup", and the schedule caches are emptied on the way
    in and out, so that no kernel made for the runtime's own adapter is reused inside, nor one made for `n`
    outside. (WebGPU adapters differ: Dawn's OpenGL ES path offers 16 bindings, WebGPU's default is 8.)"""
    from .. import realizer
    old, features = rt.max_kernel_inputs, rt.features
    lower = old is None or old > n - 1
    changed = lower or "subgroup" in features

    def forget():
        realizer._schedules.clear()
        realizer._known.clear()
    if changed:
        forget()
        rt.max_kernel_inputs = n - 1 if lower else old
        rt.features = [f for f in features if f != "subgroup"]
    try:
        yield
    finally:
        if changed:
            rt.max_kernel_inputs, rt.features = old, features
            forget()


def check_bindings(dispatches, n):
    """Refuse manifest dispatches that bind more than n buffers."""
    for _, buffers, _, _ in dispatches:
        if len(buffers) > n:
            raise ExportError(f"tinyllm.export: a kernel binds {len(buffers)} storage buffers, over the limit of "
                              f"{n} (max_storage_buffers): pass a higher one, or a smaller model")


def storage_of(tensor):
    """(Storage, offset in elements, dtype name) of a realized tensor on the WGSL runtime."""
    from ..realizer import realize
    realize(tensor)
    node = tensor._node
    buf = node.arg if node.op == "LOAD" else node.buffer
    value = buf.data
    if not hasattr(value, "storage"):
        raise ExportError(f"tinyllm.export: a tensor of shape {tensor.shape} is on {tensor.device}, not the WGSL "
                          "runtime: move the model with model.to('wgsl') first")
    return value.storage, value.offset, value.dtype.name
