"""Constrained decoding: regexes, JSON Schemas, GBNF grammars and choices compiled to byte-level automata
(regex_dfa.py, cfg.py), matched against a tokenizer's tokens (matcher.py); docs/grammar.md tells the whole story.

    g = tinyllm.grammar.compile(tokenizer, json_schema=... | regex=... | gbnf=... | choice=[...])
    model.generate(idx, max_new_tokens, grammar=g)
"""
from .matcher import Grammar, Matcher, compile  # noqa: F401
