"""tinyllm.optim against torch.optim: the same parameters receive the same gradients for several steps, and the
parameters must stay together; clip_grad_norm_ and the learning-rate schedules too."""
import math
import re

import numpy as np
import pytest
import torch

import tinyllm as tl
from tinyllm import nn, optim, realizer

TOL = dict(rtol=1e-5, atol=1e-6)  # float32 updates in the same arithmetic as torch's; rounding differs by ~1 ulp/step
STEPS = 6
SHAPES = [(4, 3), (3,), (2, 2, 2)]


def make_params(seed=0, shapes=SHAPES):
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    return [nn.Parameter(a.copy()) for a in arrays], [torch.nn.Parameter(torch.tensor(a)) for a in arrays]


def grads_for(step, shapes=SHAPES, seed=1):
    rng = np.random.default_rng(seed + 1000 * step)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def run(opt, topt, params, tparams, steps=STEPS, skip=(), schedulers=()):
    """Feed both optimizers the same gradients (None for indices in `skip`) and compare after every step."""
    for step in range(steps):
        for i, (p, tp, g) in enumerate(zip(params, tparams, grads_for(step, [p.shape for p in params]))):
            p.grad = None if i in skip else tl.tensor(g)
            tp.grad = None if i in skip else torch.tensor(g)
        opt.step()
        topt.step()
        for sched, tsched in schedulers:
            sched.step()
            tsched.step()
            np.testing.assert_allclose(sched.get_last_lr(), tsched.get_last_lr(), rtol=1e-12)
        for i, (p, tp) in enumerate(zip(params, tparams)):
            np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), **TOL, err_msg=f"param {i}, step {step}")


def moved(params, seed=0):
    """Which parameters differ from their starting value."""
    start, _ = make_params(seed, [p.shape for p in params])
    return [not np.array_equal(p.numpy(), s.numpy()) for p, s in zip(params, start)]


# ---- SGD ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("momentum,dampening,nesterov,weight_decay", [
    (0.0, 0.0, False, 0.0), (0.0, 0.0, False, 0.1), (0.9, 0.0, False, 0.0), (0.9, 0.3, False, 0.05),
    (0.9, 0.0, True, 0.0), (0.8, 0.0, True, 0.1)])
def test_sgd_matches_torch(momentum, dampening, nesterov, weight_decay):
    params, tparams = make_params()
    kw = dict(lr=0.05, momentum=momentum, dampening=dampening, nesterov=nesterov, weight_decay=weight_decay)
    run(optim.SGD(params, **kw), torch.optim.SGD(tparams, **kw), params, tparams)


# ---- Adam / AdamW ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [dict(), dict(lr=1e-2, weight_decay=0.1), dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-6),
                                dict(lr=1e-2, weight_decay=0.0)])
def test_adamw_matches_torch(kw):
    params, tparams = make_params()
    run(optim.AdamW(params, **kw), torch.optim.AdamW(tparams, **kw), params, tparams)


@pytest.mark.parametrize("kw", [dict(), dict(lr=1e-2, weight_decay=0.1), dict(lr=3e-3, betas=(0.8, 0.9), eps=1e-4)])
def test_adam_matches_torch(kw):
    params, tparams = make_params()
    run(optim.Adam(params, **kw), torch.optim.Adam(tparams, **kw), params, tparams)


def test_adam_and_adamw_decay_differently():
    """Adam's L2 term passes through the moment estimates; AdamW's decay does not: with decay they part."""
    a, _ = make_params()
    b, _ = make_params()
    opt_a, opt_b = optim.Adam(a, lr=1e-2, weight_decay=0.5), optim.AdamW(b, lr=1e-2, weight_decay=0.5)
    for step in range(3):
        for p, q, g in zip(a, b, grads_for(step)):
            p.grad, q.grad = tl.tensor(g), tl.tensor(g)
        opt_a.step()
        opt_b.step()
    assert not np.allclose(a[0].numpy(), b[0].numpy(), **TOL)


