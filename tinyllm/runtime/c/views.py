"""How the C kernels read NumPy arrays in place: an array's address, a matrix's (trans, ld) for the sgemm, and
batch axes as runs of one stride each (the sgemm and the attention kernels take two), and a generated kernel's reads
of a view in place."""


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


def read_in_place(kernel, arrays):
    """(kernel, arrays): the Kernel rewritten to read each non-row-major input array where it lies, or the same
    kernel and arrays where it cannot (its rendering then copies them row-major). A Kernel entry (input i, strides,
    offset) reads input i as if row-major: position offset + Σ idx_d·strides_d. That reads the array in place when
    the offset and each nonzero stride name one element and one axis of it (stride_d = the row-major stride of an
    axis of size > 1, the run of idx_d within it): the entry becomes the array's own strides over those axes and
    its own offset, in elements (the array is passed by its first element's address). A head split of a
    projection, a transposed view a kernel casts or updates."""
    views = [i for i, a in enumerate(arrays) if not a.flags.c_contiguous]
    if not views:
        return kernel, arrays
    entries = list(kernel.ins)
    for k, (i, strides, offset) in enumerate(kernel.ins):
        a = arrays[i]
        if i not in views:
            continue
        if any(s % a.itemsize or s < 0 for s in a.strides):
            return kernel, arrays
        own = [s // a.itemsize for s in a.strides]
        row = [1] * a.ndim  # row-major strides of the array's shape
        for d in range(a.ndim - 2, -1, -1):
            row[d] = row[d + 1] * a.shape[d + 1]
        at, rest = [], offset
        for d in range(a.ndim):  # the offset's element
            at.append(rest // row[d])
            rest -= at[-1] * row[d]
        new, used = [], set()
        for n, s in zip(kernel.shape, strides):
            if not s or n == 1:  # never moves
                new.append(0)
                continue
            axis = next((d for d in range(a.ndim) if row[d] == s and a.shape[d] > 1), None)
            if axis is None or axis in used or at[axis] + (n - 1) >= a.shape[axis]:
                return kernel, arrays
            used.add(axis)
            new.append(own[axis])
        entries[k] = (i, tuple(new), sum(m * o for m, o in zip(at, own)))
    return kernel._replace(ins=tuple(entries)), arrays
