"""Checkpoint directories, with Hugging Face's names: `GPT.from_pretrained(dir)`, `Llama.from_pretrained(dir)`,
`AutoModelForCausalLM.from_pretrained(dir)` (whichever model the directory holds) and `model.save_pretrained(dir)`.

A checkpoint directory is what examples/gpt.py writes as its --ckpt-dir and examples/sample.py reads: one
safetensors file, ckpt.safetensors, holding
    model.NAME                      every tensor of the model's state_dict() (tied weights under each name)
    optim.NAME.exp_avg, .exp_avg_sq AdamW's moments of parameter NAME, when the optimizer was saved too
and in its metadata (str -> str, JSON values)
    format      "tinyllm-gpt/2" ("tinyllm-char-gpt/1", character GPTs with GPT-2's tanh GELU, is still read)
    model       the model type, "gpt" or "llama" (the class's `model_type`; "gpt" where missing)
    config      the config's fields
    step        the training step; adam_steps: parameter name -> AdamW's step count
    tokenizer   how to rebuild the tokenizer (a record tokenizer_record makes: the characters of a char
                tokenizer, GPT-2's, or a BPE saved beside the file as tokenizer.json with its sha256)
and whatever else the writer adds (examples/gpt.py: its flags, the validation loss, the generators' states, the
loss scaler's state). Every file is written atomically and every file read is checked, so that a bad one is a
CheckpointError naming the file and what is wrong with it before anything is built.
"""
import dataclasses
import hashlib
import json
import os

import numpy as np

from .. import dtype as dt
from ..utils import safetensors as st
from ..utils.files import atomic_write
from ..utils.serialization import looks_like_pickle

CKPT_NAME = "ckpt.safetensors"
TOKENIZER_FILE = "tokenizer.json"  # a trained BPE, beside the checkpoint file
FORMAT = "tinyllm-gpt/2"
OLD_FORMAT = "tinyllm-char-gpt/1"  # character-level GPTs only, the vocabulary in "vocab"; still read
MODEL_TYPES = {}  # model_type -> class, filled as the classes are defined (tinyllm.models imports them all)


class CheckpointError(ValueError):
    """A checkpoint file that cannot be loaded: the message names the file and what is wrong with it."""
    def __init__(self, path, problem, where=None):
        self.path, self.problem = path, problem
        super().__init__(f"{where + ': ' if where else ''}{path}: {problem}")


class Checkpoint(dict):
    """A checkpoint file read and checked (read_checkpoint): model (its model type), config (the config's fields),
    step, adam_steps, tokenizer (the record, or None), tensors (name -> NumPy array, BF16 as float32) and
    metadata (str -> str, as in the file, an old format's brought up to date); `path` is the file."""

    def __init__(self, path, metadata, tensors):
        super().__init__(tensors=tensors, metadata=metadata)
        self.path = path

    def field(self, key, parse=json.loads, check=lambda v: True, default=None):
        """The metadata entry `key` parsed, or a CheckpointError saying it is missing (when there is no default)
        or does not pass `check`."""
        raw = self["metadata"].get(key, default)
        if raw is None:
            raise CheckpointError(self.path, f"its metadata has no {key!r} (corrupt?)")
        try:
            value = parse(raw)
        except ValueError as e:
            raise CheckpointError(self.path, f"its metadata {key!r} is not valid ({e})") from None
        if not check(value):
            raise CheckpointError(self.path, f"its metadata {key!r} is not valid: {raw[:200]}")
        return value


