"""ARGSORT on the WGSL runtime: a bitonic sort of each row (wgsl/argsort.wgsl). The rows are the positions of the
other axes; a row pads to P, the next power of two.

Dispatches per sort, with B the block of pairs one workgroup sorts in its memory (up to 2048, within the device's
workgroup storage): one when P <= B; else for each stage k = 2B .. P, one per step j = k/2 .. B over a scratch buffer
of rows * P pairs (8 bytes each) plus one block pass for the steps below B: 21 for a row of the GPT vocabulary
(50257 -> P = 65536). float32, float16, int64 (stored as i32) and bool."""
import functools
import math

from ... import dtype as dt
from . import render
from ..base import kernels

KERNELS = kernels("wgsl")

MAX_BLOCK = 2048  # pairs sorted in workgroup memory: 16 KiB, WebGPU's default limit of workgroup storage

# the sort key (a u32 whose unsigned order is the values' order) of a stored value v (float16: its 16 bits), per
# dtype; descending sorts by the complement
KEYS = {"float32": "float_key(bitcast<u32>(v), 0x80000000u, 0x7f800000u)",
        "float16": "float_key(v, 0x8000u, 0x7c00u)",
        "int64": "(bitcast<u32>(v) ^ 0x80000000u)",
        "bool": "select(0u, 1u, v != 0u)"}


def block_size(rt, p):
    """(B, invocations) of the block pass for rows padded to p: B a power of two of 8-byte pairs in workgroup
    memory, at most p; each invocation exchanges B / 2 / invocations pairs per step."""
    lim = rt.gpu.limits
    b = min(p, MAX_BLOCK, 1 << (lim["max-compute-workgroup-storage-size"] // 8).bit_length() - 1)
    cap = min(rt.workgroup, lim["max-compute-invocations-per-workgroup"], lim["max-compute-workgroup-size-x"])
    return b, min(b // 2, 1 << cap.bit_length() - 1)


@functools.lru_cache(maxsize=1024)
def _source(dtype, descending, n, p, b, inner, rows, workgroup, pass_, groups_x):
    """The WGSL of one pass ("block" or "step"); a sort's passes of one kind share it."""
    key = KEYS[dtype]
    call = {"block": f"block_pass(wid.x + wid.y * {groups_x}u, t);",
            "step": f"step_pass(gid.x + gid.y * {groups_x * workgroup}u);"}[pass_]
    # float16 is read as the u32 words holding two halves (little-endian, as WebGPU's buffers): its bits with no
    # f16 arithmetic, which needs no `enable f16` (naga cannot bitcast an f16)
    load, storage = ("extractBits(x[i / 2u], 16u * (i % 2u), 16u)", "u32") if dtype == "float16" else \
        ("x[i]", render.STORAGE[dtype])
    return render.template("argsort", T=storage, LOAD=load, KEY=f"~{key}" if descending else key,
                           N=n, P=p, B=b, INNER=inner, ROWS=rows, WORKGROUP=workgroup, PASS=call)


@KERNELS.register("ARGSORT")
def _argsort(rt, node, ins):
    axis, descending = node.arg
    x = rt.contiguous(ins[0])
    shape, name = x.shape, x.dtype.name
    if name not in KEYS:
        raise TypeError(f"ARGSORT of {shape} along axis {axis}: the WGSL runtime sorts {', '.join(KEYS)}, not {name}")
    n = shape[axis] if shape else 1
    if not math.prod(shape):
        return rt.empty(node.shape, dt.int64)
    if n == 1:  # every row is sorted already
        return rt.copy(rt.constant(0, node.shape, dt.int64))
    inner = math.prod(shape[axis + 1:])
    rows, p = math.prod(shape) // n, 1 << (n - 1).bit_length()
    b, width = block_size(rt, p)
    out = rt.empty(node.shape, dt.int64)
    scratch_bytes = rows * p * 8 if p > b else 16  # a single block pass never reads it
    limit = rt.gpu.limits["max-storage-buffer-binding-size"]
    if scratch_bytes > limit:
        raise MemoryError(f"ARGSORT of {shape} {name} along axis {axis}: the WGSL sort needs {scratch_bytes} bytes "
                          f"of scratch (rows x next power of two x 8), over this device's binding limit of {limit}: "
                          "sort fewer rows at a time")
    scratch = rt.empty((scratch_bytes // 4,), dt.int64)
    bindings, read_only = [out, x, scratch, None], [False, True, False, True]

    def run(pass_, code, threads, workgroup):
        groups = render.groups_for(-(-threads // workgroup))
        bindings[3] = rt.constant(code, (1,), dt.int64)  # the stage (and step): cached one-element buffers
        source = _source(name, bool(descending), n, p, b, inner, rows, workgroup, pass_, groups[0])
        rt.dispatch(source, bindings, groups, read_only)

    blocks = rows * (p // b)
    run("block", 0, blocks * width, width)  # stages 2 .. B, whole
    for lk in range(b.bit_length(), p.bit_length()):  # stages k = 2^lk from 2B to P
        for lj in range(lk - 1, b.bit_length() - 2, -1):  # steps j = k/2 .. B: across blocks
            run("step", lk << 5 | lj, rows * p // 2, rt.workgroup)
        run("block", lk, blocks * width, width)  # steps j = B/2 .. 1
    return out
