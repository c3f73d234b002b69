"""tinyllm.nn against torch.nn: Module bookkeeping (names, state dicts, modes, grads), the layers, and the
nn.functional composites, forward and gradients, on the same inputs and weights."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from hypothesis import assume, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import tinyllm as tl
from tinyllm import nn
from tinyllm.nn import functional as F

FWD = dict(rtol=1e-5, atol=1e-6)  # float32 forward: same ops in the same order, only libm/BLAS rounding differs
GRAD = dict(rtol=1e-4, atol=1e-5)  # float32 backward: reductions sum in another order than torch's kernels
SETTINGS = settings(max_examples=25, deadline=None)


# ---- helpers -----------------------------------------------------------------------------------------------

def floats(shape, lo=-4.0, hi=4.0):
    return hnp.arrays(np.float32, shape, elements=st.floats(lo, hi, width=32))


def shapes(min_dims=1, max_dims=3, max_side=5):
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=1, max_side=max_side)


def leaves(*arrays):
    """The same values as tinyllm and torch leaves; float arrays require grad."""
    tl_in = [tl.tensor(a, requires_grad=a.dtype.kind == "f") for a in arrays]
    th_in = [torch.tensor(a, requires_grad=a.dtype.kind == "f") for a in arrays]
    return tl_in, th_in


def check_fn(tl_fn, torch_fn, *arrays, seed=0, grad=True):
    """Run both functions on the same inputs; compare outputs and (for a random upstream gradient) the
    gradients of every float input."""
    tl_in, th_in = leaves(*arrays)
    out, tout = tl_fn(*tl_in), torch_fn(*th_in)
    assert out.shape == tuple(tout.shape)
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), **FWD)
    if not grad:
        return
    v = np.random.default_rng(seed).standard_normal(tout.shape).astype(np.float32)
    out.backward(tl.tensor(v))
    tout.backward(torch.from_numpy(v))
    for i, (a, b) in enumerate(zip(tl_in, th_in)):
        if b.requires_grad:
            assert a.grad is not None, f"input {i} got no gradient"
            np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), **GRAD, err_msg=f"gradient of input {i}")


def copy_to_torch(module, tmodule):
    """Give a torch module the tinyllm module's weights (names must match)."""
    tmodule.load_state_dict({k: torch.from_numpy(np.array(v.numpy(), copy=True))
                             for k, v in module.state_dict().items()})
    return tmodule


def check_module(module, tmodule, x, seed=0):
    """Forward and backward of a module and its torch twin: output, input gradient, every parameter's gradient."""
    copy_to_torch(module, tmodule)
    tx = torch.tensor(x, requires_grad=x.dtype.kind == "f")
    lx = tl.tensor(x, requires_grad=x.dtype.kind == "f")
    out, tout = module(lx), tmodule(tx)
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), **FWD)
    v = np.random.default_rng(seed).standard_normal(tout.shape).astype(np.float32)
    out.backward(tl.tensor(v))
    tout.backward(torch.from_numpy(v))
    if tx.requires_grad:
        np.testing.assert_allclose(lx.grad.numpy(), tx.grad.numpy(), **GRAD)
    tparams = dict(tmodule.named_parameters())
    assert [n for n, _ in module.named_parameters()] == list(tparams)
    for name, p in module.named_parameters():
        np.testing.assert_allclose(p.grad.numpy(), tparams[name].grad.numpy(), **GRAD, err_msg=name)


# ---- Module bookkeeping ------------------------------------------------------------------------------------

class Net(nn.Module):
    def __init__(self):
        self.embed = nn.Embedding(10, 4)
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4, bias=False)])
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.LayerNorm(4)})
        self.scale = nn.Parameter(np.ones(4, np.float32))
        self.drop = nn.Dropout(0.1)

    def forward(self, idx):
        x = self.embed(idx) * self.scale
        for b in self.blocks:
            x = b(x).relu()
        return self.heads["a"](self.drop(self.heads["b"](x)))


class TorchNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4, bias=False)])
        self.heads = torch.nn.ModuleDict({"a": torch.nn.Linear(4, 2), "b": torch.nn.LayerNorm(4)})
        self.scale = torch.nn.Parameter(torch.ones(4))
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, idx):
        x = self.embed(idx) * self.scale
        for b in self.blocks:
            x = b(x).relu()
        return self.heads["a"](self.drop(self.heads["b"](x)))


def test_named_parameters_are_dotted_paths_in_torch_order():
    net, tnet = Net(), TorchNet()
    names = [n for n, _ in net.named_parameters()]
    assert names == [n for n, _ in tnet.named_parameters()]  # own parameters first, then children in order
    assert "blocks.1.bias" not in names  # bias=False registers no parameter
    assert len(list(net.parameters())) == len(list(tnet.parameters()))
    assert all(isinstance(p, nn.Parameter) and p.requires_grad for p in net.parameters())
    assert net.num_parameters() == sum(p.numel() for p in tnet.parameters())
    assert list(net.state_dict()) == list(tnet.state_dict())


def test_sequential_names_and_forward_backward_match_torch():
    tl.manual_seed(0)
    seq = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3), nn.GELU(approximate="tanh"))
    tseq = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3),
                               torch.nn.GELU(approximate="tanh"))
    assert [n for n, _ in seq.named_parameters()] == [n for n, _ in tseq.named_parameters()]
    assert len(seq) == 4 and isinstance(seq[1], nn.ReLU)
    check_module(seq, tseq, np.random.default_rng(1).standard_normal((6, 5)).astype(np.float32))


def test_module_list_and_dict_forward_backward_match_torch():
    tl.manual_seed(2)
    net, tnet = Net(), TorchNet()
    net.eval(), tnet.eval()
    idx = np.random.default_rng(3).integers(0, 10, (3, 5))
    check_module(net, tnet, idx)


def test_tied_parameter_listed_once_but_saved_under_both_names():
    class Tied(nn.Module):
        def __init__(self):
            self.a = nn.Linear(3, 3)
            self.b = nn.Linear(3, 3, bias=False)
            self.b.weight = self.a.weight

    m = Tied()
    assert [n for n, _ in m.named_parameters()] == ["a.weight", "a.bias"]
    assert list(m.state_dict()) == ["a.weight", "a.bias", "b.weight"]
    assert m.state_dict()["b.weight"] is m.a.weight


@pytest.mark.parametrize("kind", ["numpy", "tinyllm", "torch"])
def test_load_state_dict_accepts_numpy_tensors_and_torch(kind):
    tl.manual_seed(4)
    src, dst = Net(), Net()
    convert = {"numpy": lambda t: t.numpy(), "tinyllm": lambda t: tl.tensor(t.numpy()),
               "torch": lambda t: torch.tensor(t.numpy(), requires_grad=True)}[kind]
    ids = {k: id(v) for k, v in dst.state_dict().items()}
    missing, unexpected = dst.load_state_dict({k: convert(v) for k, v in src.state_dict().items()})
    assert missing == [] and unexpected == []
    for k, v in dst.state_dict().items():
        assert id(v) == ids[k], "loading must keep parameter identity (optimizers hold them)"
        assert v.requires_grad and v.dtype is tl.float32
        np.testing.assert_array_equal(v.numpy(), src.state_dict()[k].numpy())


def test_load_state_dict_from_torch_module_then_outputs_match():
    torch.manual_seed(5)
    tnet = TorchNet().eval()
    net = Net().eval()
    net.load_state_dict(tnet.state_dict())
    idx = np.random.default_rng(6).integers(0, 10, (2, 4))
    np.testing.assert_allclose(net(tl.tensor(idx)).numpy(), tnet(torch.from_numpy(idx)).detach().numpy(), **FWD)


def test_load_state_dict_strict_errors_name_the_keys():
    net = Net()
    state = {k: v.numpy() for k, v in net.state_dict().items()}
    del state["blocks.0.bias"]
    state["blocks.9.weight"] = np.zeros((4, 4), np.float32)
    with pytest.raises(RuntimeError) as err:
        net.load_state_dict(state)
    assert "blocks.0.bias" in str(err.value) and "blocks.9.weight" in str(err.value)
    assert "Missing key(s)" in str(err.value) and "Unexpected key(s)" in str(err.value)


