"""torch.linalg's decompositions and what is built on them, with torch's names and return types. Five
decompositions are primitives (SVD, EIGH, EIG, QR, CHOLESKY) and two more factor-free ones (SOLVE, SLOGDET), all host
ops whose forward runs through NumPy's LAPACK on every runtime and whose backward is graph math (tinyllm/ops/linalg.py,
each rule derived in its op's docstring); svdvals, eigvalsh, inv, det, lstsq, pinv and matrix_rank are composites
of them. eig / eigvals (EIG) give complex tensors (tinyllm.complex) of a real input.

Signs: singular vectors and eigenvectors are unique up to a sign per vector; LAPACK picks it here as it does in
torch on a CPU, but nothing promises the same sign as torch, so compare what does not depend on it (U diag(S) Vh,
U Uᵀ, |U|, A v = λ v)."""
from collections import namedtuple

import numpy as np

from ..complex import _wrap
from ..factory import eye
from ..graph import build
from ..mixins import broadcast_shape
from ..ops.linalg import LinAlgError  # noqa: F401  (tinyllm.linalg.LinAlgError, as torch.linalg's)
from ..tensor import Tensor

# torch.return_types' named tuples, by torch's names
linalg_svd = namedtuple("linalg_svd", "U S Vh")
linalg_eigh = namedtuple("linalg_eigh", "eigenvalues eigenvectors")
linalg_eig = namedtuple("linalg_eig", "eigenvalues eigenvectors")
linalg_qr = namedtuple("linalg_qr", "Q R")
linalg_slogdet = namedtuple("linalg_slogdet", "sign logabsdet")
linalg_lstsq = namedtuple("linalg_lstsq", "solution residuals rank singular_values")

_TORCH_NAMES = {"float16": "Half", "bfloat16": "BFloat16", "int64": "Long", "int32": "Int", "bool": "Bool",
                "int8": "Char", "uint8": "Byte"}


def _check(op, A, square=False):
    if not isinstance(A, Tensor):
        raise TypeError(f"linalg.{op}: expected a Tensor, got {type(A).__name__}")
    if A.is_complex():
        raise NotImplementedError(f"linalg.{op}: complex input ({A.dtype.name}) is not supported: tinyllm.linalg "
                                  "takes float32 / float64 matrices")
    if A.dtype.is_low:
        raise RuntimeError(f"linalg.{op}: Low precision dtypes not supported. Got {_TORCH_NAMES[A.dtype.name]}")
    if not A.dtype.is_float:
        raise RuntimeError(f"linalg.{op}: Expected a floating point tensor as input. Got "
                           f"{_TORCH_NAMES.get(A.dtype.name, A.dtype.name)}")
    if A.ndim < 2:
        raise RuntimeError(f"linalg.{op}: The input tensor A must have at least 2 dimensions.")
    if square and A.shape[-1] != A.shape[-2]:
        raise RuntimeError(f"linalg.{op}: A must be batches of square matrices, but they are {A.shape[-2]} by "
                           f"{A.shape[-1]} matrices")


def _op(A, op, arg=None, *others):
    return A._make(build(op, A._node, *(t._node for t in others), arg=arg), *others)


def _empty(A):
    return A.detach().reshape(-1)[:0]


def _mT(x):
    return x.transpose(-2, -1)


def svd(A, full_matrices=True, *, driver=None):
    """(U, S, Vh) with A = U diag(S) Vh, as torch.linalg.svd (a linalg_svd named tuple); `driver` is CUDA-only in
    torch and ignored. Gradients: the SVD primitive's (inf / nan at repeated singular values when the loss depends
    on U or Vh, as torch)."""
    _check("svd", A)
    full = bool(full_matrices)
    return linalg_svd(_op(A, "SVD", ("U", full)), _op(A, "SVD", ("S", full)), _op(A, "SVD", ("Vh", full)))


def svdvals(A, *, driver=None):
    """The singular values, descending, as torch.linalg.svdvals; gradient U diag(gS) Vh."""
    _check("svdvals", A)
    return _op(A, "SVD", ("S", False))


def eigh(A, UPLO="L"):
    """(eigenvalues, eigenvectors) of a symmetric A, from its lower (UPLO="L") or upper triangle, eigenvalues
    ascending, as torch.linalg.eigh (a linalg_eigh named tuple). The symmetry is not checked, as torch."""
    _check("eigh", A, square=True)
    return linalg_eigh(_op(A, "EIGH", ("L", UPLO)), _op(A, "EIGH", ("V", UPLO)))


def eigvalsh(A, UPLO="L"):
    """The eigenvalues of a symmetric A, ascending, as torch.linalg.eigvalsh; gradient V diag(gL) Vᵀ."""
    _check("eigvalsh", A, square=True)
    return _op(A, "EIGH", ("L", UPLO))


def _complex(A, part):
    """The EIG primitive's part, (re, im) pairs on a trailing axis, as a complex tensor (tinyllm.complex)."""
    return _wrap(_op(A, "EIG", part))


