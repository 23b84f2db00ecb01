/* core/settings.c: see settings.h. */
#include "core/settings.h"

#include <pthread.h>
#include <stdarg.h>
#include <string.h>
#include <strings.h>

#include "core/log.h"

#define OFF(f) offsetof(struct wo_settings, f)

const struct wo_setting_def wo_setting_defs[] = {
    {"WOFFLOAD_LOG", WO_SETTING_LEVEL, "warn",
     "log level: off, error, warn, info, debug, trace", OFF(log_level), 0, 0},
    {"WOFFLOAD_LOG_FILE", WO_SETTING_PATH, "",
     "append log lines to this file instead of stderr", OFF(log_file), 0, 0},
    {"WOFFLOAD_POLICY", WO_SETTING_PATH, "",
     "YAML placement policy; unset: every allocation passes through untouched", OFF(policy), 0, 0},
    {"WOFFLOAD_TRACE", WO_SETTING_PATH, "",
     "record the event stream to this file (docs/trace-format.md)", OFF(trace), 0, 0},
    {"WOFFLOAD_STATS", WO_SETTING_PATH, "",
     "write the JSON stats snapshot to this file at exit", OFF(stats), 0, 0},
    {"WOFFLOAD_CUDA_LIB", WO_SETTING_PATH, "libcuda.so.1",
     "the CUDA driver library to dlopen", OFF(cuda_lib), 0, 0},
    {"WOFFLOAD_DISABLE", WO_SETTING_BOOL, "0",
     "1: load but intercept nothing (every call goes straight to CUDA)", OFF(disable), 0, 0},
    {"WOFFLOAD_PREFETCH", WO_SETTING_BOOL, "1",
     "0: never start the prefetch thread (managed memory then migrates on demand)", OFF(prefetch), 0, 0},
    {"WOFFLOAD_SUMMARY", WO_SETTING_BOOL, "1",
     "print the placement summary at seal and at exit (at log level info or above: always)", OFF(summary), 0, 0},
    {"WOFFLOAD_RING_EVENTS", WO_SETTING_UINT_POW2, "16384",
     "capacity of the launch event ring (power of two); a full ring drops and counts", OFF(ring_events), 1024, UINT64_C(1) << 24},
    {"WOFFLOAD_SCAN_WORDS", WO_SETTING_UINT, "512",
     "most 8-byte words of kernel parameters scanned per launch for tracked addresses", OFF(scan_words), 0, 4096},
};
const size_t wo_setting_ndefs = WO_ARRAY_SIZE(wo_setting_defs);

static const char *const level_names[] = {"off", "error", "warn", "info", "debug", "trace"};

int wo_log_level_from_string(const char *s)
{
    for (size_t i = 0; i < WO_ARRAY_SIZE(level_names); i++)
        if (strcasecmp(s, level_names[i]) == 0)
            return (int)i;
    if (strcasecmp(s, "warning") == 0)
        return WO_LOG_WARN;
    if (s[0] >= '0' && s[0] <= '5' && s[1] == '\0')
        return s[0] - '0';
    return -EINVAL;
}

const char *wo_log_level_to_string(int level)
{
    if (level < 0 || (size_t)level >= WO_ARRAY_SIZE(level_names))
        return "?";
    return level_names[level];
}

static int parse_bool(const char *s, bool *ret)
{
    static const char *const yes[] = {"1", "yes", "true", "on"};
    static const char *const no[] = {"0", "no", "false", "off"};
    for (size_t i = 0; i < WO_ARRAY_SIZE(yes); i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *ret = true;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *ret = false;
            return 0;
        }
    }
    return -EINVAL;
}

static int parse_uint(const char *s, uint64_t *ret)
{
    uint64_t v = 0;
    if (!*s)
        return -EINVAL;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -EINVAL;
        if (v > (UINT64_MAX - 9) / 10)
            return -ERANGE;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    *ret = v;
    return 0;
}

static void report_fmt(void (*report)(void *, const char *), void *ud, const char *fmt, ...)
    WO_PRINTF(3, 4);
static void report_fmt(void (*report)(void *, const char *), void *ud, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (report)
        report(ud, buf);
    else
        wo_log_write(WO_LOG_ERROR, "%s", buf);
}