def test_adamw_on_a_real_loss_matches_torch():
    """Gradients from backward() rather than set by hand, with the step realized between iterations."""
    tl.manual_seed(0)
    lin, tlin = nn.Linear(5, 3), torch.nn.Linear(5, 3)
    tlin.load_state_dict({k: torch.tensor(v.numpy()) for k, v in lin.state_dict().items()})
    opt = optim.AdamW(lin.parameters(), lr=1e-2, weight_decay=0.1)
    topt = torch.optim.AdamW(tlin.parameters(), lr=1e-2, weight_decay=0.1)
    rng = np.random.default_rng(1)
    for _ in range(STEPS):
        x = rng.standard_normal((8, 5)).astype(np.float32)
        y = rng.standard_normal((8, 3)).astype(np.float32)
        loss = nn.functional.mse_loss(lin(tl.tensor(x)), tl.tensor(y))
        tloss = torch.nn.functional.mse_loss(tlin(torch.tensor(x)), torch.tensor(y))
        opt.zero_grad()
        topt.zero_grad()
        loss.backward()
        tloss.backward()
        opt.step()
        topt.step()
        assert loss.item() == pytest.approx(tloss.item(), rel=1e-5)
    for name, tp in tlin.named_parameters():
        np.testing.assert_allclose(getattr(lin, name).numpy(), tp.detach().numpy(), **TOL)


# ---- parameter groups, skipped parameters, errors ----------------------------------------------------------

@pytest.mark.parametrize("name", ["SGD", "AdamW", "Adam"])
def test_param_groups_with_their_own_lr_and_weight_decay(name):
    params, tparams = make_params()
    extra = dict(momentum=0.9) if name == "SGD" else {}

    def groups(ps):
        return [{"params": ps[:1], "lr": 0.1, "weight_decay": 0.2}, {"params": ps[1:], "weight_decay": 0.0}]

    opt = getattr(optim, name)(groups(params), lr=0.01, **extra)
    topt = getattr(torch.optim, name)(groups(tparams), lr=0.01, **extra)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.01]
    assert [g["weight_decay"] for g in opt.param_groups] == [0.2, 0.0]
    run(opt, topt, params, tparams)


@pytest.mark.parametrize("name", ["SGD", "AdamW"])
def test_parameter_without_grad_is_left_alone(name):
    params, tparams = make_params()
    kw = dict(lr=0.1, momentum=0.9, weight_decay=0.1) if name == "SGD" else dict(lr=0.1, weight_decay=0.1)
    opt = getattr(optim, name)(params, **kw)
    run(opt, getattr(torch.optim, name)(tparams, **kw), params, tparams, skip={1})
    assert moved(params) == [True, False, True]
    assert params[1] not in opt.state or not opt.state[params[1]]


def test_zero_grad_sets_grads_to_none():
    params, _ = make_params()
    opt = optim.SGD(params, lr=0.1)
    for p in params:
        p.grad = tl.ones(*p.shape)
    opt.zero_grad()
    assert all(p.grad is None for p in params)


def test_step_keeps_parameter_identity_and_leaf_status():
    params, _ = make_params()
    ids = [id(p) for p in params]
    opt = optim.AdamW(params, lr=0.1)
    for p in params:
        p.grad = tl.ones(*p.shape)
    opt.step()
    assert [id(p) for p in params] == ids
    assert all(p.is_leaf and p.requires_grad for p in params)
    # and a later backward still reaches the updated parameter
    opt.zero_grad()
    (params[0] * 2.0).sum().backward()
    np.testing.assert_array_equal(params[0].grad.numpy(), np.full(params[0].shape, 2.0, np.float32))


def test_optimizer_errors():
    with pytest.raises(ValueError, match="empty"):
        optim.SGD([], lr=0.1)
    with pytest.raises(TypeError, match="require grad"):
        optim.AdamW([tl.ones(2)], lr=0.1)
    p = nn.Parameter(np.ones((3, 2), np.float32))
    with pytest.raises(TypeError, match="iterable"):  # torch refuses a bare tensor too
        optim.SGD(p, lr=0.1)
    with pytest.raises(ValueError, match="twice"):
        optim.SGD([{"params": [p]}, {"params": [p]}], lr=0.1)
    with pytest.raises(TypeError, match="leaf"):
        optim.SGD([p * 2.0], lr=0.1)


