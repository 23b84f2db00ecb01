/* uvm/stream.c: the streaming executor (see stream.h; docs/prefetch.md,
 * "Streaming"). Consumer thread only, except the published per-name
 * figures (any thread, under snap_lock). The table's hook side
 * (wo_stream_note_write, wo_stream_await, the counters) is
 * hotpath.c; pinned copies of managed ranges, stream-pin.c.
 *
 * Per step (found by the planner's step detector on the ranges launches
 * reach in turn, wo_stream_keys in plan-step.c) it measures, per range, the
 * bytes launches read (each hit one slice, as the planner counts it) and
 * the distinct bytes among them (64 granules per range): their ratio is
 * the read multiplicity. A range is streamed when the policy says `stream`,
 * or under `auto` when a step reads at least 1.5x its bytes (then one
 * staging copy a step moves fewer bytes over PCIe than the reads in place)
 * and no copy wrote it after seal. The order in which the last step first
 * touched the streamed ranges is the plan: the executor keeps the range
 * the engine is at and the next ones staged in device slots, the one before
 * it kept too (a layer's tensors may interleave), and reuses the slot of
 * anything further behind.
 *
 * The executor is five files (stream-int.h lists them); this one holds the
 * executor interface, setup, the events, the ranges and the end. */
#include "uvm/stream-int.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/registry.h"
#include "core/settings.h"
#include "uvm/executor.h"
#include "uvm/graph.h"
#include "uvm/plan-budget.h"
#include "uvm/devmodel.h"
#include "uvm/stream-check.h"
#include "uvm/stream-pin.h"

static bool tried, rescan;

/* ---- ranges ----------------------------------------------------------------- */

/* Grows the executor's spans to hold sid. */
static struct srange *span_at(uint32_t sid)
{
    if (sid >= wo_sx->nr) {
        uint32_t n = WO_MIN(WO_MAX(sid + 1, wo_sx->nr * 2), WO_STREAM_ENTRIES);
        struct srange *v = realloc(wo_sx->r, (size_t)n * sizeof(*v));
        if (!v)
            return NULL;
        memset(v + wo_sx->nr, 0, (size_t)(n - wo_sx->nr) * sizeof(*v));
        for (uint32_t i = wo_sx->nr; i < n; i++) {
            v[i].slot = -1;
            v[i].ord = NONE;
        }
        wo_sx->r = v;
        wo_sx->nr = n;
    }
    return &wo_sx->r[sid];
}

/* Publishes span sid's bytes to the hooks (only while it is not streamed). */
static void publish_bounds(uint32_t sid, const struct srange *r)
{
    __atomic_store_n(&wo_stream_tab.e[sid].lo, r->lo, __ATOMIC_RELAXED);
    __atomic_store_n(&wo_stream_tab.e[sid].hi, r->hi, __ATOMIC_RELAXED);
}

/* A new span: the allocation's one (sid = its registry id) or a sub-span. */
static struct srange *new_span(uint32_t sid, uint32_t rid, uint32_t gen, uint64_t base,
                               uint64_t lo, uint64_t hi, const char *name)
{
    struct srange *r = span_at(sid);
    struct wo_stream_entry *e = &wo_stream_tab.e[sid];

    if (!r)
        return NULL;
    r->live = true;
    r->gen = gen;
    r->rid = rid;
    r->base = base;
    r->lo = lo;
    r->hi = hi;
    r->name = strdup(name ? name : "(unnamed)");
    r->gathered = wo_stream_gathered(r->name);
    __atomic_store_n(&e->word, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&e->next, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&e->inplace, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&e->base, base, __ATOMIC_RELAXED);
    __atomic_store_n(&e->gen, gen, __ATOMIC_RELAXED);
    publish_bounds(sid, r);
    return r;
}

/* A sub-span for the host tag [lo, hi) of allocation rid, linked after the
 * allocation's last, and the index entries of the granules no earlier one
 * ends past (hooks see it once linked: release). */
static void add_sub(uint32_t rid, uint32_t gen, uint64_t base, uint64_t lo, uint64_t hi,
                    const char *name)
{
    struct split *sp = &wo_sx->split[rid];
    const struct wo_stream_split *x = &wo_stream_tab.split[rid];
    uint32_t sid = WO_STREAM_IDS + wo_sx->nsub;
    uint64_t g0 = sp->last ? (wo_sx->r[sp->last - 1].hi - 1) >> x->shift : 0;

    if (wo_sx->nsub >= WO_STREAM_SUBS) {
        if (!wo_sx->said_subs_full) {
            wo_sx->said_subs_full = true;
            wo_info("stream: all %u sub-spans are used: '%s' and later host tags inside "
                    "one allocation are read in place",
                    WO_STREAM_SUBS, name ? name : "(unnamed)");
        }
        return;
    }
    if (!new_span(sid, rid, gen, base, lo, hi, name))
        return;
    wo_sx->nsub++;
    wo_sx->r[sid].host = true;
    add(&wo_stream_tab.n.sub_spans, 1);
    if (sp->last)
        __atomic_store_n(&wo_stream_tab.e[sp->last - 1].next, sid + 1, __ATOMIC_RELEASE);
    for (uint64_t g = g0; g <= (hi - 1) >> x->shift && g < x->n; g++)
        if (!wo_stream_tab.gidx[x->at + g])
            __atomic_store_n(&wo_stream_tab.gidx[x->at + g], sid + 1, __ATOMIC_RELEASE);
    sp->last = sid + 1;
}

