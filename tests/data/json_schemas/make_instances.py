"""Writes instances.jsonl: for each schema of schemas.jsonl, valid instances (drawn by hypothesis-jsonschema from
a fixed seed; for the JSON-Schema-Test-Suite also its own) and invalid ones (valid ones mutated: a required key
dropped, a wrong type, a number out of range, a string breaking its pattern, format, enum or length, an extra key
where additionalProperties is false, too many or too few items...), each checked with jsonschema (the schema's
$schema draft, Draft202012Validator without one, with that draft's FORMAT_CHECKER: FormatChecker() checks
"time" as draft 3 did, HH:MM:SS without an offset). Deterministic for the same versions of
hypothesis, hypothesis-jsonschema and jsonschema (README.md names them).

    python tests/data/json_schemas/make_instances.py [--per-schema 5] [--only ID-SUBSTRING]

Instances are written as the grammar's output is: compact JSON (no whitespace), not ASCII-escaped, an object's keys
in the order of its schema's `properties` (those of its $ref, allOf and the chosen anyOf/oneOf branch following),
then its other keys as they were; a float with an integral value written as an integer (the same JSON Schema value:
1.0 is an integer), an object or array equal to a const or enum value in that value's order, a float where the
schema sets numeric bounds without an exponent (the grammar writes bounded numbers so; 1e-05 as 0.00001). The
required names an object's `properties` do not list come after those listed, before its other keys (as the grammar
writes them). A $ref's properties come before those of the schema beside it (the grammar merges the two in that
order).

Each line: {"id", "valid": [text...], "invalid": [{"text", "why"}...], "note"?: why a schema has no drawn instances}."""
import argparse
import copy
import decimal
import json
import os
import random
import signal
import sys
import warnings

import jsonschema
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema
from referencing import Registry
from referencing.jsonschema import DRAFT202012, specification_with

HERE = os.path.dirname(os.path.abspath(__file__))
MAX_TEXT = 1000  # longer instances are left out (the corpus stays small, the test quick)
DRAW_SECONDS = 20


