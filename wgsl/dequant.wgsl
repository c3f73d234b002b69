// DEQUANT: out (N, K) = dequant(W) in f32 (wgsl/qweight.wgsl), one invocation per element.
@group(0) @binding(0) var<storage, read_write> out: array<f32>;

@compute @workgroup_size({{WORKGROUP}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = gid.x + gid.y * {{ROW}}u;
  if (i >= {{N}}u * {{K}}u) { return; }
  out[i] = weight_at(i / {{K}}u, i % {{K}}u);
}
