"""JSON's text as grammar trees (nodes.py), for the JSON Schema front end (json_schema.py): a character in every
JSON spelling (raw, short escapes, \\u escapes and surrogate pairs), string literals and member names, `pattern`s
searched in the decoded string, the `format`s jsonschema checks, and numbers within bounds or equal to a value."""
import functools
import math

from . import nodes as N
from .regex_parse import _Parser

_D = "[0-9]"
_YEAR = "(?:[0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})"      # 0001-9999
_LEAP = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = (f"(?:{_YEAR}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]{_D}|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]{_D}|30)"
         f"|02-(?:0[1-9]|1{_D}|2[0-8]))|{_LEAP}-02-29)")
_TIME = f"(?:[01]{_D}|2[0-3]):[0-5]{_D}:[0-5]{_D}(?:\\.{_D}+)?(?:[Zz]|[+-](?:[01]{_D}|2[0-3]):[0-5]{_D})"
_ATEXT = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_LABEL = "[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"    # (RFC 1035's 63-byte limit is not kept: it multiplies states)
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
FORMATS = {                                             # what jsonschema's FormatChecker accepts, as regexes
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}[Tt]{_TIME}",
    "email": f'(?:{_ATEXT}+(?:\\.{_ATEXT}+)*|"(?:[^"\\\\\\r\\n]|\\\\.)*")@(?:(?:{_LABEL}\\.)+{_LABEL}|\\[[!-Z^-~]*\\])',
    "uuid": "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "ipv4": f"{_OCTET}(?:\\.{_OCTET}){{3}}",
    "hostname": f"{_LABEL}(?:\\.{_LABEL})*",
}
_SHORT_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}
ALL_CHARS = ((0, 0xD7FF), (0xE000, 0x10FFFF))
_NOT_RAW = ((0, 0x1F), (0x22, 0x22), (0x5C, 0x5C))     # JSON strings escape these


def _hex_digit(lo, hi):
    ranges = []
    if lo <= 9:
        ranges.append((48 + lo, 48 + min(hi, 9)))
    if hi >= 10:
        a, b = max(lo, 10) - 10, hi - 10
        ranges += [(65 + a, 65 + b), (97 + a, 97 + b)]
    return N.chars(sorted(ranges))


def _u_escapes(lo, hi):
    """`\\uXXXX` for the code points [lo, hi] (hex digits in either case)."""
    return N.cat(N.lit("\\u"), N.alt(*(N.cat(*(_hex_digit(p, q) for p, q in seq))
                                      for seq in N.digit_sequences(lo, hi, 4, 16))))


@functools.lru_cache(maxsize=4096)
def json_char(ranges):
    """One decoded character in the code-point `ranges`, in every JSON spelling: raw where JSON allows it, the
    short escapes, and `\\u` escapes (surrogate pairs for the code points past U+FFFF)."""
    branches = []
    raw = N.subtract(ranges, _NOT_RAW)
    if raw:
        branches.append(N.chars(raw))
    for c, e in _SHORT_ESCAPES.items():
        if N.intersect(ranges, ord(c), ord(c)):
            branches.append(N.lit("\\" + e))
    for lo, hi in N.intersect(ranges, 0, 0xFFFF):
        branches.append(_u_escapes(lo, hi))
    for lo, hi in N.intersect(ranges, 0x10000, 0x10FFFF):  # as (high, low) surrogate halves: base-1024 digits
        for (h0, h1), (l0, l1) in N.digit_sequences(lo - 0x10000, hi - 0x10000, 2, 1024):
            branches.append(N.cat(_u_escapes(0xD800 + h0, 0xD800 + h1), _u_escapes(0xDC00 + l0, 0xDC00 + l1)))
    return N.alt(*branches) if branches else N.NOTHING


ANY_CHAR = json_char(ALL_CHARS)


def string_literal(text):
    return N.cat(N.lit('"'), *(json_char(((ord(c), ord(c)),)) for c in text), N.lit('"'))


def key_not_in(names):
    """A JSON string, in any spelling, whose decoded text is none of `names`: through the names' trie, leave it by
    a character no name continues with, or stop where no name ends."""
    trie = {}
    for name in names:
        node = trie
        for c in name:
            node = node.setdefault(c, {})
        node[None] = True
    branches, stack = [], [("", trie)]
    while stack:
        prefix, node = stack.pop()
        children = tuple(sorted((ord(c), ord(c)) for c in node if c is not None))
        tails = [N.cat(json_char(N.subtract(ALL_CHARS, children)), N.rep(ANY_CHAR))]
        if None not in node:
            tails.append(N.EMPTY)
        branches.append(N.cat(*(json_char(((ord(c), ord(c)),)) for c in prefix), N.alt(*tails)))
        stack += [(prefix + c, child) for c, child in node.items() if c is not None]
    return N.cat(N.lit('"'), N.alt(*branches), N.lit('"'))


def pattern_ast(pattern, where):
    """JSON Schema's `pattern` (an unanchored re search) over the decoded characters of a JSON string."""
    body, anchored_start, anchored_end = pattern, False, False
    if body.startswith("^"):
        body, anchored_start = body[1:], True
    if body.endswith("$") and not body.endswith("\\$"):
        body, anchored_end = body[:-1], True
    try:
        ast = _Parser(body).parse()
    except (ValueError, IndexError) as exc:
        raise ValueError(f"json_schema: pattern {pattern!r} at {where}: {exc}") from None
    if (anchored_start or anchored_end) and _top_alternation(body):
        raise ValueError(f"json_schema: pattern {pattern!r} at {where}: an anchor beside a top-level '|' is not "
                         "supported; group the alternatives: ^(?:a|b)$")
    anything = N.rep(ANY_CHAR)
    return N.cat(N.EMPTY if anchored_start else anything, map_sets(ast), N.EMPTY if anchored_end else anything)


