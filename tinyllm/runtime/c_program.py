"""A schedule's run on the C runtime recorded once as a list of C calls, then replayed without its Python.

Every C call the runtime's handlers make goes through CRuntime.call. The second time a schedule runs with
inputs of one layout (shapes, strides, dtypes), a Recorder sees those calls and writes each pointer argument as
a place in a region: an input of the schedule, or an array the schedule allocated (runtime.empty). From the third
run on, a Program makes the same calls:

  * Arrays that live only inside the schedule get fixed places in an arena, packed by their lifetimes (the first
    and last call that touches each) as an allocator would place them. Their pointers are bound once. The arena
    is the runtime's scratch memory, shared by every Program (one schedule runs at a time), so what they hold
    together is the largest one's arena, not the sum; when it grows, each Program binds its pointers again.
  * Arrays the schedule returns are allocated afresh on each run, and the inputs change from run to run: only
    those pointers are written into the prepared arguments before the calls. A returned array may instead take
    over inputs the caller donated (tinyllm.jit: an optimizer's old parameter and moments), when the one kernel
    that writes it reads them element by element in step and nothing else holds them (Program._take): the
    optimizer then updates in place.

That replaces the per-kernel Python (handler dispatch, layout checks, the buffer pool, cffi's conversion of
every argument) by a loop of calls: the Python of a GPT training step (bench config S, 2 threads) goes from 5.3
to 1.3 ms. Generated kernels that follow one another are one call of that loop (tl_run_kernels): 233 calls of
a step become 127, and the kernels of a run follow each other without Python, or the cache misses its objects
cost after a kernel, in between.

A run is recorded only if every kernel either returned a view of something it read, or made C calls and returned
an array from runtime.empty; a kernel that ran its NumPy forward (or copied with NumPy) leaves the schedule on
the normal path. Views cost nothing to replay: their offsets and strides are in the recorded arguments.
"""
import functools
import sys
import weakref

import numpy as np

from . import compiler
from .base import Buffer
from .c_views import address
from .memory import note_peak, owner, track

ALIGN = 64  # bytes: each arena array starts on a cache line, as NumPy's own allocations of this size do


class CStruct:
    """A struct passed by pointer to a C function: its cffi type ("tl_attn_view *") and its fields in order;
    a field may be an array (a pointer to its first element)."""
    __slots__ = ("ctype", "fields")

    def __init__(self, ctype, fields):
        self.ctype, self.fields = ctype, fields


def c_args(ffi, fn, args):
    """args as fn's C arguments: an array becomes a pointer to its first element, a list of arrays a char *[]
    (the generated kernels' argument), a CStruct a pointer to a new struct."""
    return [_c_value(ffi, a, t) for a, t in zip(args, ffi.typeof(fn).args)]


def _c_value(ffi, a, ctype):
    if isinstance(a, np.ndarray):
        return ffi.cast(ctype, address(a))
    if isinstance(a, list):
        return compiler.ffi.new("char *[]", [compiler.ffi.from_buffer(x) for x in a])
    if isinstance(a, CStruct):
        fields = ffi.typeof(a.ctype).item.fields
        return ffi.new(a.ctype, [_c_value(ffi, v, f.type) for v, (_, f) in zip(a.fields, fields)])
    return a


class Region:
    """Memory a recorded pointer may point into: input `index` of the schedule, or allocation `index`."""
    __slots__ = ("kind", "index", "array", "base", "low", "high", "shape", "dtype", "first", "last", "place")

    def __init__(self, kind, index, array):
        # weakly: once the array is freed, NumPy may hand its memory to a temporary the schedule never recorded
        self.kind, self.index, self.array, self.base = kind, index, weakref.ref(array), address(array)
        self.low, self.high = _bounds(array)
        self.shape, self.dtype = array.shape, array.dtype
        self.first = self.last = None  # the first and last recorded call that touches it
        self.place = None  # ("arena", byte offset) or ("fresh", position in the per-run arrays)

    @property
    def nbytes(self):
        return self.high - self.low


def _bounds(array):
    """[low, high): the bytes an array's elements span."""
    at = address(array)
    if not array.size:
        return at, at
    steps = [(n - 1) * st for n, st in zip(array.shape, array.strides)]
    return at + sum(x for x in steps if x < 0), at + sum(x for x in steps if x > 0) + array.itemsize


class Ref:
    """A recorded pointer: `offset` bytes from the start of `region` (None: a null pointer)."""
    __slots__ = ("region", "offset")

    def __init__(self, region, offset):
        self.region, self.offset = region, offset


class NotRecordable(Exception):
    pass


