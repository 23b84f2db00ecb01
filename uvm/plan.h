/* uvm/plan.h: the prefetch planner. Pure decision code: it reads launch
 * events (which managed ranges, and which slices of them, each launch
 * touched), learns the per-step order of those slices, and says what to move
 * onto the GPU and what to drop, within a device budget. It makes no driver
 * call, keeps no clock of its own and has no randomness: the same events give
 * the same actions, so the shim (uvm/prefetch.c runs the actions) and the
 * replay tool (tools/woffload-replay.c times them against a device model)
 * share it verbatim. docs/prefetch.md explains the algorithm.
 *
 * Not thread-safe: one planner belongs to one thread (the consumer thread in
 * the shim). */
#pragma once

#include "core/event.h"
#include "uvm/cost.h"

/* What an action asks for. */
enum wo_plan_act {
    WO_PLAN_PREFETCH = 1, /* move [offset, offset+bytes) of range id to the GPU */
    WO_PLAN_EVICT = 2,    /* drop the GPU copy of [offset, offset+bytes), by `how` */
    WO_PLAN_STEP = 3,     /* a step boundary was found (offset: the step number) */
};

/* How a range's GPU copy is dropped; chosen per range (see wo_plan_range_add). */
enum wo_plan_how {
    WO_PLAN_HOW_NONE = 0,
    /* Read-only data: the range is advised read-mostly, a prefetch makes a
     * GPU duplicate, eviction unsets read-mostly (the GPU copy collapses to
     * the host one, no PCIe traffic; ~38 ms/GiB on the CPU) and sets it again. */
    WO_PLAN_COLLAPSE = 1,
    /* Data the engine writes: eviction prefetches back to the host (9.6 GB/s). */
    WO_PLAN_COPY_BACK = 2,
};

struct wo_plan_action {
    uint32_t type; /* enum wo_plan_act */
    uint32_t how;  /* enum wo_plan_how of the range (prefetches carry it too:
                    * COLLAPSE ranges need read-mostly set before the prefetch) */
    uint32_t id, gen;
    uint64_t offset, bytes;
};

/* The device figures the planner weighs decisions with: struct
 * wo_plan_costs (uvm/cost.h; uvm/devmodel.h fills them from a model file,
 * the shim from WOFFLOAD_DEVICE_MODEL or the defaults below, which are
 * device-facts.md's H100 figures). */

struct wo_plan_cfg {
    uint64_t budget;           /* device bytes the planner may keep resident */
    uint64_t piece;            /* coalesce prefetches/evictions to at least this (>= 16 MiB) */
    uint64_t granule;          /* smallest tracked unit when slices are smaller (2 MiB) */
    uint32_t lookahead_ranges; /* look this many upcoming units ahead (0: use bytes) */
    uint64_t lookahead_bytes;  /* ... or this many upcoming bytes */
    bool hot_set;              /* keep the most used units resident */
    bool slices;               /* track sub-ranges; false: whole ranges only */
    uint32_t eviction;         /* enum wo_plan_how to force, NONE: per range */
    struct wo_plan_costs costs;
};

/* Defaults: device-facts.md's H100, 64 MiB pieces, 2 MiB granule, lookahead
 * of 4 units, hot set on, slices on, budget 0 (the caller sets it). */
void wo_plan_cfg_default(struct wo_plan_cfg *cfg);

struct wo_policy_globals;
/* The policy's prefetch settings (piece size, hot set, lookahead, eviction)
 * into cfg: the shim's prefetcher and the replay take them this one way. */
void wo_plan_cfg_policy(struct wo_plan_cfg *cfg, const struct wo_policy_globals *g);

/* Range flags for wo_plan_range_add. */
enum {
    WO_PLAN_WRITTEN = 1u << 0,   /* the engine writes it (or it is not a weight) */
    WO_PLAN_NO_SLICES = 1u << 1, /* track it whole */
};

/* Per-range statistics (what the shim reports per name). */
struct wo_plan_stats {
    uint64_t hits, misses;           /* unit accesses resident / not resident when launched */
    uint64_t hit_bytes, miss_bytes;  /* bytes touched by those accesses */
    uint64_t prefetched, evicted;    /* bytes asked for */
    uint64_t prefetches, evictions;  /* actions */
    double stall_s;                  /* estimated: miss bytes read over PCIe instead of HBM */
};

struct wo_plan;

/* 0 and *ret, -EINVAL for a bad cfg, -ENOMEM. */
int wo_plan_new(const struct wo_plan_cfg *cfg, struct wo_plan **ret);
/* NULL is fine. */
void wo_plan_free(struct wo_plan *p);

/* A managed range the planner may move (registry id and generation), its
 * size, WO_PLAN_* flags and policy priority (0..100, higher kept first).
 * Returns 0, -EINVAL (size 0), -ENOMEM. Re-adding an id replaces it. */
int wo_plan_range_add(struct wo_plan *p, uint32_t id, uint32_t gen, uint64_t size,
                      uint32_t flags, int priority);
/* The range is gone (freed): forgets it, frees its budget. No action is
 * emitted for it (the memory no longer exists). */
