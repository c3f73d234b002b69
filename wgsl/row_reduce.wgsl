// Shared by softmax.wgsl (softmax and log_softmax) and layer_norm.wgsl: workgroup r handles row r of ROWS rows of N
// float32 values (x row-major); out holds rows of N + 2: the row's result, then two of its reductions.
// Invocation t reads elements t, t + W, t + 2W, ... (neighbours read neighbours), and the workgroup combines
// its W partial values by workgroup_max / workgroup_sum: reduce_tree.wgsl, or reduce_subgroup.wgsl where the
// adapter has subgroups. Either order is fixed, so results are deterministic.
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
{{BINDINGS}}
const N: u32 = {{N}}u;
const ROWS: u32 = {{ROWS}}u;
const W: u32 = {{WORKGROUP}}u;
const OUT_N: u32 = N + 2u;
var<workgroup> part: array<f32, {{WORKGROUP}}>;
{{INVOCATION}}
fn add(a: f32, b: f32) -> f32 { return a + b; }
{{WORKGROUP_MAX}}
{{WORKGROUP_SUM}}
// The workgroup's maximum of v (NaN wins, as NumPy's max), handed to every invocation.
fn row_max(inv: Invocation, v: f32) -> f32 {
  let r = workgroup_max(inv, v);
  workgroupBarrier();  // everyone has read part before the next reduction writes it
  return r;
}

// The workgroup's sum of v, handed to every invocation.
fn row_sum(inv: Invocation, v: f32) -> f32 {
  let r = workgroup_sum(inv, v);
  workgroupBarrier();
  return r;
}
