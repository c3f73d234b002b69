/*
What one core's AVX2 FMA units give an sgemm micro-kernel, with every operand in L1 (no packing, no cache misses):

    gcc -O2 -mavx2 -mfma bench/kernel_ceiling.c -o /tmp/kernel_ceiling && taskset -c 1 /tmp/kernel_ceiling

    fma peak   12 accumulators, 12 FMAs and 2 vector loads per step, the multiplier held in registers: the most
               FMAs the core retires (not a product: no new element of A per step); 2 FMAs a cycle on Zen 4, so
               this over 32 flops is the clock
    6x16       the outer-product kernel of runtime_c/sgemm.c's avx2 path (and OpenBLAS's and BLIS's Haswell
               kernels): per step 2 loads of B, 6 broadcasts of A, 12 FMAs
    4x24       the other shape that fits 12 accumulators in 16 ymm registers: 3 loads, 4 broadcasts, 12 FMAs
    3x32       3 broadcasts, 4 loads of B (16 registers plus one: the compiler reloads what it spills)

Each prints GFLOP/s, best of 20 runs of 4000 passes over one A strip and one B strip of KC = 192 steps (at most
24 + 2.3 KiB: both stay in a 32 KiB L1).
*/
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define KC 192
#define PASSES 4000
#define FMA(c, a, b) c = _mm256_fmadd_ps(a, b, c)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// Twelve accumulators as named variables (gcc keeps an array of them in memory), stored at the end as `rows` rows.
#define ACCUMULATORS __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, \
                            s7 = s0, s8 = s0, s9 = s0, s10 = s0, s11 = s0
#define STORE(c, rows)                                                                                   \
    do {                                                                                                 \
        const __m256 acc_[12] = {s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, s10, s11};                      \
        for (int i = 0; i < 12; i++) _mm256_storeu_ps((c) + i / (12 / (rows)) * 32 + i % (12 / (rows)) * 8, acc_[i]); \
    } while (0)

__attribute__((noinline)) static void fma_peak(const float *a, const float *b, float *c) {
    // Each accumulator starts at its own value: twelve that start equal and add the same four products stay
    // equal, and gcc keeps one of each three (4 FMAs a step, timing their latency instead of the units' rate).
    __m256 x0 = _mm256_broadcast_ss(a), x1 = _mm256_broadcast_ss(a + 1);
    __m256 s0 = _mm256_set1_ps(0.f), s1 = _mm256_set1_ps(1.f), s2 = _mm256_set1_ps(2.f), s3 = _mm256_set1_ps(3.f),
           s4 = _mm256_set1_ps(4.f), s5 = _mm256_set1_ps(5.f), s6 = _mm256_set1_ps(6.f), s7 = _mm256_set1_ps(7.f),
           s8 = _mm256_set1_ps(8.f), s9 = _mm256_set1_ps(9.f), s10 = _mm256_set1_ps(10.f), s11 = _mm256_set1_ps(11.f);
    for (int p = 0; p < KC; p++, b += 16) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
        FMA(s0, x0, b0); FMA(s1, x0, b1); FMA(s2, x1, b0); FMA(s3, x1, b1);
        FMA(s4, x0, b0); FMA(s5, x0, b1); FMA(s6, x1, b0); FMA(s7, x1, b1);
        FMA(s8, x0, b0); FMA(s9, x0, b1); FMA(s10, x1, b0); FMA(s11, x1, b1);
    }
    STORE(c, 6);
}

__attribute__((noinline)) static void k6x16(const float *a, const float *b, float *c) {
    ACCUMULATORS;
    for (int p = 0; p < KC; p++, a += 6, b += 16) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8), x;
        x = _mm256_broadcast_ss(a); FMA(s0, x, b0); FMA(s1, x, b1);
        x = _mm256_broadcast_ss(a + 1); FMA(s2, x, b0); FMA(s3, x, b1);
        x = _mm256_broadcast_ss(a + 2); FMA(s4, x, b0); FMA(s5, x, b1);
        x = _mm256_broadcast_ss(a + 3); FMA(s6, x, b0); FMA(s7, x, b1);
        x = _mm256_broadcast_ss(a + 4); FMA(s8, x, b0); FMA(s9, x, b1);
        x = _mm256_broadcast_ss(a + 5); FMA(s10, x, b0); FMA(s11, x, b1);
    }
    STORE(c, 6);
}

__attribute__((noinline)) static void k4x24(const float *a, const float *b, float *c) {
    ACCUMULATORS;
    for (int p = 0; p < KC; p++, a += 4, b += 24) {
        __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8), b2 = _mm256_load_ps(b + 16), x;
        x = _mm256_broadcast_ss(a); FMA(s0, x, b0); FMA(s1, x, b1); FMA(s2, x, b2);
        x = _mm256_broadcast_ss(a + 1); FMA(s3, x, b0); FMA(s4, x, b1); FMA(s5, x, b2);
        x = _mm256_broadcast_ss(a + 2); FMA(s6, x, b0); FMA(s7, x, b1); FMA(s8, x, b2);
        x = _mm256_broadcast_ss(a + 3); FMA(s9, x, b0); FMA(s10, x, b1); FMA(s11, x, b2);
    }
    STORE(c, 4);
}

__attribute__((noinline)) static void k3x32(const float *a, const float *b, float *c) {
    ACCUMULATORS;
    for (int p = 0; p < KC; p++, a += 3, b += 32) {
        __m256 x0 = _mm256_broadcast_ss(a), x1 = _mm256_broadcast_ss(a + 1), x2 = _mm256_broadcast_ss(a + 2), bv;
        bv = _mm256_load_ps(b); FMA(s0, x0, bv); FMA(s4, x1, bv); FMA(s8, x2, bv);
        bv = _mm256_load_ps(b + 8); FMA(s1, x0, bv); FMA(s5, x1, bv); FMA(s9, x2, bv);
        bv = _mm256_load_ps(b + 16); FMA(s2, x0, bv); FMA(s6, x1, bv); FMA(s10, x2, bv);
        bv = _mm256_load_ps(b + 24); FMA(s3, x0, bv); FMA(s7, x1, bv); FMA(s11, x2, bv);
    }
    STORE(c, 3);
}

int main(void) {
    float *a = aligned_alloc(64, sizeof(float) * 6 * KC), *b = aligned_alloc(64, sizeof(float) * 32 * KC);
    float *c = aligned_alloc(64, sizeof(float) * 6 * 32);
    for (long i = 0; i < 6L * KC; i++) a[i] = 1e-3f * (float)(i % 7);
    for (long i = 0; i < 32L * KC; i++) b[i] = 1e-3f * (float)(i % 5);
    struct { const char *name; void (*fn)(const float *, const float *, float *); } k[] = {
        {"fma peak", fma_peak}, {"6x16", k6x16}, {"4x24", k4x24}, {"3x32", k3x32}};
    for (int f = 0; f < 4; f++) {
        double best = 1e30;
        for (int r = 0; r < 20; r++) {
            double t = now();
            for (int it = 0; it < PASSES; it++) k[f].fn(a, b, c);
            t = now() - t;
            best = t < best ? t : best;
        }
        printf("%-9s %6.1f GFLOP/s\n", k[f].name, 2.0 * 12 * 8 * KC * PASSES / best / 1e9);
    }
    free(a);
    free(b);
    free(c);
    return 0;
}
