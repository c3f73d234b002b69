/*
Constrained decoding's token mask (tinyllm/grammar/matcher.py): a grammar automaton walked down the tokenizer's
token trie. The trie's nodes are numbered in preorder (node 0 the root; a node's subtree is the nodes n ..
skip[n] - 1), and the tokens that end at node n are tok_ids[tok_start[n] .. tok_start[n + 1] - 1].
rows[s * 256 + b] is the automaton's state after byte b from state s, states counted from 1 (0: dead).

    grammar_trie_walk:  for each subtree root in pending[0 .. n_pending - 1] (whose parent's state is known and
                        live), gives each node of the subtree states[n] = rows[states[parent[n]] * 256 + byte[n]]
                        and sets out[id] = 1 for the tokens ending at each live node, skipping the subtree of
                        every dead node. A node whose parent's row is not filled yet (done[s] == 0) is not
                        entered: need[s] is set and the node is appended to blocked, whose count is returned. The
                        caller fills those rows and calls again with blocked as pending; the mask is complete when
                        it returns 0. Only the live part of the trie is visited.

This header is also the cffi cdef (see runtime_c/build.py): plain declarations only.
*/
#ifndef TINYLLM_GRAMMAR_H
#define TINYLLM_GRAMMAR_H

#include <stdint.h>

long grammar_trie_walk(int32_t *states, const int32_t *parent, const uint8_t *byte, const int32_t *skip,
                       const int32_t *tok_start, const int32_t *tok_ids, const int32_t *rows, const uint8_t *done,
                       uint8_t *need, const int32_t *pending, long n_pending, int32_t *blocked, uint8_t *out);

#endif  // TINYLLM_GRAMMAR_H
