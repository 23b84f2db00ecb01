/* uvm/picks.c: picked staging (uvm/picks.h): the experts a router picked,
 * copied on the engine's stream right before the launch that reads them. */
#include "uvm/picks.h"

#include <cuda.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/event.h"
#include "core/log.h"
#include "core/macro.h"
#include "core/registry.h"
#include "core/settings.h"
#include "uvm/internal.h"
#include "uvm/picks-dma.h"
#include "uvm/picks-geom.h"
#include "uvm/picks-hot.h"
#include "uvm/picks-int.h"
#include "uvm/picks-kern.h"
#include "uvm/picks-pool.h"
#include "uvm/picks-time.h"
#include "uvm/plan-budget.h"
#include "uvm/uvm.h"

#define BUF_ALIGN (2ull << 20)
#define EARLY_GROUP 3         /* a layer's expert tensors with one picks: gate, up, down */
#define REFRESH_NS 1000000ull /* the rows counters read back at most this often */
#define ROWS_BYTES (2 * WO_PICKS_SPANS * sizeof(uint64_t)) /* wo_pk.rows */

struct wo_picks_state wo_pk = {.lock = PTHREAD_MUTEX_INITIALIZER};

static const char *err_name(CUresult r)
{
    const struct wo_driver *d = wo_uvm_driver();
    const char *s = NULL;

    if (d && d->cuGetErrorName)
        d->cuGetErrorName(r, &s);
    return s ? s : "?";
}

/* ---- registration ---------------------------------------------------------- */

/* The tag's name at addr and whether its bytes are off the device, from
 * uvm/'s books (wo_uvm.lock; taken before the picks lock, never inside).
 * A late-bound range (*bound) is never copied picked: its launches read
 * it in place (wo_place_bind_in_place). */
static char *describe(uint64_t addr, bool *offdev, uint8_t *source, bool *bound)
{
    struct wo_alloc *a;
    char *name = NULL;

    *offdev = false;
    *bound = false;
    *source = SRC_NONE;
    pthread_mutex_lock(&wo_uvm.lock);
    a = wo_alloc_find_addr(addr);
    if (a) {
        enum wo_placement place = a->place;
        for (size_t i = 0; i < a->ntags; i++) {
            const struct wo_tag *t = &a->tags[i];
            if (addr - a->base >= t->off && addr - a->base < t->off + t->size) {
                place = t->place;
                name = strdup(t->name->s);
                break;
            }
        }
        /* pinned memory is host memory whatever the tag asked; managed
         * memory the planner keeps resident is still read over PCIe until
         * it is, and a copy from it is no slower than the launch's read */
        /* a bound range on the device (WOFFLOAD_FIT_BIND's) is device
         * memory; off it, it is read in place, or with
         * WOFFLOAD_BIND_COPIES copied picked from the range itself (its
         * host granules are pinned memory the copy engine reads) */
        *bound = a->kind == WO_KIND_BOUND && place != WO_PLACE_DEVICE &&
                 !wo_settings()->bind_copies;
        *offdev = a->kind == WO_KIND_PINNED ||
                  (a->kind != WO_KIND_OBSERVED && !*bound &&
                   (place == WO_PLACE_HOST || place == WO_PLACE_MANAGED));
        *source = a->kind == WO_KIND_PINNED                                ? SRC_PINNED
                  : a->kind == WO_KIND_MANAGED && place == WO_PLACE_HOST ? SRC_MIRROR
                                                                         : SRC_NONE;
    }
    pthread_mutex_unlock(&wo_uvm.lock);
    return name;
}

static int find_span(uint64_t lo, uint64_t hi)
{
    for (unsigned i = 0; i < wo_pk.n; i++)
        if (wo_pk.s[i].lo == lo && wo_pk.s[i].hi == hi)
            return (int)i;
    return -1;
}

/* Span s's hot set out of use: freed with the rest (copies may still read
 * it; past the list's room it is left to the process's end). */
static void retire(struct span *s)
{
    if (s->hot && wo_pk.nretired < WO_PICKS_SPANS)
        wo_pk.retired[wo_pk.nretired++] = s->hot;
    if (s->hot)
        __atomic_add_fetch(&wo_picks_hot_epoch, 1, __ATOMIC_RELAXED);
    s->hot = NULL;
}

