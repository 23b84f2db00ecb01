/* uvm/picks-time.h: how long picked copies take on the device, sampled.
 *
 * The copy kernels of every TIME_EVERY-th picked copy (uvm/picks.c) are
 * bracketed by two timing events on the engine's stream; their elapsed time
 * is read when both have completed, polled at later copies (never waited
 * for). From the mean of the sampled copies, the summary estimates the
 * device time all the kernel copies took and the share of the run's time
 * between the first and last copy that was: the copies run in the engine's
 * stream order, so the rest of that time is the engine's own work, never
 * overlapped with them. Off in a capture (events of a capturing process
 * are left alone). Every function runs under picks' lock. */
#pragma once

#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>

struct wo_driver;

/* Before a copy's kernels on st: a sample slot (>= 0) to end with
 * wo_picks_time_after, or -1 (not sampled). Counts the copy. */
int wo_picks_time_before(const struct wo_driver *d, CUstream st);
/* After them: ok, the kernels were launched (else the sample is dropped). */
void wo_picks_time_after(const struct wo_driver *d, CUstream st, int slot, bool ok);
/* Reads the samples whose copies are done. */
void wo_picks_time_poll(const struct wo_driver *d);

struct wo_picks_time_figs {
    uint64_t copies;      /* kernel copies launched */
    uint64_t timed;       /* of them, timed */
    double timed_ms;      /* their device time, in all */
    uint64_t first_ns, last_ns; /* CLOCK_MONOTONIC of the first and last copy launched */
};
void wo_picks_time_figs(struct wo_picks_time_figs *f);
/* Frees the events (the process's work on them done). */
void wo_picks_time_free(const struct wo_driver *d);
/* Forgets everything without a driver call. */
void wo_picks_time_reset(void);
