"""examples/gpt.py across the ranks of an MPI job (docs/distributed.md):

    mpirun -n 2 python examples/gpt.py --ddp               # data parallel: each rank a share of every batch
    mpirun -n 2 python examples/gpt.py --zero              # data parallel with AdamW's state sharded (ZeRO-1)
    mpirun -n 2 python examples/gpt.py --tensor-parallel   # each rank a share of every layer's heads and MLP

Every rank runs the same program on the same data file. The batches come from one generator seeded alike on every
rank, so all ranks draw the same global batch and each takes its own block of rows: 2 ranks of B/2 rows train the
model that 1 process with B rows trains. Only rank 0 prints and writes files.
"""
import contextlib
import os


import tinyllm
import tinyllm.distributed as dist
from gpt_files import UsageError

MODES = ("ddp", "zero", "tensor_parallel")


class Parallel:
    """What a run's --ddp / --zero / --tensor-parallel flag changes; with none of them, a single process."""
    def __init__(self, args):
        modes = [m for m in MODES if getattr(args, m)]
        if len(modes) > 1:
            raise UsageError(f"--{' and --'.join(m.replace('_', '-') for m in modes)}: choose one way to split the "
                             "work")
        self.mode = modes[0] if modes else None
        self.rank, self.world = 0, 1
        if self.mode is not None:
            try:
                dist.init_process_group("mpi")
            except (ImportError, RuntimeError) as e:
                raise UsageError(str(e)) from None
            self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.data_parallel = self.mode in ("ddp", "zero")
        if self.data_parallel and args.batch_size % self.world:
            raise UsageError(f"--batch-size {args.batch_size} does not split over {self.world} ranks: use a multiple "
                             f"of {self.world}")
        if self.mode == "zero" and args.dtype == "float16":
            raise UsageError("--zero with --dtype float16: the loss scaler decides on each rank's own gradients "
                             "whether to skip a step, which ZeRO-1's sharded step cannot follow; use --dtype "
                             "bfloat16 (no scaler) or --ddp")
        self.fail_at = args.simulate_failure

    @property
    def is_main(self):
        return self.rank == 0

    def __str__(self):
        return "one process" if self.mode is None else \
            f"{self.world} ranks ({self.mode.replace('_', ' ')}), {os.environ.get('TINYLLM_THREADS', 'default')} threads each"

    def wrap(self, model):
        """The module that trains: DistributedDataParallel for --ddp, the model split by the tensor-parallel
        rewrite for --tensor-parallel, the model itself otherwise (ZeRO-1 broadcasts and averages itself)."""
        if self.mode == "ddp":
            return tinyllm.nn.parallel.DistributedDataParallel(model)
        if self.mode == "tensor_parallel":
            dist.tensor_parallel.parallelize(model)
        return model

    def optimizer(self, model, weight_decay, lr):
        """The model's AdamW (nanoGPT's groups); for --zero, ZeRO-1 over the same groups."""
        self.unsharded = model.configure_optimizers(weight_decay, lr)
        if self.mode != "zero":
            return self.unsharded
        return dist.ZeroRedundancyOptimizer(self.unsharded.param_groups, optimizer_class=type(self.unsharded),
                                            **self.unsharded.defaults)

    def restore_optimizer(self, restore, optimizer, *rest):
        """restore(optimizer, *rest), which fills an unsharded optimizer's state; ZeRO-1 keeps its shard of it."""
        if self.mode != "zero":
            return restore(optimizer, *rest)
        restore(self.unsharded, *rest)
        optimizer.load_consolidated(self.unsharded)

    def clip_grad_norm_(self, params, optimizer, max_norm):
        """Clip the gradients the step will use: for ZeRO-1 the ranks' mean (it averages them in its step)."""
        if self.mode == "zero":
            return optimizer.clip_grad_norm_(max_norm)
        return tinyllm.nn.clip_grad_norm_(params, max_norm)

    def shard(self, x, y):
        """This rank's rows of a global batch (every rank's rows for tensor parallelism)."""
        if not self.data_parallel:
            return x, y
        n = x.shape[0] // self.world
        return x[self.rank * n:(self.rank + 1) * n], y[self.rank * n:(self.rank + 1) * n]

    def mean(self, value):
        """The mean over the ranks of a number each rank computed on its rows."""
        if not self.data_parallel:
            return value
        t = tinyllm.tensor([value])
        dist.all_reduce(t, dist.ReduceOp.AVG)
        return t.item()

    @contextlib.contextmanager
    def main_first(self):
        """Rank 0 runs the block first (it writes the files), then the others (they read them)."""
        if self.mode is not None and not self.is_main:
            dist.barrier()
        yield
        if self.mode is not None and self.is_main:
            dist.barrier()

    def save_checkpoint(self, save, path, model, optimizer, *rest):
        """save(path, model, optimizer, *rest) on rank 0 only, once the model (and the optimizer's state) is whole
        there: ZeRO-1's state shards and tensor parallelism's weight blocks are gathered first."""
        if self.mode == "zero":
            optimizer.consolidate_state_dict(to=0)
        if self.mode == "tensor_parallel":  # each rank trained its block of the split weights: join them
            dist.tensor_parallel.gather_parameters(model)
        if self.is_main:
            save(path, model, optimizer if self.mode != "zero" else optimizer.consolidated(), *rest)

    def step_done(self, step):
        """--simulate-failure RANK:STEP raises on that rank after that step (the fault-handling test)."""
        if self.fail_at is not None and self.fail_at == (self.rank, step):
            raise RuntimeError(f"simulated failure on rank {self.rank} at step {step} (--simulate-failure)")


def parse_failure(text):
    """RANK:STEP of --simulate-failure."""
    try:
        rank, step = (int(v) for v in text.split(":"))
    except ValueError:
        raise UsageError(f"--simulate-failure {text!r}: expected RANK:STEP, e.g. 1:3") from None
    return rank, step