/* Applies one value; returns 0 or -EINVAL with *accepted describing what is. */
static int apply(const struct wo_setting_def *d, const char *v, struct wo_settings *out,
                 char *accepted, size_t alen)
{
    char *field = (char *)out + d->offset;
    switch (d->type) {
    case WO_SETTING_BOOL: {
        bool b;
        snprintf(accepted, alen, "1, 0, yes, no, true, false, on, off");
        if (parse_bool(v, &b) < 0)
            return -EINVAL;
        memcpy(field, &b, sizeof(b));
        return 0;
    }
    case WO_SETTING_LEVEL: {
        int l = wo_log_level_from_string(v);
        snprintf(accepted, alen, "off, error, warn, info, debug, trace (or 0-5)");
        if (l < 0)
            return -EINVAL;
        memcpy(field, &l, sizeof(l));
        return 0;
    }
    case WO_SETTING_PATH: {
        const char *p = *v ? v : NULL;
        snprintf(accepted, alen, "a path");
        memcpy(field, &p, sizeof(p));
        return 0;
    }
    case WO_SETTING_UINT:
    case WO_SETTING_UINT_POW2: {
        uint64_t u;
        uint32_t u32;
        snprintf(accepted, alen, "%s integer from %llu to %llu",
                 d->type == WO_SETTING_UINT_POW2 ? "a power-of-two" : "an",
                 (unsigned long long)d->min, (unsigned long long)d->max);
        if (parse_uint(v, &u) < 0 || u < d->min || u > d->max)
            return -EINVAL;
        if (d->type == WO_SETTING_UINT_POW2 && (u & (u - 1)) != 0)
            return -EINVAL;
        u32 = (uint32_t)u;
        memcpy(field, &u32, sizeof(u32));
        return 0;
    }
    }
    return -EINVAL;
}

static const char *env_lookup(char *const *envp, const char *name)
{
    size_t n = strlen(name);
    if (!envp)
        return NULL;
    for (; *envp; envp++)
        if (strncmp(*envp, name, n) == 0 && (*envp)[n] == '=')
            return *envp + n + 1;
    return NULL;
}

int wo_settings_parse(char *const *envp, struct wo_settings *out,
                      void (*report)(void *ud, const char *msg), void *ud)
{
    char accepted[160];
    int bad = 0;

    memset(out, 0, sizeof(*out));
    for (size_t i = 0; i < wo_setting_ndefs; i++) {
        const struct wo_setting_def *d = &wo_setting_defs[i];
        const char *v = env_lookup(envp, d->name);
        int r = apply(d, d->def, out, accepted, sizeof(accepted));
        if (r < 0) /* a bad default is a bug in the table above */
            abort();
        if (!v)
            continue;
        if (apply(d, v, out, accepted, sizeof(accepted)) < 0) {
            report_fmt(report, ud, "%s=\"%.200s\" is not valid: expected %s; using the default \"%s\"",
                       d->name, v, accepted, d->def);
            apply(d, d->def, out, accepted, sizeof(accepted));
            bad++;
        }
    }
    /* Names that look like ours but are not in the table: most likely typos. */
    for (char *const *e = envp; e && *e; e++) {
        bool known = false;
        if (strncmp(*e, "WOFFLOAD_", 9) != 0)
            continue;
        for (size_t i = 0; i < wo_setting_ndefs && !known; i++) {
            size_t n = strlen(wo_setting_defs[i].name);
            known = strncmp(*e, wo_setting_defs[i].name, n) == 0 && (*e)[n] == '=';
        }
        if (!known) {
            const char *eq = strchr(*e, '=');
            int len = eq ? (int)(eq - *e) : (int)strlen(*e);
            report_fmt(report, ud, "%.*s is not a libwoffload setting (see `woffload doctor --env`); ignored",
                       len > 64 ? 64 : len, *e);
        }
    }
    out->nerrors = bad;
    return bad;
}

static struct wo_settings settings;
static pthread_once_t settings_once = PTHREAD_ONCE_INIT;

static void settings_init(void)
{
    extern char **environ;
    wo_settings_parse(environ, &settings, NULL, NULL);
    wo_log_set_level(settings.log_level);
}

const struct wo_settings *wo_settings(void)
{
    pthread_once(&settings_once, settings_init);
    return &settings;
}

void wo_settings_print(FILE *f, const struct wo_settings *s)
{
    for (size_t i = 0; i < wo_setting_ndefs; i++) {
        const struct wo_setting_def *d = &wo_setting_defs[i];
        const char *field = (const char *)s + d->offset;
        char cur[256];
        switch (d->type) {
        case WO_SETTING_BOOL: {
            bool b;
            memcpy(&b, field, sizeof(b));
            snprintf(cur, sizeof(cur), "%d", b);
            break;
        }
        case WO_SETTING_LEVEL: {
            int l;
            memcpy(&l, field, sizeof(l));
            snprintf(cur, sizeof(cur), "%s", wo_log_level_to_string(l));
            break;
        }
        case WO_SETTING_PATH: {
            const char *p;
            memcpy(&p, field, sizeof(p));
            snprintf(cur, sizeof(cur), "%s", p ? p : "(unset)");
            break;
        }
        default: {
            uint32_t u;
            memcpy(&u, field, sizeof(u));
            snprintf(cur, sizeof(cur), "%u", u);
            break;
        }
        }
        fprintf(f, "%-22s default %-14s now %-14s %s\n", d->name, *d->def ? d->def : "(unset)", cur,
                d->doc);
    }
}
