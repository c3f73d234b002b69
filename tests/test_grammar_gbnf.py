"""GBNF (llama.cpp's grammar format) parsed into tinyllm's grammars: each construct's language on byte strings,
and every kind of bad grammar a ValueError with line and column (the masks themselves are held to an oracle in
tests/test_grammar_cfg.py)."""
import pytest

from tinyllm.grammar.cfg import CFG
from tinyllm.grammar.gbnf import parse_gbnf


def language(text):
    g = CFG(*parse_gbnf(text), "gbnf")
    return lambda s: g.fullmatch(s.encode("utf-8"))


JSON_GBNF = r'''
# llama.cpp's json.gbnf, in its layout: rules span lines inside groups
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws
ws ::= | " " | "\n" [ \t]{0,20}
'''


@pytest.mark.parametrize("text, yes, no", [
    (JSON_GBNF, ['{"a": [1, 2.5e3, {"b": null}], "c": "x\\n\\u00e9"}', "{}", '{"k":"中"}'],
     ['{"a":}', "[1]", '{"a":1', '{"a":"\x01"}']),
    ('root ::= "a"+ "b"* "c"? [x-z]{2} [0-9]{1,} "#"{,2}', ["axy99", "aabbbcxz0##"], ["xy9", "axy", "axy9###"]),
    ('root ::= [^a-c\\n] .\nother ::= "q"\nroot2 ::= other', None, None),  # (unused rules: an error, below)
    ('root ::= "\\x41\\u00e9\\U0001F600\\t\\\\\\"" [\\]\\-]', ['Aé😀\t\\"]', 'Aé😀\t\\"-'], ['Aé😀\t\\"a']),
    ('root ::= expr\nexpr ::= term (("+" | "-") term)*\nterm ::= factor (("*" | "/") factor)*\n'
     'factor ::= [0-9]+ | "(" expr ")"', ["1+2*(3-4)/5", "((7))"], ["1+", "(1", "1)", "()"]),
    ('root ::= item ("," item)*  # a comment\nitem ::= [a-z]+ | "[" root "]"', ["a,b,[c,[d]]"], ["a,,b", "[]"]),
    ('root ::= ("x" | )', ["x", ""], ["xx"]),
])
def test_constructs(text, yes, no):
    if yes is None:
        with pytest.raises(ValueError, match="is defined but never used"):
            language(text)
        return
    accepts = language(text)
    for s in yes:
        assert accepts(s), s
    for s in no:
        assert not accepts(s), s


@pytest.mark.parametrize("text, message", [
    ('root ::= item', "line 1, column 10: rule 'item' is used but not defined"),
    ('root ::= "a"\nunused ::= "b"', "line 2, column 1: rule 'unused' is defined but never used from root"),
    ('start ::= "a"', "line 1, column 1: the grammar has no `root` rule"),
    ('root ::= "a"\nroot ::= "b"', "line 2, column 1: rule 'root' is defined twice \\(first on line 1\\)"),
    ('root ::= "a" (\n "b"', "line 1, column 14: expected '\\)' to close the group"),
    ('root ::= "abc', "line 1, column 10: unterminated string literal"),
    ('root ::= [a-', "line 1, column 10: unterminated character class"),
    ('root ::= [z-a]', "line 1, column 10: range 'z'-'a' is reversed"),
    ('root := "a"', "line 1, column 6: expected '::=' after the rule name 'root'"),
    ('root ::= "a"{3,1}', "line 1, column 13: repetition \\{3,1\\} has its maximum below its minimum"),
    ('root ::= "a"{x}', "line 1, column 13: bad repetition"),
    ('root ::= "\\q"', "line 1, column 11: unknown escape \\\\q"),
    ('root ::= "\\x4"', "line 1, column 11: \\\\x needs 2 hex digits"),
    ('root ::= "\\uD800"', "is not a Unicode scalar value"),
    ('root ::= "a" ) "b"', "line 1, column 14: unexpected '\\)'"),
    ('root ::= @', "line 1, column 10: unexpected '@'"),
    ('', "defines no rule"),
    ('root ::= root "a" | "b"', "rule 'root' is left-recursive \\(root -> root\\)"),
    ('root ::= a\na ::= b "x"\nb ::= a | "y"', "left-recursive"),
    ('root ::= [^\\x00-\\U0010FFFF]', "language is empty"),
])
def test_errors_name_line_and_column(text, message):
    with pytest.raises(ValueError, match=message):
        CFG(*parse_gbnf(text), "gbnf")


def test_not_text_is_a_type_error():
    with pytest.raises(TypeError, match="gbnf: the grammar must be text"):
        parse_gbnf(b'root ::= "a"')
