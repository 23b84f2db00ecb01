/* tests/test-trace.c: the trace writer and reader (core/trace.h): every event
 * type survives a round trip field by field; truncation at every byte and
 * every single-bit flip of a small trace are reported as -EBADMSG at an
 * offset in the damaged region, never a crash; an unwritable path, a full
 * disk and a writer whose reader went away each give one log line and stop
 * recording; the synthetic MoE generator produces what replay expects; a
 * gzip-compressed trace reads exactly like the plain one, and a truncated or
 * damaged .gz is a located -EBADMSG. */
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <zlib.h>

#include "core/log.h"
#include "core/registry.h"
#include "core/trace.h"
#include "gen-trace.h"

static char tmpdir[] = "/tmp/wo-test-trace-XXXXXX";

static int setup_dir(void **state)
{
    (void)state;
    assert_non_null(mkdtemp(tmpdir));
    return 0;
}

static int teardown_dir(void **state)
{
    char cmd[128];
    (void)state;
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void path_in(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", tmpdir, name);
}

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    uint8_t *buf;
    long n;

    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* Log capture: the writer's messages go to a temporary file. */
static int log_capture_begin(void)
{
    char p[256];
    int fd;
    path_in(p, sizeof(p), "log");
    fd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    wo_log_set_fd(fd);
    wo_log_set_level(WO_LOG_WARN);
    return fd;
}

static char *log_capture_end(int fd)
{
    char p[256];
    size_t n;
    char *s;
    wo_log_set_fd(2);
    close(fd);
    path_in(p, sizeof(p), "log");
    s = (char *)slurp(p, &n);
    s[n] = '\0';
    return s;
}

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* ---- one event of every type, with every field distinct ---------------------- */

static struct wo_event make_event(unsigned type, unsigned variant)
{
    struct wo_event ev;
    uint64_t k = (uint64_t)type * 1000 + variant;

    memset(&ev, 0, sizeof(ev));
    ev.type = (uint16_t)type;
    ev.t_ns = UINT64_C(0x1122334455667788) + k;
    ev.stream = UINT64_C(0xfedcba9876543210) - k;
    ev.tid = 0x80000001u + (uint32_t)k;
    ev.api = (uint16_t)(7 + type);
    switch (type) {
    case WO_EV_ALLOC:
    case WO_EV_FREE:
    case WO_EV_TAG:
        ev.a.base = UINT64_C(0x7f0000000000) + k * 4096;
        ev.a.size = UINT64_C(0x123456789) + k;
        ev.a.seq = 99 + k;
        ev.a.flags = 0x21;
        ev.a.device = 3;
        break;
    case WO_EV_COPY:
        ev.c.dst = 0x1000 + k;
        ev.c.src = 0x2000 + k;
        ev.c.bytes = UINT64_C(1) << 40;
        ev.c.kind = WO_COPY_D2H;
        break;
    case WO_EV_LAUNCH:
        ev.l.func = UINT64_C(0xdeadbeefcafe) + k;
        for (int i = 0; i < 3; i++) {
            ev.l.grid[i] = 1000u + (uint32_t)i;
            ev.l.block[i] = 32u << i;
        }
        ev.nhits = (uint16_t)variant; /* 0, 3, 8, and 11 (more than fit) */
        for (unsigned i = 0; i < WO_EV_MAX_HITS; i++) {
            ev.l.hits[i].id = 10 + i;
            ev.l.hits[i].gen = 20 + i;
            ev.l.hits[i].offset = UINT64_C(0x100000000) * i + 5;
            ev.l.hits[i].hi = UINT64_C(0x100000000) * i + 77;
        }
        break;
    case WO_EV_CAPTURE_BEGIN:
    case WO_EV_CAPTURE_END:
    case WO_EV_GRAPH_INSTANTIATE:
    case WO_EV_GRAPH_LAUNCH:
        ev.g.handle = UINT64_C(0xabcdef) + k;
        ev.g.aux = UINT64_C(0x12345) + k;
        break;
    case WO_EV_PLACE:
    case WO_EV_PREFETCH:
    case WO_EV_EVICT:
        ev.p.id = 17;
        ev.p.gen = 0xfffffffeu;
        ev.p.offset = UINT64_C(1) << 33;
        ev.p.bytes = UINT64_C(16) << 20;
        ev.p.from = WO_TRACE_PLACE_HOST;
        ev.p.to = WO_TRACE_PLACE_MANAGED;
        break;
    default:
        break;
    }
    return ev;
}

static void assert_event_equal(const struct wo_event *want, const struct wo_event *got)
{
    assert_int_equal(got->type, want->type);
    assert_int_equal(got->t_ns, want->t_ns);
    assert_int_equal(got->stream, want->stream);
    assert_int_equal(got->tid, want->tid);
    assert_int_equal(got->api, want->api);
    switch (want->type) {
    case WO_EV_ALLOC:
    case WO_EV_FREE:
    case WO_EV_TAG:
        assert_int_equal(got->a.base, want->a.base);
        assert_int_equal(got->a.size, want->a.size);
        assert_int_equal(got->a.seq, want->a.seq);
        assert_int_equal(got->a.flags, want->a.flags);
        assert_int_equal(got->a.device, want->a.device);
        break;
    case WO_EV_COPY:
        assert_int_equal(got->c.dst, want->c.dst);
        assert_int_equal(got->c.src, want->c.src);
        assert_int_equal(got->c.bytes, want->c.bytes);
        assert_int_equal(got->c.kind, want->c.kind);
        break;
    case WO_EV_LAUNCH: {
        unsigned n = WO_MIN(want->nhits, WO_EV_MAX_HITS);
        assert_int_equal(got->l.func, want->l.func);
        assert_memory_equal(got->l.grid, want->l.grid, sizeof(want->l.grid));
        assert_memory_equal(got->l.block, want->l.block, sizeof(want->l.block));
        assert_int_equal(got->nhits, n);
        assert_int_equal(got->overflow, want->nhits > WO_EV_MAX_HITS);
        for (unsigned i = 0; i < n; i++) {
            assert_int_equal(got->l.hits[i].id, want->l.hits[i].id);
            assert_int_equal(got->l.hits[i].gen, want->l.hits[i].gen);
            assert_int_equal(got->l.hits[i].offset, want->l.hits[i].offset);
            assert_int_equal(got->l.hits[i].hi, want->l.hits[i].hi);
        }
        break;
    }
    case WO_EV_CAPTURE_BEGIN:
    case WO_EV_CAPTURE_END:
    case WO_EV_GRAPH_INSTANTIATE:
    case WO_EV_GRAPH_LAUNCH:
        assert_int_equal(got->g.handle, want->g.handle);
        assert_int_equal(got->g.aux, want->g.aux);
        break;
    case WO_EV_PLACE:
    case WO_EV_PREFETCH:
    case WO_EV_EVICT:
        assert_int_equal(got->p.id, want->p.id);
        assert_int_equal(got->p.gen, want->p.gen);
        assert_int_equal(got->p.offset, want->p.offset);
        assert_int_equal(got->p.bytes, want->p.bytes);
        assert_int_equal(got->p.from, want->p.from);
        assert_int_equal(got->p.to, want->p.to);
        break;
    default:
        break;
    }
}

static const unsigned launch_variants[] = {0, 3, 8, 11};

static const struct wo_trace_tag test_tag = {
    .id = 5, .gen = 6, .base = 0x7f0000200000, .offset = 0x200000, .size = 0x1000,
    .placement = WO_TRACE_PLACE_HOST, .rule = 2, .flags = WO_TRACE_TAG_PLACEABLE,
    .name = "model.layers.0.mlp.experts.3.w2_weight",
};

/* Writes one of everything to path. */
static void write_everything(const char *path)
{
    struct wo_trace *t;

    assert_int_equal(wo_trace_open(path, &t), 0);
    assert_int_equal(wo_trace_info(t, "gpu", "NVIDIA H100 80GB HBM3"), 0);
    assert_int_equal(wo_trace_rule(t, 2, "experts-on-host"), 0);
    assert_int_equal(wo_trace_kernel_known(t, 0xdeadbeefcafe), 0);
    assert_int_equal(wo_trace_kernel(t, 0xdeadbeefcafe, "flash_fwd_kernel"), 0);
    assert_int_equal(wo_trace_kernel_known(t, 0xdeadbeefcafe), 1);
    assert_int_equal(wo_trace_tag(t, &test_tag), 0);
    for (unsigned type = 1; type < WO_EV_MAX; type++) {
        if (type == WO_EV_LAUNCH) {
            for (size_t v = 0; v < WO_ARRAY_SIZE(launch_variants); v++) {
                struct wo_event ev = make_event(type, launch_variants[v]);
                assert_int_equal(wo_trace_event_ids(t, &ev, WO_TRACE_NO_ID, 0), 0);
            }
        } else {
            struct wo_event ev = make_event(type, 0);
            assert_int_equal(wo_trace_event_ids(t, &ev, 40 + type, 50 + type), 0);
        }
    }
    assert_int_equal(wo_trace_nevents(t), WO_EV_MAX - 1 + WO_ARRAY_SIZE(launch_variants) - 1);
    assert_int_equal(wo_trace_close(t, 12), 0);
}

static void roundtrip_every_event_type(void **state)
{
    char path[256];
    struct wo_trace_reader *r;
    struct wo_trace_rec rec;
    unsigned type = 1, variant = 0, nev = 0, seen[WO_TREC_MAX] = {0};
    int e;

    (void)state;
    path_in(path, sizeof(path), "every.wotrace");
    write_everything(path);

    assert_int_equal(wo_trace_reader_open(path, WO_TRACE_STRICT, &r), 0);
    while ((e = wo_trace_next(r, &rec)) > 0) {
        assert_true(rec.type < WO_TREC_MAX);
        seen[rec.type]++;
        switch (rec.type) {
        case WO_TREC_EVENT: {
            struct wo_event want = make_event(type, type == WO_EV_LAUNCH ? launch_variants[variant] : 0);
            assert_event_equal(&want, &rec.ev);
            if (type == WO_EV_ALLOC || type == WO_EV_FREE || type == WO_EV_TAG) {
                assert_int_equal(rec.range_id, 40 + type);
                assert_int_equal(rec.range_gen, 50 + type);
            }
            nev++;
            if (type == WO_EV_LAUNCH && ++variant < WO_ARRAY_SIZE(launch_variants))
                break;
            type++;
            break;
        }
        case WO_TREC_KERNEL:
            assert_int_equal(rec.func, 0xdeadbeefcafe);
            assert_string_equal(rec.name, "flash_fwd_kernel");
            break;
        case WO_TREC_RULE:
            assert_int_equal(rec.rule, 2);
            assert_string_equal(rec.name, "experts-on-host");
            break;
        case WO_TREC_TAG:
            assert_int_equal(rec.tag.id, test_tag.id);
            assert_int_equal(rec.tag.gen, test_tag.gen);
            assert_int_equal(rec.tag.base, test_tag.base);
            assert_int_equal(rec.tag.offset, test_tag.offset);
            assert_int_equal(rec.tag.size, test_tag.size);
            assert_int_equal(rec.tag.placement, test_tag.placement);
            assert_int_equal(rec.tag.rule, test_tag.rule);
            assert_int_equal(rec.tag.flags, test_tag.flags);
            assert_string_equal(rec.tag.name, test_tag.name);
            break;
        case WO_TREC_FOOTER:
            assert_int_equal(rec.footer.ring_dropped, 12);
            assert_int_equal(rec.footer.events[WO_EV_LAUNCH], WO_ARRAY_SIZE(launch_variants));
            assert_int_equal(rec.footer.events[WO_EV_COPY], 1);
            break;
        default:
            break;
        }
    }
    assert_int_equal(e, 0);
    assert_string_equal(wo_trace_reader_error(r), "");
    assert_int_equal(type, WO_EV_MAX);
    assert_int_equal(nev, WO_EV_MAX - 1 + WO_ARRAY_SIZE(launch_variants) - 1);
    assert_int_equal(seen[WO_TREC_HEADER], 1);
    assert_int_equal(seen[WO_TREC_INFO], 1);
    assert_int_equal(seen[WO_TREC_FOOTER], 1);
    assert_true(wo_trace_reader_has_footer(r));
    /* the header names the machine and the versions */
    assert_string_equal(wo_trace_reader_info(r, "format"), "libwoffload trace");
    assert_non_null(wo_trace_reader_info(r, "hostname"));
    assert_non_null(wo_trace_reader_info(r, "kernel"));
    assert_non_null(wo_trace_reader_info(r, "cpu"));
    assert_non_null(wo_trace_reader_info(r, "libwoffload_version"));
    assert_non_null(wo_trace_reader_info(r, "start_time"));
    assert_non_null(wo_trace_reader_info(r, "pid"));
    assert_string_equal(wo_trace_reader_info(r, "gpu"), "NVIDIA H100 80GB HBM3");
    assert_null(wo_trace_reader_info(r, "no-such-key"));
    wo_trace_reader_close(r);
}

static void load_builds_tables(void **state)
{
    char path[256];
    struct wo_trace_data *d;
    uint8_t *buf;
    size_t len;

    (void)state;
    path_in(path, sizeof(path), "every.wotrace");
    write_everything(path);
    buf = slurp(path, &len);
    assert_int_equal(wo_trace_load_mem(buf, len, WO_TRACE_STRICT, 0, &d), 0);
    assert_int_equal(d->error, 0);
    assert_int_equal(d->nevents, WO_EV_MAX - 1 + WO_ARRAY_SIZE(launch_variants) - 1);
    assert_int_equal(d->nkernels, 1);
    assert_string_equal(wo_trace_data_kernel(d, 0xdeadbeefcafe), "flash_fwd_kernel");
    assert_null(wo_trace_data_kernel(d, 1));
    assert_int_equal(d->ntags, 1);
    assert_string_equal(d->tags[0].name, test_tag.name);
    assert_int_equal(d->nrules, 1);
    assert_int_equal(d->nranges, 1); /* the one alloc event */
    assert_non_null(wo_trace_data_range(d, 40 + WO_EV_ALLOC, 50 + WO_EV_ALLOC));
    assert_null(wo_trace_data_range(d, 40 + WO_EV_ALLOC, 0));
    assert_true(d->has_footer);
    assert_string_equal(wo_trace_data_info(d, "gpu"), "NVIDIA H100 80GB HBM3");
    wo_trace_data_free(d);

    /* the event limit is an error with the offset, and keeps what was read */
    assert_int_equal(wo_trace_load_mem(buf, len, 0, 3, &d), -E2BIG);
    assert_int_equal(d->nevents, 3);
    assert_non_null(strstr(d->error_text, "more than 3 events"));
    wo_trace_data_free(d);
    free(buf);
}

/* Frees name their range by address; the loader finds the live range with
 * that base, however many were allocated and freed there before. */
static void loader_matches_frees_to_allocs(void **state)
{
    char path[256];
    struct wo_trace *t;
    struct wo_trace_data *d;
    uint32_t live_id[64];
    int live[64] = {0};
    uint32_t next_id = 0;
    uint64_t rng = 12345, frees = 0;

    (void)state;
    path_in(path, sizeof(path), "churn.wotrace");
    assert_int_equal(wo_trace_open(path, &t), 0);
    for (unsigned step = 0; step < 20000; step++) {
        unsigned slot;
        struct wo_event ev;
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        slot = (unsigned)(rng >> 33) % 64;
        memset(&ev, 0, sizeof(ev));
        ev.t_ns = 1000 + step;
        /* 64 bases whose hashes collide in runs: base i * 2 MiB */
        ev.a.base = UINT64_C(0x7f0000000000) + (uint64_t)slot * (2u << 20);
        ev.a.size = 4096;
        if (live[slot]) {
            ev.type = WO_EV_FREE;
            assert_int_equal(wo_trace_event_ids(t, &ev, WO_TRACE_NO_ID, 0), 0);
            live[slot] = 0;
            frees++;
        } else {
            ev.type = WO_EV_ALLOC;
            ev.a.seq = step + 1;
            live_id[slot] = next_id++;
            assert_int_equal(wo_trace_event_ids(t, &ev, live_id[slot], 7), 0);
            live[slot] = 1;
        }
    }
    assert_int_equal(wo_trace_close(t, 0), 0);
    assert_int_equal(wo_trace_load(path, WO_TRACE_STRICT, 0, &d), 0);
    assert_int_equal(d->nranges, next_id);
    for (size_t i = 0; i < d->nevents; i++) {
        const struct wo_trace_ev *te = &d->events[i];
        const struct wo_trace_range *g;
        if (te->ev.type != WO_EV_FREE)
            continue;
        assert_int_not_equal(te->range_id, WO_TRACE_NO_ID);
        g = wo_trace_data_range(d, te->range_id, te->range_gen);
        assert_non_null(g);
        assert_int_equal(g->base, te->ev.a.base);
        assert_int_equal(g->t_free_ns, te->ev.t_ns);
        assert_true(g->t_alloc_ns < g->t_free_ns);
        frees--;
    }
    assert_int_equal(frees, 0);
    for (size_t i = 0; i < d->nranges; i++)
        if (d->ranges[i].t_free_ns == 0)
            assert_true(live[(d->ranges[i].base - UINT64_C(0x7f0000000000)) / (2u << 20)]);
    wo_trace_data_free(d);
}

/* Ranges are found by (id, gen): through the table of ids when the ids are
 * dense (the registry's), by the search over all of them when they are not;
 * the same answers either way, an id's later generations and ids with no
 * range included. */
static void range_lookup_by_id_and_gen(void **state)
{
    static const struct {
        uint32_t id, gen;
    } dense[] = {{3, 1}, {0, 7}, {0, 9}, {5, 2}, {0, 8}, {5, 1}},
      sparse[] = {{3, 1}, {1u << 30, 4}, {0, 7}, {(1u << 30) + 2, 4}};

    (void)state;
    for (int pass = 0; pass < 2; pass++) {
        char path[256];
        struct wo_trace *t;
        struct wo_trace_data *d;
        size_t n = pass ? WO_ARRAY_SIZE(sparse) : WO_ARRAY_SIZE(dense);

        path_in(path, sizeof(path), pass ? "ids-sparse.wotrace" : "ids-dense.wotrace");
        assert_int_equal(wo_trace_open(path, &t), 0);
        for (size_t i = 0; i < n; i++) {
            struct wo_event ev;
            memset(&ev, 0, sizeof(ev));
            ev.type = WO_EV_ALLOC;
            ev.t_ns = 1000 + i;
            ev.a.base = UINT64_C(0x7f0000000000) + (uint64_t)i * (2u << 20);
            ev.a.size = 4096;
            ev.a.seq = i + 1;
            assert_int_equal(wo_trace_event_ids(t, &ev, pass ? sparse[i].id : dense[i].id,
                                                pass ? sparse[i].gen : dense[i].gen),
                             0);
        }
        assert_int_equal(wo_trace_close(t, 0), 0);
        assert_int_equal(wo_trace_load(path, WO_TRACE_STRICT, 0, &d), 0);
        assert_int_equal(d->nranges, n);
        if (pass)
            assert_null(d->id_first); /* ids far apart: no table */
        else
            assert_non_null(d->id_first);
        for (size_t i = 0; i < n; i++) {
            uint32_t id = pass ? sparse[i].id : dense[i].id, gen = pass ? sparse[i].gen : dense[i].gen;
            const struct wo_trace_range *g = wo_trace_data_range(d, id, gen);
            assert_non_null(g);
            assert_int_equal(g->base, UINT64_C(0x7f0000000000) + (uint64_t)i * (2u << 20));
            assert_null(wo_trace_data_range(d, id, gen + 100));
        }
        assert_null(wo_trace_data_range(d, 1, 7));
        assert_null(wo_trace_data_range(d, 4, 1));
        assert_null(wo_trace_data_range(d, 6, 1));
        assert_null(wo_trace_data_range(d, (1u << 30) + 1, 4));
        assert_null(wo_trace_data_range(d, UINT32_MAX, 4));
        wo_trace_data_free(d);
    }
}

/* ---- a small trace and its record boundaries ------------------------------- */

static uint8_t *small_trace(size_t *len)
{
    char path[256];
    struct wo_trace *t;
    struct wo_gen_opts o = WO_GEN_DEFAULTS;

    o.layers = 1;
    o.experts = 2;
    o.topk = 1;
    o.steps = 1;
    path_in(path, sizeof(path), "small.wotrace");
    assert_int_equal(wo_trace_open(path, &t), 0);
    assert_int_equal(wo_gen_moe_trace(t, &o), 0);
    assert_int_equal(wo_trace_close(t, 0), 0);
    return slurp(path, len);
}

/* Record boundaries of a valid trace (prelude end included, file end last). */
static size_t boundaries(const uint8_t *buf, size_t len, uint64_t *out, size_t max)
{
    struct wo_trace_reader *r;
    struct wo_trace_rec rec;
    size_t n = 0;

    assert_int_equal(wo_trace_reader_open_mem(buf, len, WO_TRACE_STRICT, &r), 0);
    while (wo_trace_next(r, &rec) > 0) {
        assert_true(n < max);
        out[n++] = rec.offset;
    }
    assert_string_equal(wo_trace_reader_error(r), "");
    wo_trace_reader_close(r);
    assert_true(n < max);
    out[n++] = len;
    return n;
}

/* Reads everything; returns the final status and the error offset. */
static int read_all(const uint8_t *buf, size_t len, unsigned flags, uint64_t *err_off, char *err,
                    size_t errlen)
{
    struct wo_trace_reader *r;
    struct wo_trace_rec rec;
    int e = wo_trace_reader_open_mem(buf, len, flags, &r);

    if (r && e == 0)
        while ((e = wo_trace_next(r, &rec)) > 0)
            ;
    *err_off = wo_trace_reader_error_offset(r);
    snprintf(err, errlen, "%s", wo_trace_reader_error(r));
    wo_trace_reader_close(r);
    return e;
}

static void truncation_at_every_offset(void **state)
{
    uint64_t b[4096];
    size_t len, nb;
    uint8_t *buf = small_trace(&len);

    (void)state;
    nb = boundaries(buf, len, b, WO_ARRAY_SIZE(b));
    assert_true(nb > 10);
    for (size_t cut = 0; cut < len; cut++) {
        /* a copy of exactly cut bytes, so ASan sees any read past the end */
        uint8_t *copy = malloc(cut ? cut : 1);
        uint64_t off, rec_start = 0, rec_end = WO_TRACE_PRELUDE_SIZE;
        char err[WO_TRACE_ERR_MAX];
        int boundary = cut == WO_TRACE_PRELUDE_SIZE, e;

        assert_non_null(copy);
        memcpy(copy, buf, cut);
        for (size_t i = 0; i + 1 < nb; i++) {
            if (b[i] <= cut && cut < b[i + 1]) {
                rec_start = b[i];
                rec_end = b[i + 1];
            }
            boundary |= b[i] == cut;
        }
        if (cut < WO_TRACE_PRELUDE_SIZE)
            rec_start = 0;

        /* strict: always an error, at or after the start of the cut record */
        e = read_all(copy, cut, WO_TRACE_STRICT, &off, err, sizeof(err));
        if (e != -EBADMSG)
            fail_msg("cut at %zu: expected -EBADMSG, got %d", cut, e);
        if (off < rec_start || off > cut)
            fail_msg("cut at %zu (record %llu-%llu): error at %llu: %s", cut,
                     (unsigned long long)rec_start, (unsigned long long)rec_end,
                     (unsigned long long)off, err);
        assert_non_null(strstr(err, "offset "));
        if (!boundary || cut <= WO_TRACE_PRELUDE_SIZE)
            assert_true(strstr(err, "truncated") || strstr(err, "ends") || strstr(err, "magic"));

        /* lenient: a cut exactly between records after the header reads as a
         * trace without footer; anything else is an error */
        e = read_all(copy, cut, 0, &off, err, sizeof(err));
        if (boundary && cut > b[0])
            assert_int_equal(e, 0);
        else if (e != -EBADMSG)
            fail_msg("lenient cut at %zu: expected -EBADMSG, got %d", cut, e);
        free(copy);
    }
    free(buf);
}

static void single_bit_flips_detected(void **state)
{
    size_t len;
    uint8_t *buf = small_trace(&len);
    uint8_t *copy = malloc(len);

    (void)state;
    assert_non_null(copy);
    for (size_t byte = 0; byte < len; byte++) {
        for (int bit = 0; bit < 8; bit++) {
            uint64_t off;
            char err[WO_TRACE_ERR_MAX];
            int e;

            memcpy(copy, buf, len);
            copy[byte] ^= (uint8_t)(1u << bit);
            e = read_all(copy, len, WO_TRACE_STRICT, &off, err, sizeof(err));
            if (e != -EBADMSG)
                fail_msg("flip of bit %d at byte %zu not detected (%d)", bit, byte, e);
            /* the error names the record holding the flipped bit (or the
             * prelude), never a later one */
            if (off > byte)
                fail_msg("flip at byte %zu reported at %llu: %s", byte, (unsigned long long)off, err);
        }
    }
    free(copy);
    free(buf);
}

/* ---- hand-made damage ---------------------------------------------------------- */

static void patch_crc(uint8_t *rec)
{
    uint32_t len = (uint32_t)rec[0] | (uint32_t)rec[1] << 8 | (uint32_t)rec[2] << 16 |
                   (uint32_t)rec[3] << 24;
    uint32_t c = wo_crc32c(0, rec, 8 + len);
    for (int i = 0; i < 4; i++)
        rec[8 + len + i] = (uint8_t)(c >> (8 * i));
}

/* PICKS records (optional type 0x81): the loader keeps the last one's
 * tensors; a count past the limit, a length that does not match the count,
 * more hot experts than experts, more hot rows than rows and more rows by
 * the copy engine than rows not hot are errors at their offsets; entries of
 * the 72 bytes written before hot experts load with none hot, those of the 80
 * written before the copy engine's rows with none by it. */
static void picks_records_roundtrip(void **state)
{
    static const struct wo_trace_pick p1[2] = {
        {.id = 7,
         .gen = 3,
         .offset = 0,
         .bytes = 1 << 20,
         .n_experts = 16,
         .hot = 4,
         .regs = 10,
         .staged = 9,
         .reused = 1,
         .rows = 30,
         .resident = 0,
         .hot_rows = 12,
         .engine_rows = 10},
        {.id = 7,
         .gen = 3,
         .offset = 1 << 20,
         .bytes = 1 << 19,
         .n_experts = 16,
         .regs = 10,
         .staged = 9,
         .reused = 1,
         .rows = 40,
         .resident = 2},
    };
    struct wo_trace_pick p2[2];
    char path[256], err[WO_TRACE_ERR_MAX];
    struct wo_trace_data *d;
    struct wo_trace *t;
    uint64_t b[16], off;
    uint8_t *buf;
    size_t len, nb;

    (void)state;
    memcpy(p2, p1, sizeof(p2));
    p2[0].regs = 20;
    p2[0].staged = 18;
    p2[0].rows = 61;
    p2[1].resident = 5;
    path_in(path, sizeof(path), "picks.wotrace");
    assert_int_equal(wo_trace_open(path, &t), 0);
    assert_int_equal(wo_trace_picks(t, 100, p1, 2), 0);
    assert_int_equal(wo_trace_picks(t, 200, p2, 2), 0);
    assert_int_equal(wo_trace_picks(t, 300, p2, WO_TRACE_MAX_PICKS + 1), -EINVAL);
    assert_int_equal(wo_trace_picks(t, 300, NULL, 1), -EINVAL);
    assert_int_equal(wo_trace_close(t, 0), 0);
    buf = slurp(path, &len);
    assert_int_equal(wo_trace_load_mem(buf, len, WO_TRACE_STRICT, 0, &d), 0);
    assert_int_equal(d->npicks, 2);
    assert_int_equal(d->picks_t_ns, 200);
    assert_memory_equal(d->picks, p2, sizeof(p2));
    assert_int_equal(wo_trace_pick_copied(&d->picks[0]), 61u << 16);
    assert_int_equal(wo_trace_pick_per_reg(&d->picks[0]), (61u << 16) / 20);
    assert_true(wo_trace_pick_picked(&d->picks[1]) > 0.27 && wo_trace_pick_picked(&d->picks[1]) < 0.28);
    assert_true(wo_trace_pick_resident(&d->picks[1]) == 5.0 / 15.0);
    assert_true(wo_trace_pick_hot_rate(&d->picks[0]) == 12.0 / 61.0);
    assert_int_equal(wo_trace_pick_linked_per_reg(&d->picks[0]), ((61u - 12u) << 16) / 20);
    assert_true(wo_trace_pick_engine_rate(&d->picks[0]) == 10.0 / 49.0);
    assert_true(wo_trace_pick_engine_rate(&d->picks[1]) == 0.0);
    /* each tensor's base: the first record with its last hot set, tensor 0
     * hot from the first record, tensor 1 never */
    assert_non_null(d->picks_base);
    assert_memory_equal(&d->picks_base[0], &p1[0], sizeof(p1[0]));
    assert_memory_equal(&d->picks_base[1], &p1[1], sizeof(p1[1]));
    {
        /* its steady state: the figures since the base */
        struct wo_trace_pick st = wo_trace_pick_steady(&d->picks[0], &d->picks_base[0]);
        assert_int_equal(st.regs, 10);
        assert_int_equal(st.staged, 9);
        assert_int_equal(st.rows, 31);
        assert_int_equal(st.hot_rows, 0);
        assert_int_equal(st.engine_rows, 0);
        /* nothing registered since: the cumulative figures */
        st = wo_trace_pick_steady(&d->picks[1], &d->picks_base[1]);
        assert_memory_equal(&st, &d->picks[1], sizeof(st));
    }
    wo_trace_data_free(d);
    {
        /* a hot set made between the records: the base is the record that
         * first had it, not the first one */
        struct wo_trace_pick q[3][1];
        char path2[256];

        memcpy(q[0], p1, sizeof(q[0]));
        q[0][0].hot = 0;
        q[0][0].hot_rows = 0;
        memcpy(q[1], q[0], sizeof(q[1]));
        q[1][0].hot = 4;
        q[1][0].regs = 12;
        q[1][0].staged = 11;
        q[1][0].rows = 40;
        memcpy(q[2], q[1], sizeof(q[2]));
        q[2][0].regs = 30;
        q[2][0].staged = 29;
        q[2][0].rows = 70;
        q[2][0].hot_rows = 20;
        path_in(path2, sizeof(path2), "picks-base.wotrace");
        assert_int_equal(wo_trace_open(path2, &t), 0);
        for (int k = 0; k < 3; k++)
            assert_int_equal(wo_trace_picks(t, 100 + (uint64_t)k, q[k], 1), 0);
        assert_int_equal(wo_trace_close(t, 0), 0);
        free(buf);
        buf = slurp(path2, &len);
        assert_int_equal(wo_trace_load_mem(buf, len, WO_TRACE_STRICT, 0, &d), 0);
        assert_memory_equal(&d->picks_base[0], &q[1][0], sizeof(q[1][0]));
        assert_int_equal(wo_trace_pick_steady(&d->picks[0], &d->picks_base[0]).rows, 30);
        wo_trace_data_free(d);
        free(buf);
        buf = slurp(path, &len);
    }

    /* the first picks record's offset, in b[1] */
    nb = boundaries(buf, len, b, WO_ARRAY_SIZE(b));
    for (size_t i = 0; i < nb; i++)
        if (buf[b[i] + 4] == WO_TREC_PICKS) {
            b[1] = b[i];
            break;
        }
    assert_int_equal(buf[b[1] + 4], WO_TREC_PICKS);
    /* a count the length does not hold */
    buf[b[1] + WO_TRACE_REC_HEADER + 8] = 3;
    patch_crc(buf + b[1]);
    assert_int_equal(read_all(buf, len, 0, &off, err, sizeof(err)), -EBADMSG);
    assert_int_equal(off, b[1] + WO_TRACE_REC_HEADER);
    assert_non_null(strstr(err, "picks record of 188 bytes for 3 tensors"));
    /* past the limit */
    buf[b[1] + WO_TRACE_REC_HEADER + 10] = 0x7f;
    patch_crc(buf + b[1]);
    assert_int_equal(read_all(buf, len, 0, &off, err, sizeof(err)), -EBADMSG);
    assert_non_null(strstr(err, "at most 2048 expected"));
    buf[b[1] + WO_TRACE_REC_HEADER + 8] = 2;
    buf[b[1] + WO_TRACE_REC_HEADER + 10] = 0;
    /* more hot experts than experts */
    buf[b[1] + WO_TRACE_REC_HEADER + 12 + 88 + 28] = 17;
    patch_crc(buf + b[1]);
    assert_int_equal(read_all(buf, len, 0, &off, err, sizeof(err)), -EBADMSG);
    assert_int_equal(off, b[1] + WO_TRACE_REC_HEADER + 12 + 88 + 28);
    assert_non_null(strstr(err, "17 hot experts of 16"));
    buf[b[1] + WO_TRACE_REC_HEADER + 12 + 88 + 28] = 0;
    /* more hot rows than rows (40) */
    buf[b[1] + WO_TRACE_REC_HEADER + 12 + 88 + 72] = 41;
    patch_crc(buf + b[1]);
    assert_int_equal(read_all(buf, len, 0, &off, err, sizeof(err)), -EBADMSG);
    assert_int_equal(off, b[1] + WO_TRACE_REC_HEADER + 12 + 88 + 72);
    assert_non_null(strstr(err, "41 rows from hot experts of 40 rows"));
    buf[b[1] + WO_TRACE_REC_HEADER + 12 + 88 + 72] = 0;
    /* more rows by the copy engine than rows not hot (tensor 0: 30 - 12) */
    buf[b[1] + WO_TRACE_REC_HEADER + 12 + 80] = 19;
    patch_crc(buf + b[1]);
    assert_int_equal(read_all(buf, len, 0, &off, err, sizeof(err)), -EBADMSG);
    assert_int_equal(off, b[1] + WO_TRACE_REC_HEADER + 12 + 80);
    assert_non_null(strstr(err, "19 rows by the copy engine of 18 rows not hot"));
    buf[b[1] + WO_TRACE_REC_HEADER + 12 + 80] = 18;
    patch_crc(buf + b[1]);
    assert_int_equal(read_all(buf, len, 0, &off, err, sizeof(err)), 0);
    free(buf);

    /* records of 80-byte entries (a trace from before the copy engine's
     * rows: none by it) and of 72-byte ones (from before hot experts: none
     * hot either) */
    for (uint32_t keep = 80; keep >= 72; keep -= 8) {
        const struct wo_trace_pick v[1] = {{.id = 7,
                                            .gen = 3,
                                            .bytes = 1 << 20,
                                            .n_experts = 16,
                                            .hot = keep == 80,
                                            .regs = 3,
                                            .staged = 3,
                                            .rows = 9,
                                            .hot_rows = keep == 80 ? 2 : 0,
                                            .engine_rows = 5}};
        uint32_t plen, cut = 88 - keep;
        uint8_t *rec;

        path_in(path, sizeof(path), "picks-old.wotrace");
        assert_int_equal(wo_trace_open(path, &t), 0);
        assert_int_equal(wo_trace_picks(t, 100, v, 1), 0);
        assert_int_equal(wo_trace_close(t, 0), 0);
        buf = slurp(path, &len);
        nb = boundaries(buf, len, b, WO_ARRAY_SIZE(b));
        for (size_t i = 0; i + 1 < nb; i++) /* the last is the end */
            if (buf[b[i] + 4] == WO_TREC_PICKS)
                b[1] = b[i];
        rec = buf + b[1];
        plen = (uint32_t)rec[0] | (uint32_t)rec[1] << 8 | (uint32_t)rec[2] << 16 |
               (uint32_t)rec[3] << 24;
        assert_int_equal(plen, 12 + 88);
        /* the entry's last fields cut: the rest of the file moves up */
        memmove(rec + 8 + 12 + keep, rec + 8 + 12 + 88, len - (b[1] + 8 + 12 + 88));
        len -= cut;
        rec[0] = (uint8_t)(12 + keep);
        patch_crc(rec);
        assert_int_equal(wo_trace_load_mem(buf, len, WO_TRACE_STRICT, 0, &d), 0);
        assert_int_equal(d->npicks, 1);
        assert_int_equal(d->picks[0].rows, 9);
        assert_int_equal(d->picks[0].hot, keep == 80);
        assert_int_equal(d->picks[0].hot_rows, keep == 80 ? 2 : 0);
        assert_int_equal(d->picks[0].engine_rows, 0);
        wo_trace_data_free(d);
        free(buf);
    }
}

static void damage_is_named(void **state)
{
    size_t len, nb;
    uint64_t b[4096], off;
    uint8_t *buf = small_trace(&len), *copy = malloc(len + 64);
    char err[WO_TRACE_ERR_MAX];

    (void)state;
    assert_non_null(copy);
    nb = boundaries(buf, len, b, WO_ARRAY_SIZE(b));

    /* not a trace */
    assert_int_equal(read_all((const uint8_t *)"hello, world, this is text\n", 27, 0, &off, err,
                              sizeof(err)), -EBADMSG);
    assert_non_null(strstr(err, "not a libwoffload trace"));
    assert_int_equal(off, 0);

    /* a future major version (CRC patched so only the version is wrong) */
    memcpy(copy, buf, len);
    copy[8] = 2;
    {
        uint32_t c = wo_crc32c(0, copy, 12);
        for (int i = 0; i < 4; i++)
            copy[12 + i] = (uint8_t)(c >> (8 * i));
    }
    assert_int_equal(read_all(copy, len, 0, &off, err, sizeof(err)), -EBADMSG);
    assert_non_null(strstr(err, "version 2.0"));

    /* an absurd length in the second record */
    memcpy(copy, buf, len);
    copy[b[1] + 3] = 0x40;
    assert_int_equal(read_all(copy, len, 0, &off, err, sizeof(err)), -EBADMSG);
    assert_int_equal(off, b[1]);
    assert_non_null(strstr(err, "exceeds the limit"));

    /* an unknown required record type, valid CRC */
    memcpy(copy, buf, len);
    copy[b[1] + 4] = 0x33;
    patch_crc(copy + b[1]);
    assert_int_equal(read_all(copy, len, 0, &off, err, sizeof(err)), -EBADMSG);
    assert_int_equal(off, b[1] + 4);
    assert_non_null(strstr(err, "unknown record type 0x33"));

    /* the same type marked optional is skipped; the footer still counts it */
    copy[b[1] + 4] = 0xb3;
    patch_crc(copy + b[1]);
    assert_int_equal(read_all(copy, len, WO_TRACE_STRICT, &off, err, sizeof(err)), 0);

    /* a whole record removed: the footer notices */
    memcpy(copy, buf, b[3]);
    memcpy(copy + b[3], buf + b[4], len - b[4]);
    assert_int_equal(read_all(copy, len - (b[4] - b[3]), 0, &off, err, sizeof(err)), -EBADMSG);
    assert_non_null(strstr(err, "footer counts"));

    /* bytes after the footer */
    memcpy(copy, buf, len);
    memcpy(copy + len, buf + b[1], 8);
    assert_int_equal(read_all(copy, len + 8, 0, &off, err, sizeof(err)), -EBADMSG);
    assert_int_equal(off, len);
    assert_non_null(strstr(err, "after the footer"));

    /* the strict reader wants the footer; the lenient one does not */
    assert_int_equal(read_all(buf, b[nb - 2], WO_TRACE_STRICT, &off, err, sizeof(err)), -EBADMSG);
    assert_non_null(strstr(err, "without a footer"));
    assert_int_equal(off, b[nb - 2]);
    assert_int_equal(read_all(buf, b[nb - 2], 0, &off, err, sizeof(err)), 0);

    /* the file reader gives the same answers as the memory reader */
    {
        char path[256];
        FILE *f;
        struct wo_trace_reader *r;
        struct wo_trace_rec rec;
        int e;
        path_in(path, sizeof(path), "cut.wotrace");
        f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(buf, 1, len - 3, f), len - 3);
        fclose(f);
        assert_int_equal(wo_trace_reader_open(path, 0, &r), 0);
        while ((e = wo_trace_next(r, &rec)) > 0)
            ;
        assert_int_equal(e, -EBADMSG);
        assert_int_equal(wo_trace_reader_error_offset(r), b[nb - 2]);
        assert_non_null(strstr(wo_trace_reader_error(r), "truncated footer record"));
        /* errors are sticky */
        assert_int_equal(wo_trace_next(r, &rec), -EBADMSG);
        wo_trace_reader_close(r);
        assert_int_equal(wo_trace_reader_open("/nonexistent/x.wotrace", 0, &r), -ENOENT);
        assert_null(r);
    }
    free(copy);
    free(buf);
}

