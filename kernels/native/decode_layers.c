/* Every decoder layer of one decode step, and the final norm, in one call (CPU, float32).
 *
 * A decode step of a few rows runs nine kernels a layer (two residual adds with their RMSNorm,
 * four small GEMMs, RoPE with the K/V store, the attention, SiLU-and-mul). Called one by one from
 * Python, each is a ctypes call with its checks and output allocation, and the GIL is taken back
 * between them: ~300 round trips a step for a 30-layer model. This file runs the same kernels, in
 * the same order, on the same arguments, from C: the same bits as the layer-by-layer path.
 *
 * It calls no kernel of its own. Each kernel stays in its own library (small_gemm.c,
 * rms_norm.c, rope_kv.c, decode_attention.c, silu_mul.c) and is handed here as a function
 * pointer (`decode_kernels`, typed by layer_kernels.h, which each kernel's file includes too), as
 * work_pool.c's entry point is handed to the kernels that use it. The caller
 * (kernels/cpu_decode_layers.py) checks every tensor once per step. */
#include <stddef.h>
#include <stdint.h>

#include "layer_kernels.h"

typedef struct { /* the kernels' entry points, from their own libraries (types: layer_kernels.h) */
    __typeof__(weir_small_gemm) *gemm;
    __typeof__(weir_add_rms_norm) *add_rms_norm;
    __typeof__(weir_rope_kv_write) *rope_kv;
    __typeof__(weir_decode_attention) *attention;
    __typeof__(weir_silu_mul) *silu_mul;
} decode_kernels;

typedef struct { /* one decoder layer as the kernels read it; the GEMM weights in panels */
    const float *input_norm, *qkv, *qkv_bias, *o, *o_bias, *post_norm, *gate_up, *gate_up_bias, *down,
        *down_bias;
    float *kv_cache; /* [2, num_blocks, block_size, kv_heads, head_dim] */
} decode_layer;

typedef struct { /* the model's sizes */
    int64_t num_layers, hidden, num_heads, kv_heads, head_dim, intermediate, num_blocks, block_size;
    float eps, final_eps, scale;
    const float *final_norm; /* [hidden] */
} decode_shape;

typedef struct { /* one step */
    int64_t rows, max_blocks;
    const float *cos, *sin;       /* [rows, head_dim / 2] each */
    const int64_t *slots;         /* [rows]: each row's K/V slot */
    const int32_t *block_tables;  /* [rows, max_blocks] */
    const int32_t *seq_lens;      /* [rows] */
    float *residual;              /* [rows, hidden]: the embeddings in; the residual stream, in place */
    float *scratch;               /* weir_decode_layers_scratch(shape, rows) floats */
    float *out;                   /* [rows, hidden]: the final RMSNorm of the residual stream */
    int threads, pool;            /* the GEMMs' and the attention's (kernels/cpu_work_pool.py) */
} decode_step;

static int64_t qkv_width(const decode_shape *s) { return (s->num_heads + 2 * s->kv_heads) * s->head_dim; }

/* Floats of scratch a step of `rows` rows needs. */
int64_t weir_decode_layers_scratch(const decode_shape *s, int64_t rows) {
    const int64_t q = s->num_heads * s->head_dim;
    return rows * (2 * s->hidden + qkv_width(s) + 2 * q + 3 * s->intermediate);
}

/* Returns 0, or the failing kernel's status (nonzero) at the first kernel that refuses. */
int weir_decode_layers(const decode_kernels *k, const decode_shape *s, const decode_layer *layers,
                       const decode_step *st) {
    const int64_t rows = st->rows, hidden = s->hidden, q_size = s->num_heads * s->head_dim;
    const int64_t qkv_size = qkv_width(s), inter = s->intermediate;
    float *normed = st->scratch;                 /* [rows, hidden] */
    float *proj = normed + rows * hidden;        /* [rows, hidden]: o_proj's, then down's output */
    float *qkv = proj + rows * hidden;           /* [rows, qkv_size] */
    float *q = qkv + rows * qkv_size;            /* [rows, num_heads, head_dim] */
    float *attn = q + rows * q_size;             /* [rows, num_heads, head_dim] */
    float *gate_up = attn + rows * q_size;       /* [rows, 2 intermediate] */
    float *act = gate_up + rows * 2 * inter;     /* [rows, intermediate] */
    const int64_t num_slots = s->num_blocks * s->block_size;
    int status;
#define RUN(call)                                                                                      \
    do {                                                                                               \
        if ((status = (call)) != 0) return status;                                                     \
    } while (0)
    for (int64_t i = 0; i < s->num_layers; i++) {
        const decode_layer *l = layers + i;
        /* The first layer norms the embeddings, which become the residual stream; the others add
         * the previous layer's MLP output into it first. */
        if (i == 0)
            RUN(k->add_rms_norm(st->residual, NULL, l->input_norm, normed, rows, hidden, s->eps));
        else
            RUN(k->add_rms_norm(proj, st->residual, l->input_norm, normed, rows, hidden, s->eps));
        RUN(k->gemm(normed, l->qkv, l->qkv_bias, qkv, rows, hidden, qkv_size, st->threads, st->pool));
        RUN(k->rope_kv(qkv, qkv_size, st->cos, st->sin, st->slots, q, l->kv_cache, rows, s->num_heads,
                       s->kv_heads, s->head_dim, num_slots));
        RUN(k->attention(q, l->kv_cache, st->block_tables, st->seq_lens, attn, rows, s->num_heads,
                         s->kv_heads, s->head_dim, s->num_blocks, s->block_size, st->max_blocks, s->scale,
                         st->threads, st->pool));
        RUN(k->gemm(attn, l->o, l->o_bias, proj, rows, q_size, hidden, st->threads, st->pool));
        RUN(k->add_rms_norm(proj, st->residual, l->post_norm, normed, rows, hidden, s->eps));
        RUN(k->gemm(normed, l->gate_up, l->gate_up_bias, gate_up, rows, hidden, 2 * inter, st->threads,
                    st->pool));
        RUN(k->silu_mul(gate_up, act, rows, inter, 2 * inter));
        RUN(k->gemm(act, l->down, l->down_bias, proj, rows, inter, hidden, st->threads, st->pool));
    }
    RUN(k->add_rms_norm(proj, st->residual, s->final_norm, st->out, rows, hidden, s->final_eps));
#undef RUN
    return 0;
}
