/*
Packed, cache-tiled, register-blocked sgemm (GotoBLAS / BLIS layout). Products with at most 4 rows or 4 columns
go to the GEMV in gemv.c instead.

    for jc in N by NC:                          B panel  KC x NC -> L3, shared by the threads
      for pc in K by KC:                        (one "round")
        pack B[pc:+KC, jc:+NC] into NR-wide strips (each thread packs a chunk)
        for ic in (this thread's rows) by MC:   A block  MC x KC -> L2, private
          pack A[ic:+MC, pc:+KC] into MR-tall strips (unless few B strips: see below)
          for jr in (this thread's strips) by NR:   B strip KC x NR -> L1
            for ir in MC by MR:
              micro-kernel: C[MR x NR] (+)= A strip . B strip, in registers

Packing reads op(A) and op(B) in whatever layout they have (plain or transposed), so the micro-kernel only ever
sees one contiguous layout, and the transposed products of the backward pass cost no copies in the caller. When
an A strip meets at most 16 B strips (N <= 16 NR), packing A costs more than it saves, so the paths with an
in-place kernel read its full strips through their strides instead; a product with few rows and many columns
runs as its transpose (as_transpose).

The kernels follow cpu.h's path (tl_cpu_path), each with its own micro-kernel shape (a gemm_plan):

    portable  6 x 16   plain C that the compiler vectorises for the baseline ISA.
    avx2      6 x 16   12 ymm accumulators + 2 for the B row + 1 broadcast = 15 of the 16 ymm registers; each
                       k step issues 12 FMAs against 2 loads and 6 broadcasts, enough independent FMAs to keep
                       both FMA pipes busy through their 4-cycle latency.
    avx512   14 x 32   28 zmm accumulators + 2 for the B row + 1 broadcast = 31 of the 32 zmm registers: the
                       most accumulators they hold, 28 FMAs against 2 loads and 14 broadcasts per k step, few
                       enough loads for two 512-bit FMAs a cycle.

The cache blocks (KC, MC, NC) come from the cache sizes the OS reports, per shape (plan_blocking).

Threads (OpenMP) split C into a grid: normally M (each thread packs its own A blocks and a chunk of the shared
B panel), N where that saves over 1/16 of the work (thread_grid). They hand the B panel over with per-thread
flags and two panel buffers instead of barriers, and in the last round a thread done with its rows takes over
units of another's (see gemm_thread). Batched products of small matrices run one matrix per thread instead. A
long sum over rows that both operands store (a weight gradient X^T dY, summed over the tokens) runs as two halves
of K instead, each on the thread that holds its rows, added at the end (split_k).

Other element formats (formats.h) take the same path with float32 micro-kernels: packing widens float16 and
bfloat16 operands (tl_gemm_f16_batched2, tl_gemm_bf16_batched2) and dequantizes a quantized B (qmatmul.c's
tl_gemm_quantized) into the float32 strips, 8 x 8 values at a time in registers on the AVX2 paths. 16-bit
products sum in a float32 scratch and round once into C; with M <= GEMV_M they run as gemv_half instead.
*/

#include "common.h"
#include "cpu.h"
#include "formats.h"
#include "gemv.h"
#include "sgemm.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// The portable and AVX2 micro-tile, and the AVX-512 one.
#define MR 6
#define NR 16
#define MR5 14
#define NR5 32
#define TILE_MAX (MR5 * NR5)  // the largest micro-tile, for kernel_edge's buffer
_Static_assert(MR <= 16 && MR5 <= 16, "pack_a_strip_rows_avx2 packs at most 16 rows");

// Below this many multiply-adds per thread, waking another thread and handing
// it the B panel cost more than the thread saves.
#ifndef TL_MIN_WORK_PER_THREAD
#define TL_MIN_WORK_PER_THREAD (64L * 64 * 64)
#endif
// A sum at least this long over rows both operands store is split in two halves of K (split_k).
#define SPLIT_K_MIN 512
// Threads per product at most: bounds the per-call flags on the stack.
#define TL_MAX_THREADS 256

enum { SLOT_A, SLOT_B, SLOT_T, SLOT_P };  // per-thread scratch slots (common.h)

// Micro-kernel: C[mr x nr] (row stride ldc) = a . b + beta * C, with the packed
// strips a[p*mr + i] and b[p*nr + j], p < kc; the in-place variants read A
// through its row stride lda instead. beta == 0 never reads C.
typedef void (*kernel_fn)(int kc, const float *a, long lda, const float *b, float beta, float *c, long ldc);

// One path's micro-kernel and cache blocks.
typedef struct {
    int mr, nr;            // micro-tile
    int kc, mc, nc;        // cache blocks (plan_blocking)
    kernel_fn packed;      // A strip packed
    kernel_fn rows, cols;  // A strip read in place from a row-major / transposed A; NULL: always packed
    int avx2_pack;         // the AVX2 packing routines may run
} gemm_plan;

typedef struct {
    int transA, transB;
    long M, N, K;
    const float *A;
    long lda;
    const float *B;
    long ldb;
    float beta;
    float *C;
    long ldc;
    const gemm_plan *p;
    // Element formats (formats.h) of A and B: float32 unless set. Where either is not, A and B are read only by
    // the packing routines, which widen to float32 (so the in-place kernels, the GEMV and the transposed or
    // split-K forms, which read them elsewhere, are off), and A, B point at the formats' own storage.
    int afmt, bfmt;
    const uint16_t *scales;  // a quantized B's: float16, row j of W at scales[j * lds]
    long lds, group;
} gemm_args;

// 1 when A and B are both float32.
static inline int plain_f32(const gemm_args *g) { return g->afmt == TL_F32 && g->bfmt == TL_F32; }

// Element i of a float32, float16 or bfloat16 array.
static inline float elem_at(int fmt, const float *base, long i) {
    return fmt == TL_F32 ? base[i] : tl_half_to_f32(fmt, ((const uint16_t *)base)[i]);
}

// op(A)(i, k) and op(B)(k, j) as float32, in any format (a quantized B is always transposed: W stored N x K).
static float a_at(const gemm_args *g, long i, long k) {
    return elem_at(g->afmt, g->A, g->transA ? k * g->lda + i : i * g->lda + k);
}

static float b_at(const gemm_args *g, long k, long j) {
    if (g->bfmt == TL_Q8 || g->bfmt == TL_Q4)
        return tl_dequant(g->bfmt, g->B, g->ldb, g->scales, g->lds, g->group, j, k);
    return elem_at(g->bfmt, g->B, g->transB ? j * g->ldb + k : k * g->ldb + j);
}

static int g_threads;    // threads for the next call

static int default_threads(void) {
    int n = tl_env_int("TINYLLM_THREADS", 0);
    return n > 0 ? n : tl_omp_num_procs();
}

__attribute__((constructor)) static void sgemm_init(void) {
    g_threads = default_threads();
}

void tl_set_num_threads(int n) { g_threads = n > 0 ? n : default_threads(); }
int tl_get_num_threads(void) { return g_threads; }
// The interface before cpu.h, kept for its callers.
int tl_cpu_has_avx2_fma(void) { return tl_cpu_supports(1); }
void tl_force_portable(int on) { tl_cpu_set_path(on ? 0 : -1); }
int tl_sgemm_uses_avx2(void) { return tl_cpu_path() >= 1; }

// ----------------------------------------------------------------------------
// Portable path: plain C with compile-time trip counts, which gcc and clang
// unroll and vectorise for the baseline ISA (SSE2 on x86-64, NEON on aarch64).

