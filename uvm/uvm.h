/* uvm/uvm.h: the contract between preload/ (hooks), uvm/ (placements, the
 * public API's logic, the consumer/prefetch thread) and tools/.
 *
 * preload/ calls only the functions declared here; uvm/ never calls a hook
 * and reaches the driver only through the struct wo_driver table it is given
 * (the real driver in the shim, the fake one in tests). */
#pragma once

#include <cuda.h>

#include "core/event.h"
#include "core/registry.h"

/* The driver functions uvm/ calls. preload/ fills it from the real table
 * (the symbols the driver itself resolves, never our hooks). A NULL member
 * means the driver lacks it; uvm/ must cope. Names follow the ABI symbol. */
struct wo_driver {
    CUresult (*cuInit)(unsigned int flags);
    CUresult (*cuGetErrorName)(CUresult err, const char **str);
    CUresult (*cuDriverGetVersion)(int *ver);
    CUresult (*cuDeviceGet)(CUdevice *dev, int ordinal);
    CUresult (*cuDeviceGetCount)(int *count);
    CUresult (*cuDeviceGetAttribute)(int *v, CUdevice_attribute attr, CUdevice dev);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice dev);
    CUresult (*cuCtxGetCurrent)(CUcontext *ctx);
    CUresult (*cuCtxSetCurrent)(CUcontext ctx);
    CUresult (*cuCtxGetDevice)(CUdevice *dev);
    CUresult (*cuCtxCreate_v4)(CUcontext *ctx, CUctxCreateParams *params, unsigned int flags,
                               CUdevice dev);
    CUresult (*cuCtxCreate_v2)(CUcontext *ctx, unsigned int flags, CUdevice dev);
    CUresult (*cuCtxDestroy_v2)(CUcontext ctx);
    CUresult (*cuCtxSetLimit)(CUlimit limit, size_t value);
    CUresult (*cuMemGetInfo_v2)(size_t *free, size_t *total);
    CUresult (*cuMemAlloc_v2)(CUdeviceptr *p, size_t size);
    CUresult (*cuMemFree_v2)(CUdeviceptr p);
    CUresult (*cuMemAllocManaged)(CUdeviceptr *p, size_t size, unsigned int flags);
    CUresult (*cuMemHostAlloc)(void **p, size_t size, unsigned int flags);
    CUresult (*cuMemFreeHost)(void *p);
    CUresult (*cuMemHostGetDevicePointer_v2)(CUdeviceptr *d, void *p, unsigned int flags);
    CUresult (*cuMemHostRegister_v2)(void *p, size_t size, unsigned int flags);
    CUresult (*cuMemHostUnregister)(void *p);
    CUresult (*cuMemAdvise_v2)(CUdeviceptr p, size_t size, CUmem_advise advice, CUmemLocation loc);
    CUresult (*cuMemPrefetchAsync_v2)(CUdeviceptr p, size_t size, CUmemLocation loc,
                                      unsigned int flags, CUstream s);
    CUresult (*cuMemcpy)(CUdeviceptr dst, CUdeviceptr src, size_t size);
    CUresult (*cuMemcpyAsync)(CUdeviceptr dst, CUdeviceptr src, size_t size, CUstream s);
    CUresult (*cuMemsetD8_v2)(CUdeviceptr p, unsigned char v, size_t n);
    CUresult (*cuMemsetD32Async)(CUdeviceptr p, unsigned int v, size_t n, CUstream s);
    CUresult (*cuStreamCreate)(CUstream *s, unsigned int flags);
    CUresult (*cuStreamDestroy_v2)(CUstream s);
    CUresult (*cuStreamSynchronize)(CUstream s);
    CUresult (*cuStreamQuery)(CUstream s);
    CUresult (*cuStreamWaitEvent)(CUstream s, CUevent e, unsigned int flags);
    CUresult (*cuStreamIsCapturing)(CUstream s, CUstreamCaptureStatus *status);
    CUresult (*cuEventCreate)(CUevent *e, unsigned int flags);
    CUresult (*cuEventDestroy_v2)(CUevent e);
    CUresult (*cuEventRecord)(CUevent e, CUstream s);
    CUresult (*cuEventQuery)(CUevent e);
    CUresult (*cuEventSynchronize)(CUevent e);
    CUresult (*cuEventElapsedTime)(float *ms, CUevent start, CUevent end);
    CUresult (*cuFuncGetName)(const char **name, CUfunction f);
    CUresult (*cuPointerGetAttribute)(void *data, CUpointer_attribute attr, CUdeviceptr p);
    CUresult (*cuModuleLoadData)(CUmodule *m, const void *image);
    CUresult (*cuModuleGetFunction)(CUfunction *f, CUmodule m, const char *name);
    CUresult (*cuModuleUnload)(CUmodule m);
    CUresult (*cuLaunchKernel)(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                               unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem,
                               CUstream s, void **params, void **extra);
    /* VMM, for late binding (uvm/bind.c) */
    CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *h, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags);
    CUresult (*cuMemRelease)(CUmemGenericAllocationHandle h);
    CUresult (*cuMemAddressReserve)(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
                                    unsigned long long flags);
    CUresult (*cuMemAddressFree)(CUdeviceptr p, size_t size);
    CUresult (*cuMemMap)(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                         unsigned long long flags);
    CUresult (*cuMemUnmap)(CUdeviceptr p, size_t size);
    CUresult (*cuMemSetAccess)(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc,
                               size_t count);
    CUresult (*cuMemGetAllocationGranularity)(size_t *g, const CUmemAllocationProp *prop,
                                              CUmemAllocationGranularity_flags option);
    /* every stream of the context idle, before a re-backing (CUDA 13: _v2 with
     * a context, NULL the current one; older drivers: without) */
    CUresult (*cuCtxSynchronize_v2)(CUcontext ctx);
    CUresult (*cuCtxSynchronize)(void);
    /* stream memory operations: the picked copies on the copy engine
     * (uvm/picks-dma.c) */
    CUresult (*cuStreamWaitValue32_v2)(CUstream s, CUdeviceptr addr, cuuint32_t value,
                                       unsigned int flags);
    CUresult (*cuStreamWriteValue32_v2)(CUstream s, CUdeviceptr addr, cuuint32_t value,
                                        unsigned int flags);
};

