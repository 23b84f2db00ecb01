/* tests/test-stream-auto.c: `prefetch.mode: auto`'s decision by step time
 * (uvm/stream-auto.c): when it tries streaming, when it keeps it, when it
 * goes back in place, and when it measures again. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "uvm/plan-stream.h"
#include "uvm/plan.h"
#include "uvm/stream-auto.h"
#include "uvm/stream.h"

#define MS UINT64_C(1000000)
#define GB 1e9

struct clock {
    struct wo_auto a;
    uint64_t t;
    unsigned streams, unstreams;
};

/* n boundaries of one step each, every step per_ms long; the actions
 * counted. */
static enum wo_auto_action run(struct clock *c, unsigned n, double per_ms, double cand_gb)
{
    enum wo_auto_action last = WO_AUTO_NONE;

    for (unsigned i = 0; i < n; i++) {
        enum wo_auto_action act;
        c->t += (uint64_t)(per_ms * MS);
        act = wo_auto_step(&c->a, c->t, 1, (uint64_t)(cand_gb * GB), 55.0);
        if (act == WO_AUTO_STREAM)
            c->streams++;
        if (act == WO_AUTO_UNSTREAM)
            c->unstreams++;
        if (act != WO_AUTO_NONE)
            last = act;
    }
    return last;
}

static void start(struct clock *c)
{
    wo_auto_init(&c->a);
    c->t = 1000 * MS;
    c->streams = c->unstreams = 0;
}

/* The default experts backend at b32: 1.57 s a step in place, one copy of
 * the experts 0.38 s: streaming is tried, is faster, and stays while the
 * batch does, however long. */
static void faster_streamed_stays(void **state)
{
    struct clock c;
    (void)state;
    start(&c);
    /* the first boundary gives no period; 8 in place give one */
    assert_int_equal(run(&c, 1 + WO_AUTO_PROBE_STEPS - 1, 1570, 20.7), WO_AUTO_NONE);
    assert_int_equal(run(&c, 1, 1570, 20.7), WO_AUTO_STREAM);
    assert_true(c.a.streaming);
    /* settling and measuring, streamed */
    assert_int_equal(run(&c, WO_AUTO_SETTLE_STEPS + WO_AUTO_PROBE_STEPS, 420, 20.7), WO_AUTO_NONE);
    assert_int_equal(c.a.phase, WO_AUTO_HOLD);
    assert_true(c.a.streaming);
    assert_int_equal(c.a.kept, 1);
    assert_int_equal(run(&c, 5000, 425, 20.7), WO_AUTO_NONE);
    assert_int_equal(c.streams, 1);
    assert_int_equal(c.unstreams, 0);
    /* the batch shrank: the period moved by more than the drift, so the
     * ranges go back in place to be measured again */
    assert_int_equal(run(&c, 20, 200, 20.7), WO_AUTO_UNSTREAM);
    assert_int_equal(c.unstreams, 1);
    assert_false(c.a.streaming);
    /* ... where a step now takes 200 ms, less than one copy: held there */
    assert_int_equal(c.a.phase, WO_AUTO_HOLD);
    assert_true(c.a.inplace_ns > 199 * MS && c.a.inplace_ns < 201 * MS);
    assert_int_equal(c.streams, 1);
}

/* b8: a copy a step would fit the step, but streamed steps come out
 * slower: back in place, and tried again only after HOLD_STEPS. */
static void slower_streamed_goes_back(void **state)
{
    struct clock c;
    (void)state;
    start(&c);
    assert_int_equal(run(&c, 1 + WO_AUTO_PROBE_STEPS, 410, 20.7), WO_AUTO_STREAM);
    assert_int_equal(run(&c, WO_AUTO_SETTLE_STEPS + WO_AUTO_PROBE_STEPS, 465, 20.7),
                     WO_AUTO_UNSTREAM);
    assert_false(c.a.streaming);
    assert_int_equal(c.a.backs, 1);
    assert_int_equal(c.a.phase, WO_AUTO_HOLD);
    /* within 3% is not faster either */
    start(&c);
    run(&c, 1 + WO_AUTO_PROBE_STEPS, 100, 2.0);
    assert_int_equal(run(&c, WO_AUTO_SETTLE_STEPS + WO_AUTO_PROBE_STEPS, 98, 2.0),
                     WO_AUTO_UNSTREAM);
    /* held in place: nothing for HOLD_STEPS, then watched: at the same
     * step not tried again (the copies weighed at the efficiency the try
     * measured, 376 / 465 ms: failed_try_teaches_efficiency), until that
     * figure fades (a tenth a watch) */
    start(&c);
    run(&c, 1 + WO_AUTO_PROBE_STEPS, 410, 20.7);
    run(&c, WO_AUTO_SETTLE_STEPS + WO_AUTO_PROBE_STEPS, 465, 20.7);
    assert_int_equal(run(&c, WO_AUTO_SETTLE_STEPS + WO_AUTO_HOLD_STEPS - 1, 410, 20.7),
                     WO_AUTO_NONE);
    assert_int_equal(run(&c, 1 + WO_AUTO_PROBE_STEPS, 410, 20.7), WO_AUTO_NONE);
    assert_int_equal(c.a.tries, 1);
    {
        unsigned n = 0;
        while (run(&c, 1, 410, 20.7) != WO_AUTO_STREAM && n < 3 * WO_AUTO_HOLD_STEPS)
            n++;
        assert_true(n > WO_AUTO_HOLD_STEPS && n < 3 * WO_AUTO_HOLD_STEPS);
    }
    assert_int_equal(c.streams, 2);
    assert_int_equal(c.a.tries, 2);
}

