/* tools/policy-fit.c: `woffload-policy fit`: the policy the automatic fit
 * would use for a recorded run, written out as explicit rules, and its
 * predicted step time. The names, their bytes and their reads per step come
 * from the trace through the replay (tools/replay.h, the all-on-GPU replay:
 * bytes read per measured step over the name's bytes); the choice is
 * policy/fit.c's; the prediction is woffload-replay's. docs/policy.md, fit. */
#include <errno.h>
#include <fnmatch.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/registry.h"
#include "core/settings.h"
#include "core/trace.h"
#include "policy/policy.h"
#include "tools/policy-fit.h"
#include "tools/replay.h"
#include "uvm/devmodel.h"

#define FIT_SIZE_EXPECTED                                                                          \
    "a size such as 20GiB, 512MiB or 80GB, or a percentage of the device's total memory such as " \
    "90%"

struct fit_args {
    const char *trace, *device, *keep_free, *rest, *model, *base, *out, *context;
};

struct fname {
    const char *name;
    uint64_t bytes;
    bool placeable; /* every tag of it could be placed by the shim */
    bool in_host;   /* backed by host memory the engine allocated itself */
};

static void fit_usage(FILE *f)
{
    fprintf(f, "usage: woffload-policy fit --trace T --device SIZE|PCT%% [--keep-free SIZE]\n"
               "                           [--rest host|managed] [--context SIZE] [--model M]\n"
               "                           [--policy BASE] [-o OUT]\n"
               "Chooses which tensors of a recorded run stay on the device within SIZE (the\n"
               "engine's own device memory included, KEEP-FREE left free), the most read per\n"
               "step first, and prints the policy (YAML) to stdout or OUT; then replays the\n"
               "trace with it and prints the predicted step time to stderr.\n"
               "  --device SIZE   device memory for the engine and its weights: 20GiB, or 90%%\n"
               "                  of the device's total memory (from the device model)\n"
               "  --keep-free S   device memory left free (default 2GiB)\n"
               "  --rest R        where the rest goes: host (default) or managed\n"
               "  --context SIZE  the process's device memory beyond its allocations (CUDA\n"
               "                  contexts, modules), out of SIZE as the shim's fit takes it\n"
               "                  (default: what the trace recorded at seal, its INFO\n"
               "                  context_bytes, measured by NVML; else 0)\n"
               "  --model M       device model file (default: WOFFLOAD_DEVICE_MODEL, else the\n"
               "                  built-in H100)\n"
               "  --policy BASE   keep BASE's rules (first, as written) and its settings\n"
               "  -o OUT          write the policy to OUT instead of stdout\n"
               "Exit status: 0 done, 2 bad input (each message names the option or file).\n");
}

static int bad(const char *fmt, ...) WO_PRINTF(1, 2);
static int bad(const char *fmt, ...)
{
    va_list ap;
    fputs("woffload-policy fit: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 2;
}

/* "90%", "12.5%" -> ppm; 0 or -EINVAL (0% and above 100% included). */
static int parse_pct(const char *s, uint32_t *ppm)
{
    char *end;
    double v;
    size_t n = strlen(s);

    if (n < 2 || s[n - 1] != '%' || !((s[0] >= '0' && s[0] <= '9')))
        return -EINVAL;
    v = strtod(s, &end);
    if (end != s + n - 1 || !(v > 0) || v > 100)
        return -EINVAL;
    *ppm = (uint32_t)llround(v * 10000);
    return *ppm ? 0 : -EINVAL;
}

static int parse_args(int argc, char **argv, struct fit_args *a)
{
    static const struct {
        const char *opt;
        size_t off;
    } opts[] = {
        {"--trace", offsetof(struct fit_args, trace)},
        {"--device", offsetof(struct fit_args, device)},
        {"--keep-free", offsetof(struct fit_args, keep_free)},
        {"--rest", offsetof(struct fit_args, rest)},
        {"--context", offsetof(struct fit_args, context)},
        {"--model", offsetof(struct fit_args, model)},
        {"--policy", offsetof(struct fit_args, base)},
        {"-o", offsetof(struct fit_args, out)},
        {"--output", offsetof(struct fit_args, out)},
    };
    memset(a, 0, sizeof(*a));
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i], *eq = strchr(arg, '=');
        size_t k, len = eq && arg[0] == '-' && arg[1] == '-' ? (size_t)(eq - arg) : strlen(arg);

        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
            fit_usage(stdout);
            return 1;
        }
        for (k = 0; k < WO_ARRAY_SIZE(opts); k++)
            if (strlen(opts[k].opt) == len && strncmp(arg, opts[k].opt, len) == 0)
                break;
        if (k == WO_ARRAY_SIZE(opts)) {
            fit_usage(stderr);
            return bad("unknown argument '%s'", arg);
        }
        if (arg[len] == '=') {
            *(const char **)((char *)a + opts[k].off) = arg + len + 1;
        } else if (i + 1 < argc) {
            *(const char **)((char *)a + opts[k].off) = argv[++i];
        } else {
            return bad("%s needs a value", arg);
        }
    }
    if (!a->trace)
        return bad("--trace T is required (a trace recorded with WOFFLOAD_TRACE or woffload-run --trace)");
    if (!a->device)
        return bad("--device is required: %s", FIT_SIZE_EXPECTED);
    return 0;
}

