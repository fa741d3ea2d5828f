/* y = x W^T (+ bias) for a few rows of x, streaming a float32 weight packed in column panels once.
 *
 * A decode step multiplies 1-16 activation rows by every weight of the model: the product is
 * bound by reading the weight from memory, not by arithmetic, as long as each weight value read
 * is used for every row while it is in a register. This kernel takes the weight [out_features,
 * in_features] packed once into panels of PANEL output columns (`weir_small_gemm_panel_width`):
 * panel p holds, for each input column k in turn, the PANEL weights W[p * PANEL + j][k]
 * (j = 0..PANEL-1) side by side, the last panel padded with zeros. It walks the panels from start
 * to end exactly once per call. For each k it loads PANEL weights (UNROLL vectors), broadcasts
 * x[r][k] of each row and multiply-adds them into ROWS x UNROLL accumulators that stay in
 * registers for the whole panel: one load per vector of weights plus one broadcast per row, and
 * no horizontal sums. (The plain row-major weight, walked one output row at a time, needs a load
 * of x per row for each weight vector and a horizontal sum per output and row: 2.1-3.8x the time
 * of a `sum` over the same bytes at 8 rows on SmolLM2's shapes, against 1.3-1.5x here;
 * docs/benchmarks.md, tenth stop.)
 *
 * Vectors are GCC vector extensions (the compiler maps them to AVX-512, AVX2 or SSE/NEON for the
 * machine it compiles on with -march=native); loads are unaligned-safe (aligned(4) types). With
 * AVX-512's 32 registers, 8 rows take 24 accumulators, 3 weight vectors and a broadcast; with 16
 * registers the compiler spills at high row counts (the row-weight probe measures each host).
 * 9-16 rows run as two groups (8, then the rest) over each panel in turn: the panel is read from
 * memory once and from cache by the second group (SmolLM2's panels are 110-295 KiB, within L2).
 * With threads > 1 the panels are split over an OpenMP pool in contiguous ranges.
 *
 * Returns 0, or -1 on sizes outside its reach (rows not in 1..MAX_ROWS, a non-positive size).
 */
#include <stddef.h>
#include <stdint.h>

#include "layer_kernels.h"
#include "work_pool.h"

#define GROUP_ROWS 8 /* rows of the register-blocked copies below */
#define MAX_ROWS 16  /* more than GROUP_ROWS: groups of them over each panel in turn */

#if defined(__AVX512F__)
#define VEC_BYTES 64
#else
#define VEC_BYTES 32
#endif
#define LANES (VEC_BYTES / 4)
#define UNROLL 3
#define PANEL (LANES * UNROLL)

typedef float vec __attribute__((vector_size(VEC_BYTES), aligned(4), may_alias));

/* Panels [p_begin, p_end) of y for ROWS input rows (ROWS a compile-time constant in each copy,
 * so the accumulators live in registers). */
#define DEFINE_PANELS(ROWS)                                                                      \
    static void panels_##ROWS(const float *restrict x, const float *restrict wp,                 \
                              const float *restrict bias, float *restrict y, int64_t in,         \
                              int64_t out, int64_t p_begin, int64_t p_end) {                     \
        for (int64_t p = p_begin; p < p_end; p++) {                                              \
            const float *wk = wp + p * in * PANEL;                                               \
            vec acc[ROWS][UNROLL];                                                               \
            for (int r = 0; r < ROWS; r++)                                                       \
                for (int u = 0; u < UNROLL; u++) acc[r][u] = (vec){0};                           \
            for (int64_t k = 0; k < in; k++, wk += PANEL) {                                      \
                vec w[UNROLL];                                                                   \
                for (int u = 0; u < UNROLL; u++) w[u] = *(const vec *)(wk + u * LANES);          \
                for (int r = 0; r < ROWS; r++) {                                                 \
                    const float xr = x[r * in + k];                                              \
                    for (int u = 0; u < UNROLL; u++) acc[r][u] += xr * w[u];                     \
                }                                                                                \
            }                                                                                    \
            for (int r = 0; r < ROWS; r++) {                                                     \
                float *yr = y + r * out;                                                         \
                for (int u = 0; u < UNROLL; u++) {                                               \
                    const int64_t o = p * PANEL + u * LANES;                                     \
                    if (o + LANES <= out) {                                                      \
                        vec v = acc[r][u];                                                       \
                        if (bias) v += *(const vec *)(bias + o);                                 \
                        *(vec *)(yr + o) = v;                                                    \
                    } else { /* the padded end of the last panel */                              \
                        for (int64_t l = 0; o + l < out; l++)                                    \
                            yr[o + l] = acc[r][u][l] + (bias ? bias[o + l] : 0.0f);              \
                    }                                                                            \
                }                                                                                \
            }                                                                                    \
        }                                                                                        \
    }

