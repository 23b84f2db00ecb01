/* uvm/place-fit.c: fit (policy fit:, docs/policy.md; place-int.h): at
 * seal, from every name the engine tagged, what stays on the device within
 * the fit budget, with room kept for the streaming executor's slots and
 * for what the engine allocates after seal. policy/fit.c decides; this
 * gathers the items and applies the answer to the tags. */
#include "uvm/place-int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/log.h"
#include "core/nvml.h"
#include "core/settings.h"
#include "uvm/hotpath.h"
#include "uvm/picks.h"
#include "uvm/plan-stream.h"

uint64_t wo_place_engine_bytes(void)
{
    uint64_t engine = 0;

    for (size_t i = 0; i < wo_uvm.alloc_hash_size; i++)
        for (struct wo_alloc *a = wo_uvm.alloc_hash[i]; a; a = a->next)
            if (a->kind == WO_KIND_OBSERVED &&
                !(a->flags & (WO_RANGE_HOST | WO_RANGE_MANAGED | WO_RANGE_ENGINE_MANAGED)))
                engine += a->size;
    return engine;
}

/* The bytes of the engine's placeable allocations that no name covers,
 * where they follow the default onto the device at seal (place-seal.c's
 * gaps): a caching allocator's segment holds weights and the free blocks
 * between them, which it hands to activations after seal without a call
 * the shim sees. Advised to the host until seal, they are not out of the
 * free memory fit measures, so they come out of its budget. On the H200's
 * 128-expert shape (transformers, PyTorch's allocator) 0.57 GiB, about
 * half of what the process ran above the fit size
 * (bench/results/bigload-20261203b-moe128-early-h200). */
uint64_t wo_place_untagged(const struct wo_alloc *a)
{
    uint64_t pos = 0, gap = 0;

    for (size_t k = 0; k < a->ntags; k++) {
        const struct wo_tag *t = &a->tags[k];
        if (t->off > pos)
            gap += t->off - pos;
        pos = WO_MAX(pos, t->off + t->size);
    }
    return gap + (a->size > pos ? a->size - pos : 0);
}

/* fit's size is the process's device memory, as nvidia-smi shows it and
 * as a peer's figure is measured: the contexts count. The free memory the
 * driver gives cannot tell them from another process's allocations (the
 * blocker of a larger-than-the-GPU run), NVML's per-process figure can.
 * Under llama-server at --fit 14012MiB the process held 675 MiB that no
 * allocation explained (the engine's context, its modules) and ran 1.04x
 * over the fit size (bench/results/llamacpp-serve-20261205b-p32-fit-h100). */
int wo_place_context_bytes(uint64_t allocated, uint64_t *bytes, char *said, size_t saidlen)
{
    const struct wo_driver *d = wo_uvm_driver();
    int dom = 0, bus = 0, slot = 0;
    uint64_t proc = 0;
    CUdevice dev;
    char why[256], b1[32], b2[32];

    if (!d || !d->cuDeviceGetAttribute ||
        ((!d->cuCtxGetDevice || d->cuCtxGetDevice(&dev) != CUDA_SUCCESS) &&
         (!d->cuDeviceGet || d->cuDeviceGet(&dev, wo_uvm.device) != CUDA_SUCCESS)) ||
        d->cuDeviceGetAttribute(&dom, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, dev) != CUDA_SUCCESS ||
        d->cuDeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, dev) != CUDA_SUCCESS ||
        d->cuDeviceGetAttribute(&slot, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, dev) != CUDA_SUCCESS) {
        snprintf(said, saidlen, "the device's PCI address not known");
        *bytes = 0;
        return -1;
    }
    if (wo_nvml_process_bytes((unsigned)dom, (unsigned)bus, (unsigned)slot, (int)getpid(), &proc,
                              why, sizeof(why)) < 0) {
        snprintf(said, saidlen, "%s", why);
        *bytes = 0;
        return -1;
    }
    snprintf(said, saidlen, "NVML: the process holds %s, its allocations %s",
             wo_format_size(proc, b1, sizeof(b1)), wo_format_size(allocated, b2, sizeof(b2)));
    *bytes = proc > allocated ? proc - allocated : 0;
    return 0;
}

void wo_place_context_for_trace(void)
{
    uint64_t host, device, bytes;
    char said[320];

    if (!wo_settings()->trace || (wo_uvm.g && wo_uvm.g->fit.enabled))
        return;
    wo_place_bind_bytes(&host, &device);
    if (wo_place_context_bytes(wo_place_engine_bytes() + device, &bytes, said, sizeof(said)) < 0) {
        wo_debug("trace: no context_bytes recorded (%s)", said);
        return;
    }
    __atomic_store_n(&wo_uvm.fit.context_bytes, bytes, __ATOMIC_RELAXED);
    __atomic_store_n(&wo_uvm.fit.context_known, true, __ATOMIC_RELEASE);
}