/* b1: one copy of the experts (0.38 s) takes longer than a whole step read
 * in place (55 ms): never tried, at any point. */
static void copy_longer_than_step_never_tries(void **state)
{
    struct clock c;
    (void)state;
    start(&c);
    assert_int_equal(run(&c, 5000, 55, 20.7), WO_AUTO_NONE);
    assert_int_equal(c.streams, 0);
    assert_int_equal(c.a.tries, 0);
    assert_false(c.a.streaming);
    /* just above the try ratio: still not */
    start(&c);
    assert_int_equal(run(&c, 100, 100, 100 * 55.0 / 1000 * WO_AUTO_TRY_RATIO * 1.01), WO_AUTO_NONE);
    /* nothing to stream: nothing tried */
    start(&c);
    assert_int_equal(run(&c, 2000, 1000, 0), WO_AUTO_NONE);
    assert_int_equal(c.a.tries, 0);
}

/* A boundary closing several steps spans whatever came between (a stepper
 * that found its period again after an idle spell): it measures nothing;
 * nor does a boundary at the same time as the last, or closing none. */
static void boundaries(void **state)
{
    struct clock c;
    (void)state;
    start(&c);
    assert_int_equal(wo_auto_step(&c.a, c.t, 1, 1, 55), WO_AUTO_NONE);
    assert_int_equal(wo_auto_step(&c.a, c.t, 1, 1, 55), WO_AUTO_NONE);
    assert_int_equal(wo_auto_step(&c.a, c.t + MS, 0, 1, 55), WO_AUTO_NONE);
    c.t += 800 * MS;
    assert_int_equal(wo_auto_step(&c.a, c.t, WO_AUTO_PROBE_STEPS, (uint64_t)(2 * GB), 55),
                     WO_AUTO_NONE);
    assert_int_equal(c.a.n, 0);
    /* then 8 steps of 100 ms: the in-place period is 100 ms */
    assert_int_equal(run(&c, WO_AUTO_PROBE_STEPS, 100, 2.0), WO_AUTO_STREAM);
    assert_true(c.a.inplace_ns > 99.9 * MS && c.a.inplace_ns < 100.1 * MS);
}

/* One slow step in a window (an idle spell, a prefill joining the batch)
 * does not decide: a window's period is its median. */
static void one_outlier_does_not_decide(void **state)
{
    struct clock c;
    (void)state;
    /* 20 ms steps and one of 5 s: one copy (36 ms) cannot fit a 20 ms step */
    start(&c);
    run(&c, 1 + WO_AUTO_PROBE_STEPS - 1, 20, 2.0);
    assert_int_equal(run(&c, 1, 5000, 2.0), WO_AUTO_NONE);
    assert_int_equal(c.a.tries, 0);
    assert_true(c.a.inplace_ns < 21 * MS);
    /* tried at 100 ms, streamed steps of 110 ms with one of 5 s among
     * them: slower, so back in place, whatever the outlier */
    start(&c);
    assert_int_equal(run(&c, 1 + WO_AUTO_PROBE_STEPS, 100, 2.0), WO_AUTO_STREAM);
    run(&c, WO_AUTO_SETTLE_STEPS, 110, 2.0);
    run(&c, 3, 110, 2.0);
    run(&c, 1, 5000, 2.0);
    assert_int_equal(run(&c, WO_AUTO_PROBE_STEPS - 4, 110, 2.0), WO_AUTO_UNSTREAM);
    /* in hold, a step counts at most twice the period decided at */
    run(&c, WO_AUTO_SETTLE_STEPS + WO_AUTO_MIN_HOLD, 100, 2.0);
    assert_int_equal(run(&c, 1, 60000, 2.0), WO_AUTO_NONE);
    assert_true(c.a.ewma_ns < 1.2 * c.a.decided_ns);
}

