"""What every bench shares: the environment of a worker subprocess that runs at a fixed thread count, the pause
between libraries timed side by side, the training step they time, the CPU they ran on, and the machine's limits
(FMA peak, memory bandwidth) they report their figures against."""
import glob
import os
import platform
import re
import time

SETTLE_S = 0.15  # sleep between libraries: > OpenBLAS's idle spin (2^28 cycles, ~0.1 s) and libgomp's (~ms)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker_env(threads, openblas_coretype=None):
    """Every library's thread count set before anything is imported, threads pinned (OMP_PROC_BIND) unless the
    caller chose otherwise, and OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE removed so numpy runs the OpenBLAS kernel it
    would pick for this CPU by itself; or, given `openblas_coretype` (Haswell: its AVX2 kernel), that kernel."""
    env = dict(os.environ)
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        env.pop(var, None)
    if openblas_coretype:
        env["OPENBLAS_CORETYPE"] = openblas_coretype
    env.update(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads), TINYLLM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads))
    env.setdefault("OMP_PROC_BIND", "true")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def gpt_train_step(model, opt, autocast=None):
    """The step the GPT benches time: forward (the loss), backward, optimizer step, zero_grad; returns the loss.
    `autocast`: a tinyllm.autocast context the forward runs in (mixed precision)."""
    import contextlib
    region = autocast if autocast is not None else contextlib.nullcontext()

    def step(x, y):
        with region:
            _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    return step


def cpu_model():
    """The CPU's model name (/proc/cpuinfo), for a bench's header."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def split_tokens(ckpt_dir, name):
    """The token file examples/gpt.py cached beside a checkpoint ("train" or "val": train.bin / val.bin), as a
    memmap of the dtype its data.json names."""
    import json

    import numpy as np
    with open(os.path.join(ckpt_dir, "data.json")) as f:
        meta = json.load(f)
    return np.memmap(os.path.join(ckpt_dir, f"{name}.bin"), dtype=meta["dtype"], mode="r")


SIMD_FLAGS = re.compile(r"^(sse4_2|avx|avx2|fma|f16c|avx512\w*|avx_vnni\w*|amx\w*|sve\w*|asimd\w*)$")


def cpu_description():
    """Model name, family/model, the SIMD flags and the caches of this CPU, from /proc/cpuinfo and sysfs."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = [f for f in (fields.get("flags") or fields.get("Features") or "").split() if SIMD_FLAGS.match(f)]
    caches = []
    for index in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        try:
            level, kind, size = (open(os.path.join(index, n)).read().strip() for n in ("level", "type", "size"))
        except OSError:
            continue
        if kind != "Instruction":
            caches.append(f"L{level} {size}")
    model = fields.get("model name", platform.processor() or platform.machine())
    family = f"family {fields['cpu family']} model {fields['model']}" if "cpu family" in fields else ""
    return {"model": model, "family": family, "flags": flags, "caches": caches}


def copy_bandwidth(lib, ffi, threads, rounds, settle=True, arrays=None):
    """STREAM-style copy of 256 MiB (runtime_c/cpu.c's tl_cpu_stream_copy: memcpy of one share per thread, on
    `threads` threads): the best GB/s over the rounds, bytes read + written. `settle`: sleep SETTLE_S before each
    round, so that another library's spinning threads have stopped. `arrays`: (src, dst), float32 arrays of one
    size, already written (a fresh array's first pass is page faults, not bandwidth); default two new ones."""
    import numpy as np
    if arrays is None:
        arrays = np.ones(64 << 20, np.float32), np.ones(64 << 20, np.float32)
    src, dst = arrays
    psrc, pdst = ffi.cast("float *", src.ctypes.data), ffi.cast("float *", dst.ctypes.data)
    best = float("inf")
    for _ in range(max(3, rounds)):
        if settle:
            time.sleep(SETTLE_S)
        t = time.perf_counter()
        lib.tl_cpu_stream_copy(pdst, psrc, src.size, threads)
        best = min(best, time.perf_counter() - t)
    return 2 * src.nbytes / best / 1e9


def read_bandwidth(lib, ffi, src, threads, rounds):
    """Best GB/s of a read-only stream over `src` (a float32 array: runtime_c/peak.c's tl_peak_read, one share per
    thread, on `threads` threads): what a kernel that only reads, a GEMV over its weights, can get."""
    p = ffi.cast("float *", src.ctypes.data)
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        lib.tl_peak_read(p, src.size, threads)
        best = min(best, time.perf_counter() - t)
    return src.nbytes / best / 1e9


FMA_SAMPLE_S, FMA_REPEATS = 0.002, 25  # one FMA timing, and how many: the best is one no other process disturbed


