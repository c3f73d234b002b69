"""The lazy graph: immutable, hash-consed nodes and iterative walks over them.

A Node is (op, src, arg, shape, dtype). Building a node that already exists returns the existing one, so
equal subexpressions are shared and a node can key any cache. Shape and dtype come from the op's own rule in
`tinyllm.ops`, which raises a clear error for bad input when the node is built, long before anything runs.
"""
import functools
import gc
import math
import weakref

from . import dtype as dt
from .weak import WeakValues, forget as _forget

OPS = {}  # op name -> its definition class (filled by tinyllm.ops)


class Node:
    __slots__ = ("op", "src", "arg", "shape", "dtype", "buffer", "_strides", "__weakref__")
    _cache = WeakValues()

    def __new__(cls, op, src, arg, shape, dtype):
        # -0.0 == 0.0 in Python, but they are different constants (1/-0.0 is -inf): key floats by their sign too
        key = (op, src, (arg, math.copysign(1.0, arg)) if type(arg) is float else arg, shape, dtype)
        ref = _refs.get(key)  # (WeakValues.get and __setitem__ inlined: this runs for every node of every step)
        node = None if ref is None else ref()
        if node is None:
            node = object.__new__(cls)
            node.op, node.src, node.arg, node.shape, node.dtype = op, src, arg, shape, dtype
            node.buffer = None  # set when the node's value is realized and kept (see realizer.py)
            node._strides = None
            _refs[key] = _weakref(node, _partial(_forget, _refs, key))
        return node

    def __repr__(self):
        arg = "" if self.arg is None else f", {self.arg!r}"
        return f"<{self.op}{arg} {self.shape} {self.dtype.name}>"

    @property
    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    # Graph arithmetic, for gradient rules and passes. Shapes must already match: broadcasting is the
    # Tensor front end's job, so every node here is explicit about what it does.
    def _const(self, x):
        return x if isinstance(x, Node) else const(x, self.shape, self.dtype)

    def __add__(self, x): return build("ADD", self, self._const(x))
    def __radd__(self, x): return build("ADD", self._const(x), self)
    def __mul__(self, x): return build("MUL", self, self._const(x))
    def __rmul__(self, x): return build("MUL", self._const(x), self)
    def __neg__(self): return build("NEG", self)
    def __sub__(self, x): return self + (-self._const(x))
    def __rsub__(self, x): return self._const(x) + (-self)
    def __truediv__(self, x): return self * build("RECIP", self._const(x))
    def __rtruediv__(self, x): return self._const(x) * build("RECIP", self)
    def __lt__(self, x): return build("CMPLT", self, self._const(x))
    def __gt__(self, x): return build("CMPLT", self._const(x), self)
    def eq(self, x): return build("CMPEQ", self, self._const(x))
    def where(self, a, b): return build("WHERE", self, a, b)
    def exp(self): return build("EXP", self)
    def log(self): return build("LOG", self)
    def sqrt(self): return build("SQRT", self)
    def recip(self): return build("RECIP", self)
    def cast(self, dtype): return self if dtype is self.dtype else build("CAST", self, arg=dtype)
    def sum(self, axes): return build("SUM", self, arg=tuple(axes)) if axes else self
    def reshape(self, shape): return self if tuple(shape) == self.shape else build("RESHAPE", self, arg=tuple(shape))
    def expand(self, shape): return self if tuple(shape) == self.shape else build("EXPAND", self, arg=tuple(shape))
    def matmul(self, x): return build("MATMUL", self, x)

    def permute(self, order):
        order = tuple(order)
        return self if order == tuple(range(len(order))) else build("PERMUTE", self, arg=order)

    def transpose_last(self):
        n = len(self.shape)
        return self.permute(tuple(range(n - 2)) + (n - 1, n - 2))


_refs = Node._cache._refs
_weakref, _partial = weakref.ref, functools.partial


def bulk(fn):
    """Decorator for the library's bursts of graph (a backward pass, an optimizer step, a realize): Python's cyclic
    collector waits until fn returns. The thousands of nodes, keys and tensors such a burst makes die by reference
    counting when it ends; collections in the middle would only walk them, and by promoting them bring on full
    collections that walk the whole heap (several ms per training step). Nothing goes uncollected: the
    collector's counts keep growing meanwhile, so it runs on the next allocation after fn if it is due."""
    @functools.wraps(fn)
    def paused(*args, **kwargs):
        if not gc.isenabled():  # (the caller's choice, or an enclosing burst)
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.enable()
    return paused


def build(op, *src, arg=None):
    """Make (or find) the node `op(src; arg)`, checking shapes and dtypes with the op's own rule."""
    definition = OPS.get(op)
    if definition is None:
        raise NotImplementedError(f"unknown op {op!r}: known ops are {', '.join(sorted(OPS))}")
    try:
        shape, dtype = definition.infer(src, arg)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{op}: {e}") from None
    return Node(op, tuple(src), arg, tuple(shape), dtype)


def const(value, shape=(), dtype=dt.float32):
    """A constant of any shape; it costs no memory until an op reads it."""
    value = bool(value) if dtype is dt.bool_ else int(value) if dtype is dt.int64 else float(value)
    if dtype is dt.int64 and not -2**63 <= value < 2**63:
        raise OverflowError(f"constant {value} does not fit in int64")
    return Node("CONST", (), value, tuple(shape), dtype)


def toposort(roots, stop=None, sources=None):
    """Nodes reachable from `roots`, each after all of its sources. Iterative, so graphs of any depth work.
    A node for which `stop(node)` is true is listed but not walked into; `sources(node)` gives the order in
    which a node's sources are visited (and so listed), node.src where it is None."""
    order, done = [], set()
    for root in roots:
        if root in done:
            continue
        stack = [(root, False)]
        push, pop = stack.append, stack.pop
        while stack:
            node, expanded = pop()
            if node in done:
                continue
            if expanded or (stop is not None and stop(node)):
                done.add(node)
                order.append(node)
                continue
            push((node, True))
            for s in reversed(node.src if sources is None else sources(node)):
                if s not in done:
                    push((s, False))
    return order


def consumers(order):
    """For each node of `order`, the distinct nodes of `order` that read it, in the order of `order`."""
    users = {n: [] for n in order}
    for n in order:
        for s in dict.fromkeys(n.src):
            if s in users:
                users[s].append(n)
    return users


def substitute(roots, mapping):
    """The graph of `roots` with each node in `mapping` replaced by its value (iteratively rebuilt)."""
    new = {}
    for n in toposort(roots, stop=lambda n: n in mapping):
        if n in mapping:
            new[n] = mapping[n]
        else:
            src = tuple(new[s] for s in n.src)
            new[n] = n if src == n.src else Node(n.op, src, n.arg, n.shape, n.dtype)
    return [new[r] for r in roots]
