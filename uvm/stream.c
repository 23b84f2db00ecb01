/* uvm/stream.c: the streaming executor (see stream.h; docs/prefetch.md,
 * "Streaming"). Consumer thread only, except the published per-name
 * figures (any thread, under snap_lock). The table's hook side
 * (wo_stream_note_write, wo_stream_await, the counters) is
 * stream-table.c; pinned copies of managed ranges, stream-pin.c.
 *
 * Per step (found by the same stepper the planner uses, keyed on the
 * launches that touch host or managed ranges) it measures, per range, the
 * bytes launches read (each hit one slice, as the planner counts it) and
 * the distinct bytes among them (64 granules per range): their ratio is
 * the read multiplicity. A range is streamed when the policy says `stream`,
 * or under `auto` when a step reads at least 1.5x its bytes (then one
 * staging copy a step moves fewer bytes over PCIe than the reads in place)
 * and no copy wrote it after seal. The order in which the last step first
 * touched the streamed ranges is the plan: the executor keeps the range
 * the engine is at and the next ones staged in device slots, the one before
 * it kept too (a layer's tensors may interleave), and reuses the slot of
 * anything further behind. */
#include "uvm/stream.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/registry.h"
#include "core/settings.h"
#include "policy/policy.h"
#include "uvm/executor.h"
#include "uvm/internal.h"
#include "uvm/devmodel.h"
#include "uvm/plan.h"
#include "uvm/prefetch.h"
#include "uvm/stream-auto.h"
#include "uvm/stream-check.h"
#include "uvm/stream-copy-ptx.h"
#include "uvm/stream-pin.h"

#define GRANULES 64
#define NONE UINT32_MAX
#define AUTO_GAIN 1.5        /* stream when a step reads this many times the range's bytes */
#define AUTO_STEPS 2         /* ... measured over at least this many steps */
#define AUTO_RECENT 4        /* steps: a range read this recently is in use */
#define WARN_MULT 2.0        /* a host range read this many times a step in place: one warning */
#define SPIN_WAIT 20000      /* polls of a slot's in-flight count before trying later */
#define PAD_MAX 511          /* bytes between two tags that are alignment, not a gap */


struct srange {
    bool live, host, written, streamed, warned;
    bool gathered; /* an embedding: never streamed (wo_stream_gathered) */
    bool big;      /* larger than a slot: read in place (said once) */
    bool probed;   /* streamed by auto's step-time decision (stream-auto.h), not by gain */
    bool room;     /* ... a hot managed range the slots took the room of (readmit_room) */
    bool gapped;   /* other bytes between its tags: never streamed (add_seg) */
    bool hashed;   /* the write check has the hash it was staged with (stream-check.h) */
    bool kernel_written; /* a write check found a launch wrote its slot: copied back */
    unsigned chk_slot1;  /* slot + 1 whose check of it may be unfinished, 0 none */
    uint32_t touch_seen; /* touch_end of its entry at its last staging copy */
    uint32_t blind_seen; /* wo_stream_tab.blind_end at its last staging copy */
    uint32_t gen;
    uint64_t base, lo, hi; /* the staged bytes: [base+lo, base+hi) */
    uint64_t slice;        /* gcd of the non-zero offsets seen (relative to lo) */
    char *name;
    int slot;     /* -1 none */
    uint32_t ord; /* index in the learned order, NONE */
    /* this step */
    uint64_t read, mask, staged;
    bool touched;
    /* measured steps (those that read it) */
    uint64_t msteps, steps_all;
    uint64_t last_step; /* the executor's step count when a step last read it */
    double sum_mult, sum_read, gain, sum_staged;
};

struct exec {
    const struct wo_driver *drv;
    enum wo_prefetch_mode mode;
    CUcontext ctx;
    CUstream copy;
    CUmodule copy_mod;  /* its module, loaded with the slots and unloaded with them */
    CUfunction copy_fn; /* wo_stream_copy (uvm/stream-copy.cu), NULL: cuMemcpyAsync only */
    unsigned nslots;
    uint64_t slot_size; /* the largest range a slot takes (wo_stream_slot_size) */
    uint64_t slot_sz[WO_STREAM_MAX_SLOTS];     /* each slot's bytes, once made */
    uint64_t want_sz[WO_STREAM_MAX_SLOTS];     /* ... for the ranges streamed now (want_sizes) */
    uint64_t grow_failed[WO_STREAM_MAX_SLOTS]; /* a size cuMemAlloc refused the slot, 0 none */
    bool slots_ready, slots_failed;
    bool warned;                         /* the read-multiplicity warning was given */
    int slot_range[WO_STREAM_MAX_SLOTS]; /* registry id held, -1 none */
    uint32_t slot_last[WO_STREAM_MAX_SLOTS]; /* the last id staged there (kept when dropped), NONE */
    struct srange *r;                    /* by registry id (< WO_STREAM_IDS) */
    uint32_t nr;
    uint32_t *order, norder, *cur, ncur;
    size_t cap_order, cap_cur;
    uint32_t maxi; /* furthest index in the order the engine reached this step */
    uint32_t epoch;
    struct wo_stepper st;
    uint32_t first_low; /* the first range a keyed launch reached, NONE */
    bool lows_vary;     /* launches reached another range since: keys by range */
    uint32_t last_seen; /* the last range a launch reached, in the events read (at_engine;
                         * keyed by range, a run of launches on it counts once) */
    uint64_t steps;
    struct fnrec *fns; /* by launch function: the off-device ranges it reached (reader()) */
    struct wo_auto au; /* auto's step-time decision for host ranges */
    double link_gbs;   /* the copy rate it assumes (the built-in device model's) */
    uint64_t pin_limit; /* policy prefetch.pinned_copies */
    bool pin_on;        /* the pinned-copy worker runs (stream-pin.h) */
    bool said_kernel;   /* the copy kernel's info line was given */
    bool checks_wanted; /* WOFFLOAD_WRITE_CHECKS (default on) */
    bool check_on;      /* the write checks run (stream-check.h) */
    uint32_t slot_chk[WO_STREAM_MAX_SLOTS];     /* the range staged there, not checked yet, NONE */
    uint32_t slot_chk_gen[WO_STREAM_MAX_SLOTS]; /* ... its generation */
    uint32_t blind_seen;                        /* blind launches ended that blind() took in */
};

#define FNS 8192u /* functions tracked by reader(), open addressing; more count as readers */

struct fnrec {
    uint64_t func; /* 0: empty */
    uint32_t first; /* registry id + 1 of the first off-device range it reached */
    bool many;      /* it reached a second one */
};

static struct exec *ex;
static bool tried, rescan;

static void add(uint64_t *c, uint64_t n)
{
    __atomic_add_fetch(c, n, __ATOMIC_RELAXED);
}

/* ---- driver access ------------------------------------------------------------ */

/* The slots, events and copy stream live in the engine's context (a
 * kernel reads only memory of its context, and an event is recorded only
 * on a stream of its own context); the prefetcher may keep a context of
 * its own current on this thread: it is put back after. */
static CUcontext push_ctx(void)
{
    CUcontext prev = NULL;

    if (ex->drv->cuCtxGetCurrent)
        ex->drv->cuCtxGetCurrent(&prev);
    if (prev != ex->ctx && ex->drv->cuCtxSetCurrent)
        ex->drv->cuCtxSetCurrent(ex->ctx);
    return prev;
}

static void pop_ctx(CUcontext prev)
{
    if (prev != ex->ctx && ex->drv->cuCtxSetCurrent)
        ex->drv->cuCtxSetCurrent(prev);
}

static void slots_fail(const char *why, CUresult res)
{
    ex->slots_failed = true;
    wo_warn("stream: %s (%s): streamed ranges are read in place", why, wo_cu_error_name(res));
}

/* The copy of a managed range: cuMemcpyAsync from managed memory advised to
 * the host moves 7-9 GB/s on the lent H100, a kernel reading the same pages
 * in place 50 GB/s (bench/results/stream-mechanisms-20261125-h100-kernel-
 * copy.txt). The kernel is uvm/stream-copy.cu's PTX, loaded into the slots'
 * context once; without it managed ranges are staged by cuMemcpyAsync. */
static void load_copy_kernel(void)
{
    const struct wo_driver *d = ex->drv;
    CUmodule mod = NULL;
    CUresult res = CUDA_ERROR_NOT_SUPPORTED;

    if (d->cuModuleLoadData && d->cuModuleGetFunction && d->cuModuleUnload && d->cuLaunchKernel) {
        res = d->cuModuleLoadData(&mod, wo_stream_copy_ptx);
        if (res == CUDA_SUCCESS)
            res = d->cuModuleGetFunction(&ex->copy_fn, mod, "wo_stream_copy");
        if (res != CUDA_SUCCESS && mod)
            d->cuModuleUnload(mod);
        else
            ex->copy_mod = mod;
    }
    if (res != CUDA_SUCCESS) {
        ex->copy_fn = NULL;
        wo_info("stream: no copy kernel (%s): managed ranges are staged by cuMemcpyAsync, "
                "about a sixth of the link's speed",
                wo_cu_error_name(res));
    }
}

/* Where range id's staging copy reads from: its pinned copy once the worker
 * made one (stream-pin.h: managed ranges only; asked for here the first
 * time), else the range itself. */
static CUdeviceptr source(uint32_t id, const struct srange *r, bool managed, bool *pinned)
{
    CUdeviceptr p =
        ex->pin_on && managed ? wo_pin_source(id, r->gen, r->base + r->lo, r->hi - r->lo) : 0;

    *pinned = p != 0;
    return p ? p : (CUdeviceptr)(r->base + r->lo);
}

/* Copies bytes from src to the slot dst on the copy stream: a managed source
 * by the copy kernel (the GPU reads it in place; 16 blocks fill the link),
 * pinned host memory (a pinned copy of a managed range included) by the
 * copy engine. */
