"""Runtimes by name: each package here is one (numpy/, c/, wgsl/), named by its folder, its runtime.py defining
the Runtime of that name (runtime/base.py: the contract). `TINYLLM_RUNTIME` picks the default; `device=` / `.to()`
pick one per tensor."""
import importlib
import importlib.util
import os
import pkgutil

from .memory import max_memory_allocated, memory_allocated, reset_peak_memory_stats  # noqa: F401

_NAMES = sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg)
_live = {}


def _make(name):
    """The runtime of package `name`: the class in its runtime.py whose `name` is the package's."""
    module = importlib.import_module(f"{__name__}.{name}.runtime")
    from .base import Runtime
    found = [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, Runtime) and c.name == name]
    if len(found) != 1:
        raise ImportError(f"tinyllm/runtime/{name}/runtime.py must define one Runtime subclass with name = "
                          f"{name!r}, found {len(found)}")
    return found[0]()


def available():
    return list(_NAMES)


def default_name():
    """$TINYLLM_RUNTIME, else the CPU's runtime (cpu_name())."""
    return os.environ.get("TINYLLM_RUNTIME") or cpu_name()


def cpu_name():
    """What device="cpu" means: the C runtime where its prebuilt module was built, else NumPy."""
    if "_default" not in _live:
        _live["_default"] = "c" if importlib.util.find_spec("tinyllm._kernels") is not None else "numpy"
    return _live["_default"]


def get(name=None):
    """The runtime called `name` (default: default_name()), made once and kept."""
    if name is None:
        name = default_name()
    if not isinstance(name, str):
        name = getattr(name, "name", str(name))
    name = name.split(":")[0]
    if name == "cpu":  # torch's device string: the fastest CPU runtime here; "numpy" names the reference itself
        name = cpu_name()
    if name not in _NAMES:
        raise ValueError(f"unknown runtime {name!r}: choose one of {', '.join(available())} or 'cpu' (the fastest "
                         "CPU one); 'wgsl' is the GPU's, through WebGPU (set TINYLLM_RUNTIME or pass device=...)")
    if name not in _live:
        _live[name] = _make(name)
    return _live[name]


def empty_cache():
    """Give the runtimes' pooled free buffers back to the system (torch.cuda.empty_cache)."""
    for runtime in _live.values():
        if hasattr(runtime, "empty_cache"):
            runtime.empty_cache()
