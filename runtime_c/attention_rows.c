/*
The row functions of attention.c, on each path (portable C, AVX2 + FMA, AVX-512; the dispatchers at the end pick
by tl_cpu_path()): a score row scaled and its maximum, exp of a row minus its maximum and the sum, the softmax
gradient of a row, a dot product, and the transpose of a tile. Each works on one row (or tile) of at most a tile's
width, so attention.c calls them once per row.
*/
#include <math.h>

#include "attention_internal.h"
#include "common.h"

// ----------------------------------------------------------------------------
// Portable path.

// p[j] *= scale for j < n, and the largest result (-inf when n == 0).
static float scale_max_portable(float *p, long n, float scale) {
    float mx = -INFINITY;
    for (long j = 0; j < n; j++) {
        p[j] *= scale;
        mx = p[j] > mx ? p[j] : mx;
    }
    return mx;
}

// p[j] = exp(p[j] - shift) for j < n and 0 for n <= j < bc, and the sum of the results.
static float exp_sum_portable(float *p, long n, long bc, float shift) {
    float sum = 0.0f;
    for (long j = 0; j < n; j++) {
        p[j] = expf(p[j] - shift);
        sum += p[j];
    }
    for (long j = n; j < bc; j++) p[j] = 0.0f;
    return sum;
}

// The sum of a[j] * b[j] for j < n.
static float dot_portable(const float *a, const float *b, long n) {
    float acc = 0.0f;
    for (long j = 0; j < n; j++) acc += a[j] * b[j];
    return acc;
}

// One row of the backward's tile, scores s (overwritten by P) and dP (overwritten by dS), bc keys of which the
// first n are seen: P = e^(s * scale - lse), dS = P o (dP - dl) * scale; both 0 past n.
static void softmax_grad_row_portable(float *s, float *dp, long n, long bc, float scale, float lse, float dl) {
    for (long j = 0; j < n; j++) {
        s[j] = expf(s[j] * scale - lse);
        dp[j] = s[j] * (dp[j] - dl) * scale;
    }
    for (long j = n; j < bc; j++) s[j] = dp[j] = 0.0f;
}

// ----------------------------------------------------------------------------
// AVX2 + FMA path, compiled for that ISA function by function.

#if defined(__x86_64__)
#define AVX2 __attribute__((target("avx2,fma")))

// e^x for x <= ~0 (softmax arguments): Cephes' polynomial on x - n ln 2, times 2^n; 0 below -87 (and for -inf).
AVX2 static inline __m256 exp_avx2(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f);
    __m256 xc = _mm256_max_ps(x, lo);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
    return _mm256_andnot_ps(_mm256_cmp_ps(x, lo, _CMP_LT_OQ), y);
}

AVX2 static float hmax(__m256 v) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

AVX2 static float hsum(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

// The AVX2 row functions read and write whole vectors: a tile's rows are BC wide (a multiple of 8), so a last
// vector that runs past n (or bc) stays inside its row, and its lanes past n hold nothing that is read.
AVX2 static float scale_max_avx2(float *p, long n, float scale) {
    const __m256 s = _mm256_set1_ps(scale), lo = _mm256_set1_ps(-INFINITY);
    __m256 mx = lo;
    long j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 y = _mm256_mul_ps(_mm256_loadu_ps(p + j), s);
        _mm256_storeu_ps(p + j, y);
        mx = _mm256_max_ps(mx, y);
    }
    if (j < n) {  // the last, partial vector: its lanes past n take no part in the max
        __m256 y = _mm256_mul_ps(_mm256_loadu_ps(p + j), s);
        _mm256_storeu_ps(p + j, y);
        mx = _mm256_max_ps(mx, _mm256_blendv_ps(lo, y, _mm256_castsi256_ps(lanes(n - j))));
    }
    return hmax(mx);
}

