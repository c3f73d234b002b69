// FlashAttention backward (FLASH_ATTN_BWD), FlashAttention-2's split: scores are recomputed from q, k and the
// forward's log-sum-exp L (P = e^(S - L)), never stored. PART 0 runs one invocation per query row: it writes
// Delta = rowsum(dO * O) - dL and dQ = scale * sum_j dS_ij k_j. PART 1 (dispatched after it) runs one per key:
// dV_j = sum_i P_ij dO_i and dK_j = scale * sum_i dS_ij q_i, with dS = P * (dO v^T - Delta). Each invocation owns
// its output row, so nothing is added atomically. grads [BH, TQ*D + TK*D + TK*DV] = [dq | dk | dv] per (b, h).
// o is the forward's [O | L] and dout its gradient [dO | dL], rows DOUT_W = DV + 1 wide, or dO alone (DOUT_W = DV,
// dL = 0: MINUS_DL is then 0); q, k, v, the sizes and qk() are flash_attention.wgsl's.
@group(0) @binding(0) var<storage, read_write> grads: array<{{T}}>;
@group(0) @binding(4) var<storage, read> o: array<{{T}}>;
@group(0) @binding(5) var<storage, read> dout: array<{{T}}>;
@group(0) @binding(6) var<storage, read_write> delta: array<f32>;

const PART: u32 = {{PART}}u;
const PER_HEAD: u32 = TQ * D + TK * D + TK * DV;
const DOUT_W: u32 = {{DOUT_W}}u;

// (P_ij, dS_ij) for query i and key j of (batch, head) bh.
fn scores(bh: u32, i: u32, j: u32, dl: f32, scale: f32) -> vec2<f32> {
  let qr = bh * TQ + i;
  let p = exp(qk(q_row(bh, i), k_row(bh, j)) * scale - f32(o[qr * (DV + 1u) + DV]));
  let vb = v_row(bh, j);
  var dp = 0.0;
  for (var c = 0u; c < DV; c++) { dp += f32(dout[qr * DOUT_W + c]) * f32(v[vb + c]); }
  return vec2<f32>(p, p * (dp - dl) * scale);
}

@compute @workgroup_size({{WORKGROUP}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let scale = bitcast<f32>({{SCALE_BITS}}u);
  let r = gid.x + gid.y * {{ROW}}u;
  if (PART == 0u) {
    if (r >= BH * TQ) { return; }
    let bh = r / TQ;
    let i = r % TQ;
    var dl = {{MINUS_DL}};
    for (var c = 0u; c < DV; c++) { dl += f32(dout[r * DOUT_W + c]) * f32(o[r * (DV + 1u) + c]); }
    delta[r] = dl;
    var dq: array<f32, {{D}}>;
    for (var d = 0u; d < D; d++) { dq[d] = 0.0; }
    let kend = select(TK, min(TK, i + 1u), CAUSAL);
    for (var j = 0u; j < kend; j++) {
      let ds = scores(bh, i, j, dl, scale).y;
      let kb = k_row(bh, j);
      for (var d = 0u; d < D; d++) { dq[d] += ds * f32(k[kb + d]); }
    }
    for (var d = 0u; d < D; d++) { grads[bh * PER_HEAD + i * D + d] = {{T}}(dq[d]); }
  } else {
    if (r >= BH * TK) { return; }
    let bh = r / TK;
    let j = r % TK;
    var dk: array<f32, {{D}}>;
    var dv: array<f32, {{DV}}>;
    for (var d = 0u; d < D; d++) { dk[d] = 0.0; }
    for (var c = 0u; c < DV; c++) { dv[c] = 0.0; }
    for (var i = select(0u, j, CAUSAL); i < TQ; i++) {
      let qr = bh * TQ + i;
      let pds = scores(bh, i, j, delta[qr], scale);
      let qb = q_row(bh, i);
      for (var c = 0u; c < DV; c++) { dv[c] += pds.x * f32(dout[qr * DOUT_W + c]); }
      for (var d = 0u; d < D; d++) { dk[d] += pds.y * f32(q[qb + d]); }
    }
    for (var d = 0u; d < D; d++) { grads[bh * PER_HEAD + TQ * D + j * D + d] = {{T}}(dk[d]); }
    for (var c = 0u; c < DV; c++) { grads[bh * PER_HEAD + TQ * D + TK * D + j * DV + c] = {{T}}(dv[c]); }
  }
}
