"""tinyllm.continual.store: records round-trip and refuse bad input; the tokenizer check; torn tails (a frame cut
short, or a checksum mismatch in the last frame) are skipped with a warning and truncated, damage before the tail
is an error; and the point of it all: a writer killed with SIGKILL at random moments loses at most the record in
flight, never one whose add returned."""
import json
import os
import random
import signal
import struct
import subprocess
import sys
import tempfile
import time
import warnings
import zlib

import pytest
from hypothesis import given, strategies as st

from tinyllm.continual.store import MAGIC, FeedbackStore, Record, tokenizer_fingerprint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAD = struct.Struct("<4sII")


def frames(path):
    """[(offset, payload length)] of the file's intact frames, read independently of the store."""
    data, out, off = open(path, "rb").read(), [], 0
    while off + HEAD.size <= len(data):
        magic, n, crc = HEAD.unpack_from(data, off)
        body = data[off + HEAD.size:off + HEAD.size + n]
        if magic != MAGIC or len(body) != n or zlib.crc32(body) != crc:
            break
        out.append((off, n))
        off += HEAD.size + n
    return out


def fill(store, n=5):
    """n records of each kind in turn; returns what each add was given."""
    given = []
    for i in range(n):
        if i % 3 == 0:
            store.add(f"prompt {i} ✓", f"réponse {i} 🌍", 1 if i % 2 else -1)
        elif i % 3 == 1:
            store.add_pair(f"prompt {i}", f"chosen {i} 中文", f"rejected {i}")
        else:
            store.add_edit(f"prompt {i}", f"draft {i}", f"edited {i}\n\"quoted\"")
        given.append(i)
    return given


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "feedback.tlfb")


# ---- round trip ----
def test_round_trip_every_kind(path):
    t0 = time.time()
    store = FeedbackStore(path, model_version="adapter-1")
    assert len(store) == 0 and store.records() == [] and list(store) == [] and store.path == path
    assert store.add("héllo ✓", "wörld 🌍\n\t\"x\"\\", +1) == 0
    assert store.add("", "bad answer", -1, model_version="adapter-0") == 1
    assert store.add_pair("which? 中文", "this one", "that one") == 2
    assert store.add_edit("fix it", "teh cat", "the cat", model_version="adapter-2") == 3
    t1 = time.time()
    want = [Record(0, "rating", "héllo ✓", completion="wörld 🌍\n\t\"x\"\\", signal=1, model_version="adapter-1"),
            Record(1, "rating", "", completion="bad answer", signal=-1, model_version="adapter-0"),
            Record(2, "pair", "which? 中文", chosen="this one", rejected="that one", model_version="adapter-1"),
            Record(3, "edit", "fix it", completion="teh cat", edited="the cat", model_version="adapter-2")]

    def check(s):
        got = list(s)
        assert [dataclass_without_time(r) for r in got] == [dataclass_without_time(r) for r in want]
        times = [r.time for r in got]
        assert t0 <= times[0] and times == sorted(times) and times[-1] <= t1  # time.time() at each add, in order
        assert len(s) == 4 and s[0] == got[0] and s[-1] == got[3] and s[1:3] == got[1:3]
        assert s.records(2) == got[2:] and s.records(0) == got and s.records(4) == [] and s.records(9) == []
    check(store)
    store.close()
    with FeedbackStore(path) as reopened:  # no default model_version: each record keeps the one it was written with
        check(reopened)
        assert reopened.add("p", "c", 1) == 4 and reopened[4].model_version is None
    with pytest.raises(IndexError, match="record 5 of a feedback store of 5"):
        FeedbackStore(path)[5]


def dataclass_without_time(r):
    return (r.index, r.kind, r.prompt, r.completion, r.signal, r.chosen, r.rejected, r.edited, r.model_version)


@given(st.lists(st.tuples(st.sampled_from(["rating", "pair", "edit"]), st.text(max_size=30),
                          st.text(min_size=1, max_size=30), st.text(min_size=1, max_size=30)), max_size=6))