def test_group_params_may_be_one_tensor():
    params, tparams = make_params(shapes=[(3, 2)])
    opt = optim.SGD([{"params": params[0]}], lr=0.1)
    topt = torch.optim.SGD([{"params": tparams[0]}], lr=0.1)
    assert len(opt.param_groups[0]["params"]) == 1 and opt.param_groups[0]["params"][0] is params[0]
    run(opt, topt, params, tparams, steps=2)


def test_zero_grad_set_to_none_false_keeps_zero_tensors():
    params, _ = make_params()
    opt = optim.SGD(params, lr=0.1)
    for p in params:
        p.grad = tl.ones(*p.shape)
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and p.grad.shape == p.shape and not p.grad.numpy().any() for p in params)


# ---- clip_grad_norm_ ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_grad_norm_matches_torch(max_norm):
    params, tparams = make_params()
    for p, tp, g in zip(params, tparams, grads_for(0)):
        p.grad, tp.grad = tl.tensor(g), torch.tensor(g)
    norm = nn.clip_grad_norm_(params, max_norm)
    tnorm = torch.nn.utils.clip_grad_norm_(tparams, max_norm)
    assert norm.item() == pytest.approx(tnorm.item(), rel=1e-6)
    for p, tp in zip(params, tparams):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), **TOL)
    clipped = math.sqrt(sum(float((p.grad.numpy().astype(np.float64) ** 2).sum()) for p in params))
    assert clipped <= max_norm * (1 + 1e-5)
    if max_norm > norm.item():  # below the limit nothing changes
        for p, g in zip(params, grads_for(0)):
            np.testing.assert_array_equal(p.grad.numpy(), g)


def test_clip_grad_norm_skips_missing_grads_and_takes_iterables_and_single_tensors():
    params, tparams = make_params()
    for i, (p, tp, g) in enumerate(zip(params, tparams, grads_for(0))):
        p.grad, tp.grad = (None, None) if i == 1 else (tl.tensor(g), torch.tensor(g))
    norm = nn.clip_grad_norm_(iter(params), 0.1)  # a generator, as model.parameters() is in torch
    tnorm = torch.nn.utils.clip_grad_norm_(iter(tparams), 0.1)
    assert norm.item() == pytest.approx(tnorm.item(), rel=1e-6)
    assert params[1].grad is None
    # one tensor on its own, as torch allows
    p, tp = make_params(shapes=[(3, 4)])
    g = grads_for(0, [(3, 4)])[0]
    p[0].grad, tp[0].grad = tl.tensor(g), torch.tensor(g)
    norm = nn.clip_grad_norm_(p[0], 0.5)
    tnorm = torch.nn.utils.clip_grad_norm_(tp[0], 0.5)
    assert norm.item() == pytest.approx(tnorm.item(), rel=1e-6)
    np.testing.assert_allclose(p[0].grad.numpy(), tp[0].grad.numpy(), **TOL)


# ---- schedules ---------------------------------------------------------------------------------------------

