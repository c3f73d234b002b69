"""tinyllm.utils.data against torch.utils.data: the same batches for the same index orders (sequential, drop_last,
batch samplers, DistributedSampler), the same collated structure and dtypes, the same errors; shuffling by
statistics (its orders are NumPy's permutations, not torch's): every permutation and every position equally likely
by Pearson's chi-squared, with a check that the statistic rejects biased shuffles; reproducible from a seed."""
import collections
import itertools
import math

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from hypothesis import given, strategies as st

import tinyllm as tl
from tinyllm.utils import data
from tinyllm.utils.data import (BatchSampler, DataLoader, Dataset, DistributedSampler, RandomSampler,
                                SequentialSampler, TensorDataset, default_collate, default_convert)

from helpers import chi2_pvalue

DEVICE = "numpy"  # batches gathered on the reference runtime: no kernels to compile for each drawn shape
Point = collections.namedtuple("Point", "x y")


def plain(x):
    """A loaded value in a form that compares across the two libraries: a tensor as ("tensor", dtype name, values),
    a container as its type's name and contents."""
    if isinstance(x, (tl.Tensor, torch.Tensor)):
        return "tensor", str(x.dtype).rpartition(".")[2], x.numpy().tolist()
    if isinstance(x, dict):
        return type(x).__name__, {k: plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x).__name__, [plain(v) for v in x]
    return x


def both(fn):
    """fn(tinyllm.utils.data) and fn(torch.utils.data), each loaded value in plain form."""
    return [[plain(batch) for batch in fn(module)] for module in (data, tud)]


def listed(module, samples):
    """A Dataset subclass of `module` over a list of samples."""
    class Listed(module.Dataset):
        def __getitem__(self, i):
            return samples[i]

        def __len__(self):
            return len(samples)
    return Listed()


def arange_dataset(module, n):
    """TensorDataset of an index column (int64) and a float column."""
    if module is data:
        i = tl.arange(n, device=DEVICE)
        return TensorDataset(i, i.float() * 0.5)
    i = torch.arange(n)
    return tud.TensorDataset(i, i.float() * 0.5)


# ---- the same batches as torch for the same order -----------------------------------------------------------------
@given(st.integers(1, 23), st.integers(1, 7), st.booleans())
def test_sequential_batches_like_torch(n, batch_size, drop_last):
    loaders = {m: m.DataLoader(arange_dataset(m, n), batch_size=batch_size, drop_last=drop_last) for m in (data, tud)}
    ours, theirs = both(lambda m: loaders[m])
    assert ours == theirs
    assert len(loaders[data]) == len(loaders[tud]) == len(ours) == (n // batch_size if drop_last
                                                                    else math.ceil(n / batch_size))


@given(st.integers(0, 23), st.integers(1, 7), st.booleans())
def test_samplers_like_torch(n, batch_size, drop_last):
    for ours, theirs in [(SequentialSampler(range(n)), tud.SequentialSampler(range(n))),
                         (BatchSampler(range(n), batch_size, drop_last), tud.BatchSampler(range(n), batch_size,
                                                                                          drop_last))]:
        assert list(ours) == list(theirs) and len(ours) == len(theirs)


def test_batch_sampler_and_unbatched_like_torch():
    samples = [{"x": np.full(2, i, np.float32), "label": i, "name": f"s{i}"} for i in range(7)]
    order = [[6, 0], [3], [2, 5, 1]]
    assert both(lambda m: m.DataLoader(listed(m, samples), batch_sampler=order)) \
        == [[plain(default_collate([samples[i] for i in b])) for b in order]] * 2
    ours, theirs = both(lambda m: m.DataLoader(listed(m, samples), batch_size=None))
    assert ours == theirs and ours[0] == ("dict", {"x": ("tensor", "float32", [0.0, 0.0]), "label": 0, "name": "s0"})
    assert len(DataLoader(listed(data, samples), batch_size=None)) == 7


