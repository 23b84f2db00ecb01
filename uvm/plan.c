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
 * Everything is integer or double arithmetic on event data: deterministic. */
#include <math.h>
#include <string.h>

#include "uvm/plan.h"

#include "policy/policy.h"
#include "uvm/graph.h"

#define EMA_ALPHA (1.0 / 64)  /* weight of the newest step in the frequency average */
#define HYSTERESIS 1.15       /* a resident hot unit is kept unless a rival reads this much more */
#define SWAP_HORIZON 128.0 /* steps a hot unit is expected to stay: a swap must pay back within */
#define MIN_FREQ 0.02         /* units used less often than this are never hot */
#define MAX_STEP_UNITS 65536u /* a step longer than this (no anchor recurrence) is cut */
#define CYCLE_LINK_SHARE 0.8  /* cycling is on when the link is busy less than this share of a step */

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

/* ---- small helpers ------------------------------------------------------ */

uint64_t wo_plan_gcd(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
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

/* ---- step detection ------------------------------------------------------- */

void wo_stepper_init(struct wo_stepper *s)
{
    memset(s, 0, sizeof(*s));
}

void wo_stepper_done(struct wo_stepper *s)
{
    free(s->gaps);
    free(s->keys);
    free(s->cand);
    memset(s, 0, sizeof(*s));
}

uint64_t wo_stepper_key(uint64_t func, uint32_t id)
{
    /* splitmix64 finaliser: keys only need to differ, not to be secret */
    uint64_t x = func ^ ((uint64_t)id << 32 | id);

    x ^= x >> 30;
    x *= UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x *= UINT64_C(0x94d049bb133111eb);
    return x ^ (x >> 31);
}

/* The regular-gap rule (plan.h): 1 when key just became the anchor. */
static int stepper_gap(struct wo_stepper *s, uint64_t key)
{
    struct wo_stepgap *e = NULL;
    uint64_t g;

    if (!s->gaps && !(s->gaps = calloc(WO_STEPPER_GAPS, sizeof(*s->gaps))))
        return 0;
    for (uint32_t k = 0; k < 8; k++) {
        struct wo_stepgap *c = &s->gaps[(key + k) & (WO_STEPPER_GAPS - 1)];
        if (c->last && c->key == key) {
            e = c;
            break;
        }
        if (!c->last) {
            c->key = key;
            c->last = c->start = s->pos;
            return 0;
        }
    }
    if (!e)
        return 0; /* table crowded around this key: it cannot be the anchor */
    if (s->pos - e->last < WO_STEPPER_GAP_MIN) {
        e->last = s->pos; /* a repeat inside a cluster */
        return 0;
    }
    g = s->pos - e->start;
    e->last = e->start = s->pos;
    if (e->gap && g >= WO_STEPPER_GAP_MIN && g * 10 >= (uint64_t)e->gap * 9 &&
        g * 10 <= (uint64_t)e->gap * 11)
        e->runs++;
    else
        e->runs = 0;
    e->gap = (uint32_t)WO_MIN(g, (uint64_t)UINT32_MAX);
    return e->runs >= WO_STEPPER_GAP_RUNS;
}

unsigned wo_stepper_feed(struct wo_stepper *s, uint64_t key)
{
    size_t i, j;

    s->pos++;
    if (!s->per_step && stepper_gap(s, key)) {
        /* this occurrence of the anchor is the first boundary; like the
         * exact rule's, it closes two steps (the anchor has recurred at
         * regular gaps at least three times before it) */
        s->anchor = key;
        s->clusters = true;
        s->anchor_last = s->last_boundary = s->pos;
        s->per_step = 1;
        s->seen = 0;
        s->steps = 1;
        free(s->keys);
        s->keys = NULL;
        s->n = s->cap = 0;
        s->ncand = 0;
        free(s->gaps);
        s->gaps = NULL;
        return 2;
    }
    if (s->per_step && key != s->anchor &&
        s->pos - s->anchor_last > WO_MAX((uint64_t)WO_STEPPER_PATIENCE, 4 * s->step_keys)) {
        /* The anchor belonged to a phase that is over (a prefill's
         * per-expert loop, whose kernels the decode never launches): find
         * the steps again from here. */
        s->per_step = 0;
        s->clusters = false;
        s->seen = 0;
        s->steps = 0;
        s->n = 0;
        s->ncand = 0;
        s->step_keys = 0;
    }
    if (s->per_step) {
        if (key != s->anchor)
            return 0;
        if (!s->clusters)
            s->anchor_last = s->pos;
        if (s->clusters) {
            /* one cluster of the anchor per step: its first occurrence */
            bool inner = s->pos - s->anchor_last < WO_STEPPER_GAP_MIN;

            s->anchor_last = s->pos;
            if (inner)
                return 0;
        }
        if (++s->seen < s->per_step)
            return 0;
        s->seen = 0;
        s->steps++;
        s->step_keys = s->pos - s->last_boundary;
        s->last_boundary = s->pos;
        return s->steps == 1 ? 2 : 1;
    }
    if (s->n >= WO_STEPPER_MAX) {
        s->n = 0; /* no period: start over, this key is the new anchor */
        s->ncand = 0;
    }
    if (s->n && !s->ncand && s->n - s->last_anchor >= WO_MAX(s->patience, (size_t)WO_STEPPER_PATIENCE)) {
        /* the anchor has not come back for a long while and nothing is
         * matching: it belonged to a phase that is over (a prefill before
         * the decode steps). Start over from this key, with more patience
         * next time in case steps are simply long. */
        s->patience = WO_MIN(WO_MAX(s->patience, (size_t)WO_STEPPER_PATIENCE) * 2, (size_t)WO_STEPPER_MAX);
        s->n = 0;
    }
    if (wo_grow((void **)&s->keys, &s->cap, s->n + 1, sizeof(*s->keys)) < 0)
        return 0; /* learns nothing from this key; later keys try again */
    i = s->n;
    s->keys[s->n++] = key;
    if (i == 0) {
        s->anchor = key;
        s->last_anchor = 0;
        return 0;
    }
    /* survivors: key i equals key i - P */
    for (size_t c = j = 0; c < s->ncand; c++)
        if (s->keys[i - s->cand[c]] == key)
            s->cand[j++] = s->cand[c];
    s->ncand = j;
    if (key == s->anchor) {
        s->last_anchor = i;
        if (wo_grow((void **)&s->cand, &s->capcand, s->ncand + 1, sizeof(*s->cand)) == 0)
            s->cand[s->ncand++] = i;
    }
    /* the shortest candidate that matched long enough wins */
    for (size_t c = 0; c < s->ncand; c++) {
        size_t P = s->cand[c];

        /* a repeat inside a step (top-k experts of one layer launch the
         * same keys k times) matches a short second period too: a period
         * must also hold for WO_STEPPER_MIN_MATCH keys past its first */
        if (i + 1 < 2 * P || i + 1 < P + WO_STEPPER_MIN_MATCH)
            continue;
        s->per_step = 0;
        for (size_t k = 0; k < P; k++)
            s->per_step += s->keys[k] == s->anchor;
        s->seen = s->per_step - 1; /* the next anchor is a boundary */
        s->anchor_last = s->last_boundary = s->pos;
        free(s->keys);
        s->keys = NULL;
        s->n = s->cap = 0;
        s->ncand = 0;
        return 0;
    }
    return 0;
}

/* ---- ranges and units ------------------------------------------------ */

static struct prange *range_get(const struct wo_plan *p, uint32_t id, uint32_t gen)
{
    if (id >= p->nr || !p->r[id].live || p->r[id].gen != gen)
        return NULL;
    return &p->r[id];
}

static uint32_t range_how(const struct wo_plan *p, const struct prange *r)
{
    if (p->cfg.eviction != WO_PLAN_HOW_NONE)
        return p->cfg.eviction;
    return (r->flags & WO_PLAN_WRITTEN) ? WO_PLAN_COPY_BACK : WO_PLAN_COLLAPSE;
}

static uint64_t unit_size_for(const struct wo_plan *p, const struct prange *r, uint64_t slice)
{
    if (!p->cfg.slices || (r->flags & WO_PLAN_NO_SLICES) || slice == 0 || slice >= r->size)
        return r->size;
    return slice >= p->cfg.granule ? slice : p->cfg.granule;
}

static uint64_t unit_bytes(const struct prange *r, uint32_t i)
{
    uint64_t off = (uint64_t)i * r->usize;
    return WO_MIN(r->usize, r->size - off);
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

/* Drops every reference to range id from the lists (before it changes). */
static void forget_refs(struct wo_plan *p, uint32_t id)
{
    size_t j = 0;

    for (size_t i = 0; i < p->nknown; i++)
        if (p->known[i].id != id)
            p->known[j++] = p->known[i];
    p->nknown = j;
    j = 0;
    for (size_t i = 0; i < p->nprev; i++)
        if (p->prev[i].id != id)
            p->prev[j++] = p->prev[i];
    p->nprev = j;
    p->cursor = WO_MIN(p->cursor, p->nprev);
    j = 0;
    for (size_t i = 0; i < p->ncur; i++)
        if (p->cur[i].id != id)
            p->cur[j++] = p->cur[i];
    p->ncur = j;
    j = 0;
    for (size_t i = 0; i < p->npend; i++)
        if (p->pend[i].id != id)
            p->pend[j++] = p->pend[i];
    p->npend = j;
}

void wo_plan_range_remove(struct wo_plan *p, uint32_t id, uint32_t gen)
{
    struct prange *r = range_get(p, id, gen);

    if (!r)
        return;
    for (uint32_t i = 0; i < r->nunits; i++)
        if (r->u[i].resident)
            p->resident_bytes -= unit_bytes(r, i);
    forget_refs(p, id);
    range_clear(r);
}

void wo_plan_range_written(struct wo_plan *p, uint32_t id, uint32_t gen)
{
    struct prange *r = range_get(p, id, gen);

    if (r)
        r->flags |= WO_PLAN_WRITTEN;
}

static void unit_map_list(struct oent *v, size_t n, uint32_t id, uint64_t ous, uint64_t nus)
{
    for (size_t i = 0; i < n; i++)
        if (v[i].id == id)
            v[i].unit = (uint32_t)((uint64_t)v[i].unit * ous / nus);
}

static void add_pend(struct wo_plan *p, uint32_t type, uint32_t id, uint32_t unit, uint64_t key);
static double next_use_far(const struct wo_plan *p, const struct unit *u);
static void flush_pend(struct wo_plan *p);

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
    flush_pend(p);
    for (uint32_t i = 0; i < r->nunits; i++)
        if (r->u[i].resident)
            p->resident_bytes -= unit_bytes(r, i);
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
            p->resident_bytes += unit_bytes(r, i);
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
 * that straddled an old boundary: evict, furthest predicted use first, hot
 * or not, until it holds. */
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
            far = next_use_far(p, u) + (u->hot ? 0 : 1e18);
            if (far > best) {
                best = far;
                bi = i;
            }
        }
        if (bi == SIZE_MAX)
            return;
        add_pend(p, WO_PLAN_EVICT, p->known[bi].id, p->known[bi].unit, 0);
    }
}