def test_round_trip_any_text(items):
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "f.tlfb")
        with FeedbackStore(p) as store:
            added = []
            for kind, prompt, a, b in items:
                if kind == "rating":
                    store.add(prompt, a, -1)
                elif a != b:
                    (store.add_pair if kind == "pair" else store.add_edit)(prompt, a, b)
                else:
                    continue
                added.append((kind, prompt, a, b))
        got = list(FeedbackStore(p, readonly=True))
        assert [r.index for r in got] == list(range(len(added)))
        for r, (kind, prompt, a, b) in zip(got, added):
            assert (r.kind, r.prompt) == (kind, prompt)
            assert (r.completion, r.signal) == (a, -1) if kind == "rating" else \
                (r.chosen, r.rejected) == (a, b) if kind == "pair" else (r.completion, r.edited) == (a, b)


def test_empty_store_and_empty_file(path):
    FeedbackStore(path).close()
    assert len(FeedbackStore(path)) == 0 and FeedbackStore(path).records() == []
    open(path, "wb").close()  # created, then killed before the header was written: a new store
    with FeedbackStore(path) as store:
        assert len(store) == 0 and store.add("p", "c", 1) == 0
    assert len(frames(path)) == 2


# ---- refused input ----
@pytest.mark.parametrize("sig, err", [(True, TypeError), (False, TypeError), (1.0, TypeError), (-1.0, TypeError),
                                      ("1", TypeError), (None, TypeError), (0, ValueError), (2, ValueError),
                                      (-2, ValueError)])
def test_refused_signal(path, sig, err):
    store = FeedbackStore(path)
    store.add("p", "c", 1)
    with pytest.raises(err, match="signal must be"):
        store.add("p", "c", sig)
    assert len(store) == 1 and len(FeedbackStore(path)) == 1


@pytest.mark.parametrize("call, err, match", [
    (lambda s: s.add(None, "c", 1), TypeError, "prompt must be a str, got NoneType"),
    (lambda s: s.add("p", b"c", 1), TypeError, "completion must be a str, got bytes.*decode"),
    (lambda s: s.add("p", "", 1), ValueError, "completion is empty"),
    (lambda s: s.add("p", "bad \ud800", 1), ValueError, "lone surrogate at character 4"),
    (lambda s: s.add("p", "c", 1, model_version=3), TypeError, "model_version must be a str or None"),
    (lambda s: s.add("p", "c", 1, model_version=""), ValueError, "model_version is empty"),
    (lambda s: s.add_pair("p", "a", "a"), ValueError, "chosen and rejected are the same"),
    (lambda s: s.add_pair("p", "", "b"), ValueError, "chosen is empty"),
    (lambda s: s.add_pair("p", "a", "b", model_version=b"v"), TypeError, "add_pair: model_version must be a str"),
    (lambda s: s.add_pair("p", "a", 7), TypeError, "rejected must be a str, got int"),
    (lambda s: s.add_pair(["p"], "a", "b"), TypeError, "prompt must be a str, got list"),
    (lambda s: s.add_edit("p", "c", "c"), ValueError, "corrects nothing"),
    (lambda s: s.add_edit("p", "", "e"), ValueError, "completion is empty"),
    (lambda s: s.add_edit("p", "c", ""), ValueError, "edited is empty"),
    (lambda s: s.add_edit("p", "c", None), TypeError, "edited must be a str"),
    (lambda s: s.records(-1), ValueError, "start must be >= 0"),
    (lambda s: s.records(1.5), TypeError, "start must be an int"),
    (lambda s: s["0"], TypeError, "indices are ints or slices"),
])
def test_refused_arguments_lose_nothing(path, call, err, match):
    store = FeedbackStore(path)
    fill(store, 4)
    size = os.path.getsize(path)
    with pytest.raises(err, match=match):
        call(store)
    assert os.path.getsize(path) == size and len(store) == 4
    assert store.add("p", "c", 1) == 4  # the store goes on
    assert [r.index for r in FeedbackStore(path)] == [0, 1, 2, 3, 4]


def test_bad_paths_and_modes(tmp_path, path):
    with pytest.raises(FileNotFoundError, match="the directory .*missing does not exist"):
        FeedbackStore(tmp_path / "missing" / "f.tlfb")
    with pytest.raises(IsADirectoryError, match="is a directory"):
        FeedbackStore(tmp_path)
    with pytest.raises(FileNotFoundError, match="readonly=True opens an existing store"):
        FeedbackStore(path, readonly=True)
    with pytest.raises(TypeError, match="model_version must be a str"):
        FeedbackStore(path, model_version=1)
    fill(FeedbackStore(path), 2)
    ro = FeedbackStore(path, readonly=True)
    with pytest.raises(PermissionError, match="readonly=True"):
        ro.add("p", "c", 1)
    closed = FeedbackStore(path)
    closed.close()
    with pytest.raises(ValueError, match="is closed"):
        closed.add("p", "c", 1)
    with pytest.raises(ValueError, match="is closed"):
        closed.refresh()
    assert len(FeedbackStore(path)) == 2