/* b32 as in faster_streamed_stays: tried, streamed, held */
static void streamed_at_b32(struct clock *c)
{
    start(c);
    run(c, 1 + WO_AUTO_PROBE_STEPS, 1570, 20.7);
    run(c, WO_AUTO_SETTLE_STEPS + WO_AUTO_PROBE_STEPS, 420, 20.7);
    assert_true(c->a.streaming);
    assert_int_equal(c->a.phase, WO_AUTO_HOLD);
}

/* A server's batch moves every step: a drift right after a decision
 * waits MIN_HOLD steps before it counts. */
static void drift_waits_min_hold(void **state)
{
    struct clock c;
    (void)state;
    streamed_at_b32(&c);
    /* the period at once half: nothing until MIN_HOLD steps are held */
    assert_int_equal(run(&c, WO_AUTO_MIN_HOLD - 1, 210, 20.7), WO_AUTO_NONE);
    assert_true(c.a.streaming);
    assert_int_equal(run(&c, 1, 210, 20.7), WO_AUTO_UNSTREAM);
}

/* Streamed steps that grow longer (b8 to b32: each range read more times
 * a step) keep streaming, held at the new period: measuring in place again
 * would only cost slow steps. Shorter ones are measured again. */
static void longer_streamed_steps_stay(void **state)
{
    struct clock c;
    (void)state;
    streamed_at_b32(&c);
    /* 2x, for as long as it lasts: never back in place */
    assert_int_equal(run(&c, 5000, 840, 20.7), WO_AUTO_NONE);
    assert_true(c.a.streaming);
    assert_int_equal(c.unstreams, 0);
    assert_true(c.a.regrown >= 1);
    assert_true(c.a.decided_ns > 700 * MS);
    /* then 4x shorter than that: measured in place again */
    assert_int_equal(run(&c, WO_AUTO_MIN_HOLD + 20, 210, 20.7), WO_AUTO_UNSTREAM);
    assert_false(c.a.streaming);
}

/* A world whose step depends on the decision: inplace_ms read in place,
 * stream_ms streamed; after a STREAM the executor says whether managed
 * ranges were streamed. n steps; the steps read in place counted. */
static unsigned world(struct clock *c, unsigned n, double inplace_ms, double stream_ms,
                      double cand_gb, bool managed)
{
    unsigned in_place = 0;

    for (unsigned i = 0; i < n; i++) {
        enum wo_auto_action act;
        in_place += !c->a.streaming;
        c->t += (uint64_t)((c->a.streaming ? stream_ms : inplace_ms) * MS);
        act = wo_auto_step(&c->a, c->t, 1, (uint64_t)(cand_gb * GB), 55.0);
        if (act == WO_AUTO_STREAM) {
            c->streams++;
            wo_auto_streamed_managed(&c->a, managed);
        }
        if (act == WO_AUTO_UNSTREAM)
            c->unstreams++;
    }
    return in_place;
}

/* The bimodal b32 of managed at half the experts' bytes on the Qwen3 shape
 * (docs/history/prefetch.md), as its runs recorded it: at b8's first steps
 * the planner is still learning the batch's experts, 270 ms a step in
 * place, and a try of every candidate (12.4 GiB, 225 ms of copies) comes
 * out at 258 ms: kept. Settled, in place is 213 ms at b8 and 252 at b32,
 * streamed 258 and 328. Held streamed, b32 ran at 88-98 tok/s against
 * 111-131. The recheck takes the decision again after RECHECK_FIRST
 * streamed steps and finds in place faster: in place from then on, at b8
 * and at b32. */
