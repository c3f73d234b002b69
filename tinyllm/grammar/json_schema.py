"""JSON Schema to a context-free grammar over the document's text (cfg.py), for constrained decoding.

The language is every JSON document the schema validates, written compactly (or, with `whitespace_flexible`, with
at most 64 whitespace bytes between tokens), with these conventions a generator needs:
- an object's members come in the order of the schema's `properties` (each optional one may be absent), then the
  `required` names it does not list, then any additional properties (allowed unless `additionalProperties` says
  otherwise, as JSON Schema says: write `"additionalProperties": false` to keep a model to the listed names);
- strings are accepted in every JSON spelling: raw characters (any Unicode), the short escapes and `\\uXXXX`
  (surrogate pairs past U+FFFF), each counting as one character for minLength/maxLength, inside `pattern`s (re
  syntax, searched as JSON Schema says), `format`s, `enum`s and member names alike;
- numbers with bounds are written without an exponent, and their bounds must be integers; integers without an
  exponent or fraction; an enum's or const's number in any decimal spelling of its value (2, 2.0, -0 for 0);
- `oneOf` is matched as `anyOf` where its branches cannot both validate a document: they differ in type, in their
  const/enum values, in the const/enum values of a property both require (a discriminator), or in a member one
  requires and the other's objects cannot have; other `oneOf`s are refused.
A validation keyword this module does not implement raises ValueError naming it and where it is; none is ignored.
Other keywords are annotations (title, description, default, examples, x-..., ...), ignored as validators do.
"""
import json

from . import nodes as N
from .json_text import (ANY_CHAR, FORMATS, format_ast, key_not_in, number_ast, number_literal, pattern_ast,
                        string_literal)

__all__ = ["schema_grammar"]

_KEYWORDS = {"type", "properties", "required", "additionalProperties", "enum", "const", "items", "prefixItems",
             "additionalItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format", "minimum",
             "maximum", "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf", "allOf", "$ref", "uniqueItems",
             "minProperties"}
# JSON Schema's validation keywords this module does not implement: each raises. Any other keyword is an
# annotation (title, description, default, examples, x-..., markdownDescription, ...), ignored as validators do.
_UNSUPPORTED = {"not", "if", "then", "else", "dependentSchemas", "dependentRequired", "dependencies",
                "patternProperties", "propertyNames", "unevaluatedProperties", "unevaluatedItems", "contains",
                "minContains", "maxContains", "multipleOf", "maxProperties", "$dynamicRef", "$recursiveRef"}
_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")

