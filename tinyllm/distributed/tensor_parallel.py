"""Tensor parallelism (Megatron-LM's): each rank computes its share of every MLP's hidden columns and of every
attention's heads, and one all-reduce per MLP and per attention combines them. The split is a graph rewrite
(tinyllm/rewrite/tensor_parallel.py) of the graphs that read the marked weights; the model code is unchanged.

    dist.init_process_group("mpi")
    model = parallelize(GPT(config))   # every rank: the same weights, the same batch
    _, loss = model(x, y); loss.backward(); optimizer.step()
    gather_parameters(model)           # before saving: every rank gets the blocks the others trained

Parameters stay full-size on every rank, and each rank trains only its block of a split weight; the rest of
the parameters get the same full gradient on every rank. Every rank must feed the same batch.
"""
import fnmatch

from .. import process_group as pg
from ..graph import build
from ..realizer import assign
from ..rewrite import tensor_parallel as tp
from ..tensor import Tensor, no_grad

COLWISE, ROWWISE = tp.COLWISE, tp.ROWWISE


def plan_of(model):
    """{module: (style, groups)}: the model's `tp_plan` (name pattern -> (style, groups)) matched against its
    named modules."""
    plan = {}
    for name, module in model.named_modules():
        for pattern, (style, groups) in model.tp_plan.items():
            if fnmatch.fnmatchcase(name, pattern):
                plan[module] = ({"colwise": COLWISE, "rowwise": ROWWISE}[style], groups)
    return plan


def _check(model, world):
    """Clear errors where the heads or the MLP's width do not split evenly over the ranks."""
    name = type(model).__name__
    for what, n in model.tp_split_sizes().items():
        if n % world:
            raise ValueError(f"tensor parallel: {name}'s {what} = {n} does not split over {world} ranks: each rank "
                             f"computes an equal share, so choose a world size (mpirun -n) that divides {n}, or a "
                             f"config whose {what.split(' ')[0]} is a multiple of {world}")


def parallelize(model):
    """Split `model` over the ranks of the process group, Megatron's way, by its `tp_plan` (GPT and Llama declare
    one beside their layers); returns the model. Raises a clear error where a split would not be even. Its graphs
    are rewritten from now on (training and inference); `deparallelize(model)` undoes it."""
    if not isinstance(getattr(model, "tp_plan", None), dict):
        raise TypeError(f"tensor parallel: {type(model).__name__} declares no tp_plan ({{module name pattern: "
                        "('colwise' | 'rowwise', groups)}, as tinyllm.models.GPT's and Llama's); or mark a model's "
                        "linear layers with tinyllm.rewrite.tensor_parallel.mark(weight, 'colwise' | 'rowwise', groups)")
    world = pg.get_world_size()
    _check(model, world)
    plan = plan_of(model)
    for module, (style, groups) in plan.items():
        tp.mark(module.weight, style, groups)
        if style == COLWISE and module.bias is not None:
            tp.mark(module.bias, style, groups)
    model._tensor_parallel = plan
    return model


def deparallelize(model):
    """Stop rewriting `model`'s graphs (its parameters keep the values each rank holds: gather them first)."""
    for module in getattr(model, "_tensor_parallel", {}):
        tp.unmark(module.weight)
        if module.bias is not None:
            tp.unmark(module.bias)
    model._tensor_parallel = {}
    return model


def _split_axis(style, param):
    """The axis of a marked parameter that the ranks split: a column-split weight's (and bias's) output features,
    a row-split weight's input features; None for a row-split layer's bias (every rank has all of it)."""
    if style == COLWISE:
        return 0
    return 1 if param.ndim == 2 else None


def gather_parameters(model):
    """Give every rank the full trained value of each split parameter: rank r's block from rank r (what it
    trained), by an all-gather. Call it before saving a checkpoint or comparing ranks' parameters."""
    world, rank = pg.get_world_size(), pg.get_rank()
    targets, values = [], []
    for module, (style, groups) in getattr(model, "_tensor_parallel", {}).items():
        for p in (module.weight, module.bias):
            axis = None if p is None else _split_axis(style, p)
            if axis is None:
                continue
            g = groups if style == COLWISE else 1
            x = p.detach().node
            if axis:  # the split axis first
                x = x.transpose_last()
            shape = x.shape
            b = shape[0] // (g * world)
            x = x.reshape((g, world, b) + shape[1:])
            order = (1, 0) + tuple(range(2, len(shape) + 2))
            mine = tp.block(x.permute(order), 0, 1, world, rank)  # (1, g, b, ...): this rank's blocks
            full = build("ALLGATHER", mine, arg=world).permute(order).reshape(shape)
            if axis:
                full = full.transpose_last()
            targets.append(p)
            values.append(Tensor._from_node(full, p.device))
    with no_grad():
        assign(targets, values)
    return model