/* Every member of struct wo_driver, in order: the one list that fills it
 * (wo_driver_fill) so preload/ and the tests never enumerate it again. A
 * static assertion in uvm/init.c keeps the list and the struct in step. */
#define WO_DRIVER_FUNCS(X)                                                                         \
    X(cuInit) X(cuGetErrorName) X(cuDriverGetVersion) X(cuDeviceGet) X(cuDeviceGetCount)           \
    X(cuDeviceGetAttribute) X(cuDevicePrimaryCtxRetain) X(cuCtxGetCurrent) X(cuCtxSetCurrent)      \
    X(cuCtxGetDevice) X(cuCtxCreate_v4) X(cuCtxCreate_v2) X(cuCtxDestroy_v2) X(cuCtxSetLimit)      \
    X(cuMemGetInfo_v2) X(cuMemAlloc_v2) X(cuMemFree_v2) X(cuMemAllocManaged) X(cuMemHostAlloc)     \
    X(cuMemFreeHost) X(cuMemHostGetDevicePointer_v2) X(cuMemHostRegister_v2)                     \
    X(cuMemHostUnregister) X(cuMemAdvise_v2) X(cuMemPrefetchAsync_v2)    \
    X(cuMemcpy) X(cuMemcpyAsync) X(cuMemsetD8_v2) X(cuMemsetD32Async) X(cuStreamCreate) X(cuStreamDestroy_v2) X(cuStreamSynchronize)    \
    X(cuStreamQuery) \
    X(cuStreamWaitEvent) X(cuStreamIsCapturing) X(cuEventCreate) X(cuEventDestroy_v2) X(cuEventRecord) X(cuEventQuery)    \
    X(cuEventSynchronize) X(cuEventElapsedTime) X(cuFuncGetName) X(cuPointerGetAttribute) X(cuModuleLoadData)          \
    X(cuModuleGetFunction) X(cuModuleUnload) X(cuLaunchKernel) X(cuMemCreate) X(cuMemRelease)      \
    X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess)         \
    X(cuMemGetAllocationGranularity) X(cuCtxSynchronize_v2) X(cuCtxSynchronize)    \
    X(cuStreamWaitValue32_v2) X(cuStreamWriteValue32_v2)

/* Fills every member with lookup(ud, ABI name) (NULL where it returns NULL).
 * Returns the number of members left NULL. */
int wo_driver_fill(struct wo_driver *d, void *(*lookup)(void *ud, const char *name), void *ud);

/* Set once by preload/ before any other call (tests pass their own table). */
void wo_uvm_set_driver(const struct wo_driver *drv);
const struct wo_driver *wo_uvm_driver(void);

/* Heavy init on first relevant call: loads WOFFLOAD_POLICY, starts the
 * consumer thread. Idempotent, thread-safe. Returns 0 or -errno (the shim
 * then passes everything through). */
int wo_uvm_init(void);
/* Called at exit (and by tests): stops the thread, prints the summary,
 * writes WOFFLOAD_STATS. Must not hang, must not call into the driver after
 * the driver's own teardown (atexit ordering is documented in uvm/). */
void wo_uvm_shutdown(void);
/* In the child after fork(): forget threads, streams and contexts of the
 * parent; keep the registry (the child inherits the mappings). */