class _Compiler:
    def __init__(self, root, whitespace_flexible):
        self.root = root
        ws = N.rep(N.chars(((9, 10), (13, 13), (32, 32))), 0, 64) if whitespace_flexible else N.EMPTY
        self.ws = ws
        self.comma = N.cat(ws, N.lit(","), ws)
        self.colon = N.cat(ws, N.lit(":"), ws)
        self.rules = {}
        self.inlining = []                              # the $refs being copied in (inlined)

    # ---- $ref
    def resolve(self, pointer, where):
        if not isinstance(pointer, str) or not pointer.startswith("#"):
            raise ValueError(f"json_schema: $ref {pointer!r} at {where} cannot be resolved: only references inside "
                             "the schema ('#', '#/$defs/Name', a JSON pointer) are supported")
        node = self.root
        path = pointer[1:]
        if path and not path.startswith("/"):
            raise ValueError(f"json_schema: $ref {pointer!r} at {where} cannot be resolved: anchors are not "
                             "supported, use a JSON pointer ('#/$defs/Name')")
        from urllib.parse import unquote
        for part in path.split("/")[1:]:
            part = unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, dict) and part in node:
                node = node[part]
            else:
                raise ValueError(f"json_schema: $ref {pointer!r} at {where} cannot be resolved: no {part!r} in "
                                 "the schema")
        return node

    def deref(self, schema, where, pointers):
        """The schema with a top-level $ref followed (for merging), the pointers followed appended to `pointers`."""
        while isinstance(schema, dict) and "$ref" in schema:
            pointer = schema["$ref"]
            if pointer in pointers:
                raise ValueError(f"json_schema: $ref {pointer!r} at {where} refers to itself")
            pointers.append(pointer)
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            target = self.resolve(pointer, where)
            schema = self.merge(target, rest, where) if _validating(rest) else target
        return schema

    def inlined(self, schema, pointers, where):
        """value(schema) for a schema merged from the targets of `pointers`: copied in, so a pointer that leads
        back to itself while being copied would copy forever."""
        for pointer in pointers:
            if pointer in self.inlining:
                raise ValueError(f"json_schema: $ref {pointer!r} at {where} leads back to itself beside other "
                                 "keywords (allOf, or siblings of the $ref): such a recursion is not supported")
        self.inlining += pointers
        try:
            return self.value(schema, where)
        finally:
            del self.inlining[len(self.inlining) - len(pointers):]

    # ---- schemas
    def value(self, schema, where):
        if schema is True:
            return self.any_value()
        if schema is False:
            return N.NOTHING
        if not isinstance(schema, dict):
            raise TypeError(f"json_schema: a schema must be an object or a boolean, got {schema!r} at {where}")
        for key in schema:
            if key in _UNSUPPORTED:
                raise ValueError(f"json_schema: keyword {key!r} at {where} is not supported (supported: "
                                 f"{', '.join(sorted(_KEYWORDS))})")
        if not _validating(schema):
            return self.any_value()
        if "$ref" in schema:
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            if _validating(rest):
                pointers = []
                merged = self.merge(self.deref({"$ref": schema["$ref"]}, where, pointers), rest, where)
                return self.inlined(merged, pointers, where)
            return self.rule(schema["$ref"], where)
        if "allOf" in schema:
            merged, pointers = {k: v for k, v in schema.items() if k != "allOf"}, []
            for i, sub in enumerate(_list(schema, "allOf", where)):
                merged = self.merge(merged, self.deref(sub, f"{where}/allOf/{i}", pointers), f"{where}/allOf/{i}")
            return self.inlined(merged, pointers, where)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                rest = {k: v for k, v in schema.items() if k != key}
                branches = []
                for i, sub in enumerate(_list(schema, key, where)):
                    if not _validating(rest):           # (a bare $ref stays a rule: recursion through it works)
                        branches.append(self.value(sub, f"{where}/{key}/{i}"))
                        continue
                    pointers = []
                    merged = self.merge(rest, self.deref(sub, f"{where}/{key}/{i}", pointers), where)
                    branches.append(self.inlined(merged, pointers, f"{where}/{key}/{i}"))
                if key == "oneOf":
                    self.check_disjoint([self.merge(rest, self.deref(sub, where, []), where) for sub in schema[key]],
                                        where)
                return N.alt(*branches)
        if "const" in schema or "enum" in schema:
            return self.enum(schema, where)
        types = schema.get("type", list(_TYPES))
        types = [types] if isinstance(types, str) else types
        for t in types:
            if t not in _TYPES:
                raise ValueError(f"json_schema: type {t!r} at {where} is not a JSON Schema type ({', '.join(_TYPES)})")
        if "number" in types and "integer" in types:
            types = [t for t in types if t != "integer"]
        if schema.get("uniqueItems") not in (None, False):
            raise ValueError(f"json_schema: keyword 'uniqueItems': true at {where} is not supported")
        if _count(schema, "minProperties", where, 0):
            raise ValueError(f"json_schema: keyword 'minProperties' at {where} is not supported")
        out = []
        for t in _TYPES:
            if t not in types:
                continue
            if t == "null":
                out.append(N.lit("null"))
            elif t == "boolean":
                out += [N.lit("true"), N.lit("false")]
            elif t == "string":
                out.append(self.string(schema, where))
            elif t in ("number", "integer"):
                out.append(number_ast(*_bounds(schema, where), t == "integer", where))
            elif t == "object":
                out.append(self.object(schema, where))
            else:
                out.append(self.array(schema, where))
        return N.alt(*out) if out else N.NOTHING

    def rule(self, pointer, where):
        if pointer not in self.rules:
            self.rules[pointer] = N.NOTHING             # (placed first: a recursive $ref finds the rule)
            self.rules[pointer] = self.value(self.resolve(pointer, where), pointer)
        return N.ref(pointer)

    def any_value(self):
        if "$any" not in self.rules:
            self.rules["$any"] = N.NOTHING
            string = N.cat(N.lit('"'), N.rep(ANY_CHAR), N.lit('"'))
            member = N.cat(string, self.colon, N.ref("$any"))
            self.rules["$any"] = N.alt(
                N.cat(N.lit("{"), self.ws, N.opt(N.cat(member, N.rep(N.cat(self.comma, member)))), self.ws,
                      N.lit("}")),
                N.cat(N.lit("["), self.ws, N.opt(N.cat(N.ref("$any"), N.rep(N.cat(self.comma, N.ref("$any"))))),
                      self.ws, N.lit("]")),
                string, number_ast(None, False, None, False, False, "#"), N.lit("true"), N.lit("false"),
                N.lit("null"))
        return N.ref("$any")

    def enum(self, schema, where):
        values = [schema["const"]] if "const" in schema else _list(schema, "enum", where)
        if "const" in schema and "enum" in schema:
            values = [v for v in values if any(_same(v, e) for e in schema["enum"])]
        others = {k for k in schema if k not in ("const", "enum", "type") and _validating({k: 0})}
        if others:
            raise ValueError(f"json_schema: {', '.join(sorted(others))} beside enum/const at {where} is not "
                             "supported")
        if "type" in schema:
            types = [schema["type"]] if isinstance(schema["type"], str) else schema["type"]
            values = [v for v in values if _type_of(v) in types or (_type_of(v) == "integer" and "number" in types)]
        return N.alt(*(self.literal(v) for v in values)) if values else N.NOTHING

    def literal(self, v):
        if isinstance(v, str):
            return string_literal(v)
        if isinstance(v, dict):
            members = [N.cat(string_literal(k), self.colon, self.literal(x)) for k, x in v.items()]
            body = [m if i == 0 else N.cat(self.comma, m) for i, m in enumerate(members)]
            return N.cat(N.lit("{"), self.ws, *body, self.ws, N.lit("}"))
        if isinstance(v, list):
            body = [self.literal(x) if i == 0 else N.cat(self.comma, self.literal(x)) for i, x in enumerate(v)]
            return N.cat(N.lit("["), self.ws, *body, self.ws, N.lit("]"))
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return number_literal(v)
        return N.lit(json.dumps(v))

    def string(self, schema, where):
        lo, hi = _count(schema, "minLength", where, 0), _count(schema, "maxLength", where)
        if hi is not None and lo > hi:
            return N.NOTHING
        if "format" in schema:
            fmt = schema["format"]
            if fmt not in FORMATS:
                raise ValueError(f"json_schema: format {fmt!r} at {where} is not supported (supported: "
                                 f"{', '.join(sorted(FORMATS))})")
            if "pattern" in schema or lo or hi is not None:
                raise ValueError(f"json_schema: format with pattern/minLength/maxLength at {where} is not supported")
            return N.cat(N.lit('"'), format_ast(fmt), N.lit('"'))
        if "pattern" in schema:
            if lo or hi is not None:
                raise ValueError(f"json_schema: pattern with minLength/maxLength at {where} is not supported")
            return N.cat(N.lit('"'), pattern_ast(schema["pattern"], where), N.lit('"'))
        return N.cat(N.lit('"'), N.rep(ANY_CHAR, lo, hi), N.lit('"'))

    def object(self, schema, where):
        props = schema.get("properties", {})
        required = schema.get("required", [])
        items = []
        for name, sub in props.items():
            member = N.cat(string_literal(name), self.colon, self.value(sub, f"{where}/properties/{name}"))
            items.append((member, name not in required, False))
        extra = schema.get("additionalProperties", True)
        for name in required:                           # named but not listed: additionalProperties says what
            if name not in props:
                value = self.value(extra, f"{where}/additionalProperties")
                items.append((N.cat(string_literal(name), self.colon, value), False, False))
        if extra is not False:
            member = N.cat(key_not_in(list(props) + [r for r in required if r not in props]), self.colon,
                           self.value(extra, f"{where}/additionalProperties"))
            items.append((member, True, True))
        body = ("list", items, self.comma) if items else N.EMPTY
        return N.cat(N.lit("{"), self.ws, body, self.ws, N.lit("}"))

    def array(self, schema, where):
        items = schema.get("items", True)
        prefix = schema.get("prefixItems", [])
        if isinstance(items, list):                     # draft 4-2019: items as a list, additionalItems after
            prefix, items = items, schema.get("additionalItems", True)
        lo, hi = _count(schema, "minItems", where, 0), _count(schema, "maxItems", where)
        asts = [self.value(s, f"{where}/prefixItems/{i}") for i, s in enumerate(prefix)]
        tail = None if items is False else self.value(items, f"{where}/items")
        if tail is None:
            hi = len(prefix) if hi is None else min(hi, len(prefix))
        if hi is not None and lo > hi:
            return N.NOTHING

        def elem(j):
            return asts[j] if j < len(asts) else tail

        def rest(j):                                    # the elements from j on, each after a comma
            if hi is not None and j >= hi:
                return N.EMPTY
            if j >= len(asts) and j >= lo:
                return N.rep(N.cat(self.comma, tail), 0, None if hi is None else hi - j)
            e = N.cat(self.comma, elem(j), rest(j + 1))
            return N.opt(e) if j >= lo else e
        if hi == 0:
            body = N.EMPTY
        else:
            body = N.cat(elem(0), rest(1))
            body = N.opt(body) if lo == 0 else body
        return N.cat(N.lit("["), self.ws, body, self.ws, N.lit("]"))

    def check_disjoint(self, branches, where):
        """oneOf is anyOf when no document validates two branches: each pair must differ in type, in their
        const/enum values, in the const/enum values of a property both require (a discriminator), or in a member
        one requires and the other's objects cannot have."""
        for i in range(len(branches)):
            for j in range(i + 1, len(branches)):
                a, b = branches[i], branches[j]
                if a is False or b is False or _types(a).isdisjoint(_types(b)) or _values_disjoint(a, b):
                    continue
                both = set(a.get("required", ())) & set(b.get("required", ())) if isinstance(a, dict) and \
                    isinstance(b, dict) else set()
                if any(_values_disjoint(self.deref(a.get("properties", {}).get(p, True), where, []),
                                        self.deref(b.get("properties", {}).get(p, True), where, [])) for p in both):
                    continue
                if isinstance(a, dict) and isinstance(b, dict) and (_requires_what_excludes(a, b) or
                                                                    _requires_what_excludes(b, a)):
                    continue
                raise ValueError(f"json_schema: oneOf at {where}: branches {i} and {j} may both validate a "
                                 "document, which oneOf refuses and a grammar cannot exclude; supported where the "
                                 "branches differ in type or in the const/enum of a property both require (or use "
                                 "anyOf)")

    # ---- allOf: one schema with both's constraints
    def merge(self, a, b, where):
        if a is True or a == {}:
            return b
        if b is True or b == {}:
            return a
        if a is False or b is False:
            return False
        out = dict(a)
        _merge_members(out, a, b, "properties", "additionalProperties")
        _merge_members(out, a, b, "prefixItems", "items")
        for key, v in b.items():
            if key in ("properties", "additionalProperties", "prefixItems", "items", "additionalItems"):
                continue
            if key not in out or not _validating({key: v}):
                out[key] = v
                continue
            u = out[key]
            if _same(u, v):
                continue
            if key == "required":
                out[key] = list(u) + [r for r in v if r not in u]
            elif key == "type":
                tu = [u] if isinstance(u, str) else u
                tv = [v] if isinstance(v, str) else v
                t = [x for x in tu if x in tv or (x == "integer" and "number" in tv)]
                t += [x for x in tv if x == "integer" and "number" in tu and x not in t]
                out[key] = t
            elif key == "enum":
                out[key] = [x for x in u if any(_same(x, y) for y in v)]
            elif key in ("minimum", "minLength", "minItems", "exclusiveMinimum"):
                out[key] = max(u, v)
            elif key in ("maximum", "maxLength", "maxItems", "exclusiveMaximum"):
                out[key] = min(u, v)
            elif key in ("anyOf", "oneOf"):
                out[key] = [{"allOf": [x, y]} for x in u for y in v]
            else:
                raise ValueError(f"json_schema: allOf at {where} sets {key!r} to both {u!r} and {v!r}: merging "
                                 "them is not supported")
        return out


