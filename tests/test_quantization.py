"""Weight quantization (tinyllm/quantization.py, tinyllm/ops/qmatmul.py): QMATMUL's value and input gradient against
torch computing x · dequant(W)ᵀ from its own reading of the packed bytes, on every runtime; the formats' rounding
against the error law it follows; quantize_ on a GPT; save / load; and the errors for bad use.

Tolerances: QMATMUL against torch in float32 at rtol 1e-5 relative to the row's Σ|x·w| (the same products summed in
another order: a few ulp of that sum); dequantize is exact (q·d is exact in float32 for |q| <= 127 and a float16 d).
In-features that are not a multiple of the group (a padded last group) are drawn alongside whole groups, and checked
the same way: against torch's matmul of the weight torch reads from the bytes, and against NumPy's float64 matmul
of tinyllm's dequantize, both at that tolerance.
"""
import math
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import tinyllm as tl
from tinyllm import quantization as Q
from tinyllm.graph import build
from tinyllm.models.gpt import GPT, GPTConfig
from conftest import RUNTIMES, wgsl_skip_reason
from helpers import rel, spread_weights, reference_runtime  # noqa: F401 (autouse: numpy by default)


def runtime_or_skip(name):
    if name == "wgsl" and not os.environ.get("CI") and wgsl_skip_reason():
        pytest.skip(wgsl_skip_reason())
    return name


