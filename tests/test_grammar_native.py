"""The C automaton (NativeDFA, runtime_c/grammar.c) against the Python reference (RegexDFA): the same DFA up to the
numbering of states, for regexes, counted repetitions (their copies made in NumPy for C, on demand in Python) and a
grammar's rules with calls; and the masks of the three walks (C automaton with the C walk, Python automaton with the
C walk pausing for rows, Python automaton with the NumPy walk) equal along random paths."""
import random
import weakref

import numpy as np
import pytest

import tinyllm.grammar.cfg as cfg_module
import tinyllm.grammar.matcher as gm
import tinyllm.grammar.regex_dfa as rd
from tinyllm.grammar.cfg import CFG
from tinyllm.grammar.gbnf import parse_gbnf
from tinyllm.grammar.json_schema import schema_grammar
from tinyllm.grammar.regex_parse import _Parser
from test_grammar_matcher import TOK
from test_grammar_regex import PATTERNS, _random_pattern

COUNTED = [r"[a-c]{2,9}(@[0-9]{1,12})?\.?", r"(a{2,9}b){3,7}", r"(x|(ab){0,6}){0,5}y", r"[^\s\S]{0,5}a|b{0,8}",
           r"(é{1,5}|日{0,4}){2,6}", r"\d{3,50}"]


@pytest.fixture(autouse=True)
def _needs_kernels():
    assert rd.kernels() is not None, "the C kernels are not built: `pip install -e .` (this test compares them)"


def _both(pattern):
    """(Python, C) automata of `pattern`, each from its own NFA."""
    out = []
    for cls in (rd.RegexDFA, rd.NativeDFA):
        nfa = rd._NFA()
        start, final = nfa.new(), nfa.new()
        nfa.build(_Parser(pattern).parse(), start, final)
        out.append(cls(pattern, nfa, start, final))
    return out


def _same_dfa(a, b, limit=600, calls=False):
    """Walk a and b side by side from their starts: a bijection between their states must carry every row,
    acceptance (and a rule's calls and has_bytes) across; returns how many states were compared."""
    pair, todo = {a.start: b.start}, [a.start]
    if a.start == rd.DEAD:
        assert b.start == rd.DEAD
        return 0
    while todo and len(pair) < limit:
        s = todo.pop()
        t = pair[s]
        assert a.accepting(s) == b.accepting(t)
        nxt = [(x, y) for x, y in zip(a.transitions(s), b.transitions(t))]
        if calls:
            assert a.has_bytes(s) == b.has_bytes(t)
            ca, cb = a.calls(s), b.calls(t)
            assert [k for k, _ in ca] == [k for k, _ in cb]
            nxt += [(x, y) for (_, x), (_, y) in zip(ca, cb)]
        for x, y in nxt:
            assert (x == rd.DEAD) == (y == rd.DEAD), (getattr(a, "pattern", a), s)
            if x == rd.DEAD:
                continue
            if x in pair:
                assert pair[x] == y, (getattr(a, "pattern", a), s)
            else:
                pair[x] = y
                todo.append(x)
    assert len(set(pair.values())) == len(pair)
    return len(pair)


@pytest.mark.parametrize("pattern", PATTERNS + COUNTED)
def test_c_automaton_is_the_python_one(pattern):
    py, c = _both(pattern)
    assert _same_dfa(py, c) >= (0 if py.start == rd.DEAD else 1)


def test_random_patterns_build_the_same_automaton():
    rng = random.Random(7)
    compared = 0
    for _ in range(60):
        compared += _same_dfa(*_both(_random_pattern(rng)), limit=200)
    assert compared > 300


@pytest.mark.parametrize("spec", [
    dict(gbnf='root ::= "(" root ")" root | "é" | ""'),
    dict(gbnf='root ::= item ("," item){0,6}\nitem ::= [a-z]{1,9} | "[" root? "]"'),
    dict(json_schema={"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                                      "kids": {"type": "array", "items": {"$ref": "#"}}},
                      "required": ["name"]}),
])
def test_grammar_rules_build_the_same_automata(spec, monkeypatch):
    """A grammar with calls: each rule's automaton (calls and has_bytes included), and the parser's states."""
    def grammar():
        if "gbnf" in spec:
            return CFG(*parse_gbnf(spec["gbnf"]), "gbnf")
        return CFG(*schema_grammar(spec["json_schema"]), "json_schema")

    c = grammar()
    with monkeypatch.context() as m:
        m.setattr(cfg_module, "automaton", rd.RegexDFA)
        py = grammar()
    assert all(isinstance(d, rd.NativeDFA) for d in c.dfas) and all(type(d) is rd.RegexDFA for d in py.dfas)
    for a, b in zip(py.dfas, c.dfas):
        _same_dfa(a, b, calls=True)
    assert _same_dfa(py, c, limit=300) > 10


@pytest.mark.parametrize("spec", [dict(regex=r"[a-c]{2,5}(@[0-9]+)?\.?"), dict(regex=r"[^\"]{0,40}é?"), dict(
    json_schema={"type": "object", "properties": {"k": {"type": "string", "maxLength": 6}, "n": {"type": "integer"}}}),
    dict(gbnf='root ::= "(" root ")" root | "é" | ""')])
def test_the_three_walks_give_the_same_masks(spec, monkeypatch):
    """C automaton + C walk (the default), Python automaton + C walk (pausing for rows), Python automaton + NumPy
    walk (no kernels): equal masks along random paths."""
    def fresh(native, c_walk):
        with monkeypatch.context() as m:
            m.setattr(gm, "_compiled", weakref.WeakKeyDictionary())
            if not native:
                m.setattr(rd, "kernels", lambda: None)
            g = gm.compile(TOK, **spec)
            g.trie = gm.TokenTrie(TOK, TOK.eot_token)   # (its own: the walk is patched below)
        if not c_walk:
            g.trie.allowed = _numpy_walk(g.trie.allowed, monkeypatch)
        return g

    grammars = [fresh(True, True), fresh(False, True), fresh(False, False)]
    assert isinstance(grammars[0].dfa, (rd.NativeDFA, CFG)) and not isinstance(grammars[1].dfa, rd.NativeDFA)
    rng = random.Random(0)
    for _ in range(4):
        ms = [g.matcher() for g in grammars]
        for _ in range(16):
            masks = [m.allowed() for m in ms]
            for other in masks[1:]:
                assert (other == masks[0]).all()
            if masks[0][TOK.eot_token] and rng.random() < 0.3 or not masks[0].any():
                break
            t = int(rng.choice(np.flatnonzero(masks[0])))
            for m in ms:
                m.accept(t)


def _numpy_walk(walk, monkeypatch):
    def allowed(automaton, state, out):
        with monkeypatch.context() as m:
            m.setattr(gm, "kernels", lambda: None)
            return walk(automaton, state, out)
    return allowed


def test_out_of_range_states_are_refused():
    _, c = _both("ab")
    lib, ffi = c._lib, c._ffi
    assert lib.gdfa_closure(c._g, ffi.from_buffer("int32_t[]", np.array([10 ** 6], np.int32)), 1) == -3
    assert lib.gdfa_row(c._g, c.num_states + 5) == ffi.NULL
