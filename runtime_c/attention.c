/*
FlashAttention-2 (Dao, 2023) on the CPU: attention whose memory is linear in the sequence length.

The inputs are read in place through their strides (tl_attn_view in attention.h).

Forward, one task per (batch x head, tile of BR queries), tasks spread over the OpenMP threads:

    m = -inf, l = 0, O = 0                                   (per query row of the tile)
    for each tile of BC keys the rows may see (causal: up to the tile's last row):
        S = Q K^T                                            BR x BC, the only score tile held
        m' = max(m, rowmax(S * scale));  P = exp(S * scale - m');  a = exp(m - m')
        l = l * a + rowsum(P);  O = O * a + P V;  m = m'
    O = O / l;  L = m + log l                                (L is all the backward needs)

Backward, one task per (batch x head), so dQ, dK and dV of a head have a single writer (no atomics):

    Delta = rowsum(dO o O) - dL                              (dL = 0 when dout is dO alone)
    for each tile of BC keys:  K^T and V^T packed once
        for each tile of BR queries that sees it:
            P = exp(Q K^T * scale - L);  dV += P^T dO;  dP = dO V^T
            dS = P o (dP - Delta) * scale;  dQ += dS K;  dK += dS^T Q

All the products are small GEMMs C (+)= A B with A read through strides (plain or transposed) and B row-major,
the blocks a causal mask zeroes skipped (mm_causal). Three paths, picked per call by tl_cpu_path() (cpu.h: the
CPU's features, TINYLLM_CPU, tl_cpu_set_path): AVX-512 does the products 6 rows x up to 64 columns at a time in
registers, exp with a vectorised polynomial over 16 lanes, and uses mask registers at ragged edges; AVX2+FMA the
same over 6 x 16 blocks and 8 lanes, with masked loads; the portable path is plain C. The products are in
attention_mm.c (tl_attn_mm), the row functions (scale and max, exp and sum, the softmax gradient, dot, transpose) in
attention_rows.c, the tiling here. The _half entry points run the same code on 16-bit inputs widened
tile by tile (or head by head, backward) into the thread's scratch, rounding each output once (attention.h); on a
CPU with AVX512_BF16, bfloat16 inputs are not widened: the products run on vdpbf16ps over pairs of bfloat16 read in
place or packed (tl_attn_mm's PATH_PAIRS), with P and dS rounded to bfloat16 first, as torch's CPU flash attention
does (pairs_fit says when).
*/
#include <math.h>

#include "attention.h"
#include "attention_internal.h"
#include "common.h"
#include "cpu.h"
#include "formats.h"
#include "sgemm.h"
#include "threads.h"

#define BR 64  // queries per tile
#define BC 64  // keys per tile
#define PARALLEL_MIN (1L << 20)  // below this many multiply-adds a call runs on one thread: waking a team costs more

// Threads for a call of `work` multiply-adds split into `tasks` independent pieces.
static int threads_for(long work, long tasks) {
    return work < PARALLEL_MIN ? 1 : (int)tl_max(1, tl_min(tl_get_num_threads(), tasks));
}

// Keys of the tile starting at k0 (bc of them) that query `row` may see.
static long visible(long row, long k0, long bc, int causal) {
    if (!causal) return bc;
    return tl_max(0, tl_min(bc, row - k0 + 1));
}

// Where the (b0, b1, b2) matrix of a view starts, in elements, bh = (b0 * B1 + b1) * B2 + b2.
static inline long head_at(const tl_attn_view *x, long bh, long B1, long B2) {
    return bh / (B1 * B2) * x->s0 + bh / B2 % B1 * x->s1 + bh % B2 * x->s2;
}

static inline const float *head(const tl_attn_view *x, long bh, long B1, long B2) {
    return (const float *)x->p + head_at(x, bh, B1, B2);
}

static inline const uint16_t *head16(const tl_attn_view *x, long bh, long B1, long B2) {
    return (const uint16_t *)x->p + head_at(x, bh, B1, B2);
}

// dst[r * ld + c] = src[r * st + c] widened to float32 (16-bit floats of format fmt), r < n, c < d.
static void widen_rows(int fmt, float *dst, long ld, const uint16_t *src, long st, long n, long d) {
    for (long r = 0; r < n; r++) tl_widen_half(fmt, src + r * st, d, dst + r * ld);
}

