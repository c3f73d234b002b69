"""The C runtime on every CPU path this machine supports (runtime_c/cpu.h; tinyllm/runtime/c/compiler.py): each path
forced at run time (compiler.set_path, which also sets tl_cpu_path() for the prebuilt kernels) must give the NumPy
runtime's values for generated kernels and for FlashAttention; a kernel compiled for one path is never reused for
another; and each path compiles with its own ISA flags, never more (objdump where it is installed)."""
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import tinyllm as tl
from tinyllm.nn import functional as F
from helpers import usable_path
from tinyllm.runtime.c import compiler
from tinyllm.runtime import get

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# float32 against NumPy's float32: exp within 2 ulp, tanh within 6.1 and erf within 1.5 (c_math.h; erf also in
# tests/test_c_math.py); sums in another order (16, 8 or 1 lanes) for softmax and layer norm
TOL = {"exp": dict(rtol=4e-7, atol=0), "tanh": dict(rtol=1e-6, atol=1e-30), "erf": dict(rtol=3e-7, atol=1e-30),
       "softmax": dict(rtol=2e-5, atol=2e-6), "layer_norm": dict(rtol=2e-5, atol=2e-5),
       "attention": dict(rtol=2e-4, atol=2e-5)}


def _on(runtime, fn, *arrays):
    """fn's outputs and its inputs' gradients (of sum(outputs · fixed weights)) on `runtime`."""
    xs = [tl.tensor(a, device=runtime, requires_grad=a.dtype == np.float32) for a in arrays]
    y = fn(*xs)
    w = np.random.default_rng(7).standard_normal(y.shape).astype(np.float32)
    (y * tl.tensor(w, device=runtime)).sum().backward()
    return [y.numpy()] + [x.grad.numpy() for x in xs if x.requires_grad]


def _inputs(shape, seed, special=False):
    x = (np.random.default_rng(seed).standard_normal(shape) * 4).astype(np.float32)
    if special:  # the edges of exp's and tanh's ranges, and IEEE specials, among the vector lanes and the tail
        edge = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 88.7, 88.8, -103.9, -104.1, 9.0, -9.0, 1e-30, -1e-30],
                        np.float32)
        x.reshape(-1)[5:5 + edge.size] = edge
        x.reshape(-1)[-edge.size:] = edge
    return x


# (67, 515): ragged for 16 and 8 lanes, and over the threshold where a kernel runs on OpenMP's threads
ELEMENTWISE = {"exp": lambda x: x.exp(), "tanh": lambda x: x.tanh(), "erf": lambda x: x.erf()}


@pytest.mark.parametrize("op", ELEMENTWISE)
def test_elementwise_kernels_match_numpy(cpu_path, op):
    x = _inputs((67, 515), 1, special=True)
    got = getattr(tl.tensor(x, device="c"), op)().numpy()
    want = getattr(tl.tensor(x, device="numpy"), op)().numpy()
    np.testing.assert_allclose(got, want, **TOL[op], err_msg=f"{op} on the {cpu_path} path")
    assert np.array_equal(np.isnan(got), np.isnan(want))


def _layer_norm(x, g, b):
    return F.layer_norm(x, (x.shape[-1],), g, b)


@pytest.mark.parametrize("op", ["softmax", "layer_norm"])
def test_row_reductions_and_their_gradients_match_numpy(cpu_path, op):
    x = _inputs((67, 515), 2)
    if op == "softmax":
        fn, arrays = (lambda t: t.softmax(-1)), [x]
    else:
        rng = np.random.default_rng(3)
        fn, arrays = _layer_norm, [x, rng.standard_normal(515).astype(np.float32),
                                   rng.standard_normal(515).astype(np.float32)]
    got, want = _on("c", fn, *arrays), _on("numpy", fn, *arrays)
    for name, g, w in zip(["output", "grad x", "grad gain", "grad bias"], got, want):
        scale = max(1.0, float(np.abs(w).max()))  # a gain's gradient sums 67 rows
        np.testing.assert_allclose(g, w, rtol=TOL[op]["rtol"], atol=TOL[op]["atol"] * scale,
                                   err_msg=f"{op} {name} on the {cpu_path} path")