DEFINE_PANELS(1)
DEFINE_PANELS(2)
DEFINE_PANELS(3)
DEFINE_PANELS(4)
DEFINE_PANELS(5)
DEFINE_PANELS(6)
DEFINE_PANELS(7)
DEFINE_PANELS(8)

typedef void (*panels_fn)(const float *, const float *, const float *, float *, int64_t, int64_t,
                          int64_t, int64_t);

static const panels_fn PANELS[GROUP_ROWS + 1] = {0,        panels_1, panels_2, panels_3, panels_4,
                                                 panels_5, panels_6, panels_7, panels_8};

/* Panels [p_begin, p_end) of y for `rows` rows: up to GROUP_ROWS in one register-blocked pass;
 * more in groups of GROUP_ROWS over one panel at a time, so that each panel comes from memory
 * once and from cache for the later groups. Every row's sums run in the same order either way
 * (the same bits as the row alone). */
static void panels_rows(int64_t rows, const float *x, const float *wp, const float *bias, float *y,
                        int64_t in, int64_t out, int64_t p_begin, int64_t p_end) {
    if (rows <= GROUP_ROWS) {
        PANELS[rows](x, wp, bias, y, in, out, p_begin, p_end);
        return;
    }
    for (int64_t p = p_begin; p < p_end; p++)
        for (int64_t r = 0; r < rows; r += GROUP_ROWS) {
            const int64_t n = rows - r < GROUP_ROWS ? rows - r : GROUP_ROWS;
            PANELS[n](x + r * in, wp, bias, y + r * out, in, out, p, p + 1);
        }
}

int weir_small_gemm_max_rows(void) { return MAX_ROWS; }

int weir_small_gemm_panel_width(void) { return PANEL; }

static pool_run_fn pool_run; /* work_pool.c's weir_pool_run, or NULL */

/* Hands this library work_pool.c's `weir_pool_run` (another shared object: one pool for every
 * kernel of the process). */
int weir_small_gemm_set_pool(void *run) {
    pool_run = (pool_run_fn)run;
    return 0;
}

typedef struct {
    const float *x, *wp, *bias;
    float *y;
    int64_t rows, in, out, panels, chunk;
} gemm_job;

static void gemm_chunk(const void *ctx, int64_t c) {
    const gemm_job *j = ctx;
    const int64_t p0 = c * j->chunk, p1 = p0 + j->chunk < j->panels ? p0 + j->chunk : j->panels;
    panels_rows(j->rows, j->x, j->wp, j->bias, j->y, j->in, j->out, p0, p1);
}

int weir_small_gemm(const float *x,    /* [rows, in] */
                    const float *wp,   /* [ceil(out / PANEL), in, PANEL]: the packed weight */
                    const float *bias, /* [out] or NULL */
                    float *y,          /* [rows, out] */
                    int64_t rows, int64_t in, int64_t out, int threads, int pool) {
    if (rows < 1 || rows > MAX_ROWS || in < 1 || out < 1) return -1;
    const int64_t panels = (out + PANEL - 1) / PANEL;
    if (threads <= 1 || panels < 2 * threads) {
        panels_rows(rows, x, wp, bias, y, in, out, 0, panels);
        return 0;
    }
    if (pool && pool_run) {
        /* Chunks of one panel (tens of microseconds) while that makes at most 256 (an LM head: a
         * few panels a chunk): a thread that loses its core holds up a chunk's worth at most. */
        const int64_t chunk = (panels + 255) / 256;
        const gemm_job job = {x, wp, bias, y, rows, in, out, panels, chunk};
        return pool_run(gemm_chunk, &job, (panels + chunk - 1) / chunk, threads);
    }
    /* Chunks of panels handed out as threads come free (dynamic), not one fixed range per
     * thread: when the front end or another process takes a core from one of the threads for a
     * while, the others take over its share instead of waiting for it at the end. */
    const int64_t chunk = panels >= 32 * threads ? 4 : 1;
    const int64_t chunks = (panels + chunk - 1) / chunk;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t p0 = c * chunk, p1 = p0 + chunk < panels ? p0 + chunk : panels;
        panels_rows(rows, x, wp, bias, y, in, out, p0, p1);
    }
    return 0;
}
