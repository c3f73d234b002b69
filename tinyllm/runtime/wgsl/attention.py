"""FLASH_ATTN and FLASH_ATTN_BWD on the WGSL runtime: wgsl/flash_attention_forward.wgsl and _backward.wgsl, each after
wgsl/flash_attention.wgsl. q, k and v are read in place through their views (grouped-query attention's keys and
values broadcast over a group with stride 0, a head split of a projection): their batch axes as up to three runs
of one stride each, their rows strided, their columns contiguous; anything else is copied first (a strided copy on
the GPU), as are the backward's other operands."""
import math

from ... import dtype as dt
from . import render
from ..base import kernels
from ..cstyle import merge_dims

KERNELS = kernels("wgsl")


def _in_place(rt, q, k, v):
    """(q, k, v, values for the template): each read through its view where its columns are contiguous and the
    batch axes of all three merge into at most three runs; otherwise copied to row-major first."""
    qkv = [x if (x.shape[-1] == 1 or x.elem_strides[-1] == 1) and min(x.elem_strides, default=0) >= 0
           else rt.contiguous(x) for x in (q, k, v)]
    batch = q.shape[:-2]
    runs = merge_dims(batch, [x.elem_strides[:len(batch)] for x in qkv], ())
    if len(runs) > 3:
        qkv = [rt.contiguous(x) for x in qkv]
        runs = merge_dims(batch, [x.elem_strides[:len(batch)] for x in qkv], ())
    runs = [[1, [0, 0, 0], False]] * (3 - len(runs)) + runs
    values = dict(B1=runs[1][0], B2=runs[2][0])
    for i, (name, x) in enumerate(zip("QKV", qkv)):
        values.update({f"{name}_STRIDES": ", ".join(f"{r[1][i]}u" for r in runs), f"{name}_ROW": x.elem_strides[-2],
                       f"{name}_OFFSET": x.offset})
    return (*qkv, values)


def _source(name, rt, threads, q, k, v, arg, views, **extra):
    """(source, workgroups): wgsl/flash_attention.wgsl (q, k, v, the sizes, qk) followed by wgsl/NAME.wgsl."""
    groups = render.groups_for(-(-threads // rt.workgroup))
    enable = "enable f16;\n" if q.dtype is dt.float16 else ""
    values = dict(T=render.STORAGE[q.dtype.name], BH=math.prod(q.shape[:-2]), TQ=q.shape[-2], TK=k.shape[-2],
                  D=q.shape[-1], DV=v.shape[-1], SCALE_BITS=render.f32_bits(arg[0]), CAUSAL=str(arg[1]).lower(),
                  WORKGROUP=rt.workgroup, ROW=groups[0] * rt.workgroup, **views, **extra)
    return enable + render.template("flash_attention", **values) + "\n" + render.template(name, **values), groups


@KERNELS.register("FLASH_ATTN")
def _flash_forward(rt, node, ins):
    q, k, v, views = _in_place(rt, *ins)
    out = rt.empty(node.shape, node.dtype)
    rows = math.prod(q.shape[:-1])
    if rows:
        source, groups = _source("flash_attention_forward", rt, rows, q, k, v, node.arg, views)
        rt.dispatch(source, [out, q, k, v], groups)
    return out


@KERNELS.register("FLASH_ATTN_BWD")
def _flash_backward(rt, node, ins):
    q, k, v, views = _in_place(rt, *ins[:3])
    out, dout = (rt.contiguous(x) for x in ins[3:])
    grads = rt.empty(node.shape, node.dtype)
    if not math.prod(node.shape):
        return grads
    delta = rt.empty(q.shape[:-1], dt.float32)
    bindings = [grads, q, k, v, out, dout, delta]
    read_only = [False, True, True, True, True, True, False]
    width = dout.shape[-1]  # v's width + 1 when dout holds dL, v's width when it is dO alone (dL = 0)
    minus_dl = "-f32(dout[r * DOUT_W + DV])" if width > v.shape[-1] else "0.0"
    for part, rows in ((0, math.prod(q.shape[:-1])), (1, math.prod(k.shape[:-1]))):
        source, groups = _source("flash_attention_backward", rt, rows, q, k, v, node.arg, views, PART=part,
                                 DOUT_W=width, MINUS_DL=minus_dl)
        rt.dispatch(source, bindings, groups, read_only)
    return grads
