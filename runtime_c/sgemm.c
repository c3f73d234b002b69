/*
Packed, cache-tiled, register-blocked sgemm (GotoBLAS / BLIS layout).

    for jc in N by NC:                          B panel  KC x NC -> L3, shared by the threads
      for pc in K by KC:                        (one "round")
        pack B[pc:+KC, jc:+NC] into NR-wide strips (each thread packs a chunk)
        for ic in (this thread's rows) by MC:   A block  MC x KC -> L2, private
          pack A[ic:+MC, pc:+KC] into MR-tall strips (unless N <= 256: see below)
          for jr in (this thread's strips) by NR:   B strip KC x NR -> L1
            for ir in MC by MR:
              micro-kernel: C[MR x NR] (+)= A strip . B strip, in registers

Packing reads op(A) and op(B) in whatever layout they have (plain or
transposed), so the micro-kernel only ever sees one contiguous layout, and the
transposed products of the backward pass cost no copies in the caller. When C
has few columns (N <= 256: an A strip meets at most 16 B strips), packing A
costs more than it saves, so the AVX2 path reads its full strips in place
through their strides instead; one with few rows and many columns runs as its
transpose (as_transpose).

The micro-kernel is 6 x 16: 12 ymm accumulators (6 rows x 2 vectors of 8),
2 ymm for the B row and 1 for the broadcast A element = 15 of the 16 ymm
registers. Each k step issues 12 FMAs against 2 loads and 6 broadcasts,
enough independent FMAs to keep both FMA pipes busy through their 4-cycle
latency. AVX-512 would not be faster on Zen 4, which splits 512-bit FMAs in two.

Threads (OpenMP) split C into a grid: normally M (each thread packs its own A
blocks and a chunk of the shared B panel), N where that saves over 1/16 of the
work (thread_grid). They hand the B panel over with per-thread flags and two
panel buffers instead of barriers (see gemm_thread). Batched products of small
matrices run one matrix per thread instead. A long sum over rows that both
operands store (a weight gradient X^T dY, summed over the tokens) runs as two
halves of K instead, each on the thread that holds its rows, added at the end
(split_k).
*/

#include "common.h"
#include "sgemm.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define MR 6
#define NR 16

// Cache blocking (overridable with -D for tuning). A KC x NR strip of B (16 KiB)
// plus an MR x KC strip of A (6 KiB) stay in the 32 KiB L1; an MC x KC block of
// A (144 KiB) sits in L2 (512 KiB on Zen 3, 1 MiB on Zen 4) with room for the
// B strips streaming through; the KC x NC panel of B (4 MiB) lives in L3.
#ifndef TL_KC
#define TL_KC 256
#endif
#ifndef TL_MC
#define TL_MC 144
#endif
#ifndef TL_NC
#define TL_NC 4096
#endif
// Below this many multiply-adds per thread, waking another thread and handing
// it the B panel cost more than the thread saves.
#ifndef TL_MIN_WORK_PER_THREAD
#define TL_MIN_WORK_PER_THREAD (64L * 64 * 64)
#endif
// Threads per product at most: bounds the per-call flags on the stack.
#define TL_MAX_THREADS 256

_Static_assert(TL_MC % MR == 0, "MC must be a multiple of MR");
_Static_assert(TL_NC % NR == 0, "NC must be a multiple of NR");

enum { SLOT_A, SLOT_B, SLOT_T, SLOT_P };  // per-thread scratch slots (common.h)

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
} gemm_args;

// Micro-kernel: C[MR x NR] (row stride ldc) = a . b + beta * C, with the packed
// strips a[p*MR + i] and b[p*NR + j], p < kc; the in-place variants read A
// through its row stride lda instead. beta == 0 never reads C.
typedef void (*kernel_fn)(int kc, const float *a, long lda, const float *b, float beta, float *c, long ldc);

static int g_threads;    // threads for the next call
static int g_use_avx2;   // dispatch: AVX2+FMA kernels or portable C

static int default_threads(void) {
    int n = tl_env_int("TINYLLM_THREADS", 0);
    return n > 0 ? n : tl_omp_num_procs();
}

__attribute__((constructor)) static void sgemm_init(void) {
    g_threads = default_threads();
    g_use_avx2 = tl_cpu_avx2_fma() && !tl_env_int("TINYLLM_NO_AVX2", 0);
}

