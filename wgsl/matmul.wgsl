{{ENABLE}}
// C[b] = A[b] · B[b] for b < {{BATCH}}: A is {{M}}x{{K}}, B is {{K}}x{{N}}, C row-major {{M}}x{{N}}.
// Workgroup (x, y, z) computes the {{BM}}x{{BN}} tile of C at column x·{{BN}}, row y·{{BM}} of batch z; each of
// its {{THREADS}} invocations holds {{TM}}x{{TN}} elements of that tile in registers. The tile's depth loop stages
// {{BK}}-deep slices of A and B in workgroup memory, loaded along each operand's contiguous axis (vec4 loads
// where the layout allows: see load_a / load_b), so a transposed operand is read in place.
// Workgroup memory holds vec4s: element (k, m) of A's slice is as_[k * {{SA4}} + m / 4][m % 4] (rows padded by
// one vec4, which spreads the transposing stores of load_a over more banks). An invocation whose TM (TN) is a
// multiple of 4 owns rows (columns) in runs of 4, the runs 4 x (invocations along y (x)) apart, so that one vec4
// read serves each run and the invocations of a subgroup read consecutive vec4s (no bank conflicts); otherwise it
// owns TM (TN) consecutive rows (columns). The per-k reads, the multiply-adds and the stores are unrolled, so
// every index into acc is a constant and acc stays in registers.
@group(0) @binding(0) var<storage, read_write> c: array<{{T}}>;
@group(0) @binding(1) var<storage, read> a: array<{{A_ELEM}}>;
@group(0) @binding(2) var<storage, read> b: array<{{B_ELEM}}>;

var<workgroup> as_: array<vec4<f32>, {{BK}} * {{SA4}}>;
var<workgroup> bs: array<vec4<f32>, {{BK}} * {{SB4}}>;

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
      {{READ}}
      {{FMA}}
    }
    workgroupBarrier();
  }
  {{STORE}}
}
