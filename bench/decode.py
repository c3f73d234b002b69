"""Text generation speed: tinyllm's cached decode on each runtime beside torch eager with its own preallocated KV
cache, same model, weights, prompt and threads; prefill speed; speculative decoding's acceptance and speedup.

    python bench/decode.py                                 # config M, batch 1, 2 threads, runtimes numpy c
    python bench/decode.py --runtimes c wgsl --threads 1 2
    python bench/decode.py --target out/gpt-m --draft out/gpt-s   # + speculative decoding with trained checkpoints
    python bench/decode.py --quick                         # smoke run: config S, few tokens
    python bench/decode.py --config 124M --runtimes c --dtypes fp32 int8 int4 --tokens 32 --skip-uncached c \
        --prompt-len 64                                    # GPT-2-124M's shape, random weights, quantized rows

Decode: a one-token prompt, then --tokens tokens, greedy (temperature 0), so every framework must produce the same
tokens: torch's are the reference, and a runtime whose tokens differ is marked FAIL. "cached" is GPT.generate with
use_cache=True (prefill, then one replayed step per token), "no cache" recomputes the window per token (nanoGPT's
loop). torch eager keeps per-layer key/value tensors of block_size positions, preallocated and written in place,
and attends over the filled prefix with F.scaled_dot_product_attention: what a careful torch user writes. Each
framework generates once to warm up (kernels compile, the decode step is recorded), then --rounds times, interleaved;
the table shows the median tokens/s and the min-max.

Prefill: a --prompt-len token prompt (default 256, config M's block_size), max_new_tokens=1: one batched forward
that fills the cache; tokens/s = prompt tokens / time.

Speculative (--target and --draft, examples/gpt.py checkpoints on the same tokens): the target's tokens/s alone and
with the draft proposing --num-speculative-tokens, sampled at temperature 1 from the same seed, and the draft's
acceptance rate (accepted / proposed).

16-bit rows (--dtypes bf16 fp16): the runtime's model moved to that dtype whole (weights, activations, KV cache),
decoded as "cached"; like the quantized rows, their speed is compared with float32's and their tokens are not.

Quantized rows (--dtypes int8 int4): the runtime's model after tinyllm.quantization.quantize_ (one float16 scale
per --group-size input features; the lm_head tied to the token embedding stays float32 unless --quantize-lm-head);
int8-dynamic and int4-dynamic quantize the activations to int8 at run time too (dynamic=True: byte dot products),
decoded as "cached"; their tokens are not compared (rounded weights may pick other tokens), their speed is, against
the same runtime's float32 row ("/ fp32", issue 48's target >= 1.5).

The roofline: a batch-1 decode step reads every weight once (decode_weight_bytes in bench/common.py: an embedding table
one row, unless the tied lm_head reads it whole), so tokens/s x weight bytes per token is the bandwidth it streams, and
"of roofline" is that over the memory bandwidth measured in the same worker (the highest of a read-only stream and a
copy, read + written, from bench/common.py's machine_limits before and after the timings, and of the read-only streams
run in each round, "given" below). The KV cache's traffic is left out: a step reads and rewrites the caches' slots,
which grow with the sequence (64 slots, doubled as it fills them: tinyllm/models/generation.py), for the 124M shape 74
KB a slot, so 64 slots (this bench's lengths) are about 5 MB read and 5 MB written a token, 2-4 % of the weights'. Where
the weights fit in the L3 the table says so: they need not come from memory then, and the fraction can pass 100 %.

Each thread count runs in its own subprocess with every library's thread variables set before import
(bench/common.py), threads pinned (OMP_PROC_BIND=true).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from common import (ROOT, SETTLE_S, bandwidth_gbs, best_limits,  # bench/common.py: bench/ is the script directory
                    cpu_description, decode_weight_bytes, given_read, limits_lines, machine_limits, worker_env)

CONFIGS = {
    "S": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=65),
    "M": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=65),
    "124M": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257),  # GPT-2 small's shape
}
HALF = {"bf16": "bfloat16", "fp16": "float16"}  # --dtypes of a whole model in 16-bit floats: tinyllm's dtype names
TARGET = 2.0  # issue 48 (23 asked 1.5): cached decode on the C runtime >= 2 x torch eager with a cache, 2 threads
ROOFLINE_TARGET, QUANT_TARGET = 0.75, 1.5  # issue 48: of the bandwidth roofline (124M); int8/int4 over fp32


def torch_decoder(model, block_size):
    """Greedy decode with torch eager and a preallocated KV cache, written in place, for tests/torch_nanogpt.py's
    GPT (nanoGPT's parameter names): prefill(ids) then step() per token, each returning the next token."""
    import torch
    import torch.nn.functional as F
    cfg = model.config
    hs = cfg.n_embd // cfg.n_head
    blocks = model.transformer.h

    def attend(block, x, pos, cache):
        B, T, C = x.shape
        q, k, v = block.attn.c_attn(block.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, cfg.n_head, hs).transpose(1, 2) for t in (q, k, v))
        kc, vc = cache
        kc[:, :, pos:pos + T] = k
        vc[:, :, pos:pos + T] = v
        y = F.scaled_dot_product_attention(q, kc[:, :, :pos + T], vc[:, :, :pos + T], is_causal=T > 1)
        x = x + block.attn.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + block.mlp(block.ln_2(x))

    class Decoder:
        def prefill(self, ids):
            B, T = ids.shape
            self.cache = [(torch.empty(B, cfg.n_head, block_size, hs), torch.empty(B, cfg.n_head, block_size, hs))
                          for _ in blocks]
            self.pos = 0
            return self._forward(ids)

        def step(self, token):
            return self._forward(token)

        @torch.no_grad()
        def _forward(self, ids):
            T = ids.shape[1]
            x = model.transformer.wte(ids) + model.transformer.wpe(torch.arange(self.pos, self.pos + T))
            for block, cache in zip(blocks, self.cache):
                x = attend(block, x, self.pos, cache)
            self.pos += T
            logits = model.lm_head(model.transformer.ln_f(x[:, -1:]))
            return logits.argmax(-1)
    return Decoder()


