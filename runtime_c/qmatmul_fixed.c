/*
QMATMUL's weight-only GEMV on AVX512_VNNI, int8 and int4 weights (qmatmul.c hands it M <= GEMV_M rows of finite x
where tl_cpu_int8_dot() and the group is a multiple of 32): float32 activations against the stored bytes, the
products on vpdpbusd's byte products rather than on each weight widened to float32, which bounds the float kernels
(bench/qgemv.py: "arithmetic").

Each group G of a row of x becomes fixed point, block floating point as a float32 significand is wide:

    x_t = X_t 2^(e_G - B),   X_t = rint(x_t 2^(B - e_G)),   max_G |x| < 2^e_G,   so |X_t| <= 2^B,

B = 22 for int4 and 21 for int8 (QFIX_BITS), written as three balanced base-256 digits X = 2^16 h + 2^8 m + l, each a
signed byte (|h| <= 64). A 32-bit lane of vpdpbusd holds 4 bytes of W as unsigned bytes n: int4's 8 weights of one
group as stored (nibbles n = w + 8), int8's 4 (n = w + 128, the sign bit flipped). Over a lane, digit by digit with
shifts between,

    S = ((sum n h) 2^8 + sum n m) 2^8 + sum n l = sum n X      (int32, modulo 2^32),

and S - o sum X (o = 8 or 128: the lane's offset, taken once per call for all of W's rows) = sum w X, exact: |.| <=
8 x 8 x 2^22 = 2^28 (int4), 4 x 128 x 2^21 = 2^30 (int8, the reason for its B), so the wrap-around cancels. It is
rounded once to float32 and scaled by d_G 2^(e_G - B) (one product per 16 groups) into float32 totals.

The dynamic path's int8 activations (qmatmul_dynamic.c: x_t = s_G qx_t, |qx_t| <= 127) run on the same kernel with
one digit, qx itself, and the unit s_G for 2^(e_G - B) (tl_qgemv_fixed_prepare_int8): one vpdpbusd where three were.

What it costs in accuracy: X_t is x_t to within 2^(e_G - B - 1) <= 2^-B max_G |x|, where float32 holds x_t itself to
2^-24 |x_t|; after that the sums are exact but for one rounding per lane and the totals'. So y's error is at most
sum_G 2^-B max_G |x| sum_{t in G} |w_t| beyond the float kernels' own rounding: an activation far below its group's
largest keeps fewer bits (at 1/1000 of it, 11 or 12), still far more than the 8 that int8 activations keep (the
dynamic path, qmatmul_dynamic.c; llama.cpp's Q4_0 x Q8_0). The AVX2 kernel's own offset trick (qmatmul.c) errs by
eps 8 d_G sum_{t in G} |x_t|, of the same order. tests/test_quantization_fixed.py holds the kernel to its definition
and to that bound, with activations down to 2^-30 of their group's largest.

What it saves, per 64 bytes of W on 512-bit vectors: int4 (128 weights) 6 vpdpbusd, 2 shifts, 3 operations on the
nibbles and 4 to finish the lanes (offset, conversion, the lanes' scales, FMA), against the AVX2 kernel's 56 on
256-bit ones (8 widenings of bytes, 8 masks, 8 shifts, 16 conversions to float32, 16 FMAs); int8 (64 weights) 3
vpdpbusd, 2 shifts, 1 flip and the same 4, against 24 (8 widenings, 8 conversions, 8 FMAs). What is left is mostly
loads: a block's digits of x (6 vectors for int4, 3 for int8) and its lanes' offsets, where W's own bytes are one.
So a step takes several rows of W (QFIX_ROWS_FOR(M): 4 for one row of x, 2 for more) and loads x's digits once for
them; each output is still summed in one order (even and odd blocks into two totals, then added), so y does not
depend on how rows are grouped or split between threads. From memory the loop has little slack, so each block asks
for a line ahead (as qmatmul_dynamic.c does): the hardware prefetchers stop at each 4 KiB page, and the rows of W are
short. It asks for the same block of the row whole steps on, at least QFIX_AHEAD bytes of W on, into L2: the
product's read order is then the order the lines are asked for. Each step also asks for the scales of the rows as
far on: they are a second stream (int4: 48 bytes a row beside W's 384 at K = 768), which the prefetchers lose at each
page as well. Measured in bench/RESULTS.md (bench/qgemv.py).
*/

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "cpu.h"
#include "formats.h"
#include "qmatmul_internal.h"

