"""The primitives. Each is one class: its shape/dtype rule, its forward meaning (NumPy, the reference every
runtime is tested against) and its backward rule written in graph ops, with the derivation in the docstring.

Composite ops (softmax, layer_norm, gelu, attention, ...) are built from these in the Tensor front end, so a
runtime implements only what is listed here. `rule_of(op)` finds a rule; a missing one is a clear error.
"""
from .base import Op, register, rule_of, PRIMITIVES  # noqa: F401
from . import source, elementwise, reduce, movement, matmul, index, attention, checkpoint  # noqa: F401  (each registers its ops)
