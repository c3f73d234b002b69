"""Renders a fusion Kernel (tinyllm/ops/kernel.py) as a C function `void NAME(char **bufs)`, where bufs[0]
is the output and bufs[1 + i] the i-th input, each row-major. Shapes and strides are compile-time constants, so
the compiler sees plain nested loops it can vectorise; OpenMP splits the outermost loop across threads.

A small kernel (under PARALLEL_MIN iterations: one thread) is shape-generic instead: its sizes, strides and offsets
other than 0 and 1 follow the buffers in bufs, as integers, so one compiled function serves every shape with the
same structure (compiling it costs far more than running it).

16-bit floats (float16, bfloat16) are stored as uint16_t and are floats everywhere else: a load widens them
(exactly), every instruction computes in float32, and every instruction whose dtype is a 16-bit float rounds its
result to that dtype (to nearest even, c_math.h's tl_f16_round / tl_bf16_round), as the NumPy runtime and torch
round after each op: rounding to the declared dtype is part of an op's meaning, so a fused kernel gives the unfused
graph's values bit for bit, overflow to inf, underflow to 0 and subnormals included (float32's 24 bits hold a
16-bit float's product, sum and quotient closely enough that rounding the float32 result is rounding the exact
one). Ops whose result is already a value of the dtype (NEG, MAX, FLOOR, WHERE, COPY of 16-bit values) are not
rounded again; float32 instructions (autocast's compute) never are. A reduction into a 16-bit output accumulates
in float32, rounding once at the end.

An elementwise kernel whose outputs are WHEREs that keep an input read at their own position, on rows its condition
selects, also renders a branch for when it runs over that input's memory (_where_in_place: a decode step's cache
write), which writes only the other rows."""
import hashlib
import math
import os
import re

import numpy as np

from ... import dtype as dt
from ...ops.kernel import EXACT_LOW
from ..cstyle import CStyleLanguage, merge_dims, output_strides

# the C type a value computes in, and the one a buffer stores it as
CTYPE = {"float32": "float", "float64": "double", "int64": "int64_t", "bool": "unsigned char", "int8": "int8_t",
         "uint8": "uint8_t", "float16": "float", "bfloat16": "float"}
STORAGE = {**CTYPE, "float16": "uint16_t", "bfloat16": "uint16_t"}
LOW = {"float16": "f16", "bfloat16": "bf16"}  # c_math.h's names: tl_<name>_load, _store, _round
PARALLEL_MIN = 1 << 15  # below this many iterations a kernel runs on one thread: waking threads costs more
SLICES = 4  # a reduction over the outermost axis runs as this many slices of it, in parallel (see _sliced)
SLICED_MAX_OUT = 1 << 13  # ... when its partial results fit on the stack (SLICES x this many values)
# An elementwise kernel whose inputs mostly lie across its rows (a transposed weight that autocast casts: stride 1
# along the loop outside the innermost) vectorises along that loop instead, TILE_ROWS rows at a time (_across):
# contiguous vector loads and strided stores in place of gathers, which Zen 4 runs about one element a cycle
# (bench/RESULTS.md, issue 48)
TILE_ROWS = 16

UNARY = {"NEG": "(-{0})", "RECIP": "(({t})1 / {0})", "EXP": "exp{f}({0})", "LOG": "log{f}({0})",
         "SQRT": "sqrt{f}({0})", "TANH": "tanh{f}({0})", "ERF": "erf{f}({0})", "SIN": "sin{f}({0})",
         "ATAN": "atan{f}({0})", "FLOOR": "floor{f}({0})"}
FAST_F32 = {"EXP": "tl_expf({0})", "TANH": "tl_tanhf({0})", "ERF": "tl_erff({0})"}  # vectorisable versions in c_math.h
HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "c_math.h")
with open(HEADER, "rb") as _f:  # in every source, so the kernel cache (keyed by source) sees header edits
    HEADER_TAG = hashlib.sha256(_f.read()).hexdigest()[:16]
BINARY = {"ADD": "({0} + {1})", "MUL": "({0} * {1})", "CMPLT": "({0} < {1})", "CMPEQ": "({0} == {1})",
          # NaN in either operand wins, as NumPy's maximum
          "MAX": "(({0} != {0} || {0} > {1}) ? {0} : {1})",
          "BITAND": "({0} & {1})", "BITOR": "({0} | {1})", "BITXOR": "({0} ^ {1})"}


def compute(dtype):
    """The dtype an instruction of `dtype` computes in: float32 for the 16-bit floats."""
    return "float32" if dtype in LOW else dtype


