/* core/trace-read.c: the trace reader (docs/trace-format.md); the loader
 * that builds a whole trace's tables from it is core/trace-load.c.
 *
 * Input is untrusted: every length is checked against what remains before a
 * byte is read, a record's length bounds its parsing, every record's CRC is
 * checked before its payload is decoded, and the reader's own memory is
 * bounded (one record buffer of at most WO_TRACE_MAX_RECORD, at most
 * WO_TRACE_MAX_INFO header entries, and for gzip input one zlib stream and
 * its input buffer). Errors carry the byte offset and what was expected
 * there.
 *
 * A gzip-compressed trace (.wot.gz; recognised by the gzip magic bytes 1f 8b,
 * never by the file name) is inflated as it is read, through the same bounded
 * window: offsets are then those of the decompressed trace, and damage to the
 * gzip layer (truncation, corrupt deflate data, a wrong gzip CRC) is an error
 * like any other. This file is linked into the tools and tests only, never
 * into libwoffload.so (core/meson.build), so the shim does not need libz. */
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <zlib.h>

#include "core/trace-int.h"
#include "core/trace.h"

#define RBUF_SIZE (WO_TRACE_REC_HEADER + WO_TRACE_MAX_RECORD + WO_TRACE_REC_TRAILER)
/* Compressed bytes read from a file at a time. */
#define ZIN_SIZE (64u * 1024)

struct wo_trace_reader {
    unsigned flags;
    int fd; /* -1: memory */
    const uint8_t *mem;
    size_t memlen;
    uint8_t *buf;     /* NULL: plain memory, read in place; else a window of the trace */
    size_t buf_cap;   /* bytes at buf: RBUF_SIZE, or for gzip input as much as needed */
    uint64_t buf_off; /* trace offset of buf[0] */
    size_t buf_len;   /* valid bytes in buf */
    int eof;
    /* gzip input (either source); NULL for a plain trace */
    z_stream *z;
    uint8_t *zin;    /* file: compressed bytes read, not yet inflated */
    uint64_t zfed;   /* compressed bytes handed to zlib so far */
    int zin_eof;     /* the compressed input has ended */
    int zmember_end; /* a gzip member ended; another may follow */
    uint64_t pos;    /* offset of the next record */
    unsigned major, minor;
    int err;
    uint64_t err_off;
    char errbuf[WO_TRACE_ERR_MAX];
    int seen_header, seen_footer;
    uint64_t nrecords;
    uint64_t events[WO_EV_MAX];
    size_t ninfo;
    char *info_keys[WO_TRACE_MAX_INFO];
    char *info_vals[WO_TRACE_MAX_INFO];
    char name[UINT16_MAX + 1]; /* the current record's name */
    struct wo_trace_pick *picks; /* the current PICKS record's (WO_TRACE_MAX_PICKS) */
};

static int bad(struct wo_trace_reader *r, uint64_t off, const char *fmt, ...) WO_PRINTF(3, 4);
static int bad(struct wo_trace_reader *r, uint64_t off, const char *fmt, ...)
{
    va_list ap;
    int n;

    /* In a .gz the offsets are those of the decompressed trace: say so, or
     * someone will look for byte 1234 in the compressed file. */
    n = snprintf(r->errbuf, sizeof(r->errbuf), "offset %llu%s: ", (unsigned long long)off,
                 r->z ? " of the decompressed trace" : "");
    va_start(ap, fmt);
    vsnprintf(r->errbuf + n, sizeof(r->errbuf) - (size_t)n, fmt, ap);
    va_end(ap);
    r->err = -EBADMSG;
    r->err_off = off;
    return -EBADMSG;
}

static int read_error(struct wo_trace_reader *r, uint64_t off, int e)
{
    snprintf(r->errbuf, sizeof(r->errbuf), "offset %llu: read error: %s", (unsigned long long)off,
             strerror(e));
    r->err_off = off;
    return r->err = -EIO;
}

/* read(2) of up to n bytes: the count, 0 at the end, -errno. */
static ssize_t read_some(int fd, uint8_t *dst, size_t n)
{
    for (;;) {
        ssize_t got = read(fd, dst, n);
        if (got >= 0)
            return got;
        if (errno != EINTR)
            return -errno;
    }
}

/* Hands zlib more compressed input when it has used what it had: 0, or
 * -EIO/-errno from the file. Sets zin_eof at the input's end. */
