"""Op names written as strings in tinyllm's source are registered ops: a misspelled one would silently never match.
Passes and runtimes that list ops go through checked names (tinyllm.ops.names, rewrite.Pat, Kernels.register, the
renderers' template tables), which raise at import; this test reads the rest of the source: comparisons with a
node's op and build(...) calls."""
import ast
import importlib
import os

import pytest

import tinyllm  # noqa: F401  (registers the primitives)
from tinyllm.graph import OPS
from tinyllm.ops import names
from tinyllm.ops.kernel import INSTRUCTIONS
from tinyllm.rewrite import Pat
from tinyllm.runtime.base import Kernels
from tinyllm.runtime.cstyle import CStyleLanguage

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tinyllm")


def _is_op_expr(node):
    """`x.op` or a name `op`: what holds an op name in the source."""
    return (isinstance(node, ast.Attribute) and node.attr == "op") or (isinstance(node, ast.Name) and node.id == "op")


def _strings(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def written_op_names():
    """(file, line, name) for each op name in a comparison with `.op`/`op`, or the first argument of build()."""
    found = []
    for folder, _, files in os.walk(ROOT):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(folder, f)
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read(), path)
            for node in ast.walk(tree):
                if isinstance(node, ast.Compare) and len(node.ops) == 1 and \
                        isinstance(node.ops[0], (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                    left, right = node.left, node.comparators[0]
                    if _is_op_expr(left):
                        found += [(path, node.lineno, s) for s in _strings(right)]
                    elif _is_op_expr(right):
                        found += [(path, node.lineno, s) for s in _strings(left)]
                elif isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == \
                        "build" and node.args:
                    found += [(path, node.lineno, s) for s in _strings(node.args[0])]
    return found


def test_the_source_reads_op_names_at_all():
    """The scan finds what it looks for (hundreds of names), so the next test cannot pass by finding nothing."""
    assert len(written_op_names()) > 200


def test_every_op_name_written_in_the_source_is_registered():
    bad = [f"{os.path.relpath(p, ROOT)}:{line}: {name!r}" for p, line, name in written_op_names()
           if name not in OPS and name not in INSTRUCTIONS]
    assert not bad, "op names that are not registered ops (tinyllm/ops/):\n" + "\n".join(bad)


@pytest.mark.parametrize("module", ["tinyllm.runtime.c.render", "tinyllm.runtime.wgsl.render"])
def test_the_renderers_op_tables_name_registered_ops(module):
    """A renderer's tables by op (dicts, in the module or on its classes, whose keys are upper-case names) name
    registered ops only."""
    mod = importlib.import_module(module)
    places = [vars(mod)] + [vars(c) for c in vars(mod).values() if isinstance(c, type) and c.__module__ == module]
    tables = {k: v for place in places for k, v in place.items() if isinstance(v, dict) and v and
              all(isinstance(key, str) and key.isupper() for key in v)}
    assert tables, f"{module}: no op table found"
    bad = {k: sorted(set(v) - set(OPS)) for k, v in tables.items() if set(v) - set(OPS)}
    assert not bad, f"{module}: op tables naming unregistered ops: {bad}"


def test_checked_names_raise_at_once_on_a_misspelling():
    with pytest.raises(NameError, match="'ADDD'"):
        names("ADD", "ADDD")
    with pytest.raises(NameError, match="'MATMULL'"):
        Pat("MATMULL")
    with pytest.raises(NameError, match="'RESHAPED'"):
        Kernels("test").register("RESHAPED")
    with pytest.raises(NameError, match="'EXPP'"):
        type("Misspelled", (CStyleLanguage,), {"unary": {"EXPP": "exp({0})"}})