/* Publishes allocation id (size bytes) as split, with an index of its
 * granules from the pool, all empty. False: the pool has no room. */
static bool index_alloc(uint32_t id, uint64_t size)
{
    struct wo_stream_split *x = &wo_stream_tab.split[id];
    uint32_t shift = WO_STREAM_GRANULE_SHIFT;
    uint64_t n;

    while ((n = ((size - 1) >> shift) + 1) > WO_STREAM_INDEX_MAX)
        shift++;
    if (n > WO_STREAM_GRANULES - wo_sx->ngidx)
        return false;
    __atomic_store_n(&x->at, wo_sx->ngidx, __ATOMIC_RELAXED);
    __atomic_store_n(&x->shift, shift, __ATOMIC_RELAXED);
    __atomic_store_n(&x->n, (uint32_t)n, __ATOMIC_RELEASE);
    wo_sx->ngidx += (uint32_t)n;
    return true;
}

/* Drops index id from the learned order and this step's list. */
static void unorder(uint32_t id)
{
    uint32_t n = 0;

    for (uint32_t i = 0; i < wo_sx->norder; i++)
        if (wo_sx->order[i] != id)
            wo_sx->order[n++] = wo_sx->order[i];
    wo_sx->norder = n;
    n = 0;
    for (uint32_t i = 0; i < wo_sx->ncur; i++)
        if (wo_sx->cur[i] != id)
            wo_sx->cur[n++] = wo_sx->cur[i];
    wo_sx->ncur = n;
}

/* Allocation id's off-device tags are no longer one span: other bytes lie
 * between them (llama.cpp's model buffer: device tensors between each
 * layer's host experts). Its span so far (nothing of it published yet)
 * goes; once this listing is over, the allocation is listed again
 * (list_ranges) and each of its host tags becomes a sub-span of its own;
 * managed tags in such an allocation are read in place (the planner keeps
 * them). False: no split (no room). */
static bool split_alloc(uint32_t id, uint64_t size, struct srange *r)
{
    char *name = r->name;
    uint32_t gen = r->gen;
    struct wo_stream_entry *e = &wo_stream_tab.e[id];

    if (!wo_sx->split && !(wo_sx->split = calloc(WO_STREAM_IDS, sizeof(*wo_sx->split))))
        return false;
    if (wo_sx->nsub + 1 >= WO_STREAM_SUBS)
        return false;
    /* the hooks find no span for the id from here until the sub-spans are
     * published (base 0 fails wo_stream_hit_in_span) */
    __atomic_store_n(&e->streamed, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&e->planned, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&e->word, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&e->base, 0, __ATOMIC_RELEASE);
    if (!index_alloc(id, size)) {
        __atomic_store_n(&e->base, r->base, __ATOMIC_RELEASE);
        return false;
    }
    if (wo_sx->pin_on)
        wo_pin_retire(id);
    unorder(id);
    r->name = NULL;
    memset(r, 0, sizeof(*r));
    r->slot = -1;
    r->ord = NONE;
    wo_sx->split[id] = (struct split){.gen = gen, .on = true, .pending = true};
    wo_sx->resplit = true;
    wo_info("stream: '%s': tensors placed on the device lie between the allocation's "
            "off-device tags: each host tag is a span of its own",
            name ? name : "(unnamed)");
    free(name);
    return true;
}

/* One segment of a split allocation: a host tag past the last sub-span's
 * end is a new one; a managed tag, or one at or before that end (seen
 * already), is no sub-span's. */
static void add_split_seg(const struct wo_uvm_segment *s, uint64_t base)
{
    struct split *sp = &wo_sx->split[s->id];
    struct srange *l = sp->last ? &wo_sx->r[sp->last - 1] : NULL;

    if (sp->tainted || sp->pending)
        return; /* pending: listed again from its first tag (list_ranges) */
    if (s->unnamed_before > PAD_MAX) {
        /* bytes no tag names lie between its tags after all (activations
         * may live there, and a kernel may read across them): the whole
         * allocation is read in place, as an unsplit one would be */
        const struct wo_stream_split *x = &wo_stream_tab.split[s->id];
        uint32_t sid = x->n ? wo_stream_tab.gidx[x->at] : 0; /* the first */

        sp->tainted = true;
        __atomic_store_n(&wo_stream_tab.split[s->id].n, 0, __ATOMIC_RELEASE);
        for (; sid && sid <= wo_sx->nr; sid = wo_stream_tab.e[sid - 1].next)
            if (wo_sx->r[sid - 1].live)
                wo_sx_drop(sid - 1);
        sp->last = 0;
        wo_info("stream: '%s': bytes no tag names lie between its allocation's tags: the "
                "allocation is read in place",
                s->name ? s->name : "(unnamed)");
        return;
    }
    if (s->place != WO_PLACE_HOST || (l && s->offset < l->hi))
        return;
    add_sub(s->id, s->gen, base, s->offset, s->offset + s->size, s->name);
}

