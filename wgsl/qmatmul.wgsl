// QMATMUL: out (M, N) = x (M, K) · dequant(W)ᵀ, accumulated in f32 (wgsl/qweight.wgsl reads W). Workgroup
// (n, row block) computes out[m, n] for the {{TM}} rows m of its block: invocation t takes k = t, t + W, ...
// (W = {{WORKGROUP}}), dequantizes W[n, k] once for all {{TM}} rows, then the workgroup adds its W partial sums in a
// fixed tree, so results are deterministic. Batch-1 decode (M = 1) is a matrix-vector product that reads each
// weight byte once.
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;

var<workgroup> part: array<array<f32, {{TM}}>, {{WORKGROUP}}>;

@compute @workgroup_size({{WORKGROUP}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let n = wid.x + wid.z * 65535u;
  let m0 = wid.y * {{TM}}u;
  var acc: array<f32, {{TM}}>;
  if (n < {{N}}u) {
    for (var k = t; k < {{K}}u; k += {{WORKGROUP}}u) {
      let w = weight_at(n, k);
      for (var r = 0u; r < {{TM}}u; r++) {
        if (m0 + r < {{M}}u) { acc[r] += x[(m0 + r) * {{K}}u + k] * w; }
      }
    }
  }
  part[t] = acc;
  workgroupBarrier();
  for (var h = {{WORKGROUP}}u / 2u; h > 0u; h /= 2u) {
    if (t < h) {
      for (var r = 0u; r < {{TM}}u; r++) { part[t][r] += part[t + h][r]; }
    }
    workgroupBarrier();
  }
  if (t < {{TM}}u && n < {{N}}u && m0 + t < {{M}}u) {
    out[(m0 + t) * {{N}}u + n] = part[0][t];
  }
}
