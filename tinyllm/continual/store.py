"""Users' feedback kept in one append-only file that survives crashes (FeedbackStore).

    store = FeedbackStore("feedback.tlfb", tokenizer=tok, model_version="adapter-3")
    store.add(prompt, completion, +1)                 # a rating: +1 (good) or -1 (bad)
    store.add_pair(prompt, chosen, rejected)          # a preference between two completions
    store.add_edit(prompt, completion, edited)        # the user's correction of the model's completion
    store.records(start)                              # the records added since the loop's last round

The file is a sequence of frames, each

    magic b"\\xffTLF" | u32 payload length | u32 crc32 of the payload | payload (UTF-8 JSON)      (little-endian)

The first frame is the header ({"format": "tinyllm.feedback/1", "created": time, "tokenizer": {"fingerprint":
sha256 hex, "n_vocab", "eot_token"} or null}); every later frame is one record, {"index": i, "kind": ..., ...}.

Guarantees, and why:
- A record is on disk when `add` returns: it is written with os.write on a descriptor opened O_APPEND (no
  user-space buffer to lose) and then fdatasync'd (the page cache alone would not survive a power cut). The
  directory is fsync'd when the file is created, so the file's name survives too.
- A crash mid-write loses at most the record being written: appends never rewrite earlier bytes, so the only
  damage a killed writer can leave is a *torn tail*, the prefix of its last frame. The length prefix says where a
  frame should end and the CRC says whether its bytes are the ones written, so a torn tail (a frame cut short, or a
  checksum mismatch in the last frame) is recognized: it is skipped with a warning and, when the store is opened
  for writing, truncated away so that new records follow the valid ones.
- Damage anywhere else (a bad frame with a valid frame after it) is not a torn write but a damaged file: opening it
  raises ValueError naming the offset, rather than silently dropping the good records around it. The magic never
  occurs inside a payload (0xff is not a byte of UTF-8), so a search for the next frame cannot be fooled by text.
- Each append holds an exclusive flock on the file, and catches up with frames another writer appended first, so
  two writers never interleave and indices stay 0, 1, 2, ... in file order.
- The header records the tokenizer's fingerprint (tokenizer_fingerprint), so feedback is never trained with a
  tokenizer other than the one its completions were made with.
"""
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import struct
import time
import warnings
import weakref
import zlib

FORMAT = "tinyllm.feedback/1"
MAGIC = b"\xffTLF"  # 0xff never occurs in UTF-8, hence never inside a payload
_HEAD = struct.Struct("<4sII")  # magic, payload length, crc32 of the payload
KINDS = ("rating", "pair", "edit")


@dataclasses.dataclass(frozen=True)
class Record:
    """One piece of feedback. `completion` is the rated text (rating) or the model's original (edit); `signal` is
    +1 / -1 (rating); `chosen`, `rejected` (pair); `edited` the user's correction (edit); `time` is time.time() at
    add; `model_version` the adapter version that produced the completion (None: unknown)."""
    index: int
    kind: str
    prompt: str
    completion: str | None = None
    signal: int | None = None
    chosen: str | None = None
    rejected: str | None = None
    edited: str | None = None
    time: float = 0.0
    model_version: str | None = None


_FIELDS = [f.name for f in dataclasses.fields(Record)]
_FINGERPRINTS = {}  # id(tokenizer) -> (weakref to it, fingerprint); a pass over the vocabulary costs ~0.1 s


def tokenizer_fingerprint(tokenizer):
    """sha256 hex over a tokenizer's n_vocab, eot_token and every token's bytes (decode_single_token_bytes; an id
    without a token, KeyError, hashes as a marker). Works for tinyllm's Tokenizer and tiktoken's Encoding; cached
    per tokenizer object."""
    key = id(tokenizer)
    hit = _FINGERPRINTS.get(key)
    if hit is not None and hit[0]() is tokenizer:
        return hit[1]
    try:
        n_vocab = int(tokenizer.n_vocab)
    except AttributeError:
        raise TypeError(f"tokenizer_fingerprint: {type(tokenizer).__name__} has no n_vocab; a tokenizer has n_vocab "
                        f"and decode_single_token_bytes (tinyllm's Tokenizer, tiktoken's Encoding)") from None
    h = hashlib.sha256(b"tinyllm.tokenizer-fingerprint/1\0")
    eot = _eot_token(tokenizer)
    h.update(struct.pack("<qq", n_vocab, -1 if eot is None else eot))
    for i in range(n_vocab):
        try:
            b = tokenizer.decode_single_token_bytes(i)
        except KeyError:
            h.update(b"\xff\xff\xff\xff")  # no token: a length no token has
            continue
        h.update(struct.pack("<I", len(b)))
        h.update(b)
    fingerprint = h.hexdigest()
    try:  # the entry goes when the tokenizer does, so a new object at the same id never gets a stale fingerprint
        ref = weakref.ref(tokenizer, lambda _, key=key: _FINGERPRINTS.pop(key, None))
        _FINGERPRINTS[key] = (ref, fingerprint)
    except TypeError:  # not weak-referenceable: not cached
        pass
    return fingerprint


