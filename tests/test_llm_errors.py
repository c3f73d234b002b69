"""Clear errors for the LLM layer's common mistakes, each beside what torch, tiktoken or Hugging Face does for the same
one: generate's and forward's arguments, the model configs, sampling, the tokenizer, cross_entropy and attention,
the optimizers, GradScaler, quantize_, device names and TINYLLM_THREADS. (More of the tokenizer's are in
test_tokenizer.py, load_state_dict's in test_nn.py, LoRA's in test_lora.py.)"""
import importlib
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

import tinyllm as tl
from tinyllm import amp, env, nn, optim
from tinyllm.models.gpt import GPT, GPTConfig
from tinyllm.models.llama import Llama, LlamaConfig
from tinyllm.nn import functional as F
from tinyllm.sampling import draw, sample, speculative_accept
from tinyllm.tokenizer import GPT2_PATTERN, InvalidToken, Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def model():
    tl.manual_seed(0)
    return GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=11))


@pytest.fixture(scope="module")
def llama():
    tl.manual_seed(0)
    return Llama(LlamaConfig(vocab_size=11, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8))


@pytest.fixture(scope="module", params=["gpt", "llama"])
def either(request, model, llama):
    return model if request.param == "gpt" else llama


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


# ---- generate and forward: the prompt ------------------------------------------------------------------------------

@pytest.mark.parametrize("idx", [[[1, 2]], np.array([[1, 2]])])
def test_a_prompt_that_is_not_a_tensor_says_how_to_make_one(either, idx):
    """nanoGPT and HF fail on a list with AttributeError ('list' object has no attribute 'size' / 'shape'); a NumPy
    array got here as far as idx.dtype.is_float."""
    name = type(either).__name__
    for call, fn in ((lambda: either.generate(idx, 2), "generate"), (lambda: either(idx), "forward")):
        with pytest.raises(TypeError, match=rf"{name}.{fn}: idx must be a tinyllm Tensor .* got "
                                            rf"{type(idx).__name__}: make it with tinyllm.tensor\(ids\)"):
            call()


@pytest.mark.parametrize("shape, hint", [((2,), r": add the batch axis, idx\[None\]"), ((1, 1, 2), "$")])
def test_a_prompt_of_the_wrong_rank_names_its_shape(either, shape, hint):
    """nanoGPT's `b, t = idx.size()` raised "not enough values to unpack" for a 1-D prompt, as tinyllm's forward did."""
    idx = tl.ones(*shape, dtype=tl.int64)
    name = type(either).__name__
    for call, fn in ((lambda: either.generate(idx, 2), "generate"), (lambda: either(idx), "forward")):
        with pytest.raises(ValueError, match=rf"{name}.{fn}: idx must be \(B, T\) token ids, got shape "
                                             rf"{re.escape(str(shape))}{hint}"):
            call()


def test_an_empty_prompt_is_an_error(either):
    with pytest.raises(ValueError, match=r"generate: idx \(1, 0\) has no tokens"):
        either.generate(tl.zeros(1, 0, dtype=tl.int64), 2)


def test_a_float_prompt_in_forward_names_the_model_not_the_embedding(model):
    with pytest.raises(TypeError, match="GPT.forward: idx must hold integer token ids, got float32"):
        model(tl.tensor([[1.0, 2.0]]))


def test_generate_crops_a_prompt_longer_than_the_context_as_nanogpt(either):
    """Kept: nanoGPT crops to the last block_size tokens (HF's GPT-2 fails on the position embedding instead)."""
    long = tl.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2]])  # 12 > 8 positions
    out = either.generate(long, 3, temperature=0)
    assert out.shape == (1, 15) and out.tolist()[0][:12] == long.tolist()[0]
    assert out.tolist()[0][12:] == either.generate(long[:, -8:], 3, temperature=0).tolist()[0][8:]


def test_generation_past_the_cache_recomputes_the_window(either):
    """Kept: the cache holds max_positions slots; past them each step is a full forward over the last ones, so the
    cached and uncached greedy tokens agree (no overflow, no error)."""
    idx = tl.tensor([[1, 2, 3]])
    cached = either.generate(idx, 9, temperature=0)
    assert cached.shape == (1, 12)
    assert cached.tolist() == either.generate(idx, 9, temperature=0, use_cache=False).tolist()


