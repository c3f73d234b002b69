"""Constrained decoding's mask time against llguidance, on GPT-2's 50,257 tokens, one thread, the same regexes and the
same token paths side by side in one process.

    pip install llguidance                       # the reference (not a dependency of tinyllm or its tests)
    python bench/grammar.py                      # the patterns below, 8 paths each of up to 48 tokens
    python bench/grammar.py --paths 4 --tokens 32

For each pattern: compile time (tinyllm: regex to automaton, the token trie built once per tokenizer and reported
apart; llguidance: LLMatcher creation), and the time to compute each step's mask along random paths of allowed
tokens (drawn by tinyllm's matcher, then replayed in both), p50 and p99 over all steps. tinyllm's masks are cached
per automaton state (a state's mask does not depend on how it was reached), so the first visit of a state pays
the trie walk and later ones nothing; every pattern starts from a fresh compile, so first visits are counted."""
import argparse
import os
import random
import statistics
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # llguidance's thread pool, before it is imported
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from common import cpu_model  # noqa: E402  (bench/common.py: bench/ is the script directory)

PATTERNS = {
    "date": r"\d{4}-\d{2}-\d{2}",
    "email": r"[a-z0-9._]{1,20}@[a-z0-9]{1,12}\.(com|org|net)",
    "number": r"-?(0|[1-9]\d{0,8})(\.\d{1,6})?",
    "quoted string": r'"([^"\\]|\\["\\nt])*"',
    "words": r"[A-Z][a-z]+( [a-z]+){2,12}\.",
    "key=value list": r"(\w+=\d+)(, \w+=\d+){0,6}",
}


class Wrapper:
    """tinyllm's GPT-2 tokenizer as llguidance's TokenizerWrapper expects one."""

    def __init__(self, tok):
        self.eos_token_id, self.bos_token_id = tok.eot_token, None
        self.tokens = [tok.decode_single_token_bytes(i) for i in range(tok.n_vocab)]
        self.special_token_ids = [tok.eot_token]
        self._tok = tok

    def __call__(self, s):
        return self._tok.encode_ordinary(s.decode("utf-8", errors="replace") if isinstance(s, bytes) else s)


def paths_of(grammar, n, length, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        m, path = grammar.matcher(), []
        while len(path) < length and not m.is_terminated():
            allowed = [int(i) for i in m.allowed().nonzero()[0]]
            t = rng.choice(allowed)
            m.accept(t)
            path.append(t)
        out.append(path)
    return out


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--paths", type=int, default=8)
    p.add_argument("--tokens", type=int, default=48)
    args = p.parse_args()
    import llguidance
    import llguidance.numpy as lln
    import numpy as np
    from tinyllm import grammar
    from tinyllm.grammar import matcher as gm
    from tinyllm.tokenizer import Tokenizer

    tok = Tokenizer.gpt2()
    start = time.perf_counter()
    gm._tries[tok] = gm.TokenTrie(tok, tok.eot_token)
    trie_s = time.perf_counter() - start
    lltok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Wrapper(tok)))
    print(f"# python bench/grammar.py --paths {args.paths} --tokens {args.tokens}; CPU {cpu_model()}, one thread; "
          f"GPT-2's {tok.n_vocab:,} tokens (tinyllm's token trie built once in {trie_s:.2f} s); llguidance "
          f"{llguidance.get_version() if hasattr(llguidance, 'get_version') else ''}")
    print("| pattern | steps | tinyllm compile ms | llguidance compile ms | tinyllm mask p50 µs | p99 µs | "
          "llguidance mask p50 µs | p99 µs |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    every = {"tinyllm": [], "llguidance": []}
    differ = []  # (pattern, tokens, examples) of the steps where the two masks differ
    for name, pattern in PATTERNS.items():
        gm._compiled.pop(tok, None)  # a fresh compile: no state's mask cached
        t0 = time.perf_counter()
        g = grammar.compile(tok, regex=pattern)
        ours_compile = time.perf_counter() - t0
        paths = paths_of(g, args.paths, args.tokens, seed=len(name))
        gm._compiled.pop(tok, None)
        g = grammar.compile(tok, regex=pattern)  # fresh again: the paths' drawing warmed the first one
        t0 = time.perf_counter()
        ll_grammar = llguidance.LLMatcher.grammar_from_regex(pattern)
        ll = llguidance.LLMatcher(lltok, ll_grammar)
        theirs_compile = time.perf_counter() - t0
        assert not ll.is_error(), ll.get_error()
        ours, theirs = [], []
        bitmask = lln.allocate_token_bitmask(1, lltok.vocab_size)
        for path in paths:
            m = g.matcher()
            ll = llguidance.LLMatcher(lltok, ll_grammar)
            done = b""
            for t in path:
                t0 = time.perf_counter()
                mask = m.allowed()
                ours.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                lln.fill_next_token_bitmask(ll, bitmask, 0)
                theirs.append(time.perf_counter() - t0)
                bits = np.unpackbits(bitmask[0].view(np.uint8), bitorder="little")[:tok.n_vocab].astype(bool)
                if not (bits == mask).all():
                    diff = np.flatnonzero(bits != mask)
                    differ.append((name, len(diff), [(tok.decode_single_token_bytes(int(i)), bool(mask[i]))
                                                     for i in diff[:4]], done))
                m.accept(t)
                assert ll.consume_token(t), ll.get_error()
                done += tok.decode_single_token_bytes(t)
        every["tinyllm"] += ours
        every["llguidance"] += theirs
        print(f"| {name} `{pattern}` | {len(ours)} | {ours_compile * 1e3:.2f} | {theirs_compile * 1e3:.2f} | "
              f"{pct(ours, 0.5) * 1e6:.1f} | {pct(ours, 0.99) * 1e6:.0f} | {pct(theirs, 0.5) * 1e6:.1f} | "
              f"{pct(theirs, 0.99) * 1e6:.0f} |")
    o, t = every["tinyllm"], every["llguidance"]
    print(f"| all | {len(o)} | | | {pct(o, 0.5) * 1e6:.1f} | {pct(o, 0.99) * 1e6:.0f} | {pct(t, 0.5) * 1e6:.1f} | "
          f"{pct(t, 0.99) * 1e6:.0f} |")
    print(f"masks compared at every step: {len(o) - len(differ)} of {len(o)} equal; mean mask µs tinyllm "
          f"{statistics.mean(o) * 1e6:.0f}, llguidance {statistics.mean(t) * 1e6:.0f}")
    for name, n, examples, prefix in differ[:6]:
        print(f"  {name}: after {prefix!r}, {n} tokens differ, e.g. (token, tinyllm allows) {examples}")


if __name__ == "__main__":
    main()
