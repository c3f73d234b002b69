"""The C runtime (docs/architecture.md, "The C runtime"): the NumPy runtime's buffers and views; fused kernels as
generated C (render.py, compiler.py), MATMUL, embeddings, attention and copies by runtime_c/'s prebuilt module.
An op without a C kernel runs its NumPy forward, as everything does, with a warning, where no compiler or prebuilt
module exists. Every C call goes through CRuntime.call, so a repeated schedule replays its calls (program.py)."""
import collections
import math
import sys
import threading
import warnings

import numpy as np

from ... import dtype as dt
from ...env import debug_level, threads as env_threads
from ...graph import OPS
from ...ops import Group, collective
from ...ops.index import check_index
from ...ops.kernel import run_kernel
from ...views import contiguous_strides
from ...weak import WeakValues
from . import chain, compiler, copy, program, record, tune
from .views import batch_runs, matrix_layout, read_in_place
from ..base import kernels, load_kernels
from ..memory import track, untrack
from ..numpy.runtime import NumpyRuntime
from .render import render

KERNELS = kernels("c")


def _load_prebuilt():
    try:
        from ... import _kernels
        return _kernels.ffi, _kernels.lib
    except ImportError:
        warnings.warn("tinyllm: the prebuilt C module tinyllm._kernels is missing (reinstall with `pip install -e .`, "
                      "which needs a C compiler): matmuls and embeddings run on NumPy", RuntimeWarning, stacklevel=4)
        return None, None


def _per_thread(name, doc):
    """A property each thread sets for itself (in the runtime's threading.local)."""
    return property(lambda self: getattr(self._local, name, None),
                    lambda self, value: setattr(self._local, name, value), doc=doc)


