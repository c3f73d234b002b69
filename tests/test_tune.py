"""The C runtime's autotuning (tinyllm/runtime/c/tune.py): what a choice may change in a product's values (the
sgemm's and the GEMV's), the search within its budget, the stored choice applied on the next start,
TINYLLM_TUNE=0, and the search a jitted step starts by itself."""
import json
import os

import numpy as np
import pytest
from hypothesis import given, strategies as st

import tinyllm as tl
import tinyllm.runtime as runtime

RT = runtime.get("c")
if RT.lib is None:
    pytest.skip("the C kernels are not built", allow_module_level=True)
from tinyllm.runtime.c import tune  # noqa: E402
from helpers import gpt_step  # noqa: E402

LIB, FFI = RT.lib, RT.ffi


def product(ta, tb, M, N, K, a, b):
    c = np.empty((M, N), np.float32)
    LIB.tl_sgemm(ta, tb, M, N, K, FFI.from_buffer("float[]", a), M if ta else K, FFI.from_buffer("float[]", b),
                 K if tb else N, 0.0, FFI.from_buffer("float[]", c), N)
    return c


@pytest.fixture
def restored():
    """Whatever a test sets, the runtime's own configuration afterwards."""
    yield
    for path in range(3):
        LIB.tl_sgemm_set_blocking(path, 0, 0, 0)
    LIB.tl_cpu_set_path(-1)
    LIB.tl_sgemm_set_split(0)
    LIB.tl_set_num_threads(0)
    LIB.tl_gemv_set_grouping(*tune.GEMV_DEFAULT)
    tune.compiler.set_kernel_path(None)


@given(st.integers(1, 200), st.integers(1, 200), st.integers(1, 700), st.booleans(), st.booleans(),
       st.sampled_from([0.5, 2.0]), st.sampled_from([0.5, 2.0]))
def test_row_and_column_blocks_leave_every_bit(M, N, K, ta, tb, fm, fn):
    """MC and NC split rows and columns among blocks: the sum over K of each element keeps its order."""
    rng = np.random.default_rng(M * 7 + N * 13 + K)
    a = rng.standard_normal((K, M) if ta else (M, K), dtype=np.float32)
    b = rng.standard_normal((N, K) if tb else (K, N), dtype=np.float32)
    path = LIB.tl_cpu_path()
    try:
        before = product(ta, tb, M, N, K, a, b)
        mr, nr, kc, mc, nc = tune._plan(LIB, path)
        LIB.tl_sgemm_set_blocking(path, kc, max(mr, int(mc * fm)), max(nr, int(nc * fn)))
        assert np.array_equal(product(ta, tb, M, N, K, a, b), before)
    finally:
        LIB.tl_sgemm_set_blocking(path, 0, 0, 0)


@given(st.integers(1, 300), st.integers(1, 300), st.integers(1, 700), st.booleans(), st.booleans(),
       st.sampled_from([2, 3, 4]), st.sampled_from([1, 2, 3]))
def test_the_threads_split_leaves_every_bit(M, N, K, ta, tb, threads, split):
    """How the threads split a product (the rules, C's columns, each thread packing its own B panel or the threads
    sharing one) changes which thread computes an element, not how: every split gives one thread's bits, on any
    number of threads."""
    rng = np.random.default_rng(M * 7 + N * 13 + K)
    a = rng.standard_normal((K, M) if ta else (M, K), dtype=np.float32)
    b = rng.standard_normal((N, K) if tb else (K, N), dtype=np.float32)
    try:
        LIB.tl_set_num_threads(1)
        alone = product(ta, tb, M, N, K, a, b)
        LIB.tl_set_num_threads(threads)
        assert np.array_equal(product(ta, tb, M, N, K, a, b), alone)
        LIB.tl_sgemm_set_split(split)
        assert np.array_equal(product(ta, tb, M, N, K, a, b), alone)
    finally:
        LIB.tl_sgemm_set_split(0)
        LIB.tl_set_num_threads(0)


