"""tinyllm.save / tinyllm.load (torch's names, safetensors files underneath) and the checkpoint directories of
GPT.from_pretrained / Llama.from_pretrained / model.save_pretrained: round trips (tinyllm's and torch's state
dicts, an optimizer's nested one), the file format read byte by byte as the safetensors spec lays it out, files
written before, and the errors."""
import io
import json
import math
import os
import struct

import numpy as np
import pytest
import torch

import tinyllm as tl
from tinyllm import nn, optim
from tinyllm.models import AutoModelForCausalLM, CheckpointError, GPT, GPTConfig, Llama, LlamaConfig
from tinyllm.models import pretrained
from tinyllm.utils import safetensors as S

from helpers import reference_runtime  # noqa: F401  (the module runs on the NumPy runtime)

GPT_CONFIG = dict(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8)
LLAMA_CONFIG = dict(vocab_size=11, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=1, max_position_embeddings=8)
CHARS = {"kind": "char", "vocab": "abcdefghijk"}  # a tokenizer record of 11 characters


def spec_read(path):
    """(header, metadata, data) of a safetensors file read as the spec lays it out: a little-endian u64 length n,
    n bytes of JSON (space-padded to a multiple of 8, as the package writes it), then the data."""
    blob = open(path, "rb").read()
    (n,) = struct.unpack("<Q", blob[:8])
    assert n % 8 == 0 and 8 + n <= len(blob)
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    return header, header.pop("__metadata__", {}), blob[8 + n:]


def arrays(state):
    return {k: np.array(v.numpy() if isinstance(v, tl.Tensor) else v) for k, v in state.items()}


# ---- tinyllm.save / tinyllm.load ---------------------------------------------------------------------------
def test_a_state_dict_round_trips_in_order(tmp_path):
    tl.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    tl.save(model.state_dict(), tmp_path / "m.safetensors")
    loaded = tl.load(tmp_path / "m.safetensors")
    assert list(loaded) == list(model.state_dict())  # the state dict's order, not the file's (by dtype, then name)
    assert all(isinstance(v, tl.Tensor) for v in loaded.values())
    tl.manual_seed(1)
    other = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    other.load_state_dict(loaded)
    for k, v in arrays(model.state_dict()).items():
        np.testing.assert_array_equal(other.state_dict()[k].numpy(), v, err_msg=k)
    assert os.listdir(tmp_path) == ["m.safetensors"]  # written atomically: no temporary file left


def test_the_file_is_a_safetensors_file_by_the_spec(tmp_path):
    """Read with nothing but struct and json: every tensor under its state dict name, its dtype, shape and bytes
    (row-major, little-endian) where data_offsets say, the data without gaps; the structure in the metadata."""
    model = nn.Sequential(nn.Linear(3, 2), nn.Embedding(5, 2))
    state = arrays(model.state_dict())
    state["steps"] = np.arange(3, dtype=np.int64)
    tl.save({**model.state_dict(), "steps": tl.tensor(state["steps"])}, tmp_path / "m.safetensors")
    header, metadata, data = spec_read(tmp_path / "m.safetensors")
    assert set(header) == set(state)
    ends = sorted(e["data_offsets"] for e in header.values())
    assert ends[0][0] == 0 and all(a[1] == b[0] for a, b in zip(ends, ends[1:])) and ends[-1][1] == len(data)
    for name, want in state.items():
        e = header[name]
        assert e["dtype"] == {"float32": "F32", "int64": "I64"}[want.dtype.name] and e["shape"] == list(want.shape)
        begin, end = e["data_offsets"]
        np.testing.assert_array_equal(np.frombuffer(data[begin:end], want.dtype.newbyteorder("<")).reshape(want.shape),
                                      want)
    assert set(metadata) == {"tinyllm.structure"} and all(isinstance(v, str) for v in metadata.values())


