/* tests/test-ring.c: the bounded MPSC event ring (core/ring.c): FIFO order,
 * a full ring drops and counts without blocking, and many producers with one
 * consumer lose, duplicate or reorder nothing that was accepted. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>
#include <string.h>

#include "core/event.h"

static struct wo_event ev_of(uint32_t tid, uint64_t n)
{
    struct wo_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.type = WO_EV_LAUNCH;
    ev.tid = tid;
    ev.stream = n;
    ev.l.func = n * 3 + tid; /* a second copy to catch torn events */
    return ev;
}

static void new_rejects_bad_capacity(void **state)
{
    assert_null(wo_ring_new(0));
    assert_null(wo_ring_new(1));
    assert_null(wo_ring_new(3));
    assert_null(wo_ring_new(1000));
    struct wo_ring *r = wo_ring_new(2);
    assert_non_null(r);
    wo_ring_free(r);
    wo_ring_free(NULL);
}

static void pop_empty_returns_zero(void **state)
{
    struct wo_ring *r = wo_ring_new(8);
    struct wo_event ev;
    assert_int_equal(wo_ring_pop(r, &ev), 0);
    assert_int_equal(wo_ring_pushed(r), 0);
    assert_int_equal(wo_ring_dropped(r), 0);
    wo_ring_free(r);
}

static void events_come_out_in_order_across_wraps(void **state)
{
    struct wo_ring *r = wo_ring_new(16);
    uint64_t in = 0, out = 0;
    struct wo_event ev;

    /* uneven batches so head and tail wrap at different points */
    for (int round = 0; round < 100; round++) {
        int k = round % 7 + 1;
        for (int i = 0; i < k; i++) {
            struct wo_event e = ev_of(1, in++);
            assert_int_equal(wo_ring_push(r, &e), 0);
        }
        for (int i = 0; i < k; i++) {
            assert_int_equal(wo_ring_pop(r, &ev), 1);
            assert_int_equal(ev.stream, out);
            assert_int_equal(ev.l.func, out * 3 + 1);
            out++;
        }
        assert_int_equal(wo_ring_pop(r, &ev), 0);
    }
    assert_int_equal(wo_ring_pushed(r), in);
    assert_int_equal(wo_ring_dropped(r), 0);
    wo_ring_free(r);
}

static void full_ring_drops_and_counts(void **state)
{
    enum { CAP = 64 };
    struct wo_ring *r = wo_ring_new(CAP);
    struct wo_event ev;

    for (uint64_t i = 0; i < CAP; i++) {
        struct wo_event e = ev_of(2, i);
        assert_int_equal(wo_ring_push(r, &e), 0);
    }
    /* full: each further push returns at once, dropped */
    for (uint64_t i = 0; i < 10; i++) {
        struct wo_event e = ev_of(2, 1000 + i);
        assert_int_equal(wo_ring_push(r, &e), -ENOSPC);
    }
    assert_int_equal(wo_ring_dropped(r), 10);
    assert_int_equal(wo_ring_pushed(r), CAP);
    /* one slot freed: one push fits, and the dropped ones never appear */
    assert_int_equal(wo_ring_pop(r, &ev), 1);
    assert_int_equal(ev.stream, 0);
    {
        struct wo_event e = ev_of(2, CAP);
        assert_int_equal(wo_ring_push(r, &e), 0);
        e = ev_of(2, CAP + 1);
        assert_int_equal(wo_ring_push(r, &e), -ENOSPC);
    }
    for (uint64_t i = 1; i <= CAP; i++) {
        assert_int_equal(wo_ring_pop(r, &ev), 1);
        assert_int_equal(ev.stream, i);
    }
    assert_int_equal(wo_ring_pop(r, &ev), 0);
    assert_int_equal(wo_ring_dropped(r), 11);
    wo_ring_free(r);
}

/* Low-priority events stop at three quarters; the rest of the ring stays
 * for the others. */
