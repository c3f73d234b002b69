import math

from ..realizer import realize
from ..tensor import Tensor


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """Scale all gradients together so their global norm is at most max_norm; returns the norm before, as torch.
    ‖g‖ = (Σ_p Σ |g_p|^q)^(1/q) (q = norm_type; inf: max |g|);  g_p ← g_p · min(1, max_norm / (‖g‖ + 1e-6)).
    `parameters` is one tensor or an iterable of them, as in torch; tensors without a gradient are skipped.
    error_if_nonfinite=True raises a RuntimeError when the norm is nan or inf: that reads the norm on the host,
    so only then does the call wait for it. foreach is accepted for torch's signature (no effect here)."""
    parameters = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    params = [p for p in parameters if p.grad is not None]
    norm_type = float(norm_type)
    if not params:
        from ..factory import zeros
        return zeros(())
    grads = [p.grad for p in params]
    if norm_type == 2.0:
        total = sum(((g * g).sum() for g in grads[1:]), (grads[0] * grads[0]).sum()).sqrt()
    elif norm_type == math.inf:
        total = grads[0].abs().amax()
        for g in grads[1:]:
            total = total.maximum(g.abs().amax())
    else:
        total = sum((g.abs().pow(norm_type).sum() for g in grads[1:]), grads[0].abs().pow(norm_type).sum())
        total = total.pow(1.0 / norm_type)
    realize(total, *grads)  # the gradients are kept, not computed again for what reads them
    if error_if_nonfinite and not math.isfinite(total.item()):
        raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is non-finite, so it "
                           "cannot be clipped. To disable this error and scale the gradients by the non-finite norm "
                           "anyway, set `error_if_nonfinite=False`")
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for p in params:  # left lazy: the scaling fuses into what reads the gradient next (the optimizer's update)
        p.grad = p.grad * coef
    return total
