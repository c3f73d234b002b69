"""Module buffers with torch's semantics: register_buffer (persistent or not), named_buffers/buffers, their place in
state_dict, and how .to()/.half() move and cast them; each beside torch.nn.Module's."""
import numpy as np
import pytest
import torch

import tinyllm as tl
from tinyllm import nn


class Stats(nn.Module):
    """A layer with torch's three kinds of buffer: a float one, an integer one, and a non-persistent cache."""
    def __init__(self):
        self.lin = nn.Linear(3, 2)
        self.register_buffer("running_mean", tl.zeros(2))
        self.register_buffer("num_batches_tracked", tl.tensor(0))
        self.register_buffer("cache", tl.ones(3), persistent=False)
        self.register_buffer("later", None)


class TorchStats(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.register_buffer("running_mean", torch.zeros(2))
        self.register_buffer("num_batches_tracked", torch.tensor(0))
        self.register_buffer("cache", torch.ones(3), persistent=False)
        self.register_buffer("later", None)


def test_buffers_are_listed_and_saved_as_torchs():
    m, tm = nn.Sequential(Stats(), nn.Linear(2, 1)), torch.nn.Sequential(TorchStats(), torch.nn.Linear(2, 1))
    assert list(m.state_dict()) == list(tm.state_dict())  # persistent buffers only, after their module's parameters
    assert [n for n, _ in m.named_buffers()] == [n for n, _ in tm.named_buffers()]
    assert [n for n, _ in m[0].named_buffers(prefix="x", recurse=False)] == ["x.running_mean", "x.num_batches_tracked",
                                                                               "x.cache"]
    assert len(list(m.buffers())) == 3 and len(list(m.parameters())) == len(list(tm.parameters()))
    assert all(not isinstance(b, nn.Parameter) for b in m.buffers())
    sd = {k: v.detach().numpy() for k, v in tm.state_dict().items()}
    sd["0.running_mean"] = np.array([1.5, -2.0], np.float32)
    sd["0.num_batches_tracked"] = np.array(7)
    m.load_state_dict(sd)
    assert m[0].running_mean.numpy().tolist() == [1.5, -2.0] and m[0].num_batches_tracked.item() == 7
    assert m[0].num_batches_tracked.dtype is tl.int64
    with pytest.raises(RuntimeError, match='Missing key.*"0.running_mean"'):
        m.load_state_dict({k: v for k, v in sd.items() if k != "0.running_mean"})
    m[0].running_mean = tl.full((2,), 3.0)  # assigning a tensor replaces the buffer, as torch
    assert m.state_dict()["0.running_mean"].numpy().tolist() == [3.0, 3.0]


def test_buffers_move_and_cast_with_the_module():
    """Floating-point buffers take the new dtype, integer ones keep theirs (torch's rule); all move device; a buffer
    that two modules share stays shared."""
    m = Stats()
    shared = nn.Module()
    shared.register_buffer("table", m.cache)
    m.shared = shared
    m.half()
    assert (m.running_mean.dtype, m.cache.dtype, m.num_batches_tracked.dtype) == (tl.float16, tl.float16, tl.int64)
    assert m.shared.table is m.cache
    m.to("numpy", tl.float64)
    assert {b.device for b in m.buffers()} == {"numpy"} and m.running_mean.dtype is tl.float64
    assert m.lin.weight.device == "numpy" and m.num_batches_tracked.dtype is tl.int64
    tm = TorchStats().half()
    assert (tm.running_mean.dtype, tm.num_batches_tracked.dtype) == (torch.float16, torch.int64)


@pytest.mark.parametrize("name, value, error, words", [
    ("a.b", tl.ones(1), KeyError, ["'a.b'", "'.'"]),
    ("", tl.ones(1), KeyError, ["non-empty"]),
    (3, tl.ones(1), TypeError, ["should be a string"]),
    ("lin", tl.ones(1), KeyError, ["'lin' already exists"]),
    ("w", np.ones(2), TypeError, ["ndarray", "'w'", "tinyllm.tensor"]),
    ("w", nn.Parameter(np.ones(2, np.float32)), TypeError, ["is a Parameter", "self.w = p"]),
])
def test_register_buffer_errors(name, value, error, words):
    with pytest.raises(error) as e:
        Stats().register_buffer(name, value)
    assert "register_buffer" in str(e.value) and all(w in str(e.value) for w in words), str(e.value)
