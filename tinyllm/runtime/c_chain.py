"""A jitted step's schedules replayed as one chain of C calls, in memory that stays put from call to call.

A replay (tinyllm/jit.py) runs each schedule of the step through the runtime: it gathers the schedule's inputs,
keys its Program by their layout (c_program.py), makes the returned arrays, points the calls at them, wraps the
results in Buffers and gives tensors their new values. On a small model that Python costs a fifteenth of a
step, and it runs with the kernels' data in the caches instead of its own objects, while the other threads wait.

Once a replay of the step updated every tensor it assigns in place (an optimizer's parameters and moments, see
Program._take), what the step reads and writes stays where it is from call to call: the parameters and moments
in their own arrays, the values one schedule passes to the next (the gradients) in arrays that nothing outside
the step can see. A Chain keeps those arrays and the Programs pointed at them, as that replay left them, and a
call then only

  * checks that this still holds: each assigned tensor has its node, and nothing but that tensor holds the node,
    its array or a view of the array (as the normal replay checks before each donation; else the normal replay
    runs, and the step may be chained again later);
  * copies the arguments into the chain's own arrays, and the optimizer's host values (learning rate, bias
    corrections) into its 0-d arrays, just before the first schedule that reads them;
  * makes the C calls of every schedule in turn;
  * copies out what the step returns or leaves in .grad, into new arrays, as the caller may keep those.

What the step passes between its schedules is held by the chain between calls, uncounted by memory_allocated
(as torch's caching allocator keeps freed blocks reserved) and counted in the peak while a call runs.
"""
import copy
import sys
import weakref

import numpy as np

from ..env import debug_level
from .base import Buffer
from .memory import owner, track, untrack


def build(runtime, plan, observed):
    """A Chain for `plan`, from `observed`: what each Program.run of the replay that just ended saw (its inputs,
    returned arrays, what it took over and its output values). None when a schedule did not run from its
    Program, returned one of its inputs (the caller may copy those), read an argument that is not row-major, or
    can report bad input (an embedding's index) and runs after one that writes in place or reads host values:
    it could fail halfway, where the normal replay has to start over."""
    if len(observed) != len(plan.steps):
        return None
    observed = [(program, [_strong(a) for a in inputs], *rest) for program, inputs, *rest in observed]
    if any(a is None for _, inputs, *_ in observed for a in inputs):
        return None  # (every input is alive: a schedule's inputs are held by their tensors or earlier outputs)
    written = False
    for (program, inputs, _, taken, _), (_, _, srcs) in zip(observed, plan.steps):
        if (program.checks and written) or any(out[0] != "fresh" for out in program.outputs):
            return None
        if any(srcs[pos][0] == "arg" and not inputs[i].flags.c_contiguous for pos, i in program.feeds.items()):
            return None
        written = written or bool(taken) or any(s[0] == "host" for s in srcs)
    return Chain(runtime, plan, observed)


class Chain:
    """A jit Plan's Programs pointed at arrays that stay put (see the module's docstring)."""

    def __init__(self, runtime, plan, observed):
        self.runtime = runtime
        # the arrays the step updates in place, watched weakly: the checks count who holds them
        self.groups, weak = [], {}
        for _, _, _, taken, _ in observed:
            for base, views in taken.values():
                members = [a for view, a in views.items() if view is not None]
                self.groups.append((weakref.ref(base), [weakref.ref(a) for a in members]))
                for a in [base, *members]:
                    weak[id(a)] = weakref.ref(a)
        self.args, self.hosts, self.steps, made = [], [], [], {}
        self.first_host = len(plan.steps)  # the step before which the host values are computed
        for k, ((program, inputs, fresh, _, _), (_, _, srcs)) in enumerate(zip(observed, plan.steps)):
            arrays = list(inputs)
            for pos, i in program.feeds.items():
                kind = srcs[pos][0]
                if kind == "arg":  # the arguments and host values are copied into arrays of the chain
                    arrays[i] = np.empty_like(inputs[i])
                    self.args.append((arrays[i], srcs[pos][1]))
                elif kind == "host":
                    arrays[i] = np.array(inputs[i])
                    self.hosts.append((srcs[pos][1:], arrays[i]))
                    self.first_host = min(self.first_host, k)
            made.update((id(owner(a)), owner(a)) for a in fresh if id(a) not in weak)
            used = [arrays[i] for i in program.inputs] + list(fresh)
            if any(program is p for p, _ in self.steps):  # one Program serving several steps (an optimizer's
                program = copy.copy(program)  # chunks of one shape): each step's copy keeps its own pointers
                program.arena = None
            self.steps.append((program, [weak.get(id(a), a) for a in used]))
        self.escaping = {}  # what the step returns or leaves in .grad: source -> (array, shape, dtype)
        for src in [s for s, _ in plan.outputs] + [s for _, s in plan.grads if s is not None]:
            k, j = src[1:]
            value, node = observed[k][4][j], plan.steps[k][1].outputs[j]
            self.escaping[src] = (weak.get(id(value), value), node.shape, node.dtype)
        for a in made.values():  # held between calls but not in use: counted only while a call runs
            untrack(a)
        self.nbytes = sum(a.nbytes for a in made.values())

    def run(self, args, host_values):
        """{source: Buffer} of what the step returns and leaves in .grad, or None when the normal replay must run
        instead: replays are off, a value the step writes over is held elsewhere, another thread is replaying, or a
        kernel reported bad input (the normal replay then raises the error). `args`: the arguments' Buffers;
        `host_values()`: each hook's host values, called once, when the chain can no longer fail."""
        runtime = self.runtime
        if not runtime.replays or debug_level() or not self._alone():  # (TINYLLM_DEBUG times each kernel)
            return None
        if not runtime.arena_lock.acquire(blocking=False):
            return None
        try:
            for array, i in self.args:
                np.copyto(array, args[i].data)
            for k, (program, arrays) in enumerate(self.steps):
                if k == self.first_host:
                    self._host(host_values())
                program.prepare(runtime, lambda: [_strong(a) for a in arrays], self)
                if not program.call(self.nbytes):
                    return None
            if self.first_host == len(self.steps):
                self._host(host_values())
            return {src: Buffer(runtime, track(np.array(_strong(a))), shape, dtype)
                    for src, (a, shape, dtype) in self.escaping.items()}
        finally:
            runtime.arena_lock.release()

    def _host(self, values):
        for (h, p), array in self.hosts:
            array[...] = values[h][p]

    def _alone(self):
        """Whether nothing but its Buffer holds each array the step writes over, and nothing but those arrays
        (views of it) holds their base: what Program._take checks, counted with the chain's weak references."""
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
