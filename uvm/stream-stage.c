/* uvm/stream-stage.c: the streaming executor's staging (see stream-int.h):
 * the ranges' walk and drop, publishing and taking back assignments,
 * fencing a slot's readers, the write checks, blind launches, the staging
 * copy of one range into a slot, advancing the staged window with the
 * engine, and the slots' sizes and reuse: quiescing, growing and shrinking
 * them, and what auto gives back when they shrink. */
#include "uvm/stream-int.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "uvm/picks.h"
#include "uvm/plan-budget.h"
#include "uvm/stream-check.h"
#include "uvm/stream-pin.h"

static void slots_shrank(void);

/* ---- assignments ---------------------------------------------------------- */

/* Takes the slot's assignment back and waits until no hook holds it; false
 * when a hook still does after SPIN_WAIT polls (try again later). */
bool wo_sx_unpublish(int slot)
{
    int id = wo_sx->slot_range[slot];
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
    if (id >= 0 && (uint32_t)id < wo_sx->nr)
        wo_sx->r[id].slot = -1;
    wo_sx->slot_range[slot] = -1;
    return true;
}

/* Takes the range's slot back (unpublish). A hook that still holds it
 * keeps reading it: the slot is free all the same, and wo_sx_stage() reuses it
 * only once no hook does (read_done orders the reuse). */
void wo_sx_take_back(struct srange *r)
{
    int s = r->slot;

    if (s >= 0 && !wo_sx_unpublish(s)) {
        wo_sx->slot_range[s] = -1;
        r->slot = -1;
    }
}

/* A copy wrote the range: it is read in place from now on. */
void wo_sx_mark_written(struct srange *r, uint32_t id)
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
        (void)wo_sx_unpublish(r->slot); /* if a hook holds it, the slot is reclaimed later */
    if (wo_sx->pin_on)
        wo_pin_retire(id);
}

struct srange *wo_sx_span_next(const struct wo_ev_hit *h, uint32_t *it, uint32_t *sid)
{
    /* the hooks' walk (hotpath.h), the spans the executor holds live */
    while (wo_stream_span_next(h, it, sid))
        if (*sid < wo_sx->nr && wo_sx->r[*sid].live && wo_sx->r[*sid].gen == h->gen)
            return &wo_sx->r[*sid];
    return NULL;
}

void wo_sx_drop(uint32_t id)
{
    struct srange *r = &wo_sx->r[id];
    struct wo_stream_entry *e = &wo_stream_tab.e[id];

    __atomic_store_n(&e->streamed, 0, __ATOMIC_RELEASE);
    /* out of the plan too: a range that takes the id is not waited for */
    __atomic_store_n(&e->planned, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&e->nowait, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&e->word, 0, __ATOMIC_SEQ_CST);
    wo_sx_take_back(r);
    if (wo_sx->pin_on)
        wo_pin_retire(id);
    free(r->name);
    memset(r, 0, sizeof(*r));
    r->slot = -1;
    r->ord = NONE;
}

/* A range auto streamed by step time goes back to being read in place
 * (a managed one to the planner, which may make it resident again). Its
 * assignment is taken back at once (unpublish: no hook takes the slot any
 * more); a hook that still holds the slot keeps reading it, and wo_sx_stage()
 * reuses a slot only once no hook does. */
void wo_sx_unselect_range(struct srange *r, uint32_t id)
{
    r->probed = false;
    r->room = false;
    r->streamed = false;
    __atomic_store_n(&wo_stream_tab.e[id].streamed, 0, __ATOMIC_RELEASE);
    wo_sx_take_back(r);
    if (!r->host)
        wo_budget_give(id, r->gen);
}

/* Picks came for a streamed range since it was selected (uvm/picks.h,
 * claims): they move less, so it leaves streaming. Asked where it is staged
 * (wo_sx_stage) and where the executor asks whether anything is streamed
 * (stream.c, any_streamed): a range selected at setup and claimed before it
 * was ever staged would otherwise stay streamed for good, and the slots
 * never go back (test-slots-gate-preload-late: 3 of 109 runs under load
 * before stop 92). True: it left. */