static CUresult copy_to_slot(CUdeviceptr dst, CUdeviceptr src, uint64_t bytes, bool managed)
{
    const struct wo_driver *d = ex->drv;

    if (managed && ex->copy_fn) {
        unsigned long long n = bytes;
        void *args[] = {&dst, &src, &n};
        if (!ex->pin_on && !ex->said_kernel) {
            ex->said_kernel = true;
            wo_info("stream: pinned_copies off: managed ranges are staged by the copy kernel "
                    "(50 GB/s at most, on the engine's SMs); prefetch: {pinned_copies: auto}, "
                    "the default, copies each once into pinned memory for the copy engine "
                    "(docs/prefetch.md, Pinned copies)");
        }
        add(&wo_stream_tab.n.staged_by_kernel, 1);
        return d->cuLaunchKernel(ex->copy_fn, 16, 1, 1, 512, 1, 1, 0, ex->copy, args, NULL);
    }
    return d->cuMemcpyAsync(dst, src, (size_t)bytes, ex->copy);
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

    for (unsigned i = 0; i < ex->nslots && at < sizeof(sizes); i++)
        at += (size_t)snprintf(sizes + at, sizeof(sizes) - at, "%s%s", i ? ", " : "",
                               size_str(ex->slot_sz[i], one));
    wo_info("stream: %u device staging slots%s (%s)", ex->nslots, what, sizes);
}

static void slots_shrank(void);

/* Device bytes the slots hold: their sizes once made, else what they will
 * be made with (want_sizes; before any step, every slot the largest). */
static uint64_t slots_bytes(void)
{
    uint64_t n = 0;

    for (unsigned i = 0; i < ex->nslots; i++)
        n += ex->slots_ready ? ex->slot_sz[i] : ex->want_sz[i] ? ex->want_sz[i] : ex->slot_size;
    return n;
}

static int cmp_desc(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x > y ? -1 : x < y;
}

uint64_t *wo_stream_size_slots(const uint64_t *sizes, size_t n, unsigned nslots, uint64_t cap,
                               uint64_t *out)
{
    uint64_t w[WO_STREAM_MAX_SLOTS];

    if (!n || !nslots || nslots > WO_STREAM_MAX_SLOTS)
        return NULL;
    for (unsigned i = 0; i < nslots; i++)
        out[i] = 0;
    /* slot i: the largest i-th largest size of any nslots ranges in a row
     * (the order is a cycle): the executor holds at most that many at once
     * (the next ones and the one behind) and gives each the smallest free
     * slot it fits */
    for (size_t j = 0; j < (n > nslots ? n : 1); j++) {
        unsigned m = (unsigned)(n < nslots ? n : nslots);
        for (unsigned k = 0; k < m; k++)
            w[k] = sizes[(j + k) % n];
        qsort(w, m, sizeof(*w), cmp_desc);
        for (unsigned k = 0; k < m; k++)
            out[k] = out[k] > w[k] ? out[k] : w[k];
    }
    /* fewer ranges than slots: the spare ones take the smallest */
    for (unsigned i = 1; i < nslots; i++)
        if (!out[i])
            out[i] = out[i - 1];
    for (unsigned i = 0; i < nslots; i++)
        if (out[i] > cap || !out[i])
            out[i] = cap;
    return out;
}

/* The sizes (out) the slots should have for the ranges streamed now but
 * `skip` (NONE: none), in the order the last step read them
 * (wo_stream_size_slots); false when no such range is in the order. */
static bool size_for(uint32_t skip, uint64_t *out)
{
    uint64_t *v = malloc((ex->norder ? ex->norder : 1) * sizeof(*v));
    size_t n = 0;
    bool ok;

    for (uint32_t k = 0; v && k < ex->norder; k++) {
        const struct srange *r = &ex->r[ex->order[k]];
        if (ex->order[k] != skip && r->live && r->streamed && r->hi - r->lo <= ex->slot_size)
            v[n++] = r->hi - r->lo;
    }
    ok = v && wo_stream_size_slots(v, n, ex->nslots, ex->slot_size, out);
    free(v);
    return ok;
}

/* want_sz for the ranges streamed now; unchanged when none is in the order
 * yet. */
static void want_sizes(void)
{
    uint64_t out[WO_STREAM_MAX_SLOTS];

    if (size_for(NONE, out))
        for (unsigned i = 0; i < ex->nslots; i++) {
            if (out[i] != ex->want_sz[i])
                ex->grow_failed[i] = 0;
            ex->want_sz[i] = out[i];
        }
}

/* Allocates the slots, their events and the copy stream, once. */
static bool slots(void)
{
    const struct wo_driver *d = ex->drv;
    CUcontext prev;
    CUresult res = CUDA_SUCCESS;
    unsigned i;

    if (ex->slots_ready || ex->slots_failed)
        return ex->slots_ready;
    if (!d->cuMemAlloc_v2 || !d->cuMemcpyAsync || !d->cuEventCreate || !d->cuEventRecord ||
        !d->cuStreamWaitEvent || !d->cuStreamCreate || !ex->ctx || !ex->slot_size) {
        slots_fail("the driver lacks a function it needs", CUDA_ERROR_NOT_SUPPORTED);
        return false;
    }
    if (!wo_driver_enter())
        return false; /* a global capture forbids cuMemAlloc: later */
    prev = push_ctx();
    res = d->cuStreamCreate(&ex->copy, CU_STREAM_NON_BLOCKING);
    if (res == CUDA_SUCCESS)
        load_copy_kernel();
    /* no slot is used unchecked: a launch may write what it was pointed at
     * (unless WOFFLOAD_WRITE_CHECKS=0, to measure what the checks cost) */
    if (res == CUDA_SUCCESS && ex->checks_wanted &&
        !(ex->check_on = wo_check_start(d, ex->copy_mod, ex->nslots)))
        res = CUDA_ERROR_NOT_SUPPORTED;
    /* the fences (stream.h), kept until exit: hooks may hold them while
     * the slots go */
    if (res == CUDA_SUCCESS &&
        (!wo_stream_fence(&wo_stream_tab.fence, d->cuEventCreate, d->cuEventDestroy_v2) ||
         !wo_stream_fence(&wo_stream_tab.blind_fence, d->cuEventCreate, d->cuEventDestroy_v2)))
        res = CUDA_ERROR_OUT_OF_MEMORY;
    for (i = 0; i < ex->nslots && res == CUDA_SUCCESS; i++) {
        struct wo_stream_slot *s = &wo_stream_tab.slot[i];
        CUdeviceptr p = 0;

        ex->slot_sz[i] = ex->want_sz[i] ? ex->want_sz[i] : ex->slot_size;
        res = d->cuMemAlloc_v2(&p, ex->slot_sz[i]);
        if (res == CUDA_SUCCESS)
            res = d->cuEventCreate(&s->copied, CU_EVENT_DISABLE_TIMING);
        if (res == CUDA_SUCCESS)
            res = d->cuEventCreate(&s->read_done, CU_EVENT_DISABLE_TIMING);
        s->dev = p;
        if (res != CUDA_SUCCESS && p && d->cuMemFree_v2)
            d->cuMemFree_v2(p);
    }
    pop_ctx(prev);
    wo_driver_leave();
    if (res != CUDA_SUCCESS) {
        /* what was made stays unused until exit: nothing reads it */
        if (ex->copy && ex->checks_wanted && !ex->check_on)
            ex->slots_failed = true; /* wo_check_start said why */
        else
            slots_fail("no device staging slots", res);
        return false;
    }
    ex->slots_ready = true;
    if (!ex->pin_on && ex->pin_limit)
        ex->pin_on = wo_pin_start(d, ex->ctx, ex->pin_limit);
    __atomic_store_n(&wo_stream_tab.n.slot_bytes, slots_bytes(), __ATOMIC_RELAXED);
    __atomic_store_n(&wo_stream_tab.ctx, ex->ctx, __ATOMIC_RELEASE);
    say_slots("");
    /* sized for the ranges streamed (want_sizes): the planner gets what
     * the estimate it was given (every slot the largest) overstated */
    if (slots_bytes() < (uint64_t)ex->nslots * ex->slot_size)
        slots_shrank();
    return true;
}

/* ---- assignments ---------------------------------------------------------- */

/* Takes the slot's assignment back and waits until no hook holds it; false
 * when a hook still does after SPIN_WAIT polls (try again later). */
