"""A schedule's recorded C calls (record.py) replayed as a Program, without the kernel functions' Python
(docs/architecture.md, "Replayed schedules"). Pointers into the arena (arena.py) are bound once per arena; only
those into the inputs and the returned arrays (made afresh, or taking over donated inputs: donate.py) are
written before each run. Views cost nothing: their offsets and strides are in the recorded arguments."""
import functools
import weakref

import numpy as np

from ...ops import collective
from . import compiler
from ..base import Buffer
from .arena import ALIGN, pack, peak
from .donate import donors, take
from .record import CallRecorder, CStruct, HostArray, HostCall, NotRecordable, Ref
from .views import address
from ..memory import note_peak, owner, track


class Program:
    """The recorded calls of one schedule run, ready to replay."""

    def __init__(self, runtime, rec, schedule, outputs):
        self.ffi = runtime.ffi or compiler.ffi
        self.calls = rec.calls
        # what the schedule returns: ("fresh", alloc, None or the view (offset, shape, strides)), ("input", i) or
        # ("empty", shape)
        self.outputs, fresh = [], {}
        for n, v in zip(schedule.outputs, outputs):
            if v.dtype != n.dtype.np:
                raise NotRecordable(f"output {n.shape} changes dtype")
            if not v.size:
                self.outputs.append(("empty", v.shape))
                continue
            region = rec.find(v)
            if region.kind == "input" and v is rec.input_arrays[region.index]:
                self.outputs.append(("input", region.index))
            elif region.kind == "alloc":
                fresh.setdefault(region, len(fresh))
                whole = v.base is None and v.flags.c_contiguous  # the allocation itself, not a view of it
                self.outputs.append(("fresh", fresh[region], None if whole else (address(v) - region.base,
                                                                                  v.shape, v.strides)))
            else:
                raise NotRecordable(f"output {n.shape} is a view of an input")
        for region, j in fresh.items():
            region.place = ("fresh", j)
        self.fresh = [(r.shape, r.dtype) for r in fresh]
        # calls that can report bad input (embeddings) take nothing over: the normal path reruns on the inputs
        self.checks = any(not isinstance(fn, HostCall) and self.ffi.typeof(fn).result.cname != "void"
                          for fn, _ in self.calls)
        self.hosts = any(isinstance(fn, HostCall) for fn, _ in self.calls)  # see call()
        self.donors = {} if self.checks else donors(rec, fresh, self.outputs)
        self.places = {}  # (returned array, id of a donated base) -> where its views sit (donate._places)
        self.feeds = {n.arg: i for i, n in enumerate(schedule.inputs) if n.op == "SLOT"}  # feed position -> input
        touched = [r for r in rec.allocs if r.first is not None and r.place is None]
        self.arena_size = pack(touched)
        self.peak = peak(touched, list(fresh))
        self.inputs = sorted({ref.region.index for ref in self._refs() if ref.region and ref.region.kind == "input"})
        self.arena = None  # the runtime's arena the arguments are bound to (see _bind)
        self.patched = None  # who last wrote the per-run pointers: None for run(), else a chain.Chain
        self.run_kernels = getattr(runtime.lib, "tl_run_kernels", None)

    def _refs(self):
        for _, args in self.calls:
            for a in args:
                for x in a if isinstance(a, list) else a.fields if isinstance(a, CStruct) else [a]:
                    if isinstance(x, HostArray):
                        x = x.ref
                    if isinstance(x, Ref):
                        yield x

    def _bind(self, arena):
        """Builds every call's C arguments with pointers into `arena` for good. Of the pointers that change from
        run to run, those in the generated kernels' argument arrays (most) are slots of one block, which `_patch`
        rewrites at once; the few passed directly are patches (setter, C type, which per-run base, offset)."""
        base = address(arena) + (-address(arena)) % ALIGN
        ffi, patches, bound = self.ffi, [], []
        n_inputs = len(self.inputs)
        slot = {i: k for k, i in enumerate(self.inputs)}  # input index -> position in the per-run bases
        block = compiler.ffi.new("char *[]", max(1, sum(len(a) for _, args in self.calls for a in args
                                                         if isinstance(a, list))))
        at, which, offset, used = [], [], [], 0  # each changing pointer's slot in block, per-run base and offset

        def value(ref, ctype):
            """The pointer, or (which per-run base, offset) when it changes from run to run."""
            r = ref.region
            if r is None:
                return ffi.NULL
            if r.kind == "input":
                return slot[r.index], ref.offset
            kind, at = r.place
            if kind == "fresh":
                return n_inputs + at, ref.offset
            return ffi.cast(ctype, base + at + ref.offset)

        def direct(ref, ctype, setter):
            v = value(ref, ctype)
            if isinstance(v, tuple):
                patches.append((setter, ctype, *v))
                return ffi.NULL
            return v

        for fn, args in self.calls:
            if isinstance(fn, HostCall):  # arrays over the memory the recorded ones had
                cargs = []
                for i, a in enumerate(args):
                    if isinstance(a, HostArray):
                        v = value(a.ref, "char *")
                        made = functools.partial(_host_array, a.shape, a.dtype)
                        if isinstance(v, tuple):  # made on each run from the pointer _patch computes
                            patches.append((_then(made, functools.partial(cargs.__setitem__, i)), "char *", *v))
                            a = None
                        else:
                            a = made(v)
                    cargs.append(a)
                bound.append((fn.fn, cargs))
                continue
            types = ffi.typeof(fn).args
            cargs = []
            for i, (a, t) in enumerate(zip(args, types)):
                if isinstance(a, Ref):
                    cargs.append(direct(a, t, functools.partial(cargs.__setitem__, i)))
                elif isinstance(a, list):
                    for j, ref in enumerate(a):
                        v = ffi.cast("char *", ref) if isinstance(ref, int) else value(ref, "char *")
                        if isinstance(v, tuple):
                            at.append(used + j)
                            which.append(v[0])
                            offset.append(v[1])
                        else:
                            block[used + j] = v
                    cargs.append(block + used)
                    used += len(a)
                elif isinstance(a, CStruct):
                    struct = ffi.new(a.ctype)
                    for v, (name, f) in zip(a.fields, ffi.typeof(a.ctype).item.fields):
                        setattr(struct, name, direct(v, f.type, functools.partial(setattr, struct, name))
                                if isinstance(v, Ref) else v)
                    cargs.append(struct)
                else:
                    cargs.append(a)
            bound.append((fn, cargs))
        self.arena, self.bound, self.patches = arena, _kernel_runs(self.run_kernels, bound), patches
        self.patched = None
        self.block, self.slots = block, np.frombuffer(compiler.ffi.buffer(block), np.uintp)
        self.slot_at, self.slot_base = np.array(at, np.intp), np.array(which, np.intp)
        self.slot_offset = np.array(offset, np.uintp)

    def _patch(self, bases):
        """Writes this run's pointers: the block's slots in one vectorised step, the direct ones one by one."""
        if len(self.slot_at):
            addresses = np.frombuffer(compiler.ffi.buffer(compiler.ffi.new("char *[]", bases)), np.uintp)
            self.slots[self.slot_at] = addresses[self.slot_base] + self.slot_offset
        cast = self.ffi.cast
        for setter, ctype, k, offset in self.patches:
            setter(cast(ctype, bases[k] + offset))

    def prepare(self, runtime, arrays, owner):
        """Binds the calls to the runtime's arena and points them at `arrays()` (the inputs the calls read, then
        the returned arrays) unless `owner` did so last."""
        arena = runtime.arena(self.arena_size + ALIGN)
        if arena is not self.arena:
            self._bind(arena)
        if owner is None or self.patched is not owner:
            self._patch([_base(a) for a in arrays()])
            self.patched = owner

    def call(self, held=0):
        """Makes the calls; False when a kernel reported bad input (an index out of range). `held`: bytes held
        meanwhile that memory_allocated does not count (a chain.Chain's arrays)."""
        note_peak(self.peak + held)
        for fn, args in self.bound:
            status = fn(*args)  # only the embedding kernels return a value: -1 when every index is valid
            if status is not None and status != -1:
                if self.hosts:  # the normal path would make the host calls (MPI collectives) again: say it here
                    raise IndexError(f"{fn.__name__}: index {args[2][status]} is out of range for {args[4]} rows "
                                     "(the embedding's indices must lie in [-rows, rows))")
                return False
        return True

    def run(self, runtime, schedule, inputs, donated=(), seen=None):
        """The output Buffers, or None when a kernel reported bad input: the caller then runs the normal path,
        which raises the error. `donated`: indices of inputs a returned array may take over (donate.take).
        `seen`, a list, gets (self, inputs, returned arrays, what was taken over, output values) for chain.py."""
        taken = take(self, inputs, donated) if donated and self.donors else {}
        # not runtime.empty: no pool could hand one out (a replay frees nothing), and its bookkeeping costs more
        # than the allocation
        made = [taken[j][0] if j in taken else track(np.empty(shape, dtype))
                for j, (shape, dtype) in enumerate(self.fresh)]
        self.prepare(runtime, lambda: [inputs[i] for i in self.inputs] + made, None)
        if not self.call():
            return None
        values, storage = [], None
        for out in self.outputs:
            if out[0] == "fresh":
                a, view = made[out[1]], out[2]
                same = taken[out[1]][1].get(view) if out[1] in taken else None
                if same is not None:  # the very input array it was written over: the caller sees it unchanged
                    a = same
                elif view is not None:
                    offset, shape, strides = view
                    a = np.ndarray(shape, a.dtype, buffer=a, offset=offset, strides=strides)
                values.append(a)
            elif out[0] == "input":
                values.append(inputs[out[1]])
                storage = storage or {id(owner(a)) for a in inputs}
            else:
                values.append(np.empty(out[1], schedule.outputs[len(values)].dtype.np))
        if seen is not None:  # the fed inputs weakly: a later schedule of the step may take an old value over
            fed = set(self.feeds.values())
            seen.append((self, [weakref.ref(a) if i in fed else a for i, a in enumerate(inputs)], made, taken, values))
        if storage is None:  # every value is an array made here, of the output's dtype (checked when recorded)
            return [Buffer(runtime, v, n.shape, n.dtype) for n, v in zip(schedule.outputs, values)]
        return runtime.output_buffers(schedule, values, storage)


