"""Tensor parallelism as a rewrite (Megatron-LM's scheme): each rank computes its share of a layer's columns.

Block matrix products. With W1 split by rows (output features) into the ranks' blocks W1_r, X·W1ᵀ has the column
blocks X·W1_rᵀ = H_r; an elementwise function (GELU, a bias add) acts on each block alone; with W2 split by columns
(input features) the same way, H·W2ᵀ = Σ_r H_r·W2_rᵀ: one all-reduce of the ranks' partial products gives it,
and the bias after it is added once. Attention is the same with heads for columns (heads are independent). So:

    MATMUL(x, Wᵀ) with W marked column-split   →  MATMUL(REPLICATE(x), this rank's rows of Wᵀ)   a sharded value
    an op on sharded values                    →  the same op on the shards, its other inputs sliced alike
    MATMUL contracting a sharded axis          →  ALLREDUCE(MATMUL(shard, this rank's block of the other), SUM)

REPLICATE (Megatron's f) makes the gradient of x complete on every rank; the ALLREDUCE (Megatron's g) passes its
gradient through (tinyllm/ops/collective.py). Any other computed value sliced into a region enters through
REPLICATE too; a marked parameter is sliced itself (a SHRINK under its views), constants and masks as they are.
A sharded value is an axis split into `groups` equal groups (c_attn's q, k and v: 3), each split into world-size
blocks; a rank holds its block of every group, in group order. (B, T, C) → (B, T, nh, hs) keeps whole heads on
each rank when the world size divides nh, and attention's matmuls act per head (a batch axis).

Parameters stay full-size on every rank: each reads its SHRINK, so its gradient is zero outside its block and
only its block is trained (tinyllm.distributed.tensor_parallel.gather_parameters brings the blocks together).
A region (from the column-split matmul to the all-reduce) is rewritten whole or not at all: where a sharded
value reaches an op the rules do not cover, or leaves the graph as a root (a generation cache's keys), the region
is computed in full on every rank, which is still right. The pass does nothing unless a model was parallelized.
"""
import math
import weakref
from collections import namedtuple

from .. import process_group as pg
from ..env import debug_level
from ..graph import OPS, Node, build, const, toposort
from ..ops import names
from ..ops.base import Elementwise, Identity
from . import engine

COLWISE, ROWWISE = "colwise", "rowwise"
# id(parameter) -> (weak reference to it, style, groups): by id, as a Tensor's == builds a comparison node
_marks = {}

Shard = namedtuple("Shard", "node axis groups region")  # this rank's part of a value split on `axis`
VIEWS = names("RESHAPE", "PERMUTE", "EXPAND", "DETACH", "AUTOCAST")  # what a weight passes through on its way to a matmul


def mark(param, style, groups=1):
    """Mark a weight (or a bias) for the pass: COLWISE splits its axis 0 (a Linear's output features) into
    `groups` groups of world-size blocks; ROWWISE is the weight after it (its input features split alike, found
    by the pass from the sharded value it multiplies; the mark documents it and lets tests find it)."""
    if style not in (COLWISE, ROWWISE):
        raise ValueError(f"tensor parallel: style must be {COLWISE!r} or {ROWWISE!r}, got {style!r}")
    key = id(param)
    _marks[key] = (weakref.ref(param, lambda _, key=key: _marks.pop(key, None)), style, int(groups))


def unmark(param):
    _marks.pop(id(param), None)


def marked():
    """{parameter: (style, groups)} for the live marked parameters."""
    return {p: (style, groups) for p, style, groups in ((r(), s, g) for r, s, g in list(_marks.values()))
            if p is not None}


# ---- slicing a full value to this rank's part ----
def _map_axis(shape_from, axis, shape_to, k):
    """The axis of `shape_to` (a reshape of `shape_from`) that holds `axis` of shape_from split into k equal
    blocks as whole blocks of elements, or None: the one with the same elements before it, whose size k
    divides."""
    outer = math.prod(shape_from[:axis])
    for j, size in enumerate(shape_to):
        if math.prod(shape_to[:j]) == outer and size % k == 0 and (size > 1 or k == 1):
            return j
        if math.prod(shape_to[:j + 1]) > outer:
            return None
    return None