COLLATE_CASES = {
    "ints": [3, 1, 2],
    "floats": [0.5, 1.5],  # float64, as torch
    "bools": [True, False],
    "numpy float32 rows": [np.arange(3, dtype=np.float32), np.ones(3, np.float32)],
    "numpy int64 and float64": [(np.arange(2), np.zeros((2, 2))), (np.arange(2) + 1, np.ones((2, 2)))],
    "numpy scalars": [np.float32(1.5), np.float32(2.5)],
    "0-d arrays": [np.array(1.5), np.array(2.0)],
    "tuple -> list": [(np.zeros(2, np.float32), 1), (np.ones(2, np.float32), 0)],
    "strings and bytes": [("a", b"x"), ("b", b"y")],
    "dict, nested": [{"x": [1.0, 2.0], "y": {"z": 1}}, {"x": [3.0, 4.0], "y": {"z": 2}}],
    "ordered dict": [collections.OrderedDict(b=1, a=2.0), collections.OrderedDict(b=3, a=4.0)],
    "named tuple": [Point(1, 2.0), Point(3, 4.0)],
    "lists": [[1, 2, 3], [4, 5, 6]],
}


@pytest.mark.parametrize("case", COLLATE_CASES)
def test_default_collate_like_torch(case):
    samples = COLLATE_CASES[case]
    assert plain(default_collate(samples)) == plain(tud.default_collate(samples))
    assert plain(default_convert(samples[0])) == plain(tud.default_convert(samples[0]))


def test_collate_stacks_tinyllm_tensors():
    rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    ours = default_collate([(tl.tensor(r, device=DEVICE), tl.tensor(i, device=DEVICE)) for i, r in enumerate(rows)])
    theirs = tud.default_collate([(torch.tensor(r), torch.tensor(i)) for i, r in enumerate(rows)])
    assert plain(ours) == plain(theirs)


@pytest.mark.parametrize("device", [DEVICE, None])  # None: the default runtime (C where built)
def test_tensor_dataset_batch_is_the_collated_samples(device):
    """A TensorDataset's batch is gathered at once; it must equal default_collate of its samples."""
    x = tl.tensor(np.random.default_rng(0).normal(size=(10, 2, 3)).astype(np.float32), device=device)
    y = tl.arange(10, device=device)
    ds = TensorDataset(x, y)
    for indices in [[0], [7, 2, 9], list(range(10))[::-1]]:
        got = DataLoader(ds, batch_sampler=[indices])
        assert [plain(b) for b in got] == [plain(default_collate([ds[i] for i in indices]))]
        assert all(t.device == x.device for t in next(iter(got)))

    class Shifted(TensorDataset):  # its own samples: the loader must not gather around them
        def __getitem__(self, i):
            return tuple(t + 1 for t in super().__getitem__(i))
    assert plain(next(iter(DataLoader(Shifted(x, y), batch_size=3)))[1]) == ("tensor", "int64", [1, 2, 3])


def test_concat_dataset_like_torch():
    a, b = [10, 11, 12], [20, 21]
    ours, theirs = listed(data, a) + listed(data, b), listed(tud, a) + listed(tud, b)
    assert len(ours) == len(theirs) == 5
    assert [ours[i] for i in range(-5, 5)] == [theirs[i] for i in range(-5, 5)]
    assert both(lambda m: m.DataLoader(listed(m, a) + listed(m, b), batch_size=2))[0] == \
        [("tensor", "int64", [10, 11]), ("tensor", "int64", [12, 20]), ("tensor", "int64", [21])]
    with pytest.raises(IndexError, match="index 5 is out of range for 5 samples"):
        ours[5]


# ---- shuffling: statistics and seeds ------------------------------------------------------------------------------
class RotationSampler(data.Sampler):
    """A biased shuffle: a random rotation of 0..n-1. Each index is uniform over the positions, yet only n of the n!
    orders ever come out."""

    def __init__(self, n, seed):
        self.n, self.rng = n, np.random.default_rng(seed)

    def __iter__(self):
        return iter(np.roll(np.arange(self.n), self.rng.integers(self.n)).tolist())

    def __len__(self):
        return self.n


class NaiveSwapSampler(RotationSampler):
    """The classic biased shuffle: swap each position with any position (n^n equally likely runs over n! orders)."""

    def __iter__(self):
        order = list(range(self.n))
        for i in range(self.n):
            j = self.rng.integers(self.n)
            order[i], order[j] = order[j], order[i]
        return iter(order)


