"""The examples on a busy machine: tinyllm's default thread count against its own one-thread speed, with a busy loop
(another process's `while True: pass`) pinned to the last core beside it (busy2: one on each of the last two
cores), and on the quiet machine against two threads (issue 42: a busy machine must not make tinyllm slower than
one thread; a quiet one keeps its two-thread speed).

    python bench/busy.py                         # sample.py, gpt.py and mnist_cnn.py, 3 runs each (median)
    python bench/busy.py --workloads sample --repeats 5 --loads quiet,busy,busy2
    python bench/busy.py --workloads sample,gpt --loads quiet --bind true   # threads pinned, as the benches pin them

Each run is a fresh process of the example, as a user starts it; the threads are not pinned (OMP_PROC_BIND unset),
as a user's are not: the scheduler places them (--bind sets OMP_PROC_BIND for the examples). Speeds: sample.py's and
gpt.py's tokens/s as they print them, mnist_cnn.py's 1 / wall time of its training. The ratio columns divide by the
one-thread speed measured under the same load in the same run."""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import cpu_description  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable


def example(name, *args):
    return [PY, os.path.join(ROOT, "examples", name), *args]


def workloads(tmp):
    """name -> (command, regex of its speed in the output, speed from the match: higher is faster, unit)."""
    ckpt = os.path.join(tmp, "sample-ckpt")
    return {
        "sample": (example("sample.py", "--ckpt-dir", ckpt, "--max-new-tokens", "400", "--seed", "1"),
                   r"([\d.,]+) tokens/s", lambda m: float(m.group(1).replace(",", "")), "tokens/s"),
        "gpt": (example("gpt.py", "--ckpt-dir", os.path.join(tmp, "train"), "--overwrite", "--max-iters", "60",
                        "--eval-interval", "60", "--eval-iters", "2", "--sample-tokens", "0"),
                r"([\d,]+) tokens/s while training", lambda m: float(m.group(1).replace(",", "")), "tokens/s"),
        "mnist": (example("mnist_cnn.py", "--fail-under", "0"),
                  r"final test accuracy [\d.]+% in ([\d.]+) s", lambda m: 1.0 / float(m.group(1)), "1/s"),
    }


def run(cmd, pattern, speed, threads, bind=None):
    env = {k: v for k, v in os.environ.items() if k not in ("TINYLLM_THREADS", "OMP_NUM_THREADS", "OMP_PROC_BIND")}
    if bind:
        env["OMP_PROC_BIND"] = bind
    if threads:
        env["TINYLLM_THREADS"] = str(threads)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1200)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise SystemExit(f"busy.py: {' '.join(cmd)} failed:\n{out[-2000:]}")
    m = None
    for line in out.splitlines():
        m = re.search(pattern, line.strip()) or m
    if m is None:
        raise SystemExit(f"busy.py: no speed in the output of {' '.join(cmd)}:\n{out[-2000:]}")
    return speed(m)


class BusyLoops:
    """`n` other processes spinning while the block runs, each pinned to a core of its own, the last cores first."""
    def __init__(self, n):
        self.cpus = sorted(os.sched_getaffinity(0))[::-1][:n]

    def __enter__(self):
        self.procs = [subprocess.Popen([PY, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
                      for cpu in self.cpus]
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
            p.wait()


LOADS = {"quiet": 0, "busy": 1, "busy2": 2}  # the busy loops beside the example


def describe_cpu():
    d = cpu_description()
    return (f"{d['model']} ({d['family']}); {len(os.sched_getaffinity(0))} cores; {' '.join(d['flags'])}; "
            f"caches {', '.join(d['caches'])}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workloads", default="sample,gpt,mnist", help="comma-separated: sample, gpt, mnist")
    p.add_argument("--loads", default="quiet,busy", help=f"comma-separated: {', '.join(LOADS)} (busy loops beside)")
    p.add_argument("--repeats", type=int, default=3, help="runs per setting; the table shows the median")
    p.add_argument("--bind", default=None, help="OMP_PROC_BIND for the examples (default: unset)")
    args = p.parse_args()
    loads = [w.strip() for w in args.loads.split(",")]
    if set(loads) - set(LOADS):
        raise SystemExit(f"busy.py: unknown loads {sorted(set(loads) - set(LOADS))}; choose from {list(LOADS)}")
    tmp = tempfile.mkdtemp(prefix="tinyllm-busy-")
    table = workloads(tmp)
    names = [w.strip() for w in args.workloads.split(",")]
    unknown = set(names) - set(table)
    if unknown:
        raise SystemExit(f"busy.py: unknown workloads {sorted(unknown)}; choose from {sorted(table)}")
    if "sample" in names:  # a model to sample from: a short training run of gpt.py's default model
        subprocess.run(example("gpt.py", "--ckpt-dir", os.path.join(tmp, "sample-ckpt"), "--max-iters", "20",
                               "--eval-interval", "20", "--eval-iters", "1", "--sample-tokens", "0"),
                       check=True, capture_output=True, cwd=ROOT)
    print(f"CPU: {describe_cpu()}; OMP_PROC_BIND {args.bind or 'unset'}")
    print(f"{'workload':8} {'load':6} {'default':>10} {'1 thread':>10} {'2 threads':>10} {'default/1':>10} "
          f"{'default/2':>10}  unit")
    for name in names:
        cmd, pattern, speed, unit = table[name]
        for load in loads:
            loops = LOADS[load]
            settings = (0, 1) if loops else (0, 1, 2)
            speeds = {t: [] for t in settings}
            for _ in range(args.repeats):  # interleaved, so a drift in the machine's speed hits every setting
                for t in settings:
                    with BusyLoops(loops):
                        speeds[t].append(run(cmd, pattern, speed, t, args.bind))
            med = {t: statistics.median(v) for t, v in speeds.items()}
            two = f"{med[2]:10.4g}" if 2 in med else f"{'':10}"
            vs2 = f"{med[0] / med[2]:10.2f}" if 2 in med else f"{'':10}"
            print(f"{name:8} {load:6} {med[0]:10.4g} {med[1]:10.4g} {two} {med[0] / med[1]:10.2f} {vs2}  {unit}",
                  flush=True)


if __name__ == "__main__":
    main()
