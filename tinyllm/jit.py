"""tinyllm.jit: record what a training step does once, then do only that on every later call.

A step's Python — building the graph, autograd, the FlashAttention rewrite, keying the plan cache, an optimizer
building its update — costs as much as its kernels on a small model. `jit(fn)` removes it, as tinygrad's TinyJit
and CUDA graphs do:

    call 1      runs fn eagerly (kernels compile, optimizer state is made);
    calls 2, 3  run fn eagerly under a Recording (tinyllm/capture.py) and turn each into a Plan: the cached
                schedules fn realized, in order, and where each one's inputs come from;
    calls 4…    the two Plans agreed, so the second is replayed: each schedule runs on its runtime with inputs
                from the call's arguments, from earlier schedules of the same call, from the tensors the step
                assigns (parameters, moments: their values at the start of the call), from host values computed
                afresh (an optimizer's learning rate and bias corrections), or from buffers that do not change;
    later       once a replay updated every tensor the step assigns in place, a runtime that chains (C) makes
                the whole call one chain of C calls over arrays that stay put (tinyllm/runtime/c_chain.py), for
                as long as nothing else holds a value the step writes over.

What fn may do: take tensors (and other arguments that stay equal) and return a tensor, None, or tuples, lists and
dicts of them; realize, backpropagate, step optimizers (tinyllm.optim) and write .grad. Replays return new
tensors holding the results, and leave every parameter, moment and .grad as a call of fn would. What fn must
not do, because a replay runs no Python: read values on the host (refused while recording), make tensors from
host data that change from call to call (random numbers: the two recordings disagree, and that is an error), or
keep Python state of its own (a learning-rate scheduler steps outside the jitted function: the optimizer reads
the learning rate afresh on every replay). The tensors a step assigns are recorded as objects: after replacing
them (a new optimizer, optimizer state loaded into new tensors), jit the function again. A tensor fn only reads
(an eval function's weights) may be given new values outside it (an optimizer step, copy_): the next call sees
that and records fn again instead of replaying the old values (capture.py: watched buffers).
"""
import functools
import itertools
import sys
import weakref

import numpy as np

from . import capture
from .graph import Node
from .realize import realize
from .runtime import get as get_runtime
from .runtime.base import EXACT_REFCOUNTS
from .tensor import Tensor

_buffer = capture._buffer


def host_values(fn):
    """{key: 0-d tensor} of the host values fn() returns as {key: (value, like)}, each with `like`'s dtype and
    device. A jitted step calls fn again on every replay, so values that change every step (a learning rate,
    a bias correction) are fresh; fn does the host-side work of a step (counting it) each time it runs."""
    items = {key: _host_tensor(value, like.dtype, like.device) for key, (value, like) in fn().items()}
    if capture.active is not None:
        capture.active.host_values(fn, [(key, _buffer(t.node)) for key, t in items.items()])
    return items


def _host_tensor(value, dtype, device):
    runtime = get_runtime(device)
    buf = runtime.from_numpy(np.asarray(value, dtype.np), dtype)
    return Tensor._from_node(Node("LOAD", (), buf, buf.shape, dtype), runtime.name)