def test_forward_longer_than_the_context_says_how_to_crop(model, llama):
    with pytest.raises(ValueError, match=r"GPT.forward: idx has 9 tokens, more than block_size 8: crop it to the "
                                         r"last 8 \(idx\[:, -8:\]\), as generate does"):
        model(tl.ones(1, 9, dtype=tl.int64))
    with pytest.raises(ValueError, match="Llama.forward: idx has 9 tokens, more than max_position_embeddings 8"):
        llama(tl.ones(1, 9, dtype=tl.int64))


@pytest.mark.parametrize("shape", [(1, 2), (3,), (1, 3, 1), (3, 1)])
def test_targets_of_another_shape_than_idx_are_refused(either, shape):
    """nanoGPT's loss flattens both (targets.view(-1)), so targets (3,) or transposed ones of the same size were
    taken silently; torch's cross_entropy only sees the flattened sizes ("Expected input batch_size (3) to match
    target batch_size (2)")."""
    name = type(either).__name__
    with pytest.raises(ValueError, match=rf"{name}.forward: targets must be a tensor of idx's shape \(1, 3\) "
                                         rf"\(the next token at each position\), got {re.escape(str(shape))}"):
        either(tl.tensor([[1, 2, 3]]), tl.ones(*shape, dtype=tl.int64))


def test_a_negative_token_id_in_forward_is_an_index_error_as_in_torch(either):
    """It read the embedding's last row instead (tensor indexing wraps negative indices; torch's embedding
    refuses them)."""
    with pytest.raises(IndexError):
        torch.nn.Embedding(11, 4)(torch.tensor([[1, -2]]))
    with pytest.raises(IndexError, match=r"embedding: index -2 is out of range for the 11 rows of the table"):
        either(tl.tensor([[1, -2]]))
    with pytest.raises(IndexError, match=r"embedding: index -1 is out of range"):
        nn.Embedding(11, 4)(tl.tensor([-1]))


def test_a_target_out_of_range_is_named_by_cross_entropy_through_the_models_reshape(either):
    """The models flatten targets before the loss; the check of targets in host memory now sees through that
    reshape, so the message is torch's ("Target 30 is out of bounds") from cross_entropy, not GATHER's, at once."""
    with pytest.raises(IndexError, match="cross_entropy: Target 30 is out of bounds: the logits have 11 classes"):
        either(tl.tensor([[1, 2, 3]]), tl.tensor([[1, 2, 30]]))


# ---- generate: sampling and speculative arguments, checked when it is called ---------------------------------------

def test_sampling_options_are_checked_when_generate_is_called(model):
    """They were checked by the first sample() only: never with max_new_tokens=0, and with stream=True at the first
    next() of the iterator."""
    with pytest.raises(ValueError, match="GPT.generate: temperature must be a finite number >= 0"):
        model.generate(tl.tensor([[1, 2]]), 0, temperature=-1)
    with pytest.raises(ValueError, match=r"GPT.generate: top_k must be a positive int, got 2.0 \(None turns it off\)"):
        model.generate(tl.tensor([[1, 2]]), 2, top_k=2.0, stream=True)


def test_a_torch_generator_is_named_as_such(model):
    with pytest.raises(TypeError, match=r"generator: expected a tinyllm.Generator \(or a numpy.random.Generator\), "
                                        r"got torch._C.Generator: make one with tinyllm.Generator\(\).manual_seed"):
        model.generate(tl.tensor([[1, 2]]), 2, generator=torch.Generator(), stream=True)
    with pytest.raises(TypeError, match="got int: make one"):
        sample(tl.zeros(1, 4), generator=3)


def test_speculative_arguments_are_checked_when_generate_is_called(model):
    other = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=12))
    with pytest.raises(ValueError, match="draft model's vocab_size 12 is not the target's 11"):
        model.generate(tl.tensor([[1, 2]]), 2, draft_model=other, stream=True)
    with pytest.raises(TypeError, match="GPT.generate: draft_model must be a model with generate .* got str"):
        model.generate(tl.tensor([[1, 2]]), 2, draft_model="gpt2")


