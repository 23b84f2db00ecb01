/* uvm/prefetch.c: the prefetch executor (see prefetch.h): the planner's
 * actions turned into driver calls on a private stream, held back while a
 * capture is under way; and the shim's one instance, built at
 * the first launch after seal. */
#include "uvm/prefetch.h"

#include <pthread.h>
#include <string.h>

#include "core/board.h"
#include "core/log.h"
#include "core/registry.h"
#include "core/settings.h"
#include "core/trace.h"
#include "uvm/devmodel.h"
#include "uvm/executor.h"
#include "uvm/plan-budget.h"
#include "uvm/internal.h"
#include "uvm/record.h"

#define MAX_PIECE (2 * WO_GiB) /* one call stays interruptible-ish and below int limits */

struct seg {
    uint64_t off, size;
};

struct prange {
    bool live;
    bool rm; /* advised read-mostly */
    bool written;
    uint32_t gen;
    uint64_t base, size;
    uint64_t resident; /* bytes prefetched and not evicted since (the ledger hears
                        * when they cover its managed segments) */
    struct seg *segs;
    size_t nsegs;
    char *name; /* of its first managed segment (for the summary) */
};

struct wo_prefetcher {
    const struct wo_driver *drv;
    int device;
    CUcontext ctx;     /* the engine's (primary) context, or NULL */
    CUcontext own_ctx; /* its own context, when it made one */
    bool want_own;
    CUstream stream;
    bool stream_failed;
    struct wo_plan *plan;
    struct prange *r;
    uint32_t nr;
    struct wo_plan_action *held; /* waiting for a capture to end */
    size_t nheld, capheld;
    struct wo_prefetch_totals own;
    struct wo_prefetch_totals *tot;
    bool churn_warned;
    void (*between)(void); /* before each driver call that may block (wo_prefetcher_between) */
};

static void add(uint64_t *v, uint64_t n)
{
    /* relaxed: totals are statistics, read from other threads */
    __atomic_add_fetch(v, n, __ATOMIC_RELAXED);
}

int wo_prefetcher_new(const struct wo_driver *drv, const struct wo_plan_cfg *cfg, int device,
                      CUcontext ctx, struct wo_prefetcher **ret)
{
    struct wo_prefetcher *pf;
    int r;

    if (!drv || !cfg || !drv->cuMemPrefetchAsync_v2 || !drv->cuStreamCreate)
        return -EINVAL;
    pf = calloc(1, sizeof(*pf));
    if (!pf)
        return -ENOMEM;
    r = wo_plan_new(cfg, &pf->plan);
    if (r < 0) {
        free(pf);
        return r;
    }
    pf->drv = drv;
    pf->device = device;
    pf->ctx = ctx;
    pf->tot = &pf->own;
    *ret = pf;
    return 0;
}

void wo_prefetcher_free(struct wo_prefetcher *pf)
{
    if (!pf)
        return;
    if (pf->stream) {
        if (pf->drv->cuStreamSynchronize)
            pf->drv->cuStreamSynchronize(pf->stream);
        if (pf->drv->cuStreamDestroy_v2)
            pf->drv->cuStreamDestroy_v2(pf->stream);
    }
    if (pf->own_ctx && pf->drv->cuCtxDestroy_v2)
        pf->drv->cuCtxDestroy_v2(pf->own_ctx);
    for (uint32_t i = 0; i < pf->nr; i++) {
        free(pf->r[i].segs);
        free(pf->r[i].name);
    }
    free(pf->r);
    free(pf->held);
    wo_plan_free(pf->plan);
    free(pf);
}

void wo_prefetcher_own_context(struct wo_prefetcher *pf, bool on)
{
    pf->want_own = on;
}

void wo_prefetcher_between(struct wo_prefetcher *pf, void (*fn)(void))
{
    pf->between = fn;
}

const struct wo_plan *wo_prefetcher_plan(const struct wo_prefetcher *pf)
{
    return pf->plan;
}

void wo_prefetcher_totals(const struct wo_prefetcher *pf, struct wo_prefetch_totals *ret)
{
    wo_load_words(ret, pf->tot, sizeof(*ret));
}