class Recorder:
    """Watches one run of a schedule (CRuntime.call, .empty and .run report to it)."""

    def __init__(self, inputs):
        self.input_arrays = inputs
        self.inputs = [Region("input", i, a) for i, a in enumerate(inputs)]
        self.live = [r for r in self.inputs if r.nbytes]
        self.starts = {r.base: r for r in self.live}  # the live regions by their first byte: most pointers' own
        spans = sorted((r.low, r.high) for r in self.live)
        if any(b[0] < a[1] for a, b in zip(spans, spans[1:])):
            self.failed = "two inputs share memory"  # a replay could not tell which one a pointer came from
        else:
            self.failed = None
        self.allocs, self.calls = [], []  # calls: (fn, recorded args)
        self.in_steps, self.next_in_step = {}, frozenset()  # call index -> c_runtime.in_step of its kernel
        self.node_calls, self.node_allocs = 0, 0

    def fail(self, why):
        self.failed = self.failed or why

    def allocated(self, array):
        region = Region("alloc", len(self.allocs), array)
        self.allocs.append(region)
        if region.nbytes:  # memory the pool hands out again belonged to a dead array: forget that one
            keep = []
            for r in self.live:
                if r.high <= region.low or r.low >= region.high:
                    keep.append(r)
                elif self.starts.get(r.base) is r:
                    del self.starts[r.base]
            self.live = keep + [region]
            self.starts[region.base] = region

    def find(self, array):
        """The live region `array` points into, or None."""
        if not array.size:
            return None
        at = address(array)
        r = self.starts.get(at)
        if r is not None and r.array() is not None:
            return r
        for r in reversed(self.live):  # the newest first: most pointers are to what a kernel just made
            if r.low <= at < r.high and r.array() is not None:
                return r
        raise NotRecordable(f"a pointer to memory the schedule neither read nor allocated ({array.shape})")

    def _ref(self, array):
        region = self.find(array)
        if region is None:
            return Ref(None, 0)
        at = len(self.calls)
        region.first = at if region.first is None else region.first
        region.last = at
        return Ref(region, address(array) - region.base)

    def _spec(self, a):
        if isinstance(a, np.ndarray):
            return self._ref(a)
        if isinstance(a, list):
            return [self._ref(x) for x in a]
        if isinstance(a, CStruct):
            return CStruct(a.ctype, [self._spec(v) for v in a.fields])
        return a

    def in_step(self, positions):
        """The next call's kernel reads the inputs at these positions of its argument only at the element it
        stores (c_runtime.in_step)."""
        self.next_in_step = positions

    def call(self, fn, args):
        if self.failed is None:
            try:
                if self.next_in_step:
                    self.in_steps[len(self.calls)] = self.next_in_step
                self.calls.append((fn, [self._spec(a) for a in args]))
            except NotRecordable as e:
                self.fail(str(e))
        self.next_in_step = frozenset()
        self.node_calls += 1

    def begin_kernel(self):
        self.node_calls, self.node_allocs = 0, len(self.allocs)

    def end_kernel(self, node, out):
        """A kernel must have returned a view of something that existed before it, or an array it allocated
        and wrote through C calls."""
        if self.failed is not None or not out.size:
            return
        try:
            region = self.find(out)
        except NotRecordable:
            region = None
        made_here = region is not None and region.kind == "alloc" and region.index >= self.node_allocs
        if not (made_here if self.node_calls else region is not None and not made_here):
            self.fail(f"{node.op} {node.shape} ran outside C")

    def program(self, runtime, schedule, outputs):
        """The Program replaying this run (whose output values are `outputs`), or None."""
        if self.failed is None:
            try:
                return Program(runtime, self, schedule, outputs)
            except NotRecordable as e:
                self.fail(str(e))
        return None


