/* uvm/stream-slots.c: the streaming executor's device slots (see
 * stream-int.h): the engine's context pushed around driver calls, the copy
 * kernel, the slots' sizes for the ranges streamed now, making, growing and
 * shrinking them (quiesced first), and the device budget they take. */
#include "uvm/stream-int.h"

#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "uvm/plan-budget.h"
#include "uvm/stream-check.h"
#include "uvm/stream-pin.h"

/* ---- driver access ------------------------------------------------------------ */

/* The slots, events and copy stream live in the engine's context (a
 * kernel reads only memory of its context, and an event is recorded only
 * on a stream of its own context); the prefetcher may keep a context of
 * its own current on this thread: it is put back after. */
CUcontext wo_sx_push_ctx(void)
{
    CUcontext prev = NULL;

    if (wo_sx->drv->cuCtxGetCurrent)
        wo_sx->drv->cuCtxGetCurrent(&prev);
    if (prev != wo_sx->ctx && wo_sx->drv->cuCtxSetCurrent)
        wo_sx->drv->cuCtxSetCurrent(wo_sx->ctx);
    return prev;
}

void wo_sx_pop_ctx(CUcontext prev)
{
    if (prev != wo_sx->ctx && wo_sx->drv->cuCtxSetCurrent)
        wo_sx->drv->cuCtxSetCurrent(prev);
}

static void slots_fail(const char *why, CUresult res)
{
    wo_sx->slots_failed = true;
    wo_warn("stream: %s (%s): streamed ranges are read in place", why, wo_cu_error_name(res));
}

/* The copy of a managed range: cuMemcpyAsync from managed memory advised to
 * the host moves 7-9 GB/s on the lent H100, a kernel reading the same pages
 * in place 50 GB/s (bench/results/stream-mechanisms-20261125-h100-kernel-
 * copy.txt). The kernel is uvm/stream-copy.cu's PTX, loaded into the slots'
 * context once; without it managed ranges are staged by cuMemcpyAsync. */
static void load_copy_kernel(void)
{
    const struct wo_driver *d = wo_sx->drv;
    CUmodule mod = NULL;
    CUresult res = CUDA_ERROR_NOT_SUPPORTED;

    if (d->cuModuleLoadData && d->cuModuleGetFunction && d->cuModuleUnload && d->cuLaunchKernel) {
        res = d->cuModuleLoadData(&mod, wo_copy_ptx());
        if (res == CUDA_SUCCESS)
            res = d->cuModuleGetFunction(&wo_sx->copy_fn, mod, "wo_stream_copy");
        if (res != CUDA_SUCCESS && mod)
            d->cuModuleUnload(mod);
        else
            wo_sx->copy_mod = mod;
    }
    if (res != CUDA_SUCCESS) {
        wo_sx->copy_fn = NULL;
        wo_info("stream: no copy kernel (%s): managed ranges are staged by cuMemcpyAsync, "
                "about a sixth of the link's speed",
                wo_cu_error_name(res));
    }
}

/* Where range id's staging copy reads from: its pinned copy once the worker
 * made one (stream-pin.h: managed ranges only; asked for here the first
 * time), else the range itself. */
CUdeviceptr wo_sx_source(uint32_t id, const struct srange *r, bool managed, bool *pinned)
{
    CUdeviceptr p =
        wo_sx->pin_on && managed ? wo_pin_source(id, r->rid, r->gen, r->base + r->lo, r->hi - r->lo) : 0;

    *pinned = p != 0;
    return p ? p : (CUdeviceptr)(r->base + r->lo);
}

/* Copies bytes from src to the slot dst on the copy stream: a managed source
 * by the copy kernel (the GPU reads it in place; 16 blocks fill the link),
 * pinned host memory (a pinned copy of a managed range included) by the
 * copy engine. */
