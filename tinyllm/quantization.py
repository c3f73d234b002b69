"""Quantization for inference: `quantize_(model, "int8" | "int4")` swaps every nn.Linear for a QuantizedLinear
(weight-only; with dynamic=True the activations are quantized to int8 at run time too, torch's dynamic quantization)
(docs/architecture.md, "Quantized weights"; the formats are defined in tinyllm/ops/qmatmul.py). Quantized weights are
frozen: asking them for a gradient (requires_grad_, an optimizer) is an error, but a quantized model can be the base of
a LoRA adapter.

`save(model, path)` / `load(model, path)` keep a quantized model in a safetensors file: each QuantizedLinear as
`<name>.weight` (int8 / uint8) and `<name>.weight_scale` (float16), every parameter as itself, and in the metadata
the format and group size of each quantized layer.
"""
import json

import numpy as np

from . import dtype as dt
from .graph import build
from .nn.layers import Embedding, Linear
from .nn.module import Module, ModuleList, Parameter
from .ops.qmatmul import FORMATS, check_format, dequantize, quantize, storage_shapes  # noqa: F401 (public here)
from .tensor import Tensor, no_grad
from .utils import safetensors

FILE_FORMAT = "tinyllm.quantized/1"


class QuantizedWeight(Tensor):
    """The frozen storage of a quantized weight (the packed values, or their scales): asking it for a gradient
    is an error that says what to do instead."""
    __slots__ = ()

    def requires_grad_(self, requires_grad=True):
        if requires_grad:
            raise RuntimeError(f"requires_grad_: this {self.dtype.name} {self.shape} tensor is part of a quantized "
                               "weight, which is frozen (QMATMUL passes gradients to its input only): train an "
                               "adapter (LoRA) beside the layer, or leave the layer out of quantize_ to train it")
        return super().requires_grad_(False)

    def __repr__(self):  # short, so an optimizer's error message shows it whole
        return f"<frozen quantized weight {self.dtype.name} {self.shape}>"


