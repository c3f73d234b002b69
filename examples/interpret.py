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
    raise NotImplementedError("interpret.py lens: being written this session")


def sae(args):
    """Train a top-k sparse autoencoder on blocks.{layer}.hook_resid_post over the checkpoint's training text,
    print SAELens's metrics on held-out text, a few live features' top-activating snippets, and write
    out-dir/sae_features.png (their activation histograms)."""
    import numpy as np
    from tinyllm.interp.sae import collect_activations, sae_metrics, train_sae
    model, tok, ckpt = load_model(os.path.join(args.ckpt_dir, CKPT_NAME), args.device)
    n_layer = ckpt["config"].get("n_layer", ckpt["config"].get("num_hidden_layers"))
    layer = n_layer // 2 if args.layer is None else args.layer
    if not 0 <= layer < n_layer:
        raise UsageError(f"--layer {layer} is out of range: the model has {n_layer} layers (0 to {n_layer - 1})")
    hook = f"blocks.{layer}.hook_resid_post"
    train_ids, held_out = sae_text(args.ckpt_dir, tok, ckpt)
    print(f"SAE on {hook} of {args.ckpt_dir} ({n_layer} layer{'s' if n_layer != 1 else ''}, {ckpt['config'].get('n_embd', '?')} wide), "
          f"runtime {args.device}")
    acts = collect_activations(model, hook, train_ids[:args.collect])
    sae_model = train_sae(acts, expansion=args.expansion, kind="topk", k=args.k, tokens=args.tokens,
                          batch_size=args.batch_size, lr=args.lr, device=args.device, seed=args.seed)
    log = sae_model.train_log
    print(f"trained top-{args.k} SAE {sae_model.d_in} -> {sae_model.d_hidden} on {log['tokens']:,} activations "
          f"({len(acts):,} distinct) in {log['seconds']:.1f} s")
    eval_acts = collect_activations(model, hook, held_out[:args.collect // 4], progress=False)
    metrics = sae_metrics(sae_model, eval_acts, model=model, hook_name=hook, tokens=held_out, max_windows=8)
    print("held-out metrics (SAELens's names):")
    for name in ("explained_variance", "l0", "l1", "mse", "dead_features", "dead_fraction", "ce_loss_score",
                 "ce_loss_without_sae", "ce_loss_with_sae", "ce_loss_with_ablation"):
        value = metrics[name]
        print(f"  {name:<22} {value:,}" if isinstance(value, int) else f"  {name:<22} {value:.4f}")
    features, values = pick_features(sae_model, acts, args.features)
    tokens = np.asarray(train_ids[:len(acts)])
    for f, column in zip(features, values.T):
        print(f"\nfeature {f}: fires on {(column > 0).mean():.2%} of tokens; top activations (the token in [ ]):")
        for pos in np.argsort(-column)[:args.snippets]:
            print(f"  {column[pos]:7.3f}  {snippet(tok, tokens, pos)}")
    os.makedirs(args.out_dir, exist_ok=True)
    path = plot_features(features, values, os.path.join(args.out_dir, "sae_features.png"), hook)
    print(f"\nwrote {path}")


def sae_text(ckpt_dir, tok, ckpt):
    """(train ids, held-out ids) of the text the checkpoint was trained on: examples/gpt.py's token files beside it
    (train.bin, val.bin) when data.json says they are of this tokenizer, else Shakespeare's plays tokenized here
    (90 % / 10 %, examples/gpt.py's split)."""
    import json
    import numpy as np
    try:
        with open(os.path.join(ckpt_dir, "data.json")) as f:
            meta = json.load(f)
        if meta["key"]["tokenizer"] == ckpt["tokenizer"]:
            return tuple(np.memmap(os.path.join(ckpt_dir, f"{name}.bin"), dtype=meta["dtype"], mode="r")
                         for name in ("train", "val"))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    from gpt_files import shakespeare_plays, token_ids
    text = "".join(shakespeare_plays().values())
    n = int(0.9 * len(text))
    try:
        return token_ids(tok, text[:n], "tokenizing train"), token_ids(tok, text[n:], "tokenizing val")
    except ValueError as e:
        raise UsageError(f"Shakespeare's text: {e}: this checkpoint's tokenizer cannot encode it") from None


def pick_features(sae_model, acts, count, batch_size=4096):
    """`count` live latents spread over the range of firing rates (the most and least frequent left out), and their
    activations on `acts`: (ids, values (N, count))."""
    import numpy as np
    from tinyllm import Tensor, no_grad
    fired, device = np.zeros(sae_model.d_hidden, np.int64), sae_model.W_enc.device
    with no_grad():
        for s in range(0, len(acts), batch_size):
            fired += (sae_model.encode(Tensor(acts[s:s + batch_size], device=device)).numpy()
                      > 0).sum(0)
    live = np.flatnonzero(fired)[np.argsort(fired[fired > 0])]
    if not len(live):
        raise UsageError("the SAE has no live latent: train it on more tokens (--tokens)")
    ids = live[np.linspace(len(live) // 10, len(live) - 1 - len(live) // 10, min(count, len(live))).astype(int)]
    values = np.empty((len(acts), len(ids)), np.float32)
    with no_grad():
        for s in range(0, len(acts), batch_size):
            f = sae_model.encode(Tensor(acts[s:s + batch_size], device=device)).numpy()
            values[s:s + batch_size] = f[:, ids]
    return ids, values


def snippet(tok, tokens, pos, before=24, after=6):
    """The text around token `pos`, the token itself in [ ], newlines shown as ⏎."""
    left = tok.decode([int(t) for t in tokens[max(0, pos - before):pos]])
    mid = tok.decode([int(tokens[pos])])
    right = tok.decode([int(t) for t in tokens[pos + 1:pos + 1 + after]])
    return f"{left}[{mid}]{right}".replace("\n", "⏎")


def plot_features(features, values, path, hook):
    """A grid of histograms of each feature's nonzero activations, saved as a PNG at `path`."""
    from tinyllm.interp.figures import pyplot, save_figure
    plt = pyplot()
    cols = min(3, len(features))
    rows = -(-len(features) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    for ax, f, column in zip(axes.flat, features, values.T):
        active = column[column > 0]
        ax.hist(active, bins=40, color="tab:blue")
        ax.set_title(f"feature {f} ({len(active) / len(column):.2%} of tokens)")
        ax.set_xlabel("activation")
        ax.set_ylabel("tokens")
    for ax in list(axes.flat)[len(features):]:
        ax.axis("off")
    fig.tight_layout()
    fig.suptitle(f"SAE features on {hook}: activations where they fire", y=1.02)
    return save_figure(fig, path)


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
    commands["lens"] = q

    q = sub.add_parser("sae", help="train a sparse autoencoder on one layer's residual stream; show its features")
    add_checkpoint_flags(q)
    q.add_argument("--layer", type=int, help="the block whose residual stream (blocks.N.hook_resid_post) is read "
                                             "(default: the middle one)")
    q.add_argument("--tokens", type=int, default=300_000, help="activation vectors the SAE trains on (passes over "
                                                               "--collect of them; default: %(default)s)")
    q.add_argument("--collect", type=int, default=32_768, help="tokens of the training text whose activations are "
                                                               "read (default: %(default)s)")
    q.add_argument("--expansion", type=int, default=8, help="latents per residual dimension (default: %(default)s)")
    q.add_argument("--k", type=int, default=16, help="active latents per token, top-k (default: %(default)s)")
    q.add_argument("--batch-size", type=int, default=512, help="SAE batch size (default: %(default)s)")
    q.add_argument("--lr", type=float, default=4e-3, help="Adam's learning rate (default: %(default)s)")
    q.add_argument("--features", type=int, default=6, help="features to show (default: %(default)s)")
    q.add_argument("--snippets", type=int, default=5, help="top-activating snippets per feature (default: "
                                                           "%(default)s)")
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