def fma_peaks(lib, combos):
    """{(path, threads): (best, median) GFLOP/s} of FMA_REPEATS runs each of runtime_c/peak.c's tl_peak_fma_gflops
    (12 independent multiply-add chains per thread, in the path's vectors, on that many threads), each about
    FMA_SAMPLE_S long, the paths of one thread count interleaved round by round (so a neighbour's burst hits them
    alike), thread counts one after the other (between a one-thread and a two-thread run the second thread would
    fall asleep, and waking it on a busy core takes milliseconds). The best is the machine's limit; the median,
    what its cores gave amid other processes. Zeros without the path."""
    import statistics
    iters, rates = {}, {c: [] for c in combos}
    for path, threads in sorted(combos, key=lambda c: c[1]):
        probe = 20000
        rate = lib.tl_peak_fma_gflops(path, threads, probe)  # also warms the vector unit and the thread pool up
        flops_per_iter = 2 * 12 * (4, 8, 16)[path] * threads
        iters[path, threads] = max(probe, int(FMA_SAMPLE_S * rate * 1e9 / flops_per_iter)) if rate > 0 else 0
    for n in sorted({n for _, n in combos}):
        for _ in range(FMA_REPEATS):
            for c in combos:
                if c[1] == n:
                    rates[c].append(lib.tl_peak_fma_gflops(*c, iters[c]))
    return {c: (max(r), statistics.median(r)) for c, r in rates.items()}


def given_fma(threads, seconds):
    """GFLOP/s that `threads` threads of FMA chains (fma_peaks' loop, on the path tinyllm's kernels use) got over
    `seconds` of back-to-back runs: total FLOPs over total time, not the best run. Timed between a bench's turns
    and as long as one, it is what the cores gave while other processes shared them: a bench's figure over it
    says how close to the limit it ran in the share it got (MFU "given")."""
    from tinyllm._kernels import lib
    path, mask = lib.tl_cpu_path(), os.sched_getaffinity(0)
    flops_per_iter = 2 * 12 * (4, 8, 16)[path] * threads
    iters = max(20000, int(FMA_SAMPLE_S * lib.tl_peak_fma_gflops(path, threads, 20000) * 1e9 / flops_per_iter))
    flops, start = 0.0, time.perf_counter()
    try:
        while time.perf_counter() - start < seconds:
            t = time.perf_counter()
            rate = lib.tl_peak_fma_gflops(path, threads, iters)  # (counts the threads the region really had)
            flops += rate * 1e9 * (time.perf_counter() - t)
    finally:
        os.sched_setaffinity(0, mask)
    return flops / (time.perf_counter() - start) / 1e9


def given_read(src, threads, seconds):
    """GB/s a read-only stream over `src` (read_bandwidth's) got over `seconds` of back-to-back passes: given_fma's
    counterpart for the memory system, what the cores' share of it was while other processes ran."""
    from tinyllm._kernels import ffi, lib
    p, mask = ffi.cast("float *", src.ctypes.data), os.sched_getaffinity(0)
    done, start = 0, time.perf_counter()
    try:
        while time.perf_counter() - start < seconds:
            lib.tl_peak_read(p, src.size, threads)
            done += src.nbytes
    finally:
        os.sched_setaffinity(0, mask)
    return done / (time.perf_counter() - start) / 1e9


def machine_limits(threads, rounds=3):
    """This machine's limits, measured now in this process (about a second): {"fma": {path name: {n: GFLOP/s}},
    "fma_median": the same, the median run's, "copy": {n: GB/s read + written}, "read": {n: GB/s}, "path": the
    path tinyllm's kernels use, "l3": bytes, "avx512_full_width": cpu.c's calibration}, for n = "1" and
    str(threads) threads (string keys: the dict goes through JSON from a bench's worker), FMA peaks for each path
    tinyllm has on this CPU (cpu.h). The threads are the C runtime's own (OpenMP, as its kernels run). The calling
    thread's CPU affinity is restored after (an OpenMP runtime with OMP_PROC_BIND pins it at its first parallel
    region)."""
    import numpy as np
    from tinyllm._kernels import ffi, lib
    mask = os.sched_getaffinity(0)
    counts = sorted({1, threads})
    try:
        names = {p: ffi.string(lib.tl_cpu_path_name(p)).decode() for p in range(3) if lib.tl_cpu_supports(p)}
        peaks = fma_peaks(lib, [(p, n) for p in names for n in counts])
        runs = {name: {str(n): peaks[p, n] for n in counts} for p, name in names.items()}
        fma = {name: {n: best for n, (best, _) in v.items()} for name, v in runs.items()}
        fma_median = {name: {n: median for n, (_, median) in v.items()} for name, v in runs.items()}
        time.sleep(SETTLE_S)
        arrays = np.ones(64 << 20, np.float32), np.ones(64 << 20, np.float32)  # 256 MiB: 8 x the L3s seen so far
        read = {str(n): read_bandwidth(lib, ffi, arrays[0], n, rounds) for n in counts}
        copy = {str(n): copy_bandwidth(lib, ffi, n, rounds, settle=False, arrays=arrays) for n in counts}
    finally:
        os.sched_setaffinity(0, mask)
    path = ffi.string(lib.tl_cpu_path_name(lib.tl_cpu_path())).decode()
    return {"fma": fma, "fma_median": fma_median, "copy": copy, "read": read, "path": path,
            "l3": lib.tl_cpu_cache_size(3), "avx512_full_width": bool(lib.tl_cpu_avx512_full_width())}


