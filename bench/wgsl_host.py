"""The WGSL runtime's host cost: what a jitted training step and a cached decoding step spend in Python and in wgpu-py
calls, with its replays chained (runtime/wgsl/chain.py), replayed per schedule (plan.py) and run through every
kernel function (neither), side by side in one process.

    python bench/wgsl_host.py                      # config S: 4 layers, 128 wide, block 64, batch 16
    python bench/wgsl_host.py --config XS --steps 6 --tokens 40
    python bench/wgsl_host.py --profile 10         # + where a chained step's Python goes (cProfile, 10 steps)

Every wgpu-py method the runtime calls is wrapped and timed (train_gpt.wgpu_meter); "outside" is the wall time minus
the time inside those calls: the Python of the step, the replay and the runtime. On lavapipe the GPU's work runs on
the CPU inside those calls (submit, read_buffer), so the wall time is lavapipe's; the host figures are what a real GPU
would also pay. Training: the median over --steps measured steps after --warmup (loss.item() each step, the inputs
uploaded each step). Decoding: greedy generate of --tokens and of 3x as many from a 4-token prompt; per token is the
difference over the extra tokens, so the prompt's prefill and the first recordings cancel out.
"""
import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from common import cpu_model, gpt_train_step  # noqa: E402
from train_gpt import CONFIGS, wgpu_meter  # noqa: E402

MODES = {"chained": dict(plans=True, chains=True), "replayed": dict(plans=True, chains=False),
         "kernels": dict(plans=False, chains=False)}


def set_mode(rt, mode):
    """The runtime replaying as `mode` says, from an empty pool (what a fresh process has)."""
    import gc
    from tinyllm.runtime.wgsl.plan import Plans
    gc.collect()
    rt.empty_cache()
    rt.plans = Plans() if MODES[mode]["plans"] else None
    rt.chains = MODES[mode]["chains"]


def train(tl, rt, meter, cfg, batch, mode, warmup, steps):
    from tinyllm.models.gpt import GPT, GPTConfig
    set_mode(rt, mode)
    tl.manual_seed(0)
    model = GPT(GPTConfig(**cfg, dropout=0.0)).to("wgsl")
    fn = profile.fn = tl.jit(gpt_train_step(model, tl.optim.AdamW(model.parameters(), lr=1e-3)))
    rng = np.random.default_rng(0)
    rows = []
    for i in range(warmup + steps):
        x = rng.integers(0, cfg["vocab_size"], (batch, cfg["block_size"]))
        meter.update(calls=0, seconds=0.0, dispatches=0)
        t = time.perf_counter()
        loss = fn(tl.tensor(x, device="wgsl"), tl.tensor((7 * x + 3) % cfg["vocab_size"], device="wgsl")).item()
        if i >= warmup:
            rows.append((time.perf_counter() - t, meter["seconds"], meter["calls"], meter["dispatches"]))
    assert np.isfinite(loss)
    return np.median(np.array(rows), axis=0)


def decode(tl, rt, meter, cfg, mode, tokens):
    from tinyllm.models.gpt import GPT, GPTConfig
    set_mode(rt, mode)
    tl.manual_seed(0)
    model = GPT(GPTConfig(**cfg, dropout=0.0)).to("wgsl")
    prompt = tl.tensor(np.array([[1, 2, 3, 4]]), device="wgsl")
    model.generate(prompt, tokens, temperature=0.0)  # (records the decode step)
    figures = []
    for n in (tokens, 3 * tokens):
        meter.update(calls=0, seconds=0.0, dispatches=0)
        t = time.perf_counter()
        model.generate(prompt, n, temperature=0.0)
        figures.append(np.array([time.perf_counter() - t, meter["seconds"], meter["calls"], meter["dispatches"]]))
    return (figures[1] - figures[0]) / (2 * tokens)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="S", choices=sorted(CONFIGS))
    ap.add_argument("--warmup", type=int, default=6)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=20)
    ap.add_argument("--profile", type=int, default=0, help="then profile this many chained training steps")
    args = ap.parse_args()
    import tinyllm as tl
    rt = tl.runtime.get("wgsl")
    meter = wgpu_meter()
    cfg, batch = CONFIGS[args.config]
    cfg = dict(cfg, block_size=max(cfg["block_size"], 4 * args.tokens + 4))  # (decoding fits in the block)
    print(f"# bench/wgsl_host.py {' '.join(sys.argv[1:])}  {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    print(f"# CPU: {cpu_model()}; adapter: {rt.info['device']} ({rt.info['backend']}, {rt.info['adapter_type']}); "
          f"C encoder: {'yes' if rt.gpu.native is not None else 'no (wgpu-py calls)'}; load average "
          f"{os.getloadavg()[0]:.1f}")
    print(f"# config {args.config}: {CONFIGS[args.config][0]}, batch {batch}; decoding with block {cfg['block_size']}")
    print()
    print("| what | WGSL replay | wall ms | inside wgpu-py ms | Python outside ms | µs a dispatch | wgpu-py calls "
          "| dispatches |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    train_cfg = CONFIGS[args.config][0]
    for what, run in (("training step", lambda m: train(tl, rt, meter, train_cfg, batch, m, args.warmup,
                                                         args.steps)),
                      ("decode token", lambda m: decode(tl, rt, meter, cfg, m, args.tokens))):
        for mode in MODES:
            wall, inside, calls, dispatches = run(mode)
            outside = (wall - inside) * 1e3
            print(f"| {what} | {mode} | {wall * 1e3:,.1f} | {inside * 1e3:,.1f} | {outside:.2f} | "
                  f"{outside * 1e3 / max(dispatches, 1):.1f} | {calls:,.1f} | {dispatches:,.0f} |", flush=True)
    if args.profile:
        profile(tl, rt, meter, train_cfg, batch, args.profile)
    set_mode(rt, "chained")


def profile(tl, rt, meter, cfg, batch, steps):
    """The functions a chained training step's Python spends most in, outside the wgpu-py calls (cProfile's own
    time per function, per step; the wgpu-py calls and the meter's wrappers left out)."""
    import cProfile
    import pstats
    train(tl, rt, meter, cfg, batch, "chained", 6, 1)   # (recorded, replayed, chained: as the table's)
    fn, pr = profile.fn, cProfile.Profile()
    rng = np.random.default_rng(1)
    pr.enable()
    for _ in range(steps):
        x = rng.integers(0, cfg["vocab_size"], (batch, cfg["block_size"]))
        fn(tl.tensor(x, device="wgsl"), tl.tensor((7 * x + 3) % cfg["vocab_size"], device="wgsl")).item()
    pr.disable()
    stats = pstats.Stats(pr).stats
    own = sorted(((tt / steps * 1e3, f"{os.path.relpath(f, ROOT) if f.startswith(ROOT) else os.path.basename(f)}:"
                   f"{line}({name})") for (f, line, name), (_, _, tt, _, _) in stats.items()
                  if "wgpu" not in f and "wgsl_host" not in f and "train_gpt" not in f
                  and "_thread.lock" not in name), reverse=True)  # (locks: read_buffer waiting for the GPU)
    print(f"\nWhere a chained step's Python goes ({steps} steps, cProfile's own time per step, ms):")
    for ms, where in own[:12]:
        print(f"  {ms:7.3f}  {where}")


if __name__ == "__main__":
    main()
