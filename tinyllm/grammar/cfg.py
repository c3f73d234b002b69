"""Context-free grammars over bytes (JSON Schema's and GBNF's front ends compile to one), run as a lazily
determinized pushdown automaton with the interface of `RegexDFA` (start, step, accepting, live), so the matcher's
token-trie walk and mask cache serve every front end alike.

    g = CFG({"root": ast, "value": ast, ...}, "root", "json_schema")

A rule's body is the regex AST of regex_dfa.py plus ("ref", name), a call of another rule. Rules that do not
take part in a recursion are inlined into their callers, so a grammar without recursion is one DFA; each remaining
rule becomes a DFA whose edges are bytes and calls. A parser state is a set of stacks of (rule, DFA state) frames,
each frame below the top holding its rule's state after the call returns; it is closed under calls (push the
callee) and returns (pop an accepting top), and interned, so each one is a state of a DFA built on demand.
A call whose caller has nothing left to do after it replaces the caller's frame (a tail call: right recursion,
such as a list's next item, keeps the stack flat). Left recursion would push forever without reading a byte and
is refused, as llama.cpp's GBNF does; so are rules that derive no string at all (an empty language).
"""
from .regex_dfa import DEAD, RegexDFA, _NFA

__all__ = ["CFG"]


def _refs(node, out):
    """The rule names `node` calls, in order of appearance (an iterative walk)."""
    stack = [node]
    while stack:
        n = stack.pop()
        kind = n[0]
        if kind == "ref":
            out.append(n[1])
        elif kind in ("cat", "alt"):
            stack.extend(reversed(n[1]))
        elif kind == "rep":
            stack.append(n[1])
        elif kind == "list":
            stack.append(n[2])
            stack.extend(item[0] for item in reversed(n[1]))
    return out


def _recursive(graph):
    """The rules on a cycle of calls (Tarjan's strongly connected components, iteratively); graph: {rule: calls}."""
    index, low, on, stack, out, counter = {}, {}, set(), [], set(), [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(graph[w])))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in graph[v]:
                    out.update(comp)
    return out


def _substitute(node, rules, recursive, memo):
    """`node` with every call of a non-recursive rule replaced by that rule's (substituted) body; subtrees without
    such calls are returned as they are (shared, not copied)."""
    kind = node[0]
    if kind == "ref":
        name = node[1]
        if name in recursive:
            return node
        if name not in memo:
            memo[name] = None                           # (not recursive: no cycle can come back here)
            memo[name] = _substitute(rules[name], rules, recursive, memo)
        return memo[name]
    if kind in ("cat", "alt"):
        items = [_substitute(n, rules, recursive, memo) for n in node[1]]
        return node if all(x is y for x, y in zip(items, node[1])) else (kind, items)
    if kind == "rep":
        body = _substitute(node[1], rules, recursive, memo)
        return node if body is node[1] else ("rep", body, node[2], node[3])
    if kind == "list":
        items = [(_substitute(n, rules, recursive, memo), o, r) for n, o, r in node[1]]
        sep = _substitute(node[2], rules, recursive, memo)
        same = sep is node[2] and all(x[0] is y[0] for x, y in zip(items, node[1]))
        return node if same else ("list", items, sep)
    return node


def _reaches_final(nfa, start, final, through):
    """Whether `final` is reachable from `start`; `through(kind, edge)` says which edges count."""
    seen, stack = {start}, [start]
    while stack:
        u = stack.pop()
        if u == final:
            return True
        nxt = list(nfa.eps[u])
        if through("bytes", None):
            nxt += [v for _, _, v in nfa.trans[u]]
        nxt += [v for k, v in nfa.calls[u] if through("call", k)]
        for v in nxt:
            if v not in seen:
                seen.add(v)
                stack.append(v)
    return False