def torch_dequant(q, s, fmt, g, k=None):
    """The weight (N, K) as torch reads the format from the bytes (independently of tinyllm's dequantize): int8
    values as they are; int4 bytes split into the group's first half (low nibbles) and second half (high); of a
    storage padded to whole groups, the first k columns."""
    q, s = torch.from_numpy(np.array(q)), torch.from_numpy(np.array(s)).float()  # (copies: writable)
    if fmt == "int4":
        n, kb = q.shape
        b = q.to(torch.int32).reshape(n, kb * 2 // g, g // 2)
        q = (torch.cat([b & 15, b >> 4], dim=-1) - 8).reshape(n, kb * 2)
    return (q.float() * s.repeat_interleave(g, dim=1))[:, :k]


def qmatmul(x, qw, s, fmt, g, k=None):
    return x._make(build("QMATMUL", x.node, qw.node, s.node, arg=(fmt, g) if k is None else (fmt, g, k)))


# K = groups·g − short % g: a padded last group unless short % g = 0
QMATMUL_CASES = dict(fmt=st.sampled_from(["int8", "int4"]), m=st.integers(1, 5), n=st.integers(1, 6),
                     groups=st.integers(1, 3), g=st.sampled_from([2, 4, 8, 32]), short=st.integers(0, 31),
                     seed=st.integers(0, 2**32 - 1))


@pytest.mark.parametrize("device", ["numpy", "c"])
@settings(max_examples=12)
@given(**QMATMUL_CASES)
def test_qmatmul_value_and_input_gradient_match_torch(device, fmt, m, n, groups, g, short, seed):
    check_qmatmul(device, fmt, m, n, groups, g, short, seed)


@pytest.mark.parametrize("wide", [0, 1])
@settings(max_examples=8)
@given(fmt=st.sampled_from(["int8", "int4"]), m=st.integers(1, 4), n=st.integers(1, 9), groups=st.integers(1, 20),
       g=st.sampled_from([16, 32, 64]), short=st.integers(0, 63), seed=st.integers(0, 2**32 - 1))
def test_both_simd_gemv_kernels_match_torch(wide, fmt, m, n, groups, g, short, seed):
    """The quantized GEMV (M <= 4) on AVX2 (tl_cpu_set_dot(0)) and, where the CPU has AVX512_VNNI, in fixed
    point (groups of a multiple of 32; runtime_c/qmatmul_fixed.c, tests/test_quantization_fixed.py): over 16 groups
    (a block of scales), partial last groups, and each row count of x."""
    from tinyllm._kernels import lib
    lib.tl_cpu_set_dot(wide)
    try:
        check_qmatmul("c", fmt, m, n, groups, g, short, seed)
    finally:
        lib.tl_cpu_set_dot(-1)


@pytest.mark.wgsl
@settings(max_examples=3)  # (each shape compiles its shaders: slow on a software adapter)
@given(**QMATMUL_CASES)
def test_qmatmul_value_and_input_gradient_match_torch_on_wgsl(fmt, m, n, groups, g, short, seed):
    check_qmatmul(runtime_or_skip("wgsl"), fmt, m, n, groups, g, short, seed)


def check_qmatmul(device, fmt, m, n, groups, g, short, seed):
    rng = np.random.default_rng(seed)
    k = groups * g - short % g
    w = rng.standard_normal((n, k)).astype(np.float32)
    w[rng.random((n, k)) < 0.1] = 0.0  # zeros, and now and then a whole group of them (d = 0)
    x, v = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((m, n)).astype(np.float32)
    q, s = Q.quantize(w, fmt, g)
    assert q.shape == (n, groups * g // (1 if fmt == "int8" else 2)) and s.shape == (n, groups)  # whole groups
    W = torch_dequant(q, s, fmt, g, k)

    tx = torch.from_numpy(x).requires_grad_(True)
    ty = tx @ W.T
    ty.backward(torch.from_numpy(v))

    X = tl.tensor(x, device=device, requires_grad=True)
    # (fmt, g) where nothing is padded, as before; (fmt, g, K) where something is
    y = qmatmul(X, tl.Tensor(q, device=device), tl.Tensor(s, device=device), fmt, g, k if k % g else None)
    y.backward(tl.tensor(v, device=device))
    scale = np.abs(x) @ np.abs(W.numpy()).T + 1e-30
    assert np.all(np.abs(y.numpy() - ty.detach().numpy()) <= 1e-5 * scale)
    reference = x.astype(np.float64) @ Q.dequantize(q, s, fmt, g, k).astype(np.float64).T  # dequantize, then matmul
    assert np.all(np.abs(y.numpy() - reference) <= 1e-5 * scale)
    dscale = np.abs(v) @ np.abs(W.numpy()) + 1e-30
    assert np.all(np.abs(X.grad.numpy() - tx.grad.numpy()) <= 1e-5 * dscale)


def test_qmatmul_gives_the_weight_no_gradient_and_its_backward_is_graph():
    """dx comes from DEQUANT and MATMUL nodes; the quantized storage never gets a gradient."""
    from tinyllm.autograd import gradients
    q, s = Q.quantize(np.ones((3, 4), np.float32), "int8", 4)
    x, qw, sc = tl.randn(2, 4), tl.Tensor(q), tl.Tensor(s)
    y = qmatmul(x, qw, sc, "int8", 4)
    grads = gradients(y.node, tl.ones(2, 3).node, [x.node, qw.node, sc.node])
    assert grads[qw.node] is None and grads[sc.node] is None
    assert grads[x.node].op == "MATMUL" and grads[x.node].src[1].op == "DEQUANT"


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantize_follows_the_format_and_dequantize_round_trips(fmt):
    rng = np.random.default_rng(1)
    g = 8
    w = rng.uniform(-3, 3, (16, 32)).astype(np.float32)
    q, s = Q.quantize(w, fmt, g)
    groups = w.reshape(16, 4, g)
    if fmt == "int8":
        assert q.dtype == np.int8 and q.shape == (16, 32) and np.abs(q).max() <= 127
        np.testing.assert_array_equal(s, (np.abs(groups).max(-1) / np.float32(127)).astype(np.float16))
    else:
        assert q.dtype == np.uint8 and q.shape == (16, 16)
        extreme = np.take_along_axis(groups, np.abs(groups).argmax(-1)[..., None], -1)[..., 0]
        np.testing.assert_array_equal(s, (extreme / np.float32(-8)).astype(np.float16))
    assert s.dtype == np.float16 and s.shape == (16, 4)
    back = Q.dequantize(q, s, fmt, g)
    np.testing.assert_array_equal(back, torch_dequant(q, s, fmt, g).numpy())
    d = np.abs(s.astype(np.float32)).repeat(g, axis=1)
    err = np.abs(back - w)
    # within half a step, except int4's element on the other side of the extreme: 8 levels one way, 7 the other
    clipped = (w / np.where(s == 0, 1, s).astype(np.float32).repeat(g, axis=1)) > 7.5 if fmt == "int4" else False
    assert np.all(err <= np.where(clipped, 1.0, 0.5) * d * (1 + 1e-6))


def test_int4_packing_puts_a_groups_halves_in_low_and_high_nibbles():
    """One group of 4: values [-8, -4, 0, 7]·d  →  bytes [(−8+8) | (0+8)<<4, (−4+8) | (7+8)<<4]."""
    w = np.array([[-8.0, -4.0, 0.0, 7.0]], np.float32)
    q, s = Q.quantize(w, "int4", 4)
    assert s[0, 0] == np.float16(1.0)
    np.testing.assert_array_equal(q, [[0x80, 0xF4]])
    q8, s8 = Q.quantize(np.array([[0.0, 0.0]], np.float32), "int8", 2)  # a group of zeros: d = 0, q = 0
    assert s8[0, 0] == 0 and not q8.any()


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_a_partial_last_group_is_padded_and_scaled_over_its_real_columns(fmt):
    """37 input features in groups of 16: the storage is that of the weight zero-padded to 48 columns, the last
    group's scale is its 5 real columns' (the zeros never set it), the padding holds the value 0, and dequantize
    gives back the 37 columns within half a step (int4: a step where the extreme's far side clips)."""
    rng = np.random.default_rng(4)
    w = rng.uniform(-3, 3, (6, 37)).astype(np.float32)
    w[0, 32:] = 0.0  # a last group of zeros: d = 0
    q, s = Q.quantize(w, fmt, 16)
    for got, want in zip((q, s), Q.quantize(np.pad(w, ((0, 0), (0, 11))), fmt, 16)):
        np.testing.assert_array_equal(got, want)
    assert q.shape == ((6, 48) if fmt == "int8" else (6, 24)) and s.shape == (6, 3)
    last = w[:, 32:]
    if fmt == "int8":
        np.testing.assert_array_equal(s[:, 2], (np.abs(last).max(-1) / np.float32(127)).astype(np.float16))
    else:
        extreme = np.take_along_axis(last, np.abs(last).argmax(-1)[:, None], -1)[:, 0]
        np.testing.assert_array_equal(s[:, 2], (extreme / np.float32(-8)).astype(np.float16))
    assert not torch_dequant(q, np.ones_like(s), fmt, 16).numpy()[:, 37:].any()  # the padding's values: 0
    assert s[0, 2] == 0
    back = Q.dequantize(q, s, fmt, 16, 37)
    assert back.shape == (6, 37)
    np.testing.assert_array_equal(back, torch_dequant(q, s, fmt, 16, 37).numpy())
    step = np.abs(s.astype(np.float32)).repeat(16, axis=1)[:, :37]
    assert np.all(np.abs(back - w) <= (0.5 if fmt == "int8" else 1.0) * step * (1 + 1e-6))


@pytest.mark.parametrize("device", RUNTIMES)
@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_quantize_takes_layers_whose_width_is_not_a_multiple_of_the_group(device, fmt, tmp_path):
    """Linear(37, 21) and Linear(21, 6) in groups of 16 (both padded): the output is torch's float64 matmuls of
    the dequantized weights (within 1e-5 of Σ|x·w|, a float32 sum's order), the gradient reaches x as torch's does,
    and save / load gives back the same outputs."""
    runtime_or_skip(device)
    tl.manual_seed(0)
    model = tl.nn.Sequential(tl.nn.Linear(37, 21), tl.nn.Linear(21, 6)).to(device)
    Q.quantize_(model, fmt, 16)
    assert [repr(m) for m in model] == [f"QuantizedLinear(in_features={k}, out_features={n}, {fmt}, group_size=16, "
                                        "bias=True)" for k, n in ((37, 21), (21, 6))]
    x = np.random.default_rng(5).standard_normal((3, 4, 37)).astype(np.float32)  # 12 rows: the matmul paths
    X = tl.tensor(x, device=device, requires_grad=True)
    y = model(X)
    y.sum().backward()

    tx = torch.from_numpy(x).double().requires_grad_(True)
    h, bound = tx, torch.from_numpy(np.abs(x)).double()
    for layer in model:
        w = torch_dequant(layer.weight.numpy(), layer.weight_scale.numpy(), fmt, 16, layer.in_features).double()
        np.testing.assert_array_equal(layer.dequantized_weight(), w.numpy())
        b = torch.from_numpy(np.array(layer.bias.numpy())).double()
        h, bound = h @ w.T + b, bound @ w.abs().T + b.abs()
    h.sum().backward()
    assert y.shape == (3, 4, 6)
    assert np.all(np.abs(y.numpy() - h.detach().numpy()) <= 1e-5 * bound.numpy())
    np.testing.assert_allclose(X.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-5)

    Q.save(model, tmp_path / "odd.safetensors")
    tl.manual_seed(1)
    again = Q.load(tl.nn.Sequential(tl.nn.Linear(37, 21), tl.nn.Linear(21, 6)).to(device), tmp_path / "odd.safetensors")
    with tl.no_grad():
        np.testing.assert_array_equal(again(tl.tensor(x, device=device)).numpy(), y.detach().numpy())


@pytest.mark.parametrize("fmt,g", [("int8", 32), ("int4", 32), ("int4", 128)])
def test_rounding_error_variance_is_the_step_squared_over_12(fmt, g):
    """The rounding error law, derived. Rounding w to the grid d·ℤ leaves e = w − d·rint(w/d). When w is spread
    smoothly over many steps, w/d mod 1 is uniform, so e is uniform on [−d/2, d/2] and
        E[e²] = (1/d) ∫ e² de over [−d/2, d/2] = d²/12.
    Within a group the scale is set by the group's extreme element, which is then (up to float16's rounding of d)
    on the grid: 1 element of g has e ≈ 0, the other g − 1 follow the law. So for int8,
        E[e²/d²] = (g − 1)/g · 1/12.
    int4 has 8 levels below zero and 7 above: w/d is uniform on (−8, 8) for the g − 1 others, and the values past
    7.5 (a share 0.5/16) clip to 7 with e/d uniform on (0.5, 1], where E[(e/d)²] = (1³ − 0.5³)/(3·0.5) = 7/12:
        E[e²/d²] = (g − 1)/g · (15.5/16 · 1/12 + 0.5/16 · 7/12) = (g − 1)/g · 19/192.
    Measured on 2¹⁷ uniform weights (the estimate's relative standard deviation is about 0.3 %): within 2 %."""
    rng = np.random.default_rng(7)
    w = rng.uniform(-1, 1, (256, 512)).astype(np.float32)
    q, s = Q.quantize(w, fmt, g)
    e = (Q.dequantize(q, s, fmt, g) - w).reshape(256, -1, g)
    d = s.astype(np.float64)[..., None]
    measured = float(np.mean(e.astype(np.float64) ** 2 / d ** 2))
    predicted = (g - 1) / g * (1 / 12 if fmt == "int8" else 19 / 192)
    assert abs(measured / predicted - 1) < 0.02, (measured, predicted)


def tiny_gpt(device="numpy", seed=0, n_layer=2):
    tl.manual_seed(seed)
    model = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=n_layer, n_head=2, n_embd=64)).to(device)
    spread_weights(model, seed)
    return model.eval()


