/*
The sgemm with other element formats (formats.h): float16 and bfloat16 operands (tl_gemm_f16_batched2,
tl_gemm_bf16_batched2) and a quantized B (tl_gemm_quantized) run sgemm.c's loops and float32 micro-kernels:
packing (sgemm_kernels.c) widens or dequantizes them into the float32 strips; bfloat16 ones run on vdpbf16ps
instead where the CPU has it (sgemm_bf16_plan). 16-bit products sum in a float32 scratch and round once into C;
with M <= GEMV_M they run as gemv_half instead.
*/

#include "common.h"
#include "formats.h"
#include "gemv.h"
#include "sgemm.h"
#include "sgemm_internal.h"

#if defined(__x86_64__)
// widen_half's vector part: the floats of src[0..i) for the i (a multiple of 8) it returns.
AVX2H static long widen_half_avx2(int fmt, const uint16_t *src, long n, float *dst) {
    long i = 0;
    if (fmt == TL_F16)
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8(TL_F16, (const float *)src, i));
    else
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8(TL_BF16, (const float *)src, i));
    return i;
}

// tl_round_half's vector part: c[0..j) = the floats of s[0..j) rounded to format fmt, for the j (a multiple of 8) it
// returns, with the bits of tl_f32_to_f16 / tl_f32_to_bf16: float16 by F16C's vcvtps2ph to nearest even (NaN made
// quiet, its payload's high bits kept, as there), bfloat16 on the bits as tl_f32_to_bf16 does.
AVX2H static long round_half_avx2(int fmt, const float *s, long n, uint16_t *c) {
    long j = 0;
    if (fmt == TL_F16) {
        for (; j + 8 <= n; j += 8)
            _mm_storeu_si128((__m128i *)(c + j),
                             _mm256_cvtps_ph(_mm256_loadu_ps(s + j), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        return j;
    }
    const __m256i one = _mm256_set1_epi32(1), half = _mm256_set1_epi32(0x7FFF), quiet = _mm256_set1_epi32(0x40);
    const __m256i abs = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000);
    for (; j + 8 <= n; j += 8) {
        const __m256i u = _mm256_loadu_si256((const __m256i *)(s + j)), high = _mm256_srli_epi32(u, 16);
        const __m256i carry = _mm256_add_epi32(half, _mm256_and_si256(high, one));
        const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, carry), 16);
        const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
        const __m256i h = _mm256_blendv_epi8(rounded, _mm256_or_si256(high, quiet), nan);  // each < 2^16
        _mm_storeu_si128((__m128i *)(c + j),
                         _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
    }
    return j;
}

// y[i * ldy + j] = x_i . W_j for j in [j0, j1), M <= GEMV_M rows of x (float32, K apart) and W of format F stored
// N x K (row j at w + j * ldw): each row of W streamed once, widened in registers, into four sets of sums (32
// values of k per step) so that the FMAs' latency does not bound the stream.
AVX2H static inline __attribute__((always_inline)) void
dots_half_avx2_m(const int M, const int F, long K, const float *x, const uint16_t *w, long ldw, float *y, long ldy,
                 long j0, long j1) {
    for (long j = j0; j < j1; j++) {
        const float *wj = (const float *)(w + j * ldw);  // load8's base: 16-bit values, indexed in elements
        __m256 a[4][GEMV_M];
        for (int u = 0; u < 4; u++)
            for (int i = 0; i < M; i++) a[u][i] = _mm256_setzero_ps();
        long k = 0;
        for (; k + 32 <= K; k += 32)
            for (int u = 0; u < 4; u++) {
                const __m256 v = load8(F, wj, k + 8 * u);
                for (int i = 0; i < M; i++)
                    a[u][i] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * K + k + 8 * u), v, a[u][i]);
            }
        for (; k + 8 <= K; k += 8) {
            const __m256 v = load8(F, wj, k);
            for (int i = 0; i < M; i++) a[0][i] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * K + k), v, a[0][i]);
        }
        for (int i = 0; i < M; i++) {
            const __m256 s = _mm256_add_ps(_mm256_add_ps(a[0][i], a[1][i]), _mm256_add_ps(a[2][i], a[3][i]));
            __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
            h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            float sum = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
            for (long p = k; p < K; p++) sum += x[i * K + p] * elem_at(F, wj, p);
            y[i * ldy + j] = sum;
        }
    }
}

#define DOTS_HALF_BY_M(F, ...)                                                  \
    do {                                                                        \
        switch (m) {                                                            \
        case 1: dots_half_avx2_m(1, F, __VA_ARGS__); break;                     \
        case 2: dots_half_avx2_m(2, F, __VA_ARGS__); break;                     \
        case 3: dots_half_avx2_m(3, F, __VA_ARGS__); break;                     \
        default: dots_half_avx2_m(GEMV_M, F, __VA_ARGS__); break;               \
        }                                                                       \
    } while (0)

