/*
What the sgemm's files share: sgemm.c (plans, cache blocks, thread scheduling, the split sum, entry points),
sgemm_kernels.c (micro-kernels and packing) and sgemm_formats.c (float16, bfloat16 and quantized operands).
Private to runtime_c: not part of the cffi interface (build.py's PRIVATE_HEADERS), and hidden from the
module's exported symbols.
*/
#ifndef TINYLLM_SGEMM_INTERNAL_H
#define TINYLLM_SGEMM_INTERNAL_H

#include "common.h"
#include "formats.h"

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

enum { SLOT_A, SLOT_B, SLOT_T, SLOT_P };  // per-thread scratch slots (sgemm_scratch)

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
    int pairs;             // the strips hold bfloat16 k-pairs for vdpbf16ps (sgemm_kernels.c), not float32
} gemm_plan;

// Floats a packed strip takes per row or column, for kc values of k: kc floats, or (kc + 1) / 2 k-pairs of
// bfloat16 (a pair is 32 bits; an odd kc ends in a pair padded with zero).
static inline long strip_len(const gemm_plan *p, int kc) { return p->pairs ? (kc + 1) / 2 : kc; }

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

// 1 when the AVX2 packing routines may widen format fmt: float32 always; the others use F16C (the scales of a
// quantized B are float16 too).
static inline int avx2_packs(const gemm_plan *p, int fmt) {
    return p->avx2_pack && (fmt == TL_F32 || tl_has_f16c());
}

#if defined(__x86_64__)
// The AVX2 routines that widen other formats (sgemm_kernels.c's packing, sgemm_formats.c's GEMV) are templates
// over the element format F (formats.h; a compile-time constant in each instance): load8 widens 8 consecutive
// elements, float16 with F16C (so these take its target too; every AVX2 CPU has it, and their callers check:
// avx2_packs), bfloat16 with a 16-bit shift.
#define AVX2H __attribute__((target("avx2,fma,f16c")))

AVX2H static inline __attribute__((always_inline)) __m256 load8(const int F, const float *base, long i) {
    if (F == TL_F32) return _mm256_loadu_ps(base + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + i));
    if (F == TL_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#endif

// sgemm.c

// The plan of the path in use; fixed for the whole of one call.
__attribute__((visibility("hidden"))) const gemm_plan *sgemm_current_plan(void);

// The plan of bfloat16 products on vdpbf16ps, or NULL when they widen instead (cpu.h's tl_cpu_bf16_dot).
__attribute__((visibility("hidden"))) const gemm_plan *sgemm_bf16_plan(void);

// How many of the nt threads one M x N x K product is worth.
__attribute__((visibility("hidden"))) int sgemm_useful_threads(const gemm_plan *p, long M, long N, long K, int nt);

// Threads for a batch of products spread one matrix per thread.
__attribute__((visibility("hidden"))) long sgemm_batch_threads(int nt, long batch, int M, int N, int K);

// C = op(A) op(B) + beta C for g, on at most nt threads: as a GEMV, blocked, or as two halves of K.
__attribute__((visibility("hidden"))) void sgemm_gemm(const gemm_args *g, int nt);

// This thread's scratch buffer number `slot` (common.h's tl_scratch), the one sgemm.c's products use.
__attribute__((visibility("hidden"))) float *sgemm_scratch(int slot, size_t n);

// sgemm_kernels.c: the micro-kernels (kernel_fn) of the plans, and the packing of A blocks and B panels.

__attribute__((visibility("hidden"))) void sgemm_kernel_portable(int kc, const float *a, long lda, const float *b,
                                                                 float beta, float *c, long ldc);
#if defined(__x86_64__)
__attribute__((visibility("hidden"))) void sgemm_kernel_avx2(int kc, const float *a, long lda, const float *b,
                                                             float beta, float *c, long ldc);
__attribute__((visibility("hidden"))) void sgemm_kernel_avx2_rows(int kc, const float *a, long lda, const float *b,
                                                                  float beta, float *c, long ldc);
__attribute__((visibility("hidden"))) void sgemm_kernel_avx2_cols(int kc, const float *a, long lda, const float *b,
                                                                  float beta, float *c, long ldc);
__attribute__((visibility("hidden"))) void sgemm_kernel_avx512(int kc, const float *a, long lda, const float *b,
                                                               float beta, float *c, long ldc);
__attribute__((visibility("hidden"))) void sgemm_kernel_avx512_cols(int kc, const float *a, long lda,
                                                                    const float *b, float beta, float *c, long ldc);
// MR5 x NR5 over strips of bfloat16 k-pairs (plan.pairs): a and b are uint32_t pairs, kc counts values of k.
__attribute__((visibility("hidden"))) void sgemm_kernel_bf16(int kc, const float *a, long lda, const float *b,
                                                             float beta, float *c, long ldc);
#endif

// Packs rows [i0, i0+mc) x columns [k0, k0+kc) of op(A) as MR-tall strips (rows past mc zero).
__attribute__((visibility("hidden"))) void sgemm_pack_a(const gemm_args *g, long i0, long k0, int mc, int kc,
                                                        float *out);

// Packs strips [s0, s1) of the KC x NC panel of op(B) starting at (k0, j0).
__attribute__((visibility("hidden"))) void sgemm_pack_b(const gemm_args *g, long k0, long j0, int nc, int kc,
                                                        long s0, long s1, float *bpack);

#endif  // TINYLLM_SGEMM_INTERNAL_H
