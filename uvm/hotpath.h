/* uvm/hotpath.h: the streaming table, the launch path's hot-path header
 * (issue 39). The one uvm/ header besides uvm/uvm.h that preload/ may include
 * (tests/test-structure.py checks it): what the hooks need to redirect a
 * launch lock-free, and nothing of the executor that fills it.
 *
 * A range placed `host` or `managed` that a step reads more than once is
 * copied, once a step, into a device staging slot (uvm/stream.h: the
 * executor). Two sides share the table below:
 *  - the executor (uvm/stream.c, consumer thread) owns the slots, the copy
 *    stream and the events, stages ranges ahead of the engine and publishes
 *    each assignment (range -> slot) here;
 *  - the hooks (preload/, any engine thread): read an assignment lock-free,
 *    pin the slot (in-flight counter, re-checked like a seqlock), order the
 *    launch after the slot's copy (cuStreamWaitEvent on `copied`), launch
 *    with the rewritten arguments, and record `read_done` on the launch's
 *    stream. A copy hook that writes into a range drops its assignment at
 *    once (wo_stream_note_write), before the write is forwarded.
 * Defined in uvm/hotpath.c. */
#pragma once

#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/event.h"

/* Registry ids that can be streamed (ids are dense slot indices; a range
 * with a larger id is read in place and counted). */
#define WO_STREAM_IDS 16384u
#define WO_STREAM_MAX_SLOTS 8u /* policy prefetch.slots: 2..8 */
/* Spans beyond one per allocation: an allocation with tensors placed on the
 * device between its off-device tags (llama.cpp's one model buffer: each
 * layer's host experts between its attention tensors) gets a span per host
 * tag, each an entry of its own at WO_STREAM_IDS + k (never reused: handed
 * out in order while the process lives; once all are used, such tags are
 * read in place). Entries are indexed by span id (sid): a sid below
 * WO_STREAM_IDS is the registry id of the allocation's one span.
 * A hit finds its sub-span in O(1): each split allocation has an index of
 * its granules (2 MiB or more, at most WO_STREAM_INDEX_MAX of them) giving
 * the first sub-span that ends past the granule's start; the hook goes on
 * from there along the sub-spans' links (offset order), past the few that
 * share the granule. Index entries come from one pool of
 * WO_STREAM_GRANULES, handed out in order like the sub-spans. */
#define WO_STREAM_SUBS 4096u
#define WO_STREAM_ENTRIES (WO_STREAM_IDS + WO_STREAM_SUBS)
#define WO_STREAM_GRANULES 65536u
#define WO_STREAM_INDEX_MAX 8192u
#define WO_STREAM_GRANULE_SHIFT 21u

/* One registry range as the hooks see it. `word` is the assignment:
 * 0 none, else gen << 32 | epoch << 8 | (slot + 1); base/lo/hi/dev change
 * only while word is 0, and every publication has a new epoch, so a hook
 * that reads word, then the fields, then word again after pinning the slot,
 * saw a consistent assignment when both reads agree. */
struct wo_stream_entry {
    uint64_t word;
    uint64_t base;     /* range base address */
    uint64_t lo, hi;   /* the staged bytes: [base+lo, base+hi) */
    uint32_t gen;      /* the generation `streamed` refers to */
    uint32_t streamed; /* the executor streams this range (no slot published may still be) */
    uint32_t planned;  /* it has a place in the learned order: the executor stages it when
                        * the engine nears it, so a hook may wait for that (wo_stream_await) */
    uint32_t nowait;   /* a hook's wait for it ran out: no hook waits again until the
                        * executor next publishes it */
    uint32_t touch_begin, touch_end; /* launches that touched it in place, begun and ended
                                      * (wo_stream_touch_begin) */
    uint32_t blind; /* wo_stream_tab.blind_begin when the assignment was published: a hook
                     * redirects to it only while no blind launch began since */
    uint32_t next;  /* a sub-span: sid + 1 of its allocation's next one (higher offsets), 0 */
    uint32_t inplace; /* claims to read it in place held now (woffload_read_in_place), with
                       * WO_STREAM_INPLACE_EVER once it had one: not staged while any is held */
};

#define WO_STREAM_INPLACE_EVER 0x80000000u

/* Whether an engine claims the span read in place now (its launches read a
 * small share of it by index: a whole copy would move more than they read). */
