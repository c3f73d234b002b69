"""A grammar's byte automaton matched against a tokenizer's tokens: which tokens may come next.

A grammar is compiled to a deterministic automaton over bytes (tinyllm/grammar/regex_dfa.py for regexes; the
`LiteralDFA` below for a set of strings) whose every state can still reach acceptance. Tokens are byte strings
(`decode_single_token_bytes`), held in a trie; the mask of a state walks the trie once, stepping the automaton by
each edge's byte and cutting every subtree whose state is dead (LLGuidance's token-trie walk). A token that ends
in the middle of a UTF-8 character is allowed exactly when some continuation of that character can still match,
since the automaton runs on bytes. The mask depends on the automaton's state alone, so each state's mask is
computed once and cached. End of text (the tokenizer's `eot_token`) is allowed exactly where the output so far is
in the language; it is never text.
"""
import contextlib
import gc
import weakref

import numpy as np

from .cfg import CFG
from .gbnf import parse_gbnf
from .json_schema import schema_grammar
from .regex_dfa import DEAD, Automaton, NativeDFA, compile_regex, kernels  # (DEAD, -1: no continuation can match)


class LiteralDFA(Automaton):
    """The automaton of a finite set of byte strings: a trie, state 0 its root; every state is live (it lies on
    the way to some string)."""

    def __init__(self, strings):
        self.edges, self.final = [{}], [False]
        for s in strings:
            state = 0
            for b in s:
                nxt = self.edges[state].get(b)
                if nxt is None:
                    nxt = len(self.edges)
                    self.edges[state][b] = nxt
                    self.edges.append({})
                    self.final.append(False)
                state = nxt
            self.final[state] = True
        self.start = 0

    def step(self, state, byte):
        return self.edges[state].get(byte, DEAD) if state != DEAD else DEAD

    def accepting(self, state):
        return state != DEAD and self.final[state]

    def transitions(self, state):
        row = [DEAD] * 256
        if state != DEAD:
            for b, t in self.edges[state].items():
                row[b] = t
        return row


