// Embedding gather and scatter-add (see embedding.h).
#include <string.h>

#include "common.h"
#include "embedding.h"
#include "sgemm.h"
#include "threads.h"

#define PARALLEL_MIN (1L << 15)  // below this many elements a kernel runs on one thread

static long first_bad_index(const int64_t *idx, long m, long n) {
    for (long j = 0; j < m; j++) {
        if (idx[j] < -n || idx[j] >= n) return j;
    }
    return -1;
}

static inline long row_of(long k, long n) { return k < 0 ? k + n : k; }

long embedding_forward(void *out, const void *table, const int64_t *idx, long outer, long n, long m, long inner,
                       long size) {
    long bad = first_bad_index(idx, m, n);
    if (bad >= 0) return bad;
    const long row = inner * size;  // bytes
    int nt = outer * m * inner >= PARALLEL_MIN ? tl_get_num_threads() : 1;
#pragma omp parallel for collapse(2) num_threads(nt) schedule(static)
    for (long o = 0; o < outer; o++) {
        for (long j = 0; j < m; j++) {
            memcpy((char *)out + (o * m + j) * row, (const char *)table + (o * n + row_of(idx[j], n)) * row,
                   (size_t)row);
        }
    }
    return -1;
}

long embedding_backward(float *dtable, const float *dout, const int64_t *idx, long outer, long n, long m, long inner) {
    long bad = first_bad_index(idx, m, n);
    if (bad >= 0) return bad;
    memset(dtable, 0, (size_t)(outer * n * inner) * sizeof(float));
    // Threads split the columns (o, i): every thread walks all m indices over its own columns, so two threads
    // never add into the same element and the sums come out in index order, whatever the thread count.
    int nt = outer * m * inner >= PARALLEL_MIN ? tl_get_num_threads() : 1;
#pragma omp parallel num_threads(nt)
    {
        long columns = outer * inner, t = tl_omp_thread_num(), threads = tl_omp_num_threads();
        long begin = columns * t / threads, end = columns * (t + 1) / threads;
        for (long o = begin / inner; o <= (end - 1) / inner && begin < end; o++) {
            long i0 = o == begin / inner ? begin % inner : 0;
            long i1 = o == (end - 1) / inner ? (end - 1) % inner + 1 : inner;
            for (long j = 0; j < m; j++) {
                float *dst = dtable + (o * n + row_of(idx[j], n)) * inner;
                const float *src = dout + (o * m + j) * inner;
                for (long i = i0; i < i1; i++) dst[i] += src[i];
            }
        }
    }
    return -1;
}
