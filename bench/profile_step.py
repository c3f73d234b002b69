"""Where one GPT training step's time goes on a tinyllm runtime: kernels by op, the runtime's own Python, and the
Python outside it (graph building, autograd, the rewrites before autograd, schedule lookup).

    python bench/profile_step.py --config S --threads 2
    python bench/profile_step.py --config E --runtime numpy      # E: examples/gpt.py's default model and batch
    python bench/profile_step.py --config S --threads 2 --jit    # the step replayed by tinyllm.jit

Every kernel's run() and every execute() is timed (perf_counter around each call), so the figures carry a few
microseconds per kernel of timer overhead. On the C runtime a schedule run again is replayed from its recorded C
calls (tinyllm/runtime/c/program.py), which no per-kernel timer sees: the step is first timed that way (the
"replayed" column), then once more with each of the replay's C calls timed (the "inside a replay" table: the
products by shape and transposition, with their GFLOP/s there, the generated kernels one by one, the other calls)
and, with --jit, its floor (the step's calls back to back, its products alone, the same products in numpy:
products_bound), then measured kernel by kernel with replays off, so the op breakdown includes the per-kernel Python
that a replay skips. With --jit it also prints the products' share of the timed replays' C calls and their GFLOP/s
over the FMA peak measured in the same worker (bench/common.py, machine_limits). Run in a subprocess with the thread
counts set before import (as the other benches); nothing here compares against torch: bench/train_gpt.py does that.
"""
import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time

from common import (SETTLE_S, gpt_train_step, limits_lines,  # bench/common.py: bench/ is the script directory
                    machine_limits, peak_gflops, worker_env)

# the C runtime's matrix products (runtime_c/sgemm.c, sgemm_formats.c), all with (batch0, batch1, transA, transB, M,
# N, K, ...) first, by the element format they multiply
PRODUCTS = {"tl_sgemm_batched2": "", "tl_gemm_f16_batched2": " float16", "tl_gemm_bf16_batched2": " bfloat16"}

CONFIGS = {  # name: (model config, batch size)
    "S": (dict(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=65), 16),
    "M": (dict(n_layer=6, n_head=6, n_embd=384, block_size=256, vocab_size=65), 8),
    "E": (dict(n_layer=3, n_head=4, n_embd=128, block_size=64, vocab_size=84), 32),
}


