// FlashAttention backward (FLASH_ATTN_BWD), FlashAttention-2's split: scores are recomputed from q, k and the
// forward's log-sum-exp L (P = e^(S - L)), never stored; dS = P * (dO v^T - Delta). Two dispatches, each tiled as
// flash_attention.wgsl describes (a workgroup owns BR rows of one (batch, head), one per invocation; the rows it
// walks over are staged in workgroup memory BC at a time):
// PART 0, one invocation per query row (q in rd, dO in rv): writes Delta = rowsum(dO * O) - dL and
//   dQ = scale * sum_j dS_ij k_j, walking key blocks (keys in wd, values in wv, as the forward stages them).
// PART 1 (dispatched after it), one invocation per key (k in rd, v in rv): dV_j = sum_i P_ij dO_i and
//   dK_j = scale * sum_i dS_ij q_i, walking query blocks (queries in wd, their dO in wv, L and Delta in wl).
// Each invocation owns its output row, so nothing is added atomically. Causal: PART 0's workgroup stops after the
// last key its last query sees, PART 1's starts at its first key's query (earlier queries see none of its keys),
// each row masking its own part of the blocks straddling the diagonal.
// grads [BH, TQ*D + TK*D + TK*DV] = [dq | dk | dv] per (b, h). o is the forward's [O | L] and dout its gradient
// [dO | dL], rows DOUT_W = DV + 1 wide, or dO alone (DOUT_W = DV, dL = 0: MINUS_DL is then 0); q, k, v, the sizes,
// the staging and the dot products are flash_attention.wgsl's.
@group(0) @binding(0) var<storage, read_write> grads: array<{{T}}>;
@group(0) @binding(4) var<storage, read> o: array<{{T}}>;
@group(0) @binding(5) var<storage, read> dout: array<{{T}}>;
@group(0) @binding(6) var<storage, read_write> delta: array<f32>;

const PART: u32 = {{PART}}u;
const PER_HEAD: u32 = TQ * D + TK * D + TK * DV;
const DOUT_W: u32 = {{DOUT_W}}u;

var<workgroup> wl: array<vec2<f32>, BC>;  // PART 1: (L_i, Delta_i) of the staged queries

// Elements 4c .. 4c + 3 of dO's and O's rows starting at b, zero past DV (as q4, k4 and v4 for q, k and v)
fn dout4(b: u32, c: u32) -> vec4<f32> {
  var r = vec4<f32>();
  for (var t = 0u; t < 4u && 4u * c + t < DV; t++) { r[t] = f32(dout[b + 4u * c + t]); }
  return r;
}
fn o4(b: u32, c: u32) -> vec4<f32> {
  var r = vec4<f32>();
  for (var t = 0u; t < 4u && 4u * c + t < DV; t++) { r[t] = f32(o[b + 4u * c + t]); }
  return r;
}

fn dq_rows(bh: u32, i0: u32, lid: u32, scale: f32) {
  let i = i0 + lid;
  let live = i < TQ;
  let r = bh * TQ + i;
  var lse = 0.0;
  var dl = 0.0;
  if (live) {
    let qb = q_row(bh, i);
    for (var c = 0u; c < D4; c++) { rd[c] = q4(qb, c, D); }
    dl = {{MINUS_DL}};
    for (var c = 0u; c < DV4; c++) {
      rv[c] = dout4(r * DOUT_W, c);
      dl += dot(rv[c], o4(r * (DV + 1u), c));
    }
    delta[r] = dl;
    lse = f32(o[r * (DV + 1u) + DV]);
  }
  var dq: array<vec4<f32>, D4>;
  for (var c = 0u; c < D4; c++) { dq[c] = vec4<f32>(); }
  let kend_all = select(TK, min(TK, min(TQ, i0 + BR)), CAUSAL);  // keys any row of the workgroup sees
  let kend = select(TK, min(TK, i + 1u), CAUSAL);  // keys this row sees
  for (var j0 = 0u; j0 < kend_all; j0 += BC) {
    workgroupBarrier();  // the previous block is no longer read
    stage_kv(bh, j0, min(BC, kend_all - j0), lid);
    workgroupBarrier();
    if (live && j0 < kend) {  // not `continue`: the barriers must stay in uniform control flow
      for (var j = 0u; j < min(BC, kend - j0); j++) {
        let ds = exp(dot_d(j) * scale - lse) * (dot_v(j) - dl) * scale;
        for (var c = 0u; c < D4; c++) { dq[c] += ds * wd[j * D4 + c]; }
      }
    }
  }
  if (live) {
    for (var d = 0u; d < D; d++) { grads[bh * PER_HEAD + i * D + d] = {{T}}(dq[d / 4u][d % 4u]); }
  }
}

