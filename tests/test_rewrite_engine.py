"""The rewrite engine: pattern matching, fixed points, loop and runaway detection, realized nodes as leaves, tracing;
and the graph export (tinyllm/rewrite/engine.py, viz.py). The passes are tested in test_rewrite.py."""
import os
import stat

import numpy as np
import pytest

import tinyllm as tl
from tinyllm import dtype as dt
from tinyllm.graph import build, const, toposort
from tinyllm.rewrite import Pat, PatternMatcher, graph_rewrite, tracing
from tinyllm.rewrite import engine
from tinyllm.rewrite.simplify import simplify
from tinyllm.rewrite.viz import save_graph, to_dot
from tinyllm.runtime import get as get_runtime
from tinyllm.schedule import Schedule


def leaf(*shape, seed=0):
    return tl.tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32)).node


def fired_rules(fired, pass_name=None):
    return {f.rule for f in fired if pass_name is None or f.pass_name == pass_name}


def evaluate(node):
    """The node's value on the NumPy runtime, the graph run exactly as built (no passes)."""
    return get_runtime("numpy").execute(Schedule([node]))[0].numpy()


# ---- the engine ---------------------------------------------------------------------------------------------

def test_pattern_matches_op_arg_dtype_and_sources():
    a = leaf(3)
    two = const(2.0, (3,))
    y = a * two
    assert list(Pat("MUL").match(y, {}))
    assert not list(Pat("ADD").match(y, {}))
    assert list(Pat({"ADD", "MUL"}, dtype=dt.float32).match(y, {}))
    assert not list(Pat("MUL", dtype=dt.float64).match(y, {}))
    assert list(Pat("CONST", arg=2.0).match(two, {}))
    assert not list(Pat("CONST", arg=3.0).match(two, {}))
    assert list(Pat("CONST", arg=lambda v: v > 1).match(two, {}))
    (caps,) = Pat("MUL", src=(Pat(name="x"), Pat("CONST", name="c")), name="m").match(y, {})
    assert caps == {"x": a, "c": two, "m": y}
    assert not list(Pat("MUL", src=(Pat("CONST"), Pat())).match(y, {}))  # wrong order, not commutative
    assert not list(Pat("MUL", src=(Pat(),)).match(y, {}))  # wrong number of sources


def test_capture_used_twice_must_be_the_same_node():
    a, b = leaf(3, seed=1), leaf(3, seed=2)
    double = Pat("ADD", src=(Pat(name="x"), Pat(name="x")))
    assert [c["x"] for c in double.match(a + a, {})] == [a]
    assert not list(double.match(a + b, {}))


def test_commutative_matching_backtracks_into_the_swapped_order():
    a, b = leaf(3, seed=1), leaf(3, seed=2)
    # (x*y) + x: on (a*b) + b the inner product must be read as b*a, which only a full search finds
    pat = Pat("ADD", src=(Pat("MUL", src=(Pat(name="x"), Pat(name="y")), commutative=True), Pat(name="x")))
    assert [(c["x"], c["y"]) for c in pat.match((a * b) + b, {})] == [(b, a)]
    assert [(c["x"], c["y"]) for c in pat.match((a * b) + a, {})] == [(a, b)]
    assert not list(Pat("ADD", src=(Pat("MUL", src=(Pat(name="x"), Pat(name="y"))), Pat(name="x")))
                    .match((a * b) + b, {}))
    assert len(list(Pat("MUL", src=(Pat(name="x"), Pat(name="y")), commutative=True).match(a * b, {}))) == 2


def test_first_rule_that_returns_a_node_wins_and_none_means_no_change():
    a = leaf(3)
    def decline(x): return None
    def first(x): return x.src[0].exp()
    def second(x): return build("TANH", x.src[0])  # any unary op becomes TANH (TANH itself is then unchanged)
    pm = PatternMatcher([(Pat("NEG", name="x"), decline), (Pat("NEG", name="x"), first),
                         (Pat(name="x", src=(Pat(),)), second)])
    with tracing() as fired:
        (out,) = graph_rewrite([-a], pm, "order")
    assert out is build("TANH", a)
    assert [(f.pass_name, f.rule, f.op) for f in fired] == [("order", "first", "NEG"), ("order", "second", "EXP")]


def test_replacements_are_rewritten_to_a_fixed_point_in_one_call():
    a = leaf(3)
    tanh = build("TANH", a)
    def neg_to_triple(x): return -(-(-x.src[0].exp()))  # builds new nodes that the other rule must clean up
    def double_neg(x): return x
    pm = PatternMatcher([(Pat("TANH", name="x"), neg_to_triple),
                         (Pat("NEG", src=(Pat("NEG", src=(Pat(name="x"),)),)), double_neg)])
    with tracing() as fired:
        (out,) = graph_rewrite([tanh * 2.0], pm)
    assert out is (-(a.exp())) * 2.0
    assert fired_rules(fired) == {"neg_to_triple", "double_neg"}
    with tracing() as again:
        assert graph_rewrite([out], pm)[0] is out
    assert again == []


def test_deep_graphs_need_no_recursion():
    a = leaf(3)
    n = a
    for _ in range(30000):  # far deeper than Python's recursion limit
        n = -n
    assert graph_rewrite([n], simplify)[0] is a
    m = a
    for i in range(20000):
        m = m.exp() if i % 2 else build("TANH", m)
    assert graph_rewrite([m], simplify)[0] is m


