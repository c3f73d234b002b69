"""LoRA adapters (Hu et al., 2021) on a model's Linear layers, with peft's names, so adapters move between the two.

`apply(model, r, alpha, dropout, targets)` replaces each matching nn.Linear (or QuantizedLinear: QLoRA) by a
LoRALinear computing

    y = x Wᵀ + b + (α/r) · dropout(x) Aᵀ Bᵀ,    A (r, in), B (out, r)

W and b are the layer's own frozen parameters, kept under their names (`...c_attn.weight`, so a nanoGPT or Hugging
Face state dict still loads); A (`...c_attn.lora_A.weight`) starts Kaiming-uniform(a=√5), bound 1/√in as
nn.Linear's default, and B (`...c_attn.lora_B.weight`) at zero, so the wrapped model computes what it did before
training. No new op: the adapter is two Linear layers whose gradients autograd derives, dB = (α/r)·dyᵀ h and
dA = (α/r)·(dy B)ᵀ dropout(x) with h = dropout(x) Aᵀ; W gets none (frozen), as QMATMUL gives on a quantized base.

`merge` / `unmerge` fold the update into W and out again; `save` / `load` keep the adapters alone in a
safetensors file with peft's adapter_config fields. `with disabled(model):` (peft's `disable_adapter()`) runs the
base model alone, W and b without the adapters: the frozen reference a preference loss compares the policy with,
without a second copy of the weights.
"""
import contextlib
import json
from collections import OrderedDict

import numpy as np

from .. import dtype as dt
from ..tensor import no_grad
from ..utils import safetensors
from ..utils.checks import whole_number
from . import functional as F
from .layers import Dropout, Linear
from .module import Module, Parameter
from ..quantization import QuantizedLinear  # (imports tinyllm.nn.layers and .module, already loaded)

FILE_FORMAT = "tinyllm.lora/1"


class LoRALinear(Module):
    """A Linear layer with a LoRA adapter beside it (module docstring). Holds the base layer's own `weight` and
    `bias` (the same Parameter objects: a tied weight stays tied), frozen, and trains `lora_A` and `lora_B`
    (Linear layers without bias). While `merged`, the update lives in `weight` and the adapter is skipped; while
    `disable_adapters` (set by lora.disabled), the adapter is skipped and the layer is its base alone."""

    def __init__(self, base, r=8, lora_alpha=16, lora_dropout=0.0):
        name = type(self).__name__
        if not isinstance(base, self._base_type) or isinstance(base, LoRALinear):
            raise TypeError(f"{name} wraps a {self._base_type.__name__}, got a {type(base).__name__}: use "
                            "lora.apply(model, ...), which picks the wrapper for each layer")
        _check_hyper(r, lora_alpha, lora_dropout, name)
        for attr in self._base_attrs:
            setattr(self, attr, getattr(base, attr))
        self.r, self.lora_alpha, self.scaling, self.merged = r, lora_alpha, lora_alpha / r, False
        self.disable_adapters = False
        self.lora_dropout = Dropout(lora_dropout)
        self.lora_A = Linear(self.in_features, r, bias=False)
        self.lora_B = Linear(r, self.out_features, bias=False)
        self.lora_B.weight = Parameter(np.zeros((self.out_features, r), np.float32))
        # the adapters live where the base weight does, in its dtype when that is a float one (as peft)
        dtype = self.weight.dtype if self.weight.dtype.is_float else None
        for adapter in (self.lora_A, self.lora_B):
            adapter.to(device=self.weight.device, dtype=dtype)
        self.train(base.training)

    _base_type, _base_attrs = Linear, ("in_features", "out_features", "weight", "bias")

    def _base_forward(self, x):
        return F.linear(x, self.weight, self.bias)

    def forward(self, x):
        if x.shape[-1] != self.in_features:
            raise RuntimeError(f"{type(self).__name__}: input of shape {x.shape} has {x.shape[-1]} features, the "
                               f"layer expects {self.in_features}")
        y = self._base_forward(x)
        if self.merged or self.disable_adapters:
            return y
        # (α/r) scales the r-wide hidden values, not the out-wide result: the same product, fewer multiplies
        return y + self.lora_B(self.lora_A(self.lora_dropout(x)) * self.scaling)

    def delta_weight(self):
        """(α/r)·B A, the (out, in) update the adapter adds to W, in float32."""
        return (self.lora_B.weight.detach().float() @ self.lora_A.weight.detach().float()) * self.scaling

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}, r={self.r}, " \
               f"lora_alpha={self.lora_alpha}, lora_dropout={self.lora_dropout.p}, bias={self.bias is not None}, " \
               f"merged={self.merged}"

    def __repr__(self):
        return f"{type(self).__name__}({self.extra_repr()})"