class CRuntime(NumpyRuntime):
    name = "c"
    chains = True
    fuses = multi_output_kernels = True
    kernels = KERNELS  # op -> fn(runtime, node, inputs); None back (float64, no prebuilt module): NumPy forward

    def __init__(self):
        self.ffi, self.lib = _load_prebuilt()
        self.built = {}  # (CPU path, (Kernel, dtypes)) -> (compiled function, its params)
        self.functions = {}  # (CPU path, kernel name) -> compiled function (shape-generic ones serve many)
        self.pool = {}  # (shape, dtype) -> free arrays: a training step reuses the same buffers every time
        self.made = WeakValues()  # id -> array, for the arrays empty() allocated
        self.compiles = compiler.available()
        self.replays = True  # replay schedules from their recorded C calls (program.py)
        self._local = threading.local()  # .recorder, .observed (below)
        self.arena_lock = threading.Lock()  # one replay at a time uses the arena (program.execute)
        self._arena = None  # scratch memory of replayed schedules (program.py)
        threads = env_threads()  # 0: automatic, the cores other processes leave free (runtime_c/threads.h)
        if self.lib is not None:
            self.lib.tl_set_num_threads(threads)
        elif threads > 0:
            _set_omp_threads(threads)
        # the float32 products run, (batch, transA, transB, M, N, K) -> count, and this machine's tuning (tune.py)
        self.shapes = collections.Counter()
        self.tuning = tune.load(self.lib)
        # the generated kernels that recorded runs (tinyllm.jit's) ran until a search: (kernel key, buffers,
        # params) -> count (tune.Kernels); None: not watched (a tuning is applied, or tuning is off)
        self.generated_runs = collections.Counter() if self.tuning is None and tune.enabled() else None

    def execute(self, schedule, feeds=(), donate=()):
        cpu = compiler.path()  # kernels compiled for another CPU path (compiler.set_path) are not these
        if self.name not in schedule.prepared or schedule.prepared["c path"] != cpu:
            schedule.prepared[self.name] = self._compile([n for n in schedule.kernels if n.op == "FUSED"], cpu)
            schedule.prepared["c path"] = cpu
        self._fns = schedule.prepared[self.name]
        if self.lib is not None:  # re-measures the free cores when due; sets this thread's OpenMP default to them
            self.lib.tl_get_num_threads()
        with np.errstate(all="ignore"):  # IEEE results (inf, nan) as torch gives them, without warnings
            vals = self.input_values(schedule, feeds)
            if not self.replays or debug_level():  # TINYLLM_DEBUG times each kernel: no replay then
                return self.run_schedule(schedule, vals)
            return program.execute(self, schedule, vals, donate)

    recorder = _per_thread("recorder", "The record.CallRecorder watching this thread's run, or None.")
    observed = _per_thread("observed", "A list that each Program.run on this thread reports to (program.execute), "
                           "or None.")

    def chain(self, tape, observed, moved):
        made = None if moved else chain.build(self, tape, observed)  # (a Chain writes every assigned array in place)
        if made is not None and self.lib is not None and self.tuning is None and tune.enabled() and \
                (self.shapes or self.generated_runs):
            # a jitted step in its steady state: its products and kernels are known, and this machine has no tuning
            self.tuning = tune.tune_and_store(self.lib, self._one_run(observed), runtime=self,
                                              payback=tune.PAYBACK_RUNS, run_seconds=tape.seconds)
            self.generated_runs = None
        return made

    def _one_run(self, observed):
        """The float32 products of one run of the step whose replay `observed` saw, from its programs' C calls, and
        generated_runs scaled to one run: both count every run since the start (the eager step, the recordings),
        and the search's payback is reckoned in runs."""
        shapes, generated = collections.Counter(), 0
        mine = {id(fn) for fn in self.functions.values()}
        for run, *_ in observed:
            for fn, args in run.calls:
                if fn is self.lib.tl_sgemm_batched2:
                    shapes[args[0] * args[1], args[2], args[3], args[4], args[5], args[6]] += 1
                generated += id(fn) in mine
        total = sum(self.generated_runs.values()) if self.generated_runs else 0
        if total:
            self.generated_runs = collections.Counter({k: n * generated / total
                                                       for k, n in self.generated_runs.items()})
        return dict(shapes)

    def call(self, fn, *args):
        """fn(*args) for a C function of the prebuilt module or a generated kernel, arguments converted by
        record.c_args (an array becomes a pointer to its first element). A recorder, if one watches, sees it."""
        if self.recorder is not None:
            self.recorder.call(fn, args)
        return fn(*record.c_args(self.ffi or compiler.ffi, fn, args))

    def host_call(self, fn, *args):
        """fn(*args) for a Python function of row-major arrays the schedule read or allocated (an MPI call),
        returning None; a recorder, if one watches, notes it, and a replay makes it again over the same memory."""
        if self.recorder is not None:
            self.recorder.host(fn, args)
        return fn(*args)

    def contiguous(self, x):
        """x if it is row-major, else a row-major copy made in C into an array from the pool (so a recorded run
        repeats it)."""
        if x.flags.c_contiguous:  # 0-d arrays too (NumPy's ascontiguousarray would make them 1-d)
            return x
        if self.lib is None:
            return np.ascontiguousarray(x)
        out = self.empty(x.shape, x.dtype)
        copy.copy_into(self, out, x)
        return out

    def unrecorded(self, what):
        """A kernel function did work outside C (NumPy): a recorded run would not repeat it."""
        if self.recorder is not None:
            self.recorder.fail(what)

    def empty(self, shape, dtype):
        free = self.pool.get((shape, dtype))
        if free:
            out = track(free.pop())
        else:
            out = np.empty(shape, dtype)
            self.made[id(out)] = out
        if self.recorder is not None:
            self.recorder.allocated(out)
        return out

    def release(self, value):
        # Only an array this pool made (a NumPy forward's arrays may have shapes no kernel asks for again: they
        # would pile up) and that nothing else refers to (no view, output or feed; the two references counted are
        # this argument and getrefcount's) may be handed out again.
        if self.made.get(id(value)) is value and value.flags.writeable and sys.getrefcount(value) == 2:
            untrack(value)
            self.pool.setdefault((value.shape, value.dtype), []).append(value)

    def arena(self, nbytes):
        """Scratch memory of at least nbytes for a replayed schedule: one array, shared by all (one schedule runs
        at a time), replaced by a larger one when a schedule needs more."""
        if self._arena is None or self._arena.nbytes < nbytes:
            self._arena = np.empty(nbytes, np.uint8)
        return self._arena

    def empty_cache(self):
        self.pool.clear()
        self._arena = None  # a replay allocates it again

    def _key(self, node):
        return node.arg, node.dtype.name, tuple(s.dtype.name for s in node.src)

    def _compile(self, nodes, cpu):
        """{node: (compiled function, its params)} for these FUSED nodes on CPU path `cpu`, compiling what this
        process has not yet."""
        if not self.compiles:
            return {}
        found = self.compiled([self._key(n) for n in nodes], cpu)
        return {n: found[self._key(n)] for n in nodes}

    def compiled(self, keys, cpu):
        """{key: (compiled function, its params)} for kernel keys (Kernel, output dtype name, input dtype names)
        on CPU path `cpu`, compiling together those this process has not yet."""
        todo = {key: render(*key) for key in dict.fromkeys(keys) if (cpu, key) not in self.built}
        sources = {name: source for name, source, _ in todo.values() if (cpu, name) not in self.functions}
        if sources:
            if debug_level() >= 2:
                for source in sources.values():
                    print(source)
            self.functions.update(((cpu, name), fn) for name, fn in compiler.load(sources, cpu).items())
        for key, (name, _, params) in todo.items():
            self.built[cpu, key] = self.functions[cpu, name], params
        return {key: self.built[cpu, key] for key in keys}

    def run(self, node, ins):
        if self.recorder is not None:
            self.recorder.begin_kernel()
        kernel = self.kernels.get(node.op)
        out = kernel(self, node, ins) if kernel is not None else None
        out = out if out is not None else super().run(node, ins)
        if self.recorder is not None:
            self.recorder.end_kernel(node, out)
        return out

    def _fused(self, node, ins):
        compiled, kernel = self._fns.get(node), node.arg
        if compiled is not None:  # views read in place where the kernel's reads allow (views.read_in_place)
            kernel, ins = read_in_place(kernel, ins)
            if kernel is not node.arg:
                key = (kernel,) + self._key(node)[1:]
                compiled = self.compiled([key], compiler.path())[key]
        if kernel is node.arg:
            ins = [self.contiguous(x) for x in ins]
        if compiled is None:
            return run_kernel(node.arg, *ins, out_dtype=node.dtype)
        out = self.empty(node.shape, node.dtype.np)
        if out.size and math.prod(node.arg.shape):
            if self.recorder is not None:  # (the output may take the place of an input of its own dtype only)
                self.recorder.in_step(frozenset(i for i in in_step(kernel, ins) if ins[i - 1].dtype == out.dtype))
            fn, params = compiled
            if self.generated_runs is not None and self.recorder is not None:  # (a jitted step's: the program's)
                self.generated_runs[(kernel,) + self._key(node)[1:], tune.buffers([out, *ins]), params] += 1
            self.call(fn, [out, *ins, *params])
        elif out.size:
            self.unrecorded("an empty reduction")
            fill = 0 if node.arg.reduce[0] == "SUM" else -np.inf
            out[...] = dt.encode(fill, node.dtype) if node.dtype.is_low else fill
        return out

    def _matmul(self, node, ins):
        a, b = ins
        gemm = _GEMMS.get(node.dtype.name)
        if gemm is None or a.dtype != node.dtype.np or b.dtype != node.dtype.np or self.lib is None:
            return None
        batch, (M, K), N = a.shape[:-2], a.shape[-2:], b.shape[-1]
        out = self.empty(batch + (M, N), node.dtype.np)
        if not out.size:
            return out
        if K == 0:
            self.unrecorded("a matmul over an empty axis")
            out[...] = 0
            return out
        la, lb = matrix_layout(a), matrix_layout(b)
        if la is None or batch_runs(batch, a) is None:  # a view sgemm cannot read in place: copy it
            a = self.contiguous(a)
            la = matrix_layout(a)
        if lb is None or batch_runs(batch, b) is None:
            b = self.contiguous(b)
            lb = matrix_layout(b)
        runs = batch_runs(batch, a, b, out)
        if runs is None:  # each is readable alone, but their batch axes do not run alike
            a, b = self.contiguous(a), self.contiguous(b)
            la, lb, runs = matrix_layout(a), matrix_layout(b), batch_runs(batch, a, b, out)
        (n0, (a0, b0, c0)), (n1, (a1, b1, c1)) = ([(1, (0, 0, 0))] * 2 + runs)[-2:]
        beta = (0.0,) if gemm == "tl_sgemm_batched2" else ()  # the 16-bit products always overwrite
        if beta:
            self.shapes[n0 * n1, la[0], lb[0], M, N, K] += 1
        self.call(getattr(self.lib, gemm), n0, n1, la[0], lb[0], M, N, K, a, la[1], a0, a1, b, lb[1], b0, b1,
                  *beta, out, N, c0, c1)
        return out

    def _collective(self, node, ins):
        """The op's MPI work as a host call on the input made row-major and an array from the pool, so a schedule
        holding collectives replays too (16-bit floats, which MPI cannot add, run the NumPy forward)."""
        if node.dtype.is_low:
            return None
        x = self.contiguous(ins[0])
        out = self.empty(node.shape, node.dtype.np)
        if out.size:  # (nothing to combine: every rank has the same shapes)
            self.host_call(OPS[node.op].into, x, out, node.arg)
        return out

    def _host_op(self, node, ins):
        """A host op (Group.HOST: tinyllm.linalg's decompositions through LAPACK): its NumPy forward as a host call
        on the inputs made row-major, into an array from the pool, so a schedule holding one replays too."""
        if node.dtype.is_low or any(s.dtype.is_low for s in node.src):
            return None
        xs = [self.contiguous(x) for x in ins]
        out = self.empty(node.shape, node.dtype.np)
        self.host_call(_forward_into, node.op, node.arg, out, *xs)
        return out

    def _wait(self, node, ins):
        (y,) = ins
        if y.size:
            self.host_call(collective.complete, y, collective.pending(y))
        return y

    def _gather(self, node, ins):
        x, idx = ins
        axis = node.arg
        return self._embedding("embedding_forward", node, x, idx, axis, x.shape[axis], x.shape[axis + 1:],
                               x.itemsize)

    def _scatter_add(self, node, ins):
        dy, idx = ins
        axis, n = node.arg
        if dy.dtype != np.float32:
            return None
        return self._embedding("embedding_backward", node, dy, idx, axis, n, dy.shape[axis + idx.ndim:])

    def _embedding(self, kernel, node, x, idx, axis, n, inner_shape, *size):
        """GATHER (rows copied: any dtype, `size` bytes an element) or SCATTER_ADD (float32 sums) of `x` along
        `axis`, through runtime_c/embedding.c: the table side has n rows on that axis, the axes before it are the
        kernel's `outer`, those after its rows `inner`."""
        if self.lib is None:
            return None
        x, idx = self.contiguous(x), self.contiguous(idx)
        out = self.empty(node.shape, x.dtype)
        bad = self.call(getattr(self.lib, kernel), out, x, idx, math.prod(x.shape[:axis]), n, idx.size,
                        math.prod(inner_shape), *size)
        if bad >= 0:
            check_index(idx, n, node.op, axis, x.shape)  # raises, naming the index and the shapes
        return out


