"""The safetensors file format, read and written with NumPy alone (no dependency on the `safetensors` package).

A file is: an unsigned 64-bit little-endian header length n; n bytes of JSON, an object mapping each tensor's name
to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data that follows) and, optionally,
"__metadata__" to an object of strings; then the tensors' bytes, row-major and little-endian, back to back with no
gaps. Written as the `safetensors` package writes it, so the bytes are the same: compact JSON padded with spaces
to a multiple of 8 bytes, tensors ordered by dtype (widest first, in the package's order) then by name, metadata
keys sorted (the package's own order of several metadata keys is that of a hash map, so only the bytes with at
most one metadata key are comparable).

bfloat16 has no NumPy dtype: tinyllm stores it as uint16 (tinyllm/dtype.py), so a uint16 array is written as
U16 unless `dtypes` names it BF16 (a bfloat16 tinyllm Tensor is BF16 by itself); `load_file` gives BF16 tensors
as their uint16 storage and `load_header` says which they are.
"""
import json
import os
import struct

import numpy as np

from .. import dtype as dt
from ..tensor import Tensor
from .files import atomic_write

# name in the file -> (NumPy storage dtype, little-endian), in the order the package writes them
DTYPES = {"I64": "<i8", "F64": "<f8", "C64": "<c8", "F32": "<f4", "BF16": "<u2", "F16": "<f2", "U16": "<u2", "I8": "i1",
          "U8": "u1", "BOOL": "?"}
_ORDER = {name: i for i, name in enumerate(DTYPES)}
_BY_NUMPY = {"float64": "F64", "int64": "I64", "complex64": "C64", "float32": "F32", "float16": "F16", "uint16": "U16", "int8": "I8",
             "uint8": "U8", "bool": "BOOL"}
MAX_HEADER = 100 * 1024 * 1024  # as the package: a longer header is a corrupt length, not a real one


class SafetensorsError(ValueError):
    """A file that is not a well-formed safetensors file (truncated, corrupt), or a tensor it cannot hold."""


def _as_array(name, value, dtypes):
    """(dtype name in the file, little-endian contiguous array) of one tensor to save."""
    tag = dtypes.get(name)
    if isinstance(value, Tensor):
        if value.dtype is dt.bfloat16:  # its storage (numpy() may give the values, widened to float32)
            value, tag = value.detach().numpy(), "BF16"
            value = value if value.dtype == np.uint16 else dt.encode(value, dt.bfloat16)
        else:
            value = value.detach().numpy()
    array = np.asarray(value)
    if tag is None:
        tag = _BY_NUMPY.get(array.dtype.name)
        if tag is None:
            raise SafetensorsError(f"save_file: tensor {name!r} has dtype {array.dtype}, which this writer does not "
                                   f"store: use one of {', '.join(_BY_NUMPY)}")
    elif tag not in DTYPES:
        raise SafetensorsError(f"save_file: dtypes[{name!r}] = {tag!r} is not one of {', '.join(DTYPES)}")
    elif np.dtype(DTYPES[tag]).itemsize != array.dtype.itemsize or array.dtype.kind == "f" and tag == "BF16":
        raise SafetensorsError(f"save_file: tensor {name!r} is {array.dtype} and cannot be stored as {tag} "
                               "(BF16 takes the uint16 storage of tinyllm's bfloat16)")
    return tag, np.asarray(array, dtype=DTYPES[tag], order="C")  # (not ascontiguousarray: it makes 0-d 1-d)


