"""The logit lens and the tuned lens: what the model would predict if its residual stream stopped at each layer.

The logit lens (nostalgebraist 2020, "interpreting GPT: the logit lens") reads the residual stream before each block
through the model's own final norm and unembedding. The tuned lens (Belrose et al. 2023, "Eliciting Latent
Predictions from Transformers with the Tuned Lens", arXiv:2303.08112) first applies a learned affine translator per
layer, trained to minimise KL(final distribution ‖ lens distribution) while the model stays frozen.

Slice l of a lens (0 ≤ l < n_layer) reads `blocks.{l}.hook_resid_pre` (slice 0: the embeddings); slice n_layer is
the model's own log-probabilities (its residual after the last block through the final norm and unembedding). All
residuals come from one `model.run_with_cache` (tinyllm/models/hooks.py).

    logp = logit_lens(model, idx)                      # (n_layer + 1, B, T, vocab) log-probabilities
    tuned = TunedLens.train(model, train_tokens, steps=250)
    rows = tuned.report(model, val_tokens)             # per layer, both lenses: KL to the output, top-1 agreement
    print(format_report(rows))
"""
import numpy as np

from .. import nn
from ..factory import stack
from ..tensor import Tensor, no_grad
from ..utils.progress import progress_bar

__all__ = ["logit_lens", "TunedLens", "lens_report", "format_report", "layer_names", "read_out",
           "context_length"]


# ---- the model's parts a lens reads --------------------------------------------------------------------------
def _final_norm(model):
    """The norm the model applies before its unembedding: GPT's transformer.ln_f, Llama's model.norm."""
    transformer = getattr(model, "transformer", None)
    if transformer is not None and hasattr(transformer, "ln_f"):
        return transformer.ln_f
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(inner, "norm"):
        return inner.norm
    raise TypeError(f"lens: {type(model).__name__} is not a tinyllm GPT or Llama: a lens needs the final norm "
                    "(transformer.ln_f or model.norm), lm_head and run_with_cache")


def _n_layers(model):
    if not hasattr(model, "run_with_cache"):
        raise TypeError(f"lens: {type(model).__name__} has no run_with_cache: pass a tinyllm GPT or Llama")
    return model._hook_layers()


def _d_model(model):
    return _final_norm(model).normalized_shape[-1]


def context_length(model):
    """The most positions the model reads: its block_size (GPT) or max_position_embeddings (Llama)."""
    return getattr(model.config, model.max_positions_field)


def _device(model):
    return next(iter(model.parameters())).device


def layer_names(model):
    """What slice l of a lens reads, for tables: "embed", "resid_pre 1", ..., "final" (the model's output)."""
    n = _n_layers(model)
    return ["embed"] + [f"resid_pre {l}" for l in range(1, n)] + ["final"]


def read_out(model, resid):
    """log_softmax(lm_head(final_norm(resid))): a residual (…, d_model) read as the model reads its last one."""
    return model.lm_head(_final_norm(model)(resid)).log_softmax(-1)


# ---- input checks ------------------------------------------------------------------------------------------------
def _check_idx(model, idx, what):
    """idx as a tinyllm int Tensor (B, T) on the model's device; a clear error for anything else."""
    if isinstance(idx, Tensor):
        shape, kind = idx.shape, idx.dtype.name
        ok_dtype = not (idx.dtype.is_float or idx.dtype.is_complex)
    else:
        arr = np.asarray(idx)
        shape, kind, ok_dtype = arr.shape, arr.dtype.name, np.issubdtype(arr.dtype, np.integer)
    if len(shape) != 2 or not ok_dtype:
        raise ValueError(f"{what}: idx must be 2-D integer token ids (B, T), got shape {tuple(shape)} of {kind}: "
                         "e.g. tl.tensor(ids[None, :]) for one sequence")
    T, ctx = shape[1], context_length(model)
    if not 1 <= T <= ctx:
        raise ValueError(f"{what}: idx has {T} positions, but the model reads 1 to {ctx} (its context): "
                         "pass a shorter sequence")
    if isinstance(idx, Tensor):
        return idx
    return Tensor(np.asarray(idx, dtype=np.int64), device=_device(model))


def _check_layers(model, layers, what):
    """The lens slices asked for: all (None) or a list of ints in 0..n_layer; a ValueError naming a bad one."""
    n = _n_layers(model)
    if layers is None:
        return list(range(n + 1))
    layers = [layers] if isinstance(layers, (int, np.integer)) else list(layers)
    for l in layers:
        if not isinstance(l, (int, np.integer)) or isinstance(l, bool):
            raise TypeError(f"{what}: layers must be ints, got {type(l).__name__} {l!r}")
        if not 0 <= l <= n:
            raise ValueError(f"{what}: layer {l} is out of range: {type(model).__name__} has {n} layers, so a lens "
                             f"has slices 0 (the embeddings) to {n} (the model's output)")
    return [int(l) for l in layers]