#define QFIX_BLOCK 64                              // bytes of a row of W per step: 16 lanes
#define QFIX_BITS(fmt) ((fmt) == TL_Q8 ? 21 : 22)  // B: the fixed point's bits below each group's top
// a digit's bytes per block: int8 its 64 weights' activations, int4 the 64 low nibbles' then the 64 high ones'
#define QFIX_PLANE(fmt) ((fmt) == TL_Q8 ? 64 : 128)
#define QFIX_AHEAD 8192                            // bytes of W ahead, at least, that each block asks for
#define QFIX_ROWS 4                                // the most rows of W a step takes
#define QFIX_ROWS_FOR(M) ((M) == 1 ? 4 : 2)        // rows of W a step takes for M rows of x

struct qgemv_fixed {
    int bits;                   // QFIX_BITS (weight-only)
    int digits;                 // x's digits: 3 (weight-only), 1 (int8 activations, tl_qgemv_fixed_prepare_int8)
    long blocks, tail;          // blocks of a row of W, and the bytes of its last one
    long groups16;              // a row of x's groups, rounded up to 16 (the stride of unit)
    long per16;                 // blocks per 16 groups: whole blocks, as the group is a multiple of 32
    int8_t *digit;              // row i of x, block b: its planes (h, m, l; or the one) at
                                // digit + (i*blocks + b) * digits * QFIX_PLANE
    int32_t *offset;            // [(i*blocks + b)*16 + lane]: o sum X over the lane's weights
    float *unit;                // [i*groups16 + G]: 2^(e_G - B) (or s_G) of row i's group G (0 past the last)
    int32_t *lane_group;        // [r*16 + lane]: the lane's group among the 16 of block r of a run of per16
};

#if defined(__x86_64__)
#include <immintrin.h>
#define QFIX_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

// 2^p as a float32, for p in [-126, 127]
static inline float pow2(int p) {
    const uint32_t bits = (uint32_t)(p + 127) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

// The lanes of 16 from index c that lie before `end` (none when c >= end)
static inline __mmask16 lanes_before(long c, long end) {
    return c + 16 <= end ? 0xFFFF : c < end ? (__mmask16)((1u << (end - c)) - 1) : 0;
}

// Row i's group G as whole numbers X into the digits' planes and the lanes' offsets: weight-only's fixed point, x's
// columns times `up` rounded (x given; those from k on zero), or the int8 activations qx as they are (qx given: row
// i's, zero past k). The group's bytes of W (span: group for int8, group / 2 for int4) 16 at a time: int8's
// activations c0 + t.., int4's low nibbles' c0 + t.. and high nibbles' c0 + span + t.., at the same byte positions
// of their planes.
QFIX_TARGET static void store_group(const qgemv_args *v, qgemv_fixed *f, int i, long G, const float *x, float up,
                                    const int8_t *qx) {
    const int q8 = v->fmt == TL_Q8, offset = q8 ? 128 : 8;  // n = w + offset (the module's comment)
    const long group = v->group, span = q8 ? group : group / 2, plane = QFIX_PLANE(v->fmt), c0 = G * group;
    const __m512i bias = _mm512_set1_epi32(128), byte = _mm512_set1_epi32(255);
    const __m512 vup = _mm512_set1_ps(up);
    for (long t = 0; t < span; t += 16) {
        const long byte0 = G * span + t, b = byte0 / QFIX_BLOCK, at = byte0 % QFIX_BLOCK;  // 16 bytes: one block
        int8_t *planes = f->digit + (i * f->blocks + b) * f->digits * plane + at;
        __m512i sum = _mm512_setzero_si512();
        for (int high = 0; high < 2 - q8; high++) {
            const long c = c0 + t + high * span;
            __m512i X;
            if (x)  // (rounded to nearest)
                X = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(lanes_before(c, v->k), x + c), vup));
            else
                X = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(qx + c)));
            sum = _mm512_add_epi32(sum, X);
            for (int d = f->digits - 1; d >= 0; d--) {  // l, m, then h: balanced digits, X = 2^8 X' + digit
                const __m512i digit = _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(X, bias), byte), bias);
                _mm_storeu_si128((__m128i *)(planes + d * plane + high * 64), _mm512_cvtepi32_epi8(digit));
                X = _mm512_srai_epi32(_mm512_sub_epi32(X, digit), 8);
            }
        }
        // the sums of 4 neighbours (a lane's bytes), one in each 4, times the offset, to the 4 lanes at `at`
        sum = _mm512_add_epi32(sum, _mm512_shuffle_epi32(sum, _MM_PERM_CDAB));
        sum = _mm512_add_epi32(sum, _mm512_shuffle_epi32(sum, _MM_PERM_BADC));
        sum = _mm512_maskz_compress_epi32(0x1111, _mm512_mullo_epi32(sum, _mm512_set1_epi32(offset)));
        _mm_storeu_si128((__m128i *)(f->offset + (i * f->blocks + b) * 16 + at / 4), _mm512_castsi512_si128(sum));
    }
}

