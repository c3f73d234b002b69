"""torch.utils.data's names and semantics: Dataset, TensorDataset, ConcatDataset, the samplers (SequentialSampler,
RandomSampler, BatchSampler, DistributedSampler), default_collate / default_convert and DataLoader.

    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True, generator=tinyllm.Generator().manual_seed(0))
    for xb, yb in loader: ...

Batches are loaded in this process (num_workers=0 only): a TensorDataset's batch is one NumPy indexing per tensor,
with no Python per sample. Random orders come from a tinyllm.Generator (`generator=`, else the default one that
tinyllm.manual_seed seeds), so a seeded run draws the same batches every time; the orders are NumPy's permutations,
not torch's."""
import bisect
import collections.abc
import itertools
import math

import numpy as np

from .. import dtype as dt
from .. import process_group as dist
from ..factory import numpy_generator, stack, tensor
from ..tensor import Tensor


# ---- datasets ---------------------------------------------------------------------------------------------------
class Dataset:
    """A map-style dataset: `dataset[i]` is sample i, for 0 <= i < len(dataset). Subclasses define __getitem__ and
    __len__. There is no default __len__, as in torch: one that raised would make `bool(dataset)` raise too."""

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__}: a Dataset subclass must define __getitem__ (and __len__)")

    def __add__(self, other):
        return ConcatDataset([self, other])


class TensorDataset(Dataset):
    """Sample i is (tensors[0][i], tensors[1][i], ...): the tensors' first dimension counts the samples."""

    def __init__(self, *tensors):
        if not tensors:
            raise ValueError("TensorDataset: expected at least one tensor, got none")
        for i, t in enumerate(tensors):
            if not isinstance(t, Tensor):
                raise TypeError(f"TensorDataset: argument {i} is a {type(t).__name__}; pass tinyllm tensors "
                                "(tinyllm.from_numpy(array) for a NumPy array)")
            if t.ndim == 0:
                raise ValueError(f"TensorDataset: argument {i} is 0-d; every tensor needs a first dimension that "
                                 "counts the samples")
        sizes = [t.shape[0] for t in tensors]
        if len(set(sizes)) > 1:
            raise ValueError(f"TensorDataset: the tensors' first dimensions are the samples and must agree, got "
                             f"sizes {sizes} (shapes {', '.join(str(tuple(t.shape)) for t in tensors)})")
        self.tensors = tensors

    def __getitem__(self, index):
        return tuple(t[index] for t in self.tensors)

    def __len__(self):
        return self.tensors[0].shape[0]

    def _batch(self, indices):
        """What default_collate makes of [self[i] for i in indices], with one indexing per tensor: its rows picked
        from its values on the host (read once: a runtime keeps them) into one new tensor, as a torch batch is
        indexed on the CPU and moved to the device, with no graph to build or run; a tensor that requires grad is
        gathered instead, so gradients reach it as through its samples."""
        indices = np.asarray(indices, dtype=np.int64)
        return [t[tensor(indices, device=t.device)] if t.requires_grad else
                tensor(t.numpy()[indices], dtype=t.dtype, device=t.device) for t in self.tensors]


class ConcatDataset(Dataset):
    """The datasets one after another (what `dataset_a + dataset_b` gives)."""

    def __init__(self, datasets):
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("ConcatDataset: expected at least one dataset, got none")
        self.cumulative_sizes = list(itertools.accumulate(len(d) for d in self.datasets))

    def __len__(self):
        return self.cumulative_sizes[-1]

    def __getitem__(self, index):
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"ConcatDataset: index {index} is out of range for {n} samples")
        index %= n
        d = bisect.bisect_right(self.cumulative_sizes, index)
        return self.datasets[d][index - (self.cumulative_sizes[d - 1] if d else 0)]


# ---- samplers: the order of the indices -------------------------------------------------------------------------
class Sampler:
    """Iterates over dataset indices (or, for a batch sampler, lists of them)."""

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__}: a Sampler subclass must define __iter__")


class SequentialSampler(Sampler):
    """0, 1, ..., len(data_source) - 1."""

    def __init__(self, data_source):
        self.data_source = data_source

    def __iter__(self):
        return iter(range(len(self.data_source)))

    def __len__(self):
        return len(self.data_source)


