from ..realizer import realize
from ..tensor import Tensor


def clip_grad_norm_(parameters, max_norm, eps=1e-6):
    """Scale all gradients together so their global L2 norm is at most max_norm; returns the norm before.
    ‖g‖ = √(Σ_p Σ g_p²);  g_p ← g_p · min(1, max_norm / (‖g‖ + eps)).
    `parameters` is one tensor or an iterable of them, as in torch; tensors without a gradient are skipped."""
    parameters = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    params = [p for p in parameters if p.grad is not None]
    if not params:
        from ..factory import zeros
        return zeros(())
    total = sum(((p.grad * p.grad).sum() for p in params[1:]), (params[0].grad * params[0].grad).sum()).sqrt()
    realize(total, *[p.grad for p in params])  # the gradients are kept, not computed again for what reads them
    coef = (max_norm / (total + eps)).clamp(max=1.0)
    for p in params:  # left lazy: the scaling fuses into what reads the gradient next (the optimizer's update)
        p.grad = p.grad * coef
    return total
