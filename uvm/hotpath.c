/* uvm/hotpath.c: the streaming executor's table as the hooks use it
 * (hotpath.h: the two sides). Any thread, lock-free: a copy hook drops the
 * assignments of the ranges it writes (wo_stream_note_write), a launch hook
 * waits, bounded, for a planned range's copy to be issued
 * (wo_stream_await), and anyone reads the counters. The executor's side,
 * which fills the table on the consumer thread, is stream.c. */
#include <errno.h>
#include <sched.h>
#include <stdint.h>

#include "core/event.h"
#include "core/macro.h"
#include "core/registry.h"
#include "core/settings.h"
#include "uvm/internal.h"
#include "uvm/hotpath.h"

struct wo_stream_shared wo_stream_tab;
uint32_t wo_readonly_gen[WO_STREAM_IDS];
/* picked staging's tables (hotpath.h), kept by uvm/picks.c */
uint8_t wo_picks_ids[WO_STREAM_IDS];
uint32_t wo_picks_hot_epoch;
int wo_picks_any;
uint64_t wo_picks_const_words;
uint64_t wo_stream_await_ns = WO_STREAM_AWAIT_NS;
#define AWAIT_SPIN 256u /* polls before the wait yields the CPU each time round */

static void add(uint64_t *c, uint64_t n)
{
    __atomic_add_fetch(c, n, __ATOMIC_RELAXED);
}

static void (*note_write_also)(uint64_t dst, uint64_t bytes);

void wo_stream_note_write_install(void (*fn)(uint64_t dst, uint64_t bytes))
{
    __atomic_store_n(&note_write_also, fn, __ATOMIC_RELEASE);
}

void wo_stream_note_write(uint64_t dst, uint64_t bytes)
{
    uint64_t ends[2] = {dst, bytes ? dst + bytes - 1 : dst};
    void (*also)(uint64_t, uint64_t) = __atomic_load_n(&note_write_also, __ATOMIC_ACQUIRE);

    if (also)
        also(dst, bytes);
    if (!__atomic_load_n(&wo_stream_tab.active, __ATOMIC_ACQUIRE))
        return;
    for (int i = 0; i < 2; i++) {
        struct wo_stream_entry *e;
        struct wo_ev_hit w;
        struct wo_hit h;
        uint32_t it = 0, sid;
        int ok;

        wo_registry_read_begin();
        ok = wo_registry_lookup(ends[i], &h);
        wo_registry_read_end();
        if (!ok || h.id >= WO_STREAM_IDS)
            continue;
        /* the part of the write in this allocation, as offsets: from the
         * first end on, or up to the last */
        w = (struct wo_ev_hit){h.id, h.gen, h.offset, h.offset + (bytes ? bytes : 1)};
        if (i == 1)
            w = (struct wo_ev_hit){h.id, h.gen, h.offset + 1 > bytes ? h.offset + 1 - bytes : 0,
                                   h.offset + 1};
        /* its one span (whatever part the write reaches), or each sub-span
         * the write overlaps */
        while ((e = wo_stream_span_next(&w, &it, &sid))) {
            uint64_t old;

            /* every range the executor knows, streamed or not yet: a range
             * selected while this write is under way is never published */
            if (__atomic_load_n(&e->gen, __ATOMIC_RELAXED) != h.gen ||
                __atomic_load_n(&e->base, __ATOMIC_RELAXED) == 0)
                continue;
            /* sticky: the executor publishes with a CAS from 0, never over it */
            old = __atomic_exchange_n(&e->word, WO_STREAM_DIRTY, __ATOMIC_SEQ_CST);
            if (old != WO_STREAM_DIRTY && old != 0)
                add(&wo_stream_tab.n.invalidated, 1);
        }
    }
}

