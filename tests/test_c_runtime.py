"""The C runtime's own behaviour (tinyllm/runtime/c/runtime.py, compiler.py): MATMUL through the sgemm reading
transposed and permuted views in place, the float64 fallback, the schedule cache (a repeated training step compiles
and rewrites nothing), the on-disk kernel cache under concurrent compiles, the fallback without a C compiler,
TINYLLM_DEBUG output, TINYLLM_THREADS, and peak-memory accounting.

Subprocess tests start a fresh interpreter where module state matters (the runtime reads TINYLLM_THREADS and
looks for a compiler once), each with its own TINYLLM_CACHE_DIR.
"""
import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from hypothesis import given, settings, strategies as st

import tinyllm as tl
import tinyllm.nn.functional as F
from tinyllm.graph import build
from tinyllm.rewrite import tracing
from tinyllm.runtime.c import runtime as c_runtime, compiler
from tinyllm.runtime import get as get_runtime
from tinyllm.runtime.c.runtime import CRuntime
from tinyllm.schedule import Schedule

from helpers import tiny_gpt_steps

import tinyllm.realizer as R
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MATMUL_TOL = dict(rtol=1e-5, atol=1e-5)  # float32 sgemm against a float64 product, K <= 40


def rand(*shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def run_child(code, env=None, timeout=120, args=()):
    """Run `code` in a fresh Python with tinyllm importable; returns the CompletedProcess."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("TINYLLM_DEBUG", "TINYLLM_THREADS")}
    full_env.update({"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=full_env, capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)




# ---- MATMUL ------------------------------------------------------------------------------------------------

@pytest.fixture
def sgemm_spy(monkeypatch):
    """Records every layout the sgemm path computes: (shape, strides, result) per operand, None meaning copy."""
    layouts, products = [], []
    original_layout, original_matmul = c_runtime.matrix_layout, CRuntime._matmul

    def layout(x):
        out = original_layout(x)
        layouts.append((x.shape, x.strides, out))
        return out

    def matmul(self, node, ins):
        out = original_matmul(self, node, ins)
        if out is not None:  # the sgemm ran
            products.append((ins[0].shape, ins[1].shape))
        return out
    monkeypatch.setattr(c_runtime, "matrix_layout", layout)
    monkeypatch.setitem(CRuntime.kernels, "MATMUL", matmul)
    assert get_runtime("c").lib is not None, "the prebuilt C kernels (tinyllm._kernels) is missing"
    return layouts, products


def _t(a):
    return np.swapaxes(a, -1, -2) if isinstance(a, np.ndarray) else a.transpose(-1, -2)


# name: (stored arrays, how tinyllm/NumPy views them, expected per-operand layout: "n" in place untransposed,
# "t" in place transposed, "copy" when sgemm can't read the view)
MATMUL_CASES = {
    "2d": (lambda: (rand(7, 9, seed=1), rand(9, 5, seed=2)), lambda a, b: (a, b), ("n", "n")),
    "2d_multiple_of_8": (lambda: (rand(16, 8, seed=1), rand(8, 24, seed=2)), lambda a, b: (a, b), ("n", "n")),
    "At_B": (lambda: (rand(9, 7, seed=1), rand(9, 5, seed=2)), lambda a, b: (_t(a), b), ("t", "n")),
    "A_Bt": (lambda: (rand(7, 9, seed=1), rand(5, 9, seed=2)), lambda a, b: (a, _t(b)), ("n", "t")),
    "At_Bt": (lambda: (rand(9, 7, seed=1), rand(5, 9, seed=2)), lambda a, b: (_t(a), _t(b)), ("t", "t")),
    "batched": (lambda: (rand(3, 7, 9, seed=1), rand(3, 9, 5, seed=2)), lambda a, b: (a, b), ("n", "n")),
    "batched_A_Bt": (lambda: (rand(3, 7, 9, seed=1), rand(3, 5, 9, seed=2)), lambda a, b: (a, _t(b)), ("n", "t")),
    "broadcast_batch": (lambda: (rand(4, 7, 9, seed=1), rand(1, 9, 5, seed=2)), lambda a, b: (a, b), ("n", "n")),
    "permuted_batch": (lambda: (rand(7, 3, 9, seed=1), rand(3, 9, 5, seed=2)),
                       lambda a, b: (a.transpose(1, 0, 2) if isinstance(a, np.ndarray) else a.permute(1, 0, 2), b),
                       ("n", "n")),
    "strided_slice": (lambda: (rand(7, 18, seed=1), rand(9, 5, seed=2)), lambda a, b: (a[:, ::2], b), ("copy", "n")),
    "two_batch_runs": (lambda: (rand(2, 7, 3, 9, seed=1), rand(2, 3, 9, 5, seed=2)),
                       lambda a, b: (a.transpose(0, 2, 1, 3) if isinstance(a, np.ndarray) else a.permute(0, 2, 1, 3),
                                     b), ("n", "n")),
    "heads_kt": (lambda: (rand(2, 7, 3, 4, seed=1), rand(2, 5, 3, 4, seed=2)),  # q @ kᵀ, [B, T, H, D] viewed per head
                 lambda a, b: (a.transpose(0, 2, 1, 3), b.transpose(0, 2, 3, 1)) if isinstance(a, np.ndarray)
                 else (a.permute(0, 2, 1, 3), b.permute(0, 2, 3, 1)), ("n", "t")),
    "three_batch_runs": (lambda: (rand(2, 2, 7, 3, 9, seed=1), rand(2, 2, 3, 9, 5, seed=2)),
                         lambda a, b: (a.transpose(0, 1, 3, 2, 4) if isinstance(a, np.ndarray)
                                       else a.permute(0, 1, 3, 2, 4), b.transpose(1, 0, 2, 3, 4)
                                       if isinstance(b, np.ndarray) else b.permute(1, 0, 2, 3, 4)), ("n", "copy")),
}


@pytest.mark.parametrize("name", sorted(MATMUL_CASES))
def test_matmul_reads_views_in_place_and_matches_numpy(name, sgemm_spy):
    layouts, products = sgemm_spy
    make, view, expect = MATMUL_CASES[name]
    a_np, b_np = make()
    a, b = view(tl.tensor(a_np, device="c"), tl.tensor(b_np, device="c"))
    got = (a @ b).numpy()
    va, vb = view(a_np, b_np)
    want = np.matmul(va.astype(np.float64), vb.astype(np.float64)).astype(np.float32)
    np.testing.assert_allclose(got, want, **MATMUL_TOL)
    assert len(products) == 1, f"one sgemm call expected, got {products}"
    # matrix_layout is asked once per operand, and again for a copy when sgemm could not read the view in place
    for k, (operand, want_layout) in enumerate(zip("ab", expect)):
        calls = [x for x in layouts if x[0] == products[0][k]]
        assert calls, f"operand {operand}: no layout computed"
        shape, strides, out = calls[0]
        if want_layout == "copy":
            assert len(calls) >= 2 and calls[-1][2] is not None, \
                f"operand {operand} {shape} strides {strides}: read in place, expected a copy"
        else:
            assert out is not None, f"operand {operand} {shape} strides {strides}: copied, expected in place"
            assert out[0] == (want_layout == "t"), f"operand {operand}: trans flag {out[0]}, expected {want_layout}"
            assert len(calls) == 1


def test_matmul_backward_uses_transposed_views(sgemm_spy):
    layouts, products = sgemm_spy
    a_np, b_np, up = rand(6, 9, seed=1), rand(9, 4, seed=2), rand(6, 4, seed=3)
    a, b = tl.tensor(a_np, device="c", requires_grad=True), tl.tensor(b_np, device="c", requires_grad=True)
    ((a @ b) * tl.tensor(up, device="c")).sum().backward()
    ta, tb = torch.tensor(a_np, requires_grad=True), torch.tensor(b_np, requires_grad=True)
    ((ta @ tb) * torch.tensor(up)).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), **MATMUL_TOL)
    np.testing.assert_allclose(b.grad.numpy(), tb.grad.numpy(), **MATMUL_TOL)
    assert len(products) == 3  # y, dA = dY Bᵀ, dB = Aᵀ dY
    assert all(out is not None for _, _, out in layouts), "a transposed operand was copied"
    assert sum(out[0] for _, _, out in layouts) >= 2, "dA and dB read a transposed operand"


def test_float64_matmul_falls_back_to_numpy(sgemm_spy):
    layouts, products = sgemm_spy
    a_np, b_np = rand(3, 5, 7, seed=1, dtype=np.float64), rand(7, 4, seed=2, dtype=np.float64)
    a, b = tl.tensor(a_np, device="c"), tl.tensor(b_np, device="c")
    got = (a @ b).numpy()
    assert got.dtype == np.float64 and got.shape == (3, 5, 4)
    np.testing.assert_allclose(got, np.matmul(a_np, b_np), rtol=1e-13, atol=1e-13)
    got_t = (a.transpose(-1, -2).transpose(-1, -2) @ b.T.T).numpy()
    np.testing.assert_array_equal(got_t, got)
    assert products == [] and layouts == [], "float64 went through the float32 sgemm"
    # float32 next to it still takes the sgemm
    (tl.tensor(a_np.astype(np.float32), device="c") @ tl.tensor(b_np.astype(np.float32), device="c")).numpy()
    assert len(products) == 1


def test_matmul_with_empty_and_zero_inner_dims():
    a, b = tl.tensor(np.zeros((3, 0), np.float32), device="c"), tl.tensor(np.zeros((0, 4), np.float32), device="c")
    np.testing.assert_array_equal((a @ b).numpy(), np.zeros((3, 4), np.float32))
    e = tl.tensor(np.zeros((0, 5), np.float32), device="c") @ tl.tensor(rand(5, 2), device="c")
    assert e.numpy().shape == (0, 2)


# ---- GATHER / SCATTER_ADD (runtime_c/embedding.c) ----------------------------------------------------------
# The op suite (tests/test_ops.py, each_runtime) holds their values and gradients against torch on every axis;
# these check that the C kernels are what ran, and what only they can get wrong.

def spy_handlers(monkeypatch, ops):
    """The list, filled as they run, of these ops that ran through their C handlers (not NumPy's forward)."""
    ran = []
    for op in ops:
        def spy(self, node, ins, original=CRuntime.kernels[op]):
            out = original(self, node, ins)
            if out is not None:
                ran.append(node.op)
            return out
        monkeypatch.setitem(CRuntime.kernels, op, spy)
    return ran


@pytest.fixture
def embedding_spy(monkeypatch):
    """The ops that ran through the C embedding kernels, in order."""
    return spy_handlers(monkeypatch, ("GATHER", "SCATTER_ADD"))


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_embedding_kernels_run_and_match_numpy_exactly(embedding_spy, axis):
    """Gather copies, and scatter-add sums repeated rows in index order as np.add.at does, so both are exact;
    sizes large enough that the kernels split the work over threads."""
    shape = [6, 40, 300]
    x_np = rand(*shape, seed=axis)
    idx_np = np.random.default_rng(axis).integers(-shape[axis], shape[axis], (9, 7))
    x = tl.tensor(x_np, device="c", requires_grad=True)
    index = [slice(None)] * axis + [tl.tensor(idx_np, device="c")]
    y = x[tuple(index)]
    dy_np = rand(*y.shape, seed=10 + axis)
    (y * tl.tensor(dy_np, device="c")).sum().backward()
    np.testing.assert_array_equal(y.numpy(), np.take(x_np, idx_np, axis=axis))
    expected = np.zeros_like(x_np)
    np.add.at(np.moveaxis(expected, axis, 0), idx_np, np.moveaxis(dy_np, list(range(axis, axis + 2)), [0, 1]))
    np.testing.assert_array_equal(x.grad.numpy(), expected)
    assert sorted(set(embedding_spy)) == ["GATHER", "SCATTER_ADD"]


def test_embedding_index_out_of_range_names_the_op_on_c():
    table = tl.tensor(rand(5, 3), device="c")
    with pytest.raises(IndexError, match=r"GATHER: index 5 is out of range for axis 0 of size 5"):
        table[tl.tensor(np.array([0, 5, 1]), device="c")].numpy()
    with pytest.raises(IndexError, match=r"GATHER: index -6 is out of range"):
        table[tl.tensor(np.array([-6]), device="c")].numpy()


def test_float64_embedding_gathers_in_c_and_scatters_in_numpy(embedding_spy):
    """The gather copies rows of any dtype in C; the scatter-add sums float32 only, so float64's runs in NumPy."""
    x_np = rand(5, 3, dtype=np.float64)
    idx = np.array([4, 0, 4])
    x = tl.tensor(x_np, device="c", requires_grad=True)
    got = x[tl.tensor(idx, device="c")]
    got.sum().backward()
    assert got.numpy().dtype == np.float64 and set(embedding_spy) == {"GATHER"}
    np.testing.assert_array_equal(got.numpy(), x_np[idx])
    np.testing.assert_array_equal(x.grad.numpy(), np.bincount(idx, minlength=5)[:, None] * np.ones((1, 3)))


# ---- data movement ---------------------------------------------------------------------------------------

@settings(deadline=None, max_examples=40)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=6), st.sampled_from([np.float32, np.int64, np.bool_]),
       st.data())