/* ---- the writer's failures --------------------------------------------------------- */

static void unwritable_path_logs_once(void **state)
{
    struct wo_trace *t = NULL;
    int fd = log_capture_begin();
    char *log;

    (void)state;
    assert_int_equal(wo_trace_open("/nonexistent-dir/run.wotrace", &t), -ENOENT);
    assert_null(t);
    log = log_capture_end(fd);
    assert_int_equal(count_lines(log), 1);
    assert_non_null(strstr(log, "/nonexistent-dir/run.wotrace"));
    assert_non_null(strstr(log, "No such file or directory"));
    assert_non_null(strstr(log, "recording is off"));
    free(log);
}

static void full_disk_logs_once(void **state)
{
    struct wo_trace *t = NULL;
    int fd = log_capture_begin();
    char *log;

    (void)state;
    /* /dev/full accepts open() and fails every write() with ENOSPC */
    assert_int_equal(wo_trace_open("/dev/full", &t), -EIO);
    assert_null(t);
    log = log_capture_end(fd);
    assert_int_equal(count_lines(log), 1);
    assert_non_null(strstr(log, "/dev/full"));
    assert_non_null(strstr(log, "No space left on device"));
    assert_non_null(strstr(log, "recording stopped"));
    free(log);
}

static void write_error_midway_stops_recording(void **state)
{
    struct wo_trace *t = NULL;
    int p[2], fd, e = 0;
    unsigned n = 0;
    char *log;
    struct wo_event ev = make_event(WO_EV_LAUNCH, 8);
    void (*old)(int) = signal(SIGPIPE, SIG_IGN);

    (void)state;
    assert_int_equal(pipe(p), 0);
    fd = log_capture_begin();
    assert_int_equal(wo_trace_open_fd(p[1], "pipe-trace", &t), 0);
    close(p[0]); /* the disk goes away: every later write fails (EPIPE) */
    for (n = 0; n < 100000 && (e = wo_trace_event(t, &ev)) == 0; n++)
        ;
    assert_int_equal(e, -EIO);
    assert_false(wo_trace_ok(t));
    /* later calls are cheap no-ops: no new log lines, same answer */
    assert_int_equal(wo_trace_event(t, &ev), -EIO);
    assert_int_equal(wo_trace_kernel(t, 1, "k"), -EIO);
    assert_int_equal(wo_trace_flush(t), -EIO);
    assert_int_equal(wo_trace_close(t, 0), -EIO);
    log = log_capture_end(fd);
    signal(SIGPIPE, old);
    assert_int_equal(count_lines(log), 1);
    assert_non_null(strstr(log, "pipe-trace"));
    assert_non_null(strstr(log, "Broken pipe"));
    assert_non_null(strstr(log, "recording stopped"));
    free(log);
}

