"""The rewrite passes, each rule on its own and, on random expression graphs, every pass: they keep forward values
and gradients (bit for bit, up to the summation order of reductions whose input layout a rewrite changed), and both
agree with torch. The engine under them is tested in test_rewrite_engine.py."""
import math
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import tinyllm as tl
from tinyllm import dtype as dt
from tinyllm.graph import OPS, build, const
from tinyllm.rewrite import graph_rewrite, tracing
from tinyllm.rewrite.cse import cse
from tinyllm.ops import Group
from tinyllm.rewrite.simplify import FOLDABLE, simplify
from tinyllm.runtime import get as get_runtime
from tinyllm.schedule import Schedule

import tinyllm.realizer as R
from tinyllm.rewrite import pipeline as P
from tinyllm.rewrite.layout import layout
SETTINGS = settings(deadline=None, max_examples=30)


@pytest.fixture(autouse=True, scope="module")
def reference_runtime():
    """These passes are checked bit for bit on the reference runtime; the C runtime's fusion is tested apart."""
    saved = os.environ.get("TINYLLM_RUNTIME")
    os.environ["TINYLLM_RUNTIME"] = "numpy"
    yield
    if saved is None:
        del os.environ["TINYLLM_RUNTIME"]
    else:
        os.environ["TINYLLM_RUNTIME"] = saved


def leaf(*shape, seed=0):
    return tl.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32)).node


def evaluate(node):
    """The node's value on the NumPy runtime, the graph run exactly as built (no passes)."""
    return get_runtime("numpy").execute(Schedule([node]))[0].numpy()


def fired_rules(fired, pass_name=None):
    return {f.rule for f in fired if pass_name is None or f.pass_name == pass_name}


class with_passes:
    """Run realize with only these passes of the schedule stage (names from the pipeline's PASSES["schedule"])."""
    def __init__(self, names):
        self.passes = [p for p in P.PASSES["schedule"] if p[0] in names]

    def __enter__(self):
        self.saved, P.PASSES["schedule"] = P.PASSES["schedule"], self.passes
        self.cached, R.CACHE_SCHEDULES = R.CACHE_SCHEDULES, False

    def __exit__(self, *exc):
        P.PASSES["schedule"], R.CACHE_SCHEDULES = self.saved, self.cached


# ---- simplify: each rule on its own, exact ----------------------------------------------------------------

def _x():
    return tl.tensor(np.array([[-0.0, 1.5, -2.25], [np.inf, -np.inf, np.nan]], dtype=np.float32), requires_grad=True)


RULE_CASES = {
    "drop_marker": lambda x: x + x.detach() * 0.5,
    "mul_one": lambda x: x * 1.0,
    "double_neg": lambda x: -(-x),
    "cast_cast": lambda x: x.double().float(),
    "where_same": lambda x: tl.where(x > 0, x, x),
    "where_const": lambda x: tl.where(tl.full(x.shape, True), x, 7.0),
    "fold_elementwise": lambda x: x + tl.full((2, 1), 2.0).exp() * 3.0,
    "fold_view": lambda x: x * 2.0,
    "fold_sum": lambda x: x + tl.full((2, 5), 0.75).sum(1, keepdim=True),
    "reshape_reshape": lambda x: x.reshape(3, 2).reshape(6).reshape(2, 3),
    "expand_expand": lambda x: x + x.sum(0, keepdim=True).reshape(1, 1, 3).expand(1, 2, 3).expand(2, 2, 3).sum(0),
    "permute_permute": lambda x: (x.reshape(2, 3, 1).permute(1, 0, 2).permute(0, 2, 1) * 2.0).permute(2, 0, 1)
                                 .reshape(2, 3),
}


def _run(fn, passes):
    """fn(x) forward and d(sum(fn(x) * w))/dx, realized with these passes, and the rules that fired."""
    with with_passes(passes), tracing() as fired, np.errstate(all="ignore"):  # inf and nan on purpose
        x = _x()
        y = fn(x)
        w = tl.tensor(np.arange(1, y.numel() + 1, dtype=np.float32).reshape(y.shape))
        out = y.numpy()
        (y * w).sum().backward()
        return out, x.grad.numpy(), fired


