"""FLASH_ATTN and FLASH_ATTN_BWD on the WGSL runtime: wgsl/flash_attention_forward.wgsl and _backward.wgsl, each after
wgsl/flash_attention.wgsl. q, k and v are read in place through their views (grouped-query attention's keys and
values broadcast over a group with stride 0, a head split of a projection): their batch axes as up to three runs
of one stride each, their rows strided, their columns contiguous; anything else is copied first (a strided copy on
the GPU), as are the backward's other operands. The kernels are tiled through workgroup memory (FlashAttention-2):
a workgroup owns BR rows of one (batch, head) and stages the rows it walks over BC at a time (wgsl/flash_attention.wgsl
says how); tiles() picks BR and BC."""
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


BR_MAX = 64  # rows per workgroup: more share each staged block, fewer leave more workgroups to run side by side
BC_MAX = 32  # rows per staged block: fewer barriers per row walked, more workgroup memory


def tiles(rt, rows, d, dv):
    """(BR, BC) for a pass over `rows` rows per (batch, head), of widths d and dv: BR rows per workgroup, one per
    invocation (no more than there are rows); BC rows per staged block, as many (up to BC_MAX) as fit the device's
    workgroup storage: per row d and dv rounded up to vec4s of f32, and the backward's (L, Delta). WebGPU
    guarantees 16 KiB, which holds BC = 32 up to d = dv = 60 and BC = 15 at d = dv = 128 (lavapipe has 32 KiB)."""
    limits = rt.gpu.limits
    br = min(BR_MAX, rt.workgroup, limits["max-compute-invocations-per-workgroup"], 1 << max(rows - 1, 0).bit_length())
    bc = min(BC_MAX, limits["max-compute-workgroup-storage-size"] // (16 * (-(-d // 4) - (-dv // 4)) + 8))
    if bc < 1:
        raise ValueError(f"FLASH_ATTN on WGSL: heads {d} and {dv} wide leave no room for one staged row in this "
                         f"device's {limits['max-compute-workgroup-storage-size']} bytes of workgroup storage")
    return br, bc


def _source(name, rt, rows, q, k, v, arg, views, **extra):
    """(source, workgroups): wgsl/flash_attention.wgsl (q, k, v, the sizes, the staging) followed by wgsl/NAME.wgsl,
    for a pass over `rows` rows of each (batch, head)."""
    br, bc = tiles(rt, rows, q.shape[-1], v.shape[-1])
    bh = math.prod(q.shape[:-2])
    groups = render.groups_for(bh * -(-rows // br))
    enable = "enable f16;\n" if q.dtype is dt.float16 else ""
    values = dict(T=render.STORAGE[q.dtype.name], BH=bh, TQ=q.shape[-2], TK=k.shape[-2], D=q.shape[-1],
                  DV=v.shape[-1], SCALE_BITS=render.f32_bits(arg[0]), CAUSAL=str(arg[1]).lower(), BR=br, BC=bc,
                  GX=groups[0], **views, **extra)
    return enable + render.template("flash_attention", **values) + "\n" + render.template(name, **values), groups


@KERNELS.register("FLASH_ATTN")
def _flash_forward(rt, node, ins):
    q, k, v, views = _in_place(rt, *ins)
    out = rt.empty(node.shape, node.dtype)
    if math.prod(q.shape[:-1]):
        source, groups = _source("flash_attention_forward", rt, q.shape[-2], q, k, v, node.arg, views)
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
    for part, rows in ((0, q.shape[-2]), (1, k.shape[-2])):
        if rows:
            source, groups = _source("flash_attention_backward", rt, rows, q, k, v, node.arg, views, PART=part,
                                     DOUT_W=width, MINUS_DL=minus_dl)
            rt.dispatch(source, bindings, groups, read_only)
    return grads
