/* uvm/plan-budget.c: the device budget the executors share (plan-budget.h).
 * Kept apart from both executors so that neither calls the other: each
 * reaches the other's state only through what it registered here. */
#include "uvm/plan-budget.h"

#include <stddef.h>

#include "core/macro.h"
#include "uvm/hotpath.h"
#include "uvm/internal.h"
#include "uvm/plan.h"

static const struct wo_budget_stager *stager;
/* gen + 1 of the range wholly resident under each registry id, 0 none */
static uint32_t resident_gen[WO_STREAM_IDS];
static uint64_t picks_bytes; /* picked staging's buffers (any thread writes) */
static uint64_t picks_seen;  /* ... at the last set */
static uint64_t stager_seen; /* the stager's reserved bytes at the last set */
static const struct wo_budget_resident *resident;
static struct wo_plan *plan;
static bool staging_closed; /* fit's room for the slots went back to weights */

void wo_budget_stager(const struct wo_budget_stager *s)
{
    stager = s;
    staging_closed = false; /* a new instance (reset, fork child) */
}

static uint64_t reserved(void)
{
    return stager ? stager->reserved() : 0;
}

void wo_budget_resident(struct wo_plan *p, const struct wo_budget_resident *r)
{
    plan = p;
    resident = p ? r : NULL;
    /* the planner was made with the budget less this (wo_budget_for_plan) */
    stager_seen = reserved();
}

static uint64_t less(uint64_t bytes)
{
    uint64_t budget = wo_uvm_device_budget();

    return budget - WO_MIN(bytes, budget);
}

uint64_t wo_budget_for_plan(void)
{
    return less(reserved() + __atomic_load_n(&picks_bytes, __ATOMIC_RELAXED));
}

bool wo_budget_staging_unused(uint64_t launches)
{
    return stager && stager->blind_unused && stager->blind_unused() >= launches;
}

bool wo_budget_claimed(uint32_t id, uint32_t gen)
{
    return stager && stager->claims(id, gen);
}

/* The planner's budget changed: its evictions go out at once. now: the
 * stager's reserved bytes now (what the next tick compares with). */
static void set(uint64_t bytes, uint64_t now)
{
    picks_seen = __atomic_load_n(&picks_bytes, __ATOMIC_RELAXED);
    stager_seen = now;
    wo_plan_set_budget(plan, less(bytes + picks_seen));
    resident->run();
}

void wo_budget_note_resident(uint32_t id, uint32_t gen, bool whole)
{
    if (id < WO_STREAM_IDS)
        __atomic_store_n(&resident_gen[id], whole ? gen + 1 : 0, __ATOMIC_RELEASE);
}

bool wo_budget_resident_whole(uint32_t id, uint32_t gen)
{
    return id < WO_STREAM_IDS && __atomic_load_n(&resident_gen[id], __ATOMIC_ACQUIRE) == gen + 1;
}

void wo_budget_picks_bytes(uint64_t bytes)
{
    __atomic_store_n(&picks_bytes, bytes, __ATOMIC_RELAXED);
}

/* The stager's reserved bytes change without a call here when its first
 * host range is streamed (a host range is not the planner's: no take): its
 * slots then count from the next tick on. Without this the planner kept
 * its budget without them: under fit at llama-server's -ot memory the lent
 * output.weight was moved in and never evicted while the slots were busy,
 * 1.063x the fit size (bench/results/llamacpp-serve-20261207b-p32-lag-h100;
 * not yet run again with the tick). */
void wo_budget_tick(void)
{
    uint64_t r;

    if (!plan)
        return;
    r = reserved();
    if (__atomic_load_n(&picks_bytes, __ATOMIC_RELAXED) != picks_seen || r != stager_seen)
        set(r, r);
}

/* reserved is read before the resident side acts, as the stager's own
 * figure at the moment it decided */
void wo_budget_take(uint32_t id, uint32_t gen)
{
    uint64_t r = reserved();

    if (!plan)
        return;
    resident->drop(id, gen);
    set(r, r);
}

void wo_budget_give(uint32_t id, uint32_t gen)
{
    uint64_t r = reserved();

    if (!plan)
        return;
    resident->admit(id, gen);
    set(r, r);
}

void wo_budget_reserve(uint64_t slots)
{
    if (plan)
        set(slots, reserved());
}

void wo_budget_close_staging(void)
{
    uint64_t r = reserved();

    staging_closed = true;
    if (plan)
        set(r, r);
}

bool wo_budget_staging_closed(void)
{
    return staging_closed;
}

uint64_t wo_budget_hot_bytes(uint32_t id, uint32_t gen)
{
    return plan ? wo_plan_hot_bytes(plan, id, gen) : 0;
}
