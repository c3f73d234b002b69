// ROW_LAYER_NORM: out[r] = [c · (1/√(k·Σc² + eps)) · w + b | Σx | Σc²] with k = 1/N and c = x + (-(Σx · k)):
// two passes for the mean and the variance (no cancellation, unlike E[x²] - E[x]²), then the write.
// w and b (N values each) are present as the node says.
@compute @workgroup_size({{WORKGROUP}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, inv: Invocation) {
  let t = inv.t;
  let row = wid.x + wid.y * 65535u;
  let r = min(row, ROWS - 1u);  // a spare workgroup of a 2-D dispatch recomputes the last row and stores nothing
  let at = r * N;
  let k = bitcast<f32>({{K_BITS}}u);
  var s1: f32 = 0.0;
  for (var i = t; i < N; i += W) { s1 += x[at + i]; }
  s1 = row_sum(inv, s1);
  let mean = s1 * k;
  var s2: f32 = 0.0;
  for (var i = t; i < N; i += W) {
    let c = x[at + i] + (-mean);
    s2 += c * c;
  }
  s2 = row_sum(inv, s2);
  if (row < ROWS) {
    let rstd = 1.0 / sqrt(k * s2 + bitcast<f32>({{EPS_BITS}}u));
    for (var i = t; i < N; i += W) { out[r * OUT_N + i] = (x[at + i] + (-mean)) * rstd{{AFFINE}}; }
    if (t == 0u) {
      out[r * OUT_N + N] = s1;
      out[r * OUT_N + N + 1u] = s2;
    }
  }
}
