"""JSON-schema grammars on real schemas (issue 45): each schema of tests/data/json_schemas/ (README.md there: the
JSON-Schema-Test-Suite's, SchemaStore's, nbformat's, handwritten and drawn ones) compiled with
tinyllm.grammar.compile(TOK, json_schema=...), then its instances (instances.jsonl, checked with jsonschema) fed
token by token, both byte by byte and in a greedy multi-byte tokenization, then end of text. A compiled grammar must
accept every valid instance and no invalid one; a schema that does not compile must say so with a ValueError or a
NotImplementedError (an unsupported keyword), and most schemas must compile.

The unmarked tests run a fixed subset (every schema of the handwritten source and every FAST_STRIDE-th of the
others) in well under a minute; TINYLLM_GRAMMAR_SCHEMAS=all runs every schema (bench/grammar_schemas.py prints the
counts table of the whole corpus)."""
import collections
import json
import os
import re
import time

import numpy as np
import pytest

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "json_schemas")
FAST_STRIDE = 8
MIN_COMPILED = 0.65  # the fraction of schemas that must compile (0.70 on 2026-12-06: bench/grammar_schemas.py)
KEYWORDS = ["$dynamicRef", "$dynamicAnchor", "$anchor", "$ref", "$defs", "definitions", "$id", "$schema",
            "additionalProperties", "patternProperties", "propertyNames", "unevaluatedProperties",
            "unevaluatedItems", "dependentRequired", "dependentSchemas", "dependencies", "minProperties",
            "maxProperties", "prefixItems", "additionalItems", "items", "contains", "minContains", "maxContains",
            "uniqueItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format", "multipleOf",
            "exclusiveMinimum", "exclusiveMaximum", "minimum", "maximum", "enum", "const", "anyOf", "oneOf",
            "allOf", "not", "if", "then", "else", "required", "properties", "type"]


class JsonTokenizer:
    """A test tokenizer: all 256 single bytes (so any output can be fed byte by byte), multi-byte tokens of JSON's
    punctuation, literals and common words (some crossing a string's quote, some splitting a UTF-8 character), and
    end of text last. greedy(data): the longest token at each position."""

    MERGES = ['":"', '","', '{"', '"}', '":', ',"', '},{"', '"]', '["', '[{"', '"}]', '}}', ']}', '":[', '":{',
              "true", "false", "null", ",null", ":true", ":false", "00", "-0", "0.", "e+", "e-", "\\n", '\\"',
              "\\u00", "-01-", "T00:00:00", "Z", "@", ".com", "name", "type", "id", "description", "value",
              "items", "string", "properties", "aa", "aaaa", "  ", "é", "中文", "😀", '"é']

    def __init__(self):
        merges = {m.encode() for m in self.MERGES} | {"中".encode()[:2], "😀".encode()[1:], "é".encode()[1:] + b'"'}
        self.tokens = [bytes([i]) for i in range(256)] + sorted(m for m in merges if len(m) > 1)
        self.n_vocab = len(self.tokens) + 1
        self.eot_token = self.n_vocab - 1
        self._ids = {t: i for i, t in enumerate(self.tokens)}
        self._longest = max(len(t) for t in self.tokens)

    def decode_single_token_bytes(self, i):
        return b"<|endoftext|>" if i == self.eot_token else self.tokens[i]

    def greedy(self, data):
        out, i = [], 0
        while i < len(data):
            for n in range(min(self._longest, len(data) - i), 0, -1):
                t = self._ids.get(data[i:i + n])
                if t is not None:
                    out.append(t)
                    i += n
                    break
        return out

    def bytewise(self, data):
        return list(data)


TOK = JsonTokenizer()


def load():
    schemas = [json.loads(line) for line in open(os.path.join(DATA, "schemas.jsonl"), encoding="utf-8")]
    instances = {r["id"]: r for r in map(json.loads, open(os.path.join(DATA, "instances.jsonl"), encoding="utf-8"))}
    for s in schemas:
        s.update(valid=instances[s["id"]]["valid"], invalid=instances[s["id"]]["invalid"])
    return schemas


def fast_subset(rows):
    return [r for i, r in enumerate(rows) if r["source"] == "handwritten" or i % FAST_STRIDE == 0]


def selected(rows):
    return rows if os.environ.get("TINYLLM_GRAMMAR_SCHEMAS") == "all" else fast_subset(rows)


def feed(grammar, tokens, check_mask=False):
    """None when the grammar accepts `tokens` then end of text (every accept succeeds, end of text is allowed at
    the end), else where it stopped: (token index or 'eot', the message); a matcher that raises anything but
    accept's ValueError: ('raised', the error)."""
    m = grammar.matcher()
    try:
        for i, t in enumerate(tokens):
            if check_mask and not m.allowed()[t]:
                return i, f"allowed()[{t}] is False, token {TOK.decode_single_token_bytes(t)!r}"
            try:
                m.accept(t)
            except ValueError as e:
                return i, str(e)[:200]
        if not m.allowed()[TOK.eot_token]:
            return "eot", "end of text not allowed at the end"
        m.accept(TOK.eot_token)
        return None if m.is_terminated() else ("eot", "not terminated after end of text")
    except Exception as e:  # noqa: BLE001  a bug, counted apart
        return "raised", f"{type(e).__name__}: {str(e)[:200]}"


