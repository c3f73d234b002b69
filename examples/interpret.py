"""Look inside a GPT (or Llama) trained by examples/gpt.py: the logit and tuned lens, a sparse autoencoder's
features, and how much the model memorized. Each subcommand prints a table and writes a PNG (matplotlib: pip install
'tinyllm[interp]').

    python examples/interpret.py lens --ckpt-dir out/gpt --prompt "ROMEO:"   # what each layer would predict
    python examples/interpret.py sae --ckpt-dir out/gpt --layer 1            # features of a sparse autoencoder
    python examples/interpret.py canaries                                    # exposure of planted secrets

A missing or unreadable checkpoint file, a layer out of range or a prompt the tokenizer cannot encode stops with
one line on stderr and exit code 2.
"""
import argparse
import os
import sys

try:
    import tinyllm
except ModuleNotFoundError:  # run from a checkout that is not pip-installed: use the tinyllm beside examples/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import tinyllm
from tinyllm import runtime as tl_runtime
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gpt_files.py beside this file, however it is run
from flags import add_old_name  # noqa: E402
from gpt_files import CKPT_NAME, UsageError, load_model, run_cli  # noqa: E402


def lens(args):
    raise NotImplementedError("interpret.py lens: being written this session")


def sae(args):
    raise NotImplementedError("interpret.py sae: being written this session")


def canaries(args):
    raise NotImplementedError("interpret.py canaries: being written this session")


def add_checkpoint_flags(p):
    p.add_argument("--ckpt-dir", required=False, help=f"the --ckpt-dir of examples/gpt.py (the directory of "
                                                      f"{CKPT_NAME}; old name --ckpt)")
    add_old_name(p, "--ckpt", "--ckpt-dir")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    commands = {}

    q = sub.add_parser("lens", help="the logit lens and a tuned lens, layer by layer, over a prompt")
    add_checkpoint_flags(q)
    q.add_argument("--prompt", default="ROMEO:\nBut soft, what light", help="the text to read (default: %(default)r)")
    commands["lens"] = q

    q = sub.add_parser("sae", help="train a sparse autoencoder on one layer's residual stream; show its features")
    add_checkpoint_flags(q)
    q.add_argument("--layer", type=int, help="the block whose residual stream (blocks.N.hook_resid_post) is read "
                                             "(default: the middle one)")
    commands["sae"] = q

    q = sub.add_parser("canaries", help="train a small model with planted random strings; plot their exposure")
    commands["canaries"] = q

    for q in commands.values():
        q.add_argument("--out-dir", default=os.path.join("out", "interp"), help="where the PNGs go (default: "
                                                                                "%(default)s)")
        q.add_argument("--runtime", help="the tinyllm runtime, e.g. numpy or c (default: $TINYLLM_RUNTIME, else c "
                                         "where built, else numpy)")
        q.add_argument("--seed", type=int, default=0, help="seed of everything random (default: 0)")
    args = p.parse_args(argv)
    if args.command in ("lens", "sae") and args.ckpt_dir is None:  # (not required=True: its old name --ckpt too)
        commands[args.command].error("the following arguments are required: --ckpt-dir")
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        args.device = tl_runtime.get(args.runtime).name
    except ValueError as e:
        raise UsageError(f"--runtime: {e}") from None
    {"lens": lens, "sae": sae, "canaries": canaries}[args.command](args)


if __name__ == "__main__":
    run_cli(main, "interpret.py")
