import inspect

import numpy as np

from ..graph import OPS


class Op:
    """A primitive. Subclasses define:
    infer(src, arg) -> (shape, dtype)   the rule that checks inputs, raising a clear error on bad ones
    forward(*arrays[, arg])             the NumPy meaning (the reference for every runtime)
    backward(dy, y) -> grads            one gradient node (or None) per source; `y` is the output node, so
                                        `y.src` are the inputs and `y.arg` the argument
    """
    takes_arg = False  # set at registration from forward's signature

    @staticmethod
    def backward(dy, y):
        raise NotImplementedError


def register(cls):
    params = list(inspect.signature(cls.forward).parameters)
    cls.takes_arg = bool(params) and params[-1] == "arg"
    forward = cls.forward
    # NumPy gives a scalar, not an array, for 0-d inputs to a ufunc or np.take: every forward returns an array
    cls.forward = staticmethod(lambda *xs, **kw: np.asarray(forward(*xs, **kw)))
    cls.name = cls.__name__
    OPS[cls.__name__] = cls
    PRIMITIVES.append(cls.__name__)
    return cls


PRIMITIVES = []


def rule_of(op):
    cls = OPS.get(op)
    if cls is None or cls.backward is Op.backward:
        raise NotImplementedError(f"no gradient rule for op {op}: add a `backward` to its class in tinyllm/ops/")
    return cls.backward


def fmt(*shapes):
    return " and ".join(str(tuple(s)) for s in shapes)
