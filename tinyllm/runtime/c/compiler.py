"""Compiles generated C kernels into shared libraries, cached on disk, and loads them through cffi. Safe when several
processes compile at once: each writes a private temporary file and renames it into place atomically. With no C
compiler, `available()` is False and callers fall back (with one warning).

The cache is per kernel: a library holds the kernels compiled together, and an index entry per kernel, named by the
hash of its source, of the flags of its CPU path and of the compiler, points to its library. So a kernel is found
again whatever else was compiled with it (another test order, another program), and the source's local headers are
hashed by their contents, not their paths, so checkouts at other paths (each CI run's clone) share the cache.

The CPU path (see path() and docs/architecture.md, "Which CPU code runs") is read on every load(), so set_path()
(for tests) switches the kernels compiled afterwards."""
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import cffi

ffi = cffi.FFI()  # makes the char*[] argument arrays; each library gets its own FFI for its declarations
# -ffp-contract=off: a value recomputed in two kernels must round the same in both (amax's backward compares
# them), so no kernel may fuse a multiply-add the other does not. -fno-trapping-math: nothing reads the FP
# exception flags, and without it gcc may not if-convert tl_expf's selects on AVX2 (no masked arithmetic there), so
# exp stays scalar. It changes no value.
FLAGS = ["-O3", "-fPIC", "-shared", "-fopenmp", "-fno-math-errno", "-ffp-contract=off", "-fno-trapping-math",
         "-std=gnu11", "-w"]
PATHS = ("portable", "avx2", "avx512")  # tl_cpu_path()'s numbering
X86 = platform.machine().lower() in ("x86_64", "amd64")
# The instructions each path may use: the x86-64 baseline (SSE2) plus exactly what tl_cpu_supports checks for that
# path, never -march=native (under TINYLLM_CPU=avx2 on an AVX-512 CPU that would put AVX-512 in the kernels, and
# a cache shared between machines would hand them to CPUs without it). -mprefer-vector-width=512 keeps generic
# tuning's 512-bit vectors under any tuning (see path()). Elsewhere (aarch64) only the portable path exists and it
# takes the compiler's baseline (NEON).
ISA = {"portable": ["-march=x86-64"], "avx2": ["-march=x86-64", "-mavx2", "-mfma"],
       "avx512": ["-march=x86-64", "-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
                  "-mprefer-vector-width=512"]} if X86 \
    else {p: [] for p in PATHS}
# Generated kernels only: AVX-512's instructions in 256-bit vectors, where 512-bit ones cost a core clock speed
# (tune.py times it against avx512 and avx2 and may choose it: set_kernel_path).
if X86:
    ISA["avx512-256"] = ISA["avx512"][:-1] + ["-mprefer-vector-width=256"]
_lock = threading.Lock()
_libs = []  # loaded libraries stay alive for the life of the process
_warned = [False]
_forced = [None]  # set_path's choice, for when no prebuilt module keeps it
_tuned = [None]  # set_kernel_path's choice for generated kernels (tune.py), or None
_prebuilt = []  # [lib or None, default path or None] once looked up (_lib)
_flags = []  # [the CPU's flags] once read