/* Learns the slice from a hit offset; resizes the units when it shrinks. */
static void learn_slice(struct wo_plan *p, uint32_t id, uint64_t offset)
{
    struct prange *r = &p->r[id];
    uint64_t s, nus;

    if (offset == 0 || offset >= r->size)
        return;
    s = r->slice ? wo_plan_gcd(r->slice, offset) : offset;
    if (s == r->slice)
        return;
    r->slice = s;
    nus = unit_size_for(p, r, s);
    if (nus < r->usize && range_resize(p, id, nus) == 0)
        enforce_budget(p);
}

/* ---- actions ---------------------------------------------------------- */

static void add_pend(struct wo_plan *p, uint32_t type, uint32_t id, uint32_t unit, uint64_t key)
{
    struct prange *r = &p->r[id];
    struct unit *u = &r->u[unit];
    uint64_t b = unit_bytes(r, unit);

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

static int act_push(struct wo_plan *p, const struct wo_plan_action *a)
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

static int know(struct wo_plan *p, uint32_t id, uint32_t unit);

/* Takes one more unit into a prefetch being built (free room only). */
static bool widen_unit(struct wo_plan *p, struct prange *r, uint32_t id, uint64_t u)
{
    uint64_t b;

    if (u >= r->nunits || r->u[u].resident)
        return false;
    b = unit_bytes(r, (uint32_t)u);
    if (p->resident_bytes + b > p->cfg.budget || know(p, id, (uint32_t)u) < 0)
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
static void flush_pend(struct wo_plan *p)
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
            struct wo_plan_action a = {e->type, range_how(p, r), e->id, r->gen,
                                       (uint64_t)e->unit * r->usize, unit_bytes(r, e->unit)};

            act_push(p, &a);
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
            last->a.bytes += unit_bytes(r, e->unit);
            last->key = WO_MIN(last->key, e->key);
            continue;
        }
        runs[nruns++] = (struct run){{e->type, range_how(p, r), e->id, r->gen, off,
                                      unit_bytes(r, e->unit)},
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
        act_push(p, &runs[i].a);
    }
    free(runs);
    p->npend = 0;
}

