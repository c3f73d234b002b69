"""Sample text from a GPT trained by examples/gpt.py, streamed to the terminal as it is generated.

    python examples/sample.py --ckpt-dir out/gpt
    python examples/sample.py --ckpt-dir out/gpt --prompt "ROMEO:" --num-samples 3 --max-new-tokens 200 --top-p 0.9
    python examples/sample.py --ckpt-dir out/gpt-m --draft out/gpt    # speculative decoding, a smaller model drafting

The checkpoint file's tokenizer (characters, its BPE file, or GPT-2's) encodes the prompt and decodes the tokens;
bytes of a character split across tokens are held back until the character is whole. Each sample ends with its
tokens/s on stderr. With --draft, each sample (speculative decoding) is followed on stderr by the draft's acceptance
rate (accepted draft tokens / proposed), its tokens/s, and the tokens/s of the model alone sampling the same prompt
and length with the same settings (a second run, not printed; --no-compare skips it). Each speed includes the
prefill, and the first sample's runs include building and recording their kernels: with --num-samples 2 or more
the later ones are warm. A missing or unreadable checkpoint file, a draft model with other tokens than the target's,
or a prompt the tokenizer cannot encode stops with one line on stderr and exit code 2.
"""
import argparse
import codecs
import math
import os
import sys
import time


try:
    import tinyllm
except ModuleNotFoundError:  # run from a checkout that is not pip-installed: use the tinyllm beside examples/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import tinyllm
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gpt_files.py beside this file, however it is run
from flags import add_old_name  # noqa: E402
from gpt_files import CKPT_NAME, UsageError, device_of, encode_prompt, load_model, run_cli  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ckpt-dir", help=f"the --ckpt-dir of examples/gpt.py to sample from (the directory of "
                                      f"{CKPT_NAME}; required; old name --ckpt)")
    add_old_name(p, "--ckpt", "--ckpt-dir")
    p.add_argument("--prompt", default="\n", help="the text to continue (default: a newline)")
    p.add_argument("--num-samples", type=int, default=1, help="samples, one after another (default: 1)")
    p.add_argument("--max-new-tokens", type=int, default=300, help="tokens per sample (default: 300)")
    p.add_argument("--temperature", type=float, default=0.8, help="0: always the likeliest token (default: 0.8)")
    p.add_argument("--top-k", type=int, help="sample among the k likeliest tokens (default: all)")
    p.add_argument("--top-p", type=float, help="sample among the fewest tokens whose probability reaches p")
    p.add_argument("--min-p", type=float, help="drop tokens less likely than min-p times the likeliest")
    p.add_argument("--seed", type=int, help="makes the samples reproducible (default: a fresh seed)")
    p.add_argument("--draft", help="a smaller model's --ckpt-dir, trained on the same tokens: it proposes tokens that "
                                   "the model verifies in one forward per round (speculative decoding: the same "
                                   "distribution). It pays off when the draft is much cheaper than the model "
                                   "(several times fewer layers, or a fraction of the width) and its acceptance "
                                   "rate is high; on the tiny example models each round's fixed overhead "
                                   "dominates, so it is slower there. Prints the acceptance rate and the speed of "
                                   "both runs: speculative, and the model alone")
    p.add_argument("--no-compare", action="store_true", help="with --draft, skip the run of the model alone that "
                                                            "the speculative run's speed is compared with")
    p.add_argument("--num-speculative-tokens", type=int, default=4, help="tokens the draft proposes per round "
                                                                         "(default: 4)")
    p.add_argument("--runtime", help="the tinyllm runtime, e.g. numpy or c (default: $TINYLLM_RUNTIME, else c "
                                     "where built, else numpy)")
    args = p.parse_args(argv)
    if args.ckpt_dir is None:  # (not required=True: its old name --ckpt gives it too)
        p.error("the following arguments are required: --ckpt-dir")
    if args.num_samples < 1 or args.max_new_tokens < 1 or args.num_speculative_tokens < 1:
        p.error("--num-samples, --max-new-tokens and --num-speculative-tokens must be at least 1")
    if args.top_k is not None and args.top_k < 0:
        p.error(f"--top-k must be at least 1 (0: all tokens, as Hugging Face's top_k=0), got {args.top_k}")
    args.top_k = args.top_k or None
    try:  # before any model is loaded
        tinyllm.sampling.check_options("sample.py", args.temperature, args.top_k, args.top_p, args.min_p)
    except ValueError as e:
        p.error(str(e).replace("temperature", "--temperature").replace("top_p", "--top-p").replace("min_p", "--min-p"))
    return args


