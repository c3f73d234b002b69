"""WeakValues: a dict whose values are held weakly, for the caches the core fills on every step.

weakref.WeakValueDictionary does the same, but each insert builds its reference in Python (KeyedRef's __new__
and __init__): twice the cost of this one, paid for every node a graph builds and every array a step makes."""
import functools
import weakref


def forget(refs, key, ref):
    # always the entry's current reference: one replaced by a newer value is freed with its entry, and a freed
    # reference never calls back
    refs.pop(key, None)


class WeakValues:
    """key -> value while the value is alive; its entry goes when the value is freed."""
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
