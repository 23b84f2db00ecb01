/* tools/replay.c: the replay simulator and the offline-optimal bound (see
 * replay.h; the model is written down in docs/prefetch.md).
 *
 * Resources of the model, each serial: the engine's host thread (launch
 * pacing from the trace's own gaps), the GPU compute stream (kernels in
 * launch order), the PCIe host->device link (zero-copy reads of kernels and
 * prefetch transfers book it first come, first served) and the UVM engine
 * (the prefetch thread: every prefetch and eviction in turn; UVM work
 * serialises, device-facts.md). The planner is the shim's own
 * (uvm/plan.c); its actions are timed here. */
#include "tools/replay.h"

#include "core/registry.h"
#include "uvm/graph.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PIECE (64 * WO_KiB) /* residency granularity of the simulation */
#define MAX_TIMELINE_EVENTS 400000u

struct rtag {
    uint64_t offset, size;
    int name;
};

struct rr {
    const struct wo_trace_range *tr;
    uint32_t place;    /* enum wo_placement, after seal */
    int prio;
    bool no_slices;
    bool written;
    uint64_t slice;    /* gcd of the non-zero hit offsets over the whole trace */
    uint64_t usize;    /* unit size of the bound */
    uint32_t ubase;    /* first unit of this range in the bound */
    double *ready;     /* managed: per PIECE, time the GPU copy is complete (INFINITY: none) */
    uint32_t npieces;
    struct rtag *tags;
    size_t ntags;
};

/* One access of a unit in the bound: its GPU time if resident / streamed
 * and its link time if streamed. */
struct bacc {
    uint32_t unit, k;
    double gR, gS, lS;
};

struct bunit {
    double s, ld, ev;
};

struct busy {
    double a, b;
};

/* A piece of link traffic, for the host's slowdown under it. */
struct traffic {
    double a, b;
    int dma; /* a copy engine's transfer (a prefetch), else the GPU's in-place reads */
};

struct sim {
    const struct wo_trace_data *d;
    const struct wo_replay_opts *o;
    const struct wo_devmodel *dm;
    struct rr *r;
    struct wo_replay_name *names;
    size_t nnames, capnames;
    struct wo_plan *plan;
    struct wo_graphs *graphs;

    double hbm_s, zc_s, kernel_s, launch_s, sync_s;
    double host_scale;          /* opts' host_scale (1 when unset) */
    double cpu_t, cpu_work, gpu_free, uvm_free;
    double cpu_base; /* cpu_work without the link's slowdown (what bounds any schedule) */
    struct busy *lk; /* link bookings, sorted, disjoint, merged */
    size_t nlk, caplk;
    struct traffic *tp; /* the same bookings as pieces of one kind each, sorted */
    size_t ntp, captp;
    uint64_t prev_trace_t;
    int have_prev, after_sync, sealed;
    bool has_syncs;             /* the trace records syncs (else copies to the host stand for them) */
    double sync_wait;           /* how long the host waited at the last sync */
    size_t after_sync_ev;       /* index of that sync's event */
    const double *post_sync;    /* host work after each event that waits (pacing pass), or NULL */
    double *post_sync_out;      /* written by the pacing pass */
    size_t ev_index;            /* the event being replayed */

    /* steps */
    struct wo_stepper stepper;
    uint64_t nsteps_total; /* boundaries, from the pre-pass */
    uint64_t steps_total;  /* steps they close */
    uint64_t step;         /* boundaries seen in this pass */
    uint64_t wstart, wend; /* boundaries that open and close the window */
    int in_window;
    double *bt;            /* times of the window's step boundaries */
    double *rt;            /* the same boundaries' times in the recorded run */
    uint32_t *bl;          /* launches in the step each boundary closes */
    double (*bacc)[4];     /* zero-copy, prefetch + copy-back + copy bytes, stall s, host work at each boundary */
    size_t nbt, capbt, capr, capbl, capbacc;
    double w_t0, w_cpu0, w_end_t, w_end_cpu, w_lag, w_base0, w_end_base;
    uint64_t w_k;          /* launches in the window so far */
    uint32_t step_launches, cur_step_launches;

    /* window accumulators */
    double zc_b, pf_b, ev_b, cb_b, copy_b, stall_s;

    /* bound */
    struct bacc *acc;
    size_t nacc, capacc;
    double fixed_cp, fixed_link;
    uint32_t nunits;

    uint64_t launches;
    uint64_t max_resident;
    unsigned warmup;
    const uint8_t *oracle; /* units resident throughout (the clairvoyant schedule) */
    unsigned tl_n;
    int err;
};

static int grow(void **v, size_t *cap, size_t need, size_t elem)
{
    size_t ncap;
    void *nv;

    if (need <= *cap)
        return 0;
    ncap = *cap ? *cap * 2 : 64;
    while (ncap < need)
        ncap *= 2;
    nv = realloc(*v, ncap * elem);
    if (!nv)
        return -ENOMEM;
    *v = nv;
    *cap = ncap;
    return 0;
}

static struct rr *rr_of(struct sim *s, uint32_t id, uint32_t gen)
{
    const struct wo_trace_range *t = wo_trace_data_range(s->d, id, gen);

    return t ? &s->r[t - s->d->ranges] : NULL;
}

static int name_index(struct sim *s, const char *name, uint32_t place)
{
    for (size_t i = 0; i < s->nnames; i++)
        if (strcmp(s->names[i].name, name) == 0)
            return (int)i;
    if (grow((void **)&s->names, &s->capnames, s->nnames + 1, sizeof(*s->names)) < 0)
        return -1;
    memset(&s->names[s->nnames], 0, sizeof(s->names[0]));
    s->names[s->nnames].name = name;
    s->names[s->nnames].place = place;
    return (int)s->nnames++;
}

static int name_at(const struct rr *r, uint64_t off)
{
    for (size_t i = 0; i < r->ntags; i++)
        if (off >= r->tags[i].offset && off - r->tags[i].offset < r->tags[i].size)
            return r->tags[i].name;
    return r->ntags ? r->tags[0].name : -1;
}

/* ---- the PCIe link: a calendar of busy intervals ------------------------ */

/* Keeps [a, b) of traffic of one kind for link_slowdown(), in start order
 * (pieces of the disjoint calendar: disjoint too), forgetting pieces that
 * ended before the host clock. */
static void traffic(struct sim *s, double a, double b, int dma)
{
    size_t i, j = 0;

    if (s->dm->host_zc_slow <= 1 && s->dm->host_dma_slow <= 1)
        return;
    while (j < s->ntp && s->tp[j].b < s->cpu_t)
        j++;
    if (j) {
        memmove(s->tp, s->tp + j, (s->ntp - j) * sizeof(*s->tp));
        s->ntp -= j;
    }
    if (grow((void **)&s->tp, &s->captp, s->ntp + 1, sizeof(*s->tp)) < 0) {
        s->err = -ENOMEM;
        return;
    }
    for (i = s->ntp; i > 0 && s->tp[i - 1].a > a; i--)
        ;
    memmove(s->tp + i + 1, s->tp + i, (s->ntp - i) * sizeof(*s->tp));
    s->tp[i] = (struct traffic){a, b, dma};
    s->ntp++;
}

/* Uses the link for d seconds from t on, in the idle gaps between earlier
 * bookings (a prefetch booked for later does not block a kernel's read
 * now: the link shares its time); returns when the last byte crossed. */