/* ---- prediction ------------------------------------------------------- */

/* Positions until the unit's predicted next use (cyclic), scaled by how
 * rarely it is used: the victim with the largest value is evicted first
 * (Belady's rule on the learned order). */
static double next_use_far(const struct wo_plan *p, const struct unit *u)
{
    uint32_t len = p->prev_len ? p->prev_len : WO_MAX(p->pos, 1u);
    double d = u->phase > p->pos ? (double)(u->phase - p->pos)
                                 : (double)u->phase + (double)len - (double)p->pos;

    return d / WO_MAX(u->freq, MIN_FREQ);
}

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
            far = next_use_far(p, u);
            if (far > best) {
                best = far;
                bi = i;
            }
        }
        if (bi == SIZE_MAX)
            return 0;
        add_pend(p, WO_PLAN_EVICT, p->known[bi].id, p->known[bi].unit, 0);
    }
    return 1;
}

static int know(struct wo_plan *p, uint32_t id, uint32_t unit)
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

/* The cost rule (uvm/cost.h) for unit u of r: what having it resident for
 * `steps` steps saves, less its move when it is not resident yet (its load
 * and its drop at the end) and the eviction of `evict` bytes of non-hot
 * units its load forces. `reads` is the bytes a step reads from it
 * (accesses per step x bytes per access: read multiplicity counted). */
