"""Matrix product with a quantized weight: y = x · dequant(W)ᵀ, W read from int8 or packed int4 storage.

The storage formats (llama.cpp's Q8_0 and Q4_0 layouts, symmetric, one float16 scale `d` per group of g consecutive
input features of one output row) are defined here, beside the op that reads them:

    int8   qweight int8 (N, K), scales float16 (N, K/g)
           d = f16(max|w| / 127);  q = clip(rint(w / d), -127, 127);  w' = q·d
    int4   qweight uint8 (N, K/2), scales float16 (N, K/g)
           m = the group's element of largest |w|, sign kept;  d = f16(m / -8);  q = clip(rint(w / d), -8, 7)
           stored as q + 8 in [0, 15], two per byte: in each group, byte j (0 <= j < g/2) holds element j in its
           low nibble and element j + g/2 in its high nibble;  w' = (nibble - 8)·d

A group of zeros has d = 0 and stores q = 0. The division w / d is in float32 (d widened from float16), so
quantizing is the same on every machine. int4 divides by m/-8 rather than by max|w|/7: the extreme element then
lands on -8 exactly, and the side of zero it is on gets the one more level the signed nibble has.

K need not be a multiple of g: the weight is then zero-padded on the right to Kp = ⌈K/g⌉·g columns, a whole number
of groups, and the shapes above hold with Kp for K (qweight int8 (N, Kp) or uint8 (N, Kp/2), scales (N, Kp/g)).
The zeros set no group's extreme, so the last group's scale is that of its K - (Kp - g) real columns, and the
padding stores q = 0 (int4: nibble 8). The ops read the first K columns only: their arg (fmt, g, K) names K, and
(fmt, g) means K = Kp. With K a multiple of g nothing is padded: the storage is what it always was.

Dynamic quantization (arg (fmt, g, K, "int8"), torch's quantize_dynamic): QMATMUL also quantizes each row of x at
run time, in the weight's groups, with a float32 scale per row and group (quantize_activations):
    s = max|x_G| / 127;  qx = clip(rint(x / s), -127, 127);  y = Σ_G s·d · Σ_{t∈G} qx·q
the inner sums exact integers, which CPUs compute with byte dot-product instructions (runtime_c/qmatmul_dynamic.c).
A group of x holding inf or NaN has s = NaN (its outputs are NaN); one of zeros has s = 0 and qx = 0.
"""
import numpy as np

from .. import dtype as dt
from ..graph import build
from ..utils.checks import whole_number
from .base import Op, register

FORMATS = ("int8", "int4")
ACTIVATIONS = (None, "int8")  # QMATMUL's x as it is (weight-only), or quantized per group at run time (dynamic)


def check_format(fmt, group_size, what="quantize"):
    """Raise a clear error, naming `what`, unless (fmt, group_size) is a format. Any number of input features
    quantizes: a last partial group is padded (module docstring)."""
    if fmt not in FORMATS:
        raise ValueError(f"{what}: unknown format {fmt!r}: use 'int8' or 'int4'")
    whole_number(what, "group_size", group_size, 1, ": pass e.g. group_size=32 (llama.cpp's) or 128")
    if fmt == "int4" and group_size % 2:
        raise ValueError(f"{what}: int4 packs two values per byte within a group, so group_size must be even, "
                         f"got {group_size}")