def worker(config, runtime, steps, top, jitted, bf16=False):
    import numpy as np
    import tinyllm as tl
    from tinyllm.models.gpt import GPT, GPTConfig
    from tinyllm.runtime import get

    cfg, batch = CONFIGS[config]
    rt = get(runtime)
    kernels = collections.defaultdict(lambda: [0, 0.0])  # what ran -> [calls, seconds]
    spent = {"execute": 0.0}
    run, execute = type(rt).run, type(rt).execute

    def timed_run(self, node, ins):
        start = time.perf_counter()
        out = run(self, node, ins)
        what = fused_label(node.arg) if node.op == "FUSED" else (node.op, str(node.shape))
        kernels[what][0] += 1
        kernels[what][1] += time.perf_counter() - start
        return out

    def timed_execute(self, *args):
        start = time.perf_counter()
        out = execute(self, *args)
        spent["execute"] += time.perf_counter() - start
        return out
    type(rt).run, type(rt).execute = timed_run, timed_execute

    tl.manual_seed(0)
    model = GPT(GPTConfig(**cfg)).to(device=runtime)
    opt = model.configure_optimizers(weight_decay=0.1, learning_rate=1e-3, betas=(0.9, 0.95))
    rng = np.random.default_rng(0)

    train_step = gpt_train_step(model, opt, autocast=tl.autocast(dtype=tl.bfloat16, enabled=bf16))
    fn = tl.jit(train_step) if jitted else train_step

    def inputs():
        x = rng.integers(0, cfg["vocab_size"], (batch, cfg["block_size"]))
        return tl.tensor(x, device=runtime), tl.tensor((7 * x + 3) % cfg["vocab_size"], device=runtime)

    def step():
        return fn(*inputs()).item()

    for _ in range(3):  # schedules built, kernels compiled (and, with --jit, the step recorded twice)
        step()
    replayed, in_replay, bound = None, {}, None
    if getattr(rt, "replays", False):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        replayed = (time.perf_counter() - start) / steps
        in_replay = replay_calls(step, steps, rt)
        if jitted:  # a jit replay's buffers stay put (its arena); an eager step's go back to the pool after it
            bound = products_bound(fn, inputs(), steps)
        rt.replays = False  # from here every kernel goes through the timed run()
        step()
    kernels.clear()
    spent["execute"] = 0.0
    start = time.perf_counter()
    for _ in range(steps):
        step()
    total = (time.perf_counter() - start) / steps
    in_kernels = sum(s for _, s in kernels.values()) / steps
    by_op = collections.defaultdict(float)
    for (op, _), (_, s) in kernels.items():
        by_op[op] += s / steps
    top_kernels = sorted(kernels.items(), key=lambda kv: -kv[1][1])[:top]
    products = [(s, flops) for _, s, flops in in_replay.values() if flops]
    print(json.dumps({
        "replayed_step_ms": replayed and replayed * 1e3, "step_ms": total * 1e3, "tokens_per_s": batch * cfg["block_size"] / total,
        "kernels_ms": in_kernels * 1e3, "runtime_python_ms": (spent["execute"] / steps - in_kernels) * 1e3,
        "outside_ms": (total - spent["execute"] / steps) * 1e3,
        "by_op_ms": {op: s * 1e3 for op, s in sorted(by_op.items(), key=lambda kv: -kv[1])},
        "top": [[op, shape, calls // steps, s / steps * 1e3] for (op, shape), (calls, s) in top_kernels],
        "replay": [[name, shape, calls // steps, s / steps * 1e3, flops / s / 1e9 if flops else None]
                   for (name, shape), (calls, s, flops) in sorted(in_replay.items(), key=lambda kv: -kv[1][1])][:top],
        "bound": bound,
        # the products inside the timed replays (each C call timed): their time, FLOPs and all the calls' time, per
        # step (the share is taken within the same timed steps: on a shared machine another run's time differs)
        "products_in_step": [sum(s for s, f in products) / steps, sum(f for s, f in products) / steps,
                             sum(s for _, s, _ in in_replay.values()) / steps],
        "limits": machine_limits(int(os.environ.get("TINYLLM_THREADS", "1")))}))


def products_bound(fn, inputs, rounds):
    """What a step's matrix products alone take, the floor under any step of this model on this CPU: the C calls
    of one replayed step of the jitted `fn` on `inputs` run back to back (no Python between them), the products
    among them alone, and the same products in numpy (OpenBLAS, on float32 arrays of the same shapes and
    transpositions, whatever the step's format),
    in interleaved rounds. Medians in seconds. The calls point into the replay's arena, the inputs and the step's
    result, all held here until the last round. They rerun the optimizer update too: the weights move, which
    timing does not mind."""
    import numpy as np
    from tinyllm.runtime.c import program as c_program
    calls, plain = [], c_program.Program.call

    def recording(self, held=0):
        calls.extend(self.bound)
        return plain(self, held)
    c_program.Program.call = recording
    try:
        held = fn(*inputs)  # the step's result: the replay wrote it, and every round writes it again
    finally:
        c_program.Program.call = plain
    products = [(kernel, args) for kernel, args in calls if getattr(kernel, "__name__", "") in PRODUCTS]
    operands = []
    for _, args in products:
        b0, b1, ta, tb, m, n, k = (int(a) for a in args[:7])
        a = np.ones((b0 * b1,) + ((k, m) if ta else (m, k)), np.float32)
        b = np.ones((b0 * b1,) + ((n, k) if tb else (k, n)), np.float32)
        operands.append((a.transpose(0, 2, 1) if ta else a, b.transpose(0, 2, 1) if tb else b,
                         np.empty((b0 * b1, m, n), np.float32)))

    def run(recorded):
        for kernel, args in recorded:
            kernel(*args)
    variants = {"calls": lambda: run(calls), "products": lambda: run(products),
                "numpy": lambda: [np.matmul(a, b, out=c) for a, b, c in operands]}
    times = {name: [] for name in variants}
    for r in range(max(rounds, 5)):
        names = list(variants)
        for name in names[r % 3:] + names[:r % 3]:  # rotating order
            time.sleep(SETTLE_S)  # the previous variant's idle threads (OpenBLAS's, OpenMP's) stop spinning
            start = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - start)
    del held  # only now may it go
    flops = sum(2.0 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2] for a, b, _ in operands)
    return {name: statistics.median(t) for name, t in times.items()} | {"count": len(products), "flops": flops}


def fused_label(kernel):
    """(what, shape) of a generated kernel, as both tables name it: its kind, op count and loop shape."""
    return f"FUSED {'reduce' if kernel.reduce else 'elementwise'}", f"{len(kernel.code)} ops {kernel.shape}"


def replay_calls(step, steps, rt):
    """{(C function, shape): [calls, seconds, flops]} over `steps` replayed steps, each call of the replays timed.
    A product's shape is (transA, transB, M, N, K), its batch and its 16-bit format if any, read off the arguments of
the product functions (PRODUCTS). A run of
    generated kernels (one tl_run_kernels call) is timed kernel by kernel, each named by its Kernel (the runtime's
    compiled kernels map function pointers back to them), as the table of kernels outside a replay names them."""
    from tinyllm.runtime.c import program as c_program, compiler
    ffi = compiler.ffi
    calls = collections.defaultdict(lambda: [0, 0.0, 0.0])
    plain = c_program.Program.call
    def address(fn):
        return int(ffi.cast("intptr_t", ffi.cast("void *", fn)))
    labels = {address(fn): fused_label(key[0]) for (_, key), (fn, _) in rt.built.items()}  # {(cpu, key): ...}
    kernel_type = ffi.typeof("void (*)(char **)")

    def each_kernel(fns, argvs, n):  # tl_run_kernels's loop, timed kernel by kernel
        for i in range(n):
            start = time.perf_counter()
            ffi.cast(kernel_type, fns[i])(argvs[i])
            spent = time.perf_counter() - start
            c = calls[labels.get(address(fns[i]), ("generated kernel", ""))]
            c[0], c[1] = c[0] + 1, c[1] + spent

    def timed_call(self, held=0):
        for fn, args in self.bound:
            if getattr(fn, "__name__", "") == "tl_run_kernels":
                each_kernel(*args)
                continue
            start = time.perf_counter()
            status = fn(*args)
            spent = time.perf_counter() - start
            if status is not None and status != -1:  # a kernel reported bad input: the normal path says so
                return False
            # a generated kernel alone is a bare function pointer
            name, shape, flops = getattr(fn, "__name__", "<cdata>"), "", 0.0
            if name.startswith("<"):
                name, shape = labels.get(address(fn), ("generated kernel", ""))
            if name in PRODUCTS:
                b0, b1, ta, tb, m, n, k = (int(a) for a in args[:7])
                shape, flops = f"{'Aᵀ' if ta else 'A'} {'Bᵀ' if tb else 'B'} {m}x{n}x{k}" + \
                    (f" x{b0 * b1}" if b0 * b1 > 1 else "") + PRODUCTS[name], 2.0 * b0 * b1 * m * n * k
            c = calls[(name, shape)]
            c[0], c[1], c[2] = c[0] + 1, c[1] + spent, c[2] + flops
        return True
    c_program.Program.call = timed_call
    try:
        for _ in range(steps):
            step()
    finally:
        c_program.Program.call = plain
    return calls


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="S", choices=sorted(CONFIGS))
    p.add_argument("--runtime", default="c")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=5, help="measured steps, after 3 warm-up steps")
    p.add_argument("--top", type=int, default=12, help="the slowest kernels to list")
    p.add_argument("--jit", action="store_true", help="the step through tinyllm.jit: measured steps are replays")
    p.add_argument("--bf16", action="store_true", help="the forward under tinyllm.autocast(dtype=bfloat16)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args.config, args.runtime, args.steps, args.top, args.jit, args.bf16)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--config", args.config, "--runtime", args.runtime,
           "--steps", str(args.steps), "--top", str(args.top)] + (["--jit"] if args.jit else []) + \
        (["--bf16"] if args.bf16 else [])
    proc = subprocess.run(cmd, env=worker_env(args.threads), capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"profile worker failed (exit {proc.returncode})")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    cfg, batch = CONFIGS[args.config]
    print(f"config {args.config} {cfg} batch {batch}; runtime {args.runtime}{' (jit)' if args.jit else ''}"
          f"{', bfloat16 autocast' if args.bf16 else ''}, "
          f"{args.threads} thread(s); "
          f"mean of {args.steps} steps; load average {os.getloadavg()[0]:.1f}")
    replayed = "–" if r["replayed_step_ms"] is None else f"{r['replayed_step_ms']:.1f}"
    print(f"| replayed step ms | step ms | tokens/s | kernels ms | runtime Python ms | outside the runtime ms |\n"
          f"|---|---|---|---|---|---|\n"
          f"| {replayed} | {r['step_ms']:.1f} | {r['tokens_per_s']:,.0f} | {r['kernels_ms']:.1f} | "
          f"{r['runtime_python_ms']:.1f} | {r['outside_ms']:.1f} |\n")
    print("| kernels of op | ms per step |\n|---|---|")
    for op, ms in r["by_op_ms"].items():
        print(f"| {op} | {ms:.2f} |")
    print("\n| slowest kernels | shape | calls per step | ms per step |\n|---|---|---|---|")
    for op, shape, calls, ms in r["top"]:
        print(f"| {op} | {shape} | {calls} | {ms:.2f} |")
    if r["replay"]:
        print("\n| inside a replay: C call | product or kernel | calls per step | ms per step | GFLOP/s |\n|---|---|---|---|---|")
        for name, shape, calls, ms, gflops in r["replay"]:
            print(f"| {name} | {shape} | {calls} | {ms:.2f} | {'' if gflops is None else f'{gflops:.0f}'} |")
    b = r.get("bound")
    if b:
        print(f"\nThe floor (medians of interleaved rounds): the step's C calls back to back "
              f"{b['calls'] * 1e3:.1f} ms; "
              f"its {b['count']} matrix products alone {b['products'] * 1e3:.1f} ms ({b['flops'] / 1e9:.2f} GFLOP, "
              f"{b['flops'] / b['products'] / 1e9:.0f} GFLOP/s; the same products in numpy {b['numpy'] * 1e3:.1f} "
              f"ms); everything else {(b['calls'] - b['products']) * 1e3:.1f} ms. A step takes at least the "
              f"products' time, so tinyllm's tokens/s over torch's is at most torch's step time over "
              f"{b['products'] * 1e3:.1f} ms; bench/kernel_ceiling.c measures a core's FMA peak, which bounds the "
              f"products' GFLOP/s at that times the thread count.")
    limits = r["limits"]
    print("\n" + "\n".join(limits_lines(limits)))
    product_s, flops, calls_s = r["products_in_step"]
    if flops:
        peak = peak_gflops(limits, args.threads)
        print(f"The products inside a replayed step (each C call timed): {product_s * 1e3:.1f} ms, "
              f"{product_s / calls_s:.1%} of the same steps' C calls ({calls_s * 1e3:.1f} ms), at "
              f"{flops / product_s / 1e9:.0f} GFLOP/s = {flops / product_s / 1e9 / peak:.1%} of the {limits['path']} "
              f"FMA peak of {args.threads} thread(s) ({peak:.1f} GFLOP/s); at the peak they would take "
              f"{flops / peak / 1e6:.1f} ms." + (" Its bfloat16 products run on vdpbf16ps where the CPU has "
              "AVX512_BF16: two multiply-adds per float32 FMA's cost, so their own peak is twice this one."
              if any(row[1].endswith("bfloat16") for row in r["replay"]) else ""))


if __name__ == "__main__":
    main()