/* A full disk after recording started (a file size limit stands in for it:
 * EFBIG where a disk gives ENOSPC, the same path): the file is cut back to
 * whole records, so it reads as a trace without footer. */
static void disk_full_midway_leaves_whole_records(void **state)
{
    char path[256], logp[256];
    pid_t pid;
    int status;
    size_t len;
    uint8_t *buf;
    char *log;
    uint64_t off;
    char err[WO_TRACE_ERR_MAX];

    (void)state;
    path_in(path, sizeof(path), "limited.wotrace");
    path_in(logp, sizeof(logp), "log");
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct rlimit rl = {100000, 100000};
        struct wo_trace *t;
        struct wo_event ev = make_event(WO_EV_LAUNCH, 3);
        int fd = open(logp, O_RDWR | O_CREAT | O_TRUNC, 0600), e = 0;
        unsigned n;
        signal(SIGXFSZ, SIG_IGN);
        if (fd < 0 || setrlimit(RLIMIT_FSIZE, &rl) < 0)
            _exit(10);
        wo_log_set_fd(fd);
        if (wo_trace_open(path, &t) < 0)
            _exit(11);
        for (n = 0; n < 1000000 && (e = wo_trace_event(t, &ev)) == 0; n++)
            ;
        if (e != -EIO || wo_trace_ok(t) || wo_trace_close(t, 0) != -EIO)
            _exit(12);
        _exit(0);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    log = (char *)slurp(logp, &len);
    log[len] = '\0';
    assert_int_equal(count_lines(log), 1);
    assert_non_null(strstr(log, "File too large"));
    assert_non_null(strstr(log, "whole records"));
    free(log);
    buf = slurp(path, &len);
    assert_true(len > 0 && len <= 100000);
    assert_int_equal(read_all(buf, len, 0, &off, err, sizeof(err)), 0);
    assert_int_equal(read_all(buf, len, WO_TRACE_STRICT, &off, err, sizeof(err)), -EBADMSG);
    assert_non_null(strstr(err, "without a footer"));
    free(buf);
}

