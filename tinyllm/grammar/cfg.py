"""Context-free grammars over bytes (JSON Schema's and GBNF's front ends compile to one), run as a lazily
determinized pushdown automaton with the interface of `RegexDFA` (start, step, accepting, live), so the matcher's
token-trie walk and mask cache serve every front end alike.

    g = CFG({"root": ast, "value": ast, ...}, "root", "json_schema")

A rule's body is the regex AST of regex_dfa.py plus ("ref", name), a call of another rule. Rules that do not
take part in a recursion are inlined into their callers, so a grammar without recursion is one DFA; each remaining
rule becomes a DFA whose edges are bytes and calls. A parser state is the set of stacks of (rule, DFA state)
frames the bytes so far allow (each frame below the top holding its rule's state after the call returns), kept as
the top nodes of a graph-structured stack whose nodes share their tails (Tomita's GLR: an ambiguous grammar's
stacks would otherwise multiply with every byte); it is closed under calls (push the callee) and returns (pop an
accepting top) and interned, so each one is a state of a DFA built on demand. A call whose caller has nothing
left to do after it passes the caller's tails on instead of a frame (a tail call: right recursion, such as a
list's next item, keeps the stack flat). Left recursion would push forever without reading a byte and is
refused, as llama.cpp's GBNF does; so are rules that derive no string at all (an empty language).
"""
import numpy as np

from .regex_dfa import DEAD, Automaton, _NFA, automaton

__all__ = ["CFG"]

BOTTOM = -1          # the tail of a stack's last frame: nothing below it


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


MAX_SIZE = 200_000   # AST nodes a grammar may inline (~1 s to build in Python; past it, a clear refusal)


def _post_order(graph, roots, called):
    """The rules reachable from `roots` without entering `called` ones (but `roots` themselves), callees after
    their callers reversed: iterate reversed() to see callees first."""
    out, seen = [], set()
    for root in roots:
        if root in seen:
            continue
        seen.add(root)
        work = [(root, iter(graph[root]))]
        while work:
            r, it = work[-1]
            c = next(it, None)
            if c is None:
                out.append(r)
                work.pop()
            elif c not in seen and c not in called:
                seen.add(c)
                work.append((c, iter(graph[c])))
    return out[::-1]


def _shared_large(rules, graph, reached, recursive, budget=4000):
    """The non-recursive rules worth keeping as calls: inlining copies a rule's states into every place that uses
    it (and into every copy of those places), so a large rule used from many places (JSON Schema's shared $defs)
    would multiply the automaton. Sizes count AST nodes, a repetition its copies; callees first."""
    order = reversed(_post_order(graph, [r for r in reached if r not in recursive], recursive))
    uses = {}
    for r in reached:
        for c in graph[r]:
            uses[c] = uses.get(c, 0) + 1
    size, keep = {}, set()
    for r in order:
        size[r] = _size(rules[r], lambda c: 1 if c in keep or c in recursive else size[c])
        if uses.get(r, 0) > 1 and size[r] * uses[r] > budget:
            keep.add(r)
    return keep


def _size(node, called_size):
    """AST nodes that building `node` makes (a repetition's body once per copy; a call: called_size(name))."""
    total, stack = 0, [(node, 1)]
    while stack:
        n, times = stack.pop()
        kind = n[0]
        total += times
        if kind == "ref":
            total += times * called_size(n[1])
        elif kind in ("cat", "alt"):
            stack += [(x, times) for x in n[1]]
        elif kind == "rep":
            stack.append((n[1], times * max(1, n[2] + (1 if n[3] is None else min(n[3] - n[2], 4)))))
        elif kind == "list":
            stack += [(x, times) for x, _, _ in n[1]] + [(n[2], times * len(n[1]))]
    return total


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


