// Constrained decoding in C: a regular grammar's lazy DFA and the token trie's walk (see grammar.h).
#include <stdlib.h>
#include <string.h>

#include "grammar.h"

struct gdfa {
    long n_nfa;
    int32_t final;
    int32_t *t_off, *t_to;                  // byte transitions (CSR by source): t_lo[k] <= byte <= t_hi[k] -> t_to[k]
    uint8_t *t_lo, *t_hi;
    int32_t *e_off, *e_to;                  // epsilon edges (CSR by source)
    uint8_t *keep;                          // kept in closures: reads a byte, calls a rule or is final; reaches final
    int32_t *c_start, *c_len, *c_pool;      // each NFA state's kept epsilon closure, sorted (c_start -1: not yet)
    long c_used, c_cap;
    uint32_t *mark, *cmark, gen, cgen;      // scratch: the union's and the closure's visited marks
    int32_t *stack, *buf;
    int32_t *eb_lo, *eb_hi, *eb_to, *eb_tg; // scratch: the edges out of one DFA state, one piece's targets
    long eb_cap;
    long n_states, cap;                     // DFA states; the arrays below are indexed by state + 1 (0: DEAD)
    long *s_start;
    int32_t *s_len, *s_pool;                // each state's NFA states, sorted
    long s_used, s_cap;
    uint8_t *flags, *done;                  // flags: 1 accepting, 2 reads a byte; done: its row is filled
    int32_t *rows;                          // rows[(s + 1) * 256 + b] = next state + 1
    int32_t *hash;                          // open addressing over state ids (-1: empty)
    long hash_cap;
};

static int grow(void **p, long *cap, long need, size_t item) {
    if (need <= *cap) return 0;
    long c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * item);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

static void sort_ints(int32_t *a, long n) {     // insertion sort: closures and unions are short and nearly sorted
    for (long i = 1; i < n; i++) {
        int32_t x = a[i];
        long j = i;
        while (j > 0 && a[j - 1] > x) { a[j] = a[j - 1]; j--; }
        a[j] = x;
    }
}

void gdfa_free(gdfa *g) {
    if (!g) return;
    void *ps[] = {g->t_off, g->t_to, g->t_lo, g->t_hi, g->e_off, g->e_to, g->keep, g->c_start, g->c_len,
                  g->c_pool, g->mark, g->cmark, g->stack, g->buf, g->eb_lo, g->eb_hi, g->eb_to, g->eb_tg,
                  g->s_start, g->s_len, g->s_pool, g->flags, g->done, g->rows, g->hash};
    for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) free(ps[k]);
    free(g);
}

static void *copy(const void *src, size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (p && bytes) memcpy(p, src, bytes);
    return p;
}

// Room for states up to id `n - 1` (arrays indexed by id + 1) and a hash table at most half full.
static int reserve_states(gdfa *g, long n) {
    if (n + 1 > g->cap) {
        long c = g->cap;
        while (c < n + 1) c *= 2;
        long *ss = realloc(g->s_start, c * sizeof *ss);
        if (ss) g->s_start = ss;
        int32_t *sl = realloc(g->s_len, c * sizeof *sl);
        if (sl) g->s_len = sl;
        uint8_t *f = realloc(g->flags, c), *d = realloc(g->done, c);
        if (f) g->flags = f;
        if (d) g->done = d;
        int32_t *r = realloc(g->rows, (size_t)c * 256 * sizeof *r);
        if (r) g->rows = r;
        if (!ss || !sl || !f || !d || !r) return -1;
        g->cap = c;
    }
    if (2 * n > g->hash_cap) {
        long hc = g->hash_cap * 2;
        int32_t *h = malloc(hc * sizeof *h);
        if (!h) return -1;
        for (long k = 0; k < hc; k++) h[k] = -1;
        for (long s = 0; s < g->n_states; s++) {    // (rehash: the sets' hashes are recomputed)
            const int32_t *set = g->s_pool + g->s_start[s + 1];
            uint64_t x = 1469598103934665603ull;
            for (long i = 0; i < g->s_len[s + 1]; i++) x = (x ^ (uint32_t)set[i]) * 1099511628211ull;
            long k = (long)(x & (uint64_t)(hc - 1));
            while (h[k] >= 0) k = (k + 1) & (hc - 1);
            h[k] = (int32_t)s;
        }
        free(g->hash);
        g->hash = h;
        g->hash_cap = hc;
    }
    return 0;
}

