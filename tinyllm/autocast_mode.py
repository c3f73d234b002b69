"""`tinyllm.autocast`: mixed precision as a graph rewrite. Inside the block the front end only marks the inputs of
the ops torch's autocast runs in lower precision with AUTOCAST nodes; every tensor keeps its float32 dtype, and
the autocast pass (tinyllm/rewrite/autocast.py, docs/rewrites.md) turns the marks into casts.
"""
import functools

from . import dtype as dt

_stack = [None]  # the autocast dtype in force (None: off), innermost last


def current():
    """The dtype the front end marks lower-precision ops with, or None outside autocast."""
    return _stack[-1]


class autocast:
    """torch.autocast's interface: `autocast(device_type=None, dtype=bfloat16, enabled=True, cache_enabled=None)`,
    a context manager or a decorator. `device_type` is accepted for torch's sake: the rewrite works on every
    runtime. enabled=False turns autocast off inside an autocast region."""
    def __init__(self, device_type=None, dtype=dt.bfloat16, enabled=True, cache_enabled=None):
        if device_type is not None and not isinstance(device_type, str):
            raise TypeError(f"autocast: device_type must be a string such as 'cpu', got {device_type!r}; pass the "
                            "dtype by name: autocast(dtype=tinyllm.bfloat16)")
        dtype = dt.to_dtype(dtype)
        if dtype not in (dt.float16, dt.bfloat16):
            raise ValueError(f"autocast: dtype must be tinyllm.bfloat16 or tinyllm.float16, got {dtype.name}")
        self.dtype, self.enabled = dtype, bool(enabled)

    def __enter__(self):
        _stack.append(self.dtype if self.enabled else None)
        return self

    def __exit__(self, *exc):
        _stack.pop()
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with autocast(dtype=self.dtype, enabled=self.enabled):
                return fn(*args, **kwargs)
        return wrapped


def is_autocast_enabled(device_type=None):
    return current() is not None


def get_autocast_dtype(device_type=None):
    return current() or dt.bfloat16