class Schema:
    """A schema with its validator and $ref resolver."""

    def __init__(self, schema):
        self.schema = schema
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        self.validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
        self.draft2020 = cls is jsonschema.Draft202012Validator
        if isinstance(schema, dict):
            spec = specification_with(schema.get("$schema", ""), default=DRAFT202012)
        else:
            spec = DRAFT202012
        self.spec = spec
        resource = spec.create_resource(schema)
        uri = resource.id() or "urn:tinyllm:root"
        self.resolver = Registry().with_resource(uri, resource).resolver(base_uri=uri)

    def valid(self, x):
        return self.validator.is_valid(x)

    def valid_under(self, sub, resolver, x):
        try:
            return self.validator.evolve(schema=sub, _resolver=resolver).is_valid(x)
        except Exception:  # noqa: BLE001  a subschema the validator cannot take alone
            return False

    def expand(self, subs, x, depth=0):
        """The subschemas that apply to instance x at a place where `subs` ([(schema, resolver)]) do: the target of
        each one's $ref, the schema itself, its allOf branches, the first anyOf/oneOf branch x is valid under (else
        the first of x's JSON type), then or else of an if. Dict schemas only, in that order, without repeats."""
        out = []
        for sub, res in subs:
            if not isinstance(sub, dict) or depth > 30:
                continue
            if "$id" in sub and isinstance(sub["$id"], str):
                res = res.in_subresource(self.spec.create_resource(sub))
            if isinstance(sub.get("$ref"), str):
                try:
                    r = res.lookup(sub["$ref"])
                    out += self.expand([(r.contents, r.resolver)], x, depth + 1)
                except Exception:  # noqa: BLE001  an unresolvable ref: nothing to follow
                    pass
            out.append((sub, res))
            for b in sub.get("allOf", []) if isinstance(sub.get("allOf"), list) else []:
                out += self.expand([(b, res)], x, depth + 1)
            for key in ("anyOf", "oneOf"):
                branches = sub.get(key)
                if isinstance(branches, list) and branches:
                    pick = next((b for b in branches if self.valid_under(b, res, x)), None)
                    if pick is None:
                        pick = next((b for b in branches if type_fits(b, x)), branches[0])
                    out += self.expand([(pick, res)], x, depth + 1)
            if "if" in sub and ("then" in sub or "else" in sub):
                branch = sub.get("then") if self.valid_under(sub["if"], res, x) else sub.get("else")
                if branch is not None:
                    out += self.expand([(branch, res)], x, depth + 1)
        seen, unique = set(), []
        for s, r in out:
            if id(s) not in seen:
                seen.add(id(s))
                unique.append((s, r))
        return unique

    def children(self, subs, x):
        """[(key or index, value, the subschemas that apply to it)] for an object or array x."""
        out = []
        if isinstance(x, dict):
            for k, v in x.items():
                cs = []
                for s, r in subs:
                    if isinstance(s.get("properties"), dict) and k in s["properties"]:
                        cs.append((s["properties"][k], r))
                    elif isinstance(s.get("additionalProperties"), dict):
                        cs.append((s["additionalProperties"], r))
                out.append((k, v, cs))
        elif isinstance(x, list):
            for i, v in enumerate(x):
                cs = []
                for s, r in subs:
                    if self.draft2020:
                        prefix, rest = s.get("prefixItems"), s.get("items")
                    elif isinstance(s.get("items"), list):  # draft 7 and before: items as a list, a tuple
                        prefix, rest = s["items"], s.get("additionalItems")
                    else:
                        prefix, rest = None, s.get("items")
                    if isinstance(prefix, list) and i < len(prefix):
                        cs.append((prefix[i], r))
                    elif isinstance(rest, dict):
                        cs.append((rest, r))
                out.append((i, v, cs))
        return out

    def root(self):
        return [(self.schema, self.resolver)]

    def ordered(self, x, subs=None):
        """x with each object's keys in grammar order (see the module's docstring), integral floats as ints,
        floats under numeric bounds as Positional."""
        subs = self.expand(self.root() if subs is None else subs, x)
        if isinstance(x, float) and x.is_integer():
            return int(x)
        for s, _ in subs:  # an object or array equal to a const/enum value: in that value's order
            for v in ([s["const"]] if "const" in s else []) + (s["enum"] if isinstance(s.get("enum"), list) else []):
                if isinstance(x, (dict, list)) and type(v) is type(x) and v == x:
                    return follow(x, v)
        if isinstance(x, float) and any(k in s for s, _ in subs for k in BOUNDS):
            return Positional(x)
        if isinstance(x, list):
            return [self.ordered(v, cs) for _, v, cs in self.children(subs, x)]
        if isinstance(x, dict):
            order = []
            for key in ("properties", "required"):
                for s, _ in subs:
                    names = s.get(key)
                    for k in names if isinstance(names, (dict, list)) else ():
                        if isinstance(k, str) and k in x and k not in order:
                            order.append(k)
            order += [k for k in x if k not in order]
            kids = {k: self.ordered(v, cs) for k, v, cs in self.children(subs, x)}
            return {k: kids[k] for k in order}
        return x

    def text(self, x):
        return dumps(self.ordered(x))


def follow(x, v):
    """x (equal to v) with its objects' keys in v's order."""
    if isinstance(x, dict):
        return {k: follow(x[k], v[k]) for k in v}
    if isinstance(x, list):
        return [follow(a, b) for a, b in zip(x, v)]
    return int(x) if isinstance(x, float) and x.is_integer() else x


BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


class Positional(float):
    """A float written without an exponent (the grammar writes numbers with bounds so)."""