def test_load_state_dict_lists_every_problem_in_one_error_as_torch():
    """Missing keys, unexpected keys and wrong shapes together in one RuntimeError, each named, as torch's is."""
    net = Net()
    state = {k: v.numpy() for k, v in net.state_dict().items()}
    del state["blocks.0.bias"]
    state["extra"] = np.zeros(3, np.float32)
    state["heads.a.weight"] = np.zeros((3, 4), np.float32)
    with pytest.raises(RuntimeError) as err:
        net.load_state_dict(state)
    torch_net = torch.nn.Linear(4, 2)
    with pytest.raises(RuntimeError) as torch_err:
        torch_net.load_state_dict({"weight": torch.zeros(3, 4), "extra": torch.zeros(3)})
    for words in ("Error(s) in loading state_dict for", "Unexpected key(s) in state_dict:", "size mismatch for"):
        assert words in str(torch_err.value) and words in str(err.value), (words, str(err.value))
    assert '"blocks.0.bias"' in str(err.value) and '"extra"' in str(err.value) and "heads.a.weight" in str(err.value)
    assert "Missing key(s) in state_dict:" in str(err.value)


def test_load_state_dict_non_strict_loads_the_rest():
    tl.manual_seed(7)
    net, other = Net(), Net()
    before = net.blocks[0].bias.numpy().copy()
    state = {k: v.numpy() for k, v in other.state_dict().items()}
    del state["blocks.0.bias"]
    state["extra"] = np.zeros(3, np.float32)
    missing, unexpected = net.load_state_dict(state, strict=False)
    assert missing == ["blocks.0.bias"] and unexpected == ["extra"]
    np.testing.assert_array_equal(net.blocks[0].bias.numpy(), before)
    np.testing.assert_array_equal(net.blocks[0].weight.numpy(), other.blocks[0].weight.numpy())


def test_load_state_dict_shape_mismatch_is_clear_and_loads_nothing():
    tl.manual_seed(8)
    net, other = Net(), Net()
    before = {k: v.numpy().copy() for k, v in net.state_dict().items()}
    state = {k: v.numpy() for k, v in other.state_dict().items()}
    state["heads.a.weight"] = np.zeros((3, 4), np.float32)
    with pytest.raises(RuntimeError) as err:
        net.load_state_dict(state)
    msg = str(err.value)
    assert "heads.a.weight" in msg and "(3, 4)" in msg and "(2, 4)" in msg
    for k, v in net.state_dict().items():  # all or nothing, as torch
        np.testing.assert_array_equal(v.numpy(), before[k], err_msg=k)


def test_train_eval_propagate_to_every_submodule():
    net = Net()
    assert all(m.training for m in net.modules())
    assert net.eval() is net
    assert not any(m.training for m in net.modules())
    assert not net.blocks[1].training and not net.heads["b"].training
    net.train()
    assert all(m.training for m in net.modules())
    net.train(False)
    assert not any(m.training for m in net.modules())


def test_eval_turns_dropout_off_inside_the_model():
    tl.manual_seed(9)
    net = Net()
    net.drop.p = 0.9
    idx = tl.tensor(np.arange(8).reshape(2, 4))
    net.eval()
    a, b = net(idx).numpy(), net(idx).numpy()
    np.testing.assert_array_equal(a, b)
    net.train()
    c = net(idx).numpy()
    assert not np.allclose(a, c)


def test_zero_grad_clears_every_gradient():
    net = Net()
    net(tl.tensor(np.arange(6).reshape(2, 3))).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())


def test_gradients_accumulate_over_backward_calls_like_torch():
    tl.manual_seed(10)
    lin, tlin = nn.Linear(3, 2), torch.nn.Linear(3, 2)
    copy_to_torch(lin, tlin)
    x = np.random.default_rng(11).standard_normal((4, 3)).astype(np.float32)
    for _ in range(2):
        lin(tl.tensor(x)).square().sum().backward()
        tlin(torch.from_numpy(x)).square().sum().backward()
    np.testing.assert_allclose(lin.weight.grad.numpy(), tlin.weight.grad.numpy(), **GRAD)


