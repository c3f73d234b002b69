"""tinyllm.utils.data.DistributedSampler against torch.utils.data.DistributedSampler's semantics (its own
permutations come from NumPy, so orders are compared as sets and counts, not element by element)."""
import pytest
import torch.utils.data as tud
from hypothesis import given, strategies as st

from tinyllm.utils.data import DistributedSampler


@given(st.integers(0, 40), st.integers(1, 5), st.booleans(), st.booleans(), st.integers(0, 3))
def test_shards_like_torch(n, world, shuffle, drop_last, epoch):
    ours = [DistributedSampler(range(n), world, r, shuffle=shuffle, drop_last=drop_last) for r in range(world)]
    theirs = [tud.DistributedSampler(range(n), world, r, shuffle=shuffle, drop_last=drop_last) for r in range(world)]
    for s in ours + theirs:
        s.set_epoch(epoch)
    mine, ref = [list(s) for s in ours], [list(s) for s in theirs]
    assert [len(s) for s in ours] == [len(s) for s in theirs] == [len(x) for x in mine] == [len(x) for x in ref]
    flat = sum(mine, [])
    assert set(flat) <= set(range(n))
    if not drop_last:
        assert set(flat) == set(range(n))  # every index on some rank (the padding repeats some)
    if drop_last or n % world == 0:
        assert len(set(flat)) == len(flat)  # disjoint
    if not shuffle:
        assert mine == ref  # without shuffling the shards are torch's exactly


def test_epochs_reshuffle_and_ranks_agree():
    a, b = DistributedSampler(range(100), 2, 0, seed=3), DistributedSampler(range(100), 2, 1, seed=3)
    first = list(a)
    assert set(first).isdisjoint(list(b)) and len(first) == 50
    a.set_epoch(1)
    assert list(a) != first and sorted(list(a) + list(DistributedSampler(range(100), 2, 1, seed=3))) != []
    b.set_epoch(1)
    assert sorted(list(a) + list(b)) == list(range(100))


def test_errors():
    with pytest.raises(ValueError, match=r"rank 2 is not in \[0, 1\]"):
        DistributedSampler(range(4), 2, 2)
    with pytest.raises(ValueError, match="num_replicas"):
        DistributedSampler(range(4), 0, 0)
    with pytest.raises(RuntimeError, match="init_process_group"):
        DistributedSampler(range(4))
