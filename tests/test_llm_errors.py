"""Clear errors for the LLM layer's common mistakes, each beside what torch does for the same one: a negative
max_new_tokens, float or out-of-range prompt ids, quantize_ of a model without Linear layers, a TINYLLM_THREADS
that is not a number. (The tokenizer's are in test_tokenizer.py, load_state_dict's in test_nn.py.)"""
import os
import subprocess
import sys

import pytest
import torch

import tinyllm as tl
from tinyllm import env, nn
from tinyllm.models.gpt import GPT, GPTConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def model():
    tl.manual_seed(0)
    return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=11))


@pytest.mark.parametrize("n", [-1, 2.5, True, "3"])
def test_generate_refuses_a_max_new_tokens_that_is_not_a_count(model, n):
    with pytest.raises(ValueError, match=rf"GPT.generate: max_new_tokens must be a whole number >= 0, got {n!r}"):
        model.generate(tl.tensor([[1, 2]]), n)


def test_generate_refuses_float_prompts_instead_of_truncating_them(model):
    with pytest.raises(TypeError, match="idx must hold integer token ids, got float32"):
        model.generate(tl.tensor([[1.7, 2.2]]), 2)


@pytest.mark.parametrize("bad", [-1, 11])
def test_generate_refuses_ids_outside_the_vocabulary_as_torch_embedding_does(model, bad):
    """torch's embedding raises IndexError for an id outside [0, vocab); tinyllm's did not for a negative one (it
    wrapped to the last entry). Both raise IndexError, tinyllm's naming the id and the range."""
    with pytest.raises(IndexError):
        torch.nn.Embedding(11, 4)(torch.tensor([[1, bad]]))
    with pytest.raises(IndexError, match=rf"token id {bad} is out of range for the vocabulary of 11 tokens"):
        model.generate(tl.tensor([[1, bad]]), 2)


def test_generate_still_takes_zero_new_tokens(model):
    assert model.generate(tl.tensor([[1, 2]]), 0).tolist() == [[1, 2]]


def test_quantize_a_model_without_linear_layers_is_an_error():
    with pytest.raises(ValueError, match="quantize_: Sequential has no nn.Linear layer to quantize"):
        tl.quantize_(nn.Sequential(nn.ReLU(), nn.GELU()), "int8")


def test_quantize_a_model_whose_only_linear_is_tied_names_embedding_true():
    class Tied(nn.Module):
        def __init__(self):
            self.wte = nn.Embedding(64, 32)
            self.head = nn.Linear(32, 64, bias=False)
            self.head.weight = self.wte.weight
    with pytest.raises(ValueError, match="embedding=True"):
        tl.quantize_(Tied(), "int8")


@pytest.mark.parametrize("value, want", [("", 0), ("0", 0), ("2", 2), (" 3 ", 3)])
def test_tinyllm_threads_reads_a_count(monkeypatch, value, want):
    monkeypatch.setenv("TINYLLM_THREADS", value)
    assert env.threads() == want


@pytest.mark.parametrize("value", ["two", "-1", "1.5"])
def test_tinyllm_threads_that_is_not_a_count_is_a_clear_error(monkeypatch, value):
    monkeypatch.setenv("TINYLLM_THREADS", value)
    with pytest.raises(ValueError, match=rf"TINYLLM_THREADS={value!r}: give a whole number of threads"):
        env.threads()


def test_tinyllm_threads_error_reaches_the_user_without_a_bare_int_error():
    """What a user sees: the C runtime's first use names the variable, not `invalid literal for int()`."""
    code = "import tinyllm as tl; print(tl.ones(2, device='c').sum().item())"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TINYLLM_THREADS": "two", "PYTHONPATH": ROOT})
    assert proc.returncode != 0 and "TINYLLM_THREADS='two': give a whole number" in proc.stderr, proc.stderr
    assert "invalid literal" not in proc.stderr


def test_a_missing_nanogpt_checkpoint_says_so(tmp_path):
    """Not torch.load's advice about weights_only: the file is not there."""
    missing = tmp_path / "out" / "ckpt.pt"
    with pytest.raises(FileNotFoundError, match=f"no file {missing}"):
        GPT.from_nanogpt_checkpoint(missing)
