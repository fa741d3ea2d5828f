/* One token per row drawn from softmax(logits / temperature) by inverting the cumulative
 * distribution with a given uniform number (the CPU sampler's sampled rows; see
 * kernels/cpu_sample.py).
 *
 * Row r: m = the largest logit, w_i = exp((x_i - m) / t) (0 for a masked -inf logit, a NaN, or
 * a logit below the row's `floor`: the smallest one top-k / top-p / min-p keep),
 * total = the sum of w; the token is the first index whose running sum of w exceeds u * total,
 * as `Sampler.draw` chooses it with torch's softmax, cumsum and searchsorted(right=True). Where no
 * running sum exceeds the target (u * total rounded up to the total), the token is the row's
 * first largest logit, as `Sampler.draw` falls back to the argmax; a row with no finite logit
 * gives 0 (torch's argmax of a NaN row). The sums run in blocks of BLOCK weights: the weights and
 * each block's sum are kept in `scratch` by the first pass, the second walks the block sums and
 * then, inside the block where the target falls, the weights one by one. A token's chance is its
 * softmax probability; the rounding of the sums differs from torch's, which moves a draw only when
 * u falls within a few ulp of a boundary between two tokens.
 */
#include <math.h>
#include <stdint.h>

#include "exp_poly.h"

/* The largest value of x, sixteen lanes at a time (NaN never counts): -inf when every value is
 * NaN or -inf. */
static float row_max(const float *x, int64_t n) {
    vec top = (vec){0} - INFINITY;
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES) {
        const vec v = *(const vec *)(x + i);
        top = blend(v > top, v, top); /* NaN compares false: never taken */
    }
    float m = -INFINITY;
    for (int l = 0; l < LANES; l++) m = top[l] > m ? top[l] : m;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* The first index holding m (a value of x), 0 when none does. */
static int64_t first_index(const float *x, int64_t n, float m) {
    for (int64_t i = 0; i < n; i++)
        if (x[i] == m) return i;
    return 0;
}

/* The sum of a vector's lanes, as a tree of halves. */
static inline float lane_sum(vec v) {
    const ivec hi8 = {8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15};
    const ivec hi4 = {4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7};
    const ivec hi2 = {2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3};
    const ivec hi1 = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    v += __builtin_shuffle(v, hi8);
    v += __builtin_shuffle(v, hi4);
    v += __builtin_shuffle(v, hi2);
    v += __builtin_shuffle(v, hi1);
    return v[0];
}

#define BLOCK (4 * LANES) /* weights summed as one block */

/* The weights of x[0..n) (n <= BLOCK) into w, and their sum: 0 below `floor` (a filter's
 * smallest kept logit; -inf: none), for -inf and for NaN. */
static inline float weigh_block(const float *x, int64_t n, float m, float inv_t, float floor, float *w) {
    if (n == BLOCK) {
        vec sum = (vec){0};
        for (int j = 0; j < BLOCK; j += LANES) {
            const vec v = *(const vec *)(x + j);
            vec e = exp_vec((v - m) * inv_t);
            e = blend((v > -INFINITY) & (v >= floor), e, (vec){0}); /* NaN compares false */
            *(vec *)(w + j) = e;
            sum += e;
        }
        return lane_sum(sum);
    }
    float sum = 0.f;
    for (int64_t i = 0; i < n; i++) {
        w[i] = x[i] > -INFINITY && x[i] >= floor ? exp_scalar((x[i] - m) * inv_t) : 0.f;
        sum += w[i];
    }
    return sum;
}

/* log(sum of exp(x)) over each row's values at or above its floor (kept by a top-k: the
 * normaliser top-p reads), -inf for a row with none; the sums as weir_sample_rows makes them. */
int weir_logsumexp_rows(const float *logits, /* [rows, in_stride] */
                        const float *floor,  /* [rows]: -inf for the whole row */
                        float *out,          /* [rows] */
                        float *scratch,      /* [BLOCK] */
                        int64_t rows, int64_t cols, int64_t in_stride) {
    if (rows < 0 || cols < 1 || in_stride < cols) return -1;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * in_stride;
        const float m = row_max(x, cols);
        if (!(m > -INFINITY) || !(m >= floor[r])) {
            out[r] = -INFINITY;
            continue;
        }
        float total = 0.f;
        for (int64_t start = 0; start < cols; start += BLOCK)
            total += weigh_block(x + start, cols - start < BLOCK ? cols - start : BLOCK, m, 1.f, floor[r], scratch);
        out[r] = m + logf(total);
    }
    return 0;
}

int weir_sample_rows(const float *logits,      /* [rows, in_stride] */
                     const float *temperature, /* [rows], > 0 */
                     const float *uniform,     /* [rows], in [0, 1) */
                     const float *floor,       /* [rows]: weight 0 below it; NULL: none */
                     int64_t *out,             /* [rows] */
                     float *scratch,           /* [cols + ceil(cols / BLOCK)] */
                     int64_t rows, int64_t cols, int64_t in_stride) {
    if (rows < 0 || cols < 1 || in_stride < cols) return -1;
    const int64_t blocks = (cols + BLOCK - 1) / BLOCK;
    float *weights = scratch, *block_sums = scratch + cols;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * in_stride;
        const float m = row_max(x, cols);
        if (!(m > -INFINITY) || !(temperature[r] > 0.f)) { /* no finite logit: 0; else the argmax */
            out[r] = m > -INFINITY ? first_index(x, cols, m) : 0;
            continue;
        }
        const float inv_t = 1.f / temperature[r];
        const float row_floor = floor ? floor[r] : -INFINITY;
        float total = 0.f;
        for (int64_t b = 0; b < blocks; b++) {
            const int64_t start = b * BLOCK, n = cols - start < BLOCK ? cols - start : BLOCK;
            block_sums[b] = weigh_block(x + start, n, m, inv_t, row_floor, weights + start);
            total += block_sums[b];
        }
        const float target = uniform[r] * total;
        float acc = 0.f;
        int64_t token = -1;
        for (int64_t b = 0; b < blocks; b++) {
            if (!(acc + block_sums[b] > target)) {
                acc += block_sums[b];
                continue;
            }
            const int64_t start = b * BLOCK, n = cols - start < BLOCK ? cols - start : BLOCK;
            for (int64_t i = start; i < start + n; i++) {
                if (!(weights[i] > 0.f)) continue;
                token = i; /* the block's last weighted token if rounding keeps acc at the target */
                acc += weights[i];
                if (acc > target) break;
            }
            break;
        }
        out[r] = token >= 0 ? token : first_index(x, cols, m); /* the target past every sum: the argmax */
    }
    return 0;
}