static void kernel_portable(int kc, const float *restrict a, long lda, const float *restrict b,
                            float beta, float *restrict c, long ldc) {
    (void)lda;  // always packed
    // One row of C at a time: its NR accumulators fit in vector registers and
    // the j loop is a plain vectorisable loop (a 2-D accumulator over all MR
    // rows gets spilled and mis-vectorised by gcc). The B strip is re-read per
    // row, from L1. Pointer increments rather than p*NR + j indexing keep the
    // loop vectorisable even under -fwrapv (Python's CFLAGS; build.py undoes it).
    for (int i = 0; i < MR; i++) {
        float acc[NR] = {0};
        const float *ap = a + i, *bp = b;
        for (int p = 0; p < kc; p++, ap += MR, bp += NR) {
            for (int j = 0; j < NR; j++) acc[j] += *ap * bp[j];
        }
        float *ci = c + i * ldc;
        for (int j = 0; j < NR; j++) ci[j] = beta == 0.0f ? acc[j] : acc[j] + beta * ci[j];
    }
}

// dst[0, n) = src[0, n): one run of a strip being packed. The strip sizes of the plans as compile-time sizes,
// which the compiler turns into a few vector moves; memcpy with a run-time size is a library call per run, and
// packing B for a 256 x 256 x 256 product on two threads spent 15 % of the product's time in those calls.
static inline void copy_run(float *dst, const float *src, int n) {
    switch (n) {
    case MR: memcpy(dst, src, MR * sizeof(float)); break;
    case MR5: memcpy(dst, src, MR5 * sizeof(float)); break;
    case NR: memcpy(dst, src, NR * sizeof(float)); break;
    case NR5: memcpy(dst, src, NR5 * sizeof(float)); break;
    default: memcpy(dst, src, (size_t)n * sizeof(float));
    }
}

// Packs rows [i0, i0+mr) x columns [k0, k0+kc) of op(A) as one strip of MR = g->p->mr rows: element
// (i0 + i, k0 + p) at out[p*MR + i]; rows past mr are zero, so the kernel can always compute a full tile.
// Full strips (the common case) copy contiguous runs (copy_run).
static void pack_a_strip(const gemm_args *g, long i0, long k0, int mr, int kc, float *out) {
    const int full = g->p->mr;
    if (g->afmt != TL_F32) {  // widened one element at a time
        for (int p = 0; p < kc; p++)
            for (int i = 0; i < full; i++) out[p * full + i] = i < mr ? a_at(g, i0 + i, k0 + p) : 0.0f;
    } else if (g->transA) {  // row k of the stored A holds op(A)'s column k: contiguous in i
        const float *src = g->A + k0 * g->lda + i0;
        if (mr == full) {
            for (int p = 0; p < kc; p++) copy_run(out + p * full, src + p * g->lda, full);
        } else {
            for (int p = 0; p < kc; p++) {
                for (int i = 0; i < full; i++) out[p * full + i] = i < mr ? src[p * g->lda + i] : 0.0f;
            }
        }
    } else {
        const float *src = g->A + i0 * g->lda + k0;
        for (int i = 0; i < full; i++) {
            if (i < mr) {
                for (int p = 0; p < kc; p++) out[p * full + i] = src[i * g->lda + p];
            } else {
                for (int p = 0; p < kc; p++) out[p * full + i] = 0.0f;
            }
        }
    }
}

// Packs rows [k0, k0+kc) x columns [j0, j0+nr) of op(B) as one strip NR = g->p->nr wide: element
// (k0 + p, j0 + j) at out[p*NR + j]; columns past nr are zero.
static void pack_b_strip(const gemm_args *g, long k0, long j0, int nr, int kc, float *out) {
    const int full = g->p->nr;
    if (g->bfmt != TL_F32) {  // widened (or dequantized) one element at a time
        for (int p = 0; p < kc; p++)
            for (int j = 0; j < full; j++) out[p * full + j] = j < nr ? b_at(g, k0 + p, j0 + j) : 0.0f;
    } else if (g->transB) {  // row j of the stored B holds op(B)'s column j: contiguous in k
        const float *src = g->B + j0 * g->ldb + k0;
        for (int j = 0; j < full; j++) {
            if (j < nr) {
                for (int p = 0; p < kc; p++) out[p * full + j] = src[j * g->ldb + p];
            } else {
                for (int p = 0; p < kc; p++) out[p * full + j] = 0.0f;
            }
        }
    } else {
        const float *src = g->B + k0 * g->ldb + j0;
        if (nr == full) {
            for (int p = 0; p < kc; p++) copy_run(out + p * full, src + p * g->ldb, full);
        } else {
            for (int p = 0; p < kc; p++) {
                for (int j = 0; j < full; j++) out[p * full + j] = j < nr ? src[p * g->ldb + j] : 0.0f;
            }
        }
    }
}

// ----------------------------------------------------------------------------
// AVX2 + FMA path. Compiled for that ISA function by function, so the rest of
// the file (and the portable path) keeps the baseline ISA.

#if defined(__x86_64__)
#define AVX2 __attribute__((target("avx2,fma")))

// The micro-kernel's body, with element (i, p) of the A strip at a[i*rs + p*ks]:
// packed (rs 1, ks MR), or read in place from a row-major A (rs lda, ks 1) or a
// transposed one (rs 1, ks lda). Reading A in place saves packing it, which
// costs about as much as the kernel's loads hide when A comes from L3.
AVX2 static inline __attribute__((always_inline)) void
kernel_avx2_body(int kc, const float *restrict a, long rs, long ks, const float *restrict b,
                 float beta, float *restrict c, long ldc) {
    const float *a0 = a, *a1 = a + rs, *a2 = a + 2 * rs, *a3 = a + 3 * rs, *a4 = a + 4 * rs, *a5 = a + 5 * rs;
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps();
    __m256 c10 = _mm256_setzero_ps(), c11 = _mm256_setzero_ps();
    __m256 c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps();
    __m256 c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps();
    __m256 c40 = _mm256_setzero_ps(), c41 = _mm256_setzero_ps();
    __m256 c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (long p = 0; p < kc * ks; p += ks) {
        __m256 b0 = _mm256_load_ps(b);
        __m256 b1 = _mm256_load_ps(b + 8);
        __m256 ai;
        ai = _mm256_broadcast_ss(a0 + p);
        c00 = _mm256_fmadd_ps(ai, b0, c00);
        c01 = _mm256_fmadd_ps(ai, b1, c01);
        ai = _mm256_broadcast_ss(a1 + p);
        c10 = _mm256_fmadd_ps(ai, b0, c10);
        c11 = _mm256_fmadd_ps(ai, b1, c11);
        ai = _mm256_broadcast_ss(a2 + p);
        c20 = _mm256_fmadd_ps(ai, b0, c20);
        c21 = _mm256_fmadd_ps(ai, b1, c21);
        ai = _mm256_broadcast_ss(a3 + p);
        c30 = _mm256_fmadd_ps(ai, b0, c30);
        c31 = _mm256_fmadd_ps(ai, b1, c31);
        ai = _mm256_broadcast_ss(a4 + p);
        c40 = _mm256_fmadd_ps(ai, b0, c40);
        c41 = _mm256_fmadd_ps(ai, b1, c41);
        ai = _mm256_broadcast_ss(a5 + p);
        c50 = _mm256_fmadd_ps(ai, b0, c50);
        c51 = _mm256_fmadd_ps(ai, b1, c51);
        b += NR;
    }
    __m256 acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    if (beta == 0.0f) {
        for (int i = 0; i < MR; i++) {
            _mm256_storeu_ps(c + i * ldc, acc[i][0]);
            _mm256_storeu_ps(c + i * ldc + 8, acc[i][1]);
        }
    } else {
        __m256 vb = _mm256_set1_ps(beta);
        for (int i = 0; i < MR; i++) {
            _mm256_storeu_ps(c + i * ldc, _mm256_fmadd_ps(vb, _mm256_loadu_ps(c + i * ldc), acc[i][0]));
            _mm256_storeu_ps(c + i * ldc + 8, _mm256_fmadd_ps(vb, _mm256_loadu_ps(c + i * ldc + 8), acc[i][1]));
        }
    }
}

AVX2 static void kernel_avx2(int kc, const float *a, long lda, const float *b, float beta, float *c, long ldc) {
    (void)lda;
    kernel_avx2_body(kc, a, 1, MR, b, beta, c, ldc);
}

