/*
What qmatmul.c, qmatmul_fixed.c and qmatmul_dynamic.c share: the GEMV's arguments, its kernels' dispatch on the rows
of x, and the fixed-point kernel's entry. Private to runtime_c: not part of the cffi interface (build.py's
PRIVATE_HEADERS), and hidden from the module's exported symbols.
*/
#ifndef TINYLLM_QMATMUL_INTERNAL_H
#define TINYLLM_QMATMUL_INTERNAL_H

#include <stdint.h>

#include "gemv.h"

typedef struct qgemv_fixed qgemv_fixed;  // x as fixed point, for qmatmul_fixed.c's kernel

typedef struct {
    int fmt;             // TL_Q8 or TL_Q4
    int m;               // rows of x: 1..GEMV_M
    long n, k, group;
    const float *x;      // x[i*ldx + p]
    long ldx;
    const uint8_t *q;    // row j of W at q + j*ldq
    long ldq;
    const uint16_t *s;   // row j's scales at s + j*lds
    long lds;
    float *y;            // y[i*ldy + j]
    long ldy;
    const float *xsum8;  // q4 on the AVX2 kernel: 8 x the sum of x_i over group G at xsum8[i*groups + G]
    const qgemv_fixed *fixed;  // qmatmul_fixed.c's kernel: x as its digits
} qgemv_args;

// KERNEL_M(m, F, GS, v, j0, j1) with the row count m of x (v->m: 1..GEMV_M) a compile-time constant, so its loops over
// rows unroll (the weight-only kernels', and qmatmul_dynamic.c's)
#define QGEMV_BY_M(KERNEL_M, F, GS, v, j0, j1)                          \
    do {                                                                \
        switch ((v)->m) {                                               \
        case 1: KERNEL_M(1, F, GS, v, j0, j1); break;                   \
        case 2: KERNEL_M(2, F, GS, v, j0, j1); break;                   \
        case 3: KERNEL_M(3, F, GS, v, j0, j1); break;                   \
        default: KERNEL_M(GEMV_M, F, GS, v, j0, j1); break;             \
        }                                                               \
    } while (0)

#define TL_QMATMUL_HIDDEN __attribute__((visibility("hidden")))

// qmatmul_fixed.c: x (v's rows) as fixed point for tl_qgemv_fixed, or NULL where that kernel does not apply
// (no AVX512_VNNI in use, a group that is not a multiple of 32, or x holding inf or NaN); freed by
// tl_qgemv_fixed_free. The kernel computes outputs [j0, j1) of the int8 or int4 GEMV with v->fixed set.
TL_QMATMUL_HIDDEN qgemv_fixed *tl_qgemv_fixed_prepare(const qgemv_args *v);
// The same kernel for int8 activations (qmatmul_dynamic.c): row i of x given as qx + i*kp (kp: v->k rounded up to
// whole groups, zero past v->k) and its groups' scales sx + i*groups, one digit each; NULL where it does not apply,
// or where a scale is NaN (x held inf or NaN). v->x is not read.
TL_QMATMUL_HIDDEN qgemv_fixed *tl_qgemv_fixed_prepare_int8(const qgemv_args *v, const int8_t *qx, const float *sx);
TL_QMATMUL_HIDDEN void tl_qgemv_fixed_free(qgemv_fixed *f);
TL_QMATMUL_HIDDEN void tl_qgemv_fixed(const qgemv_args *v, long j0, long j1);

#endif  // TINYLLM_QMATMUL_INTERNAL_H
