"""A model that learns from its users: a simulated user with a hidden taste compares pairs of a Shakespeare model's
answers, and tinyllm.continual tunes a LoRA on those preferences, round after round, with and without replay.

    python examples/feedback.py                      # pretrain a small GPT here, then 5 rounds, twice
    python examples/feedback.py --ckpt-dir out/gpt   # start from examples/gpt.py's checkpoint instead
    python examples/feedback.py --feedback ratings   # thumbs up or down (KTO) instead of pairs (DPO)
    python examples/feedback.py --tiny               # a seconds-long smoke run

The user's taste (--taste): "vowels" likes answers whose letters are more often vowels, "caps" likes capitals (the
speakers' names), "short" likes short words. Each round, the model answers --prompts prompts (windows of the
training plays) twice; the user keeps the answer it likes better as the chosen one of a pair (or rates each answer,
thumbs up above its median score), in a FeedbackStore file; Loop.round() trains the adapters on the new feedback
(DPO for pairs, KTO for ratings), with replay of the training text mixed in (--replay-weight) or not, and then
measures the win rate against the base model under the same judge on held-out prompts from the held-out play, and
the held-out play's loss against the base model's. The forgetting gate is off here, so both runs show their curves.

Printed per round and per run (with / without replay): the win rate, the held-out loss change, the implicit
reward's accuracy and the round's seconds; written: a PNG of the curves (with matplotlib) under --out-dir. The
pretrained base is kept there too (base-<hash of its flags>.safetensors), so a second run starts at the rounds.

The default run (a 4-layer, 128-wide GPT pretrained for 1,500 steps, about 3 minutes on two CPU cores; then 256
prompts a round, 80-character answers, LoRA r=2 on c_attn, c_fc and c_proj, DPO with beta 0.5, 40 steps at lr 2e-3,
replay weighted 3) measured, after 5 rounds (bench/RESULTS.md): with replay a win rate of 87 % against the base
model and the held-out loss +1.55 %; without replay 100 % and +10.3 %; 13-16 s a round.
"""
import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np

try:
    import tinyllm
except ModuleNotFoundError:  # run from a checkout that is not pip-installed: use the tinyllm beside examples/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import tinyllm
from tinyllm.continual import FeedbackStore, Loop
from tinyllm.utils import safetensors
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gpt.py, gpt_files.py and lora.py beside this file
from flags import apply_preset  # noqa: E402
from gpt import new_config  # noqa: E402
from gpt_files import (CKPT_NAME, CharTokenizer, UsageError, build_model, device_of, load_model,  # noqa: E402
                       model_kind, run_cli, shakespeare_plays)
from lora import train  # noqa: E402

DEFAULTS = dict(play="tempest", n_layer=4, n_head=4, n_embd=128, block_size=96, batch_size=32, pretrain_iters=1500,
                pretrain_lr=3e-3, rounds=5, prompts=256, prompt_len=16, answer_len=80, steps=40, lr=2e-3, beta=0.5,
                r=2, alpha=4, replay_weight=3.0, loss_type="sigmoid", targets=None, taste="vowels",
                feedback="pairs", model="gpt", n_kv_head=0, seed=1337, out_dir=os.path.join("out", "feedback"))
TINY = dict(n_layer=1, n_head=2, n_embd=32, block_size=48, batch_size=4, pretrain_iters=30, rounds=2, prompts=8,
            prompt_len=8, answer_len=12, steps=4, out_dir=os.path.join("out", "feedback-tiny"))
TARGETS = {"gpt": "c_attn,c_fc,c_proj", "llama": "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"}
TASTES = {
    "vowels": lambda text: _share(text, lambda c: c.lower() in "aeiou", str.isalpha),
    "caps": lambda text: _share(text, str.isupper, str.isalpha),
    "short": lambda text: -np.mean([len(w) for w in text.split()]) if text.split() else -10.0,
}


