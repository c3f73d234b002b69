"""tiktoken's Encoding as the grammar's tokenizer (built offline from GPT-2's files, as tests/test_tokenizer.py
does): the same masks as tinyllm's GPT-2 tokenizer at every step of a JSON document and of a regex match, its
special tokens other than end of text never allowed, and the ids it has no token for neither."""
import numpy as np
import pytest
import tiktoken

from tinyllm.grammar import compile
from tinyllm.tokenizer import GPT2_PATTERN, Tokenizer

from test_tokenizer import tiktoken_gpt2_ranks

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "when": {"type": "string", "format": "date"},
                                           "n": {"type": "integer", "minimum": -5, "maximum": 500}},
          "required": ["name", "n"]}
DOC = '{"name":"Zoë \\"Z\\" 中","when":"2024-02-29","n":-3}'


@pytest.fixture(scope="module")
def encodings():
    ranks = tiktoken_gpt2_ranks()
    enc = tiktoken.Encoding(name="gpt2-fim", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": 50256, "<|fim_prefix|>": 50258})
    return enc, Tokenizer.gpt2()


@pytest.mark.parametrize("spec, text", [(dict(json_schema=SCHEMA), DOC),
                                        (dict(regex=r"[A-Z][a-z]+ \d{1,3}(, [a-z]+)*"), "Ab 12, cd, efg")])
def test_tiktoken_masks_equal_tinyllms(encodings, spec, text):
    enc, ours = encodings
    g_enc, g_ours = compile(enc, **spec), compile(ours, **spec)
    m_enc, m_ours = g_enc.matcher(), g_ours.matcher()
    ids = enc.encode(text)
    assert ids == ours.encode(text)
    for t in ids:
        a, b = m_enc.allowed(), m_ours.allowed()
        assert a.shape == (50259,) and a[t]
        assert (a[:50257] == b).all() and not a[50257:].any()  # a hole (50257) and <|fim_prefix|> never allowed
        m_enc.accept(t)
        m_ours.accept(t)
    assert m_enc.allowed()[enc.eot_token] and m_ours.allowed()[ours.eot_token]
    with pytest.raises(ValueError, match="token 50258 at position .* is not text"):
        m_enc.accept(50258)
    m_enc.accept(enc.eot_token)
    assert m_enc.is_terminated() and not m_enc.allowed().any()


def test_tokenizations_other_than_the_tokenizers_own_are_accepted(encodings):
    """Any tokenization of a valid document is in the language: here byte by byte, where GPT-2 has each byte."""
    enc, _ = encodings
    m = compile(enc, json_schema=SCHEMA).matcher()
    byte_ids = {enc.decode_single_token_bytes(i): i for i in range(50256) if len(enc.decode_single_token_bytes(i)) == 1}
    for b in DOC.encode():
        m.accept(byte_ids[bytes([b])])
    assert m.allowed()[enc.eot_token]
    assert np.flatnonzero(m.allowed()).tolist() == [enc.eot_token]
