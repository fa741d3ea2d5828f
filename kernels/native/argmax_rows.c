/* The index of each float32 row's largest value (the CPU sampler's greedy rows; see
 * kernels/cpu_argmax.py).
 *
 * torch.argmax's rule: the first index of the largest value; a NaN counts as larger than any
 * number, so a row holding one answers its first NaN. Sixteen lanes keep their own largest value
 * and the first index it was seen at; the lanes are then merged (the smaller index on a tie), and
 * the row's tail is compared one by one. torch's CPU argmax walks a row one value at a time
 * (~47 us a row of SmolLM2's 49,152 logits); this takes a few.
 */
#include <stdint.h>

#define LANES 16
typedef float vec __attribute__((vector_size(LANES * 4), aligned(4), may_alias));
typedef int32_t ivec __attribute__((vector_size(LANES * 4)));

static int64_t first_nan(const float *x, int64_t cols) {
    for (int64_t i = 0; i < cols; i++)
        if (x[i] != x[i]) return i;
    return -1;
}

static int64_t argmax_row(const float *x, int64_t cols) {
    int64_t i = 0, best_index = 0;
    float best = x[0];
    if (cols >= LANES) {
        vec top = *(const vec *)x;
        ivec where, index, nan_seen = top != top;
        for (int l = 0; l < LANES; l++) where[l] = index[l] = l;
        for (i = LANES; i + LANES <= cols; i += LANES) {
            const vec v = *(const vec *)(x + i);
            index += LANES;
            const ivec above = v > top;
            top = (vec)(((ivec)v & above) | ((ivec)top & ~above));
            where = (index & above) | (where & ~above);
            nan_seen |= v != v;
        }
        for (int l = 0; l < LANES; l++)
            if (nan_seen[l]) return first_nan(x, cols);
        best = top[0];
        best_index = where[0];
        for (int l = 1; l < LANES; l++)
            if (top[l] > best || (top[l] == best && where[l] < best_index)) {
                best = top[l];
                best_index = where[l];
            }
    } else {
        i = 1;
        if (best != best) return 0;
    }
    for (; i < cols; i++) {
        if (x[i] != x[i]) return first_nan(x, cols);
        if (x[i] > best) {
            best = x[i];
            best_index = i;
        }
    }
    return best_index;
}

int weir_argmax_rows(const float *x,   /* [rows, row_stride], the first cols of each row read */
                     int64_t *out,     /* [rows] */
                     int64_t rows, int64_t cols, int64_t row_stride) {
    if (rows < 0 || cols < 1 || cols > INT32_MAX || row_stride < cols) return -1;
    for (int64_t r = 0; r < rows; r++) out[r] = argmax_row(x + r * row_stride, cols);
    return 0;
}
