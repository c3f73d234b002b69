/*
Vectorisable float math for generated kernels. libm's expf/tanhf are scalar calls that stop gcc from
vectorising a loop (glibc's vector versions need -ffast-math, which would break NaN and signed-zero
semantics), so exp and tanh are written here with arithmetic and selects only (Cephes' polynomials, within
about 2 ulp), keeping IEEE special values: exp(-inf) = 0, exp(+inf) = inf, NaN stays NaN. The polynomials use
explicit fused multiply-adds where the CPU has them (TL_FMA): half the instructions of a multiply and an add, and
the same rounding in every kernel (kernels are compiled with -ffp-contract=off: the compiler fuses nothing itself).
tanh takes its e^{2|x|} from the same reduction and polynomial as tl_expf, without the clamps and special values
that its range never reaches: the same bits as before (checked on every 7th float32 bit pattern) for a quarter
less time in GELU's kernels.
*/
#ifndef TL_C_MATH_H
#define TL_C_MATH_H
#include <stdint.h>
#include <string.h>

#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define TL_FMA(a, b, c) __builtin_fmaf(a, b, c)
#else  /* no fused instruction (fmaf would be a slow library call): a multiply and an add, alike in every kernel */
#define TL_FMA(a, b, c) ((a) * (b) + (c))
#endif

static inline float tl_pow2i(int32_t k) {  /* 2^k for -126 <= k <= 127 */
    uint32_t bits = (uint32_t)(k + 127) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* e^x = 2^n · e^r, n = round(x / ln 2), r = x - n ln 2 (ln 2 split in two for exactness): returns e^r, sets *n */
static inline float tl_exp_reduced(float x, float *n) {
    *n = __builtin_rintf(x * 1.44269504088896341f);
    float r = TL_FMA(*n, 2.12194440e-4f, TL_FMA(*n, -0.693359375f, x));
    float p = 1.9875691500e-4f;
    p = TL_FMA(p, r, 1.3981999507e-3f);
    p = TL_FMA(p, r, 8.3334519073e-3f);
    p = TL_FMA(p, r, 4.1665795894e-2f);
    p = TL_FMA(p, r, 1.6666665459e-1f);
    p = TL_FMA(p, r, 5.0000001201e-1f);
    return TL_FMA(p * r, r, r + 1.0f);
}

static inline float tl_expf(float x) {
    float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
    float n, p = tl_exp_reduced(xc, &n);
    int32_t k = (int32_t)n, k1 = k / 2;  /* two factors keep each power of two a normal number */
    float y = p * tl_pow2i(k1) * tl_pow2i(k - k1);
    y = x > 88.7228394f ? __builtin_inff() : y;
    y = x < -103.972084f ? 0.0f : y;
    return x != x ? x : y;
}

static inline float tl_tanhf(float x) {
    /* small |x|: x + x·z·P(z) with z = x² (no cancellation); else 1 - 2 / (e^{2|x|} + 1), with x's sign */
    float a = x < 0 ? -x : x;
    float z = x * x;
    float p = -5.70498872745e-3f;
    p = TL_FMA(p, z, 2.06390887954e-2f);
    p = TL_FMA(p, z, -5.37397155531e-2f);
    p = TL_FMA(p, z, 1.33314422036e-1f);
    p = TL_FMA(p, z, -3.33332819422e-1f);
    float small = x * TL_FMA(z, p, 1.0f);  /* x times a factor near 1: tanh(-0) = -0 */
    /* e^{2a} as tl_expf computes it (the same bits), for 2a in [0, 18] where 2^n is one normal factor and no
       special value arises; above 9 the result is 1 anyway, and a NaN propagates through the arithmetic */
    float a9 = a > 9.0f ? 9.0f : a, n, e = tl_exp_reduced(a9 + a9, &n);
    float big = 1.0f - 2.0f / (e * tl_pow2i((int32_t)n) + 1.0f);
    big = a > 9.0f ? 1.0f : big;
    big = x < 0 ? -big : big;
    return a < 0.625f ? small : big;  /* NaN: a < 0.625 is false and big is NaN */
}
#endif