class RandomSampler(Sampler):
    """A new permutation of the indices each time it is iterated, drawn then from `generator` (a tinyllm.Generator;
    default: the default one). num_samples > len(data_source) without replacement: whole permutations, then part of
    one, as torch; replacement=True: num_samples independent uniform draws."""

    def __init__(self, data_source, replacement=False, num_samples=None, generator=None):
        if not isinstance(replacement, bool):
            raise TypeError(f"RandomSampler: replacement must be a bool, got {replacement!r}")
        self.data_source, self.replacement, self._num_samples, self.generator = (data_source, replacement,
                                                                                 num_samples, generator)
        if not isinstance(self.num_samples, int) or isinstance(self.num_samples, bool) or self.num_samples <= 0:
            raise ValueError(f"RandomSampler: num_samples must be a positive int, got {self.num_samples!r}"
                             + (" (the dataset is empty)" if num_samples is None else ""))
        numpy_generator(generator)  # a wrong generator fails here, not at the first epoch

    @property
    def num_samples(self):
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __iter__(self):
        rng, n, k = numpy_generator(self.generator), len(self.data_source), self.num_samples
        if self.replacement:
            yield from rng.integers(0, n, size=k).tolist()
            return
        for _ in range(k // n):
            yield from rng.permutation(n).tolist()
        if k % n:
            yield from rng.permutation(n)[:k % n].tolist()

    def __len__(self):
        return self.num_samples


class BatchSampler(Sampler):
    """Lists of batch_size indices from `sampler`; the last one shorter, or dropped with drop_last."""

    def __init__(self, sampler, batch_size, drop_last):
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(f"BatchSampler: batch_size must be a positive int, got {batch_size!r} (for no "
                             "batching, DataLoader takes batch_size=None)")
        if not isinstance(drop_last, bool):
            raise TypeError(f"BatchSampler: drop_last must be a bool, got {drop_last!r}")
        self.sampler, self.batch_size, self.drop_last = sampler, batch_size, drop_last

    def __iter__(self):
        batch = []
        for index in self.sampler:
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def __len__(self):
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)


class DistributedSampler(Sampler):
    """Indices of `dataset` (anything with len()) for rank `rank` of `num_replicas` (by default, the process group's):
    each rank of a data-parallel job iterates over its own shard, the shards disjoint (up to the padding that evens
    them out). shuffle: a permutation seeded by seed + epoch, the same on every rank because every rank seeds it
    alike, reshuffled by set_epoch; drop_last: drop the tail that does not divide evenly, else repeat the first
    indices to fill it, so every rank gets len(self) indices."""

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0, drop_last=False):
        if num_replicas is None or rank is None:
            if not dist.is_initialized():
                raise RuntimeError("DistributedSampler: pass num_replicas and rank, or call "
                                   "tinyllm.distributed.init_process_group first")
            num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
            rank = dist.get_rank() if rank is None else rank
        if num_replicas < 1:
            raise ValueError(f"DistributedSampler: num_replicas must be at least 1, got {num_replicas}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"DistributedSampler: rank {rank} is not in [0, {num_replicas - 1}]")
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.shuffle, self.seed, self.drop_last, self.epoch = shuffle, seed, drop_last, 0
        n = len(dataset)
        self.num_samples = n // num_replicas if drop_last else math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def __iter__(self):
        n = len(self.dataset)
        order = np.random.default_rng(self.seed + self.epoch).permutation(n) if self.shuffle else np.arange(n)
        if self.total_size > n:  # repeat from the start (several times over for a dataset smaller than the ranks)
            order = np.resize(order, self.total_size)
        order = order[:self.total_size]
        return iter(order[self.rank:self.total_size:self.num_replicas].tolist())

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        """Another permutation for the next pass over the data (the same on every rank)."""
        self.epoch = epoch


# ---- collating: samples to a batch ------------------------------------------------------------------------------
def _numeric_array(x, fn):
    """x (a NumPy array or scalar) if it holds numbers; strings and objects cannot become tensors."""
    if x.dtype.kind not in "biuf":
        raise TypeError(f"{fn}: batch must contain tensors, numpy arrays, numbers, dicts or lists; found a NumPy "
                        f"array of dtype {x.dtype}")
    return x


def _is_namedtuple(x):
    return isinstance(x, tuple) and hasattr(x, "_fields")


def default_collate(batch):
    """A list of samples to one batch, as torch's default_collate: tinyllm tensors, NumPy arrays and NumPy scalars
    are stacked into a tensor with a new first dimension (their dtype kept, or as tinyllm.tensor maps dtypes it
    lacks: int32 to int64), Python floats into float64 and ints into int64 (bools into bool), strings and bytes are
    left as the list; dicts, named tuples and sequences are collated field by field (a plain tuple comes back a
    list, as torch's)."""
    elem = batch[0]
    if isinstance(elem, Tensor):
        return stack(batch)
    if isinstance(elem, (np.ndarray, np.generic)) and not isinstance(elem, (np.str_, np.bytes_)):
        shapes = {np.shape(x) for x in batch}
        if len(shapes) > 1:
            raise RuntimeError(f"default_collate: the arrays of a batch are stacked and need one shape, got "
                               f"{sorted(shapes)}: pad them to one length, or pass a collate_fn")
        return tensor(_numeric_array(np.stack(batch), "default_collate"))
    if isinstance(elem, float):
        return tensor(batch, dtype=dt.float64)
    if isinstance(elem, int):
        return tensor(batch)
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, collections.abc.Mapping):
        collated = {key: default_collate([d[key] for d in batch]) for key in elem}
        try:
            return type(elem)(collated)
        except TypeError:  # a mapping type that cannot be built from a dict
            return collated
    if _is_namedtuple(elem):
        return type(elem)(*(default_collate(field) for field in zip(*batch)))
    if isinstance(elem, collections.abc.Sequence):
        lengths = {len(x) for x in batch}
        if len(lengths) > 1:
            raise RuntimeError("default_collate: each element in list of batch should be of equal size, got lengths "
                               f"{sorted(lengths)}")
        fields = [default_collate(field) for field in zip(*batch)]
        if isinstance(elem, tuple):
            return fields
        try:
            return type(elem)(fields)
        except TypeError:
            return fields
    raise TypeError(f"default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found "
                    f"{type(elem)}")


