"""Data-parallel training over MPI (tinyllm.distributed, issue 26): one process beside two ranks, same global batch.

    python bench/distributed.py            # config M, global batch 8: 1 process x 2 threads, 2 ranks x 1 thread
                                           # (DDP, DDP under no_sync, ZeRO-1), 1 process x 1 thread; eager and jit
    python bench/distributed.py --quick    # smoke run: few steps
    python bench/distributed.py --config S --quick   # smaller model
    python bench/distributed.py --bucket-cap-mb 5     # DDP with smaller buckets than torch's 25 MB
    python bench/distributed.py --jobs 1x2 2x1 --variants ddp no_sync --no-jit   # a part of it

The step is bench/train_gpt.py's tinyllm step (bench/common.py's gpt_train_step: forward, backward, AdamW step,
zero_grad, then loss.item()) on the C runtime, with its model (tinyllm.models.gpt.GPT, CONFIGS), its initial weights
(seeded) and its data (random tokens, targets a fixed bigram map), AdamW grouped as nanoGPT (weight decay 0.1 on 2-D
weights), lr 1e-3, betas (0.9, 0.95). Three jobs, each in its own processes, one after the other:

    1 x 2   one process, TINYLLM_THREADS=2, the global batch B;
    2 x 1   `mpirun --allow-run-as-root --oversubscribe --bind-to core -n 2`, TINYLLM_THREADS=1 in each rank, B/2
            rows each (rank r the r-th half of the same global batch). Variants, interleaved in a rotating order:
              ddp      DistributedDataParallel(model, bucket_cap_mb=--bucket-cap-mb, torch's 25 by default):
                       bucketed non-blocking all-reduces overlapped with backward;
              no_sync  the same wrapper with forward and backward under ddp.no_sync(): no communication at all
                       (the ranks' weights drift apart; only its time is used);
              zero     the unwrapped model with ZeroRedundancyOptimizer(AdamW's param groups): gradients
                       reduce-scattered and parameters all-gathered inside opt.step(), not overlapped;
            and, once per round, the all-reduce alone: flat float32 arrays of the sizes of DDP's buckets for this
            config, all-reduced (AVG) by one realize of IALLREDUCE + WAIT nodes (what DDP builds) with nothing else
            running, the ranks lined up by a barrier first; beside it mpi4py's own Allreduce of the same arrays;
    1 x 1   one process, TINYLLM_THREADS=1, the global batch B: the reference for the scaling efficiency.
Every variant runs eagerly and through tinyllm.jit ("+jit": from the fourth step on the recorded kernels replay,
the collectives included). Each process gets OMP_NUM_THREADS / TINYLLM_THREADS set before anything is imported and
OMP_PROC_BIND=true (bench/common.py's worker_env); under mpirun each rank is bound to its own core (--bind-to core:
with OMP_PROC_BIND=true and no binding both ranks would pin their main thread to the same first core).

Timing: 1 first step (kernels compile or load from the cache; schedules are built), warm-up steps, then rounds;
in each round every variant runs a few steps back to back (the ranks start each variant's steps together, after a
barrier and a short sleep so the previous variant's idle threads stop spinning). tokens/s of a round = steps x B x
block / wall time (in the 2-rank job the slower rank's time, B the global batch); tables give the median over the
rounds and the min-max spread.

Overlap: (i) the all-reduce alone (median over rounds), (ii) the step-time increase = DDP's step time - no_sync's
(medians); hidden = max(0, (i) - (ii)) / (i): the share of the communication the backward pass covered.

Scaling efficiency: 2 x 1 DDP tokens/s over 2 x (1 x 1's), and over 1 x 2's (issue 26's target: >= 0.9).

ZeRO-1 memory, per rank: the bytes the first step left allocated (tinyllm.memory_allocated() after the step and
zero_grad minus before it: the optimizer state that step created, the gradients being freed by zero_grad), for AdamW
unsharded (the ddp variant) and sharded (zero), beside the exact element counts of the optimizer state tensors and
the first step's peak above its start (tinyllm.max_memory_allocated() after reset_peak_memory_stats). Target: sharded
<= 0.55 x unsharded.

Correctness gates: every variant sees the same batches in the same order, so the loss of each step of ddp and zero
(the mean over the ranks of their halves' losses) must equal the single process's to --loss-rtol, and the ranks'
parameters must be bit-identical after the last step (a jit replay that skipped its collectives would fail both).
A variant that fails a gate is marked FAIL.
"""
import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