static inline bool wo_stream_inplace_now(const struct wo_stream_entry *e)
{
    return (__atomic_load_n(&e->inplace, __ATOMIC_ACQUIRE) & ~WO_STREAM_INPLACE_EVER) != 0;
}

/* A split allocation's granule index (n 0: not split): entries
 * [at, at + n) of wo_stream_tab.gidx, granule g = offsets [g << shift,
 * (g + 1) << shift). n is published last (release), and cleared first. */
struct wo_stream_split {
    uint32_t at, n, shift;
};

struct wo_stream_slot {
    uint64_t dev;      /* device address of the slot (cuMemAlloc), fixed once allocated */
    int inflight;      /* hooks between pinning the slot and recording read_done */
    uint64_t owner;    /* engine stream + 1 that reads it since it was published; 0 none */
    CUevent copied;    /* recorded on the copy stream after the staging copy */
    CUevent read_done; /* recorded on the owner stream after each redirected launch */
    /* The departure fence (wo_stream_publish_pos): assignments published
     * here (the executor's count, before each word), launches that pinned
     * it, and wo_stream_left(assign, pins) once a hook recorded read_done
     * on the owner stream after the engine had gone two ranges past this
     * one (one with WOFFLOAD_DEPARTURE_LAG=1): every kernel that could read
     * the slot (through a table another kernel wrote, too) was submitted by
     * then, so the executor may reuse the slot without recording read_done
     * at the stream's tail, which would make the copy wait for the kernels
     * the engine submitted last */
    uint32_t assign, pins;
    uint64_t left;
};

static inline uint64_t wo_stream_left(uint32_t assign, uint32_t pins)
{
    return (uint64_t)assign << 32 | pins;
}

/* The slot's read_done is its departure fence: a hook recorded it after the
 * engine had gone two ranges (or one: WOFFLOAD_DEPARTURE_LAG) past the
 * slot's range, for the assignment in it now, and no launch pinned the slot
 * since. (The executor asks after
 * unpublishing the slot: no hook holds it then.) */
static inline bool wo_stream_departed(struct wo_stream_slot *s)
{
    uint32_t a = __atomic_load_n(&s->assign, __ATOMIC_SEQ_CST);
    uint32_t p = __atomic_load_n(&s->pins, __ATOMIC_SEQ_CST);

    return __atomic_load_n(&s->owner, __ATOMIC_ACQUIRE) != 0 &&
           __atomic_load_n(&s->left, __ATOMIC_SEQ_CST) == wo_stream_left(a, p);
}

/* What the hooks count (atomics; the executor's totals are in the same
 * struct so the stats read one place). */
