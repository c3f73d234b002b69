"""Matrix decompositions: tinyllm.linalg's primitives.

Each is a host op: its forward runs through NumPy's LAPACK on every runtime (the NumPy and C runtimes run the op's
NumPy forward, the WGSL runtime reads the input back, runs it and uploads the result), since no runtime has a kernel
of its own for them; their backward rules are graph math (MATMUL, SOLVE, elementwise ops and views), so gradients
run on every runtime and are differentiable again.

A decomposition with several outputs is one op with the output it gives in its `arg` (("U", ...), ("S", ...)):
each output is its own node, all of them read one cached LAPACK call on the same input, and each node's rule is the
part of the joint gradient that is linear in that output's gradient, so autograd's sum over the outputs that the
loss uses is the whole formula, and an output the loss does not use adds nothing (torch's "undefined gradient").
All matrices are over the last two axes, batched over the leading ones. Aᵀ below is the transpose of the last two
axes, ∘ the elementwise product, diag(v) the diagonal matrix of v."""
import threading
from collections import OrderedDict

import numpy as np

from .. import dtype as dt
from ..graph import build, const
from .base import Op, register


class LinAlgError(RuntimeError):
    """A decomposition failed on its input (a singular matrix for solve/inv, one not positive-definite for
    cholesky), as torch.linalg.LinAlgError: the message names the op and the batch element."""


class Decomposition(Op):
    """A host op of tinyllm.linalg: float32 / float64 matrices over the last two axes, forward by NumPy's LAPACK."""
    host = True
    autocast = "float32"


# -- the shared forward: one LAPACK call per input value, whichever of its outputs' nodes asks first ----------

_CACHE = OrderedDict()
_LOCK = threading.Lock()


def _cached(name, fn, x, extra=()):
    """fn(x), remembered for the last few inputs by value (a buffer pool may reuse an array, so never by id); the
    caller copies what it hands out, so nothing downstream (an in-place op) can change the remembered result."""
    x = np.ascontiguousarray(x)
    key = (name, extra, x.dtype.str, x.shape, x.tobytes())
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit
    with np.errstate(all="ignore"):
        hit = fn(x)
    with _LOCK:
        _CACHE[key] = hit
        while len(_CACHE) > 16:
            _CACHE.popitem(last=False)
    return hit


def _batch_element(x, fails):
    """The first batch element (its flat index) on which fails(matrix) is true, or None."""
    flat = x.reshape((-1,) + x.shape[-2:])
    for i, a in enumerate(flat):
        if fails(a):
            return i
    return None


def _raise(op, x, what, fails):
    i = _batch_element(x, fails) if x.ndim > 2 else 0
    where = f"(Batch element {i}): " if x.ndim > 2 and i is not None else ""
    raise LinAlgError(f"linalg.{op}: {where}{what}")


def _raises(fn):
    """A test of one matrix: whether fn(matrix) raises NumPy's LinAlgError."""
    def fails(a):
        try:
            fn(a)
            return False
        except np.linalg.LinAlgError:
            return True
    return fails


_singular, _not_pd = _raises(np.linalg.inv), _raises(np.linalg.cholesky)


def _matrices(op, a):
    """a's shape, checked: float32 / float64 matrices (at least 2 axes)."""
    _floats(op, a)
    if len(a.shape) < 2:
        raise ValueError(f"linalg.{op}: A must have at least 2 dimensions, got shape {a.shape}")
    return a.shape


def _square(op, a):
    if len(a.shape) < 2 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"linalg.{op}: A must be batches of square matrices, but they are "
                         f"{a.shape[-2] if len(a.shape) > 1 else 1} by {a.shape[-1] if a.shape else 1} matrices")


def _floats(op, *xs):
    for x in xs:
        if not x.dtype.is_float or x.dtype.is_low:
            raise TypeError(f"linalg.{op}: Low precision dtypes not supported. Got {x.dtype.name} (float32 and "
                            "float64 only)")


# -- graph helpers for the backward rules (nodes only: this layer has no Tensor) ------------------------------

def _narrow(x, axis, start, stop):
    axis %= len(x.shape)
    return build("SHRINK", x, arg=tuple((start, stop, 1) if i == axis else (0, s, 1) for i, s in enumerate(x.shape)))


