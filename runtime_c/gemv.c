/*
GEMV: C = op(A) op(B) + beta C with M <= 4 (decoding: a token's row times a weight), or its mirror N <= 4 run
as C^T = op(B)^T op(A)^T. The weight W is read once, straight from where it is, at memory bandwidth: packing it
as the sgemm does would read it and write it once more. The few rows of the other operand ("x", up to
GEMV_M x K) are read in place when they are rows, else gathered into a contiguous buffer first. W is either
"rows" (stored K x n, W[p*ldw + j]: a row of W feeds a run of outputs) or "cols" (stored n x K, W[j*ldw + p]:
an output is a dot product along a row of W). Two or more threads each read one contiguous share of W
(gemv_run).

Runs of W are read whole, a row of the thread's share at a time: one long stream in address order is what
the hardware prefetchers follow best (shorter runs, say to keep the sums in L1, halved the bandwidth). Each
value of W meets m values of x, and the operand reused along the run (the m x n sums of a rows kernel, the
m x K of x of a cols kernel) is loaded once per value of W too: where it does not fit in L1 (GEMV_L1 floats)
the kernels read several rows of W at once instead (GEMV_ROWS for a rows kernel, GEMV_DOTS_X for a cols kernel),
loading it once per few values of W, and so they do where a row of W spans a 4 KiB page (gemv_one_stream).
With several rows at once the prefetchers follow several streams at once, slower where the rows are short (a
cols kernel reading 4 or 8 rows of 384 floats at once streamed at half the rate of one row at a time). Where a
stream enters a new 4 KiB page, the kernels ask for the start of the next one (gemv_page_ahead), which the
hardware prefetchers cannot do. With two or more rows of x, where each value of W costs several FMAs, the
hardware prefetchers alone no longer keep enough of W in flight: those kernels also ask for every line of W some
8 KiB ahead of where they read (gemv_ahead).
*/

#include <stdint.h>

#include "common.h"
#include "cpu.h"
#include "gemv.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2,fma")))
#define AVX512 __attribute__((target("avx2,fma,avx512f")))
#endif

enum { SLOT_OUT, SLOT_X, SLOT_PARTS };  // per-thread scratch slots (common.h: this file's own, apart from sgemm.c's)

#define GEMV_COLS 4096  // outputs per pass of a rows kernel: GEMV_M x GEMV_COLS sums (64 KiB) stay in L2
#define GEMV_L1 3072    // floats of the reused operand (12 KiB) that leave room in L1 for W's stream
#define GEMV_ROWS 8     // rows of W per pass of a rows kernel whose sums do not fit in L1
#define GEMV_DOTS 8     // the most rows of W per pass of a cols kernel
// Floats of W per thread below which another thread costs more than it saves: the second thread starts at 128 Ki
// floats (512 KiB). Measured with W in cache, M = 1 (Zen 4): 2 threads took 8.2 us at 256 x 512 against 11.3 on one,
// and gained nothing at 256 x 256.
#define GEMV_MIN_PER_THREAD (64L << 10)
// Shares of K a large rows-layout W is summed in (gemv_rows_split): threads beyond this many gain nothing on a
// product that streams W from memory, which one or two cores' loads already keep busy.
#define GEMV_PARTS 8
// kernel(M, ...) with the row count m (1..GEMV_M) as a compile-time constant, so its loops over rows unroll
#define GEMV_BY_M(m, kernel, ...)                       \
    do {                                                \
        switch (m) {                                    \
        case 1: kernel(1, __VA_ARGS__); break;          \
        case 2: kernel(2, __VA_ARGS__); break;          \
        case 3: kernel(3, __VA_ARGS__); break;          \
        default: kernel(GEMV_M, __VA_ARGS__); break;    \
        }                                               \
    } while (0)

