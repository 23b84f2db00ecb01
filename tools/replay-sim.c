/* tools/replay-sim.c: the replay's simulation (see replay.h; the model
 * is written down in docs/prefetch.md).
 *
 * Resources of the model, each serial: the engine's host thread (launch
 * pacing from the trace's own gaps), the GPU compute stream (kernels in
 * launch order), the PCIe host->device link (zero-copy reads of kernels and
 * prefetch transfers book it first come, first served) and the UVM engine
 * (the prefetch thread: every prefetch and eviction in turn; UVM work
 * serialises, device-facts.md). The planner is the shim's own
 * (uvm/plan.c); its actions are timed here. */
#include "tools/replay-int.h"

#include <limits.h>
#include <math.h>
#include <string.h>

#include "uvm/plan-stream.h"

#define PIECE (64 * WO_KiB) /* residency granularity of the simulation */

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
        r = wo_replay_rr_of(s, a.id, a.gen);
        if (!r || !r->ready)
            continue;
        ni = wo_replay_name_at(r, a.offset);
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
            t1 = wo_replay_link_use(s, t1, (double)a.bytes / bps, 1);
            s->uvm_free = t1;
            mark_ready(r, a.offset, a.bytes, t1);
            if (s->in_window) {
                s->pf_b += (double)a.bytes;
                s->pf_calls++;
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
        wo_replay_tl_event(s, 2, label, t0, t1);
    }
    s->max_resident = WO_MAX(s->max_resident, wo_plan_resident_bytes(s->plan));
}

/* ---- the host thread ---------------------------------------------------- */

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
        gap = wo_replay_link_slowdown(s, gap);
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
    if (wo_grow((void **)&s->acc, &s->capacc, s->nacc + 1, sizeof(*s->acc)) < 0)
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

/* Read multiplicity (docs/prefetch.md, "Streaming"): each hit's bytes and
 * the granules they cover, per tag, closed into the names at each step
 * boundary in the window (and dropped outside it). */
#define MULT_GRANULES 64

static void mult_hit(struct rtag *t, uint64_t lo, uint64_t hi)
{
    uint64_t g = (t->size + MULT_GRANULES - 1) / MULT_GRANULES;

    lo = WO_MAX(lo, t->offset);
    hi = WO_MIN(hi, t->offset + t->size);
    if (!g || hi <= lo)
        return;
    t->rd += (double)(hi - lo);
    for (uint64_t i = (lo - t->offset) / g; i <= (hi - 1 - t->offset) / g && i < MULT_GRANULES;
         i++)
        t->mask |= UINT64_C(1) << i;
}

static void mult_close(struct sim *s, bool count)
{
    for (size_t i = 0; i < s->d->nranges; i++)
        for (size_t j = 0; j < s->r[i].ntags; j++) {
            struct rtag *t = &s->r[i].tags[j];
            uint64_t g = (t->size + MULT_GRANULES - 1) / MULT_GRANULES;

            if (count && t->rd > 0 && t->name >= 0) {
                s->names[t->name].mult_read += t->rd;
                s->names[t->name].mult_distinct +=
                    (double)WO_MIN((uint64_t)__builtin_popcountll(t->mask) * g, t->size);
            }
            t->rd = 0;
            t->mask = 0;
        }
}

/* ---- the streaming executor (uvm/stream.c; docs/prefetch.md, Streaming) --
 *
 * Under `prefetch: {mode: stream}` every `host` range but an embedding is
 * copied once a step into a device slot and its launches read the slot:
 * the copies run on the copy engine (at the pinned rate; with
 * pinned_copies off the shim's copy kernel reads the range in place, at
 * the zero-copy rate), booked on the link like prefetches, in the order
 * the last complete step read the ranges first, as far ahead as the slots
 * allow (a slot is free once the reads of the range it held have ended);
 * a launch waits for its range's copy. The first step, before an order is
 * known, copies each range when a launch first needs it. */

/* Issues the copy of stream unit u for step `step` at time `at` at the
 * earliest (its slot free, the copy engine idle). */
