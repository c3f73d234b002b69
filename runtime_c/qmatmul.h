/*
QMATMUL: out[M, N] = x[M, K] W^T for a weight W (N x K) quantized in groups of `group` consecutive k, one float16
scale per group (runtime_c/formats.h gives the layouts):

    q8: q int8, N rows of K (row j at q + j*K): W(j, k) = q[j, k] * scales[j, k / group]
    q4: q uint8, N rows of K/2 bytes, two int4 per byte (formats.h): W(j, k) = (nibble - 8) * scales[j, k / group]

x is float32, row i at x + i*ldx; out is float32, row i at out + i*ldo; scales are N rows of K / group, stored
as float16 bits. group must be even for q4 (the caller checks). K need not be a multiple of group: W is then
stored padded to Kp = ceil(K / group) * group columns (tinyllm/ops/qmatmul.py), so the rows above are Kp, Kp / 2
bytes and Kp / group scales long, and only the first K columns are read (x has K). The sums are float32, taken
group by group and scaled once per group: the float32 product with the dequantized W up to the order of
summation.

M <= 4 (decoding) runs as a GEMV that streams W once, widening it to float32 in registers; more rows run as the
sgemm (sgemm_formats.c's tl_gemm_quantized), which dequantizes W while packing its B panels.

tl_qmatmul_dynamic computes the same product with x quantized to int8 at run time, per row and group (one
float32 scale each, max |x| / 127, rounded to nearest even): the group sums are then exact int32 dot products of
bytes (AVX512_VNNI's vpdpbusd where the CPU has it, else AVX2's vpmaddubsw) scaled by both scales
(qmatmul_dynamic.c).

This header is also the cffi cdef: keep it to plain declarations (lines starting with '#' are dropped by
runtime_c/build.py).
*/
#ifndef TINYLLM_QMATMUL_H
#define TINYLLM_QMATMUL_H

#include <stdint.h>

void tl_qmatmul_q8(int M, int N, int K, int group, const float *x, long ldx, const int8_t *q,
                   const uint16_t *scales, float *out, long ldo);

void tl_qmatmul_q4(int M, int N, int K, int group, const float *x, long ldx, const uint8_t *q,
                   const uint16_t *scales, float *out, long ldo);

// bits: 8 (q8) or 4 (q4)
void tl_qmatmul_dynamic(int bits, int M, int N, int K, int group, const float *x, long ldx, const void *q,
                        const uint16_t *scales, float *out, long ldo);

#endif  // TINYLLM_QMATMUL_H