/* The process's device memory beyond its allocations that comes out of
 * --device as the shim's fit takes it out of its size (uvm/place-fit.c):
 * --context, else the trace's INFO context_bytes (recorded at seal where
 * NVML could tell, docs/trace-format.md), else 0. */
static int context_of(const struct fit_args *a, const struct wo_trace_data *d, uint64_t *ret)
{
    const char *v = a->context ? a->context : wo_trace_data_info(d, "context_bytes");
    char *end;
    int r;

    *ret = 0;
    if (!v)
        return 0;
    if (!a->context) {
        errno = 0;
        *ret = strtoull(v, &end, 10);
        if (errno || end == v || *end)
            return bad("--trace %s: its INFO context_bytes '%s' is not a byte count (give "
                       "--context to set it)",
                       a->trace, v);
        return 0;
    }
    if ((r = wo_parse_size(v, ret)) < 0)
        return bad("--context '%s': found %s, expected a size such as 512MiB or 0", v,
                   r == -ERANGE ? "a size beyond 64 bits" : "no size (unknown unit or malformed)");
    return 0;
}

/* The settings as a struct wo_fit, with a message naming the option. */
static int fit_settings(const struct fit_args *a, struct wo_fit *f)
{
    memset(f, 0, sizeof(*f));
    f->enabled = true;
    f->keep_free = WO_FIT_KEEP_FREE_DEFAULT;
    f->rest = WO_PLACE_HOST;
    /* the shim's rule at seal (WOFFLOAD_FIT_SPREAD) */
    f->in_order = !wo_settings()->fit_spread;
    f->by_layer = wo_settings()->fit_layers;
    if (strchr(a->device, '%')) {
        if (parse_pct(a->device, &f->device.ppm) < 0)
            return bad("--device '%s': found a bad percentage, expected one above 0%% and at most "
                       "100%% such as 90%% or 12.5%%", a->device);
        f->device.kind = WO_BUDGET_PERCENT;
    } else {
        int r = wo_parse_size(a->device, &f->device.bytes);
        if (r < 0)
            return bad("--device '%s': found %s, expected %s", a->device,
                       r == -ERANGE ? "a size beyond 64 bits" : "no size (unknown unit or malformed)",
                       FIT_SIZE_EXPECTED);
        if (!f->device.bytes)
            return bad("--device '%s': found 0, expected more than 0 bytes", a->device);
        f->device.kind = WO_BUDGET_BYTES;
    }
    if (a->keep_free) {
        int r = wo_parse_size(a->keep_free, &f->keep_free);
        if (r < 0)
            return bad("--keep-free '%s': found %s, expected a size such as 2GiB or 512MiB",
                       a->keep_free,
                       r == -ERANGE ? "a size beyond 64 bits" : "no size (unknown unit or malformed)");
    }
    if (f->device.kind == WO_BUDGET_BYTES && f->keep_free >= f->device.bytes) {
        char s1[32], s2[32];
        return bad("--keep-free '%s' (%s) with --device '%s' (%s): expected keep-free below device: "
                   "nothing would be left for the weights",
                   a->keep_free ? a->keep_free : "2GiB", wo_format_size(f->keep_free, s1, sizeof(s1)),
                   a->device, wo_format_size(f->device.bytes, s2, sizeof(s2)));
    }
    if (a->rest) {
        if (strcmp(a->rest, "host") == 0)
            f->rest = WO_PLACE_HOST;
        else if (strcmp(a->rest, "managed") == 0)
            f->rest = WO_PLACE_MANAGED;
        else
            return bad("--rest '%s': expected host or managed", a->rest);
    }
    return 0;
}