def worker(args, threads):
    import numpy as np
    import torch
    torch.set_num_threads(threads)
    import tinyllm as tl
    from tinyllm.models.gpt import GPT, GPTConfig
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import torch_nanogpt as ref

    cfg = CONFIGS[args.config]
    tl.manual_seed(0)
    base = GPT(GPTConfig(**cfg))
    state = {k: np.array(v.numpy(), copy=True) for k, v in base.state_dict().items()}
    tmodel = ref.GPT(ref.GPTConfig(**cfg))
    tmodel.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
    tmodel.eval()
    decoder = torch_decoder(tmodel, cfg["block_size"])
    rng = np.random.default_rng(1)
    prompt1 = rng.integers(0, cfg["vocab_size"], (1, 1))
    prompt_long = rng.integers(0, cfg["vocab_size"], (1, min(args.prompt_len, cfg["block_size"])))
    n = args.tokens

    def torch_decode(prompt, n_new):
        token = decoder.prefill(torch.from_numpy(prompt))
        out = [token]
        for _ in range(n_new - 1):
            token = decoder.step(token)
            out.append(token)
        return torch.cat(out, 1).numpy()

    from tinyllm.quantization import quantize_
    fns = {"torch": lambda: torch_decode(prompt1, n), "torch prefill": lambda: torch_decode(prompt_long, 1)}
    nbytes = {"torch": decode_weight_bytes(base)}  # row -> weight bytes one decoded token reads
    for rt in args.runtimes:
        for dtype in args.dtypes:
            model = GPT(GPTConfig(**cfg)).to(rt)
            model.load_state_dict(state)
            if dtype in HALF:
                model = model.to(dtype=getattr(tl, HALF[dtype]))
            elif dtype != "fp32":
                quantize_(model, dtype.split("-")[0], group_size=args.group_size, embedding=args.quantize_lm_head,
                          dynamic=dtype.endswith("-dynamic"))
            model.eval()

            def gen(prompt, n_new, use_cache, model=model, rt=rt):
                idx = tl.tensor(prompt, device=rt)
                return model.generate(idx, n_new, temperature=0, use_cache=use_cache).numpy()[:, prompt.shape[1]:]
            name = rt if dtype == "fp32" else f"{rt} {dtype}"
            nbytes[f"{name} cached"] = decode_weight_bytes(model)
            fns[f"{name} cached"] = lambda gen=gen: gen(prompt1, n, True)
            if dtype != "fp32":  # prefill and the uncached loop: float32's only
                continue
            fns[f"{rt} prefill"] = lambda gen=gen: gen(prompt_long, 1, True)
            if rt not in args.skip_uncached:
                fns[f"{rt} no cache"] = lambda gen=gen: gen(prompt1, args.uncached_tokens, False)

    res = {name: {"times": [], "tokens": None, "error": None} for name in fns}
    order = list(fns)
    limits = [machine_limits(threads)]  # and again after the timings: the best of the two is the limit
    stream = np.ones(64 << 20, np.float32)  # 256 MiB, as machine_limits' (bench/common.py)
    given = []  # per round: GB/s the read-only stream got from the memory system in a turn
    for r in range(args.rounds + 1):  # round 0 warms up
        turns = []
        for name in order[r % len(order):] + order[:r % len(order)]:
            if res[name]["error"]:
                continue
            t = time.perf_counter()
            try:
                tokens = fns[name]()
            except Exception as e:  # noqa: BLE001 (reported in the table, the others go on)
                res[name]["error"] = f"{type(e).__name__}: {e}"[:200]
                continue
            elapsed = time.perf_counter() - t
            if r:
                res[name]["times"].append(elapsed)
                turns.append(elapsed)
            res[name]["tokens"] = tokens.tolist()
            time.sleep(SETTLE_S)
        if r and turns:  # a read-only stream in a turn as long as a cached decode's (given_read)
            given.append(given_read(stream, threads, statistics.median(turns)))
    limits.append(machine_limits(threads))
    out = {"limits": best_limits(*limits), "bytes": nbytes, "given_gbs": given}
    for name, v in res.items():
        prefill = name.endswith("prefill")
        count = prompt_long.shape[1] if prefill else (args.uncached_tokens if name.endswith("no cache") else n)
        out[name] = dict(error=v["error"], tokens=v["tokens"],
                         tok_s=[count / t for t in v["times"]])
    if args.target and args.draft:
        out["speculative"] = speculative(args, tl)
    print(json.dumps(out))