def nanogpt_lr(it, lr, warmup, decay_iters, min_lr):
    """nanoGPT's get_lr, written out: linear warmup, cosine decay, then a floor."""
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay_iters:
        return min_lr
    ratio = (it - warmup) / (decay_iters - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


@pytest.mark.parametrize("warmup,max_steps,min_ratio", [(10, 100, 0.1), (0, 50, 0.0), (5, 20, 0.5)])
def test_warmup_cosine_shape(warmup, max_steps, min_ratio):
    f = optim.warmup_cosine(warmup, max_steps, min_ratio)
    values = [f(s) for s in range(max_steps + 20)]
    for s, v in enumerate(values):
        assert v == pytest.approx(nanogpt_lr(s, 1.0, warmup, max_steps, min_ratio), abs=1e-12), s
    rise, fall = values[:warmup + 1], values[warmup:max_steps + 1]
    assert all(a < b for a, b in zip(rise, rise[1:])), "warmup must rise"
    assert values[warmup] == pytest.approx(1.0)
    assert all(a > b for a, b in zip(fall, fall[1:])), "the cosine must fall"
    assert all(v == pytest.approx(min_ratio) for v in values[max_steps:]), "then stay at min_ratio"
    assert min(values) >= min(min_ratio, values[0]) - 1e-12


def test_warmup_cosine_lr_drives_every_group():
    params, _ = make_params()
    opt = optim.AdamW([{"params": params[:1], "lr": 1e-2}, {"params": params[1:]}], lr=1e-3)
    sched = optim.WarmupCosineLR(opt, warmup_iters=3, max_iters=10, min_lr_ratio=0.1)
    f = optim.warmup_cosine(3, 10, 0.1)
    for step in range(14):
        assert sched.get_last_lr() == pytest.approx([1e-2 * f(step), 1e-3 * f(step)])
        assert [g["lr"] for g in opt.param_groups] == sched.get_last_lr()
        sched.step()


def test_warmup_cosine_old_keyword_names():
    """warmup_steps, max_steps and min_ratio are the old names of warmup_iters, max_iters and min_lr_ratio."""
    new, old = optim.warmup_cosine(3, 10, 0.2), optim.warmup_cosine(warmup_steps=3, max_steps=10, min_ratio=0.2)
    assert [new(s) for s in range(12)] == [old(s) for s in range(12)]
    params, _ = make_params()
    sched = optim.WarmupCosineLR(optim.SGD(params, lr=1.0), warmup_steps=3, max_steps=10, min_ratio=0.2)
    assert sched.get_last_lr() == [new(0)]
    with pytest.raises(TypeError, match=r"WarmupCosineLR: got both max_iters= and its alias max_steps="):
        optim.WarmupCosineLR(optim.SGD(params, lr=1.0), 3, max_iters=10, max_steps=10)


def test_lambda_lr_matches_torch_and_steers_the_updates():
    params, tparams = make_params()
    opt = optim.SGD([{"params": params[:2]}, {"params": params[2:], "lr": 0.3}], lr=0.1, momentum=0.9)
    topt = torch.optim.SGD([{"params": tparams[:2]}, {"params": tparams[2:], "lr": 0.3}], lr=0.1, momentum=0.9)
    fn = optim.warmup_cosine(2, 5, 0.2)
    sched, tsched = optim.LambdaLR(opt, fn), torch.optim.lr_scheduler.LambdaLR(topt, fn)
    np.testing.assert_allclose(sched.get_last_lr(), tsched.get_last_lr(), rtol=1e-12)
    run(opt, topt, params, tparams, steps=7, schedulers=[(sched, tsched)])
    assert sched.last_epoch == tsched.last_epoch == 7


@pytest.mark.parametrize("runtime", ["numpy", "c"])
def test_step_frees_old_values_chunk_by_chunk(runtime):
    """AdamW's step computes new parameters and moments chunk by chunk, freeing each chunk's old values before the
    next: the step adds about 3/CHUNKS of the state's size to the peak, where one realize of everything would add
    3x the parameters (a new parameter, m and v for each)."""
    params = [tl.tensor(np.random.default_rng(i).standard_normal((64, 256)).astype(np.float32), device=runtime,
                        requires_grad=True) for i in range(16)]
    opt = optim.AdamW(params, lr=1e-3)
    for _ in range(2):  # the second step has m and v to replace
        for p in params:
            p.grad = tl.tensor(np.ones(p.shape, np.float32), device=runtime)
        tl.reset_peak_memory_stats()
        before = tl.memory_allocated()
        opt.step()
    added = tl.max_memory_allocated() - before
    param_bytes = sum(p.numel() * 4 for p in params)
    assert added <= param_bytes, (added, param_bytes)  # 3/8 of it with 8 chunks; 3x in one realize
    assert tl.memory_allocated() - before <= param_bytes / 16  # nothing else stays


@pytest.mark.parametrize("runtime", ["numpy", "c"])
@pytest.mark.parametrize("name", ["AdamW", "Adam", "SGD"])
def test_update_from_a_remembered_schedule_equals_the_built_graph(name, runtime):
    """From its third step a chunk runs the schedule its update graph had before, without building the graph
    (Optimizer._apply): bit for bit what building it gives (a subclass with its own _update builds it every time),
    through a changing learning rate, a parameter without a gradient for a step, an option changed and one
    gradient given to two parameters."""
    kw = dict(SGD=dict(lr=0.1, momentum=0.9, weight_decay=0.01), AdamW=dict(lr=0.01, weight_decay=0.1),
              Adam=dict(lr=0.01, weight_decay=0.05))[name]
    cls = getattr(optim, name)
    built = type("Built", (cls,), {"_update": lambda self, *args: cls._update(self, *args)})
    shapes = [(4, 3), (3,), (4, 3), (2, 5)]
    runs = []
    for kind in (cls, built):
        rng = np.random.default_rng(0)
        params = [tl.tensor(rng.standard_normal(s).astype(np.float32), device=runtime, requires_grad=True)
                  for s in shapes]
        opt = kind([{"params": params[:3]}, {"params": params[3:], "weight_decay": 0.0}], **kw)
        opt.CHUNKS = 2
        sched = optim.LambdaLR(opt, lambda step: 1.0 / (1 + step))
        for step in range(8):
            grads = [tl.tensor(rng.standard_normal(s).astype(np.float32), device=runtime) for s in shapes]
            grads[2] = grads[0] if step == 5 else grads[2]  # one tensor read twice: another graph
            for i, (p, g) in enumerate(zip(params, grads)):
                p.grad = None if (step == 4 and i == 1) else g
            if step == 6:
                opt.param_groups[0]["weight_decay"] = 0.2
            opt.step()
            sched.step()
        runs.append([p.numpy() for p in params] + [v.numpy() for st in opt.state.values() for v in st.values()
                                                   if isinstance(v, tl.Tensor)])
        if kind is cls:
            assert any(key[1] is cls for key in realizer._known), "the schedules were not remembered"
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


# ---- impossible hyperparameters and clip_grad_norm_'s flags (issue 20) -----------------------------------

@pytest.mark.parametrize("cls, kwargs, message", [
    ("AdamW", dict(lr=-1.0), "Invalid learning rate: -1.0"),
    ("Adam", dict(lr=-1e-3), "Invalid learning rate: -0.001"),
    ("SGD", dict(lr=-1.0), "Invalid learning rate: -1.0"),
    ("AdamW", dict(lr=float("nan")), "Invalid learning rate: nan"),
    ("AdamW", dict(eps=-1e-8), "Invalid epsilon value: -1e-08"),
    ("AdamW", dict(betas=(1.0, 0.999)), "Invalid beta parameter at index 0: 1.0"),
    ("Adam", dict(betas=(0.9, -0.1)), "Invalid beta parameter at index 1: -0.1"),
    ("AdamW", dict(weight_decay=-0.1), "Invalid weight_decay value: -0.1"),
    ("Adam", dict(weight_decay=-0.1), "Invalid weight_decay value: -0.1"),
    ("SGD", dict(lr=0.1, momentum=-0.9), "Invalid momentum value: -0.9"),
    ("SGD", dict(lr=0.1, weight_decay=-1.0), "Invalid weight_decay value: -1.0"),
    ("SGD", dict(lr=0.1, nesterov=True), "Nesterov momentum requires a momentum and zero dampening"),
    ("SGD", dict(lr=0.1, momentum=0.9, dampening=0.1, nesterov=True),
     "Nesterov momentum requires a momentum and zero dampening"),
])
def test_impossible_hyperparameters_raise_as_torch(cls, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        getattr(torch.optim, cls)([torch.zeros(2, requires_grad=True)], **kwargs)
    with pytest.raises(ValueError, match=re.escape(message)):
        getattr(optim, cls)([tl.zeros(2, requires_grad=True)], **kwargs)


def test_edge_hyperparameters_are_accepted_as_torch():
    p = [tl.zeros(2, requires_grad=True)]
    optim.AdamW(p, lr=0.0, betas=(0.0, 0.0), eps=0.0, weight_decay=0.0)
    optim.SGD(p, lr=0.0, momentum=0.9, nesterov=True)


@pytest.mark.parametrize("norm_type", [1.0, 3.0, math.inf, "inf"])
def test_clip_grad_norm_norm_types_match_torch(norm_type, each_runtime):
    params, tparams = make_params()
    for p, tp, g in zip(params, tparams, grads_for(0)):
        p.grad, tp.grad = tl.tensor(g), torch.tensor(g)
    norm = nn.clip_grad_norm_(params, 0.5, norm_type, foreach=True)
    tnorm = torch.nn.utils.clip_grad_norm_(tparams, 0.5, norm_type, foreach=True)
    assert norm.item() == pytest.approx(tnorm.item(), rel=1e-5)
    for p, tp in zip(params, tparams):
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), **TOL)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_clip_grad_norm_error_if_nonfinite(bad, each_runtime):
    params, tparams = make_params()
    for p, tp, g in zip(params, tparams, grads_for(0)):
        g = g.copy()
        g.flat[0] = bad
        p.grad, tp.grad = tl.tensor(g), torch.tensor(g)
    message = "The total norm of order 2.0 for gradients from `parameters` is non-finite"
    with pytest.raises(RuntimeError, match=re.escape(message)):
        torch.nn.utils.clip_grad_norm_(tparams, 1.0, error_if_nonfinite=True)
    with pytest.raises(RuntimeError, match=re.escape(message)):
        nn.clip_grad_norm_(params, 1.0, error_if_nonfinite=True)
    norm = nn.clip_grad_norm_(params, 1.0)  # the default scales by the non-finite norm, as torch
    tnorm = torch.nn.utils.clip_grad_norm_(tparams, 1.0)
    np.testing.assert_equal(norm.item(), tnorm.item())
    np.testing.assert_equal(params[0].grad.numpy(), tparams[0].grad.numpy())


