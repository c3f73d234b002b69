"""Shared by tests/test_export_web*.py: the Node harness (tinyllm/export/node) installed once per machine, and
running an exported site under it. Outside CI a missing node/npm or an npm install that fails skips with the
reason; under CI=true it fails."""
import functools
import json
import os
import shutil
import subprocess

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
