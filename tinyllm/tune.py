"""Tune the C runtime for this machine and remember the choice (tinyllm/runtime/c/tune.py).

    python -m tinyllm.tune                         # a GPT training step's (config M: 6 x 384, block 256)
    python -m tinyllm.tune --n-layer 4 --n-embd 128 --block-size 64 --batch 16 --budget 5
    python -m tinyllm.tune --steps 20              # then time 20 jitted steps with the default and the choice
    python -m tinyllm.tune --decode --n-layer 12 --n-head 12 --n-embd 768 --block-size 1024 --vocab-size 50257
                                                   # KV-cache decoding of GPT-2-124M's shape (the GEMV's too)

What is timed is what one jitted training step of a GPT of that shape runs on the C runtime (forward, backward,
AdamW): its products and its generated kernels; with --decode, what greedy KV-cache decoding runs (a 64-token
prompt, then one token a step).
Without --budget the search is the one a jitted run starts by itself: it may take TINYLLM_TUNE_BUDGET seconds
(default 10), but no more than a hundred steps (or tokens) would save back (tinyllm/runtime/c/tune.py); with
--budget it takes that many seconds, whatever the payback. The choice is stored in the kernel cache and applied
whenever the C runtime starts on this machine (TINYLLM_TUNE=0: never). With --steps, the steps alternate between
the default configuration and the choice, and the report says how many steps (or with --decode, tokens) pay the
search back.
"""
import argparse
import collections
import contextlib
import json
import time

import numpy as np


def _gpt(n_layer, n_head, n_embd, block_size, vocab_size):
    """A GPT of that shape on the C runtime, seeded 0, no dropout."""
    from .factory import manual_seed
    from .models.gpt import GPT, GPTConfig
    manual_seed(0)
    return GPT(GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size,
                         vocab_size=vocab_size, dropout=0.0)).to("c")


def step_products(rt, n_layer, n_head, n_embd, block_size, batch, vocab_size):
    """The float32 products one eager training step runs on the C runtime, and a function that runs the step
    jitted."""
    from .factory import tensor
    from .optim import AdamW
    from .replay.jit import jit
    model = _gpt(n_layer, n_head, n_embd, block_size, vocab_size)
    opt = AdamW(model.parameters(), lr=1e-3)

    def step(x, y):
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    rng = np.random.default_rng(0)
    x = rng.integers(0, vocab_size, (batch, block_size))
    batch_xy = (tensor(x, device="c"), tensor((7 * x + 3) % vocab_size, device="c"))
    rt.shapes.clear()
    step(*batch_xy).item()
    shapes, fn = dict(rt.shapes), jit(step)
    with _watching(rt):
        for _ in range(4):                              # (eager, recorded twice, replayed: its generated kernels)
            fn(*batch_xy).item()
    return shapes, lambda: fn(*batch_xy).item()


@contextlib.contextmanager
def _watching(rt):
    """The runtime reports the generated kernels of recorded runs (CRuntime.generated_runs), and starts no search of
    its own at a chained call meanwhile: main's follows."""
    rt.generated_runs, searched, rt.tuning = collections.Counter(), rt.tuning, {}
    try:
        yield
    finally:
        rt.tuning = searched


