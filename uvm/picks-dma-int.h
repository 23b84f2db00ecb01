/* uvm/picks-dma-int.h: the copy engine's state, shared by its copy thread
 * and engine side (uvm/picks-dma.c) and its watchdog (uvm/picks-watch.c);
 * defined in uvm/picks-dma-state.c. Private to those files. */
#pragma once

#include <cuda.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "uvm/picks-copy.h"
#include "uvm/picks-dma.h"
#include "uvm/queue-probe.h"

/* Jobs queued at once, all streams: llama.cpp issues a whole step (a graph replayed, 3 expert
 * tensors a layer) before the GPU reaches its first layer, so a step's every job must fit (a
 * job beyond them is copied by the kernels: no_slot) */
#define SLOTS 256u
#define IDS_MAX (64u << 10) /* ids bytes a job may have (a batch of 128 rows of 128) */
#define POLL_MIN_NS 1000l   /* the copy thread's sleep between two looks at the events, */
#define POLL_MAX_NS 32000l  /* doubled while none is ready, up to this */
#define DRAIN_NS (5ull * 1000000000ull)
#define HOST_WAIT_NS (10ull * 1000000000ull)
#define QUIESCE_NS (2ull * 1000000000ull) /* the longest a free waits for the queue */
#define PROBE_NS (500ull * 1000000ull)    /* the longest a probe waits for the copy stream */
#define PROBE_TRIES 3u /* copy streams tried while none has been found apart yet */
#define RESCUE_BYTES ((size_t)SLOTS * WO_PICKS_EXPERTS * sizeof(uint32_t)) /* 1 MiB */
#define GUARD_THREADS 256u

enum { S_FREE, S_FILLING, S_QUEUED };

struct slot {
    int state;
    CUevent ev;
    void *ids; /* pinned, IDS_MAX */
    unsigned ix;
    uint32_t seq;
    CUdeviceptr src; /* the copy engine's source: j.c.src, or its mirror */
    /* the stall report's: when the watchdog first saw this job queued
     * (the job: ix and seq then), 0 not yet */
    uint64_t seen;
    unsigned seen_ix;
    uint32_t seen_seq;
    /* the rescue's (watchdog): its guard is on the engine's stream after
     * its wait; its rows were copied so */
    bool guarded, rescued;
    struct wo_dma_job j;
};

enum { M_NONE, M_QUEUED, M_READY, M_FAILED };

struct mirror {
    int state;
    void *host;
    uint64_t lo, bytes;
    uint32_t rid, gen;   /* the engine allocation it lies in (registry id, generation) */
    uint32_t wseq, want; /* the writes count it copies / the span's now */
};

struct wo_dma_state {
    pthread_mutex_t lock;
    pthread_cond_t cv, mcv;
    const struct wo_driver *d;
    CUcontext ctx;
    CUstream copy;
    CUfunction mark, kcopy;
    uint32_t *flags; /* pinned: one per engine stream index */
    CUdeviceptr flags_dev;
    /* the rescue's marks (pinned, mapped): WO_PICKS_EXPERTS a slot; an
     * expert marked with its job's seq is copied by that job's guard */
    uint32_t *rescue;
    CUdeviceptr rescue_dev;
    struct slot *serving; /* the job the copy thread is in serve() for */
    /* rescued jobs whose copies on the copy stream may still land: no
     * buffer is filled by the kernels meanwhile (wo_dma_rescue_pending) */
    unsigned pending;
    uint32_t seq[WO_PICKS_STREAMS];
    struct slot s[SLOTS];
    unsigned queued, next_free;
    /* each engine stream's jobs in the order they were queued: its events
     * complete in that order, and its flag must rise in it */
    struct {
        unsigned ring[SLOTS];
        unsigned head, tail;
    } q[WO_PICKS_STREAMS];
    bool started, broken, stop, th_on, mth_on, said_on;
    /* the quiesce gate (wo_uvm_quiesce_begin): threads about to free that
     * hold new jobs off, and enqueues under way; atomics, Dekker-style */
    unsigned entering; /* with wo_uvm_quiescing (the gate, uvm/state.c) */
    /* for the stall report (watchdog): the driver call the copy thread (0)
     * and the mirror thread (1) are in, NULL none, and since when; since
     * when the gate has been held */
    struct {
        const char *call;
        uint64_t since;
    } doing[2];
    uint64_t gate_since;
    /* who raised the gate last (the stall report's): return address, and whether the mirrorer */
    void *gate_by;
    bool gate_mirror;
    /* the work-queue probe (probe()), serialised by plock: the engine
     * stream each index was last probed with and its verdict (written
     * under lock too: a job reads them there), and how many said apart
     * (the copy stream is kept from the first) */
    pthread_mutex_t plock;
    CUstream probed[WO_PICKS_STREAMS];
    bool probed_on[WO_PICKS_STREAMS], apart[WO_PICKS_STREAMS];
    unsigned aparts;
    struct wo_qprobe qp;
    uint32_t served[WO_PICKS_STREAMS];    /* the last job's seq served, by stream */
    uint64_t served_at[WO_PICKS_STREAMS]; /* and when (the stall report's) */
    pthread_cond_t wcv;
    pthread_t th, mth, wth;
    bool wth_on;
    struct mirror *m; /* [WO_PICKS_SPANS] */
    unsigned mq[WO_PICKS_SPANS], mhead, mtail;
    struct wo_dma_figs f;
};
/* the copy engine's state (uvm/picks-dma-state.c), under its lock unless said */
extern struct wo_dma_state wo_dm;

static inline uint64_t now_ns(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* Thread who (0 the copy thread, 1 the mirror thread) enters driver call `call` (NULL: leaves). */
static inline void doing(unsigned who, const char *call)
{
    __atomic_store_n(&wo_dm.doing[who].since, call ? now_ns() : 0, __ATOMIC_RELAXED);
    __atomic_store_n(&wo_dm.doing[who].call, call, __ATOMIC_RELEASE);
}

static inline bool reached(uint32_t have, uint32_t want)
{
    return (int32_t)(have - want) >= 0;
}

/* The experts job sl's ids pick (its ids there): pick[e] 1, else 0. */
void wo_dma_picked(const struct slot *sl, uint8_t *pick);
/* Who raised the gate, for a line ("the mirror thread", "a call from
 * cuMemFree_v2", ...: uvm/picks-watch.c). */
void wo_dma_gate_raiser(char *who, size_t cap);
/* The watchdog thread (uvm/picks-watch.c): the stall report and the rescue. */
void *wo_dma_watchdog(void *arg);
