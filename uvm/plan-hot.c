/* uvm/plan-hot.c: prediction, what should be resident and when. From the
 * per-unit frequencies and the learned order of the last step it answers
 * the planner's questions, each by the one cost rule (uvm/cost.h): which
 * units to keep (the hot set, chosen at each step boundary), which to load
 * ahead of their use (the lookahead), which to load on a miss, and which to
 * drop for room (furthest predicted use first). It decides and queues
 * actions (wo_plan_add_pend); it never changes what a unit or a range is
 * (plan-range.c) and keeps no figures of its own (plan.c). */
#include <math.h>

#include "uvm/plan-int.h"

#define EMA_ALPHA (1.0 / 64)  /* weight of the newest step in the frequency average */
#define HYSTERESIS 1.15       /* a resident hot unit is kept unless a rival reads this much more */
#define SWAP_HORIZON 128.0 /* steps a hot unit is expected to stay: a swap must pay back within */
#define CYCLE_LINK_SHARE 0.8  /* cycling is on when the link is busy less than this share of a step */

/* Frees room for `need` bytes by evicting resident units outside the hot
 * set and the current window (hot units are never victims: the hot set fits
 * the budget by construction). Returns 1 when there is room. */
static int make_room(struct wo_plan *p, uint64_t need)
{
    while (p->resident_bytes + need > p->cfg.budget) {
        double best = -1;
        size_t bi = SIZE_MAX;

        for (size_t i = 0; i < p->nknown; i++) {
            const struct prange *r = &p->r[p->known[i].id];
            const struct unit *u = &r->u[p->known[i].unit];
            double far;

            if (!u->resident || u->mark || u->hot)
                continue;
            far = wo_plan_next_use_far(p, u);
            if (far > best) {
                best = far;
                bi = i;
            }
        }
        if (bi == SIZE_MAX)
            return 0;
        wo_plan_add_pend(p, WO_PLAN_EVICT, p->known[bi].id, p->known[bi].unit, 0);
    }
    return 1;
}

/* The cost rule (uvm/cost.h) for unit u of r: what having it resident for
 * `steps` steps saves, less its move when it is not resident yet (its load
 * and its drop at the end) and the eviction of `evict` bytes of non-hot
 * units its load forces. `reads` is the bytes a step reads from it
 * (accesses per step x bytes per access: read multiplicity counted). */
static double unit_gain(const struct wo_plan *p, const struct prange *r, uint32_t i,
                        const struct unit *u, double reads, double steps, uint64_t evict)
{
    struct wo_cost_move m = {
        .bytes = u->resident ? 0 : wo_plan_unit_bytes(r, i),
        .read_bytes = reads,
        .steps = steps,
        .how = wo_plan_how(p, r),
        .evict_bytes = u->resident ? 0 : evict,
        .evict_how = wo_plan_how(p, r),
        .calls = u->resident ? 0u : 1u,
    };

    return wo_cost_gain_s(&p->cfg.costs, &m);
}

/* Bytes a step reads from u, by its averaged frequency (or, for a unit
 * too young to have one, this step's accesses so far). */
static double unit_reads(const struct unit *u)
{
    return WO_MAX(u->freq, (double)u->cnt) * u->touched;
}

/* A launch missed unit i of r (not resident): load it now? Free room is
 * free (no eviction forced): a missed unit will likely be used again, if
 * its reads pay for its load. */
bool wo_plan_load_on_miss(const struct wo_plan *p, const struct prange *r, uint32_t i,
                          const struct unit *u)
{
    return p->resident_bytes + wo_plan_unit_bytes(r, i) <= p->cfg.budget &&
           (!p->hot_valid || u->hot || !p->cycle_ok) &&
           (u->hot || unit_gain(p, r, i, u, unit_reads(u), SWAP_HORIZON / 2, 0) > 0);
}

/* A non-hot unit cycled through this step (prefetched before its use,
 * dropped after): its reads this step (at least one access; several when
 * a step reads it several times) against its load, its drop and the room
 * it takes from others when the budget is full. Read once, it never pays:
 * a load and a collapse cost ~3x an in-place read (device-facts.md). */
static bool cycle_pays(const struct wo_plan *p, const struct prange *r, uint32_t i,
                       const struct unit *u)
{
    uint64_t b = wo_plan_unit_bytes(r, i);
    uint64_t evict = p->resident_bytes + b > p->cfg.budget ? b : 0;

    return unit_gain(p, r, i, u, WO_MAX(u->freq, 1.0) * u->touched, 1, evict) > 0;
}

struct cand {
    double key;
    int prio;
    uint32_t id, unit;
};

