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

The kernels (sgemm_kernels.c) follow cpu.h's path (tl_cpu_path), each with its own micro-kernel shape (a gemm_plan):

    portable  6 x 16   plain C that the compiler vectorises for the baseline ISA.
    avx2      6 x 16   12 ymm accumulators + 2 for the B row + 1 broadcast = 15 of the 16 ymm registers; each
                       k step issues 12 FMAs against 2 loads and 6 broadcasts, enough independent FMAs to keep
                       both FMA pipes busy through their 4-cycle latency.
    avx512   14 x 32   28 zmm accumulators + 2 for the B row + 1 broadcast = 31 of the 32 zmm registers: the
                       most accumulators they hold, 28 FMAs against 2 loads and 14 broadcasts per k step, few
                       enough loads for two 512-bit FMAs a cycle.

The cache blocks (KC, MC, NC) come from the cache sizes the OS reports, per shape (plan_blocking).

Threads (OpenMP) split C into a grid: normally M (each thread packs its own A blocks, and the B panel whole into
a buffer of its own where the panel fits in half of L2, else a chunk of a shared one: shares_b), N where that
saves over 1/16 of the work (thread_grid); the tuner may choose another split (tl_sgemm_set_split). They hand a
shared B panel over with per-thread flags and two panel buffers instead of barriers, and in the last round a
thread done with its rows takes over units of another's (see gemm_thread). Batched products of small matrices
run one matrix per thread instead. A long sum over rows that both operands store (a weight gradient X^T dY,
summed over the tokens) runs as two halves of K instead, each on the thread that holds its rows, added at the end
(split_k).