CUresult wo_sx_copy_to_slot(CUdeviceptr dst, CUdeviceptr src, uint64_t bytes, bool managed)
{
    const struct wo_driver *d = wo_sx->drv;

    if (managed && wo_sx->copy_fn) {
        unsigned long long n = bytes;
        void *args[] = {&dst, &src, &n};
        if (!wo_sx->pin_on && !wo_sx->said_kernel) {
            wo_sx->said_kernel = true;
            wo_info("stream: pinned_copies off: managed ranges are staged by the copy kernel "
                    "(50 GB/s at most, on the engine's SMs); prefetch: {pinned_copies: auto}, "
                    "the default, copies each once into pinned memory for the copy engine "
                    "(docs/prefetch.md, Pinned copies)");
        }
        add(&wo_stream_tab.n.staged_by_kernel, 1);
        return d->cuLaunchKernel(wo_sx->copy_fn, 16, 1, 1, 512, 1, 1, 0, wo_sx->copy, args, NULL);
    }
    return d->cuMemcpyAsync(dst, src, (size_t)bytes, wo_sx->copy);
}

/* ---- copy timing -------------------------------------------------------------
 *
 * How fast the copy engine moves a staging copy while it moves it, apart
 * from how long the steps wait for copies: staging_gbs (bytes over the
 * steps' periods) mixes the two. Timing events cost the copy stream two
 * records a copy and this thread an event query each; the pairs are made
 * with the slots and go with them. Kept here, not in the executor's state,
 * which exit frees with no driver call: pairs still made then stay
 * reachable, as the slots' own events in wo_stream_tab do. */

static struct copy_time {
    CUevent a, b;
    uint64_t bytes;
} ct[WO_SX_TIMED];
static unsigned ct_head, ct_n; /* the FIFO of the pairs in flight */
static bool ct_ready;

void wo_sx_time_atfork_child(void)
{
    memset(ct, 0, sizeof(ct));
    ct_head = ct_n = 0;
    ct_ready = false;
}

static void time_make(void)
{
    const struct wo_driver *d = wo_sx->drv;
    unsigned i;

    ct_ready = false;
    ct_head = ct_n = 0;
    if (!d->cuEventCreate || !d->cuEventQuery || !d->cuEventElapsedTime || !d->cuEventDestroy_v2)
        return;
    for (i = 0; i < WO_SX_TIMED; i++)
        if (d->cuEventCreate(&ct[i].a, CU_EVENT_DEFAULT) != CUDA_SUCCESS ||
            d->cuEventCreate(&ct[i].b, CU_EVENT_DEFAULT) != CUDA_SUCCESS)
            break;
    if (i == WO_SX_TIMED) {
        ct_ready = true;
        return;
    }
    /* fewer than all: none (what was made is destroyed) */
    for (unsigned k = 0; k <= i && k < WO_SX_TIMED; k++) {
        if (ct[k].a)
            d->cuEventDestroy_v2(ct[k].a);
        if (ct[k].b)
            d->cuEventDestroy_v2(ct[k].b);
        ct[k].a = ct[k].b = NULL;
    }
}

static void time_poll(void);

void wo_sx_time_free(void)
{
    const struct wo_driver *d = wo_sx->drv;

    time_poll();
    for (unsigned k = 0; k < WO_SX_TIMED && ct_ready; k++) {
        d->cuEventDestroy_v2(ct[k].a);
        d->cuEventDestroy_v2(ct[k].b);
        ct[k].a = ct[k].b = NULL;
    }
    ct_ready = false;
    ct_head = ct_n = 0;
}

/* In the slots' context, inside wo_driver_enter(). */
static void time_poll(void)
{
    const struct wo_driver *d = wo_sx->drv;

    while (ct_ready && ct_n) {
        struct copy_time *t = &ct[ct_head];
        float ms = 0;
        CUresult r = d->cuEventQuery(t->b);

        if (r == CUDA_ERROR_NOT_READY)
            return;
        if (r == CUDA_SUCCESS && d->cuEventElapsedTime(&ms, t->a, t->b) == CUDA_SUCCESS &&
            ms >= 0) {
            add(&wo_stream_tab.n.copies_timed, 1);
            add(&wo_stream_tab.n.copies_timed_bytes, t->bytes);
            add(&wo_stream_tab.n.copies_busy_ns, (uint64_t)((double)ms * 1e6));
        }
        ct_head = (ct_head + 1) % WO_SX_TIMED;
        ct_n--;
    }
}

/* From the consumer's tick: the queries are driver calls, kept out of a
 * global capture like every other of this thread's. */