/* ---- the trace's names ---- */

static int fname_cmp(const void *pa, const void *pb)
{
    return strcmp(((const struct fname *)pa)->name, ((const struct fname *)pb)->name);
}

static int rname_cmp(const void *pa, const void *pb)
{
    return strcmp(((const struct wo_replay_name *)pa)->name, ((const struct wo_replay_name *)pb)->name);
}

/* Unique names in the trace's order of first tag, with bytes and whether
 * the shim could place them. -ENOMEM or the count. */
static ssize_t trace_names(const struct wo_trace_data *d, struct fname **ret)
{
    struct fname *v = calloc(d->ntags ? d->ntags : 1, sizeof(*v)), *sorted;
    size_t n = 0;

    if (!v)
        return -ENOMEM;
    /* a sorted copy to find names in O(log n) (a model has thousands) */
    sorted = calloc(d->ntags ? d->ntags : 1, sizeof(*sorted));
    if (!sorted) {
        free(v);
        return -ENOMEM;
    }
    for (size_t i = 0; i < d->ntags; i++) {
        const struct wo_trace_tag *t = &d->tags[i];
        const struct wo_trace_range *tr = wo_trace_data_range(d, t->id, t->gen);
        struct fname key = {.name = t->name}, *hit;

        if (!t->name || !t->name[0] || !tr)
            continue;
        /* sorted holds indices into v as the bytes field during the build */
        hit = n ? bsearch(&key, sorted, n, sizeof(*sorted), fname_cmp) : NULL;
        if (!hit) {
            size_t pos = 0;
            v[n] = (struct fname){.name = t->name, .placeable = true};
            while (pos < n && strcmp(sorted[pos].name, t->name) < 0)
                pos++; /* insertion: tags are few enough that this stays cheap */
            memmove(&sorted[pos + 1], &sorted[pos], (n - pos) * sizeof(*sorted));
            sorted[pos] = (struct fname){.name = t->name, .bytes = n};
            hit = &sorted[pos];
            n++;
        }
        {
            struct fname *f = &v[hit->bytes];
            f->bytes += t->size;
            f->placeable &= wo_replay_could_place(t, tr);
            f->in_host |= (tr->flags & WO_RANGE_HOST) != 0;
        }
    }
    free(sorted);
    *ret = v;
    return (ssize_t)n;
}

struct ev {
    uint64_t t;
    int64_t delta;
};

/* by time; frees before allocations at the same time: the peak is what was live at once */
static int ev_cmp(const void *pa, const void *pb)
{
    const struct ev *a = pa, *b = pb;
    if (a->t != b->t)
        return a->t < b->t ? -1 : 1;
    return (a->delta > b->delta) - (a->delta < b->delta);
}

/* Peak live bytes of the device allocations no tag names: the engine's own
 * memory besides the weights (activations, KV cache, workspaces). */
static uint64_t engine_bytes(const struct wo_trace_data *d)
{
    struct ev *e = calloc(2 * d->nranges + 1, sizeof(*e));
    uint8_t *tagged = calloc(d->nranges + 1, 1);
    size_t n = 0;
    int64_t live = 0, peak = 0;

    if (!e || !tagged) {
        free(e);
        free(tagged);
        return 0;
    }
    for (size_t i = 0; i < d->ntags; i++) {
        const struct wo_trace_range *tr = wo_trace_data_range(d, d->tags[i].id, d->tags[i].gen);
        if (tr && d->tags[i].name)
            tagged[tr - d->ranges] = 1;
    }
    for (size_t i = 0; i < d->nranges; i++) {
        const struct wo_trace_range *tr = &d->ranges[i];
        if (tagged[i] || (tr->flags & WO_RANGE_HOST))
            continue;
        e[n++] = (struct ev){tr->t_alloc_ns, (int64_t)tr->size};
        if (tr->t_free_ns)
            e[n++] = (struct ev){tr->t_free_ns, -(int64_t)tr->size};
    }
    qsort(e, n, sizeof(*e), ev_cmp);
    for (size_t i = 0; i < n; i++) {
        live += e[i].delta;
        peak = WO_MAX(peak, live);
    }
    free(e);
    free(tagged);
    return (uint64_t)peak;
}