struct wo_stream_counts {
    uint64_t redirected;       /* launches whose arguments pointed at a slot */
    uint64_t inplace_no_slot;  /* a streamed range with no slot ready (or moved under the hook) */
    uint64_t awaited;          /* launches that waited for their range's copy to be issued */
    uint64_t await_ns;         /* ... the host time they waited, in all */
    uint64_t await_timeouts;   /* waits that ran out (then read in place, in inplace_no_slot) */
    uint64_t inplace_captured; /* a launch into a capture: graphs read in place */
    uint64_t inplace_other;    /* another stream owns the slot this step, another context,
                                * too many parameters, a failed wait */
    uint64_t invalidated;      /* assignments dropped by a copy writing the range */
    uint64_t staged, staged_bytes; /* staging copies issued */
    uint64_t staged_by_kernel;     /* ... of them by the copy kernel (managed sources) */
    uint64_t staged_pinned;        /* ... of them from a pinned copy of a managed range
                                    * (stream-pin.h), by the copy engine */
    uint64_t slot_waits;           /* a slot still pinned by a hook when the executor wanted it */
    uint64_t steps;                /* steps the executor found */
    uint64_t auto_tries;   /* auto: host ranges tried streamed by step time (stream-auto.h) */
    uint64_t auto_kept;    /* ... and kept so: the step was faster */
    uint64_t auto_backs;   /* ... and put back in place: it was not (or a recheck found so) */
    uint64_t auto_rechecks; /* decisions streaming managed ranges taken again in place */
    uint64_t auto_deferred; /* backoffs that held a try back (stream-auto.h) */
    uint64_t slot_bytes;   /* device bytes the slots hold now (0 once no range is streamed) */
    uint64_t slot_resizes; /* slots given another size for the ranges streamed (want_sizes) */
    uint64_t slot_makes;   /* times the slots were made (wo_sx_slots) ... */
    uint64_t slot_frees;   /* ... and given back, nothing streamed (free_slots) */
    uint64_t not_reader;   /* launches left alone: their function reached one off-device range
                            * only (stale words, not reads: preload/launch.c) */
    uint64_t write_checks; /* slots hashed before reuse for writes by launches (stream-check.h) */
    uint64_t written_back; /* ... that a launch had written: copied back into their range */
    uint64_t touched_inplace;     /* launches that touched streamed ranges in place */
    uint64_t unpublished_inplace; /* ... and took a published assignment back */
    uint64_t fence_failed;        /* ... whose fence could not be recorded */
    uint64_t not_published;       /* staging copies a touch in place overlapped: dropped */
    uint64_t blind_launches; /* launches that may write any range unseen (wo_stream_blind_begin) */
    uint64_t blind_unfenced; /* ... whose fence could not be recorded (the executor then
                              * synchronises the context before it stages again) */
    uint64_t checked;        /* WOFFLOAD_STREAM_CHECK: slots compared after a redirected launch */
    uint64_t check_mismatch; /* ... that differed from their host copy */
    uint64_t touch_overflow; /* spans a launch touched in place past WO_STREAM_TOUCH_MAX */
    uint64_t sub_spans;      /* sub-spans made (spans beyond one in an allocation) */
    /* steps that staged (one step between two boundaries, the launches'
     * host times): their count, their periods and the bytes they staged,
     * in all: the copy rate a streamed step reaches, against the link's */
    uint64_t staging_steps, staging_step_ns, staging_step_bytes;
    /* a hook moved the engine's position and woke the executor's thread
     * (which sleeps up to 2 ms between batches of events); the executor
     * took the new position up this long after (in all, and the longest) */
    uint64_t pos_wakes, reactions, reaction_ns, reaction_max_ns;
    /* slots reused after a departure fence (wo_stream_slot.left), and
     * reused with read_done recorded at the owner stream's tail instead */
    uint64_t fences_departed, fences_at_reuse;
    /* a range moved to another slot so that a larger one could take its
     * own (stream-stage.c, make_room) */
    uint64_t slot_swaps;
    /* copy-engine staging copies timed between two events on the copy
     * stream: their count, bytes and the time the copy engine spent on
     * them (stream-slots.c, wo_sx_time_*): the rate while it copied,
     * against staging_gbs, the rate over the steps */
    uint64_t copies_timed, copies_timed_bytes, copies_busy_ns;
    /* woffload_read_in_place: claims that found streamed spans, and the
     * launches that read such a span in place while claimed, no slot ready */
    uint64_t inplace_claims, inplace_claimed;
    /* streamed ranges taken out of streaming because the router's picks
     * claimed them (wo_sx_unselect_claimed), and of those, ones whose slot
     * held their staged copy (dropped: staged again if selected again).
     * A layer whose computes go in and out of the ggml hook's band (picks
     * registered for one compute, not the next) may be taken out each time */
    uint64_t claim_unselects, claim_unselects_staged;
};

struct wo_stream_shared {
    int active;          /* 1 once an assignment may exist: the hooks look only then */
    int readers;         /* 1 once launches reached two or more off-device ranges: a launch
                          * then counts only when its function has reached two (launch.c) */
    uint32_t pos;        /* registry id + 1 of the last streamed range a launch touched */
    uint32_t pos_prev;   /* ... the one before it (the range the engine left last) */
    uint64_t pos_ns;     /* when a hook last moved pos (wo_stream_publish_pos) */
    CUcontext ctx;       /* the context slots and events live in (the engine's primary) */
    CUevent fence;       /* recorded after each launch that touched a streamed range in place
                          * (wo_stream_touch_end); made with the first slots, kept until exit */
    CUevent blind_fence; /* recorded after each blind launch (wo_stream_blind_end); the same */
    uint32_t blind_begin, blind_end; /* blind launches begun and ended */
    struct wo_stream_counts n;
    struct wo_stream_slot slot[WO_STREAM_MAX_SLOTS];
    /* by registry id: the allocation's granule index when it is split
     * (the executor clears e[id] before: a hook then finds no span, never
     * a stale one) */
    struct wo_stream_split split[WO_STREAM_IDS];
    /* the index entries: sid + 1 of the first sub-span ending past the
     * granule's start, 0 none */
    uint32_t gidx[WO_STREAM_GRANULES];
    struct wo_stream_entry e[WO_STREAM_ENTRIES];
};

