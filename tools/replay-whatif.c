/* tools/replay-whatif.c: what the replayed run assumes that the recorded
 * one did not: the placement of each tag (a policy's, all on the device, or
 * the recorded ones), the device budget, the host work that carries over
 * from the recording to a replay that places differently (the pacing pass),
 * and the host speed of another machine (wo_replay_host_scale_for). */
#include "tools/replay-int.h"

#include <math.h>
#include <string.h>

#include "core/registry.h"

/* ---- placements ----------------------------------------------------------- */

/* Whether the shim could have served (and so placed) a tagged allocation.
 * Tags on memory it served are flagged in the trace. Memory it only observed
 * counts too when it was a plain allocation (cuMemAlloc, cudaMalloc): in a
 * run whose policy placed nothing (an all-GPU recording) the placeable window
 * never opened, and a policy that places something would have opened it.
 * Stream-ordered pools, VMM mappings and the engine's own managed memory are
 * never placeable (docs/placement.md). */
bool wo_replay_could_place(const struct wo_trace_tag *t, const struct wo_trace_range *tr)
{
    if (t->flags & WO_TRACE_TAG_PLACEABLE)
        return true;
    return tr && !(tr->flags & (WO_RANGE_ASYNC | WO_RANGE_VMM | WO_RANGE_ENGINE_MANAGED));
}

uint32_t wo_replay_place_of_tag(struct sim *s, const struct wo_trace_tag *t,
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
    if (!wo_replay_could_place(t, tr))
        return WO_PLACE_DEVICE;
    if (wo_policy_match(s->o->policy, t->name, t->size, &m) < 0)
        return WO_PLACE_DEVICE;
    if (m.r) {
        *prio = m.r->priority;
        *no_slices = m.r->slices == WO_SLICES_NONE;
    }
    return m.place;
}

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

/* ---- the device budget ---------------------------------------------------- */

/* The device budget the recording run resolved at seal (INFO
 * `device_budget`, docs/trace-format.md); 0 when the trace has none. */
static uint64_t recorded_budget(const struct wo_trace_data *d)
{
    const char *v = wo_trace_data_info(d, "device_budget");

    return v ? strtoull(v, NULL, 10) : 0;
}

uint64_t wo_replay_budget(const struct sim *s, uint64_t managed, uint64_t devbytes)
{
    const struct wo_replay_opts *o = s->o;
    uint64_t budget;

    if (o->budget_frac > 0)
        budget = (uint64_t)((double)managed * o->budget_frac);
    else if (o->budget_bytes)
        budget = o->budget_bytes;
    else if (o->policy)
        budget = wo_policy_device_budget(o->policy, s->dm->device_bytes,
                                         s->dm->device_bytes > devbytes ? s->dm->device_bytes - devbytes : 0);
    else if (!(budget = recorded_budget(s->d)))
        budget = (s->dm->device_bytes > devbytes ? s->dm->device_bytes - devbytes : 0) / 2;
    return budget;
}

/* ---- the host ------------------------------------------------------------ */

/* The pacing pass: the trace under the placements it recorded, to learn the
 * host's own work after each point where it waited for the GPU (the
 * recorded gap less the simulated wait, which stands for the recording
 * run's). Replays under other placements keep that work and wait for their
 * own GPU (replay-int.h). */
double *wo_replay_pacing(const struct wo_trace_data *d, const struct wo_replay_opts *o)
{
    struct wo_replay_opts po = *o;
    struct sim ps;
    uint64_t b, m;
    char msg[256];
    double *out;

    /* Under the recorded placements at the recorded host speed the main
     * pass is the pacing pass: it subtracts its own waits (post_sync NULL). */
    if (!(o->policy || o->all_device || o->no_prefetch || o->budget_frac > 0 || o->budget_bytes ||
          (o->host_scale > 0 && o->host_scale != 1)))
        return NULL;
    out = calloc(d->nevents ? d->nevents : 1, sizeof(*out));
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
    if (wo_replay_sim_once(d, &po, NULL, NULL, out, &ps, &b, &m, msg, sizeof(msg)) < 0) {
        free(out);
        out = NULL;
    }
    wo_replay_sim_free(&ps);
    return out;
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