static int gz_feed(struct wo_trace_reader *r)
{
    z_stream *z = r->z;
    size_t n;

    if (z->avail_in || r->zin_eof)
        return 0;
    if (r->fd < 0) {
        n = r->memlen - (size_t)r->zfed;
        if (n > UINT_MAX)
            n = UINT_MAX;
        z->next_in = (Bytef *)(uintptr_t)(r->mem + r->zfed);
    } else {
        ssize_t got = read_some(r->fd, r->zin, ZIN_SIZE);
        if (got < 0)
            return (int)got;
        n = (size_t)got;
        z->next_in = r->zin;
    }
    z->avail_in = (uInt)n;
    r->zfed += n;
    if (n == 0)
        r->zin_eof = 1;
    return 0;
}

static int no_memory(struct wo_trace_reader *r, uint64_t off)
{
    snprintf(r->errbuf, sizeof(r->errbuf), "offset %llu: out of memory", (unsigned long long)off);
    r->err_off = off;
    return r->err = -ENOMEM;
}

/* Inflates up to n (> 0) bytes of the trace into dst, trace offset `at`:
 * the count (0 at the clean end of the last gzip member), or -EBADMSG or
 * -ENOMEM with the error recorded, or -errno from read(2). */
static ssize_t gz_read(struct wo_trace_reader *r, uint64_t at, uint8_t *dst, size_t n)
{
    z_stream *z = r->z;
    uInt want = n > UINT_MAX ? UINT_MAX : (uInt)n;

    z->next_out = dst;
    z->avail_out = want;
    for (;;) {
        int e = gz_feed(r), ret;
        unsigned long long used;

        if (e < 0)
            return e;
        if (r->zmember_end) {
            if (!z->avail_in) /* gz_feed found the input's end: a clean end */
                return 0;
            /* gzip(1) reads concatenated members as one stream (cat a.gz
             * b.gz): a new member starts here */
            if (inflateReset(z) != Z_OK)
                return no_memory(r, at);
            r->zmember_end = 0;
        }
        ret = inflate(z, Z_NO_FLUSH);
        used = (unsigned long long)(r->zfed - z->avail_in);
        if (ret == Z_STREAM_END)
            r->zmember_end = 1;
        else if (ret == Z_MEM_ERROR)
            return no_memory(r, at);
        else if (ret == Z_BUF_ERROR && r->zin_eof) /* zlib needs input; there is none */
            return bad(r, at,
                       "truncated gzip data: the compressed input ends after %llu bytes, "
                       "inside a gzip member (its end and CRC never came: the .gz was cut short)",
                       used);
        else if (ret != Z_OK && ret != Z_BUF_ERROR && z->avail_out != want)
            /* what came out before the damage is read first: zlib
             * repeats the error on the next call, at its exact offset */
            return (ssize_t)(want - z->avail_out);
        else if (ret != Z_OK && ret != Z_BUF_ERROR)
            return bad(r, at, "corrupt gzip data at byte %llu of the compressed input (zlib: %s)",
                       used, z->msg ? z->msg : "inflate failed");
        /* whatever came out goes to the caller at once: the window asks
         * for more when it needs it */
        if (z->avail_out != want)
            return (ssize_t)(want - z->avail_out);
    }
}

/* The next bytes of the trace into dst (at most n): the count, 0 at the end,
 * -EBADMSG (error set), -ENOMEM, or -errno from read(2). */
static ssize_t fill(struct wo_trace_reader *r, uint64_t at, uint8_t *dst, size_t n)
{
    return r->z ? gz_read(r, at, dst, n) : read_some(r->fd, dst, n);
}

/* Makes bytes [off, off+n) addressable: 0 and *ret, or -ENODATA with *avail
 * the bytes that exist from off (the input ends sooner), or -EBADMSG/-EIO/
 * -ENOMEM with the error recorded. n must be at most RBUF_SIZE. */
