"""A jitted step's Programs kept pointed at arrays that stay put, run as one Chain (docs/architecture.md,
"Chained calls"). The arrays passed between schedules (the gradients) count in memory_allocated only while a call
runs, as torch's caching allocator keeps freed blocks reserved."""
import copy
import sys
import weakref

import numpy as np

from ...env import debug_level
from ..base import Buffer
from ..memory import owner, track, untrack


def build(runtime, tape, observed):
    """A Chain for `tape`, from what each Program.run of the replay that just ended saw (`observed`), or None
    when a schedule did not run from its Program, returned one of its inputs (the caller may copy those), read
    an argument that is not row-major, or can report bad input (an embedding's index) after one that writes in
    place, reads host values or makes host calls (MPI): the chain could then fail halfway, where the normal replay
    must start over."""
    if len(observed) != len(tape.schedules):
        return None
    observed = [(program, [_strong(a) for a in inputs], *rest) for program, inputs, *rest in observed]
    if any(a is None for _, inputs, *_ in observed for a in inputs):
        return None  # (every input is alive: a schedule's inputs are held by their tensors or earlier outputs)
    written = False
    for (program, inputs, _, taken, _), (_, _, srcs) in zip(observed, tape.schedules):
        if (program.checks and written) or any(out[0] != "fresh" for out in program.outputs):
            return None
        if any(srcs[pos][0] == "arg" and not inputs[i].flags.c_contiguous for pos, i in program.feeds.items()):
            return None
        written = written or bool(taken) or program.hosts or any(s[0] == "host" for s in srcs)
    return Chain(runtime, tape, observed)


class Chain:
    """A Tape's Programs pointed at arrays that stay put (see the module's docstring)."""

    def __init__(self, runtime, tape, observed):
        self.runtime = runtime
        # the arrays the step updates in place, watched weakly: the checks count who holds them
        self.groups, weak = [], {}
        for _, _, _, taken, _ in observed:
            for base, views in taken.values():
                members = [a for view, a in views.items() if view is not None]
                self.groups.append((weakref.ref(base), [weakref.ref(a) for a in members]))
                for a in [base, *members]:
                    weak[id(a)] = weakref.ref(a)
        self.args, self.hosts, self.programs, made = [], [], [], {}
        self.first_host = len(tape.schedules)  # the schedule before which the host values are computed
        for k, ((program, inputs, fresh, _, _), (_, _, srcs)) in enumerate(zip(observed, tape.schedules)):
            arrays = list(inputs)
            for pos, i in program.feeds.items():
                kind = srcs[pos][0]
                if kind == "arg":  # copied into arrays of the chain, as are host values
                    arrays[i] = np.empty_like(inputs[i])
                    self.args.append((arrays[i], srcs[pos][1]))
                elif kind == "host":
                    arrays[i] = np.array(inputs[i])
                    self.hosts.append((srcs[pos][1:], arrays[i]))
                    self.first_host = min(self.first_host, k)
            made.update((id(owner(a)), owner(a)) for a in fresh if id(a) not in weak)
            used = [arrays[i] for i in program.inputs] + list(fresh)
            if any(program is p for p, _ in self.programs):  # one Program serving several schedules (an optimizer's
                program = copy.copy(program)  # chunks of one shape): each one's copy keeps its own pointers
                program.arena = None
            self.programs.append((program, [weak.get(id(a), a) for a in used]))
        self.escaping = {}  # what the step returns or leaves in .grad: source -> (array, shape, dtype)
        for src in [s for s, _ in tape.outputs] + [s for _, s in tape.grads if s is not None]:
            k, j = src[1:]
            value, node = observed[k][4][j], tape.schedules[k][1].outputs[j]
            self.escaping[src] = (weak.get(id(value), value), node.shape, node.dtype)
        for a in made.values():  # held between calls but not in use: counted only while a call runs
            untrack(a)
        self.nbytes = sum(a.nbytes for a in made.values())

    def run(self, args, host_values):
        """{source: Buffer} of what the step returns and leaves in .grad, or None when the normal replay must run
        instead (it raises a kernel's bad-input error). `args`: the arguments' Buffers; `host_values()`: each host
        fn's values, called once, when the chain can no longer fail."""
        runtime = self.runtime
        if not runtime.replays or debug_level() or not self._alone():  # (TINYLLM_DEBUG times each kernel)
            return None
        if not runtime.arena_lock.acquire(blocking=False):
            return None
        try:
            for array, i in self.args:
                np.copyto(array, args[i].data)
            for k, (program, arrays) in enumerate(self.programs):
                if k == self.first_host:
                    self._host(host_values())
                program.prepare(runtime, lambda: [_strong(a) for a in arrays], self)
                if not program.call(self.nbytes):
                    return None
            if self.first_host == len(self.programs):
                self._host(host_values())
            return {src: Buffer(runtime, track(np.array(_strong(a))), shape, dtype)
                    for src, (a, shape, dtype) in self.escaping.items()}
        finally:
            runtime.arena_lock.release()

    def _host(self, values):
        for (h, p), array in self.hosts:
            array[...] = values[h][p]

    def _alone(self):
        """donate.take's check, counted with the chain's weak references: nothing but its Buffer holds each array
        the step writes over, and nothing but those views holds their base."""
        for base_ref, member_refs in self.groups:
            base = base_ref()
            if base is None:
                return False
            if not member_refs:  # a whole array: its Buffer, `base` and getrefcount's argument
                if sys.getrefcount(base) != 3:
                    return False
                continue
            if sys.getrefcount(base) != len(member_refs) + 2:  # each view, `base` and getrefcount's argument
                return False
            for ref in member_refs:
                if sys.getrefcount(ref()) != 2:  # its Buffer and getrefcount's argument
                    return False
        return True


def _strong(a):
    return a() if isinstance(a, weakref.ref) else a