int wo_picks_set(uint64_t experts, uint64_t bytes, unsigned n_experts, uint64_t ids, uint64_t n_ids,
                 uint64_t per_row, uint64_t stride, unsigned id_bytes, bool sticky)
{
    struct wo_range rg;
    struct span *s;
    bool offdev = false, bound = false;
    uint8_t source = SRC_NONE;
    char *name = NULL;
    int i, r = 0;

    if (wo_registry_find(experts, &rg) != 0)
        return -ENOENT;
    if (bytes > rg.size - (experts - rg.base))
        return -ERANGE;
    pthread_mutex_lock(&wo_pk.lock);
    i = find_span(experts, experts + bytes);
    s = i >= 0 ? &wo_pk.s[i] : NULL;
    if (s && s->rid == rg.id && s->rgen == rg.gen && !s->stale) {
        /* a registration with ids (a layer's, once a forward step); a
         * clear is none */
        s->regs += ids != 0;
        wo_pk.c.regs += ids != 0;
        s->ids = ids;
        s->n_ids = ids ? n_ids : 0;
        s->per_row = per_row;
        s->stride = stride;
        s->width = id_bytes;
        s->share = wo_picks_share_pct(s->n_ids, per_row, n_experts);
        if (ids)
            s->whole = wo_picks_whole_of(s->whole, s->share, wo_settings()->picks_whole);
        s->sticky |= sticky && ids;
        s->owner = pthread_self();
        s->seq++;
        pthread_mutex_unlock(&wo_pk.lock);
        return 0;
    }
    pthread_mutex_unlock(&wo_pk.lock);
    /* a new tensor, or new memory at the same address: learn it (outside
     * the picks lock: describe takes uvm/'s) */
    name = describe(experts, &offdev, &source, &bound);
    pthread_mutex_lock(&wo_pk.lock);
    if (bound)
        wo_place_bind_in_place();
    if (!wo_pk.s && !(wo_pk.s = calloc(WO_PICKS_SPANS, sizeof(*wo_pk.s)))) {
        r = -ENOMEM;
        goto out;
    }
    i = find_span(experts, experts + bytes);
    if (i < 0) {
        if (wo_pk.n == WO_PICKS_SPANS) {
            r = -ENOSPC;
            goto out;
        }
        i = (int)wo_pk.n++;
    }
    s = &wo_pk.s[i];
    free(s->name);
    retire(s);
    *s = (struct span){.lo = experts,
                       .hi = experts + bytes,
                       .off = experts - rg.base,
                       .row = bytes / n_experts,
                       .rid = rg.id,
                       .rgen = rg.gen,
                       .n_experts = n_experts,
                       .offdev = offdev,
                       .ondev = !offdev && !bound,
                       .source = source,
                       .wseq = s->wseq + 1,
                       .ids = ids,
                       .n_ids = ids ? n_ids : 0,
                       .per_row = per_row,
                       .stride = stride,
                       .sticky = sticky && ids,
                       .width = id_bytes,
                       .share = wo_picks_share_pct(ids ? n_ids : 0, per_row, n_experts),
                       .owner = pthread_self(),
                       .seq = s->seq + 1,
                       .next = -1,
                       .name = name,
                       .regs = ids != 0};
    s->whole = ids && wo_picks_whole_of(false, s->share, wo_settings()->picks_whole);
    name = NULL;
    wo_pk.c.regs += ids != 0;
    __atomic_store_n(&wo_pk.dma_rows[i], 0, __ATOMIC_RELAXED);
    /* the buffers that held the old tensor's rows hold nothing now */
    wo_pool_forget_span(i);
    if (rg.id < WO_STREAM_IDS && wo_picks_ids[rg.id] < 255)
        __atomic_store_n(&wo_picks_ids[rg.id], (uint8_t)(wo_picks_ids[rg.id] + 1),
                         __ATOMIC_RELEASE);
    /* the copy hooks' writes reach this executor from now on */
    wo_stream_note_write_install(wo_picks_note_write);
    __atomic_store_n(&wo_picks_any, 1, __ATOMIC_RELEASE);
    if (!offdev && !bound)
        wo_debug("picks: '%s' is on the device: its launches need no staging",
                 s->name ? s->name : "(unnamed)");
    /* announced (no ids: the ggml hook's first sight of a tensor it may
     * register from a share, WOFFLOAD_GGML_PICKS_FROM): its pinned mirror
     * asked for now (seconds to make), so that the first copies that go to
     * the copy engine find it there; a tensor registered with ids asks at
     * its first such copy */
    if (source == SRC_MIRROR && !ids && wo_uvm_picks_engine() && wo_readonly(rg.id, rg.gen)) {
        const struct wo_driver *d = wo_uvm_driver();
        CUcontext cur = NULL;

        if (d && d->cuCtxGetCurrent && d->cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur)
            wo_dma_mirror_ask(d, cur, (unsigned)i, s->lo, rg.id, rg.gen, s->hi - s->lo, s->wseq);
    }
out:
    pthread_mutex_unlock(&wo_pk.lock);
    free(name);
    return r;
}

