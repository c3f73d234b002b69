"""The quantized GEMV (decoding's products with int8 / int4 weights) against the memory roofline: whether its
kernel streams the weights as fast as memory gives them, or its arithmetic is the bound.

    python bench/qgemv.py                          # GPT-2-124M's layer shapes, int8 and int4, 1 and 2 threads
    python bench/qgemv.py --shapes 4096x4096 --formats int4 --threads 2 --group 128

A decoded token reads every weight once, so the floor is bytes / bandwidth (bench/decode.py's roofline). Each
shape K x N (x W^T with W N x K, a linear layer's) times runtime_c/qmatmul.c's weight-only GEMV (one row of x,
float32 activations; tl_qmatmul_q8 / tl_qmatmul_q4) two ways, in weights per second:

    memory   through enough copies of W (4 x the L3, 64 MiB at least) that each comes from memory, as a model's
             weights do when decoding; its GB/s (weights + float16 scales) over the read-only stream of the same
             threads (bench/common.py, measured in this run) is the roofline fraction
    cache    one copy over and over, hot in L2 / L3: the kernel's arithmetic alone
    needed   the weights per second the read-only stream carries: a kernel that is to reach the roofline must
             compute at least that fast ("arithmetic" in the bound column when even from cache it does not)

Per path: where the CPU has AVX512_VNNI (cpu.h's tl_cpu_int8_dot), the fixed-point kernel (x in 22- or 23-bit
fixed point per group, the products on vpdpbusd: runtime_c/qmatmul_fixed.c), and the AVX2 kernel that widens every
weight to float32 (tl_cpu_set_dot(0)); elsewhere the AVX2 kernel alone. The float32 GEMV (tl_sgemm) of the same
shape for comparison. Each thread count runs in its own subprocess with pinned threads (bench/common.py's worker_env);
best of --rounds interleaved rounds.
"""
import argparse
import json
import os
import subprocess
import sys
import time

from common import ROOT, cpu_description, limits_lines, machine_limits, worker_env

SHAPES = ["768x2304", "768x768", "768x3072", "3072x768"]  # GPT-2-124M: attention's qkv and proj, the MLP's two


def worker(threads, shapes, formats, group, rounds):
    import numpy as np
    from tinyllm import quantization as Q
    from tinyllm._kernels import ffi, lib

    limits = machine_limits(threads)
    stream = limits["read"][str(threads)]
    l3 = lib.tl_cpu_cache_size(3)
    ptr = lambda a, t="float *": ffi.cast(t, a.ctypes.data)  # noqa: E731
    rng = np.random.default_rng(0)
    paths = [("vnni", -1), ("avx2", 0)] if lib.tl_cpu_int8_dot() else [("avx2", -1)]
    rows = []
    for shape in shapes:
        k, n = map(int, shape.split("x"))
        x = rng.standard_normal((1, k)).astype(np.float32)
        y = np.empty((1, n), np.float32)
        for fmt in ["fp32", *formats]:
            w = rng.standard_normal((n, k)).astype(np.float32)
            arrays = (w,) if fmt == "fp32" else Q.quantize(w, fmt, group)  # (weights,) or (values, scales)
            nbytes = sum(a.nbytes for a in arrays)
            copies = max(2, max(64 << 20, 4 * l3) // nbytes)
            stored = [[np.copy(a) for a in arrays] for _ in range(copies)]
            many = [(ptr(c[0]),) if fmt == "fp32" else (ptr(c[0], "void *"), ptr(c[1], "uint16_t *"))
                    for c in stored]
            one = many[0]

            def call(ws, fmt=fmt, k=k, n=n):
                if fmt == "fp32":
                    lib.tl_sgemm(0, 1, 1, n, k, ptr(x), k, ws[0], k, 0.0, ptr(y), n)
                else:
                    fn = lib.tl_qmatmul_q8 if fmt == "int8" else lib.tl_qmatmul_q4
                    fn(1, n, k, group, ptr(x), k, ws[0], ws[1], ptr(y), n)
            row = {"shape": shape, "fmt": fmt, "bytes_per_weight": nbytes / (n * k), "paths": {}}
            for name, dot in [("", -1)] if fmt == "fp32" else paths:
                best = {"memory": float("inf"), "cache": float("inf")}
                for _ in range(rounds):
                    lib.tl_cpu_set_dot(dot)
                    t = time.perf_counter()
                    for ws in many:
                        call(ws)
                    best["memory"] = min(best["memory"], (time.perf_counter() - t) / copies)
                    call(one)
                    t = time.perf_counter()
                    for _ in range(copies):
                        call(one)
                    best["cache"] = min(best["cache"], (time.perf_counter() - t) / copies)
                lib.tl_cpu_set_dot(-1)
                row["paths"][name] = {where: n * k / t / 1e9 for where, t in best.items()}
            rows.append(row)
    print(json.dumps({"limits": limits, "stream": stream, "rows": rows,
                      "path": ffi.string(lib.tl_cpu_path_name(lib.tl_cpu_path())).decode()}))


def table(threads, res):
    stream = res["stream"]
    print(f"\n{threads} thread(s): G weights/s; read-only stream {stream:.1f} GB/s (this run); tinyllm's path "
          f"{res['path']}")
    print("\n".join(limits_lines(res["limits"])))
    print("\n| weights | K x N | kernel | memory (G weights/s) | GB/s | of stream | cache (G weights/s) | needed | "
          "bound |\n|---|---|---|---:|---:|---:|---:|---:|---|")
    for r in res["rows"]:
        needed = stream / r["bytes_per_weight"]
        for name, p in r["paths"].items():
            gbs = p["memory"] * r["bytes_per_weight"]
            bound = "arithmetic" if p["cache"] < 0.9 * needed else "memory"
            print(f"| {r['fmt']} | {r['shape']} | {name or 'sgemm'} | {p['memory']:.1f} | {gbs:.1f} | "
                  f"{gbs / stream:.0%} | {p['cache']:.1f} | {needed:.1f} | {bound} |")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=SHAPES, metavar="KxN")
    p.add_argument("--formats", nargs="+", default=["int8", "int4"], choices=["int8", "int4"])
    p.add_argument("--group", type=int, default=32, help="input features per scale")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.threads[0], args.shapes, args.formats, args.group, args.rounds)
        return
    cpu = cpu_description()
    print(f"# python bench/qgemv.py {' '.join(sys.argv[1:])}  {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    print(f"# CPU: {cpu['model']} ({cpu['family']}), {os.cpu_count()} cores; caches (per core, cpu0) "
          f"{', '.join(cpu['caches'])}; flags {' '.join(cpu['flags'])}; group {args.group}")
    for threads in args.threads:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--threads", str(threads), "--shapes",
               *args.shapes, "--formats", *args.formats, "--group", str(args.group), "--rounds", str(args.rounds)]
        proc = subprocess.run(cmd, env=worker_env(threads), capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            sys.exit(f"bench/qgemv.py: the {threads}-thread worker failed:\n{proc.stderr[-3000:]}")
        table(threads, json.loads(proc.stdout.strip().splitlines()[-1]))


if __name__ == "__main__":
    main()
