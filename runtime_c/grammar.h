/*
Constrained decoding's token mask (tinyllm/grammar/matcher.py): a grammar automaton walked down the tokenizer's
token trie in one pass. The trie's nodes are numbered so that each parent comes before its children (node 0 is
the root); rows[s * 256 + b] is the automaton's state after byte b from state s, states counted from 1 (0: dead).

    grammar_trie_walk:  states[n] = rows[states[parent[n]] * 256 + byte[n]] for each node n = 1 .. n_nodes - 1
                        still unknown (states[n] < 0: the caller sets states[0] to the start and the rest to -1),
                        0 below a dead node; a node whose parent's row is not filled yet (done[s] == 0) stays
                        unknown and need[s] is set to 1. Returns how many rows were missing: the caller fills
                        them and calls again, which only visits the unknown nodes. When none was missing, it
                        sets out[i] = states[end[i]] > 0 for the n_tokens tokens (end[i] == 0: never allowed).

This header is also the cffi cdef (see runtime_c/build.py): plain declarations only.
*/
#ifndef TINYLLM_GRAMMAR_H
#define TINYLLM_GRAMMAR_H

#include <stdint.h>

long grammar_trie_walk(int32_t *states, const int32_t *parent, const uint8_t *byte, long n_nodes,
                       const int32_t *rows, const uint8_t *done, uint8_t *need, long n_rows,
                       const int32_t *end, uint8_t *out, long n_tokens);

#endif  // TINYLLM_GRAMMAR_H
