"""llama.cpp's GBNF grammar format to a context-free grammar (cfg.py), with errors that give line and column.

    root ::= "yes" | "no" ws item*      # comments run to the end of the line
    item ::= [a-z0-9_-]+ ("," [^\\n]?){1,3} .

Rules `name ::= body`; a body is alternatives (`|`) of sequences of literals ("..." with \\n \\t \\r \\\\ \\"
\\xHH \\uHHHH \\UHHHHHHHH escapes), character classes ([...], [^...], ranges a-z), `.` (any character), rule names
and groups, each optionally followed by `*`, `+`, `?` or `{m}`, `{m,}`, `{,n}`, `{m,n}`. A rule ends at the end of
its line unless a group is open or the line ends with `|`. `root` is the start; a rule used but not defined, defined
twice, or defined but unreachable from root is an error, as a left-recursive rule is (cfg.py).
"""
from . import nodes as N

__all__ = ["parse_gbnf"]

_ALL = ((0, 0xD7FF), (0xE000, 0x10FFFF))
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-", "^": "^",
            "/": "/", "0": "\0"}
_HEX = {"x": 2, "u": 4, "U": 8}


def _name_char(c):
    return c.isascii() and (c.isalnum() or c in "-_")


def _merge(ranges):
    out = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


class _Parser:
    def __init__(self, text):
        self.t, self.i, self.n = text, 0, len(text)
        self.rules, self.where, self.uses = {}, {}, []

    def error(self, msg, pos=None):
        pos = self.i if pos is None else pos
        line = self.t.count("\n", 0, pos) + 1
        col = pos - (self.t.rfind("\n", 0, pos) + 1) + 1
        end = self.t.find("\n", pos)
        near = self.t[pos:end if end >= 0 else self.n][:24]
        raise ValueError(f"gbnf: line {line}, column {col}: {msg}" + (f" (at {near!r})" if near.strip() else ""))

    def peek(self):
        return self.t[self.i] if self.i < self.n else ""

    def space(self, newlines):
        while self.i < self.n:
            c = self.t[self.i]
            if c == "#":
                while self.i < self.n and self.t[self.i] != "\n":
                    self.i += 1
            elif c in " \t" or (newlines and c in "\r\n"):
                self.i += 1
            else:
                break

    def name(self):
        start = self.i
        while self.i < self.n and _name_char(self.t[self.i]):
            self.i += 1
        if self.i == start:
            self.error(f"expected a rule name, found {self.peek()!r}" if self.peek() else "expected a rule name")
        return self.t[start:self.i]

    def parse(self):
        self.space(True)
        while self.i < self.n:
            pos = self.i
            name = self.name()
            self.space(False)
            if not self.t.startswith("::=", self.i):
                self.error(f"expected '::=' after the rule name {name!r}")
            self.i += 3
            self.space(True)
            body = self.alternatives(nested=False)
            if name in self.rules:
                self.error(f"rule {name!r} is defined twice (first on line "
                           f"{self.t.count(chr(10), 0, self.where[name]) + 1})", pos)
            self.rules[name], self.where[name] = body, pos
            if self.i < self.n and self.t[self.i] not in "\r\n":
                self.error(f"unexpected {self.peek()!r}")
            self.space(True)
        if not self.rules:
            self.error("the grammar defines no rule (it needs `root ::= ...`)")
        for name, pos in self.uses:
            if name not in self.rules:
                self.error(f"rule {name!r} is used but not defined", pos)
        if "root" not in self.rules:
            self.error("the grammar has no `root` rule: root is where it starts", 0)
        reached, stack = {"root"}, ["root"]
        graph = {}
        for name, pos in self.uses:
            graph.setdefault(self._owner(pos), set()).add(name)
        while stack:
            for m in graph.get(stack.pop(), ()):
                if m not in reached:
                    reached.add(m)
                    stack.append(m)
        for name in self.rules:
            if name not in reached:
                self.error(f"rule {name!r} is defined but never used from root", self.where[name])
        return self.rules, "root"

    def _owner(self, pos):
        return max((p, r) for r, p in self.where.items() if p <= pos)[1]

    def alternatives(self, nested):
        branches = [self.sequence(nested)]
        while self.peek() == "|":
            self.i += 1
            self.space(True)
            branches.append(self.sequence(nested))
        return N.alt(*branches)

    def sequence(self, nested):
        items = []
        while self.i < self.n and self.peek() not in "|)\r\n":
            items.append(self.postfix(self.atom()))
            self.space(nested)
        return items[0] if len(items) == 1 else ("cat", items)

    def atom(self):
        c, pos = self.peek(), self.i
        if c == '"':
            self.i += 1
            out = []
            while self.peek() != '"':
                if not self.peek() or self.peek() in "\r\n":
                    self.error("unterminated string literal", pos)
                out.append(self.char())
            self.i += 1
            return N.cat(*(N.chars(((cp, cp),)) for cp in out))
        if c == "[":
            return self.klass()
        if c == ".":
            self.i += 1
            return N.chars(_ALL)
        if c == "(":
            self.i += 1
            self.space(True)
            body = self.alternatives(nested=True)
            if self.peek() != ")":
                self.error("expected ')' to close the group opened here", pos)
            self.i += 1
            return body
        if _name_char(c):
            name = self.name()
            self.uses.append((name, pos))
            return N.ref(name)
        self.error(f"unexpected {c!r}" if c else "unexpected end of the grammar")

    def char(self):
        """One code point of a literal or class, escapes decoded."""
        pos = self.i
        c = self.t[self.i]
        self.i += 1
        if c != "\\":
            return ord(c)
        e = self.peek()
        self.i += 1
        if e in _HEX:
            digits = self.t[self.i:self.i + _HEX[e]]
            if len(digits) != _HEX[e] or any(d not in "0123456789abcdefABCDEF" for d in digits):
                self.error(f"\\{e} needs {_HEX[e]} hex digits", pos)
            self.i += _HEX[e]
            cp = int(digits, 16)
            if cp > 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
                self.error(f"\\{e}{digits} is not a Unicode scalar value", pos)
            return cp
        if e in _ESCAPES:
            return ord(_ESCAPES[e])
        self.error(f"unknown escape \\{e}" if e else "a '\\' ends the grammar", pos)

    def klass(self):
        pos = self.i
        self.i += 1
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        ranges = []
        while self.peek() != "]":
            if not self.peek():
                self.error("unterminated character class", pos)
            lo = self.char()
            hi = lo
            if self.peek() == "-" and self.t[self.i + 1:self.i + 2] not in ("]", ""):
                self.i += 1
                hi = self.char()
                if hi < lo:
                    self.error(f"range {chr(lo)!r}-{chr(hi)!r} is reversed", pos)
            ranges.append((lo, hi))
        self.i += 1
        ranges = N.subtract(_merge(ranges), ((0xD800, 0xDFFF),))
        return N.chars(N.subtract(_ALL, ranges) if negate else ranges)

    def postfix(self, node):
        while True:
            c, pos = self.peek(), self.i
            if c in ("*", "+", "?"):
                self.i += 1
                node = {"*": N.rep(node), "+": N.rep(node, 1), "?": N.opt(node)}[c]
            elif c == "{":
                end = self.t.find("}", self.i)
                if end < 0:
                    self.error("unterminated '{' repetition", pos)
                spec = self.t[self.i + 1:end].replace(" ", "")
                lo, comma, hi = spec.partition(",")
                if not (lo or hi) or not (lo.isdigit() or not lo) or not (hi.isdigit() or not hi):
                    self.error(f"bad repetition {{{spec}}}: use {{m}}, {{m,}}, {{,n}} or {{m,n}}", pos)
                lo = int(lo) if lo else 0
                hi = (int(hi) if hi else None) if comma else lo
                if hi is not None and hi < lo:
                    self.error(f"repetition {{{spec}}} has its maximum below its minimum", pos)
                self.i = end + 1
                node = N.rep(node, lo, hi)
            else:
                return node


def parse_gbnf(text):
    """(rules, "root") of a GBNF grammar's text."""
    if not isinstance(text, str):
        raise TypeError(f"gbnf: the grammar must be text (str), got {type(text).__name__}")
    return _Parser(text).parse()