static void low_priority_leaves_last_quarter(void **state)
{
    enum { CAP = 64 };
    struct wo_ring *r = wo_ring_new(CAP);
    struct wo_event ev;
    uint64_t i;

    (void)state;
    assert_int_equal(wo_ring_capacity(r), CAP);
    for (i = 0; i < CAP * 3 / 4; i++) {
        struct wo_event e = ev_of(2, i);
        assert_int_equal(wo_ring_push_low(r, &e), 0);
    }
    {
        struct wo_event e = ev_of(2, 999);
        assert_int_equal(wo_ring_push_low(r, &e), -ENOSPC);
    }
    for (; i < CAP; i++) {
        struct wo_event e = ev_of(2, i);
        assert_int_equal(wo_ring_push(r, &e), 0);
    }
    assert_int_equal(wo_ring_dropped(r), 1);
    /* drained below the mark: low events fit again */
    for (i = 0; i < CAP / 4 + 1; i++)
        assert_int_equal(wo_ring_pop(r, &ev), 1);
    {
        struct wo_event e = ev_of(2, CAP);
        assert_int_equal(wo_ring_push_low(r, &e), 0);
    }
    wo_ring_free(r);
}

enum { PRODUCERS = 4 };

struct prod {
    struct wo_ring *ring;
    uint32_t tid;
    uint64_t n;
    uint64_t accepted, dropped;
};

static void *producer(void *arg)
{
    struct prod *p = arg;
    for (uint64_t i = 0; i < p->n; i++) {
        struct wo_event e = ev_of(p->tid, i);
        if (wo_ring_push(p->ring, &e) == 0)
            p->accepted++;
        else
            p->dropped++;
    }
    return NULL;
}

/* Runs PRODUCERS producers of n events each against one consumer (this
 * thread) and checks: every accepted event arrives once, in each producer's
 * order, intact; counters add up exactly. */
static void run_mpsc(uint32_t cap, uint64_t n, bool expect_no_drops)
{
    struct wo_ring *r = wo_ring_new(cap);
    struct prod p[PRODUCERS];
    pthread_t th[PRODUCERS];
    uint64_t next[PRODUCERS] = {0}, got[PRODUCERS] = {0}, popped = 0;
    uint64_t accepted = 0, dropped = 0;
    bool joined[PRODUCERS] = {0};
    int done = 0;

    assert_non_null(r);
    for (uint32_t i = 0; i < PRODUCERS; i++) {
        p[i] = (struct prod){.ring = r, .tid = i, .n = n};
        assert_int_equal(pthread_create(&th[i], NULL, producer, &p[i]), 0);
    }
    for (;;) {
        struct wo_event ev;
        if (wo_ring_pop(r, &ev)) {
            assert_true(ev.tid < PRODUCERS);
            /* per-producer FIFO: sequence numbers only grow (drops leave gaps) */
            assert_true(ev.stream >= next[ev.tid]);
            assert_int_equal(ev.l.func, ev.stream * 3 + ev.tid);
            next[ev.tid] = ev.stream + 1;
            got[ev.tid]++;
            popped++;
            continue;
        }
        if (done)
            break;
        /* all producers joined: one more drain pass catches the stragglers */
        done = 1;
        for (int i = 0; i < PRODUCERS; i++) {
            if (!joined[i] && pthread_tryjoin_np(th[i], NULL) == 0)
                joined[i] = true;
            if (!joined[i])
                done = 0;
        }
    }
    for (int i = 0; i < PRODUCERS; i++) {
        assert_int_equal(p[i].accepted + p[i].dropped, n);
        assert_int_equal(got[i], p[i].accepted);
        accepted += p[i].accepted;
        dropped += p[i].dropped;
    }
    assert_int_equal(popped, accepted);
    assert_int_equal(wo_ring_pushed(r), accepted);
    assert_int_equal(wo_ring_dropped(r), dropped);
    if (expect_no_drops)
        assert_int_equal(dropped, 0);
    wo_ring_free(r);
}

static void mpsc_exact_counts_no_drops(void **state)
{
    /* capacity holds everything: not one event may be lost */
    run_mpsc(1u << 17, 30000, true);
}

static void mpsc_exact_counts_with_drops(void **state)
{
    /* a small ring: producers outrun the consumer, drops must add up */
    run_mpsc(64, 100000, false);
}

static void now_is_monotonic(void **state)
{
    uint64_t a = wo_now_ns(), b = wo_now_ns();
    assert_true(a > 0);
    assert_true(b >= a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(new_rejects_bad_capacity),
        cmocka_unit_test(pop_empty_returns_zero),
        cmocka_unit_test(events_come_out_in_order_across_wraps),
        cmocka_unit_test(full_ring_drops_and_counts),
        cmocka_unit_test(low_priority_leaves_last_quarter),
        cmocka_unit_test(mpsc_exact_counts_no_drops),
        cmocka_unit_test(mpsc_exact_counts_with_drops),
        cmocka_unit_test(now_is_monotonic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
