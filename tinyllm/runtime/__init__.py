"""Runtimes by name. `TINYLLM_RUNTIME` picks the default; `device=` / `.to()` pick one per tensor."""
import importlib.util
import os

from .memory import max_memory_allocated, memory_allocated, reset_peak_memory_stats  # noqa: F401

_FACTORIES = {}
_live = {}


def _numpy():
    from .numpy.runtime import NumpyRuntime
    return NumpyRuntime()


def _c():
    from .c.runtime import CRuntime
    return CRuntime()


def _wgsl():
    from .wgsl.runtime import WGSLRuntime
    return WGSLRuntime()


_FACTORIES["numpy"] = _numpy
_FACTORIES["c"] = _c
_FACTORIES["wgsl"] = _wgsl
ALIASES = {"cpu": "numpy"}


def available():
    return sorted(_FACTORIES)


def default_name():
    """$TINYLLM_RUNTIME, else the C runtime where its prebuilt module was built, else NumPy."""
    name = os.environ.get("TINYLLM_RUNTIME")
    if name:
        return name
    if "_default" not in _live:
        _live["_default"] = "c" if importlib.util.find_spec("tinyllm._kernels") is not None else "numpy"
    return _live["_default"]


def get(name=None):
    """The runtime called `name` (default: default_name()), made once and kept."""
    if name is None:
        name = default_name()
    if not isinstance(name, str):
        name = getattr(name, "name", str(name))
    name = ALIASES.get(name.split(":")[0], name.split(":")[0])
    if name not in _FACTORIES:
        raise ValueError(f"unknown runtime {name!r}: choose one of {', '.join(available())} "
                         "(set TINYLLM_RUNTIME or pass device=...)")
    if name not in _live:
        _live[name] = _FACTORIES[name]()
    return _live[name]


def empty_cache():
    """Give the runtimes' pooled free buffers back to the system (torch.cuda.empty_cache)."""
    for runtime in _live.values():
        if hasattr(runtime, "empty_cache"):
            runtime.empty_cache()