def logits(model, idx):
    with tl.no_grad():
        return model(idx, idx)[0].numpy()


IDX = np.random.default_rng(3).integers(0, 64, (2, 16))


def test_quantized_gpt_logits_stay_close_to_float32():
    """int8 logits within 3 % (relative L2) of float32's. The error is small enough to propagate linearly, so
    int4's is int8's times the ratio of their rounding noise: steps max|w|/8 against max|w|/127, noise variance
    19/192 against 1/12 of a step² (see the rounding-error test): 127/8 · √(19/16) ≈ 17.3, within 15 %."""
    idx = tl.tensor(IDX)
    want = logits(tiny_gpt(), idx)
    err = {}
    for fmt in ("int8", "int4"):
        model = tiny_gpt()
        Q.quantize_(model, fmt, 32, embedding=True)
        layers = Q.quantized_layers(model)
        assert set(layers) == {"lm_head"} | {f"transformer.h.{i}.{n}" for i in range(2)
                                             for n in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}
        assert not any(isinstance(p, Q.QuantizedWeight) for p in model.parameters())
        err[fmt] = rel(logits(model, idx), want)
    assert 0 < err["int8"] < 0.03
    assert abs(err["int4"] / err["int8"] / (127 / 8 * math.sqrt(19 / 16)) - 1) < 0.15, err