@pytest.mark.parametrize("rule", sorted(RULE_CASES))
def test_each_simplify_rule_fires_and_keeps_values_and_gradients_exactly(rule):
    out, grad, fired = _run(RULE_CASES[rule], ["simplify", "cse"])
    assert rule in fired_rules(fired, "simplify")
    ref_out, ref_grad, ref_fired = _run(RULE_CASES[rule], [])
    assert ref_fired == []
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(np.signbit(out), np.signbit(ref_out))  # -0.0 stays -0.0
    np.testing.assert_array_equal(grad, ref_grad)


def test_add_zero_folds_only_where_exact():
    i = tl.tensor([3, -4])
    with tracing() as fired:
        assert (i + 0).tolist() == [3, -4]
    assert "add_zero" in fired_rules(fired)
    x = tl.tensor(np.array([-0.0, 1.0], dtype=np.float32))
    with tracing() as fired:
        y = (x + 0.0).numpy()
    assert "add_zero" not in fired_rules(fired)  # -0.0 + 0.0 is +0.0: x + 0.0 is not x
    np.testing.assert_array_equal(np.signbit(y), np.signbit((torch.tensor([-0.0, 1.0]) + 0.0).numpy()))
    z = tl.tensor(np.zeros((7, 1, 3), np.float32))
    minus_zero = const(-0.0, z.shape)
    if math.copysign(1, minus_zero.arg) < 0:  # else a +0.0 CONST of this shape is alive: ±0.0 share one node
        assert graph_rewrite([build("ADD", minus_zero, z.node)], simplify)[0] is z.node  # x + (-0.0) is x


def test_unsafe_algebra_is_left_alone():
    x = tl.tensor(np.array([np.inf, -0.0, 2.0], dtype=np.float32))
    cases = [lambda: x * 0.0,                            # inf·0 is nan
             lambda: tl.full((3, 7), 0.1).sum(1),        # 0.1 summed 7 times is not 0.7·… exactly
             lambda: x.reshape(1, 3).sum(0),             # a sum over one element turns -0.0 into +0.0
             lambda: x.maximum(tl.zeros(3)),             # max(-0.0, 0.0) depends on the argument order
             lambda: tl.tensor(np.array([0.1]), dtype=tl.float64).float().double(),   # a lossy cast in the middle
             lambda: tl.tensor([2 ** 53 + 1]).double().long()]
    for case in cases:
        with with_passes(["simplify", "cse"]), np.errstate(invalid="ignore"):
            got = case().numpy()
        with with_passes([]), np.errstate(invalid="ignore"):
            want = case().numpy()
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


FOLD_VALUES = {dt.float32: [0.5, -0.0, 2.0, -1.5, 1e30, float("inf"), float("nan")],
               dt.float64: [0.1, -0.0, 3.0, -2.5, 1e300, float("-inf")],
               dt.int64: [0, 3, -7, 2 ** 40], dt.bool_: [True, False]}
DTYPES = list(FOLD_VALUES)


def _elementwise_case(op, draw):
    """Constant inputs (and the argument) for one elementwise op, of dtypes it accepts."""
    if op == "CAST":
        src = draw(st.sampled_from(DTYPES))
        return op, [const(draw(st.sampled_from(FOLD_VALUES[src])), (2, 3), src)], draw(st.sampled_from(DTYPES))
    if op == "WHERE":
        d = draw(st.sampled_from(DTYPES))
        return op, [const(draw(st.booleans()), (2, 3), dt.bool_)] + [
            const(draw(st.sampled_from(FOLD_VALUES[d])), (2, 3), d) for _ in range(2)], None
    if op == "IDIV":  # int64 only, and a zero divisor is an error (the front end refuses it before building)
        return op, [const(draw(st.sampled_from(v)), (2, 3), dt.int64) for v in (FOLD_VALUES[dt.int64], [3, -7])], None
    floats = op in ("EXP", "LOG", "SQRT", "RECIP", "TANH", "ERF", "SIN", "ATAN", "FLOOR", "FMOD")
    bitwise = op in ("BITAND", "BITOR", "BITXOR", "BITNOT")
    n = 2 if op in Group.BINARY else 1
    d = draw(st.sampled_from([dt.float32, dt.float64] if floats else [dt.int64, dt.bool_] if bitwise
                             else DTYPES[:3]))
    return op, [const(draw(st.sampled_from(FOLD_VALUES[d])), (2, 3), d) for _ in range(n)], None