// Called at each step of a stream through W, `step` bytes long: where the step enters a new 4 KiB page, asks
// for the first 4 cache lines of the page after it. The hardware prefetchers stop at page boundaries (they see
// physical addresses) and have to pick the stream up again on every new page; with its first lines already on
// their way they do so without a stall. Weights on 4 KiB pages (numpy puts arrays under 4 MiB there, which is
// most of a small model's weights) streamed 15-40 % faster with it on Zen 4 (M = 1, K x N = 384 x 1152 to
// 768 x 768, one thread: 22-25 GB/s against 17-20; the same weights carved from one huge-page array: 26); on
// huge pages, where it has nothing to do, it cost 5-20 % (K = N = 2048 and 4096), so it is only on (pa) for a W
// that spans under 8 MiB. numpy asks for huge pages from 4 MiB up, but only the 2 MiB-aligned stretches inside
// an array get them, so one of 4 MiB lies mostly on 4 KiB pages (1024 x 1024, M = 1, one thread: 25 GB/s with
// it, 17-20 without). 2 or 8 lines,
// two pages ahead, or into L2 only did no better, and a prefetch on every line (1-8 KiB ahead) slowed the stream.
static inline __attribute__((always_inline)) void gemv_page_ahead(const int pa, const float *a, long step) {
    if (pa && ((uintptr_t)a & 4095) < (uintptr_t)step)
        for (int l = 0; l < 4; l++) __builtin_prefetch((const char *)a + 4096 + 64 * l, 0, 3);
}

// Where a kernel reading `rows` rows of W at a time (ldw floats apart) asks for the line it will read next at the
// same place: the same column of a later block of rows, the first block at least GEMV_AHEAD bytes on, in floats.
// Into L2 (a T1 hint): L1 has no room for 8 KiB more. At M = 2-4, one thread, W from memory (Zen 4), this took
// x W and x W^T from 12-20 GB/s to 19-28 at K x N = 384 x 1152 to 4096 x 4096; 16 KiB did as well on the large
// shapes and worse on the small, 2 KiB did worse. At M = 1 it cost 0-20 %: that kernel's loop outruns memory
// already, and the hardware prefetchers keep up with it alone.
#define GEMV_AHEAD 8192L
static inline long gemv_ahead(long ldw, int rows) {
    const long block = rows * ldw * (long)sizeof(float);
    return block > 0 ? (GEMV_AHEAD + block - 1) / block * rows * ldw : 0;  // ldw 0: one row of W, or a broadcast
}

// Asks for the line at a + ahead in each of `rows` rows of W (ldw floats apart), into L2 (locality 2: T1).
static inline __attribute__((always_inline)) void gemv_rows_ahead(const float *a, long ahead, long ldw, int rows) {
    for (int r = 0; r < rows; r++) __builtin_prefetch(a + r * ldw + ahead, 0, 2);
}

// Whether a kernel reads one row of W at a time, a single stream: where the operand it reuses along a row
// (`reused` floats) fits in L1 and the row (`row` floats) is shorter than a 4 KiB page. A single stream stalls at
// every page boundary, where the hardware prefetchers stop; several rows at once keep several pages in flight.
// Zen 3 (AVX2 only), M = 1, one thread, W from memory: x W^T at 1024^2 7.4 -> 11.5 GB/s and 2048^2 12.1 -> 15.9,
// x W at 2048^2 9.7 -> 13.5 and at 384 x 1152 (rows of 1152 floats) 6.6 -> 8.8; M = 4 unchanged. Shorter rows
// stay one at a time: more streams there cost (Zen 4, K = 384: 10-12 GB/s with 8 rows against 17-19 with one).
static inline int gemv_one_stream(long reused, long row) { return reused <= GEMV_L1 && row < 1024; }

typedef struct {
    int m;            // rows of x: 1..GEMV_M
    long n, k;        // outputs per row of x, length of the sums
    const float *x;   // x[i*ldx + p]
    long ldx;
    const float *w;   // the weight: W[p*ldw + j] (w_cols 0) or W[j*ldw + p] (w_cols 1)
    long ldw;
    int w_cols;
    int page_ahead;   // gemv_page_ahead's prefetches on
    float beta;
    float *y;         // output (i, j) at y[i*ys_i + j*ys_j]
    long ys_i, ys_j;
} gemv_args;

// Sum kernels, per path: out[i*n + j] = sum_p x[i*ldx + p] W(p, j) for i < m, j < n, p < k; n <= GEMV_COLS
// for a rows kernel.
typedef void (*gemv_fn)(int m, int pa, long k, const float *x, long ldx, const float *w, long ldw, long n, float *out);

static void gemv_rows_portable(int m, int pa, long k, const float *restrict x, long ldx, const float *restrict w,
                               long ldw, long n, float *restrict out) {
    (void)pa;
    memset(out, 0, (size_t)m * n * sizeof(float));
    for (long p = 0; p < k; p++) {
        const float *wp = w + p * ldw;
        for (int i = 0; i < m; i++) {
            const float xi = x[i * ldx + p];
            float *o = out + i * n;
            for (long j = 0; j < n; j++) o[j] += xi * wp[j];
        }
    }
}

