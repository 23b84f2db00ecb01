/* uvm/stream-slots.c: the streaming executor's device slots (see
 * stream-int.h), its ground floor: the engine's context pushed around
 * driver calls, the copy kernel, the slots' sizes for the ranges streamed
 * now, making them, and the copies' timing. Growing and shrinking them
 * (quiesced first, their readers fenced) is staging's (stream-stage.c). */
#include "uvm/stream-int.h"

#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "uvm/plan-budget.h"
#include "uvm/stream-check.h"
#include "uvm/stream-pin.h"

/* The executor's state: built and freed by stream.c, read by every file
 * of it; defined on this floor, which the others stand on. */
struct exec *wo_sx;

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
        res = wo_quiet_module_load(d, &mod, wo_copy_ptx());
        if (res == CUDA_SUCCESS)
            res = wo_quiet_module_function(d, &wo_sx->copy_fn, mod, "wo_stream_copy");
        if (res != CUDA_SUCCESS && mod) {
            wo_uvm_quiesce_begin(); /* an unload waits as a load does */
            d->cuModuleUnload(mod);
            wo_uvm_quiesce_end();
        } else
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
const char *wo_sx_size_str(uint64_t b, char buf[24])
{
    bool mib = b >= (1u << 20);

    snprintf(buf, 24, "%llu %s", (unsigned long long)(mib ? b >> 20 : b >> 10),
             mib ? "MiB" : "KiB");
    return buf;
}

/* One info line: the slots' sizes. */
void wo_sx_say_slots(const char *what)
{
    char sizes[26 * WO_STREAM_MAX_SLOTS] = "", one[24];
    size_t at = 0;

    for (unsigned i = 0; i < wo_sx->nslots && at < sizeof(sizes); i++)
        at += (size_t)snprintf(sizes + at, sizeof(sizes) - at, "%s%s", i ? ", " : "",
                               wo_sx_size_str(wo_sx->slot_sz[i], one));
    wo_info("stream: %u device staging slots%s (%s)", wo_sx->nslots, what, sizes);
}

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
bool wo_sx_size_for(uint32_t skip, uint64_t *out)
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

    if (wo_sx_size_for(NONE, out))
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
    add(&wo_stream_tab.n.slot_makes, 1);
    if (!wo_sx->pin_on && wo_sx->pin_limit)
        wo_sx->pin_on = wo_pin_start(d, wo_sx->ctx, wo_sx->pin_limit);
    __atomic_store_n(&wo_stream_tab.n.slot_bytes, wo_sx_slots_bytes(), __ATOMIC_RELAXED);
    __atomic_store_n(&wo_stream_tab.ctx, wo_sx->ctx, __ATOMIC_RELEASE);
    wo_sx_say_slots("");
    return true;
}