@pytest.mark.parametrize("k", [0, -1, 2.5, "3"])
def test_num_speculative_tokens_must_be_a_count(model, k):
    """2.5 was taken (and failed in range() once more tokens were asked), "3" failed comparing a str with an int."""
    with pytest.raises(ValueError, match=rf"GPT.generate: num_speculative_tokens must be a positive int, got {k!r}"):
        model.generate(tl.tensor([[1, 2]]), 4, draft_model=model, num_speculative_tokens=k)


# ---- the configs ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [("n_head", 0), ("n_head", -2), ("n_layer", -1), ("vocab_size", 0),
                                          ("block_size", 0), ("n_embd", 8.0), ("vocab_size", "11")])
def test_gpt_config_sizes_must_be_positive_ints(field, value):
    """n_head=0 was a ZeroDivisionError, n_layer=-1 a model with no layers, vocab_size=0 an empty embedding,
    n_embd=8.0 NumPy's "'float' object cannot be interpreted as an integer"."""
    kw = dict(n_layer=1, n_head=2, n_embd=8, block_size=8, vocab_size=11)
    with pytest.raises(ValueError, match=rf"GPTConfig: {field} must be a positive int, got {re.escape(repr(value))}"):
        GPTConfig(**{**kw, field: value})


@pytest.mark.parametrize("field, value", [("num_attention_heads", 0), ("num_key_value_heads", 0),
                                          ("intermediate_size", 0), ("head_dim", 0), ("num_hidden_layers", -1),
                                          ("max_position_embeddings", 0), ("hidden_size", -8)])
def test_llama_config_sizes_must_be_positive_ints(field, value):
    """HF's LlamaConfig(num_attention_heads=0) is a ZeroDivisionError too; tinyllm's was, for the heads and for
    intermediate_size=0 (in the Linear's init)."""
    kw = dict(vocab_size=11, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2)
    with pytest.raises(ValueError, match=rf"LlamaConfig: {field} must be a positive int, got {value}"):
        LlamaConfig(**{**kw, field: value})


@pytest.mark.parametrize("config", [lambda p: GPTConfig(dropout=p), lambda p: LlamaConfig(attention_dropout=p)])
@pytest.mark.parametrize("p", [1.5, -0.1])
def test_a_dropout_outside_0_1_is_refused_when_configured(config, p):
    """Not at the first training step (or never, in eval)."""
    with pytest.raises(ValueError, match=rf"dropout must be a probability in \[0, 1\), got {p}"):
        config(p)


# ---- sampling ------------------------------------------------------------------------------------------------------

def test_draw_names_what_is_wrong_with_its_probabilities():
    with pytest.raises(ValueError, match=r"draw: p must hold probabilities, but its row 1 has a negative value "
                                         r"\(logits\? pass probs\(logits\)\)"):
        draw(np.array([[0.5, 0.5], [-1.0, 2.0]]))
    with pytest.raises(ValueError, match="draw: p must hold probabilities, but its row 0 sums to 0"):
        draw(np.zeros((1, 3)))
    with pytest.raises(ValueError, match=r"speculative_accept: p must hold probabilities, but its row \(0, 1\) has "
                                         "a NaN or inf"):
        speculative_accept(np.array([[[0.5, 0.5], [np.nan, 1.0]]]), np.full((1, 1, 2), 0.5), np.zeros((1, 1), int))


def test_a_draft_token_out_of_range_is_named():
    with pytest.raises(ValueError, match=r"speculative_accept: draft_tokens must be integers in \[0, 2\), got 7"):
        speculative_accept(np.full((1, 2, 2), 0.5), np.full((1, 1, 2), 0.5), np.array([[7]]))


# ---- the tokenizer, beside tiktoken --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def toks():
    """A small trained vocabulary, and tiktoken's Encoding of the same ranks (built offline). tiktoken is skipped
    where it is missing, except in CI, which installs it (test_tokenizer.py's rule)."""
    tiktoken = importlib.import_module("tiktoken") if os.environ.get("CI") else pytest.importorskip("tiktoken")
    ours = Tokenizer.train("hello world, hello there. the cat sat on the mat " * 20, 280)
    ref = tiktoken.Encoding(name="t", pat_str=GPT2_PATTERN, mergeable_ranks=ours._ranks,
                            special_tokens=ours.special_token_ids)
    return ours, ref


@pytest.mark.parametrize("text, fix", [(b"hello", r": decode the bytes first, text.decode\('utf-8'\)"),
                                       (["hello"], ": use encode_batch for a list of texts"), (None, "$")])
