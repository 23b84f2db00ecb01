/* tests/test-settings.c: the WOFFLOAD_* table (core/settings.c): defaults,
 * a good and a garbage value for every variable (the message names the
 * variable, the value and what is accepted, and the default stays), unknown
 * WOFFLOAD_ names, and the printed table. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/log.h"
#include "core/settings.h"

struct msgs {
    int n;
    char m[8][600];
};

static void collect(void *ud, const char *msg)
{
    struct msgs *ms = ud;
    if (ms->n < 8)
        snprintf(ms->m[ms->n], sizeof(ms->m[0]), "%s", msg);
    ms->n++;
}

static int parse1(const char *kv, struct wo_settings *s, struct msgs *ms)
{
    char *env[] = {(char *)kv, NULL};
    memset(ms, 0, sizeof(*ms));
    return wo_settings_parse(env, s, collect, ms);
}

static void defaults_without_environment(void **state)
{
    struct wo_settings s;
    struct msgs ms = {0};
    char *env[] = {"PATH=/usr/bin", "HOME=/root", NULL};

    assert_int_equal(wo_settings_parse(env, &s, collect, &ms), 0);
    assert_int_equal(ms.n, 0);
    assert_int_equal(s.log_level, WO_LOG_WARN);
    assert_null(s.log_file);
    assert_null(s.policy);
    assert_null(s.trace);
    assert_null(s.stats);
    assert_string_equal(s.cuda_lib, "libcuda.so.1");
    assert_false(s.disable);
    assert_true(s.prefetch);
    assert_true(s.summary);
    assert_int_equal(s.ring_events, 16384);
    assert_int_equal(s.scan_words, 512);
    assert_int_equal(s.nerrors, 0);

    /* a NULL environment is the same as an empty one */
    assert_int_equal(wo_settings_parse(NULL, &s, collect, &ms), 0);
    assert_int_equal(s.ring_events, 16384);
}

/* One row per case: the assignment, whether it is accepted, and for a bad
 * value text its message must hold. */
struct row {
    const char *kv;
    bool good;
    const char *accepts; /* part of the "expected ..." text */
};