@pytest.mark.parametrize("tq,d,causal", [(70, 40, True), (130, 32, True), (45, 64, False), (33, 17, False)])
def test_flash_attention_forward_and_backward_match_numpy(cpu_path, tq, d, causal):
    """Tiles of 64 crossed and ragged, head sizes a multiple of 16 and not (the masked edges of both vector paths)."""
    rng = np.random.default_rng(tq * d)
    arrays = [(rng.standard_normal((2, 3, tq, d)) * 2).astype(np.float32) for _ in range(3)]
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
    lib = get("c").lib
    assert lib.tl_cpu_path() == compiler.PATHS.index(cpu_path), "the prebuilt kernels are not on the forced path"
    got, want = _on("c", fn, *arrays), _on("numpy", fn, *arrays)
    for name, g, w in zip(["output", "dq", "dk", "dv"], got, want):
        np.testing.assert_allclose(g, w, **TOL["attention"], err_msg=f"attention {name} on the {cpu_path} path")


@pytest.mark.parametrize("tq,tk,d,dv,causal,packed", [(70, 150, 24, 40, True, False), (150, 70, 48, 16, True, False),
                                                        (37, 80, 64, 57, False, False), (90, 90, 32, 32, True, True)])
def test_flash_attention_kernels_match_the_float64_reference(cpu_path, tq, tk, d, dv, causal, packed):
    """runtime_c/attention.c called directly: Tq != Tk both ways (causal keys after every query), Dv != D, and q, k,
    v read in place as the heads of one (b, t, 3, h, d) projection, with dout then dO alone (dL = 0), a strided
    view, as the pads pass passes it."""
    from tinyllm.ops import attention
    from tinyllm.runtime.c.attention import _views
    rt, rng = get("c"), np.random.default_rng(tq + tk)
    if packed:
        qkv = (rng.standard_normal((2, tq, 3, 3, d)) * 2).astype(np.float32)
        q, k, v = [qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3)]
    else:
        q, k, v = [(rng.standard_normal((2, 3, t, n)) * 2).astype(np.float32) for t, n in ((tq, d), (tk, d), (tk, dv))]
    out = np.empty((2, 3, tq, dv + 1), np.float32)
    dout = rng.standard_normal(out.shape).astype(np.float32)
    if packed:  # dO alone: the heads of a (b, t, h, dv) gradient
        dout = rng.standard_normal((2, tq, 3, dv)).astype(np.float32).transpose(0, 2, 1, 3)
    grads = np.empty((2, 3, tq * d + tk * (d + dv)), np.float32)
    views, batch = _views(rt, [q, k, v])
    rt.call(rt.lib.attention_forward, out, *views, *batch, tq, tk, d, dv, 0.3, int(causal))
    views, batch = _views(rt, [q, k, v, out, dout])
    rt.call(rt.lib.attention_backward, grads, *views, *batch, tq, tk, d, dv, 0.3, int(causal), int(not packed))
    f64 = [x.astype(np.float64) for x in (q, k, v)]
    want = attention.attention_forward(*f64, 0.3, causal)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4, err_msg=f"forward on the {cpu_path} path")
    want_grads = attention.attention_backward(*f64, want, dout.astype(np.float64), 0.3, causal)
    np.testing.assert_allclose(grads, want_grads, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want_grads).max()),
                               err_msg=f"backward on the {cpu_path} path")


# ---- the kernel cache -------------------------------------------------------------------------------------------