int wo_prefetcher_add_segment(struct wo_prefetcher *pf, uint32_t id, uint32_t gen, uint64_t base,
                              uint64_t range_size, uint64_t offset, uint64_t size, int priority,
                              bool slices)
{
    struct prange *r;
    struct seg *ns;
    int ret;

    if (size == 0 || range_size == 0 || offset > range_size || size > range_size - offset)
        return -EINVAL;
    if (id >= pf->nr) {
        uint32_t n = WO_MAX(id + 1, pf->nr * 2);
        struct prange *v = realloc(pf->r, (size_t)n * sizeof(*v));

        if (!v)
            return -ENOMEM;
        memset(v + pf->nr, 0, (size_t)(n - pf->nr) * sizeof(*v));
        pf->r = v;
        pf->nr = n;
    }
    r = &pf->r[id];
    if (r->live && r->gen != gen) {
        /* the slot was reused: the old range is gone */
        wo_plan_range_remove(pf->plan, id, r->gen);
        free(r->segs);
        free(r->name);
        memset(r, 0, sizeof(*r));
    }
    for (size_t i = 0; i < r->nsegs; i++)
        if (r->segs[i].off == offset && r->segs[i].size == size)
            return 0;
    ns = realloc(r->segs, (r->nsegs + 1) * sizeof(*ns));
    if (!ns)
        return -ENOMEM;
    r->segs = ns;
    r->segs[r->nsegs++] = (struct seg){offset, size};
    if (!r->live) {
        ret = wo_plan_range_add(pf->plan, id, gen, range_size, slices ? 0 : WO_PLAN_NO_SLICES,
                                priority);
        if (ret < 0) {
            r->nsegs--;
            return ret;
        }
        r->live = true;
        r->gen = gen;
        r->base = base;
        r->size = range_size;
    }
    return 0;
}

int wo_prefetcher_name(struct wo_prefetcher *pf, uint32_t id, uint32_t gen, const char *name)
{
    struct prange *r;

    if (id >= pf->nr || !(r = &pf->r[id])->live || r->gen != gen || !name)
        return -ENOENT;
    if (r->name)
        return 0;
    r->name = strdup(name);
    return r->name ? 0 : -ENOMEM;
}

void wo_prefetcher_log_ranges(const struct wo_prefetcher *pf, unsigned max)
{
    /* the ranges that stalled most, worst first (a small selection sort:
     * this runs once, at exit) */
    bool *done = calloc(pf->nr ? pf->nr : 1, sizeof(*done));

    if (!done)
        return;
    for (unsigned k = 0; k < max; k++) {
        struct wo_plan_stats best = {0}, st;
        uint32_t bi = UINT32_MAX;

        for (uint32_t i = 0; i < pf->nr; i++) {
            if (!pf->r[i].live || done[i])
                continue;
            wo_plan_range_stats(pf->plan, i, pf->r[i].gen, &st);
            if (st.hits + st.misses == 0)
                continue;
            if (bi == UINT32_MAX || st.stall_s > best.stall_s) {
                best = st;
                bi = i;
            }
        }
        if (bi == UINT32_MAX)
            break;
        done[bi] = true;
        wo_info("prefetcher: %s: %llu hits, %llu misses, %llu MiB prefetched, %llu MiB evicted, "
                "~%.1f ms stalled on misses",
                pf->r[bi].name ? pf->r[bi].name : "(unnamed)", (unsigned long long)best.hits,
                (unsigned long long)best.misses, (unsigned long long)(best.prefetched >> 20),
                (unsigned long long)(best.evicted >> 20), best.stall_s * 1e3);
    }
    free(done);
}

/* A context of its own on the same GPU, current on the calling thread from
 * here on. A prefetch call does its migration before it returns (~40 GB/s)
 * and, from the engine's context, holds that context's launches for as long
 * (bench/prefetch-contention.cu: the engine's launch rate -17%, a traced
 * managed run +319 us on the launch gap holding a 12 MiB prefetch call,
 * +648 us for 24 MiB); from a context of its own the engine's launches run
 * on (0 to -2%). Managed memory is the process's: any context on the device
 * prefetches and advises it. The context costs device memory (~260 MiB on
 * the H100 once its stack reservation is given back). Without one (an old
 * driver, no memory left) the prefetcher works from the engine's context. */
static void own_context(struct wo_prefetcher *pf)
{
    const struct wo_driver *d = pf->drv;
    size_t free0 = 0, free1 = 0, total = 0;
    bool have_free;
    CUdevice dev;
    CUcontext c = NULL;
    CUresult res;

    have_free = pf->ctx && d->cuCtxSetCurrent && d->cuMemGetInfo_v2 &&
                d->cuCtxSetCurrent(pf->ctx) == CUDA_SUCCESS &&
                d->cuMemGetInfo_v2(&free0, &total) == CUDA_SUCCESS;
    res = d->cuDeviceGet ? d->cuDeviceGet(&dev, pf->device) : CUDA_ERROR_NOT_SUPPORTED;
    if (res == CUDA_SUCCESS)
        res = d->cuCtxCreate_v4   ? d->cuCtxCreate_v4(&c, NULL, 0, dev)
              : d->cuCtxCreate_v2 ? d->cuCtxCreate_v2(&c, 0, dev)
                                  : CUDA_ERROR_NOT_SUPPORTED;
    if (res != CUDA_SUCCESS || !c) {
        wo_warn("prefetcher: no context of its own (%s): prefetching from the engine's context, "
                "where each prefetch call holds up the engine's launches while it runs",
                wo_cu_error_name(res));
        return;
    }
    pf->own_ctx = c;
    /* it launches no kernel: no stack to reserve for every thread the GPU
     * can hold (264 of the context's 524 MiB on the H100,
     * bench/prefetch-contention.cu) */
    if (d->cuCtxSetLimit && (res = d->cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 0)) != CUDA_SUCCESS)
        wo_debug("prefetcher: its context keeps its stack reservation (%s)", wo_cu_error_name(res));
    if (have_free && d->cuMemGetInfo_v2(&free1, &total) == CUDA_SUCCESS && free1 <= free0)
        wo_info("prefetcher: a context of its own on device %d (%zu MiB of device memory)",
                pf->device, (free0 - free1) >> 20);
    else
        wo_info("prefetcher: a context of its own on device %d", pf->device);
}

