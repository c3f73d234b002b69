/*
Single-precision matrix multiply for tinyllm's C runtime.

All matrices are row-major with an explicit row stride (ld = "leading
dimension", in elements), in the style of llm.c:

    C[M,N] = op(A)[M,K] . op(B)[K,N] + beta * C

    transA == 0: A is stored M x K, element (i,k) at A[i*lda + k], lda >= K
    transA != 0: A is stored K x M, element (i,k) at A[k*lda + i], lda >= M
    transB == 0: B is stored K x N, element (k,j) at B[k*ldb + j], ldb >= N
    transB != 0: B is stored N x K, element (k,j) at B[j*ldb + k], ldb >= K

so the backward pass can form A^T.B and A.B^T straight from the forward
tensors, without copies. Only those elements are read, so an ld of 0 works
too: a row or column broadcast along the other axis (a NumPy stride of 0).
beta == 0 overwrites C without reading it (NaNs in C are ignored); beta == 1
accumulates.

The batched form runs `batch` independent products, matrix b starting at
A + b*strideA, B + b*strideB and C + b*strideC.

This header is also the cffi cdef: keep it to plain declarations (lines
starting with '#' are dropped by runtime_c/build.py).
*/
#ifndef TINYLLM_SGEMM_H
#define TINYLLM_SGEMM_H

#include <stdint.h>

void tl_sgemm(int transA, int transB, int M, int N, int K,
              const float *A, long lda, const float *B, long ldb,
              float beta, float *C, long ldc);

void tl_sgemm_batched(int batch, int transA, int transB, int M, int N, int K,
                      const float *A, long lda, long strideA,
                      const float *B, long ldb, long strideB,
                      float beta, float *C, long ldc, long strideC);

// Two batch axes: matrix (b0, b1) starts at A + b0*strideA0 + b1*strideA1 (and so on for B and C), for
// operands whose batch axes are not one evenly strided run (k of multi-head attention seen as [B, H, D, T]).
void tl_sgemm_batched2(int batch0, int batch1, int transA, int transB, int M, int N, int K,
                       const float *A, long lda, long strideA0, long strideA1,
                       const float *B, long ldb, long strideB0, long strideB1,
                       float beta, float *C, long ldc, long strideC0, long strideC1);

// tl_sgemm_batched2 with float16 (f16) or bfloat16 (bf16) operands and result, each stored as its 16 bits (strides
// in elements): widened to float32 while packing, summed in float32, each result rounded once to nearest even.
// C is overwritten (beta 0).
void tl_gemm_f16_batched2(int batch0, int batch1, int transA, int transB, int M, int N, int K,
                          const uint16_t *A, long lda, long strideA0, long strideA1,
                          const uint16_t *B, long ldb, long strideB0, long strideB1,
                          uint16_t *C, long ldc, long strideC0, long strideC1);
void tl_gemm_bf16_batched2(int batch0, int batch1, int transA, int transB, int M, int N, int K,
                           const uint16_t *A, long lda, long strideA0, long strideA1,
                           const uint16_t *B, long ldb, long strideB0, long strideB1,
                           uint16_t *C, long ldc, long strideC0, long strideC1);

// The micro-tile and cache blocks of cpu.h's `path`, or with path 3 of bfloat16 products on vdpbf16ps: out[0..4]
// = MR, NR, KC, MC, NC (KC, MC, NC derived from the cache sizes the OS reports: see plan_blocking in sgemm.c).
void tl_sgemm_plan(int path, int *out);

// Testing and tuning aid: sets `path`'s (as tl_sgemm_plan) KC, MC, NC (MC and NC rounded up to multiples of MR
// and NR); a value <= 0 takes the one derived from the caches. Not while another thread is inside tl_sgemm.
void tl_sgemm_set_blocking(int path, int kc, int mc, int nc);

// Tuning aid: how the threads split a product: 0 the rules (M, or N where that saves over 1/16 of the work; the B
// panel packed by each thread whole where it fits in half of L2, else shared), 1 C's columns (each thread packs its
// own B strips and all of A), 2 the rules' grid with each thread packing the whole B panel it reads (none read
// strips another core packed), 3 the rules' grid with the panel always shared. The same bits in each. Not while
// another thread is inside tl_sgemm. tl_sgemm_split says which is set.
void tl_sgemm_set_split(int mode);
int tl_sgemm_split(void);

// Tuning aid: the GEMV's (gemv.c) rows of W read at once by a kernel that dots rows of W with x, where a row is one
// stream (x fits in L1, the row under 4 KiB) and where it is not (1, 2, 4 or 8; any other value, the measured
// rule: 1 and 8 for one row of x), and its page-ahead prefetches (1 on, 0 off, -1 by W's size). Changes the
// order each dot product is summed in, not what it sums. Not while another thread is inside tl_sgemm.
void tl_gemv_set_grouping(int short_rows, int long_rows, int page_ahead);

// 1 when tl_sgemm runs an M x N product as a GEMV (at most 4 rows or 4 columns), which tl_gemv_set_grouping tunes.
int tl_gemv_takes(long M, long N);

// Kept for their callers; cpu.h's tl_cpu_supports, tl_cpu_set_path and tl_cpu_path say more.
// 1 when this CPU (and OS) can run the AVX2+FMA kernels.
int tl_cpu_has_avx2_fma(void);

// Testing aid: force the portable C path (1) or go back to the best path for
// this CPU (0). TINYLLM_NO_AVX2=1 in the environment does the same at load.
// Not to be called while another thread is inside tl_sgemm.
void tl_force_portable(int on);

// 1 when the AVX2+FMA kernels are in use.
int tl_sgemm_uses_avx2(void);

#endif  // TINYLLM_SGEMM_H
