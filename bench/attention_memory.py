"""Peak memory and step time of one GPT training step against sequence length, with and without FlashAttention.

    python bench/attention_memory.py                       # T = 128 ... 2048, tinyllm-c with/without flash, torch
    python bench/attention_memory.py --T 128 256 512 --kinds flash plain
    python bench/attention_memory.py --max-quadratic-T 1024  # no unflashed tinyllm / manual torch runs above T = 1024
    python bench/attention_memory.py --speed --T 512 1024 --steps 4   # step time only, flash and plain alternating

Config M otherwise (n_layer 6, n_head 6, n_embd 384, batch 8, vocab 65), block_size = T. One step = forward (loss)
+ backward + AdamW step + zero_grad, as bench/train_gpt.py. Each case runs in its own subprocess (bench/common.py's
worker environment, threads pinned): one warm-up step (schedules, kernels), then tinyllm.reset_peak_memory_stats() and
the measured steps; peak = tinyllm.max_memory_allocated() (every runtime buffer, counted until Python frees it),
time = the fastest measured step. The unflashed case runs with TINYLLM_FLASH=0, the same switch a user has.

torch (tests/torch_nanogpt.py, eager) runs beside it with its explicit masked-softmax attention and with
F.scaled_dot_product_attention (is_causal=True). torch has no allocator statistics on the CPU, so its memory
column is the growth of the process's peak resident set (ru_maxrss) from before the first step to after the
last, which counts the steps' transient buffers but also allocator slack (and, for tinyllm, its compiled schedules);
tinyllm's RSS growth is printed beside it, measured the same way.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

from common import worker_env  # bench/common.py: bench/ is the script directory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = dict(n_layer=6, n_head=6, n_embd=384, vocab_size=65)
BATCH = 8
MIB = 1 << 20


def _rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def worker(kind, T, steps, seed):
    import numpy as np
    rng = np.random.default_rng(seed)
    data = [rng.integers(0, CONFIG["vocab_size"], (BATCH, T)) for _ in range(steps + 1)]
    if kind.startswith("torch"):
        import torch
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        import torch_nanogpt as ref
        if kind == "torch-sdpa":
            ref.CausalSelfAttention.forward = _torch_sdpa_forward
        torch.manual_seed(seed)
        model = ref.GPT(ref.GPTConfig(block_size=T, **CONFIG))
        opt = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3, betas=(0.9, 0.95), eps=1e-8)

        def step(x):
            _, loss = model(torch.from_numpy(x), torch.from_numpy((7 * x + 3) % CONFIG["vocab_size"]))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.item()
        peak = None
    else:
        import tinyllm as tl
        from tinyllm.models.gpt import GPT, GPTConfig
        tl.manual_seed(seed)
        model = GPT(GPTConfig(block_size=T, **CONFIG))
        opt = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3)

        def step(x):
            _, loss = model(tl.tensor(x), tl.tensor((7 * x + 3) % CONFIG["vocab_size"]))
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.item()
        peak = tl
    rss0 = _rss_mib()  # the process's peak resident set before any step: the model and optimizer are in it
    step(data[0])  # warm-up: schedules, kernels, buffer pool
    if peak is not None:
        peak.reset_peak_memory_stats()
    times = []
    for x in data[1:]:
        start = time.perf_counter()
        loss = step(x)
        times.append(time.perf_counter() - start)
    out = dict(kind=kind, T=T, step_ms=min(times) * 1e3, loss=loss, rss_growth_mib=_rss_mib() - rss0)
    if peak is not None:
        out["peak_mib"] = peak.max_memory_allocated() / MIB
    print(json.dumps(out))


def speed_worker(T, rounds, seed):
    """Step times with and without the rewrite in one process, alternating step by step, so both see the same
    machine load; one warm-up step of each first."""
    import numpy as np
    import tinyllm as tl
    from tinyllm.models.gpt import GPT, GPTConfig
    from tinyllm.rewrite import flash
    tl.manual_seed(seed)
    model = GPT(GPTConfig(block_size=T, **CONFIG))
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3)
    x = np.random.default_rng(seed).integers(0, CONFIG["vocab_size"], (BATCH, T))
    times = {True: [], False: []}
    for r in range(rounds + 1):
        for mode in (True, False) if r % 2 else (False, True):
            flash.ENABLED = mode
            start = time.perf_counter()
            _, loss = model(tl.tensor(x), tl.tensor((7 * x + 3) % CONFIG["vocab_size"]))
            loss.backward()
            opt.step()
            opt.zero_grad()
            loss.item()
            if r:
                times[mode].append(time.perf_counter() - start)
    print(json.dumps({"T": T, "flash_ms": [t * 1e3 for t in times[True]], "plain_ms": [t * 1e3 for t in times[False]]}))


def _torch_sdpa_forward(self, x):
    import torch.nn.functional as F
    B, T, C = x.size()
    q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
    q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(B, T, C)
    return self.resid_dropout(self.c_proj(y))


def run_case(kind, T, args):
    env = worker_env(args.threads)
    env.update(TINYLLM_RUNTIME="c", TINYLLM_FLASH="0" if kind == "plain" else "1")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--T", str(T), "--steps", str(args.steps),
           "--seed", str(args.seed)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        return dict(kind=kind, T=T, error=f"exit {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def speed(args):
    import statistics
    print(f"\n{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; threads {args.threads}; "
          f"load average {os.getloadavg()[0]:.1f} at start; {args.steps} alternating rounds after one warm-up each\n")
    print("| T | flash ms min | plain ms min | plain/flash (min) | flash ms median | plain ms median "
          "| plain/flash (median) |")
    print("|---|---|---|---|---|---|---|")
    for T in args.T:
        env = worker_env(args.threads)
        env["TINYLLM_RUNTIME"] = "c"
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "speed", "--T", str(T), "--steps",
               str(args.steps), "--seed", str(args.seed)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-3000:])
            print(f"| {T} | failed (exit {proc.returncode}) |")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        f, p = r["flash_ms"], r["plain_ms"]
        print(f"| {T} | {min(f):,.0f} | {min(p):,.0f} | {min(p) / min(f):.2f} | {statistics.median(f):,.0f} "
              f"| {statistics.median(p):,.0f} | {statistics.median(p) / statistics.median(f):.2f} |", flush=True)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


def fmt(v, spec=",.0f"):
    return "—" if v is None else format(v, spec)


def ratio(a, b):
    return None if a is None or b is None else a / b


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--T", type=int, nargs="+", default=[128, 256, 512, 1024, 2048])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=1, help="measured steps per case (after one warm-up step)")
    p.add_argument("--max-quadratic-T", type=int, default=None,
                   help="skip the cases whose memory grows with T² (unflashed tinyllm, torch's manual attention) "
                        "above this T: at T = 2048 they need over 10 GiB")
    p.add_argument("--kinds", nargs="+", default=["flash", "plain", "torch-manual", "torch-sdpa"],
                   choices=["flash", "plain", "torch-manual", "torch-sdpa"], help="which cases to run")
    p.add_argument("--speed", action="store_true",
                   help="only time flash against plain, alternating step by step in one process (--steps rounds)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker == "speed":
        return speed_worker(args.T[0], args.steps, args.seed)
    if args.worker:
        return worker(args.worker, args.T[0], args.steps, args.seed)
    if args.speed:
        return speed(args)

    kinds = args.kinds
    rows = {}
    start = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    load = [os.getloadavg()[0]]
    for T in args.T:
        for kind in kinds:
            if kind in ("plain", "torch-manual") and args.max_quadratic_T is not None and T > args.max_quadratic_T:
                continue
            r = run_case(kind, T, args)
            rows[(kind, T)] = r
            load.append(os.getloadavg()[0])
            print(f"# {kind:<12} T={T:<5} {json.dumps(r)}", file=sys.stderr, flush=True)

    def get(kind, T, field):
        return rows.get((kind, T), {}).get(field)

    print(f"\n{start}; threads {args.threads}; load average {min(load):.1f}–{max(load):.1f}; config M (n_layer 6, "
          f"n_head 6, n_embd 384, batch {BATCH}, vocab 65); tinyllm on the C runtime\n")
    print("| T | peak MiB flash | peak MiB plain | plain/flash | flash growth × | plain growth × "
          "| step ms flash | step ms plain | plain/flash time "
          "| torch manual ms | torch SDPA ms | flash/torch-SDPA time "
          "| RSS growth MiB: flash / plain / torch manual / torch SDPA |")
    print("|" + "---|" * 13)
    prev = {}
    for T in args.T:
        pf, pp = get("flash", T, "peak_mib"), get("plain", T, "peak_mib")
        growth = {k: ratio(v, prev.get(k)) for k, v in (("flash", pf), ("plain", pp))}
        prev = {"flash": pf, "plain": pp}
        tf, tp = get("flash", T, "step_ms"), get("plain", T, "step_ms")
        tm, ts = get("torch-manual", T, "step_ms"), get("torch-sdpa", T, "step_ms")
        rss = " / ".join(fmt(get(k, T, "rss_growth_mib")) for k in ("flash", "plain", "torch-manual", "torch-sdpa"))
        print(f"| {T} | {fmt(pf)} | {fmt(pp)} | {fmt(ratio(pp, pf), '.2f')} | {fmt(growth['flash'], '.2f')} "
              f"| {fmt(growth['plain'], '.2f')} | {fmt(tf)} | {fmt(tp)} | {fmt(ratio(tp, tf), '.2f')} "
              f"| {fmt(tm)} | {fmt(ts)} | {fmt(ratio(tf, ts), '.2f')} | {rss} |")
    losses = {k: get(k, args.T[-1], "loss") for k in kinds}
    print(f"\nLoss after the last step at T = {args.T[-1]}: " + ", ".join(f"{k} {fmt(v, '.5f')}" for k, v in
                                                                         losses.items()))
    errors = [f"{k} T={T}: {r['error']}" for (k, T), r in rows.items() if "error" in r]
    if errors:
        print("Failed cases: " + "; ".join(errors))


if __name__ == "__main__":
    main()