static void stream_issue(struct sim *s, uint32_t u, uint64_t step, double at)
{
    struct sunit *x = &s->su[u];
    unsigned slot = (unsigned)(s->ncopies % s->slots);
    double t0 = WO_MAX(at, s->ce_free), t1;

    /* a slot still held by a unit copied ahead and not read yet (the
     * step read another first) is taken now, as the executor does */
    if (s->slot_free[slot] < INFINITY)
        t0 = WO_MAX(t0, s->slot_free[slot]);

    t1 = wo_replay_link_use(s, t0, (double)x->size * s->copy_s, 1);
    s->ce_free = t1;
    s->slot_free[slot] = INFINITY; /* until its reads are seen */
    x->st_step = step;
    x->st_copy = s->ncopies++;
    x->st_ready = t1;
    if (s->in_window)
        s->stream_b += (double)x->size;
    wo_replay_tl_event(s, 2, "stage", t0, t1);
}

/* Copies ahead of the launches, in the last step's order, while slots are
 * free of units not read yet; at least the one after the unit just read. */
static void stream_ahead(struct sim *s, double at)
{
    while (s->nsorder) {
        unsigned slot = (unsigned)(s->ncopies % s->slots);
        uint32_t u = s->sorder[s->la_pos];

        if (s->slot_free[slot] == INFINITY)
            break; /* held by a unit the step has not read yet */
        if (s->su[u].st_step != s->la_step)
            stream_issue(s, u, s->la_step, at);
        if (++s->la_pos == s->nsorder) {
            s->la_pos = 0;
            s->la_step++;
        }
    }
}

/* A launch at `start` reads stream unit u: when its bytes are in the slot
 * (the copy issued now if none serves this step). The step's first read of
 * each unit makes this step's order. */
static double stream_read(struct sim *s, uint32_t u, double start)
{
    struct sunit *x = &s->su[u];

    if (x->st_seen != s->step) {
        x->st_seen = s->step;
        if (wo_grow((void **)&s->corder, &s->capcorder, s->ncorder + 1, sizeof(*s->corder)) < 0) {
            s->err = -ENOMEM;
            return start;
        }
        s->corder[s->ncorder++] = u;
    }
    if (x->st_step == UINT64_MAX || x->st_step < s->step) {
        /* not copied ahead (the first step, or another order): now, and
         * the copies ahead go on from the unit after it. A copy made
         * ahead for a later step serves this read too (the same bytes):
         * a unit this step reads first and again at its end (a small read
         * of the last layer's experts at the step's start, in
         * h200-cb-moe32-uniform-gpu) was copied for the next step after
         * the step's last unit, and each of its reads that followed took
         * that copy for the wrong step: five copies of it a step */
        size_t i;

        for (i = 0; i < s->nsorder && s->sorder[i] != u; i++)
            ;
        if (i < s->nsorder) {
            s->la_pos = (i + 1) % s->nsorder;
            s->la_step = s->step + (i + 1 == s->nsorder);
        }
        stream_issue(s, u, s->step, start);
    }
    return x->st_ready;
}

/* The launch that read unit u ends at `end`: its slot is free from then on
 * (until a later launch of the step reads it again). */
static void stream_done(struct sim *s, uint32_t u, double end)
{
    struct sunit *x = &s->su[u];
    unsigned slot = (unsigned)(x->st_copy % s->slots);

    /* a copy for a later step stays until that step's reads (above) */
    if (s->ncopies - x->st_copy <= s->slots && x->st_step <= s->step)
        s->slot_free[slot] = s->slot_free[slot] == INFINITY ? end : WO_MAX(s->slot_free[slot], end);
    stream_ahead(s, end);
}

/* At a step boundary: this step's order is the next one's plan. */
static void stream_step(struct sim *s)
{
    uint32_t *t;

    if (!s->slots || !s->ncorder)
        return;
    t = s->sorder;
    s->sorder = s->corder;
    s->nsorder = s->ncorder;
    s->corder = t;
    {
        size_t c = s->capsorder;
        s->capsorder = s->capcorder;
        s->capcorder = c;
    }
    s->ncorder = 0;
}

