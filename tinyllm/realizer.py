"""`realize`: the graph behind some tensors through the rewrite pipeline (tinyllm/rewrite/pipeline.py), scheduled
and run on their runtime, the schedule cached by the graph's structure."""
import math
import time

from .replay import record
from .env import debug_level
from .graph import Node, bulk, substitute
from .ops import Group
from .rewrite.engine import trace
from .rewrite.pipeline import PASSES, pipeline
from .runtime import get as get_runtime
from .schedule import Schedule

MAX_SCHEDULES = 256
CACHE_SCHEDULES = True  # tests of the passes turn this off to see them run on every realize
_schedules = {}  # (runtime, passes, structure) -> Schedule over SLOT inputs
_known = {}  # a caller's key -> (runtime, schedule, positions of the caller's inputs that feed it, caller's data)


def structure(roots):
    """The graph behind `roots` as a hashable key in which buffers count only by shape and dtype, and the
    buffers themselves in the order the key numbers them. Equal keys mean one schedule serves both graphs."""
    index, parts, leaves = {}, [], []
    for root in roots:  # graph.toposort with inputs as stops, inlined: this runs on every step's whole graph
        stack = [(root, False)]
        while stack:
            n, expanded = stack.pop()
            if n in index:
                continue
            if n.buffer is not None or n.op == "LOAD":  # an input
                leaves.append(n)
                parts.append(("INPUT", n.shape, n.dtype))
            elif expanded:
                arg = (n.arg, math.copysign(1.0, n.arg)) if type(n.arg) is float else n.arg  # -0.0 apart from 0.0
                parts.append((n.op, arg, n.shape, n.dtype, tuple([index[s] for s in n.src])))
            else:
                stack.append((n, True))
                for s in reversed(n.src):
                    if s not in index:
                        stack.append((s, False))
                continue
            index[n] = len(parts) - 1
    return (tuple(parts), tuple(index[r] for r in roots)), leaves


def _schedule(roots, leaves, fresh, runtime):
    """Rewrite and schedule a graph whose inputs are SLOT placeholders, so the schedule holds no buffer and serves
    every later graph of the same structure."""
    slots = {leaf: Node("SLOT", (), i, leaf.shape, leaf.dtype) for i, leaf in enumerate(leaves)}
    template = pipeline(substitute(roots, slots), "schedule")
    return Schedule(pipeline(template, "lower", runtime), fresh=fresh)


def realize(*tensors):
    """Compute the values of `tensors` together: shared work is done once and buffers are freed as soon as
    nothing needs them. Realized tensors keep their graph if they need gradients, and drop it otherwise.
    Schedules (rewritten, scheduled, compiled graphs) are cached by structure: a training step that repeats
    with the same shapes runs no pass and compiles nothing again."""
    _realize(tensors)
    return tensors


@bulk
def _realize(tensors):
    """realize's work; returns (runtime, schedule, leaves, todo): the schedule that ran, the input nodes its SLOTs
    stand for (in order) and the tensors it computed, or None when nothing was to compute."""
    todo = [t for t in tensors if t.node.op != "LOAD" and t.node.buffer is None]
    if not todo:
        return None
    devices = {t.device for t in todo}
    if len(devices) > 1:
        raise RuntimeError(f"realize: tensors are on different devices {sorted(devices)}: move them with .to()")
    runtime = get_runtime(devices.pop())
    debug = debug_level()
    start, mark = time.perf_counter(), len(trace)
    roots = [t.node for t in todo]
    key, leaves = structure(roots)
    new = pipeline(roots, "values", key=key)
    if any(a is not b for a, b in zip(new, roots)):
        roots = new
        key, leaves = structure(roots)
    feeds = [leaf.buffer if leaf.buffer is not None else leaf.arg for leaf in leaves]
    found = {b.runtime.name for b in feeds} - {runtime.name}
    if found:
        raise RuntimeError(f"realize: the graph reads buffers on {sorted(found)} but runs on {runtime.name}: "
                           "move every input to one device with .to()")
    key = (runtime.name, tuple(PASSES["schedule"]), key)
    schedule = _schedules.get(key) if CACHE_SCHEDULES else None
    if schedule is None:
        schedule = _schedule(roots, leaves, [t.node.op not in Group.VIEW for t in todo], runtime)
        _schedules[key] = schedule
        while len(_schedules) > MAX_SCHEDULES:
            del _schedules[next(iter(_schedules))]  # the oldest goes first
    buffers = runtime.execute(schedule, feeds)
    if record.active is not None:
        record.active.realized(runtime, schedule, feeds, buffers, leaves)
    for t, buf in zip(todo, buffers):
        if leaves:  # a graph of constants alone belongs to no device: its node must not keep one device's buffer
            t.node.buffer = buf
        if not t.requires_grad:
            t.node = Node("LOAD", (), buf, buf.shape, buf.dtype)
    if debug:
        fired = {}
        for name, rule, _ in trace[mark:]:
            fired[(name, rule)] = fired.get((name, rule), 0) + 1
        rules = ", ".join(f"{n}.{r}×{c}" for (n, r), c in fired.items()) or "none (cached schedule)"
        print(f"[tinyllm] realize on {runtime.name}: {len(schedule.kernels)} kernels, "
              f"{(time.perf_counter() - start) * 1e3:.1f} ms; rewrites: {rules}")
        del trace[mark:]
    return runtime, schedule, leaves, todo


def remember(key, done, inputs, data=None):
    """Keep the schedule that `_realize`/`assign` just ran (`done`) under `key`, a caller's description of
    everything its graph was built from (shapes, dtypes, options, which inputs are one and the same), so that
    `rerun(key, ...)` runs it again on new values without building the graph. `inputs`: the nodes the graph was
    built over; each of the schedule's inputs must be one of them (else nothing is kept)."""
    if done is None:
        return
    runtime, schedule, leaves, _ = done
    first = {}
    for i, n in enumerate(inputs):
        first.setdefault(n, i)
    feeding = [first.get(leaf) for leaf in leaves]
    if None not in feeding:
        _known[key] = (runtime, schedule, feeding, data)
        while len(_known) > MAX_SCHEDULES:
            del _known[next(iter(_known))]  # the oldest goes first


def rerun(key, inputs):
    """(output buffers, the data remembered with it) of the schedule `remember` kept under `key`, run on the
    realized values of `inputs` (nodes, in the order remember saw them); None where there is none, an input is not
    a realized value on its runtime, tinyllm.jit records a step, or TINYLLM_DEBUG reports each realize."""
    found = _known.get(key)
    if found is None or record.active is not None or not CACHE_SCHEDULES or debug_level():
        return None
    runtime, schedule, feeding, data = found
    feeds = []
    for i in feeding:
        n = inputs[i]
        buf = n.buffer if n.buffer is not None else n.arg if n.op == "LOAD" else None
        if buf is None or buf.runtime is not runtime:
            return None
        feeds.append(buf)
    return runtime.execute(schedule, feeds), data


def assign(targets, values):
    """Give each target tensor the realized value of its new tensor, keeping the target's identity: how the
    optimizers update parameters and moments (torch updates them in place). Returns what _realize returns."""
    done = _realize(values)
    for t, v in zip(targets, values):
        if record.active is not None:
            record.active.assigned(t, v.node)
        t.node = v.node
    return done
