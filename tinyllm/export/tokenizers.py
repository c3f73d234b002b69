"""A tokenizer's tables as the page's JavaScript reads them (manifest.json's "tokenizer")."""
from .capture import ExportError


def tokenizer_table(tokenizer, vocab_size):
    """The JSON-able record of `tokenizer`: a character tokenizer (kind "char" and a `vocab` string, as
    examples/gpt_files.CharTokenizer, or its checkpoint record) is its characters; None gives a page that shows
    token ids. Anything else is refused: the page would need its merges and split pattern in JavaScript."""
    if tokenizer is None:
        return {"kind": "ids", "n_vocab": vocab_size}
    record = tokenizer if isinstance(tokenizer, dict) else \
        {"kind": getattr(tokenizer, "kind", None), "vocab": getattr(tokenizer, "vocab", None)}
    if record.get("kind") == "char" and isinstance(record.get("vocab"), str):
        vocab = record["vocab"]
        if len(vocab) != vocab_size or len(set(vocab)) != len(vocab):
            raise ExportError(f"tinyllm.export: the character tokenizer has {len(vocab)} characters "
                              f"({len(set(vocab))} distinct) but the model has vocab_size {vocab_size}")
        return {"kind": "char", "vocab": vocab}
    if hasattr(tokenizer, "merges") and hasattr(tokenizer, "decode_single_token_bytes"):
        return bpe_table(tokenizer, vocab_size)
    raise ExportError(f"tinyllm.export: cannot serialize a tokenizer of type {type(tokenizer).__name__} for the page "
                      "(kind " + repr(record.get("kind")) + "): it exports character tokenizers (kind 'char' with a "
                      "vocab string, examples/gpt.py --tokenizer char) and tinyllm.tokenizer.Tokenizer's byte-level "
                      "BPEs of GPT-2's split pattern; pass tokenizer=None for a page of token ids")


def bpe_table(tok, vocab_size):
    """A tinyllm.tokenizer.Tokenizer as each id's bytes (hex), its special tokens and its split pattern. The page's
    JavaScript regex can say GPT-2's pattern (\\p{L}, \\p{N}, a lookahead) but not GPT-4's possessive quantifiers."""
    if tok.pattern not in ("gpt2", None):
        raise ExportError(f"tinyllm.export: cannot serialize the tokenizer {tok.name!r}: its split pattern "
                          f"{tok.pattern!r} needs possessive quantifiers, which JavaScript regexes lack (GPT-2's "
                          "pattern, 'gpt2', and None are exported)")
    if tok.n_vocab > vocab_size:
        raise ExportError(f"tinyllm.export: the tokenizer has {tok.n_vocab} tokens, more than the model's vocab_size "
                          f"{vocab_size}")
    special = tok.special_token_ids
    ordinary = [i for i in range(tok.n_vocab) if i not in special.values()]
    return {"kind": "bpe", "pattern": tok.pattern, "special": special,
            "tokens": {str(i): tok.decode_single_token_bytes(i).hex() for i in ordinary}}