def test_zero_grad_set_to_none_false_keeps_zero_tensors():
    net = Net()
    net(tl.tensor(np.arange(6).reshape(2, 3))).sum().backward()
    net.zero_grad(set_to_none=False)
    for name, p in net.named_parameters():
        assert p.grad is not None and p.grad.shape == p.shape, name
        assert not p.grad.numpy().any(), name


def test_shared_submodule_listed_once_saved_under_both_names_as_torch():
    class Shared(nn.Module):
        def __init__(self):
            self.a = nn.Linear(2, 2)
            self.b = self.a
            self.ln = nn.LayerNorm(2)

    class TorchShared(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(2, 2)
            self.b = self.a
            self.ln = torch.nn.LayerNorm(2)

    m, tm = Shared(), TorchShared()
    assert [n for n, _ in m.named_modules()] == [n for n, _ in tm.named_modules()]
    assert [n for n, _ in m.named_parameters()] == [n for n, _ in tm.named_parameters()]
    assert list(m.state_dict()) == list(tm.state_dict())
    m.load_state_dict(tm.state_dict())
    np.testing.assert_array_equal(m.b.weight.numpy(), tm.a.weight.detach().numpy())


def test_module_cycle_does_not_hang():
    outer = nn.Sequential(nn.Linear(2, 2))
    outer[0].owner = outer  # a back-reference, as some models keep
    assert [n for n, _ in outer.named_modules()] == ["", "0"]
    assert [n for n, _ in outer.named_parameters()] == ["0.weight", "0.bias"]


def test_module_to_casts_parameters_in_place():
    tl.manual_seed(21)
    lin, tlin = nn.Linear(3, 2), torch.nn.Linear(3, 2)
    copy_to_torch(lin, tlin)
    weight = lin.weight
    opt = tl.optim.SGD(lin.parameters(), lr=0.1)
    assert lin.to(tl.float64) is lin
    tlin.to(torch.float64)
    assert lin.weight is weight and weight.dtype is tl.float64 and weight.requires_grad and weight.is_leaf
    x = np.random.default_rng(22).standard_normal((4, 3))
    out = lin(tl.tensor(x))
    assert out.dtype is tl.float64
    out.sum().backward()
    tlin(torch.from_numpy(x)).sum().backward()
    opt.step()  # the optimizer built before the cast still drives the same parameters
    with torch.no_grad():
        for tp in tlin.parameters():
            tp -= 0.1 * tp.grad
    np.testing.assert_allclose(lin.weight.numpy(), tlin.weight.detach().numpy(), rtol=1e-12)
    lin.to(dtype=tl.float32)
    assert weight.dtype is tl.float32 and weight.grad.dtype is tl.float32
    with pytest.raises(TypeError, match="floating-point"):
        lin.to(tl.int64)


def test_module_without_forward_raises():
    with pytest.raises(NotImplementedError, match="forward"):
        nn.Module()(1)


def test_parameter_from_tensor_and_list():
    p = nn.Parameter(tl.tensor([1.0, 2.0]))
    q = nn.Parameter([[1, 2], [3, 4]])
    assert p.requires_grad and p.is_leaf and q.dtype is tl.float32
    assert not nn.Parameter(np.zeros(2, np.float32), requires_grad=False).requires_grad


# ---- layers ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_torch(bias):
    tl.manual_seed(12)
    lin = nn.Linear(6, 4, bias=bias)
    assert lin.weight.shape == (4, 6) and (lin.bias is None) != bias
    assert np.abs(lin.weight.numpy()).max() <= 1 / math.sqrt(6)  # torch's default init bound
    x = np.random.default_rng(13).standard_normal((2, 3, 6)).astype(np.float32)
    check_module(lin, torch.nn.Linear(6, 4, bias=bias), x)


def test_linear_wrong_input_size_raises():
    with pytest.raises(RuntimeError, match="features"):
        nn.Linear(3, 2)(tl.ones(4, 5))


def test_embedding_matches_torch_with_repeated_indices():
    tl.manual_seed(14)
    emb = nn.Embedding(7, 5)
    assert abs(float(emb.weight.numpy().std()) - 1.0) < 0.5  # N(0, 1) init, as torch
    idx = np.array([[0, 3, 3, 6], [6, 6, 1, 0]])  # repeats: the weight gradient must add them up
    check_module(emb, torch.nn.Embedding(7, 5), idx)


def test_embedding_rejects_float_indices():
    with pytest.raises(TypeError, match="long"):
        nn.Embedding(4, 2)(tl.tensor([0.0, 1.0]))


@pytest.mark.parametrize("shape,affine,bias", [((8,), True, True), ((8,), True, False), ((8,), False, False),
                                               ((3, 8), True, True)])
def test_layernorm_matches_torch(shape, affine, bias):
    ln = nn.LayerNorm(shape, elementwise_affine=affine, bias=bias)
    tln = torch.nn.LayerNorm(shape, elementwise_affine=affine, bias=bias)
    rng = np.random.default_rng(15)
    for p in ln.parameters():  # non-trivial gain and shift
        p.copy_(rng.standard_normal(p.shape).astype(np.float32))
    x = (3 * rng.standard_normal((2, 3, 8)) + 1).astype(np.float32)
    check_module(ln, tln, x)


def test_dropout_module_train_and_eval():
    drop = nn.Dropout(0.5)
    x = tl.ones(1000)
    y = drop(x).numpy()
    assert set(np.unique(y)) == {0.0, 2.0}
    drop.eval()
    np.testing.assert_array_equal(drop(x).numpy(), np.ones(1000, np.float32))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_and_relu_modules_match_torch(approximate):
    x = np.linspace(-5, 5, 41, dtype=np.float32)
    check_fn(nn.GELU(approximate), torch.nn.GELU(approximate=approximate), x)
    check_fn(nn.ReLU(), torch.nn.ReLU(), x + 0.01)


# ---- functional ---------------------------------------------------------------------------------------------

@SETTINGS
@given(x=shapes().flatmap(lambda s: floats(s, -6, 6)), approximate=st.sampled_from(["none", "tanh"]))
def test_gelu_matches_torch(x, approximate):
    check_fn(lambda t: F.gelu(t, approximate=approximate), lambda t: TF.gelu(t, approximate=approximate), x)


def test_gelu_rejects_unknown_approximation():
    with pytest.raises(ValueError, match="approximate"):
        F.gelu(tl.ones(2), approximate="sigmoid")


@SETTINGS
@given(x=shapes().flatmap(floats))
def test_relu_matches_torch(x):
    check_fn(F.relu, TF.relu, x)


@SETTINGS
@given(x=shapes(max_dims=4).flatmap(lambda s: floats(s, -20, 20)), data=st.data())
def test_softmax_and_log_softmax_match_torch(x, data):
    dim = data.draw(st.integers(-x.ndim, x.ndim - 1))
    check_fn(lambda t: F.softmax(t, dim), lambda t: TF.softmax(t, dim), x)
    check_fn(lambda t: F.log_softmax(t, dim), lambda t: TF.log_softmax(t, dim), x)


def test_softmax_is_stable_for_large_logits():
    x = np.array([[1000.0, 1000.0, -1000.0], [-1e4, 0.0, 1e4]], np.float32)
    check_fn(lambda t: F.softmax(t, -1), lambda t: TF.softmax(t, -1), x)
    check_fn(lambda t: F.log_softmax(t, -1), lambda t: TF.log_softmax(t, -1), x)


@st.composite
def classification(draw, extra_dims):
    n = draw(st.integers(1, 6))
    c = draw(st.integers(2, 7))
    d = tuple(draw(st.lists(st.integers(1, 3), min_size=extra_dims, max_size=extra_dims)))
    logits = draw(floats((n, c) + d, -8, 8))
    target = draw(hnp.arrays(np.int64, (n,) + d, elements=st.integers(0, c - 1)))
    ignored = draw(hnp.arrays(np.bool_, (n,) + d))
    ignored.flat[0] = False  # at least one target counts, so 'mean' is defined
    return logits, np.where(ignored, -1, target)


@SETTINGS
@given(case=st.integers(0, 2).flatmap(classification), reduction=st.sampled_from(["mean", "sum", "none"]),
       smoothing=st.sampled_from([0.0, 0.1]), ignore=st.booleans())
def test_cross_entropy_matches_torch(case, reduction, smoothing, ignore):
    logits, target = case
    ignore_index = -1 if ignore else -100
    if not ignore:
        target = np.where(target < 0, 0, target)
    check_fn(lambda a, t: F.cross_entropy(a, t, ignore_index=ignore_index, reduction=reduction,
                                          label_smoothing=smoothing),
             lambda a, t: TF.cross_entropy(a, t, ignore_index=ignore_index, reduction=reduction,
                                           label_smoothing=smoothing),
             logits, target)


def test_cross_entropy_class_last_layout_equals_flattened():
    """(B, T, C) logits with (B, T) targets (the GPT layout) equal the flattened (B·T, C) loss."""
    rng = np.random.default_rng(16)
    logits = rng.standard_normal((2, 5, 7)).astype(np.float32)
    target = rng.integers(0, 7, (2, 5))
    a = F.cross_entropy(tl.tensor(logits), tl.tensor(target)).item()
    b = TF.cross_entropy(torch.from_numpy(logits.reshape(-1, 7)), torch.from_numpy(target.reshape(-1))).item()
    assert a == pytest.approx(b, rel=FWD["rtol"])


def test_cross_entropy_errors():
    logits = tl.zeros(4, 3)
    with pytest.raises(TypeError, match="int64"):
        F.cross_entropy(logits, tl.tensor([0.0, 1.0, 2.0, 0.0]))
    with pytest.raises(ValueError, match="target"):  # torch's class: "Expected input batch_size (4) to match ..."
        F.cross_entropy(logits, tl.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="reduction"):
        F.cross_entropy(logits, tl.tensor([0, 1, 2, 0]), reduction="max")


@pytest.mark.parametrize("shape", [(4, 5), (3, 5, 2, 2), (5,)])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_cross_entropy_class_probabilities_match_torch(shape, reduction, smoothing, each_runtime):
    """Soft labels: a float target of the logits' shape (class axis 1, or 0 for 1-D), gradients to both."""
    rng = np.random.default_rng(len(shape))
    logits = rng.standard_normal(shape).astype(np.float32)
    probs = TF.softmax(torch.tensor(rng.standard_normal(shape).astype(np.float32)), dim=1 if len(shape) > 1 else 0)
    check_fn(lambda a, t: F.cross_entropy(a, t, reduction=reduction, label_smoothing=smoothing),
             lambda a, t: TF.cross_entropy(a, t, reduction=reduction, label_smoothing=smoothing),
             logits, probs.numpy())


def test_cross_entropy_float_target_of_another_shape():
    with pytest.raises(TypeError, match=r"probabilities.*\(4, 3\).*int64"):
        F.cross_entropy(tl.zeros(4, 3), tl.zeros(4, 2))


@pytest.mark.parametrize("target, bad", [([0, 7, 1, 2], 7), ([0, 1, 5, 2], 5), ([0, -1, 1, 2], None),
                                         ([-100, 2, 3, 0], None)])
def test_cross_entropy_target_out_of_range_raises(target, bad, each_runtime):
    """torch: "Target 7 is out of bounds". Targets in host memory (a batch from the data, on the NumPy and C
    runtimes) are checked at once, in torch's words; others when the loss is computed (the targets go through a
    GATHER, whose kernels check indices on every runtime), so a training step does not wait for the host; forward
    and backward both. -100 (ignore_index) is allowed, also with a target outside [0, C) beside it."""
    logits = tl.randn(4, 5, requires_grad=True)
    if target[0] == -100:
        target[1] = 9
    shown = bad if bad is not None else next(t for t in target if t != -100 and not 0 <= t < 5)
    at_once = f"cross_entropy: Target {shown} is out of bounds: the logits have 5 classes"
    with pytest.raises(IndexError, match=at_once if each_runtime != "wgsl" else "GATHER"):
        F.cross_entropy(logits, tl.tensor(target)).item()
    computed = tl.tensor(target) * 1  # not yet a value: GATHER checks it
    with pytest.raises(IndexError, match="GATHER.*" + (f"index {bad}" if bad and each_runtime != "wgsl" else "")):
        F.cross_entropy(logits, computed).item()
    with pytest.raises(IndexError, match="GATHER"):  # WGSL reports at the next read of a value: the gradient
        F.cross_entropy(logits, computed, reduction="none").sum().backward()
        logits.grad.numpy()
    fine = [t if 0 <= t < 5 else -100 for t in target]
    tl_loss = F.cross_entropy(logits, tl.tensor(fine))
    t_loss = TF.cross_entropy(torch.tensor(logits.numpy()), torch.tensor(fine))
    assert tl_loss.item() == pytest.approx(t_loss.item(), rel=1e-5)


@SETTINGS
@given(x=shapes(min_dims=2, max_dims=3, max_side=6).flatmap(lambda s: floats(s, -10, 10)), data=st.data())
def test_layer_norm_matches_torch(x, data):
    k = data.draw(st.integers(1, x.ndim - 1))
    norm_shape = x.shape[-k:]
    w = data.draw(floats(norm_shape, -2, 2))
    b = data.draw(floats(norm_shape, -2, 2))
    # A row of one element, or of equal ones, has variance 0: its exact gradient is 0 and torch returns
    # rounding noise amplified by 1/√eps. Keep ≥ 2 elements, and spread them: x/10 ∈ [-1, 1] plus steps of 3.
    assume(math.prod(norm_shape) >= 2)
    x = x / 10 + 3 * (np.arange(x.size, dtype=np.float32).reshape(x.shape) % 3)
    check_fn(lambda t, tw, tb: F.layer_norm(t, norm_shape, tw, tb, eps=1e-5),
             lambda t, tw, tb: TF.layer_norm(t, norm_shape, tw, tb, eps=1e-5), x, w, b)


def test_layer_norm_wrong_shape_raises():
    with pytest.raises(RuntimeError, match="normalized_shape"):
        F.layer_norm(tl.ones(2, 3), (4,))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_zeroes_fraction_p_and_scales_the_rest(p):
    tl.manual_seed(17)
    n = 100_000
    xs = np.random.default_rng(18).uniform(1, 2, n).astype(np.float32)  # no zeros of its own
    x = tl.tensor(xs, requires_grad=True)
    y = F.dropout(x, p, training=True)
    out = y.numpy()
    zeroed = out == 0
    # binomial: the fraction's standard deviation is √(p(1-p)/n) ≤ 0.0016; allow 5 of them
    assert abs(zeroed.mean() - p) < 5 * math.sqrt(p * (1 - p) / n)
    np.testing.assert_allclose(out[~zeroed], xs[~zeroed] / (1 - p), rtol=1e-6)
    y.sum().backward()  # the gradient is the same mask, scaled
    np.testing.assert_allclose(x.grad.numpy(), (~zeroed) / (1 - p), rtol=1e-6)
    again = F.dropout(tl.tensor(xs), p).numpy() == 0
    assert (again != zeroed).any(), "each call must draw a new mask"


def test_dropout_eval_and_edge_probabilities():
    x = tl.tensor(np.arange(1, 7, dtype=np.float32))
    np.testing.assert_array_equal(F.dropout(x, 0.5, training=False).numpy(), x.numpy())
    np.testing.assert_array_equal(F.dropout(x, 0.0).numpy(), x.numpy())
    np.testing.assert_array_equal(F.dropout(x, 1.0).numpy(), np.zeros(6, np.float32))
    with pytest.raises(ValueError, match="between 0 and 1"):
        F.dropout(x, 1.5)


@SETTINGS
@given(num=st.integers(1, 8), dim=st.integers(1, 5), data=st.data())
def test_embedding_function_matches_torch(num, dim, data):
    w = data.draw(floats((num, dim)))
    idx = data.draw(hnp.arrays(np.int64, shapes(max_dims=2), elements=st.integers(0, num - 1)))
    check_fn(lambda i, t: F.embedding(i, t), lambda i, t: TF.embedding(i, t), idx, w)


@SETTINGS
@given(lead=shapes(min_dims=1, max_dims=2), fin=st.integers(1, 6), fout=st.integers(1, 6), bias=st.booleans(),
       data=st.data())
def test_linear_function_matches_torch(lead, fin, fout, bias, data):
    x = data.draw(floats(lead + (fin,)))
    w = data.draw(floats((fout, fin)))
    if bias:
        b = data.draw(floats((fout,)))
        check_fn(F.linear, TF.linear, x, w, b)
    else:
        check_fn(F.linear, TF.linear, x, w)


@st.composite
def attention_case(draw):
    batch = tuple(draw(st.lists(st.integers(1, 2), min_size=1, max_size=2)))
    L, S, E, Ev = (draw(st.integers(1, 5)) for _ in range(4))
    q = draw(floats(batch + (L, E), -2, 2))
    k = draw(floats(batch + (S, E), -2, 2))
    v = draw(floats(batch + (S, Ev), -2, 2))
    return q, k, v


@SETTINGS
@given(case=attention_case(), causal=st.booleans(), scaled=st.booleans())
def test_sdpa_matches_torch(case, causal, scaled):
    scale = 0.3 if scaled else None
    check_fn(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale),
             lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale), *case)


