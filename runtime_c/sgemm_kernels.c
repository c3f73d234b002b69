/*
The sgemm's micro-kernels and packing routines; sgemm.c runs the loops around them (its top comment has the
whole picture). Per path (cpu.h), a micro-kernel C[mr x nr] (+)= A strip . B strip over packed strips, and on
the AVX2 and AVX-512 paths variants that read a full A strip in place through its strides; and the routines
that pack op(A) and op(B), of any element format (formats.h), into those strips.
*/

#include "common.h"
#include "formats.h"
#include "sgemm_internal.h"

// op(A)(i, k) and op(B)(k, j) as float32, in any format (a quantized B is always transposed: W stored N x K).
static float a_at(const gemm_args *g, long i, long k) {
    return elem_at(g->afmt, g->A, g->transA ? k * g->lda + i : i * g->lda + k);
}

static float b_at(const gemm_args *g, long k, long j) {
    if (g->bfmt == TL_Q8 || g->bfmt == TL_Q4)
        return tl_dequant(g->bfmt, g->B, g->ldb, g->scales, g->lds, g->group, j, k);
    return elem_at(g->bfmt, g->B, g->transB ? j * g->ldb + k : k * g->ldb + j);
}

// ----------------------------------------------------------------------------
// Portable path: plain C with compile-time trip counts, which gcc and clang
// unroll and vectorise for the baseline ISA (SSE2 on x86-64, NEON on aarch64).

void sgemm_kernel_portable(int kc, const float *restrict a, long lda, const float *restrict b,
                           float beta, float *restrict c, long ldc) {
    (void)lda;  // always packed
    // One row of C at a time: its NR accumulators fit in vector registers and
    // the j loop is a plain vectorisable loop (a 2-D accumulator over all MR
    // rows gets spilled and mis-vectorised by gcc). The B strip is re-read per
    // row, from L1. Pointer increments rather than p*NR + j indexing keep the
    // loop vectorisable even under -fwrapv (Python's CFLAGS; build.py undoes it).
    for (int i = 0; i < MR; i++) {
        float acc[NR] = {0};
        const float *ap = a + i, *bp = b;
        for (int p = 0; p < kc; p++, ap += MR, bp += NR) {
            for (int j = 0; j < NR; j++) acc[j] += *ap * bp[j];
        }
        float *ci = c + i * ldc;
        for (int j = 0; j < NR; j++) ci[j] = beta == 0.0f ? acc[j] : acc[j] + beta * ci[j];
    }
}

// dst[0, n) = src[0, n): one run of a strip being packed. The strip sizes of the plans as compile-time sizes,
// which the compiler turns into a few vector moves; memcpy with a run-time size is a library call per run, and
// packing B for a 256 x 256 x 256 product on two threads spent 15 % of the product's time in those calls.
static inline void copy_run(float *dst, const float *src, int n) {
    switch (n) {
    case MR: memcpy(dst, src, MR * sizeof(float)); break;
    case MR5: memcpy(dst, src, MR5 * sizeof(float)); break;
    case NR: memcpy(dst, src, NR * sizeof(float)); break;
    case NR5: memcpy(dst, src, NR5 * sizeof(float)); break;
    default: memcpy(dst, src, (size_t)n * sizeof(float));
    }
}

// Packs rows [i0, i0+mr) x columns [k0, k0+kc) of op(A) as one strip of MR = g->p->mr rows: element
// (i0 + i, k0 + p) at out[p*MR + i]; rows past mr are zero, so the kernel can always compute a full tile.
// Full strips (the common case) copy contiguous runs (copy_run).
static void pack_a_strip(const gemm_args *g, long i0, long k0, int mr, int kc, float *out) {
    const int full = g->p->mr;
    if (g->afmt != TL_F32) {  // widened one element at a time
        for (int p = 0; p < kc; p++)
            for (int i = 0; i < full; i++) out[p * full + i] = i < mr ? a_at(g, i0 + i, k0 + p) : 0.0f;
    } else if (g->transA) {  // row k of the stored A holds op(A)'s column k: contiguous in i
        const float *src = g->A + k0 * g->lda + i0;
        if (mr == full) {
            for (int p = 0; p < kc; p++) copy_run(out + p * full, src + p * g->lda, full);
        } else {
            for (int p = 0; p < kc; p++) {
                for (int i = 0; i < full; i++) out[p * full + i] = i < mr ? src[p * g->lda + i] : 0.0f;
            }
        }
    } else {
        const float *src = g->A + i0 * g->lda + k0;
        for (int i = 0; i < full; i++) {
            if (i < mr) {
                for (int p = 0; p < kc; p++) out[p * full + i] = src[i * g->lda + p];
            } else {
                for (int p = 0; p < kc; p++) out[p * full + i] = 0.0f;
            }
        }
    }
}

