/* uvm/place-int.h: what placement's files share (place.c routes an
 * allocation and runs the backends; place-pin.c pins host memory;
 * place-cap.c keeps managed memory under the free device memory;
 * place-seal.c applies placements at seal; place-fit.c chooses them under
 * fit:). Every function here runs under wo_uvm.lock. */
#pragma once

#include "core/settings.h"
#include "uvm/fit-split.h"
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
 * the driver's error. ready (ready_len as wo_pin_host gives it): memory
 * pinned already for it (place-prepin.c), else NULL: pinned here. */
CUresult wo_place_serve_pinned(const struct wo_driver *d, struct wo_alloc *a, const char *name,
                               void *ready, size_t ready_len, CUdeviceptr *p);
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
/* Why fit's device weights yield after seal (wo_place_fit_yield). There is
 * no rule on the free memory the driver reports: after managed pages move
 * to the host, cuMemGetInfo still counts them (UVM keeps the freed pages
 * cached, ../shared/guide/device-facts.md; a cudaMalloc gets them back), so
 * a yield would not show there; a rule of that kind, tried, ended with
 * every weight fit had placed on the host (docs/placement.md). */
enum wo_fit_yield_why {
    WO_FIT_YIELD_RESERVE, /* the engine's allocations would pass fit's reserve */
    WO_FIT_YIELD_OOM,     /* the engine's allocation failed (the second time) */
    /* WOFFLOAD_FIT_BIND: the engine's allocation would leave less than
     * keep_free free. Only late-bound weights yield to it: their device
     * memory is released at once, so the free memory rises and the rule
     * stops (managed pages would stay cached, and it would not) */
    WO_FIT_YIELD_FREE,
};
/* The engine is short of need bytes of device memory after seal: fit's
 * device weights move to the host, the least valuable first, until need
 * bytes are free; returns the bytes moved. */
uint64_t wo_place_fit_yield(uint64_t need, enum wo_fit_yield_why why);
/* Under WOFFLOAD_FIT_BIND, with late-bound weights of fit's on the device:
 * the bytes an engine allocation of size after seal is short of leaving
 * keep_free free (WO_FIT_YIELD_FREE), 0 none or not asked. Under
 * wo_uvm.lock. */
uint64_t wo_place_fit_short(size_t size);
/* The exit summary's line under fit: how far the engine's allocations
 * after seal went against the reserve, and the reserve that would have kept
 * the yielded weights on the device. */
void wo_place_fit_summary(void);
/* `fit: {reserve: auto}` (fit-memo.c): the reserve the runs before call
 * for (their engines' high water after seal, rounded up to 32 MiB), or
 * WO_FIT_RESERVE_DEFAULT before any; read once. */
uint64_t wo_fit_memo_reserve(void);
/* fit with `reserve: auto` made the reserve wo_fit_memo_reserve() gives;
 * any other reserve as it is. */
struct wo_fit wo_fit_memo_resolve(const struct wo_fit *fit);
/* The reserve that keeps an engine's high water after seal: it rounded up
 * to 32 MiB (reserve: auto's, and the one the exit line names). */
uint64_t wo_fit_reserve_for(uint64_t peak);
/* Whether an earlier run's high water was found (after wo_fit_memo_reserve). */
bool wo_fit_memo_have(void);
/* Keeps this run's high water (and the context's growth beyond the
 * allocations, untracked) for the next run, each the largest seen;
 * returns the file, NULL when it could not be written (said). */
const char *wo_fit_memo_save(uint64_t peak, uint64_t untracked);
/* Device memory the engine holds besides what the shim serves (fit's
 * engine_bytes). */
uint64_t wo_place_engine_bytes(void);
/* The bytes of allocation a that no tag covers (its tags in address
 * order): the gaps seal gives the policy's default. */
uint64_t wo_place_untagged(const struct wo_alloc *a);
/* The process's device memory that no allocation explains (issue 41): its
 * CUDA contexts, loaded modules, memory pools' slack: NVML's figure for
 * this process on the current device less `allocated` (the device
 * allocations the shim saw), in *bytes. 0, or -1 (*bytes 0) where NVML
 * cannot tell; said gets what was measured or why not, for fit's seal
 * line. */
int wo_place_context_bytes(uint64_t allocated, uint64_t *bytes, char *said, size_t saidlen);
/* At seal where a trace is recorded and fit did not measure it already:
 * the same figure, for the trace's INFO context_bytes (uvm/record.c), so
 * that woffload-policy fit takes it out of --device as fit does. */
void wo_place_context_for_trace(void);
/* ---- names before bytes (place-expect.c) --------------------------------------- */

/* Announces name (bytes) before its allocation: 0 or -ENOMEM. */
int wo_place_expect_add(const char *name, uint64_t bytes);
/* Places the names announced since the last plan now (woffload_expect_end),
 * and starts pinning ahead for them. */
void wo_place_expect_plan(const struct wo_driver *d);
/* The planned placement of the announced name a (not yet registered,
 * a->size set) is matched to by size, claimed for it (a->expect_ix), or
 * UNSET: none matched, none announced, or sealed. Plans first when names
 * were announced since. */
enum wo_placement wo_place_expect_claim(const struct wo_driver *d, struct wo_alloc *a);
/* a, matched to a name the plan put on the host, was served as pinned host
 * memory (pinned), or pinning failed and it is served as before. */
void wo_place_expect_served(struct wo_alloc *a, bool pinned);
/* a is freed: before seal its claim is given back. */
void wo_place_expect_release(struct wo_alloc *a);
/* Tag t was made on a (pinned, matched): counts it when the policy or the
 * plan wanted it on the device. */
void wo_place_expect_tagged(const struct wo_alloc *a, const struct wo_tag *t);
/* The seal's line on the announced names. */
void wo_place_expect_log(void);
/* Frees the announced names (wo_uvm_reset). */
void wo_place_expect_free(void);

/* ---- pinning ahead of the loader (place-prepin.c) ------------------------------ */

struct wo_prepin_figs {
    uint64_t made, made_bytes;     /* buffers pinned ahead */
    uint64_t taken, taken_bytes;   /* ... that an allocation took */
    uint64_t waits;                /* allocations that waited for the one being pinned */
    uint64_t missed;               /* allocations that pinned their own (none ready) */
    uint64_t wasted, wasted_bytes; /* given back at seal, never taken */
    uint64_t failed;               /* pins that failed: nothing more pinned ahead */
    uint64_t ns;                   /* the worker's time pinning */
};
/* The plan's host tensors' sizes: the worker pins buffers for them ahead
 * (started on the first plan; WOFFLOAD_PREPIN, late binding off). */
void wo_place_prepin_plan(const struct wo_driver *d, const uint64_t *sizes, size_t n);
/* A pinned buffer for an allocation of size bytes, taken: *host, *len (as
 * wo_pin_host gives them); false: none, the caller pins. */
bool wo_place_prepin_take(size_t size, void **host, size_t *len);
/* Stops the worker and gives back what no allocation took (seal, exit). */
void wo_place_prepin_stop(void);
void wo_place_prepin_figs(struct wo_prepin_figs *f);
/* Stopped, and its figures zeroed (wo_uvm_reset). */
void wo_place_prepin_reset(void);
