/* tests/test-stream-await.c: the launch hook's bounded wait for a staging
 * copy (wo_stream_await, uvm/stream.c). The engine's host thread can run
 * ahead of the executor, which issues the copies on the consumer thread;
 * a hook that finds its range planned but not yet staged waits for the
 * publication instead of reading in place, within WO_STREAM_AWAIT_NS, and
 * a wait that ran out makes no later hook wait for that range until the
 * executor publishes it again. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "core/event.h"
#include "uvm/hotpath.h"
#include "uvm/stream.h"

#define GEN 7u

/* The waits that must end by an action of the other thread get a bound far
 * beyond any scheduling delay (the default is 0.5 ms, which a loaded CI
 * machine can exceed before the other thread even runs). */
#define LONG_NS (UINT64_C(5) * 1000 * 1000 * 1000)

static struct wo_stream_entry *entry(void)
{
    struct wo_stream_entry *e = &wo_stream_tab.e[3];

    wo_stream_await_ns = LONG_NS;
    memset(&wo_stream_tab.n, 0, sizeof(wo_stream_tab.n));
    memset(e, 0, sizeof(*e));
    e->gen = GEN;
    e->streamed = 1;
    e->planned = 1;
    return e;
}

struct later {
    struct wo_stream_entry *e;
    long delay_us;
    int what; /* 0 publish, 1 stop streaming, 2 new generation */
};

