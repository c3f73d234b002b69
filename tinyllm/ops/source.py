"""Where values come from: realized buffers and constants. Neither has inputs, so neither passes a gradient
further; each runtime makes their values itself (a buffer it already holds, a constant it never stores)."""
from .base import Source, register


@register
class LOAD(Source):
    """A realized buffer (its `arg`): a leaf of the graph, made by the runtime, never built."""
    def infer(src, arg): raise TypeError("LOAD nodes are made from buffers by the runtime, not built")
    def forward(arg): return arg.data
    def backward(dy, y): return ()


@register
class CONST(Source):
    """One value (its `arg`) over a whole shape: costs no memory; made by `graph.const`, never built."""
    def infer(src, arg): raise TypeError("CONST nodes are made by graph.const, not built")
    def forward(arg): return arg
    def backward(dy, y): return ()


@register
class SLOT(Source):
    """The `arg`-th input of a cached schedule: stands where a buffer was, so one schedule serves every step."""
    def infer(src, arg): raise TypeError("SLOT nodes are made by realize, not built")
    def forward(arg): return arg
    def backward(dy, y): return ()