def _diag_embed(v):
    """(..., n) -> (..., n, n) with v on the diagonal: v as a column padded to width n + 1, read flat, is the
    diagonal matrix's first n² elements."""
    *b, n = v.shape
    b = tuple(b)
    full = tuple((0, s, 1) for s in b)
    padded = build("PAD", v.reshape(b + (n, 1)), arg=(b + (n, n + 1), full + ((0, n, 1), (0, 1, 1))))
    return _narrow(padded.reshape(b + (n * (n + 1),)), -1, 0, n * n).reshape(b + (n, n))


def _band(n, dtype, below, on, above, shape=None):
    """The n x n constant with `below` under the diagonal, `on` on it and `above` over it (broadcast to `shape`):
    a row w = [on, above × (n-1), below × n] repeated n times and read as rows of 2n - 1 puts w[j - i] (mod 2n) at
    (i, j)."""
    parts = [const(on, (1,), dtype)] + ([const(above, (n - 1,), dtype)] if n > 1 else []) + [const(below, (n,), dtype)]
    w = build("CAT", *parts, arg=0)
    rows = _narrow(w.reshape((1, 2 * n)).expand((n, 2 * n)).reshape((2 * n * n,)), 0, 0, n * (2 * n - 1))
    m = _narrow(rows.reshape((n, 2 * n - 1)), 1, 0, n)
    if shape is not None and tuple(shape) != (n, n):
        m = m.reshape((1,) * (len(shape) - 2) + (n, n)).expand(shape)
    return m


def _eye(n, dtype, shape=None):
    return _band(n, dtype, 0, 1, 0, shape)


def _mT(x):
    return x.transpose_last()


def _col(v):  # (..., k) -> (..., 1, k): scales the columns
    return v.reshape(v.shape[:-1] + (1, v.shape[-1]))


def _row(v):  # (..., k) -> (..., k, 1): scales the rows
    return v.reshape(v.shape + (1,))


def _bc(v, shape):
    return v.expand(tuple(shape))


def _solve(a, b, name="solve"):
    return build("SOLVE", a, b, arg=name)


def _inv(a, name="solve"):
    return _solve(a, _eye(a.shape[-1], a.dtype, a.shape), name)


# -- the primitives ------------------------------------------------------------------------------------------

@register
class SVD(Decomposition):
    """The singular value decomposition A = U diag(S) Vh of A (..., m, n), k = min(m, n); `arg` = (part, full):
    part "U" gives U (..., m, m if full else k), "S" the singular values (..., k), descending, "Vh" Vh (..., n if full
    else k, n). Singular vectors are unique up to a sign per pair (u_i, v_i) (LAPACK's gesdd picks it, as torch on a
    CPU, but nothing promises the same sign as torch).
    Backward (torch's svd_backward; the reduced U, Vh, so with full=True the extra columns get no gradient):
        F_ij = 1 / (σ_j² − σ_i²) (i ≠ j), skew(X) = X − Xᵀ
        from gS:  dA = U diag(gS) Vh
        from gU:  dA = U [F ∘ skew(Uᵀ gU) diag(S)] Vh + (I − U Uᵀ) gU diag(1/S) Vh   (the second term: m > n)
        from gVh: dA = U [diag(S) F ∘ skew(Vh gVhᵀ)] Vh + U diag(1/S) gVh (I − Vhᵀ Vh)   (the second term: m < n)
    At repeated singular values F is infinite and a loss that depends on the vectors gets inf / nan, as torch's; a
    loss of S alone (svdvals) has none of it."""
    def infer(src, arg):
        (a,) = src
        part, full = arg
        *b, m, n = _matrices("svd", a)
        k = min(m, n)
        shape = {"U": (m, m if full else k), "S": (k,), "Vh": (n if full else k, n)}[part]
        return tuple(b) + shape, a.dtype

    def forward(a, arg):
        part, full = arg
        u, s, vh = _cached("svd", lambda x: np.linalg.svd(x, full_matrices=True), a)
        k = s.shape[-1]
        return np.array({"U": u if full else u[..., :k], "S": s, "Vh": vh if full else vh[..., :k, :]}[part])

    def backward(dy, y):
        (a,) = y.src
        part, full = y.arg
        m, n = a.shape[-2:]
        k = min(m, n)
        u = build("SVD", a, arg=("U", False))
        s = build("SVD", a, arg=("S", False))
        vh = build("SVD", a, arg=("Vh", False))
        shape = a.shape[:-2] + (k, k)
        if part == "S":
            return (u.matmul(_diag_embed(dy)).matmul(vh),)
        s2 = s * s
        f = _bc(_col(s2), shape) - _bc(_row(s2), shape)  # σ_j² − σ_i²
        eye = _eye(k, dt.bool_, shape)
        f = eye.where(const(1.0, shape, a.dtype), f)  # the diagonal, where skew() is zero, divides by 1
        if part == "U":
            gu = _narrow(dy, -1, 0, k) if full else dy
            x = _mT(u).matmul(gu)
            j = (x - _mT(x)) * _bc(_col(s), shape) / f
            ga = u.matmul(j).matmul(vh)
            if m > n:
                gus = gu / _bc(_col(s), gu.shape)
                ga = ga + (gus - u.matmul(_mT(u).matmul(gus))).matmul(vh)
            return (ga,)
        gvh = _narrow(dy, -2, 0, k) if full else dy
        x = vh.matmul(_mT(gvh))
        j = _bc(_row(s), shape) * (x - _mT(x)) / f
        ga = u.matmul(j).matmul(vh)
        if m < n:
            sgvh = gvh / _bc(_row(s), gvh.shape)
            ga = ga + u.matmul(sgvh - sgvh.matmul(_mT(vh)).matmul(vh))
        return (ga,)


