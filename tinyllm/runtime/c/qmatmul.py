"""QMATMUL on the C runtime: runtime_c/qmatmul.c through the prebuilt module (a GEMV streaming the quantized weight for
at most 4 rows of x, the sgemm dequantizing while it packs for more; None back for float64 x or without the module; with
int8 activations, runtime_c/qmatmul_dynamic.c). x is read in place when its rows are contiguous; the weight and scales
are the quantized storage as tinyllm/ops/qmatmul.py defines it, padded to whole groups where x's K is not a multiple of
the group (the kernel reads x's K columns and finds the padded row strides itself)."""
import numpy as np

from ...ops.qmatmul import activations
from ..base import kernels

KERNELS = kernels("c")
FUNCTIONS = {"int8": "tl_qmatmul_q8", "int4": "tl_qmatmul_q4"}  # weight-only; with int8 activations tl_qmatmul_dynamic


@KERNELS.register("QMATMUL")
def qmatmul(runtime, node, ins):
    x, qweight, scales = ins
    fmt, group = node.arg[:2]  # (K, where the arg has it, is x's)
    if runtime.lib is None or x.dtype != np.float32:
        return None
    M, K = x.shape
    N = qweight.shape[0]
    out = runtime.empty((M, N), np.dtype(np.float32))
    if not out.size:
        return out
    if K and x.strides[1] != 4 or x.strides[0] < 0:
        x = runtime.contiguous(x)
    qweight, scales = runtime.contiguous(qweight), runtime.contiguous(scales)
    ldx = x.strides[0] // 4 if M > 1 else K
    if activations(node.arg):
        runtime.call(runtime.lib.tl_qmatmul_dynamic, 8 if fmt == "int8" else 4, M, N, K, group, x, ldx, qweight,
                     scales, out, N)
    else:
        runtime.call(getattr(runtime.lib, FUNCTIONS[fmt]), M, N, K, group, x, ldx, qweight, scales, out, N)
    return out