@pytest.mark.parametrize("fmt", ["bf16", "f16"])
def test_the_threads_split_leaves_every_bit_of_16_bit_products(fmt, restored):
    """The 16-bit products (vdpbf16ps where the CPU has it, else widened while packing) take the same split."""
    gemm = LIB.tl_gemm_bf16_batched2 if fmt == "bf16" else LIB.tl_gemm_f16_batched2
    rng = np.random.default_rng(1)
    LIB.tl_set_num_threads(2)
    for M, N, K, ta, tb in [(300, 200, 700, 0, 0), (513, 65, 1200, 1, 0), (64, 1000, 300, 0, 1)]:
        a = (rng.integers(0, 1 << 13, (K, M) if ta else (M, K)) | 0x3000).astype(np.uint16)  # (finite, near 1)
        b = (rng.integers(0, 1 << 13, (N, K) if tb else (K, N)) | 0x3000).astype(np.uint16)
        outs = []
        for split in (0, *tune.SPLITS):
            LIB.tl_sgemm_set_split(split)
            c = np.zeros((M, N), np.uint16)
            gemm(1, 1, ta, tb, M, N, K, FFI.from_buffer("uint16_t[]", a), M if ta else K, 0, 0,
                 FFI.from_buffer("uint16_t[]", b), K if tb else N, 0, 0, FFI.from_buffer("uint16_t[]", c), N, 0, 0)
            outs.append(c)
        assert all(np.array_equal(outs[0], o) for o in outs[1:]), (M, N, K, ta, tb)


def test_every_candidate_computes_the_product(restored):
    """The path and KC change how the sum over K is blocked: the rounding, within float32's error of it."""
    rng = np.random.default_rng(0)
    M, N, K = 67, 45, 1500
    a, b = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
    exact = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    seen = set()
    LIB.tl_set_num_threads(2)
    assert {c["split"] for c in tune.candidates(LIB)} == {0, *tune.SPLITS}
    for choice in tune.candidates(LIB):
        tune.apply(LIB, choice)
        got = product(0, 0, M, N, K, a, b)
        assert np.all(np.abs(got - exact) <= 4 * K * 2.0 ** -24 * scale), choice
        seen.add(got.tobytes())
    assert len(tune.candidates(LIB)) >= 9
    assert len(seen) > 1                                # (KC or the path did change the rounding somewhere)


@given(st.integers(1, 4), st.integers(1, 300), st.integers(1, 1500), st.booleans(), st.booleans())
def test_gemv_groupings_compute_the_product_and_page_ahead_leaves_every_bit(m, n, K, ta, tb):
    """The GEMV's rows of W at once change how each dot product is summed (float32's error of it); asking for the
    next page ahead changes nothing in the values."""
    rng = np.random.default_rng(m * 7 + n * 13 + K)
    a = rng.standard_normal((K, m) if ta else (m, K), dtype=np.float32)
    b = rng.standard_normal((n, K) if tb else (K, n), dtype=np.float32)
    op_a, op_b = (a.T if ta else a).astype(np.float64), (b.T if tb else b).astype(np.float64)
    exact, scale = op_a @ op_b, np.abs(op_a) @ np.abs(op_b)
    try:
        for short, long in [(0, 0)] + [(s_, l_) for s_ in (1, 2, 4) for l_ in (2, 4, 8)]:
            LIB.tl_gemv_set_grouping(short, long, -1)
            got = product(ta, tb, m, n, K, a, b)
            assert np.all(np.abs(got - exact) <= 4 * K * 2.0 ** -24 * scale), (short, long)
            for page in (0, 1):
                LIB.tl_gemv_set_grouping(short, long, page)
                assert np.array_equal(product(ta, tb, m, n, K, a, b), got), (short, long, page)
    finally:
        LIB.tl_gemv_set_grouping(*tune.GEMV_DEFAULT)


def test_decoding_searches_the_gemv_groupings(restored):
    """With products of one row (decoding), the search also times the GEMV's groupings, on those products alone."""
    shapes = {(1, 0, 1, 1, 2304, 768): 2, (1, 0, 1, 1, 768, 3072): 2, (1, 0, 0, 64, 768, 768): 1}
    record = tune.search(LIB, shapes, seconds=2.0, progress=False)
    assert len(record["timings"]["gemv"]) > 1
    assert record["choice"] in [c for base in tune.candidates(LIB) for c in [base] + tune.gemv_candidates(base)]
    tune.apply(LIB, record["default"])
    assert tune.search(LIB, {(1, 0, 0, 64, 768, 768): 1}, seconds=0.5, progress=False)["timings"]["gemv"] == {}