def test_a_torch_state_dict_round_trips(tmp_path):
    """torch's tensors (an int64 buffer and bfloat16 among them) are saved as they are and come back equal: into
    torch again, and into tinyllm's nanoGPT-named model."""
    torch.manual_seed(0)
    tmodel = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    tmodel(torch.randn(8, 3))  # moves the running statistics off their start
    sd = tmodel.state_dict()
    tl.save({**sd, "half": torch.ones(2, dtype=torch.bfloat16) / 3}, tmp_path / "t.safetensors")
    loaded = tl.load(tmp_path / "t.safetensors")
    assert loaded["1.num_batches_tracked"].dtype is tl.int64 and loaded["half"].dtype is tl.bfloat16
    np.testing.assert_array_equal(loaded["half"].numpy(), (torch.ones(2, dtype=torch.bfloat16) / 3).float().numpy())
    back = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    back.load_state_dict({k: torch.from_numpy(np.array(v.numpy())) for k, v in loaded.items() if k != "half"})
    for k, v in sd.items():
        assert torch.equal(back.state_dict()[k], v), k

    gpt = GPT(GPTConfig(**GPT_CONFIG))
    tsd = {k: torch.from_numpy(np.array(v.numpy())) * 2 for k, v in gpt.state_dict().items()}
    tl.save(tsd, tmp_path / "gpt.safetensors")
    gpt.load_state_dict(tl.load(tmp_path / "gpt.safetensors"))
    for k, v in gpt.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), tsd[k].numpy(), err_msg=k)


def adamw_steps(opt, params, steps, seed):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        for p in params:
            p.grad = tl.tensor(rng.standard_normal(p.shape).astype(np.float32))
        opt.step()


def test_an_optimizer_state_dict_round_trips_and_training_goes_on_the_same(tmp_path):
    """The nested state dict comes back with its int keys, tuples and numbers, and an optimizer loaded from it
    continues exactly as the one that saved it."""
    def make():
        params = [nn.Parameter(np.full((3, 2), 0.5, np.float32)), nn.Parameter(np.ones(4, np.float32))]
        return params, optim.AdamW([{"params": params[:1]}, {"params": params[1:], "weight_decay": 0.0}], lr=0.1)
    params, opt = make()
    adamw_steps(opt, params, 3, seed=0)
    tl.save({"optimizer": opt.state_dict(), "params": [p.detach() for p in params], "step": 3},
            tmp_path / "ckpt.safetensors")
    ckpt = tl.load(tmp_path / "ckpt.safetensors")
    sd = ckpt["optimizer"]
    assert ckpt["step"] == 3 and sorted(sd["state"]) == [0, 1]
    assert sd["param_groups"] == [{"lr": 0.1, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01, "params": [0]},
                                  {"lr": 0.1, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "params": [1]}]
    assert sd["state"][0]["step"].dtype is tl.float32 and sd["state"][0]["step"].item() == 3.0
    params2, opt2 = make()
    for p2, p in zip(params2, ckpt["params"]):
        p2.copy_(p)
    opt2.load_state_dict(sd)
    adamw_steps(opt, params, 2, seed=1)
    adamw_steps(opt2, params2, 2, seed=1)
    for p, p2 in zip(params, params2):
        np.testing.assert_array_equal(p.numpy(), p2.numpy())


def test_nested_structure_and_plain_values_round_trip():
    obj = {"a": {0: tl.ones(2), "x": [1, 2.5, None, True, "s", (tl.zeros(1, dtype=tl.int64), -0.0)]},
           "inf": math.inf, "np": np.float32(0.25), "empty": {}, "nested": [[]]}
    f = io.BytesIO()
    tl.save(obj, f)  # a file object, as torch.save takes one
    got = tl.load(io.BytesIO(f.getvalue()))
    assert list(got) == ["a", "inf", "np", "empty", "nested"] and list(got["a"]) == [0, "x"]
    assert got["a"][0].numpy().tolist() == [1.0, 1.0]
    x = got["a"]["x"]
    assert x[:5] == [1, 2.5, None, True, "s"] and isinstance(x[5], tuple) and x[5][0].dtype is tl.int64
    assert math.copysign(1, x[5][1]) == -1 and got["inf"] == math.inf and got["np"] == 0.25
    assert got["empty"] == {} and got["nested"] == [[]]


