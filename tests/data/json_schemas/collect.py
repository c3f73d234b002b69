"""Builds schemas.jsonl, the schema corpus of tests/test_grammar_schemas.py (issue 45: JSON schemas for constrained
decoding), from the PyPI packages named in README.md, unpacked, plus handwritten.json and schemas drawn here from a
fixed seed. Deterministic: the same package versions give the same file.

    pip download check-jsonschema==0.39.0 nbformat==5.11.1 --no-deps -d /tmp/dl
    pip download jsonschema==4.26.0 --no-deps --no-binary :all: -d /tmp/dl      # the sdist holds the test suite
    (cd /tmp/dl && python -m zipfile -e check_jsonschema-0.39.0-py3-none-any.whl cj &&
     python -m zipfile -e nbformat-5.11.1-py3-none-any.whl nbf && tar xzf jsonschema-4.26.0.tar.gz)
    python tests/data/json_schemas/collect.py --check-jsonschema /tmp/dl/cj --nbformat /tmp/dl/nbf \\
        --jsonschema-sdist /tmp/dl/jsonschema-4.26.0
    python tests/data/json_schemas/make_instances.py          # then the instances

Each line of schemas.jsonl: {"id", "source", "license", "schema"}, and for the JSON-Schema-Test-Suite's schemas
"tests": its own [{"data", "valid"}] (make_instances.py checks them again with jsonschema)."""
import argparse
import copy
import json
import os
import random
import re

HERE = os.path.dirname(os.path.abspath(__file__))

# the JSON-Schema-Test-Suite (draft 2020-12): every group of the files of keywords a grammar can express, the first
# groups of the files of keywords it may not (those count as "did not compile"); remote refs, $dynamicRef and
# vocabularies left out (they need documents from the network)
SUITE_ALL = ["type", "properties", "required", "additionalProperties", "enum", "const", "items", "prefixItems",
             "minItems", "maxItems", "minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum",
             "exclusiveMaximum", "anyOf", "oneOf", "allOf", "ref", "defs", "boolean_schema", "default",
             "infinite-loop-detection", "optional/format/date", "optional/format/time", "optional/format/date-time",
             "optional/format/email", "optional/format/uuid"]
SUITE_SOME = ["not", "contains", "multipleOf", "uniqueItems", "if-then-else", "dependentRequired",
              "dependentSchemas", "patternProperties", "propertyNames", "minProperties", "maxProperties",
              "unevaluatedProperties", "unevaluatedItems", "optional/format/ipv4", "optional/format/hostname",
              "optional/format/duration"]

# SchemaStore schemas vendored by check-jsonschema: (file, license file) for the permissively licensed ones
# (renovate: AGPL, snapcraft: GPL, citation-file-format: CC-BY: left out)
SCHEMASTORE = {
    "azure-pipelines": "LICENSE.azure-pipelines", "bamboo-spec": "LICENSE.schemastore",
    "bitbucket-pipelines": "LICENSE.bitbucket-pipelines", "buildkite": "LICENSE.buildkite",
    "changie": "LICENSE.changie", "circle-ci": "LICENSE.schemastore", "cloudbuild": "LICENSE.schemastore",
    "codecov": "LICENSE.schemastore", "compose-spec": "LICENSE.compose-spec", "dependabot": "LICENSE.schemastore",
    "drone-ci": "LICENSE.schemastore", "github-actions": "LICENSE.schemastore",
    "github-discussion": "LICENSE.schemastore", "github-issue-config": "LICENSE.schemastore",
    "github-issue-forms": "LICENSE.schemastore", "github-workflows": "LICENSE.schemastore",
    "gitlab-ci": "LICENSE.gitlab", "meltano": "LICENSE.meltano", "mergify": "LICENSE.schemastore",
    "readthedocs": "LICENSE.readthedocs", "taskfile": "LICENSE.task", "travis": "LICENSE.schemastore",
    "woodpecker-ci": "LICENSE.schemastore"}
WHOLE_MAX = 30_000  # a whole SchemaStore schema goes in when its compact JSON is at most this long
PART_MAX = 12_000  # a definition (with the definitions it refers to) at most this long
PARTS_PER_SCHEMA = 9


def compact(x):
    return json.dumps(x, separators=(",", ":"), ensure_ascii=False)


def refs_in(x):
    if isinstance(x, dict):
        for k, v in x.items():
            if k == "$ref" and isinstance(v, str):
                yield v
            else:
                yield from refs_in(v)
    elif isinstance(x, list):
        for v in x:
            yield from refs_in(v)


