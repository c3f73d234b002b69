"""Constrained decoding's speed against llguidance (and xgrammar where it is installed), on GPT-2's 50,257 tokens,
one thread, the same grammars and the same token paths side by side in one process.

    pip install llguidance hypothesis-jsonschema   # the references (not dependencies of tinyllm or its tests)
    pip install --no-deps xgrammar apache-tvm-ffi  # optional third engine (--no-deps: its torch/triton pins)
    python bench/grammar.py                        # --regex and --json tables (masks, compile)
    python bench/grammar.py --json --paths 4 --docs 8 --tokens 64
    python bench/grammar.py --decode               # constrained vs unconstrained tokens/s, config M, 2 threads

--regex: the patterns below; --json: bench/grammar_schemas_bench_data.py's schemas, compact JSON (tinyllm's
convention, tinyllm/grammar/json_schema.py: members in `properties` order; llguidance with whitespace_flexible
false and separators ":" ","; xgrammar with any_whitespace=False, separators (",", ":") and strict_mode).
For each grammar: compile time, the median of three fresh compiles (tinyllm: grammar.compile from an empty grammar
cache, the token trie built once per tokenizer and reported apart; llguidance: the grammar and an LLMatcher;
xgrammar: GrammarCompiler.compile_*, one thread, its cache off), and the time to compute each step's mask along
token paths replayed in every engine, p50 and p99 over the steps. Paths: --paths random walks of up to --tokens
allowed tokens drawn by tinyllm's matcher, and (--json) --docs documents hypothesis-jsonschema generates for the
schema, checked by jsonschema (formats too), written compactly with members in the schema's order and tokenized by
GPT-2's BPE, then end of text. Every step's masks are compared; a document an engine rejects is reported and its
path stops there. tinyllm's masks are cached per automaton state, so the first visit of a state pays the trie walk
and later ones nothing; every grammar is compiled afresh before its paths are replayed, so first visits are counted
(the path drawing warmed another copy).

--decode: GPT.generate on the C runtime, config M (n_layer 6, n_head 6, n_embd 384, block_size 256) with GPT-2's
vocabulary, randomly initialised (seed 0: its text is noise, so under a JSON grammar it wanders inside strings;
max_new_tokens caps it), batch 1, KV cache, temperature 1 from seed r in repeat r, in a subprocess with 2 threads
and OMP_PROC_BIND=true. Unconstrained against constrained, the grammar compiled afresh before each repeat (cold:
its masks computed as the walk reaches new states) and kept from the previous repeats (warm); tokens/s counts
every generated position (a row that ended is padded with end of text, each padding step a full forward)."""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # llguidance's thread pool, before it is imported
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from common import cpu_model, worker_env  # noqa: E402  (bench/common.py: bench/ is the script directory)
from grammar_schemas_bench_data import SCHEMAS  # noqa: E402

PATTERNS = {
    "date": r"\d{4}-\d{2}-\d{2}",
    "email": r"[a-z0-9._]{1,20}@[a-z0-9]{1,12}\.(com|org|net)",
    "number": r"-?(0|[1-9]\d{0,8})(\.\d{1,6})?",
    "quoted string": r'"([^"\\]|\\["\\nt])*"',
    "words": r"[A-Z][a-z]+( [a-z]+){2,12}\.",
    "key=value list": r"(\w+=\d+)(, \w+=\d+){0,6}",
}
DECODE_SCHEMAS = ("get_weather", "user_record")
CONFIG_M = dict(n_layer=6, n_head=6, n_embd=384, block_size=256)  # examples/gpt.py's and bench/decode.py's M


class Wrapper:
    """tinyllm's GPT-2 tokenizer as llguidance's TokenizerWrapper expects one."""

    def __init__(self, tok):
        self.eos_token_id, self.bos_token_id = tok.eot_token, None
        self.tokens = [tok.decode_single_token_bytes(i) for i in range(tok.n_vocab)]
        self.special_token_ids = [tok.eot_token]
        self._tok = tok

    def __call__(self, s):
        return self._tok.encode_ordinary(s.decode("utf-8", errors="replace") if isinstance(s, bytes) else s)


