"""What every bench shares: the environment of a worker subprocess that runs at a fixed thread count, the pause
between libraries timed side by side, and the training step they time."""
import os
import platform

SETTLE_S = 0.15  # sleep between libraries: > OpenBLAS's idle spin (2^28 cycles, ~0.1 s) and libgomp's (~ms)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker_env(threads, openblas_coretype=None):
    """Every library's thread count set before anything is imported, threads pinned (OMP_PROC_BIND) unless the
    caller chose otherwise, and OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE removed so numpy runs the OpenBLAS kernel it
    would pick for this CPU by itself; or, given `openblas_coretype` (Haswell: its AVX2 kernel), that kernel."""
    env = dict(os.environ)
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        env.pop(var, None)
    if openblas_coretype:
        env["OPENBLAS_CORETYPE"] = openblas_coretype
    env.update(OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads), TINYLLM_THREADS=str(threads),
               MKL_NUM_THREADS=str(threads))
    env.setdefault("OMP_PROC_BIND", "true")
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def gpt_train_step(model, opt, autocast=None):
    """The step the GPT benches time: forward (the loss), backward, optimizer step, zero_grad; returns the loss.
    `autocast`: a tinyllm.autocast context the forward runs in (mixed precision)."""
    import contextlib
    region = autocast if autocast is not None else contextlib.nullcontext()

    def step(x, y):
        with region:
            _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    return step


def cpu_model():
    """The CPU's model name (/proc/cpuinfo), for a bench's header."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def split_tokens(ckpt_dir, name):
    """The token file examples/gpt.py cached beside a checkpoint ("train" or "val": train.bin / val.bin), as a
    memmap of the dtype its data.json names."""
    import json

    import numpy as np
    with open(os.path.join(ckpt_dir, "data.json")) as f:
        meta = json.load(f)
    return np.memmap(os.path.join(ckpt_dir, f"{name}.bin"), dtype=meta["dtype"], mode="r")
