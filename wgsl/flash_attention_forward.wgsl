// FlashAttention forward (FLASH_ATTN): one invocation per query row of each (batch, head). It walks the keys it
// may see in tiles of BC scores held in registers, with an online softmax: a running max m and denominator l,
// the output accumulated in f32 and rescaled by e^(m_old - m_new) when the max grows. The T x T scores never
// exist. out[row] = [O | L]: the row's output and its log-sum-exp L = m + log l, which the backward reuses.
// out [BH, TQ, DV + 1]; q, k, v, the sizes and qk() are flash_attention.wgsl's.
@group(0) @binding(0) var<storage, read_write> out: array<{{T}}>;

const BC: u32 = 16u;
const LOWEST: f32 = -3.4028234e38;  // stands for -inf (WGSL has no infinity literal): exp(LOWEST - m) = 0

@compute @workgroup_size({{WORKGROUP}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let row = gid.x + gid.y * {{ROW}}u;
  if (row >= BH * TQ) { return; }
  let scale = bitcast<f32>({{SCALE_BITS}}u);
  let bh = row / TQ;
  let i = row % TQ;
  let qb = q_row(bh, i);
  let kend = select(TK, min(TK, i + 1u), CAUSAL);
  var acc: array<f32, {{DV}}>;
  for (var c = 0u; c < DV; c++) { acc[c] = 0.0; }
  var s: array<f32, 16>;
  var m = LOWEST;
  var l = 0.0;
  for (var k0 = 0u; k0 < kend; k0 += BC) {
    let n = min(BC, kend - k0);
    var mx = LOWEST;
    for (var j = 0u; j < n; j++) {
      s[j] = qk(qb, k_row(bh, k0 + j)) * scale;
      mx = max(mx, s[j]);
    }
    let m_new = max(m, mx);
    let alpha = exp(m - m_new);
    l *= alpha;
    for (var c = 0u; c < DV; c++) { acc[c] *= alpha; }
    for (var j = 0u; j < n; j++) {
      let p = exp(s[j] - m_new);
      let vb = v_row(bh, k0 + j);
      l += p;
      for (var c = 0u; c < DV; c++) { acc[c] += p * f32(v[vb + c]); }
    }
    m = m_new;
  }
  for (var c = 0u; c < DV; c++) { out[row * (DV + 1u) + c] = {{T}}(acc[c] / l); }
  out[row * (DV + 1u) + DV] = {{T}}(m + log(l));
}
