"""Where the schedule puts a non-blocking all-reduce (tinyllm/schedule.py): the IALLREDUCE as soon as its input
exists, its WAIT and what reads the WAIT after every other kernel, so the all-reduce overlaps the rest of the step.
The graphs are built and scheduled, never run: no MPI needed."""
import numpy as np
import pytest

import tinyllm as tl
from tinyllm.graph import build, toposort
from tinyllm.rewrite import pipeline as P
from tinyllm.schedule import Schedule
from tinyllm.tensor import Tensor


def step_graph(order):
    """A data-parallel backward pass in miniature: h = tanh(x·W1), a gradient bucket g = 2h all-reduced without
    blocking, a longer chain c = tanh(tanh(h·W2)·W3) to overlap it with, read by two outputs (as the rest of a
    backward pass feeds the other gradients), and two updates that read the reduced bucket (two readers, so the
    WAIT belongs to no single output). `order` lists the outputs by name."""
    rng = np.random.default_rng(0)
    x, w1, w2, w3 = (tl.tensor(rng.standard_normal((4, 4)).astype(np.float32)) for _ in range(4))
    h = (x @ w1).tanh()
    started = build("IALLREDUCE", (h * 2.0).node, arg="SUM")
    reduced = Tensor._from_node(build("WAIT", started), x.device)
    c = ((h @ w2).tanh() @ w3).tanh()
    outputs = {"loss": c.sum(), "norm": (c * c).sum(), "update1": reduced + 1.0, "update2": reduced * 3.0}
    return [outputs[name].node for name in order]


def ancestors(node):
    return set(toposort([node]))


def check_placement(kernels):
    """The IALLREDUCE right after the work it needs; the WAIT and its readers last."""
    ops = [k.op for k in kernels]
    assert ops.count("IALLREDUCE") == 1 and ops.count("WAIT") == 1, ops
    start, wait = ops.index("IALLREDUCE"), ops.index("WAIT")
    needed = ancestors(kernels[start])
    early = [k.op for k in kernels[:start] if k not in needed]
    assert not early, f"kernels the all-reduce does not need ran before it starts: {early} (order {ops})"
    after = [k.op for k in kernels[wait + 1:] if kernels[wait] not in ancestors(k)]
    assert not after, f"kernels that do not need the all-reduce ran after its WAIT: {after} (order {ops})"
    assert wait > start + 1, f"nothing overlaps the all-reduce: {ops}"


ORDERS = [("loss", "norm", "update1", "update2"), ("update1", "update2", "loss", "norm"),
          ("update2", "loss", "norm", "update1")]


@pytest.mark.parametrize("order", ORDERS)
def test_iallreduce_early_wait_last(order):
    check_placement(Schedule(step_graph(order)).kernels)


@pytest.mark.parametrize("order", ORDERS)
def test_iallreduce_early_wait_last_after_the_passes(order):
    """The same after the rewrite passes (fusion) that every realize runs."""
    check_placement(Schedule(P.pipeline(step_graph(order), "schedule")).kernels)