def _leaves(value, path="result"):
    """[(path, tensor)] of the tensors in a returned value; raises for anything a replay cannot return."""
    if value is None:
        return []
    if isinstance(value, Tensor):
        return [(path, value)]
    if isinstance(value, (tuple, list)):
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, f"{path}[{i}]")]
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(v, f"{path}[{k!r}]")]
    raise capture.Unreplayable(f"jit: the function returned {type(value).__name__} at {path}: a replay can return "
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


class Plan:
    """One recorded call as what a replay does. A source says where a value comes from on a replay:
    ("arg", i), ("out", realize k, output j), ("start", tensor) its value when the call began,
    ("grad", tensor) its .grad when the call began, ("host", hook h, position p), ("const", buffer)."""

    def __init__(self, rec, args, result):
        produced, sources = {}, {id(_buffer(t.node)): ("arg", i) for i, t in enumerate(args)}
        for h, (_, items) in enumerate(rec.hooks):
            sources.update({id(buf): ("host", h, p) for p, (_, buf) in enumerate(items)})
        for _, t, old, _ in rec.assigns:
            if old is not None:
                sources.setdefault(id(old), ("start", t))
        for t, old in rec.grads.items():
            if old is not None and _buffer(old.node) is not None:
                sources.setdefault(id(_buffer(old.node)), ("grad", t))
        self.host_made = {id(buf): array for buf, array in rec.host}

        def source(buf):
            return produced.get(id(buf)) or sources.get(id(buf)) or ("const", buf)

        self.hooks = [(fn, [(buf.dtype, buf.runtime) for _, buf in items]) for fn, items in rec.hooks]
        self.steps, self.assigns = [], [[] for _ in range(len(rec.realizes) + 1)]  # assigns[k + 1]: after k
        events = iter(rec.assigns)
        pending = next(events, None)
        for k in range(-1, len(rec.realizes)):
            if k >= 0:
                runtime, schedule, feeds, outs = rec.realizes[k]
                self.steps.append((runtime, schedule, [source(b) for b in feeds]))
                for j, b in enumerate(outs):
                    produced.setdefault(id(b), ("out", k, j))
            while pending is not None and pending[0] == k:
                self.assigns[k + 1].append((pending[1], source(pending[3])))
                pending = next(events, None)
        self.grads = [(t, None if t.grad is None else source(_buffer(t.grad.node))) for t in rec.grads]
        self.result = _rebuild(result, itertools.repeat(_RESULT))  # the structure, not the recorded call's values
        self.outputs = [(source(_buffer(t.node)), t.device) for _, t in _leaves(result)]
        self.targets = list({t: None for _, t, _, _ in rec.assigns})
        self._free_after_last_use()
        self._donations()
        self.stale = False  # set when a tensor it reads as a constant is given another value (capture.replaced)
        # every schedule at once (Runtime.chains), once a replay has updated each assigned tensor in place; the
        # chain holds for as long as each keeps its node (watched weakly) and nothing else holds that node
        self.chain, self.chain_targets = None, []
        runtimes = {rt for rt, _, _ in self.steps}
        self.chainable = len(runtimes) == 1 and runtimes.pop().chains and not self.assigns[0] \
            and all(s[0] != "grad" for _, _, srcs in self.steps for s in srcs) \
            and all(s[0] == "out" for s, _ in self.outputs) and all(s is None or s[0] == "out" for _, s in self.grads)
        capture.watch(self, {id(s[1]) for _, _, srcs in self.steps for s in srcs if s[0] == "const"})

    def _free_after_last_use(self):
        last = {}
        for k, (_, _, srcs) in enumerate(self.steps):
            for s in srcs:
                if s[0] == "out":
                    last[s[1:]] = k
        final = [s for _, s in self.grads if s is not None] + [s for s, _ in self.outputs]
        final += [s for after in self.assigns for _, s in after]
        for s in final:
            if s[0] == "out":
                last[s[1:]] = len(self.steps)
        self.frees = [[] for _ in self.steps]
        for (k, j), at in last.items():
            if at < len(self.steps):
                self.frees[at].append((k, j))

    def _donations(self):
        """self.donatable[k]: [(feed position, tensor)] of the tensors whose value at the start of the call step k
        reads for the last time and that are assigned right after it (an optimizer's parameters and moments). If
        nothing else holds such a value, step k may write its results over it (Runtime.execute's donate): the
        update happens in place, as torch's optimizers do, with no new arrays, Buffers or nodes for it."""
        uses = {}
        for k, (_, _, srcs) in enumerate(self.steps):
            for p, s in enumerate(srcs):
                if s[0] == "start":
                    uses.setdefault(s[1], []).append((k, p))
        late = [s for after in self.assigns for _, s in after] + [s for _, s in self.grads if s is not None]
        late += [s for s, _ in self.outputs]
        kept = {s[1] for s in late if s[0] == "start"}
        self.donatable = [[] for _ in self.steps]
        for k, after in enumerate(self.assigns[1:] if EXACT_REFCOUNTS else ()):
            for t, s in after:
                at = [p for kk, p in uses.get(t, []) if kk == k]  # where step k reads it
                last = uses.get(t, [(None, None)])[-1][0]
                if s[0] == "out" and s[1] == k and t not in kept and last == k and len(at) == 1:
                    self.donatable[k].append((at[0], t))

    def disagreement(self, other):
        """Why two Plans of one function would not replay alike, or None when they agree."""
        if len(self.steps) != len(other.steps):
            return f"it realized {len(self.steps)} times in one call and {len(other.steps)} in the next"
        for k, ((_, s1, src1), (_, s2, src2)) in enumerate(zip(self.steps, other.steps)):
            if s1 is not s2:
                return f"its realize #{k} ran a different graph"
            for i, (a, b) in enumerate(zip(src1, src2)):
                if not self._same_source(a, b, other):
                    if a[0] == b[0] == "const":
                        return (f"input {i} of its realize #{k} was another tensor in each call, neither an "
                                "argument nor one the step assigns")
                    return f"input {i} of its realize #{k} came from {a[0]} in one call and {b[0]} in the next"
        pairs = lambda plan: [p for after in plan.assigns for p in after] + plan.grads  # noqa: E731
        if not _all_same([(t,) + (s or ()) for t, s in pairs(self)], [(t,) + (s or ()) for t, s in pairs(other)]):
            return "it assigned other tensors or gradients"
        if not _all_same([s for s, _ in self.outputs], [s for s, _ in other.outputs]):
            return "it returned values from other places"
        if [len(items) for _, items in self.hooks] != [len(items) for _, items in other.hooks]:
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
                made = self.chain.run([_buffer(a.node) for a in args], self._host_values)
                if made is not None:
                    return self._finish(made.__getitem__)
            self.chain = None  # something else holds a value the step writes over: replay (and chain again later)
        start = {t: _buffer(t.node) for t in self.targets}
        grads = {t: (None if t.grad is None else _buffer(t.grad.node)) for t, _ in self.grads}
        host = [[rt.from_numpy(np.asarray(v, dtype.np), dtype) for v, (dtype, rt) in zip(values, metas)]
                for values, (_, metas) in zip(self._host_values(), self.hooks)]
        outs = []

        def value(src):
            kind = src[0]
            if kind == "out":
                return outs[src[1]][src[2]]
            if kind == "arg":
                return _buffer(args[src[1]].node)
            if kind == "start":
                return start[src[1]]
            if kind == "grad":
                return grads[src[1]]
            if kind == "host":
                return host[src[1]][src[2]]
            return src[1]

        runtime = self.steps[0][0] if self.chainable else None  # (the one runtime of every step)
        observed = [] if runtime is not None else None
        if runtime is not None:
            runtime.observed = observed  # what each schedule's run saw, for Runtime.chain
        try:
            moved = self._assign(self.assigns[0], value)
            for k, (runtime_k, schedule, srcs) in enumerate(self.steps):
                donate = [p for p, t in self.donatable[k] if _unshared(t)]
                outs.append(runtime_k.execute(schedule, [value(s) for s in srcs], donate))
                moved += self._assign(self.assigns[k + 1], value)
                for kk, j in self.frees[k]:
                    outs[kk][j] = None
        finally:
            if runtime is not None:
                runtime.observed = None
        if runtime is not None and not moved:
            self.chain = runtime.chain(self, observed)
            self.chain_targets = [(t, weakref.ref(t.node), _own_refs(t)) for t in self.targets]
        return self._finish(value)

    def _host_values(self):
        """Each hook's host values, computed afresh (see host_values)."""
        out = []
        for fn, metas in self.hooks:
            values = [v for v, _ in fn().values()]
            if len(values) != len(metas):
                raise RuntimeError(f"jit: the optimizer computed {len(values)} host values where the recording had "
                                   f"{len(metas)}: its parameters no longer step together; call the function "
                                   "without jit")
            out.append(values)
        return out

    def _finish(self, value):
        """What the call leaves in .grad and returns, with value(source) the Buffer each source has now."""
        for t, src in self.grads:
            t.grad = None if src is None else _loaded(value(src), t.device)
        return _rebuild(self.result, iter(_loaded(value(src), device) for src, device in self.outputs))

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


def _loaded(buf, device):
    return Tensor._from_node(Node("LOAD", (), buf, buf.shape, buf.dtype), device)


class jit:
    """Decorator: replay the kernels of `fn` instead of running its Python, from its fourth call with arguments of
    the same shapes, dtypes and devices (see the module's docstring for what fn may do)."""

    def __init__(self, fn):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.calls, self.plans, self.recorded = {}, {}, {}

    def __call__(self, *args):
        signature = tuple((a.shape, a.dtype, a.device) if isinstance(a, Tensor) else ("value", a) for a in args)
        try:
            hash(signature)
        except TypeError:
            raise TypeError(f"jit: {self.fn.__name__} got an argument that is neither a tensor nor hashable "
                            f"({', '.join(type(a).__name__ for a in args)}): pass tensors, numbers or "
                            "strings") from None
        tensors = [a for a in args if isinstance(a, Tensor)]
        realize(*tensors)
        plan = self.plans.get(signature)
        if plan is not None:
            if not plan.stale:
                return plan.replay(tensors)
            del self.plans[signature]  # it would replay old values: record again (this call and the next)
            self.calls[signature] = 1
        calls = self.calls[signature] = self.calls.get(signature, 0) + 1
        if calls == 1:
            return self.fn(*args)
        result, plan = self._record(args, tensors)
        first = self.recorded.pop(signature, None)
        if first is None or first.stale:  # (a stale first recording is not compared: this one replaces it)
            self.recorded[signature] = plan
            return result
        why = first.disagreement(plan)
        if why is not None:
            raise capture.Unreplayable(f"jit: {self.fn.__name__} did not do the same on two calls with the same "
                                       f"argument shapes ({why}), so it cannot be replayed. A jitted function must "
                                       "build the same graph every time: pass changing values as tensor "
                                       "arguments, and make random numbers outside it")
        self.plans[signature] = plan
        return result

    def _record(self, args, tensors):
        if capture.active is not None:
            raise RuntimeError("jit: a jitted function called another while it was being recorded: jit the outer one")
        capture.active = rec = capture.Recording()
        try:
            result = self.fn(*args)
            leaves = [t for _, t in _leaves(result)]
            realize(*leaves, *[t.grad for t in rec.grads if t.grad is not None])
        finally:
            capture.active = None
        return result, Plan(rec, tensors, result)
