/* exp over float lanes with GCC's vector extensions, for the C kernels that need it (silu_mul.c,
 * sample_rows.c): x clamped to the float range's, then 2^n * p(r) with r = x - n ln 2 and p
 * Cephes' expf polynomial (~1 ulp against libm; torch's vectorised exp differs by as much).
 * -march=native turns the lanes into AVX-512, AVX2 or SSE registers, whichever the CPU has.
 */
#ifndef WEIR_EXP_POLY_H
#define WEIR_EXP_POLY_H

#include <stdint.h>

#define LANES 16
typedef float vec __attribute__((vector_size(LANES * 4), aligned(4), may_alias));
typedef int32_t ivec __attribute__((vector_size(LANES * 4)));

/* Lane-wise a where take is set (all ones), else b (C has no vector ?:). */
static inline vec blend(ivec take, vec a, vec b) { return (vec)(((ivec)a & take) | ((ivec)b & ~take)); }

/* exp on LANES lanes. */
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

#endif
