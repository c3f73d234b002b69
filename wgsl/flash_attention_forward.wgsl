// FlashAttention forward (FLASH_ATTN): one invocation per query row of each (batch, head). It walks the keys it
// may see in tiles of BC scores held in registers, with an online softmax: a running max m and denominator l,
// the output accumulated in f32 and rescaled by e^(m_old - m_new) when the max grows. The T x T scores never
// exist. out[row] = [O | L]: the row's output and its log-sum-exp L = m + log l, which the backward reuses.
// q [BH, TQ, D], k [BH, TK, D], v [BH, TK, DV], out [BH, TQ, DV + 1], contiguous. Causal keeps key j <= i.
@group(0) @binding(0) var<storage, read_write> out: array<{{T}}>;
@group(0) @binding(1) var<storage, read> q: array<{{T}}>;
@group(0) @binding(2) var<storage, read> k: array<{{T}}>;
@group(0) @binding(3) var<storage, read> v: array<{{T}}>;

const BH: u32 = {{BH}}u;
const TQ: u32 = {{TQ}}u;
const TK: u32 = {{TK}}u;
const D: u32 = {{D}}u;
const DV: u32 = {{DV}}u;
const CAUSAL: bool = {{CAUSAL}};
const BC: u32 = 16u;
const LOWEST: f32 = -3.4028234e38;  // stands for -inf (WGSL has no infinity literal): exp(LOWEST - m) = 0

@compute @workgroup_size({{WORKGROUP}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let row = gid.x + gid.y * {{ROW}}u;
  if (row >= BH * TQ) { return; }
  let scale = bitcast<f32>({{SCALE_BITS}}u);
  let bh = row / TQ;
  let i = row % TQ;
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
      var dot = 0.0;
      for (var d = 0u; d < D; d++) { dot += f32(q[row * D + d]) * f32(k[(bh * TK + k0 + j) * D + d]); }
      s[j] = dot * scale;
      mx = max(mx, s[j]);
    }
    let m_new = max(m, mx);
    let alpha = exp(m - m_new);
    l *= alpha;
    for (var c = 0u; c < DV; c++) { acc[c] *= alpha; }
    for (var j = 0u; j < n; j++) {
      let p = exp(s[j] - m_new);
      l += p;
      for (var c = 0u; c < DV; c++) { acc[c] += p * f32(v[(bh * TK + k0 + j) * DV + c]); }
    }
    m = m_new;
  }
  for (var c = 0u; c < DV; c++) { out[row * (DV + 1u) + c] = {{T}}(acc[c] / l); }
  out[row * (DV + 1u) + DV] = {{T}}(m + log(l));
}
