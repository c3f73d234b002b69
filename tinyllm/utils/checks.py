"""Argument checks shared across the library, each a clear error naming the function, the argument and its value."""
import numbers


def whole_number(fn, what, value, least=0, hint=""):
    """`value` as a count: an int (a NumPy one too) >= least, or a ValueError naming fn, what and the value (a
    bool, a float such as 2.5 or 2.0, a string or None is refused: none is a count)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        want = "a positive int" if least == 1 else f"a whole number >= {least}"
        raise ValueError(f"{fn}: {what} must be {want}, got {value!r}{hint}")
    return value