def test_ping_pong_rules_raise_naming_the_pass_and_rules():
    a, b = leaf(3, seed=1), leaf(3, seed=2)
    def to_exp(x): return x.src[0].exp()
    def to_neg(x): return -x.src[0]
    pm = PatternMatcher([(Pat("NEG", name="x"), to_exp), (Pat("EXP", name="x"), to_neg)])
    with pytest.raises(RuntimeError, match=r"pass pingpong: rewrite loop: rules (to_exp -> to_neg|to_neg -> to_exp)"):
        graph_rewrite([(-a) + b], pm, "pingpong")
    # a rule whose result contains the node it rewrites would rewrite forever too
    def wrap(x): return -(-x) if x.op == "EXP" else None
    def unwrap(x): return x
    pm = PatternMatcher([(Pat("EXP", name="x"), wrap), (Pat("NEG", src=(Pat("NEG", src=(Pat(name="x"),)),)), unwrap)])
    with pytest.raises(RuntimeError, match=r"pass wrapper: rewrite loop: rule"):
        graph_rewrite([a.exp()], pm, "wrapper")


def test_a_rule_that_never_settles_raises_naming_it():
    def bump(c): return -const(c.arg + 1.0, c.shape)  # a new constant every time: no node repeats
    pm = PatternMatcher([(Pat("NEG", src=(Pat("CONST", name="c"),)), bump)])
    with pytest.raises(RuntimeError, match=r"pass runaway: no fixed point .* bump"):
        graph_rewrite([-const(0.0, (2,))], pm, "runaway")


def test_rules_must_keep_shape_and_dtype():
    a = leaf(2, 3)
    def bad(x): return x.src[0].sum((1,))
    with pytest.raises(RuntimeError, match="pass shapes: rule bad"):
        graph_rewrite([a.exp()], PatternMatcher([(Pat("EXP", name="x"), bad)]), "shapes")


def test_realized_nodes_are_leaves():
    x = tl.randn(3, requires_grad=True)
    y = -x
    y.realize()
    assert y.node.op == "NEG" and y.node.buffer is not None
    seen = []
    def spy(n):
        seen.append(n)
    pm = PatternMatcher([(Pat(name="n"), spy)] + simplify.rules)
    z = -y.node
    with tracing() as fired:
        (out,) = graph_rewrite([z], pm)
    assert out is z  # NEG(NEG(x)) would fold, but the inner NEG is realized: its value is read, not recomputed
    assert "double_neg" not in fired_rules(fired)
    assert seen == [z]  # nothing at or under the realized node was offered to a rule
    assert graph_rewrite([y.node], pm)[0] is y.node
    np.testing.assert_array_equal((-y).numpy(), x.numpy())


def test_tracing_records_rules_and_nests(monkeypatch, capsys):
    a = leaf(3)
    with tracing() as outer:
        with tracing() as inner:
            graph_rewrite([-(-a)], simplify, "s1")
        graph_rewrite([a * 1.0], simplify, "s2")
    assert [(f.pass_name, f.rule, f.op) for f in inner] == [("s1", "double_neg", "NEG")]
    assert ("s2", "mul_one", "MUL") in [(f.pass_name, f.rule, f.op) for f in outer]
    assert len(outer) > len(inner)
    # without TINYLLM_DEBUG nothing is kept globally; with it, realize reports the rules that fired
    monkeypatch.delenv("TINYLLM_DEBUG", raising=False)
    before = len(engine.trace)
    graph_rewrite([-(-a)], simplify)
    assert len(engine.trace) == before
    monkeypatch.setenv("TINYLLM_DEBUG", "1")
    (-(-tl.randn(3))).numpy()
    assert "simplify.double_neg×1" in capsys.readouterr().out


# ---- graph export ---------------------------------------------------------------------------------------

def test_to_dot_labels_every_node_and_edge():
    x = tl.randn(2, 3, requires_grad=True)
    y = (x.exp() * 2.0).sum(1).to(tl.float64)
    text = to_dot(y)
    nodes = toposort([y.node])
    assert text.startswith('digraph "tinyllm" {') and text.rstrip().endswith("}")
    assert text.count("->") == sum(len(n.src) for n in nodes)
    for n in nodes:
        assert f'label="{n.op}' in text
        assert f"{n.shape} {n.dtype.name}" in text
    assert "float64" in text and "CAST\\nfloat64" in text
    assert text.count("peripheries=2") == 1
    assert to_dot([y, x]).count("peripheries=2") == 2


def test_to_dot_quotes_labels():
    c = const(0.5, (2,))
    text = to_dot(build("CAST", c, arg=dt.int64))
    assert '"CONST\\n0.5\\n(2,) float32"' in text
    assert all(line.count('"') % 2 == 0 for line in text.splitlines())


def _fake_dot(tmp_path, monkeypatch, script):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "dot"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")


def test_save_graph_writes_dot_and_svg_atomically(tmp_path, monkeypatch):
    y = tl.randn(2, 2).exp()
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert save_graph(str(tmp_path / "g.svg"), y) == [str(tmp_path / "g.dot")]  # no `dot`: .dot only
    assert (tmp_path / "g.dot").read_text() == to_dot(y)
    _fake_dot(tmp_path, monkeypatch, 'while [ "$1" != "-o" ]; do shift; done\necho "<svg/>" > "$2"\n')
    written = save_graph(str(tmp_path / "h"), [y], y.exp())
    assert written == [str(tmp_path / "h.dot"), str(tmp_path / "h.svg")]
    assert (tmp_path / "h.svg").read_text() == "<svg/>\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "g.dot", "h.dot", "h.svg"]  # no temp files


def test_save_graph_leaves_no_partial_file_when_dot_fails(tmp_path, monkeypatch):
    _fake_dot(tmp_path, monkeypatch, 'while [ "$1" != "-o" ]; do shift; done\necho half > "$2"\nexit 3\n')
    with pytest.raises(Exception):
        save_graph(str(tmp_path / "g.dot"), tl.randn(2).exp())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "g.dot"]