def _eot_token(tokenizer):
    try:
        return int(tokenizer.eot_token)
    except (AttributeError, KeyError, TypeError):  # a character-level tokenizer may have none
        return None


def _frame(payload):
    body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return _HEAD.pack(MAGIC, len(body), zlib.crc32(body)) + body


def _parse(data, off):
    """(payload bytes, end offset) of the frame at data[off:], or (None, why) when there is no intact frame there."""
    if len(data) - off < _HEAD.size:
        return None, f"a frame head of {len(data) - off} of {_HEAD.size} bytes"
    magic, n, crc = _HEAD.unpack_from(data, off)
    if magic != MAGIC:
        return None, "no frame magic"
    end = off + _HEAD.size + n
    if end > len(data):
        return None, f"a frame of {n} payload bytes cut short at {len(data) - off - _HEAD.size}"
    body = bytes(data[off + _HEAD.size:end])
    if zlib.crc32(body) != crc:
        return None, "a frame whose checksum does not match its payload"
    return body, end


class FeedbackStore:
    """Feedback in the append-only file `path` (created, with its header, when missing; the directory must exist).
    `tokenizer`: checked against the fingerprint in the header of an existing store, recorded in a new one (None:
    no check; a store created without one accepts any). `model_version`: the default of each add's. `readonly`:
    open an existing store for reading only (a torn tail is skipped, not truncated)."""

    def __init__(self, path, *, tokenizer=None, model_version=None, readonly=False):
        self.path = os.fspath(path)
        self.model_version = _version(model_version, "FeedbackStore")
        self.readonly = bool(readonly)
        self._records, self._offsets, self._end = [], [], 0
        self.tokenizer_fingerprint, self._header = None, None
        folder = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"feedback store {self.path}: the directory {folder} does not exist; create it "
                                    f"first (os.makedirs) or choose another path")
        if os.path.isdir(self.path):
            raise IsADirectoryError(f"feedback store {self.path} is a directory; give a file's path")
        if self.readonly and not os.path.exists(self.path):
            raise FileNotFoundError(f"feedback store {self.path} does not exist (readonly=True opens an existing "
                                    f"store; open it without readonly to create it)")
        flags = os.O_RDONLY if self.readonly else os.O_RDWR | os.O_APPEND | os.O_CREAT
        self._fd = os.open(self.path, flags, 0o644)
        self._closer = weakref.finalize(self, os.close, self._fd)
        try:
            with self._locked(fcntl.LOCK_SH if self.readonly else fcntl.LOCK_EX):
                self._catch_up()
                if self._header is None and not self.readonly:
                    self._create(tokenizer)
        except BaseException:
            self.close()
            raise
        if tokenizer is not None and self.tokenizer_fingerprint is not None:
            self._check_tokenizer(tokenizer)

    # ---- reading ----
    def __len__(self):
        return len(self._records)

    def __iter__(self):
        return iter(list(self._records))

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self._records[i]
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"feedback store indices are ints or slices, got {type(i).__name__} {i!r:.40}")
        if not -len(self._records) <= i < len(self._records):
            raise IndexError(f"record {i} of a feedback store of {len(self._records)} records ({self.path})")
        return self._records[i]

    def records(self, start=0):
        """The records whose index is >= start, in order (the loop trains on those since its last round)."""
        if isinstance(start, bool) or not isinstance(start, int):
            raise TypeError(f"records: start must be an int, got {type(start).__name__} {start!r:.40}")
        if start < 0:
            raise ValueError(f"records: start must be >= 0 (a record index), got {start}")
        return self._records[start:]

    def refresh(self):
        """Read the records other processes appended since this store was opened; returns how many."""
        n = len(self._records)
        with self._locked(fcntl.LOCK_SH if self.readonly else fcntl.LOCK_EX):
            self._catch_up()
        return len(self._records) - n

    def __repr__(self):
        return f"<FeedbackStore {self.path!r} records={len(self)}>"

    # ---- writing ----
    def add(self, prompt, completion, signal, *, model_version=None):
        """A rating of `completion` (the model's answer to `prompt`): signal +1 (good) or -1 (bad). Returns its
        index."""
        if isinstance(signal, bool) or not isinstance(signal, int):
            raise TypeError(f"add: signal must be the int +1 or -1, got {type(signal).__name__} {signal!r:.40}")
        if signal not in (1, -1):
            raise ValueError(f"add: signal must be +1 (good) or -1 (bad), got {signal}")
        return self._append("rating", model_version, prompt=_text(prompt, "add", "prompt", empty=True),
                            completion=_text(completion, "add", "completion"), signal=signal)

    def add_pair(self, prompt, chosen, rejected, *, model_version=None):
        """A preference: the user chose `chosen` over `rejected` for `prompt`. Returns its index."""
        chosen, rejected = _text(chosen, "add_pair", "chosen"), _text(rejected, "add_pair", "rejected")
        if chosen == rejected:
            raise ValueError("add_pair: chosen and rejected are the same text, which prefers nothing; a pair needs "
                             "two different completions")
        return self._append("pair", model_version, prompt=_text(prompt, "add_pair", "prompt", empty=True),
                            chosen=chosen, rejected=rejected)

    def add_edit(self, prompt, completion, edited, *, model_version=None):
        """A correction: the user rewrote the model's `completion` as `edited`. Returns its index."""
        completion, edited = _text(completion, "add_edit", "completion"), _text(edited, "add_edit", "edited")
        if completion == edited:
            raise ValueError("add_edit: edited is the completion unchanged, which corrects nothing; to approve a "
                             "completion rate it: add(prompt, completion, +1)")
        return self._append("edit", model_version, prompt=_text(prompt, "add_edit", "prompt", empty=True),
                            completion=completion, edited=edited)

    def close(self):
        self._closer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- internals ----
    def _append(self, kind, model_version, **fields):
        fn = {"rating": "add", "pair": "add_pair", "edit": "add_edit"}[kind]
        version = self.model_version if model_version is None else _version(model_version, fn)
        if self.readonly:
            raise PermissionError(f"{fn}: feedback store {self.path} was opened with readonly=True; open it without "
                                  f"readonly to add records")
        with self._locked(fcntl.LOCK_EX):
            self._catch_up()  # another writer's frames first, so our index is the file's next
            record = Record(index=len(self._records), kind=kind, time=time.time(), model_version=version, **fields)
            payload = {k: v for k, v in dataclasses.asdict(record).items() if v is not None}
            start = self._end
            self._write(_frame(payload))
            self._records.append(record)
            self._offsets.append(start)
        return record.index

    def _write(self, data):
        """Append `data` and make it durable; on failure (disk full, ...) cut the file back to where it was."""
        try:
            view = memoryview(data)
            while view:  # a write may be short (a signal, a full disk): write the rest
                view = view[os.write(self._fd, view):]
            (os.fdatasync if hasattr(os, "fdatasync") else os.fsync)(self._fd)
        except BaseException:
            os.ftruncate(self._fd, self._end)
            raise
        self._end += len(data)

    def _create(self, tokenizer):
        header = {"format": FORMAT, "created": time.time(), "tokenizer": None}
        if tokenizer is not None:
            header["tokenizer"] = {"fingerprint": tokenizer_fingerprint(tokenizer), "n_vocab": int(tokenizer.n_vocab),
                                   "eot_token": _eot_token(tokenizer)}
        self._write(_frame(header))
        os.fsync(self._fd)
        # the new file's name is an entry in its directory: fsync that too, or a crash could lose the whole file
        dir_fd = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        self._header = header
        self.tokenizer_fingerprint = header["tokenizer"] and header["tokenizer"]["fingerprint"]

    @contextlib.contextmanager
    def _locked(self, how):
        if not self._closer.alive:
            raise ValueError(f"feedback store {self.path} is closed; open it again")
        fcntl.flock(self._fd, how)  # released when the process dies, so a killed writer never leaves it held
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _catch_up(self):
        """Read the frames from self._end to the end of the file (all of it on open). Call with the lock held."""
        size = os.fstat(self._fd).st_size
        if size < self._end:
            raise ValueError(f"feedback store {self.path} shrank from {self._end} to {size} bytes while open: "
                             f"something other than FeedbackStore rewrote it")
        if size == self._end:
            return
        data = os.pread(self._fd, size - self._end, self._end)
        base, off = self._end, 0  # file offsets are base + offsets into data
        if base == 0 and data[:len(MAGIC)] != MAGIC[:len(data)]:
            raise ValueError(f"{self.path} is not a feedback store: it starts with {data[:8]!r}, not the magic "
                             f"{MAGIC!r} (open a file FeedbackStore wrote, or a new path to start a store)")
        while off < len(data):
            body, end = _parse(data, off)
            if body is None:
                self._torn_tail(data, base, off, end)
                break
            try:
                payload = json.loads(body.decode("utf-8"))
            except ValueError:  # the checksum matched, so these are the bytes written: not a torn write
                raise ValueError(f"feedback store {self.path}: the frame at byte {base + off} is not UTF-8 JSON; the "
                                 f"file was not written by FeedbackStore") from None
            if self._header is None:
                self._read_header(payload, base + off)
            else:
                self._records.append(self._record(payload, base + off))
                self._offsets.append(base + off)
            off = end
            self._end = base + off

    def _torn_tail(self, data, base, off, why):
        p = data.find(MAGIC, off + 1)
        while p >= 0:  # a valid frame after the bad one: damage, not a torn write
            if _parse(data, p)[0] is not None:
                raise ValueError(f"feedback store {self.path} is damaged at byte {base + off}: {why}, followed by "
                                 f"valid frames at byte {base + p}. Only the last frame can be torn by a crash; "
                                 f"restore the file from a backup (records before byte {base + off} are intact)")
            p = data.find(MAGIC, p + 1)
        n = len(data) - off
        action = "truncated it" if not self.readonly else "skipped it (opened readonly: not truncated)"
        warnings.warn(f"feedback store {self.path}: a torn tail at byte {base + off} ({n} bytes: {why}), the "
                      f"record a crash interrupted; {action}", RuntimeWarning, stacklevel=4)
        if not self.readonly:
            os.ftruncate(self._fd, base + off)
            os.fsync(self._fd)

    def _read_header(self, header, offset):
        fmt = header.get("format") if isinstance(header, dict) else None
        if fmt != FORMAT:
            if isinstance(fmt, str) and fmt.startswith(FORMAT.split("/")[0] + "/"):
                raise ValueError(f"feedback store {self.path} has format {fmt}; this tinyllm reads {FORMAT}: "
                                 f"upgrade tinyllm to read it")
            raise ValueError(f"{self.path} is not a feedback store: its header at byte {offset} is not a "
                             f"{FORMAT} header ({str(header)[:60]})")
        self._header = header
        tok = header.get("tokenizer")
        self.tokenizer_fingerprint = tok["fingerprint"] if tok else None

    def _record(self, payload, offset):
        try:
            record = Record(**payload)
            bad = record.kind not in KINDS or record.index != len(self._records)
        except TypeError:
            bad = True
        if bad:
            raise ValueError(f"feedback store {self.path}: the record at byte {offset} is not record "
                             f"{len(self._records)} of a feedback store ({str(payload)[:80]}); the file was not "
                             f"written by FeedbackStore")
        return record

    def _check_tokenizer(self, tokenizer):
        mine = tokenizer_fingerprint(tokenizer)
        if mine != self.tokenizer_fingerprint:
            theirs = self._header["tokenizer"]
            self.close()
            raise ValueError(f"feedback store {self.path} was written for another tokenizer: its header's "
                             f"fingerprint {self.tokenizer_fingerprint[:12]} (n_vocab {theirs.get('n_vocab')}), "
                             f"this tokenizer's {mine[:12]} (n_vocab {tokenizer.n_vocab}). Open it with the "
                             f"tokenizer it was written with, or start a new store (another path) for this one")


def _text(value, fn, name, *, empty=False):
    if not isinstance(value, str):
        raise TypeError(f"{fn}: {name} must be a str, got {type(value).__name__} {value!r:.40}"
                        + (": decode bytes first (value.decode('utf-8'))" if isinstance(value, bytes) else ""))
    if not value and not empty:
        raise ValueError(f"{fn}: {name} is empty; feedback on an empty {name} teaches nothing")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{fn}: {name} has a lone surrogate at character {e.start}, which UTF-8 cannot store; "
                         f"fix the text (e.g. tinyllm.tokenizer.fix_surrogates)") from None
    return value


def _version(value, fn):
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{fn}: model_version must be a str or None, got {type(value).__name__} {value!r:.40}")
    if value == "":
        raise ValueError(f"{fn}: model_version is empty; give the adapter's version, or None for unknown")
    return value
