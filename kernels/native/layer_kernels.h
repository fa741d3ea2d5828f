/* The entry points of the kernels a decoder layer's decode step runs, declared once: each kernel's
 * own file includes this (so the compiler checks its definition against it), and decode_layers.c,
 * which is handed them as function pointers from their own libraries, takes its pointer types
 * from here. The comments on the arguments are in each kernel's file. */
#ifndef WEIR_LAYER_KERNELS_H
#define WEIR_LAYER_KERNELS_H

#include <stdint.h>

int weir_small_gemm(const float *x, const float *wp, const float *bias, float *y, int64_t rows,
                    int64_t in, int64_t out, int threads, int pool);
int weir_add_rms_norm(const float *x, float *residual, const float *weight, float *out, int64_t rows,
                      int64_t dim, float eps);
int weir_rope_kv_write(const float *qkv, int64_t qkv_stride, const float *cos, const float *sin,
                       const int64_t *slots, float *q_out, float *kv_cache, int64_t tokens,
                       int64_t num_heads, int64_t kv_heads, int64_t head_dim, int64_t num_slots);
int weir_decode_attention(const float *query, const float *kv_cache, const int32_t *block_tables,
                          const int32_t *seq_lens, float *out, int64_t num_seqs, int64_t num_heads,
                          int64_t kv_heads, int64_t head_dim, int64_t num_blocks, int64_t block_size,
                          int64_t max_blocks, float scale, int num_threads, int pool);
int weir_silu_mul(const float *gate_up, float *out, int64_t rows, int64_t width, int64_t in_stride);

#endif