def standalone(root, name, defs_key):
    """Definition `name` of `root` as a schema of its own: the definition, the definitions it refers to (all
    local refs must be #/<defs_key>/...), the root's $schema. None when it refers elsewhere."""
    defs = root[defs_key]
    need, todo = set(), [name]
    while todo:
        n = todo.pop()
        if n in need:
            continue
        need.add(n)
        for r in refs_in(defs[n]):
            m = re.fullmatch(rf"#/{re.escape(defs_key)}/([^/]+)", r)
            if not m or m.group(1) not in defs:
                return None
            todo.append(m.group(1))
    body = defs[name]
    if not isinstance(body, dict) or defs_key in body or "$ref" in body and len(body) == 1:
        return None
    out = {"$schema": root["$schema"]} if "$schema" in root else {}
    out.update(body)
    others = sorted(need - {name}) + ([name] if any(r == f"#/{defs_key}/{name}" for r in refs_in(body)) else [])
    if others:
        out[defs_key] = {n: defs[n] for n in others}
    return out


def interesting(s):
    """Worth a place: an object or array with something in it, not just a string or a bare union of refs."""
    text = compact(s)
    return ('"properties"' in text or '"items"' in text) and len(text) > 150


def schemastore(vendor, rng):
    for name, lic in SCHEMASTORE.items():
        root = json.load(open(os.path.join(vendor, name + ".json"), encoding="utf-8"))
        if len(compact(root)) <= WHOLE_MAX:
            yield f"schemastore/{name}", root, lic
        defs_key = "$defs" if "$defs" in root else "definitions"
        parts = []
        for d in sorted(root.get(defs_key, {})):
            s = standalone(root, d, defs_key)
            if s is not None and interesting(s) and len(compact(s)) <= PART_MAX:
                parts.append((d, s))
        for d, s in sorted(rng.sample(parts, min(PARTS_PER_SCHEMA, len(parts)))):
            yield f"schemastore/{name}#{d}", s, lic


def nbformat(path):
    root = json.load(open(os.path.join(path, "nbformat", "v4", "nbformat.v4.5.schema.json"), encoding="utf-8"))
    yield "nbformat/v4.5", root, "LICENSE.nbformat"
    for d in sorted(root["definitions"]):
        s = standalone(root, d, "definitions")
        if s is not None and interesting(s):
            yield f"nbformat/v4.5#{d}", s, "LICENSE.nbformat"


def suite(sdist):
    base = os.path.join(sdist, "json", "tests", "draft2020-12")
    for names, limit in ((SUITE_ALL, None), (SUITE_SOME, 2)):
        for f in names:
            groups = json.load(open(os.path.join(base, f + ".json"), encoding="utf-8"))
            for i, g in enumerate(groups[:limit]):
                text = compact(g["schema"])
                if re.search(r'"\$ref":"(https?:|urn:|[^#"])', text) or "$dynamicRef" in text:
                    continue  # a document from elsewhere
                schema = g["schema"]
                if isinstance(schema, dict) and "$schema" not in schema:
                    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
                sid = f"suite/{f.replace('optional/format/', 'format-')}#{i}"
                tests = [{"data": t["data"], "valid": t["valid"], "description": g["description"] + ": " +
                          t["description"]} for t in g["tests"]]
                yield sid, schema, "LICENSE.JSON-Schema-Test-Suite", tests


# ---- schemas drawn from a seed, in the style of function-call argument and API record schemas ----
WORDS = ["user", "name", "id", "email", "status", "count", "items", "price", "tags", "created_at", "location",
         "query", "limit", "offset", "unit", "city", "country", "description", "title", "url", "enabled", "score",
         "priority", "date", "time", "amount", "currency", "language", "format", "options", "metadata", "owner",
         "version", "phone", "address", "zip", "level", "mode", "color", "size", "weight", "rating", "category"]
FORMATS = ["date", "time", "date-time", "email", "uuid"]
PATTERNS = [r"^[A-Z]{3}$", r"^[a-z][a-z0-9_]{2,15}$", r"^\d{5}(-\d{4})?$", r"^\+?[0-9]{7,12}$", r"^v\d+\.\d+\.\d+$",
            r"^#[0-9a-fA-F]{6}$", r"^[A-Z]{2}-\d{3,4}$"]


