"""The decode step of generation, recorded for the page: one token at one position against the key/value caches.

The step is the Decoder's (tinyllm/models/generation.py): `step(tok, pos)` replayed by tinyllm.jit, the token and
its position being input buffers, so one recorded dispatch list serves every position. The page feeds a prompt
through the same step token by token (no separate prefill recording), starting from empty caches (each key slot's
mask bias MASKED, as Decoder.cut(0) leaves them).
"""
import numpy as np

from ..models.kv_cache import MASKED, Decoder
from ..tensor import Tensor, no_grad
from .capture import ExportError, recording, storage_of

WARM_CALLS = 3  # tinyllm.jit runs a step eagerly once and records it twice; the fourth call is a replay


def params_by_order(model):
    """{Storage.order: state-dict name} of the model's parameters and buffers (the first name of a tied one)."""
    names = {}
    for name, t in model.state_dict().items():
        storage, offset, dtype = storage_of(t)
        if offset:
            raise ExportError(f"tinyllm.export: parameter {name} {tuple(t.shape)} is a view at offset {offset}; "
                              "the page uploads whole tensors")
        names.setdefault(storage.order, name)
    return names


@no_grad()
def record_decode(model, rt):
    """(Recording, plan) of one replayed decode step of `model` (batch 1). plan names the buffers' roles: inputs,
    the logits' buffer, the caches (with the copy that carries each new cache into the buffer the next step reads)."""
    if getattr(model, "_features", None) is None or getattr(model, "_decode_features", None) is None:
        raise ExportError(f"tinyllm.export: step='generate' needs a decoder model with a key/value cache (GPT, "
                          f"Llama), got {type(model).__name__}")
    device = rt.name
    decoder = Decoder(model, 1, device, True, grow=False)  # one recording for every position
    decoder.cut(Tensor([0], device=device))
    empty = [c.numpy().copy() for c in decoder.caches]
    for pos in range(WARM_CALLS):
        decoder.step(Tensor([[0]], device=device), Tensor([pos], device=device)).numpy()
    tok, pos = Tensor([[0]], device=device), Tensor([WARM_CALLS], device=device)
    old = [storage_of(c)[0] for c in decoder.caches]
    inputs = {"token": storage_of(tok)[0], "pos": storage_of(pos)[0]}
    with rt.together(), recording(rt) as rec:
        logits = decoder.step(tok, pos)
    logits_storage, offset, _ = storage_of(logits)
    new = [storage_of(c)[0] for c in decoder.caches]
    if {s.order for s in new} & {s.order for s in old}:
        # the copies below run one after another: a new cache in another one's old buffer would be overwritten
        raise ExportError("tinyllm.export: the decode step writes a new cache into another cache's old buffer; "
                          "the page's copies assume they are apart")
    plan = {"inputs": {}, "caches": [], "copies": []}
    for name, storage in inputs.items():
        n = rec.find(storage)
        if n is None:
            raise ExportError(f"tinyllm.export: the recorded decode step never reads its {name} input")
        plan["inputs"][name] = n
    out = rec.find(logits_storage)
    if out is None:
        raise ExportError("tinyllm.export: the decode step's logits are not made by a recorded kernel")
    plan["logits"] = {"buffer": out, "offset": offset, "count": int(np.prod(logits.shape))}
    for i, (before, after, init) in enumerate(zip(old, new, empty)):
        b = rec.find(before)
        if b is None:
            raise ExportError(f"tinyllm.export: the decode step never reads cache {i}")
        plan["caches"].append({"buffer": b, "shape": list(init.shape), "masked_last": bool(i % 2 == 0),
                               "mask": MASKED})
        if after.order != before.order:
            a = rec.find(after)
            plan["copies"].append([a, b, before.nbytes])
    # the page starts from these empty caches: check that they are what it will make
    for c in plan["caches"]:
        i = plan["caches"].index(c)
        want = np.zeros(c["shape"], np.float32)
        if c["masked_last"]:
            want[..., -1] = MASKED
        if not np.array_equal(empty[i], want):
            raise ExportError(f"tinyllm.export: empty cache {i} {tuple(want.shape)} is not zeros with a MASKED "
                              "last key column, which the page assumes")
    return rec, plan, logits.numpy()