static int ensure_stream(struct wo_prefetcher *pf)
{
    CUcontext use;
    CUresult res;

    if (pf->stream)
        return 0;
    if (pf->stream_failed)
        return -EIO;
    if (pf->want_own && !pf->own_ctx)
        own_context(pf);
    use = pf->own_ctx ? pf->own_ctx : pf->ctx;
    if (use && pf->drv->cuCtxSetCurrent)
        pf->drv->cuCtxSetCurrent(use);
    /* non-blocking: never orders against the engine's legacy default stream */
    res = pf->drv->cuStreamCreate(&pf->stream, CU_STREAM_NON_BLOCKING);
    if (res != CUDA_SUCCESS) {
        pf->stream = NULL;
        pf->stream_failed = true;
        wo_warn("prefetcher: no stream of its own (%s): prefetching is off", wo_cu_error_name(res));
        return -EIO;
    }
    return 0;
}

static CUresult advise(struct wo_prefetcher *pf, uint64_t p, uint64_t n, CUmem_advise a)
{
    CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, pf->device};

    if (!pf->drv->cuMemAdvise_v2)
        return CUDA_ERROR_NOT_SUPPORTED;
    return pf->drv->cuMemAdvise_v2((CUdeviceptr)p, (size_t)n, a, loc);
}

/* [p, p+n) becomes plain: read-mostly off, which collapses a GPU copy to
 * the host one (synchronous; no PCIe traffic: the host copy is current for
 * read-only data) and drops the GPU's mapping, then mapped for the GPU
 * again so that the next kernel reads it in place at ~50 GB/s; left to
 * faults, that first read runs at ~1.4 GB/s (bench/managed-read-cost.cu).
 * A collapsed piece stays plain until prefetched again. */
static CUresult make_plain(struct wo_prefetcher *pf, uint64_t p, uint64_t n)
{
    CUresult res = advise(pf, p, n, CU_MEM_ADVISE_UNSET_READ_MOSTLY);

    return res == CUDA_SUCCESS ? advise(pf, p, n, CU_MEM_ADVISE_SET_ACCESSED_BY) : res;
}

/* The range becomes plain over every segment (the engine writes it: it is
 * evicted by copy-back from now on). */
static void range_plain(struct wo_prefetcher *pf, struct prange *r)
{
    for (size_t i = 0; i < r->nsegs; i++) {
        if (pf->between)
            pf->between();
        if (make_plain(pf, r->base + r->segs[i].off, r->segs[i].size) != CUDA_SUCCESS)
            add(&pf->tot->errors, 1);
    }
    r->rm = false;
}

/* What the executor did, into the trace (WOFFLOAD_TRACE; uvm/record.c), on
 * the consumer thread like every recorded event: prefetches and evictions
 * (from/to: where the bytes were and went: managed host copy, GPU, a
 * collapse back to the read-mostly host copy, a copy-back to host) and the
 * step boundaries the planner found. Replaying a trace can then compare
 * its planner's actions with the ones the run took. */
static void record(uint16_t type, uint64_t base, uint64_t off, uint64_t len, uint32_t from,
                   uint32_t to)
{
    struct wo_event ev;
    struct wo_range rr;

    if (!wo_settings()->trace)
        return; /* not recording: no registry lookup */
    memset(&ev, 0, sizeof(ev));
    ev.type = type;
    ev.t_ns = wo_now_ns();
    if (type != WO_EV_STEP) {
        if (wo_registry_find(base, &rr) < 0)
            return;
        ev.p.id = rr.id;
        ev.p.gen = rr.gen;
        ev.p.offset = off;
        ev.p.bytes = len;
        ev.p.from = from;
        ev.p.to = to;
    }
    wo_record_event(&ev, NULL);
}

