"""Python-`re` regexes compiled to a byte-level DFA (built lazily), for constrained decoding (issue 45).

    dfa = compile_regex(pattern)      # fullmatch semantics on the UTF-8 bytes of the text
    s = dfa.start                     # int (DEAD = -1 when the pattern matches nothing)
    s = dfa.step(s, byte)             # next state, DEAD when no continuation can match
    dfa.accepting(s)                  # the bytes so far fullmatch the pattern
    dfa.live(s)                       # some continuation (possibly empty) reaches acceptance; False for DEAD
    dfa.transitions(s)                # the next state for each of the 256 bytes (a list)
    dfa.walk(data), dfa.fullmatch(data), dfa.num_states, dfa.pattern

The pattern is parsed here (positions are kept for the errors), character sets (`[...]`, `.`, `\\d`, `\\w`, `\\s` and
their negations) take re's own meaning: the set's text is run by `re` over every code point once (cached), and the
code-point ranges become UTF-8 byte-range sequences (the utf8-ranges algorithm of Rust's regex-syntax). The parse
tree becomes a Thompson NFA over byte ranges; NFA states that cannot reach acceptance are pruned, so every DFA
state (a set of NFA states, built on demand by subset construction and memoized) is live, and the empty set is DEAD.
"""
import functools
import re
import unicodedata

__all__ = ["compile_regex", "RegexDFA", "DEAD"]

DEAD = -1
_UNKNOWN = -2
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


# ---------------------------------------------------------------- NFA over byte ranges, then the lazy DFA

class _NFA:
    def __init__(self, rule_ids=None):
        self.rule_ids = rule_ids                        # (grammar.cfg: a called rule's name -> its number)
        self.trans = []                                 # state -> [(lo, hi, target)]
        self.eps = []                                   # state -> [target]
        self.calls = []                                 # state -> [(rule, target)]: a grammar rule's sub-rule
        self.maybe_dead = False                         # some part matches nothing: not every state is co-reachable
        self.deferred = {}                              # state -> (body, copies, end): optional copies not built yet
        self._templates = {}                            # id(body) -> (body, start, end state, past its states)

    def expand(self, u):
        """Build the next optional copy of a counted repetition whose copies are made when first reached
        (maxLength: 120 would otherwise be 120 copies of a JSON character's states at compile time). The body
        is built once, unreachable, as a template; each copy is the template's states shifted."""
        body, copies, e = self.deferred.pop(u)
        template = self._templates.get(id(body))
        if template is None:
            a, b = self.new(), self.new()
            self.build(body, a, b)
            template = self._templates[id(body)] = (body, a, b, len(self.trans))
        _, a, b, end = template
        off = len(self.trans) - a
        trans, eps, calls = self.trans, self.eps, self.calls
        for x in range(a, end):
            trans.append([(lo, hi, v + off) for lo, hi, v in trans[x]])
            eps.append([v + off for v in eps[x]])
            calls.append([])                            # (a plain body calls nothing)
            inner = self.deferred.get(x)
            if inner is not None:                       # a repetition inside the body: deferred in the copy too
                self.deferred[x + off] = (inner[0], inner[1], inner[2] + off)
        eps[u].append(a + off)
        nxt = b + off
        eps[nxt].append(e)
        if copies > 1:
            self.deferred[nxt] = (body, copies - 1, e)

    def new(self):
        self.trans.append([])
        self.eps.append([])
        self.calls.append([])
        return len(self.trans) - 1

    def build(self, node, s, e):
        kind = node[0]
        if kind == "set":
            if not node[1]:
                self.maybe_dead = True
            trie = {}
            for seq in _cp_ranges_to_seqs(node[1]):
                cur = s
                for k, (lo, hi) in enumerate(seq):
                    if k == len(seq) - 1:
                        self.trans[cur].append((lo, hi, e))
                    else:
                        nxt = trie.get((cur, lo, hi))
                        if nxt is None:
                            nxt = trie[(cur, lo, hi)] = self.new()
                            self.trans[cur].append((lo, hi, nxt))
                        cur = nxt
        elif kind == "cat":
            items = node[1]
            if not items:
                self.eps[s].append(e)
                return
            cur = s
            for k, item in enumerate(items):
                nxt = e if k == len(items) - 1 else self.new()
                self.build(item, cur, nxt)
                cur = nxt
        elif kind == "alt":
            if not node[1]:
                self.maybe_dead = True
            for branch in node[1]:
                self.build(branch, s, e)
        elif kind == "ref":                             # (grammar.cfg: a call of rule node[1])
            self.calls[s].append((self.rule_ids[node[1]], e))
        elif kind == "list":                            # items in order, each optional or not, sep between
            self.build_list(node[1], node[2], s, e)
        else:                                           # rep: every copy of the body gets fresh states
            _, body, lo, hi = node
            if hi is not None and hi < lo:              # (as {3,1} in GBNF or minLength > maxLength: nothing)
                self.maybe_dead = True
                return
            cur = s
            for _ in range(lo):
                nxt = self.new()
                self.build(body, cur, nxt)
                cur = nxt
            if hi is not None and hi - lo >= 4 and _plain(body):
                self.eps[cur].append(e)                 # (every optional copy may stop: `final` stays reachable)
                self.deferred[cur] = (body, hi - lo, e)
                return
            if hi is None:
                loop, back = self.new(), self.new()
                self.eps[cur].append(loop)
                self.eps[loop].append(e)
                self.build(body, loop, back)
                self.eps[back].append(loop)
            else:
                for _ in range(hi - lo):
                    self.eps[cur].append(e)
                    nxt = self.new()
                    self.build(body, cur, nxt)
                    cur = nxt
                self.eps[cur].append(e)


    def build_list(self, items, sep, s, e):
        """The items (node, optional, repeated) in order, the present ones separated by `sep`, in linear size:
        first[i] enters item i with no separator before it, rest[i] with one (JSON objects' optional members)."""
        first, rest = e, e
        for node, optional, repeated in reversed(items):
            f, r = self.new(), self.new()
            after = self.new()                          # item i done: the rest follow with separators
            self.build(node, f, after)
            mid = self.new()
            self.build(sep, r, mid)
            self.build(node, mid, after)
            if repeated:
                self.eps[after].append(r)
            self.eps[after].append(rest)
            if optional:
                self.eps[f].append(first)
                self.eps[r].append(rest)
            first, rest = f, r
        self.eps[s].append(first)


