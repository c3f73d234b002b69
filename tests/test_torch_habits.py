"""PyTorch habits that work the same here (issue 42, point 3, part): print(model) as torch prints it, parameters()
as an iterator, Module.half/bfloat16/float/double and apply, tinyllm.inference_mode, tinyllm.from_numpy; each
beside torch doing the same."""
import numpy as np
import pytest
import torch

import tinyllm as tl
from tinyllm import nn
from tinyllm.models.gpt import GPT, GPTConfig


def both(build):
    """The same model built with tinyllm.nn and torch.nn."""
    return build(nn), build(torch.nn)


def layers(m):
    return m.Sequential(m.Linear(2, 32), m.GELU(), m.Linear(32, 1, bias=False), m.Dropout(0.1), m.LayerNorm(4),
                        m.Embedding(5, 3), m.RMSNorm(4), m.Sequential(m.Linear(4, 4), m.GELU(approximate="tanh")))


def test_print_model_is_torchs():
    ours, theirs = both(layers)
    assert repr(ours) == repr(theirs), f"{ours}\n---\n{theirs}"
    assert str(nn.Linear(3, 2)) == str(torch.nn.Linear(3, 2)) == "Linear(in_features=3, out_features=2, bias=True)"


def test_print_gpt_shows_nanogpts_module_tree():
    text = repr(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=8, block_size=8, vocab_size=11)))
    for line in ["GPT(", "(transformer): ModuleDict(", "(wte): Embedding(11, 8)", "(h): ModuleList(", "(1): Block(",
                 "(c_attn): Linear(in_features=8, out_features=24, bias=True)",
                 "(lm_head): Linear(in_features=8, out_features=11, bias=False)"]:
        assert line in text, text


def test_parameters_is_an_iterator_as_torchs():
    ours, theirs = both(layers)
    assert next(ours.parameters()) is ours[0].weight
    assert iter(ours.parameters()) is not None and not isinstance(ours.parameters(), list)
    assert [tuple(p.shape) for p in ours.parameters()] == [tuple(p.shape) for p in theirs.parameters()]
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert [type(m).__name__ for m in ours.modules()] == [type(m).__name__ for m in theirs.modules()]
    assert [type(m).__name__ for m in ours.children()] == [type(m).__name__ for m in theirs.children()]
    opt = tl.optim.AdamW(ours.parameters())  # an iterator is what optimizers take, as torch's
    assert len(opt.param_groups[0]["params"]) == len(list(theirs.parameters()))


@pytest.mark.parametrize("method, dtype", [("half", tl.float16), ("bfloat16", tl.bfloat16), ("double", tl.float64),
                                           ("float", tl.float32)])
def test_module_dtype_methods(method, dtype):
    ours, theirs = both(layers)
    assert getattr(ours, method)() is ours and getattr(theirs, method)() is theirs
    assert {p.dtype for p in ours.parameters()} == {dtype}
    assert {str(p.dtype).split(".")[-1] for p in theirs.parameters()} == {dtype.name}


def test_apply_visits_children_first_as_torch():
    ours, theirs = both(layers)
    seen_ours, seen_theirs = [], []
    assert ours.apply(lambda m: seen_ours.append(type(m).__name__)) is ours
    theirs.apply(lambda m: seen_theirs.append(type(m).__name__))
    assert seen_ours == seen_theirs


def test_inference_mode_as_torchs():
    x, tx = tl.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    with tl.inference_mode(), torch.inference_mode():
        assert not (x * 2).requires_grad and not (tx * 2).requires_grad
    with tl.inference_mode(False), torch.inference_mode(False):
        assert (x * 2).requires_grad and (tx * 2).requires_grad

    @tl.inference_mode()
    def f(a):
        return a * 3
    assert not f(x).requires_grad and (x * 3).requires_grad


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.float16, np.bool_])
def test_from_numpy_keeps_the_dtype_as_torch(dtype):
    a = (np.arange(6).reshape(2, 3) % 2).astype(dtype)
    t, tt = tl.from_numpy(a), torch.from_numpy(a)
    assert t.dtype.name == str(tt.dtype).split(".")[-1] and t.shape == tuple(tt.shape)
    np.testing.assert_array_equal(t.numpy(), a)


def test_from_numpy_takes_an_array_only():
    with pytest.raises(TypeError):
        torch.from_numpy([1, 2])
    with pytest.raises(TypeError, match="from_numpy: expected a numpy.ndarray, got list"):
        tl.from_numpy([1, 2])


def test_nanogpts_configure_optimizers_and_get_num_params_signatures():
    """nanoGPT's train.py calls model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type)
    and model.get_num_params(): both take those arguments here, with nanoGPT's counts."""
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=8, block_size=16, vocab_size=11))
    opt = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), "cpu")
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    total = sum(p.numel() for p in model.parameters())
    assert model.get_num_params(non_embedding=False) == total
    assert model.get_num_params() == total - 16 * 8  # the position embeddings left out, as nanoGPT's


def test_cpu_means_the_fastest_cpu_runtime():
    """torch's device="cpu" (and model.to("cpu")) is the C runtime where it is built, not the NumPy reference,
    which keeps its own name; "cpu:0" as torch writes it."""
    fastest = "c" if tl.runtime.get("c").lib is not None else "numpy"
    assert tl.zeros(2, device="cpu").device == tl.zeros(2, device="cpu:0").device == fastest
    model = nn.Linear(2, 2).to("numpy")
    assert {p.device for p in model.parameters()} == {"numpy"}
    assert {p.device for p in model.to("cpu").parameters()} == {fastest}
