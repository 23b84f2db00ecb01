/* uvm/picks-calls.h: what the engine called after a copy-engine job, for
 * the copy engine's stall report (uvm/picks-dma.c).
 *
 * A job's wait on the engine's stream is met by copies that the copy thread
 * enqueues later. Any call of the engine enqueued after that wait that the
 * GPU puts in a queue those copies share holds them (a copy or memset in a
 * copy queue: docs/picks.md, Copy queues), and the hang names no call.
 * So when a job is queued on a stream with no job outstanding, the hooked
 * entry points' call counts are kept (core/counters.h); the report lists
 * which calls the engine made since. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* Stream ix's job seq was queued with none outstanding: counts kept. */
void wo_calls_mark(unsigned ix, uint32_t seq);

/* " calls since job K was queued: cuLaunchKernel 40, cuMemsetD32Async 1;"
 * (the 8 most called of those called, by count) appended to msg (used bytes
 * of cap), for stream ix, or (ix WO_PICKS_STREAMS) the stream whose counts
 * were kept last; nothing when none were. */
void wo_calls_say(unsigned ix, char *msg, size_t cap, size_t *used);