Other element formats (formats.h; sgemm_formats.c) take the same path with float32 micro-kernels: packing widens
float16 and bfloat16 operands (tl_gemm_f16_batched2, tl_gemm_bf16_batched2) and dequantizes a quantized B
(qmatmul.c's tl_gemm_quantized) into the float32 strips, 8 x 8 values at a time in registers on the AVX2 paths.
Except bfloat16 where the CPU has AVX512_BF16 (cpu.h's tl_cpu_bf16_dot): a plan of its own (PLAN_BF16, pairs)
packs both operands as bfloat16 k-pairs and multiplies them with vdpbf16ps (sgemm_kernels.c), two values of k per
float32 FMA's cost. 16-bit products sum in a float32 scratch and round once into C; with M <= GEMV_M they run as
gemv_half instead.

The files: this one has the plans, the loops and their threads, and the entry points; sgemm_kernels.c the
micro-kernels and the packing; sgemm_formats.c the entry points of the other formats and their GEMV;
sgemm_internal.h what they share.
*/

#include "common.h"
#include "cpu.h"
#include "formats.h"
#include "gemv.h"
#include "sgemm.h"
#include "threads.h"
#include "sgemm_internal.h"

// Below this many multiply-adds per thread, waking another thread and handing
// it the B panel cost more than the thread saves.
#ifndef TL_MIN_WORK_PER_THREAD
#define TL_MIN_WORK_PER_THREAD (64L * 64 * 64)
#endif
// A sum at least this long over rows both operands store is split in two halves of K (split_k).
#define SPLIT_K_MIN 512
// Threads per product at most: bounds the per-call flags on the stack.
#define TL_MAX_THREADS 256

// The interface before cpu.h, kept for its callers.
int tl_cpu_has_avx2_fma(void) { return tl_cpu_supports(1); }
void tl_force_portable(int on) { tl_cpu_set_path(on ? 0 : -1); }
int tl_sgemm_uses_avx2(void) { return tl_cpu_path() >= 1; }

// Threads the sgemm's entry points use (formats.h).
int tl_gemm_threads(void) { return tl_get_num_threads(); }

// common.h's scratch buffers are per translation unit: sgemm_formats.c takes sgemm.c's through this, so the
// products of every format share one set of buffers per thread.
float *sgemm_scratch(int slot, size_t n) { return tl_scratch(slot, n); }

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
    const long f = p->pairs ? 2 : (long)sizeof(float);  // bytes per value in the strips
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

// The paths' plans (cpu.h's numbers), then the bfloat16 products' on vdpbf16ps.
enum { PLAN_BF16 = 3, N_PLANS };
static gemm_plan g_plans[N_PLANS];
static pthread_once_t g_plans_once = PTHREAD_ONCE_INIT;

static void plans_init(void) {
    g_plans[0] = (gemm_plan){MR, NR, 0, 0, 0, sgemm_kernel_portable, NULL, NULL, 0};
#if defined(__x86_64__)
    g_plans[1] = (gemm_plan){MR, NR, 0, 0, 0, sgemm_kernel_avx2, sgemm_kernel_avx2_rows, sgemm_kernel_avx2_cols, 1};
    // A row-major A is packed: read in place, the 14 row pointers of a strip do not fit the registers.
    g_plans[2] = (gemm_plan){MR5, NR5, 0, 0, 0, sgemm_kernel_avx512, NULL, sgemm_kernel_avx512_cols, 1};
    // The AVX-512 tile, each k step one vdpbf16ps (two values of k) per accumulator; always packed (pairs).
    g_plans[PLAN_BF16] = (gemm_plan){MR5, NR5, 0, 0, 0, sgemm_kernel_bf16, NULL, NULL, 0, 1};
#else
    g_plans[1] = g_plans[2] = g_plans[PLAN_BF16] = g_plans[0];
#endif
    long l1 = tl_cpu_cache_size(1), l2 = tl_cpu_cache_size(2), l3 = tl_cpu_cache_size(3);
    for (int i = 0; i < N_PLANS; i++) plan_blocking(&g_plans[i], l1, l2, l3);
}

static int plan_index(int path) { return path < 0 ? 0 : path >= N_PLANS ? N_PLANS - 1 : path; }

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
const gemm_plan *sgemm_current_plan(void) {
    pthread_once(&g_plans_once, plans_init);
    int path = tl_cpu_path();
    return &g_plans[plan_index(path)];
}

const gemm_plan *sgemm_bf16_plan(void) {
    pthread_once(&g_plans_once, plans_init);
    return tl_cpu_bf16_dot() ? &g_plans[PLAN_BF16] : NULL;
}

// ----------------------------------------------------------------------------
// Driver.

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

// How the threads split a product (tl_sgemm_set_split): the rules below (thread_grid, shares_b), C's columns
// among them, or the rules' grid with each thread packing its grid column's whole B panel itself, or with the
// threads always sharing it. Which is fastest differs between CPUs (how dear it is to write lines another core
// holds, or to read those it has just written), so the tuner times them; every element is summed the same way in
// each, so they give the same bits.
enum { SPLIT_RULE, SPLIT_COLUMNS, SPLIT_PRIVATE_B, SPLIT_SHARED_B };
static int g_split = SPLIT_RULE;

void tl_sgemm_set_split(int mode) { g_split = mode > SPLIT_RULE && mode <= SPLIT_SHARED_B ? mode : SPLIT_RULE; }
int tl_sgemm_split(void) { return g_split; }

// The threads form a tm x tn grid over C: thread rows split M, thread columns
// split each B panel's strips. Splitting M is kept unless splitting N saves
// more than 1/16 of the work: the kernels before and after a product split the
// same rows (a GPT's tokens) the same way, so with M split each thread reads
// and writes rows its own core wrote and holds in cache, which matters when the
// two cores share no cache; and threads that split N must each pack the same A.
// SPLIT_COLUMNS splits N wherever there is a B strip for each thread.
static void thread_grid(int nt, long m_strips, long n_strips, int *tm, int *tn) {
    long best = -1;
    *tm = nt;
    *tn = 1;
    if (g_split == SPLIT_COLUMNS && n_strips >= nt) {
        *tm = 1;
        *tn = nt;
        return;
    }
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

// Whether the tm > 1 threads of a grid column share its B strips, each packing a chunk of them, or each packs them
// all into a panel of its own. Shared, each line a thread packs was read by the others in the last product that
// used the buffer, and where those lines are still in their caches every write has to take them back: packing a
// 256 x 256 panel back to back took 7x as long per value as packing it whole into a thread's own (perf, 2 Zen 4
// vCPUs), and the product 221 us against 184 (bench/RESULTS.md). A panel that fits in half of L2 is cheap to pack
// twice, so each thread packs its own; a larger one is shared: packing it twice reads B from memory twice.
static int shares_b(const gemm_plan *p, long N, long K, int tm) {
    if (tm <= 1 || g_split == SPLIT_PRIVATE_B) return 0;
    if (g_split == SPLIT_SHARED_B) return 1;
    long l2 = tl_cpu_cache_size(2);
    long panel = tl_min(K, p->kc) * tl_round_up(tl_min(N, p->nc), p->nr) * (long)sizeof(float);
    return panel > (l2 > 0 ? l2 : 512L << 10) / 2;
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
// strips by the column's threads, its own chunk starting at own0 (or all of them by itself: not shared).
typedef struct {
    long jc, pc, round, s0, s1, own0, chunk;
    int nc, kc, tn, tcol, shared;
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
    const long len = strip_len(pl, kc);
    int full = mc / MRp * MRp;
    if (!in_place) sgemm_pack_a(g, ic, pc, mc, kc, apack);
    else if (mc > full) sgemm_pack_a(g, ic + full, pc, mc - full, kc, apack + (long)full * len);
    for (long q = 0; q < s1 - s0; q++) {
        long s = s0 + (r->own0 - s0 + q) % (s1 - s0);  // own chunk first
        if (r->shared)  // (one load once set)
            tl_flag_wait(&sh->packed[(s - s0) / r->chunk * r->tn + r->tcol], r->round + 1);
        long jr = s * NRp;
        int nr = (int)tl_min(NRp, r->nc - jr);
        const float *bp = r->bpack + s * NRp * len;
        for (int ir = 0; ir < mc; ir += MRp) {
            int mr = (int)tl_min(MRp, mc - ir);
            float *c = g->C + (ic + ir) * g->ldc + jc + jr;
            kernel_fn kern = kernel;
            const float *ap = apack + (long)ir * len;
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
    // Where the tm > 1 threads of a grid column do not share its B panel, each packs it into a buffer of its own:
    // no other thread reads that, so one buffer and no turns to take.
    const int shared = shares_b(pl, g->N, g->K, tm);
    float *own_panel = tm > 1 && !shared
        ? tl_scratch(SLOT_B, (size_t)(tl_min(g->K, KC) * tl_round_up(tl_min(g->N, NC), NRp))) : NULL;

    gemm_round r = {.tn = tn, .tcol = tcol, .round = 0, .shared = shared};
    for (r.jc = 0; r.jc < g->N; r.jc += NC) {
        r.nc = (int)tl_min(NC, g->N - r.jc);
        long n_strips = (r.nc + NRp - 1) / NRp;
        // this thread column's strips, packed in chunks by its tm threads
        r.s0 = n_strips * tcol / tn, r.s1 = n_strips * (tcol + 1) / tn;
        r.chunk = shared ? (r.s1 - r.s0 + tm - 1) / tm : r.s1 - r.s0;
        r.own0 = shared ? tl_min(r.s1, r.s0 + trow * r.chunk) : r.s0;
        long own1 = tl_min(r.s1, r.own0 + r.chunk);
        for (r.pc = 0; r.pc < g->K; r.pc += KC, r.round++) {
            r.kc = (int)tl_min(KC, g->K - r.pc);
            r.beta = r.pc == 0 ? g->beta : 1.0f;  // later K blocks accumulate
            float *bpack = own_panel ? own_panel : sh->bpack[r.round % 2];
            r.bpack = bpack;
            // Buffer round % 2 was last read in round - 2: wait until every thread has packed round - 1, and so
            // is done with round - 2. Every thread, not only this grid column's: a strip's place in the buffer
            // depends on the round's kc, so this round's strips may overlap another column's of round - 2.
            for (int t = 0; !own_panel && t < nt; t++) tl_flag_wait(&sh->packed[t], r.round);
            sgemm_pack_b(g, r.pc, r.jc, r.nc, r.kc, r.own0, own1, bpack);
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
int sgemm_useful_threads(const gemm_plan *p, long M, long N, long K, int nt) {
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

void sgemm_gemm(const gemm_args *g, int nt) {
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
    const gemm_plan *p = sgemm_current_plan();
    gemm_args g = {transA, transB, M, N, K, A, lda, B, ldb, beta, C, ldc, p};
    const int nt = tl_get_num_threads();
    sgemm_gemm(&g, tl_gemv_applies(M, N) ? nt : sgemm_useful_threads(p, M, N, K, nt));
}

// Matrix b of a two-axis batch (b = b0 * batch1 + b1), on nt threads.
static void gemm_one(const gemm_plan *p, int batch1, long b, int transA, int transB, int M, int N, int K,
                     const float *A, long lda, long strideA0, long strideA1,
                     const float *B, long ldb, long strideB0, long strideB1,
                     float beta, float *C, long ldc, long strideC0, long strideC1, int nt) {
    long b0 = b / batch1, b1 = b % batch1;
    gemm_args g = {transA, transB, M, N, K, A + b0 * strideA0 + b1 * strideA1, lda,
                   B + b0 * strideB0 + b1 * strideB1, ldb, beta, C + b0 * strideC0 + b1 * strideC1, ldc, p};
    sgemm_gemm(&g, nt);
}

void tl_sgemm_batched(int batch, int transA, int transB, int M, int N, int K, const float *A, long lda,
                      long strideA, const float *B, long ldb, long strideB, float beta, float *C, long ldc,
                      long strideC) {
    tl_sgemm_batched2(1, batch, transA, transB, M, N, K, A, lda, 0, strideA, B, ldb, 0, strideB, beta, C, ldc, 0,
                      strideC);
}

// Threads for a batch of products spread one matrix per thread: at most one per
// matrix, and one per TL_MIN_WORK_PER_THREAD multiply-adds of the whole batch.
long sgemm_batch_threads(int nt, long batch, int M, int N, int K) {
    double work = (double)batch * M * N * K;
    return tl_min(tl_min(nt, batch), (long)(work / TL_MIN_WORK_PER_THREAD));
}

void tl_sgemm_batched2(int batch0, int batch1, int transA, int transB, int M, int N, int K,
                       const float *A, long lda, long strideA0, long strideA1,
                       const float *B, long ldb, long strideB0, long strideB1,
                       float beta, float *C, long ldc, long strideC0, long strideC1) {
    long batch = (long)batch0 * batch1;
    if (batch <= 0) return;
    const gemm_plan *p = sgemm_current_plan();
    int nt = tl_get_num_threads();
    int per_matrix = tl_gemv_applies(M, N) ? nt : sgemm_useful_threads(p, M, N, K, nt);
    // One matrix per thread at a time needs no hand-offs and no shared panel,
    // so prefer it, unless the matrices are big enough to keep all threads busy
    // on their own and the batch does not divide evenly among the threads. A
    // batch of little total work (a decode step's per-head products) stays on
    // fewer threads: waking one costs more than its share of the products.
    long over_batch = sgemm_batch_threads(nt, batch, M, N, K);
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
