/*
FlashAttention-2 forward and backward for tinyllm's FLASH_ATTN / FLASH_ATTN_BWD nodes, in llm.c's
attention_forward / attention_backward manner: explicit sizes, contiguous row-major float32 arrays.

    q [BH, Tq, D], k [BH, Tk, D], v [BH, Tk, Dv]           (BH: batch and heads flattened)
    out [BH, Tq, Dv + 1]: O = softmax(q k^T * scale [causal]) v in out[..., :Dv], the row log-sum-exp L in out[..., Dv]
    dout: the gradient of out, same shape (its last column, dL, is usually zero)
    dqkv [BH, Tq*D + Tk*D + Tk*Dv]: dq, dk, dv of each (b, h) one after another

causal != 0 keeps key j for query i when j <= i (torch's top-left convention when Tq != Tk). Keys are walked
in tiles with an online softmax; the T x T scores are never stored, only a tile per thread (see attention.c).

This header is also the cffi cdef (see runtime_c/build.py): plain declarations only.
*/
#ifndef TINYLLM_ATTENTION_H
#define TINYLLM_ATTENTION_H

void attention_forward(float *out, const float *q, const float *k, const float *v,
                       long BH, long Tq, long Tk, long D, long Dv, float scale, int causal);

void attention_backward(float *dqkv, const float *q, const float *k, const float *v,
                        const float *out, const float *dout,
                        long BH, long Tq, long Tk, long D, long Dv, float scale, int causal);

#endif  // TINYLLM_ATTENTION_H
