/* uvm/cost.h: the one cost rule of residency (docs/prefetch.md, "The cost
 * rule"): whether bringing bytes onto the GPU pays against reading them in
 * place, at the machine's rates. Pure arithmetic, no CUDA, no state: the
 * shim's planner (uvm/plan.c) and the replay tool (tools/replay.c) call the
 * same functions with the same rates (uvm/devmodel.c fills them from a
 * calibrated model file; the shim from WOFFLOAD_DEVICE_MODEL or the
 * defaults of device-facts.md). */
#pragma once

#include <stdint.h>

/* The device figures decisions are weighed with (seconds per byte and
 * seconds). */
struct wo_plan_costs {
    double hbm_s_per_byte;      /* kernel reading device-resident memory */
    double zc_s_per_byte;       /* kernel reading host memory in place (and a managed miss) */
    double prefetch_s_per_byte; /* cuMemPrefetchAsync host->GPU in large pieces */
    double prefetch_call_s;     /* CPU time inside one prefetch call */
    double copyback_s_per_byte; /* eviction by prefetch to host */
    double collapse_s_per_byte; /* eviction by read-mostly collapse */
    double remap_s_per_byte;    /* a collapsed piece mapped for the GPU again (accessed-by);
                                 * 0: not known, not charged */
};

/* How a piece leaves the GPU (enum wo_plan_how in plan.h: 1 collapse,
 * 2 copy-back); 0: it is not dropped (it stays until the run ends). */
enum { WO_COST_STAYS = 0 };

/* One move the planner considers: `bytes` brought in (0 for a piece
 * already resident: its move is paid), read `read_bytes` a step (accesses
 * per step x bytes touched each: multiplicity counted) for `steps` steps,
 * then dropped by `how` (WO_COST_STAYS: kept); its load forces
 * `evict_bytes` of other pieces out by `evict_how`, which read
 * `evict_read_bytes` a step and are read in place from then on. */
struct wo_cost_move {
    uint64_t bytes;
    double read_bytes;
    double steps;
    uint32_t how;
    uint64_t evict_bytes;
    uint32_t evict_how;
    double evict_read_bytes;
    uint32_t calls; /* prefetch calls the move takes (1 for a piece; 0 with bytes 0) */
};

/* Seconds of link and UVM time one byte's drop costs by `how`. */
double wo_cost_drop_s_per_byte(const struct wo_plan_costs *c, uint32_t how);

/* THE rule: seconds the move saves over its residency less the seconds it
 * costs. Saved: the in-place reads it turns into HBM reads, (zc - hbm) x
 * read_bytes x steps, less the victims' reads it turns back into in-place
 * ones over the same steps. Cost: the prefetch (calls and bytes), its own
 * drop at the end and the victims' drops now. A move pays when the result
 * is > 0. For a piece already resident (bytes 0) it is what keeping it
 * saves: the score a hot set ranks incumbents by, against rivals that
 * still pay their move (that difference is the hysteresis). */
double wo_cost_gain_s(const struct wo_plan_costs *c, const struct wo_cost_move *m);

/* The planner's prediction of a step's reads of managed memory and its
 * moves, in seconds: hbm_bytes read on the GPU, zc_bytes read in place,
 * in_bytes prefetched in `calls` calls, collapsed / copied-back bytes
 * dropped. The moves are charged on top of the reads, not overlapped with
 * them: UVM work serialises (device-facts.md) and a prefetch shares the
 * link with the in-place reads, which is how a cycling run lost to `host`
 * (issue 22). Reading everything in place is
 * wo_cost_step_s(c, 0, all bytes read, 0, 0, 0, 0). */
double wo_cost_step_s(const struct wo_plan_costs *c, double hbm_bytes, double zc_bytes,
                      uint64_t in_bytes, uint64_t calls, uint64_t collapsed, uint64_t copied_back);
