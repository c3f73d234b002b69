"""Sparse autoencoders (SAEs) on a model's activations, trained with tinyllm's own autograd and optimizers on any
runtime.

An SAE writes an activation x (width d_in) as a sparse, non-negative combination of d_hidden learned unit directions
(the rows of W_dec, SAELens's layout) plus a bias:

    f = act((x - b_dec) @ W_enc + b_enc)          # feature activations (d_hidden), mostly 0
    x_hat = f @ W_dec + b_dec                     # the reconstruction

two kinds, as SAELens's "standard" and "topk" SAEs:
- kind="relu": act = ReLU, sparsity from an L1 penalty (Bricken et al. 2023, "Towards Monosemanticity"; the penalty
  weighted by the decoder norms as in Anthropic's April 2024 update), dead latents resampled toward badly
  reconstructed inputs (Towards Monosemanticity's resampling);
- kind="topk": act keeps the k largest pre-activations (ReLU after the top-k), no penalty, and the AuxK loss keeps
  latents alive (Gao et al. 2024, "Scaling and evaluating sparse autoencoders", arXiv 2406.04093).

`train_sae` trains one on an activation array or on a hook of a model (TransformerLens's names, e.g.
"blocks.2.hook_resid_post"), `sae_metrics` reports SAELens's metric names, `collect_activations` reads a hook over
a token stream. Everything runs through tinyllm Tensors; NumPy on the host does the bookkeeping (which latents
fired, the top-k choice during training, the geometric median) as the reference implementations do in torch.
"""
import math
import time

import numpy as np

from ..nn import functional as F
from ..nn.module import Module, Parameter
from ..optim import Adam
from ..tensor import Tensor, no_grad
from ..utils.progress import progress_bar

KINDS = ("relu", "topk")