def _kernel_runs(run_kernels, bound):
    """`bound` with each run of generated kernels in a row (a char ** argument each) made one call of
    tl_run_kernels (runtime_c/program.c): one Python call and one argument conversion for the whole run."""
    if run_kernels is None:
        return bound
    out, run = [], []

    def flush():
        if len(run) > 1:
            fns = compiler.ffi.new("void *[]", [compiler.ffi.cast("void *", fn) for fn, _ in run])
            argvs = compiler.ffi.new("char **[]", [args[0] for _, args in run])
            out.append((run_kernels, [fns, argvs, len(run)]))
        else:
            out.extend(run)
        run.clear()

    for fn, args in bound:
        if isinstance(fn, compiler.ffi.CData):  # a generated kernel; the prebuilt ones are the module's functions
            run.append((fn, args))
        else:
            flush()
            out.append((fn, args))
    flush()
    return out


def _then(f, g):
    return lambda x: g(f(x))


def _host_array(shape, dtype, pointer):
    """The row-major array of `shape` and `dtype` at a char pointer (a NULL one: an empty array)."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if not size:
        return np.empty(shape, dtype)
    return np.frombuffer(compiler.ffi.buffer(pointer, size), dtype).reshape(shape)


def _base(array):
    """A char pointer to an array's first element: a cdata over a row-major array (cheaper to make than reading
    the address from NumPy), else the address cast."""
    if array.flags.c_contiguous and array.size:
        return compiler.ffi.from_buffer(array)
    return compiler.ffi.cast("char *", address(array))


def execute(runtime, schedule, vals, donate=()):
    """Runs `schedule` on the C runtime: replayed from its Program when one was recorded for inputs of this
    layout, recorded on the second run with a layout, else on the normal path (also when another thread holds
    the arena). `donate`: feed positions whose memory a replay may write its results over (Runtime.execute)."""
    inputs = [vals[n] for n in schedule.inputs]
    key = tuple((a.shape, a.strides, a.dtype) for a in inputs)
    # input layout -> runs so far, or its Program; per CPU path, as the kernels it calls are
    programs = schedule.prepared.setdefault(("c programs", compiler.path()), {})
    got = programs.get(key, 0)
    if isinstance(got, Program):
        if runtime.arena_lock.acquire(blocking=False):  # else another thread is replaying: the normal path
            try:
                outs = got.run(runtime, schedule, inputs, {got.feeds[p] for p in donate} if donate else (),
                               runtime.observed)
            finally:
                runtime.arena_lock.release()
            if outs is not None:
                return outs
        return runtime.run_schedule(schedule, vals)
    if got != 1:
        if got is not None:
            programs[key] = got + 1
        return runtime.run_schedule(schedule, vals)
    rec = runtime.recorder = CallRecorder(inputs)
    before = set(collective._inflight)
    try:
        outs = runtime.run_schedule(schedule, vals)
    finally:
        runtime.recorder = None
    if set(collective._inflight) - before:  # MPI reads and writes its arrays after the run: not in the arena
        rec.fail("an all-reduce still in flight when the schedule ends (its WAIT is in a later one)")
    outputs = [vals[n] for n in schedule.outputs]
    try:
        programs[key] = Program(runtime, rec, schedule, outputs) if rec.failed is None else None
    except NotRecordable:
        programs[key] = None
    return outs
