"""Dynamic loss scaling for low-precision training, with torch.amp.GradScaler's names, defaults and algorithm.

A float16 gradient smaller than 2⁻²⁴ is 0. Multiplying the loss by a scale S multiplies every gradient by S (the
chain rule is linear in the seed), lifting small gradients out of the underflow range; the optimizer must then see
g / S. Too large an S overflows to inf, so S adapts:

    a step whose gradients hold an inf or NaN is skipped, and S ← S · backoff_factor, tracker ← 0;
    otherwise tracker ← tracker + 1, and once it reaches growth_interval: S ← S · growth_factor (unless that
    overflows float32), tracker ← 0.

S lives in float32, as torch's: each product is rounded to float32, so the sequences of scales agree exactly.
The scale enters graphs as a 0-d buffer, not as a constant, so a training step's graph and its compiled kernels
stay the same when the scale changes."""
import math
import numbers
from collections import abc, defaultdict
from enum import Enum

import numpy as np

from . import dtype as dt
from .realizer import realize
from .tensor import Tensor, no_grad
from .utils.checks import whole_number

__all__ = ["GradScaler", "OptState"]


class OptState(Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _refresh_per_optimizer_state():
    return {"stage": OptState.READY, "found_inf_per_device": {}}


def _check_settings(init_scale, growth_factor, backoff_factor, growth_interval):
    """torch's two checks (its exception type and messages), and of what torch takes silently though it breaks
    training: a scale of 0 (every gradient 0, unscaled to NaN), a backoff to 0, a growth_interval never reached."""
    if growth_factor <= 1.0:
        raise AssertionError(f"The growth factor must be > 1.0. (GradScaler got growth_factor={growth_factor})")
    if backoff_factor >= 1.0:
        raise AssertionError(f"The backoff factor must be < 1.0. (GradScaler got backoff_factor={backoff_factor})")
    if not backoff_factor > 0.0:
        raise ValueError(f"GradScaler: backoff_factor must be in (0, 1), got {backoff_factor}: the scale would drop "
                         "to 0 or below at the first inf")
    if isinstance(init_scale, bool) or not isinstance(init_scale, numbers.Real) or not 0.0 < init_scale < math.inf:
        raise ValueError(f"GradScaler: init_scale must be a finite number > 0, got {init_scale!r}: 2.0 ** 16 is "
                         "torch's default")
    whole_number("GradScaler", "growth_interval", growth_interval, 1)


def _f32(x):
    return float(np.float32(x))


class GradScaler:
    """Scales the loss so low-precision gradients neither underflow nor, for long, overflow.

        scaler = tinyllm.amp.GradScaler()
        for x, y in data:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)                               # optional: clipping sees true gradients
            tinyllm.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)                                   # skipped if a gradient is inf or NaN
            scaler.update()

    device: accepted for torch's signature; the scale lives on the device of the first tensor scale() gets
    (torch's scale tensor does too). enabled=False makes every method a pass-through, as torch."""

    def __init__(self, device=None, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True):
        self._device, self._enabled = device, enabled
        if self._enabled:
            _check_settings(init_scale, growth_factor, backoff_factor, growth_interval)
            self._init_scale = init_scale
            self._scale = None  # a 0-d float32 Tensor, made by the first scale() on that tensor's device
            self._scale_value = None  # its value on the host: update() computes the next one here
            self._growth_factor, self._backoff_factor = growth_factor, backoff_factor
            self._growth_interval = growth_interval
            self._init_growth_tracker = 0
            self._growth_tracker = None  # the count of consecutive unskipped steps, from the first scale()
            self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)

    def _check_scale_growth_tracker(self, funcname):
        fix = "This may indicate your script did not use scaler.scale(loss or outputs) earlier in the iteration."
        if self._scale is None:
            raise AssertionError(f"Attempted {funcname} but _scale is None.  " + fix)
        if self._growth_tracker is None:
            raise AssertionError(f"Attempted {funcname} but _growth_tracker is None.  " + fix)

    def _lazy_init_scale_growth_tracker(self, device):
        self._scale_value = _f32(self._init_scale)
        self._scale = Tensor(np.float32(self._scale_value), device=device)
        self._growth_tracker = self._init_growth_tracker

    def _set_scale(self, value):
        """Give the scale a new value in place (copy_), so a tinyllm.jit Tape that read the old one is re-recorded
        rather than replayed with a stale scale."""
        value = _f32(value)
        if value != self._scale_value or np.isnan(value):
            self._scale.copy_(Tensor(np.float32(value), device=self._scale.device))
            self._scale_value = value

    # ---- the iteration ----
    def scale(self, outputs):
        """outputs · scale: a tensor, or the tensors of (nested) lists, tuples or other iterables, as torch."""
        if not self._enabled:
            return outputs

        def apply_scale(val):
            if isinstance(val, Tensor):
                if self._scale is None:
                    self._lazy_init_scale_growth_tracker(val.device)
                s = self._scale if self._scale.device == val.device else self._scale.to(val.device)
                return val * s
            if isinstance(val, abc.Iterable) and not isinstance(val, (str, bytes)):
                scaled = map(apply_scale, val)
                return type(val)(scaled) if isinstance(val, (list, tuple)) else scaled
            raise ValueError(f"outputs must be a Tensor or an iterable of Tensors (GradScaler.scale got "
                             f"{type(val).__name__})")

        return apply_scale(outputs)

    @no_grad()
    def _unscale_grads_(self, optimizer, inv_scale, allow_fp16):
        """g ← g · inv_scale for every gradient of `optimizer`, and found_inf = 1.0 where any gradient (before
        unscaling, as torch checks) holds an inf or NaN, else 0.0, in one realize per device with the unscaled
        gradients: no host loop over gradients. x is finite iff -inf < x < inf (both comparisons are false for
        NaN): fewer nodes than Tensor.isfinite, which builds |x| from sign(x). (Not x·0 = NaN: WGSL compilers may
        assume finite math and fold x·0 to 0; they keep comparisons with inf.) Returns {device: found_inf (a
        realized 0-d float32 tensor)}."""
        by_device = {}
        for group in optimizer.param_groups:
            for param in group["params"]:
                if not isinstance(param, Tensor):
                    raise TypeError(f"GradScaler: expected the optimizer's params to be tinyllm Tensors, got "
                                    f"{type(param).__name__}")
                if param.grad is None:
                    continue
                if not allow_fp16 and param.grad.dtype is dt.float16:
                    raise ValueError(f"Attempting to unscale FP16 gradients. (GradScaler.unscale_: a parameter of "
                                     f"shape {param.shape} has a float16 gradient: keep the parameters float32 and "
                                     "let tinyllm.autocast cast inside the graph)")
                by_device.setdefault(param.grad.device, []).append(param)
        found_inf_per_device = {}
        for device, params in by_device.items():
            grads = [p.grad for p in params]
            inv = Tensor(np.float32(inv_scale), device=device)
            found_inf = None
            for g in grads:
                bad = ((g > -math.inf) & (g < math.inf)).logical_not().any()
                found_inf = bad if found_inf is None else found_inf | bad
            found_inf = found_inf.float()
            unscaled = [(g * inv).to(g.dtype) for g in grads]
            realize(found_inf, *unscaled)
            for p, u in zip(params, unscaled):
                p.grad = u
            found_inf_per_device[device] = found_inf
        return found_inf_per_device

    def unscale_(self, optimizer):
        """Divide the optimizer's gradients by the scale, so what reads them next (clip_grad_norm_) sees true
        values, and record whether any is inf or NaN. Once per optimizer per step; step() calls it if not done."""
        if not self._enabled:
            return
        self._check_scale_growth_tracker("unscale_")
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        if optimizer_state["stage"] is OptState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        elif optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = np.float32(1.0 / np.float64(self._scale_value))  # (1/S in float64, rounded once: torch's)
        optimizer_state["found_inf_per_device"] = self._unscale_grads_(optimizer, inv_scale, False)
        optimizer_state["stage"] = OptState.UNSCALED

    @staticmethod
    def _found_inf(optimizer_state):
        """The sum of an optimizer's found_inf values, read on the host once per step."""
        if "found_inf" not in optimizer_state:
            optimizer_state["found_inf"] = sum(f.item() for f in optimizer_state["found_inf_per_device"].values())
        return optimizer_state["found_inf"]

    def step(self, optimizer, *args, **kwargs):
        """unscale_(optimizer) unless done, then optimizer.step(*args, **kwargs) unless a gradient is inf or NaN.
        Returns what optimizer.step returned, or None where it was skipped."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_scale_growth_tracker("step")
        optimizer_state = self._per_optimizer_states[id(optimizer)]
        if optimizer_state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if optimizer_state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        if len(optimizer_state["found_inf_per_device"]) == 0:
            raise AssertionError("No inf checks were recorded for this optimizer. (GradScaler.step: none of its "
                                 "parameters has a gradient: call backward() on the scaled loss first)")
        retval = None
        if not self._found_inf(optimizer_state):
            retval = optimizer.step(*args, **kwargs)
        optimizer_state["stage"] = OptState.STEPPED
        return retval

    def update(self, new_scale=None):
        """The next scale: new_scale if given (a number or a one-element tensor), else backoff on an inf/NaN seen
        by any optimizer since the last update, growth after growth_interval clean steps (module docstring)."""
        if not self._enabled:
            return
        self._check_scale_growth_tracker("update")
        if new_scale is not None:
            if isinstance(new_scale, Tensor):
                if new_scale.numel() != 1 or new_scale.requires_grad:
                    raise AssertionError("new_scale should be a float or a 1-element tinyllm.Tensor with "
                                         f"requires_grad=False (got shape {new_scale.shape}, requires_grad="
                                         f"{new_scale.requires_grad})")
                new_scale = new_scale.item()
            elif not isinstance(new_scale, numbers.Real):
                raise TypeError(f"update: new_scale should be a float or a 1-element tensor, got "
                                f"{type(new_scale).__name__}")
            self._set_scale(new_scale)
        else:
            states = [s for s in self._per_optimizer_states.values() if s["found_inf_per_device"]]
            if not states:
                raise AssertionError("No inf checks were recorded prior to update.")
            found_inf = sum(self._found_inf(s) for s in states)
            self._update_scale(found_inf)
        self._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)

    def _update_scale(self, found_inf):
        """torch's _amp_update_scale_: the factors are doubles, each product is rounded to the float32 scale."""
        scale = np.float64(self._scale_value)
        if found_inf:
            self._set_scale(scale * self._backoff_factor)
            self._growth_tracker = 0
            return
        successful = self._growth_tracker + 1
        if successful == self._growth_interval:
            with np.errstate(over="ignore"):
                grown = np.float32(scale * self._growth_factor)
            if np.isfinite(grown):  # never grow past float32's range to inf
                self._set_scale(grown)
            self._growth_tracker = 0
        else:
            self._growth_tracker = successful

    # ---- settings and state ----
    def get_scale(self):
        """The current scale as a Python float (the initial one before the first scale()); 1.0 when disabled."""
        if self._enabled:
            return self._init_scale if self._scale is None else self._scale_value
        return 1.0

    def get_growth_factor(self): return self._growth_factor
    def set_growth_factor(self, new_factor): self._growth_factor = new_factor
    def get_backoff_factor(self): return self._backoff_factor
    def set_backoff_factor(self, new_factor): self._backoff_factor = new_factor
    def get_growth_interval(self): return self._growth_interval
    def set_growth_interval(self, new_interval): self._growth_interval = new_interval
    def is_enabled(self): return self._enabled

    def _get_growth_tracker(self):
        if self._enabled:
            return self._init_growth_tracker if self._growth_tracker is None else self._growth_tracker
        return 0

    def state_dict(self):
        """torch's five entries (scale, growth_factor, backoff_factor, growth_interval, _growth_tracker) as
        Python numbers, so a checkpoint loads into either library; {} when disabled. Call it after update()."""
        if self._enabled:
            return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                    "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                    "_growth_tracker": self._get_growth_tracker()}
        return {}

    def load_state_dict(self, state_dict):
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        self._init_scale = float(state_dict["scale"])
        if self._scale is not None:
            self._set_scale(self._init_scale)
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._init_growth_tracker = int(state_dict["_growth_tracker"])
        if self._growth_tracker is not None:
            self._growth_tracker = self._init_growth_tracker

    def __getstate__(self):
        """Pickled as plain numbers: the scale tensor is made again by the next scale(), as torch does."""
        state = self.__dict__.copy()
        if self._enabled:
            if len(self._per_optimizer_states) != 0:
                raise AssertionError("A GradScaler instance may only be pickled at the beginning "
                                     "of an iteration, or at the end after scaler.update().")
            state.update(_init_scale=self.get_scale(), _init_growth_tracker=self._get_growth_tracker(),
                         _scale=None, _scale_value=None, _growth_tracker=None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
