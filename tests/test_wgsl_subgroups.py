"""Workgroup reductions with and without subgroup operations (wgsl/reduce_subgroup.wgsl, reduce_tree.wgsl): the
fused reductions (wgsl/reduce.wgsl) and the row kernels (row_reduce.wgsl: softmax, log_softmax, layer_norm) on both
paths against NumPy, NaN and -inf rows included; the subgroup path where the adapter has the feature `subgroup`
(lavapipe does, with subgroups of 8; wgpu's OpenGL backend does not, so there only the tree path runs), the tree path
everywhere (the runtime's feature list without "subgroup"). Replayed schedules (plan.py) are off, so each case
renders its kernels for the path it asks for.

Tolerances as tests/test_wgsl_rowwise.py's and test_wgsl_runtime.py's: float32 at rtol 1e-4 and atol 1e-5 times
the size of the inputs (sums in another order than NumPy's); maxima exactly.
"""
import contextlib
import math
import os

import numpy as np
import pytest
from hypothesis import given, strategies as st

import tinyllm as tl
import tinyllm.nn.functional as F
from tinyllm.runtime.wgsl import render, rowwise
from conftest import wgsl_skip_reason

if not os.environ.get("CI") and wgsl_skip_reason():
    pytest.skip(wgsl_skip_reason(), allow_module_level=True)

pytestmark = pytest.mark.wgsl
RT = tl.runtime.get("wgsl")
SEEDS = st.integers(0, 2**32 - 1)
SHUFFLE = "subgroupShuffleXor"  # in a source: the subgroup path


def skip_without(path):
    """Skip the subgroup path where the adapter lacks the feature (the runtime asks for it wherever offered)."""
    if path == "subgroup" and "subgroup" not in RT.features:
        pytest.skip(f"the WGSL adapter {RT.info['device']} via {RT.info['backend']} lacks the subgroup feature")


class Path:
    """Runs kernels on one reduction path, recording their sources: "subgroup" (skipped where the adapter lacks the
    feature) or "tree" (the feature hidden from the runtime). width: a fixed workgroup width for every reduction
    (None: the runtime's), e.g. one smaller than the subgroup."""

    def __init__(self, mp, path, width=None):
        skip_without(path)
        self.path, self.sources = path, []
        mp.setattr(RT, "features", [f for f in RT.features if path == "subgroup" or f != "subgroup"])
        mp.setattr(RT, "plans", None)
        if width:
            mp.setattr(rowwise, "workgroup_width", lambda rt, n: width)
            mp.setattr(render, "reduce_width", lambda n_red: width)
        render.render.cache_clear()  # (sources are cached by their arguments, which the width is not one of)
        dispatch = RT.dispatch

        def spy(source, *args, **kwargs):
            self.sources.append(source)
            return dispatch(source, *args, **kwargs)
        mp.setattr(RT, "dispatch", spy)

    def check_rendered(self, marker, expected=True):
        """Every kernel containing `marker` (a reduction function's name) used this path's reduction, and (where
        expected) there was one."""
        ours = [s for s in self.sources if marker in s]
        assert ours or not expected
        assert all((SHUFFLE in s) == (self.path == "subgroup") for s in ours)
        self.sources.clear()


@contextlib.contextmanager
def on_path(name, width=None):
    """A Path for the block; the small one (width 4) is smaller than lavapipe's subgroups of 8, so that each
    subgroup is partial (a real GPU may have subgroups of up to 128)."""
    try:
        with pytest.MonkeyPatch.context() as mp:
            yield Path(mp, name, width)
    finally:
        render.render.cache_clear()


PATHS = pytest.mark.parametrize("name,width", [("subgroup", None), ("tree", None), ("subgroup", 4)],
                                ids=["subgroup", "tree", "partial-subgroups"])