static void *act_later(void *arg)
{
    struct later *l = arg;
    struct timespec ts = {0, l->delay_us * 1000L};

    nanosleep(&ts, NULL);
    if (l->what == 0)
        __atomic_store_n(&l->e->word, wo_stream_word(GEN, 1, 2), __ATOMIC_RELEASE);
    else if (l->what == 1)
        __atomic_store_n(&l->e->streamed, 0, __ATOMIC_RELEASE);
    else
        __atomic_store_n(&l->e->gen, GEN + 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Runs wo_stream_await while another thread acts after delay_us; returns
 * its result and the nanoseconds it took. */
static bool await_with(struct wo_stream_entry *e, long delay_us, int what, uint64_t *ns)
{
    struct later l = {e, delay_us, what};
    pthread_t t;
    uint64_t t0;
    bool ok;

    assert_int_equal(pthread_create(&t, NULL, act_later, &l), 0);
    t0 = wo_now_ns();
    ok = wo_stream_await(e, GEN);
    *ns = wo_now_ns() - t0;
    pthread_join(t, NULL);
    return ok;
}

static void test_published_while_waiting(void **state)
{
    struct wo_stream_entry *e = entry();
    uint64_t ns;

    (void)state;
    /* the executor publishes 50 us later: the hook takes the slot */
    assert_true(await_with(e, 50, 0, &ns));
    assert_int_equal(wo_stream_tab.n.awaited, 1);
    assert_int_equal(wo_stream_tab.n.await_timeouts, 0);
    assert_true(wo_stream_tab.n.await_ns > 0 && wo_stream_tab.n.await_ns <= ns);
    assert_int_equal(e->nowait, 0);
}

static void test_runs_out_once(void **state)
{
    struct wo_stream_entry *e = entry();
    uint64_t t0, ns;

    (void)state;
    wo_stream_await_ns = WO_STREAM_AWAIT_NS;
    t0 = wo_now_ns();
    assert_false(wo_stream_await(e, GEN));
    ns = wo_now_ns() - t0;
    /* bounded: at least the bound, and not far beyond it */
    assert_true(ns >= WO_STREAM_AWAIT_NS);
    assert_true(ns < LONG_NS);
    assert_int_equal(wo_stream_tab.n.await_timeouts, 1);
    assert_int_equal(wo_stream_tab.n.awaited, 0);
    assert_int_equal(e->nowait, 1);
    /* the next launch into it does not wait again */
    wo_stream_await_ns = LONG_NS;
    t0 = wo_now_ns();
    assert_false(wo_stream_await(e, GEN));
    assert_true(wo_now_ns() - t0 < LONG_NS);
    assert_int_equal(wo_stream_tab.n.await_timeouts, 1);
}

static void test_not_planned(void **state)
{
    struct wo_stream_entry *e = entry();
    uint64_t t0;

    (void)state;
    /* a range outside the learned order: the executor is not coming */
    e->planned = 0;
    t0 = wo_now_ns();
    assert_false(wo_stream_await(e, GEN));
    assert_true(wo_now_ns() - t0 < LONG_NS);
    assert_int_equal(wo_stream_tab.n.awaited + wo_stream_tab.n.await_timeouts, 0);
}

static void test_dropped_while_waiting(void **state)
{
    struct wo_stream_entry *e = entry();
    uint64_t ns;

    (void)state;
    /* the range stops being streamed, or is freed and its id reused: the
     * wait ends at once, read in place */
    assert_false(await_with(e, 50, 1, &ns));
    assert_true(ns < LONG_NS);
    e = entry();
    assert_false(await_with(e, 50, 2, &ns));
    assert_true(ns < LONG_NS);
    assert_int_equal(wo_stream_tab.n.await_timeouts, 0);
}

/* ---- departure fences (wo_stream_publish_pos, uvm/hotpath.h) -------------
 * Spans 1-4 are published in slots 0-3, read by stream STREAM. The engine
 * moves 1, 2, 3, 4: on reaching a span, the hook records read_done of the
 * slot of the span it left two moves ago, before its own launch, and marks
 * that slot's assignment departed; a pin or a new assignment undoes it. */

#define STREAM UINT64_C(0x10)

static struct {
    int n;
    CUevent ev[16];
    CUstream st[16];
    int fail;                      /* the next record fails */
    struct wo_stream_entry *steal; /* the record unpublishes this entry meanwhile */
    int held;                      /* slot 0's inflight during the last record */
} recs;

static CUresult fake_record(CUevent e, CUstream st)
{
    if (recs.fail) {
        recs.fail = 0;
        return CUDA_ERROR_INVALID_HANDLE;
    }
    if (recs.n < 16) {
        recs.ev[recs.n] = e;
        recs.st[recs.n] = st;
    }
    recs.n++;
    /* the hook holds the slot across the record (the executor neither
     * reuses it nor destroys the event meanwhile) */
    recs.held = __atomic_load_n(&wo_stream_tab.slot[0].inflight, __ATOMIC_SEQ_CST);
    if (recs.steal)
        __atomic_store_n(&recs.steal->word, 0, __ATOMIC_SEQ_CST);
    return CUDA_SUCCESS;
}

static void fns(struct wo_stream_evfns *fn)
{
    fn->record = fake_record;
}

static void spans(void)
{
    memset(&recs, 0, sizeof(recs));
    memset(&wo_stream_tab.n, 0, sizeof(wo_stream_tab.n));
    wo_stream_tab.pos = wo_stream_tab.pos_prev = 0;
    for (unsigned i = 0; i < 4; i++) {
        struct wo_stream_slot *sl = &wo_stream_tab.slot[i];
        struct wo_stream_entry *e = &wo_stream_tab.e[i + 1];

        memset(sl, 0, sizeof(*sl));
        memset(e, 0, sizeof(*e));
        sl->read_done = (CUevent)(uintptr_t)(0x100 + i);
        sl->owner = STREAM + 1;
        sl->assign = 1;
        e->gen = GEN;
        e->streamed = 1;
        e->word = wo_stream_word(GEN, 1, i);
    }
}

/* The engine moves to each span of sids in turn (the launch that moves
 * it captured or not) */
static void walk(const char *sids, bool captured)
{
    for (const char *c = sids; *c; c++)
        wo_stream_publish_pos((uint32_t)(*c - '0'), STREAM, captured, fns);
}

static void test_depart_two_behind(void **state)
{
    (void)state;
    spans();
    walk("12", false);
    assert_int_equal(recs.n, 0); /* nothing two moves behind yet */
    walk("2", false);
    assert_int_equal(recs.n, 0); /* no move: nothing at all */
    assert_int_equal(wo_stream_tab.n.pos_wakes, 2);
    walk("3", false);
    /* span 1 (slot 0) left two moves ago: its read_done, on its stream */
    assert_int_equal(recs.n, 1);
    assert_ptr_equal(recs.ev[0], wo_stream_tab.slot[0].read_done);
    assert_ptr_equal(recs.st[0], (CUstream)(uintptr_t)STREAM);
    assert_true(wo_stream_departed(&wo_stream_tab.slot[0]));
    assert_int_equal(recs.held, 1); /* held while recorded, let go after */
    assert_int_equal(wo_stream_tab.slot[0].inflight, 0);
    assert_false(wo_stream_departed(&wo_stream_tab.slot[1])); /* left one move ago */
    assert_false(wo_stream_departed(&wo_stream_tab.slot[2])); /* where the engine is */
    walk("41", false); /* span 2 (slot 1), then span 3 (slot 2) */
    assert_int_equal(recs.n, 3);
    assert_ptr_equal(recs.ev[2], wo_stream_tab.slot[2].read_done);
    assert_true(wo_stream_departed(&wo_stream_tab.slot[1]));
    assert_true(wo_stream_departed(&wo_stream_tab.slot[2]));
    /* 2 (span 4, slot 3), then 3: span 1 two behind again, its slot's
     * fence still stands (no pin, same assignment): no second record */
    walk("23", false);
    assert_int_equal(recs.n, 4);
    assert_ptr_equal(recs.ev[3], wo_stream_tab.slot[3].read_done);
}

static void test_depart_undone(void **state)
{
    (void)state;
    spans();
    walk("123", false);
    assert_true(wo_stream_departed(&wo_stream_tab.slot[0]));
    /* a launch pinned the slot after the fence (redirect.c pin): the fence
     * does not cover it, and the next time it is two behind it is made
     * again */
    __atomic_add_fetch(&wo_stream_tab.slot[0].pins, 1, __ATOMIC_SEQ_CST);
    assert_false(wo_stream_departed(&wo_stream_tab.slot[0]));
    /* slot 1 departs at the next move; a new assignment there (the
     * executor's count) undoes it */
    walk("4", false);
    assert_true(wo_stream_departed(&wo_stream_tab.slot[1]));
    __atomic_add_fetch(&wo_stream_tab.slot[1].assign, 1, __ATOMIC_SEQ_CST);
    assert_false(wo_stream_departed(&wo_stream_tab.slot[1]));
    walk("123", false); /* span 1 two behind at 3 again */
    assert_true(wo_stream_departed(&wo_stream_tab.slot[0]));
    assert_int_equal(recs.n, 5); /* slots 0, 1, 2 (at 1), 3 (at 2), 0 again (at 3) */
    /* no reader: nothing to fence, never departed */
    wo_stream_tab.slot[3].owner = 0;
    assert_false(wo_stream_departed(&wo_stream_tab.slot[3]));
}

static void test_depart_not_taken(void **state)
{
    (void)state;
    /* the launch that moves the engine is captured: no record (it would
     * become a node of the engine's graph) */
    spans();
    walk("12", false);
    walk("3", true);
    assert_int_equal(recs.n, 0);
    assert_false(wo_stream_departed(&wo_stream_tab.slot[0]));
    assert_int_equal(wo_stream_tab.pos, 4); /* the position moved all the same */
    /* another stream reads the slot: not this launch's to fence */
    spans();
    wo_stream_tab.slot[0].owner = STREAM + 2;
    walk("123", false);
    assert_int_equal(recs.n, 0);
    assert_false(wo_stream_departed(&wo_stream_tab.slot[0]));
    /* the record fails: not departed */
    spans();
    walk("12", false);
    recs.fail = 1;
    walk("3", false);
    assert_false(wo_stream_departed(&wo_stream_tab.slot[0]));
    /* the executor took the slot back while the hook recorded: the record
     * may be of another assignment, not marked */
    spans();
    walk("12", false);
    recs.steal = &wo_stream_tab.e[1];
    walk("3", false);
    assert_int_equal(recs.n, 1);
    assert_int_equal(wo_stream_tab.slot[0].left, 0);
    /* span 1 unpublished (word 0): nothing to fence */
    spans();
    wo_stream_tab.e[1].word = 0;
    walk("123", false);
    assert_int_equal(recs.n, 0);
}

/* WOFFLOAD_DEPARTURE_LAG=1 (the second run of this test, meson's
 * test-stream-await-lag1): on reaching a span the hook fences the span it
 * leaves, not the one two moves back */
static void test_depart_lag_one(void **state)
{
    (void)state;
    spans();
    walk("1", false);
    assert_int_equal(recs.n, 0); /* nothing left yet */
    walk("2", false);
    /* span 1 (slot 0) left now: its read_done, before the launch at 2 */
    assert_int_equal(recs.n, 1);
    assert_ptr_equal(recs.ev[0], wo_stream_tab.slot[0].read_done);
    assert_ptr_equal(recs.st[0], (CUstream)(uintptr_t)STREAM);
    assert_true(wo_stream_departed(&wo_stream_tab.slot[0]));
    assert_false(wo_stream_departed(&wo_stream_tab.slot[1])); /* where the engine is */
    walk("2", false);
    assert_int_equal(recs.n, 1); /* no move: nothing */
    walk("3", false);
    assert_int_equal(recs.n, 2);
    assert_ptr_equal(recs.ev[1], wo_stream_tab.slot[1].read_done);
    assert_true(wo_stream_departed(&wo_stream_tab.slot[1]));
    assert_false(wo_stream_departed(&wo_stream_tab.slot[2]));
    /* a launch that read span 3 and then span 4 (one launch, two spans):
     * span 3's slot was pinned before the move fenced it, and the record
     * the hook makes after that launch is the one the executor waits for
     * (one event: its last record counts), so the fence stands */
    __atomic_add_fetch(&wo_stream_tab.slot[2].pins, 1, __ATOMIC_SEQ_CST);
    walk("4", false);
    assert_int_equal(recs.n, 3);
    assert_true(wo_stream_departed(&wo_stream_tab.slot[2]));
    /* a pin after the fence undoes it, as with a lag of 2 */
    __atomic_add_fetch(&wo_stream_tab.slot[2].pins, 1, __ATOMIC_SEQ_CST);
    assert_false(wo_stream_departed(&wo_stream_tab.slot[2]));
    /* captured: no record, the position moves */
    walk("1", true);
    assert_int_equal(recs.n, 3);
    assert_int_equal(wo_stream_tab.pos, 2);
    /* span 1 read again (the captured launch aside, a launch pinned its
     * slot); the move from 1 to 3 fences it again: it is left now */
    __atomic_add_fetch(&wo_stream_tab.slot[0].pins, 1, __ATOMIC_SEQ_CST);
    assert_false(wo_stream_departed(&wo_stream_tab.slot[0]));
    walk("3", false);
    assert_int_equal(recs.n, 4);
    assert_ptr_equal(recs.ev[3], wo_stream_tab.slot[0].read_done);
    assert_true(wo_stream_departed(&wo_stream_tab.slot[0]));
}

int main(void)
{
    const struct CMUnitTest lag1[] = {
        cmocka_unit_test(test_depart_lag_one),
    };
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_depart_two_behind),
        cmocka_unit_test(test_depart_undone),
        cmocka_unit_test(test_depart_not_taken),
        cmocka_unit_test(test_published_while_waiting),
        cmocka_unit_test(test_runs_out_once),
        cmocka_unit_test(test_not_planned),
        cmocka_unit_test(test_dropped_while_waiting),
    };
    const char *lag = getenv("WOFFLOAD_DEPARTURE_LAG");

    if (lag && strcmp(lag, "1") == 0)
        return cmocka_run_group_tests(lag1, NULL, NULL);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