extern struct wo_stream_shared wo_stream_tab;

/* An entry word no assignment can be: a copy wrote the range; sticky (the
 * executor publishes with a CAS from 0, never over it). */
#define WO_STREAM_DIRTY UINT64_C(0xff)

static inline uint64_t wo_stream_word(uint32_t gen, uint32_t epoch, unsigned slot)
{
    return (uint64_t)gen << 32 | (uint64_t)(epoch & 0xffffffu) << 8 | (uint64_t)(slot + 1);
}

static inline unsigned wo_stream_word_slot(uint64_t w)
{
    return (unsigned)(w & 0xff) - 1;
}

static inline uint32_t wo_stream_word_gen(uint64_t w)
{
    return (uint32_t)(w >> 32);
}

/* A copy hook is about to write [dst, dst+bytes): every assignment of a
 * range it overlaps is dropped now (the next launches read the host copy,
 * which the write makes current) and the executor learns the range was
 * written. Lock-free; the registry read section must not be held. */
void wo_stream_note_write(uint64_t dst, uint64_t bytes);
/* Who else hears of such writes, before the streaming executor: picked
 * staging installs its wo_picks_note_write with its first tensor (nothing
 * to hear before). */
void wo_stream_note_write_install(void (*fn)(uint64_t dst, uint64_t bytes));

/* A launch touches streamed ranges in place (not redirected: its function
 * is no reader, no slot was ready, another stream owns the slot): it may
 * write them. Before the launch, wo_stream_touch_begin lists them in ids
 * (hits not among the nred redirected spans [from, to)), counts a touch
 * begun on each, and takes back each published assignment (not sticky:
 * the launches after it read the range until it is staged again). After
 * it, wo_stream_touch_end records the fence event on the launch's stream
 * (with fn, the real driver's event functions; made there if need be) and counts the touches ended.
 * The executor then stages those ranges from the range itself, after the fence (not from a pinned
 * copy made before), publishes no copy a touch overlapped, and the write check of that staging
 * finds a range that was written (stream-check.h). Returns the number of ids (span ids, at most
 * WO_STREAM_TOUCH_MAX: a span past them is dropped as a copy's write would drop it).
 * Any thread, lock-free. */
#define WO_STREAM_TOUCH_MAX (4 * WO_EV_MAX_HITS)
unsigned wo_stream_touch_begin(const struct wo_ev_hit *hits, unsigned nhits, const uint64_t *from,
                               const uint64_t *to, unsigned nred, uint32_t *ids);
struct wo_stream_evfns { /* the real driver's, as the hooks have them */
    CUresult (*create)(CUevent *, unsigned);
    CUresult (*destroy)(CUevent);
    CUresult (*record)(CUevent, CUstream);
};
void wo_stream_touch_end(const uint32_t *ids, unsigned n, uint64_t stream,
                         const struct wo_stream_evfns *fn);

/* Whether hit h (a launch's word) lies in the streamed span of entry e, of
 * the same generation, and can point at a weight (core/event.h): the hits
 * that are reads of a streamed range, as the hooks and the executor count
 * them (an activation in the allocation's tail is not one). streamed:
 * only while the executor streams it. Any thread. */
static inline bool wo_stream_hit_in_span(const struct wo_stream_entry *e, const struct wo_ev_hit *h,
                                         bool streamed)
{
    return (!streamed || __atomic_load_n(&e->streamed, __ATOMIC_ACQUIRE)) &&
           __atomic_load_n(&e->base, __ATOMIC_RELAXED) &&
           __atomic_load_n(&e->gen, __ATOMIC_RELAXED) == h->gen &&
           h->hi > __atomic_load_n(&e->lo, __ATOMIC_RELAXED) &&
           h->offset < __atomic_load_n(&e->hi, __ATOMIC_RELAXED) && wo_hit_pointer_like(h);
}

