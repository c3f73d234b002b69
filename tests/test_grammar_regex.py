"""tinyllm.grammar.regex_dfa against an exact oracle: at every prefix of random byte strings, `accepting` must equal
re.fullmatch on the decoded text, and `live` must equal the `regex` module's partial fullmatch (for a prefix that
ends inside a multi-byte character: whether some completion of that character is live)."""
import functools
import random
import re

import pytest
import regex
from hypothesis import given, strategies as st

from tinyllm.grammar.regex_dfa import DEAD, compile_regex

PATTERNS = [
    r"\d+",
    r"[a-z]+@[a-z]+\.com",
    r"(ab|cd)*e?",
    r"\d{2,4}-\w+",
    r'[^"\\]*',
    "é+ü?",
    r".{0,3}",
    r"\s+",
    r"\d{4}-\d{2}-\d{2}",
    r"[\u0400-\u04ff]+\d*",
    r"[^\W\d_]+( [^\W\d_]+)*",
    r"\D\S\W",
    r"(?:[αβγ]|日本|😀+)*x?",
    r"^(?P<year>\d{4})?$",
    r"a{,2}b{3,}c{2}",
    r"x{}y{",
    r"[\]a-]+\x41\u00e9\t\n?",
    r"(a|b)*?c+?d??",
    r'"([^"\\]|\\["\\/bfnrt])*"',
    r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?",
    r"",
    r"(?#a comment)ab",
]

# characters the random texts are built from, besides each pattern's own characters
EXTRA = "aAzZ09 _-.@\"\\\n\t\r\x0b\x1c\x85\xa0éüß€日本😀αβγЖж٣१\u2028\u3000\U00010000\U0010fffd\ufffd\x00\x7f"


@functools.lru_cache(maxsize=None)
def _agree(c):
    """True when re and regex agree on c for every class the patterns use (their Unicode versions may differ)."""
    return all(bool(re.fullmatch(k, c)) == bool(regex.fullmatch(k, c)) for k in (r"\d", r"\w", r"\s", r"."))


def _alphabet(pattern):
    chars = set(EXTRA) | set(pattern) | set(re.sub(r"\\.", "", pattern))
    return sorted(c for c in chars if not 0xD800 <= ord(c) <= 0xDFFF and _agree(c))


# regex's partial matching is wrong with lazy quantifiers (regex.fullmatch("a*?b", "ac", partial=True) is a match):
# the oracle for liveness runs the greedy form, which has the same language
GREEDY = {r"(a|b)*?c+?d??": r"(a|b)*c+d?"}


def _oracle_live(pattern, text):
    return regex.fullmatch(GREEDY.get(pattern, pattern), text, partial=True) is not None


def _utf8_status(data):
    """'ok' (valid UTF-8), 'partial' (valid but for an incomplete last character: returns the bytes missing) or 'bad'."""
    try:
        data.decode("utf-8")
        return "ok", 0
    except UnicodeDecodeError:
        pass
    for k in (1, 2, 3):
        for first in (0x80, 0xA0):                      # only a character's second byte has a narrower range
            try:
                (data + bytes([first]) + b"\x80" * (k - 1)).decode("utf-8")
                return "partial", k
            except UnicodeDecodeError:
                pass
    return "bad", 0


def _completions(data):
    """The continuation bytes that keep `data` (ending in an incomplete character) a UTF-8 prefix."""
    return [b for b in range(0x80, 0xC0) if _utf8_status(data + bytes([b]))[0] != "bad"]


