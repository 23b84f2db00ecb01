/* uvm/plan.c: the prefetch planner (see plan.h and docs/prefetch.md).
 *
 * Units: a managed range is split into units, its natural slices (learned
 * from the offsets launches point at) or granule pieces. Each unit keeps an
 * access frequency (accesses per step, averaged), the bytes an access
 * touches, and its phase (position in the step of its last access).
 *
 * Steps: found by the period of the launch keys (struct wo_stepper, plan.h),
 * no engine help. The unit order of the last complete step is the learned
 * order the lookahead walks.
 *
 * Decisions: at each step boundary the hot set is chosen (greedy knapsack
 * by priority, then saved PCIe time per resident byte, with hysteresis for
 * incumbents) and loaded; during a step, units about to be used are
 * prefetched when cycling them pays (the link has room for it), and a miss
 * loads its unit when the budget has free room. Victims are resident units
 * outside the hot set and the lookahead window, furthest predicted use first.
 * Everything is integer or double arithmetic on event data: deterministic.
 *
 * The planner's files (uvm/plan-int.h holds the state they share): step
 * detection in plan-step.c, ranges and units in plan-range.c, prediction in
 * plan-hot.c, the action queue in plan-queue.c. This one takes the events
 * in: each launch is counted against the units it touched and closes a step
 * at a boundary (its figures, the order learned); and it owns the
 * planner's life and queries. */
#include <string.h>

#include "uvm/plan-int.h"

#include "policy/policy.h"
#include "uvm/graph.h"

#define MAX_STEP_UNITS 65536u /* a step longer than this (no anchor recurrence) is cut */

void wo_plan_cfg_default(struct wo_plan_cfg *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->piece = 64 * WO_MiB;
    cfg->granule = 2 * WO_MiB;
    cfg->lookahead_ranges = 4;
    cfg->hot_set = true;
    cfg->slices = true;
    /* device-facts.md, H100 PCIe Gen5 */
    cfg->costs.hbm_s_per_byte = 1.0 / 2.5e12;
    cfg->costs.zc_s_per_byte = 1.0 / 50e9;
    cfg->costs.prefetch_s_per_byte = 1.0 / 43e9;
    cfg->costs.prefetch_call_s = 90e-6;
    cfg->costs.copyback_s_per_byte = 1.0 / 9.6e9;
    cfg->costs.collapse_s_per_byte = 1.0 / 28e9;
    cfg->costs.remap_s_per_byte = 1.0 / 25e9;
}

void wo_plan_cfg_policy(struct wo_plan_cfg *cfg, const struct wo_policy_globals *g)
{
    cfg->piece = WO_MAX(g->prefetch.piece_size, (uint64_t)WO_PIECE_SIZE_MIN);
    cfg->hot_set = g->prefetch.hot_set;
    if (g->prefetch.lookahead_kind == WO_LOOKAHEAD_BYTES) {
        cfg->lookahead_ranges = 0;
        cfg->lookahead_bytes = WO_MAX(g->prefetch.lookahead, (uint64_t)1);
    } else {
        cfg->lookahead_ranges = (uint32_t)WO_MAX(WO_MIN(g->prefetch.lookahead, UINT32_MAX), 1);
    }
    cfg->eviction = g->prefetch.eviction == WO_EVICT_READ_MOSTLY ? WO_PLAN_COLLAPSE
                    : g->prefetch.eviction == WO_EVICT_COPY_BACK ? WO_PLAN_COPY_BACK
                                                                 : WO_PLAN_HOW_NONE;
}

/* ---- events: launches and step boundaries ------------------------------- */

static int append_order(struct oent **v, size_t *n, size_t *cap, const struct oent *e)
{
    if (*n && (*v)[*n - 1].id == e->id && (*v)[*n - 1].unit == e->unit)
        return 0;
    if (wo_grow((void **)v, cap, *n + 1, sizeof(**v)) < 0)
        return -ENOMEM;
    (*v)[(*n)++] = *e;
    return 0;
}

/* The step's figures: its moves and reads, and the predicted cost of its
 * reads in place against the plan's (the one cost rule's rates). */
static void step_close(struct wo_plan *p)
{
    struct wo_plan_step *c = &p->cur_st;
    const struct wo_plan_costs *k = &p->cfg.costs;

    c->inplace_s = wo_cost_step_s(k, 0, c->hit_bytes + c->miss_bytes, 0, 0, 0, 0);
    c->plan_s = wo_cost_step_s(k, c->hit_bytes, c->miss_bytes, c->in_bytes, c->calls,
                               c->out_bytes - p->cur_copyback, p->cur_copyback);
    p->last_st = *c;
    p->sum_st.in_bytes += c->in_bytes;
    p->sum_st.out_bytes += c->out_bytes;
    p->sum_st.calls += c->calls;
    p->sum_st.hit_bytes += c->hit_bytes;
    p->sum_st.miss_bytes += c->miss_bytes;
    p->sum_st.inplace_s += c->inplace_s;
    p->sum_st.plan_s += c->plan_s;
    p->churn[p->nst % WO_PLAN_CHURN_STEPS] = c->in_bytes;
    p->nst++;
    memset(c, 0, sizeof(*c));
    p->cur_copyback = 0;
}

