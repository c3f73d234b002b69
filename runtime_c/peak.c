/*
The machine's limits for the benches (peak.h): multiply-add throughput per instruction-set path and thread count,
and a read-only stream. The FMA loops are those of cpu.c's calibration (12 independent chains cover the FMA
latency times the pipes, so the loop runs at throughput), run for longer and on every thread.
*/
#include <time.h>

#include "common.h"
#include "cpu.h"
#include "peak.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

// Per thread: a sink for the chains' sum (so no chain is dead code), one cache line apart (no false sharing).
static volatile float g_sink[64 * 16];

// `iters` steps of 12 chains c = OP(c); x passes through an empty asm each step, so the loop cannot be folded.
#define CHAINS(T, SET1, OP, ADD, CVT, REG)                                                                     \
    T x = SET1(1.0f), y = SET1(0.999f);                                                                      \
    T c0 = SET1(0), c1 = SET1(1), c2 = SET1(2), c3 = SET1(3), c4 = SET1(4), c5 = SET1(5), c6 = SET1(6),       \
      c7 = SET1(7), c8 = SET1(8), c9 = SET1(9), c10 = SET1(10), c11 = SET1(11);                              \
    for (long i = 0; i < iters; i++) {                                                                       \
        c0 = OP(c0), c1 = OP(c1), c2 = OP(c2), c3 = OP(c3), c4 = OP(c4), c5 = OP(c5);                        \
        c6 = OP(c6), c7 = OP(c7), c8 = OP(c8), c9 = OP(c9), c10 = OP(c10), c11 = OP(c11);                    \
        __asm__ __volatile__("" : REG(x));                                                                   \
    }                                                                                                        \
    T s = ADD(ADD(ADD(c0, c1), ADD(c2, c3)), ADD(ADD(c4, c5), ADD(c6, c7)));                                 \
    return CVT(ADD(s, ADD(ADD(c8, c9), ADD(c10, c11))));

// The portable path: GCC vectors of 4 floats (SSE2 on x86-64, NEON on aarch64), as the kernels' plain C is
// vectorised for the baseline ISA; multiply then add, which -ffp-contract=off keeps apart, as in those kernels.
typedef float v4f __attribute__((vector_size(16)));
#define V4_SET1(v) ((v4f){(v), (v), (v), (v)})
#define V4_OP(c) ((c) * x + y)
#define V4_ADD(a, b) ((a) + (b))
#define V4_CVT(a) ((a)[0])
#if defined(__x86_64__)
#define V4_REG(x) "+x"(x)
#elif defined(__aarch64__)
#define V4_REG(x) "+w"(x)
#else
#define V4_REG(x) "+g"(x)
#endif

static float chains_portable(long iters) { CHAINS(v4f, V4_SET1, V4_OP, V4_ADD, V4_CVT, V4_REG) }

#if defined(__x86_64__)
#define X_REG(x) "+x"(x)
#define FMA256(c) _mm256_fmadd_ps(x, y, c)
#define FMA512(c) _mm512_fmadd_ps(x, y, c)
__attribute__((target("avx2,fma"))) static float chains_avx2(long iters) {
    CHAINS(__m256, _mm256_set1_ps, FMA256, _mm256_add_ps, _mm256_cvtss_f32, X_REG)
}
__attribute__((target("avx512f,fma"))) static float chains_avx512(long iters) {
    CHAINS(__m512, _mm512_set1_ps, FMA512, _mm512_add_ps, _mm512_cvtss_f32, X_REG)
}
#endif
#undef CHAINS

double tl_peak_fma_gflops(int path, int threads, long iters) {
    if (!tl_cpu_supports(path) || iters <= 0) return 0.0;
    static const int lanes[] = {4, 8, 16};
    int ran = 1;  // the threads the region really had (OMP_THREAD_LIMIT or nesting can give fewer than asked)
    double t = now();
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        const int me = tl_omp_thread_num();
        if (me == 0) ran = tl_omp_num_threads();
        float s;
#if defined(__x86_64__)
        s = path == 2 ? chains_avx512(iters) : path == 1 ? chains_avx2(iters) : chains_portable(iters);
#else
        s = chains_portable(iters);
#endif
        g_sink[(me % 64) * 16] = s;
    }
    t = now() - t;
    return 2.0 * 12 * lanes[path] * (double)iters * ran / t / 1e9;
}

float tl_peak_read(const float *src, long n, int threads) {
    float total = 0.0f;
#pragma omp parallel num_threads(threads > 0 ? threads : 1) reduction(+ : total)
    {
        const long t = tl_omp_thread_num(), nt = tl_omp_num_threads();
        const long i0 = n * t / nt, i1 = n * (t + 1) / nt;
        // Eight partial sums, so the adds' latency does not bound the loop below what memory delivers; gcc
        // vectorises each with the baseline ISA's 16-byte loads, which stream as fast as wider ones from memory.
        float s[8] = {0};
        long i = i0;
        for (; i + 8 <= i1; i += 8)
            for (int k = 0; k < 8; k++) s[k] += src[i + k];
        for (; i < i1; i++) s[0] += src[i];
        total += s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
    }
    return total;
}
