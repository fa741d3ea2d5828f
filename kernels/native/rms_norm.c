/* RMSNorm of float32 rows, optionally after adding them into the residual stream (the CPU path;
 * see kernels/cpu_rms_norm.py).
 *
 * Per row: with a residual, residual += x first (in place) and the residual is normalised;
 * without, x is. out = weight * (v * 1 / sqrt(mean(v^2) + eps)), as Hugging Face computes it in
 * float32 (the sum of squares in another order: rounding differences only). One call replaces the
 * add and the six ops of the torch form, each a dispatch of several microseconds on a decode row.
 */
#include <math.h>
#include <stdint.h>

#include "layer_kernels.h"

#define LANES 16
typedef float vec __attribute__((vector_size(LANES * 4), aligned(4), may_alias));

static float sum_of_squares(const float *v, int64_t dim) {
    vec acc0 = {0}, acc1 = {0};
    int64_t d = 0;
    for (; d + 2 * LANES <= dim; d += 2 * LANES) {
        const vec a = *(const vec *)(v + d), b = *(const vec *)(v + d + LANES);
        acc0 += a * a;
        acc1 += b * b;
    }
    for (; d + LANES <= dim; d += LANES) {
        const vec a = *(const vec *)(v + d);
        acc0 += a * a;
    }
    acc0 += acc1;
    float s = 0.f;
    for (int i = 0; i < LANES; i++) s += acc0[i];
    for (; d < dim; d++) s += v[d] * v[d];
    return s;
}

int weir_add_rms_norm(const float *x,      /* [rows, dim] */
                      float *residual,     /* [rows, dim], updated in place; or NULL */
                      const float *weight, /* [dim] */
                      float *out,          /* [rows, dim] */
                      int64_t rows, int64_t dim, float eps) {
    if (rows < 0 || dim < 1 || eps < 0.f) return -1;
    for (int64_t r = 0; r < rows; r++) {
        const float *src = x + r * dim;
        if (residual != 0) {
            float *res = residual + r * dim;
            for (int64_t d = 0; d < dim; d++) res[d] += src[d];
            src = res;
        }
        const float inv = 1.f / sqrtf(sum_of_squares(src, dim) / (float)dim + eps);
        float *o = out + r * dim;
        for (int64_t d = 0; d < dim; d++) o[d] = weight[d] * (src[d] * inv);
    }
    return 0;
}
