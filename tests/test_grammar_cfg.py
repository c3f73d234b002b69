"""The context-free front ends (json_schema=, gbnf=) held to an exact oracle over the whole vocabulary: at every
step of random accepted paths, allowed() is True for exactly the tokens after which the output can still be
completed to a string of the language, and end of text exactly where it is complete (soundness and completeness
both 100 %), as an independent Earley recognizer over bytes (tests/grammar_oracle.py) says; rollback restores the
masks. JSON outputs sampled to end of text parse and validate (jsonschema, with formats); hand-written documents
are accepted or refused as jsonschema says."""
import functools
import itertools
import json
import os
import random
import subprocess
import sys

import jsonschema
import numpy as np
import pytest

from tinyllm.grammar.gbnf import parse_gbnf
from tinyllm.grammar.json_schema import schema_grammar
from tinyllm.grammar.matcher import compile

from grammar_oracle import Earley
from test_grammar_matcher import TOK

EOT = TOK.eot_token
FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER  # (FormatChecker() checks draft 3's "time")

TREE = {"$defs": {"node": {"type": "object", "properties": {
    "v": {"type": "integer", "minimum": 0, "maximum": 99},
    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 3}}, "required": ["v"]}},
    "$ref": "#/$defs/node"}
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 3},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                 "zip": {"type": "string", "pattern": "^[0-9]{3}$"}},
                "required": ["city"]}},
    "required": ["name", "id"]}
SCHEMAS = {  # name: (schema, whitespace_flexible, valid documents, invalid documents)
    "nested-optional-required": (PERSON, False, [
        '{"name":"é","id":null}', '{"name":"a\\n","age":7,"id":[1,{"x":"y"}]}',
        '{"name":"abc","address":{"city":"中","zip":"123"},"id":"x"}'],
        ['{"name":"","id":1}', '{"name":"abcd","id":1}', '{"name":"a"}', '{"name":"a","age":121,"id":1}',
         '{"name":"a","address":{"zip":"123"},"id":1}', '{"name":"a","address":{"city":"","zip":"12"},"id":1}']),
    "additional-schema": ({"type": "object", "properties": {"a": {"type": "boolean"}},
                           "additionalProperties": {"type": "integer"}}, False,
                          ['{}', '{"a":true}', '{"a":false,"b":1,"cé":-2}', '{"x":3}'],
                          ['{"a":1}', '{"b":"x"}', '{"a":true,"b":1.5}']),
    "additional-true": ({"type": "object", "properties": {"k": {"const": 1}}, "additionalProperties": True,
                         "required": ["k"]}, False,
                        ['{"k":1}', '{"k":1,"z":[true,{}]}', '{"k":1,"a":"b","c":null}'],
                        ['{}', '{"k":2}', '{"z":1}']),
    "enum-const": ({"type": "object", "properties": {
        "e": {"enum": ["red", "grün", "中", {"a": [1, 2]}, [None, True], 3.5]},
        "c": {"const": {"x": "é\n", "y": [0]}}}, "required": ["e"]}, False,
        ['{"e":"grün"}', '{"e":{"a":[1,2]},"c":{"x":"é\\n","y":[0]}}', '{"e":[null,true]}', '{"e":3.5}'],
        ['{"e":"blue"}', '{"e":{"a":[1]}}', '{"e":"red","c":{"x":"e\\n","y":[0]}}', '{"e":[null]}']),
    "array-prefix-items": ({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string", "maxLength": 1}],
                            "items": {"type": "boolean"}, "minItems": 1, "maxItems": 4}, False,
                           ['[0]', '[-5,"é"]', '[12,"",true,false]'],
                           ['[]', '["a"]', '[1,"ab"]', '[1,"a",true,false,true]', '[1,"a",3]']),
    "array-bounded-ints": ({"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 12},
                            "minItems": 2}, False,
                           ['[-5,12]', '[0,1,2,3]', '[10,-1,7]'], ['[1]', '[13,0]', '[-6,0]', '[1.5,2]']),
    "string-lengths": ({"type": "string", "minLength": 2, "maxLength": 4}, False,
                       ['"ab"', '"é中😀x"', '"\\n\\u00e9"', '"\\ud83d\\ude00a"'],
                       ['"a"', '"abcde"', '"\\n"', '"中😀x\\t!"']),
    "pattern": ({"type": "object", "properties": {"p": {"type": "string", "pattern": "^a[bc]+\\d?$"},
                                                  "q": {"type": "string", "pattern": "é\\d"}},
                 "required": ["p", "q"]}, False,
                ['{"p":"ab","q":"é1"}', '{"p":"acbc9","q":"xxé2yy"}'],
                ['{"p":"a","q":"é1"}', '{"p":"ab","q":"é"}', '{"p":"abd","q":"é1"}']),
    "formats": ({"type": "object", "properties": {"d": {"type": "string", "format": "date"},
                                                  "u": {"type": "string", "format": "uuid"}},
                 "required": ["d", "u"]}, False,
                ['{"d":"2024-02-29","u":"12345678-abcd-ABCD-0000-123456789abc"}'],
                ['{"d":"2023-02-29","u":"12345678-abcd-ABCD-0000-123456789abc"}',
                 '{"d":"2024-13-01","u":"12345678-abcd-ABCD-0000-123456789abc"}']),
    "integer-bounds": ({"type": "integer", "minimum": -12, "maximum": 345}, False,
                       ['-12', '0', '345', '99'], ['-13', '346', '1.5', '01']),
    "integer-exclusive": ({"type": "integer", "exclusiveMinimum": 7}, False,
                          ['8', '123456'], ['7', '-8']),
    "number-bounds": ({"type": "number", "minimum": -2, "exclusiveMaximum": 10}, False,
                      ['-2', '-1.5', '9.999', '0', '-2.0'], ['-2.5', '10', '10.0', '11']),
    "anyOf": ({"anyOf": [{"type": "string", "maxLength": 2}, {"type": "integer", "minimum": 0}, {"type": "null"}]},
              False, ['"ab"', '0', '17', 'null'], ['"abc"', '-1', 'true']),
    "allOf": ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                         {"properties": {"b": {"type": "string"}}}]}, False,
              ['{"a":1}', '{"a":1,"b":"x"}'], ['{"b":"x"}', '{"a":"1"}', '{"a":1,"b":2}']),
    "recursive-tree": (TREE, False, ['{"v":1}', '{"v":2,"kids":[{"v":3},{"v":4,"kids":[]}]}'],
                       ['{"v":100}', '{"kids":[]}', '{"v":1,"kids":[{"v":1},{"v":1},{"v":1},{"v":1}]}']),
    "any-value": ({}, False, ['{"a":[1,2.5e-3,{"b":null}],"c":"é"}', '"x"', '-0', 'true', '[]'],
                  []),
    "any-array-flexible": ({"type": "array", "items": {}}, True, ['[]', '[ {"a" :[ ]} ,\n1e5,"\\"",null ]'],
                           ['[1,]', '{}']),
    "whitespace-flexible": ({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}},
                                                              "b": {"type": "boolean"}}, "required": ["b"]}, True,
                            ['{"b":true}', '{ "a" : [ 1 , 2 ] ,\n\t"b": false }', '{\n  "b": true\n}'],
                            ['{"a":[1]}', '{ "b" : 1 }']),
}