/* Where a hit on a mixed range (replay-int.h) reads: its tag's placement;
 * the bytes between tags (alignment padding) on the device. A managed tag
 * reads as managed only where the range is managed (its pieces are modelled
 * per range), else in place as host memory. Under streaming, each host tag
 * is a stream unit of its own (stream_units). */
/* A stream unit of `size` bytes; its index, or -1 (no memory: s->err). */
static int32_t stream_unit(struct sim *s, uint64_t size)
{
    if (wo_grow((void **)&s->su, &s->capsu, s->nsu + 1, sizeof(*s->su)) < 0) {
        s->err = -ENOMEM;
        return -1;
    }
    s->su[s->nsu] = (struct sunit){.size = size, .st_step = UINT64_MAX, .st_seen = UINT64_MAX};
    return (int32_t)s->nsu++;
}

/* Whether a tag names an embedding (gathered by token id: never streamed,
 * wo_stream_gathered). */
static bool tag_gathered(const struct sim *s, const struct rtag *t)
{
    return t->name >= 0 && wo_stream_gathered(s->names[t->name].name);
}

/* Whether a mixed range holds more than 511 bytes that no tag names
 * between two of its tags: the shim then reads it in place, never splits it
 * (uvm/place.c, unnamed_before; docs/prefetch.md, What is streamed). */
static bool unnamed_between(const struct rr *x)
{
    for (size_t i = 0; i < x->ntags; i++) {
        uint64_t end = x->tags[i].offset + x->tags[i].size, next = UINT64_MAX;

        for (size_t j = 0; j < x->ntags; j++)
            if (x->tags[j].offset >= end && x->tags[j].offset < next)
                next = x->tags[j].offset;
        if (next != UINT64_MAX && next - end > 511)
            return true;
    }
    return false;
}

/* The executor's units: each host range but an embedding, and in a mixed
 * range each host tag (a sub-span), unless bytes no tag names lie between
 * its tags. */
static int stream_units(struct sim *s)
{
    for (size_t i = 0; i < s->d->nranges; i++) {
        struct rr *x = &s->r[i];
        bool whole = x->place == WO_PLACE_HOST && !x->mixed;

        x->su = -1;
        for (size_t t = 0; t < x->ntags; t++) {
            x->tags[t].su = -1;
            whole &= !tag_gathered(s, &x->tags[t]);
        }
        if (whole)
            x->su = stream_unit(s, x->tr->size);
        else if (x->mixed && !unnamed_between(x))
            for (size_t t = 0; t < x->ntags; t++)
                if (x->tags[t].place == WO_PLACE_HOST && !tag_gathered(s, &x->tags[t]))
                    x->tags[t].su = stream_unit(s, x->tags[t].size);
    }
    return s->err;
}

static uint32_t hit_place(const struct rr *r, const struct rtag *t)
{
    uint32_t p = t ? t->place : WO_PLACE_DEVICE;

    if (p == WO_PLACE_MANAGED && !(r->place == WO_PLACE_MANAGED && r->ready))
        p = WO_PLACE_HOST;
    return p;
}

/* A managed tensor (tag t of range r) the prefetcher holds wholly on the
 * device by `at`: its launches read it there, also under picked staging
 * (no copy). */
static bool managed_whole(const struct rr *r, const struct rtag *t, double at)
{
    if (!r->ready || !r->npieces)
        return false;
    for (uint64_t p = t->offset / PIECE; p * PIECE < t->offset + t->size; p++)
        if (p >= r->npieces || !(r->ready[p] <= at))
            return false;
    return true;
}

