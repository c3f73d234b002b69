/*
Run-time choice of the kernels' instruction set (cpu.h), and the cache sizes the sgemm blocks for.

Features come from CPUID through __builtin_cpu_supports, plus XGETBV: a path is only supported when the OS also
saves its registers on a context switch (ymm for avx2; zmm and the mask registers for avx512).

Where the 512-bit unit is double-pumped (AMD Zen 4 splits each 512-bit FMA over its two 256-bit pipes; some
Intel Xeons have one 512-bit FMA port against two 256-bit ones), AVX-512 kernels do no more FLOPs per cycle
than AVX2 ones, so AVX-512 is only the default where a short calibration on first use shows a 512-bit FMA
stream running at least 1.5x the FLOP rate of a 256-bit one. A calibration rather than a CPUID family/model
table because under a hypervisor family/model are those of the VM's named CPU model, not of the host (QEMU's
"EPYC-Genoa" reports Zen 4's family 0x19 model 0x11 on any host, a full-width Zen 5 included), and because a
table misses the Xeons with one 512-bit port. It takes about a quarter of a millisecond, once per process.
*/
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>

#include "common.h"
#include "cpu.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

enum { PATH_PORTABLE, PATH_AVX2, PATH_AVX512, N_PATHS };

static const char *const PATH_NAMES[N_PATHS] = {"portable", "avx2", "avx512"};

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static _Atomic int g_path;     // the path in use
static int g_default;          // the path at load: TINYLLM_CPU, else the best one worth using
static int g_requested = -1;   // what the environment asked for (cpu.h)
static int g_supported[N_PATHS];
static int g_full_width;       // calibration: 512-bit FMAs at twice the 256-bit rate
static int g_has_bf16;         // AVX512_BF16 usable
static int g_has_vnni;         // AVX512_VNNI usable (with AVX512VL: its 256-bit vpdpbusd)
static int g_dot_default;      // dot-product instructions on at load (TINYLLM_NO_DOT unset)
static _Atomic int g_dot;      // ... and now (tl_cpu_set_dot)

// ----------------------------------------------------------------------------
// Features.

#if defined(__x86_64__)
// 1 when the OS saves (XCR0) every register state in `mask`.
static int os_saves(unsigned mask) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return 0;
    unsigned lo, hi;
    __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & mask) == mask;
}

static int has_avx2_fma(void) {
    __builtin_cpu_init();  // needed when called before libgcc's own constructor has run
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && os_saves(0x6);  // xmm, ymm
}

// AVX-512 as every core since Skylake-SP has it: F, and BW, VL, DQ, without which a compiler vectorises loops
// that mix 16-bit and 32-bit elements (the generated kernels' bfloat16 and float16 loads and stores) at 128 and
// 256 bits only. Only the Xeon Phi lacks them: it runs the avx2 path.
static int has_avx512(void) {
    // + opmask, upper halves of zmm0-15, zmm16-31
    return has_avx2_fma() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && os_saves(0xE6);
}
// vdpbf16ps and the AVX512BW/VL packing around it (sgemm_kernels.c)
static int has_avx512_bf16(void) {
    return has_avx512() && __builtin_cpu_supports("avx512bf16");
}
// vpdpbusd on ymm registers (qmatmul.c's int8 dot products)
static int has_avx512_vnni(void) {
    return has_avx512() && __builtin_cpu_supports("avx512vnni");
}
#else
static int has_avx2_fma(void) { return 0; }
static int has_avx512(void) { return 0; }
static int has_avx512_bf16(void) { return 0; }
static int has_avx512_vnni(void) { return 0; }
#endif

// ----------------------------------------------------------------------------
// Calibration: seconds for `iters` steps of 12 independent FMA chains, 256 or 512 bits wide. Twelve chains
// cover the FMA latency (4 cycles) times the pipes (2) with room to spare, so the loop runs at throughput.

#if defined(__x86_64__)
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static volatile float g_sink;