// One product of a tile of queries (from i0) and a tile of keys (from k0), C (+)= A B, where the causal mask
// zeroes a triangle of it: taken RB rows at a time, each block cut to what its rows see, so the work above the
// diagonal is skipped (about half of it when the tiles cover the sequence). With off = i0 - k0:
//   CUT_N   rows are queries, columns keys: row r sees columns < off + r + 1             (S = Q K^T, dP = dO V^T)
//   CUT_K   rows are queries, the sum runs over keys, cut the same way                   (O += P V, dQ += dS K)
//   SKIP_K  rows are keys, the sum runs over queries: key row j is seen from query j - off (dV += P^T dO, dK += dS^T Q)
// The terms skipped are those the mask makes zero, so the result is exact; not causal, one plain product.
#define RB 6  // rows per block: the micro-kernel's
enum { CUT_N, CUT_K, SKIP_K };

static void mm_causal(int path, int causal, int cut, long off, long M, long N, long K, const float *A, long ars,
                      long acs, const float *B, long ldb, float *C, long ldc, int accumulate) {
    if (!causal) {
        tl_attn_mm(path, M, N, K, A, ars, acs, B, ldb, C, ldc, accumulate);
        return;
    }
    for (long m = 0; m < M; m += RB) {
        const long rb = tl_min(RB, M - m), seen = off + m + rb;
        const float *a = A + m * ars;
        float *c = C + m * ldc;
        if (cut == CUT_N) {
            // Whole 16-column strips up to the tile's edge: the masked last strip of a ragged cut costs more than
            // the columns it skips (bench/RESULTS.md). The columns past what a row sees stay inside the tile, and
            // the row functions (exp_sum, softmax_grad_row) overwrite them with zeros before anything reads them.
            tl_attn_mm(path, rb, tl_min(N, tl_round_up(seen, 16)), K, a, ars, acs, B, ldb, c, ldc, accumulate);
        } else if (cut == CUT_K) {  // (PATH_PAIRS sums pairs of keys: a pair that holds a seen key counts)
            const long k = path == PATH_PAIRS ? (seen + 1) / 2 : seen;
            tl_attn_mm(path, rb, N, tl_max(0, tl_min(K, k)), a, ars, acs, B, ldb, c, ldc, accumulate);
        } else {  // (PATH_PAIRS: a pair of queries is skipped when neither sees a row of the block)
            const long k = tl_max(0, tl_min(K, path == PATH_PAIRS ? (m - off) / 2 : m - off));
            tl_attn_mm(path, rb, N, K - k, a + k * acs, ars, acs, B + k * ldb, ldb, c, ldc, accumulate);
        }
    }
}

// ----------------------------------------------------------------------------
// Forward.

// Whether a bfloat16 kernel takes its products on vdpbf16ps (tl_attn_mm's PATH_PAIRS): the CPU has it in use, and
// the n views' rows are read in place as pairs of 16-bit values (their widths d even, every row and head at a
// 4-byte boundary).
static int pairs_fit(int fmt, const tl_attn_view *const *x, int n, long d) {
    if (fmt != TL_BF16 || d % 2 != 0 || !tl_cpu_bf16_dot()) return 0;
    for (int i = 0; i < n; i++)
        if ((uintptr_t)x[i]->p % 4 != 0 || (x[i]->s0 | x[i]->s1 | x[i]->s2 | x[i]->st) % 2 != 0) return 0;
    return 1;
}

