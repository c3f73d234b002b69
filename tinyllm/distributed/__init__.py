"""Training across processes and machines over MPI, with torch.distributed's names (docs/distributed.md)."""
from ..process_group import (ReduceOp, init_process_group, is_initialized, is_available, get_rank,  # noqa: F401
                            get_world_size, barrier, destroy_process_group)
from .collectives import (Work, all_reduce, broadcast, all_gather, all_gather_into_tensor, reduce_scatter,  # noqa: F401
                          reduce_scatter_tensor)
from .. import process_group  # noqa: F401  (tinyllm.distributed.process_group: it lives at the bottom, imported by the ops)
from . import functional  # noqa: F401
from .optim import ZeroRedundancyOptimizer  # noqa: F401
from . import tensor_parallel  # noqa: F401
