"""The training step of examples/gpt.py for the page: forward, loss, backward, gradients clipped at norm 1, AdamW
(the model's configure_optimizers groups: nanoGPT's decay of 2-D weights), zero_grad; recorded from a replayed
tinyllm.jit call.

What changes between steps, and how the page gives it:
  * the batch (x, y): two int32 input buffers, drawn by the page from the corpus (corpus.bin);
  * AdamW's host values (per parameter: step_size = lr / (1 - β₁ᵗ), bias2 = 1 / √(1 - β₂ᵗ), decay = 1 - lr·λ),
    which the Tape uploads afresh each call: input buffers that the page computes for its step t;
  * the state (parameters, AdamW moments), which a step reads from one buffer and writes to a new one (the WGSL
    runtime updates nothing in place): each has a home buffer, copied in before the dispatches and back after.
The export leaves the model's weights as they were (the recording's steps are undone).
"""
import dataclasses
import json

import numpy as np

from ..models.pretrained import FORMAT as CKPT_FORMAT
from ..nn import clip_grad_norm_
from ..replay.jit import jit
from ..tensor import Tensor
from .capture import ExportError, recording, storage_of
from .site import program

WARM_CALLS = 3
DEFAULTS = dict(batch_size=8, lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8, clip=1.0,
                warmup_iters=0, max_iters=0, min_lr_ratio=0.1)


def adam_values(group, t):
    """AdamW._host_step's values for step t, in its order."""
    (b1, b2), lr, wd = group["betas"], group["lr"], group["weight_decay"]
    values = {"step_size": lr / (1.0 - b1 ** t), "bias2": 1.0 / (1.0 - b2 ** t) ** 0.5}
    if wd:
        values["decay"] = 1.0 - lr * wd
    return values


def tokenizer_record(table, opts):
    """What the page's checkpoint file says of its tokenizer (examples/sample.py needs it): a character
    tokenizer's characters, or the record given as train={"tokenizer_record": ...} (a BPE's file name and sha256,
    from the checkpoint the page was exported from: its tokenizer.json goes beside the downloaded file)."""
    if opts.get("tokenizer_record") is not None:
        return json.dumps(opts["tokenizer_record"])
    return json.dumps(table) if table["kind"] == "char" else None


def record_train(model, rt, head, options):
    """(manifest, kernels, weights, state bytes) of the training step; options: the corpus `tokens` (1-D ids) and
    DEFAULTS' keys."""
    unknown = set(options) - set(DEFAULTS) - {"tokens", "tokenizer_record"}
    if unknown:
        raise ExportError(f"tinyllm.export: unknown train options {sorted(unknown)}; known: tokens, "
                          f"{', '.join(DEFAULTS)}")
    opts = {**DEFAULTS, **options}
    tokens = np.asarray(opts.get("tokens", ()), np.int64).reshape(-1)
    config = model.config
    block = getattr(config, "block_size", None) or getattr(config, "max_position_embeddings")
    if tokens.size < block + 2:
        raise ExportError(f"tinyllm.export: step='train' needs train={{'tokens': corpus ids}} of at least "
                          f"{block + 2} tokens (block_size {block} + 2), got {tokens.size}")
    if tokens.min() < 0 or tokens.max() >= config.vocab_size:
        raise ExportError(f"tinyllm.export: the corpus holds token ids outside 0..{config.vocab_size - 1}")
    dropout = getattr(config, "dropout", 0) or getattr(config, "attention_dropout", 0)
    if dropout:
        raise ExportError(f"tinyllm.export: step='train' needs dropout 0 (the model has {dropout}): dropout's masks "
                          "are drawn on the host each step, which a recorded step cannot repeat")
    original = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    was_training = model.training
    model.train()
    try:
        return _record(model, rt, head, opts, tokens, block, original)
    finally:
        model.load_state_dict(original)
        model.train(was_training)


