/* tests/fake/fake-priv.h: state shared by the fake driver's files
 * (fake-core.c: counters, injection, init, devices, contexts, errors;
 * fake-mem.c: allocations, copies, managed memory, VMM; fake-exec.c:
 * streams, events, kernels, capture, graphs; fake-proc.c: cuGetProcAddress).
 *
 * Built with __CUDA_API_VERSION_INTERNAL so cuda.h declares every ABI symbol
 * (the _v2, legacy and _ptsz/_ptds variants) under its own name and each
 * definition is checked against NVIDIA's prototype. */
#pragma once

#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdint.h>

#include "fake-syms.h"
#include "fakecuda.h"

#define FK_EXPORT __attribute__((visibility("default")))

enum fk_sym_id {
#define X(sym, chk) FK_ID_##sym,
    FK_SYMS(X)
#undef X
        FK_NSYMS
};

/* Counts the call, applies injected failures, then the init/context rule of
 * the symbol. Returns CUDA_SUCCESS to go on. */
CUresult fk_enter(enum fk_sym_id id);

/* Every exported driver function starts with this, so counting and fault
 * injection cover all of them the same way. */
#define FK_ENTER(sym)                                                                              \
    do {                                                                                           \
        CUresult fk_r_ = fk_enter(FK_ID_##sym);                                                    \
        if (fk_r_ != CUDA_SUCCESS)                                                                 \
            return fk_r_;                                                                          \
    } while (0)

/* The one lock for the fake's maps (allocations, streams, captures, graphs). */
extern pthread_mutex_t fk_lock;
static inline void fk_lock_(void) { pthread_mutex_lock(&fk_lock); }
static inline void fk_unlock_(void) { pthread_mutex_unlock(&fk_lock); }

/* Settings from the environment (fake-core.c). */
extern uint64_t fk_total_mem;
/* WOFAKE_MODULE_BYTES: device memory a loaded module holds (a real
 * context's kernels live in device memory, outside any allocation) */
extern uint64_t fk_module_bytes;
extern bool
    fk_lazy; /* WOFAKE_LAZY: a kernel not yet got through a module loads at its first launch */
/* Device bytes held outside allocations (modules), added or given back. */
void fk_dev_bytes_add(int64_t delta);
extern bool fk_managed_guard;                     /* WOFAKE_MANAGED_GUARD */
extern bool fk_uvm_cache;                         /* WOFAKE_UVM_CACHE */
extern unsigned long fk_managed_guard_violations;
extern int fk_ndevices;
/* WOFAKE_PROC_MISSING=success: cuGetProcAddress answers a missing symbol (or
 * one newer than the version asked for)
 * with CUDA_SUCCESS and *pfn = NULL (driver 580 behaviour) instead
 * of CUDA_ERROR_NOT_FOUND. */
extern bool fk_proc_missing_success;

#define FK_DRIVER_VERSION 13000
#define FK_PAGE 4096u
#define FK_GRANULE (2u << 20)

/* --- contexts (fake-core.c) ---------------------------------------------- */
struct CUctx_st {
    uint32_t magic;
    int device;
    int refs;
};
#define FK_CTX_MAGIC 0xc7c7c7c7u
CUcontext fk_current_ctx(void);
bool fk_ctx_valid(CUcontext c);
struct CUctx_st *fk_primary_ctx(int dev);
bool fk_device_valid(int dev);

/* --- memory (fake-mem.c) ------------------------------------------------- */
/* The allocation holding [p, p+n): its kind (enum fakecuda_kind) or -1. */
int fk_mem_kind(uintptr_t p, size_t n);
/* Counted device bytes. */
uint64_t fk_device_used_locked(void);
/* Zeroes the migration statistics (fakecuda_reset). */
void fk_mem_reset_stats(void);
/* Frees graph-owned async allocations (called with fk_lock held). */
void fk_mem_free_locked(uintptr_t p);

/* --- streams and capture (fake-exec.c) ----------------------------------- */
struct fk_op;
struct fk_capture;

/* Resolves a stream handle as given to a function (per_thread: the _ptsz
 * variant, where NULL means the per-thread stream). NULL when invalid. */
struct CUstream_st *fk_stream(CUstream s, bool per_thread);

/* Enqueue decision for an async operation on stream s: returns
 * CUDA_SUCCESS with *cap set when the stream is capturing (record the op
 * with fk_capture_add), CUDA_SUCCESS with *cap NULL to run it now, or an
 * error (bad stream, implicit capture dependency). Takes fk_lock itself. */
CUresult fk_stream_begin_op(CUstream s, bool per_thread, struct fk_capture **cap);
/* The same for an operation bound to context ctx (an event's): as the
 * driver, CUDA_ERROR_INVALID_HANDLE when the stream is another context's
 * (the NULL and per-thread streams are the current context's). */
CUresult fk_stream_begin_op_in(CUstream s, bool per_thread, CUcontext ctx, struct fk_capture **cap);

/* What a capture records (prefetches cannot be captured: driver 580). */
enum fk_op_type { FK_OP_KERNEL = 1, FK_OP_COPY, FK_OP_SET, FK_OP_HOST, FK_OP_ALLOC, FK_OP_FREE };
struct fk_op {
    int type;
    union {
        struct {
            struct CUfunc_st *f;
            uint32_t grid[3], block[3];
            unsigned shmem;
            uint8_t *args; /* param bytes, laid out by the function's offsets */
            bool packed;   /* launched with the `extra` form: a node gives it back so */
        } k;
        struct {
            void *dst;
            const void *src;
            size_t n;
        } cp;
        struct {
            void *dst;
            uint32_t val;
            unsigned esz;
            size_t n;
        } set;
        struct {
            CUhostFn fn;
            void *ud;
        } host;
        struct { /* a graph's memory node: nothing to run (the fake's memory
                  * is made at capture and stays valid) */
            CUdeviceptr dptr;
            size_t size;
        } mem;
    };
};
/* Appends a copy of op to the capture (args copied by the caller). */
CUresult fk_capture_add(struct fk_capture *cap, const struct fk_op *op);
CUdeviceptr fk_capture_reuse(struct fk_capture *cap, size_t size);

/* "Unsafe" calls (synchronous allocation and free, context
 * synchronisation) made while a capture forbids them:
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and the offending captures are
 * invalidated. */
CUresult fk_capture_check_unsafe(void);

/* A synchronous operation on the default stream (legacy, or per-thread for
 * the _ptds variants): refused like a stream synchronisation when that
 * stream captures, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT when the legacy
 * stream would wait on a capturing blocking stream. Measured on driver 580:
 * a synchronous cuMemcpyHtoD during a global capture on a non-blocking
 * stream succeeds and leaves the capture intact. */
CUresult fk_sync_op(bool per_thread);

/* Invalidates a capture (work that cannot be captured was enqueued). */
void fk_capture_invalidate(struct fk_capture *cap);

/* Runs one op now (memory ops; kernels in fake-exec.c). */
void fk_op_run(const struct fk_op *op);

/* --- streams behind their callers (fake-behind.c) ------------------------
 * WOFAKE_STREAMS_BEHIND=1: a stream wait not met when enqueued puts its
 * stream behind, and later work on it queues until a device thread runs
 * it. */
enum fk_item_kind {
    FK_ITEM_OP = 1,
    FK_ITEM_EVENT,
    FK_ITEM_WAIT_VALUE,
    FK_ITEM_WRITE_VALUE,
    FK_ITEM_WAIT_EVENT
};
struct fk_item {
    int kind;
    struct fk_op op; /* FK_ITEM_OP: owns a kernel's argument copy */
    CUevent ev;      /* FK_ITEM_EVENT: its record; FK_ITEM_WAIT_EVENT */
    uint32_t *addr;  /* the value items */
    uint32_t value;  /* theirs; the event items': the record's seq (fake-exec.c) */
    unsigned flags;
};
struct fk_behind; /* one stream's queue */
bool fk_behind_enabled(void);
bool fk_behind_busy(const struct fk_behind *q); /* NULL: an empty queue */
bool fk_behind_any(void);                       /* any queue not empty */
void fk_behind_describe(FILE *f);               /* each busy queue's head, to f */
/* The queue the k-th stream made shares (WOFAKE_QUEUES; 0: the default
 * streams'), NULL: a queue of its own. */
struct fk_behind *fk_behind_hw(unsigned long k);
/* Appends it to *q (made on first use); takes ownership of it->op. */
CUresult fk_behind_push(struct fk_behind **q, const struct fk_item *it);
/* Waits until q is empty (NULL: an empty queue). */
CUresult fk_behind_drain(const struct fk_behind *q);
/* WOFAKE_COPY_QUEUE=1: async copies and memsets of every stream go through
 * one copy queue, each behind a wait for its stream's earlier work
 * (fake-behind.c). fk_copy_queue_took runs or queues op (a copy or set,
 * owned then) enqueued on stream s (cap: fk_stream_begin_op's) and says so,
 * *r its result; false: not its to take (the mode off, a capture, nothing
 * to copy). */
bool fk_copy_queue_on(void);
bool fk_copy_queue_took(CUstream s, bool pt, const struct fk_capture *cap, struct fk_op *op,
                        CUresult *r);
CUevent fk_event_queued(void);
struct fk_behind **fk_stream_queue(CUstream s, bool pt);
/* A copy op as a copy engine makes it, from the device thread: aligned
 * 8-byte words, each a relaxed atomic load and store, so that a host
 * thread's atomic read of the destination (the shim reads counters a copy
 * brings back while the next copy lands) is no data race to TSan; memmove
 * for overlapping or unaligned ranges and for other ops (fake-mem.c). */
void fk_op_copy_words(const struct fk_op *op);
/* What the device thread calls back (fake-exec.c). */
void fk_exec_op(const struct fk_op *op);
void fk_op_release(struct fk_op *op);
/* Record seq of e (fk_item.value) ran; whether it is still queued. */
void fk_event_done(CUevent e, uint32_t seq);
bool fk_event_pending(CUevent e, uint32_t seq);
bool fk_value_met(uint32_t have, uint32_t want, unsigned how);
uint64_t fk_wait_limit_ns(void);
/* A stream's queue when capture pointer cap is one of a stream behind
 * (fk_stream_begin_op gives such a pointer: fk_capture_add queues the op);
 * the caller that cannot queue its operation (a stream-ordered allocation
 * or free, a prefetch) waits for that stream instead: *cap becomes NULL. */
bool fk_capture_deferred(const struct fk_capture *cap);
CUresult fk_capture_settle(struct fk_capture **cap);

/* --- the device's engines ------------------------------------------------ */
/* A copy's bytes and a kernel's run, one at a time (fake-mem.c): the fake's
 * device does one memory operation at once, so a copy that lands while a
 * kernel reads the same buffer (the shim's rescue: a late copy of the same
 * bytes) is ordered, as a GPU's engines order their accesses. Leaf lock:
 * nothing else is taken under it. */
void fk_dev_memmove(void *dst, const void *src, size_t n);
void fk_dev_enter(void);
void fk_dev_leave(void);

/* --- misc ---------------------------------------------------------------- */
uint64_t fk_now_ns(void);
/* The driver's quiet lock (fake-exec.c): cuMemcpyAsync and
 * cuStreamWriteValue32 hold it to enqueue; a free waits holding it until no
 * caller is blocked in cuStreamWaitValue32 (CUDA_ERROR_LAUNCH_TIMEOUT past
 * WOFAKE_WAIT_MS: a GPU would hang there). */
void fk_quiet_enter(void);
void fk_quiet_leave(void);
CUresult fk_quiet_wait(void);
