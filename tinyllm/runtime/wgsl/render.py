"""Renders a fusion Kernel (tinyllm/ops/kernel.py) as a WGSL compute shader, on the C-style base shared with
the C renderer. Binding 0 is the output, binding 1 + i the i-th input, each row-major, read-only where read.

Storage types: float32 -> f32, float16 -> f16 (with `shader-f16`), int64 -> i32 (WGSL has no 64-bit integer:
the runtime checks that values fit), bool -> u32 (0 or 1; WGSL has no bool storage). Shapes and strides are
constants, so every index computation folds. int8 / uint8 are bytes packed in u32 words: only the quantized matmul
(wgsl/qmatmul.wgsl, dequant.wgsl over qweight.wgsl) and byte copies (copy_bytes.wgsl) are rendered for them.
Reductions: one invocation per output over few elements, else one workgroup per output (wgsl/reduce.wgsl), whose
invocations combine their partial results with subgroup operations where the adapter has the feature `subgroup`
(wgsl/reduce_subgroup.wgsl), else in a tree through workgroup memory (reduce_tree.wgsl).
A float16 instruction rounds its result to f16 (math_f16.wgsl's tl_round_h), as its op does unfused: an adapter
may keep f16 values in f32 registers between ops (llvmpipe does), which would round a fused chain once."""
import functools
import math
import os

import numpy as np

from ...ops.kernel import EXACT_LOW
from ..cstyle import CStyleLanguage, merge_dims, output_strides

STORAGE = {"float32": "f32", "float16": "f16", "int64": "i32", "bool": "u32"}
TYPES = {"float32": "f32", "float16": "f16", "int64": "i32", "bool": "bool"}
ACC = {"float32": "f32", "float16": "f32", "int64": "i32", "bool": "i32"}  # f16 sums accumulate in f32
MAX_GROUPS = 65535  # workgroups per dispatch dimension (WebGPU's default limit)
SERIAL_REDUCE_MAX = 32  # up to this many reduced elements, one invocation does a whole output
INT32_RANGE = (-2**31, 2**31 - 1)