/* ---- writing the policy ---- */

/* A name as a glob that matches only itself; digit-only components become
 * '*' when templ. */
static void put_glob(FILE *f, const char *name, bool templ)
{
    const char *p = name;
    fputc('"', f);
    while (*p) {
        const char *e = strchr(p, '.');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        bool digits = len && strspn(p, "0123456789") >= len;
        if (templ && digits) {
            fputc('*', f);
        } else {
            for (size_t i = 0; i < len; i++) {
                unsigned char c = (unsigned char)p[i];
                if (c == '*' || c == '?' || c == '[' || c == ']')
                    fprintf(f, "[%c]", c);
                else if (c == '\\')
                    fputs("\\\\\\\\", f); /* fnmatch's escaped backslash, in YAML quotes */
                else if (c == '"')
                    fputs("\\\"", f);
                else if (c == '$')
                    fputs("$$", f);
                else if (c < 0x20 || c == 0x7f)
                    fprintf(f, "\\x%02x", c);
                else
                    fputc(c, f);
            }
        }
        if (!e)
            break;
        fputc('.', f);
        p = e + 1;
    }
    fputc('"', f);
}

static char *glob_of(const char *name, bool templ)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    put_glob(f, name, templ);
    fclose(f);
    if (!buf)
        return NULL;
    /* back to the pattern itself: strip the quotes and YAML escapes (none
     * but the ones put_glob writes) */
    {
        size_t o = 0;
        for (size_t i = 1; i + 1 < len; i++) {
            if (buf[i] == '\\' && i + 2 < len) {
                buf[o++] = buf[++i];
            } else if (buf[i] == '$' && buf[i + 1] == '$') {
                buf[o++] = '$';
                i++;
            } else {
                buf[o++] = buf[i];
            }
        }
        buf[o] = '\0';
    }
    return buf;
}

/* The device rule's patterns: one glob per layer template when every name
 * of the trace it matches went to the device, else the exact names. */
static void put_device_globs(FILE *f, const struct fname *v, const struct wo_fit_item *it, size_t n)
{
    bool *done = calloc(n ? n : 1, sizeof(*done));
    bool first = true;

    for (size_t i = 0; i < n; i++) {
        char *pat;
        bool whole = true;
        size_t count = 0;

        if (it[i].out != WO_PLACE_DEVICE || it[i].fixed != WO_PLACE_UNSET || (done && done[i]))
            continue;
        pat = glob_of(v[i].name, true);
        if (pat && strchr(pat, '*')) {
            for (size_t j = 0; j < n && whole; j++)
                if (fnmatch(pat, v[j].name, 0) == 0) {
                    whole = it[j].out == WO_PLACE_DEVICE && it[j].fixed == WO_PLACE_UNSET;
                    count++;
                }
        } else {
            whole = false;
        }
        fputs(first ? "" : ",", f);
        fputs("\n      ", f);
        first = false;
        if (whole && count > 1) {
            put_glob(f, v[i].name, true);
            for (size_t j = 0; done && j < n; j++)
                if (fnmatch(pat, v[j].name, 0) == 0)
                    done[j] = true;
        } else {
            put_glob(f, v[i].name, false);
        }
        free(pat);
    }
    free(done);
}

