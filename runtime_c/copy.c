// Strided copies (see copy.h).
#include <string.h>

#include "common.h"
#include "copy.h"
#include "sgemm.h"
#include "threads.h"

#define PARALLEL_MIN_BYTES (1L << 18)  // below this a copy runs on one thread: waking a team costs more
#define SHORT_RUN 512  // rows up to this many bytes move 16 at a time inline (attention's heads: 128)

void tl_copy(long elem, long n0, long n1, long n2, long n3, char *dst, long d0, long d1, long d2, long d3,
             const char *src, long s0, long s1, long s2, long s3) {
    const int nt = n0 * n1 * n2 * n3 * elem >= PARALLEL_MIN_BYTES ? tl_get_num_threads() : 1;
    const int run = d3 == elem && s3 == elem;  // innermost axis contiguous in both: one memcpy per row
    const long bytes = n3 * elem;
#pragma omp parallel for collapse(3) num_threads(nt) schedule(static)
    for (long i0 = 0; i0 < n0; i0++) {
        for (long i1 = 0; i1 < n1; i1++) {
            for (long i2 = 0; i2 < n2; i2++) {
                char *d = dst + i0 * d0 + i1 * d1 + i2 * d2;
                const char *s = src + i0 * s0 + i1 * s1 + i2 * s2;
                if (run && bytes <= SHORT_RUN && bytes % 16 == 0) {  // a memcpy call costs more than its moves
                    for (long b = 0; b < bytes; b += 16) memcpy(d + b, s + b, 16);
                } else if (run) {
                    memcpy(d, s, (size_t)bytes);
                } else if (elem == 4) {  // a constant size: each memcpy is one move
                    for (long i3 = 0; i3 < n3; i3++) memcpy(d + i3 * d3, s + i3 * s3, 4);
                } else {
                    for (long i3 = 0; i3 < n3; i3++) memcpy(d + i3 * d3, s + i3 * s3, (size_t)elem);
                }
            }
        }
    }
}

void tl_zero(char *dst, long nbytes) { memset(dst, 0, (size_t)nbytes); }
