"""examples/sample.py as a user runs it, on checkpoint files of examples/gpt.py --tiny (numpy runtime): streamed
text, reproducible seeds, speculative decoding with a draft, and one-line errors with exit code 2."""
import re

import numpy as np
import pytest

from helpers import run_example as run, small_corpus

NUM = r"\d+\.\d+"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A corpus, a character model, a draft on the same characters, and a BPE model."""
    root = tmp_path_factory.mktemp("sample_example")
    corpus = small_corpus(root)
    for name, flags in (("char", []), ("draft", ["--n-embd", "16", "--n-head", "2"]),
                        ("bpe", ["--tokenizer", "bpe", "--vocab-size", "300"])):
        r = run("gpt.py", "--tiny", "--data", str(corpus), "--ckpt-dir", str(root / name), "--max-iters", "2",
                "--sample-tokens", "0", *flags, cwd=root)
        assert r.returncode == 0, r.stderr
    return root


def test_samples_stream_the_prompt_and_report_tokens_per_second(trained):
    r = run("sample.py", "--ckpt-dir", str(trained / "char"), "--prompt", "the ", "--max-new-tokens", "12",
            "--num-samples", "2", "--seed", "3", cwd=trained)
    assert r.returncode == 0, r.stderr
    samples = r.stdout.split("\n" + "-" * 40 + "\n")
    assert len(samples) == 2
    for s in samples:  # the prompt, 12 one-character tokens, a newline
        assert s.startswith("the ") and s.endswith("\n") and len(s) == 4 + 12 + 1, repr(s)
    assert r.stderr.count("tokens/s") == 2


def test_a_seed_makes_samples_reproducible(trained):
    flags = ("--ckpt-dir", str(trained / "bpe"), "--prompt", "the", "--max-new-tokens", "10", "--top-p", "0.9")
    a, b, c = (run("sample.py", *flags, "--seed", seed, cwd=trained) for seed in ("5", "5", "6"))
    assert a.returncode == b.returncode == c.returncode == 0, a.stderr + c.stderr
    assert a.stdout == b.stdout
    assert a.stdout != c.stdout


def test_speculative_sampling_with_a_draft(trained):
    """Greedy speculative decoding prints the target's own tokens; stderr has the draft's acceptance rate (its
    counts agreeing) and the speed of both runs: speculative, and the model alone on the same prompt and length."""
    r = run("sample.py", "--ckpt-dir", str(trained / "char"), "--draft", str(trained / "draft"), "--max-new-tokens",
            "9", "--temperature", "0", cwd=trained)
    plain = run("sample.py", "--ckpt-dir", str(trained / "char"), "--max-new-tokens", "9", "--temperature", "0",
                cwd=trained)
    assert r.returncode == plain.returncode == 0, r.stderr + plain.stderr
    assert r.stdout == plain.stdout  # greedy: speculative decoding gives the target's own tokens
    speeds = re.findall(rf"sample.py: (speculative decoding|the model alone): 9 tokens in {NUM} s, ({NUM}) tokens/s",
                        r.stderr)
    assert [s[0] for s in speeds] == ["speculative decoding", "the model alone"], r.stderr
    m = re.search(rf"draft acceptance rate ({NUM}) \((\d+) of (\d+) draft tokens accepted, up to 4 proposed per "
                  r"round, (\d+) rounds\)", r.stderr)
    assert m, r.stderr
    rate, accepted, proposed, rounds = float(m.group(1)), *map(int, m.group(2, 3, 4))
    assert 0 < proposed <= 4 * rounds and abs(rate - accepted / proposed) <= 0.005
    m = re.search(rf"speculative decoding ran at ({NUM})x the speed of the model alone", r.stderr)
    assert m and abs(float(m.group(1)) - float(speeds[0][1]) / float(speeds[1][1])) <= 0.01 + 0.01 * float(m.group(1))


@pytest.mark.parametrize("temperature", ["0", "1"])
def test_a_draft_that_is_the_model_has_acceptance_rate_one(trained, temperature):
    """The model drafting for itself: every draft is accepted, greedy or sampled; --no-compare skips the run of the
    model alone."""
    r = run("sample.py", "--ckpt-dir", str(trained / "char"), "--draft", str(trained / "char"), "--max-new-tokens",
            "11", "--temperature", temperature, "--seed", "2", "--no-compare", cwd=trained)
    assert r.returncode == 0, r.stderr
    assert "draft acceptance rate 1.00 (8 of 8 draft tokens accepted, up to 4 proposed per round, 2 rounds)" \
        in r.stderr, r.stderr
    assert "the model alone" not in r.stderr and r.stderr.count("tokens/s") == 1, r.stderr


@pytest.mark.parametrize("flags, words", [
    (["--ckpt-dir", "nowhere"], ["nowhere", "no such file"]),
    (["--ckpt-dir", "{char}", "--prompt", "THE FOX"], ["--prompt", "not in the vocabulary"]),
    (["--ckpt-dir", "{char}", "--draft", "{bpe}"], ["--draft", "tokenizer"]),
    (["--ckpt-dir", "{char}", "--prompt", ""], ["--prompt", "empty"]),
    (["--ckpt-dir", "{char}", "--max-new-tokens", "0"], ["--max-new-tokens"]),
])
def test_bad_input_is_one_line_and_exit_code_2(trained, flags, words):
    flags = [f.format(char=trained / "char", bpe=trained / "bpe") for f in flags]
    r = run("sample.py", *flags, cwd=trained)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    for word in words:
        assert word in r.stderr, r.stderr


def test_sampling_flags_are_checked_before_the_model_loads(trained):
    """--top-k 0 means every token (Hugging Face's top_k=0); a negative top-k, temperature or a top-p outside
    (0, 1] is a one-line usage error, named, before any checkpoint is read."""
    r = run("sample.py", "--ckpt-dir", str(trained / "char"), "--max-new-tokens", "4", "--top-k", "0", "--seed", "1",
            cwd=trained)
    assert r.returncode == 0, r.stderr
    for flags, words in ((["--temperature", "-1"], "--temperature must be a finite number >= 0"),
                         (["--top-k", "-2"], "--top-k must be at least 1"),
                         (["--top-p", "1.5"], "--top-p must be in (0, 1]")):
        r = run("sample.py", "--ckpt-dir", str(trained / "missing"), *flags, cwd=trained)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, (flags, r.stderr)


@pytest.mark.parametrize("name", ["char", "bpe"])
def test_from_pretrained_and_save_pretrained_of_a_trained_directory(trained, tmp_path, name):
    """GPT.from_pretrained reads gpt.py's --ckpt-dir in Python (no examples/ on the path); what save_pretrained
    writes from it, sample.py reads and samples the same text from (its tokenizer kept, a BPE's file copied)."""
    from tinyllm.models import GPT
    from tinyllm.utils.safetensors import load_file
    model = GPT.from_pretrained(trained / name)
    saved = load_file(trained / name / "ckpt.safetensors")
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), saved[f"model.{k}"], err_msg=k)
    model.save_pretrained(tmp_path / "copy")
    flags = ("--prompt", "the", "--max-new-tokens", "10", "--seed", "4")
    a = run("sample.py", "--ckpt-dir", str(trained / name), *flags, cwd=trained)
    b = run("sample.py", "--ckpt-dir", str(tmp_path / "copy"), *flags, cwd=trained)
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr
    assert a.stdout == b.stdout


def test_a_model_saved_without_a_tokenizer_is_a_clear_error(trained, tmp_path):
    from tinyllm.models import GPT, GPTConfig
    GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=1, n_head=2, n_embd=8)).save_pretrained(tmp_path / "bare")
    r = run("sample.py", "--ckpt-dir", str(tmp_path / "bare"), cwd=trained)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "no 'tokenizer'" in r.stderr and "save_pretrained(dir, tokenizer=...)" in r.stderr, r.stderr


def test_old_flag_name_ckpt_still_works(trained):
    """--ckpt is the old name of --ckpt-dir (the name examples/gpt.py, lora.py and quantize.py use): it works, with
    one warning that names the new one; --ckpt-dir is required by either name."""
    r = run("sample.py", "--ckpt", str(trained / "char"), "--max-new-tokens", "4", "--seed", "1", cwd=trained)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("warning: --ckpt is deprecated, use --ckpt-dir") == 1, r.stderr
    r = run("sample.py", "--max-new-tokens", "4", cwd=trained)
    assert r.returncode == 2 and "the following arguments are required: --ckpt-dir" in r.stderr, r.stderr
