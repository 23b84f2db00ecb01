/* uvm/queue-probe.h: whether a stream wait on one stream holds work on another.
 *
 * A GPU feeds its engines from a few hardware queues (channels): a compute
 * queue per stream up to CUDA_DEVICE_MAX_CONNECTIONS (8 by default), and
 * copy queues shared among streams. Streams that share a queue run their
 * work in the order it was enqueued, so a stream wait at the queue's head
 * holds every stream of it, whatever stream the wait was for. The copy
 * engine's picked copies (uvm/picks-dma.h) make the engine's stream wait
 * for copies that the shim enqueues later on a copy stream: if the wait
 * and those copies meet in one queue, the engine hangs. That cannot be
 * read from the driver, so it is tried: a dry run of one job, with a wait
 * that only the host releases.
 *
 * Dry run: e copies 4 bytes from the device to pinned memory as a job
 * copies its ids (wo_ids_to_host, with the same kernel), then waits for a word only the host
 * writes; c copies 4 bytes from pinned memory to the device (as a job copies an expert), then
 * writes another word. If c's write lands while e is held, c runs apart
 * from e's wait. Either way the host then writes e's word: e is held at
 * most the probe's limit, and nothing is lost. */
#pragma once

#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>

#include "uvm/uvm.h"

struct wo_qprobe {
    uint32_t *words;       /* pinned, device-mapped: [0] e's hold, [1] c's mark */
    CUdeviceptr words_dev;
    void *host;            /* pinned scratch, 64 bytes */
    CUdeviceptr dev;       /* device scratch, 64 bytes */
    uint32_t n;            /* the last dry run's number */
};

/* A job's ids copy on the engine's stream st: n bytes from the device at
 * src to pinned host memory at dst, by the byte-copy kernel fill
 * (uvm/stream-copy.cu's wo_stream_copy, one block) when given, else by
 * cuMemcpyAsync. A kernel keeps the stream's wait after it off the copy
 * queues, where the copy stream's own copies go (uvm/picks-dma.c). */
CUresult wo_ids_to_host(const struct wo_driver *d, CUfunction fill, void *dst, CUdeviceptr src,
                        uint64_t n, CUstream st);

/* Its memory, on the caller's context; false: none (the caller gives up
 * what needs the probe). */
bool wo_qprobe_init(const struct wo_driver *d, struct wo_qprobe *p);

/* True when c runs apart from a wait on e (above); false when c's write did
 * not land within limit_ns while e was held, or a call of the dry run
 * failed on c. A wait that the driver refuses on e tells nothing: true
 * (the caller's own wait fails the same way). Not for streams under
 * capture; callers serialise the calls on one p. */
bool wo_qprobe_apart(const struct wo_driver *d, struct wo_qprobe *p, CUstream e, CUstream c,
                     CUfunction fill, uint64_t limit_ns);