JSON_GBNF = r'''
root    ::= ws value ws
value   ::= object | array | string | number | "true" | "false" | "null"
object  ::= "{" ws ( member ( ws "," ws member )* )? ws "}"
member  ::= string ws ":" ws value
array   ::= "[" ws ( value ( ws "," ws value )* )? ws "]"
string  ::= "\"" ( [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number  ::= "-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws      ::= ( " " | "\n" [ \t]{0,4} )?
'''
ARITH_GBNF = r'''
root   ::= expr
expr   ::= term ( ws [-+] ws term )*
term   ::= factor ( ws [*/] ws factor )*
factor ::= number | "(" ws expr ws ")" | "-" factor
number ::= [0-9]+ ( "." [0-9]+ )?
ws     ::= " "?
'''
NULLABLE_GBNF = r'''
root ::= a b c{1,3} d "!"
a    ::= "x"?
b    ::= a a | "é"{0,2}
c    ::= "ab" | "" | d
d    ::= [0-9]{2,3} | e
e    ::= ""
'''
LIST_GBNF = r'''
root  ::= "[" list? "]"
list  ::= item | item "," list
item  ::= [a-c]+ | "\"" [^"]* "\"" | "(" paren ")"
paren ::= "(" paren ")" paren | ""
'''
MIXED_GBNF = r'''
root ::= s "-" t "-" v "-" w
s    ::= "a" s | ""
t    ::= "(" u ")" t? | "1"
u    ::= t ( "," t )* | ""
v    ::= "[" v{0,3} "]"
w    ::= "a" w "b"? | "c"
'''
GRAMMARS = {  # name: (text, valid, invalid)
    "json": (JSON_GBNF, ['{"a": [1, -2.5e3, true]}', ' [ ]', '"\\u00e9中"', '{\n  "k" : null}'],
             ['{"a" 1}', '[1,]', '01', '"\x01"']),
    "arithmetic": (ARITH_GBNF, ['1', '(1 + 2) * -3.5', '((7))/2-1'], ['', '(1', '1 +', '1..2']),
    "nullable-repeat": (NULLABLE_GBNF, ['!', 'xx!', 'éé12345!', 'xab!', 'ababab!'], ['abababab!', 'é1!', 'xxxx!']),
    "mixed-recursion": (MIXED_GBNF, ['-1-[]-c', 'aa-(1,(),1)1-[[][[]]]-aacb', '-()-[[[[]]]]-acb'],
                        ['-1-[[][][][]]-c', '-(,1)-[]-c', 'a-1-[]-acbb', '-1-[]-']),
    "right-recursive-list": (LIST_GBNF, ['[]', '[a,"x,y",(()())]', '[abc,c]'], ['[a,]', '[,]', '[(]']),
}


