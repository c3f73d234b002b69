/*
Vectorisable float math for generated kernels. libm's expf/tanhf are scalar calls that stop gcc from
vectorising a loop (glibc's vector versions need -ffast-math, which would break NaN and signed-zero
semantics), so exp, tanh and erf are written here with arithmetic and selects only, keeping IEEE special values:
exp(-inf) = 0, exp(+inf) = inf, tanh(+-inf) = +-1, NaN stays NaN. exp is Cephes' polynomial (within 2 ulp); tanh
is a rational function, within 5.2 ulp with fused multiply-adds and 6.1 without (every float32 checked): less
exact than a tanh built on exp's polynomial, but cheaper, and GELU's kernels cost mostly tanh (see
docs/design-history.md). The polynomials use explicit fused multiply-adds where the CPU path has them (TL_FMA:
avx2 and avx512, see compiler.ISA): half the instructions of a multiply and an add, and the same rounding in every
kernel (kernels are compiled with -ffp-contract=off: the compiler fuses nothing itself). gcc vectorises them at 16
lanes on the avx512 path and 8 on avx2, where exp's selects only if-convert with -fno-trapping-math (compiler.FLAGS);
the vector results equal the scalar ones bit for bit (every float32 checked for exp and tanh, both paths).
*/
#ifndef TL_C_MATH_H
#define TL_C_MATH_H
#include <stdint.h>

/* libm's functions that kernels call, declared here instead of by <math.h>: parsing math.h took a quarter of a
   small kernel's compile, and every test compiles thousands of them (gcc knows each as a builtin anyway). */
float expf(float); double exp(double); float logf(float); double log(double); float sqrtf(float);
double sqrt(double); float tanhf(float); double tanh(double); float erff(float); double erf(double);
float sinf(float); double sin(double); float atanf(float); double atan(double); float floorf(float);
double floor(double); float powf(float, float); double pow(double, double); float fmodf(float, float);
double fmod(double, double);
#define NAN __builtin_nanf("")
#define INFINITY __builtin_inff()

#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define TL_FMA(a, b, c) __builtin_fmaf(a, b, c)
#else  /* no fused instruction (fmaf would be a slow library call): a multiply and an add, alike in every kernel */
#define TL_FMA(a, b, c) ((a) * (b) + (c))
#endif

