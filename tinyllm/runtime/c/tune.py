"""Autotuning of the C runtime on this machine, with a budget, remembered per machine (issue 48).

What differs between CPUs and is chosen here, by timing what the program actually ran (the float32 MATMULs the
runtime saw, `CRuntime.shapes`, and its generated kernels, `CRuntime.generated_runs`), on the threads it runs with:
  * the instruction-set path of the prebuilt kernels (avx2 or avx512: runtime_c/cpu.h). Its default comes from a
    calibration (512-bit FMAs at twice the 256-bit rate); this decision replaces it where TINYLLM_CPU asks for none;
  * the sgemm's cache blocks KC, MC, NC for that path (runtime_c/sgemm.c, tl_sgemm_set_blocking), each at half,
    once and twice what the cache sizes give;
  * on more than one thread, how the threads split a product (tl_sgemm_set_split): the rules (M, each thread
    packing the B panel whole where it fits in half of L2, else a share of it, reading the others' shares), C's
    columns (each packs its own B strips and all of A), or M with the panel always packed whole by each thread, or
    always shared. How dear it is to write lines another core holds, or to read those it has just written, differs
    between CPUs (and between a VM's vCPUs);
  * where the program runs products of at most 4 rows or columns (decoding), the GEMV's grouping
    (runtime_c/gemv.c, tl_gemv_set_grouping): how many rows of W a kernel reads at once where a row is one stream
    and where it is not, and whether it asks for the next 4 KiB page ahead. Searched apart, on those products
    alone, with the path and blocks chosen: they run nothing else;
  * on a CPU with AVX-512, the generated kernels' vector width (compiler.set_kernel_path): avx512 (512-bit
    vectors, the default), avx512-256 (its instructions in 256-bit vectors, for cores that slow their clock for
    512-bit ones) or avx2, timed on the program's heaviest kernels compiled for each (kernel_path).
Results: MC and NC only split the rows and columns among blocks, the threads' split only which thread computes
which elements, and the page-ahead prefetch only asks for memory early, so those give bit-identical products; the
path (its micro-tile), KC and the GEMV's rows at once change how the sum over K is blocked, so they change the
rounding (within float32's error of the sum). A generated kernel computes each element the same way at any width,
but keeps one partial row sum per vector lane: avx2 and avx512-256 (8 lanes) give the same bits, avx512 (16) rounds
row sums differently. tests/test_tune.py checks all of it.

The search: the default's products timed first, then kernel_path within KERNEL_SEARCH of the budget
(TINYLLM_TUNE_BUDGET seconds, default 10); then successive halving (every candidate times every shape once, the
faster half again, and so on) over the paths and blocks, then the GEMV's groupings, until SEARCH_SHARE of it; then
the best one and the default time in turns, and the best wins only if the median of those pairs makes it at least
3 % faster (10 % for the generated kernels' path, whose change recompiles them), so noise does not make a worse
choice.

Payback: a search the runtime starts by itself, and `python -m tinyllm.tune` without --budget, must save its own
time back within PAYBACK_RUNS runs of the program (training steps, decoded tokens). Its budget is at most what those
runs would save at the smallest gain it keeps (3 % of their time in products and timed kernels: three runs' time),
or what the fastest configuration timed so far would save, if that is more, worked out again after every timing.
So a search that finds nothing costs about three runs' time, not the budget, and one that goes on past that does
so only while what it has found would pay for it. Where the run's time is known (a jitted run times its replay),
a search whose operands alone would take longer to make is not begun (decoding a large model: its products are
the weights, hundreds of MB to copy, for a token of milliseconds). The result is stored in the kernel cache
(`<cache>/tune/<machine>.json`, the machine named by its CPU's model, flags and cache sizes, the thread count and
the prebuilt module) and applied when the runtime starts on that machine again. The C runtime runs the search once,
at a jitted step's first chained call (the program's products and kernels are known then) where nothing is stored;
`python -m tinyllm.tune` runs it on a GPT training step's (or with --decode, decoding's). TINYLLM_TUNE=0 turns all
of it off (nothing searched, nothing applied).
"""
import hashlib
import json
import os
import time

import numpy as np

from ...utils.progress import progress_bar
from . import compiler, record
from .render import render
from .views import address

