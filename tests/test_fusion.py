"""Kernel fusion (tinyllm/rewrite/fusion.py) and the C kernels it compiles (runtime/c/render.py, c_math.h).

Every random expression graph (forward and gradients) is computed four ways and compared:
  c       device "c": the fusion pass, then compiled C kernels
  numpy   device "numpy": no fusion, every primitive its own NumPy forward (the reference)
  torch   the same expression in torch
  fused   the fused graph run through the NumPy interpreter (`run_kernel`, the meaning of a Kernel), against
          the same graph unfused: this checks the pass itself, apart from the C rendering
Each check also asserts that fusion happened (no elementwise op or reduction is left, and every single-use
elementwise producer is gone into its consumer), so a silently disabled pass fails here.

Shapes come from a small fixed set (sizes that are multiples of 8 and not, size-1 axes) so that the compiled
kernel cache is reused across examples: every new kernel costs a C compile.
"""
import math
import zlib

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import tinyllm as tl
import tinyllm.nn.functional as F
from tinyllm.autograd import gradients
from tinyllm.graph import toposort
from tinyllm.ops import Group
from tinyllm.rewrite.fusion import fuse, fuse_outputs
from tinyllm.rewrite.pipeline import PASSES, run_passes

ELEMENTWISE, REDUCE = Group.ELEMENTWISE, Group.REDUCE
SCHEDULE = PASSES["schedule"]
from tinyllm.runtime import get as get_runtime
from tinyllm.schedule import Schedule

# ---- tolerances ------------------------------------------------------------------------------------------
# (rtol, atol), where atol is relative to the largest magnitude of the expected array (so cancellation in
# a sum or a difference is measured against the size of what was summed).
# "c": C kernels against the NumPy runtime. Elementwise f32 math in C is within a few ulp (tl_expf 2, tl_tanhf 6.1),
#      and sums add in another order, so errors of a few ulp grow along a chain; float64 uses libm.
# "torch": either tinyllm runtime against torch (other algorithms for exp/tanh/erf and for sums).
# "fused": the fused graph through the NumPy interpreter against the unfused graph: bit for bit for
#      elementwise work (same NumPy functions), up to summation order where a reduction now reads a strided
#      view instead of a contiguous copy.
TOL = {
    "float32": {"c": (2e-5, 2e-5), "torch": (1e-4, 1e-4), "fused": (1e-5, 1e-6)},
    "float64": {"c": (1e-11, 1e-11), "torch": (1e-9, 1e-9), "fused": (1e-12, 1e-13)},
}
ULP_MAX = {"exp": 2, "tanh": 6.1}  # C's float32 exp and tanh against a float64 reference (see c_math.h)

SHAPES = [(9,), (4, 8), (3, 1, 9), (1, 8, 5), (2, 3, 1, 8)]
DTYPES = {"float32": (tl.float32, torch.float32, np.float32), "float64": (tl.float64, torch.float64, np.float64)}
SEEDS = st.integers(0, 2 ** 32 - 1)


def close(got, want, tol, what):
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, expected {want.dtype}"
    rtol, atol = tol
    scale = float(np.max(np.abs(want), initial=0.0)) if want.size else 0.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * max(scale, 1.0), err_msg=what)


def same(got, want, tol, what):
    """Equal bit for bit (NaNs in the same places), else within the summation-order tolerance."""
    if not np.array_equal(got, want, equal_nan=True):
        close(got, want, tol, what)


# ---- the NumPy interpreter check of the pass -----------------------------------------------------------

FUSION_PASSES = SCHEDULE + [("fusion", fuse)]


def inlined_producers(roots):
    """Elementwise nodes that fusion must compute inside their consumer, never storing them: used once (and not
    an output), by an elementwise op or a reduction reading them directly (no view in between)."""
    users, user_of = {}, {}
    for n in toposort(roots, stop=lambda n: n.buffer is not None):
        for s in set(n.src):
            users[s] = users.get(s, 0) + 1
            user_of[s] = n
    for r in roots:
        users[r] = users.get(r, 0) + 1
    return [n for n, k in users.items()
            if k == 1 and n.op in ELEMENTWISE and user_of.get(n) is not None and user_of[n].op in ELEMENTWISE | REDUCE]


def check_fused_interpreter(roots, dtype_name):
    """Run `roots` unfused and fused on the NumPy runtime; values must agree and fusion must have happened.
    Returns the fused schedule."""
    numpy_rt = get_runtime("numpy")
    plain = run_passes(roots, SCHEDULE)
    fused = run_passes(plain, [("fusion", fuse)])
    assert fused == run_passes(roots, FUSION_PASSES)
    s_plain, s_fused = Schedule(plain), Schedule(fused)
    want = [b.numpy() for b in numpy_rt.execute(s_plain)]
    got = [b.numpy() for b in numpy_rt.execute(s_fused)]
    # run_kernel returns 0-d results with shape (1,) (test_run_kernel_keeps_a_0d_shape, xfail): compare values
    got = [g.reshape(()) if w.shape == () and g.shape == (1,) else g for g, w in zip(got, want)]
    for i, (g, w) in enumerate(zip(got, want)):
        same(g, w, TOL[dtype_name]["fused"], f"output {i}: fused graph on the NumPy interpreter vs unfused")
    left = [n.op for n in s_fused.kernels if n.op in ELEMENTWISE | REDUCE]
    assert not left, f"fusion left these ops unfused: {left}"
    n_work = sum(1 for n in s_plain.kernels if n.op in ELEMENTWISE | REDUCE)
    n_fused = sum(1 for n in s_fused.kernels if n.op == "FUSED")
    assert (n_fused > 0) == (n_work > 0)
    saved = len(inlined_producers(plain))
    assert len(s_fused.kernels) <= len(s_plain.kernels) - saved, (
        f"{len(s_fused.kernels)} kernels after fusion, {len(s_plain.kernels)} before: at least {saved} single-use "
        f"elementwise producers should have gone into their consumers")
    return s_fused


