/* The entry point of work_pool.c as the kernels that use it see it: they are handed
 * `weir_pool_run` when they load (each exports a `weir_<kernel>_set_pool`), since it lives in
 * another shared object (one pool for the process). */
#ifndef WEIR_WORK_POOL_H
#define WEIR_WORK_POOL_H

#include <stdint.h>

/* One chunk of a call's work: chunk in [0, chunks). */
typedef void (*pool_task)(const void *ctx, int64_t chunk);

/* Runs task(ctx, c) for every c in [0, chunks) on the caller and up to threads - 1 helpers. */
typedef int (*pool_run_fn)(pool_task task, const void *ctx, int64_t chunks, int threads);

#endif
