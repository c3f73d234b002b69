"""Every primitive's backward rule against central differences in float64 (tinyllm.gradcheck, no torch), and the
checker itself: it must pass right gradients and name the input and element of a wrong one."""
import numpy as np
import pytest

import tinyllm as tl
from tinyllm import ops
from tinyllm.gradcheck import (GradcheckError, check_primitives, differentiable_primitives, gradcheck,
                               passes_gradient, primitive as P)
from tinyllm.graph import toposort
from tinyllm.quantization import quantize
from helpers import reference_runtime  # noqa: F401  (autouse: this module runs on the NumPy reference runtime)

rng = np.random.default_rng(0)


def leaf(*shape, low=-2.0, high=2.0):
    return tl.Tensor(rng.uniform(low, high, shape), dtype=tl.float64, requires_grad=True)


def positive(*shape): return leaf(*shape, low=0.5, high=2.0)


def nonzero(*shape):
    return tl.Tensor(rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape), dtype=tl.float64,
                     requires_grad=True)


def distinct(*shape):
    """All different, at least 0.25 apart: no ties for MAX / REDUCE_MAX, nor within a central difference."""
    n = int(np.prod(shape))
    return tl.Tensor((rng.permutation(n) * 0.25 + rng.uniform(0, 0.1, n) - n / 8).reshape(shape),
                     dtype=tl.float64, requires_grad=True)


def index(*values):
    return tl.Tensor(np.array(values, dtype=np.int64))


def sl(*spec):
    """SHRINK / PAD placement: one (start, stop, step) per axis."""
    return tuple(spec)