// Row i's group G (columns [c0, c0 + group) of x, those from k on zero) as weight-only's fixed point: its digits,
// its lanes' offsets and its unit. Returns 0 when the group holds inf or NaN.
QFIX_TARGET static int prepare_group(const qgemv_args *v, qgemv_fixed *f, int i, long G) {
    const long group = v->group, c0 = G * group;
    const float *x = v->x + i * v->ldx;
    const __m512 sign = _mm512_set1_ps(-0.0f), inf = _mm512_set1_ps(INFINITY);
    __m512 amax = _mm512_setzero_ps();
    __mmask16 bad = 0;
    for (long t = 0; t < group; t += 16) {
        const long c = c0 + t;
        const __m512 a = _mm512_andnot_ps(sign, _mm512_maskz_loadu_ps(lanes_before(c, v->k), x + c));
        bad |= _mm512_cmp_ps_mask(a, inf, _CMP_NLT_UQ);  // inf, or NaN (unordered)
        amax = _mm512_max_ps(amax, a);
    }
    if (bad) return 0;
    const float top = _mm512_reduce_max_ps(amax);
    uint32_t bits;
    memcpy(&bits, &top, sizeof bits);
    int e = top > 0 ? (int)(bits >> 23) - 126 : 0;  // top < 2^e, as frexpf's (a subnormal's -126 is clamped next)
    e = e < -100 ? -100 : e;                         // 2^(e - B) stays a normal float32
    store_group(v, f, i, G, x, pow2(f->bits - e), NULL);
    f->unit[i * f->groups16 + G] = pow2(e - f->bits);
    return 1;
}

// The memory for v's rows of x as `digits` planes, its tables filled, zeros where no group writes
static qgemv_fixed *fixed_alloc(const qgemv_args *v, int digits) {
    const int q8 = v->fmt == TL_Q8;
    const long kp = tl_round_up(v->k, v->group), groups = kp / v->group, groups16 = tl_round_up(groups, 16);
    const long span = q8 ? v->group : v->group / 2, row_bytes = groups * span;
    const long blocks = (row_bytes + QFIX_BLOCK - 1) / QFIX_BLOCK, rows = (long)v->m * blocks;
    const long per16 = 16 * span / QFIX_BLOCK, block_digits = digits * QFIX_PLANE(v->fmt);
    // one allocation: the digits, the lanes' offsets, the units, the block table
    const size_t head = tl_round_up(sizeof(qgemv_fixed), 64), planes = (size_t)rows * block_digits,
                 lanes = (size_t)rows * 16 * sizeof(int32_t), units = (size_t)v->m * groups16 * sizeof(float),
                 tables = (size_t)per16 * 16 * sizeof(int32_t);
    const size_t bytes = tl_round_up((long)(head + planes + lanes + units + tables), 64);
    qgemv_fixed *f = (qgemv_fixed *)aligned_alloc(64, bytes);  // the digits' loads each within one cache line
    if (f == NULL) tl_oom(bytes);
    f->bits = QFIX_BITS(v->fmt);
    f->digits = digits;
    f->blocks = blocks;
    f->tail = row_bytes - (blocks - 1) * QFIX_BLOCK;
    f->groups16 = groups16;
    f->digit = (int8_t *)f + head;
    f->offset = (int32_t *)(void *)(f->digit + planes);
    f->unit = (float *)(f->offset + rows * 16);
    f->lane_group = (int32_t *)(f->unit + v->m * groups16);
    f->per16 = per16;
    for (long r = 0; r < per16; r++)
        for (int l = 0; l < 16; l++) f->lane_group[r * 16 + l] = (int32_t)((r * QFIX_BLOCK + 4 * l) / span);
    for (int i = 0; i < v->m; i++) {
        const long last = i * blocks + blocks - 1;
        memset(f->digit + last * block_digits, 0, (size_t)block_digits);
        memset(f->offset + last * 16, 0, 16 * sizeof(int32_t));
        memset(f->unit + i * groups16 + groups, 0, (size_t)(groups16 - groups) * sizeof(float));
    }
    return f;
}
#endif  // __x86_64__

