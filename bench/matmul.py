"""sgemm GFLOP/s: tinyllm's C kernel (tinyllm._kernels) against numpy (OpenBLAS) and torch, side by side.

    python bench/matmul.py                      # n = 64 ... 2048 and the GEMV table, 1 and 2 threads
    python bench/matmul.py --sizes 256 512 --threads 1 --rounds 9
    python bench/matmul.py --sizes --trans-n 0 --gemv-sizes 768 384x1536 --gemv-m 1  # the GEMV table alone
    python bench/matmul.py --sizes 256 512 1024 --gemv-sizes --openblas-coretype Haswell   # OpenBLAS's AVX2 kernel
    python bench/matmul.py --wgsl-sizes 64 128 256        # + the WGSL runtime (lavapipe: small sizes only)
    python bench/matmul.py --threads 1 --sizes --trans-n 0 --wgsl-sizes 1024 2048 4096   # on a GPU: WGSL alone

Each thread count runs in its own subprocess, with OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and
TINYLLM_THREADS set before anything is imported (and torch.set_num_threads), threads pinned with
OMP_PROC_BIND=true unless already set. OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are removed from
that environment, so numpy runs the OpenBLAS kernel it would pick for this CPU by itself (the
header says which one), unless --openblas-coretype names one: `--openblas-coretype Haswell` times numpy on
OpenBLAS's AVX2 kernel, the one it runs on a CPU without AVX-512, beside tinyllm's avx2 path. Within a
subprocess the three libraries are timed interleaved, in a rotating order, for several rounds of many
short timings; the table shows the best timing of
each, which on a machine shared with other processes is the one that ran undisturbed. Between
libraries the bench sleeps long enough for the previous library's idle threads to stop spinning,
so they do not steal a core from the next one. Builds the extension in place if it is missing.

The top lines name the CPU (model, family/model, its SIMD flags, cache sizes) and the path tinyllm picked
(runtime_c/cpu.h). tinyllm gets a column per instruction-set path this CPU supports (portable C, avx2,
avx512: each forced with tl_cpu_set_path around its calls); the ratios are those of the path it picks by
itself, which is marked with a '*'. With 2 or more threads, three more columns time the picked path with its threads
splitting each product another way than its rules (tl_sgemm_set_split, a choice the tuner makes): `columns` (each
thread a share of C's columns: it packs its own B strips and all of A), `private B` (the rules' split with each
thread packing the whole B panel it reads) and `shared B` (the rules' split with the panel always packed in shares
that the other threads read). Timed back to back, the same product over and over, they can differ more than in a
model (where products of different shapes follow each other): time a step or a pass (`python -m tinyllm.tune`)
before choosing.

The GEMV table times products with M = 1 or 4 rows against a K x N weight (a size n: K = N = n; KxN: the
shape of a linear layer with K inputs and N outputs, by default those of config M's GPT decoding one token:
attention's qkv, the MLP's two), stored K x N (`x W`) or N x K (`x W^T`, as a linear layer's weight is), in
GB/s of weight read: each timing runs through enough
copies of the weight (at least 128 MiB, 4x the L3) that each one comes from memory, as a model's weights do
when decoding. Beside it, a STREAM-style copy of a 256 MiB array (tl_cpu_stream_copy: memcpy of one share per
thread, on the worker's threads), in GB/s of bytes read plus written, measured in the same worker: the rate the
memory system gives these cores. gemv/copy compares the two.

Every worker also measures the machine's limits (bench/common.py, machine_limits: the FMA peak of each path at 1 and
the worker's thread count, memory bandwidth) and the sgemm table gives the picked path's and numpy's GFLOP/s as a
fraction of the picked path's FMA peak at the worker's thread count.

With --wgsl-sizes, the worker of the fewest threads also times tinyllm's WGSL runtime at those sizes (per tile
configuration of --wgsl-tiles), in a table of its own that names the adapter, beside torch: on CUDA when torch sees
a GPU (fp32 with TF32 off, and a TF32 column), else on the CPU. Two WGSL figures: `wgsl`, (a @ b).realize() many
times back to back with one read-back as the fence (the runtime's Python per product included where the GPU
outruns it), and `kernel`, the matmul dispatch alone recorded many times into one command buffer (the GPU's
time). `--sizes` with no sizes and `--trans-n 0` leave the C / numpy table out (no C extension needed):

    python bench/matmul.py --threads 1 --sizes --trans-n 0 --wgsl-sizes 1024 2048 4096 \\
        --wgsl-tiles auto 128x128x8x8x8 64x64x16x4x4
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

from common import (SETTLE_S, copy_bandwidth, cpu_description,  # bench/common.py: bench/ is the script directory
                    limits_lines, machine_limits, peak_gflops, worker_env)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = [64, 128, 256, 512, 1024, 2048]
GEMV_SIZES = ["384x1152", "384x1536", "1536x384", "768", "1024", "2048", "4096"]
SAMPLE_S = 0.002  # one timing: short, so that some land in moments when no other process runs
ROUND_S = 0.1     # time per library per round


def load_sgemm():
    try:
        from tinyllm import _kernels
    except ImportError:
        sys.path.insert(0, os.path.join(ROOT, "runtime_c"))
        from build import build_in_place
        build_in_place()
        from tinyllm import _kernels
    return _kernels


def wgsl_rows(sizes, rounds, torch, tile_configs=(None,)):
    """GFLOP/s of tinyllm's WGSL matmul (square, float32), per size and tile configuration, beside torch's:
    on CUDA when torch sees a GPU (fp32 with TF32 off, and TF32), else on the CPU. Best of `rounds` timings.

    wgsl: `(a @ b).realize()` products back to back, one read-back of one element as the fence: what a user
    gets, the runtime's Python per product included (it overlaps the GPU's work, so it counts only where it is
    longer). kernel: the same matmul dispatch recorded many times into one command buffer, one submit, one
    read-back of one element: the GPU's time per product. err: max |C - A·B| / max |A·B| over 8 rows, against
    float64 on the host."""
    import numpy as np
    import tinyllm as tl
    from tinyllm import dtype as dt
    from tinyllm.runtime.wgsl import render
    rt = tl.runtime.get("wgsl")
    cuda = torch is not None and torch.cuda.is_available()
    rows = []

    def best_time(run, target_s=0.3, max_reps=200):
        """Best seconds per call of run(reps) (reps calls and their fence) over `rounds` timings."""
        t = time.perf_counter()
        run(1)
        reps = max(1, min(max_reps, int(target_s / max(time.perf_counter() - t, 1e-6))))
        best = float("inf")
        for _ in range(rounds):
            t = time.perf_counter()
            run(reps)
            best = min(best, (time.perf_counter() - t) / reps)
        return best

    for n in sizes:
        flops = 2.0 * n ** 3
        rng = np.random.default_rng(n)
        a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
        want = a[:8].astype(np.float64) @ b.astype(np.float64)
        ref = {}
        if cuda:
            xa, xb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
            out = torch.empty_like(xa)
            for key, tf32 in (("torch", False), ("torch_tf32", True)):
                torch.backends.cuda.matmul.allow_tf32 = tf32

                def run_torch(reps):
                    for _ in range(reps):
                        torch.matmul(xa, xb, out=out)
                    torch.cuda.synchronize()
                ref[key] = flops / best_time(run_torch) / 1e9
            torch.backends.cuda.matmul.allow_tf32 = False
            del xa, xb, out
        elif torch is not None:
            xa, xb = torch.from_numpy(a), torch.from_numpy(b)
            ref["torch"] = flops / best_time(lambda reps: [torch.matmul(xa, xb) for _ in range(reps)]) / 1e9
        ga, gb = tl.tensor(a, device="wgsl"), tl.tensor(b, device="wgsl")
        va, vb = rt.from_numpy(a, dt.float32).data, rt.from_numpy(b, dt.float32).data
        for tiles in tile_configs:
            if tiles:
                os.environ["TINYLLM_WGSL_MATMUL_TILE"] = tiles
            else:
                os.environ.pop("TINYLLM_WGSL_MATMUL_TILE", None)
            chosen = rt.matmul_tiles(n, n)
            got = (ga @ gb).numpy()[:8]  # compiles the pipeline
            err = float(np.abs(got - want).max() / np.abs(want).max())

            def run_realize(reps):
                outs = [(ga @ gb).realize() for _ in range(reps)]
                outs[-1][:1, :1].numpy()  # the read-back waits for every product submitted before it

            out = rt.empty((n, n), dt.float32)
            source, groups = render.render_matmul(1, n, n, n, ("k", n, 0, 0), ("r", n, 0, 0), "float32", chosen)

            def run_kernel(reps):
                for _ in range(reps):
                    rt.dispatch(source, [out, va, vb], groups)
                rt.gpu.download(out.storage, 4)  # submits, then waits for the products
            rows.append({"label": str(n), "tiles": "x".join(map(str, chosen)), "err": err, **ref,
                         "wgsl": flops / best_time(run_realize, max_reps=50) / 1e9,
                         "kernel": flops / best_time(run_kernel) / 1e9})
        os.environ.pop("TINYLLM_WGSL_MATMUL_TILE", None)
    torch_where = "no torch" if torch is None else (f"torch {torch.__version__} on {torch.cuda.get_device_name()}"
                                                    if cuda else f"torch {torch.__version__} on the CPU")
    return {"adapter": f"{rt.info['device']} via {rt.info['backend']}", "torch": torch_where, "cuda": cuda,
            "rows": rows}


def tinyllm_paths(lib, ffi):
    """(name, cpu.h path) of each path this CPU supports, and the name of the one tinyllm picks itself."""
    paths = [(ffi.string(lib.tl_cpu_path_name(p)).decode(), p) for p in range(3) if lib.tl_cpu_supports(p)]
    return paths, ffi.string(lib.tl_cpu_path_name(lib.tl_cpu_path())).decode()


def on_path(lib, path, fn):
    """fn run on tinyllm's path `path`, the picked path restored after it."""
    def run():
        lib.tl_cpu_set_path(path)
        fn()
        lib.tl_cpu_set_path(-1)
    return run


