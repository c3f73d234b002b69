"""JSON Schema's front end against `jsonschema` itself: for each keyword, documents the grammar accepts are exactly
the ones jsonschema validates, within the conventions of tinyllm/grammar/json_schema.py (compact or bounded
whitespace, members in the schema's order); unsupported keywords raise. (Masks over a vocabulary are held to an
oracle in tests/test_grammar_cfg.py, real schemas in tests/test_grammar_schemas.py.)"""
import itertools
import json
import random

import jsonschema
import pytest

from tinyllm.grammar.cfg import CFG
from tinyllm.grammar.json_schema import schema_grammar


def grammar(schema, **kw):
    return CFG(*schema_grammar(schema, **kw), "json_schema")


def valid(schema, text):
    # (the draft's own checker: FormatChecker() holds every draft's, and draft 3's "time" would win)
    v = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    return v.is_valid(json.loads(text))


def agree(schema, texts, **kw):
    try:
        g = grammar(schema, **kw)
    except ValueError as e:                             # nothing validates: then no text may
        assert "language is empty" in str(e) and not any(valid(schema, t) for t in texts), schema
        return
    for t in texts:
        assert g.fullmatch(t.encode()) == valid(schema, t), (schema, t)


@pytest.mark.parametrize("lo, hi, lo_ex, hi_ex", [(-3, 12, False, False), (0, None, True, False),
                                                   (None, -2, False, True), (-10, -4, True, True),
                                                   (5, 5, False, False), (7, 105, False, True)])
@pytest.mark.parametrize("kind", ["integer", "number"])
def test_numeric_bounds_agree_with_jsonschema_on_every_small_value(kind, lo, hi, lo_ex, hi_ex):
    schema = {"type": kind}
    if lo is not None:
        schema["exclusiveMinimum" if lo_ex else "minimum"] = lo
    if hi is not None:
        schema["exclusiveMaximum" if hi_ex else "maximum"] = hi
    texts = [str(n) for n in range(-130, 131)] + ["-0", "01", "1.", ".5", "+1"]
    if kind == "number":
        texts += [f"{n}.{f}" for n in range(-13, 14) for f in ("0", "00", "5", "05", "999")] + ["-0.0", "12.50"]
    g = grammar(schema)
    for t in texts:
        try:
            expected = valid(schema, t)
        except json.JSONDecodeError:
            expected = False
        assert g.fullmatch(t.encode()) == expected, (schema, t)


def test_integer_type_refuses_fractions_and_number_takes_exponents_without_bounds():
    agree({"type": "integer"}, ["0", "-7", "123456789012345678901234567890", "1.5"])
    assert not grammar({"type": "integer"}).fullmatch(b"1.0")   # (a valid integer to jsonschema: not written so)
    agree({"type": "number"}, ["1e5", "-2.5E-3", "0.0", "1E+2"])
    with pytest.raises(ValueError, match="not an integer: only integer bounds are supported on numbers"):
        grammar({"type": "number", "minimum": 0.5})


def test_strings_every_spelling_and_lengths_in_characters():
    schema = {"type": "string", "minLength": 2, "maxLength": 3}
    texts = ['"ab"', '"a"', '"abcd"', '"é中"', '"😀😀😀"', '"\\u00e9\\n"', '"\\ud83d\\ude00x"', '"\\"\\\\\\/"',
             '"\\b\\f\\r\\t"', '"\\uD83D\\uDE00"', '"a\\u0062"']
    agree(schema, texts)
    g = grammar({"type": "string"})
    for bad in ['"\x01"', '"\\x"', '"\\u12"', '"a', '"\n"']:
        assert not g.fullmatch(bad.encode()), bad


def test_pattern_is_searched_in_the_decoded_string():
    for pattern in ["^[a-z]+$", "[0-9]{3}", "^ab", "c$", "^(?:x|yy)$", "é+"]:
        texts = ['"abc"', '"ab1234"', '"xab"', '"abc"', '"x"', '"yy"', '"xyy"', '"\\u0061\\u0062c"', '"é"',
                 '"eé\\u00e9"', '"12"', '"A"']
        agree({"type": "string", "pattern": pattern}, texts)
    with pytest.raises(ValueError, match="anchor beside a top-level"):
        grammar({"type": "string", "pattern": "^a|b$"})


