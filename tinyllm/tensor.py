"""Tensor: the user's API, with PyTorch's names and semantics. It only builds graph nodes; values are computed
when something needs them (.numpy(), .item(), .backward(), an optimizer step, or tinyllm.realize)."""
import functools
import inspect
import math
from collections import namedtuple

import numpy as np

from .replay import record
from . import autocast_mode as _autocast, dtype as dt
from .autograd import gradients, prepare, walk
from .graph import Node, build, bulk, const
from .realizer import realize
from .rewrite import autocast as _autocast_pass
from .runtime import get as get_runtime
from .views import is_contiguous, strides_of, view_strides
from .weak import WeakValues

_grad_enabled = [True]
_grad_leaves = WeakValues()  # LOAD node of a leaf that requires grad -> its Tensor
# fn(leaves whose .grad this backward updated) -> more leaves whose .grad fn set, run before the gradients are
# realized: a hook may replace a leaf's lazy .grad (data parallel training all-reduces it, tinyllm/nn/parallel.py)
grad_ready_hooks = []
MaxResult = namedtuple("MaxResult", "values indices")


class no_grad:
    """Context manager (and decorator) under which ops record no gradient, as torch.no_grad."""
    def __enter__(self):
        _grad_enabled.append(False)

    def __exit__(self, *exc):
        _grad_enabled.pop()

    def __call__(self, fn):
        @functools.wraps(fn)  # keeps fn's name, docstring and signature (inspect.signature follows __wrapped__)
        def wrapped(*args, **kwargs):
            with no_grad():
                return fn(*args, **kwargs)
        return wrapped


def is_grad_enabled():
    return _grad_enabled[-1]


def _device_name(device):
    return get_runtime(device).name