static uint64_t untagged_to_device(void)
{
    uint64_t sum = 0;

    if (wo_uvm.g->default_place != WO_PLACE_DEVICE)
        return 0;
    for (size_t i = 0; i < wo_uvm.alloc_hash_size; i++)
        for (struct wo_alloc *a = wo_uvm.alloc_hash[i]; a; a = a->next)
            if (a->kind == WO_KIND_MANAGED || a->kind == WO_KIND_BOUND)
                sum += wo_place_untagged(a);
    return sum;
}

struct tag_ord {
    uint64_t order;
    struct wo_fit_item v;
    struct wo_tag *t;
    bool lendable;
};

static int tag_ord_cmp(const void *pa, const void *pb)
{
    const struct tag_ord *a = pa, *b = pb;
    return a->order < b->order ? -1 : a->order > b->order;
}

/* The items in the order the engine tagged them (wo_tag.order), not the
 * allocation hash's: fit breaks ties by index and spreads names of equal
 * value through it (policy/fit.c), which means the step's order only where
 * the index follows the engine's (a model of one allocation a tensor, as
 * under transformers, came in hash order). Without memory the hash's order
 * stays: still a valid fit. */
static void fit_in_tag_order(struct wo_fit_item *v, struct wo_tag **tv, bool *lendable, size_t n)
{
    struct tag_ord *o = malloc((n ? n : 1) * sizeof(*o));

    if (!o)
        return;
    for (size_t i = 0; i < n; i++)
        o[i] = (struct tag_ord){tv[i]->order, v[i], tv[i], lendable[i]};
    qsort(o, n, sizeof(*o), tag_ord_cmp);
    for (size_t i = 0; i < n; i++) {
        v[i] = o[i].v;
        tv[i] = o[i].t;
        lendable[i] = o[i].lendable;
    }
    free(o);
}

/* Chooses, from every name the engine tagged, what stays on the device
 * under fit: (policy/fit.c decides; this gathers the items and applies the
 * answer to the tags, before seal_alloc() makes it so). Names an explicit
 * rule placed keep it; pinned memory (the managed cap) cannot move. */
