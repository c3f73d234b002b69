"""Compiles generated C kernels into shared libraries, cached on disk by a hash of their source, and loads them
through cffi. Safe when several processes compile at once: each writes a private temporary file and renames it
into place atomically. With no C compiler, `available()` is False and callers fall back (with one warning)."""
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import cffi

ffi = cffi.FFI()  # makes the char*[] argument arrays; each library gets its own FFI for its declarations
# -ffp-contract=off: a value recomputed in two kernels must round the same in both (amax's backward compares
# them), so no kernel may fuse a multiply-add the other does not
FLAGS = ["-O3", "-march=native", "-fPIC", "-shared", "-fopenmp", "-fno-math-errno", "-ffp-contract=off", "-std=gnu11",
         "-w"]
_lock = threading.Lock()
_libs = []  # loaded libraries stay alive for the life of the process
_warned = [False]


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


def _build(source, path):
    """Compile `source` to the shared library `path` (atomically)."""
    fd, tmp_c = tempfile.mkstemp(suffix=".c", dir=os.path.dirname(path))
    with os.fdopen(fd, "w") as f:
        f.write(source)
    tmp_so = tmp_c[:-2] + ".so"
    try:
        for flags in (FLAGS, [f for f in FLAGS if f != "-march=native"]):
            proc = subprocess.run([compiler(), *flags, tmp_c, "-o", tmp_so, "-lm"], capture_output=True, text=True)
            if proc.returncode == 0:
                os.replace(tmp_so, path)
                return
        raise RuntimeError(f"C compiler failed on a generated kernel:\n{proc.stderr[-2000:]}")
    finally:
        for p in (tmp_c, tmp_so):
            if os.path.exists(p):
                os.remove(p)


def load(sources):
    """{name: C source} -> {name: callable(bufs)}. Compiles what the disk cache lacks, two chunks in parallel."""
    names = sorted(sources)
    chunks = [names[i::2] for i in range(2)] if len(names) > 8 else [names]
    jobs = []
    for chunk in (c for c in chunks if c):
        text = "\n".join(sources[n] for n in chunk)
        digest = hashlib.sha256((" ".join(FLAGS) + "\n" + text).encode()).hexdigest()[:24]  # flags change the code
        jobs.append((chunk, text, os.path.join(cache_dir(), f"k_{digest}.so")))
    missing = [(text, path) for _, text, path in jobs if not os.path.exists(path)]
    if missing:
        with ThreadPoolExecutor(len(missing)) as pool:
            list(pool.map(lambda job: _build(*job), missing))
    out = {}
    with _lock:
        for chunk, _, path in jobs:
            lib_ffi = cffi.FFI()
            lib_ffi.cdef("".join(f"void {n}(char **bufs);\n" for n in chunk))
            lib = lib_ffi.dlopen(path)
            _libs.append((lib_ffi, lib))
            for n in chunk:
                out[n] = getattr(lib, n)
    return out

