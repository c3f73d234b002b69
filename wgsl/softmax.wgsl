// ROW_SOFTMAX and ROW_LOG_SOFTMAX: out[r] = [y | max | Σe] with e = exp(x + (-max)), in three passes over the row
// (max, sum, write), as the primitives they replace compute it; y is {{Y}}:
//   softmax      e · (1/Σe)               -inf entries give 0, a row of -inf gives NaN (as torch)
//   log_softmax  (x + (-max)) + (-log Σe)
@compute @workgroup_size({{WORKGROUP}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, inv: Invocation) {
  let t = inv.t;
  let row = wid.x + wid.y * 65535u;
  let r = min(row, ROWS - 1u);  // a spare workgroup of a 2-D dispatch recomputes the last row and stores nothing
  let at = r * N;
  var m: f32 = tl_bits_f32(4286578688u);  // -inf (a call: Tint refuses a constant -inf)
  for (var i = t; i < N; i += W) { m = tl_max(m, x[at + i]); }
  m = row_max(inv, m);
  var s: f32 = 0.0;
  for (var i = t; i < N; i += W) { s += exp(x[at + i] + (-m)); }
  s = row_sum(inv, s);
  if (row < ROWS) {
    for (var i = t; i < N; i += W) { out[r * OUT_N + i] = {{Y}}; }
    if (t == 0u) {
      out[r * OUT_N + N] = m;
      out[r * OUT_N + N + 1u] = s;
    }
  }
}