def decode_products(rt, n_layer, n_head, n_embd, block_size, batch, vocab_size, tokens=8):
    """The float32 products of one token of greedy KV-cache decoding on the C runtime (after a 64-token prompt and
    `tokens` one at a time), and a function that decodes one more token the same way."""
    from .factory import tensor
    model = _gpt(n_layer, n_head, n_embd, block_size, vocab_size).eval()
    prompt = tensor(np.random.default_rng(0).integers(0, vocab_size, (batch, 64)), device="c")
    rt.shapes.clear()
    with _watching(rt):
        model.generate(prompt, tokens, temperature=0).numpy()
        stream = model.generate(prompt, 1 << 30, temperature=0, stream=True)
        for _ in range(4):                              # (recorded, then replayed)
            next(stream).numpy()
        rt.shapes.clear()
        rt.replays = False                              # (one token's products counted: a replay counts none)
        try:
            next(stream).numpy()
        finally:
            rt.replays = True
    return dict(rt.shapes), lambda: next(stream).numpy()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-layer", type=int, default=6)
    ap.add_argument("--n-head", type=int, default=6)
    ap.add_argument("--n-embd", type=int, default=384)
    ap.add_argument("--block-size", type=int, default=256)
    ap.add_argument("--batch", type=int, default=None, help="default 8, or 1 with --decode")
    ap.add_argument("--vocab-size", type=int, default=65)
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds, whatever the payback (default: TINYLLM_TUNE_BUDGET or 10, but no more than "
                         "a hundred steps would save back)")
    ap.add_argument("--steps", type=int, default=0, help="then time this many steps, default against the choice")
    ap.add_argument("--decode", action="store_true", help="tune decoding's products (batch 1 unless --batch)")
    args = ap.parse_args(argv)
    args.batch = args.batch or (1 if args.decode else 8)
    from . import runtime
    from .runtime.c import tune
    rt = runtime.get("c")
    if rt.lib is None:
        raise SystemExit("tinyllm.tune: the C kernels are not built (pip install -e . with a C compiler)")
    shape = (args.n_layer, args.n_head, args.n_embd, args.block_size, args.batch, args.vocab_size)
    shapes, run = decode_products(rt, *shape) if args.decode else step_products(rt, *shape)
    n_kernels = len(rt.generated_runs)
    searched, rt.tuning = rt.tuning, {}                 # (one run timed, as a jitted run knows its own)
    began = time.perf_counter()
    run()
    run_seconds, rt.tuning = time.perf_counter() - began, searched
    bounded = args.budget is None
    record = tune.tune_and_store(rt.lib, shapes, args.budget, runtime=rt,
                                 payback=tune.PAYBACK_RUNS if bounded else None,
                                 run_seconds=run_seconds if bounded else None)
    rt.generated_runs, rt.tuning = None, record        # (searched: the runtime starts no search of its own)
    names = {0: "portable", 1: "avx2", 2: "avx512"}
    splits = {0: "the rules", 1: "columns", 2: "rows, each its own B panel", 3: "rows, one B panel shared"}
    show = lambda c: (f"{names[c['path']]} KC {c['kc']} MC {c['mc']} NC {c['nc']}, threads split "  # noqa: E731
                      f"{splits[c['split']]}, GEMV rows "
                      f"{'rule' if c['gemv'] == tune.GEMV_DEFAULT else c['gemv'][:2]} page-ahead "
                      f"{({-1: 'by size', 0: 'off', 1: 'on'})[c['gemv'][2]]}")
    print(f"machine: {json.dumps(record['machine'])}")
    searched = sum(len(t) for t in record["timings"].values())
    unit = "tokens" if args.decode else "steps"
    allowed = "" if not bounded else (
        f" (allowed {record['allowed']:.2f} s: what {tune.PAYBACK_RUNS} {unit} would save back, their products and "
        f"timed kernels taking {record['per_run'] * 1e3:.1f} ms each)" if record["timings"]["all"] else
        f" (none begun: making its operands, {tune.Products.nbytes(shapes) / 1e6:.0f} MB, would take longer than "
        f"{tune.PAYBACK_RUNS} {unit} of {run_seconds * 1e3:.1f} ms would save back)")
    print(f"{len(shapes)} distinct products, {sum(shapes.values())} a {unit[:-1]}; searched {searched} "
          f"configurations in {record['seconds']:.2f} s{allowed}")
    print(f"default: {show(record['default'])}; chosen: {show(record['choice'])}; the step's products "
          f"{record['speedup']:.3f}x the default's speed")
    kernels = record["timings"].get("kernels", {})
    if kernels:
        print(f"generated kernels (the heaviest of {n_kernels}, compiled for each path): "
              + ", ".join(f"{p} {t * 1e3:.2f} ms" for p, t in kernels.items())
              + f"; chosen: {record['choice']['kernels'] or 'the default'} ({record['kernel_speedup']:.3f}x)")
    print(f"stored: {tune.store_path(record['machine'])}")
    if args.steps:
        for _ in range(3):                              # (recorded, then replayed and chained)
            run()
        times = {"default": [], "chosen": []}
        for i in range(2 * args.steps):
            which = ("default", "chosen")[i % 2]
            tune.apply(rt.lib, record["default" if which == "default" else "choice"])
            t = time.perf_counter()
            run()
            times[which].append(time.perf_counter() - t)
        tune.apply(rt.lib, record["choice"])
        d, c = (float(np.median(times[k])) for k in ("default", "chosen"))
        saved = d - c
        if record["choice"] == record["default"]:
            pay = (f"the default was kept: the search's {record['seconds']:.2f} s, once per machine, "
                   f"{record['seconds'] / d:.1f} {unit}' time, buy nothing here")
        elif saved > 0:
            pay = f"the search pays back after {record['seconds'] / saved:,.0f} {unit}"
        else:
            pay = "no time saved: the search does not pay back"
        print(f"{unit[:-1]} (median of {args.steps} each, alternating): default {d * 1e3:.1f} ms, chosen "
              f"{c * 1e3:.1f} ms; {pay}")


if __name__ == "__main__":
    main()
