"""Dynamic quantization (QMATMUL with arg (fmt, g, K, "int8"); quantize_(..., dynamic=True)): the activations
quantized per row and group at run time, the group sums exact integers (tinyllm/ops/qmatmul.py).

The reference is torch computing the definition from the bytes: x quantized by torch's own round (half to even,
as rint), the integer products summed in int64 (exact), then scaled by both scales in float64. Each runtime, and on
the C runtime each kernel (vpdpbusd, AVX2's vpmaddubsw, the portable loop, the sgemm on the quantized values past 4
rows), must give it within 1e-5 of the row's Σ|s·qx·d·q| (the same products summed in another order in float32).
The input gradient passes x's rounding straight through: dy · dequant(W), as weight-only's, checked the same way.
"""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import tinyllm as tl
from tinyllm import quantization as Q
from tinyllm._kernels import lib
from tinyllm.graph import build
from tinyllm.models.gpt import GPT, GPTConfig
from helpers import rel, reference_runtime  # noqa: F401 (autouse: numpy by default)
from test_quantization import runtime_or_skip, torch_dequant


def torch_dynamic(x, q, s, fmt, g, k):
    """(y float64 (M, N), Σ|terms| (M, N)) of the definition, from the bytes, in torch."""
    qw = torch.from_numpy(np.array(q)).to(torch.int64)  # the whole numbers, from the bytes
    if fmt == "int4":  # a group's first half in the low nibbles, its second in the high, stored + 8
        qw = torch.cat([qw.reshape(qw.shape[0], -1, g // 2) & 15, qw.reshape(qw.shape[0], -1, g // 2) >> 4], -1)
        qw = qw.reshape(qw.shape[0], -1) - 8
    d = torch.from_numpy(np.array(s)).double()  # (N, G)
    tx = torch.nn.functional.pad(torch.from_numpy(x).double(), (0, qw.shape[1] - k))
    groups = tx.reshape(tx.shape[0], -1, g)
    finite = torch.isfinite(groups).all(-1)
    sx = torch.where(finite, groups.nan_to_num(0, 0, 0).abs().amax(-1).float() / 127, torch.nan).double()  # (M, G)
    whole = torch.round(groups.float() / sx.float()[..., None]).clamp(-127, 127)  # (round: half to even)
    qx = torch.where((finite & (sx > 0))[..., None], whole, 0).to(torch.int64)
    dots = torch.einsum("mgt,ngt->mng", qx, qw.reshape(qw.shape[0], -1, g)).double()  # exact
    terms = sx[:, None, :] * d[None, :, :]
    absdots = torch.einsum("mgt,ngt->mng", qx.abs(), qw.reshape(qw.shape[0], -1, g).abs()).double()
    return (dots * terms).sum(-1).numpy(), (absdots * terms.abs()).sum(-1).numpy()


CASES = dict(fmt=st.sampled_from(["int8", "int4"]), m=st.sampled_from([1, 2, 3, 4, 6]), n=st.integers(1, 9),
             groups=st.integers(1, 4), g=st.sampled_from([4, 32, 64]), short=st.integers(0, 31),
             seed=st.integers(0, 2**32 - 1))


def check(device, fmt, m, n, groups, g, short, seed):
    rng = np.random.default_rng(seed)
    k = groups * g - short % g
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = (rng.standard_normal((m, k)) * rng.choice([1e-3, 1.0, 50.0], (m, 1))).astype(np.float32)
    x[rng.random((m, k)) < 0.1] = 0.0
    v = rng.standard_normal((m, n)).astype(np.float32)
    q, s = Q.quantize(w, fmt, g)
    want, scale = torch_dynamic(x, q, s, fmt, g, k)
    X = tl.tensor(x, device=device, requires_grad=True)
    y = X._make(build("QMATMUL", X.node, tl.Tensor(q, device=device).node, tl.Tensor(s, device=device).node,
                      arg=(fmt, g, k, "int8")))
    y.backward(tl.tensor(v, device=device))
    assert np.all(np.abs(y.numpy() - want) <= 1e-5 * scale + 1e-30), (device, np.abs(y.numpy() - want).max())
    W = torch_dequant(q, s, fmt, g, k).numpy()
    dscale = np.abs(v) @ np.abs(W) + 1e-30
    assert np.all(np.abs(X.grad.numpy() - v @ W) <= 1e-5 * dscale)


@pytest.mark.parametrize("device", ["numpy", "c"])
@settings(max_examples=15)
@given(**CASES)
def test_dynamic_qmatmul_is_the_definition_computed_by_torch(device, fmt, m, n, groups, g, short, seed):
    check(device, fmt, m, n, groups, g, short, seed)


@pytest.mark.parametrize("dot", [0, 1])
@settings(max_examples=10)
@given(**CASES)
def test_both_c_kernels_give_the_definition(dot, fmt, m, n, groups, g, short, seed):
    """With the dot-product instructions off (tl_cpu_set_dot(0): AVX2's vpmaddubsw), and on (where the CPU has
    AVX512_VNNI, qmatmul_fixed.c's vpdpbusd kernel with x as its one digit; elsewhere the same AVX2 kernel)."""
    lib.tl_cpu_set_dot(dot)
    try:
        check("c", fmt, m, n, groups, g, short, seed)
    finally:
        lib.tl_cpu_set_dot(-1)


@pytest.mark.wgsl
@settings(max_examples=3)  # (each shape compiles its shaders: slow on a software adapter)
@given(**CASES)
def test_dynamic_qmatmul_on_wgsl(fmt, m, n, groups, g, short, seed):
    check(runtime_or_skip("wgsl"), fmt, m, n, groups, g, short, seed)


@pytest.mark.parametrize("device", ["numpy", "c"])
def test_a_group_with_inf_or_nan_gives_nan_and_zeros_give_zero(device):
    rng = np.random.default_rng(3)
    q, s = Q.quantize(rng.standard_normal((5, 64)).astype(np.float32), "int8", 32)
    x = np.zeros((4, 64), np.float32)
    x[1, 3], x[2, 40], x[3, :] = np.nan, np.inf, 1.0
    X = tl.tensor(x, device=device)
    y = X._make(build("QMATMUL", X.node, tl.Tensor(q, device=device).node, tl.Tensor(s, device=device).node,
                      arg=("int8", 32, 64, "int8"))).numpy()
    assert np.all(y[0] == 0) and np.all(np.isnan(y[1])) and np.all(np.isnan(y[2])) and np.all(np.isfinite(y[3]))


def tiny(seed=0):
    tl.manual_seed(seed)
    return GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=32, vocab_size=96))


IDX = np.random.default_rng(7).integers(0, 96, (2, 24))


@pytest.mark.parametrize("device", ["numpy", "c"])
def test_a_dynamic_gpt_stays_close_to_weight_only(device):
    """The activations' rounding adds about max|x_group| / 254 per element: the logits stay within 2 % (relative L2)
    of the weight-only model's, and differ from them (the mode is on)."""
    idx = tl.tensor(IDX, device=device)
    got = {}
    for dynamic in (False, True):
        model = tiny().to(device)
        Q.quantize_(model, "int8", 32, embedding=True, dynamic=dynamic)
        assert all(q.dynamic == dynamic for q in Q.quantized_layers(model).values())
        got[dynamic] = model(idx)[0].numpy()
    err = rel(got[True], got[False])
    assert 0 < err < 0.02, err


def test_save_and_load_keep_the_dynamic_mode(tmp_path):
    model = tiny()
    Q.quantize_(model, "int4", 32, dynamic=True)
    assert "dynamic=True" in repr(model.transformer.h[0].mlp.c_fc)
    idx = tl.tensor(IDX)
    want = model(idx)[0].numpy()
    Q.save(model, tmp_path / "d.safetensors")
    fresh = tiny(seed=1)
    Q.load(fresh, tmp_path / "d.safetensors")
    assert all(q.dynamic for q in Q.quantized_layers(fresh).values())
    np.testing.assert_array_equal(fresh(idx)[0].numpy(), want)


def test_a_bad_activations_mode_is_refused_by_name():
    q, s = Q.quantize(np.ones((2, 32), np.float32), "int8", 32)
    X = tl.tensor(np.ones((1, 32), np.float32))
    with pytest.raises(ValueError, match="activations 'int4'.*dynamic"):
        build("QMATMUL", X.node, tl.Tensor(q).node, tl.Tensor(s).node, arg=("int8", 32, 32, "int4"))
