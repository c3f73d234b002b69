"""The WGSL runtime's own behaviour (tinyllm/runtime/wgsl/: runtime.py, device.py, render.py; wgsl/*.wgsl):
the adapter and its features, dtypes it refuses or narrows, the matmul template on every operand layout and tile
shape, workgroup reductions with IEEE specials, NaN in comparisons, index errors reported from the GPU, f16 where
the adapter has it, one submit per schedule, pooled buffers and cached pipelines. The op suite (test_ops.py) and
the GPT parity suite (test_gpt_parity.py) run on this runtime too, through conftest's `each_runtime`.

Tolerances: float32 results against NumPy in float64 at rtol 1e-5 (sums in another order); f16 at the rounding
of f16 (2⁻¹¹ relative) times a few for the accumulated rounding of the inputs.
"""
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, strategies as st

import tinyllm as tl
from tinyllm.runtime.wgsl import runtime as wgsl_runtime
from tinyllm.runtime.wgsl import render
from conftest import wgsl_skip_reason
from helpers import wgsl_f16_or_skip

if not os.environ.get("CI") and wgsl_skip_reason():
    pytest.skip(wgsl_skip_reason(), allow_module_level=True)

RT = tl.runtime.get("wgsl")
SEEDS = st.integers(0, 2**32 - 1)


def on_gpu(*arrays):
    return [tl.tensor(a, device="wgsl") for a in arrays]


def test_every_primitive_has_a_wgsl_kernel():
    """No op falls back to running on the host (a read-back and an upload each time): each one the graph can hold
    has a kernel, or is fused (elementwise ops and reductions), or is an input, or is a host op by design
    (Group.HOST: tinyllm.linalg's decompositions, through LAPACK on every runtime)."""
    from tinyllm.graph import OPS
    from tinyllm.ops import Group
    assert set(OPS) - set(wgsl_runtime.KERNELS) - Group.ELEMENTWISE - Group.REDUCE - Group.HOST == Group.SOURCE


def test_adapter_info_and_features():
    info = RT.info
    assert info["device"] and info["backend"] in ("Vulkan", "Metal", "D3D12", "OpenGL", "OpenGLES", "GL")
    # the feature is used wherever the adapter offers it: float16 tests skip on a missing feature, never a lost one
    assert RT.has_f16 == ("shader-f16" in RT.features) == ("shader-f16" in RT.gpu.adapter.features)
    assert RT.gpu.limits["max-storage-buffers-per-shader-stage"] >= 8  # WebGPU's default, or what the adapter gave
    print(f"\n[wgsl] {RT!r}, features {RT.features}")


def test_float64_is_refused_clearly():
    with pytest.raises(TypeError, match="no float64.*float\\(\\)"):
        tl.tensor(np.zeros(3), dtype=tl.float64, device="wgsl")


def test_int64_outside_32_bits_is_refused_and_inside_round_trips():
    big = np.array([0, 2**31], np.int64)
    with pytest.raises(OverflowError, match="32-bit"):
        tl.tensor(big, device="wgsl")
    ok = np.array([-2**31, -5, 0, 2**31 - 1], np.int64)
    got = tl.tensor(ok, device="wgsl").numpy()
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, ok)


def test_bool_and_int_kernels():
    a, b = np.array([[1, -2, 3], [4, 0, -6]]), np.array([True, False, True])
    ta, tb = on_gpu(a, b)
    np.testing.assert_array_equal((ta * 3 - 1).numpy(), a * 3 - 1)
    np.testing.assert_array_equal(((ta > 0) & tb).numpy(), (a > 0) & b)
    np.testing.assert_array_equal(ta.amax(1).numpy(), a.max(1))
    np.testing.assert_array_equal(tb.float().numpy(), b.astype(np.float32))


@st.composite
def matmul_case(draw):
    """Shapes around the tile edges and both layouts of each operand (transposes are read in place)."""
    m, k, n = (draw(st.sampled_from([1, 3, 4, 16, 17, 33, 64])) for _ in range(3))
    batch = draw(st.sampled_from([(), (2,), (2, 3)]))
    return batch, m, k, n, draw(st.booleans()), draw(st.booleans()), draw(st.booleans())


@given(case=matmul_case(), seed=SEEDS, tiles=st.sampled_from([None, "16x16x16x1x1", "32x32x16x2x2", "64x64x16x4x4",
                                                                       "128x128x16x8x8"]))