class QuantizedLinear(Module):
    """nn.Linear with a quantized weight: y = x · dequant(W)ᵀ + b through one QMATMUL. Buffers `weight` (int8
    (out, in), or uint8 (out, in/2) for int4) and `weight_scale` (float16 (out, in/group_size)); `bias` is the
    float32 Parameter of the layer it replaced. Inputs (..., in_features) of any float dtype are computed in
    float32 (QMATMUL's contract) and the output is float32. dynamic=True quantizes each input row to int8 at run
    time, per group of the weight's (one float32 scale each: torch's dynamic quantization, llama.cpp's CPU kernels):
    the products are then exact integer dot products, which CPUs with byte dot-product instructions (AVX512_VNNI)
    run several times faster; the price is the inputs' rounding, about max|x_group| / 254 per element.

    in_features need not be a multiple of group_size: the weight is stored zero-padded to whole groups (`in` above
    is then in_features rounded up to a multiple of group_size), the last group's scale is computed over its real
    columns only, and the matmul reads the real columns only (tinyllm/ops/qmatmul.py)."""

    def __init__(self, in_features, out_features, qweight, scales, fmt, group_size, bias=None, dynamic=False):
        check_format(fmt, group_size, "QuantizedLinear")
        qshape, qdtype, sshape = storage_shapes(fmt, out_features, in_features, group_size)
        qweight, scales = np.asarray(qweight), np.asarray(scales)
        if qweight.shape != qshape or qweight.dtype != qdtype.np or scales.shape != sshape or \
                scales.dtype != np.float16:
            raise ValueError(f"QuantizedLinear({in_features}, {out_features}, {fmt}, group {group_size}) stores "
                             f"{qdtype.name} {qshape} and float16 {sshape}, got {qweight.dtype} {qweight.shape} and "
                             f"{scales.dtype} {scales.shape}")
        self.in_features, self.out_features, self.fmt, self.group_size = in_features, out_features, fmt, group_size
        self.dynamic = bool(dynamic)
        device = bias.device if bias is not None else None
        self.weight = QuantizedWeight(qweight, device=device)
        self.weight_scale = QuantizedWeight(scales, device=device)
        self.bias = bias

    @classmethod
    def from_linear(cls, linear, fmt, group_size=32, dynamic=False):
        check_format(fmt, group_size, "QuantizedLinear.from_linear")
        with no_grad():
            w = linear.weight.detach().float().numpy()
        q, s = quantize(w, fmt, group_size)
        out = cls(linear.in_features, linear.out_features, q, s, fmt, group_size, linear.bias, dynamic)
        out.training = linear.training
        return out

    def dequantized_weight(self):
        """The float32 (out, in) weight the layer computes with (for checks and export)."""
        return dequantize(self.weight.numpy(), self.weight_scale.numpy(), self.fmt, self.group_size, self.in_features)

    def nbytes(self):
        """Bytes of the weight's storage (values and scales)."""
        return self.weight.numel() * self.weight.dtype.itemsize + self.weight_scale.numel() * 2

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.fmt}, " \
               f"group_size={self.group_size}, bias={self.bias is not None}" + ", dynamic=True" * self.dynamic

    def __repr__(self):
        return f"QuantizedLinear({self.extra_repr()})"

    def _follow(self, device):
        """Buffers move with the input (Module.to moves parameters only)."""
        if self.weight.device != device:
            self.weight = QuantizedWeight(self.weight.numpy(), device=device)
            self.weight_scale = QuantizedWeight(self.weight_scale.numpy(), device=device)

    def forward(self, x):
        if x.shape[-1] != self.in_features:
            raise RuntimeError(f"QuantizedLinear: input of shape {x.shape} has {x.shape[-1]} features, the layer "
                               f"expects {self.in_features}")
        self._follow(x.device)
        lead = x.shape[:-1]
        x2 = x.float().reshape(-1, self.in_features)
        node = build("QMATMUL", x2.node, self.weight.node, self.weight_scale.node,
                     arg=(self.fmt, self.group_size, self.in_features) + ("int8",) * self.dynamic)
        y = x2._make(node).reshape(*lead, self.out_features)
        return y if self.bias is None else y + self.bias


def _linear_slots(model):
    """(parent module, attribute, dotted name) of every Linear or QuantizedLinear held by an attribute, each
    parent once."""
    for prefix, mod in model.named_modules():
        for attr, value in list(vars(mod).items()):
            if isinstance(value, (Linear, QuantizedLinear)):
                yield mod, attr, f"{prefix}.{attr}" if prefix else attr


def _refuse_adapters(model, what):
    """quantize_ and load replace layers, which would drop a LoRA adapter (tinyllm.nn.lora) or leave its float base
    unquantized: they refuse a model that has one."""
    names = [n for n, m in model.named_modules() if hasattr(m, "lora_A")]
    if names:
        raise RuntimeError(f"{what}: {names[0]} ({len(names)} layers in all) has a LoRA adapter: quantize or load the "
                           "base model first, then lora.apply (QLoRA: the adapters train over the quantized base) and "
                           "lora.load its adapters")


def _tied_to_embedding(model):
    """ids of the Parameters that are also an Embedding's weight (GPT's lm_head shares wte's)."""
    return {id(m.weight) for m in model.modules() if isinstance(m, Embedding)}


def _swap(parent, attr, new):
    old = getattr(parent, attr)
    setattr(parent, attr, new)
    if isinstance(parent, ModuleList):  # (its items are kept in a list too)
        parent._items = [new if m is old else m for m in parent._items]