static double unit_gain(const struct wo_plan *p, const struct prange *r, uint32_t i,
                        const struct unit *u, double reads, double steps, uint64_t evict)
{
    struct wo_cost_move m = {
        .bytes = u->resident ? 0 : unit_bytes(r, i),
        .read_bytes = reads,
        .steps = steps,
        .how = range_how(p, r),
        .evict_bytes = u->resident ? 0 : evict,
        .evict_how = range_how(p, r),
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

/* A non-hot unit cycled through this step (prefetched before its use,
 * dropped after): its reads this step (at least one access; several when
 * a step reads it several times) against its load, its drop and the room
 * it takes from others when the budget is full. Read once, it never pays:
 * a load and a collapse cost ~3x an in-place read (device-facts.md). */
static bool cycle_pays(const struct wo_plan *p, const struct prange *r, uint32_t i,
                       const struct unit *u)
{
    uint64_t b = unit_bytes(r, i);
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
        if (u->freq < MIN_FREQ)
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
        c[n++] = (struct cand){gain / (double)unit_bytes(r, ui), r->prio, p->known[i].id, ui};
    }
    qsort(c, n, sizeof(*c), cand_cmp);
    for (size_t i = 0; i < n; i++) {
        struct prange *r = &p->r[c[i].id];
        uint64_t b = unit_bytes(r, c[i].unit);

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
        uint64_t b = unit_bytes(r, p->known[i].unit);

        if (!u->hot || u->resident)
            continue;
        if (!make_room(p, b))
            continue;
        add_pend(p, WO_PLAN_PREFETCH, p->known[i].id, p->known[i].unit,
                 (uint64_t)(next_use_far(p, u) * 1024));
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
            uint64_t b = unit_bytes(r, i);

            if (r->u[i].resident || p->resident_bytes + b > p->cfg.budget)
                continue;
            if (know(p, id, i) < 0)
                return;
            add_pend(p, WO_PLAN_PREFETCH, id, i, UINT64_MAX / 2);
        }
    }
}

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