@pytest.mark.parametrize("fmt, texts", [
    ("date", ["2024-02-29", "2023-02-29", "1900-02-28", "2000-02-29", "2100-02-29", "0000-01-01", "2024-04-31",
              "2024-12-31", "2024-1-01", "2024\\u002d01-01"]),
    ("time", ["12:30:00Z", "23:59:59.123+05:30", "24:00:00Z", "12:30:00", "12:30:00z", "07:08:09-00:00"]),
    ("date-time", ["2024-02-29T12:00:00Z", "2024-02-29t12:00:00.5-01:00", "2024-02-30T12:00:00Z",
                   "2024-02-29 12:00:00Z"]),
    ("uuid", ["123e4567-e89b-12d3-a456-426614174000", "123E4567-E89B-12D3-A456-426614174000",
              "123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"]),
    ("ipv4", ["192.168.0.1", "255.255.255.255", "256.1.1.1", "01.2.3.4", "1.2.3"]),
])
def test_formats_agree_with_jsonschemas_format_checker(fmt, texts):
    agree({"type": "string", "format": fmt}, [json.dumps(t) if "\\" not in t else f'"{t}"' for t in texts])


def test_email_and_hostname_are_stricter_than_jsonschema_but_within_it():
    """jsonschema checks only an '@' for email (and hostname only with the fqdn package): the grammar keeps to
    the usual dot-atom forms, each of which jsonschema accepts."""
    g = grammar({"type": "string", "format": "email"})
    for t in ['"a@b.co"', '"first.last+tag@sub.example.org"']:
        assert g.fullmatch(t.encode()) and valid({"type": "string", "format": "email"}, t)
    for t in ['"a@"', '"@b.co"', '"a b@c.d"', '"a..b@c.d"']:
        assert not g.fullmatch(t.encode())


def test_objects_order_required_and_additional_properties():
    props = {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}}
    docs = ['{}', '{"a":1}', '{"b":"x"}', '{"a":1,"b":"x","c":true}', '{"a":1,"c":false}', '{"c":true}',
            '{"a":1,"a":2}', '{"a":"x"}', '{"a":1,"d":2}', '{"d":2}', '{"ab":1}', '{"":1}']
    for required in ([], ["a"], ["b", "c"]):
        for extra in (False, True, {"type": "integer"}):
            agree({"type": "object", "properties": props, "required": required, "additionalProperties": extra},
                  [d for d in docs if '"a":1,"a"' not in d])
    # absent additionalProperties: any other member, after the listed ones, its name in any spelling
    agree({"properties": props}, ['{"d":1}', '{"a":1,"d":{"e":[null]}}', '{"a\\u0001\\"":1}', '{"\\u0061":1}',
                                  '{"\\u0061":"x"}'])
    assert grammar({"type": "object"}).fullmatch(b'{"d":[1,{"e":null}]}')
    # the schema's order: b before a is refused although jsonschema would take it
    assert not grammar({"type": "object", "properties": props}).fullmatch(b'{"b":"x","a":1}')
    # a required name that properties does not list comes after them, with any value
    agree({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["z"],
           "additionalProperties": False}, ['{"a":1,"z":[1]}', '{"z":null}', '{"a":1}'])


def test_arrays_prefix_items_and_counts():
    texts = ["[]", "[1]", '[1,"a"]', '[1,"a",true]', '[1,"a",true,false]', '["a"]', '[1,2]']
    for lo, hi in itertools.product([0, 1, 2, 3], [None, 1, 2, 3]):
        for items in (False, {"type": "boolean"}, True):
            schema = {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": items,
                      "minItems": lo}
            if hi is not None:
                schema["maxItems"] = hi
            agree(schema, texts)
    agree({"type": "array", "items": {"type": "integer"}, "maxItems": 2}, ["[]", "[1,2]", "[1,2,3]", '["a"]'])


