"""tinyllm.jit: a training step recorded, then replayed as its kernels alone, as tinygrad's TinyJit does.

A step's Python (graph, autograd, rewrites, schedule lookup, the optimizer's update) costs as much as its kernels
on a small model. `jit(fn)` runs that Python three times only:

    call 1      fn runs eagerly: kernels compile, optimizer state is made.
    calls 2, 3  fn runs eagerly under a StepRecording (record.py); each becomes a Tape (tape.py). The two Tapes
                must agree, or the function is refused.
    calls 4…    the Tape is replayed.

Recorded: each realize (its schedule, the Buffers it read and made), each tensor `assign` gives a new value (an
optimizer's parameters and moments), each .grad written, each tensor made from host data, each host value the
step computes afresh (`host_values`). The Tape says where each schedule's inputs come from on a replay: an
argument, an earlier schedule, an assigned tensor's or a .grad's value at the call's start, a host value, or a
buffer that does not change.

Replayed: each schedule runs on its runtime (runtime.execute) with those inputs; assigned tensors and .grads get
their new values, new tensors hold what fn returned. A value a schedule reads for the last time and that is
assigned right after it is donated to it when nothing else holds it, so the optimizer updates in place. On the C
runtime a schedule replays its recorded C calls (runtime/c/program.py), and once a replay updated every assigned
tensor in place, the whole call runs as one Chain of C calls (runtime/c/chain.py).

Invalid:
  * arguments of other shapes, dtypes, devices, or other non-tensor values: that signature has its own calls
    1-3 and Tape;
  * a buffer the Tape reads as a constant (an eval function's weights) given a new value outside the call: the
    Tape is stale and fn is recorded again;
  * a value the step writes over held elsewhere (an array from .numpy(), a pending graph): that call neither
    donates nor chains, and makes new arrays as an eager step would;
  * refused with an error: reading a value on the host inside fn, host-made tensors that change per call
    (random numbers: the Tapes disagree), returning Python values. Python state (a learning-rate scheduler)
    stays outside fn: the optimizer reads the rate on every replay.
The assigned tensors are recorded as objects: after replacing them (a new optimizer), jit fn again.
"""
import functools


from .. import dtype as dt
from ..realizer import realize
from ..runtime import get as get_runtime
from ..tensor import Tensor
from . import record
from .tape import Tape, leaves, loaded


def host_values(fn):
    """{key: 0-d tensor} of the host values fn() returns as {key: (value, like)}, each with `like`'s dtype and
    device. A replay calls fn again, so values that change every step are fresh; fn does the host-side work of a
    step (counting it) each time it runs."""
    items = {}
    for key, (value, like) in fn().items():
        runtime = get_runtime(like.device)
        items[key] = loaded(runtime.from_numpy(dt.as_storage(value, like.dtype), like.dtype), runtime.name)
    if record.active is not None:
        record.active.host_values(fn, [(key, record.buffer_of(t.node)) for key, t in items.items()])
    return items


class jit:
    """Decorator: replay the kernels of `fn` instead of running its Python, from its fourth call with arguments of
    the same shapes, dtypes and devices (see the module's docstring for what fn may do)."""

    def __init__(self, fn):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.calls, self.tapes, self.recorded = {}, {}, {}

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
        tape = self.tapes.get(signature)
        if tape is not None:
            if not tape.stale:
                return tape.replay(tensors)
            del self.tapes[signature]  # it would replay old values: record again (this call and the next)
            self.calls[signature] = 1
        calls = self.calls[signature] = self.calls.get(signature, 0) + 1
        if calls == 1:
            return self.fn(*args)
        result, tape = self._record(args, tensors)
        first = self.recorded.pop(signature, None)
        if first is None or first.stale:  # (a stale first recording is not compared: this one replaces it)
            self.recorded[signature] = tape
            return result
        why = first.disagreement(tape)
        if why is not None:
            raise record.Unreplayable(f"jit: {self.fn.__name__} did not do the same on two calls with the same "
                                      f"argument shapes ({why}), so it cannot be replayed. A jitted function must "
                                      "build the same graph every time: pass changing values as tensor "
                                      "arguments, and make random numbers outside it")
        self.tapes[signature] = tape
        return result

    def _record(self, args, tensors):
        if record.active is not None:
            raise RuntimeError("jit: a jitted function called another while it was being recorded: jit the outer one")
        record.active = rec = record.StepRecording()
        try:
            result = self.fn(*args)
            realize(*[t for _, t in leaves(result)], *[t.grad for t in rec.grads if t.grad is not None])
        finally:
            record.active = None
        return result, Tape(rec, tensors, result)