def speculative(args, tl):
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from gpt_files import CKPT_NAME, load_model
    rt = args.runtimes[-1] if "c" not in args.runtimes else "c"
    target, tok, _ = load_model(os.path.join(args.target, CKPT_NAME), rt)
    draft, _, _ = load_model(os.path.join(args.draft, CKPT_NAME), rt)
    idx = tl.tensor([tok.encode_ordinary("\n")[:1]], device=rt)
    res = {"runtime": rt, "k": args.num_speculative_tokens}
    for name, kw in (("target", {}), ("speculative", dict(draft_model=draft,
                                                           num_speculative_tokens=args.num_speculative_tokens))):
        times = []
        for r in range(args.rounds + 1):
            t = time.perf_counter()
            target.generate(idx, args.tokens, temperature=1.0, generator=tl.Generator().manual_seed(r), **kw)
            if r:
                times.append(time.perf_counter() - t)
                if kw:
                    res.setdefault("stats", []).append(dict(target.speculative_stats))
        res[name] = [args.tokens / t for t in times]
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="M", choices=sorted(CONFIGS))
    p.add_argument("--threads", type=int, nargs="+", default=[2])
    p.add_argument("--runtimes", nargs="+", default=["numpy", "c"])
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--uncached-tokens", type=int, default=32, help="tokens of the no-cache runs (they are slow)")
    p.add_argument("--skip-uncached", nargs="*", default=[], help="runtimes without a no-cache run")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--target", help="examples/gpt.py --ckpt-dir of the target model (speculative decoding)")
    p.add_argument("--draft", help="examples/gpt.py --ckpt-dir of the draft model")
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--dtypes", nargs="+", default=["fp32"],
                   choices=["fp32", *HALF, "int8", "int4", "int8-dynamic", "int4-dynamic"],
                   help="weights of the tinyllm rows: fp32, the whole model in bf16 or fp16 (model.to(dtype=...)), "
                   "and quantized copies (tinyllm.quantization.quantize_; -dynamic: int8 activations too, quantize_'s "
                   "dynamic=True)")
    p.add_argument("--group-size", type=int, default=32, help="input features per scale of the quantized rows")
    p.add_argument("--quantize-lm-head", action="store_true",
                   help="quantize the lm_head too (quantize_'s embedding=True); default: it stays float32")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:
        args.config, args.tokens, args.uncached_tokens, args.rounds, args.prompt_len = "S", 20, 8, 1, 32
    if args.worker is not None:
        return worker(args, args.worker)
    print_header(args)
    for threads in args.threads:
        cmd = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--worker", str(threads)]
        r = subprocess.run(cmd, env=worker_env(threads), capture_output=True, text=True)
        if r.returncode:
            print(r.stdout, r.stderr, file=sys.stderr)
            sys.exit(f"bench/decode.py: the worker for {threads} threads failed")
        table(args, threads, json.loads(r.stdout.strip().splitlines()[-1]))


