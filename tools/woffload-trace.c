/* tools/woffload-trace.c: look at a recorded trace (WOFFLOAD_TRACE).
 *
 *   woffload-trace summary TRACE            machine, counts, names by bytes and
 *                                           by launches, step period, duration
 *   woffload-trace validate TRACE           exit 0 when intact, 2 with the offset
 *   woffload-trace export-chrome TRACE OUT  Chrome trace event JSON for Perfetto
 *
 * Reads through core/trace.h's loader, so a corrupt or truncated trace gives
 * the reader's error (offset and what was expected) and never a crash. A
 * gzip-compressed trace (.wot.gz) is read as it is. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/trace.h"
#include "wo-config.h"

/* 0 success, 2 usage or input errors (a missing, corrupt or truncated trace),
 * 1 failure (out of memory, an output that cannot be written): every tool's. */
enum { EXIT_FAIL = 1, EXIT_USAGE = 2, EXIT_INVALID = 2 };

/* Traces bigger than this many events are refused rather than exhausting
 * memory (each loaded event takes ~270 bytes). */
#define MAX_EVENTS (UINT64_C(10) * 1000 * 1000)

static void usage(FILE *f)
{
    fprintf(f,
            "usage: woffload-trace COMMAND [OPTIONS] TRACE ...\n"
            "\n"
            "Commands:\n"
            "  summary [--top N] TRACE     the machine and versions, counts by type, names by\n"
            "                              bytes and by launches touching them, the decode step\n"
            "                              period found in the launch sequence, duration\n"
            "  validate [--allow-partial] TRACE\n"
            "                              check every record; exit 0 when intact, 2 with the\n"
            "                              offset of the first problem. --allow-partial accepts\n"
            "                              a trace without footer (the recording process died)\n"
            "  export-chrome TRACE OUT.json\n"
            "                              Chrome trace event format (open in ui.perfetto.dev):\n"
            "                              launches and copies per stream, allocations,\n"
            "                              placements, prefetches and evictions, memory counters\n"
            "\n"
            "TRACE may be gzip-compressed (.wot.gz): it is read as it is.\n"
            "Options: -h, --help; --version.\n"
            "Exit status: 0 success; 2 usage or input error (a missing, corrupt or truncated\n"
            "trace); 1 failure (out of memory, an output that cannot be written).\n"
            "The format: docs/trace-format.md.\n");
}

static const char *human(uint64_t b, char *buf, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    unsigned u = 0;

    while (v >= 1024 && u + 1 < WO_ARRAY_SIZE(units)) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%" PRIu64 " B", b);
    else
        snprintf(buf, len, "%.1f %s", v, units[u]);
    return buf;
}

/* Loads path; prints the reader's error. Returns 0, or EXIT_INVALID with *ret
 * holding what was read before the problem, or NULL when nothing was. */
static int load(const char *path, unsigned flags, struct wo_trace_data **ret)
{
    int e = wo_trace_load(path, flags, MAX_EVENTS, ret);

    if (e == 0)
        return 0;
    if (!*ret || (e != -EBADMSG && e != -E2BIG)) {
        fprintf(stderr, "woffload-trace: %s: %s\n", path, strerror(-e));
        wo_trace_data_free(*ret);
        *ret = NULL;
        return EXIT_INVALID;
    }
    fprintf(stderr, "woffload-trace: %s: %s\n", path, (*ret)->error_text);
    return EXIT_INVALID;
}

/* ---- attribution of launches to tags -------------------------------------------- */

struct tagref {
    uint32_t id, gen;
    uint64_t offset, end;
    size_t tag; /* index into d->tags */
};

