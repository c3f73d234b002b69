"""ZeRO stage 1 (Rajbhandari et al., 2020): the optimizer's state sharded across the ranks, with
torch.distributed.optim.ZeroRedundancyOptimizer's name and constructor.

    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=tinyllm.optim.AdamW, lr=3e-4)
    loss.backward(); opt.step(); opt.zero_grad()

Every rank holds the whole model and computes gradients on its own data; step() then
    1. reduce-scatters the gradients with ReduceOp.AVG: rank r receives its shard of the mean over ranks (with a
       model wrapped in DDP too, the gradients are already equal and the mean changes nothing);
    2. updates its shard of the parameters with the inner optimizer (optimizer_class), built over the shards only,
       so it keeps AdamW's exp_avg / exp_avg_sq for 1/world of the elements;
    3. all-gathers the updated shards into every rank's parameters (the Parameter objects keep their identity).

The shards are flat, as llm.c's: a param group's parameters (of one dtype and device) are cut, in order, into
buckets of whole parameters of about 1/Optimizer.CHUNKS of all the elements (a step holds one bucket's flat
gradient and gathered parameters at a time); a bucket is flattened, padded with zeros to a multiple of the world
size, and rank r owns the r-th contiguous 1/world of it. That balances the ranks to within the padding whatever
the parameters' sizes (torch assigns whole parameters to ranks, greedily by size), at the price that a parameter
may straddle two ranks: the inner optimizer must update element by element (SGD, Adam, AdamW do; one that needs a
per-tensor norm cannot be sharded this way). The padding's gradient is zero, so its moments and update are too.
A bucket never mixes param groups, so each group's options apply exactly as the inner optimizer applies them.

The shard of the parameters is not kept between steps: every rank holds the whole parameters anyway (which may
have been loaded or changed since), so step() cuts this rank's shard from them, and the state between steps is
the inner optimizer's moments alone. The collectives match across ranks as long as every rank runs the same
program (SPMD) and the same parameters have gradients; a parameter without a gradient in a group where others
have one is updated with a zero gradient (plain AdamW would skip it).
"""
import math

import numpy as np

from .. import realizer
from ..factory import cat, zeros
from ..graph import bulk
from ..optim import AdamW, Optimizer, export_state, import_step
from ..replay.jit import host_values
from ..tensor import Tensor, no_grad
from . import functional as F
from .. import process_group as pg
from ..process_group import ReduceOp

NAME = "ZeroRedundancyOptimizer"