MARGIN = 0.97  # another configuration replaces the default only when its time is this fraction of it or less
SEARCH_SHARE = 0.6  # of the budget for kernel_path and the successive halving; the rest for the best against the
#                     default
FACTORS = (1.0, 0.5, 2.0)  # of each cache block, about what plan_blocking derives from the cache sizes
FORMAT = 3  # of the stored file
SPLITS = (1, 2, 3)  # tl_sgemm_set_split's other modes than the rules (0), timed on more than one thread
PAYBACK_RUNS = 100  # runs of the program (steps, tokens) that an automatic search's time must be saved back within
# Bytes a second of operands the search makes before it can time anything (fresh pages, filled): measured 0.5 GB/s
# on a 2-vCPU VM, whose page faults are slow. A search whose operands alone would take longer than a bounded
# search's floor is not begun.
MAKE_BYTES_PER_SECOND = 0.5e9
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
    try:
        apply(lib, stored["choice"])
    except (KeyError, TypeError, ValueError):           # (a file not written by tune_and_store: searched again)
        default_choice(lib)
        return None
    return stored


def apply(lib, choice):
    """Makes `choice` ({"path", "kc", "mc", "nc", "split", "gemv"}, and "kernels") the products' configuration and
    the generated kernels' path."""
    if lib.tl_cpu_requested_path() < 0:                 # (TINYLLM_CPU names a path: the user's choice wins)
        lib.tl_cpu_set_path(choice["path"])
    lib.tl_sgemm_set_blocking(choice["path"], choice["kc"], choice["mc"], choice["nc"])
    lib.tl_sgemm_set_split(choice["split"])
    lib.tl_gemv_set_grouping(*choice["gemv"])
    compiler.set_kernel_path(choice.get("kernels"))


def default_choice(lib):
    """The configuration the runtime picks by itself: its path (the calibration's, or TINYLLM_CPU's), the blocks
    plan_blocking derives from the cache sizes."""
    if lib.tl_cpu_requested_path() < 0:
        lib.tl_cpu_set_path(-1)
    path = lib.tl_cpu_path()
    lib.tl_sgemm_set_blocking(path, 0, 0, 0)
    lib.tl_sgemm_set_split(0)
    lib.tl_gemv_set_grouping(*GEMV_DEFAULT)
    kc, mc, nc = _plan(lib, path)[2:]
    compiler.set_kernel_path(None)
    return {"path": path, "kc": kc, "mc": mc, "nc": nc, "split": 0, "gemv": GEMV_DEFAULT, "kernels": None}


def _plan(lib, path):
    from ... import _kernels
    out = _kernels.ffi.new("int[5]")
    lib.tl_sgemm_plan(path, out)
    return list(out)