@register
class EIGH(Decomposition):
    """The eigendecomposition A = V diag(L) Vᵀ of a symmetric A (..., n, n), read from its lower (arg[1] = "L") or
    upper ("U") triangle; `arg` = (part, UPLO): part "L" gives the eigenvalues (..., n), ascending, "V" the
    eigenvectors (..., n, n) as columns, each unique up to its sign (LAPACK's syevd picks it; nothing promises torch's).
    Backward (torch's, for a symmetric A; the gradient is not symmetrized, as torch's):
        from gL: dA = V diag(gL) Vᵀ
        from gV: dA = V [F ∘ ½ (Vᵀ gV − gVᵀ V)] Vᵀ,   F_ij = 1 / (λ_j − λ_i) (i ≠ j), 0 on the diagonal
    At repeated eigenvalues F is infinite and a loss that depends on the vectors gets inf / nan, as torch's; a loss
    of the eigenvalues alone (eigvalsh) has none of it."""
    def infer(src, arg):
        (a,) = src
        part, uplo = arg
        _floats("eigh", a)
        _square("eigh", a)
        if uplo not in ("L", "U"):
            raise ValueError(f"linalg.eigh: UPLO must be 'L' or 'U', got {uplo!r}")
        return (a.shape[:-1] if part == "L" else a.shape), a.dtype

    def forward(a, arg):
        part, uplo = arg
        w, v = _cached("eigh", lambda x: np.linalg.eigh(x, UPLO=uplo), a, uplo)
        return np.array(w if part == "L" else v)

    def backward(dy, y):
        (a,) = y.src
        part, uplo = y.arg
        v = build("EIGH", a, arg=("V", uplo))
        if part == "L":
            return (v.matmul(_diag_embed(dy)).matmul(_mT(v)),)
        w = build("EIGH", a, arg=("L", uplo))
        shape = a.shape
        e = _bc(_col(w), shape) - _bc(_row(w), shape)  # λ_j − λ_i
        eye = _eye(a.shape[-1], dt.bool_, shape)
        x = _mT(v).matmul(dy)
        j = eye.where(const(0.0, shape, a.dtype), (x - _mT(x)) * 0.5 / e)
        return (v.matmul(j).matmul(_mT(v)),)


def _qr_square_grad(gq, gr, q, r):
    """dA of A = Q R (m ≥ n, reduced) for the gradients gq of Q and gr of R (either may be None: zero):
    [gQ + Q copyltu(R gRᵀ − gQᵀ Q)] R⁻ᵀ (QR's docstring)."""
    n = r.shape[-1]
    shape = r.shape[:-2] + (n, n)
    lower = _band(n, r.dtype, 1, 1, 0, shape)
    strict = _band(n, r.dtype, 1, 0, 0, shape)
    mm = None if gr is None else r.matmul(_mT(gr))
    if gq is not None:
        mm = -(_mT(gq).matmul(q)) if mm is None else mm - _mT(gq).matmul(q)
    x = q.matmul(mm * lower + _mT(mm * strict))
    x = x + gq if gq is not None else x
    return _mT(_solve(r, _mT(x)))


