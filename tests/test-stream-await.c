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
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "core/event.h"
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_published_while_waiting),
        cmocka_unit_test(test_runs_out_once),
        cmocka_unit_test(test_not_planned),
        cmocka_unit_test(test_dropped_while_waiting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