def _merge_members(out, a, b, named, rest):
    """allOf of two objects' members (named = properties, rest = additionalProperties) or arrays' elements (named
    = prefixItems, rest = items): each name (index) gets both sides' schemas for it, where a side without one
    applies its `rest` (absent: anything), and the rest gets both rests."""
    def norm(x):
        if named == "prefixItems" and isinstance(x.get("items"), list):          # draft 4-2019's list form
            return dict(enumerate(x["items"])), x.get("additionalItems")
        names = x.get(named)
        if names is None:
            return {}, x.get(rest)
        return (dict(enumerate(names)) if isinstance(names, list) else dict(names)), x.get(rest)
    (na, ra), (nb, rb) = norm(a), norm(b)
    if not (na or nb or ra is not None or rb is not None):
        return
    for key in (named, rest, "additionalItems"):
        out.pop(key, None)
    both = {}
    for k in list(na) + [k for k in nb if k not in na]:
        sa = na.get(k, True if ra is None else ra)
        sb = nb.get(k, True if rb is None else rb)
        both[k] = sa if _same(sa, sb) or sb is True else sb if sa is True else {"allOf": [sa, sb]}
    if both:
        out[named] = [both[i] for i in range(len(both))] if named == "prefixItems" else both
    if ra is not None or rb is not None:
        r = [x for x in (ra, rb) if x is not None]
        out[rest] = r[0] if len(r) == 1 or _same(r[0], r[1]) else {"allOf": r}


