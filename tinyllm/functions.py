"""torch's function forms of the Tensor methods: `tinyllm.exp(x)` is `x.exp()`, `tinyllm.add(x, y, alpha=2)` is
`x.add(y, alpha=2)`. They are made here, in one loop over the Tensor class, so every method a Tensor gains gets
its function form too; `tinyllm/__init__.py` exports them.

Not made: what torch has no function for (`expand`, `view`, `contiguous`, ...), in-place updates (`add_`, ...),
what reads or changes a tensor's state (`backward`, `item`, `to`, ...), and a name tinyllm already has (the dtypes
`float`, `bool`, ...; the factories `where`, `cat`, ...).
"""
import functools
import inspect

from .tensor import Tensor

NOT_FUNCTIONS = {"backward", "item", "numpy", "tolist", "realize", "to", "type_as", "copy_", "requires_grad_",
                 "size", "stride", "dim", "is_contiguous", "contiguous", "expand", "expand_as", "view", "detach_",
                 "repeat", "type", "unfold", "data_ptr", "storage_offset", "untyped_storage",
                 "element_size"}


def _as_input(x, args):
    """The first argument as a Tensor: a number takes the dtype and device of the first tensor among `args`."""
    complex_arg = next((a for a in args if isinstance(a, Tensor) and a.is_complex()), None)
    if complex_arg is not None and not (isinstance(x, Tensor) and x.is_complex()):
        return complex_arg._as_complex(x)  # tinyllm.mul(real, complex): the real one as complex, as torch promotes
    if isinstance(x, Tensor):
        return x
    like = next((a for a in args if isinstance(a, Tensor)), None)
    if like is None:
        raise TypeError(f"expected a Tensor as the first argument, got {type(x).__name__}: "
                        "make one with tinyllm.tensor(...)")
    return like._as(x)


def _function(name):
    method = getattr(Tensor, name)

    @functools.wraps(method)
    def fn(input, *args, **kwargs):
        return getattr(_as_input(input, args), name)(*args, **kwargs)
    fn.__doc__ = f"tinyllm.{name}(input, ...) is input.{name}(...)." + (f"\n\n{method.__doc__}" if method.__doc__ else "")
    return fn


def function_forms(taken):
    """{name: function} for every public Tensor method that is not in NOT_FUNCTIONS nor in `taken`."""
    forms = {}
    for name in dir(Tensor):  # its methods and its mixins'
        value = inspect.getattr_static(Tensor, name)
        if name.startswith("_") or name.endswith("_") or name in NOT_FUNCTIONS or name in taken or not callable(value) \
                or isinstance(value, (property, staticmethod, classmethod)):
            continue
        forms[name] = _function(name)
    return forms
