// Shared by flash_attention_forward.wgsl and _backward.wgsl: q [BH, TQ, D], k [BH, TK, D], v [BH, TK, DV] for BH
// (batch, head) pairs, each read in place through its view: its batch axes as three runs of sizes (BH / (B1 * B2),
// B1, B2), each with the operand's own stride (0 where it is broadcast: grouped-query attention's keys and values
// over a group of query heads), a row stride and an offset; columns are contiguous. Causal attention keeps key
// j <= query i. Binding 0 is each shader's own.
//
// Tiling (FlashAttention-2): a workgroup of BR invocations owns BR consecutive rows of one (batch, head), one row
// per invocation, its own row kept in registers (rd, D wide, and rv, DV wide). The rows it walks over (keys and
// values in the forward and the backward's dq pass; queries and output gradients in the dk/dv pass) come in blocks
// of BC, which the workgroup stages together into workgroup memory (wd: BC rows D wide, wv: BC rows DV wide)
// between a pair of barriers: each staged row is read from global memory, and converted to f32, once per
// workgroup instead of once per row of it. Rows are held as vec4s, zero-padded past D and DV (the zeros add
// nothing to a dot product), so the inner loops are D / 4 vector operations (on lavapipe, where global reads are
// cached anyway, this is what makes the tiled kernels faster). The runtime (tinyllm/runtime/wgsl/attention.py)
// picks BC so that the staged block fits the device's workgroup storage.
@group(0) @binding(1) var<storage, read> q: array<{{T}}>;
@group(0) @binding(2) var<storage, read> k: array<{{T}}>;
@group(0) @binding(3) var<storage, read> v: array<{{T}}>;

const BH: u32 = {{BH}}u;
const TQ: u32 = {{TQ}}u;
const TK: u32 = {{TK}}u;
const D: u32 = {{D}}u;
const DV: u32 = {{DV}}u;
const CAUSAL: bool = {{CAUSAL}};
const B1: u32 = {{B1}}u;
const B2: u32 = {{B2}}u;
const BR: u32 = {{BR}}u;  // rows per workgroup (one per invocation)
const BC: u32 = {{BC}}u;  // rows per staged block
const D4: u32 = (D + 3u) / 4u;  // rows held as vec4s, zero-padded: a dot product or an update is D4 vector ops
const DV4: u32 = (DV + 3u) / 4u;
const LOWEST: f32 = -3.4028234e38;  // stands for -inf (WGSL has no infinity literal): exp(LOWEST - m) = 0

var<workgroup> wd: array<vec4<f32>, BC * D4>;
var<workgroup> wv: array<vec4<f32>, BC * DV4>;
var<private> rd: array<vec4<f32>, D4>;
var<private> rv: array<vec4<f32>, DV4>;

// The index of row t's first element for (batch, head) bh in an operand with batch strides s, row stride rs
fn at(bh: u32, t: u32, s: vec3<u32>, rs: u32, offset: u32) -> u32 {
  return offset + (bh / (B1 * B2)) * s.x + ((bh / B2) % B1) * s.y + (bh % B2) * s.z + t * rs;
}
fn q_row(bh: u32, i: u32) -> u32 { return at(bh, i, vec3<u32>({{Q_STRIDES}}), {{Q_ROW}}u, {{Q_OFFSET}}u); }
fn k_row(bh: u32, j: u32) -> u32 { return at(bh, j, vec3<u32>({{K_STRIDES}}), {{K_ROW}}u, {{K_OFFSET}}u); }
fn v_row(bh: u32, j: u32) -> u32 { return at(bh, j, vec3<u32>({{V_STRIDES}}), {{V_ROW}}u, {{V_OFFSET}}u); }

// Elements 4c .. 4c + 3 of the row of q (k, v) starting at b, w wide, zero past its end: one function per binding,
// as WGSL passes no pointer to storage
fn q4(b: u32, c: u32, w: u32) -> vec4<f32> {
  var r = vec4<f32>();
  for (var t = 0u; t < 4u && 4u * c + t < w; t++) { r[t] = f32(q[b + 4u * c + t]); }
  return r;
}
fn k4(b: u32, c: u32, w: u32) -> vec4<f32> {
  var r = vec4<f32>();
  for (var t = 0u; t < 4u && 4u * c + t < w; t++) { r[t] = f32(k[b + 4u * c + t]); }
  return r;
}
fn v4(b: u32, c: u32, w: u32) -> vec4<f32> {
  var r = vec4<f32>();
  for (var t = 0u; t < 4u && 4u * c + t < w; t++) { r[t] = f32(v[b + 4u * c + t]); }
  return r;
}

// (batch, head, first row) of this workgroup's BR rows, out of `rows` per (batch, head); bh = BH past the last
// block (the dispatch's two-dimensional grid rounds up). Workgroup-uniform, so the barriers after it are too.
fn block(wid: vec3<u32>, rows: u32) -> vec2<u32> {
  let blocks = (rows + BR - 1u) / BR;
  let b = wid.x + wid.y * {{GX}}u;
  return vec2<u32>(b / blocks, (b % blocks) * BR);
}

// Stage keys and values j0 .. j0 + n - 1 of bh into wd and wv, the workgroup's invocations taking every BR-th
// vec4 (consecutive invocations read consecutive elements of a row). Between the barriers of the caller.
fn stage_kv(bh: u32, j0: u32, n: u32, lid: u32) {
  let kb = k_row(bh, j0);
  let vb = v_row(bh, j0);
  for (var e = lid; e < n * D4; e += BR) { wd[e] = k4(kb + (e / D4) * {{K_ROW}}u, e % D4, D); }
  for (var e = lid; e < n * DV4; e += BR) { wv[e] = v4(vb + (e / DV4) * {{V_ROW}}u, e % DV4, DV); }
}

// This invocation's D-wide row (rd) · staged row j of wd, and its DV-wide row (rv) · staged row j of wv, in f32
fn dot_d(j: u32) -> f32 {
  var acc = vec4<f32>();
  for (var c = 0u; c < D4; c++) { acc += rd[c] * wd[j * D4 + c]; }
  return acc.x + acc.y + acc.z + acc.w;
}
fn dot_v(j: u32) -> f32 {
  var acc = vec4<f32>();
  for (var c = 0u; c < DV4; c++) { acc += rv[c] * wv[j * DV4 + c]; }
  return acc.x + acc.y + acc.z + acc.w;
}