def _validating(schema):
    return any(k in _KEYWORDS or k in _UNSUPPORTED for k in schema)


def _list(schema, key, where):
    v = schema[key]
    if not isinstance(v, list):
        raise TypeError(f"json_schema: {key} at {where} must be a list, got {type(v).__name__}")
    if key in ("anyOf", "oneOf", "allOf") and not v:
        raise ValueError(f"json_schema: {key} at {where} is empty")
    return v


def _count(schema, key, where, default=None):
    """A non-negative integer keyword (minLength, maxItems, ...); 2.0 counts as 2, as JSON Schema says."""
    v = schema.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != int(v):
        raise ValueError(f"json_schema: {key} at {where} must be a non-negative integer, got {v!r}")
    return int(v)


def _bounds(schema, where):
    lo, hi = schema.get("minimum"), schema.get("maximum")
    lo_excl = hi_excl = False
    for key, strict in (("exclusiveMinimum", True), ("exclusiveMaximum", False)):
        v = schema.get(key)
        if v is None or v is False:
            continue
        if v is True:                                   # draft 4: a flag on minimum/maximum
            if strict:
                lo_excl = True
            else:
                hi_excl = True
            continue
        if strict and (lo is None or v >= lo):
            lo, lo_excl = v, True
        elif not strict and (hi is None or v <= hi):
            hi, hi_excl = v, True
    for b in (lo, hi):
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, float))):
            raise TypeError(f"json_schema: a numeric bound at {where} must be a number, got {b!r}")
    return lo, lo_excl, hi, hi_excl