@register
class QR(Decomposition):
    """The QR decomposition A = Q R of A (..., m, n), k = min(m, n); `arg` = (part, complete): part "Q" gives Q
    (..., m, m if complete else k) with orthonormal columns, "R" the upper-triangular R (..., m if complete else k, n).
    Householder QR (LAPACK's geqrf) fixes signs as torch's does, so Q and R match torch's up to rounding.
    Backward (Walter & Lehmann, Seeger et al.; for m ≥ n and reduced Q, R; copyltu(M) = tril(M) + tril(M, −1)ᵀ):
        M = R gRᵀ − gQᵀ Q,   dA = [gQ + Q copyltu(M)] R⁻ᵀ
    split by linearity: from gQ, dA = [gQ − Q copyltu(gQᵀ Q)] R⁻ᵀ; from gR, dA = Q copyltu(R gRᵀ) R⁻ᵀ (R⁻ᵀ through
    SOLVE).
    A wide A (m < n; Q is m x m in either mode), as torch's linalg_qr_backward: split A = [X | Y] with X (m, m) and
    R = [U | V] likewise, so X = Q U is a square QR and Y = Q V, i.e. V = Qᵀ Y. Then dV = dQᵀ Y + Qᵀ dY, so
        tr(gVᵀ dV) = tr((Y gVᵀ)ᵀ dQ) + tr((Q gV)ᵀ dY):
    gV adds Y gVᵀ to the gradient of Q and gives gY = Q gV; the square rule above on (gQ + Y gVᵀ, gU) gives gX, and
    dA = [gX | gY]. By linearity again: from gQ, dA = [square rule of gQ | 0]; from gR = [gU | gV],
    dA = [square rule of (Y gVᵀ, gU) | Q gV].
    A tall A with mode='complete' raises NotImplementedError when the gradient is asked for (as torch: the extra
    columns of Q are not determined by A)."""
    def infer(src, arg):
        (a,) = src
        part, complete = arg
        *b, m, n = _matrices("qr", a)
        k = m if complete else min(m, n)
        return tuple(b) + ((m, k) if part == "Q" else (k, n)), a.dtype

    def forward(a, arg):
        part, complete = arg
        q, r = _cached("qr", lambda x: np.linalg.qr(x, mode="complete" if complete else "reduced"), a, complete)
        return np.array(q if part == "Q" else r)

    def backward(dy, y):
        (a,) = y.src
        part, complete = y.arg
        m, n = a.shape[-2:]
        if complete and m > n:
            raise NotImplementedError(f"linalg.qr: the gradient of mode='complete' is implemented for m <= n, got a "
                                      f"{m} x {n} A (as torch: use mode='reduced')")
        q = build("QR", a, arg=("Q", complete))
        r = build("QR", a, arg=("R", complete))
        if m >= n:
            return (_qr_square_grad(dy if part == "Q" else None, dy if part == "R" else None, q, r),)
        u, axis = _narrow(r, -1, 0, m), len(a.shape) - 1
        if part == "Q":
            gx = _qr_square_grad(dy, None, q, u)
            return (build("CAT", gx, const(0.0, a.shape[:-1] + (n - m,), a.dtype), arg=axis),)
        gu, gv = _narrow(dy, -1, 0, m), _narrow(dy, -1, m, n)
        gx = _qr_square_grad(_narrow(a, -1, m, n).matmul(_mT(gv)), gu, q, u)
        return (build("CAT", gx, q.matmul(gv), arg=axis),)


@register
class CHOLESKY(Decomposition):
    """The lower-triangular L with A = L Lᵀ of a symmetric positive-definite A (..., n, n), read from its lower
    triangle (torch.linalg.cholesky(upper=True) is its transpose). Not positive-definite: LinAlgError.
    Backward (Murray 2016, as torch's cholesky_backward; Φ(X) = tril(X) with its diagonal halved):
        P = L⁻ᵀ Φ(Lᵀ gL) L⁻¹,   dA = ½ (P + Pᵀ)   (L⁻¹ through SOLVE)"""
    def infer(src, arg):
        (a,) = src
        _floats("cholesky", a)
        _square("cholesky", a)
        return a.shape, a.dtype

    def forward(a):
        try:
            return np.linalg.cholesky(a)
        except np.linalg.LinAlgError:
            _raise("cholesky", a, "The factorization could not be completed because the input is not "
                   "positive-definite.", _not_pd)

    def backward(dy, y):
        (a,) = y.src
        n = a.shape[-1]
        phi = _mT(y).matmul(dy) * _band(n, a.dtype, 1, 0.5, 0, a.shape)
        p = _solve(_mT(y), _mT(_solve(_mT(y), _mT(phi))))  # L⁻ᵀ Φ L⁻¹ = L⁻ᵀ (L⁻ᵀ Φᵀ)ᵀ
        return ((p + _mT(p)) * 0.5,)


