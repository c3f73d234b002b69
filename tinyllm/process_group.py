"""The process group: which process this is among how many, over MPI (mpi4py), with torch.distributed's names.

One group, the world: every rank runs the same program (SPMD) and calls the collectives in the same order, as
under torch.distributed and llm.c. mpi4py is imported only by init_process_group, so `import tinyllm` works
without it. MPI's own default would let the other ranks wait forever for a rank that raised; init_process_group
installs an excepthook that prints the error and calls MPI.COMM_WORLD.Abort, so the launcher ends the whole job.
"""
import enum
import os
import sys
import traceback

_comm = None  # MPI.COMM_WORLD once init_process_group has run
_MPI = None
_LAUNCHER_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_SIZE")


class ReduceOp(enum.Enum):
    """How all_reduce and reduce_scatter combine the ranks' values (torch.distributed.ReduceOp)."""
    SUM = "SUM"
    AVG = "AVG"  # SUM, then divided by the world size
    MAX = "MAX"


def _launched():
    return any(v in os.environ for v in _LAUNCHER_VARS)


def init_process_group(backend="mpi", **kwargs):
    """Join the job the MPI launcher started: rank and world size come from `mpirun` (torch's init_method,
    rank and world_size arguments are what the launcher already says, so they are refused here)."""
    global _comm, _MPI
    if backend != "mpi":
        raise ValueError(f"init_process_group: backend {backend!r} is not supported: tinyllm runs on MPI, "
                         "use backend='mpi' (and start the job with mpirun)")
    if kwargs:
        raise TypeError(f"init_process_group: unexpected arguments {sorted(kwargs)}: with MPI the launcher sets "
                        "rank and world size (mpirun -n N python script.py)")
    if _comm is not None:
        raise RuntimeError("init_process_group: the process group is already initialized "
                           "(call destroy_process_group first)")
    if not is_available():
        raise ImportError("init_process_group: tinyllm.distributed needs the package mpi4py, an optional extra: "
                          "pip install -e '.[mpi]' (and an MPI library: apt-get install openmpi-bin "
                          "libopenmpi-dev); then start the job with mpirun -n N python script.py")
    if not _launched():  # (checked before importing mpi4py.MPI, which would start MPI as a job of one)
        raise RuntimeError("init_process_group: this process was not started by an MPI launcher: run it as "
                           "mpirun -n N python script.py (as root: mpirun --allow-run-as-root -n N ...)")
    try:
        from mpi4py import MPI
    except ImportError as e:  # mpi4py is there but its MPI library is not
        raise ImportError(f"init_process_group: mpi4py cannot load its MPI library ({e}): install one "
                          "(apt-get install openmpi-bin libopenmpi-dev) and reinstall mpi4py") from None
    _MPI, _comm = MPI, MPI.COMM_WORLD
    if _comm.Get_size() > 1:
        sys.excepthook = _abort_on_exception


def _abort_on_exception(kind, value, tb):
    """An uncaught exception on one rank ends the job: the others would otherwise wait in their next collective."""
    rank = _comm.Get_rank() if _comm is not None else "?"
    text = "".join(traceback.format_exception(kind, value, tb))
    sys.stderr.write(f"[tinyllm rank {rank}] uncaught exception, aborting the MPI job:\n{text}")
    sys.stderr.flush()
    _MPI.COMM_WORLD.Abort(1)


def is_initialized():
    return _comm is not None


def is_available():
    """Whether mpi4py is installed (torch.distributed.is_available)."""
    import importlib.util
    try:
        return importlib.util.find_spec("mpi4py") is not None
    except ValueError:  # sys.modules["mpi4py"] set to None: import blocked
        return False


def comm():
    """MPI.COMM_WORLD, or a clear error where init_process_group has not run."""
    if _comm is None:
        raise RuntimeError("tinyllm.distributed: the process group is not initialized: call "
                           "tinyllm.distributed.init_process_group(backend='mpi') first, in a job started by mpirun")
    return _comm


def mpi():
    comm()
    return _MPI


def get_rank():
    return comm().Get_rank()


def get_world_size():
    return comm().Get_size()


def barrier():
    comm().Barrier()


def destroy_process_group():
    """Leave the group: collectives then refuse to run. MPI itself is finalized when the process exits."""
    global _comm
    if _comm is None:
        raise RuntimeError("destroy_process_group: the process group is not initialized")
    comm().Barrier()
    if sys.excepthook is _abort_on_exception:
        sys.excepthook = sys.__excepthook__
    _comm = None