def read_checkpoint(path):
    """The checkpoint file at `path` as a Checkpoint, with everything checked that can be without building the
    model (check_tensors does the rest): a CheckpointError otherwise."""
    if not os.path.exists(path):
        raise CheckpointError(path, "no such file")
    if not os.path.isfile(path):
        raise CheckpointError(path, "not a file")
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise CheckpointError(path, e.strerror or str(e)) from None
    try:
        arrays, kinds, metadata = st.deserialize_all(blob, path)
    except st.SafetensorsError as e:
        if looks_like_pickle(blob):
            raise CheckpointError(path, "a torch pickle, not a safetensors checkpoint file (nanoGPT's ckpt.pt loads "
                                        "with GPT.from_nanogpt_checkpoint)") from None
        problem = str(e).removeprefix(f"{path}: ")
        raise CheckpointError(path, problem if "safetensors" in problem else
                              f"not a valid safetensors file ({problem})") from None
    tensors = {k: dt.decode(a, dt.bfloat16) if kinds[k] == "BF16" else a for k, a in arrays.items()}
    fmt = metadata.get("format", "")
    if not fmt.startswith(("tinyllm-gpt/", "tinyllm-char-gpt/")):
        raise CheckpointError(path, "not a checkpoint file written by examples/gpt.py or save_pretrained (its "
                                    "metadata has no format tinyllm-gpt); a state dict saved with tinyllm.save loads "
                                    "with model.load_state_dict(tinyllm.load(path))")
    if fmt not in (FORMAT, OLD_FORMAT):
        raise CheckpointError(path, f"format {fmt}, but this tinyllm reads {FORMAT} and {OLD_FORMAT}: a newer "
                                    "version wrote it")
    if fmt == OLD_FORMAT:  # its vocabulary was the tokenizer, and its GELU the tanh form (GPTConfig's old default)
        metadata["tokenizer"] = json.dumps({"kind": "char", "vocab": json.loads(metadata.get("vocab", "null"))})
        config = json.loads(metadata.get("config", "null"))
        if isinstance(config, dict):
            metadata["config"] = json.dumps({"gelu": "tanh", **config})
    ckpt = Checkpoint(path, metadata, tensors)
    ckpt["model"] = kind = ckpt.field("model", str, lambda v: v in MODEL_TYPES, default="gpt")  # (before Llama: GPTs)
    ckpt["config"] = ckpt.field("config")
    problem = config_problem(MODEL_TYPES[kind].config_class, ckpt["config"])
    if problem is not None:
        raise CheckpointError(path, f"its metadata 'config' is not a valid {MODEL_TYPES[kind].config_class.__name__}: "
                                    f"{problem}")
    ckpt["step"] = ckpt.field("step", int, lambda v: v >= 0)
    ckpt["adam_steps"] = ckpt.field("adam_steps", default="{}", check=lambda v: isinstance(v, dict) and all(
        isinstance(n, int) and n >= 0 for n in v.values()))
    ckpt["tokenizer"] = ckpt.field("tokenizer", default="null")
    return ckpt


def config_problem(config_class, fields):
    """Why `fields` (a dict) are not a valid config of `config_class`, or None: unknown names, sizes (the fields
    whose default is an int) that are not whole numbers >= 1, a dropout outside [0, 1), or the config's own
    checks (heads dividing the width, ...)."""
    if not isinstance(fields, dict):
        return "not a dict"
    known = {f.name: f for f in dataclasses.fields(config_class)}
    unknown = sorted(set(fields) - set(known))
    if unknown:
        return f"unknown fields {unknown}"
    for name, value in fields.items():
        if type(known[name].default) is int and not (type(value) is int and value >= 1):
            return f"{name} must be a whole number >= 1, got {value!r}"
        if name.endswith("dropout") and not (type(value) in (int, float) and 0.0 <= value < 1.0):
            return f"{name} must be in [0, 1), got {value!r}"
    try:
        config_class(**fields)
    except (TypeError, ValueError) as e:
        return str(e)
    return None


