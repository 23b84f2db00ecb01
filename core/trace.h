/* core/trace.h: recording the event stream to a file (WOFFLOAD_TRACE) and
 * reading it back (woffload-trace, woffload-replay, tests).
 *
 * The format is docs/trace-format.md: a 16-byte prelude (magic, version),
 * then self-delimiting records (u32 length, u8 type, u8 subtype, u16 zero,
 * payload, CRC-32C). Every field is written explicitly little-endian at a
 * fixed offset; nothing here ever copies a C struct to or from the file.
 *
 * Writer: one thread only (the consumer thread in the shim). It buffers and
 * writes with write(2) when the buffer fills; it never touches the ring or a
 * hook. The first failed write (ENOSPC, EIO, ...) logs one line naming the
 * path and the error and turns recording off: later calls return -EIO at the
 * cost of one branch, and the engine goes on.
 *
 * Reader: a file (read through a bounded buffer) or a memory buffer, plain
 * or gzip-compressed (recognised by the gzip magic bytes 1f 8b, not by a
 * name; inflated as it is read, with zlib). Every length is checked before it
 * is used; corruption and truncation, of the trace or of its gzip layer, give
 * -EBADMSG, the byte offset (in the decompressed trace, for a .gz) and a
 * sentence saying what was expected. Memory use is bounded by
 * WO_TRACE_MAX_RECORD plus the name tables the caller asks wo_trace_load()
 * to keep. The reader (core/trace-read.c) is linked into the tools, not into
 * libwoffload.so, which writes plain traces and needs no zlib. No CUDA here:
 * GPU facts and kernel names come in as strings from uvm/. */
#pragma once

#include <stdio.h>

#include "core/event.h"

#define WO_TRACE_MAGIC "WOTRACE\x1a"
#define WO_TRACE_VERSION_MAJOR 1
#define WO_TRACE_VERSION_MINOR 0
#define WO_TRACE_PRELUDE_SIZE 16
#define WO_TRACE_REC_HEADER 8 /* u32 length, u8 type, u8 subtype, u16 zero */
#define WO_TRACE_REC_TRAILER 4 /* CRC-32C */
/* Largest payload a reader accepts: bounds the reader's buffer. */
#define WO_TRACE_MAX_RECORD (UINT32_C(1) << 20)
/* Longest string (name, key, value) the writer stores; longer ones are cut. */
#define WO_TRACE_MAX_STRING 4096u
/* Most header/info entries a reader keeps (more is corruption). */
#define WO_TRACE_MAX_INFO 256u
/* Size of an error text buffer (reader and loader). */
#define WO_TRACE_ERR_MAX 320

/* Record types (the type byte). Types with bit 0x80 set are optional: a
 * reader that does not know one skips it; an unknown type without the bit
 * is an error (it may change the meaning of what follows). */
enum wo_trace_rec_type {
    WO_TREC_HEADER = 0x01, /* key/value strings: must be the first record */
    WO_TREC_EVENT = 0x02,  /* subtype: enum wo_ev_type */
    WO_TREC_KERNEL = 0x03, /* function handle -> kernel name */
    WO_TREC_TAG = 0x04,    /* range -> tag name, offset, size, placement */
    WO_TREC_RULE = 0x05,   /* policy rule index -> rule name */
    WO_TREC_INFO = 0x06,   /* more key/value strings (GPU facts known later) */
    WO_TREC_FOOTER = 0x07, /* counts; must be the last record */
    WO_TREC_MAX,
    /* optional (older readers skip it): picked staging's figures per expert
     * tensor, cumulative, written at step events and at the end */
    WO_TREC_PICKS = 0x81,
};

/* Placement values stored in tag records and WO_EV_PLACE events. */
enum wo_trace_place {
    WO_TRACE_PLACE_UNKNOWN = 0,
    WO_TRACE_PLACE_DEVICE = 1,
    WO_TRACE_PLACE_HOST = 2,
    WO_TRACE_PLACE_MANAGED = 3,
};

/* "no such id" in tag records and in alloc/free events whose range the
 * writer could not identify. */
#define WO_TRACE_NO_ID UINT32_MAX

/* A tag: `name` covers [offset, offset+size) of range (id, gen). */
struct wo_trace_tag {
    uint32_t id, gen;   /* registry range; WO_TRACE_NO_ID when unknown */
    uint64_t base;      /* device address of the tagged bytes */
    uint64_t offset;    /* inside the range */
    uint64_t size;
    uint32_t placement; /* enum wo_trace_place */
    uint32_t rule;      /* policy rule index, WO_TRACE_NO_ID: none */
    uint32_t flags;     /* WO_TRACE_TAG_* */
    const char *name;
};
enum { WO_TRACE_TAG_PLACEABLE = 1u << 0 };