static void boundary(struct wo_plan *p, uint64_t t, unsigned nsteps)
{
    struct oent *tv;
    size_t tc;
    struct wo_plan_action a = {.type = WO_PLAN_STEP};
    double step_s = (double)(t - p->t_step) * 1e-9;
    double cyc_s = 0;
    int pays = 0;

    /* fold this step's counts into the frequencies; cost of cycling the
     * non-hot units this step touched */
    for (size_t i = 0; i < p->nknown; i++) {
        struct prange *r = &p->r[p->known[i].id];
        struct unit *u = &r->u[p->known[i].unit];

        if (u->cnt && !u->hot) {
            cyc_s += (double)unit_bytes(r, p->known[i].unit) *
                     (p->cfg.costs.prefetch_s_per_byte +
                      wo_cost_drop_s_per_byte(&p->cfg.costs, range_how(p, r)));
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
    act_push(p, &a);
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
static void lookahead(struct wo_plan *p, uint64_t t)
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
        b = unit_bytes(r, e->unit);
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
        add_pend(p, WO_PLAN_PREFETCH, e->id, e->unit, ahead_ns);
        need_s += p->cfg.costs.prefetch_call_s + (double)b * p->cfg.costs.prefetch_s_per_byte;
    }
    for (size_t i = 0; i < p->nknown; i++)
        p->r[p->known[i].id].u[p->known[i].unit].mark = 0;
}

/* ---- launches ----------------------------------------------------------- */

static uint32_t min_managed_id(const struct wo_plan *p, const struct wo_event *ev)
{
    uint32_t best = UINT32_MAX;

    for (unsigned i = 0; i < ev->nhits && i < WO_EV_MAX_HITS; i++)
        if (range_get(p, ev->l.hits[i].id, ev->l.hits[i].gen) && ev->l.hits[i].id < best)
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
        struct prange *r = range_get(p, hit->id, hit->gen);
        uint64_t end;
        uint32_t u0, u1;

        if (!r)
            continue;
        if (p->cfg.slices && !(r->flags & WO_PLAN_NO_SLICES))
            learn_slice(p, hit->id, hit->offset);
        end = wo_plan_extent_end(r->size, r->slice, hit->offset, hit->hi);
        if (end <= hit->offset)
            continue;
        u0 = (uint32_t)(hit->offset / r->usize);
        u1 = (uint32_t)((end - 1) / r->usize);
        for (uint32_t i = u0; i <= u1 && i < r->nunits; i++) {
            struct unit *u = &r->u[i];
            uint64_t lo = WO_MAX(hit->offset, (uint64_t)i * r->usize);
            uint64_t hi = WO_MIN(end, (uint64_t)i * r->usize + unit_bytes(r, i));
            uint64_t b = hi - lo;
            struct oent e = {p->pos, hit->id, i, t - p->t_step};

            if (know(p, hit->id, i) < 0 ||
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
                /* free room is free (no eviction forced): a missed unit will
                 * likely be used again, if its reads pay for its load */
                if (p->resident_bytes + unit_bytes(r, i) <= p->cfg.budget &&
                    (!p->hot_valid || u->hot || !p->cycle_ok) &&
                    (u->hot || unit_gain(p, r, i, u, unit_reads(u), SWAP_HORIZON / 2, 0) > 0))
                    add_pend(p, WO_PLAN_PREFETCH, hit->id, i, 0);
            }
        }
    }
    lookahead(p, t);
    p->pos++;
    flush_pend(p);
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
    const struct prange *r = range_get(p, id, gen);

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
    const struct prange *r = range_get(p, id, gen);

    if (!r || bytes == 0 || offset >= r->size)
        return 0;
    for (uint64_t i = offset / r->usize; i * r->usize < WO_MIN(offset + bytes, r->size); i++)
        if (!r->u[i].resident)
            return 0;
    return 1;
}

uint32_t wo_plan_range_how(const struct wo_plan *p, uint32_t id, uint32_t gen)
{
    const struct prange *r = range_get(p, id, gen);

    return r ? range_how(p, r) : WO_PLAN_HOW_NONE;
}

void wo_plan_set_budget(struct wo_plan *p, uint64_t budget)
{
    p->cfg.budget = budget;
    enforce_budget(p);
}