def load(expr, dtype):
    return f"tl_{LOW[dtype]}_load({expr})" if dtype in LOW else expr


def store(expr, dtype):
    """`expr` as `dtype`'s storage: a 16-bit float rounds to nearest even."""
    return f"tl_{LOW[dtype]}_store((float){expr})" if dtype in LOW else f"({CTYPE[dtype]}){expr}"


class CLanguage(CStyleLanguage):
    types = CTYPE
    unary = UNARY
    binary = BINARY

    def literal(self, value, dtype):
        if dtype == "bool":
            return "1" if value else "0"
        if dtype == "int64":
            return f"INT64_C({int(value)})"
        if dtype in ("int8", "uint8"):
            return f"(({CTYPE[dtype]}){int(value)})"
        if dtype in LOW:  # the constant is a value of its dtype: rounded as a store would
            d = dt.from_name(dtype)
            value = float(dt.decode(dt.encode(value, d), d).astype(np.float32).reshape(-1)[0])
        if math.isnan(value):
            return "NAN"
        if math.isinf(value):
            return "INFINITY" if value > 0 else "(-INFINITY)"
        return f"(({CTYPE[dtype]}){float(value).hex()})"  # hex literals are exact

    def let(self, name, dtype, expr):
        return f"const {CTYPE[dtype]} {name} = {expr};"

    def cast(self, x, dtype, src_dtype):
        if dtype == "bool":
            return f"({x} != 0)"
        return f"tl_{LOW[dtype]}_round((float){x})" if dtype in LOW else f"(({CTYPE[dtype]}){x})"

    def expression(self, op, arg, operands, dtype, in_dtypes):
        expr = self._expression(op, arg, operands, dtype, in_dtypes)
        # an instruction of a 16-bit float dtype rounds to it, as the op does unfused (CAST rounds in cast())
        return f"tl_{LOW[dtype]}_round({expr})" if dtype in LOW and op not in EXACT_LOW else expr

    def _expression(self, op, arg, operands, dtype, in_dtypes):
        if op != "CAST":
            dtype, in_dtypes = compute(dtype), [compute(d) for d in in_dtypes]
        if op == "POW":  # C's pow is the reference's (NumPy's power); integers exactly (c_math.h)
            f = {"float32": "powf", "float64": "pow"}.get(dtype, "tl_ipow")
            return f"{f}({operands[0]}, {operands[1]})"
        if op == "FMOD":  # C's fmod is the reference's (NumPy's fmod), exact
            return f"fmod{'f' if dtype == 'float32' else ''}({operands[0]}, {operands[1]})"
        if op == "IDIV":  # guarded (c_math.h): no trap at x / 0 or INT64_MIN / -1
            return f"tl_idiv({operands[0]}, {operands[1]})"
        if op == "BITNOT":
            return f"(!{operands[0]})" if dtype == "bool" else f"(~{operands[0]})"
        if op == "ERF" and arg == "given":  # (_erf_given_exp: the kernel computes e^(-x^2) too)
            return f"tl_erff_given({operands[0]}, tl_expf(-({operands[0]} * {operands[0]})))"
        if op in FAST_F32 and dtype == "float32":
            return FAST_F32[op].format(*operands)
        if op in UNARY:
            return UNARY[op].format(*operands, t=CTYPE[dtype], f="f" if dtype == "float32" else "")
        return super().expression(op, arg, operands, dtype, in_dtypes)


C = CLanguage()


def acc_type(ctype):
    return "int64_t" if ctype in ("unsigned char", "int8_t", "uint8_t") else ctype


def render(kernel, out_dtype, src_dtypes):
    """(name, C source, params) of one kernel: it is called with bufs = [out, *inputs, *params] (params are empty
    unless the kernel is shape-generic), and its name is its source's hash, so kernels of one source are one."""
    params = []
    generic = math.prod(kernel.shape) < PARALLEL_MIN

    def num(n):
        """A size, stride or offset: a literal, or in a shape-generic kernel the next parameter (0 and 1, which
        shape the code, stay literals)."""
        if not generic or n in (0, 1):
            return str(n)
        params.append(int(n))
        return f"p{len(params) - 1}"

    source = _render(_erf_given_exp(kernel), out_dtype, src_dtypes, num)
    first = 1 + len(src_dtypes)
    source = source.replace("  /* params */\n", "".join(f"  const long p{k} = (long)bufs[{first + k}];\n"
                                                         for k in range(len(params))))
    name = "k" + hashlib.sha1(source.encode()).hexdigest()[:20]
    return name, source.replace("void KERNEL(", f"void {name}("), tuple(params)