def test_every_elementwise_op_is_folded():
    module_ops = {n for n, c in OPS.items() if c.__module__.endswith(".elementwise")}
    # (identities that passes remove: DETACH after differentiation, AUTOCAST in the autocast pass)
    assert module_ops - {"DETACH", "AUTOCAST"} <= FOLDABLE, "an elementwise op has no constant folding"


@SETTINGS
@given(st.sampled_from(sorted(FOLDABLE)), st.data())
def test_constant_folding_is_exact_and_keeps_dtype(op, data):
    op, srcs, arg = _elementwise_case(op, data.draw)
    node = build(op, *srcs, arg=arg)
    with np.errstate(all="ignore"):
        want = evaluate(node)
        with tracing() as fired:
            (out,) = graph_rewrite([node], simplify)
    # folded (by fold_elementwise, or first by an identity such as add_zero), unless ±0.0 got in the way
    assert out.op == "CONST" or (fired == [] and out is node)
    assert out.shape == node.shape and out.dtype is node.dtype
    got = evaluate(out)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    if got.dtype.kind == "f":
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@SETTINGS
@given(st.sampled_from([dt.float32, dt.float64, dt.int64]), st.floats(-1e6, 1e6, width=32) | st.sampled_from(
       [0.1, -0.0, 1 / 3, 2.0 ** -140, 2.0 ** 100, float("inf"), float("nan")]),
       st.lists(st.integers(0, 40), min_size=1, max_size=3), st.data())
def test_sum_of_a_constant_folds_only_when_exact(dtype, value, shape, data):
    if dtype is dt.int64:
        value = int(value) if math.isfinite(value) and abs(value) < 2 ** 62 else 2 ** 62 + 3
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1))))
    node = build("SUM", const(value, tuple(shape), dtype), arg=axes)
    with np.errstate(all="ignore"):
        want = evaluate(node)
    (out,) = graph_rewrite([node], simplify)
    assert out is node or out.op == "CONST"
    got = evaluate(out)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


# ---- random expression graphs: each pass keeps forward values and gradients ---------------------------------

S = (2, 3, 4)
# No -0.0 here: graph.const hash-conses 0.0 and -0.0 into one node (whichever is alive), so a graph with both
# would change with what else is alive; the signed-zero behaviour has its own tests above.
CONSTS = [0.0, 1.0, -1.0, 2.0, 0.5, 3.0]
FULL_SHAPES = [(1, 3, 1), (2, 1, 4), (1, 1, 1), S]
UNARY = ["neg", "tanh", "exp", "sigmoid", "sq", "log1p", "sqrt1p", "neg2", "cast", "detach", "flat", "expand", "perm3"]
BINARY = ["add", "sub", "mul", "div", "max"]
DIMS = [(0,), (1,), (2,), (0, 2), (0, 1, 2)]
PERMS = [(0, 2, 1), (1, 0, 2), (2, 0, 1), (1, 2, 0)]

leaves = st.one_of(st.sampled_from([("in", "x"), ("in", "y"), ("in", "z")]),
                   st.tuples(st.just("c"), st.sampled_from(CONSTS)),
                   st.tuples(st.just("full"), st.sampled_from(FULL_SHAPES), st.sampled_from(CONSTS)))
exprs = st.recursive(leaves, lambda kids: st.one_of(
    st.tuples(st.sampled_from(UNARY), kids),
    st.tuples(st.sampled_from(BINARY), kids, kids),
    st.tuples(st.sampled_from(["sum", "mean"]), kids, st.sampled_from(DIMS)),
    st.tuples(st.just("perm"), kids, st.sampled_from(PERMS), st.sampled_from([1.0, 2.0, -0.5])),
    st.tuples(st.just("where"), kids, kids, kids)), max_leaves=12)