class Tensor:
    __slots__ = ("_node", "requires_grad", "_grad", "device", "is_leaf", "__weakref__")
    __hash__ = object.__hash__  # == builds a comparison, as in torch; identity hashing stays

    def __init__(self, data, requires_grad=False, dtype=None, device=None):
        if isinstance(data, Tensor):
            data = data.numpy()
        array = np.asarray(data)
        if array.dtype.kind not in "biuf":
            raise TypeError(f"Tensor: can't build a tensor from {type(data).__name__} {data!r:.60}: give numbers, "
                            "nested lists of numbers or a NumPy array")
        if dtype is None:
            dtype = dt.float32 if array.dtype.kind == "f" and not isinstance(data, np.ndarray) else dt.to_dtype(array.dtype)
        else:
            dtype = dt.to_dtype(dtype)
        runtime = get_runtime(device)
        array = dt.encode(array, dtype) if dtype is dt.bfloat16 else np.array(array, dtype=dtype.np, copy=True)
        buf = runtime.from_numpy(array, dtype)
        if record.active is not None:
            record.active.made_from_host(buf, array)
        self._init(Node("LOAD", (), buf, buf.shape, dtype), runtime.name, requires_grad, leaf=True)

    def _init(self, node, device, requires_grad=False, leaf=True):
        self._node, self.device, self._grad, self.is_leaf, self.requires_grad = node, device, None, leaf, False
        if requires_grad:
            self.requires_grad_(True)

    @classmethod
    def _from_node(cls, node, device, requires_grad=False, leaf=True):
        t = object.__new__(cls)
        t._node, t.device, t._grad, t.is_leaf, t.requires_grad = node, device, None, leaf, False  # (_init, inlined)
        if requires_grad:
            t.requires_grad_(True)
        return t

    # The graph node behind this tensor. A leaf that requires grad always sits on its own buffer, so the
    # gradient walk can tell it from any other tensor.
    @property
    def node(self):
        return self._node

    @node.setter
    def node(self, node):
        if record.watchers:  # a jit Tape that read the old value as a constant must not replay it
            record.replaced(self._node)
        if self.requires_grad and self.is_leaf:
            if _grad_leaves.get(self._node) is self:
                del _grad_leaves[self._node]  # the old node (and the buffer it holds) must not outlive its use
            _grad_leaves[node] = self
        self._node = node

    @property
    def grad(self):
        return self._grad

    @grad.setter
    def grad(self, grad):
        if record.active is not None:  # tinyllm.jit replays where each .grad ends up
            record.active.grad_written(self, self._grad)
        self._grad = grad

    def requires_grad_(self, requires_grad=True):
        if not self.is_leaf:
            raise RuntimeError("requires_grad_: only leaf tensors can change requires_grad; use .detach() first")
        if requires_grad and not self.dtype.is_float:
            raise RuntimeError(f"requires_grad_: only floating-point tensors can require gradients, not {self.dtype.name}")
        self.requires_grad = False
        if requires_grad:
            if self._node.op != "LOAD":
                realize(self)  # a leaf that requires grad gets a buffer of its own
            self.requires_grad = True
            _grad_leaves[self._node] = self
        return self

    # ---- what the tensor is -----------------------------------------------------------------------------
    shape = property(lambda self: self._node.shape)
    dtype = property(lambda self: self._node.dtype)
    ndim = property(lambda self: len(self._node.shape))
    T = property(lambda self: self.permute(*reversed(range(self.ndim))))
    mT = property(lambda self: self.transpose(-2, -1))
    grad_fn = property(lambda self: None if self.is_leaf else self._node.op)

    def dim(self): return self.ndim
    def numel(self): return math.prod(self.shape)
    def size(self, dim=None): return self.shape if dim is None else self.shape[self._dim(dim, "size")]
    def stride(self): return strides_of(self._node)
    def is_contiguous(self): return is_contiguous(self.shape, self.stride())
    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self):
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"tensor({np.array2string(self.numpy(), separator=', ', prefix='tensor(')}, dtype={self.dtype.name}, device='{self.device}'{grad})"

    # ---- values ---------------------------------------------------------------------------------------------
    def realize(self):
        realize(self)
        return self

    def numpy(self):
        record.refuse_host_read(f"numpy() of a {self.shape} tensor")
        realize(self)
        buf = self._node.buffer if self._node.op != "LOAD" else self._node.arg
        return buf.numpy()

    def item(self):
        if self.numel() != 1:
            raise ValueError(f"item: only one-element tensors can be converted to a Python scalar, got shape {self.shape}")
        return self.numpy().reshape(()).item()

    def tolist(self): return self.numpy().tolist()
    def __float__(self): return float(self.item())
    def __int__(self): return int(self.item())
    def __bool__(self): return bool(self.item())
    def __index__(self):
        if self.dtype is not dt.int64 or self.numel() != 1:
            raise TypeError("only one-element integer tensors can be used as an index")
        return int(self.item())
    def __array__(self, dtype=None, copy=None): return np.asarray(self.numpy(), dtype=dtype)

    def detach(self):
        """The same value, cut from the graph. Always a DETACH node, even over a leaf's LOAD: sharing the LOAD
        would let gradients reach the leaf through the detached tensor."""
        return Tensor._from_node(build("DETACH", self._node), self.device)

    @property
    def data(self): return self.detach()

    @data.setter
    def data(self, value): self.copy_(value)

    def copy_(self, src):
        """Overwrite this tensor's value with `src` (realized now), keeping its identity, grad and flags."""
        src = self._as(src)
        if src.shape != self.shape:
            src = src.expand(*self.shape)
        src = src.to(self.device).to(self.dtype).detach().contiguous()
        realize(src)
        buf = src._node.arg if src._node.op == "LOAD" else src._node.buffer
        self.node = Node("LOAD", (), buf, buf.shape, buf.dtype)
        return self

    # ---- in-place updates: the graph is functional, so an update builds the new value and rebinds this tensor to
    # it; gradients flow through it as torch's do. (A view taken before the update keeps the old values, where
    # torch's would see the new ones.)
    def _update(self, value, name):
        if self.is_leaf and self.requires_grad and _grad_enabled[-1]:
            raise RuntimeError(f"{name}: a leaf tensor that requires grad is used in an in-place operation: update "
                               "it under `with tinyllm.no_grad():`, or update a .clone() of it")
        value = self._as(value)
        if value.shape != self.shape:
            value = value.expand(*self.shape)
        value = value.to(self.dtype)
        if self.is_leaf and self.requires_grad:  # under no_grad: the leaf keeps its buffer's identity and its .grad
            return self.copy_(value)
        if value.requires_grad and not self.requires_grad:
            self.is_leaf, self.requires_grad = False, True
        self.node = value._node
        return self

    def add_(self, other, alpha=1): return self._update(self.add(other, alpha), "add_")
    def sub_(self, other, alpha=1): return self._update(self.sub(other, alpha), "sub_")
    def mul_(self, other): return self._update(self.mul(other), "mul_")
    def div_(self, other, rounding_mode=None): return self._update(self.div(other, rounding_mode), "div_")
    def clamp_(self, min=None, max=None): return self._update(self.clamp(min, max), "clamp_")
    clip_ = clamp_
    def zero_(self): return self._update(0, "zero_")
    def fill_(self, value): return self._update(value, "fill_")
    def masked_fill_(self, mask, value): return self._update(self.masked_fill(mask, value), "masked_fill_")

    def __setitem__(self, index, value):
        """x[index] = value, for every index __getitem__ takes (ints, slices, None, ..., bool masks, index tensors).
        Where an index repeats a position, the values written there add up (torch leaves that undefined)."""
        if isinstance(index, Tensor) and index.dtype is dt.bool_ and index.shape == self.shape:
            self._update(index.where(self._as(value).to(self.dtype), self), "__setitem__")
        else:
            self._scatter(index, value, accumulate=False, name="__setitem__")

    def index_put_(self, indices, values, accumulate=False):
        """self[indices] = values (indices: a tuple of index tensors), or += with accumulate=True."""
        return self._scatter(tuple(indices), values, accumulate, "index_put_")

    def clone(self):
        """The same value as a new tensor (updates rebind, so sharing the node is a copy); gradients flow back."""
        return self._make(self._node, self)

    def _scatter(self, index, value, accumulate, name):
        """The positions `index` selects are found by indexing a tensor of positions; the values are written
        there (scatter.put)."""
        from .scatter import put
        region = arange(self.numel(), device=self.device).reshape(*self.shape)[index]
        if isinstance(value, Tensor):
            try:
                value = value.to(self.dtype).expand(*region.shape)
            except (RuntimeError, ValueError):
                raise RuntimeError(f"{name}: a value of shape {value.shape} cannot fill the indexed region of "
                                   f"shape {region.shape}") from None
        else:
            value = Tensor._from_node(const(value, region.shape, self.dtype), self.device)
        return self._update(put(self, region.reshape(-1), value.reshape(-1), accumulate), name)

    def to(self, *args, dtype=None, device=None):
        """.to(dtype), .to(device) or both, as torch."""
        for a in args:
            if isinstance(a, (dt.DType, type)) or (isinstance(a, str) and a in ("float", "double", "long")):
                dtype = a
            else:
                device = a
        out = self
        if dtype is not None and dt.to_dtype(dtype) is not self.dtype:
            out = out._unary("CAST", dt.to_dtype(dtype))
        if device is not None and _device_name(device) != self.device:
            moved = Tensor(out.numpy(), dtype=out.dtype, device=device)
            out = Tensor._from_node(moved._node, moved.device)
            if self.requires_grad:
                raise NotImplementedError("to(device) of a tensor that requires grad: move the leaf tensors "
                                          "(e.g. model.to(device)) before building the graph")
        return out

    def float(self): return self.to(dt.float32)
    def half(self): return self.to(dt.float16)
    def bfloat16(self): return self.to(dt.bfloat16)
    def double(self): return self.to(dt.float64)
    def long(self): return self.to(dt.int64)
    def bool(self): return self.to(dt.bool_)
    def type_as(self, other): return self.to(other.dtype)

    def type(self, dtype=None):
        """.type(dtype) converts, as .to(dtype); .type() names the dtype, as torch's "torch.FloatTensor"."""
        return self.to(dtype) if dtype is not None else f"tinyllm.{self.dtype.name}"

    # ---- autograd -------------------------------------------------------------------------------------------
    @bulk
    def backward(self, gradient=None, retain_graph=False):
        """Build the gradient graph of this tensor and realize it with the forward pass; gradients accumulate
        into the .grad of every leaf that requires grad."""
        if not self.requires_grad:
            raise RuntimeError("backward: this tensor does not require grad: none of its inputs has "
                               "requires_grad=True (or it was built under no_grad)")
        if not self.is_leaf and self._node.op == "LOAD":  # only backward() turns a non-leaf into a LOAD
            raise RuntimeError("backward: the graph of this tensor was freed by an earlier backward(): pass "
                               "retain_graph=True to the first call to backpropagate through it again")
        if gradient is None:
            if self.numel() != 1:
                raise RuntimeError(f"backward: grad can be implicitly created only for scalar outputs, got shape "
                                   f"{self.shape}: call .sum() first or pass gradient= of that shape")
            seed = const(1.0, self.shape, self.dtype)
        else:
            gradient = self._as(gradient)
            if gradient.shape != self.shape:
                raise RuntimeError(f"backward: gradient has shape {gradient.shape}, the tensor {self.shape}")
            seed = gradient.to(self.dtype)._node
        if self._node.buffer is None:  # compute the value through the graph the gradients are built from
            self._node = prepare(self._node)
        order = walk(self._node)  # (the walk gradients() makes too, when this node is the prepared one)
        leaves = [t for n in order if (t := _grad_leaves.get(n)) is not None and t.requires_grad]
        grads = gradients(self._node, seed, [t._node for t in leaves], order)
        updated = []
        for t in leaves:
            g = grads[t._node]
            if g is None:
                continue
            g = Tensor._from_node(g, self.device)
            t.grad = g if t.grad is None else Tensor._from_node(build("ADD", t.grad._node, g._node), self.device)
            updated.append(t)
        seen = {id(t) for t in updated}
        for hook in grad_ready_hooks:  # (DistributedDataParallel: its all-reduces join this backward's graph)
            for t in hook(updated):
                if id(t) not in seen:
                    seen.add(id(t))
                    updated.append(t)
        realize(self, *[t.grad for t in updated])
        if not retain_graph and not self.is_leaf:  # the graph is spent, as in torch: free what it holds
            buf = self._node.buffer
            self._node = Node("LOAD", (), buf, buf.shape, buf.dtype)

    # ---- building ops ---------------------------------------------------------------------------------------
    def _make(self, node, *inputs):
        """Wrap a new node; it requires grad if any input does (unless gradients are off), and only if it is
        floating-point: comparisons, argmax and casts to integers have no gradient, as in torch."""
        needs = self.requires_grad or any(t.requires_grad for t in inputs)
        needs = needs and node.dtype.is_float
        if needs and not _grad_enabled[-1]:
            node, needs = build("DETACH", node), False
        t = object.__new__(Tensor)  # (_from_node, inlined: every op of every step comes here)
        t._node, t.device, t._grad, t.is_leaf, t.requires_grad = node, self.device, None, not needs, needs
        return t

    def _mark(self, needs):
        self.requires_grad = needs
        return self

    def _as(self, x, dtype=None):
        """`x` as a tensor on this device: Python numbers become constants of a fitting dtype."""
        if isinstance(x, Tensor):
            if x.device != self.device:
                raise RuntimeError(f"expected all tensors on one device, got {self.device} and {x.device}: use .to()")
            return x
        if type(x) is float and dtype is None and self._node.dtype.is_float:  # the common case, as below
            return Tensor._from_node(const(x, self._node.shape, self._node.dtype), self.device)
        if isinstance(x, (bool, int, float, np.number)):
            if dtype is None:
                kind = dt.bool_ if isinstance(x, (bool, np.bool_)) else dt.int64 if isinstance(x, (int, np.integer)) else dt.float32
                # a Python scalar never widens a tensor's dtype, as in torch
                order = dt.PROMOTION.index
                dtype = self.dtype if order(self.dtype) >= order(kind) or self.dtype.is_float else kind
            # a scalar meeting a tensor of its dtype is a constant of the tensor's shape straight away
            return Tensor._from_node(const(x, self.shape if dtype is self.dtype else (), dtype), self.device)
        return Tensor(x, device=self.device)

    def _unary(self, op, arg=None):
        return self._make(build(op, self._node, arg=arg))

    def _float(self):
        return self if self.dtype.is_float else self.float()

    def _broadcast(self, *others, name):
        """Promote to one dtype and broadcast to one shape, through CAST and EXPAND only."""
        ts = [self] + [self._as(o) for o in others]
        shape, dtype = self._node.shape, self._node.dtype
        for t in ts:
            if t._node.shape != shape or t._node.dtype is not dtype:
                break
        else:
            return ts  # the common case: nothing to promote or broadcast
        dtype = ts[0].dtype
        for t in ts[1:]:
            dtype = dt.result_type(dtype, t.dtype)
        shape = _broadcast_shape([t.shape for t in ts], name)
        return [t if t.shape == shape and t.dtype is dtype else t.to(dtype).expand(*shape) for t in ts]

    def _binary(self, op, other, reverse=False, name=None):
        a, b = self._broadcast(other, name=name or op.lower())
        if reverse:
            a, b = b, a
        return a._make(build(op, a._node, b._node), b)

    # ---- arithmetic -----------------------------------------------------------------------------------------
    def add(self, x, alpha=1): return self._binary("ADD", x if alpha == 1 else self._as(x) * alpha, name="add")
    def sub(self, x, alpha=1): return self.add(-(self._as(x)) if alpha == 1 else self._as(x) * -alpha)
    def mul(self, x): return self._binary("MUL", x, name="mul")
    # div (x·reciprocal(z), or rounded), the remainders, trigonometric, hyperbolic, rounding, shifts, copysign
    from .math_ops import (div, true_divide, floor_divide, remainder, fmod, __floordiv__, __rfloordiv__,  # noqa: E402
                           __mod__, __rmod__, sin, cos, tan, asin, acos, atan, atan2, sinh, cosh, asinh, acosh, atanh,
                           arcsin, arccos, arctan, arctan2, arcsinh, arccosh, arctanh, floor, ceil, trunc, fix, round,
                           frac, bitwise_left_shift, bitwise_right_shift, __lshift__, __rlshift__, __rshift__,
                           __rrshift__, copysign)
    def neg(self): return self._unary("NEG")
    def reciprocal(self): return self._float()._unary("RECIP")
    def maximum(self, x): return self._binary("MAX", x, name="maximum")
    def minimum(self, x): return self._flip().maximum(self._as(x)._flip())._flip()

    def _flip(self):
        """An order-reversing involution: -x, or not x for bools (which NEG does not take). min is flip∘max∘flip."""
        return self.logical_not() if self.dtype is dt.bool_ else -self
    def __add__(self, x): return self.add(x)
    def __radd__(self, x): return self._binary("ADD", x, reverse=True, name="add")
    def __sub__(self, x): return self.sub(x)
    def __rsub__(self, x): return self._as(x) + (-self)
    def __mul__(self, x): return self.mul(x)
    def __rmul__(self, x): return self._binary("MUL", x, reverse=True, name="mul")
    def __truediv__(self, x): return self.div(x)
    def __rtruediv__(self, x): return self._as(x)._float() * self._float().reciprocal()
    def __neg__(self): return self.neg()
    def __pow__(self, p): return self.pow(p)
    def __rpow__(self, base): return self._as(base).pow(self)
    def __matmul__(self, x): return self.matmul(x)
    def __rmatmul__(self, x): return self._as(x).matmul(self)
    def __lt__(self, x): return self._binary("CMPLT", x, name="lt")
    def __gt__(self, x): return self._binary("CMPLT", x, reverse=True, name="gt")
    def __le__(self, x): return (self < x).logical_or(self == x)  # (not ¬(x > y): false at NaN, as IEEE)
    def __ge__(self, x): return (self > x).logical_or(self == x)
    def __eq__(self, x): return self._binary("CMPEQ", x, name="eq")
    def __ne__(self, x): return (self == x).logical_not()
    def __invert__(self): return self.bitwise_not()
    def __and__(self, x): return self.bitwise_and(x)
    def __or__(self, x): return self.bitwise_or(x)
    def __xor__(self, x): return self.bitwise_xor(x)
    def __rand__(self, x): return self._as(x).bitwise_and(self)
    def __ror__(self, x): return self._as(x).bitwise_or(self)
    def __rxor__(self, x): return self._as(x).bitwise_xor(self)
    lt, gt, le, ge, eq, ne = __lt__, __gt__, __le__, __ge__, __eq__, __ne__

    def logical_not(self): return self._make(build("CMPEQ", self.bool()._node, const(False, self.shape, dt.bool_)))
    def logical_and(self, x): return self.bool()._binary("MUL", self._as(x).bool(), name="logical_and")
    def logical_or(self, x): return self.bool()._binary("MAX", self._as(x).bool(), name="logical_or")
    def logical_xor(self, x): return self.bool() != self._as(x).bool()

    def _bitwise(self, op, x, logical, name):
        """&, |, ^ as torch: bit by bit on integers, logical on bools (the same results), refused on floats."""
        a, b = self._broadcast(x, name=name)
        if a.dtype.is_float:
            raise TypeError(f"{name}: bitwise ops need integer or bool tensors, got {a.dtype.name}")
        return logical(a, b) if a.dtype is dt.bool_ else a._make(build(op, a._node, b._node), b)

    def bitwise_and(self, x): return self._bitwise("BITAND", x, Tensor.logical_and, "bitwise_and")
    def bitwise_or(self, x): return self._bitwise("BITOR", x, Tensor.logical_or, "bitwise_or")
    def bitwise_xor(self, x): return self._bitwise("BITXOR", x, Tensor.logical_xor, "bitwise_xor")

    def bitwise_not(self):
        if self.dtype.is_float:
            raise TypeError(f"bitwise_not: needs an integer or bool tensor, got {self.dtype.name}")
        return self.logical_not() if self.dtype is dt.bool_ else self._unary("BITNOT")

    def pow(self, p):
        """xᵖ with torch's semantics and dtypes (int ** int stays int64; a float exponent makes a float).
        x⁰ = 1 everywhere (nan⁰ too), with gradient 0; positive integer exponents multiply (exact, so negative
        bases work), -1, 0.5 and -0.5 are a reciprocal, square root and its reciprocal (as torch); the rest is the POW primitive (C's
        pow: (-inf)^0.3 = inf, a negative base to a non-integer exponent nan; gradient p·x^(p-1), inf at 0 for
        0 < p < 1)."""
        if isinstance(p, Tensor):
            x, p = (t if t.dtype is not dt.bool_ else t.long() for t in self._broadcast(p, name="pow"))
            return x._make(build("POW", x._node, p._node), p)
        if not isinstance(p, (bool, int, float, np.number)):
            raise TypeError(f"pow: the exponent must be a number or a tensor, got {type(p).__name__}")
        x = self.long() if self.dtype is dt.bool_ else self
        if isinstance(p, (bool, int, np.integer)):
            if p < 0 and not x.dtype.is_float:
                raise RuntimeError("pow: integers to negative integer powers are not allowed")
        else:
            x = x._float()
        if p == 0:  # 1, also for nan and inf, and a gradient of 0 (a where, so it reaches x)
            return Tensor._from_node(const(True, x.shape, dt.bool_), x.device).where(x._as(1, x.dtype), x)
        if float(p).is_integer() and 0 < p <= 64:
            n, result, base = int(p), None, x
            while n:
                if n & 1:
                    result = base if result is None else result * base
                n >>= 1
                if n:
                    base = base * base
            return result
        if p == -1:
            return x.reciprocal()
        if p == 0.5:
            return x.sqrt()
        if p == -0.5:
            return x.rsqrt()
        return x._binary("POW", x._as(p, x.dtype), name="pow")

    def exp(self): return self._float()._unary("EXP")
    def log(self): return self._float()._unary("LOG")
    def sqrt(self): return self._float()._unary("SQRT")
    def rsqrt(self): return self.sqrt().reciprocal()
    def tanh(self): return self._float()._unary("TANH")
    def erf(self): return self._float()._unary("ERF")
    def square(self): return self * self
    def log2(self): return self.log() * (1.0 / math.log(2.0))
    def log10(self): return self.log() * (1.0 / math.log(10.0))
    def exp2(self): return (self._float() * math.log(2.0)).exp()
    def isnan(self): return self != self
    def isinf(self): return self.abs() == math.inf if self.dtype.is_float else self != self
    def isfinite(self): return self.abs() < math.inf if self.dtype.is_float else self == self
    def logaddexp(self, x):
        """log(eˣ + eʸ), shifted by the larger so nothing overflows."""
        x = self._as(x)._float()
        m = self._float().maximum(x).detach()
        m = m.isfinite().where(m, 0.0)  # (−inf − −inf would be nan)
        return m + ((self - m).exp() + (x - m).exp()).log()
    def sigmoid(self):
        """σ(x) = 1/(1+e) for x ≥ 0 and e/(1+e) for x < 0, with e = e^(-|x|) ≤ 1: nothing overflows. The plain
        1/(1+e^(-x)) overflows to 1/inf for x ≪ 0, and its gradient there is 0·inf = nan."""
        x = self._float()
        neg = x < 0
        e = neg.where(x, -x).exp()  # -|x|, with the slope of the branch taken (also at 0, unlike abs)
        r = (1.0 + e).reciprocal()
        return neg.where(e * r, r)
    def relu(self):
        """x where x > 0 or x is nan (nan passes, with its gradient, as torch), else 0."""
        keep = (self > 0).logical_or(self != self) if self.dtype.is_float else self > 0
        return keep.where(self, 0.0 if self.dtype.is_float else 0)
    def abs(self): return self * self.sign()  # so the gradient at 0 is sign(0) = 0, as torch
    def sign(self): return (self > 0).to(self.dtype) - (self < 0).to(self.dtype)
    def clamp(self, min=None, max=None):
        """min(max(x, min), max) as torch: the gradient passes where min ≤ x ≤ max (bounds included), nan stays
        nan (with gradient 0), and min > max gives max everywhere."""
        if min is None and max is None:
            raise RuntimeError("clamp: at least one of min and max must be given")
        out = self
        if self.dtype.is_float or any(isinstance(b, float) or getattr(b, "dtype", dt.int64).is_float
                                      for b in (min, max)):
            out = self._float()
            out = (out != out).where(out.detach(), out)  # nan: no gradient, as torch
        if min is not None:
            out = (out < min).where(min, out)
        if max is not None:
            out = (out > max).where(max, out)
        return out
    clip = clamp

    def where(self, x, y):
        """self ? x : y, as torch.where(self, x, y) with self a bool condition."""
        if self.dtype is not dt.bool_:
            raise TypeError(f"where: the condition must be bool, got {self.dtype.name}: compare first (x > 0, mask == 1)")
        ref = x if isinstance(x, Tensor) else y if isinstance(y, Tensor) else self
        x, y = ref._as(x)._broadcast(ref._as(y), name="where")
        shape = _broadcast_shape([self.shape, x.shape], "where")
        c, x, y = self.expand(*shape), x.expand(*shape), y.expand(*shape)
        return x._make(build("WHERE", c._node, x._node, y._node), y)

    def masked_fill(self, mask, value):
        mask = self._as(mask)
        if mask.dtype is not dt.bool_:
            raise TypeError(f"masked_fill: the mask must be bool, got {mask.dtype.name}: use (mask == 0) or .bool()")
        if _broadcast_shape([mask.shape, self.shape], "masked_fill") != self.shape:
            raise ValueError(f"masked_fill: a mask of shape {mask.shape} does not broadcast to the tensor's shape "
                             f"{self.shape}")
        return mask.where(self._as(value, self.dtype), self)

    # ---- reductions -----------------------------------------------------------------------------------------
    def _dim(self, d, name):
        n = max(self.ndim, 1)
        if not isinstance(d, (int, np.integer)) or not -n <= d < n:
            raise IndexError(f"{name}: dimension {d} out of range for a tensor of shape {self.shape} "
                             f"(expected in [{-n}, {n - 1}])")
        return d % n

    def _dims(self, dim, name):
        if dim is None:
            return tuple(range(self.ndim))
        dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
        axes = [self._dim(d, name) for d in dims]
        if len(set(axes)) != len(axes):
            raise RuntimeError(f"{name}: dims {dims} name a dimension more than once (tensor of shape {self.shape})")
        return tuple(sorted(axes)) if self.ndim else ()

    def _reduce(self, op, dim, keepdim, name):
        axes = self._dims(dim, name)
        out = self._make(build(op, self._node, arg=axes)) if axes else self
        if keepdim:
            return out
        return out.reshape(*[s for i, s in enumerate(self.shape) if i not in axes])

    def sum(self, dim=None, keepdim=False, dtype=None):
        x = self if self.dtype.is_float or self.dtype is dt.int64 else self.long()
        x = x if dtype is None else x.to(dtype)
        return x._reduce("SUM", dim, keepdim, "sum")

    def prod(self, dim=None, keepdim=False, dtype=None):
        """Π over `dim` (integers and bools as int64, as torch): the reduced axes flattened into one, multiplied
        pairwise in ⌈log₂ n⌉ elementwise steps. Exact with zeros, so the gradient (the product rule through the
        steps) is torch's, where dy·y/x would be nan."""
        from .factory import cat
        x = self if self.dtype.is_float else self.long()
        x = x if dtype is None else x.to(dtype)
        axes = self._dims(dim, "prod")
        kept = [a for a in range(self.ndim) if a not in axes]
        x = x.permute(*kept, *axes).reshape(*[self.shape[a] for a in kept], -1)
        if x.shape[-1] == 0:  # the empty product
            x = Tensor._from_node(const(1, x.shape[:-1] + (1,), x.dtype), x.device)
        while x.shape[-1] != 1:
            if x.shape[-1] % 2:  # the odd one out meets a 1
                x = cat([x, Tensor._from_node(const(1, x.shape[:-1] + (1,), x.dtype), x.device)], -1)
            x = x[..., 0::2] * x[..., 1::2]
        return x.reshape(*[1 if a in axes else s for a, s in enumerate(self.shape)]) if keepdim else x.squeeze(-1)

    def mean(self, dim=None, keepdim=False):
        axes = self._dims(dim, "mean")
        return self._float().sum(axes, keepdim) / max(math.prod(self.shape[a] for a in axes), 1)

    def var(self, dim=None, unbiased=None, keepdim=False, correction=None):
        correction = correction if correction is not None else (0 if unbiased is False else 1)
        axes = self._dims(dim, "var")
        x = self._float()
        d = x - x.mean(axes, keepdim=True)
        return (d * d).sum(axes, keepdim) / max(math.prod(self.shape[a] for a in axes) - correction, 0)

    def std(self, dim=None, unbiased=None, keepdim=False, correction=None):
        return self.var(dim, unbiased, keepdim, correction).sqrt()

    def std_mean(self, dim=None, unbiased=None, keepdim=False, correction=None):
        return self.std(dim, unbiased, keepdim, correction), self.mean(dim, keepdim)

    from .cumulative import cumsum, cumprod, cummax, cummin, logcumsumexp
    from .sorting import sort, argsort, topk, msort
    from .scatter import scatter, scatter_add, scatter_reduce
    from .indexing import nonzero, masked_select

    def lerp(self, end, weight):
        """self + weight·(end - self)."""
        return self + self._as(weight) * (self._as(end) - self)

    def isclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
        """|self - other| <= atol + rtol·|other|, equal infinities close, NaN close to NaN only with equal_nan."""
        other = self._as(other)
        close = ((self - other).abs() <= atol + rtol * other.abs()) | (self == other)
        return close | (self.isnan() & other.isnan()) if equal_nan else close

    def allclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
        """Whether every element is close (a Python bool: it reads the value, as torch's does)."""
        return bool(self.isclose(other, rtol, atol, equal_nan).all().item())

    def gather(self, dim, index):
        """out[..., i, ...] = self[..., index[..., i, ...], ...] along `dim` (torch.gather): one GATHER from the
        flattened tensor by the linear index, so the gradient is its scatter-add."""
        from .scatter import linear_index
        return self.reshape(-1)[linear_index(self, dim, index, "gather")]

    def diag(self, diagonal=0):
        """A 1-D tensor: the square matrix with it on the `diagonal`-th diagonal. A 2-D one: that diagonal."""
        if self.ndim == 2:
            return self.diagonal(diagonal)
        if self.ndim != 1:
            raise RuntimeError(f"diag: expected a 1-D or 2-D tensor, got shape {self.shape}")
        n = self.shape[0] + abs(diagonal)
        rows, cols = arange(n, device=self.device).reshape(n, 1), arange(n, device=self.device).reshape(1, n)
        on = (cols - rows) == diagonal
        pick = (rows if diagonal >= 0 else cols).expand(n, n).minimum(self.shape[0] - 1)  # v[r] or v[c]
        return on.where(self[pick.reshape(-1)].reshape(n, n), 0)

    def amax(self, dim=None, keepdim=False): return self._reduce("REDUCE_MAX", dim, keepdim, "amax")
    def all(self, dim=None, keepdim=False): return self.bool().amin(dim, keepdim)
    def any(self, dim=None, keepdim=False): return self.bool().amax(dim, keepdim)
    def amin(self, dim=None, keepdim=False): return self._flip().amax(dim, keepdim)._flip()

    def argmax(self, dim=None, keepdim=False):
        """Index of the first largest value (along `dim`, or of the flattened tensor)."""
        if dim is None:
            return self.reshape(-1).argmax(0)
        d = self._dim(dim, "argmax")
        n = self.shape[d]
        rev = (n - 1) - arange(n, device=self.device).reshape(*[n if i == d else 1 for i in range(self.ndim)])
        hit = self == self.amax(d, keepdim=True)
        return (n - 1) - hit.where(rev, -1).amax(d, keepdim)

    def argmin(self, dim=None, keepdim=False): return self._flip().argmax(dim, keepdim)

    def max(self, dim=None, keepdim=False):
        """max() is the largest value; max(dim) is (values, indices) along dim, as torch."""
        if isinstance(dim, Tensor):
            return self.maximum(dim)
        if dim is None:
            return self.amax()
        dim = self._dim(dim, "max")
        return MaxResult(self.amax(dim, keepdim), self.argmax(dim, keepdim))

    def min(self, dim=None, keepdim=False):
        if isinstance(dim, Tensor):
            return self.minimum(dim)
        if dim is None:
            return self.amin()
        dim = self._dim(dim, "min")
        return MaxResult(self.amin(dim, keepdim), self.argmin(dim, keepdim))

    def logsumexp(self, dim, keepdim=False):
        """log Σ eˣ = m + log Σ e^(x-m) for the (constant) max m; where m is ±inf the shift is 0, so a row of
        -inf gives -inf (as torch) instead of -inf - -inf = nan."""
        dim = self._dims(dim, "logsumexp")
        m = self.amax(dim, keepdim=True).detach()
        m = (m.abs() < math.inf).where(m, 0.0)
        out = (self - m).exp().sum(dim, keepdim=True).log() + m
        return out if keepdim else out.squeeze(dim)

    def softmax(self, dim=-1):
        """eˣ / Σ eˣ, shifted by the (constant) row max so nothing overflows."""
        x, dim = self._float(), self._dim(dim, "softmax")
        e = (x - x.amax(dim, keepdim=True).detach()).exp()
        return e / e.sum(dim, keepdim=True)

    def log_softmax(self, dim=-1):
        x, dim = self._float(), self._dim(dim, "log_softmax")
        s = x - x.amax(dim, keepdim=True).detach()
        return s - s.exp().sum(dim, keepdim=True).log()

    # ---- matmul -----------------------------------------------------------------------------------------------
    def matmul(self, other):
        """torch.matmul: 1-D operands become a row / column, batch axes broadcast, and an N-D @ 2-D product
        runs as one 2-D product over all rows (so dW = Xᵀ dY is one product too)."""
        a, b = self, self._as(other)
        if not a.ndim or not b.ndim:
            raise RuntimeError(f"matmul: both arguments need at least 1 dimension, got shapes {a.shape} and {b.shape}")
        if a.shape[-1] != b.shape[-2 if b.ndim > 1 else 0]:
            raise RuntimeError(f"matmul: shapes {a.shape} and {b.shape} cannot be multiplied "
                               f"({a.shape[-1]} != {b.shape[-2 if b.ndim > 1 else 0]}): the last axis of the first "
                               "must equal the second-to-last of the second")
        dtype = dt.result_type(a.dtype, b.dtype)
        a, b = a.to(dtype)._float(), b.to(dtype)._float()
        a2 = a.unsqueeze(0) if a.ndim == 1 else a
        b2 = b.unsqueeze(-1) if b.ndim == 1 else b
        if b2.ndim == 2 and a2.ndim > 2:
            out = a2.reshape(-1, a2.shape[-1])._mm(b2).reshape(*a2.shape[:-1], b2.shape[-1])
        else:
            try:
                batch = _broadcast_shape([a2.shape[:-2], b2.shape[:-2]], "matmul")
            except ValueError:
                raise RuntimeError(f"matmul: the batch dims {a2.shape[:-2]} of {a.shape} and {b2.shape[:-2]} of "
                                   f"{b.shape} cannot be broadcast together") from None
            out = a2.expand(*batch, *a2.shape[-2:])._mm(b2.expand(*batch, *b2.shape[-2:]))
        if b.ndim == 1:
            out = out.squeeze(-1)
        if a.ndim == 1:
            out = out.squeeze(-2 if b.ndim > 1 else -1)
        return out

    def _mm(self, b):
        a, b = self._autocast(), b._autocast()
        return a._make(build("MATMUL", a._node, b._node), b)

    def _autocast(self):
        """Inside tinyllm.autocast, this tensor marked as an input of a lower-precision op (tinyllm/autocast_mode.py)."""
        low = _autocast.current()
        if low is None or self.dtype not in (dt.float32, dt.float64):
            return self
        return self._make(_autocast_pass.marked(build("AUTOCAST", self._node, arg=low)))

    # ---- movement ---------------------------------------------------------------------------------------------
    def _shape_arg(self, shape, name):
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
        if shape.count(-1) > 1:
            raise RuntimeError(f"{name}: only one dimension can be -1, got {shape}")
        if -1 in shape:
            rest = math.prod(s for s in shape if s != -1)
            if rest == 0 or self.numel() % rest:
                raise RuntimeError(f"{name}: shape {shape} is invalid for a tensor of {self.numel()} elements {self.shape}")
            shape = tuple(self.numel() // rest if s == -1 else s for s in shape)
        if math.prod(shape) != self.numel():
            raise RuntimeError(f"{name}: shape {shape} is invalid for a tensor of {self.numel()} elements {self.shape}")
        return tuple(int(s) for s in shape)

    def view(self, *shape):
        shape = self._shape_arg(shape, "view")
        if view_strides(self.shape, self.stride(), shape) is None:
            raise RuntimeError(f"view: a tensor of shape {self.shape} with strides {self.stride()} cannot be viewed as "
                               f"{shape} without copying (it is not contiguous): use .reshape(), which copies when it "
                               "must, or .contiguous().view()")
        return self._make(build("RESHAPE", self._node, arg=shape)) if shape != self.shape else self

    def reshape(self, *shape):
        shape = self._shape_arg(shape, "reshape")
        if shape == self.shape:
            return self
        x = self if view_strides(self.shape, self.stride(), shape) is not None else self.contiguous()
        return x._make(build("RESHAPE", x._node, arg=shape))

    def contiguous(self):
        return self if self.is_contiguous() else self._unary("CONTIGUOUS")

    def permute(self, *dims):
        dims = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        if len(dims) != self.ndim:
            raise RuntimeError(f"permute: {len(dims)} dims given for a tensor of shape {self.shape}")
        order = tuple(self._dim(d, "permute") for d in dims)
        if sorted(order) != list(range(self.ndim)):
            raise RuntimeError(f"permute: {dims} repeats a dimension")
        return self if order == tuple(range(self.ndim)) else self._unary("PERMUTE", order)

    def transpose(self, dim0, dim1):
        order = list(range(self.ndim))
        a, b = self._dim(dim0, "transpose"), self._dim(dim1, "transpose")
        order[a], order[b] = order[b], order[a]
        return self.permute(*order)

    def t(self):
        if self.ndim > 2:
            raise RuntimeError(f"t: expects a tensor with <= 2 dimensions, got shape {self.shape}: use transpose()")
        return self.permute(*reversed(range(self.ndim)))

    def expand(self, *sizes):
        sizes = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else sizes
        if sizes == self._node.shape:  # (what the checks below come to for the same shape)
            return self
        if len(sizes) < self.ndim:
            raise RuntimeError(f"expand: the number of sizes {sizes} must be at least the number of dims {self.shape}")
        lead = len(sizes) - self.ndim
        if -1 in sizes[:lead]:
            raise RuntimeError(f"expand: size -1 (keep) in {sizes} is not allowed for a new leading dim of {self.shape}")
        shape = tuple(self.shape[i - lead] if s == -1 else s for i, s in enumerate(sizes))
        for i, s in enumerate(self.shape):
            if s != 1 and s != shape[lead + i]:
                raise RuntimeError(f"expand: the size {s} of dim {i} of {self.shape} must match {shape[lead + i]} "
                                   f"in {shape} (only size-1 dims expand)")
        x = self.reshape(*((1,) * lead + self.shape)) if lead else self
        return x if shape == x.shape else x._unary("EXPAND", shape)

    def expand_as(self, other): return self.expand(*other.shape)

    def unsqueeze(self, dim):
        d = dim if dim >= 0 else dim + self.ndim + 1
        if not 0 <= d <= self.ndim:
            raise IndexError(f"unsqueeze: dimension {dim} out of range for shape {self.shape}")
        return self.reshape(*self.shape[:d], 1, *self.shape[d:])

    def squeeze(self, dim=None):
        dims = self._dims(dim, "squeeze") if dim is not None else range(self.ndim)
        return self.reshape(*[s for i, s in enumerate(self.shape) if not (i in dims and s == 1)])

    def flatten(self, start_dim=0, end_dim=-1):
        if not self.ndim:
            return self.reshape(1)
        s, e = self._dim(start_dim, "flatten"), self._dim(end_dim, "flatten")
        if s > e:
            raise RuntimeError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for shape {self.shape}")
        return self.reshape(*self.shape[:s], -1, *self.shape[e + 1:])

    def _slice(self, dim, start, stop, step=1):
        arg = tuple((start, stop, step) if i == dim else (0, s, 1) for i, s in enumerate(self.shape))
        return self._unary("SHRINK", arg) if (start, stop, step) != (0, self.shape[dim], 1) else self

    def narrow(self, dim, start, length):
        d = self._dim(dim, "narrow")
        start = start + self.shape[d] if start < 0 else start
        if not (0 <= start and length >= 0 and start + length <= self.shape[d]):
            raise RuntimeError(f"narrow: start {start} and length {length} do not fit dim {d} of size {self.shape[d]} "
                               f"(shape {self.shape})")
        return self._slice(d, start, start + length)

    def split(self, split_size_or_sections, dim=0):
        d = self._dim(dim, "split")
        n = self.shape[d]
        if isinstance(split_size_or_sections, int):
            if split_size_or_sections <= 0:
                raise RuntimeError(f"split: split_size must be positive, got {split_size_or_sections}")
            sizes = [min(split_size_or_sections, n - i) for i in range(0, n, split_size_or_sections)]
        else:
            sizes = list(split_size_or_sections)
            if sum(sizes) != n:
                raise RuntimeError(f"split: sections {sizes} don't add up to {n}, the size of dim {d} of {self.shape}")
        out, start = [], 0
        for s in sizes:
            out.append(self._slice(d, start, start + s))
            start += s
        return tuple(out)

    def chunk(self, chunks, dim=0):
        n = self.shape[self._dim(dim, "chunk")]
        if chunks <= 0:
            raise RuntimeError(f"chunk: chunks must be positive, got {chunks}")
        return self.split(max(-(-n // chunks), 1), dim)

    def unflatten(self, dim, sizes):
        d = self._dim(dim, "unflatten")
        return self.reshape(*self.shape[:d], *sizes, *self.shape[d + 1:])

    def flip(self, *dims):
        """The elements in reverse order along `dims` (a gather of a reversed index per axis, so a copy, as torch)."""
        out = self
        for d in self._dims(dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims, "flip"):
            index = arange(self.shape[d] - 1, -1, -1, device=self.device)
            out = out[(slice(None),) * d + (index,)]
        return out

    def roll(self, shifts, dims=None):
        """Elements shifted cyclically by `shifts` along `dims` (flattened first when dims is None, as torch)."""
        if dims is None:
            return self.reshape(-1).roll(shifts, 0).reshape(*self.shape)
        shifts = shifts if isinstance(shifts, (tuple, list)) else (shifts,)
        dims = dims if isinstance(dims, (tuple, list)) else (dims,)
        if len(shifts) != len(dims):
            raise ValueError(f"roll: {len(shifts)} shifts for {len(dims)} dims")
        from .factory import cat
        out = self
        for shift, dim in zip(shifts, dims):
            d = self._dim(dim, "roll")
            n = self.shape[d]
            k = shift % n if n else 0
            if k:
                out = cat([out._slice(d, n - k, n), out._slice(d, 0, n - k)], d)
        return out

    def repeat(self, *sizes):
        """The tensor tiled sizes[i] times along each axis (new leading axes where sizes is longer), as torch."""
        sizes = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else sizes
        if len(sizes) < self.ndim:
            raise RuntimeError(f"repeat: {len(sizes)} sizes for a {self.ndim}-D tensor: give at least {self.ndim}")
        x = self.reshape(*(1,) * (len(sizes) - self.ndim), *self.shape)
        tiled = x.reshape(*[v for s in x.shape for v in (1, s)])  # (1, s0, 1, s1, ...) -> (r0, s0, r1, s1, ...)
        tiled = tiled.expand(*[v for r, s in zip(sizes, x.shape) for v in (r, s)])
        return tiled.reshape(*[r * s for r, s in zip(sizes, x.shape)])

    def repeat_interleave(self, repeats, dim=None):
        """Each element repeated `repeats` (an int) times in place along `dim` (flattened when None)."""
        if not isinstance(repeats, int):
            raise NotImplementedError("repeat_interleave: only an int number of repeats is supported")
        if dim is None:
            return self.reshape(-1).repeat_interleave(repeats, 0)
        d = self._dim(dim, "repeat_interleave")
        x = self.unsqueeze(d + 1)
        return x.expand(*x.shape[:d + 1], repeats, *x.shape[d + 2:]).reshape(
            *self.shape[:d], self.shape[d] * repeats, *self.shape[d + 1:])

    def unfold(self, dimension, size, step):
        """Every window of `size` elements along `dimension`, `step` apart, as a new last axis (torch's
        Tensor.unfold): one GATHER by the windows' positions, so overlapping windows' gradients add up."""
        d = self._dim(dimension, "unfold")
        n = self.shape[d] if self.ndim else 1
        if not (isinstance(size, int) and isinstance(step, int)) or size < 0 or step <= 0 or size > n:
            raise RuntimeError(f"unfold: size {size} and step {step} do not fit dimension {d} of size {n} (shape "
                               f"{self.shape}): need 0 <= size <= {n} and step > 0")
        x = self if self.ndim else self.reshape(1)
        starts = arange(0, n - size + 1, step, device=self.device).reshape(-1, 1)
        windows = x[(slice(None),) * d + (starts + arange(size, device=self.device).reshape(1, -1),)]
        if not self.ndim:
            return windows.reshape(size)
        return windows.permute(*range(d + 1), *range(d + 2, windows.ndim), d + 1)

    def diagonal(self, offset=0, dim1=0, dim2=1):
        """The diagonal of the (dim1, dim2) planes, offset above (>0) or below (<0) the main one, as the last axis:
        the plane flattened and sliced with a step of (columns + 1), a view."""
        d1, d2 = self._dim(dim1, "diagonal"), self._dim(dim2, "diagonal")
        rest = [i for i in range(self.ndim) if i not in (d1, d2)]
        x = self.permute(*rest, d1, d2)
        rows, cols = x.shape[-2:]
        n = max(0, min(rows, cols - offset) if offset >= 0 else min(rows + offset, cols))
        start = offset if offset >= 0 else -offset * cols
        flat = x.reshape(*x.shape[:-2], rows * cols)
        if n == 0:
            return flat._slice(flat.ndim - 1, 0, 0)
        return flat._slice(flat.ndim - 1, start, start + (n - 1) * (cols + 1) + 1, cols + 1)

    def tril(self, diagonal=0): return self._triangle(diagonal, lower=True)
    def triu(self, diagonal=0): return self._triangle(diagonal, lower=False)

    def _triangle(self, k, lower):
        if self.ndim < 2:
            raise RuntimeError(f"{'tril' if lower else 'triu'}: needs at least 2 dims, got shape {self.shape}")
        r, c = self.shape[-2:]
        rows = arange(r, device=self.device).reshape(r, 1)
        cols = arange(c, device=self.device).reshape(1, c)
        keep = (cols <= rows + k) if lower else (cols >= rows + k)
        return keep.where(self, self._as(0, self.dtype))

    def __getitem__(self, index):
        from .indexing import getitem
        return getitem(self, index)

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def _broadcast_shape(shapes, name):
    """np.broadcast_shapes' result, without the arrays it makes to find it."""
    out = [1] * max((len(s) for s in shapes), default=0)
    for s in shapes:
        for i, d in enumerate(s, len(out) - len(s)):
            if d != out[i]:
                if out[i] == 1:
                    out[i] = d
                elif d != 1:
                    raise ValueError(f"{name}: shapes {' and '.join(str(tuple(s)) for s in shapes)} cannot be "
                                     "broadcast together: sizes must match or be 1, aligned from the last axis")
    return tuple(out)


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad=False):
    if end is None:
        start, end = 0, start
    floats = any(isinstance(v, float) for v in (start, end, step))
    dtype = dt.to_dtype(dtype) if dtype is not None else dt.float32 if floats else dt.int64
    return Tensor(np.arange(start, end, step), dtype=dtype, device=device, requires_grad=requires_grad)


def _numpy_names(method):
    """torch also takes NumPy's names, axis= for dim= and keepdims= for keepdim=, wherever a method has a dim."""
    @functools.wraps(method)
    def accepting(*args, **kwargs):
        if not kwargs:  # the common call: nothing to rename
            return method(*args)
        for numpy_name, name in (("axis", "dim"), ("keepdims", "keepdim")):
            if numpy_name in kwargs:
                if name in kwargs:
                    raise TypeError(f"{method.__name__}: got both {name}= and its alias {numpy_name}=")
                kwargs[name] = kwargs.pop(numpy_name)
        return method(*args, **kwargs)
    return accepting


for _name, _method in list(vars(Tensor).items()):
    if inspect.isfunction(_method) and "dim" in inspect.signature(_method).parameters:
        setattr(Tensor, _name, _numpy_names(_method))