void wo_plan_range_remove(struct wo_plan *p, uint32_t id, uint32_t gen);
/* A copy wrote into the range after seal: it is evicted by copy-back from now
 * on (a read-mostly duplicate of written data would be invalidated). */
void wo_plan_range_written(struct wo_plan *p, uint32_t id, uint32_t gen);

/* Feeds one event: launches, captures, graph instantiation and launches
 * (others are ignored; graph launches expand as uvm/graph.h says). Actions queue up for wo_plan_pop(). 0 or -ENOMEM
 * (the planner then stays consistent; it only learned less). */
int wo_plan_event(struct wo_plan *p, const struct wo_event *ev);
/* Next queued action: 1 and *ret, 0 when none. */
int wo_plan_pop(struct wo_plan *p, struct wo_plan_action *ret);

/* What one step moved and read, and what the planner predicts it cost
 * (uvm/cost.h's wo_cost_step_s: reads of managed memory and the moves, in
 * seconds; the rest of the step, compute and other memory, is not in it). */
struct wo_plan_step {
    uint64_t in_bytes;  /* prefetched */
    uint64_t out_bytes; /* evicted (collapses and copy-backs) */
    uint64_t calls;     /* prefetch calls */
    double hit_bytes;   /* read from the GPU copy */
    double miss_bytes;  /* read in place over PCIe */
    double inplace_s;   /* predicted: every byte read in place, nothing moved (`host`) */
    double plan_s;      /* predicted: the plan (hits, misses and the moves) */
};
/* Steps over which moved bytes are compared with the budget (churn). */
#define WO_PLAN_CHURN_STEPS 16u

/* The last complete step's figures (*last), their sums over every step
 * since the planner began (*sum) and how many steps those are (*steps).
 * Any of the pointers may be NULL. */
void wo_plan_step_stats(const struct wo_plan *p, struct wo_plan_step *last,
                        struct wo_plan_step *sum, uint64_t *steps);
/* Bytes prefetched over the last WO_PLAN_CHURN_STEPS steps into *moved;
 * returns 1 when those exceed the budget (the planner cycled more than the
 * whole budget through the GPU in that window: the working set does not
 * fit and residency is churning), 0 otherwise or while fewer steps ran. */
int wo_plan_churn(const struct wo_plan *p, uint64_t *moved);

/* Stats of a range (zeros for an unknown one). */
void wo_plan_range_stats(const struct wo_plan *p, uint32_t id, uint32_t gen,
                         struct wo_plan_stats *ret);
/* A new budget (the streaming executor took device bytes for its slots):
 * what exceeds it is evicted at once (actions queue up). */
void wo_plan_set_budget(struct wo_plan *p, uint64_t budget);
/* Bytes the planner believes resident (prefetched and not evicted). */
uint64_t wo_plan_resident_bytes(const struct wo_plan *p);
/* Steps found so far (boundaries seen). */
uint64_t wo_plan_steps(const struct wo_plan *p);
/* 1 when the planner believes [offset, offset+bytes) of the range resident. */
int wo_plan_is_resident(const struct wo_plan *p, uint32_t id, uint32_t gen, uint64_t offset,
                        uint64_t bytes);
/* Bytes of the range's units in the hot set (0 for an unknown range). */
uint64_t wo_plan_hot_bytes(const struct wo_plan *p, uint32_t id, uint32_t gen);
/* The eviction method the planner uses for a range (enum wo_plan_how). */
uint32_t wo_plan_range_how(const struct wo_plan *p, uint32_t id, uint32_t gen);

/* ---- shared with the replay tool --------------------------------------- */

/* Slice learning: the natural slice of a range is the gcd of the non-zero
 * offsets launches pointed at (per-expert slices of a stacked tensor), or
 * the whole range while only offset 0 was seen. */
uint64_t wo_plan_gcd(uint64_t a, uint64_t b);
/* The one rule every learner of slices uses (the planner, the streaming
 * executor, the consumer's per-name figures, the replay): the slice
 * learned so far (0: none yet) after a launch pointed at offset (relative
 * to the range; 0 teaches nothing). */
uint64_t wo_plan_slice_learn(uint64_t slice, uint64_t offset);
/* The bytes a hit touches: a launch hands a kernel a pointer, not a length,
 * so the hit covers [offset, max(hi, offset + slice)) clipped to the range.
 * slice 0 means the rest of the range. Returns the end offset. */
uint64_t wo_plan_extent_end(uint64_t range_size, uint64_t slice, uint64_t offset, uint64_t hi);

/* Step detection without engine help. Each launch that touches tracked
 * memory gives a key (its function and the lowest range id it touched).
 * The first key is the anchor; each recurrence of the anchor proposes as
 * candidate periods its distances to the anchor's WO_STEPPER_PREV latest
 * occurrences (a step may hold the anchor several times; at most
 * WO_STEPPER_CANDS candidates, the most recently broken one giving way),
 * and a candidate's run grows while
 * every key equals the key one period earlier; a key that does not starts
 * its run again (a first forward pass unlike the later ones, a prefill
 * touching the same weights, must not bar the period for good). The
 * shortest candidate whose run reaches a whole period and
 * WO_STEPPER_MIN_MATCH keys is the step. From then
 * on a step starts at every c-th anchor recurrence (c: anchors per step), so
 * steps of varying length (routing) keep their boundaries. When the
 * anchor has not recurred for WO_STEPPER_PATIENCE keys (doubling each time)
 * with no candidate alive, it belonged to a phase that is over (a prefill
 * before the decode): detection starts over from the current key; likewise
 * after WO_STEPPER_MAX keys without a period. */
