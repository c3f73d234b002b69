// ARGSORT (runtime/wgsl_sort.py): a bitonic sort of each of ROWS rows of N values of x (row-major, the sorted axis
// with INNER elements after it, so row r = o·INNER + c holds x[(o·N + i)·INNER + c]). A row is padded to P, the next
// power of two, and sorts (key, original position) pairs: the key is a u32 whose unsigned order is the wanted
// order of the values (descending flips its bits), and the position breaks ties, which makes the sort stable.
// Pads get the largest key and positions ≥ N, so they sort after every real element.
//
// Two passes, picked by {{PASS}}:
//   block_pass  workgroup b sorts block b of B consecutive pairs in workgroup memory. With code[0] = 0 (the first
//               pass) it reads x, and runs the stages k = 2 .. B whole; else it reads the scratch buffer and
//               finishes stage k = 2^code[0] (its steps j < B, which stay inside a block). The pass that ends
//               stage P (the last) writes the positions to out, the others write the pairs back to scratch.
//   step_pass   one invocation per pair of the step j = 2^(code[0] & 31) of stage k = 2^(code[0] >> 5) over the
//               scratch buffer, for steps j ≥ B, whose pairs lie in different blocks.
// The stage and step come from the one-element buffer `code`, so that every pass of a sort is one pipeline.
@group(0) @binding(0) var<storage, read_write> out: array<i32>;
@group(0) @binding(1) var<storage, read> x: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> scratch: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read> code: array<i32>;

const N: u32 = {{N}}u;
const P: u32 = {{P}}u;
const B: u32 = {{B}}u;
const W: u32 = {{WORKGROUP}}u;
const INNER: u32 = {{INNER}}u;
const ROWS: u32 = {{ROWS}}u;
var<workgroup> pairs: array<vec2<u32>, {{B}}>;

// A float's bits (`sign` its sign bit, `inf` the bits of +inf) as a key: NaN (any sign or payload) the largest,
// -0 equal to +0, negatives below positives in reverse order of their magnitude bits. By the bits alone: the shader
// compiler may assume floats are never NaN, and comparisons of floats would then misplace them.
fn float_key(b: u32, sign: u32, inf: u32) -> u32 {
  let magnitude = b & (sign - 1u);
  if (magnitude > inf) { return 0xffffffffu; }
  if (magnitude == 0u) { return sign; }
  return select(b | sign, ~b & (sign | (sign - 1u)), (b & sign) != 0u);
}

// the key of x[i]
fn sort_key(i: u32) -> u32 {
  let v = {{LOAD}};
  return {{KEY}};
}

// x's offset of row r's element i
fn at(r: u32, i: u32) -> u32 { return ((r / INNER) * N + i) * INNER + r % INNER; }

// Whether the pair at position i (in the row) and its partner at i + j are out of order for stage k: a
// bitonic network sorts the runs of k alternately up and down before merging them. All positions differ, so
// the order is total and the result the same on every device.
fn swapped(a: vec2<u32>, b: vec2<u32>, i: u32, k: u32) -> bool {
  let after = a.x > b.x || (a.x == b.x && a.y > b.y);
  return after == ((i & k) == 0u);
}

fn block_pass(b: u32, t: u32) {
  if (b >= ROWS * (P / B)) { return; }  // a spare workgroup of a 2-D dispatch (b is the same for the workgroup)
  let r = b / (P / B);
  let base = (b % (P / B)) * B;  // the block's first position in its row
  let first = code[0] == 0;
  let k0 = select(1u << u32(code[0]), 2u, first);
  let last = select(k0 == P, B == P, first);
  for (var e = t; e < B; e += W) {
    let i = base + e;
    if (!first) {
      pairs[e] = scratch[r * P + i];
    } else if (i < N) {
      pairs[e] = vec2<u32>(sort_key(at(r, i)), i);
    } else {
      pairs[e] = vec2<u32>(0xffffffffu, i);  // a pad
    }
  }
  workgroupBarrier();
  for (var k = k0; k <= select(k0, B, first); k *= 2u) {
    for (var j = min(k, B) / 2u; j > 0u; j /= 2u) {
      for (var q = t; q < B / 2u; q += W) {
        let e = ((q & ~(j - 1u)) << 1u) | (q & (j - 1u));  // the lower of the pair: bit j clear
        let lo = pairs[e];
        let hi = pairs[e + j];
        if (swapped(lo, hi, base + e, k)) {
          pairs[e] = hi;
          pairs[e + j] = lo;
        }
      }
      workgroupBarrier();
    }
  }
  for (var e = t; e < B; e += W) {
    let i = base + e;
    if (!last) {
      scratch[r * P + i] = pairs[e];
    } else if (i < N) {
      out[at(r, i)] = i32(pairs[e].y);
    }
  }
}

fn step_pass(g: u32) {
  if (g >= ROWS * (P / 2u)) { return; }
  let k = 1u << (u32(code[0]) >> 5u);
  let j = 1u << (u32(code[0]) & 31u);
  let q = g % (P / 2u);
  let i = ((q & ~(j - 1u)) << 1u) | (q & (j - 1u));
  let at_lo = (g / (P / 2u)) * P + i;
  let lo = scratch[at_lo];
  let hi = scratch[at_lo + j];
  if (swapped(lo, hi, i, k)) {
    scratch[at_lo] = hi;
    scratch[at_lo + j] = lo;
  }
}

@compute @workgroup_size({{WORKGROUP}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32,
        @builtin(global_invocation_id) gid: vec3<u32>) {
  {{PASS}}
}
