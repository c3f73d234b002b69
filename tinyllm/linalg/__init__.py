"""tinyllm.linalg: torch.linalg's names, return types and gradients. Decompositions are primitives whose forward runs
on the host through NumPy's LAPACK on every runtime and whose backward is graph math (tinyllm/ops/linalg.py, each
derivation in its op's docstring); norms and products are composites of the existing ops."""
from .decompositions import (svd, svdvals, eigh, eigvalsh, eig, eigvals, qr, cholesky, solve, inv, det,  # noqa: F401
                             slogdet, lstsq, pinv, matrix_rank, LinAlgError)
from .norms import vector_norm, matrix_norm, norm  # noqa: F401
from .products import cross, diagonal, vecdot, matmul, multi_dot, matrix_power, vander  # noqa: F401
from ..mixins.products import LINALG as _LINALG

_LINALG.update(matrix_norm=matrix_norm, matrix_power=matrix_power)  # what Tensor.norm and .matrix_power reach up to
