"""The primitives. Each is one class: its shape/dtype rule, its forward meaning (NumPy, the reference every
runtime is tested against) and its backward rule written in graph ops, with the derivation in the docstring.

Composite ops (softmax, layer_norm, gelu, attention, ...) are built from these in the Tensor front end, so a
runtime implements only what is registered here, the ops that passes make (FUSED, ROW_*) included.
`rule_of(op)` finds a rule; a missing one is a clear error.
"""
from ..graph import OPS
from .base import (Op, register, rule_of, PRIMITIVES, Source, Elementwise, Unary, Binary, Ternary,  # noqa: F401
                   Reduce, Movement, Identity)
from . import source, elementwise, reduce, movement, matmul, index, sort, attention, checkpoint, qmatmul  # noqa: F401
from . import collective  # noqa: F401  (tinyllm.distributed's collectives)
from . import kernel, rowwise  # noqa: F401  (the ops that passes make)


def _kind(base):
    return frozenset(name for name, cls in OPS.items() if issubclass(cls, base))


class Group:
    """Op names by kind, derived from each op's base class (as tinygrad's GroupOp): a new op joins its groups by
    what it subclasses, so no list of names is kept by hand anywhere."""
    SOURCE = _kind(Source)
    UNARY = _kind(Unary)
    BINARY = _kind(Binary)
    TERNARY = _kind(Ternary)
    ELEMENTWISE = _kind(Elementwise)
    REDUCE = _kind(Reduce)
    MOVEMENT = _kind(Movement)
    VIEW = MOVEMENT | _kind(Identity)  # a view of its input: no copy on a CPU runtime
    COMMUTATIVE = frozenset(name for name, cls in OPS.items() if cls.commutative)
