"""An exact oracle for the context-free front ends of tinyllm/grammar (JSON Schema, GBNF), independent of cfg.py:
an Earley recognizer (with Aycock and Horspool's fix for nullable symbols) over BYTES, for the same rules AST.

    o = Earley(rules, start)          # rules {name: AST} of tinyllm/grammar/nodes.py (schema_grammar, parse_gbnf)
    o.viable(prefix)                  # some continuation of the bytes `prefix` is in the language
    o.complete(data)                  # the bytes `data` are in the language
    o.mask(prefix, tokens, eot)       # [bool] per token: viable(prefix + token); at eot: complete(prefix)
    o.shortest_completion(prefix)     # the shortest bytes that complete prefix (None: not viable), for walks

Each AST node becomes a nonterminal with BNF productions: a set of code-point ranges its UTF-8 byte-range sequences
(regex_dfa._cp_ranges_to_seqs, tested on its own, is the only piece borrowed), a cat one production, an alt one per
branch, a repetition its `lo` copies then an optional chain (bounded; none when hi < lo) or a right-recursive star,
a list the first/rest nonterminals of its definition (items in order, an optional one may be absent, a repeated one
may occur again, the present ones separated by the separator), a ref the rule's nonterminal. Productions that use an
unproductive symbol are pruned, so every item the recognizer holds can still be completed: a prefix is viable
exactly when its column is not empty. A whole vocabulary is checked in one walk of the tokens' trie, each trie node
one chart column built on its parent's.
"""
from tinyllm.grammar.regex_dfa import _cp_ranges_to_seqs

__all__ = ["Earley"]


def _term(lo, hi):
    """A terminal symbol (a byte range) as a negative int; nonterminals are ints >= 0."""
    return -1 - (lo << 8 | hi)


def _term_range(sym):
    k = -1 - sym
    return k >> 8, k & 0xFF


class _Column:
    """One Earley set: its items, the items waiting on each nonterminal (for completion), and the items waiting
    on a byte range (for the scan)."""
    __slots__ = ("items", "wait", "scan")

    def __init__(self):
        self.items, self.wait, self.scan = set(), {}, []