def check_bytes(dfa, pattern, data, rng):
    """Walk `data`, checking the DFA against the oracle at every prefix. Returns the number of prefixes checked."""
    s = dfa.start
    checked = 0
    for n in range(len(data) + 1):
        if n:
            s = dfa.step(s, data[n - 1])
        prefix = data[:n]
        assert dfa.step(DEAD, data[n - 1] if n else 0) == DEAD
        assert dfa.live(s) == (s != DEAD)
        status, missing = _utf8_status(prefix)
        if status == "ok":
            text = prefix.decode("utf-8")
            assert dfa.accepting(s) == bool(re.fullmatch(pattern, text)), (pattern, text)
            if all(map(_agree, text)):                  # (random bytes can decode to e.g. "\x1d": \s for re only)
                assert dfa.live(s) == _oracle_live(pattern, text), (pattern, text)
        elif status == "partial":
            assert not dfa.accepting(s), (pattern, prefix)
            conts = _completions(prefix)
            if missing == 1:                            # exhaustive: live iff some completed character is live
                check_bytes_from(dfa, pattern, prefix, s)
            else:                                       # live iff some continuation byte is; one of them by the oracle
                assert dfa.live(s) == any(dfa.live(dfa.step(s, b)) for b in conts), (pattern, prefix)
                longer, t = prefix, s
                while _utf8_status(longer)[1] > 1:      # random continuation bytes until one is missing
                    b = rng.choice(_completions(longer))
                    longer, t = longer + bytes([b]), dfa.step(t, b)
                check_bytes_from(dfa, pattern, longer, t)
        else:
            assert s == DEAD and not dfa.accepting(s), (pattern, prefix)
        checked += 1
        if s == DEAD and rng.random() < 0.5:
            break
    return checked


def check_bytes_from(dfa, pattern, prefix, s):
    """At `prefix` (one byte short of a complete character), `live` must be whether some completion is live."""
    status, missing = _utf8_status(prefix)
    assert status == "partial" and missing == 1
    texts = [(prefix + bytes([b])).decode("utf-8") for b in _completions(prefix)]
    if all(map(_agree, texts[0][:-1])):
        want = any(_oracle_live(pattern, t) for t in texts if _agree(t[-1]))
        if want or all(_agree(t[-1]) for t in texts):   # a character re and regex disagree on decides nothing
            assert dfa.live(s) == want, (pattern, prefix)


_DFAS = {}


def _dfa(pattern):
    if pattern not in _DFAS:
        _DFAS[pattern] = compile_regex(pattern)
    return _DFAS[pattern]


def _random_text(rng, alphabet, n):
    return "".join(rng.choice(alphabet) for _ in range(n))


@pytest.mark.parametrize("pattern", PATTERNS)
def test_random_strings_against_oracle(pattern):
    dfa = _dfa(pattern)
    rng = random.Random(hash(pattern) & 0xFFFF)
    alphabet = _alphabet(pattern)
    checked = 0
    for _ in range(60):
        text = _random_text(rng, alphabet, rng.randint(0, 12))
        checked += check_bytes(dfa, pattern, text.encode("utf-8"), rng)
    for _ in range(15):                                 # random bytes: mostly invalid UTF-8
        data = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        checked += check_bytes(dfa, pattern, data, rng)
    for _ in range(15):                                 # valid text cut inside a multi-byte character
        data = _random_text(rng, alphabet, rng.randint(1, 6)).encode("utf-8")
        checked += check_bytes(dfa, pattern, data[:rng.randint(0, len(data))], rng)
    assert checked > 100


# texts that match the pattern, so accepting paths (and their prefixes) are exercised, not only rejections
MATCHING = {
    r"\d+": ["0", "٣١23", "१"],
    r"[a-z]+@[a-z]+\.com": ["ab@cd.com", "x@y.com"],
    r"(ab|cd)*e?": ["", "abcdab", "cde", "e"],
    r"\d{2,4}-\w+": ["12-a", "1234-日本_x", "٣٣-é"],
    r'[^"\\]*': ["", "héllo 😀\n", "\x00"],
    "é+ü?": ["é", "éééü"],
    r".{0,3}": ["", "a😀é", "\r\x85"],
    r"\s+": [" \t\n\x0b\x0c\r\x85\xa0\u2028\u3000"],
    r"\d{4}-\d{2}-\d{2}": ["2026-12-06", "٢٠٢٦-١٢-٠٦"],
    r"[\u0400-\u04ff]+\d*": ["Жж12", "Ӿ"],
    r"[^\W\d_]+( [^\W\d_]+)*": ["hello wörld", "日本 ß"],
    r"\D\S\W": ["aa-", "日😀 "],
    r"(?:[αβγ]|日本|😀+)*x?": ["αβ日本😀😀x", ""],
    r"^(?P<year>\d{4})?$": ["", "1999"],
    r"a{,2}b{3,}c{2}": ["bbbcc", "aabbbbbcc"],
    r"x{}y{": ["x{}y{"],
    r"[\]a-]+\x41\u00e9\t\n?": ["]-aAé\t", "aAé\t\n"],
    r"(a|b)*?c+?d??": ["abcc", "cd"],
    r'"([^"\\]|\\["\\/bfnrt])*"': ['"a\\"b\\n日"', '""'],
    r"-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?": ["-0.5e+10", "123", "1E9"],
    r"": [""],
    r"(?#a comment)ab": ["ab"],
}


