"""tinyllm.export: a model's recorded step as a static WebGPU site (docs/export.md).

    tinyllm.export.webgpu(model, "site/", step="generate", tokenizer=tok)

The site runs the very kernels the WGSL runtime generates and dispatches for the step (recorded from a replayed
tinyllm.jit call: same kernels, same order, same buffers), driven by a small ES module, with no network access.
This package sits above models and the runtimes: nothing below it imports it.
"""
import dataclasses

from .capture import ExportError, binding_limit, check_bindings, recording  # noqa: F401
from .site import check_dir, prepare_dir, program, site_bytes, write_site  # noqa: F401
from .tokenizers import tokenizer_table

STEPS = ("generate", "train")


def _wgsl_runtime(model):
    from ..runtime import get
    params = list(model.parameters())
    if not params:
        raise ExportError(f"tinyllm.export: {type(model).__name__} has no parameters to export")
    device = params[0].device
    if device != "wgsl":
        raise ExportError(f"tinyllm.export: the model is on {device}; the page runs the WGSL runtime's kernels: "
                          "move it first with model.to('wgsl')")
    return get("wgsl")


def webgpu(model, out_dir, *, step="generate", tokenizer=None, overwrite=False, train=None, max_storage_buffers=8):
    """Write a static site into `out_dir` that runs `model`'s step with WebGPU: "generate" (a decode step with a
    key/value cache, sampled in JavaScript) or "train" (forward, backward and AdamW on a token corpus: `train`
    is a dict: the corpus `tokens` and tinyllm.export.train.DEFAULTS' keys). Kernels bind at most
    max_storage_buffers buffers (8: WebGPU's default limit, which every adapter offers; Chromium's SwiftShader
    offers 10, Dawn's OpenGL ES path 16, while the runtime fuses up to its own adapter's limit). Returns the
    manifest (a dict)."""
    if step not in STEPS:
        raise ExportError(f"tinyllm.export: step must be one of {STEPS}, got {step!r}")
    rt = _wgsl_runtime(model)
    table = tokenizer_table(tokenizer, model.config.vocab_size)
    check_dir(out_dir, overwrite)  # (before the recording: an error now, not after it)
    config = dataclasses.asdict(model.config)
    head = {"step": step, "model": {"type": getattr(model, "model_type", type(model).__name__), "config": config},
            "tokenizer": table, "device": rt.info}
    # jit Tapes made here are not chained (chain.py encodes a chained call's dispatches in C, past Device.dispatch)
    chains, rt.chains = getattr(rt, "chains", False), False
    try:
        with binding_limit(rt, max_storage_buffers):
            manifest, kernels, tensors, blob, extra = _record(model, rt, step, head, train)
    finally:
        rt.chains = chains
    check_bindings(manifest["dispatches"], max_storage_buffers)
    prepare_dir(out_dir, overwrite)
    return write_site(out_dir, manifest, kernels, tensors, blob, f"tinyllm {step}", extra)


def _record(model, rt, step, head, train):
    if step == "generate":
        from .generate import params_by_order, record_decode
        was_training = model.training
        model.eval()
        try:
            rec, plan, _ = record_decode(model, rt)
        finally:
            model.train(was_training)
        names = params_by_order(model)
        skip = set(plan["inputs"].values()) | {c["buffer"] for c in plan["caches"]}
        kernels, dispatches, buffers, blob = program(rec, names, skip)
        tensors = {name: t.numpy() for name, t in model.state_dict().items() if name in set(names.values())}
        manifest, extra = dict(head, generate=plan, dispatches=dispatches, buffers=buffers), {}
    else:
        from .train import record_train
        manifest, kernels, tensors, blob, extra = record_train(model, rt, head, train or {})
    return manifest, kernels, tensors, blob, extra