def _shrunk(shape, axis, world):
    return shape[:axis] + (shape[axis] // world,) + shape[axis + 1:]


def block(node, axis, groups, world, rank):
    """node's part of this rank along `axis`: its block of each of `groups` groups, by SHRINK (after a reshape that
    puts the groups on an axis of their own when there are several)."""
    shape, n = node.shape, node.shape[axis]
    b = n // (groups * world)
    if groups == 1:
        return build("SHRINK", node, arg=tuple((rank * b, (rank + 1) * b, 1) if i == axis else (0, s, 1)
                                              for i, s in enumerate(shape)))
    split = shape[:axis] + (groups, world, b) + shape[axis + 1:]
    where = tuple((rank, rank + 1, 1) if i == axis + 1 else (0, s, 1) for i, s in enumerate(split))
    return build("SHRINK", node.reshape(split), arg=where).reshape(_shrunk(shape, axis, world))


def _descend(node, axis, k):
    """Follow `axis` of node down through views that keep it whole ([(view, its axis)], base, base axis): the
    slice is taken at the base, so a weight or a bias is sliced itself, not its broadcast copy."""
    path = []
    while node.buffer is None and node.op in VIEWS:
        src = node.src[0]
        if node.op in ("DETACH", "AUTOCAST"):  # (no_grad's and autocast's marks on a parameter)
            below = axis
        elif node.op == "EXPAND":
            if src.shape[axis] != node.shape[axis]:  # this axis is broadcast from size 1: nothing below to slice
                break
            below = axis
        elif node.op == "PERMUTE":
            below = node.arg[axis]
        else:
            below = _map_axis(node.shape, axis, src.shape, k)
            if below is None:
                break
        path.append((node, axis))
        node, axis = src, below
    return path, node, axis


Split = namedtuple("Split", "world rank params")  # params: the marked parameters' nodes


def _replicated(node, split):
    """node entering rank-local work through REPLICATE, so that its gradient sums the ranks' parts, as the unsplit
    graph's does; a constant, a marked parameter (its gradient is this rank's block) or a value without a
    gradient (a mask) enters as it is."""
    if node.op == "CONST" or not node.dtype.is_float or node in split.params:
        return node
    return build("REPLICATE", node)


def take(node, axis, groups, split):
    """This rank's part of the full value `node` along `axis` (groups of world-size blocks)."""
    world = split.world
    path, base, a = _descend(node, axis, groups * world)
    if base.op == "CONST" and base.buffer is None:
        new = const(base.arg, _shrunk(base.shape, a, world), base.dtype)
    elif base.op == "EXPAND" and base.buffer is None:  # axis a broadcast from size 1
        new = _replicated(base.src[0], split).expand(_shrunk(base.shape, a, world))
    else:
        new = block(_replicated(base, split), a, groups, world, split.rank)
    for view, ax in reversed(path):
        if view.op == "PERMUTE":
            new = new.permute(view.arg)
        elif view.op == "RESHAPE":
            new = new.reshape(_shrunk(view.shape, ax, world))
        elif view.op == "EXPAND":
            new = new.expand(_shrunk(view.shape, ax, world))
        else:
            new = build(view.op, new, arg=view.arg)
    return new


# ---- the rules: an op on sharded inputs ----
class _Refuse(Exception):
    """A sharded value reached an op the rules do not cover: its region stays unsplit."""


def _elementwise(node):
    cls = OPS[node.op]
    return node.op != "REPLICATE" and (issubclass(cls, (Elementwise, Identity)) or node.op == "CONTIGUOUS")


def _one_layout(shards):
    layouts = {(s.axis, s.groups) for s in shards if s is not None}
    if len(layouts) != 1:
        raise _Refuse
    return layouts.pop()


def _propagate(node, src, sh, split, region):
    """node rebuilt on its sources `src` (rewritten), of which sh[i] (a Shard or None) are sharded: a Shard, or the
    full value (the region's all-reduce)."""
    op, world = node.op, split.world
    if _elementwise(node):
        axis, groups = _one_layout(sh)
        if any(s.shape != node.shape for s in node.src):
            raise _Refuse
        ins = tuple(s.node if s is not None else take(x, axis, groups, split) for s, x in zip(sh, src))
        return Shard(Node(op, ins, node.arg, _shrunk(node.shape, axis, world), node.dtype), axis, groups, region)
    if op == "MATMUL":
        return _matmul(node, src, sh, split, region)
    if op == "CAT":  # joined along another axis (rotary embeddings' halves)
        axis, groups = _one_layout(sh)
        if node.arg == axis:
            raise _Refuse
        ins = tuple(s.node if s is not None else take(x, axis, groups, split) for s, x in zip(sh, src))
        return Shard(build("CAT", *ins, arg=node.arg), axis, groups, region)
    if len(sh) != 1:
        raise _Refuse
    s0 = sh[0]
    if op == "PERMUTE":
        axis = node.arg.index(s0.axis)
        return Shard(s0.node.permute(node.arg), axis, s0.groups, region)
    if op == "EXPAND":
        return Shard(s0.node.expand(_shrunk(node.shape, s0.axis, world)), s0.axis, s0.groups, region)
    if op == "RESHAPE":
        axis = _map_axis(node.src[0].shape, s0.axis, node.shape, s0.groups * world)
        if axis is None:
            raise _Refuse
        return Shard(s0.node.reshape(_shrunk(node.shape, axis, world)), axis, s0.groups, region)
    if op == "SHRINK":
        return _shrink(node, s0, world, region)
    if op in ("SUM", "REDUCE_MAX"):
        if s0.axis not in node.arg:
            return Shard(build(op, s0.node, arg=node.arg), s0.axis, s0.groups, region)
        if op == "SUM":  # the ranks' partial sums
            return build("ALLREDUCE", build("SUM", s0.node, arg=node.arg), arg="SUM")
    raise _Refuse


def _shrink(node, s, world, region):
    """A slice of a sharded value: whole groups of its axis (q, k or v of c_attn's output), the other axes as
    they are."""
    n = node.src[0].shape[s.axis]
    start, stop, step = node.arg[s.axis]
    per_group = n // s.groups
    if step != 1 or start % per_group or stop % per_group:
        raise _Refuse
    b = per_group // world
    arg = tuple((start // per_group * b, stop // per_group * b, 1) if i == s.axis else a
                for i, a in enumerate(node.arg))
    return Shard(build("SHRINK", s.node, arg=arg), s.axis, (stop - start) // per_group, region)


def _matmul(node, src, sh, split, region):
    """A (…, m, k) @ B (…, k, n) with A or B sharded: on a batch axis (the heads) both are; on m or n the product
    is sharded alike; on k the ranks' partial products are all-reduced."""
    nd = len(node.shape)
    sa, sb = sh
    groups = {s.groups for s in sh if s is not None}
    if len(groups) != 1:
        raise _Refuse
    groups = groups.pop()
    a_axis, b_axis = (s.axis if s is not None else None for s in sh)

    def part(i, axis):
        return sh[i].node if sh[i] is not None else take(src[i], axis, groups, split)
    if a_axis in (None, nd - 1) and b_axis in (None, nd - 2):  # the contraction axis k: partial products
        return build("ALLREDUCE", part(0, nd - 1).matmul(part(1, nd - 2)), arg="SUM")
    axis = a_axis if a_axis is not None else b_axis
    if axis < nd - 2 and a_axis in (None, axis) and b_axis in (None, axis):  # a batch axis (heads): both sliced
        return Shard(part(0, axis).matmul(part(1, axis)), axis, groups, region)
    if sb is None and a_axis == nd - 2:
        return Shard(sa.node.matmul(src[1]), axis, groups, region)
    if sa is None and b_axis == nd - 1:
        return Shard(src[0].matmul(sb.node), axis, groups, region)
    raise _Refuse


def _colwise_start(node, cols):
    """(groups) when node is x @ Wᵀ with W marked column-split (its output features on the product's last axis),
    else None."""
    if node.op != "MATMUL" or node.buffer is not None:
        return None
    b = node.src[1]
    _, base, axis = _descend(b, len(b.shape) - 1, 1)
    groups = cols.get(base)
    return groups if groups is not None and axis == 0 else None


# ---- the pass ----
class _Regions:
    """Union-find over region ids (an op that reads two regions' shards joins them), and the failed ones."""
    def __init__(self, n):
        self.parent, self.failed = list(range(n)), set()

    def find(self, r):
        while self.parent[r] != r:
            self.parent[r] = self.parent[self.parent[r]]
            r = self.parent[r]
        return r

    def join(self, rs):
        roots = sorted({self.find(r) for r in rs})
        for r in roots[1:]:
            self.parent[r] = roots[0]
            if r in self.failed:
                self.failed.add(roots[0])
        return roots[0]

    def fail(self, r):
        self.failed.add(self.find(r))

    def all_failed(self):
        return {r for r in range(len(self.parent)) if self.find(r) in self.failed}


def _rewrite(order, roots, starts, split, skip):
    """One walk: (new roots, the ids of the regions that could not be split). `starts`: {column-split matmul:
    (its region id, groups)}; those in `skip` are left unsplit."""
    regions = _Regions(len(starts))
    new, shard = {}, {}
    for n in order:
        if n.buffer is not None or not n.src:
            new[n] = n
            continue
        src = tuple(new[s] for s in n.src)
        sh = [shard.get(s) for s in n.src]
        if any(s is not None for s in sh):
            region = regions.join([s.region for s in sh if s is not None])
            try:
                out = _propagate(n, src, sh, split, region)
            except _Refuse:
                regions.fail(region)
                out = None
            if isinstance(out, Shard):
                shard[n] = out
            elif out is not None:
                new[n] = out
                continue
        elif n in starts and starts[n][0] not in skip:
            region, groups = starts[n]
            x = build("REPLICATE", src[0])
            w = take(src[1], len(n.shape) - 1, groups, split)
            shard[n] = Shard(x.matmul(w), len(n.shape) - 1, groups, region)
        new[n] = n if src == n.src else Node(n.op, src, n.arg, n.shape, n.dtype)
    for r in roots:
        if r in shard:
            regions.fail(shard[r].region)
    return [new[r] for r in roots], regions.all_failed()


def tensor_parallel_pass(roots, key=None):
    """The pass on `roots` (a list of nodes); returns `roots` itself when no marked weight is read."""
    if not _marks:
        return roots
    marks = marked()
    cols = {p.node: groups for p, (style, groups) in marks.items() if style == COLWISE}
    if not cols:
        return roots
    order = toposort(roots)
    starts = {}
    for n in order:
        groups = _colwise_start(n, cols)
        if groups is not None:
            starts[n] = (len(starts), groups)
    if not starts:
        return roots
    world, rank = pg.get_world_size(), pg.get_rank()
    split = Split(world, rank, {p.node for p in marks})
    skip = set()
    while True:  # each walk leaves out the regions an earlier one could not split, until none fails
        out, failed = _rewrite(order, roots, starts, split, skip)
        if failed <= skip:
            break
        skip |= failed
    for sink in engine._recorders + ([engine.trace] if debug_level() else []):  # as graph_rewrite's rules record
        sink.extend(engine.Fired("tensor_parallel", "split" if r not in skip else "left_whole", "MATMUL")
                    for r in range(len(starts)))
    return roots if all(a is b for a, b in zip(out, roots)) else out
