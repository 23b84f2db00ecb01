/* uvm/picks-dma.c: picked copies on the copy engine (uvm/picks-dma.h). */
#include "uvm/picks-dma.h"
#include "uvm/picks-dma-int.h"

#include <inttypes.h>
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

/* ---- the copy thread ------------------------------------------------------- */

/* The flag of stream ix at seq from the host, after the copy stream's
 * writes (an earlier job's must not land after it). */
static void host_flag(unsigned ix, uint32_t seq)
{
    uint32_t have = __atomic_load_n(&wo_dm.flags[ix], __ATOMIC_ACQUIRE);

    doing(0, "cuStreamSynchronize");
    (void)wo_dm.d->cuStreamSynchronize(wo_dm.copy);
    doing(0, NULL);
    if (!reached(have, seq))
        __atomic_store_n(&wo_dm.flags[ix], seq, __ATOMIC_RELEASE);
}

/* One job whose ids are there (ok) or can never be read (!ok: a driver
 * failure, or shutdown past its drain time): the copies, then the flag. */
static void serve(struct slot *sl, bool ok)
{
    const struct wo_driver *d = wo_dm.d;
    const struct wo_picks_copy *c = &sl->j.c;
    uint64_t runs = 0, rows = 0;
    bool done = false, kernel = false, host = false;

    if (ok) {
        uint8_t pick[WO_PICKS_EXPERTS];

        wo_dma_picked(sl, pick);
        for (unsigned e = 0; e < c->n_experts; e++)
            if (sl->j.hot[e / 64] >> (e % 64) & 1)
                pick[e] = 0; /* the kernels took its row from the hot set */
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
                                    (e - first) * c->row, wo_dm.copy) == CUDA_SUCCESS;
            doing(0, NULL);
            runs += done;
            rows += done ? e - first : 0;
        }
        /* the kernels read the ids on the device, still there: the launch
         * has not run */
        CUfunction mark = __atomic_load_n(&wo_dm.mark, __ATOMIC_ACQUIRE);
        if (!done && mark)
            done = kernel =
                wo_picks_launch(d, mark, __atomic_load_n(&wo_dm.kcopy, __ATOMIC_RELAXED),
                                wo_dm.copy, c) == CUDA_SUCCESS;
    }
    doing(0, "cuStreamWriteValue32");
    CUresult wr = d->cuStreamWriteValue32_v2(
        wo_dm.copy, wo_dm.flags_dev + sl->ix * sizeof(uint32_t), sl->seq, 0);
    doing(0, NULL);
    if (wr != CUDA_SUCCESS) {
        host_flag(sl->ix, sl->seq);
        host = true;
    }
    if (!kernel && sl->j.rows)
        __atomic_add_fetch(sl->j.rows, rows, __ATOMIC_RELAXED);
    pthread_mutex_lock(&wo_dm.lock);
    if (!done) {
        wo_warn("picks: a picked copy on the copy engine failed, and the kernels could not copy "
                "it either: a launch may read rows never copied (the driver refused; every later "
                "copy uses the kernels)");
        wo_dm.broken = true;
    }
    wo_dm.f.jobs += !kernel && done;
    wo_dm.f.kernel += kernel;
    wo_dm.f.runs += runs;
    wo_dm.f.bytes += rows * c->row;
    wo_dm.f.host_flags += host;
    pthread_mutex_unlock(&wo_dm.lock);
}

/* The head job of stream ix, or NULL. */
static struct slot *head_of(unsigned ix)
{
    struct slot *sl = NULL;

    pthread_mutex_lock(&wo_dm.lock);
    if (wo_dm.q[ix].head != wo_dm.q[ix].tail)
        sl = &wo_dm.s[wo_dm.q[ix].ring[wo_dm.q[ix].head % SLOTS]];
    pthread_mutex_unlock(&wo_dm.lock);
    return sl;
}