@pytest.mark.parametrize("pattern", sorted(MATCHING))
def test_matching_texts_and_their_mutations(pattern):
    dfa = _dfa(pattern)
    rng = random.Random(len(pattern))
    alphabet = _alphabet(pattern)
    for text in MATCHING[pattern]:
        assert re.fullmatch(pattern, text), (pattern, text)   # the examples themselves are right
        assert dfa.accepting(dfa.walk(text.encode("utf-8")))
        check_bytes(dfa, pattern, text.encode("utf-8"), rng)
        for _ in range(20):                             # one-character edits near the match
            chars = list(text)
            i = rng.randint(0, len(chars))
            op = rng.randrange(3)
            if op == 0:
                chars.insert(i, rng.choice(alphabet))
            elif op == 1 and chars:
                del chars[min(i, len(chars) - 1)]
            elif chars:
                chars[min(i, len(chars) - 1)] = rng.choice(alphabet)
            check_bytes(dfa, pattern, "".join(chars).encode("utf-8"), rng)


@given(st.data())
def test_hypothesis_texts(data):
    pattern = data.draw(st.sampled_from(PATTERNS))
    dfa = _dfa(pattern)
    alphabet = _alphabet(pattern)
    chars = st.one_of(st.sampled_from(alphabet), st.characters(exclude_categories=("Cs",)).filter(_agree))
    text = data.draw(st.lists(chars, max_size=10).map("".join))
    rng = random.Random(0)
    check_bytes(dfa, pattern, text.encode("utf-8"), rng)
    raw = data.draw(st.binary(max_size=8))
    check_bytes(dfa, pattern, raw, rng)


def test_dfa_is_deterministic_and_memoized():
    dfa = compile_regex(r"\w+@\w+")
    s1 = dfa.walk("日本@x".encode())
    n = dfa.num_states
    s2 = dfa.walk("日本@x".encode())
    assert s1 == s2 and dfa.num_states == n and dfa.accepting(s1)
    assert isinstance(dfa.start, int) and dfa.step(dfa.start, ord("@")) == DEAD
    assert dfa.step(DEAD, ord("a")) == DEAD and not dfa.live(DEAD) and not dfa.accepting(DEAD)


def test_transitions_row_agrees_with_step():
    for pattern in (r"\w+@\w+", r"é+ü?", r'"([^"\\]|\\["\\/bfnrt])*"'):
        fresh, stepped = compile_regex(pattern), compile_regex(pattern)
        rng = random.Random(1)
        s = t = fresh.start
        for _ in range(6):
            row = fresh.transitions(s)
            assert len(row) == 256 and all(stepped.live(stepped.step(t, b)) == (row[b] != DEAD) for b in range(256))
            live = [b for b in range(256) if row[b] != DEAD]
            if not live:
                break
            b = rng.choice(live)
            s, t = row[b], stepped.step(t, b)
            assert fresh.accepting(s) == stepped.accepting(t)
    assert compile_regex("a").transitions(DEAD) == [DEAD] * 256


def test_never_matching_pattern_starts_dead():
    # not in PATTERNS: regex's partial match does not look inside an empty class (it calls "" a partial match)
    dfa = compile_regex(r"[^\s\S]")
    assert dfa.start == DEAD and not dfa.live(dfa.start)
    dfa = compile_regex(r"a[^\s\S]|b")
    assert dfa.step(dfa.start, ord("a")) == DEAD and dfa.accepting(dfa.step(dfa.start, ord("b")))
    # a dead end several bytes (and a multi-byte character) deep is pruned at its first byte
    for pattern in (r"ab[^\s\S]|c", r"(ab[^\s\S])*c", r"(?:é\ud800)?c", r"a{2}[^\s\S]|aab"):
        dfa = compile_regex(pattern)
        assert dfa.step(dfa.start, ord("a")) == DEAD or pattern.startswith("a{2}"), pattern
        assert dfa.step(dfa.start, "é".encode()[0]) == DEAD, pattern
        assert dfa.accepting(dfa.walk(b"c")) or dfa.accepting(dfa.walk(b"aab")), pattern
    dfa = compile_regex(r"a{2}[^\s\S]|aab")
    assert dfa.live(dfa.walk(b"aa")) and dfa.walk(b"aac") == DEAD and dfa.accepting(dfa.walk(b"aab"))


