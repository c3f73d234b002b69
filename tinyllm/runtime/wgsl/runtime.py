"""The WGSL runtime: tinyllm's kernels as WebGPU compute shaders, run through wgpu-py (device.py); how it runs a
schedule is in docs/architecture.md, "The WGSL runtime".

Dtypes: float32; float16 where the adapter has `shader-f16` (`runtime.has_f16`), and without it stored only (uploaded
and read back, e.g. QMATMUL's scales: a kernel that would compute in float16 is refused); int64 is stored as 32-bit
(WGSL has no 64-bit integers: a value outside ±2³¹ is refused with an error when it is uploaded); bool as one u32
per element; int8 and uint8 (quantized weights) as bytes packed four to a u32 word, the buffer padded to whole
words. Kernels that read bytes unpack them from the words (wgsl/qweight.wgsl); copies of bytes set each byte of
a word with atomic operations (wgsl/copy_bytes.wgsl); other ops on int8 / uint8 values run on the host. float64
and bfloat16 are refused, at upload and when a kernel would make one: WGSL has no portable f64 and no bf16, so
`.float()` first.

QMATMUL reads its float16 scales as raw 16-bit halves two to a u32 word (unpack2x16float), so its kernel needs
no `shader-f16`.
"""
import contextlib
import math
import os
import time
import warnings

import numpy as np

from ... import dtype as dt
from ...env import debug_level
from ...graph import OPS
from ...ops import Group
from ...ops.kernel import Kernel
from ...ops.qmatmul import activations
from ...views import contiguous_strides, view_strides
from ..base import Buffer, Runtime, kernels, load_kernels
from . import render
from . import chain
from .device import Device
from .plan import Plans

HOST = {"float32": np.float32, "float16": np.float16, "int64": np.int32, "bool": np.uint32,  # storage per dtype
        "int8": np.int8, "uint8": np.uint8}  # (bytes, four to a u32 word of the GPU buffer)
BYTES = ("int8", "uint8")
# ops whose WGSL kernels handle one-byte values (the rest run on the host when they meet one): views and copies,
# which move stored bits, and the quantized matmul
BYTE_KERNELS = Group.COPY | Group.QUANTIZED
ERROR_SLOTS = 64  # index kernels since the last read-back that each report out-of-range indices on their own
# op -> fn(runtime, node, inputs) -> Value (docs/architecture.md, "Adding a kernel")
KERNELS = kernels("wgsl")


class Value:
    """A tensor on the GPU: a view (shape, strides and offset in elements) of a Storage holding `dtype`."""
    __slots__ = ("storage", "shape", "elem_strides", "offset", "dtype", "host")

    def __init__(self, storage, shape, dtype, strides=None, offset=0):
        self.storage, self.shape, self.dtype, self.offset = storage, tuple(shape), dtype, offset
        self.elem_strides = contiguous_strides(self.shape) if strides is None else tuple(strides)
        self.host = None  # the values on the host once read (buffers never change)

    # NumPy's names, in bytes of the tensor's dtype, for views.strides_of: a realized transpose stays one
    @property
    def itemsize(self):
        return self.dtype.itemsize

    @property
    def strides(self):
        return tuple(s * self.dtype.itemsize for s in self.elem_strides)

    @property
    def contiguous(self):
        return self.offset == 0 and all(st == cs for st, cs, s in zip(self.elem_strides, contiguous_strides(self.shape),
                                                                        self.shape) if s != 1)

    def view(self, shape, strides, offset=None):
        return Value(self.storage, shape, self.dtype, strides, self.offset if offset is None else offset)


def _storage_name(dtype):
    if dtype is dt.float64:
        raise TypeError("the WGSL runtime has no float64 (WebGPU has no portable 64-bit float): convert the tensor "
                        "with .float() or pick another runtime (device='numpy' or 'c')")
    if dtype is dt.bfloat16:
        raise TypeError("the WGSL runtime has no bfloat16 (WGSL has no bf16 type): convert the tensor with .float() "
                        "(or .half() where the adapter has shader-f16), or pick another runtime (device='numpy' or "
                        "'c')")
    return dtype.name


