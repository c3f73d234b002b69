import functools
import inspect

import numpy as np

from ..dtype import decode, encode, float32
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
    # Under autocast (rewrite/autocast.py, torch's op lists): "low" computes in the low dtype, "float32" brings low
    # inputs back to float32, "promotes" promotes its float inputs as torch does, "follows" keeps its input's dtype
    autocast = "follows"
    copies = False  # its output is its inputs' elements moved, no arithmetic: it runs on any dtype's stored bits
    host = False  # its forward runs on the host (NumPy) on every runtime, by design: no runtime has a kernel for it
    quantized = False  # it reads int8 / packed int4 weights with their scales (tinyllm/quantization.py)

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
    autocast = "promotes"


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
    autocast = "float32"
    def infer(src, arg):
        (x,) = src
        if not all(0 <= a < len(x.shape) for a in arg) or len(set(arg)) != len(arg):
            raise ValueError(f"axes {arg} out of range for shape {x.shape}")
        return tuple(1 if i in arg else s for i, s in enumerate(x.shape)), x.dtype


class Movement(Op):
    """Rearranges elements without computing: a view (strides and offset) of its input."""
    copies = True


class Identity(Op):
    """y = x, a marker for autograd or a pass: a view of its input too."""
    copies = True


def compute(node, ins):
    """The value of `node` from its inputs' values `ins`: its op's NumPy forward. With 16-bit floats in or out, as
    torch runs it on a CPU: inputs widened to float32, the float32 forward, the result rounded once to the output
    dtype (to nearest even); views move the stored bits. The NumPy runtime and the constant folder both use it."""
    cls = OPS[node.op]
    if not (node.dtype.is_low or any(s.dtype.is_low for s in node.src)):
        return cls.evaluate(*ins, arg=node.arg)
    if issubclass(cls, (Movement, Identity)) and all(s.dtype is node.dtype for s in node.src):
        return cls.evaluate(*ins, arg=node.arg)
    ins = [decode(x, s.dtype).astype(np.float32) if s.dtype.is_low else x for x, s in zip(ins, node.src)]
    arg = float32 if node.op == "CAST" and node.dtype.is_low else node.arg
    out = cls.evaluate(*ins, arg=arg)
    return encode(out, node.dtype) if node.dtype.is_low else out


def register(cls):
    params = list(inspect.signature(cls.forward).parameters)
    cls.takes_arg = bool(params) and params[-1] == "arg"
    forward = cls.forward
    # NumPy gives a scalar, not an array, for 0-d inputs to a ufunc or np.take: every forward returns an array.
    # (wraps keeps forward's signature readable: docs/make_ops.py names the inputs by it)
    cls.forward = staticmethod(functools.wraps(forward)(lambda *xs, **kw: np.asarray(forward(*xs, **kw))))
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
