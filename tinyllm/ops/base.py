import inspect

import numpy as np

from ..graph import OPS


class Op:
    """A primitive. Subclasses define:
    infer(src, arg) -> (shape, dtype)   the rule that checks inputs, raising a clear error on bad ones
    forward(*arrays[, arg])             the NumPy meaning (the reference for every runtime)
    backward(dy, y) -> grads            one gradient node (or None) per source; `y` is the output node, so
                                        `y.src` are the inputs and `y.arg` the argument
    An op's kind is its base class below; `tinyllm.ops.Group` derives the groups from them.
    """
    takes_arg = False  # set at registration from forward's signature
    commutative = False  # op(a, b) == op(b, a) bit for bit (cse orders the sources of these)

    @staticmethod
    def backward(dy, y):
        raise NotImplementedError

    @staticmethod
    def evaluate(*arrays, arg=None):
        """forward(*arrays), given the node's arg whether or not this op takes one (set at registration)."""
        raise NotImplementedError


class Source(Op):
    """No inputs: where values come from."""


class Elementwise(Op):
    """Each output element from the input elements at the same index: what fusion puts in one kernel."""


class Unary(Elementwise):
    def infer(src, arg):
        (x,) = src
        return x.shape, x.dtype


class Binary(Elementwise):
    def infer(src, arg):
        x, z = src
        if x.shape != z.shape or x.dtype is not z.dtype:
            raise ValueError(f"elementwise op on {fmt(x.shape, z.shape)}, dtypes {x.dtype.name} and {z.dtype.name}: "
                             "the graph needs equal shapes and dtypes (the Tensor front end broadcasts and promotes)")
        return x.shape, x.dtype


class Ternary(Elementwise):
    pass


class Reduce(Op):
    """Reduces over a tuple of axes (`arg`), keeping them with size 1."""
    def infer(src, arg):
        (x,) = src
        if not all(0 <= a < len(x.shape) for a in arg) or len(set(arg)) != len(arg):
            raise ValueError(f"axes {arg} out of range for shape {x.shape}")
        return tuple(1 if i in arg else s for i, s in enumerate(x.shape)), x.dtype


class Movement(Op):
    """Rearranges elements without computing: a view (strides and offset) of its input."""


class Identity(Op):
    """y = x, a marker for autograd or a pass: a view of its input too."""


def register(cls):
    params = list(inspect.signature(cls.forward).parameters)
    cls.takes_arg = bool(params) and params[-1] == "arg"
    forward = cls.forward
    # NumPy gives a scalar, not an array, for 0-d inputs to a ufunc or np.take: every forward returns an array
    cls.forward = staticmethod(lambda *xs, **kw: np.asarray(forward(*xs, **kw)))
    if cls.takes_arg:
        cls.evaluate = staticmethod(lambda *xs, arg=None: np.asarray(forward(*xs, arg=arg)))
    else:
        cls.evaluate = staticmethod(lambda *xs, arg=None: np.asarray(forward(*xs)))
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
