"""docs/rewrites.md's table of stages lists the passes pipeline.py runs, in its order (PASSES; lowering, from
what each runtime's kernels can run)."""
import os
import re

from tinyllm.rewrite.pipeline import PASSES, lowering
from tinyllm.runtime.c.runtime import CRuntime
from tinyllm.runtime.numpy.runtime import NumpyRuntime
from tinyllm.runtime.wgsl.runtime import WGSLRuntime

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "rewrites.md")
RUNTIMES = {"C": CRuntime, "WGSL": WGSLRuntime, "NumPy": NumpyRuntime}  # classes: their capabilities, no device


def table():
    with open(DOC, encoding="utf-8") as f:
        rows = re.findall(r"^\| `(\w+)` \|[^|]*\|[^|]*\| (.+?) \|$", f.read(), re.M)
    return dict(rows)


def test_the_stages_table_lists_pipeline_passes_in_order():
    doc = table()
    for stage, passes in PASSES.items():
        assert doc.get(stage) == ", ".join(name for name, _ in passes), (stage, doc.get(stage))
    every = type("Every", (), dict(row_kernels=True, fuses=True, multi_output_kernels=True, max_kernel_inputs=None))
    order = [name for name, _ in lowering(every)]  # each lowering pass, in order, with the runtimes that get it
    want = ", ".join(f"{name} ({', '.join(l for l, c in RUNTIMES.items() if name in dict(lowering(c)))})"
                     for name in order)
    assert doc.get("lower") == want, (doc.get("lower"), want)
    assert set(doc) == set(PASSES) | {"lower"}, sorted(doc)