static void *worker(void *arg)
{
    uint64_t drain_end = 0;
    long nap = POLL_MIN_NS;

    (void)arg;
    (void)prctl(PR_SET_TIMERSLACK, 1000ul, 0, 0, 0);
    (void)wo_dm.d->cuCtxSetCurrent(wo_dm.ctx);
    for (;;) {
        bool any = false;

        pthread_mutex_lock(&wo_dm.lock);
        while (!wo_dm.queued && !wo_dm.stop)
            pthread_cond_wait(&wo_dm.cv, &wo_dm.lock);
        if (!wo_dm.queued) {
            pthread_mutex_unlock(&wo_dm.lock);
            break;
        }
        if (wo_dm.stop && !drain_end)
            drain_end = now_ns() + DRAIN_NS;
        pthread_mutex_unlock(&wo_dm.lock);
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
                CUresult r = wo_dm.d->cuEventQuery(sl->ev);
                doing(0, NULL);

                if (r == CUDA_ERROR_NOT_READY && !(drain_end && now_ns() > drain_end))
                    break;
                pthread_mutex_lock(&wo_dm.lock);
                wo_dm.serving = r == CUDA_SUCCESS ? sl : NULL; /* its ids there: rescuable */
                pthread_mutex_unlock(&wo_dm.lock);
                serve(sl, r == CUDA_SUCCESS);
                pthread_mutex_lock(&wo_dm.lock);
                bool rescued = sl->rescued;
                wo_dm.serving = NULL;
                wo_dm.served[ix] = sl->seq;
                wo_dm.served_at[ix] = now_ns();
                wo_dm.q[ix].head++;
                sl->state = S_FREE;
                wo_dm.queued--;
                pthread_mutex_unlock(&wo_dm.lock);
                if (rescued) {
                    /* its late copies landed before the kernels fill a buffer again */
                    doing(0, "cuStreamSynchronize");
                    (void)wo_dm.d->cuStreamSynchronize(wo_dm.copy);
                    doing(0, NULL);
                    __atomic_sub_fetch(&wo_dm.pending, 1, __ATOMIC_RELEASE);
                }
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
    (void)wo_unpin_host(wo_dm.d, h, len);
    doing(1, NULL);
}

/* Makes the mirrors asked for, one at a time: pinned memory, then the
 * tensor's bytes copied by the CPU (managed memory advised to the host
 * lies there). A mirror replaced by a newer one is left to the process's
 * end (a queued job may still copy from it). */
static void *mirrorer(void *arg)
{
    (void)arg;
    (void)wo_dm.d->cuCtxSetCurrent(wo_dm.ctx);
    pthread_mutex_lock(&wo_dm.lock);
    for (;;) {
        unsigned i;
        struct mirror want;
        void *h = NULL, *pages = NULL;
        size_t n = 0, len = 0;
        bool ok;

        while (!wo_dm.stop && wo_dm.mhead == wo_dm.mtail)
            pthread_cond_wait(&wo_dm.mcv, &wo_dm.lock);
        if (wo_dm.stop)
            break;
        i = wo_dm.mq[wo_dm.mhead++ % WO_PICKS_SPANS];
        want = wo_dm.m[i];
        pthread_mutex_unlock(&wo_dm.lock);
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
            while (!(in = wo_driver_enter()) && !__atomic_load_n(&wo_dm.stop, __ATOMIC_RELAXED)) {
                struct timespec ts = {0, 1000000};
                nanosleep(&ts, NULL);
            }
            /* both calls may wait for the context's work, holding the lock
             * the copy thread's calls need: behind the gate, as the frees
             * (this thread reads nothing meanwhile) */
            wo_uvm_quiesce_begin();
            doing(1, "cuMemHostRegister");
            ok = in && wo_pin_host(wo_dm.d, (size_t)want.bytes, pages, n, &h, &len) == CUDA_SUCCESS;
            if (!in && pages)
                munmap(pages, n); /* wo_pin_host unmaps them when it fails */
            /* a copy into the tensor noted before (its writes count, want)
             * may still be in flight on the engine's stream: the context's
             * work done first, so the mirror holds it */
            doing(1, "cuCtxSynchronize");
            if (ok && wo_dm.d->cuCtxSynchronize_v2)
                (void)wo_dm.d->cuCtxSynchronize_v2(NULL);
            else if (ok && wo_dm.d->cuCtxSynchronize)
                (void)wo_dm.d->cuCtxSynchronize();
            doing(1, NULL);
            wo_uvm_quiesce_end();
            if (in)
                wo_driver_leave();
        }
        /* read by the CPU piece by piece while the tensor's allocation is
         * live (a free of it waits for the piece under way: wo_uvm_free);
         * the engine's frees of other memory leave it be */
        bool dropped = ok && !wo_uvm_copy_live(WO_READER_MIRROR, want.rid, want.gen, want.lo,
                                               want.bytes, h, &wo_dm.stop);
        pthread_mutex_lock(&wo_dm.lock);
        if (!ok) {
            wo_dm.m[i].state = M_FAILED;
            if (!wo_dm.f.mirror_failed++)
                wo_info("picks: no pinned mirror of a %" PRIu64 " MiB expert tensor (host memory "
                        "or the driver): its picked rows are copied by the kernels",
                        want.bytes >> 20);
        } else if (dropped || wo_dm.m[i].want != want.wseq || wo_dm.m[i].lo != want.lo) {
            /* its allocation freed (its source is gone), or it was
             * written (or is new memory) while copied: asked again by the
             * next copy that wants it; the free outside the lock */
            wo_dm.f.mirror_dropped += dropped;
            if (wo_dm.m[i].lo == want.lo && wo_dm.m[i].state == M_QUEUED)
                wo_dm.m[i].state = M_NONE;
            pthread_mutex_unlock(&wo_dm.lock);
            free_own(h, len);
            pthread_mutex_lock(&wo_dm.lock);
        } else {
            wo_dm.m[i].host = h;
            wo_dm.m[i].wseq = want.wseq;
            wo_dm.m[i].state = M_READY;
            wo_dm.f.mirrors++;
            wo_dm.f.mirror_bytes += want.bytes;
        }
    }
    pthread_mutex_unlock(&wo_dm.lock);
    return NULL;
}

