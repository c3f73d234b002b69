"""What the core reports to tinyllm.jit: a recorded call's events (to `active`), and at any time a tensor leaving
a buffer for a new value (`replaced`: Tapes that read it as a constant go stale)."""
import weakref

active = None  # a StepRecording
watchers = {}  # id of a buffer -> the live Tapes (a WeakSet) that read it as a constant


def buffer_of(node):
    return node.arg if node.op == "LOAD" else node.buffer


def state(t):
    """What a Tape is keyed on for each tensor it reads or writes by identity (an argument, an assigned tensor, a
    tensor whose .grad it writes): shape, dtype, device, requires_grad and the same of its .grad (None without one).
    A schedule is compiled for its inputs' shapes and dtypes, so a replay fed another is wrong, not slow."""
    g = t._grad
    return (t._node.shape, t._node.dtype, t.device, t.requires_grad,
            None if g is None else (g._node.shape, g._node.dtype, g.device))


def changes(old, new):
    """What differs between two state()s, in words."""
    said = [f"{name} {_show(a)} -> {_show(b)}" for name, a, b in zip(_FIELDS, old, new) if a != b]
    g, h = old[4], new[4]
    if g != h:
        if g is None or h is None:
            said.append(f".grad {'None' if g is None else 'set'} -> {'None' if h is None else 'set'}")
        else:
            said += [f".grad's {name} {_show(a)} -> {_show(b)}" for name, a, b in zip(_FIELDS, g, h) if a != b]
    return ", ".join(said)


_FIELDS = ("shape", "dtype", "device", "requires_grad")


def _show(value):
    return value.name if hasattr(value, "name") else str(value)


class StepRecording:
    """What one call of a jitted function did, in order (tape.Tape turns it into a replay)."""

    def __init__(self):
        self.realizes = []  # (runtime, schedule, feeds, outputs): Buffers in the schedule's order
        self.assigns = []  # (realize index, tensor, old buffer, new buffer)
        self.grads = {}  # tensor -> its .grad before the call's first write to it
        self.host_made = []  # (buffer, array) of each tensor made from host data
        self.host_fns = []  # (fn, [(key, buffer)]) of each host_values call
        self.started = {}  # tensor -> its state() before the call first assigned it or wrote its .grad
        self.fed = {}  # id of a buffer a schedule read -> the graph node it was read through

    def realized(self, runtime, schedule, feeds, outputs, nodes=()):
        self.realizes.append((runtime, schedule, list(feeds), list(outputs)))
        for buf, node in zip(feeds, nodes):
            self.fed.setdefault(id(buf), node)

    def assigned(self, tensor, new_node):
        self.started.setdefault(tensor, state(tensor))
        self.assigns.append((len(self.realizes) - 1, tensor, buffer_of(tensor.node), buffer_of(new_node)))

    def grad_written(self, tensor, old):
        self.started.setdefault(tensor, state(tensor))
        self.grads.setdefault(tensor, old)

    def made_from_host(self, buffer, array):
        self.host_made.append((buffer, array))

    def host_values(self, fn, items):
        self.host_fns.append((fn, items))


def watch(tape, ids, nodes):
    """`tape` reads these buffers (by id; it holds them, so the ids stay theirs) as constants, through these graph
    nodes: a node that dies means the tensor that held it is gone (a parameter replaced by a new one), which marks
    the Tape `gone` (the check costs a replay nothing)."""
    for i in ids:
        watchers.setdefault(i, weakref.WeakSet()).add(tape)
    weakref.finalize(tape, _forget, ids)
    ref = weakref.ref(tape)
    tape._held = [weakref.ref(n, lambda _: _mark_gone(ref)) for n in nodes]


def _mark_gone(ref):
    tape = ref()
    if tape is not None:
        tape.gone = True


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