static void managed_decision_rechecked(void **state)
{
    struct clock c;
    double gb = 12.4 * 1.073741824;
    (void)state;
    start(&c);
    world(&c, 1 + WO_AUTO_PROBE_STEPS, 270, 258, gb, true);
    assert_true(c.a.streaming);
    world(&c, WO_AUTO_SETTLE_STEPS + WO_AUTO_PROBE_STEPS, 213, 258, gb, true);
    assert_int_equal(c.a.kept, 1); /* measured against the unsettled 270 */
    assert_true(c.a.managed);
    /* held streamed for RECHECK_FIRST steps, then back in place */
    world(&c, WO_AUTO_RECHECK_FIRST - 1, 213, 258, gb, true);
    assert_true(c.a.streaming);
    world(&c, 1, 213, 258, gb, true);
    assert_false(c.a.streaming);
    assert_int_equal(c.a.rechecks, 1);
    assert_int_equal(c.unstreams, 1);
    /* settled and measured in place: stays there */
    world(&c, WO_AUTO_RECHECK_SETTLE + WO_AUTO_PROBE_STEPS, 213, 258, gb, true);
    assert_false(c.a.streaming);
    assert_int_equal(c.a.phase, WO_AUTO_HOLD);
    assert_int_equal(c.a.recheck_backs, 1);
    assert_false(c.a.rechecking);
    /* b32: in place 252 ms, under the drift from 213; a copy (225 ms, at the
     * try's efficiency 225 / 258) is not under EARLY_RATIO of it: in place
     * for the whole phase */
    assert_int_equal(world(&c, 2000, 252, 328, gb, true), 2000);
    assert_int_equal(c.streams, 1);
}

/* Where streaming managed ranges pays (the Mixtral shape's managed 6 GiB
 * at b32: 279.6 ms streamed against 297.6 in place), each recheck streams
 * again at once and the next comes twice as late: the steps read in place
 * to check are a few percent of the run, fewer as it goes. */
static void managed_confirmed_backs_off(void **state)
{
    struct clock c;
    double gb = 4.5;
    unsigned in_place;
    (void)state;
    start(&c);
    world(&c, 1 + WO_AUTO_PROBE_STEPS + WO_AUTO_SETTLE_STEPS + WO_AUTO_PROBE_STEPS, 297.6, 279.6,
          gb, true);
    assert_int_equal(c.a.kept, 1);
    in_place = world(&c, 4000, 297.6, 279.6, gb, true);
    assert_true(c.a.streaming || c.a.rechecking);
    /* rechecks after 64, 128, 256, 512, then every 1024 streamed steps */
    assert_true(c.a.rechecks >= 5 && c.a.rechecks <= 7);
    assert_int_equal(c.a.recheck_backs, 0);
    assert_int_equal(c.a.backs, 0);
    assert_int_equal(c.a.recheck_at, WO_AUTO_RECHECK_MAX);
    assert_true(in_place < 4000 / 20);
    /* every try, the first and each recheck's, kept streaming */
    assert_int_equal(c.a.kept, c.a.tries);
}

/* Where the in-place steps of a recheck are far slower than the streamed
 * ones (managed experts the planner cannot hold, read once per token in
 * place: 1.6 s against 420 ms), the recheck ends after RECHECK_SLOW of
 * them and streams again: a few slow steps, not RECHECK_SETTLE +
 * PROBE_STEPS. A recheck whose first steps are only unsettled-slow (1.3x)
 * goes on. */
static void managed_clear_loss_ends_recheck(void **state)
{
    struct clock c;
    unsigned in_place;
    (void)state;
    start(&c);
    world(&c, 1 + WO_AUTO_PROBE_STEPS + WO_AUTO_SETTLE_STEPS + WO_AUTO_PROBE_STEPS, 1570, 420, 20.7,
          true);
    assert_int_equal(c.a.kept, 1);
    world(&c, WO_AUTO_RECHECK_FIRST, 1570, 420, 20.7, true);
    assert_int_equal(c.a.rechecks, 1);
    in_place = world(&c, WO_AUTO_RECHECK_SLOW, 1570, 420, 20.7, true);
    assert_int_equal(in_place, WO_AUTO_RECHECK_SLOW);
    assert_true(c.a.streaming);
    assert_false(c.a.rechecking);
    assert_int_equal(c.a.recheck_at, 2 * WO_AUTO_RECHECK_FIRST);
    /* 4000 steps: under 2% in place */
    in_place = world(&c, 4000, 1570, 420, 20.7, true);
    assert_true(in_place < 4000 / 50);
    assert_int_equal(c.a.backs, 0);
    /* 1.3x: the recheck runs its course (and streaming stays: 420 is
     * under 0.97x of 546) */
    start(&c);
    world(&c, 1 + WO_AUTO_PROBE_STEPS + WO_AUTO_SETTLE_STEPS + WO_AUTO_PROBE_STEPS, 546, 420, 20.7,
          true);
    world(&c, WO_AUTO_RECHECK_FIRST, 546, 420, 20.7, true);
    in_place = world(&c, WO_AUTO_RECHECK_SETTLE + WO_AUTO_PROBE_STEPS, 546, 420, 20.7, true);
    assert_int_equal(in_place, WO_AUTO_RECHECK_SETTLE + WO_AUTO_PROBE_STEPS);
    world(&c, 1, 546, 420, 20.7, true);
    assert_true(c.a.streaming);
}