@pytest.mark.parametrize("content", [b"hello world, not a store", b'{"format": "tinyllm.feedback/1"}', b"\x00",
                                     b"\x89PNG\r\n\x1a\n" + bytes(100)])
def test_not_a_store(path, content):
    with open(path, "wb") as f:
        f.write(content)
    with pytest.raises(ValueError, match=r"feedback.tlfb is not a feedback store: it starts with"):
        FeedbackStore(path)
    assert open(path, "rb").read() == content  # left as it was


def frame(payload):
    body = json.dumps(payload).encode()
    return HEAD.pack(MAGIC, len(body), zlib.crc32(body)) + body


def test_wrong_header(path):
    with open(path, "wb") as f:
        f.write(frame({"format": "something-else/1"}))
    with pytest.raises(ValueError, match="not a feedback store: its header at byte 0"):
        FeedbackStore(path)
    with open(path, "wb") as f:
        f.write(frame({"format": "tinyllm.feedback/2", "created": 0, "tokenizer": None}))
    with pytest.raises(ValueError, match="format tinyllm.feedback/2; this tinyllm reads tinyllm.feedback/1: upgrade"):
        FeedbackStore(path)
    with open(path, "wb") as f:  # a checksummed frame that is not a record of ours
        f.write(frame({"format": "tinyllm.feedback/1", "created": 0, "tokenizer": None}) + frame({"index": 3}))
    with pytest.raises(ValueError, match="the record at byte .* is not record 0"):
        FeedbackStore(path)


# ---- the tokenizer ----
class CharTokenizer:
    """A character-level tokenizer like examples/gpt_files.py's: no eot_token."""

    def __init__(self, vocab):
        self.vocab, self.n_vocab = vocab, len(vocab)

    def decode_single_token_bytes(self, i):
        return self.vocab[i].encode("utf-8")


class Holes(CharTokenizer):
    """Some ids have no token (KeyError), as in tiktoken encodings with gaps."""

    def decode_single_token_bytes(self, i):
        if self.vocab[i] == "?":
            raise KeyError(i)
        return super().decode_single_token_bytes(i)


def test_tokenizer_fingerprint():
    a = CharTokenizer("abc")
    fp = tokenizer_fingerprint(a)
    assert len(fp) == 64 and int(fp, 16) >= 0
    assert tokenizer_fingerprint(a) == fp == tokenizer_fingerprint(CharTokenizer("abc"))
    others = {tokenizer_fingerprint(t) for t in [CharTokenizer("abd"), CharTokenizer("ab"), CharTokenizer("ba"),
                                                 CharTokenizer("abc?"), Holes("abc?")]}
    assert len(others) == 5 and fp not in others
    with pytest.raises(TypeError, match="has no n_vocab"):
        tokenizer_fingerprint(object())


def gpt2():
    from tinyllm.tokenizer import Tokenizer
    try:
        return Tokenizer.gpt2()
    except ImportError as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(e))


def test_tokenizer_mismatch(path, tmp_path):
    tok, char = gpt2(), CharTokenizer("abcdefgh")
    t = time.perf_counter()
    fp = tokenizer_fingerprint(tok)
    first = time.perf_counter() - t
    t = time.perf_counter()
    assert tokenizer_fingerprint(tok) == fp  # cached per object: the second call does not walk 50,257 tokens
    assert time.perf_counter() - t < max(first / 10, 1e-3)
    store = FeedbackStore(path, tokenizer=tok)
    assert store.tokenizer_fingerprint == fp
    fill(store, 3)
    store.close()
    with pytest.raises(ValueError, match=rf"written for another tokenizer: its header's fingerprint {fp[:12]} "
                                         rf"\(n_vocab 50257\), this tokenizer's {tokenizer_fingerprint(char)[:12]} "
                                         r"\(n_vocab 8\)\. Open it with the tokenizer it was written with, or start "
                                         r"a new store"):
        FeedbackStore(path, tokenizer=char)
    assert len(FeedbackStore(path, tokenizer=tok)) == 3  # the same tokenizer (a new object too: by content)
    assert len(FeedbackStore(path)) == 3  # tokenizer=None: no check
    free = str(tmp_path / "free.tlfb")  # created without a tokenizer: records none, accepts any
    FeedbackStore(free).add("p", "c", 1)
    assert FeedbackStore(free, tokenizer=char).tokenizer_fingerprint is None
    assert len(FeedbackStore(free, tokenizer=tok)) == 1