void wo_uvm_atfork_child(void);
/* Around fork(), in the forking thread: the shim's thread parked outside the
 * allocator and every lock (prepare), then let go (parent). */
void wo_uvm_atfork_prepare(void);
void wo_uvm_atfork_parent(void);

/* Allocation routing, called by every allocation hook *before* forwarding.
 * When the allocation is placeable (tag scope or open window, per policy),
 * uvm/ serves it, registers the range and returns 1 with *ret_ptr and *ret_res
 * set (the hook returns *ret_res to the engine). Returns 0 to let the hook
 * forward it untouched. `api` says which entry point asked (enum wo_api). */
int wo_uvm_alloc(size_t size, int api, CUdeviceptr *ret_ptr, CUresult *ret_res);
/* An allocation the hook forwarded failed for want of device memory: uvm/
 * gives back device memory it holds by choice (hot experts' sets,
 * uvm/picks-hot.h, the least worth first, until the allocation has room
 * as far as the free memory tells; no more are made), once the engine's
 * streams that may read it are done, and returns the bytes given back: the
 * hook tries the allocation again while they are not 0. Never during a
 * capture. */
uint64_t wo_uvm_engine_oom(size_t size);
/* fit's squeeze (uvm/place-fit.c) allocates the device's free memory for a
 * moment, to take UVM's cached pages back: an engine allocation made then
 * may fail. The hooks read the generation before the driver call, and on
 * an out-of-memory ask whether a squeeze ran meanwhile: then (after it
 * ended: a few milliseconds) the call is made again. Returns whether to;
 * *seen becomes the generation now. */
uint64_t wo_uvm_squeeze_gen(void);
bool wo_uvm_squeeze_overlapped(uint64_t *seen);
/* Free routing: 1 when ptr is a range uvm/ served (it freed it and set
 * *ret_res), 0 to forward. */
int wo_uvm_free(CUdeviceptr ptr, CUresult *ret_res);

/* The engine is about to allocate size bytes of device memory itself
 * (cuMemAlloc, cudaMalloc) after seal: under fit, the engine's allocations
 * after seal beyond fit's reserve come out of fit's device weights first,
 * so that the process stays within the fit size (place-fit.c). */
void wo_uvm_engine_alloc_ahead(size_t size);
/* The hooks report allocations they forwarded (so tags can find them and
 * launches can be attributed) and frees of them. */
void wo_uvm_observe_alloc(CUdeviceptr ptr, size_t size, uint32_t range_flags, int api);
void wo_uvm_observe_free(CUdeviceptr ptr, int api);

/* Capture state, kept by preload/ and read by the shim's threads: the number
 * of streams capturing right now, in any mode (relaxed too: preload/capture.c
 * says why). The prefetcher, the stream executor and the pinned-copy worker
 * call the driver for nothing while a capture is under way. */
extern int wo_captures_live;

/* The shim's threads inside a driver call (the prefetcher, the stream
 * executor, the pinned-copy worker: a count). With wo_captures_live it forms
 * a handshake (both seq_cst): a thread raises busy, then checks captures; a
 * capture begin raises captures, then waits for busy to fall. So no call of
 * theirs is in flight, or starts, once a capture begins (such a call could
 * invalidate it). */
extern int wo_prefetch_busy;

/* Of wo_captures_live, the captures in global or thread-local mode: these
 * forbid other threads' unsafe calls, a relaxed capture forbids them
 * nothing. The copy engine's thread (uvm/picks-dma.c) calls the driver only
 * for its own stream and for events the engine recorded before any capture
 * began, so it keeps out of these alone: held off by a relaxed capture it
 * could not issue a copy that the engine's stream waits for while another
 * thread's cuMemFree (or cuMemHostRegister) waited for that stream: a
 * hang, and the likely shape of llama-batched-bench's stall on the H200
 * (llama.cpp captures in relaxed mode). wo_dma_busy is its side of the same
 * handshake: a strict capture's begin waits for it to fall, a relaxed
 * one's does not. */
extern int wo_captures_strict;
extern int wo_dma_busy;

/* The copy engine's gate (uvm/picks-dma.c), around every driver call that
 * waits for the context's work to finish while holding a lock the shim's
 * copy thread needs: cuMemFree, cuMemFreeHost, cuMemHostUnregister,
 * cuMemUnmap, cuMemRelease, module and library unloads; and, when the copy
 * engine may run (wo_uvm_gate_armed), the engine's context, stream and
 * event waits, and every copy it enqueues: a synchronous copy, or one into
 * pageable memory, waits in the driver (on the H200 the engine's thread
 * spun in a driver call while the copy thread sat in cuMemcpyAsync: most
 * likely PyTorch's .item()); any other copy waits on the GPU, in a copy
 * queue that the copy thread's copies share (preload/copy.c).
 * An engine stream may be waiting on the GPU for a flag only that thread
 * raises; begin lets no new picked copy onto the copy engine (the kernels
 * copy them) and waits until the queued ones are issued (at most 2 s, then
 * says so), end lets them in again. Nests; costs a few atomics while the
 * copy engine has never started, and a lock besides once it has. The
 * hooks call it for the engine's calls, uvm/ for its own. (The CPU copies
 * of the engine's memory, the copy engine's pinned mirrors among them, are
 * kept safe from frees by uvm/'s books instead: wo_uvm_copy_live.) */