@pytest.mark.parametrize("device", ["numpy", "cpu"])
def test_map_location_puts_the_tensors_on_a_device(tmp_path, device):
    tl.save({"w": tl.ones(3), "b": tl.ones(2).bfloat16()}, tmp_path / "w.safetensors")
    got = tl.load(tmp_path / "w.safetensors", map_location=device, weights_only=True)
    want = tl.runtime.get(device).name
    assert {t.device for t in got.values()} == {want} and got["b"].dtype is tl.bfloat16
    assert tl.load(tmp_path / "w.safetensors", map_location=torch.device("cpu"))["w"].device == tl.runtime.get("cpu").name


def test_any_safetensors_file_loads_as_a_flat_dict(tmp_path):
    """A file tinyllm.save did not write (no structure in its metadata, as a Hugging Face model.safetensors)."""
    S.save_file({"b": np.ones(2, np.float16), "a": np.arange(3)}, tmp_path / "hf.safetensors", metadata={"format": "pt"})
    got = tl.load(tmp_path / "hf.safetensors")
    assert sorted(got) == ["a", "b"] and got["b"].dtype is tl.float16 and got["a"].dtype is tl.int64


def test_complex_tensors_and_parameters_round_trip(tmp_path):
    """complex64 tensors as safetensors' C64 (interleaved float32 re, im), back as complex tensors; a module's
    complex Parameter through state_dict / load_state_dict, tinyllm's and torch's; the package reads the file."""
    from safetensors.torch import load_file, save_file
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((3, 4)) + 1j * rng.standard_normal((3, 4))).astype(np.complex64)
    tl.save({"z": tl.tensor(a), "w": tl.ones(2), "nested": [tl.tensor(a[0])]}, tmp_path / "z.safetensors")
    header, _, _ = spec_read(tmp_path / "z.safetensors")
    assert header["z"]["dtype"] == "C64" and header["z"]["shape"] == [3, 4]
    got = tl.load(tmp_path / "z.safetensors")
    assert got["z"].dtype is tl.complex64 and got["z"].is_complex() and got["nested"][0].is_complex()
    np.testing.assert_array_equal(got["z"].numpy(), a)
    np.testing.assert_array_equal(load_file(tmp_path / "z.safetensors")["z"].numpy(), a)
    save_file({"z": torch.tensor(a)}, tmp_path / "t.safetensors")
    np.testing.assert_array_equal(tl.load(tmp_path / "t.safetensors")["z"].numpy(), a)

    class Model(nn.Module):
        def __init__(self, lib):
            self.lin, self.c = lib.nn.Linear(2, 2), lib.nn.Parameter(lib.tensor(a))

    class TorchModel(torch.nn.Module, Model):
        def __init__(self):
            torch.nn.Module.__init__(self)
            Model.__init__(self, torch)

    model = Model(tl)
    assert isinstance(model.c, nn.Parameter) and model.c.is_complex() and model.c.requires_grad and model.c.is_leaf
    assert [n for n, _ in model.named_parameters()] == ["c", "lin.weight", "lin.bias"]
    (model.c * model.c).abs().sum().backward()
    assert model.c.grad.dtype is tl.complex64
    tl.save(model.state_dict(), tmp_path / "m.safetensors")
    other = Model(tl)
    with tl.no_grad():
        other.c.zero_()
    other.load_state_dict(tl.load(tmp_path / "m.safetensors"))
    np.testing.assert_array_equal(other.c.detach().numpy(), a)
    theirs = TorchModel()
    theirs.load_state_dict(load_file(tmp_path / "m.safetensors"))
    np.testing.assert_array_equal(theirs.c.detach().numpy(), a)
    with torch.no_grad():
        theirs.c.mul_(2j)
    other.load_state_dict(theirs.state_dict())
    np.testing.assert_array_equal(other.c.detach().numpy(), a * 2j)
    with pytest.raises(TypeError, match="complex128, which safetensors has no dtype for"):
        tl.save({"z": tl.tensor(a.astype(np.complex128))}, tmp_path / "x.safetensors")