class QuantizedLoRALinear(LoRALinear, QuantizedLinear):
    """LoRA on a quantized base (QLoRA): y = x·dequant(W)ᵀ + b through QMATMUL plus the float32 adapter. Also a
    QuantizedLinear, so tinyllm.quantization's save, model_nbytes and quantize_'s "already quantized" check see its
    quantized weight. `merge` refuses it."""
    _base_type = QuantizedLinear
    _base_attrs = LoRALinear._base_attrs + ("weight_scale", "fmt", "group_size", "dynamic")

    def _base_forward(self, x):
        return QuantizedLinear.forward(self, x)

    def extra_repr(self):
        dynamic = ", dynamic=True" * self.dynamic
        return f"{LoRALinear.extra_repr(self)}, {self.fmt}, group_size={self.group_size}{dynamic}"


def _check_hyper(r, alpha, dropout, what):
    whole_number(what, "r (the adapters' rank)", r, 1, ": 4 to 64 are usual")
    if not isinstance(alpha, (int, float, np.integer, np.floating)) or isinstance(alpha, bool) or not alpha > 0:
        raise ValueError(f"{what}: alpha must be a positive number (the update is scaled by alpha / r), got "
                         f"{alpha!r}: 2·r is usual")
    if not isinstance(dropout, (int, float, np.integer, np.floating)) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"{what}: dropout must be a probability in [0, 1), got {dropout!r}")


def _matches(name, target):
    """peft's rule: a target names the module called exactly that, or whose dotted name ends in '.' + target."""
    return name == target or name.endswith("." + target)


def _available(model):
    """A line naming some of the model's Linear layers, for errors about targets."""
    names = [n for n, m in model.named_modules() if n and isinstance(m, (Linear, QuantizedLinear, LoRALinear))]
    if not names:
        return f"{type(model).__name__} has no nn.Linear layers"
    ends = sorted({n.rsplit(".", 1)[-1] for n in names})
    shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
    return f"its {len(names)} Linear layers are {shown} (last names: {', '.join(ends)})"


def _targets(targets):
    if isinstance(targets, str):
        targets = (targets,)
    try:
        targets = tuple(targets)
    except TypeError:
        targets = None
    if not targets or not all(isinstance(t, str) and t for t in targets):
        raise TypeError("lora.apply: targets must be module names or name suffixes (non-empty strings), e.g. "
                        f"('c_attn', 'c_proj') or ('q_proj', 'v_proj'), got {targets!r}")
    return targets


