"""The dtypes tinyllm knows, with torch's names, each tied to its NumPy dtype."""
import numpy as np


class DType:
    __slots__ = ("name", "np", "itemsize", "is_float")

    def __init__(self, name, np_dtype):
        self.name, self.np = name, np.dtype(np_dtype)
        self.itemsize, self.is_float = self.np.itemsize, self.np.kind == "f"

    def __repr__(self):
        return f"tinyllm.{self.name}"

    def __reduce__(self):  # dtypes are singletons, also across pickling
        return (from_name, (self.name,))


float16 = DType("float16", np.float16)  # storage for mixed precision (the WGSL runtime, where shader-f16 exists)
float32 = DType("float32", np.float32)
float64 = DType("float64", np.float64)
int64 = DType("int64", np.int64)
bool_ = DType("bool", np.bool_)
ALL = (float16, float32, float64, int64, bool_)
PROMOTION = (bool_, int64, float16, float32, float64)  # result_type takes the later of two
_BY_NP = {d.np: d for d in ALL}
_ALIASES = {"half": float16, "float": float32, "double": float64, "long": int64}


def from_name(name):
    return {d.name: d for d in ALL}[name]


def to_dtype(x):
    """Accepts a DType, a NumPy dtype, a Python type or torch-style name; raises a clear error otherwise."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and x in _ALIASES:
        return _ALIASES[x]
    if x is float:
        return float32
    if x is int:
        return int64
    if x is bool:
        return bool_
    try:
        npd = np.dtype(x)
    except TypeError:
        npd = None
    if npd is not None and npd in _BY_NP:
        return _BY_NP[npd]
    if npd is not None and npd.kind in "iu":
        return int64
    if npd is not None and npd.kind == "f":
        return float32 if npd.itemsize <= 4 else float64
    raise TypeError(f"dtype {x!r} is not supported: use one of {', '.join(d.name for d in ALL)}")


def result_type(a, b):
    """Type promotion for two tensors, as torch does it for the dtypes we have."""
    if a is b:
        return a
    return max(a, b, key=PROMOTION.index)