@pytest.mark.parametrize("obj, error, words", [
    (None, TypeError, ["got a NoneType", "dict of name -> tensor", "optimizer.state_dict()"]),
    ([np.ones(2)], TypeError, ["got a list", "{'name': tensor}"]),
    ({"w": np.ones(2, np.int32)}, TypeError, ["obj['w']", "int32", ".astype"]),
    ({"w": {"x": object()}}, TypeError, ["obj['w']['x']", "object"]),
    ({(1, 2): np.ones(2)}, TypeError, ["(1, 2)", "str or int"]),
    ({"a.b": np.ones(1), "a": {"b": np.ones(1)}}, ValueError, ["'a.b'", "obj['a']['b']", "rename"]),
])
def test_save_refuses_what_it_cannot_store(tmp_path, obj, error, words):
    with pytest.raises(error) as e:
        tl.save(obj, tmp_path / "x.safetensors")
    assert "tinyllm.save" in str(e.value) and all(w in str(e.value) for w in words), str(e.value)
    assert not os.listdir(tmp_path)


def test_load_errors_name_the_file_and_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="tinyllm.load: no such file: .*nope.safetensors"):
        tl.load(tmp_path / "nope.safetensors")
    with pytest.raises(IsADirectoryError, match="is a directory"):
        tl.load(tmp_path)
    torch.save({"w": torch.ones(2)}, tmp_path / "model.pt")
    with pytest.raises(ValueError) as e:
        tl.load(tmp_path / "model.pt")
    for words in ("model.pt", "torch pickle", "not a safetensors file", "torch.load", "tinyllm.save"):
        assert words in str(e.value), str(e.value)
    (tmp_path / "cut.safetensors").write_bytes((tmp_path / "model.pt").read_bytes()[:3])
    with pytest.raises(S.SafetensorsError, match="tinyllm.load: .*cut.safetensors.*truncated"):
        tl.load(tmp_path / "cut.safetensors")
    tl.save({"w": tl.ones(1)}, tmp_path / "w.safetensors")
    with pytest.raises(TypeError, match="map_location must be a device string"):
        tl.load(tmp_path / "w.safetensors", map_location={"cuda:0": "cpu"})
    with pytest.raises(ValueError, match="map_location='tpu'"):
        tl.load(tmp_path / "w.safetensors", map_location="tpu")


# ---- checkpoint directories: from_pretrained / save_pretrained -------------------------------------------------
def make(kind, seed=0):
    tl.manual_seed(seed)
    return GPT(GPTConfig(**GPT_CONFIG)) if kind == "gpt" else Llama(LlamaConfig(**LLAMA_CONFIG))


@pytest.mark.parametrize("kind", ["gpt", "llama"])
def test_save_pretrained_then_from_pretrained_is_the_same_model(tmp_path, kind):
    model = make(kind)
    path = model.save_pretrained(tmp_path / "ckpt", tokenizer=CHARS)
    assert path == os.path.join(tmp_path, "ckpt", "ckpt.safetensors") and os.listdir(tmp_path / "ckpt") == [
        "ckpt.safetensors"]
    cls = type(model)
    loaded = cls.from_pretrained(tmp_path / "ckpt")
    assert type(loaded) is cls and not loaded.training and loaded.config == model.config
    assert loaded.tokenizer_record == CHARS and loaded.name_or_path == str(tmp_path / "ckpt")
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(loaded.state_dict()[k].numpy(), v.numpy(), err_msg=k)
    idx = tl.tensor(np.array([[1, 2, 3]]))
    model.eval()
    np.testing.assert_array_equal(loaded(idx)[0].numpy(), model(idx)[0].numpy())
    auto = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", device="numpy", dtype=tl.float64)
    assert type(auto) is cls and next(auto.parameters()).dtype is tl.float64
    assert cls.from_pretrained(path).config == model.config  # the file itself names the checkpoint too
    assert cls.from_pretrained(tmp_path / "ckpt", **{"dropout" if kind == "gpt" else "attention_dropout": 0.1}) \
        .config != model.config