AVX2 static float exp_sum_avx2(float *p, long n, long bc, float shift) {
    const __m256 s = _mm256_set1_ps(shift);
    __m256 acc = _mm256_setzero_ps();
    long j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 y = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(p + j), s));
        _mm256_storeu_ps(p + j, y);
        acc = _mm256_add_ps(acc, y);
    }
    if (j < n) {  // the last, partial vector: 0 past n
        __m256 y = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(p + j), s));
        y = _mm256_and_ps(y, _mm256_castsi256_ps(lanes(n - j)));
        _mm256_storeu_ps(p + j, y);
        acc = _mm256_add_ps(acc, y);
        j += 8;
    }
    for (; j < bc; j += 8) _mm256_storeu_ps(p + j, _mm256_setzero_ps());
    return hsum(acc);
}

AVX2 static float dot_avx2(const float *a, const float *b, long n) {
    __m256 acc = _mm256_setzero_ps();
    long j = 0;
    for (; j + 8 <= n; j += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), acc);
    if (j < n) {
        __m256i m = lanes(n - j);
        acc = _mm256_fmadd_ps(_mm256_maskload_ps(a + j, m), _mm256_maskload_ps(b + j, m), acc);
    }
    return hsum(acc);
}

AVX2 static inline __attribute__((always_inline)) void
softmax_grad_vec(float *s, float *dp, __m256 sc, __m256 l, __m256 d, __m256 on) {
    const __m256 p = _mm256_and_ps(exp_avx2(_mm256_fmsub_ps(_mm256_loadu_ps(s), sc, l)), on);
    const __m256 ds = _mm256_mul_ps(_mm256_mul_ps(p, _mm256_sub_ps(_mm256_loadu_ps(dp), d)), sc);
    _mm256_storeu_ps(s, p);
    _mm256_storeu_ps(dp, _mm256_and_ps(ds, on));
}

AVX2 static void softmax_grad_row_avx2(float *s, float *dp, long n, long bc, float scale, float lse, float dl) {
    const __m256 sc = _mm256_set1_ps(scale), l = _mm256_set1_ps(lse), d = _mm256_set1_ps(dl);
    const __m256 all = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
    long j = 0;
    for (; j + 8 <= n; j += 8) softmax_grad_vec(s + j, dp + j, sc, l, d, all);
    if (j < n) {  // the last, partial vector (the tile's rows are BC wide, so it stays inside its row): 0 past n
        softmax_grad_vec(s + j, dp + j, sc, l, d, _mm256_castsi256_ps(lanes(n - j)));
        j += 8;
    }
    for (; j < bc; j += 8) {  // keys the row does not see (half of them under a causal mask): no exp to take
        _mm256_storeu_ps(s + j, _mm256_setzero_ps());
        _mm256_storeu_ps(dp + j, _mm256_setzero_ps());
    }
}
// The 8 x 8 blocks of transpose() (n and d multiples of 8): unpack pairs of rows, shuffle quadruples, swap halves.
AVX2 static void transpose_blocks_avx2(float *dst, long ld, const float *src, long lds, long n, long d) {
    for (long i = 0; i < n; i += 8) {
        for (long j = 0; j < d; j += 8) {
            __m256 r[8], t[8];
            for (int k = 0; k < 8; k++) r[k] = _mm256_loadu_ps(src + (i + k) * lds + j);
            for (int k = 0; k < 8; k += 2) {
                t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
                t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
            }
            for (int k = 0; k < 8; k += 4) {
                r[k] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
                r[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
                r[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
                r[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
            }
            for (int k = 0; k < 4; k++) {
                _mm256_storeu_ps(dst + (j + k) * ld + i, _mm256_permute2f128_ps(r[k], r[k + 4], 0x20));
                _mm256_storeu_ps(dst + (j + k + 4) * ld + i, _mm256_permute2f128_ps(r[k], r[k + 4], 0x31));
            }
        }
    }
}
#endif

// ----------------------------------------------------------------------------
// AVX-512 path: the AVX2 path's algorithms on 16-float vectors, with mask registers at ragged edges (a masked load
// never faults past them, so no row may be read or written past its end).

#if defined(__x86_64__)
#define AVX512 __attribute__((target("avx512f,avx2,fma")))

// exp_avx2's arithmetic on 16 lanes (the same results).
AVX512 static inline __m512 exp_avx512(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.0f);
    __m512 xc = _mm512_max_ps(x, lo);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_NLT_UQ), y);  // 0 below -87
}