static int cmp_tagref(const void *a, const void *b)
{
    const struct tagref *x = a, *y = b;
    if (x->id != y->id)
        return x->id < y->id ? -1 : 1;
    if (x->gen != y->gen)
        return x->gen < y->gen ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

struct attr {
    struct tagref *refs;
    size_t nrefs;
    uint64_t *tag_launches; /* per tag */
    uint64_t untagged_launches;
    uint64_t unknown_hits; /* hits on ranges the trace has no alloc for */
};

/* Calls fn for each tag overlapping [off, hi) of range (id, gen). */
static size_t tags_hit(const struct attr *a, uint32_t id, uint32_t gen, uint64_t off, uint64_t hi,
                       size_t *out, size_t max)
{
    size_t lo = 0, h = a->nrefs, n = 0;

    while (lo < h) {
        size_t mid = lo + (h - lo) / 2;
        const struct tagref *r = &a->refs[mid];
        if (r->id < id || (r->id == id && r->gen < gen))
            lo = mid + 1;
        else
            h = mid;
    }
    for (; lo < a->nrefs && a->refs[lo].id == id && a->refs[lo].gen == gen; lo++) {
        const struct tagref *r = &a->refs[lo];
        if (r->offset >= hi)
            break;
        if (r->end > off && n < max)
            out[n++] = r->tag;
    }
    return n;
}

static int attribute(const struct wo_trace_data *d, struct attr *a)
{
    memset(a, 0, sizeof(*a));
    a->refs = calloc(d->ntags + 1, sizeof(*a->refs));
    a->tag_launches = calloc(d->ntags + 1, sizeof(uint64_t));
    if (!a->refs || !a->tag_launches)
        return -ENOMEM;
    for (size_t i = 0; i < d->ntags; i++) {
        const struct wo_trace_tag *t = &d->tags[i];
        if (t->id == WO_TRACE_NO_ID)
            continue;
        a->refs[a->nrefs++] = (struct tagref){t->id, t->gen, t->offset,
                                              t->offset + t->size < t->offset ? UINT64_MAX
                                                                              : t->offset + t->size,
                                              i};
    }
    qsort(a->refs, a->nrefs, sizeof(*a->refs), cmp_tagref);
    for (size_t i = 0; i < d->nevents; i++) {
        const struct wo_event *ev = &d->events[i].ev;
        size_t hit[64], n = 0;
        if (ev->type != WO_EV_LAUNCH)
            continue;
        for (unsigned h = 0; h < ev->nhits && h < WO_EV_MAX_HITS; h++) {
            const struct wo_ev_hit *x = &ev->l.hits[h];
            size_t got;
            if (!wo_trace_data_range(d, x->id, x->gen))
                a->unknown_hits++;
            got = tags_hit(a, x->id, x->gen, x->offset, x->hi > x->offset ? x->hi : x->offset + 1,
                           hit + n, WO_ARRAY_SIZE(hit) - n);
            n += got;
        }
        /* a launch counts once per tag, however many of its pointers hit it */
        for (size_t k = 0; k < n; k++) {
            int dup = 0;
            for (size_t j = 0; j < k && !dup; j++)
                dup = hit[j] == hit[k];
            if (!dup)
                a->tag_launches[hit[k]]++;
        }
        a->untagged_launches += n == 0;
    }
    return 0;
}

static void attr_free(struct attr *a)
{
    free(a->refs);
    free(a->tag_launches);
}

/* ---- names by bytes and launches ------------------------------------------------- */

struct name_row {
    char *name; /* owned */
    uint64_t bytes, launches, count;
    unsigned placement;
};

static int cmp_row_name(const void *a, const void *b)
{
    return strcmp(((const struct name_row *)a)->name, ((const struct name_row *)b)->name);
}

static int cmp_row_bytes(const void *a, const void *b)
{
    const struct name_row *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_row_launches(const void *a, const void *b)
{
    const struct name_row *x = a, *y = b;
    if (x->launches != y->launches)
        return x->launches > y->launches ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* "model.layers.12.mlp.experts.3.w2" -> "model.layers.*.mlp.experts.*.w2" */
static char *fold_digits(const char *s)
{
    size_t n = strlen(s);
    char *o = malloc(n + 1), *w = o;

    if (!o)
        return NULL;
    for (size_t i = 0; i < n;) {
        if (s[i] >= '0' && s[i] <= '9' && (i == 0 || s[i - 1] == '.')) {
            size_t j = i;
            while (j < n && s[j] >= '0' && s[j] <= '9')
                j++;
            if (j == n || s[j] == '.') {
                *w++ = '*';
                i = j;
                continue;
            }
        }
        *w++ = s[i++];
    }
    *w = '\0';
    return o;
}

/* Rows per distinct name (fold: per digit-folded group); merges duplicates. */
static size_t name_rows(const struct wo_trace_data *d, const struct attr *a, int fold,
                        struct name_row **ret)
{
    struct name_row *rows = calloc(d->ntags + 1, sizeof(*rows));
    size_t n = 0, w = 0;

    *ret = rows;
    if (!rows)
        return 0;
    for (size_t i = 0; i < d->ntags; i++) {
        char *nm = fold ? fold_digits(d->tags[i].name) : strdup(d->tags[i].name);
        if (!nm)
            continue;
        rows[n++] = (struct name_row){nm, d->tags[i].size, a->tag_launches[i], 1,
                                      d->tags[i].placement};
    }
    qsort(rows, n, sizeof(*rows), cmp_row_name);
    for (size_t i = 0; i < n; i++) {
        if (w && strcmp(rows[w - 1].name, rows[i].name) == 0) {
            rows[w - 1].bytes += rows[i].bytes;
            rows[w - 1].launches += rows[i].launches;
            rows[w - 1].count++;
            if (rows[w - 1].placement != rows[i].placement)
                rows[w - 1].placement = WO_TRACE_PLACE_UNKNOWN; /* mixed */
            free(rows[i].name);
            continue;
        }
        rows[w++] = rows[i];
    }
    return w;
}

static void rows_free(struct name_row *rows, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(rows[i].name);
    free(rows);
}

static void print_rows(const char *title, struct name_row *rows, size_t n, size_t top,
                       int (*cmp)(const void *, const void *), int groups)
{
    char hb[32];

    qsort(rows, n, sizeof(*rows), cmp);
    printf("\n%s (%zu%s):\n", title, n, n > top ? ", the first shown" : "");
    printf("  %12s %10s %s %-8s %s\n", "bytes", "launches", groups ? "   tags" : "", "place", "name");
    for (size_t i = 0; i < n && i < top; i++) {
        if (groups)
            printf("  %12s %10" PRIu64 " %6" PRIu64 " %-8s %s\n", human(rows[i].bytes, hb, sizeof(hb)),
                   rows[i].launches, rows[i].count,
                   rows[i].placement ? wo_trace_place_name(rows[i].placement) : "mixed", rows[i].name);
        else
            printf("  %12s %10" PRIu64 " %-8s %s\n", human(rows[i].bytes, hb, sizeof(hb)),
                   rows[i].launches, wo_trace_place_name(rows[i].placement), rows[i].name);
    }
}

/* ---- the step period --------------------------------------------------------------- */

struct period {
    size_t launches; /* 0: none found */
    double score;    /* fraction of launches equal to the one a period later */
    size_t window;   /* launches examined */
    uint64_t step_ns; /* median time of one period */
};

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_func(const void *a, const void *b)
{
    return cmp_u64(a, b);
}

/* Decode steps repeat the same kernels in the same order (the experts they
 * read change, the kernels do not), so the kernel sequence autocorrelates at
 * the step length. Sub-periods (one layer) score a little lower because the
 * step's first and last kernels break them; multiples score the same, so the
 * smallest lag scoring as well as the best is taken. Only the last launches
 * are examined: a prefill or warm-up at the start is not a decode step. */
static struct period step_period(const struct wo_trace_data *d)
{
    struct period p = {0};
    size_t nl = 0, n, start, maxlag;
    uint64_t *funcs = NULL, *t = NULL, *sorted = NULL;
    uint32_t *seq = NULL;
    double *score = NULL, best = 0;
    size_t best_lag = 0;

    for (size_t i = 0; i < d->nevents; i++)
        nl += d->events[i].ev.type == WO_EV_LAUNCH;
    if (nl < 8)
        return p;
    n = nl < 24000 ? nl : 24000;
    start = nl - n;
    funcs = malloc(n * sizeof(*funcs));
    sorted = malloc(n * sizeof(*sorted));
    t = malloc(n * sizeof(*t));
    seq = malloc(n * sizeof(*seq));
    maxlag = n / 2;
    score = calloc(maxlag + 1, sizeof(*score));
    if (!funcs || !sorted || !t || !seq || !score)
        goto out;
    for (size_t i = 0, k = 0; i < d->nevents; i++) {
        const struct wo_event *ev = &d->events[i].ev;
        if (ev->type != WO_EV_LAUNCH)
            continue;
        if (k >= start) {
            funcs[k - start] = ev->l.func;
            t[k - start] = ev->t_ns;
        }
        k++;
    }
    /* dense kernel ids: compare small integers below */
    memcpy(sorted, funcs, n * sizeof(*sorted));
    qsort(sorted, n, sizeof(*sorted), cmp_func);
    for (size_t i = 0; i < n; i++) {
        uint64_t *f = bsearch(&funcs[i], sorted, n, sizeof(*sorted), cmp_func);
        seq[i] = (uint32_t)(f - sorted);
    }
    for (size_t lag = 1; lag <= maxlag; lag++) {
        size_t same = 0;
        for (size_t i = 0; i + lag < n; i++)
            same += seq[i] == seq[i + lag];
        score[lag] = (double)same / (double)(n - lag);
        if (score[lag] > best + 1e-9) {
            best = score[lag];
            best_lag = lag;
        }
    }
    if (best < 0.6)
        goto out;
    for (size_t dv = 1; dv < best_lag; dv++)
        if (best_lag % dv == 0 && score[dv] >= best - 0.001) {
            best_lag = dv;
            break;
        }
    p.launches = best_lag;
    p.score = score[best_lag];
    p.window = n;
    {
        size_t m = 0;
        for (size_t i = 0; i + best_lag < n; i++)
            sorted[m++] = t[i + best_lag] - t[i];
        qsort(sorted, m, sizeof(*sorted), cmp_u64);
        p.step_ns = m ? sorted[m / 2] : 0;
    }
out:
    free(funcs);
    free(sorted);
    free(t);
    free(seq);
    free(score);
    return p;
}

/* ---- summary ------------------------------------------------------------------------ */

static const char *tag_of(const struct wo_trace_data *d, const struct attr *a, uint32_t id, uint32_t gen,
                          uint64_t off)
{
    size_t t;
    if (tags_hit(a, id, gen, off, off + 1, &t, 1) == 1)
        return d->tags[t].name;
    return NULL;
}

/* Picked staging by expert tensor (the last PICKS record: cumulative), in
 * the order the tensors were first registered: a layer's bytes moved a
 * step and of them those over the link (not from its hot experts), the
 * share of experts a copy moved, the experts held hot and the share of
 * rows taken from them, the launches that found it resident, and in all the
 * share of the rows over the link that the copy engine moved
 * (docs/picks.md, "Picked experts", "Hot experts"). */
static void print_picks(const struct wo_trace_data *d, const struct attr *a)
{
    uint64_t moved = 0, whole = 0, hot_rows = 0, rows = 0, engine_rows = 0;
    char hb[32], lb[32];

    if (!d->npicks)
        return;
    printf("\npicked experts (%zu tensors, figures at %.3f s):\n", d->npicks,
           d->nevents ? (double)(d->picks_t_ns - d->events[0].ev.t_ns) / 1e9 : 0.0);
    printf("  %-48s %7s %13s %14s %14s %7s %4s %7s %9s\n", "tensor", "experts", "registrations",
           "moved a step", "over the link", "picked", "hot", "hot hit", "resident");
    for (size_t i = 0; i < d->npicks; i++) {
        const struct wo_trace_pick *p = &d->picks[i];
        const char *name = tag_of(d, a, p->id, p->gen, p->offset);

        printf("  %-48s %7u %13" PRIu64 " %14s %14s %6.1f%% %4u %6.1f%% %8.1f%%\n",
               name ? name : "(untagged)", p->n_experts, p->regs,
               human(wo_trace_pick_per_reg(p), hb, sizeof(hb)),
               human(wo_trace_pick_linked_per_reg(p), lb, sizeof(lb)),
               100 * wo_trace_pick_picked(p), p->hot, 100 * wo_trace_pick_hot_rate(p),
               100 * wo_trace_pick_resident(p));
        moved += wo_trace_pick_copied(p);
        whole += p->staged * p->bytes;
        rows += p->rows;
        hot_rows += p->hot_rows;
        engine_rows += p->engine_rows;
    }
    printf("  moved %s", human(moved, hb, sizeof(hb)));
    printf(" in all, %.0f%% of what copying whole tensors would have moved",
           whole ? 100.0 * (double)moved / (double)whole : 0.0);
    if (hot_rows)
        printf("; %.0f%% of the rows from hot experts on the device",
               100.0 * (double)hot_rows / (double)rows);
    if (engine_rows)
        printf("; %.0f%% of the rows over the link moved by the copy engine",
               100.0 * (double)engine_rows / (double)(rows - hot_rows));
    printf("\n");
}

static int cmd_summary(int argc, char **argv)
{
    static const struct option opts[] = {{"top", required_argument, NULL, 't'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    struct wo_trace_data *d = NULL;
    struct attr a;
    struct name_row *rows = NULL;
    size_t top = 15, nrows;
    uint64_t count[WO_EV_MAX] = {0}, t0 = UINT64_MAX, t1 = 0, range_bytes = 0, tag_bytes = 0;
    uint64_t copy_bytes[6] = {0}, prefetch_bytes = 0, evict_bytes = 0;
    int c, rc;
    char hb[32];
    struct stat st;
    struct period per;

    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 't': {
            char *end;
            unsigned long v = strtoul(optarg, &end, 10);
            if (*end || v == 0 || v > 100000) {
                fprintf(stderr, "woffload-trace: --top wants a number from 1 to 100000\n");
                return EXIT_USAGE;
            }
            top = v;
            break;
        }
        case 'h':
            usage(stdout);
            return 0;
        default:
            return EXIT_USAGE;
        }
    }
    if (optind + 1 != argc) {
        fprintf(stderr, "usage: woffload-trace summary [--top N] TRACE\n");
        return EXIT_USAGE;
    }
    rc = load(argv[optind], 0, &d);
    if (!d)
        return rc;

    printf("trace: %s", argv[optind]);
    if (stat(argv[optind], &st) == 0)
        printf(" (%s)", human((uint64_t)st.st_size, hb, sizeof(hb)));
    printf(", format %u.%u%s\n", d->version_major, d->version_minor,
           d->has_footer ? "" : ", no footer (the recording did not finish)");
    if (rc)
        printf("CORRUPT: %s\n  (what follows is what precedes that offset)\n", d->error_text);
    /* every header/info entry but the clock bookkeeping, last value of a key */
    for (size_t i = 0; i < d->ninfo; i++) {
        static const char *const skip[] = {"format", "clock", "start_realtime_ns", "start_monotonic_ns"};
        const char *k = d->info_keys[i];
        int hide = 0;
        for (size_t j = 0; j < WO_ARRAY_SIZE(skip) && !hide; j++)
            hide = strcmp(k, skip[j]) == 0;
        for (size_t j = i + 1; j < d->ninfo && !hide; j++)
            hide = strcmp(k, d->info_keys[j]) == 0; /* a later entry overrides */
        if (!hide)
            printf("  %-22s %s\n", k, d->info_values[i]);
    }
    for (size_t i = 0; i < d->nevents; i++) {
        const struct wo_event *ev = &d->events[i].ev;
        count[ev->type < WO_EV_MAX ? ev->type : 0]++;
        if (ev->t_ns < t0)
            t0 = ev->t_ns;
        if (ev->t_ns > t1)
            t1 = ev->t_ns;
        if (ev->type == WO_EV_COPY && ev->c.kind < WO_ARRAY_SIZE(copy_bytes))
            copy_bytes[ev->c.kind] += ev->c.bytes;
        if (ev->type == WO_EV_PREFETCH)
            prefetch_bytes += ev->p.bytes;
        if (ev->type == WO_EV_EVICT)
            evict_bytes += ev->p.bytes;
    }
    for (size_t i = 0; i < d->nranges; i++)
        range_bytes += d->ranges[i].size;
    for (size_t i = 0; i < d->ntags; i++)
        tag_bytes += d->tags[i].size;

    printf("\nduration: %.3f s (first to last event), %zu events",
           d->nevents ? (double)(t1 - t0) / 1e9 : 0.0, d->nevents);
    if (d->has_footer && d->footer.ring_dropped)
        printf(", %" PRIu64 " DROPPED by a full event ring (raise WOFFLOAD_RING_EVENTS)",
               d->footer.ring_dropped);
    printf("\nevents by type:\n");
    for (unsigned i = 1; i < WO_EV_MAX; i++)
        if (count[i])
            printf("  %-18s %10" PRIu64 "\n", wo_ev_type_name(i), count[i]);
    printf("kernels named: %zu; allocations: %zu (%s)", d->nkernels, d->nranges,
           human(range_bytes, hb, sizeof(hb)));
    printf("; tags: %zu (%s); policy rules: %zu\n", d->ntags, human(tag_bytes, hb, sizeof(hb)),
           d->nrules);
    if (copy_bytes[WO_COPY_H2D] || copy_bytes[WO_COPY_D2H]) {
        printf("copies: H2D %s", human(copy_bytes[WO_COPY_H2D], hb, sizeof(hb)));
        printf(", D2H %s\n", human(copy_bytes[WO_COPY_D2H], hb, sizeof(hb)));
    }
    if (prefetch_bytes || evict_bytes) {
        printf("prefetched %s", human(prefetch_bytes, hb, sizeof(hb)));
        printf(", evicted %s", human(evict_bytes, hb, sizeof(hb)));
        /* moved per step (the planner's step events): a steady state with
         * a stable hot set moves next to nothing (docs/prefetch.md) */
        if (count[WO_EV_STEP]) {
            printf("; per step (%" PRIu64 " steps) in %s", count[WO_EV_STEP],
                   human(prefetch_bytes / count[WO_EV_STEP], hb, sizeof(hb)));
            printf(", out %s", human(evict_bytes / count[WO_EV_STEP], hb, sizeof(hb)));
        }
        printf("\n");
    }

    if (attribute(d, &a) < 0) {
        fprintf(stderr, "woffload-trace: out of memory\n");
        attr_free(&a);
        wo_trace_data_free(d);
        return EXIT_FAIL;
    }
    nrows = name_rows(d, &a, 0, &rows);
    print_rows("names by bytes", rows, nrows, top, cmp_row_bytes, 0);
    print_rows("names by launches touching them", rows, nrows, top, cmp_row_launches, 0);
    rows_free(rows, nrows);
    nrows = name_rows(d, &a, 1, &rows);
    print_rows("name groups (numbers folded to *) by bytes", rows, nrows, top, cmp_row_bytes, 1);
    rows_free(rows, nrows);
    printf("launches touching no tagged memory: %" PRIu64, a.untagged_launches);
    if (a.unknown_hits)
        printf("; hits on ranges without an alloc record (allocated before recording began, or freed before the recorder saw them): %" PRIu64, a.unknown_hits);
    printf("\n");
    print_picks(d, &a);
    attr_free(&a);

    per = step_period(d);
    if (per.launches)
        printf("\nstep period: %zu launches (%.1f%% of the last %zu launches repeat at that lag), "
               "median step %.3f ms (%.1f steps/s)\n",
               per.launches, per.score * 100, per.window, (double)per.step_ns / 1e6,
               per.step_ns ? 1e9 / (double)per.step_ns : 0.0);
    else
        printf("\nstep period: none found (no repeating launch sequence)\n");
    {
        /* Decode reads each token back: a sync per step. A second estimate of
         * the step time, useful when the launch sequence varies (batching). */
        uint64_t *gaps = calloc(count[WO_EV_SYNC] + 1, sizeof(*gaps)), last = 0;
        size_t ng = 0;
        for (size_t i = 0; gaps && i < d->nevents; i++) {
            const struct wo_event *ev = &d->events[i].ev;
            if (ev->type != WO_EV_SYNC)
                continue;
            if (last && ev->t_ns >= last)
                gaps[ng++] = ev->t_ns - last;
            last = ev->t_ns;
        }
        if (ng) {
            qsort(gaps, ng, sizeof(*gaps), cmp_u64);
            printf("syncs: %" PRIu64 ", median interval %.3f ms\n", count[WO_EV_SYNC],
                   (double)gaps[ng / 2] / 1e6);
        }
        free(gaps);
    }
    wo_trace_data_free(d);
    return rc;
}

/* ---- validate ---------------------------------------------------------------------- */

static int cmd_validate(int argc, char **argv)
{
    static const struct option opts[] = {{"allow-partial", no_argument, NULL, 'p'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    struct wo_trace_reader *r;
    struct wo_trace_rec rec;
    unsigned flags = WO_TRACE_STRICT, major = 0, minor = 0;
    uint64_t nrec = 0, nev = 0;
    int c, e;

    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'p':
            flags &= ~(unsigned)WO_TRACE_STRICT;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            return EXIT_USAGE;
        }
    }
    if (optind + 1 != argc) {
        fprintf(stderr, "usage: woffload-trace validate [--allow-partial] TRACE\n");
        return EXIT_USAGE;
    }
    e = wo_trace_reader_open(argv[optind], flags, &r);
    if (!r) {
        fprintf(stderr, "woffload-trace: %s: %s\n", argv[optind], strerror(-e));
        return EXIT_USAGE;
    }
    if (e == 0) {
        wo_trace_reader_version(r, &major, &minor);
        while ((e = wo_trace_next(r, &rec)) > 0) {
            nrec++;
            nev += rec.type == WO_TREC_EVENT;
        }
    }
    if (e < 0) {
        printf("%s: invalid: %s\n", argv[optind], wo_trace_reader_error(r));
        wo_trace_reader_close(r);
        return e == -EBADMSG ? EXIT_INVALID : EXIT_USAGE;
    }
    printf("%s: valid: format %u.%u, %" PRIu64 " records, %" PRIu64 " events, %s\n", argv[optind],
           major, minor, nrec, nev, wo_trace_reader_has_footer(r) ? "footer counts match" : "no footer");
    wo_trace_reader_close(r);
    return 0;
}

/* ---- export-chrome ------------------------------------------------------------------ */

static void json_esc(FILE *f, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20 || *p >= 0x7f)
            /* kernel names are ASCII; anything else is escaped so the file
             * stays valid JSON whatever bytes a name held */
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
}

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    json_esc(f, s);
    fputc('"', f);
}

enum { TID_MEMORY = 1, TID_UVM = 2, TID_STREAM0 = 10 };

struct streams {
    uint64_t *ids;
    size_t n, cap;
};

static int stream_tid(struct streams *s, uint64_t stream)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->ids[i] == stream)
            return TID_STREAM0 + (int)i;
    if (s->n == s->cap) {
        size_t ncap = s->cap ? s->cap * 2 : 16;
        uint64_t *n = realloc(s->ids, ncap * sizeof(*n));
        if (!n)
            return TID_STREAM0; /* out of memory: fold into the first track */
        s->ids = n;
        s->cap = ncap;
    }
    s->ids[s->n] = stream;
    return TID_STREAM0 + (int)s->n++;
}

