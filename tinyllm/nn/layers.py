"""Layers with torch's names, shapes and default initialisation."""
import math

import numpy as np

from .. import factory
from . import functional as F
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


class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim):
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = Parameter(factory.generator().standard_normal((num_embeddings, embedding_dim)).astype(np.float32))

    def forward(self, idx):
        return F.embedding(idx, self.weight)


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True):
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        self.weight = Parameter(np.ones(self.normalized_shape, np.float32)) if elementwise_affine else None
        self.bias = Parameter(np.zeros(self.normalized_shape, np.float32)) if elementwise_affine and bias else None

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class Dropout(Module):
    def __init__(self, p=0.5):
        self.p = p

    def forward(self, x):
        return F.dropout(x, self.p, self.training)


class GELU(Module):
    def __init__(self, approximate="none"):
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x, self.approximate)


class ReLU(Module):
    def forward(self, x):
        return x.relu()
