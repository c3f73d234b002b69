"""What looking inside costs: a forward that caches hook points against the same forward without them, in tinyllm
(C runtime) and in TransformerLens (eager torch, the same weights), side by side in one process.

    python bench/hooks.py                    # config M (6 layers, 6 heads, 384 wide), batch 8 x 256 tokens
    python bench/hooks.py --batch 4 --repeats 9

Rows: no hooks; two residual points; a residual point and one layer's attention pattern (the T x T probabilities,
which the fused attention never holds: tinyllm computes them beside it); every point. Each time is the median of
--repeats forwards, the libraries and rows interleaved round by round; each library's ratio divides by its own
no-hook forward. Threads: --threads for both (TINYLLM_THREADS, torch.set_num_threads), pinned (OMP_PROC_BIND)."""
import argparse
from importlib.metadata import version
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--block", type=int, default=256)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args()


def main():
    args = parse_args()
    for var in ("TINYLLM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    os.environ.setdefault("OMP_PROC_BIND", "true")
    sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
    import numpy as np
    import torch
    import tinyllm as tl
    from tinyllm.models.gpt import GPT, GPTConfig
    from transformer_lens_reference import hooked_gpt

    torch.set_num_threads(args.threads)
    config = GPTConfig(n_layer=6, n_head=6, n_embd=384, block_size=args.block, vocab_size=65)
    model = GPT(config).eval()
    reference = hooked_gpt(model)
    model = model.to(device="c")
    ids = np.random.default_rng(0).integers(0, 65, (args.batch, args.block))
    x, tx = tl.tensor(ids, device="c"), torch.tensor(ids)
    rows = {"no hooks": None,
            "2 residual points": ["blocks.2.hook_resid_post", "blocks.3.hook_resid_post"],
            "residual + 1 pattern": ["blocks.2.hook_resid_post", "blocks.2.attn.hook_pattern"],
            f"every point ({len(model.hook_names())})": lambda n: True}

    def ours(names):
        if names is None:
            return lambda: model.run_with_hooks(x, []).realize()
        return lambda: model.run_with_cache(x, names_filter=names)

    def theirs(names):
        if names is None:
            return lambda: reference(tx)
        return lambda: reference.run_with_cache(tx, names_filter=names)

    runs = {(lib, row): make(names) for row, names in rows.items() for lib, make in (("tinyllm", ours),
                                                                                    ("TransformerLens", theirs))}
    times = {key: [] for key in runs}
    with torch.no_grad():
        for fn in runs.values():  # warm-up: kernels built, caches filled
            fn()
        for _ in range(args.repeats):
            for key, fn in runs.items():
                start = time.perf_counter()
                fn()
                times[key].append(time.perf_counter() - start)
    med = {key: statistics.median(t) * 1e3 for key, t in times.items()}
    print(f"config M (6 layers, 6 heads, 384 wide), batch {args.batch} x {args.block} tokens, {args.threads} "
          f"threads, median of {args.repeats}; tinyllm on the C runtime, TransformerLens {version('transformer-lens')} "
          f"on torch {torch.__version__} (eager)")
    print(f"| hooks | tinyllm ms | ratio to its no-hook forward | TransformerLens ms | ratio | tinyllm / TL |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        a, b = med["tinyllm", row], med["TransformerLens", row]
        print(f"| {row} | {a:.1f} | {a / med['tinyllm', 'no hooks']:.3f} | {b:.1f} | "
              f"{b / med['TransformerLens', 'no hooks']:.3f} | {a / b:.2f} |")


if __name__ == "__main__":
    main()