class WGSLRuntime(Runtime):
    kernels = KERNELS
    name = "wgsl"
    fuses = row_kernels = True

    def __init__(self):
        self.gpu = Device()
        # a kernel binds its output and each input as a storage buffer: fusion keeps within the device's limit
        self.max_kernel_inputs = self.gpu.limits["max-storage-buffers-per-shader-stage"] - 1
        self.info, self.features, self.has_f16 = self.gpu.info, self.gpu.features, self.gpu.has_f16
        self.workgroup = 64 if self.info["adapter_type"] == "CPU" else 256
        self.constants = {}  # (value, dtype) -> one-element Storage, never recycled
        self.errors = self.gpu.upload(np.zeros(ERROR_SLOTS, np.uint32))
        self.index_ops = []  # what each error slot's kernel was, since the last check
        # schedules replayed from their recorded dispatches (plan.py); TINYLLM_WGSL_PLANS=0 runs every kernel's Python
        self.plans = Plans() if os.environ.get("TINYLLM_WGSL_PLANS", "1") != "0" else None
        self.chains = self.plans is not None  # and a jit step's replays chained (chain.py)
        self.held_back = 0  # inside together(): schedules' work waits for one submit at the end
        self.observed = None  # while a jit replay is watched for a Chain: what each schedule's run saw (execute)
        self.warned = set()  # ops that ran on the host
        if debug_level():
            print(f"[tinyllm wgsl] adapter {self.info['device']} ({self.info['backend']}, {self.info['adapter_type']})"
                  f", features: {', '.join(self.features) or 'none'}")

    def __repr__(self):
        return f"<WGSLRuntime {self.info['device']} via {self.info['backend']}>"

    # ---- host <-> device ----
    def from_numpy(self, array, dtype):
        array = self.host_array(array, dtype)
        return Buffer(self, Value(self.gpu.upload(array), array.shape, dtype), array.shape, dtype)

    @staticmethod
    def host_array(array, dtype):
        """`array` as a buffer of `dtype` holds it on the GPU."""
        name = _storage_name(dtype)
        array = np.asarray(array, dtype=dtype.np)
        if dtype is dt.int64 and array.size and (array.min() < -2**31 or array.max() >= 2**31):
            raise OverflowError(f"the WGSL runtime stores int64 as 32-bit integers (WGSL has none wider), and this "
                                f"tensor holds values in [{array.min()}, {array.max()}]: keep them within ±2³¹")
        return array.astype(HOST[name])

    def storage(self, buffer):
        """(a number standing for the GPU buffer, the view's offset in elements, the buffer's bytes): WebGPU gives
        no addresses, so a storage is numbered by its Python object, which views of it share."""
        value = buffer.data
        return id(value.storage), value.offset, value.storage.nbytes

    def to_numpy(self, buffer):
        value = buffer.data
        if value.host is None:
            itemsize = np.dtype(HOST[value.dtype.name]).itemsize
            span = 1 + value.offset + sum((s - 1) * st for s, st in zip(value.shape, value.elem_strides)) \
                if all(value.shape) else 0
            raw = np.frombuffer(self.gpu.download(value.storage, span * itemsize), HOST[value.dtype.name])
            self.check_errors()
            flat = raw[value.offset:] if span else raw
            view = np.lib.stride_tricks.as_strided(flat, value.shape, [s * itemsize for s in value.elem_strides]) \
                if span else np.zeros(value.shape, raw.dtype)
            value.host = np.array(view, dtype=value.dtype.np)  # its own memory, of the tensor's dtype
            value.host.flags.writeable = False
        return value.host

    def check_errors(self):
        """Raise the IndexError an index kernel flagged since the last check."""
        if not self.index_ops:
            return
        flags = np.frombuffer(self.gpu.download(self.errors, 4 * ERROR_SLOTS), np.uint32)
        ops, self.index_ops = self.index_ops, []
        bad = [ops[i] for i in np.flatnonzero(flags[:len(ops)])]
        if bad:
            self.gpu.queue.write_buffer(self.errors.buffer, 0, np.zeros(ERROR_SLOTS, np.uint32).tobytes())
            raise IndexError(f"{bad[0]}: an index is out of range (the WGSL runtime checks on the GPU and reports "
                             "when the host next reads a value; those elements were set to 0)")

    def empty_cache(self):
        if self.plans is not None:
            self.plans.clear()                          # (they hold bind groups over the freed buffers)
        self.gpu.empty_cache()

    @contextlib.contextmanager
    def together(self):
        """A jit replay's schedules in one command buffer, submitted when the block ends (a read-back or an upload
        inside it still submits what came before, so nothing runs out of order)."""
        self.held_back += 1
        try:
            yield
        finally:
            self.held_back -= 1
            if not self.held_back:
                self.gpu.submit()

    def chain(self, tape, observed, moved):
        return chain.build(self, tape, observed)

    def value(self, storage, shape, dtype, strides=None, offset=0):
        return Value(storage, shape, dtype, strides, offset)

    # ---- what kernels use ----
    def empty(self, shape, dtype):
        """A fresh row-major Value."""
        itemsize = np.dtype(HOST[_storage_name(dtype)]).itemsize
        return Value(self.gpu.alloc(math.prod(shape) * itemsize), shape, dtype)

    def dispatch(self, source, values, groups, read_only=None):
        """Record `source` over `groups` workgroups; binding i is values[i] (all but binding 0 read-only unless
        read_only says otherwise). A dispatch with no work is skipped."""
        if read_only is None:
            read_only = [False] + [True] * (len(values) - 1)
        if all(groups):
            self.gpu.dispatch(source, [v.storage for v in values], read_only, groups)

    def copy_into(self, out, where, src):
        """out's elements at the view `where` = (strides, offset) become src's."""
        if src.dtype.name in BYTES:
            source, groups = render.render_copy_bytes(src.shape, (tuple(where[0]), where[1]),
                                                      (tuple(src.elem_strides), src.offset), self.workgroup)
            self.dispatch(source, [out, src], groups)
            return
        source, groups = render.render_copy(src.shape, (tuple(where[0]), where[1]),
                                            (tuple(src.elem_strides), src.offset), src.dtype.name, self.workgroup)
        self.dispatch(source, [out, src], groups)

    def contiguous(self, value):
        if value.contiguous:
            return value
        out = self.empty(value.shape, value.dtype)
        if math.prod(value.shape):
            self.copy_into(out, (out.elem_strides, 0), value)
        return out

    def constant(self, value, shape, dtype):
        key = (value, math.copysign(1.0, value) if isinstance(value, float) else 0, dtype.name)
        if key not in self.constants:
            self.constants[key] = self.gpu.upload(np.array([value], dtype=dtype.np).astype(HOST[_storage_name(dtype)]),
                                                  pooled=False)
        return Value(self.constants[key], shape, dtype, (0,) * len(shape))

    def error_slot(self, what):
        if self.gpu.log is not None:
            self.gpu.log.append(("slot", what))
        self.index_ops.append(what)
        return min(len(self.index_ops), ERROR_SLOTS) - 1

    # ---- running a schedule ----
    def execute(self, schedule, feeds=(), donate=()):
        if self.observed is None:
            return self._execute(schedule, feeds)
        self.gpu.trace, slots = [], len(self.index_ops)
        try:
            outs = self._execute(schedule, feeds)
        finally:
            trace, self.gpu.trace = self.gpu.trace, None
        self.observed.append(chain.Seen([f.data for f in feeds], list(outs), trace, self.index_ops[slots:]))
        return outs

    def _execute(self, schedule, feeds):
        vals = self.input_values(schedule, feeds)
        key = None
        if self.plans is not None:                      # replayed from the dispatches it recorded (plan.py)
            inputs = list(vals.values())
            key = self.plans.key(schedule, inputs, len(self.index_ops))
            plan = self.plans.get(key, schedule)
            if plan is not None:
                outs = plan.replay(self, inputs)
                if outs is not None:
                    self.plans.replays += 1
                    if not self.held_back:
                        self.gpu.submit()
                    return outs
                self.plans.drop(key)
            self.gpu.log = []
        try:
            outs = self._run_kernels(schedule, vals)
        finally:
            log, self.gpu.log = self.gpu.log, None
        if key is not None:
            self.plans.record(key, schedule, log, [(b.data, b.shape, b.dtype) for b in outs], self.gpu.native)
        if not self.held_back:
            self.gpu.submit()
        return outs

    def _run_kernels(self, schedule, vals):
        """Each kernel of the schedule through its kernel function; -> the outputs (Buffers), not yet submitted."""
        protected = {id(v.storage) for v in vals.values()}
        users = {}  # storage id -> live values on it: a storage goes back to the pool when none is left
        for v in vals.values():
            users[id(v.storage)] = users.get(id(v.storage), 0) + 1
        debug = debug_level()
        for node, dead in zip(schedule.kernels, schedule.frees):
            start = time.perf_counter()
            out = self.run(node, [vals[s] for s in node.src])
            if debug:
                print(f"[tinyllm wgsl] {node.op:<12} {str(node.shape):<20} recorded in "
                      f"{(time.perf_counter() - start) * 1e6:7.1f} µs")
            vals[node] = out
            users[id(out.storage)] = users.get(id(out.storage), 0) + 1
            for d in dead:
                storage = vals.pop(d).storage
                users[id(storage)] -= 1
                if users[id(storage)] == 0 and id(storage) not in protected:
                    self.gpu.release(storage)
        outs = []
        for n, fresh in zip(schedule.outputs, schedule.fresh):
            v = vals[n]
            # as on the NumPy runtime: a broadcast (a constant, an expand) gets real memory, and a result the
            # passes reduced to an input gets its own
            if any(st == 0 and s > 1 for s, st in zip(v.shape, v.elem_strides)) or (
                    fresh and id(v.storage) in protected):
                v = self.copy(v)
            outs.append(Buffer(self, v, n.shape, n.dtype))
        return outs

    def copy(self, value):
        out = self.empty(value.shape, value.dtype)
        if math.prod(value.shape):
            self.copy_into(out, (out.elem_strides, 0), value)
        return out

    def run(self, node, ins):
        if node.op not in BYTE_KERNELS and any(d.dtype.name in BYTES for d in (node, *node.src)):
            return self.on_host(node, ins, "on int8 / uint8 values")
        fn = self.kernels.get(node.op)
        if fn is not None:
            return fn(self, node, ins)
        if node.op in Group.HOST:  # a host op by design (tinyllm.linalg's decompositions): no warning
            return self.host_forward(node.op, node, ins)
        if node.op in Group.ELEMENTWISE or node.op in Group.REDUCE:  # not fused (a runtime without the fusion pass)
            return _fused(self, _single_op_node(node), ins)
        return self.on_host(node, ins)

    def on_host(self, node, ins, why=""):
        """An op with no WGSL kernel runs its NumPy forward: the work recorded so far is submitted, the inputs
        read back, the result uploaded. Correct but slow, so it warns once per op (and reason)."""
        if (node.op, why) not in self.warned:
            self.warned.add((node.op, why))
            warnings.warn(f"tinyllm: the WGSL runtime has no kernel for op {node.op}{' ' + why if why else ''} and "
                          "runs it on the host (NumPy), reading its inputs back; register one with "
                          "tinyllm.runtime.base.kernels('wgsl').register", RuntimeWarning, stacklevel=2)
        return self.host_forward(node.op, node, ins)

    def host_forward(self, op, node, ins):
        """`op`'s NumPy forward on the values of `ins` read back, uploaded as `node`'s value."""
        arrays = [self.to_numpy(Buffer(self, v, v.shape, v.dtype)) for v in ins]
        with np.errstate(all="ignore"):
            result = OPS[op].evaluate(*arrays, arg=node.arg)
        return self.from_numpy(result, node.dtype).data

    def matmul_tiles(self, m, n):
        """(BM, BN, BK, TM, TN) for an m x n output, within this device's workgroup limits.
        TINYLLM_WGSL_MATMUL_TILE=BMxBNxBKxTMxTN overrides it (for tuning)."""
        forced = os.environ.get("TINYLLM_WGSL_MATMUL_TILE")
        if forced:
            return tuple(int(x) for x in forced.lower().split("x"))
        lim = self.gpu.limits
        # 128-tiles only where there are enough of them (256) to keep a big GPU's cores busy; otherwise more,
        # smaller tiles run faster (bench/RESULTS.md, "WGSL runtime on a GPU")
        big_enough = {128: -(-m // 128) * -(-n // 128) >= 256, 64: min(m, n) >= 256, 32: min(m, n) >= 32, 16: True}
        for tiles in ((128, 128, 16, 8, 8), (64, 64, 16, 4, 4), (32, 32, 16, 2, 2), (16, 16, 16, 1, 1)):
            bm, bn, bk, tm, tn = tiles
            fits = (bm // tm) * (bn // tn) <= lim["max-compute-invocations-per-workgroup"] and \
                16 * bk * (render.shared_row_vec4s(bm) + render.shared_row_vec4s(bn)) <= \
                lim["max-compute-workgroup-storage-size"]
            if fits and big_enough[bm]:
                return tiles
        return 16, 16, 16, 1, 1


def _single_op_node(node):
    from ...graph import Node
    ins = tuple((i, contiguous_strides(s.shape), 0) for i, s in enumerate(node.src))
    if node.op in Group.REDUCE:
        src = node.src[0]
        code = (("IN", 0, (), src.dtype.name), ("COPY", None, (0,), src.dtype.name))
        kernel = Kernel(src.shape, (node.op, node.arg), ins, code)
    else:
        code = tuple(("IN", i, (), s.dtype.name) for i, s in enumerate(node.src))
        code += ((node.op, node.arg, tuple(range(len(node.src))), node.dtype.name),)
        kernel = Kernel(node.shape, None, ins, code)
    return Node("FUSED", node.src, kernel, node.shape, node.dtype)


# ---- kernels ----

@KERNELS.register("FUSED")
def _fused(rt, node, ins):
    ins = [rt.contiguous(v) for v in ins]
    out = rt.empty(node.shape, node.dtype)
    if math.prod(node.shape):
        for *_, name in node.arg.code:  # a dtype WGSL lacks inside the kernel (a cast through it) is refused too
            _storage_name(dt.from_name(name))
        source, groups = render.render(node.arg, _storage_name(node.dtype), tuple(_storage_name(v.dtype) for v in ins),
                                       rt.workgroup, "subgroup" in rt.features)
        rt.dispatch(source, [out, *ins], groups)
    return out


@KERNELS.register("RESHAPE")
def _reshape(rt, node, ins):
    (x,) = ins
    strides = view_strides(x.shape, x.elem_strides, node.shape)
    if strides is None:  # not expressible as a view (e.g. merging transposed axes): copy first
        x = rt.contiguous(x)
        strides = contiguous_strides(node.shape)
    return x.view(node.shape, strides)


@KERNELS.register("PERMUTE")
def _permute(rt, node, ins):
    (x,) = ins
    return x.view(node.shape, [x.elem_strides[i] for i in node.arg])


@KERNELS.register("EXPAND")
def _expand(rt, node, ins):
    (x,) = ins
    return x.view(node.shape, [0 if s != a else st for s, a, st in zip(x.shape, node.arg, x.elem_strides)])


@KERNELS.register("SHRINK")
def _shrink(rt, node, ins):
    (x,) = ins
    offset = x.offset + sum(start * st for (start, _, _), st in zip(node.arg, x.elem_strides))
    return x.view(node.shape, [st * step for st, (_, _, step) in zip(x.elem_strides, node.arg)], offset)


@KERNELS.register(*Group.IDENTITY, "WAIT")  # marks for autograd and the passes: the value itself
def _identity(rt, node, ins):
    return ins[0]


@KERNELS.register(*Group.COLLECTIVE)
def _collective(rt, node, ins):
    """MPI combines host memory: the value is read back, combined and uploaded. A non-blocking all-reduce
    completes at once here (the upload needs its result), and its WAIT passes the value on."""
    return rt.host_forward("ALLREDUCE" if node.op == "IALLREDUCE" else node.op, node, ins)




@KERNELS.register("CONTIGUOUS")
def _contiguous(rt, node, ins):
    return rt.contiguous(ins[0])


@KERNELS.register("PAD")
def _pad(rt, node, ins):
    (x,) = ins
    shape, where = node.arg
    out = _fill(rt, shape, node.dtype, 0)
    if math.prod(x.shape):
        strides = contiguous_strides(shape)
        rt.copy_into(out, ([st * step for st, (_, _, step) in zip(strides, where)],
                           sum(start * st for (start, _, _), st in zip(where, strides))), x)
    return out


def _fill(rt, shape, dtype, value):
    out = rt.empty(shape, dtype)
    if math.prod(shape):
        rt.copy_into(out, (out.elem_strides, 0), rt.constant(value, shape, dtype))
    return out


@KERNELS.register("CAT")
def _cat(rt, node, ins):
    out = rt.empty(node.shape, node.dtype)
    strides, start = out.elem_strides, 0
    for x in ins:
        if math.prod(x.shape):
            rt.copy_into(out, (strides, start * strides[node.arg]), x)
        start += x.shape[node.arg]
    return out


def _index_dims(x_shape, axis, idx_shape):
    return math.prod(x_shape[:axis]), math.prod(idx_shape), math.prod(x_shape[axis + len(idx_shape):])


@KERNELS.register("GATHER")
def _gather(rt, node, ins):
    x, idx = (rt.contiguous(v) for v in ins)
    axis = node.arg
    out = rt.empty(node.shape, node.dtype)
    if math.prod(node.shape):
        outer, n_idx, inner = _index_dims(x.shape, axis, (1,))[0], math.prod(idx.shape), math.prod(x.shape[axis + 1:])
        slot = rt.error_slot(f"GATHER of input {x.shape} along axis {axis} by indices {idx.shape}")
        source, groups = render.render_index("gather", outer, n_idx, inner, x.shape[axis], x.dtype.name, slot,
                                             rt.workgroup)
        rt.dispatch(source, [out, x, idx, _errors(rt)], groups, [False, True, True, False])
    return out


@KERNELS.register("SCATTER_ADD")
def _scatter_add(rt, node, ins):
    x, idx = (rt.contiguous(v) for v in ins)
    axis, n = node.arg
    out = rt.empty(node.shape, node.dtype)
    if math.prod(node.shape):
        outer, n_idx, inner = _index_dims(x.shape, axis, idx.shape)
        slot = rt.error_slot(f"SCATTER_ADD of input {x.shape} into axis {axis} of size {n} by indices {idx.shape}")
        source, groups = render.render_index("scatter_add", outer, n_idx, inner, n, x.dtype.name, slot,
                                             rt.workgroup)
        rt.dispatch(source, [out, x, idx, _errors(rt)], groups, [False, True, True, False])
    return out


def _errors(rt):
    return Value(rt.errors, (ERROR_SLOTS,), dt.int64)


def _matrix_layout(x):
    """(fast axis, stride of the other axis, batch stride, offset) that read the last two axes of `x` in place
    ("k" fast: row-major; "r" fast: transposed), or None if x needs a copy."""
    rows, cols = x.shape[-2:]
    st = x.elem_strides
    if (rows > 1 and st[-2] == 0) or (cols > 1 and st[-1] == 0):
        return None  # a broadcast row or column has no leading dimension the kernel can step by: copy it
    if cols == 1 or st[-1] == 1:
        fast, ld = "row-major", st[-2] if rows > 1 else cols
    elif rows == 1 or st[-2] == 1:
        fast, ld = "transposed", st[-1] if cols > 1 else rows
    else:
        return None
    batch = [(n, s) for n, s in zip(x.shape[:-2], st[:-2]) if n > 1]
    for (n0, s0), (n1, s1) in zip(batch, batch[1:]):
        if s0 != s1 * n1:
            return None
    return fast, max(ld, 1), batch[-1][1] if batch else 0, x.offset


@KERNELS.register("MATMUL")
def _matmul(rt, node, ins):
    a, b = ins
    batch, (m, k), n = math.prod(a.shape[:-2]), a.shape[-2:], b.shape[-1]
    out = rt.empty(node.shape, node.dtype)
    if not math.prod(node.shape):
        return out
    if k == 0:
        return _fill(rt, node.shape, node.dtype, 0)
    if batch > rt.gpu.limits["max-compute-workgroups-per-dimension"]:
        raise ValueError(f"MATMUL of {a.shape} and {b.shape}: more batches ({batch}) than this device dispatches "
                         "at once: reshape the batch into the rows")
    la, lb = _matrix_layout(a), _matrix_layout(b)
    if la is None:
        a = rt.contiguous(a)
        la = _matrix_layout(a)
    if lb is None:
        b = rt.contiguous(b)
        lb = _matrix_layout(b)
    # in the kernel's terms: A's rows are m (fast "k" when row-major), B's rows are n (fast "r" when row-major)
    a_layout = ("k" if la[0] == "row-major" else "r",) + la[1:]
    b_layout = ("r" if lb[0] == "row-major" else "k",) + lb[1:]
    source, groups = render.render_matmul(batch, m, n, k, a_layout, b_layout, node.dtype.name, rt.matmul_tiles(m, n))
    rt.dispatch(source, [out, a, b], groups)
    return out


QMATMUL_GEMV_ROWS = 8  # up to this many rows of x, wgsl/qmatmul.wgsl; more, the weight dequantized once + MATMUL


@KERNELS.register("QMATMUL")
def _qmatmul(rt, node, ins):
    """x · dequant(W)ᵀ: for few rows (decode) wgsl/qmatmul.wgsl, reading each weight byte once per 4 rows; for
    more, DEQUANT into a float32 scratch buffer read by the tiled matmul, whose tiles reuse each weight across
    many rows."""
    x, qweight, scales = (rt.contiguous(v) for v in ins)
    (m, k), n = x.shape, node.shape[1]
    if activations(node.arg) and m * k:  # dynamic: x as the values its int8 quantization stands for
        quantized = rt.empty(x.shape, x.dtype)
        source, groups = render.render_quantize_activations(m, k, node.arg[1], workgroup=rt.workgroup)
        rt.dispatch(source, [quantized, x], groups)
        x = quantized
    if m > QMATMUL_GEMV_ROWS and k:
        w = _dequant(rt, _Shape((n, k), dt.float32, node.arg), [qweight, scales])
        out = _matmul(rt, _Shape(node.shape, node.dtype), [x, w.view((k, n), (1, k))])
        rt.gpu.release(w.storage)  # (later dispatches run after this one: the pool may hand it out again)
        return out
    out = rt.empty(node.shape, node.dtype)
    if not m * n:
        return out
    if -(-m // render.QMATMUL_ROWS) > render.MAX_GROUPS:
        raise ValueError(f"QMATMUL of x {x.shape}: more row blocks than this device dispatches at once: split x's rows")
    source, groups = render.render_qmatmul(m, n, k, *node.arg[:2], workgroup=rt.workgroup)  # (K: x's)
    rt.dispatch(source, [out, x, qweight, scales], groups)
    return out


@KERNELS.register("DEQUANT")
def _dequant(rt, node, ins):
    qweight, scales = (rt.contiguous(v) for v in ins)
    out = rt.empty(node.shape, node.dtype)
    if math.prod(node.shape):
        source, groups = render.render_dequant(*node.shape, *node.arg[:2], workgroup=rt.workgroup)
        rt.dispatch(source, [out, qweight, scales], groups)
    return out


class _Shape:
    """What a kernel function reads of a node (shape, dtype, arg), for one kernel calling another."""
    def __init__(self, shape, dtype, arg=None):
        self.shape, self.dtype, self.arg = tuple(shape), dtype, arg


load_kernels(__package__)  # attention.py (FLASH_ATTN, _BWD), rowwise.py (ROW_*), sort.py (ARGSORT)