def draw(rng, depth, defs):
    r = rng.random()
    if depth > 2:
        r = r * 0.55
    if r < 0.14:
        s = {"type": "string"}
        k = rng.randrange(5)
        if k == 0:
            s["format"] = rng.choice(FORMATS)
        elif k == 1:
            s["pattern"] = rng.choice(PATTERNS)
        elif k == 2:
            s["minLength"] = rng.randint(0, 3)
            s["maxLength"] = s["minLength"] + rng.randint(1, 20)
        elif k == 3:
            s = {"type": "string", "enum": rng.sample(WORDS, rng.randint(2, 5))}
        return s
    if r < 0.24:
        s = {"type": "integer"}
        lo = rng.choice([None, 0, 1, -10, 18, 100])
        if lo is not None:
            s["exclusiveMinimum" if rng.random() < 0.2 else "minimum"] = lo
        if rng.random() < 0.6:
            s["exclusiveMaximum" if rng.random() < 0.2 else "maximum"] = (lo or 0) + rng.choice([1, 9, 100, 65535])
        return s
    if r < 0.31:
        s = {"type": "number"}
        if rng.random() < 0.5:
            s["minimum"], s["maximum"] = 0, rng.choice([1, 5, 100, 1e6])
        return s
    if r < 0.36:
        return {"type": "boolean"}
    if r < 0.40:
        return {"const": rng.choice(["v1", 1, True, "function"])}
    if r < 0.45:
        return {"type": [rng.choice(["string", "integer", "number"]), "null"]}
    if r < 0.55:
        return {"enum": rng.sample(["a", "b", 1, 2.5, None, True, "low", "high"], rng.randint(2, 4))}
    if r < 0.72:
        s = {"type": "array", "items": draw(rng, depth + 1, defs)}
        if rng.random() < 0.5:
            s["minItems"] = rng.randint(0, 2)
        if rng.random() < 0.5:
            s["maxItems"] = s.get("minItems", 0) + rng.randint(1, 4)
        if rng.random() < 0.15:
            s = {"type": "array", "prefixItems": [draw(rng, depth + 1, defs) for _ in range(rng.randint(1, 3))],
                 "items": False if rng.random() < 0.5 else draw(rng, depth + 1, defs)}
        return s
    if r < 0.80:
        return {rng.choice(["anyOf", "oneOf"]): [draw(rng, depth + 1, defs) for _ in range(rng.randint(2, 3))]}
    if r < 0.86 and depth > 0:
        name = rng.choice(["Item", "Address", "Person", "Tag", "Money", "Point"]) + str(len(defs))
        defs[name] = None
        defs[name] = draw_object(rng, depth + 1, defs)
        return {"$ref": f"#/$defs/{name}"}
    return draw_object(rng, depth + 1, defs)


def draw_object(rng, depth, defs):
    keys = rng.sample(WORDS, rng.randint(1, 6))
    s = {"type": "object", "properties": {k: draw(rng, depth, defs) for k in keys}}
    if rng.random() < 0.15:
        for k in keys:
            s["properties"][k]["description"] = f"The {k.replace('_', ' ')}."
    req = [k for k in keys if rng.random() < 0.6]
    if req:
        s["required"] = req
    a = rng.random()
    if a < 0.45:
        s["additionalProperties"] = False
    elif a < 0.55:
        s["additionalProperties"] = draw(rng, 3, defs)
    return s


def drawn(n, rng):
    for i in range(n):
        defs = {}
        s = draw_object(rng, 0, defs)
        if rng.random() < 0.1:  # a recursive one: a tree of nodes
            defs["Node"] = {"type": "object", "properties": {"value": draw(rng, 3, {}), "children": {
                "type": "array", "items": {"$ref": "#/$defs/Node"}, "maxItems": 3}}, "required": ["value"],
                "additionalProperties": False}
            s["properties"]["tree"] = {"$ref": "#/$defs/Node"}
        out = {"$schema": "https://json-schema.org/draft/2020-12/schema", **s}
        if defs:
            out["$defs"] = defs
        yield f"drawn/{i:03d}", out, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check-jsonschema", required=True, help="check-jsonschema's wheel, unpacked")
    ap.add_argument("--nbformat", required=True, help="nbformat's wheel, unpacked")
    ap.add_argument("--jsonschema-sdist", required=True, help="jsonschema's sdist, unpacked")
    ap.add_argument("--drawn", type=int, default=80)
    args = ap.parse_args()
    rows = []
    for sid, s, lic, tests in suite(args.jsonschema_sdist):
        rows.append({"id": sid, "source": "JSON-Schema-Test-Suite", "license": lic, "schema": s, "tests": tests})
    vendor = os.path.join(args.check_jsonschema, "check_jsonschema", "builtin_schemas", "vendor")
    for sid, s, lic in schemastore(vendor, random.Random(45)):
        rows.append({"id": sid, "source": "SchemaStore", "license": lic, "schema": s})
    for sid, s, lic in nbformat(args.nbformat):
        rows.append({"id": sid, "source": "nbformat", "license": lic, "schema": s})
    for entry in json.load(open(os.path.join(HERE, "handwritten.json"), encoding="utf-8")):
        rows.append({"id": "handwritten/" + entry["id"], "source": "handwritten", "license": None,
                     "schema": copy.deepcopy(entry["schema"])})
    for sid, s, lic in drawn(args.drawn, random.Random(45)):
        rows.append({"id": sid, "source": "drawn", "license": lic, "schema": s})
    with open(os.path.join(HERE, "schemas.jsonl"), "w", encoding="utf-8") as f:
        for r in rows:
            f.write(compact(r) + "\n")
    counts = {}
    for r in rows:
        counts[r["source"]] = counts.get(r["source"], 0) + 1
    print(len(rows), "schemas:", counts, os.path.getsize(os.path.join(HERE, "schemas.jsonl")), "bytes")


if __name__ == "__main__":
    main()