def build_expr(e, env, lib):
    """Evaluate the expression tree `e` with `lib` (tinyllm or torch; the Tensor API is torch's)."""
    def T(v):  # Python numbers become (1, 1, 1) constants where a tensor is needed
        return lib.full((1, 1, 1), v) if isinstance(v, float) else v
    def go(e):
        kind = e[0]
        if kind == "in":
            return env[e[1]]
        if kind == "c":
            return e[1]
        if kind == "full":
            return lib.full(e[1], e[2])
        if kind in BINARY:
            a, b = go(e[1]), go(e[2])
            if isinstance(a, float) and isinstance(b, float):
                a = T(a)
            return {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
                    "div": lambda: a / (T(b) * b + 1.0), "max": lambda: T(a).maximum(T(b))}[kind]()
        if kind in ("sum", "mean"):
            a = T(go(e[1]))
            return a.sum(e[2], keepdim=True) if kind == "sum" else a.mean(e[2], keepdim=True)
        if kind == "perm":
            a, p = T(go(e[1])), e[2]
            return (a.permute(*p) * e[3]).permute(*np.argsort(p).tolist())
        if kind == "where":
            return lib.where(T(go(e[1])) > 0, T(go(e[2])), go(e[3]))
        a = T(go(e[1]))
        return {"neg": lambda: -a, "tanh": lambda: a.tanh(), "exp": lambda: a.tanh().exp(),
                "sigmoid": lambda: a.sigmoid(), "sq": lambda: a * a, "log1p": lambda: (a * a + 1.0).log(),
                "sqrt1p": lambda: (a * a + 1.0).sqrt(), "neg2": lambda: -(-a), "cast": lambda: a.double().float(),
                "detach": lambda: a.detach(), "flat": lambda: a.reshape(-1).reshape(*a.shape),
                "expand": lambda: a.expand(*S), "perm3": lambda: a.permute(1, 0, 2).permute(0, 2, 1).permute(2, 0, 1)
                }[kind]()
    return go(e)


# One wrapper per rule, put around every random graph, so that each example is sure to exercise one rule.
WRAPPERS = {
    "mul_one": ("simplify", lambda e, x, lib: e * 1.0),
    "double_neg": ("simplify", lambda e, x, lib: -(-e)),
    "permute_permute": ("simplify", lambda e, x, lib: e.permute(1, 0, 2).permute(0, 2, 1).permute(2, 0, 1) * 2.0),
    "reshape_reshape": ("simplify", lambda e, x, lib: e.reshape(6, 4).reshape(4, 6).reshape(*S)),
    "expand_expand": ("simplify", lambda e, x, lib: e + e.sum((0, 2), keepdim=True).expand(2, 3, 1).expand(*S)),
    "cast_cast": ("simplify", lambda e, x, lib: e.double().float()),
    "fold_elementwise": ("simplify", lambda e, x, lib: e + (lib.full((1, 3, 1), 2.0) * 3.0).tanh()),
    "fold_view": ("simplify", lambda e, x, lib: e * 2.0),
    "fold_sum": ("simplify", lambda e, x, lib: e + lib.full(S, 0.5).sum(1, keepdim=True)),
    "where_const": ("simplify", lambda e, x, lib: lib.where(lib.full(S, True), e, x)),
    "where_same": ("simplify", lambda e, x, lib: lib.where(e > 0, e, e)),
    "drop_marker": ("simplify", lambda e, x, lib: e + e.detach()),
    # x.exp(), not x: simplify may reduce e to x itself (a constant expression plus x), and x * x has no order
    "canonical_order": ("cse", lambda e, x, lib: e * x.exp() + x.exp() * e),
}
CONFIGS = [["simplify"], ["cse"], ["simplify", "cse"]]


