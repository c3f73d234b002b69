"""ARGSORT's WGSL kernel (runtime/wgsl_sort.py, wgsl/argsort.wgsl): tensor.argsort on the WGSL runtime gives exactly
NumPy's stable argsort (descending: value descending, ties in their original order, NaN first), for float32,
float16, int64 and bool, in one block pass and through the multi-pass path (long rows; a tiny block forces it on
short ones), and never falls back to the host."""
import os
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tinyllm as tl
from tinyllm.runtime.wgsl import sort as wgsl_sort
from tinyllm.runtime.wgsl.runtime import WGSLRuntime
from conftest import wgsl_skip_reason

if not os.environ.get("CI") and wgsl_skip_reason():
    pytest.skip(wgsl_skip_reason(), allow_module_level=True)

SEEDS = st.integers(0, 2**32 - 1)


@pytest.fixture(scope="module", autouse=True)
def on_gpu_only():
    """Every sort here runs on the WGSL runtime, and a host fallback for ARGSORT fails the test (the runtime warns
    about a fallback only once per op, so the warning alone could be missed)."""
    original = WGSLRuntime.on_host

    def no_host(self, node, ins):
        if node.op == "ARGSORT":
            raise AssertionError(f"ARGSORT of {node.src[0].shape} {node.src[0].dtype} ran on the host")
        return original(self, node, ins)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TINYLLM_RUNTIME", "wgsl")
        mp.setattr(WGSLRuntime, "on_host", no_host)
        yield


def reference(a, axis, descending):
    """NumPy's stable argsort; descending as ARGSORT's forward: the reversed axis sorted ascending, read backwards."""
    if not descending:
        return np.argsort(a, axis=axis, kind="stable")
    n = a.shape[axis]
    return (n - 1) - np.flip(np.argsort(np.flip(a, axis), axis=axis, kind="stable"), axis)


def check(a, axis, descending, dtype=None):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "runs it on the host" is a RuntimeWarning: an error here
        got = tl.tensor(a, dtype=dtype, device="wgsl").argsort(axis, descending=descending).numpy()
    want = reference(a, axis, descending)
    np.testing.assert_array_equal(got, want, err_msg=f"argsort of {a.shape} {a.dtype} along {axis}, "
                                                     f"descending={descending}")


def values(rng, shape, kind, dtype=np.float32):
    """Normal floats, small integers (many ties), or ties mixed with NaN, ±inf and ±0."""
    if kind == "normal":
        return rng.standard_normal(shape).astype(dtype)
    a = rng.integers(-3, 4, shape).astype(dtype)
    if kind == "special":
        specials = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0], dtype)
        mask = rng.random(shape) < 0.4
        a[mask] = rng.choice(specials, int(mask.sum()))
    return a


@st.composite
def row_shapes(draw):
    """(shape, axis): 1 to 3 axes, the sorted one 1..70 long, the others 1..4."""
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    axis = draw(st.integers(0, len(shape) - 1))
    shape[axis] = draw(st.integers(1, 70))
    return tuple(shape), axis


@settings(max_examples=50)
@given(shape_axis=row_shapes(), kind=st.sampled_from(["normal", "ties", "special"]), descending=st.booleans(),
       tiny_block=st.booleans(), seed=SEEDS)
def test_random_shapes(shape_axis, kind, descending, tiny_block, seed):
    """tiny_block sorts in blocks of 4, so rows past 4 take the multi-pass path (a step pass per step across blocks)."""
    shape, axis = shape_axis
    a = values(np.random.default_rng(seed), shape, kind)
    with pytest.MonkeyPatch.context() as mp:
        if tiny_block:
            mp.setattr(wgsl_sort, "MAX_BLOCK", 4)
        check(a, axis, descending)


@pytest.mark.parametrize("descending", [False, True])
def test_special_floats(descending):
    a = np.array([0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 1e-45, -1e-45, 1.0, -1.0, 3e38, -3e38, 0.0, np.nan],
                 np.float32)
    check(a, 0, descending)


@pytest.mark.parametrize("descending", [False, True])
def test_float16(descending):
    """Also where the adapter lacks shader-f16: the kernel reads the halves' bits from u32 words."""
    rng = np.random.default_rng(1)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 6e-8, -6e-8, 65504, -65504], np.float16)
    check(specials, 0, descending, tl.float16)
    for shape, axis in (((3, 33), 1), ((5, 4, 3), 0)):  # odd lengths: halves at either end of a 32-bit word
        check(values(rng, shape, "special", np.float16), axis, descending, tl.float16)


@pytest.mark.parametrize("descending", [False, True])
def test_int64_and_bool(descending):
    rng = np.random.default_rng(2)
    extremes = np.array([2**31 - 1, -2**31, 0, -1, 1, 5, -2**31, 2**31 - 1, 7])
    check(extremes, 0, descending)
    check(rng.integers(-5, 5, (4, 37)), 1, descending)
    check(rng.random((6, 19)) < 0.5, 0, descending)


@pytest.mark.parametrize("descending", [False, True])
def test_long_rows(descending):
    """A row of the GPT vocabulary (50257: padded to 65536, several step passes) and a batch of 3000-long rows."""
    rng = np.random.default_rng(3)
    check(values(rng, (50257,), "special"), 0, descending)
    check(values(rng, (4, 3000), "ties"), 1, descending)
    check(values(rng, (3000, 4), "normal"), 0, descending)  # the sorted axis strided


def test_views_and_degenerate_shapes():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((5, 9)).astype(np.float32)
    np.testing.assert_array_equal(tl.tensor(a, device="wgsl").T.argsort(1).numpy(),
                                  np.argsort(a.T, 1, kind="stable"))  # a transposed view is copied first
    np.testing.assert_array_equal(tl.tensor(np.float32(3), device="wgsl").argsort().numpy(), 0)
    check(np.ones((3, 1), np.float32), 1, False)
    check(np.ones((0, 4), np.float32), 1, True)


def test_topk_of_vocabulary_row():
    """Top-k sampling's use: the 50 largest of a vocabulary row, with their values, on the GPU."""
    logits = np.random.default_rng(5).standard_normal((2, 50257)).astype(np.float32)
    values_, indices = tl.tensor(logits, device="wgsl").topk(50)
    want = np.argsort(-logits, axis=1, kind="stable")[:, :50]
    np.testing.assert_array_equal(indices.numpy(), want)
    np.testing.assert_array_equal(values_.numpy(), np.take_along_axis(logits, want, 1))