# ---- state dicts, in torch's layout ------------------------------------------------------------------------
STATE_CASES = [("SGD", dict(lr=0.05, momentum=0.9, weight_decay=0.1)), ("SGD", dict(lr=0.05)),
               ("Adam", dict(lr=1e-2, weight_decay=0.1)), ("AdamW", dict(lr=1e-2, betas=(0.8, 0.9)))]
SAME = dict(rtol=1e-6, atol=1e-7)


def feed(opt, params, steps, start=0, torch_side=False):
    """`steps` optimizer steps with grads_for(start), grads_for(start + 1), ..."""
    for step in range(start, start + steps):
        for p, g in zip(params, grads_for(step, [tuple(p.shape) for p in params])):
            p.grad = torch.tensor(g) if torch_side else tl.tensor(g)
        opt.step()


def grouped(name, ps, kw):
    """Two param groups, the second with its own weight decay (torch's optimizer or tinyllm's)."""
    lib = torch.optim if isinstance(ps[0], torch.Tensor) else optim
    return getattr(lib, name)([{"params": ps[:2]}, {"params": ps[2:], "weight_decay": 0.0}], **kw)


@pytest.mark.parametrize("name, kw", STATE_CASES)
def test_state_dict_is_torchs(name, kw):
    """The same keys, nesting and values as torch's state_dict after the same steps: state by parameter index (none
    for a parameter without state), the step a 0-d float32 tensor, the groups' options (torch's groups hold more
    options, implementation choices that tinyllm has no use for) with params as indices."""
    params, tparams = make_params()
    opt, topt = grouped(name, params, kw), grouped(name, tparams, kw)
    feed(opt, params, 3)
    feed(topt, tparams, 3, torch_side=True)
    sd, tsd = opt.state_dict(), topt.state_dict()
    assert list(sd) == list(tsd) == ["state", "param_groups"]
    assert list(sd["state"]) == list(tsd["state"])
    for i, entry in tsd["state"].items():
        assert list(sd["state"][i]) == list(entry), i
        for key, value in entry.items():
            got = sd["state"][i][key]
            assert isinstance(got, tl.Tensor) and got.shape == tuple(value.shape) and got.dtype.name == \
                str(value.dtype).removeprefix("torch."), (i, key)
            np.testing.assert_allclose(got.numpy(), value.numpy(), **SAME, err_msg=f"{i} {key}")
    for group, tgroup in zip(sd["param_groups"], tsd["param_groups"]):
        assert set(group) <= set(tgroup) and {k: tgroup[k] for k in group} == group
    before = {i: {k: v.numpy().copy() for k, v in e.items()} for i, e in sd["state"].items()}
    feed(opt, params, 1, start=3)  # a state dict holds the values of when it was taken
    assert all(np.array_equal(sd["state"][i][k].numpy(), v) for i, e in before.items() for k, v in e.items())


