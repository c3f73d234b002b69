"""Python-`re` regex syntax parsed to the grammar AST of nodes.py, and code-point sets as UTF-8 byte-range sequences
(for regex_dfa.py's NFA).

Character sets (`[...]`, `.`, `\\d`, `\\w`, `\\s` and their negations) take re's own meaning: the set's text is run by
`re` over every code point once (cached), and the code-point ranges become UTF-8 byte-range sequences (the
utf8-ranges algorithm of Rust's regex-syntax). Positions are kept for the errors.
"""
import functools
import re
import unicodedata

_MAX_CP = 0x10FFFF
_SUR_LO, _SUR_HI = 0xD800, 0xDFFF

# ---------------------------------------------------------------- code-point sets and UTF-8 byte ranges

@functools.lru_cache(maxsize=1)
def _all_chars():
    """Every code point except the surrogates, in order (position p is code point p, or p + 0x800 past them)."""
    import numpy as np
    cps = np.concatenate([np.arange(_SUR_LO), np.arange(_SUR_HI + 1, _MAX_CP + 1)]).astype("<u4")
    return cps.tobytes().decode("utf-32-le")


def _pos_cp(p):
    return p if p < _SUR_LO else p + (_SUR_HI - _SUR_LO + 1)


_ASCII_CLASS = re.compile(r"\[(?:[ -\[\]-~]|\\[^dDwWsSxuUN0-9])*\]")   # [...] of ASCII, no ^ or \\d \\w \\x ...


@functools.lru_cache(maxsize=None)
def _charset(text):
    """Code-point ranges ((lo, hi) inclusive, no surrogates, sorted) that the single-character re `text` matches."""
    out = []
    if text == ".":                                     # everything but a newline
        return ((0, 9), (11, _SUR_LO - 1), (_SUR_HI + 1, _MAX_CP))
    if _ASCII_CLASS.fullmatch(text):                    # ASCII items: 128 characters to try instead of 1.1M
        negated = text[1:2] == "^"
        members = _charset("[" + "\\" * (text[2:3] == "^") + text[2:]) if negated else None
        if negated:                                     # everything else
            out, at = [], 0
            for lo, hi in members + ((_SUR_LO, _SUR_HI),):
                if at < lo:
                    out.append((at, lo - 1))
                at = hi + 1
            return tuple(out) + ((_SUR_HI + 1, _MAX_CP),)
        universe = "".join(map(chr, range(128)))
    else:
        universe = _all_chars()
    for m in re.finditer("(?:%s)+" % text, universe):
        lo, hi = _pos_cp(m.start()), _pos_cp(m.end() - 1)
        if lo < _SUR_LO <= hi:
            out += [(lo, _SUR_LO - 1), (_SUR_HI + 1, hi)]
        else:
            out.append((lo, hi))
    return tuple(out)


def _utf8_sequences(lo, hi):
    """Split the code-point range [lo, hi] (no surrogates) into byte-range sequences [(blo, bhi), ...]: the UTF-8
    encodings of the range are exactly the byte strings each matching one sequence (Rust's `Utf8Sequences`)."""
    out, stack = [], [(lo, hi)]
    while stack:
        lo, hi = stack.pop()
        while True:
            for m in (0x7F, 0x7FF, 0xFFFF):            # split where the encoded length changes
                if lo <= m < hi:
                    stack.append((m + 1, hi))
                    hi = m
                    break
            else:
                if hi <= 0x7F:
                    out.append([(lo, hi)])
                    break
                for i in (1, 2, 3):
                    m = (1 << (6 * i)) - 1
                    if lo & ~m != hi & ~m:
                        if lo & m:
                            stack.append(((lo | m) + 1, hi))
                            hi = lo | m
                            break
                        if hi & m != m:
                            stack.append((hi & ~m, hi))
                            hi = (hi & ~m) - 1
                            break
                else:
                    a, b = chr(lo).encode("utf-8"), chr(hi).encode("utf-8")
                    out.append(list(zip(a, b)))
                    break
    return out


@functools.lru_cache(maxsize=4096)
def _cp_ranges_to_seqs(ranges):
    seqs = []
    for lo, hi in ranges:
        seqs += _utf8_sequences(lo, hi)
    return tuple(tuple(seq) for seq in seqs)


def _char_ranges(c):
    cp = ord(c)
    return () if _SUR_LO <= cp <= _SUR_HI else ((cp, cp),)


# ---------------------------------------------------------------- parser (positions kept for the errors)

_BRACES = re.compile(r"\{(\d*)(,(\d*))?\}")


