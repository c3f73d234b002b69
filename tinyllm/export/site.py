"""The static site: index.html, tinyllm.js (the driver), manifest.json (buffers and dispatches), kernels/*.wgsl,
weights.safetensors, state.bin (the other bytes the step reads from before it: constants the runtime uploaded,
tensors its Tape keeps)."""
import json
import os
import shutil

import numpy as np

from ..utils import safetensors as st
from .capture import ExportError

WEB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "web")
FORMAT = "tinyllm-webgpu-1"
SITE_FILES = ("index.html", "tinyllm.js", "manifest.json", "weights.safetensors", "state.bin", "corpus.bin", "kernels")


def check_dir(out_dir, overwrite):
    """Refuse an `out_dir` that is a file, or a directory with files in it unless overwrite=True."""
    if os.path.exists(out_dir):
        if not os.path.isdir(out_dir):
            raise ExportError(f"tinyllm.export: {out_dir} exists and is not a directory")
        if os.listdir(out_dir) and not overwrite:
            raise ExportError(f"tinyllm.export: {out_dir} exists and is not empty: pass overwrite=True "
                              "(--overwrite) to replace the site there, or name a new directory")


def prepare_dir(out_dir, overwrite):
    """An `out_dir` without a site's files (check_dir's conditions; overwrite=True removes only those files)."""
    check_dir(out_dir, overwrite)
    if os.path.exists(out_dir):
        for name in SITE_FILES:
            path = os.path.join(out_dir, name)
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
    os.makedirs(out_dir, exist_ok=True)


def program(rec, weights, skip):
    """(manifest entries, state bytes) of a Recording: kernels deduplicated, each buffer's initial contents
    named: a weight (by state-dict name), bytes of state.bin, or nothing (zeros; written by the step first, or
    `skip`: inputs and caches, which the driver fills)."""
    kernels, index = [], {}
    dispatches = []
    for d in rec.dispatches:
        k = index.get(d.source)
        if k is None:
            k = index[d.source] = len(kernels)
            kernels.append(d.source)
        dispatches.append([k, d.buffers, [int(r) for r in d.read_only], list(d.groups)])
    buffers, blob = [], bytearray()
    for n, storage in enumerate(rec.storages):
        entry = {"nbytes": storage.nbytes}
        if n in rec.state and n not in skip:
            if storage.order in weights:
                entry["weight"] = weights[storage.order]
            else:
                data = rec.state[n]
                entry["state"] = [len(blob), len(data)]
                blob += data + b"\0" * (-len(data) % 16)
        buffers.append(entry)
    return kernels, dispatches, buffers, bytes(blob)


def write_site(out_dir, manifest, kernels, tensors, blob, title, extra=None):
    """Write the site's files into `out_dir` (prepared by prepare_dir)."""
    kdir = os.path.join(out_dir, "kernels")
    os.makedirs(kdir, exist_ok=True)
    names = []
    for i, source in enumerate(kernels):
        names.append(f"kernels/{i:03d}.wgsl")
        with open(os.path.join(out_dir, names[-1]), "w") as f:
            f.write(source)
    manifest = dict(manifest, format=FORMAT, kernels=names, weights="weights.safetensors", state="state.bin",
                    needs=needs(kernels, manifest))
    st.save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, os.path.join(out_dir, "weights.safetensors"))
    for name, data in {"state.bin": blob, **(extra or {})}.items():
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(data)
    with open(os.path.join(out_dir, "manifest.json"), "w") as f:
        json.dump(manifest, f, separators=(",", ":"))
    shutil.copy(os.path.join(WEB, "tinyllm.js"), os.path.join(out_dir, "tinyllm.js"))
    with open(os.path.join(WEB, "index.html")) as f:
        page = f.read()
    with open(os.path.join(out_dir, "index.html"), "w") as f:
        f.write(page.replace("{{TITLE}}", title).replace("{{STEP}}", manifest["step"]))
    return manifest


def needs(kernels, manifest):
    """What the device must offer: the most storage buffers one kernel binds, the largest buffer, shader-f16."""
    bindings = max(len(d[1]) for d in manifest["dispatches"])
    largest = max(b["nbytes"] for b in manifest["buffers"])
    return {"maxStorageBuffersPerShaderStage": bindings, "maxStorageBufferBindingSize": largest,
            "maxBufferSize": largest, "shaderF16": any("enable f16;" in k for k in kernels)}


def site_bytes(out_dir):
    """The site's size in bytes (every file under out_dir)."""
    return sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(out_dir) for f in files)