void wo_uvm_quiesce_begin(void);
void wo_uvm_quiesce_end(void);
/* WOFFLOAD_PICKS_ENGINE, or 0 when the copy engine must stay off: CUDA's
 * lazy module loading with WOFFLOAD_PICKS_LAZY=0 (a kernel's first launch
 * loads its module, and the load waits for the context's work, a stream's
 * wait for the copy thread's flag among it, while the GPU runs none of the
 * copy stream's copies: the H200 hung so at the first job in 3 rows of 4
 * lazy, 0 of 3 eager: bench/results/engine-queues-*). By default
 * (WOFFLOAD_PICKS_LAZY=1) each kernel's first launch goes behind the gate
 * instead (wo_uvm_lazy_gate). With WOFFLOAD_PICKS_LAZY=0 the preload's
 * constructor asks for eager loading when WOFFLOAD_PICKS_ENGINE is set and
 * CUDA_MODULE_LOADING is not; any other value of it then keeps the copy
 * engine off, said once. */
unsigned wo_uvm_picks_engine(void);
/* Whether the copy engine may run (wo_uvm_picks_engine): the hooks
 * gate the engine's waits and copies from the start then, not from the
 * engine's first job (a wait entered ungated just before it would hold the
 * first copy off); with it 0 (the default) they never do. */
bool wo_uvm_gate_armed(void);
/* Whether the copy engine may run under lazy module loading
 * (WOFFLOAD_PICKS_LAZY): then a kernel's first launch, which may load its
 * module and wait for the context's work, goes behind the gate too
 * (preload/first-launch.h). */
bool wo_uvm_lazy_gate(void);

/* Whether launches are worth observing (scan parameters, push events): set
 * at init to "the policy places something, or a trace is recorded". With
 * an empty policy the launch hooks only count and forward. */
extern int wo_launch_scan;
/* WOFFLOAD_SCAN_WORDS, set at init beside it: the launch path reads this
 * word, not the settings. */
extern uint32_t wo_scan_words;

/* Which events the hooks push (docs/interposition.md, "Which launches become
 * events"). 1: all of them, as a trace or WOFFLOAD_OBSERVE's per-range books
 * need. 0 (set at init when neither is asked for): only what the consumer
 * learns from: launches that touch a watched range (core/registry.h) and
 * copies that write one; the other launches, syncs and reads are counted,
 * not pushed. */
extern int wo_events_all;

/* The event ring the hooks push into and the consumer thread drains. NULL
 * until wo_uvm_init() made it. */
extern struct wo_ring *wo_events;

/* Which entry point produced an allocation/event (struct wo_event.api). */
enum wo_api {
    WO_API_UNKNOWN = 0,
    WO_API_CUDA_MALLOC,
    WO_API_CUDA_MALLOC_ASYNC,
    WO_API_CUDA_MALLOC_MANAGED,
    WO_API_CU_MEM_ALLOC,
    WO_API_CU_MEM_ALLOC_ASYNC,
    WO_API_CU_MEM_ALLOC_MANAGED,
    WO_API_CU_MEM_MAP,
    WO_API_CUDA_LAUNCH,
    WO_API_CU_LAUNCH,
    WO_API_CU_LAUNCH_EX,
    WO_API_GRAPH,
    WO_API_MAX
};

/* Public API logic behind include/woffload.h (preload/ exports thin
 * wrappers that call these). Same contracts as the header. */
int wo_api_tag_push(const char *name);
int wo_api_tag_pop(void);
int wo_api_tag(const void *ptr, size_t size, const char *name);
int wo_api_expect(const char *name, size_t bytes);
int wo_api_expect_end(void);
int wo_api_window_open(void);
int wo_api_window_close(void);
int wo_api_seal(void);
/* rows: woffload_moe_picks_rows (its ids checked to be device memory; its
 * registrations claim a tensor only while they hold ids: wo_picks_claims),
 * else woffload_moe_picks */
int wo_api_moe_picks(const void *experts, size_t bytes, unsigned n_experts, const void *ids,
                     size_t per_row, size_t n_rows, size_t row_stride, unsigned id_bytes,
                     bool rows);
long wo_api_stats(char *buf, size_t len);
int wo_api_readonly(const void *ptr, size_t size);
int wo_api_read_in_place(const void *ptr, size_t bytes, int on);
int wo_api_departure_lag(unsigned ranges);