static void piece(struct wo_prefetcher *pf, struct prange *r, const struct wo_plan_action *a,
                  uint64_t off, uint64_t len)
{
    CUmemLocation gpu = {CU_MEM_LOCATION_TYPE_DEVICE, pf->device};
    CUmemLocation host = {CU_MEM_LOCATION_TYPE_HOST, 0};
    uint64_t p = r->base + off;
    CUresult res = CUDA_SUCCESS;

    if (pf->between)
        pf->between();
    if (a->type == WO_PLAN_PREFETCH) {
        /* Read-mostly only on the pieces that get a GPU copy: a kernel's
         * read of a read-mostly piece without one faults and makes one
         * (~9 GB/s, outside the budget: bench/managed-read-cost.cu), while
         * a plain piece is read in place over PCIe (~50 GB/s). */
        if (r->rm)
            res = advise(pf, p, len, CU_MEM_ADVISE_SET_READ_MOSTLY);
        if (res == CUDA_SUCCESS)
            res = pf->drv->cuMemPrefetchAsync_v2((CUdeviceptr)p, (size_t)len, gpu, 0, pf->stream);
        if (res == CUDA_SUCCESS) {
            add(&pf->tot->prefetches, 1);
            add(&pf->tot->prefetch_bytes, len);
        }
    } else if (r->rm) {
        res = make_plain(pf, p, len); /* the collapse */
        if (res == CUDA_SUCCESS) {
            add(&pf->tot->evictions, 1);
            add(&pf->tot->collapses, 1);
            add(&pf->tot->evict_bytes, len);
        }
    } else {
        res = pf->drv->cuMemPrefetchAsync_v2((CUdeviceptr)p, (size_t)len, host, 0, pf->stream);
        if (res == CUDA_SUCCESS) {
            add(&pf->tot->evictions, 1);
            add(&pf->tot->copy_backs, 1);
            add(&pf->tot->evict_bytes, len);
        }
    }
    if (res == CUDA_SUCCESS) {
        uint64_t managed = 0;

        if (a->type == WO_PLAN_PREFETCH)
            r->resident += len;
        else
            r->resident -= WO_MIN(len, r->resident);
        for (size_t i = 0; i < r->nsegs; i++)
            managed += r->segs[i].size;
        wo_budget_note_resident((uint32_t)(r - pf->r), r->gen,
                                managed && r->resident >= managed);
    }
    if (res == CUDA_SUCCESS)
        record(a->type == WO_PLAN_PREFETCH ? WO_EV_PREFETCH : WO_EV_EVICT, r->base, off, len,
               a->type == WO_PLAN_PREFETCH ? WO_TRACE_PLACE_MANAGED : WO_TRACE_PLACE_DEVICE,
               a->type == WO_PLAN_PREFETCH ? WO_TRACE_PLACE_DEVICE
               : r->rm                      ? WO_TRACE_PLACE_MANAGED
                                            : WO_TRACE_PLACE_HOST);
    if (res != CUDA_SUCCESS) {
        /* the memory may have been freed under us (the free event is still
         * in the ring): dropping the action only costs speed */
        add(&pf->tot->errors, 1);
        wo_debug("prefetcher: %s of %llu bytes at 0x%llx: %s",
                 a->type == WO_PLAN_PREFETCH ? "prefetch" : "eviction", (unsigned long long)len,
                 (unsigned long long)p, wo_cu_error_name(res));
    }
}

/* Once: the planner moved more than the device budget in over its last
 * WO_PLAN_CHURN_STEPS steps. Its working set does not fit and residency
 * cycles, at a cost the cost rule (uvm/cost.h) is meant to refuse; say so,
 * with the knob that fixes it. */
static void churn_check(struct wo_prefetcher *pf)
{
    uint64_t moved;
    struct wo_plan_step sum;
    uint64_t n;

    if (pf->churn_warned || !wo_plan_churn(pf->plan, &moved))
        return;
    pf->churn_warned = true;
    wo_plan_step_stats(pf->plan, NULL, &sum, &n);
    wo_warn("prefetcher: moved %llu MiB onto the GPU over the last %u steps, more than the "
            "device budget: the managed working set does not fit and residency is cycling "
            "(each cycle costs several in-place reads; predicted %.1f ms a step as planned "
            "against %.1f ms read in place); raise device_budget, or set prefetch: {enabled: "
            "false} to read in place",
            (unsigned long long)(moved >> 20), WO_PLAN_CHURN_STEPS,
            n ? sum.plan_s * 1e3 / (double)n : 0.0, n ? sum.inplace_s * 1e3 / (double)n : 0.0);
}