def candidates(lib):
    """The default configuration first, then each other supported SIMD path with its own blocks and, on more than
    one thread, the default with the threads' other splits (the likeliest to differ most: an early win lets a
    search bounded by its payback go on), then each path's blocks at each factor (the GEMV's default grouping)."""
    first = default_choice(lib)
    found = [first]
    forced = lib.tl_cpu_requested_path()
    paths = [first["path"]] if forced >= 0 else [p for p in (1, 2) if lib.tl_cpu_supports(p)] or [0]
    factored = []
    for path in paths:
        lib.tl_sgemm_set_blocking(path, 0, 0, 0)
        mr, nr, kc, mc, nc = _plan(lib, path)
        factored += [{"path": path, "kc": max(64, int(kc * fk) // 16 * 16), "mc": max(mr, int(mc * fm) // mr * mr),
                      "nc": nc, "split": 0, "gemv": GEMV_DEFAULT, "kernels": None} for fk in FACTORS for fm in FACTORS]
    splits = [{**first, "split": mode} for mode in SPLITS] if lib.tl_get_num_threads() > 1 else []
    for c in factored[::len(FACTORS) ** 2] + splits + factored:  # (FACTORS[0] is 1: each path's own blocks first)
        if c not in found:
            found.append(c)
    return found


def _filled(shape, block):
    """A float32 array of `shape` holding `block` over and over."""
    out = np.empty(shape, np.float32)
    flat = out.reshape(-1)
    whole = flat.size // block.size * block.size
    flat[:whole].reshape(-1, block.size)[...] = block
    flat[whole:] = block[:flat.size - whole]
    return out


class Products:
    """The float32 products to time: (batch, transA, transB, M, N, K) -> how often the program ran it, with
    operands of each made once."""

    def __init__(self, shapes):
        from ... import _kernels
        self.ffi, self.items = _kernels.ffi, []
        block = np.random.default_rng(0).standard_normal(4096, dtype=np.float32)  # (a fill, not a draw per value)
        for (batch, ta, tb, M, N, K), count in sorted(shapes.items()):
            a = _filled((batch, K, M) if ta else (batch, M, K), block)
            b = _filled((batch, N, K) if tb else (batch, K, N), block)
            c = np.empty((batch, M, N), np.float32)
            self.items.append(((batch, ta, tb, M, N, K), count, a, b, c))

    @staticmethod
    def nbytes(shapes):
        """The bytes of the operands and results Products(shapes) makes."""
        return 4 * sum(batch * (M * K + K * N + M * N) for batch, ta, tb, M, N, K in shapes)

    def only(self, keep):
        """These products whose shape `keep` accepts, sharing their operands."""
        part = Products({})
        part.items = [item for item in self.items if keep(item[0])]
        return part

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


def buffers(arrays):
    """How a generated kernel's arrays lie, enough to make others like them: for each, the offset of its first
    element into the bytes its elements span, that span, and its dtype."""
    out = []
    for a in arrays:
        low, high = record._bounds(a)
        out.append((address(a) - low, high - low, a.dtype.str))
    return tuple(out)


class Kernels:
    """The generated kernels the program ran (CRuntime.generated_runs), with arrays of each one's sizes made when it
    is first timed: 16- and 32-bit floats from a normal distribution (no denormals, no NaN), integers 0."""

    def __init__(self, runtime):
        self.runtime = runtime
        self.items = [(key, count, layout, params) for (key, layout, params), count in runtime.generated_runs.items()]
        self.arrays = {}                                # item -> [(bytes, offset of the first element)]
        self.per_run = 0.0                              # one run's kernels on the default path, once timed
        self.saved = 0.0                                # what the fastest other path timed saves of that
        block = np.random.default_rng(0).standard_normal(4096, dtype=np.float32)
        self.block = {np.dtype(np.float32): block, np.dtype(np.float16): block.astype(np.float16),
                      np.dtype(np.float64): block.astype(np.float64),
                      np.dtype(np.uint16): (block.view(np.uint32) >> 16).astype(np.uint16)}  # (bfloat16's bits)

    def _arrays(self, i):
        if i not in self.arrays:
            made = []
            for offset, span, kind in self.items[i][2]:
                raw = np.zeros(max(span, 1), np.uint8)
                dtype = np.dtype(kind)
                view = raw[:span // dtype.itemsize * dtype.itemsize].view(dtype)
                if dtype in self.block:                 # (other kinds, integers and booleans, stay 0)
                    view[...] = np.resize(self.block[dtype], view.size)
                made.append((raw, offset))
            self.arrays[i] = made
        return self.arrays[i]

    def keep(self, which):
        """Frees the arrays of the kernels not in `which`."""
        self.arrays = {i: a for i, a in self.arrays.items() if i in which}

    def time(self, fns, which):
        """Seconds the kernels `which` (indices) take once each, weighted by how often the program runs each, with
        fns[i] the compiled (function, params) of item i."""
        total = 0.0
        for i in which:
            bufs = compiler.ffi.new("char *[]", [compiler.ffi.cast("char *", raw.ctypes.data + off)
                                                 for raw, off in self._arrays(i)] +
                                    [compiler.ffi.cast("char *", p) for p in self.items[i][3]])
            fn = fns[i][0]
            fn(bufs)                                    # (warm: caches, the first call's page faults)
            t = time.perf_counter()
            fn(bufs)
            total += (time.perf_counter() - t) * self.items[i][1]
        return total


KERNEL_SHARE = 0.8  # of the generated kernels' time that the kernels timed for their path cover
KERNEL_MOST = 12    # kernels compiled for each other path at most
COMPILE_SECONDS = 0.6  # compiling KERNEL_MOST kernels for another path, cold (two compiler runs at once): 0.3 s on 2
#                        Zen 4 cores
# Another path for generated kernels only when this fraction of the default's time or less: a change recompiles
# every kernel of the program at its next start (seconds), and decoding's kernels (0.4 ms a token) moved 4-6 %
# between two runs of the same search, so MARGIN would let noise choose.
KERNEL_MARGIN = 0.90
KERNEL_SEARCH = 0.25  # of the budget for kernel_path, out of SEARCH_SHARE


def kernel_path(kernels, deadline):
    """The generated kernels' path: where the CPU has AVX-512 and no path was asked for, avx512 (512-bit vectors),
    avx512-256 (its instructions in 256-bit vectors) or avx2, timed on the kernels that take KERNEL_SHARE of the
    program's generated-kernel time (at most KERNEL_MOST), compiled for each, until deadline() (which may move as
    kernels.per_run and kernels.saved are known); another than the default only when the median of alternating
    timings makes it KERNEL_MARGIN faster. -> (path or None for the default, speedup, {path: seconds})."""
    default = compiler.path()
    if default != "avx512" or not compiler.kernel_path_tunable() or not kernels.items:
        return None, 1.0, {}
    if time.perf_counter() + COMPILE_SECONDS > deadline():  # (no time to compile for another path: none timed)
        return None, 1.0, {}
    rt = kernels.runtime
    keys = [key for key, *_ in kernels.items]
    mine = rt.compiled(keys, default)
    fns = [mine[k] for k in keys]
    each = []
    for i in range(len(keys)):
        each.append((kernels.time(fns, [i]), i))
        kernels.keep(())
    each.sort(reverse=True)
    top, covered, total = [], 0.0, sum(t for t, _ in each)
    kernels.per_run = total
    for t, i in each:
        if covered >= KERNEL_SHARE * total or len(top) >= KERNEL_MOST:
            break
        top.append(i)
        covered += t
    options = {default: fns}
    for other in ("avx512-256", "avx2"):
        cold = any(compiler.cached(render(*keys[i])[1], other) is None for i in top)
        if time.perf_counter() + (COMPILE_SECONDS if cold else 0.0) > deadline():
            break
        made = rt.compiled([keys[i] for i in top], other)
        options[other] = {i: made[keys[i]] for i in top}
    ratios = {p: [] for p in options if p != default}
    seen = {p: float("inf") for p in options}
    seen[default] = covered
    while ratios and time.perf_counter() < deadline() and len(next(iter(ratios.values()))) < 9:
        base = kernels.time(fns, top)
        seen[default] = min(seen[default], base)
        for p in ratios:
            t = kernels.time(options[p], top)
            seen[p] = min(seen[p], t)
            ratios[p].append(t / base)
        kernels.saved = max(0.0, seen[default] - min(seen[p] for p in ratios))
    medians = {p: float(np.median(r)) for p, r in ratios.items() if r}
    best = min(medians, key=medians.get, default=None)
    if best is None or medians[best] > KERNEL_MARGIN:
        return None, 1.0, seen
    return best, 1 / medians[best], seen


def gemv_candidates(choice):
    """`choice` with each other GEMV grouping."""
    same = [1, 8, -1]                                   # (what the rule does for one row of x, and caps for more)
    return [{**choice, "gemv": g} for g in GEMV_GROUPINGS if g != same]


def search(lib, shapes, seconds=None, progress=True, runtime=None, payback=None, run_seconds=None):
    """The fastest configuration for `shapes` ({(batch, transA, transB, M, N, K): count}) within `seconds`, applied;
    -> {"choice", "default", "seconds", "allowed", "per_run", "speedup", "pairs", "timings", "kernel_speedup"}. The
    default's products are timed first. Successive halving takes SEARCH_SHARE of the budget: over the paths and
    blocks on every product, then over the GEMV's groupings on the GEMV's products, each search a share of it as its
    candidates; with `runtime` (a CRuntime whose generated_runs holds the program's generated kernels), kernel_path
    first chooses their path within KERNEL_SEARCH of it. The rest times the merged best against the default,
    alternating, and it replaces the default only when the median of those pairs says it is MARGIN faster (a
    neighbour's burst of work during one timing cannot decide). With `payback` (runs of the program), the budget is
    at most what that many runs would save (the top of the file), worked out again after every timing; and given
    how long a run takes (`run_seconds`), no search begins whose operands alone would take longer to make than
    those runs would save at MARGIN: the default is kept untimed."""
    cap = budget() if seconds is None else seconds
    if payback is not None and run_seconds is not None and \
            Products.nbytes(shapes) / MAKE_BYTES_PER_SECOND > payback * (1.0 - MARGIN) * run_seconds:
        default = candidates(lib)[0]
        apply(lib, default)
        return {"choice": default, "default": default, "seconds": 0.0, "allowed": 0.0, "per_run": run_seconds,
                "speedup": 1.0, "pairs": 0, "timings": {"all": {}, "gemv": {}}, "kernel_speedup": 1.0}
    start = time.perf_counter()
    products = Products(shapes)
    gemv_products = products.only(lambda s: lib.tl_gemv_takes(s[3], s[4]))
    kernels = Kernels(runtime) if runtime is not None and runtime.generated_runs else None
    pool = candidates(lib)
    per_run = [0.0]                                     # one run's products, default configuration
    saved = {}                                          # "all", "gemv" -> what the fastest timed saves of a run

    def allowance():
        """The seconds the search may take: the budget, or less where `payback` runs would not save them back."""
        if payback is None:
            return cap
        run = per_run[0] + (kernels.per_run if kernels else 0.0)
        found = sum(saved.values()) + (kernels.saved if kernels else 0.0)
        return min(cap, payback * max((1.0 - MARGIN) * run, found))
    left = lambda share=1.0: start + allowance() * share - time.perf_counter()  # noqa: E731
    n_gemv = len(GEMV_GROUPINGS) - 1 if gemv_products.items else 0
    bar = progress_bar((len(pool) + n_gemv) * 2 + 1, "tinyllm: tuning the C products", "config") if progress else None
    last = [0.0]                                        # how long the last timing took
    timings = {"all": {}, "gemv": {}}                   # the best time of each candidate on its products
    warm = set()                                        # (path, products) timed once already

    def timed(choice, on=products):
        t0 = time.perf_counter()
        apply(lib, choice)
        if (choice["path"], id(on)) not in warm:        # (a warm call: packing buffers, the path's first use)
            on.time(lib)
            warm.add((choice["path"], id(on)))
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
                which = "all" if on is products else "gemv"
                seen = timings[which]                   # (the best of every timing, the first's too)
                if json.dumps(pool[0]) in seen:         # (pool[0] is what the others would replace)
                    saved[which] = seen[json.dumps(pool[0])] - min(seen.values())
            ranked = sorted((best[i], i) for i in alive if i in best)
            alive = [i for _, i in ranked[:max(1, len(ranked) // 2)]]
        return pool[min(best, key=best.get)] if best else pool[0]
    found, kernel_speedup = None, 1.0
    if shapes:
        per_run[0] = timed(pool[0])
    if kernels is not None:
        found, kernel_speedup, timings["kernels"] = kernel_path(kernels, lambda: start + allowance() * KERNEL_SEARCH)
    begun = min(1.0, (time.perf_counter() - start) / max(allowance(), 1e-9))  # (the share taken so far)
    share = begun + max(0.0, SEARCH_SHARE - begun) * len(pool) / (len(pool) + n_gemv)
    choice = halving(pool, products, share) if shapes else pool[0]
    if n_gemv:
        choice = halving([choice] + gemv_candidates(choice), gemv_products, SEARCH_SHARE)
    choice = {**choice, "kernels": found}
    default, ratios = pool[0], []
    products_part = {**choice, "kernels": None}
    while shapes and products_part != default and left() > 2 * last[0] and len(ratios) < 9:
        ratios.append(timed(products_part) / timed(default))
    if bar is not None:
        bar.close()
    speedup = 1 / float(np.median(ratios)) if ratios else 1.0
    if speedup * MARGIN < 1.0:
        choice, speedup = {**default, "kernels": choice["kernels"]}, 1.0
    apply(lib, choice)
    return {"choice": choice, "default": default, "seconds": time.perf_counter() - start, "allowed": allowance(),
            "per_run": per_run[0] + (kernels.per_run if kernels else 0.0), "speedup": speedup, "pairs": len(ratios),
            "timings": timings, "kernel_speedup": kernel_speedup}


def tune_and_store(lib, shapes, seconds=None, progress=True, runtime=None, payback=None, run_seconds=None):
    """search, then the result stored for this machine (atomically: written beside, then renamed)."""
    key = machine(lib)
    result = search(lib, shapes, seconds, progress, runtime, payback, run_seconds)
    path = store_path(key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    record = {"format": FORMAT, "machine": key, "shapes": [list(s) + [n] for s, n in sorted(shapes.items())],
              **result}
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, path)
    return record