def test_the_format_is_examples_gpt_pys(tmp_path):
    """The tensors under model.NAME (tied weights under both names), optimizer moments under optim.NAME, and the
    metadata gpt.py writes; written with an optimizer, its state restores into another through load_state_dict."""
    model = make("gpt")
    opt = model.configure_optimizers(0.1, 1e-2)
    params = list(model.parameters())
    adamw_steps(opt, params, 2, seed=0)
    model.save_pretrained(tmp_path, tokenizer=CHARS, optimizer=opt, step=2)
    header, metadata, _ = spec_read(tmp_path / "ckpt.safetensors")
    names = dict(model.named_parameters())
    assert set(header) == {f"model.{k}" for k in model.state_dict()} | {
        f"optim.{n}.{m}" for n in names for m in ("exp_avg", "exp_avg_sq")}
    assert "model.lm_head.weight" in header and "model.transformer.wte.weight" in header
    assert metadata["format"] == "tinyllm-gpt/2" and metadata["model"] == "gpt" and metadata["step"] == "2"
    assert json.loads(metadata["config"]) == {**GPT_CONFIG, "dropout": 0.0, "bias": True, "checkpoint": False,
                                              "gelu": "exact"}
    assert json.loads(metadata["adam_steps"]) == {n: 2 for n in names}
    assert json.loads(metadata["tokenizer"]) == CHARS
    ckpt = pretrained.read_checkpoint(tmp_path / "ckpt.safetensors")
    model2 = make("gpt", seed=1)
    opt2 = model2.configure_optimizers(0.1, 1e-2)
    model2.load_state_dict({k[6:]: v for k, v in ckpt["tensors"].items() if k.startswith("model.")})
    pretrained.restore_optimizer(opt2, model2, ckpt["tensors"], ckpt["adam_steps"])
    adamw_steps(opt, params, 2, seed=1)
    adamw_steps(opt2, list(model2.parameters()), 2, seed=1)
    for p, p2 in zip(params, model2.parameters()):
        np.testing.assert_array_equal(p.numpy(), p2.numpy())


def test_checkpoints_written_before_still_load(tmp_path):
    """A file as examples/gpt.py wrote it before the library did (through the safetensors package: the same bytes
    but for the order of the metadata keys), and one of the first format (tinyllm-char-gpt/1: the vocabulary in
    "vocab", GPT-2's tanh GELU before GPTConfig had a gelu field)."""
    model = make("gpt")
    tensors = {f"model.{k}": np.ascontiguousarray(v.numpy()) for k, v in model.state_dict().items()}
    config = dict(GPT_CONFIG, dropout=0.0, bias=True, checkpoint=False)
    old = {"format": "tinyllm-gpt/2", "step": "7", "config": json.dumps({**config, "gelu": "exact"}),
           "tokenizer": json.dumps(CHARS), "adam_steps": "{}", "args": "{}", "val_loss": "1.5",
           "rng": json.dumps({"data": np.random.default_rng(0).bit_generator.state,
                              "tinyllm": np.random.default_rng(1).bit_generator.state})}
    S.save_file(tensors, tmp_path / "v2" / "ckpt.safetensors", metadata=old)
    loaded = GPT.from_pretrained(tmp_path / "v2")
    assert loaded.config.gelu == "exact" and pretrained.read_checkpoint(tmp_path / "v2" / "ckpt.safetensors")["step"] == 7
    np.testing.assert_array_equal(loaded.lm_head.weight.numpy(), model.lm_head.weight.numpy())
    first = {k: v for k, v in old.items() if k not in ("tokenizer", "model")}
    first.update(format="tinyllm-char-gpt/1", vocab=json.dumps(CHARS["vocab"]), config=json.dumps(config))
    S.save_file(tensors, tmp_path / "v1" / "ckpt.safetensors", metadata=first)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "v1")
    assert type(loaded) is GPT and loaded.config.gelu == "tanh" and loaded.tokenizer_record == CHARS