def test_encode_of_what_is_not_a_str_is_a_type_error_that_says_what_to_pass(toks, text, fix):
    """tiktoken: TypeError too, "cannot use a string pattern on a bytes-like object" / "expected string or buffer"."""
    ours, ref = toks
    with pytest.raises(TypeError):
        ref.encode(text)
    with pytest.raises(TypeError, match=rf"encode: text must be a str, got {type(text).__name__} .*{fix}"):
        ours.encode(text)
    with pytest.raises(TypeError, match=f"encode_ordinary: text must be a str, got {type(text).__name__}"):
        ours.encode_ordinary(text)


def test_encode_batch_of_one_str_is_refused_not_encoded_letter_by_letter(toks):
    ours, ref = toks
    assert ref.encode_batch("hi") == [[ord("h")], [ord("i")]]  # tiktoken: one text per character
    with pytest.raises(TypeError, match=r"encode_batch: texts takes a list of strings, got str 'hi': write "
                                        r"encode\(text\) for one"):
        ours.encode_batch("hi")
    with pytest.raises(TypeError, match="encode_ordinary_batch: texts takes a list of strings, got str"):
        ours.encode_ordinary_batch("hi")


def test_decoding_an_id_outside_the_vocabulary_is_a_key_error_as_tiktoken_and_an_index_error(toks):
    ours, ref = toks
    with pytest.raises(KeyError):
        ref.decode([10 ** 6])
    for error in (KeyError, IndexError):
        with pytest.raises(error, match=r"^token id 1000000 is not in this tokenizer's vocabulary \(n_vocab=280"):
            ours.decode([1, 10 ** 6])
    assert issubclass(InvalidToken, KeyError) and issubclass(InvalidToken, IndexError)
    with pytest.raises(KeyError, match="token id 1000000"):
        ours.decode_single_token_bytes(10 ** 6)


@pytest.mark.parametrize("ids, message", [("hello", r"decode: ids takes a sequence of token ids, got str 'hello'"),
                                          (None, "decode: ids takes a sequence of token ids, got NoneType"),
                                          (5, "decode: ids takes a sequence of token ids, got int 5"),
                                          ([[1, 2]], "decode: token ids must be ints, got list .*one sequence"),
                                          ([1.5], "decode: token ids must be ints, got float 1.5")])
def test_decoding_what_is_not_a_sequence_of_ids_is_a_type_error_as_tiktoken(toks, ids, message):
    """tinyllm's said "token id 'h' is not in this tokenizer's vocabulary" for a str, "'int' object is not iterable"
    for an int."""
    ours, ref = toks
    with pytest.raises(TypeError):
        ref.decode(ids)
    with pytest.raises(TypeError, match=message):
        ours.decode(ids)


def test_allowed_special_none_is_a_clear_type_error_and_disallowed_none_is_none_as_tiktoken(toks):
    ours, ref = toks
    with pytest.raises(TypeError):
        ref.encode("hi", allowed_special=None)
    with pytest.raises(TypeError, match=r"encode: allowed_special takes 'all' or a set .* got NoneType None: write "
                                        r"allowed_special=set\(\) for none"):
        ours.encode("hi", allowed_special=None)
    text = "hi <|endoftext|>"
    assert ours.encode(text, disallowed_special=None) == ref.encode(text, disallowed_special=None)


def test_a_disallowed_special_token_names_the_set_to_pass(toks):
    """The first sentence is tiktoken's; the fix is the set to write."""
    ours, ref = toks
    with pytest.raises(ValueError) as theirs:
        ref.encode("hi <|endoftext|>")
    first = str(theirs.value).split("\n")[0]
    with pytest.raises(ValueError, match=re.escape(first) + r" Pass allowed_special=\{'<\|endoftext\|>'\}"):
        ours.encode("hi <|endoftext|>")