void wo_sx_time_poll(void)
{
    CUcontext prev;

    if (!ct_ready || !ct_n || !wo_driver_enter())
        return;
    prev = wo_sx_push_ctx();
    time_poll();
    wo_sx_pop_ctx(prev);
    wo_driver_leave();
}

int wo_sx_time_begin(void)
{
    unsigned i;

    if (!ct_ready)
        return -1;
    if (ct_n == WO_SX_TIMED)
        time_poll();
    if (ct_n == WO_SX_TIMED)
        return -1; /* all in flight: this copy goes untimed */
    i = (ct_head + ct_n) % WO_SX_TIMED;
    if (wo_sx->drv->cuEventRecord(ct[i].a, wo_sx->copy) != CUDA_SUCCESS)
        return -1;
    return (int)i;
}

void wo_sx_time_end(int i, uint64_t bytes)
{
    if (i < 0 || (unsigned)i != (ct_head + ct_n) % WO_SX_TIMED)
        return;
    if (wo_sx->drv->cuEventRecord(ct[i].b, wo_sx->copy) != CUDA_SUCCESS)
        return; /* never taken in: the pair is free again */
    ct[i].bytes = bytes;
    ct_n++;
}

/* "N MiB" from a MiB up, else "N KiB": the sizes the info lines give. */
static const char *size_str(uint64_t b, char buf[24])
{
    bool mib = b >= (1u << 20);

    snprintf(buf, 24, "%llu %s", (unsigned long long)(mib ? b >> 20 : b >> 10),
             mib ? "MiB" : "KiB");
    return buf;
}

/* One info line: the slots' sizes. */
static void say_slots(const char *what)
{
    char sizes[26 * WO_STREAM_MAX_SLOTS] = "", one[24];
    size_t at = 0;

    for (unsigned i = 0; i < wo_sx->nslots && at < sizeof(sizes); i++)
        at += (size_t)snprintf(sizes + at, sizeof(sizes) - at, "%s%s", i ? ", " : "",
                               size_str(wo_sx->slot_sz[i], one));
    wo_info("stream: %u device staging slots%s (%s)", wo_sx->nslots, what, sizes);
}

static void slots_shrank(void);

/* Device bytes the slots hold: their sizes once made, else what they will
 * be made with (want_sizes; before any step, every slot the largest). */
uint64_t wo_sx_slots_bytes(void)
{
    uint64_t n = 0;

    for (unsigned i = 0; i < wo_sx->nslots; i++)
        n += wo_sx->slots_ready  ? wo_sx->slot_sz[i]
             : wo_sx->want_sz[i] ? wo_sx->want_sz[i]
                                 : wo_sx->slot_size;
    return n;
}

/* The sizes (out) the slots should have for the ranges streamed now but
 * `skip` (NONE: none), in the order the last step read them
 * (wo_stream_size_slots); false when no such range is in the order. */
static bool size_for(uint32_t skip, uint64_t *out)
{
    uint64_t *v = malloc((wo_sx->norder ? wo_sx->norder : 1) * sizeof(*v));
    size_t n = 0;
    bool ok;

    for (uint32_t k = 0; v && k < wo_sx->norder; k++) {
        const struct srange *r = &wo_sx->r[wo_sx->order[k]];
        if (wo_sx->order[k] != skip && r->live && r->streamed && r->hi - r->lo <= wo_sx->slot_size)
            v[n++] = r->hi - r->lo;
    }
    ok = v && wo_stream_size_slots(v, n, wo_sx->nslots, wo_sx->slot_size, out);
    free(v);
    return ok;
}

/* want_sz for the ranges streamed now; unchanged when none is in the order
 * yet. */
void wo_sx_want_sizes(void)
{
    uint64_t out[WO_STREAM_MAX_SLOTS];

    if (size_for(NONE, out))
        for (unsigned i = 0; i < wo_sx->nslots; i++) {
            if (out[i] != wo_sx->want_sz[i])
                wo_sx->grow_failed[i] = 0;
            wo_sx->want_sz[i] = out[i];
        }
}

