"""Autotuning of the C runtime's products on this machine, with a budget, remembered per machine (issue 48).

What differs between CPUs and is chosen here, by timing the products the program actually ran (the float32
MATMULs the runtime saw, `CRuntime.shapes`), on the threads it runs with:
  * the instruction-set path of the prebuilt kernels (avx2 or avx512: runtime_c/cpu.h). Its default comes from a
    calibration (512-bit FMAs at twice the 256-bit rate); this decision replaces it where TINYLLM_CPU asks for none;
  * the sgemm's cache blocks KC, MC, NC for that path (runtime_c/sgemm.c, tl_sgemm_set_blocking), each at half,
    once and twice what the cache sizes give;
  * where the program runs products of at most 4 rows or columns (decoding), the GEMV's grouping
    (runtime_c/gemv.c, tl_gemv_set_grouping): how many rows of W a kernel reads at once where a row is one stream
    and where it is not, and whether it asks for the next 4 KiB page ahead. Searched apart, on those products
    alone, with the path and blocks chosen: they run nothing else.
Results: MC and NC only split the rows and columns among blocks, and the page-ahead prefetch only asks for memory
early, so those give bit-identical products; the path (its micro-tile), KC and the GEMV's rows at once change how
the sum over K is blocked, so they change the rounding (within float32's error of the sum; tests/test_tune.py
checks both).

The search is successive halving: every candidate times every shape once, the faster half again, and so on, for
60 % of the budget (TINYLLM_TUNE_BUDGET seconds, default 10; shared by the two searches as their candidates);
then the best one and the default time in turns, and the best wins only if the median of those pairs makes it at
least 3 % faster, so noise does not make a worse choice. The result is
stored in the kernel cache (`<cache>/tune/<machine>.json`, the machine named by its CPU's model, flags and cache
sizes, the thread count and the prebuilt module) and applied when the runtime starts on that machine again.
The C runtime runs the search once, at a jitted step's first chained call (the program's products are known then)
where nothing is stored; `python -m tinyllm.tune` runs it on a GPT training step's products. TINYLLM_TUNE=0 turns
all of it off (nothing searched, nothing applied).
"""
import hashlib
import json
import os
import time

import numpy as np

from ...utils.progress import progress_bar
from . import compiler

MARGIN = 0.97  # another configuration replaces the default only when its time is this fraction of it or less
SEARCH_SHARE = 0.6  # of the budget for the successive halving; the rest for the best against the default
FACTORS = (1.0, 0.5, 2.0)  # of each cache block, about what plan_blocking derives from the cache sizes
FORMAT = 2  # of the stored file
# The GEMV's groupings tried (tl_gemv_set_grouping): rows of W at once where a row is one stream, where it is not,
# and the page-ahead prefetches (-1 by W's size, 0 off, 1 on). [0, 0, -1] is the measured rule, the default.
GEMV_DEFAULT = [0, 0, -1]
GEMV_GROUPINGS = [[short, long, page] for short in (1, 2, 4) for long in (2, 4, 8) for page in (-1, 0, 1)]


def enabled():
    return os.environ.get("TINYLLM_TUNE", "1") != "0"


def budget():
    return float(os.environ.get("TINYLLM_TUNE_BUDGET", "10"))


