"""Every rewrite pass in the order it runs, by stage (docs/rewrites.md describes the stages): the one place that says
which pass runs when.

Tensor parallelism (a no-op unless a model was parallelized) splits each layer's matmuls by rank first, so the
passes after it see one rank's heads. FlashAttention runs before differentiation so that the gradient comes from
FLASH_ATTN's own rule and the backward graph never holds the T×T probabilities; it runs again on every realized
graph (inference builds no backward), before keying, because it reads the mask's values, which a keyed graph no
longer has. Autocast follows it (the attention it finds has the marked q, k and v as inputs) and also runs before
differentiation, so the gradient graph is derived from the rewritten one. The schedule and lower stages run once
per graph structure: realize caches what they make.
"""
import functools
import time
import weakref

from .. import autograd
from ..env import debug_level
from .checkpoint import checkpoint
from .cse import cse
from .engine import PatternMatcher, graph_rewrite, trace, tracing
from . import flash
from .autocast import autocast_pass
from .flash import attention_pass
from .fusion import fuse, fuse_outputs
from .layout import layout
from .pads import pads
from .rowwise import rowwise
from .simplify import simplify
from .tensor_parallel import tensor_parallel_pass as tp_pass

# stage -> (name, pass): a pass is a PatternMatcher or a function of the roots (and, in the values stage, of the
# structure key, so a pass can remember graphs on which it found nothing).
PASSES = {
    "differentiate": [("tensor_parallel", tp_pass), ("flash", attention_pass), ("autocast", autocast_pass)],
    "values": [("tensor_parallel", tp_pass), ("flash", attention_pass), ("autocast", autocast_pass)],
    "schedule": [("simplify", simplify), ("pads", pads), ("cse", cse), ("layout", layout), ("checkpoint", checkpoint)],
}


def lowering(runtime):
    """The passes that turn a scheduled graph into kernels `runtime` runs, chosen by what its kernels can do."""
    return ([("rowwise", rowwise)] if runtime.row_kernels else []) + \
        ([("fusion", functools.partial(fuse, max_inputs=runtime.max_kernel_inputs))] if runtime.fuses else []) + \
        ([("fuse_outputs", fuse_outputs)] if runtime.multi_output_kernels else [])


def passes(stage, runtime=None):
    return lowering(runtime) if stage == "lower" else PASSES[stage]


def run_passes(roots, passes, key=None):
    """Run (name, pass) pairs in order over `roots`; returns the new roots."""
    for name, pass_ in passes:
        if isinstance(pass_, PatternMatcher):
            roots = graph_rewrite(roots, pass_, name)
        else:
            roots = pass_(roots) if key is None else pass_(roots, key)
    return roots


def pipeline(roots, stage, runtime=None, key=None):
    """`roots` after the passes of `stage` (for "lower", those of `runtime`)."""
    return run_passes(roots, passes(stage, runtime), key)


_differentiated = weakref.WeakKeyDictionary()  # root -> its rewritten graph (a backward with retain_graph reuses it)
_final = weakref.WeakSet()  # rewritten graphs: the stage changes nothing more in them


def before_differentiation(root):
    """The differentiate stage on one loss, remembered per root (autograd's prepare hook)."""
    if root in _final:
        return root
    if not flash.ENABLED:  # switched off for now: nothing is remembered that would outlive the switch
        return pipeline([root], "differentiate")[0]
    done = _differentiated.get(root)
    if done is None:
        start, mark = time.perf_counter(), len(trace)
        with tracing() as fired:
            done = pipeline([root], "differentiate")[0]
        if done is not root:  # (root -> root would keep its own key alive forever)
            _differentiated[root] = done
        _final.add(done)
        if debug_level():
            del trace[mark:]  # printed here: the next realize prints only its own rewrites
            if fired:
                counts = {}
                for f in fired:
                    counts[f"{f.pass_name}.{f.rule}"] = counts.get(f"{f.pass_name}.{f.rule}", 0) + 1
                print(f"[tinyllm] before autograd, {(time.perf_counter() - start) * 1e3:.1f} ms; rewrites: "
                      + ", ".join(f"{r}×{c}" for r, c in counts.items()))
    return done


autograd.register_prepare_hook(before_differentiation)
