"""The reference runtime: every primitive runs as its own NumPy forward from tinyllm/ops, one kernel per node.
Movement ops are NumPy views, so transposes, slices and broadcasts move no data."""
import time

import numpy as np

from ...env import debug_level

from ... import dtype as dt
from ...ops import collective
from ...ops.base import compute
from ..base import Buffer, Runtime
from ..memory import owner, track


class NumpyRuntime(Runtime):
    name = "numpy"

    def from_numpy(self, array, dtype):
        array = dt.as_storage(array, dtype)
        return Buffer(self, track(array), array.shape, dtype)

    def to_numpy(self, buffer):
        return dt.decode(buffer.data, buffer.dtype)  # a bfloat16's values as float32 (NumPy has no bfloat16)

    def constant(self, value, shape, dtype):
        return np.broadcast_to(dt.encode(value, dtype), shape)  # one element seen through zero strides

    def host_call(self, fn, *args):
        """fn(*args): Python work between kernels on host arrays (an MPI call); the C runtime records it."""
        return fn(*args)

    def release(self, value):
        """`value` is no longer needed by the schedule (a runtime with a buffer pool may keep it)."""

    def _timed(self, node, ins):
        """run(), printing the kernel, its shape and its time (TINYLLM_DEBUG=1)."""
        start = time.perf_counter()
        out = self.run(node, ins)
        what = f"FUSED[{len(node.arg.code)} ops{', ' + node.arg.reduce[0] if node.arg.reduce else ''}]" \
            if node.op == "FUSED" else node.op
        print(f"[tinyllm {self.name}] {what:<24} {str(node.shape):<20} {(time.perf_counter() - start) * 1e6:8.1f} µs")
        return out

    def run(self, node, ins):
        """One kernel: the op's NumPy forward."""
        return compute(node, ins)

    def execute(self, schedule, feeds=(), donate=()):
        with np.errstate(all="ignore"):  # IEEE results (inf, nan) as torch gives them, without warnings
            return self.run_schedule(schedule, self.input_values(schedule, feeds))

    def run_schedule(self, schedule, vals):
        """Runs the kernels over vals (the input values: it adds each kernel's and drops what dies) and returns
        the output Buffers."""
        input_storage = {id(owner(vals[n])) for n in schedule.inputs if n.op != "CONST"}
        run = self._timed if debug_level() else self.run
        for node, dead in zip(schedule.kernels, schedule.frees):
            vals[node] = track(run(node, [vals[s] for s in node.src]))
            if collective._inflight:  # all-reduces started earlier in this schedule move on between kernels
                self.host_call(collective.progress)
            for d in dead:
                self.release(vals.pop(d))
        return self.output_buffers(schedule, [vals[n] for n in schedule.outputs], input_storage)

    def output_buffers(self, schedule, values, input_storage):
        outs = []
        for n, v, fresh in zip(schedule.outputs, values, schedule.fresh):
            v = np.asarray(v, dtype=n.dtype.np)  # (a bfloat16's storage is uint16 already)
            # a broadcast constant gets real memory; a result the passes reduced to an input gets its own
            if not v.flags.writeable or (fresh and id(owner(v)) in input_storage):
                v = track(v.copy())
            outs.append(Buffer(self, v, n.shape, n.dtype))
        return outs