def machine(lib):
    """What names this machine for the stored choice: the CPU's model, flags and caches, the threads, the module."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    from ... import _kernels
    with open(_kernels.__file__, "rb") as f:
        module = hashlib.sha256(f.read()).hexdigest()[:16]
    caches = [lib.tl_cpu_cache_size(level) for level in (1, 2, 3)]
    threads = int(os.environ.get("TINYLLM_THREADS", "0") or 0) or os.cpu_count()  # (not the affinity: pinning
    flags = sorted(compiler._cpu_flags() & {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16",
                                            "avx512_vnni", "f16c", "neon", "asimd"})
    return {"model": model, "flags": flags, "caches": caches, "threads": threads, "module": module}  # moves it)


def store_path(key):
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return os.path.join(os.path.dirname(compiler.cache_dir()), "tune", name + ".json")


def load(lib):
    """The stored choice for this machine, applied; None where there is none (or tuning is off)."""
    if not enabled() or lib is None or not hasattr(lib, "tl_sgemm_set_blocking"):
        return None
    try:
        with open(store_path(machine(lib))) as f:
            stored = json.load(f)
    except (OSError, ValueError):
        return None
    if stored.get("format") != FORMAT:
        return None
    apply(lib, stored["choice"])
    return stored


def apply(lib, choice):
    """Makes `choice` ({"path", "kc", "mc", "nc", "gemv"}) the products' configuration."""
    if lib.tl_cpu_requested_path() < 0:                 # (TINYLLM_CPU names a path: the user's choice wins)
        lib.tl_cpu_set_path(choice["path"])
    lib.tl_sgemm_set_blocking(choice["path"], choice["kc"], choice["mc"], choice["nc"])
    lib.tl_gemv_set_grouping(*choice["gemv"])


def default_choice(lib):
    """The configuration the runtime picks by itself: its path (the calibration's, or TINYLLM_CPU's), the blocks
    plan_blocking derives from the cache sizes."""
    if lib.tl_cpu_requested_path() < 0:
        lib.tl_cpu_set_path(-1)
    path = lib.tl_cpu_path()
    lib.tl_sgemm_set_blocking(path, 0, 0, 0)
    lib.tl_gemv_set_grouping(*GEMV_DEFAULT)
    kc, mc, nc = _plan(lib, path)[2:]
    return {"path": path, "kc": kc, "mc": mc, "nc": nc, "gemv": GEMV_DEFAULT}


def _plan(lib, path):
    from ... import _kernels
    out = _kernels.ffi.new("int[5]")
    lib.tl_sgemm_plan(path, out)
    return list(out)