class TokenTrie:
    """The tokenizer's tokens (all but end of text) as a trie over their bytes, its nodes numbered in preorder
    (inserting the sorted byte strings creates them in that order): `parent[n]`, `byte[n]` (the byte on the edge
    into n), `skip[n]` (the node after n's subtree), `token[n]` the token ending at n (-1: none; `same_bytes`
    pairs the other ids with equal bytes with it), `end[id]` token id's node (0, the root, for the ids that are
    never text), and `levels[d]` the nodes of depth d + 1 (for the NumPy walk). Built once per tokenizer."""

    def __init__(self, tokenizer, eot):
        n = tokenizer.n_vocab
        self.token_bytes = _token_bytes(tokenizer, eot)
        items = sorted((data, i) for i, data in enumerate(self.token_bytes) if data)
        children = {}                                   # (parent node, byte) -> node
        parent, edge, depth = [0], [0], [0]
        end = np.zeros(n, np.int64)
        for data, i in items:
            node = 0
            for b in data:
                nxt = children.get((node, b))
                if nxt is None:
                    nxt = children[(node, b)] = len(parent)
                    parent.append(node)
                    edge.append(b)
                    depth.append(depth[node] + 1)
                node = nxt
            end[i] = node
        self.num_nodes = len(parent)
        self.parent = np.array(parent, np.int32)
        self.byte = np.array(edge, np.uint8)
        size = np.ones(self.num_nodes, np.int64)
        for node in range(self.num_nodes - 1, 0, -1):   # (reversed preorder: children before their parent)
            size[parent[node]] += size[node]
        self.skip = (np.arange(self.num_nodes) + size).astype(np.int32)
        self.end = end.astype(np.int32)
        self.token = np.full(self.num_nodes, -1, np.int32)  # one token per node; the others with its bytes:
        ids = np.flatnonzero(self.end > 0)
        self.token[self.end[ids[::-1]]] = ids[::-1]     # (the lowest id wins)
        same = ids[self.token[self.end[ids]] != ids]
        self.same_bytes = (same, self.token[self.end[same]])   # out[same] = out[the node's token]
        by_depth = np.array(depth)
        self.levels = [np.flatnonzero(by_depth == d) for d in range(1, int(by_depth.max()) + 1)]
        # the C walk's layout (runtime_c/grammar.h): byte | depth << 8 per node, and token n_vocab where none
        self.node = (self.byte.astype(np.uint32) | (by_depth.astype(np.uint32) << 8))
        self.token_or_spare = np.where(self.token < 0, n, self.token).astype(np.uint32)
        self._depth_scratch = np.empty(len(self.levels) + 1, np.int32)
        self._blocked = np.empty(2 * self.num_nodes, np.int32)
        self._args = None
        kernels()                                       # (imported now, as part of the setup, not in a mask)

    def allowed(self, automaton, state, out):
        """Set out[id] for every token whose bytes, fed to `automaton` from `state`, leave it live; `out` has
        n_vocab + 1 entries (the last is the C walk's spare). The C kernel (runtime_c/grammar.c) visits only the
        live part of the trie; a NativeDFA's rows are made on the way, another automaton's are filled here when
        the walk pauses for them. Without the kernels, NumPy walks the whole trie depth by depth."""
        lib = kernels()
        if lib is not None:
            ffi, lib = lib
            if self._args is None:
                ptr = ffi.from_buffer
                self._args = (ptr("uint32_t[]", self.node), ptr("int32_t[]", self.skip),
                              ptr("uint32_t[]", self.token_or_spare))
                self._scratch = (ptr("int32_t[]", self._blocked), ptr("int32_t[]", self._depth_scratch))
            mask = ffi.from_buffer("uint8_t[]", out.view(np.uint8))   # (the kernel only sets entries)
            pending = np.array([0, state + 1], np.int32)
            native = isinstance(automaton, NativeDFA)
            table = None if native else _Table.of(automaton)
            while True:
                if native:
                    rows = done = ffi.NULL
                else:
                    table.ensure(pending[1::2])         # (the rows the walk paused for)
                    rows, done = ffi.from_buffer("int32_t[]", table.rows), ffi.from_buffer("uint8_t[]", table.done)
                n = lib.grammar_trie_walk(automaton._g if native else ffi.NULL, rows, done, *self._args,
                                          ffi.from_buffer("int32_t[]", pending), len(pending) // 2,
                                          *self._scratch, mask)
                if n < 0:
                    raise MemoryError(f"grammar: no memory for more states of {automaton.pattern!r}")
                if not n:
                    break
                pending = self._blocked[:2 * n].copy()
            same, first = self.same_bytes
            if len(same):
                out[same] = out[first]
            return
        table = _Table.of(automaton)
        table.ensure(np.array([state + 1]))
        states = np.zeros(self.num_nodes, np.int32)     # each node's state + 1 (0: dead)
        states[0] = state + 1
        for level in self.levels:
            parents = states[self.parent[level]]
            if not parents.any():                       # every node of this depth is dead: so are the deeper
                break
            table.ensure(parents)
            states[level] = table.rows[parents, self.byte[level]]
        allowed = states[self.end] > 0
        allowed[self.end == 0] = False
        out[:-1] |= allowed


def _token_bytes(tokenizer, eot):
    """Each id's bytes, b"" for the ids that are never text: end of text, the other special tokens (tiktoken
    decodes <|fim_prefix|> to its name, which is not what it means) and ids the tokenizer has no token for."""
    special = {eot}
    for text in getattr(tokenizer, "special_tokens_set", ()):
        try:
            ids = tokenizer.encode(text, allowed_special={text})
        except Exception:  # noqa: BLE001 (a tokenizer that cannot say which id it is: leave it as text)
            continue
        if len(ids) == 1:
            special.add(ids[0])
    out = []
    for i in range(tokenizer.n_vocab):
        try:
            out.append(b"" if i in special else tokenizer.decode_single_token_bytes(i))
        except KeyError:                                # a hole in the ids (tiktoken's cl100k_base has some)
            out.append(b"")
    return out


