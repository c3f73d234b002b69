"""Look inside a GPT (or Llama) trained by examples/gpt.py: the logit and tuned lens, a sparse autoencoder's
features, and how much the model memorized. Each subcommand prints a table and writes a PNG (matplotlib: pip install
'tinyllm[interp]').

    python examples/interpret.py lens --ckpt-dir out/gpt --prompt "ROMEO:"   # what each layer would predict
    python examples/interpret.py sae --ckpt-dir out/gpt --layer 1            # features of a sparse autoencoder
    python examples/interpret.py canaries                                    # exposure of planted secrets

A missing or unreadable checkpoint file, a layer out of range or a prompt the tokenizer cannot encode stops with
one line on stderr and exit code 2.
"""
import argparse
import os
import sys

import numpy as np

try:
    import tinyllm
except ModuleNotFoundError:  # run from a checkout that is not pip-installed: use the tinyllm beside examples/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import tinyllm
from tinyllm import runtime as tl_runtime
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gpt_files.py beside this file, however it is run
from flags import add_old_name  # noqa: E402
from gpt_files import CKPT_NAME, UsageError, load_model, run_cli  # noqa: E402


def lens(args):
    """The logit lens (nostalgebraist 2020) and a tuned lens (Belrose et al. 2023) over --prompt: a table per lens
    (rows: what each layer's residual predicts, columns: the prompt's positions; each cell the top token and its
    probability) and a heatmap PNG of it; then both lenses' KL to the model's output and top-1 agreement, per
    layer, on held-out tokens."""
    import time
    from tinyllm.interp import lens as L
    for flag, value in (("--tuned-steps", args.tuned_steps), ("--batch-size", args.batch_size),
                        ("--report-windows", args.report_windows)):
        if value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    model, tok, ckpt = load_model(os.path.join(args.ckpt_dir, CKPT_NAME), args.device)
    ids = _lens_prompt(tok, args.prompt, L.context_length(model))
    train_ids, heldout_ids = _lens_tokens(args.ckpt_dir, tok, ckpt, L.context_length(model))
    idx = tinyllm.tensor(ids[None, :], device=args.device)
    tinyllm.manual_seed(args.seed)
    tuned = None
    if not args.no_tuned:
        t0 = time.perf_counter()
        tuned = L.TunedLens.train(model, train_ids, steps=args.tuned_steps, batch_size=args.batch_size,
                                  lr=args.lr, seed=args.seed)
        print(f"tuned lens: {args.tuned_steps} steps of {args.batch_size} windows in {time.perf_counter() - t0:.1f} s")
    labels = [_token_text(tok, i) for i in ids]
    names = L.layer_names(model)
    os.makedirs(args.out_dir, exist_ok=True)
    for title, fn in (("logit lens", L.logit_lens), ("tuned lens", tuned)):
        if fn is None:
            continue
        probs = np.exp(fn(model, idx).numpy()[:, 0].astype(np.float64))  # (layers, T, vocab)
        top = probs.argmax(-1)
        cells = [[(_token_text(tok, t), p[t]) for t, p in zip(row, layer)] for row, layer in zip(top, probs)]
        print(f"\n{title}: the top token and its probability, per layer (rows) and position (columns)")
        print("(each column: the prompt's token there; each cell: the next token the lens predicts)")
        print(_lens_table(names, labels, cells))
        path = os.path.join(args.out_dir, title.replace(" ", "_") + ".png")
        _lens_figure(title, names, labels, cells, path)
        print(f"wrote {path}")
    rows = L.lens_report(model, heldout_ids, tuned, windows=args.report_windows, batch_size=args.batch_size)
    print(f"\nKL(model's output || lens) in nats and top-1 agreement with the model, on {args.report_windows} "
          f"held-out windows of {L.context_length(model)} tokens:")
    print(L.format_report(rows))


def _lens_prompt(tok, prompt, context):
    """The prompt's token ids, or a UsageError when the tokenizer cannot encode it or it outgrows the context."""
    try:
        ids = np.asarray(tok.encode(prompt, allowed_special="all") if hasattr(tok, "special_tokens")
                         else tok.encode_ordinary(prompt), dtype=np.int64)
    except ValueError as e:
        raise UsageError(f"--prompt: {e}; the model knows only the tokens it was trained on") from None
    if ids.size == 0:
        raise UsageError("--prompt is empty: give at least one character")
    if ids.size > context:
        raise UsageError(f"--prompt is {ids.size} tokens, longer than the model's context ({context}): shorten it")
    return ids


def _lens_tokens(ckpt_dir, tok, ckpt, context):
    """(training tokens, held-out tokens) for the tuned lens and the report: the train.bin / val.bin that
    examples/gpt.py wrote beside the checkpoint when they are its tokenizer's, else Shakespeare's plays split
    90/10 as gpt.py splits them."""
    import json
    from gpt_files import shakespeare_plays, token_ids
    try:
        with open(os.path.join(ckpt_dir, "data.json")) as f:
            meta = json.load(f)
        if meta["key"]["tokenizer"] == ckpt["tokenizer"]:
            splits = [np.memmap(os.path.join(ckpt_dir, f"{n}.bin"), dtype=meta["dtype"], mode="r")
                      for n in ("train", "val")]
            if all(len(s) > context for s in splits):
                return [np.asarray(s, dtype=np.int64) for s in splits]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    text = "".join(shakespeare_plays().values())
    n = int(0.9 * len(text))
    try:
        return [token_ids(tok, part, "tokenizing Shakespeare").astype(np.int64) for part in (text[:n], text[n:])]
    except ValueError as e:
        raise UsageError(f"{ckpt_dir} has no train.bin/val.bin of its tokenizer, and it cannot encode "
                         f"Shakespeare's plays ({e})") from None


