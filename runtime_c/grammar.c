#include "grammar.h"

long grammar_trie_walk(int32_t *states, const int32_t *parent, const uint8_t *byte, const int32_t *skip,
                       const int32_t *tok_start, const int32_t *tok_ids, const int32_t *rows, const uint8_t *done,
                       uint8_t *need, const int32_t *pending, long n_pending, int32_t *blocked, uint8_t *out) {
    long n_blocked = 0;
    for (long k = 0; k < n_pending; k++) {
        long n = pending[k], end = skip[n];
        while (n < end) {
            int32_t p = states[parent[n]];              // live: the walk never enters below a dead node
            if (!done[p]) {
                need[p] = 1;
                blocked[n_blocked++] = (int32_t)n;
                n = skip[n];
                continue;
            }
            int32_t s = rows[(long)p * 256 + byte[n]];
            states[n] = s;
            if (!s) {
                n = skip[n];
                continue;
            }
            for (int32_t t = tok_start[n]; t < tok_start[n + 1]; t++)
                out[tok_ids[t]] = 1;
            n++;
        }
    }
    return n_blocked;
}