def test_embedding_false_keeps_the_tied_lm_head_in_float32():
    model = tiny_gpt()
    Q.quantize_(model, "int8")
    assert model.lm_head.weight is model.transformer.wte.weight and "lm_head" not in Q.quantized_layers(model)


def test_quantized_gpt_runs_and_trains_its_other_parameters_on_the_c_runtime():
    model = tiny_gpt("c", n_layer=1)
    Q.quantize_(model, "int4", 32)
    model.train()
    idx = tl.tensor(IDX, device="c")
    _, loss = model(idx, idx)
    loss.backward()
    grads = {n for n, p in model.named_parameters() if p.grad is not None}
    assert "transformer.h.0.attn.c_attn.bias" in grads and "transformer.wte.weight" in grads


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_save_and_load_round_trip_a_quantized_model(tmp_path, fmt):
    from safetensors.numpy import load_file as reference_load
    model = tiny_gpt()
    Q.quantize_(model, fmt, 32, embedding=fmt == "int4")
    idx = tl.tensor(IDX)
    want = logits(model, idx)
    path = tmp_path / "q.safetensors"
    Q.save(model, path)
    stored = reference_load(str(path))  # the safetensors package reads what we wrote
    qkey = "transformer.h.0.mlp.c_fc.weight"
    assert stored[qkey].dtype == (np.int8 if fmt == "int8" else np.uint8)
    np.testing.assert_array_equal(stored[qkey], model.transformer.h[0].mlp.c_fc.weight.numpy())
    assert stored[qkey + "_scale"].dtype == np.float16

    fresh = tiny_gpt(seed=1)  # float32, other weights: load quantizes its layers with the file's values
    Q.load(fresh, path)
    np.testing.assert_array_equal(logits(fresh, idx), want)
    assert {n: (q.fmt, q.group_size) for n, q in Q.quantized_layers(fresh).items()} == \
        {n: (q.fmt, q.group_size) for n, q in Q.quantized_layers(model).items()}
    again = tiny_gpt(seed=2)
    Q.quantize_(again, fmt, 32, embedding=fmt == "int4")
    Q.load(again, path)  # into a model quantized alike
    np.testing.assert_array_equal(logits(again, idx), want)