def _erf_given_exp(kernel):
    """The kernel with each float32 ERF(x) marked "given" where the kernel also computes EXP(-(x * x)): GELU's
    backward, whose derivative holds e^(-x^2). It renders as c_math.h's tl_erff_given(x, tl_expf(-(x * x))), the
    same expression as the kernel's own, which gcc computes once: erf then takes no exponential of its own."""
    code = kernel.code  # each map below: an instruction -> the x it is a step of e^(-x^2) from
    squares = {n: operands[0] for n, (op, _, operands, _) in enumerate(code)
               if op == "MUL" and operands[0] == operands[1]}
    negated = {n: squares[operands[0]] for n, (op, _, operands, _) in enumerate(code)
               if op == "NEG" and operands[0] in squares}
    shared = {negated[operands[0]] for op, _, operands, dtype in code
              if op == "EXP" and dtype == "float32" and operands[0] in negated}
    marks = [n for n, (op, _, operands, dtype) in enumerate(code)
             if op == "ERF" and dtype == "float32" and operands[0] in shared]
    if not marks:
        return kernel
    changed = list(code)
    for n in marks:
        changed[n] = (code[n][0], "given", code[n][2], code[n][3])
    return kernel._replace(code=changed)


def _render(kernel, out_dtype, src_dtypes, num):
    reduced = set(kernel.reduce[1]) if kernel.reduce else set()
    red_op = kernel.reduce[0] if kernel.reduce else None
    tail = []  # after the loops
    dims = merge_dims(kernel.shape, [output_strides(kernel)] + [ins[1] for ins in kernel.ins], reduced)
    # Row reduction (innermost axis reduced): outputs outside, one accumulator each, reduced axes inside.
    # Otherwise the axes keep their memory order, and reductions accumulate straight into the output.
    row = red_op is not None and dims[-1][2]
    if row:
        dims = [d for d in dims if not d[2]] + [d for d in dims if d[2]]
    iv = [f"i{k}" for k in range(len(dims))]

    def offset(k, base=0):
        terms = [f"{v}*{num(d[1][k])}" for v, d in zip(iv, dims) if d[1][k]]
        return " + ".join([num(base)] * bool(base) + terms) or "0"

    def read(i):
        src = kernel.ins[i][0]
        return load(f"s{src}[{offset(i + 1, kernel.ins[i][2])}]", src_dtypes[src])

    body, values = C.body(kernel, read)
    if red_op is None and out_dtype in LOW:
        body = _unrounded_stores(body, values, LOW[out_dtype])
    value = values[-1]
    ot, st = CTYPE[out_dtype], STORAGE[out_dtype]  # the output's value type, and its storage type
    lines = [f'#include "{HEADER}" /* {HEADER_TAG} */', "void KERNEL(char **bufs) {", "  /* params */",
             f"  {st} *restrict out = ({st} *)bufs[0];"]
    lines += [f"  const {STORAGE[d]} *restrict s{i} = (const {STORAGE[d]} *)bufs[{i + 1}];"
              for i, d in enumerate(src_dtypes)]
    init = {"float": "-INFINITY", "double": "-INFINITY", "int64_t": "INT64_MIN", "int8_t": "INT8_MIN"}.get(ot, "0") \
        if red_op == "REDUCE_MAX" else "0"
    # NaN wins, as NumPy's max. An unconditional store: GCC 12 at -O3 -march=native miscompiles the conditional
    # one (`if (...) a = v;`) into AVX-512 masked stores that lose updates and write out of bounds
    keep_max = "{a} = ({v} != {v} || {v} > {a}) ? {v} : {a};"
    if red_op is None:  # output j of several (fuse_outputs) at j · the iteration size
        stores = [f"out[{offset(0, j * math.prod(kernel.shape))}] = {store(v, out_dtype)};"
                  for j, v in enumerate(values)]
        loops, inner, parallel = dims, [*body, *stores], True
    elif row:
        # One accumulator per output, reduced axes inside. `omp simd reduction` lets the compiler keep one
        # partial result per vector lane (plain C may not reorder float adds, which keeps the loop scalar).
        n_kept = sum(1 for d in dims if not d[2])
        red_loops = [f"for (long {iv[k]} = 0; {iv[k]} < {num(dims[k][0])}; {iv[k]}++) {{"
                     for k in range(n_kept, len(dims))]
        if red_op == "SUM":
            start, update, end = [f"{acc_type(ot)} acc = 0;"], f"acc += {value};", "acc"
            red_loops[-1:] = ["#pragma omp simd reduction(+:acc)", red_loops[-1]]
        else:  # NaN wins, as NumPy's max: a lane max would drop it, so it is tracked on its own
            start = [f"{ot} acc = {init};", "int nan = 0;"]
            update = f"acc = {value} > acc ? {value} : acc; nan |= {value} != {value};"
            end = "(nan ? NAN : acc)" if ot in ("float", "double") else "acc"
            red_loops[-1:] = ["#pragma omp simd reduction(max:acc) reduction(|:nan)", red_loops[-1]]
        inner = [*start, *red_loops, *["  " + b for b in body], "  " + update, *["}"] * (len(red_loops) - 1),
                 f"out[{offset(0)}] = {store(end, out_dtype)};"]
        loops, parallel = dims[:n_kept], True
    else:
        n_out = math.prod(s for i, s in enumerate(kernel.shape) if i not in reduced)
        combine = (lambda a, v: f"{a} += {v};") if red_op == "SUM" else (lambda a, v: keep_max.format(v=v, a=a))
        if dims[0][2] and dims[0][0] >= SLICES and n_out <= SLICED_MAX_OUT \
                and math.prod(kernel.shape) >= PARALLEL_MIN and ot in ("float", "double"):
            return _sliced(lines, dims, iv, [*body, combine(f"p[{offset(0)}]", value)], combine, out_dtype, init,
                           n_out)
        acc, n = "out", num(n_out)
        if out_dtype in LOW:  # the sums run in float32, in a scratch array, and are rounded once at the end
            acc = "red"
            lines += [f"  float *restrict red = (float *)__builtin_malloc(sizeof(float) * {n});",
                      f"  if (!red) {{ for (long o = 0; o < {n}; o++) out[o] = {store('NAN', out_dtype)};"
                      " return; }  /* out of memory: NaN, never a wrong number */"]
            tail = [f"  for (long o = 0; o < {n}; o++) out[o] = {store('red[o]', out_dtype)};",
                    "  __builtin_free(red);"]
        lines.append(f"  for (long o = 0; o < {n}; o++) {acc}[o] = {init};")
        update = combine(f"{acc}[{offset(0)}]", value)
        loops, inner, parallel = dims, [*body, update], not dims[0][2]  # threads must own their outputs
    threads = parallel and math.prod(kernel.shape) >= PARALLEL_MIN and loops and loops[0][0] > 1
    if red_op is None:
        lines += _where_in_place(kernel, dims, body, iv, offset, out_dtype, src_dtypes, threads, num)
    if red_op is None and math.prod(kernel.shape) >= PARALLEL_MIN and _reads_across(loops):
        return _across(lines, loops, iv, inner, threads, num)
    for k, d in enumerate(loops):
        # the innermost loop of an elementwise kernel is independent per element: say so, so it vectorises
        # even through the inlined math of c_math.h
        simd = red_op is None and k == len(loops) - 1
        pragma = ("parallel for simd schedule(static)" if simd else "parallel for schedule(static)") \
            if threads and k == 0 else "simd" if simd else None
        if pragma:
            lines.append("  " * (k + 1) + f"#pragma omp {pragma}")
        lines.append("  " * (k + 1) + f"for (long {iv[k]} = 0; {iv[k]} < {num(d[0])}; {iv[k]}++) {{")
    lines += ["  " * (len(loops) + 1) + s for s in inner]
    lines += ["  " * (k + 1) + "}" for k in reversed(range(len(loops)))]
    return "\n".join(lines + tail + ["}"]) + "\n"


