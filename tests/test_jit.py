"""tinyllm.jit: a replayed step must leave exactly what an eager step leaves (the same kernels run on the same
inputs), and both must track torch. What a replay cannot repeat is refused with a clear error."""
import importlib
import math
import weakref

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import tinyllm as tl
from tinyllm.replay.record import Unreplayable
from tinyllm.models.gpt import GPT, GPTConfig
from tinyllm.runtime import get as get_runtime
from tinyllm.runtime.base import EXACT_REFCOUNTS

from helpers import SEEDS, reference_runtime  # noqa: F401  (fixture: hypothesis runs on the NumPy reference)
import torch_nanogpt as ref

CFG = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=65)
STEPS = 10
DRIFT_RTOL = 1e-3  # as tests/test_gpt_parity.py: AdamW steps amplify rounding differences from torch's


def train(step_fn, model, opt, sched, rng, steps=STEPS):
    losses = []
    for _ in range(steps):
        x = rng.integers(0, CFG["vocab_size"], (4, CFG["block_size"]))
        losses.append(step_fn(x, (7 * x + 3) % CFG["vocab_size"]))
        sched.step()
    return losses


def tinyllm_run(use_jit, device):
    tl.manual_seed(0)
    model = GPT(GPTConfig(**CFG)).to(device=device)
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=3e-3, betas=(0.9, 0.95))
    sched = tl.optim.LambdaLR(opt, tl.optim.warmup_cosine(3, STEPS))  # the learning rate changes every step
    params = list(model.parameters())

    def step(x, y):
        _, loss = model(x, y)
        loss.backward()
        tl.nn.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()
        return loss
    fn = tl.jit(step) if use_jit else step
    losses = train(lambda x, y: fn(tl.tensor(x, device=device), tl.tensor(y, device=device)).item(),
                   model, opt, sched, np.random.default_rng(1))
    return losses, model, opt, fn


def torch_run(model):
    torch.manual_seed(1)
    tmodel = ref.GPT(ref.GPTConfig(**CFG))
    tmodel.load_state_dict({k: torch.from_numpy(np.array(v.numpy(), copy=True)) for k, v in model.state_dict().items()})
    opt = tmodel.configure_optimizers(weight_decay=0.1, learning_rate=3e-3, betas=(0.9, 0.95), eps=1e-8)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, tl.optim.warmup_cosine(3, STEPS))

    def step(x, y):
        _, loss = tmodel(torch.from_numpy(x), torch.from_numpy(y))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tmodel.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        return loss.item()
    return train(step, tmodel, opt, sched, np.random.default_rng(1))


@pytest.mark.parametrize("device", ["numpy", "c", "wgsl"])
def test_replayed_training_equals_eager_and_tracks_torch(device, monkeypatch):
    if device == "wgsl":
        from conftest import wgsl_skip_reason
        import os
        if not os.environ.get("CI") and wgsl_skip_reason():
            pytest.skip(wgsl_skip_reason())
    eager, model_e, opt_e, _ = tinyllm_run(False, device)
    walks = []
    tensor_module = importlib.import_module("tinyllm.tensor")  # (tl.tensor is the factory function)
    walk = tensor_module.gradients
    monkeypatch.setattr(tensor_module, "gradients", lambda *a: walks.append(1) or walk(*a))
    jitted, model_j, opt_j, fn = tinyllm_run(True, device)
    assert len(walks) == 3, f"autograd ran {len(walks)} times in {STEPS} jitted steps: the replays ran Python"
    assert len(fn.tapes) == 1
    assert jitted == eager, "a replay must run the same kernels on the same inputs as the eager step"
    for (name, p), q in zip(model_e.named_parameters(), model_j.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=name)
        np.testing.assert_array_equal(opt_e.state[p]["exp_avg_sq"].numpy(), opt_j.state[q]["exp_avg_sq"].numpy())
        assert opt_e.state[p]["step"] == opt_j.state[q]["step"] == STEPS
        assert q.grad is None  # zero_grad ran inside the step: the replay leaves .grad as the step does
    tl.manual_seed(0)
    reference = torch_run(GPT(GPTConfig(**CFG)))
    drift = max(abs(a - b) / abs(b) for a, b in zip(jitted, reference))
    assert drift <= DRIFT_RTOL, f"jitted training drifted {drift:.2e} from torch's losses"
    assert reference[-1] < reference[0] - 0.1  # it trains, so agreeing losses say something