def cases():
    """Each differentiable primitive -> [(fn, inputs[, gradcheck options])], small float64 inputs kept off kinks
    and ties. The functions apply the primitive itself (gradcheck.primitive), not the front end, so each rule is
    checked alone. Built when a test runs, so the inputs live on the runtime the tests run on."""
    rng = np.random.default_rng(5)
    q8, s8 = quantize(rng.uniform(-2, 2, (3, 8)).astype(np.float32), "int8", 4)
    q4, s4 = quantize(rng.uniform(-2, 2, (3, 8)).astype(np.float32), "int4", 4)
    return {
        "NEG": [(lambda x: P("NEG", x), [leaf(3, 2)])],
        "EXP": [(lambda x: P("EXP", x), [leaf(2, 3)])],
        "LOG": [(lambda x: P("LOG", x), [positive(2, 3)])],
        "SQRT": [(lambda x: P("SQRT", x), [positive(5)])],
        "RECIP": [(lambda x: P("RECIP", x), [nonzero(2, 2)])],
        "TANH": [(lambda x: P("TANH", x), [leaf(4)])],
        "ERF": [(lambda x: P("ERF", x), [leaf(2, 3)])],
        "SIN": [(lambda x: P("SIN", x), [leaf(2, 3, low=-6.0, high=6.0)])],
        "ATAN": [(lambda x: P("ATAN", x), [leaf(2, 3, low=-4.0, high=4.0)])],
        "FLOOR": [(lambda x: P("FLOOR", x), [leaf(2, 3)])],  # (a step: 0, off the integers)
        "FMOD": [(lambda x, z: P("FMOD", x, z), [leaf(2, 3, low=-5.0, high=5.0), nonzero(2, 3)])],
        "CAST": [(lambda x: P("CAST", x, arg=tl.float64), [leaf(3)]),
                 # through float32 and back: rounding to float32 (~1e-7) needs a larger step and tolerance
                 (lambda x: P("CAST", P("CAST", x, arg=tl.float32), arg=tl.float64), [leaf(2, 2)],
                  dict(eps=1e-3, atol=1e-3, rtol=1e-2)),
                 # to an integer no gradient flows: the output is piecewise constant
                 (lambda x: P("CAST", P("CAST", x * 0.0 + 0.5, arg=tl.int64), arg=tl.float64) + x, [leaf(3)])],
        "CONTIGUOUS": [(lambda x: P("CONTIGUOUS", P("PERMUTE", x, arg=(1, 0))), [leaf(2, 3)])],
        "ADD": [(lambda x, z: P("ADD", x, z), [leaf(2, 3), leaf(2, 3)]),
                (lambda x: P("ADD", x, x), [leaf(3)])],
        "MUL": [(lambda x, z: P("MUL", x, z), [leaf(2, 3), leaf(2, 3)]),
                (lambda x: P("MUL", x, x), [leaf(3)])],
        "MAX": [(lambda x, z: P("MAX", x, z), [distinct(2, 3), distinct(2, 3)])],
        "POW": [(lambda x, p: P("POW", x, p), [positive(2, 3), leaf(2, 3)])],
        "WHERE": [(lambda a, b, c: P("WHERE", c, a, b), [leaf(2, 3), leaf(2, 3),
                                                         tl.Tensor(rng.random((2, 3)) < 0.5)])],
        "SUM": [(lambda x: P("SUM", x, arg=(1,)), [leaf(2, 3)]),
                (lambda x: P("SUM", x, arg=(0, 2)), [leaf(2, 3, 2)]),
                (lambda x: P("SUM", x, arg=()), [leaf(2)])],
        "REDUCE_MAX": [(lambda x: P("REDUCE_MAX", x, arg=(1,)), [distinct(3, 4)]),
                       (lambda x: P("REDUCE_MAX", x, arg=(0, 1)), [distinct(2, 3)])],
        "RESHAPE": [(lambda x: P("RESHAPE", x, arg=(3, 2)), [leaf(2, 3)])],
        "PERMUTE": [(lambda x: P("PERMUTE", x, arg=(2, 0, 1)), [leaf(2, 3, 4)])],
        "EXPAND": [(lambda x: P("EXPAND", x, arg=(2, 3, 4)), [leaf(2, 1, 1)])],
        "SHRINK": [(lambda x: P("SHRINK", x, arg=sl((1, 5, 2), (0, 2, 1))), [leaf(5, 3)])],
        "PAD": [(lambda x: P("PAD", x, arg=((5, 3), sl((1, 5, 2), (0, 2, 1)))), [leaf(2, 2)])],
        "CAT": [(lambda a, b, c: P("CAT", a, b, c, arg=1), [leaf(2, 1), leaf(2, 3), leaf(2, 2)])],
        "CHECKPOINT": [(lambda x: P("CHECKPOINT", x, arg=("enter", "nothing_saveable")), [leaf(2, 3)])],
        "AUTOCAST": [(lambda x: P("AUTOCAST", x, arg=tl.bfloat16), [leaf(2, 3)])],  # (the mark is x itself)
        # gradients reach x only: quantized weights are frozen
        "QMATMUL": [(lambda x, q, s: P("QMATMUL", x, q, s, arg=("int8", 4)),
                     [leaf(2, 8), tl.Tensor(q8), tl.Tensor(s8)]),
                    (lambda x, q, s: P("QMATMUL", x, q, s, arg=("int4", 4)),
                     [leaf(2, 8), tl.Tensor(q4), tl.Tensor(s4)])],
        "MATMUL": [(lambda a, b: P("MATMUL", a, b), [leaf(2, 3), leaf(3, 4)]),
                   (lambda a, b: P("MATMUL", a, b), [leaf(2, 2, 3), leaf(2, 3, 1)])],
        "GATHER": [(lambda x, i: P("GATHER", x, i, arg=0), [leaf(4, 2), index(3, 0, 3, -1)]),
                   (lambda x, i: P("GATHER", x, i, arg=1), [leaf(2, 3), index([2, 2], [0, 1])])],
        "SCATTER_ADD": [(lambda x, i: P("SCATTER_ADD", x, i, arg=(0, 4)), [leaf(3, 2), index(1, 3, 1)]),
                        (lambda x, i: P("SCATTER_ADD", x, i, arg=(1, 3)), [leaf(2, 2, 2), index([0, 2], [2, 2])])],
        # the packed output [O | L]: a random upstream gradient checks the log-sum-exp's gradient too
        "FLASH_ATTN": [(lambda q, k, v: P("FLASH_ATTN", q, k, v, arg=(0.7, True)), [leaf(2, 4, 3), leaf(2, 4, 3),
                                                                                    leaf(2, 4, 2)]),
                       (lambda q, k, v: P("FLASH_ATTN", q, k, v, arg=(0.5, False)), [leaf(3, 2), leaf(5, 2),
                                                                                     leaf(5, 3)]),
                       (lambda q, k, v: P("FLASH_ATTN", q, k, v, arg=(1.0, True)), [leaf(1, 5, 2), leaf(1, 3, 2),
                                                                                    leaf(1, 3, 2)])],
        # tinyllm.linalg's decompositions, one case per output (a loss of u² does not depend on a vector's sign);
        # eigh and cholesky read one triangle, so their input is symmetrized first
        "SVD": [(lambda a: P("SVD", a, arg=("S", False)), [spread(4, 3)]),
                (lambda a: (lambda u: u * u)(P("SVD", a, arg=("U", False))), [spread(4, 3)]),
                (lambda a: (lambda v: v * v)(P("SVD", a, arg=("Vh", False))), [spread(2, 3, 4)])],
        "EIGH": [(lambda a: P("EIGH", sym(a), arg=("L", "L")), [spread(3, 3)]),
                 (lambda a: (lambda v: v * v)(P("EIGH", sym(a), arg=("V", "U"))), [spread(2, 3, 3)])],
        "QR": [(lambda a: P("QR", a, arg=("Q", False)), [spread(4, 3)]),
               (lambda a: P("QR", a, arg=("R", False)), [spread(2, 3, 3)]),
               (lambda a: P("QR", a, arg=("Q", False)), [spread(3, 5)]),  # wide: A = [X | Y]
               (lambda a: P("QR", a, arg=("R", True)), [spread(2, 2, 4)])],
        "CHOLESKY": [(lambda a: P("CHOLESKY", sym(a)), [spd(2, 3, 3)])],
        "SOLVE": [(lambda a, b: P("SOLVE", a, b, arg="solve"), [spd(2, 3, 3), leaf(2, 3, 2)])],
        "SLOGDET": [(lambda a: P("SLOGDET", a, arg="logabsdet"), [spread(2, 3, 3)])],
        # eig's vectors are unique up to a phase: |v|² (the sum over the (re, im) axis) does not depend on it
        "EIG": [(lambda a: P("EIG", a, arg="L"), [spectrum(3, 3)]),
                (lambda a: (lambda v: (v * v).sum(-1))(P("EIG", a, arg="V")), [spectrum(2, 3, 3)])],
    }