from common import SETTLE_S, gpt_train_step, worker_env  # bench/common.py: bench/ is the script directory
from matmul import cpu_description
from train_gpt import BETAS, CONFIGS, LR, WEIGHT_DECAY

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GLOBAL_BATCH = {"S": 16, "M": 8}  # train_gpt's batch (even: it splits over 2 ranks)
SCHEDULE = dict(warmup=2, rounds=4, steps=3)  # warm-up 2 after the first: a +jit variant measures replays only
QUICK = dict(warmup=2, rounds=2, steps=2)
ALLREDUCE_REPS = 3  # all-reduce-alone timings per round
SPEED_TARGET = 0.9  # issue 26: 2 ranks x 1 thread (DDP) >= 0.9 x 1 process x 2 threads
MEMORY_TARGET = 0.55  # issue 26: ZeRO-1 optimizer state per rank <= 0.55 x AdamW's unsharded
RANK_VARIANTS = ["ddp", "ddp+jit", "no_sync", "no_sync+jit", "zero", "zero+jit"]
SINGLE_VARIANTS = ["single", "single+jit"]
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "core", "-n", "2"]


# ---- the workers -------------------------------------------------------------------------------------------------
def worker(kind, config, variants, warmup, rounds, steps, seed, bucket_cap_mb):
    """kind "single": one process, the whole batch; kind "ranks": a rank of the MPI job, its half of it. Prints
    one JSON line (rank 0 only, with every rank's figures gathered)."""
    import numpy as np
    import tinyllm as tl
    from tinyllm.models.gpt import GPT, GPTConfig

    comm, rank, world = None, 0, 1
    if kind == "ranks":
        import tinyllm.distributed as dist
        from tinyllm.distributed import process_group
        from tinyllm.nn.parallel import DistributedDataParallel
        dist.init_process_group("mpi")
        comm, rank, world = process_group.comm(), dist.get_rank(), dist.get_world_size()

    def barrier():
        if comm is not None:
            comm.Barrier()

    def gather(value):  # every rank's value, on every rank (so every rank takes the same branches)
        return comm.allgather(value) if comm is not None else [value]

    load_start = os.getloadavg()[0]
    cfg, batch = CONFIGS[config][0], GLOBAL_BATCH[config]
    if batch % world:
        raise SystemExit(f"bench/distributed.py: global batch {batch} does not split over {world} ranks")
    rows = batch // world
    T, V = cfg["block_size"], cfg["vocab_size"]
    tokens = batch * T  # per step, over all ranks
    n_steps = 1 + warmup + rounds * steps
    rng = np.random.default_rng(seed)
    data = []
    for _ in range(n_steps):  # the global batches, the same on every rank; this rank trains on its rows
        x = rng.integers(0, V, (batch, T))
        y = (7 * x + 3) % V
        data.append((x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]))
    tl.manual_seed(seed)
    state = {k: np.array(v.numpy(), copy=True) for k, v in GPT(GPTConfig(**cfg)).state_dict().items()}

    def adamw(model):
        return model.configure_optimizers(weight_decay=WEIGHT_DECAY, learning_rate=LR, betas=BETAS)

    def build(name):
        """(step function, model, optimizer) of a variant."""
        model = GPT(GPTConfig(**cfg)).to(device="c")
        model.load_state_dict(state)
        base = name.split("+")[0]
        if base == "zero":
            groups = adamw(model)
            opt = dist.ZeroRedundancyOptimizer(groups.param_groups, optimizer_class=type(groups), **groups.defaults)
            step = gpt_train_step(model, opt)
        elif base in ("ddp", "no_sync"):
            net = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
            opt = adamw(model)
            if base == "ddp":
                step = gpt_train_step(net, opt)
            else:
                def step(x, y):
                    with net.no_sync():
                        _, loss = net(x, y)
                        loss.backward()
                    opt.step()
                    opt.zero_grad()
                    return loss
            buckets[name] = [sum(p.numel() for p in b) for b in net._buckets]
        else:
            opt = adamw(model)
            step = gpt_train_step(model, opt)
        fn = tl.jit(step) if name.endswith("+jit") else step
        return (lambda x, y: fn(tl.tensor(x, device="c"), tl.tensor(y, device="c")).item()), model, opt

    buckets = {}
    fns, models, opts = {}, {}, {}
    for name in variants:
        fns[name], models[name], opts[name] = build(name)
    res = {n: {"losses": [], "round_s": [], "step_s": [], "first_s": None, "state_bytes": None, "state_elems": None,
               "first_peak": None} for n in variants}

    def state_elements(opt):
        inner = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer keeps its shard's state in an inner AdamW
        return sum(v.numel() for s in inner.state.values() for v in s.values() if isinstance(v, tl.Tensor))

    def run(name, i):
        t = time.perf_counter()
        loss = fns[name](*data[i])
        elapsed = time.perf_counter() - t
        res[name]["losses"].append(loss)
        return elapsed

    i = 0
    for name in variants:  # the first step: schedules are built, kernels compiled or loaded; optimizer state made
        time.sleep(SETTLE_S)
        barrier()
        start = tl.memory_allocated()
        tl.reset_peak_memory_stats()
        res[name]["first_s"] = run(name, i)
        res[name]["state_bytes"] = tl.memory_allocated() - start
        res[name]["first_peak"] = tl.max_memory_allocated() - start
        res[name]["state_elems"] = state_elements(opts[name])
    i += 1
    for _ in range(warmup):
        for name in variants:
            time.sleep(SETTLE_S)
            barrier()
            run(name, i)
        i += 1

    allreduce = {"tinyllm_s": [], "mpi4py_s": []}
    sizes = next(iter(buckets.values()), None)
    if sizes is not None:
        from tinyllm import realizer
        from tinyllm.graph import build as build_node
        flats = [tl.tensor(np.full(n, 1.0 + rank, np.float32), device="c") for n in sizes]
        host = [np.full(n, 1.0 + rank, np.float32) for n in sizes]
        host_out = [np.empty_like(a) for a in host]
        MPI = process_group.mpi()

        def allreduce_alone():
            outs = [tl.Tensor._from_node(build_node("WAIT", build_node("IALLREDUCE", f.node, arg="AVG")), "c")
                    for f in flats]
            barrier()
            t = time.perf_counter()
            realizer.realize(*outs)
            mine = time.perf_counter() - t
            assert float(outs[0][0].item()) == 1.5, "the all-reduce alone gave a wrong mean"
            barrier()
            t = time.perf_counter()
            for a, o in zip(host, host_out):
                comm.Allreduce(a, o, op=MPI.SUM)
            raw = time.perf_counter() - t
            return max(gather(mine)), max(gather(raw))
        allreduce_alone()  # warm-up: the schedule is built once

    for r in range(rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]  # rotate who goes first
        for name in order:
            time.sleep(SETTLE_S)
            barrier()
            times = [run(name, i + s) for s in range(steps)]
            res[name]["round_s"].append(max(gather(sum(times))))  # the slower rank sets the pace
            res[name]["step_s"] += [max(t) for t in zip(*gather(times))]
        i += steps
        if sizes is not None:
            time.sleep(SETTLE_S)
            timings = [allreduce_alone() for _ in range(ALLREDUCE_REPS)]
            allreduce["tinyllm_s"].append(statistics.median(t[0] for t in timings))
            allreduce["mpi4py_s"].append(statistics.median(t[1] for t in timings))

    for name in variants:  # the global loss of each step: the mean of the ranks' losses on their equal halves
        losses = gather(res[name]["losses"])
        res[name]["losses"] = [float(np.mean(col)) for col in zip(*losses)]
        digest = hashlib.sha256()
        for k, v in models[name].state_dict().items():
            digest.update(k.encode() + np.ascontiguousarray(v.numpy()).tobytes())
        res[name]["params_identical"] = len(set(gather(digest.hexdigest()))) == 1
        res[name]["state_bytes_ranks"] = gather(res[name]["state_bytes"])
        res[name]["state_elems_ranks"] = gather(res[name]["state_elems"])
        res[name]["first_peak_ranks"] = gather(res[name]["first_peak"])
    c = tl.runtime._live.get("c")
    info = {"load_start": max(gather(load_start)), "load_end": max(gather(os.getloadavg()[0])),
            "cpus": gather(sorted(os.sched_getaffinity(0))),
            "threads": gather(c.lib.tl_get_num_threads() if c is not None and c.lib is not None else None),
            "tokens_per_step": tokens, "rows_per_rank": rows, "world": world, "steps_total": n_steps,
            "buckets": sizes, "allreduce": allreduce,
            "n_params": sum(p.numel() for p in models[variants[0]].parameters())}
    if rank == 0:
        print(json.dumps({"info": info, "results": res}))