def apply(model, r=8, alpha=16, dropout=0.0, targets=("c_attn", "c_proj")):
    """Replace, in place, each nn.Linear or QuantizedLinear of `model` whose dotted name (model.named_modules())
    is one of `targets` or ends in '.' + one of them by a LoRALinear of rank r, scale alpha / r and `dropout` on
    the adapter's input; then freeze every parameter of the model except the adapters (as peft), so
    `lora.parameters(model)` and `[p for p in model.parameters() if p.requires_grad]` are the A and B matrices.
    A layer held at two places stays one layer. Applying again wraps more layers (never one twice); the adapters
    already there keep training. All or nothing: every target is checked before any layer changes.
    GPT's lm_head shares wte's weight: it is wrapped only if a target names it, and stays tied (frozen, the
    adapter beside it); `merge` then refuses it, since the sum would change the embedding too. Returns the model."""
    _check_hyper(r, alpha, dropout, "lora.apply")
    targets = _targets(targets)
    wrapped = tuple(f"{n}." for n in layers(model))  # an adapter's own lora_A / lora_B are never targets
    modules = [(n, m) for n, m in model.named_modules() if n and not n.startswith(wrapped)]
    chosen = {}  # id(layer) -> layer, in the model's order
    for target in targets:
        hits = [(n, m) for n, m in modules if _matches(n, target)]
        if not hits:
            raise ValueError(f"lora.apply: target {target!r} matches no module of {type(model).__name__}; "
                             f"{_available(model)}. A target matches a module named exactly so, or whose name ends "
                             f"in '.{target}'")
        for name, m in hits:
            if isinstance(m, LoRALinear):
                raise RuntimeError(f"lora.apply: {name} already has a LoRA adapter (r={m.r}); one per layer: drop "
                                   f"{target!r} from targets, or start from the unwrapped model")
            if not isinstance(m, (Linear, QuantizedLinear)):
                raise TypeError(f"lora.apply: target {target!r} matches {name}, a {type(m).__name__}; LoRA wraps "
                                f"nn.Linear and QuantizedLinear layers only: name those (e.g. the Linear layers "
                                f"inside it); {_available(model)}")
            chosen[id(m)] = m
    made = {}
    for key, layer in chosen.items():
        cls = QuantizedLoRALinear if isinstance(layer, QuantizedLinear) else LoRALinear
        made[key] = cls(layer, r, alpha, dropout)
    keep = parameters(model)  # adapters of an earlier apply keep training
    for prefix, parent in model.named_modules():
        for attr, value in list(vars(parent).items()):
            if id(value) in made:
                _swap(parent, attr, made[id(value)])
    model.requires_grad_(False)
    for p in keep + parameters(model):
        p.requires_grad_(True)
    return model


def _swap(parent, attr, new):
    old = getattr(parent, attr)
    setattr(parent, attr, new)
    items = getattr(parent, "_items", None)
    if isinstance(items, list):  # ModuleList / Sequential keep their modules in a list too
        parent._items = [new if m is old else m for m in items]


def layers(model):
    """name -> LoRALinear of a model (a layer held at two places once, under its first name)."""
    return OrderedDict((n, m) for n, m in model.named_modules() if isinstance(m, LoRALinear))


def parameters(model):
    """The adapters' parameters (each layer's lora_A.weight and lora_B.weight): what to give the optimizer."""
    return [p for m in layers(model).values() for p in (m.lora_A.weight, m.lora_B.weight)]


def state_dict(model):
    """The adapters alone: dotted name (`...c_attn.lora_A.weight`, peft's keys without its `base_model.model.`
    prefix) -> Tensor."""
    ids = {id(p) for p in parameters(model)}
    return OrderedDict((k, v) for k, v in model.state_dict().items() if id(v) in ids)


def _config(model):
    """peft's adapter_config fields of the model's adapters: one group per (r, lora_alpha, lora_dropout), each
    with the dotted names of the layers it wraps."""
    groups = OrderedDict()
    for name, m in layers(model).items():
        key = (m.r, m.lora_alpha, m.lora_dropout.p)
        groups.setdefault(key, []).append(name)
    return [{"r": int(r), "lora_alpha": int(a) if isinstance(a, (int, np.integer)) else float(a),
             "lora_dropout": float(p), "target_modules": names} for (r, a, p), names in groups.items()]


def save(model, path):
    """Write the adapters (state_dict(model)) to a safetensors file at `path`, atomically (a crash leaves the old
    file or the new one). The metadata holds the format and, as JSON under "config", a list of peft's
    adapter_config fields: [{"r", "lora_alpha", "lora_dropout", "target_modules": [layer names]}], one entry per
    distinct (r, lora_alpha, lora_dropout)."""
    tensors = state_dict(model)
    if not tensors:
        raise RuntimeError(f"lora.save: {type(model).__name__} has no LoRA adapters: call lora.apply(model, ...) "
                           "first")
    metadata = {"format": FILE_FORMAT, "config": json.dumps(_config(model))}
    safetensors.save_file(tensors, path, metadata=metadata)


