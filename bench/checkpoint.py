"""Gradient checkpointing: peak memory and step time of a GPT training step with and without it, tinyllm's C runtime
beside torch eager with torch.utils.checkpoint, same model, weights, data and threads.

    python bench/checkpoint.py                     # config M, 1 thread
    python bench/checkpoint.py --threads 2 --rounds 5

One step = forward + backward + AdamW step + zero_grad (bench/train_gpt.py's step, models, data and optimizer
settings). "checkpointed" recomputes every transformer block in the backward pass: tinyllm with
GPTConfig(checkpoint=True) (tinyllm.checkpoint around each block, policy "nothing_saveable"), torch by wrapping each
block in torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False).

Peak memory of the second step (the first that starts with AdamW state): tinyllm's max_memory_allocated() (every buffer its runtime holds, parameters and AdamW state
included) after reset_peak_memory_stats() at the start of the step. torch has no such counter on the CPU, so one
extra step per torch variant runs under torch.profiler with profile_memory=True: the allocations and frees it records,
summed in time order, give the peak above the step's start, to which the bytes held at the start (parameters,
AdamW state) are added. Both counters count live tensors, not the allocator's reserve, so the two are comparable.
Each variant's memory is measured in a process of its own (tinyllm's counter counts every buffer in the process).
Step time: the median over interleaved rounds (variants in a rotating order), all four in one process.

Correctness gate: checkpointing must not change the losses: each checkpointed variant's losses must equal its
plain twin's (tinyllm: exactly; torch: to 1e-6 relative), or the row is marked FAIL.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from common import SETTLE_S, worker_env  # bench/common.py: bench/ is the script directory
from train_gpt import BETAS, CONFIGS, LR, WEIGHT_DECAY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ["tinyllm-c", "tinyllm-c checkpointed", "torch", "torch checkpointed"]


def _torch_held(model, opt):
    """Bytes of the distinct storages the torch model and optimizer hold between steps."""
    import torch
    storages = {}
    tensors = list(model.parameters()) + [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    for t in tensors:
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())


def _torch_peak_during(fn):
    """(fn(), (peak bytes above the start while it ran, bytes still held at its end)), from torch.profiler's memory
    events."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        if e.tag == _EventType.Allocation:
            events.append((e.start_time_ns, e.extra_fields.alloc_size))
        stack.extend(e.children)
    live = peak = 0
    for _, size in sorted(events):
        live += size
        peak = max(peak, live)
    return out, (peak, live)


def _variants(config, seed, n_batches):
    """{variant name: step function}, every model with the same initial weights, and the batches."""
    import numpy as np
    import torch
    import tinyllm as tl
    from tinyllm.models.gpt import GPT, GPTConfig
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import torch_nanogpt as ref

    cfg, batch = CONFIGS[config]
    V = cfg["vocab_size"]
    rng = np.random.default_rng(seed)
    data = []
    for _ in range(n_batches):
        x = rng.integers(0, V, (batch, cfg["block_size"]))
        data.append((x, (7 * x + 3) % V))
    tl.manual_seed(seed)
    state = {k: np.array(v.numpy(), copy=True) for k, v in GPT(GPTConfig(**cfg)).state_dict().items()}

    def tinyllm_step(checkpoint):
        model = GPT(GPTConfig(**cfg, checkpoint=checkpoint)).to(device="c")
        model.load_state_dict(state)
        opt = model.configure_optimizers(weight_decay=WEIGHT_DECAY, learning_rate=LR, betas=BETAS)

        def step(x, y, measure=False):
            tl.reset_peak_memory_stats()
            _, loss = model(tl.tensor(x, device="c"), tl.tensor(y, device="c"))
            loss.backward()
            backward_peak = tl.max_memory_allocated()
            opt.step()
            opt.zero_grad()
            return loss.item(), (backward_peak, tl.max_memory_allocated())
        return step

    def torch_step(checkpoint):
        from torch.utils.checkpoint import checkpoint as torch_checkpoint
        model = ref.GPT(ref.GPTConfig(**cfg))
        model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
        if checkpoint:
            for block in model.transformer.h:
                block.forward = (lambda f: lambda x: torch_checkpoint(f, x, use_reentrant=False))(block.forward)
        model.train()
        opt = model.configure_optimizers(weight_decay=WEIGHT_DECAY, learning_rate=LR, betas=BETAS, eps=1e-8)

        def forward_backward(x, y):
            _, loss = model(torch.from_numpy(x), torch.from_numpy(y))
            loss.backward()
            return loss.item()

        def update():
            opt.step()
            opt.zero_grad(set_to_none=True)

        def step(x, y, measure=False):
            if not measure:
                loss = forward_backward(x, y)
                update()
                return loss, None
            held = _torch_held(model, opt)
            loss, (backward_peak, grown) = _torch_peak_during(lambda: forward_backward(x, y))
            _, (update_peak, _) = _torch_peak_during(update)
            return loss, (held + backward_peak, held + max(backward_peak, grown + update_peak))
        return step

    makers = {"tinyllm-c": lambda: tinyllm_step(False), "tinyllm-c checkpointed": lambda: tinyllm_step(True),
              "torch": lambda: torch_step(False), "torch checkpointed": lambda: torch_step(True)}
    return makers, data


