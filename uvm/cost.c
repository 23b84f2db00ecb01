/* uvm/cost.c: the cost rule of residency (see cost.h and docs/prefetch.md).
 * Every figure is seconds; the rates come from the caller (a calibrated
 * device model), never from here. */
#include "uvm/cost.h"

/* enum wo_plan_how (plan.h), repeated here so this file stays free of the
 * planner's headers */
#define HOW_COLLAPSE 1u
#define HOW_COPY_BACK 2u

double wo_cost_drop_s_per_byte(const struct wo_plan_costs *c, uint32_t how)
{
    if (how == HOW_COPY_BACK)
        return c->copyback_s_per_byte;
    if (how == HOW_COLLAPSE)
        return c->collapse_s_per_byte + c->remap_s_per_byte;
    return 0;
}

double wo_cost_gain_s(const struct wo_plan_costs *c, const struct wo_cost_move *m)
{
    double per_read = c->zc_s_per_byte - c->hbm_s_per_byte;
    double saved = (m->read_bytes - m->evict_read_bytes) * m->steps * per_read;
    double spent = (double)m->calls * c->prefetch_call_s +
                   (double)m->bytes * c->prefetch_s_per_byte +
                   (double)m->bytes * wo_cost_drop_s_per_byte(c, m->how) +
                   (double)m->evict_bytes * wo_cost_drop_s_per_byte(c, m->evict_how);

    return saved - spent;
}

double wo_cost_step_s(const struct wo_plan_costs *c, double hbm_bytes, double zc_bytes,
                      uint64_t in_bytes, uint64_t calls, uint64_t collapsed, uint64_t copied_back)
{
    return hbm_bytes * c->hbm_s_per_byte + zc_bytes * c->zc_s_per_byte +
           (double)calls * c->prefetch_call_s + (double)in_bytes * c->prefetch_s_per_byte +
           (double)collapsed * wo_cost_drop_s_per_byte(c, HOW_COLLAPSE) +
           (double)copied_back * wo_cost_drop_s_per_byte(c, HOW_COPY_BACK);
}
