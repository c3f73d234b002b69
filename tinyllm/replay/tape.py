"""Tape: one recorded call of a jitted function as what a replay does (replay/jit.py explains the whole)."""
import contextlib
import itertools
import sys
import time
import weakref

import numpy as np

from .. import dtype as dt
from ..graph import Node
from ..runtime.base import EXACT_REFCOUNTS
from ..tensor import Tensor
from . import record
from .record import buffer_of


def leaves(value, path="result"):
    """[(path, tensor)] of the tensors in a returned value; raises for anything a replay cannot return."""
    if value is None:
        return []
    if isinstance(value, Tensor):
        return [(path, value)]
    if isinstance(value, (tuple, list)):
        return [leaf for i, v in enumerate(value) for leaf in leaves(v, f"{path}[{i}]")]
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in leaves(v, f"{path}[{k!r}]")]
    raise record.Unreplayable(f"jit: the function returned {type(value).__name__} at {path}: a replay can return "
                              "only tensors (in tuples, lists or dicts) or None, because it runs no Python")


_RESULT = object()  # where a returned tensor sits in a recorded result


def _rebuild(value, tensors):
    """`value` with each of its tensors (or _RESULT marks) replaced by the next of `tensors`."""
    if isinstance(value, Tensor) or value is _RESULT:
        return next(tensors)
    if isinstance(value, (tuple, list)):
        return type(value)(_rebuild(v, tensors) for v in value)
    if isinstance(value, dict):
        return {k: _rebuild(v, tensors) for k, v in value.items()}
    return value