static int need(struct wo_trace_reader *r, uint64_t off, size_t n, const uint8_t **ret,
                size_t *avail)
{
    if (!r->buf) {
        size_t have = off < r->memlen ? r->memlen - (size_t)off : 0;
        if (have < n) {
            *avail = have;
            return -ENODATA;
        }
        *ret = r->mem + off;
        return 0;
    }
    if (off < r->buf_off) /* records only move forward */
        return read_error(r, off, ESPIPE);
    if (off + n > r->buf_off + r->buf_len) {
        size_t keep = off < r->buf_off + r->buf_len ? (size_t)(r->buf_off + r->buf_len - off) : 0;
        if (keep) {
            memmove(r->buf, r->buf + (off - r->buf_off), keep);
        } else if (off > r->buf_off + r->buf_len) {
            /* skipping past the window: seek rather than read what is
             * unused (a gzip stream cannot seek: inflate and drop) */
            uint64_t at = r->buf_off + r->buf_len;
            if (!r->z && lseek(r->fd, (off_t)off, SEEK_SET) < 0)
                return read_error(r, off, errno);
            while (r->z && at < off && !r->eof) {
                ssize_t got = fill(r, at, r->buf, (size_t)WO_MIN(off - at, (uint64_t)r->buf_cap));
                if (got < 0)
                    return got == -EBADMSG || got == -ENOMEM ? (int)got
                                                             : read_error(r, at, (int)-got);
                r->eof = got == 0;
                at += (uint64_t)got;
            }
            if (r->z && at < off) { /* the input ended before off */
                r->buf_off = at;
                r->buf_len = 0;
                *avail = 0;
                return -ENODATA;
            }
        }
        r->buf_off = off;
        r->buf_len = keep;
        if (n > r->buf_cap) {
            /* gzip input: the window grows to the largest record seen */
            size_t cap = WO_MIN(WO_MAX(n, 2 * r->buf_cap), (size_t)RBUF_SIZE);
            uint8_t *nb = realloc(r->buf, cap);
            if (!nb)
                return no_memory(r, off);
            r->buf = nb;
            r->buf_cap = cap;
        }
        while (r->buf_len < n && !r->eof) {
            size_t room = r->buf_cap - r->buf_len;
            ssize_t got;
            /* a file fills the window (fewer read calls); inflating is
             * work, so a gzip stream gives what is asked, in 64 KiB steps */
            if (r->z)
                room = WO_MIN(room, WO_MAX(n - r->buf_len, (size_t)ZIN_SIZE));
            got = fill(r, off + r->buf_len, r->buf + r->buf_len, room);
            if (got < 0)
                return got == -EBADMSG || got == -ENOMEM
                           ? (int)got
                           : read_error(r, off + r->buf_len, (int)-got);
            if (got == 0)
                r->eof = 1;
            r->buf_len += (size_t)got;
        }
        if (r->buf_len < n) {
            *avail = r->buf_len;
            return -ENODATA;
        }
    }
    *ret = r->buf + (off - r->buf_off);
    return 0;
}

static int read_prelude(struct wo_trace_reader *r)
{
    const uint8_t *p;
    size_t avail = 0;
    int e = need(r, 0, WO_TRACE_PRELUDE_SIZE, &p, &avail);
    uint32_t crc;

    if (e < 0 && e != -ENODATA)
        return e; /* read error, or the gzip layer's: recorded */
    if (e < 0) {
        if (avail >= 8 && memcmp(r->buf ? r->buf : r->mem, WO_TRACE_MAGIC, 8) != 0)
            return bad(r, 0, "not a libwoffload trace (no \"WOTRACE\" magic)");
        return bad(r, avail, "truncated prelude: a trace starts with %d bytes (magic, version, CRC), "
                   "the input has %zu", WO_TRACE_PRELUDE_SIZE, avail);
    }
    if (memcmp(p, WO_TRACE_MAGIC, 8) != 0)
        return bad(r, 0, "not a libwoffload trace (no \"WOTRACE\" magic)");
    crc = wo_crc32c(0, p, 12);
    if (crc != wo_get32(p + 12))
        return bad(r, 8, "CRC mismatch in the prelude (version bytes): stored 0x%08x, computed 0x%08x",
                   wo_get32(p + 12), crc);
    r->major = wo_get16(p + 8);
    r->minor = wo_get16(p + 10);
    if (r->major != WO_TRACE_VERSION_MAJOR)
        return bad(r, 8, "trace format version %u.%u: this reader reads version %d.x", r->major,
                   r->minor, WO_TRACE_VERSION_MAJOR);
    r->pos = WO_TRACE_PRELUDE_SIZE;
    return 0;
}

/* gzip input: zlib's stream, and for a file a buffer for compressed bytes
 * (the first `have` of them, already read, in head). 0 or -ENOMEM. */
static int gz_start(struct wo_trace_reader *r, const uint8_t *head, size_t have)
{
    r->z = calloc(1, sizeof(*r->z));
    if (!r->z)
        return -ENOMEM;
    /* 16 + MAX_WBITS: a gzip wrapper (header, CRC-32, length), nothing else */
    if (inflateInit2(r->z, 16 + MAX_WBITS) != Z_OK) {
        free(r->z);
        r->z = NULL;
        return -ENOMEM;
    }
    if (r->fd >= 0) {
        r->zin = malloc(ZIN_SIZE);
        if (!r->zin)
            return -ENOMEM;
        memcpy(r->zin, head, have);
        r->z->next_in = r->zin;
        r->z->avail_in = (uInt)have;
        r->zfed = have;
    }
    return 0;
}

