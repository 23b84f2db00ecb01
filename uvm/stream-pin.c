/* uvm/stream-pin.c: pinned copies of managed ranges for the streaming
 * executor (see stream-pin.h; docs/prefetch.md, "Pinned copies").
 *
 * One worker thread, started with the executor's first request, does the
 * slow parts: an anonymous mapping advised to huge pages (as uvm/place-pin.c
 * pins), the range's bytes copied into it by the CPU in pieces under
 * wo_uvm.lock (the engine may free the range meanwhile: each piece checks
 * that it is still live: wo_uvm_copy_live), then cuMemHostRegister. The executor asks for a
 * copy on its thread and finds it ready on a later stage(); until then it
 * stages from the managed range by its copy kernel. A retired copy waits
 * for an event the executor records on its copy stream (the copies issued
 * from it) before the worker unregisters and unmaps it. */
#include "uvm/stream-pin.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "core/log.h"
#include "core/meminfo.h"
#include "core/macro.h"
#include "core/registry.h"
#include "uvm/internal.h"
#include "uvm/hotpath.h"


enum pin_state { P_NONE, P_QUEUED, P_BUSY, P_READY, P_FAILED, P_DROP };

struct pin_ent {
    uint32_t gen, rid; /* rid: the registry id of the range's allocation */
    enum pin_state state;
    uint64_t src, bytes;
    void *host;
    size_t len;
    CUdeviceptr dptr;
};

/* a pinned copy on its way out: freed once `done` (recorded after every
 * copy issued from it) has completed */
struct retired {
    void *host;
    size_t len;
    CUevent done;
    struct retired *next;
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t cv;
    pthread_t thread;
    bool running, stop;
    bool closed; /* wo_pin_close: no copy handed out or made any more */
    const struct wo_driver *drv;
    CUcontext ctx;
    uint64_t limit;                /* WO_PIN_COPIES_AUTO or bytes */
    struct pin_ent *e;             /* by span id, WO_STREAM_ENTRIES (hotpath.h) */
    uint32_t *queue, qhead, qtail; /* ids asked for, a ring of WO_STREAM_ENTRIES */
    struct retired *to_free;       /* events recorded: the worker frees them */
    struct retired *pending;       /* no event yet (the driver was busy): next retire */
    bool said_fail, said_budget;
    struct wo_pin_counts n;
} pin = {.lock = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* May a copy of bytes more be made? Under the lock. */
static bool within_budget(uint64_t bytes)
{
    if (pin.limit != WO_PIN_COPIES_AUTO)
        return pin.n.bytes + bytes <= pin.limit;
    return wo_pin_auto_room(wo_meminfo_bytes("MemAvailable"), wo_meminfo_bytes("MemTotal")) >=
           bytes;
}


/* wo_driver_enter(), waiting (1 ms at a time) while a capture
 * forbids driver calls; false when the process exits meanwhile. */
static bool enter_wait(void)
{
    while (!wo_driver_enter()) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        if (__atomic_load_n(&pin.stop, __ATOMIC_RELAXED))
            return false;
    }
    return true;
}

/* Pinned, device-mapped memory for bytes in the executor's context (as
 * uvm/place-pin.c pins: wo_pin_host): the pages mapped and faulted in first,
 * the driver calls inside the capture handshake (a capture
 * waits for the register only); the driver's result
 * (CUDA_ERROR_NOT_READY: the process exits). */
static CUresult pin_new(uint64_t bytes, void **host, size_t *len, CUdeviceptr *dptr)
{
    const struct wo_driver *d = pin.drv;
    size_t n = 0;
    void *pages = d->cuMemHostRegister_v2 ? wo_pin_pages((size_t)bytes, &n) : NULL;
    CUresult r;

    if (!enter_wait()) {
        if (pages)
            munmap(pages, n);
        return CUDA_ERROR_NOT_READY;
    }
    d->cuCtxSetCurrent(pin.ctx);
    r = wo_pin_host(d, (size_t)bytes, pages, n, host, len);
    if (r == CUDA_SUCCESS) {
        r = d->cuMemHostGetDevicePointer_v2(dptr, *host, 0);
        if (r != CUDA_SUCCESS)
            (void)wo_unpin_host(d, *host, *len);
    }
    wo_driver_leave();
    return r;
}

/* Gives back what pin_new made, inside the capture handshake (at exit the
 * pages go with the process). */
