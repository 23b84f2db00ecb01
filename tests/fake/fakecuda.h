/* tests/fake/fakecuda.h: the fake-only API of the test doubles in tests/fake/.
 *
 * libcuda.so.1 (fake) implements a subset of the CUDA driver API in host
 * memory: "device" memory is ordinary host memory, kernels are host functions
 * registered with fakecuda_kernel(), async work runs at once, in order. On top
 * of the driver API it exports the fakecuda_* functions below so tests can
 * register kernels, count the calls that reached the driver, inject failures
 * and ask where memory is. libcudart.so.13 (fake) exports fakecudart_*.
 *
 * Tests normally reach these through dlsym() on the same dlopen("libcuda.so.1")
 * handle a CUDA runtime would use, so nothing links the fake directly; linking
 * it is fine too.
 *
 * Environment (read once, at the first driver call):
 *   WOFAKE_TOTAL_MEM   device memory size: bytes, or with K/M/G/T suffix
 *                      (default 16G). cuMemGetInfo free = total - live device
 *                      bytes (device, async, VMM physical, managed pages
 *                      resident on the device); cuMemAlloc fails beyond it.
 *   WOFAKE_MANAGED_GUARD=1  the lent GPU's safety rule: cuMemAllocManaged
 *                      fails (CUDA_ERROR_OUT_OF_MEMORY, one stderr line
 *                      "fakecuda: managed guard: ...") when live managed
 *                      bytes would exceed the free device memory.
 *   WOFAKE_UVM_CACHE=1 a managed page that loses its device copy keeps its
 *                      device memory (UVM's cache on driver 580): counted
 *                      as used until a managed page comes to the device or
 *                      an allocation needs more than the free memory
 *                      (fakecuda_uvm_cached says how much is held).
 *   WOFAKE_DEVICES     number of devices (default 1, at most 8)
 *   WOFAKE_NO_DEVICE=1 cuInit fails with CUDA_ERROR_NO_DEVICE
 *   WOFAKE_FAIL        "name:nth:err,...": the nth call (1-based, counted from
 *                      process start) of the ABI symbol `name` fails with
 *                      CUresult err; nth "*" fails every call.
 *   WOFAKE_TRACE=1     one line on stderr per driver call
 *   WOFAKE_PROC_MISSING=success
 *                      cuGetProcAddress(_v2) answers a missing symbol (or one
 *                      newer than the version asked for)
 *                      with CUDA_SUCCESS and *pfn = NULL, as the real
 *                      driver 580 does (measured); default: CUDA_ERROR_NOT_FOUND
 *   WOFAKE_WAIT_MS     how long cuStreamWaitValue32 blocks its caller for a
 *                      value never written before it fails (default 10000)
 *   WOFAKE_FORK_OK=1   a forked child may keep using the parent's state
 *                      (default: in the child of an initialised parent every
 *                      call, cuInit included, fails CUDA_ERROR_NOT_INITIALIZED)
 *
 * Faithful to the real driver where the shim's behaviour depends on it, and
 * checked against it (probe-driver.c, probe-real.txt: driver 580 on the lent
 * H100): cuInit before anything, a current context for context-bound calls,
 * the cuGetProcAddress(_v2) version/flags/status rules, capture rules (work
 * on a capturing stream is recorded, not run; unsafe calls during a
 * global-mode capture fail with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and
 * invalidate it, as do prefetches on a capturing stream; the legacy stream
 * fails with CUDA_ERROR_STREAM_CAPTURE_IMPLICIT), managed-
 * only advise/prefetch. Not modelled: eviction; migration on access happens
 * only where code declares the access (fakecuda_access), as loads of host
 * functions are invisible. */
#pragma once

#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* --- kernels ------------------------------------------------------------- */

/* A kernel body: params[i] points at parameter i (as cuLaunchKernel's
 * kernelParams); grid and block are the launch dimensions. */
typedef void (*fakecuda_kernel_fn)(void **params, const uint32_t grid[3], const uint32_t block[3]);

/* Registers a kernel. Parameter i is aligned to the largest power of two
 * (at most 8) dividing its size, as nvcc lays out scalars, pointers and
 * by-value structs, so cuFuncGetParamInfo returns real layouts. The name is
 * copied. Returns a
 * CUfunction valid for the life of the process (also usable as a CUkernel
 * via fakecuda_kernel_handle()), or NULL when nparams > 64 or fn is NULL.
 * cuModuleGetFunction/cuLibraryGetKernel find registered kernels by name. */