def _where_in_place(kernel, dims, body, iv, offset, out_dtype, src_dtypes, threads, num):
    """The lines of an elementwise kernel that, run in place, writes only what changes: for outputs WHERE(c, a, b)
    (one c for all of them, where there are several: fuse_outputs) where b (or a) reads an input at the output's own
    position, and c is the same along the innermost loop. When each output is that input's memory (a replay's
    donation: runtime/c/donate.py, as a decode step's cache writes), the elements WHERE takes from it already hold
    their values, so the rows where c keeps them are skipped: c is computed once per row, and b (a) not read at
    all. A KV cache's write of one slot then costs one slot's rows, not a read and a write of the whole cache
    (bench/RESULTS.md, issue 48). The values are the plain loop's, element by element; otherwise (or without such
    WHEREs) no lines."""
    code, size = kernel.code, math.prod(kernel.shape)
    outs = kernel.outs if kernel.outs is not None else (len(code) - 1,)
    if any(code[o][0] != "WHERE" for o in outs) or len({code[o][2][0] for o in outs}) != 1:
        return []
    cond, writes, aliased, keeps = code[outs[0]][2][0], [], [], set()
    for j, o in enumerate(outs):
        sides = code[o][2][1:]
        kept = [k for k, i in enumerate(sides) if _own_position(kernel, code[i], out_dtype, src_dtypes)]
        if not kept:
            return []
        # the side read in place; the other side is written where c selects it
        src = kernel.ins[code[sides[kept[0]]][1]][0]
        if sum(entry[0] == src for entry in kernel.ins) > 1:  # read at other positions too: not this shape
            return []
        keeps.add(kept[0])
        writes.append(sides[1 - kept[0]])
        aliased.append(f"(const void *)(out + {num(j * size)}) == (const void *)s{src}")
    if len(keeps) > 1:  # one test skips the rows for every output
        return []
    keep, = keeps
    on_cond = _operands_closure(code, cond)
    rows = [k for k, d in enumerate(dims) if any(code[j][0] == "IN" and d[1][code[j][1] + 1] for j in on_cond)]
    if len(dims) - 1 in rows:  # c varies along the innermost loop: no row to skip
        return []
    lines_of = dict(zip((j for j, ins in enumerate(code) if ins[0] != "CONST"), body))
    names = [C.literal(arg, dtype) if op == "CONST" else f"v{j}" for j, (op, arg, _, dtype) in enumerate(code)]
    lines = [f"  if ({' && '.join(aliased)}) {{  /* in place: only the rows WHERE writes */"]
    depth = 2

    def enter(k, first):
        nonlocal depth
        innermost = k == len(dims) - 1
        pragma = ("parallel for simd" if innermost else "parallel for") if threads and first else \
            "simd" if innermost else None
        if pragma:
            lines.append("  " * depth + f"#pragma omp {pragma}" + " schedule(static)" * pragma.startswith("p"))
        lines.append("  " * depth + f"for (long {iv[k]} = 0; {iv[k]} < {num(dims[k][0])}; {iv[k]}++) {{")
        depth += 1

    for n, k in enumerate(rows):
        enter(k, n == 0)
    lines += ["  " * depth + lines_of[j] for j in sorted(on_cond) if j in lines_of]
    skip = f"!({names[cond]})" if keep == 1 else names[cond]  # where WHERE takes the side already there
    lines.append("  " * depth + f"if ({skip}) {'continue' if rows else 'return'};")
    for n, k in enumerate(k for k in range(len(dims)) if k not in rows):
        enter(k, not rows and n == 0)
    on_writes = set().union(*(_operands_closure(code, w) for w in writes)) - on_cond
    lines += ["  " * depth + lines_of[j] for j in sorted(on_writes) if j in lines_of]
    lines += ["  " * depth + f"out[{offset(0, j * size)}] = {store(names[w], out_dtype)};"
              for j, w in enumerate(writes)]
    lines += ["  " * d + "}" for d in reversed(range(2, depth))]
    return lines + ["    return;", "  }"]