// Packs rows [k0, k0+kc) x columns [j0, j0+nr) of op(B) as one strip NR = g->p->nr wide: element
// (k0 + p, j0 + j) at out[p*NR + j]; columns past nr are zero.
static void pack_b_strip(const gemm_args *g, long k0, long j0, int nr, int kc, float *out) {
    const int full = g->p->nr;
    if (g->bfmt != TL_F32) {  // widened (or dequantized) one element at a time
        for (int p = 0; p < kc; p++)
            for (int j = 0; j < full; j++) out[p * full + j] = j < nr ? b_at(g, k0 + p, j0 + j) : 0.0f;
    } else if (g->transB) {  // row j of the stored B holds op(B)'s column j: contiguous in k
        const float *src = g->B + j0 * g->ldb + k0;
        for (int j = 0; j < full; j++) {
            if (j < nr) {
                for (int p = 0; p < kc; p++) out[p * full + j] = src[j * g->ldb + p];
            } else {
                for (int p = 0; p < kc; p++) out[p * full + j] = 0.0f;
            }
        }
    } else {
        const float *src = g->B + k0 * g->ldb + j0;
        if (nr == full) {
            for (int p = 0; p < kc; p++) copy_run(out + p * full, src + p * g->ldb, full);
        } else {
            for (int p = 0; p < kc; p++) {
                for (int j = 0; j < full; j++) out[p * full + j] = j < nr ? src[p * g->ldb + j] : 0.0f;
            }
        }
    }
}

// ----------------------------------------------------------------------------
// AVX2 + FMA path. Compiled for that ISA function by function, so the rest of
// the file (and the portable path) keeps the baseline ISA.

#if defined(__x86_64__)
#define AVX2 __attribute__((target("avx2,fma")))

// The micro-kernel's body, with element (i, p) of the A strip at a[i*rs + p*ks]:
// packed (rs 1, ks MR), or read in place from a row-major A (rs lda, ks 1) or a
// transposed one (rs 1, ks lda). Reading A in place saves packing it, which
// costs about as much as the kernel's loads hide when A comes from L3.
AVX2 static inline __attribute__((always_inline)) void
kernel_avx2_body(int kc, const float *restrict a, long rs, long ks, const float *restrict b,
                 float beta, float *restrict c, long ldc) {
    const float *a0 = a, *a1 = a + rs, *a2 = a + 2 * rs, *a3 = a + 3 * rs, *a4 = a + 4 * rs, *a5 = a + 5 * rs;
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
    __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
    __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
    __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (long p = 0; p < kc * ks; p += ks) {
        __m256 b0 = _mm256_load_ps(b);
        __m256 b1 = _mm256_load_ps(b + 8);
        __m256 ai;
        ai = _mm256_broadcast_ss(a0 + p);
        c00 = _mm256_fmadd_ps(ai, b0, c00);
        c01 = _mm256_fmadd_ps(ai, b1, c01);
        ai = _mm256_broadcast_ss(a1 + p);
        c10 = _mm256_fmadd_ps(ai, b0, c10);
        c11 = _mm256_fmadd_ps(ai, b1, c11);
        ai = _mm256_broadcast_ss(a2 + p);
        c20 = _mm256_fmadd_ps(ai, b0, c20);
        c21 = _mm256_fmadd_ps(ai, b1, c21);
        ai = _mm256_broadcast_ss(a3 + p);
        c30 = _mm256_fmadd_ps(ai, b0, c30);
        c31 = _mm256_fmadd_ps(ai, b1, c31);
        ai = _mm256_broadcast_ss(a4 + p);
        c40 = _mm256_fmadd_ps(ai, b0, c40);
        c41 = _mm256_fmadd_ps(ai, b1, c41);
        ai = _mm256_broadcast_ss(a5 + p);
        c50 = _mm256_fmadd_ps(ai, b0, c50);
        c51 = _mm256_fmadd_ps(ai, b1, c51);
        b += NR;
    }
    __m256 acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    if (beta == 0.0f) {
        for (int i = 0; i < MR; i++) {
            _mm256_storeu_ps(c + i * ldc, acc[i][0]);
            _mm256_storeu_ps(c + i * ldc + 8, acc[i][1]);
        }
    } else {
        __m256 vb = _mm256_set1_ps(beta);
        for (int i = 0; i < MR; i++) {
            _mm256_storeu_ps(c + i * ldc, _mm256_fmadd_ps(vb, _mm256_loadu_ps(c + i * ldc), acc[i][0]));
            _mm256_storeu_ps(c + i * ldc + 8, _mm256_fmadd_ps(vb, _mm256_loadu_ps(c + i * ldc + 8), acc[i][1]));
        }
    }
}

