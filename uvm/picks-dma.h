/* uvm/picks-dma.h: picked copies on the copy engine, the second way
 * uvm/picks.c moves a launch's picked experts (docs/picks.md, "Picked
 * experts").
 *
 * A kernel that copies the picked rows reads host memory over PCIe at
 * 49-51 GB/s and takes SMs; the copy engine moves large runs at 55 GB/s.
 * Its copies need the picks on the host, and the engine's thread must not
 * wait for them. So, for a launch about to read a registered tensor, the
 * engine's stream gets, right before the launch:
 *   - an async copy of the ids into pinned memory, and an event;
 *   - a wait (cuStreamWaitValue32) for the stream's flag, pinned memory,
 *     to reach this job's number;
 * and the shim's copy thread, once the event says the ids are there, reads
 * them, copies each run of consecutive picked experts on a copy stream of
 * its own, and has that stream write the flag after the copies
 * (cuStreamWriteValue32). Nothing on the engine's thread waits; the GPU
 * stream waits in order, for as long as the copies take.
 *
 * The thread polls every queued job's event (cuEventQuery), never blocks on
 * one: a job of another stream can never hold it up. On any driver failure
 * it copies with the kernels on its copy stream instead, and if even that
 * fails it writes the flag from the host: a stream never waits forever.
 *
 * The source must be memory the copy engine reads at full speed: pinned
 * host memory (placement host served pinned) as it is, or, for managed
 * memory advised to the host (llama.cpp's one model buffer), a pinned
 * mirror of the tensor that a second thread makes on first use (the host
 * memory again: `mirror_bytes` in the stats); until it is there, and once
 * anything wrote the tensor, the kernels copy.
 *
 * With hot experts (uvm/picks-hot.h, wo_hot_launch) the kernels copy the
 * hot rows from the device on the engine's stream first, and the job skips
 * those experts (j.hot): each row is copied once, by one side. */
#pragma once

#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>

#include "uvm/picks-copy.h"

/* One launch's picked copy: the kernels' arguments (what to copy, and how
 * the kernels copy it when the copy engine cannot), and where it stands. */
struct wo_dma_job {
    struct wo_picks_copy c; /* c.src: the tensor; c.dst: the buffer */
    unsigned span;          /* its picks span (index < WO_PICKS_SPANS): its mirror's */
    uint32_t rid, gen;      /* the engine allocation c.src lies in (registry id, generation) */
    uint32_t wseq;          /* the span's writes count (a mirror of an older one is stale) */
    bool pinned;            /* c.src is pinned memory: copied as it is, no mirror */
    uint64_t *rows;         /* counts the rows copied (atomic; NULL: not counted) */
    uint32_t *later;        /* NULL: the stream waits for the copies now; else it does not, and
                             * *later gets the job's number for wo_dma_wait (an early copy:
                             * a later launch reads it) */
    /* the hot experts (bit e of hot[e / 64]: wo_hot_launch), whose rows the
     * kernels copy from the device on the engine's stream: not copied here */
    uint64_t hot[WO_PICKS_EXPERTS / 64];
};

/* Enqueues the job for the launch about to go on stream (engine index ix <
 * WO_PICKS_STREAMS), starting the threads on first use with ctx and the
 * kernels mark and copy. The copy engine's source: the tensor itself when
 * pinned, else its pinned mirror, made and not written since; without one
 * a mirror is asked for. True: the stream waits for the copies; false:
 * nothing that matters was enqueued (no mirror yet, no slot, the ids too
 * large, the driver lacks stream memory operations or refused, the stream
 * shares the copy stream's work queue): copy with the kernels. fill: the
 * byte-copy kernel that copies the ids to pinned memory (NULL:
 * cuMemcpyAsync; uvm/queue-probe.h: wo_ids_to_host). */
bool wo_dma_enqueue(const struct wo_driver *d, CUcontext ctx, unsigned ix, CUstream stream,
                    const struct wo_dma_job *j, CUfunction mark, CUfunction copy, CUfunction fill);

