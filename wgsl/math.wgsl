// Math helpers for generated kernels. WGSL's builtins have no erf, and implementations may compute tanh as
// sinh/cosh (inf/inf = NaN for large inputs). WGSL also lets a shader compiler assume floats are never NaN or
// infinite: it may fold `x != x` to false, Mesa's OpenGL path turns `select(b, a, a < b)` into a min that returns
// the operand that is not NaN, and it rewrites `a + c < a` as `c < 0` and `a + c == a` as `c == 0` (wrong for an
// infinite a, and for a large finite one that absorbs c). So NaN is tested on the bits, and comparisons compare
// integer keys of the bits, which no float rewrite reaches.
// a float of these bits, as a runtime value: Tint (Dawn, Chrome) refuses a constant inf or NaN (render.py literal)
fn tl_bits_f32(b: u32) -> f32 { return bitcast<f32>(b); }
fn tl_isnan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }

// a u32 whose unsigned order is the order of the floats that are not NaN: -0 is made +0, then a positive float's
// bits get the top bit set and a negative one's are inverted (a larger magnitude gives a smaller key)
fn tl_key(x: f32) -> u32 {
  let b = bitcast<u32>(x);
  let m = select(b, 0u, (b & 0x7fffffffu) == 0u);
  return select(m | 0x80000000u, ~m, m >= 0x80000000u);
}

// NumPy's comparisons: false where either operand is NaN
fn tl_lt(a: f32, b: f32) -> bool { return !(tl_isnan(a) || tl_isnan(b)) && tl_key(a) < tl_key(b); }
fn tl_eq(a: f32, b: f32) -> bool { return !(tl_isnan(a) || tl_isnan(b)) && tl_key(a) == tl_key(b); }

// NumPy's maximum: a NaN operand wins (a's first), else the larger, b on a tie. (`a > b` rewritten as above
// still picks the right value: rounding is monotonic, so a + c is never on the wrong side of a.)
fn tl_max(a: f32, b: f32) -> f32 { return select(select(select(b, a, a > b), b, tl_isnan(b)), a, tl_isnan(a)); }

// small |x|: x + x·z·P(z) with z = x² (no cancellation, tanh(-0) = -0); else 1 - 2 / (e^{2|x|} + 1) with x's sign
fn tl_tanh(x: f32) -> f32 {
  let a = abs(x);
  let z = x * x;
  var p = -5.70498872745e-3;
  p = p * z + 2.06390887954e-2;
  p = p * z - 5.37397155531e-2;
  p = p * z + 1.33314422036e-1;
  p = p * z - 3.33332819422e-1;
  let small = x * (1.0 + z * p);
  var big = select(1.0 - 2.0 / (exp(a + a) + 1.0), 1.0, a > 9.0);
  big = select(big, -big, x < 0.0);
  return select(big, small, a < 0.625);
}

// |x| < 0.5: the Taylor series of (2/√π)·Σ (-1)ⁿ x^(2n+1) / (n!(2n+1)); else 1 - erfc(|x|) with erfc from
// Numerical Recipes' Chebyshev fit (relative error < 1.2e-7), with x's sign
fn tl_erf(x: f32) -> f32 {
  let z = x * x;
  let series = x * (1.1283791671 + z * (-0.37612638903 + z * (0.11283791671 + z * (-0.02686617064
               + z * (0.00522397762 - z * 0.00085483270)))));
  let a = abs(x);
  let t = 1.0 / (1.0 + 0.5 * a);
  let erfc = t * exp(-a * a - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806
             + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))));
  let big = select(1.0 - erfc, erfc - 1.0, x < 0.0);
  return select(select(big, x, tl_isnan(x)), series, a < 0.5);
}
// C's pow (NumPy's power): p = 0 or x = 1 give 1 (nan too); else nan in, nan out; a negative base needs an integer
// p (|p| ≥ 2^24 is an even integer), its sign from p's parity; 0 and ±inf give 0 or inf by p's sign; p = ±inf gives
// 1, 0 or inf by |x| against 1; the rest is exp2(p·log2|x|)
fn tl_pow(x: f32, p: f32) -> f32 {
  let a = abs(x);
  let ap = abs(p);
  let integer = ap >= 16777216.0 || (ap == floor(ap) && !tl_isnan(p));
  let odd = ap < 16777216.0 && integer && (i32(ap) & 1) == 1;
  let neg = (bitcast<u32>(x) & 0x80000000u) != 0u && odd;  // the sign of the result (-0 too)
  // inf and NaN from bits of a runtime value: Tint (Dawn, Chrome) refuses a constant expression that makes either
  let zero = bitcast<u32>(x) & 0u;
  let inf = bitcast<f32>(0x7f800000u | zero);
  var m = exp2(p * log2(a));
  m = select(m, select(0.0, inf, p < 0.0), a == 0.0);
  m = select(m, select(inf, 0.0, p < 0.0), a == inf);
  m = select(m, select(select(0.0, inf, p > 0.0), select(inf, 0.0, p > 0.0), a < 1.0), ap == inf && !tl_isnan(p));
  m = select(m, 1.0, a == 1.0 && ap == inf);
  m = select(m, -m, neg);
  m = select(m, bitcast<f32>(0x7fc00000u | zero), tl_isnan(x) || tl_isnan(p) || (x < 0.0 && !integer && a != inf && !tl_isnan(x)));
  return select(m, 1.0, (bitcast<u32>(p) & 0x7fffffffu) == 0u || bitcast<u32>(x) == 0x3f800000u);
}