# ---- torn tails and damage ----
def torn(path, how):
    """Damage the last frame: cut inside its head, cut inside its payload, or flip a payload byte."""
    off, n = frames(path)[-1]
    size = os.path.getsize(path)
    if how == "head":
        os.truncate(path, off + 5)
    elif how == "payload":
        os.truncate(path, off + HEAD.size + n // 2)
    else:
        with open(path, "r+b") as f:
            f.seek(off + HEAD.size + n // 2)
            b = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b[0] ^ 0x20]))
    return off, os.path.getsize(path) - off, size


@pytest.mark.parametrize("how", ["head", "payload", "flip"])
def test_torn_tail(path, how):
    fill(FeedbackStore(path), 5)
    off, n, _ = torn(path, how)
    with pytest.warns(RuntimeWarning, match=rf"feedback store {path}: a torn tail at byte {off} \({n} bytes"):
        ro = FeedbackStore(path, readonly=True)  # reading only: skipped, not truncated
    assert len(ro) == 4 and os.path.getsize(path) == off + n
    with pytest.warns(RuntimeWarning, match=rf"torn tail at byte {off} \({n} bytes.*truncated it"):
        store = FeedbackStore(path)
    assert len(store) == 4 and os.path.getsize(path) == off
    assert store.add("after", "the crash", 1) == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = FeedbackStore(path)
    assert [r.index for r in again] == [0, 1, 2, 3, 4] and again[4].prompt == "after"
    assert again[3] == store[3]


def test_torn_header(path):
    FeedbackStore(path).close()
    os.truncate(path, 7)  # killed while writing the header of a new store
    with pytest.warns(RuntimeWarning, match="torn tail at byte 0 \\(7 bytes"):
        store = FeedbackStore(path, tokenizer=CharTokenizer("ab"))
    assert store.tokenizer_fingerprint == tokenizer_fingerprint(CharTokenizer("ab"))
    assert store.add("p", "c", 1) == 0 and len(FeedbackStore(path)) == 1


@pytest.mark.parametrize("where", ["flip", "cut"])
def test_damage_before_the_tail_is_an_error(path, where):
    fill(FeedbackStore(path), 5)
    off, n = frames(path)[2]
    data = bytearray(open(path, "rb").read())
    if where == "flip":
        data[off + HEAD.size + 3] ^= 0x01
    else:  # bytes lost from the middle: the frame's length now reaches into the next one
        del data[off + HEAD.size + 2:off + HEAD.size + 6]
    open(path, "wb").write(data)
    for readonly in (True, False):
        with pytest.raises(ValueError, match=rf"feedback store {path} is damaged at byte {off}: .* followed by valid "
                                             r"frames at byte \d+.*restore the file from a backup"):
            FeedbackStore(path, readonly=readonly)
    assert open(path, "rb").read() == data  # never truncated


def test_second_writer_appends_after_the_first(path):
    a, b = FeedbackStore(path), FeedbackStore(path)
    assert a.add("a", "first", 1) == 0
    assert b.add("b", "second", 1) == 1  # b catches up with a's frame under the lock before appending
    assert a.add("a", "third", -1) == 2
    assert [r.completion for r in FeedbackStore(path)] == ["first", "second", "third"]
    assert b.refresh() == 1 and len(b) == 3


# ---- the kill test ----
GENERATOR = r'''
import random

ALPHABET = "abcdefghij klmnop\n\t\"\\é中文🌍✓"


def content(i):
    """Record i's arguments, a function of i alone: (kind, prompt, a, b); ~1 in 5 records is large (~100 KB)."""
    rng = random.Random(i)
    size = rng.randrange(30_000, 150_000) if rng.random() < 0.2 else rng.randrange(1, 300)
    unit = "".join(rng.choices(ALPHABET, k=64))
    text = (f"<{i}>" + unit * (size // 64 + 1))[:size]
    kind = ("rating", "pair", "edit")[i % 3]
    return kind, f"prompt {i} {unit[:8]}", text, ((1, -1)[i % 2] if kind == "rating" else f"other {i} {unit[:5]}")
'''
exec(GENERATOR)

