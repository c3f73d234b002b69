/*
The kernels' thread count (threads.h): fixed, or measured from what the machine leaves free.

The CPUs: OpenMP's places where OMP_PROC_BIND or OMP_PLACES make some, else this thread's affinity. The
measurement: /proc/stat counts, per CPU, the time spent busy and idle since boot; over an interval, the busy
share of the CPUs this process may run on, less this process's own CPU time (CLOCK_PROCESS_CPUTIME_ID, every
thread of it), is what other processes used. Nothing is measured before the first interval has passed: the count
starts from the processes running at that moment (/proc/stat's procs_running, less the caller). Where /proc/stat
cannot be read (not Linux), the count is the limit.

Threads changing between kernels changes no result: every kernel splits its sums the same way on any number of
threads (docs/architecture.md, "Threads keep to their rows").
*/
#define _GNU_SOURCE
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "threads.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#define THREADS_INTERVAL_MS 100  // long enough for /proc/stat's 10 ms ticks to average out over a core
#define THREADS_FREE_BELOW 0.3   // a core others use less than this counts as free (threads.h)
#define THREADS_MAX_CPUS 1024

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;  // one measurement at a time
static _Atomic int g_fixed;       // > 0: the count TINYLLM_THREADS or tl_set_num_threads asked for
static _Atomic int g_auto;        // the automatic count
static _Atomic long g_next_ns;    // when the next measurement is due
static int g_limit;
static double g_others = -1.0;
static cpu_set_t g_cpus;          // the CPUs this process may run on, whose /proc/stat lines count
static long g_busy, g_total, g_own_ns, g_wall_ns;  // the last measurement's counters (g_total 0: none yet)
static _Thread_local int tls_omp;  // the OpenMP default last set in this thread