static void exec(struct wo_prefetcher *pf, const struct wo_plan_action *a)
{
    struct prange *r;
    uint64_t end = a->offset + a->bytes;

    if (a->type == WO_PLAN_STEP) {
        add(&pf->tot->steps, 1);
        record(WO_EV_STEP, 0, 0, 0, 0, 0);
        churn_check(pf);
        return;
    }
    if (a->id >= pf->nr || !(r = &pf->r[a->id])->live || r->gen != a->gen || ensure_stream(pf) < 0)
        return;
    /* a range evicted by collapse: its pieces go read-mostly as they are
     * prefetched (piece()) */
    if (a->type == WO_PLAN_PREFETCH && a->how == WO_PLAN_COLLAPSE && !r->rm && !r->written)
        r->rm = true;
    /* only the managed segments of the range move; whole pieces of them */
    for (size_t i = 0; i < r->nsegs; i++) {
        uint64_t lo = WO_MAX(a->offset, r->segs[i].off);
        uint64_t hi = WO_MIN(end, r->segs[i].off + r->segs[i].size);

        for (uint64_t o = lo; o < hi; o += MAX_PIECE)
            piece(pf, r, a, o, WO_MIN(hi - o, MAX_PIECE));
    }
}


static void hold(struct wo_prefetcher *pf, const struct wo_plan_action *a)
{
    if (pf->nheld == pf->capheld) {
        size_t n = pf->capheld ? pf->capheld * 2 : 64;
        struct wo_plan_action *v = realloc(pf->held, n * sizeof(*v));

        if (!v)
            return; /* dropped: the planner believes it done; only speed suffers */
        pf->held = v;
        pf->capheld = n;
    }
    pf->held[pf->nheld++] = *a;
    add(&pf->tot->deferred, 1);
}

void wo_prefetcher_tick(struct wo_prefetcher *pf)
{
    if (!pf->nheld || !wo_driver_enter())
        return;
    for (size_t i = 0; i < pf->nheld; i++)
        exec(pf, &pf->held[i]);
    pf->nheld = 0;
    wo_driver_leave();
}

static void drain(struct wo_prefetcher *pf)
{
    struct wo_plan_action a;

    wo_prefetcher_tick(pf);
    while (wo_plan_pop(pf->plan, &a) == 1) {
        /* a capture is under way (uvm.h: the handshake): hold it */
        if (pf->nheld || !wo_driver_enter()) {
            hold(pf, &a);
        } else {
            exec(pf, &a);
            wo_driver_leave();
        }
    }
}

static struct prange *range_at(struct wo_prefetcher *pf, uint64_t addr, uint32_t *id)
{
    for (uint32_t i = 0; i < pf->nr; i++) {
        struct prange *r = &pf->r[i];

        if (r->live && addr >= r->base && addr - r->base < r->size) {
            *id = i;
            return r;
        }
    }
    return NULL;
}

static void forget(struct wo_prefetcher *pf, uint32_t id)
{
    struct prange *r = &pf->r[id];
    size_t j = 0;

    wo_plan_range_remove(pf->plan, id, r->gen);
    wo_budget_note_resident(id, r->gen, false);
    for (size_t i = 0; i < pf->nheld; i++)
        if (pf->held[i].id != id || pf->held[i].gen != r->gen)
            pf->held[j++] = pf->held[i];
    pf->nheld = j;
    free(r->segs);
    free(r->name);
    memset(r, 0, sizeof(*r));
}

void wo_prefetcher_event(struct wo_prefetcher *pf, const struct wo_event *ev)
{
    struct prange *r;
    uint32_t id;

    switch (ev->type) {
    case WO_EV_FREE:
        if ((r = range_at(pf, ev->a.base, &id)) && r->base == ev->a.base)
            forget(pf, id);
        return;
    case WO_EV_COPY:
        /* the engine writes this range: read-mostly duplicates of it would
         * be invalidated on every write, and copy-back is the right eviction */
        if ((ev->c.kind == WO_COPY_H2D || ev->c.kind == WO_COPY_D2D || ev->c.kind == WO_COPY_DEFAULT) &&
            (r = range_at(pf, ev->c.dst, &id)) && !r->written) {
            r->written = true;
            wo_plan_range_written(pf->plan, id, r->gen);
            if (r->rm && wo_driver_enter()) {
                if (ensure_stream(pf) == 0) /* a current context */
                    range_plain(pf, r);
                wo_driver_leave();
            }
        }
        return;
    case WO_EV_LAUNCH:
    case WO_EV_CAPTURE_BEGIN:
    case WO_EV_CAPTURE_END:
    case WO_EV_GRAPH_INSTANTIATE:
    case WO_EV_GRAPH_LAUNCH:
        if (wo_plan_event(pf->plan, ev) < 0)
            wo_log_once(WO_LOG_WARN, "prefetcher: out of memory; it learns less from now on");
        drain(pf);
        return;
    default:
        return;
    }
}

/* ---- the shim's instance --------------------------------------------------- */

static struct wo_prefetcher *shim;
static bool shim_tried;
static bool shim_rescan;
static struct wo_prefetch_totals shim_totals;

