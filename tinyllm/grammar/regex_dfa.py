"""Python-`re` regexes compiled to a byte-level DFA (built lazily), for constrained decoding (issue 45).

    dfa = compile_regex(pattern)      # fullmatch semantics on the UTF-8 bytes of the text
    s = dfa.start                     # int (DEAD = -1 when the pattern matches nothing)
    s = dfa.step(s, byte)             # next state, DEAD when no continuation can match
    dfa.accepting(s)                  # the bytes so far fullmatch the pattern
    dfa.live(s)                       # some continuation (possibly empty) reaches acceptance; False for DEAD
    dfa.transitions(s)                # the next state for each of the 256 bytes (a list)
    dfa.walk(data), dfa.fullmatch(data), dfa.num_states, dfa.pattern

The pattern is parsed by regex_parse.py into the AST of nodes.py, which becomes a Thompson NFA over byte ranges; NFA
states that cannot reach acceptance are pruned, so every DFA state (a set of NFA states, built on demand by subset
construction and memoized) is live, and the empty set is DEAD. Two automata build the same DFA: `RegexDFA` in
Python (the reference, and the fallback without the C kernels) and `NativeDFA` in C (runtime_c/grammar.c), whose
rows the token trie's walk fills as it goes. `automaton()` picks the C one where the kernels are built.
"""
import functools
import itertools
import re

import numpy as np

from .regex_parse import _cp_ranges_to_seqs, _Parser

__all__ = ["compile_regex", "automaton", "RegexDFA", "NativeDFA", "DEAD"]

