"""tinyllm/weak.py: the weak-valued dict behind the node cache and the runtimes' bookkeeping."""
import gc

from tinyllm.dtype import float32
from tinyllm.graph import Node
from tinyllm.weak import WeakValues


class Value:
    pass


def test_an_entry_lives_as_long_as_its_value():
    cache, value = WeakValues(), Value()
    cache["k"] = value
    assert cache.get("k") is value
    del value
    gc.collect()
    assert cache.get("k") is None and "k" not in cache._refs  # the entry itself is gone, not only its value


def test_a_replaced_value_dying_leaves_the_new_entry():
    cache, old, new = WeakValues(), Value(), Value()
    cache["k"] = old
    cache["k"] = new
    del old  # its reference's callback runs now: it must not remove the entry that holds `new`
    gc.collect()
    assert cache.get("k") is new


def test_delete_and_missing_keys():
    cache, value = WeakValues(), Value()
    cache["k"] = value
    del cache["k"]
    assert cache.get("k") is None and cache.get("other") is None


def test_nodes_stay_hash_consed():
    a = Node("CONST", (), 2.5, (3,), float32)
    assert Node("CONST", (), 2.5, (3,), float32) is a
    assert Node("CONST", (), -0.0, (3,), float32) is not Node("CONST", (), 0.0, (3,), float32)
