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

#include "exp_poly.h"
#include "layer_kernels.h"

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