# ---- random expression graphs ----------------------------------------------------------------------------

UNARY = ["neg", "exp", "tanh", "sigmoid", "sq", "log1p", "sqrt1p", "recip1p", "relu", "abs", "gelu_tanh",
         "gelu_erf", "cast", "step", "count", "clamp", "softmax", "log_softmax", "layer_norm", "slice_bc", "reshape"]
BINARY = ["add", "sub", "mul", "div", "max", "min"]
LEAVES = ["x", "y", "z", "w", "xt"]


def _extend(children):
    return (st.tuples(st.sampled_from(UNARY), children, st.integers(0, 7))
            | st.tuples(st.sampled_from(BINARY), children, children)
            | st.tuples(st.just("where"), children, children, children)
            | st.tuples(st.just("masked_fill"), children, children)
            | st.tuples(st.sampled_from(["sum", "amax", "mean"]), children, st.integers(0, 15), st.booleans())
            | st.tuples(st.just("perm"), children, children, st.permutations(range(4))))


exprs = st.recursive(st.sampled_from(LEAVES).map(lambda k: ("in", k))
                     | st.sampled_from([0.5, -1.5, 3.0]).map(lambda v: ("c", v)), _extend, max_leaves=7)


class ConstSites:
    """For each reduction in an expression (softmax and log_softmax take two): does it reduce a value that
    simplify folds to a constant? Unless simplify folds the reduction too, those crash on device c
    (test_reduction_of_a_constant, xfail), so the builder adds an input there. Recorded by a first build on
    tinyllm, then replayed so that every library builds the same graph."""
    def __init__(self):
        self.flags, self.at, self.recording = [], 0, True

    def __call__(self, a):
        if self.recording:
            nodes = toposort(run_passes([a.node], SCHEDULE), stop=lambda n: n.buffer is not None)
            self.flags.append(not any(n.op == "LOAD" or n.buffer is not None for n in nodes))
        self.at += 1
        return self.flags[self.at - 1]


def leaf_arrays(shape, rng, np_dtype):
    """The inputs of a random graph of output shape `shape`. x is plain; y broadcasts along axis 0; z is one
    row broadcast over all leading axes; w is read as a strided slice [1::2] of a bigger buffer on every axis;
    xt is a transposed buffer; noise keeps layer_norm's rows from being constant (no 0/0 to amplify)."""
    n = len(shape)
    shapes = {"x": shape, "y": (1,) + shape[1:], "z": (1,) * (n - 1) + shape[-1:],
              "w": tuple(2 * s + 1 for s in shape), "xt": shape[::-1], "noise": shape}
    return {k: rng.standard_normal(s).astype(np_dtype) for k, s in shapes.items()}


def leaf_views(env, shape):
    n = len(shape)
    return {"x": env["x"], "y": env["y"], "z": env["z"], "w": env["w"][(slice(1, None, 2),) * n],
            "xt": env["xt"].permute(*reversed(range(n))), "noise": env["noise"]}


class Lib:
    """What the expression builder needs, for tinyllm (on one device) and for torch."""
    def __init__(self, name, dtype_name, device=None):
        self.torch = name == "torch"
        self.dtype = DTYPES[dtype_name][1 if self.torch else 0]
        self.dtype_name, self.device = dtype_name, device
        self.F = torch.nn.functional if self.torch else F

    def tensor(self, array, requires_grad=False):
        if self.torch:
            return torch.tensor(array, requires_grad=requires_grad)
        return tl.tensor(array, device=self.device, requires_grad=requires_grad)

    def full(self, shape, value):
        if self.torch:
            return torch.full(shape, value, dtype=self.dtype)
        return tl.full(shape, value, dtype=self.dtype, device=self.device)

    def where(self, c, a, b):
        return torch.where(c, a, b) if self.torch else tl.where(c, a, b)

    def other_float(self, a):
        """A round trip through the other float dtype (a CAST pair)."""
        return a.float().double() if self.dtype_name == "float64" else a.double().float()


def lib_of(env):
    """The Lib whose tensors these are (run_graph makes the tensors; the expression needs their library)."""
    t = env["x"]
    if isinstance(t, torch.Tensor):
        return Lib("torch", "float64" if t.dtype == torch.float64 else "float32")
    return Lib(t.device, t.dtype.name, t.device)


