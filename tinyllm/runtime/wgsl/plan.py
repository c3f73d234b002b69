"""A schedule's dispatches recorded once, then replayed without its kernels' Python (the WGSL runtime's replay).

Running a schedule (WGSLRuntime.execute) spends its host time in Python: each kernel function works out its
shader's source, allocates its outputs from the device's pool, finds its bind group, and records a dispatch. All of
that depends only on the schedule, on where and how its inputs are laid out (their buffers, shapes, strides,
offsets and dtypes), on which buffers the pool hands out, and on how many index kernels wait for their error check:
so the first run of a schedule over given inputs records what it did (the Device's `log`): each allocation (its
size and which buffer the pool gave), each buffer given back, each dispatch (pipeline, bind group, workgroups) and
each error slot. A later run with the same key replays the log: the pool's allocations and frees are made again,
and checked to hand out the same buffers (they do when the program runs the same steps: the pool gives the oldest
free buffer of a size), then the dispatches go to the open compute pass (Device.encode: one C call for all of them
where the kernels are built, else set_bind_group and dispatch_workgroups per dispatch and set_pipeline where the
pipeline changes, through wgpu-py). A buffer the pool hands out differently
undoes the allocations and runs the schedule's kernels again (recording it anew). A run that read a value back or
wrote one from the host midway (a kernel without a WGSL version) is not replayable and always runs its kernels.

WebGPU has no reusable command buffers and no bundles for compute passes (render bundles only: gpuweb/gpuweb
issues 1971 and 4138), so each dispatch is encoded again on every run; a replay saves the Python around it, and
the C encoder the wgpu-py calls. A jit step goes further: chain.py.
"""
from ..base import Buffer
from .device import Runs

MAX_PLANS = 512  # recorded schedules kept (each holds its bind groups); past that the table starts afresh


class Plan:
    """One recorded run of a schedule: `pool` the allocations ("alloc", size, buffer order) and frees ("free",
    order) in order, `runs` the dispatches (pipeline, bind group, workgroups), `slots` the error slots' messages,
    `outputs` what it returned (buffer order, shape, strides, offset, dtype, the node's shape and dtype);
    `runs` the dispatches (a Runs of device.Run)."""
    __slots__ = ("schedule", "pool", "runs", "slots", "outputs")

    def __init__(self, schedule, log, outputs, native):
        self.schedule = schedule                        # (kept alive: plans are keyed by its id)
        self.pool = [e for e in log if e[0] in ("alloc", "free")]
        self.runs = Runs([e[1] for e in log if e[0] == "run"], native)
        self.slots = [e[1] for e in log if e[0] == "slot"]
        self.outputs = [(v.storage.order, v.shape, v.elem_strides, v.offset, v.dtype, shape, dtype)
                        for v, shape, dtype in outputs]

    def replay(self, rt, inputs):
        """The schedule's outputs (Buffers) after its dispatches are recorded into the open pass, or None when the
        pool hands out another buffer than the recording got (nothing is dispatched then, and the pool is as it
        was)."""
        gpu, held = rt.gpu, {}
        for event in self.pool:
            if event[0] == "alloc":
                storage = gpu.alloc(event[1])
                if storage.order != event[2]:
                    for s in [storage, *held.values()]:
                        gpu.release(s)
                    return None
                held[storage.order] = storage
            else:
                storage = held.pop(event[1], None)
                if storage is not None:                 # (else one Python freed by chance while the run was recorded)
                    gpu.release(storage)
        gpu.encode(self.runs)
        if gpu.trace is not None:
            gpu.trace.extend(self.runs.items)
        rt.index_ops.extend(self.slots)
        by_order = {v.storage.order: v.storage for v in inputs}
        by_order.update(held)
        return [Buffer(rt, rt.value(by_order[order], shape, dtype, strides, offset), node_shape, node_dtype)
                for order, shape, strides, offset, dtype, node_shape, node_dtype in self.outputs]


class Plans:
    """A runtime's recorded schedules by key: the schedule, its inputs' buffers and layouts, the error slots in use
    (module docstring)."""

    def __init__(self):
        self.table = {}
        self.replays = self.records = 0                 # (how often each happened: tests and benches read them)

    @staticmethod
    def key(schedule, values, slots_used):
        return (id(schedule), slots_used, tuple((v.storage.order, v.shape, v.elem_strides, v.offset, v.dtype.name)
                                                for v in values))

    def get(self, key, schedule):
        plan = self.table.get(key)
        return plan if plan is not None and plan.schedule is schedule else None

    def drop(self, key):
        self.table.pop(key, None)

    def record(self, key, schedule, log, outputs, native):
        """Keep a run's log as the plan of its key, unless it touched the host midway."""
        if any(e[0] == "host" for e in log):
            return
        if len(self.table) >= MAX_PLANS:
            self.table.clear()
        self.table[key] = Plan(schedule, log, outputs, native)
        self.records += 1

    def clear(self):
        self.table.clear()