void tl_set_num_threads(int n) { g_threads = n > 0 ? n : default_threads(); }
int tl_get_num_threads(void) { return g_threads; }
int tl_cpu_has_avx2_fma(void) { return tl_cpu_avx2_fma(); }
void tl_force_portable(int on) { g_use_avx2 = !on && tl_cpu_avx2_fma(); }
int tl_sgemm_uses_avx2(void) { return g_use_avx2; }

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

// Packs rows [i0, i0+mr) x columns [k0, k0+kc) of op(A) as one MR-row strip:
// element (i0 + i, k0 + p) at out[p*MR + i]; rows past mr are zero, so the
// kernel can always compute a full tile. Full strips (the common case) copy
// contiguous runs with fixed-size memcpy, which compiles to a few vector moves.
static void pack_a_strip(const gemm_args *g, long i0, long k0, int mr, int kc, float *out) {
    if (g->transA) {  // row k of the stored A holds op(A)'s column k: contiguous in i
        const float *src = g->A + k0 * g->lda + i0;
        if (mr == MR) {
            for (int p = 0; p < kc; p++) memcpy(out + p * MR, src + p * g->lda, MR * sizeof(float));
        } else {
            for (int p = 0; p < kc; p++) {
                for (int i = 0; i < MR; i++) out[p * MR + i] = i < mr ? src[p * g->lda + i] : 0.0f;
            }
        }
    } else {
        const float *src = g->A + i0 * g->lda + k0;
        for (int i = 0; i < MR; i++) {
            if (i < mr) {
                for (int p = 0; p < kc; p++) out[p * MR + i] = src[i * g->lda + p];
            } else {
                for (int p = 0; p < kc; p++) out[p * MR + i] = 0.0f;
            }
        }
    }
}

