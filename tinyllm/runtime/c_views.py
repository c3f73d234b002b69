"""How the C kernels read NumPy arrays in place: an array's address, a matrix's (trans, ld) for the sgemm, and
batch axes as runs of one stride each (the sgemm and the attention kernels take two)."""


def address(array):
    return array.__array_interface__["data"][0]


def matrix_layout(x):
    """(trans, ld) that let sgemm read the last two axes of float32 `x` in place, or None."""
    rows, cols = x.shape[-2:]
    st = [s // 4 for s in x.strides]
    if cols == 1 or st[-1] == 1:
        trans, ld = 0, st[-2] if rows > 1 else cols
    elif rows == 1 or st[-2] == 1:
        trans, ld = 1, st[-1] if cols > 1 else rows
    else:
        return None
    return trans, max(ld, 1)


def batch_runs(shape, *arrays):
    """The batch axes as runs of axes that every array walks with one stride: [(size, [stride per array])],
    outermost first; None when there are more than the two the sgemm takes."""
    runs = []
    for i, n in enumerate(shape):
        if n == 1:
            continue
        strides = [x.strides[i] // 4 for x in arrays]
        if runs and all(outer == inner * n for outer, inner in zip(runs[-1][1], strides)):
            runs[-1] = (runs[-1][0] * n, strides)
        else:
            runs.append((n, strides))
    return runs if len(runs) <= 2 else None