def reason_of(e):
    """What a compile error is about: the keyword it says is not supported, `format X`, a non-integer bound, else
    the first keyword it quotes, else the first of KEYWORDS it names (not a word such as "not"; before any list of
    the supported ones), else its message, numbers as N."""
    msg = str(e).split("(supported")[0]
    m = re.search(r"keyword '([^']*)'", msg)
    if m:
        return m.group(1)
    m = re.search(r"format '([^']*)'", msg)
    if m:
        return f"format {m.group(1)}"
    if re.search(r"bound \S+ at \S+ is not an integer", msg):
        return "non-integer bound on a number"
    m = re.match(r"json_schema: (\S+ with \S+) at ", msg)
    if m:
        return m.group(1)
    for what in ("oneOf", "allOf", "too large", "language is empty", "cannot be resolved", "leads back to itself"):
        if what in msg:
            return {"oneOf": "oneOf whose branches may overlap", "allOf": "allOf merging the same keyword twice",
                    "language is empty": "no document validates"}.get(what, what)
    for q in re.findall(r"'([$\w-]+)'", msg):
        if q in KEYWORDS:
            return q
    for k in KEYWORDS:
        if k not in ("not", "if", "then", "else", "type", "items", "format") and \
                re.search(rf"(?<![\w$]){re.escape(k)}(?!\w)", msg):
            return k
    return re.sub(r"\d+(\.\d+)?", "N", msg)[:80]


def sweep(rows, compile_fn=None, check_mask=True):
    """Compile each schema and feed its instances: a dict of results per schema id
    {source, compiled, reason, crash, seconds, valid: n, valid_ok: n, invalid: n, invalid_ok (accepted): n,
     failures: [(kind, instance text, detail)]}."""
    if compile_fn is None:
        import tinyllm.grammar
        compile_fn = tinyllm.grammar.compile
    out = {}
    for row in rows:
        r = out[row["id"]] = dict(source=row["source"], compiled=False, reason=None, crash=None, seconds=0.0,
                                  valid=len(row["valid"]), valid_ok=0, invalid=len(row["invalid"]), invalid_ok=0,
                                  failures=[])
        t0 = time.perf_counter()
        try:
            g = compile_fn(TOK, json_schema=row["schema"])
        except (ValueError, NotImplementedError) as e:
            r["reason"], r["message"] = reason_of(e), str(e)[:300]
            continue
        except Exception as e:  # noqa: BLE001  any other error is a bug: counted apart
            r["crash"] = f"{type(e).__name__}: {str(e)[:200]}"
            continue
        finally:
            r["seconds"] = time.perf_counter() - t0
        r["compiled"] = True
        for text in row["valid"]:
            data = text.encode()
            bad = feed(g, TOK.bytewise(data)) or feed(g, TOK.greedy(data), check_mask)
            if bad is None:
                r["valid_ok"] += 1
            else:
                r["failures"].append(("matcher raised" if bad[0] == "raised" else "valid rejected", text, bad))
        for inv in row["invalid"]:
            data = inv["text"].encode()
            bad = [feed(g, TOK.bytewise(data)), feed(g, TOK.greedy(data))]
            if bad[0] is None or bad[1] is None:
                r["invalid_ok"] += 1
                kind = "invalid accepted" + (" (greedy tokens only)" if bad[0] is not None else "")
                r["failures"].append((kind, inv["text"], inv["why"]))
            for b in bad:
                if b is not None and b[0] == "raised":
                    r["failures"].append(("matcher raised", inv["text"], b))
                    break
        r["seconds"] = time.perf_counter() - t0
    return out


def table(results):
    """Rows of counts by source, then the total: [(source, schemas, compiled, valid ok/valid, invalid accepted/
    invalid)], for the compiled schemas' instances."""
    by = collections.defaultdict(lambda: [0, 0, 0, 0, 0, 0])
    for r in results.values():
        for key in (r["source"], "total"):
            c = by[key]
            c[0] += 1
            if r["compiled"]:
                c[1] += 1
                c[2] += r["valid_ok"]
                c[3] += r["valid"]
                c[4] += r["invalid_ok"]
                c[5] += r["invalid"]
    return [(k, *by[k]) for k in sorted(by, key=lambda k: (k == "total", k))]


def not_compiled(results):
    return collections.Counter(r["reason"] or "crash: " + r["crash"].split(":")[0]
                               for r in results.values() if not r["compiled"])


# ---- the data: in step with its schemas, every instance what it says it is ----
class Number(str):
    """A number as it was written."""


