"""The token matcher held to exact oracles over the whole vocabulary: at every step of random accepted paths,
allowed() is True for exactly the tokens after which the output is still a prefix of some string of the language
(end of text exactly where it is complete), for choices and for regexes, with tokens that split UTF-8 characters;
then accept, rollback and end of text, and the errors."""
import functools
import random
import re
import unicodedata

import numpy as np
import pytest
import regex

from tinyllm.grammar.matcher import compile

ALPHABET = [b"a", b"b", b"c", b"x", b"1", b"2", b"9", b"-", b"@", b".", b" ", b"\n", b'"', b"\\",
            "é".encode(), "ü".encode(), "中".encode(), "😀".encode()]


class ByteTokenizer:
    """A test tokenizer: every single byte, some multi-byte merges (several split UTF-8 characters: a lead byte
    with a continuation, a continuation with ASCII after it), and end of text last."""

    def __init__(self, seed=0):
        rng = random.Random(seed)
        merges = {b"ab", b"abc", b"12", b"2024", b"-0", b"a@b.c", "é".encode()[:1] + b"", "é".encode()[1:] + b"x",
                  "中".encode()[:2], "中".encode()[1:], "😀".encode()[:3], b"\\n", b'"a', b"  "}
        for _ in range(60):
            merges.add(b"".join(rng.choice(ALPHABET) for _ in range(rng.randint(2, 3))))
        self.tokens = [bytes([i]) for i in range(256)] + sorted(m for m in merges if len(m) > 1)
        self.n_vocab = len(self.tokens) + 1
        self.eot_token = self.n_vocab - 1

    def decode_single_token_bytes(self, i):
        return b"<|endoftext|>" if i == self.eot_token else self.tokens[i]


TOK = ByteTokenizer()


# ---- oracles ----
def choice_oracle(options, prefix):
    """{token: allowed} for a choice grammar after `prefix` (bytes), straight from the definition."""
    enc = [o.encode() for o in options]
    allowed = np.zeros(TOK.n_vocab, bool)
    for t in range(TOK.n_vocab - 1):
        s = prefix + TOK.decode_single_token_bytes(t)
        allowed[t] = len(s) > len(prefix) and any(o.startswith(s) for o in enc)
    allowed[TOK.eot_token] = prefix in enc
    return allowed


@functools.lru_cache(maxsize=None)
def completions(lead):
    """The characters whose UTF-8 encoding starts with the incomplete sequence `lead` and that Python's own
    Unicode database assigns (the `regex` module's newer Unicode classifies characters `re` does not know); None
    when there are more than 4,096 (a lone lead byte of a 3- or 4-byte character: too many to check here; the
    automaton's own tests, tests/test_grammar_regex.py, check those splits)."""
    size = 2 if lead[0] < 0xE0 else 3 if lead[0] < 0xF0 else 4
    if len(lead) >= size:  # as long as its character, and not one: invalid, nothing completes it
        return []
    if 6 * (size - len(lead)) > 12:
        return None
    out = []
    for rest in range(1 << (6 * (size - len(lead)))):
        tail = bytes(0x80 | (rest >> (6 * k)) & 0x3F for k in reversed(range(size - len(lead))))
        try:
            c = (lead + tail).decode()
        except UnicodeDecodeError:
            continue
        if unicodedata.category(c) != "Cn":
            out.append(c)
    return out


@functools.lru_cache(maxsize=None)
def disagree(c):
    """Whether `re` (the grammar's meaning) and the `regex` module (the oracle) class character c differently
    in \\d, \\w or \\s: their Unicode versions and definitions differ (\\x1c-\\x1f are whitespace to re only,
    combining marks word characters to regex only). The oracle says nothing about such characters."""
    return any(bool(re.fullmatch(k, c)) != bool(regex.fullmatch(k, c)) for k in (r"\d", r"\w", r"\s"))


