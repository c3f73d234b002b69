"""Complex tensors (torch's complex64 / complex128) as composites of real ops, so every runtime and autograd run them
unchanged.

Design. A complex tensor of shape S is stored as a real tensor of shape S + (2,): the pairs (re, im) interleaved,
exactly C's `float _Complex` layout and WGSL's vec2<f32>. `ComplexTensor` is a Tensor whose node is that real
storage; it reports the complex shape (S, without the trailing 2) and the complex dtype (complex64 over float32,
complex128 over float64), and `.numpy()` hands back a NumPy complex array. No graph node, pass or runtime ever sees
a complex dtype: each complex op is written here with real ops on the pairs, e.g.

    (a + ib)(c + id) = (ac - bd) + i(ad + bc)        exp(a + ib) = e^a cos b + i e^a sin b

`view_as_real(z)` and `view_as_complex(x)` are zero-copy: both tensors sit on the same node, so they are views
of one storage (view_as_complex wants a last dim of 2 with stride 1, as torch does).

Gradients. For a real loss L of a complex z = x + iy, torch's autograd gives z.grad = dL/dx + i dL/dy (the
conjugate Wirtinger derivative times 2; torch's docs, "Autograd for Complex Numbers"). The real autograd of the
storage computes (dL/dx, dL/dy) for the pair (x, y), which read as a complex number is that same value: the
convention comes out without a complex backward rule. `z.backward(g)` of a complex z seeds the storage's backward
with (Re g, Im g), as torch; `backward()` without a gradient is refused, as torch's (a complex output has no
implicit gradient).

What a complex tensor supports: + - * / ** (complex with complex, real tensors and Python numbers, broadcasting as
torch; pow as exp(w log z), with torch's values at z = 0: 1 for a number exponent 0, else 0 / inf + nan i / nan by
the sign of Re w), matmul (a real operand is promoted, where torch wants one dtype), exp, log, sqrt (principal
branch, torch's sign of zero on the cut), sin, cos, tanh, sinh, cosh, sgn, square, reciprocal, sum, mean, abs
(gradient 0 at 0, as torch), angle, conj, .real / .imag (views), == / != / isclose / allclose / equal (both
parts), isnan / isinf / isfinite (any part), the in-place add_ sub_ mul_ div_ copy_ zero_ fill_ and += -= *= /=
(Tensor's: the new value rebinds the tensor), the movement ops (reshape, view, permute, transpose, unsqueeze,
squeeze, flatten, expand, indexing by ints, slices, index tensors and bool masks over the complex shape, and
z[index] = value: the storage's, with a full slice over the trailing pair), cat / stack / where, clone, detach,
requires_grad_, .grad, .numpy() / .item() / .tolist(). Every other Tensor method raises a TypeError naming the op
(the orderings `<`, max, relu, softmax included, as torch). The factories take complex data and dtypes:
tinyllm.tensor / from_numpy of complex values, zeros / ones / full / randn(dtype=complex64); nn.Parameter of
complex data is a ComplexParameter (tinyllm/nn/module.py), and tinyllm.save / load store complex64 as
safetensors' C64 (complex128 has no safetensors dtype).
"""
import builtins

import numpy as np

from . import dtype as dt
from .graph import const
from .mixins import cat
from .mixins.products import Products
from .tensor import Tensor, to_args
from .runtime import get as get_runtime

__all__ = ["ComplexTensor", "complex", "polar", "view_as_real", "view_as_complex", "real", "imag", "from_numpy",
           "full"]


def _storage(t):
    """The real tensor behind a complex one (the same node: a view)."""
    s = object.__new__(Tensor)
    s._node, s.device, s._grad, s.is_leaf, s.requires_grad = t._node, t.device, None, not t.requires_grad, t.requires_grad
    return s


def _wrap(storage):
    """A complex tensor over a real (..., 2) float32/float64 tensor (the same node: a view)."""
    z = object.__new__(ComplexTensor)
    z._node, z.device, z._grad = storage._node, storage.device, None
    z.requires_grad = storage.requires_grad
    z.is_leaf = not storage.requires_grad
    return z


