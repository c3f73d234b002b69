"""Export a GPT trained by examples/gpt.py as a static WebGPU page: text generation, or its training step.

    python examples/export_web.py --ckpt-dir out/gpt --out site/                 # generate, from the checkpoint
    python examples/export_web.py --ckpt-dir out/gpt --out site/ --step train    # train on, in the browser
    python -m http.server -d site                                                # then open http://localhost:8000

The page runs the kernels that tinyllm's WGSL runtime generates and dispatches for the step (docs/export.md), so
it needs a browser with WebGPU (Chrome or Edge 113+; elsewhere it says that it cannot run). --step train trains
on --data (default: Shakespeare's plays, as examples/gpt.py) with AdamW from the checkpoint's weights (fresh
moments), and offers the result as a checkpoint file that examples/sample.py reads. A missing checkpoint file, an
output directory that is not empty (without --overwrite), or a model or tokenizer the exporter cannot handle stops
with one line on stderr and exit code 2.
"""
import argparse
import os
import sys

try:
    import tinyllm
except ModuleNotFoundError:  # run from a checkout that is not pip-installed: use the tinyllm beside examples/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import tinyllm
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gpt_files.py beside this file, however it is run
import tinyllm.export  # noqa: E402
from flags import add_old_name  # noqa: E402
from gpt_files import CKPT_NAME, UsageError, load_model, read_corpus, run_cli  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ckpt-dir", required=True, help=f"the --ckpt-dir of examples/gpt.py (the directory of "
                                                     f"{CKPT_NAME}; old name --ckpt)")
    add_old_name(p, "--ckpt", "--ckpt-dir")
    p.add_argument("--out", required=True, help="the directory to write the site into")
    p.add_argument("--step", choices=tinyllm.export.STEPS, default="generate",
                   help="generate: sample text with a key/value cache; train: forward, backward and AdamW "
                        "(default: generate)")
    p.add_argument("--overwrite", action="store_true", help="replace the site in --out when it is not empty")
    p.add_argument("--data", help="--step train: the UTF-8 text to train on (default: Shakespeare's plays)")
    p.add_argument("--max-corpus-tokens", type=int, default=1_000_000,
                   help="--step train: the corpus the page holds, at most this many tokens (default: 1,000,000)")
    p.add_argument("--batch-size", type=int, help="--step train: sequences per step (default: the checkpoint's run's)")
    p.add_argument("--lr", type=float, help="--step train: AdamW's learning rate (default: the run's final one)")
    p.add_argument("--weight-decay", type=float, help="--step train: AdamW's decay (default: the run's)")
    p.add_argument("--max-storage-buffers", type=int, default=8,
                   help="the most storage buffers one kernel may bind (default: 8, WebGPU's default limit)")
    return p.parse_args(argv)


def train_options(args, ckpt, tok):
    """The corpus and AdamW settings of --step train: the flags, else those the checkpoint's run used."""
    run = ckpt.field("args", check=lambda v: v is None or isinstance(v, dict), default="null") or {}
    text, name = read_corpus(args.data)
    try:
        ids = tok.encode_ordinary(text[:args.max_corpus_tokens * 4])[:args.max_corpus_tokens]
    except ValueError as e:
        raise UsageError(f"{name}: {e}; train on text of the model's own vocabulary") from None
    lr = args.lr or run.get("lr", 3e-3) * run.get("min_lr_ratio", 1.0)
    return {"tokens": ids, "batch_size": args.batch_size or run.get("batch_size", 8), "lr": lr,
            "weight_decay": args.weight_decay if args.weight_decay is not None else run.get("weight_decay", 0.1),
            "tokenizer_record": ckpt["tokenizer"]}


def main(argv=None):
    args = parse_args(argv)
    model, tok, ckpt = load_model(os.path.join(args.ckpt_dir, CKPT_NAME), "wgsl")
    train = train_options(args, ckpt, tok) if args.step == "train" else None
    try:
        manifest = tinyllm.export.webgpu(model, args.out, step=args.step, tokenizer=tok, overwrite=args.overwrite,
                                         train=train, max_storage_buffers=args.max_storage_buffers)
    except tinyllm.export.ExportError as e:
        raise UsageError(str(e).replace("tinyllm.export: ", "")) from None
    size = tinyllm.export.site_bytes(args.out)
    print(f"wrote {args.out}: {len(manifest['dispatches'])} dispatches of {len(manifest['kernels'])} kernels, "
          f"{size / 1e6:.2f} MB; serve it with `python -m http.server -d {args.out}` and open "
          "http://localhost:8000")
    return 0


if __name__ == "__main__":
    run_cli(main, "export_web.py")