/* Bytes no off-device tag names are not known to be weights: the engine's
 * allocator may hand them to activations after seal (PyTorch splits a
 * 20 MiB segment between two 8 MiB weights and whatever comes next), which
 * kernels write. So a span is made of off-device tags only, and a span
 * with other bytes between its tags is never streamed: a redirected write
 * would land in the slot. Where those bytes are all tensors placed on the
 * device, the allocation is split instead: a span per host tag
 * (split_alloc). The pieces of an allocation come in offset order, so a
 * tag that starts past the span's end (or ends before its start) leaves
 * such a gap. */
static int add_seg(const struct wo_uvm_segment *s, void *ud)
{
    struct srange *r;
    struct wo_range rg;

    (void)ud;
    if (s->untagged || s->id >= WO_STREAM_IDS || wo_registry_get(s->id, &rg) < 0 ||
        rg.gen != s->gen)
        return 0;
    if (s->bound && !wo_settings()->bind_copies) {
        wo_place_bind_in_place();
        return 0;
    }
    if (wo_sx->split && wo_sx->split[s->id].on) {
        if (wo_sx->split[s->id].gen == s->gen)
            add_split_seg(s, rg.base);
        return 0; /* an older allocation's: reap() drops its sub-spans first */
    }
    if (!(r = span_at(s->id)))
        return -ENOMEM;
    if (r->live && r->gen != s->gen)
        return 0; /* the free of the old one is still in the ring */
    if (!r->live) {
        if (!new_span(s->id, s->id, s->gen, rg.base, s->offset, s->offset + s->size, s->name))
            return -ENOMEM;
    } else {
        /* more off-device bytes of the same allocation: one span, unless
         * other bytes lie between (fewer than PAD_MAX are the alignment of
         * the tensor before: PyTorch rounds blocks to 512 bytes) */
        if (r->streamed || r->slot >= 0)
            return 0; /* its span is published: keep it */
        if ((s->offset > r->hi + PAD_MAX || s->offset + s->size + PAD_MAX < r->lo) && !r->gapped) {
            /* a gap after the span made of tags placed on the device
             * (alignment apart: no bytes an activation could take), found
             * while the allocation's tags are listed in offset order: a
             * span per host tag instead */
            if (s->offset > r->hi + PAD_MAX && s->unnamed_before <= PAD_MAX &&
                split_alloc(s->id, rg.size, r)) {
                add_split_seg(s, rg.base);
                return 0;
            }
            r->gapped = true;
            wo_info("stream: '%s': bytes no off-device tag names lie between its tags "
                    "(activations may live there): never streamed, read in place",
                    r->name ? r->name : "(unnamed)");
        }
        r->lo = WO_MIN(r->lo, s->offset);
        r->hi = WO_MAX(r->hi, s->offset + s->size);
    }
    r->host |= s->place == WO_PLACE_HOST;
    publish_bounds(s->id, r);
    return 0;
}

/* Lists the off-device ranges (add_seg); an allocation split on the way is
 * listed again, from its first tag, into its sub-spans. */
static int list_ranges(void)
{
    int ret = wo_uvm_foreach_offdevice(add_seg, NULL);

    if (ret >= 0 && wo_sx->resplit) {
        wo_sx->resplit = false;
        for (uint32_t id = 0; id < WO_STREAM_IDS; id++)
            wo_sx->split[id].pending = false;
        ret = wo_uvm_foreach_offdevice(add_seg, NULL);
    }
    return ret;
}

/* No range is streamed any more (the engine freed them): the slots go
 * back, once no hook holds one and the GPU is done with them. False: later
 * (a hook still holds a slot, or a capture is under way). */