def epoch_orders(loader, epochs):
    """The order of the indices in each of `epochs` passes over a dataset of indices."""
    return [np.concatenate([b.numpy() for b in loader]).tolist() for _ in range(epochs)]


def permutation_pvalue(orders, n):
    perms = {p: i for i, p in enumerate(itertools.permutations(range(n)))}
    counts = np.bincount([perms[tuple(o)] for o in orders], minlength=len(perms))
    return chi2_pvalue(counts, np.ones(len(perms)))


def position_pvalues(orders, n):
    """For each index, the p-value of "it is equally likely at every position"."""
    at = np.argsort(np.array(orders), axis=1)  # at[e, i]: where index i came in epoch e
    return [chi2_pvalue(np.bincount(at[:, i], minlength=n), np.ones(n)) for i in range(n)]


def test_shuffle_draws_every_permutation_equally():
    n = 4  # 24 orders, 100 epochs each expected
    loader = DataLoader(range(n), batch_size=3, shuffle=True, generator=tl.Generator().manual_seed(1))
    assert permutation_pvalue(epoch_orders(loader, 2400), n) > 1e-4


def test_shuffle_puts_each_index_anywhere_equally():
    n = 10
    loader = DataLoader(range(n), batch_size=4, shuffle=True, generator=tl.Generator().manual_seed(2))
    orders = epoch_orders(loader, 1000)
    assert all(sorted(o) == list(range(n)) for o in orders)
    assert min(position_pvalues(orders, n)) > 1e-4 / n  # (Bonferroni over the n indices)


def test_the_statistics_reject_biased_shuffles():
    rotations = epoch_orders(DataLoader(range(4), batch_size=3, sampler=RotationSampler(4, 0)), 2400)
    assert min(position_pvalues(rotations, 4)) > 1e-4 / 4  # positions alone cannot tell a rotation
    assert permutation_pvalue(rotations, 4) < 1e-6  # the permutations can
    naive = epoch_orders(DataLoader(range(3), batch_size=3, sampler=NaiveSwapSampler(3, 0)), 6000)
    assert permutation_pvalue(naive, 3) < 1e-6


def test_random_sampler_with_replacement_and_num_samples():
    draws = list(RandomSampler(range(5), replacement=True, num_samples=5000, generator=tl.Generator().manual_seed(3)))
    assert len(draws) == 5000 and chi2_pvalue(np.bincount(draws, minlength=5), np.ones(5)) > 1e-4
    long = list(RandomSampler(range(4), num_samples=10, generator=tl.Generator().manual_seed(3)))
    assert len(long) == len(tud.RandomSampler(range(4), num_samples=10)) == 10
    assert sorted(long[:4]) == sorted(long[4:8]) == [0, 1, 2, 3] and len(set(long[8:])) == 2  # whole permutations


def test_seeded_generator_reproduces_the_order():
    def orders(seed, epochs=3):
        loader = DataLoader(range(20), batch_size=6, shuffle=True, generator=tl.Generator().manual_seed(seed))
        return epoch_orders(loader, epochs)
    first = orders(7)
    assert first == orders(7)
    assert first[0] != first[1] != first[2], "each epoch draws a new permutation"
    assert first != orders(8)
    # the orders are NumPy's: PCG64 seeded as np.random.default_rng(seed), one permutation per epoch
    rng = np.random.default_rng(7)
    assert first == [rng.permutation(20).tolist() for _ in range(3)]


def test_default_generator_follows_manual_seed():
    loader = DataLoader(range(20), batch_size=5, shuffle=True)
    tl.manual_seed(11)
    a = epoch_orders(loader, 2)
    tl.manual_seed(11)
    assert epoch_orders(loader, 2) == a


