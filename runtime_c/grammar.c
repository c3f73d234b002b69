#include "grammar.h"

long grammar_trie_walk(int32_t *states, const int32_t *parent, const uint8_t *byte, long n_nodes,
                       const int32_t *rows, const uint8_t *done, uint8_t *need, long n_rows,
                       const int32_t *end, uint8_t *out, long n_tokens) {
    long missing = 0;
    for (long n = 1; n < n_nodes; n++) {
        if (states[n] >= 0)
            continue;                                   // known from an earlier pass
        int32_t p = states[parent[n]];
        if (p == 0) {
            states[n] = 0;
        } else if (p < 0) {
            continue;                                   // below a missing row: still unknown
        } else if (!done[p]) {
            missing += !need[p];
            need[p] = 1;
        } else {
            states[n] = rows[(long)p * 256 + byte[n]];
        }
    }
    if (missing)
        return missing;
    for (long i = 0; i < n_tokens; i++)
        out[i] = end[i] > 0 && states[end[i]] > 0;
    return missing;
}