class _Bucket:
    """Parameters of one param group with one dtype and device, as one flat buffer padded to `world` shards:
    this rank owns the elements lo:hi. The inner optimizer's group `index` holds its options, and the inner
    state of its shard is kept under the bucket itself."""

    def __init__(self, group, params, index, rank, world):
        self.group, self.params, self.index = group, params, index
        self.numels = [p.numel() for p in params]
        self.offsets = [sum(self.numels[:i]) for i in range(len(params))]
        total = sum(self.numels)
        self.shard_numel = -(-total // world)  # ceil: the flat length padded to a multiple of world
        self.pad = self.shard_numel * world - total
        self.lo, self.hi = rank * self.shard_numel, (rank + 1) * self.shard_numel
        self.dtype, self.device = params[0].dtype, params[0].device
        self.reduced = None  # this rank's shard of the mean gradient, once clip_grad_norm_ reduced it before step()

    def flatten(self, tensors):
        """The tensors (one per parameter, in order) as one padded flat tensor."""
        parts = [t.reshape(-1) for t in tensors]
        if self.pad:
            parts.append(zeros(self.pad, dtype=parts[0].dtype, device=self.device))
        return cat(parts)

    def unflatten(self, flat):
        """The slices of a full flat tensor that are each parameter, in the parameters' shapes."""
        return [flat[o:o + n].reshape(p.shape) for p, o, n in zip(self.params, self.offsets, self.numels)]

    def reduce_gradients(self):
        """This rank's shard of the gradients' mean over the ranks (a parameter without a gradient counts 0)."""
        grads = [p.grad if p.grad is not None else zeros(*p.shape, dtype=p.dtype, device=self.device)
                 for p in self.params]
        return F.reduce_scatter(self.flatten(grads), ReduceOp.AVG)


def _realize(tensors):
    """Realize tensors on several devices, one realize (one graph) per device."""
    by_device = {}
    for t in tensors:
        by_device.setdefault(t.device, []).append(t)
    for ts in by_device.values():
        realizer.realize(*ts)


def _leaf(value):
    """A realized tensor as a new leaf that requires grad (what an optimizer updates)."""
    return Tensor._from_node(value.node, value.device, requires_grad=True)


class ZeroRedundancyOptimizer(Optimizer):
    """optimizer_class's update with its state sharded across the ranks (ZeRO-1; module docstring).

    params and **defaults are what optimizer_class takes (param groups with their own options included);
    param_groups are this optimizer's whole groups, and their options (lr set by an LR scheduler) reach the inner
    optimizer at each step. torch's process_group must be None (the world); parameters_as_bucket_view is accepted
    and has no effect (the shards are flat buffers already); overlap_with_ddp is not supported. At construction
    every rank's parameters become rank 0's (a broadcast), as in torch.

    The gradients are averaged inside step(), so what reads them before it sees this rank's alone: clip with
    clip_grad_norm_ (the mean gradient's norm), not tinyllm.nn.clip_grad_norm_; a GradScaler's inf check would
    likewise be this rank's (ranks could then disagree on skipping the step). For checkpoints:
    consolidate_state_dict(to) and state_dict() (torch's), consolidated() (an unsharded optimizer holding the whole
    state) and load_consolidated(optimizer), its inverse.
    """

    def __init__(self, params, optimizer_class=AdamW, process_group=None, parameters_as_bucket_view=False,
                 overlap_with_ddp=False, **defaults):
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, Optimizer)) \
                or issubclass(optimizer_class, ZeroRedundancyOptimizer):
            raise TypeError(f"{NAME}: optimizer_class must be a tinyllm.optim.Optimizer subclass (AdamW, Adam, SGD), "
                            f"got {optimizer_class!r:.80}")
        if not all(callable(getattr(optimizer_class, f, None)) for f in ("_host_step", "_update")):
            raise TypeError(f"{NAME}: {optimizer_class.__name__} defines no _host_step/_update (the update rule "
                            "Optimizer.step applies per parameter), which the shards are updated with")
        if process_group is not None:
            raise ValueError(f"{NAME}: process_group must be None (the world of init_process_group): tinyllm has "
                             f"one process group, got {process_group!r:.80}")
        if overlap_with_ddp:
            raise NotImplementedError(f"{NAME}: overlap_with_ddp=True is not supported: step() reduce-scatters the "
                                      "gradients itself; wrap the model in DistributedDataParallel or not, and "
                                      "leave overlap_with_ddp False")
        if not pg.is_initialized():
            raise RuntimeError(f"{NAME}: the process group is not initialized: call "
                               "tinyllm.distributed.init_process_group(backend='mpi') first, in a job started by "
                               "mpirun -n N python script.py")
        super().__init__(params, defaults)  # checks the parameters and groups (none empty, twice, or not leaves)
        self.rank, self.world_size = pg.get_rank(), pg.get_world_size()
        self._buckets = self._make_buckets()
        with no_grad():
            self._broadcast_parameters()
            shards = [_leaf(v) for v in self._shard_values()]
        options = [{k: v for k, v in b.group.items() if k != "params"} for b in self._buckets]
        self.optim = optimizer_class([{**o, "params": [s]} for o, s in zip(options, shards)], **defaults)
        for b in self._buckets:  # the inner optimizer's defaults, filled in, are this optimizer's options too
            b.group.update({k: v for k, v in self.optim.param_groups[b.index].items() if k != "params"})
        self.defaults = self.optim.defaults
        for g in self.optim.param_groups:  # step() cuts the shards anew: these would hold 1/world more memory
            g["params"] = []
        self._consolidated = None  # rank `to`'s full state dict after consolidate_state_dict(to)

    def _make_buckets(self):
        """Each param group's parameters of one dtype and device, in order, cut into buckets of about 1/CHUNKS of
        all the elements (whole parameters)."""
        budget = sum(p.numel() for g in self.param_groups for p in g["params"]) / self.CHUNKS
        buckets = []
        for group in self.param_groups:
            kinds = {}  # (dtype, device) -> the group's parameters of that kind, in order
            for p in group["params"]:
                kinds.setdefault((p.dtype, p.device), []).append(p)
            for ps in kinds.values():
                chunk, size = [], 0
                for i, p in enumerate(ps):
                    chunk.append(p)
                    size += p.numel()
                    if size >= budget or i == len(ps) - 1:
                        buckets.append(_Bucket(group, chunk, len(buckets), self.rank, self.world_size))
                        chunk, size = [], 0
        return buckets

    def _broadcast_parameters(self):
        for b in self._buckets:
            realizer.assign(b.params, b.unflatten(F.broadcast(b.flatten([p.detach() for p in b.params]), 0)))

    def _shard_values(self):
        """This rank's shard of each bucket's current parameters, realized."""
        values = []
        for b in self._buckets:
            values.append(b.flatten([p.detach() for p in b.params])[b.lo:b.hi])
            realizer.realize(values[-1])
        return values

    @bulk
    def step(self):
        """Per bucket, one graph and one realize of the three steps in the module docstring. The new shard is read by
        the all-gather only, so it is never stored beside the moments (the C runtime stores the outputs of one update
        kernel together, where a shard would live as long as the moments). A bucket none of whose parameters has
        a gradient is left as it is, as plain optimizers skip them."""
        inner = self.optim
        with no_grad():
            for b in self._buckets:  # (in the same order on every rank, and so are the collectives)
                if all(p.grad is None for p in b.params):
                    continue
                group = inner.param_groups[b.index]
                shard = b.flatten([p.detach() for p in b.params])[b.lo:b.hi]
                state = inner.state.setdefault(b, {})
                names = []

                def host_step(b=b, group=group, state=state, shard=shard, names=names):
                    """The inner optimizer's host values (step count, bias corrections), as Optimizer.step's, from
                    this optimizer's options (the lr a scheduler set): tinyllm.jit runs it again on each replay."""
                    group.update({k: v for k, v in b.group.items() if k != "params"})
                    hyper = inner._host_step(group, state)
                    names[:] = hyper
                    return {(b.index, name): (v, shard) for name, v in hyper.items()}

                scalars = host_values(host_step)
                hyper = {name: scalars[(b.index, name)] for name in names}
                grad, b.reduced = b.reduced if b.reduced is not None else b.reduce_gradients(), None
                targets, values = [], []
                for target, value in inner._update(shard, grad, state, group, hyper):
                    if target is None:
                        targets += b.params
                        values += b.unflatten(F.all_gather(value))
                    else:
                        targets.append(state[target])
                        values.append(value)
                realizer.assign(targets, values)

    def clip_grad_norm_(self, max_norm, norm_type=2.0, error_if_nonfinite=False):
        """tinyllm.nn.clip_grad_norm_ for the gradient step() applies, the mean over the ranks (call it between
        backward() and step(); nn.clip_grad_norm_ would see this rank's gradients only). As llm.c: the gradients
        are reduce-scattered now, each rank takes the norm of its shard, an all-reduce combines them, and step()
        updates with the shards scaled by min(1, max_norm / (‖g‖ + 1e-6)). Returns ‖g‖, the same on every rank."""
        norm_type = float(norm_type)
        with no_grad():
            buckets = [b for b in self._buckets if any(p.grad is not None for p in b.params)]
            if not buckets:
                return zeros(())
            parts = []
            for b in buckets:
                if b.reduced is None:
                    b.reduced = b.reduce_gradients()
                g = b.reduced.float()
                parts.append(g.abs().amax() if norm_type == math.inf else
                             (g * g).sum() if norm_type == 2.0 else g.abs().pow(norm_type).sum())
                realizer.realize(b.reduced, parts[-1])  # (one bucket's flat gradient at a time)
            if norm_type == math.inf:
                total = parts[0]
                for part in parts[1:]:
                    total = total.maximum(part)
                total = F.all_reduce(total.reshape(1), ReduceOp.MAX).reshape(())
            else:
                total = F.all_reduce(sum(parts[1:], parts[0]).reshape(1), ReduceOp.SUM).reshape(())
                total = total.pow(1.0 / norm_type)
            realizer.realize(total)
            if error_if_nonfinite and not math.isfinite(total.item()):
                raise RuntimeError(f"{NAME}.clip_grad_norm_: the total norm of order {norm_type} of the gradients "
                                   "is non-finite, so it cannot be clipped (error_if_nonfinite=False scales by it "
                                   "anyway)")
            coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
            for b in buckets:  # left lazy: the scaling fuses into step()'s update
                b.reduced = b.reduced * coef.to(b.reduced.dtype)
        return total

    def zero_grad(self, set_to_none=True):
        super().zero_grad(set_to_none)
        for b in self._buckets:
            b.reduced = None

    # ---- state dicts ----
    def _param_ids(self):
        """torch's numbering of the parameters in state dicts: in order through the param groups."""
        ids, n = [], 0
        for g in self.param_groups:
            ids.append(list(range(n, n + len(g["params"]))))
            n += len(g["params"])
        return ids

    def consolidate_state_dict(self, to=0):
        """Gather the shards of the state into rank `to`, where state_dict() then returns the whole of it (a
        collective: every rank must call it). The state is per parameter, in the parameter's shape, as the inner
        optimizer unsharded would hold it (AdamW: step, exp_avg, exp_avg_sq)."""
        if not isinstance(to, int) or isinstance(to, bool) or not 0 <= to < self.world_size:
            raise ValueError(f"{NAME}.consolidate_state_dict: to={to!r} is not a rank in 0..{self.world_size - 1}")
        index = {id(p): i for ids, g in zip(self._param_ids(), self.param_groups) for i, p in zip(ids, g["params"])}
        state, pending = {}, []
        for b in self._buckets:  # every rank has the same state keys (the same steps), so the gathers match
            shard_state = self.optim.state.get(b) or {}
            keys = sorted(k for k, v in shard_state.items() if isinstance(v, Tensor))
            full = {k: F.all_gather(shard_state[k].detach()) for k in keys}
            for p, *parts in zip(b.params, *(b.unflatten(full[k]) for k in keys)):
                entry = {k: v for k, v in shard_state.items() if not isinstance(v, Tensor)}
                entry.update(zip(keys, parts))
                state[index[id(p)]] = export_state(entry)  # (the step as torch's tensor, as Optimizer.state_dict)
                pending += parts
        _realize(pending)
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": ids}
                  for g, ids in zip(self.param_groups, self._param_ids())]
        self._consolidated = {"state": state, "param_groups": groups} if self.rank == to else None

    def state_dict(self):
        """The whole state (torch's format: {"state": {param id: {...}}, "param_groups": [...]}), on the rank that
        consolidate_state_dict gathered it to."""
        if self._consolidated is None:
            raise RuntimeError(f"{NAME}.state_dict: the optimizer state has not been consolidated on rank "
                               f"{self.rank}: call consolidate_state_dict(to={self.rank}) on every rank first, then "
                               f"state_dict() on rank {self.rank}")
        return self._consolidated

    def consolidated(self):
        """On the rank consolidate_state_dict gathered to: an unsharded optimizer_class over the same parameters
        and groups, holding the whole state (what a checkpoint writer that reads optimizer.state[p] wants)."""
        full = self.state_dict()
        plain = type(self.optim)([dict(g, params=list(g["params"])) for g in self.param_groups])
        plain.load_state_dict(full)
        return plain

    def load_consolidated(self, optimizer):
        """Every rank keeps its shard of the state of an unsharded optimizer over the same parameter groups (one
        that consolidated() returned, or one restored from a checkpoint), and its groups' options."""
        mine = [[id(p) for p in g["params"]] for g in self.param_groups]
        theirs = [[id(p) for p in g["params"]] for g in optimizer.param_groups]
        if mine != theirs:
            raise ValueError(f"{NAME}.load_consolidated: the optimizer's param groups hold other parameters (or in "
                             f"another order): {[len(g) for g in theirs]} parameters per group, this optimizer's "
                             f"{[len(g) for g in mine]}")
        self.load_state_dict(optimizer.state_dict())

    def load_state_dict(self, state_dict):
        """Load a whole state dict (state_dict()'s, or a plain optimizer's in the same format) on every rank: each
        keeps its shard of it, and the param groups' options."""
        groups = state_dict.get("param_groups") if isinstance(state_dict, dict) else None
        if groups is None or "state" not in state_dict:
            raise ValueError(f"{NAME}.load_state_dict: expected a dict with 'state' and 'param_groups' (what "
                             f"state_dict() returns), got {type(state_dict).__name__}")
        sizes, own = [len(g["params"]) for g in groups], [len(g["params"]) for g in self.param_groups]
        if sizes != own:
            raise ValueError(f"{NAME}.load_state_dict: the state dict has param groups of {sizes} parameters, this "
                             f"optimizer {own}")
        for g, saved in zip(self.param_groups, groups):
            g.update({k: v for k, v in saved.items() if k != "params"})
        saved_state = state_dict["state"]
        with no_grad():
            shards, pending = {}, []
            for b, ids in self._bucket_ids():
                entries = [saved_state.get(i) for i in ids]
                if not any(entries):
                    continue
                if not all(entries):
                    raise ValueError(f"{NAME}.load_state_dict: parameters {[i for i, e in zip(ids, entries) if not e]} "
                                     f"have no state but others of their group do: a flat shard needs all or none")
                shard = {}
                for key in entries[0]:
                    values = [self._state_value(e, key, i, p) for e, i, p in zip(entries, ids, b.params)]
                    if isinstance(values[0], Tensor):
                        shard[key] = b.flatten(values)[b.lo:b.hi]
                        pending.append(shard[key])
                    elif any(v != values[0] for v in values):
                        raise ValueError(f"{NAME}.load_state_dict: the parameters of a group hold different "
                                         f"'{key}' ({sorted(set(values))}): a flat shard keeps one for all of them")
                    else:
                        shard[key] = values[0]
                shards[b] = shard
            _realize(pending)
        for b in self._buckets:
            self.optim.state.pop(b, None)
        self.optim.state.update(shards)

    def _bucket_ids(self):
        """(bucket, the state dict ids of its parameters) for each bucket."""
        where = {id(p): i for ids, g in zip(self._param_ids(), self.param_groups) for i, p in zip(ids, g["params"])}
        return [(b, [where[id(p)] for p in b.params]) for b in self._buckets]

    def _state_value(self, entry, key, i, p):
        """A state entry of parameter id i: a tensor of p's shape (to be sharded), else a plain value."""
        if key not in entry:
            raise ValueError(f"{NAME}.load_state_dict: parameter {i} has no '{key}' where others of its group do")
        v = entry[key]
        if key == "step":
            return import_step(v, f"{NAME}.load_state_dict: parameter {i}")
        if isinstance(v, (np.ndarray, np.generic)):
            if v.ndim == 0:
                return v.item()
            v = Tensor(v, dtype=p.dtype, device=p.device)
        if not isinstance(v, Tensor):
            return v
        if tuple(v.shape) == tuple(p.shape):
            return v.detach().to(device=p.device)
        if v.numel() != 1:
            raise ValueError(f"{NAME}.load_state_dict: '{key}' of parameter {i} has shape {tuple(v.shape)}, the "
                             f"parameter {tuple(p.shape)}")
        return v.item()
