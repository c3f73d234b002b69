/*
Helpers shared by tinyllm's C runtime: environment settings, CPU feature
dispatch, OpenMP shims, flags for signalling between threads and per-thread
aligned scratch buffers.

Everything here is `static`, so each translation unit that includes this header
gets its own private copy; no symbol clashes when several runtime files are
linked into one extension module.
*/
#ifndef TINYLLM_COMMON_H
#define TINYLLM_COMMON_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

// Packed panels are aligned to a cache line so that aligned vector loads work
// and two threads' buffers never share a line (no false sharing).
#define TL_ALIGN 64

static inline long tl_min(long a, long b) { return a < b ? a : b; }
static inline long tl_max(long a, long b) { return a > b ? a : b; }
static inline long tl_round_up(long x, long m) { return (x + m - 1) / m * m; }

// An integer from the environment, or `fallback` when unset or not a number.
static inline int tl_env_int(const char *name, int fallback) {
    const char *s = getenv(name);
    if (s == NULL || *s == '\0') return fallback;
    char *end;
    long v = strtol(s, &end, 10);
    return *end == '\0' ? (int)v : fallback;
}

// ----------------------------------------------------------------------------
// OpenMP shims, so the file still builds (single-threaded) without -fopenmp.

static inline int tl_omp_num_procs(void) {
#ifdef _OPENMP
    return omp_get_num_procs();
#else
    return 1;
#endif
}
static inline int tl_omp_thread_num(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}
static inline int tl_omp_num_threads(void) {
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

// ----------------------------------------------------------------------------
// Point-to-point signalling between the threads of a team: a counter that one
// thread raises and others wait on. Each flag has a cache line to itself, so a
// waiting thread's reads do not slow down writes to its neighbours' flags.
//
// Waiting spins briefly, then yields the core: on a machine shared with other
// processes the thread being waited for may be off its core, and a waiter that
// spins burns the CPU share that thread needs (an OpenMP barrier keeps spinning
// much longer).

typedef struct {
    _Alignas(TL_ALIGN) _Atomic long value;
} tl_flag;

static inline void tl_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static inline void tl_flag_set(tl_flag *f, long v) {
    atomic_store_explicit(&f->value, v, memory_order_release);
}

// Returns once the flag is at least v; what its setter wrote before setting it
// is then visible to the caller.
static inline void tl_flag_wait(tl_flag *f, long v) {
    for (int spins = 0; atomic_load_explicit(&f->value, memory_order_acquire) < v; spins++) {
        if (spins < 1000) tl_cpu_relax();
        else sched_yield();
    }
}

// ----------------------------------------------------------------------------
// CPU features. The AVX2 code paths are compiled with
// __attribute__((target("avx2,fma"))) into the same object file as the
// portable code, and chosen at run time, so one build runs on any x86-64.
// Kernels dispatch on cpu.h's tl_cpu_path(), which also honours TINYLLM_CPU
// and checks that the OS saves the registers; this is the bare CPUID test.

static inline int tl_cpu_avx2_fma(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();  // needed when called before libgcc's own constructor has run
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return 0;
#endif
}

// ----------------------------------------------------------------------------
// Per-thread scratch: a few grow-only, 64-byte-aligned float buffers per thread,
// allocated on first use and reused by every later call on that thread (OpenMP
// pool threads live for the whole process). A pthread key frees them when a
// thread exits, so short-lived threads that call into the runtime do not leak.

#define TL_SCRATCH_SLOTS 4

typedef struct {
    float *ptr[TL_SCRATCH_SLOTS];
    size_t cap[TL_SCRATCH_SLOTS];  // in floats
} tl_scratch_set;

static pthread_key_t tl_scratch_key;
static pthread_once_t tl_scratch_once = PTHREAD_ONCE_INIT;

static inline void tl_scratch_free(void *p) {
    tl_scratch_set *s = (tl_scratch_set *)p;
    for (int i = 0; i < TL_SCRATCH_SLOTS; i++) free(s->ptr[i]);
    free(s);
}

static inline void tl_scratch_make_key(void) { pthread_key_create(&tl_scratch_key, tl_scratch_free); }

// Out of memory is fatal, as in llm.c: there is no sensible way to go on.
static inline void tl_oom(size_t bytes) {
    fprintf(stderr, "tinyllm: out of memory allocating %zu bytes of scratch\n", bytes);
    abort();
}

// Returns this thread's buffer number `slot` with room for at least n floats.
// The contents are not preserved when it grows.
static inline float *tl_scratch(int slot, size_t n) {
    pthread_once(&tl_scratch_once, tl_scratch_make_key);
    tl_scratch_set *s = (tl_scratch_set *)pthread_getspecific(tl_scratch_key);
    if (s == NULL) {
        s = (tl_scratch_set *)calloc(1, sizeof(*s));
        if (s == NULL) tl_oom(sizeof(*s));
        pthread_setspecific(tl_scratch_key, s);
    }
    if (s->cap[slot] < n) {
        free(s->ptr[slot]);
        size_t bytes = (size_t)tl_round_up((long)(n * sizeof(float)), TL_ALIGN);
        s->ptr[slot] = (float *)aligned_alloc(TL_ALIGN, bytes);
        if (s->ptr[slot] == NULL) tl_oom(bytes);
        s->cap[slot] = n;
    }
    return s->ptr[slot];
}

#endif  // TINYLLM_COMMON_H
