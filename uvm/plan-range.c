/* uvm/plan-range.c: the ranges the planner may move and the units it splits
 * them into. A range starts as one unit; the offsets launches point at
 * teach its natural slice (the gcd of the non-zero ones: one expert of a
 * stacked tensor), and the units shrink to it, keeping the state they had.
 * Kept apart from prediction because what a unit is (its bytes, its
 * residency, its place in the lists) must stay consistent whatever the
 * prediction decides; the budget is held here for the same reason: after a
 * resize, or when the budget shrinks, residency is cut back at once. */
#include <string.h>

#include "uvm/plan-int.h"

uint64_t wo_plan_gcd(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

uint64_t wo_plan_slice_learn(uint64_t slice, uint64_t offset)
{
    if (offset == 0)
        return slice;
    return slice ? wo_plan_gcd(slice, offset) : offset;
}

uint64_t wo_plan_extent_end(uint64_t range_size, uint64_t slice, uint64_t offset, uint64_t hi)
{
    uint64_t end;

    if (offset >= range_size)
        return range_size;
    end = slice ? offset + slice : range_size;
    if (end < offset) /* wrapped */
        end = range_size;
    if (hi > end)
        end = hi;
    return WO_MIN(end, range_size);
}

static uint64_t unit_size_for(const struct wo_plan *p, const struct prange *r, uint64_t slice)
{
    if (!p->cfg.slices || (r->flags & WO_PLAN_NO_SLICES) || slice == 0 || slice >= r->size)
        return r->size;
    return slice >= p->cfg.granule ? slice : p->cfg.granule;
}

static void range_clear(struct prange *r)
{
    free(r->u);
    memset(r, 0, sizeof(*r));
}

int wo_plan_range_add(struct wo_plan *p, uint32_t id, uint32_t gen, uint64_t size,
                      uint32_t flags, int priority)
{
    struct prange *r;

    if (size == 0)
        return -EINVAL;
    if (id >= p->nr) {
        uint32_t n = WO_MAX(id + 1, p->nr * 2);
        struct prange *nr = realloc(p->r, (size_t)n * sizeof(*nr));

        if (!nr)
            return -ENOMEM;
        memset(nr + p->nr, 0, (size_t)(n - p->nr) * sizeof(*nr));
        p->r = nr;
        p->nr = n;
    }
    if (p->r[id].live)
        wo_plan_range_remove(p, id, p->r[id].gen);
    r = &p->r[id];
    r->size = size;
    r->flags = flags;
    r->prio = priority;
    r->gen = gen;
    r->usize = unit_size_for(p, r, 0);
    r->nunits = (uint32_t)((size + r->usize - 1) / r->usize);
    r->u = calloc(r->nunits, sizeof(*r->u));
    if (!r->u) {
        range_clear(r);
        return -ENOMEM;
    }
    r->live = 1;
    return 0;
}

/* Keeps the items of v[0..n) whose id is not id, in order. */
#define DROP_ID(v, n, id)                                                                          \
    do {                                                                                           \
        size_t j_ = 0;                                                                             \
        for (size_t i_ = 0; i_ < (n); i_++)                                                        \
            if ((v)[i_].id != (id))                                                                \
                (v)[j_++] = (v)[i_];                                                               \
        (n) = j_;                                                                                  \
    } while (0)

/* Drops every reference to range id from the lists (before it changes). */
static void forget_refs(struct wo_plan *p, uint32_t id)
{
    DROP_ID(p->known, p->nknown, id);
    DROP_ID(p->prev, p->nprev, id);
    p->cursor = WO_MIN(p->cursor, p->nprev);
    DROP_ID(p->cur, p->ncur, id);
    DROP_ID(p->pend, p->npend, id);
}

void wo_plan_range_remove(struct wo_plan *p, uint32_t id, uint32_t gen)
{
    struct prange *r = wo_plan_range_get(p, id, gen);

    if (!r)
        return;
    for (uint32_t i = 0; i < r->nunits; i++)
        if (r->u[i].resident)
            p->resident_bytes -= wo_plan_unit_bytes(r, i);
    forget_refs(p, id);
    range_clear(r);
}

void wo_plan_range_written(struct wo_plan *p, uint32_t id, uint32_t gen)
{
    struct prange *r = wo_plan_range_get(p, id, gen);

    if (r)
        r->flags |= WO_PLAN_WRITTEN;
}

static void unit_map_list(struct oent *v, size_t n, uint32_t id, uint64_t ous, uint64_t nus)
{
    for (size_t i = 0; i < n; i++)
        if (v[i].id == id)
            v[i].unit = (uint32_t)((uint64_t)v[i].unit * ous / nus);
}

/* The unit size of r changes (a finer slice was learned): new units inherit
 * the state of the old unit holding their start, so frequencies and
 * residency carry over. Returns 0 or -ENOMEM (r unchanged). */
static int range_resize(struct wo_plan *p, uint32_t id, uint64_t nus)
{
    struct prange *r = &p->r[id];
    uint64_t ous = r->usize;
    uint32_t nn = (uint32_t)((r->size + nus - 1) / nus);
    struct unit *nu = calloc(nn, sizeof(*nu));
    size_t j;

    if (!nu)
        return -ENOMEM;
    /* pending actions name old units: emit them first (in bytes they stay
     * right) */
    wo_plan_flush(p);
    for (uint32_t i = 0; i < r->nunits; i++)
        if (r->u[i].resident)
            p->resident_bytes -= wo_plan_unit_bytes(r, i);
    for (uint32_t i = 0; i < nn; i++) {
        const struct unit *o = &r->u[(uint64_t)i * nus / ous];

        nu[i] = *o;
        nu[i].known = 0;
        nu[i].mark = 0;
        /* an access of the old unit touched all of it, now a slice's worth */
        nu[i].touched = WO_MIN(o->touched, (double)nus);
    }
    free(r->u);
    r->u = nu;
    r->nunits = nn;
    r->usize = nus;
    for (uint32_t i = 0; i < nn; i++)
        if (r->u[i].resident)
            p->resident_bytes += wo_plan_unit_bytes(r, i);
    /* known list: re-add every unit of the range with a history */
    j = 0;
    for (size_t i = 0; i < p->nknown; i++)
        if (p->known[i].id != id)
            p->known[j++] = p->known[i];
    p->nknown = j;
    for (uint32_t i = 0; i < nn; i++) {
        if (nu[i].freq <= 0 && nu[i].cnt == 0 && !nu[i].resident)
            continue;
        if (wo_grow((void **)&p->known, &p->capknown, p->nknown + 1, sizeof(*p->known)) < 0)
            break; /* it is re-added on its next access */
        p->known[p->nknown++] = (struct uref){id, i};
        nu[i].known = 1;
    }
    unit_map_list(p->prev, p->nprev, id, ous, nus);
    unit_map_list(p->cur, p->ncur, id, ous, nus);
    return 0;
}

/* After a resize the inherited residency can exceed the budget by the units
 * that straddled an old boundary, and a smaller budget (wo_plan_set_budget)
 * can leave more resident than it holds: evict, furthest predicted use
 * first, hot or not, until it holds. */
static void enforce_budget(struct wo_plan *p)
{
    while (p->resident_bytes > p->cfg.budget) {
        size_t bi = SIZE_MAX;
        double best = -1;

        for (size_t i = 0; i < p->nknown; i++) {
            const struct unit *u = &p->r[p->known[i].id].u[p->known[i].unit];
            double far;

            if (!u->resident)
                continue;
            far = wo_plan_next_use_far(p, u) + (u->hot ? 0 : 1e18);
            if (far > best) {
                best = far;
                bi = i;
            }
        }
        if (bi == SIZE_MAX)
            return;
        wo_plan_add_pend(p, WO_PLAN_EVICT, p->known[bi].id, p->known[bi].unit, 0);
    }
}

/* Learns the slice from a hit offset; resizes the units when it shrinks. */
void wo_plan_learn_slice(struct wo_plan *p, uint32_t id, uint64_t offset)
{
    struct prange *r = &p->r[id];
    uint64_t s, nus;

    if (offset == 0 || offset >= r->size)
        return;
    s = wo_plan_slice_learn(r->slice, offset);
    if (s == r->slice)
        return;
    r->slice = s;
    nus = unit_size_for(p, r, s);
    if (nus < r->usize && range_resize(p, id, nus) == 0)
        enforce_budget(p);
}

void wo_plan_set_budget(struct wo_plan *p, uint64_t budget)
{
    p->cfg.budget = budget;
    enforce_budget(p);
}