def run_tinyllm(expr, wrapper, arrays, w, passes):
    with with_passes(passes), tracing() as fired:
        env = {k: tl.tensor(v, requires_grad=True) for k, v in arrays.items()}
        out = WRAPPERS[wrapper][1](build_expr(expr, env, tl) + env["x"], env["x"], tl)
        value = out.numpy()  # realized first: the backward graph then reads it as a leaf
        (out * tl.tensor(w)).sum().backward()
        grads = {k: None if t.grad is None else t.grad.numpy() for k, t in env.items()}
    return value, grads, fired


def run_torch(expr, wrapper, arrays, w):
    env = {k: torch.tensor(v, requires_grad=True) for k, v in arrays.items()}
    out = WRAPPERS[wrapper][1](build_expr(expr, env, torch) + env["x"], env["x"], torch)
    (out * torch.tensor(w)).sum().backward()
    return out.detach().numpy(), {k: None if t.grad is None else t.grad.numpy() for k, t in env.items()}


def close(got, want, what, rtol=1e-4):
    scale = 1.0 + np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * 0.1 * scale, err_msg=what)


def same(got, want, what):
    """Equal to the graph run without passes. Bit for bit for elementwise work; but NumPy's sum adds in an order
    that follows its input's strides, so when a rewrite changes a reduction input's layout (x·1 no longer makes
    a copy, two permutes become none) the sum may round differently in the last bits."""
    if not np.array_equal(got, want, equal_nan=True):
        close(got, want, what, rtol=1e-5)


@settings(deadline=None, max_examples=60)
@given(exprs, st.sampled_from(sorted(WRAPPERS)), st.integers(0, 2 ** 32 - 1))
def test_passes_keep_values_and_gradients_on_random_graphs(expr, wrapper, seed):
    rng = np.random.default_rng(seed)
    arrays = {"x": rng.standard_normal(S), "y": rng.standard_normal(S), "z": rng.standard_normal((1, 3, 1))}
    arrays = {k: v.astype(np.float32) for k, v in arrays.items()}
    w = rng.standard_normal(S).astype(np.float32)
    ref_value, ref_grads, ref_fired = run_tinyllm(expr, wrapper, arrays, w, [])
    assert ref_fired == []
    t_value, t_grads = run_torch(expr, wrapper, arrays, w)
    close(ref_value, t_value, "forward vs torch")
    for k in arrays:
        assert (ref_grads[k] is None) == (t_grads[k] is None), f"grad of {k}: None in one of tinyllm and torch"
        if t_grads[k] is not None:
            close(ref_grads[k], t_grads[k], f"grad of {k} vs torch")
    for passes in CONFIGS:
        value, grads, fired = run_tinyllm(expr, wrapper, arrays, w, passes)
        same(value, ref_value, f"forward with {passes}")
        for k in arrays:
            assert (grads[k] is None) == (ref_grads[k] is None)
            if grads[k] is not None:
                same(grads[k], ref_grads[k], f"grad of {k} with {passes}")
        assert {f.pass_name for f in fired} <= set(passes)
        pass_name = WRAPPERS[wrapper][0]
        if pass_name in passes:
            assert wrapper in fired_rules(fired, pass_name), f"{wrapper} did not fire with {passes}"


@settings(deadline=None, max_examples=25)
@given(exprs, st.sampled_from(sorted(WRAPPERS)))
def test_each_pass_reaches_a_fixed_point(expr, wrapper):
    env = {k: tl.tensor(np.ones(s, np.float32)) for k, s in (("x", S), ("y", S), ("z", (1, 3, 1)))}
    out = WRAPPERS[wrapper][1](build_expr(expr, env, tl) + env["x"], env["x"], tl)
    roots = [out.node]
    for name, pass_ in P.PASSES["schedule"]:
        roots = P.run_passes(roots, [(name, pass_)])
        with tracing() as fired:
            assert P.run_passes(roots, [(name, pass_)]) == roots
        assert fired == [], f"{name} fired again on its own output: {fired}"


# ---- CSE ------------------------------------------------------------------------------------------------