@pytest.mark.parametrize("name, kw", STATE_CASES)
def test_torchs_state_dict_loads_and_training_goes_on_as_torchs(name, kw):
    """torch's state dict (its tensors as NumPy arrays) loaded into a fresh tinyllm optimizer over the same values:
    the steps after it equal torch's; and tinyllm's state dict (as torch tensors) loads into torch's the same."""
    params, tparams = make_params()
    topt = grouped(name, tparams, kw)
    feed(topt, tparams, 3, torch_side=True)
    for p, tp in zip(params, tparams):
        p.copy_(tp.detach().numpy())
    opt = grouped(name, params, {**kw, "lr": 0.5})  # other options to begin with: the state dict's win
    tsd = topt.state_dict()
    opt.load_state_dict({"state": {i: {k: v.numpy() for k, v in e.items()} for i, e in tsd["state"].items()},
                         "param_groups": tsd["param_groups"]})
    assert opt.param_groups[0]["lr"] == kw["lr"] and "foreach" not in opt.param_groups[0]
    feed(opt, params, 3, start=3)
    feed(topt, tparams, 3, start=3, torch_side=True)
    for p, tp in zip(params, tparams):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), **SAME)

    topt2 = grouped(name, [torch.nn.Parameter(torch.tensor(p.numpy())) for p in params], kw)
    tparams2 = [p for g in topt2.param_groups for p in g["params"]]
    sd = opt.state_dict()
    topt2.load_state_dict({"state": {i: {k: torch.tensor(v.numpy()) for k, v in e.items()}
                                     for i, e in sd["state"].items()}, "param_groups": sd["param_groups"]})
    feed(opt, params, 2, start=6)
    feed(topt2, tparams2, 2, start=6, torch_side=True)
    for p, tp in zip(params, tparams2):
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), **SAME)