/* ---- the registry supplies (id, gen) of alloc events ------------------------------- */

static void alloc_event_takes_ids_from_registry(void **state)
{
    char path[256];
    struct wo_trace *t;
    struct wo_trace_data *d;
    struct wo_range rg;
    struct wo_event ev = make_event(WO_EV_ALLOC, 0);

    (void)state;
    assert_int_equal(wo_registry_init(), 0);
    assert_int_equal(wo_registry_add(ev.a.base, ev.a.size, 0, 0, NULL, &rg), 0);
    path_in(path, sizeof(path), "ids.wotrace");
    assert_int_equal(wo_trace_open(path, &t), 0);
    ev.a.seq = rg.seq;
    assert_int_equal(wo_trace_event(t, &ev), 0);
    ev.a.seq = rg.seq + 1000; /* another allocation at that address: unknown */
    assert_int_equal(wo_trace_event(t, &ev), 0);
    ev = make_event(WO_EV_TAG, 0);
    ev.a.base = rg.base + 64;
    assert_int_equal(wo_trace_event(t, &ev), 0);
    assert_int_equal(wo_trace_close(t, 0), 0);
    wo_registry_reset();

    assert_int_equal(wo_trace_load(path, WO_TRACE_STRICT, 0, &d), 0);
    assert_int_equal(d->nevents, 3);
    assert_int_equal(d->events[0].range_id, rg.id);
    assert_int_equal(d->events[0].range_gen, rg.gen);
    assert_int_equal(d->events[1].range_id, WO_TRACE_NO_ID);
    assert_int_equal(d->events[2].range_id, rg.id);
    assert_int_equal(d->nranges, 1);
    wo_trace_data_free(d);
}

