"""What rounding every 16-bit intermediate inside a fused C kernel costs (issue 43, point 4): one process, two copies
of the GPT config-S training step, one rendered with the rounding ("after": render.py as it is) and one without
("before": CLanguage._expression, the unrounded expression, which was the rendering until then), alternated step by
step so a busy machine slows both alike; min and median step times.

    TINYLLM_RUNTIME=c OMP_PROC_BIND=true python bench/lowp_rounding.py bf16 25   # (fp32: no autocast, the control)
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tinyllm as tl
from tinyllm.runtime.c import render as R
from tinyllm.models.gpt import GPT, GPTConfig
after = R.CLanguage.expression
before = R.CLanguage._expression
dtype = {"bf16": tl.bfloat16, "fp32": None}[sys.argv[1]]
def make():
    tl.manual_seed(0)
    model = GPT(GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=65)).to("c")
    return model, tl.optim.AdamW(model.parameters(), lr=1e-3)
x = tl.randint(0, 65, (16, 64), device="c"); y = tl.randint(0, 65, (16, 64), device="c")
runs = {"before": make(), "after": make()}
def step(which):
    R.CLanguage.expression = before if which == "before" else after
    model, opt = runs[which]
    t = time.perf_counter()
    with tl.autocast(dtype=dtype or tl.bfloat16, enabled=dtype is not None):
        _, loss = model(x, y)
    opt.zero_grad(); loss.backward(); opt.step(); loss.item()
    return time.perf_counter() - t
for w in ("before", "after", "before", "after"):
    step(w)
times = {"before": [], "after": []}
for i in range(int(sys.argv[2])):
    for w in (("before", "after") if i % 2 else ("after", "before")):
        times[w].append(step(w))
for w, ts in times.items():
    print(f"{sys.argv[1]} {w}: min {min(ts)*1e3:.1f} ms, median {statistics.median(ts)*1e3:.1f} ms, "
          f"tokens/s at min {16*64/min(ts):,.0f}")
