"""A generated kernel WHERE(c, a, b) run in place (runtime/c/render.py, _where_in_place): when its output is the
memory of the input b reads at the output's own position (a replay's donation, as a decode step's write of one
cache slot), it skips the rows where c keeps b and writes the others. Every result here is compared bit for bit
with the kernel's NumPy meaning (ops/kernel.py, run_kernel), in place and not, small kernels (shape-generic)
and large ones (on the threads), float32 and bfloat16, c varying along any axes."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tinyllm as tl
from tinyllm import dtype as dt
from tinyllm.ops.kernel import Kernel, run_kernel
from tinyllm.runtime.c import compiler
from tinyllm.runtime.c.render import render

pytestmark = pytest.mark.skipif(not compiler.available(), reason="no C compiler")
MARK = "in place: only the rows WHERE writes"


def strides_in(shape, full):
    """The element strides of a row-major array of `shape` (1 where broadcast) read over the shape `full`."""
    out, acc = [], 1
    for n, m in zip(reversed(shape), reversed(full)):
        out.append(acc if n == m and n != 1 else 0)
        acc *= n
    return tuple(reversed(out))


def where_kernel(full, cond_axes, keep, write_const, dtype, n_out=1):
    """WHERE(index == pos, new, x) (keep == 1: x is the else side) or WHERE(index != pos, x, new) (keep == 0),
    with index varying along cond_axes, new a row broadcast along them (or a constant), x read in step with the
    output; n_out such outputs of one c, one after another in memory (fuse_outputs: a decode step's caches); and
    the arrays it reads (each x, then index, pos, each new)."""
    rng = np.random.default_rng(len(cond_axes) + 7 * keep)
    cshape = tuple(n if k in cond_axes else 1 for k, n in enumerate(full))
    wshape = tuple(1 if k in cond_axes else n for k, n in enumerate(full))
    store = (lambda a: dt.encode(a, dt.bfloat16).reshape(a.shape)) if dtype == "bfloat16" else (lambda a: a)
    xs = [store(rng.standard_normal(full).astype(np.float32)) for _ in range(n_out)]
    index = np.arange(math.prod(cshape), dtype=np.int64).reshape(cshape)
    pos = np.array([int(rng.integers(0, max(1, index.size)))], np.int64)
    news = [store(rng.standard_normal(wshape).astype(np.float32)) for _ in range(n_out)]
    ins = [(n_out, strides_in(cshape, full), 0), (n_out + 1, (0,) * len(full), 0)]
    code = [("IN", 0, (), "int64"), ("IN", 1, (), "int64"), ("CMPEQ", None, (0, 1), "bool")]
    if keep == 0:
        code.append(("BITNOT", None, (2,), "bool"))
    c, outs = len(code) - 1, []
    for j in range(n_out):
        ins += [(j, strides_in(full, full), 0), (n_out + 2 + j, strides_in(wshape, full), 0)]
        code += [("CONST", -1e30 * (j + 1), (), dtype) if write_const else ("IN", len(ins) - 1, (), dtype),
                 ("IN", len(ins) - 2, (), dtype)]
        w, x_ = len(code) - 2, len(code) - 1
        code.append(("WHERE", None, (c, w, x_) if keep == 1 else (c, x_, w), dtype))
        outs.append(len(code) - 1)
    kernel = Kernel(tuple(full), None, tuple(ins), tuple(code), tuple(outs) if n_out > 1 else None)
    return kernel, [*xs, index, pos, *news]


@settings(deadline=None)
@given(full=st.sampled_from([(3, 5, 7), (1, 9, 16), (2, 4, 3, 8), (4, 300, 33), (12, 64, 65), (2, 3, 64, 80)]),
       data=st.data(), keep=st.sampled_from([0, 1]), write_const=st.booleans(),
       dtype=st.sampled_from(["float32", "bfloat16"]), n_out=st.sampled_from([1, 2, 3]))
def test_where_in_place_gives_the_plain_kernels_values(full, data, keep, write_const, dtype, n_out):
    axes = data.draw(st.sets(st.sampled_from(range(len(full))), max_size=len(full)), label="cond_axes")
    kernel, bases = where_kernel(full, sorted(axes), keep, write_const, dtype, n_out)
    srcs = (dtype,) * n_out + ("int64", "int64") + (dtype,) * n_out
    _, source, _ = render(kernel, dtype, srcs)
    # the branch exists where c is the same along the innermost loop (it runs whole rows)
    assert (MARK in source) == (len(full) - 1 not in axes), source
    rt = tl.runtime.get("c")
    fn, params = rt.compiled([(kernel, dtype, srcs)], compiler.path())[(kernel, dtype, srcs)]
    want = run_kernel(kernel, *bases, out_dtype=dt.from_name(dtype))

    bits = np.uint32 if dtype == "float32" else np.uint16
    out = np.empty((n_out,) + full, bases[0].dtype)
    rt.call(fn, [out, *bases, *params])
    np.testing.assert_array_equal(out.reshape(-1).view(bits), want.reshape(-1).view(out.dtype).view(bits))

    xs = np.stack(bases[:n_out])  # in place: output j is x_j's memory
    rt.call(fn, [xs, *xs, *bases[n_out:], *params])
    np.testing.assert_array_equal(xs.reshape(-1).view(bits), want.reshape(-1).view(xs.dtype).view(bits))


def test_a_decode_step_writes_its_cache_slot_in_place():
    """The decode step's cache write (models/kv_cache.py, Decoder._step) renders with the in-place branch, and its
    replays take over the caches' memory (tests/test_generate.py checks their values against uncached decoding)."""
    from tinyllm.models import generation
    from tinyllm.models.gpt import GPT, GPTConfig
    tl.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=17)).to("c")
    rt = tl.runtime.get("c")
    decoder = generation.Decoder(model, 1, "c", use_cache=True)
    ids = np.random.default_rng(0).integers(0, 17, (1, 12))
    with tl.no_grad():
        for L in range(2, 12):
            decoder.logits(ids[:, :L])
    writes = [render(*key)[1] for cpu, key in rt.built if key[0].shape == decoder.caches[0].shape]
    assert writes and any(MARK in s for s in writes), "no kernel of the decode step writes its cache in place"