def c_training():
    """A tiny GPT after tinyllm_run's jitted steps on the C runtime (the last seven replays): (model, optimizer,
    a call of one more step)."""
    _, model, opt, fn = tinyllm_run(True, "c")
    assert len(fn.tapes) == 1
    rng = np.random.default_rng(2)

    def call():
        x = rng.integers(0, CFG["vocab_size"], (4, CFG["block_size"]))
        return fn(tl.tensor(x, device="c"), tl.tensor((7 * x + 3) % CFG["vocab_size"], device="c")).item()
    return model, opt, call


def state(model, opt):
    return [t for p in model.parameters() for t in (p, opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"])]


def same_nodes(tensors, call):
    """Whether every tensor keeps its node through call() (watched weakly: holding a node would hold its value,
    as a pending graph does, and keep the replay from writing over it)."""
    refs = [weakref.ref(t.node) for t in tensors]
    call()
    return all(r() is t.node for r, t in zip(refs, tensors))


def chained(call):
    """Whether call() ran as a chain of C calls: no schedule went through the runtime."""
    runtime = get_runtime("c")
    executes = []
    execute = type(runtime).execute
    with pytest.MonkeyPatch.context() as m:
        m.setattr(type(runtime), "execute", lambda self, *a: executes.append(1) or execute(self, *a))
        call()
    return not executes


in_place = pytest.mark.skipif(not EXACT_REFCOUNTS, reason="this Python's reference counts cannot prove a value "
                              "unshared, so replays do not update in place (tinyllm/runtime/c/donate.py)")


@in_place
def test_replays_update_parameters_and_moments_in_place():
    """On the C runtime a replay writes the optimizer's results over the values they replace, as torch's
    optimizers do: every parameter and moment keeps its node and its memory from replay to replay (the values
    equal eager's: test_replayed_training_equals_eager_and_tracks_torch)."""
    model, opt, call = c_training()
    tensors = state(model, opt)
    values = [t.numpy().copy() for t in tensors]
    assert same_nodes(tensors, call), "a replay made new arrays for the state"
    assert all((t.numpy() != v).any() for t, v in zip(tensors, values)), "the state did not change"


@in_place
def test_plain_sgd_updates_in_place_as_eager():
    """With one output per parameter (SGD without momentum) the kernel's result takes over the parameter's own array,
    and the values stay eager's."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    w0 = rng.standard_normal((8, 8)).astype(np.float32)

    def run(use_jit):
        w = tl.tensor(w0, device="c", requires_grad=True)
        opt = tl.optim.SGD([w], lr=0.1)

        def step(x):
            loss = (x @ w).tanh().sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss
        fn = tl.jit(step) if use_jit else step
        xt = tl.tensor(x, device="c")
        losses = [fn(xt).item() for _ in range(5)]
        kept = same_nodes([w], lambda: losses.append(fn(xt).item()))
        return losses, w, kept, lambda: fn(xt)
    losses, w, kept, call = run(True)
    assert kept, "the replay made a new array for the parameter"
    want_losses, want_w, _, _ = run(False)
    assert losses == want_losses
    np.testing.assert_array_equal(w.numpy(), want_w.numpy())
    held = w.numpy()  # now the replay must leave this array alone
    before = held.copy()
    call()
    np.testing.assert_array_equal(held, before)
    assert (w.numpy() != before).any()
    del held
    call()  # a normal replay, in place again: the next call is chained
    assert chained(call)


@in_place
def test_values_held_elsewhere_are_not_overwritten():
    """A replay writes over an old value only when nothing else can read it. An array from .numpy(), a view of one,
    a pending graph over a parameter and a detached view keep the values they had, and once they are gone the
    updates are in place again."""
    model, opt, call = c_training()
    p, q, r, w = list(model.parameters())[:4]
    held_array = p.numpy()
    before_p, before_q, before_r, before_w = held_array.copy(), q.numpy().copy(), r.numpy().copy(), w.numpy().copy()
    pending = q * 2.0
    detached = r.detach()
    part = w.numpy()[1:]  # a view of the memory, not the array a Buffer holds
    moment = opt.state[p]["exp_avg"].numpy()
    before_m = moment.copy()
    call()
    np.testing.assert_array_equal(held_array, before_p)
    np.testing.assert_array_equal(moment, before_m)
    np.testing.assert_array_equal(pending.numpy(), before_q * 2.0)
    np.testing.assert_array_equal(detached.numpy(), before_r)
    np.testing.assert_array_equal(part, before_w[1:])
    for t, before in ((p, before_p), (q, before_q), (r, before_r), (w, before_w)):
        assert (t.numpy() != before).any(), "the replay did not update the parameter"
    del held_array, moment, pending, detached, part
    call()
    assert same_nodes(state(model, opt), call)


@in_place
def test_replays_run_as_one_chain_of_c_calls():
    """Once a replay has updated the state in place, a call makes the step's C calls from a chain
    (tinyllm/runtime/c/chain.py): no schedule goes through the runtime (the values are eager's:
    test_replayed_training_equals_eager_and_tracks_torch, whose last six calls are chained). A value held elsewhere,
    each kind alone, sends a call back to the normal replay, which leaves the value alone; once it is released,
    calls chain again."""
    model, opt, call = c_training()
    assert chained(call), "a chained call ran its schedules through the runtime"
    p = list(model.parameters())[2]
    holders = {"an array from .numpy()": lambda: p.numpy(), "a view of one": lambda: p.numpy()[1:],
               "a moment's array": lambda: opt.state[p]["exp_avg"].numpy(), "a pending graph": lambda: p * 2.0,
               "a detached tensor": lambda: p.detach()}
    for what, hold in holders.items():
        held = hold()
        before = np.array(held.numpy() if isinstance(held, tl.Tensor) else held)
        assert not chained(call), f"the chain ran while {what} was held"
        np.testing.assert_array_equal(held.numpy() if isinstance(held, tl.Tensor) else held, before, err_msg=what)
        del held
        call()  # a normal replay that updates everything in place: the step is chained again
        assert chained(call), what
    # a parameter given a new value outside the step while a pending graph reads its old one: the call reads
    # the new value (a normal replay), and the old one stays as it was
    pending = p * 1.0
    before = p.numpy().copy()
    p.copy_(tl.zeros(p.shape, device="c"))
    assert not chained(call)
    np.testing.assert_array_equal(pending.numpy(), before)
    assert np.abs(p.numpy()).max() < 0.1, "the step did not start from the parameter's new value"
    call()
    assert chained(call)
    with pytest.MonkeyPatch.context() as m:  # replays turned off (as TINYLLM_DEBUG does): no chain either
        m.setattr(get_runtime("c"), "replays", False)
        assert not chained(call)


@in_place
def test_chained_calls_leave_memory_allocated_flat_and_count_their_arrays_in_the_peak():
    """The arrays a chain passes between schedules (the gradients) stay with it between calls, uncounted, as torch's
    caching allocator keeps freed blocks; while a call runs they count in the peak beside each schedule's own."""
    _, model, opt, fn = tinyllm_run(True, "c")
    tape = next(iter(fn.tapes.values()))
    x = np.random.default_rng(3).integers(0, CFG["vocab_size"], (4, CFG["block_size"]))
    call = lambda: fn(tl.tensor(x, device="c"), tl.tensor(x, device="c")).item()  # noqa: E731
    assert chained(call)
    tl.reset_peak_memory_stats()
    before = tl.memory_allocated()
    assert chained(call)
    assert tl.memory_allocated() == before
    busiest = max(program.peak for program, _ in tape.chain.programs)
    assert tape.chain.nbytes > 0 and busiest > 0
    assert tl.max_memory_allocated() >= before + tape.chain.nbytes + busiest


@in_place
def test_a_jitted_eval_between_chained_steps_reads_the_new_parameters():
    """An evaluation jitted beside the training step (examples/gpt.py does this) reads the parameters the chained
    step updates in place: its chain holds them, so the next training call takes the normal replay once and
    makes new arrays, and the evaluation, stale then, is recorded again. Its losses stay eager's."""
    _, model, opt, fn = tinyllm_run(True, "c")
    x = np.random.default_rng(4).integers(0, CFG["vocab_size"], (4, CFG["block_size"]))
    batch = lambda: (tl.tensor(x, device="c"), tl.tensor(x, device="c"))  # noqa: E731
    evaluate = tl.jit(lambda a, b: model(a, b)[1])
    for _ in range(3):
        losses = []
        for _ in range(4):
            losses.append(evaluate(*batch()).item())
        assert chained(lambda: losses.append(evaluate(*batch()).item()))  # the evaluation is chained too
        assert losses == [model(*batch())[1].item()] * 5
        for _ in range(3):
            fn(*batch()).item()
    assert chained(lambda: fn(*batch()).item())


@in_place
def test_a_bad_index_in_a_chained_step_raises_and_leaves_the_parameters():
    """A chained call whose embedding reads an index out of range stops before any parameter changes, and the
    normal replay raises the error with its message."""
    _, model, opt, fn = tinyllm_run(True, "c")
    before = [p.numpy().copy() for p in model.parameters()]
    x = np.full((4, CFG["block_size"]), CFG["vocab_size"])
    with pytest.raises(IndexError, match="GATHER: index 65 is out of range"):
        fn(tl.tensor(x, device="c"), tl.tensor(x - 1, device="c"))
    for p, b in zip(model.parameters(), before):
        np.testing.assert_array_equal(p.numpy(), b)


@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 6), d=st.integers(1, 5), h=st.integers(1, 5), seed=SEEDS)
def test_replay_accumulates_gradients_as_eager_and_torch(n, d, h, seed):
    """No zero_grad inside: .grad accumulates across replays exactly as across eager calls, and as in torch."""
    rng = np.random.default_rng(seed)
    w1, w2 = rng.uniform(-1, 1, (d, h)), rng.uniform(-1, 1, (h, 1))
    xs = [rng.uniform(-1, 1, (n, d)) for _ in range(6)]

    def run(use_jit):
        a, b = tl.tensor(w1, requires_grad=True), tl.tensor(w2, requires_grad=True)

        def f(x):
            y = (x @ a).tanh() @ b
            loss = (y * y).mean()
            loss.backward()
            return {"loss": loss, "y": y}
        fn = tl.jit(f) if use_jit else f
        outs = [fn(tl.tensor(x)) for x in xs]
        return [o["loss"].item() for o in outs], [o["y"].numpy() for o in outs], a.grad.numpy(), b.grad.numpy()

    eager, jitted = run(False), run(True)
    for e, j in zip(eager, jitted):
        np.testing.assert_array_equal(np.asarray(e), np.asarray(j))
    ta, tb = torch.tensor(w1, dtype=torch.float32, requires_grad=True), torch.tensor(w2, dtype=torch.float32, requires_grad=True)
    for x in xs:
        y = (torch.tensor(x, dtype=torch.float32) @ ta).tanh() @ tb
        (y * y).mean().backward()
    np.testing.assert_allclose(jitted[2], ta.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jitted[3], tb.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_sgd_momentum_replays_as_eager():
    def run(use_jit):
        w = tl.tensor(np.linspace(-1, 1, 6).reshape(2, 3), requires_grad=True)
        opt = tl.optim.SGD([w], lr=0.1, momentum=0.9, weight_decay=0.01)

        def step(x):
            ((x @ w) ** 2).sum().backward()
            opt.step()
            opt.zero_grad()
        fn = tl.jit(step) if use_jit else step
        for i in range(6):
            fn(tl.tensor(np.full((1, 2), 0.1 * i + 0.2)))
        return w.numpy()
    np.testing.assert_array_equal(run(False), run(True))


def test_shapes_get_their_own_recordings():
    w = tl.tensor(np.ones((3, 2)), requires_grad=True)
    fn = tl.jit(lambda x: (x @ w).sum())
    for i in range(5):
        for n in (1, 4):
            x = np.arange(3 * n, dtype=np.float32).reshape(n, 3) + i
            assert fn(tl.tensor(x)).item() == pytest.approx(float((x @ np.ones((3, 2))).sum()))
    assert len(fn.tapes) == 2


def test_host_read_inside_is_refused():
    fn = tl.jit(lambda x: (x * 2).sum().item())
    fn(tl.tensor([1.0]))
    with pytest.raises(Unreplayable, match=r"numpy\(\).*Return the tensor"):
        fn(tl.tensor([1.0]))


def test_changing_host_data_inside_is_refused():
    fn = tl.jit(lambda x: x + tl.randn(3))
    fn(tl.zeros(3))
    fn(tl.zeros(3))
    with pytest.raises(Unreplayable, match="did not do the same on two calls.*random numbers outside"):
        fn(tl.zeros(3))


def test_constant_host_data_inside_is_replayed():
    fn = tl.jit(lambda x: x + tl.arange(3).float())
    for i in range(5):
        np.testing.assert_array_equal(fn(tl.full((3,), float(i))).numpy(), np.arange(3) + i)


def test_returning_python_values_is_refused():
    fn = tl.jit(lambda x: (x.sum(), 1.5))
    fn(tl.ones(2))
    with pytest.raises(Unreplayable, match="returned float at result\\[1\\]"):
        fn(tl.ones(2))


def test_a_changing_tensor_that_is_not_an_argument_is_refused():
    bias = {"t": tl.ones(2)}
    fn = tl.jit(lambda x: x + bias["t"])
    for i in range(2):
        bias["t"] = tl.full((2,), float(i)).realize()
        fn(tl.ones(2))
    bias["t"] = tl.full((2,), 5.0).realize()
    with pytest.raises(Unreplayable, match="another tensor in each call, neither an argument"):
        fn(tl.ones(2))


def test_tensors_read_but_changed_outside_are_read_afresh():
    """An eval function reads the weights; an optimizer steps them outside it. A replay must not run on the old
    values: the function is recorded again (two calls), then replays again, always with eager's values."""
    w = tl.tensor(np.ones(3, np.float32), requires_grad=True)
    opt = tl.optim.SGD([w], lr=0.25)
    ran = []

    def evaluate(x):
        ran.append(1)
        return (x * w).sum()
    fn = tl.jit(evaluate)
    x = tl.tensor(np.arange(3, dtype=np.float32))
    for step in range(3):
        for _ in range(5):
            assert fn(x).item() == (x * w).sum().item()
        (x * w * w).sum().backward()
        opt.step()
        opt.zero_grad()
    assert len(ran) == 3 + 2 + 2  # call 1 eager, 2-3 recorded; after each step, two calls recorded again
    # a step between the two recordings: the stale first one is set aside, not compared (no error)
    fn2 = tl.jit(evaluate)
    fn2(x)
    fn2(x)
    w.copy_(w * 0.5)
    for _ in range(4):
        assert fn2(x).item() == (x * w).sum().item()


def test_a_snapshot_of_a_changed_tensor_keeps_its_value():
    """Two tensors on one buffer, one of them changed: the other (read by the function) keeps the old value, and
    after recording again the function replays again."""
    w = tl.tensor(np.ones(3, np.float32))
    snapshot = w.detach()
    ran = []
    fn = tl.jit(lambda x: ran.append(1) or x * snapshot)
    x = tl.tensor(np.full(3, 2.0, np.float32))
    for _ in range(4):
        fn(x)
    w.copy_(tl.full((3,), 7.0))
    for _ in range(6):
        np.testing.assert_array_equal(fn(x).numpy(), np.full(3, 2.0))
    assert len(ran) == 3 + 2


def test_unhashable_arguments_are_refused():
    fn = tl.jit(lambda x, opts: x * 2)
    with pytest.raises(TypeError, match="neither a tensor nor hashable"):
        fn(tl.ones(2), [1, 2])


# What a Tape is keyed on (jit.py's docstring): a change of shape, dtype, device or requires_grad of an argument or
# of a tensor the step writes (a parameter, an optimizer's state, a cache) between calls records the step again. Each
# test runs the same calls and changes eagerly and jitted: the jitted run must leave the eager run's values bit for
# bit (on the same runtime), and must have replayed in between (it ran fn's Python fewer times).

def _eager_and_jitted(scenario):
    """scenario(wrap, ran) -> a list of values (arrays or None); ran counts fn's Python runs."""
    eager_ran, jit_ran = [], []
    eager, jitted = scenario(lambda f: f, eager_ran), scenario(tl.jit, jit_ran)
    assert len(eager) == len(jitted)
    for i, (e, j) in enumerate(zip(eager, jitted)):
        assert (e is None) == (j is None), i
        if e is not None:
            assert e.dtype == j.dtype and e.shape == j.shape, (i, e.dtype, j.dtype, e.shape, j.shape)
            np.testing.assert_array_equal(e.reshape(-1).view(np.uint8), j.reshape(-1).view(np.uint8),
                                          err_msg=f"value {i}")  # bit for bit
    assert len(jit_ran) < len(eager_ran)  # it replayed
    return jitted


def _host(t):
    """A tensor's values as NumPy (bfloat16 as float32, which holds each exactly), None for None."""
    if t is None:
        return None
    return t.float().numpy() if t.dtype is tl.bfloat16 else t.numpy()


INPUTS = {  # the argument of each group of calls: (shape, dtype, device, requires_grad); C's kernels are compiled
    # for their shapes and dtypes
    "dtype": [((2, 3), tl.float32, "c", False), ((2, 3), tl.bfloat16, "c", False),
              ((2, 3), tl.float16, "c", False), ((2, 3), tl.float32, "c", False)],
    "shape": [((2, 3), tl.float32, "c", False), ((4, 3), tl.float32, "c", False), ((2, 3), tl.float32, "c", False)],
    "device": [((2, 3), tl.float32, "c", False), ((2, 3), tl.float32, "numpy", False),
               ((2, 3), tl.float32, "c", False)],
    "requires_grad": [((2, 3), tl.float32, "c", False), ((2, 3), tl.float32, "c", True),
                      ((2, 3), tl.float32, "c", False)],
}


@pytest.mark.parametrize("change", list(INPUTS))
def test_an_argument_of_another_shape_dtype_device_or_requires_grad_is_recorded_anew(change):
    w0 = np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)

    def scenario(wrap, ran):
        ws = {d: tl.tensor(w0, device=d, requires_grad=True) for d in ("numpy", "c")}

        def step(x):
            ran.append(1)
            w = ws[x.device]
            loss = ((x.float() @ w).tanh() ** 2).sum()
            loss.backward()
            return loss
        fn, out = wrap(step), []
        for shape, dtype, device, requires_grad in INPUTS[change]:
            for i in range(5):
                x = tl.tensor(np.linspace(-2, 2, math.prod(shape), dtype=np.float32).reshape(shape) * (i + 1),
                              dtype=dtype, device=device, requires_grad=requires_grad)
                out += [_host(fn(x)), _host(x.grad), _host(ws[device].grad)]
        return out
    _eager_and_jitted(scenario)