// The DFA state of the sorted NFA-state set (n > 0), made when new; -2 when out of memory.
static int32_t intern(gdfa *g, const int32_t *set, long n) {
    uint64_t x = 1469598103934665603ull;                // FNV-1a over the members
    for (long i = 0; i < n; i++) x = (x ^ (uint32_t)set[i]) * 1099511628211ull;
    long mask = g->hash_cap - 1, k = (long)(x & (uint64_t)mask);
    for (int32_t s; (s = g->hash[k]) >= 0; k = (k + 1) & mask)
        if (g->s_len[s + 1] == n && !memcmp(g->s_pool + g->s_start[s + 1], set, n * sizeof *set)) return s;
    int32_t s = (int32_t)g->n_states;
    if (grow((void **)&g->s_pool, &g->s_cap, g->s_used + n, sizeof *g->s_pool) || reserve_states(g, s + 1))
        return -2;
    if (g->hash_cap != mask + 1) {                      // (rehashed: find the new slot)
        mask = g->hash_cap - 1;
        k = (long)(x & (uint64_t)mask);
        while (g->hash[k] >= 0) k = (k + 1) & mask;
    }
    g->hash[k] = s;
    memcpy(g->s_pool + g->s_used, set, n * sizeof *set);
    g->s_start[s + 1] = g->s_used;
    g->s_len[s + 1] = (int32_t)n;
    g->s_used += n;
    uint8_t f = 0;
    for (long i = 0; i < n; i++) {
        if (set[i] == g->final) f |= 1;
        if (g->t_off[set[i] + 1] > g->t_off[set[i]]) f |= 2;
    }
    g->flags[s + 1] = f;
    g->done[s + 1] = 0;
    g->n_states++;
    return s;
}

// NFA state u's kept epsilon closure (computed once): its start in c_pool, its length in c_len[u]; -1 on no memory.
static long closure(gdfa *g, int32_t u) {
    if (g->c_start[u] >= 0) return g->c_start[u];
    uint32_t gen = ++g->cgen;
    long top = 0, n = 0;
    g->stack[top++] = u;
    g->cmark[u] = gen;
    while (top) {
        int32_t x = g->stack[--top];
        if (g->keep[x]) g->buf[n++] = x;
        for (int32_t k = g->e_off[x]; k < g->e_off[x + 1]; k++) {
            int32_t v = g->e_to[k];
            if (g->cmark[v] != gen) { g->cmark[v] = gen; g->stack[top++] = v; }
        }
    }
    if (grow((void **)&g->c_pool, &g->c_cap, g->c_used + n, sizeof *g->c_pool)) return -1;
    sort_ints(g->buf, n);
    memcpy(g->c_pool + g->c_used, g->buf, n * sizeof *g->buf);
    g->c_start[u] = g->c_used;
    g->c_len[u] = (int32_t)n;
    g->c_used += n;
    return g->c_start[u];
}

// The DFA state of the union of the closures of targets[0 .. n - 1]: -1 DEAD (empty), -2 out of memory.
static int32_t close_union(gdfa *g, const int32_t *targets, long n) {
    long m = 0;
    for (long i = 0; i < n; i++)                        // (closures first: they reuse buf)
        if (closure(g, targets[i]) < 0) return -2;
    uint32_t gen = ++g->gen;
    for (long i = 0; i < n; i++) {
        const int32_t *c = g->c_pool + g->c_start[targets[i]];
        for (int32_t j = 0; j < g->c_len[targets[i]]; j++)
            if (g->mark[c[j]] != gen) { g->mark[c[j]] = gen; g->buf[m++] = c[j]; }
    }
    if (!m) return -1;
    if (n > 1) sort_ints(g->buf, m);
    return intern(g, g->buf, m);
}