def test_copies_between_strided_arrays_match_numpy_exactly(shape, dtype, data):
    """runtime_c/copy.c against NumPy's assignment: any permutation and stepped slice on either side, any dtype
    size, up to six axes (more than the four the kernel takes once merged: NumPy does those)."""
    from tinyllm.runtime.c.copy import copy_into
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 32 - 1)))

    def strided(fill):
        perm = data.draw(st.permutations(range(len(shape))))
        steps = [data.draw(st.integers(1, 2)) for _ in shape]
        base_shape = [shape[p] * steps[i] for i, p in enumerate(perm)]
        base = (rng.standard_normal(base_shape) * 5).astype(dtype) if fill else np.zeros(base_shape, dtype)
        view = base[tuple(slice(None, None, st_) for st_ in steps)]
        return view.transpose(np.argsort(perm))
    src, dst = strided(True), strided(False)
    assert src.shape == dst.shape == tuple(shape)
    want = dst.copy()
    want[...] = src
    copy_into(get_runtime("c"), dst, src)
    np.testing.assert_array_equal(dst, want)


def test_movement_ops_copy_through_the_c_kernel(monkeypatch):
    """CONTIGUOUS, CAT, PAD and a reshape that cannot be a view run on runtime_c/copy.c, with torch's values and
    gradients."""
    ran = spy_handlers(monkeypatch, ("CONTIGUOUS", "CAT", "PAD", "RESHAPE"))
    a_np, b_np = rand(4, 6, 5, seed=1), rand(4, 2, 5, seed=2)
    w_np, v_np = rand(4, 5, 8, seed=3), rand(5, 2, 6, seed=4)

    def run(lib, device):
        a, b = (lib.tensor(x, device=device, requires_grad=True) for x in (a_np, b_np))
        y = lib.cat([a.permute(0, 2, 1), b.permute(0, 2, 1)], dim=2).reshape(4, 40)  # strided CAT, then a reshape
        z = a.permute(2, 0, 1).contiguous()[:, 1:3]  # its gradient is a PAD
        loss = (y.reshape(4, 5, 8) * lib.tensor(w_np, device=device)).sum() + \
            (z * lib.tensor(v_np, device=device)).sum()
        loss.backward()
        return [t.detach().numpy() for t in (y, z, a.grad, b.grad)]
    for got, want in zip(run(tl, "c"), run(torch, "cpu")):  # a.grad adds three parts, in another order than torch
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    # a RESHAPE the passes leave to copy (they fold most into kernels' loads), run as scheduled
    flat = build("RESHAPE", tl.tensor(a_np, device="c").permute(0, 2, 1).node, arg=(4, 30))
    got = get_runtime("c").execute(Schedule([flat]))[0].numpy()
    np.testing.assert_array_equal(got, a_np.transpose(0, 2, 1).reshape(4, 30))
    assert set(ran) == {"CONTIGUOUS", "CAT", "PAD", "RESHAPE"}, ran