void wo_place_fit(size_t free_b, size_t total_b)
{
    const struct wo_fit *fit = &wo_uvm.g->fit;
    /* reserve: auto, the runs before's high water (fit-memo.c) */
    struct wo_fit eff = wo_fit_memo_resolve(fit);
    struct wo_fit_item *v;
    struct wo_tag **tv;
    bool *lendable;
    size_t n = 0;
    uint64_t engine = 0, resident = 0, rest = 0, budget, untagged, context;
    uint64_t bound_host, bound_device;
    bool context_known;
    struct wo_fit_split sp;
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32], b7[32], b8[32];
    char b9[32], b10[32], untagged_said[96] = "", context_said[320], context_line[400];
    char lend_said[96];

    for (size_t i = 0; i < wo_uvm.alloc_hash_size; i++)
        for (struct wo_alloc *a = wo_uvm.alloc_hash[i]; a; a = a->next)
            n += a->kind == WO_KIND_OBSERVED ? 0 : a->ntags;
    v = calloc(n ? n : 1, sizeof(*v));
    tv = calloc(n ? n : 1, sizeof(*tv));
    lendable = calloc(n ? n : 1, sizeof(*lendable));
    if (!v || !tv || !lendable) {
        wo_error("fit: out of memory; the policy's placements apply as written");
        goto out;
    }
    n = 0;
    engine = wo_place_engine_bytes();
    for (size_t i = 0; i < wo_uvm.alloc_hash_size; i++) {
        for (struct wo_alloc *a = wo_uvm.alloc_hash[i]; a; a = a->next) {
            if (a->kind == WO_KIND_OBSERVED)
                continue;
            for (size_t k = 0; k < a->ntags; k++) {
                struct wo_tag *t = &a->tags[k];
                tv[n] = t;
                v[n] = (struct wo_fit_item){
                    .name = t->name->s,
                    .size = t->size,
                    .weight = -1,
                    .fixed = t->name->rule >= 0 ? t->place : WO_PLACE_UNSET,
                    .movable = a->kind == WO_KIND_MANAGED || a->kind == WO_KIND_BOUND,
                };
                lendable[n] = a->kind == WO_KIND_MANAGED;
                /* A name a rule sent to the device was advised there when it
                 * was made, so the engine's writes put its pages there and
                 * the free memory already lacks them (assumed: an engine
                 * that has not written all of it yet leaves less room than
                 * this counts, and the budget is that much too high). */
                if (a->kind == WO_KIND_MANAGED && v[n].fixed == WO_PLACE_DEVICE)
                    resident += t->size;
                n++;
            }
        }
    }
    fit_in_tag_order(v, tv, lendable, n);
    /* late-bound ranges' device granules can all move: their memory is
     * the budget's too */
    wo_place_bind_bytes(&bound_host, &bound_device);
    resident += bound_device;
    /* the contexts come out of the fit size as the engine's allocations do;
     * the late-bound device granules are in NVML's figure and the budget's */
    context_known = wo_place_context_bytes(engine + bound_device, &context, context_said,
                                           sizeof(context_said)) == 0;
    budget = wo_fit_budget(fit, total_b, (uint64_t)free_b + resident, engine + context);
    untagged = untagged_to_device();
    wo_place_fit_split(wo_uvm.g, &eff, v, lendable, true, n, budget - WO_MIN(untagged, budget),
                       UINT64_MAX, &sp);
    for (size_t i = 0; i < n; i++) {
        struct wo_tag *t = tv[i];
        if (v[i].fixed != WO_PLACE_UNSET)
            continue;
        /* fit_lend's choices: fit's own are the device or its rest */
        t->lent = sp.lent && v[i].out == WO_PLACE_MANAGED && fit->rest == WO_PLACE_HOST;
        if (t->place != v[i].out)
            t->applied = false; /* seal_alloc() applies the new placement */
        t->place = t->name->place = v[i].out;
        if (v[i].out == WO_PLACE_HOST)
            rest += t->size;
    }
    wo_uvm.fit.budget = sp.budget;
    wo_uvm.fit.device_bytes = sp.chosen;
    wo_uvm.fit.rest_bytes = rest;
    wo_uvm.fit.engine_bytes = engine;
    wo_uvm.fit.untagged_bytes = untagged;
    wo_uvm.fit.context_bytes = context;
    __atomic_store_n(&wo_uvm.fit.context_known, context_known, __ATOMIC_RELEASE);
    wo_uvm.fit.names = n;
    wo_uvm.fit.staging_bytes = sp.staging;
    wo_uvm.fit.reserve_bytes = sp.reserve;
    wo_uvm.fit.lent_bytes = sp.lent;
    wo_uvm.fit.picks_bytes = sp.picks;
    /* The prefetcher keeps managed bytes, and the streaming executor its
     * slots, within what fit left the weights (with no room kept for slots
     * there are none: the device stays within the fit budget). */
    if (wo_uvm.g->device_budget.kind == WO_BUDGET_AUTO)
        wo_uvm.device_budget =
            sp.weights + sp.staging > sp.chosen ? sp.weights + sp.staging - sp.chosen : 0;
    if (wo_settings()->fit_lend)
        snprintf(lend_said, sizeof(lend_said),
                 "lent to %s of managed weights while the slots are empty",
                 wo_format_size(sp.lent, b7, sizeof(b7)));
    else
        snprintf(lend_said, sizeof(lend_said), "kept empty (WOFFLOAD_FIT_LEND=0)");
    if (untagged)
        snprintf(untagged_said, sizeof(untagged_said),
                 ", less %s of the engine's allocations that no name covers",
                 wo_format_size(untagged, b9, sizeof(b9)));
    if (context)
        snprintf(context_line, sizeof(context_line),
                 " and %s of the process's beyond its allocations (CUDA contexts, modules; %s)",
                 wo_format_size(context, b10, sizeof(b10)), context_said);
    else
        snprintf(context_line, sizeof(context_line),
                 " (the process's CUDA contexts not counted: %s)", context_said);
    wo_log_write(WO_LOG_OFF,
                 "fit: %s of weights on the device (budget %s: the fit size less %s the engine "
                 "holds%s, within the free memory less keep_free%s; %s of it kept for what the "
                 "engine allocates after seal%s, %s for staging slots, %s, %s for the "
                 "picked copies' buffers), %s %s over %zu names",
                 wo_format_size(sp.chosen, b1, sizeof(b1)),
                 wo_format_size(sp.budget, b2, sizeof(b2)), wo_format_size(engine, b3, sizeof(b3)),
                 context_line, untagged_said, wo_format_size(sp.reserve, b6, sizeof(b6)),
                 fit->reserve != WO_FIT_RESERVE_AUTO ? ""
                 : wo_fit_memo_have() ? " (reserve auto: the runs before's high water)"
                                      : " (reserve auto: no run before, the default)",
                 wo_format_size(sp.staging, b5, sizeof(b5)), lend_said,
                 wo_format_size(sp.picks, b8, sizeof(b8)), wo_format_size(rest, b4, sizeof(b4)),
                 wo_placement_to_string(fit->rest), n);
out:
    free(v);
    free(tv);
    free(lendable);
}

/* The consumer thread has no context of its own: the device's primary
 * one, where the engine's allocations and the placement stream live (as
 * the streaming executor and the prefetcher take it). prev: the thread's
 * context before, for primary_leave. */
static void primary_enter(const struct wo_driver *d, CUcontext *ctx, CUcontext *prev)
{
    CUdevice dev;

    if (d->cuDeviceGet && d->cuDevicePrimaryCtxRetain && d->cuCtxGetCurrent && d->cuCtxSetCurrent &&
        d->cuDeviceGet(&dev, wo_uvm.device) == CUDA_SUCCESS &&
        d->cuDevicePrimaryCtxRetain(ctx, dev) == CUDA_SUCCESS &&
        d->cuCtxGetCurrent(prev) == CUDA_SUCCESS && *prev != *ctx)
        (void)d->cuCtxSetCurrent(*ctx);
}