def _check_tokens(model, tokens, what):
    tokens = np.asarray(tokens)
    T = context_length(model)
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"{what}: tokens must be a 1-D array of integer token ids, got shape {tokens.shape} of "
                         f"{tokens.dtype}")
    if len(tokens) < T:
        raise ValueError(f"{what}: {len(tokens)} tokens are fewer than one window of the model's context ({T}): "
                         "pass more text")
    return tokens


# ---- the lenses ----------------------------------------------------------------------------------------------
def _residuals(model, idx, layers):
    """(the model's log-probs (B, T, vocab), {l: resid_pre of block l} for the layers below n_layer), detached,
    from one run_with_cache."""
    n = _n_layers(model)
    names = {l: f"blocks.{l}.hook_resid_pre" for l in layers if l < n}
    logits, cache = model.run_with_cache(idx, names_filter=list(names.values()))
    return logits.detach().log_softmax(-1), {l: cache[name] for l, name in names.items()}


def _slices(model, final, resids, layers, translate=None):
    """The lens's log-probs per slice of `layers`: the model's own (`final`) for n_layer, else the residual, moved
    by translate(l, h) when given (the tuned lens), read through the final norm and unembedding."""
    n = _n_layers(model)
    out = []
    for l in layers:
        if l == n:
            out.append(final)
        else:
            h = resids[l] if translate is None else translate(l, resids[l])
            out.append(read_out(model, h))
    return out


def logit_lens(model, idx, layers=None):
    """The logit lens (nostalgebraist 2020): log-probabilities (len(layers), B, T, vocab), by default
    (n_layer + 1, B, T, vocab). Slice l < n_layer reads blocks.{l}.hook_resid_pre through the model's final norm
    and unembedding; slice n_layer is the model's own log_softmax(logits). `layers`: which slices (ints in
    0..n_layer), in that order."""
    idx = _check_idx(model, idx, "logit_lens")
    layers = _check_layers(model, layers, "logit_lens")
    final, resids = _residuals(model, idx, layers)
    return stack(_slices(model, final, resids, layers))


class _FitOrMode:
    """`TunedLens.train(model, tokens, ...)` (on the class) fits a lens; `lens.train(mode)` (on an instance) is
    nn.Module's train/eval switch."""

    def __get__(self, obj, cls):
        if obj is None:
            return cls.fit
        return nn.Module.train.__get__(obj, cls)


class TunedLens(nn.Module):
    """The tuned lens (Belrose et al. 2023): one affine translator per layer, h ↦ h + A h + b (Belrose's
    parametrization; A and b start at zero, so an untrained lens is the logit lens exactly), read through the
    frozen model's final norm and unembedding. Slice n_layer is the model's own output (no translator).

    `TunedLens.train(model, tokens, ...)` (= TunedLens.fit) trains one; `lens(model, idx)` gives log-probabilities
    (n_layer + 1, B, T, vocab) as logit_lens does."""

    train = _FitOrMode()

    def __init__(self, model):
        n, d = _n_layers(model), _d_model(model)
        self.n_layer, self.d_model = n, d
        self.translators = nn.ModuleList(_zero_linear(d) for _ in range(n))
        self.to(device=_device(model))

    def translate(self, layer, resid):
        """h + A_l h + b_l: resid_pre of block `layer` moved toward the final layer's basis."""
        return resid + self.translators[layer](resid)

    def forward(self, model, idx, layers=None):
        self._check_model(model, "TunedLens")
        idx = _check_idx(model, idx, "TunedLens")
        layers = _check_layers(model, layers, "TunedLens")
        final, resids = _residuals(model, idx, layers)
        return stack(_slices(model, final, resids, layers, self.translate))

    def report(self, model, tokens, windows=8, batch_size=4):
        """lens_report(model, tokens, self): per layer, KL to the model's output and top-1 agreement of the logit
        lens and this lens, on held-out `tokens`."""
        return lens_report(model, tokens, self, windows=windows, batch_size=batch_size)

    def _check_model(self, model, what):
        n, d = _n_layers(model), _d_model(model)
        if (n, d) != (self.n_layer, self.d_model):
            raise ValueError(f"{what}: this lens was made for {self.n_layer} layers of width {self.d_model}, but "
                             f"the model has {n} of width {d}: train a lens for this model")

    @classmethod
    def fit(cls, model, tokens, steps=250, batch_size=8, lr=1e-3, seed=0, progress=True):
        """A tuned lens trained on `tokens` (1-D token ids): each of `steps` steps reads `batch_size` random
        windows of the model's context length, and AdamW (weight decay 0, lr decaying linearly to 0, as Belrose
        et al.'s schedule) lowers Σ_l KL(final ‖ lens_l), the KL in nats averaged over positions. The model stays
        frozen (in eval mode, its residuals and output detached, its parameters given no gradient). A tqdm bar when
        `progress` and tqdm are there."""
        from ..optim import AdamW, LambdaLR
        tokens = _check_tokens(model, tokens, "TunedLens.train")
        if steps < 1 or batch_size < 1:
            raise ValueError(f"TunedLens.train: steps ({steps}) and batch_size ({batch_size}) must be at least 1")
        lens = cls(model)
        opt = AdamW(lens.parameters(), lr=lr, weight_decay=0.0)
        sched = LambdaLR(opt, lambda s: 1.0 - s / steps)
        rng = np.random.default_rng(seed)
        T, n, device = context_length(model), lens.n_layer, _device(model)
        bar = progress_bar(steps, "tuned lens", "step") if progress else None
        frozen = [p for p in model.parameters() if p.requires_grad]
        was_training = model.training
        model.eval()  # no dropout: the lens learns the model's own distribution
        for p in frozen:
            p.requires_grad_(False)
        try:
            for _ in range(steps):
                starts = rng.integers(0, len(tokens) - T + 1, batch_size)
                idx = Tensor(np.stack([tokens[s:s + T] for s in starts]).astype(np.int64), device=device)
                with no_grad():
                    final, resids = _residuals(model, idx, range(n))
                loss = sum(_kl(final, read_out(model, lens.translate(l, resids[l]))) for l in range(n))
                opt.zero_grad()
                loss.backward()
                opt.step()
                sched.step()
                if bar is not None:
                    bar.set_postfix(kl=f"{loss.item() / n:.3f}")
                    bar.update(1)
        finally:
            for p in frozen:
                p.requires_grad_(True)
            model.train(was_training)
            if bar is not None:
                bar.close()
        return lens.eval()