def _pair(re, im):
    return _wrap(cat([re.unsqueeze(-1), im.unsqueeze(-1)], -1))


def from_numpy(array, dtype=None, device=None, requires_grad=False):
    """A complex leaf of a NumPy array (tinyllm.tensor of complex data, or with dtype=complex64/complex128)."""
    given = array
    array = np.asarray(array)
    # as torch: a NumPy array keeps its precision, Python numbers are complex64 (the default float32's)
    dtype = dt.to_dtype(dtype) if dtype is not None else dt.to_dtype(array.dtype) \
        if array.dtype.kind == "c" and isinstance(given, np.ndarray) else dt.complex64
    if not dtype.is_complex:
        raise TypeError(f"tensor: complex data cannot be stored as {dtype.name} (take .real or abs() first)")
    array = array.astype(dtype.np)
    storage = np.stack([array.real, array.imag], -1)
    z = _wrap(Tensor(storage, dtype=dt.REAL_OF[dtype], device=device))
    return z.requires_grad_() if requires_grad else z


def full(size, fill_value, dtype=None, device=None):
    """A complex constant (tinyllm.full / zeros / ones with a complex dtype or a complex fill value)."""
    dtype = dt.to_dtype(dtype) if dtype is not None else dt.complex64
    c = builtins.complex(fill_value)
    real, size = dt.REAL_OF[dtype], tuple(size)
    device = get_runtime(device).name
    return _pair(*(Tensor._from_node(const(v, size, real), device) for v in (c.real, c.imag)))


def view_as_real(input):
    """torch.view_as_real: a complex tensor of shape S as a real one of shape S + (2,), sharing its storage."""
    if not isinstance(input, ComplexTensor):
        raise RuntimeError(f"view_as_real is only supported for complex tensors, got {getattr(input, 'dtype', type(input).__name__)}")
    return _storage(input)


def view_as_complex(input):
    """torch.view_as_complex: a float32 / float64 tensor of shape S + (2,) as a complex one of shape S, sharing its
    storage. The last dim must be 2 with stride 1, as torch requires."""
    if not isinstance(input, Tensor) or isinstance(input, ComplexTensor) or input.dtype not in dt.COMPLEX_OF:
        raise RuntimeError(f"view_as_complex is only supported for float and double tensors, but got a tensor of "
                           f"scalar type: {getattr(input, 'dtype', type(input).__name__)}")
    if input.ndim == 0 or input.shape[-1] != 2:
        raise RuntimeError("Tensor must have a last dimension of size 2")
    if input.stride()[-1] != 1:
        raise RuntimeError("Tensor must have a last dimension with stride 1")
    if any(s % 2 for s in input.stride()[:-1]):
        raise RuntimeError("Tensor must have a stride divisible by 2 for all but last dimension")
    return _wrap(input)


def _check_parts(name, first, second, names):
    """torch.complex's and torch.polar's checks: two float32 / float64 tensors of one dtype."""
    for label, t in zip(names, (first, second)):
        if not isinstance(t, Tensor) or isinstance(t, ComplexTensor) or t.dtype not in dt.COMPLEX_OF:
            raise RuntimeError(f"{name}: expected {label} to be a float or double tensor, got "
                               f"{getattr(t, 'dtype', type(t).__name__)}")
    if first.dtype is not second.dtype:
        raise RuntimeError(f"{name}: expected {names[0]} and {names[1]} to have the same dtype, got "
                           f"{first.dtype.name} and {second.dtype.name}")


def complex(real, imag):
    """torch.complex: real + i imag, of two float tensors of one dtype (broadcast)."""
    _check_parts("complex", real, imag, ("real", "imag"))
    real, imag = real._broadcast(imag, name="complex")
    return _pair(real, imag)


def polar(abs, angle):
    """torch.polar: abs·(cos angle + i sin angle)."""
    _check_parts("polar", abs, angle, ("abs", "angle"))
    return complex(abs * angle.cos(), abs * angle.sin())


def real(input):
    """torch.real: the real part (a view; a real tensor itself)."""
    return input.real


