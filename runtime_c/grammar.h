/*
Constrained decoding's token mask (tinyllm/grammar/): a grammar automaton walked down the tokenizer's token trie.

The lazy DFA of a regular grammar (tinyllm/grammar/regex_dfa.py's NativeDFA), subset-constructed here on demand:
    gdfa_new:        from the NFA over n_nfa states as CSR arrays by source state: byte transitions
                     (t_lo[k] <= byte <= t_hi[k] -> t_to[k] for k in t_off[u] .. t_off[u + 1] - 1), epsilon edges
                     (e_off, e_to) and calls of sub-rules (c_off, c_to: state after the call); `final` accepts. The
                     arrays are copied. A DFA state is the set of NFA states, kept to those that read a byte, call
                     or are final and that can reach final, of some epsilon closure; states are numbered from 0 as
                     they are made, DEAD (-1) is the empty set. NULL when out of memory.
    gdfa_closure:    the state of the union of the closures of states[0 .. n - 1] (-1 DEAD; -2 out of memory; -3
                     a state out of range).
    gdfa_row:        state s's row of 256 next states counted from 1 (0: DEAD), filled when first asked for; valid
                     until the next call that makes states. NULL for a bad s or out of memory.
    gdfa_set:        s's NFA states (sorted) into out when not NULL; returns how many.
    gdfa_flags:      1: s accepts, 2: some byte continues s directly (not through a call).

The walk. The trie's nodes are numbered in preorder (node 0 the root; a node's subtree is the nodes n ..
skip[n] - 1); node[n] is the byte on the edge into n | n's depth << 8, token[n] the id of the token that ends at n
(n_vocab, a spare slot of out, when none). rows[s * 256 + b] is the automaton's state after byte b from state s,
states counted from 1 (0: dead), done[s] whether s's row is filled.
    grammar_trie_walk:  for each (node, state of its parent) pair in pending (node 0: the whole trie below the
                        root, in that state), gives each node of the subtree its state and sets out[token[n]] = 1 at
                        each live node, skipping the subtree of every dead node; st is scratch for one state per
                        depth (max depth + 1). With a gdfa g, rows and done are g's and missing rows are filled on
                        the way (-1: out of memory). Without one, a node whose parent's row is not filled is not
                        entered: its pair is appended to blocked, and their count is returned; the caller fills
                        those rows and walks blocked. The mask is complete when it returns 0. Only the
                        live part of the trie is visited.

This header is also the cffi cdef (see runtime_c/build.py): plain declarations only.
*/
#ifndef TINYLLM_GRAMMAR_H
#define TINYLLM_GRAMMAR_H

#include <stdint.h>

typedef struct gdfa gdfa;

gdfa *gdfa_new(long n_nfa, const int32_t *t_off, const uint8_t *t_lo, const uint8_t *t_hi, const int32_t *t_to,
               const int32_t *e_off, const int32_t *e_to, const int32_t *c_off, const int32_t *c_to, int32_t final);
void gdfa_free(gdfa *g);
int32_t gdfa_closure(gdfa *g, const int32_t *states, long n);
const int32_t *gdfa_row(gdfa *g, int32_t s);
long gdfa_set(const gdfa *g, int32_t s, int32_t *out);
int gdfa_flags(const gdfa *g, int32_t s);
long gdfa_num_states(const gdfa *g);

long grammar_trie_walk(gdfa *g, const int32_t *rows, const uint8_t *done, const uint32_t *node,
                       const int32_t *skip, const uint32_t *token, const int32_t *pending, long n_pending,
                       int32_t *blocked, int32_t *st, uint8_t *out);

#endif  // TINYLLM_GRAMMAR_H
