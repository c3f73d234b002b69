"""The C calls of one schedule run, for program.py to replay (docs/architecture.md, "Replayed schedules"). A run is
recordable only if every kernel returned a view of something it read, or made C calls and returned an array from
runtime.empty: a kernel that ran its NumPy forward (or copied with NumPy) leaves the schedule on the normal path."""
import weakref
from collections import namedtuple

import numpy as np

from . import compiler
from .views import address


# A struct passed by pointer to a C function: its cffi type ("tl_attn_view *") and its fields in order
CStruct = namedtuple("CStruct", "ctype fields")


def c_args(ffi, fn, args):
    """args as fn's C arguments: an array becomes a pointer to its first element, a list of arrays (and integers)
    a char *[] (the generated kernels' argument), a CStruct a pointer to a new struct."""
    return [_c_value(ffi, a, t) for a, t in zip(args, ffi.typeof(fn).args)]


def _c_value(ffi, a, ctype):
    if isinstance(a, np.ndarray):
        return ffi.cast(ctype, address(a))
    if isinstance(a, list):  # arrays, then a shape-generic kernel's integers (render.py)
        return compiler.ffi.new("char *[]", [compiler.ffi.cast("char *", address(x) if isinstance(x, np.ndarray) else x)
                                             for x in a])  # (an array by its first element: a view read in place)
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


Ref = namedtuple("Ref", "region offset")  # a recorded pointer: `offset` bytes into `region` (None: a null pointer)
HostArray = namedtuple("HostArray", "ref shape dtype")  # a host call's row-major array argument


class HostCall:
    """A recorded call of a Python function (CRuntime.host_call) among the C calls."""
    __slots__ = ("fn",)

    def __init__(self, fn):
        self.fn = fn


class NotRecordable(Exception):
    """A run a Program could not replay."""


class CallRecorder:
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
        self.in_steps, self.next_in_step = {}, frozenset()  # call index -> c/runtime.py's in_step of its kernel
        self.node_calls, self.node_allocs, self.node_hosts = 0, 0, 0

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
            return [self._ref(x) if isinstance(x, np.ndarray) else x for x in a]
        if isinstance(a, CStruct):
            return CStruct(a.ctype, [self._spec(v) for v in a.fields])
        return a

    def in_step(self, positions):
        """Positions of the next call's argument that its kernel reads in step (c/runtime.py's in_step)."""
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

    def host(self, fn, args):
        """A host call: fn(*args), its arrays row-major (else the run is not recordable)."""
        if self.failed is None:
            try:
                specs = []
                for a in args:
                    if isinstance(a, np.ndarray):
                        if not a.flags.c_contiguous:
                            raise NotRecordable(f"a host call's argument {a.shape} is not row-major")
                        a = HostArray(self._ref(a), a.shape, a.dtype)
                    specs.append(a)
                self.calls.append((HostCall(fn), specs))
            except NotRecordable as e:
                self.fail(str(e))
        self.node_hosts += 1

    def begin_kernel(self):
        self.node_calls, self.node_allocs, self.node_hosts = 0, len(self.allocs), 0

    def end_kernel(self, node, out):
        """Fails the recording if the kernel's work would not replay (see the module's docstring)."""
        if self.failed is not None or not out.size:
            return
        try:
            region = self.find(out)
        except NotRecordable:
            region = None
        made_here = region is not None and region.kind == "alloc" and region.index >= self.node_allocs
        if self.node_hosts:  # host calls write only the arrays they are given: an array made here, or a view
            ok = region is not None and (made_here or not self.node_calls)
        else:
            ok = made_here if self.node_calls else region is not None and not made_here
        if not ok:
            self.fail(f"{node.op} {node.shape} ran outside C")