def check_tensors(path, tensors, model, adam_steps):
    """Raise a CheckpointError unless `tensors` (from the file at `path`) hold every tensor of `model`'s state dict
    and both AdamW moments of each parameter named in adam_steps, nothing else, at the model's shapes and finite."""
    params = dict(model.named_parameters())
    want = {f"model.{k}": tuple(v.shape) for k, v in model.state_dict().items()}
    for name in adam_steps:
        if name not in params:
            raise CheckpointError(path, f"it has AdamW state for {name!r}, a parameter the model does not have")
        want[f"optim.{name}.exp_avg"] = want[f"optim.{name}.exp_avg_sq"] = tuple(params[name].shape)
    for problem, names in (("missing", [k for k in want if k not in tensors]),
                           ("unexpected", [k for k in tensors if k not in want])):
        if names:
            listed = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            raise CheckpointError(path, f"{len(names)} {problem} tensor{'s' if len(names) > 1 else ''} ({listed}); "
                                        "corrupt, or not written for this model?")
    for name, shape in want.items():
        array = tensors[name]
        if tuple(array.shape) != shape:
            raise CheckpointError(path, f"tensor {name} has shape {tuple(array.shape)}, but its model config "
                                        f"needs {shape} (corrupt?)")
        if array.dtype.kind != "f" or not np.isfinite(array).all():
            raise CheckpointError(path, f"tensor {name} is not all finite floats (corrupt?)")


def load_model(ckpt, cls=None, *, device=None, dtype=None, where=None, **config_overrides):
    """The model a Checkpoint holds (of class `cls`, or of its model type's class), its weights loaded (and
    checked with check_tensors), on `device` and in `dtype` when given, in eval mode, as Hugging Face's
    from_pretrained returns it. config_overrides replace config fields (e.g. dropout=0.1 to fine-tune)."""
    kind, path = ckpt["model"], ckpt.path
    cls = cls or MODEL_TYPES[kind]
    if kind != cls.model_type:
        other = MODEL_TYPES[kind].__name__
        raise CheckpointError(path, f"it holds a {other} (model type {kind!r}), not a {cls.__name__}: use "
                                    f"{other}.from_pretrained (or AutoModelForCausalLM.from_pretrained, which picks "
                                    "the class)", where)
    names = [f.name for f in dataclasses.fields(cls.config_class)]
    bad = sorted(set(config_overrides) - set(names))
    if bad:
        raise TypeError(f"{where or 'load_model'}: unexpected keyword argument(s) {bad}: the keywords besides device "
                        f"and dtype replace {cls.config_class.__name__}'s fields ({', '.join(names)})")
    fields = {**ckpt["config"], **config_overrides}
    problem = config_problem(cls.config_class, fields)
    if problem is not None:
        raise ValueError(f"{where or 'load_model'}: the config with {config_overrides} is not valid: {problem}")
    model = cls(cls.config_class(**fields))
    check_tensors(path, ckpt["tensors"], model, ckpt["adam_steps"])
    model.load_state_dict({k[len("model."):]: v for k, v in ckpt["tensors"].items() if k.startswith("model.")})
    if device is not None or dtype is not None:
        model.to(device=device, dtype=dtype)
    model.eval()
    model.name_or_path, model.tokenizer_record = os.path.dirname(path), ckpt["tokenizer"]
    return model


def checkpoint_path(path, where, hint=""):
    """The checkpoint file of `path`: a directory's ckpt.safetensors, or `path` itself when it names a file; a
    FileNotFoundError naming the directory and the file it expected otherwise."""
    path = os.fspath(path)
    if os.path.isfile(path):
        return path
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{where}: no directory {path!r}: give a checkpoint directory (examples/gpt.py's "
                                f"--ckpt-dir, or one save_pretrained wrote); tinyllm downloads nothing{hint}")
    found = os.path.join(path, CKPT_NAME)
    if not os.path.isfile(found):
        there = sorted(os.listdir(path))
        raise FileNotFoundError(f"{where}: {path} has no {CKPT_NAME} (it holds {', '.join(there[:4]) or 'nothing'}"
                                f"{', ...' if len(there) > 4 else ''}): expected the --ckpt-dir of examples/gpt.py "
                                f"or a directory save_pretrained wrote{hint}")
    return found