/* A decision to stream host ranges is never rechecked, nor a managed one
 * with the recheck off; a managed one's period drifting (the batch grew: its streamed steps 2x) is
 * rechecked at once, not held as regrown. */
static void host_not_rechecked_managed_drift_is(void **state)
{
    struct clock c;
    (void)state;
    start(&c);
    world(&c, 1 + WO_AUTO_PROBE_STEPS + WO_AUTO_SETTLE_STEPS + WO_AUTO_PROBE_STEPS, 1570, 420, 20.7,
          false);
    assert_int_equal(world(&c, 5000, 1570, 420, 20.7, false), 0);
    assert_int_equal(c.a.rechecks, 0);
    /* WOFFLOAD_STREAM_RECHECK=0: a managed decision stands */
    start(&c);
    wo_auto_set_recheck(&c.a, 0);
    world(&c, 1 + WO_AUTO_PROBE_STEPS + WO_AUTO_SETTLE_STEPS + WO_AUTO_PROBE_STEPS, 270, 258, 13.3,
          true);
    assert_int_equal(world(&c, 5000, 213, 258, 13.3, true), 0);
    assert_int_equal(c.a.rechecks, 0);
    start(&c);
    world(&c, 1 + WO_AUTO_PROBE_STEPS + WO_AUTO_SETTLE_STEPS + WO_AUTO_PROBE_STEPS, 1570, 420, 20.7,
          true);
    assert_int_equal(c.a.kept, 1);
    world(&c, WO_AUTO_MIN_HOLD / 2, 1570, 420, 20.7, true);
    assert_int_equal(c.a.rechecks, 0);
    /* streamed steps 2x: past the drift once MIN_HOLD steps are held */
    world(&c, WO_AUTO_MIN_HOLD, 3000, 840, 20.7, true);
    assert_int_equal(c.a.rechecks, 1);
    assert_int_equal(c.a.regrown, 0);
    /* in place 3000 against 840 streamed: streamed again */
    world(&c, WO_AUTO_RECHECK_SETTLE + WO_AUTO_PROBE_STEPS + 1, 3000, 840, 20.7, true);
    assert_true(c.a.streaming);
    assert_int_equal(c.a.recheck_at, 2 * WO_AUTO_RECHECK_FIRST);
}

/* A try whose streamed steps came out slower than the copy time said (a
 * server at 3 req/s: 9.5 GiB of copies, 181 ms; in place 202 ms; streamed
 * 289 ms, bench/results/serve-rows-20261126-154556-soak-managed-h100) is
 * not repeated at the same step: the copies are weighed at the measured
 * efficiency (181 / 289). A longer in-place step (the batch grew) is tried
 * again, and the figure fades back toward 1 over the holds. */
static void failed_try_teaches_efficiency(void **state)
{
    struct clock c;
    double gb = 181.2 * 55.0 / 1000; /* 181.2 ms of copies at 55 GB/s */
    (void)state;
    start(&c);
    assert_int_equal(run(&c, 1 + WO_AUTO_PROBE_STEPS, 202, gb), WO_AUTO_STREAM);
    assert_int_equal(run(&c, WO_AUTO_SETTLE_STEPS + WO_AUTO_PROBE_STEPS, 289, gb),
                     WO_AUTO_UNSTREAM);
    assert_true(c.a.eff > 0.62 && c.a.eff < 0.64);
    /* held in place, then watched again at the same step: not tried */
    assert_int_equal(
        run(&c, WO_AUTO_SETTLE_STEPS + WO_AUTO_HOLD_STEPS + WO_AUTO_PROBE_STEPS, 202, gb),
        WO_AUTO_NONE);
    assert_int_equal(c.a.tries, 1);
    /* the batch grew: 375 ms in place. The watch that did not try gave
     * the efficiency a tenth back (0.69): the copies weigh 263 ms, under
     * EARLY_RATIO of the step, so it is tried once the hold's window
     * (empty: the watch just ended) is full of such steps, not after
     * MIN_HOLD steps */
    assert_true(c.a.eff > 0.68 && c.a.eff < 0.70);
    {
        unsigned n = 0;
        while (run(&c, 1, 375, gb) != WO_AUTO_STREAM && n < 1000)
            n++;
        assert_int_equal(n, WO_AUTO_PROBE_STEPS - 1);
    }
    assert_int_equal(c.a.tries, 2);
    /* kept at 294 ms: the efficiency is that try's */
    assert_int_equal(run(&c, WO_AUTO_SETTLE_STEPS + WO_AUTO_PROBE_STEPS, 294, gb), WO_AUTO_NONE);
    assert_true(c.a.streaming);
    assert_true(c.a.eff > 0.61 && c.a.eff < 0.62);
    /* fading: each watch that does not try gives a tenth back, up to 1 */
    start(&c);
    c.a.eff = 0.5;
    run(&c, 1 + WO_AUTO_PROBE_STEPS, 1000, 0);
    assert_true(c.a.eff > 0.54 && c.a.eff < 0.56);
    for (int i = 0; i < 20; i++)
        run(&c, WO_AUTO_HOLD_STEPS + WO_AUTO_PROBE_STEPS, 1000, 0);
    assert_true(c.a.eff == 1.0);
}

