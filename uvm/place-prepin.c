/* uvm/place-prepin.c: pinning ahead of the loader (issue 41, load time;
 * docs/placement.md, "Names before bytes").
 *
 * Pinning host memory is most of what a load under the managed cap costs
 * beyond the engine's own: on the H200, 12.75 GiB pinned at 2.0 GiB/s made a
 * 12.7 s load take 17.1 s (bench/results/bigload-20261201-2200-moe128-h200).
 * Each pin ran on the engine's loading thread, inside its allocation.
 *
 * Once names are announced before their bytes (place-expect.c), the shim
 * knows which sizes it will serve as pinned host memory, before the engine
 * asks. A worker thread pins buffers of those sizes (whole 2 MiB pages, as
 * wo_pin_pages maps them) while the engine reads its checkpoint, and an
 * allocation matched to a host-planned name takes a ready buffer of its size
 * instead of pinning. When none is ready it waits for the one of its size
 * being pinned, or pins as before, and the worker drops one of that size
 * from its list. The worker runs at most AHEAD bytes ahead of what was taken.
 * Buffers no allocation took are given back at seal.
 *
 * The worker takes neither wo_uvm.lock nor any lock an engine thread holds
 * around a driver call: its own mutex guards the list, and it registers
 * inside the capture handshake (wo_driver_enter) with the pages faulted in
 * first, outside the driver (wo_pin_pages). WOFFLOAD_PREPIN=0 turns it off. */
#include "uvm/place-int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "core/log.h"
#include "core/settings.h"

#define AHEAD (4ull << 30) /* pinned and not yet taken, at most */
#define HUGE_PAGE (2ull << 20)

