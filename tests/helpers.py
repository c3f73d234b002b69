"""Shared test helpers: inputs kept off kinks and ties, hypothesis shape strategies, and `helper_test_op`, which
runs one function in torch and in tinyllm on the same inputs and compares outputs and every input's gradient."""
import os

import numpy as np
import pytest
import torch
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import tinyllm as tl

SEEDS = st.integers(0, 2**32 - 1)


@pytest.fixture(autouse=True, scope="module")
def reference_runtime():
    """Import into a test module to run it on the NumPy reference runtime unless TINYLLM_RUNTIME names one.
    Hypothesis draws hundreds of shapes, and a compiling runtime (C) would build new kernels for most of them;
    TINYLLM_RUNTIME=c runs the module there anyway."""
    if os.environ.get("TINYLLM_RUNTIME"):
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TINYLLM_RUNTIME", "numpy")
        yield


def usable_path(path):
    """Whether this CPU runs the C kernels' `path` (conftest.py's cpu_path fixture); in CI on x86-64 the avx2 path
    must be there."""
    from tinyllm.runtime.c import compiler
    if os.environ.get("CI") and compiler.X86 and path == "avx2":
        assert compiler.supports("avx2"), "CI runs on x86-64 with AVX2+FMA: the avx2 path must be tested there"
    return compiler.supports(path)


def run_example(script, *flags, cwd):
    """examples/SCRIPT with these flags (the first may be a subcommand) on the numpy runtime (which compiles
    nothing), as a user runs it: a subprocess's CompletedProcess, its output captured as text."""
    import subprocess
    import sys
    examples = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
    sub = list(flags[:1]) if flags and not flags[0].startswith("-") else []  # a subcommand goes first
    cmd = [sys.executable, os.path.join(examples, script), *sub, "--runtime", "numpy", *flags[len(sub):]]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)


def small_corpus(root):
    """A 13 kB text of 300 lines of random words from a 15-word list under `root`: enough for examples/gpt.py --tiny."""
    import random
    rng = random.Random(0)
    words = "the quick brown fox jumps over a lazy dog while seven cats sat on the mat".split()
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(words) for _ in range(10)) for _ in range(300)))
    return corpus


def spread_weights(model, seed, wte_std=0.3):
    """Give `model` (a GPT) weights that put O(1) values through every nonlinearity: GPT-2's init (std 0.02) keeps
    every GELU and softmax input near 0, where a wrong formula, position or stale key would hide. 2-D weights
    N(0, 1/fan_in) (the embedding N(0, wte_std²); None: 1/fan_in too), gains 1 + N(0, 0.04), biases N(0, 0.04)."""
    import math
    rng = np.random.default_rng(seed + 100)
    for name, p in model.named_parameters():
        if p.ndim == 2:
            std = wte_std if name.endswith("wte.weight") and wte_std is not None else 1.0 / math.sqrt(p.shape[1])
            value = rng.normal(0.0, std, p.shape)
        else:
            value = (1.0 if name.endswith("weight") else 0.0) + rng.normal(0.0, 0.2, p.shape)
        p.copy_(value.astype(np.float32))
    return rng


