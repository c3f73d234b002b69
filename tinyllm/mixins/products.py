"""Norms and products as Tensor methods, with torch's names: norm, dist, dot, inner, outer/ger, mv, mm, bmm, kron,
trace, diag_embed, cross, matrix_power. Each is a composite of existing ops (matmul, reductions, views, where), so its
gradient is theirs; `vector_norm` here is the one tinyllm.linalg.vector_norm and Tensor.norm share.

What needs tinyllm.linalg (the nuclear norm's singular values, a negative matrix power's inverse) is reached through
LINALG, which tinyllm.linalg fills in at import: a mixin sits below it and never imports it."""
import math

import numpy as np

from . import TensorLike, arange, cat
from .math_ops import _zero_grad

LINALG = {}  # name -> function, set by tinyllm/linalg/__init__.py ("matrix_norm", "matrix_power")


def _float_input(x, dtype, name):
    if dtype is not None:
        x = x.to(dtype)
    if not x.dtype.is_float:
        raise RuntimeError(f"{name}: expected a floating point tensor as input, got {x.dtype.name} (torch refuses "
                           "integers too): cast with .float() or pass dtype=")
    return x


def _masked_root(s, root):
    """root(s) where s != 0 and 0 where s = 0, with gradient 0 there (root's slope at 0 is infinite, and
    0·inf would be nan): torch's masked formula for the norm's gradient at the zero vector."""
    zero = s == 0
    return zero.where(0.0, root(zero.where(1.0, s)))


def vector_norm(x, ord=2, dim=None, keepdim=False, dtype=None, name="linalg.vector_norm"):
    """‖x‖_ord over `dim` (every element when None), as torch.linalg.vector_norm:
    ord 2: √Σx², gradient x/‖x‖, and 0 at the zero vector (torch's subgradient); ord 1: Σ|x|, gradient sign(x)
    (0 at 0); ord ±inf: max/min |x|, the gradient sign(x) shared among ties; ord 0: the count of nonzeros, gradient
    0; any other p: (Σ|x|ᵖ)^(1/p), gradient sign(x)·|x|^(p-1)·‖x‖^(1-p), 0 at zero entries and at the zero vector."""
    if isinstance(ord, str) or isinstance(ord, bool) or not isinstance(ord, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: ord must be a number (2, 1, inf, -inf, 0, or any p), got {ord!r}: for 'fro' or "
                        "'nuc' use tinyllm.linalg.matrix_norm")
    x = _float_input(x, dtype, name)
    dims = x._dims(dim, name)
    ord = float(ord)
    if ord == 2:
        return _masked_root((x * x).sum(dims, keepdim), lambda s: s.sqrt())
    a = x.abs()
    if ord == 1:
        return a.sum(dims, keepdim)
    if ord == math.inf:
        return a.amax(dims, keepdim)
    if ord == -math.inf:
        return a.amin(dims, keepdim)
    if ord == 0:
        return _zero_grad((x != 0).to(x.dtype).sum(dims, keepdim), x.sum(dims, keepdim))  # (x's gradient: 0)
    if ord < 0:  # a zero entry makes Σ|x|ᵖ inf and the norm 0, as torch
        return a.pow(ord).sum(dims, keepdim).pow(1.0 / ord)
    nonzero = a != 0
    powered = nonzero.where(nonzero.where(a, 1.0).pow(ord), 0.0)  # 0ᵖ's slope is inf for p < 1: kept off 0
    return _masked_root(powered.sum(dims, keepdim), lambda s: s.pow(1.0 / ord))