static double link_use(struct sim *s, double t, double d, int dma)
{
    size_t i = 0, j = 0;

    /* forget intervals no later request can touch (requests start at or
     * after the host clock) */
    while (j < s->nlk && s->lk[j].b < s->cpu_t)
        j++;
    if (j) {
        memmove(s->lk, s->lk + j, (s->nlk - j) * sizeof(*s->lk));
        s->nlk -= j;
    }
    while (d > 0) {
        double gap;

        while (i < s->nlk && s->lk[i].b <= t)
            i++;
        if (i < s->nlk && s->lk[i].a <= t) {
            t = s->lk[i].b;
            continue;
        }
        gap = i < s->nlk ? s->lk[i].a - t : INFINITY;
        if (gap > d)
            gap = d;
        traffic(s, t, t + gap, dma);
        /* book [t, t + gap): extend the previous interval or insert */
        if (i > 0 && s->lk[i - 1].b >= t) {
            s->lk[i - 1].b = t + gap;
        } else {
            if (grow((void **)&s->lk, &s->caplk, s->nlk + 1, sizeof(*s->lk)) < 0) {
                s->err = -ENOMEM;
                return t + d;
            }
            memmove(s->lk + i + 1, s->lk + i, (s->nlk - i) * sizeof(*s->lk));
            s->lk[i] = (struct busy){t, t + gap};
            s->nlk++;
            i++;
        }
        if (i < s->nlk && s->lk[i - 1].b >= s->lk[i].a) { /* touches the next one: merge */
            s->lk[i - 1].b = s->lk[i].b;
            memmove(s->lk + i, s->lk + i + 1, (s->nlk - i - 1) * sizeof(*s->lk));
            s->nlk--;
        }
        t += gap;
        d -= gap;
    }
    return t;
}

/* ---- timeline ------------------------------------------------------------- */

static void tl_event(struct sim *s, int tid, const char *name, double t0, double t1)
{
    FILE *f = s->o->timeline;

    if (!f || s->oracle || s->tl_n >= MAX_TIMELINE_EVENTS)
        return;
    fprintf(f, "%s{\"name\":\"", s->tl_n++ ? ",\n" : "");
    for (const char *c = name; *c; c++) {
        if (*c == '"' || *c == '\\')
            fputc('\\', f);
        if ((unsigned char)*c >= 0x20)
            fputc(*c, f);
    }
    if (t1 < t0)
        fprintf(f, "\",\"ph\":\"i\",\"s\":\"g\",\"pid\":1,\"tid\":%d,\"ts\":%.3f}", tid, t0 * 1e6);
    else
        fprintf(f, "\",\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}", tid, t0 * 1e6,
                (t1 - t0) * 1e6);
}

/* ---- setup ---------------------------------------------------------------- */

/* Whether the shim could have served (and so placed) a tagged allocation.
 * Tags on memory it served are flagged in the trace. Memory it only observed
 * counts too when it was a plain allocation (cuMemAlloc, cudaMalloc): in a
 * run whose policy placed nothing (an all-GPU recording) the placeable window
 * never opened, and a policy that places something would have opened it.
 * Stream-ordered pools, VMM mappings and the engine's own managed memory are
 * never placeable (docs/placement.md). */
static bool could_place(const struct wo_trace_tag *t, const struct wo_trace_range *tr)
{
    if (t->flags & WO_TRACE_TAG_PLACEABLE)
        return true;
    return tr && !(tr->flags & (WO_RANGE_ASYNC | WO_RANGE_VMM | WO_RANGE_ENGINE_MANAGED));
}

static uint32_t place_of_tag(struct sim *s, const struct wo_trace_tag *t,
                             const struct wo_trace_range *tr, int *prio, bool *no_slices)
{
    struct wo_match m;

    *prio = 0;
    *no_slices = false;
    if (s->o->all_device)
        return WO_PLACE_DEVICE;
    if (!s->o->policy)
        return t->placement <= WO_TRACE_PLACE_MANAGED && t->placement ? t->placement
                                                                    : WO_PLACE_DEVICE;
    /* only memory the shim serves can change placement (design.md) */
    if (!could_place(t, tr))
        return WO_PLACE_DEVICE;
    if (wo_policy_match(s->o->policy, t->name, t->size, &m) < 0)
        return WO_PLACE_DEVICE;
    if (m.r) {
        *prio = m.r->priority;
        *no_slices = m.r->slices == WO_SLICES_NONE;
    }
    return m.place;
}

static int setup_ranges(struct sim *s)
{
    const struct wo_trace_data *d = s->d;

    s->r = calloc(d->nranges ? d->nranges : 1, sizeof(*s->r));
    if (!s->r)
        return -ENOMEM;
    for (size_t i = 0; i < d->nranges; i++) {
        s->r[i].tr = &d->ranges[i];
        s->r[i].place = WO_PLACE_DEVICE;
    }
    for (size_t i = 0; i < d->ntags; i++) {
        const struct wo_trace_tag *t = &d->tags[i];
        struct rr *r = rr_of(s, t->id, t->gen);
        uint64_t biggest = 0;
        int prio, ni;
        bool ns;
        uint32_t pl;

        if (!r || !t->name)
            continue;
        pl = place_of_tag(s, t, r->tr, &prio, &ns);
        ni = name_index(s, t->name, pl);
        if (ni < 0)
            return -ENOMEM;
        s->names[ni].bytes += t->size;
        {
            struct rtag *nt = realloc(r->tags, (r->ntags + 1) * sizeof(*nt));

            if (!nt)
                return -ENOMEM;
            r->tags = nt;
            r->tags[r->ntags++] = (struct rtag){t->offset, t->size, ni};
        }
        /* one allocation has one placement: the largest tag's */
        for (size_t j = 0; j + 1 < r->ntags; j++)
            biggest = WO_MAX(biggest, r->tags[j].size);
        if (t->size > biggest) {
            r->place = pl;
            r->prio = prio;
            r->no_slices = ns;
        }
    }
    if (!s->o->policy && !s->o->all_device) {
        /* placement changes the trace recorded win over the tags */
        for (size_t i = 0; i < d->nevents; i++) {
            const struct wo_event *ev = &d->events[i].ev;
            struct rr *r;

            if (ev->type != WO_EV_PLACE || !(r = rr_of(s, ev->p.id, ev->p.gen)))
                continue;
            if (ev->p.to >= WO_PLACE_DEVICE && ev->p.to <= WO_PLACE_MANAGED)
                r->place = ev->p.to;
        }
    }
    return 0;
}

/* ---- step detection (same rule as the planner, over every range) ------- */

/* The key of a launch for step detection: its function and the first
 * named tensor it touched (lowest range id, then the tag at the hit's
 * offset). Only named ranges count: activations and a growing KV cache are
 * new allocations every few steps, and a key that names them would never
 * repeat. The tag matters because small weights share one allocation (the
 * caching allocator's 2 MiB segments): the range id alone would give every
 * layer's norm the same key. UINT64_MAX: no named hit. */
static uint64_t launch_key(struct sim *s, const struct wo_event *ev)
{
    uint32_t best = UINT32_MAX;
    int tag = -1;

    for (unsigned i = 0; i < ev->nhits && i < WO_EV_MAX_HITS; i++) {
        struct rr *r = rr_of(s, ev->l.hits[i].id, ev->l.hits[i].gen);
        uint64_t off = ev->l.hits[i].offset;

        if (!r || ev->l.hits[i].id >= best)
            continue;
        /* inside a tag, not merely in a segment that also holds one */
        for (size_t k = 0; k < r->ntags; k++)
            if (off >= r->tags[k].offset && off - r->tags[k].offset < r->tags[k].size) {
                best = ev->l.hits[i].id;
                tag = r->tags[k].name;
                break;
            }
    }
    if (best == UINT32_MAX)
        return UINT64_MAX;
    return wo_stepper_key(ev->l.func ^ ((uint64_t)(uint32_t)tag << 40), best);
}