static int write_policy(FILE *f, const struct fit_args *a, const struct wo_policy *base,
                        const struct wo_fit *fit, const struct fname *v,
                        const struct wo_fit_item *it, size_t n, uint64_t budget, uint64_t engine,
                        uint64_t context, uint64_t total, bool weighted)
{
    struct wo_policy_globals g = *wo_policy_globals(base);
    uint64_t dev = 0, rest = 0, fixed_dev = 0;
    size_t ndev = 0, nrest = 0, nbase = wo_policy_nrules(base);
    char s1[32], s2[32], s3[32], s4[32], s5[32], s6[32];

    for (size_t i = 0; i < n; i++) {
        if (it[i].out == WO_PLACE_DEVICE) {
            dev += it[i].size;
            ndev++;
            if (it[i].fixed != WO_PLACE_UNSET)
                fixed_dev += it[i].size;
        } else {
            rest += it[i].size;
            nrest++;
        }
    }
    fprintf(f, "# written by: woffload-policy fit --trace %s --device %s%s%s%s%s%s%s%s%s\n",
            a->trace, a->device, a->keep_free ? " --keep-free " : "",
            a->keep_free ? a->keep_free : "", a->rest ? " --rest " : "", a->rest ? a->rest : "",
            a->context ? " --context " : "", a->context ? a->context : "",
            a->base ? " --policy " : "", a->base ? a->base : "");
    fprintf(f,
            "# budget for weights: %s (device %s of %s, less the engine's own %s, %s of it the "
            "process's contexts; %s kept free)\n",
            wo_format_size(budget, s1, sizeof(s1)),
            wo_format_size(wo_budget_resolve(&fit->device, total, 0), s2, sizeof(s2)),
            wo_format_size(total, s3, sizeof(s3)), wo_format_size(engine, s4, sizeof(s4)),
            wo_format_size(context, s6, sizeof(s6)),
            wo_format_size(fit->keep_free, s5, sizeof(s5)));
    fprintf(f, "# on the device: %zu names, %s%s%s%s; offloaded (%s): %zu names, %s\n", ndev,
            wo_format_size(dev, s1, sizeof(s1)), fixed_dev ? " (" : "",
            fixed_dev ? wo_format_size(fixed_dev, s2, sizeof(s2)) : "",
            fixed_dev ? " placed by the base policy or not placeable)" : "",
            wo_placement_to_string(fit->rest), nrest, wo_format_size(rest, s3, sizeof(s3)));
    fprintf(f, "# chosen by %s\n", weighted ? "reads per step in the trace, then the kind of tensor"
                                            : "the kind of tensor (the trace has no repeating step)");
    /* the base's settings; the rest is the default; fit itself is spelled out */
    g.default_place = fit->rest;
    g.fit.enabled = false;
    if (fit->rest == WO_PLACE_MANAGED) {
        /* managed residency counts against the same budget: the prefetcher
         * gets what the weights kept on the device leave of it (a piece at
         * least, so that it can move anything) */
        g.device_budget.kind = WO_BUDGET_BYTES;
        g.device_budget.bytes = WO_MAX(budget > dev ? budget - dev : 0, (uint64_t)WO_PIECE_SIZE_MIN);
        fprintf(f, "# managed ranges prefetched within what is left of the budget: %s\n",
                wo_format_size(g.device_budget.bytes, s1, sizeof(s1)));
    }
    if (g.window.open == WO_WINDOW_OPEN_API && wo_policy_passthrough(base))
        g.window.open = WO_WINDOW_OPEN_AT_START; /* api was only the pass-through default */
    wo_policy_dump_globals(&g, f);
    if (!nbase && !ndev) {
        fputs("rules: []\n", f);
        return ferror(f) ? -EIO : 0;
    }
    fputs("rules:\n", f);
    for (size_t i = 0; i < nbase; i++)
        wo_policy_dump_rule(base, i, f);
    for (size_t i = 0; i < n; i++)
        if (it[i].out == WO_PLACE_DEVICE && it[i].fixed == WO_PLACE_UNSET) {
            fputs("  - name: fit-device\n    glob: [", f);
            put_device_globs(f, v, it, n);
            fputs("]\n    place: device\n", f);
            break;
        }
    return ferror(f) ? -EIO : 0;
}

static const char *ms(double s, char *buf, size_t len)
{
    snprintf(buf, len, "%.3f ms", s * 1e3);
    return buf;
}

/* The predicted step times of one choice (items[].out set): the policy it
 * implies, written as write_policy writes it, loaded and replayed. 0, or a
 * negative errno with err set. */
static int predict(const struct fit_args *a, const struct wo_policy *base, const struct wo_fit *fit,
                   const struct fname *names, const struct wo_fit_item *items, size_t n,
                   uint64_t budget, uint64_t engine, uint64_t total, struct wo_trace_data *d,
                   struct wo_replay_opts o, struct wo_replay_result *res, char *err, size_t errlen)
{
    struct wo_policy *pol = NULL;
    struct wo_diags diags = {0};
    char *text = NULL;
    size_t len = 0;
    FILE *mf = open_memstream(&text, &len);
    int r;

