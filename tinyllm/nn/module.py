"""nn.Module with torch's bookkeeping: parameters are found by walking attributes, names are dotted paths."""
from collections import OrderedDict

import numpy as np

from ..factory import zeros_like
from ..realizer import realize
from ..tensor import Tensor


class Parameter(Tensor):
    """A Tensor that a Module registers as a parameter (requires grad by default)."""
    def __init__(self, data, requires_grad=True):
        data = data.detach().numpy() if isinstance(data, Tensor) else data
        super().__init__(data, requires_grad=requires_grad, dtype=None if isinstance(data, np.ndarray) else "float")


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
        """Every parameter by dotted name (tied weights under each of their names, as torch)."""
        out = OrderedDict()
        for mod_name, mod in self.named_modules(remove_duplicate=False):
            for name, value in vars(mod).items():
                if isinstance(value, Parameter):
                    out[f"{mod_name}.{name}" if mod_name else name] = value
        return out

    def load_state_dict(self, state, strict=True):
        """Copy values (Tensors, NumPy arrays or anything with .numpy()/.detach()) into the parameters.
        All or nothing, as torch: every key and shape is checked before any parameter changes."""
        own = self.state_dict()
        missing = [k for k in own if k not in state]
        unexpected = [k for k in state if k not in own]
        arrays = {name: _to_numpy(value) for name, value in state.items() if name in own}
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
        optimizer built before still holds them. Only floating-point dtypes, as torch."""
        for p in self.parameters():
            moved = p.detach().to(*args, device=device, dtype=dtype)
            if not moved.dtype.is_float:
                raise TypeError(f"Module.to: parameters can only take floating-point dtypes, got {moved.dtype.name}")
            realize(moved)
            p.device, p.node = moved.device, moved.node  # the new buffer, keeping identity and requires_grad
            if p.grad is not None:
                p.grad = p.grad.to(*args, device=device, dtype=dtype)
        return self

    def num_parameters(self):
        return sum(p.numel() for p in self.parameters())

    def requires_grad_(self, requires_grad=True):
        """Set requires_grad on every parameter, as torch: requires_grad_(False) freezes the module (a tied
        parameter is one object, so it stays tied)."""
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self


def _to_numpy(value):
    if isinstance(value, Tensor):
        return value.numpy()
    if hasattr(value, "detach"):  # a torch tensor, without importing torch
        value = value.detach().cpu().numpy()
    return np.asarray(value)


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