/* Mixtral's shape, experts `host` (bench/results/e2e-20261126-222129-
 * default-auto-mixtral-h100): b1 reads in place at 74 ms a step, one copy
 * of the experts takes 241 ms: held in place. Then b8: 550 ms a step in
 * place. Streaming is tried within PROBE_STEPS b8 steps (the row ran 36
 * and the drift rule would have waited MIN_HOLD = 64 from the decision).
 * A step that grew, but not past the copies, is not tried; nor are steps
 * in place that a failed try taught were no better streamed. */
static void grown_batch_tries_soon(void **state)
{
    struct clock c;
    double gb = 241.0 * 55.0 / 1000;
    unsigned n = 0;
    (void)state;
    start(&c);
    assert_int_equal(run(&c, 1 + WO_AUTO_PROBE_STEPS + 30, 74, gb), WO_AUTO_NONE);
    assert_int_equal(c.a.phase, WO_AUTO_HOLD);
    /* the window full of b1 steps: tried at the fifth b8 step, when most
     * of it is b8 */
    while (run(&c, 1, 550, gb) != WO_AUTO_STREAM && n < 1000)
        n++;
    assert_int_equal(n, WO_AUTO_PROBE_STEPS / 2);
    assert_int_equal(c.a.tries, 1);
    assert_true(c.a.inplace_ns > 549 * MS && c.a.inplace_ns < 551 * MS);
    /* streamed at 260 ms: kept */
    assert_int_equal(run(&c, WO_AUTO_SETTLE_STEPS + WO_AUTO_PROBE_STEPS, 260, gb), WO_AUTO_NONE);
    assert_true(c.a.streaming);
    /* 200 ms in place, a copy 241 ms: grown, and still not tried */
    start(&c);
    run(&c, 1 + WO_AUTO_PROBE_STEPS + 30, 74, gb);
    assert_int_equal(run(&c, WO_AUTO_MIN_HOLD, 200, gb), WO_AUTO_NONE);
    assert_int_equal(c.a.tries, 0);
    /* 280 ms in place (Qwen3 managed b8 while the hot set learns), a copy
     * 241 ms: 0.86 of the step, a marginal gain: not tried early; tried
     * by the drift rule and a watch, MIN_HOLD steps after the decision */
    start(&c);
    run(&c, 1 + WO_AUTO_PROBE_STEPS + 30, 74, gb);
    n = 0;
    while (run(&c, 1, 280, gb) != WO_AUTO_STREAM && n < 1000)
        n++;
    assert_true(n > WO_AUTO_MIN_HOLD - 30 && n < 1000);
    /* nothing to stream: the window decides nothing */
    start(&c);
    run(&c, 1 + WO_AUTO_PROBE_STEPS + 30, 74, 0);
    assert_int_equal(run(&c, 40, 550, 0), WO_AUTO_NONE);
    assert_int_equal(c.a.tries, 0);
}

/* A server whose batch moves under the decision (llama-server at
 * --parallel 32, bench/results/llamacpp-serve-20261207f-p32-split-full-
 * h100: 22 tries in 654 steps, 21 back in place): requests join and
 * leave, so a step is 100 ms for some steps and 600 ms for the next few,
 * read in place, and 5% slower streamed whatever the batch. Every try
 * goes back; which window a try and its judgement see is chance. The
 * backoff keeps those tries from eating the steps: after the first two,
 * each waits twice as long, so 4,000 steps take a handful, not one every
 * few dozen steps; a kept try ends it. */
static unsigned serve_world(struct clock *c, unsigned n, unsigned *phase, double stream_factor)
{
    unsigned streamed = 0;

    for (unsigned i = 0; i < n; i++, (*phase)++) {
        double per = 60 + 0.45 * (*phase % 650);
        streamed += c->a.streaming;
        if (c->a.streaming)
            per *= stream_factor;
        c->t += (uint64_t)(per * MS);
        wo_auto_step(&c->a, c->t, 1, (uint64_t)(8.7 * 55.0 / 1000 * GB), 55.0);
    }
    return streamed;
}

