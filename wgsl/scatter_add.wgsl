// y = zeros(outer {{OUTER}}, {{N}}, inner {{INNER}}); y[o, idx[i], c] += x[o, i, c] for i < {{N_IDX}}. One invocation
// per column (o, c) walks every index in order, so no two invocations write one element and the sums are
// deterministic (no atomics, which WGSL has for integers only). An index out of range adds nothing (index.wgsl:
// the bindings, position()).
@compute @workgroup_size({{WORKGROUP}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let e = gid.x + gid.y * {{ROW}}u;
  if (e >= {{OUTER}}u * {{INNER}}u) { return; }
  let c = e % {{INNER}}u;
  let o = e / {{INNER}}u;
  for (var j = 0u; j < {{N}}u; j++) { out[(o * {{N}}u + j) * {{INNER}}u + c] = {{T}}(0); }
  for (var i = 0u; i < {{N_IDX}}u; i++) {
    let k = position(i);
    if (k < 0) { continue; }
    let at = (o * {{N}}u + u32(k)) * {{INNER}}u + c;
    out[at] = out[at] + x[(o * {{N_IDX}}u + i) * {{INNER}}u + c];
  }
}
