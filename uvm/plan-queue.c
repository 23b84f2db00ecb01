/* uvm/plan-queue.c: the planner's ground floor (uvm/plan-int.h): the units
 * it has met (wo_plan_know) and its action queue: pending unit actions
 * (wo_plan_add_pend, from the events, the hot set and the budget)
 * coalesced into pieces, widened into free room and emitted evictions first
 * (wo_plan_flush), and the queue the prefetcher pops. Deterministic, as the
 * whole planner: no driver call, no clock. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "uvm/plan-int.h"

/* Lists a unit the planner has met (p->known: what the step fold, the hot
 * set and the victim search walk). 0 or -ENOMEM. */
int wo_plan_know(struct wo_plan *p, uint32_t id, uint32_t unit)
{
    struct unit *u = &p->r[id].u[unit];

    if (u->known)
        return 0;
    if (wo_grow((void **)&p->known, &p->capknown, p->nknown + 1, sizeof(*p->known)) < 0)
        return -ENOMEM;
    p->known[p->nknown++] = (struct uref){id, unit};
    u->known = 1;
    /* unused in every step so far: a unit first seen late is rare, not
     * (as a running mean from its first use would say) always used */
    u->age = (uint32_t)WO_MIN(p->elapsed, (uint64_t)UINT32_MAX / 2);
    return 0;
}

/* ---- actions ---------------------------------------------------------- */

/* Queues a unit action (key: its urgency, lower first) and changes the
 * unit's state now: the planner's books run ahead of the queue, so the
 * decisions that follow see the room this one took or freed. */
void wo_plan_add_pend(struct wo_plan *p, uint32_t type, uint32_t id, uint32_t unit, uint64_t key)
{
    struct prange *r = &p->r[id];
    struct unit *u = &r->u[unit];
    uint64_t b = wo_plan_unit_bytes(r, unit);

    if (wo_grow((void **)&p->pend, &p->cappend, p->npend + 1, sizeof(*p->pend)) < 0)
        return; /* not done: the state below stays as it was */
    p->pend[p->npend++] = (struct pend){type, id, unit, key};
    if (type == WO_PLAN_PREFETCH) {
        u->resident = 1;
        p->resident_bytes += b;
        r->st.prefetched += b;
        p->step_pref_s += (double)b * p->cfg.costs.prefetch_s_per_byte;
    } else {
        u->resident = 0;
        p->resident_bytes -= b;
        r->st.evicted += b;
    }
}

static int pend_cmp(const void *a, const void *b)
{
    const struct pend *x = a, *y = b;

    if (x->type != y->type)
        return x->type == WO_PLAN_EVICT ? -1 : 1; /* evictions free room first */
    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    return x->unit < y->unit ? -1 : x->unit > y->unit;
}

int wo_plan_push_action(struct wo_plan *p, const struct wo_plan_action *a)
{
    if (a->type == WO_PLAN_PREFETCH) {
        p->cur_st.in_bytes += a->bytes;
        p->cur_st.calls++;
    } else if (a->type == WO_PLAN_EVICT) {
        p->cur_st.out_bytes += a->bytes;
        if (a->how == WO_PLAN_COPY_BACK)
            p->cur_copyback += a->bytes;
    }
    if (p->qhead > 0 && p->qhead == p->qn) {
        p->qhead = p->qn = 0;
    }
    if (wo_grow((void **)&p->q, &p->qcap, p->qn + 1, sizeof(*p->q)) < 0)
        return -ENOMEM;
    p->q[p->qn++] = *a;
    return 0;
}

struct run {
    struct wo_plan_action a;
    uint64_t key;
};

static int run_cmp(const void *a, const void *b)
{
    const struct run *x = a, *y = b;

    if (x->a.type != y->a.type)
        return x->a.type == WO_PLAN_EVICT ? -1 : 1;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    if (x->a.id != y->a.id)
        return x->a.id < y->a.id ? -1 : 1;
    return x->a.offset < y->a.offset ? -1 : x->a.offset > y->a.offset;
}

