"""What the C and WGSL renderings of a fusion Kernel share: the straight-line body (one typed constant per SSA
instruction, built from a per-language table of op templates) and the merging of axes that every operand walks
contiguously. A language subclass supplies its types, literals, op templates and how an input is read; the
loops around the body are each renderer's own (OpenMP loops in C, one invocation or workgroup per output in
WGSL)."""
from ..ops import names


class CStyleLanguage:
    types = {}  # tinyllm dtype name -> the language's type of a value
    unary = {}  # op -> template over {0} (and {t}: the value type)
    binary = {}  # op -> template over {0}, {1}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        names(*cls.unary, *cls.binary)  # a misspelled op in a template table raises when the renderer is imported

    def literal(self, value, dtype):
        raise NotImplementedError

    def let(self, name, dtype, expr):
        """The declaration of one immutable SSA value."""
        raise NotImplementedError

    def where(self, cond, a, b):
        return f"({cond} ? {a} : {b})"

    def cast(self, x, dtype, src_dtype):
        raise NotImplementedError

    def expression(self, op, arg, operands, dtype, in_dtypes):
        if op in self.unary:
            return self.unary[op].format(*operands, t=self.types[dtype])
        if op in self.binary:
            return self.binary[op].format(*operands)
        if op == "WHERE":
            return self.where(*operands)
        if op == "CAST":
            return self.cast(operands[0], dtype, in_dtypes[0])
        if op == "COPY":
            return operands[0]
        raise NotImplementedError(f"{type(self).__name__}: no rendering for op {op}")

    def body(self, kernel, load):
        """(lines, names of the stored values): the kernel's instructions, with `load(i)` the expression that
        reads its i-th input entry at the current position."""
        lines, names = [], []
        for n, (op, arg, operands, dtype) in enumerate(kernel.code):
            if op == "CONST":
                names.append(self.literal(arg, dtype))
                continue
            if op == "IN":
                expr = load(arg)
            else:
                expr = self.expression(op, arg, [names[o] for o in operands], dtype,
                                       [kernel.code[o][3] for o in operands])
            lines.append(self.let(f"v{n}", dtype, expr))
            names.append(f"v{n}")
        return lines, [names[o] for o in kernel.outs] if kernel.outs is not None else [names[-1]]


def merge_dims(shape, stride_sets, reduced):
    """Merge neighbouring axes that every operand walks contiguously (and that are both reduced or both kept):
    a (16, 64, 128) elementwise kernel on row-major buffers becomes one loop of 131072. Returns
    [[size, [stride per operand], is_reduced], ...]."""
    dims = [[s, [st[i] for st in stride_sets], i in reduced] for i, s in enumerate(shape) if s != 1]
    merged = []
    for d in dims:
        if merged and merged[-1][2] == d[2] and all(a == b * d[0] for a, b in zip(merged[-1][1], d[1])):
            merged[-1][0] *= d[0]
            merged[-1][1] = d[1]
        else:
            merged.append(d)
    return merged or [[1, [0] * len(stride_sets), False]]


def output_strides(kernel):
    """Each iteration axis's stride in the (row-major) output: 0 on reduced axes."""
    reduced = set(kernel.reduce[1]) if kernel.reduce else set()
    strides, acc = [], 1
    for i in reversed(range(len(kernel.shape))):
        strides.append(0 if i in reduced else acc)
        acc *= 1 if i in reduced else kernel.shape[i]
    return strides[::-1]
