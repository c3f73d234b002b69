// Reading a quantized weight W (N = {{N}} rows of K = {{K}} input features; tinyllm/ops/qmatmul.py defines the
// formats). WGSL has no 8- or 16-bit integers, and f16 only with an optional feature, so both buffers are bound
// as u32 words and unpacked here: q holds the values as bytes, 4 to a word, little-endian (int8: one signed
// byte per value; int4: two nibbles per byte, value j of a group of {{G}} in the low nibble of the group's byte
// j, value j + {{G}}/2 in the high nibble of the same byte), s the float16 scales, 2 to a word, one per group.
// Rows hold whole groups ({{GROUPS}}): where K is not a multiple of {{G}} they are padded, and only k < K is read.
@group(0) @binding({{Q_BINDING}}) var<storage, read> q: array<u32>;
@group(0) @binding({{S_BINDING}}) var<storage, read> s: array<u32>;

fn byte_at(i: u32) -> u32 { return (q[i >> 2u] >> ((i & 3u) * 8u)) & 0xFFu; }

fn scale_at(n: u32, group: u32) -> f32 {
  let h = n * {{GROUPS}}u + group;
  let pair = unpack2x16float(s[h >> 1u]);
  return select(pair.x, pair.y, (h & 1u) == 1u);
}

// W[n, k] dequantized: the signed value times its group's scale
fn weight_at(n: u32, k: u32) -> f32 {
  let group = k / {{G}}u;
  {{DECODE}}
  return f32(v) * scale_at(n, group);
}
