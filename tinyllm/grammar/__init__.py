"""Constrained decoding (issue 45, in progress): grammars compiled to byte-level automata (regex_dfa.py), matched
against a tokenizer's tokens (matcher.py); `compile(tokenizer, regex=... | choice=...)`."""
from .matcher import Grammar, Matcher, compile  # noqa: F401