static int add_seg_cb(const struct wo_uvm_segment *s, void *ud)
{
    struct wo_prefetcher *pf = ud;
    struct wo_range rg;

    /* the registry knows the allocation's size (segments are tags in it) */
    if (wo_registry_get(s->id, &rg) < 0 || rg.gen != s->gen)
        return 0;
    if (wo_budget_claimed(s->id, s->gen))
        return 0; /* staged into device slots by the streaming executor */
    if (wo_prefetcher_add_segment(pf, s->id, s->gen, rg.base, rg.size, s->offset, s->size,
                                  s->priority, s->slices != WO_SLICES_NONE) == -ENOMEM ||
        wo_prefetcher_name(pf, s->id, s->gen, s->name) == -ENOMEM)
        return -ENOMEM;
    return 0;
}

/* The streaming executor took a managed range (plan-budget.h): its GPU
 * copy goes (collapse or copy-back, as the planner would) and the planner
 * forgets it. During a capture the copy stays, outside the
 * budget, until the range is freed: only device memory is lost, never
 * data. */
static void budget_drop(uint32_t id, uint32_t gen)
{
    struct prange *r;

    if (id < shim->nr && (r = &shim->r[id])->live && r->gen == gen) {
        struct wo_plan_action a = {.type = WO_PLAN_EVICT,
                                   .how = wo_plan_range_how(shim->plan, id, gen),
                                   .id = id,
                                   .gen = gen,
                                   .offset = 0,
                                   .bytes = r->size};
        if (wo_driver_enter()) {
            exec(shim, &a);
            wo_driver_leave();
        } else {
            wo_debug("prefetcher: a range handed to the streaming executor keeps its GPU copy "
                     "(a capture is under way)");
        }
        forget(shim, id);
    }
}

struct readmit {
    struct wo_prefetcher *pf;
    uint32_t id, gen;
};

static int readmit_cb(const struct wo_uvm_segment *s, void *ud)
{
    const struct readmit *a = ud;

    return s->id == a->id && s->gen == a->gen ? add_seg_cb(s, a->pf) : 0;
}

/* The other way: a managed range the streaming executor gave back is
 * listed again (new to the planner: its frequencies are learned again). */
static void budget_admit(uint32_t id, uint32_t gen)
{
    struct readmit a = {shim, id, gen};

    if (wo_uvm_foreach_managed(readmit_cb, &a) < 0)
        wo_warn("prefetcher: out of memory taking a managed range back from the streaming "
                "executor; it is read in place");
}

/* The planner's budget changed: its evictions go out now, before the
 * streaming executor's slots grow into the room. */
static void budget_run(void)
{
    drain(shim);
}

static const struct wo_budget_resident budget_ops = {
    .drop = budget_drop,
    .admit = budget_admit,
    .run = budget_run,
};

/* The cost rule weighs moves at this machine's rates when a calibrated
 * model names them (WOFFLOAD_DEVICE_MODEL, written by woffload-calibrate);
 * a model that cannot be read is reported with its file:line and the
 * built-in figures stay. */
static void load_device_model(struct wo_plan_costs *c)
{
    const char *path = wo_settings()->device_model;
    struct wo_devmodel m;
    char err[512];

    if (!path)
        return;
    if (wo_devmodel_load(path, &m, err, sizeof(err)) < 0) {
        wo_warn("WOFFLOAD_DEVICE_MODEL: %s; the prefetcher weighs moves with the built-in H100 "
                "figures", err);
        return;
    }
    wo_devmodel_plan_costs(&m, c);
    wo_info("prefetcher: device model %s (%s)", path, m.name);
}

static void shim_setup(void)
{
    const struct wo_driver *drv = wo_uvm_driver();
    const struct wo_policy *pol = wo_uvm_policy();
    const struct wo_policy_globals *g = pol ? wo_policy_globals(pol) : NULL;
    struct wo_plan_cfg cfg;
    CUcontext ctx = NULL;
    CUdevice dev = 0;
    int r;

    shim_tried = true;
    if (!drv || !g || !wo_settings()->prefetch || !g->prefetch.enabled)
        return;
    wo_plan_cfg_default(&cfg);
    /* the streaming executor's slots come out of the same budget */
    cfg.budget = wo_budget_for_plan();
    wo_plan_cfg_policy(&cfg, g);
    load_device_model(&cfg.costs);
    /* wo_uvm.device is set once, by the first served allocation, long
     * before seal: reading it here without the lock is benign. The primary
     * context reference is kept for the life of the process (the engine
     * holds one too). */
    if (drv->cuDeviceGet && drv->cuDevicePrimaryCtxRetain &&
        drv->cuDeviceGet(&dev, wo_uvm.device) == CUDA_SUCCESS)
        drv->cuDevicePrimaryCtxRetain(&ctx, dev);
    r = wo_prefetcher_new(drv, &cfg, wo_uvm.device, ctx, &shim);
    if (r < 0) {
        wo_warn("prefetcher: not started: %s", strerror(-r));
        return;
    }
    shim->tot = &shim_totals;
    wo_budget_resident(shim->plan, &budget_ops);
    /* Under fit with the rest on the host, managed memory is only the
     * staging room lent to weights while the slots stay empty: a context of
     * its own would cost more device memory than it moves (131 MiB on the
     * H200 against 74 MiB lent in bigload-gpu, outside fit's budget), so
     * the few prefetches run from the engine's context. */
    bool own = wo_settings()->prefetch_own_ctx;
    if (own && wo_uvm.g && wo_uvm.g->fit.enabled && wo_uvm.g->fit.rest != WO_PLACE_MANAGED) {
        own = false;
        wo_info("prefetcher: no context of its own under fit with the rest on the host (it would "
                "take device memory outside fit's budget for the lent weights alone)");
    }
    wo_prefetcher_own_context(shim, own);
    /* a prefetch or collapse call can take milliseconds: the engine's
     * events wait in the consumer's backlog instead of filling the ring */
    wo_prefetcher_between(shim, wo_consumer_relieve);
    if (wo_uvm_foreach_managed(add_seg_cb, shim) < 0)
        wo_warn("prefetcher: out of memory listing managed ranges; some are not prefetched");
    wo_info("prefetcher: device budget %llu MiB, pieces >= %llu MiB, hot set %s",
            (unsigned long long)(cfg.budget >> 20), (unsigned long long)(cfg.piece >> 20),
            cfg.hot_set ? "on" : "off");
}