static bool unpublish(int slot)
{
    int id = ex->slot_range[slot];
    struct wo_stream_slot *s = &wo_stream_tab.slot[slot];

    if (id >= 0) {
        struct wo_stream_entry *e = &wo_stream_tab.e[id];
        uint64_t w = __atomic_load_n(&e->word, __ATOMIC_SEQ_CST);
        /* WO_STREAM_DIRTY stays: the range was written */
        if (w != WO_STREAM_DIRTY && w != 0)
            __atomic_compare_exchange_n(&e->word, &w, 0, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    }
    for (int i = 0; __atomic_load_n(&s->inflight, __ATOMIC_SEQ_CST) > 0; i++) {
        if (i == SPIN_WAIT) {
            add(&wo_stream_tab.n.slot_waits, 1);
            return false;
        }
        if (i % 64 == 63)
            sched_yield();
    }
    if (id >= 0 && (uint32_t)id < ex->nr)
        ex->r[id].slot = -1;
    ex->slot_range[slot] = -1;
    return true;
}

/* Takes the range's slot back (unpublish). A hook that still holds it
 * keeps reading it: the slot is free all the same, and stage() reuses it
 * only once no hook does (read_done orders the reuse). */
static void take_back(struct srange *r)
{
    int s = r->slot;

    if (s >= 0 && !unpublish(s)) {
        ex->slot_range[s] = -1;
        r->slot = -1;
    }
}

/* A copy wrote the range: it is read in place from now on. */
static void mark_written(struct srange *r, uint32_t id)
{
    if (r->written)
        return;
    r->written = true;
    if (r->streamed)
        wo_info("stream: '%s' was written after seal: read in place from now on",
                r->name ? r->name : "(unnamed)");
    r->streamed = false;
    __atomic_store_n(&wo_stream_tab.e[id].word, WO_STREAM_DIRTY, __ATOMIC_SEQ_CST);
    if (r->slot >= 0)
        (void)unpublish(r->slot); /* if a hook holds it, the slot is reclaimed later */
    if (ex->pin_on)
        wo_pin_retire(id);
}

static void drop(uint32_t id);

/* Records the slot's read_done on the engine stream that read its last
 * assignment (stage(): why). The per-thread default stream is the calling
 * thread's own, not the engine's: there the hooks' record stands. A stream
 * under capture would take the record (and through it the copy stream)
 * into the engine's graph: false, try later. A stream gone (destroyed, its
 * work done or in flight before the hooks' record) has nothing more to
 * fence. False only for a capture. */
static bool fence_owner(struct wo_stream_slot *s)
{
    const struct wo_driver *d = ex->drv;
    uint64_t owner = __atomic_load_n(&s->owner, __ATOMIC_ACQUIRE);
    CUstream st = (CUstream)(uintptr_t)(owner - 1);
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;

    if (!owner || st == CU_STREAM_PER_THREAD)
        return true;
    if (d->cuStreamIsCapturing && d->cuStreamIsCapturing(st, &cs) == CUDA_SUCCESS &&
        cs != CU_STREAM_CAPTURE_STATUS_NONE)
        return false;
    if (d->cuEventRecord(s->read_done, st) != CUDA_SUCCESS)
        __atomic_store_n(&s->owner, 0, __ATOMIC_RELEASE);
    return true;
}

/* The range the engine is at may still have launches to come that read
 * its slot through a table an earlier one wrote (stage()'s fence): its
 * slot is reused (or freed) only once a launch has touched another range.
 * Two views of where the engine is: the hooks' (pos: the last streamed
 * range a launch touched, ahead of the consumer, but still while nothing
 * is streamed) and the consumer's (the last tracked range in the events it
 * has read: launches come in program order, so one on another range means
 * the kernels before it were submitted). A range the engine freed has no
 * launches to come. hooks_too false: the consumer's view only (free_slots:
 * pos stays put once nothing is streamed, no hook moves it). */
static bool at_engine(unsigned slot, bool hooks_too)
{
    uint32_t last = ex->slot_last[slot];

    if (last == NONE || last >= ex->nr || !ex->r[last].live)
        return false;
    return last == ex->last_seen ||
           (hooks_too && last + 1 == __atomic_load_n(&wo_stream_tab.pos, __ATOMIC_RELAXED));
}

/* ---- write checks (stream-check.h) ---------------------------------------------- */

/* Checks the contents slot s holds (the range staged there last) before
 * the slot is reused or freed: on the checker's stream, after every launch
 * that read it (fence_owner), with the copy stream waiting for it. A range
 * freed since has nothing to keep; one a copy wrote since keeps the copy's
 * bytes (the write check would put the slot's older ones back). Under
 * wo_uvm.lock (the range stays live while the check is issued), in the
 * slots' context. False: try later (the reader's stream is being
 * captured). */
static uint32_t check_tag(const struct srange *r)
{
    return r->gen << 1 | 1; /* a range that had the id before has another generation */
}

static bool check_slot(unsigned s)
{
    uint32_t id = ex->slot_chk[s];
    struct wo_stream_slot *sl = &wo_stream_tab.slot[s];
    struct srange *r;
    struct wo_range rg;
    CUresult res;

    if (id == NONE)
        return true;
    r = id < ex->nr ? &ex->r[id] : NULL;
    if (r && r->live && r->gen == ex->slot_chk_gen[s] && (!r->written || r->kernel_written) &&
        ex->check_on && wo_registry_get(id, &rg) >= 0 && rg.gen == r->gen) {
        if (!fence_owner(sl))
            return false;
        res = wo_check_slot(s, (CUdeviceptr)sl->dev, r->hi - r->lo, id, check_tag(r),
                            (CUdeviceptr)(r->base + r->lo), sl->copied, sl->read_done, ex->copy);
        if (res != CUDA_SUCCESS) {
            /* what a launch may have written there cannot be known: stop
             * streaming rather than risk it again */
            wo_warn("stream: checking slot %u for writes failed (%s): nothing is streamed from "
                    "now on",
                    s, wo_cu_error_name(res));
            ex->check_on = false;
            ex->slots_failed = true;
        } else {
            r->chk_slot1 = s + 1;
            add(&wo_stream_tab.n.write_checks, 1);
        }
    }
    ex->slot_chk[s] = NONE;
    return true;
}

static void unselect_range(struct srange *r, uint32_t id);

/* A write check found that a launch wrote range id's slot, and copied the
 * slot back into the range: from now on it is read in place. */
static void kernel_wrote(struct srange *r, uint32_t id)
{
    bool was = r->streamed;

    add(&wo_stream_tab.n.written_back, 1);
    if (r->kernel_written)
        return; /* a later slot of it, copied back too: said once */
    wo_warn("stream: a launch wrote '%s' while it was streamed: its slot was copied back into "
            "it (nothing is lost); it is read in place from now on",
            r->name ? r->name : "(unnamed)");
    r->kernel_written = true;
    if (was)
        unselect_range(r, id); /* a managed one back to the planner */
    mark_written(r, id);
}

/* Takes the results of the write checks that finished (all of them when
 * wait): of range only, or of every range (only NONE). */
static void poll_checks(bool wait, uint32_t only)
{
    uint32_t from = only == NONE ? 0 : only, to = only == NONE ? ex->nr : only + 1;

    CUcontext prev;
    bool read = false;

    if (!ex->check_on || !wo_driver_enter())
        return;
    prev = push_ctx();
    if (wait)
        wo_check_sync();
    for (uint32_t id = from; id < to && id < ex->nr; id++) {
        struct srange *r = &ex->r[id];
        if (!r->live || !r->chk_slot1 || !wo_check_done(r->chk_slot1 - 1))
            continue;
        if (!read) {
            wo_check_read(ex->nr);
            read = true;
        }
        r->chk_slot1 = 0;
        if (wo_check_take(id, check_tag(r)))
            kernel_wrote(r, id);
    }
    pop_ctx(prev);
    wo_driver_leave();
}

/* Takes in the blind launches (stream.h) that ended up to ge: the pinned
 * copies may be older than their ranges from the first one on, so they are
 * retired and none is made again (stage() copies from the ranges); one
 * whose fence could not be recorded leaves nothing to order a staging copy
 * after, so nothing is streamed from then on. False: try later (the driver
 * is held by a capture). */
static bool blind(uint32_t ge)
{
    uint64_t unfenced;
    CUcontext prev;

    if (ge == ex->blind_seen)
        return true;
    unfenced = __atomic_load_n(&wo_stream_tab.n.blind_unfenced, __ATOMIC_RELAXED);
    if (unfenced && !ex->slots_failed) {
        wo_warn("stream: a launch that may write weights unseen (an NCCL kernel, a CUDA graph) "
                "could not be fenced: nothing is streamed from now on");
        ex->slots_failed = true;
        for (uint32_t id = 0; id < ex->nr; id++)
            if (ex->r[id].live && ex->r[id].streamed)
                unselect_range(&ex->r[id], id);
    }
    /* the pinned copies may be older than their ranges now: closed for
     * good (stream-pin.h), made or not yet */
    if (!ex->pin_on) {
        wo_pin_close(NULL); /* none made: none ever will be */
    } else if (!ex->blind_seen) {
        if (!wo_driver_enter())
            return false;
        prev = push_ctx();
        wo_pin_close(ex->copy);
        pop_ctx(prev);
        wo_driver_leave();
        wo_info("stream: a launch may write weights through pointers the shim cannot see (an "
                "NCCL kernel, or a CUDA graph that reads them): staged from the ranges from now "
                "on, pinned copies retired (docs/prefetch.md, Blind launches)");
    }
    ex->blind_seen = ge;
    return true;
}

/* Copies range id into slot and publishes the assignment. */
static bool stage(uint32_t id, int slot)
{
    const struct wo_driver *d = ex->drv;
    struct srange *r = &ex->r[id];
    struct wo_stream_entry *e = &wo_stream_tab.e[id];
    struct wo_stream_slot *s = &wo_stream_tab.slot[slot];
    uint64_t w = 0, nw;
    uint32_t tb, te, gb, ge;
    bool fresh, blind_fresh, hashed_now = false;
    struct wo_range rg;
    CUcontext prev;
    CUresult res;

    if (r->chk_slot1)
        poll_checks(false, id); /* a launch may have written it: then it is not staged */
    if (!r->streamed)
        return true;
    if (at_engine((unsigned)slot, true) || ex->slot_sz[slot] < r->hi - r->lo)
        return false;
    if (!unpublish(slot))
        return false;
    if (__atomic_load_n(&e->word, __ATOMIC_SEQ_CST) == WO_STREAM_DIRTY) {
        mark_written(r, id);
        return true; /* the slot is free: try the next range */
    }
    /* launches that touched the range in place (wo_stream_touch_begin):
     * one under way, later; one since the last staging copy, this copy
     * comes after it (the fence) and from the range itself */
    tb = __atomic_load_n(&e->touch_begin, __ATOMIC_SEQ_CST);
    te = __atomic_load_n(&e->touch_end, __ATOMIC_SEQ_CST);
    if (tb != te)
        return false;
    /* blind launches (stream.h): one under way, later; one since the last
     * staging copy, the same as a touch, with its own fence */
    gb = __atomic_load_n(&wo_stream_tab.blind_begin, __ATOMIC_SEQ_CST);
    ge = __atomic_load_n(&wo_stream_tab.blind_end, __ATOMIC_SEQ_CST);
    if (gb != ge || !blind(ge))
        return false;
    if (!r->streamed)
        return true; /* streaming stopped (blind()) */
    blind_fresh = ge != r->blind_seen;
    fresh = te != r->touch_seen || blind_fresh;
    if (!wo_driver_enter())
        return false;
    /* The engine may free the range at any moment (wo_uvm_free, on its
     * thread, under wo_uvm.lock): a copy from freed memory reads unmapped
     * pages. So the copy is issued under that lock, with the range still
     * live; a free after it waits in the driver for the copy (cuMemFree
     * synchronises with the device's work). */
    pthread_mutex_lock(&wo_uvm.lock);
    if (wo_registry_get(id, &rg) < 0 || rg.gen != r->gen) {
        pthread_mutex_unlock(&wo_uvm.lock);
        wo_driver_leave();
        drop(id);
        return true; /* the slot is free: try the next range */
    }
    prev = push_ctx();
    /* after every kernel that read the slot's previous range: read_done, as
     * the hooks recorded it after each redirected launch, is not enough. A
     * launch may turn the slot address it was handed into a table in
     * device memory that a later kernel reads (PyTorch's grouped GEMM:
     * one kernel writes each expert's pointer, the next one, which the
     * shim sees no pointer in, reads through them). That kernel was
     * submitted after the redirected one and, since the engine's host
     * thread has moved on past it, before now: recorded here, on the
     * stream that read the slot, read_done covers it too. No hook holds
     * the slot (unpublished above), so none records it meanwhile. */
    if (!fence_owner(s)) {
        pop_ctx(prev);
        pthread_mutex_unlock(&wo_uvm.lock);
        wo_driver_leave();
        return false; /* the reader's stream is being captured: later */
    }
    /* the slot's last contents, and any earlier slot of this range, are
     * checked for writes first (check_slot), the copy stream waiting */
    for (unsigned k = 0; k < ex->nslots; k++)
        if ((k == (unsigned)slot || ex->slot_chk[k] == id) && !check_slot(k)) {
            pop_ctx(prev);
            pthread_mutex_unlock(&wo_uvm.lock);
            wo_driver_leave();
            return false;
        }
    res = ex->check_on || !ex->checks_wanted ? d->cuStreamWaitEvent(ex->copy, s->read_done, 0)
                                             : CUDA_ERROR_NOT_SUPPORTED;
    if (res == CUDA_SUCCESS && te != r->touch_seen)
        res = d->cuStreamWaitEvent(ex->copy, wo_stream_tab.fence, 0);
    if (res == CUDA_SUCCESS && blind_fresh)
        res = d->cuStreamWaitEvent(ex->copy, wo_stream_tab.blind_fence, 0);
    if (res == CUDA_SUCCESS) {
        bool managed = (rg.flags & WO_RANGE_MANAGED) != 0, pinned = false;
        /* a check of the range still under way may copy a written slot
         * back into it, and a launch that touched it in place may have
         * written it, not its pinned copy: stage from the range */
        CUdeviceptr src = r->chk_slot1 || fresh ? (CUdeviceptr)(r->base + r->lo)
                                                : source(id, r, managed, &pinned);
        res = copy_to_slot((CUdeviceptr)s->dev, src, r->hi - r->lo, managed && !pinned);
        if (res == CUDA_SUCCESS && pinned)
            add(&wo_stream_tab.n.staged_pinned, 1);
    }
    /* the hash it is checked against, before any launch may read (and
     * write) the slot; after a blind launch, of the range as it is now
     * (what the blind launch wrote is the range's, nothing to copy back:
     * the range stays streamed, as after an RL trainer's weight update) */
    if (blind_fresh && te == r->touch_seen)
        r->hashed = false;
    if (res == CUDA_SUCCESS && ex->check_on && !r->hashed) {
        res = wo_check_first(ex->copy, (CUdeviceptr)s->dev, r->hi - r->lo, id);
        r->hashed = hashed_now = res == CUDA_SUCCESS;
    }
    if (res == CUDA_SUCCESS)
        res = d->cuEventRecord(s->copied, ex->copy);
    if (res == CUDA_SUCCESS) {
        ex->slot_chk[slot] = id;
        ex->slot_chk_gen[slot] = r->gen;
    }
    pop_ctx(prev);
    pthread_mutex_unlock(&wo_uvm.lock);
    wo_driver_leave();
    if (res != CUDA_SUCCESS) {
        /* the range may have been freed under us (its free event still in
         * the ring): it is read in place */
        wo_debug("stream: staging '%s': %s", r->name ? r->name : "(unnamed)",
                 wo_cu_error_name(res));
        r->streamed = false;
        __atomic_store_n(&e->streamed, 0, __ATOMIC_RELEASE);
        return true;
    }
    add(&wo_stream_tab.n.staged, 1);
    add(&wo_stream_tab.n.staged_bytes, r->hi - r->lo);
    r->staged += r->hi - r->lo;
    if (__atomic_load_n(&e->touch_begin, __ATOMIC_SEQ_CST) != tb ||
        __atomic_load_n(&wo_stream_tab.blind_begin, __ATOMIC_SEQ_CST) != gb) {
        /* a launch began touching it in place (or a blind one began) while
         * the copy was issued: the copy may have raced a write; never
         * published, never checked (nothing read or wrote it); staged
         * again later */
        ex->slot_chk[slot] = NONE;
        if (hashed_now)
            r->hashed = false; /* that hash may be of the raced copy */
        add(&wo_stream_tab.n.not_published, 1);
        return true;
    }
    r->touch_seen = te;
    r->blind_seen = ge;
    __atomic_store_n(&e->blind, gb, __ATOMIC_RELAXED); /* before the word: hooks read it after */
    __atomic_store_n(&s->owner, 0, __ATOMIC_RELEASE);
    ex->epoch++;
    nw = wo_stream_word(r->gen, ex->epoch, (unsigned)slot);
    if (!__atomic_compare_exchange_n(&e->word, &w, nw, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
        mark_written(r, id); /* a copy wrote it while we staged */
        return true;
    }
    r->slot = slot;
    ex->slot_range[slot] = (int)id;
    ex->slot_last[slot] = id;
    __atomic_store_n(&e->nowait, 0, __ATOMIC_RELAXED);
    return true;
}

static bool in(const uint32_t *v, unsigned n, uint32_t id)
{
    for (unsigned i = 0; i < n; i++)
        if (v[i] == id)
            return true;
    return false;
}

/* Readies slots [lo, hi) for cuMemFree: what their readers' streams were
 * given done (fence_owner), their contents checked for writes (check_slot),
 * the copies and every launch that read them finished, and the checks'
 * verdicts taken (poll_checks). False: later (a fence or a check cannot be
 * had yet, or a capture forbids the driver calls). */
static bool quiesce(unsigned lo, unsigned hi)
{
    const struct wo_driver *d = ex->drv;
    CUcontext prev;
    bool ok = true;

    if (!wo_driver_enter())
        return false;
    prev = push_ctx();
    pthread_mutex_lock(&wo_uvm.lock);
    for (unsigned s = lo; s < hi && ok; s++)
        ok = fence_owner(&wo_stream_tab.slot[s]) && check_slot(s);
    pthread_mutex_unlock(&wo_uvm.lock);
    if (ok) {
        if (ex->copy && d->cuStreamSynchronize)
            d->cuStreamSynchronize(ex->copy);
        for (unsigned s = lo; s < hi; s++)
            if (wo_stream_tab.slot[s].read_done && d->cuEventSynchronize)
                d->cuEventSynchronize(wo_stream_tab.slot[s].read_done);
    }
    pop_ctx(prev);
    wo_driver_leave();
    if (ok)
        poll_checks(true, NONE);
    return ok;
}

/* Gives slot s its wanted size: its contents checked for writes first and
 * every launch that read it done (as free_slots does for all of them),
 * then its memory freed and allocated again. A size cuMemAlloc refuses
 * leaves the old one (remembered: not asked again until the wanted size
 * changes). False: later (a hook holds it, or a capture). */
static bool resize_slot(unsigned s)
{
    const struct wo_driver *d = ex->drv;
    struct wo_stream_slot *sl = &wo_stream_tab.slot[s];
    uint64_t want = ex->want_sz[s], old = ex->slot_sz[s];
    CUdeviceptr p = 0;
    CUcontext prev;
    CUresult res;

    if (!d->cuMemFree_v2)
        return false;
    if (at_engine(s, true) || !unpublish(s) || !quiesce(s, s + 1))
        return false;
    /* growing: the planner's budget first (its hot set makes the room);
     * outside the driver section, which is not nested (its drain enters
     * it), and before the slots' context is pushed (the prefetcher may
     * make its own current) */
    if (want > old)
        wo_prefetch_reserve(slots_bytes() - old + want);
    if (!wo_driver_enter())
        return false;
    prev = push_ctx();
    d->cuMemFree_v2((CUdeviceptr)sl->dev);
    sl->dev = 0;
    ex->slot_sz[s] = 0;
    res = d->cuMemAlloc_v2(&p, want);
    if (res != CUDA_SUCCESS) {
        char a[24], b[24];
        ex->grow_failed[s] = want;
        want = d->cuMemAlloc_v2(&p, old) == CUDA_SUCCESS ? old : 0;
        wo_info("stream: staging slot %u: %s could not be allocated (%s): it keeps %s%s", s,
                size_str(ex->want_sz[s], a), wo_cu_error_name(res), size_str(want, b),
                want ? "" : " (no range is staged in it)");
    }
    pop_ctx(prev);
    wo_driver_leave();
    sl->dev = p;
    ex->slot_sz[s] = want;
    ex->slot_last[s] = NONE;
    __atomic_store_n(&sl->owner, 0, __ATOMIC_RELEASE);
    if (want != old)
        add(&wo_stream_tab.n.slot_resizes, 1);
    return true;
}

/* The size slot s is given for a wanted size: kept when none is wanted
 * yet, when cuMemAlloc refused that size, or when it shrinks by an eighth
 * or less (no churn for ranges of near sizes). resize() and readmit_room()
 * both judge by it. */
static uint64_t size_after(unsigned s, uint64_t want)
{
    uint64_t cur = ex->slot_sz[s];

    if (!want || want == ex->grow_failed[s] || (want <= cur && want >= cur - cur / 8))
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

    return wo_registry_get(id, &rg) >= 0 && rg.gen == r->gen ? rg.size : r->hi - r->lo;
}

static void readmit_room(void)
{
    uint64_t budget = wo_uvm_device_budget(), held = 0;
    unsigned n = 0;

    for (uint32_t id = 0; id < ex->nr; id++) {
        const struct srange *r = &ex->r[id];
        if (r->live && !r->host && !r->streamed && r->msteps &&
            r->last_step + AUTO_RECENT >= ex->steps)
            held += footprint(id, r);
    }
    for (uint32_t i = 0; i < ex->norder && held < budget; i++) {
        uint32_t id = ex->order[i];
        struct srange *r = &ex->r[id];
        uint64_t fp, sz[WO_STREAM_MAX_SLOTS], slots_after = 0;

        if (id >= ex->nr || !r->live || !r->room || !r->streamed)
            continue;
        /* the slots the streamed ranges need without it: taking one of a
         * pair of sizes out of the order (a down tensor between two
         * gate_up ones) can make them larger, and the room they grow by
         * is the planner's */
        if (!size_for(id, sz))
            continue;
        /* counted before any shrink is made: a slot gives its bytes back
         * only once it is free */
        for (unsigned k = 0; k < ex->nslots; k++)
            slots_after += WO_MAX(size_after(k, sz[k]), ex->slot_sz[k]);
        fp = footprint(id, r);
        if (held + fp + slots_after > budget)
            continue;
        held += fp;
        unselect_range(r, id);
        n++;
    }
    if (n)
        wo_info("stream: auto: %u hot ranges back with the planner: the slots' room holds them", n);
}

/* Brings the slots to their wanted sizes (want_sizes, size_after), each
 * once none of the next ranges (ahead) is in it and the engine is not at
 * it; a slot that grows takes its bytes from the planner's budget first,
 * one that shrank gives them back after. */
static void resize(const uint32_t *ahead, unsigned na)
{
    uint64_t before = slots_bytes();
    bool done = false, changed = false;

    if (!ex->slots_ready || ex->slots_failed)
        return;
    for (unsigned s = 0; s < ex->nslots; s++) {
        uint64_t cur = ex->slot_sz[s];
        if (size_after(s, ex->want_sz[s]) == cur)
            continue;
        if (ex->slot_range[s] >= 0 && in(ahead, na, (uint32_t)ex->slot_range[s]))
            continue;
        if (resize_slot(s)) {
            done = true;
            changed |= ex->slot_sz[s] != cur; /* not when cuMemAlloc refused */
        }
    }
    if (!done)
        return;
    __atomic_store_n(&wo_stream_tab.n.slot_bytes, slots_bytes(), __ATOMIC_RELAXED);
    if (changed)
        say_slots(" resized");
    /* a refused grow gives back what it took from the planner */
    if (slots_bytes() < before)
        slots_shrank();
    else
        wo_prefetch_reserve(slots_bytes());
}

/* The slots hold fewer bytes than the planner was told: its budget grows,
 * and auto gives back the hot ranges it streamed for the room (readmit_room). */
static void slots_shrank(void)
{
    wo_prefetch_reserve(slots_bytes());
    if (ex->mode == WO_PREFETCH_MODE_AUTO)
        readmit_room();
}

/* Stages the range the engine is at and the next ones, keeping the one
 * before. */
static void advance(void)
{
    uint32_t pos = __atomic_load_n(&wo_stream_tab.pos, __ATOMIC_RELAXED), idx;
    uint32_t ahead[WO_STREAM_MAX_SLOTS], behind = NONE;
    unsigned na = 0;

    if (!ex->norder || pos == 0 || pos - 1 >= ex->nr)
        return;
    idx = ex->r[pos - 1].ord;
    if (idx == NONE)
        return;
    /* the furthest point of this step; far back means the next step began */
    if (ex->maxi == NONE || idx > ex->maxi || idx + ex->norder / 2 < ex->maxi)
        ex->maxi = idx;
    for (uint32_t k = 0; k < ex->norder && na < ex->nslots - 1; k++) {
        uint32_t id = ex->order[(ex->maxi + k) % ex->norder];
        if (ex->r[id].live && ex->r[id].streamed && !in(ahead, na, id))
            ahead[na++] = id;
    }
    for (uint32_t k = 1; k < ex->norder; k++) {
        uint32_t id = ex->order[(ex->maxi + ex->norder - k) % ex->norder];
        if (ex->r[id].live && ex->r[id].streamed) {
            behind = in(ahead, na, id) ? NONE : id;
            break;
        }
    }
    if (!na || !slots())
        return;
    for (unsigned k = 0; k < na; k++) {
        struct srange *r = &ex->r[ahead[k]];
        int pick = -1;

        /* a launch that touched it in place took its assignment back
         * (wo_stream_touch_begin), or a blind launch began since it was
         * published (hooks no longer take it): staged again, from the
         * range */
        if (r->slot >= 0 && r->streamed &&
            (__atomic_load_n(&wo_stream_tab.e[ahead[k]].word, __ATOMIC_SEQ_CST) == 0 ||
             wo_stream_blind_since(&wo_stream_tab.e[ahead[k]])))
            take_back(r);
        if (r->slot >= 0 || !r->streamed)
            continue;
        /* a free slot, else one of a range behind, the one just behind last;
         * never the slot of the range the engine is at (at_engine); of
         * those, the smallest the range fits (slots are sized: want_sizes) */
        for (int tier = 0; tier < 3 && pick < 0; tier++)
            for (unsigned s = 0; s < ex->nslots; s++) {
                uint32_t held = (uint32_t)ex->slot_range[s];
                bool ok = tier == 0   ? ex->slot_range[s] < 0
                          : tier == 1 ? !in(ahead, na, held) && held != behind
                                      : !in(ahead, na, held);
                if (ok && ex->slot_sz[s] >= r->hi - r->lo && !at_engine(s, true) &&
                    (pick < 0 || ex->slot_sz[s] < ex->slot_sz[pick]))
                    pick = (int)s;
            }
        if (pick < 0 || !stage(ahead[k], pick))
            break;
    }
    resize(ahead, na);
}

/* ---- learning ----------------------------------------------------------------- */

static uint64_t granule(const struct srange *r)
{
    uint64_t span = r->hi - r->lo;
    return (span + GRANULES - 1) / GRANULES;
}

static void account_hit(struct srange *r, uint32_t id, const struct wo_ev_hit *h)
{
    uint64_t span = r->hi - r->lo, rel, relhi, end, g = granule(r);

    if (h->offset < r->lo || h->offset >= r->hi)
        return; /* another part of the allocation */
    rel = h->offset - r->lo;
    relhi = h->hi > h->offset ? h->hi - r->lo : rel + 1;
    if (rel)
        r->slice = r->slice ? wo_plan_gcd(r->slice, rel) : rel;
    end = wo_plan_extent_end(span, r->slice, rel, relhi);
    if (end <= rel)
        return;
    r->read += end - rel;
    for (uint64_t k = rel / g; k <= (end - 1) / g && k < GRANULES; k++)
        r->mask |= UINT64_C(1) << k;
    if (!r->touched) {
        r->touched = true;
        /* the order takes a copy of cur at the step's end: same capacity */
        if (wo_grow((void **)&ex->cur, &ex->cap_cur, ex->ncur + 1, sizeof(*ex->cur)) < 0 ||
            wo_grow((void **)&ex->order, &ex->cap_order, ex->ncur + 1, sizeof(*ex->order)) < 0)
            return;
        ex->cur[ex->ncur++] = id;
    }
}

bool wo_stream_gathered(const char *name)
{
    return name && wo_fit_class(name) == 5;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

uint64_t wo_stream_slot_size(uint64_t *sizes, size_t n)
{
    uint64_t total = 0, sum = 0;

    if (!n)
        return 0;
    qsort(sizes, n, sizeof(*sizes), cmp_u64);
    for (size_t i = 0; i < n; i++)
        total += sizes[i];
    for (size_t i = 0; i < n; i++) {
        sum += sizes[i];
        if (sum >= total - total / 10)
            return sizes[i];
    }
    return sizes[n - 1];
}

/* Whether the executor can stream the range at all: its span is weights
 * only, no copy wrote it, it is not gathered, and it fits a slot (said
 * once when it does not). */
static bool streamable(struct srange *r)
{
    if (r->written || r->gathered || r->gapped)
        return false;
    if (r->hi - r->lo > ex->slot_size) {
        if (!r->big) {
            r->big = true;
            wo_info("stream: '%s' (%llu MiB) is larger than the staging slots (%llu MiB): read "
                    "in place",
                    r->name ? r->name : "(unnamed)", (unsigned long long)((r->hi - r->lo) >> 20),
                    (unsigned long long)(ex->slot_size >> 20));
        }
        return false;
    }
    return true;
}

/* quiet: auto's step-time decision streams many ranges at once and says
 * so in one line (auto_decide) */
static void select_range(struct srange *r, uint32_t id, bool quiet)
{
    if (r->streamed || !streamable(r))
        return;
    r->streamed = true;
    __atomic_store_n(&wo_stream_tab.e[id].streamed, 1, __ATOMIC_RELEASE);
    if (!r->host)
        wo_prefetch_release(id, r->gen, wo_stream_reserved());
    if (quiet)
        return;
    if (r->msteps)
        wo_info("stream: '%s' (%s, %llu MiB) is streamed: read %.1fx its bytes a step",
                r->name ? r->name : "(unnamed)", r->host ? "host" : "managed",
                (unsigned long long)((r->hi - r->lo) >> 20), r->gain);
    else
        wo_debug("stream: '%s' (%s, %llu MiB) is streamed (prefetch.mode stream)",
                 r->name ? r->name : "(unnamed)", r->host ? "host" : "managed",
                 (unsigned long long)((r->hi - r->lo) >> 20));
}

/* A range auto streamed by step time goes back to being read in place
 * (a managed one to the planner, which may make it resident again). Its
 * assignment is taken back at once (unpublish: no hook takes the slot any
 * more); a hook that still holds the slot keeps reading it, and stage()
 * reuses a slot only once no hook does. */
static void unselect_range(struct srange *r, uint32_t id)
{
    r->probed = false;
    r->room = false;
    r->streamed = false;
    __atomic_store_n(&wo_stream_tab.e[id].streamed, 0, __ATOMIC_RELEASE);
    take_back(r);
    if (!r->host)
        wo_prefetch_readmit(id, r->gen, wo_stream_reserved());
}

/* the first decisions at info, later ones (a server's batch moves) at debug */
#define AUTO_SAY(loud, ...)                                                                        \
    do {                                                                                           \
        if (loud)                                                                                  \
            wo_info(__VA_ARGS__);                                                                  \
        else                                                                                       \
            wo_debug(__VA_ARGS__);                                                                 \
    } while (0)

/* Whether the range was read in a recent step and could be streamed. */
static bool auto_recent(struct srange *r)
{
    return r->live && !r->streamed && r->msteps && r->last_step + AUTO_RECENT >= ex->steps &&
           streamable(r);
}

/* auto's candidates for the step-time decision: ranges a recent step read
 * in place, that the executor can stream and did not stream for their gain
 * (those stay streamed: they save bytes whatever the time says): host
 * ranges, and managed ranges the planner's hot set does not keep on the
 * GPU (transformers' default experts backend reads a stacked tensor once
 * a step by count, per token on the GPU: the gain rule never sees it). */
static bool auto_candidate(struct srange *r, uint32_t id)
{
    if (!r->live)
        return false;
    if (r->probed)
        return true;
    return auto_recent(r) && (r->host || wo_prefetch_hot_bytes(id, r->gen) < (r->hi - r->lo) / 2);
}

/* The slots come out of the planner's budget: the bytes of managed ranges
 * its hot set keeps (and that are not streamed) beyond what is left of it
 * once `reserved` is out. */
static uint64_t hot_over(uint64_t reserved)
{
    uint64_t budget = wo_uvm_device_budget(), hot = 0;

    budget -= WO_MIN(reserved, budget);
    for (uint32_t id = 0; id < ex->nr; id++)
        if (ex->r[id].live && !ex->r[id].host && !ex->r[id].streamed)
            hot += wo_prefetch_hot_bytes(id, ex->r[id].gen);
    return hot > budget ? hot - budget : 0;
}

/* auto by step time (stream-auto.h): stream the candidates when a step's
 * period says it pays, and back when it does not. A hot managed range the
 * slots leave no room for is streamed with them, the last of the step
 * first (llama.cpp's --n-cpu-moe keeps the first layers on the GPU too):
 * the planner would drop it, and it would be read in place. */
static void auto_decide(uint64_t t_ns, unsigned k)
{
    uint64_t cand = 0, bytes = 0, kept = ex->au.kept, slot_bytes, over;
    unsigned n = 0, nm = 0, nroom = 0;
    bool loud = ex->au.tries < 3;
    enum wo_auto_action act;

    if (ex->mode != WO_PREFETCH_MODE_AUTO || ex->slots_failed)
        return;
    slot_bytes = slots_bytes();
    for (uint32_t id = 0; id < ex->nr; id++)
        if (auto_candidate(&ex->r[id], id))
            cand += ex->r[id].hi - ex->r[id].lo;
    if (cand && ex->au.phase == WO_AUTO_WATCH)
        cand += hot_over(slot_bytes);
    act = wo_auto_step(&ex->au, t_ns, k, cand, ex->link_gbs);
    if (act == WO_AUTO_STREAM) {
        for (uint32_t id = 0; id < ex->nr; id++) {
            struct srange *r = &ex->r[id];
            if (!auto_candidate(r, id) || r->probed)
                continue;
            select_range(r, id, true);
            if (r->streamed) {
                r->probed = true;
                n++;
                nm += !r->host;
                bytes += r->hi - r->lo;
            }
        }
        over = hot_over(slot_bytes);
        for (uint32_t i = ex->norder; over && i-- > 0;) {
            uint32_t id = ex->order[i];
            struct srange *r = &ex->r[id];
            uint64_t hot;

            if (id >= ex->nr || r->host || !auto_recent(r) ||
                !(hot = wo_prefetch_hot_bytes(id, r->gen)))
                continue;
            select_range(r, id, true);
            if (r->streamed) {
                r->probed = true;
                r->room = true;
                n++;
                nm++;
                nroom++;
                bytes += r->hi - r->lo;
                over -= WO_MIN(hot, over);
            }
        }
        add(&wo_stream_tab.n.auto_tries, 1);
        AUTO_SAY(
            loud,
            "stream: auto: trying %u ranges (%u managed, %u of them hot ones the slots take the "
            "room of; %llu MiB) streamed: a step took %.1f ms read in place, one copy of them "
            "takes %.1f ms at %.0f GB/s",
            n, nm, nroom, (unsigned long long)(bytes >> 20), ex->au.inplace_ns / 1e6,
            (double)bytes / ex->link_gbs / 1e6, ex->link_gbs);
    } else if (act == WO_AUTO_UNSTREAM) {
        for (uint32_t id = 0; id < ex->nr; id++)
            if (ex->r[id].live && ex->r[id].probed) {
                unselect_range(&ex->r[id], id);
                n++;
            }
        if (ex->au.phase == WO_AUTO_HOLD) {
            add(&wo_stream_tab.n.auto_backs, 1);
            AUTO_SAY(loud,
                     "stream: auto: %u ranges back in place: a step took %.1f ms streamed, "
                     "%.1f ms in place",
                     n, ex->au.stream_ns / 1e6, ex->au.inplace_ns / 1e6);
        } else {
            wo_debug("stream: auto: the step's period moved (%.1f ms, streamed at %.1f ms): "
                     "measuring in place again (%u ranges)",
                     ex->au.ewma_ns / 1e6, ex->au.decided_ns / 1e6, n);
        }
    } else if (ex->au.kept != kept) {
        add(&wo_stream_tab.n.auto_kept, 1);
        AUTO_SAY(loud,
                 "stream: auto: the ranges stay streamed: a step takes %.1f ms streamed, %.1f ms "
                 "in place",
                 ex->au.stream_ns / 1e6, ex->au.inplace_ns / 1e6);
    }
}

static void publish_names(bool force);

static void close_step(unsigned k, uint64_t t_ns)
{
    /* the first boundary closes the steps the period was learned on, and
     * everything read since the start with them: not a measurement */
    bool measure = ex->steps > 0;
    const char *warn_name = NULL;
    double warn_mult = 0;
    unsigned warn_more = 0;

    ex->steps += k;
    add(&wo_stream_tab.n.steps, k);
    for (uint32_t id = 0; id < ex->nr; id++) {
        struct srange *r = &ex->r[id];
        uint64_t distinct;
        double mult, gain;

        if (!r->live)
            continue;
        r->steps_all += k;
        r->sum_staged += (double)r->staged;
        r->staged = 0;
        if (!r->touched || !measure) {
            r->read = 0;
            r->mask = 0;
            r->touched = false;
            continue;
        }
        /* per step: the bytes read over the distinct bytes among them */
        distinct = WO_MIN((uint64_t)__builtin_popcountll(r->mask) * granule(r), r->hi - r->lo);
        mult = distinct ? (double)r->read / (double)k / (double)distinct : 0;
        gain = (double)r->read / (double)k / (double)(r->hi - r->lo);
        r->msteps += k;
        r->last_step = ex->steps;
        r->sum_mult += mult * k;
        r->sum_read += (double)r->read;
        /* a running mean while young, then recent steps weigh more */
        r->gain = r->msteps <= 4 ? r->gain + (gain - r->gain) * k / (double)r->msteps
                                 : 0.75 * r->gain + 0.25 * gain;
        if (!ex->slots_failed && ((ex->mode == WO_PREFETCH_MODE_AUTO && r->msteps >= AUTO_STEPS &&
                                   r->gain >= AUTO_GAIN) ||
                                  ex->mode == WO_PREFETCH_MODE_STREAM)) {
            r->probed = false; /* streamed for its gain now: the step time cannot take it back */
            select_range(r, id, false); /* stream: also ranges that came after setup */
        }
        /* the advice is a mode: under stream or auto a range read in place
         * was too large for a slot, gapped or written (said when found) */
        if (ex->mode == WO_PREFETCH_MODE_HOT_SET && r->host && !r->streamed && !r->warned &&
            r->msteps >= AUTO_STEPS && r->sum_mult / (double)r->msteps >= WARN_MULT) {
            r->warned = true;
            if (!warn_name) {
                warn_name = r->name ? r->name : "(unnamed)";
                warn_mult = r->sum_mult / (double)r->msteps;
            } else {
                warn_more++;
            }
        }
        r->read = 0;
        r->mask = 0;
        r->touched = false;
    }
    if (warn_name && !ex->warned) {
        /* one line for the process: the first range, and how many more */
        char more[64] = "";
        ex->warned = true;
        if (warn_more)
            snprintf(more, sizeof(more), " (and %u more host ranges)", warn_more);
        wo_warn("stream: '%s' (host) is read %.1fx a step in place over PCIe%s; "
                "prefetch: {mode: auto} would copy it once a step into device slots "
                "(docs/prefetch.md, Streaming)",
                warn_name, warn_mult, more);
    }
    /* this step's first touches are the next step's plan */
    for (uint32_t i = 0; i < ex->norder; i++)
        if (ex->order[i] < ex->nr) {
            ex->r[ex->order[i]].ord = NONE;
            __atomic_store_n(&wo_stream_tab.e[ex->order[i]].planned, 0, __ATOMIC_RELAXED);
        }
    memcpy(ex->order, ex->cur, ex->ncur * sizeof(*ex->cur));
    ex->norder = ex->ncur;
    ex->ncur = 0;
    for (uint32_t i = 0; i < ex->norder; i++) {
        ex->r[ex->order[i]].ord = i;
        __atomic_store_n(&wo_stream_tab.e[ex->order[i]].planned, 1, __ATOMIC_RELAXED);
    }
    ex->maxi = NONE;
    if (measure)
        auto_decide(t_ns, k);
    if (!ex->slots_failed)
        want_sizes(); /* for what this step streamed, in its order (resize) */
    publish_names(false);
}

/* The consumer's copy of preload/launch.c's reads_weights(): whether
 * func's launches reached two off-device ranges or more (ids: this
 * launch's). Once ranges vary (lows_vary), a function that reached one
 * only reached it through a word that held an address by chance: a
 * libtorch kernel's unfilled struct members named the last layer's weight
 * in every layer on the Qwen3 shape (docs/prefetch.md, Streaming). */
static bool reader(uint64_t func, const uint32_t *ids, unsigned n)
{
    struct fnrec *f = NULL;
    uint64_t h = func * UINT64_C(0x9E3779B97F4A7C15);

    if (!ex->fns && !(ex->fns = calloc(FNS, sizeof(*ex->fns))))
        return true;
    for (unsigned i = 0; i < 32 && !f; i++) {
        struct fnrec *c = &ex->fns[((h >> 40) + i) & (FNS - 1)];
        if (c->func == func || !c->func)
            f = c;
    }
    if (!f)
        return true; /* table crowded: as before */
    f->func = func;
    for (unsigned i = 0; i < n && !f->many; i++) {
        if (!f->first)
            f->first = ids[i] + 1;
        else if (f->first != ids[i] + 1)
            f->many = true;
    }
    return f->many;
}

static void on_launch(const struct wo_event *ev)
{
    uint32_t low = NONE, ids[WO_EV_MAX_HITS];
    unsigned n = 0;
    bool same;
    unsigned k;

    if (ev->capture)
        return; /* replayed later by a graph, never redirected */
    for (unsigned i = 0; i < ev->nhits && i < WO_EV_MAX_HITS; i++) {
        const struct wo_ev_hit *h = &ev->l.hits[i];
        struct srange *r;

        if (h->id >= ex->nr || !(r = &ex->r[h->id])->live || r->gen != h->gen)
            continue;
        /* a hit outside the span (an activation in the allocation's tail)
         * is not a weight read: it neither counts nor keys the step (those
         * move between steps, and the step would never be found) */
        if (h->hi <= r->lo || h->offset >= r->hi)
            continue;
        /* nor is a word that cannot point at a weight (core/event.h) */
        if (!wo_hit_pointer_like(h))
            continue;
        ids[n++] = h->id;
    }
    if (!n || (!reader(ev->l.func, ids, n) && ex->lows_vary))
        return;
    for (unsigned i = 0; i < ev->nhits && i < WO_EV_MAX_HITS; i++) {
        const struct wo_ev_hit *h = &ev->l.hits[i];

        if (!in(ids, n, h->id) || h->gen != ex->r[h->id].gen)
            continue;
        account_hit(&ex->r[h->id], h->id, h);
        low = WO_MIN(low, h->id);
    }
    /* The step's keys are the ranges in the order launches reach them, a
     * run of launches on one range counted once: a forward pass reaches
     * the same weights in the same order whatever kernels it picks for its
     * batch, so steps are found again at once when the batch changes (a
     * key of function and range, as the planner's, changes with the
     * kernels: b1 to b8, or every step under continuous batching). */
    if (low == NONE)
        return;
    same = low == ex->last_seen;
    ex->last_seen = low;
    /* With one range only (an LM head alone off the device), the ranges
     * say nothing of the step: the planner's key then, function and range.
     * The second range seen switches over, once, from a new stepper. */
    if (!ex->lows_vary && ex->first_low != NONE && low != ex->first_low) {
        ex->lows_vary = true;
        __atomic_store_n(&wo_stream_tab.readers, 1, __ATOMIC_RELAXED);
        wo_stepper_done(&ex->st);
        wo_stepper_init(&ex->st);
    }
    if (ex->first_low == NONE)
        ex->first_low = low;
    if (ex->lows_vary) {
        if (same)
            return;
        k = wo_stepper_feed(&ex->st, wo_stepper_key(0, low));
    } else {
        k = wo_stepper_feed(&ex->st, wo_stepper_key(ev->l.func, low));
    }
    if (k)
        close_step(k, ev->t_ns);
}

/* ---- ranges ----------------------------------------------------------------- */

/* Bytes no off-device tag names are not known to be weights: the engine's
 * allocator may hand them to activations after seal (PyTorch splits a
 * 20 MiB segment between two 8 MiB weights and whatever comes next), which
 * kernels write. So a span is made of off-device tags only, and a span
 * with other bytes between its tags is never streamed: a redirected write
 * would land in the slot. The pieces of an allocation come in offset
 * order, so a tag that starts past the span's end (or ends before its
 * start) leaves such a gap. */
static int add_seg(const struct wo_uvm_segment *s, void *ud)
{
    struct srange *r;
    struct wo_range rg;

    (void)ud;
    if (s->untagged || s->id >= WO_STREAM_IDS || wo_registry_get(s->id, &rg) < 0 ||
        rg.gen != s->gen)
        return 0;
    if (s->id >= ex->nr) {
        uint32_t n = WO_MIN(WO_MAX(s->id + 1, ex->nr * 2), WO_STREAM_IDS);
        struct srange *v = realloc(ex->r, (size_t)n * sizeof(*v));
        if (!v)
            return -ENOMEM;
        memset(v + ex->nr, 0, (size_t)(n - ex->nr) * sizeof(*v));
        for (uint32_t i = ex->nr; i < n; i++) {
            v[i].slot = -1;
            v[i].ord = NONE;
        }
        ex->r = v;
        ex->nr = n;
    }
    r = &ex->r[s->id];
    if (r->live && r->gen != s->gen)
        return 0; /* the free of the old one is still in the ring */
    if (!r->live) {
        struct wo_stream_entry *e = &wo_stream_tab.e[s->id];
        r->live = true;
        r->gen = s->gen;
        r->base = rg.base;
        r->lo = s->offset;
        r->hi = s->offset + s->size;
        r->name = strdup(s->name);
        r->gathered = wo_stream_gathered(s->name);
        __atomic_store_n(&e->word, 0, __ATOMIC_SEQ_CST);
        __atomic_store_n(&e->base, rg.base, __ATOMIC_RELAXED);
        __atomic_store_n(&e->gen, s->gen, __ATOMIC_RELAXED);
    } else {
        /* more off-device bytes of the same allocation: one span, unless
         * other bytes lie between (fewer than PAD_MAX are the alignment of
         * the tensor before: PyTorch rounds blocks to 512 bytes) */
        if (r->streamed || r->slot >= 0)
            return 0; /* its span is published: keep it */
        if ((s->offset > r->hi + PAD_MAX || s->offset + s->size + PAD_MAX < r->lo) && !r->gapped) {
            r->gapped = true;
            wo_info("stream: '%s': bytes no off-device tag names lie between its tags "
                    "(activations may live there): never streamed, read in place",
                    r->name ? r->name : "(unnamed)");
        }
        r->lo = WO_MIN(r->lo, s->offset);
        r->hi = WO_MAX(r->hi, s->offset + s->size);
    }
    r->host |= s->place == WO_PLACE_HOST;
    __atomic_store_n(&wo_stream_tab.e[s->id].lo, r->lo, __ATOMIC_RELAXED);
    __atomic_store_n(&wo_stream_tab.e[s->id].hi, r->hi, __ATOMIC_RELAXED);
    return 0;
}

/* No range is streamed any more (the engine freed them): the slots go
 * back, once no hook holds one and the GPU is done with them. False: later
 * (a hook still holds a slot, or a global-mode capture is under way). */
static bool free_slots(void)
{
    const struct wo_driver *d = ex->drv;
    CUcontext prev;

    if (!ex->slots_ready)
        return true;
    for (unsigned i = 0; i < ex->nslots; i++)
        if (__atomic_load_n(&wo_stream_tab.slot[i].inflight, __ATOMIC_SEQ_CST) > 0 ||
            at_engine(i, false))
            return false; /* a hook holds it, or kernels to come may read it (stage()) */
    /* after everything its readers' streams were given (stage(): why), and
     * each slot's contents checked for writes (check_slot) */
    if (!quiesce(0, ex->nslots))
        return false;
    if (!wo_driver_enter())
        return false; /* a capture began: the slots go back later (checked again: no-op) */
    prev = push_ctx();
    /* the copies from them and their readers are done (quiesce): no event
     * to wait for */
    if (ex->pin_on)
        wo_pin_retire_all(NULL);
    for (unsigned i = 0; i < ex->nslots; i++) {
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
        ex->slot_sz[i] = 0;
        s->copied = s->read_done = NULL;
        __atomic_store_n(&s->owner, 0, __ATOMIC_RELEASE);
        /* a range whose unpublish() failed may still name the slot */
        if (ex->slot_range[i] >= 0 && (uint32_t)ex->slot_range[i] < ex->nr)
            ex->r[ex->slot_range[i]].slot = -1;
        for (uint32_t id = 0; id < ex->nr; id++)
            if (ex->r[id].slot == (int)i)
                ex->r[id].slot = -1;
        ex->slot_range[i] = -1;
        ex->slot_last[i] = NONE;
        ex->slot_chk[i] = NONE;
    }
    for (uint32_t id = 0; id < ex->nr; id++) {
        ex->r[id].hashed = false; /* the hashes go with the checker */
        ex->r[id].chk_slot1 = 0;
    }
    if (ex->copy && d->cuStreamDestroy_v2)
        d->cuStreamDestroy_v2(ex->copy);
    ex->copy = NULL;
    if (ex->copy_mod)
        d->cuModuleUnload(ex->copy_mod);
    ex->copy_mod = NULL;
    ex->copy_fn = NULL;
    wo_check_stop();
    ex->check_on = false;
    pop_ctx(prev);
    wo_driver_leave();
    ex->slots_ready = false;
    __atomic_store_n(&wo_stream_tab.n.slot_bytes, 0, __ATOMIC_RELAXED);
    wo_debug("stream: no range is streamed any more: the slots are given back");
    return true;
}

/* Frees reach uvm/ on the engine's thread (wo_uvm_free), not as events:
 * a range whose registry slot is gone or reused is dropped here. */
static void reap(void)
{
    for (uint32_t id = 0; id < ex->nr; id++) {
        struct wo_range rg;

        if (ex->r[id].live && (wo_registry_get(id, &rg) < 0 || rg.gen != ex->r[id].gen))
            drop(id);
    }
}

static bool any_streamed(void)
{
    for (uint32_t i = 0; i < ex->nr; i++)
        if (ex->r[i].live && ex->r[i].streamed)
            return true;
    return false;
}

static void drop(uint32_t id)
{
    struct srange *r = &ex->r[id];
    struct wo_stream_entry *e = &wo_stream_tab.e[id];

    __atomic_store_n(&e->streamed, 0, __ATOMIC_RELEASE);
    /* out of the plan too: a range that takes the id is not waited for */
    __atomic_store_n(&e->planned, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&e->nowait, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&e->word, 0, __ATOMIC_SEQ_CST);
    take_back(r);
    if (ex->pin_on)
        wo_pin_retire(id);
    free(r->name);
    memset(r, 0, sizeof(*r));
    r->slot = -1;
    r->ord = NONE;
}

static void on_copy(const struct wo_event *ev)
{
    struct wo_range rg;
    uint32_t id;

    if (wo_registry_find(ev->c.dst, &rg) < 0 || (id = rg.id) >= ex->nr || !ex->r[id].live ||
        ex->r[id].gen != rg.gen)
        return;
    if (ev->c.dst >= rg.base + ex->r[id].hi || ev->c.dst + ev->c.bytes <= rg.base + ex->r[id].lo)
        return;
    mark_written(&ex->r[id], id);
}

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
    /* hooks look at the table only once it is active: clear what a
     * previous instance (tests reset uvm/) left, word by word (the hooks
     * and the stats read it concurrently, atomically) */
    wo_stream_table_clear();
    if (!drv || !g || !wo_settings()->prefetch || !g->prefetch.enabled)
        return;
    ex = calloc(1, sizeof(*ex));
    if (!ex)
        return;
    ex->drv = drv;
    ex->mode = g->prefetch.mode;
    ex->pin_limit = g->prefetch.pinned_copies;
    ex->checks_wanted = wo_settings()->write_checks;
    ex->nslots = WO_MIN(g->prefetch.slots ? g->prefetch.slots : WO_STREAM_SLOTS_DEFAULT,
                        WO_STREAM_MAX_SLOTS);
    ex->maxi = NONE;
    ex->first_low = NONE;
    ex->last_seen = NONE;
    for (unsigned i = 0; i < WO_STREAM_MAX_SLOTS; i++) {
        ex->slot_range[i] = -1;
        ex->slot_last[i] = NONE;
        ex->slot_chk[i] = NONE;
    }
    wo_stepper_init(&ex->st);
    wo_auto_init(&ex->au);
    {
        struct wo_devmodel dm;
        wo_devmodel_default(&dm);
        ex->link_gbs = dm.h2d_gbs;
    }
    if (drv->cuDeviceGet && drv->cuDevicePrimaryCtxRetain &&
        drv->cuDeviceGet(&dev, wo_uvm.device) == CUDA_SUCCESS)
        drv->cuDevicePrimaryCtxRetain(&ex->ctx, dev);
    if (wo_uvm_foreach_offdevice(add_seg, NULL) < 0)
        wo_warn("stream: out of memory listing ranges; some are read in place");
    /* the slots hold 90% of the bytes' ranges (wo_stream_slot_size) */
    sizes = malloc((ex->nr ? ex->nr : 1) * sizeof(*sizes));
    for (uint32_t i = 0; sizes && i < ex->nr; i++)
        if (ex->r[i].live && !ex->r[i].gathered)
            sizes[nsizes++] = ex->r[i].hi - ex->r[i].lo;
    largest = sizes ? wo_stream_slot_size(sizes, nsizes) : 0;
    free(sizes);
    /* the slots count against the device budget: fewer slots when they do
     * not fit, none below two (a copy could then never overlap the reads) */
    while (ex->nslots > WO_STREAM_SLOTS_MIN && (uint64_t)ex->nslots * largest > budget)
        ex->nslots--;
    if (ex->mode == WO_PREFETCH_MODE_HOT_SET) {
        /* measures (multiplicity, the warning) and never streams */
        ex->slots_failed = true;
    } else if (!largest || (uint64_t)ex->nslots * largest > budget) {
        /* a warning where the policy asked to stream; under auto (the
         * default) a fact, at info */
        if (largest && ex->mode == WO_PREFETCH_MODE_STREAM)
            wo_warn("stream: %u slots of %llu MiB do not fit in the device budget (%llu MiB): "
                    "host and managed ranges are read in place",
                    ex->nslots, (unsigned long long)(largest >> 20),
                    (unsigned long long)(budget >> 20));
        else if (largest)
            wo_info("stream: auto: %u slots of %llu MiB do not fit in the device budget (%llu "
                    "MiB): host and managed ranges are read in place",
                    ex->nslots, (unsigned long long)(largest >> 20),
                    (unsigned long long)(budget >> 20));
        ex->slots_failed = true;
    }
    ex->slot_size = largest;
    if (ex->mode == WO_PREFETCH_MODE_STREAM && !ex->slots_failed)
        for (uint32_t i = 0; i < ex->nr; i++)
            if (ex->r[i].live)
                select_range(&ex->r[i], i, false);
    __atomic_store_n(&wo_stream_tab.active, 1, __ATOMIC_RELEASE);
    wo_info("stream: mode %s, %u slots of up to %llu MiB",
            ex->mode == WO_PREFETCH_MODE_STREAM ? "stream"
            : ex->mode == WO_PREFETCH_MODE_AUTO ? "auto"
                                                : "hot-set (measures only)",
            ex->nslots, (unsigned long long)(largest >> 20));
}

uint64_t wo_stream_reserved(void)
{
    if (!ex || ex->slots_failed)
        return 0;
    for (uint32_t i = 0; i < ex->nr; i++)
        if (ex->r[i].live && ex->r[i].streamed)
            return slots_bytes();
    return 0;
}

bool wo_stream_claims(uint32_t id, uint32_t gen)
{
    return ex && id < ex->nr && ex->r[id].live && ex->r[id].gen == gen && ex->r[id].streamed;
}

static void on_event(const struct wo_event *ev)
{
    if (!ex) {
        /* the budget is resolved at seal: before that nothing is placed */
        if (tried || ev->type != WO_EV_LAUNCH || wo_uvm_device_budget() == 0)
            return;
        setup();
        if (!ex)
            return;
    }
    switch (ev->type) {
    case WO_EV_TAG:
    case WO_EV_ALLOC:
    case WO_EV_PLACE:
        rescan = true;
        return;
    case WO_EV_FREE: /* (traces only: frees are found by reap()) */
        for (uint32_t id = 0; id < ex->nr; id++)
            if (ex->r[id].live && ex->r[id].base == ev->a.base)
                drop(id);
        return;
    case WO_EV_COPY:
        on_copy(ev);
        return;
    case WO_EV_LAUNCH:
        if (rescan) {
            rescan = false;
            (void)wo_uvm_foreach_offdevice(add_seg, NULL);
        }
        on_launch(ev);
        advance();
        return;
    default:
        return;
    }
}

static void tick(void)
{
    if (ex) {
        reap();
        poll_checks(false, NONE);
        if (ex->slots_ready && !any_streamed())
            (void)free_slots();
        advance();
        publish_names(false);
        if (ex->pin_on)
            wo_pin_tick(ex->copy);
    }
}

/* ---- per-name figures --------------------------------------------------------- */

struct name_snap {
    char *name;
    struct wo_stream_name_stats st;
};

static pthread_mutex_t snap_lock = PTHREAD_MUTEX_INITIALIZER;
static struct name_snap *snap;
static size_t nsnap;
static uint64_t snap_ns;

static void publish_names(bool force)
{
    struct name_snap *v, *old;
    size_t n = 0, nold;
    uint64_t now = wo_now_ns();

    if (!ex || (!force && now - snap_ns < 100 * UINT64_C(1000000)))
        return;
    snap_ns = now;
    v = calloc(ex->nr ? ex->nr : 1, sizeof(*v));
    if (!v)
        return;
    for (uint32_t i = 0; i < ex->nr; i++) {
        const struct srange *r = &ex->r[i];
        struct wo_stream_name_stats *st = &v[n].st;

        if (!r->live || !r->msteps)
            continue;
        st->multiplicity = r->sum_mult / (double)r->msteps;
        st->read_per_step = r->sum_read / (double)r->msteps;
        st->range_bytes = (double)(r->hi - r->lo);
        st->staged_per_step = r->steps_all ? r->sum_staged / (double)r->steps_all : 0;
        st->steps = r->msteps;
        st->host = r->host;
        st->streamed = r->streamed;
        st->written = r->written;
        v[n].name = strdup(r->name ? r->name : "(unnamed)");
        if (!v[n].name)
            break;
        n++;
    }
    pthread_mutex_lock(&snap_lock);
    old = snap;
    nold = nsnap;
    snap = v;
    nsnap = n;
    pthread_mutex_unlock(&snap_lock);
    for (size_t i = 0; i < nold; i++)
        free(old[i].name);
    free(old);
}

void wo_stream_foreach_name(void (*fn)(void *ud, const char *name,
                                       const struct wo_stream_name_stats *st),
                            void *ud)
{
    pthread_mutex_lock(&snap_lock);
    for (size_t i = 0; i < nsnap; i++)
        fn(ud, snap[i].name, &snap[i].st);
    pthread_mutex_unlock(&snap_lock);
}

/* ---- the end -------------------------------------------------------------------- */

static void free_exec(void)
{
    for (uint32_t i = 0; i < ex->nr; i++)
        free(ex->r[i].name);
    free(ex->r);
    free(ex->order);
    free(ex->cur);
    free(ex->fns);
    wo_stepper_done(&ex->st);
    free(ex);
    ex = NULL;
}

static void finish(void)
{
    struct wo_stream_counts c;
    unsigned shown = 0;
    char autos[128] = "";

    if (!ex)
        return;
    /* the hooks stop redirecting: launches after this read in place */
    __atomic_store_n(&wo_stream_tab.active, 0, __ATOMIC_RELEASE);
    publish_names(true);
    wo_stream_counts(&c);
    if (ex->mode == WO_PREFETCH_MODE_AUTO)
        snprintf(autos, sizeof(autos),
                 "; auto by step time: %llu tries, %llu kept streamed, %llu back in place",
                 (unsigned long long)c.auto_tries, (unsigned long long)c.auto_kept,
                 (unsigned long long)c.auto_backs);
    wo_info("stream: %llu steps, %llu launches redirected, read in place: %llu no slot ready, "
            "%llu captured, %llu other; %llu staging copies (%llu MiB, %.1f MiB a step), "
            "%llu slot waits, %llu invalidated by writes, %llu slots checked for writes by "
            "launches (%llu written, copied back); %llu launches waited for their "
            "copy to be issued (%.1f ms in all, %llu ran out)%s",
            (unsigned long long)c.steps, (unsigned long long)c.redirected,
            (unsigned long long)c.inplace_no_slot, (unsigned long long)c.inplace_captured,
            (unsigned long long)c.inplace_other, (unsigned long long)c.staged,
            (unsigned long long)(c.staged_bytes >> 20),
            c.steps ? (double)c.staged_bytes / (double)c.steps / (1 << 20) : 0.0,
            (unsigned long long)c.slot_waits, (unsigned long long)c.invalidated,
            (unsigned long long)c.write_checks, (unsigned long long)c.written_back,
            (unsigned long long)c.awaited, (double)c.await_ns / 1e6,
            (unsigned long long)c.await_timeouts, autos);
    if (c.blind_launches)
        wo_info("stream: %llu launches that may write weights unseen (NCCL kernels, CUDA graphs "
                "that read them): every range staged after them from the range itself%s",
                (unsigned long long)c.blind_launches,
                c.blind_unfenced ? "; one could not be fenced, and streaming stopped" : "");
    if (ex->pin_on) {
        struct wo_pin_counts pc;
        wo_pin_counts(&pc);
        wo_info("stream: %llu staging copies from pinned copies of managed ranges (copy "
                "engine), %llu by the copy kernel; %llu pinned copies made (%.1f s of the "
                "worker's time), %llu held (%llu MiB), %llu retired, %llu failed, %llu over "
                "prefetch.pinned_copies",
                (unsigned long long)c.staged_pinned, (unsigned long long)c.staged_by_kernel,
                (unsigned long long)pc.made, (double)pc.pin_ns / 1e9,
                (unsigned long long)pc.held, (unsigned long long)(pc.bytes >> 20),
                (unsigned long long)pc.retired, (unsigned long long)pc.failed,
                (unsigned long long)pc.over_budget);
    }
    for (uint32_t i = 0; i < ex->nr && shown < 10; i++) {
        const struct srange *r = &ex->r[i];
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
    if (ex->pin_on)
        wo_pin_stop();
    free_exec();
    tried = false;
}

static __attribute__((used)) struct exec *parents_exec;

static void atfork_child(void)
{
    /* the parent's slots and events mean nothing here: forget them (kept
     * reachable for leak checkers) and read in place */
    parents_exec = ex;
    ex = NULL;
    wo_pin_atfork_child();
    wo_check_atfork_child();
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
