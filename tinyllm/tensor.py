"""Tensor: the user's API, with PyTorch's names and semantics. It only builds graph nodes; values are computed
when something needs them (.numpy(), .item(), .backward(), an optimizer step, or tinyllm.realize)."""
import functools
import inspect
import math

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
from .mixins import MaxResult, TensorLike, arange, broadcast_shape  # noqa: F401  (MaxResult, arange: Tensor's names)
from .mixins.arithmetic import Arithmetic
from .mixins.cumulative import Cumulative
from .mixins.host import HostOps
from .mixins.indexing import Indexing
from .mixins.math_ops import MathOps
from .mixins.movement import Movement
from .mixins.products import Products
from .mixins.random import RandomFills
from .mixins.reduce import Reduce
from .mixins.scatter import Scatter
from .mixins.sorting import Sorting

_grad_enabled = [True]
_grad_leaves = WeakValues()  # LOAD node of a leaf that requires grad -> its Tensor
# fn(leaves whose .grad this backward updated) -> more leaves whose .grad fn set, run before the gradients are
# realized: a hook may replace a leaf's lazy .grad (data parallel training all-reduces it, tinyllm/nn/parallel.py)
grad_ready_hooks = []


class no_grad:
    """Context manager (and decorator) under which ops record no gradient, as torch.no_grad."""
    def __enter__(self):
        _grad_enabled.append(False)

    def __exit__(self, *exc):
        _grad_enabled.pop()

    def __call__(self, fn):
        @functools.wraps(fn)  # keeps fn's name, docstring and signature (inspect.signature follows __wrapped__)
        def wrapped(*args, **kwargs):
            with self._fresh():  # a context of its own per call: calls may nest or run on other threads
                return fn(*args, **kwargs)
        return wrapped

    def _fresh(self):
        return no_grad()


class inference_mode(no_grad):
    """torch.inference_mode: no gradients recorded (mode=False: no change). torch also skips its version counters
    there; a lazy graph has none, so this is no_grad."""
    def __init__(self, mode=True):
        self.mode = mode

    def __enter__(self):
        _grad_enabled.append(False if self.mode else _grad_enabled[-1])

    def _fresh(self):
        return inference_mode(self.mode)


def is_grad_enabled():
    return _grad_enabled[-1]


def to_args(args, device=None, dtype=None):
    """(device, dtype) of .to()'s positional arguments (a dtype, a device, or both) and keywords, as torch tells
    them apart: a DType, a type or "float"/"double"/"long" is a dtype, anything else a device."""
    for a in args:
        if isinstance(a, (dt.DType, type)) or (isinstance(a, str) and a in ("float", "double", "long")):
            dtype = a
        else:
            device = a
    return device, dtype


def host_array(value):
    """A NumPy array of a tinyllm Tensor (its values), a torch tensor (read without importing torch; bfloat16 as
    float32, which NumPy lacks), a NumPy array, or anything np.asarray takes."""
    if isinstance(value, Tensor):
        return value.detach().numpy()
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor
        value = value.detach().cpu()
        return (value.float() if "bfloat16" in str(value.dtype) else value).numpy()
    return np.asarray(value)


def _device_name(device):
    return get_runtime(device).name


class Tensor(Arithmetic, MathOps, Reduce, Movement, Indexing, Scatter, Sorting, Cumulative, Products, HostOps,
             RandomFills):
    """A lazy tensor: its core is here (the node behind it, values, in-place updates, devices, autograd, building
    ops); its methods by topic come from the mixins (tinyllm/mixins/)."""
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
        if requires_grad and not self._node.dtype.is_float:  # (a complex tensor's node: its float (re, im) pairs)
            raise RuntimeError(f"requires_grad_: only floating-point tensors can require gradients, not {self.dtype.name}")
        if record.watchers and bool(requires_grad) != self.requires_grad:  # a jit Tape that reads it as a constant
            record.replaced(self._node)  # computes no gradient for it: it must be recorded again
        self.requires_grad = False
        if requires_grad:
            if self._node.op != "LOAD":
                realize(self)  # a leaf that requires grad gets a buffer of its own
            self.requires_grad = True
            _grad_leaves[self._node] = self
        return self

    # ---- what the tensor is ----
    shape = property(lambda self: self._node.shape)
    dtype = property(lambda self: self._node.dtype)
    ndim = property(lambda self: len(self._node.shape))
    T = property(lambda self: self.permute(*reversed(range(self.ndim))))
    mT = property(lambda self: self.transpose(-2, -1))
    grad_fn = property(lambda self: None if self.is_leaf else self._node.op)

    def dim(self): return self.ndim
    def is_complex(self): return False  # (a complex tensor is a tinyllm.complex.ComplexTensor)
    def conj(self): return self  # a real tensor is its own conjugate, as torch's

    def angle(self):
        """The argument of a real number, as torch: pi where x < 0, else 0 (NaN stays NaN; gradient 0)."""
        f = self._float()
        return f.isnan().where(f.detach(), (f < 0).where(math.pi, 0.0).to(f.dtype) + f * 0)
    real = property(lambda self: self)

    @property
    def imag(self):
        raise RuntimeError("imag is not implemented for tensors with non-complex dtypes.")
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

    # ---- values ----
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
        from .mixins.scatter import put
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
        device, dtype = to_args(args, device, dtype)
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

    # ---- autograd ----
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

    # ---- building ops ----
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
        shape = broadcast_shape([t.shape for t in ts], name)
        return [t if t.shape == shape and t.dtype is dtype else t.to(dtype).expand(*shape) for t in ts]

    def _binary(self, op, other, reverse=False, name=None):
        a, b = self._broadcast(other, name=name or op.lower())
        if reverse:
            a, b = b, a
        return a._make(build(op, a._node, b._node), b)


def keyword_aliases(**aliases):
    """Decorator: the function also takes alias= for its keyword name=, {alias: name}: torch's habit of taking NumPy's
    names (axis= for dim=), and an argument's old name kept working after a rename. Both given is an error."""
    def wrap(fn):
        label = fn.__qualname__.split(".")[0] if fn.__name__ == "__init__" else fn.__name__

        @functools.wraps(fn)
        def accepting(*args, **kwargs):
            if not kwargs:  # the common call: nothing to rename
                return fn(*args)
            for alias, name in aliases.items():
                if alias in kwargs:
                    if name in kwargs:
                        raise TypeError(f"{label}: got both {name}= and its alias {alias}=; pass {name}=")
                    kwargs[name] = kwargs.pop(alias)
            return fn(*args, **kwargs)
        return accepting
    return wrap


# torch also takes NumPy's names, axis= for dim= and keepdims= for keepdim=, wherever a method has a dim
_numpy_names = keyword_aliases(axis="dim", keepdims="keepdim")


TensorLike._Tensor = Tensor
for _name in dir(Tensor):
    _method = getattr(Tensor, _name)
    if inspect.isfunction(_method) and "dim" in inspect.signature(_method).parameters:
        setattr(Tensor, _name, _numpy_names(_method))
