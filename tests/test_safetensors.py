"""tinyllm/utils/safetensors.py against the `safetensors` package (a test reference only: the library never imports
it): the same bytes for the same tensors, each reading what the other wrote (bfloat16 through torch), and clear
errors, naming the file, for truncated and corrupt files."""
import json
import os
import struct

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings, strategies as st
from hypothesis.extra import numpy as hnp
from safetensors.numpy import save as reference_save, load as reference_load
from safetensors.torch import save_file as torch_save_file, load_file as torch_load_file

import tinyllm as tl
from tinyllm.utils import safetensors as S

NUMPY_DTYPES = [np.float64, np.float32, np.float16, np.int64, np.int8, np.uint8, np.uint16, np.bool_, np.complex64]


def tensors_strategy():
    names = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=6) \
        .filter(lambda n: n != "__metadata__")
    array = st.sampled_from(NUMPY_DTYPES).flatmap(
        lambda d: hnp.arrays(d, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)))
    return st.dictionaries(names, array, max_size=5)


@settings(max_examples=30)
@given(tensors=tensors_strategy(), meta=st.none() | st.dictionaries(st.text(max_size=4), st.text(max_size=4),
                                                                    max_size=1))
def test_bytes_equal_the_packages_and_each_reads_the_other(tensors, meta):
    """At most one metadata key: the package orders several by a hash map, so only then are the bytes comparable.
    (No tensors with empty metadata is left out: the package 0.8 writes a header that is not JSON there.)"""
    assume(tensors or meta != {})
    ours = S.serialize(tensors, meta)
    assert ours == reference_save(tensors, metadata=meta)
    theirs = reference_load(ours)
    back = S.deserialize(ours)
    assert set(theirs) == set(back) == set(tensors)
    for name, array in tensors.items():
        for got in (theirs[name], back[name]):
            assert got.dtype == array.dtype and got.shape == array.shape
            np.testing.assert_array_equal(got.reshape(-1).view(np.uint8), array.reshape(-1).view(np.uint8))


def test_files_with_metadata_round_trip_both_ways(tmp_path):
    tensors = {"w": np.arange(6, dtype=np.float32).reshape(2, 3).T, "q": np.array([-3, 4], np.int8),
               "s": np.array(2.5, np.float16)}
    meta = {"format": "x", "b": "1", "a": "2"}
    path = tmp_path / "t.safetensors"
    S.save_file(tensors, path, metadata=meta)
    from safetensors import safe_open
    with safe_open(str(path), "np") as f:
        assert f.metadata() == meta
        np.testing.assert_array_equal(f.get_tensor("w"), tensors["w"])
    assert S.load_metadata(path) == meta
    assert S.load_header(path) == {"w": ("F32", (3, 2)), "q": ("I8", (2,)), "s": ("F16", ())}
    other = tmp_path / "o.safetensors"
    # (the package writes an array's memory as it lies: give it row-major ones)
    other.write_bytes(reference_save({n: np.array(v, order="C") for n, v in tensors.items()}, metadata=meta))
    for name, got in S.load_file(other).items():
        np.testing.assert_array_equal(got, tensors[name])
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]  # the atomic write left no temporary file


def test_bfloat16_through_torch(tmp_path):
    values = torch.tensor([1.0, -2.5, 3.140625, 1e-3, float("inf")], dtype=torch.bfloat16)
    path = tmp_path / "bf.safetensors"
    torch_save_file({"x": values}, str(path))
    assert S.load_header(path)["x"] == ("BF16", (5,))
    storage = S.load_file(path)["x"]
    assert storage.dtype == np.uint16
    np.testing.assert_array_equal(storage, values.view(torch.int16).numpy().view(np.uint16))
    ours = tmp_path / "ours.safetensors"
    S.save_file({"x": tl.Tensor(values.float().numpy(), dtype=tl.bfloat16)}, ours)  # a bfloat16 Tensor is BF16
    assert ours.read_bytes() == path.read_bytes()
    S.save_file({"x": storage}, ours, dtypes={"x": "BF16"})  # uint16 storage, marked
    assert torch.equal(torch_load_file(str(ours))["x"], values)


def test_unsupported_dtypes_and_names_are_refused():
    with pytest.raises(S.SafetensorsError, match="tensor 'c' has dtype complex128"):  # (the format has C64 only)
        S.serialize({"c": np.zeros(2, np.complex128)})
    with pytest.raises(S.SafetensorsError, match="'x' is float32 and cannot be stored as BF16"):
        S.serialize({"x": np.zeros(2, np.float32)}, dtypes={"x": "BF16"})
    with pytest.raises(S.SafetensorsError, match="metadata must map str to str"):
        S.serialize({}, metadata={"n": 1})


def corrupt(tmp_path, blob):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(blob)
    return path


def header_blob(header, data=b""):
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


@pytest.mark.parametrize("make,message", [
    (lambda good: good[:5], "shorter than the 8-byte header length"),
    (lambda good: good[:20], "header claims .* bytes but the file has"),
    (lambda good: good[:-3], "ends at byte 24 of the data, which has only 21: the file is truncated"),
    (lambda good: good + b"xx", "2 bytes after the last tensor"),
    (lambda good: struct.pack("<Q", 4) + b"{not", "not valid JSON"),
    (lambda good: header_blob({"a": {"dtype": "F8", "shape": [1], "data_offsets": [0, 1]}}, b"\0"),
     "tensor 'a' has a malformed or unsupported entry"),
    (lambda good: header_blob({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4),
     "needs 8 bytes but spans \\[0, 4\\)"),
    (lambda good: header_blob({"a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}, b"\0\0"),
     "starts at byte 1 of the data, not at 0"),
])
def test_truncated_and_corrupt_files_are_clear_errors_naming_the_file(tmp_path, make, message):
    good = S.serialize({"w": np.zeros((2, 3), np.float32)})
    path = corrupt(tmp_path, make(good))
    with pytest.raises(S.SafetensorsError, match=message) as e:
        S.load_file(path)
    assert str(path) in str(e.value)


def test_a_missing_file_names_itself(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.safetensors: no such safetensors file"):
        S.load_file(tmp_path / "nope.safetensors")
