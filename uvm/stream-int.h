/* uvm/stream-int.h: the streaming executor's internals, shared by its files
 * (issue 39: stream.c was one file of 2,028 lines). Consumer thread only.
 *  - stream.c: the executor interface, setup, events, ranges, per-name
 *    figures, the end;
 *  - stream-slots.c: driver access, the device slots and their sizes;
 *  - stream-stage.c: assignments, write checks, blind launches, the staging
 *    copy, advancing with the engine;
 *  - stream-learn.c: read multiplicity, what is streamed (gain and auto's
 *    step-time rule), steps, launches;
 *  - plan-stream.c: the pure rules (what prefetch.mode asks, the slots
 *    wanted and their sizes; no executor state), shared with the replay.
 * Functions here are wo_sx_ (stream executor, internal); each file's own
 * helpers stay static. */
#pragma once

#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/event.h"
#include "policy/policy.h"
#include "uvm/internal.h"
#include "uvm/plan.h"
#include "uvm/plan-stream.h"
#include "uvm/stream-auto.h"
#include "uvm/stream.h"

#define GRANULES 64
#define NONE UINT32_MAX
#define AUTO_GAIN 1.5   /* stream when a step reads this many times the range's bytes */
#define AUTO_STEPS 2    /* ... measured over at least this many steps */
#define AUTO_RECENT 4   /* steps: a range read this recently is in use */
/* steps: a range the router's picks took out of streaming (claims) is no
 * candidate of auto's for this long. The ggml hook claims a tensor for each
 * compute it registers picks for, so a try of it is taken back within the
 * step: on llama-server with picks on every compute (the fake GPU) the tries
 * made and gave back the slots 100 times in 10 minutes, 38 with this rule
 * (bench/results/serve-soak-20261208-claims-cpu). A batch whose picks go whole stops claiming, and
 * the range is a candidate again after this */
#define AUTO_CLAIMED 512
#define WARN_MULT 2.0   /* a host range read this many times a step in place: one warning */
#define WO_SX_TIMED 64 /* staging copies timed at once (copy_time) */
#define SPIN_WAIT 20000 /* polls of a slot's in-flight count before trying later */
#define PAD_MAX 511     /* bytes between two tags that are alignment, not a gap */

struct srange {
    bool live, host, written, streamed, warned;
    bool gathered;       /* an embedding: never streamed (wo_stream_gathered) */
    bool big;            /* larger than a slot: read in place (said once) */
    bool probed;         /* streamed by auto's step-time decision (stream-auto.h), not by gain */
    uint64_t claimed_step; /* steps + 1 when picks last took it out of streaming (0: never) */
    bool room;           /* ... a hot managed range the slots took the room of (readmit_room) */
    bool gapped;         /* other bytes between its tags: never streamed (add_seg) */
    bool hashed;         /* the write check has the hash it was staged with (stream-check.h) */
    bool kernel_written; /* a write check found a launch wrote its slot: copied back */
    uint32_t rid;        /* the registry id of its allocation (its sid when not a sub-span,
                          * which is one host tag: sid >= WO_STREAM_IDS) */
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
    /* the executor's step count + 1 when no slot it fits was free to take
     * (wo_sx_advance), 0 since it was staged */
    uint64_t starved;
    double sum_mult, sum_read, gain, sum_staged;
};

struct exec {
    const struct wo_driver *drv;
    /* policy prefetch.mode, decoded once at setup (wo_stream_mode_of): the
     * rest of the executor reads this decision, never the policy */
    struct wo_stream_mode mode;
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
    uint32_t
        slot_last[WO_STREAM_MAX_SLOTS]; /* the last id staged there (kept when dropped), NONE */
    struct srange *r;                   /* by span id (< WO_STREAM_ENTRIES, hotpath.h) */
    uint32_t nr;
    uint32_t *order, norder, *cur, ncur;
    size_t cap_order, cap_cur;
    uint32_t maxi; /* furthest index in the order the engine reached this step */
    uint32_t epoch;
    /* the steps, by the planner's step detector on the executor's keys
     * (plan-stream.h); keys.last_seen is also the last range a launch
     * reached in the events read (wo_sx_at_engine) */
    struct wo_stream_keys keys;
    uint64_t steps;
    uint64_t close_ns;  /* the last step boundary's launch time (the staging steps' periods) */
    uint32_t seen_pos;  /* the engine's position the last advance took up (its reaction time) */
    struct fnrec *fns;  /* by launch function: the off-device ranges it reached (reader()) */
    struct wo_auto au;  /* auto's step-time decision for host ranges */
    double link_gbs;    /* the copy rate it assumes (the built-in device model's) */
    uint64_t pin_limit; /* policy prefetch.pinned_copies */
    bool pin_on;        /* the pinned-copy worker runs (stream-pin.h) */
    bool said_kernel;   /* the copy kernel's info line was given */
    bool checks_wanted; /* WOFFLOAD_WRITE_CHECKS (default on) */
    bool check_on;      /* the write checks run (stream-check.h) */
    uint32_t slot_chk[WO_STREAM_MAX_SLOTS];     /* the range staged there, not checked yet, NONE */
    uint32_t slot_chk_gen[WO_STREAM_MAX_SLOTS]; /* ... its generation */
    uint32_t blind_seen;                        /* blind launches ended that blind() took in */
    bool ever_streamed;                         /* a range was streamed once (slots held bytes) */
    /* by registry id: an allocation split into sub-spans (add_seg) */
    struct split {
        uint32_t gen;  /* the allocation's generation */
        uint32_t last; /* sid + 1 of its last sub-span, 0 none (the first: its index's first entry) */
        bool on;
        bool tainted; /* unnamed bytes between its tags: no sub-span (read in place) */
        bool pending; /* split in this listing: its sub-spans come in the next (list_ranges) */
    } *split;
    uint32_t nsub; /* sub-spans handed out (WO_STREAM_IDS + nsub is the next sid) */
    uint32_t ngidx; /* granule index entries handed out (hotpath.h) */
    bool resplit;  /* an allocation was split during this listing */
    bool said_subs_full;
};