def test_cse_makes_commuted_ops_one_node():
    a, b = leaf(3, seed=1), leaf(3, seed=2)
    assert a + b is not b + a
    r1, r2 = graph_rewrite([a + b, b + a], cse)
    assert r1 is r2
    r1, r2 = graph_rewrite([(a * b).eq(a), a.eq(b * a)], cse)
    assert r1 is r2
    m1, m2 = build("MAX", a, b), build("MAX", b, a)  # float max is not exactly commutative (signed zeros)
    assert graph_rewrite([m1, m2], cse) == [m1, m2]


def _kernels(*tensors):
    return Schedule(P.pipeline([t.node for t in tensors], "schedule")).kernels


def test_shared_subexpressions_are_computed_once():
    x, y = tl.randn(4, 5), tl.randn(4, 5)
    out = (x * y).exp() + (y * x).exp().tanh() + (x * y).exp()
    with with_passes([]):
        plain = _kernels(out)
    ks = _kernels(out)
    ops = [k.op for k in ks]
    assert ops.count("MUL") == 1 and ops.count("EXP") == 1 and ops.count("TANH") == 1
    assert [k.op for k in plain].count("MUL") == 2 and len(ks) < len(plain)
    with with_passes([]):
        want = out.numpy()
    np.testing.assert_array_equal(out.numpy(), want)


def test_realize_of_several_tensors_shares_work():
    x = tl.randn(3, 3)
    a, b = (x.exp() * 2.0).sum(), (2.0 * x.exp()).mean()
    ks = _kernels(a, b)
    assert [k.op for k in ks].count("EXP") == 1 and len([k for k in ks if k.op == "MUL" and k.shape == x.shape]) == 1
    tl.realize(a, b)
    np.testing.assert_allclose(b.item() * 9, a.item(), rtol=1e-6)


# ---- pads: gradients of slices --------------------------------------------------------------------------

@SETTINGS
@given(st.integers(1, 4), st.lists(st.integers(1, 5), min_size=2, max_size=4), st.integers(0, 2 ** 32 - 1))
def test_split_gradient_becomes_one_cat(rows, sizes, seed):
    """x.split(...) used piecewise: the backward's pads and adds become one CAT, with torch's gradient."""
    rng = np.random.default_rng(seed)
    x_np = rng.standard_normal((rows, sum(sizes))).astype(np.float32)
    ws = [rng.standard_normal((rows, s)).astype(np.float32) for s in sizes]
    x = tl.tensor(x_np, requires_grad=True)
    with with_passes(["simplify", "pads", "cse"]), tracing() as fired:
        loss = sum((p * tl.tensor(w)).tanh().sum() for p, w in zip(x.split(sizes, dim=1), ws))
        loss.backward()
    xt = torch.tensor(x_np, requires_grad=True)
    sum((p * torch.tensor(w)).tanh().sum() for p, w in zip(xt.split(sizes, dim=1), ws)).backward()
    close(x.grad.numpy(), xt.grad.numpy(), "grad through split")
    assert "pads_to_cat" in fired_rules(fired, "pads") and "full_pad" in fired_rules(fired, "pads")


@SETTINGS
@given(st.integers(1, 3), st.lists(st.integers(1, 4), min_size=2, max_size=3), st.integers(1, 3), st.integers(1, 4),
       st.booleans(), st.integers(0, 2 ** 32 - 1))
def test_cat_of_merged_heads_is_one_copy(batch, heads, t, d, strided, seed):
    """Pieces (batch, t, h_i, d) merged to (batch, t, h_i·d) and joined along the last axis, as attention's
    backward joins dq, dk, dv: the CAT takes the unmerged pieces (strided views when `strided`) and one reshape
    follows. Values and gradients equal the unrewritten graph's bit for bit, and torch's."""
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((batch, h, t, d) if strided else (batch, t, h, d)).astype(np.float32) for h in heads]
    w = rng.standard_normal((batch, t, sum(heads) * d)).astype(np.float32)

    def run(lib, passes=None):
        leaves = [lib.tensor(x, requires_grad=True) for x in xs]
        pieces = [(x.permute(0, 2, 1, 3) if strided else x).reshape(batch, t, -1) for x in leaves]
        if lib is torch:
            y = torch.cat(pieces, dim=2)
            (y * torch.tensor(w)).sum().backward()
            return y.detach().numpy(), [x.grad.numpy() for x in leaves], []
        with with_passes(passes), tracing() as fired:
            y = tl.cat(pieces, dim=2)
            out = y.numpy()
            (y * tl.tensor(w)).sum().backward()
            return out, [x.grad.numpy() for x in leaves], fired

    out, grads, fired = run(tl, ["pads"])
    assert "cat_of_merged" in fired_rules(fired, "pads")
    ref_out, ref_grads, ref_fired = run(tl, [])
    assert ref_fired == []
    np.testing.assert_array_equal(out, ref_out)
    t_out, t_grads, _ = run(torch)
    np.testing.assert_array_equal(out, t_out)
    for g, r, tg in zip(grads, ref_grads, t_grads):
        np.testing.assert_array_equal(g, r)
        np.testing.assert_array_equal(g, tg)