def _share(text, wanted, among):
    n = sum(1 for c in text if among(c))
    return sum(1 for c in text if among(c) and wanted(c)) / n if n else 0.0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                epilog="--tiny changes the defaults to: " + ", ".join(
                                    f"--{k.replace('_', '-')} {v}" for k, v in TINY.items()))
    d = DEFAULTS
    p.add_argument("--ckpt-dir", metavar="DIR", help=f"start from the {CKPT_NAME} that examples/gpt.py wrote in DIR "
                                                     "instead of pretraining here")
    p.add_argument("--play", help=f"the held-out play (held-out prompts and loss; default: {d['play']})")
    for flag, kind, text in [("n-layer", int, "blocks"), ("n-head", int, "heads"), ("n-embd", int, "width"),
                             ("block-size", int, "context"), ("batch-size", int, "sequences per step"),
                             ("pretrain-iters", int, "pretraining steps"), ("pretrain-lr", float,
                                                                           "pretraining peak learning rate"),
                             ("rounds", int, "feedback rounds"), ("prompts", int, "prompts answered per round"),
                             ("prompt-len", int, "characters per prompt"), ("answer-len", int, "characters per "
                                                                                               "answer"),
                             ("steps", int, "optimizer steps per round"), ("lr", float, "the adapters' learning rate"),
                             ("beta", float, "DPO/KTO's beta"), ("r", int, "LoRA rank"), ("alpha", float,
                                                                                         "LoRA alpha"),
                             ("replay-weight", float, "weight of the replayed text's loss in the run with replay"),
                             ("seed", int, "seed")]:
        p.add_argument("--" + flag, type=kind, help=f"{text} (default: {d[flag.replace('-', '_')]})")
    p.add_argument("--targets", help="comma-separated module names (or suffixes) LoRA wraps (default: every "
                                     "projection: " + "; ".join(f"{k}: {v}" for k, v in TARGETS.items()) + ")")
    p.add_argument("--loss-type", choices=("sigmoid", "ipo", "hinge"), help="DPO's form (default: "
                                                                            f"{d['loss_type']})")
    p.add_argument("--taste", choices=tuple(TASTES), help=f"the simulated user's hidden taste (default: {d['taste']})")
    p.add_argument("--feedback", choices=("pairs", "ratings"), help=f"what the user gives (default: {d['feedback']})")
    p.add_argument("--runs", choices=("both", "replay", "no-replay"), default="both",
                   help="the runs to make: with replay of the training text, without, or both side by side")
    p.add_argument("--model", choices=("gpt", "llama"), help=f"the model pretrained here (default: {d['model']})")
    p.add_argument("--runtime", help="the tinyllm runtime (device), e.g. numpy or c (default: $TINYLLM_RUNTIME, "
                                     "else c where its module is built, else numpy)")
    p.add_argument("--out-dir", help=f"where the stores, adapters and the PNG go (default: {d['out_dir']})")
    p.add_argument("--no-jit", action="store_true", help="pretraining: run every step's Python (no tinyllm.jit)")
    p.add_argument("--tiny", action="store_true", help="a tiny model and run for smoke tests (explicit flags win)")
    args = p.parse_args(argv)
    apply_preset(p, args, DEFAULTS, TINY, ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "rounds",
                                            "prompts", "prompt_len", "answer_len", "steps", "r"))
    if args.prompt_len + args.answer_len > args.block_size:
        p.error(f"--prompt-len + --answer-len ({args.prompt_len + args.answer_len}) must fit in --block-size "
                f"({args.block_size})")
    if not args.n_kv_head:
        args.n_kv_head = args.n_head // 2 if args.n_head % 2 == 0 else args.n_head
    return args


def base_model(args, device):
    """(model, tokenizer, training text, held-out play): examples/gpt.py's checkpoint, or a model pretrained here
    on every play but the held-out one."""
    texts = shakespeare_plays()
    if args.play not in texts:
        raise UsageError(f"--play {args.play}: no such text; the package has {', '.join(texts)}")
    play = texts.pop(args.play)
    corpus = "".join(texts.values())
    if args.ckpt_dir:
        model, tok, _ = load_model(os.path.join(args.ckpt_dir, CKPT_NAME), device)
        return model, tok, corpus, play
    tok = CharTokenizer("".join(sorted(set(play).union(corpus))))
    config = new_config(argparse.Namespace(**{**vars(args), "dropout": 0.0, "checkpoint": False}), tok.n_vocab)
    model = build_model(args.model, config).to(device)
    # the pretrained base is kept in --out-dir, named by what made it, so a second run starts at the rounds
    made_by = {k: getattr(args, k) for k in ("model", "n_layer", "n_head", "n_embd", "n_kv_head", "block_size",
                                             "batch_size", "pretrain_iters", "pretrain_lr", "seed", "play")}
    key = hashlib.sha256(json.dumps(made_by, sort_keys=True).encode()).hexdigest()[:12]
    path = os.path.join(args.out_dir, f"base-{key}.safetensors")
    if os.path.exists(path):
        model.load_state_dict(safetensors.load_file(path))
        print(f"base model: {path} (pretrained by an earlier run with the same flags)")
        return model, tok, corpus, play
    ids = np.asarray(tok.encode_ordinary(corpus), np.uint16)
    t0 = time.time()
    loss = train(model, model.parameters(), ids, args.pretrain_iters, args.pretrain_lr, args, device,
                 "pretraining", weight_decay=0.1)
    print(f"pretrained {args.pretrain_iters} steps in {time.time() - t0:.0f} s: train loss {loss:.3f}")
    safetensors.save_file(model.state_dict(), path)
    return model, tok, corpus, play