def padded_features(k, group_size):
    """Kp: k input features rounded up to whole groups, the columns the storage holds (module docstring)."""
    return -(-k // group_size) * group_size


def storage_shapes(fmt, n, k, group_size):
    """(qweight shape, its dtype, scales shape) of an (n, k) weight, padded to whole groups."""
    kp = padded_features(k, group_size)
    return ((n, kp) if fmt == "int8" else (n, kp // 2)), (dt.int8 if fmt == "int8" else dt.uint8), \
        (n, kp // group_size)


def quantize(weight, fmt, group_size=32):
    """(qweight, scales) of a float (N, K) weight array, as the module docstring defines them (NumPy arrays)."""
    w = np.asarray(weight)
    if w.ndim != 2 or not np.issubdtype(w.dtype, np.floating):
        raise ValueError(f"quantize: needs a 2-D float weight (out_features, in_features), got {w.dtype} "
                         f"{w.shape}")
    n, k = w.shape
    check_format(fmt, group_size)
    kp = padded_features(k, group_size)
    groups = np.pad(w.astype(np.float32), ((0, 0), (0, kp - k))).reshape(n, kp // group_size, group_size)
    if not np.isfinite(groups).all():
        raise ValueError("quantize: the weight holds inf or NaN, which no scale represents")
    if fmt == "int8":
        with np.errstate(over="ignore"):
            d = (np.abs(groups).max(-1) / np.float32(127)).astype(np.float16)
        lo, hi = -127, 127
    else:
        at = np.abs(groups).argmax(-1)[..., None]
        with np.errstate(over="ignore"):
            d = (np.take_along_axis(groups, at, -1)[..., 0] / np.float32(-8)).astype(np.float16)
        lo, hi = -8, 7
    if np.isinf(d).any():
        raise ValueError(f"quantize: a group's scale overflows float16 (|w| above about {65504 * -lo:.3g}): "
                         "scale the weight down first")
    d32 = d.astype(np.float32)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(d32 == 0, 0, np.clip(np.rint(groups / d32), lo, hi)).astype(np.int8)
    if fmt == "int8":
        return q.reshape(n, kp), d
    nib = (q + 8).astype(np.uint8)
    half = group_size // 2
    return (nib[..., :half] | (nib[..., half:] << 4)).reshape(n, kp // 2), d


def unpack_int4(qweight, group_size):
    """The signed int4 values (int8, (N, K)) of a packed (N, K/2) uint8 array."""
    n, kb = qweight.shape
    b = np.asarray(qweight, np.uint8).reshape(n, kb * 2 // group_size, group_size // 2)
    q = np.concatenate([b & 0x0F, b >> 4], axis=-1).astype(np.int8) - np.int8(8)
    return q.reshape(n, kb * 2)


def dequantize(qweight, scales, fmt, group_size=32, in_features=None):
    """The float32 (N, K) weight w' = q·d that (qweight, scales) stand for: its first `in_features` columns
    (default: all the storage holds, Kp)."""
    q = np.asarray(qweight, np.int8) if fmt == "int8" else unpack_int4(qweight, group_size)
    n, kp = q.shape
    d = np.asarray(scales).astype(np.float32)[..., None]
    w = (q.reshape(n, kp // group_size, group_size).astype(np.float32) * d).reshape(n, kp)
    return w if in_features is None or in_features == kp else w[:, :in_features].copy()


def activations(arg):
    """None for a weight-only QMATMUL, "int8" for a dynamic one (its arg's fourth element)."""
    return arg[3] if len(arg) == 4 else None


def quantize_activations(x, group_size, k=None):
    """(qx int8 (M, Kp), s float32 (M, Kp/g)) of x (M, K) float, as the module docstring defines them: each row in
    groups of group_size columns, zero past K."""
    x = np.asarray(x, np.float32)
    m, k = x.shape
    kp = padded_features(k, group_size)
    groups = np.pad(x, ((0, 0), (0, kp - k))).reshape(m, kp // group_size, group_size)
    finite = np.isfinite(groups).all(-1)
    s = np.where(finite, np.abs(np.where(np.isfinite(groups), groups, 0)).max(-1) / np.float32(127),
                 np.float32(np.nan)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where((finite & (s > 0))[..., None], np.clip(np.rint(groups / s[..., None]), -127, 127), 0)
    return q.astype(np.int8).reshape(m, kp), s


def dynamic_matmul(x, qweight, scales, fmt, group_size):
    """y (M, N) float32 = Σ_G s·d · (qx_G · q_G), the dynamic QMATMUL's reference: the group sums exact (float64 holds
    them: |Σ| <= 127² · g), then scaled and added group by group in float32."""
    qx, s = quantize_activations(x, group_size)
    q = np.asarray(qweight, np.int8) if fmt == "int8" else unpack_int4(qweight, group_size)
    d = np.asarray(scales).astype(np.float32)
    y = np.zeros((qx.shape[0], q.shape[0]), np.float32)
    for G in range(q.shape[1] // group_size):
        cols = slice(G * group_size, (G + 1) * group_size)
        dots = (qx[:, cols].astype(np.float64) @ q[:, cols].astype(np.float64).T).astype(np.float32)
        y += dots * (s[:, G, None] * d[None, :, G])
    return y


def _check_weight(src, arg, op):
    """(fmt, group_size, N, K) from a node's weight sources and arg, raising a clear error on a mismatch."""
    qweight, scales = src
    if not (isinstance(arg, tuple) and len(arg) in (2, 3, 4)):
        raise TypeError(f"arg must be (fmt, group_size), (fmt, group_size, in_features) or (fmt, group_size, "
                        f"in_features, activations), got {arg!r}")
    if activations(arg) not in ACTIVATIONS:
        raise ValueError(f"{op}: activations {arg[3]!r} is not one of {ACTIVATIONS}: None keeps x as it is, 'int8' "
                         "quantizes it per group at run time (dynamic quantization)")
    fmt, g = arg[:2]
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: use 'int8' or 'int4'")
    if len(qweight.shape) != 2 or len(scales.shape) != 2:
        raise ValueError(f"qweight {qweight.shape} and scales {scales.shape} must be 2-D")
    n = qweight.shape[0]
    kp = qweight.shape[1] * (1 if fmt == "int8" else 2)
    check_format(fmt, g, op)
    k = arg[2] if len(arg) >= 3 else kp
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0 or padded_features(k, g) != kp:
        raise ValueError(f"{op}: in_features {k!r} does not fit a storage of {kp} columns: with group {g} it must "
                         f"be in ({kp - g}, {kp}] (the storage holds whole groups)")
    qshape, qdtype, sshape = storage_shapes(fmt, n, k, g)
    if qweight.dtype is not qdtype or scales.dtype is not dt.float16 or tuple(scales.shape) != sshape:
        raise TypeError(f"{fmt} with group {g} stores qweight as {qdtype.name} {qshape} and scales as float16 "
                        f"{sshape}, got {qweight.dtype.name} {qweight.shape} and {scales.dtype.name} {scales.shape} "
                        "(make them with tinyllm.quantization.quantize)")
    return fmt, g, n, k


@register
class QMATMUL(Op):
    """y = x · dequant(W)ᵀ for x (M, K) float32, W (N, K) quantized as `arg` = (fmt, group_size) says (module
    docstring); y (M, N) float32, accumulated in float32. `arg` = (fmt, group_size, K) for a K that is not a
    multiple of group_size: the storage is padded to whole groups and only its first K columns are read;
    (fmt, group_size, K, "int8") quantizes x too, per row and group at run time (dynamic quantization). ⇒  dx = dy ·
    dequant(W), a DEQUANT node and a MATMUL (dynamic: the same, x's rounding passed straight through). The weight gets
    no gradient: quantized weights are frozen (what a LoRA adapter on a quantized base needs). float64 x is accepted too
    (computed in float64), only so gradcheck can difference it."""
    quantized = True
    def infer(src, arg):
        x = src[0]
        if len(src) != 3:
            raise ValueError(f"needs (x, qweight, scales), got {len(src)} inputs")
        fmt, g, n, k = _check_weight(src[1:], arg, "QMATMUL")
        if len(x.shape) != 2 or x.shape[1] != k:
            raise ValueError(f"x of shape {x.shape} does not multiply a quantized weight of {k} input features: "
                             f"need (M, {k}) (the front end, QuantizedLinear, flattens leading axes)")
        if x.dtype not in (dt.float32, dt.float64):
            raise TypeError(f"x must be float32, got {x.dtype.name}: cast it with .float()")
        return (x.shape[0], n), x.dtype
    def forward(x, qweight, scales, arg):
        if activations(arg):
            return dynamic_matmul(x, qweight, scales, *arg[:2]).astype(x.dtype)
        w = dequantize(qweight, scales, *arg)
        return np.matmul(x, w.T.astype(x.dtype, copy=False))
    def backward(dy, y):
        x, qweight, scales = y.src
        w = build("DEQUANT", qweight, scales, arg=y.arg[:3]).cast(dy.dtype)
        return (dy.matmul(w), None, None)


@register
class DEQUANT(Op):
    """W' = dequant(qweight, scales) as float32 (N, K), `arg` = (fmt, group_size) or (fmt, group_size, K) as for
    QMATMUL (module docstring: the first K columns of a padded storage). What QMATMUL's gradient reads; no
    gradient of its own (the quantized storage is frozen)."""
    quantized = True
    def infer(src, arg):
        if len(src) != 2:
            raise ValueError(f"needs (qweight, scales), got {len(src)} inputs")
        fmt, g, n, k = _check_weight(src, arg, "DEQUANT")
        return (n, k), dt.float32
    def forward(qweight, scales, arg): return dequantize(qweight, scales, *arg[:3])
    def backward(dy, y): return (None, None)
