"""tinyllm.amp.GradScaler against torch.amp.GradScaler("cpu"): the same sequence of events (losses, an inf or NaN
injected into one gradient at chosen steps) through both scalers and AdamW on the same parameters must give the
same scale after every update, skip the same steps and leave the parameters together. Also: unscale_ then
clip_grad_norm_, the state dict, enabled=False, the inf/NaN check on every runtime and in one realize, and the
errors of misuse, compared with torch's."""
import os
import pickle

import numpy as np
import pytest
import torch
from hypothesis import example, given, strategies as st

import tinyllm as tl
import tinyllm.amp
from tinyllm import nn, optim
from tinyllm.tensor import Tensor
from helpers import reference_runtime  # noqa: F401  (hypothesis: the NumPy runtime unless TINYLLM_RUNTIME says)

TOL = dict(rtol=1e-5, atol=1e-6)  # float32 AdamW in the same arithmetic as torch's (tests/test_optim.py)
SHAPES = [(4, 3), (3,)]


class Model:
    """y = tanh(x W + b), loss = w·mean(y²): the same parameters and arithmetic in tinyllm and in torch."""

    def __init__(self, lib, seed=0):
        rng = np.random.default_rng(seed)
        arrays = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
        self.x = rng.standard_normal((5, 4)).astype(np.float32)
        self.lib = lib
        if lib == "tl":
            self.params = [nn.Parameter(a.copy()) for a in arrays]
        else:
            self.params = [torch.nn.Parameter(torch.tensor(a)) for a in arrays]

    def loss(self, weight=1.0):
        w, b = self.params
        x = tl.tensor(self.x) if self.lib == "tl" else torch.tensor(self.x)
        return ((x @ w + b).tanh() ** 2).mean() * weight

    def numpy(self, i):
        return self.params[i].detach().numpy()