def case_grammar(kind, name):
    if kind == "json":
        schema, flexible = SCHEMAS[name][:2]
        return compile(TOK, json_schema=schema, whitespace_flexible=flexible), Earley(*schema_grammar(schema, flexible))
    return compile(TOK, gbnf=GRAMMARS[name][0]), Earley(*parse_gbnf(GRAMMARS[name][0]))


LONG = {"formats": 90}  # (paths that need more tokens to end)
CASES = [("json", n) for n in SCHEMAS] + [("gbnf", n) for n in GRAMMARS]


def walk(grammar, oracle, seed, steps=40):
    """A random path of allowed tokens (more and more likely, as it goes on, to be a token that begins a shortest
    completion, or end of text where the output is complete); at every step allowed() equals the oracle over the
    whole vocabulary, and rollback restores the masks.
    Returns (bytes accepted, whether it ended with end of text, [steps, allowed, viable, allowed and viable])."""
    rng = random.Random(seed)
    m = grammar.matcher()
    out, masks, path, counts = b"", [], [], [0, 0, 0, 0]
    for step in range(steps):
        got = m.allowed().copy()
        want = np.array(oracle.mask(out, TOK.tokens, EOT))
        both = got & want
        counts[0] += 1
        counts[1] += int(got.sum())
        counts[2] += int(want.sum())
        counts[3] += int(both.sum())
        if not np.array_equal(got, want):
            extra = [TOK.decode_single_token_bytes(int(i)) for i in np.flatnonzero(got & ~want)][:8]
            missing = [TOK.decode_single_token_bytes(int(i)) for i in np.flatnonzero(want & ~got)][:8]
            pytest.fail(f"after {out!r}: allowed but not viable {extra}, viable but not allowed {missing}")
        masks.append(got)
        choices = np.flatnonzero(got)
        assert len(choices), f"after {out!r}: nothing is allowed, yet the output is viable"
        if rng.random() < 0.05 + (step / steps) ** 2:   # toward the end: along a shortest completion
            rest = oracle.shortest_completion(out)
            t = rng.choice([i for i in choices if i != EOT and rest.startswith(TOK.tokens[i])] or [EOT])
        else:
            t = int(rng.choice(list(choices)))
        m.accept(t)
        path.append(t)
        if rng.random() < 0.25:                         # take back a few tokens: the masks come back
            k = rng.randint(1, len(path))
            m.rollback(k)
            np.testing.assert_array_equal(m.allowed(), masks[-k], err_msg=f"rollback({k}) after {out!r}")
            for u in path[-k:]:
                m.accept(u)
        if t == EOT:
            assert m.is_terminated() and not m.allowed().any()
            return out, True, counts
        out += TOK.decode_single_token_bytes(t)
    return out, False, counts


TOTALS = {}  # name: [steps, allowed, viable, allowed and viable] over the walks (reported by the last test)