/* Steps this launch ends (see wo_stepper_feed): > 0 at a boundary. */
static unsigned is_boundary(struct sim *s, const struct wo_event *ev)
{
    uint64_t key;

    if (!s->sealed)
        return 0;
    key = launch_key(s, ev);
    if (key == UINT64_MAX)
        return 0;
    return wo_stepper_feed(&s->stepper, key);
}

static bool has_seal(const struct wo_trace_data *d)
{
    for (size_t i = 0; i < d->nevents; i++)
        if (d->events[i].ev.type == WO_EV_SEAL)
            return true;
    return false;
}

/* Pre-pass: slices (gcd of hit offsets) and the number of steps. */
static int prepass(struct sim *s)
{
    const struct wo_trace_data *d = s->d;
    struct wo_graphs *g = wo_graphs_new();

    if (!g)
        return -ENOMEM;
    s->sealed = !has_seal(d);
    for (size_t i = 0; i < d->nevents; i++) {
        const struct wo_event *ev = &d->events[i].ev, *gl;
        ssize_t n = wo_graphs_expand(g, ev, &gl);

        if (ev->type == WO_EV_SEAL)
            s->sealed = 1;
        if (n < 0) {
            wo_graphs_free(g);
            return (int)n;
        }
        for (ssize_t k = 0; k < n; k++) {
            const struct wo_event *l = &gl[k];

            unsigned nb = is_boundary(s, l);

            if (nb) {
                s->nsteps_total++;
                s->steps_total += nb;
            }
            for (unsigned h = 0; h < l->nhits && h < WO_EV_MAX_HITS; h++) {
                struct rr *r = rr_of(s, l->l.hits[h].id, l->l.hits[h].gen);

                if (r && l->l.hits[h].offset && l->l.hits[h].offset < r->tr->size)
                    r->slice = r->slice ? wo_plan_gcd(r->slice, l->l.hits[h].offset)
                                        : l->l.hits[h].offset;
            }
        }
    }
    wo_graphs_free(g);
    wo_stepper_done(&s->stepper);
    wo_stepper_init(&s->stepper);
    return 0;
}

/* ---- the planner's actions ---------------------------------------------- */

static void mark_ready(struct rr *r, uint64_t off, uint64_t bytes, double t)
{
    uint64_t p0 = off / PIECE, p1 = (off + bytes + PIECE - 1) / PIECE;

    for (uint64_t p = p0; p < p1 && p < r->npieces; p++)
        r->ready[p] = t;
}

static void apply_actions(struct sim *s)
{
    struct wo_plan_action a;

    while (wo_plan_pop(s->plan, &a) == 1) {
        struct rr *r;
        double t0, t1;
        char label[160];
        int ni;

        if (a.type == WO_PLAN_STEP)
            continue;
        r = rr_of(s, a.id, a.gen);
        if (!r || !r->ready)
            continue;
        ni = name_at(r, a.offset);
        t0 = WO_MAX(s->uvm_free, s->cpu_t);
        if (a.type == WO_PLAN_PREFETCH) {
            double bps = wo_devmodel_pf_bps(s->dm, a.bytes);

            t1 = t0 + s->dm->pf_call_us * 1e-6;
            if (a.how == WO_PLAN_COLLAPSE) {
                /* a duplicate is a little slower than a migration (device-facts.md) */
                bps *= s->dm->rm_pf_gbs / s->dm->pf_gbs[3];
                /* read-mostly set on each piece it prefetches (uvm/prefetch.c) */
                t1 += s->dm->advise_us * 1e-6;
            }
            t1 = link_use(s, t1, (double)a.bytes / bps, 1);
            s->uvm_free = t1;
            mark_ready(r, a.offset, a.bytes, t1);
            if (s->in_window) {
                s->pf_b += (double)a.bytes;
                if (ni >= 0)
                    s->names[ni].prefetched += (double)a.bytes;
            }
            snprintf(label, sizeof(label), "prefetch %s +%llu MiB",
                     ni >= 0 ? s->names[ni].name : "?", (unsigned long long)(a.bytes >> 20));
        } else {
            if (a.how == WO_PLAN_COLLAPSE) /* unset read-mostly, map for the GPU again */
                t1 = t0 + (double)a.bytes / (s->dm->collapse_gbs * 1e9) +
                     (double)a.bytes / (s->dm->remap_gbs * 1e9) + s->dm->advise_us * 1e-6;
            else
                t1 = t0 + s->dm->pf_call_us * 1e-6 + (double)a.bytes / (s->dm->copyback_gbs * 1e9);
            s->uvm_free = t1;
            /* the planner already counts the bytes free: never read them again */
            mark_ready(r, a.offset, a.bytes, INFINITY);
            if (s->in_window) {
                s->ev_b += (double)a.bytes;
                if (a.how != WO_PLAN_COLLAPSE)
                    s->cb_b += (double)a.bytes;
                if (ni >= 0)
                    s->names[ni].evicted += (double)a.bytes;
            }
            snprintf(label, sizeof(label), "%s %s -%llu MiB",
                     a.how == WO_PLAN_COLLAPSE ? "collapse" : "copy-back",
                     ni >= 0 ? s->names[ni].name : "?", (unsigned long long)(a.bytes >> 20));
        }
        tl_event(s, 2, label, t0, t1);
    }
    s->max_resident = WO_MAX(s->max_resident, wo_plan_resident_bytes(s->plan));
}

/* ---- the host thread ---------------------------------------------------- */

/* How long `gap` seconds of the host's own work from the host clock on take
 * while the link carries the GPU's in-place reads or a copy engine's
 * transfer (bench/pcie-interference.py: the launch path shares PCIe with
 * them): one walk over the traffic pieces in time order, the work advancing
 * at 1/factor inside a piece and at full speed between pieces, so the
 * stretched part meets the later pieces too. */
static double link_slowdown(const struct sim *s, double gap)
{
    double fz = s->dm->host_zc_slow, fd = s->dm->host_dma_slow, t = s->cpu_t, left = gap, took = 0;

    if (fz <= 1 && fd <= 1)
        return gap;
    for (size_t i = 0; i < s->ntp && left > 0; i++) {
        const struct traffic *b = &s->tp[i];
        double f = b->dma ? fd : fz, idle, busy;

        if (b->b <= t)
            continue;
        idle = WO_MAX(b->a - t, 0.0);
        if (idle >= left)
            break;
        left -= idle;
        took += idle;
        t = WO_MAX(t, b->a);
        /* inside the booking the work advances at 1/f */
        busy = WO_MIN(b->b - t, left * f);
        took += busy;
        left -= busy / f;
        t += busy;
    }
    return took + left;
}