static void pin_release(void *host, size_t len)
{
    if (!enter_wait())
        return;
    pin.drv->cuCtxSetCurrent(pin.ctx);
    (void)wo_unpin_host(pin.drv, host, len);
    wo_driver_leave();
}

/* One asked-for copy: made, or marked failed. Called without the lock. */
static void make(uint32_t id)
{
    struct pin_ent *e = &pin.e[id];
    uint32_t gen, rid;
    uint64_t src, bytes, t0 = wo_now_ns();
    size_t len;
    void *host;
    CUdeviceptr dptr = 0;
    CUresult r = CUDA_SUCCESS;
    bool ok;

    pthread_mutex_lock(&pin.lock);
    if (e->state != P_QUEUED) {
        pthread_mutex_unlock(&pin.lock);
        return;
    }
    gen = e->gen;
    rid = e->rid;
    src = e->src;
    bytes = e->bytes;
    if (!within_budget(bytes)) {
        e->state = P_FAILED;
        pin.n.over_budget++;
        if (!pin.said_budget) {
            pin.said_budget = true;
            wo_info("stream: pinned copies: the host memory prefetch.pinned_copies allows is "
                    "used (%llu MiB in %llu copies): later ranges are staged from managed "
                    "memory by the copy kernel",
                    (unsigned long long)(pin.n.bytes >> 20), (unsigned long long)pin.n.held);
        }
        pthread_mutex_unlock(&pin.lock);
        return;
    }
    e->state = P_BUSY;
    pthread_mutex_unlock(&pin.lock);

    r = pin_new(bytes, &host, &len, &dptr);
    ok = r == CUDA_SUCCESS;
    /* piece by piece while it is still the same live range (the executor's
     * staging goes on meanwhile): false when the engine freed it */
    if (ok && !wo_uvm_copy_live(WO_READER_PIN, rid, gen, src, bytes, host, &pin.stop)) {
        /* the engine freed the range meanwhile, or the process exits */
        pin_release(host, len);
        ok = false;
    }

    pthread_mutex_lock(&pin.lock);
    pin.n.pin_ns += wo_now_ns() - t0;
    if (e->state == P_DROP) {
        /* retired while it was made: never used */
        e->state = P_NONE;
        if (ok) {
            pthread_mutex_unlock(&pin.lock);
            pin_release(host, len);
            return;
        }
    } else if (ok) {
        e->state = P_READY;
        e->host = host;
        e->len = len;
        e->dptr = dptr;
        pin.n.held++;
        pin.n.made++;
        pin.n.bytes += bytes;
    } else {
        if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY) {
            pin.n.failed++;
            if (!pin.said_fail) {
                pin.said_fail = true;
                wo_warn("stream: pinning a copy of %llu MiB failed (%s; RLIMIT_MEMLOCK or the "
                        "cgroup's memory limit): the range is staged from managed memory by the "
                        "copy kernel",
                        (unsigned long long)(bytes >> 20), wo_cu_error_name(r));
            }
        }
        /* stopping: asked again later; a failure or a range freed while it
         * was copied: not for this generation */
        e->state = r == CUDA_ERROR_NOT_READY ? P_NONE : P_FAILED;
    }
    pthread_mutex_unlock(&pin.lock);
}

/* Frees a batch of retired copies once the copies issued from them are
 * done (the batch's event). Driver calls inside the capture handshake; at
 * exit (stop) the pages go with the process. */
static void free_retired(struct retired *list)
{
    bool in = enter_wait();

    while (list) {
        struct retired *next = list->next;

        if (in) {
            pin.drv->cuCtxSetCurrent(pin.ctx);
            if (list->done) {
                pin.drv->cuEventSynchronize(list->done);
                pin.drv->cuEventDestroy_v2(list->done);
            }
            (void)wo_unpin_host(pin.drv, list->host, list->len);
        }
        free(list);
        list = next;
    }
    if (in)
        wo_driver_leave();
}

static void *worker(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&pin.lock);
    while (!pin.stop) {
        struct retired *fr = pin.to_free;

        if (fr) {
            pin.to_free = NULL;
            pthread_mutex_unlock(&pin.lock);
            free_retired(fr);
            pthread_mutex_lock(&pin.lock);
            continue;
        }
        if (pin.qhead != pin.qtail) {
            uint32_t id = pin.queue[pin.qhead % WO_STREAM_ENTRIES];

            pin.qhead++;
            pthread_mutex_unlock(&pin.lock);
            make(id);
            pthread_mutex_lock(&pin.lock);
            continue;
        }
        pthread_cond_wait(&pin.cv, &pin.lock);
    }
    pthread_mutex_unlock(&pin.lock);
    return NULL;
}

