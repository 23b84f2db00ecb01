/* core/trace.c: the trace writer (WOFFLOAD_TRACE) and the helpers the reader
 * shares: CRC-32C and the names of types. Layouts: core/trace-int.h and
 * docs/trace-format.md.
 *
 * The writer lives on the consumer thread. It encodes records straight into
 * one buffer and calls write(2) only when the buffer fills (or on flush and
 * close), so recording costs the consumer a few hundred nanoseconds per event
 * and costs the hooks nothing beyond the ring push they make anyway. */
#include "core/trace.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#include "core/log.h"
#include "core/registry.h"
#include "core/trace-int.h"
#include "wo-config.h"

/* ---- CRC-32C -------------------------------------------------------------- */

/* Slicing-by-8 tables for machines without the SSE4.2 instruction. */
static uint32_t crc_table[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;
static int crc_hw;

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
#if defined(__x86_64__)
    crc_hw = __builtin_cpu_supports("sse4.2");
#endif
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t c, const uint8_t *p, size_t n)
{
    uint64_t c64 = c;
    for (; n >= 8; n -= 8, p += 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c64 = _mm_crc32_u64(c64, w);
    }
    c = (uint32_t)c64;
    for (; n > 0; n--)
        c = _mm_crc32_u8(c, *p++);
    return c;
}
#endif

static uint32_t crc_soft(uint32_t c, const uint8_t *p, size_t n)
{
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                           (uint32_t)p[3] << 24);
        c = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^
            crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24] ^ crc_table[3][p[4]] ^
            crc_table[2][p[5]] ^ crc_table[1][p[6]] ^ crc_table[0][p[7]];
    }
    for (; n > 0; n--)
        c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xff];
    return c;
}

uint32_t wo_crc32c(uint32_t crc, const void *buf, size_t len)
{
    uint32_t c = ~crc;

    pthread_once(&crc_once, crc_init);
#if defined(__x86_64__)
    if (crc_hw)
        return ~crc_sse42(c, buf, len);
#endif
    return ~crc_soft(c, buf, len);
}

/* ---- names ------------------------------------------------------------------ */

static const char *const ev_names[WO_EV_MAX] = {
    [WO_EV_NONE] = "none",
    [WO_EV_ALLOC] = "alloc",
    [WO_EV_FREE] = "free",
    [WO_EV_TAG] = "tag",
    [WO_EV_COPY] = "copy",
    [WO_EV_LAUNCH] = "launch",
    [WO_EV_SYNC] = "sync",
    [WO_EV_CAPTURE_BEGIN] = "capture-begin",
    [WO_EV_CAPTURE_END] = "capture-end",
    [WO_EV_GRAPH_INSTANTIATE] = "graph-instantiate",
    [WO_EV_GRAPH_LAUNCH] = "graph-launch",
    [WO_EV_PLACE] = "place",
    [WO_EV_PREFETCH] = "prefetch",
    [WO_EV_EVICT] = "evict",
    [WO_EV_SEAL] = "seal",
    [WO_EV_STEP] = "step",
};

const char *wo_ev_type_name(unsigned type)
{
    return type < WO_EV_MAX && ev_names[type] ? ev_names[type] : "?";
}

const char *wo_trace_rec_type_name(unsigned type)
{
    switch (type) {
    case WO_TREC_HEADER:
        return "header";
    case WO_TREC_EVENT:
        return "event";
    case WO_TREC_KERNEL:
        return "kernel";
    case WO_TREC_TAG:
        return "tag";
    case WO_TREC_RULE:
        return "rule";
    case WO_TREC_INFO:
        return "info";
    case WO_TREC_FOOTER:
        return "footer";
    case WO_TREC_PICKS:
        return "picks";
    default:
        return "unknown";
    }
}

const char *wo_trace_place_name(unsigned place)
{
    switch (place) {
    case WO_TRACE_PLACE_DEVICE:
        return "device";
    case WO_TRACE_PLACE_HOST:
        return "host";
    case WO_TRACE_PLACE_MANAGED:
        return "managed";
    default:
        return "unknown";
    }
}

/* ---- writer ------------------------------------------------------------------ */

/* 256 KiB: a few thousand launch events per write(2), and small enough that a
 * killed process loses only a moment of trace. */
#define WBUF_SIZE (256u * 1024u)