def build_expr(expr, leaves, lib, shape, const_sites):
    n = len(shape)
    const_sites.at = 0

    def lift(v):
        return lib.full((1,) * n, v) if isinstance(v, float) else v

    def go(e):
        kind = e[0]
        if kind == "in":
            return leaves[e[1]]
        if kind == "c":
            return e[1]
        if kind in BINARY:
            a, b = go(e[1]), go(e[2])
            if isinstance(a, float):
                a = lift(a)
            return {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
                    "div": lambda: a / (lift(b) * b + 1.0), "max": lambda: a.maximum(lift(b) + 0.3183),
                    "min": lambda: a.minimum(lift(b) - 0.2718)}[kind]()
        if kind == "where":
            return lib.where(lift(go(e[1])) > 0, lift(go(e[2])), lift(go(e[3])))
        if kind == "masked_fill":
            a, m = lift(go(e[1])), lift(go(e[2])) > 0.5
            return a.expand(*np.broadcast_shapes(tuple(a.shape), tuple(m.shape))).masked_fill(m, -1.25)
        if kind in ("sum", "amax", "mean"):
            a, mask, keepdim = lift(go(e[1])), e[2], e[3]
            if const_sites(a):
                a = a + leaves["noise"]
            if kind == "amax" and e[1][0] != "in":
                a = a.detach()  # NaN gradients on c (test_amax_gradient_of_a_recomputed_value, xfail)
            dims = tuple(d for d in range(n) if mask >> d & 1) or tuple(range(n))
            r = getattr(a, kind)(dims, keepdim=keepdim)
            if not keepdim:
                for d in dims:
                    r = r.unsqueeze(d)
            return r
        if kind == "perm":
            a, b, p = lift(go(e[1])), lift(go(e[2])), [d for d in e[3] if d < n]
            inv = np.argsort(p).tolist()
            return (a.permute(*p) + b.permute(*p).tanh()).permute(*inv)
        a, k = lift(go(e[1])), e[2]
        if kind in ("softmax", "log_softmax") and const_sites(a):
            a = a + leaves["noise"]
        if kind == "softmax":
            return a.softmax(k % n)
        if kind == "log_softmax":
            return a.log_softmax(k % n)
        if kind == "layer_norm":
            return lib.F.layer_norm(a + leaves["noise"], (shape[-1],))
        if kind == "count":  # bool -> int64 casts and an int64 reduction (sum or max), then back to float
            hits = (a > 0.25).long()
            r = hits.amax(k % n, keepdim=True) if k >= 4 and not const_sites(hits) else hits.sum(k % n, keepdim=True)
            return a * r.to(lib.dtype)
        if kind == "slice_bc":  # a slice of length 1, broadcast back over its axis
            ax = k % n
            return a * a.narrow(ax, k % a.shape[ax], 1) if a.shape[ax] > 1 else a * 2.0
        if kind == "reshape":  # an elementwise op between reshapes of a permuted (non-contiguous) view
            p = [d for d in [(k + i) % n for i in range(n)]]
            b = a.permute(*p)
            return (b.reshape(-1) * 1.5).reshape(*b.shape).permute(*np.argsort(p).tolist())
        return {"neg": lambda: -a, "exp": lambda: a.tanh().exp(), "tanh": lambda: a.tanh(),
                "sigmoid": lambda: a.sigmoid(), "sq": lambda: a * a.tanh(), "log1p": lambda: (a * a + 1.0).log(),
                "sqrt1p": lambda: (a * a + 1.0).sqrt(), "recip1p": lambda: 1.0 / (a * a + 1.0),
                "relu": lambda: a.relu(), "abs": lambda: a.abs(),
                "gelu_tanh": lambda: lib.F.gelu(a, approximate="tanh"), "gelu_erf": lambda: lib.F.gelu(a),
                "cast": lambda: lib.other_float(a), "step": lambda: (a < 0.1).to(lib.dtype) * a,
                "clamp": lambda: a.clamp(-0.75, 0.5)}[kind]()
    return go(expr)


def run_graph(fn, arrays, upstream, lib, interpreter=False):
    """Forward value and input gradients of fn(leaves) under `lib`, backpropagating `upstream`. With
    `interpreter`, also check the pass on this graph through the NumPy interpreter (tinyllm only)."""
    env = {k: lib.tensor(v, requires_grad=k != "noise") for k, v in arrays.items()}
    out = fn(env)
    grad_names = [k for k in env if k != "noise"]
    if lib.torch:
        out.backward(torch.tensor(upstream))
        grads = {k: None if env[k].grad is None else env[k].grad.numpy() for k in grad_names}
        return out.detach().numpy(), grads
    g = lib.tensor(upstream)
    if interpreter:
        gs = gradients(out.node, g.node, [env[k].node for k in grad_names])
        roots = [out.node] + [gs[env[k].node] for k in grad_names if gs[env[k].node] is not None]
        check_fused_interpreter(roots, lib.dtype_name)
    out.backward(gradient=g)
    grads = {k: None if env[k].grad is None else env[k].grad.numpy() for k in grad_names}
    return out.numpy(), grads


def compare_all(fn, arrays, upstream, dtype_name, what):
    """c, numpy, torch and the fused interpreter: forward values and every input's gradient."""
    ref_v, ref_g = run_graph(fn, arrays, upstream, Lib("numpy", dtype_name, "numpy"), interpreter=True)
    c_v, c_g = run_graph(fn, arrays, upstream, Lib("c", dtype_name, "c"))
    t_v, t_g = run_graph(fn, arrays, upstream, Lib("torch", dtype_name))
    tol = TOL[dtype_name]
    close(c_v, ref_v, tol["c"], f"{what}: forward, c vs numpy")
    close(ref_v, t_v, tol["torch"], f"{what}: forward, numpy vs torch")
    close(c_v, t_v, tol["torch"], f"{what}: forward, c vs torch")
    for k in t_g:
        assert (ref_g[k] is None) == (t_g[k] is None), f"{what}: grad of {k} is None in one of numpy, torch"
        assert (c_g[k] is None) == (t_g[k] is None), f"{what}: grad of {k} is None in one of c, torch"
        if t_g[k] is not None:
            close(c_g[k], ref_g[k], tol["c"], f"{what}: grad of {k}, c vs numpy")
            close(ref_g[k], t_g[k], tol["torch"], f"{what}: grad of {k}, numpy vs torch")
            close(c_g[k], t_g[k], tol["torch"], f"{what}: grad of {k}, c vs torch")


