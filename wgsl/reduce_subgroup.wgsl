// {{NAME}}(inv, v): the workgroup's {{COMBINE}} of every invocation's v, returned to every invocation, with subgroup
// operations (the adapter feature `subgroup`): each subgroup combines its lanes' values by {{NAME}}_lanes, lane 0
// writes the result to part[subgroup id], and after one barrier every subgroup combines those (lane l takes
// part[l], part[l + size], ...) the same way. One barrier instead of the tree's log2({{WORKGROUP}}) + 1.
// The order is fixed for a given subgroup size (lanes in order, see {{NAME}}_lanes), so results are deterministic;
// sums differ in the last bits from reduce_tree.wgsl's (another association), maxima do not (but for which NaN or
// which of ±0 wins a tie). `part` may be written again only after a barrier.
// Subgroup sizes are powers of two, known only at run time (4 to 128 on GPUs); a subgroup may be larger than the
// workgroup. As drivers do (WGSL does not promise it), invocations are taken to fill subgroups in order, so the live
// lanes of a partial subgroup are its lowest and lane 0 is live.
fn {{NAME}}(inv: Invocation, v: {{T}}) -> {{T}} {
  let s = {{NAME}}_lanes(inv, v);
  if (inv.lane == 0u) { part[inv.group] = s; }
  workgroupBarrier();
  var acc: {{T}} = {{IDENTITY}};
  for (var j = inv.lane; j < inv.groups; j += inv.size) { acc = {{COMBINE}}(acc, part[j]); }
  return {{NAME}}_lanes(inv, acc);
}

// The subgroup's {{COMBINE}} of its lanes' v, returned to every lane: a butterfly of shuffles (lane i with lane
// i ^ h, h = 1, 2, ..., size/2), each pair combined lower lane first, so every lane computes the same pairwise tree
// over the lanes in order (((v0, v1), (v2, v3)), ...) and gets the same bits. {{COMBINE}} is the library's own
// (subgroupMax need not propagate NaN). A dead partner lane (a partial subgroup) gives {{IDENTITY}}, which leaves
// the live lanes' result alone; lane 0's result is handed to all.
fn {{NAME}}_lanes(inv: Invocation, v: {{T}}) -> {{T}} {
  let live = subgroupBallot(true);
  var r = v;
  for (var h = 1u; h < inv.size; h *= 2u) {
    let p = inv.lane ^ h;
    // every lane shuffles (uniform control flow); the select discards a dead lane's undefined value
    let o = select({{IDENTITY}}, subgroupShuffleXor(r, h), ((live[p / 32u] >> (p % 32u)) & 1u) != 0u);
    let upper = (inv.lane & h) != 0u;
    r = {{COMBINE}}(select(r, o, upper), select(o, r, upper));
  }
  return subgroupBroadcast(r, 0u);
}