qgemv_fixed *tl_qgemv_fixed_prepare(const qgemv_args *v) {
#if defined(__x86_64__)
    if (!tl_cpu_int8_dot() || v->group % 32) return NULL;
    qgemv_fixed *f = fixed_alloc(v, 3);
    const long groups = tl_round_up(v->k, v->group) / v->group;
    for (int i = 0; i < v->m; i++)
        for (long G = 0; G < groups; G++)
            if (!prepare_group(v, f, i, G)) {
                free(f);
                return NULL;
            }
    return f;
#else
    (void)v;
    return NULL;
#endif
}

qgemv_fixed *tl_qgemv_fixed_prepare_int8(const qgemv_args *v, const int8_t *qx, const float *sx) {
#if defined(__x86_64__)
    if (!tl_cpu_int8_dot() || v->group % 32) return NULL;
    const long kp = tl_round_up(v->k, v->group), groups = kp / v->group;
    for (long r = 0; r < v->m * groups; r++)
        if (isnan(sx[r])) return NULL;  // (a group with inf or NaN: its outputs are NaN, as the other kernels give)
    qgemv_fixed *f = fixed_alloc(v, 1);
    for (int i = 0; i < v->m; i++)
        for (long G = 0; G < groups; G++) {
            store_group(v, f, i, G, NULL, 0.0f, qx + i * kp);
            f->unit[i * f->groups16 + G] = sx[i * groups + G];
        }
    return f;
#else
    (void)v, (void)qx, (void)sx;
    return NULL;
#endif
}

void tl_qgemv_fixed_free(qgemv_fixed *f) { free(f); }

#if defined(__x86_64__)
// Block b of R rows of W (bytes from p[r] + b * QFIX_BLOCK, the last block's `tail` only), block r16 of its 16 groups',
// for M rows of x: each row's bytes as unsigned (int4: the low and the high nibbles, two vectors), then per row of x,
// its D digits loaded once for the R rows, the lanes' sums digit by digit (the module's S), less the offsets, in
// float32 times the lanes' d_G 2^(e_G - B) (du[i*R + r], 16 groups' of x's row i and W's row r) into tot[i*R + r].
QFIX_TARGET static inline __attribute__((always_inline)) void
block_fixed(const int M, const int R, const int F, const int D, const qgemv_fixed *f, const uint8_t *const *p,
            const __m512 *du, long b, long r16, long ahead, __mmask64 last, __m512 *tot) {
    __m512i n0[QFIX_ROWS], n1[QFIX_ROWS];
    for (int r = 0; r < R; r++) {
        const uint8_t *w8 = p[r] + b * QFIX_BLOCK;
        __builtin_prefetch((const char *)w8 + ahead, 0, 2);  // (W from memory, into L2)
        const __m512i w = b + 1 < f->blocks ? _mm512_loadu_si512(w8) : _mm512_maskz_loadu_epi8(last, w8);
        if (F == TL_Q8) {
            n0[r] = _mm512_xor_si512(w, _mm512_set1_epi8(-128));  // w + 128
        } else {
            const __m512i low = _mm512_set1_epi8(15);
            n0[r] = _mm512_and_si512(w, low);
            n1[r] = _mm512_and_si512(_mm512_srli_epi16(w, 4), low);
        }
    }
    const __m512i group = _mm512_loadu_si512(f->lane_group + r16 * 16);
    for (int i = 0; i < M; i++) {
        const long at = i * f->blocks + b;
        const int8_t *x = f->digit + at * D * QFIX_PLANE(F);
        __m512i x0[3], x1[3];
        for (int digit = 0; digit < D; digit++) {
            x0[digit] = _mm512_loadu_si512(x + digit * QFIX_PLANE(F));
            if (F == TL_Q4) x1[digit] = _mm512_loadu_si512(x + digit * QFIX_PLANE(F) + 64);
        }
        const __m512i offset = _mm512_loadu_si512(f->offset + at * 16);
        for (int r = 0; r < R; r++) {
            __m512i s = _mm512_setzero_si512();
            for (int digit = 0; digit < D; digit++) {
                if (digit) s = _mm512_slli_epi32(s, 8);
                s = _mm512_dpbusd_epi32(s, n0[r], x0[digit]);
                if (F == TL_Q4) s = _mm512_dpbusd_epi32(s, n1[r], x1[digit]);
            }
            const __m512 sum = _mm512_cvtepi32_ps(_mm512_sub_epi32(s, offset));
            tot[i * R + r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(group, du[i * R + r]), sum, tot[i * R + r]);
        }
    }
}