def _read_pretrained(path, where, hint=""):
    """read_checkpoint of a directory's (or the file's) checkpoint file, errors naming `where`."""
    path = checkpoint_path(path, where, hint)
    try:
        return read_checkpoint(path)
    except CheckpointError as e:
        raise CheckpointError(e.path, e.problem, where) from None


def write_checkpoint(path, model, *, optimizer=None, step=0, tokenizer=None, metadata=None):
    """Write `model` (and, when given, AdamW's state from `optimizer`, an Adam or AdamW over its parameters) to
    the checkpoint file `path`, atomically, in the format read_checkpoint reads. tokenizer: a record
    (tokenizer_record's) or None; metadata: more str -> str entries for the file (a writer's own)."""
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    adam_steps = {}
    if optimizer is not None:
        names = {id(p): n for n, p in model.named_parameters()}
        params = [p for g in optimizer.param_groups for p in g["params"]]
        for i, entry in optimizer.state_dict()["state"].items():
            name = names.get(id(params[i]))
            if name is None:
                raise ValueError(f"save_pretrained: the optimizer's parameter {i} {tuple(params[i].shape)} is not "
                                 "one of the model's parameters")
            if sorted(entry) != ["exp_avg", "exp_avg_sq", "step"]:
                raise ValueError(f"save_pretrained: the optimizer's state of {name} holds {sorted(entry)}; the "
                                 "checkpoint format keeps Adam's and AdamW's (step, exp_avg, exp_avg_sq)")
            tensors[f"optim.{name}.exp_avg"], tensors[f"optim.{name}.exp_avg_sq"] = entry["exp_avg"], entry["exp_avg_sq"]
            adam_steps[name] = int(entry["step"].item())
    meta = {"format": FORMAT, "model": model.model_type, "step": str(step),
            "config": json.dumps(dataclasses.asdict(model.config)), "adam_steps": json.dumps(adam_steps)}
    if tokenizer is not None:
        meta["tokenizer"] = json.dumps(tokenizer)
    st.save_file(tensors, path, metadata={**meta, **(metadata or {})})


def restore_optimizer(optimizer, model, tensors, adam_steps):
    """Give `optimizer` (an Adam or AdamW over `model`'s parameters) the AdamW state a checkpoint file holds
    (its tensors and adam_steps), through optimizer.load_state_dict."""
    index = {id(p): i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
    state = {}
    for name, p in model.named_parameters():
        if name in adam_steps and id(p) in index:
            state[index[id(p)]] = {"step": adam_steps[name], "exp_avg": tensors[f"optim.{name}.exp_avg"],
                                   "exp_avg_sq": tensors[f"optim.{name}.exp_avg_sq"]}
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})


def tokenizer_record(tokenizer, directory, write=True):
    """What a checkpoint file records of its tokenizer, told by what the tokenizer has (the library does not
    import the tokenizers): a character tokenizer (kind "char", its `vocab` string) by its characters, GPT-2's
    (name "gpt2") by name, any other with a save(path) method (tinyllm.tokenizer.Tokenizer: a BPE) saved as
    tokenizer.json in `directory` (unless write=False: it is there already) and recorded with its sha256.
    A record (a dict) is returned as it is."""
    if isinstance(tokenizer, dict):
        if not isinstance(tokenizer.get("kind"), str):
            raise ValueError(f"tokenizer_record: a tokenizer record needs a 'kind', got {tokenizer!r:.100}")
        return dict(tokenizer)
    if getattr(tokenizer, "kind", None) == "char":
        return {"kind": "char", "vocab": tokenizer.vocab}
    if getattr(tokenizer, "name", None) == "gpt2":
        return {"kind": "gpt2", "n_vocab": tokenizer.n_vocab}
    if not callable(getattr(tokenizer, "save", None)):
        raise TypeError(f"save_pretrained: tokenizer must be a tinyllm.tokenizer.Tokenizer, a character tokenizer "
                        f"(kind 'char' and a vocab string) or a tokenizer record, got {type(tokenizer).__name__}")
    path = os.path.join(directory, TOKENIZER_FILE)
    if write:
        tokenizer.save(path)
    return {"kind": "bpe", "file": TOKENIZER_FILE, "sha256": file_sha256(path)}