def _plain(node):
    """Whether `node` has no calls, lists or empty parts (its copies can be built late: they change neither
    which rules derive strings nor which NFA states can reach the end)."""
    stack = [node]
    while stack:
        n = stack.pop()
        kind = n[0]
        if kind in ("ref", "list") or (kind in ("set", "alt") and not n[1]):
            return False
        if kind in ("cat", "alt"):
            stack.extend(n[1])
        elif kind == "rep":
            if n[3] is not None and n[3] < n[2]:
                return False
            stack.append(n[1])
    return True


class Automaton:
    """What every grammar automaton shares: states are ints, DEAD (-1) the one that nothing continues, and each
    other state is live (some continuation reaches acceptance). Subclasses give start, step, accepting."""

    def live(self, state):
        return state >= 0

    def walk(self, data, state=None):
        """The state after the bytes `data` from `state` (default: the start)."""
        s = self.start if state is None else state
        for b in data:
            s = self.step(s, b)
            if s < 0:
                return DEAD
        return s

    def fullmatch(self, data):
        return self.accepting(self.walk(data))


class RegexDFA(Automaton):
    """A byte-level DFA for `pattern` (fullmatch on UTF-8), subset-constructed on demand and memoized; every
    interned state is a non-empty set of NFA states that can reach the end, so live."""

    def __init__(self, pattern, nfa, start, final, productive=()):
        self.pattern = pattern
        self._nfa, self._final = nfa, final
        # a grammar rule's calls of sub-rules that derive some string (`productive`) are edges; others are cut
        self._calls = {u: [(k, v) for k, v in c if k in productive] for u, c in enumerate(nfa.calls) if c}
        cut = any(len(self._calls[u]) != len(nfa.calls[u]) for u in self._calls)
        if nfa.maybe_dead or cut:                       # co-reachability needs the whole NFA
            while nfa.deferred:
                nfa.expand(next(iter(nfa.deferred)))
        n = len(nfa.trans)
        if not (nfa.maybe_dead or cut):                 # every state of a Thompson NFA lies on a path to `final`
            self._good = None                           # (so are the copies built later)
            n = 0
        rev = [[] for _ in range(n)]                    # co-reachability: which NFA states can reach `final`
        for u in range(n):
            for v in nfa.eps[u]:
                rev[v].append(u)
            for _, _, v in nfa.trans[u]:
                rev[v].append(u)
            for _, v in self._calls.get(u, ()):
                rev[v].append(u)
        if n:
            good, stack = {final}, [final]
            while stack:
                for u in rev[stack.pop()]:
                    if u not in good:
                        good.add(u)
                        stack.append(u)
            self._good = good
        self._eclosure = {}                             # NFA state -> its kept epsilon closure
        self._ids = {}                                  # frozenset of NFA states -> DFA state
        self._sets = []                                 # DFA state -> sorted tuple of NFA states
        self._table = []                                # DFA state -> [256 next states, _UNKNOWN until computed]
        self._accepting = []
        self._call_edges = []                           # DFA state -> ((rule, next DFA state), ...) or None
        self._has_bytes = []
        self.start = self._intern(self._closure([start]))

    def _closure(self, states):
        """Epsilon closure, kept to the states that matter (byte transitions, calls or final) and can reach
        `final`: the union of each state's own closure, computed once per NFA state."""
        memo = self._eclosure
        parts = []
        for u in states:
            c = memo.get(u)
            if c is None:
                nfa = self._nfa
                seen, stack = {u}, [u]
                while stack:
                    x = stack.pop()
                    if x in nfa.deferred:
                        nfa.expand(x)
                    for v in nfa.eps[x]:
                        if v not in seen:
                            seen.add(v)
                            stack.append(v)
                trans, calls, good, final = nfa.trans, self._calls, self._good, self._final
                c = memo[u] = frozenset(x for x in seen if (good is None or x in good) and (
                    trans[x] or x in calls or x == final))
            parts.append(c)
        return parts[0] if len(parts) == 1 else frozenset().union(*parts)

    def _intern(self, key):
        if not key:
            return DEAD
        sid = self._ids.get(key)
        if sid is None:
            sid = self._ids[key] = len(self._sets)
            self._sets.append(tuple(sorted(key)))
            self._table.append([_UNKNOWN] * 256)
            self._accepting.append(self._final in key)
            self._call_edges.append(None)
            self._has_bytes.append(any(self._nfa.trans[u] for u in key))
        return sid

    def _compute(self, state, byte):
        trans = self._nfa.trans
        targets = [v for u in self._sets[state] for lo, hi, v in trans[u] if lo <= byte <= hi]
        nxt = self._intern(self._closure(targets))
        self._table[state][byte] = nxt
        return nxt

    def step(self, state, byte):
        if state < 0:
            return DEAD
        nxt = self._table[state][byte]
        return self._compute(state, byte) if nxt == _UNKNOWN else nxt

    def transitions(self, state):
        """The next state for every byte 0..255 from `state` (a list, computed in one pass; all DEAD from DEAD):
        the bytes are cut where some NFA transition's range starts or ends, and each piece's target set is
        closed and interned once."""
        if state < 0:
            return [DEAD] * 256
        row = self._table[state]
        if _UNKNOWN in row:
            edges = [e for u in self._sets[state] for e in self._nfa.trans[u]]
            cuts = sorted({0, 256} | {lo for lo, _, _ in edges} | {hi + 1 for _, hi, _ in edges})
            for a, b in zip(cuts, cuts[1:]):
                nxt = self._intern(self._closure([v for lo, hi, v in edges if lo <= a <= hi]))
                row[a:b] = [nxt] * (b - a)
        return list(row)

    def accepting(self, state):
        return state >= 0 and self._accepting[state]

    def has_bytes(self, state):
        """Whether some byte continues `state` directly (not through a sub-rule)."""
        return state >= 0 and self._has_bytes[state]

    def calls(self, state):
        """((rule, state after the rule), ...): the sub-rules a grammar rule may call from `state`."""
        edges = self._call_edges[state]
        if edges is None:
            targets = {}
            for u in self._sets[state]:
                for k, v in self._calls.get(u, ()):
                    targets.setdefault(k, []).append(v)
            edges = tuple((k, self._intern(self._closure(vs))) for k, vs in sorted(targets.items()))
            edges = self._call_edges[state] = tuple((k, t) for k, t in edges if t != DEAD)
        return edges

    @property
    def num_states(self):
        return len(self._sets)


def compile_regex(pattern):
    """Compile the Python `re` pattern (str) to a byte-level `RegexDFA` with re.fullmatch semantics on UTF-8."""
    if not isinstance(pattern, str):
        raise TypeError("compile_regex: pattern must be a str, got %s" % type(pattern).__name__)
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError("compile_regex: %s" % exc) from None
    ast = _Parser(pattern).parse()
    nfa = _NFA()
    start, final = nfa.new(), nfa.new()
    nfa.build(ast, start, final)
    return RegexDFA(pattern, nfa, start, final)