@register
class SOLVE(Decomposition):
    """X = A⁻¹ B for a square A (..., n, n) and B (..., n, k), batch axes equal (the front end broadcasts them),
    by LAPACK's LU (gesv); `arg`: the linalg function it serves ("solve", "inv", ...), named by its errors. A singular
    A raises LinAlgError naming the batch element.
    Backward (Giles 2008): gB = A⁻ᵀ gX = SOLVE(Aᵀ, gX),   gA = −gB Xᵀ"""
    def infer(src, arg):
        a, b = src
        _floats(arg, a, b)
        _square(arg, a)
        if len(b.shape) != len(a.shape) or b.shape[:-2] != a.shape[:-2] or b.shape[-2] != a.shape[-1]:
            raise ValueError(f"linalg.solve: incompatible shapes of A {a.shape} and B {b.shape}")
        if a.dtype is not b.dtype:
            raise TypeError(f"linalg.solve: A and B must have the same dtype, got {a.dtype.name} and {b.dtype.name}")
        return b.shape, a.dtype

    def forward(a, b, arg):
        try:
            return np.linalg.solve(a, b)
        except np.linalg.LinAlgError:
            _raise(arg, a, "The solver failed because the input matrix is singular.", _singular)

    def backward(dy, y):
        a, _ = y.src
        gb = _solve(_mT(a), dy, y.arg)
        return (-(gb.matmul(_mT(y))), gb)


@register
class SLOGDET(Decomposition):
    """(sign, log|det A|) of a square A (..., n, n) by LAPACK's LU; `arg` picks the part ("sign" or "logabsdet"),
    each (...). A singular A gives sign 0 and logabsdet −inf, as torch.
    Backward (Giles 2008): the sign is piecewise constant (no gradient); d log|det A| = tr(A⁻¹ dA), so
    dA = g A⁻ᵀ = g SOLVE(Aᵀ, I) (undefined at a singular A; linalg.det takes an SVD formula there)."""
    def infer(src, arg):
        (a,) = src
        _floats("slogdet", a)
        _square("slogdet", a)
        return a.shape[:-2], a.dtype

    def forward(a, arg):
        sign, logabs = _cached("slogdet", np.linalg.slogdet, a)
        return (sign if arg == "sign" else logabs).astype(a.dtype)

    def backward(dy, y):
        (a,) = y.src
        if y.arg == "sign":
            return (None,)
        g = dy.reshape(dy.shape + (1, 1)).expand(a.shape)
        return (g * _inv(_mT(a), "slogdet"),)


# -- complex matrices in the graph: (re, im) pairs of real nodes, for EIG's backward -------------------------

def _cplx(z):
    """A node of shape S + (2,) holding (re, im) pairs -> the pair of real nodes of shape S."""
    s = z.shape[:-1]
    return tuple(_narrow(z, -1, k, k + 1).reshape(s) for k in (0, 1))


def _cmm(x, y):
    """The complex matrix product of two (re, im) pairs."""
    (a, b), (c, d) = x, y
    return a.matmul(c) - b.matmul(d), a.matmul(d) + b.matmul(c)


def _cH(x):
    """The conjugate transpose of an (re, im) pair."""
    return _mT(x[0]), -_mT(x[1])


def _re_solve(a, b, name):
    """Re(A⁻¹ B) for complex A (..., n, n) and B (..., n, k) given as (re, im) pairs, by the real 2n x 2n system
    [[Ar, −Ai], [Ai, Ar]] [Xr; Xi] = [Br; Bi] (SOLVE, so differentiable again); Xr is the first n rows."""
    (ar, ai), (br, bi) = a, b
    r = len(ar.shape)
    big = build("CAT", build("CAT", ar, -ai, arg=r - 1), build("CAT", ai, ar, arg=r - 1), arg=r - 2)
    x = _solve(big, build("CAT", br, bi, arg=r - 2), name)
    return _narrow(x, -2, 0, ar.shape[-1])