@functools.lru_cache(maxsize=None)
def regex_live(pattern, data):
    """Whether bytes `data` can be continued to a full match of `pattern` (the `regex` module's partial match;
    an incomplete trailing UTF-8 character counts when one of its completions can); None when that cannot be
    checked here (completions returns None)."""
    for cut in range(0, min(4, len(data)) + 1):
        head, tail = data[:len(data) - cut], data[len(data) - cut:]
        try:
            text = head.decode()
        except UnicodeDecodeError:
            continue
        if any(disagree(ch) for ch in text):
            return None
        if not tail:
            return regex.fullmatch(pattern, text, partial=True) is not None
        if not 0xC0 <= tail[0] < 0xF5:  # not a lead byte: this cut is no incomplete character
            continue
        chars = completions(tail)
        if chars is None:
            return None
        if any(regex.fullmatch(pattern, text + c, partial=True) is not None for c in chars if not disagree(c)):
            return True
        return None if any(disagree(c) for c in chars) else False
    return False


def regex_complete(pattern, data):
    try:
        return regex.fullmatch(pattern, data.decode()) is not None
    except UnicodeDecodeError:
        return False


def regex_oracle(pattern, prefix):
    """(allowed, checked): the oracle's verdict per token, and where it could give one."""
    allowed, checked = np.zeros(TOK.n_vocab, bool), np.ones(TOK.n_vocab, bool)
    for t in range(TOK.n_vocab - 1):
        live = regex_live(pattern, prefix + TOK.decode_single_token_bytes(t))
        allowed[t], checked[t] = bool(live), live is not None
    allowed[TOK.eot_token] = regex_complete(pattern, prefix)
    return allowed, checked


COVERAGE = [0, 0]  # (tokens the oracle judged, tokens compared) over the walks


def walk(grammar, oracle, seed, steps=12):
    """A random path of allowed tokens; at every step allowed() equals the oracle over the whole vocabulary.
    Returns the bytes accepted, how many steps were compared, and whether it ended with end of text."""
    rng = random.Random(seed)
    m = grammar.matcher()
    out, compared, ended = b"", 0, False
    for _ in range(steps):
        want, got = oracle(out), m.allowed()
        checked = np.ones(TOK.n_vocab, bool)
        if isinstance(want, tuple):
            want, checked = want
        wrong = [TOK.decode_single_token_bytes(int(i)) for i in np.flatnonzero((got != want) & checked)][:8]
        np.testing.assert_array_equal(got[checked], want[checked], err_msg=f"after {out!r}: tokens {wrong}")
        compared += 1
        COVERAGE[0] += int(checked.sum())
        COVERAGE[1] += checked.size
        choices = np.flatnonzero(got & checked)  # (the next prefix one the oracle can check)
        if not len(choices):
            break
        t = int(rng.choice(list(choices)))
        m.accept(t)
        if t == TOK.eot_token:
            assert m.is_terminated() and not m.allowed().any()
            ended = True
            break
        out += TOK.decode_single_token_bytes(t)
    return out, compared, ended


CHOICES = [["yes", "no", "maybe"], ["a", "ab", "abc", "b"], ["é", "ü", "中文", "😀!", "1-2"], ["x"], ["", "a"]]


@pytest.mark.parametrize("options", CHOICES, ids=lambda o: "|".join(o) or "empty")
def test_choice_masks_equal_the_definition(options):
    g = compile(TOK, choice=options)
    endings = 0
    for seed in range(6):
        out, _, ended = walk(g, lambda prefix: choice_oracle(options, prefix), seed, steps=20)
        assert ended and out in {o.encode() for o in options}  # a choice's path always ends, on an option
        endings += ended
    assert endings == 6