@pytest.mark.parametrize("kw, error, message", [
    (dict(vocab_size="300"), ValueError, "Tokenizer.train: vocab_size must be a whole number >= 0, got '300'"),
    (dict(vocab_size=300.0), ValueError, "Tokenizer.train: vocab_size must be a whole number >= 0, got 300.0"),
    (dict(text=b"abc abc"), TypeError, r"Tokenizer.train: text must be a str, got bytes .*text.decode"),
    (dict(text=None), TypeError, "Tokenizer.train: text must be a str, got NoneType"),
    (dict(special_tokens="<|endoftext|>"), TypeError,
     r"Tokenizer.train: special_tokens takes a list of texts, got str '<\|endoftext\|>': write \['<\|endoftext\|>'\]"),
])
def test_train_arguments_of_the_wrong_kind(kw, error, message):
    """A str special_tokens was 13 one-character special tokens; bytes or a float vocab_size failed deep inside."""
    with pytest.raises(error, match=message):
        Tokenizer.train(**{**dict(text="abc abc", vocab_size=300), **kw})


@pytest.mark.parametrize("kw, message", [(dict(merges=[(1,)]), r"merge 0 is \(1,\)"),
                                         (dict(merges=[(1, 500)]), r"merge 0 is \(1, 500\): it must be two ids"),
                                         (dict(merges=[], byte_ids=[1, 2]), "byte_ids.* must list 256 ids"),
                                         (dict(merges=[], special_tokens={"<|x|>": "300"}), "special_tokens")])
def test_the_constructor_checks_its_tables_as_load_does(kw, message):
    """They were "not enough values to unpack", "list index out of range", "two merges make the same bytes"."""
    with pytest.raises(ValueError, match=message):
        Tokenizer(**kw)


def test_a_corrupt_encoder_json_is_named(tmp_path):
    bad = tmp_path / "encoder.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=f"{re.escape(str(bad))}: not GPT-2's encoder.json \\(bad JSON"):
        Tokenizer.from_gpt2_files(bad, tmp_path / "vocab.bpe")


# ---- cross_entropy, attention, dropout -----------------------------------------------------------------------------

def test_cross_entropy_arguments_that_are_not_tensors_are_type_errors_as_torch():
    with pytest.raises(TypeError, match="must be Tensor, not list"):
        torch.nn.functional.cross_entropy(torch.zeros(3, 4), [1, 2, 3])
    for target in ([1, 2, 3], np.array([1, 2, 3])):
        with pytest.raises(TypeError, match=f"cross_entropy: logits and target must be tinyllm Tensors, got Tensor "
                                            f"and {type(target).__name__}"):
            F.cross_entropy(tl.zeros(3, 4), target)


@pytest.mark.parametrize("ignore_index", [None, 1.5])
def test_cross_entropy_ignore_index_must_be_an_int_as_torch(ignore_index):
    """None failed deep in Tensor(); 1.5 was taken and matched no target."""
    with pytest.raises(TypeError, match="ignore_index"):
        torch.nn.functional.cross_entropy(torch.zeros(3, 4), torch.tensor([1, 2, 3]), ignore_index=ignore_index)
    with pytest.raises(TypeError, match=f"cross_entropy: ignore_index must be an int .* got {ignore_index}"):
        F.cross_entropy(tl.zeros(3, 4), tl.tensor([1, 2, 3]), ignore_index=ignore_index)


def test_cross_entropy_target_of_another_shape_is_a_value_error_as_torch():
    with pytest.raises(ValueError, match=r"Expected input batch_size \(3\) to match target batch_size \(2\)"):
        torch.nn.functional.cross_entropy(torch.zeros(3, 4), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"cross_entropy: logits \(3, 4\) and target \(2,\) don't fit"):
        F.cross_entropy(tl.zeros(3, 4), tl.tensor([1, 2]))


def test_attention_of_1d_inputs_is_an_error_as_torch():
    """It was an IndexError, "tuple index out of range"."""
    with pytest.raises(RuntimeError, match="at least 2 dimensional"):
        torch.nn.functional.scaled_dot_product_attention(torch.ones(4), torch.ones(4), torch.ones(4))
    with pytest.raises(RuntimeError, match=r"scaled_dot_product_attention: q \(4,\), k \(4,\), v \(4,\) don't fit"):
        F.scaled_dot_product_attention(tl.ones(4), tl.ones(4), tl.ones(4))


