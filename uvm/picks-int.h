/* uvm/picks-int.h: picked staging's state (uvm/picks.c), shared by the
 * files of that module only: picks.c and picks-report.c. */
#pragma once

#include <cuda.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "uvm/picks-copy.h"
#include "uvm/picks-hot.h"
#include "uvm/picks-kern.h"
#include "uvm/picks.h"

struct span {
    uint64_t lo, hi;    /* the tensor: [lo, hi) */
    uint64_t off;       /* lo - its registry range's base */
    uint64_t row;       /* (hi - lo) / n_experts */
    uint32_t rid, rgen; /* its registry range */
    unsigned n_experts;
    bool offdev;    /* host or managed: staged; on the device: left alone */
    uint8_t source; /* what the copy engine may copy from: SRC_* */
    uint8_t share;  /* percent of its experts the registration's ids pick (wo_picks_share_pct) */
    bool whole;     /* left to the streaming executor (wo_picks_whole_of; picks.c, whole) */
    uint32_t wseq;  /* writes into it (a pinned mirror holds one count's bytes) */
    uint64_t ids, n_ids;      /* the registration now; ids 0: none */
    uint64_t per_row, stride; /* the ids' rows (wo_picks_set) */
    bool sticky;              /* claimed from its first registration on (wo_picks_claims) */
    unsigned width;
    pthread_t owner; /* the thread that registered it: only its launches use it (another
                      * thread's forward of the same layer may be under way) */
    uint32_t seq;    /* registrations and writes: a buffer holds one seq's rows */
    uint32_t ran;    /* the seq its launch last read at (early copies skip it then) */
    int next;        /* the span whose staged launch followed its own last, -1 none */
    char *name;
    uint64_t regs, staged, reused, resident;
    struct wo_picks_hot *hot;    /* its hot experts on the device (WOFFLOAD_PICKS_HOT), NULL none */
    bool hot_tried;              /* no hot set for it (no room, or a driver failure) */
    bool stale;                  /* its placement changed (wo_picks_moved): learnt again at
                                  * the next registration */
    bool ondev;                  /* on the device when learnt: never staged (fit's tensors
                                  * the hook registers all the same); left out of the report */
    struct wo_picks_kerns kerns; /* the kernels whose launches it served */
};

/* The copy engine's source for a span (uvm/picks-dma.h): none (managed
 * placement, the prefetcher's; late bound), the tensor itself (pinned host
 * memory), or a pinned mirror of it (managed memory advised to the host). */
enum { SRC_NONE, SRC_PINNED, SRC_MIRROR };

struct wo_picks_state {
    pthread_mutex_t lock;
    struct span *s;
    unsigned n;
    CUcontext ctx;
    CUmodule mod;
    CUfunction mark, copy, fill;
    bool ready, broken;
    CUdeviceptr marks;   /* u32 [WO_PICKS_STREAMS * WO_PICKS_BUFS][WO_PICKS_EXPERTS] */
    CUdeviceptr rows;    /* u64 [2][WO_PICKS_SPANS]: rows copied, by span; of them from hot sets */
    uint64_t *rows_host; /* the same, as last read back */
    uint64_t dma_rows[WO_PICKS_SPANS]; /* rows the copy engine copied, by span (atomic) */
    CUstream side;                     /* reads rows back, no engine stream waits on it */
    uint64_t last_refresh_ns;
    uint64_t tick;
    uint64_t bytes;      /* device bytes of the buffers and the hot sets */
    uint64_t hot_bytes;  /* of them, the hot sets' */
    uint64_t fills_gone; /* rows copied into hot sets since freed */
    uint64_t given_back; /* hot sets' bytes given back when the engine ran out of memory */
    struct wo_picks_hot
        *retired[WO_PICKS_SPANS]; /* hot sets of tensors gone (freed with the rest) */
    unsigned nretired;
    struct wo_picks_counts c; /* the report's counts (uvm/picks.h) */
    bool said_on, said_fail, said_hot;
};

extern struct wo_picks_state wo_pk;
