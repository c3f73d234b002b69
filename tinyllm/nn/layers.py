"""Layers with torch's names, shapes and default initialisation."""
import math

import numpy as np

from .. import factory
from . import functional as F, hooks
from .conv import conv
from .module import Module, Parameter


def _uniform(shape, bound):
    return factory.generator().uniform(-bound, bound, size=shape).astype(np.float32)


class Linear(Module):
    def __init__(self, in_features, out_features, bias=True):
        bound = 1.0 / math.sqrt(in_features)  # torch's kaiming-uniform(a=√5) default reduces to this bound
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(_uniform((out_features, in_features), bound))
        self.bias = Parameter(_uniform((out_features,), bound)) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return f"in_features={self.weight.shape[1]}, out_features={self.weight.shape[0]}, bias={self.bias is not None}"


class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim):
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = Parameter(factory.generator().standard_normal((num_embeddings, embedding_dim)).astype(np.float32))

    def forward(self, idx):
        return F.embedding(idx, self.weight)

    def extra_repr(self):
        return f"{self.weight.shape[0]}, {self.weight.shape[1]}"


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        self.weight = Parameter(np.ones(self.normalized_shape, np.float32)) if elementwise_affine else None
        self.bias = Parameter(np.zeros(self.normalized_shape, np.float32)) if elementwise_affine and bias else None

    hook_points = ("hook_scale", "hook_normalized")  # TransformerLens's (tinyllm/nn/hooks.py)

    def forward(self, x):
        if hooks.wants(self, *self.hook_points):
            return hooks.layer_norm(self, x)
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.weight is not None}, "
                f"bias={self.bias is not None}")


class RMSNorm(Module):
    """F.rms_norm with a learnable per-feature weight (ones at the start), torch's names and eps=None default."""
    def __init__(self, normalized_shape, eps=None, elementwise_affine=True):
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        self.weight = Parameter(np.ones(self.normalized_shape, np.float32)) if elementwise_affine else None

    hook_points = ("hook_scale", "hook_normalized")

    def forward(self, x):
        if hooks.wants(self, *self.hook_points):
            return hooks.rms_norm(self, x)
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.weight is not None}"


class SwiGLU(Module):
    """The gated MLP of Llama: down_proj(silu(gate_proj(x)) * up_proj(x)). SwiGLU (Shazeer 2020, "GLU Variants
    Improve Transformer") gates one projection by the Swish (SiLU) of another, in place of GELU's single one.
    Child names are Hugging Face's LlamaMLP's, so its weights load by name."""
    def __init__(self, in_features, hidden_features, bias=False):
        self.in_features, self.hidden_features = in_features, hidden_features
        self.gate_proj = Linear(in_features, hidden_features, bias=bias)
        self.up_proj = Linear(in_features, hidden_features, bias=bias)
        self.down_proj = Linear(hidden_features, in_features, bias=bias)

    hook_points = ("hook_pre", "hook_pre_linear", "hook_post")  # TransformerLens's gated MLP's

    def forward(self, x):
        gate = hooks.point(self, "hook_pre", self.gate_proj(x))
        up = hooks.point(self, "hook_pre_linear", self.up_proj(x))
        return self.down_proj(hooks.point(self, "hook_post", F.silu(gate) * up))


class Dropout(Module):
    def __init__(self, p=0.5):
        F.check_dropout(p, "Dropout")
        self.p = p

    def forward(self, x):
        return F.dropout(x, self.p, self.training)

    def extra_repr(self):
        return f"p={self.p}, inplace=False"


class GELU(Module):
    def __init__(self, approximate="none"):
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)

    def extra_repr(self):
        return f"approximate={self.approximate!r}"


class ReLU(Module):
    def forward(self, x):
        return x.relu()