CHILD = GENERATOR + r'''
import os, sys, time
from tinyllm.continual.store import FeedbackStore

path, mode = sys.argv[1], sys.argv[2]
store = FeedbackStore(path, model_version="child")
if mode != "plain":  # a slow disk: writes of at most 64 KiB, each one short write the store must finish
    real_write = os.write

    def slow_write(fd, data):
        n = real_write(fd, bytes(data[:65536]))
        if mode == "mid" and n < len(data):  # inside a frame: tell the parent, which kills us now
            print("mid", flush=True)
            time.sleep(10)
        time.sleep(0.02)  # long enough that a random kill often lands between two pieces of a frame
        return n
    os.write = slow_write
print("ready", len(store), flush=True)
while True:
    i = len(store)
    kind, prompt, a, b = content(i)
    add = {"rating": store.add, "pair": store.add_pair, "edit": store.add_edit}[kind]
    assert add(prompt, a, b) == i
    print(i, flush=True)
'''


def check_record(r, i, version="child"):
    kind, prompt, a, b = content(i)
    assert (r.index, r.kind, r.prompt, r.model_version) == (i, kind, prompt, version)
    assert ((r.completion, r.signal) if kind == "rating" else (r.chosen, r.rejected) if kind == "pair"
            else (r.completion, r.edited)) == (a, b)


@pytest.mark.slow
def test_sigkill_loses_at_most_the_record_in_flight(path):
    rng = random.Random(46)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    kills, torn_tails, random_torn, reported_total, unreported_kept = 0, 0, 0, 0, 0
    n_before = 0
    for round_ in range(15):
        mode = ("plain", "slow", "mid")[round_ % 3]
        child = subprocess.Popen([sys.executable, "-c", CHILD, path, mode], stdout=subprocess.PIPE, env=env,
                                 text=True)
        lines = []
        try:
            ready = child.stdout.readline().split()
            assert ready[0] == "ready" and int(ready[1]) == n_before, ready
            if mode == "mid":
                while (line := child.stdout.readline()) and line != "mid\n":
                    lines.append(line)
                assert line == "mid\n", "the child never wrote a large record"
            else:
                time.sleep(rng.uniform(0.02, 0.4))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        kills += 1
        assert child.returncode == -signal.SIGKILL
        reported = [int(x) for x in "".join(lines + [child.stdout.read()]).split() if x.isdigit()]
        assert reported == list(range(n_before, n_before + len(reported)))
        child.stdout.close()
        last = reported[-1] if reported else n_before - 1
        reported_total += len(reported)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            store = FeedbackStore(path, model_version="child")
        torn = [w for w in caught if "torn tail" in str(w.message)]
        assert len(caught) == len(torn) <= 1
        torn_tails += len(torn)
        random_torn += len(torn) if mode != "mid" else 0
        if mode == "mid":
            assert len(torn) == 1, "killed inside a frame, yet no torn tail"
        # every record whose add returned (reported) is there; at most one more (add returned, print did not)
        assert last + 1 <= len(store) <= last + 2, (last, len(store))
        unreported_kept += len(store) - (last + 1)
        for r in store.records(n_before):
            check_record(r, r.index)
        assert os.path.getsize(path) == (frames(path)[-1][0] + HEAD.size + frames(path)[-1][1])  # truncated
        # appending goes on right after the valid records
        i = len(store)
        kind, prompt, a, b = content(i)
        assert {"rating": store.add, "pair": store.add_pair, "edit": store.add_edit}[kind](prompt, a, b) == i
        store.close()
        n_before = i + 1
    final = FeedbackStore(path, readonly=True)
    assert len(final) == n_before
    for r in final:
        check_record(r, r.index)
    print(f"\nkill test: {kills} SIGKILLs, {reported_total} adds reported by the child, {len(final)} records on "
          f"disk at the end, all intact; {unreported_kept} kept though killed before reporting; {torn_tails} torn "
          f"tails detected and truncated ({random_torn} at random kills, {kills // 3} at kills forced mid-frame)")
    assert torn_tails >= kills // 3