/* The spans of hit h's allocation that can hold its reads, one per call:
 * *it starts at 0; returns the entry (its sid in *sid), NULL after the
 * last. An allocation with one span gives e[h->id]; one with sub-spans
 * gives those its [offset, hi) overlaps, in offset order, starting from
 * its granule index. The caller still checks wo_stream_hit_in_span
 * (generation, pointer-like). Any thread, lock-free: sub-spans and index
 * entries are published before they are linked and never reused. */
static inline struct wo_stream_entry *wo_stream_span_next(const struct wo_ev_hit *h, uint32_t *it,
                                                          uint32_t *sid)
{
    uint32_t next;

    if (h->id >= WO_STREAM_IDS || *it == UINT32_MAX)
        return NULL;
    if (*it == 0) {
        const struct wo_stream_split *x = &wo_stream_tab.split[h->id];
        uint32_t n = __atomic_load_n(&x->n, __ATOMIC_ACQUIRE);
        uint64_t g;

        if (!n) {
            *it = UINT32_MAX;
            *sid = h->id;
            return &wo_stream_tab.e[h->id];
        }
        g = h->offset >> __atomic_load_n(&x->shift, __ATOMIC_RELAXED);
        next = g < n ? __atomic_load_n(&wo_stream_tab.gidx[__atomic_load_n(&x->at, __ATOMIC_RELAXED) +
                                                           (uint32_t)g],
                                       __ATOMIC_ACQUIRE)
                     : 0;
    } else {
        next = __atomic_load_n(&wo_stream_tab.e[*it - 1].next, __ATOMIC_ACQUIRE);
    }
    for (; next && next <= WO_STREAM_ENTRIES;
         next = __atomic_load_n(&wo_stream_tab.e[next - 1].next, __ATOMIC_ACQUIRE)) {
        struct wo_stream_entry *e = &wo_stream_tab.e[next - 1];

        if (__atomic_load_n(&e->lo, __ATOMIC_RELAXED) >= h->hi)
            break; /* in offset order: none further can overlap */
        if (__atomic_load_n(&e->hi, __ATOMIC_RELAXED) > h->offset) {
            *it = next;
            *sid = next - 1;
            return e;
        }
    }
    *it = UINT32_MAX;
    return NULL;
}

/* A blind launch may write any range through pointers the shim cannot see:
 * a kernel handed a table of pointers in device memory (NCCL's kernels: an
 * RL trainer broadcasting new weights into the engine), or a graph whose
 * captured launches reached off-device ranges (its nodes replay without
 * the launch hook). wo_stream_blind_begin, before the launch, counts a
 * blind launch begun: from then on no hook redirects to an assignment
 * published before it (the entry's `blind`), and the executor takes those
 * back. wo_stream_blind_end, after it, records blind_fence on the launch's
 * stream (with the real driver's functions fn; made there if the executor
 * has not made it yet; a failure is counted in blind_unfenced, and the
 * executor then stops streaming) and counts it ended. The executor stages every range
 * again after that fence, from the range itself, and retires the pinned
 * copies for good (they may be older than the range now). Any thread,
 * lock-free; while nothing may be streamed begin returns false, and the
 * caller does not call end. */
bool wo_stream_blind_begin(void);
void wo_stream_blind_end(uint64_t stream, const struct wo_stream_evfns *fn);

/* The fence event at *at (wo_stream_tab.fence or blind_fence), made with
 * create (destroy: the one a racing maker lost with) when nobody made it
 * yet; NULL when it cannot be made. */
CUevent wo_stream_fence(CUevent *at, CUresult (*create)(CUevent *, unsigned),
                        CUresult (*destroy)(CUevent));

/* Whether a blind launch began since entry e's assignment was published
 * (then it is read in place; hooks, after pinning). */
static inline bool wo_stream_blind_since(const struct wo_stream_entry *e)
{
    return __atomic_load_n(&e->blind, __ATOMIC_RELAXED) !=
           __atomic_load_n(&wo_stream_tab.blind_begin, __ATOMIC_SEQ_CST);
}

/* The launch hook found entry e (generation gen) streamed but not staged:
 * the engine's host thread has run ahead of the executor, which issues
 * the staging copies on the consumer thread. When the range is planned,
 * the hook waits (bounded: WO_STREAM_AWAIT_NS) for the executor to publish
 * it, waking the consumer first. The engine's host thread normally runs far
 * ahead of the GPU, so the wait costs no GPU time, while a read in place
 * costs the PCIe read and the copy already under way for it is wasted.
 * Returns true when an assignment was published (pin it as usual). Any
 * thread; never blocks longer than the bound. */