/* Advances the engine's host clock to an event recorded at trace time t. */
static void host_advance(struct sim *s, uint64_t t, double floor_s)
{
    double gap = 0;

    if (s->have_prev && t > s->prev_trace_t)
        gap = (double)(t - s->prev_trace_t) * 1e-9 * s->host_scale;
    /* After a sync the recorded gap holds the recording run's wait for its
     * GPU and then the host's own work up to this call (Python turning the
     * value read into control flow): keep the work. A what-if replay takes
     * it from the pacing pass, which replayed the recording run's own
     * placements (where the simulated wait stands for the recorded one);
     * that pass, and a replay under the recorded placements, subtract their
     * own simulated wait. At least the return from a sync (sync_us). */
    if (s->after_sync) {
        if (s->post_sync)
            gap = s->post_sync[s->after_sync_ev] * s->host_scale;
        else
            gap = WO_MAX(gap - s->sync_wait, 0.0);
        if (s->post_sync_out)
            s->post_sync_out[s->after_sync_ev] = gap;
        gap = WO_MAX(gap, s->sync_s);
    }
    gap = WO_MAX(gap, floor_s);
    /* A what-if replay charges the traffic its placements put on the link;
     * a replay under the recorded placements finds it in the recorded gaps. */
    s->cpu_base += gap;
    if (s->post_sync)
        gap = link_slowdown(s, gap);
    s->cpu_t += gap;
    s->cpu_work += gap;
    s->prev_trace_t = t;
    s->have_prev = 1;
    s->after_sync = 0;
}

/* The host waits for the GPU at event i (a sync, a copy to the host). */
static void host_wait(struct sim *s, size_t i)
{
    s->sync_wait = WO_MAX(s->gpu_free - s->cpu_t, 0.0);
    s->cpu_t = WO_MAX(s->cpu_t, s->gpu_free);
    s->after_sync = 1;
    s->after_sync_ev = i;
}

/* ---- kernels -------------------------------------------------------------- */

static void window_open(struct sim *s, double t)
{
    s->in_window = 1;
    s->w_t0 = t;
    s->w_cpu0 = s->cpu_work;
    s->w_base0 = s->cpu_base;
    /* how far the GPU lags the host here: the window (GPU start to GPU
     * start) can be that much shorter than the host's work in it */
    s->w_lag = t - s->cpu_t;
    s->w_k = 0;
}

static int add_acc(struct sim *s, uint32_t unit, uint32_t k, double gR, double gS, double lS)
{
    if (s->nacc && s->acc[s->nacc - 1].unit == unit && s->acc[s->nacc - 1].k == k) {
        s->acc[s->nacc - 1].gR += gR;
        s->acc[s->nacc - 1].gS += gS;
        s->acc[s->nacc - 1].lS += lS;
        return 0;
    }
    if (grow((void **)&s->acc, &s->capacc, s->nacc + 1, sizeof(*s->acc)) < 0)
        return -ENOMEM;
    s->acc[s->nacc++] = (struct bacc){unit, k, gR, gS, lS};
    return 0;
}

/* The bound's share of one kernel: its GPU time is max(compute, its own
 * reads over the link), F + resident bytes at HBM speed against H + streamed
 * bytes at zero-copy speed. With one managed unit access the max is exact
 * per choice; with more, max(F + x, H + y) >= H + y is what stays linear. */
static void bound_kernel(struct sim *s, const struct bacc *v, size_t n, double F, double H)
{
    if (n == 0) {
        s->fixed_cp += WO_MAX(F, H);
        return;
    }
    if (n == 1) {
        double b = v[0].gR; /* bytes, see kernel() */

        if (add_acc(s, v[0].unit, v[0].k, WO_MAX(F + b * s->hbm_s, H), WO_MAX(F, H + b * s->zc_s),
                    b * s->zc_s) < 0)
            s->err = -ENOMEM;
        return;
    }
    s->fixed_cp += H;
    for (size_t i = 0; i < n; i++)
        if (add_acc(s, v[i].unit, v[i].k, 0, v[i].gR * s->zc_s, v[i].gR * s->zc_s) < 0)
            s->err = -ENOMEM;
}

static void kernel(struct sim *s, const struct wo_event *ev)
{
    double start, t_in, hbm = 0, zc = 0, end, le, fixed_hbm = 0, host_zc = 0;
    struct bacc ka[64];
    size_t nka = 0;
    const char *kname;

    if (is_boundary(s, ev)) {
        if (s->step == s->wstart && !s->in_window)
            window_open(s, WO_MAX(s->cpu_t, s->gpu_free));
        if (s->in_window) {
            if (grow((void **)&s->bt, &s->capbt, s->nbt + 1, sizeof(*s->bt)) < 0 ||
                grow((void **)&s->rt, &s->capr, s->nbt + 1, sizeof(*s->rt)) < 0 ||
                grow((void **)&s->bl, &s->capbl, s->nbt + 1, sizeof(*s->bl)) < 0 ||
                grow((void **)&s->bacc, &s->capbacc, s->nbt + 1, sizeof(*s->bacc)) < 0) {
                s->err = -ENOMEM;
            } else {
                s->bt[s->nbt] = WO_MAX(s->cpu_t, s->gpu_free);
                s->bl[s->nbt] = s->cur_step_launches;
                s->bacc[s->nbt][0] = s->zc_b;
                s->bacc[s->nbt][1] = s->pf_b + s->cb_b + s->copy_b;
                s->bacc[s->nbt][2] = s->stall_s;
                s->bacc[s->nbt][3] = s->cpu_work;
                s->rt[s->nbt++] = (double)ev->t_ns * 1e-9;
            }
        }
        if (s->in_window && s->step == s->wend) {
            s->in_window = 0;
            s->w_end_t = WO_MAX(s->cpu_t, s->gpu_free);
            s->w_end_cpu = s->cpu_work;
            s->w_end_base = s->cpu_base;
            s->step_launches = s->cur_step_launches;
        }
        s->step++;
        s->cur_step_launches = 0;
        tl_event(s, 1, "step", WO_MAX(s->cpu_t, s->gpu_free), -1);
    }
    s->cur_step_launches++;
    s->launches++;
    start = WO_MAX(s->cpu_t, s->gpu_free);
    t_in = start;
    for (unsigned h = 0; h < ev->nhits && h < WO_EV_MAX_HITS; h++) {
        const struct wo_ev_hit *hit = &ev->l.hits[h];
        struct rr *r = rr_of(s, hit->id, hit->gen);
        uint32_t place;
        uint64_t end_off, b;
        int ni;

        if (!r || hit->offset >= r->tr->size)
            continue;
        end_off = wo_plan_extent_end(r->tr->size, r->slice, hit->offset, hit->hi);
        b = end_off - hit->offset;
        place = s->sealed ? r->place : WO_PLACE_DEVICE;
        ni = name_at(r, hit->offset);
        if (place == WO_PLACE_MANAGED && r->ready) {
            double mh = 0, mz = 0, wait = start;

            for (uint64_t p = hit->offset / PIECE; p * PIECE < end_off && p < r->npieces; p++) {
                uint64_t lo = WO_MAX(hit->offset, p * PIECE), hi = WO_MIN(end_off, (p + 1) * PIECE);
                double pb = (double)(hi - lo), rt = r->ready[p];

                if (rt <= start) {
                    mh += pb;
                } else if (rt < INFINITY && rt - start < pb * s->zc_s * 4) {
                    /* in flight: the kernel faults on it and waits */
                    mh += pb;
                    wait = WO_MAX(wait, rt);
                } else {
                    mz += pb;
                }
            }
            hbm += mh;
            zc += mz;
            t_in = WO_MAX(t_in, wait);
            if (s->in_window) {
                s->stall_s += mz * (s->zc_s - s->hbm_s) + (wait - start);
                if (ni >= 0) {
                    s->names[ni].hit_bytes += mh;
                    s->names[ni].miss_bytes += mz;
                    s->names[ni].read_s += mh * s->hbm_s + mz * s->zc_s;
                    s->names[ni].stall_s += mz * (s->zc_s - s->hbm_s) + (wait - start);
                }
                /* the bound: one access of each unit the hit covers */
                for (uint64_t u = hit->offset / r->usize; u * r->usize < end_off; u++) {
                    uint64_t lo = WO_MAX(hit->offset, u * r->usize);
                    uint64_t hi = WO_MIN(end_off, (u + 1) * r->usize);

                    if (nka < WO_ARRAY_SIZE(ka))
                        ka[nka++] = (struct bacc){r->ubase + (uint32_t)u, (uint32_t)s->w_k,
                                                  (double)(hi - lo), 0, 0};
                }
            }
        } else if (place == WO_PLACE_HOST) {
            zc += (double)b;
            if (s->in_window) {
                s->fixed_link += (double)b * s->zc_s;
                host_zc += (double)b * s->zc_s;
                if (ni >= 0) {
                    s->names[ni].zc_bytes += (double)b;
                    s->names[ni].read_s += (double)b * s->zc_s;
                }
            }
        } else {
            hbm += (double)b;
            fixed_hbm += (double)b;
            if (s->in_window && ni >= 0) {
                s->names[ni].hbm_bytes += (double)b;
                s->names[ni].read_s += (double)b * s->hbm_s;
            }
        }
    }
    le = zc > 0 ? link_use(s, t_in, zc * s->zc_s, 0) : t_in;
    end = WO_MAX(t_in + s->kernel_s + hbm * s->hbm_s, le);
    s->gpu_free = end;
    if (s->in_window) {
        s->zc_b += zc;
        bound_kernel(s, ka, nka, s->kernel_s + fixed_hbm * s->hbm_s, host_zc);
        s->w_k++;
    }
    kname = wo_trace_data_kernel(s->d, ev->l.func);
    tl_event(s, 1, kname ? kname : "kernel", start, end);
}