# ---- the driver ----------------------------------------------------------------------------------------------------
def run_job(kind, threads, variants, config, sched, seed, bucket_cap_mb):
    env = worker_env(threads)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", kind, "--config", config,
           "--variants", *variants, "--seed", str(seed), "--bucket-cap-mb", str(bucket_cap_mb),
           "--warmup", str(sched["warmup"]), "--rounds", str(sched["rounds"]), "--steps", str(sched["steps"])]
    if kind == "ranks":
        cmd = MPIRUN + cmd
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not proc.stdout.strip():
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"bench/distributed.py: the {kind} job ({threads} thread(s)) failed (exit {proc.returncode})")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["info"]["wall_s"] = time.perf_counter() - t
    return out


def tok_s(info, r):
    """tokens/s of each round."""
    return [info["tokens_per_step"] * r["steps"] / s for s in r["round_s"]]


def summary(values):
    return statistics.median(values), min(values), max(values)


def fmt(med_lo_hi):
    m, lo, hi = med_lo_hi
    return f"{m:,.0f} ({lo:,.0f}–{hi:,.0f})"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="M", choices=sorted(GLOBAL_BATCH))
    p.add_argument("--quick", action="store_true", help="smoke run: few steps")
    p.add_argument("--warmup", type=int)
    p.add_argument("--rounds", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--variants", nargs="+", help="2-rank variants (default: " + " ".join(RANK_VARIANTS) + ")")
    p.add_argument("--no-jit", action="store_true", help="eager variants only")
    p.add_argument("--jobs", nargs="+", default=["1x2", "2x1", "1x1"], choices=["1x2", "2x1", "1x1"],
                   help="which jobs to run (processes x threads)")
    p.add_argument("--bucket-cap-mb", type=float, default=25,
                   help="DistributedDataParallel's bucket_cap_mb (torch's default 25)")
    p.add_argument("--loss-rtol", type=float, default=1e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the raw results here")
    p.add_argument("--worker", choices=["single", "ranks"], help=argparse.SUPPRESS)
    args = p.parse_args()
    sched = dict(QUICK if args.quick else SCHEDULE)
    for k in sched:
        if getattr(args, k) is not None:
            sched[k] = getattr(args, k)
    if args.worker:
        worker(args.worker, args.config, args.variants, sched["warmup"], sched["rounds"], sched["steps"], args.seed,
               args.bucket_cap_mb)
        return

    rank_variants = args.variants or RANK_VARIANTS
    single_variants = SINGLE_VARIANTS
    if args.no_jit:
        rank_variants = [v for v in rank_variants if "+jit" not in v]
        single_variants = [v for v in single_variants if "+jit" not in v]
    cpu = cpu_description()
    cfg, batch = CONFIGS[args.config][0], GLOBAL_BATCH[args.config]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    print(f"# bench/distributed.py {' '.join(sys.argv[1:])}  {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}"
          f"  commit {commit[:12]}{' plus uncommitted changes' if dirty else ''}")
    print(f"# CPU: {cpu['model']} ({cpu['family']}), {os.cpu_count()} cores, SIMD flags {' '.join(cpu['flags'])}, "
          f"caches {', '.join(cpu['caches'])}")
    print(f"# config {args.config} {cfg}, global batch {batch} x {cfg['block_size']} tokens; C runtime; "
          f"OMP_PROC_BIND={worker_env(1)['OMP_PROC_BIND']}; 2-rank job: {' '.join(MPIRUN)}; DDP bucket_cap_mb "
          f"{args.bucket_cap_mb:g}; 1 first + "
          f"{sched['warmup']} warm-up steps, then {sched['rounds']} rounds x {sched['steps']} steps per variant")
    print(f"# load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores at start (above ~0: other processes "
          "compete for the cores)")

    jobs = {}
    for key, kind, threads, variants in (("1x2", "single", 2, single_variants), ("2x1", "ranks", 1, rank_variants),
                                         ("1x1", "single", 1, single_variants)):
        if key not in args.jobs:
            continue
        out = jobs[key] = run_job(kind, threads, variants, args.config, sched, args.seed, args.bucket_cap_mb)
        info = out["info"]
        print(f"# job {key}: {info['wall_s']:.0f} s, load average {info['load_start']:.2f} -> {info['load_end']:.2f}, "
              f"main thread's CPUs per process at the end {info['cpus']}, C threads per process {info['threads']}",
              flush=True)
        for r in out["results"].values():
            r["steps"] = sched["steps"]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(jobs, f, indent=1)

    # ---- correctness gates ----
    ref = next((jobs[k]["results"]["single"]["losses"] for k in ("1x2", "1x1") if k in jobs), None)
    ok = {}
    for key, out in jobs.items():
        for name, r in out["results"].items():
            if name.startswith("no_sync"):
                ok[(key, name)] = True  # no gate: without communication the ranks' weights drift apart
                continue
            rel = 0.0 if ref is None else max(abs(a - b) / abs(b) for a, b in zip(r["losses"], ref))
            r["loss_rel"] = rel
            ok[(key, name)] = rel <= args.loss_rtol and r.get("params_identical", True)

    def cell(key, name):
        r = jobs.get(key, {"results": {}})["results"].get(name)
        if r is None:
            return "—"
        return fmt(summary(tok_s(jobs[key]["info"], r))) + ("" if ok[(key, name)] else " FAIL")

    def med(key, name):
        r = jobs.get(key, {"results": {}})["results"].get(name)
        return None if r is None else statistics.median(tok_s(jobs[key]["info"], r))

    def ratio(a, b, target=None):
        if a is None or b is None:
            return "—"
        v = a / b
        return f"{v:.2f}" + ("" if target is None else f" ({'meets' if v >= target else 'below'} {target})")

    modes = [("eager", ""), ("jit", "+jit")]
    if args.no_jit:
        modes = modes[:1]
    print("\n## Training tokens/s (median over rounds, min–max); FAIL: a correctness gate failed\n")
    cols = ["job"] + [m for m, _ in modes]
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join("---" for _ in cols) + "|")
    rows = [("1 process × 1 thread", "1x1", "single"), ("1 process × 2 threads", "1x2", "single"),
            ("2 ranks × 1 thread, DDP", "2x1", "ddp"), ("2 ranks × 1 thread, DDP under no_sync (no communication)",
                                                        "2x1", "no_sync"),
            ("2 ranks × 1 thread, ZeRO-1 (AdamW sharded)", "2x1", "zero")]
    for label, key, name in rows:
        print(f"| {label} | " + " | ".join(cell(key, name + suffix) for _, suffix in modes) + " |")

    print("\n## Ratios\n")
    print("| ratio | " + " | ".join(m for m, _ in modes) + " |")
    print("|---|" + "|".join("---" for _ in modes) + "|")
    lines = [
        ("DDP 2 × 1 / 1 × 2 (target ≥ 0.9)", lambda s: ratio(med("2x1", "ddp" + s), med("1x2", "single" + s),
                                                              SPEED_TARGET)),
        ("scaling efficiency: DDP 2 × 1 / (2 × (1 × 1))",
         lambda s: ratio(med("2x1", "ddp" + s), None if med("1x1", "single" + s) is None
                         else 2 * med("1x1", "single" + s))),
        ("1 × 2 / (2 × (1 × 1)) (threads' scaling, for comparison)",
         lambda s: ratio(med("1x2", "single" + s), None if med("1x1", "single" + s) is None
                         else 2 * med("1x1", "single" + s))),
        ("DDP / no_sync (the cost of communication)", lambda s: ratio(med("2x1", "ddp" + s),
                                                                       med("2x1", "no_sync" + s))),
        ("ZeRO-1 / DDP", lambda s: ratio(med("2x1", "zero" + s), med("2x1", "ddp" + s))),
    ]
    for label, f in lines:
        print(f"| {label} | " + " | ".join(f(s) for _, s in modes) + " |")

    info = jobs.get("2x1", {}).get("info", {})
    ar = info.get("allreduce", {})
    if ar.get("tinyllm_s"):
        sizes = info["buckets"]
        t_alone = summary(ar["tinyllm_s"])
        t_mpi = summary(ar["mpi4py_s"])
        print(f"\n## Overlap: DDP's buckets {', '.join(f'{n:,}' for n in sizes)} float32 elements "
              f"({sum(sizes) * 4 / 2**20:.1f} MiB in all)\n")
        print("| mode | (i) all-reduce alone (IALLREDUCE + WAIT), ms | same arrays, mpi4py Allreduce, ms | "
              "DDP step, ms | no_sync step, ms | (ii) step-time increase = DDP − no_sync, ms | "
              "hidden = max(0, (i) − (ii)) / (i) |")
        print("|---|---|---|---|---|---|---|")
        for mode, s in modes:
            d, n = jobs["2x1"]["results"].get("ddp" + s), jobs["2x1"]["results"].get("no_sync" + s)
            if d is None or n is None:
                continue
            sd, sn = statistics.median(d["step_s"]), statistics.median(n["step_s"])
            inc = sd - sn
            hidden = max(0.0, t_alone[0] - inc) / t_alone[0]
            print(f"| {mode} | {t_alone[0] * 1e3:.1f} ({t_alone[1] * 1e3:.1f}–{t_alone[2] * 1e3:.1f}) | "
                  f"{t_mpi[0] * 1e3:.1f} ({t_mpi[1] * 1e3:.1f}–{t_mpi[2] * 1e3:.1f}) | {sd * 1e3:.0f} | "
                  f"{sn * 1e3:.0f} | {inc * 1e3:+.1f} | {hidden:.0%} |")
        print("\n(i): the median over rounds of each round's median timing; step times: the median over all measured "
              "steps (each the slower rank's).")

    res = jobs.get("2x1", {}).get("results", {})
    if "ddp" in res and "zero" in res:
        d, z = res["ddp"], res["zero"]
        r = max(z["state_bytes_ranks"]) / max(d["state_bytes_ranks"])
        print(f"\n## ZeRO-1 memory per rank, config {args.config} ({info['n_params']:,} parameters)\n")
        print("| per rank | AdamW (unsharded, ddp) | ZeroRedundancyOptimizer (zero) | ratio |")
        print("|---|---|---|---|")
        print(f"| optimizer state elements (exp_avg + exp_avg_sq), ranks 0 / 1 | "
              f"{' / '.join(f'{v:,}' for v in d['state_elems_ranks'])} | "
              f"{' / '.join(f'{v:,}' for v in z['state_elems_ranks'])} | "
              f"{max(z['state_elems_ranks']) / max(d['state_elems_ranks']):.4f} |")
        print(f"| bytes the first step left allocated (memory_allocated), ranks 0 / 1 | "
              f"{' / '.join(f'{v:,}' for v in d['state_bytes_ranks'])} | "
              f"{' / '.join(f'{v:,}' for v in z['state_bytes_ranks'])} | "
              f"**{r:.4f}** ({'meets' if r <= MEMORY_TARGET else 'above'} ≤ {MEMORY_TARGET}) |")
        print(f"| first step's peak above its start (max_memory_allocated), MiB, ranks 0 / 1 | "
              f"{' / '.join(f'{v / 2**20:,.1f}' for v in d['first_peak_ranks'])} | "
              f"{' / '.join(f'{v / 2**20:,.1f}' for v in z['first_peak_ranks'])} | "
              f"{max(z['first_peak_ranks']) / max(d['first_peak_ranks']):.2f} |")

    print(f"\n## Correctness gates (loss of every step against the single process's, rtol {args.loss_rtol:g}; ranks' "
          "parameters bit-identical after the last step)\n")
    for key, out in jobs.items():
        for name, r in out["results"].items():
            extra = "" if "loss_rel" not in r else f"max loss rel. diff {r['loss_rel']:.1e}"
            ident = "" if out["info"]["world"] == 1 else f", parameters identical across ranks: " \
                                                         f"{r['params_identical']}"
            print(f"- {key} {name}: {extra}{ident}; first step {r['first_s']:.2f} s; final loss {r['losses'][-1]:.5f}"
                  f" {'ok' if ok[(key, name)] else 'FAIL'}")


if __name__ == "__main__":
    main()