static const struct row rows[] = {
    {"WOFFLOAD_LOG=debug", true, NULL},
    {"WOFFLOAD_LOG=4", true, NULL},
    {"WOFFLOAD_LOG=ERROR", true, NULL},
    {"WOFFLOAD_LOG=loud", false, "off, error, warn, info, debug, trace"},
    {"WOFFLOAD_LOG=6", false, "off, error, warn, info, debug, trace"},
    {"WOFFLOAD_LOG_FILE=/tmp/wo.log", true, NULL},
    {"WOFFLOAD_LOG_FILE=/tmp/a\nb", false, "a path"},
    {"WOFFLOAD_POLICY=moe.yaml", true, NULL},
    {"WOFFLOAD_POLICY=moe\x1b[31m.yaml", false, "no control characters"},
    {"WOFFLOAD_TRACE=/tmp/t.wot", true, NULL},
    {"WOFFLOAD_TRACE=\t", false, "a path"},
    {"WOFFLOAD_DEVICE_MODEL=tools/models/h100.model", true, NULL},
    {"WOFFLOAD_DEVICE_MODEL=a\nb", false, "a path"},
    {"WOFFLOAD_STATS=/tmp/s.json", true, NULL},
    {"WOFFLOAD_STATS=x\ry", false, "a path"},
    {"WOFFLOAD_CUDA_LIB=/opt/fake/libcuda.so.1", true, NULL},
    {"WOFFLOAD_CUDA_LIB=", false, "a non-empty path"},
    {"WOFFLOAD_NVML_LIB=/opt/fake/libnvidia-ml.so.1", true, NULL},
    {"WOFFLOAD_NVML_LIB=", false, "a non-empty path"},
    {"WOFFLOAD_DISABLE=yes", true, NULL},
    {"WOFFLOAD_DISABLE=2", false, "1, 0, yes, no, true, false, on, off"},
    {"WOFFLOAD_PREFETCH=off", true, NULL},
    {"WOFFLOAD_PREFETCH=maybe", false, "1, 0, yes, no, true, false, on, off"},
    {"WOFFLOAD_PREFETCH_OWN_CONTEXT=0", true, NULL},
    {"WOFFLOAD_PREFETCH_OWN_CONTEXT=engine", false, "1, 0, yes, no, true, false, on, off"},
    {"WOFFLOAD_SUMMARY=FALSE", true, NULL},
    {"WOFFLOAD_SUMMARY=", false, "1, 0, yes, no, true, false, on, off"},
    {"WOFFLOAD_OBSERVE=on", true, NULL},
    {"WOFFLOAD_OBSERVE=sometimes", false, "1, 0, yes, no, true, false, on, off"},
    {"WOFFLOAD_RING_EVENTS=65536", true, NULL},
    {"WOFFLOAD_RING_EVENTS=1000", false, "a power-of-two integer from 1024 to 16777216"},
    {"WOFFLOAD_RING_EVENTS=512", false, "a power-of-two integer from 1024 to 16777216"},
    {"WOFFLOAD_RING_EVENTS=33554432", false, "from 1024 to 16777216"},
    {"WOFFLOAD_RING_EVENTS=99999999999999999999999", false, "from 1024 to 16777216"},
    {"WOFFLOAD_STATS_EVERY=1", true, NULL},
    {"WOFFLOAD_STATS_EVERY=86400", true, NULL},
    {"WOFFLOAD_STATS_EVERY=0.5", false, "an integer from 0 to 86400"},
    {"WOFFLOAD_STATS_EVERY=86401", false, "an integer from 0 to 86400"},
    {"WOFFLOAD_MANAGED_MARGIN=0", true, NULL},
    {"WOFFLOAD_MANAGED_MARGIN=4096", true, NULL},
    {"WOFFLOAD_MANAGED_MARGIN=1GiB", false, "an integer from 0 to 1048576"},
    {"WOFFLOAD_MANAGED_MARGIN=1048577", false, "an integer from 0 to 1048576"},
    {"WOFFLOAD_QUIET=1", true, NULL},
    {"WOFFLOAD_QUIET=hush", false, "1, 0, yes, no, true, false, on, off"},
    {"WOFFLOAD_PROGRESS=yes", true, NULL},
    {"WOFFLOAD_PROGRESS=2", false, "1, 0, yes, no, true, false, on, off"},
    {"WOFFLOAD_STREAM_CHECK=on", true, NULL},
    {"WOFFLOAD_STREAM_CHECK=all", false, "1, 0, yes, no, true, false, on, off"},
    {"WOFFLOAD_STREAM_RECHECK=0", true, NULL},
    {"WOFFLOAD_STREAM_RECHECK=-1", false, "an integer from 0 to 1048576"},
    {"WOFFLOAD_WRITE_CHECKS=0", true, NULL},
    {"WOFFLOAD_WRITE_CHECKS=sometimes", false, "1, 0, yes, no, true, false, on, off"},
    {"WOFFLOAD_LATE_BIND=1", true, NULL},
    {"WOFFLOAD_LATE_BIND=vmm", false, "1, 0, yes, no, true, false, on, off"},
    {"WOFFLOAD_FIT_BIND=1", true, NULL},
    {"WOFFLOAD_FIT_BIND=device", false, "1, 0, yes, no, true, false, on, off"},
    {"WOFFLOAD_FIT_SQUEEZE=0", true, NULL},
    {"WOFFLOAD_FIT_SQUEEZE=later", false, "1, 0, yes, no, true, false, on, off"},
    {"WOFFLOAD_FIT_SQUEEZE_LENT=1", true, NULL},
    {"WOFFLOAD_FIT_SQUEEZE_LENT=often", false, "1, 0, yes, no, true, false, on, off"},
    {"WOFFLOAD_FIT_SPREAD=0", true, NULL},
    {"WOFFLOAD_FIT_LEND=0", true, NULL},
    {"WOFFLOAD_FIT_LEND=later", false, "1, 0, yes, no, true, false, on, off"},
    {"WOFFLOAD_FIT_SPREAD=evenly", false, "1, 0, yes, no, true, false, on, off"},
    {"WOFFLOAD_FIT_LAYERS=0", true, NULL},
    {"WOFFLOAD_FIT_LAYERS=whole", false, "1, 0, yes, no, true, false, on, off"},
    {"WOFFLOAD_BIND_COPIES=1", true, NULL},
    {"WOFFLOAD_BIND_COPIES=maybe", false, "1, 0, yes, no, true, false, on, off"},
    {"WOFFLOAD_FIT_MEMO=/tmp/wo-fit-memo", true, NULL},
    {"WOFFLOAD_FIT_MEMO=/tmp/a\tb", false, "a path"},
    {"WOFFLOAD_PICKS=0", true, NULL},
    {"WOFFLOAD_PICKS=all", false, "1, 0, yes, no, true, false, on, off"},
    {"WOFFLOAD_KEEP_WARMUP=1", true, NULL},
    {"WOFFLOAD_PREPIN=0", true, NULL},
    {"WOFFLOAD_PREPIN=later", false, "1, 0, yes, no, true, false, on, off"},
    {"WOFFLOAD_KEEP_WARMUP=maybe", false, "1, 0, yes, no, true, false, on, off"},
    {"WOFFLOAD_READONLY=0", true, NULL},
    {"WOFFLOAD_DEPARTURE_FENCES=0", true, NULL},
    {"WOFFLOAD_DEPARTURE_FENCES=later", false, "1, 0, yes, no, true, false, on, off"},
    {"WOFFLOAD_DEPARTURE_LAG=1", true, NULL},
    {"WOFFLOAD_DEPARTURE_LAG=0", false, "an integer from 1 to 2"},
    {"WOFFLOAD_DEPARTURE_LAG=3", false, "an integer from 1 to 2"},
    {"WOFFLOAD_READONLY=sometimes", false, "1, 0, yes, no, true, false, on, off"},
    {"WOFFLOAD_PICKS_HOT=2048", true, NULL},
    {"WOFFLOAD_PICKS_HOT=2GiB", false, "an integer from 0 to 16777216"},
    {"WOFFLOAD_PICKS_HOT=-1", false, "an integer from 0 to 16777216"},
    {"WOFFLOAD_GGML_PICKS=80", true, NULL},
    {"WOFFLOAD_GGML_PICKS=100", true, NULL},
    {"WOFFLOAD_GGML_PICKS=101", false, "an integer from 0 to 100"},
    {"WOFFLOAD_GRAPH_REPLAY=0", true, NULL},
    {"WOFFLOAD_GRAPH_REPLAY=sometimes", false, "1, 0, yes, no, true, false, on, off"},
    {"WOFFLOAD_GGML_STREAM=0", true, NULL},
    {"WOFFLOAD_GGML_STREAM=50", true, NULL},
    {"WOFFLOAD_GGML_STREAM=150", false, "an integer from 0 to 100"},
    {"WOFFLOAD_GGML_SPLIT=2", true, NULL},
    {"WOFFLOAD_GGML_SPLIT=3", false, "an integer from 0 to 2"},
    {"WOFFLOAD_PICKS_ENGINE=50", true, NULL},
    {"WOFFLOAD_PICKS_ENGINE=80", true, NULL},
    {"WOFFLOAD_PICKS_ENGINE=101", false, "an integer from 0 to 100"},
    {"WOFFLOAD_PICKS_WHOLE=0", true, NULL},
    {"WOFFLOAD_PICKS_WHOLE=93", true, NULL},
    {"WOFFLOAD_PICKS_WHOLE=101", false, "an integer from 0 to 100"},
    {"WOFFLOAD_PICKS_BUFFERS=1", true, NULL},
    {"WOFFLOAD_PICKS_BUFFERS=3", false, "an integer from 1 to 2"},
    {"WOFFLOAD_PICKS_BUFFERS=0", false, "an integer from 1 to 2"},
    {"WOFFLOAD_PICKS_EARLY=0", true, NULL},
    {"WOFFLOAD_PICKS_EARLY=2", false, "an integer from 0 to 1"},
    {"WOFFLOAD_PICKS_STALL_MS=100", true, NULL},
    {"WOFFLOAD_PICKS_LAZY=0", true, NULL},
    {"WOFFLOAD_PICKS_LAZY=lazy", false, "1, 0, yes, no, true, false, on, off"},
    {"WOFFLOAD_PICKS_STALL_MS=5", false, "an integer from 10 to 600000"},
    {"WOFFLOAD_GGML_PICKS_FROM=0", true, NULL},
    {"WOFFLOAD_GGML_PICKS_FROM=60", true, NULL},
    {"WOFFLOAD_GGML_PICKS_FROM=half", false, "an integer from 0 to 100"},
    {"WOFFLOAD_SCAN_WORDS=0", true, NULL},
    {"WOFFLOAD_SCAN_WORDS=4096", true, NULL},
    {"WOFFLOAD_SCAN_WORDS=4097", false, "an integer from 0 to 4096"},
    {"WOFFLOAD_SCAN_WORDS=-1", false, "an integer from 0 to 4096"},
    {"WOFFLOAD_SCAN_WORDS=12abc", false, "an integer from 0 to 4096"},
};

