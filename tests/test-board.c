/* tests/test-board.c: core/board.c: a copy is published at most every
 * 100 ms unless forced; readers see the whole last copy, names and figures
 * together, and what is kept beside them under the same lock; a full draft
 * publishes the names added so far; a reader on another thread never sees
 * a half-made copy. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>

#include "core/board.h"

struct fig {
    uint64_t a, b;
};

struct seen {
    size_t n;
    char names[8][16];
    struct fig f[8];
};

static void see(void *ud, const char *name, const void *st)
{
    struct seen *s = ud;

    if (s->n < 8) {
        snprintf(s->names[s->n], sizeof(s->names[0]), "%s", name);
        memcpy(&s->f[s->n], st, sizeof(struct fig));
    }
    s->n++;
}

static void add(struct wo_board_draft *d, const char *name, uint64_t a)
{
    struct fig *f = wo_board_add(d, name);

    assert_non_null(f);
    assert_int_equal(f->a, 0); /* zeroed */
    f->a = a;
    f->b = 2 * a;
}

static uint64_t kept;

static void keep(void *ud)
{
    kept = *(uint64_t *)ud;
}

static void read_kept(void *ud)
{
    *(uint64_t *)ud = kept;
}

static void publish_and_read(void **state)
{
    static struct wo_board b = WO_BOARD_INIT(struct fig);
    struct wo_board_draft d;
    struct seen s = {0};
    uint64_t k = 7, got = 0;

    (void)state;
    wo_board_foreach(&b, see, &s);
    assert_int_equal(s.n, 0); /* nothing published yet */
    assert_true(wo_board_begin(&b, &d, 3, false)); /* the first is due */
    add(&d, "x", 1);
    add(&d, NULL, 2);
    add(&d, "z", 3);
    assert_null(wo_board_add(&d, "full")); /* room for 3 */
    wo_board_publish(&b, &d, keep, &k);
    wo_board_foreach(&b, see, &s);
    assert_int_equal(s.n, 3);
    assert_string_equal(s.names[0], "x");
    assert_string_equal(s.names[1], "(unnamed)");
    assert_string_equal(s.names[2], "z");
    assert_int_equal(s.f[2].a, 3);
    assert_int_equal(s.f[2].b, 6);
    wo_board_locked(&b, read_kept, &got);
    assert_int_equal(got, 7);

    /* within 100 ms: not due, unless forced; the last copy stands */
    assert_false(wo_board_begin(&b, &d, 1, false));
    assert_true(wo_board_begin(&b, &d, 1, true));
    add(&d, "only", 9);
    wo_board_publish(&b, &d, NULL, NULL);
    memset(&s, 0, sizeof(s));
    wo_board_foreach(&b, see, &s);
    assert_int_equal(s.n, 1);
    assert_string_equal(s.names[0], "only");
    assert_int_equal(s.f[0].b, 18);
    wo_board_locked(&b, read_kept, &got);
    assert_int_equal(got, 7); /* no also: what was kept stays */
}

/* A writer publishes copies whose figures all carry the copy's number;
 * a reader must never see two numbers in one walk. */
static struct wo_board race = WO_BOARD_INIT(struct fig);
static int stop, started; /* atomic */

static void *writer(void *arg)
{
    (void)arg;
    /* the reader walks while the copies change */
    while (!__atomic_load_n(&started, __ATOMIC_ACQUIRE))
        sched_yield();
    for (uint64_t k = 1; k <= 2000; k++) {
        struct wo_board_draft d;
        if (!wo_board_begin(&race, &d, 6, true))
            continue;
        for (int i = 0; i < 6; i++) {
            struct fig *f = wo_board_add(&d, "n");
            if (f)
                f->a = k;
        }
        wo_board_publish(&race, &d, NULL, NULL);
    }
    __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
    return NULL;
}

struct mixed {
    uint64_t first;
    size_t n;
    bool mixed;
};

static void check(void *ud, const char *name, const void *st)
{
    struct mixed *m = ud;
    const struct fig *f = st;

    (void)name;
    if (!m->n++)
        m->first = f->a;
    else if (f->a != m->first)
        m->mixed = true;
}

static void never_half(void **state)
{
    pthread_t t;

    (void)state;
    assert_int_equal(pthread_create(&t, NULL, writer, NULL), 0);
    do {
        struct mixed m = {0};
        wo_board_foreach(&race, check, &m);
        assert_false(m.mixed);
        assert_true(m.n == 0 || m.n == 6);
        __atomic_store_n(&started, 1, __ATOMIC_RELEASE);
    } while (!__atomic_load_n(&stop, __ATOMIC_ACQUIRE));
    pthread_join(t, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(publish_and_read),
        cmocka_unit_test(never_half),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
