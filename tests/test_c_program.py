"""Replayed schedules on the C runtime (tinyllm/runtime/c/program.py): a schedule run a third time with inputs of
one layout replays its recorded C calls. A replay must give bit for bit what the normal path gives (the same
kernels on the same values, only their arrays placed elsewhere), and torch's values and gradients; kernels that
report bad input, runs that cannot be recorded, the peak-memory figure and empty_cache() must behave as on the
normal path."""
import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from hypothesis import HealthCheck, given, settings, strategies as st

import tinyllm as tl
import tinyllm.nn.functional as F
from tinyllm.runtime.c import program as c_program
from tinyllm.runtime import get as get_runtime

from helpers import tiny_gpt_steps

TOL = dict(rtol=1e-4, atol=1e-5)  # float32 against torch's float32 on the CPU, sums of a few dozen terms


@pytest.fixture
def rt(monkeypatch):
    """The C runtime, with a count of the replays made (rt.replayed[0]) and of the runs of generated kernels
    they made as one call each (rt.kernel_runs[0])."""
    runtime = get_runtime("c")
    runtime.replayed, runtime.kernel_runs = [0], [0]
    run = c_program.Program.run

    def counted(self, *args):
        runtime.replayed[0] += 1
        out = run(self, *args)
        runtime.kernel_runs[0] += sum(fn is runtime.lib.tl_run_kernels for fn, _ in self.bound)
        return out
    monkeypatch.setattr(c_program.Program, "run", counted)
    monkeypatch.setattr(runtime, "replays", True)
    return runtime


def forward(lib, fn, t, heads):
    """A block that reaches every kind of C call: matmul, fused elementwise ops and reductions, causal attention
    on strided heads, a reshape that copies, an embedding, a concatenation (a PAD in its backward)."""
    h = fn.gelu(t["x"] @ t["w"] + t["b"], approximate="tanh")
    B, T, C = h.shape
    q = h.view(B, T, heads, C // heads).transpose(1, 2)
    a = fn.scaled_dot_product_attention(q, q * 0.5, q, is_causal=True).transpose(1, 2).reshape(B, T, C)
    y = lib.cat([a, fn.embedding(t["idx"], t["table"])], -1)
    y = fn.layer_norm(y, (y.shape[-1],))
    return (y.softmax(-1) * t["target"]).sum()


def data(seed, B, T, K, heads, D, V, E):
    rng = np.random.default_rng(seed)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    return dict(x=f(B, T, K), w=f(K, heads * D), b=f(heads * D), table=f(V, E), target=f(B, T, heads * D + E),
                idx=rng.integers(0, V, (B, T)))


def on_tinyllm(arrays, heads):
    t = {k: tl.tensor(v, device="c", requires_grad=v.dtype == np.float32 and k != "target")
         for k, v in arrays.items()}
    loss = forward(tl, F, t, heads)
    loss.backward()
    return [loss.numpy()] + [t[k].grad.numpy() for k in ("x", "w", "b", "table")]


def on_torch(arrays, heads):
    t = {k: torch.tensor(v, requires_grad=v.dtype == np.float32 and k != "target") for k, v in arrays.items()}
    loss = forward(torch, TF, t, heads)
    loss.backward()
    return [loss.detach().numpy()] + [t[k].grad.numpy() for k in ("x", "w", "b", "table")]


@settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture])  # reset below
@given(B=st.integers(1, 3), T=st.integers(1, 9), K=st.integers(1, 6), heads=st.integers(1, 2),
       D=st.integers(1, 5), V=st.integers(2, 7), E=st.integers(1, 4))
def test_a_replay_matches_the_normal_path_and_torch(rt, B, T, K, heads, D, V, E):
    shape = (B, T, K, heads, D, V, E)
    rt.replays = True
    for seed in range(3):  # the forward and backward schedules run normally, are recorded, then replayed
        replayed = rt.replayed[0]
        got = on_tinyllm(data(seed, *shape), heads)
    assert rt.replayed[0] > replayed, "the third run was not a replay"
    rt.replays = False
    normal = on_tinyllm(data(2, *shape), heads)
    want = on_torch(data(2, *shape), heads)
    for name, g, n, w in zip(("loss", "dx", "dw", "db", "dtable"), got, normal, want):
        np.testing.assert_array_equal(g, n, err_msg=f"{name}: replay against the normal path")
        np.testing.assert_allclose(g, w, **TOL, err_msg=f"{name}: replay against torch")


def test_training_replays_bit_for_bit(rt):
    """A tiny GPT's training steps (forward, backward, AdamW): losses and weights as on the normal path."""
    from tinyllm.models.gpt import GPT, GPTConfig

    def train(replays):
        rt.replays = replays
        tl.manual_seed(0)
        model = GPT(GPTConfig(block_size=16, vocab_size=11, n_layer=2, n_head=2, n_embd=16)).to(device="c")
        opt = tl.optim.AdamW(model.parameters(), lr=1e-3)
        idx = tl.tensor(np.random.default_rng(0).integers(0, 11, (4, 16)), device="c")
        losses = []
        for _ in range(5):
            _, loss = model(idx, idx)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        return losses, [p.numpy() for p in model.parameters()]
    losses, params = train(True)
    assert rt.replayed[0] >= 3, rt.replayed[0]
    assert rt.kernel_runs[0] > 0, "no replay ran its generated kernels in runs (tl_run_kernels)"
    want_losses, want_params = train(False)
    assert losses == want_losses
    for p, w in zip(params, want_params):
        np.testing.assert_array_equal(p, w)