static int is_gzip(const uint8_t *p, size_t n)
{
    return n >= 2 && p[0] == 0x1f && p[1] == 0x8b;
}

/* Reads the first two bytes of the file (gzip or not) into the window. */
static int sniff_file(struct wo_trace_reader *r)
{
    while (r->buf_len < 2) {
        ssize_t got = read_some(r->fd, r->buf + r->buf_len, 2 - r->buf_len);
        if (got < 0)
            return read_error(r, r->buf_len, (int)-got);
        if (got == 0) {
            r->eof = 1;
            break;
        }
        r->buf_len += (size_t)got;
    }
    if (!is_gzip(r->buf, r->buf_len))
        return 0;
    r->buf_len = 0;
    r->eof = 0;
    return gz_start(r, r->buf, 2) < 0 ? no_memory(r, 0) : 0;
}

static void reader_free(struct wo_trace_reader *r)
{
    if (r->z) {
        inflateEnd(r->z);
        free(r->z);
    }
    free(r->zin);
    free(r->buf);
    free(r->picks);
    free(r);
}

/* The reader on fd (owned from here, also on failure) or on memory. */
static int reader_new(unsigned flags, int fd, const void *mem, size_t len,
                      struct wo_trace_reader **ret)
{
    struct wo_trace_reader *r = calloc(1, sizeof(*r));
    int e = 0;

    if (!r) {
        if (fd >= 0)
            close(fd);
        return -ENOMEM;
    }
    r->flags = flags;
    r->fd = fd;
    r->mem = mem;
    r->memlen = len;
    r->err_off = UINT64_MAX;
    if (fd >= 0 || is_gzip(mem, len)) {
        /* a plain file: the largest window at once (the reads fill it); a
         * gzip stream: 64 KiB, grown when a record needs more */
        r->buf_cap = fd >= 0 ? RBUF_SIZE : ZIN_SIZE;
        r->buf = malloc(r->buf_cap);
        if (!r->buf || (fd < 0 && gz_start(r, NULL, 0) < 0)) {
            if (fd >= 0)
                close(fd);
            reader_free(r);
            return -ENOMEM;
        }
    }
    *ret = r;
    if (fd >= 0 && (e = sniff_file(r)) < 0)
        return e;
    return read_prelude(r);
}

int wo_trace_reader_open(const char *path, unsigned flags, struct wo_trace_reader **ret)
{
    int fd;

    *ret = NULL;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    return reader_new(flags, fd, NULL, 0, ret);
}

int wo_trace_reader_open_mem(const void *buf, size_t len, unsigned flags,
                             struct wo_trace_reader **ret)
{
    *ret = NULL;
    if (!buf && len)
        return -EINVAL;
    return reader_new(flags, -1, buf ? buf : "", len, ret);
}

int wo_trace_reader_compressed(const struct wo_trace_reader *r)
{
    return r && r->z;
}

void wo_trace_reader_close(struct wo_trace_reader *r)
{
    if (!r)
        return;
    if (r->fd >= 0)
        close(r->fd);
    for (size_t i = 0; i < r->ninfo; i++) {
        free(r->info_keys[i]);
        free(r->info_vals[i]);
    }
    reader_free(r);
}

/* A payload of `have` bytes where the layout needs `want`: exact, unless the
 * file is a newer minor version (which may append fields this reader skips). */
static int size_ok(const struct wo_trace_reader *r, uint32_t have, uint32_t want)
{
    return have == want || (r->minor > WO_TRACE_VERSION_MINOR && have > want);
}

static int copy_name(struct wo_trace_reader *r, uint64_t off, const uint8_t *p, size_t n)
{
    if (memchr(p, 0, n))
        return bad(r, off, "name contains a NUL byte");
    memcpy(r->name, p, n);
    r->name[n] = '\0';
    return 0;
}

static int decode_kv(struct wo_trace_reader *r, uint64_t off, const uint8_t *p, uint32_t len,
                     struct wo_trace_rec *rec)
{
    uint32_t n, at = 4;

