/*
QMATMUL with int8 activations (qmatmul.h, tl_qmatmul_dynamic): "dynamic quantization", as torch's
quantize_dynamic and llama.cpp's CPU kernels do it. Each row of x is quantized at run time in the weight's groups,

    s_iG = max_t |x_it| / 127 over group G,   qx_it = rint(x_it / s_iG) in [-127, 127],

and y_ij = sum_G (s_iG d_jG) sum_{t in G} qx_it qw_jt, the inner sums exact in int32. That is what lets the
products run on integer dot-product instructions, where the float path widens every weight to float32 first
(qmatmul.c), which bounds decoding by the widening rather than by memory. With AVX512_VNNI they run on
qmatmul_fixed.c's kernel, whose x is the weight-only path's fixed point written in three byte digits: here qx is its
one digit and s_iG its unit, so the products take one vpdpbusd per 64 weights rather than three (it takes several
rows of W at a time on 512-bit vectors). Elsewhere this file's AVX2 kernel runs them on vpmaddubsw +
vpmaddwd (qdyn_group).

A group whose x holds inf or NaN gets a NaN scale: its outputs are NaN, not a wrong finite number.

M <= GEMV_M: the GEMV, each thread a contiguous share of the outputs, W streamed once; the groups' width must be a
multiple of 32 for the SIMD kernels (else the portable one). More rows: x is replaced by its quantized values
s_iG qx_it in float32 and runs through the float path's sgemm (tl_gemm_quantized), the same products up to the
order of the float32 sums.
*/

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "cpu.h"
#include "formats.h"
#include "gemv.h"
#include "qmatmul.h"
#include "qmatmul_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define QDYN_MIN_PER_THREAD (64L << 10)  // weights per thread below which a second thread costs more (qmatmul.c's)

typedef struct {
    int fmt;              // TL_Q8 or TL_Q4
    int m;                // rows of x: 1..GEMV_M
    long n, kp, group;    // outputs, stored columns (whole groups), group width
    const int8_t *qx;     // row i's quantized activations at qx + i*kp (zero past K; q4's SIMD: qdyn_q4_order's)
    const float *sx;      // row i's group scales at sx + i*groups
    const int32_t *bias;  // SIMD: each (row i, group G)'s int32 sums start at bias + 8*(i*groups + G), or zeros
    const uint8_t *q;     // row j of W at q + j*ldq
    long ldq;
    const uint16_t *s;    // row j's scales (float16 bits) at s + j*groups
    float *y;             // y[i*ldy + j]
    long ldy;
} qdyn_args;

// Group [t0, t0 + group) of a row of x (its real columns end at k) into qx and its scale *s, as the module
// docstring defines them: x / s divided (not multiplied by 1/s) and rounded to nearest even, NumPy's rint(x / s).
static void quantize_group(const float *x, long t0, long k, long group, int8_t *qx, float *s) {
    const long t1 = tl_min(t0 + group, k);
    float amax = 0.0f;
    int finite = 1;
    for (long t = t0; t < t1; t++) {
        const float a = fabsf(x[t]);
        finite &= isfinite(a) != 0;
        amax = a > amax ? a : amax;
    }
    *s = finite ? amax / 127.0f : NAN;
    for (long t = t0; t < t0 + group; t++) {
        float r = t < t1 && finite && *s > 0.0f ? rintf(x[t] / *s) : 0.0f;
        r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
        qx[t] = (int8_t)r;
    }
}

#if defined(__x86_64__)
// The same for a whole group of 8k columns, 8 at a time (the scalar loop calls libm's rintf per value: the baseline
// ISA has no rounding instruction; here it is SSE4.1's, same mode).
__attribute__((target("avx2,fma"))) static void quantize_group_avx2(const float *x, long t0, long group, int8_t *qx,
                                                                      float *s) {
    const __m256 sign = _mm256_set1_ps(-0.0f), inf = _mm256_set1_ps(INFINITY);
    __m256 amax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    for (long t = t0; t < t0 + group; t += 8) {
        const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + t));
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));  // inf, or NaN (unordered)
        amax = _mm256_max_ps(amax, a);
    }
    float m[8];
    _mm256_storeu_ps(m, amax);
    float top = 0.0f;
    for (int l = 0; l < 8; l++) top = m[l] > top ? m[l] : top;
    *s = _mm256_movemask_ps(bad) ? NAN : top / 127.0f;
    if (!(*s > 0.0f)) {  // zeros, or not finite: qx 0 (the scale says which)
        memset(qx + t0, 0, (size_t)group);
        return;
    }
    const __m256 d = _mm256_set1_ps(*s), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    for (long t = t0; t < t0 + group; t += 8) {
        const __m256 r = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + t), d),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256i q = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
        const __m128i q16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
        _mm_storel_epi64((__m128i *)(qx + t), _mm_packs_epi16(q16, q16));
    }
}
#endif

