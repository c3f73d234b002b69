"""What the core reports to tinyllm.jit: a recorded call's events (to `active`), and at any time a tensor leaving
a buffer for a new value (`replaced`: Tapes that read it as a constant go stale)."""
import weakref

active = None  # a StepRecording
watchers = {}  # id of a buffer -> the live Tapes (a WeakSet) that read it as a constant


def buffer_of(node):
    return node.arg if node.op == "LOAD" else node.buffer


class StepRecording:
    """What one call of a jitted function did, in order (tape.Tape turns it into a replay)."""

    def __init__(self):
        self.realizes = []  # (runtime, schedule, feeds, outputs): Buffers in the schedule's order
        self.assigns = []  # (realize index, tensor, old buffer, new buffer)
        self.grads = {}  # tensor -> its .grad before the call's first write to it
        self.host_made = []  # (buffer, array) of each tensor made from host data
        self.host_fns = []  # (fn, [(key, buffer)]) of each host_values call

    def realized(self, runtime, schedule, feeds, outputs):
        self.realizes.append((runtime, schedule, list(feeds), list(outputs)))

    def assigned(self, tensor, new_node):
        self.assigns.append((len(self.realizes) - 1, tensor, buffer_of(tensor.node), buffer_of(new_node)))

    def grad_written(self, tensor, old):
        self.grads.setdefault(tensor, old)

    def made_from_host(self, buffer, array):
        self.host_made.append((buffer, array))

    def host_values(self, fn, items):
        self.host_fns.append((fn, items))


def watch(tape, ids):
    """`tape` reads these buffers (by id; it holds them, so the ids stay theirs) as constants."""
    for i in ids:
        watchers.setdefault(i, weakref.WeakSet()).add(tape)
    weakref.finalize(tape, _forget, ids)


def _forget(ids):
    for i in ids:
        if i in watchers and not watchers[i]:
            del watchers[i]


def replaced(old_node):
    """A tensor left old_node for a new value."""
    buf = buffer_of(old_node)
    for tape in watchers.get(id(buf), ()) if buf is not None else ():
        tape.stale = True


class Unreplayable(RuntimeError):
    """The function does something a replay could not repeat."""


def refuse_host_read(what):
    if active is not None:
        raise Unreplayable(f"jit: the function reads a tensor on the host ({what}) while it is recorded: a replay "
                           "runs only its kernels and would not repeat the read. Return the tensor from the "
                           "function and read it after the call")
