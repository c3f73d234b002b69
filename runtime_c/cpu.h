/*
Which instruction set the C kernels run on, chosen once at run time from the CPU's features (one build runs on
any x86-64, and builds on aarch64 with the portable path only).

Paths, in increasing order:
    0 portable  plain C, the baseline ISA (SSE2 on x86-64, NEON on aarch64)
    1 avx2      AVX2 + FMA (256-bit)
    2 avx512    AVX-512 F, BW, VL, DQ + FMA (512-bit; every AVX-512 core but the Xeon Phi's); also runs every avx2
                kernel

Default: the best path this CPU supports, except that avx512 is only chosen where a 512-bit FMA really does
twice the work of a 256-bit one (not on a double-pumped unit such as AMD Zen 4's: see cpu.c). TINYLLM_CPU=
portable|avx2|avx512 in the environment forces a path (TINYLLM_NO_AVX2=1: portable); a path this CPU lacks
falls back to the best supported one below it, with a note on stderr.

Every C kernel dispatches on tl_cpu_path(); a kernel with no code for that path takes the best one it has below
(an avx2 kernel under avx512). tl_cpu_set_path is for tests: not while another thread is inside a kernel.

This header is also the cffi cdef: keep it to plain declarations (lines starting with '#' are dropped by
runtime_c/build.py).
*/
#ifndef TINYLLM_CPU_H
#define TINYLLM_CPU_H

// The path in use (0 portable, 1 avx2, 2 avx512).
int tl_cpu_path(void);

// 1 when this CPU and OS can run `path`.
int tl_cpu_supports(int path);

// Makes every kernel use `path`, or the best supported one below it; path < 0 restores the default.
void tl_cpu_set_path(int path);

// "portable", "avx2", "avx512", or "?" for anything else.
const char *tl_cpu_path_name(int path);

// The path TINYLLM_CPU (or TINYLLM_NO_AVX2) asked for: -1 when neither is set, -2 when the value is unknown.
int tl_cpu_requested_path(void);

// 1 when a 512-bit FMA runs at twice the rate of a 256-bit one here (the calibration cpu.c runs once).
int tl_cpu_avx512_full_width(void);

// Dot-product instructions, apart from the paths: on a path >= avx2 where the CPU has them (and the OS saves the zmm
// state), bfloat16 products run on AVX512_BF16's vdpbf16ps (sgemm_formats.c) instead of widening to float32, and
// int8 products on AVX512_VNNI's vpdpbusd (qmatmul_dynamic.c), as do the int8 and int4 GEMV's with float32
// activations, these in fixed point (qmatmul_fixed.c).
// On by default; TINYLLM_NO_DOT=1 in the environment turns them off. The avx2 path keeps them because Zen 4,
// whose default path is avx2 (its 512-bit FMA is double-pumped), runs a 512-bit vdpbf16ps at twice the rate of
// the float32 FMAs it replaces, and the int8 and int4 GEMV, bound by their widening, gain there too (bench/RESULTS.md).

// 1 when this CPU and OS can run AVX512_BF16 (with AVX512F/BW/VL).
int tl_cpu_has_bf16_dot(void);

// 1 when bfloat16 products use vdpbf16ps now: supported, turned on, and the path is avx2 or avx512.
int tl_cpu_bf16_dot(void);

// 1 when this CPU and OS can run AVX512_VNNI's vpdpbusd on ymm and zmm registers (with AVX512F/BW/VL).
int tl_cpu_has_int8_dot(void);

// 1 when byte products use vpdpbusd now (qmatmul_dynamic.c's, with int8 activations; qmatmul_fixed.c's weight-only
// GEMV): supported, turned on, and the path is avx2 or avx512; otherwise the AVX2 path multiplies bytes with
// vpmaddubsw, and the weight-only GEMV widens its weights to float32 (qmatmul.c).
int tl_cpu_int8_dot(void);

// on = 0 turns the dot-product instructions off (the widening fallbacks run), 1 on where supported, < 0 restores
// the default (for tests: not while another thread is inside a kernel).
void tl_cpu_set_dot(int on);

// Size in bytes of this core's data cache at `level` (1, 2, 3) as the OS reports it, or 0 when unknown.
long tl_cpu_cache_size(int level);

// Bench aid, STREAM's "copy": dst[0..n) = src[0..n) on `threads` threads (OpenMP), each copying one contiguous
// share with memcpy. Timed by the caller, it gives the memory bandwidth these cores get.
void tl_cpu_stream_copy(float *dst, const float *src, long n, int threads);

#endif  // TINYLLM_CPU_H