/* A step ended at event time t (nsteps: the steps it closes, 2 at the
 * first boundary): what it taught is learned, its figures closed, its order
 * becomes the learned one, and what should be resident is chosen anew. */
static void boundary(struct wo_plan *p, uint64_t t, unsigned nsteps)
{
    struct oent *tv;
    size_t tc;
    struct wo_plan_action a = {.type = WO_PLAN_STEP};

    wo_plan_learn_step(p, (double)(t - p->t_step) * 1e-9, nsteps);
    step_close(p);

    tv = p->prev;
    tc = p->capprev;
    p->prev = p->cur;
    p->capprev = p->capcur;
    p->nprev = p->ncur;
    p->cur = tv;
    p->capcur = tc;
    p->ncur = 0;
    p->cursor = 0;
    p->prev_len = p->pos;
    p->prev_ns = t - p->t_step;
    p->pos = 0;
    p->t_step = t;
    p->step++;
    p->elapsed += nsteps;
    a.offset = p->step;
    wo_plan_push_action(p, &a);
    wo_plan_choose(p);
}

static uint32_t min_managed_id(const struct wo_plan *p, const struct wo_event *ev)
{
    uint32_t best = UINT32_MAX;

    for (unsigned i = 0; i < ev->nhits && i < WO_EV_MAX_HITS; i++)
        if (wo_plan_range_get(p, ev->l.hits[i].id, ev->l.hits[i].gen) &&
            wo_hit_pointer_like(&ev->l.hits[i]) && ev->l.hits[i].id < best)
            best = ev->l.hits[i].id;
    return best;
}

static int launch(struct wo_plan *p, const struct wo_event *ev, uint64_t t)
{
    uint32_t aid = min_managed_id(p, ev);
    unsigned ended;
    int ret = 0;

    if (aid == UINT32_MAX)
        return 0;
    if (!p->anchored) {
        p->anchored = 1;
        p->t_step = t;
    }
    ended = wo_stepper_feed(&p->stepper, wo_stepper_key(ev->l.func, aid));
    if (ended || p->ncur >= MAX_STEP_UNITS)
        boundary(p, t, WO_MAX(ended, 1u));
    p->t_last = t;

    for (unsigned h = 0; h < ev->nhits && h < WO_EV_MAX_HITS; h++) {
        const struct wo_ev_hit *hit = &ev->l.hits[h];
        struct prange *r = wo_plan_range_get(p, hit->id, hit->gen);
        uint64_t end;
        uint32_t u0, u1;

        if (!r || !wo_hit_pointer_like(hit)) /* a word that is no weight pointer (core/event.h) */
            continue;
        if (p->cfg.slices && !(r->flags & WO_PLAN_NO_SLICES))
            wo_plan_learn_slice(p, hit->id, hit->offset);
        end = wo_plan_extent_end(r->size, r->slice, hit->offset, hit->hi);
        if (end <= hit->offset)
            continue;
        u0 = (uint32_t)(hit->offset / r->usize);
        u1 = (uint32_t)((end - 1) / r->usize);
        for (uint32_t i = u0; i <= u1 && i < r->nunits; i++) {
            struct unit *u = &r->u[i];
            uint64_t lo = WO_MAX(hit->offset, (uint64_t)i * r->usize);
            uint64_t hi = WO_MIN(end, (uint64_t)i * r->usize + wo_plan_unit_bytes(r, i));
            uint64_t b = hi - lo;
            struct oent e = {p->pos, hit->id, i, t - p->t_step};

            if (wo_plan_know(p, hit->id, i) < 0 ||
                append_order(&p->cur, &p->ncur, &p->capcur, &e) < 0)
                ret = -ENOMEM;
            u->touched = u->touched > 0 ? 0.5 * u->touched + 0.5 * (double)b : (double)b;
            u->cnt++;
            u->phase = p->pos;
            if (u->resident) {
                r->st.hits++;
                r->st.hit_bytes += b;
                p->cur_st.hit_bytes += (double)b;
            } else {
                double miss_s = (double)b * p->cfg.costs.zc_s_per_byte;

                r->st.misses++;
                r->st.miss_bytes += b;
                r->st.stall_s += miss_s - (double)b * p->cfg.costs.hbm_s_per_byte;
                p->step_miss_s += miss_s;
                p->cur_st.miss_bytes += (double)b;
                if (wo_plan_load_on_miss(p, r, i, u))
                    wo_plan_add_pend(p, WO_PLAN_PREFETCH, hit->id, i, 0);
            }
        }
    }
    wo_plan_lookahead(p, t);
    p->pos++;
    wo_plan_flush(p);
    return ret;
}