    if (len < 4)
        return bad(r, off, "key/value record of %u bytes: at least 4 (the count) expected", len);
    n = wo_get32(p);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t kl, vl;
        char *k, *v;
        if (len - at < 2)
            return bad(r, off + at, "entry %u of %u: key length expected, the record ends", i, n);
        kl = wo_get16(p + at);
        at += 2;
        if (kl == 0 || kl > WO_TRACE_MAX_KEY || len - at < kl)
            return bad(r, off + at - 2, "entry %u: key of %u bytes (1-%u expected, %u left in the record)",
                       i, kl, WO_TRACE_MAX_KEY, len - at);
        if (memchr(p + at, 0, kl))
            return bad(r, off + at, "entry %u: key contains a NUL byte", i);
        if (len - at - kl < 4)
            return bad(r, off + at + kl, "entry %u: value length expected, the record ends", i);
        vl = wo_get32(p + at + kl);
        if (vl > len - at - kl - 4)
            return bad(r, off + at + kl, "entry %u: value of %u bytes, only %u left in the record", i,
                       vl, len - at - kl - 4);
        if (memchr(p + at + kl + 4, 0, vl))
            return bad(r, off + at + kl + 4, "entry %u: value contains a NUL byte", i);
        if (r->ninfo >= WO_TRACE_MAX_INFO)
            return bad(r, off + at - 2, "more than %u header/info entries", WO_TRACE_MAX_INFO);
        k = strndup((const char *)p + at, kl);
        v = strndup((const char *)p + at + kl + 4, vl);
        if (!k || !v) {
            free(k);
            free(v);
            return r->err = -ENOMEM;
        }
        r->info_keys[r->ninfo] = k;
        r->info_vals[r->ninfo] = v;
        r->ninfo++;
        at += kl + 4 + vl;
    }
    if (!size_ok(r, len, at))
        return bad(r, off + at, "%u bytes after the last of %u entries", len - at, n);
    rec->ninfo = n;
    return 0;
}

static int decode_event(struct wo_trace_reader *r, uint64_t off, unsigned type, const uint8_t *p,
                        uint32_t len, struct wo_trace_rec *rec)
{
    struct wo_event *ev = &rec->ev;
    unsigned nhits = 0;
    uint32_t want;

    if (type == WO_EV_NONE || type >= WO_EV_MAX)
        return bad(r, off - WO_TRACE_REC_HEADER + 5, "unknown event type %u (1-%d expected)", type,
                   WO_EV_MAX - 1);
    if (type == WO_EV_LAUNCH) {
        if (len < WO_TEV_COMMON + WO_TEV_L)
            return bad(r, off, "launch event of %u bytes: at least %d expected", len,
                       WO_TEV_COMMON + WO_TEV_L);
        nhits = wo_get16(p + WO_TEV_COMMON + 32);
        if (nhits > WO_EV_MAX_HITS)
            return bad(r, off + WO_TEV_COMMON + 32, "launch event with %u hits (at most %d)", nhits,
                       WO_EV_MAX_HITS);
    }
    want = wo_tev_size(type, nhits);
    if (!size_ok(r, len, want)) {
        if (type == WO_EV_LAUNCH)
            return bad(r, off, "launch event with %u hits must be %u bytes, is %u", nhits, want, len);
        return bad(r, off, "%s event must be %u bytes, is %u", wo_ev_type_name(type), want, len);
    }
    memset(ev, 0, sizeof(*ev));
    rec->range_id = WO_TRACE_NO_ID;
    rec->range_gen = 0;
    ev->type = (uint16_t)type;
    ev->t_ns = wo_get64(p);
    ev->stream = wo_get64(p + 8);
    ev->tid = wo_get32(p + 16);
    ev->api = wo_get16(p + 20);
    p += WO_TEV_COMMON;
    switch (wo_tev_class(type)) {
    case WO_TEV_CLASS_A:
        ev->a.base = wo_get64(p);
        ev->a.size = wo_get64(p + 8);
        ev->a.seq = wo_get64(p + 16);
        ev->a.flags = wo_get32(p + 24);
        ev->a.device = wo_get32(p + 28);
        rec->range_id = wo_get32(p + 32);
        rec->range_gen = wo_get32(p + 36);
        break;
    case WO_TEV_CLASS_C:
        ev->c.dst = wo_get64(p);
        ev->c.src = wo_get64(p + 8);
        ev->c.bytes = wo_get64(p + 16);
        ev->c.kind = wo_get32(p + 24);
        break;
    case WO_TEV_CLASS_L:
        ev->l.func = wo_get64(p);
        for (int i = 0; i < 3; i++) {
            ev->l.grid[i] = wo_get32(p + 8 + 4 * i);
            ev->l.block[i] = wo_get32(p + 20 + 4 * i);
        }
        ev->nhits = (uint16_t)nhits;
        ev->overflow = wo_get16(p + 34) ? 1 : 0;
        p += WO_TEV_L;
        for (unsigned i = 0; i < nhits; i++, p += WO_TEV_HIT) {
            ev->l.hits[i].id = wo_get32(p);
            ev->l.hits[i].gen = wo_get32(p + 4);
            ev->l.hits[i].offset = wo_get64(p + 8);
            ev->l.hits[i].hi = wo_get64(p + 16);
        }
        break;
    case WO_TEV_CLASS_G:
        ev->g.handle = wo_get64(p);
        ev->g.aux = wo_get64(p + 8);
        break;
    case WO_TEV_CLASS_P:
        ev->p.id = wo_get32(p);
        ev->p.gen = wo_get32(p + 4);
        ev->p.offset = wo_get64(p + 8);
        ev->p.bytes = wo_get64(p + 16);
        ev->p.from = wo_get32(p + 24);
        ev->p.to = wo_get32(p + 28);
        break;
    case WO_TEV_CLASS_NONE:
        break;
    }
    r->events[type]++;
    return 0;
}

