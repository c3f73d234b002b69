"""nn.Module with torch's bookkeeping: parameters are found by walking attributes, names are dotted paths."""
from collections import OrderedDict

import numpy as np

from .. import dtype as dt
from ..complex import ComplexTensor, from_numpy as complex_from_numpy
from ..factory import zeros_like
from ..realizer import realize
from ..tensor import Tensor, host_array, to_args


class Parameter(Tensor):
    """A Tensor that a Module registers as a parameter (requires grad by default); of complex data, a
    ComplexParameter (a complex tensor that is a Parameter)."""
    def __new__(cls, data=None, requires_grad=True):
        if cls is Parameter and (isinstance(data, Tensor) and data.is_complex() or np.iscomplexobj(data)):
            return object.__new__(ComplexParameter)
        return object.__new__(cls)

    def __init__(self, data, requires_grad=True):
        data = data.detach().numpy() if isinstance(data, Tensor) else data
        super().__init__(data, requires_grad=requires_grad, dtype=None if isinstance(data, np.ndarray) else "float")


class ComplexParameter(ComplexTensor, Parameter):
    """A complex Parameter: state_dict, load_state_dict, tinyllm.save / load take it as any other, and the optimizers
    update it as torch's do: view_as_real(param) with view_as_real(grad), the state complex tensors."""
    def __init__(self, data, requires_grad=True):
        z = complex_from_numpy(data.detach().numpy() if isinstance(data, Tensor) else np.asarray(data))
        self._node, self.device, self._grad = z._node, z.device, None
        self.is_leaf, self.requires_grad = True, False
        self.requires_grad_(requires_grad)


