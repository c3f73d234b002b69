"""Donation: a replayed schedule writes a returned array over inputs its caller gave up (an optimizer's old
parameter and moments; docs/architecture.md, "In-place updates")."""
import functools
import sys
import weakref

import numpy as np

from ...weak import forget
from .record import Ref
from .views import address

# References to a donated input held by take's callers: the feed's Buffer, the runtime's input values and execute's
# `inputs` (the in-place update tests fail if this is off either way)
CALLERS_REFS = 3


def donors(rec, fresh, outputs):
    """{position of a returned allocation: indices of the inputs whose memory it may take over}, from a
    CallRecorder: the allocation is written by one generated elementwise kernel and read by no other call; an
    input qualifies if that kernel reads it in step (c/runtime.py's in_step) through one argument only, no later call
    reads it, and the schedule does not return it."""
    returned = {out[1] for out in outputs if out[0] == "input"}
    found = {}
    for region, j in fresh.items():
        at = region.first
        if at is None or region.last != at or at not in rec.in_steps:
            continue
        argv = rec.calls[at][1][0]
        if argv[0].region is not region or argv[0].offset:
            continue
        read = [ref.region for ref in argv if isinstance(ref, Ref)]  # (then a shape-generic kernel's integers)
        candidates = [ref.region.index for ref in (argv[q] for q in sorted(rec.in_steps[at]))
                      if ref.region is not None and ref.region.kind == "input" and not ref.offset
                      and ref.region.last == at and ref.region.index not in returned
                      and sum(r is ref.region for r in read) == 1]  # read through no other argument
        if candidates:
            found[j] = candidates
    return found


def take(program, inputs, donated):
    """{position of a returned array: (the array it takes over, {view (offset, shape, strides), or None for the
    whole: the input that is that view})}. It takes over its donors when the caller donated them all and they
    are one array of its size, or views of one (a parameter and its moments), that nothing else holds."""
    taken = {}
    for j, candidates in program.donors.items():
        arrays = [inputs[i] for i in candidates if i in donated]
        if not arrays:
            continue
        shape, dtype = program.fresh[j]
        whole = arrays[0].base is None
        base = arrays[0] if whole else arrays[0].base
        if not (type(base) is np.ndarray and base.base is None and base.shape == shape and base.dtype == dtype
                and base.flags.c_contiguous and base.flags.writeable):
            continue
        if whole:
            # held by the callers, `arrays`, `base` and getrefcount's argument
            if len(arrays) == 1 and sys.getrefcount(base) == CALLERS_REFS + 3:
                taken[j] = (base, {None: base})
            continue
        # each view holds its base; here `base` and getrefcount's argument do too
        if sys.getrefcount(base) != len(arrays) + 2:
            continue
        for a in arrays:
            # held by the callers, `arrays`, `a` and getrefcount's argument
            if sys.getrefcount(a) != CALLERS_REFS + 3:
                break
        else:
            places = _places(program.places, j, base, arrays)
            if places is not None:
                taken[j] = (base, {view: arrays[k] for view, k in places.items()})
    return taken


def _places(known_places, j, base, arrays):
    """{(offset, shape, strides): k} of arrays[k], views of `base`, or None unless each is row-major at the
    place of one of the kernel's outputs (a multiple of its size): the kernel then reads each element where the
    same iteration writes it, or not at all. Remembered per base (a Program may serve several realizes: an
    optimizer's chunks), for the same arrays, weakly: the arrays a replay took over come back on the next."""
    key = (j, id(base))
    known = known_places.get(key)
    if known is not None and len(known[0]) == len(arrays) and all(r() is a for r, a in zip(known[0], arrays)):
        return known[1]
    at, places = address(base), {}
    for k, a in enumerate(arrays):
        offset = address(a) - at
        if a.base is not base or not a.flags.c_contiguous or offset % a.nbytes:
            return None
        places[(offset, a.shape, a.strides)] = k
    gone = weakref.ref(base, functools.partial(forget, known_places, key))  # the entry goes with the base
    known_places[key] = ([weakref.ref(a) for a in arrays], places, gone)
    return places