def eig(A):
    """(eigenvalues, eigenvectors) of a general real square A, as torch.linalg.eig (a linalg_eig named tuple):
    complex64 for float32 A, complex128 for float64, eigenvalues in LAPACK's order (geev, as torch on a CPU), each
    eigenvector column of unit norm with its largest component real; a column is unique only up to a phase e^{iφ},
    so compare and differentiate what does not depend on it (A V = V diag(L), |V|). Complex A is not supported.
    Gradients: the EIG primitive's (torch's formula; inf / nan at repeated eigenvalues)."""
    _check("eig", A, square=True)
    return linalg_eig(_complex(A, "L"), _complex(A, "V"))


def eigvals(A):
    """The eigenvalues of a general real square A (complex, LAPACK's order), as torch.linalg.eigvals; gradient
    Re(V⁻ᴴ diag(gL) Vᴴ)."""
    _check("eigvals", A, square=True)
    return _complex(A, "L")


def qr(A, mode="reduced"):
    """(Q, R) with A = Q R, as torch.linalg.qr (a linalg_qr named tuple): mode "reduced", "complete", or "r"
    (Q is then an empty tensor, as torch's). Gradients as torch's: any shape but a tall A with mode="complete"."""
    _check("qr", A)
    if mode not in ("reduced", "complete", "r"):
        raise RuntimeError(f"qr received unrecognized mode '{mode}' but expected one of 'reduced' (default), 'r', "
                           "or 'complete'")
    complete = mode == "complete"
    R = _op(A, "QR", ("R", complete))
    Q = _op(A, "QR", ("Q", complete)) if mode != "r" else _empty(A)
    return linalg_qr(Q, R)


def cholesky(A, *, upper=False):
    """The lower-triangular L with A = L Lᵀ, or with upper=True the upper-triangular U = Lᵀ (A = Uᵀ U), as
    torch.linalg.cholesky; A's lower triangle is read either way (the same for a symmetric A). Not
    positive-definite: LinAlgError naming the batch element."""
    _check("cholesky", A, square=True)
    L = _op(A, "CHOLESKY")
    return _mT(L) if upper else L


def _solve(name, A, B):
    """SOLVE of A (..., n, n) and B (..., n, k), batch axes broadcast."""
    batch = broadcast_shape([A.shape[:-2], B.shape[:-2]], f"linalg.{name}")
    A = A.expand(*batch, *A.shape[-2:])
    B = B.expand(*batch, *B.shape[-2:])
    return _op(A, "SOLVE", name, B)


def solve(A, B, *, left=True):
    """X with A X = B (left=True) or X A = B (left=False), as torch.linalg.solve: B (..., n, k), or a vector (n,)
    / (..., n) where torch takes one; batch axes broadcast. A singular A raises LinAlgError."""
    _check("solve", A, square=True)
    if not isinstance(B, Tensor):
        raise TypeError(f"linalg.solve: B must be a Tensor, got {type(B).__name__}")
    if B.dtype is not A.dtype:
        raise RuntimeError(f"linalg.solve: Expected A and B to have the same dtype, but found A of type "
                           f"{A.dtype.name} and B of type {B.dtype.name} instead")
    vector = B.ndim == 1 or (B.ndim == A.ndim - 1 and B.shape == A.shape[:-1])
    if vector:
        B = B.unsqueeze(-1)
    n = A.shape[-1]
    if (B.shape[-2] if left else B.shape[-1]) != n:
        raise RuntimeError(f"linalg.solve: Incompatible shapes of A and B for the equation "
                           f"{'AX = B' if left else 'XA = B'} ({tuple(A.shape[-2:])} and {tuple(B.shape[-2:])})")
    X = _solve("solve", A, B) if left else _mT(_solve("solve", _mT(A), _mT(B)))
    return X.squeeze(-1) if vector else X


def inv(A):
    """A⁻¹, as torch.linalg.inv: SOLVE(A, I), so its gradient is −A⁻ᵀ gX A⁻ᵀ (Giles 2008). A singular A raises
    LinAlgError."""
    _check("inv", A, square=True)
    n = A.shape[-1]
    return _solve("inv", A, eye(n, dtype=A.dtype, device=A.device).expand(*A.shape))


def slogdet(A):
    """(sign, log|det A|), as torch.linalg.slogdet (a linalg_slogdet named tuple); gradient of logabsdet g A⁻ᵀ."""
    _check("slogdet", A, square=True)
    return linalg_slogdet(_op(A, "SLOGDET", "sign"), _op(A, "SLOGDET", "logabsdet"))


