/* uvm/picks-dma.c: picked copies on the copy engine (uvm/picks-dma.h). */
#include "uvm/picks-dma.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>

#include "core/log.h"
#include "core/macro.h"
#include "uvm/internal.h"
#include "uvm/picks-calls.h"
#include "uvm/queue-probe.h"
#include "core/meminfo.h"
#include "core/settings.h"
#include "uvm/stream-pin.h"
#include "uvm/uvm.h"

/* Jobs queued at once, all streams: llama.cpp issues a whole step (a graph replayed, 3 expert
 * tensors a layer) before the GPU reaches its first layer, so a step's every job must fit (a
 * job beyond them is copied by the kernels: no_slot) */
#define SLOTS 256u
#define IDS_MAX (64u << 10) /* ids bytes a job may have (a batch of 128 rows of 128) */
#define POLL_MIN_NS 1000l   /* the copy thread's sleep between two looks at the events, */
#define POLL_MAX_NS 32000l  /* doubled while none is ready, up to this */
#define DRAIN_NS (5ull * 1000000000ull)
#define HOST_WAIT_NS (10ull * 1000000000ull)
#define QUIESCE_NS (2ull * 1000000000ull) /* the longest a free waits for the queue */
#define PROBE_NS (500ull * 1000000ull) /* the longest a probe waits for the copy stream */
#define PROBE_TRIES 3u                 /* copy streams tried while none has been found apart yet */

enum { S_FREE, S_FILLING, S_QUEUED };

struct slot {
    int state;
    CUevent ev;
    void *ids; /* pinned, IDS_MAX */
    unsigned ix;
    uint32_t seq;
    CUdeviceptr src; /* the copy engine's source: j.c.src, or its mirror */
    /* the stall report's: when the watchdog first saw this job queued
     * (the job: ix and seq then), 0 not yet */
    uint64_t seen;
    unsigned seen_ix;
    uint32_t seen_seq;
    struct wo_dma_job j;
};

enum { M_NONE, M_QUEUED, M_READY, M_FAILED };

struct mirror {
    int state;
    void *host;
    uint64_t lo, bytes;
    uint32_t rid, gen;   /* the engine allocation it lies in (registry id, generation) */
    uint32_t wseq, want; /* the writes count it copies / the span's now */
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t cv, mcv;
    const struct wo_driver *d;
    CUcontext ctx;
    CUstream copy;
    CUfunction mark, kcopy;
    uint32_t *flags; /* pinned: one per engine stream index */
    CUdeviceptr flags_dev;
    uint32_t seq[WO_PICKS_STREAMS];
    struct slot s[SLOTS];
    unsigned queued, next_free;
    /* each engine stream's jobs in the order they were queued: its events
     * complete in that order, and its flag must rise in it */
    struct {
        unsigned ring[SLOTS];
        unsigned head, tail;
    } q[WO_PICKS_STREAMS];
    bool started, broken, stop, th_on, mth_on, said_on;
    /* the quiesce gate (wo_uvm_quiesce_begin): threads about to free that
     * hold new jobs off, and enqueues under way; atomics, Dekker-style */
    unsigned entering; /* with wo_uvm_quiescing (the gate, uvm/state.c) */
    /* for the stall report (watchdog): the driver call the copy thread (0)
     * and the mirror thread (1) are in, NULL none, and since when; since
     * when the gate has been held */
    struct {
        const char *call;
        uint64_t since;
    } doing[2];
    uint64_t gate_since;
    /* who raised the gate last (the stall report's): return address, and whether the mirrorer */
    void *gate_by;
    bool gate_mirror;
    /* the work-queue probe (probe()), serialised by plock: the engine
     * stream each index was last probed with and its verdict (written
     * under lock too: a job reads them there), and how many said apart
     * (the copy stream is kept from the first) */
    pthread_mutex_t plock;
    CUstream probed[WO_PICKS_STREAMS];
    bool probed_on[WO_PICKS_STREAMS], apart[WO_PICKS_STREAMS];
    unsigned aparts;
    struct wo_qprobe qp;
    uint32_t served[WO_PICKS_STREAMS]; /* the last job's seq served, by stream */
    uint64_t served_at[WO_PICKS_STREAMS]; /* and when (the stall report's) */
    pthread_cond_t wcv;
    pthread_t th, mth, wth;
    bool wth_on;
    struct mirror *m; /* [WO_PICKS_SPANS] */
    unsigned mq[WO_PICKS_SPANS], mhead, mtail;
    struct wo_dma_figs f;
} dm = {.lock = PTHREAD_MUTEX_INITIALIZER,
        .plock = PTHREAD_MUTEX_INITIALIZER,
        .cv = PTHREAD_COND_INITIALIZER,
        .mcv = PTHREAD_COND_INITIALIZER,
        .wcv = PTHREAD_COND_INITIALIZER};

