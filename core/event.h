/* core/event.h: the event record that flows from the hooks (producers, any
 * thread) through a bounded lock-free ring to one consumer thread, and, in the
 * same shape, into traces (docs/trace-format.md) and replay.
 *
 * Producers never block: a full ring drops the event and counts it. */
#pragma once

#include "core/macro.h"

enum wo_ev_type {
    WO_EV_NONE = 0,
    WO_EV_ALLOC,         /* a: base size flags device seq */
    WO_EV_FREE,          /* a: base size seq */
    WO_EV_TAG,           /* a: base size; name in the name table (trace) */
    WO_EV_COPY,          /* c: dst src bytes kind stream */
    WO_EV_LAUNCH,        /* l: stream func grid block hits[] */
    WO_EV_SYNC,          /* s: stream (0: device/context) */
    WO_EV_CAPTURE_BEGIN, /* g: stream mode */
    WO_EV_CAPTURE_END,   /* g: stream graph */
    WO_EV_GRAPH_INSTANTIATE, /* g: graph exec */
    WO_EV_GRAPH_LAUNCH,  /* g: exec stream */
    WO_EV_PLACE,         /* p: range placement from to bytes */
    WO_EV_PREFETCH,      /* p: range offset bytes to */
    WO_EV_EVICT,         /* p: range offset bytes how */
    WO_EV_SEAL,
    WO_EV_STEP,          /* a step boundary found by the prefetcher */
    WO_EV_MAX
};

/* Copy kinds (WO_EV_COPY .kind). */
enum { WO_COPY_H2D = 1, WO_COPY_D2H = 2, WO_COPY_D2D = 3, WO_COPY_DEFAULT = 4, WO_COPY_H2H = 5 };

#define WO_EV_MAX_HITS 8

struct wo_ev_hit {
    uint32_t id;     /* registry range id */
    uint32_t gen;
    uint64_t offset; /* lowest offset seen in this range */
    uint64_t hi;     /* highest offset seen + 1 (span of the pointers found) */
};

/* Whether a hit on a weight can be a pointer to it. The scan takes every
 * 8-byte parameter word whose value falls in a registered range, and some
 * are not pointers: in a trace of transformers' continuous batching
 * (tests/traces/h200-cb-moe32-uniform-gpu.wot.gz) two kernels passed a
 * constant word that fell 0x1be82879 bytes into a 768 MiB expert tensor,
 * 15,904 times. Taken as a read, that word made the planner and the replay
 * learn an odd slice size (a gcd) for the tensor and charge one launch a
 * step 239 bytes of it instead of the whole tensor; redirected by the
 * streaming executor, it would hand the kernel a slot's address. A weight
 * a kernel is handed starts at an element of storage aligned to 512 bytes,
 * and engines slice weights at rows or experts: so the users of hits on
 * weights (placed ranges: the planner, the streaming executor, the
 * replay, the per-name counts) take only words aligned to 16 bytes. A
 * non-pointer word slips through when it happens to be aligned (1 in 16);
 * a real pointer that is not aligned is not seen (read in place, correct).
 * A hit counts when either end of its span of words ([offset, hi - 1]) is
 * aligned. Untagged memory (activations: byte masks are read at odd
 * addresses) is not filtered. */
#define WO_PTR_ALIGN 16u
static inline bool wo_ptr_aligned(uint64_t v)
{
    return (v & (WO_PTR_ALIGN - 1)) == 0;
}

static inline bool wo_hit_pointer_like(const struct wo_ev_hit *h)
{
    return wo_ptr_aligned(h->offset) || (h->hi > h->offset && wo_ptr_aligned(h->hi - 1));
}

struct wo_event {
    uint64_t t_ns;  /* CLOCK_MONOTONIC */
    uint16_t type;  /* enum wo_ev_type */
    uint16_t nhits; /* launches: hits used; more than WO_EV_MAX_HITS sets overflow */
    uint16_t overflow;
    uint16_t api;   /* which entry point produced it (preload/'s enum), for stats */
    uint32_t tid;
    union {
        uint32_t pad;
        /* WO_EV_LAUNCH: the capture id (preload/capture.c) when the launch was
         * recorded into a stream capture instead of run; 0 otherwise. The
         * CAPTURE_BEGIN carries the same id in g.handle (g.aux: mode),
         * CAPTURE_END in g.aux (g.handle: the graph). */
        uint32_t capture;
    };
    uint64_t stream;
    union {
        struct {
            uint64_t base, size, seq;
            uint32_t flags, device;
        } a;
        struct {
            uint64_t dst, src, bytes;
            uint32_t kind, pad;
        } c;
        struct {
            uint64_t func;
            uint32_t grid[3], block[3];
            struct wo_ev_hit hits[WO_EV_MAX_HITS];
        } l;
        struct {
            uint64_t handle; /* graph or graph exec */
            uint64_t aux;    /* capture mode, or the graph an exec came from */
        } g;
        struct {
            uint32_t id, gen;
            uint64_t offset, bytes;
            uint32_t from, to; /* placements or locations */
        } p;
    };
};

/* The bounded multi-producer single-consumer ring. */
struct wo_ring;

/* capacity: power of two. Returns NULL on allocation failure. */
struct wo_ring *wo_ring_new(uint32_t capacity);
void wo_ring_free(struct wo_ring *r);
/* Lock-free, wait-free for producers apart from a bounded CAS retry;
 * 0 or -ENOSPC (dropped, counted). */
int wo_ring_push(struct wo_ring *r, const struct wo_event *ev);
/* The same for an event of low priority: also refused (dropped, counted)
 * while the ring is three quarters full or more. */
int wo_ring_push_low(struct wo_ring *r, const struct wo_event *ev);
/* Single consumer: 1 and *ev, or 0 when empty. */
int wo_ring_pop(struct wo_ring *r, struct wo_event *ev);
uint64_t wo_ring_dropped(const struct wo_ring *r);
uint64_t wo_ring_pushed(const struct wo_ring *r);
uint64_t wo_ring_capacity(const struct wo_ring *r);

/* CLOCK_MONOTONIC in ns (vDSO: no syscall). */
uint64_t wo_now_ns(void);
