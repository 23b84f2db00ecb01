/* uvm/executor.h: what the consumer thread asks of an executor, the code
 * that carries out what a planner decided with one mechanism (one file per
 * mechanism):
 *   uvm/stream.c    staging into device slots + launch redirection (stream.h)
 *   uvm/prefetch.c  UVM prefetch and eviction of managed ranges (prefetch.h)
 * The consumer (uvm/consumer.c) drives them all alike, in the order of
 * wo_executors; each decides for itself, at the first launch after seal,
 * whether it runs (policy prefetch settings, WOFFLOAD_PREFETCH). What they
 * say to each other (which ranges the streaming executor takes from the
 * prefetcher, and the device bytes its slots reserve) is in their own
 * headers. */
#pragma once

#include "core/event.h"

struct wo_executor {
    const char *name;
    /* Every event, in ring order, on the consumer thread. */
    void (*on_event)(const struct wo_event *ev);
    /* When the consumer found the ring empty: issue what waited (a global
     * capture holds actions back), publish figures. */
    void (*tick)(void);
    /* Once, after the last event (exit or reset): log the summary and free,
     * with no driver call (the driver may be torn down already). */
    void (*finish)(void);
    /* In a fork child: forget the parent's executor without a driver call
     * (its streams, contexts and slots mean nothing here). */
    void (*atfork_child)(void);
};

extern const struct wo_executor wo_stream_executor;
extern const struct wo_executor wo_prefetch_executor;

/* Every executor, NULL-terminated, in the order the consumer calls them:
 * the streaming executor first, so that at the first launch after seal it
 * claims the ranges it streams before the prefetcher lists its own. */
extern const struct wo_executor *const wo_executors[];