// Row i of x (k columns) into qx (kp: zero past k) and its group scales sx.
static void quantize_row(const float *x, long k, long kp, long group, int simd, int8_t *qx, float *sx) {
    for (long G = 0; G * group < kp; G++) {
#if defined(__x86_64__)
        if (simd && (G + 1) * group <= k) {
            quantize_group_avx2(x, G * group, group, qx, sx + G);
            continue;
        }
#endif
        (void)simd;
        quantize_group(x, G * group, k, group, qx, sx + G);
    }
}

// Weight t of a group (whole number) whose bytes start at qg (qmatmul.c's qgemv_weight, as an integer).
static inline int qdyn_weight(int fmt, const uint8_t *qg, long half, long t) {
    if (fmt == TL_Q8) return (int8_t)qg[t];
    return (t < half ? qg[t] & 15 : qg[t - half] >> 4) - 8;
}

static void qdyn_portable(const qdyn_args *v, long j0, long j1) {
    const long group = v->group, groups = v->kp / group, half = group / 2, gbytes = v->fmt == TL_Q8 ? group : half;
    for (long j = j0; j < j1; j++)
        for (int i = 0; i < v->m; i++) {
            const int8_t *qx = v->qx + i * v->kp;
            float total = 0.0f;
            for (long G = 0; G < groups; G++) {
                const uint8_t *qg = v->q + j * v->ldq + G * gbytes;
                int32_t dot = 0;
                for (long t = 0; t < group; t++) dot += qdyn_weight(v->fmt, qg, half, t) * qx[G * group + t];
                total += (float)dot * (v->sx[i * groups + G] * tl_f16_to_f32(v->s[j * groups + G]));
            }
            v->y[i * v->ldy + j] = total;
        }
}

#if defined(__x86_64__)
#define QDYN_AVX2 __attribute__((target("avx2,fma,f16c")))
// Asks for the line 4 KiB ahead of each new line of W a step enters: W's short rows (768 bytes to 3 KiB a row) mostly
// lie on 4 KiB pages, where the hardware prefetchers stop at every page boundary. Measured from memory on Zen 4, 2
// threads, M = 1, 768 x 768 int8: 17 GB/s without, 18 with qmatmul.c's page-ahead, 22 at 1 KiB ahead, 29 at 4 KiB.
#define QDYN_AHEAD 4096
#define QDYN_PREFETCH(p, step)                                                                                    \
    do {                                                                                                          \
        if (((uintptr_t)(p) & 63) < (step)) __builtin_prefetch((const char *)(p) + QDYN_AHEAD, 0, 3);             \
    } while (0)

// Group G of one row of W (bytes from qg, scale d) for M rows of x. Per row of x: the int32 sums of 32 weights at a
// time, started from the row's bias (qdyn_args.bias: what the weights' offset adds), then one FMA by s_iG d_jG into
// a float total. The products on vpmaddubsw + vpmaddwd: unsigned bytes against signed ones, summed in pairs into 16
// bits, which saturate at 2 x 255 x 127, so q8's magnitudes |w| meet the activations with the weights' signs moved
// onto them (vpsignb), as llama.cpp's AVX2 kernels do (2 x 127 x 127 at most). q4's 16 bytes hold weights t..t+15 of
// the group in their low nibbles and t+half.. in their high ones: the unsigned nibbles [low | high] meet x's 32 bytes
// in that order (qdyn_q4_order), their offset 8 taken off by the bias.
QDYN_AVX2 static inline __attribute__((always_inline)) void
qdyn_group(const int M, const int F, const int GS, const qdyn_args *v, const uint8_t *qg, long G, float d,
           __m256 *tot) {
    const long group = GS ? GS : v->group, groups = v->kp / group;
    __m256i acc[GEMV_M];
    for (int i = 0; i < M; i++)
        acc[i] = v->bias ? _mm256_loadu_si256((const __m256i *)(v->bias + 8 * (i * groups + G)))
                         : _mm256_setzero_si256();
    for (long t = 0; t < group; t += 32) {
        __m256i u, w = _mm256_setzero_si256();
        QDYN_PREFETCH(qg + (F == TL_Q8 ? t : t / 2), F == TL_Q8 ? 32 : 16);
        if (F == TL_Q8) {
            w = _mm256_loadu_si256((const __m256i *)(qg + t));
            u = _mm256_sign_epi8(w, w);
        } else {
            const __m128i b = _mm_loadu_si128((const __m128i *)(qg + t / 2));
            u = _mm256_and_si256(_mm256_inserti128_si256(_mm256_castsi128_si256(b), _mm_srli_epi16(b, 4), 1),
                                 _mm256_set1_epi8(15));
        }
        for (int i = 0; i < M; i++) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(v->qx + i * v->kp + G * group + t));
            const __m256i pairs = _mm256_maddubs_epi16(u, F == TL_Q8 ? _mm256_sign_epi8(x, w) : x);
            acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
        }
    }
    for (int i = 0; i < M; i++)
        tot[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[i]), _mm256_set1_ps(v->sx[i * groups + G] * d), tot[i]);
}

