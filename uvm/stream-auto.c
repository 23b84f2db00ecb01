/* uvm/stream-auto.c: `prefetch.mode: auto`'s decision by step time (see
 * stream-auto.h). */
#include "uvm/stream-auto.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/macro.h"

void wo_auto_init(struct wo_auto *a)
{
    memset(a, 0, sizeof(*a));
    a->phase = WO_AUTO_WATCH;
    a->eff = 1.0;
    a->recheck_first = a->recheck_at = WO_AUTO_RECHECK_FIRST;
}

void wo_auto_set_recheck(struct wo_auto *a, uint64_t first)
{
    a->recheck_first = a->recheck_at = first;
}

void wo_auto_streamed_managed(struct wo_auto *a, bool managed)
{
    a->managed = managed;
}

bool wo_auto_try_pays(double copy, double inplace)
{
    return copy < WO_AUTO_TRY_RATIO * inplace;
}

bool wo_auto_keep_pays(double streamed, double inplace)
{
    return streamed < WO_AUTO_KEEP_RATIO * inplace;
}

static void begin(struct wo_auto *a, enum wo_auto_phase p, unsigned skip)
{
    a->phase = p;
    a->skip = skip;
    a->n = 0;
    a->held = 0;
}

static void hold(struct wo_auto *a, double at_ns)
{
    begin(a, WO_AUTO_HOLD, 0);
    a->decided_ns = at_ns;
    a->ewma_ns = at_ns;
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* The median of the window (PROBE_STEPS periods); low: the lower of the
 * two middle ones (a window half old steps, half new, gives the old). */
static double window_median(const struct wo_auto *a, bool low)
{
    double v[WO_AUTO_PROBE_STEPS];

    memcpy(v, a->win, sizeof(v));
    qsort(v, WO_AUTO_PROBE_STEPS, sizeof(v[0]), cmp_double);
    return low ? v[(WO_AUTO_PROBE_STEPS - 1) / 2]
               : (v[(WO_AUTO_PROBE_STEPS - 1) / 2] + v[WO_AUTO_PROBE_STEPS / 2]) / 2;
}

/* Adds one step of per ns to the phase's window; true (and the window's
 * median) once it holds PROBE_STEPS. */
static bool measured(struct wo_auto *a, double per, double *median)
{
    a->win[a->n++] = per;
    if (a->n < WO_AUTO_PROBE_STEPS)
        return false;
    *median = window_median(a, false);
    return true;
}

/* Streams the candidates: one copy of them a step takes copy_ns. */
static enum wo_auto_action try_now(struct wo_auto *a, double copy_ns)
{
    a->tries++;
    a->streaming = true;
    a->managed = false; /* until the executor says what it streamed */
    a->try_copy_ns = copy_ns;
    if (a->rechecking)
        a->recheck_at = WO_MIN(a->recheck_at * 2, WO_MAX(a->recheck_first, WO_AUTO_RECHECK_MAX));
    else
        a->recheck_at = a->recheck_first;
    a->rechecking = false;
    begin(a, WO_AUTO_TRY, WO_AUTO_SETTLE_STEPS);
    return WO_AUTO_STREAM;
}

/* Whether the backoff lets a try be taken now; counts the backoffs that
 * held one back (once each: the early rule asks every step). */
static bool may_try(struct wo_auto *a)
{
    if (a->steps >= a->no_try_before)
        return true;
    if (!a->held_back) {
        a->held_back = true;
        a->deferred++;
    }
    return false;
}

/* A try went back: past FAILS_FREE in a row, the next waits. */
static void failed(struct wo_auto *a)
{
    unsigned over;

    a->fails++;
    if (a->fails <= WO_AUTO_FAILS_FREE)
        return;
    over = WO_MIN(a->fails - WO_AUTO_FAILS_FREE - 1, 16u);
    a->held_back = false;
    a->no_try_before =
        a->steps + WO_MIN((uint64_t)WO_AUTO_BACKOFF_FIRST << over, (uint64_t)WO_AUTO_BACKOFF_MAX);
}

/* Takes a decision that streams managed ranges again in place (the
 * recheck rule, stream-auto.h): streamed at left_ns a step lately. */
static enum wo_auto_action recheck(struct wo_auto *a, double left_ns)
{
    a->rechecks++;
    a->rechecking = true;
    a->left_ns = left_ns;
    a->slow = 0;
    a->streaming = false;
    begin(a, WO_AUTO_WATCH, WO_AUTO_RECHECK_SETTLE);
    return WO_AUTO_UNSTREAM;
}

enum wo_auto_action wo_auto_step(struct wo_auto *a, uint64_t t_ns, unsigned k, uint64_t cand_bytes,
                                 double link_gbs)
{
    double per, copy_ns;

    if (!k)
        return WO_AUTO_NONE;
    if (!a->last_t || t_ns <= a->last_t) {
        /* the first boundary (or a clock that did not move): no period yet */
        a->last_t = t_ns;
        return WO_AUTO_NONE;
    }
    per = (double)(t_ns - a->last_t);
    a->last_t = t_ns;
    if (a->skip) {
        a->skip = a->skip > k ? a->skip - k : 0;
        /* a recheck whose steps in place are far slower than streamed
         * ones, before the planner settles even: no settling makes up
         * RECHECK_LOSS, so streamed again now (a managed range the planner
         * cannot hold, read in place once per token) */
        if (a->rechecking && k == 1 && per > WO_AUTO_RECHECK_LOSS * a->left_ns &&
            ++a->slow >= WO_AUTO_RECHECK_SLOW)
            return try_now(a, a->try_copy_ns);
        return WO_AUTO_NONE;
    }
    if (k > 1)
        return WO_AUTO_NONE; /* spans whatever came between: no period */
    a->steps++;
    switch (a->phase) {
    case WO_AUTO_WATCH:
        if (!measured(a, per, &a->inplace_ns))
            return WO_AUTO_NONE;
        /* bytes / (GB/s) is in ns */
        copy_ns = link_gbs > 0 ? (double)cand_bytes / link_gbs : 0;
        if (a->rechecking) {
            /* both periods measured, the planner settled: no estimate */
            if (cand_bytes && wo_auto_keep_pays(a->left_ns, a->inplace_ns))
                return try_now(a, copy_ns);
            a->rechecking = false;
            a->recheck_backs++;
            a->recheck_at = a->recheck_first;
            hold(a, a->inplace_ns);
            return WO_AUTO_NONE;
        }
        if (cand_bytes && link_gbs > 0 && wo_auto_try_pays(copy_ns / a->eff, a->inplace_ns) &&
            may_try(a))
            return try_now(a, copy_ns);
        a->eff = fmin(1.0, a->eff * 1.1);
        hold(a, a->inplace_ns);
        return WO_AUTO_NONE;
    case WO_AUTO_TRY:
        if (!measured(a, per, &a->stream_ns))
            return WO_AUTO_NONE;
        if (a->stream_ns > 0 && a->try_copy_ns > 0)
            a->eff = fmax(fmin(1.0, a->try_copy_ns / a->stream_ns), 0.05);
        if (wo_auto_keep_pays(a->stream_ns, a->inplace_ns)) {
            a->kept++;
            a->fails = 0;
            hold(a, a->stream_ns);
            return WO_AUTO_NONE;
        }
        a->backs++;
        failed(a);
        a->streaming = false;
        hold(a, a->inplace_ns);
        a->skip = WO_AUTO_SETTLE_STEPS; /* the drift is judged in place */
        return WO_AUTO_UNSTREAM;
    case WO_AUTO_HOLD:
        a->held++;
        /* In place, the hold's own window: once most of it says one copy
         * of the candidates takes well under the step (the batch grew:
         * Mixtral's b1 to b8, 74 to 550 ms a step, the copies 241 ms),
         * streaming is tried now, not after MIN_HOLD steps and a watch
         * (the drift rule, for small moves, waits that long; stream-auto.h:
         * why only a clear gain acts early) */
        if (!a->streaming && cand_bytes && link_gbs > 0) {
            a->win[a->n % WO_AUTO_PROBE_STEPS] = per;
            a->n++;
            copy_ns = (double)cand_bytes / link_gbs;
            if (a->n >= WO_AUTO_PROBE_STEPS) {
                double med = window_median(a, true);
                if (copy_ns / a->eff < WO_AUTO_EARLY_RATIO * med && may_try(a)) {
                    a->inplace_ns = med;
                    return try_now(a, copy_ns);
                }
            }
        }
        per = fmin(fmax(per, 0.5 * a->decided_ns), 2 * a->decided_ns);
        a->ewma_ns += (per - a->ewma_ns) * 0.125;
        if (a->streaming && a->managed && a->recheck_first &&
            (a->held >= a->recheck_at || (a->held >= WO_AUTO_MIN_HOLD &&
                                          fabs(a->ewma_ns / a->decided_ns - 1.0) > WO_AUTO_DRIFT)))
            return recheck(a, a->ewma_ns);
        if (a->streaming && a->held >= WO_AUTO_MIN_HOLD &&
            a->ewma_ns > (1.0 + WO_AUTO_DRIFT) * a->decided_ns) {
            /* longer steps, streamed: a bigger batch (or longer contexts)
             * would only read more in place. The decision stands, at the
             * new period: measuring in place again would cost steps at
             * the slow rate and, for managed ranges, a round trip
             * through the planner */
            a->regrown++;
            hold(a, a->ewma_ns);
            return WO_AUTO_NONE;
        }
        if ((a->held >= WO_AUTO_MIN_HOLD &&
             fabs(a->ewma_ns / a->decided_ns - 1.0) > WO_AUTO_DRIFT) ||
            (!a->streaming && a->held >= WO_AUTO_HOLD_STEPS)) {
            if (a->streaming) {
                a->streaming = false;
                begin(a, WO_AUTO_WATCH, WO_AUTO_SETTLE_STEPS);
                return WO_AUTO_UNSTREAM;
            }
            begin(a, WO_AUTO_WATCH, 0);
        }
        return WO_AUTO_NONE;
    }
    return WO_AUTO_NONE;
}
