"""Turns the graph behind some output nodes into a linear list of kernels, with the point after which each
value is no longer needed, so a runtime can free buffers as soon as it can."""
from .graph import toposort


def _is_input(node):
    return node.buffer is not None or node.op in ("LOAD", "CONST", "SLOT")  # a FUSED node may have no sources


class Schedule:
    """inputs: LOAD/CONST (and already realized) nodes; kernels: the rest, in an order that respects
    dependencies; frees[i]: values dead after kernel i; outputs: the nodes to return; fresh[i]: output i must
    not share memory with an input (it was not a view before the passes simplified it, e.g. x*1 -> x)."""
    __slots__ = ("inputs", "kernels", "frees", "outputs", "fresh", "prepared")

    def __init__(self, outputs, fresh=None):
        self.outputs = list(outputs)
        self.fresh = list(fresh) if fresh is not None else [False] * len(self.outputs)
        self.prepared = {}  # runtime name -> what that runtime made ready for this schedule (compiled kernels)
        order = toposort(self.outputs, stop=_is_input)
        self.inputs = [n for n in order if _is_input(n)]
        self.kernels = [n for n in order if not _is_input(n)]
        last = {}
        for i, n in enumerate(self.kernels):
            for s in n.src:
                last[s] = i
        keep = set(self.outputs)
        self.frees = [[] for _ in self.kernels]
        for node, i in last.items():
            if node not in keep:
                self.frees[i].append(node)