def _top_alternation(body):
    depth, i = 0, 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            j = body.find("]", i + 2)
            i = (j if j > 0 else len(body)) + 1
            continue
        depth += c == "("
        depth -= c == ")"
        if c == "|" and depth == 0:
            return True
        i += 1
    return False


def format_ast(name):
    """The characters of a `format` (FORMATS' regex), each in every JSON spelling."""
    return map_sets(_Parser(FORMATS[name]).parse())


def map_sets(node):
    """The regex AST with each character set turned into the JSON spellings of its characters."""
    kind = node[0]
    if kind == "set":
        return json_char(node[1])
    if kind in ("cat", "alt"):
        return (kind, [map_sets(n) for n in node[1]])
    if kind == "rep":
        return ("rep", map_sets(node[1]), node[2], node[3])
    return node


def number_ast(lo, lo_excl, hi, hi_excl, integer, where):
    """Numbers (or integers) within the bounds (None: unbounded)."""
    sign = N.opt(N.lit("-"))
    digits = N.chars(((48, 57),))
    if integer:
        if lo is not None:
            lo = math.floor(lo) + 1 if lo_excl and float(lo).is_integer() else math.ceil(lo)
        if hi is not None:
            hi = math.ceil(hi) - 1 if hi_excl and float(hi).is_integer() else math.floor(hi)
        if lo is None and hi is None:
            return N.cat(sign, N.decimal_range(0, None))
        branches = [N.lit("-0")] if (lo is None or lo <= 0) and (hi is None or hi >= 0) else []
        if hi is None or hi >= 0:
            branches.append(N.decimal_range(max(lo, 0) if lo is not None else 0, hi))
        if lo is None or lo < 0:                        # -x for x in [max(1, -hi), -lo]
            top = None if lo is None else -lo
            bottom = 1 if hi is None or hi >= 0 else -hi
            if top is None or bottom <= top:
                branches.append(N.cat(N.lit("-"), N.decimal_range(bottom, top)))
        return N.alt(*branches) if branches else N.NOTHING
    frac_any = N.opt(N.cat(N.lit("."), N.rep(digits, 1)))
    if lo is None and hi is None:
        exp = N.opt(N.cat(N.chars(((69, 69), (101, 101))), N.opt(N.chars(((43, 43), (45, 45)))), N.rep(digits, 1)))
        return N.cat(sign, N.decimal_range(0, None), frac_any, exp)
    for b in (lo, hi):
        if b is not None and not float(b).is_integer():
            raise ValueError(f"json_schema: a number's bound {b} at {where} is not an integer: only integer bounds "
                             "are supported on numbers (integers may have any bounds)")
    frac = {"any": frac_any, "zero": N.opt(N.cat(N.lit("."), N.rep(N.lit("0"), 1))),
            "nonzero": N.cat(N.lit("."), N.rep(digits), N.chars(((49, 57),)), N.rep(digits))}

    def pieces(rel, a):                                 # u = I + f >= 0 under one condition: [(Ilo, Ihi, frac)]
        a = int(a)
        if rel == "at least":
            return [(0, None, "any")] if a <= 0 else [(a, None, "any")]
        if rel == "above":
            return [(0, None, "any")] if a < 0 else [(a + 1, None, "any"), (a, a, "nonzero")]
        if rel == "at most":
            return [] if a < 0 else [(0, a - 1, "any"), (a, a, "zero")] if a > 0 else [(0, 0, "zero")]
        return [] if a <= 0 else [(0, a - 1, "any")]

    def meet(ps, qs):
        out = []
        for a, b, f in ps:
            for c, d, g in qs:
                x, y = max(a, c), (b if d is None else d if b is None else min(b, d))
                h = f if g == "any" else g if f == "any" else f if f == g else None
                if h is not None and (y is None or x <= y):
                    out.append((x, y, h))
        return out

    branches = []
    for negative in (False, True):                      # the value is u, or -u written with a minus
        conds = [(0, None, "any")]
        if lo is not None:
            rel = ("above" if lo_excl else "at least") if not negative else ("below" if lo_excl else "at most")
            conds = meet(conds, pieces(rel, -lo if negative else lo))
        if hi is not None:
            rel = ("above" if hi_excl else "at least") if negative else ("below" if hi_excl else "at most")
            conds = meet(conds, pieces(rel, -hi if negative else hi))
        for a, b, f in conds:
            branches.append(N.cat(N.lit("-") if negative else N.EMPTY, N.decimal_range(a, b), frac[f]))
    return N.alt(*branches) if branches else N.NOTHING


def number_literal(v):
    """The number v in its decimal spellings (JSON Schema compares numbers by value: 2, 2.0 and 2.00 are one):
    the digits, then any number of trailing zeros in a fraction; no exponent."""
    import decimal
    text = format(decimal.Decimal(repr(v)), "f")
    sign, text = ("-", text[1:]) if text.startswith("-") else ("", text)
    whole, _, frac = text.partition(".")
    frac = frac.rstrip("0")
    zeros = N.rep(N.lit("0"))
    tail = N.cat(N.lit("." + frac), zeros) if frac else N.opt(N.cat(N.lit("."), N.rep(N.lit("0"), 1)))
    spelled = N.cat(N.lit(whole), tail)
    if sign:
        return N.cat(N.lit("-"), spelled)
    return N.alt(N.cat(N.lit("-"), spelled), spelled) if whole == "0" and not frac else spelled   # (-0 is 0)
