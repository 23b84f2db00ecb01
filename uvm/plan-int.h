/* uvm/plan-int.h: the planner's private state, shared by its files and by
 * nothing else (callers see uvm/plan.h only). The planner is one object
 * split along its ideas:
 *   plan-step.c   step detection (struct wo_stepper): where a step ends
 *   plan-range.c  ranges and their units: slices learned, the budget held
 *   plan-hot.c    prediction: frequencies, the cost questions, what should
 *                 be resident (hot set, lookahead, victims)
 *   plan.c        event intake, the step's bookkeeping, the action queue,
 *                 life and queries
 * The functions below cross those files; each is documented where it is
 * defined. */
#pragma once

#include "uvm/plan.h"

struct unit {
    double freq;      /* EMA of accesses per step */
    double touched;   /* EMA of bytes touched per access */
    uint32_t cnt;     /* accesses in the current step */
    uint32_t age;     /* steps since it was first touched */
    uint32_t phase;   /* position in the step of the last access */
    uint8_t resident; /* a prefetch was emitted and no eviction since */
    uint8_t hot;
    uint8_t known;    /* listed in p->known */
    uint8_t mark;     /* in the current lookahead window */
};

struct prange {
    uint8_t live;
    uint32_t gen;
    uint32_t flags;
    int prio;
    uint64_t size;
    uint64_t slice; /* gcd of non-zero offsets seen; 0: only offset 0 so far */
    uint64_t usize; /* unit size */
    uint32_t nunits;
    struct unit *u;
    struct wo_plan_stats st;
};

struct uref {
    uint32_t id, unit;
};

struct oent {
    uint32_t pos; /* launch position in the step */
    uint32_t id, unit;
    uint64_t t_rel; /* ns since the step began (event clock) */
};

struct pend {
    uint32_t type, id, unit;
    uint64_t key; /* sort key for the order of emission (urgency) */
};

struct wo_plan {
    struct wo_plan_cfg cfg;
    struct prange *r;
    uint32_t nr;

    struct uref *known;
    size_t nknown, capknown;

    struct oent *prev, *cur; /* learned order (last full step), current step */
    size_t nprev, ncur, capprev, capcur;
    size_t cursor;           /* first entry of prev after pos */
    uint32_t prev_len;       /* positions in the last full step */
    uint64_t prev_ns;        /* its duration (event clock) */

    int anchored;
    struct wo_stepper stepper;
    uint64_t step;      /* boundaries seen */
    uint64_t elapsed;   /* steps they closed */
    uint32_t pos;       /* managed launches since the boundary */
    uint64_t t_step;    /* event time at the boundary */
    uint64_t t_last;
    int hot_valid;
    int cycle_ok;
    double step_miss_s, step_pref_s; /* link time this step (model) */

    uint64_t resident_bytes;

    /* this step's moves and reads, the last step's figures, their sums
     * (wo_plan_step_stats) and the bytes moved in over the last steps */
    struct wo_plan_step cur_st, last_st, sum_st;
    uint64_t nst;
    uint64_t churn[WO_PLAN_CHURN_STEPS];
    uint64_t cur_copyback; /* of cur_st.out_bytes, copied back (the rest collapsed) */
    int cycle_pays;        /* some unit read often enough in a step to pay for a cycle */

    struct pend *pend;
    size_t npend, cappend;
    struct wo_plan_action *q;
    size_t qhead, qn, qcap;

    struct wo_graphs *graphs;
};

/* The live range (id, gen), or NULL. */
static inline struct prange *wo_plan_range_get(const struct wo_plan *p, uint32_t id, uint32_t gen)
{
    if (id >= p->nr || !p->r[id].live || p->r[id].gen != gen)
        return NULL;
    return &p->r[id];
}

/* How r's GPU copy is dropped: the policy's forced method, else by whether
 * the engine writes it. */
static inline uint32_t wo_plan_how(const struct wo_plan *p, const struct prange *r)
{
    if (p->cfg.eviction != WO_PLAN_HOW_NONE)
        return p->cfg.eviction;
    return (r->flags & WO_PLAN_WRITTEN) ? WO_PLAN_COPY_BACK : WO_PLAN_COLLAPSE;
}

/* Bytes of unit i of r (the last unit may be short). */
static inline uint64_t wo_plan_unit_bytes(const struct prange *r, uint32_t i)
{
    uint64_t off = (uint64_t)i * r->usize;
    return WO_MIN(r->usize, r->size - off);
}

/* plan-queue.c: the units met and the action queue */
int wo_plan_know(struct wo_plan *p, uint32_t id, uint32_t unit);
void wo_plan_add_pend(struct wo_plan *p, uint32_t type, uint32_t id, uint32_t unit, uint64_t key);
void wo_plan_flush(struct wo_plan *p);
/* An action onto the queue as it is (a step's mark): 0 or -ENOMEM. */
int wo_plan_push_action(struct wo_plan *p, const struct wo_plan_action *a);

/* plan-range.c: units and slices */
void wo_plan_learn_slice(struct wo_plan *p, uint32_t id, uint64_t offset);

/* Units used less often than this (accesses a step) are never hot, and
 * count as this rare in the victims' order. */
#define WO_PLAN_MIN_FREQ 0.02

/* Positions until the unit's predicted next use (cyclic), scaled by how
 * rarely it is used: the victim with the largest value is evicted first
 * (Belady's rule on the learned order). */
static inline double wo_plan_next_use_far(const struct wo_plan *p, const struct unit *u)
{
    uint32_t len = p->prev_len ? p->prev_len : WO_MAX(p->pos, 1u);
    double d = u->phase > p->pos ? (double)(u->phase - p->pos)
                                 : (double)u->phase + (double)len - (double)p->pos;

    return d / WO_MAX(u->freq, WO_PLAN_MIN_FREQ);
}

/* plan-hot.c: prediction */
bool wo_plan_load_on_miss(const struct wo_plan *p, const struct prange *r, uint32_t i,
                          const struct unit *u);
void wo_plan_learn_step(struct wo_plan *p, double step_s, unsigned nsteps);
void wo_plan_choose(struct wo_plan *p);
void wo_plan_lookahead(struct wo_plan *p, uint64_t t);