# row lengths: 1, odd ones, around and past the row kernels' workgroup widths (32 up to 256) and lavapipe's
# subgroup of 8, and past 256 · 8 (several values per lane in the cross-subgroup step)
LENGTHS = [1, 2, 3, 7, 8, 9, 31, 33, 64, 100, 255, 257, 1000, 2500]


@st.composite
def rows(draw):
    """(rows, n) float32: N(0, 1) times 1 or 30, optionally with -inf entries, a row of -inf, a row with a NaN and
    a row of NaN (n > 1 for those)."""
    r, n = draw(st.integers(1, 6)), draw(st.sampled_from(LENGTHS))
    rng = np.random.default_rng(draw(SEEDS))
    x = (rng.standard_normal((r, n)) * draw(st.sampled_from([1.0, 30.0]))).astype(np.float32)
    if n > 1 and draw(st.booleans()):
        x[rng.random((r, n)) < 0.3] = -np.inf
        x[rng.integers(0, r)] = -np.inf
        x[rng.integers(0, r), rng.integers(0, n)] = np.nan
        x[rng.integers(0, r)] = np.nan
    return x


def close(got, want, x, what, spread=1.0):
    """At rtol 1e-4 and atol 1e-5 times the size of x's finite values over `spread` (layer_norm: its smallest row
    deviation, as test_wgsl_rowwise.py)."""
    scale = (1 + float(np.max(np.abs(x[np.isfinite(x)]), initial=0))) / min(spread, 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * scale, err_msg=what)


def softmax_ref(x):
    with np.errstate(all="ignore"):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True), (x - x.max(-1, keepdims=True)) - np.log(e.sum(-1, keepdims=True))


def layer_norm_ref(x, w, b, eps=1e-5):
    with np.errstate(all="ignore"):
        x = x.astype(np.float64)
        c = x - x.mean(-1, keepdims=True)
        return c / np.sqrt((c * c).mean(-1, keepdims=True) + eps) * w + b


def check_row_kernels(path, x):
    want_sm, want_lsm = softmax_ref(x)
    t = tl.tensor(x, device="wgsl")
    close(F.softmax(t, -1).numpy(), want_sm, x, "softmax")
    path.check_rendered("row_max", x.shape[-1] > 1)  # (softmax of one is 1)
    close(F.log_softmax(t, -1).numpy(), want_lsm, x, "log_softmax")
    rng = np.random.default_rng(1)
    w, b = (rng.standard_normal(x.shape[-1]).astype(np.float32) for _ in range(2))
    got = F.layer_norm(t, (x.shape[-1],), tl.tensor(w, device="wgsl"), tl.tensor(b, device="wgsl")).numpy()
    finite = np.isfinite(x).all(-1)
    spread = float(np.sqrt(x[finite].astype(np.float64).var(-1) + 1e-5).min()) if finite.any() else 1.0
    close(got[finite], layer_norm_ref(x, w, b)[finite], x[finite], "layer_norm", spread)
    assert np.isnan(got[~finite]).all()
    path.check_rendered("row_sum", x.shape[-1] > 1)


@PATHS
@given(x=rows())
def test_row_kernels(name, width, x):
    with on_path(name, width) as path:
        check_row_kernels(path, x)


@st.composite
def reductions(draw):
    """(array, axis) with more than render.SERIAL_REDUCE_MAX elements reduced (the workgroup kernel), float32 with
    NaN and -inf at times, or int64."""
    n, other = draw(st.sampled_from([33, 100, 257, 1000, 5000])), draw(st.sampled_from([1, 3]))
    rng = np.random.default_rng(draw(SEEDS))
    if draw(st.booleans()):
        x = rng.integers(-1000, 1000, (other, n))
    else:
        x = rng.standard_normal((other, n)).astype(np.float32)
        if draw(st.booleans()):
            x[rng.random(x.shape) < 0.01] = -np.inf
            x[0, rng.integers(0, n)] = np.nan
    return (x, 1) if draw(st.booleans()) else (np.ascontiguousarray(x.T), 0)