/* A name record: fixed part, u16 length as its last two bytes, the name. */
static int decode_named(struct wo_trace_reader *r, uint64_t off, const char *what,
                        const uint8_t *p, uint32_t len, uint32_t fixed)
{
    uint32_t n;

    if (len < fixed)
        return bad(r, off, "%s record of %u bytes: at least %u expected", what, len, fixed);
    n = wo_get16(p + fixed - 2);
    if (!size_ok(r, len, fixed + n))
        return bad(r, off + fixed - 2, "%s record: name of %u bytes needs a %u-byte record, it is %u",
                   what, n, fixed + n, len);
    return copy_name(r, off + fixed, p + fixed, n);
}

static int decode_footer(struct wo_trace_reader *r, uint64_t off, const uint8_t *p, uint32_t len,
                         struct wo_trace_rec *rec)
{
    struct wo_trace_footer *f = &rec->footer;
    uint32_t ntypes;

    if (len < WO_TREC_FOOTER_FIXED)
        return bad(r, off, "footer of %u bytes: at least %d expected", len, WO_TREC_FOOTER_FIXED);
    ntypes = wo_get32(p + 24);
    if (ntypes > 255 || !size_ok(r, len, WO_TREC_FOOTER_FIXED + 8 * ntypes))
        return bad(r, off + 24, "footer with %u event types must be %u bytes, is %u", ntypes,
                   WO_TREC_FOOTER_FIXED + 8 * WO_MIN(ntypes, 255u), len);
    memset(f, 0, sizeof(*f));
    f->t_end_ns = wo_get64(p);
    f->ring_dropped = wo_get64(p + 8);
    f->records = wo_get64(p + 16);
    if (f->records != r->nrecords)
        return bad(r, off, "the footer counts %llu records before it, the trace holds %llu: records "
                   "were lost or added", (unsigned long long)f->records,
                   (unsigned long long)r->nrecords);
    for (uint32_t i = 0; i < ntypes; i++) {
        uint64_t c = wo_get64(p + WO_TREC_FOOTER_FIXED + 8 * i);
        uint64_t have = i < WO_EV_MAX ? r->events[i] : 0;
        if (c != have)
            return bad(r, off + WO_TREC_FOOTER_FIXED + 8 * i,
                       "the footer counts %llu %s events, the trace holds %llu",
                       (unsigned long long)c, wo_ev_type_name(i), (unsigned long long)have);
        if (i < WO_EV_MAX)
            f->events[i] = c;
    }
    return 0;
}

static int at_end(struct wo_trace_reader *r)
{
    if (!r->seen_header)
        return bad(r, r->pos, "the trace ends before its header record");
    if ((r->flags & WO_TRACE_STRICT) && !r->seen_footer)
        return bad(r, r->pos, "the trace ends without a footer record (the recording did not "
                   "finish: the process was killed or the disk filled)");
    return 0;
}

/* A PICKS record: t_ns, n, then n tensors of WO_TREC_PICK bytes (or
 * WO_TREC_PICK_V1, written before the copy engine's rows: none by it; or
 * WO_TREC_PICK_V0, written before hot experts: none hot). */
static int decode_picks(struct wo_trace_reader *r, uint64_t poff, const uint8_t *p, uint32_t len,
                        struct wo_trace_rec *rec)
{
    uint32_t n, each = WO_TREC_PICK;

