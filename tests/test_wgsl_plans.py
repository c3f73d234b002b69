"""The WGSL runtime's replayed schedules (tinyllm/runtime/wgsl/plan.py): a schedule run again over the same buffers
replays its recorded dispatches without its kernels' Python, and gives bit for bit what running its kernels gives;
a pool that hands out other buffers, a read-back midway and index errors all keep their meaning."""
import os

import numpy as np
import pytest

import tinyllm as tl
from tinyllm.models.gpt import GPT, GPTConfig
from conftest import wgsl_skip_reason

if not os.environ.get("CI") and wgsl_skip_reason():
    pytest.skip(wgsl_skip_reason(), allow_module_level=True)

pytestmark = pytest.mark.wgsl
RT = tl.runtime.get("wgsl")


def train(steps, jit, plans):
    """Losses and final parameters of a tiny GPT trained on WGSL, with plans on or off."""
    saved, RT.plans = RT.plans, (plans if plans else None)
    try:
        tl.manual_seed(0)
        model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=65, dropout=0.0)).to("wgsl")
        opt = tl.optim.AdamW(model.parameters(), lr=1e-3)

        def step(x, y):
            _, loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        fn = tl.jit(step) if jit else step
        rng = np.random.default_rng(0)
        losses = []
        for _ in range(steps):
            x = rng.integers(0, 65, (4, 16))
            losses.append(fn(tl.tensor(x, device="wgsl"), tl.tensor((x * 7 + 3) % 65, device="wgsl")).item())
        return losses, {k: v.numpy() for k, v in model.state_dict().items()}
    finally:
        RT.plans = saved


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

    def step(x):
        _, loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    fn = tl.jit(step)
    x = tl.tensor(np.arange(16).reshape(2, 8) % 11, device="wgsl")
    for _ in range(5):
        fn(x).item()
    submits = RT.gpu.submits
    loss = fn(x)
    assert RT.gpu.submits == submits + 1
    assert np.isfinite(loss.item())
