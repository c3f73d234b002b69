// FlashAttention forward (FLASH_ATTN), tiled as FlashAttention-2: a workgroup takes BR query rows of one
// (batch, head), one per invocation, its q row in rd. It walks the keys in blocks of BC, staging each block's keys
// and values in workgroup memory (stage_kv), and each invocation scores its query against the staged keys and
// runs an online softmax in registers: a running max m and denominator l, the output accumulated in f32 and
// rescaled by e^(m_old - m_new) when the max grows. The T x T scores never exist. Causal: the workgroup stops after
// the last key its last row sees (blocks past it are masked for all its rows), and each row stops at its own last
// key inside the blocks straddling the diagonal. out[row] = [O | L]: the row's output and its log-sum-exp
// L = m + log l, which the backward reuses. out [BH, TQ, DV + 1]; the rest is flash_attention.wgsl's.
@group(0) @binding(0) var<storage, read_write> out: array<{{T}}>;

@compute @workgroup_size(BR)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
  let blk = block(wid, TQ);
  if (blk.x >= BH) { return; }
  let bh = blk.x;
  let i = blk.y + lid;
  let live = i < TQ;  // the last block's spare invocations still stage and meet the barriers
  let scale = bitcast<f32>({{SCALE_BITS}}u);
  if (live) {
    let qb = q_row(bh, i);
    for (var c = 0u; c < D4; c++) { rd[c] = q4(qb, c, D); }
  }
  let kend_all = select(TK, min(TK, min(TQ, blk.y + BR)), CAUSAL);  // keys any row of the workgroup sees
  let kend = select(TK, min(TK, i + 1u), CAUSAL);  // keys this row sees
  var acc: array<vec4<f32>, DV4>;
  for (var c = 0u; c < DV4; c++) { acc[c] = vec4<f32>(); }
  var s: array<f32, BC>;
  var m = LOWEST;
  var l = 0.0;
  for (var j0 = 0u; j0 < kend_all; j0 += BC) {
    workgroupBarrier();  // the previous block is no longer read
    stage_kv(bh, j0, min(BC, kend_all - j0), lid);
    workgroupBarrier();
    if (live && j0 < kend) {  // not `continue`: the barriers must stay in uniform control flow
      let n = min(BC, kend - j0);
      var mx = LOWEST;
      for (var j = 0u; j < n; j++) {
        s[j] = dot_d(j) * scale;
        mx = max(mx, s[j]);
      }
      let m_new = max(m, mx);
      let alpha = exp(m - m_new);
      l *= alpha;
      for (var c = 0u; c < DV4; c++) { acc[c] *= alpha; }
      for (var j = 0u; j < n; j++) {
        let p = exp(s[j] - m_new);
        l += p;
        for (var c = 0u; c < DV4; c++) { acc[c] += p * wv[j * DV4 + c]; }
      }
      m = m_new;
    }
  }
  if (live) {
    let row = bh * TQ + i;
    for (var c = 0u; c < DV; c++) { out[row * (DV + 1u) + c] = {{T}}(acc[c / 4u][c % 4u] / l); }
    out[row * (DV + 1u) + DV] = {{T}}(m + log(l));
  }
}
