"""Realization: rewrite the graph behind some tensors, schedule it and run it on their runtime."""
import time

from .env import debug_level
from .graph import Node
from .rewrite.engine import graph_rewrite, trace
from .rewrite.simplify import simplify
from .rewrite.cse import cse
from .runtime import get as get_runtime
from .schedule import Schedule
from .views import VIEW_OPS

# The passes every realize runs, in order. Later passes (fusion, FlashAttention, checkpointing) join this list.
PASSES = [("simplify", simplify), ("cse", cse)]


def run_passes(roots, passes=None):
    for name, pm in PASSES if passes is None else passes:
        roots = graph_rewrite(roots, pm, name)
    return roots


def realize(*tensors):
    """Compute the values of `tensors` together: shared work is done once and buffers are freed as soon as
    nothing needs them. Realized tensors keep their graph if they need gradients, and drop it otherwise."""
    todo = [t for t in tensors if t.node.op != "LOAD" and t.node.buffer is None]
    if not todo:
        return tensors
    devices = {t.device for t in todo}
    if len(devices) > 1:
        raise RuntimeError(f"realize: tensors are on different devices {sorted(devices)}: move them with .to()")
    runtime = get_runtime(devices.pop())
    debug = debug_level()
    start, mark = time.perf_counter(), len(trace)
    roots = run_passes([t.node for t in todo])
    schedule = Schedule(roots, fresh=[t.node.op not in VIEW_OPS for t in todo])
    found = schedule.devices() - {runtime.name}
    if found:
        raise RuntimeError(f"realize: the graph reads buffers on {sorted(found)} but runs on {runtime.name}: "
                           "move every input to one device with .to()")
    buffers = runtime.execute(schedule)
    for t, buf in zip(todo, buffers):
        t.node.buffer = buf
        if not t.requires_grad:
            t.node = Node("LOAD", (), buf, buf.shape, buf.dtype)
    if debug:
        fired = {}
        for name, rule, _ in trace[mark:]:
            fired[(name, rule)] = fired.get((name, rule), 0) + 1
        rules = ", ".join(f"{n}.{r}×{c}" for (n, r), c in fired.items()) or "none"
        print(f"[tinyllm] realize on {runtime.name}: {len(schedule.kernels)} kernels, "
              f"{(time.perf_counter() - start) * 1e3:.1f} ms; rewrites: {rules}")
        del trace[mark:]
    return tensors
