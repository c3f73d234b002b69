// A reduction over many elements: workgroup o computes output o. Invocation t accumulates inputs t, t + W,
// t + 2W, ... (W = {{WORKGROUP}}: neighbouring invocations read neighbouring elements), then the workgroup
// combines its W partial results by workgroup_combine: reduce_tree.wgsl, or reduce_subgroup.wgsl where the adapter
// has subgroups. Either order is fixed, so results are deterministic.
var<workgroup> part: array<{{ACC_T}}, {{WORKGROUP}}>;
{{INVOCATION}}
fn combine(a: {{ACC_T}}, b: {{ACC_T}}) -> {{ACC_T}} { return {{COMBINE}}; }
{{WORKGROUP_COMBINE}}
@compute @workgroup_size({{WORKGROUP}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, inv: Invocation) {
  let o = wid.x + wid.y * 65535u;
  var acc: {{ACC_T}} = {{INIT}};
  if (o < {{N_OUT}}u) {
    for (var r = inv.t; r < {{N_RED}}u; r += {{WORKGROUP}}u) {
{{BODY}}
      acc = combine(acc, {{VALUE}});
    }
  }
  let total = workgroup_combine(inv, acc);  // every invocation takes part: it has barriers
  if (inv.t == 0u && o < {{N_OUT}}u) {
    let acc = total;
    {{OUT_AT}} = {{STORE}};
  }
}