static inline float tl_pow2i(int32_t k) {  /* 2^k for -126 <= k <= 127 */
    uint32_t bits = (uint32_t)(k + 127) << 23;
    float f;
    __builtin_memcpy(&f, &bits, sizeof f);
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
    /* tanh x = x P(x^2) / Q(x^2): a (13, 6) rational with the least relative error on |x| <= 9 (a minimax fit by
       linear programming). Past |x| = 8.8125, where it gives exactly 1, tanh is 1 within an ulp: x^2 is capped
       there, which makes the quotient at least 1 in size, and the result is clamped to [-1, 1] (the fit also
       overshoots 1 by an ulp in places). So +-inf gives +-1 and NaN stays NaN (every comparison false); -0 gives
       -0. Clamping x itself instead of x^2 leads gcc to give the clamped lanes a second division. */
    float z = x * x;
    z = z > 77.66015625f ? 77.66015625f : z;  /* 8.8125^2 */
    float p = -0x1.4ac5e4p-44f;
    p = TL_FMA(p, z, 0x1.a53ccap-35f);
    p = TL_FMA(p, z, -0x1.48702ap-26f);
    p = TL_FMA(p, z, 0x1.6c744cp-17f);
    p = TL_FMA(p, z, 0x1.930410p-9f);
    p = TL_FMA(p, z, 0x1.0b6af8p-3f);
    p = TL_FMA(p, z, 1.0f);
    float q = 0x1.069a04p-12f;
    q = TL_FMA(q, z, 0x1.8f67d4p-6f);
    q = TL_FMA(q, z, 0x1.db0ac6p-2f);
    q = TL_FMA(q, z, 1.0f);
    float t = x * p / q;
    t = t > 1.0f ? 1.0f : t;
    return t < -1.0f ? -1.0f : t;
}
static inline float tl_erf_small(float x) {  /* erf x for |x| <= 0.927734375: x + x P(x^2) (see tl_erff) */
    float s = x * x, p = -5.987081095e-04f;
    p = TL_FMA(p, s, 4.992952105e-03f);
    p = TL_FMA(p, s, -2.676688507e-02f);
    p = TL_FMA(p, s, 1.128183827e-01f);
    p = TL_FMA(p, s, -3.761249781e-01f);
    p = TL_FMA(p, s, 1.283791512e-01f);
    return TL_FMA(p, x, x);
}
static inline float tl_erff(float x) {
    /* erf as two odd pieces, both computed and one selected, so gcc vectorises it (no branch, no libm call):
       |x| <= 0.927734375: x + x P(x^2), P of degree 5; beyond: 1 - exp(R(|x|)), R of degree 8 fitting
       log(erfc(t)), signed as x. The coefficients are near-minimax fits made for this file (Lawson's iteratively
       reweighted least squares against scipy's erf and erfc in float64: P within 1.7e-8 of erf(x)/x - 1, R within
       1.2e-8 of log erfc), rounded to float; tests/test_c_math.py measures the float result on each path (every
       509th float and a dense grid). |x| is capped at 4, where erf is 1 in float (1 - 1.5e-8), so the polynomial
       never meets inf and +-inf give +-1 exactly; NaN fails every comparison and stays NaN through the small piece;
       -0 gives -0. The exp is tl_exp_reduced's, unclamped: R stays in [-18, 0]. gcc vectorises it with exp's flags
       (avx2 and avx512; the portable path has no vector rint), and the vector results equal the scalar ones. */
    float t = __builtin_fabsf(x), small = tl_erf_small(x);
    float tc = t > 4.0f ? 4.0f : t;
    float r = 1.602487600e-06f;
    r = TL_FMA(r, tc, -4.535453263e-05f);
    r = TL_FMA(r, tc, 5.907148006e-04f);
    r = TL_FMA(r, tc, -4.730280023e-03f);
    r = TL_FMA(r, tc, 2.633553371e-02f);
    r = TL_FMA(r, tc, -1.099251732e-01f);
    r = TL_FMA(r, tc, -6.319953203e-01f);
    r = TL_FMA(r, tc, -1.130131483e+00f);
    r = TL_FMA(r, tc, 2.942740975e-04f);
    float n, e = tl_exp_reduced(r, &n);
    float big = __builtin_copysignf(1.0f - e * tl_pow2i((int32_t)n), x);
    return t > 0.927734375f ? big : small;
}
static inline float tl_erff_given(float x, float e) {
    /* erf x given e = tl_expf(-(x * x)), which GELU's backward computes for its derivative (render.py,
       _erf_given_exp): tl_erff's small piece; beyond 0.927734375, 1 - e S(u), u = 2 / (2 + |x|) with |x| capped at
       4, S of degree 7 fitting erfc(t) e^(t^2), the scaled erfc, smooth in u (a near-minimax fit made for this file
       as tl_erff's, within 7.8e-9 relative, rounded to float). It takes no exponential of its own: the kernel's
       backward 0.8x the time on avx512, 0.7x on avx2. Within 1.22 ulp of erf on avx2 and avx512 and 1.44 without
       fused multiply-adds (tests/test_c_math.py), where tl_erff is within 1.09 and 1.24: the two may differ in
       the last bit, as a forward's erf and its backward's may. +-inf give +-1 (e = 0), NaN stays NaN, -0 gives
       -0. */
    float t = __builtin_fabsf(x), small = tl_erf_small(x);
    float u = 2.0f / (2.0f + (t > 4.0f ? 4.0f : t));
    float scaled = 1.194204837e-01f;
    scaled = TL_FMA(scaled, u, -4.715037942e-01f);
    scaled = TL_FMA(scaled, u, 5.637924671e-01f);
    scaled = TL_FMA(scaled, u, -1.040922627e-01f);
    scaled = TL_FMA(scaled, u, 3.480576277e-01f);
    scaled = TL_FMA(scaled, u, 2.596093118e-01f);
    scaled = TL_FMA(scaled, u, 2.849254906e-01f);
    scaled = TL_FMA(scaled, u, -1.550759334e-04f);
    float big = __builtin_copysignf(1.0f - e * scaled, x);
    return t > 0.927734375f ? big : small;
}
/* x^p for int64, exact and wrapping as NumPy's and torch's (unsigned products wrap defined); a negative p gives
   the integer part of 1/x^p: 1 for x = 1, ±1 for x = -1, 0 otherwise */
static inline int64_t tl_ipow(int64_t x, int64_t p) {
  if (p < 0) return x == 1 ? 1 : x == -1 ? ((p & 1) ? -1 : 1) : 0;
  uint64_t r = 1, b = (uint64_t)x;
  while (p) {
    if (p & 1) r *= b;
    b *= b;
    p >>= 1;
  }
  return (int64_t)r;
}
/* trunc(x / z) for int64 that never traps: x / 0 gives x (as WGSL defines it; the front end refuses a zero
   divisor before a kernel runs) and INT64_MIN / -1 wraps to INT64_MIN (the negation done unsigned) */