def _pack(regions):
    """Byte offsets in one arena for regions whose lifetimes [first, last] (call indices) may overlap: the
    largest first, each at the lowest offset clear of every placed region alive at the same time.
    Returns the arena's size."""
    placed, size = [], 0
    for r in sorted(regions, key=lambda r: -r.nbytes):
        n = -(-r.nbytes // ALIGN) * ALIGN
        busy = sorted((o, o + m) for o, m, q in placed if q.first <= r.last and r.first <= q.last)
        at = 0
        for lo, hi in busy:
            if at + n <= lo:
                break
            at = max(at, hi)
        placed.append((at, n, r))
        r.place = ("arena", at)
        size = max(size, at + n)
    return size


class Program:
    """The recorded calls of one schedule run, ready to replay (see the module's docstring)."""

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
        # A program whose calls report bad input (the embedding kernels) takes nothing over: the caller then runs
        # the schedule again on the normal path, which needs its inputs unchanged.
        self.checks = any(self.ffi.typeof(fn).result.cname != "void" for fn, _ in self.calls)
        self.donors = {} if self.checks else _donors(rec, fresh, self.outputs)
        self.places = {}  # see _places
        self.feeds = {n.arg: i for i, n in enumerate(schedule.inputs) if n.op == "SLOT"}  # feed position -> input
        touched = [r for r in rec.allocs if r.first is not None and r.place is None]
        self.arena_size = _pack(touched)
        self.peak = _peak(touched, list(fresh))
        self.inputs = sorted({ref.region.index for ref in self._refs() if ref.region and ref.region.kind == "input"})
        self.arena = None  # the runtime's arena the arguments are bound to (see _bind)
        self.patched = None  # who last wrote the per-run pointers: None for run(), else a c_chain.Chain
        self.run_kernels = getattr(runtime.lib, "tl_run_kernels", None)

    def _refs(self):
        for _, args in self.calls:
            for a in args:
                for x in a if isinstance(a, list) else a.fields if isinstance(a, CStruct) else [a]:
                    if isinstance(x, Ref):
                        yield x

    def _bind(self, arena):
        """Builds every call's C arguments with pointers into `arena` for good. The pointers into inputs and
        returned arrays change from run to run: those of the generated kernels' argument arrays (most of them)
        are slots of one block, rewritten together by `_patch`; the few passed directly are patches
        (setter, C type, which per-run base, offset)."""
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
            types = ffi.typeof(fn).args
            cargs = []
            for i, (a, t) in enumerate(zip(args, types)):
                if isinstance(a, Ref):
                    cargs.append(direct(a, t, functools.partial(cargs.__setitem__, i)))
                elif isinstance(a, list):
                    for j, ref in enumerate(a):
                        v = value(ref, "char *")
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
        """Writes this run's pointers into the prepared arguments: the slots of the block in one vectorised
        step (their bases' addresses read by cffi from the list at once), the direct ones one by one."""
        if len(self.slot_at):
            addresses = np.frombuffer(compiler.ffi.buffer(compiler.ffi.new("char *[]", bases)), np.uintp)
            self.slots[self.slot_at] = addresses[self.slot_base] + self.slot_offset
        cast = self.ffi.cast
        for setter, ctype, k, offset in self.patches:
            setter(cast(ctype, bases[k] + offset))

    def prepare(self, runtime, arrays, owner):
        """Binds the calls to the runtime's arena and points them at `arrays()` (the inputs the calls read, then
        the returned arrays), unless `owner` did so last."""
        arena = runtime.arena(self.arena_size + ALIGN)
        if arena is not self.arena:
            self._bind(arena)
        if owner is None or self.patched is not owner:
            self._patch([_base(a) for a in arrays()])
            self.patched = owner

    def call(self, held=0):
        """Makes the calls; False when a kernel reported bad input (an index out of range). `held`: bytes held
        meanwhile that memory_allocated does not count (a c_chain.Chain's arrays)."""
        note_peak(self.peak + held)
        for fn, args in self.bound:
            status = fn(*args)  # only the embedding kernels return a value: -1 when every index is valid
            if status is not None and status != -1:
                return False
        return True

    def run(self, runtime, schedule, inputs, donated=(), seen=None):
        """The output Buffers, or None when a kernel reported bad input (an index out of range): the caller then
        runs the schedule on the normal path, which raises the error with its message. `donated`: indices of
        inputs the caller no longer needs, whose memory a returned array may take over (see _take). `seen`, a
        list, gets (self, inputs, returned arrays, what was taken over, output values) (see c_chain.py)."""
        taken = self._take(inputs, donated) if donated and self.donors else {}
        # the returned arrays, made here rather than by runtime.empty: no pool could hand one out (a replay frees
        # nothing), and runtime.empty's bookkeeping of what it made costs more than the allocation
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

    def _take(self, inputs, donated):
        """{position of a returned array: (the array it takes over, {its view (offset, shape, strides), or None for
        the whole of it: the input that is that view})}. A returned array written by one elementwise kernel over
        inputs it reads in step (_donors) takes over their memory when the caller donated them all and they are one
        array of its size (a single output's input), or views of one (a parameter and its moments), that nothing
        else holds: no view of it but theirs, and no holder of them but the caller's."""
        taken = {}
        for j, candidates in self.donors.items():
            arrays = [inputs[i] for i in candidates if i in donated]
            if not arrays:
                continue
            shape, dtype = self.fresh[j]
            whole = arrays[0].base is None
            base = arrays[0] if whole else arrays[0].base
            if not (type(base) is np.ndarray and base.base is None and base.shape == shape and base.dtype == dtype
                    and base.flags.c_contiguous and base.flags.writeable):
                continue
            if whole:
                # held by the callers, `arrays`, `base` and getrefcount's argument
                if len(arrays) == 1 and sys.getrefcount(base) == CALLERS_REFS + 3:
                    taken[j] = (base, {None: base})
                continue
            # each view holds its base; here `base` and getrefcount's argument do too
            if sys.getrefcount(base) != len(arrays) + 2:
                continue
            for a in arrays:
                # held by the callers, `arrays`, `a` and getrefcount's argument
                if sys.getrefcount(a) != CALLERS_REFS + 3:
                    break
            else:
                places = self._places(j, base, arrays)
                if places is not None:
                    taken[j] = (base, {view: arrays[k] for view, k in places.items()})
        return taken

    def _places(self, j, base, arrays):
        """{(offset, shape, strides): k} of arrays[k], views of `base`, or None unless each is row-major at the
        place of one of the kernel's outputs (a multiple of its size): the kernel then reads each element where
        the same iteration writes it, or not at all. Remembered for the same objects (watched weakly: an array's
        place never changes), as the arrays a replay took over come back on the next. A Program may serve several
        realizes of a step (an optimizer's chunks of one shape), so it remembers each base it has seen."""
        key = (j, id(base))
        known = self.places.get(key)
        if known is not None and len(known[0]) == len(arrays) and all(r() is a for r, a in zip(known[0], arrays)):
            return known[1]
        at, places = address(base), {}
        for k, a in enumerate(arrays):
            offset = address(a) - at
            if a.base is not base or not a.flags.c_contiguous or offset % a.nbytes:
                return None
            places[(offset, a.shape, a.strides)] = k
        gone = weakref.ref(base, functools.partial(_forget, self.places, key))  # the entry goes with the base
        self.places[key] = ([weakref.ref(a) for a in arrays], places, gone)
        return places


def _forget(places, key, _):
    places.pop(key, None)


# References to a donated input array held by the callers of Program._take: the feed's Buffer, the runtime's input
# values and execute's `inputs` (the tests of in-place updates fail if this is off either way)
CALLERS_REFS = 3


def _donors(rec, fresh, outputs):
    """{position of a returned allocation: indices of the inputs whose memory it may take over}. The allocation
    must be written by one generated elementwise kernel and read by no other call; an input qualifies if that
    kernel reads it only at the element it stores (c_runtime.in_step) and through no other argument, no later
    call reads it, and the schedule does not return it."""
    returned = {out[1] for out in outputs if out[0] == "input"}
    donors = {}
    for region, j in fresh.items():
        at = region.first
        if at is None or region.last != at or at not in rec.in_steps:
            continue
        argv = rec.calls[at][1][0]
        if argv[0].region is not region or argv[0].offset:
            continue
        read = [ref.region for ref in argv]
        candidates = [ref.region.index for ref in (argv[q] for q in sorted(rec.in_steps[at]))
                      if ref.region is not None and ref.region.kind == "input" and not ref.offset
                      and ref.region.last == at and ref.region.index not in returned
                      and sum(r is ref.region for r in read) == 1]  # read through no other argument
        if candidates:
            donors[j] = candidates
    return donors


def _kernel_runs(run_kernels, bound):
    """`bound` with each run of generated kernels in a row (a char ** argument each) made one call of
    tl_run_kernels (runtime_c/program.c): one Python call and one argument conversion for the whole run. A
    training step's generated kernels mostly come in runs (a bias and residual add, then LayerNorm's kernels)."""
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


def _base(array):
    """A char pointer to an array's first element, to add byte offsets to: a cdata over a row-major array (five
    times cheaper to make than reading the address from NumPy), else the address cast."""
    if array.flags.c_contiguous and array.size:
        return compiler.ffi.from_buffer(array)
    return compiler.ffi.cast("char *", address(array))


def _peak(arena, fresh):
    """Bytes above what the returned arrays hold that the normal path would hold at its fullest: the arena's
    arrays alive at each call, plus the returned arrays allocated by then (a replay allocates them first)."""
    events = sorted({r.first for r in arena + fresh if r.first is not None})
    best = 0
    for t in events:
        live = sum(r.nbytes for r in arena if r.first <= t <= r.last)
        early = sum(r.nbytes for r in fresh if r.first is not None and r.first <= t)
        best = max(best, live + early)
    return max(0, best - sum(r.nbytes for r in fresh))


def execute(runtime, schedule, vals, donate=()):
    """Runs `schedule` on the C runtime: replayed from its Program when one was recorded for inputs of this
    layout, recorded on the second run with a layout, else on the normal path. Threads may run schedules at once:
    each records its own runs, and a replay that finds the arena in use by another thread takes the normal path.
    `donate`: feed positions (SLOT args) whose memory a replay may write its results over (Runtime.execute)."""
    inputs = [vals[n] for n in schedule.inputs]
    key = tuple((a.shape, a.strides, a.dtype) for a in inputs)
    programs = schedule.prepared.setdefault("c programs", {})  # input layout -> runs so far, or its Program
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
    rec = runtime.recorder = Recorder(inputs)
    try:
        outs = runtime.run_schedule(schedule, vals)
    finally:
        runtime.recorder = None
    programs[key] = rec.program(runtime, schedule, [vals[n] for n in schedule.outputs])
    return outs