static void failed_tries_back_off(void **state)
{
    struct clock c;
    unsigned phase = 0;
    uint64_t tries;
    (void)state;
    /* streamed 1.2x whatever the batch: without the backoff this world
     * took 55 tries (52 back) and, kept by a window that straddled the
     * batch's fall, ran 2,590 of its steps streamed */
    start(&c);
    assert_true(serve_world(&c, 4000, &phase, 1.2) < 100);
    assert_true(c.a.tries <= 8 && c.a.tries == c.a.backs);
    assert_true(c.a.deferred >= 1);
    /* twice as far each time, up to BACKOFF_MAX */
    assert_true(c.a.no_try_before - c.a.steps <= WO_AUTO_BACKOFF_MAX);
    assert_true(c.a.fails >= 3);
    /* streaming that wins is not held back: 0.9x whatever the batch, never
     * back, nearly every step streamed */
    start(&c);
    phase = 0;
    assert_true(serve_world(&c, 4000, &phase, 0.9) > 3500);
    assert_int_equal(c.a.backs, 0);
    /* after the failures, streaming that wins is tried within
     * BACKOFF_MAX (and a watch) steps, and a kept try ends the run */
    start(&c);
    phase = 0;
    serve_world(&c, 4000, &phase, 1.2);
    tries = c.a.tries;
    assert_true(serve_world(&c, 4000, &phase, 0.6) >
                4000 - WO_AUTO_BACKOFF_MAX - WO_AUTO_HOLD_STEPS);
    assert_true(c.a.tries > tries);
    assert_int_equal(c.a.fails, 0);
    assert_true(c.a.streaming);
}

/* Slots sized for the ranges they hold (uvm/stream.h, wo_stream_size_slots):
 * any window of nslots ranges in a row (the order is a cycle) finds a slot
 * for each when each range takes the smallest slot it fits. */
static bool window_fits(const uint64_t *sizes, size_t n, const uint64_t *slot, unsigned ns)
{
    for (size_t j = 0; j < n; j++) {
        bool used[8] = {false};
        for (unsigned k = 0; k < ns && k < n; k++) {
            uint64_t want = sizes[(j + k) % n];
            int best = -1;
            for (unsigned i = 0; i < ns; i++)
                if (!used[i] && slot[i] >= want && (best < 0 || slot[i] < slot[best]))
                    best = (int)i;
            if (best < 0)
                return false;
            used[best] = true;
        }
    }
    return true;
}

static void slots_sized_for_their_ranges(void **state)
{
    const uint64_t M = 1 << 20;
    /* Qwen3's experts in the order a step reads them: gate_up 768 MiB, down 384 */
    uint64_t turn[32], out[8], sum = 0;
    (void)state;

    for (int i = 0; i < 32; i++)
        turn[i] = i % 2 ? 384 * M : 768 * M;
    assert_non_null(wo_stream_size_slots(turn, 32, 4, 768 * M, out));
    for (int i = 0; i < 4; i++)
        sum += out[i];
    assert_true(out[0] == 768 * M && out[1] == 768 * M && out[2] == 384 * M && out[3] == 384 * M);
    assert_true(sum == 2304 * M); /* 2.25 GiB, not 4 x 768 MiB */
    assert_true(window_fits(turn, 32, out, 4));
    /* three slots: windows of two 768 and one 384, or one and two */
    assert_non_null(wo_stream_size_slots(turn, 32, 3, 768 * M, out));
    assert_true(out[0] == 768 * M && out[1] == 768 * M && out[2] == 384 * M);
    assert_true(window_fits(turn, 32, out, 3));
    /* one size: every slot that size; the cap (the largest a slot takes) holds */
    for (int i = 0; i < 32; i++)
        turn[i] = 100 * M;
    assert_non_null(wo_stream_size_slots(turn, 32, 4, 64 * M, out));
    for (int i = 0; i < 4; i++)
        assert_true(out[i] == 64 * M);
    /* fewer ranges than slots: the spare slots take the smallest */
    {
        uint64_t two[2] = {10 * M, 30 * M};
        assert_non_null(wo_stream_size_slots(two, 2, 4, 768 * M, out));
        assert_true(out[0] == 30 * M && out[1] == 10 * M && out[2] == 10 * M && out[3] == 10 * M);
    }
    /* an irregular order: still every window fits */
    {
        uint64_t odd[9] = {5 * M, 1 * M, 1 * M, 9 * M, 2 * M, 9 * M, 1 * M, 3 * M, 1 * M};
        for (unsigned ns = 2; ns <= 8; ns++) {
            assert_non_null(wo_stream_size_slots(odd, 9, ns, 768 * M, out));
            assert_true(window_fits(odd, 9, out, ns));
        }
    }
    /* nothing to size by */
    assert_null(wo_stream_size_slots(turn, 0, 4, 768 * M, out));
}