/* ---- per-name figures for the stats JSON ------------------------------------
 * The planner belongs to the consumer thread; woffload_stats() runs on any
 * thread. So the consumer publishes a copy of the planner's per-range
 * figures, at most every 100 ms and at exit, under its own lock. */

static struct wo_board names_board = WO_BOARD_INIT(struct wo_plan_stats);
/* the step figures, published with the names (under the board's lock) */
static struct wo_prefetch_steps steps_pub;

static void publish_steps(void *ud)
{
    struct wo_prefetcher *pf = ud;

    wo_plan_step_stats(pf->plan, &steps_pub.last, &steps_pub.sum, &steps_pub.steps);
    steps_pub.budget = wo_uvm_device_budget();
}

static void publish(struct wo_prefetcher *pf, bool force)
{
    struct wo_board_draft d;

    if (!pf || !wo_board_begin(&names_board, &d, pf->nr, force))
        return;
    for (uint32_t i = 0; i < pf->nr; i++) {
        struct wo_plan_stats *st;
        if (!pf->r[i].live)
            continue;
        if (!(st = wo_board_add(&d, pf->r[i].name)))
            break;
        wo_plan_range_stats(pf->plan, i, pf->r[i].gen, st);
    }
    wo_board_publish(&names_board, &d, publish_steps, pf);
}

struct foreach_name {
    void (*fn)(void *ud, const char *name, const struct wo_plan_stats *st);
    void *ud;
};

static void foreach_name(void *ud, const char *name, const void *st)
{
    struct foreach_name *f = ud;

    f->fn(f->ud, name, st);
}

void wo_prefetch_foreach_name(void (*fn)(void *ud, const char *name, const struct wo_plan_stats *st),
                              void *ud)
{
    struct foreach_name f = {fn, ud};

    wo_board_foreach(&names_board, foreach_name, &f);
}

static void copy_steps(void *ud)
{
    *(struct wo_prefetch_steps *)ud = steps_pub;
}

void wo_prefetch_step_figures(struct wo_prefetch_steps *ret)
{
    wo_board_locked(&names_board, copy_steps, ret);
}

/* Under fit the prefetcher's managed ranges are the slots' room lent to
 * weights (rest: host). It evicts them once the slots stream, and UVM
 * keeps their device pages while the slots' allocations take the free
 * memory: the bytes evicted and not prefetched since go back through fit's
 * squeeze (wo_place_fit_squeeze_lent), at least LENT_SQUEEZE_MIN of them
 * and at most once every LENT_SQUEEZE_GAP_NS (a squeeze allocates the
 * device's free memory for a moment; llama-server's prefetcher moved the
 * lent output.weight in and out 4 times in 40 s). */
#define LENT_SQUEEZE_MIN (2ull << 20)
#define LENT_SQUEEZE_GAP_NS 1000000000ull
static uint64_t lent_out_seen, lent_in_seen, lent_squeezed_ns;