static int cand_cmp(const void *a, const void *b)
{
    const struct cand *x = a, *y = b;

    if (x->prio != y->prio)
        return x->prio > y->prio ? -1 : 1;
    if (x->key != y->key)
        return x->key > y->key ? -1 : 1;
    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    return x->unit < y->unit ? -1 : x->unit > y->unit;
}

/* The hot set: the units whose residency saves the most link time per
 * resident byte, within the budget less the lookahead reserve. */
static void choose_hot(struct wo_plan *p)
{
    uint64_t cap = p->cfg.budget, used = 0;
    struct cand *c;
    size_t n = 0;

    if (p->cycle_ok)
        cap -= cap / 4; /* room for units cycled through the lookahead (when it pays) */
    c = malloc((p->nknown ? p->nknown : 1) * sizeof(*c));
    if (!c)
        return; /* keep the old hot set */
    for (size_t i = 0; i < p->nknown; i++) {
        struct prange *r = &p->r[p->known[i].id];
        uint32_t ui = p->known[i].unit;
        struct unit *u = &r->u[ui];
        double reads = u->freq * u->touched, gain;

        u->hot = 0;
        if (u->freq < WO_PLAN_MIN_FREQ)
            continue;
        /* The cost rule: a unit is hot when residency over the horizon
         * saves more than moving it costs. An incumbent's move is paid, a
         * rival's is not, and an incumbent's reads count HYSTERESIS times:
         * a rival displaces it only when it reads that much more and pays
         * for the swap within the horizon. Frequencies are noisy (a
         * uniform router gives every expert the same rate up to
         * sampling), and a hot set that follows the noise cycles experts
         * through the GPU at ~3x the cost of reading them in place. */
        if (u->resident)
            reads *= HYSTERESIS;
        else if (unit_gain(p, r, ui, u, reads, SWAP_HORIZON / 2, 0) <= 0)
            continue; /* too rare to pay for its load within half the horizon */
        gain = unit_gain(p, r, ui, u, reads, SWAP_HORIZON, 0);
        if (gain <= 0)
            continue;
        c[n++] = (struct cand){gain / (double)wo_plan_unit_bytes(r, ui), r->prio, p->known[i].id, ui};
    }
    qsort(c, n, sizeof(*c), cand_cmp);
    for (size_t i = 0; i < n; i++) {
        struct prange *r = &p->r[c[i].id];
        uint64_t b = wo_plan_unit_bytes(r, c[i].unit);

        if (used + b > cap)
            continue;
        used += b;
        r->u[c[i].unit].hot = 1;
    }
    free(c);
    p->hot_valid = 1;
}

/* Loads the hot units that are not resident, those used soonest first. */
static void load_hot(struct wo_plan *p)
{
    for (size_t i = 0; i < p->nknown; i++) {
        struct prange *r = &p->r[p->known[i].id];
        struct unit *u = &r->u[p->known[i].unit];
        uint64_t b = wo_plan_unit_bytes(r, p->known[i].unit);

        if (!u->hot || u->resident)
            continue;
        if (!make_room(p, b))
            continue;
        wo_plan_add_pend(p, WO_PLAN_PREFETCH, p->known[i].id, p->known[i].unit,
                 (uint64_t)(wo_plan_next_use_far(p, u) * 1024));
    }
}

/* Free room is free: fill it with the units not yet resident (those never
 * touched included: at a budget that holds every unit a decode will use,
 * this turns the first use of a rare expert into a hit). Lowest range id
 * first, whole pieces; they are the first victims when room is needed. */
static void fill_free(struct wo_plan *p)
{
    for (uint32_t id = 0; id < p->nr; id++) {
        struct prange *r = &p->r[id];

        if (!r->live)
            continue;
        for (uint32_t i = 0; i < r->nunits; i++) {
            uint64_t b = wo_plan_unit_bytes(r, i);

            if (r->u[i].resident || p->resident_bytes + b > p->cfg.budget)
                continue;
            if (wo_plan_know(p, id, i) < 0)
                return;
            wo_plan_add_pend(p, WO_PLAN_PREFETCH, id, i, UINT64_MAX / 2);
        }
    }
}

/* At a step boundary (the step took step_s on the event clock and closes
 * nsteps steps): folds its counts into the frequencies and decides whether
 * cycling non-hot units pays from now on. */