static bool free_slots(void)
{
    const struct wo_driver *d = wo_sx->drv;
    CUcontext prev;

    if (!wo_sx->slots_ready)
        return true;
    for (unsigned i = 0; i < wo_sx->nslots; i++)
        if (__atomic_load_n(&wo_stream_tab.slot[i].inflight, __ATOMIC_SEQ_CST) > 0 ||
            wo_sx_at_engine(i, false))
            return false; /* a hook holds it, or kernels to come may read it (wo_sx_stage()) */
    /* after everything its readers' streams were given (wo_sx_stage(): why), and
     * each slot's contents checked for writes (check_slot) */
    if (!wo_sx_quiesce(0, wo_sx->nslots))
        return false;
    if (!wo_driver_enter())
        return false; /* a capture began: the slots go back later (checked again: no-op) */
    prev = wo_sx_push_ctx();
    /* behind the copy engine's gate, as every free of the shim's own
     * (wo_quiet_mem_free): a cuMemFree or a module's unload waits in the
     * driver for the context's work holding a lock the copy thread's
     * cuMemcpyAsync takes, while an engine stream may wait for a flag only
     * that thread raises. Ungated, the H100 stopped once right after auto
     * put its ranges back in place, which is when they run, with the copy
     * thread 5 s in cuMemcpyAsync (stream-gpu's
     * moe128-host-picks-engine-lazy,
     * bench/results/gpu-suite-20261205-172651e-h100.txt;
     * test-slots-gate-preload) */
    wo_uvm_quiesce_begin();
    /* the copies from them and their readers are done (quiesce): no event
     * to wait for */
    if (wo_sx->pin_on)
        wo_pin_retire_all(NULL);
    /* under the lock: a stream the engine destroys meanwhile has its
     * slots' read_done recorded there (wo_sx_stream_gone) */
    pthread_mutex_lock(&wo_uvm.lock);
    for (unsigned i = 0; i < wo_sx->nslots; i++) {
        struct wo_stream_slot *s = &wo_stream_tab.slot[i];
        if (s->dev && d->cuMemFree_v2)
            d->cuMemFree_v2((CUdeviceptr)s->dev);
        if (d->cuEventDestroy_v2) {
            if (s->copied)
                d->cuEventDestroy_v2(s->copied);
            if (s->read_done)
                d->cuEventDestroy_v2(s->read_done);
        }
        s->dev = 0;
        wo_sx->slot_sz[i] = 0;
        s->copied = s->read_done = NULL;
        __atomic_store_n(&s->owner, 0, __ATOMIC_RELEASE);
        /* a range whose wo_sx_unpublish() failed may still name the slot */
        if (wo_sx->slot_range[i] >= 0 && (uint32_t)wo_sx->slot_range[i] < wo_sx->nr)
            wo_sx->r[wo_sx->slot_range[i]].slot = -1;
        for (uint32_t id = 0; id < wo_sx->nr; id++)
            if (wo_sx->r[id].slot == (int)i)
                wo_sx->r[id].slot = -1;
        wo_sx->slot_range[i] = -1;
        wo_sx->slot_last[i] = NONE;
        wo_sx->slot_chk[i] = NONE;
    }
    pthread_mutex_unlock(&wo_uvm.lock);
    for (uint32_t id = 0; id < wo_sx->nr; id++) {
        wo_sx->r[id].hashed = false; /* the hashes go with the checker */
        wo_sx->r[id].chk_slot1 = 0;
    }
    wo_sx_time_free();
    if (wo_sx->copy && d->cuStreamDestroy_v2)
        d->cuStreamDestroy_v2(wo_sx->copy);
    wo_sx->copy = NULL;
    if (wo_sx->copy_mod)
        d->cuModuleUnload(wo_sx->copy_mod);
    wo_sx->copy_mod = NULL;
    wo_sx->copy_fn = NULL;
    wo_check_stop();
    wo_sx->check_on = false;
    wo_uvm_quiesce_end();
    wo_sx_pop_ctx(prev);
    wo_driver_leave();
    wo_sx->slots_ready = false;
    add(&wo_stream_tab.n.slot_frees, 1);
    __atomic_store_n(&wo_stream_tab.n.slot_bytes, 0, __ATOMIC_RELAXED);
    wo_debug("stream: no range is streamed any more: the slots are given back");
    return true;
}

/* Frees reach uvm/ on the engine's thread (wo_uvm_free), not as events:
 * a range whose registry slot is gone or reused is dropped here. */
static void unsplit(uint32_t id);

static void reap(void)
{
    for (uint32_t id = 0; id < wo_sx->nr; id++) {
        struct wo_range rg;

        if (wo_sx->r[id].live &&
            (wo_registry_get(wo_sx->r[id].rid, &rg) < 0 || rg.gen != wo_sx->r[id].gen))
            wo_sx_drop(id);
    }
    /* a split allocation whose sub-spans all went (or that had none) */
    for (uint32_t id = 0; wo_sx->split && id < WO_STREAM_IDS; id++) {
        struct wo_range rg;

        if (wo_sx->split[id].on &&
            (wo_registry_get(id, &rg) < 0 || rg.gen != wo_sx->split[id].gen))
            unsplit(id);
    }
}

static bool any_streamed(void)
{
    for (uint32_t i = 0; i < wo_sx->nr; i++) {
        struct srange *r = &wo_sx->r[i];

        if (r->live && !wo_sx_unselect_claimed(r, i) && r->streamed)
            return true;
    }
    return false;
}

/* Allocation id is no longer split (it was freed): the hooks find no
 * sub-span of it from now on; those left are dropped by reap(). The next
 * launch lists the ranges again: an allocation that took the id since was
 * passed over while the old one's split stood. */
static void unsplit(uint32_t id)
{
    __atomic_store_n(&wo_stream_tab.split[id].n, 0, __ATOMIC_RELEASE);
    wo_sx->split[id] = (struct split){0};
    rescan = true;
}

