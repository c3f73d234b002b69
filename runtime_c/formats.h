/*
Element formats the matrix kernels read besides float32, and the scalar conversions every path shares. Private
to runtime_c (build.py's PRIVATE_HEADERS): the cffi interface is sgemm.h's and qmatmul.h's.

    float16   IEEE binary16, stored as its 16 bits.
    bfloat16  the high half of a float32's bits (tinyllm/dtype.py): widening is a 16-bit shift.
    q8        int8 weights, one float16 scale per `group` consecutive k: w = q * scale.
    q4        two int4 per byte, one float16 scale per group of k: in each group, byte j (j < group / 2) holds
              element j in its low nibble and element j + group / 2 in its high nibble, each stored as q + 8;
              w = (nibble - 8) * scale. Split that way, 8 consecutive bytes widen into two runs of 8 consecutive
              k (one per nibble) with no shuffle.

Narrowing float32 to float16 or bfloat16 rounds to nearest, ties to even, as NumPy, torch and dtype.encode do.
*/
#ifndef TINYLLM_FORMATS_H
#define TINYLLM_FORMATS_H

#include <stdint.h>
#include <string.h>

enum { TL_F32, TL_F16, TL_BF16, TL_Q8, TL_Q4 };

static inline uint32_t tl_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float tl_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float tl_bf16_to_f32(uint16_t h) { return tl_bits_f32((uint32_t)h << 16); }

static inline float tl_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    if (exp == 0x1F) return tl_bits_f32(sign | 0x7F800000 | man << 13);  // inf, NaN (payload kept)
    if (exp != 0) return tl_bits_f32(sign | (exp + 112) << 23 | man << 13);  // rebias 15 -> 127
    // zero or subnormal: man * 2^-24, exact in float32
    return tl_bits_f32(sign | tl_f32_bits((float)man * 0x1p-24f));
}

static inline uint16_t tl_f32_to_bf16(float f) {
    const uint32_t u = tl_f32_bits(f);
    if ((u & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)(u >> 16 | 0x40);  // NaN stays a (quiet) NaN
    // + 0x7FFF + the lowest kept bit carries into the kept half when the dropped half is over one half, or is
    // exactly one half and the kept half is odd
    return (uint16_t)((u + 0x7FFF + (u >> 16 & 1)) >> 16);
}

static inline uint16_t tl_f32_to_f16(float f) {
    uint32_t u = tl_f32_bits(f);
    const uint16_t sign = (uint16_t)(u >> 16 & 0x8000);
    u &= 0x7FFFFFFF;
    if (u > 0x7F800000) return sign | 0x7E00 | (u >> 13 & 0x3FF);  // NaN: quiet
    if (u >= 0x477FF000) return sign | 0x7C00;                      // 65520 and up round to inf
    if (u < 0x38800000) {
        // below 2^-14, float16's subnormals (multiples of 2^-24): adding 0.5, whose float32 ulp is 2^-24, rounds
        // to one of them to nearest even in hardware, and the sum's low bits count them (1024: the smallest
        // normal, which is also its float16 bit pattern)
        return sign | (uint16_t)(tl_f32_bits(tl_bits_f32(u) + 0.5f) - 0x3F000000);
    }
    // rebias the exponent (127 -> 15: - 112 << 23) and round the 13 dropped bits as tl_f32_to_bf16 does;
    // a carry out of the mantissa steps the exponent up, as it should
    return sign | (uint16_t)((u + 0xC8000FFF + (u >> 13 & 1)) >> 13);
}

// 1 when this CPU has F16C (the AVX2 paths' float16 conversions; every AVX2 CPU has it, but CPUID says so).
static inline int tl_has_f16c(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();  // needed when called before libgcc's own constructor has run
    return __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

// The float32 value of a 16-bit float of format fmt (TL_F16 or TL_BF16).
static inline float tl_half_to_f32(int fmt, uint16_t h) { return fmt == TL_F16 ? tl_f16_to_f32(h) : tl_bf16_to_f32(h); }
static inline uint16_t tl_f32_to_half(int fmt, float f) { return fmt == TL_F16 ? tl_f32_to_f16(f) : tl_f32_to_bf16(f); }

// Element (j, k) of a quantized weight (TL_Q8 or TL_Q4) stored N x K: row j of q is ldq bytes apart, of the
// scales lds values apart.
static inline float tl_dequant(int fmt, const void *q, long ldq, const uint16_t *scales, long lds, long group,
                               long j, long k) {
    const long g = k / group, t = k % group;
    const float s = tl_f16_to_f32(scales[j * lds + g]);
    if (fmt == TL_Q8) return (float)((const int8_t *)q)[j * ldq + k] * s;
    const long half = group / 2;
    const uint8_t b = ((const uint8_t *)q)[j * ldq + g * half + (t < half ? t : t - half)];
    return (float)((t < half ? b & 15 : b >> 4) - 8) * s;
}

// The sgemm (sgemm_formats.c) with a quantized op(B) = W^T, W stored N x K as above: C[M, N] = X[M, K] W^T, X row-major
// float32 (row stride ldx), C row-major float32 (ldc); dequantized while packing B, on at most nt threads.
__attribute__((visibility("hidden"))) void tl_gemm_quantized(int fmt, long M, long N, long K, long group,
                                                             const float *x, long ldx, const void *q, long ldq,
                                                             const uint16_t *scales, long lds, float *C, long ldc,
                                                             int nt);

// Rows of 16-bit floats of format fmt (sgemm_formats.c, with AVX2 where the CPU has it): tl_widen_half widens n at
// src into float32 at dst; tl_round_half rounds M rows of N float32 sums (row-major) into c (row stride ldc), on at
// most nt threads, to nearest even with the bits of tl_f32_to_f16 / tl_f32_to_bf16.
__attribute__((visibility("hidden"))) void tl_widen_half(int fmt, const uint16_t *src, long n, float *dst);
__attribute__((visibility("hidden"))) void tl_round_half(int fmt, long M, long N, const float *sums, uint16_t *c,
                                                         long ldc, int nt);

// Threads the sgemm's entry points use (tl_set_num_threads).
__attribute__((visibility("hidden"))) int tl_gemm_threads(void);

#endif  // TINYLLM_FORMATS_H