def inject(model, index, value):
    """Put `value` (inf or nan) into one element of parameter `index`'s gradient."""
    p = model.params[index]
    g = np.array(p.grad.numpy() if model.lib == "tl" else p.grad.detach().numpy())
    g.reshape(-1)[g.size // 2] = value
    p.grad = tl.tensor(g) if model.lib == "tl" else torch.tensor(g)


def steps_taken(opt, p):
    """How many updates AdamW made to p (its step count; 0 before the first)."""
    step = opt.state.get(p, {}).get("step", 0)
    return int(step)


def scalers(**kw):
    return tinyllm.amp.GradScaler(**kw), torch.amp.GradScaler("cpu", **kw)


EVENTS = st.lists(st.tuples(st.sampled_from(["ok", "ok", "inf", "-inf", "nan"]), st.integers(0, len(SHAPES) - 1),
                            st.floats(0.25, 4.0)), min_size=3, max_size=7)
SETTINGS = st.fixed_dictionaries(dict(
    init_scale=st.sampled_from([2.0 ** 16, 3.0, 2.0 ** 127]),  # 2**127: growth would overflow, so it must not
    growth_factor=st.sampled_from([2.0, 3.0]),  # 3: products that round to float32
    backoff_factor=st.sampled_from([0.5, 0.3]),
    growth_interval=st.integers(1, 3)))


@given(events=EVENTS, settings=SETTINGS)
@example(events=[("ok", 0, 0.5)] * 3, settings=dict(init_scale=2.0 ** 127, growth_factor=2.0, backoff_factor=0.5,
                                                   growth_interval=1))  # growth would overflow: the scale stays
def test_sequence_matches_torch(events, settings):
    """Per step: scale(loss).backward(), maybe an inf/NaN injected, step, update; then the scales, the state
    dicts, the steps taken and the parameters agree."""
    ours, theirs = Model("tl"), Model("torch")
    opt = optim.AdamW(ours.params, lr=1e-2)
    topt = torch.optim.AdamW(theirs.params, lr=1e-2)
    scaler, tscaler = scalers(**settings)
    for step, (event, index, weight) in enumerate(events):
        for m, o, s in ((ours, opt, scaler), (theirs, topt, tscaler)):
            o.zero_grad()
            s.scale(m.loss(weight)).backward()
            if event != "ok":
                inject(m, index, float(event))
            assert s.step(o) is None
            s.update()
        where = f"step {step} of {events} with {settings}"
        assert scaler.get_scale() == tscaler.get_scale(), where
        assert scaler.state_dict() == tscaler.state_dict(), where
        for p, tp in zip(ours.params, theirs.params):
            assert steps_taken(opt, p) == steps_taken(topt, tp), where
        for i in range(len(SHAPES)):
            np.testing.assert_allclose(ours.numpy(i), theirs.numpy(i), **TOL, err_msg=where)


def test_inf_skips_the_step_and_backs_off():
    """The issue's case spelled out: from 2**16, a clean step, an injected inf (skipped, scale halved, tracker
    reset), then growth_interval clean steps double the scale."""
    ours = Model("tl")
    opt = optim.AdamW(ours.params, lr=1e-2)
    scaler = tinyllm.amp.GradScaler(growth_interval=2)
    scales, taken = [], []
    for event in ["ok", "inf", "ok", "ok", "nan"]:
        opt.zero_grad()
        scaler.scale(ours.loss()).backward()
        if event != "ok":
            inject(ours, 1, float(event))
        before = ours.numpy(0).copy()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        taken.append(not np.array_equal(before, ours.numpy(0)))
    assert scales == [2.0 ** 16, 2.0 ** 15, 2.0 ** 15, 2.0 ** 16, 2.0 ** 15]
    assert taken == [True, False, True, True, False]
    assert scaler.state_dict()["_growth_tracker"] == 0


@pytest.mark.parametrize("max_norm", [0.01, 100.0])
def test_unscale_then_clip_matches_torch(max_norm):
    """unscale_ gives the true gradients, so clip_grad_norm_ returns the true norm and clips as torch."""
    ours, theirs = Model("tl"), Model("torch")
    opt, topt = optim.AdamW(ours.params, lr=1e-2), torch.optim.AdamW(theirs.params, lr=1e-2)
    scaler, tscaler = scalers(init_scale=1024.0)
    unscaled = Model("tl")
    unscaled.loss().backward()  # never scaled: the gradients unscale_ must give back at the first step
    true_norm = float(nn.clip_grad_norm_(unscaled.params, 1e9))
    for step in range(3):
        norms = []
        for m, o, s, clip in ((ours, opt, scaler, nn.clip_grad_norm_),
                              (theirs, topt, tscaler, torch.nn.utils.clip_grad_norm_)):
            o.zero_grad()
            s.scale(m.loss()).backward()
            s.unscale_(o)
            norms.append(float(clip(m.params, max_norm)))
            s.step(o)
            s.update()
        np.testing.assert_allclose(norms[0], norms[1], rtol=1e-5, err_msg=f"step {step}")
        if step == 0:
            np.testing.assert_allclose(norms[0], true_norm, rtol=1e-5)
        for i in range(len(SHAPES)):
            np.testing.assert_allclose(ours.params[i].grad.numpy(), theirs.params[i].grad.numpy(), **TOL)
            np.testing.assert_allclose(ours.numpy(i), theirs.numpy(i), **TOL, err_msg=f"step {step}")


def test_state_dict_round_trip_and_torch_interchange():
    """After a few events the keys and values equal torch's; a fresh scaler loaded from either dict carries on
    exactly as the original; pickling keeps the state."""
    models = Model("tl"), Model("torch")
    opts = optim.AdamW(models[0].params), torch.optim.AdamW(models[1].params)
    pair = scalers(init_scale=8.0, growth_interval=3, growth_factor=4.0, backoff_factor=0.25)
    for event in ["ok", "ok", "inf", "ok"]:
        for m, o, s in zip(models, opts, pair):
            o.zero_grad()
            s.scale(m.loss()).backward()
            if event != "ok":
                inject(m, 0, float(event))
            s.step(o)
            s.update()
    ours, theirs = (s.state_dict() for s in pair)
    assert ours == theirs == dict(scale=2.0, growth_factor=4.0, backoff_factor=0.25, growth_interval=3,
                                  _growth_tracker=1)
    assert [type(v) for v in ours.values()] == [type(v) for v in theirs.values()]
    for source in (ours, theirs):
        fresh = tinyllm.amp.GradScaler()
        fresh.load_state_dict(source)
        assert fresh.state_dict() == ours
        copy = pickle.loads(pickle.dumps(pair[0]))
        for s in (fresh, copy):  # two more clean steps: the tracker reaches 3 and the scale grows
            for _ in range(2):
                opts[0].zero_grad()
                s.scale(models[0].loss()).backward()
                s.step(opts[0])
                s.update()
            assert s.state_dict() == {**ours, "scale": 8.0, "_growth_tracker": 0}
    loaded_into_torch = torch.amp.GradScaler("cpu")
    loaded_into_torch.load_state_dict(ours)
    assert loaded_into_torch.state_dict() == ours


def test_disabled_is_a_pass_through():
    ours = Model("tl")
    opt = optim.SGD(ours.params, lr=0.1)
    scaler = tinyllm.amp.GradScaler(enabled=False, growth_factor=0.5)  # (its checks only run when enabled)
    loss = ours.loss()
    assert scaler.scale(loss) is loss and not scaler.is_enabled()
    loss.backward()
    inject(ours, 0, float("inf"))  # not checked: the step is taken
    grads = [p.grad for p in ours.params]
    assert scaler.unscale_(opt) is None and [p.grad for p in ours.params] == grads
    before = ours.numpy(1).copy()
    scaler.step(opt)
    assert not np.array_equal(before, ours.numpy(1))
    scaler.update()
    assert scaler.get_scale() == 1.0 and scaler.state_dict() == {}
    scaler.load_state_dict({})  # a no-op when disabled, as torch


def test_scale_takes_nested_lists_and_tuples():
    scaler = tinyllm.amp.GradScaler(init_scale=4.0)
    a, b, c = tl.tensor([1.0, 2.0]), tl.tensor(3.0), tl.tensor([[0.5]])
    out = scaler.scale([a, (b, [c])])
    assert isinstance(out, list) and isinstance(out[1], tuple) and isinstance(out[1][1], list)
    np.testing.assert_array_equal(out[0].numpy(), [4.0, 8.0])
    assert out[1][0].item() == 12.0 and out[1][1][0].numpy().tolist() == [[2.0]]


def _runtimes():
    from conftest import wgsl_skip_reason
    out = ["numpy", "c"]
    return out + ["wgsl"] if os.environ.get("CI") or not wgsl_skip_reason() else out


@pytest.mark.parametrize("device", _runtimes())
@pytest.mark.parametrize("bad,where", [(None, 0), (float("inf"), 1), (float("-inf"), 2), (float("nan"), 0)])
def test_unscale_finds_inf_and_nan_on_every_runtime(device, bad, where):
    """One non-finite element among three gradients (a different one each case) is found; the unscaled
    gradients are g / scale."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in [(3, 5), (7,), (2, 2)]]
    params = [Tensor(a, requires_grad=True, device=device) for a in arrays]
    grads = [rng.standard_normal(a.shape).astype(np.float32) * 64 for a in arrays]
    if bad is not None:
        grads[where].reshape(-1)[-1] = bad
    for p, g in zip(params, grads):
        p.grad = Tensor(g, device=device)
    opt = optim.SGD(params, lr=1.0)
    scaler = tinyllm.amp.GradScaler(init_scale=64.0)
    scaler.scale(Tensor(1.0, device=device))
    scaler.unscale_(opt)
    for p, g in zip(params, grads):
        np.testing.assert_array_equal(p.grad.numpy(), g / np.float32(64.0))
    before = [p.numpy().copy() for p in params]
    scaler.step(opt)
    scaler.update()
    assert [not np.array_equal(b, p.numpy()) for b, p in zip(before, params)] == [bad is None] * 3
    assert scaler.get_scale() == (64.0 if bad is None else 32.0)


@pytest.mark.parametrize("bad", [None, float("inf"), float("nan")])
def test_bfloat16_gradients_unscale_as_torch(bad):
    """A bfloat16 gradient is unscaled in float32 and rounded once to bfloat16, as torch's kernel does: with a
    scale of 3 (1/3 inexact) the values agree bit for bit, and an inf or NaN is found."""
    a = np.array([1.5, -2.25, 3e-3, 1e4], np.float32)
    g = np.array([3.0, 1e-3, -7.0, 65504.0], np.float32)
    if bad is not None:
        g[1] = bad
    p = Tensor(a, dtype=tl.dtype.bfloat16, requires_grad=True)
    p.grad = Tensor(g, dtype=tl.dtype.bfloat16)
    tp = torch.nn.Parameter(torch.tensor(a).bfloat16())
    tp.grad = torch.tensor(g).bfloat16()
    (scaler, tscaler), opt, topt = scalers(init_scale=3.0), optim.SGD([p]), torch.optim.SGD([tp])
    for s, o, one in ((scaler, opt, tl.tensor(1.0)), (tscaler, topt, torch.tensor(1.0))):
        s.scale(one)
        s.unscale_(o)
    assert p.grad.dtype is tl.dtype.bfloat16
    np.testing.assert_array_equal(p.grad.float().numpy(), tp.grad.float().numpy())
    for s, o in ((scaler, opt), (tscaler, topt)):
        s.step(o)
        s.update()
    assert scaler.get_scale() == tscaler.get_scale() == (3.0 if bad is None else 1.5)


def test_the_check_is_one_realize(monkeypatch):
    """unscale_ of several gradients realizes once (the check and the unscaled gradients together), and reads
    nothing on the host: the inf/NaN check is a reduction in the graph, not a loop of .item() calls."""
    import tinyllm.realizer
    params = [Tensor(np.ones(s, np.float32), requires_grad=True) for s in [(4, 3), (3,), (2, 2, 2), (5,)]]
    for p in params:
        p.grad = Tensor(np.full(p.shape, 2.0, np.float32))
    opt = optim.AdamW(params)
    scaler = tinyllm.amp.GradScaler()
    scaler.scale(Tensor(1.0))
    calls, reads = [], []
    realize = tinyllm.realizer._realize
    monkeypatch.setattr(tinyllm.realizer, "_realize", lambda tensors: calls.append(len(tensors)) or realize(tensors))
    monkeypatch.setattr(Tensor, "item", lambda self: reads.append(self) or 0.0)
    scaler.unscale_(opt)
    assert calls == [1 + len(params)] and reads == []


# ---- misuse: the same errors as torch's --------------------------------------------------------------------

def _setup(lib, **kw):
    m = Model(lib)
    opt = (optim.AdamW if lib == "tl" else torch.optim.AdamW)(m.params)
    scaler = tinyllm.amp.GradScaler(**kw) if lib == "tl" else torch.amp.GradScaler("cpu", **kw)
    return m, opt, scaler


def _scaled_backward(m, scaler):
    scaler.scale(m.loss()).backward()


def _fp16_grads(lib, scaler):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3,)).astype(np.float16)
    if lib == "tl":
        p = Tensor(a, dtype=tl.dtype.float16, requires_grad=True)
        p.grad = Tensor(a, dtype=tl.dtype.float16)
        opt = optim.SGD([p])
        scaler.scale(tl.tensor(1.0))
    else:
        p = torch.nn.Parameter(torch.tensor(a))
        p.grad = torch.tensor(a)
        opt = torch.optim.SGD([p])
        scaler.scale(torch.tensor(1.0))
    scaler.unscale_(opt)


MISUSES = {
    "unscale_ twice": lambda lib, m, o, s: (_scaled_backward(m, s), s.unscale_(o), s.unscale_(o)),
    "unscale_ after step": lambda lib, m, o, s: (_scaled_backward(m, s), s.step(o), s.unscale_(o)),
    "step twice": lambda lib, m, o, s: (_scaled_backward(m, s), s.step(o), s.step(o)),
    "step without scale": lambda lib, m, o, s: (m.loss().backward(), s.step(o)),
    "unscale_ without scale": lambda lib, m, o, s: (m.loss().backward(), s.unscale_(o)),
    "update without scale": lambda lib, m, o, s: s.update(),
    "update without step": lambda lib, m, o, s: (_scaled_backward(m, s), s.update()),
    "a closure": lambda lib, m, o, s: (_scaled_backward(m, s), s.step(o, closure=lambda: None)),
    "an empty state dict": lambda lib, m, o, s: s.load_state_dict({}),
    "scale of a number": lambda lib, m, o, s: s.scale(3),
    "pickled mid-iteration": lambda lib, m, o, s: (_scaled_backward(m, s), s.step(o), pickle.dumps(s)),
    "float16 gradients": lambda lib, m, o, s: _fp16_grads(lib, s),
    "growth_factor <= 1": lambda lib, m, o, s: _setup(lib, growth_factor=1.0),
    "backoff_factor >= 1": lambda lib, m, o, s: _setup(lib, backoff_factor=1.0),
}


@pytest.mark.parametrize("misuse", MISUSES)
def test_misuse_raises_torchs_error(misuse):
    raised = {}
    for lib in ("torch", "tl"):
        with pytest.raises(Exception) as info:
            MISUSES[misuse](lib, *_setup(lib))
        raised[lib] = info.value
    assert type(raised["tl"]) is type(raised["torch"]), raised
    assert str(raised["torch"]) in str(raised["tl"]), raised