def test_matmul_layouts_and_tiles(case, seed, tiles):
    batch, m, k, n, trans_a, trans_b, broadcast_b = case
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(batch + ((k, m) if trans_a else (m, k))).astype(np.float32)
    b = rng.standard_normal(((1,) * len(batch) if broadcast_b else batch) + ((n, k) if trans_b else (k, n)))
    b = b.astype(np.float32)
    ta, tb = on_gpu(a, b)
    ta, tb = (ta.mT if trans_a else ta), (tb.mT if trans_b else tb)
    na, nb = (np.swapaxes(a, -1, -2) if trans_a else a), (np.swapaxes(b, -1, -2) if trans_b else b)
    old = os.environ.get("TINYLLM_WGSL_MATMUL_TILE")
    try:
        if tiles:
            os.environ["TINYLLM_WGSL_MATMUL_TILE"] = tiles
        got = (ta @ tb).numpy()
    finally:
        os.environ.pop("TINYLLM_WGSL_MATMUL_TILE", None)
        if old is not None:
            os.environ["TINYLLM_WGSL_MATMUL_TILE"] = old
    want = np.matmul(na.astype(np.float64), nb.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(k))


def test_matmul_vec4_and_scalar_loads_both_used():
    """Row-major operands with sizes divisible by 4 load vec4s; other layouts fall back to scalar loads."""
    src, _ = render.render_matmul(1, 16, 16, 16, ("k", 16, 0, 0), ("r", 16, 0, 0), "float32", (16, 16, 16, 1, 1))
    assert "array<vec4<f32>>" in src
    src, _ = render.render_matmul(1, 17, 16, 17, ("k", 17, 0, 0), ("r", 17, 0, 0), "float32", (16, 16, 16, 1, 1))
    assert "array<vec4<f32>>" not in src


@pytest.mark.parametrize("shape,axes", [((3, 1000), (1,)), ((1000, 3), (0,)), ((4, 50, 6), (0, 2)), ((700,), (0,)),
                                        ((5, 0), (1,))])
def test_reductions_serial_and_workgroup(shape, axes):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    (t,) = on_gpu(x)
    np.testing.assert_allclose(t.sum(axes).numpy(), x.astype(np.float64).sum(axes), rtol=1e-5, atol=1e-5)
    if x.size:
        np.testing.assert_array_equal(t.amax(axes).numpy(), x.max(axes))


def test_ieee_specials_through_kernels():
    x = np.float32([[0.0, -np.inf, np.inf, 1.0], [np.nan, 2.0, -1.0, -np.inf]] + [[0.5] * 4] * 40)
    (t,) = on_gpu(x)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(t.exp().numpy(), np.exp(x), rtol=1e-6)  # inf, 0 and NaN exactly
        np.testing.assert_array_equal(t.amax(0).numpy(), x.max(0))  # NaN wins, as NumPy's max (workgroup path)
        np.testing.assert_array_equal(t.amax(1).numpy(), x.max(1))  # (serial path)
        np.testing.assert_allclose(t.tanh().numpy()[:2], np.tanh(x[:2]), rtol=1e-6)
        # (not checked: x·0 for infinite x. WGSL lets drivers assume finite values, and lavapipe folds x·0 to 0)
    masked = tl.tensor(np.float32([[1.0, -np.inf, 2.0]]), device="wgsl").softmax(-1).numpy()
    assert masked[0, 1] == 0.0 and abs(masked.sum() - 1) < 1e-6


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_nan_in_comparisons_max_and_where(dtype):
    """NaN compares and wins as in NumPy on every backend. A shader compiler may assume no NaN: Mesa's OpenGL path
    turns `select(b, a, a < b)` into a min, which returns the operand that is not NaN, and so dropped a NaN there
    and the first NaN of a max from -inf. The kernels test for NaN on the bits, so Vulkan (lavapipe) and OpenGL
    (llvmpipe) agree with NumPy; CI runs this file on both."""
    if dtype is np.float16:
        wgsl_f16_or_skip()
    vals = np.array([np.nan, -np.inf, np.inf, 0.0, 1.0, -2.0], dtype)
    a, b = (np.ascontiguousarray(g) for g in np.meshgrid(vals, vals, indexing="ij"))  # every pair
    ta, tb = on_gpu(a, b)
    with np.errstate(all="ignore"):
        for got, want in [(ta < tb, a < b), (ta > tb, a > b), (ta == tb, a == b), (ta != ta, a != a),
                          ((ta < tb).where(ta, tb), np.where(a < b, a, b)),
                          ((ta > tb).where(ta, tb), np.where(a > b, a, b)),
                          (ta.maximum(tb), np.maximum(a, b)), (ta.minimum(tb), np.minimum(a, b)),
                          (ta.amax(1), a.max(1)), (ta.amax(0), a.max(0)), (ta.amin(0), a.min(0))]:
            np.testing.assert_array_equal(got.numpy(), want)