#define WO_STEPPER_MAX 65536u
#define WO_STEPPER_MIN_MATCH 256u
#define WO_STEPPER_PATIENCE 1024u
#define WO_STEPPER_CANDS 64u
#define WO_STEPPER_PREV 8u
/* Real MoE decode steps are not key-exact repeats (a step launches a few
 * more or fewer expert kernels as routing changes), so a second rule runs
 * beside the exact one: a key that recurs WO_STEPPER_GAP_RUNS times at
 * gaps that agree within 10% (and are at least WO_STEPPER_GAP_MIN keys) is
 * taken as the anchor, one cluster of it per step. Occurrences closer than
 * WO_STEPPER_GAP_MIN keys to the previous one form a cluster (the top-k
 * experts of one layer, each launch handed its own slice, repeat the same
 * key k times in a row: transformers' eager experts backend); gaps run
 * from cluster start to cluster start. Keys that occur once per step (a
 * layer's projection) recur at the step length; keys that occur in several
 * places of a step recur at shorter, irregular gaps. */
#define WO_STEPPER_GAPS 8192u
#define WO_STEPPER_GAP_RUNS 3u
#define WO_STEPPER_GAP_MIN 64u
struct wo_stepgap {
    uint64_t key;
    uint64_t last;  /* position of its latest occurrence */
    uint64_t start; /* position of the first occurrence of its latest cluster */
    uint32_t gap;   /* latest gap, cluster start to cluster start */
    uint32_t runs;  /* gaps in a row that agreed */
};
struct wo_stepper {
    struct wo_stepgap *gaps; /* open addressing, WO_STEPPER_GAPS slots */
    uint64_t pos;            /* keys fed */
    uint64_t *keys; /* history until the period is found */
    size_t n, cap;
    uint64_t anchor;
    size_t *cand;   /* candidate periods */
    size_t *since;  /* per candidate: the key from which every key has equalled the one
                     * a period earlier (a mismatch starts its run again) */
    size_t ncand, capcand, capsince;
    size_t prev[WO_STEPPER_PREV]; /* the anchor's latest occurrences (ring) */
    unsigned nprev;
    size_t last_anchor; /* index of the anchor's latest occurrence */
    size_t patience;    /* keys without the anchor before starting over */
    uint32_t per_step; /* anchors per step; 0: not found yet */
    uint32_t seen;     /* anchors since the last boundary */
    uint64_t steps;
    bool clusters;        /* anchor from the gap rule: one cluster of it per step */
    uint64_t anchor_last; /* position of the anchor's latest occurrence */
    uint64_t last_boundary; /* position of the latest boundary */
    uint64_t step_keys;   /* keys in the latest step: the anchor missing for 4 of them
                           * (at least WO_STEPPER_PATIENCE keys) ends the phase */
};
void wo_stepper_init(struct wo_stepper *s);
void wo_stepper_done(struct wo_stepper *s);
/* A launch key from a function and the lowest tracked range id it touched. */
uint64_t wo_stepper_key(uint64_t func, uint32_t id);
/* Feeds one key: returns the number of steps that end here (1 at a
 * boundary; 2 at the first boundary, which closes the two steps the period
 * was learned on), 0 otherwise. */
unsigned wo_stepper_feed(struct wo_stepper *s, uint64_t key);

/* The streaming executor's steps (uvm/stream-learn.c): the same detector
 * fed the executor's keys, a state of its own. The keys are the ranges
 * in the order launches reach them, a run of launches on one range counted
 * once: a forward pass reaches the same weights in the same order whatever
 * kernels it picks for its batch, so steps are found again at once when
 * the batch changes (the planner's key, function and managed range,
 * changes with the kernels: b1 to b8, or every step under continuous
 * batching). With one range only (an LM head alone off the device), the
 * ranges say nothing of the step: the planner's key then. The second range
 * seen switches over, once, from a new stepper. */
struct wo_stream_keys {
    struct wo_stepper st;
    uint32_t first_low; /* the first range a keyed launch reached, UINT32_MAX none */
    bool lows_vary;     /* launches reached another range since: keys by range */
    uint32_t last_seen; /* the last range a launch reached, UINT32_MAX none */
};

void wo_stream_keys_init(struct wo_stream_keys *k);
void wo_stream_keys_done(struct wo_stream_keys *k);
/* A launch of func whose lowest off-device range is low: the steps it
 * ends (wo_stepper_feed's answer, 0 none). *switched is set when this
 * launch made the ranges vary (keys by range from now on). */
unsigned wo_stream_keys_feed(struct wo_stream_keys *k, uint64_t func, uint32_t low, bool *switched);