// Stage queries i0 .. i0 + n - 1 of bh into wd, their dO into wv and their (L, Delta) into wl, as stage_kv does
fn stage_q(bh: u32, i0: u32, n: u32, lid: u32) {
  let qb = q_row(bh, i0);
  let r0 = bh * TQ + i0;
  for (var e = lid; e < n * D4; e += BR) { wd[e] = q4(qb + (e / D4) * {{Q_ROW}}u, e % D4, D); }
  for (var e = lid; e < n * DV4; e += BR) { wv[e] = dout4((r0 + e / DV4) * DOUT_W, e % DV4); }
  for (var e = lid; e < n; e += BR) { wl[e] = vec2<f32>(f32(o[(r0 + e) * (DV + 1u) + DV]), delta[r0 + e]); }
}

fn dkv_rows(bh: u32, j0: u32, lid: u32, scale: f32) {
  let j = j0 + lid;
  let live = j < TK;
  if (live) {
    let kb = k_row(bh, j);
    let vb = v_row(bh, j);
    for (var c = 0u; c < D4; c++) { rd[c] = k4(kb, c, D); }
    for (var c = 0u; c < DV4; c++) { rv[c] = v4(vb, c, DV); }
  }
  var dk: array<vec4<f32>, D4>;
  var dv: array<vec4<f32>, DV4>;
  for (var c = 0u; c < D4; c++) { dk[c] = vec4<f32>(); }
  for (var c = 0u; c < DV4; c++) { dv[c] = vec4<f32>(); }
  for (var i0 = select(0u, j0, CAUSAL); i0 < TQ; i0 += BC) {
    let n = min(BC, TQ - i0);
    workgroupBarrier();  // the previous block is no longer read
    stage_q(bh, i0, n, lid);
    workgroupBarrier();
    if (live) {
      // causal: query i0 + ii sees key j when ii >= j - i0
      for (var ii = select(0u, max(j, i0) - i0, CAUSAL); ii < n; ii++) {
        let p = exp(dot_d(ii) * scale - wl[ii].x);
        let ds = p * (dot_v(ii) - wl[ii].y) * scale;
        for (var c = 0u; c < DV4; c++) { dv[c] += p * wv[ii * DV4 + c]; }
        for (var c = 0u; c < D4; c++) { dk[c] += ds * wd[ii * D4 + c]; }
      }
    }
  }
  if (live) {
    let base = bh * PER_HEAD + TQ * D;
    for (var d = 0u; d < D; d++) { grads[base + j * D + d] = {{T}}(dk[d / 4u][d % 4u]); }
    for (var c = 0u; c < DV; c++) { grads[base + TK * D + j * DV + c] = {{T}}(dv[c / 4u][c % 4u]); }
  }
}

@compute @workgroup_size(BR)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let scale = bitcast<f32>({{SCALE_BITS}}u);
  let blk = block(wid, select(TK, TQ, PART == 0u));
  if (blk.x >= BH) { return; }
  if (PART == 0u) { dq_rows(blk.x, blk.y, lid, scale); } else { dkv_rows(blk.x, blk.y, lid, scale); }
}