def _token_text(tok, i):
    """A token as printable text: repr's escapes without the quotes ('\\n' for a newline), a space as '␣'."""
    text = tok.decode_single_token_bytes(int(i)).decode("utf-8", errors="replace")
    return repr(text)[1:-1].replace(" ", "\u2423")


def _lens_table(names, labels, cells):
    """Rows = layers, columns = positions: `token probability` in each cell, the prompt's tokens on top."""
    width = max(6, max(len(t) for row in cells for t, _ in row) + 5, max(len(s) for s in labels))
    first = max(len(n) for n in names) + 2
    lines = [" " * first + "".join(f"{s:>{width + 1}}" for s in labels)]
    for name, row in zip(names, cells):
        lines.append(f"{name:<{first}}" + "".join(f"{f'{t} {p:.2f}':>{width + 1}}" for t, p in row))
    return "\n".join(lines)


def _lens_figure(title, names, labels, cells, path):
    """A heatmap layers × positions coloured by the top token's probability, the token written in each cell."""
    from tinyllm.interp.figures import pyplot, save_figure
    plt = pyplot()
    probs = np.array([[p for _, p in row] for row in cells])
    fig, ax = plt.subplots(figsize=(max(4.0, 0.6 * len(labels) + 2), max(2.5, 0.45 * len(names) + 1.2)))
    im = ax.imshow(probs, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto", origin="lower")
    for y, row in enumerate(cells):
        for x, (t, p) in enumerate(row):
            ax.text(x, y, t, ha="center", va="center", fontsize=8, color="black" if p > 0.6 else "white")
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_yticks(range(len(names)), names, fontsize=8)
    ax.set_xlabel("the prompt's token at each position")
    ax.set_ylabel("residual read")
    ax.set_title(f"{title}: the predicted next token per layer and position")
    fig.colorbar(im, ax=ax, label="probability of the top token")
    save_figure(fig, path)


def sae(args):
    raise NotImplementedError("interpret.py sae: being written this session")


def canaries(args):
    raise NotImplementedError("interpret.py canaries: being written this session")


def add_checkpoint_flags(p):
    p.add_argument("--ckpt-dir", required=False, help=f"the --ckpt-dir of examples/gpt.py (the directory of "
                                                      f"{CKPT_NAME}; old name --ckpt)")
    add_old_name(p, "--ckpt", "--ckpt-dir")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    commands = {}

    q = sub.add_parser("lens", help="the logit lens and a tuned lens, layer by layer, over a prompt")
    add_checkpoint_flags(q)
    q.add_argument("--prompt", default="ROMEO:\nBut soft, what light", help="the text to read (default: %(default)r)")
    q.add_argument("--tuned-steps", type=int, default=100, help="training steps of the tuned lens (default: "
                                                                 "%(default)s)")
    q.add_argument("--no-tuned", action="store_true", help="the logit lens only: train no tuned lens")
    q.add_argument("--batch-size", type=int, default=4, help="windows of the model's context per tuned-lens step "
                                                             "and per report batch (default: %(default)s)")
    q.add_argument("--lr", type=float, default=1e-3, help="the tuned lens's AdamW learning rate (default: "
                                                          "%(default)s)")
    q.add_argument("--report-windows", type=int, default=8, help="held-out windows the KL/top-1 summary averages "
                                                                 "over (default: %(default)s)")
    commands["lens"] = q

    q = sub.add_parser("sae", help="train a sparse autoencoder on one layer's residual stream; show its features")
    add_checkpoint_flags(q)
    q.add_argument("--layer", type=int, help="the block whose residual stream (blocks.N.hook_resid_post) is read "
                                             "(default: the middle one)")
    commands["sae"] = q

    q = sub.add_parser("canaries", help="train a small model with planted random strings; plot their exposure")
    commands["canaries"] = q

    for q in commands.values():
        q.add_argument("--out-dir", default=os.path.join("out", "interp"), help="where the PNGs go (default: "
                                                                                "%(default)s)")
        q.add_argument("--runtime", help="the tinyllm runtime, e.g. numpy or c (default: $TINYLLM_RUNTIME, else c "
                                         "where built, else numpy)")
        q.add_argument("--seed", type=int, default=0, help="seed of everything random (default: 0)")
    args = p.parse_args(argv)
    if args.command in ("lens", "sae") and args.ckpt_dir is None:  # (not required=True: its old name --ckpt too)
        commands[args.command].error("the following arguments are required: --ckpt-dir")
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        args.device = tl_runtime.get(args.runtime).name
    except ValueError as e:
        raise UsageError(f"--runtime: {e}") from None
    {"lens": lens, "sae": sae, "canaries": canaries}[args.command](args)


if __name__ == "__main__":
    run_cli(main, "interpret.py")