static inline int64_t tl_idiv(int64_t x, int64_t z) {
  return z == 0 ? x : z == -1 ? (int64_t)(0 - (uint64_t)x) : x / z;
}

/* 16-bit floats (tinyllm.float16, tinyllm.bfloat16): stored as uint16_t, loaded to float, computed in float and
   rounded to nearest even when stored. bfloat16 is a float's high half: loading shifts it back; storing adds
   0x7FFF plus the lowest kept bit, which carries into the kept half exactly when the dropped half is above one
   half, or equal to it with the kept half odd (tinyllm/dtype.py's encode); a NaN keeps its high bits with the
   quiet bit set, so it never rounds to inf. float16 converts with integer and float arithmetic and selects only,
   on every path: the results equal F16C's vcvtph2ps / vcvtps2ph on every float16 and every float32 (NaNs quieted
   as F16C does), and the loops vectorise. F16C itself would not: gcc 12 turns a _Float16 conversion into one
   scalar vcvtph2ps, which keeps the whole loop scalar (an fp16 exp kernel ran 8.7x slower on Zen 4's AVX2 path). */
static inline float tl_f32_from_bits(uint32_t b) { float f; __builtin_memcpy(&f, &b, sizeof f); return f; }
static inline uint32_t tl_bits_of_f32(float f) { uint32_t b; __builtin_memcpy(&b, &f, sizeof b); return b; }

static inline float tl_bf16_load(uint16_t h) { return tl_f32_from_bits((uint32_t)h << 16); }
/* The rounding on the float's own bits, the NaN test on the float (x == x: the kernels are compiled without
   -ffinite-math-only): fewer vector instructions than testing the bits, and the same results for all 2^32 inputs
   (checked exhaustively against the bit test). */
static inline uint32_t tl_bf16_rounded_bits(float x) {
  uint32_t b = tl_bits_of_f32(x);
  return x == x ? (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u : (b & 0xFFFF0000u) | 0x400000u;
}
static inline uint16_t tl_bf16_store(float x) { return (uint16_t)(tl_bf16_rounded_bits(x) >> 16); }

static inline float tl_f16_load(uint16_t h) {
  /* |h| < 2^-14 (exponent field 0) is a multiple of 2^-24 below 1024 of them: exact as a float product.
     Otherwise the exponent is rebased from bias 15 to 127 (112 more), twice for inf and NaN (field 31 -> 255),
     and a NaN is made quiet, as F16C does. The sign goes back on last. */
  uint32_t em = h & 0x7FFFu;
  uint32_t bits = ((em << 13) + (112u << 23) + (em >= 0x7C00u ? 112u << 23 : 0u)) | (em > 0x7C00u ? 1u << 22 : 0u);
  float mag = em < 0x400u ? (float)(int32_t)em * 0x1p-24f : tl_f32_from_bits(bits);
  return tl_f32_from_bits(tl_bits_of_f32(mag) | ((uint32_t)(h & 0x8000u) << 16));
}
static inline uint16_t tl_f16_store(float x) {
  /* Normal results: rebase the exponent (112 less) and round the 13 dropped bits to nearest even as bfloat16
     does its 16; a carry out of the top reaches exponent 31 with a zero mantissa, inf. |x| >= 2^16 is inf.
     Below 2^-14 the result is a multiple of 2^-24: adding 0.5, whose ulp is 2^-24, lets the float adder round
     it to nearest even, and the sum's low bits are the half's (1024 of them rounds up to the smallest normal). */
  uint32_t b = tl_bits_of_f32(x), a = b & 0x7FFFFFFFu, n = a - (112u << 23);
  uint32_t normal = (n + 0xFFFu + ((n >> 13) & 1u)) >> 13;
  uint32_t tiny = tl_bits_of_f32(tl_f32_from_bits(a) + 0.5f) - tl_bits_of_f32(0.5f);
  uint32_t h = a > 0x7F800000u ? 0x7E00u | ((a >> 13) & 0x3FFu)
             : a >= 0x47800000u ? 0x7C00u : a < 0x38800000u ? tiny : normal;
  return (uint16_t)(h | ((b >> 16) & 0x8000u));
}
/* x rounded to the 16-bit float's precision, kept as a float: a CAST to float16 or bfloat16 inside a kernel */
static inline float tl_bf16_round(float x) { return tl_f32_from_bits(tl_bf16_rounded_bits(x)); }
static inline float tl_f16_round(float x) { return tl_f16_load(tl_f16_store(x)); }
#endif