def _read_config(path, metadata):
    if metadata.get("format") != FILE_FORMAT:
        raise ValueError(f"lora.load: {path} is not a LoRA adapter file (metadata format "
                         f"{metadata.get('format')!r}, expected {FILE_FORMAT!r}): write it with lora.save")
    try:
        groups = json.loads(metadata["config"])
        ok = isinstance(groups, list) and all(
            isinstance(g, dict) and isinstance(g.get("r"), int) and isinstance(g.get("lora_alpha"), (int, float))
            and isinstance(g.get("lora_dropout"), (int, float)) and isinstance(g.get("target_modules"), list)
            and all(isinstance(t, str) for t in g["target_modules"]) for g in groups)
    except (KeyError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"lora.load: {path} has no valid 'config' in its metadata (corrupt file?)")
    return {name: g for g in groups for name in g["target_modules"]}


def load(model, path):
    """Load adapters written by `save` into `model` and return it.

    If the model has no LoRA layers yet, they are made first from the file's metadata (the same layers, r,
    lora_alpha and lora_dropout, as `apply` would); otherwise the model's adapters must be the file's: the same
    layers, shapes and lora_alpha. All or nothing: every name and shape is checked before anything changes. A
    merged model is refused (unmerge it first: the old update is inside its weights)."""
    metadata = safetensors.load_metadata(path)
    config = _read_config(path, metadata)
    header = safetensors.load_header(path)
    have = layers(model)
    merged = [n for n, m in have.items() if m.merged]
    if merged:
        raise RuntimeError(f"lora.load: {merged[0]} is merged ({len(merged)} layers in all): lora.unmerge(model) "
                           "first, or the old adapters stay folded into the weights")
    if not have:
        modules = dict(model.named_modules())
        for name, g in config.items():
            layer = modules.get(name)
            if not isinstance(layer, (Linear, QuantizedLinear)):
                what = "no module" if layer is None else f"a {type(layer).__name__}"
                raise RuntimeError(f"lora.load: {path} has an adapter for {name}, but the model has {what} there: "
                                   f"load into the model the adapters were trained on ({_available(model)})")
            want = {f"{name}.lora_A.weight": (g["r"], layer.in_features),
                    f"{name}.lora_B.weight": (layer.out_features, g["r"])}
            for key, shape in want.items():
                _check_shape(path, key, header, shape)
    else:
        for name, m in have.items():
            g = config.get(name)
            if g is not None and float(g["lora_alpha"]) != float(m.lora_alpha):
                raise ValueError(f"lora.load: {name} has lora_alpha {g['lora_alpha']} in {path} but {m.lora_alpha} "
                                 "in the model: apply with the file's alpha, or load into an unwrapped model (the "
                                 "adapters are then made from the file)")
        own = state_dict(model)
        missing, unexpected = sorted(set(own) - set(header)), sorted(set(header) - set(own))
        if missing or unexpected:
            raise RuntimeError(f"lora.load: {path} does not hold the model's adapters: missing {missing[:4]}, "
                               f"unexpected {unexpected[:4]} ({len(missing)} and {len(unexpected)} in all): apply "
                               "with the file's targets, or load into an unwrapped model")
        for key, p in own.items():
            _check_shape(path, key, header, p.shape)
    for key, (kind, _) in header.items():
        if kind not in ("F32", "F16", "BF16", "F64"):
            raise ValueError(f"lora.load: {path} stores {key} as {kind}, not a float dtype: corrupt file")
    arrays = safetensors.load_file(path)
    if not have:
        for g in _groups(config):
            apply(model, g["r"], g["lora_alpha"], g["lora_dropout"], targets=tuple(g["target_modules"]))
    own = state_dict(model)
    with no_grad():
        for key, p in own.items():
            value = arrays[key]
            p.copy_(dt.decode(value, dt.bfloat16) if header[key][0] == "BF16" else value)
    return model


def _groups(config):
    seen = OrderedDict()
    for g in config.values():
        seen[id(g)] = g
    return list(seen.values())


def _check_shape(path, key, header, shape):
    if key not in header:
        raise RuntimeError(f"lora.load: {path} has no {key} (corrupt file?)")
    if tuple(header[key][1]) != tuple(shape):
        raise ValueError(f"lora.load: {key} has shape {tuple(header[key][1])} in {path} but {tuple(shape)} in the "
                         "model: the adapters were trained on another model, or with another r")