class Tape:
    """A source says where a value comes from on a replay: ("arg", i), ("out", schedule k, output j), ("start",
    tensor) its value when the call began, ("grad", tensor) its .grad when the call began, ("host", host fn h,
    position p), ("const", buffer)."""

    def __init__(self, rec, args, result):
        produced, sources = {}, {id(buffer_of(t.node)): ("arg", i) for i, t in enumerate(args)}
        # a tensor the call writes .grad of is the object itself, or its position when it is an argument (each call
        # passes other objects there)
        at = {id(t): i for i, t in enumerate(args)}
        who = lambda t: at.get(id(t), t)  # noqa: E731
        # what the Tape is keyed on beside the arguments' signature (jit.py): the state each tensor it writes by
        # identity had when the call began (record.state); `changed` compares them with the tensors' states now
        self.keyed = [(t, st) for t, st in rec.started.items() if id(t) not in at]
        for h, (_, items) in enumerate(rec.host_fns):
            sources.update({id(buf): ("host", h, p) for p, (_, buf) in enumerate(items)})
        for _, t, old, _ in rec.assigns:
            if old is not None:
                sources.setdefault(id(old), ("start", t))
        for t, old in rec.grads.items():
            if old is not None and buffer_of(old.node) is not None:
                sources.setdefault(id(buffer_of(old.node)), ("grad", who(t)))
        self.host_made = {id(buf): array for buf, array in rec.host_made}

        def source(buf):
            return produced.get(id(buf)) or sources.get(id(buf)) or ("const", buf)

        self.host_fns = [(fn, [(buf.dtype, buf.runtime) for _, buf in items]) for fn, items in rec.host_fns]
        # schedules[k]: (runtime, schedule, the sources of its feeds); assigns[k + 1]: what is assigned after it
        self.schedules, self.assigns = [], [[] for _ in range(len(rec.realizes) + 1)]
        events = iter(rec.assigns)
        pending = next(events, None)
        for k in range(-1, len(rec.realizes)):
            if k >= 0:
                runtime, schedule, feeds, outs = rec.realizes[k]
                self.schedules.append((runtime, schedule, [source(b) for b in feeds]))
                for j, b in enumerate(outs):
                    produced.setdefault(id(b), ("out", k, j))
            while pending is not None and pending[0] == k:
                self.assigns[k + 1].append((pending[1], source(pending[3])))
                pending = next(events, None)
        self.grads = [(who(t), None if t.grad is None else source(buffer_of(t.grad.node))) for t in rec.grads]
        self.result = _rebuild(result, itertools.repeat(_RESULT))  # the structure, not the recorded call's values
        self.outputs = [(source(buffer_of(t.node)), t.device) for _, t in leaves(result)]
        self.targets = list({t: None for _, t, _, _ in rec.assigns})
        self._free_after_last_use()
        self._donations()
        self.stale = False  # set when a tensor it reads as a constant is given another value (record.replaced)
        self.gone = False  # set when a tensor it reads as a constant is no more (record.watch)
        self.chain, self.chain_targets = None, []  # see replay
        self.seconds = None  # how long the last replay took (the C runtime's tuner reckons its payback in it)
        runtimes = {rt for rt, _, _ in self.schedules}
        self.chainable = len(runtimes) == 1 and runtimes.pop().chains and not self.assigns[0] \
            and all(s[0] != "grad" for _, _, srcs in self.schedules for s in srcs) \
            and all(s[0] == "out" for s, _ in self.outputs) and all(s is None or s[0] == "out" for _, s in self.grads)
        consts = {id(s[1]) for _, _, srcs in self.schedules for s in srcs if s[0] == "const"}
        record.watch(self, consts, [rec.fed[i] for i in consts if i in rec.fed and i not in self.host_made])

    def _finals(self):
        """The sources of what the call leaves behind: assigned values, .grads and returned values."""
        return [s for after in self.assigns for _, s in after] + [s for _, s in self.grads if s is not None] + \
            [s for s, _ in self.outputs]

    def _free_after_last_use(self):
        last = {}
        for k, (_, _, srcs) in enumerate(self.schedules):
            for s in srcs:
                if s[0] == "out":
                    last[s[1:]] = k
        for s in self._finals():
            if s[0] == "out":
                last[s[1:]] = len(self.schedules)
        self.frees = [[] for _ in self.schedules]
        for (k, j), at in last.items():
            if at < len(self.schedules):
                self.frees[at].append((k, j))

    def _donations(self):
        """self.donatable[k]: [(feed position, tensor)] of the tensors whose start value schedule k reads for the
        last time and that are assigned right after it: schedule k may write over them (Runtime.execute's donate)."""
        uses = {}
        for k, (_, _, srcs) in enumerate(self.schedules):
            for p, s in enumerate(srcs):
                if s[0] == "start":
                    uses.setdefault(s[1], []).append((k, p))
        kept = {s[1] for s in self._finals() if s[0] == "start"}
        self.donatable = [[] for _ in self.schedules]
        for k, after in enumerate(self.assigns[1:] if EXACT_REFCOUNTS else ()):
            for t, s in after:
                at = [p for kk, p in uses.get(t, []) if kk == k]  # where schedule k reads it
                last = uses.get(t, [(None, None)])[-1][0]
                if s[0] == "out" and s[1] == k and t not in kept and last == k and len(at) == 1:
                    self.donatable[k].append((at[0], t))

    def changed(self):
        """None while every keyed tensor is as it was when the recorded call began; else what changed, in words
        (a replay would feed its schedules' compiled kernels values of another shape, dtype or device)."""
        for t, st in self.keyed:
            now = record.state(t)
            if now != st:
                how = "assigns" if any(t is u for u in self.targets) else "writes .grad of"
                return f"a {describe(t, st)} it {how} changed: {record.changes(st, now)}"
        return None

    def disagreement(self, other):
        """Why two Tapes of one function would not replay alike, or None when they agree."""
        if len(self.schedules) != len(other.schedules):
            return f"it realized {len(self.schedules)} times in one call and {len(other.schedules)} in the next"
        for k, ((_, s1, src1), (_, s2, src2)) in enumerate(zip(self.schedules, other.schedules)):
            if s1 is not s2:
                return f"its realize #{k} ran a different graph"
            for i, (a, b) in enumerate(zip(src1, src2)):
                if not self._same_source(a, b, other):
                    if a[0] == b[0] == "const":
                        return (f"input {i} of its realize #{k} was another tensor in each call, neither an "
                                "argument nor one the step assigns")
                    return f"input {i} of its realize #{k} came from {a[0]} in one call and {b[0]} in the next"
        pairs = lambda tape: [p for after in tape.assigns for p in after] + tape.grads  # noqa: E731
        if not _all_same([(t,) + (s or ()) for t, s in pairs(self)], [(t,) + (s or ()) for t, s in pairs(other)]):
            return "it assigned other tensors or gradients"
        if not _all_same([s for s, _ in self.outputs], [s for s, _ in other.outputs]):
            return "it returned values from other places"
        if [len(items) for _, items in self.host_fns] != [len(items) for _, items in other.host_fns]:
            return "its optimizer computed a different number of host values"
        return None

    def _same_source(self, a, b, other):
        if a[0] != "const" or b[0] != "const":
            return _all_same([a], [b])
        if a[1] is b[1]:
            return True
        x, y = self.host_made.get(id(a[1])), other.host_made.get(id(b[1]))
        return x is not None and y is not None and x.shape == y.shape and x.dtype == y.dtype and np.array_equal(x, y)

    def replay(self, args):
        if self.chain is not None:
            # (_unshared, with each count taken when the chain was made: a tensor whose flags changed since fails)
            if all(t._node is ref() and sys.getrefcount(t._node) == n for t, ref, n in self.chain_targets):
                made = self.chain.run([buffer_of(a.node) for a in args], self._host_values)
                if made is not None:
                    return self._finish(made.__getitem__, args)
            self.chain = None  # something else holds a value the step writes over: replay (and chain again later)
        began = time.perf_counter()
        start = {t: buffer_of(t.node) for t in self.targets}
        grads = {w: (None if t.grad is None else buffer_of(t.grad.node))
                 for w, t in ((w, _tensor(w, args)) for w, _ in self.grads)}
        host = [[rt.from_numpy(dt.as_storage(v, dtype), dtype) for v, (dtype, rt) in zip(values, metas)]
                for values, (_, metas) in zip(self._host_values(), self.host_fns)]
        outs = []

        def value(src):
            kind = src[0]
            if kind == "out":
                return outs[src[1]][src[2]]
            if kind == "arg":
                return buffer_of(args[src[1]].node)
            if kind == "start":
                return start[src[1]]
            if kind == "grad":
                return grads[src[1]]
            if kind == "host":
                return host[src[1]][src[2]]
            return src[1]

        runtime = self.schedules[0][0] if self.chainable else None  # (the one runtime of every schedule)
        observed = [] if runtime is not None else None
        if runtime is not None:
            runtime.observed = observed  # what each schedule's run saw, for Runtime.chain
        try:
            with contextlib.ExitStack() as together:  # (each runtime may send the step's work at once)
                for rt in {id(r): r for r, _, _ in self.schedules}.values():
                    together.enter_context(rt.together())
                moved = self._assign(self.assigns[0], value)
                for k, (runtime_k, schedule, srcs) in enumerate(self.schedules):
                    donate = [p for p, t in self.donatable[k] if _unshared(t)]
                    outs.append(runtime_k.execute(schedule, [value(s) for s in srcs], donate))
                    moved += self._assign(self.assigns[k + 1], value)
                    for kk, j in self.frees[k]:
                        outs[kk][j] = None
        finally:
            if runtime is not None:
                runtime.observed = None
        self.seconds = time.perf_counter() - began
        if runtime is not None:  # chain the next calls (the runtime says whether it can, e.g. only when `moved` is 0)
            self.chain = runtime.chain(self, observed, moved)
            self.chain_targets = [(t, weakref.ref(t.node), _own_refs(t)) for t in self.targets]
        return self._finish(value, args)

    def _host_values(self):
        """Each host fn's values, computed afresh (see jit.host_values)."""
        out = []
        for fn, metas in self.host_fns:
            values = [v for v, _ in fn().values()]
            if len(values) != len(metas):
                raise RuntimeError(f"jit: the optimizer computed {len(values)} host values where the recording had "
                                   f"{len(metas)}: its parameters no longer step together; call the function "
                                   "without jit")
            out.append(values)
        return out

    def _finish(self, value, args):
        """What the call leaves in .grad and returns, with value(source) the Buffer each source has now."""
        for w, src in self.grads:
            t = _tensor(w, args)
            t.grad = None if src is None else loaded(value(src), t.device)
        return _rebuild(self.result, iter(loaded(value(src), device) for src, device in self.outputs))

    @staticmethod
    def _assign(pairs, value):
        """Gives each tensor its new value; returns how many got a new node (the others were updated in place)."""
        moved = 0
        for t, src in pairs:
            buf = value(src)
            if t.node.op == "LOAD" and t.node.arg.data is buf.data:  # updated in place (donated): keep its node
                continue
            t.node = Node("LOAD", (), buf, buf.shape, buf.dtype)
            moved += 1
        return moved