def _linear_step(wrap, ran, change):
    """A training step (SGD) that reads no argument: its input and its parameters are closure state, changed between
    groups of calls as `change` says."""
    from tinyllm.realizer import assign
    tl.manual_seed(0)
    lin = tl.nn.Linear(3, 2).to(device="c")
    opt = tl.optim.SGD(lin.parameters(), lr=0.1)
    xs = {d: tl.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), device=d) for d in ("numpy", "c")}
    total = tl.zeros((), device="c").realize()  # a running sum the step writes (a KV cache's role)

    def step():
        ran.append(1)
        w = lin.weight
        y = lin(xs[w.device].to(w.dtype)).float()
        loss = (y * y).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        assign([total], [total + loss.detach()])
        return loss
    fn, out = wrap(step), []

    def move(device):  # the parameters and the running sum, each keeping its identity (as Module.to does)
        lin.to(device=device)
        moved = total.to(device=device).realize()
        total.device, total.node = moved.device, moved.node
    changes = {"dtype": [lambda: lin.bfloat16(), lambda: lin.half(), lambda: lin.float()],
               "device": [lambda: move("numpy"), lambda: move("c")],
               "shape": [lambda: assign([total], [tl.zeros(2, device="c")]),
                         lambda: assign([total], [tl.zeros((), device="c")])],
               "requires_grad": [lambda: lin.bias.requires_grad_(False), lambda: lin.bias.requires_grad_(True)]}
    for change_now in [lambda: None] + changes[change]:
        change_now()
        for _ in range(5):
            out += [_host(fn()), _host(lin.weight), _host(lin.bias), _host(total)]
    return out