static size_t field_size(const struct wo_setting_def *d)
{
    switch (d->type) {
    case WO_SETTING_BOOL:
        return sizeof(bool);
    case WO_SETTING_LEVEL:
        return sizeof(int);
    case WO_SETTING_PATH:
        return sizeof(const char *);
    default:
        return sizeof(uint32_t);
    }
}

static void every_variable_good_and_bad(void **state)
{
    bool seen[64] = {0};

    for (size_t i = 0; i < WO_ARRAY_SIZE(rows); i++) {
        const struct row *rw = &rows[i];
        struct wo_settings s, def;
        struct msgs ms;
        const char *eq = strchr(rw->kv, '=');
        size_t nlen = (size_t)(eq - rw->kv);
        const struct wo_setting_def *d = NULL;

        for (size_t k = 0; k < wo_setting_ndefs; k++)
            if (strlen(wo_setting_defs[k].name) == nlen &&
                strncmp(wo_setting_defs[k].name, rw->kv, nlen) == 0) {
                d = &wo_setting_defs[k];
                seen[k] = true;
            }
        assert_non_null(d);
        wo_settings_parse(NULL, &def, collect, &ms);
        int bad = parse1(rw->kv, &s, &ms);
        if (rw->good) {
            if (bad != 0)
                fail_msg("%s rejected: %s", rw->kv, ms.m[0]);
            assert_int_equal(ms.n, 0);
            /* every good row sets a value other than the default */
            assert_memory_not_equal((char *)&s + d->offset, (char *)&def + d->offset,
                                    field_size(d));
        } else {
            if (bad != 1 || ms.n != 1)
                fail_msg("%s accepted", rw->kv);
            assert_int_equal(s.nerrors, 1);
            /* names the variable, shows the value, says what is accepted */
            assert_non_null(strstr(ms.m[0], d->name));
            assert_non_null(strstr(ms.m[0], "is not valid: expected"));
            if (!strstr(ms.m[0], rw->accepts))
                fail_msg("message for %s lacks \"%s\": %s", rw->kv, rw->accepts, ms.m[0]);
            /* no raw control character reaches the log line */
            for (const char *c = ms.m[0]; *c; c++)
                assert_true((unsigned char)*c >= 0x20);
            /* the default is used instead */
            assert_memory_equal((char *)&s + d->offset, (char *)&def + d->offset, field_size(d));
        }
    }
    for (size_t k = 0; k < wo_setting_ndefs; k++)
        if (!seen[k])
            fail_msg("no test row for %s", wo_setting_defs[k].name);
}