// Packs rows [k0, k0+kc) x columns [j0, j0+nr) of op(B) as one NR-wide strip:
// element (k0 + p, j0 + j) at out[p*NR + j]; columns past nr are zero.
static void pack_b_strip(const gemm_args *g, long k0, long j0, int nr, int kc, float *out) {
    if (g->transB) {  // row j of the stored B holds op(B)'s column j: contiguous in k
        const float *src = g->B + j0 * g->ldb + k0;
        for (int j = 0; j < NR; j++) {
            if (j < nr) {
                for (int p = 0; p < kc; p++) out[p * NR + j] = src[j * g->ldb + p];
            } else {
                for (int p = 0; p < kc; p++) out[p * NR + j] = 0.0f;
            }
        }
    } else {
        const float *src = g->B + k0 * g->ldb + j0;
        if (nr == NR) {
            for (int p = 0; p < kc; p++) memcpy(out + p * NR, src + p * g->ldb, NR * sizeof(float));
        } else {
            for (int p = 0; p < kc; p++) {
                for (int j = 0; j < NR; j++) out[p * NR + j] = j < nr ? src[p * g->ldb + j] : 0.0f;
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
    // Pull the C tile toward L1 now; it is only touched after the k loop.
    for (int i = 0; i < MR; i++) {
        _mm_prefetch((const char *)(c + i * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + i * ldc + NR - 1), _MM_HINT_T0);
    }
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

// A full MR-row strip of a row-major (untransposed) A: six strided rows become
// one interleaved stream, 8 columns at a time through an 8 x 8 transpose (two
// rows of zeros). Each 8-wide store writes 2 lanes of junk past its 6 floats;
// the next store, at the next higher address, overwrites them, and the last
// one lands in the following strip (packed later) or the buffer's slack.
AVX2 static void pack_a_strip_rows_avx2(const float *src, long lda, int kc, float *out) {
    int p = 0;
    for (; p + 8 <= kc; p += 8) {
        __m256 r[8];
        for (int i = 0; i < MR; i++) r[i] = _mm256_loadu_ps(src + i * lda + p);
        r[6] = r[7] = _mm256_setzero_ps();
        transpose8(r);
        for (int q = 0; q < 8; q++) _mm256_storeu_ps(out + (p + q) * MR, r[q]);
    }
    for (; p < kc; p++) {
        for (int i = 0; i < MR; i++) out[p * MR + i] = src[i * lda + p];
    }
}

// A full NR-wide strip of a transposed B (16 rows of the stored B, each
// contiguous in k), through two 8 x 8 transposes per 8 values of k.
AVX2 static void pack_b_strip_cols_avx2(const float *src, long ldb, int kc, float *out) {
    int p = 0;
    for (; p + 8 <= kc; p += 8) {
        for (int h = 0; h < NR; h += 8) {
            __m256 r[8];
            for (int j = 0; j < 8; j++) r[j] = _mm256_loadu_ps(src + (h + j) * ldb + p);
            transpose8(r);
            for (int q = 0; q < 8; q++) _mm256_store_ps(out + (p + q) * NR + h, r[q]);
        }
    }
    for (; p < kc; p++) {
        for (int j = 0; j < NR; j++) out[p * NR + j] = src[j * ldb + p];
    }
}
#endif  // __x86_64__

// ----------------------------------------------------------------------------
// Driver.

static void pack_a(const gemm_args *g, int avx2, long i0, long k0, int mc, int kc, float *out) {
    for (int ir = 0; ir < mc; ir += MR, out += MR * kc) {
        int mr = (int)tl_min(MR, mc - ir);
#if defined(__x86_64__)
        if (avx2 && mr == MR && !g->transA) {
            pack_a_strip_rows_avx2(g->A + (i0 + ir) * g->lda + k0, g->lda, kc, out);
            continue;
        }
#endif
        pack_a_strip(g, i0 + ir, k0, mr, kc, out);
    }
}

// Packs strips [s0, s1) of the KC x NC panel of op(B) starting at (k0, j0).
static void pack_b(const gemm_args *g, int avx2, long k0, long j0, int nc, int kc, long s0, long s1,
                   float *bpack) {
    if (!g->transB) {
        // Row by row: each row of the panel is read as one contiguous run of B (a strip at a time would
        // stride through B once per strip).
        long full = tl_min(s1, nc / NR);  // strips before the ragged one
        for (int p = 0; p < kc; p++) {
            const float *src = g->B + (k0 + p) * g->ldb + j0;
            for (long s = s0; s < full; s++) memcpy(bpack + (s * kc + p) * NR, src + s * NR, NR * sizeof(float));
        }
        if (full < s0) full = s0;
        for (long s = full; s < s1; s++) pack_b_strip(g, k0, j0 + s * NR, (int)tl_min(NR, nc - s * NR), kc,
                                                      bpack + s * NR * kc);
        return;
    }
    for (long s = s0; s < s1; s++) {
        long jr = s * NR;
        int nr = (int)tl_min(NR, nc - jr);
        float *out = bpack + s * NR * kc;
#if defined(__x86_64__)
        if (avx2 && nr == NR && g->transB) {
            pack_b_strip_cols_avx2(g->B + (j0 + jr) * g->ldb + k0, g->ldb, kc, out);
            continue;
        }
#endif
        pack_b_strip(g, k0, j0 + jr, nr, kc, out);
    }
}

// Asks for the MR rows of kc floats (lda apart) of a row-major A strip to be brought into L1: issued two
// strips ahead during the first pass over an A block read in place, so its first reads do not wait on memory
// (the strips of a transposed A are walked in k order, which the hardware prefetcher follows by itself).
static void prefetch_strip(const float *a, long lda, int kc) {
    for (int i = 0; i < MR; i++)
        for (int p = 0; p < kc; p += 64 / (int)sizeof(float)) __builtin_prefetch(a + i * lda + p, 0, 3);
}

// Partial tile at the bottom or right edge: compute the full tile into a
// buffer (the packed zeros make the extra rows/columns harmless) and copy out
// the part that exists.
static void kernel_edge(kernel_fn kernel, int kc, const float *a, long lda, const float *b, float beta,
                        float *c, long ldc, int mr, int nr) {
    float tile[MR * NR] __attribute__((aligned(TL_ALIGN)));
    kernel(kc, a, lda, b, 0.0f, tile, NR);
    for (int i = 0; i < mr; i++) {
        for (int j = 0; j < nr; j++) {
            float *cij = c + i * ldc + j;
            *cij = beta == 0.0f ? tile[i * NR + j] : tile[i * NR + j] + beta * *cij;
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
// successive (jc, pc) rounds, and one flag per thread counting the rounds it
// has packed its part of.
typedef struct {
    float *bpack[2];
    tl_flag *packed;
} gemm_shared;

// The body each of the nt threads runs (tid in [0, nt)).
//
// Synchronisation without barriers: the tm threads of a grid column share its
// B strips, each packing one chunk of them per (jc, pc) round. After packing
// round r a thread raises its flag to r + 1; a thread waits for a chunk's
// packer to reach r + 1 just before it first multiplies with that chunk, and
// starts with its own chunk. Buffer r % 2 is repacked in round r + 2 only once
// every flag has reached r + 2, which each thread raises after finishing round
// r. So a thread can run up to a round ahead of the others instead of meeting
// them twice a round; that matters most when another process takes a core.
static void gemm_thread(const gemm_args *g, const gemm_shared *sh, int tid, int nt) {
    const int avx2 = g_use_avx2;
#if defined(__x86_64__)
    const kernel_fn kernel = avx2 ? kernel_avx2 : kernel_portable;
    // Full strips of A read in place (kernel_avx2_body) when each meets few B strips (see the top of the file).
    // Not a transposed A with lda 0 (a column broadcast along K, stride 0): the body steps through k by lda.
    const int read_in_place = avx2 && g->N <= 256 && (g->lda != 0 || !g->transA);
    const kernel_fn in_place = !read_in_place ? NULL : g->transA ? kernel_avx2_cols : kernel_avx2_rows;
#else
    const kernel_fn kernel = kernel_portable, in_place = NULL;
#endif
    long m_strips = (g->M + MR - 1) / MR;
    int tm, tn;
    thread_grid(nt, m_strips, (tl_min(g->N, TL_NC) + NR - 1) / NR, &tm, &tn);
    int trow = tid / tn, tcol = tid % tn;
    long m0 = m_strips * trow / tm * MR;
    long m1 = tl_min(g->M, m_strips * (trow + 1) / tm * MR);
    // MR*NR floats of slack for the overlapping stores of pack_a_strip_rows_avx2
    float *apack = tl_scratch(SLOT_A, (size_t)TL_MC * TL_KC + MR * NR);

    long round = 0;
    for (long jc = 0; jc < g->N; jc += TL_NC) {
        int nc = (int)tl_min(TL_NC, g->N - jc);
        long n_strips = (nc + NR - 1) / NR;
        // this thread column's strips, packed in chunks by its tm threads
        long s0 = n_strips * tcol / tn, s1 = n_strips * (tcol + 1) / tn;
        long chunk = (s1 - s0 + tm - 1) / tm;
        long own0 = tl_min(s1, s0 + trow * chunk), own1 = tl_min(s1, own0 + chunk);
        for (long pc = 0; pc < g->K; pc += TL_KC, round++) {
            int kc = (int)tl_min(TL_KC, g->K - pc);
            float beta = pc == 0 ? g->beta : 1.0f;  // later K blocks accumulate
            float *bpack = sh->bpack[round % 2];
            // Buffer round % 2 was last read in round - 2: wait until every
            // thread has packed round - 1, and so is done with round - 2.
            for (int t = 0; t < nt; t++) tl_flag_wait(&sh->packed[t], round);
            pack_b(g, avx2, pc, jc, nc, kc, own0, own1, bpack);
            tl_flag_set(&sh->packed[tid], round + 1);

            for (long ic = m0; ic < m1; ic += TL_MC) {
                int mc = (int)tl_min(TL_MC, m1 - ic);
                if (!in_place) pack_a(g, avx2, ic, pc, mc, kc, apack);
                else if (mc % MR) pack_a(g, avx2, ic + mc / MR * MR, pc, mc % MR, kc, apack + (long)(mc / MR * MR) * kc);
                for (long q = 0; q < s1 - s0; q++) {
                    long s = s0 + (own0 - s0 + q) % (s1 - s0);  // own chunk first
                    if (ic == m0) tl_flag_wait(&sh->packed[(s - s0) / chunk * tn + tcol], round + 1);
                    long jr = s * NR;
                    int nr = (int)tl_min(NR, nc - jr);
                    const float *bp = bpack + s * NR * kc;
                    for (int ir = 0; ir < mc; ir += MR) {
                        int mr = (int)tl_min(MR, mc - ir);
                        float *c = g->C + (ic + ir) * g->ldc + jc + jr;
                        kernel_fn kern = kernel;
                        const float *ap = apack + (long)ir * kc;
                        if (in_place && q == 0 && !g->transA && ir + 3 * MR <= mc)
                            prefetch_strip(g->A + (ic + ir + 2 * MR) * g->lda + pc, g->lda, kc);
                        if (in_place && mr == MR) {
                            kern = in_place;
                            ap = g->transA ? g->A + pc * g->lda + ic + ir : g->A + (ic + ir) * g->lda + pc;
                        }
                        if (mr == MR && nr == NR) kern(kc, ap, g->lda, bp, beta, c, g->ldc);
                        else kernel_edge(kern, kc, ap, g->lda, bp, beta, c, g->ldc, mr, nr);
                    }
                }
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
static int useful_threads(long M, long N, long K, int nt) {
    double work = (double)M * N * K;
    long tiles = (M + MR - 1) / MR * ((tl_min(N, TL_NC) + NR - 1) / NR);
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
// small (bench/RESULTS.md, "Figures moved from code comments"). The scratch stays under 4 MiB.
static int as_transpose(const gemm_args *g) {
    return g_use_avx2 && g->M <= 128 && g->N > 256 && g->K >= 8 * g->M && g->M * g->N <= (1L << 20);
}

static void gemm_blocked(const gemm_args *g, int nt) {
    if (as_transpose(g)) {
        float *t = tl_scratch(SLOT_T, (size_t)g->M * g->N);
        gemm_args gt = {!g->transB, !g->transA, g->N, g->M, g->K, g->B, g->ldb, g->A, g->lda, 0.0f, t, g->M};
        gemm_blocked(&gt, nt);  // its M is over 256: not transposed again
        transpose_into_c(g, t, nt);
        return;
    }
    size_t panel = (size_t)(tl_min(g->K, TL_KC) * tl_round_up(tl_min(g->N, TL_NC), NR));
    if (nt <= 1) {
        tl_flag packed = {0};
        float *bpack = tl_scratch(SLOT_B, panel);  // one thread: no need for a second buffer
        gemm_shared sh = {{bpack, bpack}, &packed};
        gemm_thread(g, &sh, 0, 1);
        return;
    }
    tl_flag packed[nt];
    for (int t = 0; t < nt; t++) atomic_init(&packed[t].value, 0);
    float *bpack = tl_scratch(SLOT_B, 2 * panel);
    gemm_shared sh = {{bpack, bpack + panel}, packed};
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
    return g->transA && !g->transB && g->K >= 2 * TL_KC && g->K >= g->M && g->K >= g->N;
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

void tl_sgemm(int transA, int transB, int M, int N, int K, const float *A, long lda, const float *B,
              long ldb, float beta, float *C, long ldc) {
    gemm_args g = {transA, transB, M, N, K, A, lda, B, ldb, beta, C, ldc};
    gemm(&g, useful_threads(M, N, K, g_threads));
}

// Matrix b of a two-axis batch (b = b0 * batch1 + b1), on nt threads.
static void gemm_one(int batch1, long b, int transA, int transB, int M, int N, int K,
                     const float *A, long lda, long strideA0, long strideA1,
                     const float *B, long ldb, long strideB0, long strideB1,
                     float beta, float *C, long ldc, long strideC0, long strideC1, int nt) {
    long b0 = b / batch1, b1 = b % batch1;
    gemm_args g = {transA, transB, M, N, K, A + b0 * strideA0 + b1 * strideA1, lda,
                   B + b0 * strideB0 + b1 * strideB1, ldb, beta, C + b0 * strideC0 + b1 * strideC1, ldc};
    gemm(&g, nt);
}

void tl_sgemm_batched(int batch, int transA, int transB, int M, int N, int K, const float *A, long lda,
                      long strideA, const float *B, long ldb, long strideB, float beta, float *C, long ldc,
                      long strideC) {
    tl_sgemm_batched2(1, batch, transA, transB, M, N, K, A, lda, 0, strideA, B, ldb, 0, strideB, beta, C, ldc, 0,
                      strideC);
}

void tl_sgemm_batched2(int batch0, int batch1, int transA, int transB, int M, int N, int K,
                       const float *A, long lda, long strideA0, long strideA1,
                       const float *B, long ldb, long strideB0, long strideB1,
                       float beta, float *C, long ldc, long strideC0, long strideC1) {
    long batch = (long)batch0 * batch1;
    if (batch <= 0) return;
    int nt = g_threads;
    int per_matrix = useful_threads(M, N, K, nt);
    // One matrix per thread at a time needs no hand-offs and no shared panel,
    // so prefer it, unless the matrices are big enough to keep all threads busy
    // on their own and the batch does not divide evenly among the threads.
    if (nt > 1 && batch > 1 && (per_matrix < nt || batch % nt == 0)) {
#pragma omp parallel for num_threads((int)tl_min(nt, batch)) schedule(static)
        for (long b = 0; b < batch; b++) gemm_one(batch1, b, transA, transB, M, N, K, A, lda, strideA0, strideA1,
                                                  B, ldb, strideB0, strideB1, beta, C, ldc, strideC0, strideC1, 1);
        return;
    }
    for (long b = 0; b < batch; b++) gemm_one(batch1, b, transA, transB, M, N, K, A, lda, strideA0, strideA1,
                                              B, ldb, strideB0, strideB1, beta, C, ldc, strideC0, strideC1,
                                              per_matrix);
}
