/*
FlashAttention-2 forward and backward for tinyllm's FLASH_ATTN / FLASH_ATTN_BWD nodes, in llm.c's
attention_forward / attention_backward manner: explicit sizes, float32.

    q [B0, B1, B2, Tq, D], k [B0, B1, B2, Tk, D], v [B0, B1, B2, Tk, Dv]   (B0, B1, B2: batch, heads, groups)
    out [B0, B1, B2, Tq, Dv + 1]: O = softmax(q k^T * scale [causal]) v in out[..., :Dv], the row log-sum-exp L in
        out[..., Dv]
    dout: the gradient of out: [dO | dL], out's shape, when dl != 0; dO alone, [..., Tq, Dv], when dl == 0 (dL = 0,
        as it is whenever L is not used past the attention)
    dqkv [B0 * B1 * B2, Tq*D + Tk*D + Tk*Dv]: dq, dk, dv of each (b0, b1, b2) one after another

The inputs are read in place through strides (tl_attn_view), so the heads that a model splits out of one
projection need no copy: only the last axis must be contiguous. A batch stride may be 0: grouped-query
attention reads each key/value head once for the B2 query heads of its group. The outputs are contiguous
row-major.

causal != 0 keeps key j for query i when j <= i (torch's top-left convention when Tq != Tk). Keys are walked
in tiles with an online softmax; the T x T scores are never stored, only a tile per thread (see attention.c).

This header is also the cffi cdef (see runtime_c/build.py): plain declarations only.
*/
#ifndef TINYLLM_ATTENTION_H
#define TINYLLM_ATTENTION_H

#include <stdint.h>

// An input read in place: element (b0, b1, b2, t, d) at p[b0*s0 + b1*s1 + b2*s2 + t*st + d], p's elements
// float32, or 16-bit floats for the _half functions.
typedef struct {
    const void *p;
    long s0, s1, s2, st;
} tl_attn_view;

void attention_forward(float *out, const tl_attn_view *q, const tl_attn_view *k, const tl_attn_view *v,
                       long B0, long B1, long B2, long Tq, long Tk, long D, long Dv, float scale, int causal);

void attention_backward(float *dqkv, const tl_attn_view *q, const tl_attn_view *k, const tl_attn_view *v,
                        const tl_attn_view *out, const tl_attn_view *dout,
                        long B0, long B1, long B2, long Tq, long Tk, long D, long Dv, float scale, int causal,
                        int dl);

// The same on 16-bit floats of format fmt (formats.h: 1 float16, 2 bfloat16), inputs and outputs: each tile's
// inputs widened to float32 as the tile is read, the same float32 arithmetic, and each output rounded once to
// nearest even where it is stored. The bits of widening the inputs, attention_forward / _backward, and rounding.
void attention_forward_half(int fmt, uint16_t *out, const tl_attn_view *q, const tl_attn_view *k,
                            const tl_attn_view *v, long B0, long B1, long B2, long Tq, long Tk, long D, long Dv,
                            float scale, int causal);

void attention_backward_half(int fmt, uint16_t *dqkv, const tl_attn_view *q, const tl_attn_view *k,
                             const tl_attn_view *v, const tl_attn_view *out, const tl_attn_view *dout, long B0,
                             long B1, long B2, long Tq, long Tk, long D, long Dv, float scale, int causal, int dl);

#endif  // TINYLLM_ATTENTION_H