class _Parser:
    # AST: ("set", ranges) | ("cat", [nodes]) | ("alt", [nodes]) | ("rep", node, min, max-or-None)
    def __init__(self, pattern):
        self.p, self.i, self.n = pattern, 0, len(pattern)

    def unsupported(self, what, pos):
        raise ValueError("compile_regex: %s at position %d of %r is not supported" % (what, pos, self.p))

    def peek(self, k=0):
        j = self.i + k
        return self.p[j] if j < self.n else ""

    def parse(self):
        node = self.alt()
        if self.i != self.n:                            # re.compile already rejected an unbalanced ')'
            raise ValueError("compile_regex: unexpected %r at position %d of %r" % (self.peek(), self.i, self.p))
        return node

    def alt(self):
        branches = [self.cat()]
        while self.peek() == "|":
            self.i += 1
            branches.append(self.cat())
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def cat(self):
        items = []
        while self.i < self.n and self.peek() not in "|)":
            atom = self.atom()
            while True:
                q = self.quantifier()
                if q is None:
                    break
                atom = ("rep", atom, q[0], q[1])
            items.append(atom)
        return items[0] if len(items) == 1 else ("cat", items)

    def quantifier(self):
        c, start = self.peek(), self.i
        if c in ("*", "+", "?"):
            self.i += 1
            lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        elif c == "{":
            m = _BRACES.match(self.p, self.i)
            if m is None or m.group(0) == "{}":
                return None                             # a literal '{', as in re
            lo = int(m.group(1)) if m.group(1) else 0
            if m.group(2) is None:
                hi = lo
            else:
                hi = int(m.group(3)) if m.group(3) else None
            self.i = m.end()
        else:
            return None
        if self.peek() == "?":                          # lazy: the same language
            self.i += 1
        elif self.peek() == "+":
            self.unsupported("possessive quantifier", start)
        return lo, hi

    def atom(self):
        c, pos = self.peek(), self.i
        if c == "(":
            return self.group()
        if c == "[":
            return self.klass()
        if c == ".":
            self.i += 1
            return ("set", _charset("."))
        if c == "^":
            self.i += 1
            if pos != 0:
                self.unsupported("'^' anchor (other than at the start)", pos)
            return ("cat", [])
        if c == "$":
            self.i += 1
            if pos != self.n - 1:
                self.unsupported("'$' anchor (other than at the end)", pos)
            return ("cat", [])
        if c == "\\":
            return self.escape()
        self.i += 1
        return ("set", _char_ranges(c))

    def group(self):
        pos = self.i
        self.i += 1
        if self.peek() == "?":
            rest = self.p[self.i + 1:self.i + 3]
            if rest.startswith(":"):
                self.i += 2
            elif rest == "P<":
                self.i = self.p.index(">", self.i) + 1
            elif rest == "P=":
                self.unsupported("named backreference (?P=...)", pos)
            elif rest.startswith("=") or rest.startswith("!"):
                self.unsupported("lookahead assertion", pos)
            elif rest in ("<=", "<!"):
                self.unsupported("lookbehind assertion", pos)
            elif rest.startswith(">"):
                self.unsupported("atomic group (?>...)", pos)
            elif rest.startswith("#"):
                self.i = self.p.index(")", self.i) + 1
                return ("cat", [])
            elif rest.startswith("("):
                self.unsupported("conditional group (?(...)...)", pos)
            else:
                self.unsupported("inline flags group", pos)
        node = self.alt()
        if self.peek() != ")":
            raise ValueError("compile_regex: missing ')' for the group at position %d of %r" % (pos, self.p))
        self.i += 1
        return node

    def klass(self):
        j = self.i + 1
        if j < self.n and self.p[j] == "^":
            j += 1
        if j < self.n and self.p[j] == "]":
            j += 1
        while j < self.n and self.p[j] != "]":
            j += 2 if self.p[j] == "\\" else 1
        text = self.p[self.i:j + 1]
        self.i = j + 1
        return ("set", _charset(text))

    def escape(self):
        pos = self.i
        c = self.peek(1)
        self.i += 2
        if c in "dDwWsS":
            return ("set", _charset("\\" + c))
        if c in "bB":
            self.unsupported("word boundary \\" + c, pos)
        if c == "A":
            if pos != 0:
                self.unsupported("\\A anchor (other than at the start)", pos)
            return ("cat", [])
        if c == "Z":
            if self.i != self.n:
                self.unsupported("\\Z anchor (other than at the end)", pos)
            return ("cat", [])
        if c in "xuU":
            k = {"x": 2, "u": 4, "U": 8}[c]
            cp = int(self.p[self.i:self.i + k], 16)
            self.i += k
            return ("set", _char_ranges(chr(cp)))
        if c == "N":
            end = self.p.index("}", self.i)
            ch = unicodedata.lookup(self.p[self.i + 1:end])
            self.i = end + 1
            return ("set", _char_ranges(ch))
        if c == "0":
            digits = c
            while len(digits) < 3 and self.peek() in "01234567" and self.peek():
                digits += self.peek()
                self.i += 1
            return ("set", _char_ranges(chr(int(digits, 8))))
        if c.isdigit():
            octal = "01234567"
            if c in octal and self.peek() and self.peek() in octal and self.peek(1) and self.peek(1) in octal:
                cp = int(self.p[pos + 1:pos + 4], 8)
                self.i += 2
                return ("set", _char_ranges(chr(cp)))
            self.unsupported("backreference \\" + c, pos)
        simple = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}
        return ("set", _char_ranges(simple.get(c, c)))