def test_the_buffer_pool_only_shrinks_once_steps_replay(rt):
    """Replayed schedules keep their arrays in the arena and take only their results from the pool, so the pool
    shrinks while the steps start replaying, then stays as it is."""
    pooled = [sum(a.nbytes for free in rt.pool.values() for a in free) for _ in tiny_gpt_steps(6, "c")]
    assert all(b <= a for a, b in zip(pooled[1:], pooled[2:])) and pooled[4] == pooled[5], pooled


def gather(table, idx):
    return tl.tensor(table, device="c")[tl.tensor(idx, device="c")] * 2.0


def test_an_index_out_of_range_on_a_replay_raises_the_normal_error(rt):
    table = np.arange(12, dtype=np.float32).reshape(6, 2)
    for i in range(3):
        np.testing.assert_array_equal(gather(table, np.array([i, 5])).numpy(), table[[i, 5]] * 2)
    assert rt.replayed[0] >= 1
    with pytest.raises(IndexError, match=r"index 6 is out of range for axis 0 of size 6"):
        gather(table, np.array([1, 6])).numpy()


def test_a_run_with_a_kernel_outside_c_is_not_recorded(rt):
    """float64 matmuls run NumPy's forward: such a schedule stays on the normal path, and gives NumPy's values."""
    a = np.random.default_rng(0).standard_normal((5, 4))
    for i in range(4):
        got = ((tl.tensor(a + i, device="c") @ tl.tensor(a.T, device="c")) * 3.0).numpy()
        np.testing.assert_allclose(got, (a + i) @ a.T * 3.0, rtol=1e-12)
    assert rt.replayed[0] == 0


def test_a_replay_reports_the_normal_paths_peak_memory(rt):
    """The arena holds what the normal path would allocate and free kernel by kernel: the peak must be the same."""
    x = np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)

    def peak():
        t = tl.tensor(x, device="c")
        t.numpy()
        tl.reset_peak_memory_stats()
        base = tl.memory_allocated()
        h = (t @ t.T).relu()
        out = (h @ t).exp().sum(-1).numpy()  # (64, 64) and (64, 256) intermediates die inside the schedule
        return tl.max_memory_allocated() - base, out
    normal = [peak() for _ in range(2)]
    replayed = peak()
    assert rt.replayed[0] == 1
    assert replayed[0] == normal[1][0] > 64 * 256 * 4, (replayed[0], normal[1][0])
    np.testing.assert_array_equal(replayed[1], normal[1][1])


def test_replays_share_one_arena_and_bind_again_when_it_changes(rt):
    """Programs keep their arrays in the runtime's one arena: a larger schedule replaces it, empty_cache() drops it,
    and a Program bound to an arena that is gone binds its pointers to the new one."""
    x = np.random.default_rng(2).standard_normal((32, 48)).astype(np.float32)

    def f(v, n):
        t = tl.tensor(v[:n], device="c")
        return ((t @ tl.tensor(x.T, device="c")).tanh() @ tl.tensor(x, device="c")).exp().numpy()
    tl.empty_cache()  # no arena yet, whatever ran before
    small = [f(x + i, 8) for i in range(3)]
    assert rt.replayed[0] == 1
    first = rt.arena(0)
    big = [f(x + i, 32) for i in range(3)]  # a larger arena
    assert rt.replayed[0] == 2 and rt.arena(0) is not first
    np.testing.assert_array_equal(f(x + 2, 8), small[2])
    tl.empty_cache()
    np.testing.assert_array_equal(f(x + 2, 32), big[2])
    np.testing.assert_array_equal(f(x + 2, 8), small[2])
    assert rt.replayed[0] == 5


def test_threads_running_one_schedule_at_once_get_their_own_results(rt):
    """The arena is shared: a thread that finds another replaying runs on the normal path instead, and each
    thread records its own runs."""
    import threading
    w = np.random.default_rng(3).standard_normal((64, 64)).astype(np.float32)

    def f(i):
        x = tl.tensor(np.full((16, 64), 0.01 * i, np.float32), device="c")
        return ((x @ tl.tensor(w, device="c")).tanh() @ tl.tensor(w, device="c")).sum(-1).numpy()
    want = {i: f(i) for i in range(40)}
    got, errors = {}, []

    def work(start):
        try:
            for i in range(start, 40, 2):
                got[i] = f(i)
        except Exception as e:  # reported below, not lost in the thread
            errors.append(e)
    threads = [threading.Thread(target=work, args=(k,)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert rt.replayed[0] > 0
    for i in range(40):
        np.testing.assert_array_equal(got[i], want[i], err_msg=f"call {i}")


@pytest.mark.parametrize("dtype", [tl.bfloat16, tl.float16], ids=["bfloat16", "float16"])
def test_a_16_bit_model_decodes_from_recordings(rt, dtype, monkeypatch):
    """A float16 or bfloat16 GPT's decode step is recorded and replayed like a float32 one: every kernel of it
    (the embedding's gather of 16-bit rows among them) runs in C, so no recording is given up, and the replays
    give the tokens the uncached model gives."""
    from tinyllm.models.gpt import GPT, GPTConfig
    from tinyllm.runtime.c import record
    given_up = []
    fail = record.CallRecorder.fail
    monkeypatch.setattr(record.CallRecorder, "fail", lambda self, why: given_up.append(why) or fail(self, why))
    tl.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64, vocab_size=50)).to("c").to(dtype=dtype)
    model.eval()
    prompt = tl.tensor(np.random.default_rng(3).integers(0, 50, (1, 5)), device="c")
    want = model.generate(prompt, 10, temperature=0, use_cache=False).numpy()
    replayed = rt.replayed[0]
    for _ in range(2):
        np.testing.assert_array_equal(model.generate(prompt, 10, temperature=0).numpy(), want)
    assert not given_up, given_up
    assert rt.replayed[0] > replayed
