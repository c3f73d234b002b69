"""The contract of a runtime: what a new one provides, and the one way each registers its kernels.

A runtime is one package under tinyllm/runtime/ (numpy/, c/, wgsl/) whose runtime.py subclasses `Runtime` below:
  from_numpy / to_numpy / constant   its buffers: made from NumPy, read back, a CONST's value
  execute(schedule, feeds, donate)   runs a schedule (tinyllm/schedule.py) and returns one Buffer per output
  fuses, multi_output_kernels, row_kernels, max_kernel_inputs
                                     what its kernels can run, from which rewrite/pipeline.py picks the lowering
  kernels                            its table of kernels by op (`Kernels` below): an op it has no kernel for runs
                                     the op's NumPy forward (tinyllm/ops/), so every runtime runs every primitive
Its modules register their kernels when imported; runtime.py ends with `load_kernels(__package__)`, which imports
them all. tinyllm/runtime/__init__.py finds the package by its folder, so TINYLLM_RUNTIME=NAME and device="NAME"
reach it, and the tests run every op and rewrite on it (tests/conftest.py, RUNTIMES).
"""
import contextlib
import importlib
import pkgutil
import sys

import numpy as np

from .. import ops

# Whether sys.getrefcount counts every reference, as the checks before a donation (Runtime.execute) assume:
# CPython 3.11-3.13 with the GIL. Later versions may skip counting references they borrow, so a count could
# look right while something else holds the value: there, nothing is donated (updates are not made in place).
EXACT_REFCOUNTS = sys.implementation.name == "cpython" and sys.version_info < (3, 14) \
    and getattr(sys, "_is_gil_enabled", lambda: True)()


class Kernels(dict):
    """A runtime's kernels: op name -> fn(runtime, node, inputs). `@kernels("c").register("MATMUL", ...)`
    adds one; a name that is not a registered op raises there, so a misspelled one cannot silently never run."""
    def __init__(self, runtime):
        super().__init__()
        self.runtime = runtime

    def register(self, *op_names):
        ops.names(*op_names)

        def add(fn):
            for op in op_names:
                self[op] = fn
            return fn
        return add


_tables = {}


def kernels(runtime):
    """The kernel table of the runtime called `runtime`: one per runtime, made on first use, so a runtime's kernel
    modules register into it without importing the runtime itself."""
    return _tables.setdefault(runtime, Kernels(runtime))


def load_kernels(package):
    """Import every module of a runtime's package (its runtime.py calls this at its end), so that each module that
    holds kernels registers them: a new kernel is a new module, with no line to add elsewhere."""
    for m in pkgutil.iter_modules(importlib.import_module(package).__path__):
        importlib.import_module(f"{package}.{m.name}")


class Buffer:
    """A realized value on one runtime. `data` is whatever the runtime keeps (a NumPy array for the CPU ones)."""
    __slots__ = ("runtime", "data", "shape", "dtype", "__weakref__")

    def __init__(self, runtime, data, shape, dtype):
        self.runtime, self.data, self.shape, self.dtype = runtime, data, tuple(shape), dtype

    def numpy(self):
        return self.runtime.to_numpy(self)

    def __repr__(self):
        return f"<Buffer {self.runtime.name} {self.shape} {self.dtype.name}>"


class Runtime:
    name = "?"
    kernels = Kernels("?")  # each runtime's own: kernels(name)
    # What this runtime's kernels can run, from which tinyllm/rewrite/pipeline.py picks the lowering passes:
    fuses = False  # FUSED kernels (the fusion pass)
    multi_output_kernels = False  # FUSED kernels with several outputs (fuse_outputs)
    row_kernels = False  # ROW_* kernels (the rowwise pass)
    max_kernel_inputs = None  # buffers one kernel may read (None: no limit)

    def from_numpy(self, array, dtype):
        raise NotImplementedError

    def to_numpy(self, buffer):
        raise NotImplementedError

    def storage(self, buffer):
        """(address of the storage, offset of the buffer's first element in it in elements, the storage's bytes):
        what Tensor.data_ptr, storage_offset and untyped_storage report. Here for a NumPy array (the CPU runtimes):
        the array that owns the memory is the storage, so views of one array share it, as torch's views do."""
        data = np.asarray(buffer.data)
        base = data
        while isinstance(base.base, np.ndarray):
            base = base.base
        first, start = data.__array_interface__["data"][0], base.__array_interface__["data"][0]
        return start, (first - start) // max(data.itemsize, 1), base.nbytes

    def constant(self, value, shape, dtype):
        """A CONST node's value: one element seen as `shape`."""
        raise NotImplementedError

    def input_values(self, schedule, feeds):
        """{input node: value} for a schedule: a SLOT's feed, a realized node's or a LOAD's buffer, a CONST."""
        vals = {}
        for n in schedule.inputs:
            if n.op == "SLOT":
                vals[n] = feeds[n.arg].data
            elif n.buffer is not None:
                vals[n] = n.buffer.data
            elif n.op == "LOAD":
                vals[n] = n.arg.data
            else:
                vals[n] = self.constant(n.arg, n.shape, n.dtype)
        return vals

    # Whether chain(tape, observed, moved) can make something that replays all of a jit Tape's schedules at once,
    # from what the replay that just ran reported to `observed` (a list, set while it ran; `moved`: how many
    # assigned tensors got new memory rather than being written in place): c/chain.py, wgsl/chain.py
    chains = False

    @contextlib.contextmanager
    def together(self):
        """Around a jit Tape's replay of several schedules: a runtime may hold their work back and send it at once
        when the block ends (the WGSL runtime submits one command buffer for the whole step); here nothing."""
        yield

    def execute(self, schedule, feeds=(), donate=()):
        """Run `schedule` (see tinyllm/schedule.py) with feeds[i] the Buffer for its i-th SLOT input; return
        one Buffer per output node. `donate`: positions of feeds the caller will not read again and nothing else
        refers to; a runtime may write outputs over their memory (the C runtime's replays do, see c/program.py)."""
        raise NotImplementedError