/* Takes one more unit into a prefetch being built (free room only). */
static bool widen_unit(struct wo_plan *p, struct prange *r, uint32_t id, uint64_t u)
{
    uint64_t b;

    if (u >= r->nunits || r->u[u].resident)
        return false;
    b = wo_plan_unit_bytes(r, (uint32_t)u);
    if (p->resident_bytes + b > p->cfg.budget || wo_plan_know(p, id, (uint32_t)u) < 0)
        return false;
    r->u[u].resident = 1;
    p->resident_bytes += b;
    r->st.prefetched += b;
    p->step_pref_s += (double)b * p->cfg.costs.prefetch_s_per_byte;
    return true;
}

/* A prefetch smaller than the piece size costs a call's ~100 us for little:
 * while the budget has free room, grow it over the neighbouring units of
 * the range that are not resident (forward, then back) up to the piece. They
 * are not hot, so they are the first victims when room is needed. */
static void widen(struct wo_plan *p, struct wo_plan_action *a)
{
    struct prange *r = &p->r[a->id];

    while (a->bytes < p->cfg.piece &&
           widen_unit(p, r, a->id, (a->offset + a->bytes + r->usize - 1) / r->usize))
        a->bytes = WO_MIN(a->bytes + r->usize, r->size - a->offset);
    while (a->bytes < p->cfg.piece && a->offset >= r->usize &&
           widen_unit(p, r, a->id, a->offset / r->usize - 1)) {
        a->offset -= r->usize;
        a->bytes += r->usize;
    }
}

/* Turns the pending unit actions into coalesced pieces: adjacent units of
 * one range become one call (a call costs ~100 us of CPU whatever its size),
 * evictions first, then prefetches most urgent first. */
void wo_plan_flush(struct wo_plan *p)
{
    struct run *runs;
    size_t nruns = 0;

    if (p->npend == 0)
        return;
    qsort(p->pend, p->npend, sizeof(*p->pend), pend_cmp);
    runs = malloc(p->npend * sizeof(*runs));
    if (!runs) {
        /* degrade to one action per unit, unsorted by urgency */
        for (size_t i = 0; i < p->npend; i++) {
            const struct pend *e = &p->pend[i];
            const struct prange *r = &p->r[e->id];
            struct wo_plan_action a = {e->type, wo_plan_how(p, r), e->id, r->gen,
                                       (uint64_t)e->unit * r->usize,
                                       wo_plan_unit_bytes(r, e->unit)};

            wo_plan_push_action(p, &a);
        }
        p->npend = 0;
        return;
    }
    for (size_t i = 0; i < p->npend; i++) {
        const struct pend *e = &p->pend[i];
        const struct prange *r = &p->r[e->id];
        uint64_t off = (uint64_t)e->unit * r->usize;
        struct run *last = nruns ? &runs[nruns - 1] : NULL;

        if (last && last->a.type == e->type && last->a.id == e->id &&
            last->a.offset + last->a.bytes == off) {
            last->a.bytes += wo_plan_unit_bytes(r, e->unit);
            last->key = WO_MIN(last->key, e->key);
            continue;
        }
        runs[nruns++] = (struct run){{e->type, wo_plan_how(p, r), e->id, r->gen, off,
                                      wo_plan_unit_bytes(r, e->unit)},
                                     e->key};
    }
    for (size_t i = 0; i < nruns; i++)
        if (runs[i].a.type == WO_PLAN_PREFETCH)
            widen(p, &runs[i].a);
    qsort(runs, nruns, sizeof(*runs), run_cmp);
    for (size_t i = 0; i < nruns; i++) {
        struct prange *r = &p->r[runs[i].a.id];

        if (runs[i].a.type == WO_PLAN_PREFETCH)
            r->st.prefetches++;
        else
            r->st.evictions++;
        wo_plan_push_action(p, &runs[i].a);
    }
    free(runs);
    p->npend = 0;
}
