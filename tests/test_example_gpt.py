"""examples/gpt.py as a user runs it: checkpoint files it cannot resume from, flags a checkpoint file overrides, the
old flag names, its tokenizers (char, bpe, gpt2) and token files, and its ETA. The runs are subprocesses of the example with --tiny on a small text file and the numpy
runtime (which compiles nothing), a second or two each."""
import importlib.util
import json
import math
import os
import random
import shutil
import subprocess
import sys

import numpy as np
import pytest

from helpers import small_corpus

from tinyllm.utils.safetensors import load_file, load_metadata, save_file  # (the format's own test: test_safetensors)

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "gpt.py")
CKPT = "ckpt.safetensors"


def run_example(*flags, cwd):
    """Run examples/gpt.py --tiny without sampling; the CompletedProcess, stdout and stderr as text."""
    cmd = [sys.executable, EXAMPLE, "--tiny", "--runtime", "numpy", "--sample-tokens", "0", *flags]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)


def warnings_in(stderr):
    return [line for line in stderr.splitlines() if "warning:" in line]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A small corpus and a checkpoint file trained on it for 2 steps with the new flag names."""
    root = tmp_path_factory.mktemp("gpt_example")
    corpus = small_corpus(root)
    ckpt_dir = root / "trained"
    r = run_example("--data", str(corpus), "--ckpt-dir", str(ckpt_dir), "--max-iters", "2", "--eval-interval", "2",
                    "--grad-checkpoint", cwd=root)
    assert r.returncode == 0, r.stderr
    assert not warnings_in(r.stderr), r.stderr
    # written atomically: a temporary file beside each, renamed over it, none left behind
    assert sorted(os.listdir(ckpt_dir)) == [CKPT, "data.json", "train.bin", "val.bin"]
    return root, corpus, ckpt_dir / CKPT


def read_ckpt(path):
    return load_file(path), load_metadata(path)


def resume_from(work, path, *flags):
    root, corpus, _ = work
    return run_example("--data", str(corpus), "--ckpt-dir", str(path.parent), "--resume", *flags, cwd=root)


def assert_refused(r, path, *words):
    """Exit code 2, one error line naming the file and saying what is wrong, no traceback."""
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("gpt.py: error:")]
    assert len(errors) == 1, r.stderr
    assert str(path) in errors[0], r.stderr
    for word in words:
        assert word in errors[0], r.stderr


def damaged(work, tmp_path, damage):
    """A copy of the trained checkpoint file, in a directory of its own, with `damage(bytes) -> bytes` applied."""
    path = tmp_path / "damaged" / CKPT
    path.parent.mkdir()
    path.write_bytes(damage(work[2].read_bytes()))
    return path


@pytest.mark.parametrize("damage, words", [
    (lambda b: b[:len(b) // 2], ["truncated"]),         # a copy cut short: the header is whole, the data is not
    (lambda b: b[:-1], ["truncated"]),
    (lambda b: b[:5], ["truncated"]),                   # not even the header's length
    (lambda b: b"", ["truncated"]),
    (lambda b: b[:8] + b"#" + b[9:], ["not a valid safetensors file"]),   # the JSON header broken
    (lambda b: b"not a checkpoint file at all" * 4, ["not a safetensors file"]),
], ids=["half", "last-byte", "5-bytes", "empty", "bad-header", "garbage"])
def test_resume_from_a_corrupt_or_truncated_file_is_an_error_naming_it(work, tmp_path, damage, words):
    path = damaged(work, tmp_path, damage)
    assert_refused(resume_from(work, path), path, *words)


def rewritten(work, tmp_path, edit):
    """A copy of the trained checkpoint file whose tensors and metadata `edit(tensors, metadata)` changed."""
    tensors, metadata = read_ckpt(work[2])
    edit(tensors, metadata)
    path = tmp_path / "edited" / CKPT
    path.parent.mkdir()
    save_file(tensors, str(path), metadata=metadata)
    return path


def test_resume_from_a_file_missing_a_tensor_is_an_error_naming_it(work, tmp_path):
    path = rewritten(work, tmp_path, lambda t, m: t.pop("model.transformer.wte.weight"))
    assert_refused(resume_from(work, path), path, "missing", "model.transformer.wte.weight")


def test_resume_from_a_file_with_a_wrong_shape_is_an_error_naming_it(work, tmp_path):
    def edit(t, m):
        t["optim.transformer.wte.weight.exp_avg"] = np.zeros((3, 3), np.float32)
    path = rewritten(work, tmp_path, edit)
    assert_refused(resume_from(work, path), path, "optim.transformer.wte.weight.exp_avg", "(3, 3)")


def test_resume_from_a_file_missing_its_metadata_is_an_error_naming_it(work, tmp_path):
    path = rewritten(work, tmp_path, lambda t, m: m.pop("config"))
    assert_refused(resume_from(work, path), path, "'config'")


def test_resume_without_a_file_is_an_error_naming_it(work, tmp_path):
    path = tmp_path / "empty-dir" / CKPT
    assert_refused(resume_from(work, path), path, "no such file")


def test_flags_the_checkpoint_overrides_are_named_in_one_warning(work):
    """--tiny's model is 32 wide, 2 heads, 1 layer. Given --n-embd 64 --n-head 4 --n-layer 1, the warning names the
    first two with both values, and neither the third (the same as the checkpoint's) nor any flag left to its
    default. The run goes on with the checkpoint's model."""
    path = work[2]
    before = path.read_bytes()
    r = resume_from(work, path, "--n-embd", "64", "--n-head", "4", "--n-layer", "1", "--max-iters", "2")
    assert r.returncode == 0, r.stderr
    warned = warnings_in(r.stderr)
    assert len(warned) == 1, r.stderr
    assert "--n-embd 64 (the checkpoint's: 32)" in warned[0], warned
    assert "--n-head 4 (the checkpoint's: 2)" in warned[0], warned
    assert str(path) in warned[0], warned
    for flag in ("--n-layer", "--block-size", "--dropout"):
        assert flag not in warned[0], warned
    assert "32 wide" in r.stderr and "2 heads" in r.stderr, r.stderr   # the model line: the checkpoint's shape
    assert path.read_bytes() == before  # nothing trained (already at --max-iters), nothing rewritten


def test_a_resumed_run_ends_as_an_uninterrupted_one(work, tmp_path):
    """Two steps, then two more after --resume, give the weights and AdamW moments of four straight steps, bit for
    bit (the 2 steps of --tiny's warmup do not depend on --max-iters, so the first two steps are the same)."""
    root, corpus, trained = work
    flags = ["--data", str(corpus), "--max-iters", "4", "--eval-interval", "2", "--grad-checkpoint"]
    r = run_example(*flags, "--ckpt-dir", str(tmp_path / "straight"), cwd=root)
    assert r.returncode == 0, r.stderr
    (tmp_path / "resumed").mkdir()
    shutil.copy(trained, tmp_path / "resumed" / CKPT)
    r = run_example(*flags, "--ckpt-dir", str(tmp_path / "resumed"), "--resume", cwd=root)
    assert r.returncode == 0, r.stderr
    assert not warnings_in(r.stderr), r.stderr
    straight, meta_s = read_ckpt(tmp_path / "straight" / CKPT)
    resumed, meta_r = read_ckpt(tmp_path / "resumed" / CKPT)
    assert meta_s["step"] == meta_r["step"] == "4"
    assert straight.keys() == resumed.keys()
    for k in straight:
        np.testing.assert_array_equal(straight[k], resumed[k], err_msg=k)


def test_old_flag_names_still_work_and_warn_once(work):
    """--out-dir is --ckpt-dir and --checkpoint --grad-checkpoint, each with one warning however often given."""
    root, corpus, _ = work
    out = root / "old-names"
    r = run_example("--data", str(corpus), "--out-dir", str(out), "--checkpoint", "--checkpoint", "--max-iters", "1",
                    cwd=root)
    assert r.returncode == 0, r.stderr
    warned = warnings_in(r.stderr)
    assert sum("--out-dir" in w and "--ckpt-dir" in w for w in warned) == 1, r.stderr
    assert sum("--checkpoint" in w and "--grad-checkpoint" in w for w in warned) == 1, r.stderr
    assert len(warned) == 2, r.stderr
    _, metadata = read_ckpt(out / CKPT)
    saved = json.loads(metadata["args"])
    assert saved["ckpt_dir"] == str(out) and saved["grad_checkpoint"] is True


# ---- tokenizers and token files -----------------------------------------------------------------------------
def final_losses(stdout):
    """(nats per token, bits per byte) from the example's last line of results."""
    line = next(l for l in stdout.splitlines() if l.startswith("final val loss"))
    words = line.replace("(", " ").split()
    return float(words[3]), float(words[5])


@pytest.fixture(scope="module")
def bpe_run(work):
    root, corpus, _ = work
    ckpt_dir = root / "bpe"
    r = run_example("--data", str(corpus), "--ckpt-dir", str(ckpt_dir), "--tokenizer", "bpe", "--vocab-size", "300",
                    "--max-iters", "2", "--eval-interval", "2", cwd=root)
    assert r.returncode == 0, r.stderr
    return ckpt_dir, r


def test_bpe_is_trained_on_the_train_split_and_its_ids_cached_as_uint16(work, bpe_run):
    from tinyllm.tokenizer import Tokenizer
    _, corpus, _ = work
    ckpt_dir, r = bpe_run
    assert sorted(os.listdir(ckpt_dir)) == [CKPT, "data.json", "tokenizer.json", "train.bin", "val.bin"]
    text = corpus.read_text()
    n = int(0.9 * len(text))
    tok = Tokenizer.load(ckpt_dir / "tokenizer.json")
    assert tok.merges == Tokenizer.train(text[:n], 300).merges     # trained on train only, reproducibly
    for name, part in (("train", text[:n]), ("val", text[n:])):
        ids = np.fromfile(ckpt_dir / f"{name}.bin", dtype=np.uint16)
        np.testing.assert_array_equal(ids, tok.encode_ordinary(part))
    _, metadata = read_ckpt(ckpt_dir / CKPT)
    assert json.loads(metadata["tokenizer"])["kind"] == "bpe"
    assert json.loads(metadata["config"])["vocab_size"] == tok.n_vocab == 300


def test_resume_reuses_the_saved_bpe_and_token_files(work, bpe_run, tmp_path):
    root, corpus, _ = work
    ckpt_dir = tmp_path / "bpe"
    shutil.copytree(bpe_run[0], ckpt_dir)
    saved = {f: (ckpt_dir / f).read_bytes() for f in ("tokenizer.json", "train.bin", "val.bin")}
    stamps = {f: os.stat(ckpt_dir / f).st_mtime_ns for f in saved}
    r = resume_from(work, ckpt_dir / CKPT, "--max-iters", "3", "--sample-tokens", "5")
    assert r.returncode == 0, r.stderr
    assert "reusing the token files" in r.stderr, r.stderr
    assert "bpe tokenizer of 300 tokens" in r.stderr, r.stderr
    for f, data in saved.items():
        assert (ckpt_dir / f).read_bytes() == data and os.stat(ckpt_dir / f).st_mtime_ns == stamps[f], f
    assert "---- sample" in r.stdout


def test_resume_with_another_tokenizer_file_is_an_error_naming_it(work, bpe_run, tmp_path):
    ckpt_dir = tmp_path / "bpe"
    shutil.copytree(bpe_run[0], ckpt_dir)
    from tinyllm.tokenizer import Tokenizer
    Tokenizer.train(work[1].read_text(), 290).save(ckpt_dir / "tokenizer.json")
    r = resume_from(work, ckpt_dir / CKPT)
    assert_refused(r, ckpt_dir / CKPT, "tokenizer.json", "sha256")
    (ckpt_dir / "tokenizer.json").unlink()
    assert_refused(resume_from(work, ckpt_dir / CKPT), ckpt_dir / CKPT, "tokenizer.json", "missing")


def test_changed_text_makes_new_token_files(work, bpe_run, tmp_path):
    """The token files are keyed by the text's hash: other text under the same --ckpt-dir is encoded afresh."""
    root, corpus, _ = work
    other = tmp_path / "other.txt"
    other.write_text(corpus.read_text().replace("fox", "cat"))
    ckpt_dir = tmp_path / "bpe"
    shutil.copytree(bpe_run[0], ckpt_dir)
    r = run_example("--data", str(other), "--ckpt-dir", str(ckpt_dir), "--resume", "--max-iters", "3", cwd=root)
    assert r.returncode == 0, r.stderr
    assert "reusing the token files" not in r.stderr
    from tinyllm.tokenizer import Tokenizer
    tok = Tokenizer.load(ckpt_dir / "tokenizer.json")
    text = other.read_text()
    np.testing.assert_array_equal(np.fromfile(ckpt_dir / "val.bin", dtype=np.uint16),
                                  tok.encode_ordinary(text[int(0.9 * len(text)):]))


def test_bits_per_byte(work, bpe_run):
    """Characters of the ASCII corpus are bytes: the char run's bits per byte are its nats per token / ln 2. The
    BPE run's tokens stand for several bytes each, so its bits per byte are fewer than its bits per token."""
    root, corpus, _ = work
    r = run_example("--data", str(corpus), "--ckpt-dir", str(root / "char-bpb"), "--max-iters", "2", cwd=root)
    nats, bpb = final_losses(r.stdout)
    assert bpb == pytest.approx(nats / np.log(2), abs=2e-3)
    nats, bpb = final_losses(bpe_run[1].stdout)
    assert bpb < 0.7 * nats / np.log(2)


def test_gpt2_tokenizer_run(work):
    root, corpus, _ = work
    r = run_example("--data", str(corpus), "--ckpt-dir", str(root / "gpt2"), "--tokenizer", "gpt2", "--max-iters",
                    "1", "--eval-iters", "1", "--sample-tokens", "3", cwd=root)
    assert r.returncode == 0, r.stderr
    assert "gpt2 tokenizer of 50257 tokens" in r.stderr
    _, metadata = read_ckpt(root / "gpt2" / CKPT)
    assert json.loads(metadata["tokenizer"]) == {"kind": "gpt2", "n_vocab": 50257}


@pytest.mark.parametrize("flags, words", [
    (["--vocab-size", "300"], ["--vocab-size", "--tokenizer bpe"]),
    (["--tokenizer", "bpe", "--vocab-size", "100"], ["--vocab-size 100", "at least 256"]),
    (["--tokenizer", "wordpiece"], ["--tokenizer", "invalid choice"]),
])
def test_bad_tokenizer_flags_are_usage_errors(work, flags, words):
    root, corpus, _ = work
    r = run_example("--data", str(corpus), "--ckpt-dir", str(root / "bad"), *flags, cwd=root)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    for word in words:
        assert word in r.stderr, r.stderr


def test_an_old_character_checkpoint_still_resumes(work, tmp_path):
    """Checkpoint files of format tinyllm-char-gpt/1 (the vocabulary in "vocab", GPT-2's tanh GELU) resume."""
    def edit(t, m):
        m["format"] = "tinyllm-char-gpt/1"
        m["vocab"] = json.loads(m.pop("tokenizer"))["vocab"]
        m["vocab"] = json.dumps(m["vocab"])
        config = json.loads(m["config"])
        config.pop("gelu", None)
        m["config"] = json.dumps(config)
    path = rewritten(work, tmp_path, edit)
    r = resume_from(work, path, "--max-iters", "3")
    assert r.returncode == 0, r.stderr
    _, metadata = read_ckpt(path)
    assert metadata["format"] == "tinyllm-gpt/2"
    assert json.loads(metadata["config"])["gelu"] == "tanh"


def test_a_checkpoint_of_a_newer_format_is_refused(work, tmp_path):
    path = rewritten(work, tmp_path, lambda t, m: m.update(format="tinyllm-gpt/3"))
    assert_refused(resume_from(work, path), path, "tinyllm-gpt/3", "newer")


@pytest.mark.parametrize("pattern", ["gpt2", "gpt4"])
def test_text_pieces_encode_as_the_whole_text(gpt_example, pattern):
    gpt_files = sys.modules["gpt_files"]
    """The example encodes big texts piece by piece (for its progress bar): the pieces' ids are the text's."""
    from tinyllm.tokenizer import Tokenizer
    rng = random.Random(1)
    alphabet = ["\n", "\n\n", " ", "  ", "\t", "a", "B", "'s", "7", "é", "中", ".", "\r\n"]
    text = "".join(rng.choice(alphabet) for _ in range(5000))
    tok = Tokenizer.train(text, 300, pattern=pattern)
    pieces = list(gpt_files.text_pieces(text, size=97))
    assert len(pieces) > 10 and "".join(pieces) == text
    assert sum((tok.encode_ordinary(p) for p in pieces), []) == tok.encode_ordinary(text)


# ---- the ETA, in process ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt_example():
    spec = importlib.util.spec_from_file_location("gpt_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_eta_leaves_out_the_first_step(gpt_example):
    """The issue's case: a first step of 1.45 s (compiling) and 0.05 s after it, 800 steps, no evaluations: the
    ETA after step 2 is 798 x 0.05 s = 40 s, not 19:22."""
    eta = gpt_example.Eta()
    eta.steps.append(1.45)
    assert eta.seconds(799, 0) is None          # no estimate from the first step alone
    assert eta.step_time() is None
    eta.steps.append(0.05)
    assert eta.seconds(798, 0) == pytest.approx(39.9)
    assert eta.step_time() == pytest.approx(0.05)
    eta.steps += [0.07, 0.03]
    assert eta.seconds(796, 0) == pytest.approx(796 * 0.05)
    assert eta.seconds(0, 0) == 0


def test_eta_of_evaluations(gpt_example):
    eta = gpt_example.Eta()
    eta.steps += [2.0, 0.1]
    assert eta.seconds(10, 3) == pytest.approx(1.0)          # no evaluation timed yet: they count nothing
    eta.evals.append(5.0)
    assert eta.seconds(10, 3) == pytest.approx(1.0 + 15.0)   # only the first timed: it stands for each
    eta.evals += [1.0, 2.0]
    assert eta.seconds(10, 3) == pytest.approx(1.0 + 4.5)    # then the mean of those after it
    assert eta.seconds(0, 1) == pytest.approx(1.5)           # the last step: its evaluation is all that is left


@pytest.mark.parametrize("step, max_iters, interval, left", [
    (1, 800, 200, 4), (199, 800, 200, 4), (200, 800, 200, 4), (201, 800, 200, 3), (800, 800, 200, 1),
    (1, 10, 4, 3), (8, 10, 4, 2), (9, 10, 4, 1), (10, 10, 4, 1), (3, 2, 4, 0),
])
def test_evals_left(gpt_example, step, max_iters, interval, left):
    """Counted once step `step` has trained: the evaluation at `step` itself is still to come, and the last step
    always evaluates."""
    assert gpt_example.evals_left(step, max_iters, interval) == left


def test_float16_training_keeps_its_loss_scale_across_a_resume(work, tmp_path):
    """--dtype float16 scales the loss (tinyllm.amp.GradScaler) and saves the scaler's state in the checkpoint's
    metadata: two steps and two more after --resume end bit for bit as four straight steps."""
    root, corpus, _ = work
    flags = ["--data", str(corpus), "--max-iters", "4", "--eval-interval", "2", "--dtype", "float16"]
    r = run_example(*flags, "--ckpt-dir", str(tmp_path / "straight"), cwd=root)
    assert r.returncode == 0, r.stderr
    assert "float16" in r.stderr + r.stdout
    r = run_example(*flags[:3], "2", *flags[4:], "--ckpt-dir", str(tmp_path / "resumed"), cwd=root)
    assert r.returncode == 0, r.stderr
    _, meta = read_ckpt(tmp_path / "resumed" / CKPT)
    assert json.loads(meta["grad_scaler"])["scale"] == 2.0 ** 16  # no overflow in two steps, no growth yet
    r = run_example(*flags, "--ckpt-dir", str(tmp_path / "resumed"), "--resume", cwd=root)
    assert r.returncode == 0, r.stderr
    straight, meta_s = read_ckpt(tmp_path / "straight" / CKPT)
    resumed, meta_r = read_ckpt(tmp_path / "resumed" / CKPT)
    assert json.loads(meta_s["grad_scaler"]) == json.loads(meta_r["grad_scaler"])
    for k in straight:
        np.testing.assert_array_equal(straight[k], resumed[k], err_msg=k)


def test_bfloat16_training_runs_under_autocast(work, tmp_path):
    root, corpus, _ = work
    r = run_example("--data", str(corpus), "--max-iters", "2", "--eval-interval", "2", "--dtype", "bfloat16",
                    "--ckpt-dir", str(tmp_path / "bf16"), cwd=root)
    assert r.returncode == 0, r.stderr
    _, meta = read_ckpt(tmp_path / "bf16" / CKPT)
    assert "grad_scaler" not in meta and json.loads(meta["args"])["dtype"] == "bfloat16"
    assert math.isfinite(json.loads(meta["val_loss"]))


@pytest.mark.parametrize("flags, llama_flags", [([], []), ([], ["--n-kv-head", "4"]),
                                                (["--n-layer", "2", "--n-embd", "96", "--n-head", "6"], [])])
def test_llama_of_the_gpts_size(flags, llama_flags):
    """--model llama counts its parameters from the config's shapes (no weights made): the count must be the built
    model's, and its SwiGLU width, a multiple of 64 (whole quantization groups), must bring it within half of 64 width
    steps of the GPT of the same flags."""
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    import gpt as example
    from gpt_files import build_model
    gpt_args, llama_args = example.parse_args(flags), example.parse_args(flags + llama_flags + ["--model", "llama"])
    gpt, llama = (example.new_config(a, 65) for a in (gpt_args, llama_args))
    for config, kind in ((gpt, "gpt"), (llama, "llama")):
        assert example.count_parameters(config) == build_model(kind, config).num_parameters()
    step = 3 * llama.hidden_size * llama.num_hidden_layers
    assert llama.intermediate_size % 64 == 0
    assert abs(example.count_parameters(llama) - example.count_parameters(gpt)) <= 32 * step


@pytest.mark.parametrize("flags, words", [
    (["--temperature", "-1"], ["--temperature must be a finite number >= 0"]),
    (["--temperature", "nan"], ["--temperature must be a finite number >= 0"]),
    (["--top-k", "-3"], ["--top-k must be at least 1, or 0 for all tokens"]),
])
def test_bad_sampling_flags_are_refused_before_training(gpt_example, flags, words, capsys):
    """Refused when the flags are read, not after a whole run has trained (exit code 2, no traceback)."""
    with pytest.raises(SystemExit) as exit_:
        gpt_example.parse_args(["--tiny", *flags])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err, err


def test_a_trained_checkpoint_is_not_overwritten_without_overwrite(work, tmp_path):
    """Running again into a --ckpt-dir that holds a checkpoint, without --resume, is a usage error naming --resume
    and --overwrite, and the file is untouched; --overwrite trains from scratch over it."""
    root, corpus, trained = work
    ckpt_dir = tmp_path / "again"
    shutil.copytree(trained.parent, ckpt_dir)
    before = (ckpt_dir / CKPT).read_bytes()
    r = run_example("--data", str(corpus), "--ckpt-dir", str(ckpt_dir), "--max-iters", "2", cwd=root)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "already holds a trained model" in r.stderr and "--resume" in r.stderr and "--overwrite" in r.stderr
    assert (ckpt_dir / CKPT).read_bytes() == before
    r = run_example("--data", str(corpus), "--ckpt-dir", str(ckpt_dir), "--max-iters", "2", "--eval-interval", "2",
                    "--overwrite", cwd=root)
    assert r.returncode == 0, r.stderr
