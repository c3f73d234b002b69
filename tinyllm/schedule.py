"""Turns the graph behind some output nodes into a linear list of kernels, with the point after which each
value is no longer needed, so a runtime can free buffers as soon as it can.

The order decides how much memory is held at once. Three rules, both deterministic and linear in the graph:
  * Deepest source first. The kernels are a depth-first walk from the outputs that visits a node's sources in
    order of decreasing height (longest path from an input). In a backward pass, a node that reads the upstream
    gradient and a forward value (say, a recomputed one) then runs the long gradient chain first and computes
    the short forward value just before its use, instead of holding it while the rest of the backward pass runs.
  * Outputs as soon as possible. Work that only an output needs (a weight gradient dW = Xᵀ·dY and the views it
    reads) runs as soon as its inputs exist, so X and dY die early rather than wait for the output's turn in the
    walk. The output is held to the end anyway. A recomputed value (a CHECKPOINT "recompute" marker) is never
    pulled early: moving it forward would undo the checkpointing.
  * Communication overlaps computation. A non-blocking all-reduce (IALLREDUCE) counts as an output for the rule
    above, so it and the work only it needs (a bucket of weight gradients) start as soon as their inputs exist;
    its WAIT, and what reads the WAIT, run after every kernel that does not need them.
"""
from .graph import consumers, toposort
from .ops import Group


def _is_input(node):
    return node.buffer is not None or node.op in Group.SOURCE  # (not `not node.src`: a FUSED node may have none)


def _heights(nodes):
    height = {}
    for n in nodes:  # sources first
        height[n] = 1 + max((height[s] for s in n.src), default=0) if not _is_input(n) else 0
    return height


def _output_work(kernels, outputs, users):
    """Kernels whose every consumer is (work for) the same one output: they can run as soon as their inputs do."""
    owner, outs = {}, set(outputs)
    for n in reversed(kernels):  # consumers first
        if n in outs or n.op == "IALLREDUCE":
            owner[n] = n
        elif users[n] and not (n.op == "CHECKPOINT" and n.arg[0] == "recompute"):
            first = owner.get(users[n][0])
            if first is not None and all(owner.get(u) is first for u in users[n]):
                owner[n] = first
    return set(owner)


def order(outputs):
    """(inputs, kernels) of the graph behind `outputs`, kernels in the memory-minded order above."""
    nodes = toposort(outputs, stop=_is_input)
    inputs = [n for n in nodes if _is_input(n)]
    height = _heights(nodes)
    # depth-first postorder, a node's sources visited deepest first (stable sort: equal heights keep their order)
    deepest_first = toposort(outputs, stop=_is_input, sources=lambda n: sorted(n.src, key=lambda s: -height[s]))
    walk = [n for n in deepest_first if not _is_input(n)]
    users = consumers(walk)
    pending = {n: len({s for s in n.src if not _is_input(s)}) for n in walk}
    early = _output_work(walk, outputs, users)
    kernels, placed = [], set()

    def place(n):
        stack = [n]
        while stack:
            n = stack.pop()
            placed.add(n)
            kernels.append(n)
            for u in reversed(users[n]):
                pending[u] -= 1
                if not pending[u] and u in early and u not in placed:
                    stack.append(u)

    for n in walk:
        if n not in placed and (n not in early or not pending[n]):
            place(n)
    return inputs, _waits_last(kernels)


def _waits_last(kernels):
    """kernels with the WAITs and everything after them in the graph moved behind the rest (order kept)."""
    late = set()
    for n in kernels:
        if n.op == "WAIT" or any(s in late for s in n.src):
            late.add(n)
    if not late:
        return kernels
    return [n for n in kernels if n not in late] + [n for n in kernels if n in late]


class Schedule:
    """inputs: LOAD/CONST (and already realized) nodes; kernels: the rest, in an order that respects
    dependencies; frees[i]: values dead after kernel i; outputs: the nodes to return; fresh[i]: output i must
    not share memory with an input (it was not a view before the passes simplified it, e.g. x*1 -> x)."""
    __slots__ = ("inputs", "kernels", "frees", "outputs", "fresh", "prepared")

    def __init__(self, outputs, fresh=None):
        self.outputs = list(outputs)
        self.fresh = list(fresh) if fresh is not None else [False] * len(self.outputs)
        self.prepared = {}  # runtime name -> what that runtime made ready for this schedule (compiled kernels)
        self.inputs, self.kernels = order(self.outputs)
        last = {}
        for i, n in enumerate(self.kernels):
            for s in n.src:
                last[s] = i
        keep = set(self.outputs)
        self.frees = [[] for _ in self.kernels]
        for node, i in last.items():
            if node not in keep:
                self.frees[i].append(node)