def _record(model, rt, head, opts, tokens, block, original):
    optimizer = model.configure_optimizers(opts["weight_decay"], opts["lr"])
    for g in optimizer.param_groups:
        g["betas"], g["eps"] = tuple(opts["betas"]), opts["eps"]
    params = [p for g in optimizer.param_groups for p in g["params"]]

    def step(x, y):
        _, loss = model(x, y)
        loss.backward()
        clip_grad_norm_(params, opts["clip"])
        optimizer.step()
        optimizer.zero_grad()
        return loss
    step = jit(step)
    B = opts["batch_size"]
    x = np.stack([tokens[i:i + block] for i in range(B)])
    y = np.stack([tokens[i + 1:i + block + 1] for i in range(B)])
    for _ in range(WARM_CALLS):
        step(Tensor(x, device=rt.name), Tensor(y, device=rt.name)).numpy()
    xt, yt = Tensor(x, device=rt.name), Tensor(y, device=rt.name)
    names = {id(p): n for n, p in model.named_parameters()}
    states = []  # (kind, param name, tensor) of each state tensor the step reads and assigns
    for p in params:
        states.append(("param", names[id(p)], p))
        for k in ("exp_avg", "exp_avg_sq"):
            states.append((k, names[id(p)], optimizer.state[p][k]))
    before = [storage_of(t)[0] for _, _, t in states]
    uploads = []
    with rt.together(), recording(rt, host_inputs=uploads) as rec:
        loss = step(xt, yt)
    after = [storage_of(t)[0] for _, _, t in states]
    t_now = optimizer.state[params[0]]["step"]

    # the host values, in the order AdamW's host_step made them: one of each name per group (its key names the
    # group and the step, not the parameter)
    expected = [(gi, name, value) for gi, g in enumerate(optimizer.param_groups) if g["params"]
                for name, value in adam_values(g, t_now).items()]
    if len(uploads) != len(expected):
        raise ExportError(f"tinyllm.export: the training step uploads {len(uploads)} host values, AdamW's host step "
                          f"makes {len(expected)}: only AdamW (configure_optimizers) is exported")
    host = []
    for (storage, array), (gi, name, value) in zip(uploads, expected):
        if array.size != 1 or np.float32(array.reshape(-1)[0]) != np.float32(value):
            raise ExportError(f"tinyllm.export: host value {len(host)} is {array.reshape(-1)[:2]}, AdamW's "
                              f"{name} of step {t_now} is {value}")
        n = rec.find(storage)
        if n is not None:
            host.append([n, gi, name])
    inputs = {}
    for key, tensor in (("x", xt), ("y", yt)):
        n = rec.find(storage_of(tensor)[0])
        if n is None:
            raise ExportError(f"tinyllm.export: the recorded training step never reads its input {key}")
        inputs[key] = n
    loss_storage, loss_offset, _ = storage_of(loss)
    loss_at = rec.find(loss_storage)
    if loss_at is None:
        raise ExportError("tinyllm.export: the training step's loss is not made by a recorded kernel")

    # state: a home buffer each, after the recording's buffers
    weight_names = {}  # home buffer -> state-dict name
    kernels, dispatches, buffers, blob = program(rec, {}, set(range(len(rec.storages))))
    homes, copy_in, copy_out = [], [], []
    for (kind, pname, tensor), b, a in zip(states, before, after):
        n_in, n_out = rec.find(b), rec.find(a)
        if n_in is None or n_out is None:
            raise ExportError(f"tinyllm.export: the training step does not read and write {kind} of {pname}")
        home = len(buffers)
        buffers.append({"nbytes": b.nbytes})
        if kind == "param":
            buffers[home]["weight"] = pname
            weight_names[home] = pname
        homes.append({"kind": kind, "name": pname, "buffer": home, "shape": list(tensor.shape)})
        copy_in.append([home, n_in, b.nbytes])
        copy_out.append([n_out, home, b.nbytes])
    # every other buffer the step reads before writing (constants, tensors the Tape keeps) from state.bin
    skip = {inputs["x"], inputs["y"], *(h[0] for h in host), *(c[1] for c in copy_in)}
    blob = bytearray()
    for n in sorted(rec.state):
        if n not in skip:
            data = rec.state[n]
            buffers[n]["state"] = [len(blob), len(data)]
            blob += data + b"\0" * (-len(data) % 16)
    groups = [{"lr": g["lr"], "betas": list(g["betas"]), "weight_decay": g["weight_decay"]}
              for g in optimizer.param_groups]
    by_param = {h["name"]: h["buffer"] for h in homes if h["kind"] == "param"}
    sd_names = {}
    for name, t in model.state_dict().items():
        pname = next((n for n, p in model.named_parameters() if p is t), None)
        sd_names[name] = by_param.get(pname)
    plan = {"inputs": inputs, "host": host, "groups": groups, "t_recorded": t_now, "copy_in": copy_in,
            "copy_out": copy_out, "homes": homes, "loss": {"buffer": loss_at, "offset": loss_offset},
            "batch_size": B, "block_size": block, "corpus": "corpus.bin", "corpus_tokens": int(tokens.size),
            "schedule": {k: opts[k] for k in ("warmup_iters", "max_iters", "min_lr_ratio")},
            "checkpoint": {"state_dict": sd_names,
                           "metadata": {"format": CKPT_FORMAT, "model": model.model_type,
                                        "config": json.dumps(dataclasses.asdict(model.config)),
                                        "tokenizer": tokenizer_record(head["tokenizer"], opts)}}}
    manifest = dict(head, train=plan, dispatches=dispatches, buffers=buffers)
    extra = {"corpus.bin": tokens.astype(np.int32).tobytes()}
    return manifest, kernels, original, bytes(blob), extra
