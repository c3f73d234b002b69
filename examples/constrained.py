"""Generate text that must be a JSON document a schema validates, match a regular expression or a GBNF grammar, or
be one of a few choices, from a model trained by examples/gpt.py with a tokenizer that has an end-of-text token
(--tokenizer bpe or gpt2).

    python examples/constrained.py --ckpt out/gpt-bpe --json-schema person.json       # a JSON document
    python examples/constrained.py --ckpt out/gpt-bpe --regex "\\d{4}-\\d{2}-\\d{2}"     # a date
    python examples/constrained.py --ckpt out/gpt-bpe --gbnf arithmetic.gbnf           # llama.cpp's format
    python examples/constrained.py --ckpt out/gpt-bpe --choice yes no maybe --prompt "Answer:"

Each sample is printed with whether it is in the language (it always is when it ended within --max-new-tokens;
JSON is also checked with the `jsonschema` package where it is installed). --choice samples a whole option with
the model's probability of it. A missing checkpoint or file, a tokenizer without end of text, or an invalid or
unsupported spec stops with one line and exit code 2.
"""
import argparse
import json
import os
import sys

try:
    import tinyllm
except ModuleNotFoundError:  # run from a checkout that is not pip-installed: use the tinyllm beside examples/
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import tinyllm
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # gpt_files.py beside this file, however it is run
from gpt_files import CKPT_NAME, UsageError, device_of, encode_prompt, load_model, run_cli  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ckpt", "--ckpt-dir", dest="ckpt_dir", required=True,
                   help=f"the --ckpt-dir of examples/gpt.py (the directory of {CKPT_NAME})")
    spec = p.add_mutually_exclusive_group(required=True)
    spec.add_argument("--json-schema", metavar="FILE", help="a JSON Schema file: the output is a JSON document it "
                                                            "validates (compact, members in the schema's order)")
    spec.add_argument("--regex", help="a Python re pattern the whole output must match (re.fullmatch)")
    spec.add_argument("--gbnf", metavar="FILE", help="a grammar file in llama.cpp's GBNF format (start rule: root)")
    spec.add_argument("--choice", nargs="+", help="the output is one of these strings")
    p.add_argument("--whitespace-flexible", action="store_true",
                   help="with --json-schema: allow up to 64 whitespace bytes between tokens")
    p.add_argument("--prompt", default="\n", help="the text to continue (default: a newline)")
    p.add_argument("--num-samples", type=int, default=4, help="samples, generated as one batch (default: 4)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens per sample at most (default: 32)")
    p.add_argument("--temperature", type=float, default=0.8, help="0: always the likeliest token (default: 0.8)")
    p.add_argument("--seed", type=int, default=0, help="seed of the samples (default: 0)")
    p.add_argument("--runtime", help="the tinyllm runtime, e.g. numpy or c (default: $TINYLLM_RUNTIME, else c where "
                                     "built, else numpy)")
    args = p.parse_args(argv)
    if args.num_samples < 1 or args.max_new_tokens < 1:
        p.error("--num-samples and --max-new-tokens must be at least 1")
    return args


def read_text(path, as_json=False):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f) if as_json else f.read()
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{path} is not JSON: {e}") from None


def json_verdict(text, schema):
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        return f"NOT JSON: {e}"
    try:
        import jsonschema
    except ImportError:
        return "parses as JSON (install jsonschema to validate it too)"
    errors = list(jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).iter_errors(doc))
    return "valid for the schema" if not errors else f"INVALID: {errors[0].message}"


def main(argv=None):
    import re

    import numpy as np
    from tinyllm import grammar
    args = parse_args(argv)
    device = device_of(args.runtime)
    model, tok, _ = load_model(os.path.join(args.ckpt_dir, CKPT_NAME), device)
    try:
        if args.json_schema is not None:
            spec = dict(json_schema=read_text(args.json_schema, as_json=True),
                        whitespace_flexible=args.whitespace_flexible)
        elif args.gbnf is not None:
            spec = dict(gbnf=read_text(args.gbnf))
        else:
            spec = dict(regex=args.regex) if args.regex is not None else dict(choice=args.choice)
        g = grammar.compile(tok, **spec)
    except (ValueError, TypeError) as e:
        raise UsageError(str(e)) from None
    prompt = encode_prompt(tok, args.prompt)
    idx = tinyllm.tensor(np.tile(prompt, (args.num_samples, 1)), device=device)
    out = model.generate(idx, args.max_new_tokens, temperature=args.temperature, grammar=g,
                         generator=tinyllm.Generator().manual_seed(args.seed)).numpy()[:, len(prompt):]
    for n, row in enumerate(out):
        ended = np.flatnonzero(row == g.eot)
        ids = row[:ended[0]] if len(ended) else row
        text = b"".join(tok.decode_single_token_bytes(int(t)) for t in ids).decode("utf-8", errors="replace")
        if not len(ended):
            verdict = f"unfinished after {args.max_new_tokens} tokens"
        elif args.regex is not None:
            verdict = "matches" if re.fullmatch(args.regex, text) else "DOES NOT MATCH"
        elif args.json_schema is not None:
            verdict = json_verdict(text, spec["json_schema"])
        elif args.gbnf is not None:
            verdict = "in the grammar" if g.dfa.fullmatch(text.encode()) else "NOT IN THE GRAMMAR"
        else:
            verdict = "one of the choices" if text in args.choice else "NOT A CHOICE"
        print(f"{n}: {text!r} ({len(ids)} tokens; {verdict})")


if __name__ == "__main__":
    run_cli(main, "constrained.py")