def default_convert(data):
    """One sample as it is, with its NumPy arrays and scalars made tensors (what DataLoader(batch_size=None) does to
    each sample, as torch's default_convert); Python numbers and strings stay as they are."""
    if isinstance(data, (np.ndarray, np.generic)) and data.dtype.kind in "biuf":
        return tensor(data)
    if isinstance(data, collections.abc.Mapping):
        converted = {key: default_convert(value) for key, value in data.items()}
        try:
            return type(data)(converted)
        except TypeError:
            return converted
    if _is_namedtuple(data):
        return type(data)(*(default_convert(x) for x in data))
    if isinstance(data, tuple):
        return [default_convert(x) for x in data]
    if isinstance(data, collections.abc.Sequence) and not isinstance(data, (str, bytes)):
        try:
            return type(data)([default_convert(x) for x in data])
        except TypeError:
            return [default_convert(x) for x in data]
    return data


# ---- the loader -------------------------------------------------------------------------------------------------
class DataLoader:
    """Batches of `dataset`, as torch.utils.data.DataLoader: the order from `sampler` (default: 0, 1, ..., or with
    shuffle=True a RandomSampler drawing from `generator`, a new permutation each epoch), batch_size indices a batch
    (the last batch shorter unless drop_last; batch_size=None: single samples, unbatched, through default_convert),
    or the index lists of `batch_sampler`; collate_fn (default: default_collate) makes each batch from its samples.
    len(loader) is the number of batches. num_workers: 0 only (batches load in this process); pin_memory is
    accepted and does nothing (a tensor's buffer already lives where its runtime reads it)."""

    def __init__(self, dataset, batch_size=1, shuffle=None, sampler=None, batch_sampler=None, num_workers=0,
                 collate_fn=None, pin_memory=False, drop_last=False, generator=None):
        if num_workers != 0:
            raise ValueError(f"DataLoader: num_workers={num_workers}: tinyllm loads batches in this process only; "
                             "pass num_workers=0 (a TensorDataset's batch is one gather per tensor, with no Python "
                             "per sample for workers to take over)")
        if sampler is not None and shuffle:
            raise ValueError("DataLoader: sampler option is mutually exclusive with shuffle: the sampler sets the "
                             "order (DistributedSampler(..., shuffle=True) shuffles); leave shuffle out")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("DataLoader: batch_sampler option is mutually exclusive with batch_size, shuffle, "
                                 "sampler, and drop_last: the batch sampler decides all of them")
            batch_size, drop_last = None, False
        elif batch_size is None and drop_last:
            raise ValueError("DataLoader: batch_size=None option disables auto-batching and is mutually exclusive "
                             "with drop_last")
        if sampler is None:
            sampler = RandomSampler(dataset, generator=generator) if shuffle else SequentialSampler(dataset)
        if batch_size is not None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        self.dataset, self.batch_size, self.drop_last, self.generator = dataset, batch_size, drop_last, generator
        self.sampler, self.batch_sampler, self.num_workers, self.pin_memory = sampler, batch_sampler, 0, pin_memory
        if collate_fn is None:
            collate_fn = default_collate if batch_sampler is not None else default_convert
        self.collate_fn = collate_fn

    def __iter__(self):
        if self.batch_sampler is None:
            for index in self.sampler:
                yield self.collate_fn(self.dataset[index])
            return
        # a TensorDataset that does not change its samples, collated by default: gather each batch at once
        gather = (self.collate_fn is default_collate and isinstance(self.dataset, TensorDataset)
                  and type(self.dataset).__getitem__ is TensorDataset.__getitem__)
        for indices in self.batch_sampler:
            if gather:
                yield self.dataset._batch(indices)
            else:
                yield self.collate_fn([self.dataset[i] for i in indices])

    def __len__(self):
        return len(self.batch_sampler if self.batch_sampler is not None else self.sampler)