static void on_copy(const struct wo_event *ev)
{
    struct wo_range rg;
    struct wo_ev_hit w;
    struct srange *r;
    uint32_t it = 0, sid;

    if (wo_registry_find(ev->c.dst, &rg) < 0)
        return;
    w = (struct wo_ev_hit){rg.id, rg.gen, ev->c.dst - rg.base,
                           ev->c.dst - rg.base + (ev->c.bytes ? ev->c.bytes : 1)};
    /* the allocation's span, or each sub-span the copy overlaps */
    while ((r = wo_sx_span_next(&w, &it, &sid)))
        if (w.offset < r->hi && w.hi > r->lo)
            wo_sx_mark_written(r, sid);
}

static bool keep_slots(void);

/* The device bytes the slots take from the planner's budget (plan-budget.h):
 * theirs once a range is streamed, or while auto keeps them made through
 * its watch (keep_slots), else none. */
static uint64_t reserved(void)
{
    if (!wo_sx || wo_sx->slots_failed)
        return 0;
    for (uint32_t i = 0; i < wo_sx->nr; i++)
        if (wo_sx->r[i].live && wo_sx->r[i].streamed)
            return wo_sx_slots_bytes();
    return wo_sx->slots_ready && keep_slots() ? wo_sx_slots_bytes() : 0;
}

/* Whether the range is streamed (the prefetcher leaves it alone). */
static bool claims(uint32_t id, uint32_t gen)
{
    return wo_sx && id < wo_sx->nr && wo_sx->r[id].live && wo_sx->r[id].gen == gen &&
           wo_sx->r[id].streamed;
}

/* The blind launches (graph replays: nothing is staged through them) its
 * slots stayed empty through; 0 once a range was streamed. */
static uint64_t blind_unused(void)
{
    if (!wo_sx || wo_sx->ever_streamed)
        return 0;
    return __atomic_load_n(&wo_stream_tab.n.blind_launches, __ATOMIC_RELAXED);
}

static const struct wo_budget_stager budget_ops = {
    .reserved = reserved,
    .claims = claims,
    .blind_unused = blind_unused,
};

/* ---- setup ----------------------------------------------------------------- */

static void setup(void)
{
    const struct wo_driver *drv = wo_uvm_driver();
    const struct wo_policy *pol = wo_uvm_policy();
    const struct wo_policy_globals *g = pol ? wo_policy_globals(pol) : NULL;
    uint64_t largest = 0, budget = wo_uvm_device_budget(), *sizes;
    size_t nsizes = 0;
    CUdevice dev;

    tried = true;
    /* the prefetcher asks what the slots take (none while wo_sx is NULL) */
    wo_budget_stager(&budget_ops);
    /* hooks look at the table only once it is active: clear what a
     * previous instance (tests reset uvm/) left, word by word (the hooks
     * and the stats read it concurrently, atomically) */
    wo_stream_table_clear();
    if (!drv || !g || !wo_settings()->prefetch || !g->prefetch.enabled)
        return;
    wo_sx = calloc(1, sizeof(*wo_sx));
    if (!wo_sx)
        return;
    wo_sx->drv = drv;
    wo_sx->mode = wo_stream_mode_of(g->prefetch.mode);
    wo_sx->pin_limit = g->prefetch.pinned_copies;
    wo_sx->checks_wanted = wo_settings()->write_checks;
    wo_sx->nslots = WO_MIN(wo_stream_slots_wanted(g), WO_STREAM_MAX_SLOTS);
    wo_sx->maxi = NONE;
    for (unsigned i = 0; i < WO_STREAM_MAX_SLOTS; i++) {
        wo_sx->slot_range[i] = -1;
        wo_sx->slot_last[i] = NONE;
        wo_sx->slot_chk[i] = NONE;
    }
    wo_stream_keys_init(&wo_sx->keys);
    wo_auto_init(&wo_sx->au);
    wo_auto_set_recheck(&wo_sx->au, wo_settings()->stream_recheck);
    {
        struct wo_devmodel dm;
        wo_devmodel_default(&dm);
        wo_sx->link_gbs = dm.h2d_gbs;
    }
    if (drv->cuDeviceGet && drv->cuDevicePrimaryCtxRetain &&
        drv->cuDeviceGet(&dev, wo_uvm.device) == CUDA_SUCCESS)
        drv->cuDevicePrimaryCtxRetain(&wo_sx->ctx, dev);
    if (list_ranges() < 0)
        wo_warn("stream: out of memory listing ranges; some are read in place");
    /* the slots hold 90% of the bytes' ranges (wo_stream_slot_size) */
    sizes = malloc((wo_sx->nr ? wo_sx->nr : 1) * sizeof(*sizes));
    for (uint32_t i = 0; sizes && i < wo_sx->nr; i++)
        if (wo_sx->r[i].live && !wo_sx->r[i].gathered)
            sizes[nsizes++] = wo_sx->r[i].hi - wo_sx->r[i].lo;
    largest = sizes ? wo_stream_slot_size(sizes, nsizes) : 0;
    free(sizes);
    /* the slots count against the device budget: fewer slots when they do
     * not fit, none below two (a copy could then never overlap the reads) */
    while (wo_sx->nslots > WO_STREAM_SLOTS_MIN && (uint64_t)wo_sx->nslots * largest > budget)
        wo_sx->nslots--;
    if (wo_sx->mode.measure_only) {
        /* measures (multiplicity, the warning) and never streams */
        wo_sx->slots_failed = true;
    } else if (!largest || (uint64_t)wo_sx->nslots * largest > budget) {
        /* a warning where the policy asked to stream; under auto (the
         * default) a fact, at info */
        if (largest && wo_sx->mode.all)
            wo_warn("stream: %u slots of %llu MiB do not fit in the device budget (%llu MiB): "
                    "host and managed ranges are read in place",
                    wo_sx->nslots, (unsigned long long)(largest >> 20),
                    (unsigned long long)(budget >> 20));
        else if (largest)
            wo_info("stream: auto: %u slots of %llu MiB do not fit in the device budget (%llu "
                    "MiB): host and managed ranges are read in place",
                    wo_sx->nslots, (unsigned long long)(largest >> 20),
                    (unsigned long long)(budget >> 20));
        wo_sx->slots_failed = true;
    }
    wo_sx->slot_size = largest;
    if (wo_sx->mode.all && !wo_sx->slots_failed)
        for (uint32_t i = 0; i < wo_sx->nr; i++)
            if (wo_sx->r[i].live)
                wo_sx_select_range(&wo_sx->r[i], i, false);
    __atomic_store_n(&wo_stream_tab.active, 1, __ATOMIC_RELEASE);
    wo_info("stream: mode %s, %u slots of up to %llu MiB",
            wo_sx->mode.all       ? "stream"
            : wo_sx->mode.by_auto ? "auto"
                                  : "hot-set (measures only)",
            wo_sx->nslots, (unsigned long long)(largest >> 20));
}