// Fill state s's row: the bytes are cut where an edge's range starts or ends; each piece's targets closed once.
static int fill_row(gdfa *g, int32_t s) {
    long ne = 0;
    const int32_t *set = g->s_pool + g->s_start[s + 1];
    long n = g->s_len[s + 1];
    uint8_t cut[257] = {0};
    cut[0] = cut[256] = 1;
    for (long i = 0; i < n; i++) {
        int32_t u = set[i];
        long need = ne + g->t_off[u + 1] - g->t_off[u];
        if (need > g->eb_cap) {
            int32_t **arrays[] = {&g->eb_lo, &g->eb_hi, &g->eb_to, &g->eb_tg};
            for (int a = 0; a < 4; a++) {
                long c = g->eb_cap;
                if (grow((void **)arrays[a], &c, need, sizeof **arrays[a])) return -1;
            }
            g->eb_cap = need;
        }
        for (int32_t k = g->t_off[u]; k < g->t_off[u + 1]; k++) {
            g->eb_lo[ne] = g->t_lo[k];
            g->eb_hi[ne] = g->t_hi[k];
            g->eb_to[ne++] = g->t_to[k];
            cut[g->t_lo[k]] = cut[g->t_hi[k] + 1] = 1;
        }
    }
    int32_t *targets = g->eb_tg;
    for (int a = 0, b; a < 256; a = b) {
        for (b = a + 1; !cut[b]; b++) {}
        long nt = 0;
        for (long k = 0; k < ne; k++)
            if (g->eb_lo[k] <= a && a <= g->eb_hi[k]) targets[nt++] = g->eb_to[k];
        int32_t t = -1;
        if (nt && (t = close_union(g, targets, nt)) == -2) return -1;
        int32_t *row = g->rows + (long)(s + 1) * 256;   // (after intern: rows may have moved)
        for (int c = a; c < b; c++) row[c] = t + 1;
    }
    g->done[s + 1] = 1;
    return 0;
}

gdfa *gdfa_new(long n_nfa, const int32_t *t_off, const uint8_t *t_lo, const uint8_t *t_hi, const int32_t *t_to,
               const int32_t *e_off, const int32_t *e_to, const int32_t *c_off, const int32_t *c_to, int32_t final) {
    gdfa *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    long nt = t_off[n_nfa], ne = e_off[n_nfa], nc = c_off[n_nfa];
    g->n_nfa = n_nfa;
    g->final = final;
    g->t_off = copy(t_off, (n_nfa + 1) * sizeof *t_off);
    g->t_lo = copy(t_lo, nt);
    g->t_hi = copy(t_hi, nt);
    g->t_to = copy(t_to, nt * sizeof *t_to);
    g->e_off = copy(e_off, (n_nfa + 1) * sizeof *e_off);
    g->e_to = copy(e_to, ne * sizeof *e_to);
    g->keep = calloc(n_nfa + 1, 1);
    g->c_start = malloc((n_nfa + 1) * sizeof *g->c_start);
    g->c_len = calloc(n_nfa + 1, sizeof *g->c_len);
    g->mark = calloc(n_nfa + 1, sizeof *g->mark);
    g->cmark = calloc(n_nfa + 1, sizeof *g->cmark);
    g->stack = malloc((n_nfa + 1) * sizeof *g->stack);
    g->buf = malloc((n_nfa + 1) * sizeof *g->buf);
    int32_t *r_off = calloc(n_nfa + 2, sizeof *r_off), *r_from = malloc((nt + ne + nc + 1) * sizeof *r_from);
    g->cap = 64;
    g->hash_cap = 128;
    g->s_start = malloc(g->cap * sizeof *g->s_start);
    g->s_len = malloc(g->cap * sizeof *g->s_len);
    g->flags = malloc(g->cap);
    g->done = malloc(g->cap);
    g->rows = malloc((size_t)g->cap * 256 * sizeof *g->rows);
    g->hash = malloc(g->hash_cap * sizeof *g->hash);
    if (!g->t_off || !g->t_lo || !g->t_hi || !g->t_to || !g->e_off || !g->e_to || !g->keep || !g->c_start ||
        !g->c_len || !g->mark || !g->cmark || !g->stack || !g->buf || !r_off || !r_from || !g->s_start ||
        !g->s_len || !g->flags || !g->done || !g->rows || !g->hash) {
        free(r_off);
        free(r_from);
        gdfa_free(g);
        return NULL;
    }
    for (long u = 0; u < n_nfa; u++) g->c_start[u] = -1;
    for (long k = 0; k < g->hash_cap; k++) g->hash[k] = -1;
    memset(g->rows, 0, 256 * sizeof *g->rows);          // row 0: DEAD goes nowhere
    g->done[0] = 1;
    g->s_start[0] = g->s_len[0] = g->flags[0] = 0;
    // Which NFA states reach `final` (bytes, epsilons and calls reversed), by a search from it.
    for (long u = 0; u < n_nfa; u++) {
        for (int32_t k = t_off[u]; k < t_off[u + 1]; k++) r_off[t_to[k] + 1]++;
        for (int32_t k = e_off[u]; k < e_off[u + 1]; k++) r_off[e_to[k] + 1]++;
        for (int32_t k = c_off[u]; k < c_off[u + 1]; k++) r_off[c_to[k] + 1]++;
    }
    for (long u = 0; u < n_nfa; u++) r_off[u + 1] += r_off[u];
    int32_t *fill = g->buf;                             // (buf as each reversed list's cursor)
    memcpy(fill, r_off, n_nfa * sizeof *fill);
    for (long u = 0; u < n_nfa; u++) {
        for (int32_t k = t_off[u]; k < t_off[u + 1]; k++) r_from[fill[t_to[k]]++] = (int32_t)u;
        for (int32_t k = e_off[u]; k < e_off[u + 1]; k++) r_from[fill[e_to[k]]++] = (int32_t)u;
        for (int32_t k = c_off[u]; k < c_off[u + 1]; k++) r_from[fill[c_to[k]]++] = (int32_t)u;
    }
    uint8_t *good = g->keep;
    long top = 0;
    good[final] = 1;
    g->stack[top++] = final;
    while (top) {
        int32_t v = g->stack[--top];
        for (int32_t k = r_off[v]; k < r_off[v + 1]; k++)
            if (!good[r_from[k]]) { good[r_from[k]] = 1; g->stack[top++] = r_from[k]; }
    }
    for (long u = 0; u < n_nfa; u++)
        good[u] = good[u] && (t_off[u + 1] > t_off[u] || c_off[u + 1] > c_off[u] || u == final);
    free(r_off);
    free(r_from);
    return g;
}