static long now_ns(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

// A whole small file into text (NUL-terminated); its length, or -1.
static long read_text(const char *path, char *text, size_t size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    long n = 0, got;
    while (n < (long)size - 1 && (got = read(fd, text + n, size - 1 - n)) > 0) n += got;
    close(fd);
    text[n] = '\0';
    return n;
}

int tl_threads_cgroup_cpus(const char *dir) {
    char path[512], text[128];
    double quota = -1, period = -1;
    snprintf(path, sizeof path, "%s/cpu.max", dir);
    if (read_text(path, text, sizeof text) > 0) {  // v2: "max 100000" or "150000 100000"
        if (strncmp(text, "max", 3) == 0 || sscanf(text, "%lf %lf", &quota, &period) != 2) return 0;
    } else {  // v1: -1 is no quota
        snprintf(path, sizeof path, "%s/cpu.cfs_quota_us", dir);
        if (read_text(path, text, sizeof text) <= 0 || sscanf(text, "%lf", &quota) != 1) return 0;
        snprintf(path, sizeof path, "%s/cpu.cfs_period_us", dir);
        if (read_text(path, text, sizeof text) <= 0 || sscanf(text, "%lf", &period) != 1) return 0;
    }
    return quota > 0 && period > 0 ? (int)ceil(quota / period) : 0;
}

int tl_threads_choose(int limit, double others) {
    int n = (int)floor(limit - (others > 0 ? others : 0) + THREADS_FREE_BELOW);
    return n < 1 ? 1 : n > limit ? limit : n;
}

// The busy and total ticks of the CPUs in g_cpus, and the number of processes running now; 0 when /proc/stat
// cannot be read.
static int read_stat(long *busy, long *total, int *running) {
    static char text[1 << 16];  // under g_lock
    if (read_text("/proc/stat", text, sizeof text) <= 0) return 0;
    *busy = *total = 0;
    *running = 0;
    for (char *line = text; line && *line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
        int cpu;
        long user, nice, sys, idle, iowait, irq, softirq, steal = 0;
        if (sscanf(line, "cpu%d %ld %ld %ld %ld %ld %ld %ld %ld", &cpu, &user, &nice, &sys, &idle, &iowait, &irq,
                   &softirq, &steal) >= 8) {
            if (cpu < 0 || cpu >= THREADS_MAX_CPUS || !CPU_ISSET(cpu, &g_cpus)) continue;
            long b = user + nice + sys + irq + softirq + steal;  // steal: the hypervisor gave the core away
            *busy += b;
            *total += b + idle + iowait;
        } else {
            sscanf(line, "procs_running %d", running);
        }
    }
    return *total > 0;
}

static void measure(void) {
    long busy, total;
    int running;
    if (!read_stat(&busy, &total, &running)) {
        atomic_store(&g_auto, g_limit);
        return;
    }
    long own = now_ns(CLOCK_PROCESS_CPUTIME_ID), wall = now_ns(CLOCK_MONOTONIC);
    if (g_total == 0) {
        g_others = -1.0;
        atomic_store(&g_auto, tl_threads_choose(g_limit, running - 1));
    } else if (total > g_total && wall > g_wall_ns) {
        double cores = (double)CPU_COUNT(&g_cpus);
        double all = cores * (double)(busy - g_busy) / (double)(total - g_total);
        double mine = (double)(own - g_own_ns) / (double)(wall - g_wall_ns);
        g_others = all > mine ? all - mine : 0.0;
        atomic_store(&g_auto, tl_threads_choose(g_limit, g_others));
    }
    g_busy = busy, g_total = total, g_own_ns = own, g_wall_ns = wall;
}

// The CPUs of OpenMP's places, into cpus; 0 where there are none (no OMP_PROC_BIND or OMP_PLACES). With places,
// libgomp binds the initial thread to the first one when it loads, so this thread's affinity is then one CPU of
// the several its team runs on: without this, OMP_PROC_BIND=true made the automatic count 1.
static int place_cpus(cpu_set_t *cpus) {
    CPU_ZERO(cpus);
#ifdef _OPENMP
    for (int place = 0; place < omp_get_num_places(); place++) {
        int ids[THREADS_MAX_CPUS], n = omp_get_place_num_procs(place);
        if (n > THREADS_MAX_CPUS) continue;  // (ids would not hold them)
        omp_get_place_proc_ids(place, ids);
        for (int i = 0; i < n; i++)
            if (ids[i] >= 0 && ids[i] < THREADS_MAX_CPUS) CPU_SET(ids[i], cpus);
    }
#endif
    return CPU_COUNT(cpus);
}

static void init(void) {
    if (place_cpus(&g_cpus) == 0 && (sched_getaffinity(0, sizeof g_cpus, &g_cpus) != 0 || CPU_COUNT(&g_cpus) == 0)) {
        CPU_ZERO(&g_cpus);
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        for (long i = 0; i < n && i < THREADS_MAX_CPUS; i++) CPU_SET(i, &g_cpus);
    }
    g_limit = CPU_COUNT(&g_cpus) > 0 ? CPU_COUNT(&g_cpus) : 1;
    int quota = tl_threads_cgroup_cpus("/sys/fs/cgroup");
    if (quota == 0) quota = tl_threads_cgroup_cpus("/sys/fs/cgroup/cpu");
    if (quota > 0 && quota < g_limit) g_limit = quota;
    int env = tl_env_int("TINYLLM_THREADS", 0);
    atomic_store(&g_fixed, env > 0 ? env : 0);
    pthread_mutex_lock(&g_lock);
    measure();
    pthread_mutex_unlock(&g_lock);
    atomic_store(&g_next_ns, now_ns(CLOCK_MONOTONIC) + THREADS_INTERVAL_MS * 1000000L);
}

void tl_set_num_threads(int n) {
    pthread_once(&g_once, init);
    int env = tl_env_int("TINYLLM_THREADS", 0);
    atomic_store(&g_fixed, n > 0 ? n : env > 0 ? env : 0);
}

int tl_get_num_threads(void) {
    pthread_once(&g_once, init);
    int n = atomic_load_explicit(&g_fixed, memory_order_relaxed);
    if (n <= 0) {
        long now = now_ns(CLOCK_MONOTONIC);  // the vDSO's: some 20 ns
        if (now >= atomic_load_explicit(&g_next_ns, memory_order_relaxed) && pthread_mutex_trylock(&g_lock) == 0) {
            measure();
            atomic_store(&g_next_ns, now + THREADS_INTERVAL_MS * 1000000L);
            pthread_mutex_unlock(&g_lock);
        }
        n = atomic_load_explicit(&g_auto, memory_order_relaxed);
    }
#ifdef _OPENMP
    if (tls_omp != n) {
        omp_set_num_threads(n);
        tls_omp = n;
    }
#endif
    return n;
}

int tl_threads_automatic(void) {
    pthread_once(&g_once, init);
    return atomic_load(&g_fixed) <= 0;
}

int tl_threads_limit(void) {
    pthread_once(&g_once, init);
    return g_limit;
}

double tl_threads_others_busy(void) {
    pthread_once(&g_once, init);
    pthread_mutex_lock(&g_lock);
    double others = g_others;
    pthread_mutex_unlock(&g_lock);
    return others;
}