class CFG(Automaton):
    """A context-free grammar over bytes as a lazily built DFA over parser states (see the module's docstring).
    Every parser state is live: each frame's state reaches its rule's end, and every rule derives some string."""

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
        called = recursive | _shared_large(rules, graph, reached, recursive)
        kept = [start] + sorted(r for r in called & reached if r != start)
        self.names = kept
        ids, memo, nfas = {r: i for i, r in enumerate(kept)}, {}, []
        sizes = {}
        for r in reversed(_post_order(graph, kept, called)):
            sizes[r] = _size(rules[r], lambda c: 1 if c in called else sizes[c])
        total = sum(sizes[r] for r in kept)
        if total > MAX_SIZE:
            raise ValueError(f"{what}: the grammar is too large to compile here (about {total:,} automaton "
                             f"states once inlined; the limit is {MAX_SIZE:,}): shrink it, e.g. lower large "
                             "maxItems/maxLength bounds or share repeated parts")
        for r in kept:
            nfa = _NFA(ids)
            s, e = nfa.new(), nfa.new()
            nfa.build(_substitute(rules[r], rules, called, memo), s, e)
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
        self.dfas = [automaton(kept[k], *nfas[k], productive=productive) for k in range(n)]
        # one rule calling nothing: its DFA is the whole grammar, without parser states around it
        self.dfa = self.dfas[0] if n == 1 and not any(nfas[0][0].calls) else None
        self._node_ids, self._nodes = {}, []
        self._ids, self._configs, self._accepting = {}, [], []  # parser states: their top nodes
        self._table, self._rows = [], []                # a state's next states: some bytes' (step), all (row)
        self.start = self._close({(0, self.dfas[0].start): {BOTTOM}})

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

    # ---- parser states: the top nodes of a graph-structured stack, closed under calls and returns
    def _node(self, frame, tails):
        """The interned stack node: `frame` (rule, DFA state) above any of the stacks `tails` (node ids, BOTTOM
        for the empty stack). Shared tails keep an ambiguous grammar's stacks polynomial (Tomita's GLR)."""
        key = (frame, tails)
        n = self._node_ids.get(key)
        if n is None:
            n = self._node_ids[key] = len(self._nodes)
            self._nodes.append(key)
        return n

    def _close(self, tops):
        """Close {frame: tails} under calls (push the callee) and returns (an accepting frame's tails become
        tops), merging tops of one frame; -> the parser state's id (DEAD when nothing is left)."""
        dfas, nodes = self.dfas, self._nodes
        done, work = {}, list(tops)
        while work:
            f = work.pop()
            tails = frozenset(tops[f])
            if done.get(f) == tails:
                continue
            done[f] = tails
            r, s = f
            dfa = dfas[r]
            grow = []
            for k, after in dfa.calls(s):
                if dfa.accepting(after) and not dfa.has_bytes(after) and not dfa.calls(after):
                    grow.append(((k, dfas[k].start), tails))    # a tail call: the caller would only return
                else:
                    grow.append(((k, dfas[k].start), {self._node((r, after), tails)}))
            if dfa.accepting(s):
                grow += [nodes[t] for t in tails if t != BOTTOM]
            for g, more in grow:
                cur = tops.get(g)
                if cur is None:
                    tops[g] = set(more)
                    work.append(g)
                elif not cur.issuperset(more):
                    cur |= more
                    work.append(g)
        complete = any(BOTTOM in t and dfas[f[0]].accepting(f[1]) for f, t in tops.items())
        live = frozenset(self._node(f, frozenset(t)) for f, t in tops.items() if dfas[f[0]].has_bytes(f[1]))
        if not live and not complete:
            return DEAD
        key = (live, complete)
        cid = self._ids.get(key)
        if cid is None:
            cid = self._ids[key] = len(self._configs)
            self._configs.append(live)
            self._table.append({})
            self._rows.append(None)
            self._accepting.append(complete)
        return cid

    def _moved(self, state, targets):
        """{frame: tails} after each top node of `state` goes to its target DFA state (DEAD: dropped)."""
        out = {}
        for n, t in zip(self._configs[state], targets):
            if t != DEAD:
                (r, _), tails = self._nodes[n]
                cur = out.get((r, t))
                if cur is None:
                    out[(r, t)] = set(tails)
                else:
                    cur |= tails
        return out

    def step(self, state, byte):
        if state < 0:
            return DEAD
        if self._rows[state] is not None:
            return int(self._rows[state][byte])
        row = self._table[state]
        nxt = row.get(byte)
        if nxt is None:
            nodes, dfas = self._nodes, self.dfas
            targets = [dfas[nodes[n][0][0]].step(nodes[n][0][1], byte) for n in self._configs[state]]
            moved = self._moved(state, targets)
            nxt = row[byte] = self._close(moved) if moved else DEAD
        return nxt

    def row(self, state):
        """The next state for each of the 256 bytes (an int32 array): bytes that move every top node alike share
        one closure."""
        row = self._rows[state]
        if row is None:
            nodes, dfas, tops = self._nodes, self.dfas, self._configs[state]
            if not tops:                                # (complete, and nothing continues it)
                row = self._rows[state] = np.full(256, DEAD, np.int32)
                return row
            if len(tops) == 1:                          # (the common case: one column, its states small ints)
                (r, s), _ = nodes[next(iter(tops))]
                column = dfas[r].row(s) + 1
                keys = np.flatnonzero(np.bincount(column))
                inverse = np.empty(len(keys) and int(keys[-1]) + 1, np.intp)
                inverse[keys] = np.arange(len(keys))
                inverse = inverse[column]
                keys = [(k - 1,) for k in keys.tolist()]
            else:
                columns = np.stack([dfas[nodes[n][0][0]].row(nodes[n][0][1]) for n in tops], 1)   # (_moved's order)
                keys, inverse = np.unique(columns, axis=0, return_inverse=True)
                keys = [tuple(k) for k in keys.tolist()]
            nxt = [self._close(moved) if (moved := self._moved(state, k)) else DEAD for k in keys]
            row = self._rows[state] = np.array(nxt, np.int32)[inverse.ravel()]
        return row

    def transitions(self, state):
        return self.row(state).tolist()

    def accepting(self, state):
        return state >= 0 and self._accepting[state]

    @property
    def num_states(self):
        return len(self._configs)
