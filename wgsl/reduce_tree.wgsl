// {{NAME}}(inv, v): the workgroup's {{COMBINE}} of every invocation's v, returned to every invocation, without
// subgroup operations: the {{WORKGROUP}} values are combined in `part` in a tree of halvings (value t with value
// t + h, h = {{WORKGROUP}}/2, ..., 1), a fixed order, so results are deterministic. `part` may be written again only
// after a barrier (everyone reads part[0]).
fn {{NAME}}(inv: Invocation, v: {{T}}) -> {{T}} {
  part[inv.t] = v;
  workgroupBarrier();
  for (var h = {{WORKGROUP}}u / 2u; h > 0u; h /= 2u) {
    if (inv.t < h) { part[inv.t] = {{COMBINE}}(part[inv.t], part[inv.t + h]); }
    workgroupBarrier();
  }
  return part[0];
}