@settings(deadline=None, max_examples=20)
@given(exprs, st.sampled_from(SHAPES), st.sampled_from(["float32", "float32", "float64"]), SEEDS)
def test_fusion_keeps_values_and_gradients_on_random_graphs(expr, shape, dtype_name, seed):
    rng = np.random.default_rng(seed)
    np_dtype = DTYPES[dtype_name][2]
    arrays = leaf_arrays(shape, rng, np_dtype)
    upstream = rng.standard_normal(shape).astype(np_dtype)

    sites = ConstSites()

    def fn(env):
        leaves = leaf_views(env, shape)
        return build_expr(expr, leaves, lib_of(env), shape, sites) + leaves["x"]

    fn({k: tl.tensor(v, device="numpy") for k, v in arrays.items()})
    sites.recording = False
    compare_all(fn, arrays, upstream, dtype_name, f"{expr} on {shape} {dtype_name}")


# ---- composites ------------------------------------------------------------------------------------------

COMPOSITES = {
    "softmax": lambda x, lib: x.softmax(-1) * x.softmax(0),
    "log_softmax": lambda x, lib: x.log_softmax(-1) + x.transpose(0, -1).log_softmax(0).transpose(0, -1),
    "layer_norm": lambda x, lib: lib.F.layer_norm(x, x.shape[-1:]) * x.tanh(),
    "gelu_tanh": lambda x, lib: lib.F.gelu(x, approximate="tanh"),
    "gelu_erf": lambda x, lib: lib.F.gelu(x.transpose(0, -1)).transpose(0, -1),
    "masked_softmax": lambda x, lib: x.masked_fill(x.amax(-1, keepdim=True) - x > 1.0, -math.inf).softmax(-1),
    "amax_amin": lambda x, lib: x.amax(-1, keepdim=True) * x + x.amin(0, keepdim=True).tanh(),
    "mean_var": lambda x, lib: (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True) + 1e-3).sqrt(),
}
COMPOSITE_SHAPES = [(4, 8), (3, 1, 9), (2, 3, 5, 8)]


@pytest.mark.parametrize("name", sorted(COMPOSITES))
@settings(deadline=None, max_examples=6)
@given(shape=st.sampled_from(COMPOSITE_SHAPES), dtype_name=st.sampled_from(["float32", "float64"]), seed=SEEDS)
def test_fusion_keeps_composites(name, shape, dtype_name, seed):
    rng = np.random.default_rng(seed)
    np_dtype = DTYPES[dtype_name][2]
    arrays = {"x": (rng.standard_normal(shape) * 2).astype(np_dtype)}
    upstream = rng.standard_normal(shape).astype(np_dtype)
    compare_all(lambda env: COMPOSITES[name](env["x"], lib_of(env)), arrays, upstream, dtype_name,
                f"{name} on {shape} {dtype_name}")


@settings(deadline=None, max_examples=8)
@given(shape=st.sampled_from([(8, 5), (3, 4, 9), (2, 8)]), smoothing=st.sampled_from([0.0, 0.1]), seed=SEEDS)
def test_fusion_keeps_cross_entropy(shape, smoothing, seed):
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal(shape) * 3).astype(np.float32)
    # (N, C) or (N, C, d): class axis 1; some targets ignored
    target_shape = shape[:1] + shape[2:]
    target = rng.integers(0, shape[1], target_shape)
    target[rng.random(target_shape) < 0.2] = -100
    target.reshape(-1)[0] = 0  # at least one target counts
    results = {}
    for name, lib in (("numpy", Lib("numpy", "float32", "numpy")), ("c", Lib("c", "float32", "c")),
                      ("torch", Lib("torch", "float32"))):
        x = lib.tensor(logits, requires_grad=True)
        t = torch.tensor(target) if lib.torch else tl.tensor(target, device=lib.device)
        loss = lib.F.cross_entropy(x, t, label_smoothing=smoothing)
        if name == "numpy":
            gs = gradients(loss.node, tl.tensor(np.float32(1.0), device="numpy").node, [x.node])
            check_fused_interpreter([loss.node, gs[x.node]], "float32")
        loss.backward()
        results[name] = (loss.detach().numpy() if lib.torch else loss.numpy(), x.grad.numpy())
    for i, what in enumerate(["loss", "grad"]):
        close(results["c"][i], results["numpy"][i], TOL["float32"]["c"], f"cross_entropy {what}: c vs numpy")
        close(results["c"][i], results["torch"][i], TOL["float32"]["torch"], f"cross_entropy {what}: c vs torch")
        close(results["numpy"][i], results["torch"][i], TOL["float32"]["torch"],
              f"cross_entropy {what}: numpy vs torch")


def test_run_kernel_keeps_a_0d_shape():
    x = tl.tensor(np.arange(8, dtype=np.float32), device="numpy")
    (root,) = run_passes([(x.sum() * 2.0).node], FUSION_PASSES)
    assert root.op == "FUSED" and root.shape == ()
    (out,) = get_runtime("numpy").execute(Schedule([root]))
    assert out.shape == () and out.numpy().shape == () and out.numpy() == 56.0