@pytest.mark.parametrize("kind, name", CASES, ids=[f"{k}-{n}" for k, n in CASES])
def test_masks_equal_the_earley_oracle(kind, name):
    g, oracle = case_grammar(kind, name)
    validator = None
    if kind == "json":
        schema = SCHEMAS[name][0]
        validator = jsonschema.Draft202012Validator(schema, format_checker=FORMATS)
    totals, ended, paths = [0, 0, 0, 0], 0, 0
    for seed in range(100):  # at least 6 paths and 200 steps
        if seed >= 6 and totals[0] >= 200:
            break
        paths += 1
        out, done, counts = walk(g, oracle, seed, steps=LONG.get(name, 40))
        totals = [a + b for a, b in zip(totals, counts)]
        if done:
            ended += 1
            assert oracle.complete(out)
            if validator is not None:
                validator.validate(json.loads(out.decode()))
    TOTALS[f"{kind}-{name}"] = totals
    assert totals[3] / totals[1] == 1.0 and totals[3] / totals[2] == 1.0  # soundness, completeness
    print(f"{kind}-{name}: {paths} paths, {totals[0]} steps, {ended} ended")
    assert totals[0] >= 200 and ended >= 3


def accepts(grammar, data):
    """Whether the matcher takes `data` byte by byte (the single-byte tokens) and then end of text."""
    m = grammar.matcher()
    try:
        for b in data:
            m.accept(b)  # (token b is the byte b)
        m.accept(EOT)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_hand_written_documents(name):
    schema, flexible, valid, invalid = SCHEMAS[name]
    g, oracle = case_grammar("json", name)
    validator = jsonschema.Draft202012Validator(schema, format_checker=FORMATS)
    for doc in valid:
        assert validator.is_valid(json.loads(doc)), doc
        assert accepts(g, doc.encode()) and oracle.complete(doc.encode()), doc
    for doc in invalid:
        try:
            assert not validator.is_valid(json.loads(doc)), doc
        except json.JSONDecodeError:
            pass
        assert not accepts(g, doc.encode()) and not oracle.complete(doc.encode()), doc


@pytest.mark.parametrize("name", list(GRAMMARS))
def test_hand_written_gbnf_strings(name):
    _, valid, invalid = GRAMMARS[name]
    g, oracle = case_grammar("gbnf", name)
    for text in valid:
        assert accepts(g, text.encode()) and oracle.complete(text.encode()), text
    for text in invalid:
        assert not accepts(g, text.encode()) and not oracle.complete(text.encode()), text
    if name == "json":
        for text in valid:
            json.loads(text)


# ---- random grammars: small GBNF texts and JSON schemas drawn from a seed
ATOMS = ['"a"', '"b"', '"ab"', '"é"', '"中"', "[a-c]", "[^a]", '""', '"x"', ".", "[0-9]"]


def random_gbnf(rng):
    """1 to 4 rules of literals, classes, groups, alternatives, repetitions and calls, each body of depth <= 3
    (so the recursion below is bounded); root reaches every rule."""
    names = ["root"] + [f"r{i}" for i in range(1, rng.randint(1, 4))]

    def expr(depth):
        k = rng.random()
        if depth > 2 or k < 0.35:
            return rng.choice(names) if rng.random() < 0.35 else rng.choice(ATOMS)
        if k < 0.6:
            return " ".join(expr(depth + 1) for _ in range(rng.randint(2, 3)))
        if k < 0.8:
            return "(" + " | ".join(expr(depth + 1) for _ in range(rng.randint(2, 3))) + ")"
        return "(" + expr(depth + 1) + ")" + rng.choice(["*", "+", "?", "{2}", "{0,2}", "{1,}", "{1,3}"])
    rules = {name: expr(0) for name in names}
    rules["root"] += "".join(f' | "q" {name}' for name in names[1:])
    return "".join(f"{name} ::= {body}\n" for name, body in rules.items())


NAMES = ["a", "b", "é", "ab", 'k"q', "中", "x y"]


def random_value(rng, depth=0):
    k = rng.random()
    if depth > 1 or k < 0.5:
        return rng.choice([None, True, False, 0, -3, 2.5, "a", "é", "", 'a"b', 17])
    if k < 0.75:
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 2))]
    return {rng.choice(NAMES): random_value(rng, depth + 1) for _ in range(rng.randint(0, 2))}