def test_load_state_dict_errors_name_the_problem():
    params, _ = make_params()
    opt = optim.AdamW(params)
    feed(opt, params, 1)
    sd = opt.state_dict()

    def refused(edit, *words):
        bad = {"state": {i: dict(e) for i, e in sd["state"].items()},
               "param_groups": [dict(g) for g in sd["param_groups"]]}
        edit(bad)
        with pytest.raises(ValueError) as e:
            optim.AdamW(params).load_state_dict(bad)
        assert "AdamW.load_state_dict" in str(e.value) and all(w in str(e.value) for w in words), str(e.value)

    refused(lambda sd: sd["param_groups"].append({**sd["param_groups"][0], "params": []}), "2 parameter group(s)", "1")
    refused(lambda sd: sd["param_groups"][0].update(params=[0, 1]), "[2]", "[3]")
    refused(lambda sd: sd["state"][1].update(exp_avg=np.zeros((2, 2), np.float32)), "parameter 1", "'exp_avg'",
            "(2, 2)", "(3,)")
    refused(lambda sd: sd["state"][0].update(max_exp_avg_sq=sd["state"][0]["exp_avg"]), "max_exp_avg_sq",
            "step, exp_avg, exp_avg_sq")
    refused(lambda sd: sd["state"][0].pop("exp_avg_sq"), "parameter 0", "'exp_avg_sq'")
    refused(lambda sd: sd["state"][0].update(step=2.5), "'step' is 2.5")
    refused(lambda sd: sd["state"].update({7: sd["state"][0]}), "parameter 7")
    refused(lambda sd: sd["param_groups"][0].update(amsgrad=True), "amsgrad=True", "does not implement")
    refused(lambda sd: sd["param_groups"][0].pop("betas"), "no 'betas'")
    with pytest.raises(ValueError, match="expected a dict with 'state' and 'param_groups'"):
        opt.load_state_dict({"exp_avg": 1})
    with pytest.raises(ValueError, match="decoupled_weight_decay=True"):  # torch's AdamW state into an Adam
        optim.Adam(params).load_state_dict({**sd, "param_groups": [{**sd["param_groups"][0],
                                                                    "decoupled_weight_decay": True}]})
    assert opt.state_dict()["state"][0]["step"].item() == 1  # nothing changed by a refused load


