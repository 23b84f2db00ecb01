/* tests/test-log.c: the logging path (core/log.c): prefix and level tags,
 * level filtering, truncation of long messages, the recursion guard, errno
 * preservation and whole lines from concurrent writers. Output goes into a
 * pipe through wo_log_set_fd. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/log.h"

static int pfd[2];

/* Logging from inside write(2), as a hook that logs would do when the
 * logging path itself reaches it. This definition wins over libc's for
 * log.c, which is linked into this executable. */
static int log_from_write;
static int inner_calls;
ssize_t write(int fd, const void *buf, size_t n);
ssize_t write(int fd, const void *buf, size_t n)
{
    if (__atomic_load_n(&log_from_write, __ATOMIC_RELAXED)) {
        __atomic_fetch_add(&inner_calls, 1, __ATOMIC_RELAXED);
        wo_log_write(WO_LOG_ERROR, "from inside write");
    }
    return syscall(SYS_write, fd, buf, n);
}

static int setup(void **state)
{
    if (pipe2(pfd, O_NONBLOCK | O_CLOEXEC) < 0)
        return -1;
    /* big enough for the concurrent test to not fill it while we read */
    fcntl(pfd[1], F_SETPIPE_SZ, 1 << 20);
    wo_log_set_fd(pfd[1]);
    wo_log_set_level(WO_LOG_WARN);
    return 0;
}

static int teardown(void **state)
{
    wo_log_set_fd(2);
    close(pfd[0]);
    close(pfd[1]);
    return 0;
}

/* Everything in the pipe now, NUL-terminated; length in *len. */
static char *drain(size_t *len)
{
    static char buf[1 << 20];
    size_t n = 0;
    for (;;) {
        ssize_t r = read(pfd[0], buf + n, sizeof(buf) - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

static void prefix_and_level_tags(void **state)
{
    wo_log_set_level(WO_LOG_TRACE);
    wo_error("e %d", 1);
    wo_warn("w %s", "two");
    wo_info("i");
    wo_debug("d");
    wo_trace("t");
    assert_string_equal(drain(NULL), "woffload: error: e 1\n"
                                     "woffload: warning: w two\n"
                                     "woffload: i\n"
                                     "woffload: debug: d\n"
                                     "woffload: trace: t\n");
}

static void message_ending_in_newline_gets_no_second(void **state)
{
    wo_warn("line\n");
    assert_string_equal(drain(NULL), "woffload: warning: line\n");
}

static void level_filtering(void **state)
{
    wo_log_set_level(WO_LOG_WARN);
    wo_info("dropped");
    wo_debug("dropped");
    wo_log_write(WO_LOG_INFO, "dropped too: the level is checked inside as well");
    wo_error("kept");
    assert_string_equal(drain(NULL), "woffload: error: kept\n");

    wo_log_set_level(WO_LOG_OFF);
    wo_error("nothing at off");
    size_t len;
    drain(&len);
    assert_int_equal(len, 0);

    wo_log_set_level(WO_LOG_ERROR);
    wo_warn("no");
    wo_error("yes");
    assert_string_equal(drain(NULL), "woffload: error: yes\n");
}

static void long_message_is_truncated_with_marker(void **state)
{
    char big[4000];
    size_t len;
    char *out;

    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    wo_error("%s", big);
    out = drain(&len);
    /* one line, at most the 1 KiB buffer, ending "...\n" */
    assert_int_equal(len, 1024);
    assert_memory_equal(out, "woffload: error: xxx", 20);
    assert_memory_equal(out + len - 4, "...\n", 4);
    assert_null(memchr(out, '\n', len - 1));

    /* the longest message that fits is not marked */
    size_t room = 1023 - strlen("woffload: error: ");
    big[room] = '\0';
    wo_error("%s", big);
    out = drain(&len);
    assert_int_equal(len, 1024);
    assert_memory_equal(out + len - 4, "xxx\n", 4);
    /* one byte more is */
    big[room] = 'x';
    big[room + 1] = '\0';
    wo_error("%s", big);
    out = drain(&len);
    assert_int_equal(len, 1024);
    assert_memory_equal(out + len - 4, "...\n", 4);
}

static void recursion_is_dropped_not_deadlocked(void **state)
{
    size_t len;
    char *out;

    __atomic_store_n(&inner_calls, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&log_from_write, 1, __ATOMIC_RELAXED);
    wo_error("outer");
    __atomic_store_n(&log_from_write, 0, __ATOMIC_RELAXED);
    out = drain(&len);
    /* write ran (and tried to log) once; the inner message was dropped */
    assert_int_equal(__atomic_load_n(&inner_calls, __ATOMIC_RELAXED), 1);
    assert_string_equal(out, "woffload: error: outer\n");
    /* the guard is released afterwards */
    wo_error("again");
    assert_string_equal(drain(NULL), "woffload: error: again\n");
}

static void errno_is_preserved(void **state)
{
    errno = EBADF;
    wo_error("x");
    assert_int_equal(errno, EBADF);
    wo_log_set_fd(-1); /* a failing write must not leak its errno either */
    errno = ENOSPC;
    wo_error("x");
    assert_int_equal(errno, ENOSPC);
    wo_log_set_fd(pfd[1]);
    drain(NULL);
}

static int once_site(void)
{
    wo_log_once(WO_LOG_WARN, "once only");
    return 0;
}

static void log_once_logs_once_per_site(void **state)
{
    for (int i = 0; i < 5; i++)
        once_site();
    assert_string_equal(drain(NULL), "woffload: warning: once only\n");
}

enum { THREADS = 4, LINES = 500 };

static void *spam(void *arg)
{
    for (int i = 0; i < LINES; i++)
        wo_error("thread %d line %d %s", (int)(uintptr_t)arg, i, "padding-padding-padding");
    return NULL;
}

static void concurrent_lines_stay_whole(void **state)
{
    pthread_t th[THREADS];
    int counts[THREADS] = {0};
    char *out, *line, *save = NULL;
    size_t len;

    for (uintptr_t i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, spam, (void *)i), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    out = drain(&len);
    for (line = strtok_r(out, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        int t, n;
        char pad[32];
        assert_int_equal(sscanf(line, "woffload: error: thread %d line %d %31s", &t, &n, pad), 3);
        assert_string_equal(pad, "padding-padding-padding");
        assert_true(t >= 0 && t < THREADS);
        assert_int_equal(n, counts[t]); /* in order per thread, none lost */
        counts[t]++;
    }
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(counts[i], LINES);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(prefix_and_level_tags, setup, teardown),
        cmocka_unit_test_setup_teardown(message_ending_in_newline_gets_no_second, setup, teardown),
        cmocka_unit_test_setup_teardown(level_filtering, setup, teardown),
        cmocka_unit_test_setup_teardown(long_message_is_truncated_with_marker, setup, teardown),
        cmocka_unit_test_setup_teardown(recursion_is_dropped_not_deadlocked, setup, teardown),
        cmocka_unit_test_setup_teardown(errno_is_preserved, setup, teardown),
        cmocka_unit_test_setup_teardown(log_once_logs_once_per_site, setup, teardown),
        cmocka_unit_test_setup_teardown(concurrent_lines_stay_whole, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
