/*
QMATMUL (qmatmul.h): x W^T with W quantized, q8 or q4 (formats.h).

M <= GEMV_M: the GEMV. Decoding reads every weight once per token, so the bytes of W set its floor: 1 per weight
for q8 and 1/2 for q4 (+ 2 per group for the scales), against 4 for float32. Each output j is a dot product
along row j of W, which is contiguous, as are the rows one after another: a thread's share of the outputs is one
stream through memory. A group's sum is taken on the whole numbers widened to float32 in registers, then scaled
once; the float32 activations are used as they are (no quantized activations). Two or more threads each take a
contiguous share of the outputs. The widening, not memory, bounds this kernel on the CPUs measured (its vector
operations per weight fill the SIMD ports), so each operation saved counts:
  - q4's nibbles go in as they are (w + 8), and the offset leaves once per group as 8 d_G sum_{t in G} x_t, the
    sums of x taken once per call for all of W's rows (qgemv's xsum8): two integer operations fewer per 16
    weights, for rounding of order eps 8 sum |x_t| d_G in place of eps sum |w_t x_t| (the float sums' own);
  - a group of 32 (llama.cpp's) adds into two sets of sums, not four: two additions fewer per group;
  - no software prefetch: the page-ahead of gemv.c measured no better, or worse, on these short quantized rows.
Where the CPU has AVX512_VNNI (and the dot-product instructions are on: cpu.h), groups of a multiple of 32 run on
qmatmul_fixed.c's kernel instead: x in fixed point, the products on vpdpbusd, no widening.

M > GEMV_M: the sgemm with B = W^T dequantized while its B panels are packed (sgemm_kernels.c's
pack_b_strip_cols_body: 8 rows x 8 k widened, scaled and transposed in registers), so the micro-kernels are
float32's own.
*/

#include <stdint.h>

#include "common.h"
#include "cpu.h"
#include "formats.h"
#include "gemv.h"
#include "qmatmul.h"
#include "qmatmul_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define AVX2H __attribute__((target("avx2,fma,f16c")))
#endif

// Weights per thread below which another thread costs more than it saves: gemv.c's figure (the second thread
// starts at 128 Ki weights), as widening makes a quantized weight cost about as much time as a float32 one from
// cache.
#define QGEMV_MIN_PER_THREAD (64L << 10)
#define QGEMV_CHUNK 64  // weights of a group the portable kernel widens at a time

// Weight t of a group (whole number) whose bytes start at qg.
static inline float qgemv_weight(int fmt, const uint8_t *qg, long half, long t) {
    if (fmt == TL_Q8) return (float)(int8_t)qg[t];
    return (float)((t < half ? qg[t] & 15 : qg[t - half] >> 4) - 8);
}

// Group G of row j (its first `len` weights: all of them but in a last partial group): total[i] += scale * (x_i .
// whole numbers), the group widened QGEMV_CHUNK weights at a time into w, dotted with each row of x (8 partial
// sums, so the compiler vectorises without reassociating).
static void qgemv_group_portable(const qgemv_args *v, long j, long G, long len, float *total) {
    const long group = v->group, half = group / 2, gbytes = v->fmt == TL_Q8 ? group : half;
    const uint8_t *qg = v->q + j * v->ldq + G * gbytes;
    float w[QGEMV_CHUNK], sum[GEMV_M] = {0};
    for (long t0 = 0; t0 < len; t0 += QGEMV_CHUNK) {
        const long c = tl_min(QGEMV_CHUNK, len - t0);
        for (long t = 0; t < c; t++) w[t] = qgemv_weight(v->fmt, qg, half, t0 + t);
        for (int i = 0; i < v->m; i++) {
            const float *x = v->x + i * v->ldx + G * group + t0;
            float s[8] = {0};
            long t = 0;
            for (; t + 8 <= c; t += 8)
                for (int l = 0; l < 8; l++) s[l] += x[t + l] * w[t + l];
            for (; t < c; t++) s[0] += x[t] * w[t];
            sum[i] += ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
        }
    }
    const float scale = tl_f16_to_f32(v->s[j * v->lds + G]);
    for (int i = 0; i < v->m; i++) total[i] += scale * sum[i];
}

// Portable: every group, the last one partial where K is not a multiple of the group.
static void qgemv_portable(const qgemv_args *v, long j0, long j1) {
    const long group = v->group, groups = (v->k + group - 1) / group;
    for (long j = j0; j < j1; j++) {
        float total[GEMV_M] = {0};
        for (long G = 0; G < groups; G++) qgemv_group_portable(v, j, G, tl_min(group, v->k - G * group), total);
        for (int i = 0; i < v->m; i++) v->y[i * v->ldy + j] = total[i];
    }
}

