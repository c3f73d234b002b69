// f16 versions (WGSL has no overloading of user functions): computed in f32, rounded once.
fn tl_max_h(a: f16, b: f16) -> f16 { return f16(tl_max(f32(a), f32(b))); }
fn tl_lt_h(a: f16, b: f16) -> bool { return tl_lt(f32(a), f32(b)); }
fn tl_eq_h(a: f16, b: f16) -> bool { return tl_eq(f32(a), f32(b)); }
fn tl_tanh_h(x: f16) -> f16 { return f16(tl_tanh(f32(x))); }
fn tl_erf_h(x: f16) -> f16 { return f16(tl_erf(f32(x))); }
fn tl_pow_h(x: f16, p: f16) -> f16 { return f16(tl_pow(f32(x), f32(p))); }
fn tl_atan_h(x: f16) -> f16 { return f16(tl_atan(f32(x))); }
fn tl_fmod_h(x: f16, y: f16) -> f16 { return f16(tl_fmod(f32(x), f32(y))); }