AVX2 void sgemm_kernel_avx2(int kc, const float *a, long lda, const float *b, float beta, float *c, long ldc) {
    (void)lda;
    kernel_avx2_body(kc, a, 1, MR, b, beta, c, ldc);
}

AVX2 void sgemm_kernel_avx2_rows(int kc, const float *a, long lda, const float *b, float beta, float *c, long ldc) {
    kernel_avx2_body(kc, a, lda, 1, b, beta, c, ldc);
}

AVX2 void sgemm_kernel_avx2_cols(int kc, const float *a, long lda, const float *b, float beta, float *c, long ldc) {
    kernel_avx2_body(kc, a, 1, lda, b, beta, c, ldc);
}

// In-register transpose of an 8 x 8 block: r[i] lane j -> r[j] lane i.
AVX2 static inline void transpose8(__m256 r[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// The AVX2 packing routines: templates over the element format, on load8 (sgemm_internal.h).

// op(B)(k + l, j) for l < 8 of a transposed B (W stored N x K), any format. For a quantized one the 8 values
// share a scale and, for q4, one nibble of 8 consecutive bytes: k % 8 == 0 and group % 16 == 0 (sgemm_pack_b).
AVX2H static inline __attribute__((always_inline)) __m256 load8_w(const int F, const gemm_args *g, long j, long k) {
    if (F != TL_Q8 && F != TL_Q4) return load8(F, g->B, j * g->ldb + k);
    const __m256 scale = _mm256_set1_ps(_cvtsh_ss(g->scales[j * g->lds + k / g->group]));
    const uint8_t *row = (const uint8_t *)g->B + j * g->ldb;
    if (F == TL_Q8) {
        const __m128i q = _mm_loadl_epi64((const __m128i *)(row + k));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), scale);
    }
    const long half = g->group / 2, t = k % g->group;
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + k / g->group * half + t % half)));
    const __m256i nib = t < half ? _mm256_and_si256(b, _mm256_set1_epi32(15)) : _mm256_srli_epi32(b, 4);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(nib, _mm256_set1_epi32(8))), scale);
}

// A full strip of mr <= 16 rows of a row-major (untransposed) A: the strided rows become one interleaved stream,
// 8 columns at a time, through one 8 x 8 transpose per group of 8 rows (rows past mr read as zeros). Stores
// go in address order, 8 lanes each: the junk past a strip row's mr values lands where the next store
// overwrites it, or, after the last one, in the following strip (packed later) or the buffer's slack.
AVX2H static inline __attribute__((always_inline)) void
pack_a_strip_rows_body(const int F, const float *src, long lda, int mr, int kc, float *out) {
    const int groups = (mr + 7) / 8;
    int p = 0;
    for (; p + 8 <= kc; p += 8) {
        __m256 r[2][8];
        for (int g = 0; g < groups; g++) {
            for (int i = 0; i < 8; i++)
                r[g][i] = 8 * g + i < mr ? load8(F, src, (8 * g + i) * lda + p) : _mm256_setzero_ps();
            transpose8(r[g]);
        }
        for (int q = 0; q < 8; q++)
            for (int g = 0; g < groups; g++) _mm256_storeu_ps(out + (p + q) * mr + 8 * g, r[g][q]);
    }
    for (; p < kc; p++) {
        for (int i = 0; i < mr; i++) out[p * mr + i] = elem_at(F, src, i * lda + p);
    }
}