def candidates(lib):
    """The default configuration first, then each supported SIMD path's blocks at each factor (the GEMV's default
    grouping)."""
    first = default_choice(lib)
    found = [first]
    forced = lib.tl_cpu_requested_path()
    paths = [first["path"]] if forced >= 0 else [p for p in (1, 2) if lib.tl_cpu_supports(p)] or [0]
    for path in paths:
        lib.tl_sgemm_set_blocking(path, 0, 0, 0)
        mr, nr, kc, mc, nc = _plan(lib, path)
        for fk in FACTORS:
            for fm in FACTORS:
                c = {"path": path, "kc": max(64, int(kc * fk) // 16 * 16), "mc": max(mr, int(mc * fm) // mr * mr),
                     "nc": nc, "gemv": GEMV_DEFAULT}
                if c not in found:
                    found.append(c)
    return found


class Products:
    """The float32 products to time: (batch, transA, transB, M, N, K) -> how often the program ran it, with
    operands of each made once."""

    def __init__(self, shapes):
        from ... import _kernels
        self.ffi, self.items = _kernels.ffi, []
        rng = np.random.default_rng(0)
        for (batch, ta, tb, M, N, K), count in sorted(shapes.items()):
            a = rng.standard_normal((batch, K, M) if ta else (batch, M, K), dtype=np.float32)
            b = rng.standard_normal((batch, N, K) if tb else (batch, K, N), dtype=np.float32)
            c = np.empty((batch, M, N), np.float32)
            self.items.append(((batch, ta, tb, M, N, K), count, a, b, c))

    def time(self, lib):
        """Seconds the products take once each, weighted by how often the program runs each."""
        total = 0.0
        for (batch, ta, tb, M, N, K), count, a, b, c in self.items:
            pa, pb, pc = (self.ffi.from_buffer("float[]", x) for x in (a, b, c))
            t = time.perf_counter()
            lib.tl_sgemm_batched(batch, ta, tb, M, N, K, pa, M if ta else K, a[0].size, pb, K if tb else N,
                                 b[0].size, 0.0, pc, N, c[0].size)
            total += (time.perf_counter() - t) * count
        return total


def gemv_candidates(choice):
    """`choice` with each other GEMV grouping."""
    same = [1, 8, -1]                                   # (what the rule does for one row of x, and caps for more)
    return [{**choice, "gemv": g} for g in GEMV_GROUPINGS if g != same]


def search(lib, shapes, seconds=None, progress=True):
    """The fastest configuration for `shapes` ({(batch, transA, transB, M, N, K): count}) within `seconds`, applied;
    -> {"choice", "default", "seconds", "speedup", "pairs", "timings"}. Successive halving takes SEARCH_SHARE of the
    budget: over the paths and blocks on every product, then over the GEMV's groupings on the GEMV's products, each
    search a share of it as its candidates. The rest times the merged best against the default, alternating, and it
    replaces the default only when the median of those pairs says it is MARGIN faster (a neighbour's burst of
    work during one timing cannot decide)."""
    seconds = budget() if seconds is None else seconds
    start = time.perf_counter()
    left = lambda share=1.0: start + seconds * share - time.perf_counter()  # noqa: E731
    products = Products(shapes)
    gemv_products = Products({s: n for s, n in shapes.items() if lib.tl_gemv_takes(s[3], s[4])})
    pool = candidates(lib)
    n_gemv = len(GEMV_GROUPINGS) - 1 if gemv_products.items else 0
    bar = progress_bar((len(pool) + n_gemv) * 2, "tinyllm: tuning the C products", "config") if progress else None
    last = [0.0]                                        # how long the last timing took
    timings = {"all": {}, "gemv": {}}                   # the best time of each candidate on its products

    def timed(choice, on=products):
        t0 = time.perf_counter()
        apply(lib, choice)
        on.time(lib)                                    # (a warm call: packing buffers, the path's first use)
        t = on.time(lib)
        seen = timings["all" if on is products else "gemv"]
        seen[json.dumps(choice)] = min(seen.get(json.dumps(choice), float("inf")), t)
        last[0] = time.perf_counter() - t0
        if bar is not None:
            bar.update(1)
        return t

    def halving(pool, on, share):
        """The fastest of `pool` on `on` by successive halving until `share` of the budget has passed."""
        best = {}
        alive = list(range(len(pool)))
        while len(alive) > 1 and left(share) > last[0]:
            for i in alive:
                if left(share) <= last[0]:              # (a timing that would end past the budget is not begun)
                    break
                best[i] = min(best.get(i, float("inf")), timed(pool[i], on))
            ranked = sorted((best[i], i) for i in alive if i in best)
            alive = [i for _, i in ranked[:max(1, len(ranked) // 2)]]
        return pool[min(best, key=best.get)] if best else pool[0]
    first_share = SEARCH_SHARE * len(pool) / (len(pool) + n_gemv)
    choice = halving(pool, products, first_share)
    if n_gemv:
        grouped = [choice] + gemv_candidates(choice)
        choice = halving(grouped, gemv_products, SEARCH_SHARE)
    default, ratios = pool[0], []
    while choice != default and left() > 2 * last[0] and len(ratios) < 9:
        ratios.append(timed(choice) / timed(default))
    if bar is not None:
        bar.close()
    speedup = 1 / float(np.median(ratios)) if ratios else 1.0
    if speedup * MARGIN < 1.0:
        choice, speedup = default, 1.0
    apply(lib, choice)
    return {"choice": choice, "default": default, "seconds": time.perf_counter() - start, "speedup": speedup,
            "pairs": len(ratios), "timings": timings}


def tune_and_store(lib, shapes, seconds=None, progress=True):
    """search, then the result stored for this machine (atomically: written beside, then renamed)."""
    key = machine(lib)
    result = search(lib, shapes, seconds, progress)
    path = store_path(key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    record = {"format": FORMAT, "machine": key, "shapes": [list(s) + [n] for s, n in sorted(shapes.items())],
              **result}
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, path)
    return record