// atan by Cephes' atanf (within 2 ulp): the argument reduced to |t| ≤ tan(π/8) by atan x = π/4 + atan((x-1)/(x+1))
// or π/2 + atan(-1/x), then an odd polynomial. (Drivers' atan builtins may be far worse: lavapipe's is ~350 ulp.)
// ±inf gives ±π/2, -0 stays -0, NaN stays NaN.
fn tl_atan(x: f32) -> f32 {
  let a = abs(x);
  let big = a > 2.414213562373095;
  let mid = a > 0.4142135623730950;
  let t = select(select(a, (a - 1.0) / (a + 1.0), mid), -1.0 / a, big);
  let base = select(select(0.0, 0.78539816339744831, mid), 1.5707963267948966, big);
  let z = t * t;
  let poly = ((8.05374449538e-2 * z - 1.38776856032e-1) * z + 1.99777106478e-1) * z - 3.33329491539e-1;
  let r = base + (poly * z * t + t);
  return select(select(r, -r, (bitcast<u32>(x) & 0x80000000u) != 0u), x, tl_isnan(x));
}

// C's fmod, exactly: x - n·y with n = trunc(x/y), by integer long division of the significands (float tricks need
// a fused multiply-add, which drivers may split: lavapipe's fma rounds twice). |x| = mx·2^ex and |y| = my·2^ey with
// 24-bit mx, my (subnormals need no normalising), so the remainder is (mx·2^(ex-ey) mod my)·2^ey: mx mod my, then
// 8 more bits of the shifted dividend per step (r < my < 2^24, so r·2^8 fits in u32). NaN for a NaN operand, x = ±inf
// or y = 0; x where |x| < |y| (y = ±inf, x = ±0 too); the result has x's sign (±0 as well).
fn tl_fmod(x: f32, y: f32) -> f32 {
  let bx = bitcast<u32>(x) & 0x7fffffffu;
  let by = bitcast<u32>(y) & 0x7fffffffu;
  if (bx >= 0x7f800000u || by > 0x7f800000u || by == 0u) { return bitcast<f32>(0x7fc00000u | (bx & 0u)); }  // (Tint)
  if (bx < by) { return x; }
  let fx = bx >> 23u;
  let fy = by >> 23u;
  let mx = (bx & 0x7fffffu) | select(0u, 0x800000u, fx != 0u);
  let my = (by & 0x7fffffu) | select(0u, 0x800000u, fy != 0u);
  let ey = i32(max(fy, 1u));  // the exponents (plus 150): a subnormal's is that of the smallest normal
  var d = i32(max(fx, 1u)) - ey;  // ≥ 0, as |x| ≥ |y|
  var r = mx % my;
  loop {
    if (d <= 0) { break; }
    let k = min(d, 8);
    r = (r << u32(k)) % my;
    d = d - k;
  }
  // the result r·2^(ey-150) made from its bits, not by ldexp or a product: OpenGL drivers flush a subnormal
  // result of those to zero (GLSL leaves it undefined). r normalised to 24 bits, r·2^s, gives the exponent field
  // ey - s; at 0 or below the result is subnormal, and its bits are r·2^(ey-1).
  if (r == 0u) { return bitcast<f32>(bitcast<u32>(x) & 0x80000000u); }
  let s = i32(countLeadingZeros(r)) - 8;
  let e = ey - s;
  var m: u32;
  if (e > 0) { m = (u32(e - 1) << 23u) + (r << u32(s)); } else { m = r << u32(ey - 1); }
  return bitcast<f32>(m | (bitcast<u32>(x) & 0x80000000u));
}

// i32 division as WGSL defines it, x / 0 = x and INT32_MIN / -1 = INT32_MIN, whatever the backend: GLSL leaves
// both undefined (llvmpipe's OpenGL gives 0 for x / 0), so such a divisor is made 1
fn tl_idiv(x: i32, y: i32) -> i32 {
  return x / select(y, 1, y == 0 || (y == -1 && x == bitcast<i32>(0x80000000u)));
}

// x^p for i32, wrapping; a negative p gives the integer part of 1/x^p (1 for x = 1, ±1 for x = -1, else 0)
fn tl_ipow(x: i32, p: i32) -> i32 {
  if (p < 0) { return select(select(0, select(1, -1, (p & 1) == 1), x == -1), 1, x == 1); }
  var r = 1;
  var b = x;
  var e = p;
  while (e != 0) {
    if ((e & 1) == 1) { r = r * b; }
    b = b * b;
    e = e >> 1u;
  }
  return r;
}
{{F16_HELPERS}}
