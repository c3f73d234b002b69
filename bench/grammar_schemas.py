"""JSON-schema grammars on the corpus of tests/data/json_schemas/ (issue 45): how many schemas compile, how many of
their valid instances the grammar accepts (should be all) and how many invalid ones (should be none), by source;
then why the others did not compile (by the keyword the error names) and the failures, a few of each kind.

    python bench/grammar_schemas.py                 # every schema
    python bench/grammar_schemas.py --fast          # the subset tests/test_grammar_schemas.py runs unmarked
    python bench/grammar_schemas.py --show 20       # up to 20 examples of each failure kind (default 3)

Instances are fed to the matcher byte by byte and in a greedy multi-byte tokenization (the test's JsonTokenizer),
then end of text; a valid one counts as accepted when both feeds are, an invalid one as accepted when either is."""
import argparse
import collections
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
from test_grammar_schemas import fast_subset, load, not_compiled, sweep, table  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fast", action="store_true", help="only the test's unmarked subset")
    ap.add_argument("--show", type=int, default=3, help="examples of each failure kind")
    args = ap.parse_args()
    rows = load()
    if args.fast:
        rows = fast_subset(rows)
    t0 = time.perf_counter()
    results = sweep(rows)
    seconds = time.perf_counter() - t0
    print(f"| source | schemas | compiled | valid accepted | invalid accepted |\n|---|---:|---:|---:|---:|")
    for source, n, compiled, vok, v, iok, i in table(results):
        name = f"**{source}**" if source == "total" else source
        print(f"| {name} | {n} | {compiled} ({100 * compiled / n:.0f} %) | {vok} / {v} | {iok} / {i} |")
    print(f"\n{len(rows)} schemas in {seconds:.1f} s (compile and feeding; the slowest compile: "
          f"{max(r['seconds'] for r in results.values()):.2f} s)\n")
    print("not compiled, by the keyword the error names:")
    for reason, n in not_compiled(results).most_common():
        print(f"  {n:4d}  {reason}")
    kinds = collections.defaultdict(list)
    for sid, r in results.items():
        for kind, text, detail in r["failures"]:
            kinds[kind].append((sid, text, detail))
        if r["crash"]:
            kinds["compile crashed"].append((sid, "", r["crash"]))
    for kind, items in sorted(kinds.items()):
        print(f"\n{kind}: {len(items)} (in {len({sid for sid, _, _ in items})} schemas)")
        for sid, text, detail in items[:args.show]:
            print(f"  {sid}: {text[:300]}\n      {detail}")


if __name__ == "__main__":
    main()