class Tinyllm:
    name = "tinyllm"

    def __init__(self, tok):
        from tinyllm import grammar
        from tinyllm.grammar import matcher as gm
        self.grammar, self.gm, self.tok = grammar, gm, tok

    def compile(self, kind, spec):
        self.gm._compiled.pop(self.tok, None)  # a fresh compile: no state's mask cached
        return self.grammar.compile(self.tok, **{kind: spec})

    def matcher(self, g):
        return g.matcher()

    def fill(self, m):
        return m.allowed()

    def bits(self, m, filled):
        return filled

    def accept(self, m, t):
        try:
            m.accept(t)
            return True
        except ValueError:
            return False


class Llguidance:
    name = "llguidance"

    def __init__(self, tok):
        import llguidance
        import llguidance.numpy as lln
        self.ll, self.lln, self.n = llguidance, lln, tok.n_vocab
        self.lltok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Wrapper(tok)))
        self.bitmask = lln.allocate_token_bitmask(1, self.lltok.vocab_size)
        self.version = llguidance.get_version() if hasattr(llguidance, "get_version") else ""
        if not self.version:
            from importlib.metadata import version
            self.version = version("llguidance")

    def compile(self, kind, spec):
        L = self.ll.LLMatcher
        if kind == "regex":
            g = L.grammar_from_regex(spec)
        else:
            g = L.grammar_from_json_schema(spec, defaults={"whitespace_flexible": False, "key_separator": ":",
                                                           "item_separator": ","})
        m = L(self.lltok, g, log_level=0)  # (creating the matcher is where llguidance does its work)
        assert not m.is_error(), m.get_error()
        return {"grammar": g, "matcher": m}

    def matcher(self, c):
        """One matcher per grammar, reset per path: what it built lazily is kept, as tinyllm keeps its masks per
        grammar; a new one after a rejected token (reset does not clear the error)."""
        if c["matcher"].is_error():
            c["matcher"] = self.ll.LLMatcher(self.lltok, c["grammar"], log_level=0)
        c["matcher"].reset()
        return c["matcher"]

    def fill(self, m):
        self.lln.fill_next_token_bitmask(m, self.bitmask, 0)

    def bits(self, m, filled):
        import numpy as np
        return np.unpackbits(self.bitmask[0].view(np.uint8), bitorder="little")[:self.n].astype(bool)

    def accept(self, m, t):
        return m.consume_token(t)


class Xgrammar:
    name = "xgrammar"

    def __init__(self, tok):
        import xgrammar as xgr
        self.x, self.n = xgr, tok.n_vocab
        vocab = [tok.decode_single_token_bytes(i) for i in range(tok.n_vocab)]
        self.info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=tok.n_vocab,
                                      stop_token_ids=[tok.eot_token])
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        self.bitmask = xgr.allocate_token_bitmask(1, tok.n_vocab)
        from importlib.metadata import version
        self.version = version("xgrammar")

    def compile(self, kind, spec):
        if kind == "regex":
            return self.compiler.compile_regex(spec)
        return self.compiler.compile_json_schema(json.dumps(spec), any_whitespace=False, separators=(",", ":"),
                                                 strict_mode=True)

    def matcher(self, g):
        return self.x.GrammarMatcher(g)

    def fill(self, m):
        m.fill_next_token_bitmask(self.bitmask)

    def bits(self, m, filled):
        import numpy as np
        return np.unpackbits(self.bitmask[0].numpy().view(np.uint8), bitorder="little")[:self.n].astype(bool)

    def accept(self, m, t):
        return m.accept_token(t)