@pytest.mark.parametrize("case", ["amax_c", "amax_c_plus", "sum_c", "amax_interpreter"])
def test_reduction_of_a_constant(case):
    if case == "amax_c":
        assert tl.zeros(3, device="c").amax().numpy() == 0.0
    elif case == "amax_c_plus":
        assert ((tl.full((3,), 0.5, device="c").amax(0) + tl.ones(3, device="c")).numpy() == 1.5).all()
    elif case == "sum_c":
        np.testing.assert_allclose(tl.full((3,), 0.1, device="c").sum().numpy(), 0.3, rtol=1e-6)
    else:
        (root,) = run_passes([tl.zeros(3, device="numpy").amax(0).node], FUSION_PASSES)
        assert get_runtime("numpy").execute(Schedule([root]))[0].numpy().reshape(()) == 0.0


def test_amax_gradient_of_a_recomputed_value():
    bad = []
    for seed in range(30):
        rng = np.random.default_rng(seed)
        x = tl.tensor(rng.standard_normal((4, 8)).astype(np.float32), device="c", requires_grad=True)
        (x + x.tanh()).amax(1).sum().backward()
        g = x.grad.numpy()
        if np.isnan(g).any() or not np.all(np.count_nonzero(g, axis=1) >= 1):
            bad.append(seed)
    assert not bad, f"NaN or empty gradient rows for seeds {bad}"


def test_reductions_of_constants_that_simplify_folds_work():
    """The same graphs on the NumPy runtime, and the sums simplify folds exactly, run fine: the xfail above is
    about the C runtime's fused kernels."""
    assert tl.zeros(3, device="numpy").amax().numpy() == 0.0
    np.testing.assert_allclose(tl.full((3,), 0.1, device="numpy").sum().numpy(), 0.3, rtol=1e-6)
    assert tl.full((4,), 0.5, device="c").sum().numpy() == 2.0


# ---- fusion happens: kernel counts of the schedules the C runtime runs -------------------------------------



def ops_of(schedule):
    return [n.op for n in schedule.kernels]


def rand(*shape, seed=0, device="c", dtype=np.float32, requires_grad=False):
    return tl.tensor(np.random.default_rng(seed).standard_normal(shape).astype(dtype), device=device,
                     requires_grad=requires_grad)


def test_elementwise_chain_is_one_kernel(c_schedules):
    x, y = rand(5, 8, seed=1), rand(5, 8, seed=2)
    z = rand(8, seed=3)

    def chain(x, y, z):
        a = (x * 2.0 + y).exp()
        b = (a + z).tanh().maximum(y)  # z broadcast over the rows (a - z would negate z before the broadcast:
        # an op before a view is a kernel of its own)
        return (b * b + 1.0).sqrt().reciprocal() * x
    out = chain(x, y, z).numpy()
    assert ops_of(c_schedules[-1]) == ["FUSED"], ops_of(c_schedules[-1])
    (k,) = c_schedules[-1].kernels
    assert k.arg.reduce is None and len([c for c in k.arg.code if c[0] not in ("IN", "CONST")]) >= 10
    want = chain(*(tl.tensor(t.numpy(), device="numpy") for t in (x, y, z))).numpy()
    close(out, want, TOL["float32"]["c"], "chain")


def test_elementwise_into_reduction_is_one_kernel(c_schedules):
    x, y = rand(4, 3, 8, seed=1), rand(4, 1, 8, seed=2)
    for dims in [-1, 0, (0, 2), 1]:
        out = ((x * y).exp() - x.tanh()).sum(dims)
        got = out.numpy()
        assert ops_of(c_schedules[-1]) == ["FUSED"] or ops_of(c_schedules[-1]) == ["FUSED", "RESHAPE"], \
            ops_of(c_schedules[-1])
        (k,) = [n for n in c_schedules[-1].kernels if n.op == "FUSED"]
        assert k.arg.reduce is not None and k.arg.reduce[0] == "SUM"
        x64, y64 = x.numpy().astype(np.float64), y.numpy().astype(np.float64)
        want = (np.exp(x64 * y64) - np.tanh(x64)).sum(dims)
        close(got, want.astype(np.float32), TOL["float32"]["torch"], f"sum over {dims}")


def test_views_between_ops_fold_into_one_kernel(c_schedules):
    x, y = rand(8, 5, seed=1), rand(5, 8, seed=2)
    big = rand(17, 6, seed=3)
    out = ((x.T.exp() + y).tanh() * big[1::2, 1:].T).numpy()  # a transpose and a strided slice, no copy
    assert ops_of(c_schedules[-1]) == ["FUSED"], ops_of(c_schedules[-1])
    want = np.tanh(np.exp(x.numpy().T) + y.numpy()) * big.numpy()[1::2, 1:].T
    close(out, want, TOL["float32"]["torch"], "views")


def _softmax(x): return x.softmax(-1)
def _layer_norm(x): return F.layer_norm(x, x.shape[-1:])
def _sub_broadcast(x): return (x.exp() - x[:1]).tanh() * x  # x[:1] is negated before its broadcast


# Kernels (all FUSED, plus free reshapes) each forward takes: reductions each end a kernel; an elementwise producer
# read through a view (the row max negated, then broadcast) is inlined like any other. softmax = max, exp (stored:
# both the sum and the normalisation read it), sum, normalise; layer_norm = mean, variance, normalise.
FORWARD_KERNELS = {"softmax": (_softmax, 4, 2), "layer_norm": (_layer_norm, 3, 2),
                   "sub_broadcast": (_sub_broadcast, 1, 0)}


@pytest.mark.parametrize("name", sorted(FORWARD_KERNELS))
def test_forward_kernel_counts(name, c_schedules):
    fn, most, reductions = FORWARD_KERNELS[name]
    x = rand(6, 16, seed=4)
    got = fn(x).numpy()
    ops = ops_of(c_schedules[-1])
    assert set(ops) <= {"FUSED", "RESHAPE"}, ops
    assert ops.count("FUSED") <= most, ops
    assert sum(1 for n in c_schedules[-1].kernels if n.op == "FUSED" and n.arg.reduce) == reductions
    close(got, fn(tl.tensor(x.numpy(), device="numpy")).numpy(), TOL["float32"]["c"], name)


