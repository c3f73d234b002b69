"""The exported pages in headless Chromium (Debian's `chromium`, --enable-unsafe-webgpu: its SwiftShader adapter),
served over http://127.0.0.1: the generate page's text is the Python WGSL runtime's greedy text, the train page's
loss falls; a screenshot of each is saved (TINYLLM_SCREENSHOT_DIR, default the test's tmp dir). Without a WebGPU
adapter in the browser the tests skip and say why (the Node tests gate parity); without chromium (or node) they
skip outside CI and fail under CI=true."""
import contextlib
import json
import os

import numpy as np
import pytest

import tinyllm
import tinyllm.export
from conftest import wgsl_skip_reason
from export_web_helpers import run_page, serving
from test_export_web import VOCAB, Chars, small_gpt
from test_export_web_train import IDS, VOCAB as TRAIN_VOCAB, tiny_gpt
from tinyllm.runtime import get
from tinyllm.tensor import Tensor

pytestmark = pytest.mark.wgsl

if not os.environ.get("CI") and wgsl_skip_reason():
    pytest.skip(wgsl_skip_reason(), allow_module_level=True)

FLAGS = ["--enable-unsafe-webgpu"]  # Chromium's WebGPU then runs on its SwiftShader (software Vulkan) adapter


@pytest.fixture
def serve():
    """serve(dir) -> http://127.0.0.1:PORT/ of a server for `dir`, stopped after the test."""
    with contextlib.ExitStack() as servers:
        yield lambda directory: servers.enter_context(serving(directory))


def open_page(url, script, until, screenshot, timeout_s=300, flags=FLAGS):
    """run_page's answer; skips where Chromium with FLAGS has no WebGPU adapter (the Node tests gate parity)."""
    out = run_page(url, script, until, screenshot, flags, timeout_s)
    if flags is FLAGS and not str(out.get("adapter", "")).startswith("adapter"):
        pytest.skip(f"headless Chromium ({' '.join(FLAGS)}) has no WebGPU adapter here: {out.get('adapter')}")
    return out


def shots(tmp_path):
    where = os.environ.get("TINYLLM_SCREENSHOT_DIR") or str(tmp_path)
    os.makedirs(where, exist_ok=True)
    return where


def test_the_generate_page_writes_the_runtime_greedy_text(tmp_path, serve):
    model = small_gpt()
    site = tmp_path / "gen"
    tinyllm.export.webgpu(model, str(site), tokenizer=Chars(VOCAB))
    prompt, n = "The ", 20
    script = (f"document.getElementById('prompt').value = {json.dumps(prompt)}; "
              f"document.getElementById('max-new').value = {n}; document.getElementById('temperature').value = 0; "
              "document.getElementById('run-generate').click(); true")
    shot = os.path.join(shots(tmp_path), "export-generate.png")
    out = open_page(serve(site) + "index.html", script,
                    "document.body.dataset.generated || document.body.dataset.error", shot)
    assert "error" not in out["dataset"], out["dataset"]["error"]
    ids = [VOCAB.index(c) for c in prompt]
    with tinyllm.export.binding_limit(get("wgsl"), 8):
        want = model.generate(Tensor([ids], device="wgsl"), n, temperature=0).numpy()[0, len(ids):]
    assert out["dataset"]["generated"] == "".join(VOCAB[t] for t in want)
    assert os.path.getsize(shot) > 1000
    print(f"\nChromium ({out['adapter']}): {out['dataset']['tokensPerS']} steps/s; screenshot {shot}")


def test_the_train_page_loss_falls(tmp_path, serve):
    site = tmp_path / "train"
    tinyllm.export.webgpu(tiny_gpt(), str(site), step="train", tokenizer=Chars(TRAIN_VOCAB),
                          train={"tokens": IDS, "batch_size": 4})
    steps = 40
    script = f"document.getElementById('steps').value = {steps}; document.getElementById('run-train').click(); true"
    shot = os.path.join(shots(tmp_path), "export-train.png")
    out = open_page(serve(site) + "index.html", script,
                    "document.body.dataset.losses || document.body.dataset.error", shot)
    assert "error" not in out["dataset"], out["dataset"]["error"]
    losses = np.array(json.loads(out["dataset"]["losses"]))
    assert losses.shape == (steps,) and np.isfinite(losses).all()
    assert losses[-5:].mean() < losses[:5].mean() - 0.3, losses
    print(f"\nChromium: loss {losses[0]:.3f} -> {losses[-1]:.3f}, {out['dataset']['stepsPerS']} steps/s; "
          f"screenshot {shot}")


def test_without_webgpu_the_page_says_why(tmp_path, serve):
    site = tmp_path / "gen"
    tinyllm.export.webgpu(small_gpt(), str(site), tokenizer=Chars(VOCAB))
    shot = os.path.join(shots(tmp_path), "export-no-webgpu.png")
    out = open_page(serve(site) + "index.html", None, None, shot, timeout_s=120, flags=[])  # WebGPU off (Linux)
    if str(out.get("adapter", "")).startswith("adapter"):
        pytest.skip(f"this Chromium has WebGPU on by default ({out['adapter']}): nothing to refuse")
    assert "WebGPU" in out["dataset"]["error"] and "ready" not in out["dataset"]
