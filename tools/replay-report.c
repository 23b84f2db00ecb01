/* tools/replay-report.c: what a replay reports: wo_replay_run's passes
 * (pacing, the replay, the clairvoyant schedule) turned into the figures of
 * replay.h (window means, median and decode steps, names by time), and the
 * host speed of another machine, found by replays (wo_replay_host_scale_for). */
#include "tools/replay-int.h"

#include <math.h>
#include <string.h>

#include "uvm/plan-stream.h"
#include "uvm/stream-auto.h"


/* ---- the result ---------------------------------------------------------- */

static int name_cmp(const void *a, const void *b)
{
    const struct wo_replay_name *x = a, *y = b;
    double tx = x->read_s + x->stall_s, ty = y->read_s + y->stall_s;

    if (tx != ty)
        return tx > ty ? -1 : 1;
    return strcmp(x->name, y->name);
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

static int run_one(const struct wo_trace_data *d, const struct wo_replay_opts *o,
                   struct wo_replay_result *res, char *msg, size_t msglen)
{
    double *pacing = NULL;
    struct sim s;
    uint64_t managed = 0, budget = 0;
    int r;

    memset(res, 0, sizeof(*res));
    pacing = wo_replay_pacing(d, o);
    r = wo_replay_sim_once(d, o, NULL, pacing, NULL, &s, &budget, &managed, msg, msglen);
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
        res->stream_bytes_step = s.stream_b / ws;
        res->pick_bytes_step = s.pick_b / ws;
        res->pick_engine_bytes_step = s.pick_engine_b / ws;
        /* copy-back evictions cross PCIe too (device to host) */
        res->pcie_bytes_step = res->zc_bytes_step + res->prefetch_bytes_step +
                               res->copy_bytes_step + res->stream_bytes_step +
                               res->pick_engine_bytes_step + s.cb_b / ws;
        res->stall_s_step = s.stall_s / ws;
        {
            /* the planner's own rule, on what the simulation read and moved */
            struct wo_plan_costs c;

            wo_devmodel_plan_costs(s.dm, &c);
            res->cost_inplace_s = wo_cost_step_s(&c, 0, s.hit_b + s.miss_b, 0, 0, 0, 0) / ws;
            res->cost_plan_s = wo_cost_step_s(&c, s.hit_b, s.miss_b, (uint64_t)s.pf_b, s.pf_calls,
                                              (uint64_t)(s.ev_b - s.cb_b), (uint64_t)s.cb_b) /
                               ws;
            res->churn = s.plan && wo_plan_churn(s.plan, NULL);
        }
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
            x->mult_read /= ws;
            x->mult_distinct /= ws;
        }
        res->nnames = s.nnames;
        qsort(res->names, res->nnames, sizeof(*res->names), name_cmp);
        if (!o->no_bound && managed) {
            struct sim so;
            uint8_t *set;
            uint64_t b2, m2;

            double lb = wo_replay_bound(&s, budget);

            set = wo_replay_oracle_set(&s, budget);
            if (!set) {
                r = -ENOMEM;
                goto out;
            }
            r = wo_replay_sim_once(d, o, set, pacing, NULL, &so, &b2, &m2, msg, msglen);
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
            wo_replay_sim_free(&so);
            free(set);
            if (r < 0)
                goto out;
        }
    }
out:
    wo_replay_sim_free(&s);
    free(pacing);
    if (r < 0)
        wo_replay_result_free(res);
    return r;
}

/* The decode step a result measures (the window's mean step without one) */
static double decode_or_step(const struct wo_replay_result *r)
{
    return r->decode_step_s > 0 ? r->decode_step_s : r->step_s;
}

/* Whether `auto` has something to weigh: a policy in mode auto that reads
 * `host` ranges in place */
static bool auto_may_stream(const struct wo_replay_opts *o, const struct wo_replay_result *r)
{
    if (!o->policy || o->all_device || o->stream ||
        !wo_stream_mode_of(wo_policy_globals(o->policy)->prefetch.mode).by_auto)
        return false;
    for (size_t i = 0; i < r->nnames; i++)
        if (r->names[i].place == WO_PLACE_HOST && r->names[i].zc_bytes > 0)
            return true;
    return false;
}

int wo_replay_run(const struct wo_trace_data *d, const struct wo_replay_opts *o,
                  struct wo_replay_result *res, char *msg, size_t msglen)
{
    struct wo_replay_opts so;
    struct wo_replay_result st;
    double inplace, streamed, copy;
    char m2[256];
    int r = run_one(d, o, res, msg, msglen);

    if (r < 0 || !auto_may_stream(o, res))
        return r;
    /* auto: the step-time rule of uvm/stream-auto.c on the two predicted
     * steps (the executor's host ranges streamed as under mode stream; the
     * gain rule and managed ranges are not weighed) */
    so = *o;
    so.stream = true;
    so.timeline = NULL; /* the timeline shows the in-place run */
    if (run_one(d, &so, &st, m2, sizeof(m2)) < 0)
        return 0;
    inplace = decode_or_step(res);
    streamed = decode_or_step(&st);
    copy = st.stream_bytes_step / (o->dm->h2d_gbs * 1e9);
    if (copy > 0 && wo_auto_try_pays(copy, inplace) && wo_auto_keep_pays(streamed, inplace)) {
        wo_replay_result_free(res);
        *res = st;
        res->auto_streamed = true;
        res->auto_other_step_s = inplace;
    } else {
        res->auto_other_step_s = streamed;
        wo_replay_result_free(&st);
    }
    res->auto_weighed = true;
    return 0;
}

void wo_replay_result_free(struct wo_replay_result *res)
{
    free(res->names);
    memset(res, 0, sizeof(*res));
}

/* ---- another machine's host --------------------------------------------- */

/* The host speed (a factor on the recorded host work) at which the all-GPU
 * replay's decode step is decode_step_s: each try a whole replay. */
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