struct wo_trace {
    int fd;
    int failed; /* a write failed: recording is off */
    char *label;
    uint64_t flushed; /* bytes of whole buffers written: always a record boundary */
    uint8_t *buf;
    size_t used;
    uint64_t records;
    uint64_t events[WO_EV_MAX];
    uint64_t nevents;
    /* function handles already named: open addressing, 0 = empty slot */
    uint64_t *funcs;
    size_t funcs_cap, nfuncs;
    int func_zero_named; /* handle 0 cannot live in the table */
};

static const char *errtext(int err, char *buf, size_t len)
{
    /* GNU strerror_r: returns a pointer that may or may not be buf */
    return strerror_r(err, buf, len);
}

static void fail(struct wo_trace *t, int err)
{
    char eb[128];

    if (t->failed)
        return;
    t->failed = 1;
    /* A failed write may have left half a buffer (and half a record): cut
     * the file back to the last whole buffer so it ends between records and
     * stays readable as a trace without footer. Not possible on a pipe. */
    if (ftruncate(t->fd, (off_t)t->flushed) == 0)
        wo_error("trace %s: write failed: %s; recording stopped, the file keeps its first %llu "
                 "bytes (whole records) (the engine goes on)",
                 t->label, errtext(err, eb, sizeof(eb)), (unsigned long long)t->flushed);
    else
        wo_error("trace %s: write failed: %s; recording stopped (the engine goes on)", t->label,
                 errtext(err, eb, sizeof(eb)));
}

