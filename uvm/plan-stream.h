/* uvm/plan-stream.h: the streaming executor's pure rules (plan-stream.c):
 * what the policy asks of it, how many slots and of what size, which
 * tensors are never streamed. No clock, no driver, no executor state, so
 * the replay (tools/replay-sim.c) and fit (uvm/place-fit.c) call the same
 * code the shim runs. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "policy/policy.h"

/* What prefetch.mode asks of the streaming executor, decoded here only:
 * exactly one of the three is true. */
struct wo_stream_mode {
    bool all;          /* stream: every streamable range, from the start */
    bool by_auto;      /* auto: by read multiplicity, then auto's step-time rule */
    bool measure_only; /* hot-set: nothing streamed; measures, and warns once */
};

struct wo_stream_mode wo_stream_mode_of(enum wo_prefetch_mode mode);

/* The staging slots the policy asks for (prefetch.slots, or the default). */
unsigned wo_stream_slots_wanted(const struct wo_policy_globals *g);

/* True for a tensor that engines gather from by index (an embedding,
 * policy/fit.c's class 5): a launch is handed the whole tensor and reads a
 * few rows, so a staging copy of all of it would move far more than the
 * reads do. Such ranges are never streamed, and fit keeps no slot room for
 * them. */
bool wo_stream_gathered(const char *name);

/* The staging slot size for ranges of these sizes: the size below which
 * 90% of their bytes lie (sizes are sorted in place). One outsized tensor
 * (an LM head twice an MLP weight) then reads in place instead of making
 * every slot twice as large. 0 for none. */
uint64_t wo_stream_slot_size(uint64_t *sizes, size_t n);

/* Sizes nslots staging slots (out[0..nslots), largest first) for ranges of
 * these sizes read in this cyclic order, none above cap: slot i gets the
 * largest i-th largest size among any nslots ranges in a row, so a window
 * of nslots ranges always finds a slot each (two expert tensors of 768 and
 * 384 MiB in turn: two slots of each, not four of 768). out, or NULL when
 * there is nothing to size by. */
uint64_t *wo_stream_size_slots(const uint64_t *sizes, size_t n, unsigned nslots, uint64_t cap,
                               uint64_t *out);