# How tinyllm's threads split a product (tl_sgemm_set_split), beside the rule, timed on the picked path with 2+ threads.
SPLITS = (("columns", 1), ("private B", 2), ("shared B", 3))


def with_split(lib, mode, fn):
    """fn run with the threads splitting products as `mode` says, the rule restored after it."""
    def run():
        lib.tl_sgemm_set_split(mode)
        fn()
        lib.tl_sgemm_set_split(0)
    return run


def worker(threads, sizes, rounds, samples, trans_n, wgsl_sizes=(), wgsl_tiles=(None,), gemv_sizes=(),
           gemv_m=(1, 4)):
    import numpy as np
    try:
        import torch
        torch.set_num_threads(threads)
    except ImportError:
        torch = None
    try:
        from threadpoolctl import threadpool_info
        blas = [f"{i['internal_api']} {i['version']} {i.get('architecture', '?')} kernel, "
                f"{i['num_threads']} threads" for i in threadpool_info() if i["user_api"] == "blas"]
    except ImportError:
        blas = ["threadpoolctl not installed: OpenBLAS kernel unknown"]

    wgsl = wgsl_rows(wgsl_sizes, rounds, torch, wgsl_tiles) if wgsl_sizes else None
    if not sizes and not trans_n and not gemv_sizes:  # the WGSL table alone: no C extension needed
        print(json.dumps({"info": None, "rows": [], "wgsl": wgsl}))
        return
    sgemm = load_sgemm()
    ffi, lib = sgemm.ffi, sgemm.lib
    paths, picked = tinyllm_paths(lib, ffi)
    splits = [(f"{picked} {name}", mode) for name, mode in SPLITS] if lib.tl_get_num_threads() > 1 else []

    def ptr(x):
        return ffi.cast("float *", x.ctypes.data)

    def cases(n, ta, tb):
        """One product C = op(A) op(B) of size n as zero-argument callables, per library."""
        rng = np.random.default_rng(n)
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        c = np.empty((n, n), np.float32)
        pa, pb, pc = ptr(a), ptr(b), ptr(c)
        na, nb = (a.T if ta else a), (b.T if tb else b)  # views: the BLAS gets the transpose flag
        fns = {name: on_path(lib, p, lambda: lib.tl_sgemm(ta, tb, n, n, n, pa, n, pb, n, 0.0, pc, n))
               for name, p in paths}
        for name, mode in splits:
            fns[name] = with_split(lib, mode, fns[picked])
        fns["numpy"] = lambda: np.matmul(na, nb, out=c)
        if torch is not None:
            tc = torch.from_numpy(c)
            xa, xb = torch.from_numpy(a), torch.from_numpy(b)
            xa, xb = (xa.t() if ta else xa), (xb.t() if tb else xb)
            fns["torch"] = lambda: torch.matmul(xa, xb, out=tc)
        return fns

    def measure(fns, flops):
        """Best GFLOP/s per library over rounds x samples short timings, rounds interleaved."""
        best = {name: float("inf") for name in fns}
        names = list(fns)
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:  # rotate who goes first
                fn = fns[name]
                time.sleep(SETTLE_S)
                t = time.perf_counter()
                fn()  # warm-up, and the time of one call
                call_s = time.perf_counter() - t
                calls = max(1, int(SAMPLE_S / call_s))
                # big sizes take fewer samples, so a round stays under ~ROUND_S
                for _ in range(max(2, min(samples, int(ROUND_S / (calls * call_s))))):
                    t = time.perf_counter()
                    for _ in range(calls):
                        fn()
                    best[name] = min(best[name], (time.perf_counter() - t) / calls)
        return {name: flops / s / 1e9 for name, s in best.items()}

    def gemv_cases(m, k, n, tb):
        """x W (tb 0, W stored K x N) or x W^T (tb 1, W stored N x K) through enough copies of W that each comes
        from memory: one call is a pass over all of them. Returns the callables and the bytes of W read."""
        rng = np.random.default_rng(n + m)
        copies = max(1, max(128 << 20, 4 * lib.tl_cpu_cache_size(3)) // (4 * k * n))
        ws = [rng.standard_normal((n, k) if tb else (k, n), dtype=np.float32) for _ in range(copies)]
        x = rng.standard_normal((m, k), dtype=np.float32)
        y = np.empty((m, n), np.float32)
        px, py, pws = ptr(x), ptr(y), [ptr(w) for w in ws]
        ldw = k if tb else n

        def tinyllm():
            for pw in pws:
                lib.tl_sgemm(0, tb, m, n, k, px, k, pw, ldw, 0.0, py, n)
        fns = {name: on_path(lib, p, tinyllm) for name, p in paths}
        views = [w.T if tb else w for w in ws]

        def numpy():
            for w in views:
                np.matmul(x, w, out=y)
        fns["numpy"] = numpy
        if torch is not None:
            tx, ty, tws = torch.from_numpy(x), torch.from_numpy(y), [torch.from_numpy(w) for w in views]

            def run_torch():
                for w in tws:
                    torch.matmul(tx, w, out=ty)
            fns["torch"] = run_torch
        return fns, copies * k * n * 4

    rows = [{"label": str(n), **measure(cases(n, 0, 0), 2.0 * n ** 3)} for n in sizes]
    if trans_n:
        for label, ta, tb in (("A^T B", 1, 0), ("A B^T", 0, 1)):
            rows.append({"label": f"{label} {trans_n}", **measure(cases(trans_n, ta, tb), 2.0 * trans_n ** 3)})
    gemv = []
    if gemv_sizes:
        copy = copy_bandwidth(lib, ffi, threads, rounds)
        for m in gemv_m:
            for size in gemv_sizes:
                k, n = gemv_shape(size)
                for tb in (0, 1):
                    fns, nbytes = gemv_cases(m, k, n, tb)
                    gemv.append({"label": f"{m} x {size} {'x W^T' if tb else 'x W'}", "copy": copy,
                                 **measure(fns, nbytes)})  # GB/s: bytes / s / 1e9
    torch_blas = "/".join(re.findall(r"BLAS_INFO=(\w+)", torch.__config__.show())) if torch else ""
    info = {"blas": blas, "paths": [name for name, _ in paths], "picked": picked, "splits": [n for n, _ in splits],
            "limits": machine_limits(threads),
            "avx512_full_width": bool(lib.tl_cpu_avx512_full_width()),
            "tinyllm_threads": lib.tl_get_num_threads(),
            "torch": (f"torch {torch.__version__} ({torch_blas}), {torch.get_num_threads()} threads" if torch
                      else "no torch")}
    print(json.dumps({"info": info, "rows": rows, "gemv": gemv, "wgsl": wgsl}))


def gemv_shape(size):
    """(K, N) of a --gemv-sizes entry: "768" is 768 x 768, "384x1536" is K = 384, N = 1536."""
    k, _, n = str(size).partition("x")
    return int(k), int(n or k)


def run_threads(threads, args):
    env = worker_env(threads, args.openblas_coretype)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--threads", str(threads),
           "--rounds", str(args.rounds), "--samples", str(args.samples), "--trans-n", str(args.trans_n),
           "--sizes", *map(str, args.sizes)]
    # always passed, so that `--gemv-sizes` with none reaches the worker as none rather than as its default
    cmd += ["--gemv-sizes", *map(str, args.gemv_sizes), "--gemv-m", *map(str, args.gemv_m)]
    if threads == min(args.threads) and args.wgsl_sizes:  # the GPU does not care about CPU threads: once
        cmd += ["--wgsl-sizes", *map(str, args.wgsl_sizes), "--wgsl-tiles", *args.wgsl_tiles]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1]), env["OMP_PROC_BIND"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="*", default=SIZES, help="C / numpy / torch rows (none: skip them)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds over the libraries")
    p.add_argument("--samples", type=int, default=10, help="timings per library per round")
    p.add_argument("--trans-n", type=int, default=512, help="size of the A^T B and A B^T rows (0: none)")
    p.add_argument("--gemv-sizes", nargs="*", default=None, metavar="N|KxN",
                   help="weights of the GEMV table, K = N or K x N (default 384x1152 384x1536 1536x384 768 1024 2048 "
                        "4096 with the sgemm table; none: skip it)")
    p.add_argument("--gemv-m", type=int, nargs="+", default=[1, 4], help="rows M of the GEMV table")
    p.add_argument("--wgsl-sizes", type=int, nargs="*", default=[],
                   help="also time the WGSL runtime at these sizes (lavapipe: <= 256; a GPU: 1024 2048 4096)")
    p.add_argument("--wgsl-tiles", nargs="+", default=["auto"], metavar="BMxBNxBKxTMxTN",
                   help="WGSL matmul tile configurations to time, each a row ('auto': the runtime's choice)")
    p.add_argument("--openblas-coretype", metavar="NAME",
                   help="numpy on this OpenBLAS kernel (OPENBLAS_CORETYPE; Haswell: AVX2) instead of its own pick")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.gemv_sizes is None:
        args.gemv_sizes = GEMV_SIZES if (args.sizes or args.trans_n) else []
    if args.worker:
        worker(args.threads[0], args.sizes, args.rounds, args.samples, args.trans_n, args.wgsl_sizes,
               [None if t == "auto" else t for t in args.wgsl_tiles], args.gemv_sizes, args.gemv_m)
        return

    if args.sizes or args.trans_n or args.gemv_sizes:
        cpu = cpu_description()
        print(f"CPU: {cpu['model']} ({cpu['family']}), {os.cpu_count()} cores; caches (per core, cpu0): "
              f"{', '.join(cpu['caches']) or 'unknown'}")
        print(f"SIMD flags: {' '.join(cpu['flags']) or 'none found'}")
    if args.sizes or args.trans_n:
        print(f"sgemm GFLOP/s, square n x n x n, float32: best of {args.rounds} interleaved rounds x up to "
              f"{args.samples} timings (~{SAMPLE_S * 1e3:g} ms each) per library")
        print(f"numpy with OPENBLAS_CORETYPE={args.openblas_coretype} (that OpenBLAS kernel, not its own pick)"
              if args.openblas_coretype else
              "numpy with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (OpenBLAS picks its own kernel)")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at start (well above 0, other processes "
          f"compete for the cores, and large sizes read low for every library)")
    by_threads = {}
    for threads in args.threads:
        res, bind = run_threads(threads, args)
        info = res["info"]
        if info and res["rows"]:
            print_sgemm(threads, bind, info, res["rows"])
            by_threads[threads] = (info["picked"], res["rows"])
        if info and res.get("gemv"):
            print_gemv(threads, bind, info, res["gemv"])
        if res.get("wgsl"):
            print_wgsl(res["wgsl"], threads)
    if 1 in by_threads and len(by_threads) > 1:
        print_scaling(by_threads)