    if (!mf)
        return -ENOMEM;
    /* loaded and replayed, never shown: its header's figures do not matter */
    r = write_policy(mf, a, base, fit, names, items, n, budget, engine, 0, total, true);
    fclose(mf);
    if (r == 0)
        r = wo_policy_load_buffer(text, len, "(a choice)", NULL, &pol, &diags);
    wo_diags_clear(&diags);
    free(text);
    if (r < 0) {
        snprintf(err, errlen, "the choice's policy does not load");
        return r;
    }
    o.all_device = false;
    o.policy = pol;
    r = wo_replay_run(d, &o, res, err, errlen);
    wo_policy_free(pol);
    return r;
}

/* Beside fit's own choice, the others a user would weigh at the same
 * budget, each replayed: fit by the kind of tensor only (no trace
 * weights), fit with its equal values spread by the other unit (tensor
 * by tensor, or whole layers under WOFFLOAD_FIT_LAYERS=0), and the
 * one-line hand policy, experts on the host and the rest on the device
 * (over the budget when the rest does not fit it). */
static void compare_choices(const struct fit_args *a, const struct wo_policy *base,
                            const struct wo_fit *fit, const struct fname *names,
                            const struct wo_fit_item *chosen, size_t n, uint64_t budget,
                            uint64_t engine, uint64_t total, struct wo_trace_data *d,
                            const struct wo_replay_opts *o, double fit_decode, uint64_t fit_dev)
{
    struct wo_fit_item *v = malloc(n * sizeof(*v));
    char err[256], s1[32], s2[32];

    if (!v)
        return;
    fprintf(stderr, "fit: the choices at this budget, replayed (decode step; device bytes):\n");
    fprintf(stderr, "fit:   %-40s %s; %s\n", "by reads per step (this policy)",
            ms(fit_decode, s1, sizeof(s1)), wo_format_size(fit_dev, s2, sizeof(s2)));
    for (int c = 0; c < 3; c++) {
        struct wo_replay_result res = {0};
        struct wo_fit other = *fit;
        uint64_t dev = 0;
        const char *label = c == 0   ? "by the kind of tensor only"
                            : c == 1 ? (fit->by_layer ? "by reads per step, tensor by tensor"
                                                      : "by reads per step, whole layers")
                                     : "experts on the host, the rest device";

        memcpy(v, chosen, n * sizeof(*v));
        if (c == 0) {
            for (size_t i = 0; i < n; i++)
                v[i].weight = -1;
            wo_fit_choose(fit, v, n, budget);
        } else if (c == 1) {
            /* fit's own order, its equal values spread by the other unit
             * (WOFFLOAD_FIT_LAYERS): what the tensors one by one would
             * give, or whole layers off the device */
            if (fit->in_order)
                continue;
            other.by_layer = !fit->by_layer;
            wo_fit_choose(&other, v, n, budget);
        } else {
            for (size_t i = 0; i < n; i++)
                if (v[i].fixed == WO_PLACE_UNSET && v[i].movable)
                    v[i].out = wo_fit_class(v[i].name) == 4 ? WO_PLACE_HOST : WO_PLACE_DEVICE;
        }
        for (size_t i = 0; i < n; i++)
            if (v[i].out == WO_PLACE_DEVICE)
                dev += v[i].size;
        if (predict(a, base, fit, names, v, n, budget, engine, total, d, *o, &res, err,
                    sizeof(err)) < 0) {
            fprintf(stderr, "fit:   %-40s no prediction: %s\n", label, err);
            continue;
        }
        fprintf(stderr, "fit:   %-40s %s; %s%s\n", label, ms(res.decode_step_s, s1, sizeof(s1)),
                wo_format_size(dev, s2, sizeof(s2)), dev > budget ? ", over the budget" : "");
        wo_replay_result_free(&res);
    }
    free(v);
}

