"""The WGSL runtime's replayed schedules (tinyllm/runtime/wgsl/plan.py): a schedule run again over the same buffers
replays its recorded dispatches without its kernels' Python, and gives bit for bit what running its kernels gives;
a pool that hands out other buffers, a read-back midway and index errors all keep their meaning."""
import gc
import os

import numpy as np
import pytest

import tinyllm as tl
from tinyllm.models.gpt import GPT, GPTConfig
from conftest import wgsl_skip_reason
from helpers import gpt_step

if not os.environ.get("CI") and wgsl_skip_reason():
    pytest.skip(wgsl_skip_reason(), allow_module_level=True)

pytestmark = pytest.mark.wgsl
RT = tl.runtime.get("wgsl")


def train(steps, jit, plans, chains=False, read_every=1):
    """Losses and final parameters of a tiny GPT trained on WGSL, with plans and chains on or off; the loss read
    back every `read_every` steps."""
    saved, RT.plans = RT.plans, (plans if plans else None)
    saved_chains, RT.chains = RT.chains, chains
    gc.collect()                                        # (the pool as a fresh process has it, whatever ran before,
    RT.empty_cache()
    gc.disable()                                        # and no collection hands it buffers at a random point)
    try:
        tl.manual_seed(0)
        model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=65, dropout=0.0)).to("wgsl")
        opt = tl.optim.AdamW(model.parameters(), lr=1e-3)
        fn = tl.jit(gpt_step(model, opt)) if jit else gpt_step(model, opt)
        rng = np.random.default_rng(0)
        losses = []
        for i in range(steps):
            x = rng.integers(0, 65, (4, 16))
            losses.append(fn(tl.tensor(x, device="wgsl"), tl.tensor((x * 7 + 3) % 65, device="wgsl")))
            if i % read_every == read_every - 1:
                losses = [v if type(v) is float else v.item() for v in losses]
        return [v if type(v) is float else v.item() for v in losses], {k: v.numpy() for k, v in
                                                                        model.state_dict().items()}
    finally:
        gc.enable()
        RT.plans, RT.chains = saved, saved_chains


@pytest.mark.parametrize("jit", [True, False])
def test_replayed_training_is_bit_for_bit_the_kernels_own(jit):
    from tinyllm.runtime.wgsl.plan import Plans
    plans = Plans()
    on = train(12, jit, plans)
    off = train(12, jit, None)
    assert on[0] == off[0]
    assert all(np.array_equal(on[1][k], off[1][k]) for k in off[1])
    assert plans.records > 0
    if jit:                                             # (a replayed step's schedules come back to their buffers)
        assert plans.replays >= plans.records


def test_other_buffers_from_the_pool_run_the_kernels_again():
    from tinyllm.runtime.wgsl.plan import Plans
    saved, RT.plans = RT.plans, Plans()
    try:
        a = tl.tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device="wgsl")
        want = (np.arange(12, dtype=np.float32).reshape(3, 4) * 2 + 1).sum(0)
        got = [((a * 2 + 1).sum(0)).numpy() for _ in range(3)]
        replays = RT.plans.replays
        held = [tl.tensor(np.zeros(4, np.float32), device="wgsl") for _ in range(3)]   # the pool's buffers taken
        submits = RT.gpu.submits
        got += [((a * 2 + 1).sum(0)).numpy() for _ in range(2)]
        assert RT.gpu.submits == submits + 2                # (one command buffer per schedule, replayed or not)
        assert all(np.array_equal(g, want) for g in got) and replays > 0
        del held
    finally:
        RT.plans = saved


def test_index_errors_are_reported_from_a_replay():
    from tinyllm.runtime.wgsl.plan import Plans
    saved, RT.plans = RT.plans, Plans()
    try:
        table = tl.tensor(np.arange(10, dtype=np.float32).reshape(5, 2), device="wgsl")
        for _ in range(3):
            idx = tl.tensor(np.array([0, 4, 2]), device="wgsl")
            assert np.array_equal(table[idx].numpy(), np.arange(10, dtype=np.float32).reshape(5, 2)[[0, 4, 2]])
        assert RT.plans.replays > 0
        bad = tl.tensor(np.array([0, 7, 2]), device="wgsl")
        with pytest.raises(IndexError, match="out of range"):
            table[bad].numpy()
    finally:
        RT.plans = saved


