// y[o, i, c] = x[o, idx[i], c] over (outer {{OUTER}}, indices {{N_IDX}}, inner {{INNER}}); x's axis has {{N}}
// entries. Negative indices wrap once, as NumPy's take; an index still out of range reads 0 and raises flag
// {{SLOT}}, which the runtime turns into an IndexError when the host next reads a value.
@group(0) @binding(0) var<storage, read_write> out: array<{{T}}>;
@group(0) @binding(1) var<storage, read> x: array<{{T}}>;
@group(0) @binding(2) var<storage, read> idx: array<i32>;
@group(0) @binding(3) var<storage, read_write> errors: array<u32>;

@compute @workgroup_size({{WORKGROUP}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let e = gid.x + gid.y * {{ROW}}u;
  if (e >= {{OUTER}}u * {{N_IDX}}u * {{INNER}}u) { return; }
  let c = e % {{INNER}}u;
  let i = (e / {{INNER}}u) % {{N_IDX}}u;
  let o = e / ({{INNER}}u * {{N_IDX}}u);
  var k = idx[i];
  k = select(k, k + {{N}}, k < 0);
  if (k < 0 || k >= {{N}}) {
    errors[{{SLOT}}] = 1u;
    out[e] = {{T}}(0);
    return;
  }
  out[e] = x[(o * {{N}}u + u32(k)) * {{INNER}}u + c];
}
