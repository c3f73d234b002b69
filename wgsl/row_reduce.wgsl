// Shared by softmax.wgsl (softmax and log_softmax) and layer_norm.wgsl: workgroup r handles row r of ROWS rows of N
// float32 values (x row-major); out holds rows of N + 2: the row's result, then two of its reductions.
// Invocation t reads elements t, t + W, t + 2W, ... (neighbours read neighbours), and the workgroup combines
// its W partial values in a tree of halvings: a fixed order, so results are deterministic.
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;
{{BINDINGS}}
const N: u32 = {{N}}u;
const ROWS: u32 = {{ROWS}}u;
const W: u32 = {{WORKGROUP}}u;
const OUT_N: u32 = N + 2u;
var<workgroup> part: array<f32, {{WORKGROUP}}>;

// The workgroup's maximum of v (NaN wins, as NumPy's max), handed to every invocation.
fn row_max(t: u32, v: f32) -> f32 {
  part[t] = v;
  workgroupBarrier();
  for (var h = W / 2u; h > 0u; h /= 2u) {
    if (t < h) { part[t] = tl_max(part[t], part[t + h]); }
    workgroupBarrier();
  }
  let r = part[0];
  workgroupBarrier();  // everyone has read part[0] before the next reduction writes it
  return r;
}

// The workgroup's sum of v, handed to every invocation.
fn row_sum(t: u32, v: f32) -> f32 {
  part[t] = v;
  workgroupBarrier();
  for (var h = W / 2u; h > 0u; h /= 2u) {
    if (t < h) { part[t] = part[t] + part[t + h]; }
    workgroupBarrier();
  }
  let r = part[0];
  workgroupBarrier();
  return r;
}