class Module:
    training = True

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def named_children(self):
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value

    def children(self):
        return (m for _, m in self.named_children())

    def named_modules(self, prefix="", remove_duplicate=True):
        """This module and every one under it, depth first, by dotted path. A module reached twice (shared, or
        through a cycle) is listed once, under its first path, unless remove_duplicate=False, as torch."""
        stack, seen = [(prefix, self)], set()
        while stack:  # iterative: deep stacks of modules are fine
            name, mod = stack.pop()
            if remove_duplicate:
                if id(mod) in seen:
                    continue
                seen.add(id(mod))
            yield name, mod
            kids = [(f"{name}.{n}" if name else n, m) for n, m in mod.named_children()]
            stack.extend(reversed(kids))

    def modules(self):
        return (m for _, m in self.named_modules())

    def named_parameters(self):
        seen = set()
        for mod_name, mod in self.named_modules():
            for name, value in vars(mod).items():
                if isinstance(value, Parameter) and id(value) not in seen:
                    seen.add(id(value))  # a tied weight is listed once, under its first name
                    yield (f"{mod_name}.{name}" if mod_name else name), value

    def parameters(self):
        """An iterator over the parameters, each once, as torch's (`list(model.parameters())` for a list)."""
        return (p for _, p in self.named_parameters())

    def register_buffer(self, name, tensor, persistent=True):
        """Keep `tensor` (a Tensor, or None for a slot filled later) as the attribute `name`, as torch's: a buffer is
        state that is not trained: not in parameters(), but moved and cast by to()/half()/... with the parameters
        (floating-point buffers take a new dtype, others keep theirs) and, when persistent, saved by state_dict()
        and restored by load_state_dict(). persistent=False keeps it out of the state dict (a cache that can be
        recomputed, as Hugging Face's rotary inv_freq). Assigning `self.name = t` later replaces the buffer."""
        where = f"{type(self).__name__}.register_buffer"
        if not isinstance(name, str):
            raise TypeError(f"{where}: buffer name should be a string, got {type(name).__name__}")
        if not name or "." in name:
            raise KeyError(f"{where}: buffer name {name!r} must be non-empty and have no '.' (dots separate modules "
                           "in state_dict names)")
        buffers = vars(self).get("_buffer_names", {})
        if name not in buffers and hasattr(self, name):
            raise KeyError(f"{where}: attribute {name!r} already exists: pick another name, or delete it first")
        if isinstance(tensor, Parameter):
            raise TypeError(f"{where}: {name!r} is a Parameter: assign it as an attribute (self.{name} = p) to "
                            "register a parameter; a buffer is a plain Tensor (use p.detach())")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"{where}: cannot assign {type(tensor).__name__} object to buffer {name!r} (a tinyllm "
                            "Tensor or None required): wrap it, e.g. tinyllm.tensor(array)")
        self._buffer_names = {**buffers, name: bool(persistent)}  # name -> persistent; the value is the attribute
        setattr(self, name, tensor)

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        """(dotted name, tensor) of every buffer (registered with register_buffer, persistent or not, and not None)
        of this module and, with recurse, every module under it, as torch's; a tensor held twice is listed once
        unless remove_duplicate=False."""
        mods = self.named_modules(prefix=prefix) if recurse else [(prefix, self)]
        seen = set()
        for mod_name, mod in mods:
            for name, value in mod._own_buffers():
                if remove_duplicate:
                    if id(value) in seen:
                        continue
                    seen.add(id(value))
                yield (f"{mod_name}.{name}" if mod_name else name), value

    def buffers(self, recurse=True):
        """An iterator over the buffers (named_buffers' tensors), as torch's."""
        return (b for _, b in self.named_buffers(recurse=recurse))

    def _own_buffers(self, persistent_only=False):
        """(name, tensor) of this module's own buffers that are set (not None), in the order they were registered."""
        for name, persistent in vars(self).get("_buffer_names", {}).items():
            value = vars(self).get(name)
            if isinstance(value, Tensor) and (persistent or not persistent_only):
                yield name, value

    def apply(self, fn):
        """fn(module) for every module under this one, children first, then this one (torch's order); returns self."""
        stack = [(self, False)]
        while stack:  # iterative post-order: each module's children (in order) before it
            m, children_done = stack.pop()
            if children_done:
                fn(m)
            else:
                stack.append((m, True))
                stack.extend((c, False) for c in reversed(list(m.children())))
        return self

    def half(self):
        return self.to(dtype="float16")

    def bfloat16(self):
        return self.to(dtype="bfloat16")

    def float(self):
        return self.to(dtype="float32")

    def double(self):
        return self.to(dtype="float64")

    def extra_repr(self):
        """The module's own settings, shown in its repr (torch's hook): e.g. Linear's sizes."""
        return ""

    def __repr__(self):
        """The module tree as torch prints it: each child on its own line under its name, with its settings."""
        lines = [f"({name}): " + repr(child).replace("\n", "\n  ") for name, child in self.named_children()]
        extra = self.extra_repr()
        if not lines:
            return f"{type(self).__name__}({extra})"
        head = [extra] if extra else []
        return f"{type(self).__name__}(\n  " + "\n  ".join(head + lines) + "\n)"

    def state_dict(self):
        """Every parameter and persistent buffer by dotted name, a module's parameters before its buffers, as torch
        orders them (tied weights under each of their names, as torch)."""
        out = OrderedDict()
        for mod_name, mod in self.named_modules(remove_duplicate=False):
            own = [(n, v) for n, v in vars(mod).items() if isinstance(v, Parameter)]
            for name, value in own + list(mod._own_buffers(persistent_only=True)):
                out[f"{mod_name}.{name}" if mod_name else name] = value
        return out

    def load_state_dict(self, state, strict=True):
        """Copy values (Tensors, NumPy arrays or anything with .numpy()/.detach()) into the parameters and
        persistent buffers (each keeps its dtype and device). All or nothing, as torch: every key and shape is
        checked before any of them changes."""
        own = self.state_dict()
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        arrays = {name: host_array(value) for name, value in state.items() if name in own}
        problems = []  # every problem in one error, as torch lists them (shapes are checked even when not strict)
        if strict and missing:
            problems.append("Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing) + ".")
        if strict and unexpected:
            problems.append("Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected) + ".")
        problems += [f"size mismatch for {name}: copying a param with shape {tuple(array.shape)} from the state dict, "
                     f"the shape in the current model is {own[name].shape}." for name, array in arrays.items()
                     if tuple(array.shape) != own[name].shape]
        if problems:
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}:\n\t" + "\n\t".join(problems))
        for name, array in arrays.items():
            own[name].copy_(array)
        return missing, unexpected

    def train(self, mode=True):
        for m in self.modules():
            m.training = mode
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self, set_to_none=True):
        for p in self.parameters():
            if p.grad is not None:
                p.grad = None if set_to_none else zeros_like(p.grad)

    def to(self, *args, device=None, dtype=None):
        """Move and/or cast every parameter (and its gradient) in place, as torch: model.to("cpu"),
        model.to(tinyllm.float64), model.to(device=..., dtype=...). The Parameter objects stay the same, so an
        optimizer built before still holds them. Only floating-point dtypes, as torch. Buffers move too, and take
        the dtype when they are floating-point (an int64 buffer stays int64), as torch's: each becomes a new
        tensor (torch's buffers are replaced, not updated in place)."""
        device, dtype = to_args(args, device, dtype)
        if dtype is not None and not dt.to_dtype(dtype).is_float:
            raise TypeError(f"Module.to: parameters can only take floating-point dtypes, got {dt.to_dtype(dtype).name}")
        for p in self.parameters():
            moved = p.detach().to(device=device, dtype=dtype)
            realize(moved)
            p.device, p.node = moved.device, moved.node  # the new buffer, keeping identity and requires_grad
            if p.grad is not None:
                p.grad = p.grad.to(device=device, dtype=dtype)
        moved = {}  # id of a buffer -> its moved tensor: a buffer shared by two modules stays shared
        for mod in self.modules():
            for name, buf in list(mod._own_buffers()):
                if id(buf) not in moved:
                    out = buf.detach().to(dtype=dtype if buf.dtype.is_float else None, device=device)
                    realize(out)
                    moved[id(buf)] = out
                setattr(mod, name, moved[id(buf)])
        return self

    def num_parameters(self):
        return sum(p.numel() for p in self.parameters())

    def requires_grad_(self, requires_grad=True):
        """Set requires_grad on every parameter, as torch: requires_grad_(False) freezes the module (a tied
        parameter is one object, so it stays tied)."""
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self


class ModuleList(Module):
    def __init__(self, modules=()):
        self._items = []
        for m in modules:
            self.append(m)

    def append(self, module):
        setattr(self, str(len(self._items)), module)
        self._items.append(module)
        return self

    def __getitem__(self, i):
        return self._items[i]

    def __len__(self):
        return len(self._items)

    def __iter__(self):
        return iter(self._items)


class Sequential(ModuleList):
    def __init__(self, *modules):
        super().__init__(modules)

    def forward(self, x):
        for m in self:
            x = m(x)
        return x


class ModuleDict(Module):
    def __init__(self, modules=None):
        for name, m in (modules or {}).items():
            setattr(self, name, m)

    def __getitem__(self, name):
        return getattr(self, name)