#if defined(__x86_64__)
AVX2H static inline float qgemv_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// Weights 16 at a time (t..: bytes from qg + t, activations from column k0 + t of x) into the sums a0 and a1:
// q8: 8 bytes -> 8 int32 -> 8 floats, twice; q4: 8 bytes give 8 weights in their low nibbles (k0 + t..) and 8
// in their high nibbles (k0 + half + t..).
AVX2H static inline __attribute__((always_inline)) void
qgemv_16_avx2(const int M, const int F, const qgemv_args *v, const uint8_t *qg, long k0, long half,
              long t, __m256 *a0, __m256 *a1) {
    __m256 w0, w1;
    if (F == TL_Q8) {
        w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qg + t))));
        w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qg + t + 8))));
    } else {
        const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qg + t)));
        w0 = _mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(15)));  // the nibbles, offset 8 and all
        w1 = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
    }
    const long second = F == TL_Q8 ? 8 : half;  // where w1's activations start, past x's for w0
    for (int i = 0; i < M; i++) {
        const float *x = v->x + i * v->ldx + k0 + t;
        a0[i] = _mm256_fmadd_ps(_mm256_loadu_ps(x), w0, a0[i]);
        a1[i] = _mm256_fmadd_ps(_mm256_loadu_ps(x + second), w1, a1[i]);
    }
}

// One group of a row of W (bytes from qg, activations from column k0 of x): tot[i] += scale * (x_i . whole
// numbers), in four sets of sums (two steps of 16 weights at a time) so that a long group is not one chain of
// 4-cycle FMA latencies; a group of 32 in two (its chains are two FMAs long, and groups overlap). GS: the group
// size as a compile-time constant (32, llama.cpp's, whose group then unrolls whole), or 0 to read it from v.
AVX2H static inline __attribute__((always_inline)) void
qgemv_group_avx2(const int M, const int F, const int GS, const qgemv_args *v, const uint8_t *qg,
                 long k0, const float *scale, __m256 *tot) {
    const long group = GS ? GS : v->group, half = group / 2, steps = F == TL_Q8 ? group : half;
    const long step = F == TL_Q8 ? 16 : 8;  // bytes of one qgemv_16_avx2
    const int SHORT = GS == 32;             // a group of two steps: two sums of 2 FMAs each, not four of 1
    __m256 a0[GEMV_M], a1[GEMV_M], a2[GEMV_M], a3[GEMV_M];
    for (int i = 0; i < M; i++) a0[i] = a1[i] = a2[i] = a3[i] = _mm256_setzero_ps();
    long t = 0;
    for (; t + 2 * step <= steps; t += 2 * step) {
        qgemv_16_avx2(M, F, v, qg, k0, half, t, a0, a1);
        qgemv_16_avx2(M, F, v, qg, k0, half, t + step, SHORT ? a0 : a2, SHORT ? a1 : a3);
    }
    if (t < steps) qgemv_16_avx2(M, F, v, qg, k0, half, t, a0, a1);
    const __m256 s = _mm256_broadcast_ss(scale);
    for (int i = 0; i < M; i++)
        tot[i] = _mm256_fmadd_ps(s, SHORT ? _mm256_add_ps(a0[i], a1[i])
                                      : _mm256_add_ps(_mm256_add_ps(a0[i], a2[i]), _mm256_add_ps(a1[i], a3[i])),
                                 tot[i]);
}

// Outputs [j0, j1) for M rows of x; group % 16 == 0. A row's scales are widened 8 at a time (F16C) into sc;
// even and odd groups add into separate totals, so the one scaling FMA per group is not one chain of 4-cycle
// latencies. A last partial group (K not a multiple of the group) is the portable kernel's, added at the end.
AVX2H static inline __attribute__((always_inline)) void
qgemv_avx2_m(const int M, const int F, const int GS, const qgemv_args *v, long j0, long j1) {
    const long group = GS ? GS : v->group, groups = v->k / group, gbytes = F == TL_Q8 ? group : group / 2;
    float sc[8];
    for (long j = j0; j < j1; j++) {
        const uint8_t *row = v->q + j * v->ldq;
        const uint16_t *scales = v->s + j * v->lds;
        __m256 tot[2][GEMV_M];
        float total[GEMV_M] = {0};
        for (int i = 0; i < M; i++) tot[0][i] = tot[1][i] = _mm256_setzero_ps();
        for (long G0 = 0; G0 < groups; G0 += 8) {
            const long n = tl_min(8, groups - G0);
            if (n == 8) {
                const __m256 s8 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(scales + G0)));
                _mm256_storeu_ps(sc, s8);
                if (F == TL_Q4)  // the nibbles' offset: - sum_G d_G 8 sum_{t in G} x_t
                    for (int i = 0; i < M; i++)
                        tot[1][i] = _mm256_fnmadd_ps(s8, _mm256_loadu_ps(v->xsum8 + i * groups + G0), tot[1][i]);
            } else {
                for (long G = 0; G < n; G++) sc[G] = _cvtsh_ss(scales[G0 + G]);
                if (F == TL_Q4)
                    for (int i = 0; i < M; i++)
                        for (long G = 0; G < n; G++) total[i] -= sc[G] * v->xsum8[i * groups + G0 + G];
            }
            long G = 0;
            for (; G + 2 <= n; G += 2) {
                qgemv_group_avx2(M, F, GS, v, row + (G0 + G) * gbytes, (G0 + G) * group, sc + G, tot[0]);
                qgemv_group_avx2(M, F, GS, v, row + (G0 + G + 1) * gbytes, (G0 + G + 1) * group, sc + G + 1,
                                 tot[1]);
            }
            if (G < n) qgemv_group_avx2(M, F, GS, v, row + (G0 + G) * gbytes, (G0 + G) * group, sc + G, tot[0]);
        }
        if (groups * group < v->k) qgemv_group_portable(v, j, groups, v->k - groups * group, total);
        for (int i = 0; i < M; i++) v->y[i * v->ldy + j] = qgemv_hsum(_mm256_add_ps(tot[0][i], tot[1][i])) + total[i];
    }
}

