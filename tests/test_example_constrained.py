"""examples/constrained.py as a user runs it, on checkpoint files of examples/gpt.py --tiny (numpy runtime): every
sample that ends matches, and bad input is one line with exit code 2."""
import re

import pytest

from helpers import run_example as run, small_corpus


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A character model (no end-of-text token) and a BPE model (with one)."""
    root = tmp_path_factory.mktemp("constrained_example")
    corpus = small_corpus(root)
    for name, flags in (("char", []), ("bpe", ["--tokenizer", "bpe", "--vocab-size", "300"])):
        r = run("gpt.py", "--tiny", "--data", str(corpus), "--ckpt-dir", str(root / name), "--max-iters", "2",
                "--sample-tokens", "0", *flags, cwd=root)
        assert r.returncode == 0, r.stderr
    return root


@pytest.mark.parametrize("spec, verdict", [(["--choice", "yes", "no", "the cat"], "one of the choices"),
                                           (["--regex", r"\d{2}-\d{2}"], "matches")])
def test_every_sample_matches(trained, spec, verdict):
    r = run("constrained.py", "--ckpt-dir", str(trained / "bpe"), *spec, "--num-samples", "3", "--max-new-tokens",
            "12", "--temperature", "1.0", cwd=trained)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if re.match(r"\d+: ", line)]
    assert len(lines) == 3
    for line in lines:  # each ended within 12 tokens (the choices are short; 5 characters of a date)
        assert line.endswith(f"; {verdict})"), line


@pytest.mark.parametrize("flags, words", [
    (["--ckpt-dir", "{char}", "--choice", "a"], "has no eot_token"),
    (["--ckpt-dir", "{bpe}", "--regex", "(a"], "compile_regex"),
    (["--ckpt-dir", "{bpe}/missing", "--choice", "a"], "missing"),
])
def test_bad_input_is_one_line_and_exit_code_2(trained, flags, words):
    flags = [f.format(char=trained / "char", bpe=trained / "bpe") for f in flags]
    r = run("constrained.py", *flags, cwd=trained)
    assert r.returncode == 2 and words in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