/* One expert tensor's picked staging (uvm/picks.h), cumulative since the
 * start: a PICKS record holds every tensor with picks. */
struct wo_trace_pick {
    uint32_t id, gen;   /* registry range of the tensor's allocation */
    uint64_t offset;    /* the tensor's start inside the range */
    uint64_t bytes;     /* the tensor's */
    uint32_t n_experts; /* rows */
    uint32_t hot;       /* experts held hot on the device (WOFFLOAD_PICKS_HOT) */
    uint64_t regs;      /* registrations (a layer's: one a forward step) */
    uint64_t staged;    /* picked copies enqueued */
    uint64_t reused;    /* launches that read a buffer an earlier one filled */
    uint64_t rows;      /* rows the copies moved (as last read back from the device) */
    uint64_t resident;  /* launches that read it wholly resident: no copy */
    uint64_t hot_rows;  /* of rows, those copied from its hot experts on the device, not over
                         * the link (as last read back) */
    uint64_t engine_rows; /* of rows not hot, those the copy engine moved (WOFFLOAD_PICKS_ENGINE);
                           * the others the copy kernel read over the link */
};
/* What the stats, the exit summary and woffload-trace derive from one:
 * bytes its copies moved; bytes moved a registration (a layer registers
 * once a forward step: a step's); of them, the bytes that crossed the link
 * (not from its hot experts); the share of its experts a copy moved; of the
 * rows copied, those from hot experts; of the rows over the link, those the
 * copy engine moved; of its launches, those that read it wholly resident. */
/* A tensor's figures since base (an earlier record of it), the last
 * record's when nothing registered since: a run's steady state, without
 * the steps before its hot set was made. */
static inline struct wo_trace_pick wo_trace_pick_steady(const struct wo_trace_pick *last,
                                                        const struct wo_trace_pick *base)
{
    struct wo_trace_pick d = *last;

    if (!base || base->regs >= last->regs || base->staged + base->reused >= last->staged + last->reused)
        return d;
    d.regs = last->regs - base->regs;
    d.staged = last->staged - base->staged;
    d.reused = last->reused - base->reused;
    d.rows = last->rows >= base->rows ? last->rows - base->rows : 0;
    d.resident = last->resident >= base->resident ? last->resident - base->resident : 0;
    d.hot_rows = last->hot_rows >= base->hot_rows ? last->hot_rows - base->hot_rows : 0;
    d.engine_rows =
        last->engine_rows >= base->engine_rows ? last->engine_rows - base->engine_rows : 0;
    return d;
}
static inline uint64_t wo_trace_pick_copied(const struct wo_trace_pick *p)
{
    return p->n_experts ? p->rows * (p->bytes / p->n_experts) : 0;
}
static inline uint64_t wo_trace_pick_per_reg(const struct wo_trace_pick *p)
{
    return p->regs ? wo_trace_pick_copied(p) / p->regs : 0;
}
static inline uint64_t wo_trace_pick_linked_per_reg(const struct wo_trace_pick *p)
{
    uint64_t cold = p->rows > p->hot_rows ? p->rows - p->hot_rows : 0;
    return p->regs && p->n_experts ? cold * (p->bytes / p->n_experts) / p->regs : 0;
}
/* Of the rows over the link, the share the copy engine moved. */
static inline double wo_trace_pick_engine_rate(const struct wo_trace_pick *p)
{
    uint64_t cold = p->rows > p->hot_rows ? p->rows - p->hot_rows : 0;
    return cold ? (double)(p->engine_rows < cold ? p->engine_rows : cold) / (double)cold : 0.0;
}
static inline double wo_trace_pick_hot_rate(const struct wo_trace_pick *p)
{
    return p->rows ? (double)p->hot_rows / (double)p->rows : 0.0;
}
static inline double wo_trace_pick_picked(const struct wo_trace_pick *p)
{
    return p->staged && p->n_experts ? (double)p->rows / ((double)p->staged * p->n_experts) : 0.0;
}
static inline double wo_trace_pick_resident(const struct wo_trace_pick *p)
{
    uint64_t reads = p->staged + p->reused + p->resident;
    return reads ? (double)p->resident / (double)reads : 0.0;
}
/* Most tensors one PICKS record holds. */
#define WO_TRACE_MAX_PICKS 2048u /* 160 KiB: within the writer's 256 KiB buffer */

/* ---- writer ------------------------------------------------------------- */

struct wo_trace;

/* Creates (truncates) path, writes the prelude and the header record (host,
 * kernel, CPU, pid, start time, libwoffload version, command line). Returns 0
 * and *ret, or -errno after one log line naming the path. */
int wo_trace_open(const char *path, struct wo_trace **ret);
/* Same on an open descriptor (the trace owns it); label names it in logs. */
int wo_trace_open_fd(int fd, const char *label, struct wo_trace **ret);

