// A reduction over few elements: one invocation per output loops over its {{N_RED}} inputs.
fn combine(a: {{ACC_T}}, b: {{ACC_T}}) -> {{ACC_T}} { return {{COMBINE}}; }

@compute @workgroup_size({{WORKGROUP}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let o = gid.x + gid.y * {{ROW}}u;
  if (o >= {{N_OUT}}u) { return; }
  var acc: {{ACC_T}} = {{INIT}};
  for (var r = 0u; r < {{N_RED}}u; r++) {
{{BODY}}
    acc = combine(acc, {{VALUE}});
  }
  {{OUT_AT}} = {{STORE}};
}