def random_schema(rng, depth=0):
    """A schema of the supported keywords, depth <= 4."""
    k = rng.randrange(14 if depth < 3 else 8)
    if k <= 1:
        s = {"type": "integer" if k == 0 else "number"}
        for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if rng.random() < 0.3:
                s[key] = rng.randint(-30, 300) if k == 0 else rng.randint(-30, 30)
        return s
    if k == 2:
        s, r = {"type": "string"}, rng.random()
        if r < 0.4:
            if rng.random() < 0.6:
                s["minLength"] = rng.randint(0, 3)
            if rng.random() < 0.6:
                s["maxLength"] = rng.randint(s.get("minLength", 0), 4)
        elif r < 0.7:
            s["pattern"] = rng.choice(["^a+$", "b", "^[0-9]{2}$", "é.", "^(ab|c)*$", "\\d"])
        elif r < 0.85:
            s["format"] = rng.choice(["date", "uuid", "ipv4", "time", "date-time", "email", "hostname"])
        return s
    if k == 3:
        return rng.choice([{"type": "boolean"}, {"type": "null"}, {"type": ["string", "null"]},
                           {"type": ["integer", "boolean"]}, True, {}])
    if k == 4:
        return {"enum": [random_value(rng) for _ in range(rng.randint(1, 4))]}
    if k == 5:
        return {"const": random_value(rng)}
    if k <= 8:
        s = {"type": "array"}
        if rng.random() < 0.7:
            s["items"] = random_schema(rng, depth + 1)
        if rng.random() < 0.3:
            s["prefixItems"] = [random_schema(rng, depth + 1) for _ in range(rng.randint(1, 2))]
        if rng.random() < 0.2:
            s["items"] = False
        if rng.random() < 0.4:
            s["minItems"] = rng.randint(0, 2)
        if rng.random() < 0.4:
            s["maxItems"] = rng.randint(0, 3)
        return s
    if k <= 11:
        s, props = {"type": "object"}, rng.sample(NAMES, rng.randint(0, 3))
        if props or rng.random() < 0.5:
            s["properties"] = {p: random_schema(rng, depth + 1) for p in props}
        r = rng.random()
        if r < 0.25:
            s["additionalProperties"] = False
        elif r < 0.4:
            s["additionalProperties"] = True
        elif r < 0.55:
            s["additionalProperties"] = random_schema(rng, depth + 1)
        required = [p for p in props if rng.random() < 0.5]
        if rng.random() < 0.2:
            required.append(rng.choice(NAMES))
        if required:
            s["required"] = list(dict.fromkeys(required))
        return s
    if k == 12:
        return {"anyOf": [random_schema(rng, depth + 1) for _ in range(rng.randint(1, 3))]}
    return {"allOf": [random_schema(rng, depth + 1) for _ in range(2)]}


def test_random_gbnf_grammars():
    compiled = 0
    for seed in range(120):
        text = random_gbnf(random.Random(seed))
        try:
            g = compile(TOK, gbnf=text)
        except ValueError as exc:  # left recursion (refused), or an empty language (the oracle agrees)
            assert "left-recursive" in str(exc) or Earley(*parse_gbnf(text)).empty_language, text
            continue
        compiled += 1
        oracle = Earley(*parse_gbnf(text))
        for walk_seed in range(2):
            out, done, counts = walk(g, oracle, walk_seed, steps=20)
            TOTALS["random-gbnf"] = [a + b for a, b in zip(TOTALS.get("random-gbnf", [0] * 4), counts)]
            assert not done or oracle.complete(out)
    assert compiled >= 40


def test_random_json_schemas():
    compiled = ended = 0
    for seed in range(150):
        rng = random.Random(seed)
        schema, flexible = random_schema(rng), rng.random() < 0.2
        try:
            g = compile(TOK, json_schema=schema, whitespace_flexible=flexible)
        except ValueError as exc:  # an unsupported combination, or an empty language (the oracle agrees)
            assert "no string" not in str(exc) or Earley(*schema_grammar(schema, flexible)).empty_language
            continue
        compiled += 1
        oracle = Earley(*schema_grammar(schema, flexible))
        validator = jsonschema.Draft202012Validator(schema, format_checker=FORMATS)
        for walk_seed in range(2):
            out, done, counts = walk(g, oracle, walk_seed, steps=25)
            TOTALS["random-json"] = [a + b for a, b in zip(TOTALS.get("random-json", [0] * 4), counts)]
            if done:
                ended += 1
                doc = json.loads(out.decode())
                assert validator.is_valid(doc), (json.dumps(schema), out)
    assert compiled >= 100 and ended >= 150


# ---- bugs the sweep found (tinyllm/grammar not fixed here)
@pytest.mark.parametrize("extra, doc", [({"type": "integer"}, '{"b":"x"}'), (False, '{"b":1}')])
def test_required_name_outside_properties_obeys_additional_properties(extra, doc):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"],
              "additionalProperties": extra}
    assert not jsonschema.Draft202012Validator(schema).is_valid(json.loads(doc))
    try:
        g = compile(TOK, json_schema=schema)
    except ValueError:  # (additionalProperties false: no document validates, an empty language is a fair answer)
        return
    assert not accepts(g, doc.encode())


