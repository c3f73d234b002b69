"""Where a replayed schedule's intermediate arrays sit in the runtime's arena, packed by their lifetimes."""
# bytes: arena arrays start a multiple of a cache line from the arena's start, which is where NumPy puts a large
# array, 16 bytes into a line (an arena on a line made no difference a config S step showed: bench/RESULTS.md)
ALIGN = 64


def pack(regions):
    """Sets each region's place in one arena: largest first, at the lowest offset clear of the placed regions
    whose lifetimes [first, last] (call indices) overlap its own. Returns the arena's size."""
    placed, size = [], 0
    for r in sorted(regions, key=lambda r: -r.nbytes):
        n = -(-r.nbytes // ALIGN) * ALIGN
        busy = sorted((o, o + m) for o, m, q in placed if q.first <= r.last and r.first <= q.last)
        at = 0
        for lo, hi in busy:
            if at + n <= lo:
                break
            at = max(at, hi)
        placed.append((at, n, r))
        r.place = ("arena", at)
        size = max(size, at + n)
    return size


def peak(arena, fresh):
    """The normal path's peak (arena regions alive at a call, plus the returned arrays made by then) less the
    returned arrays, which a replay allocates first."""
    events = sorted({r.first for r in arena + fresh if r.first is not None})
    best = 0
    for t in events:
        live = sum(r.nbytes for r in arena if r.first <= t <= r.last)
        early = sum(r.nbytes for r in fresh if r.first is not None and r.first <= t)
        best = max(best, live + early)
    return max(0, best - sum(r.nbytes for r in fresh))