def test_load_refuses_a_mismatched_model_without_changing_it(tmp_path):
    model = tiny_gpt()
    Q.quantize_(model, "int8")
    Q.save(model, tmp_path / "q.safetensors")
    other = GPT(GPTConfig(block_size=16, vocab_size=64, n_layer=1, n_head=2, n_embd=64))
    with pytest.raises(RuntimeError, match="quantizes layers .*transformer.h.1"):
        Q.load(other, tmp_path / "q.safetensors")
    assert not Q.quantized_layers(other)
    from tinyllm.utils.safetensors import save_file
    save_file({"x": np.zeros(2, np.float32)}, tmp_path / "plain.safetensors")
    with pytest.raises(ValueError, match="not a tinyllm quantized checkpoint"):
        Q.load(model, tmp_path / "plain.safetensors")


def test_quantizing_twice_is_an_error():
    model = tiny_gpt()
    Q.quantize_(model, "int8")
    with pytest.raises(RuntimeError, match="already quantized .*int8, group 32"):
        Q.quantize_(model, "int4")


def test_bad_group_sizes_are_errors_before_anything_changes():
    """Each names the function and the fix. A group that does not divide the width is not an error (padded)."""
    model = tiny_gpt()
    for bad in (0, -32, 2.5, "32", True, None):
        with pytest.raises(ValueError, match=f"quantize_: group_size must be a positive int.*got {bad!r}: pass e.g. "
                                             "group_size=32"):
            Q.quantize_(model, "int8", bad)
    with pytest.raises(ValueError, match="quantize_: int4 .*group_size must be even, got 1"):
        Q.quantize_(model, "int4", 1)
    with pytest.raises(ValueError, match="quantize_: unknown format 'int3'"):
        Q.quantize_(model, "int3")
    for what, call in (("QuantizedLinear.from_linear",
                        lambda: Q.QuantizedLinear.from_linear(tl.nn.Linear(8, 2), "int8", 0)),
                       ("quantize", lambda: Q.quantize(np.ones((2, 8), np.float32), "int4", -2))):
        with pytest.raises(ValueError, match=f"{what}: group_size must be a positive int"):
            call()
    assert not Q.quantized_layers(model)  # all or nothing
    w = model.transformer.h[0].attn.c_attn.weight.numpy().copy()
    with tl.no_grad():  # a later layer holding a NaN: no layer changes either
        model.transformer.h[1].mlp.c_proj.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="inf or NaN.*layer transformer.h.1.mlp.c_proj"):
        Q.quantize_(model, "int8")
    assert not Q.quantized_layers(model)
    np.testing.assert_array_equal(model.transformer.h[0].attn.c_attn.weight.numpy(), w)
    Q.quantize_(model.transformer.h[0], "int8", 48)  # 64 = 48 + 16: a padded last group
    assert model.transformer.h[0].mlp.c_fc.weight.shape == (256, 96)