DEAD = -1
_UNKNOWN = -2


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
        a, b, end = self._template(body)
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

    def _template(self, body):
        """(start, end, past the last state) of `body`'s template: built once, reached by nothing."""
        template = self._templates.get(id(body))
        if template is None:
            a, b = self.new(), self.new()
            self.build(body, a, b)
            template = self._templates[id(body)] = (body, a, b, len(self.trans))   # (body kept: ids stay unique)
        return template[1:]

    def arrays(self, calls):
        """The NFA with every deferred copy made, as CSR arrays by source state (runtime_c/grammar.h's gdfa_new):
        (n, t_off, t_lo, t_hi, t_to, e_off, e_to, c_off, c_to), `calls` {state: [(rule, target)]} the calls
        kept. A copy is its template's edges shifted, so the copies of a repetition are made in a few NumPy ops."""
        todo = list(self.deferred.values())
        while todo:                                     # every template, those of repetitions inside them too
            a, b, end = self._template(todo.pop()[0])
            todo += [d for x, d in self.deferred.items() if a <= x < end and id(d[0]) not in self._templates]
        n = len(self.trans)
        flat = itertools.chain.from_iterable
        t = np.fromiter(flat(flat(self.trans)), np.int32).reshape(-1, 3)
        t = np.column_stack([np.repeat(np.arange(n, dtype=np.int32), [len(x) for x in self.trans]), t])
        e = np.column_stack([np.repeat(np.arange(n, dtype=np.int32), [len(x) for x in self.eps]),
                             np.fromiter(flat(self.eps), np.int32)])
        c = np.array([(u, v) for u, cs in calls.items() for _, v in cs], np.int32).reshape(-1, 2)
        inside, templates = np.zeros(n, bool), {}
        for body, a, b, end in self._templates.values():
            inside[a:end] = True
            templates[id(body)] = (a, b, end, t[(t[:, 0] >= a) & (t[:, 0] < end)],
                                   e[(e[:, 0] >= a) & (e[:, 0] < end)],
                                   [(x, d) for x, d in self.deferred.items() if a <= x < end])
        ts, es = [t], [e]
        work = [(u, d) for u, d in self.deferred.items() if not inside[u]]
        while work:
            u, (body, copies, after) = work.pop()
            a, b, end, tt, te, inner = templates[id(body)]
            offs = n - a + (end - a) * np.arange(copies, dtype=np.int32)   # copy j: the template shifted by offs[j]
            tc = np.repeat(tt[None], copies, 0)
            tc[:, :, 0] += offs[:, None]
            tc[:, :, 3] += offs[:, None]
            ts.append(tc.reshape(-1, 4))
            es += [(np.repeat(te[None], copies, 0) + offs[:, None, None]).reshape(-1, 2),
                   np.array([(u, a + offs[0])], np.int32),                 # into the first copy,
                   np.stack([b + offs, np.full(copies, after, np.int32)], 1),   # out of each,
                   np.stack([b + offs[:-1], a + offs[1:]], 1)]              # and on to the next
            work += [(x + o, (ib, ic, ie + o)) for x, (ib, ic, ie) in inner for o in offs.tolist()]
            n += copies * (end - a)
        out = [n]
        for edges in (np.concatenate(ts), np.concatenate(es), c):
            off = np.zeros(n + 1, np.int32)
            np.cumsum(np.bincount(edges[:, 0], minlength=n), out=off[1:])
            edges = edges[np.argsort(edges[:, 0], kind="stable")]
            out += [off] + ([edges[:, 1].astype(np.uint8), edges[:, 2].astype(np.uint8)] if edges.shape[1] == 4
                            else []) + [np.ascontiguousarray(edges[:, -1])]
        return out

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
    other state is live (some continuation reaches acceptance). Subclasses give start, step, accepting and
    transitions (a state's 256 next states, a list)."""

    def live(self, state):
        return state >= 0

    def row(self, state):
        """transitions(state) as an int32 array (the token trie's table reads these)."""
        return np.asarray(self.transitions(state), np.int32)

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


def _kept_calls(nfa, productive):
    """{state: [(rule, target)]}: a grammar rule's calls of sub-rules that derive some string (`productive`);
    the others are cut."""
    return {u: [(k, v) for k, v in c if k in productive] for u, c in enumerate(nfa.calls) if c}


class RegexDFA(Automaton):
    """A byte-level DFA for `pattern` (fullmatch on UTF-8), subset-constructed on demand and memoized; every
    interned state is a non-empty set of NFA states that can reach the end, so live."""

    def __init__(self, pattern, nfa, start, final, productive=()):
        self.pattern = pattern
        self._nfa, self._final = nfa, final
        self._calls = _kept_calls(nfa, productive)
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


@functools.lru_cache(maxsize=1)
def kernels():
    """(ffi, lib) of the C kernels when they are built, else None."""
    try:
        from .. import _kernels as k
    except ImportError:
        return None
    return (k.ffi, k.lib) if hasattr(k.lib, "gdfa_new") else None


class NativeDFA(Automaton):
    """`RegexDFA`'s automaton subset-constructed in C (runtime_c/grammar.c): the same DFA, its states numbered as
    they are made; the token trie's walk fills rows as it reaches them, with no Python in between."""

    def __init__(self, pattern, nfa, start, final, productive=()):
        self.pattern = pattern
        self._ffi, self._lib = ffi, lib = kernels()
        self._calls = _kept_calls(nfa, productive)
        n, *arrays = nfa.arrays(self._calls)
        types = ["int32_t[]", "uint8_t[]", "uint8_t[]", "int32_t[]", "int32_t[]", "int32_t[]", "int32_t[]",
                 "int32_t[]"]
        g = lib.gdfa_new(n, *[ffi.from_buffer(t, a) for t, a in zip(types, arrays)], final)
        if g == ffi.NULL:
            raise MemoryError(f"grammar: no memory for the automaton of {pattern!r} ({n:,} NFA states)")
        self._g = ffi.gc(g, lib.gdfa_free)
        self._call_edges = {}
        self.start = self._closure([start])

    def _closure(self, states):
        a = np.array(states, np.int32)
        s = self._lib.gdfa_closure(self._g, self._ffi.from_buffer("int32_t[]", a), len(a))
        if s == -2:
            raise MemoryError(f"grammar: no memory for more states of {self.pattern!r}")
        return s

    def _row(self, state):
        row = self._lib.gdfa_row(self._g, state)
        if row == self._ffi.NULL:
            raise MemoryError(f"grammar: no memory for more states of {self.pattern!r}")
        return row

    def step(self, state, byte):
        return DEAD if state < 0 else self._row(state)[byte] - 1

    def row(self, state):
        if state < 0:
            return np.full(256, DEAD, np.int32)
        return np.frombuffer(self._ffi.buffer(self._row(state), 1024), np.int32) - 1

    def transitions(self, state):
        return self.row(state).tolist()

    def accepting(self, state):
        return bool(self._lib.gdfa_flags(self._g, state) & 1)

    def has_bytes(self, state):
        return bool(self._lib.gdfa_flags(self._g, state) & 2)

    def calls(self, state):
        edges = self._call_edges.get(state)
        if edges is None:
            members = np.empty(self._lib.gdfa_set(self._g, state, self._ffi.NULL), np.int32)
            self._lib.gdfa_set(self._g, state, self._ffi.from_buffer("int32_t[]", members))
            targets = {}
            for u in members.tolist():
                for k, v in self._calls.get(u, ()):
                    targets.setdefault(k, []).append(v)
            edges = tuple((k, self._closure(vs)) for k, vs in sorted(targets.items()))
            edges = self._call_edges[state] = tuple((k, t) for k, t in edges if t != DEAD)
        return edges

    @property
    def num_states(self):
        return self._lib.gdfa_num_states(self._g)


def automaton(pattern, nfa, start, final, productive=()):
    """The DFA of `nfa` from `start` to `final`: in C where the kernels are built, else in Python."""
    return (NativeDFA if kernels() else RegexDFA)(pattern, nfa, start, final, productive)


def compile_regex(pattern):
    """Compile the Python `re` pattern (str) to a byte-level DFA with re.fullmatch semantics on UTF-8."""
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
    return automaton(pattern, nfa, start, final)
