/* uvm/picks.h: picked staging, the executor that moves only the experts a
 * mixture-of-experts router picked (issue 42).
 *
 * A fine-grained MoE layer (128-384 experts, top-8) reads a few experts of
 * a stacked expert tensor a step: at batch 8 about 40% of them, at batch 1
 * about 6%. Reading the tensor in place over PCIe is slow (a GEMM's reads of
 * host memory are small and repeated), and staging the whole tensor moves
 * 2.5x the picked bytes at batch 8. Which experts a launch reads is known
 * only on the device, in stream order: the router's top-k ids, written by an
 * earlier kernel on the engine's stream.
 *
 * So the engine (its registration hook: python/woffload's experts hook,
 * or woffload_moe_picks() in C) says, before the experts' launches, where
 * those ids are: the expert tensor [experts, experts + bytes) of n_experts
 * rows, and the ids (device memory, n_ids integers of 4 or 8 bytes). Each
 * launch that reads that tensor from host or managed memory then gets, on
 * its own stream and right before it:
 *   - wo_picks_mark: marks[e] = gen for each id e (out-of-range ids skipped);
 *   - wo_picks_copy: each marked row copied into a device buffer of the
 *     stream, laid out as the tensor (the launch computes its own offsets);
 * and runs with its pointers into the tensor moved into the buffer. Stream
 * order makes it exact: the ids are those the launch reads, the rows it does
 * not read are never looked at, and nothing waits on the host. A later
 * launch of the same stream that reads the same tensor with the same
 * registration reuses the buffer (transformers' eager experts loop: one
 * launch per picked expert). Two buffers per stream (an MoE layer's gate/up
 * and down tensors), each as large as the largest tensor staged.
 *
 * What the registration promises: until it is cleared (ids NULL) or
 * replaced, the ids stay where they are and the launches that read the
 * tensor only read it, and only the rows the ids name. Captured launches
 * read in place (a graph replays later, past this hook), and so do launches
 * from another thread than the one that registered. A copy hook that
 * writes into the tensor drops the buffer's contents (wo_picks_note_write).
 * Any failure (no device memory for a buffer, a driver refusal, another
 * context, a global capture under way) reads in place: speed, never data.
 *
 * Thread safety: the launch hooks and the registration run on engine
 * threads and share one mutex, taken only when a hit lies in a range that
 * has a span (wo_picks_ids). */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "core/event.h"
#include "core/trace.h"
#include "uvm/hotpath.h"
#include "uvm/picks-copy.h"
#include "uvm/picks-kern.h"

#include <cuda.h>

struct wo_driver;

/* woffload_moe_picks (uvm/api.c checks the arguments). ids NULL clears. */
int wo_picks_set(uint64_t experts, uint64_t bytes, unsigned n_experts, uint64_t ids, uint64_t n_ids,
                 uint64_t per_row, uint64_t stride, unsigned id_bytes, bool sticky);

/* Whether a span of registry range (id, gen) overlapping its bytes [lo, hi)
 * is this executor's: the streaming executor leaves those to it (consumer
 * thread). A span is while a registration holds ids, and from then on when
 * one came through woffload_moe_picks (sticky): the Python hook registers
 * at each layer's forward and clears after it, and between two forwards the
 * tensor must not go back to whole staging. Registrations in rows
 * (woffload_moe_picks_rows) claim only while they hold ids: the ggml hook
 * registers them only for the computes WOFFLOAD_GGML_PICKS allows, and
 * streaming keeps the tensor for the others (a batch that picks most
 * experts); with hot experts asked (wo_picks_hot_total), from their first
 * registration on as well. Not a host tensor a registration picked at
 * least WOFFLOAD_PICKS_WHOLE percent of the experts of (until one picks
 * under 4/5 of it; without hot experts): the whole tensor on the copy engine beats the kernels'
 * copy of nearly every row, when auto's step time says so (picks.c, whole). */
/* The placement of [lo, hi) changed after its registrations began (fit's
 * weights yielding to the host after seal): a tensor there is learnt again
 * at its next registration (where it lies: an expert tensor now off the
 * device gets picked copies). Under uvm/'s lock or none. */
void wo_picks_moved(uint64_t lo, uint64_t hi);
bool wo_picks_claims(uint32_t id, uint32_t gen, uint64_t lo, uint64_t hi);
/* The engine ran out of device memory (wo_uvm_engine_oom) and needs need
 * more bytes: hot sets are freed, once the streams with buffers are done
 * (none while a capture is under way), those of tensors gone first, then
 * those whose rows saved the least link traffic per byte, until need bytes
 * are freed or none is left; no set is made after (the sets left stay).
 * Returns the bytes freed; *sets_left: the sets that stay. */
