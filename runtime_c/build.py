"""cffi (out-of-line, API mode) build of tinyllm's prebuilt C kernels as the module tinyllm._kernels.

Every runtime_c/*.c is compiled into the module, and every header but the private ones (PRIVATE_HEADERS) doubles
as the cdef: keep those to plain declarations (lines starting with '#' are dropped; cffi's parser takes no
preprocessor lines).

From setup.py:   setup(..., cffi_modules=["runtime_c/build.py:ffibuilder"])
In place:        python runtime_c/build.py
                 (compiles under build/cffi_kernels/ and copies the extension into tinyllm/)

Then:
    from tinyllm._kernels import ffi, lib
    lib.tl_sgemm(0, 0, M, N, K, ffi.from_buffer("float[]", a), K, ffi.from_buffer("float[]", b), N,
                 0.0, ffi.from_buffer("float[]", c), N)

The object is built for baseline x86-64 (no -march=native): AVX2+FMA code carries its own target attributes
and is picked at run time, so the module runs on any x86-64 CPU, and also builds on aarch64 (portable paths).
"""
import glob
import os
import shutil
import sys

import cffi

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# Shared by the sources (macros, inline helpers, declarations of functions hidden from the module), not part of the
# interface: gemv.c for sgemm.c, and what the files of the sgemm, of attention and of the quantized GEMV share.
PRIVATE_HEADERS = {"common.h", "formats.h", "gemv.h", "sgemm_internal.h", "attention_internal.h",
                   "qmatmul_internal.h"}


def _names(pattern):
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(HERE, pattern)))


def _headers():
    return [h for h in _names("*.h") if h not in PRIVATE_HEADERS]


def _cdef():
    lines = []
    for header in _headers():
        with open(os.path.join(HERE, header)) as f:
            lines += [line for line in f if not line.lstrip().startswith("#")]
    return "".join(lines)


def make_ffibuilder(root=""):
    """The FFI builder, with paths under `root`: setuptools wants them relative to the repository root
    (setup.py runs from there), cffi's own compile() wants them absolute (it compiles from inside its tmpdir)."""
    rel = lambda name: os.path.join(root, "runtime_c", name)  # noqa: E731
    ffi = cffi.FFI()
    ffi.cdef(_cdef())
    ffi.set_source(
        "tinyllm._kernels",
        "".join(f'#include "{h}"\n' for h in _headers()),
        sources=[rel(c) for c in _names("*.c")],
        include_dirs=[rel("")],
        depends=[rel(h) for h in _names("*.h")],
        # -fno-wrapv undoes the -fwrapv in Python's own CFLAGS: with wrapping signed ints gcc stops vectorising
        # loops that index with int arithmetic. -ffp-contract=off as in the generated kernels: a value computed
        # here and recomputed there rounds alike.
        extra_compile_args=["-O3", "-fno-wrapv", "-ffp-contract=off", "-fopenmp", "-Wall"],
        extra_link_args=["-fopenmp"],
    )
    return ffi


ffibuilder = make_ffibuilder()


def build_in_place(verbose=False):
    """Compile the extension and copy it to tinyllm/; returns the path of the copy."""
    built = make_ffibuilder(ROOT).compile(tmpdir=os.path.join(ROOT, "build", "cffi_kernels"), verbose=verbose)
    target = os.path.join(ROOT, "tinyllm", os.path.basename(built))
    shutil.copyfile(built, target + ".tmp")
    os.replace(target + ".tmp", target)  # atomic, so a running import never sees half a file
    return target


if __name__ == "__main__":
    print(build_in_place(verbose="-v" in sys.argv[1:]))