static void ev_head(FILE *f, int *first, const char *ph, double ts, int pid, int tid)
{
    fprintf(f, "%s\n{\"ph\":\"%s\",\"ts\":%.3f,\"pid\":%d,\"tid\":%d,", *first ? "" : ",", ph, ts, pid,
            tid);
    *first = 0;
}

static int cmd_export_chrome(int argc, char **argv)
{
    struct wo_trace_data *d = NULL;
    struct attr a;
    struct streams st = {0};
    FILE *f;
    int rc, first = 1, pid;
    uint64_t t0 = UINT64_MAX, live = 0, placeable = 0;
    const char *v;
    char hb[32];

    if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
        usage(stdout);
        return 0;
    }
    if (argc != 3) {
        fprintf(stderr, "usage: woffload-trace export-chrome TRACE OUT.json\n");
        return EXIT_USAGE;
    }
    rc = load(argv[1], 0, &d);
    if (!d)
        return rc;
    if (attribute(d, &a) < 0) {
        fprintf(stderr, "woffload-trace: out of memory\n");
        attr_free(&a);
        wo_trace_data_free(d);
        return EXIT_FAIL;
    }
    f = strcmp(argv[2], "-") == 0 ? stdout : fopen(argv[2], "w");
    if (!f) {
        fprintf(stderr, "woffload-trace: %s: %s\n", argv[2], strerror(errno));
        attr_free(&a);
        wo_trace_data_free(d);
        return EXIT_FAIL;
    }
    v = wo_trace_data_info(d, "pid");
    pid = v ? atoi(v) : 1;
    for (size_t i = 0; i < d->nevents; i++)
        if (d->events[i].ev.t_ns < t0)
            t0 = d->events[i].ev.t_ns;

    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{");
    for (size_t i = 0; i < d->ninfo; i++) {
        fprintf(f, "%s", i ? "," : "");
        json_str(f, d->info_keys[i]);
        fputc(':', f);
        json_str(f, d->info_values[i]);
    }
    fprintf(f, "},\"traceEvents\":[");
    ev_head(f, &first, "M", 0, pid, 0);
    fprintf(f, "\"name\":\"process_name\",\"args\":{\"name\":");
    v = wo_trace_data_info(d, "cmdline");
    json_str(f, v && *v ? v : "libwoffload trace");
    fprintf(f, "}}");
    ev_head(f, &first, "M", 0, pid, TID_MEMORY);
    fprintf(f, "\"name\":\"thread_name\",\"args\":{\"name\":\"memory (alloc, free, tag, place)\"}}");
    ev_head(f, &first, "M", 0, pid, TID_UVM);
    fprintf(f, "\"name\":\"thread_name\",\"args\":{\"name\":\"uvm (prefetch, evict)\"}}");

    for (size_t i = 0; i < d->nevents; i++) {
        const struct wo_trace_ev *te = &d->events[i];
        const struct wo_event *ev = &te->ev;
        double ts = (double)(ev->t_ns - t0) / 1e3;
        int tid;

        switch (ev->type) {
        case WO_EV_LAUNCH: {
            const char *k = wo_trace_data_kernel(d, ev->l.func);
            char fb[32];
            tid = stream_tid(&st, ev->stream);
            if (!k) {
                snprintf(fb, sizeof(fb), "func 0x%" PRIx64, ev->l.func);
                k = fb;
            }
            ev_head(f, &first, "i", ts, pid, tid);
            fprintf(f, "\"s\":\"t\",\"cat\":\"launch\",\"name\":");
            json_str(f, k);
            fprintf(f, ",\"args\":{\"grid\":\"%ux%ux%u\",\"block\":\"%ux%ux%u\"", ev->l.grid[0],
                    ev->l.grid[1], ev->l.grid[2], ev->l.block[0], ev->l.block[1], ev->l.block[2]);
            for (unsigned h = 0; h < ev->nhits && h < WO_EV_MAX_HITS; h++) {
                const char *tn = tag_of(d, &a, ev->l.hits[h].id, ev->l.hits[h].gen, ev->l.hits[h].offset);
                fprintf(f, ",\"hit%u\":\"", h);
                if (tn) {
                    json_esc(f, tn);
                    fputc(' ', f);
                }
                fprintf(f, "range %u.%u +0x%" PRIx64 "\"", ev->l.hits[h].id, ev->l.hits[h].gen,
                        ev->l.hits[h].offset);
            }
            fprintf(f, "%s}}", ev->overflow ? ",\"overflow\":true" : "");
            break;
        }
        case WO_EV_COPY: {
            static const char *const kinds[] = {"?", "H2D", "D2H", "D2D", "default", "H2H"};
            tid = stream_tid(&st, ev->stream);
            ev_head(f, &first, "i", ts, pid, tid);
            fprintf(f, "\"s\":\"t\",\"cat\":\"copy\",\"name\":\"copy %s %s\",\"args\":{\"bytes\":%" PRIu64
                    "}}", ev->c.kind < WO_ARRAY_SIZE(kinds) ? kinds[ev->c.kind] : "?",
                    human(ev->c.bytes, hb, sizeof(hb)), ev->c.bytes);
            break;
        }
        case WO_EV_SYNC:
        case WO_EV_CAPTURE_BEGIN:
        case WO_EV_CAPTURE_END:
        case WO_EV_GRAPH_INSTANTIATE:
        case WO_EV_GRAPH_LAUNCH:
            tid = stream_tid(&st, ev->stream);
            ev_head(f, &first, "i", ts, pid, tid);
            fprintf(f, "\"s\":\"t\",\"cat\":\"%s\",\"name\":\"%s\"",
                    ev->type == WO_EV_SYNC ? "sync" : "graph", wo_ev_type_name(ev->type));
            if (ev->type != WO_EV_SYNC)
                fprintf(f, ",\"args\":{\"handle\":\"0x%" PRIx64 "\",\"aux\":\"0x%" PRIx64 "\"}",
                        ev->g.handle, ev->g.aux);
            fprintf(f, "}");
            break;
        case WO_EV_ALLOC:
        case WO_EV_FREE:
        case WO_EV_TAG: {
            const char *tn = NULL;
            if (ev->type == WO_EV_TAG && te->range_id != WO_TRACE_NO_ID) {
                const struct wo_trace_range *g = wo_trace_data_range(d, te->range_id, te->range_gen);
                if (g && ev->a.base >= g->base)
                    tn = tag_of(d, &a, te->range_id, te->range_gen, ev->a.base - g->base);
            }
            ev_head(f, &first, "i", ts, pid, TID_MEMORY);
            fprintf(f, "\"s\":\"t\",\"cat\":\"memory\",\"name\":");
            if (tn)
                json_str(f, tn);
            else
                fprintf(f, "\"%s %s\"", wo_ev_type_name(ev->type), human(ev->a.size, hb, sizeof(hb)));
            fprintf(f, ",\"args\":{\"base\":\"0x%" PRIx64 "\",\"bytes\":%" PRIu64 ",\"flags\":%u}}",
                    ev->a.base, ev->a.size, ev->a.flags);
            if (ev->type == WO_EV_TAG)
                break;
            if (ev->type == WO_EV_ALLOC) {
                live += ev->a.size;
                placeable += ev->a.flags & 1 ? ev->a.size : 0;
            } else {
                live -= WO_MIN(live, ev->a.size);
                placeable -= ev->a.flags & 1 ? WO_MIN(placeable, ev->a.size) : 0;
            }
            ev_head(f, &first, "C", ts, pid, TID_MEMORY);
            fprintf(f, "\"name\":\"allocated bytes\",\"args\":{\"all\":%" PRIu64 ",\"placeable\":%" PRIu64
                    "}}", live, placeable);
            break;
        }
        case WO_EV_PLACE:
        case WO_EV_PREFETCH:
        case WO_EV_EVICT: {
            const char *tn = tag_of(d, &a, ev->p.id, ev->p.gen, ev->p.offset);
            char nm[64];
            ev_head(f, &first, "i", ts, pid, ev->type == WO_EV_PLACE ? TID_MEMORY : TID_UVM);
            snprintf(nm, sizeof(nm), "%s %s", wo_ev_type_name(ev->type), human(ev->p.bytes, hb, sizeof(hb)));
            fprintf(f, "\"s\":\"t\",\"cat\":\"uvm\",\"name\":");
            json_str(f, nm);
            fprintf(f, ",\"args\":{\"range\":\"%u.%u\",\"offset\":%" PRIu64 ",\"bytes\":%" PRIu64
                    ",\"from\":%u,\"to\":%u,\"tag\":",
                    ev->p.id, ev->p.gen, ev->p.offset, ev->p.bytes, ev->p.from, ev->p.to);
            json_str(f, tn ? tn : "");
            fprintf(f, "}}");
            break;
        }
        case WO_EV_SEAL:
        case WO_EV_STEP:
            ev_head(f, &first, "i", ts, pid, 0);
            fprintf(f, "\"s\":\"g\",\"cat\":\"marker\",\"name\":\"%s\"}", wo_ev_type_name(ev->type));
            break;
        default:
            break;
        }
    }
    for (size_t i = 0; i < st.n; i++) {
        ev_head(f, &first, "M", 0, pid, TID_STREAM0 + (int)i);
        fprintf(f, "\"name\":\"thread_name\",\"args\":{\"name\":\"stream 0x%" PRIx64 "\"}}", st.ids[i]);
    }
    fprintf(f, "\n]}\n");
    if (f != stdout ? fclose(f) != 0 : fflush(f) != 0) {
        fprintf(stderr, "woffload-trace: writing %s: %s\n", argv[2], strerror(errno));
        rc = EXIT_FAIL;
    }
    free(st.ids);
    attr_free(&a);
    wo_trace_data_free(d);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("woffload-trace %s (trace format %d.%d)\n", WO_VERSION, WO_TRACE_VERSION_MAJOR,
               WO_TRACE_VERSION_MINOR);
        return 0;
    }
    if (strcmp(argv[1], "summary") == 0)
        return cmd_summary(argc - 1, argv + 1);
    if (strcmp(argv[1], "validate") == 0)
        return cmd_validate(argc - 1, argv + 1);
    if (strcmp(argv[1], "export-chrome") == 0)
        return cmd_export_chrome(argc - 1, argv + 1);
    fprintf(stderr, "woffload-trace: unknown command \"%s\" (summary, validate, export-chrome; see --help)\n",
            argv[1]);
    return EXIT_USAGE;
}