    if (len < WO_TREC_PICKS_FIXED)
        return bad(r, poff, "picks record of %u bytes: at least %d expected", len,
                   WO_TREC_PICKS_FIXED);
    n = wo_get32(p + 8);
    if (n > WO_TRACE_MAX_PICKS)
        return bad(r, poff + 8, "picks record of %u tensors: at most %u expected", n,
                   WO_TRACE_MAX_PICKS);
    if (n && len == WO_TREC_PICKS_FIXED + n * WO_TREC_PICK_V0)
        each = WO_TREC_PICK_V0;
    else if (n && len == WO_TREC_PICKS_FIXED + n * WO_TREC_PICK_V1)
        each = WO_TREC_PICK_V1;
    if (!size_ok(r, len, WO_TREC_PICKS_FIXED + n * each))
        return bad(r, poff, "picks record of %u bytes for %u tensors: %u expected", len, n,
                   WO_TREC_PICKS_FIXED + n * WO_TREC_PICK);
    if (n && !r->picks && !(r->picks = calloc(WO_TRACE_MAX_PICKS, sizeof(*r->picks))))
        return bad(r, poff, "out of memory for a picks record");
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *q = p + WO_TREC_PICKS_FIXED + (size_t)i * each;
        struct wo_trace_pick *k = &r->picks[i];

        k->id = wo_get32(q);
        k->gen = wo_get32(q + 4);
        k->offset = wo_get64(q + 8);
        k->bytes = wo_get64(q + 16);
        k->n_experts = wo_get32(q + 24);
        k->hot = wo_get32(q + 28);
        k->regs = wo_get64(q + 32);
        k->staged = wo_get64(q + 40);
        k->reused = wo_get64(q + 48);
        k->rows = wo_get64(q + 56);
        k->resident = wo_get64(q + 64);
        k->hot_rows = each >= WO_TREC_PICK_V1 ? wo_get64(q + 72) : 0;
        k->engine_rows = each == WO_TREC_PICK ? wo_get64(q + 80) : 0;
        if (k->hot > k->n_experts || (each == WO_TREC_PICK_V0 && k->hot))
            return bad(r, poff + WO_TREC_PICKS_FIXED + (uint64_t)i * each + 28,
                       "picks entry with %u hot experts of %u", k->hot, k->n_experts);
        if (k->hot_rows > k->rows)
            return bad(r, poff + WO_TREC_PICKS_FIXED + (uint64_t)i * each + 72,
                       "picks entry with %llu rows from hot experts of %llu rows",
                       (unsigned long long)k->hot_rows, (unsigned long long)k->rows);
        if (k->engine_rows > k->rows - k->hot_rows)
            return bad(r, poff + WO_TREC_PICKS_FIXED + (uint64_t)i * each + 80,
                       "picks entry with %llu rows by the copy engine of %llu rows not hot",
                       (unsigned long long)k->engine_rows,
                       (unsigned long long)(k->rows - k->hot_rows));
    }
    rec->picks_t_ns = wo_get64(p);
    rec->npicks = n;
    rec->picks = r->picks;
    return 0;
}