def test_a_loaded_model_saves_with_its_tokenizer(tmp_path):
    """from_pretrained then save_pretrained without a tokenizer keeps the directory's: the record, and a BPE's
    tokenizer.json copied beside the new file (the record holds its sha256)."""
    from tinyllm.tokenizer import Tokenizer
    tok = Tokenizer.train("the quick brown fox jumps over the lazy dog " * 20, 260)
    model = GPT(GPTConfig(**{**GPT_CONFIG, "vocab_size": tok.n_vocab}))
    model.save_pretrained(tmp_path / "a", tokenizer=tok)
    assert sorted(os.listdir(tmp_path / "a")) == ["ckpt.safetensors", "tokenizer.json"]
    record = GPT.from_pretrained(tmp_path / "a").tokenizer_record
    assert record == {"kind": "bpe", "file": "tokenizer.json", "sha256": pretrained.file_sha256(tmp_path / "a" /
                                                                                                  "tokenizer.json")}
    GPT.from_pretrained(tmp_path / "a").save_pretrained(tmp_path / "b")
    assert (tmp_path / "b" / "tokenizer.json").read_bytes() == (tmp_path / "a" / "tokenizer.json").read_bytes()
    assert GPT.from_pretrained(tmp_path / "b").tokenizer_record == record


def test_from_pretrained_errors(tmp_path):
    make("llama").save_pretrained(tmp_path / "llama")
    with pytest.raises(CheckpointError) as e:
        GPT.from_pretrained(tmp_path / "llama")
    assert "GPT.from_pretrained" in str(e.value) and "use Llama.from_pretrained" in str(e.value)
    make("gpt").save_pretrained(tmp_path / "gpt")
    with pytest.raises(CheckpointError, match="use GPT.from_pretrained"):
        Llama.from_pretrained(tmp_path / "gpt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError) as e:
        GPT.from_pretrained(tmp_path / "empty")
    assert str(tmp_path / "empty") in str(e.value) and "has no ckpt.safetensors" in str(e.value)
    with pytest.raises(FileNotFoundError, match="no directory 'gpt2'.*GPT.from_nanogpt_checkpoint"):
        GPT.from_pretrained("gpt2")
    with pytest.raises(FileNotFoundError, match="Llama.from_hf"):
        Llama.from_pretrained(tmp_path / "nope")
    with pytest.raises(TypeError, match="unexpected keyword argument.*'n_layers'.*n_layer"):
        GPT.from_pretrained(tmp_path / "gpt", n_layers=2)
    path = tmp_path / "gpt" / "ckpt.safetensors"
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(CheckpointError, match=f"GPT.from_pretrained: {path}: .*truncated"):
        GPT.from_pretrained(tmp_path / "gpt")
    tl.save({"w": tl.ones(1)}, tmp_path / "sd" / "ckpt.safetensors")
    with pytest.raises(CheckpointError, match="no format tinyllm-gpt.*tinyllm.load"):
        GPT.from_pretrained(tmp_path / "sd")
    with pytest.raises(NotADirectoryError, match="is a file"):
        make("gpt").save_pretrained(path)
    with pytest.raises(TypeError, match="tokenizer must be"):
        make("gpt").save_pretrained(tmp_path / "t", tokenizer=42)
