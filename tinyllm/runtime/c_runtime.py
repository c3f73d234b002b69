"""The C runtime: the NumPy runtime's buffers and zero-copy views, with the work done in C. Fused kernels are
generated C (render/c.py) compiled on first use (compiler.py); MATMUL is the packed AVX2/FMA sgemm from
runtime_c/ (built by pip install), reading transposed operands in place. Ops without a C kernel run their NumPy
forward, and everything falls back to NumPy, with a warning, where no compiler or prebuilt module exists."""
import hashlib
import math
import os
import sys
import warnings
import weakref

import numpy as np

from ..env import debug_level
from ..ops.index import check_index
from ..rewrite.fusion import fuse, fuse_outputs, run_kernel
from . import c_attention, c_copy, compiler
from .c_views import address, batch_runs, matrix_layout
from .memory import track, untrack
from .numpy_runtime import NumpyRuntime
from .render.c import render


def _load_prebuilt():
    try:
        from .. import _kernels
        return _kernels.ffi, _kernels.lib
    except ImportError:
        warnings.warn("tinyllm: the prebuilt C module tinyllm._kernels is missing (reinstall with `pip install -e .`, "
                      "which needs a C compiler): matmuls and embeddings run on NumPy", RuntimeWarning, stacklevel=4)
        return None, None


