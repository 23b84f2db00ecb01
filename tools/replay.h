/* tools/replay.h: runs a loaded trace through a placement (the policy, or
 * the placements the trace recorded) and the prefetch planner (uvm/plan.h,
 * the shim's own code) against a device model, and computes the
 * offline-optimal bound for the same budget and costs. Used by
 * woffload-replay, `woffload demo` and the replay tests. docs/replay.md
 * describes the model and the bound; tools/replay-int.h how the
 * replay-*.c files divide it. */
#pragma once

#include <stdio.h>

#include "core/trace.h"
#include "policy/policy.h"
#include "uvm/devmodel.h"
#include "uvm/plan.h"

struct wo_replay_opts {
    const struct wo_devmodel *dm;
    const struct wo_policy *policy; /* NULL: the placements recorded in the trace */
    /* Device budget for managed ranges: budget_frac > 0: that share of the
     * managed bytes; else budget_bytes > 0; else the policy's device_budget
     * (AUTO: half the device memory left after device placements). */
    double budget_frac;
    uint64_t budget_bytes;
    bool all_device;        /* every range on the device (the all-on-GPU reference) */
    bool no_prefetch;       /* managed ranges stay on the host (every access streams) */
    bool no_bound;          /* skip the offline-optimal bound (it is the slow part) */
    unsigned warmup;        /* steps left out of the measured window; UINT_MAX: automatic */
    /* The host's own work (the recorded gaps between the engine's calls,
     * less its waits) times this; 0 or 1: as recorded. A machine whose
     * host runs slower or faster than the recording run's (the lent VM's
     * drifted 1.6x between processes) is compared at its own host speed. */
    double host_scale;
    FILE *timeline;         /* Chrome trace JSON of the predicted timeline, or NULL */
    /* Stream every `host` range (as prefetch mode stream) whatever the
     * policy's mode: how wo_replay_run weighs `auto`'s try (below). */
    bool stream;
};

struct wo_replay_name {
    const char *name; /* tag name, or "(untagged)" */
    uint32_t place;   /* enum wo_placement */
    uint64_t bytes;   /* allocation bytes under this name */
    /* per measured step: */
    double hbm_bytes, zc_bytes, miss_bytes, hit_bytes;
    double read_s;    /* kernel time reading them (model rates) */
    double stall_s;   /* managed misses and waits for in-flight prefetches */
    double prefetched, evicted;
    /* read multiplicity, as the shim's executor measures it (uvm/stream.c):
     * per measured step the bytes launches read under the name and the
     * distinct bytes among them (64 granules a tag); their ratio */
    double mult_read, mult_distinct;
};

struct wo_replay_result {
    uint64_t launches;          /* executed (graph launches expanded) */
    uint64_t steps;             /* step boundaries found */
    uint64_t window_steps;      /* steps measured */
    unsigned warmup;            /* steps left out */
    uint32_t step_launches;     /* launches in the last measured step */
    double total_s;             /* predicted end of the whole trace */
    double step_s;              /* mean predicted step time in the window */
    double median_step_s;       /* median of the window's step times (0: fewer than 2) */
    double recorded_median_step_s; /* the same steps in the recorded run (launch times) */
    /* The mean of the window's decode steps: the steps with no more than
     * 1.25x the median step's launches (a generate call's end and the next
     * prefill make one long step with ~3x the launches). What an engine's
     * decode tok/s measures. 0: fewer than 2 boundaries. */
    double decode_step_s, recorded_decode_step_s;
    uint64_t decode_steps;
    /* per decode step: zero-copy reads, all bytes over PCIe, stalls, the
     * host's own work */
    double decode_zc_bytes, decode_pcie_bytes, decode_stall_s, decode_host_s;
    double cpu_step_s;          /* host work per step (launch pacing floor) */
    double bound_step_s;        /* lower bound on any schedule, per step (0: not computed) */
    double oracle_step_s;       /* the clairvoyant static schedule, per step (0: not computed) */
    double pcie_bytes_step;     /* H2D zero-copy reads + prefetches + copy-backs + copies + staging */
    double zc_bytes_step, prefetch_bytes_step, evict_bytes_step, copy_bytes_step;
    double stream_bytes_step;   /* staged into device slots (prefetch mode stream) */
    double pick_bytes_step;     /* picked staging's copies over the link (the trace's PICKS) */
    double pick_engine_bytes_step; /* of them, the copy engine's; the rest are in zc_bytes_step */
    double stall_s_step;
    /* The cost rule (uvm/cost.h) over the window, per step, at the model's
     * rates: the managed bytes read, all in place (what `host` pays) and as
     * the plan read them (hits, misses, its moves). The moves themselves
     * are prefetch_bytes_step and evict_bytes_step above. */
    double cost_inplace_s, cost_plan_s;
    bool churn; /* the planner moved more than the budget in over its last
                 * WO_PLAN_CHURN_STEPS steps (wo_plan_churn) */
    uint64_t managed_bytes, budget;
    uint64_t max_resident;      /* highest residency the planner reached */
    /* prefetch mode auto (the default) with `host` ranges: whether the
     * step-time rule would keep them streamed (uvm/stream-auto.h: one copy
     * of them under WO_AUTO_TRY_RATIO of the in-place decode step, the
     * streamed step under WO_AUTO_KEEP_RATIO of it), and the decode step of
     * the choice not taken (0: not weighed). The figures above are the
     * chosen one's. */
    bool auto_weighed, auto_streamed;
    double auto_other_step_s;
    struct wo_replay_name *names;
    size_t nnames;
};

/* 0 and *res (free with wo_replay_result_free), -ENODATA (no repeating
 * step: a single pass, e.g. a prefill), -EINVAL (the measured window did not
 * close), -ENOMEM. msg gets a sentence on failure. Name strings in *res
 * point into d. */
int wo_replay_run(const struct wo_trace_data *d, const struct wo_replay_opts *o,
                  struct wo_replay_result *res, char *msg, size_t msglen);
void wo_replay_result_free(struct wo_replay_result *res);

/* Whether the shim could have served (and so placed) a tagged allocation:
 * tags flagged placeable, and plain allocations (not stream-ordered, VMM or
 * the engine's own managed memory) of a run that placed nothing. */
bool wo_replay_could_place(const struct wo_trace_tag *t, const struct wo_trace_range *tr);

/* The host_scale at which the trace replayed with every range on the device
 * takes `decode_step_s` per decode step: the host speed of a machine where
 * the all-GPU run was measured at that step time (secant iterations on the
 * mean decode step). 0 and *scale, or -ERANGE (no scale in [0.05, 20]
 * reaches it), or wo_replay_run's errors. */
int wo_replay_host_scale_for(const struct wo_trace_data *d, const struct wo_replay_opts *o,
                             double decode_step_s, double *scale, char *msg, size_t msglen);