/* ---- the synthetic MoE trace --------------------------------------------------------- */

static void generator_makes_moe_decode(void **state)
{
    char path[256];
    struct wo_trace *t;
    struct wo_trace_data *d;
    struct wo_gen_opts o = WO_GEN_DEFAULTS;
    size_t launches = 0, expert_hits = 0, unresolved = 0;
    unsigned per_step = wo_gen_launches_per_step(&o);

    (void)state;
    path_in(path, sizeof(path), "moe.wotrace");
    assert_int_equal(wo_trace_open(path, &t), 0);
    assert_int_equal(wo_gen_moe_trace(t, &o), 0);
    assert_int_equal(wo_trace_close(t, 0), 0);
    assert_int_equal(wo_trace_load(path, WO_TRACE_STRICT, 0, &d), 0);
    assert_non_null(strstr(wo_trace_data_info(d, "synthetic"), "unit tests only"));
    for (size_t i = 0; i < d->nevents; i++) {
        const struct wo_event *ev = &d->events[i].ev;
        if (ev->type != WO_EV_LAUNCH)
            continue;
        launches++;
        assert_non_null(wo_trace_data_kernel(d, ev->l.func));
        for (unsigned h = 0; h < ev->nhits; h++) {
            const struct wo_trace_range *g = wo_trace_data_range(d, ev->l.hits[h].id, ev->l.hits[h].gen);
            if (!g) {
                unresolved++;
                continue;
            }
            assert_true(ev->l.hits[h].offset < g->size);
            for (size_t k = 0; k < d->ntags; k++)
                if (d->tags[k].id == g->id && d->tags[k].placement == WO_TRACE_PLACE_MANAGED)
                    expert_hits++;
        }
    }
    assert_int_equal(unresolved, 0);
    assert_int_equal(launches, (size_t)per_step * o.steps);
    assert_int_equal(expert_hits, (size_t)o.steps * o.layers * o.topk * 2);
    assert_int_equal(d->ntags, 1 + o.layers * 9 + 2); /* embed, the layers, norm, lm_head */
    wo_trace_data_free(d);
}