/* Graph launches (WOFFLOAD_GRAPH_REPLAY on): the executor learns from the
 * launches a graph runs as it learns from eager ones, at the graph
 * launch's time. A graph's launches read in place, but a graph that reads
 * a streamed range not claimed read in place is replayed kernel by kernel
 * (preload/graph-replay.c), its launches then seen as eager ones: without
 * this, an engine whose every step is a graph (llama.cpp) would never show
 * the executor a step, stream nothing, and never be replayed. */
static struct wo_graphs *sx_graphs;

static void on_graph_launch(const struct wo_event *ev)
{
    const struct wo_event *rep = NULL;
    ssize_t n;

    if (!sx_graphs)
        return;
    n = wo_graphs_expand(sx_graphs, ev, &rep);
    for (ssize_t k = 0; k < n; k++) {
        struct wo_event e = rep[k];

        e.t_ns = ev->t_ns; /* it runs now, not when it was captured */
        e.capture = 0;
        wo_sx_on_launch(&e);
    }
}

/* The captures and instantiations, from the first event on (a capture may
 * begin before the executor is set up at its first launch). */
static bool tried_graphs;

static void graph_note(const struct wo_event *ev)
{
    const struct wo_event *rep;

    switch (ev->type) {
    case WO_EV_LAUNCH:
        if (!ev->capture)
            return;
        break;
    case WO_EV_CAPTURE_BEGIN:
    case WO_EV_CAPTURE_END:
    case WO_EV_GRAPH_INSTANTIATE:
        break;
    default:
        return;
    }
    if (!tried_graphs) {
        tried_graphs = true;
        if (wo_settings()->graph_replay)
            sx_graphs = wo_graphs_new(); /* NULL: graph launches teach nothing */
    }
    if (sx_graphs)
        (void)wo_graphs_expand(sx_graphs, ev, &rep);
}

static void on_event(const struct wo_event *ev)
{
    graph_note(ev);
    if (!wo_sx) {
        /* the budget is resolved at seal: before that nothing is placed */
        if (tried || ev->type != WO_EV_LAUNCH || wo_uvm_device_budget() == 0)
            return;
        setup();
        if (!wo_sx)
            return;
    }
    switch (ev->type) {
    case WO_EV_TAG:
    case WO_EV_ALLOC:
    case WO_EV_PLACE:
        rescan = true;
        return;
    case WO_EV_FREE: /* (traces only: frees are found by reap()) */
        for (uint32_t id = 0; id < wo_sx->nr; id++)
            if (wo_sx->r[id].live && wo_sx->r[id].base == ev->a.base)
                wo_sx_drop(id);
        return;
    case WO_EV_COPY:
        on_copy(ev);
        return;
    case WO_EV_LAUNCH:
        if (rescan) {
            rescan = false;
            (void)list_ranges();
        }
        if (ev->capture)
            return; /* recorded into a capture (graph_note): runs at its graph's launches */
        wo_sx_on_launch(ev);
        wo_sx_advance();
        return;
    case WO_EV_GRAPH_LAUNCH:
        on_graph_launch(ev);
        return;
    default:
        return;
    }
}