bool wo_sx_unselect_claimed(struct srange *r, uint32_t id)
{
    if (!r->streamed || !wo_picks_claims(r->rid, r->gen, r->lo, r->hi))
        return false;
    add(&wo_stream_tab.n.claim_unselects, 1);
    r->claimed_step = wo_sx->steps + 1; /* not auto's candidate for a while (stream-learn.c) */
    if (r->slot >= 0)
        add(&wo_stream_tab.n.claim_unselects_staged, 1);
    wo_sx_unselect_range(r, id);
    return true;
}

/* Records the slot's read_done on the engine stream that read its last
 * assignment (wo_sx_stage(): why). The per-thread default stream is the calling
 * thread's own, not the engine's: there the hooks' record stands. A stream
 * under capture would take the record (and through it the copy stream)
 * into the engine's graph: false, try later. A stream gone (destroyed, its
 * work done or in flight before the hooks' record) has nothing more to
 * fence. False only for a capture. */
bool wo_sx_fence_owner(struct wo_stream_slot *s)
{
    const struct wo_driver *d = wo_sx->drv;
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

/* The engine destroys stream (its hook, before the real call): every slot
 * whose readers ran there gets its read_done recorded there now, while the
 * stream exists, and forgets the stream, so that no later fence or write
 * check hands the driver a freed stream (llama-server frees its contexts,
 * their streams with them, before its model buffer, whose free gives the
 * slots back: the fence then crashed the real driver at exit). Should the
 * record fail (the stream of another context), the stream's work is
 * waited for instead. Under wo_uvm.lock, as every fence is. */
static void wo_sx_stream_gone(uint64_t stream)
{
    /* the hooks' view only (the executor's own state is the consumer's):
     * the slots' context, published once their events exist, and each
     * slot's owner word; read_done under the lock free_slots destroys it
     * under */
    CUcontext ctx = __atomic_load_n(&wo_stream_tab.ctx, __ATOMIC_ACQUIRE), prev = NULL;
    const struct wo_driver *d = wo_uvm_driver();
    bool in;

    if (!ctx || !d || !d->cuEventRecord || !d->cuStreamSynchronize)
        return;
    pthread_mutex_lock(&wo_uvm.lock);
    in = wo_driver_enter(); /* the engine's own thread: recorded also while a capture runs */
    if (d->cuCtxGetCurrent)
        d->cuCtxGetCurrent(&prev);
    if (prev != ctx && d->cuCtxSetCurrent)
        d->cuCtxSetCurrent(ctx);
    for (unsigned i = 0; i < WO_STREAM_MAX_SLOTS; i++) {
        struct wo_stream_slot *s = &wo_stream_tab.slot[i];
        uint64_t owner = stream + 1;

        if (__atomic_load_n(&s->owner, __ATOMIC_ACQUIRE) != owner)
            continue;
        if (!s->read_done || d->cuEventRecord(s->read_done, (CUstream)(uintptr_t)stream) !=
                                 CUDA_SUCCESS)
            (void)d->cuStreamSynchronize((CUstream)(uintptr_t)stream);
        __atomic_compare_exchange_n(&s->owner, &owner, 0, false, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE);
    }
    if (prev != ctx && d->cuCtxSetCurrent)
        d->cuCtxSetCurrent(prev);
    if (in)
        wo_driver_leave();
    pthread_mutex_unlock(&wo_uvm.lock);
}

void wo_uvm_stream_gone(uint64_t stream)
{
    wo_sx_stream_gone(stream);
    wo_picks_stream_gone(stream);
}

/* The range the engine is at may still have launches to come that read
 * its slot through a table an earlier one wrote (wo_sx_stage()'s fence): its
 * slot is reused (or freed) only once a launch has touched another range.
 * Two views of where the engine is: the hooks' (pos: the last streamed
 * range a launch touched, ahead of the consumer, but still while nothing
 * is streamed) and the consumer's (the last tracked range in the events it
 * has read: launches come in program order, so one on another range means
 * the kernels before it were submitted). A range the engine freed has no
 * launches to come. hooks_too false: the consumer's view only (free_slots:
 * pos stays put once nothing is streamed, no hook moves it). */
bool wo_sx_at_engine(unsigned slot, bool hooks_too)
{
    uint32_t last = wo_sx->slot_last[slot], pos;

    if (last == NONE || last >= wo_sx->nr || !wo_sx->r[last].live)
        return false;
    pos = __atomic_load_n(&wo_stream_tab.pos, __ATOMIC_ACQUIRE);
    if (hooks_too && last + 1 == pos)
        return true;
    if (last != wo_sx->keys.last_seen)
        return false;
    /* the consumer's view lags the hooks': a hook moves pos (and wakes this
     * thread) before its launch reaches the events, so on every move the
     * consumer still sees the range the engine just left. At a departure
     * lag of one the engine's hook says that every kernel reading a weight
     * is submitted before the next weight's first launch: where the last
     * move was off this range, none is to come, as the consumer would see
     * next. Without this, the slot just behind, the one free slot when as
     * many ranges are ahead as there are slots, was never free on a move,
     * and a range could stay unstaged for hundreds of steps
     * (ggml-hook-claims-auto at WOFFLOAD_DEPARTURE_LAG=1). At two, a kernel
     * of the next range may still read it through a table (PyTorch's
     * grouped GEMM): the consumer's view stands. */
    return !(hooks_too && pos && wo_stream_departure_lag() == 1 &&
             last + 1 == __atomic_load_n(&wo_stream_tab.pos_prev, __ATOMIC_RELAXED));
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

bool wo_sx_check_slot(unsigned s)
{
    uint32_t id = wo_sx->slot_chk[s];
    struct wo_stream_slot *sl = &wo_stream_tab.slot[s];
    struct srange *r;
    struct wo_range rg;
    CUresult res;

    if (id == NONE)
        return true;
    r = id < wo_sx->nr ? &wo_sx->r[id] : NULL;
    /* a range no kernel writes (woffload_readonly) has nothing to check */
    if (r && r->live && r->gen == wo_sx->slot_chk_gen[s] && (!r->written || r->kernel_written) &&
        wo_sx->check_on && !wo_readonly(r->rid, r->gen) && wo_registry_get(r->rid, &rg) >= 0 &&
        rg.gen == r->gen) {
        if (!wo_sx_fence_owner(sl))
            return false;
        res = wo_check_slot(s, (CUdeviceptr)sl->dev, r->hi - r->lo, id, check_tag(r),
                            (CUdeviceptr)(r->base + r->lo), sl->copied, sl->read_done, wo_sx->copy);
        if (res != CUDA_SUCCESS) {
            /* what a launch may have written there cannot be known: stop
             * streaming rather than risk it again */
            wo_warn("stream: checking slot %u for writes failed (%s): nothing is streamed from "
                    "now on",
                    s, wo_cu_error_name(res));
            wo_sx->check_on = false;
            wo_sx->slots_failed = true;
        } else {
            r->chk_slot1 = s + 1;
            add(&wo_stream_tab.n.write_checks, 1);
        }
    }
    wo_sx->slot_chk[s] = NONE;
    return true;
}

void wo_sx_unselect_range(struct srange *r, uint32_t id);

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
        wo_sx_unselect_range(r, id); /* a managed one back to the planner */
    wo_sx_mark_written(r, id);
}

/* Takes the results of the write checks that finished (all of them when
 * wait): of range only, or of every range (only NONE). */
void wo_sx_poll_checks(bool wait, uint32_t only)
{
    uint32_t from = only == NONE ? 0 : only, to = only == NONE ? wo_sx->nr : only + 1;

    CUcontext prev;
    bool read = false;

    if (!wo_sx->check_on || !wo_driver_enter())
        return;
    prev = wo_sx_push_ctx();
    if (wait)
        wo_check_sync();
    for (uint32_t id = from; id < to && id < wo_sx->nr; id++) {
        struct srange *r = &wo_sx->r[id];
        if (!r->live || !r->chk_slot1 || !wo_check_done(r->chk_slot1 - 1))
            continue;
        if (!read) {
            wo_check_read(wo_sx->nr);
            read = true;
        }
        r->chk_slot1 = 0;
        if (wo_check_take(id, check_tag(r)))
            kernel_wrote(r, id);
    }
    wo_sx_pop_ctx(prev);
    wo_driver_leave();
}

/* Takes in the blind launches (stream.h) that ended up to ge: the pinned
 * copies may be older than their ranges from the first one on, so they are
 * retired and none is made again (wo_sx_stage() copies from the ranges); one
 * whose fence could not be recorded leaves nothing to order a staging copy
 * after, so nothing is streamed from then on. False: try later (the driver
 * is held by a capture). */
static bool blind(uint32_t ge)
{
    uint64_t unfenced;
    CUcontext prev;

    if (ge == wo_sx->blind_seen)
        return true;
    unfenced = __atomic_load_n(&wo_stream_tab.n.blind_unfenced, __ATOMIC_RELAXED);
    if (unfenced && !wo_sx->slots_failed) {
        wo_warn("stream: a launch that may write weights unseen (an NCCL kernel, a CUDA graph) "
                "could not be fenced: nothing is streamed from now on");
        wo_sx->slots_failed = true;
        for (uint32_t id = 0; id < wo_sx->nr; id++)
            if (wo_sx->r[id].live && wo_sx->r[id].streamed)
                wo_sx_unselect_range(&wo_sx->r[id], id);
    }
    /* the pinned copies may be older than their ranges now: closed for
     * good (stream-pin.h), made or not yet */
    if (!wo_sx->pin_on) {
        wo_pin_close(NULL); /* none made: none ever will be */
    } else if (!wo_sx->blind_seen) {
        if (!wo_driver_enter())
            return false;
        prev = wo_sx_push_ctx();
        wo_pin_close(wo_sx->copy);
        wo_sx_pop_ctx(prev);
        wo_driver_leave();
        wo_info("stream: a launch may write weights through pointers the shim cannot see (an "
                "NCCL kernel, or a CUDA graph that reads them): staged from the ranges from now "
                "on, pinned copies retired (docs/prefetch.md, Blind launches)");
    }
    wo_sx->blind_seen = ge;
    return true;
}

/* Copies range id into slot and publishes the assignment. */
bool wo_sx_stage(uint32_t id, int slot)
{
    const struct wo_driver *d = wo_sx->drv;
    struct srange *r = &wo_sx->r[id];
    struct wo_stream_entry *e = &wo_stream_tab.e[id];
    struct wo_stream_slot *s = &wo_stream_tab.slot[slot];
    uint64_t w = 0, nw;
    uint32_t tb, te, gb, ge;
    bool fresh, blind_fresh, ro, touched, hashed_now = false;
    struct wo_range rg;
    CUcontext prev;
    CUresult res;

    if (r->chk_slot1)
        wo_sx_poll_checks(false, id); /* a launch may have written it: then it is not staged */
    if (!r->streamed)
        return true;
    if (wo_sx_unselect_claimed(r, id))
        return true;
    /* the engine claims it read in place now (woffload_read_in_place): its
     * launches read a small share of it; the slot is free for the next range */
    if (wo_stream_inplace_now(e))
        return true;
    if (wo_sx_at_engine((unsigned)slot, true) || wo_sx->slot_sz[slot] < r->hi - r->lo)
        return false;
    if (!wo_sx_unpublish(slot))
        return false;
    if (__atomic_load_n(&e->word, __ATOMIC_SEQ_CST) == WO_STREAM_DIRTY) {
        wo_sx_mark_written(r, id);
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
    /* a launch that read a read-only range in place wrote nothing: its
     * pinned copy and hash stay good, the copy needs no fence */
    ro = wo_readonly(r->rid, r->gen);
    touched = te != r->touch_seen && !ro;
    fresh = touched || blind_fresh;
    if (!wo_driver_enter())
        return false;
    /* The engine may free the range at any moment (wo_uvm_free, on its
     * thread, under wo_uvm.lock): a copy from freed memory reads unmapped
     * pages. So the copy is issued under that lock, with the range still
     * live; a free after it waits in the driver for the copy (cuMemFree
     * synchronises with the device's work). */
    pthread_mutex_lock(&wo_uvm.lock);
    if (wo_registry_get(r->rid, &rg) < 0 || rg.gen != r->gen) {
        pthread_mutex_unlock(&wo_uvm.lock);
        wo_driver_leave();
        wo_sx_drop(id);
        return true; /* the slot is free: try the next range */
    }
    prev = wo_sx_push_ctx();
    /* after every kernel that read the slot's previous range: read_done, as
     * the hooks recorded it after each redirected launch, is not enough. A
     * launch may turn the slot address it was handed into a table in
     * device memory that a later kernel reads (PyTorch's grouped GEMM:
     * one kernel writes each expert's pointer, the next one, which the
     * shim sees no pointer in, reads through them). That kernel was
     * submitted after the redirected one and, since the engine's host
     * thread has moved on past it, before now: recorded here, on the
     * stream that read the slot, read_done covers it too. No hook holds
     * the slot (unpublished above), so none records it meanwhile.
     * Recorded at the tail, though, it also orders the copy after the
     * kernels the engine submitted last, which read other slots: copies
     * and kernels then take turns on the GPU. So where a hook recorded it
     * when the engine had gone two ranges past this slot's range (its
     * departure fence: uvm/hotpath.h, struct wo_stream_slot) and no launch
     * read the slot since, that record stands. */
    if (wo_stream_departed(s)) { /* never, with WOFFLOAD_DEPARTURE_FENCES=0: no hook records one */
        add(&wo_stream_tab.n.fences_departed, 1);
    } else if (wo_sx_fence_owner(s)) {
        if (__atomic_load_n(&s->owner, __ATOMIC_ACQUIRE))
            add(&wo_stream_tab.n.fences_at_reuse, 1);
    } else {
        wo_sx_pop_ctx(prev);
        pthread_mutex_unlock(&wo_uvm.lock);
        wo_driver_leave();
        return false; /* the reader's stream is being captured: later */
    }
    /* the slot's last contents, and any earlier slot of this range, are
     * checked for writes first (check_slot), the copy stream waiting */
    for (unsigned k = 0; k < wo_sx->nslots; k++)
        if ((k == (unsigned)slot || wo_sx->slot_chk[k] == id) && !wo_sx_check_slot(k)) {
            wo_sx_pop_ctx(prev);
            pthread_mutex_unlock(&wo_uvm.lock);
            wo_driver_leave();
            return false;
        }
    res = wo_sx->check_on || !wo_sx->checks_wanted
              ? d->cuStreamWaitEvent(wo_sx->copy, s->read_done, 0)
              : CUDA_ERROR_NOT_SUPPORTED;
    if (res == CUDA_SUCCESS && touched)
        res = d->cuStreamWaitEvent(wo_sx->copy, wo_stream_tab.fence, 0);
    if (res == CUDA_SUCCESS && blind_fresh)
        res = d->cuStreamWaitEvent(wo_sx->copy, wo_stream_tab.blind_fence, 0);
    if (res == CUDA_SUCCESS) {
        bool managed = (rg.flags & WO_RANGE_MANAGED) != 0, pinned = false;
        /* a check of the range still under way may copy a written slot
         * back into it, and a launch that touched it in place may have
         * written it, not its pinned copy: stage from the range */
        CUdeviceptr src = r->chk_slot1 || fresh ? (CUdeviceptr)(r->base + r->lo)
                                                : wo_sx_source(id, r, managed, &pinned);
        /* copy-engine copies are timed (the copy kernel's take SMs too) */
        int timed = managed && !pinned && wo_sx->copy_fn ? -1 : wo_sx_time_begin();
        res = wo_sx_copy_to_slot((CUdeviceptr)s->dev, src, r->hi - r->lo, managed && !pinned);
        if (res == CUDA_SUCCESS)
            wo_sx_time_end(timed, r->hi - r->lo);
        if (res == CUDA_SUCCESS && pinned)
            add(&wo_stream_tab.n.staged_pinned, 1);
    }
    /* the hash it is checked against, before any launch may read (and
     * write) the slot; after a blind launch, of the range as it is now
     * (what the blind launch wrote is the range's, nothing to copy back:
     * the range stays streamed, as after an RL trainer's weight update).
     * Also when a launch touched it in place since its last staging copy:
     * whether that one or the blind one wrote cannot be told, and either
     * wrote the range itself, so keeping the old hash would only take the
     * range out of streaming; and whether it was kept depended on the
     * executor staging it between the two or not (an engine that replays
     * graphs between eager launches would lose its streamed ranges one by
     * one) */
    if (blind_fresh)
        r->hashed = false;
    if (res == CUDA_SUCCESS && wo_sx->check_on && !r->hashed && !ro) {
        res = wo_check_first(wo_sx->copy, (CUdeviceptr)s->dev, r->hi - r->lo, id);
        r->hashed = hashed_now = res == CUDA_SUCCESS;
    }
    if (res == CUDA_SUCCESS)
        res = d->cuEventRecord(s->copied, wo_sx->copy);
    if (res == CUDA_SUCCESS) {
        wo_sx->slot_chk[slot] = id;
        wo_sx->slot_chk_gen[slot] = r->gen;
    }
    wo_sx_pop_ctx(prev);
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
        wo_sx->slot_chk[slot] = NONE;
        if (hashed_now)
            r->hashed = false; /* that hash may be of the raced copy */
        add(&wo_stream_tab.n.not_published, 1);
        return true;
    }
    r->touch_seen = te;
    r->blind_seen = ge;
    __atomic_store_n(&e->blind, gb, __ATOMIC_RELAXED); /* before the word: hooks read it after */
    __atomic_store_n(&s->owner, 0, __ATOMIC_RELEASE);
    /* a new assignment: a departure fence of the last one no longer counts */
    __atomic_add_fetch(&s->assign, 1, __ATOMIC_SEQ_CST);
    wo_sx->epoch++;
    nw = wo_stream_word(r->gen, wo_sx->epoch, (unsigned)slot);
    if (!__atomic_compare_exchange_n(&e->word, &w, nw, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
        wo_sx_mark_written(r, id); /* a copy wrote it while we staged */
        return true;
    }
    r->slot = slot;
    r->starved = 0;
    wo_sx->slot_range[slot] = (int)id;
    wo_sx->slot_last[slot] = id;
    __atomic_store_n(&e->nowait, 0, __ATOMIC_RELAXED);
    return true;
}

/* How long after a hook moved the engine's position this thread took it
 * up (stats: stream.reaction_*): the copy of the next span waits for it. */
static void reacted(uint32_t pos)
{
    uint64_t at, now, d;

    if (pos == wo_sx->seen_pos)
        return;
    wo_sx->seen_pos = pos;
    at = __atomic_load_n(&wo_stream_tab.pos_ns, __ATOMIC_RELAXED);
    now = wo_now_ns();
    if (!at || now < at)
        return;
    d = now - at;
    add(&wo_stream_tab.n.reactions, 1);
    add(&wo_stream_tab.n.reaction_ns, d);
    if (d > __atomic_load_n(&wo_stream_tab.n.reaction_max_ns, __ATOMIC_RELAXED))
        __atomic_store_n(&wo_stream_tab.n.reaction_max_ns, d, __ATOMIC_RELAXED);
}

/* The slot a range of `want` bytes takes in wo_sx_advance(): a free slot,
 * else one of a range behind, the one just behind last; never the slot of
 * the range the engine is at (at_engine) nor `except`; of those, the
 * smallest the range fits (slots are sized: want_sizes). -1: none. */
static int slot_for(uint64_t want, const uint32_t *ahead, unsigned na, uint32_t behind, int except)
{
    int pick = -1;

    for (int tier = 0; tier < 3 && pick < 0; tier++)
        for (unsigned s = 0; s < wo_sx->nslots; s++) {
            uint32_t held = (uint32_t)wo_sx->slot_range[s];
            bool ok = tier == 0   ? wo_sx->slot_range[s] < 0
                      : tier == 1 ? !in(ahead, na, held) && held != behind
                                  : !in(ahead, na, held);
            if (ok && (int)s != except && wo_sx->slot_sz[s] >= want && !wo_sx_at_engine(s, true) &&
                (pick < 0 || wo_sx->slot_sz[s] < wo_sx->slot_sz[pick]))
                pick = (int)s;
        }
    return pick;
}

/* No slot ahead[k] fits has been free to take since an earlier step, yet
 * one is that a smaller range ahead fits, and that range holds a slot
 * ahead[k] fits: it took it while the smaller slot was busy (slots go as
 * they come free, and sizes differ). The smaller range moves to the free
 * slot (one copy more) and ahead[k] takes its slot; otherwise each can
 * wait for the other for good, and a range is read in place every step (on
 * the fake driver, five ranges of three sizes in four slots, one run in
 * six: no copy in 20 steps). Not within the step that found no slot: a
 * slot comes free as the engine moves on, and a swap at every miss copied
 * each range every step (2.5x the copies). The slot given, or -1. */
static int make_room(unsigned k, const uint32_t *ahead, unsigned na, uint32_t behind)
{
    struct srange *r = &wo_sx->r[ahead[k]];

    if (!r->starved) {
        r->starved = wo_sx->steps + 1;
        return -1;
    }
    if (wo_sx->steps + 1 <= r->starved)
        return -1;
    for (unsigned q = 0; q < na; q++) {
        struct srange *o = &wo_sx->r[ahead[q]];
        int b = o->slot, c;

        if (q == k || b < 0 || wo_sx->slot_sz[b] < r->hi - r->lo ||
            wo_sx_at_engine((unsigned)b, true))
            continue;
        c = slot_for(o->hi - o->lo, ahead, na, behind, b);
        if (c < 0)
            continue;
        wo_sx_take_back(o);
        if (o->slot >= 0 || !wo_sx_stage(ahead[q], c))
            return -1;
        add(&wo_stream_tab.n.slot_swaps, 1);
        return wo_sx->slot_range[b] < 0 ? b : -1;
    }
    return -1;
}

void wo_sx_advance(void)
{
    uint32_t pos = __atomic_load_n(&wo_stream_tab.pos, __ATOMIC_ACQUIRE), idx;
    uint32_t ahead[WO_STREAM_MAX_SLOTS], behind = NONE;
    /* the range the engine is at and the ones after it to keep staged:
     * with departure fences a lag of 2 keeps one slot for the range just
     * behind the engine (its fence comes at the next move), a lag of 1
     * none (its fence came with the move here) */
    unsigned na = 0, want = wo_sx->nslots - 1;
    bool made;

    reacted(pos);
    if (!wo_sx->norder || pos == 0 || pos - 1 >= wo_sx->nr)
        return;
    idx = wo_sx->r[pos - 1].ord;
    if (idx == NONE)
        return;
    /* the furthest point of this step; far back means the next step began */
    if (wo_sx->maxi == NONE || idx > wo_sx->maxi || idx + wo_sx->norder / 2 < wo_sx->maxi)
        wo_sx->maxi = idx;
    if (wo_stream_departure_lag() == 1)
        want = wo_sx->nslots;
    for (uint32_t k = 0; k < wo_sx->norder && na < want; k++) {
        uint32_t id = wo_sx->order[(wo_sx->maxi + k) % wo_sx->norder];
        if (wo_sx->r[id].live && wo_sx->r[id].streamed && !in(ahead, na, id))
            ahead[na++] = id;
    }
    for (uint32_t k = 1; k < wo_sx->norder; k++) {
        uint32_t id = wo_sx->order[(wo_sx->maxi + wo_sx->norder - k) % wo_sx->norder];
        if (wo_sx->r[id].live && wo_sx->r[id].streamed) {
            behind = in(ahead, na, id) ? NONE : id;
            break;
        }
    }
    made = !wo_sx->slots_ready;
    if (!na || !wo_sx_slots())
        return;
    /* made sized for the ranges streamed (want_sizes): the planner gets
     * what the estimate it was given (every slot the largest) overstated */
    if (made && wo_sx_slots_bytes() < (uint64_t)wo_sx->nslots * wo_sx->slot_size)
        slots_shrank();
    for (unsigned k = 0; k < na; k++) {
        struct srange *r = &wo_sx->r[ahead[k]];
        int pick = -1;

        /* a launch that touched it in place took its assignment back
         * (wo_stream_touch_begin), or a blind launch began since it was
         * published (hooks no longer take it): staged again, from the
         * range */
        if (r->slot >= 0 && r->streamed &&
            (__atomic_load_n(&wo_stream_tab.e[ahead[k]].word, __ATOMIC_SEQ_CST) == 0 ||
             wo_stream_blind_since(&wo_stream_tab.e[ahead[k]])))
            wo_sx_take_back(r);
        if (r->slot >= 0 || !r->streamed)
            continue;
        pick = slot_for(r->hi - r->lo, ahead, na, behind, -1);
        if (pick < 0)
            pick = make_room(k, ahead, na, behind);
        if (pick < 0 || !wo_sx_stage(ahead[k], pick))
            break;
    }
    wo_sx_resize(ahead, na);
}

/* ---- the slots' sizes and their reuse (the slots themselves: stream-slots.c) ---- */

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
                wo_sx_size_str(wo_sx->want_sz[s], a), wo_cu_error_name(res), wo_sx_size_str(want, b),
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
        if (!wo_sx_size_for(id, sz))
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
        wo_sx_say_slots(" resized");
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
