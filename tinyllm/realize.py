"""Realization: rewrite the graph behind some tensors, schedule it and run it on their runtime."""
import time

from . import capture
from .env import debug_level
from .graph import Node, substitute, toposort
from .rewrite.engine import graph_rewrite, trace
from .rewrite.simplify import simplify
from .rewrite.cse import cse
from .rewrite.pads import pads
from .rewrite.layout import layout
from .rewrite.checkpoint import checkpoint
from .rewrite.flash import attention_pass
from .runtime import get as get_runtime
from .schedule import Schedule
from .views import VIEW_OPS

# The passes every realize runs, in order; a runtime adds its own after them (fusion on C and WGSL).
PASSES = [("simplify", simplify), ("pads", pads), ("cse", cse), ("layout", layout), ("checkpoint", checkpoint)]
MAX_PLANS = 256
CACHE_PLANS = True  # tests of the passes turn this off to see them run on every realize
_plans = {}  # (runtime, structure) -> Schedule over SLOT inputs
# Passes that read input values (FlashAttention checks that a mask buffer is causal), so they run on the graph
# itself before it is keyed: fn(roots, structure key) -> new roots, or `roots` itself when nothing changed.
VALUE_PASSES = [attention_pass]


def run_passes(roots, passes=None):
    """Run rewrite passes in order: each is (name, PatternMatcher) or (name, function of the roots)."""
    for name, pass_ in PASSES if passes is None else passes:
        roots = pass_(roots) if callable(pass_) else graph_rewrite(roots, pass_, name)
    return roots


def _is_input(node):
    return node.buffer is not None or node.op == "LOAD"


def structure(roots):
    """The graph behind `roots` as a hashable key in which buffers count only by shape and dtype, and the
    buffers themselves in the order the key numbers them. Equal keys mean one plan serves both graphs."""
    index, parts, leaves = {}, [], []
    for n in toposort(roots, stop=_is_input):
        if _is_input(n):
            leaves.append(n)
            parts.append(("INPUT", n.shape, n.dtype))
        else:
            parts.append((n.op, n.arg, n.shape, n.dtype, tuple(index[s] for s in n.src)))
        index[n] = len(parts) - 1
    return (tuple(parts), tuple(index[r] for r in roots)), leaves


def _plan(roots, leaves, fresh, runtime):
    """Rewrite and schedule a graph whose inputs are SLOT placeholders, so the plan holds no buffer and serves
    every later graph of the same structure."""
    slots = {leaf: Node("SLOT", (), i, leaf.shape, leaf.dtype) for i, leaf in enumerate(leaves)}
    template = substitute(roots, slots)
    return Schedule(run_passes(template, PASSES + list(runtime.passes)), fresh=fresh)


def realize(*tensors):
    """Compute the values of `tensors` together: shared work is done once and buffers are freed as soon as
    nothing needs them. Realized tensors keep their graph if they need gradients, and drop it otherwise.
    Plans (rewritten, scheduled, compiled graphs) are cached by structure: a training step that repeats
    with the same shapes runs no pass and compiles nothing again."""
    todo = [t for t in tensors if t.node.op != "LOAD" and t.node.buffer is None]
    if not todo:
        return tensors
    devices = {t.device for t in todo}
    if len(devices) > 1:
        raise RuntimeError(f"realize: tensors are on different devices {sorted(devices)}: move them with .to()")
    runtime = get_runtime(devices.pop())
    debug = debug_level()
    start, mark = time.perf_counter(), len(trace)
    roots = [t.node for t in todo]
    key, leaves = structure(roots)
    for value_pass in VALUE_PASSES:
        new = value_pass(roots, key)
        if new is not roots:
            roots = new
            key, leaves = structure(roots)
    feeds = [leaf.buffer if leaf.buffer is not None else leaf.arg for leaf in leaves]
    found = {b.runtime.name for b in feeds} - {runtime.name}
    if found:
        raise RuntimeError(f"realize: the graph reads buffers on {sorted(found)} but runs on {runtime.name}: "
                           "move every input to one device with .to()")
    key = (runtime.name, tuple(PASSES), key)
    schedule = _plans.get(key) if CACHE_PLANS else None
    if schedule is None:
        schedule = _plan(roots, leaves, [t.node.op not in VIEW_OPS for t in todo], runtime)
        _plans[key] = schedule
        while len(_plans) > MAX_PLANS:
            del _plans[next(iter(_plans))]  # the oldest plan goes first
    buffers = runtime.execute(schedule, feeds)
    if capture.active is not None:
        capture.active.realized(runtime, schedule, feeds, buffers)
    for t, buf in zip(todo, buffers):
        if leaves:  # a graph of constants alone belongs to no device: its node must not keep one device's buffer
            t.node.buffer = buf
        if not t.requires_grad:
            t.node = Node("LOAD", (), buf, buf.shape, buf.dtype)
    if debug:
        fired = {}
        for name, rule, _ in trace[mark:]:
            fired[(name, rule)] = fired.get((name, rule), 0) + 1
        rules = ", ".join(f"{n}.{r}×{c}" for (n, r), c in fired.items()) or "none (cached plan)"
        print(f"[tinyllm] realize on {runtime.name}: {len(schedule.kernels)} kernels, "
              f"{(time.perf_counter() - start) * 1e3:.1f} ms; rewrites: {rules}")
        del trace[mark:]
    return tensors


def assign(targets, values):
    """Give each target tensor the realized value of its new tensor, keeping the target's identity: how the
    optimizers update parameters and moments (torch updates them in place)."""
    realize(*values)
    for t, v in zip(targets, values):
        if capture.active is not None:
            capture.active.assigned(t, v.node)
        t.node = v.node