def test_training_a_quantized_weight_is_an_error():
    model = tiny_gpt()
    Q.quantize_(model, "int4")
    layer = model.transformer.h[0].mlp.c_fc
    for t in (layer.weight, layer.weight_scale):
        with pytest.raises(RuntimeError, match="quantized weight, which is frozen.*LoRA"):
            t.requires_grad_()
    with pytest.raises(TypeError, match="require grad, got <frozen quantized weight"):
        tl.optim.AdamW([layer.weight_scale])


def test_qmatmul_refuses_bad_operands_by_name():
    q, s = Q.quantize(np.ones((3, 8), np.float32), "int4", 4)
    qw, sc = tl.Tensor(q), tl.Tensor(s)
    with pytest.raises(ValueError, match="QMATMUL: x of shape \\(2, 6\\) .* 8 input features"):
        qmatmul(tl.zeros(2, 6), qw, sc, "int4", 4)
    with pytest.raises(TypeError, match="QMATMUL: int4 with group 2 stores .* scales as float16 \\(3, 4\\)"):
        qmatmul(tl.zeros(2, 8), qw, sc, "int4", 2)
    with pytest.raises(TypeError, match="QMATMUL: x must be float32, got int64"):
        qmatmul(tl.zeros(2, 8, dtype=tl.int64), qw, sc, "int4", 4)
    qmatmul(tl.zeros(2, 5), qw, sc, "int4", 4, 5)  # K = 5 of a storage of 8: a padded last group
    for k in (4, 9, -1, 5.0):  # the storage holds 2 groups of 4: K in (4, 8]
        with pytest.raises(ValueError, match=f"QMATMUL: in_features {k!r} does not fit a storage of 8 columns"):
            qmatmul(tl.zeros(2, 5), qw, sc, "int4", 4, k)


# ---- the WGSL runtime: bytes packed in words, the kernels, bfloat16 refused --------------------------------------

@pytest.mark.wgsl
def test_wgsl_stores_bytes_and_copies_views_of_them():
    runtime_or_skip("wgsl")
    a = np.random.default_rng(0).integers(-128, 128, (5, 7)).astype(np.int8)
    t = tl.Tensor(a, device="wgsl")
    np.testing.assert_array_equal(t.numpy(), a)
    np.testing.assert_array_equal(t.T.contiguous().numpy(), a.T)  # a strided byte copy (atomic byte writes)
    np.testing.assert_array_equal(t[1:4, ::2].contiguous().numpy(), a[1:4, ::2])
    rt = tl.runtime.get("wgsl")  # into a buffer of other bytes: each invocation must replace its byte alone
    dirty = rt.from_numpy(np.full((7, 5), -1, np.int8), tl.int8).data
    rt.copy_into(dirty, ((5, 1), 0), t.node.arg.data.view((7, 5), (1, 7)))
    np.testing.assert_array_equal(rt.to_numpy(tl.runtime.base.Buffer(rt, dirty, (7, 5), tl.int8)), a.T)
    u = tl.Tensor(a.view(np.uint8)[:, :3], device="wgsl")
    np.testing.assert_array_equal(tl.cat([u, u], 1).numpy(), np.concatenate([a.view(np.uint8)[:, :3]] * 2, 1))


@pytest.mark.wgsl
def test_wgsl_refuses_bfloat16_at_upload_and_kernel_build():
    runtime_or_skip("wgsl")
    with pytest.raises(TypeError, match="no bfloat16.*\\.float\\(\\)"):
        tl.Tensor(np.zeros(3, np.float32), dtype=tl.bfloat16, device="wgsl")
    x = tl.tensor(np.zeros(3, np.float32), device="wgsl")
    with pytest.raises(TypeError, match="no bfloat16.*\\.float\\(\\)"):
        x.to(tl.bfloat16).numpy()
    with pytest.raises(TypeError, match="no bfloat16.*\\.float\\(\\)"):  # a cast through bf16 inside a fused kernel
        (x * 2).to(tl.bfloat16).float().numpy()


@pytest.mark.wgsl
def test_wgsl_quantized_gpt_matches_numpy():
    runtime_or_skip("wgsl")
    want_model, got_model = tiny_gpt(n_layer=1), tiny_gpt("wgsl", n_layer=1)
    for m in (want_model, got_model):
        Q.quantize_(m, "int4", 32, embedding=True)
    got = logits(got_model, tl.tensor(IDX, device="wgsl"))
    assert rel(got, logits(want_model, tl.tensor(IDX))) < 1e-5