def test_a_jit_replay_is_one_command_buffer():
    """A replayed step's schedules go to one compute pass, submitted once when the replay ends."""
    tl.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=11, dropout=0.0)).to("wgsl")
    opt = tl.optim.SGD(model.parameters(), lr=0.1)

    fn = tl.jit(gpt_step(model, opt))
    x = tl.tensor(np.arange(16).reshape(2, 8) % 11, device="wgsl")
    for _ in range(5):
        fn(x).item()
    submits = RT.gpu.submits
    loss = fn(x)
    assert RT.gpu.submits == submits + 1
    assert np.isfinite(loss.item())


@pytest.mark.parametrize("read_every,native", [(1, True), (5, True), (1, False)])
def test_a_chained_step_is_bit_for_bit_the_replay(read_every, native, monkeypatch):
    """A jit step chained (chain.py: one command sequence over buffers that stay put, the state copied to where
    the step reads it) gives the losses and parameters of the kernels' own eager steps, the loss read every step or
    every fifth (index checks pending between); also where the C encoder is missing (wgpu-py calls instead)."""
    from tinyllm.runtime.wgsl.plan import Plans
    if not native:
        monkeypatch.setattr(RT.gpu, "native", None)
    encoded = RT.gpu.encoded
    chained = train(14, True, Plans(), chains=True, read_every=read_every)
    assert RT.gpu.encoded > encoded                     # (it ran chained)
    eager = train(14, False, None)
    assert chained[0] == eager[0]
    assert all(np.array_equal(chained[1][k], eager[1][k]) for k in eager[1])


def test_a_parameter_read_between_chained_steps_is_current(monkeypatch):
    """A chained step writes the parameters' buffers in place: a value read on the host before must not be served
    again after (the runtime keeps what it read per buffer)."""
    chained, submit_step = [], RT.gpu.submit_step
    monkeypatch.setattr(RT.gpu, "submit_step", lambda *a: chained.append(1) or submit_step(*a))
    tl.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=11, dropout=0.0)).to("wgsl")
    fn = tl.jit(gpt_step(model, tl.optim.SGD(model.parameters(), lr=0.1)))
    x = tl.tensor(np.arange(16).reshape(2, 8) % 11, device="wgsl")
    encoded, seen = RT.gpu.encoded, []
    for _ in range(8):
        fn(x).item()
        seen.append(model.lm_head.weight.numpy().copy())
    assert RT.gpu.encoded > encoded and len(chained) >= 4
    assert all(not np.array_equal(a, b) for a, b in zip(seen, seen[1:]))


def count_wgpu_calls():
    """Wraps every method of wgpu-py's device, queue, command encoder and compute pass; -> the counter (a list of
    the names tinyllm called; not the calls wgpu-py makes inside them, as read_buffer's own submit) and a function
    that unwraps them."""
    from wgpu.backends import wgpu_native as wn
    called, saved, depth = [], [], [0]
    for cls in (wn.GPUDevice, wn.GPUQueue, wn.GPUCommandEncoder, wn.GPUComputePassEncoder):
        for name, fn in list(vars(cls).items()):
            if callable(fn) and not name.startswith("_"):
                def wrapped(self, *a, _fn=fn, _name=name, **k):
                    if not depth[0]:
                        called.append(_name)
                    depth[0] += 1
                    try:
                        return _fn(self, *a, **k)
                    finally:
                        depth[0] -= 1
                saved.append((cls, name, fn))
                setattr(cls, name, wrapped)

    def undo():
        for cls, name, fn in saved:
            setattr(cls, name, fn)
    return called, undo


def test_a_chained_training_step_makes_few_wgpu_calls():
    """Issue 47's target: a replayed training step makes at most 10 wgpu-py calls, however many kernels it has
    (writing the inputs, the host values, one command buffer, reading the loss); it fails should the replay fall
    back to work per dispatch."""
    tl.manual_seed(0)
    model = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=16, block_size=8, vocab_size=11, dropout=0.0)).to("wgsl")
    opt = tl.optim.AdamW(model.parameters(), lr=1e-3)

    fn = tl.jit(gpt_step(model, opt))
    data = np.arange(16).reshape(2, 8) % 11
    for _ in range(6):
        fn(tl.tensor(data, device="wgsl")).item()
    called, undo = count_wgpu_calls()
    try:
        encoded = RT.gpu.encoded
        loss = fn(tl.tensor(data, device="wgsl")).item()
    finally:
        undo()
    assert RT.gpu.encoded - encoded > 100               # (the step's dispatches, none of them a wgpu-py call)
    assert len(called) <= 10, " ".join(called)
    assert np.isfinite(loss)