static void copy(struct sim *s, const struct wo_event *ev)
{
    double bw, t0, t1;

    switch (ev->c.kind) {
    case WO_COPY_H2D:
        bw = s->dm->h2d_gbs;
        break;
    case WO_COPY_D2H:
        bw = s->dm->d2h_gbs;
        break;
    case WO_COPY_D2D:
        bw = s->dm->hbm_gbs / 2;
        break;
    default:
        bw = s->dm->h2d_gbs;
    }
    t0 = WO_MAX(s->cpu_t, s->gpu_free);
    t1 = t0 + s->kernel_s + (double)ev->c.bytes / (bw * 1e9);
    s->gpu_free = t1;
    if (s->in_window) {
        if (ev->c.kind != WO_COPY_D2D)
            s->copy_b += (double)ev->c.bytes;
        s->fixed_cp += t1 - t0;
    }
    /* a copy into a managed range after seal: the engine writes it */
    if (s->sealed && s->plan) {
        for (size_t i = 0; i < s->d->nranges; i++) {
            struct rr *r = &s->r[i];

            if (r->ready && ev->c.dst >= r->tr->base && ev->c.dst - r->tr->base < r->tr->size &&
                !r->written && (!r->tr->t_free_ns || r->tr->t_free_ns > ev->t_ns)) {
                r->written = true;
                wo_plan_range_written(s->plan, r->tr->id, r->tr->gen);
            }
        }
    }
    tl_event(s, 1, "copy", t0, t1);
}

/* ---- seal: managed ranges enter the planner ------------------------------ */

static int seal(struct sim *s)
{
    s->sealed = 1;
    for (size_t i = 0; i < s->d->nranges; i++) {
        struct rr *r = &s->r[i];

        if (r->place != WO_PLACE_MANAGED || r->ready)
            continue;
        r->npieces = (uint32_t)((r->tr->size + PIECE - 1) / PIECE);
        r->ready = malloc(r->npieces * sizeof(*r->ready));
        if (!r->ready)
            return -ENOMEM;
        for (uint32_t p = 0; p < r->npieces; p++)
            r->ready[p] = INFINITY;
        if (s->oracle)
            for (uint64_t u = 0; u * r->usize < r->tr->size; u++)
                if (s->oracle[r->ubase + u])
                    mark_ready(r, u * r->usize, WO_MIN(r->usize, r->tr->size - u * r->usize), 0);
        if (s->plan && wo_plan_range_add(s->plan, r->tr->id, r->tr->gen, r->tr->size,
                                         (r->written ? WO_PLAN_WRITTEN : 0) |
                                             (r->no_slices ? WO_PLAN_NO_SLICES : 0),
                                         r->prio) < 0)
            return -ENOMEM;
    }
    return 0;
}

/* ---- the offline-optimal bound ------------------------------------------ */

static int acc_cmp(const void *a, const void *b)
{
    const struct bacc *x = a, *y = b;

    if (x->unit != y->unit)
        return x->unit < y->unit ? -1 : 1;
    return x->k < y->k ? -1 : x->k > y->k;
}

/* The Lagrangian lower bound for weights (al, mu, nu) of the compute,
 * UVM and link constraints and lambda, the price of one resident byte at
 * one launch: min over every schedule of the weighted resource use, less
 * lambda * budget * launches. Each unit's part is a shortest path over its
 * accesses (resident or streamed at each). docs/prefetch.md derives it. */
static double bound_eval(const struct sim *s, const struct bunit *bu, double budget, double N,
                         double al, double mu, double nu, double la)
{
    double total = al * s->fixed_cp + nu * s->fixed_link - la * budget * N;
    size_t i = 0;

    while (i < s->nacc) {
        uint32_t u = s->acc[i].unit;
        const struct bunit *x = &bu[u];
        double load = mu * x->ld + nu * x->ld, evict = mu * x->ev;
        double R, S, occ1 = la * x->s;
        uint32_t k = s->acc[i].k;

        R = al * s->acc[i].gR + occ1 + WO_MIN(occ1 * k, load);
        S = al * s->acc[i].gS + nu * s->acc[i].lS;
        for (i++; i < s->nacc && s->acc[i].unit == u; i++) {
            double g = (double)(s->acc[i].k - k), cr, cs, nR, nS;

            k = s->acc[i].k;
            cr = al * s->acc[i].gR + occ1;
            cs = al * s->acc[i].gS + nu * s->acc[i].lS;
            nR = cr + WO_MIN(R + WO_MIN(occ1 * (g - 1), evict + load), S + load);
            nS = cs + WO_MIN(S, R + evict);
            R = nR;
            S = nS;
        }
        total += WO_MIN(R + WO_MIN(occ1 * (N - 1 - k), evict), S);
    }
    return total;
}

static double golden_lambda(const struct sim *s, const struct bunit *bu, double budget, double N,
                            double al, double mu, double nu, double hi)
{
    const double gr = 0.6180339887498949;
    double a = 0, b = hi, c = b - gr * (b - a), d = a + gr * (b - a);
    double fc = bound_eval(s, bu, budget, N, al, mu, nu, c);
    double fd = bound_eval(s, bu, budget, N, al, mu, nu, d);
    double best = WO_MAX(bound_eval(s, bu, budget, N, al, mu, nu, 0), WO_MAX(fc, fd));

    for (int it = 0; it < 36; it++) {
        if (fc > fd) {
            b = d;
            d = c;
            fd = fc;
            c = b - gr * (b - a);
            fc = bound_eval(s, bu, budget, N, al, mu, nu, c);
        } else {
            a = c;
            c = d;
            fc = fd;
            d = a + gr * (b - a);
            fd = bound_eval(s, bu, budget, N, al, mu, nu, d);
        }
        best = WO_MAX(best, WO_MAX(fc, fd));
    }
    return best;
}