AVX512 static float scale_max_avx512(float *p, long n, float scale) {
    const __m512 s = _mm512_set1_ps(scale);
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (long j = 0; j < n; j += 16) {  // lanes past n take no part
        const __mmask16 on = lanes16(n - j);
        const __m512 y = _mm512_mul_ps(_mm512_maskz_loadu_ps(on, p + j), s);
        _mm512_mask_storeu_ps(p + j, on, y);
        mx = _mm512_mask_max_ps(mx, on, mx, y);
    }
    return _mm512_reduce_max_ps(mx);
}

AVX512 static float exp_sum_avx512(float *p, long n, long bc, float shift) {
    const __m512 s = _mm512_set1_ps(shift);
    __m512 acc = _mm512_setzero_ps();
    for (long j = 0; j < bc; j += 16) {  // 0 past n
        const __mmask16 on = lanes16(n - j);
        const __m512 y = on ? _mm512_maskz_mov_ps(on, exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(on, p + j), s)))
                            : _mm512_setzero_ps();
        _mm512_mask_storeu_ps(p + j, lanes16(bc - j), y);
        acc = _mm512_add_ps(acc, y);
    }
    return _mm512_reduce_add_ps(acc);
}

AVX512 static float dot_avx512(const float *a, const float *b, long n) {
    __m512 acc = _mm512_setzero_ps();
    for (long j = 0; j < n; j += 16) {
        const __mmask16 on = lanes16(n - j);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(on, a + j), _mm512_maskz_loadu_ps(on, b + j), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

AVX512 static void softmax_grad_row_avx512(float *s, float *dp, long n, long bc, float scale, float lse, float dl) {
    const __m512 sc = _mm512_set1_ps(scale), l = _mm512_set1_ps(lse), d = _mm512_set1_ps(dl);
    for (long j = 0; j < bc; j += 16) {  // 0 past n; no exp to take where the row sees none of a vector's keys
        const __mmask16 on = lanes16(n - j), row = lanes16(bc - j);
        __m512 p = _mm512_setzero_ps(), ds = _mm512_setzero_ps();
        if (on) {
            p = _mm512_maskz_mov_ps(on, exp_avx512(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(on, s + j), sc, l)));
            ds = _mm512_mul_ps(_mm512_mul_ps(p, _mm512_sub_ps(_mm512_maskz_loadu_ps(on, dp + j), d)), sc);
        }
        _mm512_mask_storeu_ps(s + j, row, p);
        _mm512_mask_storeu_ps(dp + j, row, ds);
    }
}

// The 16 x 16 blocks of transpose() (n and d multiples of 16): 4 x 4 transposes within each 128-bit lane, as the
// AVX2 path's first two steps, then the lanes moved into place in two rounds of 128-bit shuffles.
AVX512 static void transpose_blocks_avx512(float *dst, long ld, const float *src, long lds, long n, long d) {
    for (long i = 0; i < n; i += 16) {
        for (long j = 0; j < d; j += 16) {
            __m512 r[16], t[16];
            for (int k = 0; k < 16; k++) r[k] = _mm512_loadu_ps(src + (i + k) * lds + j);
            for (int k = 0; k < 16; k += 2) {
                t[k] = _mm512_unpacklo_ps(r[k], r[k + 1]);
                t[k + 1] = _mm512_unpackhi_ps(r[k], r[k + 1]);
            }
            // lane L of r[4g + c]: column 4L + c of rows 4g .. 4g + 3
            for (int k = 0; k < 16; k += 4) {
                r[k] = _mm512_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(1, 0, 1, 0));
                r[k + 1] = _mm512_shuffle_ps(t[k], t[k + 2], _MM_SHUFFLE(3, 2, 3, 2));
                r[k + 2] = _mm512_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(1, 0, 1, 0));
                r[k + 3] = _mm512_shuffle_ps(t[k + 1], t[k + 3], _MM_SHUFFLE(3, 2, 3, 2));
            }
            // output row 4L + c gathers lane L of r[c], r[4 + c], r[8 + c], r[12 + c]
            for (int c = 0; c < 4; c++) {
                t[c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x44);           // lanes 0, 1 of each
                t[4 + c] = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xEE);       // lanes 2, 3
                t[8 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x44);
                t[12 + c] = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xEE);
            }
            for (int c = 0; c < 4; c++) {
                _mm512_storeu_ps(dst + (j + c) * ld + i, _mm512_shuffle_f32x4(t[c], t[8 + c], 0x88));
                _mm512_storeu_ps(dst + (j + 4 + c) * ld + i, _mm512_shuffle_f32x4(t[c], t[8 + c], 0xDD));
                _mm512_storeu_ps(dst + (j + 8 + c) * ld + i, _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0x88));
                _mm512_storeu_ps(dst + (j + 12 + c) * ld + i, _mm512_shuffle_f32x4(t[4 + c], t[12 + c], 0xDD));
            }
        }
    }
}
#endif