def imag(input):
    """torch.imag: the imaginary part of a complex tensor (a view)."""
    return input.imag


def _power(base, exponent):
    """base ** exponent of two complex tensors, exp(exponent · log base), with torch's values at base 0."""
    zero_base = (base.real == 0) & (base.imag == 0)
    safe = _pair(zero_base.where(1.0, base.real), base.imag)
    out = (exponent * safe.log()).exp()
    # 0 ** w, as torch's tensor exponents: 0 for Re w > 0, inf + nan i for Re w < 0, nan + nan i for Re w = 0 (w = 0
    # included: torch's 0 ** 0 = 1 is its scalar exponent's, which pow takes before this)
    nan, pos = float("nan"), exponent.real > 0
    re = pos.where(0.0, (exponent.real < 0).where(float("inf"), nan))
    return _pair(zero_base.where(re, out.real), zero_base.where(pos.where(0.0, nan), out.imag))


class ComplexTensor(Tensor):
    """A complex Tensor: a real tensor of shape self.shape + (2,) holding (re, im) pairs (the module docstring)."""
    __slots__ = ()

    # ---- what it is ----
    shape = property(lambda self: self._node.shape[:-1])
    ndim = property(lambda self: len(self._node.shape) - 1)
    dtype = property(lambda self: dt.COMPLEX_OF[self._node.dtype])

    def is_complex(self): return True
    def stride(self): return tuple(s // 2 for s in _storage(self).stride()[:-1])

    def __repr__(self):
        grad = ", requires_grad=True" if self.requires_grad else ""
        return (f"tensor({np.array2string(self.numpy(), separator=', ', prefix='tensor(')}, dtype={self.dtype.name}, "
                f"device='{self.device}'{grad})")

    def numpy(self):
        return np.ascontiguousarray(_storage(self).numpy()).view(self.dtype.np).reshape(self.shape)

    def item(self):
        if self.numel() != 1:
            raise ValueError(f"item: only one-element tensors can be converted to a Python scalar, got shape {self.shape}")
        return builtins.complex(self.numpy().reshape(()).item())

    def tolist(self): return self.numpy().tolist()
    def __array__(self, dtype=None, copy=None): return np.asarray(self.numpy(), dtype=dtype)
    def __complex__(self): return self.item()

    # ---- autograd ----
    @property
    def grad(self):
        return None if self._grad is None else _wrap(self._grad)

    @grad.setter
    def grad(self, grad):
        Tensor.grad.fset(self, _storage(grad) if isinstance(grad, ComplexTensor) else grad)

    def backward(self, gradient=None, retain_graph=False):
        """With a complex `gradient` g of this shape, as torch: the storage's backward seeded with (Re g, Im g),
        which is torch's convention for the leaves' gradients. Without one: refused, as torch (a complex output
        has no implicit gradient)."""
        if gradient is None:
            raise RuntimeError("backward: grad can be implicitly created only for real scalar outputs, this tensor is "
                               f"{self.dtype.name}: take a real loss first (e.g. z.abs().sum() or "
                               "view_as_real(z).sum()), or pass gradient= (a complex tensor of its shape)")
        if not isinstance(gradient, ComplexTensor) or gradient.shape != self.shape:
            raise RuntimeError(f"backward: gradient must be a complex tensor of shape {self.shape}, got "
                               f"{getattr(gradient, 'dtype', type(gradient).__name__)} "
                               f"{getattr(gradient, 'shape', '')}")
        storage = _storage(self)
        storage.backward(_storage(gradient).to(storage.dtype), retain_graph)
        self._node = storage._node

    def detach(self): return _wrap(_storage(self).detach())
    def clone(self): return _wrap(_storage(self).clone())
    def contiguous(self): return _wrap(_storage(self).contiguous())

    def to(self, *args, dtype=None, device=None):
        device, dtype = to_args(args, device, dtype)
        out = _storage(self)
        if dtype is not None:
            dtype = dt.to_dtype(dtype)
            if not dtype.is_complex:
                raise TypeError(f"to: casting {self.dtype.name} to {dtype.name} is not supported (take .real or .abs())")
            out = out.to(dt.REAL_OF[dtype])
        return _wrap(out.to(device=device) if device is not None else out)

    def type_as(self, other): return self.to(other.dtype)

    def _as_complex(self, x):
        """`x` (a number, a real or a complex tensor) as a complex tensor of self's dtype or x's, for function forms
        and cat whose first argument is not complex."""
        if isinstance(x, ComplexTensor):
            return x
        z, r = self._other(x, "complex")
        if z is not None:
            return z
        r = r if isinstance(r, Tensor) else Tensor._from_node(const(r, (), self._node.dtype), self.device)
        r = r.to(self._node.dtype) if not r.dtype.is_float else r
        return _pair(r, Tensor._from_node(const(0.0, r.shape, r.dtype), r.device))  # (+0: r * 0 is -0 for r < 0)

    def _cat(self, tensors, dim):
        """cat of tensors of which one (self) is complex: the storages joined along `dim`."""
        d = self._dim(dim, "cat")
        zs = [self._as_complex(t) for t in tensors]
        dtype = zs[0]._node.dtype
        for z in zs[1:]:
            dtype = dt.result_type(dtype, z._node.dtype)
        return _wrap(cat([_storage(z).to(dtype) for z in zs], d))

    # ---- parts ----
    real = property(lambda self: _storage(self)[..., 0])
    imag = property(lambda self: _storage(self)[..., 1])

    def conj(self): return _pair(self.real, -self.imag)
    def abs(self):
        """sqrt(re² + im²), with torch's gradient 0 at 0 (sqrt of a 0 swapped for 1 there, so no 0·inf)."""
        sq = self.real * self.real + self.imag * self.imag
        zero = sq == 0
        return zero.where(0.0, zero.where(1.0, sq).sqrt())
    def angle(self): return self.imag.atan2(self.real)
    def __abs__(self): return self.abs()

    def exp(self):
        e = self.real.exp()
        return _pair(e * self.imag.cos(), e * self.imag.sin())

    def log(self):
        """log|z| + i angle(z) (the principal branch, as torch)."""
        return _pair((self.real * self.real + self.imag * self.imag).log() * 0.5, self.angle())

    def square(self): return self * self
    def reciprocal(self): return 1.0 / self

    def sqrt(self):
        """The principal square root, as torch: with t = sqrt((|z| + |a|)/2), t + ib/2t for a >= 0 and
        |b|/2t + i sign(b) t for a < 0 (no cancellation near either real half-axis); 0 at 0."""
        a, b = self.real, self.imag
        t = ((self.abs() + a.abs()) * 0.5).sqrt()
        zero = t == 0
        half = 0.5 / zero.where(1.0, t)
        pos, neg = a >= 0, (1.0 / b) < 0  # (1/b: -0.0 counts as negative, as torch's branch cut)
        re = pos.where(t, b.abs() * half)
        im = pos.where(b * half, neg.where(-t, t))
        return _pair(zero.where(0.0, re), zero.where(b, im))

    def sgn(self):
        """z / |z|, 0 at 0 (gradient 0 there), as torch.sgn."""
        r = self.abs()
        zero = r == 0
        r = zero.where(1.0, r)
        return _pair(zero.where(0.0, self.real / r), zero.where(0.0, self.imag / r))

    def sin(self):
        a, b = self.real, self.imag
        return _pair(a.sin() * b.cosh(), a.cos() * b.sinh())

    def cos(self):
        a, b = self.real, self.imag
        return _pair(a.cos() * b.cosh(), -(a.sin() * b.sinh()))

    def sinh(self):
        a, b = self.real, self.imag
        return _pair(a.sinh() * b.cos(), a.cosh() * b.sin())

    def cosh(self):
        a, b = self.real, self.imag
        return _pair(a.cosh() * b.cos(), a.sinh() * b.sin())

    def tanh(self):
        """(sinh a cosh a + i sin b cos b) / (sinh² a + cos² b), a + ib = z: (sinh 2a + i sin 2b) / (cosh 2a + cos 2b)
        with a denominator of two squares, so no cancellation near the poles; for |a| > 20, sign(a) + 0i (tanh's
        own limit, where sinh² a would overflow float32)."""
        a, b = self.real, self.imag
        big = a.abs() > 20
        a = big.where(0.0, a)
        sh, cb = a.sinh(), b.cos()
        den = sh * sh + cb * cb
        return _pair(big.where(self.real.sign(), sh * a.cosh() / den), big.where(0.0, b.sin() * cb / den))

    def pow(self, exponent):
        """z ** p: ones for a number p = 0 (torch's 0 ** 0 = 1), repeated products for p = 1..4, else
        exp(p log z) with torch's values at z = 0 (log is taken of 1 there, so no inf reaches the gradient)."""
        if isinstance(exponent, (bool, int, float, builtins.complex, np.number)) and exponent in (0, 1, 2, 3, 4):
            n = int(builtins.complex(exponent).real)
            if n == 0:  # ones, with torch's gradient 0 (a where off self's branch: no 0·inf)
                ones, storage = _storage(full(self.shape, 1, self.dtype, self.device)), _storage(self)
                take = Tensor._from_node(const(True, storage.shape, dt.bool_), self.device)
                return _wrap(take.where(ones, storage)) if self.requires_grad else _wrap(ones)
            out = self
            for _ in range(n - 1):
                out = out * self
            return out
        return _power(self, self._as_complex(exponent))

    def __pow__(self, x): return self.pow(x)

    def __rpow__(self, x):
        return _power(self._as_complex(x), self)

    # ---- arithmetic ----
    def _other(self, x, name):
        """`x` as (complex tensor or None, real tensor or None, python number or None)."""
        if isinstance(x, ComplexTensor):
            return x, None
        if isinstance(x, Tensor):
            if x.dtype is dt.bool_:
                x = x.to(self._node.dtype)
            return None, x
        if isinstance(x, (bool, int, float, np.integer, np.floating)):
            return None, float(x)
        if isinstance(x, (builtins.complex, np.complexfloating)):
            c = builtins.complex(x)
            return _wrap(Tensor([c.real, c.imag], dtype=self._node.dtype, device=self.device)), None
        raise TypeError(f"{name}: unsupported operand type {type(x).__name__} with a complex tensor")

    def _parts_with(self, x, name):
        """((a, b), (c, d) or None, r or None): self's parts and x's parts (complex) or x (real), one dtype."""
        z, r = self._other(x, name)
        a, b = self.real, self.imag
        if z is not None:
            c, d = z.real, z.imag
            if c.dtype is not a.dtype:
                dtype = dt.result_type(a.dtype, c.dtype)
                a, b, c, d = (t.to(dtype) for t in (a, b, c, d))
            return (a, b), (c, d), None
        if isinstance(r, Tensor) and r.dtype.is_float and dt.result_type(a.dtype, r.dtype) is not a.dtype:
            dtype = dt.result_type(a.dtype, r.dtype)
            a, b = a.to(dtype), b.to(dtype)
        return (a, b), None, r

    def add(self, other, alpha=1):
        (a, b), cd, r = self._parts_with(other, "add")
        if cd is not None:
            c, d = cd if alpha == 1 else (alpha * cd[0], alpha * cd[1])
            return _pair(a + c, b + d)
        re = a + (r if alpha == 1 else alpha * r)
        return _pair(re, b.expand(*re.shape) if b.shape != re.shape else b)

    def sub(self, other, alpha=1): return self.add(other, -alpha)
    def __add__(self, x): return self.add(x)
    def __radd__(self, x): return self.add(x)
    def __sub__(self, x): return self.sub(x)
    def __rsub__(self, x): return (-self).add(x)
    def __neg__(self): return _pair(-self.real, -self.imag)
    def neg(self): return -self
    def __pos__(self): return self

    def mul(self, other):
        (a, b), cd, r = self._parts_with(other, "mul")
        if cd is not None:
            c, d = cd
            return _pair(a * c - b * d, a * d + b * c)
        return _pair(a * r, b * r)

    def div(self, other, rounding_mode=None):
        if rounding_mode is not None:
            raise TypeError(f"div: rounding_mode={rounding_mode!r} is not supported for complex tensors")
        (a, b), cd, r = self._parts_with(other, "div")
        if cd is not None:
            c, d = cd
            den = c * c + d * d
            return _pair((a * c + b * d) / den, (b * c - a * d) / den)
        return _pair(a / r, b / r)

    def __mul__(self, x): return self.mul(x)
    def __rmul__(self, x): return self.mul(x)
    def __truediv__(self, x): return self.div(x)
    def __rtruediv__(self, x):
        z, r = self._other(x, "div")
        if z is not None:
            return z.div(self)
        (a, b), _, r = self._parts_with(x, "div")  # r / (a + ib) = r (a - ib) / (a² + b²)
        den = a * a + b * b
        return _pair(r * a / den, -r * b / den)
    multiply, divide, subtract = mul, div, sub

    def matmul(self, other):
        if not isinstance(other, ComplexTensor):
            if not isinstance(other, Tensor):
                raise TypeError(f"matmul: expected a tensor, got {type(other).__name__}")
            a, b = self.real, self.imag
            return _pair(a @ other.to(a.dtype), b @ other.to(a.dtype))
        (a, b), (c, d), _ = self._parts_with(other, "matmul")
        return _pair(a @ c - b @ d, a @ d + b @ c)

    def __matmul__(self, x): return self.matmul(x)

    outer = ger = Products.outer  # x[:, None] * y[None, :]: the complex reshape and mul do the rest

    def __rmatmul__(self, x):
        return _pair(x @ self.real, x @ self.imag)

    # ---- comparisons: equality of both parts (no ordering, as torch) ----
    def _both_parts(self, other, name):
        (a, b), cd, r = self._parts_with(other, name)
        return (a, b), cd if cd is not None else (r, 0.0)

    def eq(self, other):
        (a, b), (c, d) = self._both_parts(other, "eq")
        return (a == c) & (b == d)

    def ne(self, other):
        (a, b), (c, d) = self._both_parts(other, "ne")
        return (a != c) | (b != d)

    def __eq__(self, x): return self.eq(x)
    def __ne__(self, x): return self.ne(x)
    def isnan(self): return self.real.isnan() | self.imag.isnan()
    def isinf(self): return self.real.isinf() | self.imag.isinf()
    def isfinite(self): return self.real.isfinite() & self.imag.isfinite()
    def isreal(self): return self.imag == 0

    def isclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
        """Equal, or |self - other| finite and <= atol + rtol·|other| (complex abs), as torch's complex isclose;
        with equal_nan, a NaN in any part of both is close."""
        if rtol < 0 or atol < 0:
            raise RuntimeError(f"isclose: {'rtol' if rtol < 0 else 'atol'} must be greater than or equal to zero, "
                               f"but got {rtol if rtol < 0 else atol}")
        other = self._as_complex(other)
        err = (self - other).abs()
        close = (self == other) | (err.isfinite() & (err <= atol + rtol * other.abs()))
        return close | (self.isnan() & other.isnan()) if equal_nan else close

    def allclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
        return bool(self.isclose(other, rtol, atol, equal_nan).all().item())

    def equal(self, other):
        """One shape and equal values in both parts (a Python bool), as torch.equal."""
        other = self._as_complex(other)
        return self.shape == other.shape and bool((self == other).all().item())

    # ---- in-place: Tensor's (each builds the new value with the complex op and rebinds this tensor to it) ----
    add_, sub_, mul_, div_, copy_, zero_, fill_ = (Tensor.add_, Tensor.sub_, Tensor.mul_, Tensor.div_, Tensor.copy_,
                                                   Tensor.zero_, Tensor.fill_)

    def __iadd__(self, x): return self.add_(x)
    def __isub__(self, x): return self.sub_(x)
    def __imul__(self, x): return self.mul_(x)
    def __itruediv__(self, x): return self.div_(x)

    def _as(self, x, dtype=None):
        """Values in-place updates take (a NumPy array too: load_state_dict's): as a complex tensor."""
        return from_numpy(x, self.dtype, self.device) if isinstance(x, np.ndarray) else self._as_complex(x)

    # ---- reductions ----
    def sum(self, dim=None, keepdim=False, dtype=None):
        if dtype is not None and dt.to_dtype(dtype) is not self.dtype:
            return self.to(dtype).sum(dim, keepdim)
        axes = self._dims(dim, "sum")
        return _wrap(_storage(self).sum(axes, keepdim=keepdim)) if axes else self

    def mean(self, dim=None, keepdim=False):
        axes = self._dims(dim, "mean")
        return _wrap(_storage(self).mean(axes, keepdim=keepdim)) if axes else self

    # ---- movement: the storage's, with the trailing 2 kept ----
    def _shape_args(self, shape):
        return tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)

    def reshape(self, *shape): return _wrap(_storage(self).reshape(*self._shape_args(shape), 2))
    def view(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], dt.DType):
            raise TypeError("view(dtype) is not supported for complex tensors: use view_as_real")
        return _wrap(_storage(self).view(*self._shape_args(shape), 2))

    def expand(self, *shape): return _wrap(_storage(self).expand(*self._shape_args(shape), 2))
    def expand_as(self, other): return self.expand(*other.shape)

    def permute(self, *dims):
        dims = [self._dim(d, "permute") for d in self._shape_args(dims)]
        return _wrap(_storage(self).permute(*dims, self.ndim))

    def transpose(self, dim0, dim1):
        return _wrap(_storage(self).transpose(self._dim(dim0, "transpose"), self._dim(dim1, "transpose")))

    @staticmethod
    def _storage_index(index):
        """An index of the complex shape as one of the storage's: a full slice over the trailing (re, im) axis.
        Index tensors and bool masks index the leading dims as they would the complex tensor's."""
        index = index if isinstance(index, tuple) else (index,)
        if any(isinstance(i, ComplexTensor) for i in index):
            raise IndexError("__getitem__: tensors used as indices must be long, int or bool tensors, not complex")
        return (index if any(i is Ellipsis for i in index) else index + (Ellipsis,)) + (slice(None),)

    def __getitem__(self, index):
        return _wrap(_storage(self)[self._storage_index(index)])

    def __setitem__(self, index, value):
        """z[index] = value (complex, real or a number), for every index __getitem__ takes: the storage's."""
        storage = _storage(self)
        storage[self._storage_index(index)] = _storage(self._as_complex(value)).to(storage.dtype)
        self._node, self.requires_grad, self.is_leaf = storage._node, storage.requires_grad, storage.is_leaf


