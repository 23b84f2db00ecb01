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
 * (range -> slot) in the table the hooks read (uvm/hotpath.h, the
 * launch path's hot-path header: preload/ includes that one, never this).
 * docs/prefetch.md ("Streaming") has the design and the measurements. */
#pragma once

#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/event.h"
#include "uvm/plan-stream.h"
#include "uvm/hotpath.h"

/* ---- the executor (consumer thread) ------------------------------------------ */

/* The consumer drives it as wo_stream_executor (uvm/executor.h), before the
 * prefetcher. It builds itself at the first launch after seal (policy
 * prefetch.mode; WOFFLOAD_PREFETCH=0 or prefetch.enabled false leave it
 * off); when idle it stages what the engine's position asks for. */

/* What it takes from the prefetcher (device bytes for the slots, the
 * ranges it streams) goes through uvm/plan-budget.h, never a call into
 * uvm/prefetch.c. */

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

/* The exit summary's line (WOFFLOAD_SUMMARY): what was staged, from where,
 * the copy rate of the steps that staged against the link's, and the
 * launches read in place; nothing when nothing was staged. From the
 * counters alone: also after the executor is gone. */
void wo_stream_summary(void);