class _Table:
    """An automaton's transitions as a dense array, rows filled on demand: rows[s + 1, b] is step(s, b) + 1 (row
    0 and value 0: dead), so a trie level is one gather."""

    _tables = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, automaton):
        t = cls._tables.get(automaton)
        if t is None:
            t = cls._tables[automaton] = cls(automaton)
        return t

    def __init__(self, automaton):
        self.automaton = automaton
        self.rows = np.zeros((64, 256), np.int32)
        self.done = np.zeros(64, np.uint8)              # (grows so that every state + 1 in rows is an index)
        self.done[0] = 1

    def ensure(self, states):
        """Fill the rows of `states` (state + 1 values)."""
        states = set(states.tolist())
        self.grow(max(states) + 1)
        self.fill([s for s in states if not self.done[s]])

    def grow(self, need):
        """Room for the rows of the states below `need` (a state reached by accept() has no row yet)."""
        if need > len(self.done):
            size = max(need, 2 * len(self.done))
            self.rows = np.concatenate([self.rows, np.zeros((size - len(self.rows), 256), np.int32)])
            self.done = np.concatenate([self.done, np.zeros(size - len(self.done), np.uint8)])

    def fill(self, missing):
        for s in missing:
            row = self.automaton.row(s - 1) + 1
            self.grow(max(int(row.max()), s) + 1)
            self.rows[s] = row
            self.done[s] = 1


def _token_bytes_access(tokenizer):
    missing = []
    for a in ("n_vocab", "eot_token", "decode_single_token_bytes"):
        try:
            getattr(tokenizer, a)
        except (AttributeError, KeyError):  # (tinyllm's Tokenizer without <|endoftext|>: a KeyError)
            missing.append(a)
    if missing:
        raise TypeError(f"grammar.compile: the tokenizer ({type(tokenizer).__name__}) has no {', '.join(missing)}: a "
                        "grammar needs each token's bytes (tiktoken's Encoding and tinyllm's Tokenizer have them)")


class Grammar:
    """A compiled grammar for one tokenizer: its automaton, the tokenizer's token trie, and each state's mask
    (cached). `matcher()` starts a new output."""

    def __init__(self, dfa, tokenizer, trie, description, choices=None):
        self.dfa, self.tokenizer, self.trie, self.description = dfa, tokenizer, trie, description
        self.choices = choices  # choice=[...]'s options (generate samples a whole one), else None
        self.n_vocab, self.eot = tokenizer.n_vocab, tokenizer.eot_token
        self._masks = {}
        if not dfa.live(dfa.start):
            raise ValueError(f"grammar.compile: {description} matches no string at all (its language is empty)")

    def mask(self, state):
        m = self._masks.get(state)
        if m is None:
            m = np.zeros(self.n_vocab + 1, bool)[:-1]   # (the C walk's spare entry past the end)
            self.trie.allowed(self.dfa, state, m.base)
            m[self.eot] = self.dfa.accepting(state)
            m.flags.writeable = False
            self._masks[state] = m
        return m

    def matcher(self):
        return Matcher(self)

    def __repr__(self):
        return f"<Grammar {self.description} n_vocab={self.n_vocab}>"


class Matcher:
    """One output's place in a grammar: allowed() the tokens that may come next, accept(token) one of them,
    rollback(n) the last n (end of text included), is_terminated() once end of text is accepted."""

    def __init__(self, grammar):
        self.grammar = grammar
        self._states = [grammar.dfa.start]  # the state after each accepted token (the first: before any)
        self._terminated = False

    def allowed(self):
        """A read-only bool array (n_vocab,): True for each token after which the output can still be completed
        (end of text: where it is complete already). All False once terminated."""
        if self._terminated:
            return np.zeros(self.grammar.n_vocab, bool)
        return self.grammar.mask(self._states[-1])

    def accept(self, token):
        """Append `token`; a ValueError (naming it and the position) when the grammar does not allow it there, the
        state left as it was."""
        g = self.grammar
        token = int(token)
        position = len(self._states) - 1 + self._terminated
        if not 0 <= token < g.n_vocab:
            raise ValueError(f"Matcher.accept: token id {token} is outside the vocabulary [0, {g.n_vocab})")
        if self._terminated:
            raise ValueError(f"Matcher.accept: token {token} at position {position} follows end of text")
        state = self._states[-1]
        if token == g.eot:
            if not g.dfa.accepting(state):
                raise ValueError(f"Matcher.accept: end of text (token {token}) at position {position}, but the "
                                 f"output is not complete in {g.description}")
            self._terminated = True
            return
        data = g.trie.token_bytes[token]
        if not data:
            raise ValueError(f"Matcher.accept: token {token} at position {position} is not text (a special token or "
                             "an id without bytes): a grammar allows text and end of text only")
        for b in data:
            state = g.dfa.step(state, b)
            if state == DEAD:
                raise ValueError(f"Matcher.accept: token {token} ({data!r}) at position {position} cannot continue "
                                 f"any string of {g.description}")
        self._states.append(state)

    def rollback(self, n=1):
        """Take back the last n accepted tokens (end of text counts as one)."""
        accepted = len(self._states) - 1 + self._terminated
        if not 0 <= n <= accepted:
            raise ValueError(f"Matcher.rollback: cannot take back {n} tokens, {accepted} were accepted")
        if n and self._terminated:
            self._terminated, n = False, n - 1
        del self._states[len(self._states) - n:]

    def is_terminated(self):
        return self._terminated


