"""How the C kernels read NumPy arrays in place: an array's address, a matrix's (trans, ld) for the sgemm, and
batch axes as runs of one stride each (the sgemm and the attention kernels take two)."""


def address(array):
    return array.__array_interface__["data"][0]


def matrix_layout(x):
    """(trans, ld) that let sgemm read the last two axes of float32 `x` in place, or None.

    sgemm reads element (i, k) at i*ld + k (trans 0) or at k*ld + i (trans 1), and nothing else, so ld is the
    stride of the other axis exactly as it is, 0 included: a row or column broadcast along its length (stride 0,
    one element stored) is read as that one element over and over. Only the stride of an axis of size 1 is free
    (never multiplied by a nonzero index); a negative stride is left to a copy."""
    rows, cols = x.shape[-2:]
    r, c = (s // x.itemsize for s in x.strides[-2:])
    if cols == 1 or c == 1:  # (i, k) at i*ld + k
        ld = r if rows > 1 else max(cols, 1)
        if ld >= 0:
            return 0, ld
    if rows == 1 or r == 1:  # (i, k) at k*ld + i
        ld = c if cols > 1 else max(rows, 1)
        if ld >= 0:
            return 1, ld
    return None


def batch_runs(shape, *arrays):
    """The batch axes as runs of axes that every array walks with one stride: [(size, [stride per array])],
    outermost first; None when there are more than the two the sgemm takes."""
    runs = []
    for i, n in enumerate(shape):
        if n == 1:
            continue
        strides = [x.strides[i] // x.itemsize for x in arrays]  # in elements of each array's own dtype
        if runs and all(outer == inner * n for outer, inner in zip(runs[-1][1], strides)):
            runs[-1] = (runs[-1][0] * n, strides)
        else:
            runs.append((n, strides))
    return runs if len(runs) <= 2 else None