@register
class EIG(Decomposition):
    """The eigendecomposition A = V diag(L) V⁻¹ of a general real square A (..., n, n), by LAPACK's geev (as torch
    on a CPU); `arg` is the part: "L" gives the eigenvalues (..., n, 2), "V" the eigenvectors (..., n, n, 2) as
    columns, both complex, stored as (re, im) pairs on a trailing axis of 2 in A's dtype (tinyllm.complex wraps them
    as complex64 / complex128). Eigenvalues come in LAPACK's order (not sorted), each eigenvector has unit norm and
    its largest component real (geev's choice, torch's too); beyond that a column is unique only up to a phase
    e^{iφ}, so a loss should not depend on it (|V|, A V − V diag(L), ...). A matrix with NaN / inf raises
    LinAlgError (a RuntimeError, torch's type for it) with torch's message.
    Backward (torch's linalg_eig_backward, Giles 2008 / arXiv:1701.00392 eq. 4.77 with the unit-norm term), for the
    conjugate gradients gL, gV (tinyllm.complex's convention is torch's):
        gA = V⁻ᴴ [diag(gL) + (Vᴴ gV − Vᴴ V diag(Re diag(Vᴴ gV))) / Ē] Vᴴ,
        Ē_ij = conj(λ_j) − conj(λ_i) (i ≠ j), the diagonal of the quotient dropped (replaced by gL),
    and A real, so its gradient is the real part (torch's handle_r_to_c). Derivation: from A V = V L,
    dL = diag(V⁻¹ dA V) and, for unit-norm columns, dV = V (F ∘ V⁻¹ dA V) − V diag(Re diag(Vᴴ V (F ∘ V⁻¹ dA V)))
    with F_ij = 1 / (λ_j − λ_i) off the diagonal, 0 on it; the adjoint of dA ↦ (dL, dV) under Re tr(Xᴴ Y) is the
    formula above (the −Vᴴ V diag(Re ...) term is the adjoint of the norm-fixing projection). By linearity each
    part's node gives its own term: from gL, Re(V⁻ᴴ diag(gL) Vᴴ); from gV, the off-diagonal quotient. The diagonal
    of (Vᴴ gV − ...) is i Im diag(Vᴴ gV), zero for a loss that does not depend on the phases (torch checks that and
    raises; this rule drops it, so a phase-dependent loss gets the gradient of its phase-invariant part).
    Complex algebra is written on (re, im) pairs: X / Ē = X (λ_j − λ_i) / |λ_j − λ_i|², and V⁻ᴴ Y as a real 2n x 2n
    SOLVE of [[Re, −Im], [Im, Re]]. At repeated eigenvalues Ē is zero and V may be singular: inf / nan, as torch."""
    def infer(src, arg):
        (a,) = src
        _floats("eig", a)
        _square("eig", a)
        if arg not in ("L", "V"):
            raise ValueError(f"EIG: part must be 'L' or 'V', got {arg!r}")
        return (a.shape[:-1] if arg == "L" else a.shape) + (2,), a.dtype

    def forward(a, arg):
        def eig(x):
            if not np.isfinite(x).all():
                raise LinAlgError("linalg.eig: input tensor should not contain infs or NaNs.")
            w, v = np.linalg.eig(x)  # real arrays when every eigenvalue is real
            return w.astype(np.result_type(x.dtype, np.complex64)), v.astype(np.result_type(x.dtype, np.complex64))
        w, v = _cached("eig", eig, a)
        z = w if arg == "L" else v
        return np.stack([z.real, z.imag], -1).astype(a.dtype)

    def backward(dy, y):
        (a,) = y.src
        n = a.shape[-1]
        shape = a.shape
        v = _cplx(build("EIG", a, arg="V"))
        g = _cplx(dy)
        if y.arg == "L":
            inner = tuple(_diag_embed(p) for p in g)
        else:
            vhgv = _cmm(_cH(v), g)
            r = (v[0] * g[0] + v[1] * g[1]).sum((len(shape) - 2,))  # Re diag(Vᴴ gV), (..., 1, n): scales columns
            vhv = _cmm(_cH(v), v)
            x = tuple(p - q * _bc(r, shape) for p, q in zip(vhgv, vhv))
            lr, li = _cplx(build("EIG", a, arg="L"))
            dr = _bc(_col(lr), shape) - _bc(_row(lr), shape)  # Re(λ_j − λ_i)
            di = _bc(_col(li), shape) - _bc(_row(li), shape)  # Im(λ_j − λ_i)
            eye = _eye(n, dt.bool_, shape)
            den = eye.where(const(1.0, shape, a.dtype), dr * dr + di * di)
            zero = const(0.0, shape, a.dtype)
            inner = (eye.where(zero, (x[0] * dr - x[1] * di) / den), eye.where(zero, (x[0] * di + x[1] * dr) / den))
        vh = _cH(v)
        return (_re_solve(vh, _cmm(inner, vh), "eig"),)