def cache_dir():
    root = os.environ.get("TINYLLM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "tinyllm")
    path = os.path.join(root, "kernels")
    os.makedirs(path, exist_ok=True)
    return path


def compiler():
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc") or shutil.which("clang")


def available():
    if compiler() is None:
        if not _warned[0]:
            _warned[0] = True
            warnings.warn("tinyllm: no C compiler found (set CC, or install gcc/clang): generated kernels run on "
                          "NumPy instead, which is much slower", RuntimeWarning, stacklevel=3)
        return False
    return True


def _cpu_flags():
    """The CPU's feature flags as Linux reports them (none elsewhere)."""
    if not _flags:
        _flags.append(set())
        try:
            with open("/proc/cpuinfo") as f:
                line = next((line for line in f if line.startswith("flags")), "flags:")
            _flags[0] = set(line.split(":", 1)[1].split())
        except OSError:
            pass
    return _flags[0]


def _fallback_path():
    """path() where the prebuilt module cannot say (missing, or built before cpu.c): TINYLLM_CPU (or set_path) where
    this CPU has it, else the best path below it; by default the best path this CPU has."""
    flags = _cpu_flags() if X86 else set()
    ok = ["portable"] + ["avx2"] * ({"avx2", "fma"} <= flags) + \
        ["avx512"] * ({"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags)
    want = _forced[0] or os.environ.get("TINYLLM_CPU") or ("portable" if os.environ.get("TINYLLM_NO_AVX2") == "1"
                                                            else "avx512")
    i = PATHS.index(want) if want in PATHS else len(PATHS) - 1
    while PATHS[i] not in ok:
        i -= 1
    return PATHS[i]


def _lib():
    """The prebuilt module's lib where it has the CPU-path functions of runtime_c/cpu.h, else None; and, once, its
    default for generated kernels: the best path this CPU has, unless TINYLLM_CPU asked for one (None then)."""
    if not _prebuilt:
        try:
            from ... import _kernels
            lib = _kernels.lib if hasattr(_kernels.lib, "tl_cpu_path") else None
        except ImportError:
            lib = None
        best = None
        if lib is not None and lib.tl_cpu_requested_path() < 0:
            best = PATHS[max(p for p in range(len(PATHS)) if lib.tl_cpu_supports(p))]
        _prebuilt[:] = [lib, best]
    return _prebuilt[0]


def path():
    """The CPU path kernels are compiled for now: "portable", "avx2" or "avx512". Where a path was asked for
    (TINYLLM_CPU, set_path) it is tl_cpu_path(), that one or the best below it this CPU has. Otherwise it is the best
    path this CPU has, even where tl_cpu_path() stays at avx2 because 512-bit FMAs run at the 256-bit rate (Zen 4's
    double-pumped unit): right for the FMA-bound sgemm and attention, but generated kernels are bound by the
    instructions and loads they issue, half as many at 512 bits. The tuner may choose another (set_kernel_path)."""
    lib = _lib()
    if lib is None:
        return _fallback_path()
    if _forced[0] is not None or _prebuilt[1] is None:
        return PATHS[lib.tl_cpu_path()]
    return _tuned[0] or _prebuilt[1]


def kernel_path_tunable():
    """True when set_kernel_path's choice applies: no path was asked for (TINYLLM_CPU, set_path)."""
    lib = _lib()
    return lib is not None and _forced[0] is None and _prebuilt[1] is not None


def set_kernel_path(name):
    """Generated kernels compiled from now on use `name` (a key of ISA) where no path was asked for (TINYLLM_CPU,
    set_path), the tuner's choice of their vector width (tune.py); None restores path()'s default. Kernels
    compiled before keep theirs. Returns path()."""
    if name is not None and (name not in ISA or not supports(name.split("-")[0])):
        raise ValueError(f"generated kernels cannot use {name!r} on this CPU: choose one of "
                         f"{', '.join(p for p in ISA if supports(p.split('-')[0]))}")
    _tuned[0] = name
    return path()


def set_path(name):
    """Makes the kernels compiled from now on, and the prebuilt ones, use path `name`, or the best one this CPU has
    below it; None restores the default. Returns the path in use. For tests: not while a kernel runs. (The C side's
    tl_cpu_set_path alone switches only the prebuilt kernels.)"""
    if name is not None and name not in PATHS:
        raise ValueError(f"unknown CPU path {name!r}: choose one of {', '.join(PATHS)}")
    lib = _lib()
    if lib is not None:
        lib.tl_cpu_set_path(-1 if name is None else PATHS.index(name))
    _forced[0] = name
    return path()


def supports(name):
    """True when this CPU (and OS) can run path `name`."""
    lib = _lib()
    if lib is not None:
        return bool(lib.tl_cpu_supports(PATHS.index(name)))
    saved, _forced[0] = _forced[0], name
    try:
        return _fallback_path() == name
    finally:
        _forced[0] = saved


_INCLUDE = re.compile(r'#include "(/[^"]+)"')
_headers = {}  # {absolute path: sha256 of its contents}
_toolchain = []  # [the compiler's identity] once asked


def _compiler_id():
    """The compiler's resolved path and its version line: another compiler must not reuse these libraries."""
    if not _toolchain:
        cc = compiler() or ""
        try:
            version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
        except OSError:
            version = ""
        _toolchain.append(f"{os.path.realpath(cc)} {version}")
    return _toolchain[0]


def _digest(text, cpu):
    """The cache key of source `text` on path `cpu`: the flags, the compiler, and the source with each local
    header (an absolute #include) named by its contents rather than where this checkout keeps it."""
    def by_contents(m):
        if m.group(1) not in _headers:
            with open(m.group(1), "rb") as f:
                _headers[m.group(1)] = hashlib.sha256(f.read()).hexdigest()
        return f'#include "{os.path.basename(m.group(1))}" /* {_headers[m.group(1)]} */'
    key = " ".join(FLAGS + ISA[cpu]) + "\n" + _compiler_id() + "\n" + _INCLUDE.sub(by_contents, text)
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def library_path(text, cpu):
    """Where the library of kernel source `text` compiled for path `cpu` is cached."""
    return os.path.join(cache_dir(), f"k_{cpu}_{_digest(text, cpu)}.so")  # _build compiles for the path it names


def _index_dir():
    path = os.path.join(os.path.dirname(cache_dir()), "kernel-index")
    os.makedirs(path, exist_ok=True)
    return path


def cached(source, cpu):
    """The cached library that holds the kernel of `source` (compiled for `cpu`), or None."""
    entry = os.path.join(_index_dir(), f"{cpu}_{_digest(source, cpu)}")
    return os.path.realpath(entry) if os.path.exists(entry) else None  # (a link to a deleted library: missing)


def _index(source, cpu, library):
    """Records that `library` holds the kernel of `source` (atomically: a link made aside, renamed into place)."""
    entry = os.path.join(_index_dir(), f"{cpu}_{_digest(source, cpu)}")
    tmp = f"{entry}.{os.getpid()}.{threading.get_ident()}.tmp"
    os.symlink(os.path.join("..", os.path.basename(cache_dir()), os.path.basename(library)), tmp)
    os.replace(tmp, entry)


def _build(source, library):
    """Compile `source` to the shared library `library` (atomically), for the CPU path its name gives."""
    cpu = os.path.basename(library).split("_")[1]
    fd, tmp_c = tempfile.mkstemp(suffix=".c", dir=os.path.dirname(library))
    with os.fdopen(fd, "w") as f:
        f.write(source)
    tmp_so = tmp_c[:-2] + ".so"
    try:
        # a compiler that rejects the path's flags (too old for AVX-512) gets the baseline ones: slower, never wrong
        for isa in ([ISA[cpu], ISA["portable"]] if ISA[cpu] != ISA["portable"] else [ISA[cpu]]):
            proc = subprocess.run([compiler(), *FLAGS, *isa, tmp_c, "-o", tmp_so, "-lm"], capture_output=True,
                                  text=True)
            if proc.returncode == 0:
                os.replace(tmp_so, library)
                return
        raise RuntimeError(f"C compiler failed on a generated kernel:\n{proc.stderr[-2000:]}")
    finally:
        for p in (tmp_c, tmp_so):
            if os.path.exists(p):
                os.remove(p)


def load(sources, cpu=None):
    """{name: C source} -> {name: callable(bufs)}, compiled for CPU path `cpu` (a key of ISA; default path()).
    Compiles the kernels the disk cache lacks, two chunks in parallel."""
    cpu = cpu or path()
    where = {n: cached(sources[n], cpu) for n in sorted(sources)}
    todo = [n for n in where if where[n] is None]
    chunks = [todo[i::2] for i in range(2)] if len(todo) > 8 else [todo]
    jobs = []
    for chunk in (c for c in chunks if c):
        text = "\n".join(sources[n] for n in chunk)
        jobs.append((chunk, text, library_path(text, cpu)))
    missing = [(text, so) for _, text, so in jobs if not os.path.exists(so)]
    if missing:
        with ThreadPoolExecutor(len(missing)) as pool:
            list(pool.map(lambda job: _build(*job), missing))
    for chunk, _, so in jobs:
        for n in chunk:
            _index(sources[n], cpu, so)
            where[n] = so
    out = {}
    with _lock:
        for so in sorted(set(where.values())):
            names = [n for n in where if where[n] == so]
            lib_ffi = cffi.FFI()
            lib_ffi.cdef("".join(f"void {n}(char **bufs);\n" for n in names))
            lib = lib_ffi.dlopen(so)
            _libs.append((lib_ffi, lib))
            for n in names:
                out[n] = getattr(lib, n)
    return out