def test_search_stores_a_choice_the_next_start_applies(tmp_path, monkeypatch, restored):
    monkeypatch.setenv("TINYLLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TINYLLM_TUNE", "1")
    shapes = {(1, 0, 0, 64, 96, 128): 3, (1, 1, 0, 128, 96, 64): 1, (4, 0, 1, 16, 16, 32): 2}
    record = tune.tune_and_store(LIB, shapes, seconds=1.0, progress=False)
    assert record["seconds"] < 3.0
    assert record["choice"] in tune.candidates(LIB) and record["default"] == tune.default_choice(LIB)
    assert record["speedup"] >= 1.0
    path = tune.store_path(tune.machine(LIB))
    assert os.path.exists(path) and not [f for f in os.listdir(tmp_path / "tune") if f.endswith(".tmp")]
    chosen = {"path": LIB.tl_cpu_path(), "kc": 192, "mc": 2 * tune._plan(LIB, LIB.tl_cpu_path())[0], "nc": 4096,
              "split": 2, "gemv": [2, 4, 0]}
    with open(path) as f:
        stored = json.load(f)
    stored["choice"] = chosen                           # (a choice that is surely not the default)
    with open(path, "w") as f:
        json.dump(stored, f)
    tune.default_choice(LIB)
    assert tune.load(LIB)["choice"] == chosen
    assert tune._plan(LIB, chosen["path"])[2:] == [chosen["kc"], chosen["mc"], chosen["nc"]]
    assert LIB.tl_sgemm_split() == 2
    tune.default_choice(LIB)
    assert LIB.tl_sgemm_split() == 0
    monkeypatch.setenv("TINYLLM_TUNE", "0")
    assert tune.load(LIB) is None                       # off: nothing applied
    assert tune._plan(LIB, chosen["path"])[2] != chosen["kc"]


def test_the_runtime_records_its_products():
    RT.shapes.clear()
    a = tl.tensor(np.ones((3, 5, 7), np.float32), device="c")
    b = tl.tensor(np.ones((7, 4), np.float32), device="c")
    (a @ b).numpy()
    (a.transpose(1, 2) @ tl.tensor(np.ones((3, 5, 2), np.float32), device="c")).numpy()
    assert RT.shapes[(1, 0, 0, 15, 4, 7)] + RT.shapes[(3, 0, 0, 5, 4, 7)] == 1
    assert sum(n for (batch, ta, tb, M, N, K), n in RT.shapes.items() if (M, N, K) == (7, 2, 5) and ta == 1) == 1


def test_a_jitted_step_tunes_once_where_nothing_is_stored(tmp_path, monkeypatch, restored):
    """The search runs at the first chained call of a jitted step (within the budget), once, and is stored."""
    from tinyllm.models.gpt import GPT, GPTConfig
    monkeypatch.setenv("TINYLLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TINYLLM_TUNE", "1")
    monkeypatch.setenv("TINYLLM_TUNE_BUDGET", "0.5")
    monkeypatch.setattr(RT, "tuning", None)
    runs = []
    real = tune.tune_and_store
    monkeypatch.setattr(tune, "tune_and_store", lambda *a, **k: runs.append(1) or real(*a, **k))
    tl.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=11, dropout=0.0)).to("c")
    opt = tl.optim.SGD(model.parameters(), lr=0.1)

    fn = tl.jit(gpt_step(model, opt))
    x = tl.tensor(np.arange(16).reshape(2, 8) % 11, device="c")
    losses = [fn(x).item() for _ in range(6)]
    assert runs == [1] and RT.tuning is not None
    assert os.path.exists(tune.store_path(tune.machine(LIB)))
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]