_tries = weakref.WeakKeyDictionary()  # tokenizer -> its TokenTrie
_compiled = weakref.WeakKeyDictionary()  # tokenizer -> {(kind, spec): Grammar}


def compile(tokenizer, *, regex=None, choice=None, json_schema=None, gbnf=None, whitespace_flexible=False):
    """The grammar of exactly one spec for `tokenizer` (anything with n_vocab, eot_token and
    decode_single_token_bytes), cached per (spec, tokenizer):
    - regex: a Python `re` pattern, matched as re.fullmatch on the output's text;
    - choice: a list of strings, the output one of them (generate samples a whole option);
    - json_schema: a JSON Schema (dict, bool or JSON text), the output a JSON document it validates, compact, or
      with at most 64 whitespace bytes between tokens with whitespace_flexible=True (tinyllm/grammar/json_schema.py
      says which keywords and conventions);
    - gbnf: a grammar in llama.cpp's GBNF format, `root` its start rule."""
    given = {k: v for k, v in dict(regex=regex, choice=choice, json_schema=json_schema, gbnf=gbnf).items()
             if v is not None}
    if len(given) != 1:
        raise TypeError(f"grammar.compile: give exactly one of regex=, choice=, json_schema=, gbnf=; got "
                        f"{', '.join(given) or 'none'}")
    _token_bytes_access(tokenizer)
    (kind, spec), = given.items()
    if whitespace_flexible and kind != "json_schema":
        raise TypeError("grammar.compile: whitespace_flexible= applies to json_schema= only")
    if kind == "json_schema":
        import json
        try:
            key = (kind, spec if isinstance(spec, (str, bytes)) else json.dumps(spec), bool(whitespace_flexible))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"grammar.compile: json_schema must be a JSON Schema (dict, bool or JSON text): {exc}")
    elif kind == "gbnf":
        if not isinstance(spec, str):
            raise TypeError(f"grammar.compile: gbnf must be the grammar's text (str), got {type(spec).__name__}")
        key = (kind, spec)
    elif kind == "choice":
        if isinstance(spec, str) or not all(isinstance(s, str) for s in spec):
            raise TypeError(f"grammar.compile: choice must be a list of strings, got {spec!r}")
        if not spec:
            raise ValueError("grammar.compile: choice=[] has no option: give at least one string")
        key = (kind, tuple(spec))
    else:
        if not isinstance(spec, str):
            raise TypeError(f"grammar.compile: regex must be a str pattern, got {type(spec).__name__}")
        key = (kind, spec)
    cache = _compiled.setdefault(tokenizer, {})
    if key in cache:
        return cache[key]
    with _gc_paused():
        dfa, description = _automaton(kind, spec, whitespace_flexible)
    trie = _tries.get(tokenizer)
    if trie is None:
        trie = _tries[tokenizer] = TokenTrie(tokenizer, tokenizer.eot_token)
    cache[key] = grammar = Grammar(dfa, tokenizer, trie, description, list(spec) if kind == "choice" else None)
    return grammar


def _automaton(kind, spec, whitespace_flexible):
    """(automaton, description) of a checked spec."""
    if kind == "choice":
        return LiteralDFA(s.encode("utf-8") for s in spec), f"choice={list(spec)!r}"
    if kind == "regex":
        return compile_regex(spec), f"regex {spec!r}"
    if kind == "json_schema":
        cfg, description = CFG(*schema_grammar(spec, whitespace_flexible), "json_schema"), "the JSON schema"
    else:
        cfg, description = CFG(*parse_gbnf(spec), "gbnf"), "the GBNF grammar"
    return cfg.dfa or cfg, description


@contextlib.contextmanager
def _gc_paused():
    """Compiling makes many small lists and tuples and no cycles worth collecting: a cyclic collection midway (it
    walks every object the program holds) can cost more than the compile itself, so it waits until the end."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