# ---- the schedule cache -------------------------------------------------------------------------------------

def test_repeated_training_step_compiles_nothing_and_runs_no_pass(monkeypatch, tmp_path):
    monkeypatch.setenv("TINYLLM_CACHE_DIR", str(tmp_path))
    loads, passes = [], []
    original_load, original_pipeline = compiler.load, R.pipeline

    def load(sources, *cpu):
        loads.append(sorted(sources))
        return original_load(sources, *cpu)

    def pipeline(roots, stage, *a, **k):
        if stage != "values":  # (runs on every realize, before the cache lookup)
            passes.append(stage)
        return original_pipeline(roots, stage, *a, **k)
    monkeypatch.setattr(compiler, "load", load)
    monkeypatch.setattr(R, "pipeline", pipeline)
    rng = np.random.default_rng(0)
    tl.manual_seed(0)
    # widths no other test uses, so the first step's schedules and kernels are new in this process
    model = tl.nn.Sequential(tl.nn.Linear(11, 19), tl.nn.GELU(approximate="tanh"), tl.nn.LayerNorm(19),
                             tl.nn.Linear(19, 6)).to("c")
    opt = tl.optim.AdamW(model.parameters(), lr=1e-2)
    x = tl.tensor(rng.standard_normal((13, 11)).astype(np.float32), device="c")
    y = tl.tensor(rng.integers(0, 6, 13), device="c")

    def step():
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()

    losses = [step()]
    assert loads and passes, "the first step compiled nothing: the test is not measuring anything"
    # the second step's optimizer update differs from the first (the Adam moments were constants, now buffers)
    losses.append(step())
    for _ in range(2):
        loads.clear(), passes.clear()
        with tracing() as fired:
            losses.append(step())
        assert loads == [], f"a repeated step compiled {loads}"
        assert passes == [], "a repeated step ran the rewrite passes"
        assert fired == [], f"a repeated step fired rewrites: {fired[:5]}"
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_same_structure_new_data_reuses_the_schedule_small_kernels_serve_every_shape(monkeypatch):
    loads = []
    original_load = compiler.load
    monkeypatch.setattr(compiler, "load", lambda s, *cpu: loads.append(len(s)) or original_load(s, *cpu))

    def f(a):
        x = tl.tensor(a, device="c")
        return ((x * 1.75).exp() - x.amax(-1, keepdim=True)).sum(0).numpy()
    first = f(rand(5, 13, seed=1))
    n = len(loads)
    second = f(rand(5, 13, seed=2))
    assert len(loads) == n, "same structure, new values: compiled again"
    assert not np.array_equal(first, second)
    a = rand(6, 13, seed=3)
    third = f(a)
    assert len(loads) == n, "a new shape of small kernels' structure: shape-generic kernels, nothing to compile"
    np.testing.assert_allclose(third, (np.exp(a * 1.75) - a.max(-1, keepdims=True)).sum(0), rtol=1e-5)
    f(rand(300, 130, seed=4))
    assert len(loads) == n + 1, "kernels of 32768 iterations or more have their shape compiled in"


