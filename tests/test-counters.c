/* tests/test-counters.c: core/counters.c: the JSON carries every counter by
 * name, registered per-entry-point calls (non-zero only), per-caller counts
 * grouped by library, and snprintf semantics for short buffers; counting
 * from several threads is exact. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/counters.h"

static char *json(void)
{
    long n = wo_counters_json(NULL, 0);
    char *buf;

    assert_true(n > 0);
    buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(wo_counters_json(buf, (size_t)n + 1), n);
    assert_int_equal(strlen(buf), (size_t)n);
    return buf;
}

static long long num(const char *s, const char *key)
{
    char pat[96];
    const char *p;

    snprintf(pat, sizeof(pat), "\"%s\":", key);
    p = strstr(s, pat);
    return p ? strtoll(p + strlen(pat), NULL, 10) : -1;
}

static void json_names_every_counter(void **state)
{
    char *s;
    (void)state;

    wo_count(WO_CTR_launch_calls, 3);
    s = json();
    assert_true(s[0] == '{' && s[strlen(s) - 1] == '}');
    assert_true(num(s, "alloc_calls") >= 0);
    assert_true(num(s, "entry_point_substituted") >= 0);
    assert_int_equal(num(s, "launch_calls"), (long long)wo_counter_get(WO_CTR_launch_calls));
    free(s);
}

static void json_short_buffer_is_truncated_and_terminated(void **state)
{
    char small[16];
    long need = wo_counters_json(NULL, 0);
    (void)state;

    memset(small, 'x', sizeof(small));
    assert_int_equal(wo_counters_json(small, sizeof(small)), need);
    assert_int_equal(strlen(small), sizeof(small) - 1);
}

static const char *const call_names[] = {"cuA", "cuB", "cuC"};
static uint64_t call_values[3];

static void calls_lists_only_nonzero_entry_points(void **state)
{
    char *s, *calls;
    (void)state;

    wo_counters_register_calls(call_names, call_values, 3);
    call_values[1] = 7;
    s = json();
    calls = strstr(s, "\"calls\":{");
    assert_non_null(calls);
    assert_int_equal(num(calls, "cuB"), 7);
    assert_int_equal(num(calls, "cuA"), -1);
    assert_int_equal(num(calls, "cuC"), -1);
    free(s);
}

static __attribute__((noinline)) void caller_here(enum wo_caller_ctr c)
{
    wo_count_caller(__builtin_return_address(0), c);
}

static void callers_are_grouped_by_library(void **state)
{
    char *s, *callers, *me;
    (void)state;

    for (int i = 0; i < 5; i++)
        caller_here(WO_CALLER_LAUNCH);
    caller_here(WO_CALLER_ALLOC);
    s = json();
    callers = strstr(s, "\"callers\":{");
    assert_non_null(callers);
    /* This program is the caller: its file name is the key. */
    me = strstr(callers, "\"test-counters\":{");
    assert_non_null(me);
    assert_int_equal(num(me, "launch"), 5);
    assert_int_equal(num(me, "alloc"), 1);
    assert_int_equal(num(me, "copy"), 0);
    free(s);
}

#define NT 4
#define PER 100000

static void *bump(void *arg)
{
    (void)arg;
    for (int i = 0; i < PER; i++) {
        wo_count(WO_CTR_copy_calls, 1);
        wo_count_caller((const void *)(uintptr_t)(0x1000 + (i & 7)), WO_CALLER_COPY);
    }
    return NULL;
}

static void counting_from_threads_is_exact(void **state)
{
    pthread_t t[NT];
    uint64_t before = wo_counter_get(WO_CTR_copy_calls);
    char *s;
    (void)state;

    for (int i = 0; i < NT; i++)
        assert_int_equal(pthread_create(&t[i], NULL, bump, NULL), 0);
    for (int i = 0; i < NT; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(wo_counter_get(WO_CTR_copy_calls), before + NT * PER);
    /* Addresses in no library are grouped under "unknown". */
    s = json();
    assert_int_equal(num(strstr(s, "\"unknown\":{"), "copy"), NT * PER);
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(json_names_every_counter),
        cmocka_unit_test(json_short_buffer_is_truncated_and_terminated),
        cmocka_unit_test(calls_lists_only_nonzero_entry_points),
        cmocka_unit_test(callers_are_grouped_by_library),
        cmocka_unit_test(counting_from_threads_is_exact),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
