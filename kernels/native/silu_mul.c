/* silu(gate) * up over float32 rows of the SwiGLU MLP's fused gate_up output (the CPU path; see
 * kernels/cpu_silu_mul.py).
 *
 * Row r of the input holds [gate (width) | up (width)] at r * in_stride; row r of the output is
 * silu(gate) * up, contiguous. silu(x) = x / (1 + exp(-x)), as torch computes it, with exp from
 * Cephes' polynomial (~1 ulp against libm; torch's vectorised exp differs by as much): results
 * differ from `F.silu(gate) * up` by rounding only. One call replaces the split, the silu (which
 * on a strided half of the row takes torch's slow path) and the multiply.
 */
#include <stdint.h>

#define LANES 16
typedef float vec __attribute__((vector_size(LANES * 4), aligned(4), may_alias));
typedef int32_t ivec __attribute__((vector_size(LANES * 4)));

/* Lane-wise a where take is set (all ones), else b (C has no vector ?:). */
static inline vec blend(ivec take, vec a, vec b) { return (vec)(((ivec)a & take) | ((ivec)b & ~take)); }

/* exp on LANES lanes: x clamped to the float range's, then 2^n * p(r) with r = x - n ln 2. */
static inline vec exp_vec(vec x) {
    const vec lo = x * 0.f - 87.3f, hi = x * 0.f + 88.7f;
    x = blend(x < lo, lo, x);
    x = blend(x > hi, hi, x);
    /* n = round(x / ln 2): adding and subtracting 1.5 * 2^23 rounds to the nearest integer */
    const vec n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;
    vec r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    vec p = r * 0.f + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const vec y = p * r * r + r + 1.f;
    const ivec e = (__builtin_convertvector(n, ivec) + 127) << 23;
    return y * (vec)e;
}

static inline float exp_scalar(float x) {
    vec v = {0};
    v[0] = x;
    return exp_vec(v)[0];
}

int weir_silu_mul(const float *gate_up, /* [rows, in_stride]: gate in [0, width), up in [width, 2 width) */
                  float *out,           /* [rows, width] */
                  int64_t rows, int64_t width, int64_t in_stride) {
    if (rows < 0 || width < 1 || in_stride < 2 * width) return -1;
    for (int64_t r = 0; r < rows; r++) {
        const float *gate = gate_up + r * in_stride, *up = gate + width;
        float *o = out + r * width;
        int64_t i = 0;
        for (; i + LANES <= width; i += LANES) {
            const vec g = *(const vec *)(gate + i), u = *(const vec *)(up + i);
            *(vec *)(o + i) = g / (1.f + exp_vec(-g)) * u;
        }
        for (; i < width; i++) o[i] = gate[i] / (1.f + exp_scalar(-gate[i])) * up[i];
    }
    return 0;
}
