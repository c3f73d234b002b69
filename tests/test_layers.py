"""The layer contract (docs/architecture.md, "Layers"), checked over tinyllm's import graph: every import, at module
level or inside a function, goes from a module to one in its own layer or a lower one, and no modules import each
other in a loop. The graph is read from the source (ast), so an import that only runs on some path counts too.
"""
import ast
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Bottom to top. A module belongs to the first layer with an entry that names it or a package above it; the
# package `tinyllm` itself (its __init__, what `import tinyllm` gives) is the top.
LAYERS = [
    ("base", ["tinyllm._kernels", "tinyllm.env", "tinyllm.dtype", "tinyllm.weak", "tinyllm.process_group",
              "tinyllm.autocast_mode", "tinyllm.utils.files", "tinyllm.utils.progress",
              "tinyllm.utils.checks", "tinyllm.random"]),
    ("graph", ["tinyllm.graph"]),
    ("ops", ["tinyllm.ops", "tinyllm.views"]),
    ("autograd", ["tinyllm.autograd"]),
    ("rewrite", ["tinyllm.rewrite"]),
    ("schedule", ["tinyllm.schedule"]),
    ("runtime", ["tinyllm.runtime"]),
    ("realize", ["tinyllm.realizer", "tinyllm.replay.record"]),
    ("tensor", ["tinyllm.mixins", "tinyllm.tensor"]),
    ("front", ["tinyllm.factory", "tinyllm.einsum", "tinyllm.functions", "tinyllm.gradcheck", "tinyllm.replay",
               "tinyllm.linalg", "tinyllm.complex"]),
    ("library", ["tinyllm.nn", "tinyllm.optim", "tinyllm.amp", "tinyllm.quantization", "tinyllm.sampling",
                 "tinyllm.utils"]),
    ("models", ["tinyllm.models"]),
    ("applications", ["tinyllm.distributed", "tinyllm.tokenizer", "tinyllm.interp", "tinyllm.grammar",
                      "tinyllm.continual", "tinyllm.tune", "tinyllm.export"]),
]

# (importer, imported): allowed against the contract, each with its reason. Keep this short.
EXCEPTIONS = {}


def modules(root=ROOT):
    """{module name: path} for every module of the package under `root`."""
    out = {}
    for folder, _, files in os.walk(os.path.join(root, "tinyllm")):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                name = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                out[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
    return out


def imports(mods):
    """{module: [(imported module, line)]}: what each module imports of tinyllm, `from x import y` counted as an
    import of x.y where that is a module, else of x."""
    graph = {}
    for name, path in mods.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "tinyllm"]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] != "tinyllm":
                    continue
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    found.append((sub if sub in mods or sub == "tinyllm._kernels" else target, node.lineno))
        graph[name] = [(t, line) for t, line in found if t != name]
    return graph


def layer_of(module):
    if module == "tinyllm":
        return len(LAYERS), "package"
    best = None
    for i, (layer, entries) in enumerate(LAYERS):
        for entry in entries:
            if module == entry or module.startswith(entry + "."):
                if best is None or len(entry) > best[2]:
                    best = (i, layer, len(entry))
    return (best[0], best[1]) if best else (None, None)


def test_every_module_has_a_layer():
    missing = sorted(m for m in modules() if layer_of(m)[0] is None)
    assert not missing, f"modules in no layer of tests/test_layers.py's LAYERS: {missing}; add each to its layer"


def upward_imports(root=ROOT):
    """'file:line: ...' for each import from a lower layer to a higher one."""
    mods = modules(root)
    bad = []
    for importer, targets in imports(mods).items():
        i, layer = layer_of(importer)
        for target, line in targets:
            j, target_layer = layer_of(target)
            if j is not None and j > i and (importer, target) not in EXCEPTIONS:
                bad.append(f"{mods[importer]}:{line}: {importer} ({layer}) imports {target} ({target_layer}), "
                           "a higher layer")
    return bad


def import_loops(root=ROOT):
    """Each cycle among modules, described by its imports: Tarjan's strongly connected components, iteratively."""
    mods = modules(root)
    found = imports(mods)
    graph = {m: sorted({t for t, _ in targets if t in mods}) for m, targets in found.items()}
    lines = {(m, t): line for m, targets in found.items() for t, line in targets}
    index, low, on_stack, stack, loops, counter = {}, {}, set(), [], [], [0]
    for root_module in graph:
        if root_module in index:
            continue
        work = [(root_module, iter(graph[root_module]))]
        index[root_module] = low[root_module] = counter[0]
        counter[0] += 1
        stack.append(root_module)
        on_stack.add(root_module)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(graph[w])))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    if len(component) > 1:
                        loops.append(sorted(component))
    return [f"loop among {', '.join(c)}:\n" + "\n".join(f"  {a} -> {b} ({mods[a]}:{lines[(a, b)]})"
                                                         for a in c for b in graph[a] if b in c) for c in loops]


def test_no_import_goes_up_a_layer():
    bad = upward_imports()
    assert not bad, "imports from a lower layer to a higher one (docs/architecture.md, Layers):\n" + "\n".join(bad)


def test_no_import_loops():
    loops = import_loops()
    assert not loops, f"{len(loops)} import loop(s):\n" + "\n".join(loops)


def test_the_checks_find_an_upward_import_and_a_loop(tmp_path):
    """The two checks above on a made-up package: a base module that imports the tensor layer, inside a function,
    and two ops modules that import each other, each named with its file and line."""
    package = tmp_path / "tinyllm"
    (package / "ops").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "tensor.py").write_text("")
    (package / "dtype.py").write_text("def f():\n    from .tensor import Tensor\n")
    (package / "ops" / "__init__.py").write_text("")
    (package / "ops" / "a.py").write_text("from . import b\n")
    (package / "ops" / "b.py").write_text("import numpy\nfrom .a import x\n")
    up = upward_imports(str(tmp_path))
    assert len(up) == 1 and "dtype.py:2: tinyllm.dtype (base) imports tinyllm.tensor (tensor)" in up[0], up
    loops = import_loops(str(tmp_path))
    assert len(loops) == 1 and "tinyllm.ops.a -> tinyllm.ops.b" in loops[0] and "b.py:2" in loops[0], loops


def test_the_architecture_doc_draws_these_layers():
    """docs/architecture.md's layer table lists LAYERS, bottom to top, as the test enforces them."""
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
        doc = f.read()
    rows = re.findall(r"^\| (\w+) +\| (.+?) +\|$", doc.split("## Layers", 1)[-1].split("\n## ", 1)[0], re.M)
    drawn = [(layer, sorted(m.strip(" `") for m in modules_.split(","))) for layer, modules_ in rows
             if layer not in ("layer",)]
    wanted = [(layer, sorted(e.replace("tinyllm.", "", 1) for e in entries)) for layer, entries in LAYERS]
    assert drawn == wanted, ("docs/architecture.md's Layers table differs from tests/test_layers.py's LAYERS:\n"
                             f"doc:  {drawn}\ntest: {wanted}")