def _require_layers(model, what, fix):
    """The model's LoRA layers (layers(model)); a clear error naming lora.`what` when it has none."""
    have = layers(model)
    if not have:
        raise RuntimeError(f"lora.{what}: {type(model).__name__} has no LoRA layers: {fix}")
    return have


def _check_mergeable(model, what, want_merged):
    have = _require_layers(model, what, "call lora.apply(model, ...) first")
    off = [n for n, m in have.items() if m.disable_adapters]
    if off:
        raise RuntimeError(f"lora.{what}: {off[0]} is inside lora.disabled(...) ({len(off)} of {len(have)} LoRA "
                           "layers): leave the block first, or the base weights would change under the reference")
    wrong = [n for n, m in have.items() if m.merged != want_merged]
    if wrong:
        state = "already merged" if want_merged is False else "not merged"
        hint = "merging twice would add the update twice; lora.unmerge(model) takes it out" if want_merged is False \
            else "there is no update in its weight to take out; lora.merge(model) puts it in"
        raise RuntimeError(f"lora.{what}: {wrong[0]} is {state} ({len(wrong)} of {len(have)} LoRA layers): {hint}")
    quantized = [(n, m) for n, m in have.items() if isinstance(m, QuantizedLinear)]
    if quantized:
        n, m = quantized[0]
        raise RuntimeError(f"lora.{what}: the base of {n} is quantized ({m.fmt}, group {m.group_size}): B·A cannot "
                           "be folded into its int storage without rounding it again. Keep the adapter unmerged "
                           "(it runs beside QMATMUL), or merge into a float32 copy of the model (load the float "
                           "weights, lora.load the adapters, then merge)")
    holders = {}
    for prefix, mod in model.named_modules():
        for attr, value in vars(mod).items():
            if isinstance(value, Parameter):
                holders.setdefault(id(value), []).append(f"{prefix}.{attr}" if prefix else attr)
    for n, m in have.items():
        others = [h for h in holders.get(id(m.weight), []) if h != f"{n}.weight"]
        if others:
            raise RuntimeError(f"lora.{what}: {n}.weight is tied to {others[0]}: folding the update in would change "
                               f"{others[0]} too. Keep this adapter unmerged, or untie the weight first "
                               f"(give {n} a copy: {n}.weight = nn.Parameter({n}.weight.detach()))")
    return have


def merge(model):
    """Fold each adapter into its base weight, W ← W + (α/r)·B A, computed in float32 and stored in W's dtype; the
    adapters are then skipped in the forward pass (inference at the base model's cost). Returns the model.
    Errors (before anything changes): no LoRA layers, a layer already merged, a quantized base, a tied weight."""
    with no_grad():
        for m in _check_mergeable(model, "merge", False).values():
            m.weight.copy_(m.weight.detach().float() + m.delta_weight())
            m.merged = True
    return model


def unmerge(model):
    """Undo `merge`: W ← W − (α/r)·B A (exactly W again in float32 up to rounding), adapters active again."""
    with no_grad():
        for m in _check_mergeable(model, "unmerge", True).values():
            m.weight.copy_(m.weight.detach().float() - m.delta_weight())
            m.merged = False
    return model


@contextlib.contextmanager
def disabled(model):
    """`with lora.disabled(model):` every LoRALinear of `model` computes its base layer alone, x Wᵀ + b (peft's
    `disable_adapter()`): the model before any adapter training, e.g. the reference of DPO or KTO, without a second
    copy of the weights. Each layer's previous state comes back on exit, an exception included, so blocks nest.
    Refused: a model without LoRA layers, and a merged one (its update is inside W: the base alone is gone;
    lora.unmerge(model) first)."""
    have = _require_layers(model, "disabled", "it already is its base model: call lora.apply(model, ...) first, "
                                              "or use the model itself")
    merged = [n for n, m in have.items() if m.merged]
    if merged:
        raise RuntimeError(f"lora.disabled: {merged[0]} is merged ({len(merged)} of {len(have)} LoRA layers): its "
                           "update is inside the base weight, so skipping the adapter would not give the base model; "
                           "lora.unmerge(model) first")
    before = [(m, m.disable_adapters) for m in have.values()]
    for m, _ in before:
        m.disable_adapters = True
    try:
        yield model
    finally:
        for m, state in before:
            m.disable_adapters = state
