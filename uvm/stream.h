/* uvm/stream.h: the streaming executor (issue 18, mechanism (c): launch
 * redirection). A range placed `host` or `managed` that a step reads more
 * than once is copied, once a step, into a device staging slot on a copy
 * stream of its own, ahead of the launches that read it; the launch hook
 * (preload/redirect.c) points those launches' arguments at the slot. The
 * host copy stays the truth: a slot is a read-only duplicate, dropped when
 * a copy writes the range.
 *
 * The executor (uvm/stream.c, consumer thread) learns per range and per
 * step how many times its bytes are read (read multiplicity), decides what
 * to stream (policy prefetch.mode), owns the slots, the copy stream and the
 * events, stages ranges ahead of the engine and publishes each assignment
 * (range -> slot) in the table the hooks read (uvm/stream-table.h, the
 * launch path's hot-path header: preload/ includes that one, never this).
 * docs/prefetch.md ("Streaming") has the design and the measurements. */
#pragma once

#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/event.h"
#include "uvm/stream-table.h"

/* True for a tensor that engines gather from by index (an embedding,
 * policy/fit.c's class 5): a launch is handed the whole tensor and reads a
 * few rows, so a staging copy of all of it would move far more than the
 * reads do. Such ranges are never streamed, and fit keeps no slot room for
 * them. */
bool wo_stream_gathered(const char *name);

/* The staging slot size for ranges of these sizes: the size below which
 * 90% of their bytes lie (sizes are sorted in place). One outsized tensor
 * (an LM head twice an MLP weight) then reads in place instead of making
 * every slot twice as large. 0 for none. */
uint64_t wo_stream_slot_size(uint64_t *sizes, size_t n);

/* Sizes nslots staging slots (out[0..nslots), largest first) for ranges of
 * these sizes read in this cyclic order, none above cap: slot i gets the
 * largest i-th largest size among any nslots ranges in a row, so a window
 * of nslots ranges always finds a slot each (two expert tensors of 768 and
 * 384 MiB in turn: two slots of each, not four of 768). out, or NULL when
 * there is nothing to size by. */
uint64_t *wo_stream_size_slots(const uint64_t *sizes, size_t n, unsigned nslots, uint64_t cap,
                               uint64_t *out);

/* ---- the executor (consumer thread) ------------------------------------------ */

/* The consumer drives it as wo_stream_executor (uvm/executor.h), before the
 * prefetcher. It builds itself at the first launch after seal (policy
 * prefetch.mode; WOFFLOAD_PREFETCH=0 or prefetch.enabled false leave it
 * off); when idle it stages what the engine's position asks for. */

/* For the prefetcher (consumer thread): device bytes the slots hold (taken
 * from the device budget), and whether a range belongs to the executor
 * (then the prefetcher leaves it alone). */
uint64_t wo_stream_reserved(void);
bool wo_stream_claims(uint32_t id, uint32_t gen);

/* Per name: read multiplicity per step (bytes launches read / distinct
 * bytes read, mean over the measured steps), bytes read and staged per
 * step, and whether the range is streamed. As last published by the
 * consumer thread (at most 100 ms old). Any thread; fn runs under a lock
 * and must not call back into uvm/. */
struct wo_stream_name_stats {
    double multiplicity;    /* bytes read / distinct bytes read, per step */
    double read_per_step;   /* bytes launches read per step (in place or from a slot) */
    double range_bytes;     /* bytes of the range (what staging copies once a step) */
    double staged_per_step; /* bytes staged per step */
    uint64_t steps;         /* steps measured */
    bool host;              /* placement host (else managed) */
    bool streamed;
    bool written; /* a copy wrote it after seal: never streamed by auto */
};
void wo_stream_foreach_name(void (*fn)(void *ud, const char *name,
                                       const struct wo_stream_name_stats *st),
                            void *ud);
