"""Quantize a GPT checkpoint of examples/gpt.py to int8 or int4 weights: size, validation loss and a sample, then
the quantized model saved to a safetensors file and loaded back.

    python examples/gpt.py && python examples/quantize.py    # out/gpt's checkpoint, int8, one scale per 32 weights
    python examples/quantize.py --format int4 --group-size 128
    python examples/quantize.py --dynamic                   # int8 activations too (dynamic quantization)
    python examples/quantize.py --ckpt-dir out/gpt-m --out out/gpt-m/int4.safetensors --format int4

With no checkpoint in out/gpt, a tiny model is trained first (examples/gpt.py --tiny, a few seconds, in
out/gpt-tiny).

tinyllm.quantization.quantize_ replaces every nn.Linear with a QuantizedLinear: int8 values, or two int4 values per
byte, and one float16 scale per --group-size consecutive input features (llama.cpp's Q8_0 and Q4_0 layouts; the
formats are defined in tinyllm/ops/qmatmul.py). Activations stay float32, or with --dynamic are quantized to int8
per group at run time (byte dot products: VNNI where the CPU has it). The tied embedding / lm_head stays float32
unless --embedding. The validation loss is the mean over --eval-iters batches of the held-out split (the last 10 %
of the text, as examples/gpt.py splits it), the same batches before and after, so the difference is the rounding's.
"""
import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gpt.py and gpt_files.py beside this file
from gpt import Progress, get_batch  # noqa: E402 (gpt.py puts the checkout on sys.path if tinyllm is not installed)
from flags import add_old_name  # noqa: E402
from gpt_files import (CKPT_NAME, UsageError, device_of, load_model, read_corpus, run_cli,  # noqa: E402
                       tokenized_splits)

import tinyllm  # noqa: E402
from tinyllm import quantization  # noqa: E402
from tinyllm.models.gpt import GPT, GPTConfig  # noqa: E402
from tinyllm.nn import functional as F  # noqa: E402
from tinyllm.utils.safetensors import load_metadata  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DIR = os.path.join("out", "gpt")
TINY_DIR = os.path.join("out", "gpt-tiny")


def held_out_split(ckpt_path, tok, tok_record):
    """The held-out token ids of the text the checkpoint was trained on (its --data, else Shakespeare), split as
    examples/gpt.py splits it, from the token files beside the checkpoint (made there if missing)."""
    data = json.loads(load_metadata(ckpt_path).get("args", "{}")).get("data")
    text, _ = read_corpus(data)
    n = int(0.9 * len(text))
    return tokenized_splits({"train": text[:n], "val": text[n:]}, tok, tok_record, os.path.dirname(ckpt_path),
                            Progress())["val"]


@tinyllm.no_grad()
def held_out_losses(model, val, batches, batch_size, device, seed=0):
    """The mean loss (nats/token) of each of `batches` batches of `val`, drawn from a fixed seed so that every model
    is scored on the same tokens. The loss is taken from float32 logits, as under torch's autocast: a 16-bit loss
    would round away the differences being measured."""
    model.eval()
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(batches):
        x, y = get_batch(val, batch_size, model.max_positions, rng, device)
        logits, _ = model(x, y)  # (its own loss is left unrealized: the graph is lazy)
        out.append(F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1)).item())
    return np.array(out)


def train_tiny(ckpt_dir):
    """Train examples/gpt.py's tiny smoke-test model into `ckpt_dir`; its output goes to this run's stderr."""
    print(f"quantize.py: no checkpoint in {DEFAULT_DIR}: training a tiny one (examples/gpt.py --tiny) in {ckpt_dir}",
          file=sys.stderr)
    r = subprocess.run([sys.executable, os.path.join(HERE, "gpt.py"), "--tiny", "--ckpt-dir", ckpt_dir,
                        "--sample-tokens", "0"], stdout=sys.stderr)
    if r.returncode:
        raise UsageError(f"training the tiny model failed (exit code {r.returncode}); see its output above")