def cross(a, b, dim, name):
    """a × b along `dim` (size 3), broadcast: (a₂b₃ - a₃b₂, a₃b₁ - a₁b₃, a₁b₂ - a₂b₁)."""
    a, b = a._broadcast(b, name=name)
    if dim is None:  # torch.cross's old default: the first dimension of size 3
        dim = next((i for i, s in enumerate(a.shape) if s == 3), None)
        if dim is None:
            raise RuntimeError(f"{name}: no dimension of size 3 in input of shape {a.shape}")
    d = a._dim(dim, name)
    if a.shape[d] != 3:
        raise RuntimeError(f"{name}: inputs dimension {dim} must have length 3, got {a.shape[d]} (shape {a.shape}): "
                           "the cross product is defined for 3-vectors only")
    a1, a2, a3 = a.split(1, d)
    b1, b2, b3 = b.split(1, d)
    return cat([a2 * b3 - a3 * b2, a3 * b1 - a1 * b3, a1 * b2 - a2 * b1], d)


def _need(x, ndim, name, what):
    if x.ndim != ndim:
        raise RuntimeError(f"{name}: expected {what} ({ndim}-D), got a {x.ndim}-D tensor of shape {x.shape}")


def eye_like(x, n):
    """The n×n identity in x's dtype, on x's device."""
    i = arange(n, device=x.device)
    return (i.reshape(n, 1) == i.reshape(1, n)).to(x.dtype)


