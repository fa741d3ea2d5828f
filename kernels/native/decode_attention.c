/* Decode attention over the paged KV cache, read in place (the CPU path; see
 * kernels/cpu_decode_attention.py).
 *
 * One query per sequence. Each sequence's query heads attend over its `seq_lens[i]` cached
 * tokens, block by block through its block table. Query head h reads KV head h / group (grouped
 * query attention, as in Hugging Face). Within a block every KV head is visited before the next
 * block, so a block's K and V are read once, in order, while they are in cache (prefetched two
 * blocks ahead, into the next sequence's first blocks at the end of one); the softmax is
 * online (a running max and sum per head, the partial output rescaled once per block) and the
 * partial output accumulates in the output row itself. Accumulation in float32; nothing is
 * gathered or padded.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define WEIR_AVX2 1 /* the vector path needs both (an AVX2 CPU without FMA takes the plain one) */
#endif

#include "layer_kernels.h"
#include "work_pool.h"

#define MAX_HEADS 1024
#define MAX_BLOCK 128

typedef struct {
    float max; /* the largest score so far (-inf before the first block) */
    float sum; /* the sum of exp(score - max) so far */
} running_softmax;

/* exp(x) for x <= 0 (a score minus the running max): Cephes' expf polynomial, ~1 ulp. */
static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x; /* exp(-87) ~ 1.6e-38: the float range's floor */
    const float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float y = p * r * r + r + 1.0f;
    union {
        int32_t i;
        float f;
    } two_n = {.i = ((int32_t)n + 127) << 23};
    return y * two_n.f;
}

/* One query head over one block of n tokens (any head_dim): scores into s, then the running
 * softmax and the partial output acc ([head_dim]) brought up to date. */
static void head_block(const float *q, const float *kb, const float *vb, int64_t n,
                       int64_t token_stride, int64_t head_dim, float scale, float *acc,
                       running_softmax *st, float *s) {
    float block_max = -INFINITY;
    for (int64_t t = 0; t < n; t++) {
        const float *kt = kb + t * token_stride;
        float dot = 0.f;
        for (int64_t d = 0; d < head_dim; d++) dot += q[d] * kt[d];
        s[t] = dot * scale;
        block_max = s[t] > block_max ? s[t] : block_max;
    }
    const float new_max = block_max > st->max ? block_max : st->max;
    float sum = 0.f;
    for (int64_t t = 0; t < n; t++) {
        s[t] = exp_nonpositive(s[t] - new_max);
        sum += s[t];
    }
    const float correction = expf(st->max - new_max); /* 0 on the first block: max = -inf */
    for (int64_t d = 0; d < head_dim; d++) acc[d] *= correction;
    for (int64_t t = 0; t < n; t++) {
        const float *vt = vb + t * token_stride;
        for (int64_t d = 0; d < head_dim; d++) acc[d] += s[t] * vt[d];
    }
    st->sum = st->sum * correction + sum;
    st->max = new_max;
}

#ifdef WEIR_AVX2
#define AVX_MAX_DIM 128 /* head_dim / 8 accumulators stay in registers */

/* The eight lanes' sums of eight vectors, as one vector (lane u: the sum of a[u]). */
static inline __m256 sum8(const __m256 *a) {
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

/* exp_nonpositive on eight lanes. */
static inline __m256 exp8_nonpositive(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n =
        _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* head_block for head_dim a multiple of 8 up to AVX_MAX_DIM: eight tokens' scores per pass
 * without a horizontal sum per token, the exps eight at a time, the output in registers.
 * s must hold n rounded up to 8 floats, 32-byte aligned. */
static void head_block_avx2(const float *q, const float *kb, const float *vb, int64_t n,
                            int64_t token_stride, int64_t head_dim, float scale, float *acc,
                            running_softmax *st, float *s) {
    const int64_t chunks = head_dim / 8;
    const int64_t lanes = (n + 7) / 8 * 8;
    __m256 top = _mm256_set1_ps(-INFINITY);
    for (int64_t t0 = 0; t0 < lanes; t0 += 8) {
        __m256 a[8];
        const float *kt[8];
        for (int u = 0; u < 8; u++) {
            a[u] = _mm256_setzero_ps();
            /* past the block's end: its last token again; the lane is masked below */
            kt[u] = kb + (t0 + u < n ? t0 + u : n - 1) * token_stride;
        }
        for (int64_t c = 0; c < chunks; c++) {
            const __m256 qv = _mm256_loadu_ps(q + 8 * c);
            for (int u = 0; u < 8; u++) a[u] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kt[u] + 8 * c), a[u]);
        }
        const __m256 scores = _mm256_mul_ps(sum8(a), _mm256_set1_ps(scale));
        _mm256_store_ps(s + t0, scores);
        top = _mm256_max_ps(top, scores); /* a repeated last token does not change the max */
    }
    float tops[8] __attribute__((aligned(32)));
    _mm256_store_ps(tops, top);
    float block_max = tops[0];
    for (int u = 1; u < 8; u++) block_max = tops[u] > block_max ? tops[u] : block_max;
    const float new_max = block_max > st->max ? block_max : st->max;
    const __m256 shift = _mm256_set1_ps(new_max);
    for (int64_t t0 = 0; t0 < lanes; t0 += 8)
        _mm256_store_ps(s + t0, exp8_nonpositive(_mm256_sub_ps(_mm256_load_ps(s + t0), shift)));
    float sum = 0.f;
    for (int64_t t = 0; t < n; t++) sum += s[t];
    const float correction = expf(st->max - new_max); /* 0 on the first block: max = -inf */
    __m256 o[AVX_MAX_DIM / 8];
    const __m256 corr = _mm256_set1_ps(correction);
    for (int64_t c = 0; c < chunks; c++) o[c] = _mm256_mul_ps(_mm256_loadu_ps(acc + 8 * c), corr);
    for (int64_t t = 0; t < n; t++) {
        const __m256 p = _mm256_set1_ps(s[t]);
        const float *vt = vb + t * token_stride;
        for (int64_t c = 0; c < chunks; c++) o[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vt + 8 * c), o[c]);
    }
    for (int64_t c = 0; c < chunks; c++) _mm256_storeu_ps(acc + 8 * c, o[c]);
    st->sum = st->sum * correction + sum;
    st->max = new_max;
}
#endif