// Outputs [j0, j1) for M rows of x: each row of W's groups in turn, even and odd groups into separate totals (one
// chain of FMA latency each, not one for the whole row).
QDYN_AVX2 static inline __attribute__((always_inline)) void
qdyn_avx2_m(const int M, const int F, const int GS, const qdyn_args *v, long j0, long j1) {
    const long group = GS ? GS : v->group, groups = v->kp / group, gbytes = F == TL_Q8 ? group : group / 2;
    for (long j = j0; j < j1; j++) {
        const uint8_t *row = v->q + j * v->ldq;
        const uint16_t *scales = v->s + j * groups;
        __m256 even[GEMV_M], odd[GEMV_M];
        for (int i = 0; i < M; i++) even[i] = odd[i] = _mm256_setzero_ps();
        long G = 0;
        for (; G + 2 <= groups; G += 2) {
            qdyn_group(M, F, GS, v, row + G * gbytes, G, _cvtsh_ss(scales[G]), even);
            qdyn_group(M, F, GS, v, row + (G + 1) * gbytes, G + 1, _cvtsh_ss(scales[G + 1]), odd);
        }
        if (G < groups) qdyn_group(M, F, GS, v, row + G * gbytes, G, _cvtsh_ss(scales[G]), even);
        for (int i = 0; i < M; i++) {
            const __m256 t8 = _mm256_add_ps(even[i], odd[i]);
            __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(t8), _mm256_extractf128_ps(t8, 1));
            s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
            v->y[i * v->ldy + j] = _mm_cvtss_f32(_mm_add_ss(s4, _mm_movehdup_ps(s4)));
        }
    }
}

QDYN_AVX2 static void qdyn_avx2(const qdyn_args *v, long j0, long j1) {
    const int g32 = v->group == 32;  // llama.cpp's group, unrolled whole
    if (v->fmt == TL_Q8 && g32) QGEMV_BY_M(qdyn_avx2_m, TL_Q8, 32, v, j0, j1);
    else if (v->fmt == TL_Q8) QGEMV_BY_M(qdyn_avx2_m, TL_Q8, 0, v, j0, j1);
    else if (g32) QGEMV_BY_M(qdyn_avx2_m, TL_Q4, 32, v, j0, j1);
    else QGEMV_BY_M(qdyn_avx2_m, TL_Q4, 0, v, j0, j1);
}
#endif  // __x86_64__

typedef void (*qdyn_fn)(const qdyn_args *v, long j0, long j1);

// Whether the SIMD kernels run for this group width here (AVX2 with F16C, a multiple of 32).
static int qdyn_kernel_simd(long group) { return tl_cpu_path() >= 1 && tl_has_f16c() && group % 32 == 0; }

static qdyn_fn qdyn_kernel(const qdyn_args *v) {
#if defined(__x86_64__)
    if (qdyn_kernel_simd(v->group)) return qdyn_avx2;
#endif
    return qdyn_portable;
}

// A quantized row (kp bytes, groups of `group`) in the order q4's SIMD kernel reads it: per 16 bytes t.. of a
// group's packed weights, x's 16 values t.. (the low nibbles' weights) then its 16 values t + half.. (the high).
static void qdyn_q4_order(const int8_t *qx, long kp, long group, int8_t *out) {
    const long half = group / 2;
    for (long g0 = 0; g0 < kp; g0 += group)
        for (long t = 0; t < half; t += 16) {
            memcpy(out + g0 + 2 * t, qx + g0 + t, 16);
            memcpy(out + g0 + 2 * t + 16, qx + g0 + half + t, 16);
        }
}