unsigned wo_stream_touch_begin(const struct wo_ev_hit *hits, unsigned nhits, const uint64_t *from,
                               const uint64_t *to, unsigned nred, uint32_t *ids)
{
    unsigned n = 0;

    if (!__atomic_load_n(&wo_stream_tab.active, __ATOMIC_ACQUIRE))
        return 0;
    for (unsigned i = 0; i < nhits && i < WO_EV_MAX_HITS; i++) {
        const struct wo_ev_hit *h = &hits[i];
        struct wo_stream_entry *e;
        uint32_t it = 0, sid;

        while ((e = wo_stream_span_next(h, &it, &sid))) {
            uint64_t w, at;
            bool moved = false, dup = false;

            if (!wo_stream_hit_in_span(e, h, true))
                continue;
            /* the span's first byte the hit reads */
            at = __atomic_load_n(&e->base, __ATOMIC_RELAXED) +
                 WO_MAX(h->offset, __atomic_load_n(&e->lo, __ATOMIC_RELAXED));
            for (unsigned k = 0; k < nred; k++)
                moved |= at >= from[k] && at < to[k];
            for (unsigned k = 0; k < n; k++)
                dup |= ids[k] == sid;
            if (moved || dup)
                continue;
            /* launches after this one read the range, not an older slot; a
             * hook that pinned the slot before keeps reading it (the
             * executor reuses a slot only once no hook does) */
            w = __atomic_load_n(&e->word, __ATOMIC_SEQ_CST);
            if (w != 0 && w != WO_STREAM_DIRTY &&
                __atomic_compare_exchange_n(&e->word, &w, 0, false, __ATOMIC_SEQ_CST,
                                            __ATOMIC_SEQ_CST))
                add(&wo_stream_tab.n.unpublished_inplace, 1);
            if (n == WO_STREAM_TOUCH_MAX) {
                /* no room to count the touch: the span is treated as a
                 * copy wrote it (sticky: never published again) */
                __atomic_store_n(&e->word, WO_STREAM_DIRTY, __ATOMIC_SEQ_CST);
                add(&wo_stream_tab.n.touch_overflow, 1);
                continue;
            }
            ids[n++] = sid;
            __atomic_add_fetch(&e->touch_begin, 1, __ATOMIC_SEQ_CST);
        }
    }
    if (n)
        add(&wo_stream_tab.n.touched_inplace, 1);
    return n;
}

void wo_stream_touch_end(const uint32_t *ids, unsigned n, uint64_t stream,
                         const struct wo_stream_evfns *fn)
{
    CUevent fence = wo_stream_fence(&wo_stream_tab.fence, fn->create, fn->destroy);

    /* the fence first: an executor that sees the end waits for it, and it
     * is recorded after this launch */
    if (!fence || !fn->record || fn->record(fence, (CUstream)(uintptr_t)stream) != CUDA_SUCCESS)
        add(&wo_stream_tab.n.fence_failed, 1);
    for (unsigned i = 0; i < n; i++)
        __atomic_add_fetch(&wo_stream_tab.e[ids[i]].touch_end, 1, __ATOMIC_SEQ_CST);
}

bool wo_stream_blind_begin(void)
{
    if (!__atomic_load_n(&wo_stream_tab.active, __ATOMIC_ACQUIRE))
        return false;
    __atomic_add_fetch(&wo_stream_tab.blind_begin, 1, __ATOMIC_SEQ_CST);
    add(&wo_stream_tab.n.blind_launches, 1);
    return true;
}

