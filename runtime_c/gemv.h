/*
The GEMV behind tl_sgemm (gemv.c): products C = op(A) op(B) + beta C with at most GEMV_M rows or GEMV_M columns,
which sgemm.c hands over whole. Private to runtime_c: not part of the cffi interface (build.py's PRIVATE_HEADERS),
and hidden from the module's exported symbols.
*/
#ifndef TINYLLM_GEMV_H
#define TINYLLM_GEMV_H

#define GEMV_M 4  // the most rows (or columns) of a product the GEMV takes

// 1 when an M x N product runs as a GEMV.
static inline int tl_gemv_applies(long M, long N) { return M <= GEMV_M || N <= GEMV_M; }

// C = op(A) op(B) + beta C, with operands and strides as in sgemm.h, for M, N > 0 with tl_gemv_applies(M, N)
// and K > 0, on at most nt threads.
__attribute__((visibility("hidden"))) void tl_gemv(int transA, int transB, long M, long N, long K,
                                                   const float *A, long lda, const float *B, long ldb,
                                                   float beta, float *C, long ldc, int nt);

#endif  // TINYLLM_GEMV_H