// A full strip nr wide (a multiple of 8) of a transposed B (rows j0.. of the stored B, each contiguous in k),
// from k0 on, through nr / 8 transposes of 8 x 8 per 8 values of k.
AVX2H static inline __attribute__((always_inline)) void
pack_b_strip_cols_body(const int F, const gemm_args *g, long j0, long k0, int nr, int kc, float *out) {
    int p = 0;
    for (; p + 8 <= kc; p += 8) {
        for (int h = 0; h < nr; h += 8) {
            __m256 r[8];
            for (int j = 0; j < 8; j++) r[j] = load8_w(F, g, j0 + h + j, k0 + p);
            transpose8(r);
            for (int q = 0; q < 8; q++) _mm256_store_ps(out + (p + q) * nr + h, r[q]);
        }
    }
    for (; p < kc; p++) {
        for (int j = 0; j < nr; j++) out[p * nr + j] = b_at(g, k0 + p, j0 + j);
    }
}

// Rows [k0, k0+kc) of a float16 or bfloat16 B stored K x N, strips [s0, s1) (all full, NR wide) of the panel
// from column j0: each row of the panel read as one run, as sgemm_pack_b does for float32.
AVX2H static inline __attribute__((always_inline)) void
pack_b_rows_half_body(const int F, const gemm_args *g, long k0, long j0, int kc, long s0, long s1, float *bpack) {
    const int NRp = g->p->nr;
    for (int p = 0; p < kc; p++) {
        const long row = (k0 + p) * g->ldb + j0;
        for (long s = s0; s < s1; s++)
            for (int h = 0; h < NRp; h += 8)
                _mm256_store_ps(bpack + (s * kc + p) * NRp + h, load8(F, g->B, row + s * NRp + h));
    }
}

AVX2H static void pack_a_strip_rows_avx2(int fmt, const float *src, long lda, int mr, int kc, float *out) {
    if (fmt == TL_F16) pack_a_strip_rows_body(TL_F16, src, lda, mr, kc, out);
    else if (fmt == TL_BF16) pack_a_strip_rows_body(TL_BF16, src, lda, mr, kc, out);
    else pack_a_strip_rows_body(TL_F32, src, lda, mr, kc, out);
}

AVX2H static void pack_b_strip_cols_avx2(const gemm_args *g, long j0, long k0, int nr, int kc, float *out) {
    switch (g->bfmt) {
    case TL_F16: pack_b_strip_cols_body(TL_F16, g, j0, k0, nr, kc, out); break;
    case TL_BF16: pack_b_strip_cols_body(TL_BF16, g, j0, k0, nr, kc, out); break;
    case TL_Q8: pack_b_strip_cols_body(TL_Q8, g, j0, k0, nr, kc, out); break;
    case TL_Q4: pack_b_strip_cols_body(TL_Q4, g, j0, k0, nr, kc, out); break;
    default: pack_b_strip_cols_body(TL_F32, g, j0, k0, nr, kc, out); break;
    }
}

AVX2H static void pack_b_rows_half_avx2(const gemm_args *g, long k0, long j0, int kc, long s0, long s1, float *bpack) {
    if (g->bfmt == TL_F16) pack_b_rows_half_body(TL_F16, g, k0, j0, kc, s0, s1, bpack);
    else pack_b_rows_half_body(TL_BF16, g, k0, j0, kc, s0, s1, bpack);
}

// ----------------------------------------------------------------------------
// AVX-512F path: the MR5 x NR5 micro-kernel. Its packing is the AVX2 routines' (they take any strip size).

#define AVX512 __attribute__((target("avx2,fma,avx512f")))