def spread(*shape):
    """A matrix (batch) with singular values 1, 1.5, 2, ... (so the vectors' gradients stay small)."""
    *b, m, n = shape
    u = np.linalg.qr(rng.standard_normal((*b, m, m)))[0][..., :min(m, n)]
    v = np.linalg.qr(rng.standard_normal((*b, n, n)))[0][..., :min(m, n)]
    s = 1.0 + 0.5 * np.arange(min(m, n))
    return tl.Tensor(u @ (s[:, None] * np.swapaxes(v, -1, -2)), dtype=tl.float64, requires_grad=True)


def spectrum(*shape):
    """A non-symmetric matrix (batch) with eigenvalues 1, 2, 3, ... and well-conditioned eigenvectors."""
    q = np.eye(shape[-1]) + 0.3 * rng.standard_normal(shape)
    lam = 1.0 + np.arange(shape[-1])
    return tl.Tensor(q @ (lam[:, None] * np.linalg.inv(q)), dtype=tl.float64, requires_grad=True)


def spd(*shape):
    x = rng.standard_normal(shape)
    return tl.Tensor(x @ np.swapaxes(x, -1, -2) + shape[-1] * np.eye(shape[-1]), dtype=tl.float64, requires_grad=True)


def sym(a):
    return (a + a.transpose(-2, -1)) * 0.5


@pytest.mark.parametrize("op", differentiable_primitives())
def test_primitive_gradient(op):
    all_cases = cases()
    assert all_cases.get(op), f"primitive {op} has a gradient rule but no gradcheck case: add one to cases()"
    for k, (fn, inputs, *options) in enumerate(all_cases[op]):
        assert op in {n.op for n in toposort([fn(*inputs).node])}, f"case {k} of {op} does not use {op}"
        assert gradcheck(fn, inputs, **(options[0] if options else {}))


def test_every_differentiable_primitive_has_a_case():
    """A new primitive with a backward rule must come with a gradcheck case here."""
    names = set(cases())
    missing = sorted(set(differentiable_primitives()) - names)
    assert not missing, f"no gradcheck case for {missing}: add them to cases() in tests/test_gradcheck.py"
    assert not names - set(ops.PRIMITIVES), "cases() names an op that is not a primitive"


def test_check_primitives_runs_all_and_refuses_missing_cases():
    assert check_primitives(cases()) == differentiable_primitives()
    with pytest.raises(GradcheckError, match="no gradcheck case for MATMUL"):
        check_primitives({op: c for op, c in cases().items() if op != "MATMUL"})


def test_passes_gradient_classifies_rules():
    assert not passes_gradient("LOAD") and not passes_gradient("CONST")
    assert not passes_gradient("CMPLT") and not passes_gradient("DETACH")
    assert passes_gradient("ADD") and passes_gradient("GATHER")
    assert set(differentiable_primitives()) <= set(ops.PRIMITIVES)


# ---- the checker itself ---------------------------------------------------------------------------------

def test_gradcheck_passes_a_composite():
    x, w = leaf(3, 4), leaf(4, 2)
    assert gradcheck(lambda x, w: (x @ w).tanh().softmax(-1), [x, w])


def test_gradcheck_catches_a_wrong_rule_and_names_input_and_element(monkeypatch):
    from tinyllm.ops.elementwise import TANH
    monkeypatch.setattr(TANH, "backward", staticmethod(lambda dy, y: (dy * (1.0 - y),)))  # forgot the square
    x, z = leaf(2, 3), leaf(2, 3)
    with pytest.raises(GradcheckError, match=r"input 1 \(shape \(2, 3\)\) at element \(\d, \d\): analytic"):
        gradcheck(lambda x, z: x + z.tanh(), [x, z])


def test_gradcheck_catches_a_gradient_that_skips_an_input():
    x = leaf(3)
    with pytest.raises(GradcheckError, match="input 0"):
        gradcheck(lambda x: x.detach() * x, [x])


def test_gradcheck_leaves_inputs_alone_and_checks_only_grad_inputs():
    x, mask = leaf(2, 2), tl.Tensor(np.array([[True, False], [False, True]]))
    const = tl.Tensor(np.ones((2, 2)), dtype=tl.float64)
    assert gradcheck(lambda x, m, c: x.masked_fill(m, 0.0) * c, [x, mask, const])
    assert x.grad is None


def test_gradcheck_rejects_float32_and_no_grad_inputs():
    with pytest.raises(ValueError, match="float64"):
        gradcheck(lambda x: x * 2, [tl.randn(3, requires_grad=True)])
    with pytest.raises(ValueError, match="no input requires grad"):
        gradcheck(lambda x: x * 2, [tl.randn(3, dtype=tl.float64)])