/* Allocates the slots, their events and the copy stream, once. */
bool wo_sx_slots(void)
{
    const struct wo_driver *d = wo_sx->drv;
    CUcontext prev;
    CUresult res = CUDA_SUCCESS;
    unsigned i;

    if (wo_sx->slots_ready || wo_sx->slots_failed)
        return wo_sx->slots_ready;
    if (!d->cuMemAlloc_v2 || !d->cuMemcpyAsync || !d->cuEventCreate || !d->cuEventRecord ||
        !d->cuStreamWaitEvent || !d->cuStreamCreate || !wo_sx->ctx || !wo_sx->slot_size) {
        slots_fail("the driver lacks a function it needs", CUDA_ERROR_NOT_SUPPORTED);
        return false;
    }
    if (!wo_driver_enter())
        return false; /* a global capture forbids cuMemAlloc: later */
    prev = wo_sx_push_ctx();
    res = d->cuStreamCreate(&wo_sx->copy, CU_STREAM_NON_BLOCKING);
    if (res == CUDA_SUCCESS) {
        load_copy_kernel();
        time_make();
    }
    /* no slot is used unchecked: a launch may write what it was pointed at
     * (unless WOFFLOAD_WRITE_CHECKS=0, to measure what the checks cost) */
    if (res == CUDA_SUCCESS && wo_sx->checks_wanted &&
        !(wo_sx->check_on = wo_check_start(d, wo_sx->copy_mod, wo_sx->nslots)))
        res = CUDA_ERROR_NOT_SUPPORTED;
    /* the fences (stream.h), kept until exit: hooks may hold them while
     * the slots go */
    if (res == CUDA_SUCCESS &&
        (!wo_stream_fence(&wo_stream_tab.fence, d->cuEventCreate, d->cuEventDestroy_v2) ||
         !wo_stream_fence(&wo_stream_tab.blind_fence, d->cuEventCreate, d->cuEventDestroy_v2)))
        res = CUDA_ERROR_OUT_OF_MEMORY;
    for (i = 0; i < wo_sx->nslots && res == CUDA_SUCCESS; i++) {
        struct wo_stream_slot *s = &wo_stream_tab.slot[i];
        CUdeviceptr p = 0;

        wo_sx->slot_sz[i] = wo_sx->want_sz[i] ? wo_sx->want_sz[i] : wo_sx->slot_size;
        res = d->cuMemAlloc_v2(&p, wo_sx->slot_sz[i]);
        if (res == CUDA_SUCCESS)
            res = d->cuEventCreate(&s->copied, CU_EVENT_DISABLE_TIMING);
        if (res == CUDA_SUCCESS)
            res = d->cuEventCreate(&s->read_done, CU_EVENT_DISABLE_TIMING);
        s->dev = p;
        if (res != CUDA_SUCCESS && p && d->cuMemFree_v2)
            wo_quiet_mem_free(d, p);
    }
    wo_sx_pop_ctx(prev);
    wo_driver_leave();
    if (res != CUDA_SUCCESS) {
        /* what was made stays unused until exit: nothing reads it */
        if (wo_sx->copy && wo_sx->checks_wanted && !wo_sx->check_on)
            wo_sx->slots_failed = true; /* wo_check_start said why */
        else
            slots_fail("no device staging slots", res);
        return false;
    }
    wo_sx->slots_ready = true;
    if (!wo_sx->pin_on && wo_sx->pin_limit)
        wo_sx->pin_on = wo_pin_start(d, wo_sx->ctx, wo_sx->pin_limit);
    __atomic_store_n(&wo_stream_tab.n.slot_bytes, wo_sx_slots_bytes(), __ATOMIC_RELAXED);
    __atomic_store_n(&wo_stream_tab.ctx, wo_sx->ctx, __ATOMIC_RELEASE);
    say_slots("");
    /* sized for the ranges streamed (want_sizes): the planner gets what
     * the estimate it was given (every slot the largest) overstated */
    if (wo_sx_slots_bytes() < (uint64_t)wo_sx->nslots * wo_sx->slot_size)
        slots_shrank();
    return true;
}

/* Readies slots [lo, hi) for cuMemFree: what their readers' streams were
 * given done (fence_owner), their contents checked for writes (check_slot),
 * the copies and every launch that read them finished, and the checks'
 * verdicts taken (poll_checks). False: later (a fence or a check cannot be
 * had yet, or a capture forbids the driver calls). */