// C[MR5 x NR5] (row stride ldc) = acc + beta * C; beta == 0 never reads C.
AVX512 static inline __attribute__((always_inline)) void store_tile_avx512(__m512 acc[MR5][2], float beta, float *c,
                                                                          long ldc) {
    if (beta == 0.0f) {
#pragma GCC unroll 16
        for (int i = 0; i < MR5; i++) {
            _mm512_storeu_ps(c + i * ldc, acc[i][0]);
            _mm512_storeu_ps(c + i * ldc + 16, acc[i][1]);
        }
    } else {
        __m512 vb = _mm512_set1_ps(beta);
#pragma GCC unroll 16
        for (int i = 0; i < MR5; i++) {
            _mm512_storeu_ps(c + i * ldc, _mm512_fmadd_ps(vb, _mm512_loadu_ps(c + i * ldc), acc[i][0]));
            _mm512_storeu_ps(c + i * ldc + 16, _mm512_fmadd_ps(vb, _mm512_loadu_ps(c + i * ldc + 16), acc[i][1]));
        }
    }
}

// As kernel_avx2_body, with element (i, p) of the A strip at a[i*rs + p*ks]. The loop over the rows is
// unrolled, the accumulators stay in registers.
AVX512 static inline __attribute__((always_inline)) void
kernel_avx512_body(int kc, const float *restrict a, long rs, long ks, const float *restrict b,
                   float beta, float *restrict c, long ldc) {
    __m512 acc[MR5][2];
#pragma GCC unroll 16
    for (int i = 0; i < MR5; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (long p = 0; p < kc * ks; p += ks) {
        __m512 b0 = _mm512_load_ps(b);
        __m512 b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 16
        for (int i = 0; i < MR5; i++) {
            __m512 ai = _mm512_set1_ps(a[i * rs + p]);
            acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
        }
        b += NR5;
    }
    store_tile_avx512(acc, beta, c, ldc);
}

AVX512 void sgemm_kernel_avx512(int kc, const float *a, long lda, const float *b, float beta, float *c, long ldc) {
    (void)lda;
    kernel_avx512_body(kc, a, 1, MR5, b, beta, c, ldc);
}

AVX512 void sgemm_kernel_avx512_cols(int kc, const float *a, long lda, const float *b, float beta, float *c,
                                     long ldc) {
    kernel_avx512_body(kc, a, 1, lda, b, beta, c, ldc);
}

// ----------------------------------------------------------------------------
// bfloat16 products on AVX512_BF16 (the plan with pairs, sgemm.c). vdpbf16ps multiplies the two bfloat16 halves of
// each 32-bit lane of its operands and adds both products into that lane's float32 sum, so the strips hold op(A)
// and op(B) as k-pairs, (k, k + 1) in one 32-bit value, and each step of the kernel covers two values of k at the
// cost of one float32 FMA. The products of two bfloat16 are exact in float32 and sum in float32, as torch's
// (oneDNN's) bfloat16 matmul on such CPUs. An odd kc ends in a pair whose second value is zero: it adds nothing.

#define AVX512BF16 __attribute__((target("avx2,fma,avx512f,avx512bw,avx512vl,avx512bf16")))

// As kernel_avx512_body over (kc + 1) / 2 packed k-pairs: a[q*MR5 + i], b[q*NR5 + j].
AVX512BF16 void sgemm_kernel_bf16(int kc, const float *a, long lda, const float *b, float beta, float *c, long ldc) {
    (void)lda;  // always packed
    const uint32_t *ap = (const uint32_t *)a, *bp = (const uint32_t *)b;
    __m512 acc[MR5][2];
#pragma GCC unroll 16
    for (int i = 0; i < MR5; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int q = 0; q < (kc + 1) / 2; q++) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp), b1 = (__m512bh)_mm512_loadu_si512(bp + 16);
#pragma GCC unroll 16
        for (int i = 0; i < MR5; i++) {
            const __m512bh ai = (__m512bh)_mm512_set1_epi32((int)ap[i]);
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);
        }
        ap += MR5;
        bp += NR5;
    }
    store_tile_avx512(acc, beta, c, ldc);
}

// The k-pair packing, for a 16-bit matrix X with element (i, k) at x[i*rs + k*ks]: rows [0, r) and columns
// [0, kc) as out[q*w + i] = X(i, 2q) | X(i, 2q + 1) << 16, rows [r, w) and the value after an odd kc zero. A strip
// of op(A) (X = its rows) or of op(B) (X = its columns), r <= w <= 32. Three ways, by which stride is 1:

// rs == 1 (a transposed A, a plain B: X's columns contiguous): two columns of X, w values each, interleaved by
// one vpermt2w for each 16 pairs.
AVX512BF16 static void pack_pairs_interleave(const uint16_t *x, long ks, int r, int w, int kc, uint32_t *out) {
    const __mmask32 in = r >= 32 ? ~0u : (1u << r) - 1;
    const __mmask16 out0 = w >= 16 ? 0xFFFF : (1u << w) - 1, out1 = w <= 16 ? 0 : (1u << (w - 16)) - 1;
    uint16_t lo_at[32], hi_at[32];  // lanes of the two outputs: (x0, x1) values t and t + 16 (x1's are at 32 +)
    for (int t = 0; t < 16; t++) lo_at[2 * t] = t, lo_at[2 * t + 1] = 32 + t, hi_at[2 * t] = 16 + t,
                                 hi_at[2 * t + 1] = 48 + t;
    const __m512i lo = _mm512_loadu_si512(lo_at), hi = _mm512_loadu_si512(hi_at);
    for (int q = 0; q < (kc + 1) / 2; q++, out += w) {
        const __m512i x0 = _mm512_maskz_loadu_epi16(in, x + 2 * q * ks);
        const __m512i x1 = 2 * q + 1 < kc ? _mm512_maskz_loadu_epi16(in, x + (2 * q + 1) * ks) : _mm512_setzero_si512();
        _mm512_mask_storeu_epi32(out, out0, _mm512_permutex2var_epi16(x0, lo, x1));
        if (out1) _mm512_mask_storeu_epi32(out + 16, out1, _mm512_permutex2var_epi16(x0, hi, x1));
    }
}

// ks == 1 (a plain A, a transposed B: X's rows contiguous): a pair is one 32-bit value of a row, so the strip is
// a transpose of 32-bit values, gathered 16 rows at a time (the last pair of an odd kc zero-padded in plain C:
// its second value would lie past the row).
AVX512BF16 static void pack_pairs_gather(const uint16_t *x, long rs, int r, int w, int kc, uint32_t *out) {
    int row_at[32];
    for (int i = 0; i < 32; i++) row_at[i] = (int)(i < r ? i * rs : 0);
    const __m512i at0 = _mm512_loadu_si512(row_at), at1 = _mm512_loadu_si512(row_at + 16);
    const __mmask16 in0 = r >= 16 ? 0xFFFF : (1u << r) - 1, in1 = r <= 16 ? 0 : (1u << (r - 16)) - 1;
    const __mmask16 out0 = w >= 16 ? 0xFFFF : (1u << w) - 1, out1 = w <= 16 ? 0 : (1u << (w - 16)) - 1;
    int q = 0;
    for (; 2 * q + 1 < kc; q++, out += w) {
        const __m512i z = _mm512_setzero_si512();
        _mm512_mask_storeu_epi32(out, out0, _mm512_mask_i32gather_epi32(z, in0, at0, x + 2 * q, 2));
        if (out1) _mm512_mask_storeu_epi32(out + 16, out1, _mm512_mask_i32gather_epi32(z, in1, at1, x + 2 * q, 2));
    }
    if (2 * q < kc)
        for (int i = 0; i < w; i++) out[i] = i < r ? x[i * rs + 2 * q] : 0;
}

// Neither (a column broadcast with a zero stride, say): one value at a time.
static void pack_pairs_any(const uint16_t *x, long rs, long ks, int r, int w, int kc, uint32_t *out) {
    for (int q = 0; q < (kc + 1) / 2; q++, out += w)
        for (int i = 0; i < w; i++) {
            const uint32_t hi = i < r && 2 * q + 1 < kc ? x[i * rs + (2 * q + 1) * ks] : 0;
            out[i] = i < r ? x[i * rs + 2 * q * ks] | hi << 16 : 0;
        }
}

static void pack_pairs(const uint16_t *x, long rs, long ks, int r, int w, int kc, uint32_t *out) {
    if (rs == 1 && ks != 0) pack_pairs_interleave(x, ks, r, w, kc, out);
    else if (ks == 1 && rs != 0 && rs * 32 < (1L << 31)) pack_pairs_gather(x, rs, r, w, kc, out);
    else pack_pairs_any(x, rs, ks, r, w, kc, out);
}
#endif  // __x86_64__