def test_enum_const_unions_allof_and_recursive_refs():
    agree({"enum": ["a", 1, None, [1, {"x": True}], {"k": [2]}]},
          ['"a"', "1", "null", '[1,{"x":true}]', '{"k":[2]}', '"\\u0061"', "2", '{"k":[3]}'])
    agree({"const": {"a": [1, 2]}}, ['{"a":[1,2]}', '{"a":[1]}'])
    agree({"anyOf": [{"type": "integer", "minimum": 5}, {"type": "string", "maxLength": 1}]},
          ["4", "5", '"a"', '"ab"'])
    agree({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                     {"properties": {"a": {"minimum": 3}}}]}, ['{"a":2}', '{"a":3}', "{}"])
    tree = {"$defs": {"t": {"type": "object", "properties": {"v": {"type": "integer"},
                                                             "kids": {"type": "array", "items": {"$ref": "#/$defs/t"}}},
                            "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/t"}
    agree(tree, ['{"v":1}', '{"v":1,"kids":[{"v":2,"kids":[{"v":3}]},{"v":4}]}', '{"v":1,"kids":[{}]}',
                 '{"kids":[]}'])
    agree({"type": "array", "items": {"$ref": "#"}, "maxItems": 2}, ["[]", "[[],[[]]]", "[[],[],[]]", "[1]"])


def test_whitespace_is_compact_or_bounded():
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}}
    assert not grammar(schema).fullmatch(b'{"a": [1]}')
    g = grammar(schema, whitespace_flexible=True)
    assert g.fullmatch(b'{ "a" :\n[ 1 ,\t2 ] }')
    assert g.fullmatch(b'{"a":' + b" " * 64 + b"[1]}")
    assert not g.fullmatch(b'{"a":' + b" " * 65 + b"[1]}")         # never an unbounded run


@pytest.mark.parametrize("schema, error, message", [
    ({"type": "string", "not": {}}, ValueError, "keyword 'not' at # is not supported"),
    ({"properties": {"a": {"if": {}}}}, ValueError, "keyword 'if' at #/properties/a is not supported"),
    ({"type": "array", "uniqueItems": True}, ValueError, "'uniqueItems': true at # is not supported"),
    ({"type": "string", "format": "uri"}, ValueError, "format 'uri' at # is not supported"),
    ({"type": "string", "pattern": "a", "maxLength": 3}, ValueError, "pattern with minLength/maxLength"),
    ({"type": "string", "pattern": "(?=a)"}, ValueError, "lookahead assertion"),
    ({"$ref": "other.json#/x"}, ValueError, "\\$ref 'other.json#/x' at # cannot be resolved"),
    ({"$ref": "#/$defs/missing"}, ValueError, "cannot be resolved: no '\\$defs' in the schema"),
    ({"type": "integer", "enum": ["a"]}, ValueError, "language is empty"),
    ({"type": "thing"}, ValueError, "type 'thing' at # is not a JSON Schema type"),
    ({"anyOf": []}, ValueError, "anyOf at # is empty"),
    ({"allOf": [{"pattern": "a"}, {"pattern": "b"}]}, ValueError, "allOf at #/allOf/1 sets 'pattern' to both"),
    (3, TypeError, "a schema must be a dict, a bool or JSON text"),
    ("{", ValueError, "the schema is not valid JSON"),
])
def test_bad_schemas_are_clear_errors(schema, error, message):
    with pytest.raises(error, match=message):
        grammar(schema)


def test_random_documents_of_a_schema_validate():
    """Documents drawn from the grammar's own automaton (random bytes among those that stay live) are valid."""
    schema = {"type": "object", "properties": {"id": {"type": "string", "format": "uuid"},
                                               "n": {"type": "integer", "minimum": -3, "maximum": 300},
                                               "x": {"type": "number", "exclusiveMinimum": 0},
                                               "tags": {"type": "array", "items": {"enum": ["a", "b c"]},
                                                        "maxItems": 3},
                                               "when": {"type": "string", "format": "date-time"}},
              "required": ["id", "n"]}
    g = grammar(schema)
    rng = random.Random(0)
    for _ in range(60):
        state, out = g.start, b""
        while True:
            if g.accepting(state) and rng.random() < 0.3:
                break
            live = [b for b, t in enumerate(g.transitions(state)) if t >= 0]
            if not live:
                break
            b = rng.choice(live)
            state, out = g.step(state, b), out + bytes([b])
        assert g.accepting(state)
        assert valid(schema, out.decode()), out
