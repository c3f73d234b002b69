"""examples/quantize.py as a user runs it (a subprocess on the numpy runtime), on a checkpoint of examples/gpt.py
--tiny whose width is odd (33: no linear layer's input width is a multiple of the group), so every layer has a
padded last group: it quantizes, the file it saves holds the padded storage and loads back to the same logits, and a
bad --group-size is a one-line usage error before any model is read."""
import json
import re

import pytest

from helpers import run_example as run, small_corpus


@pytest.fixture(scope="module")
def odd(tmp_path_factory):
    """A GPT 33 wide (3 heads of 11): c_attn and c_fc read 33 features, the MLP's c_proj 132."""
    root = tmp_path_factory.mktemp("quantize_example")
    r = run("gpt.py", "--tiny", "--data", str(small_corpus(root)), "--ckpt-dir", str(root / "odd"), "--n-embd", "33",
            "--n-head", "3", "--max-iters", "2", "--sample-tokens", "0", cwd=root)
    assert r.returncode == 0, r.stderr
    return root / "odd"


@pytest.mark.parametrize("fmt, group, embedding, dynamic", [("int4", 32, True, False), ("int8", 16, False, False),
                                                             ("int8", 32, False, True)])
def test_an_odd_width_quantizes_saves_and_loads_back(odd, fmt, group, embedding, dynamic):
    from tinyllm.utils.safetensors import load_header, load_metadata
    out = odd / f"{fmt}.safetensors"
    r = run("quantize.py", "--ckpt-dir", str(odd), "--format", fmt, "--group-size", str(group), "--eval-iters", "2",
            "--sample-tokens", "8", "--out", str(out), *(["--embedding"] if embedding else []),
            *(["--dynamic"] if dynamic else []), cwd=odd)
    assert r.returncode == 0, r.stderr
    m = re.search(rf"{fmt} g{group}{' dynamic' * dynamic}: +\d+\.\d+ MB, val loss (\d+\.\d+) nats/token", r.stdout)
    assert m and float(m.group(1)) < 10, r.stdout
    assert "loaded it back: the same logits" in r.stdout, r.stdout
    layers, header = json.loads(load_metadata(out)["quantized"]), load_header(out)
    for name, k in (("transformer.h.0.attn.c_attn", 33), ("transformer.h.0.mlp.c_proj", 132)):
        assert layers[name][:3] == [fmt, group, k] and layers[name][4:] == [True] * dynamic
        n, kp = layers[name][3], -(-k // group) * group  # stored padded to whole groups
        assert header[f"{name}.weight"] == (("I8", (n, kp)) if fmt == "int8" else ("U8", (n, kp // 2)))
        assert header[f"{name}.weight_scale"] == ("F16", (n, kp // group))
    assert ("lm_head" in layers) == embedding


@pytest.mark.parametrize("flags, words", [(["--group-size", "0"], ["--group-size", "positive int", "32"]),
                                          (["--format", "int4", "--group-size", "5"], ["--group-size", "even"])])
def test_a_bad_group_size_is_one_line_before_the_model_loads(tmp_path, flags, words):
    r = run("quantize.py", "--ckpt-dir", str(tmp_path / "missing"), *flags, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert all(w in r.stderr for w in words), r.stderr