def quantize_(model, fmt, group_size=32, embedding=False, dynamic=False):
    """Replace, in place, every nn.Linear of `model` by a QuantizedLinear of format `fmt` ("int8" or "int4")
    with one scale per `group_size` input features (a positive int; int4 needs it even). A layer whose in_features
    is not a multiple of group_size is stored padded: its weight zero-padded to a whole number of groups, the last
    group's scale computed over its real columns only (QuantizedLinear). A Linear whose weight is tied to an
    Embedding's (GPT's lm_head) is quantized only with embedding=True: then the logits' matmul reads a quantized copy
    while the embedding lookup keeps the float32 table (the tie is cut: the two no longer share updates). dynamic=True
    also quantizes the layers' inputs to int8 at run time (QuantizedLinear: faster on CPUs with byte dot-product
    instructions, at the inputs' rounding). All or nothing: the arguments and the model are checked before any layer
    changes. Returns the model."""
    check_format(fmt, group_size, "quantize_")
    _refuse_adapters(model, "quantize_")
    slots = list(_linear_slots(model))
    done = [name for parent, attr, name in slots if isinstance(getattr(parent, attr), QuantizedLinear)]
    if done:
        q = getattr(*next((p, a) for p, a, n in slots if n == done[0]))
        raise RuntimeError(f"quantize_: the model is already quantized ({done[0]} is {q.fmt}, group {q.group_size}; "
                           f"{len(done)} layers in all): quantizing again would round the rounded weights; "
                           "quantize a float32 copy of the model instead")
    if not slots:
        raise ValueError(f"quantize_: {type(model).__name__} has no nn.Linear layer to quantize: quantize_ replaces "
                         "Linear layers (give the model, or a module that holds them)")
    tied = _tied_to_embedding(model)
    todo = [(p, a, n) for p, a, n in slots if embedding or id(getattr(p, a).weight) not in tied]
    if not todo:
        raise ValueError(f"quantize_: {type(model).__name__}'s only Linear layers are tied to an embedding: pass "
                         "embedding=True to quantize them too")
    made = {}  # id(Linear) -> its QuantizedLinear: a layer held twice stays one layer
    for parent, attr, name in todo:  # every layer quantized (which can fail: inf or NaN) before any is swapped
        linear = getattr(parent, attr)
        if id(linear) not in made:
            try:
                made[id(linear)] = QuantizedLinear.from_linear(linear, fmt, group_size, dynamic)
            except ValueError as e:
                raise ValueError(f"{e} (layer {name}, {linear.weight.shape})") from None
    for parent, attr, name in todo:
        _swap(parent, attr, made[id(getattr(parent, attr))])
    return model


def quantized_layers(model):
    """name -> QuantizedLinear of a model."""
    return {n: getattr(p, a) for p, a, n in _linear_slots(model) if isinstance(getattr(p, a), QuantizedLinear)}


def model_nbytes(model):
    """Bytes of a model's weights as stored: parameters (each shared one once) and quantized buffers."""
    layers = {id(q): q for q in quantized_layers(model).values()}
    return sum(p.numel() * p.dtype.itemsize for p in model.parameters()) + \
        sum(q.nbytes() for q in layers.values())


def save(model, path):
    """Write a (quantized) model to a safetensors file: its parameters by state_dict name (a tied parameter once,
    the other names recorded as aliases) and each QuantizedLinear's buffers, with their formats in the metadata."""
    tensors, aliases, first = {}, {}, {}
    for name, p in model.state_dict().items():
        if id(p) in first:
            aliases[name] = first[id(p)]
            continue
        first[id(p)] = name
        tensors[name] = p
    layers = {}
    for name, q in quantized_layers(model).items():
        tensors[f"{name}.weight"], tensors[f"{name}.weight_scale"] = q.weight.numpy(), q.weight_scale.numpy()
        layers[name] = [q.fmt, q.group_size, q.in_features, q.out_features] + [True] * q.dynamic
    metadata = {"format": FILE_FORMAT, "quantized": json.dumps(layers, sort_keys=True),
                "aliases": json.dumps(aliases, sort_keys=True)}
    safetensors.save_file(tensors, path, metadata=metadata)  # (a bfloat16 parameter is stored as BF16)