/* Stream waits on the device for the copies of job seq of engine index ix
 * (a job enqueued with later); a wait the driver refuses is made on the
 * host, at most 10 s, and the copy engine is given up. False: not done. */
bool wo_dma_wait(const struct wo_driver *d, unsigned ix, CUstream stream, uint32_t seq);

/* The same on the host: true once job seq's copies are done (at most 10 s). */
bool wo_dma_done(unsigned ix, uint32_t seq);

/* The rescue's guard of job seq, right after its wait on stream (the launch
 * that reads its rows next): copy, the kernels' copy function, with the
 * rescue marks of index ix as its marks and seq as their generation, from
 * src (the tensor's rows) into dst (the job's buffer), one block an
 * expert. It copies nothing unless the watchdog rescued the job: the copy
 * thread held in one driver call past WOFFLOAD_PICKS_STALL_MS while the
 * engine's stream waits for it (a load or a free of another thread waiting
 * for the context's work while holding the driver's lock): its picked
 * experts are marked and its flag written from the host, and the guard
 * copies their rows. A stall, then, not a hang. A job without a guard is
 * never rescued. */
void wo_dma_guard(const struct wo_driver *d, unsigned ix, CUstream stream, uint32_t seq,
                  CUfunction copy, CUdeviceptr dst, CUdeviceptr src, uint64_t row,
                  unsigned n_experts);
/* Whether a rescued job's copies on the copy stream may still land: the
 * kernels then fill no buffer (stage reads in place instead), for a late
 * copy would overwrite it; copies on the copy engine land after them. */
bool wo_dma_rescue_pending(void);

/* Asks for the pinned mirror of span (as wo_dma_enqueue would) now, on
 * the engine's thread with its context ctx current: a mirror takes seconds
 * to make, and the first copies that want it should find it there. */
void wo_dma_mirror_ask(const struct wo_driver *d, CUcontext ctx, unsigned span, uint64_t lo,
                       uint32_t rid, uint32_t gen, uint64_t bytes, uint32_t wseq);

struct wo_dma_figs {
    uint64_t jobs;       /* copies made on the copy engine */
    uint64_t runs;       /* their cuMemcpyAsync calls (a run of consecutive experts each) */
    uint64_t bytes;      /* bytes they moved */
    uint64_t kernel;     /* jobs the kernels copied for a failure */
    uint64_t host_flags; /* flags written from the host: the driver refused the stream's write */
    uint64_t no_slot;    /* launches copied by the kernels: every slot queued, ids too large */
    uint64_t mirrors, mirror_bytes, mirror_failed; /* pinned mirrors made, held, not made */
    uint64_t mirror_dropped; /* mirrors given up: their tensor's allocation freed while copied */
    uint64_t waits_refused;  /* stream waits the driver refused: the copy engine given up */
    uint64_t stalls;         /* stall reports (WOFFLOAD_PICKS_STALL_MS; said once) */
    uint64_t rescues;        /* jobs whose rows the kernels copied on the engine's stream, the copy
                              * thread held in a driver call past WOFFLOAD_PICKS_STALL_MS */
    char stall_report[1536]; /* the report's clauses, as said ("" before one) */
    uint64_t quiesced;         /* launches copied by the kernels while a free drained the queue */
    uint64_t quiesce_timeouts; /* frees that went on with jobs still queued (QUIESCE_NS) */
    uint64_t probes;           /* engine streams probed for a work queue shared with the copies */
    uint64_t shared_queues;    /* of them sharing it: the kernels copy their rows */
    uint64_t copy_streams;     /* copy streams replaced for sharing one before any job */
};
void wo_dma_figs(struct wo_dma_figs *f);

/* At shutdown: the jobs queued are finished (each stream's flag written
 * at the end, whatever happens), the threads stop. */
void wo_dma_stop(const struct wo_driver *d);
/* After wo_dma_stop, or in a forked child (the threads are not there):
 * everything is forgotten (the pinned memory is left to the process). */
void wo_dma_reset(void);
