"""Kernel fusion: chains of elementwise ops, and elementwise ops feeding a reduction, become one FUSED node whose
`arg` is a Kernel (tinyllm/ops/kernel.py). Views between fused ops fold into each input's strides and offset.
What is inlined and what is stored: docs/architecture.md, "What fusion inlines".
"""
import math

from ..graph import Node, build, consumers, substitute, toposort
from ..ops import Group
from ..ops.kernel import Kernel
from ..views import contiguous_strides, view_strides
from .engine import Pat, PatternMatcher, graph_rewrite

FOLDABLE_VIEWS = Group.VIEW - {"CHECKPOINT"}  # a CHECKPOINT marker keeps a recomputed copy apart: never folded



def _view_chain(node):
    """(base, views): the node under a chain of foldable views, and the views from the base outwards."""
    chain = []
    while node.op in FOLDABLE_VIEWS:
        chain.append(node)
        node = node.src[0]
    return node, chain[::-1]


def _through(views, strides, offset):
    """(strides, offset) that read, over the last view's shape, what (strides, offset) read over the first
    view's input shape; None if a reshape would copy."""
    for v in views:
        if v.op == "PERMUTE":
            strides = tuple(strides[i] for i in v.arg)
        elif v.op == "EXPAND":
            strides = tuple(0 if s != a else st for s, a, st in zip(v.src[0].shape, v.arg, strides))
        elif v.op == "SHRINK":
            offset += sum(start * st for (start, _, _), st in zip(v.arg, strides))
            strides = tuple(st * step for st, (_, _, step) in zip(strides, v.arg))
        elif v.op == "RESHAPE":
            strides = view_strides(v.src[0].shape, strides, v.shape)
            if strides is None:
                return None
    return strides, offset


def _view(node):
    """(base, strides, offset) that read `node` from a row-major `base`, or None if a reshape would copy."""
    base, views = _view_chain(node)
    folded = _through(views, contiguous_strides(base.shape), 0)
    return None if folded is None else (base, *folded)


RECOMPUTE_MAX_OPS = 12  # an elementwise kernel this small is recomputed by each user rather than stored
MAX_KERNEL_OPS = 96  # a longer chain is cut into kernels of about this size: fusing stays linear in its length


def _cheap(kernel):
    return sum(1 for c in kernel.code if c[0] not in ("IN", "CONST")) <= RECOMPUTE_MAX_OPS


class _Builder:
    """Collects one kernel's inputs and instructions, sharing equal ones."""
    def __init__(self):
        self.srcs, self.ins, self.code, self.index = [], [], [], {}

    def emit(self, op, arg, operands, dtype):
        key = (op, arg, tuple(operands), dtype)
        if key not in self.index:
            self.index[key] = len(self.code)
            self.code.append(key)
        return self.index[key]

    def load(self, node):
        """An instruction reading `node` over the iteration shape, through its views when it has some."""
        view = _view(node)
        base, strides, offset = view if view is not None else (node, contiguous_strides(node.shape), 0)
        if base.op == "CONST" and base.buffer is None:
            if type(base.arg) is float and base.arg == 0 and math.copysign(1.0, base.arg) < 0:
                # -0.0 == 0.0 as a key, here and in every cache of a Kernel: -0.0 is NEG of 0.0, kept apart
                return self.emit("NEG", None, (self.emit("CONST", 0.0, (), base.dtype.name),), base.dtype.name)
            return self.emit("CONST", base.arg, (), base.dtype.name)
        return self.read(base, strides, offset, node.dtype.name)

    def read(self, base, strides, offset, dtype):
        """An instruction reading `base` at (strides, offset) over the iteration shape."""
        if base not in self.srcs:
            self.srcs.append(base)
        entry = (self.srcs.index(base), strides, offset)
        if entry not in self.ins:
            self.ins.append(entry)
        return self.emit("IN", self.ins.index(entry), (), dtype)

    def inline(self, kernel, srcs, views=()):
        """Copy the code of a fused elementwise kernel (reading `srcs`) into this one, its result seen through
        `views`; returns the result, or None when a view cannot fold into the kernel's loads."""
        ins = [_through(views, strides, offset) for _, strides, offset in kernel.ins]
        if None in ins:
            return None
        at = []
        for op, arg, operands, dtype in kernel.code:
            if op == "IN":
                at.append(self.read(srcs[kernel.ins[arg][0]], *ins[arg], dtype))
            else:
                at.append(self.emit(op, arg, [at[o] for o in operands], dtype))
        return at[-1]

    def node(self, shape, reduce, out_shape, dtype):
        return Node("FUSED", tuple(self.srcs), Kernel(shape, reduce, tuple(self.ins), tuple(self.code)),
                    out_shape, dtype)