@SETTINGS
@given(st.integers(1, 2), st.integers(1, 3), st.integers(1, 12), st.integers(1, 6), st.booleans(),
       st.integers(0, 2 ** 32 - 1))
def test_attention_backward_reads_do_without_the_pad(batch, heads, t, d, causal, seed):
    """Attention's output O is a slice of FLASH_ATTN's [O | L]; its gradient, dO padded with a zero dL column,
    reaches FLASH_ATTN_BWD as dO itself (the heads of a (batch, t, heads, d) gradient, strided): the pad is gone
    from the graph, and values and gradients equal the unrewritten graph's and torch's."""
    import tinyllm.nn.functional as F
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((batch, t, heads, d)).astype(np.float32) for _ in range(3)]
    w = rng.standard_normal((batch, t, heads * d)).astype(np.float32)

    def run(lib, passes=None):
        leaves = [lib.tensor(x, requires_grad=True) for x in xs]
        q, k, v = (x.permute(0, 2, 1, 3) for x in leaves)
        if lib is torch:
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            (y.permute(0, 2, 1, 3).reshape(batch, t, -1) * torch.tensor(w)).sum().backward()
            return y.detach().numpy(), [x.grad.numpy() for x in leaves], set()
        with with_passes(passes), tracing() as fired:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            loss = (y.permute(0, 2, 1, 3).reshape(batch, t, -1) * tl.tensor(w)).sum()
            loss.backward()
            return y.numpy(), [x.grad.numpy() for x in leaves], fired_rules(fired, "pads")

    out, grads, fired = run(tl, ["pads"])
    assert "dout_without_dl" in fired
    ref_out, ref_grads, ref_fired = run(tl, [])
    assert ref_fired == set()
    t_out, t_grads, _ = run(torch)
    np.testing.assert_array_equal(out, ref_out)
    close(out, t_out, "attention output vs torch")
    for g, r, tg in zip(grads, ref_grads, t_grads):
        np.testing.assert_array_equal(g, r)  # the kernels read the same dO values either way
        close(g, tg, "attention gradient vs torch")


def test_cat_of_reshapes_that_do_not_merge_at_its_axis_is_left_alone():
    a, b = leaf(2, 3, 4, seed=1), leaf(2, 3, 4, seed=2)
    split = build("CAT", a.reshape((6, 4)), b.reshape((6, 4)), arg=1)  # merges axes 0..1, joins along 1
    out = graph_rewrite([split], P.pads, "pads")[0]
    assert out is split
    np.testing.assert_array_equal(evaluate(out), np.concatenate([evaluate(a).reshape(6, 4),
                                                                 evaluate(b).reshape(6, 4)], axis=1))


def test_adjacent_pads_added_are_one_cat():
    a, b, c = leaf(2, 3, seed=1), leaf(2, 1, seed=2), leaf(2, 4, seed=3)
    place = lambda start, stop: ((0, 2, 1), (start, stop, 1))  # noqa: E731
    pads = [build("PAD", a, arg=((2, 8), place(0, 3))), build("PAD", b, arg=((2, 8), place(3, 4))),
            build("PAD", c, arg=((2, 8), place(4, 8)))]
    total = build("ADD", build("ADD", pads[2], pads[0]), pads[1])  # any order of the adds
    (out,) = graph_rewrite([total], P.pads, "pads")
    assert out.op == "CAT" and out.src == (a, b, c)
    np.testing.assert_array_equal(evaluate(out), evaluate(total))
    gap = build("ADD", pads[0], build("PAD", c, arg=((2, 8), place(4, 8))))  # columns 3:4 stay zero: no CAT
    assert graph_rewrite([gap], P.pads, "pads")[0].op != "CAT"


