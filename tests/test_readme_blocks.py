"""The docs' code runs as written: every ```python block of README.md and docs/getting-started.md runs, alone, in a
fresh interpreter in an empty directory (a block that needs an earlier one's names, or a file of the checkout, fails
here as it would for a reader); and every `python examples/X.py --flag ...` in the docs (shell blocks, inline code)
and in the examples' own usage docstrings names flags that X.py's --help lists, so a renamed flag cannot stay in the
docs under its old name.

A block whose first line is `# after python examples/gpt.py ...` reads the checkpoint directory out/gpt of such a
run: the test makes one first, with a seconds-long tiny run. A block whose first line is `# notest` is not run: for
the few that truly take minutes (none today)."""
import ast
import functools
import os
import re
import subprocess
import sys

import pytest

from helpers import run_example, small_corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = ["README.md", "docs/getting-started.md"]  # whose python blocks run
CHECK_FLAGS = sorted({*RUN, *(f"docs/{f}" for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))})
FENCE = re.compile(r"^```(\w*)\s*$")


def fenced_blocks(path):
    """(line of the block's first code line, language, code) of each fenced block of a markdown file."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        lines = f.read().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            blocks.append((i + 2, m.group(1), "\n".join(lines[i + 1:end])))
            i = end
        i += 1
    return blocks


def python_blocks():
    return [pytest.param(path, line, code, id=f"{path}:{line}")
            for path in RUN for line, lang, code in fenced_blocks(path) if lang == "python"]


def test_the_docs_have_python_blocks():
    """The parser finds the blocks (a broken one would let every block pass by finding none)."""
    assert len(python_blocks()) >= 4


@pytest.mark.parametrize("path, line, code", python_blocks())
def test_python_block_runs(path, line, code, tmp_path):
    if code.startswith("# notest"):
        pytest.skip(f"{path}:{line} is marked # notest")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    if code.startswith("# after python examples/gpt.py"):  # the reader has trained a model into out/gpt
        r = run_example("gpt.py", "--tiny", "--data", str(small_corpus(tmp_path)), "--max-iters", "2",
                        "--sample-tokens", "0", "--ckpt-dir", "out/gpt", cwd=tmp_path)
        assert r.returncode == 0, f"{path}:{line}: examples/gpt.py --tiny, to make out/gpt, fails:\n{r.stderr}"
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"{path}:{line}: the python block starting here fails:\n{r.stderr[-3000:]}"


# ---- the flags of the example commands the docs show -----------------------------------------------------------
COMMAND = re.compile(r"python examples/(\w+)\.py((?:[ \t]+[^\s&|;#`]+)*)")


def example_commands(path):
    """(line, script, flags) of each `python examples/X.py ...` in a markdown file: in fenced blocks one per line
    (a `#` comment cut off), and in inline code spans outside them (which may wrap over lines)."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        lines = f.read().splitlines()
    pieces, prose, in_block = [], [], False  # prose: the lines outside blocks, blank inside (the numbers stay)
    for n, line in enumerate(lines, 1):
        if line.startswith("```"):
            in_block = not in_block
        elif in_block:
            pieces.append((n, line.split(" #")[0]))
        prose.append("" if in_block or line.startswith("```") else line)
    prose = "\n".join(prose)
    for m in re.finditer(r"`([^`]+)`", prose):
        pieces.append((prose.count("\n", 0, m.start()) + 1, m.group(1).replace("\n", " ")))
    return [(n, script_of(m), re.findall(r"(?<!\S)(--[\w-]+)", m.group(2)))
            for n, piece in pieces for m in COMMAND.finditer(piece)]


def script_of(match):
    """The example a command runs, with its subcommand when the first word after it is one ("interpret lens")."""
    words = match.group(2).split()
    return f"{match.group(1)} {words[0]}" if words and re.fullmatch(r"[a-z]+", words[0]) else match.group(1)


@functools.lru_cache(maxsize=None)
def listed_flags(script):
    """The flags in the usage line of examples/<script>.py --help (not the hidden old names, nor flags that the help
    text mentions)."""
    name, *sub = script.split()
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", f"{name}.py"), *sub, "--help"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 0, f"examples/{name}.py {' '.join(sub)} --help fails:\n{r.stderr[-2000:]}"
    usage = r.stdout.split("\n\n")[0]
    return frozenset(re.findall(r"(?<![\w-])--[\w-]+", usage))


def docstring_commands(path):
    """(line, script, flags) of each `python examples/X.py ...` in the docstring of an example (its usage lines)."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        doc = ast.get_docstring(ast.parse(f.read()), clean=False) or ""
    return [(n, script_of(m), re.findall(r"(?<!\S)(--[\w-]+)", m.group(2)))
            for n, line in enumerate(doc.splitlines(), 1) for m in COMMAND.finditer(line.split(" #")[0])]


def test_example_commands_in_the_docs_use_listed_flags():
    commands = [(path, *c) for path in CHECK_FLAGS for c in example_commands(path)]
    commands += [(f"examples/{f}", *c) for f in sorted(os.listdir(os.path.join(ROOT, "examples"))) if f.endswith(".py")
                 for c in docstring_commands(f"examples/{f}")]
    assert len(commands) >= 10 and {"gpt", "sample", "quantize", "lora", "interpret lens"} <= {script for _, _, script, _ in commands}
    wrong = [f"{path}:{line}: examples/{script.replace(' ', '.py ', 1) if ' ' in script else script + '.py'} --help "
             f"does not list {flag} (an old name? a typo?); it lists "
             f"{', '.join(sorted(listed_flags(script)))}"
             for path, line, script, flags in commands for flag in flags if flag not in listed_flags(script)]
    assert not wrong, "\n".join(wrong)