def det(A):
    """det A = sign · exp(log|det A|), as torch.linalg.det. Gradient as torch's linalg_det_backward: the cofactor
    matrix adj(A)ᵀ, which is det(A) A⁻ᵀ (Giles 2008) where A is invertible, and where it is singular (LU's sign 0)
    the SVD form: with A = U diag(S) Vh, det A = α ∏ S for α = det U · det Vh = ±1 (piecewise constant), so
        d det A = α Σᵢ (∏_{j≠i} sⱼ) dsᵢ,   dA = g α U diag(∏_{j≠i} sⱼ) Vh
    (through SVD's S alone, dS = Uᵀ dA Vhᵀ's diagonal, and prod's exact product rule: finite, and nonzero for a rank
    n − 1 A). Each batch element takes one formula: the singular ones read A through `where` into the SVD form, the
    others into LU's (an identity stands in for the matrices the other formula skips, so neither sees inf / nan)."""
    _check("det", A, square=True)
    sign, logabsdet = slogdet(A)
    d = sign * logabsdet.exp()
    n = A.shape[-1]
    if not A.requires_grad or n == 0:
        return d
    singular = sign == 0
    mask = singular.reshape(*singular.shape, 1, 1)
    identity = eye(n, dtype=A.dtype, device=A.device).expand(*A.shape)
    sign_lu, logabsdet_lu = slogdet(mask.where(identity, A))
    regular = sign_lu * logabsdet_lu.exp()
    U, S, Vh = svd(mask.where(A, identity), full_matrices=False)
    alpha = (slogdet(U.detach()).sign * slogdet(Vh.detach()).sign)
    p = alpha * S.prod(-1)
    return singular.where(d.detach() + (p - p.detach()), regular)


def _tolerance(S, shape, atol, rtol, dtype):
    """torch's rule: max(atol, rtol · σ_max), rtol defaulting to eps · max(m, n) when neither is given."""
    if rtol is None:
        rtol = 0.0 if atol is not None else float(np.finfo(dtype.np).eps) * max(shape[-2:])
    smax = S.amax(-1, keepdim=True) if S.shape[-1] else S.sum(-1, keepdim=True)
    tol = smax * rtol
    if atol is not None:
        tol = tol.maximum(tol._as(atol) if not isinstance(atol, Tensor) else atol)
    return tol


def pinv(A, *, atol=None, rtol=None, hermitian=False):
    """The Moore-Penrose pseudo-inverse, as torch.linalg.pinv: Vhᵀ diag(1/σ where σ > tol, else 0) Uᵀ from the SVD
    (tol: torch's rule, max(atol, rtol · σ_max), rtol = eps · max(m, n) by default); `hermitian` is accepted and the
    SVD used all the same. Gradient: through the SVD's (exact where the singular values are distinct)."""
    _check("pinv", A)
    U, S, Vh = svd(A, full_matrices=False)
    tol = _tolerance(S.detach(), A.shape, atol, rtol, A.dtype)
    keep = S > tol
    safe = keep.where(S, S._as(1.0))
    Sinv = keep.where(1.0 / safe, S._as(0.0))
    return (_mT(Vh) * Sinv.unsqueeze(-2)) @ _mT(U)


def matrix_rank(A, *, atol=None, rtol=None, hermitian=False):
    """The number of singular values above torch's tolerance (see pinv), int64, as torch.linalg.matrix_rank."""
    _check("matrix_rank", A)
    S = svdvals(A).detach()
    return (S > _tolerance(S, A.shape, atol, rtol, A.dtype)).sum(-1)


def lstsq(A, B, rcond=None, *, driver=None):
    """The least-squares solution of A X = B, as torch.linalg.lstsq with CPU's default driver gelsy (a linalg_lstsq
    named tuple): the solution, `rank` (int64, from the SVD), and, as gelsy's, `residuals` and `singular_values`
    empty. Through the QR of A (m >= n) or of Aᵀ (m < n, the minimum-norm solution), so it needs A of full rank
    (torch's gelsy also handles a rank-deficient A); gradients through QR and SOLVE."""
    _check("lstsq", A)
    if not isinstance(B, Tensor) or B.dtype is not A.dtype:
        raise RuntimeError("linalg.lstsq: Expected B to be a Tensor of A's dtype")
    vector = B.ndim == A.ndim - 1
    if vector:
        B = B.unsqueeze(-1)
    m, n = A.shape[-2:]
    if B.shape[-2] != m:
        raise RuntimeError(f"linalg.lstsq: input.size(-2) should match other.size(-2), got {m} and "
                           f"{B.shape[-2]}")
    batch = broadcast_shape([A.shape[:-2], B.shape[:-2]], "linalg.lstsq")
    A = A.expand(*batch, m, n)
    B = B.expand(*batch, *B.shape[-2:])
    if m >= n:
        Q, R = qr(A)
        X = _solve("lstsq", R, _mT(Q) @ B)
    else:
        Q, R = qr(_mT(A))
        X = Q @ _solve("lstsq", _mT(R), B)
    if vector:
        X = X.squeeze(-1)
    return linalg_lstsq(X, _empty(A), matrix_rank(A), _empty(A))
