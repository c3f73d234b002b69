"""Neural-network building blocks with torch.nn's names."""
from . import functional  # noqa: F401
from .module import Module, ModuleList, ModuleDict, Sequential, Parameter  # noqa: F401
from .layers import Linear, Embedding, LayerNorm, RMSNorm, SwiGLU, Dropout, GELU, ReLU  # noqa: F401
from .rotary import RotaryEmbedding  # noqa: F401
from .layers import Conv1d, Conv2d, Conv3d, ConvTranspose2d, MaxPool2d, AvgPool2d, Flatten  # noqa: F401
from .layers import (Softmax, LogSoftmax, Softmin, Tanh, Sigmoid, SiLU, Mish, Softsign, ELU, CELU, SELU,  # noqa: F401
                     Softplus, LogSigmoid, Hardtanh, ReLU6, Hardsigmoid, Hardswish, LeakyReLU, MSELoss, L1Loss, BCELoss,
                     BCEWithLogitsLoss, NLLLoss, CrossEntropyLoss)
from .utils import clip_grad_norm_  # noqa: F401
from . import lora  # noqa: F401
from . import parallel  # noqa: F401