#define QGEMV_BY_GROUP(F, v, j0, j1)                                    \
    do {                                                                \
        if ((v)->group == 32) QGEMV_BY_M(qgemv_avx2_m, F, 32, v, j0, j1); \
        else QGEMV_BY_M(qgemv_avx2_m, F, 0, v, j0, j1);                   \
    } while (0)

AVX2H static void qgemv_avx2(const qgemv_args *v, long j0, long j1) {
    if (v->fmt == TL_Q8) QGEMV_BY_GROUP(TL_Q8, v, j0, j1);
    else QGEMV_BY_GROUP(TL_Q4, v, j0, j1);
}

#endif  // __x86_64__

typedef void (*qgemv_fn)(const qgemv_args *v, long j0, long j1);

static qgemv_fn qgemv_kernel(const qgemv_args *v) {
#if defined(__x86_64__)
    if (tl_cpu_path() >= 1 && tl_has_f16c() && v->group % 16 == 0) return qgemv_avx2;
#endif
    (void)v;
    return qgemv_portable;
}

// Whether a kernel takes q4's nibbles as they are (w + 8) and needs the sums of x (qgemv_avx2_m).
static int takes_xsum8(qgemv_fn kernel) {
#if defined(__x86_64__)
    return kernel == qgemv_avx2;
#else
    (void)kernel;
    return 0;
#endif
}

// q4 on the AVX2 kernel: the sums of x over each whole group, times 8, for the nibbles' offset (qgemv_avx2_m)
#define QGEMV_XSUM_STACK 2048

static void qgemv(qgemv_args *v, int nt) {
    qgemv_fixed *fixed = tl_qgemv_fixed_prepare(v);  // on AVX512_VNNI: qmatmul_fixed.c's kernel
    v->fixed = fixed;
    const qgemv_fn kernel = fixed ? tl_qgemv_fixed : qgemv_kernel(v);
    float stack[QGEMV_XSUM_STACK], *xsum8 = NULL;
    if (v->fmt == TL_Q4 && takes_xsum8(kernel)) {
        const long groups = v->k / v->group, size = v->m * groups;
        xsum8 = size <= QGEMV_XSUM_STACK ? stack : (float *)malloc((size_t)size * sizeof(float));
        if (xsum8 == NULL) tl_oom((size_t)size * sizeof(float));
        for (int i = 0; i < v->m; i++)
            for (long G = 0; G < groups; G++) {
                const float *x = v->x + i * v->ldx + G * v->group;
                float sum = 0;
                for (long t = 0; t < v->group; t++) sum += x[t];
                xsum8[i * groups + G] = 8 * sum;
            }
        v->xsum8 = xsum8;
    }
    nt = (int)tl_max(1, tl_min(nt, v->n * v->k / QGEMV_MIN_PER_THREAD));
    if (nt <= 1) {
        kernel(v, 0, v->n);
    } else {
#pragma omp parallel num_threads(nt)
        {
            const int t = tl_omp_thread_num(), n = tl_omp_num_threads();
            kernel(v, v->n * t / n, v->n * (t + 1) / n);
        }
    }
    if (xsum8 != stack) free(xsum8);
    tl_qgemv_fixed_free(fixed);
}

static void qmatmul(int fmt, int M, int N, int K, int group, const float *x, long ldx, const void *q,
                    const uint16_t *scales, float *out, long ldo) {
    if (M <= 0 || N <= 0) return;
    const long kp = ((long)K + group - 1) / group * group;  // the columns stored: whole groups
    const long ldq = fmt == TL_Q8 ? kp : kp / 2, lds = kp / group;
    if (M > GEMV_M) {
        tl_gemm_quantized(fmt, M, N, K, group, x, ldx, q, ldq, scales, lds, out, ldo, tl_gemm_threads());
        return;
    }
    qgemv_args v = {fmt, M, N, K, group, x, ldx, (const uint8_t *)q, ldq, scales, lds, out, ldo, NULL, NULL};
    qgemv(&v, tl_gemm_threads());
}

void tl_qmatmul_q8(int M, int N, int K, int group, const float *x, long ldx, const int8_t *q,
                   const uint16_t *scales, float *out, long ldo) {
    qmatmul(TL_Q8, M, N, K, group, x, ldx, q, scales, out, ldo);
}

void tl_qmatmul_q4(int M, int N, int K, int group, const float *x, long ldx, const uint8_t *q,
                   const uint16_t *scales, float *out, long ldo) {
    qmatmul(TL_Q4, M, N, K, group, x, ldx, q, scales, out, ldo);
}
