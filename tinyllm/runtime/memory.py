"""Bytes held by runtime buffers, with torch.cuda's names. Every array a runtime allocates is tracked by its
owning allocation (views cost nothing) and released when Python frees it, so the peak is what was really held."""
import threading
import weakref

_lock = threading.RLock()  # re-entrant: a release callback may run (and uncount) while this thread holds it
_current = 0
_peak = 0
# id of an owning array -> [its size, whether it counts now, a weak reference whose callback drops the entry when
# the array is freed (a third of weakref.finalize's cost, paid for each array a training step allocates)]
_tracked = {}


def owner(array):
    """The array that owns `array`'s memory (itself unless it is a view)."""
    base = getattr(array, "base", None)
    while base is not None and hasattr(base, "nbytes"):
        array, base = base, getattr(base, "base", None)
    return array


def track(array, nbytes=None):
    """Count `array`'s storage (once, however many views of it exist) until it is freed or untracked."""
    global _current, _peak
    owner_ = owner(array)
    key = id(owner_)
    with _lock:
        entry = _tracked.get(key)
        if entry is None:
            entry = _tracked[key] = [owner_.nbytes if nbytes is None else nbytes, False,
                                     weakref.ref(owner_, lambda _, key=key: _release(key))]
        if not entry[1]:
            entry[1] = True
            _current += entry[0]
            _peak = max(_peak, _current)
    return array


def untrack(array):
    """Stop counting `array` (it goes to a runtime's pool of free buffers, as torch's caching allocator keeps
    freed blocks reserved but not allocated); track() counts it again when the pool hands it out. Its weak
    reference stays: making one per allocation would cost more than the kernel of a small tensor."""
    global _current
    with _lock:
        entry = _tracked.get(id(array))
        if entry is not None and entry[1]:
            entry[1] = False
            _current -= entry[0]


def _release(key):
    global _current
    with _lock:
        size, counted, _ = _tracked.pop(key)
        if counted:
            _current -= size


def note_peak(extra):
    """Something holds `extra` bytes more than is counted now, for a while (a replayed schedule's arena)."""
    global _peak
    with _lock:
        _peak = max(_peak, _current + extra)


def memory_allocated():
    """Bytes held now by the runtimes' buffers."""
    return _current


def max_memory_allocated():
    """The most bytes held at once since the start or the last reset_peak_memory_stats()."""
    return _peak


def reset_peak_memory_stats():
    global _peak
    _peak = _current