def print_scaling(by_threads):
    """How much each library gains from more threads: GFLOP/s at N threads over its own at one, per size, and
    tinyllm's gain over numpy's (issue 48 asks >= 0.9 at n >= 512)."""
    picked, one = by_threads[1]
    for threads, (_, rows) in sorted(by_threads.items()):
        if threads == 1:
            continue
        print(f"\nscaling from 1 to {threads} threads (GFLOP/s at {threads} over at 1, each library its own; "
              f"tinyllm: {picked})")
        head = f"{'n':>11} {'tinyllm':>9} {'numpy':>9} {'tinyllm/numpy':>14}"
        at_one = {r["label"]: r for r in one}
        print_table(head, [r for r in rows if r["label"] in at_one], lambda r: (
            f"{r['label']:>11} {r[picked] / at_one[r['label']][picked]:>9.2f} "
            f"{r['numpy'] / at_one[r['label']]['numpy']:>9.2f} "
            f"{(r[picked] / at_one[r['label']][picked]) / (r['numpy'] / at_one[r['label']]['numpy']):>14.2f}"))


def library_columns(info, rows):
    """The timed columns of a table: tinyllm's paths (the picked one starred), numpy, torch if there."""
    cols = [(f"{p}{'*' if p == info['picked'] else ''}", p) for p in info["paths"]]
    cols += [(name.split(" ", 1)[1], name) for name in info.get("splits", []) if name in rows[0]]
    cols += [("numpy", "numpy")]
    return cols + ([("torch", "torch")] if "torch" in rows[0] else [])


