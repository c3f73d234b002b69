// Shared by gather.wgsl and scatter_add.wgsl: out, the values x, the indices idx into an axis of {{N}} entries,
// and the runtime's error flags.
@group(0) @binding(0) var<storage, read_write> out: array<{{T}}>;
@group(0) @binding(1) var<storage, read> x: array<{{T}}>;
@group(0) @binding(2) var<storage, read> idx: array<i32>;
@group(0) @binding(3) var<storage, read_write> errors: array<u32>;

// idx[i] as a position on the axis: a negative index wraps once, as NumPy's take; one still out of range raises
// flag {{SLOT}}, which the runtime turns into an IndexError when the host next reads a value, and gives -1.
fn position(i: u32) -> i32 {
  let j = idx[i];
  let k = select(j, j + {{N}}, j < 0);
  if (k < 0 || k >= {{N}}) {
    errors[{{SLOT}}] = 1u;
    return -1;
  }
  return k;
}