AVX2 static void kernel_avx2_rows(int kc, const float *a, long lda, const float *b, float beta, float *c, long ldc) {
    kernel_avx2_body(kc, a, lda, 1, b, beta, c, ldc);
}

AVX2 static void kernel_avx2_cols(int kc, const float *a, long lda, const float *b, float beta, float *c, long ldc) {
    kernel_avx2_body(kc, a, 1, lda, b, beta, c, ldc);
}

// In-register transpose of an 8 x 8 block: r[i] lane j -> r[j] lane i.
AVX2 static inline void transpose8(__m256 r[8]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
    r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
    r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
    r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
    r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
    r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
    r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
    r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// The AVX2 packing routines, templates over the element format F (formats.h; a compile-time constant in each
// instance): load8 widens 8 consecutive elements, float16 with F16C (so these take its target too; every AVX2
// CPU has it, and packing checks: f16c_ok), bfloat16 with a 16-bit shift.
#define AVX2H __attribute__((target("avx2,fma,f16c")))

AVX2H static inline __attribute__((always_inline)) __m256 load8(const int F, const float *base, long i) {
    if (F == TL_F32) return _mm256_loadu_ps(base + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + i));
    if (F == TL_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// op(B)(k + l, j) for l < 8 of a transposed B (W stored N x K), any format. For a quantized one the 8 values
// share a scale and, for q4, one nibble of 8 consecutive bytes: k % 8 == 0 and group % 16 == 0 (pack_b).
AVX2H static inline __attribute__((always_inline)) __m256 load8_w(const int F, const gemm_args *g, long j, long k) {
    if (F != TL_Q8 && F != TL_Q4) return load8(F, g->B, j * g->ldb + k);
    const __m256 scale = _mm256_set1_ps(_cvtsh_ss(g->scales[j * g->lds + k / g->group]));
    const uint8_t *row = (const uint8_t *)g->B + j * g->ldb;
    if (F == TL_Q8) {
        const __m128i q = _mm_loadl_epi64((const __m128i *)(row + k));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), scale);
    }
    const long half = g->group / 2, t = k % g->group;
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(row + k / g->group * half + t % half)));
    const __m256i nib = t < half ? _mm256_and_si256(b, _mm256_set1_epi32(15)) : _mm256_srli_epi32(b, 4);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(nib, _mm256_set1_epi32(8))), scale);
}

// A full strip of mr <= 16 rows of a row-major (untransposed) A: the strided rows become one interleaved stream,
// 8 columns at a time, through one 8 x 8 transpose per group of 8 rows (rows past mr read as zeros). Stores
// go in address order, 8 lanes each: the junk past a strip row's mr values lands where the next store
// overwrites it, or, after the last one, in the following strip (packed later) or the buffer's slack.
AVX2H static inline __attribute__((always_inline)) void
pack_a_strip_rows_body(const int F, const float *src, long lda, int mr, int kc, float *out) {
    const int groups = (mr + 7) / 8;
    int p = 0;
    for (; p + 8 <= kc; p += 8) {
        __m256 r[2][8];
        for (int g = 0; g < groups; g++) {
            for (int i = 0; i < 8; i++)
                r[g][i] = 8 * g + i < mr ? load8(F, src, (8 * g + i) * lda + p) : _mm256_setzero_ps();
            transpose8(r[g]);
        }
        for (int q = 0; q < 8; q++)
            for (int g = 0; g < groups; g++) _mm256_storeu_ps(out + (p + q) * mr + 8 * g, r[g][q]);
    }
    for (; p < kc; p++) {
        for (int i = 0; i < mr; i++) out[p * mr + i] = elem_at(F, src, i * lda + p);
    }
}

// A full strip nr wide (a multiple of 8) of a transposed B (rows j0.. of the stored B, each contiguous in k),
// from k0 on, through nr / 8 transposes of 8 x 8 per 8 values of k.
AVX2H static inline __attribute__((always_inline)) void
pack_b_strip_cols_body(const int F, const gemm_args *g, long j0, long k0, int nr, int kc, float *out) {
    int p = 0;
    for (; p + 8 <= kc; p += 8) {
        for (int h = 0; h < nr; h += 8) {
            __m256 r[8];
            for (int j = 0; j < 8; j++) r[j] = load8_w(F, g, j0 + h + j, k0 + p);
            transpose8(r);
            for (int q = 0; q < 8; q++) _mm256_store_ps(out + (p + q) * nr + h, r[q]);
        }
    }
    for (; p < kc; p++) {
        for (int j = 0; j < nr; j++) out[p * nr + j] = b_at(g, k0 + p, j0 + j);
    }
}

// Rows [k0, k0+kc) of a float16 or bfloat16 B stored K x N, strips [s0, s1) (all full, NR wide) of the panel
// from column j0: each row of the panel read as one run, as pack_b does for float32.
AVX2H static inline __attribute__((always_inline)) void
pack_b_rows_half_body(const int F, const gemm_args *g, long k0, long j0, int kc, long s0, long s1, float *bpack) {
    const int NRp = g->p->nr;
    for (int p = 0; p < kc; p++) {
        const long row = (k0 + p) * g->ldb + j0;
        for (long s = s0; s < s1; s++)
            for (int h = 0; h < NRp; h += 8)
                _mm256_store_ps(bpack + (s * kc + p) * NRp + h, load8(F, g->B, row + s * NRp + h));
    }
}

AVX2H static void pack_a_strip_rows_avx2(int fmt, const float *src, long lda, int mr, int kc, float *out) {
    if (fmt == TL_F16) pack_a_strip_rows_body(TL_F16, src, lda, mr, kc, out);
    else if (fmt == TL_BF16) pack_a_strip_rows_body(TL_BF16, src, lda, mr, kc, out);
    else pack_a_strip_rows_body(TL_F32, src, lda, mr, kc, out);
}

AVX2H static void pack_b_strip_cols_avx2(const gemm_args *g, long j0, long k0, int nr, int kc, float *out) {
    switch (g->bfmt) {
    case TL_F16: pack_b_strip_cols_body(TL_F16, g, j0, k0, nr, kc, out); break;
    case TL_BF16: pack_b_strip_cols_body(TL_BF16, g, j0, k0, nr, kc, out); break;
    case TL_Q8: pack_b_strip_cols_body(TL_Q8, g, j0, k0, nr, kc, out); break;
    case TL_Q4: pack_b_strip_cols_body(TL_Q4, g, j0, k0, nr, kc, out); break;
    default: pack_b_strip_cols_body(TL_F32, g, j0, k0, nr, kc, out); break;
    }
}

// widen_half's vector part: the floats of src[0..i) for the i (a multiple of 8) it returns.
AVX2H static long widen_half_avx2(int fmt, const uint16_t *src, long n, float *dst) {
    long i = 0;
    if (fmt == TL_F16)
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8(TL_F16, (const float *)src, i));
    else
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8(TL_BF16, (const float *)src, i));
    return i;
}

// y[i * ldy + j] = x_i . W_j for j in [j0, j1), M <= GEMV_M rows of x (float32, K apart) and W of format F stored
// N x K (row j at w + j * ldw): each row of W streamed once, widened in registers, into four sets of sums (32
// values of k per step) so that the FMAs' latency does not bound the stream.
AVX2H static inline __attribute__((always_inline)) void
dots_half_avx2_m(const int M, const int F, long K, const float *x, const uint16_t *w, long ldw, float *y, long ldy,
                 long j0, long j1) {
    for (long j = j0; j < j1; j++) {
        const float *wj = (const float *)(w + j * ldw);  // load8's base: 16-bit values, indexed in elements
        __m256 a[4][GEMV_M];
        for (int u = 0; u < 4; u++)
            for (int i = 0; i < M; i++) a[u][i] = _mm256_setzero_ps();
        long k = 0;
        for (; k + 32 <= K; k += 32)
            for (int u = 0; u < 4; u++) {
                const __m256 v = load8(F, wj, k + 8 * u);
                for (int i = 0; i < M; i++)
                    a[u][i] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * K + k + 8 * u), v, a[u][i]);
            }
        for (; k + 8 <= K; k += 8) {
            const __m256 v = load8(F, wj, k);
            for (int i = 0; i < M; i++) a[0][i] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * K + k), v, a[0][i]);
        }
        for (int i = 0; i < M; i++) {
            const __m256 s = _mm256_add_ps(_mm256_add_ps(a[0][i], a[1][i]), _mm256_add_ps(a[2][i], a[3][i]));
            __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
            h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            float sum = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
            for (long p = k; p < K; p++) sum += x[i * K + p] * elem_at(F, wj, p);
            y[i * ldy + j] = sum;
        }
    }
}