struct buf {
    uint64_t n; /* the size asked, rounded to whole 2 MiB: what it serves */
    void *host;
    size_t len;
    bool taken;
};

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t th;
    bool on, stop;
    const struct wo_driver *d;
    CUdevice dev;
    uint64_t *todo; /* sizes still to pin, [head, ntodo) */
    size_t head, ntodo;
    uint64_t inflight; /* the size being pinned now, 0 none */
    struct buf *v;
    size_t n, cap;
    uint64_t ready; /* bytes pinned and not taken */
    struct wo_prepin_figs f;
} pp = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static uint64_t now_ns(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void *worker(void *arg)
{
    CUcontext ctx = NULL;

    (void)arg;
    if (pp.d->cuDevicePrimaryCtxRetain && pp.d->cuCtxSetCurrent &&
        pp.d->cuDevicePrimaryCtxRetain(&ctx, pp.dev) == CUDA_SUCCESS)
        (void)pp.d->cuCtxSetCurrent(ctx);
    pthread_mutex_lock(&pp.mu);
    for (;;) {
        uint64_t n, t0;
        void *pages, *host = NULL;
        size_t np = 0, len = 0;
        CUresult r = CUDA_ERROR_NOT_PERMITTED;
        bool in;

        while (!pp.stop && (pp.head == pp.ntodo || pp.ready >= AHEAD))
            pthread_cond_wait(&pp.cv, &pp.mu);
        if (pp.stop)
            break;
        n = pp.todo[pp.head++];
        pp.inflight = n;
        pthread_mutex_unlock(&pp.mu);
        t0 = now_ns();
        pages = wo_pin_pages((size_t)n, &np);
        /* no driver call while a strict capture is under way */
        while (!(in = wo_driver_enter()) && !__atomic_load_n(&pp.stop, __ATOMIC_RELAXED)) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        if (in) {
            r = wo_pin_host(pp.d, (size_t)n, pages, np, &host, &len);
            wo_driver_leave();
        } else if (pages) {
            munmap(pages, np);
        }
        pthread_mutex_lock(&pp.mu);
        pp.inflight = 0;
        pp.f.ns += now_ns() - t0;
        if (r == CUDA_SUCCESS && pp.n == pp.cap) {
            size_t cap = pp.cap ? pp.cap * 2 : 64;
            struct buf *v = realloc(pp.v, cap * sizeof(*v));
            if (v) {
                pp.v = v;
                pp.cap = cap;
            }
        }
        if (r == CUDA_SUCCESS && pp.n < pp.cap) {
            pp.v[pp.n++] = (struct buf){.n = n, .host = host, .len = len};
            pp.ready += n;
            pp.f.made++;
            pp.f.made_bytes += n;
        } else {
            if (r == CUDA_SUCCESS) {
                pthread_mutex_unlock(&pp.mu);
                (void)wo_unpin_host(pp.d, host, len);
                pthread_mutex_lock(&pp.mu);
            }
            /* the memlock limit, most likely: the loader's own pins say so
             * with the limit's figures; nothing more is pinned ahead */
            pp.f.failed++;
            pp.head = pp.ntodo;
        }
        pthread_cond_broadcast(&pp.cv);
    }
    pthread_mutex_unlock(&pp.mu);
    return NULL;
}

void wo_place_prepin_plan(const struct wo_driver *d, const uint64_t *sizes, size_t n)
{
    uint64_t *todo;

    if (!wo_settings()->prepin || !n || wo_place_bind_enabled() || !wo_place_can_pin(d))
        return;
    todo = malloc(n * sizeof(*todo));
    if (!todo)
        return;
    for (size_t i = 0; i < n; i++)
        todo[i] = WO_ALIGN_UP(sizes[i], HUGE_PAGE);
    pthread_mutex_lock(&pp.mu);
    free(pp.todo);
    /* a new plan: what is pinned stays for it, the list is the plan's */
    pp.todo = todo;
    pp.head = 0;
    pp.ntodo = n;
    for (size_t k = 0; k < pp.n; k++) {
        /* a buffer ready or taken already stands for one of the plan's */
        for (size_t i = pp.head; i < pp.ntodo; i++)
            if (pp.todo[i] == pp.v[k].n) {
                pp.todo[i] = pp.todo[pp.head++];
                break;
            }
    }
    if (!pp.on && !pp.stop) {
        pp.d = d;
        pp.dev = (CUdevice)wo_uvm.device;
        pp.on = pthread_create(&pp.th, NULL, worker, NULL) == 0;
    }
    pthread_cond_broadcast(&pp.cv);
    pthread_mutex_unlock(&pp.mu);
}

bool wo_place_prepin_take(size_t size, void **host, size_t *len)
{
    uint64_t n = WO_ALIGN_UP((uint64_t)size, HUGE_PAGE);
    bool got = false;

    pthread_mutex_lock(&pp.mu);
    if (!pp.on) {
        pthread_mutex_unlock(&pp.mu);
        return false;
    }
    for (;;) {
        for (size_t k = 0; k < pp.n && !got; k++)
            if (!pp.v[k].taken && pp.v[k].n == n) {
                pp.v[k].taken = got = true;
                *host = pp.v[k].host;
                *len = pp.v[k].len;
                pp.ready -= n;
                pp.f.taken++;
                pp.f.taken_bytes += n;
            }
        /* the one of its size being pinned now: wait for it (one
         * registration at most) rather than pin a second */
        if (got || pp.inflight != n || pp.stop)
            break;
        pp.f.waits++;
        pthread_cond_wait(&pp.cv, &pp.mu);
    }
    if (!got)
        /* pinned by the caller: one of that size less to pin ahead */
        for (size_t i = pp.head; i < pp.ntodo; i++)
            if (pp.todo[i] == n) {
                pp.todo[i] = pp.todo[pp.head++];
                pp.f.missed++;
                break;
            }
    pthread_cond_broadcast(&pp.cv);
    pthread_mutex_unlock(&pp.mu);
    return got;
}

void wo_place_prepin_stop(void)
{
    pthread_mutex_lock(&pp.mu);
    if (!pp.on) {
        pthread_mutex_unlock(&pp.mu);
        return;
    }
    /* read unlocked by the worker while it waits out a capture */
    __atomic_store_n(&pp.stop, true, __ATOMIC_RELAXED);
    pthread_cond_broadcast(&pp.cv);
    pthread_mutex_unlock(&pp.mu);
    pthread_join(pp.th, NULL);
    /* what no allocation took goes back */
    for (size_t k = 0; k < pp.n; k++)
        if (!pp.v[k].taken) {
            (void)wo_unpin_host(pp.d, pp.v[k].host, pp.v[k].len);
            pp.f.wasted++;
            pp.f.wasted_bytes += pp.v[k].n;
        }
    free(pp.v);
    free(pp.todo);
    pp.v = NULL;
    pp.todo = NULL;
    pp.n = pp.cap = pp.head = pp.ntodo = 0;
    pp.ready = 0;
    pp.on = false;
}

void wo_place_prepin_figs(struct wo_prepin_figs *f)
{
    pthread_mutex_lock(&pp.mu);
    *f = pp.f;
    pthread_mutex_unlock(&pp.mu);
}

void wo_place_prepin_reset(void)
{
    wo_place_prepin_stop();
    pthread_mutex_lock(&pp.mu);
    memset(&pp.f, 0, sizeof(pp.f));
    __atomic_store_n(&pp.stop, false, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&pp.mu);
}
