/* uvm/picks-hot.h: the hot experts of one expert tensor kept on the device,
 * composed with picked staging (uvm/picks.h).
 *
 * A picked copy moves each picked expert's row into a stream's staging
 * buffer right before the launch that reads it. With a hot set, the copy
 * kernel takes a row whose expert is hot from a device cache of the tensor
 * (at the device's bandwidth) instead of from host memory (over PCIe): the
 * link moves only the picked experts that are not hot.
 *
 * Which experts are hot: the copy kernel counts, on the device, the copies
 * that moved each expert (counts[e]); the counts are read back on the home
 * stream, and every WO_HOT_EVERY registrations of the tensor (a layer
 * registers once a forward step) the executor decays each expert's score
 * and adds the copies since the last time (frequency with recency: an
 * LFRU), fills free slots (rows of at most WO_HOT_FILL_BYTES a choice, at
 * least WO_HOT_FILLS_MIN) with the best experts not hot, then swaps at most
 * WO_HOT_SWAPS of them for hot ones scoring clearly less. While slots are
 * free it chooses again at the next registration after a choice that filled
 * some, twice as far (up to WO_HOT_EVERY) after one that found none: a set filled 8 rows every 8
 * steps took 80 steps to fill 64 slots, longer than a benchmark's batch
 * (llama-batched-bench's 32 steps on the H200: 48 of 64 filled at its
 * end, 17% of the picked rows hot).
 *
 * Stream order makes every change exact without a wait: on the tensor's
 * home stream (the one stream whose copies read the cache), an expert
 * leaving is unpublished (where[e] = WO_HOT_NOWHERE), its slot refilled by
 * a copy kernel from the host row, and the new expert published (where[e] =
 * its slot), all before the next picked copy; the copies before read the
 * slot as it was. Copies on other streams read the host rows (they are
 * given no map). A write into the tensor (wo_hot_invalidate) unpublishes
 * every expert before the next copy on the home stream.
 *
 * Not thread-safe: picks.c calls it under its lock. */
#pragma once

#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>

#include "uvm/uvm.h"

#define WO_HOT_NOWHERE 0xffffffffu /* where[e]: expert e is not hot (uvm/stream-copy.cu) */
#define WO_HOT_EVERY 8u /* registrations between two choices of a full hot set */
#define WO_HOT_SWAPS 2u /* experts that may enter a full hot set at a choice */
/* free slots filled at a choice: rows of at most this many bytes (each a
 * copy over the link on the engine's stream before its launch: 256 MiB is
 * 5 ms at 55 GB/s), and at least WO_HOT_FILLS_MIN rows */
#define WO_HOT_FILL_BYTES (256ull << 20)
#define WO_HOT_FILLS_MIN 8u
#define WO_HOT_FIRST 2u /* registrations of a tensor before its hot set is made */

struct wo_picks_hot;

/* A hot set of cap slots for a tensor of n_experts rows of row bytes,
 * homed on stream home (its device memory allocated: where, counts, cache;
 * *bytes gets its size). NULL: no memory or a driver failure (said by the
 * caller). The map is cleared at the first wo_hot_prepare. */
struct wo_picks_hot *wo_hot_new(const struct wo_driver *d, unsigned n_experts, uint64_t row,
                                unsigned cap, uint64_t home, uint64_t *bytes);
/* The map's bytes and a set's rows: uvm/picks-geom.h (wo_hot_map_bytes,
 * wo_hot_cap). */
/* Frees it (its streams' work on it done: the caller synchronised). */
void wo_hot_free(const struct wo_driver *d, struct wo_picks_hot *h);

/* Before a picked copy of the tensor (its host rows at src) on stream st:
 * on the home stream, the map cleared when invalidated and, every
 * WO_HOT_EVERY registrations (regs: the tensor's), the hot set chosen again
 * from the counts last read back, its changes enqueued on st with fill
 * (wo_stream_copy of the shim's module), and the counts read back for the
 * next choice (on st too). False: a driver call failed: the hot set is off
 * for good (the copy reads every row from host, as without it). */
bool wo_hot_prepare(const struct wo_driver *d, struct wo_picks_hot *h, uint64_t st, uint64_t src,
                    uint64_t regs, CUfunction fill);

/* The copy kernel's map and cache for a copy on stream st: where 0 when st
 * is not the home stream (every row from host). counts: always (any
 * stream's copies count). */
void wo_hot_args(const struct wo_picks_hot *h, uint64_t st, CUdeviceptr *where, CUdeviceptr *cache,
                 CUdeviceptr *counts);

struct wo_picks_copy;
/* Before a copy-engine job of c (its where and cache from wo_hot_args) on
 * stream st: the rows c takes from the hot set copied by the kernels (mark
 * and copy, c's src left out) on st, in order with the set's changes; bits
 * (bit e of bits[e / 64], WO_PICKS_EXPERTS / 64 words) the experts the
 * copy engine then skips: those the map publishes at that point of st's
 * order, as the host wrote it. c becomes the rest: its cache left out (a
 * copy of it by the kernels, when the copy engine cannot, copies only the
 * rows not hot, and counts no hits), its counts cleared (that copy counted
 * every picked expert). False: the launch failed (c as it was: the kernels
 * copy it whole). */
bool wo_hot_launch(const struct wo_driver *d, const struct wo_picks_hot *h, uint64_t st,
                   CUfunction mark, CUfunction copy, struct wo_picks_copy *c, uint64_t *bits);

/* The tensor was written: no hot row may be read until refilled. */
void wo_hot_invalidate(struct wo_picks_hot *h);
/* Its home stream is gone (the caller synchronised it): the next stream
 * that copies the tensor becomes home, with the map cleared. */
void wo_hot_stream_gone(struct wo_picks_hot *h, uint64_t stream);

/* The bytes for hot experts in all (any thread): WOFFLOAD_PICKS_HOT when
 * set, else the policy's prefetch.hot_experts; 0: none; auto: what the free
 * device memory came to when the first set was made (UINT64_MAX before);
 * no more than the ceiling once set. */
uint64_t wo_picks_hot_total(void);
/* The policy asks for prefetch.hot_experts: auto (and the environment does
 * not override it). */
bool wo_picks_hot_auto(void);
/* Under auto, before the first set: what it comes to, from the free device
 * memory now less the managed margin (said once). */
void wo_hot_resolve_auto(const struct wo_driver *d);
/* No more bytes for hot experts from now on than this (the engine ran out
 * of device memory: the sets left). */
void wo_hot_set_ceiling(uint64_t bytes);
/* As at start: no ceiling, auto not resolved. */
void wo_hot_budget_reset(void);

/* Its home stream (0: none yet). */
uint64_t wo_hot_home(const struct wo_picks_hot *h);
/* Figures for the stats. */
struct wo_hot_figs {
    unsigned cap, held; /* slots, experts hot now */
    uint64_t fills;     /* rows copied into the cache */
    uint64_t choices;   /* hot sets chosen */
    uint64_t bytes;     /* device bytes */
};
void wo_hot_figs(const struct wo_picks_hot *h, struct wo_hot_figs *f);
