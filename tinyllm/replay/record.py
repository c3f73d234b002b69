"""What the core reports to tinyllm.jit (replay/jit.py): to the `active` StepRecording while a call is recorded,
and at any time the buffer a tensor leaves for a new value (`replaced`: Tapes reading it as a constant go stale)."""
import weakref

active = None  # the StepRecording being made, if any
watchers = {}  # id of a buffer -> the live Tapes (a WeakSet) that read it as a constant


def buffer_of(node):
    return node.arg if node.op == "LOAD" else node.buffer


class StepRecording:
    """What one call of a jitted function did, in order; tape.Tape turns it into what a replay does."""

    def __init__(self):
        self.realizes = []  # (runtime, schedule, feeds, outputs): Buffers in the order the schedule takes them
        self.assigns = []  # (realize index, tensor, old buffer, new buffer)
        self.grads = {}  # tensor -> its .grad before the first write in this call (None or a Tensor)
        self.host_made = []  # (buffer, array): tensors made from host data during the call, with their values
        self.host_fns = []  # (fn, [(key, buffer)]): host values that fn() recomputes on every call

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
    """A tensor moved off old_node (a new value): Tapes that read old_node's buffer as a constant are stale."""
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