static void bad_message_shows_value(void **state)
{
    struct wo_settings s;
    struct msgs ms;
    parse1("WOFFLOAD_RING_EVENTS=lots", &s, &ms);
    assert_string_equal(ms.m[0], "WOFFLOAD_RING_EVENTS=\"lots\" is not valid: expected a power-of-two "
                                 "integer from 1024 to 16777216; using the default \"16384\"");
    parse1("WOFFLOAD_POLICY=a\nb", &s, &ms);
    assert_non_null(strstr(ms.m[0], "\"a\\x0ab\""));
}

static void good_values_parse_to_fields(void **state)
{
    struct wo_settings s;
    struct msgs ms;
    char *env[] = {"WOFFLOAD_LOG=trace",        "WOFFLOAD_POLICY=/etc/p.yaml",
                   "WOFFLOAD_DISABLE=on",       "WOFFLOAD_PREFETCH=0",
                   "WOFFLOAD_RING_EVENTS=1024", "WOFFLOAD_SCAN_WORDS=30",
                   "WOFFLOAD_LOG_FILE=",        NULL};
    memset(&ms, 0, sizeof(ms));
    assert_int_equal(wo_settings_parse(env, &s, collect, &ms), 0);
    assert_int_equal(s.log_level, WO_LOG_TRACE);
    assert_string_equal(s.policy, "/etc/p.yaml");
    assert_true(s.disable);
    assert_false(s.prefetch);
    assert_int_equal(s.ring_events, 1024);
    assert_int_equal(s.scan_words, 30);
    assert_null(s.log_file); /* empty: none */
}