bool wo_pin_start(const struct wo_driver *d, CUcontext ctx, uint64_t limit)
{
    if (pin.running)
        return true;
    if (__atomic_load_n(&pin.closed, __ATOMIC_ACQUIRE) || !limit || !ctx ||
        !d->cuMemHostRegister_v2 || !d->cuMemHostUnregister || !d->cuMemHostAlloc ||
        !d->cuMemFreeHost || !d->cuMemHostGetDevicePointer_v2 || !d->cuEventCreate ||
        !d->cuEventRecord || !d->cuEventSynchronize || !d->cuEventDestroy_v2 || !d->cuCtxSetCurrent)
        return false;
    pin.e = calloc(WO_STREAM_ENTRIES, sizeof(*pin.e));
    pin.queue = calloc(WO_STREAM_ENTRIES, sizeof(*pin.queue));
    if (!pin.e || !pin.queue) {
        free(pin.e);
        free(pin.queue);
        pin.e = NULL;
        pin.queue = NULL;
        return false;
    }
    pin.drv = d;
    pin.ctx = ctx;
    pin.said_fail = pin.said_budget = false;
    pin.limit = limit;
    pin.stop = false;
    pin.qhead = pin.qtail = 0;
    memset(&pin.n, 0, sizeof(pin.n));
    if (pthread_create(&pin.thread, NULL, worker, NULL) != 0) {
        free(pin.e);
        free(pin.queue);
        pin.e = NULL;
        pin.queue = NULL;
        return false;
    }
    (void)pthread_setname_np(pin.thread, "woffload-pin");
    pin.running = true;
    return true;
}

static void retire_locked(struct pin_ent *e);

CUdeviceptr wo_pin_source(uint32_t id, uint32_t rid, uint32_t gen, uint64_t src, uint64_t bytes)
{
    struct pin_ent *e;
    CUdeviceptr p = 0;

    if (!pin.running || id >= WO_STREAM_ENTRIES)
        return 0;
    e = &pin.e[id];
    pthread_mutex_lock(&pin.lock);
    if (__atomic_load_n(&pin.closed, __ATOMIC_ACQUIRE)) {
        pthread_mutex_unlock(&pin.lock);
        return 0;
    }
    if (e->state == P_READY && (e->gen != gen || e->src != src || e->bytes != bytes))
        retire_locked(e); /* another range's: freed at the next hand_over */
    if (e->state == P_READY) {
        p = e->dptr;
    } else if ((e->state == P_NONE || (e->state == P_FAILED && e->gen != gen)) &&
               pin.qtail - pin.qhead < WO_STREAM_ENTRIES) {
        e->gen = gen;
        e->rid = rid;
        e->src = src;
        e->bytes = bytes;
        e->state = P_QUEUED;
        pin.queue[pin.qtail++ % WO_STREAM_ENTRIES] = id;
        pthread_cond_signal(&pin.cv);
    }
    pthread_mutex_unlock(&pin.lock);
    return p;
}

/* Records, on the copy stream, the event after which the retired copies may
 * go, and hands them to the worker. Under pin.lock. False: the driver is
 * busy (a capture): later. */