class CFG:
    """A context-free grammar over bytes as a lazily built DFA over parser states (see the module's docstring)."""

    def __init__(self, rules, start, what):
        self.what = what
        graph = {r: _refs(body, []) for r, body in rules.items()}
        for r, calls in graph.items():
            for name in calls:
                if name not in rules:
                    raise ValueError(f"{what}: rule {r!r} refers to {name!r}, which is not defined")
        recursive = _recursive(graph)
        reached, stack = {start}, [start]               # (inlining keeps what the start reaches)
        while stack:
            for name in graph[stack.pop()]:
                if name not in reached:
                    reached.add(name)
                    stack.append(name)
        kept = [start] + sorted(r for r in recursive & reached if r != start)
        self.names = kept
        ids, memo, nfas = {r: i for i, r in enumerate(kept)}, {}, []
        for r in kept:
            nfa = _NFA(ids)
            s, e = nfa.new(), nfa.new()
            nfa.build(_substitute(rules[r], rules, recursive, memo), s, e)
            nfas.append((nfa, s, e))
        n = len(kept)
        productive, changed = set(), True
        while changed:
            changed = False
            for k in range(n):
                if k not in productive and _reaches_final(*nfas[k], lambda kind, c: kind == "bytes" or
                                                          c in productive):
                    productive.add(k)
                    changed = True
        if 0 not in productive:
            raise ValueError(f"{what}: the grammar derives no string at all (its language is empty)")
        nullable, changed = set(), True
        while changed:
            changed = False
            for k in range(n):
                if k not in nullable and _reaches_final(*nfas[k], lambda kind, c: kind == "call" and c in nullable):
                    nullable.add(k)
                    changed = True
        self._refuse_left_recursion(nfas, nullable, productive)
        self.dfas = [RegexDFA(kept[k], *nfas[k], productive=productive) for k in range(n)]
        self._ids, self._configs, self._table, self._accepting = {}, [], [], []
        self.start = self._intern(self._close([((0, self.dfas[0].start),)]))

    def _refuse_left_recursion(self, nfas, nullable, productive):
        """A rule that can call itself before reading a byte (through nullable calls) would push forever."""
        first = {}
        for k, (nfa, s, _) in enumerate(nfas):
            seen, stack, calls = {s}, [s], set()
            while stack:
                u = stack.pop()
                nxt = list(nfa.eps[u])
                for c, v in nfa.calls[u]:
                    if c in productive:
                        calls.add(c)
                        if c in nullable:
                            nxt.append(v)
                for v in nxt:
                    if v not in seen:
                        seen.add(v)
                        stack.append(v)
            first[k] = calls
        for k in first:                                 # a path k -> ... -> k in the "calls first" graph
            parent, stack = {c: k for c in first[k]}, list(first[k])
            while stack:
                c = stack.pop()
                if c == k:
                    path, x = [k], parent[k]
                    while x != k:
                        path.append(x)
                        x = parent[x]
                    names = " -> ".join(self.names[p] for p in [k] + path[:0:-1] + [k])
                    raise ValueError(f"{self.what}: rule {self.names[k]!r} is left-recursive ({names}): it can "
                                     "call itself before reading anything; rewrite it right-recursively, e.g. "
                                     "`list ::= item (\",\" item)*` instead of `list ::= list \",\" item | item`")
                for d in first[c]:
                    if d not in parent:
                        parent[d] = c
                        stack.append(d)

    # ---- parser states: frozensets of stacks, closed under calls and returns
    def _close(self, stacks):
        dfas = self.dfas
        seen, work = set(stacks), list(stacks)
        while work:
            st = work.pop()
            r, s = st[-1]
            dfa = dfas[r]
            for k, after in dfa.calls(s):
                if dfa.accepting(after) and not dfa.has_bytes(after) and not dfa.calls(after):
                    base = st[:-1]                      # a tail call: the caller would only return
                else:
                    base = st[:-1] + ((r, after),)
                new = base + ((k, dfas[k].start),)
                if new not in seen:
                    seen.add(new)
                    work.append(new)
            if len(st) > 1 and dfa.accepting(s) and st[:-1] not in seen:
                seen.add(st[:-1])
                work.append(st[:-1])
        return frozenset(st for st in seen
                         if dfas[st[-1][0]].has_bytes(st[-1][1]) or (len(st) == 1 and dfas[st[0][0]].accepting(
                             st[0][1])))

    def _intern(self, config):
        if not config:
            return DEAD
        cid = self._ids.get(config)
        if cid is None:
            cid = self._ids[config] = len(self._configs)
            self._configs.append(config)
            self._table.append({})
            dfas = self.dfas
            self._accepting.append(any(len(st) == 1 and dfas[st[0][0]].accepting(st[0][1]) for st in config))
        return cid

    def step(self, state, byte):
        if state < 0:
            return DEAD
        row = self._table[state]
        nxt = row.get(byte)
        if nxt is None:
            dfas, moved = self.dfas, []
            for st in self._configs[state]:
                r, s = st[-1]
                t = dfas[r].step(s, byte)
                if t != DEAD:
                    moved.append(st[:-1] + ((r, t),))
            nxt = row[byte] = self._intern(self._close(moved)) if moved else DEAD
        return nxt

    def transitions(self, state):
        """The next state for each of the 256 bytes (a list): bytes that move every stack alike share one
        closure."""
        row = self._table[state]
        if len(row) < 256:
            dfas = self.dfas
            stacks = list(self._configs[state])
            columns = [dfas[st[-1][0]].transitions(st[-1][1]) for st in stacks]
            keys = columns[0] if len(columns) == 1 else list(zip(*columns))
            nxt = dict.fromkeys(keys)
            for targets in nxt:
                targets_ = (targets,) if len(columns) == 1 else targets
                moved = [st[:-1] + ((st[-1][0], t),) for st, t in zip(stacks, targets_) if t != DEAD]
                nxt[targets] = self._intern(self._close(moved)) if moved else DEAD
            self._table[state] = row = dict(enumerate(nxt[k] for k in keys))
        return [row[b] for b in range(256)]

    def accepting(self, state):
        return state >= 0 and self._accepting[state]

    def live(self, state):
        return state >= 0       # every frame's state reaches its rule's end, and every rule derives some string

    def walk(self, data, state=None):
        s = self.start if state is None else state
        for b in data:
            s = self.step(s, b)
            if s < 0:
                return DEAD
        return s

    def fullmatch(self, data):
        return self.accepting(self.walk(data))

    @property
    def num_states(self):
        return len(self._configs)