def _zero_linear(d):
    layer = nn.Linear(d, d)
    for p in (layer.weight, layer.bias):
        p.copy_(np.zeros(p.shape, np.float32))
    return layer


def _kl(p_log, q_log):
    """KL(p ‖ q) in nats from log-probabilities (…, vocab), averaged over the leading positions."""
    return (p_log.exp() * (p_log - q_log)).sum(-1).mean()


# ---- the report ------------------------------------------------------------------------------------------------
def lens_report(model, tokens, tuned=None, windows=8, batch_size=4):
    """Per slice of the lens, on `windows` windows of the model's context spread evenly over `tokens` (held-out
    text, not the tuned lens's training tokens): a list of dicts {"layer", "name", "logit_kl", "logit_top1"} and,
    with a `tuned` lens, "tuned_kl", "tuned_top1". KL(final ‖ lens) is in nats, averaged over positions; top1 is
    the fraction of positions where the lens's most likely token is the model's."""
    tokens = _check_tokens(model, tokens, "lens_report")
    if tuned is not None:
        tuned._check_model(model, "lens_report")
    T, n, device = context_length(model), _n_layers(model), _device(model)
    starts = np.linspace(0, len(tokens) - T, windows).astype(np.int64)
    lenses = {"logit": None} if tuned is None else {"logit": None, "tuned": tuned.translate}
    sums = {(k, m): np.zeros(n + 1) for k in lenses for m in ("kl", "top1")}
    count = 0
    for i in range(0, len(starts), batch_size):
        idx = Tensor(np.stack([tokens[s:s + T] for s in starts[i:i + batch_size]]).astype(np.int64), device=device)
        with no_grad():
            final, resids = _residuals(model, idx, range(n))
            p = final.numpy().astype(np.float64)
            for k, translate in lenses.items():
                for l, q in enumerate(_slices(model, final, resids, range(n + 1), translate)):
                    q = q.numpy().astype(np.float64)
                    sums[k, "kl"][l] += (np.exp(p) * (p - q)).sum(-1).sum()
                    sums[k, "top1"][l] += (q.argmax(-1) == p.argmax(-1)).sum()
        count += p.shape[0] * p.shape[1]
    names = layer_names(model)
    return [{"layer": l, "name": names[l], **{f"{k}_{m}": float(sums[k, m][l] / count) for k, m in sums}}
            for l in range(n + 1)]


def format_report(rows):
    """lens_report's rows as a text table: one line per slice, KL (nats) and top-1 agreement per lens."""
    lenses = [k for k in ("logit", "tuned") if f"{k}_kl" in rows[0]]
    head = f"{'layer':<12}" + "".join(f"{k + ' KL':>11}{k + ' top1':>12}" for k in lenses)
    lines = [head]
    for r in rows:
        lines.append(f"{r['name']:<12}" + "".join(f"{r[k + '_kl']:>11.4f}{r[k + '_top1']:>12.3f}" for k in lenses))
    return "\n".join(lines)
