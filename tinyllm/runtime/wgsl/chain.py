"""A jitted step on the WGSL runtime as one recorded command sequence over buffers that stay put (docs/architecture.md,
"Chained jit steps"): a call costs a constant number of wgpu-py calls, however many kernels it has.

A replay of a jit Tape that the runtime watched (`observed`: each schedule's inputs, outputs and dispatches, in
order) is a valid run of its dispatches over the buffers it used. Run again over the same buffers, it computes the
next step, provided every buffer the step reads before writing it holds what it held then: the arguments, the host
values (an optimizer's step size), the state the step updates (parameters, moments, a KV cache), and constants.
Every other buffer the step touches is written before it is read (it came from the pool), so the Chain keeps them
all, out of the pool, and no one else can write them between calls. So a call:
  1. writes the host values (one queue write for all of them, to a staging buffer);
  2. in one command buffer: copies the arguments into the Chain's own buffers (an argument's buffer belongs to its
     tensor) and the host values from the staging buffer, copies each updated tensor's current value to where the
     step reads it from (an update writes a new buffer: the tensor's, which stays its home), runs the recorded
     dispatches in one compute pass, and copies
     what the call returns out of the Chain's buffers into fresh ones (the next call would overwrite them);
  3. submits it. Parameters and optimizer state stay on the GPU; nothing is read back unless the caller asks.
The encoders are C (runtime_c/wgpu_replay.c) where the kernels are built, so the dispatches cost no wgpu-py call.

Not chained (the normal replay runs): a schedule that read from or wrote to the host midway, or ran with index
checks pending (its error slots would be elsewhere); at a call, a tensor the step updates or a buffer the Chain
keeps held by someone else (counted as the C runtime's Chain does) or an argument of another layout. Index checks
pending at a call are made first (a read-back), so the step's kernels report to the slots they were built for.
"""
import heapq
import sys
import weakref

import numpy as np

from ... import dtype as dt
from ..base import Buffer
from .device import Copies, Runs

GIVE_UP = 3  # chains of one Tape that could not run: past this, the Tape replays without building more


class Seen:
    """What one schedule's run showed the runtime: its input Values (feed order), output Buffers, its dispatches'
    Runs (None for host I/O) and the error slots it took."""
    __slots__ = ("feeds", "outs", "trace", "slots")

    def __init__(self, feeds, outs, trace, slots):
        self.feeds, self.outs, self.trace, self.slots = feeds, outs, trace, slots


_failures = weakref.WeakKeyDictionary()  # Tape -> chains of it that could not run


def build(rt, tape, observed):
    """A Chain for `tape` from the replay it just made (`observed`: a Seen per schedule), or None."""
    if len(observed) != len(tape.schedules) or _failures.get(tape, 0) >= GIVE_UP:
        return None
    if any(r is None for seen in observed for r in seen.trace):
        return None
    if len(rt.index_ops) != sum(len(seen.slots) for seen in observed):
        return None                                     # (it ran with index checks pending: its slots are later)
    persistent = {id(s.buffer) for s in [*rt.constants.values(), rt.errors]}
    args, hosts, starts, known = {}, {}, {}, {}
    for seen, (_, _, srcs) in zip(observed, tape.schedules):
        for v, src in zip(seen.feeds, srcs):
            kind = src[0]
            if kind == "arg":
                args.setdefault(src[1], v)
            elif kind == "host":
                hosts[src[1:]] = v.storage
            elif kind == "start":
                starts[id(src[1])] = v.storage
            elif kind == "const":
                persistent.add(id(v.storage.buffer))    # (a tensor read as a constant: the Tape watches it)
            known[id(v.storage.buffer)] = v.storage
        for b in seen.outs:
            known[id(b.data.storage.buffer)] = b.data.storage
    homes = {}                                          # tensor -> the storage it holds now, its home
    for after in tape.assigns:
        for t, _ in after:
            homes[id(t)] = (t, t.node.arg.data.storage)
    home_ids = {id(s.buffer) for _, s in homes.values()}
    if any(key in starts and starts[key].nbytes != s.nbytes for key, (_, s) in homes.items()):
        return None                                     # (an update of another size than the value it replaces)
    escaping = {}                                       # source -> (Value, node shape, node dtype)
    for src in [s for s, _ in tape.outputs] + [s for _, s in tape.grads if s is not None]:
        k, j = src[1:]
        b = observed[k].outs[j]
        escaping[src] = (b.data, b.shape, b.dtype)
    arg_ids = {id(v.storage.buffer) for v in args.values()}
    if any(id(v.storage.buffer) in arg_ids for v, _, _ in escaping.values()):
        return None                                     # (a step that returns its argument)
    pooled = {id(s.buffer): (size, s) for size, heap in rt.gpu.pool.items() for _, s in heap}
    owned, taken, substitutes = {}, set(), {}
    gpu = rt.gpu
    # what the Chain binds in place of a buffer someone else holds: arguments and returned values get its own
    for v in [*args.values(), *(v for v, _, _ in escaping.values())]:
        s = v.storage
        if id(s.buffer) not in home_ids and id(s.buffer) not in substitutes:
            mine = gpu._new_storage(s.nbytes)
            mine.recycler.detach()                      # (freed with the Chain, not pooled)
            substitutes[id(s.buffer)] = mine
    for seen in observed:
        for run in seen.trace:
            for buffer, _ in run.bound:
                b = id(buffer)
                if b in persistent or b in substitutes or b in home_ids or b in owned:
                    continue
                if b in pooled:
                    taken.add(b)
                    owned[b] = pooled[b][1]
                elif b in known:
                    owned[b] = known[b]
                else:
                    return None                         # (a buffer of unknown provenance: someone holds it)
    for heap_size in {pooled[b][0] for b in taken}:     # the pool's buffers the Chain keeps leave the pool
        heap = [e for e in gpu.pool[heap_size] if id(e[1].buffer) not in taken]
        heapq.heapify(heap)
        gpu.pool[heap_size] = heap
    return Chain(rt, tape, observed, args, hosts, starts, homes, escaping, owned, substitutes)