void wo_plan_learn_step(struct wo_plan *p, double step_s, unsigned nsteps)
{
    double cyc_s = 0;
    int pays = 0;

    /* fold this step's counts into the frequencies; cost of cycling the
     * non-hot units this step touched */
    for (size_t i = 0; i < p->nknown; i++) {
        struct prange *r = &p->r[p->known[i].id];
        struct unit *u = &r->u[p->known[i].unit];

        if (u->cnt && !u->hot) {
            cyc_s += (double)wo_plan_unit_bytes(r, p->known[i].unit) *
                     (p->cfg.costs.prefetch_s_per_byte +
                      wo_cost_drop_s_per_byte(&p->cfg.costs, wo_plan_how(p, r)));
            if (!pays && !u->resident) {
                struct unit v = *u;

                v.freq = (double)u->cnt; /* this step's reads of it */
                pays = cycle_pays(p, r, p->known[i].unit, &v);
            }
        }
        {
            /* a running mean while young, then an average over the last
             * ~1/EMA_ALPHA steps: routing is stationary over a decode, and
             * a short memory makes the hot set churn (every swap costs a
             * load and an eviction) */
            double w;

            u->age += nsteps;
            w = WO_MAX((double)nsteps / u->age, EMA_ALPHA);
            u->freq = (1 - w) * u->freq + w * (double)u->cnt / nsteps;
        }
        u->cnt = 0;
    }
    /* Cycling (prefetch before use, evict after) pays only when the link
     * has room for it beside the misses it would replace; decode at batch 1
     * is link-bound, so this is usually off there (device-facts.md). */
    {
        /* with a margin both ways, so it does not flip every step (each
         * flip moves the hot set's share of the budget) */
        double share = step_s > 0 ? (p->step_miss_s + p->step_pref_s + cyc_s) / step_s : INFINITY;

        p->cycle_ok = p->cycle_ok ? share < CYCLE_LINK_SHARE : share < CYCLE_LINK_SHARE * 0.75;
        /* and only when some unit this step was read often enough to pay
         * for its cycle (the cost rule): else the quarter of the budget it
         * would hold back is better spent on the hot set */
        p->cycle_pays = pays;
        p->cycle_ok = p->cycle_ok && pays;
    }
    p->step_miss_s = p->step_pref_s = 0;
}

/* At a step boundary: the hot set chosen and loaded, then free room filled
 * (unless cycling holds it back). */
void wo_plan_choose(struct wo_plan *p)
{
    if (p->cfg.hot_set) {
        choose_hot(p);
        load_hot(p);
    }
    if (!p->cycle_ok)
        fill_free(p);
}

/* Prefetches units of the learned order ahead of pos: at least the
 * configured lookahead, and far enough ahead (event clock) to cover the
 * transfer time of what it queued. */
void wo_plan_lookahead(struct wo_plan *p, uint64_t t)
{
    uint64_t bytes = 0, now_rel = t - p->t_step;
    double need_s = 0;
    size_t count = 0, walked = 0;

    if (p->nprev == 0)
        return;
    while (p->cursor < p->nprev && p->prev[p->cursor].pos <= p->pos)
        p->cursor++;
    for (size_t k = p->cursor; walked < p->nprev; walked++, k++) {
        const struct oent *e;
        struct prange *r;
        struct unit *u;
        uint64_t b, ahead_ns;
        int wrapped = k >= p->nprev;

        e = &p->prev[wrapped ? k - p->nprev : k];
        if (!p->r[e->id].live || e->unit >= p->r[e->id].nunits)
            continue;
        r = &p->r[e->id];
        u = &r->u[e->unit];
        ahead_ns = wrapped ? e->t_rel + p->prev_ns - WO_MIN(now_rel, p->prev_ns)
                           : (e->t_rel > now_rel ? e->t_rel - now_rel : 0);
        if (p->cfg.lookahead_ranges ? count >= p->cfg.lookahead_ranges
                                    : bytes >= p->cfg.lookahead_bytes) {
            /* past the configured window: go on only while the queued
             * transfers would not finish before these uses */
            if ((double)ahead_ns * 1e-9 >= need_s)
                break;
        }
        count++;
        b = wo_plan_unit_bytes(r, e->unit);
        bytes += b;
        u->mark = 1;
        if (u->resident)
            continue;
        if (!u->hot && !(p->cycle_ok || !p->cfg.hot_set))
            continue;
        if (!u->hot && !cycle_pays(p, r, e->unit, u))
            continue; /* the cost rule: read in place rather than cycled */
        if (!make_room(p, b))
            continue;
        wo_plan_add_pend(p, WO_PLAN_PREFETCH, e->id, e->unit, ahead_ns);
        need_s += p->cfg.costs.prefetch_call_s + (double)b * p->cfg.costs.prefetch_s_per_byte;
    }
    for (size_t i = 0; i < p->nknown; i++)
        p->r[p->known[i].id].u[p->known[i].unit].mark = 0;
}