static void primary_leave(const struct wo_driver *d, CUcontext ctx, CUcontext prev)
{
    if (ctx && prev != ctx)
        (void)d->cuCtxSetCurrent(prev);
}

/* The staging room back to weights (issue 41). fit kept room for the
 * streaming executor's slots and lent it to managed weights, which the
 * prefetcher keeps on the device while the slots are empty. An engine
 * that runs its steps as CUDA graphs never stages (a graph replay is a
 * blind launch: bench/results/llamacpp-early-20261129-1328-h200, llama.cpp
 * under --fit: staged 0, 93 blind launches), so the room is lent for good:
 * the lent weights are placed on the device, where the prefetcher no
 * longer has to hold them (that run decoded at 0.92x the hand policy with
 * 1.5 GiB lent). The consumer thread calls this once the slots stayed
 * empty through enough graph replays (consumer.c). */
uint64_t wo_place_fit_return(void)
{
    const struct wo_driver *d = wo_uvm_driver();
    uint64_t moved = 0, budget;
    size_t failed = 0;
    CUcontext ctx = NULL, prev = NULL;
    char b1[32], b2[32];

    pthread_mutex_lock(&wo_uvm.lock);
    if (wo_uvm.fit.returned || !wo_uvm.fit.lent_bytes || !d) {
        pthread_mutex_unlock(&wo_uvm.lock);
        return 0;
    }
    wo_uvm.fit.returned = true;
    primary_enter(d, &ctx, &prev);
    for (size_t i = 0; i < wo_uvm.alloc_hash_size; i++)
        for (struct wo_alloc *a = wo_uvm.alloc_hash[i]; a; a = a->next) {
            if (a->kind != WO_KIND_MANAGED)
                continue;
            for (size_t k = 0; k < a->ntags; k++) {
                struct wo_tag *t = &a->tags[k];
                if (!t->lent)
                    continue;
                t->lent = false;
                if (t->place != WO_PLACE_MANAGED)
                    continue;
                if (wo_place_apply_range(a, t->off, t->size, WO_PLACE_DEVICE, true, true) < 0) {
                    failed++; /* said by wo_place_apply_range; it stays managed */
                    continue;
                }
                t->place = t->name->place = WO_PLACE_DEVICE;
                moved += t->size;
            }
        }
    (void)wo_place_sync();
    primary_leave(d, ctx, prev);
    wo_uvm.fit.returned_bytes = moved;
    budget = __atomic_load_n(&wo_uvm.device_budget, __ATOMIC_RELAXED);
    __atomic_store_n(&wo_uvm.device_budget, budget - WO_MIN(moved, budget), __ATOMIC_RELAXED);
    pthread_mutex_unlock(&wo_uvm.lock);
    wo_info("fit: the staging slots stayed empty through the engine's CUDA graph replays: %s of "
            "lent weights now stay on the device (the prefetcher's budget is %s)%s",
            wo_format_size(moved, b1, sizeof(b1)),
            wo_format_size(budget - WO_MIN(moved, budget), b2, sizeof(b2)),
            failed ? "; some could not be moved and stay managed" : "");
    return moved;
}

struct yielder {
    struct wo_alloc *a;
    struct wo_tag *t;
    int cls;
};

static int yield_cmp(const void *pa, const void *pb)
{
    const struct yielder *a = pa, *b = pb;

    if (a->cls != b->cls)
        return a->cls > b->cls ? -1 : 1; /* the least valuable class first */
    return a->t->size > b->t->size ? -1 : a->t->size < b->t->size; /* then the larger */
}

/* The engine ran out of device memory after seal (issue 41: transformers'
 * default experts backend gathers the picked experts' weights, 1.5 to 3 GiB
 * at b32, past fit's reserve): the weights fit chose for the device yield,
 * the least valuable first by the tensor classes (embeddings, routed experts,
 * the output head, ...), moved to the host at the same address until need
 * bytes are free. Names an explicit rule placed stay. Their later reads cross
 * PCIe: speed, never data. Returns the bytes moved. why: the engine's
 * allocation failed, or the next one would pass fit's reserve
 * (wo_uvm_engine_alloc_ahead). */
/* UVM keeps the device pages of a managed range prefetched to the host
 * (the free memory does not rise), and a device allocation takes the free
 * memory before them: the process would fill the device before the pages
 * went (1.12x the fit size on the H200). Allocations of the free memory
 * plus the pages' bytes take them back, and freed at once they are the
 * device's free memory again (bench/uvm-release.cu: the data stays on the
 * host; bench/results/uvm-release-20261203-h200.txt). Less a slack (an
 * eighth of them, at most SQUEEZE_SLACK_MAX):
 * past the cached pages the driver would evict the managed weights that
 * are on the device. The caller holds wo_uvm.lock, so the engine's own
 * allocations (wo_uvm_engine_alloc_ahead) wait; another process's may fail
 * for that moment (WOFFLOAD_FIT_SQUEEZE=0 keeps the pages cached). */