# MATMUL's C function per dtype (operands and result alike): runtime_c/sgemm.h
_GEMMS = {"float32": "tl_sgemm_batched2", "float16": "tl_gemm_f16_batched2", "bfloat16": "tl_gemm_bf16_batched2"}


def in_step(kernel, ins):
    """Positions (in the kernel's argument, the output at 0) of the inputs an elementwise kernel reads only at the
    element it is storing, each as its whole self: output j's element x is computed from their element x alone.
    The output may be written over such an input (at the place of one of its outputs, see fuse_outputs): each
    element is read before the same element is written, and by no other iteration."""
    if kernel.reduce is not None:
        return frozenset()
    size, own = math.prod(kernel.shape), contiguous_strides(kernel.shape)
    aligned = {i for i, x in enumerate(ins) if x.size == size}
    for i, strides, offset in kernel.ins:
        if tuple(strides) != own or offset:
            aligned.discard(i)
    return frozenset(1 + i for i in aligned)


KERNELS.register("FUSED")(CRuntime._fused)
KERNELS.register("MATMUL")(CRuntime._matmul)
KERNELS.register("GATHER")(CRuntime._gather)
KERNELS.register("SCATTER_ADD")(CRuntime._scatter_add)
KERNELS.register("WAIT")(CRuntime._wait)
KERNELS.register(*Group.COLLECTIVE)(CRuntime._collective)
KERNELS.register(*Group.HOST)(CRuntime._host_op)


def _forward_into(op, arg, out, *xs):
    """out = op's NumPy forward of xs (a host call: CRuntime._host_op)."""
    out[...] = OPS[op].evaluate(*xs, arg=arg)
load_kernels(__package__)  # attention.py (FLASH_ATTN, _BWD), qmatmul.py (QMATMUL), copy.py (copies)


def _set_omp_threads(n):
    """Generated kernels use OpenMP's default team; set it for the threads that launch them."""
    import cffi
    ffi = cffi.FFI()
    ffi.cdef("void omp_set_num_threads(int);")
    try:
        ffi.dlopen("libgomp.so.1").omp_set_num_threads(n)
    except OSError:
        pass  # no libgomp: kernels were built without OpenMP and run on one thread anyway