def _own_position(kernel, instruction, out_dtype, src_dtypes):
    """Whether an instruction reads an input of the output's dtype at the output's own position."""
    op, arg = instruction[:2]
    if op != "IN":
        return False
    src, strides, start = kernel.ins[arg]
    own = output_strides(kernel)
    return start == 0 and src_dtypes[src] == out_dtype and \
        all(a == b for a, b, n in zip(strides, own, kernel.shape) if n != 1)


def _operands_closure(code, i):
    """The instructions value i is computed from, itself included (an iterative walk)."""
    seen, todo = set(), [i]
    while todo:
        j = todo.pop()
        if j not in seen:
            seen.add(j)
            todo.extend(code[j][2])
    return seen


def _unrounded_stores(body, values, low):
    """The body with the rounding to the 16-bit float taken off each value that is only stored: the store rounds
    the same way, and a value rounded twice has the bits of one rounding (tl_<low>_store(tl_<low>_round(x)) ==
    tl_<low>_store(x) for every float x, NaN included), so the kernel's results do not change."""
    prefix, out = f"tl_{low}_round(", []
    for line in body:
        head, _, expr = line.partition(" = ")
        v = head.split()[-1]
        # the rounding is the whole expression (CLanguage.cast and .expression put it outermost), the value is
        # stored once and read by no other instruction
        if expr.startswith(prefix) and values.count(v) == 1 \
                and not any(re.search(rf"\b{v}\b", other) for other in body if other is not line):
            line = f"{head} = {expr[len(prefix):-2]};"
        out.append(line)
    return out