def test_broadcast_producer_inlined_only_when_cheap(c_schedules):
    """Read through a broadcast, a producer is recomputed for every repeat: a cheap one is inlined, a costly one
    (more than RECOMPUTE_MAX_OPS) is computed once and stored."""
    x, col = rand(6, 16, seed=1), rand(6, 1, seed=2)

    def costly(c):
        for _ in range(8):
            c = (c * 0.5).tanh() + 0.25
        return c
    for producer, kernels in ((lambda c: -c, 1), (costly, 2)):
        got = (x * producer(col).expand(6, 16)).numpy()
        assert ops_of(c_schedules[-1]).count("FUSED") == kernels, ops_of(c_schedules[-1])
        want = x.numpy() * producer(tl.tensor(col.numpy(), device="numpy")).numpy()
        close(got, want, TOL["float32"]["c"], "broadcast producer")


def test_softmax_backward_is_fused(c_schedules):
    up = rand(6, 16, seed=5)
    x = rand(6, 16, seed=4, requires_grad=True)
    (x.softmax(-1) * up).sum().backward()
    step = c_schedules[-1]
    assert not [o for o in ops_of(step) if o in ELEMENTWISE | REDUCE], ops_of(step)
    assert sum(o == "FUSED" for o in ops_of(step)) <= 10, ops_of(step)
    t = torch.tensor(x.numpy(), requires_grad=True)
    (t.softmax(-1) * torch.tensor(up.numpy())).sum().backward()
    close(x.grad.numpy(), t.grad.numpy(), TOL["float32"]["torch"], "softmax grad")


def test_gelu_forward_is_one_kernel(c_schedules):
    x = rand(4, 8, 16, seed=6)
    for approximate in ["tanh", "none"]:
        got = F.gelu(x, approximate=approximate).numpy()
        assert ops_of(c_schedules[-1]) == ["FUSED"], ops_of(c_schedules[-1])
        want = torch.nn.functional.gelu(torch.tensor(x.numpy()), approximate=approximate).numpy()
        close(got, want, TOL["float32"]["torch"], f"gelu {approximate}")


def test_gelu_backward_is_one_kernel(c_schedules):
    """tanh's value has two uses in GELU's backward; both fuse into one kernel, so it is computed once there and
    never stored (the kernel of a value whose every use ended up in one consumer is absorbed by it)."""
    x = rand(4, 8, 16, seed=8, requires_grad=True)
    up = rand(4, 8, 16, seed=9)
    (F.gelu(x, approximate="tanh") * up).sum().backward()
    grad_kernels = [n for n in c_schedules[-1].kernels if n.op == "FUSED" and n.shape == x.shape]
    assert len(grad_kernels) == 1 and sum(c[0] == "TANH" for c in grad_kernels[0].arg.code) == 1, grad_kernels
    t = torch.tensor(x.numpy(), requires_grad=True)
    (torch.nn.functional.gelu(t, approximate="tanh") * torch.tensor(up.numpy())).sum().backward()
    close(x.grad.numpy(), t.grad.numpy(), TOL["float32"]["torch"], "gelu grad")


def test_a_value_used_twice_is_computed_once_or_recomputed_cheaply(c_schedules):
    x = rand(4, 8, seed=7)
    # an expensive shared value (more than RECOMPUTE_MAX_OPS ops) is stored once; both users read it
    e = x
    for _ in range(8):
        e = (e * 1.01 + 0.5).tanh()
    out = (e.sum(-1, keepdim=True) + e).numpy()
    ks = c_schedules[-1].kernels
    assert [n.op for n in ks] == ["FUSED"] * len(ks) and 2 <= len(ks) <= 3
    want = x.numpy().astype(np.float64)
    for _ in range(8):
        want = np.tanh(want * 1.01 + 0.5)
    close(out, (want.sum(-1, keepdims=True) + want).astype(np.float32), TOL["float32"]["torch"], "shared")


def test_empty_shapes():
    for shape, dims in [((3, 0), -1), ((0, 4), 0), ((0, 4), 1), ((2, 0, 3), (0, 1))]:
        a = np.zeros(shape, np.float32)
        for dev in ("c", "numpy"):
            x = tl.tensor(a, device=dev)
            e = (x.exp() * 2.0 + 1.0).tanh()
            s = (x.exp() * 2.0).sum(dims)
            assert e.numpy().shape == shape
            np.testing.assert_array_equal(s.numpy(), np.zeros(np.sum(a, axis=dims).shape, np.float32))


# ---- IEEE special values: C against NumPy exactly ---------------------------------------------------------

EXP_SAFE = [np.inf, -np.inf, np.nan, 0.0, -0.0, 100.0, -200.0, 1e30, -1e30]  # exp/tanh exact for these
DYADIC = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1.0, -2.0, 0.5, 3.0, -0.25]  # sums of these are exact

