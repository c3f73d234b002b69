"""DistributedSampler with torch.utils.data's semantics: each rank of a data-parallel job iterates over its own
shard of a dataset's indices, the shards disjoint (up to the padding that evens them out) and reshuffled by
set_epoch, the same permutation on every rank because every rank seeds it alike."""
import math

import numpy as np

from .. import process_group as dist


class DistributedSampler:
    """Indices of `dataset` (anything with len()) for rank `rank` of `num_replicas` (by default, the process group's).
    shuffle: a permutation seeded by seed + epoch; drop_last: drop the tail that does not divide evenly, else repeat
    the first indices to fill it, so every rank gets len(self) indices."""
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
