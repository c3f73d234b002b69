"""A dict whose values are held weakly, for the caches filled on every step (nodes, arrays): cheaper than
weakref.WeakValueDictionary, whose every insert builds its reference in Python (KeyedRef)."""
import functools
import weakref


def forget(refs, key, ref):
    # the entry's reference is always `ref`: a replaced one is freed with its entry, and a freed one never calls back
    refs.pop(key, None)


class WeakValues:
    """key -> value while the value is alive."""
    __slots__ = ("_refs",)

    def __init__(self):
        self._refs = {}

    def get(self, key):
        ref = self._refs.get(key)
        return None if ref is None else ref()

    def __setitem__(self, key, value):
        self._refs[key] = weakref.ref(value, functools.partial(forget, self._refs, key))

    def __delitem__(self, key):
        del self._refs[key]