uint64_t wo_picks_give_back(const struct wo_driver *d, uint64_t need, unsigned *sets_left);
/* Device bytes the buffers hold (the budget ledger takes them off the
 * planner's budget). Any thread. */
uint64_t wo_picks_reserved(void);

/* What the stats say (uvm/stats.c: "picks"). Per span: */
struct wo_picks_figs {
    const char *name;      /* the tag's name at the tensor's start, NULL none */
    const struct wo_picks_kerns *kerns; /* the kernels whose launches it served */
    struct wo_trace_pick k; /* its figures, as PICKS trace records carry them */
    unsigned hot_slots;     /* its hot set's room, in experts (0: none) */
    uint64_t hot_fills;     /* rows copied into its hot set */
    uint64_t hot_bytes;     /* device bytes of its hot set */
};
/* ... and in all: the counts picks.c keeps as it goes (wo_pk.c), */
struct wo_picks_counts {
    uint64_t regs, staged, reused;
    uint64_t early;        /* of staged, copied early: with the layer's first tensor on the copy
                            * engine (WOFFLOAD_PICKS_EARLY) */
    uint64_t early_used;   /* of them, read by their own launch */
    uint64_t whole_bytes;  /* what staging whole tensors would have moved */
    uint64_t captured;     /* launches into a capture: read in place */
    uint64_t failed;       /* launches read in place for a failure (no buffer, driver) */
    uint64_t unused;       /* staged, then not launched with (parameters not rewritten) */
    uint64_t writes;       /* copies that wrote into a span (its buffers made stale) */
    uint64_t resident;     /* launches that read a managed tensor the prefetcher holds wholly
                            * on the device: read there, no copy */
    uint64_t off_row;      /* launches whose only words in a registered tensor were off an
                            * expert's row: no read of it, not staged (picks.c: at_row) */
    struct wo_picks_kerns off_kerns; /* their kernels */
    uint64_t not_reader;   /* launches of kernels not (yet) seen reading two registered tensors
                            * at an expert: read in place (uvm/picks-kern.h) */
    struct wo_picks_kerns nr_kerns; /* their kernels */
    uint64_t checked;        /* WOFFLOAD_STREAM_CHECK: launches whose buffers were compared */
    uint64_t check_mismatch; /* of them, with a picked expert's bytes not the tensor's */
};
/* and the rest, read at the report */
struct wo_picks_totals {
    struct wo_picks_counts c;
    uint64_t spans, rows, bytes_copied;
    uint64_t const_words;  /* words at an expert past the base left as they were: their
                            * parameter slot never held another value (preload/redirect.c) */
    uint64_t buffer_bytes; /* device bytes of the buffers */
    uint64_t buffer_cap;   /* what they may reach: WOFFLOAD_PICKS_BUFFERS x the largest tensor
                            * staged (uvm/picks-pool.h) */
    uint64_t buffers_lent; /* buffers one stream took from another (an event, no host sync) */
    uint64_t buffers_reclaimed; /* buffers freed to make room for another stream's larger one */
    /* the copy kernels, timed on the device one copy in 16 (uvm/picks-time.h) */
    uint64_t kernel_copies, timed_copies;
    double timed_ms;     /* the timed copies' device time, in all */
    double copy_span_s;  /* from the first kernel copy launched to the last */
    uint64_t kernel_bytes; /* rows the kernels copied, in bytes (as last read back) */
    uint64_t hot_bytes;    /* device bytes of the hot sets (WOFFLOAD_PICKS_HOT) */
    uint64_t hot_rows;     /* rows copied from hot sets, not over the link */
    uint64_t hot_fills;    /* rows copied into hot sets */
    uint64_t hot_given_back; /* hot sets' bytes given back when the engine ran out of memory */
};
/* Fills *t and calls fn for each span (under the picks lock: fn must not
 * call back). The rows are as last read back from the device. */
void wo_picks_report(struct wo_picks_totals *t, void (*fn)(void *ud, const struct wo_picks_figs *f),
                     void *ud);
/* The exit summary's line, or nothing when no span was staged. */
void wo_picks_summary(void);
/* The engine destroys stream (wo_uvm_stream_gone): its buffers wait for
 * its work and go to the next stream that asks, empty. */
void wo_picks_stream_gone(uint64_t stream);
/* Forgets everything without a driver call (exit after the summary, fork
 * child, tests). */
void wo_picks_reset(void);
/* Frees the buffers and what the device side set up, with d (NULL: none;
 * the process's work on them done: wo_uvm_reset, tests). */
void wo_picks_free(const struct wo_driver *d);
/* In a fork child: the lock made again (its holder may not have survived),
 * then reset. */
void wo_picks_atfork_child(void);