#define DOTS_HALF_BY_M(F, ...)                                                  \
    do {                                                                        \
        switch (m) {                                                            \
        case 1: dots_half_avx2_m(1, F, __VA_ARGS__); break;                     \
        case 2: dots_half_avx2_m(2, F, __VA_ARGS__); break;                     \
        case 3: dots_half_avx2_m(3, F, __VA_ARGS__); break;                     \
        default: dots_half_avx2_m(GEMV_M, F, __VA_ARGS__); break;               \
        }                                                                       \
    } while (0)

AVX2H static void dots_half_avx2(int fmt, int m, long K, const float *x, const uint16_t *w, long ldw, float *y,
                                 long ldy, long j0, long j1) {
    if (fmt == TL_F16) DOTS_HALF_BY_M(TL_F16, K, x, w, ldw, y, ldy, j0, j1);
    else DOTS_HALF_BY_M(TL_BF16, K, x, w, ldw, y, ldy, j0, j1);
}

AVX2H static void pack_b_rows_half_avx2(const gemm_args *g, long k0, long j0, int kc, long s0, long s1, float *bpack) {
    if (g->bfmt == TL_F16) pack_b_rows_half_body(TL_F16, g, k0, j0, kc, s0, s1, bpack);
    else pack_b_rows_half_body(TL_BF16, g, k0, j0, kc, s0, s1, bpack);
}

// ----------------------------------------------------------------------------
// AVX-512F path: the MR5 x NR5 micro-kernel. Its packing is the AVX2 routines' (they take any strip size).

#define AVX512 __attribute__((target("avx2,fma,avx512f")))