def file_sha256(path):
    """The hex sha256 of the file at `path`."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class PreTrainedModel:
    """from_pretrained / save_pretrained for a model class with `model_type` (its name in checkpoint files) and
    `config_class` (a dataclass, the model built as cls(config)); mixed in before nn.Module."""
    model_type = None
    config_class = None
    _pretrained_hint = ""  # where else the class's weights come from, said when a path is not a checkpoint

    def __init_subclass__(cls, **kwargs):
        """Register a class that names its model_type, so checkpoint files of that type find it."""
        super().__init_subclass__(**kwargs)
        if "model_type" in vars(cls):
            MODEL_TYPES[cls.model_type] = cls

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *, device=None, dtype=None, **config_overrides):
        """The model of a checkpoint directory (examples/gpt.py's --ckpt-dir, or one save_pretrained wrote; or the
        checkpoint file itself), as Hugging Face's from_pretrained: weights loaded, in eval mode, on `device` and
        in `dtype` when given; keyword arguments that name config fields replace the saved ones (dropout=0.1).
        A checkpoint of another model type is an error naming the class to use."""
        where = f"{cls.__name__}.from_pretrained"
        ckpt = _read_pretrained(pretrained_model_name_or_path, where, cls._pretrained_hint)
        return load_model(ckpt, cls, device=device, dtype=dtype, where=where, **config_overrides)

    def save_pretrained(self, save_directory, *, tokenizer=None, optimizer=None, step=0):
        """Write the model to `save_directory`/ckpt.safetensors (made if missing; atomically) in the format
        examples/gpt.py writes, so from_pretrained, examples/sample.py and gpt.py --resume read it. tokenizer:
        what sample.py decodes with (a tinyllm.tokenizer.Tokenizer, the examples' character tokenizer or a
        record; see tokenizer_record); without it, a model from from_pretrained keeps the tokenizer of the
        directory it came from (a BPE's tokenizer.json is copied). optimizer: its AdamW state is saved too, for
        --resume, with the training step `step`. Returns the file's path."""
        save_directory = os.fspath(save_directory)
        if os.path.isfile(save_directory):
            raise NotADirectoryError(f"save_pretrained: {save_directory} is a file; give a directory (the file "
                                     f"written in it is {CKPT_NAME})")
        os.makedirs(save_directory, exist_ok=True)
        if tokenizer is not None:
            record = tokenizer_record(tokenizer, save_directory)
        else:
            record = getattr(self, "tokenizer_record", None)
            source = getattr(self, "name_or_path", None)
            if record and record.get("file") and source is not None:
                src, dst = (os.path.join(d, record["file"]) for d in (source, save_directory))
                if os.path.isfile(src) and not (os.path.exists(dst) and os.path.samefile(src, dst)):
                    with open(src, "rb") as f:
                        atomic_write(dst, f.read())
        path = os.path.join(save_directory, CKPT_NAME)
        write_checkpoint(path, self, optimizer=optimizer, step=step, tokenizer=record)
        return path


class AutoModelForCausalLM:
    """Hugging Face's name for "whichever model the checkpoint holds": from_pretrained(dir) reads the model type
    from the file and returns that class's from_pretrained(dir)."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        """The model (GPT or Llama, by the file's model type) of a checkpoint directory; as GPT.from_pretrained."""
        where = "AutoModelForCausalLM.from_pretrained"
        return load_model(_read_pretrained(pretrained_model_name_or_path, where), where=where, **kwargs)