// ----------------------------------------------------------------------------
// Dispatch on tl_cpu_path(): PATH_AVX512 takes the AVX-512 functions, PATH_AVX2 the AVX2 ones, else portable C.

float tl_attn_scale_max(int path, float *p, long n, float scale) {
#if defined(__x86_64__)
    if (path >= PATH_AVX512) return scale_max_avx512(p, n, scale);
    if (path == PATH_AVX2) return scale_max_avx2(p, n, scale);
#endif
    return scale_max_portable(p, n, scale);
}

float tl_attn_exp_sum(int path, float *p, long n, long bc, float shift) {
#if defined(__x86_64__)
    if (path >= PATH_AVX512) return exp_sum_avx512(p, n, bc, shift);
    if (path == PATH_AVX2) return exp_sum_avx2(p, n, bc, shift);
#endif
    return exp_sum_portable(p, n, bc, shift);
}

float tl_attn_dot(int path, const float *a, const float *b, long n) {
#if defined(__x86_64__)
    if (path >= PATH_AVX512) return dot_avx512(a, b, n);
    if (path == PATH_AVX2) return dot_avx2(a, b, n);
#endif
    return dot_portable(a, b, n);
}

void tl_attn_softmax_grad_row(int path, float *s, float *dp, long n, long bc, float scale, float lse, float dl) {
#if defined(__x86_64__)
    if (path >= PATH_AVX512) {
        softmax_grad_row_avx512(s, dp, n, bc, scale, lse, dl);
        return;
    }
    if (path == PATH_AVX2) {
        softmax_grad_row_avx2(s, dp, n, bc, scale, lse, dl);
        return;
    }
#endif
    softmax_grad_row_portable(s, dp, n, bc, scale, lse, dl);
}

// dst[j*ld + i] = src[i*lds + j]: rows [0, n) x columns [0, d) of src, transposed; the vector paths move whole
// 16 x 16 (AVX-512) or 8 x 8 (AVX2) blocks through registers and the ragged edges one element at a time.
void tl_attn_transpose(int path, float *dst, long ld, const float *src, long lds, long n, long d) {
    long nb = 0, db = 0;
#if defined(__x86_64__)
    if (path >= PATH_AVX512) {
        nb = n / 16 * 16;
        db = d / 16 * 16;
        transpose_blocks_avx512(dst, ld, src, lds, nb, db);
    } else if (path == PATH_AVX2) {
        nb = n / 8 * 8;
        db = d / 8 * 8;
        transpose_blocks_avx2(dst, ld, src, lds, nb, db);
    }
#endif
    for (long i = 0; i < n; i++)
        for (long j = i < nb ? db : 0; j < d; j++) dst[j * ld + i] = src[i * lds + j];
}