static bool hand_over(CUstream copy_stream)
{
    const struct wo_driver *d = pin.drv;
    CUevent ev = NULL;
    CUcontext prev = NULL;
    struct retired *last;

    if (!pin.pending)
        return true;
    if (copy_stream) {
        if (!wo_driver_enter())
            return false;
        if (d->cuCtxGetCurrent)
            d->cuCtxGetCurrent(&prev);
        if (prev != pin.ctx)
            d->cuCtxSetCurrent(pin.ctx);
        if (d->cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
            ev = NULL;
        else if (d->cuEventRecord(ev, copy_stream) != CUDA_SUCCESS) {
            d->cuEventDestroy_v2(ev);
            ev = NULL;
            /* no event: wait for the stream here, the rare way */
            d->cuStreamSynchronize(copy_stream);
        }
        if (prev != pin.ctx)
            d->cuCtxSetCurrent(prev);
        wo_driver_leave();
    }
    /* one event closes the whole batch (the newest copy from any of them
     * precedes it); the first entry carries it */
    for (last = pin.pending; last->next; last = last->next)
        ;
    pin.pending->done = ev;
    last->next = pin.to_free;
    pin.to_free = pin.pending;
    pin.pending = NULL;
    pthread_cond_signal(&pin.cv);
    return true;
}

static void retire_locked(struct pin_ent *e)
{
    if (e->state == P_READY) {
        struct retired *rt = calloc(1, sizeof(*rt));

        if (rt) {
            rt->host = e->host;
            rt->len = e->len;
            rt->next = pin.pending;
            pin.pending = rt;
        } /* else it stays pinned until exit: never read again */
        pin.n.held--;
        pin.n.bytes -= e->bytes;
        pin.n.retired++;
        e->host = NULL;
        e->dptr = 0;
        e->state = P_NONE;
    } else if (e->state == P_BUSY) {
        e->state = P_DROP; /* the worker unpins it when done */
    } else if (e->state == P_QUEUED || e->state == P_FAILED) {
        e->state = P_NONE; /* a later range with the id may try again */
    }
}

void wo_pin_retire(uint32_t id)
{
    if (!pin.running || id >= WO_STREAM_ENTRIES)
        return;
    pthread_mutex_lock(&pin.lock);
    retire_locked(&pin.e[id]);
    /* a written range is never streamed again: a new one with the id is */
    pin.e[id].gen = 0;
    /* one event for all the ranges retired before the next tick (an engine
     * that frees its model retires them all at once): wo_pin_tick */
    pthread_mutex_unlock(&pin.lock);
}

void wo_pin_retire_all(CUstream copy_stream)
{
    if (!pin.running)
        return;
    pthread_mutex_lock(&pin.lock);
    for (uint32_t id = 0; id < WO_STREAM_ENTRIES; id++)
        retire_locked(&pin.e[id]);
    (void)hand_over(copy_stream);
    pthread_mutex_unlock(&pin.lock);
}

void wo_pin_close(CUstream copy_stream)
{
    /* wo_pin_start refuses, wo_pin_source hands out none, from now on */
    __atomic_store_n(&pin.closed, true, __ATOMIC_RELEASE);
    wo_pin_retire_all(copy_stream);
}

void wo_pin_tick(CUstream copy_stream)
{
    if (!pin.running)
        return;
    pthread_mutex_lock(&pin.lock);
    (void)hand_over(copy_stream);
    pthread_mutex_unlock(&pin.lock);
}

static __attribute__((used)) void *parents_pin[2];
static __attribute__((used)) struct retired *kept_at_exit; /* wo_pin_stop */

void wo_pin_atfork_child(void)
{
    /* the lock may have been held by a thread that is not here */
    pthread_mutex_t fresh = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;

    pin.lock = fresh;
    pin.cv = cv;
    pin.running = false;
    /* the parent's tables stay reachable (leak checkers), never freed here */
    parents_pin[0] = pin.e;
    parents_pin[1] = pin.queue;
    pin.e = NULL;
    pin.queue = NULL;
    pin.pending = pin.to_free = NULL;
}

void wo_pin_counts(struct wo_pin_counts *ret)
{
    pthread_mutex_lock(&pin.lock);
    *ret = pin.n;
    pthread_mutex_unlock(&pin.lock);
}

void wo_pin_stop(void)
{
    if (!pin.running)
        return;
    pthread_mutex_lock(&pin.lock);
    __atomic_store_n(&pin.stop, true, __ATOMIC_RELAXED);
    pthread_cond_signal(&pin.cv);
    pthread_mutex_unlock(&pin.lock);
    pthread_join(pin.thread, NULL);
    pin.running = false;
    /* the pinned copies and anything retired go with the process: no
     * driver call at exit, so a retired copy's event and mapping stay, and
     * so do their records (kept reachable: they are not leaks) */
    free(pin.e);
    free(pin.queue);
    pin.e = NULL;
    pin.queue = NULL;
    for (struct retired **l = &pin.pending; *l; l = &(*l)->next)
        if (!(*l)->next) {
            (*l)->next = pin.to_free;
            break;
        }
    kept_at_exit = pin.pending ? pin.pending : pin.to_free;
    pin.pending = pin.to_free = NULL;
}
