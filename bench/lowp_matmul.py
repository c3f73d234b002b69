"""bfloat16 matmul GFLOP/s on the C runtime: vdpbf16ps (AVX512_BF16) against the widening fallback and float32,
beside torch's float32 and bfloat16 matmul, side by side on the same threads.

    python bench/lowp_matmul.py                         # n x n x n, n = 256, 512, 1024, and the GPT shapes, 2 threads
    python bench/lowp_matmul.py --sizes 512 --threads 1 --rounds 9 --shapes

Columns: `f32` tinyllm's sgemm (tl_sgemm); `bf16 widen` tl_gemm_bf16_batched2 with the dot-product instructions
off (cpu.h's tl_cpu_set_dot(0): operands widened to float32 while packing); `bf16 dot` the same entry point on
vdpbf16ps (where the CPU has AVX512_BF16; else the column is absent); torch's torch.matmul on float32 and on
bfloat16 tensors. All products C = A B with A, B row-major; the GPT shapes (config M: 8 x 256 tokens, n_embd 384)
also with their transpositions (`x W^T` forward, `dY W` and `X^T dY` backward). The libraries are timed
interleaved for several rounds; the table shows the best timing of each, the one that ran undisturbed on a
machine shared with other processes. Threads: TINYLLM_THREADS / torch.set_num_threads, set before import.
"""
import argparse
import os
import sys
import time


def header(lib):
    flags = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                have = line.split(":", 1)[1].split()
                flags = " ".join(x for x in have if x.startswith(("avx512", "avx2", "fma", "f16c", "amx")))
                break
    caches = ", ".join(f"L{i} {lib.tl_cpu_cache_size(i) >> 10} KiB" for i in (1, 2, 3))
    print(f"CPU: {model}; flags: {flags}; per core: {caches}")
    print(f"tinyllm path: {['portable', 'avx2', 'avx512'][lib.tl_cpu_path()]}, bf16 dot (vdpbf16ps): "
          f"{'yes' if lib.tl_cpu_has_bf16_dot() else 'no'}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="*", default=[256, 512, 1024])
    p.add_argument("--shapes", action=argparse.BooleanOptionalAction, default=True, help="the GPT config M shapes")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    os.environ.setdefault("OMP_PROC_BIND", "true")
    os.environ["TINYLLM_THREADS"] = str(args.threads)
    import numpy as np
    import torch
    from tinyllm.runtime import get
    torch.set_num_threads(args.threads)
    rt = get("c")
    lib = rt.lib
    header(lib)
    dot = bool(lib.tl_cpu_has_bf16_dot())
    cases = [(0, 0, n, n, n, f"{n}") for n in args.sizes]
    if args.shapes:
        T, C = 2048, 384
        cases += [(0, 1, T, 3 * C, C, "qkv x W^T"), (0, 1, T, 4 * C, C, "fc x W^T"), (0, 1, T, C, 4 * C, "proj x W^T"),
                  (0, 0, T, C, 4 * C, "fc dY W"), (1, 0, 4 * C, C, T, "fc X^T dY"), (1, 0, C, 4 * C, T, "proj X^T dY")]
    rng = np.random.default_rng(0)
    cols = ["f32", "bf16 widen"] + (["bf16 dot"] if dot else []) + ["torch f32", "torch bf16"]
    print(f"\n{args.threads} threads, GFLOP/s (best of {args.rounds} interleaved rounds)")
    print("| product | M x N x K | " + " | ".join(cols) + " | " + ("bf16 dot / f32 |" if dot else "bf16 widen / f32 |"))
    print("|---|---|" + "---|" * (len(cols) + 1))
    for ta, tb, M, N, K, name in cases:
        a32 = rng.standard_normal((K, M) if ta else (M, K)).astype(np.float32)
        b32 = rng.standard_normal((N, K) if tb else (K, N)).astype(np.float32)
        at, bt = torch.from_numpy(a32).bfloat16(), torch.from_numpy(b32).bfloat16()
        a16, b16 = (t.view(torch.int16).numpy().view(np.uint16) for t in (at, bt))
        c32, c16 = np.zeros((M, N), np.float32), np.zeros((M, N), np.uint16)
        ta32, tb32 = torch.from_numpy(a32), torch.from_numpy(b32)
        op = lambda x, t: x.T if t else x  # noqa: E731

        def low(on):
            def run():
                lib.tl_cpu_set_dot(on)
                rt.call(lib.tl_gemm_bf16_batched2, 1, 1, ta, tb, M, N, K, a16, a16.shape[1], 0, 0, b16, b16.shape[1],
                        0, 0, c16, N, 0, 0)
            return run
        fns = {"f32": lambda: rt.call(lib.tl_sgemm, ta, tb, M, N, K, a32, a32.shape[1], b32, b32.shape[1], 0.0, c32,
                                      N),
               "bf16 widen": low(0), "bf16 dot": low(1),
               "torch f32": lambda: torch.matmul(op(ta32, ta), op(tb32, tb)),
               "torch bf16": lambda: torch.matmul(op(at, ta), op(bt, tb))}
        best = {c: float("inf") for c in cols}
        reps = max(1, int(3e8 / (M * N * K)))
        for c in cols:
            fns[c]()  # warm-up: first-touch, packing buffers
        for r in range(args.rounds):
            for c in cols[r % len(cols):] + cols[:r % len(cols)]:  # rotating order
                t = time.perf_counter()
                for _ in range(reps):
                    fns[c]()
                best[c] = min(best[c], (time.perf_counter() - t) / reps)
        lib.tl_cpu_set_dot(-1)
        g = {c: 2 * M * N * K / best[c] / 1e9 for c in cols}
        ratio = g["bf16 dot" if dot else "bf16 widen"] / g["f32"]
        print(f"| {name} | {M}x{N}x{K} | " + " | ".join(f"{g[c]:.0f}" for c in cols) + f" | {ratio:.2f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