class Earley:
    def __init__(self, rules, start):
        self._rules = rules                             # (kept alive: node ids name nonterminals)
        self.lhs, self.rhs = [], []                     # production p: lhs[p] -> rhs[p] (a tuple of symbols)
        self._nt, self._n = {}, 0
        self._convert(rules, start)
        self._prune()
        self._nullable()
        self.short = self._shortest()
        self.by_lhs = {}
        for p, a in enumerate(self.lhs):
            self.by_lhs.setdefault(a, []).append(p)
        self._cache_data, self._cache_cols, self._trie = None, None, None

    # ---- the AST as BNF
    def _new(self):
        self._n += 1
        return self._n - 1

    def _add(self, a, rhs):
        self.lhs.append(a)
        self.rhs.append(tuple(rhs))

    def _convert(self, rules, start):
        rule_nt = {name: self._new() for name in rules}
        self.goal = self._new()                         # goal -> start: its completion from 0 accepts
        work = []

        def nt(node):                                   # the nonterminal of an AST node (made on first use)
            if node[0] == "ref":
                return rule_nt[node[1]]
            key = id(node)
            if key not in self._nt:
                self._nt[key] = self._new()
                work.append(node)
            return self._nt[key]

        def symbols(node):                              # a node as symbols: single byte strings and cats inline
            out, stack = [], [node]
            while stack:
                n = stack.pop()
                if n[0] == "cat":
                    stack.extend(reversed(n[1]))
                elif n[0] == "set" and len(_cp_ranges_to_seqs(n[1])) == 1:
                    out += [_term(lo, hi) for lo, hi in _cp_ranges_to_seqs(n[1])[0]]
                else:
                    out.append(nt(n))
            return out

        self._add(self.goal, [rule_nt[start]])
        for name, body in rules.items():
            self._add(rule_nt[name], symbols(body))
        while work:
            node = work.pop()
            a, kind = self._nt[id(node)], node[0]
            if kind == "set":
                for seq in _cp_ranges_to_seqs(node[1]):
                    self._add(a, [_term(lo, hi) for lo, hi in seq])
            elif kind == "cat":
                self._add(a, symbols(node))
            elif kind == "alt":                         # (no branch: no production, an empty language)
                for branch in node[1]:
                    self._add(a, symbols(branch))
            elif kind == "rep":
                _, body, lo, hi = node
                if hi is not None and hi < lo:          # a count in [lo, hi]: none
                    continue
                copy = symbols(body)
                if hi is None:                          # star -> "" | body star
                    tail = self._new()
                    self._add(tail, [])
                    self._add(tail, copy + [tail])
                else:                                   # opt_k -> "" | body opt_{k-1}, opt_0 -> ""
                    tail = self._new()
                    self._add(tail, [])
                    for _ in range(hi - lo):
                        nxt = self._new()
                        self._add(nxt, [])
                        self._add(nxt, copy + [tail])
                        tail = nxt
                self._add(a, copy * lo + [tail])
            elif kind == "list":
                # F_i: nothing written yet, items i.. to come; R_i: something written (a separator first);
                # M_i: item i just written. F_n = R_n = "".
                items, sep = node[1], symbols(node[2])
                f_next = r_next = self._new()
                self._add(f_next, [])
                for item, optional, repeated in reversed(items):
                    f, r, m = self._new(), self._new(), self._new()
                    body = symbols(item)
                    self._add(f, body + [m])
                    self._add(r, sep + body + [m])
                    self._add(m, [r_next])
                    if repeated:
                        self._add(m, sep + body + [m])
                    if optional:
                        self._add(f, [f_next])
                        self._add(r, [r_next])
                    f_next, r_next = f, r
                self._add(a, [f_next])
            else:
                raise ValueError(f"grammar_oracle: unknown AST node {kind!r}")

    def _prune(self):
        """Drop every production with an unproductive symbol (one that derives no byte string)."""
        productive, changed = set(), True
        while changed:
            changed = False
            for a, rhs in zip(self.lhs, self.rhs):
                if a not in productive and all(s < 0 or s in productive for s in rhs):
                    productive.add(a)
                    changed = True
        keep = [p for p, rhs in enumerate(self.rhs) if all(s < 0 or s in productive for s in rhs)
                and self.lhs[p] in productive]
        self.lhs = [self.lhs[p] for p in keep]
        self.rhs = [self.rhs[p] for p in keep]
        self.empty_language = self.goal not in productive

    def _shortest(self):
        """A shortest byte string of each productive nonterminal (terminals: their range's first byte)."""
        best, changed = {}, True
        while changed:
            changed = False
            for a, rhs in zip(self.lhs, self.rhs):
                if all(s < 0 or s in best for s in rhs):
                    cand = b"".join(best[s] if s >= 0 else bytes([_term_range(s)[0]]) for s in rhs)
                    if a not in best or len(cand) < len(best[a]):
                        best[a] = cand
                        changed = True
        return best

    def _rest(self, p, d):
        return b"".join(self.short[s] if s >= 0 else bytes([_term_range(s)[0]]) for s in self.rhs[p][d:])

    def shortest_completion(self, data):
        """The shortest bytes that complete `data` to a string of the language (None when data is not viable):
        up[(A, j)], the shortest way to finish the parents of an A that began at column j, column by column."""
        cols = self.chart(data)
        if cols is None:
            return None
        up = {(self.goal, 0): b""}
        for j, col in enumerate(cols):
            changed = True
            while changed:                              # (same-column parents: predicted items; to a fixpoint)
                changed = False
                for a, waiting in col.wait.items():
                    for q, e, o in waiting:
                        above = up.get((self.lhs[q], o))
                        if above is None:
                            continue
                        cand = self._rest(q, e + 1) + above
                        old = up.get((a, j))
                        if old is None or len(cand) < len(old):
                            up[(a, j)] = cand
                            changed = True
        best = None
        for p, d, o in cols[-1].items:
            above = up.get((self.lhs[p], o))
            if above is not None:
                cand = self._rest(p, d) + above
                if best is None or len(cand) < len(best):
                    best = cand
        return best

    def _nullable(self):
        self.nullable, changed = set(), True
        while changed:
            changed = False
            for a, rhs in zip(self.lhs, self.rhs):
                if a not in self.nullable and all(s >= 0 and s in self.nullable for s in rhs):
                    self.nullable.add(a)
                    changed = True

    # ---- the recognizer
    def _fill(self, col, k, cols, seeds):
        """Close column k (cols[k] is col; cols[:k] are done) from its seed items: predict, complete."""
        rhs, lhs, by_lhs, nullable = self.rhs, self.lhs, self.by_lhs, self.nullable
        items, wait, scan = col.items, col.wait, col.scan
        work = []
        for it in seeds:
            if it not in items:
                items.add(it)
                work.append(it)
        while work:
            p, d, o = it = work.pop()
            r = rhs[p]
            if d < len(r):
                s = r[d]
                if s < 0:
                    lo, hi = _term_range(s)
                    scan.append((lo, hi, p, d + 1, o))
                    continue
                w = wait.get(s)
                if w is None:
                    w = wait[s] = []
                    for q in by_lhs.get(s, ()):
                        new = (q, 0, k)
                        if new not in items:
                            items.add(new)
                            work.append(new)
                w.append(it)
                if s in nullable:                       # Aycock-Horspool: step over a nullable symbol now
                    new = (p, d + 1, o)
                    if new not in items:
                        items.add(new)
                        work.append(new)
            elif o != k:                                # (o == k: lhs is nullable, handled at prediction)
                for q, e, o2 in cols[o].wait.get(lhs[p], ()):
                    new = (q, e + 1, o2)
                    if new not in items:
                        items.add(new)
                        work.append(new)
        return col

    def _start(self):
        col = _Column()
        if not self.empty_language:
            self._fill(col, 0, [col], [(0, 0, 0)])
        return col

    def _step(self, cols, byte):
        """The column after `byte` (appended to cols), or None when no item scans it (cols left as they were)."""
        seeds = [(p, d, o) for lo, hi, p, d, o in cols[-1].scan if lo <= byte <= hi]
        if not seeds:
            return None
        col = _Column()
        cols.append(col)
        return self._fill(col, len(cols) - 1, cols, seeds)

    def chart(self, data):
        """The columns after the bytes `data` (None once dead); the last chart is kept for the next call."""
        if self._cache_data is not None:
            n = 0
            old = self._cache_data
            while n < len(old) and n < len(data) and old[n] == data[n]:
                n += 1
            cols = self._cache_cols[:n + 1]
        else:
            n, cols = 0, [self._start()]
        for k in range(n, len(data)):
            if len(cols) != k + 1 or self._step(cols, data[k]) is None:
                self._cache_data, self._cache_cols = data[:k], cols[:k + 1]
                return None
        self._cache_data, self._cache_cols = bytes(data), cols
        return cols

    def viable(self, data):
        if self.empty_language:
            return False
        return self.chart(data) is not None

    def complete(self, data):
        cols = self.chart(data)
        return cols is not None and (0, 1, 0) in cols[-1].items

    def mask(self, prefix, tokens, eot=None):
        """allowed[i] = viable(prefix + tokens[i]) for non-empty tokens (bytes); allowed[eot] = complete(prefix).
        One walk of the tokens' trie from prefix's column."""
        allowed = [False] * max(len(tokens), eot + 1 if eot is not None else 0)
        cols = self.chart(prefix)
        if cols is None:
            return allowed
        if eot is not None:
            allowed[eot] = (0, 1, 0) in cols[-1].items
        if self._trie is None or self._trie[0] is not tokens or self._trie[1] != eot:  # (once per token list)
            children, ends = [{}], [[]]
            for i, t in enumerate(tokens):
                if i == eot or not t:
                    continue
                node = 0
                for b in t:
                    nxt = children[node].get(b)
                    if nxt is None:
                        nxt = children[node][b] = len(children)
                        children.append({})
                        ends.append([])
                    node = nxt
                ends[node].append(i)
            self._trie = (tokens, eot, children, ends)
        _, _, children, ends = self._trie
        stack = [(0, cols)]                             # (trie node, the chart after its bytes)
        while stack:
            node, cs = stack.pop()
            for b, child in children[node].items():
                nxt = list(cs)                          # (columns are never changed once closed: share them)
                if self._step(nxt, b) is not None:
                    for i in ends[child]:
                        allowed[i] = True
                    if children[child]:
                        stack.append((child, nxt))
        return allowed