def header_line(threads, bind, info):
    full = "full-width 512-bit FMAs" if info["avx512_full_width"] else "no full-width 512-bit FMAs"
    return (f"{threads} thread{'s' if threads > 1 else ''} (OMP_PROC_BIND={bind}); tinyllm: paths "
            f"{', '.join(info['paths'])}, picks {info['picked']} ({full}), {info['tinyllm_threads']} threads; "
            f"numpy: {'; '.join(info['blas'])}; {info['torch']}")


def print_table(head, rows, fmt):
    print(head)
    print("-" * len(head))
    for r in rows:
        print(fmt(r))


def print_sgemm(threads, bind, info, rows):
    print(f"\nsgemm GFLOP/s, {header_line(threads, bind, info)}")
    print("\n".join(limits_lines(info["limits"])))
    cols = library_columns(info, rows)
    picked = info["picked"]
    peak = peak_gflops(info["limits"], threads, picked)
    ratios = [("numpy", f"{picked}/numpy")] + ([("torch", f"{picked}/torch")] if "torch" in rows[0] else [])
    head = f"{'n':>11}" + "".join(f" {c:>9}" for c, _ in cols) + "".join(f" {r:>13}" for _, r in ratios) + \
        f" {picked + ' of peak':>15} {'numpy of peak':>13}"
    print_table(head, rows, lambda r: f"{r['label']:>11}" + "".join(f" {r[k]:>9.1f}" for _, k in cols) +
                "".join(f" {r[picked] / r[k]:>13.2f}" for k, _ in ratios) +
                f" {r[picked] / peak:>15.1%} {r['numpy'] / peak:>13.1%}")


