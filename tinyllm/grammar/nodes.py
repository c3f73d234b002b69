"""Building blocks of grammar bodies, shared by the front ends: the regex AST of regex_dfa.py over code-point
ranges, plus ("ref", rule) calls and ("list", [(node, optional, repeated)], separator) sequences (JSON members)."""
EMPTY = ("cat", [])                # the empty string
NOTHING = ("alt", [])              # no string at all


def chars(ranges):
    """One character in the code-point ranges ((lo, hi) inclusive, sorted, no surrogates)."""
    return ("set", tuple(ranges))


def lit(text):
    return ("cat", [("set", ((ord(c), ord(c)),)) for c in text])


def cat(*nodes):
    return ("cat", list(nodes))


def alt(*nodes):
    return nodes[0] if len(nodes) == 1 else ("alt", list(nodes))


def rep(node, lo=0, hi=None):
    return ("rep", node, lo, hi)


def opt(node):
    return ("rep", node, 0, 1)


def ref(name):
    return ("ref", name)


def intersect(ranges, lo, hi):
    """The part of the sorted code-point ranges inside [lo, hi]."""
    return tuple((max(a, lo), min(b, hi)) for a, b in ranges if a <= hi and b >= lo)


def subtract(ranges, remove):
    """The sorted code-point ranges without the code points in the sorted ranges `remove`."""
    out = []
    for a, b in ranges:
        for c, d in remove:
            if d < a or c > b:
                continue
            if c > a:
                out.append((a, c - 1))
            a = max(a, d + 1)
            if a > b:
                break
        if a <= b:
            out.append((a, b))
    return tuple(out)


def digit_sequences(lo, hi, width, base):
    """Split the numbers [lo, hi] written with `width` digits in `base` into sequences of per-digit ranges
    [(dlo, dhi), ...] (each sequence the numbers whose digits fall in its ranges; leading zeros included)."""
    out, stack = [], [((), lo, hi, width)]
    while stack:
        head, lo, hi, width = stack.pop()
        if width == 1:
            out.append(list(head) + [(lo, hi)])
            continue
        p = base ** (width - 1)
        a, b = divmod(lo, p)
        c, d = divmod(hi, p)
        if a == c:
            stack.append((head + ((a, a),), b, d, width - 1))
            continue
        if b:
            stack.append((head + ((a, a),), b, p - 1, width - 1))
            a += 1
        if d != p - 1:
            stack.append((head + ((c, c),), 0, d, width - 1))
            c -= 1
        if a <= c:
            out.append(list(head) + [(a, c)] + [(0, base - 1)] * (width - 1))
    return out


def decimal_range(lo, hi):
    """Non-negative integers in [lo, hi] (hi None: unbounded) in decimal without leading zeros."""
    def digits(dlo, dhi):
        return chars(((48 + dlo, 48 + dhi),))
    branches, w = [], 1
    top = len(str(lo)) if hi is None else len(str(hi))
    while w <= top:
        a, b = (0 if w == 1 else 10 ** (w - 1)), 10 ** w - 1
        x, y = max(lo, a), b if hi is None else min(hi, b)
        if x <= y:
            for seq in digit_sequences(x, y, w, 10):
                branches.append(cat(*(digits(p, q) for p, q in seq)))
        w += 1
    if hi is None:                                      # every number longer than the bound's digits
        branches.append(cat(digits(1, 9), rep(digits(0, 9), top)))
    return alt(*branches) if branches else NOTHING