class SparseAutoencoder(Module):
    """A sparse autoencoder of `d_in`-wide activations with `d_hidden` latents (module docstring for the maths).

    Parameters, in SAELens's names and layout: W_enc (d_in, d_hidden), b_enc (d_hidden), W_dec (d_hidden, d_in) (each
    row a latent's direction, unit norm), b_dec (d_in) (the pre-encoder bias: subtracted before encoding, added after
    decoding). At init the rows of W_dec are random unit vectors and W_enc is W_dec's transpose (Gao et al. 2024,
    section 2.4), the biases 0.

    kind="relu": loss = mean over tokens of (||x - x_hat||^2 + l1 * sum_i f_i * ||W_dec[i]||) (Anthropic's April
    2024 penalty; with the rows kept at unit norm it equals the plain L1 sum in value).
    kind="topk": the k largest pre-activations pass through a ReLU, the rest are 0; loss = mse + aux_coef * AuxK,
    AuxK the normalized MSE with which the aux_k largest pre-activations of the *dead* latents reconstruct the
    residual error x - x_hat (Gao et al. 2024, appendix A.2; aux_k defaults to d_in // 2, aux_coef to 1/32).
    mse is the mean over elements of (x_hat - x)^2. A latent is dead once it has not fired on the last
    `dead_tokens` training tokens (`tokens_since_fired` counts them; train_sae updates it).
    """

    def __init__(self, d_in, d_hidden, kind="topk", k=32, l1=5.0, aux_k=None, aux_coef=1 / 32, dead_tokens=100_000,
                 seed=0, device=None):
        name = "SparseAutoencoder"
        for arg, value in (("d_in", d_in), ("d_hidden", d_hidden), ("dead_tokens", dead_tokens)):
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}: {arg} must be a positive int, got {value!r}")
        if kind not in KINDS:
            raise ValueError(f"{name}: kind must be one of {KINDS}, got {kind!r}")
        if kind == "topk" and (not isinstance(k, (int, np.integer)) or not 1 <= k <= d_hidden):
            raise ValueError(f"{name}: k must be an int in 1..d_hidden={d_hidden} for kind='topk', got {k!r}")
        if l1 < 0 or aux_coef < 0:
            raise ValueError(f"{name}: l1 and aux_coef must be >= 0, got l1={l1}, aux_coef={aux_coef}")
        self.d_in, self.d_hidden, self.kind = int(d_in), int(d_hidden), kind
        self.k = int(k) if kind == "topk" else None
        self.l1, self.aux_coef, self.dead_tokens = float(l1), float(aux_coef), int(dead_tokens)
        self.aux_k = int(aux_k) if aux_k is not None else max(1, self.d_in // 2)
        rng = np.random.default_rng(seed)
        w = rng.standard_normal((self.d_hidden, self.d_in))
        w = (w / np.linalg.norm(w, axis=1, keepdims=True)).astype(np.float32)
        self.W_dec = Parameter(w)
        self.W_enc = Parameter(np.ascontiguousarray(w.T))
        self.b_enc = Parameter(np.zeros(self.d_hidden, np.float32))
        self.b_dec = Parameter(np.zeros(self.d_in, np.float32))
        self.tokens_since_fired = np.zeros(self.d_hidden, np.int64)
        if device is not None:
            self.to(device)

    def extra_repr(self):
        sparsity = f"k={self.k}" if self.kind == "topk" else f"l1={self.l1}"
        return f"d_in={self.d_in}, d_hidden={self.d_hidden}, kind={self.kind!r}, {sparsity}"

    # ---- the maps ------------------------------------------------------------------------------------------
    def check_input(self, x, what="encode"):
        """x as a Tensor on the SAE's device, or a ValueError naming the expected and the given width."""
        if not isinstance(x, Tensor):
            x = Tensor(np.asarray(x, np.float32), device=self.W_enc.device)
        if x.ndim == 0 or x.shape[-1] != self.d_in:
            got = x.shape[-1] if x.ndim else "a 0-d tensor"
            raise ValueError(f"SparseAutoencoder.{what}: expected activations of width d_in={self.d_in} (the last "
                             f"dimension), got width {got} (shape {tuple(x.shape)}): train an SAE for this hook's "
                             f"width, or feed it the hook it was trained on")
        return x

    def pre_acts(self, x):
        """(x - b_dec) @ W_enc + b_enc: each latent's pre-activation, shape (..., d_hidden)."""
        x = self.check_input(x, "pre_acts")
        return (x - self.b_dec) @ self.W_enc + self.b_enc

    def activate(self, pre):
        """The feature activations of pre-activations: ReLU (kind="relu"), or ReLU of the k largest along the last
        dimension and 0 elsewhere (kind="topk", by a mask at the k-th largest value; gradients reach exactly the
        kept latents)."""
        if self.kind == "relu":
            return pre.relu()
        kth = pre.topk(self.k, dim=-1).values[..., -1:]
        return pre.relu() * (pre >= kth).to(pre.dtype)

    def encode(self, x):
        """Feature activations f of activations x (..., d_in) → (..., d_hidden)."""
        return self.activate(self.pre_acts(x))

    def decode(self, f):
        """The reconstruction f @ W_dec + b_dec of feature activations f (..., d_hidden) → (..., d_in)."""
        return f @ self.W_dec + self.b_dec

    def forward(self, x):
        """The reconstruction of x (..., d_in): decode(encode(x)). A hook function: lambda act, hook: sae(act)."""
        return self.decode(self.encode(x))

    def loss_parts(self, x):
        """SAEOutput(recon, feats, mse, sparsity, loss) of x: the reconstruction, feature activations, the MSE (mean
        over elements), the sparsity term and the loss, all graph, differentiable. relu: sparsity = l1 * mean over
        tokens of sum_i f_i ||W_dec[i]||, loss = mean over tokens of ||x - x_hat||^2 (= d_in * mse) + sparsity, as
        Anthropic's April 2024 update (with activations scaled to E||x||^2 = d_in, as train_sae does, l1 ~ 5 is
        their range). topk: sparsity 0 and loss = mse (AuxK needs the training history: train_step_loss adds it)."""
        x = self.check_input(x, "loss_parts")
        f = self.encode(x)
        recon = self.decode(f)
        mse = ((recon - x) ** 2).mean()
        if self.kind == "relu":
            norms = (self.W_dec * self.W_dec).sum(-1).sqrt()
            sparsity = self.l1 * (f * norms).sum(-1).mean()
            return SAEOutput(recon, f, mse, sparsity, mse * self.d_in + sparsity)
        return SAEOutput(recon, f, mse, mse * 0, mse)

    def dead_mask(self):
        """Which latents are dead: not fired in the last `dead_tokens` training tokens (a NumPy bool array)."""
        return self.tokens_since_fired >= self.dead_tokens

    @no_grad()
    def normalize_decoder(self):
        """Scale each row of W_dec to unit norm (after every optimizer step, as SAELens and OpenAI do)."""
        w = self.W_dec.detach()
        self.W_dec.copy_(w / ((w * w).sum(-1, keepdim=True).sqrt() + 1e-12))

    def project_decoder_grad(self):
        """Remove from W_dec's gradient its component along each row (the rows stay unit norm, so that component
        only changes their length; Gao et al. 2024, section 2.4)."""
        g, w = self.W_dec.grad, self.W_dec.detach()
        if g is not None:
            self.W_dec.grad = g - (g * w).sum(-1, keepdim=True) * w


class SAEOutput(tuple):
    """(recon, feats, mse, sparsity, loss) with those names."""
    __slots__ = ()
    _fields = ("recon", "feats", "mse", "sparsity", "loss")

    def __new__(cls, recon, feats, mse, sparsity, loss):
        return tuple.__new__(cls, (recon, feats, mse, sparsity, loss))

    recon = property(lambda self: self[0])
    feats = property(lambda self: self[1])
    mse = property(lambda self: self[2])
    sparsity = property(lambda self: self[3])
    loss = property(lambda self: self[4])


# ---- activations ----------------------------------------------------------------------------------------------
def context_length(model):
    """The context length of a GPT (config.block_size) or Llama (config.max_position_embeddings)."""
    config = model.config
    for field in ("block_size", "max_position_embeddings"):
        if hasattr(config, field):
            return int(getattr(config, field))
    raise ValueError(f"context_length: {type(model).__name__}'s config has neither block_size nor "
                     "max_position_embeddings")


def token_windows(tokens, length):
    """`tokens` (1-D ints) cut into consecutive windows of `length`, an int64 array (n_windows, length); the rest
    of the stream is left out. A ValueError when there is not one window."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 1:
        raise ValueError(f"token_windows: tokens must be 1-D (a token stream), got shape {tokens.shape}")
    n = len(tokens) // length
    if n < 1:
        raise ValueError(f"token_windows: {len(tokens)} tokens are fewer than one window of the model's context "
                         f"length {length}: give more tokens")
    return tokens[:n * length].astype(np.int64).reshape(n, length)


def collect_activations(model, hook_name, tokens, max_tokens=None, batch_windows=8, progress=True):
    """The activations at `hook_name` of `model` over `tokens` (1-D), read in windows of the model's context length:
    a float32 NumPy array (n_tokens, width), n_tokens a multiple of the context length (at most max_tokens, rounded
    down to whole windows). The values of model.run_with_cache(idx, names_filter=[hook_name]); read by a hook of
    model.run_with_hooks that keeps the activation, whose logits are never realized, so only the graph up to the
    hook runs (the layers after it cost nothing)."""
    T = context_length(model)
    windows = token_windows(tokens, T)
    if max_tokens is not None:
        windows = windows[:max(1, int(max_tokens) // T)]
    device = next(model.parameters()).device
    out, bar = None, progress_bar(windows.size, f"activations {hook_name}", "tok") if progress else None
    with no_grad():
        for start in range(0, len(windows), batch_windows):
            idx = Tensor(windows[start:start + batch_windows], device=device)
            kept = []
            model.run_with_hooks(idx, fwd_hooks=[(hook_name, lambda act, hook: kept.append(act))])
            acts = kept[0].numpy()
            acts = acts.reshape(-1, acts.shape[-1]).astype(np.float32)
            if out is None:
                out = np.empty((windows.size, acts.shape[-1]), np.float32)
            out[start * T:start * T + len(acts)] = acts
            if bar is not None:
                bar.update(len(acts))
    if bar is not None:
        bar.close()
    return out


def as_activations(acts, d_in=None, what="train_sae"):
    """Activations (N, d) or (..., d) (a NumPy array or tinyllm Tensor) as a float32 NumPy array (N, d)."""
    array = acts.numpy() if isinstance(acts, Tensor) else np.asarray(acts)
    if array.ndim < 1 or array.size == 0:
        raise ValueError(f"{what}: activations must be a non-empty array (N, d_in) or (..., d_in), got shape "
                         f"{array.shape}")
    if d_in is not None and array.shape[-1] != d_in:
        raise ValueError(f"{what}: SparseAutoencoder expected activations of width d_in={d_in} (the last dimension), "
                         f"got width {array.shape[-1]} (shape {array.shape})")
    return np.ascontiguousarray(array.reshape(-1, array.shape[-1]), dtype=np.float32)


def geometric_median(points, iters=30, eps=1e-6):
    """The point minimizing the sum of Euclidean distances to `points` (N, d), by Weiszfeld's iteration started at
    the mean (Towards Monosemanticity and SAELens initialize b_dec to it)."""
    points = np.asarray(points, np.float64)
    y = points.mean(0)
    for _ in range(iters):
        w = 1.0 / np.maximum(np.linalg.norm(points - y, axis=1), eps)
        y_new = (w[:, None] * points).sum(0) / w.sum()
        if np.linalg.norm(y_new - y) <= eps * max(1.0, np.linalg.norm(y)):
            return y_new
        y = y_new
    return y


# ---- training ---------------------------------------------------------------------------------------------------
def _topk_indices(p, k, allowed=None):
    """Per row of the host array p (B, H), the column indices of its k largest values (among the `allowed`
    columns), unordered: NumPy's argpartition, O(H) per row."""
    if allowed is not None:
        p = np.where(allowed, p, -np.inf)
    if k >= p.shape[1]:
        return np.broadcast_to(np.arange(p.shape[1]), p.shape).copy()
    return np.argpartition(-p, k - 1, axis=1)[:, :k]


def _decode_selected(sae, pre, idx, keep=None):
    """sum_j relu(pre[b, idx[b, j]]) * W_dec[idx[b, j]] (no bias) for host indices idx (B, k), entries where `keep`
    (a host bool array like idx) is False left out: the decoder applied to k chosen latents per row. Few per row
    (k * 32 <= d_hidden): a gather of k rows of W_dec, k·d_in work per row instead of d_hidden·d_in (its gradient a
    scatter-add into those rows); more: the dense product with a 0/1 mask, which is faster there."""
    device = pre.device
    if idx.shape[1] * 32 <= sae.d_hidden:
        idx_t = Tensor(idx.astype(np.int64), device=device)
        values = pre.gather(1, idx_t).relu()
        if keep is not None:
            values = values * Tensor(keep.astype(np.float32), device=device)
        return (sae.W_dec[idx_t] * values.unsqueeze(-1)).sum(1)
    mask = np.zeros(pre.shape, np.float32)
    np.put_along_axis(mask, idx, 1.0 if keep is None else keep.astype(np.float32), axis=1)
    return (pre.relu() * Tensor(mask, device=device)) @ sae.W_dec


def train_step_loss(sae, x, dead=None):
    """The training loss of a batch x (B, d_in Tensor) and the host facts of the step: (loss, mse, fired), fired a
    bool array (d_hidden) of the latents that fired on the batch, l0 the mean active count.

    relu: loss_parts(x). topk: the same maps as encode/decode, the top-k chosen on the host from the realized
    pre-activations (np.argpartition: the graph's argsort of d_hidden per row is the slow part otherwise) and the
    decoder applied to those k (_decode_selected); plus aux_coef * AuxK when `dead` (a bool mask) marks dead
    latents: the normalized MSE of the aux_k largest dead pre-activations' reconstruction of the error e = x - x_hat,
    as OpenAI's train.py computes it: per row ||W_dec z_aux - e||^2 / ||e + b_dec||^2, averaged."""
    if sae.kind == "relu":
        out = sae.loss_parts(x)
        fired = out.feats.numpy() > 0
        return out.loss, out.mse, fired.any(0), float(fired.sum(1).mean())
    pre = sae.pre_acts(x)
    p = pre.numpy()
    idx = _topk_indices(p, sae.k)
    recon = _decode_selected(sae, pre, idx) + sae.b_dec
    mse = ((recon - x) ** 2).mean()
    loss = mse
    if dead is not None and dead.any() and sae.aux_coef > 0:
        # always aux_k latents (one graph shape, its schedule reused), those not dead weighted 0
        aux = _topk_indices(p, min(sae.aux_k, sae.d_hidden), allowed=dead)
        err = (x - recon).detach()
        aux_recon = _decode_selected(sae, pre, aux, keep=dead[aux])
        # OpenAI's normalized MSE of (W_dec z_aux + b_dec) against (err + b_dec), per row (their train.py)
        target = err + sae.b_dec.detach()
        aux_loss = (((aux_recon - err) ** 2).mean(-1) / ((target * target).mean(-1) + 1e-12)).mean()
        loss = loss + sae.aux_coef * aux_loss
    active = np.take_along_axis(p, idx, 1) > 0
    fired = np.zeros(sae.d_hidden, bool)
    fired[idx[active]] = True
    return loss, mse, fired, float(active.sum(1).mean())


def resample_dead(sae, optimizer, x, dead, rng, encoder_scale=0.2):
    """Towards Monosemanticity's resampling of dead latents (relu): each dead latent's decoder row becomes a
    normalized input drawn with probability proportional to its squared reconstruction loss, its encoder column
    that direction scaled to 0.2 x the mean norm of the live encoder columns, its encoder bias 0, and the Adam
    moments of those entries 0. x: a host batch (N, d_in). Returns how many latents were resampled."""
    dead_ids = np.flatnonzero(dead)
    if not len(dead_ids):
        return 0
    with no_grad():
        xt = Tensor(x, device=sae.W_enc.device)
        losses = ((sae(xt) - xt) ** 2).sum(-1).numpy().astype(np.float64) ** 2
    probs = losses / losses.sum() if losses.sum() > 0 else np.full(len(x), 1.0 / len(x))
    picks = rng.choice(len(x), size=len(dead_ids), p=probs)
    dirs = x[picks] - sae.b_dec.numpy()
    dirs = dirs / np.maximum(np.linalg.norm(dirs, axis=1, keepdims=True), 1e-12)
    W_enc, W_dec, b_enc = sae.W_enc.numpy().copy(), sae.W_dec.numpy().copy(), sae.b_enc.numpy().copy()
    alive = ~dead
    enc_norm = np.linalg.norm(W_enc[:, alive], axis=0).mean() if alive.any() else 1.0
    W_dec[dead_ids] = dirs
    W_enc[:, dead_ids] = dirs.T * encoder_scale * enc_norm
    b_enc[dead_ids] = 0
    for p, value in ((sae.W_enc, W_enc), (sae.W_dec, W_dec), (sae.b_enc, b_enc)):
        p.copy_(value.astype(np.float32))
        state = optimizer.state.get(p, {})
        for key in ("exp_avg", "exp_avg_sq"):
            if isinstance(state.get(key), Tensor):
                m = state[key].numpy().copy()
                if p is sae.W_enc:
                    m[:, dead_ids] = 0
                else:
                    m[dead_ids] = 0
                state[key] = Tensor(m, device=p.device)
    sae.tokens_since_fired[dead_ids] = 0
    return len(dead_ids)


def init_from_data(sae, directions):
    """Start each latent at a data point: W_dec's rows the normalized rows of `directions` (d_hidden, d_in: samples
    of x - b_dec), W_enc their transpose. Every latent then starts inside the data's subspace and fires on the
    inputs near its point (train_sae's docstring has the measured difference)."""
    w = np.asarray(directions, np.float64)
    w = (w / np.maximum(np.linalg.norm(w, axis=1, keepdims=True), 1e-12)).astype(np.float32)
    sae.W_dec.copy_(w)
    sae.W_enc.copy_(np.ascontiguousarray(w.T))


def train_sae(source, d_hidden=None, expansion=8, kind="topk", k=32, l1=5.0, tokens=2_000_000, batch_size=1024,
              lr=4e-3, aux_k=None, aux_coef=1 / 32, dead_tokens=None, resample_at=None, resample_scale=None,
              device=None,
              progress=True, seed=0, max_tokens=None, log_every=50, init="data"):
    """Train a SparseAutoencoder with tinyllm's Adam on `source`, for `tokens` activation vectors seen (passes over
    the data, reshuffled each pass), in batches of `batch_size`; returns the SAE, with `sae.train_log`, a dict:
    history (a list of {step, tokens, loss, mse, l0, dead_fraction} every `log_every` steps), tokens (seen),
    seconds, scale and resampled (how many latents were resampled).

    source: activations (N, d_in) or (..., d_in) (NumPy or Tensor), or (model, hook_name, tokens) whose activations
    are read with collect_activations (at most max_tokens of them). d_hidden defaults to expansion * d_in.

    As SAELens and Gao et al. 2024: the activations are scaled by s so that their mean squared norm is d_in
    (`scale`; the learning rate and l1 then do not depend on the layer's scale) and the scale is folded back into
    b_enc and b_dec at the end (the features of raw activations are s times those of scaled ones); b_dec starts at
    the geometric median of a sample; W_dec's gradient loses its component along the rows before each step and the
    rows are normalized after it.

    init="data" (default) starts each latent at a random data point less b_dec (init_from_data; W_enc still W_dec's
    transpose), init="random" at the constructor's random directions. On a residual stream whose variance sits in
    a few directions, random directions leave many latents below every top-k threshold from the first steps
    (bench/sae.py, a config M model's 3072 latents after 2M tokens: 59 % dead at init="random" and lr 1e-3, AuxK
    notwithstanding; about 2 % at init="data" and lr 4e-3, under 1 % over the last 100k training tokens).

    relu: dead latents (not fired in `dead_tokens`, default 1/5 of the run) are resampled (resample_dead, encoder
    columns at resample_scale = 0.2 x the live ones' mean norm) at the fractions `resample_at` of the run (default
    1/4, 1/2, 3/4). topk: AuxK on the latents dead for `dead_tokens` (default: min(100k, 1/10 of the run)), no
    resampling unless `resample_at` asks (encoder columns then at resample_scale, default 1).
    A tqdm bar shows the rate and ETA."""
    if isinstance(source, tuple):
        if len(source) != 3:
            raise ValueError("train_sae: source must be activations or a tuple (model, hook_name, tokens), got a "
                             f"tuple of {len(source)}")
        model, hook_name, toks = source
        acts = collect_activations(model, hook_name, toks, max_tokens=max_tokens, progress=progress)
        device = device if device is not None else next(model.parameters()).device
    else:
        acts = as_activations(source)
        if max_tokens is not None:
            acts = acts[:int(max_tokens)]
    if tokens < 1 or batch_size < 1:
        raise ValueError(f"train_sae: tokens and batch_size must be >= 1, got {tokens}, {batch_size}")
    n, d_in = acts.shape
    d_hidden = int(d_hidden) if d_hidden is not None else int(expansion * d_in)
    if dead_tokens is None:
        dead_tokens = max(batch_size, tokens // 5 if kind == "relu" else min(100_000, tokens // 10))
    sae = SparseAutoencoder(d_in, d_hidden, kind=kind, k=k, l1=l1, aux_k=aux_k, aux_coef=aux_coef,
                            dead_tokens=dead_tokens, seed=seed, device=device)
    device = sae.W_enc.device
    rng = np.random.default_rng(seed)
    sample = acts[rng.choice(n, size=min(n, 4096), replace=False)]
    scale = float(np.sqrt((sample.astype(np.float64) ** 2).sum(1).mean() / d_in)) or 1.0
    b_dec = geometric_median(sample / scale).astype(np.float32)
    sae.b_dec.copy_(b_dec)
    if init == "data":
        init_from_data(sae, acts[rng.choice(n, size=d_hidden, replace=n < d_hidden)] / scale - b_dec)
    elif init != "random":
        raise ValueError(f"train_sae: init must be 'data' or 'random', got {init!r}")
    opt = Adam(sae.parameters(), lr=lr)
    steps = max(1, math.ceil(tokens / batch_size))
    if resample_at is None:
        resample_at = (0.25, 0.5, 0.75) if kind == "relu" else ()
    if resample_scale is None:
        resample_scale = 0.2 if kind == "relu" else 1.0
    resample_steps = {max(1, int(f * steps)) for f in resample_at}
    log = {"history": [], "tokens": 0, "seconds": 0.0, "scale": scale, "resampled": 0}
    bar = progress_bar(steps * min(batch_size, n), f"SAE {kind} {d_in}→{d_hidden}", "tok") if progress else None
    order, pos, start = rng.permutation(n), 0, time.perf_counter()
    for step in range(1, steps + 1):
        if pos + batch_size > n:
            order, pos = rng.permutation(n), 0
        batch = acts[order[pos:pos + batch_size]] / scale
        pos += batch_size
        x = Tensor(batch, device=device)
        dead = sae.dead_mask() if kind == "topk" else None
        loss, mse, fired, l0 = train_step_loss(sae, x, dead)
        opt.zero_grad()
        loss.backward()
        sae.project_decoder_grad()
        opt.step()
        sae.normalize_decoder()
        sae.tokens_since_fired += len(batch)
        sae.tokens_since_fired[fired] = 0
        log["tokens"] += len(batch)
        if step in resample_steps:
            log["resampled"] += resample_dead(sae, opt, acts[rng.choice(n, min(n, 8192), replace=False)] / scale,
                                              sae.dead_mask(), rng, resample_scale)
        if step % log_every == 0 or step == steps:
            entry = {"step": step, "tokens": log["tokens"], "loss": loss.item(), "mse": mse.item(), "l0": l0,
                     "dead_fraction": float(sae.dead_mask().mean())}
            log["history"].append(entry)
            if bar is not None:
                bar.set_postfix(loss=f"{entry['loss']:.4f}", l0=f"{l0:.1f}", dead=f"{entry['dead_fraction']:.3f}")
        if bar is not None:
            bar.update(len(batch))
    if bar is not None:
        bar.close()
    with no_grad():  # fold the scale back: features of raw x are scale x those of x / scale
        sae.b_dec.copy_(sae.b_dec.detach() * scale)
        sae.b_enc.copy_(sae.b_enc.detach() * scale)
    log["seconds"] = time.perf_counter() - start
    sae.train_log = log
    return sae


# ---- metrics ----------------------------------------------------------------------------------------------------
def sae_metrics(sae, acts, model=None, hook_name=None, tokens=None, batch_size=4096, max_windows=16, batch_windows=8):
    """SAELens's evaluation metrics of `sae` on activations `acts` (N, d_in) or (..., d_in), a dict:

    - explained_variance: 1 - sum ||x - x_hat||^2 / sum ||x - mean(x)||^2 over all the tokens (SAELens's
      `explained_variance`, the mean centred over the whole set rather than per batch);
    - l0: mean number of active latents per token; l1: mean sum of the feature activations per token;
    - mse: mean over tokens and components of (x - x_hat)^2;
    - dead_features: how many latents fire on none of the tokens (a count, as SAELens), and dead_fraction =
      dead_features / d_hidden;
    - with `model`, `hook_name` and `tokens` (1-D): ce_loss_score = (CE_ablated - CE_sae) / (CE_ablated - CE_clean)
      over up to `max_windows` windows of the model's context length, CE the mean next-token cross-entropy:
      CE_clean the model's own, CE_sae with the hook's activation replaced by the SAE's reconstruction
      (model.run_with_hooks), CE_ablated with it zeroed (SAELens's zero ablation); also ce_loss_without_sae,
      ce_loss_with_sae, ce_loss_with_ablation (SAELens's names)."""
    x_all = as_activations(acts, sae.d_in, "sae_metrics")
    device = sae.W_enc.device
    sq_err = total_sq = l0 = l1 = 0.0
    fired = np.zeros(sae.d_hidden, bool)
    mean = x_all.astype(np.float64).mean(0)
    with no_grad():
        for s in range(0, len(x_all), batch_size):
            xb = x_all[s:s + batch_size]
            f_t = sae.encode(Tensor(xb, device=device))
            recon = sae.decode(f_t).numpy().astype(np.float64)
            f = f_t.numpy()
            sq_err += float(((recon - xb) ** 2).sum())
            total_sq += float(((xb - mean) ** 2).sum())
            l0 += float((f > 0).sum())
            l1 += float(np.abs(f).sum())
            fired |= (f > 0).any(0)
    n = len(x_all)
    out = {"explained_variance": 1.0 - sq_err / total_sq if total_sq > 0 else float("nan"),
           "l0": l0 / n, "l1": l1 / n, "mse": sq_err / (n * sae.d_in),
           "dead_features": int((~fired).sum()), "dead_fraction": float((~fired).mean())}
    if model is not None:
        if hook_name is None or tokens is None:
            raise ValueError("sae_metrics: ce_loss_score needs hook_name and tokens with the model")
        out.update(ce_loss_metrics(sae, model, hook_name, tokens, max_windows, batch_windows))
    return out


def _mean_ce(logits, idx):
    """Mean next-token cross-entropy of logits (B, T, V) on windows idx (B, T): position t predicts t + 1."""
    B, T, V = logits.shape
    return F.cross_entropy(logits[:, :-1].reshape(B * (T - 1), V), idx[:, 1:].reshape(B * (T - 1))).item()


def ce_loss_metrics(sae, model, hook_name, tokens, max_windows=16, batch_windows=8):
    """ce_loss_score = (CE_ablated - CE_sae) / (CE_ablated - CE_clean) (SAELens; 1: the reconstruction loses
    nothing the model uses, 0: as bad as zeroing the activation) and the three cross-entropies, over up to
    `max_windows` windows of `tokens`."""
    windows = token_windows(tokens, context_length(model))[:max_windows]
    device = next(model.parameters()).device
    sums = {"clean": 0.0, "sae": 0.0, "ablated": 0.0}
    with no_grad():
        for s in range(0, len(windows), batch_windows):
            idx = Tensor(windows[s:s + batch_windows], device=device)
            w = len(windows[s:s + batch_windows])
            sums["clean"] += w * _mean_ce(model.run_with_hooks(idx, fwd_hooks=[]), idx)
            sums["sae"] += w * _mean_ce(model.run_with_hooks(idx, fwd_hooks=[(hook_name, lambda a, hook: sae(a))]), idx)
            sums["ablated"] += w * _mean_ce(model.run_with_hooks(idx, fwd_hooks=[(hook_name, lambda a, hook: a * 0)]),
                                            idx)
    clean, with_sae, ablated = (sums[key] / len(windows) for key in ("clean", "sae", "ablated"))
    gap = ablated - clean
    return {"ce_loss_score": (ablated - with_sae) / gap if gap != 0 else float("nan"),
            "ce_loss_without_sae": clean, "ce_loss_with_sae": with_sae, "ce_loss_with_ablation": ablated}