SPECIAL_CASES = {
    "exp": (EXP_SAFE, lambda x, y: x.exp(), True),
    "tanh": (EXP_SAFE, lambda x, y: x.tanh(), True),
    "neg_tanh": (EXP_SAFE, lambda x, y: (-x).tanh() * y.exp(), True),
    "maximum": (DYADIC, lambda x, y: x.maximum(y), "nozero_tie"),
    "minimum": (DYADIC, lambda x, y: x.minimum(y), "nozero_tie"),
    "where": (DYADIC, lambda x, y: tl.where(x > y, x, y * 2.0), True),
    "where_nan": (DYADIC, lambda x, y: tl.where(x == x, y, -x), True),
    "mul_add": (DYADIC, lambda x, y: x * y + x, True),
    "sum_rows": (DYADIC, lambda x, y: (x * y).sum(-1), True),
    "sum_cols": (DYADIC, lambda x, y: (x + y).sum(0), True),
    "sum_all": (DYADIC, lambda x, y: (x - y).sum(), True),
    "exp_sum": (EXP_SAFE, lambda x, y: x.exp().sum(-1), True),
    "amax_rows": (DYADIC, lambda x, y: (x * y).amax(-1), False),
    "amax_cols": (DYADIC, lambda x, y: (x + y).amax(0), False),
    "amax_all": (DYADIC, lambda x, y: x.amax(), False),
    "amax_3d": (DYADIC, lambda x, y: (x.reshape(2, 4, 8) * 2.0).amax((0, 2)), False),
    "tanh_amax": (EXP_SAFE, lambda x, y: x.tanh().amax(-1), False),
    "softmax": (EXP_SAFE, lambda x, y: x.softmax(-1), True),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(SPECIAL_CASES))
def test_ieee_special_values_match_numpy_exactly(name, dtype):
    """inf, -inf, nan and -0.0 through the C kernels: the same values as the NumPy runtime, NaN for NaN, and the
    same sign of zero, except for amax (the max of 0.0 and -0.0 is either: NumPy's and torch's reductions give the
    one that the order they visit them picks) and for max(0.0, -0.0) itself."""
    pool, fn, signs = SPECIAL_CASES[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    a = rng.choice(np.array(pool, dtype), (8, 8))
    b = rng.choice(np.array(pool, dtype), (8, 8))
    a[0, :] = np.nan
    a[1, :] = -np.inf
    a[2, :], b[2, :] = -0.0, -0.0
    got = fn(tl.tensor(a, device="c"), tl.tensor(b, device="c")).numpy()
    want = fn(tl.tensor(a, device="numpy"), tl.tensor(b, device="numpy")).numpy()
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want, err_msg=f"{name}: C vs NumPy")
    assert np.array_equal(np.isnan(got), np.isnan(want))
    if signs:
        check = ~np.isnan(want)  # the sign of a NaN means nothing
        if signs == "nozero_tie":  # max(0.0, -0.0): NumPy and C both return the second, but IEEE leaves it open
            check &= ~((a == 0) & (b == 0))
        np.testing.assert_array_equal(np.signbit(got)[check], np.signbit(want)[check],
                                      err_msg=f"{name}: sign of zero, C vs NumPy")


def test_special_value_semantics_of_c_kernels():
    """The IEEE results themselves (not only agreement with NumPy)."""
    inf, nan = np.inf, np.nan
    x = tl.tensor(np.array([inf, -inf, nan, -0.0, 0.0, 89.0, -104.0, 1e-45], np.float32), device="c")
    e, t = x.exp().numpy(), x.tanh().numpy()
    assert e[0] == inf and e[1] == 0 and np.isnan(e[2]) and e[3] == 1 and e[4] == 1 and e[5] == inf and e[6] == 0
    assert e[7] == 1
    assert t[0] == 1 and t[1] == -1 and np.isnan(t[2]) and t[3] == 0 and np.signbit(t[3]) and not np.signbit(t[4])
    assert t[7] == np.float32(1e-45)
    rows = tl.tensor(np.array([[1.0, nan, 2.0], [-inf, -inf, -inf], [nan, nan, 1.0], [inf, -inf, 0.0]], np.float32),
                     device="c")
    m = rows.amax(-1).numpy()
    assert np.isnan(m[0]) and m[1] == -inf and np.isnan(m[2]) and m[3] == inf
    s = rows.sum(-1).numpy()
    assert np.isnan(s[0]) and s[1] == -inf and np.isnan(s[2]) and np.isnan(s[3])
    mx = rows.maximum(tl.tensor(np.float32(0.0), device="c")).numpy()
    assert np.isnan(mx[0, 1]) and mx[1, 0] == 0 and np.isnan(mx[2, 0])


# ---- accuracy of C's float32 exp and tanh -------------------------------------------------------------

def _ulp32(ref):
    """The float32 ulp at each float64 value (subnormal spacing below the normal range)."""
    _, e = np.frexp(np.abs(ref))
    return np.maximum(np.ldexp(1.0, (e - 24).astype(np.int32)), 2.0 ** -149)


def _accuracy_inputs():
    bits = np.arange(0, 2 ** 32, 2039, dtype=np.uint64).astype(np.uint32).view(np.float32)  # every exponent
    dense = [np.linspace(-110, 95, 600_001), np.linspace(-12, 12, 600_001), np.linspace(-1, 1, 200_001),
             np.geomspace(1e-40, 1e-2, 50_001), -np.geomspace(1e-40, 1e-2, 50_001),
             np.array([3.4028235e38, -3.4028235e38, 1e-45, -1e-45, 88.72283, 88.72284, -87.33654, -103.97208,
                       -103.97209, 0.625, -0.625, 9.0, -9.0, 0.0, -0.0, np.inf, -np.inf, np.nan])]
    x = np.concatenate([bits] + [d.astype(np.float32) for d in dense])
    return x