static double bound(struct sim *s, uint64_t budget)
{
    struct bunit *bu;
    double N = (double)s->w_k, best = 0, bm = 0, bn = 0, pf_best, lhi;

    if (s->w_k == 0)
        return 0;
    bu = calloc(s->nunits ? s->nunits : 1, sizeof(*bu));
    if (!bu)
        return 0;
    pf_best = 0;
    for (int i = 0; i < 4; i++)
        pf_best = WO_MAX(pf_best, s->dm->pf_gbs[i]);
    pf_best = WO_MAX(pf_best, s->dm->rm_pf_gbs) * 1e9;
    for (size_t i = 0; i < s->d->nranges; i++) {
        const struct rr *r = &s->r[i];

        if (!r->ready)
            continue;
        for (uint64_t u = 0; u * r->usize < r->tr->size; u++) {
            struct bunit *x = &bu[r->ubase + u];

            x->s = (double)WO_MIN(r->usize, r->tr->size - u * r->usize);
            /* the cheapest the model allows: best bandwidth, no call cost */
            x->ld = x->s / pf_best;
            x->ev = r->written ? x->s / (s->dm->copyback_gbs * 1e9)
                               : WO_MIN(x->s / (s->dm->collapse_gbs * 1e9),
                                        x->s / (s->dm->copyback_gbs * 1e9));
        }
    }
    qsort(s->acc, s->nacc, sizeof(*s->acc), acc_cmp);
    lhi = 2 * WO_MAX(s->zc_s, 1.0 / pf_best);
    /* coarse grid over the weights, then a finer one around the best */
    for (int pass = 0; pass < 2; pass++) {
        double step = pass ? 0.02 : 0.1, m0 = pass ? bm - 0.1 : 0, n0 = pass ? bn - 0.1 : 0;
        int nstep = pass ? 10 : 10;

        for (int i = 0; i <= nstep; i++) {
            for (int j = 0; j <= nstep; j++) {
                double mu = m0 + i * step, nu = n0 + j * step, v;

                if (mu < -1e-9 || nu < -1e-9 || mu + nu > 1 + 1e-9)
                    continue;
                mu = WO_MAX(mu, 0.0);
                nu = WO_MAX(nu, 0.0);
                v = golden_lambda(s, bu, (double)budget, N, WO_MAX(1 - mu - nu, 0.0), mu, nu, lhi);
                if (v > best) {
                    best = v;
                    bm = mu;
                    bn = nu;
                }
            }
        }
    }
    free(bu);
    return best;
}

/* ---- the run ------------------------------------------------------------- */

static void sim_free(struct sim *s)
{
    if (s->r)
        for (size_t i = 0; i < s->d->nranges; i++) {
            free(s->r[i].ready);
            free(s->r[i].tags);
        }
    free(s->r);
    free(s->bt);
    free(s->rt);
    free(s->bl);
    free(s->bacc);
    free(s->names);
    free(s->acc);
    free(s->lk);
    free(s->tp);
    wo_plan_free(s->plan);
    wo_graphs_free(s->graphs);
    wo_stepper_done(&s->stepper);
}

static int plan_setup(struct sim *s, uint64_t budget)
{
    struct wo_plan_cfg cfg;

    wo_plan_cfg_default(&cfg);
    wo_devmodel_plan_costs(s->dm, &cfg.costs);
    cfg.budget = budget;
    if (s->o->policy)
        wo_plan_cfg_policy(&cfg, wo_policy_globals(s->o->policy));
    return wo_plan_new(&cfg, &s->plan);
}

static int run_events(struct sim *s)
{
    const struct wo_trace_data *d = s->d;

    s->sealed = !has_seal(d);
    if (s->sealed && seal(s) < 0)
        return -ENOMEM;
    for (size_t i = 0; i < d->nevents && !s->err; i++) {
        const struct wo_event *ev = &d->events[i].ev, *gl;
        ssize_t n = wo_graphs_expand(s->graphs, ev, &gl);

        if (n < 0)
            return (int)n;
        switch (ev->type) {
        case WO_EV_SEAL:
            if (seal(s) < 0)
                return -ENOMEM;
            break;
        case WO_EV_FREE:
            if (s->plan && d->events[i].range_id != WO_TRACE_NO_ID)
                wo_plan_range_remove(s->plan, d->events[i].range_id, d->events[i].range_gen);
            break;
        case WO_EV_COPY:
            host_advance(s, ev->t_ns, 0);
            copy(s, ev);
            /* In a trace without sync events (recorded before the shim
             * intercepted them), a copy to the host stands for the wait:
             * synchronous into pageable memory, and PyTorch's .item(),
             * .cpu() and nonzero() synchronise the stream right after one
             * into pinned memory. The recorded gap after it holds the
             * recording run's wait. With sync events, the syncs are the
             * waits (a wait at both would count the recorded wait twice). */
            if (ev->c.kind == WO_COPY_D2H && !s->has_syncs)
                host_wait(s, i);
            break;
        case WO_EV_SYNC:
            host_advance(s, ev->t_ns, 0);
            host_wait(s, i);
            break;
        case WO_EV_LAUNCH:
            if (n == 0)
                break; /* recorded into a capture: it runs with the graph */
            host_advance(s, ev->t_ns, s->launch_s);
            kernel(s, ev);
            break;
        case WO_EV_GRAPH_LAUNCH:
            host_advance(s, ev->t_ns, s->launch_s);
            for (ssize_t k = 0; k < n; k++)
                kernel(s, &gl[k]);
            break;
        default:
            break;
        }
        if (s->plan && s->sealed && (ev->type == WO_EV_LAUNCH || ev->type == WO_EV_GRAPH_LAUNCH ||
                                     ev->type == WO_EV_CAPTURE_BEGIN || ev->type == WO_EV_CAPTURE_END ||
                                     ev->type == WO_EV_GRAPH_INSTANTIATE)) {
            if (wo_plan_event(s->plan, ev) < 0)
                return -ENOMEM;
            apply_actions(s);
        }
    }
    return s->err;
}