int wo_policy_fit_main(int argc, char **argv)
{
    struct fit_args a;
    struct wo_fit fit;
    struct wo_devmodel dm;
    struct wo_trace_data *d = NULL;
    struct wo_policy *base = NULL, *out_pol = NULL;
    struct wo_replay_opts o;
    struct wo_replay_result ref = {0}, res = {0};
    struct fname *names = NULL;
    struct wo_fit_item *items = NULL;
    char err[512], s1[32], s2[32], s3[32];
    char *text = NULL;
    size_t textlen = 0;
    const char *model;
    uint64_t total, engine, budget, resolved, context = 0;
    ssize_t n;
    bool weighted;
    int r, ret = 2;

    r = parse_args(argc, argv, &a);
    if (r)
        return r == 1 ? 0 : 2;
    if (fit_settings(&a, &fit))
        return 2;

    wo_devmodel_default(&dm);
    model = a.model ? a.model : getenv("WOFFLOAD_DEVICE_MODEL");
    if (model && *model && wo_devmodel_load(model, &dm, err, sizeof(err)) < 0)
        return bad("%s %s: %s", a.model ? "--model" : "WOFFLOAD_DEVICE_MODEL", model, err);
    total = dm.device_bytes;
    if (fit.device.kind == WO_BUDGET_BYTES && fit.device.bytes > total)
        return bad("--device '%s': %s is more than the device has (%s, device model '%s'; --model "
                   "names another)",
                   a.device, wo_format_size(fit.device.bytes, s1, sizeof(s1)),
                   wo_format_size(total, s2, sizeof(s2)), dm.name);

    if (a.base) {
        struct wo_diags diags = {0};
        r = wo_policy_load_file(a.base, NULL, &base, &diags);
        wo_diags_print(&diags, stderr);
        wo_diags_clear(&diags);
        if (r < 0)
            return bad("--policy %s: the policy did not load (see above)", a.base);
        if (wo_policy_globals(base)->fit.enabled)
            fprintf(stderr, "woffload-policy fit: note: --policy %s has a fit: key; the options "
                    "given here replace it\n", a.base);
    }

    r = wo_trace_load(a.trace, 0, 0, &d);
    if (r == -EBADMSG) {
        bad("--trace %s: corrupt or truncated at byte offset %llu: %s", a.trace,
            (unsigned long long)d->error_offset, d->error_text);
        goto out;
    }
    if (r < 0) {
        bad("--trace %s: %s", a.trace, strerror(-r));
        goto out;
    }
    n = trace_names(d, &names);
    if (n < 0) {
        bad("out of memory");
        goto out;
    }
    if (n == 0) {
        bad("--trace %s: the trace names no tensors: record it with the Python hook (woffload-run "
            "runs it) or woffload_tag()", a.trace);
        goto out;
    }

    /* reads per step from the all-on-GPU replay */
    memset(&o, 0, sizeof(o));
    o.dm = &dm;
    o.warmup = UINT_MAX;
    o.all_device = true;
    o.no_bound = true;
    r = wo_replay_run(d, &o, &ref, err, sizeof(err));
    if (r == -ENOMEM) {
        bad("out of memory");
        goto out;
    }
    weighted = r == 0;
    if (!weighted) {
        fprintf(stderr, "woffload-policy fit: note: %s: %s; choosing by the kind of tensor only\n",
                a.trace, err);
        memset(&ref, 0, sizeof(ref));
    } else {
        qsort(ref.names, ref.nnames, sizeof(*ref.names), rname_cmp);
    }

    items = calloc((size_t)n, sizeof(*items));
    if (!items) {
        bad("out of memory");
        goto out;
    }
    for (ssize_t i = 0; i < n; i++) {
        struct wo_fit_item *it = &items[i];
        struct wo_replay_name key = {.name = names[i].name}, *rn = NULL;
        struct wo_match m;

        it->name = names[i].name;
        it->size = names[i].bytes;
        /* the engine's own host memory (not the shim's) cannot be moved */
        it->movable = names[i].placeable || !names[i].in_host;
        it->weight = -1;
        if (weighted)
            rn = bsearch(&key, ref.names, ref.nnames, sizeof(*ref.names), rname_cmp);
        if (rn && it->size)
            it->weight = rn->hbm_bytes / (double)it->size;
        else if (weighted)
            it->weight = 0; /* in the trace, never read in the measured steps */
        if (!names[i].placeable)
            it->fixed = names[i].in_host ? WO_PLACE_HOST : WO_PLACE_DEVICE; /* the shim cannot move it */
        else if (base && wo_policy_match(base, it->name, it->size, &m) == 1)
            it->fixed = m.place;
    }
    engine = engine_bytes(d);
    if (context_of(&a, d, &context))
        goto out;
    engine += context;
    resolved = wo_budget_resolve(&fit.device, total, 0);
    budget = wo_fit_budget(&fit, total, total > engine ? total - engine : 0, engine);
    if (resolved <= engine)
        fprintf(stderr,
                "woffload-policy fit: warning: the engine's own device memory in the "
                "trace (%s, with the contexts) takes all of --device %s (%s): every weight goes "
                "%s\n",
                wo_format_size(engine, s1, sizeof(s1)), a.device,
                wo_format_size(resolved, s2, sizeof(s2)), wo_placement_to_string(fit.rest));
    wo_fit_choose(&fit, items, (size_t)n, budget);

    {
        FILE *mf = open_memstream(&text, &textlen);
        if (!mf || write_policy(mf, &a, base, &fit, names, items, (size_t)n, budget, engine,
                                context, total, weighted) < 0) {
            if (mf)
                fclose(mf);
            bad("out of memory");
            goto out;
        }
        fclose(mf);
    }
    /* what was written must load: the same loader as the shim's */
    {
        struct wo_diags diags = {0};
        r = wo_policy_load_buffer(text, textlen, "(fit policy)", NULL, &out_pol, &diags);
        wo_diags_print(&diags, stderr);
        wo_diags_clear(&diags);
        if (r < 0) {
            bad("internal error: the policy written does not load");
            goto out;
        }
    }
    if (a.out) {
        FILE *of = fopen(a.out, "w");
        if (!of) {
            bad("-o %s: %s", a.out, strerror(errno));
            goto out;
        }
        fwrite(text, 1, textlen, of);
        if (fclose(of) != 0) {
            bad("-o %s: write failed", a.out);
            goto out;
        }
    } else {
        fwrite(text, 1, textlen, stdout);
        fflush(stdout);
    }

    /* the prediction: woffload-replay's, with the policy written */
    {
        uint64_t dev = 0, off = 0;
        char s4[32];

        for (ssize_t i = 0; i < n; i++)
            *(items[i].out == WO_PLACE_DEVICE ? &dev : &off) += items[i].size;
        fprintf(stderr,
                "fit: budget %s for weights (device %s less the engine's own %s, %s of "
                "it the process's contexts%s, %s kept free)\n",
                wo_format_size(budget, s1, sizeof(s1)), wo_format_size(resolved, s2, sizeof(s2)),
                wo_format_size(engine, s3, sizeof(s3)), wo_format_size(context, s4, sizeof(s4)),
                a.context                                ? ": --context"
                : wo_trace_data_info(d, "context_bytes") ? ": the trace's"
                                                         : ": none recorded",
                wo_format_size(fit.keep_free, err, sizeof(err)));
        fprintf(stderr, "fit: on the device %s, offloaded (%s) %s\n", wo_format_size(dev, s1, sizeof(s1)),
                wo_placement_to_string(fit.rest), wo_format_size(off, s2, sizeof(s2)));
        if (!weighted) {
            ret = 0;
            goto out;
        }
        o.all_device = false;
        o.policy = out_pol;
        r = wo_replay_run(d, &o, &res, err, sizeof(err));
        if (r < 0) {
            fprintf(stderr, "fit: no prediction: %s\n", r == -ENOMEM ? "out of memory" : err);
            ret = 0;
            goto out;
        }
        fprintf(stderr, "fit: predicted step time %s (decode step %s); all on GPU %s (decode %s)\n",
                ms(res.step_s, s1, sizeof(s1)), ms(res.decode_step_s, s2, sizeof(s2)),
                ms(ref.step_s, s3, sizeof(s3)), ms(ref.decode_step_s, err, sizeof(err)));
        fprintf(stderr, "fit: offloaded-bytes bound: %s a step (%s over PCIe at %.1f GB/s, the "
                "device model's copy bandwidth)\n",
                ms((double)off / (dm.h2d_gbs * 1e9), s1, sizeof(s1)),
                wo_format_size(off, s2, sizeof(s2)), dm.h2d_gbs);
        compare_choices(&a, base, &fit, names, items, (size_t)n, budget, engine, total, d, &o,
                        res.decode_step_s, dev);
        ret = 0;
    }
out:
    wo_replay_result_free(&ref);
    wo_replay_result_free(&res);
    free(items);
    free(names);
    free(text);
    wo_policy_free(out_pol);
    wo_policy_free(base);
    wo_trace_data_free(d);
    return ret;
}
