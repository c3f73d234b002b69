"""The generated docs are current: docs/ops.md is what docs/make_ops.py writes from the op classes."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _script(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "docs", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ops_md_is_generated_from_the_op_classes():
    stale = _script("make_ops").stale()
    assert stale is None, f"{stale}: run `python docs/make_ops.py`"