/* Blocks are prefetched PREFETCH_AHEAD blocks before they are read, a slice per query head
 * (measured on SmolLM2's shapes, 8 rows of 512 tokens over 30 layers: the whole next block at
 * once 25.5 ms, one block ahead in slices 16 ms, two ahead 12.4 ms, three 13.5 ms; the
 * prefetches of a whole block at once stalled the loads of the current one). They go to L2,
 * not L1 (locality 2, prefetcht1): two blocks of K and V ahead are 48 KiB at SmolLM2's shapes,
 * more than a 32 KiB L1, so prefetches into L1 evicted the block being read (2-core AMD EPYC,
 * the same 8 rows of 512 tokens: 22.4 ms into L1, 12.7 ms into L2; 6.5 and 4.2 ms at 150 tokens;
 * one or three blocks ahead, or locality 1, no better, and locality 0 as slow as L1). */
#define PREFETCH_AHEAD 2
#define PREFETCH_LOCALITY 2

/* Where a sequence's blocks are: the blocks to prefetch run on into the next sequence's. */
typedef struct {
    const int32_t *table;
    int64_t num_blocks; /* ceil(seq_len / block_size) */
    int64_t last_tokens; /* tokens in its last block */
} block_run;

/* Slice `part` of `parts` of the K and V lines of block `index` of `runs` (counting on into the
 * next run past the first one's end); nothing past the last run. Always inlined: GCC counts
 * prefetches as free of side effects, so a function that only prefetches is "const" to it and
 * its calls are deleted (measured: not one prefetch left in the library). */
static inline __attribute__((always_inline)) void prefetch_slice(
    const block_run *runs, int64_t num_runs, int64_t index, const float *k_cache,
    const float *v_cache, int64_t block_stride, int64_t token_stride, int64_t block_size,
    int64_t part, int64_t parts) {
    int64_t r = 0;
    while (r < num_runs && index >= runs[r].num_blocks) index -= runs[r++].num_blocks;
    if (r >= num_runs) return;
    const int64_t block = runs[r].table[index];
    const int64_t tokens = index == runs[r].num_blocks - 1 ? runs[r].last_tokens : block_size;
    const int64_t lines = (tokens * token_stride * (int64_t)sizeof(float) + 63) / 64;
    const int64_t per_part = (lines + parts - 1) / parts;
    const char *k = (const char *)(k_cache + block * block_stride);
    const char *v = (const char *)(v_cache + block * block_stride);
    for (int64_t line = part * per_part; line < (part + 1) * per_part && line < lines; line++) {
        __builtin_prefetch(k + 64 * line, 0, PREFETCH_LOCALITY);
        __builtin_prefetch(v + 64 * line, 0, PREFETCH_LOCALITY);
    }
}

/* One sequence (runs[0]; runs[1], if any, is the next one, prefetched into at the end): every
 * query head over every cached token; out ([num_heads, head_dim]) holds the partial outputs
 * until the final division by the softmax sums. */
