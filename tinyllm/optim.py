"""Optimizers with torch.optim's names, defaults and update rules. Each step builds the update of every
parameter as graph and realizes it in a few chunks (C runtime: one kernel per parameter, see fuse_outputs). A complex
parameter is updated as torch's optimizers do it: its real view with its gradient's (each moment per real component),
its state complex tensors (their real views updated), so state dicts pass between the two libraries."""
import math
import numbers

import numpy as np

from . import realizer
from .complex import ComplexTensor, from_numpy as complex_from_numpy, view_as_complex, view_as_real
from .factory import zeros_like
from .graph import Node, bulk
from .replay.jit import host_values
from .realizer import assign
from .tensor import Tensor, host_array, keyword_aliases


def _real(t):
    """A complex tensor's real view (its storage, shape S + (2,)), a real tensor itself: as torch's optimizers, which
    update view_as_real(param) with view_as_real(grad), so each moment is per real component."""
    return view_as_real(t) if isinstance(t, ComplexTensor) else t


class Optimizer:
    CHUNKS = 8

    def __init__(self, params, defaults):
        name = type(self).__name__
        if isinstance(params, Tensor):  # iterating it would hand over its rows, which are not the parameter
            raise TypeError(f"{name}: params must be an iterable of tensors or of dicts, got one Tensor: "
                            "wrap it in a list")
        if hasattr(params, "parameters") and hasattr(params, "named_modules"):
            raise TypeError(f"{name}: params must be an iterable of tensors or of dicts, got a "
                            f"{type(params).__name__} model: pass model.parameters()")
        params = list(params)
        if not params:
            raise ValueError(f"{name}: got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        self.param_groups, seen = [], set()
        for g in groups:
            ps = g["params"]
            group = {**defaults, **g, "params": [ps] if isinstance(ps, Tensor) else list(ps)}
            self._check(group)
            for p in group["params"]:
                if not isinstance(p, Tensor) or not p.requires_grad or not p.is_leaf:
                    raise TypeError(f"{name}: can only optimize leaf tensors that require grad, got {p!r:.80}")
                if id(p) in seen:
                    raise ValueError(f"{name}: a parameter appears twice (in one group or in two): it would be "
                                     "updated twice per step")
                seen.add(id(p))
            self.param_groups.append(group)
        self.defaults, self.state = defaults, {}

    # options torch's optimizers keep in their param groups that choose how to compute, not what: a state dict
    # loaded from torch may hold them, with any value (tinyllm's one implementation computes the same thing)
    _IMPLEMENTATION_OPTIONS = ("foreach", "fused", "capturable", "differentiable")
    # torch options that change the result, which this optimizer does not implement, and the value meaning "off"
    _UNSUPPORTED_OPTIONS = {"maximize": False}
    _STATE_KEYS = ()  # what the state of one parameter holds, in torch's names

    def state_dict(self):
        """The state in torch's layout, so one saved by either library loads into the other:
        {"state": {index: {name: value}}, "param_groups": [{option: value, ..., "params": [index, ...]}]}, the
        parameters numbered in order through the param groups (parameters with no state yet are left out). The
        tensors are this step's values (later steps do not change them), a step count is a 0-d float32 tensor as
        torch's; save it with tinyllm.save(optimizer.state_dict(), path)."""
        ids, state, groups, n = {}, {}, [], 0
        for g in self.param_groups:
            groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": list(range(n, n + len(g["params"])))})
            for p in g["params"]:
                ids[id(p)], n = n, n + 1
                if self.state.get(p):
                    state[ids[id(p)]] = export_state(self.state[p])
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Load a state dict in torch's layout (this optimizer's state_dict(), torch's optimizer.state_dict() with
        its tensors as tinyllm Tensors, NumPy arrays or torch tensors, or what tinyllm.load gives back): the
        groups' options and each parameter's state, cast to the parameter's dtype and device as torch casts them.
        The param groups must hold as many parameters as this optimizer's, in the same order. All or nothing:
        everything is checked before anything changes."""
        name = f"{type(self).__name__}.load_state_dict"
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            got = sorted(map(str, state_dict)) if isinstance(state_dict, dict) else type(state_dict).__name__
            raise ValueError(f"{name}: expected a dict with 'state' and 'param_groups' (what optimizer.state_dict() "
                             f"returns), got {got}")
        saved_groups, saved_state = state_dict["param_groups"], state_dict["state"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"{name}: loaded state dict has {len(saved_groups)} parameter group(s), this optimizer "
                             f"has {len(self.param_groups)}")
        sizes = [len(g["params"]) for g in saved_groups]
        own_sizes = [len(g["params"]) for g in self.param_groups]
        if sizes != own_sizes:
            raise ValueError(f"{name}: loaded state dict contains parameter groups of {sizes} parameters, which do "
                             f"not match the size of this optimizer's groups {own_sizes}")
        options = [self._options(saved, i, name) for i, saved in enumerate(saved_groups)]
        for g, opts in zip(self.param_groups, options):
            self._check({**g, **opts})
        params = {}  # saved index -> parameter: the saved groups' indices, matched to ours in order
        for saved, g in zip(saved_groups, self.param_groups):
            params.update(zip(saved["params"], g["params"]))
        state = {}
        for index, entry in saved_state.items():
            p = params.get(int(index)) if isinstance(index, (int, str)) and str(index).isdigit() else None
            if p is None:
                raise ValueError(f"{name}: the state dict has state for parameter {index!r}, which is in none of its "
                                 f"param groups (they hold {sorted(params)})")
            if entry:
                state[p] = self._import_state(entry, p, f"{name}: parameter {index}")
        for g, opts in zip(self.param_groups, options):
            g.update(opts)
        self.state = state

    def _options(self, saved, i, name):
        """The options of saved param group i to apply (lists as tuples, torch's implementation choices left out),
        refusing options that would change the result in a way this optimizer does not implement."""
        opts = {}
        for key, value in saved.items():
            if key == "params" or key in self._IMPLEMENTATION_OPTIONS:
                continue
            if key in self._UNSUPPORTED_OPTIONS:
                if value != self._UNSUPPORTED_OPTIONS[key]:
                    raise ValueError(f"{name}: param group {i} has {key}={value!r}, which tinyllm's "
                                     f"{type(self).__name__} does not implement (only {key}="
                                     f"{self._UNSUPPORTED_OPTIONS[key]!r})")
                continue
            opts[key] = tuple(value) if isinstance(value, list) else value
        missing = [k for k in self.defaults if k not in opts]
        if missing:
            raise ValueError(f"{name}: param group {i} has no {', '.join(map(repr, missing))}: not a state dict of "
                             f"{type(self).__name__}?")
        return opts

    def _import_state(self, entry, p, where):
        """One parameter's saved state as this optimizer keeps it: step an int, tensors p's dtype and device."""
        unknown = sorted(set(entry) - set(self._STATE_KEYS))
        if unknown:
            raise ValueError(f"{where} has state {unknown}, which {type(self).__name__} does not keep (it keeps "
                             f"{', '.join(self._STATE_KEYS)}): a state dict of another optimizer?")
        out = {}
        for key, value in entry.items():
            if key == "step":
                out[key] = import_step(value, where)
            elif value is not None:
                array = host_array(value)
                if array.shape != tuple(p.shape):
                    raise ValueError(f"{where}: {key!r} has shape {array.shape}, but the parameter has shape "
                                     f"{tuple(p.shape)}")
                if p.is_complex():  # (a complex parameter's state is complex, as torch's)
                    out[key] = complex_from_numpy(array, dtype=p.dtype, device=p.device)
                else:
                    out[key] = Tensor(array, dtype=p.dtype, device=p.device)
        missing = [k for k in self._STATE_KEYS if k not in out]
        if out and missing:
            raise ValueError(f"{where} has {sorted(out)} but no {', '.join(map(repr, missing))}")
        return out

    def _check(self, group):
        """Raise for an impossible option of a param group (the defaults filled in, so they are checked too): each
        optimizer its own, with torch's messages. torch checks the defaults only; a group's lr=-1 is checked too."""

    def zero_grad(self, set_to_none=True):
        for g in self.param_groups:
            for p in g["params"]:
                if p.grad is not None:
                    p.grad = None if set_to_none else zeros_like(p.grad)

    @bulk
    def step(self):
        """Update the parameters in about CHUNKS realizes: a chunk's old values (parameters, moments) are freed
        as soon as its new ones exist, so the step's peak memory holds one chunk of new values beside the
        state, not a second copy of all of it (torch updates in place)."""
        params = [(i, p, group) for i, group in enumerate(self.param_groups) for p in group["params"]
                  if p.grad is not None]
        keys = {}  # parameter -> {name: key of its value in `scalars`}

        def host_step():
            """Count the step and compute the values each update reads (learning rate, bias corrections).
            They enter the graph as buffers, not constants, so the step's graph is the same every time and
            its compiled kernels are reused; tinyllm.jit runs this again on every replay. _host_step depends on
            the group and the step count alone, so it runs once per group and count, not per parameter."""
            values, done = {}, {}  # (group, step before, dtype, device) -> (step after, {name: key})
            for i, p, group in params:
                state = self.state.setdefault(p, {})
                seen = done.get((i, state.get("step"), p.dtype, p.device))
                if seen is None:
                    before, named = state.get("step"), {}
                    for name, value in self._host_step(group, state).items():
                        key = named[name] = (i, state.get("step"), name, p.dtype, p.device)
                        values[key] = (value, _real(p))  # (a complex parameter's: its real dtype)
                    seen = done[i, before, p.dtype, p.device] = (state.get("step"), named)
                elif seen[0] is not None:
                    state["step"] = seen[0]
                keys[p] = seen[1]
            return values

        scalars = host_values(host_step)
        budget = sum(p.numel() for _, p, _ in params) / self.CHUNKS
        chunk, size = [], 0
        for _, p, group in params:
            chunk.append((p, group, {name: scalars[key] for name, key in keys[p].items()}))
            size += p.numel()
            if size >= budget:
                self._apply(chunk)
                chunk, size = [], 0
        if chunk:
            self._apply(chunk)

    def _apply(self, chunk):
        """Compute and assign the updates of a chunk of (parameter, group, host values). The update's graph is a
        function of what `_chunk_key` names (shapes, dtypes, devices, the group's options, the state's tensors
        and which of the tensors read are one and the same), so once a chunk of one key ran, its schedule runs
        again on the new values without building the graph: the same kernels on the same inputs, the same results.
        Only where the update's graph is known to be such a function (the built-in `_update`s), and never while
        tinyllm.jit records a step or TINYLLM_DEBUG reports each realize."""
        read = []  # the tensors the update reads: per parameter itself, its gradient, state tensors, host values
        for p, group, hyper in chunk:
            state = self.state[p]
            read += [p, p.grad, *(state[k] for k in sorted(state) if isinstance(state[k], Tensor)),
                     *(hyper[k] for k in sorted(hyper))]
        key = self._chunk_key(chunk, read)
        nodes = [t.node for t in read]  # (assign replaces the nodes of what it updates)
        ran = realizer.rerun(key, nodes) if key is not None else None
        if ran is not None:
            buffers, writes = ran
            for (j, name), buf in zip(writes, buffers):
                p = chunk[j][0]
                (self.state[p][name] if name is not None else p).node = Node("LOAD", (), buf, buf.shape, buf.dtype)
            return
        targets, values, writes = [], [], []
        for j, (p, group, hyper) in enumerate(chunk):
            state = self.state[p]
            if p.is_complex():  # the update of the real views; the state keeps complex tensors (torch's), their views
                real = {k: _real(v) for k, v in state.items()}
                updates = self._update(_real(p.detach()), _real(p.grad), real, group, hyper)
                state.update({k: view_as_complex(v) for k, v in real.items() if k not in state})
            else:
                updates = self._update(p.detach(), p.grad, state, group, hyper)
            for t, v in updates:
                targets.append(state[t] if isinstance(t, str) else p)
                values.append(v)
                writes.append((j, t if isinstance(t, str) else None))
        done = assign(targets, values)
        if key is not None and done is not None and len(done[3]) == len(values) and key == self._chunk_key(chunk, read):
            realizer.remember(key, done, nodes, writes)  # (else the state gained its tensors: another graph next step)

    def _chunk_key(self, chunk, read):
        """What the update graph of `chunk` is built from, or None where the cache does not apply: an `_update`
        not known to depend on nothing else, an unhashable option, a tensor read that is not a realized value."""
        if type(self)._update not in _PURE_UPDATES:
            return None
        nodes = [t.node for t in read]
        for n in nodes:
            if n.buffer is None and n.op != "LOAD":
                return None
        first = {}
        same = tuple(first.setdefault(n, i) for i, n in enumerate(nodes))
        parts, options = [same, type(self), tuple(realizer.PASSES["schedule"])], {}
        try:
            for p, group, hyper in chunk:
                state = self.state[p]
                if id(group) not in options:  # (a chunk's parameters mostly share a group)
                    options[id(group)] = tuple((k, _frozen(v)) for k, v in sorted(group.items())
                                               if k not in _HOST_OPTIONS)
                parts.append((p.shape, p.dtype, p.device, p.grad.shape, p.grad.dtype, p.grad.device,
                              options[id(group)],
                              tuple((k, state[k].shape, state[k].dtype, state[k].device) for k in sorted(state)
                                    if isinstance(state[k], Tensor)),
                              tuple((k, hyper[k].shape, hyper[k].dtype, hyper[k].device) for k in sorted(hyper))))
        except TypeError:
            return None
        return tuple(parts)


def export_state(entry):
    """One parameter's state as state_dict() gives it: tensors as they are now (detached: later steps, which
    rebind the state's tensors, leave them alone), an int step as torch's 0-d float32 tensor."""
    out = {}
    for key, value in entry.items():
        if isinstance(value, Tensor):
            value = value.detach()
        elif key == "step":
            value = Tensor(np.float32(value))
        out[key] = value
    return out


def import_step(value, where):
    """A saved step count (a number, or a one-element tensor or array as torch saves it) as an int."""
    try:
        step = float(host_array(value).reshape(()))
    except (TypeError, ValueError):
        raise ValueError(f"{where}: 'step' must be a number or a one-element tensor, got {value!r:.60}") from None
    if not step.is_integer() or step < 0:
        raise ValueError(f"{where}: 'step' is {step}, not a whole number of steps >= 0")
    return int(step)


_HOST_OPTIONS = ("params", "lr")  # group entries no built-in update bakes into its graph (lr is a host value)


def _frozen(value):
    """An option as a key that is equal only where the graphs built from it are: its type, and a float's sign (the
    constants -0.0 and 0.0 differ); TypeError for what does not compare by value (a Tensor's == builds a graph)."""
    if isinstance(value, tuple):
        return tuple(_frozen(v) for v in value)
    if type(value) is float:
        return float, value, math.copysign(1.0, value)
    if value is None or type(value) in (bool, int, str):
        return type(value), value
    raise TypeError(f"option {value!r:.40} is not a plain value")


def _check_lr(lr):
    """torch's check (so a NaN learning rate is refused too); a tensor lr is taken, as torch does."""
    if isinstance(lr, bool) or not isinstance(lr, (numbers.Real, Tensor)):
        raise TypeError(f"Invalid learning rate: {lr!r}: lr must be a number (or a tensor)")
    if isinstance(lr, numbers.Real) and not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")


def _check_adam(lr, betas, eps, weight_decay):
    """torch.optim.Adam's and AdamW's checks, with their messages."""
    _check_lr(lr)
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
    if not 0.0 <= betas[0] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
    if not 0.0 <= betas[1] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")


class SGD(Optimizer):
    _STATE_KEYS = ("momentum_buffer",)

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov))

    def _check(self, g):
        _check_lr(g["lr"])
        if g["momentum"] < 0.0:
            raise ValueError(f"Invalid momentum value: {g['momentum']}")
        if g["weight_decay"] < 0.0:
            raise ValueError(f"Invalid weight_decay value: {g['weight_decay']}")
        if g["nesterov"] and (g["momentum"] <= 0 or g["dampening"] != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")

    def _host_step(self, group, state):
        return {"lr": group["lr"]}

    def _update(self, p, g, state, group, hyper):
        """g ← g + λp;  b ← μb + (1-τ)g (b = g at first);  p ← p - lr·(g + μb if nesterov else b)"""
        if group["weight_decay"]:
            g = g + group["weight_decay"] * p
        out = []
        if group["momentum"]:
            if "momentum_buffer" not in state:
                b = g
                state["momentum_buffer"] = zeros_like(p)
            else:
                b = state["momentum_buffer"] * group["momentum"] + g * (1.0 - group["dampening"])
            out.append(("momentum_buffer", b))
            g = g + group["momentum"] * b if group["nesterov"] else b
        return [(None, p - hyper["lr"] * g)] + out


class AdamW(Optimizer):
    _STATE_KEYS = ("step", "exp_avg", "exp_avg_sq")
    _UNSUPPORTED_OPTIONS = {"maximize": False, "amsgrad": False, "decoupled_weight_decay": True}

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def _check(self, g):
        _check_adam(g["lr"], g["betas"], g["eps"], g["weight_decay"])

    def _host_step(self, group, state):
        state["step"] = t = state.get("step", 0) + 1
        (b1, b2), lr, wd = group["betas"], group["lr"], group["weight_decay"]
        values = {"step_size": lr / (1.0 - b1 ** t), "bias2": 1.0 / math.sqrt(1.0 - b2 ** t)}
        if wd:
            values["decay"] = 1.0 - lr * wd
        return values

    def _update(self, p, g, state, group, hyper):
        """Decoupled weight decay (Loshchilov & Hutter), in torch's arithmetic:
        p ← p(1 - lr·λ);  m ← β₁m + (1-β₁)g;  v ← β₂v + (1-β₂)g²;
        p ← p - (lr / (1-β₁ᵗ)) · m / (√v / √(1-β₂ᵗ) + ε)"""
        (b1, b2), eps = group["betas"], group["eps"]
        if "exp_avg" not in state:
            state.update(exp_avg=zeros_like(p), exp_avg_sq=zeros_like(p))
        m = state["exp_avg"] * b1 + g * (1.0 - b1)
        v = state["exp_avg_sq"] * b2 + g * g * (1.0 - b2)
        if "decay" in hyper:
            p = p * hyper["decay"]
        denom = v.sqrt() * hyper["bias2"] + eps
        return [(None, p - hyper["step_size"] * m / denom), ("exp_avg", m), ("exp_avg_sq", v)]


class Adam(AdamW):
    """Adam is AdamW without decoupled decay (and, as torch, L2 decay added to the gradient)."""
    _UNSUPPORTED_OPTIONS = {**AdamW._UNSUPPORTED_OPTIONS, "decoupled_weight_decay": False}

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        super().__init__(params, lr, betas, eps, weight_decay)

    def _host_step(self, group, state):
        return super()._host_step({**group, "weight_decay": 0.0}, state)

    def _update(self, p, g, state, group, hyper):
        if group["weight_decay"]:
            g = g + group["weight_decay"] * p
        return super()._update(p, g, state, group, hyper)


class LambdaLR:
    """lr = base_lr · fn(step), as torch.optim.lr_scheduler.LambdaLR; call .step() after optimizer.step()."""
    def __init__(self, optimizer, lr_lambda):
        self.optimizer, self.lr_lambda, self.last_epoch = optimizer, lr_lambda, 0
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self._apply()

    def _apply(self):
        for g, base in zip(self.optimizer.param_groups, self.base_lrs):
            g["lr"] = base * self.lr_lambda(self.last_epoch)

    def step(self):
        self.last_epoch += 1
        self._apply()

    def get_last_lr(self):
        return [g["lr"] for g in self.optimizer.param_groups]


# the names of examples/gpt.py's flags (--warmup-iters, --max-iters, --min-lr-ratio) and nanoGPT's; the old ones work
_SCHEDULE_NAMES = dict(warmup_steps="warmup_iters", max_steps="max_iters", min_ratio="min_lr_ratio")


@keyword_aliases(**_SCHEDULE_NAMES)
def warmup_cosine(warmup_iters, max_iters, min_lr_ratio=0.1):
    """The factor for LambdaLR: linear warmup to 1, then a cosine down to min_lr_ratio at max_iters (nanoGPT)."""
    def factor(step):
        if step < warmup_iters:
            return (step + 1) / (warmup_iters + 1)
        if step >= max_iters:
            return min_lr_ratio
        progress = (step - warmup_iters) / max(1, max_iters - warmup_iters)
        return min_lr_ratio + 0.5 * (1.0 + math.cos(math.pi * progress)) * (1.0 - min_lr_ratio)
    return factor


class WarmupCosineLR(LambdaLR):
    """LambdaLR of warmup_cosine: lr = base_lr · warmup_cosine(warmup_iters, max_iters, min_lr_ratio)(step). The
    keywords warmup_steps, max_steps and min_ratio are the old names of these arguments."""
    @keyword_aliases(**_SCHEDULE_NAMES)
    def __init__(self, optimizer, warmup_iters, max_iters, min_lr_ratio=0.1):
        super().__init__(optimizer, warmup_cosine(warmup_iters, max_iters, min_lr_ratio))


_PURE_UPDATES = (SGD._update, AdamW._update, Adam._update)  # their graphs depend on _chunk_key's parts alone
