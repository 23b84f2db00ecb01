/* uvm/place-int.h: what placement's files share (place.c routes an
 * allocation and runs the backends; place-pin.c pins host memory;
 * place-cap.c keeps managed memory under the free device memory;
 * place-seal.c applies placements at seal; place-fit.c chooses them under
 * fit:). Every function here runs under wo_uvm.lock. */
#pragma once

#include "uvm/internal.h"

#define PAGE 4096u /* advice and pins work on whole pages */

/* Advice, and with residency a prefetch on the private stream (the caller
 * synchronises it with wo_place_sync), for [off, off+len) of a served
 * managed allocation widened to whole pages. 0 or -errno (the failure is
 * logged and counted). */
int wo_place_apply_range(struct wo_alloc *a, uint64_t off, uint64_t len, enum wo_placement p,
                         bool advice, bool residency);
/* Waits for the private stream's prefetches. 0 or -errno. */
int wo_place_sync(void);

/* ---- pinned host memory (place-pin.c) ---------------------------------------- */

/* Whether the driver table can serve pinned, device-mapped host memory. */
bool wo_place_can_pin(const struct wo_driver *d);
/* Serves a with pinned, device-mapped host memory: CUDA_SUCCESS and *p, or
 * the driver's error. */
CUresult wo_place_serve_pinned(const struct wo_driver *d, struct wo_alloc *a, const char *name,
                               CUdeviceptr *p);
/* A tag scope's allocation whose rule pins (host, pin: true) is served as
 * pinned memory from its first byte. False: pinning failed under
 * pin_fallback: stop (said why; the caller fails the allocation with
 * CUDA_ERROR_OUT_OF_MEMORY). True otherwise: pinned, or not asked for, or
 * failed and left managed (pin_fallback: managed). */
bool wo_place_pin_named(const struct wo_driver *d, struct wo_alloc *a, const struct wo_name *n,
                        const struct wo_tag *pending, CUdeviceptr *p);

/* ---- the managed cap (place-cap.c) --------------------------------------------- */

/* Whether size more bytes of managed memory fit under the cap now;
 * *headroom (what is left after them) and *free_ret (the free device
 * memory; 0 when unknown) for the caller's figures. */
bool wo_place_cap_fits(const struct wo_driver *d, size_t size, int64_t *headroom,
                       size_t *free_ret);
/* a (named n, NULL for the window's) does not fit: true when it is served
 * as pinned host memory (*p), false when it passes through as device
 * memory (the engine's own call makes it). */
bool wo_place_capped(const struct wo_driver *d, struct wo_alloc *a, const struct wo_name *n,
                     const struct wo_tag *pending, size_t free_now, CUdeviceptr *p);

/* ---- fit (place-fit.c) ---------------------------------------------------------- */

/* Chooses under fit: what stays on the device, from every tagged name and
 * the device's free and total memory; sets the device budget (auto). */
void wo_place_fit(size_t free_b, size_t total_b);