static void attend_sequence(const float *q, const float *k_cache, const float *v_cache,
                            const block_run *runs, int64_t num_runs, int64_t seq_len,
                            int64_t num_heads, int64_t kv_heads, int64_t head_dim,
                            int64_t block_size, float scale, float *out) {
    const int32_t *table = runs[0].table;
    running_softmax st[MAX_HEADS];
    float s[MAX_BLOCK + 8] __attribute__((aligned(32)));
    const int64_t group = num_heads / kv_heads;
    const int64_t token_stride = kv_heads * head_dim;
    const int64_t block_stride = block_size * token_stride;
    for (int64_t h = 0; h < num_heads; h++) {
        st[h].max = -INFINITY;
        st[h].sum = 0.f;
    }
    memset(out, 0, sizeof(float) * num_heads * head_dim);
#ifdef WEIR_AVX2
    const int vectorized = head_dim % 8 == 0 && head_dim <= AVX_MAX_DIM;
#endif
    for (int64_t start = 0; start < seq_len; start += block_size) {
        const int64_t n = seq_len - start < block_size ? seq_len - start : block_size;
        const int64_t block = table[start / block_size];
        const float *kb = k_cache + block * block_stride;
        const float *vb = v_cache + block * block_stride;
        for (int64_t h = 0; h < num_heads; h++) {
            const int64_t g = h / group;
            prefetch_slice(runs, num_runs, start / block_size + PREFETCH_AHEAD, k_cache, v_cache,
                           block_stride, token_stride, block_size, h, num_heads);
#ifdef WEIR_AVX2
            if (vectorized) {
                head_block_avx2(q + h * head_dim, kb + g * head_dim, vb + g * head_dim, n, token_stride,
                                head_dim, scale, out + h * head_dim, &st[h], s);
                continue;
            }
#endif
            head_block(q + h * head_dim, kb + g * head_dim, vb + g * head_dim, n, token_stride, head_dim,
                       scale, out + h * head_dim, &st[h], s);
        }
    }
    for (int64_t h = 0; h < num_heads; h++) {
        const float inv = 1.f / st[h].sum;
        for (int64_t d = 0; d < head_dim; d++) out[h * head_dim + d] *= inv;
    }
}

static pool_run_fn pool_run; /* work_pool.c's weir_pool_run, or NULL */

/* Hands this library work_pool.c's `weir_pool_run` (one pool for every kernel of the process). */
int weir_decode_attention_set_pool(void *run) {
    pool_run = (pool_run_fn)run;
    return 0;
}

typedef struct {
    const float *query, *k_cache, *v_cache;
    const int32_t *block_tables, *seq_lens;
    float *out;
    int64_t num_seqs, num_heads, kv_heads, head_dim, block_size, max_blocks, row, token_stride,
        block_stride;
    float scale;
} attention_job;

/* Sequence i of the call (with the next one's first blocks prefetched at its end). */
static void attend_one(const attention_job *j, int64_t i) {
    block_run runs[2];
    const int64_t num_runs = i + 1 < j->num_seqs ? 2 : 1;
    for (int64_t r = 0; r < num_runs; r++) {
        const int64_t len = j->seq_lens[i + r];
        runs[r].table = j->block_tables + (i + r) * j->max_blocks;
        runs[r].num_blocks = (len + j->block_size - 1) / j->block_size;
        runs[r].last_tokens = len - (runs[r].num_blocks - 1) * j->block_size;
    }
    if (i == 0) /* the first blocks of the call: no sequence before them prefetched them */
        for (int64_t b = 0; b < PREFETCH_AHEAD; b++)
            prefetch_slice(runs, num_runs, b, j->k_cache, j->v_cache, j->block_stride,
                           j->token_stride, j->block_size, 0, 1);
    attend_sequence(j->query + i * j->row, j->k_cache, j->v_cache, runs, num_runs, j->seq_lens[i],
                    j->num_heads, j->kv_heads, j->head_dim, j->block_size, j->scale,
                    j->out + i * j->row);
}

static void attend_chunk(const void *ctx, int64_t i) { attend_one(ctx, i); }

/* Returns 0, or -1 when a size is past this kernel's fixed limits (the caller checks them).
 * With num_threads > 1 the sequences go one at a time to the next thread free: on the helper
 * threads of work_pool.c when `pool` is set (and a pool was given), else on an OpenMP team. */
int weir_decode_attention(const float *query,          /* [num_seqs, num_heads, head_dim] */
                          const float *kv_cache,       /* [2, num_blocks, block_size, kv_heads, head_dim] */
                          const int32_t *block_tables, /* [num_seqs, max_blocks] */
                          const int32_t *seq_lens,     /* [num_seqs] */
                          float *out,                  /* [num_seqs, num_heads, head_dim] */
                          int64_t num_seqs, int64_t num_heads, int64_t kv_heads, int64_t head_dim,
                          int64_t num_blocks, int64_t block_size, int64_t max_blocks, float scale,
                          int num_threads, int pool) {
    if (num_heads > MAX_HEADS || block_size > MAX_BLOCK || kv_heads < 1 || num_heads % kv_heads) return -1;
    const int64_t token_stride = kv_heads * head_dim;
    const attention_job job = {
        .query = query,
        .k_cache = kv_cache,
        .v_cache = kv_cache + num_blocks * block_size * kv_heads * head_dim,
        .block_tables = block_tables,
        .seq_lens = seq_lens,
        .out = out,
        .num_seqs = num_seqs,
        .num_heads = num_heads,
        .kv_heads = kv_heads,
        .head_dim = head_dim,
        .block_size = block_size,
        .max_blocks = max_blocks,
        .row = num_heads * head_dim,
        .token_stride = token_stride,
        .block_stride = block_size * token_stride,
        .scale = scale,
    };
    if (pool && pool_run && num_threads > 1 && num_seqs > 1)
        return pool_run(attend_chunk, &job, num_seqs, num_threads);
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads) if (num_threads > 1 && num_seqs > 1)
    for (int64_t i = 0; i < num_seqs; i++) attend_one(&job, i);
    return 0;
}