// The forward on float32 (fmt TL_F32: out is float *) or 16-bit floats (out is uint16_t *). A 16-bit task widens
// its query tile, and the keys and values it reads, into this thread's scratch, and sums its output tile there;
// a bfloat16 one on vdpbf16ps (pairs_fit) reads q and k where they lie instead, and multiplies P, rounded to
// bfloat16 as torch's CPU flash attention rounds it, by V packed in pairs of keys, each tile's.
static void forward(int fmt, void *out, const tl_attn_view *q, const tl_attn_view *k, const tl_attn_view *v,
                    long B0, long B1, long B2, long Tq, long Tk, long D, long Dv, float scale, int causal) {
    const tl_attn_view *const in_place[2] = {q, k};
    const int path = tl_cpu_path(), pairs = pairs_fit(fmt, in_place, 2, D), mm = pairs ? PATH_PAIRS : path;
    const long BH = B0 * B1 * B2, tiles = (Tq + BR - 1) / BR, ldo = Dv + 1, Dk = pairs ? D / 2 : D;
    const int nt = threads_for(BH * Tq * Tk * (D + Dv), BH * tiles);
    // Static, in order: each thread takes whole heads of the same batch rows as the kernels before and after
    // it, so it reads and writes what its own core holds in cache (the two cores may share none). The
    // causal tiles of a head differ in work, but each thread's share holds whole heads (as when BH is even).
#pragma omp parallel for num_threads(nt) schedule(static)
    for (long task = 0; task < BH * tiles; task++) {
        const long bh = task / tiles, i0 = task % tiles * BR, br = tl_min(BR, Tq - i0);
        const long kend = causal ? tl_min(Tk, i0 + br) : Tk;
        const float *qt, *kb, *vb;
        long qs = q->st, ks = k->st, vs = v->st;  // (pairs: q's and k's in pairs)
        float *o;
        uint16_t *p16 = NULL;  // pairs: P rounded, and this key tile's V in pairs
        uint32_t *vp = NULL;
        if (fmt == TL_F32) {
            qt = head(q, bh, B1, B2) + i0 * qs;
            kb = head(k, bh, B1, B2);
            vb = head(v, bh, B1, B2);
            o = (float *)out + (bh * Tq + i0) * ldo;
        } else if (pairs) {
            qs /= 2, ks /= 2;
            qt = (const float *)(head16(q, bh, B1, B2) + i0 * q->st);
            kb = (const float *)head16(k, bh, B1, B2);
            vb = NULL;
            o = tl_scratch(3, (size_t)(br * ldo + BR * BC / 2 + BC / 2 * Dv));
            p16 = (uint16_t *)(o + br * ldo), vp = (uint32_t *)(o + br * ldo + BR * BC / 2);
        } else {
            float *w = tl_scratch(3, (size_t)(br * D + kend * (D + Dv) + br * ldo));
            widen_rows(fmt, w, D, head16(q, bh, B1, B2) + i0 * qs, qs, br, D);
            widen_rows(fmt, w + br * D, D, head16(k, bh, B1, B2), ks, kend, D);
            widen_rows(fmt, w + br * D + kend * D, Dv, head16(v, bh, B1, B2), vs, kend, Dv);
            qt = w, kb = w + br * D, vb = kb + kend * D, o = (float *)vb + kend * Dv;
            qs = ks = D, vs = Dv;
        }
        float *s = tl_scratch(0, BR * BC), *kt = tl_scratch(1, D * BC), *ml = tl_scratch(2, 2 * BR);
        float *mrow = ml, *lrow = ml + BR;
        for (long r = 0; r < br; r++) {
            mrow[r] = -INFINITY;
            lrow[r] = 0.0f;
            for (long c = 0; c < Dv; c++) o[r * ldo + c] = 0.0f;
        }
        for (long k0 = 0; k0 < kend; k0 += BC) {
            const long bc = tl_min(BC, Tk - k0);
            tl_attn_transpose(path, kt, BC, kb + k0 * ks, ks, bc, Dk);  // (pairs: whole pairs, moved as 32-bit words)
            mm_causal(mm, causal, CUT_N, i0 - k0, br, bc, Dk, qt, qs, 1, kt, BC, s, BC, 0);
            for (long r = 0; r < br; r++) {
                float *row = s + r * BC;
                const long n = visible(i0 + r, k0, bc, causal);
                if (n == 0) {  // this row sees none of these keys
                    memset(row, 0, (size_t)bc * sizeof(float));
                    continue;
                }
                const float mx = tl_attn_scale_max(path, row, n, scale);
                const float m_new = mrow[r] > mx ? mrow[r] : mx;
                const float sum = tl_attn_exp_sum(path, row, n, bc, m_new);  // and zeros past what the row sees
                if (mrow[r] == -INFINITY) {  // the row's first visible tile: O and l are still 0
                    lrow[r] = sum;
                } else {
                    const float alpha = expf(mrow[r] - m_new);
                    float *orow = o + r * ldo;
                    for (long c = 0; c < Dv; c++) orow[c] *= alpha;
                    lrow[r] = lrow[r] * alpha + sum;
                }
                mrow[r] = m_new;
            }
#if defined(__x86_64__)
            if (pairs) {
                tl_attn_round_pairs(p16, BC, s, BC, br, bc, BC);
                tl_attn_pack_pairs(vp, Dv, head16(v, bh, B1, B2) + k0 * vs, vs, bc, Dv);
                mm_causal(mm, causal, CUT_K, i0 - k0, br, Dv, (bc + 1) / 2, (const float *)p16, BC / 2, 1,
                          (const float *)vp, Dv, o, ldo, 1);
                continue;
            }
#endif
            mm_causal(path, causal, CUT_K, i0 - k0, br, Dv, bc, s, BC, 1, vb + k0 * vs, vs, o, ldo, 1);
        }
        for (long r = 0; r < br; r++) {
            const float inv = 1.0f / lrow[r];
            for (long c = 0; c < Dv; c++) o[r * ldo + c] *= inv;
            o[r * ldo + Dv] = mrow[r] + logf(lrow[r]);
        }
        if (fmt != TL_F32) tl_round_half(fmt, br, ldo, o, (uint16_t *)out + (bh * Tq + i0) * ldo, ldo, 1);
    }
}