#define WO_STREAM_AWAIT_NS 500000u
extern uint64_t wo_stream_await_ns; /* the bound: WO_STREAM_AWAIT_NS (tests change it) */

/* The engine reached streamed span sid (a launch on stream, captured or
 * not, about to be made): published for the executor, which stages the
 * spans after it. A new position wakes the executor's thread: it may be
 * asleep (the engine's host thread waited on the GPU, no events came), and
 * the next copy is issued only once it looks. And the slot of the range
 * the engine left two moves ago (WOFFLOAD_DEPARTURE_LAG=1: the one it
 * leaves now) gets its departure fence (struct wo_stream_slot), when this
 * stream reads it and is not capturing
 * (evfns gives the driver's record function; WOFFLOAD_DEPARTURE_FENCES=0:
 * none made). One relaxed load when the position did not move; else a
 * futex wake and at most one event record, once a span. */
void wo_stream_publish_pos(uint32_t sid, uint64_t stream, bool captured,
                           void (*evfns)(struct wo_stream_evfns *fn));
/* The moves past a range after which its departure fence is made:
 * WOFFLOAD_DEPARTURE_LAG where given, else what the engine said
 * (woffload_departure_lag: wo_stream_engine_lag), else 2; 0 without
 * departure fences (WOFFLOAD_DEPARTURE_FENCES=0). The hooks and the
 * executor's staged window (uvm/stream-stage.c, wo_sx_advance) both follow
 * it. */
unsigned wo_stream_departure_lag(void);
void wo_stream_engine_lag(unsigned ranges);
bool wo_stream_await(struct wo_stream_entry *e, uint32_t gen);

/* woffload_read_in_place: on, each streamed span [p, p + bytes) overlaps is
 * claimed read in place (counted: claims nest) until a call with on false
 * ends the claim; the executor stages none while one is held, and hooks do
 * not wait for its copy. Any thread. Returns the spans it found (0: none is
 * streamed there), -ENOENT (no allocation the shim saw), -ERANGE (bytes 0 or
 * past the allocation). */
int wo_stream_claim_in_place(uint64_t p, uint64_t bytes, bool on);

/* The counters (any thread; relaxed reads). */
void wo_stream_counts(struct wo_stream_counts *ret);

/* Zeroes the table word by word (the hooks and the stats read it
 * concurrently): the executor, when it starts and in a forked child. */
void wo_stream_table_clear(void);

/* ---- allocations no kernel writes (woffload_readonly) -------------------------
 * The generation + 1 of each registry id the engine declared read-only to
 * kernels (0: not declared; a later allocation under the id has another
 * generation). Copies into such an allocation are still seen and handled as
 * for any range (wo_stream_note_write). What it changes: a graph whose
 * captured launches reached only such allocations is no blind launch
 * (preload/capture.c), and the streaming executor neither checks their
 * slots for writes nor stages them again from the range after a launch
 * read them in place; their pinned copies stay valid. Any thread. */
extern uint32_t wo_readonly_gen[WO_STREAM_IDS];
static inline bool wo_readonly(uint32_t id, uint32_t gen)
{
    return id < WO_STREAM_IDS && __atomic_load_n(&wo_readonly_gen[id], __ATOMIC_RELAXED) == gen + 1;
}

/* The engine destroys stream (the hook calls this before the real call,
 * on the engine's thread): the streaming executor's slots that it read get
 * their read_done recorded there now and forget it, and picked staging's
 * buffers of it wait for its work and are given back; nothing the shim
 * does later hands the driver the freed stream (llama-server frees its
 * streams before its model buffer, whose free gives the slots back). */
void wo_uvm_stream_gone(uint64_t stream);

/* ---- picked staging (uvm/picks.h: the executor) ---------------------------
 * A launch that reads an expert tensor whose picks the engine registered
 * (woffload_moe_picks) gets only the picked rows, copied on its own stream
 * right before it into a device buffer; the hook moves its pointers there
 * as it does for a slot (preload/launch.c). */