@pytest.mark.parametrize("op", ["exp", "tanh"])
def test_c_float32_exp_and_tanh_within_their_ulp_bounds(op, c_schedules):
    x = _accuracy_inputs()
    got = getattr(tl.tensor(x, device="c"), op)().numpy()
    (kernel,) = c_schedules[-1].kernels  # C's function, not NumPy's
    assert kernel.op == "FUSED" and c_schedules[-1].prepared["c"].get(kernel) is not None
    with np.errstate(all="ignore"):
        ref = getattr(np, op)(x.astype(np.float64))
    nan = np.isnan(x)
    assert np.isnan(got[nan]).all(), f"{op}(nan) must be nan"
    assert not np.isnan(got[~nan]).any(), f"{op} gave nan for {x[~nan][np.isnan(got[~nan])][:5]}"
    g, r = got[~nan].astype(np.float64), ref[~nan]
    with np.errstate(all="ignore"):
        err = np.abs(g - r) / _ulp32(r)
        r32 = r.astype(np.float32)  # correctly rounded (inf where it overflows)
    err[np.isinf(r32) & (g == r32)] = 0.0
    worst = int(np.argmax(err))
    assert err[worst] <= ULP_MAX[op], (f"{op}({x[~nan][worst]!r}) = {got[~nan][worst]!r}, float64 reference "
                                   f"{r[worst]!r}: {err[worst]:.2f} ulp")
    assert np.array_equal(np.signbit(got[~nan][r == 0]), np.signbit(r[r == 0]))  # tanh(-0) = -0


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 12), limit=st.integers(3, 6), seed=st.integers(0, 2**32 - 1))
def test_max_inputs_bounds_every_kernel(n, limit, seed):
    """fuse(max_inputs=k), as the WGSL runtime runs it with its device's storage-buffer limit: no kernel reads more
    than k buffers, and the values are the unbounded pass's."""
    rng = np.random.default_rng(seed)
    xs = [tl.tensor(rng.standard_normal((3, 5)).astype(np.float32), device="numpy") for _ in range(n)]
    y = xs[0].tanh()
    for i, x in enumerate(xs[1:]):  # a chain where every step brings a new input
        y = (y * x).exp() if i % 2 else y + x.tanh()
    roots = run_passes([y.node], SCHEDULE)
    bounded, free = fuse(roots, max_inputs=limit), fuse(roots)
    widest = max(len(k.src) for k in toposort(bounded) if k.op == "FUSED")
    assert widest <= limit
    run = lambda r: get_runtime("numpy").execute(Schedule(r))[0].numpy()  # noqa: E731
    np.testing.assert_array_equal(run(bounded), run(free))
    if n > limit:  # the bound did cut the chain
        assert sum(k.op == "FUSED" for k in toposort(bounded)) > sum(k.op == "FUSED" for k in toposort(free))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # reads [-1]
@given(shape=st.sampled_from(SHAPES), seed=SEEDS)
def test_fuse_outputs_keeps_an_adam_update_and_its_gradients(shape, seed, c_schedules):
    """fuse_outputs (C runtime): an Adam update's new p, m and v are one kernel with three outputs, and equal the
    unfused graph's (NumPy runtime) and torch's values; so are two gradients of one shape, which it merges too."""
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)] + \
             [rng.uniform(0.1, 1.0, shape).astype(np.float32)]

    def adam(p, g, m, v, lib):
        m = m * 0.9 + g * 0.1
        v = v * 0.999 + g * g * 0.001
        return p - 0.01 * m / ((v * 1000.0).sqrt() + 1e-8), m, v
    got = adam(*[tl.tensor(a, device="c") for a in arrays], tl)
    tl.realize(*got)
    (k,) = [n for n in c_schedules[-1].kernels if n.op == "FUSED"]
    assert k.arg.outs is not None and len(k.arg.outs) == 3 and len(k.src) == 4, "p, m, v: one kernel reading p, g, m, v"
    want = adam(*[tl.tensor(a, device="numpy") for a in arrays], tl)
    ref = adam(*[torch.from_numpy(a) for a in arrays], torch)
    for name, a, b, t in zip("pmv", got, want, ref):
        close(a.numpy(), b.numpy(), TOL["float32"]["c"], name)
        close(a.numpy(), t.numpy(), TOL["float32"]["torch"], name)

    x, y, w = (tl.tensor(a, device="c", requires_grad=True) for a in arrays[:3])
    (x * y * w.tanh()).sum().backward()
    grads = [x.grad, y.grad]
    assert any(n.op == "FUSED" and n.arg.outs is not None for n in c_schedules[-1].kernels)
    tx, ty, tw = (torch.from_numpy(a).requires_grad_() for a in arrays[:3])
    (tx * ty * tw.tanh()).sum().backward()
    for g, t in zip(grads, (tx.grad, ty.grad)):
        close(g.numpy(), t.numpy(), TOL["float32"]["torch"], "gradient")


def test_fuse_outputs_leaves_dependent_or_unrelated_outputs_alone():
    """Outputs that read nothing in common, or where one reads the other, stay separate kernels."""
    a, b = rand(4, 8, seed=1, device="numpy"), rand(4, 8, seed=2, device="numpy")
    roots = fuse(run_passes([(a.exp()).node, (b * 2.0).node], SCHEDULE))
    assert fuse_outputs(roots) == roots
    first = a
    for _ in range(8):  # too long to recompute in its user: the second output reads the first one's buffer
        first = (first * 0.5).tanh()
    roots = fuse(run_passes([first.node, (first * a).node], SCHEDULE))
    assert roots[0] in roots[1].src
    assert fuse_outputs(roots) == roots