@pytest.mark.parametrize("change", ["dtype", "device", "shape", "requires_grad"])
def test_a_closure_tensor_the_step_writes_changed_between_calls_is_recorded_anew(change):
    """model.bfloat16() / .half() / .float(), model.to(device), a state tensor given another shape, a parameter
    frozen (requires_grad_(False)) and thawed between calls: each makes the Tape's compiled kernels wrong for what
    the step now reads and writes."""
    _eager_and_jitted(lambda wrap, ran: _linear_step(wrap, ran, change))


def test_a_recording_says_what_changed():
    lin = tl.nn.Linear(3, 2)
    opt = tl.optim.SGD(lin.parameters(), lr=0.1)
    x = tl.ones(1, 3)

    @tl.jit
    def step(x):
        lin(x.to(lin.weight.dtype)).float().sum().backward()
        opt.step()
        opt.zero_grad()
    for _ in range(4):
        step(x)
    lin.half()
    step(x)
    assert len(step.recorded_again) == 1
    assert "parameter of shape (2, 3) and dtype float32" in step.recorded_again[0]
    assert "dtype float32 -> float16" in step.recorded_again[0]


def test_a_parameter_replaced_by_one_of_another_dtype_is_recorded_anew():
    """An eval function reads the weights as constants: a weight replaced by a new Parameter (float16, then
    float32 again) leaves the recorded one held by nothing but the Tape, which is then recorded again."""
    def scenario(wrap, ran):
        tl.manual_seed(0)
        lin = tl.nn.Linear(3, 2)
        x = tl.tensor(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3))

        def evaluate(x):
            ran.append(1)
            return lin(x.to(lin.weight.dtype)).float()
        fn, out = wrap(evaluate), []
        for new in (None, lambda w: w.half() * 2, lambda w: w.float() - 1):
            if new is not None:
                lin.weight = tl.nn.Parameter(new(lin.weight.detach()).realize())
            out += [_host(fn(x)) for _ in range(5)]
        return out
    _eager_and_jitted(scenario)