#define SQUEEZE_CHUNK (64ull << 20)
#define SQUEEZE_SLACK_MAX (64ull << 20)
#define SQUEEZE_FREE_MARGIN (4ull << 20)
/* odd while a squeeze holds the device's free memory: an engine allocation
 * that failed meanwhile is made again after it (wo_uvm_squeeze_overlapped) */
static uint64_t squeeze_gen;

uint64_t wo_uvm_squeeze_gen(void)
{
    return __atomic_load_n(&squeeze_gen, __ATOMIC_ACQUIRE);
}

bool wo_uvm_squeeze_overlapped(uint64_t *seen)
{
    uint64_t g = __atomic_load_n(&squeeze_gen, __ATOMIC_ACQUIRE);

    if (g == *seen && !(g & 1))
        return false;
    while (g & 1) { /* milliseconds: allocations, then their frees */
        usleep(200);
        g = __atomic_load_n(&squeeze_gen, __ATOMIC_ACQUIRE);
    }
    *seen = g;
    return true;
}

static bool squeeze(uint64_t cached, const char *whose)
{
    const struct wo_driver *d = wo_uvm_driver();
    size_t free0 = 0, free1 = 0, total = 0;
    uint64_t target, took = 0, slack = WO_MIN(cached / 8, SQUEEZE_SLACK_MAX);
    CUdeviceptr *p;
    size_t n = 0, cap;
    char b1[32], b2[32], b3[32];

    if (!wo_settings()->fit_squeeze || !cached || !d || !d->cuMemGetInfo_v2 || !d->cuMemAlloc_v2 ||
        !d->cuMemFree_v2 || d->cuMemGetInfo_v2(&free0, &total) != CUDA_SUCCESS)
        return false;
    target = (uint64_t)free0 + cached - slack;
    cap = (size_t)(target / SQUEEZE_CHUNK) + 2; /* the chunks, and the free memory's one */
    p = malloc(cap * sizeof(*p));
    if (!p)
        return false;
    __atomic_add_fetch(&squeeze_gen, 1, __ATOMIC_ACQ_REL);
    /* the free memory in one allocation, less a margin for what another
     * thread took meanwhile (refused, the chunks take it all): in chunks
     * alone an 80 GB device's free memory would be over a thousand
     * allocations and as many frees, each free waiting for the context's
     * work. Then the cached pages in chunks, until one fails. */
    if (free0 > 2 * SQUEEZE_FREE_MARGIN && target > free0 &&
        d->cuMemAlloc_v2(&p[n], free0 - SQUEEZE_FREE_MARGIN) == CUDA_SUCCESS) {
        n++;
        took += free0 - SQUEEZE_FREE_MARGIN;
    }
    while (took < target && n < cap) {
        uint64_t want = WO_MIN(SQUEEZE_CHUNK, target - took);
        if (d->cuMemAlloc_v2(&p[n], (size_t)want) != CUDA_SUCCESS)
            break; /* nothing more cached: the rest stays as it is */
        n++;
        took += want;
    }
    /* behind the copy engine's gate, as the shim's other frees (a free
     * waits for the context's work: uvm/internal.h wo_quiet_mem_free) */
    wo_uvm_quiesce_begin();
    for (size_t i = 0; i < n; i++)
        if (d->cuMemFree_v2(p[i]) != CUDA_SUCCESS)
            wo_warn("fit: a device allocation that took yielded pages back could not be freed: "
                    "up to %s of device memory stay held",
                    wo_format_size(SQUEEZE_CHUNK, b1, sizeof(b1)));
    wo_uvm_quiesce_end();
    __atomic_add_fetch(&squeeze_gen, 1, __ATOMIC_ACQ_REL);
    free(p);
    if (d->cuMemGetInfo_v2(&free1, &total) != CUDA_SUCCESS || free1 <= free0)
        return false;
    wo_uvm.fit.squeezed_bytes += (uint64_t)(free1 - free0);
    /* the free memory before and the allocations' stop say what UVM held:
     * stopped short of the target, the cache had less than the yield */
    wo_info("fit: %s of the %s weights' device pages given back (UVM kept them after the "
            "move to the host; %s free before, allocations of %s%s, freed at once)",
            wo_format_size((uint64_t)(free1 - free0), b1, sizeof(b1)), whose,
            wo_format_size((uint64_t)free0, b3, sizeof(b3)), wo_format_size(took, b2, sizeof(b2)),
            took < target ? ", stopped short of the target: the device had no more" : "");
    return (uint64_t)(free1 - free0) >= cached / 2;
}