CUfunction fakecuda_kernel(const char *name, int nparams, const size_t *param_sizes,
                           fakecuda_kernel_fn fn);
/* Gives registered function f another signature and body, as the real
 * driver may hand a freed function's handle to a function of a module loaded
 * later (the shim must not scan it with the old one's parameters). 0, or -1
 * on bad arguments. */
int fakecuda_kernel_redefine(CUfunction f, int nparams, const size_t *param_sizes,
                             fakecuda_kernel_fn fn);
/* The CUkernel for a registered function (the same object, as a CUkernel
 * cast to CUfunction is launchable on the real driver too). */
CUkernel fakecuda_kernel_handle(CUfunction f);
/* Times a registered kernel has actually run (graph replays included,
 * captured launches not). */
uint64_t fakecuda_kernel_runs(CUfunction f);
/* Runs of every kernel registered under name (a module's, a builtin's). */
uint64_t fakecuda_kernel_runs_named(const char *name);

/* --- call counters and fault injection ----------------------------------- */

/* NULL-terminated list of every ABI symbol of the driver API the fake
 * exports (each one is counted and can be made to fail). */
const char *const *fakecuda_functions(void);
/* NULL-terminated list of the names cuGetProcAddress knows (base names such
 * as "cuMemAlloc", as a CUDA runtime asks for them). */
const char *const *fakecuda_proc_names(void);

/* Calls of one ABI symbol since start or the last reset (failed ones
 * included); 0 for unknown names. */
uint64_t fakecuda_calls(const char *name);
/* Calls of all driver functions. */
uint64_t fakecuda_calls_total(void);
/* Zeroes every counter. Armed nth-call rules keep their distance: a rule
 * that was 2 calls away still fires 2 calls from now. */
void fakecuda_reset_counts(void);

/* The nth call of `name` from now (nth = 1: the next call) fails with err
 * and has no effect. Several rules may be armed. 0, or -ENOENT for an
 * unknown name, -EINVAL for nth 0 or err 0, -ENOSPC when 64 rules exist. */
int fakecuda_fail(const char *name, uint64_t nth, CUresult err);
/* Every call of `name` from now on fails with err. */
int fakecuda_fail_every(const char *name, CUresult err);
/* Removes every rule (including those from WOFAKE_FAIL). */
void fakecuda_fail_clear(void);
/* Calls that failed by injection so far. */
uint64_t fakecuda_injected(void);

/* --- memory -------------------------------------------------------------- */

enum fakecuda_kind {
    FAKECUDA_ANY = 0,
    FAKECUDA_DEVICE = 1,     /* cuMemAlloc */
    FAKECUDA_ASYNC = 2,      /* cuMemAllocAsync */
    FAKECUDA_MANAGED = 3,    /* cuMemAllocManaged */
    FAKECUDA_HOST = 4,       /* cuMemHostAlloc / cuMemAllocHost (pinned) */
    FAKECUDA_REGISTERED = 5, /* cuMemHostRegister (not owned: bytes are the user's) */
    FAKECUDA_VMM = 6,        /* cuMemCreate physical handles */
    FAKECUDA_KIND_MAX
};

struct fakecuda_alloc {
    uint64_t base;
    uint64_t size;
    int kind; /* enum fakecuda_kind */
    unsigned flags;
};

/* Live bytes / allocations of a kind (FAKECUDA_ANY: all kinds). */
uint64_t fakecuda_live_bytes(int kind);
size_t fakecuda_live_count(int kind);
/* Copies up to max live allocations (VMM: handles, base 0) into out; returns
 * the number that exist. */
size_t fakecuda_allocations(struct fakecuda_alloc *out, size_t max);
/* Device bytes in use as cuMemGetInfo counts them. */
uint64_t fakecuda_device_used(void);
/* The device bytes this process holds as NVML's per-process figure counts
 * them: device, stream-ordered and VMM allocations and loaded modules;
 * managed pages not (libfakenvml, fake-nvml.c). */
uint64_t fakecuda_process_bytes(void);
/* Device bytes UVM's cache holds (WOFAKE_UVM_CACHE=1). */
uint64_t fakecuda_uvm_cached(void);

/* Locations as the driver writes them: a device ordinal >= 0, CU_DEVICE_CPU
 * (-1), CU_DEVICE_INVALID (-2); FAKECUDA_LOC_NONE: managed, never prefetched
 * (pages not populated anywhere). */
#define FAKECUDA_LOC_NONE (-3)