static int write_all(struct wo_trace *t, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(t->fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            /* write() returning 0 for a non-empty buffer: treat as a full disk */
            fail(t, w < 0 ? errno : ENOSPC);
            return -EIO;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int wo_trace_flush(struct wo_trace *t)
{
    int r;

    if (!t || t->failed)
        return -EIO;
    r = write_all(t, t->buf, t->used);
    if (r == 0)
        t->flushed += t->used;
    t->used = 0;
    return r;
}

/* Room for one record of payload bytes at the buffer's end: returns the
 * record's first byte (header filled in) or NULL when recording is off. */
static uint8_t *rec_begin(struct wo_trace *t, unsigned type, unsigned subtype, uint32_t payload)
{
    size_t need = WO_TRACE_REC_HEADER + (size_t)payload + WO_TRACE_REC_TRAILER;
    uint8_t *p;

    if (t->failed)
        return NULL;
    if (t->used + need > WBUF_SIZE && wo_trace_flush(t) < 0)
        return NULL;
    p = t->buf + t->used;
    wo_put32(p, payload);
    p[4] = (uint8_t)type;
    p[5] = (uint8_t)subtype;
    wo_put16(p + 6, 0);
    return p;
}

static void rec_end(struct wo_trace *t, uint8_t *rec, uint32_t payload)
{
    size_t n = WO_TRACE_REC_HEADER + payload;

    wo_put32(rec + n, wo_crc32c(0, rec, n));
    t->used += n + WO_TRACE_REC_TRAILER;
    t->records++;
}

static size_t cut(const char *s)
{
    size_t n = s ? strnlen(s, WO_TRACE_MAX_STRING) : 0;
    return n;
}

/* The key/value payload of header and info records. */
static uint32_t kv_size(const char *const *kv, size_t n)
{
    uint32_t sz = 4;
    for (size_t i = 0; i < n; i++)
        sz += 2 + (uint32_t)WO_MIN(cut(kv[2 * i]), WO_TRACE_MAX_KEY) + 4 + (uint32_t)cut(kv[2 * i + 1]);
    return sz;
}

static int write_kv(struct wo_trace *t, unsigned type, const char *const *kv, size_t n)
{
    uint32_t payload = kv_size(kv, n);
    uint8_t *rec = rec_begin(t, type, 0, payload);
    uint8_t *p;

    if (!rec)
        return -EIO;
    p = rec + WO_TRACE_REC_HEADER;
    wo_put32(p, (uint32_t)n);
    p += 4;
    for (size_t i = 0; i < n; i++) {
        size_t kl = WO_MIN(cut(kv[2 * i]), WO_TRACE_MAX_KEY), vl = cut(kv[2 * i + 1]);
        wo_put16(p, (uint16_t)kl);
        memcpy(p + 2, kv[2 * i], kl);
        p += 2 + kl;
        wo_put32(p, (uint32_t)vl);
        if (vl)
            memcpy(p + 4, kv[2 * i + 1], vl);
        p += 4 + vl;
    }
    rec_end(t, rec, payload);
    return 0;
}

static void read_first_line_field(const char *path, const char *field, char *out, size_t len)
{
    char line[512];
    FILE *f = fopen(path, "re");
    size_t fl = strlen(field);

    out[0] = '\0';
    if (!f)
        return;
    while (fgets(line, sizeof(line), f)) {
        char *colon;
        if (strncmp(line, field, fl) != 0 || !(colon = strchr(line, ':')))
            continue;
        colon++;
        while (*colon == ' ' || *colon == '\t')
            colon++;
        colon[strcspn(colon, "\n")] = '\0';
        snprintf(out, len, "%s", colon);
        break;
    }
    fclose(f);
}

static void read_cmdline(char *out, size_t len)
{
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    ssize_t n;

    out[0] = '\0';
    if (fd < 0)
        return;
    n = read(fd, out, len - 1);
    close(fd);
    if (n <= 0)
        return;
    /* arguments are NUL-separated; the header wants one readable string */
    for (ssize_t i = 0; i < n; i++)
        if (out[i] == '\0')
            out[i] = ' ';
    while (n > 0 && out[n - 1] == ' ')
        n--;
    out[n] = '\0';
}

static int write_header(struct wo_trace *t)
{
    char host[256], kernel[512], cpu[256], ncpu[16], pid[16], cmd[1024], start[64], rt[32], mono[32];
    uint8_t prelude[WO_TRACE_PRELUDE_SIZE];
    struct utsname u;
    struct timespec ts;
    struct tm tm;
    long nproc = sysconf(_SC_NPROCESSORS_ONLN);

    if (gethostname(host, sizeof(host)) < 0)
        snprintf(host, sizeof(host), "?");
    host[sizeof(host) - 1] = '\0';
    if (uname(&u) == 0)
        snprintf(kernel, sizeof(kernel), "%s %s %s %s", u.sysname, u.release, u.version, u.machine);
    else
        snprintf(kernel, sizeof(kernel), "?");
    read_first_line_field("/proc/cpuinfo", "model name", cpu, sizeof(cpu));
    snprintf(ncpu, sizeof(ncpu), "%ld", nproc);
    snprintf(pid, sizeof(pid), "%d", (int)getpid());
    read_cmdline(cmd, sizeof(cmd));
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    snprintf(start, sizeof(start), "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ", tm.tm_year + 1900,
             tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000);
    snprintf(rt, sizeof(rt), "%llu",
             (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec);
    snprintf(mono, sizeof(mono), "%llu", (unsigned long long)wo_now_ns());

    {
        const char *kv[] = {
            "format", "libwoffload trace",
            "libwoffload_version", WO_VERSION,
            "hostname", host,
            "kernel", kernel,
            "cpu", cpu[0] ? cpu : "?",
            "cpus", ncpu,
            "pid", pid,
            "cmdline", cmd,
            "start_time", start,
            "start_realtime_ns", rt,
            "start_monotonic_ns", mono,
            "clock", "CLOCK_MONOTONIC ns",
        };
        memcpy(prelude, WO_TRACE_MAGIC, 8);
        wo_put16(prelude + 8, WO_TRACE_VERSION_MAJOR);
        wo_put16(prelude + 10, WO_TRACE_VERSION_MINOR);
        wo_put32(prelude + 12, wo_crc32c(0, prelude, 12));
        memcpy(t->buf, prelude, sizeof(prelude));
        t->used = sizeof(prelude);
        if (write_kv(t, WO_TREC_HEADER, kv, WO_ARRAY_SIZE(kv) / 2) < 0)
            return -EIO;
    }
    /* The prelude and header go out at once: an empty or half-made file would
     * hide a path problem until the first flush. */
    return wo_trace_flush(t);
}

int wo_trace_open_fd(int fd, const char *label, struct wo_trace **ret)
{
    struct wo_trace *t;

    if (fd < 0 || !ret)
        return -EINVAL;
    t = calloc(1, sizeof(*t));
    if (!t)
        goto nomem;
    t->fd = fd;
    t->label = strdup(label ? label : "(fd)");
    t->buf = malloc(WBUF_SIZE);
    if (!t->label || !t->buf)
        goto nomem;
    if (write_header(t) < 0) {
        close(fd);
        free(t->label);
        free(t->buf);
        free(t);
        return -EIO;
    }
    *ret = t;
    return 0;

nomem:
    wo_error("trace %s: out of memory; recording is off", label ? label : "(fd)");
    if (t) {
        free(t->label);
        free(t->buf);
        free(t);
    }
    close(fd);
    return -ENOMEM;
}

int wo_trace_open(const char *path, struct wo_trace **ret)
{
    char eb[128];
    int fd;

    if (!path || !*path || !ret)
        return -EINVAL;
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int err = errno;
        wo_error("trace %s: cannot create: %s; recording is off (the engine goes on)", path,
                 errtext(err, eb, sizeof(eb)));
        return -err;
    }
    return wo_trace_open_fd(fd, path, ret);
}

static void put_common(uint8_t *p, const struct wo_event *ev)
{
    wo_put64(p, ev->t_ns);
    wo_put64(p + 8, ev->stream);
    wo_put32(p + 16, ev->tid);
    wo_put16(p + 20, ev->api);
    wo_put16(p + 22, 0);
}

int wo_trace_event_ids(struct wo_trace *t, const struct wo_event *ev, uint32_t id, uint32_t gen)
{
    unsigned type = ev->type, nhits = 0;
    uint32_t payload;
    uint8_t *rec, *p;

    if (!t)
        return -EINVAL;
    if (type == WO_EV_NONE || type >= WO_EV_MAX)
        return -EINVAL;
    if (type == WO_EV_LAUNCH)
        nhits = WO_MIN(ev->nhits, WO_EV_MAX_HITS);
    payload = wo_tev_size(type, nhits);
    rec = rec_begin(t, WO_TREC_EVENT, type, payload);
    if (!rec)
        return -EIO;
    p = rec + WO_TRACE_REC_HEADER;
    put_common(p, ev);
    p += WO_TEV_COMMON;
    switch (wo_tev_class(type)) {
    case WO_TEV_CLASS_A:
        wo_put64(p, ev->a.base);
        wo_put64(p + 8, ev->a.size);
        wo_put64(p + 16, ev->a.seq);
        wo_put32(p + 24, ev->a.flags);
        wo_put32(p + 28, ev->a.device);
        wo_put32(p + 32, id);
        wo_put32(p + 36, gen);
        break;
    case WO_TEV_CLASS_C:
        wo_put64(p, ev->c.dst);
        wo_put64(p + 8, ev->c.src);
        wo_put64(p + 16, ev->c.bytes);
        wo_put32(p + 24, ev->c.kind);
        wo_put32(p + 28, 0);
        break;
    case WO_TEV_CLASS_L:
        wo_put64(p, ev->l.func);
        for (int i = 0; i < 3; i++) {
            wo_put32(p + 8 + 4 * i, ev->l.grid[i]);
            wo_put32(p + 20 + 4 * i, ev->l.block[i]);
        }
        wo_put16(p + 32, (uint16_t)nhits);
        /* more hits than fit is recorded as overflow, as the ring does */
        wo_put16(p + 34, (uint16_t)(ev->overflow || ev->nhits > WO_EV_MAX_HITS));
        wo_put32(p + 36, 0);
        p += WO_TEV_L;
        for (unsigned i = 0; i < nhits; i++, p += WO_TEV_HIT) {
            wo_put32(p, ev->l.hits[i].id);
            wo_put32(p + 4, ev->l.hits[i].gen);
            wo_put64(p + 8, ev->l.hits[i].offset);
            wo_put64(p + 16, ev->l.hits[i].hi);
        }
        break;
    case WO_TEV_CLASS_G:
        wo_put64(p, ev->g.handle);
        wo_put64(p + 8, ev->g.aux);
        break;
    case WO_TEV_CLASS_P:
        wo_put32(p, ev->p.id);
        wo_put32(p + 4, ev->p.gen);
        wo_put64(p + 8, ev->p.offset);
        wo_put64(p + 16, ev->p.bytes);
        wo_put32(p + 24, ev->p.from);
        wo_put32(p + 28, ev->p.to);
        break;
    case WO_TEV_CLASS_NONE:
        break;
    }
    rec_end(t, rec, payload);
    t->events[type]++;
    t->nevents++;
    return 0;
}

int wo_trace_event(struct wo_trace *t, const struct wo_event *ev)
{
    uint32_t id = WO_TRACE_NO_ID, gen = 0;

    if (!t)
        return -EINVAL;
    if (t->failed)
        return -EIO;
    if (ev->type == WO_EV_ALLOC || ev->type == WO_EV_TAG) {
        struct wo_range r;
        /* The hook registered the range before pushing the event; by the time
         * the consumer sees it the range may be gone or its address reused,
         * so only a range with the same sequence number is the one meant.
         * A tag event's base lies inside its range (no sequence number). */
        if (wo_registry_find(ev->a.base, &r) == 0 &&
            (ev->type == WO_EV_TAG || r.seq == ev->a.seq)) {
            id = r.id;
            gen = r.gen;
        }
    }
    return wo_trace_event_ids(t, ev, id, gen);
}

static int funcs_insert(struct wo_trace *t, uint64_t func)
{
    size_t i;

    if (func == 0) {
        t->func_zero_named = 1;
        return 0;
    }
    if ((t->nfuncs + 1) * 2 > t->funcs_cap) {
        size_t ncap = t->funcs_cap ? t->funcs_cap * 2 : 256;
        uint64_t *n = calloc(ncap, sizeof(*n));
        if (!n)
            return -ENOMEM;
        for (size_t k = 0; k < t->funcs_cap; k++) {
            uint64_t f = t->funcs[k];
            if (!f)
                continue;
            for (i = (f * 0x9E3779B97F4A7C15ull) >> 20 & (ncap - 1); n[i]; i = (i + 1) & (ncap - 1))
                ;
            n[i] = f;
        }
        free(t->funcs);
        t->funcs = n;
        t->funcs_cap = ncap;
    }
    for (i = (func * 0x9E3779B97F4A7C15ull) >> 20 & (t->funcs_cap - 1); t->funcs[i];
         i = (i + 1) & (t->funcs_cap - 1))
        if (t->funcs[i] == func)
            return 0;
    t->funcs[i] = func;
    t->nfuncs++;
    return 0;
}

int wo_trace_kernel_known(const struct wo_trace *t, uint64_t func)
{
    if (!t)
        return 0;
    if (func == 0)
        return t->func_zero_named;
    if (!t->funcs_cap)
        return 0;
    for (size_t i = (func * 0x9E3779B97F4A7C15ull) >> 20 & (t->funcs_cap - 1); t->funcs[i];
         i = (i + 1) & (t->funcs_cap - 1))
        if (t->funcs[i] == func)
            return 1;
    return 0;
}

int wo_trace_kernel(struct wo_trace *t, uint64_t func, const char *name)
{
    size_t n = cut(name);
    uint32_t payload = WO_TREC_KERNEL_FIXED + (uint32_t)n;
    uint8_t *rec;

    if (!t)
        return -EINVAL;
    rec = rec_begin(t, WO_TREC_KERNEL, 0, payload);
    if (!rec)
        return -EIO;
    wo_put64(rec + WO_TRACE_REC_HEADER, func);
    wo_put16(rec + WO_TRACE_REC_HEADER + 8, (uint16_t)n);
    if (n)
        memcpy(rec + WO_TRACE_REC_HEADER + WO_TREC_KERNEL_FIXED, name, n);
    rec_end(t, rec, payload);
    /* a failed insert only means the caller may name this function again */
    funcs_insert(t, func);
    return 0;
}

int wo_trace_tag(struct wo_trace *t, const struct wo_trace_tag *tag)
{
    size_t n;
    uint32_t payload;
    uint8_t *rec, *p;

    if (!t || !tag)
        return -EINVAL;
    n = cut(tag->name);
    payload = WO_TREC_TAG_FIXED + (uint32_t)n;
    rec = rec_begin(t, WO_TREC_TAG, 0, payload);
    if (!rec)
        return -EIO;
    p = rec + WO_TRACE_REC_HEADER;
    wo_put32(p, tag->id);
    wo_put32(p + 4, tag->gen);
    wo_put64(p + 8, tag->base);
    wo_put64(p + 16, tag->offset);
    wo_put64(p + 24, tag->size);
    wo_put32(p + 32, tag->placement);
    wo_put32(p + 36, tag->rule);
    wo_put32(p + 40, tag->flags);
    wo_put16(p + 44, (uint16_t)n);
    if (n)
        memcpy(p + WO_TREC_TAG_FIXED, tag->name, n);
    rec_end(t, rec, payload);
    return 0;
}

int wo_trace_picks(struct wo_trace *t, uint64_t t_ns, const struct wo_trace_pick *pk, uint32_t n)
{
    uint32_t payload;
    uint8_t *rec, *p;

    if (!t || (n && !pk) || n > WO_TRACE_MAX_PICKS)
        return -EINVAL;
    payload = WO_TREC_PICKS_FIXED + n * WO_TREC_PICK;
    rec = rec_begin(t, WO_TREC_PICKS, 0, payload);
    if (!rec)
        return -EIO;
    p = rec + WO_TRACE_REC_HEADER;
    wo_put64(p, t_ns);
    wo_put32(p + 8, n);
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *q = p + WO_TREC_PICKS_FIXED + (size_t)i * WO_TREC_PICK;

        wo_put32(q, pk[i].id);
        wo_put32(q + 4, pk[i].gen);
        wo_put64(q + 8, pk[i].offset);
        wo_put64(q + 16, pk[i].bytes);
        wo_put32(q + 24, pk[i].n_experts);
        wo_put32(q + 28, pk[i].hot);
        wo_put64(q + 32, pk[i].regs);
        wo_put64(q + 40, pk[i].staged);
        wo_put64(q + 48, pk[i].reused);
        wo_put64(q + 56, pk[i].rows);
        wo_put64(q + 64, pk[i].resident);
        wo_put64(q + 72, pk[i].hot_rows);
        wo_put64(q + 80, pk[i].engine_rows);
    }
    rec_end(t, rec, payload);
    return 0;
}

int wo_trace_rule(struct wo_trace *t, uint32_t index, const char *name)
{
    size_t n = cut(name);
    uint32_t payload = WO_TREC_RULE_FIXED + (uint32_t)n;
    uint8_t *rec;

    if (!t)
        return -EINVAL;
    rec = rec_begin(t, WO_TREC_RULE, 0, payload);
    if (!rec)
        return -EIO;
    wo_put32(rec + WO_TRACE_REC_HEADER, index);
    wo_put16(rec + WO_TRACE_REC_HEADER + 4, (uint16_t)n);
    if (n)
        memcpy(rec + WO_TRACE_REC_HEADER + WO_TREC_RULE_FIXED, name, n);
    rec_end(t, rec, payload);
    return 0;
}

int wo_trace_info(struct wo_trace *t, const char *key, const char *value)
{
    const char *kv[2] = {key, value ? value : ""};

    if (!t || !key || !*key)
        return -EINVAL;
    return write_kv(t, WO_TREC_INFO, kv, 1);
}

int wo_trace_ok(const struct wo_trace *t)
{
    return t && !t->failed;
}

uint64_t wo_trace_nevents(const struct wo_trace *t)
{
    return t ? t->nevents : 0;
}

int wo_trace_close(struct wo_trace *t, uint64_t ring_dropped)
{
    uint32_t payload = WO_TREC_FOOTER_FIXED + 8u * WO_EV_MAX;
    uint8_t *rec;
    int r = -EIO;

    if (!t)
        return 0;
    rec = rec_begin(t, WO_TREC_FOOTER, 0, payload);
    if (rec) {
        uint8_t *p = rec + WO_TRACE_REC_HEADER;
        wo_put64(p, wo_now_ns());
        wo_put64(p + 8, ring_dropped);
        wo_put64(p + 16, t->records);
        wo_put32(p + 24, WO_EV_MAX);
        for (unsigned i = 0; i < WO_EV_MAX; i++)
            wo_put64(p + WO_TREC_FOOTER_FIXED + 8 * i, t->events[i]);
        rec_end(t, rec, payload);
        r = wo_trace_flush(t);
    }
    if (close(t->fd) < 0 && r == 0) {
        /* NFS and friends report write errors only at close */
        fail(t, errno);
        r = -EIO;
    }
    if (r == 0 && ring_dropped)
        wo_warn("trace %s: the event ring dropped %llu events; the trace misses them (raise "
                "WOFFLOAD_RING_EVENTS)",
                t->label, (unsigned long long)ring_dropped);
    free(t->funcs);
    free(t->label);
    free(t->buf);
    free(t);
    return r;
}

void wo_trace_abandon(struct wo_trace *t)
{
    if (!t)
        return;
    close(t->fd);
    free(t->funcs);
    free(t->label);
    free(t->buf);
    free(t);
}
