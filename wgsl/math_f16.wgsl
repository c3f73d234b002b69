// f16 versions (WGSL has no overloading of user functions): computed in f32, rounded once.
fn tl_max_h(a: f16, b: f16) -> f16 { return f16(tl_max(f32(a), f32(b))); }
fn tl_lt_h(a: f16, b: f16) -> bool { return tl_lt(f32(a), f32(b)); }
fn tl_eq_h(a: f16, b: f16) -> bool { return tl_eq(f32(a), f32(b)); }
fn tl_tanh_h(x: f16) -> f16 { return f16(tl_tanh(f32(x))); }
fn tl_erf_h(x: f16) -> f16 { return f16(tl_erf(f32(x))); }
fn tl_pow_h(x: f16, p: f16) -> f16 { return f16(tl_pow(f32(x), f32(p))); }
fn tl_atan_h(x: f16) -> f16 { return f16(tl_atan(f32(x))); }
fn tl_fmod_h(x: f16, y: f16) -> f16 { return f16(tl_fmod(f32(x), f32(y))); }
// x rounded to f16's precision (to nearest even: round() on x scaled so one f16 ulp is 1, all exact in f32; past
// 65504 inf), for an adapter that keeps f16 values in f32 registers between ops: each float16 instruction of a fused
// kernel rounds, as its op does unfused
fn tl_round_h(x: f16) -> f16 {
  let f = f32(x);
  let e = i32((bitcast<u32>(f) >> 23u) & 0xffu) - 127;
  let k = max(e, -14) - 10;
  let r = ldexp(round(ldexp(f, -k)), k);
  return f16(select(r, sign(f) * bitcast<f32>(0x7f800000u | (bitcast<u32>(f) & 0u)), e < 128 && abs(r) > 65504.0));
}