AVX2H static void dots_half_avx2(int fmt, int m, long K, const float *x, const uint16_t *w, long ldw, float *y,
                                 long ldy, long j0, long j1) {
    if (fmt == TL_F16) DOTS_HALF_BY_M(TL_F16, K, x, w, ldw, y, ldy, j0, j1);
    else DOTS_HALF_BY_M(TL_BF16, K, x, w, ldw, y, ldy, j0, j1);
}
#endif

void tl_gemm_quantized(int fmt, long M, long N, long K, long group, const float *x, long ldx, const void *q, long ldq,
                       const uint16_t *scales, long lds, float *C, long ldc, int nt) {
    const gemm_plan *p = sgemm_current_plan();
    gemm_args g = {0, 1, M, N, K, x, ldx, (const float *)q, ldq, 0.0f, C, ldc, p, TL_F32, fmt, scales, lds, group};
    sgemm_gemm(&g, tl_min(nt, sgemm_useful_threads(p, M, N, K, nt)));
}

// dst[0..n) = the float32 values of n 16-bit floats of format fmt; vec: with AVX2 (avx2_packs).
static void widen_half(int fmt, int vec, const uint16_t *src, long n, float *dst) {
    long i = 0;
#if defined(__x86_64__)
    if (vec) i = widen_half_avx2(fmt, src, n, dst);
#else
    (void)vec;
#endif
    for (; i < n; i++) dst[i] = tl_half_to_f32(fmt, src[i]);
}

void tl_widen_half(int fmt, const uint16_t *src, long n, float *dst) {
    widen_half(fmt, avx2_packs(sgemm_current_plan(), fmt), src, n, dst);
}

#define HALF_GEMV_CHUNK (16L << 10)  // floats of W widened at a time (64 KiB, in L2), then read by the GEMV

// C (float32 sums, row-major, ldc) = op(A) op(B) of 16-bit floats for M <= GEMV_M: the rows of op(A) widened
// once; W = op(B) read once. A transposed B (N x K, a weight as x W^T reads it), the threads splitting its rows:
// with AVX2, dot products that widen W in registers (dots_half_avx2); else whole rows of W widened a chunk at a
// time into this thread's scratch, where gemv.c's float32 GEMV reads them. A plain B, the threads splitting its
// columns: runs of k widened into the scratch the same way, later runs adding into C (beta 1).
static void gemv_half(int fmt, int transA, int transB, long M, long N, long K, const uint16_t *A, long lda,
                      const uint16_t *B, long ldb, float *C, long ldc, int nt) {
    float *x = sgemm_scratch(SLOT_P, (size_t)M * K);
    for (long i = 0; i < M; i++)
        for (long k = 0; k < K; k++) x[i * K + k] = tl_half_to_f32(fmt, A[transA ? k * lda + i : i * lda + k]);
    nt = (int)tl_max(1, tl_min(nt, N * K / (64L << 10)));
    const int vec = avx2_packs(sgemm_current_plan(), fmt);
#pragma omp parallel num_threads(nt)
    {
        const int t = tl_omp_thread_num(), n = tl_omp_num_threads();
        const long j0 = N * t / n, j1 = N * (t + 1) / n;
        float *w = sgemm_scratch(SLOT_A, (size_t)tl_max(HALF_GEMV_CHUNK, transB ? K : j1 - j0));
#if defined(__x86_64__)
        if (transB && vec) {
            dots_half_avx2(fmt, (int)M, K, x, B, ldb, C, ldc, j0, j1);
        } else
#endif
        if (transB) {
            const long rows = tl_max(1, HALF_GEMV_CHUNK / K);
            for (long j = j0; j < j1; j += rows) {
                const long r = tl_min(rows, j1 - j);
                for (long q = 0; q < r; q++) widen_half(fmt, vec, B + (j + q) * ldb, K, w + q * K);
                tl_gemv(0, 1, M, r, K, x, K, w, K, 0.0f, C + j, ldc, 1);
            }
        } else if (j1 > j0) {
            const long cols = j1 - j0, run = tl_max(1, HALF_GEMV_CHUNK / cols);
            for (long k = 0; k < K; k += run) {
                const long r = tl_min(run, K - k);
                for (long q = 0; q < r; q++) widen_half(fmt, vec, B + (k + q) * ldb + j0, cols, w + q * cols);
                tl_gemv(0, 0, M, cols, r, x + k, K, w, cols, k == 0 ? 0.0f : 1.0f, C + j0, ldc, 1);
            }
        }
    }
}

