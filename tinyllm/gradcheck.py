"""Gradient checking by central differences in float64, as torch.autograd.gradcheck, without torch.

For y = f(x₁, …, xₙ) and a random upstream gradient v of y's shape, backward() gives the vector-Jacobian
product ∂⟨v, y⟩/∂xᵢ. The same number, element by element, is the central difference
    (⟨v, f(…, xᵢ + ε·eⱼ, …)⟩ - ⟨v, f(…, xᵢ - ε·eⱼ, …)⟩) / 2ε,
whose error is O(ε²) from truncation plus O(u/ε) from rounding (u ≈ 1e-16 in float64), so ε = 1e-6 leaves about
1e-10 of each. A random v (not all ones) makes a wrong sign or a swapped element show up instead of cancelling.
"""
import numpy as np

from . import dtype as dt
from .graph import OPS, build
from .ops import PRIMITIVES, rule_of
from .ops.collective import Collective
from .tensor import Tensor, no_grad


class GradcheckError(AssertionError):
    """The analytic gradient disagrees with the numeric one."""


def gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-3, seed=0):
    """Check the gradient of `fn(*inputs)` (a float64 Tensor) for every input that requires grad (float64
    Tensors); other inputs (index tensors, masks, numbers) are passed as they are. The caller's tensors are
    not touched: fresh leaves carry their values. Returns True, or raises GradcheckError naming the input and
    its worst element."""
    inputs = list(inputs)
    checked = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]
    if not checked:
        raise ValueError("gradcheck: no input requires grad, so there is nothing to check")
    for i in checked:
        if inputs[i].dtype is not dt.float64:
            raise ValueError(f"gradcheck: input {i} is {inputs[i].dtype.name}; central differences need float64 "
                             "inputs (use .double())")
    values = {i: inputs[i].detach().numpy().astype(np.float64) for i in checked}

    def call(arrays, requires_grad):
        args = list(inputs)
        for i in checked:
            args[i] = Tensor(arrays[i], dtype=dt.float64, device=inputs[i].device, requires_grad=requires_grad)
        return args, fn(*args)

    leaves, out = call(values, True)
    if not isinstance(out, Tensor) or out.dtype is not dt.float64:
        raise ValueError(f"gradcheck: fn must return a float64 Tensor, got "
                         f"{out.dtype.name if isinstance(out, Tensor) else type(out).__name__}")
    v = np.random.default_rng(seed).standard_normal(out.shape)
    if out.requires_grad:
        out.backward(gradient=Tensor(v, dtype=dt.float64, device=out.device))

    def project(arrays):
        with no_grad():
            return float(np.sum(call(arrays, False)[1].numpy() * v))

    for i in checked:
        grad = leaves[i].grad
        analytic = np.zeros_like(values[i]) if grad is None else grad.numpy()
        if analytic.shape != values[i].shape:
            raise GradcheckError(f"gradcheck: gradient of input {i} has shape {analytic.shape}, "
                                 f"the input {values[i].shape}")
        numeric = np.zeros_like(values[i])
        for j in np.ndindex(values[i].shape):
            x = values[i].copy()
            x[j] += eps
            plus = project({**values, i: x})
            x[j] -= 2 * eps
            minus = project({**values, i: x})
            numeric[j] = (plus - minus) / (2 * eps)
        excess = np.abs(analytic - numeric) - (atol + rtol * np.abs(numeric))
        if not excess.size or (excess <= 0).all():
            continue
        j = np.unravel_index(np.nanargmax(np.where(np.isnan(excess), np.inf, excess)), excess.shape)
        raise GradcheckError(
            f"gradcheck: wrong gradient for input {i} (shape {values[i].shape}) at element {tuple(map(int, j))}: "
            f"analytic {analytic[j]:.10g}, numeric {numeric[j]:.10g} (|difference| "
            f"{abs(analytic[j] - numeric[j]):.3g} > atol + rtol·|numeric| = {atol + rtol * abs(numeric[j]):.3g}); "
            f"{int((excess > 0).sum())} of {excess.size} elements are off")
    return True


class _Used(Exception):
    pass


def _use(*args):
    raise _Used


class _Probe:
    """Stands for dy and y in a gradient rule: any use of either (an attribute, an operator) raises _Used."""
    __slots__ = ()
    __getattr__ = __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _use
    __neg__ = __lt__ = __gt__ = __eq__ = __getitem__ = __iter__ = __len__ = __bool__ = _use
    __hash__ = object.__hash__


def passes_gradient(op):
    """Whether primitive `op` has a backward rule that can pass a gradient on. A rule that never reads the
    upstream gradient dy (nor the node y) passes none: sources (LOAD, CONST), comparisons, DETACH."""
    try:
        rule = rule_of(op)
    except NotImplementedError:
        return False
    try:
        grads = rule(_Probe(), _Probe())
    except _Used:
        return True
    return any(g is not None for g in grads)


def differentiable_primitives():
    """The primitives in `tinyllm.ops.PRIMITIVES` whose gradient rule gradcheck must verify (collectives' rules
    need several ranks: tests/distributed checks them)."""
    return [op for op in PRIMITIVES if not issubclass(OPS[op], Collective) and passes_gradient(op)]


def primitive(op, *inputs, arg=None):
    """Apply one primitive to Tensors directly (no broadcasting or promotion by the front end), so a check
    exercises exactly that primitive's rule."""
    first, *rest = inputs
    return first._make(build(op, *[x.node for x in inputs], arg=arg), *rest)


def check_primitives(cases):
    """Gradcheck every differentiable primitive. `cases` maps op name -> list of (fn, inputs) or
    (fn, inputs, gradcheck keywords such as eps/atol/rtol); an op with a gradient rule but no case is an error,
    so a new primitive cannot skip the check. Returns the ops checked."""
    ops = differentiable_primitives()
    missing = [op for op in ops if not cases.get(op)]
    if missing:
        raise GradcheckError(f"check_primitives: no gradcheck case for {', '.join(missing)}: add one")
    for op in ops:
        for k, (fn, inputs, *options) in enumerate(cases[op]):
            try:
                gradcheck(fn, inputs, **(options[0] if options else {}))
            except GradcheckError as e:
                raise GradcheckError(f"{op} (case {k}): {e}") from None
    return ops
