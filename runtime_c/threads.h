/*
How many threads the C runtime's kernels use (threads.c).

Fixed when TINYLLM_THREADS (or tl_set_num_threads) names a count; otherwise automatic: the cores this process
may run on (its CPU affinity and its cgroup's CPU quota) less those other processes keep busy, measured every
THREADS_INTERVAL_MS from /proc/stat. A worker thread that shares its core with a busy process runs only every
other time slice, and every kernel split over the threads waits for its slowest share: on two cores with one
busy loop beside it, two threads ran generation 6x slower than one thread (bench/RESULTS.md, issue 42).

This header is also the cffi cdef: keep it to plain declarations (lines starting with '#' are dropped by
runtime_c/build.py).
*/
#ifndef TINYLLM_THREADS_H
#define TINYLLM_THREADS_H

// Threads used by later calls: n > 0 fixes the count; n <= 0 restores the default (TINYLLM_THREADS from the
// environment, else automatic).
void tl_set_num_threads(int n);

// Threads for the next kernel. Automatic counts are re-measured here when THREADS_INTERVAL_MS have passed, and
// the calling thread's OpenMP default (which the generated kernels' loops use) follows them.
int tl_get_num_threads(void);

// 1 when the count is automatic.
int tl_threads_automatic(void);

// The cores this process may run on: its CPU affinity (OpenMP's places, where threads are pinned), capped by its
// cgroup's CPU quota (rounded up).
int tl_threads_limit(void);

// The cores other processes kept busy over the last measured interval (a fraction; -1 before the first).
double tl_threads_others_busy(void);

// The automatic count for `limit` usable cores of which other processes keep `others` busy: the cores left
// free, where a core counts as free while others use at most 0.3 of it (a worker there loses one slice in
// three at most); at least 1.
int tl_threads_choose(int limit, double others);

// The CPUs a cgroup's quota allows, rounded up, from the files under `dir` (cgroup v2's cpu.max, else v1's
// cpu.cfs_quota_us and cpu.cfs_period_us); 0 when there is no quota or no such file.
int tl_threads_cgroup_cpus(const char *dir);

#endif
