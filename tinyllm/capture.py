"""What a function did to tensors, recorded while it runs, so `tinyllm.jit` can do it again without its Python.

While a Recording is `active`, the core reports to it: every realize (its cached plan, the buffers it read and
the buffers it made), every assignment of a new value to a tensor that outlives the step (an optimizer's
parameters and moments), every write of a `.grad`, every tensor made from host data, and every host value
that must be computed afresh on each call (an optimizer's learning rate and bias corrections). Reading a value
back to the host (.numpy(), .item()) is refused: a replay would not repeat it.

A Plan also reads buffers that no argument or assignment of the call explains (a model's weights, read by an
eval function the optimizer steps outside of). Those it `watch`es: when a tensor is later given another value,
the tensor's setter reports the buffer it left (`replaced`), and every plan reading that buffer becomes stale, to
be recorded again rather than replayed on the old values.
"""
import weakref

active = None  # the Recording being made, if any
watchers = {}  # id of a buffer -> the live plans (a WeakSet) that read it as a constant


def _buffer(node):
    return node.arg if node.op == "LOAD" else node.buffer


class Recording:
    def __init__(self):
        self.realizes = []  # (runtime, schedule, feeds, outputs): Buffers in the order the plan takes them
        self.assigns = []  # (realize index, tensor, old buffer, new buffer)
        self.grads = {}  # tensor -> its .grad before the first write in this call (None or a Tensor)
        self.host = []  # (buffer, array): tensors made from host data during the call, with their values
        self.hooks = []  # (fn, [(key, buffer)]): host values that fn() recomputes on every call

    def realized(self, runtime, schedule, feeds, outputs):
        self.realizes.append((runtime, schedule, list(feeds), list(outputs)))

    def assigned(self, tensor, new_node):
        self.assigns.append((len(self.realizes) - 1, tensor, _buffer(tensor.node), _buffer(new_node)))

    def grad_written(self, tensor, old):
        self.grads.setdefault(tensor, old)

    def host_made(self, buffer, array):
        self.host.append((buffer, array))

    def host_values(self, fn, items):
        self.hooks.append((fn, items))


def watch(plan, ids):
    """`plan` reads these buffers (by id; it holds them, so the ids stay theirs) as constants."""
    for i in ids:
        watchers.setdefault(i, weakref.WeakSet()).add(plan)
    weakref.finalize(plan, _forget, ids)


def _forget(ids):
    for i in ids:
        if i in watchers and not watchers[i]:
            del watchers[i]


def replaced(old_node):
    """A tensor moved off old_node (a new value): plans that read old_node's buffer as a constant are stale."""
    buf = _buffer(old_node)
    for plan in watchers.get(id(buf), ()) if buf is not None else ():
        plan.stale = True


class Unreplayable(RuntimeError):
    """The function does something a replay could not repeat."""


def refuse_host_read(what):
    if active is not None:
        raise Unreplayable(f"jit: the function reads a tensor on the host ({what}) while it is captured: a replay "
                           "runs only its kernels and would not repeat the read. Return the tensor from the "
                           "function and read it after the call")
