"""The logit lens against a tuned lens on a trained checkpoint: per layer, KL(the model's output ‖ lens) in nats and
top-1 agreement with the model, on held-out windows (val.bin), after training the tuned lens on train.bin.

    python bench/lens.py --ckpt-dir out/gpt-m                  # a checkpoint directory of examples/gpt.py
    python bench/lens.py --ckpt-dir out/gpt-m --steps 200 --batch-size 8 --windows 32

Prints the command's settings, the training time and the table; the tuned lens must have the lower KL at every
layer below the output (the last line says whether it does)."""
import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--windows", type=int, default=32)
    p.add_argument("--runtime", default="c")
    args = p.parse_args()
    sys.path[:0] = [ROOT, os.path.join(ROOT, "examples")]
    import numpy as np
    from common import split_tokens  # bench/common.py: bench/ is the script directory
    from gpt_files import CKPT_NAME, load_model
    from tinyllm.interp import TunedLens, format_report, lens_report

    model, _, _ = load_model(os.path.join(args.ckpt_dir, CKPT_NAME), args.runtime)
    train, val = (np.asarray(split_tokens(args.ckpt_dir, s), np.int64) for s in ("train", "val"))
    start = time.perf_counter()
    lens = TunedLens.train(model, train, steps=args.steps, batch_size=args.batch_size, lr=args.lr)
    trained = time.perf_counter() - start
    rows = lens_report(model, val, lens, windows=args.windows)
    print(f"{args.ckpt_dir}: {type(model).__name__}, {model.num_parameters() / 1e6:.2f}M parameters; tuned lens "
          f"{args.steps} steps x {args.batch_size} windows, lr {args.lr}, trained in {trained:.1f} s on "
          f"{args.runtime}; report on {args.windows} held-out windows")
    print(format_report(rows))
    better = all(r["tuned_kl"] < r["logit_kl"] for r in rows[:-1])
    print(f"tuned KL < logit KL at every layer below the output: {better}")


if __name__ == "__main__":
    main()