bool wo_place_fit_squeeze_lent(uint64_t cached)
{
    const struct wo_driver *d = wo_uvm_driver();
    CUcontext ctx = NULL, prev = NULL;

    pthread_mutex_lock(&wo_uvm.lock);
    if (!cached || !d || !wo_uvm.g || !wo_uvm.g->fit.enabled || !wo_uvm.fit.lent_bytes ||
        wo_uvm.fit.returned || !wo_settings()->fit_squeeze || !wo_settings()->fit_squeeze_lent) {
        pthread_mutex_unlock(&wo_uvm.lock);
        return true;
    }
    /* the allocations are driver calls: never while a capture is under
     * way (a global one would be broken); the caller tries again */
    if (!wo_driver_enter()) {
        pthread_mutex_unlock(&wo_uvm.lock);
        return false;
    }
    primary_enter(d, &ctx, &prev);
    /* an estimate (the pages a later prefetch took back are not known):
     * a squeeze that finds less is no sign of the context's growth, unlike
     * a yield's (unsqueezed stays) */
    (void)squeeze(WO_MIN(cached, wo_uvm.fit.lent_bytes), "lent");
    wo_uvm.fit.lent_squeezes++;
    primary_leave(d, ctx, prev);
    wo_driver_leave();
    pthread_mutex_unlock(&wo_uvm.lock);
    return true;
}

uint64_t wo_place_fit_yield(uint64_t need, enum wo_fit_yield_why why)
{
    struct yielder *v;
    size_t n = 0, cap = 64;
    uint64_t moved = 0, moved_managed = 0;
    char b1[32], b2[32], b3[32];

    if (!need || !wo_uvm.sealed || !wo_uvm.g || !wo_uvm.g->fit.enabled)
        return 0;
    /* moves are driver calls on the placement stream: never while a
     * capture is under way (a global one would be broken), and none begins
     * meanwhile; the next allocation outside it catches up */
    if (!wo_driver_enter())
        return 0;
    v = malloc(cap * sizeof(*v));
    for (size_t i = 0; v && i < wo_uvm.alloc_hash_size; i++)
        for (struct wo_alloc *a = wo_uvm.alloc_hash[i]; v && a; a = a->next) {
            /* managed memory moves by a prefetch to the host (UVM keeps
             * the device pages cached: cuMemGetInfo does not rise, a
             * cudaMalloc gets them back); a bound range (WOFFLOAD_FIT_BIND,
             * WOFFLOAD_LATE_BIND) is re-backed on the host, its device
             * memory released at once */
            if (a->kind != WO_KIND_MANAGED && (a->kind != WO_KIND_BOUND || !a->bound))
                continue;
            if (why == WO_FIT_YIELD_FREE && a->kind != WO_KIND_BOUND)
                continue;
            for (size_t k = 0; k < a->ntags; k++) {
                struct wo_tag *t = &a->tags[k];
                if (t->place != WO_PLACE_DEVICE || t->name->rule >= 0)
                    continue;
                if (n == cap) {
                    struct yielder *w = realloc(v, 2 * cap * sizeof(*v));
                    if (!w)
                        break;
                    v = w;
                    cap *= 2;
                }
                v[n++] = (struct yielder){a, t, wo_fit_class(t->name->s)};
            }
        }
    if (!v) {
        wo_driver_leave();
        return 0;
    }
    qsort(v, n, sizeof(*v), yield_cmp);
    for (size_t i = 0; i < n && moved < need; i++) {
        if (v[i].a->kind == WO_KIND_BOUND) {
            v[i].t->place = WO_PLACE_HOST;
            if (wo_place_bind_tag(v[i].a, v[i].t) < 0) {
                v[i].t->place = WO_PLACE_DEVICE; /* said by wo_place_bind_tag */
                continue;
            }
        } else if (wo_place_apply_range(v[i].a, v[i].t->off, v[i].t->size, WO_PLACE_HOST, true,
                                        true) < 0) {
            continue; /* said by wo_place_apply_range */
        } else {
            moved_managed += v[i].t->size;
        }
        v[i].t->place = v[i].t->name->place = WO_PLACE_HOST;
        /* each move, for the log at info (the warning below is said once) */
        wo_info("fit: '%s' (%s) moved to the host after seal: %s (fit's reserve %s; the "
                "engine's allocations since seal, live: %s before this one)",
                v[i].t->name->s, wo_format_size(v[i].t->size, b1, sizeof(b1)),
                why == WO_FIT_YIELD_OOM    ? "the engine ran out of device memory"
                : why == WO_FIT_YIELD_FREE ? "the engine's next allocation would leave less than "
                                             "keep_free free"
                                           : "the engine's next allocation would pass fit's reserve",
                wo_format_size(wo_uvm.fit.reserve_bytes, b3, sizeof(b3)),
                wo_format_size(wo_uvm.fit.engine_after, b2, sizeof(b2)));
        /* an expert tensor now off the device: its picked copies begin at
         * its next registration */
        wo_picks_moved(v[i].a->base + v[i].t->off, v[i].a->base + v[i].t->off + v[i].t->size);
        moved += v[i].t->size;
    }
    free(v);
    if (moved)
        (void)wo_place_sync();
    /* the managed pages now on the host: their device memory back too */
    if (moved_managed && !squeeze(moved_managed, "yielded"))
        wo_uvm.fit.unsqueezed++;
    wo_driver_leave();
    if (!moved)
        return 0;
    wo_uvm.fit.yielded_bytes += moved;
    wo_uvm.fit.yields++;
    wo_uvm.fit.device_bytes -= WO_MIN(moved, wo_uvm.fit.device_bytes);
    wo_uvm.fit.rest_bytes += moved;
    if (why == WO_FIT_YIELD_OOM)
        wo_log_once(WO_LOG_WARN,
                    "fit: the engine ran out of device memory after seal: %s of the weights fit "
                    "had placed on the device moved to the host to make room (the least "
                    "valuable first; their later reads cross PCIe). fit's reserve keeps room "
                    "for what the engine allocates after seal (docs/policy.md, fit: reserve)",
                    wo_format_size(moved, b1, sizeof(b1)));
    else if (why == WO_FIT_YIELD_FREE)
        wo_log_once(WO_LOG_WARN,
                    "fit: the engine's allocation after seal would have left less than keep_free "
                    "free (device memory fit does not count: kernels loaded at their first "
                    "launch, library workspaces, other processes): %s of late-bound weights "
                    "moved to the host, their device memory released",
                    wo_format_size(moved, b1, sizeof(b1)));
    else
        wo_log_once(WO_LOG_WARN,
                    "fit: the engine's allocations after seal passed fit's reserve (%s): %s of "
                    "the weights fit had placed on the device moved to the host, so that the "
                    "process stays within the fit size (the least valuable first; their later "
                    "reads cross PCIe; a larger fit: reserve keeps them, docs/policy.md)",
                    wo_format_size(wo_uvm.fit.reserve_bytes, b2, sizeof(b2)),
                    wo_format_size(moved, b1, sizeof(b1)));
    return moved;
}

