/* uvm/prefetch.h: the prefetch executor inside the shim. It runs on the
 * consumer thread (uvm/consumer.c hands it every event), feeds launches to
 * the planner (uvm/plan.h) and carries out its actions through the driver
 * table: cuMemPrefetchAsync_v2 on a stream of its own (never one of the
 * engine's), cuMemAdvise_v2 for read-mostly duplication and collapse. It
 * enqueues nothing while a stream captures (wo_captures_live > 0): actions
 * wait in a queue until the capture ends.
 * A misprediction costs speed only: UVM keeps managed memory coherent and
 * nothing here changes what a kernel reads.
 *
 * Consumer thread only, except wo_prefetch_totals() (atomics). */
#pragma once

#include "uvm/plan.h"
#include "uvm/uvm.h"

/* ---- the executor, independent of uvm/'s globals (tests drive it) -------- */

struct wo_prefetcher;

/* drv: the driver table; device: ordinal the prefetches go to. The stream is
 * created on the first action (the calling thread needs a current context;
 * ctx, when not NULL, is made current first). 0, -EINVAL, -ENOMEM. */
int wo_prefetcher_new(const struct wo_driver *drv, const struct wo_plan_cfg *cfg, int device,
                      CUcontext ctx, struct wo_prefetcher **ret);
/* on: the first action makes a context of its own on the device and issues
 * every driver call from it (a prefetch call from the engine's context holds
 * up the engine's launches while it migrates); if that fails, the engine's.
 * Off by default here; the shim turns it on (WOFFLOAD_PREFETCH_OWN_CONTEXT). */
void wo_prefetcher_own_context(struct wo_prefetcher *pf, bool on);
/* fn (NULL: none) is called before each driver call that can block for long
 * (a prefetch, an advice, a collapse), on the calling thread: the shim's
 * consumer empties its ring there (uvm/consumer.c, wo_consumer_relieve). */
void wo_prefetcher_between(struct wo_prefetcher *pf, void (*fn)(void));
/* Waits for the stream (bounded by the driver), destroys it and the context
 * of its own, frees. NULL is fine. */
void wo_prefetcher_free(struct wo_prefetcher *pf);

/* A managed range: registry (id, gen), its base address and size. Only the
 * segments added for it ([offset, offset+size) inside it, placement
 * `managed`) are ever prefetched or evicted. 0, -ENOMEM, -EINVAL. */
int wo_prefetcher_add_segment(struct wo_prefetcher *pf, uint32_t id, uint32_t gen, uint64_t base,
                              uint64_t range_size, uint64_t offset, uint64_t size, int priority,
                              bool slices);
/* Names a range for the summary (the first name given sticks). 0, -ENOENT, -ENOMEM. */
int wo_prefetcher_name(struct wo_prefetcher *pf, uint32_t id, uint32_t gen, const char *name);
/* Logs (info) per-range hits, misses, bytes moved and estimated stall, the
 * `max` ranges that stalled most first. */
void wo_prefetcher_log_ranges(const struct wo_prefetcher *pf, unsigned max);
/* One event (launches, captures, graphs, copies, frees). */
void wo_prefetcher_event(struct wo_prefetcher *pf, const struct wo_event *ev);
/* Issues queued actions once no capture is under way; call when idle. */
void wo_prefetcher_tick(struct wo_prefetcher *pf);
/* The planner (stats). */
const struct wo_plan *wo_prefetcher_plan(const struct wo_prefetcher *pf);

struct wo_prefetch_totals {
    uint64_t prefetches, prefetch_bytes;
    uint64_t evictions, evict_bytes, collapses, copy_backs;
    uint64_t deferred;   /* actions held back by a global capture */
    uint64_t errors;     /* driver calls that failed (the action is dropped) */
    uint64_t steps;
};
/* Totals since start (any thread; relaxed reads). */
void wo_prefetcher_totals(const struct wo_prefetcher *pf, struct wo_prefetch_totals *ret);

/* ---- the shim's instance ---------------------------------------------------- */

/* The consumer drives it as wo_prefetch_executor (uvm/executor.h). Before
 * seal it does nothing; at the first launch after seal it builds the
 * planner from the managed segments (wo_uvm_foreach_managed), the device
 * budget and the policy's prefetch settings, unless WOFFLOAD_PREFETCH=0 or
 * the policy's prefetch is off. At finish it logs totals and frees. */

/* What the streaming executor takes out of the planner's budget (device
 * bytes for its slots, the ranges it streams) goes through uvm/plan-budget.h,
 * where this executor registers its planner while it runs. */
/* Totals of the shim's instance (zeros when none). Any thread. */
void wo_prefetch_totals(struct wo_prefetch_totals *ret);
/* The planner's step figures (uvm/plan.h), as last published with the
 * names: the last step, the sums over all steps and their count, and the
 * device budget. Any thread; zeros before the prefetcher starts. */
struct wo_prefetch_steps {
    struct wo_plan_step last, sum;
    uint64_t steps, budget;
};
void wo_prefetch_step_figures(struct wo_prefetch_steps *ret);
/* The planner's figures per managed range (hits, misses, bytes prefetched
 * and evicted, estimated stall), as last published by the consumer thread
 * (at most 100 ms old; at exit, final). Any thread; fn runs under a lock and
 * must not call back into uvm/. */
void wo_prefetch_foreach_name(void (*fn)(void *ud, const char *name, const struct wo_plan_stats *st),
                              void *ud);