CPLX = [("SGD", dict(lr=0.1, momentum=0.9)), ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
        ("Adam", dict(lr=0.05)), ("Adam", dict(lr=0.05, weight_decay=0.1)), ("AdamW", dict(lr=0.05, weight_decay=0.1))]


@pytest.mark.parametrize("name, kw", CPLX)
def test_complex_parameters_train_as_torchs(name, kw):
    """A complex parameter is updated as torch updates it: view_as_real(param) with view_as_real(grad), so Adam's
    second moment is per real component (not |g|²); beside a real parameter in one step, its state complex as
    torch's, and the state dict goes both ways."""
    rng = np.random.default_rng(0)
    w0 = (rng.standard_normal((3, 4)) + 1j * rng.standard_normal((3, 4))).astype(np.complex64)
    b0 = rng.standard_normal(4).astype(np.float32)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    p, b = nn.Parameter(tl.tensor(w0)), nn.Parameter(b0.copy())
    tp, tb = torch.nn.Parameter(torch.tensor(w0)), torch.nn.Parameter(torch.tensor(b0))
    assert type(p).__name__ == "ComplexParameter"
    opt, topt = getattr(optim, name)([p, b], **kw), getattr(torch.optim, name)([tp, tb], **kw)

    def train(steps):
        for _ in range(steps):
            z = tl.tensor(x) @ p
            loss = (z.abs() ** 2).sum() + (z.real * b).sum()
            opt.zero_grad(); loss.backward(); opt.step()
            tz = torch.tensor(x).to(torch.complex64) @ tp
            tloss = (tz.abs() ** 2).sum() + (tz.real * tb).sum()
            topt.zero_grad(); tloss.backward(); topt.step()
            np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(b.numpy(), tb.detach().numpy(), rtol=1e-5, atol=1e-6)

    train(4)
    state, tstate = opt.state_dict()["state"], topt.state_dict()["state"]
    for key, tv in tstate[0].items():
        assert key in state[0]
        v = state[0][key]
        if key != "step":
            assert v.dtype == tl.complex64 and v.shape == tv.shape
        np.testing.assert_allclose(np.asarray(v.numpy()), tv.numpy(), rtol=1e-5, atol=1e-7)
    # torch's state into a fresh tinyllm optimizer, and tinyllm's into a fresh torch one: training goes on the same
    opt = getattr(optim, name)([p, b], **kw)
    opt.load_state_dict(topt.state_dict())
    assert all(v.dtype == tl.complex64 for v in opt.state[p].values() if isinstance(v, tl.Tensor))
    saved = opt.state_dict()
    topt = getattr(torch.optim, name)([tp, tb], **kw)
    topt.load_state_dict({"param_groups": saved["param_groups"],
                          "state": {i: {k: torch.tensor(np.asarray(v.numpy())) for k, v in s.items()}
                                    for i, s in saved["state"].items()}})
    train(3)


def test_complex_parameter_step_replays_under_jit():
    """tinyllm.jit replays a step that updates a complex parameter (host values in its real dtype): torch's values."""
    rng = np.random.default_rng(1)
    w0 = (rng.standard_normal((3, 4)) + 1j * rng.standard_normal((3, 4))).astype(np.complex64)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    p, tp = nn.Parameter(tl.tensor(w0)), torch.nn.Parameter(torch.tensor(w0))
    opt, topt = optim.Adam([p], lr=0.05), torch.optim.Adam([tp], lr=0.05)

    @tl.jit
    def step(xx):
        loss = ((xx @ p).abs() ** 2).sum()
        opt.zero_grad(); loss.backward(); opt.step()
        return loss

    for _ in range(6):
        step(tl.tensor(x))
        tloss = ((torch.tensor(x).to(torch.complex64) @ tp).abs() ** 2).sum()
        topt.zero_grad(); tloss.backward(); topt.step()
        np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert step.tapes  # (it recorded, and replayed the later steps)
