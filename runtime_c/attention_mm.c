/*
The products of attention.c: C[M x N] (+)= A B with A read through its strides (plain or transposed) and B
row-major, small (a tile of queries or keys by a head's width), on each path (attention.c's top comment).
*/
#include "attention_internal.h"

// ----------------------------------------------------------------------------
// Portable path.

// C[M x N] (+)= A B, A(m, k) = A[m*ars + k*acs], B(k, n) = B[k*ldb + n].
static void mm_portable(long M, long N, long K, const float *A, long ars, long acs,
                        const float *B, long ldb, float *C, long ldc, int accumulate) {
    for (long m = 0; m < M; m++) {
        float *c = C + m * ldc;
        if (!accumulate)
            for (long n = 0; n < N; n++) c[n] = 0.0f;
        for (long k = 0; k < K; k++) {
            const float a = A[m * ars + k * acs], *b = B + k * ldb;
            for (long n = 0; n < N; n++) c[n] += a * b[n];
        }
    }
}

// ----------------------------------------------------------------------------
// AVX2 + FMA path, compiled for that ISA function by function.

#if defined(__x86_64__)
#define AVX2 __attribute__((target("avx2,fma")))

// Rows [m, m+R) x columns [n, n+16) of C (+)= A B, R in 1..6: 2R accumulators, the B row and one broadcast A
// element fill 15 of the 16 ymm registers, enough independent FMAs to cover their latency.
// `full` (a constant at each call) picks plain loads; otherwise the masks cut the columns at the edge.
AVX2 static inline __attribute__((always_inline)) void
mm_block(int R, int full, long K, const float *A, long ars, long acs, const float *B, long ldb,
         float *C, long ldc, int accumulate, __m256i m0, __m256i m1) {
    __m256 c0[6], c1[6];
    for (int r = 0; r < R; r++) {
        if (accumulate) {
            c0[r] = full ? _mm256_loadu_ps(C + r * ldc) : _mm256_maskload_ps(C + r * ldc, m0);
            c1[r] = full ? _mm256_loadu_ps(C + r * ldc + 8) : _mm256_maskload_ps(C + r * ldc + 8, m1);
        } else {
            c0[r] = c1[r] = _mm256_setzero_ps();
        }
    }
    for (long k = 0; k < K; k++) {
        const float *b = B + k * ldb;
        __m256 b0 = full ? _mm256_loadu_ps(b) : _mm256_maskload_ps(b, m0);
        __m256 b1 = full ? _mm256_loadu_ps(b + 8) : _mm256_maskload_ps(b + 8, m1);
        for (int r = 0; r < R; r++) {
            __m256 a = _mm256_broadcast_ss(A + r * ars + k * acs);
            c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
            c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
        }
    }
    for (int r = 0; r < R; r++) {
        if (full) {
            _mm256_storeu_ps(C + r * ldc, c0[r]);
            _mm256_storeu_ps(C + r * ldc + 8, c1[r]);
        } else {
            _mm256_maskstore_ps(C + r * ldc, m0, c0[r]);
            _mm256_maskstore_ps(C + r * ldc + 8, m1, c1[r]);
        }
    }
}

// One 16-column strip of C, in blocks of 6 rows and one block for the rest; `full` is a literal at each call, so
// the inlined blocks are specialised for whole strips and for the masked last one.
AVX2 static inline __attribute__((always_inline)) void
mm_strip(int full, long M, long K, const float *A, long ars, long acs, const float *b, long ldb, float *C,
         long ldc, int accumulate, __m256i m0, __m256i m1) {
    long m = 0;
    for (; m + 6 <= M; m += 6)
        mm_block(6, full, K, A + m * ars, ars, acs, b, ldb, C + m * ldc, ldc, accumulate, m0, m1);
    switch (M - m) {  // the last rows, in one block
    case 5: mm_block(5, full, K, A + m * ars, ars, acs, b, ldb, C + m * ldc, ldc, accumulate, m0, m1); break;
    case 4: mm_block(4, full, K, A + m * ars, ars, acs, b, ldb, C + m * ldc, ldc, accumulate, m0, m1); break;
    case 3: mm_block(3, full, K, A + m * ars, ars, acs, b, ldb, C + m * ldc, ldc, accumulate, m0, m1); break;
    case 2: mm_block(2, full, K, A + m * ars, ars, acs, b, ldb, C + m * ldc, ldc, accumulate, m0, m1); break;
    case 1: mm_block(1, full, K, A + m * ars, ars, acs, b, ldb, C + m * ldc, ldc, accumulate, m0, m1); break;
    }
}

AVX2 static void mm_avx2(long M, long N, long K, const float *A, long ars, long acs,
                         const float *B, long ldb, float *C, long ldc, int accumulate) {
    for (long n = 0; n < N; n += 16) {
        const __m256i m0 = lanes(N - n), m1 = lanes(N - n - 8);
        if (N - n >= 16)
            mm_strip(1, M, K, A, ars, acs, B + n, ldb, C + n, ldc, accumulate, m0, m1);
        else
            mm_strip(0, M, K, A, ars, acs, B + n, ldb, C + n, ldc, accumulate, m0, m1);
    }
}
#endif

