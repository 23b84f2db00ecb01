/* uvm/plan-budget.h: the shim's one device budget, shared by its executors
 * (issue 39). The device budget (wo_uvm_device_budget) is split between
 * two holders:
 *   - the stager (uvm/stream.c): device slots it stages ranges into, and
 *     the ranges it claims (streams) and so takes from the resident side;
 *   - the resident side (uvm/prefetch.c): the planner (uvm/plan.h) that
 *     keeps managed ranges on the GPU within what the slots leave.
 * Each executor talks to this ledger only, never to the other one: the
 * arithmetic (the planner's budget is the device budget less the reserved
 * bytes) and the hot-set question are planner calls made here, and what
 * an executor must do in response (drop a range's GPU copy, take one back,
 * run the planner's queued actions) it registers as callbacks. Either
 * side may be absent (not started, off by policy, finished): the calls
 * then do what the executors' old direct calls did without it, nothing
 * (and 0 / false for the questions).
 *
 * Pure: no clock, no driver call of its own. Consumer thread only. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

struct wo_plan;

/* What the stager answers: the device bytes its slots hold (0 when no
 * range is streamed), and whether it claims a range (then the resident
 * side leaves it alone). */
struct wo_budget_stager {
    uint64_t (*reserved)(void);
    bool (*claims)(uint32_t id, uint32_t gen);
    /* the blind launches (graph replays) its slots stayed empty through;
     * 0 once it streamed a range */
    uint64_t (*blind_unused)(void);
};

/* What the resident side does: drop a range's GPU copy and forget it
 * (the stager took it), list it again (given back), and run the actions
 * its planner queued (a smaller budget queues evictions, which must be
 * done before the slots grow into the room). */
struct wo_budget_resident {
    void (*drop)(uint32_t id, uint32_t gen);
    void (*admit)(uint32_t id, uint32_t gen);
    void (*run)(void);
};

/* The stager registers once (its answers cover "not running"). */
void wo_budget_stager(const struct wo_budget_stager *s);
/* The resident side registers its planner when it starts, and NULLs when
 * it stops (finish, fork child). */
void wo_budget_resident(struct wo_plan *plan, const struct wo_budget_resident *r);

/* ---- the resident side asks ------------------------------------------------- */

/* The device budget less the stager's reserved bytes and the picked
 * staging buffers' (wo_budget_picks_bytes; never below 0). */
uint64_t wo_budget_for_plan(void);
/* Whether the stager claims the range. */
bool wo_budget_claimed(uint32_t id, uint32_t gen);
/* Whether the stager is running, has never streamed a range, and at least
 * `launches` blind launches (graph replays, which it cannot stage through)
 * went by: the engine runs its steps as graphs, and the room fit kept for
 * the slots can go back to weights (wo_place_fit_return). */
bool wo_budget_staging_unused(uint64_t launches);
/* fit gave the room it kept for the slots back to weights: the planner's
 * budget follows the smaller device budget, and the stager streams
 * nothing from now on (its slots would take device memory past fit's
 * size; what it would have streamed is read in place). */
void wo_budget_close_staging(void);
/* Whether that happened. */
bool wo_budget_staging_closed(void);

/* ---- the stager tells ----------------------------------------------------------- */

/* It claimed a managed range: the resident side drops and forgets it, and
 * the planner's budget becomes the device budget less the reserved bytes. */
void wo_budget_take(uint32_t id, uint32_t gen);
/* It stopped streaming a managed range: the planner gets it back (new to
 * it: its frequencies are learned again), and its budget as above. */
void wo_budget_give(uint32_t id, uint32_t gen);
/* Its slots now hold `slots` bytes: the planner's budget becomes the
 * device budget less that. */
void wo_budget_reserve(uint64_t slots);
/* ---- residency, as the resident side reports it (any thread reads) ------- */

/* The resident side made all of range (id, gen)'s managed bytes resident on
 * the device (whole), or not any more. Prefetches are asynchronous: a
 * reader may find the range reported resident while its pages are still
 * on their way (reads stay correct either way). */
void wo_budget_note_resident(uint32_t id, uint32_t gen, bool whole);
/* Whether range (id, gen) was last reported wholly resident. Lock-free:
 * picked staging asks it on the engine's launch path, and reads such a
 * range in place (from device memory) instead of copying its rows. */
bool wo_budget_resident_whole(uint32_t id, uint32_t gen);
/* ---- picked staging tells (uvm/picks.h; any thread) ------------------------ */

/* Its buffers now hold bytes: they come off the planner's budget at the
 * resident side's next tick (wo_budget_tick). */
void wo_budget_picks_bytes(uint64_t bytes);
/* The resident side, each tick: when the picked staging buffers' bytes, or
 * the stager's reserved bytes, changed since it last looked, the planner's
 * budget follows. */
void wo_budget_tick(void);

/* Bytes of the range the planner keeps in its hot set (0 without a
 * planner, or for a range it does not know). */
uint64_t wo_budget_hot_bytes(uint32_t id, uint32_t gen);