// (formats.h) Rows split among the threads as the product's own threads split them. With AVX2, 8 at a time
// (round_half_avx2: float16's software rounding keeps the plain loop scalar); else a loop per format, which the
// compiler vectorises for bfloat16 (one loop on tl_f32_to_half's run-time format does not).
void tl_round_half(int fmt, long M, long N, const float *sums, uint16_t *c, long ldc, int nt) {
    const int vec = avx2_packs(sgemm_current_plan(), fmt);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && M * N >= (1L << 14))
    for (long i = 0; i < M; i++) {
        const float *s = sums + i * N;
        uint16_t *ci = c + i * ldc;
        long j = 0;
#if defined(__x86_64__)
        if (vec) j = round_half_avx2(fmt, s, N, ci);
#else
        (void)vec;
#endif
        if (fmt == TL_BF16)
            for (; j < N; j++) ci[j] = tl_f32_to_bf16(s[j]);
        else
            for (; j < N; j++) ci[j] = tl_f32_to_f16(s[j]);
    }
}

// Matrix b of a batch of 16-bit float products (as gemm_one); the float32 sums go through this thread's scratch
// (the transposed form, which uses it too, is off for these formats), and are rounded once into C.
static void gemm_half_one(const gemm_plan *p, int fmt, int batch1, long b, int transA, int transB, int M, int N,
                          int K, const uint16_t *A, long lda, long strideA0, long strideA1, const uint16_t *B,
                          long ldb, long strideB0, long strideB1, uint16_t *C, long ldc, long strideC0,
                          long strideC1, int nt) {
    long b0 = b / batch1, b1 = b % batch1;
    float *sums = sgemm_scratch(SLOT_T, (size_t)M * N);
    A += b0 * strideA0 + b1 * strideA1;
    B += b0 * strideB0 + b1 * strideB1;
    const gemm_plan *dot = fmt == TL_BF16 ? sgemm_bf16_plan() : NULL;
    if (M <= GEMV_M && K > 0) {
        gemv_half(fmt, transA, transB, M, N, K, A, lda, B, ldb, sums, N, nt);
    } else {
        gemm_args g = {transA, transB, M, N, K, (const float *)A, lda, (const float *)B, ldb, 0.0f, sums, N,
                       dot ? dot : p, fmt, fmt};
        sgemm_gemm(&g, nt);
    }
    tl_round_half(fmt, M, N, sums, C + b0 * strideC0 + b1 * strideC1, ldc, nt);
}

static void gemm_half_batched2(int fmt, int batch0, int batch1, int transA, int transB, int M, int N, int K,
                               const uint16_t *A, long lda, long strideA0, long strideA1,
                               const uint16_t *B, long ldb, long strideB0, long strideB1,
                               uint16_t *C, long ldc, long strideC0, long strideC1) {
    long batch = (long)batch0 * batch1;
    if (batch <= 0 || M <= 0 || N <= 0) return;
    const gemm_plan *p = sgemm_current_plan();
    int nt = tl_gemm_threads(), per_matrix = M <= GEMV_M ? nt : sgemm_useful_threads(p, M, N, K, nt);
    long over_batch = sgemm_batch_threads(nt, batch, M, N, K);
    if (over_batch > 1 && (per_matrix < nt || batch % nt == 0)) {  // as tl_sgemm_batched2
#pragma omp parallel for num_threads((int)over_batch) schedule(static)
        for (long b = 0; b < batch; b++) gemm_half_one(p, fmt, batch1, b, transA, transB, M, N, K, A, lda, strideA0,
                                                       strideA1, B, ldb, strideB0, strideB1, C, ldc, strideC0,
                                                       strideC1, 1);
        return;
    }
    for (long b = 0; b < batch; b++) gemm_half_one(p, fmt, batch1, b, transA, transB, M, N, K, A, lda, strideA0,
                                                   strideA1, B, ldb, strideB0, strideB1, C, ldc, strideC0, strideC1,
                                                   per_matrix);
}

void tl_gemm_f16_batched2(int batch0, int batch1, int transA, int transB, int M, int N, int K,
                          const uint16_t *A, long lda, long strideA0, long strideA1,
                          const uint16_t *B, long ldb, long strideB0, long strideB1,
                          uint16_t *C, long ldc, long strideC0, long strideC1) {
    gemm_half_batched2(TL_F16, batch0, batch1, transA, transB, M, N, K, A, lda, strideA0, strideA1, B, ldb, strideB0,
                       strideB1, C, ldc, strideC0, strideC1);
}

void tl_gemm_bf16_batched2(int batch0, int batch1, int transA, int transB, int M, int N, int K,
                           const uint16_t *A, long lda, long strideA0, long strideA1,
                           const uint16_t *B, long ldb, long strideB0, long strideB1,
                           uint16_t *C, long ldc, long strideC0, long strideC1) {
    gemm_half_batched2(TL_BF16, batch0, batch1, transA, transB, M, N, K, A, lda, strideA0, strideA1, B, ldb, strideB0,
                       strideB1, C, ldc, strideC0, strideC1);
}
