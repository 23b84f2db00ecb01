/* tools/replay-read.c: the trace as the replay sees it: its ranges, the
 * tags and names on them, the slices launches touch and the steps they
 * form (the planner's step rule, over every named range). */
#include "tools/replay-int.h"

#include <string.h>

struct rr *wo_replay_rr_of(struct sim *s, uint32_t id, uint32_t gen)
{
    const struct wo_trace_range *t = wo_trace_data_range(s->d, id, gen);

    return t ? &s->r[t - s->d->ranges] : NULL;
}

static int name_index(struct sim *s, const char *name, uint32_t place)
{
    for (size_t i = 0; i < s->nnames; i++)
        if (strcmp(s->names[i].name, name) == 0)
            return (int)i;
    if (wo_grow((void **)&s->names, &s->capnames, s->nnames + 1, sizeof(*s->names)) < 0)
        return -1;
    memset(&s->names[s->nnames], 0, sizeof(s->names[0]));
    s->names[s->nnames].name = name;
    s->names[s->nnames].place = place;
    return (int)s->nnames++;
}

struct rtag *wo_replay_tag_in(const struct rr *r, uint64_t off)
{
    for (size_t i = 0; i < r->ntags; i++)
        if (off >= r->tags[i].offset && off - r->tags[i].offset < r->tags[i].size)
            return &r->tags[i];
    return NULL;
}

struct rtag *wo_replay_tag_at(const struct rr *r, uint64_t off)
{
    struct rtag *t = wo_replay_tag_in(r, off);

    return t ? t : r->ntags ? &r->tags[0] : NULL;
}

int wo_replay_name_at(const struct rr *r, uint64_t off)
{
    const struct rtag *t = wo_replay_tag_at(r, off);

    return t ? t->name : -1;
}

/* ---- ranges, tags, names ------------------------------------------------- */