/* The copy engine's source for the job, or 0 (under wo_dm.lock). */
static CUdeviceptr source(uint64_t lo, uint32_t rid, uint32_t gen, unsigned span, uint64_t bytes,
                          uint32_t wseq, bool pinned)
{
    struct mirror *m = &wo_dm.m[span];

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
        wo_dm.mq[wo_dm.mtail++ % WO_PICKS_SPANS] = span;
        pthread_cond_signal(&wo_dm.mcv);
    }
    return 0;
}

/* ---- the engine's side ----------------------------------------------------- */

static void gate_begin(void *by, unsigned raised);
static void gate_end(unsigned left);

/* Under wo_dm.lock, on an engine thread. False: the kernels copy. */
static bool start(const struct wo_driver *d, CUcontext ctx)
{
    CUresult r;

    if (wo_dm.broken || wo_dm.stop)
        return false;
    if (wo_dm.started)
        return ctx == wo_dm.ctx;
    /* streams, events and pinned memory are made outside any capture */
    if (__atomic_load_n(&wo_captures_live, __ATOMIC_SEQ_CST))
        return false;
    if (!d->cuStreamWaitValue32_v2 || !d->cuStreamWriteValue32_v2 || !d->cuEventCreate ||
        !d->cuEventRecord || !d->cuEventQuery || !d->cuMemHostAlloc ||
        !d->cuMemHostGetDevicePointer_v2 || !d->cuStreamCreate || !d->cuCtxSetCurrent ||
        !d->cuStreamSynchronize || !d->cuMemcpyAsync || !d->cuMemFreeHost) {
        wo_dm.broken = true;
        wo_info("picks: the driver lacks stream memory operations: picked rows are copied by "
                "the kernels");
        return false;
    }
    /* what the copy engine does at the gate (uvm/state.c): before a job
     * can be queued */
    wo_uvm_gate_install(gate_begin, gate_end);
    wo_dm.d = d;
    wo_dm.ctx = ctx;
    r = d->cuMemHostAlloc((void **)&wo_dm.flags, WO_PICKS_STREAMS * sizeof(uint32_t),
                          CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
    if (r == CUDA_SUCCESS) {
        memset(wo_dm.flags, 0, WO_PICKS_STREAMS * sizeof(uint32_t));
        r = d->cuMemHostGetDevicePointer_v2(&wo_dm.flags_dev, wo_dm.flags, 0);
    }
    if (r == CUDA_SUCCESS)
        r = d->cuMemHostAlloc((void **)&wo_dm.rescue, RESCUE_BYTES,
                              CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
    if (r == CUDA_SUCCESS) {
        memset(wo_dm.rescue, 0, RESCUE_BYTES);
        r = d->cuMemHostGetDevicePointer_v2(&wo_dm.rescue_dev, wo_dm.rescue, 0);
    }
    if (r == CUDA_SUCCESS)
        r = d->cuStreamCreate(&wo_dm.copy, CU_STREAM_NON_BLOCKING);
    if (r == CUDA_SUCCESS && !wo_qprobe_init(d, &wo_dm.qp))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    for (unsigned k = 0; k < SLOTS && r == CUDA_SUCCESS; k++) {
        r = d->cuMemHostAlloc(&wo_dm.s[k].ids, IDS_MAX, CU_MEMHOSTALLOC_PORTABLE);
        if (r == CUDA_SUCCESS)
            r = d->cuEventCreate(&wo_dm.s[k].ev, CU_EVENT_DISABLE_TIMING);
    }
    if (r == CUDA_SUCCESS && !(wo_dm.m = calloc(WO_PICKS_SPANS, sizeof(*wo_dm.m))))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) {
        wo_dm.th_on = pthread_create(&wo_dm.th, NULL, worker, NULL) == 0;
        wo_dm.mth_on = wo_dm.th_on && pthread_create(&wo_dm.mth, NULL, mirrorer, NULL) == 0;
        wo_dm.wth_on = wo_dm.th_on && pthread_create(&wo_dm.wth, NULL, wo_dma_watchdog, NULL) == 0;
        /* named for a stall's stacks (bench/stall-stacks.sh) and the fake's
         * WOFAKE_DELAY_THREAD */
        if (wo_dm.th_on)
            (void)pthread_setname_np(wo_dm.th, "woffload-copy");
        if (wo_dm.mth_on)
            (void)pthread_setname_np(wo_dm.mth, "woffload-mirror");
        if (wo_dm.wth_on)
            (void)pthread_setname_np(wo_dm.wth, "woffload-watch");
    }
    if (r != CUDA_SUCCESS || !wo_dm.th_on) {
        /* what was made stays (a few MiB of pinned memory) */
        wo_dm.broken = true;
        wo_warn("picks: cannot set up picked copies on the copy engine (%d): picked rows are "
                "copied by the kernels",
                (int)r);
        return false;
    }
    __atomic_store_n(&wo_dm.started, true, __ATOMIC_RELEASE); /* drain reads it unlocked */
    return true;
}

/* No new job nor mirror while a free waits for the queue to drain:
 * entering first, then the look at quiescing. False: a free is under way. */
static bool gate_enter(void)
{
    __atomic_add_fetch(&wo_dm.entering, 1, __ATOMIC_SEQ_CST);
    if (!__atomic_load_n(&wo_uvm_quiescing, __ATOMIC_SEQ_CST))
        return true;
    __atomic_sub_fetch(&wo_dm.entering, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_lock(&wo_dm.lock);
    wo_dm.f.quiesced++;
    pthread_mutex_unlock(&wo_dm.lock);
    return false;
}

static void gate_leave(void)
{
    __atomic_sub_fetch(&wo_dm.entering, 1, __ATOMIC_SEQ_CST);
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

    pthread_mutex_lock(&wo_dm.plock);
    pthread_mutex_lock(&wo_dm.lock);
    bool known = wo_dm.probed_on[ix] && wo_dm.probed[ix] == e; /* another thread's probe */
    ok = wo_dm.apart[ix];
    pthread_mutex_unlock(&wo_dm.lock);
    if (known) {
        pthread_mutex_unlock(&wo_dm.plock);
        return ok;
    }
    ok = wo_qprobe_apart(d, &wo_dm.qp, e, wo_dm.copy, fill, PROBE_NS);
    for (unsigned t = 1; !ok && !wo_dm.aparts && t < PROBE_TRIES; t++) {
        CUstream fresh;
        if (d->cuStreamCreate(&fresh, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
            break;
        CUstream old = wo_dm.copy;
        pthread_mutex_lock(&wo_dm.lock);
        wo_dm.copy = fresh; /* nothing queued: the copy thread is not in serve() */
        wo_dm.f.copy_streams++;
        pthread_mutex_unlock(&wo_dm.lock);
        if (d->cuStreamDestroy_v2)
            (void)d->cuStreamDestroy_v2(old); /* its probe's write still runs */
        ok = wo_qprobe_apart(d, &wo_dm.qp, e, fresh, fill, PROBE_NS);
    }
    wo_dm.aparts += ok;
    pthread_mutex_lock(&wo_dm.lock);
    wo_dm.probed[ix] = e;
    wo_dm.probed_on[ix] = true;
    wo_dm.apart[ix] = ok;
    wo_dm.f.probes++;
    if (!ok && !wo_dm.f.shared_queues++)
        wo_info("picks: an engine stream shares the driver's work queue with the copy stream "
                "(CUDA_DEVICE_MAX_CONNECTIONS, 8 by default): a stream wait there would hold the "
                "copies it waits for, so the kernels copy that stream's picked rows");
    pthread_mutex_unlock(&wo_dm.lock);
    pthread_mutex_unlock(&wo_dm.plock);
    return ok;
}

/* wo_dma_enqueue's body, while counted in wo_dm.entering (idb: the ids' bytes). */
static bool enqueue_job(const struct wo_driver *d, CUcontext ctx, unsigned ix, CUstream stream,
                        const struct wo_dma_job *j, CUfunction mark, CUfunction copy,
                        CUfunction fill, uint64_t idb)
{
    const struct wo_picks_copy *c = &j->c;
    struct slot *sl = NULL;
    CUdeviceptr src;
    uint32_t seq;

    pthread_mutex_lock(&wo_dm.lock);
    if (mark && !wo_dm.mark) {
        /* the copy thread reads them without the lock: kcopy first */
        __atomic_store_n(&wo_dm.kcopy, copy, __ATOMIC_RELAXED);
        __atomic_store_n(&wo_dm.mark, mark, __ATOMIC_RELEASE);
    }
    if (!start(d, ctx) ||
        !(src = source(c->src, j->rid, j->gen, j->span, c->row * c->n_experts, j->wseq,
                      j->pinned))) {
        pthread_mutex_unlock(&wo_dm.lock);
        return false;
    }
    /* the stream's verdict, known after its first job: no second lock */
    if (!wo_dm.probed_on[ix] || wo_dm.probed[ix] != stream) {
        pthread_mutex_unlock(&wo_dm.lock);
        if (!probe(d, ix, stream, fill))
            return false;
        pthread_mutex_lock(&wo_dm.lock);
    } else if (!wo_dm.apart[ix]) {
        pthread_mutex_unlock(&wo_dm.lock);
        return false;
    }
    for (unsigned k = 0; k < SLOTS && !sl && idb <= IDS_MAX; k++) {
        unsigned at = (wo_dm.next_free + k) % SLOTS;
        if (wo_dm.s[at].state == S_FREE) {
            sl = &wo_dm.s[at];
            wo_dm.next_free = at + 1;
        }
    }
    if (!sl) {
        wo_dm.f.no_slot++;
        pthread_mutex_unlock(&wo_dm.lock);
        return false;
    }
    sl->state = S_FILLING;
    pthread_mutex_unlock(&wo_dm.lock);
    if (wo_ids_to_host(d, fill, sl->ids, c->ids, idb, stream) != CUDA_SUCCESS ||
        d->cuEventRecord(sl->ev, stream) != CUDA_SUCCESS) {
        pthread_mutex_lock(&wo_dm.lock);
        sl->state = S_FREE;
        pthread_mutex_unlock(&wo_dm.lock);
        return false;
    }
    pthread_mutex_lock(&wo_dm.lock);
    seq = ++wo_dm.seq[ix];
    bool first = reached(__atomic_load_n(&wo_dm.flags[ix], __ATOMIC_ACQUIRE), seq - 1);
    sl->ix = ix;
    sl->seq = seq;
    sl->j = *j;
    sl->src = src;
    sl->guarded = sl->rescued = false;
    wo_dm.q[ix].ring[wo_dm.q[ix].tail++ % SLOTS] = (unsigned)(sl - wo_dm.s);
    sl->state = S_QUEUED;
    wo_dm.queued++;
    pthread_cond_signal(&wo_dm.cv);
    if (!wo_dm.said_on) {
        wo_dm.said_on = true;
        wo_info("picks: picked experts are copied on the copy engine (WOFFLOAD_PICKS_ENGINE)");
    }
    pthread_mutex_unlock(&wo_dm.lock);
    if (first) /* none outstanding: the stall report's baseline */
        wo_calls_mark(ix, seq);
    if (j->later) { /* its launch is later: the stream waits then (wo_dma_wait); not rescued */
        *j->later = seq;
        return true;
    }
    if (!wo_dma_wait(d, ix, stream, seq))
        return false;
    wo_dma_guard(d, ix, stream, seq, copy, c->dst, c->src, c->row, c->n_experts);
    return true;
}

void wo_dma_guard(const struct wo_driver *d, unsigned ix, CUstream stream, uint32_t seq,
                  CUfunction copy, CUdeviceptr dst, CUdeviceptr src, uint64_t row,
                  unsigned n_experts)
{
    CUdeviceptr marks, none = 0;
    unsigned long long rw = row;
    unsigned gen = seq;
    void *args[] = {&dst, &src, &rw, &marks, &gen, &none, &none, &none, &none, &none};

    struct slot *sl = NULL;

    if (ix >= WO_PICKS_STREAMS || !copy || !seq || !n_experts || n_experts > WO_PICKS_EXPERTS ||
        !__atomic_load_n(&wo_dm.started, __ATOMIC_ACQUIRE) || !wo_dm.rescue_dev)
        return;
    /* the job's slot, if the copy thread has not finished it (else its
     * copies are issued ahead of the flag the wait reads: no guard): the
     * stream's queue holds its jobs in seq order, one apart, from its head */
    pthread_mutex_lock(&wo_dm.lock);
    unsigned head = wo_dm.q[ix].head, queued = wo_dm.q[ix].tail - head;
    if (queued) {
        uint32_t at = seq - wo_dm.s[wo_dm.q[ix].ring[head % SLOTS]].seq;
        struct slot *c = at < queued ? &wo_dm.s[wo_dm.q[ix].ring[(head + at) % SLOTS]] : NULL;
        if (c && c->state == S_QUEUED && c->seq == seq)
            sl = c;
    }
    pthread_mutex_unlock(&wo_dm.lock);
    if (!sl)
        return;
    marks = wo_dm.rescue_dev + (CUdeviceptr)(sl - wo_dm.s) * WO_PICKS_EXPERTS * sizeof(uint32_t);
    if (d->cuLaunchKernel(copy, 1, n_experts, 1, GUARD_THREADS, 1, 1, 0, stream, args, NULL) !=
        CUDA_SUCCESS)
        return;
    pthread_mutex_lock(&wo_dm.lock);
    if (sl->state == S_QUEUED && sl->ix == ix && sl->seq == seq) /* not served and reused since */
        sl->guarded = true;
    pthread_mutex_unlock(&wo_dm.lock);
}

bool wo_dma_rescue_pending(void)
{
    return __atomic_load_n(&wo_dm.pending, __ATOMIC_ACQUIRE) != 0;
}

bool wo_dma_done(unsigned ix, uint32_t seq)
{
    uint64_t t0 = now_ns();

    if (ix >= WO_PICKS_STREAMS || !wo_dm.flags)
        return false;
    while (!reached(__atomic_load_n(&wo_dm.flags[ix], __ATOMIC_ACQUIRE), seq)) {
        if (now_ns() - t0 > HOST_WAIT_NS)
            return false;
        nanosleep(&(struct timespec){0, 20000}, NULL);
    }
    return true;
}

bool wo_dma_wait(const struct wo_driver *d, unsigned ix, CUstream stream, uint32_t seq)
{
    if (ix >= WO_PICKS_STREAMS || !wo_dm.flags_dev)
        return false;
    /* queued before the wait: on the fake driver a wait blocks its caller */
    if (d->cuStreamWaitValue32_v2(stream, wo_dm.flags_dev + ix * sizeof(uint32_t), seq,
                                  CU_STREAM_WAIT_VALUE_GEQ) == CUDA_SUCCESS)
        return true;
    /* The copy thread copies and writes the flag all the same: wait for it
     * here (the copies are done when it is written), and the launch reads
     * them; past HOST_WAIT_NS the kernels copy. The copy engine is not used
     * again. */
    bool there = wo_dma_done(ix, seq);
    pthread_mutex_lock(&wo_dm.lock);
    wo_dm.broken = true;
    wo_dm.f.waits_refused++;
    pthread_mutex_unlock(&wo_dm.lock);
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
    pthread_mutex_lock(&wo_dm.lock);
    if (start(d, ctx))
        (void)source(lo, rid, gen, span, bytes, wseq, false);
    pthread_mutex_unlock(&wo_dm.lock);
    gate_leave();
}

/* ---- the quiesce gate ------------------------------------------------------ */

/* Waits (at most QUIESCE_NS) until no job is entering and none is queued. */
static void drain(void)
{
    uint64_t t0 = 0;

    for (;;) {
        bool idle;

        if (__atomic_load_n(&wo_dm.entering, __ATOMIC_SEQ_CST) == 0) {
            /* never started (the default: off): nothing queued, and with
             * quiescing raised nothing can be until the gate's end */
            if (!__atomic_load_n(&wo_dm.started, __ATOMIC_ACQUIRE))
                return;
            pthread_mutex_lock(&wo_dm.lock);
            /* without the copy thread nothing queued can be issued */
            idle = !wo_dm.queued || !wo_dm.th_on;
            pthread_mutex_unlock(&wo_dm.lock);
            if (idle)
                return;
        }
        if (!t0) {
            t0 = now_ns();
        } else if (now_ns() - t0 > QUIESCE_NS) {
            pthread_mutex_lock(&wo_dm.lock);
            bool say = wo_dm.f.quiesce_timeouts++ == 0; /* said once */
            pthread_mutex_unlock(&wo_dm.lock);
            if (say) {
                char who[96];
                wo_dma_gate_raiser(who, sizeof(who));
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
    if (raised == 1 && __atomic_load_n(&wo_dm.started, __ATOMIC_ACQUIRE)) { /* the stall report's */
        __atomic_store_n(&wo_dm.gate_since, now_ns(), __ATOMIC_RELAXED);
        __atomic_store_n(&wo_dm.gate_by, by, __ATOMIC_RELAXED);
        /* mth_on and mth were set before started was published */
        __atomic_store_n(&wo_dm.gate_mirror,
                         wo_dm.mth_on && pthread_equal(pthread_self(), wo_dm.mth),
                         __ATOMIC_RELAXED);
    }
    drain();
}

static void gate_end(unsigned left)
{
    if (left == 0)
        __atomic_store_n(&wo_dm.gate_since, 0, __ATOMIC_RELAXED);
}

void wo_dma_figs(struct wo_dma_figs *f)
{
    pthread_mutex_lock(&wo_dm.lock);
    *f = wo_dm.f;
    pthread_mutex_unlock(&wo_dm.lock);
}

void wo_dma_stop(const struct wo_driver *d)
{
    (void)d;
    pthread_mutex_lock(&wo_dm.lock);
    __atomic_store_n(&wo_dm.stop, true, __ATOMIC_RELAXED); /* read without the lock too */
    pthread_cond_broadcast(&wo_dm.cv);
    pthread_cond_broadcast(&wo_dm.mcv);
    pthread_cond_broadcast(&wo_dm.wcv);
    pthread_mutex_unlock(&wo_dm.lock);
    if (wo_dm.th_on)
        pthread_join(wo_dm.th, NULL);
    if (wo_dm.mth_on)
        pthread_join(wo_dm.mth, NULL);
    if (wo_dm.wth_on)
        pthread_join(wo_dm.wth, NULL);
    wo_dm.th_on = wo_dm.mth_on = wo_dm.wth_on = false;
}

void wo_dma_reset(void)
{
    memset(&wo_dm, 0, sizeof(wo_dm));
    pthread_mutex_init(&wo_dm.lock, NULL);
    pthread_mutex_init(&wo_dm.plock, NULL);
    pthread_cond_init(&wo_dm.cv, NULL);
    pthread_cond_init(&wo_dm.mcv, NULL);
    pthread_cond_init(&wo_dm.wcv, NULL);
}