/* A setting given or not (fit's default for WOFFLOAD_GGML_PICKS_FROM's band
 * is 0 unless given: uvm/place-fit.c); a bad value counts as not given, and
 * so does a name that is no setting */
static void settings_given(void **state)
{
    struct wo_settings s;
    struct msgs ms;
    char *none[] = {NULL};
    char *given[] = {"WOFFLOAD_GGML_PICKS_FROM=80", NULL};
    char *zero[] = {"WOFFLOAD_GGML_PICKS_FROM=0", NULL};
    char *bad[] = {"WOFFLOAD_GGML_PICKS_FROM=most", NULL};

    (void)state;
    memset(&ms, 0, sizeof(ms));
    assert_int_equal(wo_settings_parse(none, &s, collect, &ms), 0);
    assert_false(wo_settings_given(&s, "WOFFLOAD_GGML_PICKS_FROM"));
    assert_int_equal(s.ggml_picks_from, 80);
    assert_int_equal(wo_settings_parse(given, &s, collect, &ms), 0);
    assert_true(wo_settings_given(&s, "WOFFLOAD_GGML_PICKS_FROM"));
    assert_false(wo_settings_given(&s, "WOFFLOAD_GGML_PICKS")); /* another row's bit */
    assert_false(wo_settings_given(&s, "WOFFLOAD_NO_SUCH"));
    assert_int_equal(wo_settings_parse(zero, &s, collect, &ms), 0);
    assert_true(wo_settings_given(&s, "WOFFLOAD_GGML_PICKS_FROM"));
    assert_int_equal(s.ggml_picks_from, 0);
    assert_int_equal(wo_settings_parse(bad, &s, collect, &ms), 1);
    assert_false(wo_settings_given(&s, "WOFFLOAD_GGML_PICKS_FROM"));
}

static void long_path_is_rejected(void **state)
{
    static char kv[PATH_MAX + 64];
    struct wo_settings s;
    struct msgs ms;
    int n = snprintf(kv, sizeof(kv), "WOFFLOAD_TRACE=");
    memset(kv + n, 'a', PATH_MAX);
    kv[n + PATH_MAX] = '\0';
    assert_int_equal(parse1(kv, &s, &ms), 1);
    assert_null(s.trace);
    /* the value is shown cut, not the whole 4 KiB */
    assert_true(strlen(ms.m[0]) < 400);
    assert_non_null(strstr(ms.m[0], "...\""));
}