def sample(model, tok, n, device, seed):
    start = tok.encode_ordinary("\n")
    idx = tinyllm.tensor(np.array([start[:1] or [0]], dtype=np.int64), device=device)
    out = model.generate(idx, n, temperature=0.8, generator=tinyllm.Generator().manual_seed(seed))
    return tok.decode(out.numpy()[0, 1:].tolist())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ckpt-dir", help=f"directory of examples/gpt.py's {CKPT_NAME} (default: {DEFAULT_DIR}; if it "
                                      f"has none, a tiny model is trained in {TINY_DIR}; old name --ckpt)")
    add_old_name(p, "--ckpt", "--ckpt-dir")
    p.add_argument("--format", choices=quantization.FORMATS, default="int8")
    p.add_argument("--group-size", type=int, default=32, help="input features per float16 scale (default: 32; a "
                   "layer whose input width is not a multiple of it gets a padded last group)")
    p.add_argument("--embedding", action="store_true", help="also quantize the lm_head tied to the token embedding")
    p.add_argument("--dynamic", action="store_true", help="also quantize the layers' inputs to int8 at run time "
                   "(dynamic quantization: byte dot products, VNNI where the CPU has it)")
    p.add_argument("--eval-iters", type=int, default=10, help="held-out batches of the loss (default: 10)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--sample-tokens", type=int, default=200)
    p.add_argument("--seed", type=int, default=0, help="seed of the sample")
    p.add_argument("--runtime", help="the tinyllm runtime (default: c where it is built, else numpy)")
    p.add_argument("--out", metavar="FILE", help="the quantized checkpoint file (default: "
                                                 "quantized-FORMAT-gGROUP.safetensors in --ckpt-dir)")
    args = p.parse_args(argv)
    try:  # before any model is loaded or trained
        quantization.check_format(args.format, args.group_size, "--group-size")
    except ValueError as e:
        p.error(str(e).replace("group_size=", "--group-size "))
    ckpt_dir = args.ckpt_dir or DEFAULT_DIR
    if args.ckpt_dir is None and not os.path.isfile(os.path.join(ckpt_dir, CKPT_NAME)):
        ckpt_dir = TINY_DIR
        if not os.path.isfile(os.path.join(ckpt_dir, CKPT_NAME)):
            train_tiny(ckpt_dir)
    device = device_of(args.runtime)
    ckpt_path = os.path.join(ckpt_dir, CKPT_NAME)
    model, tok, ckpt = load_model(ckpt_path, device)
    val = held_out_split(ckpt_path, tok, ckpt["tokenizer"])
    tokens = args.eval_iters * args.batch_size * model.max_positions
    print(f"{ckpt_path}: {model.num_parameters() / 1e6:.2f}M parameters, step {ckpt['step']}; loss on "
          f"{args.eval_iters} held-out batches of {args.batch_size}x{model.max_positions} ({tokens:,} tokens)")

    def report(name):
        loss = held_out_losses(model, val, args.eval_iters, args.batch_size, device).mean()
        print(f"{name:>12}: {quantization.model_nbytes(model) / 1e6:8.3f} MB, val loss {loss:.4f} nats/token, "
              f"perplexity {math.exp(loss):.3f}")
        return loss

    base = report("float32")
    try:
        quantization.quantize_(model, args.format, group_size=args.group_size, embedding=args.embedding,
                               dynamic=args.dynamic)
    except ValueError as e:
        raise UsageError(str(e)) from None
    label = f"{args.format} g{args.group_size}" + " dynamic" * args.dynamic
    loss = report(label)
    print(f"perplexity {100 * (math.exp(loss - base) - 1):+.3f} % from float32")
    if args.sample_tokens:
        print(f"---- {label} sample (temperature 0.8, seed {args.seed}) ----")
        print(sample(model, tok, args.sample_tokens, device, args.seed))
        print("----")

    out = args.out or os.path.join(ckpt_dir, f"quantized-{args.format}-g{args.group_size}"
                                   f"{'-dynamic' * args.dynamic}.safetensors")
    quantization.save(model, out)
    # a new float32 model of the same config: load quantizes the layers the file names and fills in every weight
    again = quantization.load(GPT(GPTConfig(**ckpt["config"])).to(device), out)
    x, y = get_batch(val, 2, model.max_positions, np.random.default_rng(1), device)
    same = np.array_equal(model(x, y)[0].numpy(), again(x, y)[0].numpy())
    print(f"saved {out} ({os.path.getsize(out) / 1e6:.3f} MB) and loaded it back: "
          f"{'the same logits' if same else 'DIFFERENT logits'}")
    return 0 if same else 1


if __name__ == "__main__":
    run_cli(main, "quantize.py")