static void give_back_lent(void)
{
    uint64_t out = __atomic_load_n(&shim_totals.evict_bytes, __ATOMIC_RELAXED);
    uint64_t in = __atomic_load_n(&shim_totals.prefetch_bytes, __ATOMIC_RELAXED);
    uint64_t now;

    if (!wo_uvm.g || !wo_uvm.g->fit.enabled || !wo_uvm.fit.lent_bytes || wo_uvm.fit.returned)
        return;
    if (in - lent_in_seen >= out - lent_out_seen) {
        /* as much moved in since: the cache's pages were taken back */
        lent_out_seen = out;
        lent_in_seen = in;
        return;
    }
    now = wo_now_ns();
    if ((out - lent_out_seen) - (in - lent_in_seen) < LENT_SQUEEZE_MIN ||
        now - lent_squeezed_ns < LENT_SQUEEZE_GAP_NS)
        return;
    /* the collapses ran at once; copy-backs are queued on the prefetcher's
     * stream. No driver call while a capture is under way: at a later
     * event */
    if (!wo_driver_enter())
        return;
    if (shim->stream && wo_uvm_driver()->cuStreamSynchronize)
        (void)wo_uvm_driver()->cuStreamSynchronize(shim->stream);
    wo_driver_leave();
    if (!wo_place_fit_squeeze_lent((out - lent_out_seen) - (in - lent_in_seen)))
        return; /* a capture began meanwhile: at a later event */
    lent_out_seen = out;
    lent_in_seen = in;
    lent_squeezed_ns = now;
}

static void on_event(const struct wo_event *ev)
{
    if (!shim) {
        /* the budget is resolved at seal: before that nothing is managed */
        if (shim_tried || ev->type != WO_EV_LAUNCH || wo_uvm_device_budget() == 0)
            return;
        shim_setup();
        if (!shim)
            return;
    }
    if (ev->type == WO_EV_TAG || ev->type == WO_EV_ALLOC || ev->type == WO_EV_PLACE) {
        shim_rescan = true; /* new managed memory after seal */
        return;
    }
    if (shim_rescan && ev->type == WO_EV_LAUNCH) {
        shim_rescan = false;
        wo_uvm_foreach_managed(add_seg_cb, shim);
    }
    wo_prefetcher_event(shim, ev);
    give_back_lent();
    publish(shim, false);
}

static __attribute__((used)) struct wo_prefetcher *parents_prefetcher;

static void atfork_child(void)
{
    /* the parent's stream and context mean nothing here, and the thread
     * that owned the prefetcher is gone: drop it without a driver call
     * (its memory is the parent's copy; leaking it once is the safe side).
     * Kept reachable so leak checkers do not report the deliberate leak. */
    parents_prefetcher = shim;
    shim = NULL;
    wo_budget_resident(NULL, NULL);
    shim_tried = false;
    shim_rescan = false;
    lent_out_seen = lent_in_seen = lent_squeezed_ns = 0;
}

static void tick(void)
{
    if (shim) {
        wo_budget_tick();
        wo_prefetcher_tick(shim);
        give_back_lent();
        publish(shim, false);
    }
}

static void finish(void)
{
    struct wo_prefetch_totals t;

    if (!shim)
        return;
    publish(shim, true);
    wo_prefetcher_totals(shim, &t);
    wo_info("prefetcher: %llu steps, %llu prefetches (%llu MiB), %llu evictions (%llu MiB: %llu "
            "collapses, %llu copy-backs), %llu held during captures, %llu failed calls",
            (unsigned long long)t.steps, (unsigned long long)t.prefetches,
            (unsigned long long)(t.prefetch_bytes >> 20), (unsigned long long)t.evictions,
            (unsigned long long)(t.evict_bytes >> 20), (unsigned long long)t.collapses,
            (unsigned long long)t.copy_backs, (unsigned long long)t.deferred,
            (unsigned long long)t.errors);
    {
        struct wo_prefetch_steps f;

        wo_prefetch_step_figures(&f);
        if (f.steps)
            wo_info("prefetcher: per step %.1f MiB moved in, %.1f MiB out (%.1f%% of the device "
                    "budget); managed reads predicted %.3f ms a step as planned, %.3f ms read in "
                    "place (uvm/cost.h)",
                    (double)f.sum.in_bytes / (double)f.steps / WO_MiB,
                    (double)f.sum.out_bytes / (double)f.steps / WO_MiB,
                    f.budget ? 100.0 * (double)f.sum.in_bytes / (double)f.steps / (double)f.budget
                             : 0.0,
                    f.sum.plan_s * 1e3 / (double)f.steps, f.sum.inplace_s * 1e3 / (double)f.steps);
    }
    wo_prefetcher_log_ranges(shim, 10);
    /* finish runs at exit, possibly after the driver's own teardown: no
     * driver call here; the stream and the prefetcher's context go with
     * the process */
    shim->stream = NULL;
    shim->own_ctx = NULL;
    wo_budget_resident(NULL, NULL);
    wo_prefetcher_free(shim);
    shim = NULL;
    shim_tried = false;
}

void wo_prefetch_totals(struct wo_prefetch_totals *ret)
{
    wo_load_words(ret, &shim_totals, sizeof(*ret));
}

const struct wo_executor wo_prefetch_executor = {
    .name = "prefetch",
    .on_event = on_event,
    .tick = tick,
    .finish = finish,
    .atfork_child = atfork_child,
};
