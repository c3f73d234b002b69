// y[o, i, c] = x[o, idx[i], c] over (outer {{OUTER}}, indices {{N_IDX}}, inner {{INNER}}); an index out of range
// reads 0 (index.wgsl: the bindings, position()).
@compute @workgroup_size({{WORKGROUP}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let e = gid.x + gid.y * {{ROW}}u;
  if (e >= {{OUTER}}u * {{N_IDX}}u * {{INNER}}u) { return; }
  let c = e % {{INNER}}u;
  let i = (e / {{INNER}}u) % {{N_IDX}}u;
  let o = e / ({{INNER}}u * {{N_IDX}}u);
  let k = position(i);
  if (k < 0) {
    out[e] = {{T}}(0);
    return;
  }
  out[e] = x[(o * {{N}}u + u32(k)) * {{INNER}}u + c];
}
