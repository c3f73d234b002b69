"""tinyllm: a small autograd library with a lazy graph, rewrite passes and several runtimes.

    import tinyllm as tl
    x = tl.randn(4, 3, requires_grad=True)
    (x @ x.T).relu().sum().backward()
    x.grad
"""
from . import ops  # noqa: F401  (registers the primitives)
from .dtype import float16, bfloat16, float32, float64, uint8, int8, int64, bool_, DType, finfo, iinfo  # noqa: F401
from .dtype import complex64, complex128  # noqa: F401
from .tensor import Tensor, no_grad, inference_mode, is_grad_enabled, arange  # noqa: F401
from .factory import (tensor, zeros, ones, full, zeros_like, ones_like, full_like, randn, rand, randint,  # noqa: F401
                      randn_like, rand_like, manual_seed, multinomial, cat, stack, where, eye, linspace,
                      logspace, empty, empty_like, Generator, default_generator, from_numpy)
from .realizer import realize as _realize
from .runtime import max_memory_allocated, memory_allocated, reset_peak_memory_stats, empty_cache  # noqa: F401
from . import nn, optim  # noqa: F401,E402
from .utils.checkpoint import checkpoint  # noqa: F401,E402
from .utils import data as _data  # noqa: E402  (tinyllm.utils.data.DataLoader after `import tinyllm`, as torch's)
del _data
from .einsum import einsum  # noqa: F401,E402
from . import linalg  # noqa: F401,E402
from .linalg.products import tensordot, cdist, block_diag, cartesian_prod  # noqa: F401,E402
from .complex import complex, polar, view_as_real, view_as_complex, real, imag  # noqa: F401,E402
from .replay.jit import jit  # noqa: F401,E402
from . import sampling  # noqa: F401,E402
from .autocast_mode import autocast, is_autocast_enabled, get_autocast_dtype  # noqa: F401,E402
from . import amp  # noqa: F401,E402
from .quantization import quantize_  # noqa: F401,E402
from .utils.serialization import save, load  # noqa: F401,E402

half = float16  # torch.half
bf16 = bfloat16
float = float32  # torch.float
long = int64
double = float64
bool = bool_
cfloat = complex64
cdouble = complex128


def realize(*tensors):
    """Compute several tensors in one pass over their shared graph."""
    _realize(*tensors)
    return tensors[0] if len(tensors) == 1 else tensors


__all__ = ["Tensor", "tensor", "no_grad", "realize", "jit", "nn", "optim", "save", "load"]

from .functions import function_forms as _function_forms  # noqa: E402
globals().update(_function_forms(taken=set(globals())))  # tinyllm.exp(x), tinyllm.add(x, y), ... (torch's forms)