int wo_replay_setup_ranges(struct sim *s)
{
    const struct wo_trace_data *d = s->d;

    s->r = calloc(d->nranges ? d->nranges : 1, sizeof(*s->r));
    if (!s->r)
        return -ENOMEM;
    for (size_t i = 0; i < d->nranges; i++) {
        s->r[i].tr = &d->ranges[i];
        s->r[i].place = WO_PLACE_DEVICE;
        s->r[i].su = -1; /* streamed: replay-sim.c, stream_units */
    }
    for (size_t i = 0; i < d->ntags; i++) {
        const struct wo_trace_tag *t = &d->tags[i];
        struct rr *r = wo_replay_rr_of(s, t->id, t->gen);
        uint64_t biggest = 0;
        int prio, ni;
        bool ns;
        uint32_t pl;

        if (!r || !t->name)
            continue;
        pl = wo_replay_place_of_tag(s, t, r->tr, &prio, &ns);
        ni = name_index(s, t->name, pl);
        if (ni < 0)
            return -ENOMEM;
        s->names[ni].bytes += t->size;
        {
            struct rtag *nt = realloc(r->tags, (r->ntags + 1) * sizeof(*nt));

            if (!nt)
                return -ENOMEM;
            r->tags = nt;
            r->tags[r->ntags++] = (struct rtag){
                .offset = t->offset, .size = t->size, .name = ni, .place = pl, .su = -1,
                .pick_copy = -1};
        }
        /* its rule's priority and slices: the largest tag's */
        for (size_t j = 0; j + 1 < r->ntags; j++)
            biggest = WO_MAX(biggest, r->tags[j].size);
        if (t->size > biggest) {
            r->prio = prio;
            r->no_slices = ns;
        }
    }
    wo_replay_place_recorded(s);
    /* a range is placed as its largest tag (after the recorded changes);
     * one whose tags are placed apart (llama.cpp's buffer) is mixed: each
     * hit reads as its tag does */
    for (size_t i = 0; i < d->nranges; i++) {
        struct rr *r = &s->r[i];
        size_t big = 0;

        for (size_t j = 1; j < r->ntags; j++) {
            r->mixed |= r->tags[j].place != r->tags[0].place;
            if (r->tags[j].size > r->tags[big].size)
                big = j;
        }
        if (r->ntags)
            r->place = r->tags[big].place;
    }
    /* picked staging: a tensor's launches read a device buffer its picked
     * rows were copied into, the copy made once a registration and reused
     * by the registration's later launches on the stream; the rows of its
     * hot experts come from the device, the others over the link (by the
     * copy kernel, or by the copy engine before the launch) */
    for (size_t i = 0; i < d->npicks; i++) {
        /* the steady state: a hot set made after the first steps would
         * otherwise count those steps' rows as crossing the link (the
         * H200's 128-expert b8 trace: 6.4 GB a step on average, 4.3 at
         * most in its measured 79 ms steps) */
        const struct wo_trace_pick st =
            wo_trace_pick_steady(&d->picks[i], d->picks_base ? &d->picks_base[i] : NULL);
        const struct wo_trace_pick *p = &st;
        struct rr *r = wo_replay_rr_of(s, p->id, p->gen);
        struct rtag *t = r ? wo_replay_tag_in(r, p->offset) : NULL;
        uint64_t launches = p->staged + p->reused;

        uint64_t row = p->n_experts ? p->bytes / p->n_experts : 0;
        uint64_t hot = WO_MIN(p->hot_rows, p->rows);

        if (t && t->offset == p->offset && launches) {
            t->pick_copy = (double)((p->rows - hot) * row) / (double)launches;
            t->pick_hot = (double)(hot * row) / (double)launches;
            t->pick_engine =
                (double)(WO_MIN(p->engine_rows, p->rows - hot) * row) / (double)launches;
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
        struct rr *r = wo_replay_rr_of(s, ev->l.hits[i].id, ev->l.hits[i].gen);
        uint64_t off = ev->l.hits[i].offset;

        if (!r || ev->l.hits[i].id >= best || !wo_hit_pointer_like(&ev->l.hits[i]))
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
unsigned wo_replay_is_boundary(struct sim *s, const struct wo_event *ev)
{
    uint64_t key;

    if (!s->sealed)
        return 0;
    key = launch_key(s, ev);
    if (key == UINT64_MAX)
        return 0;
    return wo_stepper_feed(&s->stepper, key);
}

bool wo_replay_has_seal(const struct wo_trace_data *d)
{
    for (size_t i = 0; i < d->nevents; i++)
        if (d->events[i].ev.type == WO_EV_SEAL)
            return true;
    return false;
}

/* Pre-pass: slices (gcd of hit offsets) and the number of steps. */
int wo_replay_prepass(struct sim *s)
{
    const struct wo_trace_data *d = s->d;
    struct wo_graphs *g = wo_graphs_new();

    if (!g)
        return -ENOMEM;
    s->sealed = !wo_replay_has_seal(d);
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

            unsigned nb = wo_replay_is_boundary(s, l);

            if (nb) {
                s->nsteps_total++;
                s->steps_total += nb;
            }
            for (unsigned h = 0; h < l->nhits && h < WO_EV_MAX_HITS; h++) {
                struct rr *r = wo_replay_rr_of(s, l->l.hits[h].id, l->l.hits[h].gen);

                /* (a word that is no weight pointer teaches no slice: core/event.h) */
                if (r && l->l.hits[h].offset && l->l.hits[h].offset < r->tr->size &&
                    (!r->ntags || wo_hit_pointer_like(&l->l.hits[h])))
                    r->slice = wo_plan_slice_learn(r->slice, l->l.hits[h].offset);
                /* a mixed range's tensors are read each by itself: the
                 * slices a tag's hits make are the tag's */
                if (r && r->mixed && wo_hit_pointer_like(&l->l.hits[h])) {
                    struct rtag *t = wo_replay_tag_in(r, l->l.hits[h].offset);

                    if (t && l->l.hits[h].offset > t->offset)
                        t->slice = wo_plan_slice_learn(t->slice, l->l.hits[h].offset - t->offset);
                }
            }
        }
    }
    wo_graphs_free(g);
    wo_stepper_done(&s->stepper);
    wo_stepper_init(&s->stepper);
    return 0;
}

/* Placement changes the recording made (WO_EV_PLACE) win over its tags'
 * placements, when the replay keeps the recorded placements. */
void wo_replay_place_recorded(struct sim *s)
{
    const struct wo_trace_data *d = s->d;

    if (!s->o->policy && !s->o->all_device) {
        /* placement changes the trace recorded win over the tags */
        for (size_t i = 0; i < d->nevents; i++) {
            const struct wo_event *ev = &d->events[i].ev;
            struct rr *r;

            if (ev->type != WO_EV_PLACE || !(r = wo_replay_rr_of(s, ev->p.id, ev->p.gen)))
                continue;
            if (ev->p.to < WO_PLACE_DEVICE || ev->p.to > WO_PLACE_MANAGED)
                continue;
            /* a change of the whole range, or of the tags that begin in
             * its bytes (seal places llama.cpp's buffer tag by tag) */
            if (ev->p.offset == 0 && ev->p.bytes >= r->tr->size)
                r->place = ev->p.to;
            for (size_t k = 0; k < r->ntags; k++)
                if (r->tags[k].offset >= ev->p.offset &&
                    r->tags[k].offset - ev->p.offset < ev->p.bytes)
                    r->tags[k].place = ev->p.to;
        }
    }
}