#define FMA_CHAINS(T, SET1, FMA, ADD, CVT)                                                              \
    T x = SET1(1.0f), y = SET1(0.999f);                                                                 \
    /* distinct starting values, or the compiler merges the identical chains into one */              \
    T c0 = SET1(0), c1 = SET1(1), c2 = SET1(2), c3 = SET1(3), c4 = SET1(4), c5 = SET1(5), c6 = SET1(6),  \
      c7 = SET1(7), c8 = SET1(8), c9 = SET1(9), c10 = SET1(10), c11 = SET1(11);                         \
    double t = now();                                                                                   \
    for (int i = 0; i < iters; i++) {                                                                   \
        c0 = FMA(x, y, c0), c1 = FMA(x, y, c1), c2 = FMA(x, y, c2), c3 = FMA(x, y, c3);                 \
        c4 = FMA(x, y, c4), c5 = FMA(x, y, c5), c6 = FMA(x, y, c6), c7 = FMA(x, y, c7);                 \
        c8 = FMA(x, y, c8), c9 = FMA(x, y, c9), c10 = FMA(x, y, c10), c11 = FMA(x, y, c11);             \
        __asm__ __volatile__("" : "+x"(x));  /* x opaque: the loop cannot be folded */                  \
    }                                                                                                   \
    t = now() - t;                                                                                      \
    T s = ADD(ADD(ADD(c0, c1), ADD(c2, c3)), ADD(ADD(c4, c5), ADD(c6, c7)));                            \
    g_sink = CVT(ADD(s, ADD(ADD(c8, c9), ADD(c10, c11))));                                              \
    return t;

__attribute__((target("avx2,fma"))) static double fma_time_256(int iters) {
    FMA_CHAINS(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_cvtss_f32)
}

__attribute__((target("avx512f,fma"))) static double fma_time_512(int iters) {
    FMA_CHAINS(__m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_cvtss_f32)
}
#undef FMA_CHAINS

// The best of several alternating tries of each, so a preemption or a neighbour's burst on a shared core does
// not decide; the first tries also warm the 512-bit unit up (Intel powers its upper half on demand).
static int calibrate_full_width(void) {
    const int iters = 2000;  // 24k FMAs: ~10 us at 2 per cycle and 1.2 GHz
    double t256 = 1e30, t512 = 1e30;
    for (int r = 0; r < 24; r++) {
        double a = fma_time_512(iters), b = fma_time_256(iters);
        if (a < t512) t512 = a;
        if (b < t256) t256 = b;
    }
    // Same instruction count: full width takes the same time for twice the FLOPs (ratio 1), double-pumped twice
    // the time (ratio 2).
    return t512 < 1.33 * t256;
}
#else
static int calibrate_full_width(void) { return 0; }
#endif

// ----------------------------------------------------------------------------
// Choice.

static int parse_path(const char *s) {
    for (int p = 0; p < N_PATHS; p++)
        if (strcmp(s, PATH_NAMES[p]) == 0) return p;
    return -2;
}

// `path` if supported, else the best supported path below it.
static int supported_at_most(int path) {
    if (path >= N_PATHS) path = N_PATHS - 1;
    while (path > PATH_PORTABLE && !g_supported[path]) path--;
    return path < 0 ? PATH_PORTABLE : path;
}

static void init(void) {
    g_supported[PATH_PORTABLE] = 1;
    g_supported[PATH_AVX2] = has_avx2_fma();
    g_supported[PATH_AVX512] = has_avx512();
    g_full_width = g_supported[PATH_AVX512] && calibrate_full_width();
    int best = g_supported[PATH_AVX512] && g_full_width ? PATH_AVX512 : supported_at_most(PATH_AVX2);

    const char *env = getenv("TINYLLM_CPU"), *no_avx2 = getenv("TINYLLM_NO_AVX2");
    if (env != NULL && *env != '\0') g_requested = parse_path(env);
    else if (no_avx2 != NULL && strcmp(no_avx2, "1") == 0) g_requested = PATH_PORTABLE;

    g_default = g_requested >= 0 ? supported_at_most(g_requested) : best;
    if (g_requested == -2)
        g_default = best;
    if (g_requested == -2 || (g_requested >= 0 && g_default != g_requested))
        fprintf(stderr, "tinyllm: TINYLLM_CPU=%s %s; using %s\n", env,
                g_requested == -2 ? "is not one of portable, avx2, avx512" : "is not supported by this CPU",
                PATH_NAMES[g_default]);
    atomic_store(&g_path, g_default);

    g_has_bf16 = has_avx512_bf16();
    g_has_vnni = has_avx512_vnni();
    const char *no_dot = getenv("TINYLLM_NO_DOT");
    g_dot_default = !(no_dot != NULL && strcmp(no_dot, "1") == 0);
    atomic_store(&g_dot, g_dot_default);
}

int tl_cpu_path(void) {
    pthread_once(&g_once, init);
    return atomic_load_explicit(&g_path, memory_order_relaxed);
}

int tl_cpu_supports(int path) {
    pthread_once(&g_once, init);
    return path >= 0 && path < N_PATHS && g_supported[path];
}