PATTERNS = [r"\d+", r"[a-c]+@[a-c]+\.c", r"(ab|cd)*x?", r"\d{2,4}-\w+", r'"[^"\\]*"', r"é+ü?", r".{0,3}",
            r"\s+", r"\d{4}-\d{2}-\d{2}", r"[^a-z]{1,3}", r"\w+ \w+", r"(1|12|2024)(-0)?"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_regex_masks_equal_the_regex_modules_partial_match(pattern):
    g = compile(TOK, regex=pattern)
    compared = 0
    COVERAGE[:] = [0, 0]
    for seed in range(4):
        _, n, _ = walk(g, lambda prefix: regex_oracle(pattern, prefix), seed, steps=8)
        compared += n
    assert compared >= 4
    # the oracle judges every token but the lone lead bytes of 3- and 4-byte characters (21 of 329)
    assert COVERAGE[0] >= 0.9 * COVERAGE[1]


def test_a_token_that_splits_a_character_is_allowed_when_a_completion_matches():
    g = compile(TOK, regex=r"é+")
    lead = TOK.tokens.index("é".encode()[:1])  # 0xC3 alone: é, ü, ... begin with it
    m = g.matcher()
    assert m.allowed()[lead]
    m.accept(lead)
    allowed = m.allowed()
    assert allowed[TOK.tokens.index("é".encode()[1:])] and not allowed[TOK.tokens.index("ü".encode()[1:])]
    assert not allowed[TOK.eot_token]  # half a character is not text


# ---- accept, rollback, end of text ----
def tok(b):
    return TOK.tokens.index(b)


def test_accept_rollback_and_end_of_text():
    g = compile(TOK, choice=["ab", "abc"])
    assert compile(TOK, choice=["ab", "abc"]) is g  # cached per (spec, tokenizer)
    m = g.matcher()
    m.accept(tok(b"a"))
    with pytest.raises(ValueError, match=r"token 120 \(b'x'\) at position 1 cannot continue any string of "
                                         r"choice=\['ab', 'abc'\]"):
        m.accept(tok(b"x"))
    before = m.allowed().copy()  # a refused token left the state as it was
    with pytest.raises(ValueError, match="end of text .* at position 1, but the output is not complete"):
        m.accept(TOK.eot_token)
    np.testing.assert_array_equal(m.allowed(), before)
    m.accept(tok(b"b"))
    assert m.allowed()[TOK.eot_token] and m.allowed()[tok(b"c")]
    m.accept(TOK.eot_token)
    assert m.is_terminated()
    with pytest.raises(ValueError, match="follows end of text"):
        m.accept(tok(b"c"))
    m.rollback(1)  # end of text counts as one token
    assert not m.is_terminated()
    m.accept(tok(b"c"))
    m.rollback(3)
    np.testing.assert_array_equal(m.allowed(), g.matcher().allowed())
    with pytest.raises(ValueError, match="cannot take back 1 tokens, 0 were accepted"):
        m.rollback(1)
    with pytest.raises(ValueError, match=r"token id -1 is outside the vocabulary \[0, "):
        m.accept(-1)
    with pytest.raises(ValueError, match="is outside the vocabulary"):
        m.accept(TOK.n_vocab)


class NoBytes:
    n_vocab, eot_token = 3, 2


@pytest.mark.parametrize("call, error, message", [
    (lambda: compile(TOK, choice=[]), ValueError, r"choice=\[\] has no option"),
    (lambda: compile(TOK, choice="ab"), TypeError, "choice must be a list of strings"),
    (lambda: compile(TOK, regex="a", choice=["a"]), TypeError, "exactly one of .* got regex, choice"),
    (lambda: compile(TOK), TypeError, "got none"),
    (lambda: compile(NoBytes(), regex="a"), TypeError, "has no decode_single_token_bytes"),
    (lambda: compile(TOK, regex=3), TypeError, "regex must be a str pattern"),
    (lambda: compile(TOK, json_schema={"type": "strin"}), ValueError, "type 'strin' at # is not a JSON Schema type"),
    (lambda: compile(TOK, json_schema={"not": {}}), ValueError, "keyword 'not' at # is not supported"),
    (lambda: compile(TOK, json_schema={"$ref": "#/$defs/x"}), ValueError, "cannot be resolved"),
    (lambda: compile(TOK, gbnf='root ::= item'), ValueError, "line 1, column 10: rule 'item' is used but not"),
    (lambda: compile(TOK, regex="a", whitespace_flexible=True), TypeError, "applies to json_schema= only"),
    (lambda: compile(TOK, json_schema={"type": "string", "enum": []}), ValueError, "language is empty"),
])
def test_bad_specs_are_clear_errors(call, error, message):
    with pytest.raises(error, match=message):
        call()
