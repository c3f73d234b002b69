"""The 16-bit float dtypes against torch's: storage and rounding, promotion, finfo, and op results on the CPU
runtimes (torch rounds once per op after computing in float32, and so do tinyllm's NumPy reference and its
kernels per primitive; a fused C kernel rounds once per kernel, covered by tests/test_c_lowp.py).

Tolerances: results are compared after rounding to the dtype; one op's result may differ by one unit in the last
place where float32 intermediate results differ in their last bits (exp, tanh and erf come from different
approximations), so values agree to 1 ulp of the dtype (2⁻⁷ relative for bfloat16, 2⁻¹⁰ for float16) and reductions
and matmuls, which sum in another order, to 2 ulps.
"""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import tinyllm as tl
from tinyllm import dtype as dt

pytestmark = pytest.mark.usefixtures("one_torch_thread")
LOW = [(tl.bfloat16, torch.bfloat16), (tl.float16, torch.float16)]
IDS = ["bfloat16", "float16"]
ALL = [(tl.bool, torch.bool), (tl.uint8, torch.uint8), (tl.int8, torch.int8), (tl.int64, torch.int64),
       (tl.float16, torch.float16), (tl.bfloat16, torch.bfloat16), (tl.float32, torch.float32),
       (tl.float64, torch.float64)]


def test_bfloat16_rounding_is_torchs():
    """encode rounds to nearest even, keeps infinities, signed zeros, subnormals and NaN (as NaN)."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(200_000) * np.exp(rng.uniform(-100, 100, 200_000))).astype(np.float32)
    halfway = (np.arange(1, 5000, dtype=np.uint32) << 16 | 0x8000).view(np.float32)  # exact ties
    x = np.concatenate([x, halfway, -halfway, np.float32([np.inf, -np.inf, 0.0, -0.0, 1e-40, -3e-39, 3.4e38])])
    ours = dt.encode(x, tl.bfloat16)
    want = torch.from_numpy(x).bfloat16().view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(ours, want)
    assert np.isnan(dt.decode(dt.encode(np.float32([np.nan, -np.nan]), tl.bfloat16), tl.bfloat16)).all()
    assert np.array_equal(dt.decode(ours, tl.bfloat16), torch.from_numpy(x).bfloat16().float().numpy())


def test_promotion_follows_torch():
    for a, ta in ALL:
        for b, tb in ALL:
            if {a, b} == {tl.int8, tl.uint8}:
                assert dt.result_type(a, b) is tl.int64  # torch's int16, which tinyllm does not have
                continue
            assert dt.result_type(a, b).name == str(torch.promote_types(ta, tb)).removeprefix("torch."), (a, b)


@pytest.mark.parametrize("dtype,tdtype", LOW + [(tl.float32, torch.float32)], ids=IDS + ["float32"])
def test_finfo(dtype, tdtype):
    ours, theirs = tl.finfo(dtype), torch.finfo(tdtype)
    for field in ("bits", "eps", "max", "min", "tiny", "resolution"):
        assert getattr(ours, field) == getattr(theirs, field), field


@pytest.mark.parametrize("dtype,tdtype", LOW, ids=IDS)
def test_conversions(dtype, tdtype):
    x = np.float32([[1.0, -2.5, 1 / 3], [1e5, 7e-5, 65504.0]])
    for t in (tl.tensor(x).to(dtype), tl.tensor(x, dtype=dtype),
              tl.tensor(x).half() if dtype is tl.float16 else tl.tensor(x).bfloat16()):
        assert t.dtype is dtype
        np.testing.assert_array_equal(t.float().numpy(), torch.from_numpy(x).to(tdtype).float().numpy())
    assert tl.tensor(x).to(dtype).to(tl.int64).tolist() == torch.from_numpy(x).to(tdtype).long().tolist()
    assert tl.tensor(x, dtype=dtype).element_size() == 2 if hasattr(tl.Tensor, "element_size") else True


UNARY = ["exp", "log", "tanh", "sqrt", "neg", "relu", "abs", "sin", "erf", "reciprocal"]
BINARY = ["add", "mul", "sub", "div", "maximum", "pow"]


def ulps(got, want, dtype):
    """|got − want| in units of the dtype's spacing at want (the spacing at 1 times |want|, floored at tiny)."""
    spacing = tl.finfo(dtype).eps * np.maximum(np.abs(want), tl.finfo(dtype).tiny)
    both_nan = np.isnan(got) & np.isnan(want)
    same = (got == want) | both_nan
    return np.where(same, 0, np.abs(got - want) / spacing)