int wo_plan_event(struct wo_plan *p, const struct wo_event *ev)
{
    const struct wo_event *gl;
    ssize_t n = wo_graphs_expand(p->graphs, ev, &gl);
    int r, ret = 0;

    if (n < 0)
        return (int)n;
    for (ssize_t i = 0; i < n; i++) {
        /* a replayed kernel runs when the graph is launched */
        r = launch(p, &gl[i], ev->t_ns);
        if (r < 0)
            ret = r;
    }
    return ret;
}

int wo_plan_pop(struct wo_plan *p, struct wo_plan_action *ret)
{
    if (p->qhead >= p->qn)
        return 0;
    *ret = p->q[p->qhead++];
    return 1;
}

/* ---- life and queries ----------------------------------------------------- */

int wo_plan_new(const struct wo_plan_cfg *cfg, struct wo_plan **ret)
{
    struct wo_plan *p;

    if (!cfg || cfg->piece < 16 * WO_MiB || cfg->granule == 0 ||
        (cfg->lookahead_ranges == 0 && cfg->lookahead_bytes == 0) ||
        cfg->eviction > WO_PLAN_COPY_BACK || !(cfg->costs.zc_s_per_byte > 0) ||
        !(cfg->costs.prefetch_s_per_byte > 0))
        return -EINVAL;
    p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->cfg = *cfg;
    wo_stepper_init(&p->stepper);
    p->graphs = wo_graphs_new();
    if (!p->graphs) {
        free(p);
        return -ENOMEM;
    }
    *ret = p;
    return 0;
}

void wo_plan_free(struct wo_plan *p)
{
    if (!p)
        return;
    for (uint32_t i = 0; i < p->nr; i++)
        free(p->r[i].u);
    free(p->r);
    free(p->known);
    free(p->prev);
    free(p->cur);
    free(p->pend);
    free(p->q);
    wo_graphs_free(p->graphs);
    wo_stepper_done(&p->stepper);
    free(p);
}

void wo_plan_range_stats(const struct wo_plan *p, uint32_t id, uint32_t gen,
                         struct wo_plan_stats *ret)
{
    const struct prange *r = wo_plan_range_get(p, id, gen);

    if (r)
        *ret = r->st;
    else
        memset(ret, 0, sizeof(*ret));
}

void wo_plan_step_stats(const struct wo_plan *p, struct wo_plan_step *last,
                        struct wo_plan_step *sum, uint64_t *steps)
{
    if (last)
        *last = p->last_st;
    if (sum)
        *sum = p->sum_st;
    if (steps)
        *steps = p->nst;
}

int wo_plan_churn(const struct wo_plan *p, uint64_t *moved)
{
    uint64_t m = 0;

    for (unsigned i = 0; i < WO_PLAN_CHURN_STEPS; i++)
        m += p->churn[i];
    if (moved)
        *moved = m;
    return p->nst >= WO_PLAN_CHURN_STEPS && m > p->cfg.budget;
}

uint64_t wo_plan_resident_bytes(const struct wo_plan *p)
{
    return p->resident_bytes;
}

uint64_t wo_plan_steps(const struct wo_plan *p)
{
    return p->step;
}

int wo_plan_is_resident(const struct wo_plan *p, uint32_t id, uint32_t gen, uint64_t offset,
                        uint64_t bytes)
{
    const struct prange *r = wo_plan_range_get(p, id, gen);

    if (!r || bytes == 0 || offset >= r->size)
        return 0;
    for (uint64_t i = offset / r->usize; i * r->usize < WO_MIN(offset + bytes, r->size); i++)
        if (!r->u[i].resident)
            return 0;
    return 1;
}

uint64_t wo_plan_hot_bytes(const struct wo_plan *p, uint32_t id, uint32_t gen)
{
    const struct prange *r = wo_plan_range_get(p, id, gen);
    uint64_t n = 0;

    for (uint32_t i = 0; r && i < r->nunits; i++)
        if (r->u[i].hot)
            n += wo_plan_unit_bytes(r, i);
    return n;
}

uint32_t wo_plan_range_how(const struct wo_plan *p, uint32_t id, uint32_t gen)
{
    const struct prange *r = wo_plan_range_get(p, id, gen);

    return r ? wo_plan_how(p, r) : WO_PLAN_HOW_NONE;
}