def template_dir():
    """wgsl/ beside the package in a checkout (and an editable install), tinyllm/wgsl/ in a wheel."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tinyllm/
    for path in (os.path.join(here, "wgsl"), os.path.join(os.path.dirname(here), "wgsl")):
        if os.path.isdir(path):
            return path
    raise FileNotFoundError("the WGSL templates (wgsl/*.wgsl) are missing: reinstall tinyllm")


_templates = {}
# Sources by their arguments: a step run again (a replay above all) asks for the same kernels, and rendering
# one costs more than recording its dispatch.
_cached = functools.lru_cache(maxsize=4096)


def template(name, **values):
    """wgsl/NAME.wgsl with each {{KEY}} replaced by values[KEY]."""
    if name not in _templates:
        with open(os.path.join(template_dir(), name + ".wgsl"), encoding="utf-8") as f:
            _templates[name] = f.read()
    text = _templates[name]
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", str(value))
    if "{{" in text:
        raise KeyError(f"template {name}.wgsl: unfilled placeholder at ...{text[text.index('{{'):][:40]}")
    return text


# The builtins a workgroup reduction reads (wgsl/reduce_tree.wgsl, reduce_subgroup.wgsl), handed to `main` as one
# struct, so that the kernels around a reduction are the same text with or without subgroups.
INVOCATION = {
    False: "struct Invocation { @builtin(local_invocation_index) t: u32 }",
    True: "struct Invocation {\n  @builtin(local_invocation_index) t: u32,\n"
          "  @builtin(subgroup_invocation_id) lane: u32,\n  @builtin(subgroup_size) size: u32,\n"
          "  @builtin(subgroup_id) group: u32,\n  @builtin(num_subgroups) groups: u32,\n}",
}


def workgroup_combine(name, t, combine, identity, workgroup, subgroups):
    """WGSL of `fn name(inv: Invocation, v: t) -> t`: the workgroup's combine (a WGSL function's name) of its
    invocations' v, in a workgroup of `workgroup` invocations over `var<workgroup> part: array<t, workgroup>`; with
    subgroup operations (wgsl/reduce_subgroup.wgsl) or in a tree (reduce_tree.wgsl). identity: combine's identity
    (a WGSL expression)."""
    return template("reduce_subgroup" if subgroups else "reduce_tree", NAME=name, T=t, COMBINE=combine,
                    IDENTITY=identity, WORKGROUP=workgroup)


def f32_bits(value):
    return int(np.array(value, np.float32).view(np.uint32))


class WGSLLanguage(CStyleLanguage):
    types = TYPES
    unary = {"NEG": "(-{0})", "RECIP": "({t}(1) / {0})", "EXP": "exp({0})", "LOG": "log({0})", "SQRT": "sqrt({0})",
             "SIN": "sin({0})", "FLOOR": "floor({0})"}
    # math.wgsl, for float operands (f16 versions end in _h): NaN is handled by bit tests there, whatever the
    # shader compiler assumes about comparisons with NaN
    helpers = {"TANH": "tl_tanh", "ERF": "tl_erf", "MAX": "tl_max", "CMPLT": "tl_lt", "CMPEQ": "tl_eq",
               "POW": "tl_pow", "ATAN": "tl_atan", "FMOD": "tl_fmod"}
    binary = {"ADD": "({0} + {1})", "MUL": "({0} * {1})", "CMPLT": "({0} < {1})", "CMPEQ": "({0} == {1})",
              "BITAND": "({0} & {1})", "BITOR": "({0} | {1})", "BITXOR": "({0} ^ {1})", "POW": "tl_ipow({0}, {1})",
              "IDIV": "tl_idiv({0}, {1})"}  # i32: x / 0 and INT32_MIN / -1 give x, as WGSL defines them

    def literal(self, value, dtype):
        if dtype == "bool":
            return "true" if value else "false"
        if dtype == "int64":
            value = int(value)
            if not INT32_RANGE[0] <= value <= INT32_RANGE[1]:
                raise OverflowError(f"WGSL runtime: the int64 constant {value} does not fit in 32 bits (WGSL has no "
                                    "64-bit integers; int64 tensors are stored as i32)")
            return f"bitcast<i32>({value & 0xFFFFFFFF}u)" if value < 0 else f"{value}i"
        # every f32 by its bits: exact, and inf, nan and -0.0 cannot be folded away as constant overflow; inf and
        # nan through math.wgsl's tl_bits_f32, a runtime call, as Tint (Dawn, Chrome) refuses them as constants
        finite = math.isfinite(float(value))
        bits = f"{'bitcast<f32>' if finite else 'tl_bits_f32'}({f32_bits(value)}u)"
        return bits if dtype == "float32" else f"f16({bits})"

    def let(self, name, dtype, expr):
        return f"let {name}: {TYPES[dtype]} = {expr};"

    def where(self, cond, a, b):
        return f"select({b}, {a}, {cond})"

    def cast(self, x, dtype, src_dtype):
        if dtype == "bool":
            return f"({x} != {TYPES[src_dtype]}(0))" if src_dtype != "bool" else x
        if src_dtype == "bool":
            return f"select({TYPES[dtype]}(0), {TYPES[dtype]}(1), {x})"
        return f"{TYPES[dtype]}({x})"

    def expression(self, op, arg, operands, dtype, in_dtypes):
        expr = self._expression(op, arg, operands, dtype, in_dtypes)
        # a float16 instruction rounds to f16 as its op does unfused (an adapter may compute f16 in f32 registers)
        return f"tl_round_h({expr})" if dtype == "float16" and op not in EXACT_LOW else expr

    def _expression(self, op, arg, operands, dtype, in_dtypes):
        a = operands
        if op == "BITNOT":  # bools are WGSL bools in a kernel (u32 only in storage): ! for them, ~ for i32
            return f"(!{a[0]})" if dtype == "bool" else f"(~{a[0]})"
        if op == "BITXOR" and dtype == "bool":  # WGSL has & and | on bools, but no ^
            return f"({a[0]} != {a[1]})"
        if in_dtypes and in_dtypes[0] == "bool" and op in ("ADD", "MUL", "MAX", "CMPLT"):
            return {"ADD": "({0} || {1})", "MUL": "({0} && {1})", "MAX": "({0} || {1})",
                    "CMPLT": "(!{0} && {1})"}[op].format(*a)
        if op == "MAX" and dtype == "int64":
            return f"max({a[0]}, {a[1]})"
        if op in self.helpers and in_dtypes[0] in ("float32", "float16"):
            return f"{self.helpers[op]}{'_h' if in_dtypes[0] == 'float16' else ''}({', '.join(a)})"
        return super().expression(op, arg, operands, dtype, in_dtypes)


WGSL = WGSLLanguage()


def load(binding, index, dtype):
    return f"(s{binding}[{index}] != 0u)" if dtype == "bool" else f"s{binding}[{index}]"


def store(value, value_type, out_dtype):
    """`value` (a WGSL value of `value_type`) converted to the output's storage type."""
    if out_dtype == "bool":
        return f"select(0u, 1u, {value})" if value_type == "bool" else f"select(0u, 1u, {value} != {value_type}(0))"
    return value if value_type == STORAGE[out_dtype] else f"{STORAGE[out_dtype]}({value})"