class _ConvNd(Module):
    """Conv1d, Conv2d, Conv3d (d, the spatial axes, is the subclass's) and ConvTranspose2d: torch's parameters and
    their kaiming-uniform(a=√5) default, which reduces to ±1/√fan_in as Linear's."""
    d, transposed = 2, False

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 output_padding=0):
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"in_channels {in_channels} and out_channels {out_channels} must be divisible by "
                             f"groups {groups}")
        self.kernel_size = tuple(kernel_size) if isinstance(kernel_size, (tuple, list)) else (kernel_size,) * self.d
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.stride, self.padding, self.dilation, self.output_padding = stride, padding, dilation, output_padding
        shape = (in_channels, out_channels // groups) if self.transposed else (out_channels, in_channels // groups)
        bound = 1.0 / math.sqrt(shape[1] * math.prod(self.kernel_size))
        self.weight = Parameter(_uniform(shape + self.kernel_size, bound))
        self.bias = Parameter(_uniform((out_channels,), bound)) if bias else None

    def forward(self, x):
        return conv(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups,
                      f"conv{self.d}d")


class Conv1d(_ConvNd):
    d = 1


class Conv2d(_ConvNd):
    d = 2


class Conv3d(_ConvNd):
    d = 3


class ConvTranspose2d(_ConvNd):
    transposed = True

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, output_padding=0, groups=1,
                 bias=True, dilation=1):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         output_padding)

    def forward(self, x):
        return F.conv_transpose2d(x, self.weight, self.bias, self.stride, self.padding, self.output_padding,
                                  self.groups, self.dilation)


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False):
        self.kernel_size, self.stride, self.padding, self.dilation = kernel_size, stride, padding, dilation
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, x):
        return F.max_pool2d(x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode,
                            self.return_indices)


class AvgPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
        self.kernel_size, self.stride, self.padding, self.ceil_mode = kernel_size, stride, padding, ceil_mode
        self.count_include_pad, self.divisor_override = count_include_pad, divisor_override

    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, self.ceil_mode, self.count_include_pad,
                            self.divisor_override)


class Flatten(Module):
    def __init__(self, start_dim=1, end_dim=-1):
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x):
        return x.flatten(self.start_dim, self.end_dim)


class _Functional(Module):
    """A module that applies F.<fn> with the arguments it was made with: torch's activation and loss modules."""
    fn = None

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs

    def forward(self, *inputs):
        return type(self).fn(*inputs, *self.args, **self.kwargs)


def _module(name, fn, doc):
    return type(name, (_Functional,), {"fn": staticmethod(fn), "__doc__": doc, "__module__": __name__})


Softmax = _module("Softmax", lambda x, dim=None: F.softmax(x, -1 if dim is None else dim), "softmax over `dim`")
LogSoftmax = _module("LogSoftmax", lambda x, dim=None: F.log_softmax(x, -1 if dim is None else dim), "log_softmax")
Softmin = _module("Softmin", F.softmin, "softmax of -x")
Tanh, Sigmoid = _module("Tanh", F.tanh, "tanh"), _module("Sigmoid", F.sigmoid, "sigmoid")
SiLU, Mish, Softsign = _module("SiLU", F.silu, "x·σ(x)"), _module("Mish", F.mish, "mish"), _module("Softsign", F.softsign, "softsign")
ELU, CELU, SELU = _module("ELU", F.elu, "elu"), _module("CELU", F.celu, "celu"), _module("SELU", F.selu, "selu")
Softplus, LogSigmoid = _module("Softplus", F.softplus, "softplus"), _module("LogSigmoid", F.logsigmoid, "log σ(x)")
Hardtanh, ReLU6 = _module("Hardtanh", F.hardtanh, "hardtanh"), _module("ReLU6", F.relu6, "relu6")
Hardsigmoid, Hardswish = _module("Hardsigmoid", F.hardsigmoid, "hardsigmoid"), _module("Hardswish", F.hardswish, "hardswish")
LeakyReLU = _module("LeakyReLU", F.leaky_relu, "leaky_relu")
MSELoss, L1Loss = _module("MSELoss", F.mse_loss, "mean squared error"), _module("L1Loss", F.l1_loss, "mean |x - y|")
BCELoss = _module("BCELoss", F.binary_cross_entropy, "binary cross-entropy of probabilities")
BCEWithLogitsLoss = _module("BCEWithLogitsLoss", F.binary_cross_entropy_with_logits, "binary cross-entropy of logits")
NLLLoss = _module("NLLLoss", F.nll_loss, "negative log-likelihood of log-probabilities")


class CrossEntropyLoss(_Functional):
    """F.cross_entropy with the module's ignore_index, reduction and label_smoothing (torch's keyword names)."""
    fn = staticmethod(F.cross_entropy)

    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                 label_smoothing=0.0):
        if weight is not None or size_average is not None or reduce is not None:
            raise NotImplementedError("CrossEntropyLoss: weight= (and the deprecated size_average=, reduce=) are not "
                                      "supported: weight the per-element losses of reduction='none' instead")
        super().__init__(ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing)