class Chain:
    """A Tape's replay kept as one command sequence (see the module's docstring)."""

    def __init__(self, rt, tape, observed, args, hosts, starts, homes, escaping, owned, substitutes):
        self.rt, self.tape = rt, weakref.ref(tape)
        held = {id(s.buffer) for s in hosts.values()}   # (in self.hosts)
        self.owned = [s for b, s in owned.items() if b not in held]  # (holding them keeps them out of the pool)
        self.substitutes = substitutes
        runs = []
        for seen in observed:
            for run in seen.trace:
                if any(id(b) in substitutes for b, _ in run.bound):
                    bound = tuple((substitutes[id(b)].buffer, size) if id(b) in substitutes else (b, size)
                                  for b, size in run.bound)
                    run = type(run)(run.pipe, rt.gpu.bind_group(run.layout, bound), run.groups, run.layout, bound)
                runs.append(run)
        self.runs = Runs(runs, rt.gpu.native)
        self.slots = [s for seen in observed for s in seen.slots]
        self.args = [(i, v.shape, v.elem_strides, v.offset, v.dtype, v.storage.nbytes,
                      substitutes[id(v.storage.buffer)].buffer) for i, v in args.items()]
        # the host values go in one queue write to a staging buffer, copied from there to where the step reads them
        self.hosts, at = [], 0
        for (h, p), s in hosts.items():
            self.hosts.append((h, p, s, tape.host_fns[h][1][p][0], at))     # (.., dtype, offset in the staging)
            at += s.nbytes
        self.staging = rt.gpu._new_storage(at) if at else None
        if self.staging is not None:
            self.staging.recycler.detach()
        self.host_bytes = at
        self.homes = [(weakref.ref(t), home) for t, home in homes.values()]
        # the copies every call makes (their handles taken once): the host values out of the staging buffer, and
        # each updated tensor's value to where the step reads its old one
        self.fixed = Copies([(self.staging.buffer, at, s.buffer, s.nbytes) for _, _, s, _, at in self.hosts] +
                            [(home.buffer, 0, starts[key].buffer, home.nbytes) for key, (t, home) in homes.items()
                             if key in starts and starts[key] is not home])
        self.escaping = [(src, substitutes.get(id(v.storage.buffer), v.storage), v, shape, dtype)
                         for src, (v, shape, dtype) in escaping.items()]

    def run(self, args, host_values):
        """{source: Buffer} of what the step returns and leaves in .grad, or None when the normal replay must run
        instead. `args`: the arguments' Buffers; `host_values()`: each host fn's values, called once."""
        rt, gpu = self.rt, self.rt.gpu
        if not self._alone():
            return self._refused()
        if rt.index_ops:
            rt.check_errors()                           # (the step's kernels report to the first error slots)
        copies = []
        for i, shape, strides, offset, dtype, nbytes, mine in self.args:
            v = args[i].data
            if (v.shape, v.elem_strides, v.offset, v.dtype, v.storage.nbytes) != (shape, strides, offset, dtype,
                                                                                    nbytes):
                return self._refused()
            copies.append((v.storage.buffer, 0, mine, nbytes))
        values = host_values()                          # (always: an optimizer counts its steps there)
        if self.hosts:
            staged = np.zeros(self.host_bytes, np.uint8)
            for h, p, storage, dtype, at in self.hosts:
                data = rt.host_array(dt.as_storage(values[h][p], dtype), dtype).reshape(-1).view(np.uint8)
                staged[at:at + data.size] = data
            gpu.write(self.staging, staged)
        out, after = {}, []
        for src, storage, v, shape, dtype in self.escaping:
            fresh = gpu.alloc(storage.nbytes)
            after.append((storage.buffer, 0, fresh.buffer, storage.nbytes))
            out[src] = Buffer(rt, rt.value(fresh, v.shape, v.dtype, v.elem_strides, v.offset), shape, dtype)
        gpu.submit_step(copies, self.fixed, self.runs, after)
        rt.index_ops.extend(self.slots)
        for ref, _ in self.homes:                       # (their values changed: what the host read of them is old)
            ref().node.arg.data.host = None
        return out

    def _alone(self):
        """Nothing but the Chain holds the buffers it keeps (a Value on one would see it change), and each updated
        tensor still holds its home."""
        for s in self.owned:
            if sys.getrefcount(s) != 3:                 # the list, the loop's name and getrefcount's argument
                return False
        for _, _, s, _, _ in self.hosts:
            if sys.getrefcount(s) != 3:                 # its entry, the loop's name and getrefcount's argument
                return False
        for ref, home in self.homes:
            t = ref()
            if t is None or t.node.op != "LOAD" or t.node.arg.data.storage is not home:
                return False
        return True

    def _refused(self):
        tape = self.tape()
        if tape is not None:
            _failures[tape] = _failures.get(tape, 0) + 1
        return None