/* Where the byte at p resides now: a device ordinal when it has a copy on a
 * device (the lowest one), CU_DEVICE_CPU when only on the host,
 * FAKECUDA_LOC_NONE when not populated. Pinned/registered host memory:
 * CU_DEVICE_CPU; device and VMM memory: its device. CU_DEVICE_INVALID when p
 * is not in any allocation. */
int fakecuda_where(const void *p);

struct fakecuda_page_state {
    uint32_t resident;      /* bit 0: host copy; bit 1+d: copy on device d */
    int preferred;          /* SET_PREFERRED_LOCATION: ordinal, CU_DEVICE_CPU, or CU_DEVICE_INVALID */
    uint32_t accessed_by;   /* bit 0: host; bit 1+d: device d */
    int read_mostly;
    int last_prefetch;      /* location of the last prefetch, CU_DEVICE_INVALID if none */
};
/* State of the managed page holding p: 0, or -ENOENT when p is not managed. */
int fakecuda_managed_state(const void *p, struct fakecuda_page_state *out);
/* Managed bytes with a copy at loc (ordinal, or CU_DEVICE_CPU). */
uint64_t fakecuda_managed_resident(int loc);
/* Managed bytes copied to loc (pages that had no copy there) by prefetches
 * and by faults of declared accesses (fakecuda_access), since start or
 * fakecuda_reset(): the PCIe traffic a prefetcher caused or failed to avoid. */
uint64_t fakecuda_migrated_bytes(int loc);

/* Declares an access, as a kernel body (loc = its device) or host code
 * (loc = CU_DEVICE_CPU) would make it, and applies UVM semantics to managed
 * pages: a copy at loc is a hit; a page loc is accessed-by and that is
 * populated elsewhere is reached in place (remote bytes); anything else
 * faults and migrates to loc (reads of read-mostly pages duplicate, writes
 * collapse copies), counted in fakecuda_migrated_bytes too. Kernels are host
 * functions: nothing tracks their loads, so tests' kernels call this for the
 * ranges they read or write. Returns the number of faulting pages, -ENOENT
 * (not driver memory), -EINVAL. Non-managed memory only counts remote bytes
 * (pinned host memory from a device, device memory from the host). */
long fakecuda_access(const void *p, size_t n, int loc, int write);
/* Pages that faulted on access from loc / bytes accessed in place from loc,
 * since start or fakecuda_reset(). */
uint64_t fakecuda_faults(int loc);
uint64_t fakecuda_remote_bytes(int loc);

/* --- launches and capture ------------------------------------------------ */

struct fakecuda_launch {
    CUfunction func;
    uint32_t grid[3], block[3];
    unsigned shared_mem;
    CUstream stream;  /* as the caller gave it */
    int from_graph;   /* 1: replayed by cuGraphLaunch */
    int captured;     /* 1: recorded into a capture, not run */
    uint64_t seq;     /* 1, 2, ... over all launches, run or captured */
};
/* Kernels run (not captured) since start or reset. */
uint64_t fakecuda_launches_run(void);
/* Launches recorded into captures. */
uint64_t fakecuda_launches_captured(void);
/* The last launch (run or captured): 0, or -ENOENT if none. */
int fakecuda_last_launch(struct fakecuda_launch *out);
/* Calls that passed a stream after cuStreamDestroy had destroyed it (each
 * refused with CUDA_ERROR_INVALID_HANDLE; the real driver may crash). */
uint64_t fakecuda_dead_stream_uses(void);
/* WOFAKE_STREAMS_BEHIND: operations that went into the queue of a stream
 * behind its caller (tests/fake/fake-behind.c), since start. */
uint64_t fakecuda_behind_queued(void);
/* Number of streams capturing now (any mode). */
int fakecuda_capturing(void);
/* Number of operations in a graph or graph exec (-EINVAL for a bad handle). */
long fakecuda_graph_ops(CUgraph g);
long fakecuda_graph_exec_ops(CUgraphExec e);

/* Zeroes counters, launch and migration statistics; leaves memory, handles
 * and rules. */
void fakecuda_reset(void);

/* --- fake libcudart.so.13 ------------------------------------------------- */

/* Maps a host stub address (what cudaLaunchKernel gets as `func`) to a
 * driver function, as a real fatbin registration would. 0 or -EINVAL. */
int fakecudart_register(const void *stub, CUfunction f);
/* Entry points the runtime resolved through the driver's cuGetProcAddress. */
int fakecudart_resolved(void);

#ifdef __cplusplus
}
#endif