void tl_cpu_set_path(int path) {
    pthread_once(&g_once, init);
    atomic_store(&g_path, path < 0 ? g_default : supported_at_most(path));
}

const char *tl_cpu_path_name(int path) { return path >= 0 && path < N_PATHS ? PATH_NAMES[path] : "?"; }

int tl_cpu_requested_path(void) {
    pthread_once(&g_once, init);
    return g_requested;
}

int tl_cpu_has_bf16_dot(void) {
    pthread_once(&g_once, init);
    return g_has_bf16;
}

// Whether a dot-product instruction the CPU has (`has`) is in use now: turned on, and the path avx2 or avx512.
static int dot_in_use(int has) {
    return has && atomic_load_explicit(&g_dot, memory_order_relaxed) &&
           atomic_load_explicit(&g_path, memory_order_relaxed) >= PATH_AVX2;
}

int tl_cpu_bf16_dot(void) {
    pthread_once(&g_once, init);
    return dot_in_use(g_has_bf16);
}

int tl_cpu_has_int8_dot(void) {
    pthread_once(&g_once, init);
    return g_has_vnni;
}

int tl_cpu_int8_dot(void) {
    pthread_once(&g_once, init);
    return dot_in_use(g_has_vnni);
}

void tl_cpu_set_dot(int on) {
    pthread_once(&g_once, init);
    atomic_store(&g_dot, on < 0 ? g_dot_default : on != 0);
}

int tl_cpu_avx512_full_width(void) {
    pthread_once(&g_once, init);
    return g_full_width;
}

// ----------------------------------------------------------------------------
// Cache sizes: sysfs (per core, and it describes the L3 right where glibc's sysconf on some AMD parts reports
// the whole socket's), then sysconf, else 0 and the caller's own default.

// The first line of a small text file, or NULL when unreadable.
static char *read_line(const char *path, char *text, size_t size) {
    FILE *f = fopen(path, "r");
    if (f == NULL) return NULL;
    char *line = fgets(text, (int)size, f);
    fclose(f);
    return line;
}

// "32K", "1024K", "32M" -> bytes; -1 when not a size.
static long parse_size(const char *text) {
    char *end;
    long v = strtol(text, &end, 10);
    if (end == text || v <= 0) return -1;
    return *end == 'K' ? v << 10 : *end == 'M' ? v << 20 : *end == 'G' ? v << 30 : v;
}

static long sysfs_cache_size(int level) {
    char path[128], text[64];
    for (int i = 0; i < 16; i++) {
        const char *dir = "/sys/devices/system/cpu/cpu0/cache/index";
        snprintf(path, sizeof path, "%s%d/level", dir, i);
        if (read_line(path, text, sizeof text) == NULL) return 0;
        if (atoi(text) != level) continue;
        snprintf(path, sizeof path, "%s%d/type", dir, i);
        if (read_line(path, text, sizeof text) == NULL || strncmp(text, "Instruction", 11) == 0) continue;
        snprintf(path, sizeof path, "%s%d/size", dir, i);
        long s = read_line(path, text, sizeof text) == NULL ? -1 : parse_size(text);
        return s > 0 ? s : 0;
    }
    return 0;
}

static long sysconf_cache_size(int level) {
    long s = -1;
#if defined(_SC_LEVEL1_DCACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE) && defined(_SC_LEVEL3_CACHE_SIZE)
    s = sysconf(level == 1 ? _SC_LEVEL1_DCACHE_SIZE : level == 2 ? _SC_LEVEL2_CACHE_SIZE : _SC_LEVEL3_CACHE_SIZE);
#endif
    return s > 0 ? s : 0;
}

static long g_cache[4];
static pthread_once_t g_cache_once = PTHREAD_ONCE_INIT;

static void read_caches(void) {
    for (int level = 1; level <= 3; level++) {
        long s = sysfs_cache_size(level);
        g_cache[level] = s > 0 ? s : sysconf_cache_size(level);
    }
}

long tl_cpu_cache_size(int level) {
    if (level < 1 || level > 3) return 0;
    pthread_once(&g_cache_once, read_caches);
    return g_cache[level];
}

void tl_cpu_stream_copy(float *dst, const float *src, long n, int threads) {
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
        const long t = tl_omp_thread_num(), nt = tl_omp_num_threads();
        const long i0 = n * t / nt, i1 = n * (t + 1) / nt;
        memcpy(dst + i0, src + i0, (size_t)(i1 - i0) * sizeof(float));
    }
}