def random_paths(engines, compiled, n, length, seed):
    """n walks of up to `length` tokens, each drawn uniformly from the tokens tinyllm's matcher allows and the
    other engines allow too (so that every engine can replay it; where they share none, from tinyllm's alone)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        ms = {e.name: e.matcher(compiled[e.name]) for e in engines}
        path = []
        while len(path) < length and not ms["tinyllm"].is_terminated():
            ours = ms["tinyllm"].allowed()
            both = ours.copy()
            for e in engines[1:]:
                both &= e.bits(ms[e.name], e.fill(ms[e.name]))
            t = rng.choice([int(i) for i in (both if both.any() else ours).nonzero()[0]])
            ok = [e.accept(ms[e.name], t) for e in engines]
            path.append(t)
            if not all(ok):
                break
        out.append(path)
    return out


def _resolve(schema, root):
    while isinstance(schema, dict) and "$ref" in schema:
        node = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            node = node[part]
        schema = node
    return schema


def in_schema_order(value, schema, root):
    """`value` with every object's members in its schema's `properties` order, then the others as they came
    (anyOf/oneOf: the first branch that validates it)."""
    import jsonschema
    schema = _resolve(schema, root)
    if not isinstance(schema, dict):
        return value
    for key in ("anyOf", "oneOf"):
        for branch in schema.get(key, ()):
            if jsonschema.Draft202012Validator({**branch, "$defs": root.get("$defs", {})}).is_valid(value):
                return in_schema_order(value, branch, root)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", {})
        keys = [k for k in props if k in value] + [k for k in value if k not in props]
        return {k: in_schema_order(value[k], props.get(k, extra), root) for k in keys}
    if isinstance(value, list):
        prefix = schema.get("prefixItems", [])
        return [in_schema_order(v, prefix[i] if i < len(prefix) else schema.get("items", {}), root)
                for i, v in enumerate(value)]
    return value


_UUID = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"


def unrolled(schema, root, depth=3):
    """`schema` with each $ref inlined `depth` deep and false below (hypothesis-jsonschema resolves no recursion),
    and format uuid as its pattern (hypothesis-jsonschema has no uuid strategy)."""
    if isinstance(schema, list):
        return [unrolled(s, root, depth) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if schema.get("format") == "uuid":
        schema = {**{k: v for k, v in schema.items() if k != "format"}, "pattern": _UUID}
    if "$ref" in schema:
        return unrolled(_resolve(schema, root), root, depth - 1) if depth > 0 else False
    return {k: v if k in ("enum", "const", "required") else unrolled(v, root, depth)
            for k, v in schema.items() if k != "$defs"}


def documents(schema, n, seed):
    """n distinct compact JSON documents hypothesis-jsonschema generates for `schema` (the longest of ~12n draws,
    so not only the minimal ones), each valid by jsonschema with format checking."""
    import jsonschema
    from hypothesis import HealthCheck, given, settings
    from hypothesis_jsonschema import from_schema
    drawn = []

    @settings(max_examples=12 * n, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(from_schema(unrolled(schema, schema)))
    def collect(value):
        drawn.append(value)
    collect()
    checker = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    texts = {json.dumps(in_schema_order(v, schema, schema), separators=(",", ":"), ensure_ascii=False)
             for v in drawn if checker.is_valid(v)}
    texts = sorted(texts, key=lambda s: (-len(s), s))
    rng = random.Random(seed)
    longest, rest = texts[:n // 2], texts[n // 2:]
    return longest + rng.sample(rest, min(len(rest), n - len(longest)))


def kind_of_difference(examples):
    """A rough label for a step's differing tokens (the first few), to group the report."""
    toks = [t for t, _ in examples]
    who = "tinyllm allows" if all(a for _, a in examples) else "tinyllm forbids" if not any(a for _, a in examples) \
        else "mixed"
    if all(b"\\" in t for t in toks):
        return f"escapes ({who})"
    if all(b"\x7f" in t for t in toks):
        return f"raw DEL ({who})"
    if all(b"\\" in t or b"\x7f" in t for t in toks):
        return f"escapes or raw DEL ({who})"
    return f"other ({who})"


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def us(x):
    return f"{x * 1e6:.1f}" if x < 1e-4 else f"{x * 1e6:.0f}"


def replay(engines, compiled, paths, tok, name, stats, report):
    """Every path in every engine: each step's mask timed per engine and compared with tinyllm's."""
    for kind, path in paths:
        ms = {e.name: e.matcher(compiled[e.name]) for e in engines}
        done = b""
        for t in path:
            masks = {}
            for e in engines:
                t0 = time.perf_counter()
                filled = e.fill(ms[e.name])
                stats[e.name][kind].append(time.perf_counter() - t0)
                masks[e.name] = e.bits(ms[e.name], filled)
            ours = masks["tinyllm"]
            for e in engines[1:]:
                report["compared"][e.name] += 1
                if not (masks[e.name] == ours).all():
                    diff = [int(i) for i in (masks[e.name] != ours).nonzero()[0]]
                    report["differ"][e.name].append(
                        (name, len(diff), [(tok.decode_single_token_bytes(i), bool(ours[i])) for i in diff[:4]],
                         done))
            rejected = [e.name for e in engines if not e.accept(ms[e.name], t)]
            if rejected:
                report["rejected"].append((name, kind, rejected, done, tok.decode_single_token_bytes(t)))
                break
            done += tok.decode_single_token_bytes(t)