def print_gemv(threads, bind, info, rows):
    print(f"\nGEMV, GB/s of weight read (M x K=N or M x KxN; W stored K x N: x W, N x K: x W^T), weights from "
          f"memory; copy: STREAM-style copy (memcpy, same threads), GB/s read + written; "
          f"{header_line(threads, bind, info)}")
    cols = library_columns(info, rows)
    picked = info["picked"]
    head = f"{'M x n':>21}" + "".join(f" {c:>9}" for c, _ in cols) + f" {'copy':>7} {picked + '/copy':>12}" + \
        f" {picked + '/numpy':>13}"
    print_table(head, rows, lambda r: f"{r['label']:>21}" + "".join(f" {r[k]:>9.1f}" for _, k in cols) +
                f" {r['copy']:>7.1f} {r[picked] / r['copy']:>12.2f} {r[picked] / r['numpy']:>13.2f}")


def print_wgsl(res, threads):
    where = "fp32 with TF32 off; tf32: TF32 on" if res["cuda"] else \
        f"CPU, {threads} thread{'s' if threads > 1 else ''}"
    print(f"\nWGSL runtime on {res['adapter']}; {res['torch']} ({where}). GFLOP/s; wgsl: (a @ b).realize() back to "
          "back, runtime Python included; kernel: the dispatch alone, recorded back to back; err: max relative error")
    tf32 = res["cuda"]
    head = f"{'n':>6} {'tiles':>16} {'wgsl':>9} {'kernel':>9} {'torch':>9}" + (f" {'tf32':>9}" if tf32 else "") + \
        f" {'wgsl/torch':>10} {'kernel/torch':>12} {'err':>8}"
    print(head)
    print("-" * len(head))
    for r in res["rows"]:
        t = r.get("torch", float("nan"))
        print(f"{r['label']:>6} {r['tiles']:>16} {r['wgsl']:>9.1f} {r['kernel']:>9.1f} {t:>9.1f}" +
              (f" {r['torch_tf32']:>9.1f}" if tf32 else "") +
              f" {r['wgsl'] / t:>10.3f} {r['kernel'] / t:>12.3f} {r['err']:>8.1e}")


if __name__ == "__main__":
    main()