static void kernel(struct sim *s, const struct wo_event *ev)
{
    double start, t_in, hbm = 0, zc = 0, end, le, fixed_hbm = 0, host_zc = 0;
    struct bacc ka[64];
    size_t nka = 0;
    uint32_t streamed[WO_EV_MAX_HITS];
    unsigned nstreamed = 0;
    const char *kname;

    if (wo_replay_is_boundary(s, ev)) {
        if (s->step == s->wstart && !s->in_window)
            window_open(s, WO_MAX(s->cpu_t, s->gpu_free));
        if (s->in_window) {
            if (wo_grow((void **)&s->bt, &s->capbt, s->nbt + 1, sizeof(*s->bt)) < 0 ||
                wo_grow((void **)&s->rt, &s->capr, s->nbt + 1, sizeof(*s->rt)) < 0 ||
                wo_grow((void **)&s->bl, &s->capbl, s->nbt + 1, sizeof(*s->bl)) < 0 ||
                wo_grow((void **)&s->bacc, &s->capbacc, s->nbt + 1, sizeof(*s->bacc)) < 0) {
                s->err = -ENOMEM;
            } else {
                s->bt[s->nbt] = WO_MAX(s->cpu_t, s->gpu_free);
                s->bl[s->nbt] = s->cur_step_launches;
                s->bacc[s->nbt][0] = s->zc_b;
                s->bacc[s->nbt][1] = s->pf_b + s->cb_b + s->copy_b + s->stream_b + s->pick_engine_b;
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
        mult_close(s, s->in_window);
        stream_step(s);
        s->step++;
        s->cur_step_launches = 0;
        wo_replay_tl_event(s, 1, "step", WO_MAX(s->cpu_t, s->gpu_free), -1);
    }
    s->cur_step_launches++;
    s->launches++;
    start = WO_MAX(s->cpu_t, s->gpu_free);
    t_in = start;
    for (unsigned h = 0; h < ev->nhits && h < WO_EV_MAX_HITS; h++) {
        const struct wo_ev_hit *hit = &ev->l.hits[h];
        struct rr *r = wo_replay_rr_of(s, hit->id, hit->gen);
        struct rtag *tag;
        uint32_t place;
        uint64_t end_off, b;
        int32_t su;
        int ni;

        /* on weights, a word that is no pointer (core/event.h) reads nothing */
        if (!r || hit->offset >= r->tr->size || (r->ntags && !wo_hit_pointer_like(hit)))
            continue;
        end_off = wo_plan_extent_end(r->tr->size, r->slice, hit->offset, hit->hi);
        place = s->sealed ? r->place : WO_PLACE_DEVICE;
        tag = wo_replay_tag_at(r, hit->offset);
        su = r->su;
        if (r->mixed) {
            /* a tensor of a buffer of many: its own bytes, its own slices,
             * its own stream unit */
            struct rtag *in = wo_replay_tag_in(r, hit->offset);

            su = in ? in->su : -1;
            if (in)
                end_off = in->offset + wo_plan_extent_end(in->size, in->slice,
                                                          hit->offset - in->offset,
                                                          hit->hi > in->offset ? hit->hi - in->offset
                                                                               : 0);
            if (s->sealed)
                place = hit_place(r, in);
        }
        b = end_off - hit->offset;
        ni = tag ? tag->name : -1;
        if (s->in_window && ni >= 0)
            mult_hit(tag, hit->offset, end_off);
        if (s->sealed && tag && tag->pick_copy >= 0 &&
            (place == WO_PLACE_HOST || place == WO_PLACE_MANAGED) && !managed_whole(r, tag, start)) {
            /* picked staging: rows over the link, by the copy kernel (read
             * in place) or by the copy engine before the launch (the
             * launch's stream waits for them); hot rows and the buffer: dev */
            double dev = (double)b + tag->pick_hot, eng = tag->pick_engine;
            double kz = WO_MAX(0.0, tag->pick_copy - eng), h2d_s = 1.0 / (s->dm->h2d_gbs * 1e9);

            zc += kz;
            hbm += dev;
            if (eng > 0) {
                double t0 = WO_MAX(start, s->ce_free),
                       t1 = wo_replay_link_use(s, t0, eng * h2d_s, 1);

                s->ce_free = t1;
                t_in = WO_MAX(t_in, t1);
                wo_replay_tl_event(s, 2, "picked copy", t0, t1);
            }
            if (s->in_window) {
                s->fixed_link += kz * s->zc_s + eng * h2d_s;
                host_zc += kz * s->zc_s;
                s->pick_b += tag->pick_copy;
                s->pick_engine_b += eng;
                if (ni >= 0) {
                    s->names[ni].zc_bytes += kz;
                    s->names[ni].hbm_bytes += dev;
                    s->names[ni].read_s += kz * s->zc_s + eng * h2d_s + dev * s->hbm_s;
                }
            }
        } else if (place == WO_PLACE_MANAGED && r->ready) {
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
                s->hit_b += mh;
                s->miss_b += mz;
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
        } else if (place == WO_PLACE_HOST && su >= 0 && s->sealed) {
            double wait = stream_read(s, (uint32_t)su, start);

            hbm += (double)b;
            t_in = WO_MAX(t_in, wait);
            if (nstreamed < WO_ARRAY_SIZE(streamed))
                streamed[nstreamed++] = (uint32_t)su;
            if (s->in_window) {
                s->stall_s += WO_MAX(0.0, wait - start);
                if (ni >= 0) {
                    s->names[ni].hbm_bytes += (double)b;
                    s->names[ni].read_s += (double)b * s->hbm_s;
                    s->names[ni].stall_s += WO_MAX(0.0, wait - start);
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
    le = zc > 0 ? wo_replay_link_use(s, t_in, zc * s->zc_s, 0) : t_in;
    end = WO_MAX(t_in + s->kernel_s + hbm * s->hbm_s, le);
    s->gpu_free = end;
    for (unsigned i = 0; i < nstreamed; i++)
        stream_done(s, streamed[i], end);
    if (s->in_window) {
        s->zc_b += zc;
        bound_kernel(s, ka, nka, s->kernel_s + fixed_hbm * s->hbm_s, host_zc);
        s->w_k++;
    }
    kname = wo_trace_data_kernel(s->d, ev->l.func);
    wo_replay_tl_event(s, 1, kname ? kname : "kernel", start, end);
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
    wo_replay_tl_event(s, 1, "copy", t0, t1);
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

/* ---- the run ------------------------------------------------------------- */

void wo_replay_sim_free(struct sim *s)
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
    free(s->slot_free);
    free(s->su);
    free(s->sorder);
    free(s->corder);
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

    s->sealed = !wo_replay_has_seal(d);
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

int wo_replay_sim_once(const struct wo_trace_data *d, const struct wo_replay_opts *o,
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
    if (!s->graphs || wo_replay_setup_ranges(s) < 0 || wo_replay_prepass(s) < 0)
        return -ENOMEM;
    if (o->policy && !o->all_device &&
        (o->stream || wo_stream_mode_of(wo_policy_globals(o->policy)->prefetch.mode).all)) {
        const struct wo_policy_globals *g = wo_policy_globals(o->policy);

        /* the copy engine's rate from pinned copies; without them the
         * shim's copy kernel reads the range in place (zero-copy) */
        s->slots = wo_stream_slots_wanted(g);
        s->copy_s = g->prefetch.pinned_copies ? 1.0 / (s->dm->h2d_gbs * 1e9) : s->zc_s;
        if (!(s->slot_free = calloc(s->slots, sizeof(*s->slot_free))))
            return -ENOMEM;
        if (stream_units(s) < 0)
            return -ENOMEM;
    }
    for (size_t i = 0; i < d->nranges; i++) {
        struct rr *x = &s->r[i];

        if (x->mixed) {
            /* its managed tags are the managed bytes, its device tags
             * and the bytes no tag names the device's */
            uint64_t off_dev = 0, man = 0;

            for (size_t t = 0; t < x->ntags; t++) {
                off_dev += x->tags[t].place != WO_PLACE_DEVICE ? x->tags[t].size : 0;
                man += x->tags[t].place == WO_PLACE_MANAGED ? x->tags[t].size : 0;
            }
            devbytes += x->tr->size - WO_MIN(off_dev, x->tr->size);
            if (x->place != WO_PLACE_MANAGED)
                continue;
            managed += man;
            x->usize = x->tr->size;
            x->ubase = nunits++;
        } else if (x->place == WO_PLACE_MANAGED) {
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
    budget = wo_replay_budget(s, managed, devbytes);
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
    wo_replay_tl_open(s);
    r = run_events(s);
    wo_replay_tl_close(s);
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