int32_t gdfa_closure(gdfa *g, const int32_t *states, long n) {
    for (long i = 0; i < n; i++)
        if (states[i] < 0 || states[i] >= g->n_nfa) return -3;
    return close_union(g, states, n);
}

const int32_t *gdfa_row(gdfa *g, int32_t s) {
    if (s < 0 || s >= g->n_states) return NULL;
    if (!g->done[s + 1] && fill_row(g, s)) return NULL;
    return g->rows + (long)(s + 1) * 256;
}

long gdfa_set(const gdfa *g, int32_t s, int32_t *out) {
    if (out) memcpy(out, g->s_pool + g->s_start[s + 1], g->s_len[s + 1] * sizeof *out);
    return g->s_len[s + 1];
}

int gdfa_flags(const gdfa *g, int32_t s) { return s < 0 ? 0 : g->flags[s + 1]; }

long gdfa_num_states(const gdfa *g) { return g->n_states; }

long grammar_trie_walk(gdfa *g, const int32_t *rows, const uint8_t *done, const uint32_t *node,
                       const int32_t *skip, const uint32_t *token, const int32_t *pending, long n_pending,
                       int32_t *blocked, int32_t *st, uint8_t *out) {
    long n_blocked = 0;
    if (g) { rows = g->rows; done = g->done; }
    for (long k = 0; k < n_pending; k++) {
        long n = pending[2 * k], end = skip[n];
        if (n == 0) {                                   // the root: its children's parent state
            st[0] = pending[1];
            n = 1;
        } else {
            st[(node[n] >> 8) - 1] = pending[2 * k + 1];
        }
        while (n < end) {
            uint32_t w = node[n], d = w >> 8;
            int32_t p = st[d - 1];
            if (__builtin_expect(!done[p], 0)) {
                if (g) {
                    if (fill_row(g, p - 1)) return -1;
                    rows = g->rows;
                    done = g->done;
                } else {
                    blocked[2 * n_blocked] = (int32_t)n;
                    blocked[2 * n_blocked++ + 1] = p;
                    n = skip[n];
                    continue;
                }
            }
            int32_t s = rows[(long)p * 256 + (w & 255)];
            st[d] = s;
            if (__builtin_expect(!s, 0)) {
                n = skip[n];
                continue;
            }
            out[token[n]] = 1;
            n++;
        }
    }
    return n_blocked;
}