uint64_t wo_place_fit_short(size_t size)
{
    const struct wo_driver *d = wo_uvm_driver();
    size_t free_b = 0, total_b = 0;
    uint64_t bound_host, bound_device, keep;
    CUresult r;

    if (!wo_place_bind_fit() || !d || !d->cuMemGetInfo_v2)
        return 0;
    /* nothing of fit's that could yield to it: not even the driver call */
    wo_place_bind_bytes(&bound_host, &bound_device);
    if (!bound_device)
        return 0;
    if (!wo_driver_enter())
        return 0; /* under a capture: the next allocation outside it looks */
    r = d->cuMemGetInfo_v2(&free_b, &total_b);
    wo_driver_leave();
    keep = wo_uvm.g->fit.keep_free;
    if (r != CUDA_SUCCESS || (free_b >= size && free_b - size >= keep))
        return 0;
    return keep + size - free_b;
}

/* What the device's free memory fell by since seal beyond every device allocation since then that
 * the shim saw (the engine's live ones, the picked copies' buffers, the streaming executor's
 * slots): the CUDA context's own growth, kernels loaded on first use and local memory. Said only
 * where nothing else moves the free memory: no weight placed managed (the prefetcher moves its
 * pages; weights fit put on the device stay there), no yield whose pages did not come back (UVM's
 * cache keeps a yielded weight's pages; after a squeeze the free memory has them again, less its
 * slack, which the engine's allocations may take back unseen: the growth then reads up to that
 * much low), no late binding; at most 2 GiB (another process's allocation would read as growth;
 * on the H200 under the copy engine's eager module loading, 1,068 MiB of modules for PyTorch, the
 * measure sat at the 1 GiB cap it had while the process passed its books by 1.6 GiB; 0.46 GiB
 * without the copy engine: bench/results/bigload-20261204-moe128-squeeze-h200). 0: none, or not
 * known. Sampled at the engine's allocations after seal (at most every 100 ms of them), by the
 * consumer thread (once a second: an engine that frees memory it held at seal before exit would
 * hide it there) and at exit; the high water counts.
 */
#define UNTRACKED_MAX (2ull << 30)
static uint64_t untracked_now(void)
{
    const struct wo_driver *d = wo_uvm_driver();
    size_t free_b = 0, total_b = 0;
    uint64_t fell, seen;
    struct wo_place_counts pc;

    CUresult r;

    if (!d || !d->cuMemGetInfo_v2 || !wo_uvm.fit.free_at_seal || wo_uvm.fit.unsqueezed ||
        wo_place_bind_fit() || wo_settings()->late_bind)
        return 0;
    /* the walk over every allocation last, once the rest allows a sample */
    wo_place_counts(&pc);
    if (pc.by[WO_PLACE_MANAGED].bytes)
        return 0;
    /* no driver call that a capture could refuse, and invalidate the
     * engine's capture with: none under way, none begins meanwhile */
    if (!wo_driver_enter())
        return 0;
    r = d->cuMemGetInfo_v2(&free_b, &total_b);
    wo_driver_leave();
    /* the memory yielded weights gave back is no fall of the context's */
    if (r != CUDA_SUCCESS || free_b >= wo_uvm.fit.free_at_seal + wo_uvm.fit.squeezed_bytes)
        return 0;
    fell = wo_uvm.fit.free_at_seal + wo_uvm.fit.squeezed_bytes - free_b;
    seen = wo_uvm.fit.engine_after + wo_picks_reserved() +
           __atomic_load_n(&wo_stream_tab.n.slot_bytes, __ATOMIC_RELAXED);
    return fell > seen ? WO_MIN(fell - seen, UNTRACKED_MAX) : 0;
}

