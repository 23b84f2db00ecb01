/* tests/test-stream-auto.c: `prefetch.mode: auto`'s decision by step time
 * (uvm/stream-auto.c): when it tries streaming, when it keeps it, when it
 * goes back in place, and when it measures again. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "uvm/stream-auto.h"

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
    /* held in place: nothing for HOLD_STEPS, then watched and tried again */
    start(&c);
    run(&c, 1 + WO_AUTO_PROBE_STEPS, 410, 20.7);
    run(&c, WO_AUTO_SETTLE_STEPS + WO_AUTO_PROBE_STEPS, 465, 20.7);
    assert_int_equal(run(&c, WO_AUTO_SETTLE_STEPS + WO_AUTO_HOLD_STEPS - 1, 410, 20.7),
                     WO_AUTO_NONE);
    assert_int_equal(run(&c, 1 + WO_AUTO_PROBE_STEPS, 410, 20.7), WO_AUTO_STREAM);
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

/* A server's batch moves every step: a drift right after a decision
 * waits MIN_HOLD steps before it counts. */
static void drift_waits_min_hold(void **state)
{
    struct clock c;
    (void)state;
    start(&c);
    run(&c, 1 + WO_AUTO_PROBE_STEPS, 1570, 20.7);
    run(&c, WO_AUTO_SETTLE_STEPS + WO_AUTO_PROBE_STEPS, 420, 20.7);
    assert_true(c.a.streaming);
    assert_int_equal(c.a.phase, WO_AUTO_HOLD);
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
    start(&c);
    run(&c, 1 + WO_AUTO_PROBE_STEPS, 1570, 20.7);
    run(&c, WO_AUTO_SETTLE_STEPS + WO_AUTO_PROBE_STEPS, 420, 20.7);
    assert_true(c.a.streaming);
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
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