def _trained(paths):
    """A tiny GPT's parameters and losses after one jitted SGD step per entry of `paths`, generated kernels
    compiled for that path (set_kernel_path) at that step. (SGD: AdamW's steps of lr·sign make rounding in a
    gradient near zero a whole step.)"""
    from tinyllm.models.gpt import GPT, GPTConfig
    from tinyllm.runtime.c import compiler
    tl.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=37, dropout=0.0)).to("c")
    opt = tl.optim.SGD(model.parameters(), lr=0.5)
    fn = tl.jit(gpt_step(model, opt))
    x = tl.tensor(np.arange(64).reshape(4, 16) * 7 % 37, device="c")
    losses = []
    for path in paths:
        compiler.set_kernel_path(path)
        losses.append(fn(x).item())
    params = [p.numpy().copy() for p in model.parameters()]  # (the last update realized on the last path)
    compiler.set_kernel_path(None)
    return losses, params


@pytest.mark.skipif(not RT.compiles, reason="no C compiler: no generated kernels")
def test_the_generated_kernels_path_changes_only_the_row_sums_rounding(restored):
    """The tuner's choice of the generated kernels' path (tune.kernel_path): each element's operations are the
    same at any vector width (no -ffast-math, no contraction), and a row sum keeps one partial sum per lane
    (render.py's `omp simd reduction`). So avx2 and avx512-256 (8 float lanes) train bit-identically, even when the
    choice changes between two steps of a jitted run; avx512 (16 lanes) rounds row sums differently, within
    float32's error."""
    from tinyllm.runtime.c import compiler
    if not compiler.supports("avx2"):
        pytest.skip("this CPU has one path for generated kernels: nothing to choose")
    eight = ["avx2"] + ["avx512-256"] * compiler.supports("avx512")
    losses, params = _trained([eight[0]] * 4)
    for path_run in ([eight[-1]] * 4, [eight[-1], eight[0], eight[-1], eight[0]]):
        got_losses, got = _trained(path_run)
        assert got_losses == losses, path_run
        assert all(np.array_equal(a, b) for a, b in zip(got, params)), path_run
    if compiler.supports("avx512"):
        wide_losses, wide = _trained(["avx512"] * 4)
        np.testing.assert_allclose(wide_losses, losses, rtol=1e-5)
        for a, b in zip(wide, params):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not RT.compiles, reason="no C compiler: no generated kernels")
def test_the_search_times_the_programs_kernels_for_each_path(restored, monkeypatch):
    """Given the generated kernels a jitted step ran (CRuntime.generated_runs), the search times the heaviest of them
    compiled for each path the CPU offers and keeps one, within the budget."""
    import collections
    from tinyllm.runtime.c import compiler
    from tinyllm.models.gpt import GPT, GPTConfig
    monkeypatch.setattr(RT, "generated_runs", collections.Counter())
    RT.shapes.clear()
    tl.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=37, dropout=0.0)).to("c")
    fn = tl.jit(gpt_step(model, tl.optim.SGD(model.parameters(), lr=0.1)))
    for _ in range(4):                                  # (recorded runs report their kernels)
        fn(tl.tensor(np.arange(32).reshape(2, 16) % 37, device="c")).item()
    assert RT.generated_runs
    record = tune.search(LIB, dict(RT.shapes), seconds=20.0, progress=False, runtime=RT)  # (room to compile, cold)
    assert record["seconds"] < 20.5
    timed = record["timings"]["kernels"]
    if compiler.supports("avx512"):
        assert set(timed) == {"avx512", "avx512-256", "avx2"} and all(0 < t < 1 for t in timed.values())
        assert record["choice"]["kernels"] in (None, "avx512-256", "avx2")
    else:
        assert timed == {} and record["choice"]["kernels"] is None