/* ---- gzip-compressed traces (.wot.gz) ----------------------------------------- */

/* buf gzip-compressed: one member, or two when split is inside buf (gzip(1)
 * reads concatenated members as one stream, and so must the reader). */
static uint8_t *gzip_buf(const uint8_t *buf, size_t len, size_t split, size_t *zlen)
{
    size_t cap = compressBound((uLong)len) + 64, out = 0;
    uint8_t *z = malloc(cap);
    const size_t parts[2][2] = {{0, split && split < len ? split : len},
                                {split && split < len ? split : len, len}};

    assert_non_null(z);
    for (int i = 0; i < 2; i++) {
        z_stream st;
        if (i == 1 && parts[1][0] == len)
            break;
        memset(&st, 0, sizeof(st));
        assert_int_equal(deflateInit2(&st, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY),
                         Z_OK);
        st.next_in = (Bytef *)(uintptr_t)(buf + parts[i][0]);
        st.avail_in = (uInt)(parts[i][1] - parts[i][0]);
        st.next_out = z + out;
        st.avail_out = (uInt)(cap - out);
        assert_int_equal(deflate(&st, Z_FINISH), Z_STREAM_END);
        out = cap - st.avail_out;
        deflateEnd(&st);
    }
    *zlen = out;
    return z;
}