/* prefetch.mode decoded in one place: each mode asks exactly one thing */
static void mode_decoded_once(void **state)
{
    struct wo_stream_mode m;

    (void)state;
    m = wo_stream_mode_of(WO_PREFETCH_MODE_STREAM);
    assert_true(m.all && !m.by_auto && !m.measure_only);
    m = wo_stream_mode_of(WO_PREFETCH_MODE_AUTO);
    assert_true(!m.all && m.by_auto && !m.measure_only);
    m = wo_stream_mode_of(WO_PREFETCH_MODE_HOT_SET);
    assert_true(!m.all && !m.by_auto && m.measure_only);
}

/* prefetch.slots, or the default when the policy leaves it unset */
static void slots_wanted(void **state)
{
    struct wo_policy_globals g = {0};

    (void)state;
    assert_int_equal(wo_stream_slots_wanted(&g), WO_STREAM_SLOTS_DEFAULT);
    g.prefetch.slots = 6;
    assert_int_equal(wo_stream_slots_wanted(&g), 6);
}

/* the rule's comparisons, the ones the replay weighs auto by */
static void try_and_keep_ratios(void **state)
{
    (void)state;
    assert_true(wo_auto_try_pays(0.9, 1.0));
    assert_false(wo_auto_try_pays(WO_AUTO_TRY_RATIO, 1.0));
    assert_true(wo_auto_keep_pays(0.96, 1.0));
    assert_false(wo_auto_keep_pays(WO_AUTO_KEEP_RATIO, 1.0));
}

/* The executor's step keys: the second range seen switches to keys by
 * range, once; a run of launches on one range then counts once, so steps
 * are found whatever kernels (functions) read the ranges. */
static void step_keys_by_range(void **state)
{
    struct wo_stream_keys k;
    unsigned ended = 0, first = 0, switches = 0;
    bool sw;

    (void)state;
    wo_stream_keys_init(&k);
    /* forty ranges a step (the detector wants WO_STEPPER_MIN_MATCH keys
     * past the first period), each read by two launches of a function
     * that changes every step (the batch's kernels) */
    for (unsigned step = 0; step < 16; step++)
        for (uint32_t r = 0; r < 40; r++)
            for (unsigned l = 0; l < 2; l++) {
                unsigned e = wo_stream_keys_feed(&k, 0x1000 + step * 16 + l, 10 + r, &sw);

                if (sw) {
                    /* the second range seen, once */
                    assert_true(step == 0 && r == 1 && l == 0);
                    switches++;
                }
                assert_true(k.lows_vary == (step > 0 || r > 0));
                if (l == 1 && k.lows_vary)
                    assert_int_equal(e, 0); /* the run's second launch: no key */
                if (e && !first)
                    first = step;
                ended += e;
            }
    assert_int_equal(switches, 1);
    assert_true(ended > 0);
    assert_true(first < 12);
    assert_int_equal(k.last_seen, 49);
    wo_stream_keys_done(&k);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(faster_streamed_stays),
        cmocka_unit_test(slower_streamed_goes_back),
        cmocka_unit_test(copy_longer_than_step_never_tries),
        cmocka_unit_test(boundaries),
        cmocka_unit_test(one_outlier_does_not_decide),
        cmocka_unit_test(drift_waits_min_hold),
        cmocka_unit_test(longer_streamed_steps_stay),
        cmocka_unit_test(managed_decision_rechecked),
        cmocka_unit_test(managed_confirmed_backs_off),
        cmocka_unit_test(host_not_rechecked_managed_drift_is),
        cmocka_unit_test(managed_clear_loss_ends_recheck),
        cmocka_unit_test(failed_try_teaches_efficiency),
        cmocka_unit_test(grown_batch_tries_soon),
        cmocka_unit_test(failed_tries_back_off),
        cmocka_unit_test(slots_sized_for_their_ranges),
        cmocka_unit_test(mode_decoded_once),
        cmocka_unit_test(slots_wanted),
        cmocka_unit_test(try_and_keep_ratios),
        cmocka_unit_test(step_keys_by_range),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