/* One event. For WO_EV_ALLOC the range's (id, gen) are looked up in the
 * registry by base and sequence number (a launch's hits name ranges that
 * way); other types are written as they are. Returns 0, or -EIO once
 * recording has stopped. */
int wo_trace_event(struct wo_trace *t, const struct wo_event *ev);
/* Same with the range's (id, gen) given (alloc/free/tag events). */
int wo_trace_event_ids(struct wo_trace *t, const struct wo_event *ev, uint32_t id, uint32_t gen);

/* Name records. Strings are copied (cut at WO_TRACE_MAX_STRING bytes). */
int wo_trace_kernel(struct wo_trace *t, uint64_t func, const char *name);
/* 1 when func was already named in this trace (the consumer calls
 * cuFuncGetName only for new functions), else 0. */
int wo_trace_kernel_known(const struct wo_trace *t, uint64_t func);
int wo_trace_tag(struct wo_trace *t, const struct wo_trace_tag *tag);
int wo_trace_rule(struct wo_trace *t, uint32_t index, const char *name);
/* More header facts known only later (keys: gpu, gpu_driver, cuda_version...). */
int wo_trace_info(struct wo_trace *t, const char *key, const char *value);
/* A PICKS record: n (at most WO_TRACE_MAX_PICKS) tensors' figures at t_ns. */
int wo_trace_picks(struct wo_trace *t, uint64_t t_ns, const struct wo_trace_pick *p, uint32_t n);

/* Writes the buffer out (0 or -EIO). */
int wo_trace_flush(struct wo_trace *t);
/* 1 while recording, 0 after a write error stopped it. */
int wo_trace_ok(const struct wo_trace *t);
/* Events written so far (for stats). */
uint64_t wo_trace_nevents(const struct wo_trace *t);

/* Writes the footer (counts, ring_dropped: events the ring dropped), flushes,
 * closes. Returns 0 or -EIO; frees t either way. NULL is a no-op. */
int wo_trace_close(struct wo_trace *t, uint64_t ring_dropped);

/* In a fork child: closes the descriptor and frees t without writing (the
 * buffer and the file belong to the parent). NULL is a no-op. */
void wo_trace_abandon(struct wo_trace *t);

/* ---- reader ------------------------------------------------------------- */

struct wo_trace_footer {
    uint64_t t_end_ns;
    uint64_t ring_dropped;
    uint64_t records; /* records before the footer, header included */
    uint64_t events[WO_EV_MAX]; /* per event type */
};

/* One record as read. Strings point into the reader and stay valid until
 * the next wo_trace_next() call. */
struct wo_trace_rec {
    uint8_t type;    /* enum wo_trace_rec_type */
    uint64_t offset; /* of the record's first byte in the file */
    uint32_t length; /* payload bytes */
    /* WO_TREC_EVENT: */
    struct wo_event ev;
    uint32_t range_id, range_gen; /* alloc/free/tag events; WO_TRACE_NO_ID when unknown */
    /* WO_TREC_KERNEL: */
    uint64_t func;
    /* WO_TREC_KERNEL, WO_TREC_RULE: the name */
    const char *name;
    uint32_t rule;
    /* WO_TREC_TAG: */
    struct wo_trace_tag tag;
    /* WO_TREC_HEADER, WO_TREC_INFO: entries are added to the reader's table */
    uint32_t ninfo;
    /* WO_TREC_FOOTER */
    struct wo_trace_footer footer;
    /* WO_TREC_PICKS: npicks entries (the reader's: valid until the next
     * record), at picks_t_ns */
    uint64_t picks_t_ns;
    uint32_t npicks;
    const struct wo_trace_pick *picks;
};

struct wo_trace_reader;

enum {
    /* A trace without a footer is an error (validation). Without the flag it
     * is accepted: a killed process leaves none. */
    WO_TRACE_STRICT = 1u << 0,
};

/* Opens a trace file (plain or gzip) and reads the prelude. 0 and *ret,
 * -errno when the file cannot be opened, -EBADMSG or -EIO (with *ret set so
 * the error can be read; close it) when the prelude is wrong or unreadable. */
int wo_trace_reader_open(const char *path, unsigned flags, struct wo_trace_reader **ret);
/* The same on memory (not copied; must outlive the reader). */
int wo_trace_reader_open_mem(const void *buf, size_t len, unsigned flags,
                             struct wo_trace_reader **ret);
/* 1 when the input is gzip-compressed (offsets are then those of the
 * decompressed trace), else 0. */
int wo_trace_reader_compressed(const struct wo_trace_reader *r);
void wo_trace_reader_close(struct wo_trace_reader *r);