def memory_worker(config, variant, seed):
    """The peak of the second step of one variant, alone in its process: tinyllm's counter counts every buffer of
    the process, so another model beside it would count too."""
    makers, data = _variants(config, seed, 2)
    step = makers[variant]()
    step(*data[0])
    loss, (backward_peak, peak) = step(*data[1], measure=True)
    print(json.dumps({"peak": peak, "backward_peak": backward_peak, "loss": loss}))


def time_worker(config, warmup, rounds, steps, seed):
    import torch
    makers, data = _variants(config, seed, 1 + warmup + rounds * steps)
    fns = {n: makers[n]() for n in VARIANTS}
    res = {n: {"first_s": None, "losses": [], "times": []} for n in VARIANTS}

    def run(name, i):
        time.sleep(SETTLE_S)
        t = time.perf_counter()
        res[name]["losses"].append(fns[name](*data[i])[0])
        return time.perf_counter() - t

    for name in VARIANTS:  # the first step builds schedules and compiles kernels
        res[name]["first_s"] = run(name, 0)
    i = 1
    for _ in range(warmup):
        for name in VARIANTS:
            run(name, i)
        i += 1
    for r in range(rounds):
        for name in VARIANTS[r % 4:] + VARIANTS[:r % 4]:
            for s in range(steps):
                res[name]["times"].append(run(name, i + s))
        i += steps
    info = {"torch": f"torch {torch.__version__}, {torch.get_num_threads()} threads", "load_end": os.getloadavg()[0]}
    print(json.dumps({"info": info, "results": res}))


def _run_worker(args, *extra):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--config", args.config, "--threads",
           str(args.threads), "--warmup", str(args.warmup), "--rounds", str(args.rounds), "--steps", str(args.steps),
           "--seed", str(args.seed), *extra]
    proc = subprocess.run(cmd, env=worker_env(args.threads), capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"worker {' '.join(extra)} failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="M", choices=sorted(CONFIGS))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=1, help="warm-up steps after the first")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    p.add_argument("--steps", type=int, default=2, help="timed steps per variant per round")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the raw results here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--memory-of", choices=VARIANTS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        if args.memory_of:
            memory_worker(args.config, args.memory_of, args.seed)
        else:
            time_worker(args.config, args.warmup, args.rounds, args.steps, args.seed)
        return

    cfg, batch = CONFIGS[args.config]
    load = os.getloadavg()[0]
    out = _run_worker(args)
    res = out["results"]
    for name in VARIANTS:
        mem = _run_worker(args, "--memory-of", name)
        res[name].update(mem)

    print("Gradient checkpointing of every block, GPT training step (forward + backward + AdamW + zero_grad)")
    print(f"config {args.config} {cfg} batch {batch}; {args.threads} thread(s); {out['info']['torch']}; "
          f"load average {load:.1f} at start, {out['info']['load_end']:.1f} at end")
    print(f"step ms: median of {args.rounds} interleaved rounds x {args.steps} steps (min-max); peak MiB: most "
          "memory held at once, parameters and AdamW state included (torch: profiler, see --help), during forward + "
          "backward and during the whole step (+ AdamW update)\n")
    print("| variant | fwd+bwd peak MiB | step peak MiB | step ms | fwd+bwd peak vs plain | step peak vs plain "
          "| time vs plain | loss check |")
    print("|---|---|---|---|---|---|---|---|")
    for name in VARIANTS:
        r = res[name]
        plain = res[plain_name(name)]
        med = statistics.median(r["times"]) * 1e3
        ratio_b = r["backward_peak"] / plain["backward_peak"]
        ratio_m = r["peak"] / plain["peak"]
        ratio_t = med / (statistics.median(plain["times"]) * 1e3)
        if name == plain_name(name):
            check = ""
        elif name.startswith("tinyllm"):
            check = "same" if r["losses"] == plain["losses"] else "FAIL"
        else:
            same = all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(r["losses"], plain["losses"]))
            check = "same (1e-6)" if same else "FAIL"
        print(f"| {name} | {r['backward_peak'] / 2**20:,.1f} | {r['peak'] / 2**20:,.1f} | {med:,.0f} "
              f"({min(r['times']) * 1e3:,.0f}-{max(r['times']) * 1e3:,.0f}) | {ratio_b:.2f} | {ratio_m:.2f} | "
              f"{ratio_t:.2f} | {check} |")
    tl_c, torch_c = res["tinyllm-c checkpointed"], res["torch checkpointed"]
    time_ratio = statistics.median(tl_c["times"]) / statistics.median(res["tinyllm-c"]["times"])
    for what, key in (("fwd+bwd", "backward_peak"), ("whole-step", "peak")):
        ratio = tl_c[key] / res["tinyllm-c"][key]
        print(f"{'' if key == 'peak' else chr(10)}target (issue 5): tinyllm-c checkpointed {what} peak <= 0.60x and "
              f"step time <= 1.40x of plain: {ratio:.2f}x, {time_ratio:.2f}x: "
              f"{'met' if ratio <= 0.6 and time_ratio <= 1.4 else 'NOT met'}")
    print(f"tinyllm-c checkpointed vs torch checkpointed: peak {tl_c['peak'] / torch_c['peak']:.2f}x, "
          f"step time {statistics.median(tl_c['times']) / statistics.median(torch_c['times']):.2f}x; "
          f"first step s: " + ", ".join(f"{n} {res[n]['first_s']:.2f}" for n in VARIANTS))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


def plain_name(name):
    return name.replace(" checkpointed", "")


if __name__ == "__main__":
    main()
