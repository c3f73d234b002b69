"""Bytes held by runtime buffers, with torch.cuda's names. Every array a runtime allocates is tracked by its
owning allocation (views cost nothing) and released when Python frees it, so the peak is what was really held."""
import threading
import weakref

_lock = threading.RLock()  # re-entrant: a finalizer may run (and uncount) while this thread holds it
_current = 0
_peak = 0
_tracked = {}  # id of an owning array -> the finalizer that uncounts it when freed


def owner(array):
    """The array that owns `array`'s memory (itself unless it is a view)."""
    while getattr(array, "base", None) is not None and hasattr(array.base, "nbytes"):
        array = array.base
    return array


def track(array, nbytes=None):
    """Count `array`'s storage (once, however many views of it exist) until it is freed."""
    global _current, _peak
    owner_ = owner(array)
    key = id(owner_)
    with _lock:
        if key in _tracked:
            return array
        size = owner_.nbytes if nbytes is None else nbytes
        _current += size
        _peak = max(_peak, _current)
        _tracked[key] = weakref.finalize(owner_, _release, key, size)
    return array


def untrack(array):
    """Stop counting `array` (it goes to a runtime's pool of free buffers, as torch's caching allocator keeps
    freed blocks reserved but not allocated)."""
    with _lock:
        fin = _tracked.get(id(array))
    info = fin.detach() if fin is not None else None  # (array, _release, (key, size), {}) if still live
    if info is not None:
        _release(*info[2])


def _release(key, size):
    global _current
    with _lock:
        _tracked.pop(key, None)
        _current -= size


def memory_allocated():
    """Bytes held now by the runtimes' buffers."""
    return _current


def max_memory_allocated():
    """The most bytes held at once since the start or the last reset_peak_memory_stats()."""
    return _peak


def reset_peak_memory_stats():
    global _peak
    _peak = _current
