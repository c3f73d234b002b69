"""How many of torch's public names tinyllm has, by the same name at the same place (issue 43).

    python bench/torch_names.py            # the table: namespace, torch's count, shared, share %
    python bench/torch_names.py --missing  # and, per namespace, torch's names tinyllm lacks

Counted per namespace, torch's against tinyllm's:
  torch                 top-level functions (torch.X)         tinyllm.X
  torch.Tensor          methods (properties left out)         tinyllm.Tensor.X
  torch.nn.functional   functions                             tinyllm.nn.functional.X
  torch.linalg          functions                             tinyllm.linalg.X
A torch name counts when it is public (no leading underscore), callable, and neither a class nor a module, and,
outside torch.Tensor, is the namespace's own: a C builtin, or a Python function whose __module__ is torch's (so
typing.Optional, imported into torch.nn.functional, is left out). It is shared when tinyllm has a callable of
that name at the same place. Names alone: a shared name may take fewer arguments than torch's.
"""
import argparse
import inspect
import os
import sys

import torch
import torch.nn.functional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tinyllm  # noqa: E402
import tinyllm.nn.functional  # noqa: E402

NAMESPACES = [("torch", torch, tinyllm), ("torch.Tensor", torch.Tensor, tinyllm.Tensor),
              ("torch.nn.functional", torch.nn.functional, tinyllm.nn.functional),
              ("torch.linalg", torch.linalg, tinyllm.linalg)]


def torch_names(space, is_class):
    """torch's public callables in `space` (a module or torch.Tensor), as above."""
    names = set()
    for name in dir(space):
        if name.startswith("_"):
            continue
        value = inspect.getattr_static(space, name) if is_class else getattr(space, name)
        if is_class:
            if isinstance(value, (property, type)) or not callable(getattr(space, name)) or \
                    type(value).__name__ == "getset_descriptor":
                continue
        elif not callable(value) or inspect.isclass(value) or inspect.ismodule(value) or \
                not (inspect.isbuiltin(value) or str(getattr(value, "__module__", "")).startswith("torch")):
            continue
        names.add(name)
    return names


def shared(names, ours):
    return {n for n in names if callable(getattr(ours, n, None))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--missing", action="store_true", help="list torch's names tinyllm lacks, per namespace")
    args = ap.parse_args()
    rows, missing = [], {}
    for label, space, ours in NAMESPACES:
        names = torch_names(space, inspect.isclass(space))
        have = shared(names, ours)
        rows.append((label, len(names), len(have)))
        missing[label] = sorted(names - have)
    total = (sum(r[1] for r in rows), sum(r[2] for r in rows))
    print(f"torch {torch.__version__}; tinyllm at {os.path.dirname(tinyllm.__file__)}\n")
    print("| namespace | torch | shared | share |")
    print("|---|---|---|---|")
    for label, n, k in rows + [("all four", *total)]:
        print(f"| {label} | {n} | {k} | {100 * k / n:.1f}% |")
    if args.missing:
        for label, names in missing.items():
            print(f"\n{label}: {len(names)} missing\n  " + " ".join(names))


if __name__ == "__main__":
    main()