// Outputs [j0, j1): on qmatmul_fixed.c's kernel where fx->fixed is set, else on `kernel`
static void qdyn_share(const qgemv_args *fx, qdyn_fn kernel, const qdyn_args *v, long j0, long j1) {
    if (fx->fixed != NULL) tl_qgemv_fixed(fx, j0, j1);
    else kernel(v, j0, j1);
}

static void qmatmul_dynamic(int fmt, int M, int N, int K, int group, const float *x, long ldx, const void *q,
                            const uint16_t *scales, float *out, long ldo) {
    if (M <= 0 || N <= 0) return;
    const long kp = ((long)K + group - 1) / group * group, groups = kp / group;
    const long ldq = fmt == TL_Q8 ? kp : kp / 2;
    // one allocation: the quantized rows (twice: q4's SIMD kernel reads them reordered), their scales, the biases
    const size_t rows = (size_t)tl_round_up(M * kp, 32), bytes = 2 * rows + (sizeof(float) + 32) * M * groups;
    int8_t *qx = (int8_t *)aligned_alloc(32, (size_t)tl_round_up((long)bytes, 32));
    if (qx == NULL) tl_oom(bytes);
    int32_t *bias = (int32_t *)(void *)(qx + 2 * rows);
    float *sx = (float *)(void *)(bias + 8 * M * groups);
    const int simd = qdyn_kernel_simd(group);
    for (int i = 0; i < M; i++) quantize_row(x + i * ldx, K, kp, group, simd, qx + i * kp, sx + i * groups);
    if (M > GEMV_M) {  // x as its quantized values, through the float path's sgemm
        float *xq = (float *)malloc((size_t)M * K * sizeof(float));
        if (xq == NULL) tl_oom((size_t)M * K * sizeof(float));
        for (long i = 0; i < M; i++)
            for (long t = 0; t < K; t++) xq[i * K + t] = sx[i * groups + t / group] * (float)qx[i * kp + t];
        tl_gemm_quantized(fmt, M, N, K, group, xq, K, q, ldq, scales, groups, out, ldo, tl_gemm_threads());
        free(xq);
        free(qx);
        return;
    }
    // with AVX512_VNNI, qmatmul_fixed.c's kernel, x its one digit: several rows of W at a time on 512-bit vectors
    qgemv_args fx = {fmt, M, N, K, group, NULL, 0, (const uint8_t *)q, ldq, scales, groups, out, ldo, NULL, NULL};
    fx.fixed = tl_qgemv_fixed_prepare_int8(&fx, qx, sx);
    qdyn_args v = {.fmt = fmt, .m = M, .n = N, .kp = kp, .group = group, .qx = qx, .sx = sx, .bias = NULL,
                   .q = (const uint8_t *)q, .ldq = ldq, .s = scales, .y = out, .ldy = ldo};
    const qdyn_fn kernel = fx.fixed ? NULL : qdyn_kernel(&v);
    // The SIMD kernel's offset: q4's unsigned nibbles are w + 8, which adds 8 x sum_t qx_t to a group's sum; its
    // bias (in lane 0) takes that off.
    if (kernel != NULL && kernel != qdyn_portable && fmt == TL_Q4) {
        memset(bias, 0, sizeof(int32_t) * 8 * M * groups);
        for (long r = 0; r < M * groups; r++) {
            int32_t sum = 0;
            for (long t = 0; t < group; t++) sum += qx[r * group + t];
            bias[8 * r] = -8 * sum;
        }
        v.bias = bias;
        for (int i = 0; i < M; i++) qdyn_q4_order(qx + i * kp, kp, group, qx + rows + i * kp);
        v.qx = qx + rows;
    }
    const int nt = (int)tl_max(1, tl_min(tl_gemm_threads(), N * kp / QDYN_MIN_PER_THREAD));
    if (nt <= 1) {
        qdyn_share(&fx, kernel, &v, 0, N);
    } else {
#pragma omp parallel num_threads(nt)
        {
            const int t = tl_omp_thread_num(), n = tl_omp_num_threads();
            qdyn_share(&fx, kernel, &v, N * t / n, N * (t + 1) / n);
        }
    }
    tl_qgemv_fixed_free((qgemv_fixed *)fx.fixed);
    free(qx);
}

void tl_qmatmul_dynamic(int bits, int M, int N, int K, int group, const float *x, long ldx, const void *q,
                        const uint16_t *scales, float *out, long ldo) {
    qmatmul_dynamic(bits == 4 ? TL_Q4 : TL_Q8, M, N, K, group, x, ldx, q, scales, out, ldo);
}
