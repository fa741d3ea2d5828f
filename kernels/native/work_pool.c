/* A pool of helper threads for the C kernels that never waits for a helper that has not started.
 *
 * `weir_pool_run(task, ctx, chunks, threads)` calls task(ctx, c) once for each chunk c in
 * [0, chunks), on the calling thread and on up to threads - 1 helper threads (started on first
 * use, kept for the process). Every thread, the caller included, takes the next chunk with one
 * compare-and-swap on `ticket`, which packs the call's generation, its chunk count and the next
 * chunk: a helper that wakes after the caller has taken every chunk finds nothing to take, and the
 * caller waits only for the chunks a helper took and has not finished.
 *
 * Why not OpenMP: a parallel region ends in a barrier that every thread of the team must reach.
 * When the event loop, a tokenizer worker or another process holds a core for a few milliseconds,
 * every region of the step waits for the thread that lost it (~150 regions a decode step), and an
 * OpenMP thread spins for milliseconds after each region, on the core the front end needs
 * (docs/benchmarks.md, thirteenth stop). Helpers here poll for a while, yielding the core between
 * polls, then sleep on a condition variable.
 *
 * One caller uses the helpers at a time; a second caller meanwhile (another engine's thread)
 * computes its chunks alone. A process forked while the helpers run keeps no helper: its calls
 * compute alone, as does a call of more than MAX_CHUNKS chunks. Returns 0.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>

#include "work_pool.h"

#define MAX_HELPERS 63
#define MAX_CHUNKS ((1u << 18) - 1)
#define SPIN_ROUNDS 2000 /* polls of 32 pauses each, a yield between, before a helper sleeps */

static pool_task job_task;      /* written by the caller before it publishes `ticket` */
static const void *job_ctx;
static _Atomic uint64_t ticket; /* generation << 36 | chunks << 18 | next chunk */
static _Atomic uint32_t num_done;
static _Atomic uint32_t posted; /* the generation last published (28 bits) */
static _Atomic int num_wanted;  /* helpers the current call asks for */
static _Atomic int num_sleeping;
static uint32_t generation;     /* under use_lock */
static int num_helpers;         /* started; under use_lock */
static pthread_mutex_t use_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t sleep_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sleep_cv = PTHREAD_COND_INITIALIZER;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* The next chunk of generation `gen` nobody took, or -1 when none is left (or another
 * generation is up). */
static int64_t take(uint32_t gen) {
    uint64_t v = atomic_load_explicit(&ticket, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(v >> 36) != gen) return -1;
        const uint64_t chunks = (v >> 18) & MAX_CHUNKS, next = v & MAX_CHUNKS;
        if (next >= chunks) return -1;
        if (atomic_compare_exchange_weak_explicit(&ticket, &v, v + 1, memory_order_acq_rel,
                                                  memory_order_acquire))
            return (int64_t)next;
    }
}

/* Takes and runs chunks of `gen` until none is left. The job is read only after a take: the
 * caller replaces it only once every chunk of its generation is done. */
static void work(uint32_t gen) {
    int64_t c;
    while ((c = take(gen)) >= 0) {
        job_task(job_ctx, c);
        atomic_fetch_add_explicit(&num_done, 1, memory_order_release);
    }
}

static void *helper_main(void *arg) {
    const int index = (int)(intptr_t)arg;
    uint32_t seen = atomic_load(&posted);
    for (;;) {
        uint32_t gen = atomic_load_explicit(&posted, memory_order_acquire);
        for (int round = 0; gen == seen && round < SPIN_ROUNDS; round++) {
            for (int i = 0; i < 32 && gen == seen; i++) {
                cpu_relax();
                gen = atomic_load_explicit(&posted, memory_order_acquire);
            }
            if (gen == seen) {
                sched_yield(); /* a thread waiting for this core gets it */
                gen = atomic_load_explicit(&posted, memory_order_acquire);
            }
        }
        if (gen == seen) {
            pthread_mutex_lock(&sleep_lock);
            atomic_fetch_add(&num_sleeping, 1);
            while ((gen = atomic_load(&posted)) == seen) pthread_cond_wait(&sleep_cv, &sleep_lock);
            atomic_fetch_sub(&num_sleeping, 1);
            pthread_mutex_unlock(&sleep_lock);
        }
        seen = gen;
        if (index < atomic_load(&num_wanted)) work(gen);
    }
    return NULL;
}

/* Starts helpers up to `wanted` (under use_lock); returns how many run. */
static int start_helpers(int wanted) {
    if (wanted > MAX_HELPERS) wanted = MAX_HELPERS;
    while (num_helpers < wanted) {
        pthread_t thread;
        pthread_attr_t attr;
        if (pthread_attr_init(&attr) != 0) break;
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const int failed = pthread_create(&thread, &attr, helper_main, (void *)(intptr_t)num_helpers);
        pthread_attr_destroy(&attr);
        if (failed) break;
        num_helpers++;
    }
    return num_helpers;
}

int weir_pool_run(pool_task task, const void *ctx, int64_t chunks, int threads) {
    if (chunks <= 0) return 0;
    if (threads <= 1 || chunks == 1 || chunks > (int64_t)MAX_CHUNKS ||
        pthread_mutex_trylock(&use_lock) != 0) {
        for (int64_t c = 0; c < chunks; c++) task(ctx, c);
        return 0;
    }
    if (start_helpers(threads - 1) == 0) {
        pthread_mutex_unlock(&use_lock);
        for (int64_t c = 0; c < chunks; c++) task(ctx, c);
        return 0;
    }
    job_task = task;
    job_ctx = ctx;
    generation = (generation + 1) & ((1u << 28) - 1);
    const uint32_t gen = generation;
    atomic_store_explicit(&num_done, 0, memory_order_relaxed);
    atomic_store(&num_wanted, threads - 1);
    atomic_store_explicit(&ticket, (uint64_t)gen << 36 | (uint64_t)chunks << 18, memory_order_release);
    atomic_store(&posted, gen);
    if (atomic_load(&num_sleeping) > 0) {
        pthread_mutex_lock(&sleep_lock);
        pthread_cond_broadcast(&sleep_cv);
        pthread_mutex_unlock(&sleep_lock);
    }
    work(gen);
    while (atomic_load_explicit(&num_done, memory_order_acquire) < (uint32_t)chunks) cpu_relax();
    pthread_mutex_unlock(&use_lock);
    return 0;
}

/* Helper threads started so far (for tests). */
int weir_pool_num_helpers(void) {
    pthread_mutex_lock(&use_lock);
    const int n = num_helpers;
    pthread_mutex_unlock(&use_lock);
    return n;
}
