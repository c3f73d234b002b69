"""torch.linalg's products and views (cross, diagonal, vecdot, matmul, multi_dot, matrix_power, vander), and torch's
top-level products that have no Tensor method (tensordot, cdist, block_diag, cartesian_prod): composites of the
existing ops, so their gradients are those ops' gradients."""
from .. import dtype as dt
from ..factory import cat, stack, zeros
from ..mixins.products import cross as _cross, vector_norm


def cross(input, other, dim=-1):
    """input × other along `dim` (of size 3; the others broadcast), torch.linalg.cross."""
    return _cross(input, input._as(other), dim, "linalg.cross")


def diagonal(A, offset=0, dim1=-2, dim2=-1):
    """The `offset` diagonal of the matrices in dims (dim1, dim2), as the last axis (a view): torch.linalg.diagonal."""
    return A.diagonal(offset, dim1, dim2)


def vecdot(x, y, dim=-1):
    """Σ x·y along `dim`, broadcast (real tensors: no conjugate to take)."""
    x, y = x._broadcast(y, name="linalg.vecdot")
    return (x * y).sum(dim)


def matmul(input, other):
    """torch.linalg.matmul, which is torch.matmul."""
    return input.matmul(other)


def multi_dot(tensors):
    """A₁·A₂·…·Aₙ in the order of fewest multiplications (the matrix-chain dynamic program, as torch's); the first
    may be 1-D (a row) and the last 1-D (a column), every other 2-D."""
    ts = list(tensors)
    if len(ts) < 2:
        raise RuntimeError(f"linalg.multi_dot: expected at least 2 tensors, got {len(ts)}")
    first, last = ts[0].ndim == 1, ts[-1].ndim == 1
    for i, t in enumerate(ts):
        if t.ndim != 2 and not (t.ndim == 1 and i in (0, len(ts) - 1)):
            raise RuntimeError(f"linalg.multi_dot: tensor {i} must be 2-D{' or 1-D' if i in (0, len(ts) - 1) else ''}"
                               f", got shape {t.shape}")
    ts = [ts[0].unsqueeze(0) if first else ts[0]] + ts[1:-1] + [ts[-1].unsqueeze(-1) if last else ts[-1]]
    for i in range(len(ts) - 1):
        if ts[i].shape[1] != ts[i + 1].shape[0]:
            raise RuntimeError(f"linalg.multi_dot: tensors {i} and {i + 1} cannot be multiplied: shapes "
                               f"{ts[i].shape} and {ts[i + 1].shape}")
    p = [ts[0].shape[0]] + [t.shape[1] for t in ts]
    n = len(ts)
    cost, split = {(i, i): 0 for i in range(n)}, {}
    for length in range(2, n + 1):
        for i in range(n - length + 1):
            j = i + length - 1
            cost[i, j], split[i, j] = min((cost[i, k] + cost[k + 1, j] + p[i] * p[k + 1] * p[j + 1], k)
                                          for k in range(i, j))

    def product(i, j):
        return ts[i] if i == j else product(i, split[i, j]).matmul(product(split[i, j] + 1, j))
    out = product(0, n - 1)
    if first:
        out = out.squeeze(0)
    return out.squeeze(-1) if last else out


def matrix_power(A, n):
    """Aⁿ for square matrices (batched): repeated squaring for n ≥ 0, (A⁻¹)^|n| for n < 0 (tinyllm.linalg.inv)."""
    if n >= 0 or A.ndim < 2 or A.shape[-1] != A.shape[-2]:
        return A.matrix_power(n)
    try:
        from .decompositions import inv
    except ImportError:
        raise NotImplementedError(f"linalg.matrix_power: n={n} needs the inverse, and tinyllm.linalg.inv is not there "
                                  "yet: use n >= 0") from None
    return inv(A).matrix_power(-n)


def vander(x, N=None):
    """The Vandermonde matrix of the last axis: out[..., i, j] = x[..., i]ʲ for j < N (N = x.shape[-1] when None),
    as a running product of x, so the gradient is the product rule's."""
    if x.ndim < 1:
        raise RuntimeError("linalg.vander: x must have at least one dimension, got a 0-D tensor")
    N = x.shape[-1] if N is None else N
    if N < 1:
        raise RuntimeError(f"linalg.vander: N must be at least 1, got {N}")
    x = x.unsqueeze(-1)
    ones = x._as(1).expand(*x.shape).to(x.dtype if x.dtype.is_float else dt.int64)
    if N == 1:
        return ones
    return cat([ones, x.expand(*x.shape[:-1], N - 1).cumprod(-1)], -1)