@pytest.mark.parametrize("gain", [0.0, 0.3])
def test_a_search_bounded_by_its_payback_pays_back_within_the_runs(restored, monkeypatch, gain):
    """With `payback` (the automatic search's PAYBACK_RUNS), the search stops at what those runs would save: three
    runs' time (3 % of a hundred, MARGIN) where nothing is faster, and more while a faster configuration found so
    far would save it back. Products here take a fifth of the time they say a run of them takes (each shape runs
    five times a run, timed once), by configuration: 10 ms a run for the default, the second candidate `gain`
    faster, the others 5 % slower."""
    import time as clock
    pool = tune.candidates(LIB)
    current = [pool[0]]
    real_apply = tune.apply
    monkeypatch.setattr(tune, "apply", lambda lib, choice: current.__setitem__(0, choice) or real_apply(lib, choice))

    def run_time(products, lib):
        same = lambda c: {**c, "kernels": None} == {**current[0], "kernels": None}  # noqa: E731
        t = 0.010 if same(pool[0]) else 0.010 * (1 - gain) if same(pool[1]) else 0.0105
        clock.sleep(t / 5)
        return t
    monkeypatch.setattr(tune.Products, "time", run_time)
    shapes = {(1, 0, 0, 64, 96, 128): 1}
    record = tune.search(LIB, shapes, seconds=10.0, progress=False, payback=100)
    assert record["per_run"] == pytest.approx(0.010)
    if gain == 0.0:
        assert record["choice"] == record["default"] and record["allowed"] == pytest.approx(100 * 0.03 * 0.010)
        assert record["seconds"] < 100 * 0.03 * 0.010 + 0.005   # (the timing under way when it ran out, at most)
        assert len(record["timings"]["all"]) < len(pool)
        unbounded = tune.search(LIB, shapes, seconds=1.0, progress=False)  # (no payback: the budget alone)
        assert unbounded["allowed"] == 1.0 and len(unbounded["timings"]["all"]) == len(pool)
    else:
        assert {**record["choice"], "kernels": None} == {**pool[1], "kernels": None}
        assert record["allowed"] == pytest.approx(100 * gain * 0.010) and record["speedup"] > 1.3
        assert record["seconds"] <= 100 * gain * 0.010 + 0.005  # saved back within the hundred runs
        assert record["seconds"] > 100 * 0.03 * 0.010           # (it went on past the floor)


@pytest.mark.parametrize("decode", [False, True])
def test_the_command_tunes_within_its_payback_and_reports_it(tmp_path, monkeypatch, capsys, restored, decode):
    """`python -m tinyllm.tune`, without --budget, runs the search a jitted run would (bounded by its payback) on one
    step's products (one token's, decoding), stores it, and says what it was allowed (or why it began none) and
    what it bought."""
    from tinyllm import tune as command
    monkeypatch.setenv("TINYLLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TINYLLM_TUNE", "1")
    monkeypatch.setattr(RT, "tuning", RT.tuning)
    command.main(["--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "128", "--vocab-size", "37",
                  "--steps", "2"] + ["--decode"] * decode)
    out = capsys.readouterr().out
    unit = "token" if decode else "step"
    assert f" {tune.PAYBACK_RUNS} {unit}s " in out and "save back" in out and f"\n{unit} (median of 2 each" in out
    assert os.path.exists(tune.store_path(tune.machine(LIB)))
    ran = int(out.split(" distinct products, ")[1].split(" a ")[0])
    # one run's: a token's 4 linear layers, lm_head and the cache attention's 2; a step's 5 forward, 10 backward
    assert ran == (7 if decode else 15)


def test_no_search_begins_whose_operands_cost_more_than_its_payback(restored):
    """Given how long a run takes, a bounded search whose operands alone would take longer to make than the runs
    would save back at the smallest kept gain keeps the default untimed (decoding a large model: a token's products
    are hundreds of MB of weights to copy); one whose operands are cheap begins."""
    big = {(1, 0, 1, 1, 50257, 768): 1}                 # (a GPT-2 lm_head's GEMV: 154 MB of operands)
    assert tune.Products.nbytes(big) == 4 * (768 + 768 * 50257 + 50257)
    record = tune.search(LIB, big, seconds=10.0, progress=False, payback=100, run_seconds=0.015)
    assert record["seconds"] == 0.0 and record["timings"]["all"] == {} and record["choice"] == record["default"]
    small = {(1, 0, 0, 64, 96, 128): 1}
    record = tune.search(LIB, small, seconds=10.0, progress=False, payback=100, run_seconds=0.015)
    assert record["timings"]["all"] and record["seconds"] > 0.0