def main(argv=None):
    args = parse_args(argv)
    device = device_of(args.runtime)
    model, tok, ckpt = load_model(os.path.join(args.ckpt_dir, CKPT_NAME), device)
    draft = None
    if args.draft:
        draft_path = os.path.join(args.draft, CKPT_NAME)
        draft, _, draft_ckpt = load_model(draft_path, device)
        if draft_ckpt["tokenizer"] != ckpt["tokenizer"]:
            raise UsageError(f"--draft {draft_path}: its tokenizer is not the one of --ckpt-dir {args.ckpt_dir}: a "
                             "draft model must be trained on the same tokens as the model it drafts for")
    prompt = encode_prompt(tok, args.prompt)
    generator = tinyllm.Generator().manual_seed(args.seed) if args.seed is not None else None
    idx = tinyllm.tensor(prompt[None, :], device=device)
    sampling = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p)
    out = sys.stdout
    for n in range(args.num_samples):
        if n:
            out.write("\n" + "-" * 40 + "\n")
        out.write(args.prompt)
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        stats = {}
        start = time.perf_counter()
        for new in model.generate(idx, args.max_new_tokens, **sampling, generator=generator, draft_model=draft,
                                  num_speculative_tokens=args.num_speculative_tokens, stream=True, stats=stats):
            for token in new.numpy()[0].tolist():
                out.write(utf8.decode(tok.decode_single_token_bytes(token)))
            out.flush()
        out.write(utf8.decode(b"", final=True) + "\n")
        out.flush()
        speed = report(stats["emitted"], time.perf_counter() - start, prompt.size, device,
                       "speculative decoding: " if draft else "")
        if draft is None:
            continue
        rate = stats["draft_acceptance_rate"]  # (nan when no draft was proposed: a single token)
        # each round emits its accepted drafts and one token of the model's; the rest the model made alone: the
        # last token, and every token past the shorter context of the two models, where no draft fits
        alone = stats["emitted"] - stats["accepted"] - stats["rounds"]
        context = min(model.max_positions, draft.max_positions)
        print(f"sample.py: draft acceptance rate {'n/a' if math.isnan(rate) else f'{rate:.2f}'} ({stats['accepted']} "
              f"of {stats['proposed']} draft tokens accepted, up to {args.num_speculative_tokens} proposed per round, "
              f"{stats['rounds']} rounds)" + (f"; {alone} tokens by the model alone past the {context}-token context, "
                                             "where no draft fits" if alone > 1 else ""), file=sys.stderr, flush=True)
        if args.no_compare:
            continue
        plain_stats = {}  # the model alone, same prompt, length and settings (its own seed: only its time is wanted)
        start = time.perf_counter()
        model.generate(idx, args.max_new_tokens, **sampling, stats=plain_stats,
                       generator=tinyllm.Generator().manual_seed(args.seed) if args.seed is not None else None)
        plain = report(plain_stats["emitted"], time.perf_counter() - start, prompt.size, device, "the model alone: ")
        print(f"sample.py: speculative decoding ran at {speed / plain:.2f}x the speed of the model alone",
              file=sys.stderr, flush=True)
    return 0


def report(count, seconds, prefill, device, what=""):
    """Print a run's tokens/s to stderr and return it."""
    print(f"sample.py: {what}{count} tokens in {seconds:.2f} s, {count / seconds:.1f} tokens/s (prefill of "
          f"{prefill} included) on {device}", file=sys.stderr, flush=True)
    return count / seconds


if __name__ == "__main__":
    run_cli(main, "sample.py")
