// Copies {{N}} one-byte elements (int8, uint8) between two strided views, as copy.wgsl does for wider types.
// Bytes are packed 4 to a u32 word (WGSL has no 8-bit storage), so invocations writing neighbouring elements
// share a word: each one clears and sets only its own byte, with atomic operations on the word.
@group(0) @binding(0) var<storage, read_write> out: array<atomic<u32>>;
@group(0) @binding(1) var<storage, read> src: array<u32>;

@compute @workgroup_size({{WORKGROUP}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = gid.x + gid.y * {{ROW}}u;
  if (i >= {{N}}u) { return; }
  let at_src = {{AT_SRC}};
  let at_out = {{AT_OUT}};
  let value = (src[at_src >> 2u] >> ((at_src & 3u) * 8u)) & 0xFFu;
  let shift = (at_out & 3u) * 8u;
  atomicAnd(&out[at_out >> 2u], ~(0xFFu << shift));
  atomicOr(&out[at_out >> 2u], value << shift);
}