class CRuntime(NumpyRuntime):
    name = "c"
    passes = (("fusion", fuse), ("fuse_outputs", fuse_outputs))
    # op -> fn(runtime, node, inputs) running its C kernel; it returns None where the kernel does not apply
    # (float64, or no prebuilt module), and the op's NumPy forward runs instead
    handlers = {}

    def __init__(self):
        self.ffi, self.lib = _load_prebuilt()
        self.kernels = {}  # (Kernel, dtypes) -> compiled function
        self.pool = {}  # (shape, dtype) -> free arrays: a training step reuses the same buffers every time
        self.made = weakref.WeakValueDictionary()  # id -> array, for the arrays empty() allocated
        self.compiles = compiler.available()
        threads = int(os.environ.get("TINYLLM_THREADS", "0") or 0)
        if self.lib is not None:
            self.lib.tl_set_num_threads(threads)
        if threads > 0:
            _set_omp_threads(threads)

    def execute(self, schedule, feeds=()):
        if self.name not in schedule.prepared:
            schedule.prepared[self.name] = self._compile([n for n in schedule.kernels if n.op == "FUSED"])
        self._fns = schedule.prepared[self.name]
        return super().execute(schedule, feeds)

    def empty(self, shape, dtype):
        free = self.pool.get((shape, dtype))
        if free:
            return track(free.pop())
        out = np.empty(shape, dtype)
        self.made[id(out)] = out
        return out

    def release(self, value):
        # Only an array this pool made (an op's NumPy forward makes arrays of shapes no kernel may ask for again:
        # pooled, they would pile up) and that nothing else refers to (no view of it, no output, no feed) may be
        # handed out again: the two references counted are this argument and getrefcount's own.
        if self.made.get(id(value)) is value and value.flags.writeable and sys.getrefcount(value) == 2:
            untrack(value)
            self.pool.setdefault((value.shape, value.dtype), []).append(value)

    def empty_cache(self):
        self.pool.clear()

    def _key(self, node):
        return node.arg, node.dtype.name, tuple(s.dtype.name for s in node.src)

    def _compile(self, nodes):
        """{node: compiled function} for these FUSED nodes, compiling what this process has not yet."""
        if not self.compiles:
            return {}
        todo = {}
        for n in nodes:
            key = self._key(n)
            if key not in self.kernels and key not in todo.values():
                name = "k" + hashlib.sha1(repr(key).encode()).hexdigest()[:20]
                todo[name] = key
        if todo:
            sources = {name: render(name, key[0], key[1], key[2]) for name, key in todo.items()}
            if debug_level() >= 2:
                for source in sources.values():
                    print(source)
            for name, fn in compiler.load(sources).items():
                self.kernels[todo[name]] = fn
        return {n: self.kernels[self._key(n)] for n in nodes}

    def run(self, node, ins):
        handler = self.handlers.get(node.op)
        out = handler(self, node, ins) if handler is not None else None
        return out if out is not None else super().run(node, ins)

    def _fused(self, node, ins):
        fn = self._fns.get(node)
        ins = [x if x.flags.c_contiguous else np.ascontiguousarray(x) for x in ins]  # keeps 0-d inputs 0-d
        if fn is None:
            return run_kernel(node.arg, *ins, out_dtype=node.dtype.np)
        out = self.empty(node.shape, node.dtype.np)
        if out.size and math.prod(node.arg.shape):
            # from_buffer: 5x cheaper than casting each array's address, and every array here is contiguous
            ffi = compiler.ffi
            fn(ffi.new("char *[]", [ffi.from_buffer(a) for a in (out, *ins)]))
        elif out.size:
            out[...] = 0 if node.arg.reduce[0] == "SUM" else -np.inf
        return out

    def _matmul(self, node, ins):
        a, b = ins
        if a.dtype != np.float32 or self.lib is None:
            return None
        batch, (M, K), N = a.shape[:-2], a.shape[-2:], b.shape[-1]
        out = self.empty(batch + (M, N), np.dtype(np.float32))
        if not out.size:
            return out
        if K == 0:
            out[...] = 0
            return out
        la, lb = matrix_layout(a), matrix_layout(b)
        if la is None or batch_runs(batch, a) is None:  # a view sgemm cannot read in place: copy it
            a = np.ascontiguousarray(a)
            la = matrix_layout(a)
        if lb is None or batch_runs(batch, b) is None:
            b = np.ascontiguousarray(b)
            lb = matrix_layout(b)
        runs = batch_runs(batch, a, b, out)
        if runs is None:  # each is readable alone, but their batch axes do not run alike
            a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
            la, lb, runs = matrix_layout(a), matrix_layout(b), batch_runs(batch, a, b, out)
        (n0, (a0, b0, c0)), (n1, (a1, b1, c1)) = ([(1, (0, 0, 0))] * 2 + runs)[-2:]
        cast = self.ffi.cast
        self.lib.tl_sgemm_batched2(n0, n1, la[0], lb[0], M, N, K, cast("float *", address(a)), la[1], a0, a1,
                                   cast("float *", address(b)), lb[1], b0, b1,
                                   0.0, cast("float *", address(out)), N, c0, c1)
        return out

    def _gather(self, node, ins):
        x, idx = ins
        axis = node.arg
        return self._embedding("embedding_forward", node, x, idx, axis, x.shape[axis], x.shape[axis + 1:])

    def _scatter_add(self, node, ins):
        dy, idx = ins
        axis, n = node.arg
        return self._embedding("embedding_backward", node, dy, idx, axis, n, dy.shape[axis + idx.ndim:])

    def _embedding(self, kernel, node, x, idx, axis, n, inner_shape):
        """GATHER or SCATTER_ADD of float32 `x` along `axis`, through runtime_c/embedding.c: the table side has
        n rows on that axis, the axes before it are the kernel's `outer`, those after its rows `inner`."""
        if x.dtype != np.float32 or self.lib is None:
            return None
        x, idx = np.ascontiguousarray(x), np.ascontiguousarray(idx)
        out = self.empty(node.shape, x.dtype)
        cast = self.ffi.cast
        bad = getattr(self.lib, kernel)(cast("float *", address(out)), cast("float *", address(x)),
                                        cast("int64_t *", address(idx)), math.prod(x.shape[:axis]), n, idx.size,
                                        math.prod(inner_shape))
        if bad >= 0:
            check_index(idx, n, node.op, axis, x.shape)  # raises, naming the index and the shapes
        return out


CRuntime.handlers.update(FUSED=CRuntime._fused, MATMUL=CRuntime._matmul, GATHER=CRuntime._gather,
                         SCATTER_ADD=CRuntime._scatter_add)
CRuntime.handlers.update(c_attention.HANDLERS)  # FLASH_ATTN, FLASH_ATTN_BWD: runtime_c/attention.c
CRuntime.handlers.update(c_copy.HANDLERS)  # CONTIGUOUS, RESHAPE, CAT, PAD: runtime_c/copy.c


def _set_omp_threads(n):
    """Generated kernels use OpenMP's default team; set it for the threads that launch them."""
    import cffi
    ffi = cffi.FFI()
    ffi.cdef("void omp_set_num_threads(int);")
    try:
        ffi.dlopen("libgomp.so.1").omp_set_num_threads(n)
    except OSError:
        pass  # no libgomp: kernels were built without OpenMP and run on one thread anyway