def check_reductions(path, x, axis):
    t = tl.tensor(x, device="wgsl")
    with np.errstate(all="ignore"):
        if x.dtype == np.float32:
            close(t.sum(axis).numpy(), x.astype(np.float64).sum(axis), x, "sum")
        else:
            np.testing.assert_array_equal(t.sum(axis).numpy(), x.sum(axis))
        path.check_rendered("workgroup_combine")
        np.testing.assert_array_equal(t.amax(axis).numpy(), x.max(axis))
    path.check_rendered("workgroup_combine")


@PATHS
@given(case=reductions())
def test_reductions(name, width, case):
    with on_path(name, width) as path:
        check_reductions(path, *case)


@pytest.mark.parametrize("name", ["subgroup", "tree"])
@pytest.mark.parametrize("shape", [(0, 100), (3, 0), (0, 0)])
def test_empty_rows_and_empty_reductions(name, shape):
    x = np.zeros(shape, np.float32)
    t = tl.tensor(x, device="wgsl")
    with on_path(name):
        if shape[-1]:  # (softmax over an empty axis is an error, as its max is)
            assert F.softmax(t, -1).numpy().shape == shape
            assert F.layer_norm(t, (shape[-1],)).numpy().shape == shape
        np.testing.assert_array_equal(t.sum(1).numpy(), x.sum(1))
        np.testing.assert_array_equal(t.sum(0).numpy(), x.sum(0))


@PATHS
def test_results_are_the_same_bits_run_to_run(name, width):
    """A fixed order of combination: the same inputs give the same bits each time."""
    x = np.random.default_rng(0).standard_normal((64, 3000)).astype(np.float32) * 10
    t = tl.tensor(x, device="wgsl")
    with on_path(name, width):
        runs = [(F.softmax(t, -1).numpy(), F.layer_norm(t, (3000,)).numpy(), t.sum(1).numpy()) for _ in range(3)]
    for later in runs[1:]:
        for a, b in zip(runs[0], later):
            np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_maxima_are_the_same_on_both_paths():
    """The subgroup path combines in another order than the tree, which may change a sum's last bits but not a
    maximum (with no NaN or ±0 ties to pick between)."""
    x = np.random.default_rng(0).standard_normal((5, 3000)).astype(np.float32)
    got = {}
    for name in ("subgroup", "tree"):
        with on_path(name):
            got[name] = tl.tensor(x, device="wgsl").amax(1).numpy()
    np.testing.assert_array_equal(got["subgroup"], got["tree"])
    np.testing.assert_array_equal(got["tree"], x.max(1))


@pytest.mark.parametrize("name", ["subgroup", "tree"])
def test_every_width_gives_every_invocation_the_result(name):
    """Each workgroup width the runtime picks (32 to 256) and those below it down to 4 (smaller than lavapipe's
    subgroups), on either path: every invocation gets the workgroup's sum."""
    skip_without(name)
    sub = name == "subgroup"
    for width in (4, 8, 16, 32, 64, 128, 256):
        src = render.INVOCATION[sub] + "\n" + \
            f"var<workgroup> part: array<f32, {width}>;\nfn add(a: f32, b: f32) -> f32 {{ return a + b; }}\n" + \
            render.workgroup_combine("total", "f32", "add", "0.0", width, sub) + "\n" + \
            "@group(0) @binding(0) var<storage, read_write> out: array<f32>;\n" + \
            f"@compute @workgroup_size({width})\nfn main(inv: Invocation) {{\n" + \
            "  let s = total(inv, f32(inv.t));\n  out[inv.t] = s;\n}"
        out = RT.empty((width,), tl.float32)
        RT.dispatch(src, [out], (1, 1, 1))
        got = np.frombuffer(RT.gpu.download(out.storage, 4 * width), np.float32)
        np.testing.assert_array_equal(got, np.full(width, math.fsum(range(width)), np.float32))