// As kernel_avx2_body, with element (i, p) of the A strip at a[i*rs + p*ks]. The loop over the rows is
// unrolled, the accumulators stay in registers.
AVX512 static inline __attribute__((always_inline)) void
kernel_avx512_body(int kc, const float *restrict a, long rs, long ks, const float *restrict b,
                   float beta, float *restrict c, long ldc) {
    __m512 acc[MR5][2];
#pragma GCC unroll 16
    for (int i = 0; i < MR5; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (long p = 0; p < kc * ks; p += ks) {
        __m512 b0 = _mm512_load_ps(b);
        __m512 b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 16
        for (int i = 0; i < MR5; i++) {
            __m512 ai = _mm512_set1_ps(a[i * rs + p]);
            acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
        }
        b += NR5;
    }
    if (beta == 0.0f) {
#pragma GCC unroll 16
        for (int i = 0; i < MR5; i++) {
            _mm512_storeu_ps(c + i * ldc, acc[i][0]);
            _mm512_storeu_ps(c + i * ldc + 16, acc[i][1]);
        }
    } else {
        __m512 vb = _mm512_set1_ps(beta);
#pragma GCC unroll 16
        for (int i = 0; i < MR5; i++) {
            _mm512_storeu_ps(c + i * ldc, _mm512_fmadd_ps(vb, _mm512_loadu_ps(c + i * ldc), acc[i][0]));
            _mm512_storeu_ps(c + i * ldc + 16, _mm512_fmadd_ps(vb, _mm512_loadu_ps(c + i * ldc + 16), acc[i][1]));
        }
    }
}

AVX512 static void kernel_avx512(int kc, const float *a, long lda, const float *b, float beta, float *c, long ldc) {
    (void)lda;
    kernel_avx512_body(kc, a, 1, MR5, b, beta, c, ldc);
}

AVX512 static void kernel_avx512_cols(int kc, const float *a, long lda, const float *b, float beta, float *c,
                                      long ldc) {
    kernel_avx512_body(kc, a, 1, lda, b, beta, c, ldc);
}
#endif  // __x86_64__

// ----------------------------------------------------------------------------
// Plans: one micro-kernel shape per path, and its cache blocks.

// Cache blocks for an mr x nr micro-kernel, from the per-core cache sizes the OS reports:
//   KC: the KC x NR B strip, reused by every A strip of an A block, fills L1 (the A strips, 16 B per FMA cycle
//       at most, stream in from L2 fast enough; a longer KC reads and writes the C tile fewer times);
//   MC: the MC x KC A block, reused by every B strip of the panel, fills half of L2 (the B strips pass through
//       the other half on their way to L1);
//   NC: the KC x NC B panel, reread for every A block, fills a quarter of L3: it has two buffers, and the L3 is
//       usually shared with other cores and processes.
// Unknown sizes (0) take small, common ones (32 KiB, 512 KiB, 8 MiB), so a wrong guess costs speed, not memory.
static void plan_blocking(gemm_plan *p, long l1, long l2, long l3) {
    const long f = (long)sizeof(float);
    l1 = l1 > 0 ? l1 : 32L << 10;
    l2 = l2 > 0 ? l2 : 512L << 10;
    l3 = l3 > 0 ? l3 : 8L << 20;
    long kc = tl_max(64, tl_min(1024, l1 / (p->nr * f) / 16 * 16));
    long mc = tl_max(p->mr, tl_min(4096, l2 / 2 / (kc * f) / p->mr * p->mr));
    long nc = tl_max(16L * p->nr, tl_min(16384, l3 / 4 / (kc * f) / p->nr * p->nr));
    p->kc = (int)kc;
    p->mc = (int)mc;
    p->nc = (int)nc;
}

static gemm_plan g_plans[3];
static pthread_once_t g_plans_once = PTHREAD_ONCE_INIT;

static void plans_init(void) {
    g_plans[0] = (gemm_plan){MR, NR, 0, 0, 0, kernel_portable, NULL, NULL, 0};
#if defined(__x86_64__)
    g_plans[1] = (gemm_plan){MR, NR, 0, 0, 0, kernel_avx2, kernel_avx2_rows, kernel_avx2_cols, 1};
    // A row-major A is packed: read in place, the 14 row pointers of a strip do not fit the registers.
    g_plans[2] = (gemm_plan){MR5, NR5, 0, 0, 0, kernel_avx512, NULL, kernel_avx512_cols, 1};
#else
    g_plans[1] = g_plans[2] = g_plans[0];
#endif
    long l1 = tl_cpu_cache_size(1), l2 = tl_cpu_cache_size(2), l3 = tl_cpu_cache_size(3);
    for (int i = 0; i < 3; i++) plan_blocking(&g_plans[i], l1, l2, l3);
}

static int plan_index(int path) { return path < 0 ? 0 : path > 2 ? 2 : path; }

void tl_sgemm_plan(int path, int *out) {
    pthread_once(&g_plans_once, plans_init);
    const gemm_plan *p = &g_plans[plan_index(path)];
    out[0] = p->mr, out[1] = p->nr, out[2] = p->kc, out[3] = p->mc, out[4] = p->nc;
}

void tl_sgemm_set_blocking(int path, int kc, int mc, int nc) {
    pthread_once(&g_plans_once, plans_init);
    gemm_plan *p = &g_plans[plan_index(path)];
    plan_blocking(p, tl_cpu_cache_size(1), tl_cpu_cache_size(2), tl_cpu_cache_size(3));
    if (kc > 0) p->kc = kc;
    if (mc > 0) p->mc = (int)tl_round_up(mc, p->mr);
    if (nc > 0) p->nc = (int)tl_round_up(nc, p->nr);
}

// The plan of the path in use; fixed for the whole of one call.
static const gemm_plan *current_plan(void) {
    pthread_once(&g_plans_once, plans_init);
    int path = tl_cpu_path();
    return &g_plans[plan_index(path)];
}

// ----------------------------------------------------------------------------
// Driver.

// 1 when the AVX2 packing routines may widen format fmt: float32 always; the others use F16C (the scales of a
// quantized B are float16 too).
static int avx2_packs(const gemm_plan *p, int fmt) {
    return p->avx2_pack && (fmt == TL_F32 || tl_has_f16c());
}

static void pack_a(const gemm_args *g, long i0, long k0, int mc, int kc, float *out) {
    const int MRp = g->p->mr;
    for (int ir = 0; ir < mc; ir += MRp, out += MRp * kc) {
        int mr = (int)tl_min(MRp, mc - ir);
#if defined(__x86_64__)
        if (avx2_packs(g->p, g->afmt) && mr == MRp && !g->transA) {
            pack_a_strip_rows_avx2(g->afmt, (const float *)((const char *)g->A + ((i0 + ir) * g->lda + k0) *
                                   (g->afmt == TL_F32 ? 4 : 2)), g->lda, MRp, kc, out);
            continue;
        }
#endif
        pack_a_strip(g, i0 + ir, k0, mr, kc, out);
    }
}

// Packs strips [s0, s1) of the KC x NC panel of op(B) starting at (k0, j0).
static void pack_b(const gemm_args *g, long k0, long j0, int nc, int kc, long s0, long s1, float *bpack) {
    const int NRp = g->p->nr;
    if (!g->transB) {
        // Row by row: each row of the panel is read as one contiguous run of B (a strip at a time would
        // stride through B once per strip).
        long full = tl_min(s1, nc / NRp);  // strips before the ragged one
        if (g->bfmt != TL_F32) {
#if defined(__x86_64__)
            if (avx2_packs(g->p, g->bfmt) && full > s0) pack_b_rows_half_avx2(g, k0, j0, kc, s0, full, bpack);
            else full = s0;  // all one element at a time
#else
            full = s0;
#endif
        }
        for (int p = 0; p < kc && g->bfmt == TL_F32; p++) {
            const float *src = g->B + (k0 + p) * g->ldb + j0;
            for (long s = s0; s < full; s++) copy_run(bpack + (s * kc + p) * NRp, src + s * NRp, NRp);
        }
        if (full < s0) full = s0;
        for (long s = full; s < s1; s++) pack_b_strip(g, k0, j0 + s * NRp, (int)tl_min(NRp, nc - s * NRp), kc,
                                                      bpack + s * NRp * kc);
        return;
    }
    for (long s = s0; s < s1; s++) {
        long jr = s * NRp;
        int nr = (int)tl_min(NRp, nc - jr);
        float *out = bpack + s * NRp * kc;
#if defined(__x86_64__)
        const int quantized = g->bfmt == TL_Q8 || g->bfmt == TL_Q4;
        if (avx2_packs(g->p, g->bfmt) && nr == NRp && (!quantized || (g->group % 16 == 0 && k0 % 8 == 0))) {
            pack_b_strip_cols_avx2(g, j0 + jr, k0, NRp, kc, out);
            continue;
        }
#endif
        pack_b_strip(g, k0, j0 + jr, nr, kc, out);
    }
}

// Asks for the mr rows of kc floats (lda apart) of a row-major A strip to be brought into L1: issued two
// strips ahead during the first pass over an A block read in place, so its first reads do not wait on memory
// (the strips of a transposed A are walked in k order, which the hardware prefetcher follows by itself).
static void prefetch_strip(const float *a, long lda, int mr, int kc) {
    for (int i = 0; i < mr; i++)
        for (int p = 0; p < kc; p += 64 / (int)sizeof(float)) __builtin_prefetch(a + i * lda + p, 0, 3);
}

// Pulls the mr x nr C tile toward L1 as its micro-kernel starts: it is only touched after the k loop, and
// comes from L3 or memory when C is large (each K block sweeps all of it). Here rather than in the kernels,
// where the row addresses would take registers the k loop needs.
static inline void prefetch_c(const float *c, long ldc, int mr, int nr) {
    for (int i = 0; i < mr; i++) {
        __builtin_prefetch(c + i * ldc, 1, 3);
        __builtin_prefetch(c + i * ldc + nr - 1, 1, 3);
    }
}

// Partial tile at the bottom or right edge: compute the full tile into a
// buffer (the packed zeros make the extra rows/columns harmless) and copy out
// the part that exists.
static void kernel_edge(const gemm_plan *pl, kernel_fn kernel, int kc, const float *a, long lda, const float *b,
                        float beta, float *c, long ldc, int mr, int nr) {
    float tile[TILE_MAX] __attribute__((aligned(TL_ALIGN)));
    const int NRp = pl->nr;
    kernel(kc, a, lda, b, 0.0f, tile, NRp);
    for (int i = 0; i < mr; i++) {
        for (int j = 0; j < nr; j++) {
            float *cij = c + i * ldc + j;
            *cij = beta == 0.0f ? tile[i * NRp + j] : tile[i * NRp + j] + beta * *cij;
        }
    }
}

// The threads form a tm x tn grid over C: thread rows split M, thread columns
// split each B panel's strips. Splitting M is kept unless splitting N saves
// more than 1/16 of the work: the kernels before and after a product split the
// same rows (a GPT's tokens) the same way, so with M split each thread reads
// and writes rows its own core wrote and holds in cache, which matters when the
// two cores share no cache; and threads that split N must each pack the same A.
static void thread_grid(int nt, long m_strips, long n_strips, int *tm, int *tn) {
    long best = -1;
    *tm = nt;
    *tn = 1;
    for (int d = nt; d >= 1; d--) {
        if (nt % d != 0) continue;
        long work = (m_strips + d - 1) / d * ((n_strips + nt / d - 1) / (nt / d));
        if (best < 0 || 16 * work < 15 * best) {
            best = work;
            *tm = d;
            *tn = nt / d;
        }
    }
}

// What the threads of one product share: two B panel buffers, used in turn by
// successive (jc, pc) rounds, one flag per thread counting the rounds it has
// packed its part of, and one counter per thread: the next unit of its rows to
// be claimed in the last round (see gemm_thread).
typedef struct {
    float *bpack[2];
    tl_flag *packed;
    tl_flag *next;
} gemm_shared;

// One (jc, pc) round of a thread: the B panel's strips [s0, s1) of its grid column, packed in chunks of `chunk`
// strips by the column's threads, its own chunk starting at own0.
typedef struct {
    long jc, pc, round, s0, s1, own0, chunk;
    int nc, kc, tn, tcol;
    float beta;
    const float *bpack;
} gemm_round;

// The in-place kernel for this product's full A strips, or NULL to pack them (see the top of the file). Not a
// transposed A with lda 0 (a column broadcast along K, stride 0): the in-place kernels step through k by lda.
static kernel_fn in_place_kernel(const gemm_args *g) {
    const gemm_plan *p = g->p;
    if (g->N > 16L * p->nr || (g->transA && g->lda == 0) || g->afmt != TL_F32) return NULL;
    return g->transA ? p->cols : p->rows;
}

// Rows [ic, ic + mc) of C for round r: their A block packed (or read in place), times every strip of the round's
// B panel, the thread's own chunk first, each chunk once its packer has packed it.
static void gemm_block(const gemm_args *g, const gemm_shared *sh, const gemm_round *r, long ic, int mc,
                       float *apack) {
    const gemm_plan *pl = g->p;
    const int MRp = pl->mr, NRp = pl->nr, kc = r->kc;
    const kernel_fn kernel = pl->packed, in_place = in_place_kernel(g);
    const long pc = r->pc, jc = r->jc, s0 = r->s0, s1 = r->s1;
    int full = mc / MRp * MRp;
    if (!in_place) pack_a(g, ic, pc, mc, kc, apack);
    else if (mc > full) pack_a(g, ic + full, pc, mc - full, kc, apack + (long)full * kc);
    for (long q = 0; q < s1 - s0; q++) {
        long s = s0 + (r->own0 - s0 + q) % (s1 - s0);  // own chunk first
        tl_flag_wait(&sh->packed[(s - s0) / r->chunk * r->tn + r->tcol], r->round + 1);  // (one load once set)
        long jr = s * NRp;
        int nr = (int)tl_min(NRp, r->nc - jr);
        const float *bp = r->bpack + s * NRp * kc;
        for (int ir = 0; ir < mc; ir += MRp) {
            int mr = (int)tl_min(MRp, mc - ir);
            float *c = g->C + (ic + ir) * g->ldc + jc + jr;
            kernel_fn kern = kernel;
            const float *ap = apack + (long)ir * kc;
            if (in_place && q == 0 && !g->transA && ir + 3 * MRp <= mc)
                prefetch_strip(g->A + (ic + ir + 2 * MRp) * g->lda + pc, g->lda, MRp, kc);
            if (in_place && mr == MRp) {
                kern = in_place;
                ap = g->transA ? g->A + pc * g->lda + ic + ir : g->A + (ic + ir) * g->lda + pc;
            }
            prefetch_c(c, g->ldc, mr, nr);
            if (mr == MRp && nr == NRp) kern(kc, ap, g->lda, bp, r->beta, c, g->ldc);
            else kernel_edge(pl, kern, kc, ap, g->lda, bp, r->beta, c, g->ldc, mr, nr);
        }
    }
}

// Rows of C a claim takes in the last round: about an eighth of a thread's rows, whole strips, at most MC.
static long steal_unit(long rows, int mr, int mc) {
    return tl_max(mr, tl_min(mc / mr * mr, tl_round_up((rows + 7) / 8, mr)));
}

// The body each of the nt threads runs (tid in [0, nt)).
//
// Synchronisation without barriers: the tm threads of a grid column share its
// B strips, each packing one chunk of them per (jc, pc) round. After packing
// round r a thread raises its flag to r + 1; a thread waits for a chunk's
// packer to reach r + 1 before it multiplies with that chunk, and starts with
// its own chunk. Buffer r % 2 is repacked in round r + 2 only once every flag
// has reached r + 2, which each thread raises after finishing round r. So a
// thread can run up to a round ahead of the others instead of meeting them
// twice a round; that matters most when another process takes a core.
//
// A thread that finishes its rows of the last round early takes over what is
// left of another's, a unit of rows at a time (every thread, the owner too,
// claims the next unit of a thread's rows from its counter), so the product
// ends when the work does, not when the slowest core's share does. Only in the
// last round: a later round's beta = 1 pass over rows must follow this one's,
// which holds when each row is always its owner's. The thief waits until the
// owner has packed the last round, and so has finished the round before it.
static void gemm_thread(const gemm_args *g, const gemm_shared *sh, int tid, int nt) {
    const gemm_plan *pl = g->p;
    const int MRp = pl->mr, NRp = pl->nr, KC = pl->kc, MC = pl->mc, NC = pl->nc;
    long m_strips = (g->M + MRp - 1) / MRp;
    int tm, tn;
    thread_grid(nt, m_strips, (tl_min(g->N, NC) + NRp - 1) / NRp, &tm, &tn);
    int trow = tid / tn, tcol = tid % tn;
    long m0 = m_strips * trow / tm * MRp;
    long m1 = tl_min(g->M, m_strips * (trow + 1) / tm * MRp);
    long last = (g->N + NC - 1) / NC * ((g->K + KC - 1) / KC) - 1;
    // 8 floats of slack for the overlapping stores of pack_a_strip_rows_avx2
    float *apack = tl_scratch(SLOT_A, (size_t)MC * KC + 8);

    gemm_round r = {.tn = tn, .tcol = tcol, .round = 0};
    for (r.jc = 0; r.jc < g->N; r.jc += NC) {
        r.nc = (int)tl_min(NC, g->N - r.jc);
        long n_strips = (r.nc + NRp - 1) / NRp;
        // this thread column's strips, packed in chunks by its tm threads
        r.s0 = n_strips * tcol / tn, r.s1 = n_strips * (tcol + 1) / tn;
        r.chunk = (r.s1 - r.s0 + tm - 1) / tm;
        r.own0 = tl_min(r.s1, r.s0 + trow * r.chunk);
        long own1 = tl_min(r.s1, r.own0 + r.chunk);
        for (r.pc = 0; r.pc < g->K; r.pc += KC, r.round++) {
            r.kc = (int)tl_min(KC, g->K - r.pc);
            r.beta = r.pc == 0 ? g->beta : 1.0f;  // later K blocks accumulate
            float *bpack = sh->bpack[r.round % 2];
            r.bpack = bpack;
            // Buffer round % 2 was last read in round - 2: wait until every
            // thread has packed round - 1, and so is done with round - 2.
            for (int t = 0; t < nt; t++) tl_flag_wait(&sh->packed[t], r.round);
            pack_b(g, r.pc, r.jc, r.nc, r.kc, r.own0, own1, bpack);
            tl_flag_set(&sh->packed[tid], r.round + 1);
            if (r.round < last || tm == 1) {
                for (long ic = m0; ic < m1; ic += MC) gemm_block(g, sh, &r, ic, (int)tl_min(MC, m1 - ic), apack);
                continue;
            }
            for (int k = 0; k < tm; k++) {  // its own rows first, then the other thread rows of its grid column
                int v = (trow + k) % tm, owner = v * tn + tcol;
                long v0 = m_strips * v / tm * MRp, v1 = tl_min(g->M, m_strips * (v + 1) / tm * MRp);
                long unit = steal_unit(v1 - v0, MRp, MC);
                if (k > 0) tl_flag_wait(&sh->packed[owner], r.round + 1);
                for (long ic; (ic = v0 + atomic_fetch_add(&sh->next[owner].value, 1) * unit) < v1;)
                    gemm_block(g, sh, &r, ic, (int)tl_min(unit, v1 - ic), apack);
            }
        }
    }
}

// C = beta * C, for K == 0.
static void scale_c(const gemm_args *g) {
    for (long i = 0; i < g->M; i++) {
        float *c = g->C + i * g->ldc;
        for (long j = 0; j < g->N; j++) c[j] = g->beta == 0.0f ? 0.0f : g->beta * c[j];
    }
}

// How many of the nt threads one M x N x K product is worth.
static int useful_threads(const gemm_plan *p, long M, long N, long K, int nt) {
    double work = (double)M * N * K;
    long tiles = (M + p->mr - 1) / p->mr * ((tl_min(N, p->nc) + p->nr - 1) / p->nr);
    long n = (long)(work / TL_MIN_WORK_PER_THREAD);
    return (int)tl_max(1, tl_min(tl_min(nt, TL_MAX_THREADS), tl_min(n, tiles)));
}

// C = t^T + beta * C, t being N x M row-major (beta == 0 never reads C); 8 rows of C at a time: t read in runs of 8.
static void transpose_into_c(const gemm_args *g, const float *t, int nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
    for (long i0 = 0; i0 < g->M; i0 += 8)
        for (long j = 0; j < g->N; j++)
            for (long i = i0; i < tl_min(i0 + 8, g->M); i++) {
                float *c = g->C + i * g->ldc + j;
                *c = g->beta == 0.0f ? t[j * g->M + i] : t[j * g->M + i] + g->beta * *c;
            }
}

// A product with few rows, many columns and a long sum (the GPT's weight gradients X^T dY: M = n_embd, N = 4 n_embd,
// K = batch x block) runs as its transpose C^T = op(B)^T op(A)^T: with M columns, its A strips are read in place
// and the threads pack K M floats instead of K (M + N), which pays for the transpose into C when K is long and M
// small (bench/RESULTS.md, "Figures moved from code comments"). The scratch stays under 4 MiB. Only where the
// plan has an in-place kernel for the transpose's A.
static int as_transpose(const gemm_args *g) {
    const kernel_fn in_place = g->transB ? g->p->rows : g->p->cols;  // the transpose's, for its op(A) = op(B)^T
    return in_place != NULL && plain_f32(g) && g->M <= 128 && g->N > 256 && g->K >= 8 * g->M &&
           g->M * g->N <= (1L << 20);
}

static void gemm_blocked(const gemm_args *g, int nt) {
    if (as_transpose(g)) {
        float *t = tl_scratch(SLOT_T, (size_t)g->M * g->N);
        gemm_args gt = {!g->transB, !g->transA, g->N, g->M, g->K, g->B, g->ldb, g->A, g->lda, 0.0f, t, g->M, g->p};
        gemm_blocked(&gt, nt);  // its M is over 256: not transposed again
        transpose_into_c(g, t, nt);
        return;
    }
    size_t panel = (size_t)(tl_min(g->K, g->p->kc) * tl_round_up(tl_min(g->N, g->p->nc), g->p->nr));
    if (nt <= 1) {
        tl_flag packed = {0};
        float *bpack = tl_scratch(SLOT_B, panel);  // one thread: no second buffer, no rows to take over
        gemm_shared sh = {{bpack, bpack}, &packed, NULL};
        gemm_thread(g, &sh, 0, 1);
        return;
    }
    tl_flag packed[nt], next[nt];
    for (int t = 0; t < nt; t++) atomic_init(&packed[t].value, 0), atomic_init(&next[t].value, 0);
    float *bpack = tl_scratch(SLOT_B, 2 * panel);
    gemm_shared sh = {{bpack, bpack + panel}, packed, next};
    // The team may come out smaller than asked (nested parallelism), so the
    // work is split by the actual team size.
#pragma omp parallel num_threads(nt)
    gemm_thread(g, &sh, tl_omp_thread_num(), tl_omp_num_threads());
}

// A weight gradient X^T dY sums over the tokens, which both operands store as rows (K the long axis, M and N
// the features), and which the other kernels of a step split among the threads in halves: thread 0 writes the
// first half of the rows, thread 1 the second. Split by M or N, every thread would read every row, half of them
// out of the other core's cache, slow when the two cores share no cache (as a VM's two vCPUs at times do); and
// the next kernel to write those rows would have to take them back. So the sum runs as two halves of K, each
// on the thread that wrote its rows, into C and into a partial that is then added to C. Always two halves, on
// any number of threads, so the result does not depend on the thread count.
static int split_k(const gemm_args *g) {
    return plain_f32(g) && g->transA && !g->transB && g->K >= SPLIT_K_MIN && g->K >= g->M && g->K >= g->N;
}

// Rows [r0, r1) of C += part (M x N, row-major).
static void add_partial(const gemm_args *g, const float *part, long r0, long r1) {
    for (long i = r0; i < r1; i++) {
        float *c = g->C + i * g->ldc;
        const float *p = part + i * g->N;
        for (long j = 0; j < g->N; j++) c[j] += p[j];
    }
}

static void gemm(const gemm_args *g, int nt) {
    if (g->M <= 0 || g->N <= 0) return;
    if (g->K <= 0) {
        scale_c(g);
        return;
    }
    if (plain_f32(g) && tl_gemv_applies(g->M, g->N)) {
        tl_gemv(g->transA, g->transB, g->M, g->N, g->K, g->A, g->lda, g->B, g->ldb, g->beta, g->C, g->ldc, nt);
        return;
    }
    if (!split_k(g)) {
        gemm_blocked(g, nt);
        return;
    }
    float *part = tl_scratch(SLOT_P, (size_t)g->M * g->N);
    const long k = g->K / 2;
    gemm_args half[2] = {*g, *g};
    half[0].K = k;
    half[1].K = g->K - k;
    half[1].A = g->A + k * g->lda;
    half[1].B = g->B + k * g->ldb;
    half[1].C = part;
    half[1].ldc = g->N;
    half[1].beta = 0.0f;
    if (nt != 2) {  // one thread, or enough for each half to split M or N
        gemm_blocked(&half[0], nt);
        gemm_blocked(&half[1], nt);
#pragma omp parallel for num_threads(nt) schedule(static)
        for (long i = 0; i < g->M; i++) add_partial(g, part, i, i + 1);
        return;
    }
#pragma omp parallel num_threads(2)
    {
        const int t = tl_omp_thread_num(), n = tl_omp_num_threads();
        for (int h = t; h < 2; h += n) gemm_blocked(&half[h], 1);
#pragma omp barrier
        add_partial(g, part, g->M * t / n, g->M * (t + 1) / n);
    }
}

// ----------------------------------------------------------------------------
// Entry points.

void tl_sgemm(int transA, int transB, int M, int N, int K, const float *A, long lda, const float *B,
              long ldb, float beta, float *C, long ldc) {
    const gemm_plan *p = current_plan();
    gemm_args g = {transA, transB, M, N, K, A, lda, B, ldb, beta, C, ldc, p};
    gemm(&g, tl_gemv_applies(M, N) ? g_threads : useful_threads(p, M, N, K, g_threads));
}

// Matrix b of a two-axis batch (b = b0 * batch1 + b1), on nt threads.
static void gemm_one(const gemm_plan *p, int batch1, long b, int transA, int transB, int M, int N, int K,
                     const float *A, long lda, long strideA0, long strideA1,
                     const float *B, long ldb, long strideB0, long strideB1,
                     float beta, float *C, long ldc, long strideC0, long strideC1, int nt) {
    long b0 = b / batch1, b1 = b % batch1;
    gemm_args g = {transA, transB, M, N, K, A + b0 * strideA0 + b1 * strideA1, lda,
                   B + b0 * strideB0 + b1 * strideB1, ldb, beta, C + b0 * strideC0 + b1 * strideC1, ldc, p};
    gemm(&g, nt);
}

void tl_sgemm_batched(int batch, int transA, int transB, int M, int N, int K, const float *A, long lda,
                      long strideA, const float *B, long ldb, long strideB, float beta, float *C, long ldc,
                      long strideC) {
    tl_sgemm_batched2(1, batch, transA, transB, M, N, K, A, lda, 0, strideA, B, ldb, 0, strideB, beta, C, ldc, 0,
                      strideC);
}

// Threads for a batch of products spread one matrix per thread: at most one per
// matrix, and one per TL_MIN_WORK_PER_THREAD multiply-adds of the whole batch.
static long batch_threads(int nt, long batch, int M, int N, int K) {
    double work = (double)batch * M * N * K;
    return tl_min(tl_min(nt, batch), (long)(work / TL_MIN_WORK_PER_THREAD));
}

void tl_sgemm_batched2(int batch0, int batch1, int transA, int transB, int M, int N, int K,
                       const float *A, long lda, long strideA0, long strideA1,
                       const float *B, long ldb, long strideB0, long strideB1,
                       float beta, float *C, long ldc, long strideC0, long strideC1) {
    long batch = (long)batch0 * batch1;
    if (batch <= 0) return;
    const gemm_plan *p = current_plan();
    int nt = g_threads;
    int per_matrix = tl_gemv_applies(M, N) ? nt : useful_threads(p, M, N, K, nt);
    // One matrix per thread at a time needs no hand-offs and no shared panel,
    // so prefer it, unless the matrices are big enough to keep all threads busy
    // on their own and the batch does not divide evenly among the threads. A
    // batch of little total work (a decode step's per-head products) stays on
    // fewer threads: waking one costs more than its share of the products.
    long over_batch = batch_threads(nt, batch, M, N, K);
    if (over_batch > 1 && (per_matrix < nt || batch % nt == 0)) {
#pragma omp parallel for num_threads((int)over_batch) schedule(static)
        for (long b = 0; b < batch; b++) gemm_one(p, batch1, b, transA, transB, M, N, K, A, lda, strideA0, strideA1,
                                                  B, ldb, strideB0, strideB1, beta, C, ldc, strideC0, strideC1, 1);
        return;
    }
    for (long b = 0; b < batch; b++) gemm_one(p, batch1, b, transA, transB, M, N, K, A, lda, strideA0, strideA1,
                                              B, ldb, strideB0, strideB1, beta, C, ldc, strideC0, strideC1,
                                              per_matrix);
}

// ----------------------------------------------------------------------------
// Other element formats (formats.h): packing widens them to float32, the kernels are float32's.

int tl_gemm_threads(void) { return g_threads; }

void tl_gemm_quantized(int fmt, long M, long N, long K, long group, const float *x, long ldx, const void *q, long ldq,
                       const uint16_t *scales, long lds, float *C, long ldc, int nt) {
    const gemm_plan *p = current_plan();
    gemm_args g = {0, 1, M, N, K, x, ldx, (const float *)q, ldq, 0.0f, C, ldc, p, TL_F32, fmt, scales, lds, group};
    gemm(&g, tl_min(nt, useful_threads(p, M, N, K, nt)));
}

// dst[0..n) = the float32 values of n 16-bit floats of format fmt; vec: with AVX2 (avx2_packs).
static void widen_half(int fmt, int vec, const uint16_t *src, long n, float *dst) {
    long i = 0;
#if defined(__x86_64__)
    if (vec) i = widen_half_avx2(fmt, src, n, dst);
#else
    (void)vec;
#endif
    for (; i < n; i++) dst[i] = tl_half_to_f32(fmt, src[i]);
}

#define HALF_GEMV_CHUNK (16L << 10)  // floats of W widened at a time (64 KiB, in L2), then read by the GEMV

// C (float32 sums, row-major, ldc) = op(A) op(B) of 16-bit floats for M <= GEMV_M: the rows of op(A) widened
// once; W = op(B) read once. A transposed B (N x K, a weight as x W^T reads it), the threads splitting its rows:
// with AVX2, dot products that widen W in registers (dots_half_avx2); else whole rows of W widened a chunk at a
// time into this thread's scratch, where gemv.c's float32 GEMV reads them. A plain B, the threads splitting its
// columns: runs of k widened into the scratch the same way, later runs adding into C (beta 1).
static void gemv_half(int fmt, int transA, int transB, long M, long N, long K, const uint16_t *A, long lda,
                      const uint16_t *B, long ldb, float *C, long ldc, int nt) {
    float *x = tl_scratch(SLOT_P, (size_t)M * K);
    for (long i = 0; i < M; i++)
        for (long k = 0; k < K; k++) x[i * K + k] = tl_half_to_f32(fmt, A[transA ? k * lda + i : i * lda + k]);
    nt = (int)tl_max(1, tl_min(nt, N * K / (64L << 10)));
    const int vec = avx2_packs(current_plan(), fmt);
#pragma omp parallel num_threads(nt)
    {
        const int t = tl_omp_thread_num(), n = tl_omp_num_threads();
        const long j0 = N * t / n, j1 = N * (t + 1) / n;
        float *w = tl_scratch(SLOT_A, (size_t)tl_max(HALF_GEMV_CHUNK, transB ? K : j1 - j0));
#if defined(__x86_64__)
        if (transB && vec) {
            dots_half_avx2(fmt, (int)M, K, x, B, ldb, C, ldc, j0, j1);
        } else
#endif
        if (transB) {
            const long rows = tl_max(1, HALF_GEMV_CHUNK / K);
            for (long j = j0; j < j1; j += rows) {
                const long r = tl_min(rows, j1 - j);
                for (long q = 0; q < r; q++) widen_half(fmt, vec, B + (j + q) * ldb, K, w + q * K);
                tl_gemv(0, 1, M, r, K, x, K, w, K, 0.0f, C + j, ldc, 1);
            }
        } else if (j1 > j0) {
            const long cols = j1 - j0, run = tl_max(1, HALF_GEMV_CHUNK / cols);
            for (long k = 0; k < K; k += run) {
                const long r = tl_min(run, K - k);
                for (long q = 0; q < r; q++) widen_half(fmt, vec, B + (k + q) * ldb + j0, cols, w + q * cols);
                tl_gemv(0, 0, M, cols, r, x + k, K, w, cols, k == 0 ? 0.0f : 1.0f, C + j0, ldc, 1);
            }
        }
    }
}

// Matrix b of a batch of 16-bit float products (as gemm_one); the float32 sums go through this thread's scratch
// (the transposed form, which uses it too, is off for these formats), and are rounded once into C.
static void gemm_half_one(const gemm_plan *p, int fmt, int batch1, long b, int transA, int transB, int M, int N,
                          int K, const uint16_t *A, long lda, long strideA0, long strideA1, const uint16_t *B,
                          long ldb, long strideB0, long strideB1, uint16_t *C, long ldc, long strideC0,
                          long strideC1, int nt) {
    long b0 = b / batch1, b1 = b % batch1;
    float *sums = tl_scratch(SLOT_T, (size_t)M * N);
    A += b0 * strideA0 + b1 * strideA1;
    B += b0 * strideB0 + b1 * strideB1;
    if (M <= GEMV_M && K > 0) {
        gemv_half(fmt, transA, transB, M, N, K, A, lda, B, ldb, sums, N, nt);
    } else {
        gemm_args g = {transA, transB, M, N, K, (const float *)A, lda, (const float *)B, ldb, 0.0f, sums, N, p, fmt,
                       fmt};
        gemm(&g, nt);
    }
    uint16_t *c = C + b0 * strideC0 + b1 * strideC1;
    for (long i = 0; i < M; i++)
        for (long j = 0; j < N; j++) c[i * ldc + j] = tl_f32_to_half(fmt, sums[i * N + j]);
}

static void gemm_half_batched2(int fmt, int batch0, int batch1, int transA, int transB, int M, int N, int K,
                               const uint16_t *A, long lda, long strideA0, long strideA1,
                               const uint16_t *B, long ldb, long strideB0, long strideB1,
                               uint16_t *C, long ldc, long strideC0, long strideC1) {
    long batch = (long)batch0 * batch1;
    if (batch <= 0 || M <= 0 || N <= 0) return;
    const gemm_plan *p = current_plan();
    int nt = g_threads, per_matrix = M <= GEMV_M ? nt : useful_threads(p, M, N, K, nt);
    long over_batch = batch_threads(nt, batch, M, N, K);
    if (over_batch > 1 && (per_matrix < nt || batch % nt == 0)) {  // as tl_sgemm_batched2
#pragma omp parallel for num_threads((int)over_batch) schedule(static)
        for (long b = 0; b < batch; b++) gemm_half_one(p, fmt, batch1, b, transA, transB, M, N, K, A, lda, strideA0,
                                                       strideA1, B, ldb, strideB0, strideB1, C, ldc, strideC0,
                                                       strideC1, 1);
        return;
    }
    for (long b = 0; b < batch; b++) gemm_half_one(p, fmt, batch1, b, transA, transB, M, N, K, A, lda, strideA0,
                                                   strideA1, B, ldb, strideB0, strideB1, C, ldc, strideC0, strideC1,
                                                   per_matrix);
}

void tl_gemm_f16_batched2(int batch0, int batch1, int transA, int transB, int M, int N, int K,
                          const uint16_t *A, long lda, long strideA0, long strideA1,
                          const uint16_t *B, long ldb, long strideB0, long strideB1,
                          uint16_t *C, long ldc, long strideC0, long strideC1) {
    gemm_half_batched2(TL_F16, batch0, batch1, transA, transB, M, N, K, A, lda, strideA0, strideA1, B, ldb, strideB0,
                       strideB1, C, ldc, strideC0, strideC1);
}

void tl_gemm_bf16_batched2(int batch0, int batch1, int transA, int transB, int M, int N, int K,
                           const uint16_t *A, long lda, long strideA0, long strideA1,
                           const uint16_t *B, long ldb, long strideB0, long strideB1,
                           uint16_t *C, long ldc, long strideC0, long strideC1) {
    gemm_half_batched2(TL_BF16, batch0, batch1, transA, transB, M, N, K, A, lda, strideA0, strideA1, B, ldb, strideB0,
                       strideB1, C, ldc, strideC0, strideC1);
}