def _exp_source(name):
    """One generated kernel: exp over 4096 floats (on avx2, exp alone is what needs -fno-trapping-math to vectorise)."""
    return (f'#include "{os.path.join(ROOT, "tinyllm", "runtime", "c", "c_math.h")}"\n'
            f"void {name}(char **bufs) {{\n  float *restrict out = (float *)bufs[0];\n"
            "  const float *restrict s0 = (const float *)bufs[1];\n  #pragma omp simd\n"
            "  for (long i = 0; i < 4096; i++) out[i] = tl_expf(s0[i]);\n}\n")


def _vector_registers(library):
    """{"ymm", "zmm"} & the registers a library's code names, or None without objdump."""
    if shutil.which("objdump") is None:
        return None
    text = subprocess.run(["objdump", "-d", library], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"%([yz]mm)\d", text))


def test_each_path_has_its_own_library_and_isa(tmp_path, monkeypatch):
    """The same source compiled under each supported path: one library per path, named for it, each built from
    its own flags; the portable one uses no AVX register, the avx2 one ymm (exp vectorised) but no AVX-512 register,
    the avx512 one zmm."""
    if not compiler.available():
        pytest.skip("no C compiler")
    monkeypatch.setenv("TINYLLM_CACHE_DIR", str(tmp_path))
    paths = [p for p in compiler.PATHS if usable_path(p)]
    x = np.linspace(-3, 3, 4096, dtype=np.float32)
    want = np.exp(x.astype(np.float64))
    fns = {}
    try:
        for p in paths:
            compiler.set_path(p)
            (fn,) = compiler.load({"kpaths": _exp_source("kpaths")}).values()
            out = np.empty_like(x)
            fn(compiler.ffi.new("char *[]", [compiler.ffi.from_buffer(out), compiler.ffi.from_buffer(x)]))
            np.testing.assert_allclose(out, want, rtol=4e-7, err_msg=p)
            fns[p] = fn
    finally:
        compiler.set_path(None)
    libraries = sorted(os.listdir(tmp_path / "kernels"))
    assert [f.split("_")[1] for f in libraries] == sorted(paths), libraries
    assert len({compiler.library_path("same source", p) for p in compiler.PATHS}) == len(compiler.PATHS)
    if compiler.X86:
        assert "-march=native" not in compiler.FLAGS + sum(compiler.ISA.values(), [])
        assert not any("avx" in f for f in compiler.ISA["portable"])
        assert not any("avx512" in f for f in compiler.ISA["avx2"])
        for library in libraries:
            regs = _vector_registers(str(tmp_path / "kernels" / library))
            if regs is None:
                continue
            path = library.split("_")[1]
            want_regs = {"portable": set(), "avx2": {"ymm"}, "avx512": {"zmm"}}[path]
            assert want_regs <= regs and not ({"portable": {"ymm", "zmm"}, "avx2": {"zmm"}, "avx512": set()}[path]
                                              & regs), f"{library} ({path}) uses {regs}"


def test_switching_path_recompiles_in_process(cpu_path):
    """A schedule run on one path and then another runs the other's kernels (the runtime's own caches are per
    path too), and on the way back finds the first ones again without compiling."""
    loads = []
    original = compiler.load

    def spy(sources, *cpu):
        loads.append(compiler.path())
        return original(sources, *cpu)
    compiler.load = spy
    try:
        # a shape of its own, and too big for shape-generic kernels (runtime/c/render.py): nothing compiled yet
        # (summed over its few rows: a sum of thousands would round differently on each path's vector lanes)
        x = _inputs((5 + compiler.PATHS.index(cpu_path), 7001), 4)
        f = lambda: (tl.tensor(x, device="c") * 1.25).exp().sum(0).numpy()  # noqa: E731
        first = f()
        others = [p for p in compiler.PATHS if p != cpu_path and usable_path(p)]
        for p in others:
            compiler.set_path(p)
            np.testing.assert_allclose(f(), first, rtol=1e-6)
        compiler.set_path(cpu_path)
        n = len(loads)
        np.testing.assert_allclose(f(), first, rtol=1e-6)
        assert len(loads) == n, "switching back compiled again"
        assert set(others) <= set(loads), f"switching to {others} compiled {loads}"
    finally:
        compiler.load = original


