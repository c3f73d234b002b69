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


SCHEMA = '{"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, ' \
         '"maximum": 9}}, "required": ["ok", "n"], "additionalProperties": false}'
GBNF = 'root ::= "(" expr ")"\nexpr ::= [0-9] | "(" expr ")" | [0-9] ("+" | "*") [0-9]\n'


@pytest.mark.parametrize("spec, verdict", [(["--choice", "yes", "no", "the cat"], "one of the choices"),
                                           (["--regex", r"\d{2}-\d{2}"], "matches"),
                                           (["--json-schema", "schema.json"], "valid for the schema"),
                                           (["--gbnf", "expr.gbnf"], "in the grammar")])
def test_every_sample_matches(trained, spec, verdict):
    (trained / "schema.json").write_text(SCHEMA)
    (trained / "expr.gbnf").write_text(GBNF)
    r = run("constrained.py", "--ckpt", str(trained / "bpe"), *spec, "--num-samples", "3", "--max-new-tokens",
            "40", "--temperature", "1.0", cwd=trained)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if re.match(r"\d+: ", line)]
    assert len(lines) == 3
    for line in lines:  # each ended within 40 tokens (short choices, 5 characters of a date; the document's longest
        # spelling, every key character a \\u escape, is under 40 bytes)
        assert line.endswith(f"; {verdict})"), line


@pytest.mark.parametrize("flags, words", [
    (["--ckpt-dir", "{char}", "--choice", "a"], "has no eot_token"),
    (["--ckpt-dir", "{bpe}", "--regex", "(a"], "compile_regex"),
    (["--ckpt-dir", "{bpe}/missing", "--choice", "a"], "missing"),
    (["--ckpt-dir", "{bpe}", "--json-schema", "nowhere.json"], "cannot read nowhere.json"),
    (["--ckpt-dir", "{bpe}", "--json-schema", "bad.json"], "bad.json is not JSON"),
    (["--ckpt-dir", "{bpe}", "--json-schema", "uses_not.json"], "keyword 'not' at # is not supported"),
    (["--ckpt-dir", "{bpe}", "--gbnf", "undefined.gbnf"], "line 1, column 10: rule 'b' is used but not defined"),
])
def test_bad_input_is_one_line_and_exit_code_2(trained, flags, words):
    (trained / "bad.json").write_text("{")
    (trained / "uses_not.json").write_text('{"not": {"type": "string"}}')
    (trained / "undefined.gbnf").write_text('root ::= b "a"\n')
    flags = [f.format(char=trained / "char", bpe=trained / "bpe") for f in flags]
    r = run("constrained.py", *flags, cwd=trained)
    assert r.returncode == 2 and words in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
