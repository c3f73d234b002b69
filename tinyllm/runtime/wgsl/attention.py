"""FLASH_ATTN and FLASH_ATTN_BWD on the WGSL runtime: wgsl/flash_attention_forward.wgsl and _backward.wgsl, each after
wgsl/flash_attention.wgsl. Operands are made contiguous first (a strided copy on the GPU)."""
import math

from ... import dtype as dt
from . import render
from ..base import kernels

KERNELS = kernels("wgsl")


def _source(name, rt, threads, q, k, v, arg, **extra):
    """(source, workgroups): wgsl/flash_attention.wgsl (q, k, v, the sizes, qk) followed by wgsl/NAME.wgsl."""
    groups = render.groups_for(-(-threads // rt.workgroup))
    enable = "enable f16;\n" if q.dtype is dt.float16 else ""
    values = dict(T=render.STORAGE[q.dtype.name], BH=math.prod(q.shape[:-2]), TQ=q.shape[-2], TK=k.shape[-2],
                  D=q.shape[-1], DV=v.shape[-1], SCALE_BITS=render.f32_bits(arg[0]), CAUSAL=str(arg[1]).lower(),
                  WORKGROUP=rt.workgroup, ROW=groups[0] * rt.workgroup, **extra)
    return enable + render.template("flash_attention", **values) + "\n" + render.template(name, **values), groups


@KERNELS.register("FLASH_ATTN")
def _flash_forward(rt, node, ins):
    q, k, v = (rt.contiguous(x) for x in ins)
    out = rt.empty(node.shape, node.dtype)
    rows = math.prod(q.shape[:-1])
    if rows:
        source, groups = _source("flash_attention_forward", rt, rows, q, k, v, node.arg)
        rt.dispatch(source, [out, q, k, v], groups)
    return out


@KERNELS.register("FLASH_ATTN_BWD")
def _flash_backward(rt, node, ins):
    q, k, v, out, dout = (rt.contiguous(x) for x in ins)
    grads = rt.empty(node.shape, node.dtype)
    if not math.prod(node.shape):
        return grads
    delta = rt.empty(q.shape[:-1], dt.float32)
    bindings = [grads, q, k, v, out, dout, delta]
    read_only = [False, True, True, True, True, True, False]
    width = dout.shape[-1]  # v's width + 1 when dout holds dL, v's width when it is dO alone (dL = 0)
    minus_dl = "-f32(dout[r * DOUT_W + DV])" if width > v.shape[-1] else "0.0"
    for part, rows in ((0, math.prod(q.shape[:-1])), (1, math.prod(k.shape[:-1]))):
        source, groups = _source("flash_attention_backward", rt, rows, q, k, v, node.arg, PART=part, DOUT_W=width,
                                 MINUS_DL=minus_dl)
        rt.dispatch(source, bindings, groups, read_only)
    return grads