def _tensor(who, args):
    """The tensor a Tape's grads entry names: itself, or the argument at its position."""
    return args[who] if type(who) is int else who


def describe(t, st):
    """A tensor as an error names it: its kind (a parameter, a tensor), shape and dtype as recorded."""
    kind = "parameter" if type(t).__name__ == "Parameter" else "tensor"
    return f"{kind} of shape {tuple(st[0])} and dtype {st[1].name} on {st[2]}"


def _all_same(xs, ys):
    """Sources (tuples of kinds, indices, tensors and buffers) alike, comparing objects by identity: == on
    tensors builds graph."""
    return len(xs) == len(ys) and all(len(x) == len(y) and all(
        u is v or (isinstance(u, (int, str)) and type(u) is type(v) and u == v) for u, v in zip(x, y))
        for x, y in zip(xs, ys))


def _unshared(t):
    """Nothing refers to t's node but t: no other tensor, no pending graph reads t's current value."""
    return sys.getrefcount(t.node) == _own_refs(t)


def _own_refs(t):
    """getrefcount(t.node) when nothing but t refers to it: t, getrefcount's argument and, for a leaf that requires
    grad, the index of such leaves (its key and its weak reference's callback)."""
    return 4 if t.requires_grad and t.is_leaf else 2


def loaded(buf, device):
    return Tensor._from_node(Node("LOAD", (), buf, buf.shape, buf.dtype), device)
