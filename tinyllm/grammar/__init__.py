"""Constrained decoding: grammars compiled to byte-level automata, matched against a tokenizer's tokens (issue 45; in progress)."""