CUevent wo_stream_fence(CUevent *at, CUresult (*create)(CUevent *, unsigned),
                        CUresult (*destroy)(CUevent))
{
    CUevent f = __atomic_load_n(at, __ATOMIC_ACQUIRE), mine = NULL;

    if (f || !create || create(&mine, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS || !mine)
        return f;
    /* made once, by the executor's slots or the first launch that needs
     * it; kept until exit (hooks may hold it) */
    if (__atomic_compare_exchange_n(at, &f, mine, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return mine;
    if (destroy)
        destroy(mine);
    return f;
}

void wo_stream_blind_end(uint64_t stream, const struct wo_stream_evfns *fn)
{
    CUevent fence = wo_stream_fence(&wo_stream_tab.blind_fence, fn->create, fn->destroy);
    /* the fence first: an executor that sees the end waits for it */
    if (!fence || !fn->record || fn->record(fence, (CUstream)(uintptr_t)stream) != CUDA_SUCCESS)
        add(&wo_stream_tab.n.blind_unfenced, 1);
    __atomic_add_fetch(&wo_stream_tab.blind_end, 1, __ATOMIC_SEQ_CST);
}

/* read_done of the slot span sid is published in, recorded on stream now
 * (the engine is two ranges past it), and the slot's `left` set, unless
 * the slot changed hands meanwhile (uvm/hotpath.h, struct wo_stream_slot).
 * The slot is held (inflight) across the record, as a launch's pin holds
 * it: the executor neither reuses it nor destroys its events meanwhile,
 * and records read_done itself only once no hook holds the slot. */
static void depart(uint32_t sid, uint64_t stream, const struct wo_stream_evfns *fn)
{
    struct wo_stream_entry *e = &wo_stream_tab.e[sid];
    uint64_t w = __atomic_load_n(&e->word, __ATOMIC_ACQUIRE);
    unsigned slot = wo_stream_word_slot(w);
    struct wo_stream_slot *s;
    uint32_t a, p;

    if (w == 0 || w == WO_STREAM_DIRTY || slot >= WO_STREAM_MAX_SLOTS)
        return;
    s = &wo_stream_tab.slot[slot];
    __atomic_add_fetch(&s->inflight, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&e->word, __ATOMIC_SEQ_CST) != w ||
        __atomic_load_n(&s->owner, __ATOMIC_ACQUIRE) != stream + 1 || !s->read_done)
        goto out;
    a = __atomic_load_n(&s->assign, __ATOMIC_SEQ_CST);
    p = __atomic_load_n(&s->pins, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&s->left, __ATOMIC_ACQUIRE) == wo_stream_left(a, p))
        goto out; /* this assignment's fence is there, and no launch read it since */
    if (fn->record(s->read_done, (CUstream)(uintptr_t)stream) != CUDA_SUCCESS)
        goto out;
    /* the executor unpublishes before it waits for the slot: a word that
     * moved means the record may not be of the assignment counted */
    if (__atomic_load_n(&e->word, __ATOMIC_SEQ_CST) == w)
        __atomic_store_n(&s->left, wo_stream_left(a, p), __ATOMIC_SEQ_CST);
out:
    __atomic_sub_fetch(&s->inflight, 1, __ATOMIC_RELEASE);
}

void wo_stream_publish_pos(uint32_t sid, uint64_t stream, bool captured,
                           void (*evfns)(struct wo_stream_evfns *fn))
{
    uint32_t cur = __atomic_load_n(&wo_stream_tab.pos, __ATOMIC_RELAXED), left2, gone;
    unsigned lag;

    if (cur == sid + 1)
        return;
    left2 = __atomic_load_n(&wo_stream_tab.pos_prev, __ATOMIC_RELAXED);
    __atomic_store_n(&wo_stream_tab.pos_prev, cur, __ATOMIC_RELAXED);
    /* the range departed: the one the engine left two moves ago, or with
     * WOFFLOAD_DEPARTURE_LAG=1 the one it leaves now. Before this launch:
     * the record covers what the engine submitted up to that range's last
     * launch, not the launches of this one (a launch that reads it too
     * pinned its slot, and the record after it supersedes this one); and
     * before the executor hears of the move, which is when it reuses that
     * slot */
    lag = captured || !evfns ? 0 : wo_stream_departure_lag();
    gone = lag == 1 ? cur : lag == 2 && left2 != cur ? left2 : 0;
    if (gone && gone != sid + 1 && gone - 1 < WO_STREAM_ENTRIES) {
        struct wo_stream_evfns fn = {0};

        evfns(&fn);
        if (fn.record)
            depart(gone - 1, stream, &fn);
    }
    /* the time first: the executor reads pos, then pos_ns (a time from a
     * moment before its move can only make a reaction look longer) */
    __atomic_store_n(&wo_stream_tab.pos_ns, wo_now_ns(), __ATOMIC_RELAXED);
    __atomic_store_n(&wo_stream_tab.pos, sid + 1, __ATOMIC_RELEASE);
    add(&wo_stream_tab.n.pos_wakes, 1);
    wo_consumer_wake();
}

/* the engine's word (woffload_departure_lag): 0 none, else 1 or 2 */
static unsigned engine_lag;
/* WOFFLOAD_DEPARTURE_LAG given: -1 not yet looked at, 0 no, 1 yes (the
 * settings are fixed once read: looked at once, not at each move) */
static int lag_given = -1;

void wo_stream_engine_lag(unsigned ranges)
{
    __atomic_store_n(&engine_lag, ranges, __ATOMIC_RELAXED);
}

unsigned wo_stream_departure_lag(void)
{
    const struct wo_settings *st = wo_settings();
    int given = __atomic_load_n(&lag_given, __ATOMIC_RELAXED);
    unsigned said;

    if (!st->departure_fences)
        return 0;
    if (given < 0) {
        given = wo_settings_given(st, "WOFFLOAD_DEPARTURE_LAG");
        __atomic_store_n(&lag_given, given, __ATOMIC_RELAXED);
    }
    if (given)
        return st->departure_lag == 1 ? 1 : 2;
    said = __atomic_load_n(&engine_lag, __ATOMIC_RELAXED);
    return said == 1 ? 1 : 2;
}

bool wo_stream_await(struct wo_stream_entry *e, uint32_t gen)
{
    uint64_t t0, now;
    bool woke = false;

    /* a range claimed in place is not staged: nothing to wait for */
    if (!__atomic_load_n(&e->planned, __ATOMIC_RELAXED) ||
        __atomic_load_n(&e->nowait, __ATOMIC_RELAXED) || wo_stream_inplace_now(e))
        return false;
    t0 = wo_now_ns();
    for (unsigned i = 0;; i++) {
        uint64_t w = __atomic_load_n(&e->word, __ATOMIC_ACQUIRE);

        if (w != 0 || !__atomic_load_n(&e->streamed, __ATOMIC_RELAXED) ||
            __atomic_load_n(&e->gen, __ATOMIC_RELAXED) != gen)
            break;
        if (!woke) {
            /* the consumer may sleep (up to 2 ms) between batches of events */
            wo_consumer_wake();
            woke = true;
        }
        if (i % 16 == 15 && (now = wo_now_ns()) - t0 >= wo_stream_await_ns) {
            /* the executor is not coming for it (a range it passed, a slot a
             * hook holds): do not make the next launches wait as well */
            __atomic_store_n(&e->nowait, 1, __ATOMIC_RELAXED);
            add(&wo_stream_tab.n.await_timeouts, 1);
            add(&wo_stream_tab.n.await_ns, now - t0);
            return false;
        }
        /* a short spin, then the CPU given up each time round: the thread
         * waited for may need this CPU (an engine with more threads than
         * cores, all waiting here, would keep the consumer they wait for
         * off the CPUs; a suspect, not shown, in a CI flood that lost
         * launches: tests/reliability/flood.yaml) */
        if (i < AWAIT_SPIN)
            wo_cpu_relax();
        else
            (void)sched_yield();
    }
    now = wo_now_ns();
    add(&wo_stream_tab.n.awaited, 1);
    add(&wo_stream_tab.n.await_ns, now - t0);
    return __atomic_load_n(&e->word, __ATOMIC_ACQUIRE) != 0;
}

_Static_assert(sizeof(wo_stream_tab) % sizeof(uint64_t) == 0, "the table is whole words");

void wo_stream_table_clear(void)
{
    uint64_t *w = (uint64_t *)(void *)&wo_stream_tab;

    for (size_t i = 0; i < sizeof(wo_stream_tab) / sizeof(uint64_t); i++)
        __atomic_store_n(&w[i], 0, __ATOMIC_RELAXED);
}

void wo_stream_counts(struct wo_stream_counts *ret)
{
    wo_load_words(ret, &wo_stream_tab.n, sizeof(*ret));
}

int wo_stream_claim_in_place(uint64_t p, uint64_t bytes, bool on)
{
    struct wo_range rg;
    struct wo_ev_hit h;
    struct wo_stream_entry *e;
    uint32_t it = 0, sid;
    int n = 0;

    if (wo_registry_find(p, &rg) < 0)
        return -ENOENT;
    if (!bytes || bytes > rg.size - (p - rg.base))
        return -ERANGE;
    if (rg.id >= WO_STREAM_IDS)
        return 0; /* past the table: never streamed */
    h = (struct wo_ev_hit){rg.id, rg.gen, p - rg.base, p - rg.base + bytes};
    while ((e = wo_stream_span_next(&h, &it, &sid))) {
        uint32_t v;

        if (!wo_stream_hit_in_span(e, &h, false))
            continue;
        if (on) {
            __atomic_or_fetch(&e->inplace, WO_STREAM_INPLACE_EVER, __ATOMIC_RELAXED);
            __atomic_add_fetch(&e->inplace, 1, __ATOMIC_ACQ_REL);
        } else {
            /* never below none: a span made between a claim and its end
             * (new_span clears the count) was never claimed */
            v = __atomic_load_n(&e->inplace, __ATOMIC_ACQUIRE);
            while ((v & ~WO_STREAM_INPLACE_EVER) &&
                   !__atomic_compare_exchange_n(&e->inplace, &v, v - 1, false, __ATOMIC_ACQ_REL,
                                                __ATOMIC_ACQUIRE))
                ;
        }
        n++;
    }
    if (on && n)
        add(&wo_stream_tab.n.inplace_claims, 1);
    /* the step that reads it whole comes next: the executor (asleep up to
     * 2 ms between batches of events) may stage its first ranges now,
     * before its launches reach them */
    if (!on && n)
        wo_consumer_wake();
    return n;
}
