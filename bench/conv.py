"""conv2d forward + backward beside torch: same shapes, same threads, pinned (OMP_PROC_BIND=true).

    python bench/conv.py                  # 1 and 2 threads, the shapes below
    python bench/conv.py --threads 2

One timed call = y = conv2d(x, w, b, stride, padding); (y · r).sum().backward(), then the gradients are read, for
tinyllm on the C runtime (through tinyllm.jit: from the fourth call a replay; and eagerly) and torch eager. Each
(threads) runs in its own subprocess with every library's thread count set before import (bench/common.py).
Interleaved rounds; the table shows the median ms per call over rounds (min-max) and the ratio torch / tinyllm
(above 1: tinyllm is faster). Values are checked against torch first (rtol 1e-3).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import worker_env  # noqa: E402

# (name, N, C, H, W, O, k, stride, padding): the digits CNN's layers, a CIFAR-sized layer, a strided one
SHAPES = [("digits conv1", 64, 1, 8, 8, 16, 3, 1, 1), ("digits conv2", 64, 16, 4, 4, 32, 3, 1, 1),
          ("cifar 32x32", 32, 16, 32, 32, 32, 3, 1, 1), ("strided 5x5", 16, 32, 32, 32, 64, 5, 2, 2)]


def worker(threads, rounds, calls):
    import numpy as np
    import torch
    import tinyllm as tl
    import tinyllm.nn.functional as F
    torch.set_num_threads(threads)
    rows = []
    for name, n, c, h, w_, o, k, s, p in SHAPES:
        rng = np.random.default_rng(0)
        x, w, b = (rng.standard_normal(shape).astype(np.float32) for shape in ((n, c, h, w_), (o, c, k, k), (o,)))
        hy = (h + 2 * p - k) // s + 1
        r = rng.standard_normal((n, o, hy, (w_ + 2 * p - k) // s + 1)).astype(np.float32)

        def tl_step(x_, w_t, b_t, r_t):
            y = F.conv2d(x_, w_t, b_t, stride=s, padding=p)
            (y * r_t).sum().backward()
            return y

        jitted = tl.jit(tl_step)
        tx, tw, tb = (tl.tensor(a, device="c", requires_grad=True) for a in (x, w, b))
        tr = tl.tensor(r, device="c")

        def run_tl(fn):
            tw.grad = tb.grad = tx.grad = None
            y = fn(tx, tw, tb, tr)
            return y.numpy(), tw.grad.numpy(), tx.grad.numpy()

        px, pw, pb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
        pr = torch.tensor(r)

        def run_torch():
            pw.grad = pb.grad = px.grad = None
            y = torch.nn.functional.conv2d(px, pw, pb, stride=s, padding=p)
            (y * pr).sum().backward()
            return y.detach().numpy(), pw.grad.numpy(), px.grad.numpy()

        for got, want in zip(run_tl(tl_step), run_torch()):
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
        runs = {"tinyllm c+jit": lambda: run_tl(jitted), "tinyllm c": lambda: run_tl(tl_step), "torch": run_torch}
        for fn in runs.values():  # warm-up: compile, record (three calls for the jit), allocate
            for _ in range(4):
                fn()
        times = {key: [] for key in runs}
        for i in range(rounds):
            for key in list(runs)[i % len(runs):] + list(runs)[:i % len(runs)]:
                start = time.perf_counter()
                for _ in range(calls):
                    runs[key]()
                times[key].append((time.perf_counter() - start) / calls * 1e3)
        rows.append((name, {key: (statistics.median(v), min(v), max(v)) for key, v in times.items()}))
    print(json.dumps(rows))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.worker, args.rounds, args.calls)
    for threads in args.threads:
        cmd = [sys.executable, __file__, "--worker", str(threads), "--rounds", str(args.rounds), "--calls",
               str(args.calls)]
        proc = subprocess.run(cmd, env=worker_env(threads), capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"bench/conv.py: the {threads}-thread worker failed:\n{proc.stderr[-3000:]}")
        rows = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"\n{threads} thread(s), OMP_PROC_BIND={worker_env(threads)['OMP_PROC_BIND']}: conv2d forward + "
              "backward, ms per call, median over rounds (min-max)")
        print("| shape | tinyllm c+jit | tinyllm c | torch | torch / c+jit | torch / c |")
        print("|---|---|---|---|---|---|")
        for name, t in rows:
            cell = {k: f"{m:.2f} ({lo:.2f}-{hi:.2f})" for k, (m, lo, hi) in t.items()}
            print(f"| {name} | {cell['tinyllm c+jit']} | {cell['tinyllm c']} | {cell['torch']} | "
                  f"{t['torch'][0] / t['tinyllm c+jit'][0]:.2f} | {t['torch'][0] / t['tinyllm c'][0]:.2f} |")


if __name__ == "__main__":
    main()