def mask_table(title, kind, specs, engines, tok, args, seed_of, docs_of=None):
    names = [e.name for e in engines]
    cols = " | ".join(f"{n} compile ms" for n in names)
    p50s = " | ".join(f"{n} mask p50 µs" for n in names)
    p99s = " | ".join(f"{n} p99 µs" for n in names)
    print(f"\n### {title}\n")
    print(f"| {kind} | paths | steps | {cols} | {p50s} | {p99s} | p50 / llg | p99 / llg |")
    print("|---|---:|---:|" + "---:|" * (3 * len(names) + 2))
    every = {n: {"random": [], "document": []} for n in names}
    compile_s = {n: [] for n in names}
    report = {"compared": {n: 0 for n in names}, "differ": {n: [] for n in names}, "rejected": [], "docs": {}}
    for name, spec in specs.items():
        first = {e.name: e.compile(kind, spec) for e in engines}
        paths = [("random", p) for p in random_paths(engines, first, args.paths, args.tokens, seed_of(name))]
        if docs_of is not None:
            docs = docs_of(name, spec)
            report["docs"][name] = docs
            paths += [("document", tok.encode_ordinary(d) + [tok.eot_token]) for d in docs]
        compiled = {}
        for e in engines:  # each compiled fresh 3 times, the median kept; the last copy replays the paths (cold)
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                compiled[e.name] = e.compile(kind, spec)
                times.append(time.perf_counter() - t0)
            compile_s[e.name].append(statistics.median(times))
        stats = {n: {"random": [], "document": []} for n in names}
        replay(engines, compiled, paths, tok, name, stats, report)
        steps = {n: stats[n]["random"] + stats[n]["document"] for n in names}
        for n in names:
            for k in ("random", "document"):
                every[n][k] += stats[n][k]
        o, ll = steps["tinyllm"], steps["llguidance"]
        ms = " | ".join(f"{compile_s[n][-1] * 1e3:.2f}" for n in names)
        print(f"| {name} | {len(paths)} | {len(o)} | " + ms + " | "
              + " | ".join(us(pct(steps[n], 0.5)) for n in names) + " | "
              + " | ".join(us(pct(steps[n], 0.99)) for n in names)
              + f" | {pct(o, 0.5) / pct(ll, 0.5):.2f} | {pct(o, 0.99) / pct(ll, 0.99):.2f} |")
    for label, ks in (("all", ("random", "document")), ("random paths", ("random",)),
                      ("document paths", ("document",))):
        steps = {n: [x for k in ks for x in every[n][k]] for n in names}
        o, ll = steps["tinyllm"], steps["llguidance"]
        if not o:
            continue
        comp = " | ".join(f"p50 {pct(compile_s[n], 0.5) * 1e3:.2f}" if label == "all" else "" for n in names)
        print(f"| **{label}** | | {len(o)} | {comp} | " + " | ".join(us(pct(steps[n], 0.5)) for n in names) + " | "
              + " | ".join(us(pct(steps[n], 0.99)) for n in names)
              + f" | {pct(o, 0.5) / pct(ll, 0.5):.2f} | {pct(o, 0.99) / pct(ll, 0.99):.2f} |")
    o = every["tinyllm"]["random"] + every["tinyllm"]["document"]
    means = ", ".join(f"{n} {statistics.mean(every[n]['random'] + every[n]['document']) * 1e6:.0f}" for n in names)
    print(f"\ncompile ms p50 / max over the {len(specs)} grammars: " + ", ".join(
        f"{n} {pct(compile_s[n], 0.5) * 1e3:.2f} / {max(compile_s[n]) * 1e3:.1f}" for n in names)
        + f"; mean mask µs: {means}")
    for e in engines[1:]:
        d = report["differ"][e.name]
        print(f"masks compared with {e.name} at every step: {report['compared'][e.name] - len(d)} of "
              f"{report['compared'][e.name]} equal")
        groups = {}
        for x in d:
            groups.setdefault((x[0], kind_of_difference(x[2])), []).append(x)
        for (name, why), xs in groups.items():
            _, n, examples, prefix = xs[0]
            print(f"  {name}, {why}: {len(xs)} steps, e.g. after {prefix[-50:]!r}, {n} tokens differ, e.g. "
                  f"(token, tinyllm allows) {examples[:3]}")
    rejected = {}
    for name, kind_, who, prefix, t in report["rejected"]:
        rejected.setdefault((name, kind_, tuple(who)), []).append((prefix, t))
    for (name, kind_, who), xs in rejected.items():
        prefix, t = xs[0]
        print(f"  {len(xs)} {kind_} path(s) of {name} rejected by {', '.join(who)}, e.g. token {t!r} after "
              f"{prefix[-60:]!r}")
    return report