static uint64_t now_ns(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* Thread who (0 the copy thread, 1 the mirror thread) enters driver call `call` (NULL: leaves). */
static void doing(unsigned who, const char *call)
{
    __atomic_store_n(&dm.doing[who].since, call ? now_ns() : 0, __ATOMIC_RELAXED);
    __atomic_store_n(&dm.doing[who].call, call, __ATOMIC_RELEASE);
}

static bool reached(uint32_t have, uint32_t want)
{
    return (int32_t)(have - want) >= 0;
}

/* ---- the copy thread ------------------------------------------------------- */

/* The flag of stream ix at seq from the host, after the copy stream's
 * writes (an earlier job's must not land after it). */
static void host_flag(unsigned ix, uint32_t seq)
{
    uint32_t have = __atomic_load_n(&dm.flags[ix], __ATOMIC_ACQUIRE);

    doing(0, "cuStreamSynchronize");
    (void)dm.d->cuStreamSynchronize(dm.copy);
    doing(0, NULL);
    if (!reached(have, seq))
        __atomic_store_n(&dm.flags[ix], seq, __ATOMIC_RELEASE);
}

/* One job whose ids are there (ok) or can never be read (!ok: a driver
 * failure, or shutdown past its drain time): the copies, then the flag. */
static void serve(struct slot *sl, bool ok)
{
    const struct wo_driver *d = dm.d;
    const struct wo_picks_copy *c = &sl->j.c;
    uint64_t runs = 0, rows = 0;
    bool done = false, kernel = false, host = false;

    if (ok) {
        uint8_t pick[WO_PICKS_EXPERTS];

        memset(pick, 0, c->n_experts);
        for (uint64_t k = 0; k < c->n_ids; k++) {
            uint64_t at = c->per_row ? k / c->per_row * c->stride + k % c->per_row : k;
            int64_t e = c->width == 8 ? ((const int64_t *)sl->ids)[at]
                                      : (int64_t)((const int32_t *)sl->ids)[at];
            if (e >= 0 && e < (int64_t)c->n_experts)
                pick[e] = 1;
        }
        done = true;
        for (unsigned e = 0; e < c->n_experts && done;) {
            unsigned first;

            if (!pick[e]) {
                e++;
                continue;
            }
            for (first = e; e < c->n_experts && pick[e]; e++)
                ;
            doing(0, "cuMemcpyAsync");
            done = d->cuMemcpyAsync(c->dst + first * c->row, sl->src + first * c->row,
                                    (e - first) * c->row, dm.copy) == CUDA_SUCCESS;
            doing(0, NULL);
            runs += done;
            rows += done ? e - first : 0;
        }
        /* the kernels read the ids on the device, still there: the launch
         * has not run */
        CUfunction mark = __atomic_load_n(&dm.mark, __ATOMIC_ACQUIRE);
        if (!done && mark)
            done = kernel = wo_picks_launch(d, mark, __atomic_load_n(&dm.kcopy, __ATOMIC_RELAXED),
                                            dm.copy, c) == CUDA_SUCCESS;
    }
    doing(0, "cuStreamWriteValue32");
    CUresult wr =
        d->cuStreamWriteValue32_v2(dm.copy, dm.flags_dev + sl->ix * sizeof(uint32_t), sl->seq, 0);
    doing(0, NULL);
    if (wr != CUDA_SUCCESS) {
        host_flag(sl->ix, sl->seq);
        host = true;
    }
    if (!kernel && sl->j.rows)
        __atomic_add_fetch(sl->j.rows, rows, __ATOMIC_RELAXED);
    pthread_mutex_lock(&dm.lock);
    if (!done) {
        wo_warn("picks: a picked copy on the copy engine failed, and the kernels could not copy "
                "it either: a launch may read rows never copied (the driver refused; every later "
                "copy uses the kernels)");
        dm.broken = true;
    }
    dm.f.jobs += !kernel && done;
    dm.f.kernel += kernel;
    dm.f.runs += runs;
    dm.f.bytes += rows * c->row;
    dm.f.host_flags += host;
    pthread_mutex_unlock(&dm.lock);
}

/* The head job of stream ix, or NULL. */
static struct slot *head_of(unsigned ix)
{
    struct slot *sl = NULL;

    pthread_mutex_lock(&dm.lock);
    if (dm.q[ix].head != dm.q[ix].tail)
        sl = &dm.s[dm.q[ix].ring[dm.q[ix].head % SLOTS]];
    pthread_mutex_unlock(&dm.lock);
    return sl;
}

static void *worker(void *arg)
{
    uint64_t drain_end = 0;
    long nap = POLL_MIN_NS;

    (void)arg;
    (void)prctl(PR_SET_TIMERSLACK, 1000ul, 0, 0, 0);
    (void)dm.d->cuCtxSetCurrent(dm.ctx);
    for (;;) {
        bool any = false;

        pthread_mutex_lock(&dm.lock);
        while (!dm.queued && !dm.stop)
            pthread_cond_wait(&dm.cv, &dm.lock);
        if (!dm.queued) {
            pthread_mutex_unlock(&dm.lock);
            break;
        }
        if (dm.stop && !drain_end)
            drain_end = now_ns() + DRAIN_NS;
        pthread_mutex_unlock(&dm.lock);
        /* no driver call while a global or thread-local capture is under
         * way (a query would break it), and none begins meanwhile; relaxed
         * captures forbid it nothing, and holding off for them can leave a
         * copy unissued that another thread's free waits for (uvm.h:
         * wo_captures_strict). Only each
         * stream's head can be ready: a later job's event is behind the
         * head's wait on the same stream */
        bool in = wo_dma_driver_enter();
        for (unsigned ix = 0; in && ix < WO_PICKS_STREAMS; ix++) {
            struct slot *sl;

            while ((sl = head_of(ix))) {
                doing(0, "cuEventQuery");
                CUresult r = dm.d->cuEventQuery(sl->ev);
                doing(0, NULL);

                if (r == CUDA_ERROR_NOT_READY && !(drain_end && now_ns() > drain_end))
                    break;
                serve(sl, r == CUDA_SUCCESS);
                pthread_mutex_lock(&dm.lock);
                dm.served[ix] = sl->seq;
                dm.served_at[ix] = now_ns();
                dm.q[ix].head++;
                sl->state = S_FREE;
                dm.queued--;
                pthread_mutex_unlock(&dm.lock);
                any = true;
            }
        }
        if (in)
            wo_dma_driver_leave();
        if (any) {
            nap = POLL_MIN_NS;
        } else {
            struct timespec ts = {0, nap};
            nanosleep(&ts, NULL);
            nap = nap * 2 > POLL_MAX_NS ? POLL_MAX_NS : nap * 2;
        }
    }
    return NULL;
}

/* ---- mirrors --------------------------------------------------------------- */

/* A mirror's pinned memory that never became a source, given back behind the gate
 * (wo_unpin_host), as the shim's own memory: the other mirrors asked stay good. */
static void free_own(void *h, size_t len)
{
    doing(1, len ? "cuMemHostUnregister" : "cuMemFreeHost");
    (void)wo_unpin_host(dm.d, h, len);
    doing(1, NULL);
}

/* Makes the mirrors asked for, one at a time: pinned memory, then the
 * tensor's bytes copied by the CPU (managed memory advised to the host
 * lies there). A mirror replaced by a newer one is left to the process's
 * end (a queued job may still copy from it). */
static void *mirrorer(void *arg)
{
    (void)arg;
    (void)dm.d->cuCtxSetCurrent(dm.ctx);
    pthread_mutex_lock(&dm.lock);
    for (;;) {
        unsigned i;
        struct mirror want;
        void *h = NULL, *pages = NULL;
        size_t n = 0, len = 0;
        bool ok;

        while (!dm.stop && dm.mhead == dm.mtail)
            pthread_cond_wait(&dm.mcv, &dm.lock);
        if (dm.stop)
            break;
        i = dm.mq[dm.mhead++ % WO_PICKS_SPANS];
        want = dm.m[i];
        pthread_mutex_unlock(&dm.lock);
        ok = want.bytes <= wo_pin_auto_room(wo_meminfo_bytes("MemAvailable"),
                                            wo_meminfo_bytes("MemTotal"));
        if (ok) {
            /* the pages faulted in first, outside the driver (as the
             * streaming executor's pinned copies, uvm/place-pin.c): the
             * driver would zero them inside its call, the engine's launches
             * waiting meanwhile (cuMemHostAlloc: 387 ms per 2 GiB on the
             * H100), and registering them pins at half its cost */
            pages = wo_pin_pages((size_t)want.bytes, &n);
            /* pinning is no call for a capture's time: wait it out */
            bool in;
            while (!(in = wo_driver_enter()) && !__atomic_load_n(&dm.stop, __ATOMIC_RELAXED)) {
                struct timespec ts = {0, 1000000};
                nanosleep(&ts, NULL);
            }
            /* both calls may wait for the context's work, holding the lock
             * the copy thread's calls need: behind the gate, as the frees
             * (this thread reads nothing meanwhile) */
            wo_uvm_quiesce_begin();
            doing(1, "cuMemHostRegister");
            ok = in && wo_pin_host(dm.d, (size_t)want.bytes, pages, n, &h, &len) == CUDA_SUCCESS;
            if (!in && pages)
                munmap(pages, n); /* wo_pin_host unmaps them when it fails */
            /* a copy into the tensor noted before (its writes count, want)
             * may still be in flight on the engine's stream: the context's
             * work done first, so the mirror holds it */
            doing(1, "cuCtxSynchronize");
            if (ok && dm.d->cuCtxSynchronize_v2)
                (void)dm.d->cuCtxSynchronize_v2(NULL);
            else if (ok && dm.d->cuCtxSynchronize)
                (void)dm.d->cuCtxSynchronize();
            doing(1, NULL);
            wo_uvm_quiesce_end();
            if (in)
                wo_driver_leave();
        }
        /* read by the CPU piece by piece while the tensor's allocation is
         * live (a free of it waits for the piece under way: wo_uvm_free);
         * the engine's frees of other memory leave it be */
        bool dropped = ok && !wo_uvm_copy_live(WO_READER_MIRROR, want.rid, want.gen, want.lo,
                                                want.bytes, h, &dm.stop);
        pthread_mutex_lock(&dm.lock);
        if (!ok) {
            dm.m[i].state = M_FAILED;
            if (!dm.f.mirror_failed++)
                wo_info("picks: no pinned mirror of a %" PRIu64 " MiB expert tensor (host memory "
                        "or the driver): its picked rows are copied by the kernels",
                        want.bytes >> 20);
        } else if (dropped || dm.m[i].want != want.wseq || dm.m[i].lo != want.lo) {
            /* its allocation freed (its source is gone), or it was
             * written (or is new memory) while copied: asked again by the
             * next copy that wants it; the free outside the lock */
            dm.f.mirror_dropped += dropped;
            if (dm.m[i].lo == want.lo && dm.m[i].state == M_QUEUED)
                dm.m[i].state = M_NONE;
            pthread_mutex_unlock(&dm.lock);
            free_own(h, len);
            pthread_mutex_lock(&dm.lock);
        } else {
            dm.m[i].host = h;
            dm.m[i].wseq = want.wseq;
            dm.m[i].state = M_READY;
            dm.f.mirrors++;
            dm.f.mirror_bytes += want.bytes;
        }
    }
    pthread_mutex_unlock(&dm.lock);
    return NULL;
}

/* The copy engine's source for the job, or 0 (under dm.lock). */
static CUdeviceptr source(uint64_t lo, uint32_t rid, uint32_t gen, unsigned span, uint64_t bytes,
                          uint32_t wseq, bool pinned)
{
    struct mirror *m = &dm.m[span];

    if (pinned)
        return lo;
    if (m->lo != lo || m->bytes != bytes || m->rid != rid || m->gen != gen) {
        /* another tensor's, or new memory at the same address (its old
         * mirror is left, see mirrorer) */
        if (m->state == M_QUEUED)
            return 0;
        *m = (struct mirror){.state = M_NONE, .lo = lo, .bytes = bytes, .rid = rid, .gen = gen};
    }
    m->want = wseq;
    if (m->state == M_READY && m->wseq == wseq)
        return (CUdeviceptr)(uintptr_t)m->host;
    if (m->state == M_NONE || m->state == M_READY ||
        (m->state == M_FAILED && m->wseq != wseq)) {
        m->state = M_QUEUED;
        m->wseq = wseq;
        dm.mq[dm.mtail++ % WO_PICKS_SPANS] = span;
        pthread_cond_signal(&dm.mcv);
    }
    return 0;
}

/* ---- the stall report ------------------------------------------------------ */

/* Appends to msg (used bytes so far, truncated at its end). */
static void add(char *msg, size_t cap, size_t *used, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void add(char *msg, size_t cap, size_t *used, const char *fmt, ...)
{
    va_list ap;
    int r;

    if (*used + 1 >= cap)
        return;
    va_start(ap, fmt);
    r = vsnprintf(msg + *used, cap - *used, fmt, ap);
    va_end(ap);
    if (r > 0)
        *used = WO_MIN(*used + (size_t)r, cap - 1);
}

/* " the copy thread has been in cuMemcpyAsync for 5.2 s;" when thread who
 * has been in a driver call longer than lim. */
static void say_doing(char *msg, size_t cap, size_t *used, unsigned who, uint64_t now,
                      uint64_t lim)
{
    const char *call = __atomic_load_n(&dm.doing[who].call, __ATOMIC_ACQUIRE);
    uint64_t since = __atomic_load_n(&dm.doing[who].since, __ATOMIC_RELAXED);

    if (call && since && now > since && now - since > lim)
        add(msg, cap, used, " the %s thread has been in %s for %.1f s;", who ? "mirror" : "copy",
            call, (double)(now - since) / 1e9);
}

/* "the mirror thread", or "a call from cuMemFree_v2" (the exported
 * function nearest the address that raised the gate), or "a free or a wait
 * for the context". */
static void gate_raiser(char *who, size_t cap)
{
    void *by = __atomic_load_n(&dm.gate_by, __ATOMIC_RELAXED);
    Dl_info di;

    if (__atomic_load_n(&dm.gate_mirror, __ATOMIC_RELAXED))
        snprintf(who, cap, "the mirror thread (pinning a mirror)");
    else if (by && dladdr(by, &di) && di.dli_sname)
        snprintf(who, cap, "a call from %s", di.dli_sname);
    else
        snprintf(who, cap, "a free or a wait for the context");
}

/* A copy engine that stops moving hangs the engine's stream, which waits on
 * the device for the copy thread's flag: when a driver call of the shim's
 * threads, or the oldest queued copy, or the gate has lasted longer than
 * WOFFLOAD_PICKS_STALL_MS, say once what each was doing (the driver call
 * that holds the others off is the one to look at), and count it. */
static void *watchdog(void *arg)
{
    uint64_t lim = (uint64_t)wo_settings()->picks_stall_ms * 1000000ull;

    (void)arg;
    (void)dm.d->cuCtxSetCurrent(dm.ctx); /* its queries of the copy stream */
    pthread_mutex_lock(&dm.lock);
    /* it runs until the copy engine stops, also once it has spoken: a
     * thread that ended early would be left unjoined at exit */
    while (!dm.stop) {
        struct timespec ts;
        uint64_t now, oldest = 0, gate;
        char msg[sizeof(dm.f.stall_report)];
        unsigned calls_ix = WO_PICKS_STREAMS; /* whose calls since a job it says */
        size_t used = 0;

        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100000000l; /* ten looks a second */
        if (ts.tv_nsec >= 1000000000l) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000l;
        }
        (void)pthread_cond_timedwait(&dm.wcv, &dm.lock, &ts);
        if (dm.stop)
            break;
        if (dm.f.stalls)
            continue; /* said once */
        now = now_ns();
        for (unsigned k = 0; k < SLOTS; k++) {
            struct slot *sl = &dm.s[k];

            if (sl->state != S_QUEUED) {
                sl->seen = 0;
                continue;
            }
            if (!sl->seen || sl->seen_ix != sl->ix || sl->seen_seq != sl->seq) {
                sl->seen = now;
                sl->seen_ix = sl->ix;
                sl->seen_seq = sl->seq;
            }
            if (!oldest || sl->seen < oldest)
                oldest = sl->seen;
        }
        gate = __atomic_load_n(&dm.gate_since, __ATOMIC_RELAXED);
        say_doing(msg, sizeof(msg), &used, 0, now, lim);
        say_doing(msg, sizeof(msg), &used, 1, now, lim);
        if (oldest && now > oldest && now - oldest > lim)
            add(msg, sizeof(msg), &used, " %u %s queued, the oldest for %.1f s;", dm.queued,
                dm.queued == 1 ? "copy" : "copies", (double)(now - oldest) / 1e9);
        /* every job served, yet a flag behind (a hang the queue does not show) */
        for (unsigned ix = 0; ix < WO_PICKS_STREAMS; ix++) {
            uint32_t fl = __atomic_load_n(&dm.flags[ix], __ATOMIC_ACQUIRE);
            if (!dm.served_at[ix] || now - dm.served_at[ix] <= lim || reached(fl, dm.served[ix]))
                continue;
            add(msg, sizeof(msg), &used,
                " stream %u: its flag at %u, %.1f s after job %u was served;", ix, fl,
                (double)(now - dm.served_at[ix]) / 1e9, dm.served[ix]);
            calls_ix = ix;
        }
        if (gate && now > gate && now - gate > lim) {
            char who[96];
            gate_raiser(who, sizeof(who));
            add(msg, sizeof(msg), &used, " %s has held the gate for %.1f s;", who,
                (double)(now - gate) / 1e9);
        }
        if (!used)
            continue;
        /* where each stream with a queued copy stands: its oldest job, the
         * flag its stream waits on, the last job served. A flag behind the
         * job before the oldest means an earlier copy has not landed; at it,
         * the engine's stream has not reached the oldest job's ids */
        CUevent head_ev = NULL;
        for (unsigned ix = 0, said = 0; ix < WO_PICKS_STREAMS && said < 3; ix++)
            if (dm.q[ix].head != dm.q[ix].tail) {
                const struct slot *h = &dm.s[dm.q[ix].ring[dm.q[ix].head % SLOTS]];
                add(msg, sizeof(msg), &used,
                    " stream %u: oldest queued job %u, its flag at %u, served up to %u", ix,
                    h->seq, __atomic_load_n(&dm.flags[ix], __ATOMIC_ACQUIRE), dm.served[ix]);
                if (dm.served_at[ix] && now > dm.served_at[ix])
                    add(msg, sizeof(msg), &used, " %.1f s ago",
                        (double)(now - dm.served_at[ix]) / 1e9);
                add(msg, sizeof(msg), &used, ";");
                if (!said) {
                    head_ev = h->ev;
                    calls_ix = ix;
                }
                said++;
            }
        /* what may hold the copy thread off: a strict capture */
        add(msg, sizeof(msg), &used, " %d captures under way (%d of them global or thread-local);",
            __atomic_load_n(&wo_captures_live, __ATOMIC_SEQ_CST),
            __atomic_load_n(&wo_captures_strict, __ATOMIC_SEQ_CST));
        dm.f.stalls++;
        /* whether the copy stream still holds work and the oldest job's ids
         * have come (a flag behind a served job with the copy stream busy:
         * the copy engine itself is held; idle: the flag's write went
         * astray), asked outside the lock (a query may wait on the driver)
         * and never during a strict capture (it would break it) */
        if (wo_dma_driver_enter()) {
            CUstream copy = dm.copy;
            pthread_mutex_unlock(&dm.lock);
            CUresult qs = copy && dm.d->cuStreamQuery ? dm.d->cuStreamQuery(copy)
                                                       : CUDA_ERROR_NOT_SUPPORTED;
            CUresult qe = head_ev ? dm.d->cuEventQuery(head_ev) : CUDA_ERROR_NOT_SUPPORTED;
            wo_dma_driver_leave();
            pthread_mutex_lock(&dm.lock);
            add(msg, sizeof(msg), &used, " the copy stream %s;",
                qs == CUDA_SUCCESS ? "is idle" : qs == CUDA_ERROR_NOT_READY ? "has work" : "?");
            if (head_ev)
                add(msg, sizeof(msg), &used, " the oldest job's ids %s;",
                    qe == CUDA_SUCCESS             ? "have come"
                    : qe == CUDA_ERROR_NOT_READY ? "have not come"
                                                 : "?");
        }
        wo_calls_say(calls_ix, msg, sizeof(msg), &used);
        msg[used - 1] = '\0'; /* the last ';' */
        /* kept for the stats (a test reads the clauses there) */
        snprintf(dm.f.stall_report, sizeof(dm.f.stall_report), "%s", msg + (msg[0] == ' '));
        wo_warn("picks: the copy engine looks stuck:%s. If the process hangs, run with "
                "WOFFLOAD_PICKS_ENGINE=0",
                msg);
    }
    pthread_mutex_unlock(&dm.lock);
    return NULL;
}

/* ---- the engine's side ----------------------------------------------------- */

static void gate_begin(void *by, unsigned raised);
static void gate_end(unsigned left);

/* Under dm.lock, on an engine thread. False: the kernels copy. */
static bool start(const struct wo_driver *d, CUcontext ctx)
{
    CUresult r;

    if (dm.broken || dm.stop)
        return false;
    if (dm.started)
        return ctx == dm.ctx;
    /* streams, events and pinned memory are made outside any capture */
    if (__atomic_load_n(&wo_captures_live, __ATOMIC_SEQ_CST))
        return false;
    if (!d->cuStreamWaitValue32_v2 || !d->cuStreamWriteValue32_v2 || !d->cuEventCreate ||
        !d->cuEventRecord || !d->cuEventQuery || !d->cuMemHostAlloc ||
        !d->cuMemHostGetDevicePointer_v2 || !d->cuStreamCreate || !d->cuCtxSetCurrent ||
        !d->cuStreamSynchronize || !d->cuMemcpyAsync || !d->cuMemFreeHost) {
        dm.broken = true;
        wo_info("picks: the driver lacks stream memory operations: picked rows are copied by "
                "the kernels");
        return false;
    }
    /* what the copy engine does at the gate (uvm/state.c): before a job
     * can be queued */
    wo_uvm_gate_install(gate_begin, gate_end);
    dm.d = d;
    dm.ctx = ctx;
    r = d->cuMemHostAlloc((void **)&dm.flags, WO_PICKS_STREAMS * sizeof(uint32_t),
                          CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
    if (r == CUDA_SUCCESS) {
        memset(dm.flags, 0, WO_PICKS_STREAMS * sizeof(uint32_t));
        r = d->cuMemHostGetDevicePointer_v2(&dm.flags_dev, dm.flags, 0);
    }
    if (r == CUDA_SUCCESS)
        r = d->cuStreamCreate(&dm.copy, CU_STREAM_NON_BLOCKING);
    if (r == CUDA_SUCCESS && !wo_qprobe_init(d, &dm.qp))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    for (unsigned k = 0; k < SLOTS && r == CUDA_SUCCESS; k++) {
        r = d->cuMemHostAlloc(&dm.s[k].ids, IDS_MAX, CU_MEMHOSTALLOC_PORTABLE);
        if (r == CUDA_SUCCESS)
            r = d->cuEventCreate(&dm.s[k].ev, CU_EVENT_DISABLE_TIMING);
    }
    if (r == CUDA_SUCCESS && !(dm.m = calloc(WO_PICKS_SPANS, sizeof(*dm.m))))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) {
        dm.th_on = pthread_create(&dm.th, NULL, worker, NULL) == 0;
        dm.mth_on = dm.th_on && pthread_create(&dm.mth, NULL, mirrorer, NULL) == 0;
        dm.wth_on = dm.th_on && pthread_create(&dm.wth, NULL, watchdog, NULL) == 0;
    }
    if (r != CUDA_SUCCESS || !dm.th_on) {
        /* what was made stays (a few MiB of pinned memory) */
        dm.broken = true;
        wo_warn("picks: cannot set up picked copies on the copy engine (%d): picked rows are "
                "copied by the kernels",
                (int)r);
        return false;
    }
    __atomic_store_n(&dm.started, true, __ATOMIC_RELEASE); /* drain reads it unlocked */
    return true;
}

/* No new job nor mirror while a free waits for the queue to drain:
 * entering first, then the look at quiescing. False: a free is under way. */
static bool gate_enter(void)
{
    __atomic_add_fetch(&dm.entering, 1, __ATOMIC_SEQ_CST);
    if (!__atomic_load_n(&wo_uvm_quiescing, __ATOMIC_SEQ_CST))
        return true;
    __atomic_sub_fetch(&dm.entering, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_lock(&dm.lock);
    dm.f.quiesced++;
    pthread_mutex_unlock(&dm.lock);
    return false;
}

static void gate_leave(void)
{
    __atomic_sub_fetch(&dm.entering, 1, __ATOMIC_SEQ_CST);
}

/* Whether stream ix's jobs may go on the copy engine: a job's wait on it
 * must not hold the copy stream (uvm/queue-probe.h; the H200 hung so under
 * transformers). Probed on its first job, on the engine's thread, and again
 * when another engine stream takes the index. Until one stream is found
 * apart, a copy stream found sharing is replaced (no job has been queued
 * on it yet); after, a stream that shares the copy stream's queue has its
 * rows copied by the kernels. */
static bool probe(const struct wo_driver *d, unsigned ix, CUstream e, CUfunction fill)
{
    bool ok;

    pthread_mutex_lock(&dm.plock);
    pthread_mutex_lock(&dm.lock);
    bool known = dm.probed_on[ix] && dm.probed[ix] == e; /* another thread's probe */
    ok = dm.apart[ix];
    pthread_mutex_unlock(&dm.lock);
    if (known) {
        pthread_mutex_unlock(&dm.plock);
        return ok;
    }
    ok = wo_qprobe_apart(d, &dm.qp, e, dm.copy, fill, PROBE_NS);
    for (unsigned t = 1; !ok && !dm.aparts && t < PROBE_TRIES; t++) {
        CUstream fresh;
        if (d->cuStreamCreate(&fresh, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
            break;
        CUstream old = dm.copy;
        pthread_mutex_lock(&dm.lock);
        dm.copy = fresh; /* nothing queued: the copy thread is not in serve() */
        dm.f.copy_streams++;
        pthread_mutex_unlock(&dm.lock);
        if (d->cuStreamDestroy_v2)
            (void)d->cuStreamDestroy_v2(old); /* its probe's write still runs */
        ok = wo_qprobe_apart(d, &dm.qp, e, fresh, fill, PROBE_NS);
    }
    dm.aparts += ok;
    pthread_mutex_lock(&dm.lock);
    dm.probed[ix] = e;
    dm.probed_on[ix] = true;
    dm.apart[ix] = ok;
    dm.f.probes++;
    if (!ok && !dm.f.shared_queues++)
        wo_info("picks: an engine stream shares the driver's work queue with the copy stream "
                "(CUDA_DEVICE_MAX_CONNECTIONS, 8 by default): a stream wait there would hold the "
                "copies it waits for, so the kernels copy that stream's picked rows");
    pthread_mutex_unlock(&dm.lock);
    pthread_mutex_unlock(&dm.plock);
    return ok;
}

/* wo_dma_enqueue's body, while counted in dm.entering (idb: the ids' bytes). */
static bool enqueue_job(const struct wo_driver *d, CUcontext ctx, unsigned ix, CUstream stream,
                        const struct wo_dma_job *j, CUfunction mark, CUfunction copy,
                        CUfunction fill, uint64_t idb)
{
    const struct wo_picks_copy *c = &j->c;
    struct slot *sl = NULL;
    CUdeviceptr src;
    uint32_t seq;

    pthread_mutex_lock(&dm.lock);
    if (mark && !dm.mark) {
        /* the copy thread reads them without the lock: kcopy first */
        __atomic_store_n(&dm.kcopy, copy, __ATOMIC_RELAXED);
        __atomic_store_n(&dm.mark, mark, __ATOMIC_RELEASE);
    }
    if (!start(d, ctx) ||
        !(src = source(c->src, j->rid, j->gen, j->span, c->row * c->n_experts, j->wseq,
                      j->pinned))) {
        pthread_mutex_unlock(&dm.lock);
        return false;
    }
    /* the stream's verdict, known after its first job: no second lock */
    if (!dm.probed_on[ix] || dm.probed[ix] != stream) {
        pthread_mutex_unlock(&dm.lock);
        if (!probe(d, ix, stream, fill))
            return false;
        pthread_mutex_lock(&dm.lock);
    } else if (!dm.apart[ix]) {
        pthread_mutex_unlock(&dm.lock);
        return false;
    }
    for (unsigned k = 0; k < SLOTS && !sl && idb <= IDS_MAX; k++) {
        unsigned at = (dm.next_free + k) % SLOTS;
        if (dm.s[at].state == S_FREE) {
            sl = &dm.s[at];
            dm.next_free = at + 1;
        }
    }
    if (!sl) {
        dm.f.no_slot++;
        pthread_mutex_unlock(&dm.lock);
        return false;
    }
    sl->state = S_FILLING;
    pthread_mutex_unlock(&dm.lock);
    if (wo_ids_to_host(d, fill, sl->ids, c->ids, idb, stream) != CUDA_SUCCESS ||
        d->cuEventRecord(sl->ev, stream) != CUDA_SUCCESS) {
        pthread_mutex_lock(&dm.lock);
        sl->state = S_FREE;
        pthread_mutex_unlock(&dm.lock);
        return false;
    }
    pthread_mutex_lock(&dm.lock);
    seq = ++dm.seq[ix];
    bool first = reached(__atomic_load_n(&dm.flags[ix], __ATOMIC_ACQUIRE), seq - 1);
    sl->ix = ix;
    sl->seq = seq;
    sl->j = *j;
    sl->src = src;
    dm.q[ix].ring[dm.q[ix].tail++ % SLOTS] = (unsigned)(sl - dm.s);
    sl->state = S_QUEUED;
    dm.queued++;
    pthread_cond_signal(&dm.cv);
    if (!dm.said_on) {
        dm.said_on = true;
        wo_info("picks: picked experts are copied on the copy engine (WOFFLOAD_PICKS_ENGINE)");
    }
    pthread_mutex_unlock(&dm.lock);
    if (first) /* none outstanding: the stall report's baseline */
        wo_calls_mark(ix, seq);
    if (j->later) { /* its launch is later: the stream waits then (wo_dma_wait) */
        *j->later = seq;
        return true;
    }
    return wo_dma_wait(d, ix, stream, seq);
}

bool wo_dma_done(unsigned ix, uint32_t seq)
{
    uint64_t t0 = now_ns();

    if (ix >= WO_PICKS_STREAMS || !dm.flags)
        return false;
    while (!reached(__atomic_load_n(&dm.flags[ix], __ATOMIC_ACQUIRE), seq)) {
        if (now_ns() - t0 > HOST_WAIT_NS)
            return false;
        nanosleep(&(struct timespec){0, 20000}, NULL);
    }
    return true;
}

bool wo_dma_wait(const struct wo_driver *d, unsigned ix, CUstream stream, uint32_t seq)
{
    if (ix >= WO_PICKS_STREAMS || !dm.flags_dev)
        return false;
    /* queued before the wait: on the fake driver a wait blocks its caller */
    if (d->cuStreamWaitValue32_v2(stream, dm.flags_dev + ix * sizeof(uint32_t), seq,
                                  CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS)
        return true;
    /* The copy thread copies and writes the flag all the same: wait for it
     * here (the copies are done when it is written), and the launch reads
     * them; past HOST_WAIT_NS the kernels copy. The copy engine is not used
     * again. */
    bool there = wo_dma_done(ix, seq);
    pthread_mutex_lock(&dm.lock);
    dm.broken = true;
    dm.f.waits_refused++;
    pthread_mutex_unlock(&dm.lock);
    wo_warn("picks: the driver refused a stream wait (cuStreamWaitValue32): picked rows are "
            "copied by the kernels from now on");
    return there;
}

bool wo_dma_enqueue(const struct wo_driver *d, CUcontext ctx, unsigned ix, CUstream stream,
                    const struct wo_dma_job *j, CUfunction mark, CUfunction copy, CUfunction fill)
{
    const struct wo_picks_copy *c = &j->c;
    uint64_t extent, idb;

    if (!c->n_ids || !c->width || c->n_experts > WO_PICKS_EXPERTS || ix >= WO_PICKS_STREAMS ||
        j->span >= WO_PICKS_SPANS)
        return false;
    extent = c->per_row ? (c->n_ids / c->per_row - 1) * c->stride + c->per_row : c->n_ids;
    idb = extent * c->width;
    if (!gate_enter())
        return false; /* the kernels copy this one */
    bool ok = enqueue_job(d, ctx, ix, stream, j, mark, copy, fill, idb);
    gate_leave();
    return ok;
}

void wo_dma_mirror_ask(const struct wo_driver *d, CUcontext ctx, unsigned span, uint64_t lo,
                       uint32_t rid, uint32_t gen, uint64_t bytes, uint32_t wseq)
{
    if (span >= WO_PICKS_SPANS || !ctx || !gate_enter())
        return;
    pthread_mutex_lock(&dm.lock);
    if (start(d, ctx))
        (void)source(lo, rid, gen, span, bytes, wseq, false);
    pthread_mutex_unlock(&dm.lock);
    gate_leave();
}

/* ---- the quiesce gate ------------------------------------------------------ */

/* Waits (at most QUIESCE_NS) until no job is entering and none is queued. */
static void drain(void)
{
    uint64_t t0 = 0;

    for (;;) {
        bool idle;

        if (__atomic_load_n(&dm.entering, __ATOMIC_SEQ_CST) == 0) {
            /* never started (the default: off): nothing queued, and with
             * quiescing raised nothing can be until the gate's end */
            if (!__atomic_load_n(&dm.started, __ATOMIC_ACQUIRE))
                return;
            pthread_mutex_lock(&dm.lock);
            /* without the copy thread nothing queued can be issued */
            idle = !dm.queued || !dm.th_on;
            pthread_mutex_unlock(&dm.lock);
            if (idle)
                return;
        }
        if (!t0) {
            t0 = now_ns();
        } else if (now_ns() - t0 > QUIESCE_NS) {
            pthread_mutex_lock(&dm.lock);
            bool say = dm.f.quiesce_timeouts++ == 0; /* said once */
            pthread_mutex_unlock(&dm.lock);
            if (say) {
                char who[96];
                gate_raiser(who, sizeof(who));
                wo_warn("picks: %s waited %llu s for the copy engine's queued copies and "
                        "goes on without them (a CUDA graph capture, or a GPU that stopped); "
                        "if the process stops here, run with WOFFLOAD_PICKS_ENGINE=0",
                        who, QUIESCE_NS / 1000000000ull);
            }
            return;
        }
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
}

/* A cuMemFree (and the like) waits in the driver for the context's work
 * to finish while it holds a lock that the copy thread's cuMemcpyAsync and
 * cuStreamWriteValue32 take: with an engine stream waiting for a flag only
 * the copy thread raises, neither would ever go on (seen on the H200:
 * llama-batched-bench hung in its first step). So before such a call no new
 * job is let in, and those queued are issued first: then every wait on the
 * GPU is met by copies already on the copy stream. (A free of a tensor
 * whose mirror is being made waits for the piece under way in uvm/'s own
 * books: wo_uvm_copy_live.) */
static void gate_begin(void *by, unsigned raised)
{
    if (raised == 1 &&
        __atomic_load_n(&dm.started, __ATOMIC_ACQUIRE)) { /* the stall report's */
        __atomic_store_n(&dm.gate_since, now_ns(), __ATOMIC_RELAXED);
        __atomic_store_n(&dm.gate_by, by, __ATOMIC_RELAXED);
        /* mth_on and mth were set before started was published */
        __atomic_store_n(&dm.gate_mirror, dm.mth_on && pthread_equal(pthread_self(), dm.mth),
                         __ATOMIC_RELAXED);
    }
    drain();
}

static void gate_end(unsigned left)
{
    if (left == 0)
        __atomic_store_n(&dm.gate_since, 0, __ATOMIC_RELAXED);
}

void wo_dma_figs(struct wo_dma_figs *f)
{
    pthread_mutex_lock(&dm.lock);
    *f = dm.f;
    pthread_mutex_unlock(&dm.lock);
}

void wo_dma_stop(const struct wo_driver *d)
{
    (void)d;
    pthread_mutex_lock(&dm.lock);
    __atomic_store_n(&dm.stop, true, __ATOMIC_RELAXED); /* read without the lock too */
    pthread_cond_broadcast(&dm.cv);
    pthread_cond_broadcast(&dm.mcv);
    pthread_cond_broadcast(&dm.wcv);
    pthread_mutex_unlock(&dm.lock);
    if (dm.th_on)
        pthread_join(dm.th, NULL);
    if (dm.mth_on)
        pthread_join(dm.mth, NULL);
    if (dm.wth_on)
        pthread_join(dm.wth, NULL);
    dm.th_on = dm.mth_on = dm.wth_on = false;
}

void wo_dma_reset(void)
{
    memset(&dm, 0, sizeof(dm));
    pthread_mutex_init(&dm.lock, NULL);
    pthread_mutex_init(&dm.plock, NULL);
    pthread_cond_init(&dm.cv, NULL);
    pthread_cond_init(&dm.mcv, NULL);
    pthread_cond_init(&dm.wcv, NULL);
}