def rel(a, b):
    """‖a − b‖₂ / ‖b‖₂ over the whole arrays (b the reference)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def shapes(min_dims=0, max_dims=4, min_side=1, max_side=4):
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side, max_side=max_side)


def broadcastable(n=2, min_dims=0, max_dims=4, max_side=4):
    """n shapes that broadcast together (some axes 1 or missing)."""
    return hnp.mutually_broadcastable_shapes(num_shapes=n, min_dims=min_dims, max_dims=max_dims,
                                             max_side=max_side).map(lambda s: s.input_shapes)


def make_inputs(shapes, rng, dtype=np.float32, values="any"):
    """Arrays of `shapes`. values: "any" uniform in [-2, 2]; "positive" in [0.5, 2] (log, sqrt, pow);
    "nonzero" with 0.25 <= |x| <= 2 (relu, abs, division: off the kink or pole at 0); "distinct" all
    different across every input, at least 1/(2n) apart (max/min, sort-like ops: no ties);
    "int" small integers as floats (comparisons: ties do happen)."""
    sizes = [int(np.prod(s)) for s in shapes]
    if values == "distinct":
        n = max(sum(sizes), 1)
        pool = (rng.permutation(n) + rng.uniform(0.25, 0.75, n)) * (4.0 / n) - 2.0
        flat, out = pool, []
        for s, k in zip(shapes, sizes):
            out.append(flat[:k].reshape(s))
            flat = flat[k:]
    elif values == "any":
        out = [rng.uniform(-2, 2, s) for s in shapes]
    elif values == "positive":
        out = [rng.uniform(0.5, 2, s) for s in shapes]
    elif values == "nonzero":
        out = [rng.uniform(0.25, 2, s) * rng.choice([-1.0, 1.0], s) for s in shapes]
    elif values == "int":
        out = [rng.integers(-2, 3, s).astype(np.float64) for s in shapes]
    else:
        raise ValueError(f"unknown values kind {values!r}")
    return [np.asarray(a, dtype=dtype) for a in out]


def _flat(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _np(t):
    return t.detach().numpy() if isinstance(t, torch.Tensor) else t.numpy()


def compare(name, got, want, rtol, atol):
    """Shapes and dtypes equal exactly; floats to the tolerance; integers and bools exactly."""
    assert got.shape == want.shape, f"{name}: shape {got.shape}, torch gives {want.shape}"
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype}, torch gives {want.dtype}"
    if got.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=name)
    else:
        np.testing.assert_array_equal(got, want, err_msg=name)


def chi2_pvalue(counts, expected):
    """Pearson's goodness of fit: P(X² >= statistic) for X² with (cells − 1) degrees of freedom, over the cells the
    expected distribution gives mass; a count in a cell it gives none fails at once."""
    counts, expected = np.asarray(counts, np.float64), np.asarray(expected, np.float64)
    cells = expected > 0
    assert counts[~cells].sum() == 0, f"sampled outside the support: {counts} vs {expected}"
    e = counts.sum() * expected[cells] / expected[cells].sum()
    assert e.min() >= 5, "too few expected draws in a cell for the chi-squared approximation"
    stat = ((counts[cells] - e) ** 2 / e).sum()
    df = int(cells.sum()) - 1
    if df == 0:
        return 1.0
    return torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                   torch.tensor(stat / 2, dtype=torch.float64)).item()


def helper_test_op(shapes, torch_fn, tinyllm_fn=None, *, tol, seed=0, dtype=np.float32, values="any",
                   arrays=None, grad=True):
    """Run `torch_fn` on torch tensors and `tinyllm_fn` (default: the same function, since tinyllm has torch's
    names) on tinyllm tensors made from the same arrays; compare every output, then backpropagate one random
    upstream gradient per float output (a vector-Jacobian product, which catches wrong signs and swapped
    elements that a plain .sum() can hide) and compare every input's .grad.
    tol: {"forward": (rtol, atol), "grad": (rtol, atol)} for this dtype. Returns the tinyllm outputs."""
    rng = np.random.default_rng(seed)
    arrays = make_inputs(shapes, rng, dtype, values) if arrays is None else [np.asarray(a) for a in arrays]
    where = f"inputs {[a.shape for a in arrays]} {arrays[0].dtype if arrays else ''}"
    tt = [torch.tensor(a, requires_grad=grad) for a in arrays]
    ts = [tl.Tensor(a, requires_grad=grad) for a in arrays]
    t_outs, l_outs = _flat(torch_fn(*tt)), _flat((tinyllm_fn or torch_fn)(*ts))
    assert len(t_outs) == len(l_outs), f"{where}: {len(l_outs)} outputs, torch gives {len(t_outs)}"
    for k, (l, t) in enumerate(zip(l_outs, t_outs)):
        compare(f"forward output {k}, {where}", l.numpy(), _np(t), *tol["forward"])
    if not grad:
        return l_outs
    pairs = [(l, t) for l, t in zip(l_outs, t_outs) if t.dtype.is_floating_point and t.requires_grad]
    assert pairs, f"{where}: no output needs a gradient in torch"
    ups = [rng.standard_normal(t.shape).astype(t.detach().numpy().dtype) for _, t in pairs]
    torch.autograd.backward([t for _, t in pairs], [torch.tensor(u) for u in ups])
    for l, _ in pairs:
        assert l.requires_grad, f"{where}: output does not require grad, torch's does"
    if len(pairs) == 1:
        pairs[0][0].backward(gradient=tl.Tensor(ups[0]))
    else:
        sum((l * tl.Tensor(u)).sum() for (l, _), u in zip(pairs, ups)).backward()
    for i, (l, t) in enumerate(zip(ts, tt)):
        want = np.zeros_like(arrays[i]) if t.grad is None else t.grad.numpy()
        got = np.zeros_like(arrays[i]) if l.grad is None else l.grad.numpy()
        compare(f"gradient of input {i}, {where}", got, want, *tol["grad"])
    return l_outs


def gpt_step(model, opt):
    """A training step of a GPT: forward (the loss of predicting y, x itself where y is not given), backward,
    optimizer step, zero_grad; returns the loss."""
    def step(x, y=None):
        _, loss = model(x, x if y is None else y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    return step


def tiny_gpt_steps(steps, device=None):
    """Train a tiny GPT (AdamW) for `steps` steps on one fixed batch, yielding after each step."""
    from tinyllm.models.gpt import GPT, GPTConfig
    tl.manual_seed(0)
    model = GPT(GPTConfig(block_size=16, vocab_size=11, n_layer=2, n_head=2, n_embd=16)).to(device=device)
    opt = tl.optim.AdamW(model.parameters(), lr=1e-3)
    idx = tl.tensor(np.random.default_rng(0).integers(0, 11, (4, 16)), device=device)
    for _ in range(steps):
        _, loss = model(idx, idx)
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()
        yield


def in_ci():
    """Whether this run is CI's (CI set, and not 0 or false): there a missing tool fails a test instead of skipping it."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def mpi_missing():
    """Why tests that launch mpirun cannot run here (None when they can)."""
    import importlib.util
    import shutil
    if shutil.which("mpirun") is None:
        return "mpirun not found: install an MPI (Debian/Ubuntu: apt-get install openmpi-bin libopenmpi-dev)"
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py not installed: pip install -e '.[mpi]'"
    return None


def wgsl_f16_or_skip():
    """Skip the test where the WGSL adapter lacks the `shader-f16` feature: kernels that compute in float16 are
    refused there (stored float16 works anywhere). The runtime asks for the feature whenever the adapter offers it
    (test_wgsl_runtime.py's test_adapter_info_and_features checks that), so this skips for a missing feature only,
    never for a broken one."""
    rt = tl.runtime.get("wgsl")
    if not rt.has_f16:
        pytest.skip(f"float16 kernels: the WGSL adapter {rt.info['device']} via {rt.info['backend']} lacks the "
                    "shader-f16 feature")