def print_header(args):
    cpu = cpu_description()
    print(f"# bench/decode.py {' '.join(sys.argv[1:])}  {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    print(f"# CPU: {cpu['model']} ({cpu['family']}), {os.cpu_count()} cores; caches (per core, cpu0) "
          f"{', '.join(cpu['caches'])}; flags {' '.join(cpu['flags'])}")
    quant = f"; quantized rows group {args.group_size}, lm_head {'quantized' if args.quantize_lm_head else 'float32'}"
    print(f"# config {args.config} {CONFIGS[args.config]}, batch 1, {args.tokens} tokens (no cache: "
          f"{args.uncached_tokens}), prefill {args.prompt_len}; weights {' '.join(args.dtypes)}"
          f"{quant if set(args.dtypes) - {'fp32'} else ''}; load average {os.getloadavg()[0]:.1f} at start")


def fmt(values):
    if not values:
        return "-"
    return f"{statistics.median(values):,.1f} ({min(values):,.1f}–{max(values):,.1f})"


def table(args, threads, res):
    limits, nbytes, given = res.pop("limits"), res.pop("bytes"), res.pop("given_gbs")
    # the highest rate any stream of the run reached: the rounds' streams run longer than machine_limits' and on
    # this VM often read faster (the memory system's share moves with other tenants)
    bandwidth = max([bandwidth_gbs(limits, threads)] + given)
    given_med = statistics.median(given) if given else float("nan")
    ref = res["torch"]["tokens"]
    base = statistics.median(res["torch"]["tok_s"])
    base_prefill = statistics.median(res["torch prefill"]["tok_s"])
    roofline_target = args.config == "124M"
    print(f"\n{threads} thread(s); " + "\n".join(limits_lines(limits)))
    print(f"roofline: weight bytes per token x tokens/s over {bandwidth:,.1f} GB/s (the highest of the read-only "
          f"stream and the copy of {threads} thread{'s' if threads > 1 else ''}, and of the rounds' streams)"
          + (f"; target ≥ {ROOFLINE_TARGET:.0%}" if roofline_target else "")
          + f"; given: over what the read-only stream got in a turn of each round as long as a framework's (median "
          f"{given_med:,.1f} GB/s, rounds {min(given, default=0):,.1f}–{max(given, default=0):,.1f}: the memory "
          "system's share these cores had while other processes ran)")
    print("\n| framework | tokens/s | / torch cached | greedy tokens = torch's | weight MB / token | GB/s streamed | "
          "of roofline (given) | / fp32 |")
    print("|---|---|---|---|---|---|---|---|")
    for name, v in res.items():
        if name == "speculative":
            continue
        if v["error"]:
            print(f"| {name} | FAIL: {v['error']} | | | | | | |")
            continue
        med = statistics.median(v["tok_s"])
        ratio = med / (base_prefill if name.endswith("prefill") else base)
        quantized = any(f" {d}" in name for d in ("int8", "int4"))
        rounded = quantized or any(f" {d} " in name for d in HALF)
        same = "" if name.endswith("prefill") else "— (rounded weights)" if rounded else (
            "yes" if v["tokens"] == [row[:len(v["tokens"][0])] for row in ref] else "FAIL")
        target = f" (target ≥ {TARGET})" if name == "c cached" and threads == 2 else ""
        cells = ["", "", "", ""]
        if name in nbytes:
            b = nbytes[name]
            fits = " (fits in L3)" if 0 < b <= limits["l3"] else ""
            frac = b * med / 1e9 / bandwidth
            meets = f" ({'meets' if frac >= ROOFLINE_TARGET else 'below'} {ROOFLINE_TARGET:.0%})" \
                if roofline_target and not name.startswith("torch") else ""
            cells[:3] = [f"{b / 1e6:,.1f}{fits}", f"{b * med / 1e9:,.1f}",
                         f"{frac:.1%}{meets} ({b * med / 1e9 / given_med:.0%})"]
        fp32 = name.split(" ")[0] + " cached"
        if rounded and fp32 in res and not res[fp32]["error"]:
            q = med / statistics.median(res[fp32]["tok_s"])
            cells[3] = f"{q:.2f}" + (f" ({'meets' if q >= QUANT_TARGET else 'below'} {QUANT_TARGET})" * quantized)
        print(f"| {name} | {fmt(v['tok_s'])} | {ratio:.2f}{target} | {same} | " + " | ".join(cells) + " |")
    if "speculative" in res:
        s = res["speculative"]
        acc = sum(x["accepted"] for x in s["stats"]) / max(1, sum(x["proposed"] for x in s["stats"]))
        print(f"\nspeculative decoding on {s['runtime']}, k={s['k']}: target alone {fmt(s['target'])} tokens/s, "
              f"with the draft {fmt(s['speculative'])} tokens/s "
              f"({statistics.median(s['speculative']) / statistics.median(s['target']):.2f} ×), "
              f"acceptance {acc:.1%}")


if __name__ == "__main__":
    main()
