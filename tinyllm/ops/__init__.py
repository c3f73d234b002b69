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
from . import linalg  # noqa: F401  (tinyllm.linalg's decompositions: host ops)
from . import collective  # noqa: F401  (tinyllm.distributed's collectives)
from . import kernel, rowwise  # noqa: F401  (the ops that passes make)
from .collective import Collective


def _having(attr, value):
    return frozenset(name for name, cls in OPS.items() if getattr(cls, attr) == value)


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
    IDENTITY = _kind(Identity)
    COMMUTATIVE = _having("commutative", True)
    COPY = _having("copies", True)  # moves stored bits only: views, CONTIGUOUS, PAD, CAT
    QUANTIZED = _having("quantized", True)
    HOST = _having("host", True)  # forward by NumPy on the host on every runtime (tinyllm.linalg's decompositions)
    AUTOCAST_LOW = _having("autocast", "low")
    AUTOCAST_FLOAT32 = _having("autocast", "float32")
    # collectives that combine the ranks' values (REPLICATE and WAIT are marks for autograd and the schedule)
    COLLECTIVE = frozenset(name for name, cls in OPS.items() if issubclass(cls, Collective) and hasattr(cls, "into"))


def names(*ops):
    """frozenset(ops), each checked against the registry: a pass's or runtime's own list of op names, so that a
    misspelled name raises when its module is imported instead of never matching."""
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        raise NameError(f"unknown op name(s) {', '.join(map(repr, unknown))}: the primitives are registered in "
                        f"tinyllm/ops/ ({', '.join(sorted(OPS))})")
    return frozenset(ops)
