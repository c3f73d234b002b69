// A reduction over many elements: workgroup o computes output o. Invocation t accumulates inputs t, t + W,
// t + 2W, ... (W = {{WORKGROUP}}: neighbouring invocations read neighbouring elements), then the workgroup
// combines its W partial results in a tree of {{LOG2}} halvings. The order is fixed, so results are
// deterministic.
var<workgroup> part: array<{{ACC_T}}, {{WORKGROUP}}>;

fn combine(a: {{ACC_T}}, b: {{ACC_T}}) -> {{ACC_T}} { return {{COMBINE}}; }

@compute @workgroup_size({{WORKGROUP}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let o = wid.x + wid.y * 65535u;
  var acc: {{ACC_T}} = {{INIT}};
  if (o < {{N_OUT}}u) {
    for (var r = t; r < {{N_RED}}u; r += {{WORKGROUP}}u) {
{{BODY}}
      acc = combine(acc, {{VALUE}});
    }
  }
  part[t] = acc;
  workgroupBarrier();
  for (var h = {{WORKGROUP}}u / 2u; h > 0u; h /= 2u) {
    if (t < h) { part[t] = combine(part[t], part[t + h]); }
    workgroupBarrier();
  }
  if (t == 0u && o < {{N_OUT}}u) {
    let acc = part[0];
    {{OUT_AT}} = {{STORE}};
  }
}