@pytest.mark.parametrize("device", ["numpy", "c"])
@pytest.mark.parametrize("dtype,tdtype", LOW, ids=IDS)
@settings(max_examples=5)
@given(seed=st.integers(0, 2**16), shape=st.sampled_from([(3, 4), (2, 3, 5)]))
def test_ops_match_torch(device, dtype, tdtype, seed, shape):
    rng = np.random.default_rng(seed)
    xs = [(rng.uniform(0.1, 3, shape) * rng.choice([-1, 1], shape)).astype(np.float32) for _ in range(2)]
    a, b = (tl.tensor(x, device=device).to(dtype) for x in xs)
    ta, tb = (torch.from_numpy(x).to(tdtype) for x in xs)
    ta_pos, a_pos = ta.abs(), a.abs()
    for name in UNARY:
        got, want = getattr(a_pos if name in ("log", "sqrt") else a, name)(), \
            getattr(ta_pos if name in ("log", "sqrt") else ta, name)()
        assert got.dtype is dtype, name
        assert ulps(got.float().numpy(), want.float().numpy(), dtype).max() <= 1, name
    for name in BINARY:
        got, want = getattr(a_pos if name == "pow" else a, name)(b), getattr(ta_pos if name == "pow" else ta, name)(tb)
        assert got.dtype is dtype
        assert ulps(got.float().numpy(), want.float().numpy(), dtype).max() <= 1, name
    for got, want in [(a.sum(-1), ta.sum(-1)), (a.amax(0), ta.amax(0)), (a + 1.5, ta + 1.5),
                      (a @ b.transpose(-1, -2), ta @ tb.transpose(-1, -2))]:
        assert got.dtype is dtype
        assert ulps(got.float().numpy(), want.float().numpy(), dtype).max() <= 2
    # composites round after each of their primitives (softmax: 4, sigmoid: 3), torch once
    for got, want in [(a.softmax(-1), ta.softmax(-1)), (a.sigmoid(), ta.sigmoid())]:
        assert got.dtype is dtype
        assert ulps(got.float().numpy(), want.float().numpy(), dtype).max() <= 4
    mixed = a + tl.tensor(xs[1], device=device)  # float32 wins, as torch promotes
    assert mixed.dtype is tl.float32
    np.testing.assert_allclose(mixed.numpy(), (ta + torch.from_numpy(xs[1])).numpy(), rtol=1e-6)


@pytest.mark.parametrize("device", ["numpy", "c"])
@pytest.mark.parametrize("dtype,tdtype", LOW, ids=IDS)
def test_gradients_in_low_precision(device, dtype, tdtype):
    """Backward through a 16-bit graph: gradients come back in the parameter's dtype, as torch's."""
    rng = np.random.default_rng(3)
    w, x = rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    tw = torch.from_numpy(w).requires_grad_()
    W = tl.tensor(w, device=device, requires_grad=True)
    y = (tl.tensor(x, device=device).to(dtype) @ W.to(dtype)).tanh().sum()
    ty = (torch.from_numpy(x).to(tdtype) @ tw.to(tdtype)).tanh().sum()
    y.backward()
    ty.backward()
    assert W.grad.dtype is tl.float32
    assert ulps(W.grad.numpy(), tw.grad.numpy(), dtype).max() <= 4