/* Next record: 1 and *rec, 0 at a clean end, -EBADMSG on corruption or
 * truncation, -EIO/-ENOMEM. After an error every call returns it again. */
int wo_trace_next(struct wo_trace_reader *r, struct wo_trace_rec *rec);

/* The last error: "offset 1234: record of type 2 (event) says 80 bytes, the
 * file ends after 12" or "" when none. */
const char *wo_trace_reader_error(const struct wo_trace_reader *r);
/* Byte offset the last error points at (UINT64_MAX when none). */
uint64_t wo_trace_reader_error_offset(const struct wo_trace_reader *r);
/* The file's version. */
void wo_trace_reader_version(const struct wo_trace_reader *r, unsigned *major, unsigned *minor);
/* Header and info entries read so far, in order; a later key overrides an
 * earlier one in wo_trace_reader_info(). */
size_t wo_trace_reader_ninfo(const struct wo_trace_reader *r);
int wo_trace_reader_info_at(const struct wo_trace_reader *r, size_t i, const char **key,
                            const char **value);
const char *wo_trace_reader_info(const struct wo_trace_reader *r, const char *key);
/* 1 when a footer was read. */
int wo_trace_reader_has_footer(const struct wo_trace_reader *r);

/* ---- a whole trace in memory (summary, export, replay) ------------------ */

struct wo_trace_range {
    uint32_t id, gen;
    uint64_t base, size, seq;
    uint32_t flags, device;
    uint64_t t_alloc_ns, t_free_ns; /* t_free_ns 0: never freed in the trace */
};

struct wo_trace_kernel_name {
    uint64_t func;
    char *name;
};

struct wo_trace_rule_name {
    uint32_t index;
    char *name;
};

/* An event as loaded: alloc/free/tag events also carry their range. */
struct wo_trace_ev {
    struct wo_event ev;
    uint32_t range_id, range_gen; /* WO_TRACE_NO_ID when unknown or not a range event */
};

struct wo_trace_data {
    unsigned version_major, version_minor;
    size_t ninfo;
    char **info_keys, **info_values;
    struct wo_trace_ev *events; /* in file order */
    size_t nevents;
    struct wo_trace_range *ranges; /* one per alloc event with a known range, in order */
    size_t nranges;
    size_t *range_index; /* internal: ranges sorted by (id, gen) */
    size_t *id_first;    /* internal: id_first[id]..id_first[id + 1] in range_index hold id's
                          * ranges, for id < nid (ids are the registry's, dense): NULL when
                          * they are not (wo_trace_data_range searches all of range_index) */
    size_t nid;
    struct wo_trace_kernel_name *kernels; /* sorted by func */
    size_t nkernels;
    struct wo_trace_tag *tags; /* in file order; names owned here */
    size_t ntags;
    struct wo_trace_rule_name *rules;
    size_t nrules;
    int has_footer;
    struct wo_trace_footer footer;
    /* The last PICKS record's tensors (cumulative figures), at picks_t_ns;
     * picks_base[i]: picks[i]'s figures in the first record that had its
     * last hot set (its steady state runs from there: wo_trace_pick_steady) */
    struct wo_trace_pick *picks, *picks_base;
    size_t npicks;
    uint64_t picks_t_ns;
    /* An error that ended the reading (partial data above), else "". */
    int error;
    uint64_t error_offset;
    char error_text[WO_TRACE_ERR_MAX];
};

/* Reads a whole trace. Returns 0 and *ret; -errno when the file cannot be
 * opened; -EBADMSG when it is corrupt: then *ret still holds what was read
 * before the error (and its error fields), so a tool can show both. At most
 * max_events events are kept (0: no limit); more gives -E2BIG. */
int wo_trace_load(const char *path, unsigned flags, size_t max_events, struct wo_trace_data **ret);
int wo_trace_load_mem(const void *buf, size_t len, unsigned flags, size_t max_events,
                      struct wo_trace_data **ret);
void wo_trace_data_free(struct wo_trace_data *d);
/* The kernel name of func, or NULL. */
const char *wo_trace_data_kernel(const struct wo_trace_data *d, uint64_t func);
/* The range (id, gen) ((id, gen) is unique in a process), or NULL. */
const struct wo_trace_range *wo_trace_data_range(const struct wo_trace_data *d, uint32_t id,
                                                 uint32_t gen);
const char *wo_trace_data_info(const struct wo_trace_data *d, const char *key);

/* ---- shared helpers ------------------------------------------------------ */

/* CRC-32C (Castagnoli), as stored in every record. */
uint32_t wo_crc32c(uint32_t crc, const void *buf, size_t len);
/* "launch", "alloc", ... ("?" when out of range). */
const char *wo_ev_type_name(unsigned type);
const char *wo_trace_rec_type_name(unsigned type);
const char *wo_trace_place_name(unsigned place);