#define FNS 8192u /* functions tracked by reader(), open addressing; more count as readers */

struct fnrec {
    uint64_t func;  /* 0: empty */
    uint32_t first; /* registry id + 1 of the first off-device range it reached */
    bool many;      /* it reached a second one */
};

static inline void add(uint64_t *c, uint64_t n)
{
    __atomic_add_fetch(c, n, __ATOMIC_RELAXED);
}

extern struct exec *wo_sx; /* NULL: not built (stream.c builds it; stream-slots.c) */

static inline bool in(const uint32_t *v, unsigned n, uint32_t id)
{
    for (unsigned i = 0; i < n; i++)
        if (v[i] == id)
            return true;
    return false;
}

/* The executor's files, each calling only those below it: stream.c (the
 * executor) > stream-learn.c (what is streamed, the per-name figures) >
 * stream-stage.c (ranges and assignments, fences, the staging copy, the
 * slots' sizes and reuse) > stream-slots.c (the device slots, the copy
 * stream, copy timing). */

/* ---- stream-slots.c ---------------------------------------------------------- */

CUcontext wo_sx_push_ctx(void);
void wo_sx_pop_ctx(CUcontext prev);
CUdeviceptr wo_sx_source(uint32_t id, const struct srange *r, bool managed, bool *pinned);
CUresult wo_sx_copy_to_slot(CUdeviceptr dst, CUdeviceptr src, uint64_t bytes, bool managed);
uint64_t wo_sx_slots_bytes(void);
void wo_sx_want_sizes(void);
/* The sizes (out) the slots should have for the ranges streamed now but
 * skip (NONE: none); false when no such range is in the order. */
bool wo_sx_size_for(uint32_t skip, uint64_t *out);
/* One info line with the slots' sizes; a size as the info lines give it. */
void wo_sx_say_slots(const char *what);
const char *wo_sx_size_str(uint64_t b, char buf[24]);
/* Makes the slots, their events and the copy stream, once: false when
 * they cannot be had. */
bool wo_sx_slots(void);
/* Copy timing: a staging copy on the copy engine is bracketed by two
 * timing events on the copy stream; once both completed, the time between
 * them is the copy's own (the waits before it are not in it). begin
 * returns the pair, or -1 (none free, or timing off); end records its
 * second event; poll takes in the finished ones, in order. */
int wo_sx_time_begin(void);
void wo_sx_time_end(int i, uint64_t bytes);
void wo_sx_time_poll(void);
/* The pairs go, with the slots (in their context, the copies done). */
void wo_sx_time_free(void);
/* In a fork child: the parent's pairs forgotten, no driver call. */
void wo_sx_time_atfork_child(void);

/* ---- stream-stage.c ---------------------------------------------------------- */

bool wo_sx_unpublish(int slot);
void wo_sx_take_back(struct srange *r);
void wo_sx_mark_written(struct srange *r, uint32_t id);
/* The range at id forgotten (its allocation freed): out of the table and
 * the plan, its slot taken back. */
void wo_sx_drop(uint32_t id);
void wo_sx_unselect_range(struct srange *r, uint32_t id);
bool wo_sx_unselect_claimed(struct srange *r, uint32_t id);
/* The spans of hit h's allocation its [offset, hi) can read, as the
 * executor knows them (hotpath.h's wo_stream_span_next on wo_sx->r): *it
 * starts at 0; returns a live span of h's generation (its sid in *sid) or
 * NULL after the last. */
struct srange *wo_sx_span_next(const struct wo_ev_hit *h, uint32_t *it, uint32_t *sid);
bool wo_sx_fence_owner(struct wo_stream_slot *s);
bool wo_sx_at_engine(unsigned slot, bool hooks_too);
bool wo_sx_check_slot(unsigned s);
void wo_sx_poll_checks(bool wait, uint32_t only);
bool wo_sx_stage(uint32_t id, int slot);
void wo_sx_advance(void);
bool wo_sx_quiesce(unsigned lo, unsigned hi);
void wo_sx_resize(const uint32_t *ahead, unsigned na);

/* ---- stream-learn.c ---------------------------------------------------------- */

void wo_sx_select_range(struct srange *r, uint32_t id, bool quiet);
void wo_sx_on_launch(const struct wo_event *ev);
/* The per-name figures published for the stats (at most every 100 ms
 * unless forced). */
void wo_sx_publish_names(bool force);