bool wo_sx_quiesce(unsigned lo, unsigned hi)
{
    const struct wo_driver *d = wo_sx->drv;
    CUcontext prev;
    bool ok = true;

    if (!wo_driver_enter())
        return false;
    prev = wo_sx_push_ctx();
    pthread_mutex_lock(&wo_uvm.lock);
    for (unsigned s = lo; s < hi && ok; s++)
        ok = wo_sx_fence_owner(&wo_stream_tab.slot[s]) && wo_sx_check_slot(s);
    pthread_mutex_unlock(&wo_uvm.lock);
    if (ok) {
        if (wo_sx->copy && d->cuStreamSynchronize)
            d->cuStreamSynchronize(wo_sx->copy);
        for (unsigned s = lo; s < hi; s++)
            if (wo_stream_tab.slot[s].read_done && d->cuEventSynchronize)
                d->cuEventSynchronize(wo_stream_tab.slot[s].read_done);
    }
    wo_sx_pop_ctx(prev);
    wo_driver_leave();
    if (ok)
        wo_sx_poll_checks(true, NONE);
    return ok;
}

/* Gives slot s its wanted size: its contents checked for writes first and
 * every launch that read it done (as free_slots does for all of them),
 * then its memory freed and allocated again. A size cuMemAlloc refuses
 * leaves the old one (remembered: not asked again until the wanted size
 * changes). False: later (a hook holds it, or a capture). */
static bool resize_slot(unsigned s)
{
    const struct wo_driver *d = wo_sx->drv;
    struct wo_stream_slot *sl = &wo_stream_tab.slot[s];
    uint64_t want = wo_sx->want_sz[s], old = wo_sx->slot_sz[s];
    CUdeviceptr p = 0;
    CUcontext prev;
    CUresult res;

    if (!d->cuMemFree_v2)
        return false;
    if (wo_sx_at_engine(s, true) || !wo_sx_unpublish(s) || !wo_sx_quiesce(s, s + 1))
        return false;
    /* growing: the planner's budget first (its hot set makes the room);
     * outside the driver section, which is not nested (its drain enters
     * it), and before the slots' context is pushed (the prefetcher may
     * make its own current) */
    if (want > old)
        wo_budget_reserve(wo_sx_slots_bytes() - old + want);
    if (!wo_driver_enter())
        return false;
    prev = wo_sx_push_ctx();
    wo_quiet_mem_free(d, (CUdeviceptr)sl->dev);
    sl->dev = 0;
    wo_sx->slot_sz[s] = 0;
    res = d->cuMemAlloc_v2(&p, want);
    if (res != CUDA_SUCCESS) {
        char a[24], b[24];
        wo_sx->grow_failed[s] = want;
        want = d->cuMemAlloc_v2(&p, old) == CUDA_SUCCESS ? old : 0;
        wo_info("stream: staging slot %u: %s could not be allocated (%s): it keeps %s%s", s,
                size_str(wo_sx->want_sz[s], a), wo_cu_error_name(res), size_str(want, b),
                want ? "" : " (no range is staged in it)");
    }
    wo_sx_pop_ctx(prev);
    wo_driver_leave();
    sl->dev = p;
    wo_sx->slot_sz[s] = want;
    wo_sx->slot_last[s] = NONE;
    __atomic_store_n(&sl->owner, 0, __ATOMIC_RELEASE);
    if (want != old)
        add(&wo_stream_tab.n.slot_resizes, 1);
    return true;
}

/* The size slot s is given for a wanted size: kept when none is wanted
 * yet, when cuMemAlloc refused that size, or when it shrinks by an eighth
 * or less (no churn for ranges of near sizes). wo_sx_resize() and readmit_room()
 * both judge by it. */
static uint64_t size_after(unsigned s, uint64_t want)
{
    uint64_t cur = wo_sx->slot_sz[s];

    if (!want || want == wo_sx->grow_failed[s] || (want <= cur && want >= cur - cur / 8))
        return cur;
    return want;
}