static int name_cmp(const void *a, const void *b)
{
    const struct wo_replay_name *x = a, *y = b;
    double tx = x->read_s + x->stall_s, ty = y->read_s + y->stall_s;

    if (tx != ty)
        return tx > ty ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* One pass of the simulation; oracle: NULL for the planner (or none with
 * no_prefetch), else the units resident throughout (the clairvoyant static
 * schedule). Fills s (the caller frees it with sim_free). */
/* The device budget the recording run resolved at seal (INFO
 * `device_budget`, docs/trace-format.md); 0 when the trace has none. */
static uint64_t recorded_budget(const struct wo_trace_data *d)
{
    const char *v = wo_trace_data_info(d, "device_budget");

    return v ? strtoull(v, NULL, 10) : 0;
}

static int sim_once(const struct wo_trace_data *d, const struct wo_replay_opts *o,
                    const uint8_t *oracle, const double *post_sync, double *post_sync_out,
                    struct sim *s, uint64_t *ret_budget, uint64_t *ret_managed, char *msg,
                    size_t msglen)
{
    uint64_t managed = 0, devbytes = 0, budget;
    uint32_t nunits = 0;
    int r;

    memset(s, 0, sizeof(*s));
    for (size_t i = 0; i < d->nevents && !s->has_syncs; i++)
        s->has_syncs = d->events[i].ev.type == WO_EV_SYNC;
    s->post_sync = post_sync;
    s->post_sync_out = post_sync_out;
    s->d = d;
    s->o = o;
    s->dm = o->dm;
    s->oracle = oracle;
    s->hbm_s = 1.0 / (s->dm->hbm_gbs * 1e9);
    s->zc_s = 1.0 / (s->dm->zc_gbs * 1e9);
    s->kernel_s = s->dm->kernel_us * 1e-6;
    s->launch_s = s->dm->launch_us * 1e-6;
    s->sync_s = s->dm->sync_us * 1e-6;
    s->host_scale = o->host_scale > 0 ? o->host_scale : 1.0;
    s->graphs = wo_graphs_new();
    if (!s->graphs || setup_ranges(s) < 0 || prepass(s) < 0)
        return -ENOMEM;
    for (size_t i = 0; i < d->nranges; i++) {
        struct rr *x = &s->r[i];

        if (x->place == WO_PLACE_MANAGED) {
            managed += x->tr->size;
            x->usize = (x->no_slices || !x->slice || x->slice >= x->tr->size)
                           ? x->tr->size
                           : WO_MAX(x->slice, (uint64_t)(2 * WO_MiB));
            x->ubase = nunits;
            nunits += (uint32_t)((x->tr->size + x->usize - 1) / x->usize);
        } else if (x->place == WO_PLACE_DEVICE) {
            devbytes += x->tr->size;
        }
    }
    s->nunits = nunits;
    if (o->budget_frac > 0)
        budget = (uint64_t)((double)managed * o->budget_frac);
    else if (o->budget_bytes)
        budget = o->budget_bytes;
    else if (o->policy)
        budget = wo_policy_device_budget(o->policy, s->dm->device_bytes,
                                         s->dm->device_bytes > devbytes ? s->dm->device_bytes - devbytes : 0);
    else if (!(budget = recorded_budget(d)))
        budget = (s->dm->device_bytes > devbytes ? s->dm->device_bytes - devbytes : 0) / 2;
    *ret_budget = budget;
    *ret_managed = managed;
    if (s->nsteps_total < 2) {
        snprintf(msg, msglen, "no repeating step found in the trace (the launches after seal "
                 "form no period seen at least three times): nothing to measure per step");
        return -ENODATA;
    }
    s->warmup = o->warmup != UINT_MAX ? o->warmup
                                      : (unsigned)WO_MAX(WO_MIN((uint64_t)3, s->nsteps_total / 2),
                                                         (s->nsteps_total - 1) / 4);
    if (s->warmup >= s->nsteps_total - 1)
        s->warmup = (unsigned)(s->nsteps_total - 2);
    s->wstart = s->warmup;
    s->wend = s->nsteps_total - 1;
    if (!oracle && !o->no_prefetch && managed && (r = plan_setup(s, budget)) < 0)
        return r;
    if (o->timeline && !oracle)
        fprintf(o->timeline, "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
    r = run_events(s);
    if (o->timeline && !oracle)
        fprintf(o->timeline, "%s{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":1,\"args\":{\"name\":\"GPU compute\"}},\n"
                "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":2,\"args\":{\"name\":\"UVM (prefetch thread)\"}}\n]}\n",
                s->tl_n ? ",\n" : "");
    if (r < 0)
        return r;
    if (s->in_window || s->step <= s->wend) {
        snprintf(msg, msglen, "the measured window did not close (steps %llu..%llu of %llu)",
                 (unsigned long long)s->wstart, (unsigned long long)s->wend,
                 (unsigned long long)s->nsteps_total);
        return -EINVAL;
    }
    return 0;
}

struct ocand {
    double density;
    uint32_t unit;
};

static int ocand_cmp(const void *a, const void *b)
{
    const struct ocand *x = a, *y = b;

    if (x->density != y->density)
        return x->density > y->density ? -1 : 1;
    return x->unit < y->unit ? -1 : x->unit > y->unit;
}

/* The clairvoyant static schedule: the units whose residency saves the most
 * GPU time per byte over the measured window (it knows every access), as
 * many as the budget holds, resident from the start. */
static uint8_t *oracle_set(const struct sim *s, uint64_t budget)
{
    double *save = calloc(s->nunits ? s->nunits : 1, sizeof(*save));
    struct ocand *c = calloc(s->nunits ? s->nunits : 1, sizeof(*c));
    uint8_t *set = calloc(s->nunits ? s->nunits : 1, 1);
    double used = 0;

    if (!save || !c || !set) {
        free(save);
        free(c);
        free(set);
        return NULL;
    }
    for (size_t i = 0; i < s->nacc; i++)
        save[s->acc[i].unit] += s->acc[i].gS - s->acc[i].gR + s->acc[i].lS;
    for (size_t i = 0; i < s->d->nranges; i++) {
        const struct rr *r = &s->r[i];

        if (!r->ready)
            continue;
        for (uint64_t u = 0; u * r->usize < r->tr->size; u++) {
            double sz = (double)WO_MIN(r->usize, r->tr->size - u * r->usize);

            c[r->ubase + u] = (struct ocand){save[r->ubase + u] / sz, (uint32_t)(r->ubase + u)};
            save[r->ubase + u] = sz; /* reused: the unit's size */
        }
    }
    qsort(c, s->nunits, sizeof(*c), ocand_cmp);
    for (uint32_t i = 0; i < s->nunits; i++) {
        if (c[i].density <= 0 || used + save[c[i].unit] > (double)budget)
            continue;
        used += save[c[i].unit];
        set[c[i].unit] = 1;
    }
    free(save);
    free(c);
    return set;
}

static int dbl_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

/* The median of the step durations between consecutive boundary times: a
 * decode step's time without the phase changes a window may contain (a
 * generate call ending and the next one's prefill count as one long step). */
static double median_step(const double *bt, size_t n)
{
    double *d, m;

    if (n < 2 || !(d = malloc((n - 1) * sizeof(*d))))
        return 0;
    for (size_t i = 1; i < n; i++)
        d[i - 1] = bt[i] - bt[i - 1];
    qsort(d, n - 1, sizeof(*d), dbl_cmp);
    m = (n - 1) % 2 ? d[(n - 1) / 2] : (d[(n - 1) / 2 - 1] + d[(n - 1) / 2]) / 2;
    free(d);
    return m;
}

/* The mean predicted and recorded time of the window's decode steps: those
 * whose launches are at most 1.25x the median step's (a step that holds a
 * generate call's end and the next prefill has ~3x). */
static void decode_steps(const struct sim *s, struct wo_replay_result *res)
{
    double *l, lim, p = 0, r = 0, acc[4] = {0, 0, 0, 0};
    uint64_t n = 0;

    if (s->nbt < 2 || !(l = malloc((s->nbt - 1) * sizeof(*l))))
        return;
    for (size_t i = 1; i < s->nbt; i++)
        l[i - 1] = s->bl[i];
    qsort(l, s->nbt - 1, sizeof(*l), dbl_cmp);
    lim = 1.25 * l[(s->nbt - 1) / 2];
    free(l);
    for (size_t i = 1; i < s->nbt; i++) {
        if (s->bl[i] > lim)
            continue;
        p += s->bt[i] - s->bt[i - 1];
        r += s->rt[i] - s->rt[i - 1];
        for (int k = 0; k < 4; k++)
            acc[k] += s->bacc[i][k] - s->bacc[i - 1][k];
        n++;
    }
    if (n) {
        res->decode_step_s = p / (double)n;
        res->recorded_decode_step_s = r / (double)n;
        res->decode_steps = n;
        res->decode_zc_bytes = acc[0] / (double)n;
        res->decode_pcie_bytes = (acc[0] + acc[1]) / (double)n;
        res->decode_stall_s = acc[2] / (double)n;
        res->decode_host_s = acc[3] / (double)n;
    }
}

/* The pacing pass: the trace under the placements it recorded, to learn the
 * host's own work after each point where it waited for the GPU (the
 * recorded gap less the simulated wait, which stands for the recording
 * run's). Replays under other placements keep that work and wait for their
 * own GPU. NULL when the pass fails (each replay then subtracts its own
 * wait). */
static double *pacing_pass(const struct wo_trace_data *d, const struct wo_replay_opts *o)
{
    struct wo_replay_opts po = *o;
    struct sim ps;
    uint64_t b, m;
    char msg[256];
    double *out = calloc(d->nevents ? d->nevents : 1, sizeof(*out));

    if (!out)
        return NULL;
    po.policy = NULL;
    po.all_device = false;
    po.no_prefetch = false;
    po.budget_frac = 0;
    po.budget_bytes = 0;
    po.no_bound = true;
    po.timeline = NULL;
    po.host_scale = 1; /* the recorded host work, as recorded */
    if (sim_once(d, &po, NULL, NULL, out, &ps, &b, &m, msg, sizeof(msg)) < 0) {
        free(out);
        out = NULL;
    }
    sim_free(&ps);
    return out;
}

int wo_replay_run(const struct wo_trace_data *d, const struct wo_replay_opts *o,
                  struct wo_replay_result *res, char *msg, size_t msglen)
{
    double *pacing = NULL;
    struct sim s;
    uint64_t managed = 0, budget = 0;
    int r;

    memset(res, 0, sizeof(*res));
    /* Under the recorded placements at the recorded host speed the main
     * pass is the pacing pass: it subtracts its own waits (post_sync NULL). */
    if (o->policy || o->all_device || o->no_prefetch || o->budget_frac > 0 || o->budget_bytes ||
        (o->host_scale > 0 && o->host_scale != 1))
        pacing = pacing_pass(d, o);
    r = sim_once(d, o, NULL, pacing, NULL, &s, &budget, &managed, msg, msglen);
    if (r < 0)
        goto out;
    {
        double ws = (double)(s.wend - s.wstart);

        res->warmup = s.warmup;
        res->window_steps = s.wend - s.wstart;
        res->steps = s.steps_total;
        res->launches = s.launches;
        res->total_s = WO_MAX(WO_MAX(s.cpu_t, s.gpu_free), s.uvm_free);
        res->managed_bytes = managed;
        res->budget = budget;
        res->max_resident = s.max_resident;
        res->step_launches = s.step_launches;
        res->step_s = (s.w_end_t - s.w_t0) / ws;
        res->median_step_s = median_step(s.bt, s.nbt);
        res->recorded_median_step_s = median_step(s.rt, s.nbt);
        decode_steps(&s, res);
        res->cpu_step_s = (s.w_end_cpu - s.w_cpu0) / ws;
        res->zc_bytes_step = s.zc_b / ws;
        res->prefetch_bytes_step = s.pf_b / ws;
        res->evict_bytes_step = s.ev_b / ws;
        res->copy_bytes_step = s.copy_b / ws;
        /* copy-back evictions cross PCIe too (device to host) */
        res->pcie_bytes_step = res->zc_bytes_step + res->prefetch_bytes_step + res->copy_bytes_step +
                               s.cb_b / ws;
        res->stall_s_step = s.stall_s / ws;
        res->names = calloc(s.nnames ? s.nnames : 1, sizeof(*res->names));
        if (!res->names) {
            r = -ENOMEM;
            goto out;
        }
        for (size_t i = 0; i < s.nnames; i++) {
            struct wo_replay_name *x = &res->names[i];

            *x = s.names[i];
            x->hbm_bytes /= ws;
            x->zc_bytes /= ws;
            x->miss_bytes /= ws;
            x->hit_bytes /= ws;
            x->read_s /= ws;
            x->stall_s /= ws;
            x->prefetched /= ws;
            x->evicted /= ws;
        }
        res->nnames = s.nnames;
        qsort(res->names, res->nnames, sizeof(*res->names), name_cmp);
        if (!o->no_bound && managed) {
            struct sim so;
            uint8_t *set;
            uint64_t b2, m2;

            double lb = bound(&s, budget);

            set = oracle_set(&s, budget);
            if (!set) {
                r = -ENOMEM;
                goto out;
            }
            r = sim_once(d, o, set, pacing, NULL, &so, &b2, &m2, msg, msglen);
            if (r == 0) {
                res->oracle_step_s = (so.w_end_t - so.w_t0) / (double)(so.wend - so.wstart);
                /* The host's own work bounds the window too, less the GPU's
                 * lag behind the host where the window opens (the window
                 * runs from GPU start to GPU start): the lag depends on the
                 * schedule, so the larger of the two simulated ones is taken
                 * (in a steady state it is the same at both ends). */
                /* (the host work before the link's slowdown: a schedule
                 * with less traffic slows the host less) */
                lb = WO_MAX(lb, s.w_end_base - s.w_base0 - WO_MAX(s.w_lag, so.w_lag));
                res->bound_step_s = lb / ws;
            }
            sim_free(&so);
            free(set);
            if (r < 0)
                goto out;
        }
    }
out:
    sim_free(&s);
    free(pacing);
    if (r < 0)
        wo_replay_result_free(res);
    return r;
}

void wo_replay_result_free(struct wo_replay_result *res)
{
    free(res->names);
    memset(res, 0, sizeof(*res));
}

int wo_replay_host_scale_for(const struct wo_trace_data *d, const struct wo_replay_opts *o,
                             double decode_step_s, double *scale, char *msg, size_t msglen)
{
    struct wo_replay_opts ro = *o;
    struct wo_replay_result res;
    double f0 = 0, p0 = 0, f = 1;
    int r;

    ro.policy = NULL;
    ro.all_device = true;
    ro.no_bound = true;
    ro.timeline = NULL;
    for (int it = 0; it < 12; it++) {
        double p, nf;

        ro.host_scale = f;
        r = wo_replay_run(d, &ro, &res, msg, msglen);
        if (r < 0)
            return r;
        p = res.decode_step_s;
        wo_replay_result_free(&res);
        if (p <= 0) {
            snprintf(msg, msglen, "no decode step to calibrate on");
            return -ENODATA;
        }
        if (fabs(p - decode_step_s) <= 1e-4 * decode_step_s) {
            *scale = f;
            return 0;
        }
        /* the step grows with the host's work: proportional first, then secant */
        nf = (it == 0 || p == p0) ? f * decode_step_s / p : f + (decode_step_s - p) * (f - f0) / (p - p0);
        f0 = f;
        p0 = p;
        f = WO_MIN(WO_MAX(nf, 0.05), 20.0);
        if (f == f0) {
            snprintf(msg, msglen, "no host speed in 0.05x-20x gives a %.3f ms all-GPU decode step",
                     decode_step_s * 1e3);
            return -ERANGE;
        }
    }
    *scale = f;
    return 0;
}
