"""torch.linalg's norms: vector_norm, matrix_norm and norm, with torch's dispatch, errors and gradients. Composites of
the existing ops (the vector norms are Tensor.norm's, tinyllm/mixins/products.py); 'nuc' and ±2 need singular
values, from tinyllm.linalg.svdvals where the decompositions are there."""
import math

from ..mixins.products import _float_input, vector_norm as _vector_norm


def vector_norm(x, ord=2, dim=None, keepdim=False, dtype=None):
    """‖x‖_ord over `dim` (every element when None), torch.linalg.vector_norm: ord 2 is √Σx², with gradient x/‖x‖
    and 0 at the zero vector (torch's subgradient, by a masked root: never nan); 1, ±inf, 0 and any p as torch."""
    return _vector_norm(x, ord, dim, keepdim, dtype)


def _svdvals(A, ord):
    try:
        from .decompositions import svdvals
    except ImportError:
        raise NotImplementedError(f"linalg.matrix_norm: ord={ord!r} needs the singular values, and "
                                  "tinyllm.linalg.svdvals is not there yet: use 'fro', 1, -1, inf or -inf") from None
    return svdvals(A)


def matrix_norm(A, ord="fro", dim=(-2, -1), keepdim=False, dtype=None):
    """The norm of the matrices in dims `dim` of A, torch.linalg.matrix_norm:
    'fro': √Σa² (gradient A/‖A‖, 0 at the zero matrix); 1 / -1: max / min over columns of Σᵢ|aᵢⱼ|; inf / -inf:
    max / min over rows of Σⱼ|aᵢⱼ| (gradient sign(a) on the extreme column or row, shared among ties); 'nuc',
    2, -2: Σσ, max σ, min σ of the singular values (tinyllm.linalg.svdvals, whose gradient is U·dσ·Vᵀ)."""
    if A.ndim < 2:
        raise RuntimeError(f"linalg.matrix_norm: the input tensor A must have at least 2 dimensions, got shape "
                           f"{A.shape}: for a vector use tinyllm.linalg.vector_norm")
    if not isinstance(dim, (tuple, list)) or len(dim) != 2:
        raise RuntimeError(f"linalg.matrix_norm: dim must be a 2-tuple, got {dim!r}")
    d0, d1 = (A._dim(d, "linalg.matrix_norm") for d in dim)
    if d0 == d1:
        raise RuntimeError(f"linalg.matrix_norm: dims must be different, got {dim!r}")
    if ord == "fro":
        return _vector_norm(A, 2, (d0, d1), keepdim, dtype, name="linalg.matrix_norm")
    A = _float_input(A, dtype, "linalg.matrix_norm")
    if ord in ("nuc", 2, -2):
        rest = [i for i in range(A.ndim) if i not in (d0, d1)]
        s = _svdvals(A.permute(*rest, d0, d1), ord)
        out = s.sum(-1) if ord == "nuc" else s.amax(-1) if ord == 2 else s.amin(-1)
        if keepdim:
            for d in sorted((d0, d1)):
                out = out.unsqueeze(d)
        return out
    if ord not in (1, -1, math.inf, -math.inf) or isinstance(ord, bool):
        raise RuntimeError(f"linalg.matrix_norm: order {ord!r} not supported: use 'fro', 'nuc', 1, -1, 2, -2, inf "
                           "or -inf")
    summed, over = (d0, d1) if ord in (1, -1) else (d1, d0)  # column sums for ±1, row sums for ±inf
    sums = A.abs().sum(summed, keepdim=True)
    out = sums.amax(over, keepdim=True) if ord > 0 else sums.amin(over, keepdim=True)
    return out if keepdim else out.squeeze((d0, d1))


def norm(A, ord=None, dim=None, keepdim=False, dtype=None):
    """torch.linalg.norm's dispatch: `dim` an int, or ord a number with A 1-D and no dim, is a vector norm; `dim` a
    2-tuple, or A 2-D with ord given and no dim, a matrix norm; ord and dim both None, the 2-norm of every element
    (A flattened). With ord given and no dim, A must be 1-D or 2-D."""
    if dim is not None:
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
        if len(dims) == 1:
            return vector_norm(A, 2 if ord is None else ord, dims, keepdim, dtype)
        if len(dims) != 2:
            raise RuntimeError(f"linalg.norm: dim must be an int or a tuple of 1 or 2 ints, got {dim!r}")
        return matrix_norm(A, "fro" if ord is None else ord, dims, keepdim, dtype)
    if ord is None:
        return vector_norm(A, 2, None, keepdim, dtype)
    if A.ndim == 2:
        return matrix_norm(A, ord, (-2, -1), keepdim, dtype)
    if A.ndim == 1 and not isinstance(ord, str):
        return vector_norm(A, ord, None, keepdim, dtype)
    raise RuntimeError(f"linalg.norm: if dim is not given but ord is, the input must be 1-D or 2-D (a string ord: "
                       f"2-D), got shape {A.shape} with ord={ord!r}: give dim")
