"""The dtypes tinyllm knows, with torch's names, each tied to the NumPy dtype that stores it.

bfloat16 has no NumPy dtype: it is stored as uint16, the high half of a float32's bits, and computed in float32
(`encode` / `decode`). Rounding float32 to bfloat16 is round-to-nearest-even on the dropped 16 bits: adding
0x7FFF plus the lowest kept bit to the float32's bits carries into the kept half exactly when the dropped half is
above one half, or equal to it with the kept half odd; NaNs keep a quiet-NaN payload so they never round to inf.
"""
import numpy as np


class DType:
    __slots__ = ("name", "np", "itemsize", "is_float", "compute", "is_low", "is_complex")

    def __init__(self, name, np_dtype, compute=None):
        self.name, self.np = name, np.dtype(np_dtype)  # np: how a buffer of this dtype is stored
        self.compute = self.np if compute is None else np.dtype(compute)  # the NumPy dtype its values compute in
        self.itemsize, self.is_float = self.np.itemsize, self.compute.kind == "f"
        # complex64 / complex128: never a node's dtype; a complex Tensor is stored as a real one with a trailing
        # axis of 2 (tinyllm/complex.py), and only the Tensor reports the complex dtype
        self.is_complex = self.np.kind == "c"
        # a 16-bit float: computed in float32 and rounded once per op, as torch does on CPUs (an attribute, not a
        # property: every kernel a runtime runs asks it)
        self.is_low = self.is_float and self.itemsize == 2

    def __repr__(self):
        return f"tinyllm.{self.name}"

    def __reduce__(self):  # dtypes are singletons, also across pickling
        return (from_name, (self.name,))


float16 = DType("float16", np.float16)
bfloat16 = DType("bfloat16", np.uint16, compute=np.float32)
float32 = DType("float32", np.float32)
float64 = DType("float64", np.float64)
uint8 = DType("uint8", np.uint8)  # storage for quantized weights (two int4 per byte)
int8 = DType("int8", np.int8)
int64 = DType("int64", np.int64)
bool_ = DType("bool", np.bool_)
ALL = (float16, bfloat16, float32, float64, uint8, int8, int64, bool_)
complex64 = DType("complex64", np.complex64)  # (re, im) float32 pairs
complex128 = DType("complex128", np.complex128)  # (re, im) float64 pairs
COMPLEX = (complex64, complex128)
COMPLEX_OF = {float32: complex64, float64: complex128}  # the complex dtype of a real one, and back
REAL_OF = {complex64: float32, complex128: float64}
PROMOTION = (bool_, uint8, int8, int64, float16, bfloat16, float32, float64)  # result_type takes the later of two
_BY_NP = {d.np: d for d in ALL if d is not bfloat16}
_ALIASES = {"half": float16, "float": float32, "double": float64, "long": int64, "bf16": bfloat16,
            "cfloat": complex64, "cdouble": complex128}


def from_name(name):
    return {d.name: d for d in ALL + COMPLEX}[name]


def to_dtype(x):
    """Accepts a DType, a NumPy dtype, a Python type or torch-style name; raises a clear error otherwise."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str):
        if x in _ALIASES:
            return _ALIASES[x]
        if x.removeprefix("torch.") in {d.name for d in ALL + COMPLEX}:
            return from_name(x.removeprefix("torch."))
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
    if npd is not None and npd.kind == "c" and not isinstance(x, str):  # (np.complex64, not the string "complex")
        return complex64 if npd.itemsize <= 8 else complex128
    raise TypeError(f"dtype {x!r} is not supported: use one of {', '.join(d.name for d in ALL)}")


def result_type(a, b):
    """Type promotion for two tensors, as torch does it for the dtypes we have: float16 with bfloat16 gives
    float32, int8 with uint8 gives int64 (torch's int16, which tinyllm does not have)."""
    if a is b:
        return a
    if {a, b} == {float16, bfloat16}:
        return float32
    if {a, b} == {int8, uint8}:
        return int64
    return max(a, b, key=PROMOTION.index)


def encode(values, dtype):
    """`values` (any NumPy array or number) as the storage of `dtype`: a bfloat16 rounds to nearest even."""
    if dtype is not bfloat16:
        return np.asarray(values, dtype=dtype.np)
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))) >> 16).astype(np.uint16)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((bits >> 16) | 0x40).astype(np.uint16), rounded) if nan.any() else rounded


def as_storage(array, dtype):
    """A runtime's view of host data for a buffer of `dtype`: uint16 data for a bfloat16 is taken as its storage
    (what a buffer hands back), anything else as values to encode."""
    if dtype is bfloat16 and np.asarray(array).dtype == np.uint16:
        return np.asarray(array)
    return encode(array, dtype)


def decode(storage, dtype):
    """The values a buffer of `dtype` holds, as a NumPy array of dtype.compute (bfloat16: exact in float32)."""
    if dtype is not bfloat16:
        return storage
    return (np.asarray(storage, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


class finfo:
    """torch.finfo for the float dtypes: bits, eps, max, min, tiny (smallest normal) and resolution."""
    _BF16 = dict(bits=16, eps=2.0 ** -7, max=float.fromhex("0x1.fep127"), tiny=2.0 ** -126, nmant=7)

    def __init__(self, dtype=None):
        dtype = float32 if dtype is None else to_dtype(dtype)
        if not dtype.is_float:
            raise TypeError(f"finfo: {dtype.name} is not a floating-point dtype (use a float dtype)")
        if dtype is bfloat16:
            f = self._BF16
        else:
            i = np.finfo(dtype.np)
            f = dict(bits=i.bits, eps=float(i.eps), max=float(i.max), tiny=float(i.tiny), nmant=int(i.nmant))
        self.dtype = dtype.name  # torch's finfo.dtype is the name, 'float32'
        self.bits, self.eps, self.max, self.tiny, self.nmant = f["bits"], f["eps"], f["max"], f["tiny"], f["nmant"]
        self.min, self.smallest_normal = -self.max, self.tiny
        self.resolution = 10.0 ** -int(np.floor(-np.log10(self.eps)))  # noqa: E501 (as torch: 10^-digits)

    def __repr__(self):
        return (f"finfo(resolution={self.resolution}, min={self.min}, max={self.max}, eps={self.eps}, "
                f"smallest_normal={self.smallest_normal}, tiny={self.tiny}, dtype={self.dtype})")


class iinfo:
    """torch.iinfo for the integer dtypes: bits, min, max and dtype (its name)."""

    def __init__(self, dtype):
        dtype = to_dtype(dtype)
        if dtype.is_float or dtype is bool_:
            raise TypeError(f"iinfo: {dtype.name} is not an integer dtype (use finfo for a float dtype)")
        i = np.iinfo(dtype.np)
        self.bits, self.min, self.max, self.dtype = int(i.bits), int(i.min), int(i.max), dtype.name

    def __repr__(self):
        return f"iinfo(min={self.min}, max={self.max}, dtype={self.dtype})"
