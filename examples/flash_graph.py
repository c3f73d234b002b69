"""See the FlashAttention rewrite: the graph of a small causal attention before and after the pass.

    python examples/flash_graph.py            # writes out/flash/before.dot and after.dot (+ .svg with Graphviz)
    python examples/flash_graph.py --out-dir DIR

`before` is attention as F.scaled_dot_product_attention writes it: q @ kᵀ, the scale, the causal mask built
from two aranges, the softmax's max, exp, sum and division, and @ v. In `after` all of that is one FLASH_ATTN node
(and a SHRINK view that takes its output O out of the packed [O | L]).
"""
import argparse
import os
import sys

try:
    import tinyllm as tl
except ModuleNotFoundError:  # a checkout that is not pip-installed: use the tinyllm beside examples/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import tinyllm as tl
from tinyllm.autograd import prepare
from tinyllm.nn import functional as F
from tinyllm.rewrite.viz import save_graph
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # flags.py beside this file, however it is run
from flags import add_old_name  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", default=os.path.join("out", "flash"),
                   help="directory for before/after .dot and .svg (default: out/flash; old name --out)")
    add_old_name(p, "--out", "--out-dir")
    args = p.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    q, k, v = (tl.randn(1, 2, 4, 3) for _ in range(3))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    out = args.out_dir
    written = save_graph(os.path.join(out, "before"), y) + save_graph(os.path.join(out, "after"), prepare(y.node))
    for path in written:
        print(path)
    if not any(path.endswith(".svg") for path in written):
        print("(no .svg: Graphviz's `dot` is not installed; apt-get install graphviz, or open the .dot files in "
              "any Graphviz viewer)")
    return written


if __name__ == "__main__":
    main()
