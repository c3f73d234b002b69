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

Keyed: a Tape's kernels are compiled for the shapes and dtypes it saw, so a replay is only valid for the same
  * arguments: shape, dtype, device, requires_grad and the same of their .grad (record.state), and each non-tensor
    value: the signature. Another signature has its own calls 1-3 and Tape (a dict lookup of that tuple per call);
  * tensors the step writes by identity (a parameter or optimizer state it assigns, a KV cache, a tensor whose
    .grad it writes): record.state of each when the recorded call began, compared with each one's state at every
    replay (Tape.changed: a tuple compare per tensor). A change (model.half(), model.to(device), a parameter
    frozen, a cache of another shape or dtype) drops the Tape and records fn again (this call and the next);
    `fn.recorded_again` says why, naming the tensor and what changed;
  * tensors it reads as constants (an eval function's weights): given a new value (any node: a new dtype or
    device too) or a new requires_grad outside the call, or no longer held by any tensor (a parameter replaced by
    a new Parameter), the Tape is stale and fn is recorded again. These cost a replay nothing: the tensor's setter
    and a weak reference's callback mark the Tape.

Invalid:
  * a value the step writes over held elsewhere (an array from .numpy(), a pending graph): that call neither
    donates nor chains, and makes new arrays as an eager step would;
  * refused with an error: reading a value on the host inside fn, host-made tensors that change per call
    (random numbers: the Tapes disagree), returning Python values. Python state (a learning-rate scheduler)
    stays outside fn: the optimizer reads the rate on every replay.
The assigned tensors are recorded as objects: after replacing them (a new optimizer, a buffer that Module.to
replaces), jit fn again. A tensor read as a constant replaced between the two recording calls is refused as a
tensor that changes per call.
"""
import collections
import functools


from .. import dtype as dt
from ..realizer import realize
from ..runtime import get as get_runtime
from ..tensor import Tensor
from . import record
from .record import state
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
    the same shapes, dtypes, devices and requires_grad, while the tensors it writes keep theirs (the module's
    docstring says what is keyed, and what fn may do)."""

    def __init__(self, fn):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.calls, self.tapes, self.recorded = {}, {}, {}
        self.recorded_again = collections.deque(maxlen=16)  # why each Tape was dropped for a new recording, in words

    def __call__(self, *args):
        signature = tuple(state(a) if isinstance(a, Tensor) else ("value", a) for a in args)
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
            why = "a tensor it reads as a constant was given a new value or requires_grad" if tape.stale else \
                "a tensor it reads as a constant is no more (replaced by another)" if tape.gone else tape.changed()
            if why is None:
                return tape.replay(tensors)
            del self.tapes[signature]  # it would replay old values or wrong kernels: record again (this call and next)
            self.calls[signature] = 1
            self.recorded_again.append(why)
        calls = self.calls[signature] = self.calls.get(signature, 0) + 1
        if calls == 1:
            return self.fn(*args)
        result, tape = self._record(args, tensors)
        first = self.recorded.pop(signature, None)
        # (a first recording made stale, or whose tensors changed, is not compared: this one replaces it; one that
        # read a tensor since replaced is, and fails: the function reads another tensor on each call)
        if first is None or first.stale or first.changed() is not None:
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
