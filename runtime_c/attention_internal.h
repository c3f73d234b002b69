/*
What attention.c, attention_mm.c and attention_rows.c share. Private to runtime_c: not part of the cffi interface
(build.py's PRIVATE_HEADERS), and hidden from the module's exported symbols.
*/
#ifndef TINYLLM_ATTENTION_INTERNAL_H
#define TINYLLM_ATTENTION_INTERNAL_H

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <stdint.h>

enum { PATH_PORTABLE, PATH_AVX2, PATH_AVX512 };  // tl_cpu_path()'s numbering (cpu.h)
// tl_attn_mm's bfloat16 products on vdpbf16ps (where tl_cpu_bf16_dot()): A and B hold pairs of bfloat16 along k,
// each 32-bit "element" of A(m, k) and B(k, n) a pair (k counts pairs), C float32 as on the other paths
enum { PATH_PAIRS = 16 };

// C[M x N] (+)= A B, A(m, k) = A[m*ars + k*acs], B(k, n) = B[k*ldb + n], on `path`; accumulate 0 overwrites C.
__attribute__((visibility("hidden"))) void tl_attn_mm(int path, long M, long N, long K, const float *A, long ars,
                                                      long acs, const float *B, long ldb, float *C, long ldc,
                                                      int accumulate);

// attention_rows.c, each on `path` (its vectors, or portable C):
//   scale_max: p[j] *= scale for j < n, and the largest result (-inf when n == 0);
//   exp_sum: p[j] = exp(p[j] - shift) for j < n, zeros up to bc, and the sum of the exponentials;
//   dot: the sum of a[j] * b[j] for j < n;
//   softmax_grad_row: a row's P = e^(s scale - lse) and dS = P o (dP - dl) scale over s and dP, zeros from n to bc;
//   transpose: dst[j*ld + i] = src[i*lds + j] for rows i < n and columns j < d (bits moved, not computed on).
#define TL_ATTN_HIDDEN __attribute__((visibility("hidden")))
TL_ATTN_HIDDEN float tl_attn_scale_max(int path, float *p, long n, float scale);
TL_ATTN_HIDDEN float tl_attn_exp_sum(int path, float *p, long n, long bc, float shift);
TL_ATTN_HIDDEN float tl_attn_dot(int path, const float *a, const float *b, long n);
TL_ATTN_HIDDEN void tl_attn_softmax_grad_row(int path, float *s, float *dp, long n, long bc, float scale, float lse,
                                             float dl);
TL_ATTN_HIDDEN void tl_attn_transpose(int path, float *dst, long ld, const float *src, long lds, long n, long d);

#if defined(__x86_64__)
// PATH_PAIRS' operands: rows of float32 rounded to bfloat16 (A: pairs along a row, zeros from n up to width, a
// multiple of 32); rows 2i and 2i + 1 of a bfloat16 matrix interleaved (B: pairs down a column, a zero row past
// an odd n). Both on AVX512_BF16 CPUs only.
__attribute__((visibility("hidden"))) void tl_attn_round_pairs(uint16_t *dst, long ld, const float *src, long lds,
                                                               long rows, long n, long width);
__attribute__((visibility("hidden"))) void tl_attn_pack_pairs(uint32_t *dst, long ld, const uint16_t *src, long lds,
                                                              long n, long d);
#endif

#if defined(__x86_64__)
// Lanes below w are on.
__attribute__((target("avx2,fma"))) static inline __m256i lanes(long w) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(w < 0 ? 0 : w > 8 ? 8 : w)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Lanes below w are on.
static inline __mmask16 lanes16(long w) { return (__mmask16)(w <= 0 ? 0 : w >= 16 ? 0xFFFF : (1u << w) - 1); }
#endif

#endif  // TINYLLM_ATTENTION_INTERNAL_H