def best_limits(*measured):
    """The best of each figure over several machine_limits() of one process (taken before and after a bench's
    timings: a neighbour's burst during one does not lower the limit)."""
    import statistics
    out = {k: v for k, v in measured[0].items() if k not in ("fma", "fma_median", "copy", "read")}
    out["fma"] = {p: {n: max(m["fma"][p][n] for m in measured) for n in measured[0]["fma"][p]}
                  for p in measured[0]["fma"]}
    out["fma_median"] = {p: {n: statistics.median(m["fma_median"][p][n] for m in measured)
                             for n in measured[0]["fma"][p]} for p in measured[0]["fma"]}
    for key in ("copy", "read"):
        out[key] = {n: max(m[key][n] for m in measured) for n in measured[0][key]}
    return out


def peak_gflops(limits, threads, path=None):
    """The FMA peak of `threads` threads on `path` (default: the path tinyllm's kernels use)."""
    return limits["fma"][path or limits["path"]][str(threads)]


def bandwidth_gbs(limits, threads):
    """The memory roofline's bandwidth for `threads` threads: the higher of the read-only stream and the copy
    (read + written), both measured in this run."""
    return max(limits["read"][str(threads)], limits["copy"][str(threads)])


def limits_lines(limits):
    """The header lines that state the limits a bench's fractions are taken against, and how they were measured."""
    counts = list(limits["fma"][limits["path"]])
    per = lambda d: " / ".join(f"{d[n]:,.1f}" for n in counts)  # noqa: E731
    fma = ", ".join(f"{p}{'*' if p == limits['path'] else ''} {per(v)}" for p, v in limits["fma"].items())
    lines = [f"machine limits, measured in this run (thread counts {' / '.join(map(str, counts))}): FMA peak GFLOP/s "
             f"{fma} (12 independent multiply-add chains per thread, best of {FMA_REPEATS} x {FMA_SAMPLE_S * 1e3:g} "
             f"ms; portable: 4-lane multiply + add, no FMA in the baseline ISA; * = the path tinyllm's kernels use)",
             f"  the median FMA run: {limits['path']} {per(limits['fma_median'][limits['path']])} GFLOP/s, what the "
             "cores gave while other processes ran (the best over the median: how much they took)",
             f"  memory GB/s: read-only stream {per(limits['read'])}, copy (read + written) {per(limits['copy'])} "
             f"(256 MiB arrays); L3 {limits['l3'] / 2**20:g} MiB"]
    picked = limits["fma"][limits["path"]]
    for n in counts[1:]:  # a second thread that adds nothing: say so, as every fraction of that peak depends on it
        if picked[n] < 0.75 * int(n) * picked["1"]:
            lines.append(f"  WARNING: {n} threads reached only {picked[n] / picked['1']:.2f}x one thread's FMA peak in "
                         "this run: the cores were not all free to them (another process or the host held one), or "
                         "they share a physical core (SMT); fractions of this peak are not comparable to other runs")
    if "avx512" in limits["fma"] and "avx2" in limits["fma"]:
        r = " / ".join(f"{limits['fma']['avx512'][n] / limits['fma']['avx2'][n]:.2f}" for n in counts)
        lines.append(f"  avx512 / avx2 FMA peak {r}; the runtime's own calibration (cpu.c) finds "
                     + ("full-width 512-bit FMAs" if limits["avx512_full_width"] else
                        "512-bit FMAs at the 256-bit rate (double-pumped): avx512 adds no FLOPs here"))
    return lines


def gpt_train_flops_per_token(n_params, n_layer, n_embd, block_size):
    """Model FLOPs of one training token, PaLM's (appendix B) and nanoGPT's estimate_mfu formula: 6 N for the
    products of the weights (forward 2, backward 4 per weight; N without the position embedding, which no product
    reads, but with the token embedding, the tied lm_head's weight) plus 12 n_layer T d for attention's two
    T x T products (forward and backward, the causal mask's skipped half counted too, as both count it)."""
    return 6 * n_params + 12 * n_layer * block_size * n_embd


def decode_weight_bytes(model):
    """Bytes of weights one decoded token reads: every parameter and quantized buffer, except that an embedding
    table contributes one row (the lookup) unless a linear layer reads it whole (GPT's tied lm_head)."""
    from tinyllm.nn import Embedding, Linear
    from tinyllm.quantization import model_nbytes
    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, Linear)}
    total = model_nbytes(model)
    for m in model.modules():
        if isinstance(m, Embedding) and id(m.weight) not in linear_weights:
            w = m.weight
            total -= w.numel() * w.dtype.itemsize * (1 - 1 / w.shape[0])
    return int(total)