static void unknown_names_are_reported(void **state)
{
    struct wo_settings s;
    struct msgs ms = {0};
    char *env[] = {"WOFFLOAD_POLCY=x.yaml", "WOFFLOAD_FROBNICATE=1", "WOFFLOAD_LOG=info",
                   "NOT_WOFFLOAD_X=1", "WOFFLOAD_LOGX", NULL};

    /* unknown names are not bad values: the count stays 0 */
    assert_int_equal(wo_settings_parse(env, &s, collect, &ms), 0);
    assert_int_equal(ms.n, 3);
    assert_non_null(strstr(ms.m[0], "WOFFLOAD_POLCY is not a libwoffload setting"));
    assert_non_null(strstr(ms.m[0], "did you mean WOFFLOAD_POLICY?"));
    assert_non_null(strstr(ms.m[1], "WOFFLOAD_FROBNICATE is not a libwoffload setting"));
    assert_null(strstr(ms.m[1], "did you mean"));
    assert_non_null(strstr(ms.m[2], "WOFFLOAD_LOGX"));
    assert_int_equal(s.log_level, WO_LOG_INFO);
    assert_null(s.policy);
}

static void level_names_round_trip(void **state)
{
    for (int l = WO_LOG_OFF; l <= WO_LOG_TRACE; l++)
        assert_int_equal(wo_log_level_from_string(wo_log_level_to_string(l)), l);
    assert_int_equal(wo_log_level_from_string("Info"), WO_LOG_INFO);
    assert_int_equal(wo_log_level_from_string("WARNING"), WO_LOG_WARN);
    assert_int_equal(wo_log_level_from_string(""), -EINVAL);
    assert_int_equal(wo_log_level_from_string("55"), -EINVAL);
    assert_string_equal(wo_log_level_to_string(17), "?");
}

static void print_lists_every_variable(void **state)
{
    struct wo_settings s;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    char *env[] = {"WOFFLOAD_SCAN_WORDS=77", NULL};

    assert_non_null(f);
    wo_settings_parse(env, &s, NULL, NULL);
    wo_settings_print(f, &s);
    fclose(f);
    for (size_t k = 0; k < wo_setting_ndefs; k++) {
        assert_non_null(strstr(buf, wo_setting_defs[k].name));
        assert_non_null(strstr(buf, wo_setting_defs[k].doc));
    }
    assert_non_null(strstr(buf, "now 77"));
    free(buf);
}

static void process_settings_are_read_once(void **state)
{
    const struct wo_settings *a = wo_settings(), *b = wo_settings();
    assert_non_null(a);
    assert_ptr_equal(a, b);
}

/* In a new process (wo_settings() reads the environment once per process):
 * with WOFFLOAD_LOG_FILE set, log lines are appended to that file. */
static void log_file_setting_redirects_log(void **state)
{
    char path[] = "/tmp/test-settings-log-XXXXXX";
    int fd = mkstemp(path), status;
    char buf[256] = {0};
    pid_t pid;

    assert_true(fd >= 0);
    assert_int_equal(write(fd, "before\n", 7), 7);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* a fresh process: this one has read its settings already */
        setenv("WOFFLOAD_LOG_FILE", path, 1);
        setenv("WOFFLOAD_LOG", "info", 1);
        execl("/proc/self/exe", "test-settings", "--log-to-setting", (char *)NULL);
        _exit(127);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(status, 0);
    assert_true(pread(fd, buf, sizeof(buf) - 1, 0) > 0);
    close(fd);
    unlink(path);
    /* appended, not truncated */
    assert_string_equal(buf, "before\nwoffload: to the file\n");
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--log-to-setting") == 0) {
        wo_settings();
        wo_info("to the file");
        return 0;
    }

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(defaults_without_environment),
        cmocka_unit_test(every_variable_good_and_bad),
        cmocka_unit_test(bad_message_shows_value),
        cmocka_unit_test(good_values_parse_to_fields),
        cmocka_unit_test(settings_given),
        cmocka_unit_test(long_path_is_rejected),
        cmocka_unit_test(unknown_names_are_reported),
        cmocka_unit_test(level_names_round_trip),
        cmocka_unit_test(print_lists_every_variable),
        cmocka_unit_test(process_settings_are_read_once),
        cmocka_unit_test(log_file_setting_redirects_log),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
