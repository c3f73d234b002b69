// Copies {{N}} elements between two strided views: out[at_out(i)] = src[at_src(i)] for the row-major index i
// over the copied shape. Movement ops that cannot stay views (a reshape of a transposed tensor, CAT, PAD)
// and operands that a kernel needs row-major are made with it.
@group(0) @binding(0) var<storage, read_write> out: array<{{T}}>;
@group(0) @binding(1) var<storage, read> src: array<{{T}}>;

@compute @workgroup_size({{WORKGROUP}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = gid.x + gid.y * {{ROW}}u;
  if (i >= {{N}}u) { return; }
  out[{{AT_OUT}}] = src[{{AT_SRC}}];
}