def test_large_repeat_counts():
    dfa = compile_regex(r"\d{3,50}")
    for n in (2, 3, 50, 51):
        assert dfa.accepting(dfa.walk(b"7" * n)) == (3 <= n <= 50)
        assert dfa.live(dfa.walk(b"7" * n)) == (n <= 50)


@pytest.mark.parametrize("pattern, construct, pos", [
    (r"(a)\1", "backreference", 3),
    (r"(?P<x>a)(?P=x)", "named backreference", 8),
    (r"a(?=b)", "lookahead", 1),
    (r"a(?!b)", "lookahead", 1),
    (r"(?<=a)b", "lookbehind", 0),
    (r"(?<!a)b", "lookbehind", 0),
    (r"(?i)abc", "inline flags", 0),
    (r"x(?i:a)", "inline flags", 1),
    (r"a*+", "possessive", 1),
    (r"(?>ab)", "atomic group", 0),
    (r"(a)?(?(1)b|c)", "conditional", 4),
    (r"a^b", "'^'", 1),
    (r"a$b", "'$'", 1),
    (r"\bfoo", "word boundary", 0),
    (r"a\Bb", "word boundary", 1),
])
def test_unsupported_constructs(pattern, construct, pos):
    re.compile(pattern)                                 # valid for re: only unsupported here
    with pytest.raises(ValueError, match=re.escape(construct) + r".*position %d\b" % pos):
        compile_regex(pattern)


@pytest.mark.parametrize("pattern", ["a(", "[a-", "*a", "a{3,2}", r"\q", "(?P<1>a)", "a)"])
def test_invalid_regex(pattern):
    with pytest.raises(ValueError, match=r"^compile_regex: "):
        compile_regex(pattern)


def test_pattern_must_be_str():
    with pytest.raises(TypeError):
        compile_regex(b"abc")


_ATOMS = ["a", "b", "é", "日", "😀", ".", r"\d", r"\w", r"\s", r"\D", r"\W", r"\S", "[ab]", "[^a]", "[a-cé]", r"[^\w]",
          r"[\d日]", r"\.", r"\n", r"\x41", r"\u00e9", "[]a]", r"[^]b]", r"\0", r"\-", "a{", r"\N{BULLET}", "[é-ü]"]
_QUANTS = ["*", "+", "?", "{2}", "{1,3}", "{,2}", "{2,}", "{0}", "{1,6}"]


def _random_pattern(rng, depth=0):
    r = rng.random()
    if depth > 2 or r < 0.4:
        a = rng.choice(_ATOMS)
    elif r < 0.6:
        a = "(" + rng.choice(["", "?:", "?P<g%d>" % rng.randrange(10 ** 6)]) + \
            "|".join(_random_pattern(rng, depth + 1) for _ in range(rng.randint(1, 3))) + ")"
    else:
        a = "(?:%s)" % "".join(_random_pattern(rng, depth + 1) for _ in range(rng.randint(1, 3)))
    if rng.random() < 0.3:
        a += rng.choice(_QUANTS)
    return a


def test_random_patterns_against_oracle():
    """Random patterns from the supported constructs (greedy only, so regex's partial matching is a sound oracle)."""
    rng = random.Random(45)
    chars = "abé日😀0١ \n\t-.A{}]•_xü"
    compared = 0
    for _ in range(80):
        pattern = _random_pattern(rng)
        dfa = compile_regex(pattern)
        for _ in range(15):
            text = "".join(rng.choice(chars) for _ in range(rng.randint(0, 6)))
            s = dfa.walk(text.encode("utf-8"))
            assert dfa.accepting(s) == bool(re.fullmatch(pattern, text)), (pattern, text)
            assert dfa.live(s) == _oracle_live(pattern, text), (pattern, text)
            compared += 1
    assert compared == 1200