static void write_file(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

/* The two loads hold the same trace. */
static void assert_same_data(const struct wo_trace_data *a, const struct wo_trace_data *b)
{
    assert_int_equal(a->error, b->error);
    assert_int_equal(a->version_major, b->version_major);
    assert_int_equal(a->version_minor, b->version_minor);
    assert_int_equal(a->nevents, b->nevents);
    for (size_t i = 0; i < a->nevents; i++) {
        const struct wo_trace_ev *x = &a->events[i], *y = &b->events[i];
        assert_int_equal(x->ev.type, y->ev.type);
        assert_int_equal(x->ev.t_ns, y->ev.t_ns);
        assert_int_equal(x->ev.stream, y->ev.stream);
        assert_int_equal(x->ev.tid, y->ev.tid);
        assert_int_equal(x->ev.nhits, y->ev.nhits);
        assert_int_equal(x->range_id, y->range_id);
        assert_int_equal(x->range_gen, y->range_gen);
        if (x->ev.type == WO_EV_LAUNCH) {
            assert_int_equal(x->ev.l.func, y->ev.l.func);
            for (unsigned h = 0; h < x->ev.nhits; h++) {
                assert_int_equal(x->ev.l.hits[h].id, y->ev.l.hits[h].id);
                assert_int_equal(x->ev.l.hits[h].offset, y->ev.l.hits[h].offset);
            }
        }
    }
    assert_int_equal(a->nranges, b->nranges);
    for (size_t i = 0; i < a->nranges; i++) {
        assert_int_equal(a->ranges[i].base, b->ranges[i].base);
        assert_int_equal(a->ranges[i].size, b->ranges[i].size);
        assert_int_equal(a->ranges[i].t_free_ns, b->ranges[i].t_free_ns);
    }
    assert_int_equal(a->nkernels, b->nkernels);
    for (size_t i = 0; i < a->nkernels; i++)
        assert_string_equal(a->kernels[i].name, b->kernels[i].name);
    assert_int_equal(a->ntags, b->ntags);
    for (size_t i = 0; i < a->ntags; i++) {
        assert_string_equal(a->tags[i].name, b->tags[i].name);
        assert_int_equal(a->tags[i].offset, b->tags[i].offset);
    }
    assert_int_equal(a->nrules, b->nrules);
    assert_int_equal(a->ninfo, b->ninfo);
    for (size_t i = 0; i < a->ninfo; i++) {
        assert_string_equal(a->info_keys[i], b->info_keys[i]);
        assert_string_equal(a->info_values[i], b->info_values[i]);
    }
    assert_int_equal(a->has_footer, b->has_footer);
    assert_int_equal(a->footer.records, b->footer.records);
}

/* A trace larger than the reader's window (so the compressed one is read
 * in many pieces), plain and gzip-compressed, from a file and from memory,
 * one gzip member or two: the same trace every time. The magic decides,
 * not the name: a .gz under a plain name inflates, a plain trace named .gz
 * does not. */
static void gzip_reads_like_plain(void **state)
{
    char plain[256], gz[256], gz2[256], misnamed[256];
    struct wo_trace *t;
    struct wo_trace_reader *r;
    struct wo_trace_data *d, *dz, *dz2, *dm;
    struct wo_gen_opts o = WO_GEN_DEFAULTS;
    uint8_t *buf, *z, *z2;
    size_t len, zlen, z2len;

    (void)state;
    o.layers = 8;
    o.experts = 32;
    o.topk = 4;
    o.steps = 96;
    path_in(plain, sizeof(plain), "big.wot");
    path_in(gz, sizeof(gz), "big.wot.gz");
    path_in(gz2, sizeof(gz2), "big-two-members.wot");
    path_in(misnamed, sizeof(misnamed), "plain-named.wot.gz");
    assert_int_equal(wo_trace_open(plain, &t), 0);
    assert_int_equal(wo_gen_moe_trace(t, &o), 0);
    assert_int_equal(wo_trace_close(t, 0), 0);
    buf = slurp(plain, &len);
    assert_true(len > 2 * (WO_TRACE_MAX_RECORD + 12));
    z = gzip_buf(buf, len, 0, &zlen);
    z2 = gzip_buf(buf, len, len / 3, &z2len);
    assert_true(zlen < len / 2);
    write_file(gz, z, zlen);
    write_file(gz2, z2, z2len);
    write_file(misnamed, buf, len);

    assert_int_equal(wo_trace_load(plain, WO_TRACE_STRICT, 0, &d), 0);
    assert_true(d->nevents > 10000);
    assert_int_equal(wo_trace_load(gz, WO_TRACE_STRICT, 0, &dz), 0);
    assert_same_data(d, dz);
    assert_int_equal(wo_trace_load(gz2, WO_TRACE_STRICT, 0, &dz2), 0);
    assert_same_data(d, dz2);
    assert_int_equal(wo_trace_load_mem(z, zlen, WO_TRACE_STRICT, 0, &dm), 0);
    assert_same_data(d, dm);
    wo_trace_data_free(dz);
    wo_trace_data_free(dz2);
    wo_trace_data_free(dm);
    assert_int_equal(wo_trace_load(misnamed, WO_TRACE_STRICT, 0, &dm), 0);
    assert_same_data(d, dm);
    wo_trace_data_free(dm);
    wo_trace_data_free(d);

    assert_int_equal(wo_trace_reader_open(gz2, WO_TRACE_STRICT, &r), 0);
    assert_true(wo_trace_reader_compressed(r));
    wo_trace_reader_close(r);
    assert_int_equal(wo_trace_reader_open(misnamed, WO_TRACE_STRICT, &r), 0);
    assert_false(wo_trace_reader_compressed(r));
    wo_trace_reader_close(r);
    free(buf);
    free(z);
    free(z2);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* A record bigger than the gzip reader's first window (64 KiB): an optional
 * record (type 0x80 | n, skipped by readers) of 300,000 bytes after the
 * header, the footer's record count raised to match. The window grows; the
 * trace reads as the plain one does. */
static void gzip_large_record(void **state)
{
    uint64_t b[4096];
    size_t len, nb, zlen, big = 300000, out_len;
    uint8_t *buf = small_trace(&len), *out, *z, *foot;
    struct wo_trace_data *d, *dz;
    char path[256];
    uint64_t records = 0;

    (void)state;
    nb = boundaries(buf, len, b, WO_ARRAY_SIZE(b));
    out_len = len + 8 + big + 4;
    out = calloc(1, out_len);
    assert_non_null(out);
    memcpy(out, buf, b[1]); /* prelude and header record */
    put32(out + b[1], (uint32_t)big);
    out[b[1] + 4] = 0x9f;
    for (size_t i = 0; i < big; i++)
        out[b[1] + 8 + i] = (uint8_t)(i * 131 + (i >> 9));
    put32(out + b[1] + 8 + big, wo_crc32c(0, out + b[1], 8 + big));
    memcpy(out + b[1] + 12 + big, buf + b[1], len - b[1]);
    foot = out + b[nb - 2] + 12 + big; /* the footer record: records + 1 */
    for (int i = 0; i < 8; i++)
        records |= (uint64_t)foot[8 + 16 + i] << (8 * i);
    records++;
    for (int i = 0; i < 8; i++)
        foot[8 + 16 + i] = (uint8_t)(records >> (8 * i));
    {
        uint32_t flen = (uint32_t)(out + out_len - foot) - 12;
        put32(foot + 8 + flen, wo_crc32c(0, foot, 8 + flen));
    }
    assert_int_equal(wo_trace_load_mem(out, out_len, WO_TRACE_STRICT, 0, &d), 0);
    z = gzip_buf(out, out_len, 0, &zlen);
    assert_int_equal(wo_trace_load_mem(z, zlen, WO_TRACE_STRICT, 0, &dz), 0);
    assert_same_data(d, dz);
    wo_trace_data_free(dz);
    path_in(path, sizeof(path), "large-record.wot.gz");
    write_file(path, z, zlen);
    assert_int_equal(wo_trace_load(path, WO_TRACE_STRICT, 0, &dz), 0);
    assert_same_data(d, dz);
    wo_trace_data_free(dz);
    wo_trace_data_free(d);
    free(z);
    free(out);
    free(buf);
}

/* A .gz cut at every byte: -EBADMSG naming the truncated gzip data and the
 * offset in the decompressed trace where it stops; what came before is
 * kept (a prefix of the trace's events), never a crash or a read past the
 * input (each cut is a copy of exactly its bytes, for ASan). The same from
 * a file. */
static void gzip_truncation_is_located(void **state)
{
    size_t len, zlen;
    uint8_t *buf = small_trace(&len), *z = gzip_buf(buf, len, 0, &zlen);
    struct wo_trace_data *full, *d;
    char path[256];

    (void)state;
    assert_int_equal(wo_trace_load_mem(buf, len, WO_TRACE_STRICT, 0, &full), 0);
    for (size_t cut = 2; cut < zlen; cut++) {
        uint8_t *copy = malloc(cut);
        assert_non_null(copy);
        memcpy(copy, z, cut);
        assert_int_equal(wo_trace_load_mem(copy, cut, 0, 0, &d), -EBADMSG);
        if (!strstr(d->error_text, "truncated gzip data"))
            fail_msg("cut at %zu of %zu: %s", cut, zlen, d->error_text);
        assert_true(strncmp(d->error_text, "offset ", 7) == 0);
        assert_non_null(strstr(d->error_text, "of the decompressed trace"));
        assert_true(d->error_offset <= len);
        assert_true(d->nevents <= full->nevents);
        for (size_t i = 0; i < d->nevents; i++)
            assert_int_equal(d->events[i].ev.t_ns, full->events[i].ev.t_ns);
        wo_trace_data_free(d);
        free(copy);
    }
    /* one byte is not the gzip magic: a (plain) truncated prelude */
    assert_int_equal(wo_trace_load_mem(z, 1, 0, 0, &d), -EBADMSG);
    assert_non_null(strstr(d->error_text, "truncated prelude"));
    wo_trace_data_free(d);

    path_in(path, sizeof(path), "cut.wot.gz");
    write_file(path, z, zlen - 1);
    assert_int_equal(wo_trace_load(path, 0, 0, &d), -EBADMSG);
    assert_non_null(strstr(d->error_text, "truncated gzip data: the compressed input ends after"));
    assert_true(d->error_offset <= len);
    wo_trace_data_free(d);
    wo_trace_data_free(full);
    free(buf);
    free(z);
}

/* Every single-bit flip of a small .gz: either it changed nothing that
 * matters (gzip header fields such as the time, or the padding bits of the
 * last deflate byte) and the trace reads the same, or -EBADMSG with a
 * located text (a corrupt gzip stream, the gzip CRC, or the trace's own
 * CRC of the record the damage reached). */
static void gzip_damage_is_an_error(void **state)
{
    size_t len, zlen;
    uint8_t *buf = small_trace(&len), *z = gzip_buf(buf, len, 0, &zlen);
    struct wo_trace_data *full, *d;
    unsigned errors = 0, gzip_errors = 0;

    (void)state;
    assert_int_equal(wo_trace_load_mem(buf, len, WO_TRACE_STRICT, 0, &full), 0);
    for (size_t bit = 0; bit < zlen * 8; bit++) {
        int e;
        z[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        e = wo_trace_load_mem(z, zlen, WO_TRACE_STRICT, 0, &d);
        z[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        assert_non_null(d);
        if (e == 0) {
            assert_same_data(full, d);
        } else {
            assert_int_equal(e, -EBADMSG);
            assert_true(strncmp(d->error_text, "offset ", 7) == 0);
            errors++;
            gzip_errors += strstr(d->error_text, "gzip data") != NULL;
        }
        wo_trace_data_free(d);
    }
    /* nearly every flip is caught (21179 of 21240 with zlib 1.2.13: the
     * harmless ones are the header's time, XFL and OS bytes); most reach the
     * trace's record CRCs first, the rest the gzip layer itself */
    print_message("%zu flips: %u errors, %u from the gzip layer\n", zlen * 8, errors, gzip_errors);
    assert_true(errors >= zlen * 8 * 95 / 100);
    assert_true(gzip_errors > 0);
    wo_trace_data_free(full);
    free(buf);
    free(z);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(roundtrip_every_event_type),
        cmocka_unit_test(load_builds_tables),
        cmocka_unit_test(loader_matches_frees_to_allocs),
        cmocka_unit_test(range_lookup_by_id_and_gen),
        cmocka_unit_test(truncation_at_every_offset),
        cmocka_unit_test(single_bit_flips_detected),
        cmocka_unit_test(damage_is_named),
        cmocka_unit_test(picks_records_roundtrip),
        cmocka_unit_test(unwritable_path_logs_once),
        cmocka_unit_test(full_disk_logs_once),
        cmocka_unit_test(write_error_midway_stops_recording),
        cmocka_unit_test(disk_full_midway_leaves_whole_records),
        cmocka_unit_test(alloc_event_takes_ids_from_registry),
        cmocka_unit_test(generator_makes_moe_decode),
        cmocka_unit_test(gzip_reads_like_plain),
        cmocka_unit_test(gzip_large_record),
        cmocka_unit_test(gzip_truncation_is_located),
        cmocka_unit_test(gzip_damage_is_an_error),
    };
    return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