static bool sampling(void)
{
    return wo_uvm.sealed && wo_uvm.g && wo_uvm.g->fit.enabled && wo_uvm.fit.free_at_seal;
}

static void sample(void)
{
    uint64_t u = untracked_now();

    if (u > wo_uvm.fit.untracked)
        wo_uvm.fit.untracked = u;
}

void wo_place_fit_sample_locked(void)
{
    /* at most every 100 ms of the engine's allocations (its own clock: the
     * consumer's samples do not hold one back, or a module loaded right
     * after one went unseen until exit; test-bigload fitmemoctx under load) */
    static uint64_t next_ns;
    uint64_t now;

    if (!sampling() || (now = wo_now_ns()) < next_ns)
        return;
    next_ns = now + UINT64_C(100000000);
    sample();
}

void wo_place_fit_sample(void)
{
    /* sealed and the rest are written under the lock: read them there */
    pthread_mutex_lock(&wo_uvm.lock);
    if (sampling())
        sample();
    pthread_mutex_unlock(&wo_uvm.lock);
}

void wo_place_fit_summary(void)
{
    char b1[32], b2[32], b3[32], b4[32], b5[32], grew[128] = "";
    uint64_t peak, reserve, want, untracked;

    /* at exit, under wo_uvm.lock (wo_summary_log's caller) */
    if (!wo_uvm.sealed || !wo_uvm.g || !wo_uvm.g->fit.enabled || !wo_uvm.fit.budget)
        return;
    peak = wo_uvm.fit.engine_peak;
    reserve = wo_uvm.fit.reserve_bytes;
    untracked = WO_MAX(wo_uvm.fit.untracked, untracked_now());
    if (untracked)
        snprintf(grew, sizeof(grew),
                 " (and the CUDA context grew by %s%s beyond the allocations: kernels, local "
                 "memory)",
                 untracked >= UNTRACKED_MAX ? "at least " : "",
                 wo_format_size(untracked, b5, sizeof(b5)));
    if (wo_uvm.g->fit.reserve == WO_FIT_RESERVE_AUTO) {
        const char *at = wo_fit_memo_save(peak, untracked);
        char moved[96] = "";
        if (wo_uvm.fit.yields)
            snprintf(moved, sizeof(moved), ": %" PRIu64 " yields moved %s of fit's device weights "
                     "to the host", wo_uvm.fit.yields,
                     wo_format_size(wo_uvm.fit.yielded_bytes, b3, sizeof(b3)));
        if (at)
            wo_log_write(WO_LOG_OFF,
                         "fit: reserve auto: the engine's allocations after seal reached %s%s "
                         "against a reserve of %s%s; the next run reserves %s (kept in %s)",
                         wo_format_size(peak, b1, sizeof(b1)), grew,
                         wo_format_size(reserve, b2, sizeof(b2)), moved,
                         wo_format_size(wo_fit_memo_reserve(), b4, sizeof(b4)), at);
        else
            wo_log_write(WO_LOG_OFF,
                         "fit: reserve auto: the engine's allocations after seal reached %s%s "
                         "against a reserve of %s%s; nothing kept for the next run%s",
                         wo_format_size(peak, b1, sizeof(b1)), grew,
                         wo_format_size(reserve, b2, sizeof(b2)), moved,
                         peak ? "" : " (no allocation after seal)");
        return;
    }
    /* the next run's reserve: this run's high water, as reserve: auto takes it */
    want = wo_fit_reserve_for(peak + untracked);
    if (wo_uvm.fit.yields)
        wo_log_write(WO_LOG_OFF,
                     "fit: the engine's allocations after seal reached %s%s against a reserve "
                     "of %s: %" PRIu64 " yields moved %s of fit's device weights to the host; "
                     "fit: {reserve: %s} keeps them on the device in a run like this one",
                     wo_format_size(peak, b1, sizeof(b1)), grew,
                     wo_format_size(reserve, b2, sizeof(b2)),
                     wo_uvm.fit.yields, wo_format_size(wo_uvm.fit.yielded_bytes, b3, sizeof(b3)),
                     wo_format_size(want, b4, sizeof(b4)));
    else
        wo_log_write(WO_LOG_OFF,
                     "fit: the engine's allocations after seal reached %s%s of its %s reserve; "
                     "no weight yielded%s",
                     wo_format_size(peak, b1, sizeof(b1)), grew,
                     wo_format_size(reserve, b2, sizeof(b2)),
                     want < reserve ? " (a smaller reserve would leave more weights on the device)"
                                    : "");
}