// Eight partial sums per dot product, so the compiler vectorises it without reassociating anything.
static float dot_portable(long k, const float *restrict x, const float *restrict w) {
    float s[8] = {0};
    long p = 0;
    for (; p + 8 <= k; p += 8)
        for (int l = 0; l < 8; l++) s[l] += x[p + l] * w[p + l];
    for (; p < k; p++) s[0] += x[p] * w[p];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

static void gemv_cols_portable(int m, int pa, long k, const float *x, long ldx, const float *w, long ldw, long n,
                               float *out) {
    (void)pa;
    for (long j = 0; j < n; j++)
        for (int i = 0; i < m; i++) out[i * n + j] = dot_portable(k, x + i * ldx, w + j * ldw);
}

// The grouping tl_gemv_set_grouping chose: rows of W per pass of a cols kernel where a row is read as one stream
// (gemv_one_stream) and where it is not, 0 for the measured rule (1 and GEMV_DOTS_X); the page-ahead prefetches
// on (1), off (0) or by W's size (-1, tl_gemv).
static int gemv_short_rows = 0, gemv_long_rows = 0, gemv_page = -1;

static int gemv_grouping(int rows) { return rows == 1 || rows == 2 || rows == 4 || rows == 8 ? rows : 0; }

void tl_gemv_set_grouping(int short_rows, int long_rows, int page_ahead) {
    gemv_short_rows = gemv_grouping(short_rows);
    gemv_long_rows = gemv_grouping(long_rows);
    gemv_page = page_ahead < 0 ? -1 : page_ahead != 0;
}

#if defined(__x86_64__)
// Rows kernel: RP rows of W per pass over the M x n sums. M, PA and RP are compile-time constants in each instance
// (the dispatcher below), so the loops over them unroll and the broadcasts of x stay in registers where they fit.
AVX2 static inline __attribute__((always_inline)) void
gemv_rows_avx2_m(const int M, const int PA, const int RP, long k, const float *x, long ldx,
                 const float *w, long ldw, long n, float *out) {
    const long n8 = n / 8 * 8, ahead = gemv_ahead(ldw, RP);
    memset(out, 0, (size_t)M * n * sizeof(float));
    long p = 0;
    for (; p + RP <= k; p += RP) {
        const float *wp = w + p * ldw;
        __m256 xv[GEMV_M][GEMV_ROWS];
        for (int i = 0; i < M; i++)
            for (int q = 0; q < RP; q++) xv[i][q] = _mm256_set1_ps(x[i * ldx + p + q]);
        for (long j = 0; j < n8; j += 8) {
            __m256 v[GEMV_ROWS];
            for (int q = 0; q < RP; q++) gemv_page_ahead(PA, wp + q * ldw + j, 32);
            if (M > 1 && j % 16 == 0) gemv_rows_ahead(wp + j, ahead, ldw, RP);  // once per 64-byte line
            for (int q = 0; q < RP; q++) v[q] = _mm256_loadu_ps(wp + q * ldw + j);
            for (int i = 0; i < M; i++) {
                __m256 s = _mm256_loadu_ps(out + i * n + j);
                for (int q = 0; q < RP; q++) s = _mm256_fmadd_ps(xv[i][q], v[q], s);
                _mm256_storeu_ps(out + i * n + j, s);
            }
        }
        for (long j = n8; j < n; j++)
            for (int i = 0; i < M; i++) {
                float s = out[i * n + j];
                for (int q = 0; q < RP; q++) s += x[i * ldx + p + q] * wp[q * ldw + j];
                out[i * n + j] = s;
            }
    }
    for (; p < k; p++)
        for (int i = 0; i < M; i++)
            for (long j = 0; j < n; j++) out[i * n + j] += x[i * ldx + p] * w[p * ldw + j];
}

AVX2 static void gemv_rows_avx2(int m, int pa, long k, const float *x, long ldx, const float *w, long ldw,
                                long n, float *out) {
    if (gemv_one_stream(m * n, n) && pa)
        GEMV_BY_M(m, gemv_rows_avx2_m, 1, 1, k, x, ldx, w, ldw, n, out);
    else if (gemv_one_stream(m * n, n))
        GEMV_BY_M(m, gemv_rows_avx2_m, 0, 1, k, x, ldx, w, ldw, n, out);
    else if (pa)
        GEMV_BY_M(m, gemv_rows_avx2_m, 1, GEMV_ROWS, k, x, ldx, w, ldw, n, out);
    else
        GEMV_BY_M(m, gemv_rows_avx2_m, 0, GEMV_ROWS, k, x, ldx, w, ldw, n, out);
}

AVX2 static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// Lane r: the sum of the 8 lanes of the r-th argument. Four dot products finish in 3 adds and 3 shuffles where
// four hsum256 take 4 times that.
AVX2 static inline __m128 hsum4x256(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

// out[i*n + r] = sum of the lanes of s[i*R + r], for the M x R accumulators of a cols kernel, four at a time.
AVX2 static inline __attribute__((always_inline)) void
gemv_finish_avx2(const int M, const int R, const __m256 *s, long n, float *out) {
    float t[GEMV_M * GEMV_DOTS];
    int q = 0;
    for (; q + 4 <= M * R; q += 4) _mm_storeu_ps(t + q, hsum4x256(s[q], s[q + 1], s[q + 2], s[q + 3]));
    for (; q < M * R; q++) t[q] = hsum256(s[q]);
    for (int i = 0; i < M; i++)
        for (int r = 0; r < R; r++) out[i * n + r] = t[i * R + r];
}

// Floats of a cols kernel's W rows before their first 64-byte boundary, the same in every row (ldw a multiple of
// 16 floats), taken first through the masked step so that the main loop's loads never straddle two cache lines.
// NumPy's large arrays start 16 bytes past a line: at M = 4, one thread, W from memory (Zen 4), x W^T ran 10-16 %
// slower on those than with W on a line (K x N = 1536 x 384, 1024^2-4096^2).
static inline long gemv_head(const float *w, long ldw, long k) {
    const long head = (long)((64 - ((uintptr_t)w & 63)) & 63) / (long)sizeof(float);
    return ldw % 16 == 0 && k >= head + 64 ? head : 0;
}

// s[i*R + r] += x(i, p + l) W(r, p + l) for the lanes l < c (<= 8): the cols kernel's masked step.
AVX2 static inline __attribute__((always_inline)) void
gemv_dots_masked_avx2(const int M, const int R, long p, long c, const float *x, long ldx, const float *w, long ldw,
                      __m256 *s) {
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256 v[GEMV_DOTS];
    for (int r = 0; r < R; r++) v[r] = _mm256_maskload_ps(w + r * ldw + p, mask);
    for (int i = 0; i < M; i++) {
        __m256 xi = _mm256_maskload_ps(x + i * ldx + p, mask);
        for (int r = 0; r < R; r++) s[i * R + r] = _mm256_fmadd_ps(xi, v[r], s[i * R + r]);
    }
}

// Cols kernel: R rows of W (R outputs) against the M rows of x, 16 values of k (a cache line of each row) per
// step, into two sets of accumulators when there are fewer than 8 (more independent FMA chains to cover an FMA's
// 4-cycle latency on each of 2 pipes); the few before W's rows reach a line (gemv_head) and the last few through
// the masked step (lanes past them read as zero).
AVX2 static inline __attribute__((always_inline)) void
gemv_dots_avx2(const int M, const int PA, const int R, long k, const float *x, long ldx,
               const float *w, long ldw, long n, float *out) {
    const int U = M * R >= 8 ? 1 : 2;
    // one row at a time (x in L1): peeling cost more than it saved (384 x 1152 to 768 x 768, M = 4: -45 %)
    const long ahead = gemv_ahead(ldw, R), head = R > 1 ? gemv_head(w, ldw, k) : 0;
    __m256 s[2][GEMV_M * GEMV_DOTS];
    for (int u = 0; u < U; u++)
        for (int q = 0; q < M * R; q++) s[u][q] = _mm256_setzero_ps();
    for (long h = 0; h < head; h += 8) gemv_dots_masked_avx2(M, R, h, tl_min(8, head - h), x, ldx, w, ldw, s[0]);
    long p = head;
    for (; p + 16 <= k; p += 16) {
        for (int r = 0; r < R; r++) gemv_page_ahead(PA, w + r * ldw + p, 64);
        if (M > 1) gemv_rows_ahead(w + p, ahead, ldw, R);
        for (int u = 0; u < 2; u++) {
            __m256 v[GEMV_DOTS];
            for (int r = 0; r < R; r++) v[r] = _mm256_loadu_ps(w + r * ldw + p + 8 * u);
            for (int i = 0; i < M; i++) {
                __m256 xi = _mm256_loadu_ps(x + i * ldx + p + 8 * u);
                for (int r = 0; r < R; r++)
                    s[u % U][i * R + r] = _mm256_fmadd_ps(xi, v[r], s[u % U][i * R + r]);
            }
        }
    }
    for (; p < k; p += 8) gemv_dots_masked_avx2(M, R, p, tl_min(8, k - p), x, ldx, w, ldw, s[0]);
    for (int u = 1; u < U; u++)
        for (int q = 0; q < M * R; q++) s[0][q] = _mm256_add_ps(s[0][q], s[u][q]);
    gemv_finish_avx2(M, R, s[0], n, out);
}

// Rows of W per pass of a cols kernel whose x does not fit in L1, for M rows of x: each x value is then loaded
// once per R values of W. Measured on Zen 4 at K = 4096 from memory: M = 1 with R = 8 streamed 5-20 % faster than
// with 4; M = 4 with R = 4 (16 accumulators, spilling some) 15-25 % faster than with 2. Where x fits in L1 the
// kernels read one row at a time instead: every extra stream cost (R = 8 for M = 1: 10-12 GB/s against 17-19
// at K = 384, one thread; M = 4 halved).
#define GEMV_DOTS_X(M) ((M) == 1 ? 8 : 4)

// R rows of W at a time (R streams side by side); the last rows (fewer than R) go by 4, 2 and 1.
#define GEMV_COLS_BY_R(dots, R, M, PA, k, x, ldx, w, ldw, n, out)                                        \
    do {                                                                                             \
        long j_ = 0;                                                                                 \
        for (; j_ + (R) <= (n); j_ += (R)) dots(M, PA, R, k, x, ldx, (w) + j_ * (ldw), ldw, n, (out) + j_); \
        if ((R) > 4 && j_ + 4 <= (n)) dots(M, PA, 4, k, x, ldx, (w) + j_ * (ldw), ldw, n, (out) + j_), j_ += 4; \
        if ((R) > 2 && j_ + 2 <= (n)) dots(M, PA, 2, k, x, ldx, (w) + j_ * (ldw), ldw, n, (out) + j_), j_ += 2; \
        for (; j_ < (n); j_++) dots(M, PA, 1, k, x, ldx, (w) + j_ * (ldw), ldw, n, (out) + j_);            \
    } while (0)

// Rows of W per pass of a cols kernel with M rows of x and rows of k floats; never more than GEMV_DOTS_X(M), whose
// M x R accumulators fit the registers.
static inline int gemv_cols_rows(int M, long k) {
    const int chosen = gemv_one_stream(M * k, k) ? (gemv_short_rows ? gemv_short_rows : 1)
                                                  : (gemv_long_rows ? gemv_long_rows : GEMV_DOTS_X(M));
    return chosen < GEMV_DOTS_X(M) ? chosen : GEMV_DOTS_X(M);
}

// GEMV_COLS_BY_R with R (1, 2, 4 or 8) known only at run time: each case a compile-time R.
#define GEMV_COLS_GROUPED(dots, R, ...)                      \
    do {                                                      \
        switch (R) {                                          \
        case 8: GEMV_COLS_BY_R(dots, 8, __VA_ARGS__); break;  \
        case 4: GEMV_COLS_BY_R(dots, 4, __VA_ARGS__); break;  \
        case 2: GEMV_COLS_BY_R(dots, 2, __VA_ARGS__); break;  \
        default: GEMV_COLS_BY_R(dots, 1, __VA_ARGS__); break; \
        }                                                     \
    } while (0)

AVX2 static inline __attribute__((always_inline)) void
gemv_cols_avx2_m(const int M, const int PA, long k, const float *x, long ldx,
                 const float *w, long ldw, long n, float *out) {
    GEMV_COLS_GROUPED(gemv_dots_avx2, gemv_cols_rows(M, k), M, PA, k, x, ldx, w, ldw, n, out);
}

AVX2 static void gemv_cols_avx2(int m, int pa, long k, const float *x, long ldx, const float *w, long ldw,
                                long n, float *out) {
    if (pa)
        GEMV_BY_M(m, gemv_cols_avx2_m, 1, k, x, ldx, w, ldw, n, out);
    else
        GEMV_BY_M(m, gemv_cols_avx2_m, 0, k, x, ldx, w, ldw, n, out);
}

// The AVX-512 twins of the kernels above: 16 lanes, masked loads and stores for the ragged ends.
AVX512 static inline __attribute__((always_inline)) void
gemv_rows_avx512_m(const int M, const int PA, const int RP, long k, const float *x, long ldx,
                   const float *w, long ldw, long n, float *out) {
    const long ahead = gemv_ahead(ldw, RP);
    memset(out, 0, (size_t)M * n * sizeof(float));
    long p = 0;
    for (; p + RP <= k; p += RP) {
        const float *wp = w + p * ldw;
        __m512 xv[GEMV_M][GEMV_ROWS];
        for (int i = 0; i < M; i++)
            for (int q = 0; q < RP; q++) xv[i][q] = _mm512_set1_ps(x[i * ldx + p + q]);
        for (long j = 0; j < n; j += 16) {
            const __mmask16 mask = n - j >= 16 ? 0xFFFF : (__mmask16)((1u << (n - j)) - 1);
            __m512 v[GEMV_ROWS];
            for (int q = 0; q < RP; q++) gemv_page_ahead(PA, wp + q * ldw + j, 64);
            if (M > 1) gemv_rows_ahead(wp + j, ahead, ldw, RP);
            for (int q = 0; q < RP; q++) v[q] = _mm512_maskz_loadu_ps(mask, wp + q * ldw + j);
            for (int i = 0; i < M; i++) {
                __m512 s = _mm512_maskz_loadu_ps(mask, out + i * n + j);
                for (int q = 0; q < RP; q++) s = _mm512_fmadd_ps(xv[i][q], v[q], s);
                _mm512_mask_storeu_ps(out + i * n + j, mask, s);
            }
        }
    }
    for (; p < k; p++)
        for (int i = 0; i < M; i++)
            for (long j = 0; j < n; j++) out[i * n + j] += x[i * ldx + p] * w[p * ldw + j];
}

AVX512 static void gemv_rows_avx512(int m, int pa, long k, const float *x, long ldx, const float *w, long ldw,
                                    long n, float *out) {
    if (gemv_one_stream(m * n, n) && pa)
        GEMV_BY_M(m, gemv_rows_avx512_m, 1, 1, k, x, ldx, w, ldw, n, out);
    else if (gemv_one_stream(m * n, n))
        GEMV_BY_M(m, gemv_rows_avx512_m, 0, 1, k, x, ldx, w, ldw, n, out);
    else if (pa)
        GEMV_BY_M(m, gemv_rows_avx512_m, 1, GEMV_ROWS, k, x, ldx, w, ldw, n, out);
    else
        GEMV_BY_M(m, gemv_rows_avx512_m, 0, GEMV_ROWS, k, x, ldx, w, ldw, n, out);
}

// The 8 lanes of v's two halves added.
AVX512 static inline __m256 fold512(__m512 v) {
    return _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}

AVX512 static inline __attribute__((always_inline)) void
gemv_dots_avx512(const int M, const int PA, const int R, long k, const float *x, long ldx,
                 const float *w, long ldw, long n, float *out) {
    const int U = M * R >= 8 ? 1 : 2;
    const long ahead = gemv_ahead(ldw, R);
    __m512 s[2][GEMV_M * GEMV_DOTS];
    for (int u = 0; u < U; u++)
        for (int q = 0; q < M * R; q++) s[u][q] = _mm512_setzero_ps();
    long p = 0;
    for (; p + 16 * U <= k; p += 16 * U) {
        for (int r = 0; r < R; r++) gemv_page_ahead(PA, w + r * ldw + p, 64 * U);
        if (M > 1)
            for (int u = 0; u < U; u++) gemv_rows_ahead(w + p + 16 * u, ahead, ldw, R);
        for (int u = 0; u < U; u++) {
            __m512 v[GEMV_DOTS];
            for (int r = 0; r < R; r++) v[r] = _mm512_loadu_ps(w + r * ldw + p + 16 * u);
            for (int i = 0; i < M; i++) {
                __m512 xi = _mm512_loadu_ps(x + i * ldx + p + 16 * u);
                for (int r = 0; r < R; r++) s[u][i * R + r] = _mm512_fmadd_ps(xi, v[r], s[u][i * R + r]);
            }
        }
    }
    for (; p < k; p += 16) {
        const __mmask16 mask = k - p >= 16 ? 0xFFFF : (__mmask16)((1u << (k - p)) - 1);
        __m512 v[GEMV_DOTS];
        for (int r = 0; r < R; r++) v[r] = _mm512_maskz_loadu_ps(mask, w + r * ldw + p);
        for (int i = 0; i < M; i++) {
            __m512 xi = _mm512_maskz_loadu_ps(mask, x + i * ldx + p);
            for (int r = 0; r < R; r++) s[0][i * R + r] = _mm512_fmadd_ps(xi, v[r], s[0][i * R + r]);
        }
    }
    __m256 h[GEMV_M * GEMV_DOTS];
    for (int q = 0; q < M * R; q++) h[q] = fold512(U == 2 ? _mm512_add_ps(s[0][q], s[1][q]) : s[0][q]);
    gemv_finish_avx2(M, R, h, n, out);
}

AVX512 static inline __attribute__((always_inline)) void
gemv_cols_avx512_m(const int M, const int PA, long k, const float *x, long ldx,
                   const float *w, long ldw, long n, float *out) {
    GEMV_COLS_GROUPED(gemv_dots_avx512, gemv_cols_rows(M, k), M, PA, k, x, ldx, w, ldw, n, out);
}

AVX512 static void gemv_cols_avx512(int m, int pa, long k, const float *x, long ldx, const float *w, long ldw,
                                    long n, float *out) {
    if (pa)
        GEMV_BY_M(m, gemv_cols_avx512_m, 1, k, x, ldx, w, ldw, n, out);
    else
        GEMV_BY_M(m, gemv_cols_avx512_m, 0, k, x, ldx, w, ldw, n, out);
}
#endif  // __x86_64__

static gemv_fn gemv_kernel(int path, int w_cols) {
#if defined(__x86_64__)
    if (path >= 2) return w_cols ? gemv_cols_avx512 : gemv_rows_avx512;
    if (path == 1) return w_cols ? gemv_cols_avx2 : gemv_rows_avx2;
#else
    (void)path;
#endif
    return w_cols ? gemv_cols_portable : gemv_rows_portable;
}

// y(i, j0 + j) = out[i*n + j] + beta * y(i, j0 + j); beta == 0 never reads y.
static void gemv_store(const gemv_args *v, long j0, long n, const float *out) {
    for (int i = 0; i < v->m; i++)
        for (long j = 0; j < n; j++) {
            float *y = v->y + i * v->ys_i + (j0 + j) * v->ys_j;
            *y = v->beta == 0.0f ? out[i * n + j] : out[i * n + j] + v->beta * *y;
        }
}

// Outputs [j0, j1) of the product: a rows kernel in passes of at most GEMV_COLS outputs, a cols kernel in
// passes whose m x n sums fill the same buffer.
static void gemv_range(const gemv_args *v, gemv_fn kernel, long j0, long j1) {
    const long pass = v->w_cols ? GEMV_M * GEMV_COLS / v->m : GEMV_COLS;
    float *out = tl_scratch(SLOT_OUT, (size_t)GEMV_M * GEMV_COLS);
    for (long j = j0; j < j1; j += pass) {
        long n = tl_min(pass, j1 - j);
        const float *w = v->w_cols ? v->w + j * v->ldw : v->w + j;
        kernel(v->m, v->page_ahead, v->k, v->x, v->ldx, w, v->ldw, n, out);
        gemv_store(v, j, n, out);
    }
}

// Rows [k0, k1) of a rows-layout W into this thread's partial sums `part`, laid out as gemv_range's passes
// (pass jb, np outputs wide: element (i, j) at part[m*jb + i*np + j - jb]).
static void gemv_rows_part(const gemv_args *v, gemv_fn kernel, long k0, long k1, float *part) {
    for (long jb = 0; jb < v->n; jb += GEMV_COLS)
        kernel(v->m, v->page_ahead, k1 - k0, v->x + k0, v->ldx, v->w + k0 * v->ldw + jb, v->ldw,
               tl_min(GEMV_COLS, v->n - jb), part + v->m * jb);
}

// Outputs [j0, j1) = the sum of the nt partial sums (each m x n, consecutive in parts) + beta y.
static void gemv_reduce(const gemv_args *v, const float *parts, int nt, long j0, long j1) {
    const long size = v->m * v->n;
    for (long j = j0; j < j1; j++) {
        const long jb = j / GEMV_COLS * GEMV_COLS, np = tl_min(GEMV_COLS, v->n - jb);
        for (int i = 0; i < v->m; i++) {
            const float *e = parts + v->m * jb + i * np + (j - jb);
            float s = 0.0f;
            for (int t = 0; t < nt; t++) s += e[t * size];
            float *y = v->y + i * v->ys_i + j * v->ys_j;
            *y = v->beta == 0.0f ? s : s + v->beta * *y;
        }
    }
}

// A rows-layout W in `parts` shares of K, each summed into its own partial sums, added in order at the end. The
// shares follow from the sizes alone, not from the thread count, so the sums are the same on any number of
// threads (which the automatic count changes between calls: threads.h); the threads each take a contiguous run of
// shares, so each reads a contiguous share of W.
static void gemv_rows_split(const gemv_args *v, gemv_fn kernel, int parts, int nt) {
    float *sums = tl_scratch(SLOT_PARTS, (size_t)parts * v->m * v->n);
#pragma omp parallel num_threads((int)tl_min(nt, parts))
    {
        const int t = tl_omp_thread_num(), n = tl_omp_num_threads();
        for (long p = (long)parts * t / n; p < (long)parts * (t + 1) / n; p++)
            gemv_rows_part(v, kernel, v->k * p / parts, v->k * (p + 1) / parts, sums + p * v->m * v->n);
#pragma omp barrier
        gemv_reduce(v, sums, parts, v->n * t / n, v->n * (t + 1) / n);
    }
}

// The threads split the outputs of a cols-layout W: each reads whole rows of W, a contiguous share of it. A
// rows-layout W they split along K instead (gemv_rows_split), where splitting the outputs would have each read
// half of every row, two streams of runs half as long, at half the bandwidth.
static void gemv_run(const gemv_args *v, int nt) {
    const gemv_fn kernel = gemv_kernel(tl_cpu_path(), v->w_cols);
    const long useful = tl_max(1, v->n * v->k / GEMV_MIN_PER_THREAD);  // threads worth their start
    if (!v->w_cols && useful > 1) {
        gemv_rows_split(v, kernel, (int)tl_min(useful, GEMV_PARTS), nt);
        return;
    }
    nt = (int)tl_min(nt, useful);
    if (nt <= 1) {
        gemv_range(v, kernel, 0, v->n);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        const int t = tl_omp_thread_num(), n = tl_omp_num_threads();
        gemv_range(v, kernel, v->n * t / n, v->n * (t + 1) / n);
    }
}

// The m x K rows x(i, p) = src[i*rs + p*ks] as x[i*k + p] in this thread's scratch.
static const float *gemv_gather(int m, long k, const float *src, long rs, long ks) {
    float *x = tl_scratch(SLOT_X, (size_t)m * k);
    for (long p = 0; p < k; p++)
        for (int i = 0; i < m; i++) x[i * k + p] = src[i * rs + p * ks];
    return x;
}

int tl_gemv_takes(long M, long N) { return tl_gemv_applies(M, N); }

void tl_gemv(int transA, int transB, long M, long N, long K, const float *A, long lda, const float *B, long ldb,
             float beta, float *C, long ldc, int nt) {
    gemv_args v;
    v.beta = beta;
    v.k = K;
    v.y = C;
    if (M <= GEMV_M) {  // x = the rows of op(A), W = op(B)
        v.m = (int)M;
        v.n = N;
        v.x = transA ? gemv_gather(v.m, K, A, 1, lda) : A;
        v.ldx = transA ? K : lda;
        v.w = B;
        v.ldw = ldb;
        v.w_cols = transB;
        v.ys_i = ldc;
        v.ys_j = 1;
    } else {  // C^T: x = the columns of op(B), W = op(A)^T
        v.m = (int)N;
        v.n = M;
        v.x = transB ? B : gemv_gather(v.m, K, B, 1, ldb);
        v.ldx = transB ? ldb : K;
        v.w = A;
        v.ldw = lda;
        v.w_cols = !transA;
        v.ys_i = 1;
        v.ys_j = ldc;
    }
    // gemv_page_ahead for a W that spans under 8 MiB (2 Mi floats): mostly on 4 KiB pages
    v.page_ahead = gemv_page >= 0 ? gemv_page
                                  : ((v.w_cols ? v.n : v.k) - 1) * v.ldw + (v.w_cols ? v.k : v.n) < (2L << 20);
    gemv_run(&v, nt);
}