@SETTINGS
@given(case=attention_case(), data=st.data())
def test_sdpa_with_bool_mask_matches_torch(case, data):
    q, k, v = case
    L, S = q.shape[-2], k.shape[-2]
    mask = data.draw(hnp.arrays(np.bool_, (L, S)))
    mask[:, 0] = True  # every query sees one key: a fully masked row is NaN in both libraries
    tl_mask, th_mask = tl.tensor(mask), torch.from_numpy(mask)
    check_fn(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=tl_mask),
             lambda a, b, c: TF.scaled_dot_product_attention(a, b, c, attn_mask=th_mask), q, k, v)


@SETTINGS
@given(case=attention_case(), data=st.data())
def test_sdpa_with_float_mask_matches_torch(case, data):
    q, k, v = case
    L, S = q.shape[-2], k.shape[-2]
    bias = data.draw(floats((L, S), -3, 3))
    blocked = data.draw(hnp.arrays(np.bool_, (L, S)))
    blocked[:, 0] = False
    bias = np.where(blocked, -np.inf, bias).astype(np.float32)  # -inf entries block keys, as a bool mask would
    tl_bias, th_bias = tl.tensor(bias), torch.from_numpy(bias)
    check_fn(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=tl_bias),
             lambda a, b, c: TF.scaled_dot_product_attention(a, b, c, attn_mask=th_bias), q, k, v)