def test_out_of_range_index_is_an_index_error():
    x, idx = on_gpu(np.arange(12, dtype=np.float32).reshape(4, 3), np.array([0, 7]))
    with pytest.raises(IndexError, match="GATHER.*out of range"):
        x[idx].numpy()
    np.testing.assert_array_equal(x[on_gpu(np.array([-1, 1]))[0]].numpy(), [[9, 10, 11], [3, 4, 5]])


def test_f16_cast_elementwise_and_matmul():
    wgsl_f16_or_skip()
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((33, 20)).astype(np.float32), rng.standard_normal((20, 17)).astype(np.float32)
    ha, hb = (t.to(tl.float16) for t in on_gpu(a, b))
    a16, b16 = a.astype(np.float16).astype(np.float64), b.astype(np.float16).astype(np.float64)
    assert ha.dtype is tl.float16 and ha.numpy().dtype == np.float16
    np.testing.assert_array_equal(ha.numpy(), a.astype(np.float16))
    h = ha @ hb
    assert h.dtype is tl.float16
    np.testing.assert_allclose(h.float().numpy(), a16 @ b16, rtol=4e-3, atol=4e-3)
    np.testing.assert_allclose((ha * 2 + 1).tanh().float().numpy(), np.tanh(a16 * 2 + 1), rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(ha.sum(1).float().numpy(), a16.sum(1), rtol=4e-3, atol=4e-3)


@pytest.mark.parametrize("autocast", [False, True])
def test_f16_matmul_accumulates_in_f32(autocast):
    """A float16 MATMUL (float16 operands, or float32 ones under autocast(float16)) reads f16 operands, stages them
    in f32 workgroup tiles and accumulates in f32, rounding to f16 once at the store: K = 4096 products of ones
    give 4096 (an f16 running sum stops at 2048, where adding 1 rounds back), and random products in [0, 1) give
    the f16 rounding of the exact dot product within one f16 ulp (an f16 running sum is off by tens of them)."""
    wgsl_f16_or_skip()
    k = 4096
    rng = np.random.default_rng(0)
    a = np.concatenate([np.ones((1, k)), rng.random((7, k))]).astype(np.float16)
    b = np.concatenate([np.ones((k, 1)), rng.random((k, 8))], 1).astype(np.float16)
    dtypes = []
    original = render.render_matmul

    def spy(*args):
        dtypes.append(args[6])
        return original.__wrapped__(*args)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(render, "render_matmul", spy)
        if autocast:
            with tl.autocast(device_type="wgsl", dtype=tl.float16):
                got = (tl.tensor(a.astype(np.float32), device="wgsl") @ tl.tensor(b.astype(np.float32), device="wgsl"))
            got = got.numpy().astype(np.float16)
        else:
            got = (tl.tensor(a, device="wgsl") @ tl.tensor(b, device="wgsl")).numpy()
    assert dtypes == ["float16"]
    exact = a.astype(np.float64) @ b.astype(np.float64)
    assert got[0, 0] == 4096
    ulp = np.spacing(np.abs(exact).astype(np.float16)).astype(np.float64)
    assert np.all(np.abs(got.astype(np.float64) - exact) <= ulp)
    running = np.float16(0)  # what an f16 accumulator gives, for the contrast the docstring draws
    for x, y in zip(a[1], b[:, 1]):
        running = np.float16(running + x * y)
    assert abs(float(running) - exact[1, 1]) > 8 * ulp[1, 1]


def test_float16_without_shader_f16_is_stored_only(monkeypatch):
    """An adapter without shader-f16 (Mesa's OpenGL llvmpipe; simulated here on any adapter) stores float16, reads
    it back, sorts it and uses it as QMATMUL's scales (kernels that read the halves' bits), and refuses a kernel
    that computes in float16, naming the feature."""
    from tinyllm import quantization as Q
    from tinyllm.graph import build
    monkeypatch.setattr(RT, "has_f16", False)
    monkeypatch.setattr(RT.gpu, "has_f16", False)
    # the check is made when a pipeline is compiled: f16 pipelines compiled earlier are set aside meanwhile
    cached = {k: RT.gpu.pipelines.pop(k) for k in list(RT.gpu.pipelines) if "enable f16;" in k[0]}
    try:
        a = np.array([1.5, -0.0, 65504, 6e-8, np.nan, -2.0, 0.0], np.float16)
        t = tl.tensor(a, device="wgsl")
        assert t.dtype is tl.float16
        np.testing.assert_array_equal(t.numpy(), a)
        np.testing.assert_array_equal(t.argsort().numpy(), np.argsort(a, kind="stable"))
        for computes in (lambda: t * 2, lambda: t.float(), lambda: t.to(tl.float32) + 1):
            with pytest.raises(TypeError, match="float16 needs the adapter feature shader-f16, which .* lacks"):
                computes().numpy()
        rng = np.random.default_rng(5)
        w, x = rng.standard_normal((6, 8)).astype(np.float32), rng.standard_normal((3, 8)).astype(np.float32)
        q, scales = Q.quantize(w, "int8", 4)
        assert scales.dtype == np.float16
        X, qw, sc = on_gpu(x)[0], tl.Tensor(q, device="wgsl"), tl.Tensor(scales, device="wgsl")
        y = X._make(build("QMATMUL", X.node, qw.node, sc.node, arg=("int8", 4))).numpy()
        dequant = q.astype(np.float64) * np.repeat(scales.astype(np.float64), 4, axis=1)
        np.testing.assert_allclose(y, x @ dequant.T, rtol=1e-5, atol=1e-5)
    finally:
        RT.gpu.pipelines.update(cached)


def test_one_submit_per_schedule_and_cached_pipelines():
    x, w = on_gpu(np.ones((8, 8), np.float32), np.ones((8, 8), np.float32))

    def step():
        return ((x @ w).relu() * 2).sum().numpy()

    step()  # compiles
    pipelines, submits, dispatches = len(RT.gpu.pipelines), RT.gpu.submits, []
    original = RT.gpu.dispatch
    RT.gpu.dispatch = lambda *a: dispatches.append(a) or original(*a)
    plans, RT.plans = RT.plans, None  # (the kernels' own path: a replayed plan dispatches without Device.dispatch)
    try:
        assert step() == 8 * 8 * 8 * 2
    finally:
        del RT.gpu.dispatch
        RT.plans = plans
    assert len(dispatches) >= 2 and RT.gpu.submits == submits + 1, "all kernels of one realize in one submit"
    assert len(RT.gpu.pipelines) == pipelines, "a repeated step compiled a pipeline again"


def test_buffers_are_pooled_across_steps():
    x = on_gpu(np.ones((64, 64), np.float32))[0]
    ((x * 2).exp() @ x).numpy()
    created = []
    original = RT.gpu.device.create_buffer
    RT.gpu.device.create_buffer = lambda **kw: created.append(kw) or original(**kw)
    try:
        for _ in range(3):
            ((x * 2).exp() @ x).numpy()
    finally:
        del RT.gpu.device.create_buffer
    assert not created, f"steps after the first allocated {len(created)} new GPU buffers"


def test_ops_without_a_kernel_run_on_the_host_with_a_warning(monkeypatch):
    monkeypatch.setattr(RT, "warned", set())
    monkeypatch.delitem(wgsl_runtime.KERNELS, "GATHER")
    x, idx = on_gpu(np.arange(6, dtype=np.float32).reshape(3, 2), np.array([2, 0]))
    with pytest.warns(RuntimeWarning, match="no kernel for op GATHER"):
        got = (x[idx] * 1.5).numpy()
    np.testing.assert_array_equal(got, [[6, 7.5], [0, 1.5]])


def run_python(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def test_unknown_adapter_name_lists_the_adapters():
    proc = run_python("import tinyllm.runtime as r; r.get('wgsl')", TINYLLM_WGPU_ADAPTER="no-such-gpu")
    assert proc.returncode != 0 and "matches no adapter" in proc.stderr and "found:" in proc.stderr


def test_no_adapter_is_a_clear_error_not_a_hang():
    """Vulkan alone, with no Vulkan driver: the error names what to install (timeout=120 above guards a hang)."""
    code = ("import time, tinyllm as tl\nt = time.perf_counter()\ntry:\n    tl.tensor([1.0], device='wgsl')\n"
            "except RuntimeError as e:\n    print(f'{time.perf_counter() - t:.2f}', e)")
    proc = run_python(code, TINYLLM_WGPU_BACKEND="vulkan", VK_ICD_FILENAMES="/nonexistent.json",
                      VK_DRIVER_FILES="/nonexistent.json")
    assert "mesa-vulkan-drivers" in proc.stdout, proc.stdout + proc.stderr
    print(f"\n[wgsl] no adapter: error after {proc.stdout.split()[0]} s")