def compact(x):
    """x as compact JSON, not ASCII-escaped, each Number as it was written."""
    if isinstance(x, Number):
        return str(x)
    if isinstance(x, dict):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + compact(v) for k, v in x.items()) + "}"
    if isinstance(x, list):
        return "[" + ",".join(map(compact, x)) + "]"
    return json.dumps(x, ensure_ascii=False)


def test_corpus_is_consistent():
    import jsonschema

    rows = load()
    assert 300 <= len(rows), len(rows)
    assert sum(os.path.getsize(os.path.join(DATA, f)) for f in os.listdir(DATA)) < 2 ** 21
    assert sum(len(r["valid"]) for r in rows) >= 3 * len(rows)
    for r in selected(rows):
        cls = jsonschema.validators.validator_for(r["schema"], default=jsonschema.Draft202012Validator)
        v = cls(r["schema"], format_checker=cls.FORMAT_CHECKER)
        for text in r["valid"]:
            assert v.is_valid(json.loads(text)), (r["id"], text)
            assert text == compact(json.loads(text, parse_float=Number, parse_int=Number)), (r["id"], text)
        for inv in r["invalid"]:
            assert not v.is_valid(json.loads(inv["text"])), (r["id"], inv)


class OracleGrammar:
    """A stand-in for a compiled JSON-schema grammar, for the harness's own test: takes any bytes, allows end of
    text when they are JSON valid under the schema (jsonschema), everything else always."""

    def __init__(self, schema):
        import jsonschema

        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        self.validator = cls(schema, format_checker=cls.FORMAT_CHECKER)

    def matcher(self):
        grammar, buf = self, bytearray()

        class M:
            done = False

            def allowed(self):
                a = np.ones(TOK.n_vocab, bool)
                try:
                    a[TOK.eot_token] = grammar.validator.is_valid(json.loads(buf.decode()))
                except ValueError:
                    a[TOK.eot_token] = False
                return a

            def accept(self, t):
                if t == TOK.eot_token:
                    if not self.allowed()[t]:
                        raise ValueError("end of text refused")
                    self.done = True
                else:
                    buf.extend(TOK.decode_single_token_bytes(t))

            def is_terminated(self):
                return self.done

        return M()


def test_harness_with_an_oracle_grammar():
    """The sweep itself, with a grammar that is right by construction: all valid accepted, no invalid; a
    NotImplementedError counted by the keyword it names."""
    rows = fast_subset(load())[::3]

    def compile_fn(tok, json_schema):
        if isinstance(json_schema, dict) and "uniqueItems" in json.dumps(json_schema):
            raise NotImplementedError("json_schema: 'uniqueItems' is not supported")
        return OracleGrammar(json_schema)

    results = sweep(rows, compile_fn, check_mask=False)
    assert all(r["valid_ok"] == r["valid"] and r["invalid_ok"] == 0 for r in results.values() if r["compiled"])
    assert set(not_compiled(results)) <= {"uniqueItems"}
    assert TOK.greedy('{"name":"é中文😀"}'.encode()) != TOK.bytewise('{"name":"é中文😀"}'.encode())
    assert b"".join(map(TOK.decode_single_token_bytes, TOK.greedy('[{"a":null}]'.encode()))) == b'[{"a":null}]'


# ---- the grammar ----
def grammar_built():
    try:
        import tinyllm.grammar

        tinyllm.grammar.compile(TOK, json_schema={"type": "integer"})
        return True
    except NotImplementedError:
        return False


needs_grammar = pytest.mark.skipif(not grammar_built(), reason="tinyllm.grammar.compile(json_schema=) not built")


@pytest.fixture(scope="module")
def results():
    return sweep(selected(load()))


def failures(results, kind):
    return [(sid, text, detail) for sid, r in results.items() for k, text, detail in r["failures"]
            if k.startswith(kind)]


@needs_grammar
def test_schemas_compile(results):
    crashes = {sid: r["crash"] for sid, r in results.items() if r["crash"]}
    assert not crashes, f"compile raised something other than ValueError/NotImplementedError: {crashes}"
    compiled = sum(r["compiled"] for r in results.values())
    assert compiled >= MIN_COMPILED * len(results), (compiled, len(results), not_compiled(results))


@needs_grammar
def test_valid_instances_accepted(results):
    bad = failures(results, "valid rejected")
    assert not bad, f"{len(bad)} valid instances rejected, e.g. {bad[:5]}"


@needs_grammar
def test_matchers_do_not_raise(results):
    bad = failures(results, "matcher raised")
    assert not bad, f"{len(bad)} instances made the matcher raise (not accept's ValueError), e.g. {bad[:5]}"


@needs_grammar
def test_invalid_instances_rejected(results):
    bad = failures(results, "invalid accepted")
    assert not bad, f"{len(bad)} invalid instances accepted, e.g. {bad[:5]}"