def clone(model, device):
    """A copy of the base model for one run (each run's LoRA goes into its own copy)."""
    twin = type(model)(model.config).to(device)
    twin.load_state_dict(model.state_dict())
    twin.eval()
    return twin


def windows(text, n, length, rng):
    starts = rng.integers(0, len(text) - length, n)
    return [text[s:s + length] for s in starts]


def collect(loop, store, prompts, judge, args, round_seed):
    """The user's feedback on this round's answers: the better of two answers per prompt as a pair, or a rating
    of each answer (thumbs up above the round's median score)."""
    a = loop.completions(prompts, seed=round_seed)
    b = loop.completions(prompts, seed=round_seed + 1)
    if args.feedback == "pairs":
        for p, x, y in zip(prompts, a, b):
            sx, sy = judge(p, x), judge(p, y)
            if sx != sy:
                store.add_pair(p, x if sx > sy else y, y if sx > sy else x, model_version=str(loop.version))
    else:
        scores = [judge(p, x) for p, x in zip(prompts + prompts, a + b)]
        median = float(np.median(scores))
        for p, x, s in zip(prompts + prompts, a + b, scores):
            if s != median:
                store.add(p, x, 1 if s > median else -1, model_version=str(loop.version))


def run(label, model, tok, corpus, play, args, replay):
    rng = np.random.default_rng(args.seed)
    path = os.path.join(args.out_dir, f"feedback-{label}.tlfb")
    if os.path.exists(path):
        os.remove(path)                                 # (each run of the example starts a new store)
    store = FeedbackStore(path, tokenizer=tok)
    judge = lambda prompt, text: TASTES[args.taste](text)  # noqa: E731 (the hidden taste: the prompt does not matter)
    cut = int(len(play) * 0.5)
    targets = tuple(t.strip() for t in (args.targets or TARGETS[model_kind(model)]).split(",") if t.strip())
    heldout_prompts = windows(play[cut:], args.prompts, args.prompt_len, rng)
    loop = Loop(model, tok, store, r=args.r, alpha=args.alpha, beta=args.beta, loss_type=args.loss_type, lr=args.lr,
                steps=args.steps, targets=targets, batch_size=min(args.batch_size, 16),
                replay_text=corpus[:400_000] if replay else None, replay_weight=args.replay_weight,
                heldout_prompts=heldout_prompts, heldout_text=play[:cut][:60_000], judge=judge,
                max_new_tokens=args.answer_len, seed=args.seed)
    curve = []
    for k in range(args.rounds):
        t0 = time.time()
        collect(loop, store, windows(corpus, args.prompts, args.prompt_len, rng), judge, args, 1000 * (k + 1))
        m = loop.round()
        m["round"], m["seconds"] = k + 1, time.time() - t0
        curve.append(m)
        print(f"{label:>14} round {k + 1}: win rate {m['win_rate']:.0%}, held-out loss {m['heldout_change']:+.2%} "
              f"({m['heldout_loss']:.4f} vs base {m['heldout_loss_base']:.4f}), reward accuracy "
              f"{m.get('reward_accuracy', float('nan')):.0%}, {m['records']} records, {m['seconds']:.1f} s")
    return curve


def plot(curves, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no PNG: matplotlib is not installed (pip install matplotlib)")
        return
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    for label, curve in curves.items():
        rounds = [m["round"] for m in curve]
        for ax, key, scale in zip(axes, ("win_rate", "heldout_change", "seconds"), (100, 100, 1)):
            ax.plot(rounds, [m[key] * scale for m in curve], marker="o", label=label)
    for ax, title in zip(axes, ("win rate against the base model (%)", "held-out loss change (%)",
                                "seconds per round")):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0].axhline(50, color="gray", lw=0.8)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)
    print(f"wrote {path}")


def main(argv=None):
    args = parse_args(argv)
    device = device_of(args.runtime)
    tinyllm.manual_seed(args.seed)
    os.makedirs(args.out_dir, exist_ok=True)
    model, tok, corpus, play = base_model(args, device)
    model.eval()
    curves = {}
    for label, replay in (("with replay", True), ("without replay", False)):
        if args.runs != "both" and replay != (args.runs == "replay"):
            continue
        curves[label] = run(label.replace(" ", "-"), clone(model, device), tok, corpus, play, args, replay)
    plot(curves, os.path.join(args.out_dir, "feedback.png"))
    for label, curve in curves.items():
        last = curve[-1]
        print(f"{label}: after {len(curve)} rounds win rate {last['win_rate']:.0%}, held-out loss "
              f"{last['heldout_change']:+.2%}, {np.mean([m['seconds'] for m in curve]):.1f} s a round")


if __name__ == "__main__":
    run_cli(main, "feedback.py")