// ----------------------------------------------------------------------------
// An A block and part of a B panel, packed strip by strip on the routines above.

void sgemm_pack_a(const gemm_args *g, long i0, long k0, int mc, int kc, float *out) {
    const int MRp = g->p->mr;
#if defined(__x86_64__)
    if (g->p->pairs) {  // op(A)(i0 + i, k0 + k), bfloat16
        const uint16_t *a = (const uint16_t *)g->A;
        const long rs = g->transA ? 1 : g->lda, ks = g->transA ? g->lda : 1;
        for (int ir = 0; ir < mc; ir += MRp, out += MRp * strip_len(g->p, kc))
            pack_pairs(a + (i0 + ir) * rs + k0 * ks, rs, ks, (int)tl_min(MRp, mc - ir), MRp, kc, (uint32_t *)out);
        return;
    }
#endif
    for (int ir = 0; ir < mc; ir += MRp, out += MRp * kc) {
        int mr = (int)tl_min(MRp, mc - ir);
#if defined(__x86_64__)
        if (avx2_packs(g->p, g->afmt) && mr == MRp && !g->transA) {
            pack_a_strip_rows_avx2(g->afmt, (const float *)((const char *)g->A + ((i0 + ir) * g->lda + k0) *
                                   (g->afmt == TL_F32 ? 4 : 2)), g->lda, MRp, kc, out);
            continue;
        }
#endif
        pack_a_strip(g, i0 + ir, k0, mr, kc, out);
    }
}

// Packs strips [s0, s1) of the KC x NC panel of op(B) starting at (k0, j0).
void sgemm_pack_b(const gemm_args *g, long k0, long j0, int nc, int kc, long s0, long s1, float *bpack) {
    const int NRp = g->p->nr;
#if defined(__x86_64__)
    if (g->p->pairs) {  // X(j, k) = op(B)(k0 + k, j0 + j), bfloat16
        const uint16_t *b = (const uint16_t *)g->B;
        const long rs = g->transB ? g->ldb : 1, ks = g->transB ? 1 : g->ldb;
        for (long s = s0; s < s1; s++)
            pack_pairs(b + (j0 + s * NRp) * rs + k0 * ks, rs, ks, (int)tl_min(NRp, nc - s * NRp), NRp, kc,
                       (uint32_t *)(bpack + s * NRp * strip_len(g->p, kc)));
        return;
    }
#endif
    if (!g->transB) {
        // Row by row: each row of the panel is read as one contiguous run of B (a strip at a time would
        // stride through B once per strip).
        long full = tl_min(s1, nc / NRp);  // strips before the ragged one
        if (g->bfmt != TL_F32) {
#if defined(__x86_64__)
            if (avx2_packs(g->p, g->bfmt) && full > s0) pack_b_rows_half_avx2(g, k0, j0, kc, s0, full, bpack);
            else full = s0;  // all one element at a time
#else
            full = s0;
#endif
        }
        for (int p = 0; p < kc && g->bfmt == TL_F32; p++) {
            const float *src = g->B + (k0 + p) * g->ldb + j0;
            for (long s = s0; s < full; s++) copy_run(bpack + (s * kc + p) * NRp, src + s * NRp, NRp);
        }
        if (full < s0) full = s0;
        for (long s = full; s < s1; s++) pack_b_strip(g, k0, j0 + s * NRp, (int)tl_min(NRp, nc - s * NRp), kc,
                                                      bpack + s * NRp * kc);
        return;
    }
    for (long s = s0; s < s1; s++) {
        long jr = s * NRp;
        int nr = (int)tl_min(NRp, nc - jr);
        float *out = bpack + s * NRp * kc;
#if defined(__x86_64__)
        const int quantized = g->bfmt == TL_Q8 || g->bfmt == TL_Q4;
        if (avx2_packs(g->p, g->bfmt) && nr == NRp && (!quantized || (g->group % 16 == 0 && k0 % 8 == 0))) {
            pack_b_strip_cols_avx2(g, j0 + jr, k0, NRp, kc, out);
            continue;
        }
#endif
        pack_b_strip(g, k0, j0 + jr, nr, kc, out);
    }
}
