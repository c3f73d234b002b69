// QMATMUL's dynamic quantization of x (M, K) (tinyllm/ops/qmatmul.py): out = s·qx, the values the int8 activations
// stand for, s = max|x_G| / 127 per row and group of G columns, qx = clamp(round(x / s), -127, 127) (round: to
// nearest even, as NumPy's rint). One invocation per row and group; a group holding inf or NaN gives NaN.
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> x: array<f32>;

// a runtime call, not a constant expression: Tint (Dawn, Chrome) refuses constants that evaluate to NaN
fn nan_of(bits: u32) -> f32 { return bitcast<f32>(bits); }

@compute @workgroup_size({{WORKGROUP}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let id = gid.x + gid.y * {{ROW}}u;
  if (id >= {{M}}u * {{GROUPS}}u) { return; }
  let row = (id / {{GROUPS}}u) * {{K}}u;
  let t0 = (id % {{GROUPS}}u) * {{G}}u;
  let t1 = min(t0 + {{G}}u, {{K}}u);
  var amax = 0.0;
  var finite = true;
  for (var t = t0; t < t1; t++) {
    let a = abs(x[row + t]);
    finite = finite && a <= 3.40282347e38;  // false for inf, and for NaN (every comparison with NaN is)
    amax = max(amax, a);
  }
  let s = amax / 127.0;
  for (var t = t0; t < t1; t++) {
    var v = 0.0;
    if (!finite) {
      v = nan_of(0x7fc00000u);
    } else if (s > 0.0) {
      v = s * clamp(round(x[row + t] / s), -127.0, 127.0);
    }
    out[row + t] = v;
  }
}