def test_sdpa_causal_equals_explicit_tril_mask():
    rng = np.random.default_rng(19)
    q, k, v = (rng.standard_normal((2, 2, 4, 3)).astype(np.float32) for _ in range(3))
    causal = F.scaled_dot_product_attention(tl.tensor(q), tl.tensor(k), tl.tensor(v), is_causal=True).numpy()
    mask = tl.tensor(np.tril(np.ones((4, 4), bool)))
    masked = F.scaled_dot_product_attention(tl.tensor(q), tl.tensor(k), tl.tensor(v), attn_mask=mask).numpy()
    np.testing.assert_allclose(causal, masked, **FWD)
    np.testing.assert_allclose(causal[..., 0, :], v[..., 0, :], **FWD)  # the first query sees only the first key


def test_sdpa_shape_errors():
    with pytest.raises(RuntimeError, match="don't fit"):
        F.scaled_dot_product_attention(tl.ones(1, 2, 3), tl.ones(1, 2, 4), tl.ones(1, 2, 3))


def test_one_hot_and_mse_loss_match_torch():
    idx = np.array([[0, 2], [1, 3]])
    np.testing.assert_array_equal(F.one_hot(tl.tensor(idx), 4).numpy(), TF.one_hot(torch.from_numpy(idx), 4).numpy())
    rng = np.random.default_rng(20)
    a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    for reduction in ["mean", "sum", "none"]:
        check_fn(lambda x, y: F.mse_loss(x, y, reduction=reduction),
                 lambda x, y: TF.mse_loss(x, y, reduction=reduction), a, b)