/* After the slots shrank, `auto` gives back to the planner the hot managed
 * ranges it streamed for their room (auto_decide) that the room now left
 * holds, the first of the step first (the last stay streamed, as
 * llama.cpp's --n-cpu-moe keeps the first layers on the GPU). The room is
 * counted in whole allocations (what the planner places): the budget, less
 * the slots, less every managed range not streamed that a recent step
 * read. That is what the planner wants, not what it holds (hot_over's
 * measure, its hot bytes, which the budget caps): a range given back must
 * fit beside all the planner wants, or the two evict each other. */
static uint64_t footprint(uint32_t id, const struct srange *r)
{
    struct wo_range rg;

    (void)id;
    return wo_registry_get(r->rid, &rg) >= 0 && rg.gen == r->gen ? rg.size : r->hi - r->lo;
}

static void readmit_room(void)
{
    uint64_t budget = wo_uvm_device_budget(), held = 0;
    unsigned n = 0;

    for (uint32_t id = 0; id < wo_sx->nr; id++) {
        const struct srange *r = &wo_sx->r[id];
        if (r->live && !r->host && !r->streamed && r->msteps &&
            r->last_step + AUTO_RECENT >= wo_sx->steps)
            held += footprint(id, r);
    }
    for (uint32_t i = 0; i < wo_sx->norder && held < budget; i++) {
        uint32_t id = wo_sx->order[i];
        struct srange *r = &wo_sx->r[id];
        uint64_t fp, sz[WO_STREAM_MAX_SLOTS], slots_after = 0;

        if (id >= wo_sx->nr || !r->live || !r->room || !r->streamed)
            continue;
        /* the slots the streamed ranges need without it: taking one of a
         * pair of sizes out of the order (a down tensor between two
         * gate_up ones) can make them larger, and the room they grow by
         * is the planner's */
        if (!size_for(id, sz))
            continue;
        /* counted before any shrink is made: a slot gives its bytes back
         * only once it is free */
        for (unsigned k = 0; k < wo_sx->nslots; k++)
            slots_after += WO_MAX(size_after(k, sz[k]), wo_sx->slot_sz[k]);
        fp = footprint(id, r);
        if (held + fp + slots_after > budget)
            continue;
        held += fp;
        wo_sx_unselect_range(r, id);
        n++;
    }
    if (n)
        wo_info("stream: auto: %u hot ranges back with the planner: the slots' room holds them", n);
}

/* Brings the slots to their wanted sizes (want_sizes, size_after), each
 * once none of the next ranges (ahead) is in it and the engine is not at
 * it; a slot that grows takes its bytes from the planner's budget first,
 * one that shrank gives them back after. */
void wo_sx_resize(const uint32_t *ahead, unsigned na)
{
    uint64_t before = wo_sx_slots_bytes();
    bool done = false, changed = false;

    if (!wo_sx->slots_ready || wo_sx->slots_failed)
        return;
    for (unsigned s = 0; s < wo_sx->nslots; s++) {
        uint64_t cur = wo_sx->slot_sz[s];
        if (size_after(s, wo_sx->want_sz[s]) == cur)
            continue;
        if (wo_sx->slot_range[s] >= 0 && in(ahead, na, (uint32_t)wo_sx->slot_range[s]))
            continue;
        if (resize_slot(s)) {
            done = true;
            changed |= wo_sx->slot_sz[s] != cur; /* not when cuMemAlloc refused */
        }
    }
    if (!done)
        return;
    __atomic_store_n(&wo_stream_tab.n.slot_bytes, wo_sx_slots_bytes(), __ATOMIC_RELAXED);
    if (changed)
        say_slots(" resized");
    /* a refused grow gives back what it took from the planner */
    if (wo_sx_slots_bytes() < before)
        slots_shrank();
    else
        wo_budget_reserve(wo_sx_slots_bytes());
}

/* The slots hold fewer bytes than the planner was told: its budget grows,
 * and auto gives back the hot ranges it streamed for the room (readmit_room). */
static void slots_shrank(void)
{
    wo_budget_reserve(wo_sx_slots_bytes());
    if (wo_sx->mode.by_auto)
        readmit_room();
}

/* Stages the range the engine is at and the next ones, keeping the one
 * before. */
