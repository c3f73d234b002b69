"""`tinyllm.save(obj, f)` / `tinyllm.load(f)`: torch.save's and torch.load's names for state dicts, written as
safetensors files (tinyllm/utils/safetensors.py), never as pickles, so loading a file runs no code.

    tinyllm.save(model.state_dict(), "model.safetensors")
    model.load_state_dict(tinyllm.load("model.safetensors"))
    tinyllm.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, "ckpt.safetensors")

A flat dict of name -> tensor (a module's state dict) is stored under its own names, so any safetensors reader (the
`safetensors` package, Hugging Face's loaders) reads the file as it is. A nested one (an optimizer's state dict)
stores each tensor under its path of keys joined with "." ("state.0.exp_avg") and the rest of the structure (dicts
with str or int keys, lists, tuples, ints, floats, bools, strings, None) as JSON in the file's metadata under
"tinyllm.structure", so load gives back the same nested object, in the same order, with the same key types.
"""
import json
import os

import numpy as np

from .. import dtype as dt
from ..runtime import get as get_runtime
from ..complex import from_numpy
from ..tensor import Tensor, host_array
from . import safetensors as st
from .files import atomic_write

STRUCTURE_KEY = "tinyllm.structure"
# NumPy dtypes of tinyllm's dtypes that a file holds (complex64 as safetensors' C64; the format has no complex128)
STORED = ("float64", "float32", "float16", "int64", "int8", "uint8", "bool", "complex64")
SUPPORTED = ("a dict of name -> tensor (model.state_dict()), or a dict nesting dicts, lists and tuples of tensors and "
             "plain values (int, float, bool, str, None), as optimizer.state_dict() or {'model': ..., 'optimizer': "
             "..., 'step': ...}")


def save(obj, f):
    """Write `obj`, a dict of tensors (tinyllm Tensors, NumPy arrays or torch tensors) and plain values, to `f` (a
    path, written atomically: a crash leaves the old file or the new one; or a binary file object) as one
    safetensors file, as torch.save writes a state dict. tinyllm.load(f) gives it back, tensors as tinyllm Tensors."""
    if not isinstance(obj, dict):
        raise TypeError(f"tinyllm.save: got a {type(obj).__name__}; tinyllm.save writes {SUPPORTED}: to save one "
                        "tensor, save {'name': tensor}")
    tensors = {}
    structure = _pack(obj, (), tensors)
    blob = st.serialize(tensors, {STRUCTURE_KEY: json.dumps(structure, separators=(",", ":"))})
    if hasattr(f, "write"):
        f.write(blob)
    else:
        atomic_write(os.fspath(f), blob)


def _pack(value, path, tensors):
    """The JSON structure of `value` at key path `path`, its tensors added to `tensors` under their dotted names."""
    where = "obj" + "".join(f"[{k!r}]" for k in path)
    if isinstance(value, dict):
        items = []
        for k, v in value.items():
            if isinstance(k, bool) or not isinstance(k, (str, int)):
                raise TypeError(f"tinyllm.save: {where} has the key {k!r} ({type(k).__name__}): keys must be str or "
                                "int")
            items.append([k, _pack(v, path + (k,), tensors)])
        return {"dict": items}
    if isinstance(value, (list, tuple)):
        return {"tuple" if isinstance(value, tuple) else "list":
                [_pack(v, path + (i,), tensors) for i, v in enumerate(value)]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):  # a NumPy scalar is a number, as in torch.save's pickle
        return value.item()
    array = _tensor(value, where)
    name = ".".join(str(k) for k in path)
    if name in tensors or name == "__metadata__":
        raise ValueError(f"tinyllm.save: two tensors would be stored under the name {name!r} (keys joined with '.'; "
                         f"the second at {where}): rename a key")
    tensors[name] = array
    return {"tensor": name}


def _tensor(value, where):
    """What to store for a tensor value: a tinyllm Tensor as it is, else a NumPy array of a dtype the file holds."""
    if isinstance(value, Tensor):
        if value.dtype is dt.complex128:
            raise TypeError(f"tinyllm.save: {where} is complex128, which safetensors has no dtype for (its complex "
                            "dtype is C64): save .to(tinyllm.complex64)")
        return value.detach()
    if not isinstance(value, np.ndarray):
        if not (hasattr(value, "detach") and hasattr(value, "cpu")):
            raise TypeError(f"tinyllm.save: {where} is a {type(value).__name__}, which has no place in a state dict: "
                            f"tinyllm.save writes {SUPPORTED}")
        if "bfloat16" in str(value.dtype):  # a torch bfloat16: kept bfloat16 (NumPy has none)
            return Tensor(host_array(value), dtype=dt.bfloat16)
        value = host_array(value)
    if value.dtype.name not in STORED:
        raise TypeError(f"tinyllm.save: {where} has dtype {value.dtype}, which tinyllm has no tensors of (it stores "
                        f"{', '.join(STORED)}): convert it, e.g. .astype(np.int64) or .astype(np.float32)")
    return value