# ---- layout: a transposed product is the product of the transposes ---------------------------------------

@SETTINGS
@given(st.lists(st.integers(1, 3), max_size=2), st.integers(1, 6), st.integers(1, 6), st.integers(1, 6),
       st.integers(0, 2 ** 32 - 1))
def test_transposed_product_keeps_values_and_gradients(batch, m, k, n, seed):
    """(a @ b)ᵀ computed as bᵀ @ aᵀ: against the unrewritten graph and torch, values and gradients."""
    rng = np.random.default_rng(seed)
    a_np, b_np = (rng.standard_normal(tuple(batch) + s).astype(np.float32) for s in ((m, k), (k, n)))
    w_np = rng.standard_normal(tuple(batch) + (n, m)).astype(np.float32)
    results = {}
    for passes in (["simplify", "cse", "layout"], ["simplify", "cse"]):
        a, b = tl.tensor(a_np, requires_grad=True), tl.tensor(b_np, requires_grad=True)
        with with_passes(passes), tracing() as fired:
            y = (a @ b).transpose(-1, -2)
            out = y.numpy()
            (y * tl.tensor(w_np)).sum().backward()
        results[len(passes)] = out, a.grad.numpy(), b.grad.numpy(), fired_rules(fired, "layout")
    assert "transposed_product" in results[3][3] and results[2][3] == set()
    at, bt = torch.tensor(a_np, requires_grad=True), torch.tensor(b_np, requires_grad=True)
    yt = (at @ bt).transpose(-1, -2)
    (yt * torch.tensor(w_np)).sum().backward()
    for got, ref, torch_ref, what in zip(results[3][:3], results[2][:3], (yt, at.grad, bt.grad), ("y", "da", "db")):
        close(got, ref, what + " against the unrewritten graph")
        close(got, torch_ref.detach().numpy(), what + " against torch")


def test_transposed_product_leaves_a_shared_product_alone():
    """A product that is also used untransposed is computed once, as it is."""
    a, b = leaf(3, 4, seed=1), leaf(4, 5, seed=2)
    p = build("MATMUL", a, b)
    t = build("PERMUTE", p, arg=(1, 0))
    (out,) = P.run_passes([t], [("layout", layout)])
    assert out.op == "MATMUL" and out.src[0].op == "PERMUTE"
    shared = build("ADD", build("RESHAPE", t, arg=(15,)), build("RESHAPE", p, arg=(15,)))
    (same,) = P.run_passes([shared], [("layout", layout)])
    assert same is shared


def test_transposed_product_folds_a_transposed_operand():
    """(a bᵀ)ᵀ is b aᵀ: the transpose of bᵀ folds to b itself rather than running as two views."""
    a, b = leaf(3, 4, seed=1), leaf(5, 4, seed=2)
    t = build("PERMUTE", build("MATMUL", a, build("PERMUTE", b, arg=(1, 0))), arg=(1, 0))
    (out,) = P.run_passes([t], [("layout", layout)])
    assert out.op == "MATMUL" and out.src[0] is b and out.src[1].op == "PERMUTE" and out.src[1].src[0] is a
    np.testing.assert_allclose(evaluate(out), evaluate(t), rtol=1e-6)


def test_linear_weight_gradient_is_stored_row_major():
    """The gradient of W in x @ W.T comes out C-contiguous, so the optimizer reads it without copying."""
    x, w = tl.tensor(np.ones((4, 3), np.float32)), tl.tensor(np.ones((5, 3), np.float32), requires_grad=True)
    (x @ w.T).sum().backward()
    assert w.grad.numpy().flags.c_contiguous