/* Spans (+1, saturating at 255) in each registry range id (< WO_STREAM_IDS): a
 * launch's hit on an id with 0 is not for this executor (lock-free). These
 * three are the hot path's tables (defined in hotpath.c), kept by
 * uvm/picks.c. */
extern uint8_t wo_picks_ids[WO_STREAM_IDS];
/* Bumped whenever a hot set is made or retired (uvm/picks.c): a trace
 * records the picks' figures at that moment (uvm/record.c), so that the
 * replay can take a tensor's steady state from there. */
extern uint32_t wo_picks_hot_epoch;
/* 1 once any span exists: the launch hooks look only then. */
extern int wo_picks_any;
/* Words at an expert past a tensor's base that the redirect left as they
 * were: their parameter slot never held another value (preload/redirect.c,
 * a constant; atomic). */
extern uint64_t wo_picks_const_words;

/* One move for the launch: [from, to) of the tensor reads [dev, ...), the
 * words at from + a multiple of row (an expert's bytes) only. */
struct wo_picks_move {
    uint64_t from, to, dev, row;
};

/* The launch hook (any engine thread), after the parameter scan and the
 * streaming executor's redirect: for each hit in a span with picks now
 * (none when captured), enqueues the mark and copy on stream (or reuses a
 * buffer that holds them) and returns the moves (at most max), skipping
 * hits inside any of the nskip spans [skip_from[k], skip_to[k]) already
 * moved. key: the launch key (core/kernel-name.h), for the stats' kernels. */
unsigned wo_picks_stage(const struct wo_ev_hit *hits, unsigned nhits, uint64_t stream,
                        bool captured, const uint64_t *skip_from, const uint64_t *skip_to,
                        unsigned nskip, struct wo_picks_move *moves, unsigned max, uint64_t key);
/* The launch hook, on the thread whose wo_picks_stage returned moves,
 * after the real launch call (made or not): the stream's buffers may be
 * lent to another stream from now on (uvm/picks-pool.h). */
void wo_picks_issued(void);
/* The launch with the moves was not made (the parameters could not be
 * rewritten): counted. */
void wo_picks_unused(unsigned n);

/* WOFFLOAD_STREAM_CHECK, for a launch that read a picked buffer: the
 * registration of the tensor at from, as this thread's launches see it
 * (false: none). The check (preload/redirect.c) reads the ids back and
 * compares each picked expert's rows in the buffer with the tensor's, and
 * reports each launch with wo_picks_checked. */
struct wo_picks_reg {
    uint64_t ids, n_ids, per_row, stride, row;
    unsigned width, n_experts;
};
bool wo_picks_reg_of(uint64_t from, struct wo_picks_reg *r);
void wo_picks_checked(bool mismatch);
/* Whether launches with these hits, replayed from a CUDA graph on the
 * calling thread, would copy faster than the graph reads in place: a hit
 * in a span off the device whose registration holds ids now, registered by
 * this thread, and either with hot experts (WOFFLOAD_PICKS_HOT: rows from
 * the device) or copied on the copy engine (WOFFLOAD_PICKS_ENGINE: 55 GB/s
 * against the kernels' 50); preload/graph-replay.c replays the graph for
 * it. Without either a graph's launches read the picked experts in place,
 * as fast as the kernels' copy of them. Any thread. */
bool wo_picks_replay_wanted(const struct wo_ev_hit *hits, unsigned nhits);
/* A copy hook writes [dst, dst + bytes) (wo_stream_note_write calls it
 * first, once installed): buffers holding rows of a tensor it overlaps are
 * stale (copied again at the next launch). Any thread. */
void wo_picks_note_write(uint64_t dst, uint64_t bytes);

/* The load's copies (issue 41, load time): while the placement window is
 * open, the copy hooks time each copy the engine makes (inside the call:
 * a copy from pageable memory returns once its bytes are staged) and hand
 * it here with its destination; uvm/load-copies.c counts it by where the
 * destination lies (the shim's pinned host memory, its managed memory, its
 * late-bound ranges, or the engine's own memory) for the seal line and the
 * stats' load_copies. wo_uvm_load_timing: one relaxed load, false once
 * sealed or with nothing to place. Any thread. */
bool wo_uvm_load_timing(void);
void wo_uvm_load_copy(uint64_t dst, uint64_t bytes, uint64_t ns);