def load(model, path):
    """Load a file written by `save` into `model`, a model of the same architecture, float32 or quantized alike:
    its Linear layers named in the file become QuantizedLinear layers holding the file's values, its parameters
    take the file's values. All or nothing: every name, shape and dtype is checked before anything changes.
    Returns the model."""
    metadata = safetensors.load_metadata(path)
    if metadata.get("format") != FILE_FORMAT:
        raise ValueError(f"{path}: not a tinyllm quantized checkpoint (metadata format {metadata.get('format')!r}, "
                         f"expected {FILE_FORMAT!r}): write it with tinyllm.quantization.save")
    _refuse_adapters(model, "load")
    layers, aliases = json.loads(metadata["quantized"]), json.loads(metadata["aliases"])
    header = safetensors.load_header(path)
    slots = {n: (p, a) for p, a, n in _linear_slots(model)}
    missing = [n for n in layers if n not in slots]
    if missing:
        raise RuntimeError(f"load: {path} quantizes layers {missing} that the model has no Linear at")
    for name, (fmt, g, k, n, *_) in layers.items():
        layer = getattr(*slots[name])
        if (layer.in_features, layer.out_features) != (k, n):
            raise ValueError(f"load: layer {name} is ({layer.out_features}, {layer.in_features}) in the model but "
                             f"({n}, {k}) in {path}")
        qshape, qdtype, sshape = storage_shapes(fmt, n, k, g)
        want = {f"{name}.weight": ({"int8": "I8", "uint8": "U8"}[qdtype.name], qshape),
                f"{name}.weight_scale": ("F16", sshape)}
        for key, spec in want.items():
            if header.get(key) != spec:
                raise ValueError(f"load: {path} holds {key} as {header.get(key)}, expected {spec}: corrupt file")
    extra = sorted(set(quantized_layers(model)) - set(layers))
    if extra:
        raise RuntimeError(f"load: the model's layers {extra} are quantized but {path} holds them unquantized: "
                           "load into a float32 model")
    own = {}  # the parameters the model has once the layers are swapped: the Linear weights the file quantizes go
    for mod_name, mod in model.named_modules(remove_duplicate=False):
        for attr, value in vars(mod).items():
            if isinstance(value, Parameter):
                full = f"{mod_name}.{attr}" if mod_name else attr
                if attr == "weight" and isinstance(mod, Linear) and mod_name in layers:
                    continue
                own[full] = value
    buffers = {f"{q}.{b}" for q in layers for b in ("weight", "weight_scale")}
    stored = set(header) - buffers
    expected = {n for n in own if n not in aliases}
    if stored != expected:
        raise RuntimeError(f"load: {path} does not match the model: missing {sorted(expected - stored)}, "
                           f"unexpected {sorted(stored - expected)}")
    untied = [a for a, b in aliases.items() if own.get(a) is not own.get(b)]
    if untied:
        raise RuntimeError(f"load: {path} stores {untied[0]} as the same tensor as {aliases[untied[0]]}, but in the "
                           "model they are not tied")
    for name in stored:
        p = own[name]
        if header[name][1] != p.shape:
            raise ValueError(f"load: {name} has shape {header[name][1]} in {path} but {p.shape} in the model")
    arrays = safetensors.load_file(path)
    made = {}
    for name, (fmt, g, k, n, *dynamic) in layers.items():
        parent, attr = slots[name]
        layer = getattr(parent, attr)
        if id(layer) not in made:
            made[id(layer)] = QuantizedLinear(k, n, arrays[f"{name}.weight"], arrays[f"{name}.weight_scale"], fmt,
                                              g, layer.bias, bool(dynamic and dynamic[0]))
        _swap(parent, attr, made[id(layer)])
    with no_grad():
        for name in stored:
            value = arrays[name]
            own[name].copy_(dt.decode(value, dt.bfloat16) if header[name][0] == "BF16" else value)
    return model
