/* uvm/picks-pool.h: the device buffers picked copies land in (uvm/picks.c),
 * one pool for the process shared by the engine's streams.
 *
 * A stream gets WOFFLOAD_PICKS_BUFFERS entries (b[]); the buffers behind
 * them are at most that many of the largest expert tensor staged, in all
 * (what fit plans for them, uvm/place-fit.c). A stream whose entry is empty
 * or too small, with the pool at that size, takes the least recently used
 * buffer of another stream: its stream records an event, this one waits on
 * it (cuStreamWaitEvent), so the copy into it comes after every launch
 * queued there that reads it. No host sync on either stream. Before, every
 * stream held buffers of its own: transformers' continuous batching runs
 * its steps on four streams, and a 128-expert model's picked copies held
 * 6 GiB of buffers where fit planned 1.5 (bench/results,
 * bigload-20261202-1236-moe128-f05-h200).
 *
 * Every function here runs under picks' lock except wo_pool_issued. */
#pragma once

#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>

#include "uvm/picks-copy.h"

struct wo_driver;

struct wo_pool_buf {
    CUdeviceptr dev;
    uint64_t size;
    int span; /* the span whose rows it holds, -1 none */
    uint32_t seq, gen;
    uint64_t tick;
    /* an early copy into it on the copy engine (uvm/picks-dma.h: later), its
     * job's number, that its stream has not waited for yet: 0 none. Any use
     * of the buffer waits for it first (wo_pool_buffer, lending, freeing) */
    uint32_t later;
    bool early; /* filled by an early copy, not yet read by its launch (picks.c's count) */
};

struct wo_pool_strm {
    uint64_t stream; /* 0 with used false: free */
    bool used;
    /* a per-thread default stream's: the handle names the calling thread's
     * stream, so one entry per thread that launches on it (else two threads'
     * launches would share buffers with no order between them), told apart
     * by a number each thread takes once (a pthread_t is reused after a
     * join, while the old thread's last launches may still run) */
    uint64_t thread;
    /* launches of this stream between their staging and the real launch
     * call (atomic): their buffers are not lent until the call is made,
     * for an event recorded before it would not cover it */
    unsigned issuing;
    struct wo_pool_buf b[WO_PICKS_BUFS];
};

/* stream's entry, a free one taken for it (NULL: all WO_PICKS_STREAMS in use). */
struct wo_pool_strm *wo_pool_stream(uint64_t stream);
/* Entry t's index (the marks' slot of its buffer k: index * WO_PICKS_BUFS + k). */
unsigned wo_pool_index(const struct wo_pool_strm *t);

/* The buffer of t that holds span's rows at seq now (its early copy waited
 * for on t's stream), or one for them of at
 * least need bytes (*fresh: its rows are to be copied): of t's nb entries
 * not in taken (bit k: entry k holds another span the launch reads), the
 * least recently used one, if it holds need bytes or no buffer yet (made);
 * else the least recently used of those that do; else it grown, or with
 * the pool at nb times the largest need seen, lent by another stream.
 * NULL: none (the launch reads in place).
 * *delta: device bytes allocated (+) or freed (-) by the call; *alloc: the
 * allocation's result when one failed, else CUDA_SUCCESS. */
struct wo_pool_buf *wo_pool_buffer(const struct wo_driver *d, struct wo_pool_strm *t, int span,
                                   uint32_t seq, uint64_t need, unsigned nb, unsigned taken,
                                   bool *fresh, int64_t *delta, CUresult *alloc);
/* Whether wo_pool_buffer would fill one of t's buffers not in taken that
 * already has need bytes (the least recently used entry is one: no
 * allocation; it or another holds need bytes): no growth, no lend (which
 * would make t's stream wait for another's). */
bool wo_pool_room(const struct wo_pool_strm *t, uint64_t need, unsigned nb, unsigned taken);
/* No buffer holds span's rows any more (new memory at its address). */
void wo_pool_forget_span(int span);
/* No buffer holds any span's rows (the device side set up again). */
void wo_pool_forget_all(void);
/* The engine destroys stream: its buffers wait for its work and go to the
 * next stream that asks; true when it had an entry. */
bool wo_pool_stream_gone(const struct wo_driver *d, uint64_t stream);
/* The streams that hold an entry, synchronised (give-back's). */
void wo_pool_sync_all(const struct wo_driver *d);

/* A launch of t staged into its buffers; wo_pool_issued (the same thread,
 * after the real launch call, made or failed) ends it. */
void wo_pool_issuing(struct wo_pool_strm *t);
void wo_pool_issued(void);

struct wo_pool_figs {
    uint64_t bytes;     /* device bytes of the buffers */
    uint64_t cap;       /* what they may reach: nb x the largest need seen */
    uint64_t lent;      /* buffers another stream took, by an event */
    uint64_t reclaimed; /* buffers freed for another stream's larger one */
};
void wo_pool_figs(struct wo_pool_figs *f);

/* Frees the buffers (the process's work on them done). */
void wo_pool_free(const struct wo_driver *d);
/* Forgets everything without a driver call. */
void wo_pool_reset(void);