# ---- DistributedSampler as a loader's sampler ---------------------------------------------------------------------
@pytest.mark.parametrize("shuffle", [False, True])
def test_loader_over_distributed_sampler(shuffle):
    n, world = 13, 3
    ours = [DataLoader(range(n), batch_size=2, sampler=DistributedSampler(range(n), world, r, shuffle=shuffle))
            for r in range(world)]
    theirs = [tud.DataLoader(range(n), batch_size=2, sampler=tud.DistributedSampler(range(n), world, r,
                                                                                     shuffle=shuffle))
              for r in range(world)]
    assert [len(loader) for loader in ours] == [len(loader) for loader in theirs] == [3] * world
    shards = [epoch_orders(loader, 1)[0] for loader in ours]
    assert sorted(sum(shards, [])[:n]) != [] and set(sum(shards, [])) == set(range(n))
    if not shuffle:
        assert shards == [epoch_orders(loader, 1)[0] for loader in theirs]
    else:
        for loader in ours:
            loader.sampler.set_epoch(1)
        assert [epoch_orders(loader, 1)[0] for loader in ours] != shards


# ---- errors ---------------------------------------------------------------------------------------------------------
def test_tensor_dataset_errors():
    with pytest.raises(ValueError, match=r"first dimensions .* must agree, got sizes \[5, 4\] \(shapes \(5, 2\), "
                                         r"\(4,\)\)"):
        TensorDataset(tl.zeros(5, 2), tl.zeros(4))
    with pytest.raises(ValueError, match="at least one tensor"):
        TensorDataset()
    with pytest.raises(TypeError, match=r"argument 0 is a ndarray; .*tinyllm.from_numpy"):
        TensorDataset(np.zeros(3))
    with pytest.raises(ValueError, match="argument 1 is 0-d"):
        TensorDataset(tl.zeros(3), tl.tensor(1.0))


def test_dataset_must_define_getitem():
    class Empty(Dataset):
        pass
    with pytest.raises(NotImplementedError, match="Empty: a Dataset subclass must define __getitem__"):
        Empty()[0]


@pytest.mark.parametrize("kwargs, message", [
    (dict(sampler=[0, 1], shuffle=True), "sampler option is mutually exclusive with shuffle"),
    (dict(batch_sampler=[[0]], batch_size=2), "batch_sampler option is mutually exclusive"),
    (dict(batch_sampler=[[0]], drop_last=True), "batch_sampler option is mutually exclusive"),
    (dict(batch_size=None, drop_last=True), "batch_size=None option disables auto-batching"),
    (dict(batch_size=0), "batch_size"),
])
def test_loader_errors_like_torch(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DataLoader(range(4), **kwargs)
    with pytest.raises(ValueError):
        tud.DataLoader(range(4), **kwargs)


def test_workers_refused():
    with pytest.raises(ValueError, match="num_workers=2: .* pass num_workers=0"):
        DataLoader(range(4), num_workers=2)
    assert DataLoader(range(4), num_workers=0, pin_memory=True).num_workers == 0


def test_collate_errors_like_torch():
    cases = [([np.zeros(2), np.zeros(3)], RuntimeError, r"need one shape, got \[\(2,\), \(3,\)\]"),
             ([[1, 2], [1]], RuntimeError, r"equal size, got lengths \[1, 2\]"),
             ([object()], TypeError, "batch must contain tensors, numpy arrays"),
             ([np.array(["a"])], TypeError, "batch must contain tensors, numpy arrays")]
    for batch, error, message in cases:
        with pytest.raises(error, match=message):
            default_collate(batch)
        with pytest.raises(error):
            tud.default_collate(batch)


def test_random_sampler_errors():
    with pytest.raises(ValueError, match=r"num_samples must be a positive int, got 0 \(the dataset is empty\)"):
        RandomSampler([])
    with pytest.raises(TypeError, match="expected a tinyllm.Generator"):
        DataLoader(range(3), shuffle=True, generator=torch.Generator())


def test_gradients_reach_a_tensor_dataset_that_requires_grad():
    w = tl.tensor([1.0, 2.0, 3.0, 4.0], device=DEVICE, requires_grad=True)
    (batch,) = next(iter(DataLoader(TensorDataset(w), batch_size=3)))
    (batch * batch).sum().backward()
    assert w.grad.numpy().tolist() == [2.0, 4.0, 6.0, 0.0]