void attention_forward(float *out, const tl_attn_view *q, const tl_attn_view *k, const tl_attn_view *v,
                       long B0, long B1, long B2, long Tq, long Tk, long D, long Dv, float scale, int causal) {
    forward(TL_F32, out, q, k, v, B0, B1, B2, Tq, Tk, D, Dv, scale, causal);
}

void attention_forward_half(int fmt, uint16_t *out, const tl_attn_view *q, const tl_attn_view *k,
                            const tl_attn_view *v, long B0, long B1, long B2, long Tq, long Tk, long D, long Dv,
                            float scale, int causal) {
    forward(fmt, out, q, k, v, B0, B1, B2, Tq, Tk, D, Dv, scale, causal);
}

// ----------------------------------------------------------------------------
// Backward.

// The backward on float32 (fmt TL_F32: dqkv is float *) or 16-bit floats (dqkv is uint16_t *): a 16-bit head's
// inputs are widened into this thread's scratch once, and its dq, dk, dv summed there, then rounded. A bfloat16
// head on vdpbf16ps (pairs_fit) reads q, k and v where they lie instead (out and dout are still widened, for
// Delta), and rounds P and dS to bfloat16 for the products that take them, as torch's CPU flash attention does;
// the operands that run along the queries or keys are packed in pairs (tl_attn_pack_pairs): Q and dO once a head,
// K once a key tile, P and dS once a tile.
static void backward(int fmt, void *dqkv, const tl_attn_view *q, const tl_attn_view *k, const tl_attn_view *v,
                     const tl_attn_view *out, const tl_attn_view *dout, long B0, long B1, long B2, long Tq, long Tk,
                     long D, long Dv, float scale, int causal, int dl) {
    const tl_attn_view *const in_place[3] = {q, k, v};
    const int path = tl_cpu_path();
    const int pairs = pairs_fit(fmt, in_place, 3, D) && Dv % 2 == 0, mm = pairs ? PATH_PAIRS : path;
    const long BH = B0 * B1 * B2, per_head = Tq * D + Tk * D + Tk * Dv, dov = Dv + (dl != 0);
    const long Dk = pairs ? D / 2 : D, Dvk = pairs ? Dv / 2 : Dv, Tq2 = (Tq + 1) / 2;
    const long packed = pairs ? (Tq * Dv / 2 + Tq2 * (D + Dv) + (BC / 2) * D) : 0;  // do16, qp, dop, kp (floats)
    const int nt = threads_for(BH * Tq * Tk * (2 * D + 3 * Dv), BH);
    // Static, as in the forward: one task per head, all of equal work.
#pragma omp parallel for num_threads(nt) schedule(static)
    for (long bh = 0; bh < BH; bh++) {
        const float *qb, *kb, *vb, *ob, *dob, *dop16 = NULL;
        long qs = q->st, ks = k->st, vs = v->st, os = out->st, dos = dout->st;
        float *dq;
        uint32_t *qp = NULL, *dop = NULL, *kp = NULL;  // pairs: Q and dO along the queries, a key tile's K
        if (fmt == TL_F32) {
            qb = head(q, bh, B1, B2), kb = head(k, bh, B1, B2), vb = head(v, bh, B1, B2);
            ob = head(out, bh, B1, B2), dob = head(dout, bh, B1, B2);
            dq = (float *)dqkv + bh * per_head;
        } else {
            float *w = tl_scratch(3, (size_t)(2 * per_head + Tq * (Dv + 1 + dov) + packed));
            dq = w;  // then q, k, v, out, dout widened
            float *wq = w + per_head, *wk = wq + Tq * D, *wv = wk + Tk * D, *wo = wv + Tk * Dv;
            float *wd = wo + Tq * (Dv + 1);
            widen_rows(fmt, wo, Dv + 1, head16(out, bh, B1, B2), os, Tq, Dv + 1);
            widen_rows(fmt, wd, dov, head16(dout, bh, B1, B2), dos, Tq, dov);
            ob = wo, dob = wd;
            os = Dv + 1, dos = dov;
#if defined(__x86_64__)
            if (pairs) {  // q, k, v in place; dout's rows copied whole (dP's A: pairs along Dv), Q and dO packed
                uint16_t *do16 = (uint16_t *)(wd + Tq * dov);
                const uint16_t *d16 = head16(dout, bh, B1, B2), *q16 = head16(q, bh, B1, B2);
                for (long i = 0; i < Tq; i++) memcpy(do16 + i * Dv, d16 + i * dout->st, (size_t)Dv * 2);
                qp = (uint32_t *)(wd + Tq * dov + Tq * Dv / 2), dop = qp + Tq2 * D, kp = dop + Tq2 * Dv;
                tl_attn_pack_pairs(qp, D, q16, q->st, Tq, D);
                tl_attn_pack_pairs(dop, Dv, do16, Dv, Tq, Dv);
                qb = (const float *)q16, kb = (const float *)head16(k, bh, B1, B2);
                vb = (const float *)head16(v, bh, B1, B2), dop16 = (const float *)do16;
                qs /= 2, ks /= 2, vs /= 2;
            } else
#endif
            {
                widen_rows(fmt, wq, D, head16(q, bh, B1, B2), qs, Tq, D);
                widen_rows(fmt, wk, D, head16(k, bh, B1, B2), ks, Tk, D);
                widen_rows(fmt, wv, Dv, head16(v, bh, B1, B2), vs, Tk, Dv);
                qb = wq, kb = wk, vb = wv;
                qs = ks = D, vs = Dv;
            }
        }
        float *dk = dq + Tq * D, *dv = dk + Tk * D;
        float *p = tl_scratch(0, 4 * BR * BC), *ds = p + BR * BC;
        uint16_t *p16 = (uint16_t *)(ds + BR * BC), *ds16 = p16 + BR * BC;  // pairs: P and dS rounded, and packed
        uint32_t *pp = (uint32_t *)(ds16 + BR * BC), *dsp = pp + BR / 2 * BC;
        float *kt = tl_scratch(1, (D + Dv) * BC), *vt = kt + D * BC;
        float *delta = tl_scratch(2, Tq);
        for (long i = 0; i < Tq; i++)
            delta[i] = tl_attn_dot(path, dob + i * dos, ob + i * os, Dv) - (dl ? dob[i * dos + Dv] : 0.0f);
        // No zeroing first: the first product into each row of dq, dk and dv writes it (accumulate 0), as the
        // first key tile (k0 = 0) reaches every query row and a key tile's first query tile every key row.
        for (long k0 = 0; k0 < Tk; k0 += BC) {
            const long bc = tl_min(BC, Tk - k0), i_first = causal ? k0 / BR * BR : 0;
            if (i_first >= Tq) {  // keys after every query (causal, Tk > Tq): no query sees them
                memset(dk + k0 * D, 0, (size_t)(bc * D) * sizeof(float));
                memset(dv + k0 * Dv, 0, (size_t)(bc * Dv) * sizeof(float));
                continue;
            }
            tl_attn_transpose(path, kt, BC, kb + k0 * ks, ks, bc, Dk);  // (pairs: whole pairs, moved as 32-bit words)
            tl_attn_transpose(path, vt, BC, vb + k0 * vs, vs, bc, Dvk);
#if defined(__x86_64__)
            if (pairs) tl_attn_pack_pairs(kp, D, head16(k, bh, B1, B2) + k0 * k->st, k->st, bc, D);
#endif
            for (long i0 = i_first; i0 < Tq; i0 += BR) {
                const long br = tl_min(BR, Tq - i0), off = i0 - k0;
                const float *qt = qb + i0 * qs, *dot = pairs ? dop16 + i0 * Dvk : dob + i0 * dos;
                mm_causal(mm, causal, CUT_N, off, br, bc, Dk, qt, qs, 1, kt, BC, p, BC, 0);                // S
                mm_causal(mm, causal, CUT_N, off, br, bc, Dvk, dot, pairs ? Dvk : dos, 1, vt, BC, ds, BC, 0);  // dP
                for (long r = 0; r < br; r++)  // P and dS; past what the row sees (maybe never computed), zeros
                    tl_attn_softmax_grad_row(path, p + r * BC, ds + r * BC, visible(i0 + r, k0, bc, causal), bc, scale,
                                     ob[(i0 + r) * os + Dv], delta[i0 + r]);
                const int more_q = i0 > i_first, more_k = k0 > 0;  // accumulate into what is written already
#if defined(__x86_64__)
                if (pairs) {
                    const long br2 = (br + 1) / 2;
                    tl_attn_round_pairs(p16, BC, p, BC, br, bc, BC);
                    tl_attn_round_pairs(ds16, BC, ds, BC, br, bc, BC);
                    tl_attn_pack_pairs(pp, BC, p16, BC, br, bc);
                    tl_attn_pack_pairs(dsp, BC, ds16, BC, br, bc);
                    mm_causal(mm, causal, SKIP_K, off, bc, Dv, br2, (const float *)pp, 1, BC,
                              (const float *)(dop + i0 / 2 * Dv), Dv, dv + k0 * Dv, Dv, more_q);  // dV += P^T dO
                    mm_causal(mm, causal, CUT_K, off, br, D, (bc + 1) / 2, (const float *)ds16, BC / 2, 1,
                              (const float *)kp, D, dq + i0 * D, D, more_k);  // dQ += dS K
                    mm_causal(mm, causal, SKIP_K, off, bc, D, br2, (const float *)dsp, 1, BC,
                              (const float *)(qp + i0 / 2 * D), D, dk + k0 * D, D, more_q);  // dK += dS^T Q
                    continue;
                }
#endif
                // dV += P^T dO, dQ += dS K, dK += dS^T Q
                mm_causal(path, causal, SKIP_K, off, bc, Dv, br, p, 1, BC, dot, dos, dv + k0 * Dv, Dv, more_q);
                mm_causal(path, causal, CUT_K, off, br, D, bc, ds, BC, 1, kb + k0 * ks, ks, dq + i0 * D, D, more_k);
                mm_causal(path, causal, SKIP_K, off, bc, D, br, ds, 1, BC, qt, qs, dk + k0 * D, D, more_q);
            }
        }
        if (fmt != TL_F32) tl_round_half(fmt, 1, per_head, dq, (uint16_t *)dqkv + bh * per_head, per_head, 1);
    }
}

void attention_backward(float *dqkv, const tl_attn_view *q, const tl_attn_view *k, const tl_attn_view *v,
                        const tl_attn_view *out, const tl_attn_view *dout,
                        long B0, long B1, long B2, long Tq, long Tk, long D, long Dv, float scale, int causal,
                        int dl) {
    backward(TL_F32, dqkv, q, k, v, out, dout, B0, B1, B2, Tq, Tk, D, Dv, scale, causal, dl);
}

void attention_backward_half(int fmt, uint16_t *dqkv, const tl_attn_view *q, const tl_attn_view *k,
                             const tl_attn_view *v, const tl_attn_view *out, const tl_attn_view *dout, long B0,
                             long B1, long B2, long Tq, long Tk, long D, long Dv, float scale, int causal, int dl) {
    backward(fmt, dqkv, q, k, v, out, dout, B0, B1, B2, Tq, Tk, D, Dv, scale, causal, dl);
}
