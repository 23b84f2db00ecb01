/* uvm/picks-geom.h: the geometry of a picks registration (uvm/picks.h):
 * what share of a tensor's experts a uniform router picks, and whether a
 * launch's words into the tensor point at one of its experts. Pure
 * functions, no lock. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "core/event.h"

/* The share of n_experts a uniform router picks in rows rows of per_row
 * distinct ids each: 1 - (1 - per_row/E)^rows (tools/policy-gguf.c's
 * decode-step bytes too). */
static inline double wo_picks_share(uint64_t rows, uint64_t per_row, unsigned n_experts)
{
    double p = per_row && per_row <= n_experts ? (double)per_row / n_experts : 1.0 / n_experts;
    double miss = 1.0;

    if (!rows || !n_experts)
        return 0;
    for (uint64_t r = 0; r < rows && miss > 1e-6; r++)
        miss *= 1.0 - p;
    return 1.0 - miss;
}

/* The same in percent for the ids of a registration: n_ids in rows of
 * per_row distinct ones (0: one run, each id on its own); once a
 * registration (picks.c's engine_wanted reads it at launches). */
static inline uint8_t wo_picks_share_pct(uint64_t n_ids, uint64_t per_row, unsigned n_experts)
{
    if (!n_ids || !n_experts)
        return 0;
    return (uint8_t)(wo_picks_share(per_row ? n_ids / per_row : n_ids, per_row, n_experts) * 100.0 +
                     1e-6);
}

/* The device bytes of a hot set's map (uvm/picks-hot.h: an expert's slot
 * and count, 8 bytes, 256-aligned), and the experts a set of share bytes
 * holds beside it, whole rows of row bytes, at most n_experts: the one
 * split picks.c's make_hot makes and `woffload-policy gguf` models. */
static inline uint64_t wo_hot_map_bytes(unsigned n_experts)
{
    return ((uint64_t)n_experts * 8 + 255) & ~(uint64_t)255;
}

static inline unsigned wo_hot_cap(uint64_t share, unsigned n_experts, uint64_t row)
{
    uint64_t map = wo_hot_map_bytes(n_experts), rows = share > map && row ? (share - map) / row : 0;

    return rows < n_experts ? (unsigned)rows : n_experts;
}

/* A registration picking share percent of a tensor's experts: whether the
 * tensor is the streaming executor's from now on (was: it was so far), with
 * WOFFLOAD_PICKS_WHOLE at pct (0: never). In from pct percent, out below
 * 4/5 of it: a batch that moves about the line (continuous batching) does
 * not hand the tensor back and forth. Between the two the whole copy still
 * wins: the copy engine's 55 GB/s against the kernels' 37.5 over 4/5 of the
 * bytes or more (picks.c, whole). */
static inline bool wo_picks_whole_of(bool was, unsigned share, unsigned pct)
{
    return pct && (share >= pct || (was && share * 5 >= pct * 4));
}

/* Whether hit h (the lowest and highest words a launch passed into a
 * registry range) has an end at one of the experts of the tensor at off
 * in that range (size bytes, rows of row): engines hand a stacked expert
 * tensor at its base or at an expert (transformers' eager loop, llama.cpp's
 * per-expert matmuls). A word elsewhere in it is no read of it: a constant
 * or left-over stack bytes in an unused parameter that happen to look like
 * an address (core/event.h). Staged and moved, such a word reached the
 * kernel as a buffer's address: on the H200, transformers' continuous
 * batching beside fit's device-resident experts then gave other tokens
 * (bench/results/picks-stray-20261202-ad6185f-h200). A constant can still
 * fall on an expert: the kernel reader rule (uvm/picks-kern.h) is the
 * second filter. */
static inline bool wo_picks_at_expert(uint64_t off, uint64_t size, uint64_t row,
                                      const struct wo_ev_hit *h)
{
    uint64_t a = h->offset, b = h->hi - 1;

    return row && ((a >= off && a - off < size && (a - off) % row == 0) ||
                   (b >= off && b - off < size && (b - off) % row == 0));
}