# ---- the on-disk kernel cache ----------------------------------------------------------------------------

CONCURRENT_CHILD = """
import json, os, sys, time
import numpy as np
import tinyllm as tl
from tinyllm.runtime.c import compiler
built = []
original = compiler._build
def build(source, path):
    built.append(os.path.basename(path))
    return original(source, path)
compiler._build = build
x = tl.tensor(np.arange(96, dtype=np.float32).reshape(8, 12) / 50, device="c")
barrier, me = sys.argv[1], sys.argv[2]
open(os.path.join(barrier, me), "w").close()
deadline = time.time() + 60
while len(os.listdir(barrier)) < 2:  # start compiling together
    if time.time() > deadline:
        sys.exit("barrier timed out")
    time.sleep(0.0005)
y = ((x * 0.37).exp() + 1.5).tanh().sum(-1) * x.amax(-1)
print(json.dumps({"built": built, "y": y.numpy().tolist()}))
"""


def test_two_processes_compiling_the_same_kernel_both_succeed(tmp_path):
    cache, barrier = tmp_path / "cache", tmp_path / "barrier"
    barrier.mkdir()
    env = {**os.environ, "TINYLLM_CACHE_DIR": str(cache), "PYTHONPATH": ROOT}
    env.pop("TINYLLM_DEBUG", None)
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT_CHILD, str(barrier), str(i)], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    # both really compiled (neither found the other's library already there), the same library
    assert results[0]["built"] and results[0]["built"] == results[1]["built"], results
    x = np.arange(96, dtype=np.float64).reshape(8, 12) / 50
    want = np.tanh(np.exp(x * 0.37) + 1.5).sum(-1) * x.max(-1)
    for r in results:
        np.testing.assert_allclose(r["y"], want, rtol=1e-5)
    files = sorted(os.listdir(cache / "kernels"))
    assert files == sorted(set(results[0]["built"])), f"cache holds {files}: temporary files left behind?"
    # a third process finds the library and compiles nothing
    out = subprocess.run([sys.executable, "-c", CONCURRENT_CHILD, str(barrier), "2"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    third = json.loads(out.stdout.strip().splitlines()[-1])
    assert third["built"] == [] and third["y"] == results[0]["y"]


def _scale_source(name, header, factor):
    """A kernel that includes `header` by its absolute path, as generated kernels include c_math.h."""
    return (f'#include "{header}"\nvoid {name}(char **bufs) {{\n  float *restrict out = (float *)bufs[0];\n'
            f"  const float *restrict s0 = (const float *)bufs[1];\n"
            f"  for (long i = 0; i < 8; i++) out[i] = s0[i] * {float(factor)}f;\n}}\n")


def _call(fn, x):
    out = np.empty_like(x)
    fn(compiler.ffi.new("char *[]", [compiler.ffi.from_buffer(out), compiler.ffi.from_buffer(x)]))
    return out


def test_a_cached_kernel_is_found_whatever_it_was_compiled_with(monkeypatch, tmp_path):
    """Kernels compiled together in one library are each found again alone, and in another company, without
    compiling (a test run alone, or in another order, reuses the suite's kernels)."""
    if not compiler.available():
        pytest.skip("no C compiler")
    monkeypatch.setenv("TINYLLM_CACHE_DIR", str(tmp_path))
    built = []
    original = compiler._build
    monkeypatch.setattr(compiler, "_build", lambda source, library: built.append(library) or original(source, library))
    header = os.path.join(ROOT, "tinyllm", "runtime", "c", "c_math.h")
    sources = {f"kcache{i}": _scale_source(f"kcache{i}", header, i + 2) for i in range(10)}
    x = np.arange(8, dtype=np.float32)
    first = compiler.load(sources)
    assert len(built) == 2, f"10 new kernels: two libraries expected, built {built}"
    for i in range(10):
        np.testing.assert_array_equal(_call(first[f"kcache{i}"], x), x * (i + 2))
    built.clear()
    alone = compiler.load({"kcache7": sources["kcache7"]})
    mixed = compiler.load({n: sources[n] for n in ("kcache0", "kcache3", "kcache8")})
    assert built == [], f"kernels in the cache compiled again: {built}"
    np.testing.assert_array_equal(_call(alone["kcache7"], x), x * 9)
    np.testing.assert_array_equal(_call(mixed["kcache8"], x), x * 10)
    # a new kernel beside cached ones: only it is compiled
    fresh = compiler.load({"kcache3": sources["kcache3"], "kcache99": _scale_source("kcache99", header, 0.5)})
    assert len(built) == 1
    np.testing.assert_array_equal(_call(fresh["kcache99"], x), x * 0.5)


def test_the_cache_key_names_headers_by_contents_not_path(tmp_path):
    """Two checkouts at different paths (each CI run clones anew) share their kernels; an edited header does not."""
    header = os.path.join(ROOT, "tinyllm", "runtime", "c", "c_math.h")
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "c_math.h").write_bytes(open(header, "rb").read())
    (b / "c_math.h").write_bytes(open(header, "rb").read())
    cpu = compiler.path()
    key = lambda h, factor=2: compiler.library_path(_scale_source("k", str(h), factor), cpu)  # noqa: E731
    assert key(a / "c_math.h") == key(b / "c_math.h") == key(header)
    assert key(a / "c_math.h", 2) != key(a / "c_math.h", 3)
    (b / "c_math.h").write_bytes(open(header, "rb").read() + b"\n/* edited */\n")
    compiler._headers.clear()  # (read once per process: headers do not change under a running program)
    assert key(a / "c_math.h") != key(b / "c_math.h")


# ---- no C compiler ----------------------------------------------------------------------------------------

NO_CC_CHILD = """
import json, warnings
import numpy as np
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import tinyllm as tl
    from tinyllm.runtime import get
    from tinyllm.runtime.c import compiler
    x = tl.tensor(np.arange(12, dtype=np.float32).reshape(3, 4) / 7, device="c")
    w = tl.tensor(np.linspace(-1, 1, 20, dtype=np.float32).reshape(4, 5), device="c")
    out = {
        "chain": ((x.exp() * 2.0 + 1.0).tanh() - x.T.T).numpy(),
        "rows": (x * x).sum(-1).numpy(),
        "cols": x.amax(0).numpy(),
        "softmax": x.softmax(-1).numpy(),
        "matmul": (x @ w).numpy(),
        "loss": ((x @ w) ** 2).mean().numpy(),
    }
print(json.dumps({
    "compiles": get("c").compiles, "compiler": compiler.compiler(),
    "warnings": [[c.category.__name__, str(c.message)] for c in caught],
    "values": {k: v.tolist() for k, v in out.items()}, "shapes": {k: list(v.shape) for k, v in out.items()},
}))
"""


@pytest.fixture(scope="module")
def no_compiler(tmp_path_factory):
    """The child's view without a compiler: CC names a missing program and PATH holds no cc, gcc or clang."""
    empty = tmp_path_factory.mktemp("empty_path")
    proc = run_child(NO_CC_CHILD, env={"CC": str(empty / "no-such-cc"), "PATH": str(empty),
                                       "TINYLLM_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _no_cc_expected():
    x = np.arange(12, dtype=np.float64).reshape(3, 4) / 7
    w = np.linspace(-1, 1, 20, dtype=np.float32).reshape(4, 5).astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return {"chain": np.tanh(np.exp(x) * 2 + 1) - x, "rows": (x * x).sum(-1), "cols": x.max(0),
            "softmax": e / e.sum(-1, keepdims=True), "matmul": x @ w, "loss": ((x @ w) ** 2).mean()}


def test_without_a_compiler_warns_once_and_computes_through_numpy(no_compiler):
    assert no_compiler["compiler"] is None and no_compiler["compiles"] is False
    warned = [m for cat, m in no_compiler["warnings"] if cat == "RuntimeWarning" and "compiler" in m]
    assert len(warned) == 1, no_compiler["warnings"]
    assert "no C compiler" in warned[0] and "CC" in warned[0] and "gcc" in warned[0]
    for k, want in _no_cc_expected().items():
        np.testing.assert_allclose(np.asarray(no_compiler["values"][k]).reshape(np.shape(want)), want, rtol=1e-5,
                                   atol=1e-6, err_msg=k)


def test_without_a_compiler_results_keep_their_shapes(no_compiler):
    want = {k: list(np.shape(v)) for k, v in _no_cc_expected().items()}
    assert no_compiler["shapes"] == want


# ---- TINYLLM_DEBUG ---------------------------------------------------------------------------------------

KERNEL_LINE = re.compile(r"^\[tinyllm c\] (.+?)\s+(\([\d, ]*\))\s+([\d.]+) µs$")


def _fresh_constant():
    """A constant no earlier graph used, so its kernel is compiled (and, at TINYLLM_DEBUG=2, printed) now."""
    return 1.0 + float(np.random.default_rng().random())


def test_debug_1_prints_each_kernel_with_shape_and_time(monkeypatch, capsys, c_schedules):
    monkeypatch.setenv("TINYLLM_DEBUG", "1")
    c = _fresh_constant()
    x = tl.tensor(rand(5, 7), device="c")
    w = tl.tensor(rand(7, 3, seed=1), device="c")
    out = ((x * c).exp().sum(-1, keepdim=True) * (x @ w)).numpy()
    assert out.shape == (5, 3)
    text = capsys.readouterr().out
    lines = [m.groups() for m in map(KERNEL_LINE.match, text.splitlines()) if m]
    kernels = c_schedules[-1].kernels
    assert len(lines) == len(kernels), text
    for (what, shape, micros), node in zip(lines, kernels):
        assert what.startswith(node.op), (what, node.op)
        assert shape == str(node.shape)
        assert float(micros) >= 0
    assert any(w.startswith("FUSED[") and "SUM" in w for w, _, _ in lines)
    assert any(w == "MATMUL" for w, _, _ in lines)
    assert re.search(rf"\[tinyllm\] realize on c: {len(kernels)} kernels, [\d.]+ ms; rewrites: ", text), text
    assert "#include" not in text and float(c).hex() not in text, "level 1 printed C source"


def test_debug_2_prints_generated_c_source(monkeypatch, capsys):
    monkeypatch.setenv("TINYLLM_DEBUG", "2")
    c = _fresh_constant()
    x = tl.tensor(rand(4, 6), device="c")
    got = (x * c).tanh().sum(0).numpy()
    text = capsys.readouterr().out
    np.testing.assert_allclose(got, np.tanh(rand(4, 6).astype(np.float64) * c).sum(0), rtol=1e-5)
    assert "#include \"" in text and re.search(r"void k[0-9a-f]+\(char \*\*bufs\)", text), text
    assert float(c).hex() in text, "the kernel's constant is not in the printed source"
    assert "tl_tanhf" in text
    assert KERNEL_LINE.search(text) or any(KERNEL_LINE.match(line) for line in text.splitlines())


# ---- TINYLLM_THREADS --------------------------------------------------------------------------------------

THREADS_CHILD = """
import sys
import cffi
import numpy as np
import tinyllm as tl
from tinyllm.runtime import get
rng = np.random.default_rng(0)
a = tl.tensor(rng.standard_normal((256, 320)).astype(np.float32), device="c")
b = tl.tensor(rng.standard_normal((320, 288)).astype(np.float32), device="c")
v = tl.tensor(rng.standard_normal((1, 768)).astype(np.float32), device="c")
w = tl.tensor(rng.standard_normal((768, 1024)).astype(np.float32), device="c")
outs = {
    "elementwise": ((a * 1.3).exp().tanh() + a).numpy(),
    "rows": (a.exp() * a).sum(-1).numpy(),
    "cols": (a.tanh() * 2.0).sum(0).numpy(),
    "amax_cols": a.amax(0).numpy(),
    "softmax": a.softmax(-1).numpy(),
    "matmul": (a @ b).numpy(),
    "matmul_t": (a.T @ a).numpy(),
    "gemv_rows": (v @ w).numpy(),  # a row times a K x N weight: sums split along K (gemv.c)
}
ffi = cffi.FFI()
ffi.cdef("int omp_get_max_threads(void);")
omp = ffi.dlopen("libgomp.so.1").omp_get_max_threads()
np.savez(sys.argv[1], omp=omp, sgemm=get("c").lib.tl_get_num_threads(), **outs)
"""


def test_threads_1_and_2_give_identical_results(tmp_path):
    cache = str(tmp_path / "cache")
    results = {}
    for n in (1, 2):
        path = str(tmp_path / f"threads{n}.npz")
        proc = run_child(THREADS_CHILD, env={"TINYLLM_THREADS": str(n), "TINYLLM_CACHE_DIR": cache}, args=(path,))
        assert proc.returncode == 0, proc.stderr
        results[n] = dict(np.load(path))
    assert int(results[1]["omp"]) == 1 and int(results[2]["omp"]) == 2, "TINYLLM_THREADS did not set OpenMP's threads"
    assert int(results[1]["sgemm"]) == 1 and int(results[2]["sgemm"]) == 2, "TINYLLM_THREADS did not reach the sgemm"
    for k in set(results[1]) - {"omp", "sgemm"}:
        np.testing.assert_array_equal(results[1][k], results[2][k], err_msg=f"{k}: 1 thread vs 2")
    a = np.random.default_rng(0).standard_normal((256, 320))
    np.testing.assert_allclose(results[1]["rows"], (np.exp(a) * a).sum(-1), rtol=1e-4)


# ---- memory ----------------------------------------------------------------------------------------------

def test_peak_memory_counts_a_big_intermediate_on_c():
    a = tl.tensor(rand(512, 1), device="c")
    b = tl.tensor(rand(1, 512, seed=1), device="c")
    a.numpy(), b.numpy()
    tl.reset_peak_memory_stats()
    base = tl.max_memory_allocated()
    assert base == tl.memory_allocated()
    s = (a @ b).sum()  # the 512 x 512 product (1 MiB) is a buffer of its own
    np.testing.assert_allclose(s.item(), float((rand(512, 1).astype(np.float64) @ rand(1, 512, seed=1)).sum()),
                               rtol=1e-4)
    assert tl.max_memory_allocated() - base >= 512 * 512 * 4
    after = tl.memory_allocated()
    assert after - base < 512 * 512 * 4, "the intermediate was not freed"


@pytest.mark.parametrize("device", ["numpy", "c"])
def test_fused_elementwise_intermediates_take_no_memory(device):
    """exp, tanh and the sum run as one kernel on c: no (512, 512) intermediate is ever allocated; on the NumPy
    runtime each op's result is a buffer."""
    x = tl.tensor(rand(512, 512), device=device)
    x.numpy()
    tl.reset_peak_memory_stats()
    base = tl.max_memory_allocated()
    got = (x.exp().tanh() * 3.0).sum(-1).numpy()
    grew = tl.max_memory_allocated() - base
    big = 512 * 512 * 4
    if device == "c":
        assert grew < big, f"{grew} bytes at the peak: an intermediate was stored"
    else:
        assert grew >= 2 * big
    np.testing.assert_allclose(got, (np.tanh(np.exp(rand(512, 512).astype(np.float64))) * 3).sum(-1), rtol=1e-4)


def test_buffer_pool_stays_bounded_over_training_steps(monkeypatch):
    """The pool takes back only the buffers it handed out: arrays an op's NumPy forward made (the padded gradient
    of FLASH_ATTN's packed output, say) have shapes no kernel asks the pool for, and would pile up step by step.
    Replays off: every kernel takes its array from the pool (with replays, tests/test_c_program.py)."""
    rt = get_runtime("c")
    monkeypatch.setattr(rt, "replays", False)
    rt.empty_cache()  # spare buffers an earlier test left (of a shape a step takes and frees) would drain away
    pooled = [sum(a.nbytes for free in rt.pool.values() for a in free) for _ in tiny_gpt_steps(6, "c")]
    assert pooled[1] == pooled[2] == pooled[3] == pooled[4] == pooled[5], pooled


# ---- devices share graph nodes ------------------------------------------------------------------------------

@pytest.mark.parametrize("first,second", [("numpy", "c"), ("c", "numpy")])
def test_a_constant_expression_realized_on_one_device_does_not_leak_into_another(first, second):
    """Nodes are hash-consed without a device: a graph of constants realized on one device must not keep that
    device's buffer on the shared node, where the same expression built on another device would find it."""
    v = 0.123456789 + (first == "c")  # constants no other test uses: the shared nodes are made here
    x1 = tl.tensor(np.ones(3, np.float32), device=first)
    a = tl.full((3,), v, device=first).exp()
    b = a * x1    # b's graph keeps a's node alive
    a.numpy()     # realizing a must not leave a buffer of `first` on that node
    y = tl.full((3,), v, device=second).exp() + tl.tensor(np.ones(3, np.float32), device=second)
    np.testing.assert_allclose(y.numpy(), np.exp(np.float32(v)) + 1, rtol=1e-6)
    np.testing.assert_allclose(b.numpy(), np.exp(np.float32(v)), rtol=1e-6)


def test_the_c_kernel_table_holds_every_prebuilt_and_generated_kernel():
    """Each op the C runtime runs in C is in its kernel table (runtime.base.kernels("c")), registered by the module
    that holds its kernel: an op missing here would silently run its NumPy forward instead. The host ops
    (Group.HOST, tinyllm.linalg's decompositions) are in it as recorded host calls of their NumPy forward."""
    from tinyllm.ops import Group
    expected = {"FUSED", "MATMUL", "GATHER", "SCATTER_ADD", "WAIT", "FLASH_ATTN", "FLASH_ATTN_BWD", "QMATMUL",
                "CONTIGUOUS", "RESHAPE", "CAT", "PAD"} | Group.COLLECTIVE | Group.HOST
    assert set(CRuntime.kernels) == expected, sorted(set(CRuntime.kernels) ^ expected)