def _reads_across(loops):
    """Whether more inputs step through memory along the loop outside the innermost one (stride 1 there, over 1
    along the innermost) than along the innermost, both loops long enough (two blocks of TILE_ROWS at least: the
    threads may share them out)."""
    if len(loops) < 2 or loops[-1][0] < TILE_ROWS or loops[-2][0] < 2 * TILE_ROWS:
        return False
    outer, inner = loops[-2][1][1:], loops[-1][1][1:]  # the inputs' strides (the output's first)
    across = sum(o == 1 and i > 1 for o, i in zip(outer, inner))
    return across > sum(i == 1 for i in inner)


def _across(lines, loops, iv, inner, threads, num):
    """An elementwise kernel vectorised along the loop outside the innermost: that loop in blocks of TILE_ROWS,
    the innermost loop inside the blocks and the block's rows innermost (the loops outside them, and the threads, as
    the plain kernel has them). The same element-by-element arithmetic: the same values."""
    a = len(loops) - 2
    for k, d in enumerate(loops[:a]):
        if threads and k == 0:
            lines.append("  #pragma omp parallel for schedule(static)")
        lines.append("  " * (k + 1) + f"for (long {iv[k]} = 0; {iv[k]} < {num(d[0])}; {iv[k]}++) {{")
    (ia, ib), (na, nb), pad = iv[a:], (num(loops[a][0]), num(loops[a + 1][0])), "  " * (a + 1)
    end = f"(t{a} + {TILE_ROWS} < {na} ? t{a} + {TILE_ROWS} : {na})"
    if threads and a == 0:
        lines.append(f"{pad}#pragma omp parallel for schedule(static)")
    lines += [f"{pad}for (long t{a} = 0; t{a} < {na}; t{a} += {TILE_ROWS}) {{",
              f"{pad}  for (long {ib} = 0; {ib} < {nb}; {ib}++) {{",
              f"{pad}    #pragma omp simd",
              f"{pad}    for (long {ia} = t{a}; {ia} < {end}; {ia}++) {{"]
    lines += [pad + "      " + s for s in inner]
    lines += [pad + "  " * k + "}" for k in reversed(range(3))]
    lines += ["  " * (k + 1) + "}" for k in reversed(range(a))]
    return "\n".join(lines + ["}"]) + "\n"


def _sliced(lines, dims, iv, inner, combine, out_dtype, init, n_out):
    """A reduction whose outermost axis is reduced (a bias's gradient: the sum of dY over the rows), which one
    thread would otherwise run alone, since threads must own their outputs: each of SLICES slices of that axis
    reduces into its own partial result p, the slices run on the threads, and the partials are combined in order.
    The slices are fixed, not one per thread, so the result is the same on any number of threads."""
    n0, i0, ot = dims[0][0], iv[0], CTYPE[out_dtype]
    lines += [f"  {ot} part[{SLICES}][{n_out}];",
              "  #pragma omp parallel for schedule(static)",
              f"  for (long slice = 0; slice < {SLICES}; slice++) {{",
              f"    {ot} *restrict p = part[slice];",
              f"    for (long o = 0; o < {n_out}; o++) p[o] = {init};",
              f"    for (long {i0} = {n0} * slice / {SLICES}; {i0} < {n0} * (slice + 1) / {SLICES}; {i0}++) {{"]
    for k, d in enumerate(dims[1:], 1):
        lines.append("  " * (k + 2) + f"for (long {iv[k]} = 0; {iv[k]} < {d[0]}; {iv[k]}++) {{")
    lines += ["  " * (len(dims) + 2) + s for s in inner]
    lines += ["  " * (k + 2) + "}" for k in reversed(range(len(dims)))]
    total = "out[o]" if out_dtype not in LOW else "r"  # a 16-bit float's partials add up in float32
    lines += ["  }", f"  for (long o = 0; o < {n_out}; o++) {{",
              f"    {'' if total == 'out[o]' else 'float '}{total} = part[0][o];",
              *[f"    {combine(total, f'part[{j}][o]')}" for j in range(1, SLICES)],
              *[f"    out[o] = {store(total, out_dtype)};"] * (total != "out[o]"), "  }"]
    return "\n".join(lines + ["}"]) + "\n"
