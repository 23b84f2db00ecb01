/* uvm/executor.h: what the consumer thread asks of an executor, the code
 * that carries out what a planner decided with one mechanism (one file per
 * mechanism):
 *   uvm/stream.c    staging into device slots + launch redirection (stream.h)
 *   uvm/prefetch.c  UVM prefetch and eviction of managed ranges (prefetch.h)
 * (stream-pin.c, the pinned copies, runs under the streaming executor.)
 * The consumer (uvm/consumer.c) drives them all alike, in the order of
 * wo_executors; each decides for itself, at the first launch after seal,
 * whether it runs (policy prefetch settings, WOFFLOAD_PREFETCH). They never
 * call each other: the device budget they share (which ranges the streaming
 * executor takes from the prefetcher's planner, the device bytes its slots
 * reserve, the planner's hot set) is the planner's ledger,
 * uvm/plan-budget.h. */
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

/* Every executor, NULL-terminated, in the order the consumer calls them.
 * Either order is correct (a range the streaming executor claims after the
 * prefetcher listed it is dropped from the planner through the ledger);
 * the streaming executor goes first so that at the first launch after seal
 * it claims the ranges it streams before the prefetcher lists its own, and
 * no GPU copy is made only to be dropped. */
extern const struct wo_executor *const wo_executors[];