# the Tensor methods a complex tensor keeps as they are (they only read shape / ndim / the flags)
_KEEP = {"size", "dim", "numel", "is_contiguous", "unsqueeze", "squeeze", "flatten", "requires_grad_", "node",
         "realize", "T", "mT", "grad_fn", "data"}
# dunders of Tensor's arithmetic that a complex tensor refuses (torch has no ordering of complex numbers)
_REFUSED_DUNDERS = ("__lt__", "__le__", "__gt__", "__ge__", "__mod__", "__floordiv__", "__rfloordiv__", "__and__",
                    "__or__", "__xor__", "__invert__", "__float__", "__int__", "__index__", "__bool__")


def _unsupported(name):
    op = name.strip("_")

    def refuse(self, *args, **kwargs):
        raise TypeError(f"{op}: not supported for complex tensors ({self.dtype.name}); tinyllm's complex tensors "
                        "support + - * / ** matmul exp log sqrt sin cos tanh sgn sum mean abs angle conj real imag "
                        "== != isclose, in-place add_ mul_ copy_ and the movement ops (tinyllm/complex.py)")
    refuse.__name__ = name
    return refuse


for _name in dir(Tensor):
    if _name in ComplexTensor.__dict__ or _name in _KEEP:
        continue
    if _name in _REFUSED_DUNDERS or (not _name.startswith("_") and callable(getattr(Tensor, _name, None))):
        setattr(ComplexTensor, _name, _unsupported(_name))
ComplexTensor.__hash__ = Tensor.__hash__