def masks(args):
    from tinyllm.grammar import matcher as gm
    from tinyllm.tokenizer import Tokenizer
    tok = Tokenizer.gpt2()
    start = time.perf_counter()
    gm._tries[tok] = gm.TokenTrie(tok, tok.eot_token)
    trie_s = time.perf_counter() - start
    engines = [Tinyllm(tok), Llguidance(tok)]
    if not args.no_xgrammar:
        try:
            engines.append(Xgrammar(tok))
        except ImportError as exc:
            print(f"# xgrammar not installed ({exc}): two engines")
    versions = "; ".join(f"{e.name} {e.version}" for e in engines[1:])
    print(f"# python bench/grammar.py {' '.join(sys.argv[1:])}; CPU {cpu_model()}, one thread; GPT-2's "
          f"{tok.n_vocab:,} tokens (tinyllm's token trie built once in {trie_s:.2f} s); {versions}; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    if args.regex:
        mask_table(f"regexes: {args.paths} random paths of up to {args.tokens} tokens each", "regex", PATTERNS,
                   engines, tok, args, seed_of=len)
    if args.json:
        import hypothesis_jsonschema  # noqa: F401  (its ImportError before the tables)
        schemas = {k: v for k, v in SCHEMAS.items() if not args.schemas or k in args.schemas}
        t0 = time.perf_counter()
        docs = {name: documents(s, args.docs, seed=len(name)) for name, s in schemas.items()}
        print(f"\n# {sum(map(len, docs.values()))} documents drawn by hypothesis-jsonschema in "
              f"{time.perf_counter() - t0:.1f} s")
        for e in engines:  # one-time setup (tables every grammar shares), outside the per-schema compile times
            t0 = time.perf_counter()
            e.compile("json_schema", {"type": "object", "properties": {"a": {"type": "string"}}})
            print(f"# {e.name}: first JSON schema compile (one-time setup) {(time.perf_counter() - t0) * 1e3:.1f} ms")
        rep = mask_table(f"JSON schemas: {args.paths} random paths of up to {args.tokens} tokens and {args.docs} "
                         "documents each", "json_schema", schemas, engines, tok, args, seed_of=len,
                         docs_of=lambda name, s: docs[name])
        if args.show_docs:
            for name, ds in rep["docs"].items():
                print(f"  {name}: {ds[0][:150] if ds else '(none)'}")


def decode_worker(args):
    import numpy as np
    import tinyllm as tl
    from tinyllm import grammar
    from tinyllm.grammar import matcher as gm
    from tinyllm.models.gpt import GPT, GPTConfig
    from tinyllm.tokenizer import Tokenizer
    tok = Tokenizer.gpt2()
    tl.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.n_vocab, **CONFIG_M)).to("c")
    model.eval()
    gm._tries[tok] = gm.TokenTrie(tok, tok.eot_token)
    prompt = tok.encode_ordinary("JSON:")
    n = args.new_tokens

    spent = [0.0]  # seconds in the grammar's work: generate's mask (_grammar_mask) and Matcher.accept

    def timed(fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[0] += time.perf_counter() - t0
        return wrapper
    model._grammar_mask = timed(model._grammar_mask)
    gm.Matcher.accept = timed(gm.Matcher.accept)

    def run(g, r):
        idx = tl.tensor(np.array([prompt]), device="c")
        spent[0] = 0.0
        t0 = time.perf_counter()
        out = model.generate(idx, n, temperature=1.0, generator=tl.Generator().manual_seed(r), grammar=g)
        dt = time.perf_counter() - t0
        new = [int(t) for t in out.numpy()[0, len(prompt):]]
        produced = new.index(tok.eot_token) if tok.eot_token in new else len(new)
        return n / dt, produced, tok.decode(new[:produced]), spent[0] / n, dt / n

    rows = {}
    run(None, 0)  # warm-up: kernels, the decode step recorded
    schemas = list(DECODE_SCHEMAS)
    res = {"none": []}
    for s in schemas:
        res[f"{s} cold"], res[f"{s} warm"] = [], []
        gm._compiled.pop(tok, None)
        rows[s] = grammar.compile(tok, json_schema=SCHEMAS[s])
        run(rows[s], 10 ** 6)  # the warm grammar's first states
    for r in range(args.repeats):
        res["none"].append(run(None, r))
        for s in schemas:
            gm._compiled.pop(tok, None)
            cold = grammar.compile(tok, json_schema=SCHEMAS[s])
            res[f"{s} cold"].append(run(cold, r))
            res[f"{s} warm"].append(run(rows[s], r))
    print(json.dumps(res))


def decode(args):
    env = worker_env(args.threads)
    cmd = [sys.executable, os.path.abspath(__file__), "--decode-worker", "--new-tokens", str(args.new_tokens),
           "--repeats", str(args.repeats)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode:
        sys.exit(out.stderr)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\n### constrained decoding: config M (n_layer 6, n_head 6, n_embd 384), GPT-2's {50257:,} tokens, random "
          f"init (seed 0), C runtime, {args.threads} threads, OMP_PROC_BIND={env['OMP_PROC_BIND']}; batch 1, KV "
          f"cache, temperature 1, {args.new_tokens} new tokens after a 2-token prompt, {args.repeats} repeats "
          "(seed r in repeat r)\n")
    print("| grammar | tokens/s median | min-max | ratio to unconstrained | ms per token | of which grammar ms "
          "(mask + accept) | 1 - grammar share | tokens before end of text (per repeat) |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    base = statistics.median(x[0] for x in res["none"])
    for name, runs in res.items():
        tps = [x[0] for x in runs]
        med = statistics.median(tps)
        per = statistics.median(x[4] for x in runs)
        gram = statistics.median(x[3] for x in runs)
        print(f"| {name if name != 'none' else 'unconstrained'} | {med:.1f} | {min(tps):.1f}-{max(tps):.1f} | "
              f"{med / base:.2f} | {per * 1e3:.1f} | {gram * 1e3:.2f} | {1 - gram / per:.3f} | "
              f"{' '.join(str(x[1]) for x in runs)} |")
    print("(1 - grammar share: the constrained/unconstrained ratio the grammar's own time allows, less sensitive to "
          "the machine's load than the ratio of medians)")
    for name, runs in res.items():
        if name != "none":
            print(f"  {name}, repeat 0: {runs[0][2][:110]!r}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--regex", action="store_true", help="the regex table")
    p.add_argument("--json", action="store_true", help="the JSON schema table")
    p.add_argument("--decode", action="store_true", help="constrained vs unconstrained decoding")
    p.add_argument("--paths", type=int, default=8, help="random paths per grammar")
    p.add_argument("--tokens", type=int, default=48, help="tokens per random path at most")
    p.add_argument("--docs", type=int, default=8, help="hypothesis-jsonschema documents per schema")
    p.add_argument("--schemas", nargs="*", help="only these schemas (names in grammar_schemas_bench_data.py)")
    p.add_argument("--show-docs", action="store_true", help="print one document per schema")
    p.add_argument("--no-xgrammar", action="store_true")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--decode-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.decode_worker:
        return decode_worker(args)
    if not (args.regex or args.json or args.decode):
        args.regex = args.json = True
    if args.regex or args.json:
        masks(args)
    if args.decode:
        if not (args.regex or args.json):
            print(f"# python bench/grammar.py {' '.join(sys.argv[1:])}; CPU {cpu_model()}; load average "
                  f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        decode(args)


if __name__ == "__main__":
    main()
