// Stage the {{ROWS}}x{{BK}} slice of operand {{X}} at (r0, k0) into {{SH}} (element (k, r) at
// {{SH}}[k * {{S4}} + r / 4][r % 4]), reading {{VEC}} consecutive elements along the operand's contiguous axis per
// load; out-of-range elements are 0.
fn load_{{X}}(t: u32, batch: u32, r0: u32, k0: u32) {
  for (var i = t; i < {{ROWS}}u * {{BK}}u / {{VEC}}u; i += {{THREADS}}u) {
    let fast = (i % ({{FAST_TILE}}u / {{VEC}}u)) * {{VEC}}u;  // along the contiguous axis
    let slow = i / ({{FAST_TILE}}u / {{VEC}}u);
    let r = {{R_EXPR}};
    let k = {{K_EXPR}};
    let inside = r0 + r < {{ROWS_TOTAL}}u && k0 + k < {{K}}u;
    let at = {{OFFSET}}u + batch * {{BATCH_STRIDE}}u + (r0 + r) * {{R_STRIDE}}u + (k0 + k) * {{K_STRIDE}}u;
    {{LOAD}}
  }
}
