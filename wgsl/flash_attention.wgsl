// Shared by flash_attention_forward.wgsl and _backward.wgsl: q [BH, TQ, D], k [BH, TK, D], v [BH, TK, DV],
// contiguous, for BH (batch, head) pairs; causal attention keeps key j <= query i. Binding 0 is each shader's own.
@group(0) @binding(1) var<storage, read> q: array<{{T}}>;
@group(0) @binding(2) var<storage, read> k: array<{{T}}>;
@group(0) @binding(3) var<storage, read> v: array<{{T}}>;

const BH: u32 = {{BH}}u;
const TQ: u32 = {{TQ}}u;
const TK: u32 = {{TK}}u;
const D: u32 = {{D}}u;
const DV: u32 = {{DV}}u;
const CAUSAL: bool = {{CAUSAL}};

// q_i · k_j in f32, for query row qr = bh*TQ + i and key row kr = bh*TK + j (the score before scaling)
fn qk(qr: u32, kr: u32) -> f32 {
  var dot = 0.0;
  for (var d = 0u; d < D; d++) { dot += f32(q[qr * D + d]) * f32(k[kr * D + d]); }
  return dot;
}
