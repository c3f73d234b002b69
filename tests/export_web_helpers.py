"""Shared by tests/test_export_web*.py and bench/export_web.py: the Node harness (tinyllm/export/node) installed
once per machine, running an exported site under it, and its page in headless Chromium. Outside CI a missing
node/npm/chromium or an npm install that fails skips with the reason; under CI=true it fails."""
import contextlib
import functools
import http.server
import json
import os
import shutil
import subprocess
import threading

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODE_DIR = os.path.join(ROOT, "tinyllm", "export", "node")
CACHE = os.environ.get("TINYLLM_NODE_CACHE", os.path.expanduser("~/.cache/tinyllm/export-node"))


def unavailable(reason):
    if os.environ.get("CI"):
        pytest.fail(f"CI: {reason}")
    pytest.skip(reason)


@functools.lru_cache(maxsize=None)
def _install():
    """'' when the harness is ready in CACHE, else why not."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install nodejs npm, or Node 20 from nodejs.org)"
    stamp = os.path.join(CACHE, "node_modules", "webgpu", "package.json")
    lock = os.path.join(NODE_DIR, "package-lock.json")
    fresh = os.path.exists(stamp) and all(
        open(os.path.join(NODE_DIR, f), "rb").read() == open(os.path.join(CACHE, f), "rb").read()
        for f in ("package-lock.json", "run.mjs") if os.path.exists(os.path.join(CACHE, f))) \
        and os.path.exists(os.path.join(CACHE, "package-lock.json")) and os.path.exists(lock)
    if not fresh:
        r = subprocess.run(["sh", os.path.join(NODE_DIR, "install.sh")], capture_output=True, text=True,
                           env={**os.environ, "TINYLLM_NODE_CACHE": CACHE}, timeout=600)
        if r.returncode:
            return f"npm could not install the webgpu package into {CACHE}: {r.stderr.strip()[-500:]}"
    return ""


def node_harness():
    """The path of run.mjs, installed; skips (fails under CI) when it cannot be."""
    why = _install()
    if why:
        unavailable(why)
    return os.path.join(CACHE, "run.mjs")


def run_site(site, timeout=600, **args):
    """run.mjs's JSON answer for the site at `site` (args: mode, tokens / prompt / steps …)."""
    harness = node_harness()
    r = subprocess.run(["node", harness, str(site), json.dumps(args)], capture_output=True, text=True,
                       timeout=timeout, cwd=CACHE)
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode or not lines:
        if "no WebGPU adapter" in r.stderr:
            unavailable(f"Dawn (the webgpu npm package) found no adapter: {r.stderr.strip()[-800:]}")
        raise AssertionError(f"node {harness} failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    out = json.loads(lines[-1])
    assert out.get("errors") == [], f"WebGPU validation errors under Node: {out.get('errors')}"
    return out


def chromium_binary():
    """The path of a Chromium (or Chrome) binary; skips (fails under CI) without one."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    unavailable("no chromium binary (apt-get install -y chromium)")


@contextlib.contextmanager
def serving(directory):
    """http://127.0.0.1:PORT/ of a server for `directory` while in the block: pages get navigator.gpu only in a
    secure context, which http://127.0.0.1 is and file:// is not."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # (one line per request otherwise)
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(directory)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()


def run_page(url, script, until, screenshot="", flags=("--enable-unsafe-webgpu",), timeout_s=300):
    """node/chromium.mjs's JSON answer for the page at `url` in headless Chromium: evaluates `script` once the page
    is ready, waits until `until` is truthy; `dataset` is document.body.dataset, parsed."""
    if shutil.which("node") is None:
        unavailable("node is not installed")
    args = {"binary": chromium_binary(), "url": url, "script": script, "until": until, "screenshot": str(screenshot),
            "flags": list(flags), "timeout_s": timeout_s}
    r = subprocess.run(["node", os.path.join(NODE_DIR, "chromium.mjs"), json.dumps(args)],
                       capture_output=True, text=True, timeout=timeout_s + 60)
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    assert lines, f"chromium.mjs failed (exit {r.returncode}): {r.stderr[-2000:]}"
    out = json.loads(lines[-1])
    assert "error" not in out, out["error"]
    out["dataset"] = json.loads(out.get("dataset") or "{}")
    return out


def jit_train_step(model, lr=3e-3, weight_decay=0.1, clip=1.0):
    """examples/gpt.py's training step on `model`, jitted (what the train export records): the loss, backward,
    gradients clipped, AdamW in configure_optimizers' groups, zero_grad; returns the loss tensor."""
    import tinyllm
    opt = model.configure_optimizers(weight_decay, lr)
    params = [p for g in opt.param_groups for p in g["params"]]

    def step(x, y):
        _, loss = model(x, y)
        loss.backward()
        tinyllm.nn.clip_grad_norm_(params, clip)
        opt.step()
        opt.zero_grad()
        return loss
    return tinyllm.jit(step)
