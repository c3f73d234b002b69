{{ENABLE}}
// C[b] = A[b] · B[b] for b < {{BATCH}}: A is {{M}}x{{K}}, B is {{K}}x{{N}}, C row-major {{M}}x{{N}}.
// Workgroup (x, y, z) computes the {{BM}}x{{BN}} tile of C at column x·{{BN}}, row y·{{BM}} of batch z; each of
// its {{THREADS}} invocations holds a {{TM}}x{{TN}} block of that tile in registers. The tile's depth loop stages
// {{BK}}-deep slices of A and B in workgroup memory, loaded along each operand's contiguous axis (vec4 loads
// where the layout allows: see load_a / load_b), so a transposed operand is read in place.
@group(0) @binding(0) var<storage, read_write> c: array<{{T}}>;
@group(0) @binding(1) var<storage, read> a: array<{{A_ELEM}}>;
@group(0) @binding(2) var<storage, read> b: array<{{B_ELEM}}>;

var<workgroup> as_: array<f32, {{BK}} * {{BM}}>;  // as_[k * BM + m]
var<workgroup> bs: array<f32, {{BK}} * {{BN}}>;   // bs[k * BN + n]

{{LOAD_A}}
{{LOAD_B}}

@compute @workgroup_size({{BN}} / {{TN}}, {{BM}} / {{TM}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
  let row0 = wid.y * {{BM}}u;
  let col0 = wid.x * {{BN}}u;
  let batch = wid.z;
  var acc: array<f32, {{TM}} * {{TN}}>;
  for (var k0 = 0u; k0 < {{K}}u; k0 += {{BK}}u) {
    load_a(t, batch, row0, k0);
    load_b(t, batch, col0, k0);
    workgroupBarrier();
    for (var k = 0u; k < {{BK}}u; k++) {
      var av: array<f32, {{TM}}>;
      var bv: array<f32, {{TN}}>;
      for (var i = 0u; i < {{TM}}u; i++) { av[i] = as_[k * {{BM}}u + lid.y * {{TM}}u + i]; }
      for (var j = 0u; j < {{TN}}u; j++) { bv[j] = bs[k * {{BN}}u + lid.x * {{TN}}u + j]; }
      for (var i = 0u; i < {{TM}}u; i++) {
        for (var j = 0u; j < {{TN}}u; j++) { acc[i * {{TN}}u + j] += av[i] * bv[j]; }
      }
    }
    workgroupBarrier();
  }
  for (var i = 0u; i < {{TM}}u; i++) {
    let row = row0 + lid.y * {{TM}}u + i;
    for (var j = 0u; j < {{TN}}u; j++) {
      let col = col0 + lid.x * {{TN}}u + j;
      if (row < {{M}}u && col < {{N}}u) {
        c[batch * {{M}}u * {{N}}u + row * {{N}}u + col] = {{T}}(acc[i * {{TN}}u + j]);
      }
    }
  }
}
