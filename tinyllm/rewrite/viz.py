"""Graph export: `to_dot` writes the graph behind some tensors or nodes as Graphviz DOT; `save_graph` saves it
as .dot, and as .svg too when Graphviz's `dot` program is installed.

    from tinyllm.rewrite.viz import save_graph
    save_graph("/tmp/loss", loss)   # /tmp/loss.dot (+ /tmp/loss.svg)
"""
import os
import shutil
import subprocess
import tempfile

from ..graph import Node, toposort

COLORS = {"LOAD": "lightblue", "CONST": "lightgrey", "SUM": "khaki", "REDUCE_MAX": "khaki", "MATMUL": "salmon",
          "RESHAPE": "palegreen", "PERMUTE": "palegreen", "EXPAND": "palegreen", "SHRINK": "palegreen",
          "PAD": "palegreen", "CAT": "palegreen", "CHECKPOINT": "orchid"}


def _nodes(roots):
    """Nodes from a Tensor, a Node, or (nested) lists and tuples of them."""
    if isinstance(roots, (list, tuple)):
        return [n for r in roots for n in _nodes(r)]
    return [roots if isinstance(roots, Node) else roots.node]


def _short(arg, width=24):
    if arg is None:
        return ""
    text = "buffer" if hasattr(arg, "runtime") else getattr(arg, "name", None) or repr(arg)
    return text if len(text) <= width else text[:width - 1] + "…"


def _quote(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(roots, name="tinyllm"):
    """DOT text of the graph under `roots` (a Tensor, a Node or lists of them). Each node shows its op,
    argument, shape and dtype; realized nodes are drawn as leaves (bold), the roots with a double border."""
    roots = _nodes(roots)
    order, root_set = toposort(roots, stop=lambda n: n.buffer is not None), set(roots)
    ids = {n: f"n{i}" for i, n in enumerate(order)}
    lines = [f"digraph {_quote(name)} {{", "  rankdir=BT;", '  node [shape=box, style=filled, fontname="monospace"];']
    for n in order:
        label = "\n".join(p for p in (n.op, _short(n.arg), f"{n.shape} {n.dtype.name}") if p)
        attrs = [f"label={_quote(label)}", f"fillcolor={COLORS.get(n.op, 'white')}"]
        if n.buffer is not None:
            attrs.append('style="filled,bold"')
        if n in root_set:
            attrs.append("peripheries=2")
        lines.append(f"  {ids[n]} [{', '.join(attrs)}];")
    for n in order:
        if n.buffer is None:
            for i, s in enumerate(n.src):
                lines.append(f"  {ids[s]} -> {ids[n]}" + (f" [label={i}]" if len(n.src) > 1 else "") + ";")
    return "\n".join(lines + ["}"]) + "\n"


def _atomic(path, make):
    """Run make(tmp) to produce the file at a temporary name beside `path`, then rename it into place."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tmp-")
    os.close(fd)
    try:
        make(tmp)
        os.chmod(tmp, 0o644)  # mkstemp makes it private
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _write(text):
    def make(tmp):
        with open(tmp, "w") as f:
            f.write(text)
    return make


def save_graph(path, *roots, svg=True):
    """Save the graph under `roots` (tensors, nodes or lists of them) as `path`.dot, and as `path`.svg too when
    `svg` is set and Graphviz's `dot` is installed; `path` may end in .dot, .svg or nothing. Each file is written
    under a temporary name and renamed into place, so no reader sees half a file. Returns the paths written."""
    base = path[:-4] if path.endswith((".dot", ".svg")) else path
    written = [base + ".dot"]
    _atomic(written[0], _write(to_dot(list(roots))))
    exe = shutil.which("dot")
    if svg and exe:
        written.append(base + ".svg")
        _atomic(written[1], lambda tmp: subprocess.run([exe, "-Tsvg", written[0], "-o", tmp], check=True,
                                                       capture_output=True, timeout=60))
    return written
