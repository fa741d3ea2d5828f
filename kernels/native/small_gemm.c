/* y = x W^T (+ bias) for a few rows of x, streaming a plain row-major float32 weight once.
 *
 * A decode step multiplies 1-8 activation rows by every weight of the model: the product is
 * bound by reading the weight from memory, not by arithmetic. This kernel walks the weight
 * [out_features, in_features] from start to end exactly once per call, a few output rows at a
 * time, and multiplies it against every input row while it is in registers, so a few rows cost
 * one read of the weight, as one row does (until the multiply-adds, not the read, bound the time:
 * on one core at about 4-8 rows). x (at most 8 rows of in_features) stays in L1/L2.
 *
 * Vectors are GCC vector extensions (the compiler maps them to AVX-512, AVX2 or SSE/NEON for the
 * machine it compiles on with -march=native); loads are unaligned-safe (aligned(4) types).
 * Row and unroll counts are compile-time constants in each specialised loop (`ROWS`, `UNROLL`),
 * so the accumulators live in registers. With threads > 1 the output rows are split over an OpenMP
 * pool in contiguous ranges.
 *
 * Returns 0, or -1 on sizes outside its reach (rows not in 1..MAX_ROWS, a non-positive size).
 */
#include <stddef.h>
#include <stdint.h>

#define MAX_ROWS 8

#if defined(__AVX512F__)
#define VEC_BYTES 64
#define NUM_REGS 32
#else
#define VEC_BYTES 32
#define NUM_REGS 16
#endif
#define LANES (VEC_BYTES / 4)

typedef float vec __attribute__((vector_size(VEC_BYTES), aligned(4), may_alias));
typedef float half_vec __attribute__((vector_size(VEC_BYTES / 2)));
typedef float quad __attribute__((vector_size(16)));

/* A vector's lanes summed as a tree (a chain of scalar adds is slower than the dot product it ends). */
static inline float hsum(vec v) {
#if VEC_BYTES == 64
    half_vec h = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                 __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    quad q = __builtin_shufflevector(h, h, 0, 1, 2, 3) + __builtin_shufflevector(h, h, 4, 5, 6, 7);
#else
    quad q = __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
#endif
    return (q[0] + q[2]) + (q[1] + q[3]);
}

/* Output columns [o_begin, o_end) of y for ROWS input rows. One weight row streams at a time,
 * split into UNROLL independent accumulators per input row: the FMA latency, not the memory,
 * bounds a single accumulator chain. */
#define DEFINE_RANGE(ROWS, UNROLL)                                                               \
    static void range_##ROWS(const float *restrict x, const float *restrict w,                   \
                             const float *restrict bias, float *restrict y, int64_t in,          \
                             int64_t out, int64_t o_begin, int64_t o_end) {                      \
        const int64_t step = LANES * UNROLL;                                                     \
        const int64_t in_unrolled = in - in % step, in_vec = in - in % LANES;                    \
        for (int64_t o = o_begin; o < o_end; o++) {                                              \
            const float *wo = w + o * in;                                                        \
            vec acc[ROWS][UNROLL];                                                               \
            for (int r = 0; r < ROWS; r++)                                                       \
                for (int u = 0; u < UNROLL; u++) acc[r][u] = (vec){0};                           \
            for (int64_t i = 0; i < in_unrolled; i += step) {                                    \
                for (int u = 0; u < UNROLL; u++) {                                               \
                    const vec wv = *(const vec *)(wo + i + u * LANES);                           \
                    for (int r = 0; r < ROWS; r++)                                               \
                        acc[r][u] += *(const vec *)(x + r * in + i + u * LANES) * wv;            \
                }                                                                                \
            }                                                                                    \
            for (int64_t i = in_unrolled; i < in_vec; i += LANES) {                              \
                const vec wv = *(const vec *)(wo + i);                                           \
                for (int r = 0; r < ROWS; r++) acc[r][0] += *(const vec *)(x + r * in + i) * wv;  \
            }                                                                                    \
            for (int r = 0; r < ROWS; r++) {                                                     \
                vec a = acc[r][0];                                                               \
                for (int u = 1; u < UNROLL; u++) a += acc[r][u];                                 \
                float s = hsum(a);                                                               \
                for (int64_t i = in_vec; i < in; i++) s += x[r * in + i] * wo[i];                \
                y[r * out + o] = s + (bias ? bias[o] : 0.0f);                                    \
            }                                                                                    \
        }                                                                                        \
    }

/* ROWS x UNROLL accumulators within about half the vector registers (measured on SmolLM2's
 * shapes: 4-8 chains for one row stream at a plain sum's speed, docs/benchmarks.md). */
#if NUM_REGS >= 32
DEFINE_RANGE(1, 8)
DEFINE_RANGE(2, 4)
DEFINE_RANGE(3, 4)
DEFINE_RANGE(4, 4)
DEFINE_RANGE(5, 2)
DEFINE_RANGE(6, 2)
DEFINE_RANGE(7, 2)
DEFINE_RANGE(8, 2)
#else
DEFINE_RANGE(1, 4)
DEFINE_RANGE(2, 4)
DEFINE_RANGE(3, 2)
DEFINE_RANGE(4, 2)
DEFINE_RANGE(5, 1)
DEFINE_RANGE(6, 1)
DEFINE_RANGE(7, 1)
DEFINE_RANGE(8, 1)
#endif

typedef void (*range_fn)(const float *, const float *, const float *, float *, int64_t, int64_t,
                         int64_t, int64_t);

static const range_fn RANGES[MAX_ROWS + 1] = {0,       range_1, range_2, range_3, range_4,
                                              range_5, range_6, range_7, range_8};

int weir_small_gemm_max_rows(void) { return MAX_ROWS; }

int weir_small_gemm(const float *x,    /* [rows, in] */
                    const float *w,    /* [out, in], row-major */
                    const float *bias, /* [out] or NULL */
                    float *y,          /* [rows, out] */
                    int64_t rows, int64_t in, int64_t out, int threads) {
    if (rows < 1 || rows > MAX_ROWS || in < 1 || out < 1) return -1;
    const range_fn fn = RANGES[rows];
    if (threads <= 1 || out < 2 * threads) {
        fn(x, w, bias, y, in, out, 0, out);
        return 0;
    }
    /* One contiguous range of output columns per thread. */
#pragma omp parallel num_threads(threads)
    {
#ifdef _OPENMP
        extern int omp_get_thread_num(void);
        extern int omp_get_num_threads(void);
        const int64_t me = omp_get_thread_num(), n = omp_get_num_threads();
#else
        const int64_t me = 0, n = 1;
#endif
        const int64_t o0 = out * me / n, o1 = out * (me + 1) / n;
        if (o0 < o1) fn(x, w, bias, y, in, out, o0, o1);
    }
    return 0;
}