def fuse(roots, max_inputs=None):
    """The fusion pass: returns new roots whose graph holds FUSED nodes instead of elementwise ops. `max_inputs`
    bounds the buffers one kernel reads (a WebGPU device binds only so many storage buffers per shader): a
    producer whose inputs would not fit is stored and read instead of inlined."""
    users = {n: len(c) for n, c in consumers(toposort(roots, stop=lambda n: n.buffer is not None)).items()}
    for r in roots:
        users[r] = users.get(r, 0) + 1  # an output is always stored
    # The rules see nodes rebuilt on already-fused sources; `origin` maps them back to the graph's own nodes
    # (hash-consing finds those again), where the user counts are.
    origin = {}

    def original(x):
        return Node(x.op, tuple(origin.get(s, s) for s in x.src), x.arg, x.shape, x.dtype)

    def fits(b, srcs, later):
        """Whether the kernel can read `srcs` too, with `later` operands still to load."""
        return max_inputs is None or len(b.srcs) + len(set(srcs) - set(b.srcs)) + later <= max_inputs

    def operand(b, src, shape, into_reduction=False, later=0):
        base, views = _view_chain(src)
        k = base.arg if base.op == "FUSED" else None
        if k is not None and k.reduce is None and len(k.code) <= MAX_KERNEL_OPS:
            cheap = _cheap(k) and not into_reduction
            # compute it here: its only user is this kernel, or recomputing it costs less than a round trip
            # through memory. Not into reductions: their loops stay scalar (C may not reorder a float sum), so
            # recomputing there costs more than it saves. Through a broadcast, only a cheap producer: each repeat
            # recomputes it.
            single = users.get(origin.get(base)) == 1 and all(users.get(origin.get(v)) == 1 for v in views)
            repeats = math.prod(shape) > math.prod(base.shape)
            if (cheap or (single and not repeats)) and fits(b, base.src, later):
                value = b.inline(k, base.src, views)
                if value is not None:
                    return value
        return b.load(src)

    def elementwise(x):
        b = _Builder()
        args = tuple(operand(b, s, x.shape, later=len(x.src) - 1 - i) for i, s in enumerate(x.src))
        b.code.append((x.op, x.arg, args, x.dtype.name))
        out = b.node(x.shape, None, x.shape, x.dtype)
        origin[out] = original(x)
        return out

    def reduction(x):
        b = _Builder()
        src = x.src[0]
        b.code.append(("COPY", None, (operand(b, src, src.shape, into_reduction=True),), src.dtype.name))
        out = b.node(src.shape, (x.op, x.arg), x.shape, x.dtype)
        origin[out] = original(x)
        return out

    def remember(x):
        if x not in origin:  # not fused, but its consumers need to find the graph's node
            origin[x] = original(x)

    pm = PatternMatcher([(Pat(Group.ELEMENTWISE, name="x"), elementwise, "fuse_elementwise"),
                         (Pat(Group.REDUCE, name="x"), reduction, "fuse_reduce"),
                         (Pat(name="x"), remember, "remember")])
    return _absorb_single_consumers(graph_rewrite(roots, pm, "fusion"), max_inputs)