// ----------------------------------------------------------------------------
// AVX-512 path: the AVX2 path's algorithms on 16-float vectors, with mask registers at ragged edges (a masked load
// never faults past them, so no row may be read or written past its end).

#if defined(__x86_64__)
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma")))

// Rows [0, R) x V vectors of 16 columns of C (+)= A B, R in 1..6, V in 1..4: up to 24 accumulators and V B
// vectors within the 32 zmm registers; the A elements are broadcast from memory inside the FMAs. m[v] are the
// columns of vector v, all on but at the right edge; `full` (a literal at each call) says there is no edge, and
// the B rows are then read with plain loads (masked ones in the inner loop cost 10% on Zen 4). PAIRS (a literal):
// the operands are bfloat16 pairs along k (tl_attn_mm_pairs), each "element" 32 bits that vdpbf16ps multiplies as
// two products, exact in float32, added to the sums.
AVX512 static inline __attribute__((always_inline)) void
mm_block512(int R, int V, int full, int PAIRS, long K, const float *A, long ars, long acs, const float *B, long ldb,
            float *C, long ldc, int accumulate, const __mmask16 *m) {
    __m512 c[6][4];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < V; v++)
            c[r][v] = accumulate ? _mm512_maskz_loadu_ps(m[v], C + r * ldc + 16 * v) : _mm512_setzero_ps();
    for (long k = 0; k < K; k++) {
        __m512 b[4];
        for (int v = 0; v < V; v++)
            b[v] = full ? _mm512_loadu_ps(B + k * ldb + 16 * v) : _mm512_maskz_loadu_ps(m[v], B + k * ldb + 16 * v);
        for (int r = 0; r < R; r++) {
            const __m512 a = _mm512_set1_ps(A[r * ars + k * acs]);
            for (int v = 0; v < V; v++)
                c[r][v] = PAIRS ? _mm512_dpbf16_ps(c[r][v], (__m512bh)a, (__m512bh)b[v])
                                : _mm512_fmadd_ps(a, b[v], c[r][v]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < V; v++) _mm512_mask_storeu_ps(C + r * ldc + 16 * v, m[v], c[r][v]);
}

// One strip of V vectors of C, in blocks of 6 rows and one block for the rest (V, full and PAIRS literals).
AVX512 static inline __attribute__((always_inline)) void
mm_strip512(int V, int full, int PAIRS, long M, long K, const float *A, long ars, long acs, const float *b, long ldb,
            float *C, long ldc, int accumulate, const __mmask16 *mk) {
    long m = 0;
    for (; m + 6 <= M; m += 6)
        mm_block512(6, V, full, PAIRS, K, A + m * ars, ars, acs, b, ldb, C + m * ldc, ldc, accumulate, mk);
    const long r = M - m;  // the last rows, in one block
    const float *a = A + m * ars;
    float *c = C + m * ldc;
    switch (r) {
    case 5: mm_block512(5, V, full, PAIRS, K, a, ars, acs, b, ldb, c, ldc, accumulate, mk); break;
    case 4: mm_block512(4, V, full, PAIRS, K, a, ars, acs, b, ldb, c, ldc, accumulate, mk); break;
    case 3: mm_block512(3, V, full, PAIRS, K, a, ars, acs, b, ldb, c, ldc, accumulate, mk); break;
    case 2: mm_block512(2, V, full, PAIRS, K, a, ars, acs, b, ldb, c, ldc, accumulate, mk); break;
    case 1: mm_block512(1, V, full, PAIRS, K, a, ars, acs, b, ldb, c, ldc, accumulate, mk); break;
    }
}

// Strips of 64 columns (24 accumulators: 10 loads per 24 FMAs), the last one as narrow as its columns allow.
AVX512 static inline __attribute__((always_inline)) void
mm_avx512_body(int PAIRS, long M, long N, long K, const float *A, long ars, long acs, const float *B, long ldb,
               float *C, long ldc, int accumulate) {
    for (long n = 0; n < N; n += 64) {
        const long w = N - n;
        const __mmask16 mk[4] = {lanes16(w), lanes16(w - 16), lanes16(w - 32), lanes16(w - 48)};
        const float *b = B + n;
        float *c = C + n;
        const int v = w >= 64 ? 4 : (int)((w + 15) / 16), full = w >= 16 * v;  // full: no ragged edge
        switch (2 * v + full) {
        case 9: mm_strip512(4, 1, PAIRS, M, K, A, ars, acs, b, ldb, c, ldc, accumulate, mk); break;
        case 8: mm_strip512(4, 0, PAIRS, M, K, A, ars, acs, b, ldb, c, ldc, accumulate, mk); break;
        case 7: mm_strip512(3, 1, PAIRS, M, K, A, ars, acs, b, ldb, c, ldc, accumulate, mk); break;
        case 6: mm_strip512(3, 0, PAIRS, M, K, A, ars, acs, b, ldb, c, ldc, accumulate, mk); break;
        case 5: mm_strip512(2, 1, PAIRS, M, K, A, ars, acs, b, ldb, c, ldc, accumulate, mk); break;
        case 4: mm_strip512(2, 0, PAIRS, M, K, A, ars, acs, b, ldb, c, ldc, accumulate, mk); break;
        case 3: mm_strip512(1, 1, PAIRS, M, K, A, ars, acs, b, ldb, c, ldc, accumulate, mk); break;
        default: mm_strip512(1, 0, PAIRS, M, K, A, ars, acs, b, ldb, c, ldc, accumulate, mk); break;
        }
    }
}

AVX512 static void mm_avx512(long M, long N, long K, const float *A, long ars, long acs, const float *B, long ldb,
                             float *C, long ldc, int accumulate) {
    mm_avx512_body(0, M, N, K, A, ars, acs, B, ldb, C, ldc, accumulate);
}

AVX512 static void mm_pairs_avx512(long M, long N, long K, const float *A, long ars, long acs, const float *B,
                                   long ldb, float *C, long ldc, int accumulate) {
    mm_avx512_body(1, M, N, K, A, ars, acs, B, ldb, C, ldc, accumulate);
}

// Row i of P (n floats, row stride lds) rounded to bfloat16 into dst + i * ld, to nearest even, then zeros up to
// `width` (a multiple of 32): the A operand of tl_attn_mm_pairs, pairs along the row.
AVX512 void tl_attn_round_pairs(uint16_t *dst, long ld, const float *src, long lds, long rows, long n, long width) {
    for (long i = 0; i < rows; i++)
        for (long j = 0; j < width; j += 32) {
            const __m512 lo = _mm512_maskz_loadu_ps(lanes16(n - j), src + i * lds + j);
            const __m512 hi = _mm512_maskz_loadu_ps(lanes16(n - j - 16), src + i * lds + j + 16);
            _mm512_storeu_si512(dst + i * ld + j, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
}

// Rows 2i and 2i + 1 of src (bfloat16, d columns, row stride lds; n rows, a zero row past an odd n) interleaved
// into dst + i * ld: the 32-bit pair (src[2i][c], src[2i + 1][c]) at column c, the B operand of tl_attn_mm_pairs.
AVX512 void tl_attn_pack_pairs(uint32_t *dst, long ld, const uint16_t *src, long lds, long n, long d) {
    const __m512i lo = _mm512_setr_epi32(0 | 32 << 16, 1 | 33 << 16, 2 | 34 << 16, 3 | 35 << 16, 4 | 36 << 16,
                                         5 | 37 << 16, 6 | 38 << 16, 7 | 39 << 16, 8 | 40 << 16, 9 | 41 << 16,
                                         10 | 42 << 16, 11 | 43 << 16, 12 | 44 << 16, 13 | 45 << 16, 14 | 46 << 16,
                                         15 | 47 << 16);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    for (long i = 0; 2 * i < n; i++) {
        const uint16_t *r0 = src + 2 * i * lds, *r1 = r0 + lds;
        for (long c = 0; c < d; c += 32) {
            const __mmask32 m = (__mmask32)(d - c >= 32 ? 0xFFFFFFFFu : (1u << (d - c)) - 1);
            const __m512i a = _mm512_maskz_loadu_epi16(m, r0 + c);
            const __m512i b = 2 * i + 1 < n ? _mm512_maskz_loadu_epi16(m, r1 + c) : _mm512_setzero_si512();
            _mm512_mask_storeu_epi32(dst + i * ld + c, lanes16(d - c), _mm512_permutex2var_epi16(a, lo, b));
            _mm512_mask_storeu_epi32(dst + i * ld + c + 16, lanes16(d - c - 16), _mm512_permutex2var_epi16(a, hi, b));
        }
    }
}
#endif

// ----------------------------------------------------------------------------
// Dispatch on tl_cpu_path(): PATH_AVX512 takes the AVX-512 functions, PATH_AVX2 the AVX2 ones, else portable C.

void tl_attn_mm(int path, long M, long N, long K, const float *A, long ars, long acs,
                const float *B, long ldb, float *C, long ldc, int accumulate) {
    if (M <= 0 || N <= 0) return;
#if defined(__x86_64__)
    if (path == PATH_PAIRS) {
        mm_pairs_avx512(M, N, K, A, ars, acs, B, ldb, C, ldc, accumulate);
        return;
    }
    if (path >= PATH_AVX512) {
        mm_avx512(M, N, K, A, ars, acs, B, ldb, C, ldc, accumulate);
        return;
    }
    if (path == PATH_AVX2) {
        mm_avx2(M, N, K, A, ars, acs, B, ldb, C, ldc, accumulate);
        return;
    }
#endif
    mm_portable(M, N, K, A, ars, acs, B, ldb, C, ldc, accumulate);
}