void wo_picks_note_write(uint64_t dst, uint64_t bytes)
{
    if (!__atomic_load_n(&wo_picks_any, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&wo_pk.lock);
    for (unsigned i = 0; i < wo_pk.n; i++)
        if (dst < wo_pk.s[i].hi && dst + bytes > wo_pk.s[i].lo) {
            wo_pk.s[i].seq++;
            wo_pk.s[i].wseq++;
            wo_pk.c.writes++;
            if (wo_pk.s[i].hot)
                wo_hot_invalidate(wo_pk.s[i].hot);
        }
    pthread_mutex_unlock(&wo_pk.lock);
}

/* ---- the device side ------------------------------------------------------- */

/* Module, marks and counters in the current context, once (the picks lock
 * held; never during a global capture: a module load or an allocation
 * would invalidate it). False: read in place. */
static bool ready(const struct wo_driver *d)
{
    CUcontext cur = NULL;
    CUresult res;
    size_t marks = (size_t)WO_PICKS_STREAMS * WO_PICKS_BUFS * WO_PICKS_EXPERTS * 4;

    if (wo_pk.broken || !d->cuCtxGetCurrent || d->cuCtxGetCurrent(&cur) != CUDA_SUCCESS || !cur)
        return false;
    if (wo_pk.ready)
        return cur == wo_pk.ctx;
    if (__atomic_load_n(&wo_captures_live, __ATOMIC_SEQ_CST))
        return false;
    if (!d->cuModuleLoadData || !d->cuModuleGetFunction || !d->cuLaunchKernel ||
        !d->cuMemAlloc_v2 || !d->cuMemFree_v2 || !d->cuMemsetD8_v2 || !d->cuMemHostAlloc ||
        !d->cuMemcpyAsync || !d->cuStreamCreate || !d->cuStreamSynchronize) {
        wo_pk.broken = true;
        wo_warn("picks: the driver lacks a function picked staging needs: the experts are read "
                "in place");
        return false;
    }
    res = d->cuModuleLoadData(&wo_pk.mod, wo_copy_ptx());
    if (res == CUDA_SUCCESS)
        res = d->cuModuleGetFunction(&wo_pk.mark, wo_pk.mod, "wo_picks_mark");
    if (res == CUDA_SUCCESS)
        res = d->cuModuleGetFunction(&wo_pk.copy, wo_pk.mod, "wo_picks_copy");
    if (res == CUDA_SUCCESS)
        res = d->cuModuleGetFunction(&wo_pk.fill, wo_pk.mod, "wo_stream_copy");
    if (res == CUDA_SUCCESS)
        res = d->cuMemAlloc_v2(&wo_pk.marks, marks);
    if (res == CUDA_SUCCESS)
        res = d->cuMemAlloc_v2(&wo_pk.rows, ROWS_BYTES);
    if (res == CUDA_SUCCESS)
        res = d->cuMemsetD8_v2(wo_pk.marks, 0, marks);
    if (res == CUDA_SUCCESS)
        res = d->cuMemsetD8_v2(wo_pk.rows, 0, ROWS_BYTES);
    if (res == CUDA_SUCCESS)
        res = d->cuMemHostAlloc((void **)&wo_pk.rows_host, ROWS_BYTES, 0);
    if (res == CUDA_SUCCESS)
        res = d->cuStreamCreate(&wo_pk.side, CU_STREAM_NON_BLOCKING);
    if (res != CUDA_SUCCESS) {
        /* what was made stays (a few MiB): freeing it needs the context
         * idle, and this is the engine's launch path */
        wo_pk.broken = true;
        wo_warn("picks: cannot set up picked staging (%s): the experts are read in place",
                err_name(res));
        return false;
    }
    memset(wo_pk.rows_host, 0, ROWS_BYTES);
    wo_pk.ctx = cur;
    wo_pk.ready = true;
    wo_pool_forget_all();
    return true;
}

/* The engine destroys stream (before the real call): its buffers, if it
 * has any, wait for its work there (its launches may still read them; a
 * later owner overwrites them) and go to the next stream that asks, empty;
 * the entry is free. Without this a growing buffer synchronised a freed
 * stream, and a destroyed stream's entry was never given back. */
void wo_picks_stream_gone(uint64_t stream)
{
    pthread_mutex_lock(&wo_pk.lock);
    /* its hot sets' copies are done with it too: the next stream home */
    if (wo_pool_stream_gone(wo_uvm_driver(), stream))
        for (unsigned i = 0; i < wo_pk.n; i++)
            if (wo_pk.s[i].hot)
                wo_hot_stream_gone(wo_pk.s[i].hot, stream);
    pthread_mutex_unlock(&wo_pk.lock);
}

/* The buffer of stream t for span i's rows (uvm/picks-pool.h), the books
 * kept (NULL: none, and the launch reads that span in place). */
/* A buffer's bytes for span s, and the entries a stream has. */
static uint64_t need_of(const struct span *s)
{
    return (s->hi - s->lo + BUF_ALIGN - 1) & ~(BUF_ALIGN - 1);
}

static unsigned bufs(void)
{
    return WO_MIN(WO_MAX(wo_settings()->picks_buffers, 1u), WO_PICKS_BUFS);
}

static struct wo_pool_buf *buffer_for(const struct wo_driver *d, struct wo_pool_strm *t, int i,
                                      unsigned taken, bool *fresh)
{
    const struct span *s = &wo_pk.s[i];
    uint64_t need = need_of(s);
    unsigned nb = bufs();
    int64_t delta = 0;
    CUresult res = CUDA_SUCCESS;
    struct wo_pool_buf *b = wo_pool_buffer(d, t, i, s->seq, need, nb, taken, fresh, &delta, &res);

    if (delta)
        wo_budget_picks_bytes(__atomic_add_fetch(&wo_pk.bytes, (uint64_t)delta, __ATOMIC_RELAXED));
    if (res != CUDA_SUCCESS && !wo_pk.said_fail) {
        wo_pk.said_fail = true;
        wo_warn("picks: no device memory for a %llu MiB staging buffer (%s): '%s' is read in "
                "place",
                (unsigned long long)(need >> 20), err_name(res), s->name ? s->name : "(unnamed)");
    }
    return b;
}

/* Reads the rows counters back on the side stream, at most every
 * REFRESH_NS (the stats show them as last read). */
static void refresh(const struct wo_driver *d)
{
    uint64_t t = wo_now_ns();

    if (t - wo_pk.last_refresh_ns < REFRESH_NS)
        return;
    wo_pk.last_refresh_ns = t;
    (void)d->cuMemcpyAsync((CUdeviceptr)(uintptr_t)wo_pk.rows_host, wo_pk.rows,
                           wo_pk.n * sizeof(uint64_t), wo_pk.side);
    if (wo_pk.hot_bytes)
        (void)d->cuMemcpyAsync((CUdeviceptr)(uintptr_t)(wo_pk.rows_host + WO_PICKS_SPANS),
                               wo_pk.rows + WO_PICKS_SPANS * sizeof(uint64_t),
                               wo_pk.n * sizeof(uint64_t), wo_pk.side);
}

/* Span i's hot set, made on stream t when wo_picks_hot_total() asks and it
 * registered often enough to have counts: an equal share of what is left
 * among the tensors off the device that have none yet. */
static void make_hot(const struct wo_driver *d, struct wo_pool_strm *t, int i)
{
    struct span *s = &wo_pk.s[i];
    uint64_t total = wo_picks_hot_total(), left, share, bytes = 0;
    unsigned want = 0, cap;

    if (s->hot || s->hot_tried || !total || s->regs < WO_HOT_FIRST ||
        __atomic_load_n(&wo_captures_live, __ATOMIC_SEQ_CST))
        return;
    wo_hot_resolve_auto(d);
    total = wo_picks_hot_total();
    for (unsigned k = 0; k < wo_pk.n; k++)
        want += wo_pk.s[k].offdev && !wo_pk.s[k].hot && !wo_pk.s[k].hot_tried;
    left = total > wo_pk.hot_bytes ? total - wo_pk.hot_bytes : 0;
    share = left / WO_MAX(want, 1u);
    cap = wo_hot_cap(share, s->n_experts, s->row);
    s->hot_tried = true;
    if (!cap)
        return;
    s->hot = wo_hot_new(d, s->n_experts, s->row, cap, t->stream, &bytes);
    if (!s->hot) {
        if (!wo_pk.said_hot) {
            wo_pk.said_hot = true;
            wo_warn("picks: no device memory for %u hot experts of '%s': its picked rows all "
                    "come from host memory (said once)",
                    cap, s->name ? s->name : "(unnamed)");
        }
        return;
    }
    wo_pk.hot_bytes += bytes;
    __atomic_add_fetch(&wo_picks_hot_epoch, 1, __ATOMIC_RELAXED);
    wo_budget_picks_bytes(__atomic_add_fetch(&wo_pk.bytes, bytes, __ATOMIC_RELAXED));
    wo_debug("picks: %u of the %u experts of '%s' may stay hot on the device (%llu MiB)", cap,
             s->n_experts, s->name ? s->name : "(unnamed)", (unsigned long long)(bytes >> 20));
}

/* Whether span i's copy goes to the copy engine: its source can be read
 * there, and a uniform router picks at least WOFFLOAD_PICKS_ENGINE percent of its
 * experts at the registration's ids (below it the run of copies, each a
 * few experts, and the wait for the ids cost more than the kernel's slower
 * reads: bench/results, picked-copy). */
static bool engine_wanted(const struct span *s)
{
    unsigned pct = wo_uvm_picks_engine();

    if (!pct || s->source == SRC_NONE || s->share < pct)
        return false;
    /* a mirror is a copy: only of memory no kernel writes (the ggml hook
     * declares llama.cpp's model buffers so); a kernel's write into the
     * tensor (an in-place weight update) would leave it stale unseen */
    return s->source != SRC_MIRROR || wo_readonly(s->rid, s->rgen);
}

/* Copies span i's picked rows into b of t, for the launch about to go on
 * t's stream (the copy engine's or the kernels'). On the copy engine the
 * stream does not wait yet: b->later is the job, waited for by the launch
 * (wait_jobs, after its early copies are queued) or, with early, by the
 * later launch that reads it (only the copy engine then). False: nothing
 * was copied. */
static bool enqueue(const struct wo_driver *d, struct wo_pool_strm *t, struct wo_pool_buf *b, int i,
                    bool early)
{
    struct span *s = &wo_pk.s[i];
    unsigned slot = wo_pool_index(t) * WO_PICKS_BUFS + (unsigned)(b - t->b);
    unsigned gen = b->gen + 1 ? b->gen + 1 : 1;
    struct wo_picks_copy c = {.ids = s->ids,
                              .n_ids = s->n_ids,
                              .per_row = s->per_row,
                              .stride = s->stride,
                              .width = s->width,
                              .n_experts = s->n_experts,
                              .marks = wo_pk.marks + (CUdeviceptr)slot * WO_PICKS_EXPERTS * 4,
                              .gen = gen,
                              .dst = b->dev,
                              .src = s->lo,
                              .row = s->row,
                              .rows = wo_pk.rows + (CUdeviceptr)i * sizeof(uint64_t)};
    uint32_t later = 0;

    if (!early) /* early_copies asks for none */
        make_hot(d, t, i);
    if (s->hot && wo_hot_prepare(d, s->hot, t->stream, s->lo, s->regs, wo_pk.fill)) {
        wo_hot_args(s->hot, t->stream, &c.where, &c.cache, &c.counts);
        c.hits = wo_pk.rows + (CUdeviceptr)(WO_PICKS_SPANS + (unsigned)i) * sizeof(uint64_t);
    } else if (s->hot) {
        /* a driver call failed: kept (copies may still read it) until
         * freed with the rest, never used again */
        wo_warn("picks: the hot experts of '%s' failed on the device: its picked rows all come "
                "from host memory",
                s->name ? s->name : "(unnamed)");
        retire(s);
    }
    /* (early copies are off with hot experts: early_copies) */
    if (engine_wanted(s)) {
        struct wo_dma_job j = {.c = c,
                               .span = (unsigned)i,
                               .rid = s->rid,
                               .gen = s->rgen,
                               .wseq = s->wseq,
                               .pinned = s->source == SRC_PINNED,
                               .rows = &wo_pk.dma_rows[i],
                               .later = &later};
        /* with a hot set its rows first, by the kernels from the device */
        bool hot_ok =
            !c.where || wo_hot_launch(d, s->hot, t->stream, wo_pk.mark, wo_pk.copy, &c, j.hot);

        j.c = c;
        if (hot_ok && wo_dma_enqueue(d, wo_pk.ctx, wo_pool_index(t), (CUstream)(uintptr_t)t->stream,
                                     &j, wo_pk.mark, wo_pk.copy, wo_pk.fill)) {
            b->gen = gen;
            b->span = i;
            b->seq = s->seq;
            b->later = later;
            b->early = early;
            return true;
        }
    }
    if (early)
        return false;
    b->early = false;
    /* a rescued job's copies may still land in any buffer: read in place */
    if (wo_dma_rescue_pending()) {
        b->span = -1;
        return false;
    }
    {
        CUstream st = (CUstream)(uintptr_t)t->stream;
        int ts = wo_picks_time_before(d, st);
        CUresult lr = wo_picks_launch(d, wo_pk.mark, wo_pk.copy, st, &c);

        wo_picks_time_after(d, st, ts, lr == CUDA_SUCCESS);
        if (lr != CUDA_SUCCESS) {
            b->span = -1;
            return false;
        }
    }
    b->gen = gen;
    b->span = i;
    b->seq = s->seq;
    return true;
}

/* The span this thread's last staged launch read (early copies learn from
 * it which tensor's launch follows which). */
static __thread int last_span = -1;
static __thread uint64_t last_stream; /* and its stream: a successor on another stream
                                       * would find no early copy in its own buffers */

static bool same_picks(const struct span *s, const struct span *f)
{
    return s->ids == f->ids && s->n_ids == f->n_ids && s->per_row == f->per_row &&
           s->stride == f->stride && s->width == f->width && pthread_equal(s->owner, f->owner);
}

/* Early copies: when a launch's copy went to the copy engine, the tensor
 * whose launch came next last time on this thread and stream, registered
 * with the same picks by the same thread (a layer's gate_up, then down: the
 * Python hook registers a module's expert tensors before its first launch)
 * and not read yet at this registration, is copied now, behind it on the
 * copy stream; its own launch, later on the stream, waits for it
 * (wo_pool_buffer) and reuses the buffer. The copy engine then moves down's
 * rows while the engine runs gate_up's GEMM, where it waited for down's
 * launch before (at b32 the step was 5.9 ms over the copies and the
 * engine's own step; the copy thread's latency twice a layer is the guess,
 * not measured: bench/results, bigload-20261203-moe128-f05-engine-h200).
 * WOFFLOAD_PICKS_EARLY. */
static void early_copies(const struct wo_driver *d, struct wo_pool_strm *t,
                         const struct wo_picks_move *moves, unsigned n, unsigned taken)
{
    /* with hot experts asked, each tensor's own launch may make its hot set */
    if (wo_picks_hot_total())
        return;
    for (unsigned m = 0; m < n; m++) {
        int a = find_span(moves[m].from, moves[m].to), i = a >= 0 ? wo_pk.s[a].next : -1;
        unsigned group = 0;
        struct wo_pool_buf *b;
        struct span *s;
        bool fresh;

        /* the tensor whose launch came next last time (down, after gate_up:
         * one launched later would find its early copy overwritten), with
         * the same picks, not read yet at this registration */
        if (i < 0 || i >= (int)wo_pk.n || i == a || !engine_wanted(&wo_pk.s[a]))
            continue;
        s = &wo_pk.s[i];
        if (!same_picks(s, &wo_pk.s[a]) || s->ran == s->seq || !s->offdev || !engine_wanted(s) ||
            wo_budget_resident_whole(s->rid, s->rgen))
            continue;
        /* one layer's tensors only: more with the same ids (an engine that
         * registers every layer at once, its layers' ids at one address
         * the graph reuses) would be copied by this layer's picks */
        for (unsigned k = 0; k < wo_pk.n; k++)
            group += same_picks(&wo_pk.s[k], &wo_pk.s[a]);
        if (group > EARLY_GROUP)
            continue;
        /* only into a buffer of t's that is there: its launch grows or lends one */
        if (!wo_pool_room(t, need_of(s), bufs(), taken) ||
            !(b = buffer_for(d, t, i, taken, &fresh)))
            return;
        if (!fresh || !enqueue(d, t, b, i, true))
            continue;
        taken |= 1u << (b - t->b);
        b->tick = ++wo_pk.tick;
        s->staged++;
        wo_pk.c.staged++;
        wo_pk.c.early++;
        wo_pk.c.whole_bytes += s->hi - s->lo;
    }
}

/* The launch's own copy-engine jobs (its buffers in taken), waited for on
 * its stream now that its early copies' ids and events are queued ahead of
 * the wait: the copy thread serves them back to back. A wait that fails
 * (the copy engine given up) takes the buffer's move out: that tensor is
 * read in place. Returns the moves left. */
static unsigned wait_jobs(const struct wo_driver *d, struct wo_pool_strm *t, unsigned taken,
                          struct wo_picks_move *moves, unsigned n)
{
    for (unsigned k = 0; k < WO_PICKS_BUFS; k++) {
        struct wo_pool_buf *b = &t->b[k];

        if (!(taken & 1u << k) || !b->later)
            continue;
        if (wo_dma_wait(d, wo_pool_index(t), (CUstream)(uintptr_t)t->stream, b->later)) {
            if (b->span >= 0 && b->span < (int)wo_pk.n) {
                const struct span *s = &wo_pk.s[b->span];
                wo_dma_guard(d, wo_pool_index(t), (CUstream)(uintptr_t)t->stream, b->later,
                             wo_pk.copy, b->dev, s->lo, s->row, s->n_experts);
            }
            b->later = 0;
            continue;
        }
        for (unsigned m = 0; m < n; m++)
            if (moves[m].dev == b->dev) {
                moves[m] = moves[--n];
                wo_pk.c.failed++;
                break;
            }
        b->span = -1; /* its copies may land later: waited for at its next use */
    }
    return n;
}

static bool skipped(uint64_t a, const uint64_t *from, const uint64_t *to, unsigned n)
{
    for (unsigned k = 0; k < n; k++)
        if (a >= from[k] && a < to[k])
            return true;
    return false;
}

unsigned wo_picks_stage(const struct wo_ev_hit *hits, unsigned nhits, uint64_t stream,
                        bool captured, const uint64_t *skip_from, const uint64_t *skip_to,
                        unsigned nskip, struct wo_picks_move *moves, unsigned max, uint64_t key)
{
    const struct wo_driver *d = wo_uvm_driver();
    unsigned n = 0, taken = 0; /* the stream's buffers this launch reads */
    struct wo_pool_strm *issuing = NULL;
    bool any = false;

    for (unsigned h = 0; h < nhits && h < WO_EV_MAX_HITS && !any; h++)
        any = hits[h].id < WO_STREAM_IDS &&
              __atomic_load_n(&wo_picks_ids[hits[h].id], __ATOMIC_ACQUIRE) != 0;
    if (!any || !d)
        return 0;
    pthread_mutex_lock(&wo_pk.lock);
    for (unsigned h = 0; h < nhits && h < WO_EV_MAX_HITS; h++) {
        const struct wo_ev_hit *hit = &hits[h];
        if (hit->id >= WO_STREAM_IDS || !wo_picks_ids[hit->id] || !wo_hit_pointer_like(hit))
            continue;
        for (unsigned i = 0; i < wo_pk.n; i++) {
            struct span *s = &wo_pk.s[i];
            struct wo_pool_strm *t;
            struct wo_pool_buf *b;
            bool dup = false, fresh;

            if (s->rid != hit->id || s->rgen != hit->gen || !s->ids || !s->offdev ||
                !pthread_equal(s->owner, pthread_self()) ||
                hit->offset >= s->off + (s->hi - s->lo) || hit->hi <= s->off)
                continue;
            if (skipped(s->lo, skip_from, skip_to, nskip))
                continue;
            if (!wo_picks_at_expert(s->off, s->hi - s->lo, s->row, hit)) {
                wo_pk.c.off_row++;
                wo_picks_kern_note(&wo_pk.c.off_kerns, key, d);
                continue;
            }
            /* learnt at every hit; asked only of a hit at an expert past the
             * base: the base is where engines hand the tensor, and where a
             * constant lands far less often (uvm/picks-kern.h) */
            if (!wo_picks_kern_reader(key, i) && hit->offset != s->off && hit->hi - 1 != s->off) {
                wo_pk.c.not_reader++;
                wo_picks_kern_note(&wo_pk.c.nr_kerns, key, d);
                continue;
            }
            for (unsigned k = 0; k < n; k++)
                dup |= moves[k].from == s->lo;
            if (dup)
                continue;
            if (captured) {
                wo_pk.c.captured++;
                continue;
            }
            /* managed, and the prefetcher holds all of it on the device:
             * the launch reads it there, faster than any copy */
            if (wo_budget_resident_whole(s->rid, s->rgen)) {
                wo_pk.c.resident++;
                s->resident++;
                continue;
            }
            /* a launch that reads more registered tensors than the stream
             * has buffers reads the others in place: a buffer this launch
             * reads is never refilled under it */
            if (n == max || !ready(d) || !(t = wo_pool_stream(stream)) ||
                !(b = buffer_for(d, t, (int)i, taken, &fresh)) ||
                (fresh && !enqueue(d, t, b, (int)i, false))) {
                wo_pk.c.failed++;
                continue;
            }
            taken |= 1u << (b - t->b);
            issuing = t;
            b->tick = ++wo_pk.tick;
            if (fresh) {
                s->staged++;
                wo_pk.c.staged++;
                wo_pk.c.whole_bytes += s->hi - s->lo;
            } else if (b->early) { /* copied early (below), counted staged then */
                b->early = false;
                wo_pk.c.early_used++;
            } else {
                s->reused++;
                wo_pk.c.reused++;
            }
            s->ran = s->seq;
            if (last_span >= 0 && last_span < (int)wo_pk.n && last_span != (int)i)
                wo_pk.s[last_span].next = last_stream == stream ? (int)i : -1;
            last_span = (int)i;
            last_stream = stream;
            wo_picks_kern_note(&s->kerns, key, d);
            moves[n++] =
                (struct wo_picks_move){.from = s->lo, .to = s->hi, .dev = b->dev, .row = s->row};
        }
    }
    if (issuing && wo_settings()->picks_early)
        early_copies(d, issuing, moves, n, taken);
    if (issuing)
        n = wait_jobs(d, issuing, taken, moves, n);
    /* its buffers are not lent to another stream until its launch call */
    if (issuing)
        wo_pool_issuing(issuing);
    if (n && !wo_pk.said_on) {
        wo_pk.said_on = true;
        wo_info("picks: the experts' launches read only the picked rows, copied on their stream "
                "(woffload_moe_picks)");
    }
    if (wo_pk.ready)
        refresh(d);
    pthread_mutex_unlock(&wo_pk.lock);
    return n;
}

void wo_picks_issued(void)
{
    wo_pool_issued();
}

bool wo_picks_reg_of(uint64_t from, struct wo_picks_reg *r)
{
    bool ok = false;

    pthread_mutex_lock(&wo_pk.lock);
    for (unsigned i = 0; i < wo_pk.n && !ok; i++) {
        const struct span *s = &wo_pk.s[i];
        if (s->lo != from || !s->ids || !pthread_equal(s->owner, pthread_self()))
            continue;
        *r = (struct wo_picks_reg){.ids = s->ids,
                                   .n_ids = s->n_ids,
                                   .per_row = s->per_row,
                                   .stride = s->stride,
                                   .row = s->row,
                                   .width = s->width,
                                   .n_experts = s->n_experts};
        ok = true;
    }
    pthread_mutex_unlock(&wo_pk.lock);
    return ok;
}

void wo_picks_checked(bool mismatch)
{
    pthread_mutex_lock(&wo_pk.lock);
    wo_pk.c.checked++;
    wo_pk.c.check_mismatch += mismatch;
    pthread_mutex_unlock(&wo_pk.lock);
}

void wo_picks_unused(unsigned n)
{
    pthread_mutex_lock(&wo_pk.lock);
    wo_pk.c.unused += n;
    pthread_mutex_unlock(&wo_pk.lock);
}

/* ---- the books --------------------------------------------------------------- */

void wo_picks_moved(uint64_t lo, uint64_t hi)
{
    pthread_mutex_lock(&wo_pk.lock);
    for (unsigned i = 0; i < wo_pk.n; i++)
        if (wo_pk.s[i].lo < hi && wo_pk.s[i].hi > lo)
            wo_pk.s[i].stale = true;
    pthread_mutex_unlock(&wo_pk.lock);
}

/* Whether span s, in host memory, is left to the streaming executor: a
 * registration picked at least WOFFLOAD_PICKS_WHOLE percent of its experts
 * (a uniform router's share), none since under 4/5 of it (wo_picks_whole_of),
 * and no hot experts are asked. A copy of nearly every row by the kernels
 * (37.5 GB/s on the H200: the Mixtral shape's experts all host at b32 ran
 * 96.13 tok/s, 0.73x the link's bound, bench/results/e2e-20261205-recheck-
 * h200.md) is slower than the whole tensor on the copy engine, which `auto`
 * then weighs by step time; the picked copies stay the launch's fallback
 * when no slot holds it. The ggml hook draws the same line for its computes
 * (WOFFLOAD_GGML_STREAM). Managed tensors stay claimed: their resident rows
 * cost no link. */
static bool whole(const struct span *s, bool hot)
{
    return s->whole && !hot && s->source != SRC_NONE;
}

bool wo_picks_claims(uint32_t id, uint32_t gen, uint64_t lo, uint64_t hi)
{
    bool r = false, hot;

    if (id >= WO_STREAM_IDS || !__atomic_load_n(&wo_picks_ids[id], __ATOMIC_ACQUIRE))
        return false;
    /* with hot experts asked, a tensor registered once stays claimed
     * between its registrations: its picked copies take the hot rows from
     * the device and move less than a whole copy at any share picked, and
     * staging it whole would hold slots beside the sets */
    hot = wo_picks_hot_total() != 0;
    pthread_mutex_lock(&wo_pk.lock);
    for (unsigned i = 0; i < wo_pk.n && !r; i++) {
        const struct span *s = &wo_pk.s[i];
        r = s->rid == id && s->rgen == gen && s->offdev &&
            (s->ids || s->sticky || (hot && s->regs)) && s->off < hi &&
            s->off + (s->hi - s->lo) > lo && !whole(s, hot);
    }
    pthread_mutex_unlock(&wo_pk.lock);
    return r;
}

bool wo_picks_replay_wanted(const struct wo_ev_hit *hits, unsigned nhits)
{
    bool r = false, hot = wo_picks_hot_total() != 0;

    if (!__atomic_load_n(&wo_picks_any, __ATOMIC_ACQUIRE) || (!hot && !wo_uvm_picks_engine()))
        return false;
    pthread_mutex_lock(&wo_pk.lock);
    for (unsigned h = 0; h < nhits && !r; h++) {
        const struct wo_ev_hit *hit = &hits[h];
        if (hit->id >= WO_STREAM_IDS || !wo_picks_ids[hit->id])
            continue;
        for (unsigned i = 0; i < wo_pk.n && !r; i++) {
            const struct span *s = &wo_pk.s[i];
            r = s->rid == hit->id && s->rgen == hit->gen && s->offdev && s->ids &&
                pthread_equal(s->owner, pthread_self()) && wo_picks_at_expert(s->off, s->hi - s->lo, s->row, hit) &&
                (hot || engine_wanted(s));
        }
    }
    pthread_mutex_unlock(&wo_pk.lock);
    return r;
}

void wo_picks_free(const struct wo_driver *d)
{
    /* first: no engine stream may wait for a copy that never comes */
    wo_dma_stop(d);
    pthread_mutex_lock(&wo_pk.lock);
    if (d && wo_pk.ready) {
        wo_pool_free(d);
        wo_picks_time_free(d);
        if (d->cuStreamSynchronize)
            d->cuStreamSynchronize(wo_pk.side);
        for (unsigned i = 0; i < wo_pk.n; i++) {
            wo_hot_free(d, wo_pk.s[i].hot);
            wo_pk.s[i].hot = NULL;
        }
        for (unsigned i = 0; i < wo_pk.nretired; i++)
            wo_hot_free(d, wo_pk.retired[i]);
        wo_pk.nretired = 0;
        if (d->cuStreamDestroy_v2)
            d->cuStreamDestroy_v2(wo_pk.side);
        if (d->cuMemFreeHost)
            d->cuMemFreeHost(wo_pk.rows_host);
        if (d->cuMemFree_v2) {
            d->cuMemFree_v2(wo_pk.marks);
            d->cuMemFree_v2(wo_pk.rows);
        }
        if (d->cuModuleUnload)
            d->cuModuleUnload(wo_pk.mod);
    }
    pthread_mutex_unlock(&wo_pk.lock);
}

void wo_picks_atfork_child(void)
{
    pthread_mutex_init(&wo_pk.lock, NULL);
    wo_picks_reset();
}

void wo_picks_reset(void)
{
    pthread_mutex_lock(&wo_pk.lock);
    /* hot sets wo_picks_free did not free are left (a fork child's: the
     * parent's device memory) */
    for (unsigned i = 0; i < wo_pk.n; i++)
        free(wo_pk.s[i].name);
    free(wo_pk.s);
    wo_pk.s = NULL;
    wo_pk.n = 0;
    wo_pool_reset();
    wo_picks_time_reset();
    memset(wo_pk.dma_rows, 0, sizeof(wo_pk.dma_rows));
    wo_dma_reset();
    wo_pk.ctx = NULL;
    wo_pk.mod = NULL;
    wo_pk.ready = wo_pk.broken = wo_pk.said_on = wo_pk.said_fail = wo_pk.said_hot = false;
    wo_pk.marks = wo_pk.rows = 0;
    wo_pk.rows_host = NULL;
    wo_pk.side = NULL;
    wo_pk.last_refresh_ns = 0;
    wo_pk.tick = 0;
    wo_pk.bytes = wo_pk.hot_bytes = wo_pk.given_back = wo_pk.fills_gone = 0;
    wo_hot_budget_reset();
    wo_pk.nretired = 0;
    wo_pk.fill = NULL;
    wo_budget_picks_bytes(0);
    wo_pk.c.regs = wo_pk.c.staged = wo_pk.c.reused = wo_pk.c.captured = wo_pk.c.failed =
        wo_pk.c.unused = wo_pk.c.writes = 0;
    wo_pk.c.off_row = wo_pk.c.not_reader = wo_pk.c.checked = wo_pk.c.check_mismatch = 0;
    __atomic_store_n(&wo_picks_const_words, 0, __ATOMIC_RELAXED);
    memset(&wo_pk.c.off_kerns, 0, sizeof(wo_pk.c.off_kerns));
    memset(&wo_pk.c.nr_kerns, 0, sizeof(wo_pk.c.nr_kerns));
    wo_picks_kern_forget();
    wo_pk.c.resident = 0;
    wo_pk.c.whole_bytes = 0;
    memset(wo_picks_ids, 0, sizeof(wo_picks_ids));
    __atomic_store_n(&wo_picks_any, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&wo_pk.lock);
}