def _absorb_single_consumers(roots, max_inputs):
    """Compute inside its consumer a stored elementwise kernel whose every use ended up in that one elementwise
    kernel, read where it is written. The rule above decides per use, so a value that several of the graph's nodes
    use is stored even when all of them fuse into one kernel (GELU's backward: tanh's two uses); in one kernel the
    builder shares its instructions, so it is computed once, and never written to memory and read back."""
    kept = set(roots)
    while True:
        nodes = toposort(roots, stop=lambda n: n.buffer is not None)
        users = consumers(nodes)
        changes = {}
        for c in nodes:
            if c.op != "FUSED" or c.arg.reduce is not None or c.arg.outs is not None:
                continue
            for k in c.src:
                if _absorbable(k, c, users[k], kept, max_inputs):
                    changes[c] = _absorb(c, k)
                    break
        if not changes:
            return roots
        roots = substitute(roots, changes)
        kept = set(roots)


def _absorbable(k, c, users, kept, max_inputs):
    if k.op != "FUSED" or k.arg.reduce is not None or k.arg.outs is not None or k in kept or list(users) != [c]:
        return False
    if k.shape != c.arg.shape or len(k.arg.code) + len(c.arg.code) > MAX_KERNEL_OPS:
        return False
    at = c.src.index(k)
    plain = (at, tuple(contiguous_strides(k.shape)), 0)
    if any(entry[0] == at and entry != plain for entry in c.arg.ins):  # read through a view: not here
        return False
    return max_inputs is None or len(set(c.src) - {k} | set(k.src)) <= max_inputs


def _absorb(c, k):
    """c's kernel with k's code in place of its reads of k."""
    b, at, index = _Builder(), [], c.src.index(k)
    for op, arg, operands, dtype in c.arg.code:
        if op == "IN" and c.arg.ins[arg][0] == index:
            at.append(b.inline(k.arg, k.src))
        elif op == "IN":
            src, strides, offset = c.arg.ins[arg]
            at.append(b.read(c.src[src], strides, offset, dtype))
        else:
            at.append(b.emit(op, arg, [at[o] for o in operands], dtype))
    return b.node(c.arg.shape, None, c.shape, c.dtype)


def fuse_outputs(roots):
    """Elementwise kernels that are outputs of one realize, of one shape and dtype, reading the same tensors,
    become one kernel that stores each of them (an optimizer's new parameter and moments: the parameter's kernel
    recomputes both moments, so merged they are computed once, and p, g, m, v are read once instead of three times).
    Its result holds them one after another along the first axis; each output is a slice of it."""
    groups = []  # [(shape, dtype, input) keys the group reads, its outputs], grown by union on shared inputs
    for r in dict.fromkeys(roots):
        if r.op != "FUSED" or r.arg.reduce is not None or r.arg.outs is not None or not r.shape:
            continue
        keys = {(r.shape, r.dtype, s) for s in r.src if s.numel > 1}  # (0-d inputs, the lr say, join nothing)
        joined = [g for g in groups if g[0] & keys]
        for g in joined:
            groups.remove(g)
            keys |= g[0]
        groups.append((keys, [m for g in joined for m in g[1]] + [r]))
    replace = {}
    for _, members in groups:
        if len(members) < 2 or any(m in n.src for m in members for n in members):
            continue
        shape, dtype = members[0].shape, members[0].dtype
        b = _Builder()
        outs = tuple(b.inline(m.arg, m.src) for m in members)
        merged = Node("FUSED", tuple(b.srcs), Kernel(shape, None, tuple(b.ins), tuple(b.code), outs),
                      (len(outs) * shape[0],) + shape[1:], dtype)
        for j, m in enumerate(members):
            replace[m] = build("SHRINK", merged, arg=((j * shape[0], (j + 1) * shape[0], 1),) +
                               tuple((0, n, 1) for n in shape[1:]))
    return [replace.get(r, r) for r in roots]