/* Whether the slots, nothing streamed now, stay made: while auto watches
 * again after a decision to stream was left for the period's drift
 * (stream-auto.h), the next try is likely a few steps away, and giving the
 * slots back quiesces the engine's streams and frees device memory that
 * the try makes again. Measured by test-stream-preload's auto-drift only:
 * on the CPU soak of llama-server with picks on every compute the picks'
 * claims emptied the slots before any watch (bench/results/serve-soak-
 * 20261208-claims-cpu). Only where every range is
 * host: no managed range the planner would keep in their room, so the
 * in-place steps the watch measures are those without the slots. A watch
 * that decides to hold in place gives them back. */
static bool keep_slots(void)
{
    bool any = false;

    if (!wo_sx->mode.by_auto || wo_sx->au.phase != WO_AUTO_WATCH || wo_sx->au.rechecking ||
        wo_sx->au.managed)
        return false;
    for (uint32_t i = 0; i < wo_sx->nr; i++) {
        if (wo_sx->r[i].live && !wo_sx->r[i].host)
            return false;
        any |= wo_sx->r[i].live;
    }
    return any; /* none left (the engine freed them): nothing to try */
}

static void tick(void)
{
    if (wo_sx) {
        reap();
        wo_sx_poll_checks(false, NONE);
        wo_sx_time_poll();
        if (wo_sx->slots_ready && !any_streamed() && !keep_slots())
            (void)free_slots();
        wo_sx_advance();
        wo_sx_publish_names(false);
        if (wo_sx->pin_on)
            wo_pin_tick(wo_sx->copy);
    }
}

/* ---- the end -------------------------------------------------------------------- */

static void free_exec(void)
{
    for (uint32_t i = 0; i < wo_sx->nr; i++)
        free(wo_sx->r[i].name);
    free(wo_sx->r);
    free(wo_sx->order);
    free(wo_sx->cur);
    free(wo_sx->fns);
    free(wo_sx->split);
    wo_stream_keys_done(&wo_sx->keys);
    free(wo_sx);
    wo_sx = NULL;
}

void wo_stream_summary(void)
{
    struct wo_stream_counts c;
    struct wo_devmodel dm;
    char sz[32], step[32], autos[128] = "", timed[192] = "", react[128] = "", fences[160] = "";
    char busy[192] = "", claims[288] = "";
    double n;

    wo_stream_counts(&c);
    if (!c.staged)
        return;
    wo_devmodel_default(&dm);
    n = (double)c.staged;
    if (c.auto_tries)
        snprintf(autos, sizeof(autos),
                 "; auto: %" PRIu64 " tried, %" PRIu64 " kept, %" PRIu64 " back in place, %" PRIu64
                 " rechecked, %" PRIu64 " held back by the backoff",
                 c.auto_tries, c.auto_kept, c.auto_backs, c.auto_rechecks, c.auto_deferred);
    if (c.staging_steps && c.staging_step_ns)
        snprintf(timed, sizeof(timed),
                 "; %" PRIu64 " steps that staged took %.1f ms each: %.1f GB/s of copies (the link: %.0f GB/s)",
                 c.staging_steps, (double)c.staging_step_ns / (double)c.staging_steps / 1e6,
                 (double)c.staging_step_bytes / (double)c.staging_step_ns, dm.h2d_gbs);
    if (c.copies_timed && c.copies_busy_ns)
        snprintf(busy, sizeof(busy),
                 "; the copy engine moved %" PRIu64 " timed copies at %.1f GB/s while it copied them "
                 "(%.0f%% of the staging steps' time)",
                 c.copies_timed, (double)c.copies_timed_bytes / (double)c.copies_busy_ns,
                 c.staging_step_ns ? 100.0 * (double)c.copies_busy_ns / (double)c.staging_step_ns
                                   : 0.0);
    if (c.fences_departed + c.fences_at_reuse)
        snprintf(fences, sizeof(fences),
                 "; slots reused after the engine left them: %" PRIu64 ", after all it had submitted: %" PRIu64,
                 c.fences_departed, c.fences_at_reuse);
    if (c.inplace_claims)
        snprintf(claims, sizeof(claims),
                 "; %" PRIu64 " claims to read in place (woffload_read_in_place): %" PRIu64
                 " launches read a claimed range in place",
                 c.inplace_claims, c.inplace_claimed);
    if (c.claim_unselects)
        snprintf(claims + strlen(claims), sizeof(claims) - strlen(claims),
                 "; %" PRIu64 " streamed ranges taken out for the router's picks (%" PRIu64
                 " staged copies dropped)",
                 c.claim_unselects, c.claim_unselects_staged);
    if (c.reactions)
        snprintf(react, sizeof(react), "; the executor took the engine's position up %.3f ms after a hook "
                 "moved it (at most %.3f ms)",
                 (double)c.reaction_ns / (double)c.reactions / 1e6, (double)c.reaction_max_ns / 1e6);
    wo_log_write(WO_LOG_OFF,
                 "stream: %" PRIu64 " staging copies (%s, %s a step over %" PRIu64 " steps): %.0f%% from "
                 "pinned copies (copy engine), %.0f%% by the copy kernel, %.0f%% from host memory "
                 "(copy engine)%s%s; launches: %" PRIu64 " redirected, %" PRIu64 " read in place with no "
                 "slot ready, %" PRIu64 " in place in a capture%s%s%s%s",
                 c.staged, wo_format_size(c.staged_bytes, sz, sizeof(sz)),
                 wo_format_size(c.steps ? c.staged_bytes / c.steps : 0, step, sizeof(step)), c.steps,
                 100.0 * (double)c.staged_pinned / n, 100.0 * (double)c.staged_by_kernel / n,
                 100.0 * (double)(c.staged - WO_MIN(c.staged, c.staged_pinned + c.staged_by_kernel)) / n,
                 timed, busy, c.redirected, c.inplace_no_slot, c.inplace_captured, claims, react,
                 fences, autos);
}

