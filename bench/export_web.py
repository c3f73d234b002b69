"""The exported WebGPU pages (tinyllm.export.webgpu) against the Python WGSL runtime they were recorded from: each
case's site exported into a temp dir, its size by kind, its dispatches and kernels, then tokens/s (generate) or
steps/s (train) under Node (Dawn, the `webgpu` npm package), in headless Chromium (its own page, clicked) and on the
Python WGSL runtime (tinyllm.jit's chained replay, its own kernels), side by side in one run.

    python bench/export_web.py                                   # every case, train-default at batch 8: ~3 min
    python bench/export_web.py --cases train-default --train-batch 32 --steps 2   # gpt.py's batch: ~5 min
    python bench/export_web.py --tokens 40 --no-chromium

Cases: gen-default (examples/gpt.py's default shape: 3 x 128, 4 heads, block 64, a char vocab), gen-tiny (the tests'
GPT: 2 x 32, block 32), train-tiny (gpt.py --tiny: 1 x 32, block 16, batch 4), train-default (the default shape at
--train-batch, default 8: gpt.py's 32 takes 10-25 s a step on these software adapters, a minute to export).
Weights are random (speed does not depend on them). Generate: a 1-token prompt and --tokens greedy tokens, each
step reading its logits back, after a warm-up generation (pipelines compiled, buffers touched); tokens/s = steps/s.
Train: --steps timed steps after a warm-up step, each reading its loss back. Tokens/s of Python: model.generate
(the Decoder's replayed step) with the same prompt and count; its kernels fuse up to its adapter's binding limit,
the page's within WebGPU's default 8.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, os.path.join(ROOT, "tests")]
from common import cpu_model  # noqa: E402
from export_web_helpers import jit_train_step, run_page, run_site, serving  # noqa: E402

TEXT = open(os.path.join(ROOT, "docs", "getting-started.md"), encoding="utf-8").read()[:20000]
VOCAB = "".join(sorted(set(TEXT)))
IDS = np.array([VOCAB.index(c) for c in TEXT])
DEFAULT = dict(n_layer=3, n_head=4, n_embd=128, block_size=64)  # examples/gpt.py's DEFAULTS
TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=32)  # tests/test_export_web.py's small_gpt
CASES = {"gen-default": ("generate", DEFAULT, None), "gen-tiny": ("generate", TINY, None),
         "train-tiny": ("train", dict(n_layer=1, n_head=2, n_embd=32, block_size=16, bias=True), 4),  # gpt.py --tiny
         "train-default": ("train", DEFAULT, None)}  # (batch: --train-batch)
KINDS = {"weights": ("weights.safetensors", "state.bin"), "kernels": ("kernels",), "JS+HTML": ("tinyllm.js",
         "index.html"), "manifest": ("manifest.json",), "corpus": ("corpus.bin",)}


class Chars:  # as examples/gpt_files.CharTokenizer
    kind = "char"

    def __init__(self, vocab):
        self.vocab, self.n_vocab = vocab, len(vocab)


def model_for(shape):
    import tinyllm
    from tinyllm.models import GPT, GPTConfig
    tinyllm.manual_seed(0)
    return GPT(GPTConfig(vocab_size=len(VOCAB), dropout=0.0, **shape)).to("wgsl")


def sizes(site):
    def size(path):
        if os.path.isdir(path):
            return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
        return os.path.getsize(path) if os.path.exists(path) else 0
    return {kind: sum(size(os.path.join(site, f)) for f in files) for kind, files in KINDS.items()}


def python_generate(model, tokens):
    import tinyllm
    prompt = tinyllm.tensor(np.array([[1]]), device="wgsl")
    with tinyllm.no_grad():
        model.generate(prompt, tokens, temperature=0.0)  # (records, replays and chains the decode step)
        t = time.perf_counter()
        model.generate(prompt, tokens, temperature=0.0).numpy()
    return tokens / (time.perf_counter() - t)


def batches(n, batch, block):
    rng = np.random.default_rng(0)
    return [rng.integers(0, len(IDS) - block - 1, batch) for _ in range(n)]


def python_train(model, batch, steps):
    import tinyllm
    step = jit_train_step(model.train())
    block = model.config.block_size
    times = []
    for i, offs in enumerate(batches(2 + steps, batch, block)):  # 2 warm-up steps: the recording, the first replay
        x = tinyllm.tensor(np.stack([IDS[o:o + block] for o in offs]), device="wgsl")
        y = tinyllm.tensor(np.stack([IDS[o + 1:o + 1 + block] for o in offs]), device="wgsl")
        t = time.perf_counter()
        step(x, y).item()
        times.append(time.perf_counter() - t)
    return steps / sum(times[2:])


def node_rate(site, step, args, batch, block):
    if step == "generate":
        out = run_site(site, mode="generate", prompt=[1], max_new=args.tokens, options={"temperature": 0})
        return out["tokens_per_s"], f"Dawn {out['backend']}: {out['adapter']}"
    # one warm-up step's time taken out: two runs, of 1 and 1 + steps steps
    offs = [o.tolist() for o in batches(1 + args.steps, batch, block)]
    one = run_site(site, mode="train", steps=1, offsets=offs[:1])["seconds"]
    out = run_site(site, mode="train", steps=1 + args.steps, offsets=offs)
    return args.steps / (out["seconds"] - one), f"Dawn {out['backend']}: {out['adapter']}"


def chromium_rate(site, step, args):
    """The page itself, clicked twice: a warm-up run, then the timed one; its own figure (dataset)."""
    if step == "generate":
        field, fill = "tokensPerS", ("document.getElementById('prompt').value = 'T'; "
                                     "document.getElementById('temperature').value = 0; "
                                     "document.getElementById('max-new').value = N;")
        button, done = "run-generate", "generated"
        n = args.tokens
    else:
        field, fill, button, done, n = "stepsPerS", "document.getElementById('steps').value = N;", "run-train", \
            "losses", args.steps
    run = (f"{{{fill} document.getElementById('{button}').click(); "
           f"while (!document.body.dataset.{done} && !document.body.dataset.error) await sleep(100);}}")
    script = (f"(async () => {{ const sleep = (ms) => new Promise((r) => setTimeout(r, ms)); let N = 2; {run} "
              f"delete document.body.dataset.{done}; N = {n}; {run} return true; }})()")
    with serving(site) as url:
        out = run_page(url + "index.html", script, f"document.body.dataset.{field} || document.body.dataset.error",
                       timeout_s=args.chromium_timeout)
    if not str(out.get("adapter", "")).startswith("adapter"):
        return None, f"no WebGPU adapter: {out.get('adapter')}"
    assert "error" not in out["dataset"], out["dataset"]["error"]
    return float(out["dataset"][field]), out["adapter"].removeprefix("adapter ").strip()


def run_case(name, args, tmp):
    import tinyllm.export
    step, shape, batch = CASES[name]
    if name == "train-default":
        batch = args.train_batch
    model = model_for(shape)
    site = os.path.join(tmp, name)
    train = {"tokens": IDS, "batch_size": batch} if step == "train" else None
    t = time.perf_counter()
    manifest = tinyllm.export.webgpu(model, site, step=step, tokenizer=Chars(VOCAB), train=train)
    row = {"case": name, "step": step, "shape": shape, "batch": batch, "export_s": time.perf_counter() - t,
           "sizes": sizes(site), "dispatches": len(manifest["dispatches"]), "kernels": len(manifest["kernels"]),
           "params": sum(p.numel() for p in model.parameters())}
    print(f"# {name}: exported in {row['export_s']:.1f} s", file=sys.stderr, flush=True)
    row["python"] = python_generate(model.eval(), args.tokens) if step == "generate" else \
        python_train(model, batch, args.steps)  # (the export leaves the weights as they were)
    row["node"], row["node_adapter"] = node_rate(site, step, args, batch, shape["block_size"])
    row["chromium"], row["chromium_adapter"] = (None, "not run") if args.no_chromium else \
        chromium_rate(site, step, args)
    print(f"# {name}: {json.dumps({k: row[k] for k in ('python', 'node', 'chromium')})}", file=sys.stderr,
          flush=True)
    return row


def chromium_version():
    from export_web_helpers import chromium_binary
    try:
        return subprocess.run([chromium_binary(), "--version"], capture_output=True, text=True,
                              timeout=60).stdout.strip()
    except Exception as e:  # (a header line: the table still stands without it)
        return f"unknown ({e})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--tokens", type=int, default=20, help="greedy tokens timed per generate run (< block_size)")
    ap.add_argument("--steps", type=int, default=5, help="training steps timed, after a warm-up step")
    ap.add_argument("--train-batch", type=int, default=8, help="train-default's batch (gpt.py's default: 32)")
    ap.add_argument("--no-chromium", action="store_true")
    ap.add_argument("--chromium-timeout", type=int, default=300, help="seconds for one page run")
    args = ap.parse_args()
    import tinyllm
    rt = tinyllm.runtime.get("wgsl")
    start = time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())
    with tempfile.TemporaryDirectory(prefix="tinyllm-export-bench-") as tmp:
        rows = [run_case(name, args, tmp) for name in args.cases]
    print(f"# bench/export_web.py {' '.join(sys.argv[1:])}  {start}")
    print(f"# CPU: {cpu_model()}; load average {os.getloadavg()[0]:.1f}")
    print(f"# Python WGSL runtime: {rt.info['device']} ({rt.info['backend']}, {rt.info['adapter_type']}), chained "
          f"replay: {bool(getattr(rt, 'chains', False))}")
    print(f"# Node: {sorted({r['node_adapter'] for r in rows})}")
    print(f"# Chromium: {chromium_version()} headless --enable-unsafe-webgpu: "
          f"{sorted({r['chromium_adapter'] for r in rows})}")
    print(f"# generate: 1-token prompt, {args.tokens} greedy tokens (steps/s = tokens/s, logits read back each); "
          f"train: {args.steps} steps after a warm-up, loss read back each")
    print()
    print("| case | model | site KB: weights / kernels / JS+HTML / manifest / corpus | dispatches | kernels "
          "| Python /s | Node /s | Chromium /s | Node / Python | Chromium / Python |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        s, shape = r["sizes"], r["shape"]
        model = (f"{shape['n_layer']} x {shape['n_embd']}, block {shape['block_size']}, {r['params'] / 1e6:.2f}M"
                 + (f", batch {r['batch']}" if r["step"] == "train" else ""))
        kb = " / ".join(f"{s[k] / 1024:,.0f}" for k in KINDS)
        chrome = "–" if r["chromium"] is None else f"{r['chromium']:.3g}"
        ratio = "–" if r["chromium"] is None else f"{r['chromium'] / r['python']:.2f}"
        unit = "tokens" if r["step"] == "generate" else "steps"
        print(f"| {r['case']} ({unit}) | {model} | {kb} | {r['dispatches']} | {r['kernels']} | {r['python']:.3g} "
              f"| {r['node']:.3g} | {chrome} | {r['node'] / r['python']:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