def load(f, map_location=None, weights_only=None):
    """The dict a safetensors file holds, its tensors as tinyllm Tensors, as torch.load gives back what torch.save
    wrote: the nested object tinyllm.save wrote, or name -> Tensor of any other safetensors file (a Hugging Face
    model.safetensors) in the file's order. map_location: None (the default device) or a device string ("cpu",
    "numpy", ...; a torch.device works too) to put every tensor on. weights_only is torch's flag, accepted for
    compatibility: a safetensors file holds only tensors and plain values, so loading never runs code."""
    device = _device(map_location)
    if hasattr(f, "read"):
        path, blob = getattr(f, "name", "<file object>"), f.read()
    else:
        path = os.fspath(f)
        if os.path.isdir(path):
            raise IsADirectoryError(f"tinyllm.load: {path} is a directory, not a file: name the .safetensors file in "
                                    "it (a checkpoint directory of examples/gpt.py loads with "
                                    "GPT.from_pretrained(dir))")
        try:
            with open(path, "rb") as file:
                blob = file.read()
        except FileNotFoundError:
            raise FileNotFoundError(f"tinyllm.load: no such file: {path}") from None
    try:
        arrays, kinds, metadata = st.deserialize_all(blob, path)
    except st.SafetensorsError as e:
        if looks_like_pickle(blob):
            raise st.SafetensorsError(
                f"tinyllm.load: {path} is a torch pickle file (what torch.save writes), not a safetensors file: "
                f"tinyllm never unpickles. Load it with torch and hand over its state dict: "
                f"model.load_state_dict(torch.load({path!r}, weights_only=True)) (tinyllm's load_state_dict takes "
                "torch tensors), or convert it once: tinyllm.save(torch.load(path, weights_only=True), "
                "'model.safetensors')") from None
        raise st.SafetensorsError(f"tinyllm.load: {e}") from None
    tensors = {}
    for name, array in arrays.items():
        if kinds[name] == "BF16":
            tensors[name] = Tensor(dt.decode(array, dt.bfloat16), dtype=dt.bfloat16, device=device)
        elif kinds[name] == "U16":
            raise st.SafetensorsError(f"tinyllm.load: {path}: tensor {name!r} is U16, which tinyllm has no dtype for")
        elif kinds[name] == "C64":  # interleaved float32 (re, im): a complex64 tensor
            tensors[name] = from_numpy(array, device=device)
        else:
            tensors[name] = Tensor(array, device=device)
    if STRUCTURE_KEY not in metadata:
        return tensors
    try:
        structure = json.loads(metadata[STRUCTURE_KEY])
        out = _unpack(structure, tensors)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise st.SafetensorsError(f"tinyllm.load: {path}: its metadata {STRUCTURE_KEY!r} is not the structure "
                                  f"tinyllm.save writes ({e!r:.200}): corrupt file") from None
    if not isinstance(out, dict):
        raise st.SafetensorsError(f"tinyllm.load: {path}: its metadata {STRUCTURE_KEY!r} holds a "
                                  f"{type(out).__name__}, not a dict: corrupt file")
    return out


def looks_like_pickle(blob):
    """Whether a file's first bytes are those of torch.save's zip archive (torch >= 1.6) or of a bare pickle
    (protocol 2 and later start with 0x80 and the protocol): asked only of a file that is not a valid safetensors
    file, whose first 8 bytes, a length, could begin so too."""
    return blob[:4] == b"PK\x03\x04" or blob[:1] == b"\x80"


def _unpack(structure, tensors):
    """The object of a structure _pack made, its tensors taken from `tensors` (KeyError for a missing one)."""
    if not isinstance(structure, dict):
        return structure
    (kind, value), = structure.items()
    if kind == "tensor":
        return tensors[value]
    if kind == "dict":
        return {k: _unpack(v, tensors) for k, v in value}
    if kind in ("list", "tuple"):
        items = [_unpack(v, tensors) for v in value]
        return items if kind == "list" else tuple(items)
    raise ValueError(f"unknown entry {kind!r}")


def _device(map_location):
    """The device name of load's map_location: None, a device string, or a torch.device (by its name)."""
    if map_location is None:
        return None
    if not isinstance(map_location, str) and type(map_location).__name__ == "device":  # torch.device
        map_location = str(map_location)
    if not isinstance(map_location, str):
        raise TypeError(f"tinyllm.load: map_location must be a device string (\"cpu\", \"numpy\", ...) or None, got "
                        f"{type(map_location).__name__}: torch's dict and function forms are not supported")
    try:
        return get_runtime(map_location).name
    except ValueError as e:
        raise ValueError(f"tinyllm.load: map_location={map_location!r}: {e}") from None
