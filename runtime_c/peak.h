/*
Bench aids: what this machine's cores can do at most, measured, so that a bench can report its figures as a
fraction of it (bench/common.py, machine_limits; issue 48). Nothing in the runtime calls these.

This header is also the cffi cdef: keep it to plain declarations (lines starting with '#' are dropped by
runtime_c/build.py).
*/
#ifndef TINYLLM_PEAK_H
#define TINYLLM_PEAK_H

// GFLOP/s of one run of `iters` steps of 12 independent multiply-add chains on each of `threads` threads (OpenMP,
// as the kernels run), in the vectors of cpu.h's `path`: 0 portable (16-byte vectors, a multiply then an add: the
// baseline ISA has no FMA), 1 avx2 (256-bit FMAs), 2 avx512 (512-bit FMAs). A multiply-add counts 2 FLOPs a lane;
// the time is the whole parallel region's, so the slowest thread sets it. 0 when this CPU lacks the path.
double tl_peak_fma_gflops(int path, int threads, long iters);

// Bench aid, a read-only stream: the sum of src[0..n) on `threads` threads (OpenMP), each summing one contiguous
// share. Timed by the caller, it gives the bandwidth a kernel that only reads (a GEMV's weights) can get.
float tl_peak_read(const float *src, long n, int threads);

#endif  // TINYLLM_PEAK_H
