"""tinyllm.linalg: torch.linalg's names, return types and gradients. Decompositions are primitives whose forward runs
on the host through NumPy's LAPACK on every runtime and whose backward is graph math (tinyllm/ops/linalg.py, each
derivation in its op's docstring); norms and products are composites of the existing ops."""
from .decompositions import (svd, svdvals, eigh, eigvalsh, qr, cholesky, solve, inv, det, slogdet, lstsq,  # noqa: F401
                             pinv, matrix_rank, LinAlgError)
