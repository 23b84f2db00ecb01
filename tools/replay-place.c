/* tools/replay-place.c: what the replayed run assumes that the recorded
 * one did not: the placement of each tag (a policy's, all on the device, or
 * the recorded ones) and the device budget. */
#include "tools/replay-int.h"

#include <stdlib.h>

#include "core/registry.h"

/* ---- placements ----------------------------------------------------------- */

/* Whether the shim could have served (and so placed) a tagged allocation.
 * Tags on memory it served are flagged in the trace. Memory it only observed
 * counts too when it was a plain allocation (cuMemAlloc, cudaMalloc): in a
 * run whose policy placed nothing (an all-GPU recording) the placeable window
 * never opened, and a policy that places something would have opened it.
 * Stream-ordered pools, VMM mappings and the engine's own managed memory are
 * never placeable (docs/placement.md). */
bool wo_replay_could_place(const struct wo_trace_tag *t, const struct wo_trace_range *tr)
{
    if (t->flags & WO_TRACE_TAG_PLACEABLE)
        return true;
    return tr && !(tr->flags & (WO_RANGE_ASYNC | WO_RANGE_VMM | WO_RANGE_ENGINE_MANAGED));
}

uint32_t wo_replay_place_of_tag(struct sim *s, const struct wo_trace_tag *t,
                                const struct wo_trace_range *tr, int *prio, bool *no_slices)
{
    struct wo_match m;

    *prio = 0;
    *no_slices = false;
    if (s->o->all_device)
        return WO_PLACE_DEVICE;
    if (!s->o->policy)
        return t->placement <= WO_TRACE_PLACE_MANAGED && t->placement ? t->placement
                                                                    : WO_PLACE_DEVICE;
    /* only memory the shim serves can change placement (design.md) */
    if (!wo_replay_could_place(t, tr))
        return WO_PLACE_DEVICE;
    if (wo_policy_match(s->o->policy, t->name, t->size, &m) < 0)
        return WO_PLACE_DEVICE;
    if (m.r) {
        *prio = m.r->priority;
        *no_slices = m.r->slices == WO_SLICES_NONE;
    }
    return m.place;
}

/* ---- the device budget ---------------------------------------------------- */

/* The device budget the recording run resolved at seal (INFO
 * `device_budget`, docs/trace-format.md); 0 when the trace has none. */
static uint64_t recorded_budget(const struct wo_trace_data *d)
{
    const char *v = wo_trace_data_info(d, "device_budget");

    return v ? strtoull(v, NULL, 10) : 0;
}

uint64_t wo_replay_budget(const struct sim *s, uint64_t managed, uint64_t devbytes)
{
    const struct wo_replay_opts *o = s->o;
    uint64_t budget;

    if (o->budget_frac > 0)
        budget = (uint64_t)((double)managed * o->budget_frac);
    else if (o->budget_bytes)
        budget = o->budget_bytes;
    else if (o->policy)
        budget = wo_policy_device_budget(o->policy, s->dm->device_bytes,
                                         s->dm->device_bytes > devbytes ? s->dm->device_bytes - devbytes : 0);
    else if (!(budget = recorded_budget(s->d)))
        budget = (s->dm->device_bytes > devbytes ? s->dm->device_bytes - devbytes : 0) / 2;
    return budget;
}