def tensordot(a, b, dims=2):
    """Σ over a's dims dims[0] paired with b's dims[1] (an int d: a's last d with b's first d), the rest of a's axes
    then the rest of b's: both permuted and reshaped to matrices, one matmul."""
    if isinstance(dims, int):
        if dims < 0:
            raise RuntimeError(f"tensordot: expects dims >= 0, got {dims}")
        da, db = list(range(a.ndim - dims, a.ndim)), list(range(dims))
    else:
        da, db = ([d] if isinstance(d, int) else list(d) for d in dims)
    if len(da) != len(db):
        raise RuntimeError(f"tensordot: both sides of dims must name as many dimensions, got {dims!r}")
    da = [a._dim(d, "tensordot") for d in da]
    db = [b._dim(d, "tensordot") for d in db]
    for i, j in zip(da, db):
        if a.shape[i] != b.shape[j]:
            raise RuntimeError(f"tensordot: contracted dimensions need the same size, got {a.shape[i]} (dim {i} of "
                               f"{a.shape}) and {b.shape[j]} (dim {j} of {b.shape})")
    ra = [i for i in range(a.ndim) if i not in da]
    rb = [j for j in range(b.ndim) if j not in db]
    k = 1
    for i in da:
        k *= a.shape[i]
    am = a.permute(*ra, *da).reshape(-1, k)
    bm = b.permute(*db, *rb).reshape(k, -1)
    return am.matmul(bm).reshape(*[a.shape[i] for i in ra], *[b.shape[j] for j in rb])


def cdist(x1, x2, p=2.0):
    """out[..., i, j] = ‖x1[..., i, :] - x2[..., j, :]‖_p (batch dims broadcast), the vector norm of the
    differences, so the gradient at equal rows is 0, as torch's."""
    if x1.ndim < 2 or x2.ndim < 2:
        raise RuntimeError(f"cdist: only supports at least 2-D tensors, got shapes {x1.shape} and {x2.shape}")
    if x1.shape[-1] != x2.shape[-1]:
        raise RuntimeError(f"cdist: x1 and x2 must have the same number of columns, got {x1.shape[-1]} and "
                           f"{x2.shape[-1]}")
    if p < 0:
        raise RuntimeError(f"cdist: only supports non-negative p values, got {p}")
    return vector_norm(x1.unsqueeze(-2) - x2.unsqueeze(-3), p, -1, name="cdist")


def block_diag(*tensors):
    """The tensors (0-, 1- or 2-D; a 1-D one is a row) along the diagonal of one matrix, zeros elsewhere, in their
    promoted dtype."""
    mats = []
    for i, t in enumerate(tensors):
        if t.ndim > 2:
            raise RuntimeError(f"block_diag: input tensors must have 2 or fewer dimensions, input {i} has {t.ndim}")
        mats.append(t.reshape(1, -1) if t.ndim < 2 else t)
    if not mats:
        return zeros(1, 0)
    dtype = mats[0].dtype
    for m in mats[1:]:
        dtype = dt.result_type(dtype, m.dtype)
    width = sum(m.shape[1] for m in mats)
    rows, left = [], 0
    for m in mats:
        r, c = m.shape
        pieces = [zeros(r, left, dtype=dtype, device=m.device), m.to(dtype),
                  zeros(r, width - left - c, dtype=dtype, device=m.device)]
        rows.append(cat([q for q in pieces if q.shape[1]], 1))
        left += c
    return cat(rows, 0)


def cartesian_prod(*tensors):
    """Every combination of one element from each 1-D tensor, in row-major order, as rows (one tensor: itself)."""
    for i, t in enumerate(tensors):
        if t.ndim != 1:
            raise RuntimeError(f"cartesian_prod: expects 1-D tensors, tensor {i} has shape {t.shape}")
    if len(tensors) == 1:
        return tensors[0]
    shape = [t.shape[0] for t in tensors]
    grids = [t.reshape(*[s if j == i else 1 for j, s in enumerate(shape)]).expand(*shape).reshape(-1)
             for i, t in enumerate(tensors)]
    return stack(grids, 1)