def _types(schema):
    """The JSON types a schema admits (integer counted within number)."""
    if not isinstance(schema, dict):
        return set() if schema is False else set(_TYPES)
    if "const" in schema or "enum" in schema:
        values = [schema["const"]] if "const" in schema else schema["enum"]
        out = {_type_of(v) for v in values}
    elif "type" in schema:
        out = {schema["type"]} if isinstance(schema["type"], str) else set(schema["type"])
    else:
        return set(_TYPES)
    return out | ({"number", "integer"} if out & {"number", "integer"} else set())


def _requires_what_excludes(a, b):
    """Some member `a` requires cannot appear in `b`'s objects (b closed to it, or its schema there false)."""
    props = b.get("properties", {})
    for name in a.get("required", ()):
        if props.get(name) is False or (name not in props and b.get("additionalProperties") is False):
            return "object" in _types(a) and _types(a) & _types(b) <= {"object"}
    return False


def _values_disjoint(a, b):
    """Both schemas list their values (const/enum) and share none."""
    values = [None if not isinstance(x, dict) else [x["const"]] if "const" in x else x.get("enum") for x in (a, b)]
    if values[0] is None or values[1] is None:
        return False
    return not any(_same(u, v) for u in values[0] for v in values[1])


def _type_of(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "integer" if v.is_integer() else "number"
    return {str: "string", list: "array", dict: "object"}[type(v)]


def _same(a, b):
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def schema_grammar(schema, whitespace_flexible=False):
    """(rules, start) of the grammar of the documents `schema` (a dict, a bool, or its JSON text) validates."""
    if isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ValueError(f"json_schema: the schema is not valid JSON: {exc}") from None
    if not isinstance(schema, (dict, bool)):
        raise TypeError(f"json_schema: a schema must be a dict, a bool or JSON text, got {type(schema).__name__}")
    c = _Compiler(schema, whitespace_flexible)
    c.rules["$root"] = c.value(schema, "#")
    return c.rules, "$root"