class Products(TensorLike):
    __slots__ = ()

    def norm(self, p="fro", dim=None, keepdim=False, dtype=None):
        """torch.norm: a vector norm (p a number: over `dim`, every element when None; 'fro': the 2-norm over
        `dim`), or p='nuc', the nuclear norm of the matrices in `dim` (tinyllm.linalg.matrix_norm)."""
        if isinstance(p, str):
            if p == "fro" and (dim is None or isinstance(dim, int) or len(dim) <= 2):
                return vector_norm(self, 2, dim, keepdim, dtype, name="norm")
            return LINALG["matrix_norm"](self, p, tuple(range(self.ndim)) if dim is None else dim, keepdim, dtype=dtype)
        return vector_norm(self, 2 if p is None else p, dim, keepdim, dtype, name="norm")

    def dist(self, other, p=2):
        """‖self - other‖_p over every element (broadcast)."""
        return vector_norm(self - self._as(other), p, name="dist")

    def dot(self, other):
        """Σ aᵢbᵢ of two 1-D tensors of one length (a matmul, so the sgemm)."""
        other = self._as(other)
        if self.ndim != 1 or other.ndim != 1:
            raise RuntimeError(f"dot: 1D tensors expected, but got {self.ndim}D and {other.ndim}D tensors")
        if self.shape != other.shape:
            raise RuntimeError(f"dot: inconsistent tensor size, expected tensors of the same length, got "
                               f"{self.shape[0]} and {other.shape[0]}")
        return self.matmul(other)

    def inner(self, other):
        """Σ over the last axis of both: out[i..., j...] = Σₖ a[i..., k]·b[j..., k] (a scalar operand multiplies)."""
        other = self._as(other)
        if not self.ndim or not other.ndim:
            return self * other
        n = self.shape[-1]
        if other.shape[-1] != n:
            raise RuntimeError(f"inner: the last dimensions of {self.shape} and {other.shape} must match")
        out = self.reshape(-1, n).matmul(other.reshape(-1, n).t())
        return out.reshape(*self.shape[:-1], *other.shape[:-1])

    def outer(self, other):
        """out[i, j] = a[i]·b[j], for 1-D a and b; the gradients are dA = dY·b and dB = dYᵀ·a."""
        other = self._as(other)
        _need(self, 1, "outer", "a vector")
        _need(other, 1, "outer", "a vector")
        return self.reshape(-1, 1) * other.reshape(1, -1)

    ger = outer

    def mv(self, vec):
        vec = self._as(vec)
        _need(self, 2, "mv", "a matrix")
        _need(vec, 1, "mv", "a vector")
        return self.matmul(vec)

    def mm(self, mat2):
        mat2 = self._as(mat2)
        _need(self, 2, "mm", "a matrix")
        _need(mat2, 2, "mm", "a matrix")
        return self.matmul(mat2)

    def bmm(self, mat2):
        mat2 = self._as(mat2)
        _need(self, 3, "bmm", "a batch of matrices")
        _need(mat2, 3, "bmm", "a batch of matrices")
        if self.shape[0] != mat2.shape[0]:
            raise RuntimeError(f"bmm: batch sizes {self.shape[0]} and {mat2.shape[0]} differ "
                               f"(shapes {self.shape} and {mat2.shape})")
        return self.matmul(mat2)

    def kron(self, other):
        """The Kronecker product: out[i·q + k, j·r + l, ...] = a[i, j, ...]·b[k, l, ...], the shorter operand padded
        with leading 1s: a and b interleaved by reshape, one broadcast product, merged back."""
        other = self._as(other)
        n = max(self.ndim, other.ndim)
        sa = (1,) * (n - self.ndim) + self.shape
        sb = (1,) * (n - other.ndim) + other.shape
        a = self.reshape(*[v for s in sa for v in (s, 1)])
        b = other.reshape(*[v for s in sb for v in (1, s)])
        return (a * b).reshape(*[x * y for x, y in zip(sa, sb)])

    def trace(self):
        """Σ of the main diagonal of a matrix (integers as int64, as torch)."""
        _need(self, 2, "trace", "a matrix")
        return self.diagonal().sum()

    def diag_embed(self, offset=0, dim1=-2, dim2=-1):
        """Matrices with the last axis on their `offset` diagonal, in dims dim1 and dim2 of the output (one more
        dim than the input): a gather of the vector's entries, kept where col - row = offset, 0 elsewhere."""
        ndim = self.ndim + 1
        d1, d2 = (d % ndim if -ndim <= d < ndim else None for d in (dim1, dim2))
        if d1 is None or d2 is None:
            raise IndexError(f"diag_embed: dimensions {dim1} and {dim2} out of range for an output of {ndim} dims "
                             f"(input of shape {self.shape})")
        if d1 == d2:
            raise RuntimeError(f"diag_embed: diagonal dimensions cannot be identical ({dim1}, {dim2})")
        n = self.shape[-1]
        m = n + abs(offset)
        rows, cols = arange(m, device=self.device).reshape(m, 1), arange(m, device=self.device).reshape(1, m)
        on = (cols - rows) == offset
        pick = (rows if offset >= 0 else cols).expand(m, m).minimum(max(n - 1, 0))  # the entry for (r, c) if on
        out = on.where(self[..., pick.reshape(-1)].reshape(*self.shape[:-1], m, m), 0)
        order, rest = [None] * ndim, iter(range(ndim - 2))
        order[d1], order[d2] = ndim - 2, ndim - 1
        return out.permute(*[next(rest) if o is None else o for o in order])

    def cross(self, other, dim=None):
        """torch.cross: the cross product along `dim`, or the first dimension of size 3 when None."""
        return cross(self, self._as(other), dim, "cross")

    def matrix_power(self, n):
        """Aⁿ for square matrices (batched) by repeated squaring: ⌊log₂ n⌋ squarings and a product per set bit;
        A⁰ is the identity, a negative n is (A⁻¹)^|n| (tinyllm.linalg.matrix_power, which needs linalg.inv)."""
        if self.ndim < 2 or self.shape[-1] != self.shape[-2]:
            raise RuntimeError(f"matrix_power: expected a square matrix or a batch of them, got shape {self.shape}")
        if not isinstance(n, (int, np.integer)):
            raise TypeError(f"matrix_power: n must be an integer, got {n!r}")
        if n < 0:
            return LINALG["matrix_power"](self, n)
        if n == 0:
            return _zero_grad(eye_like(self, self.shape[-1]).expand(*self.shape), self)
        out, base = None, self
        while True:
            if n & 1:
                out = base if out is None else out.matmul(base)
            n >>= 1
            if not n:
                return out
            base = base.matmul(base)

