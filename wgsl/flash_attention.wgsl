// Shared by flash_attention_forward.wgsl and _backward.wgsl: q [BH, TQ, D], k [BH, TK, D], v [BH, TK, DV] for BH
// (batch, head) pairs, each read in place through its view: its batch axes as three runs of sizes (BH / (B1 * B2),
// B1, B2), each with the operand's own stride (0 where it is broadcast: grouped-query attention's keys and values
// over a group of query heads), a row stride and an offset; columns are contiguous. Causal attention keeps key
// j <= query i. Binding 0 is each shader's own.
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

// The index of row t's first element for (batch, head) bh in an operand with batch strides s, row stride rs
fn at(bh: u32, t: u32, s: vec3<u32>, rs: u32, offset: u32) -> u32 {
  return offset + (bh / (B1 * B2)) * s.x + ((bh / B2) % B1) * s.y + (bh % B2) * s.z + t * rs;
}
fn q_row(bh: u32, i: u32) -> u32 { return at(bh, i, vec3<u32>({{Q_STRIDES}}), {{Q_ROW}}u, {{Q_OFFSET}}u); }
fn k_row(bh: u32, j: u32) -> u32 { return at(bh, j, vec3<u32>({{K_STRIDES}}), {{K_ROW}}u, {{K_OFFSET}}u); }
fn v_row(bh: u32, j: u32) -> u32 { return at(bh, j, vec3<u32>({{V_STRIDES}}), {{V_ROW}}u, {{V_OFFSET}}u); }

// q_i · k_j in f32 for the rows starting at q[qb] and k[kb] (the score before scaling)
fn qk(qb: u32, kb: u32) -> f32 {
  var dot = 0.0;
  for (var d = 0u; d < D; d++) { dot += f32(q[qb + d]) * f32(k[kb + d]); }
  return dot;
}