static void finish(void)
{
    struct wo_stream_counts c;
    unsigned shown = 0;

    wo_graphs_free(sx_graphs);
    sx_graphs = NULL;
    tried_graphs = false;
    if (!wo_sx)
        return;
    /* the hooks stop redirecting: launches after this read in place */
    __atomic_store_n(&wo_stream_tab.active, 0, __ATOMIC_RELEASE);
    wo_sx_publish_names(true);
    wo_stream_counts(&c);
    /* the copies, their sources and rate, the launches redirected or read
     * in place and auto's decisions are the exit summary's stream line
     * (wo_stream_summary); these are the rest */
    wo_info("stream: %llu launches read in place for another reason (stream, context, "
            "parameters); %llu slot waits, %llu assignments invalidated by writes, %llu slots "
            "checked for writes by launches (%llu written, copied back); %llu launches waited "
            "for their copy to be issued (%.1f ms in all, %llu ran out)",
            (unsigned long long)c.inplace_other, (unsigned long long)c.slot_waits,
            (unsigned long long)c.invalidated, (unsigned long long)c.write_checks,
            (unsigned long long)c.written_back, (unsigned long long)c.awaited,
            (double)c.await_ns / 1e6, (unsigned long long)c.await_timeouts);
    if (c.blind_launches)
        wo_info("stream: %llu launches that may write weights unseen (NCCL kernels, CUDA graphs "
                "that read them): every range staged after them from the range itself%s",
                (unsigned long long)c.blind_launches,
                c.blind_unfenced ? "; one could not be fenced, and streaming stopped" : "");
    if (wo_sx->pin_on) {
        struct wo_pin_counts pc;
        wo_pin_counts(&pc);
        wo_info("stream: %llu pinned copies of managed ranges made (%.1f s of the worker's "
                "time), %llu held (%llu MiB), %llu retired, %llu failed, %llu over "
                "prefetch.pinned_copies",
                (unsigned long long)pc.made, (double)pc.pin_ns / 1e9, (unsigned long long)pc.held,
                (unsigned long long)(pc.bytes >> 20), (unsigned long long)pc.retired,
                (unsigned long long)pc.failed, (unsigned long long)pc.over_budget);
    }
    for (uint32_t i = 0; i < wo_sx->nr && shown < 10; i++) {
        const struct srange *r = &wo_sx->r[i];
        if (!r->live || !r->msteps || (r->sum_mult / (double)r->msteps < 1.5 && !r->streamed))
            continue;
        shown++;
        wo_info("stream: %s: read %.1fx a step (%s, %s)", r->name ? r->name : "(unnamed)",
                r->sum_mult / (double)r->msteps, r->host ? "host" : "managed",
                r->streamed  ? "streamed"
                : r->written ? "written, in place"
                             : "in place");
    }
    /* finish runs at exit, possibly after the driver's teardown: no driver
     * call; the slots, events, stream and pinned copies go with the process */
    if (wo_sx->pin_on)
        wo_pin_stop();
    free_exec();
    tried = false;
}

static __attribute__((used)) struct exec *parents_exec;
static __attribute__((used)) struct wo_graphs *parents_graphs;

static void atfork_child(void)
{
    /* the parent's slots and events mean nothing here: forget them (kept
     * reachable for leak checkers) and read in place */
    parents_exec = wo_sx;
    wo_sx = NULL;
    parents_graphs = sx_graphs;
    sx_graphs = NULL;
    wo_pin_atfork_child();
    wo_check_atfork_child();
    wo_sx_time_atfork_child();
    tried = false;
    rescan = false;
    wo_stream_table_clear();
}

const struct wo_executor wo_stream_executor = {
    .name = "stream",
    .on_event = on_event,
    .tick = tick,
    .finish = finish,
    .atfork_child = atfork_child,
};
