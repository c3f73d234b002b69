/*
The embedding lookup and its adjoint, in llm.c's encoder_forward / encoder_backward manner, generalised to
any axis: the table is seen as [outer, n, inner] (n rows along the indexed axis), the m indices pick rows.

    embedding_forward:   out[o, j, i]    = table[o, idx[j], i]            out is [outer, m, inner], elements of
                                                                           `size` bytes (a copy: any dtype)
    embedding_backward:  dtable[o, r, i] = sum over j with idx[j] == r of dout[o, j, i]
                                                                           dtable is [outer, n, inner], float32

Negative indices count from the end, as in NumPy and torch. Each returns -1 when every index is in range,
else the position j of the first index out of [-n, n) (nothing is written then).

This header is also the cffi cdef (see runtime_c/build.py): plain declarations only.
*/
#ifndef TINYLLM_EMBEDDING_H
#define TINYLLM_EMBEDDING_H

#include <stdint.h>

long embedding_forward(void *out, const void *table, const int64_t *idx, long outer, long n, long m, long inner,
                       long size);

long embedding_backward(float *dtable, const float *dout, const int64_t *idx, long outer, long n, long m, long inner);

#endif  // TINYLLM_EMBEDDING_H