def test_an_integer_attention_mask_is_refused_as_torch():
    """It was added to the scores as numbers: a silently wrong attention, not a mask."""
    q = torch.ones(1, 3, 4)
    with pytest.raises(RuntimeError, match="Expected attn_mask dtype to be bool or float"):
        torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(3, 3, dtype=torch.long))
    with pytest.raises(RuntimeError, match="scaled_dot_product_attention: attn_mask must be bool .* or float .*, got "
                                           "int64"):
        F.scaled_dot_product_attention(tl.ones(1, 3, 4), tl.ones(1, 3, 4), tl.ones(1, 3, 4),
                                       attn_mask=tl.ones(3, 3, dtype=tl.int64))


@pytest.mark.parametrize("p", [1.5, -0.1])
def test_dropout_probability_is_checked_when_the_layer_is_built_as_torch(p):
    with pytest.raises(ValueError, match="dropout probability has to be between 0 and 1"):
        torch.nn.Dropout(p)
    with pytest.raises(ValueError, match=f"Dropout: probability has to be between 0 and 1, got {p}"):
        nn.Dropout(p)


# ---- optimizers, GradScaler, devices -------------------------------------------------------------------------------

@pytest.mark.parametrize("lr", ["0.1", None])
def test_a_learning_rate_that_is_not_a_number_is_a_type_error_as_torch(lr):
    """It was taken, and the first step failed."""
    with pytest.raises(TypeError):
        torch.optim.AdamW([torch.zeros(2, requires_grad=True)], lr=lr)
    for cls in (optim.AdamW, optim.SGD):
        with pytest.raises(TypeError, match=f"Invalid learning rate: {lr!r}: lr must be a number"):
            cls([tl.zeros(2, requires_grad=True)], lr=lr)


def test_betas_that_are_not_a_pair():
    """torch: "'float' object is not subscriptable"; tinyllm's "object of type 'float' has no len()"."""
    with pytest.raises(ValueError, match=r"betas must be a pair \(beta1, beta2\), got 0.9"):
        optim.AdamW([tl.zeros(2, requires_grad=True)], betas=0.9)


def test_a_model_given_as_params_says_to_pass_its_parameters(model):
    with pytest.raises(TypeError, match="'Linear' object is not iterable"):
        torch.optim.AdamW(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match=r"AdamW: params must be .* got a GPT model: pass model.parameters\(\)"):
        optim.AdamW(model)


def test_a_param_groups_own_options_are_checked_too():
    """torch checks the defaults only, and steps uphill with a group's lr=-1."""
    torch.optim.AdamW([{"params": [torch.zeros(2, requires_grad=True)], "lr": -1.0}])
    with pytest.raises(ValueError, match="Invalid learning rate: -1.0"):
        optim.AdamW([{"params": [tl.zeros(2, requires_grad=True)], "lr": -1.0}])
    with pytest.raises(ValueError, match="Invalid momentum value: -0.9"):
        optim.SGD([{"params": [tl.zeros(2, requires_grad=True)], "momentum": -0.9}], lr=0.1)


@pytest.mark.parametrize("kw, message", [(dict(init_scale=0.0), "init_scale must be a finite number > 0, got 0.0"),
                                         (dict(init_scale=-1.0), "init_scale must be a finite number > 0"),
                                         (dict(init_scale=float("inf")), "init_scale must be a finite number > 0"),
                                         (dict(backoff_factor=0.0), r"backoff_factor must be in \(0, 1\), got 0.0"),
                                         (dict(growth_interval=0), "growth_interval must be a positive int, got 0"),
                                         (dict(growth_interval=2.5), "growth_interval must be a positive int")])
def test_grad_scaler_settings_torch_takes_silently(kw, message):
    """torch takes these: a scale of 0 makes every gradient 0 and unscales it to NaN, a backoff of 0 does so after
    the first inf, and a growth_interval of 0 or 2.5 is never reached (the scale never grows)."""
    torch.amp.GradScaler("cpu", **kw)
    with pytest.raises(ValueError, match=f"GradScaler: {message}"):
        amp.GradScaler(**kw)


@pytest.mark.parametrize("device", ["cuda", "gpu"])
def test_an_unknown_device_names_the_runtimes_and_the_gpus(model, device):
    """torch: RuntimeError "Expected one of cpu, cuda, ... device type at start of device string: gpu"."""
    with pytest.raises(ValueError, match=rf"unknown runtime '{device}': choose one of c, numpy, wgsl or 'cpu' .*"
                                         "'wgsl' is the GPU's, through WebGPU"):
        model.to(device)
