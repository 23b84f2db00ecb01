/* uvm/stream-pin.h: pinned copies of managed ranges, the streaming
 * executor's staging source (docs/prefetch.md, "Pinned copies").
 *
 * A `host` placement of memory the engine allocated in the placeable window
 * is managed memory advised to the host (docs/placement.md): the copy engine
 * moves it at 7-9 GB/s on the lent H100, so uvm/stream.c stages it with a
 * copy kernel of its own, at 50 GB/s at most (0.91x of the copy engine),
 * and that kernel takes SMs from the engine. A pinned copy of the range's
 * staged bytes, made once, lets every later staging copy run on the copy
 * engine (55 GB/s, no SM). It costs host memory (the range's bytes again)
 * and pinning time (about 0.3 s per GiB on the lent H100), both paid on a
 * worker thread of its own while the executor keeps staging by kernel.
 *
 * The managed range stays the truth: a copy that writes the range drops its
 * pinned copy with its slot (the executor never stages a written range
 * again), and a launch that is not redirected still reads the managed
 * memory in place. A pinned copy is never written after it is made.
 *
 * Thread use: wo_pin_* are called by the consumer thread (the executor);
 * the worker thread pins and unpins. */
#pragma once

#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>

#include "uvm/uvm.h"

/* policy prefetch.pinned_copies: `auto` keeps MemAvailable above the larger
 * of these after each copy */
#define WO_PIN_KEEP_AVAILABLE ((uint64_t)4 << 30)
#define WO_PIN_KEEP_AVAILABLE_PCT 10

/* The bytes `auto` may still pin given MemAvailable and MemTotal (the rule
 * the worker applies and woffload doctor reports). */
static inline uint64_t wo_pin_auto_room(uint64_t avail, uint64_t total)
{
    uint64_t keep = total / 100 * WO_PIN_KEEP_AVAILABLE_PCT;

    if (keep < WO_PIN_KEEP_AVAILABLE)
        keep = WO_PIN_KEEP_AVAILABLE;
    return avail > keep ? avail - keep : 0;
}

struct wo_pin_counts {
    uint64_t held, bytes;   /* pinned copies held now, and their bytes */
    uint64_t made;          /* copies made since start */
    uint64_t failed;        /* pinning failed (the memlock limit, the driver) */
    uint64_t over_budget;   /* not made: the host memory pinned_copies allows was used */
    uint64_t retired;       /* dropped: the range was written or freed */
    uint64_t pin_ns;        /* worker time making them (pin + copy) */
};

/* Starts the worker for the executor's context ctx; limit: the policy's
 * prefetch.pinned_copies (WO_PIN_COPIES_AUTO, 0 = off, else bytes). False
 * when off or the driver lacks what it needs (then nothing is pinned). */
bool wo_pin_start(const struct wo_driver *d, CUcontext ctx, uint64_t limit);

/* The pinned copy of span id (hotpath.h; of the allocation with registry id
 * rid, generation gen), bytes [src, src+bytes) of it, as a device pointer,
 * or 0: none yet (then one is asked for, unless it failed or the budget is
 * spent). */
CUdeviceptr wo_pin_source(uint32_t id, uint32_t rid, uint32_t gen, uint64_t src, uint64_t bytes);

/* The range is gone or was written: its pinned copy is never handed out
 * again, and is freed once the copies already issued from it are done (the
 * next wo_pin_tick records one event on copy_stream for all retired since). */
void wo_pin_retire(uint32_t id);

/* Every pinned copy is freed after copy_stream's work (the executor gives
 * its slots back); the worker stays for later ranges. */
void wo_pin_retire_all(CUstream copy_stream);

/* No pinned copy is handed out or made again (a blind launch may have
 * written the ranges: docs/prefetch.md, Blind launches): every one is
 * retired as wo_pin_retire_all does, and wo_pin_start refuses. The worker
 * stays, to free them. */
void wo_pin_close(CUstream copy_stream);

/* Hands retired copies the driver was too busy to fence before (a
 * capture) to the worker. */
void wo_pin_tick(CUstream copy_stream);

void wo_pin_counts(struct wo_pin_counts *ret);

/* In a forked child: the worker thread is not there; the parent's copies
 * are forgotten (never freed here) and none is made. */
void wo_pin_atfork_child(void);

/* At exit: the worker stops; no driver call (the memory goes with the
 * process). */
void wo_pin_stop(void);
