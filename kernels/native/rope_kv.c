/* RoPE on q and k, and the step's K/V written into the paged cache, in one pass over the fused
 * qkv projection's output (the CPU path; see kernels/cpu_rope_kv.py).
 *
 * Row t of qkv holds num_heads query heads, then kv_heads key heads, then kv_heads value heads,
 * head_dim floats each. Each query head is rotated into q_out; each key head is rotated straight
 * into its cache slot (slots[t]) and each value head copied there. The rotation is the
 * half-split one Hugging Face's Llama uses, on the two halves (x1, x2) of a head:
 *     x1 * cos - x2 * sin,  x2 * cos + x1 * sin
 * with cos and sin of the token's position ([tokens, head_dim / 2]). Products and sums are
 * rounded one by one (no fused multiply-add: fp-contract is off for this file), the same
 * operations in the same order as the torch form, so the same bits.
 */
#pragma GCC optimize("fp-contract=off")
#include <stdint.h>
#include <string.h>

#include "layer_kernels.h"

static inline void rotate(const float *x, float *out, const float *cos, const float *sin, int64_t half) {
    const float *x1 = x, *x2 = x + half;
    for (int64_t i = 0; i < half; i++) {
        const float a = x1[i] * cos[i], b = x2[i] * sin[i];
        out[i] = a - b;
    }
    for (int64_t i = 0; i < half; i++) {
        const float a = x2[i] * cos[i], b = x1[i] * sin[i];
        out[half + i] = a + b;
    }
}

/* Returns 0; -1 (nothing written) for an odd head_dim or a slot outside [0, num_slots). */
int weir_rope_kv_write(const float *qkv,     /* [tokens, qkv_stride] */
                       int64_t qkv_stride,   /* >= (num_heads + 2 kv_heads) head_dim */
                       const float *cos,     /* [tokens, head_dim / 2] */
                       const float *sin,     /* [tokens, head_dim / 2] */
                       const int64_t *slots, /* [tokens] */
                       float *q_out,         /* [tokens, num_heads, head_dim] */
                       float *kv_cache,      /* [2, num_slots, kv_heads, head_dim] */
                       int64_t tokens, int64_t num_heads, int64_t kv_heads, int64_t head_dim,
                       int64_t num_slots) {
    if (tokens < 0 || num_heads < 1 || kv_heads < 1 || head_dim < 2 || head_dim % 2) return -1;
    if (qkv_stride < (num_heads + 2 * kv_heads) * head_dim) return -1;
    for (int64_t t = 0; t < tokens; t++)
        if (slots[t] < 0 || slots[t] >= num_slots) return -1;
    const int64_t half = head_dim / 2, kv_row = kv_heads * head_dim;
    float *k_plane = kv_cache, *v_plane = kv_cache + num_slots * kv_row;
    for (int64_t t = 0; t < tokens; t++) {
        const float *row = qkv + t * qkv_stride, *c = cos + t * half, *s = sin + t * half;
        for (int64_t h = 0; h < num_heads; h++)
            rotate(row + h * head_dim, q_out + (t * num_heads + h) * head_dim, c, s, half);
        float *k_slot = k_plane + slots[t] * kv_row;
        for (int64_t g = 0; g < kv_heads; g++)
            rotate(row + (num_heads + g) * head_dim, k_slot + g * head_dim, c, s, half);
        memcpy(v_plane + slots[t] * kv_row, row + (num_heads + kv_heads) * head_dim,
               sizeof(float) * kv_row);
    }
    return 0;
}