def test_min_length_above_max_length_accepts_nothing():
    schema = {"type": "string", "minLength": 2, "maxLength": 1}
    assert not jsonschema.Draft202012Validator(schema).is_valid("ab")
    try:
        g = compile(TOK, json_schema=schema)
    except ValueError:  # (the language is empty)
        return
    assert not accepts(g, b'"ab"')


def test_all_of_items_beside_prefix_items():
    schema = {"allOf": [{"type": "array", "items": {"type": "integer"}}, {"prefixItems": [{"type": "string"}]}]}
    assert not jsonschema.Draft202012Validator(schema).is_valid(["x"])
    assert not accepts(compile(TOK, json_schema=schema), b'["x"]')


def test_all_of_additional_properties_beside_properties():
    schema = {"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}},
                        {"additionalProperties": {"type": "integer"}}]}
    assert not jsonschema.Draft202012Validator(schema).is_valid({"a": "x"})
    assert not accepts(compile(TOK, json_schema=schema), b'{"a":"x"}')


def test_ambiguous_recursion_stays_polynomial():
    """A parser state of whole stacks would hold ~1.6^n of them after n bytes here (64,036 at n = 20); the
    graph-structured stack shares their tails (a hang guard: 60 bytes in a subprocess within 20 s)."""
    code = ("from tinyllm.grammar.matcher import compile\n"
            "from test_grammar_matcher import TOK\n"
            "m = compile(TOK, gbnf='root ::= \"x\" root? root? \"y\"?').matcher()\n"
            "for _ in range(60):\n"
            "    m.accept(TOK.tokens.index(b'x'))\n"
            "    m.allowed()\n")
    oracle = Earley(*parse_gbnf('root ::= "x" root? root? "y"?'))
    assert oracle.viable(b"x" * 60) and oracle.complete(b"x" * 60)  # (the oracle takes milliseconds)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(
        __file__))), os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH", "")]))
    try:
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("60 bytes took more than 20 s")


# ---- the oracle itself, against languages known by other means
def test_oracle_on_a_finite_language_listed_in_full():
    schema = {"type": "array", "items": {"anyOf": [{"type": "integer", "minimum": -3, "maximum": 12},
                                                   {"enum": ["é", "中"]}]}, "maxItems": 2}
    spellings = [str(i) for i in range(-3, 13)] + ["-0"] + ['"é"', '"\\u00e9"', '"\\u00E9"', '"中"'] + [
        '"\\u4%s2%s"' % (e, d) for e in "eE" for d in "dD"]
    language = {("[" + ",".join(v) + "]").encode() for n in range(3) for v in itertools.product(spellings, repeat=n)}
    oracle = Earley(*schema_grammar(schema))
    prefixes = {s[:k] for s in language for k in range(len(s) + 1)}
    rng = random.Random(0)
    probes = prefixes | {p + bytes([rng.randrange(256)]) for p in prefixes for _ in range(3)}
    for s in sorted(probes):
        assert oracle.viable(s) == (s in prefixes), s
        assert oracle.complete(s) == (s in language), s


def test_oracle_on_nested_counting():
    oracle = Earley(*parse_gbnf('root ::= "a" root "b" | "" | "c"{2,3} root'))

    @functools.lru_cache(maxsize=None)
    def member(s):  # root -> "a" root "b" | "" | c{2,3} root, by its definition
        return (s == b"" or any(s[:k] == b"c" * k and member(s[k:]) for k in (2, 3))
                or (s[:1] == b"a" and s[-1:] == b"b" and member(s[1:-1])))

    for n in range(9):
        for t in itertools.product(b"abc", repeat=n):
            s = bytes(t)
            assert oracle.complete(s) == member(s), s
    assert oracle.viable(b"aacccab") and not oracle.viable(b"abb") and not oracle.viable(b"cacb")


def test_totals_report():
    """(runs last in this file: the figures of the sweep above, for the log)"""
    if not TOTALS:
        pytest.skip("the sweep did not run in this process")
    steps, allowed, viable, both = (sum(v[i] for v in TOTALS.values()) for i in range(4))
    print(f"\n{len(TOTALS)} sweeps, {steps} steps, {steps * TOK.n_vocab} token verdicts: soundness "
          f"{both}/{allowed} completeness {both}/{viable}")
    assert both == allowed == viable