def dumps(x):
    """json.dumps(x, separators=(",", ":"), ensure_ascii=False), a Positional float without an exponent."""
    if isinstance(x, Positional):
        return format(decimal.Decimal(repr(float(x))), "f")
    if isinstance(x, dict):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + dumps(v) for k, v in x.items()) + "}"
    if isinstance(x, list):
        return "[" + ",".join(map(dumps, x)) + "]"
    return json.dumps(x, ensure_ascii=False)


def type_fits(schema, x):
    if not isinstance(schema, dict) or "type" not in schema:
        return True
    ts = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    kind = json_type(x)
    return kind in ts or kind == "integer" and "number" in ts


def json_type(x):
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "boolean"
    if isinstance(x, int) or isinstance(x, float) and x.is_integer():
        return "integer"
    if isinstance(x, float):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(x)]


# ---- valid instances ----
class Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise Timeout()


def draw_valid(make_schema, n):
    """Up to n values hypothesis-jsonschema draws from make_schema() (called within the time limit), from a fixed
    seed; [] and a reason when it can't."""
    out = []
    signal.signal(signal.SIGALRM, _alarm)
    # again each second after the first DRAW_SECONDS: an exception raised in a gc callback is ignored
    signal.setitimer(signal.ITIMER_REAL, DRAW_SECONDS, 1.0)
    try:
        strategy = from_schema(make_schema(), custom_formats={"uuid": st.uuids().map(str)})  # it has no uuid

        @settings(max_examples=n, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(strategy)
        def collect(x):
            out.append(x)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            collect()
    except Timeout:
        if not out:
            return [], "hypothesis-jsonschema: took too long"
    except Exception as e:  # noqa: BLE001
        if not out:
            return [], f"hypothesis-jsonschema: {type(e).__name__}: {str(e)[:150]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return out, None


LITERAL = {"enum", "const", "required", "examples", "default", "dependentRequired", "$comment"}
SCHEMA_MAPS = {"properties", "patternProperties", "dependentSchemas"}


def inline_refs(sch, depth_limit=3):
    """sch's schema with its $refs replaced by what they point to (a chain of more than depth_limit by {}, any
    value: drawn values are checked afterwards), prefixItems written as draft 7's items, for hypothesis-jsonschema,
    which cannot draw from recursive references nor read prefixItems."""
    def walk(node, res, depth):
        if isinstance(node, list):
            return [walk(v, res, depth) for v in node]
        if not isinstance(node, dict):
            return node
        if isinstance(node.get("$id"), str):
            res = res.in_subresource(sch.spec.create_resource(node))
        out = {}
        for k, v in node.items():
            if k in ("$defs", "definitions", "$id", "$anchor", "$ref"):
                continue
            if k in LITERAL:
                out[k] = v
            elif k in SCHEMA_MAPS and isinstance(v, dict):
                out[k] = {a: walk(b, res, depth) for a, b in v.items()}
            else:
                out[k] = walk(v, res, depth)
        if sch.draft2020 and isinstance(node.get("prefixItems"), list):  # hypothesis-jsonschema reads draft 7's
            out["items"], out["additionalItems"] = out.pop("prefixItems"), out.get("items", True)
        if isinstance(node.get("$ref"), str):
            target = {}
            if depth < depth_limit:
                try:
                    r = sch.resolver.lookup(node["$ref"]) if node["$ref"].startswith("#") else res.lookup(
                        node["$ref"])
                    target = walk(r.contents, r.resolver, depth + 1)
                except Exception:  # noqa: BLE001
                    pass
            if not [k for k in out if k not in ("$schema", "description", "title")]:
                return target
            out["allOf"] = out.get("allOf", []) + [target]
        return out

    out = walk(sch.schema, sch.resolver, 0)
    if sch.draft2020 and isinstance(out, dict):
        out["$schema"] = "http://json-schema.org/draft-07/schema#"
    return out


def spread(items, k):
    """k items spread evenly over `items` (hypothesis draws simple values first, richer ones later)."""
    if len(items) <= k:
        return list(items)
    return [items[round(i * (len(items) - 1) / (k - 1))] for i in range(k)] if k > 1 else [items[-1]]


# ---- invalid instances: mutations of valid ones ----
OTHER_TYPES = [None, True, 0, 1.5, "x", [], {}]


def places(sch, x, path=(), subs=None):
    """(path, value, subschemas) for every place in x."""
    subs = sch.expand(sch.root() if subs is None else subs, x)
    yield path, x, subs
    for k, v, cs in sch.children(subs, x):
        yield from places(sch, v, path + (k,), cs)


def replace(x, path, new):
    if not path:
        return new
    if isinstance(x, dict):
        return {k: (replace(v, path[1:], new) if k == path[0] else v) for k, v in x.items()}
    return [replace(v, path[1:], new) if i == path[0] else v for i, v in enumerate(x)]


def mutants(sch, x):
    """(why, mutated x) candidates; not all invalid (the caller checks)."""
    for path, v, subs in places(sch, x):
        where = "/" + "/".join(map(str, path))
        for t in OTHER_TYPES:
            if json_type(t) != json_type(v) and not (isinstance(v, (int, float)) and isinstance(t, (int, float))):
                yield f"wrong type {json_type(t)} at {where}", replace(x, path, t)
        for s, _ in subs:
            if isinstance(v, dict):
                for k in s.get("required", []) if isinstance(s.get("required"), list) else []:
                    if k in v:
                        yield f"required {k!r} dropped at {where}", replace(x, path, {
                            a: b for a, b in v.items() if a != k})
                if s.get("additionalProperties") is False or "additionalProperties" in s and isinstance(
                        s["additionalProperties"], dict):
                    yield f"extra property at {where}", replace(x, path, {**v, "zz_extra": [1]})
            if isinstance(v, list):
                if isinstance(s.get("maxItems"), int):
                    extra = (v or [None]) * (s["maxItems"] + 1)
                    yield f"more than maxItems at {where}", replace(x, path, extra[:s["maxItems"] + 1])
                if isinstance(s.get("minItems"), int) and s["minItems"] > 0:
                    yield f"fewer than minItems at {where}", replace(x, path, v[:s["minItems"] - 1])
                if s.get("items") is False or isinstance(s.get("prefixItems"), list):
                    yield f"extra item at {where}", replace(x, path, v + ["zz_extra"])
            if isinstance(v, str):
                if "enum" in s:
                    yield f"string not in enum at {where}", replace(x, path, v + "_x")
                if "pattern" in s:
                    yield f"string breaking pattern at {where}", replace(x, path, "!" + v + " ~")
                    yield f"string breaking pattern at {where}", replace(x, path, "")
                if "format" in s:
                    yield f"string breaking format {s['format']} at {where}", replace(x, path, v + "x!")
                    yield f"string breaking format {s['format']} at {where}", replace(x, path, "not a " + str(
                        s["format"]))
                if isinstance(s.get("maxLength"), int):
                    yield f"longer than maxLength at {where}", replace(x, path, v + "a" * (s["maxLength"] + 1))
                if isinstance(s.get("minLength"), int) and s["minLength"] > 0:
                    yield f"shorter than minLength at {where}", replace(x, path, v[:s["minLength"] - 1])
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                for key, delta in (("minimum", -1), ("maximum", 1), ("exclusiveMinimum", 0),
                                   ("exclusiveMaximum", 0)):
                    bound = s.get(key)
                    if isinstance(bound, (int, float)) and not isinstance(bound, bool):
                        yield f"{key} broken at {where}", replace(x, path, bound + delta)
                if s.get("type") == "integer":
                    yield f"fraction for integer at {where}", replace(x, path, v + 0.5)
            if "const" in s or "enum" in s:
                yield f"not the const/enum at {where}", replace(x, path, "zz_other")


def pick_invalid(sch, valid_values, k, rng):
    by_kind, seen = {}, set()
    for v in valid_values:
        for why, m in mutants(sch, v):
            try:
                if sch.valid(m):
                    continue
                text = sch.text(m)
            except Exception:  # noqa: BLE001  (a regex Python's re cannot compile, a recursion too deep...)
                continue
            if text in seen or len(text) > MAX_TEXT:
                continue
            seen.add(text)
            by_kind.setdefault(why.split(" at ")[0], []).append({"text": text, "why": why})
    out, kinds = [], sorted(by_kind)
    rng.shuffle(kinds)
    while len(out) < k and kinds:
        for kind in list(kinds):
            if len(out) == k:
                break
            options = by_kind[kind]
            out.append(options.pop(rng.randrange(len(options))))
            if not options:
                kinds.remove(kind)
    return out


def instances(row, per_schema):
    rng = random.Random(row["id"])
    try:
        sch = Schema(row["schema"])
        sch.valid(None)
    except Exception as e:  # noqa: BLE001
        return {"id": row["id"], "valid": [], "invalid": [], "note": f"jsonschema: {type(e).__name__}: {e}"[:200]}
    valid, invalid, note = [], [], None
    for t in row.get("tests", []):  # the test suite's own instances, where jsonschema agrees
        try:
            ok = sch.valid(t["data"])
            text = sch.text(t["data"])
        except Exception:  # noqa: BLE001
            continue
        if ok != t["valid"]:  # jsonschema's format checks are looser than the suite (email: an "@" in it)
            continue
        if ok and text not in valid:
            valid.append(text)
        elif not ok and text not in {i["text"] for i in invalid}:
            invalid.append({"text": text, "why": "suite: " + t["description"]})
    def usable(drawn):
        good = []
        for x in drawn:
            try:
                if sch.valid(x):
                    text = sch.text(x)
                    if len(text) <= MAX_TEXT and text not in good:
                        good.append(text)
            except Exception:  # noqa: BLE001
                pass
        return good

    drawn, note = draw_valid(lambda: copy.deepcopy(row["schema"]), 60)  # (from_schema rewrites its schema)
    good = usable(drawn)
    if not good:  # recursive references, prefixItems, ...
        drawn, _ = draw_valid(lambda: inline_refs(sch), 60)
        good = usable(drawn)
    if not good and note is None:
        note = "hypothesis-jsonschema: no value it drew is valid"
    chosen = spread(good, per_schema)
    valid += [t for t in chosen if t not in valid]
    values = [json.loads(t) for t in valid]
    invalid += [m for m in pick_invalid(sch, values, per_schema, rng) if m["text"] not in
                {i["text"] for i in invalid}]
    out = {"id": row["id"], "valid": valid, "invalid": invalid}
    if note and not good:
        out["note"] = note
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-schema", type=int, default=5)
    ap.add_argument("--only", help="only the schemas whose id contains this (prints them, writes nothing)")
    args = ap.parse_args()
    sys.setrecursionlimit(10000)
    rows = [json.loads(line) for line in open(os.path.join(HERE, "schemas.jsonl"), encoding="utf-8")]
    if args.only:
        for row in rows:
            if args.only in row["id"]:
                print(json.dumps(instances(row, args.per_schema), ensure_ascii=False, indent=1))
        return
    with open(os.path.join(HERE, "instances.jsonl"), "w", encoding="utf-8") as f:
        for i, row in enumerate(rows):
            out = instances(row, args.per_schema)
            f.write(json.dumps(out, ensure_ascii=False, separators=(",", ":")) + "\n")
            print(f"{i + 1}/{len(rows)} {row['id']}: {len(out['valid'])} valid, {len(out['invalid'])} invalid"
                  + (f" ({out['note']})" if "note" in out else ""), flush=True)


if __name__ == "__main__":
    main()
