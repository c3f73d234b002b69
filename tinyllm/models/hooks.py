"""TransformerLens's interface on tinyllm's models: run_with_cache, run_with_hooks, hooks, hook_names.

The points are TransformerLens's names (blocks.{l}.hook_resid_pre, blocks.{l}.attn.hook_pattern, ...) with its
shapes and contents; tinyllm/nn/hooks.py says how a point edits the graph. A model lists its hooked modules once,
`_hook_modules()`: (TransformerLens's prefix, module) pairs, and each module class lists its own points
(`hook_points`); the names and the modules' prefixes both come from that.
"""
import contextlib
import difflib
import re

from ..nn import hooks as _hooks
from ..realizer import realize

_BLOCK = re.compile(r"^blocks\.(\d+)\.")


class ActivationCache(dict):
    """{hook name: activation}, in the order the points fired, as TransformerLens's ActivationCache; also indexed
    by TransformerLens's short keys: cache["pattern", 0] is cache["blocks.0.attn.hook_pattern"], cache["scale", 0,
    "ln1"] is cache["blocks.0.ln1.hook_scale"]."""

    def __getitem__(self, key):
        if isinstance(key, tuple):
            key = self._full_name(*key)
        return super().__getitem__(key)

    def _full_name(self, short, layer=None, sub=None):
        end = short if short.startswith("hook_") else f"hook_{short}"
        found = [n for n in self if n.rsplit(".", 1)[-1] == end
                 and (layer is None or n.startswith(f"blocks.{layer}."))
                 and (sub is None or f".{sub}." in f".{n}")]
        if len(found) != 1:
            raise KeyError(f"ActivationCache: ({short!r}, {layer!r}, {sub!r}) names "
                           f"{'nothing' if not found else ', '.join(found)} in this cache; its names: "
                           f"{', '.join(list(self)[:8])}{', ...' if len(self) > 8 else ''}")
        return found[0]


class HookedMixin:
    """run_with_cache / run_with_hooks / hooks / hook_names on a model with _hook_modules(), _features(idx) (the
    final norm's output at every position) and lm_head."""

    def _unembed(self, x):
        return _hooks.point(self, "unembed.hook_out", self.lm_head(_hooks.point(self, "unembed.hook_in", x)))

    def _hooked_logits(self, idx):
        self._check_forward(idx, None)
        return self._unembed(self._features(idx))

    def _name_hook_points(self):
        """Give each hooked module its prefix (tinyllm/nn/hooks.py reads it); called at the end of __init__."""
        for prefix, module in self._hook_modules():
            module.hook_prefix = prefix

    def hook_names(self):
        """Every hook point's name: module by module, each module's points in its forward's order."""
        return [f"{prefix}.{p}" if prefix else p for prefix, module in self._hook_modules() for p in module.hook_points]

    def _check_names(self, names, what):
        known = self.hook_names()
        known_set = set(known)
        for name in names:
            if name in known_set:
                continue
            if not isinstance(name, str):
                raise TypeError(f"{what}: a hook name must be a str, got {type(name).__name__} {name!r}")
            layers = self._hook_layers()
            match = _BLOCK.match(name)
            if match and int(match.group(1)) >= layers:
                raise ValueError(f"{what}: {name!r}: layer {match.group(1)} is out of range: "
                                 f"{type(self).__name__} has {layers} layers (blocks.0 to blocks.{layers - 1})")
            close = difflib.get_close_matches(name, known, n=4, cutoff=0.6)
            raise ValueError(f"{what}: {type(self).__name__} has no hook point {name!r}"
                             + (f"; close: {', '.join(close)}" if close else "")
                             + f" (model.hook_names() lists all {len(known)})")

    def _hook_layers(self):
        return sum(1 for prefix, _ in self._hook_modules() if re.fullmatch(r"blocks\.\d+", prefix))

    def _hooks_by_name(self, fwd_hooks, what):
        if isinstance(fwd_hooks, tuple) and len(fwd_hooks) == 2 and isinstance(fwd_hooks[0], str):
            fwd_hooks = [fwd_hooks]  # one (name, fn) pair given alone
        by_name = {}
        for pair in fwd_hooks or ():
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
                raise TypeError(f"{what}: fwd_hooks must be a list of (name, fn) pairs, got {pair!r}")
            name, fn = pair
            if callable(name) and not isinstance(name, str):  # TransformerLens: a filter on names
                names = [n for n in self.hook_names() if name(n)]
            else:
                self._check_names([name], what)
                names = [name]
            if not callable(fn):
                raise TypeError(f"{what}: the hook for {name!r} must be a function fn(activation, hook), got "
                                f"{type(fn).__name__}")
            for n in names:
                by_name.setdefault(n, []).append(fn)
        return by_name

    def _filtered(self, names_filter):
        if names_filter is None:
            return self.hook_names()
        if isinstance(names_filter, str):
            names_filter = [names_filter]
        if callable(names_filter):
            return [n for n in self.hook_names() if names_filter(n)]
        names_filter = list(names_filter)
        self._check_names(names_filter, "run_with_cache")
        return names_filter

    @contextlib.contextmanager
    def hooks(self, fwd_hooks=()):
        """`with model.hooks(fwd_hooks=[(name, fn), ...]):` the hooks act on every forward inside (the model's
        forward and its run_* methods), and are gone after it."""
        with _hooks.session(self._hooks_by_name(fwd_hooks, "hooks")):
            yield self

    def run_with_hooks(self, idx, fwd_hooks=()):
        """The logits at every position (B, T, vocab) of a forward in which each fn(activation, hook) of fwd_hooks
        ([(name, fn), ...]; name may be a filter function) runs once at its point; a Tensor it returns replaces the
        activation downstream, None leaves it."""
        with _hooks.session(self._hooks_by_name(fwd_hooks, "run_with_hooks")):
            return self._hooked_logits(idx)

    def run_with_cache(self, idx, names_filter=None, fwd_hooks=()):
        """(logits (B, T, vocab), cache): cache holds the activation at every point names_filter selects (None:
        all; a name; a list of names; or a function of the name), detached, realized with the logits."""
        capture = self._filtered(names_filter)
        with _hooks.session(self._hooks_by_name(fwd_hooks, "run_with_cache"), capture) as s:
            logits = self._hooked_logits(idx)
        cache = ActivationCache(s.cache)
        realize(logits, *cache.values())
        return logits, cache