int wo_trace_next(struct wo_trace_reader *r, struct wo_trace_rec *rec)
{
    for (;;) {
        const uint8_t *h, *p;
        size_t avail = 0;
        uint32_t len, crc;
        unsigned type, sub;
        uint64_t off = r->pos, poff = off + WO_TRACE_REC_HEADER;
        int e;

        if (r->err)
            return r->err;
        e = need(r, off, WO_TRACE_REC_HEADER, &h, &avail);
        if (e < 0 && e != -ENODATA)
            return e; /* read error, or the gzip layer's: recorded */
        if (e < 0 && avail == 0)
            return at_end(r);
        if (r->seen_footer)
            return bad(r, off, "data after the footer record (the footer must come last)");
        if (e < 0)
            return bad(r, off, "truncated record header: %d bytes expected, the trace ends after %zu",
                       WO_TRACE_REC_HEADER, avail);
        len = wo_get32(h);
        type = h[4];
        sub = h[5];
        if (len > WO_TRACE_MAX_RECORD)
            return bad(r, off, "record length %u exceeds the limit of %u bytes (corrupt length)", len,
                       WO_TRACE_MAX_RECORD);
        e = need(r, off, WO_TRACE_REC_HEADER + len + WO_TRACE_REC_TRAILER, &h, &avail);
        if (e < 0 && e != -ENODATA)
            return e;
        if (e < 0)
            return bad(r, off, "truncated %s record: %d+%u+%d bytes (header, payload, CRC) expected, "
                       "the trace ends after %zu", wo_trace_rec_type_name(type),
                       WO_TRACE_REC_HEADER, len, WO_TRACE_REC_TRAILER, avail);
        crc = wo_crc32c(0, h, WO_TRACE_REC_HEADER + len);
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
        /* The fuzz target ignores record CRCs so that mutated payloads reach
         * the decoders; the corpus replay test and every other build check
         * them. */
        crc = wo_get32(h + WO_TRACE_REC_HEADER + len);
#endif
        if (crc != wo_get32(h + WO_TRACE_REC_HEADER + len))
            return bad(r, off, "CRC mismatch in a %u-byte record of type %u (%s): stored 0x%08x, "
                       "computed 0x%08x", len, type, wo_trace_rec_type_name(type),
                       wo_get32(h + WO_TRACE_REC_HEADER + len), crc);
        if (wo_get16(h + 6) != 0)
            return bad(r, off + 6, "reserved header bytes are not zero");
        p = h + WO_TRACE_REC_HEADER;
        if (!r->seen_header && type != WO_TREC_HEADER)
            return bad(r, off, "the first record must be the header, found type %u (%s)", type,
                       wo_trace_rec_type_name(type));
        if (r->seen_header && type == WO_TREC_HEADER)
            return bad(r, off, "a second header record");
        if (type != WO_TREC_EVENT && sub != 0)
            return bad(r, off + 5, "subtype %u on a %s record (0 expected)", sub,
                       wo_trace_rec_type_name(type));

        memset(rec, 0, sizeof(*rec));
        rec->type = (uint8_t)type;
        rec->offset = off;
        rec->length = len;
        switch (type) {
        case WO_TREC_HEADER:
        case WO_TREC_INFO:
            e = decode_kv(r, poff, p, len, rec);
            r->seen_header = 1;
            break;
        case WO_TREC_EVENT:
            e = decode_event(r, poff, sub, p, len, rec);
            break;
        case WO_TREC_KERNEL:
            e = decode_named(r, poff, "kernel", p, len, WO_TREC_KERNEL_FIXED);
            if (e == 0) { /* a short record has no fixed part to read */
                rec->func = wo_get64(p);
                rec->name = r->name;
            }
            break;
        case WO_TREC_TAG:
            e = decode_named(r, poff, "tag", p, len, WO_TREC_TAG_FIXED);
            if (e == 0) {
                rec->tag.id = wo_get32(p);
                rec->tag.gen = wo_get32(p + 4);
                rec->tag.base = wo_get64(p + 8);
                rec->tag.offset = wo_get64(p + 16);
                rec->tag.size = wo_get64(p + 24);
                rec->tag.placement = wo_get32(p + 32);
                rec->tag.rule = wo_get32(p + 36);
                rec->tag.flags = wo_get32(p + 40);
                rec->tag.name = r->name;
                rec->name = r->name;
            }
            break;
        case WO_TREC_RULE:
            e = decode_named(r, poff, "rule", p, len, WO_TREC_RULE_FIXED);
            if (e == 0) {
                rec->rule = wo_get32(p);
                rec->name = r->name;
            }
            break;
        case WO_TREC_FOOTER:
            e = decode_footer(r, poff, p, len, rec);
            r->seen_footer = 1;
            break;
        case WO_TREC_PICKS:
            e = decode_picks(r, poff, p, len, rec);
            break;
        default:
            if (type & 0x80) {
                /* optional record of a later writer: skip it whole */
                r->pos = off + WO_TRACE_REC_HEADER + len + WO_TRACE_REC_TRAILER;
                r->nrecords++;
                continue;
            }
            return bad(r, off + 4, "unknown record type 0x%02x (not optional: a newer format?)",
                       type);
        }
        if (e < 0)
            return e;
        r->pos = off + WO_TRACE_REC_HEADER + len + WO_TRACE_REC_TRAILER;
        if (type != WO_TREC_FOOTER)
            r->nrecords++;
        return 1;
    }
}

const char *wo_trace_reader_error(const struct wo_trace_reader *r)
{
    return r ? r->errbuf : "";
}

uint64_t wo_trace_reader_error_offset(const struct wo_trace_reader *r)
{
    return r ? r->err_off : UINT64_MAX;
}

void wo_trace_reader_version(const struct wo_trace_reader *r, unsigned *major, unsigned *minor)
{
    *major = r->major;
    *minor = r->minor;
}

size_t wo_trace_reader_ninfo(const struct wo_trace_reader *r)
{
    return r->ninfo;
}

int wo_trace_reader_info_at(const struct wo_trace_reader *r, size_t i, const char **key,
                            const char **value)
{
    if (i >= r->ninfo)
        return -ENOENT;
    *key = r->info_keys[i];
    *value = r->info_vals[i];
    return 0;
}

const char *wo_trace_reader_info(const struct wo_trace_reader *r, const char *key)
{
    for (size_t i = r->ninfo; i-- > 0;)
        if (strcmp(r->info_keys[i], key) == 0)
            return r->info_vals[i];
    return NULL;
}

int wo_trace_reader_has_footer(const struct wo_trace_reader *r)
{
    return r->seen_footer;
}