def serialize(tensors, metadata=None, dtypes=None):
    """The bytes of a safetensors file holding `tensors` (name -> array or tinyllm Tensor)."""
    dtypes = dtypes or {}
    if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise SafetensorsError("save_file: metadata must map str to str (encode other values, e.g. as JSON)")
    items = []
    for name, value in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise SafetensorsError(f"save_file: tensor names must be strings other than '__metadata__', got {name!r}")
        items.append((name, *_as_array(name, value, dtypes)))
    items.sort(key=lambda item: (_ORDER[item[1]], item[0]))
    header = {"__metadata__": dict(sorted(metadata.items()))} if metadata is not None else {}
    offset, chunks = 0, []
    for name, tag, array in items:
        data = array.tobytes()
        header[name] = {"dtype": tag, "shape": list(array.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def save_file(tensors, path, metadata=None, dtypes=None):
    """Write `tensors` (name -> NumPy array or tinyllm Tensor) to `path` atomically (a crash leaves the old file or
    the new one, never half of one). metadata: str -> str, kept in the header. dtypes: name -> file dtype for
    arrays whose NumPy dtype does not say it ("BF16" for uint16 bfloat16 storage)."""
    atomic_write(path, serialize(tensors, metadata, dtypes))


def _parse(path, blob, size=None):
    """(header without metadata, metadata, data start) of a file whose first bytes are `blob` (at least its
    header) and whose length is `size` (default: len(blob)), checking every entry."""
    size = len(blob) if size is None else size
    if size < 8:
        raise SafetensorsError(f"{path}: not a safetensors file: {size} bytes, shorter than the 8-byte header "
                               "length (truncated?)")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > MAX_HEADER or 8 + n > size:
        raise SafetensorsError(f"{path}: the header claims {n} bytes but the file has {size - 8} after the "
                               "length: truncated or not a safetensors file")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: the header is not valid JSON ({e}): corrupt file") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: the header is not a JSON object: corrupt file")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise SafetensorsError(f"{path}: __metadata__ must map strings to strings: corrupt file")
    data_len, spans = size - 8 - n, []
    for name, entry in header.items():
        ok = isinstance(entry, dict) and entry.get("dtype") in DTYPES and isinstance(entry.get("shape"), list) \
            and all(isinstance(s, int) and s >= 0 for s in entry["shape"]) \
            and isinstance(entry.get("data_offsets"), list) and len(entry["data_offsets"]) == 2 \
            and all(isinstance(o, int) for o in entry["data_offsets"])
        if not ok:
            raise SafetensorsError(f"{path}: tensor {name!r} has a malformed or unsupported entry {entry!r:.200} "
                                   f"(dtypes read: {', '.join(DTYPES)})")
        begin, end = entry["data_offsets"]
        size = int(np.prod(entry["shape"], dtype=np.int64)) * np.dtype(DTYPES[entry["dtype"]]).itemsize
        if not 0 <= begin <= end or end - begin != size:
            raise SafetensorsError(f"{path}: tensor {name!r} ({entry['dtype']} {entry['shape']}) needs {size} "
                                   f"bytes but spans [{begin}, {end}): corrupt file")
        if end > data_len:
            raise SafetensorsError(f"{path}: tensor {name!r} ends at byte {end} of the data, which has only "
                                   f"{data_len}: the file is truncated")
        spans.append((begin, end, name))
    at = 0
    for begin, end, name in sorted(spans):
        if begin != at:
            raise SafetensorsError(f"{path}: tensor {name!r} starts at byte {begin} of the data, not at {at} where "
                                   "the one before ends: corrupt file (safetensors data has no gaps or overlaps)")
        at = end
    if at != data_len:
        raise SafetensorsError(f"{path}: {data_len - at} bytes after the last tensor: corrupt file")
    return header, metadata, 8 + n


def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such safetensors file") from None


def deserialize(blob, path="<bytes>"):
    """name -> NumPy array (native byte order, its own memory) of a safetensors file's bytes."""
    return deserialize_all(blob, path)[0]


def deserialize_all(blob, path="<bytes>"):
    """(name -> NumPy array, name -> dtype name in the file, metadata) of a safetensors file's bytes, the tensors in
    the header's order (BF16 as its uint16 storage)."""
    header, metadata, start = _parse(path, blob)
    out = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        array = np.frombuffer(blob, DTYPES[entry["dtype"]], count=(end - begin) // np.dtype(DTYPES[entry["dtype"]])
                              .itemsize, offset=start + begin)
        out[name] = array.astype(array.dtype.newbyteorder("="), copy=True).reshape(entry["shape"])
    return out, {name: entry["dtype"] for name, entry in header.items()}, metadata


def load_file(path):
    """name -> NumPy array of the file at `path` (BF16 as its uint16 storage: see load_header)."""
    return deserialize(_read(path), path)


def load_header(path):
    """name -> (dtype name in the file, shape) of each tensor, reading only the header."""
    return {name: (e["dtype"], tuple(e["shape"])) for name, e in _parse(path, *_head(path))[0].items()}


def load_metadata(path):
    """The file's __metadata__ (str -> str; {} when it has none), reading only the header."""
    return _parse(path, *_head(path))[1]


def _head(path):
    """(the file's first bytes, through its header; the file's size)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) == 8:
                head += f.read(min(struct.unpack("<Q", head)[0], MAX_HEADER))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such safetensors file") from None
    return head, size
