/* uvm/stream-check.h: write checks of the streaming executor's slots.
 *
 * The shim cannot tell a launch that reads a weight from one that writes
 * it: kernels are opaque. Engines do write their weights at times (an RL
 * trainer's weight sync into a serving engine, a repacking after load), and
 * a redirected launch that writes lands in the slot, which the executor
 * would reuse: the write would be lost. So every slot is checked before it
 * is reused or freed: its contents are hashed on the device (a pass over
 * device memory, on a stream of the checker's own) and compared with the
 * hash taken when the range was first staged; when they differ, the slot
 * is copied back into the range, in stream order before any later staging
 * copy, and a flag in mapped host memory tells the executor, which then
 * reads the range in place. A misprediction costs speed, never data.
 * uvm/stream-copy.cu has the kernels; docs/prefetch.md ("Write checks")
 * the design and its cost.
 *
 * Consumer thread only (the executor), in the executor's context. */
#pragma once

#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>

#include "uvm/uvm.h"

/* Starts the checker with the kernels of mod (uvm/stream-copy.cu) for
 * nslots slots. False: no checks (said at warn level; the executor then
 * streams nothing). */
bool wo_check_start(const struct wo_driver *d, CUmodule mod, unsigned nslots);

/* On the copy stream, after range id was copied into the slot at dev
 * (bytes n): the hash it is compared with later. */
CUresult wo_check_first(CUstream copy, CUdeviceptr dev, uint64_t n, uint32_t id);

/* Slot `slot` (at dev) holds range id's n bytes, staged from dst: once
 * the copy that staged them (copied) and read_done have passed, hash it, copy it back into dst when
 * it changed (then the range's flag becomes tag: non-zero, and other than any earlier range with
 * that id had), and make the copy stream wait for that before its next copy. */
CUresult wo_check_slot(unsigned slot, CUdeviceptr dev, uint64_t n, uint32_t id, uint32_t tag,
                       CUdeviceptr dst, CUevent copied, CUevent read_done, CUstream copy);

/* Whether the last check of slot has finished on the device (a failed
 * query counts as finished: there is nothing to wait for). */
bool wo_check_done(unsigned slot);

/* Reads the flags of ids below n back from the device, where they are not
 * in mapped host memory (before wo_check_take, once a check finished). */
void wo_check_read(uint32_t n);

/* Whether a finished check found range id written (and copied its slot
 * back): its flag is tag. */
bool wo_check_take(uint32_t id, uint32_t tag);

/* Waits for every check issued (before the slots are freed). */
void wo_check_sync(void);

/* Frees what wo_check_start made (driver calls: not at exit). */
void wo_check_stop(void);

/* In a forked child: forget the parent's handles. */
void wo_check_atfork_child(void);