# ---- the environment ---------------------------------------------------------------------------------------------

CHILD = """
import json, subprocess
import numpy as np
import tinyllm as tl
from tinyllm.runtime import get
from tinyllm.runtime.c import compiler
commands = []
run = subprocess.run
def spy(cmd, *a, **k):
    commands.append(list(cmd))
    return run(cmd, *a, **k)
subprocess.run = spy
x = tl.tensor(np.linspace(-2, 2, 4096, dtype=np.float32).reshape(64, 64), device="c")
y = (x.exp() + x.tanh()).softmax(-1).numpy()
print(json.dumps({"path": compiler.path(), "prebuilt": get("c").lib.tl_cpu_path(), "commands": commands,
                  "finite": bool(np.isfinite(y).all())}))
"""


@pytest.mark.parametrize("forced", ["portable", "avx2"])
def test_tinyllm_cpu_in_the_environment_sets_every_kernel(tmp_path, forced):
    """TINYLLM_CPU=portable (avx2) at startup: the prebuilt kernels take that path and the generated ones compile
    for the baseline (AVX2) ISA only, however much more this CPU has."""
    if get("c").lib is None or not compiler.available():
        pytest.skip("no prebuilt C module or no C compiler")
    if not usable_path(forced):
        pytest.skip(f"this CPU has no {forced} path")
    env = {**os.environ, "TINYLLM_CPU": forced, "TINYLLM_CACHE_DIR": str(tmp_path), "TINYLLM_RUNTIME": "c",
           "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["path"] == forced and got["prebuilt"] == compiler.PATHS.index(forced) and got["finite"]
    builds = [c for c in got["commands"] if "-shared" in c]
    assert builds, "nothing was compiled"
    for cmd in builds:
        isa = [f for f in cmd if f.startswith("-m")]
        if compiler.X86:
            assert isa == compiler.ISA[forced], cmd
    libraries = os.listdir(tmp_path / "kernels")
    assert libraries and all(f.startswith(f"k_{forced}_") for f in libraries), libraries
    banned = {"portable": {"ymm", "zmm"}, "avx2": {"zmm"}}[forced]
    for library in libraries:
        regs = _vector_registers(str(tmp_path / "kernels" / library))
        assert regs is None or not regs & banned, f"{library} uses {regs} under TINYLLM_CPU={forced}"


def test_a_path_the_cpu_lacks_falls_back(monkeypatch):
    """Without the prebuilt module to ask, the compiler reads the CPU's flags itself: a forced path this CPU lacks
    gives the best one below it, never code that would stop on an illegal instruction."""
    monkeypatch.setattr(compiler, "_prebuilt", [None])
    monkeypatch.setattr(compiler, "X86", True)
    monkeypatch.setattr(compiler, "_forced", [None])
    monkeypatch.delenv("TINYLLM_NO_AVX2", raising=False)
    avx512 = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"}
    for flags, forced, want in [({"sse2"}, "avx512", "portable"), ({"avx2", "fma"}, "avx512", "avx2"),
                                ({"avx2"}, "avx2", "portable"), (avx512, None, "avx512"),
                                (avx512, "portable", "portable"),
                                ({"avx2", "fma", "avx512f"}, None, "avx2")]:  # a Xeon Phi's AVX-512: F without BW
        monkeypatch.setattr(compiler, "_cpu_flags", lambda f=flags: f)
        if forced:
            monkeypatch.setenv("TINYLLM_CPU", forced)
        else:
            monkeypatch.delenv("TINYLLM_CPU", raising=False)
        assert compiler.path() == want, (flags, forced)
    with pytest.raises(ValueError, match="unknown CPU path 'sse9'"):
        compiler.set_path("sse9")