// Outputs [j0, j0 + R) for M rows of x (qgemv_args.fixed): each row's scales widened 16 at a time and times each row
// of x's units (16 groups are whole blocks, as the group is a multiple of 32), then the blocks they cover, even and
// odd ones into separate totals (two chains of FMA latency, and one order of sums for every R).
QFIX_TARGET static inline __attribute__((always_inline)) void
rows_fixed(const int M, const int R, const int F, const int D, const qgemv_args *v, long j0) {
    const qgemv_fixed *f = v->fixed;
    const long groups = tl_round_up(v->k, v->group) / v->group, blocks = f->blocks, per16 = f->per16;
    const __mmask64 last = f->tail == QFIX_BLOCK ? ~(__mmask64)0 : (((__mmask64)1 << f->tail) - 1);
    const uint8_t *p[QFIX_ROWS];
    // the same block of a row whole steps of R rows on, at least QFIX_AHEAD bytes of W on
    const long ahead = tl_round_up(QFIX_AHEAD, R * v->ldq);
    __m512 even[GEMV_M * QFIX_ROWS], odd[GEMV_M * QFIX_ROWS], du[GEMV_M * QFIX_ROWS];
    for (int r = 0; r < R; r++) p[r] = v->q + (j0 + r) * v->ldq;
    // the scales of the rows as many rows on as W's own lines are asked for (ahead is whole steps of R rows)
    const char *scales_ahead = (const char *)(v->s + (j0 + ahead / v->ldq) * v->lds);
    const long scale_bytes = R * v->lds * (long)sizeof(uint16_t);
    for (long c = 0; c < scale_bytes; c += 64) __builtin_prefetch(scales_ahead + c, 0, 2);
    __builtin_prefetch(scales_ahead + scale_bytes - 1, 0, 2);  // (the last line, wherever the first starts)
    for (int t = 0; t < M * R; t++) even[t] = odd[t] = _mm512_setzero_ps();
    for (long b0 = 0, G = 0; b0 < blocks; b0 += per16, G += 16) {
        for (int r = 0; r < R; r++) {
            const uint16_t *scales = v->s + (j0 + r) * v->lds + G;
            const __m512 s16 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes_before(G, groups), scales));
            for (int i = 0; i < M; i++)
                du[i * R + r] = _mm512_mul_ps(s16, _mm512_loadu_ps(f->unit + i * f->groups16 + G));
        }
        const long b1 = tl_min(blocks, b0 + per16);
        long b = b0;
        for (; b + 2 <= b1; b += 2) {
            block_fixed(M, R, F, D, f, p, du, b, b - b0, ahead, last, even);
            block_fixed(M, R, F, D, f, p, du, b + 1, b + 1 - b0, ahead, last, odd);
        }
        if (b < b1) block_fixed(M, R, F, D, f, p, du, b, b - b0, ahead, last, even);
    }
    for (int i = 0; i < M; i++)
        for (int r = 0; r < R; r++)
            v->y[i * v->ldy + j0 + r] = _mm512_reduce_add_ps(_mm512_add_ps(even[i * R + r], odd[i * R + r]));
}

// Outputs [j0, j1): QFIX_ROWS_FOR(M) rows of W at a time, x's digits loaded once for them, then the rest one by one.
// D, x's digits, comes in QGEMV_BY_M's group slot (the block tables take any group).
QFIX_TARGET static inline __attribute__((always_inline)) void
qgemv_fixed_m(const int M, const int F, const int D, const qgemv_args *v, long j0, long j1) {
    const int R = QFIX_ROWS_FOR(M);
    long j = j0;
    for (; j + R <= j1; j += R) rows_fixed(M, R, F, D, v, j);
    for (; j < j1; j++) rows_fixed(M, 1, F, D, v, j);
}

QFIX_TARGET void tl_qgemv_fixed(const qgemv_args *v, long j0, long j1) {
    const int one = v->fixed->digits == 1;
    if (v->fmt == TL_Q8 && one) QGEMV_BY_M(qgemv_fixed_m, TL_Q8, 1, v, j0, j1);
    else if (v->fmt == TL_Q8) QGEMV_BY_M(qgemv_fixed_m, TL_Q8, 3, v, j0, j1);
    else if (one) QGEMV_BY_M(qgemv_fixed_m, TL_Q4, 1, v, j0, j1);
    else QGEMV_BY_M(qgemv_fixed_m, TL_Q4, 3, v, j0, j1);
}
#else
void tl_qgemv_fixed(const qgemv_args *v, long j0, long j1) { (void)v, (void)j0, (void)j1; }
#endif  // __x86_64__
