"""cffi (out-of-line, API mode) build of tinyllm's C sgemm as the module tinyllm._sgemm.

From setup.py:   setup(..., cffi_modules=["runtime_c/build_sgemm.py:ffibuilder"])
In place:        python runtime_c/build_sgemm.py
                 (compiles under build/cffi_sgemm/ and copies the extension into tinyllm/)

Then:
    from tinyllm._sgemm import ffi, lib
    lib.tl_sgemm(0, 0, M, N, K, ffi.from_buffer("float[]", a), K, ffi.from_buffer("float[]", b), N,
                 0.0, ffi.from_buffer("float[]", c), N)

The object is built for baseline x86-64 (no -march=native): the AVX2+FMA code
carries its own target attributes and is picked at run time, so the module runs
on any x86-64 CPU, and also builds on aarch64 (portable path only).
"""
import os
import shutil
import sys

import cffi

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _cdef():
    # sgemm.h doubles as the cdef; cffi's parser takes no preprocessor lines.
    with open(os.path.join(HERE, "sgemm.h")) as f:
        return "".join(line for line in f if not line.lstrip().startswith("#"))


def make_ffibuilder(root=""):
    """The FFI builder, with paths under `root`: setuptools wants them relative to the
    repository root (setup.py runs from there), cffi's own compile() wants them absolute
    (it compiles from inside its tmpdir)."""
    rel = lambda p: os.path.join(root, p)  # noqa: E731
    ffi = cffi.FFI()
    ffi.cdef(_cdef())
    ffi.set_source(
        "tinyllm._sgemm",
        '#include "sgemm.h"',
        sources=[rel("runtime_c/sgemm.c")],
        include_dirs=[rel("runtime_c")],
        depends=[rel("runtime_c/sgemm.h"), rel("runtime_c/common.h")],
        # -fno-wrapv undoes the -fwrapv in Python's own CFLAGS: with wrapping signed ints
        # gcc stops vectorising loops that index with int arithmetic.
        extra_compile_args=["-O3", "-fno-wrapv", "-fopenmp", "-Wall"],
        extra_link_args=["-fopenmp"],
    )
    return ffi


ffibuilder = make_ffibuilder()


def build_in_place(verbose=False):
    """Compile the extension and copy it to tinyllm/; returns the path of the copy."""
    built = make_ffibuilder(ROOT).compile(tmpdir=os.path.join(ROOT, "build", "cffi_sgemm"), verbose=verbose)
    target = os.path.join(ROOT, "tinyllm", os.path.basename(built))
    shutil.copyfile(built, target + ".tmp")
    os.replace(target + ".tmp", target)  # atomic, so a running import never sees half a file
    return target


if __name__ == "__main__":
    print(build_in_place(verbose="-v" in sys.argv[1:]))
