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
    raise ExportError(f"tinyllm.export: cannot serialize a tokenizer of type {type(tokenizer).__name__} for the page "
                      "(kind " + repr(record.get("kind")) + "): it exports character tokenizers (kind 'char' with a "
                      "vocab string, examples/gpt.py --tokenizer char); pass tokenizer=None for a page of token ids")