def header(out_dtype, src_dtypes, value_dtypes):
    """`enable f16;` where needed, the math helpers, and the bindings."""
    f16 = "float16" in (out_dtype, *src_dtypes, *value_dtypes)
    lines = ["enable f16;"] if f16 else []
    lines.append(template("math", F16_HELPERS=template("math_f16") if f16 else ""))
    lines.append(f"@group(0) @binding(0) var<storage, read_write> out: array<{STORAGE[out_dtype]}>;")
    lines += [f"@group(0) @binding({i + 1}) var<storage, read> s{i}: array<{STORAGE[d]}>;"
              for i, d in enumerate(src_dtypes)]
    return "\n".join(lines)


def index_terms(dims, var, operand):
    """The offset of `operand` at the position whose index over `dims` is `var` (unravelled row-major)."""
    terms, inner = [], 1
    for size, strides, _ in reversed(dims):
        stride = strides[operand]
        if stride and size > 1:
            digit = var if inner == 1 else f"({var} / {inner}u)"
            digit = digit if inner * size == math.prod(d[0] for d in dims) else f"({digit} % {size}u)"
            terms.append(f"i32({digit}) * {stride}" if stride != 1 else f"i32({digit})")
        inner *= size
    return terms


def groups_for(n):
    """(x, y, 1) workgroups covering n, split over two dimensions when n is past the per-dimension limit."""
    return (min(n, MAX_GROUPS), -(-n // MAX_GROUPS), 1) if n else (0, 1, 1)


def reduce_width(n_red):
    """Invocations of wgsl/reduce.wgsl's workgroup over n_red elements: about 4 elements each, 32 to 256."""
    return min(256, 1 << max(5, (n_red - 1).bit_length() - 2))


@_cached
def render(kernel, out_dtype, src_dtypes, workgroup=64, subgroups=False):
    """(WGSL source, workgroups to dispatch) of one kernel; subgroups: whether a reduction may use subgroup
    operations (the adapter has the feature `subgroup`)."""
    reduced = set(kernel.reduce[1]) if kernel.reduce else set()
    red_op = kernel.reduce[0] if kernel.reduce else None
    n_ops = len(kernel.ins) + 1
    dims = merge_dims(kernel.shape, [output_strides(kernel)] + [ins[1] for ins in kernel.ins], reduced)
    kept, red = [d for d in dims if not d[2]], [d for d in dims if d[2]]
    n_out, n_red = math.prod(d[0] for d in kept), math.prod(d[0] for d in red)

    def offset(operand, base=0):
        terms = index_terms(kept, "o", operand) + index_terms(red, "r", operand)
        return " + ".join([str(base)] * bool(base) + terms) or "0"

    def input_at(i):
        src, _, base = kernel.ins[i]
        return load(src, f"{offset(i + 1, base)}", src_dtypes[src])

    body, (value,) = WGSL.body(kernel, input_at)  # (the WGSL runtime runs no fuse_outputs: one stored value)
    value_dtype = kernel.code[-1][3]
    out_at = f"out[{offset(0)}]"
    head = header(out_dtype, src_dtypes, [c[3] for c in kernel.code])
    if red_op is None:
        groups = groups_for(-(-n_out // workgroup))
        main = "\n".join([
            f"@compute @workgroup_size({workgroup})",
            "fn main(@builtin(global_invocation_id) gid: vec3<u32>) {",
            f"  let o = gid.x + gid.y * {groups[0] * workgroup}u;",
            f"  if (o >= {n_out}u) {{ return; }}",
            *["  " + line for line in body],
            f"  {out_at} = {store(value, TYPES[value_dtype], out_dtype)};",
            "}"])
        return head + "\n" + main, groups
    acc_t = ACC[value_dtype]
    value = f"select(0, 1, {value})" if value_dtype == "bool" else \
        value if TYPES[value_dtype] == acc_t else f"{acc_t}({value})"
    if red_op == "SUM":
        init, combine = f"{acc_t}(0)", "a + b"
    else:
        init = {"f32": WGSL.literal(-math.inf, "float32"), "i32": "bitcast<i32>(2147483648u)"}[acc_t]
        combine = "max(a, b)" if acc_t == "i32" else "tl_max(a, b)"
    fill = dict(ACC_T=acc_t, INIT=init, COMBINE=combine, N_OUT=n_out, N_RED=n_red, BODY="\n".join(
        "    " + line for line in body), VALUE=value, OUT_AT=out_at,
        STORE=store("acc", acc_t, out_dtype))
    if n_red <= SERIAL_REDUCE_MAX:
        groups = groups_for(-(-n_out // workgroup))
        return head + "\n" + template("reduce_serial", WORKGROUP=workgroup, ROW=groups[0] * workgroup, **fill), groups
    width = reduce_width(n_red)
    combine = workgroup_combine("workgroup_combine", acc_t, "combine", init, width, subgroups)
    return head + "\n" + template("reduce", WORKGROUP=width, INVOCATION=INVOCATION[subgroups],
                                   WORKGROUP_COMBINE=combine, **fill), groups_for(n_out)


def copy_kernel(shape, strides, offset, dtype):
    """A Kernel that copies a strided view of a row-major buffer into a fresh row-major one."""
    from ...ops.kernel import Kernel
    return Kernel(tuple(shape), None, ((0, tuple(strides), offset),), (("IN", 0, (), dtype),))


@_cached
def render_copy(shape, dst, src, dtype, workgroup=64):
    """(source, workgroups) of a copy between strided views: dst and src are (strides, offset) in elements."""
    dims = merge_dims(shape, [dst[0], src[0]], set())
    n = math.prod(d[0] for d in dims)

    def at(operand, base):
        return " + ".join([f"{base}"] * bool(base) + index_terms(dims, "i", operand)) or "0"

    groups = groups_for(-(-n // workgroup))
    enable = "enable f16;\n" if dtype == "float16" else ""
    return enable + template("copy", T=STORAGE[dtype], N=n, WORKGROUP=workgroup, ROW=groups[0] * workgroup,
                             AT_OUT=f"u32({at(0, dst[1])})", AT_SRC=f"u32({at(1, src[1])})"), groups


@_cached
def render_index(name, outer, n_idx, inner, n, dtype, slot, workgroup=64):
    """(source, workgroups) of GATHER (name "gather") or SCATTER_ADD ("scatter_add") over contiguous operands:
    wgsl/index.wgsl (bindings, index wrapping and flagging) followed by wgsl/NAME.wgsl."""
    threads = outer * inner * (n_idx if name == "gather" else 1)
    groups = groups_for(-(-threads // workgroup))
    enable = "enable f16;\n" if dtype == "float16" else ""
    values = dict(T=STORAGE[dtype], OUTER=outer, N_IDX=n_idx, INNER=inner, N=n, SLOT=slot, WORKGROUP=workgroup,
                  ROW=groups[0] * workgroup)
    return enable + template("index", **values) + "\n" + template(name, **values), groups


def operand_load(x, layout, rows, rows_total, k_total, bk, threads, dtype):
    """load_a / load_b of matmul.wgsl for one operand. layout: (fast axis "k" or "r", stride of the other axis,
    batch stride, offset) in elements; r is the operand's row of C (m for A, n for B)."""
    fast, ld, batch_stride, offset = layout
    storage = STORAGE[dtype]
    fast_total = k_total if fast == "k" else rows_total
    vec = 4 if ld % 4 == 0 and batch_stride % 4 == 0 and offset % 4 == 0 and fast_total % 4 == 0 else 1
    shared, s4 = ("as_" if x == "a" else "bs"), shared_row_vec4s(rows)
    if vec == 4 and fast == "r":  # 4 consecutive rows r..r+3 (r a multiple of 4) of one k: one vec4 store
        lines = [f"{shared}[k * {s4}u + r / 4u] = select(vec4<f32>(0.0), vec4<f32>({x}[at / 4u]), inside);"]
    elif vec == 4:  # 4 consecutive k of one row: transposed into 4 stores
        lines = [f"let v = select(vec4<f32>(0.0), vec4<f32>({x}[at / 4u]), inside);"]
        lines += [f"{shared}[(k + {j}u) * {s4}u + r / 4u][r % 4u] = v[{j}];" for j in range(4)]
    else:
        lines = [f"{shared}[k * {s4}u + r / 4u][r % 4u] = select(0.0, f32({x}[at]), inside);"]
    elem = f"vec4<{storage}>" if vec == 4 else storage
    source = template("matmul_load", X=x, ROWS=rows, BK=bk, VEC=vec, THREADS=threads, SH=shared, S4=s4,
                      FAST_TILE=bk if fast == "k" else rows, R_EXPR="slow" if fast == "k" else "fast",
                      K_EXPR="fast" if fast == "k" else "slow", ROWS_TOTAL=rows_total, K=k_total, OFFSET=offset,
                      BATCH_STRIDE=batch_stride, R_STRIDE=ld if fast == "k" else 1,
                      K_STRIDE=1 if fast == "k" else ld, LOAD="\n    ".join(lines))
    return source, elem


def shared_row_vec4s(rows):
    """vec4s per k of a staged operand slice in matmul.wgsl: its rows plus one vec4 of padding."""
    return rows // 4 + 1


def register_reads(shared, name, rows, per_thread, s4, lid):
    """(WGSL that reads one k's per_thread values of `shared` into lets, each value's expression, each value's row
    in the tile). per_thread a multiple of 4: runs of 4 rows, rows * 4 / per_thread apart, one vec4 read per run;
    else per_thread consecutive rows, one scalar read each."""
    if per_thread % 4 == 0:
        apart = rows // per_thread  # in vec4s
        reads = [f"let {name}{q} = {shared}[k * {s4}u + {q * apart}u + {lid}];" for q in range(per_thread // 4)]
        values = [f"{name}{i // 4}.{'xyzw'[i % 4]}" for i in range(per_thread)]
        return reads, values, [f"{(i // 4) * 4 * apart + i % 4}u + {lid} * 4u" for i in range(per_thread)]
    at = [f"{lid} * {per_thread}u + {i}u" for i in range(per_thread)]
    reads = [f"let {name}{i} = {shared}[k * {s4}u + ({e}) / 4u][({e}) % 4u];" for i, e in enumerate(at)]
    return reads, [f"{name}{i}" for i in range(per_thread)], at


@_cached
def render_matmul(batch, m, n, k, a_layout, b_layout, dtype, tiles):
    """(source, workgroups) of C = A·B (wgsl/matmul.wgsl); tiles = (BM, BN, BK, TM, TN)."""
    bm, bn, bk, tm, tn = tiles
    if bm % tm or bn % tn or bm % 4 or bn % 4 or bk % 4:
        raise ValueError(f"matmul tiles {tiles} (BM, BN, BK, TM, TN): BM, BN and BK must be multiples of 4, "
                         "BM of TM and BN of TN")
    threads = (bm // tm) * (bn // tn)
    load_a, a_elem = operand_load("a", a_layout, bm, m, k, bk, threads, dtype)
    load_b, b_elem = operand_load("b", b_layout, bn, n, k, bk, threads, dtype)
    sa4, sb4 = shared_row_vec4s(bm), shared_row_vec4s(bn)
    read_a, av, rows = register_reads("as_", "a", bm, tm, sa4, "lid.y")
    read_b, bv, cols = register_reads("bs", "b", bn, tn, sb4, "lid.x")
    fma = [f"acc[{i * tn + j}] += {av[i]} * {bv[j]};" for i in range(tm) for j in range(tn)]
    store = [f"if (row0 + {rows[i]} < {m}u && col0 + {cols[j]} < {n}u) {{ c[batch * {m * n}u + (row0 + {rows[i]}) * "
             f"{n}u + col0 + {cols[j]}] = {STORAGE[dtype]}(acc[{i * tn + j}]); }}"
             for i in range(tm) for j in range(tn)]
    source = template("matmul", ENABLE="enable f16;" if dtype == "float16" else "", T=STORAGE[dtype],
                      A_ELEM=a_elem, B_ELEM=b_elem, LOAD_A=load_a, LOAD_B=load_b, BATCH=batch, M=m, N=n, K=k,
                      BM=bm, BN=bn, BK=bk, TM=tm, TN=tn, THREADS=threads, SA4=sa4, SB4=sb4,
                      READ="\n      ".join(read_a + read_b), FMA="\n      ".join(fma), STORE="\n  ".join(store))
    return source, (-(-n // bn), -(-m // bm), batch)


# how wgsl/qweight.wgsl's weight_at finds the signed value v of W[n, k] (k's group is `group`)
QWEIGHT_DECODE = {
    "int8": "let b = byte_at(n * {K}u + k);\n  let v = i32(b) - select(0, 256, b >= 128u);",
    "int4": "let j = k % {G}u;\n  let high = j >= {H}u;\n"
            "  let b = byte_at(n * {KB}u + group * {H}u + select(j, j - {H}u, high));\n"
            "  let v = i32(select(b & 0xFu, b >> 4u, high)) - 8;",
}


def qweight(fmt, group_size, n, k, q_binding, s_binding):
    """wgsl/qweight.wgsl for an (n, k) weight of format `fmt`, its buffers at the given bindings. The storage holds
    whole groups: where k is not a multiple of group_size its rows are padded to Kp columns (tinyllm/ops/qmatmul.py),
    and the strides are Kp's."""
    kp = -(-k // group_size) * group_size
    decode = QWEIGHT_DECODE[fmt].format(K=kp, G=group_size, H=group_size // 2, KB=kp // 2)
    return template("qweight", N=n, K=k, G=group_size, GROUPS=kp // group_size, DECODE=decode,
                    Q_BINDING=q_binding, S_BINDING=s_binding)


QMATMUL_ROWS = 4  # rows of x one workgroup multiplies: each weight dequantized once serves as many


@_cached
def render_qmatmul(m, n, k, fmt, group_size, workgroup=64):
    """(source, workgroups) of QMATMUL: bindings out, x, qweight, scales (wgsl/qmatmul.wgsl)."""
    tm = min(QMATMUL_ROWS, m)
    source = template("qmatmul", M=m, N=n, K=k, TM=tm, WORKGROUP=workgroup) + "\n" + \
        qweight(fmt, group_size, n, k, 2, 3)
    return source, (min(n, MAX_GROUPS), -(-m // tm), -(-n // MAX_GROUPS))


@_cached
def render_quantize_activations(m, k, group_size, workgroup=64):
    """(source, workgroups) of QMATMUL's dynamic quantization of x (m, k): bindings out, x
    (wgsl/quantize_activations.wgsl)."""
    n = m * -(-k // group_size)
    groups = groups_for(-(-n // workgroup))
    source = template("quantize_activations", M=m, K=k, G=group_size, GROUPS=-(-k // group_size),
                      WORKGROUP=workgroup, ROW=groups[0] * workgroup)
    return source, groups


@_cached
def render_dequant(n, k, fmt, group_size, workgroup=64):
    """(source, workgroups) of DEQUANT: bindings out, qweight, scales (wgsl/dequant.wgsl)."""
    groups = groups_for(-(-n * k // workgroup))
    source = template("dequant", N=n, K=k, WORKGROUP=workgroup, ROW=groups[0] * workgroup) + "\n" + \
        qweight(fmt, group_size, n, k, 1, 2)
    return source, groups


@_cached
def render_copy_bytes(shape, dst, src, workgroup=64):
    """(source, workgroups) of a copy of one-byte elements between strided views (wgsl/copy_bytes.wgsl); dst and
    src are (strides, offset) in elements (bytes)."""
    dims = merge_dims(shape, [dst[0], src[0]], set())
    n = math.prod(d[0] for d in dims)

    def at(operand, base):
        return " + ".join([f"{base}"] * bool(base) + index_terms(dims, "i", operand)) or "0"

    groups = groups_for(-(-n // workgroup))
    return template("copy_bytes", N=n, WORKGROUP=workgroup, ROW=groups[0] * workgroup,
                    AT_OUT=f"u32({at(0, dst[1])})", AT_SRC=f"u32({at(1, src[1])})"), groups
