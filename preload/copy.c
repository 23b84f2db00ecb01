/* preload/copy.c: the copy hooks (runtime cudaMemcpy*, driver cuMemcpy*):
 * forwarded, then recorded as WO_EV_COPY (addresses, bytes, direction,
 * stream); and the driver's memsets (cuMemsetD*), forwarded. Never
 * synchronises: an async copy is recorded when enqueued.
 * When the copy engine may run, every copy, memset and wait goes behind
 * its gate (copy_waits).
 * Before forwarding, a copy into a range the streaming executor staged
 * drops the range's device slot (uvm/hotpath.h): later launches read the
 * host copy the write makes current. */
#include "preload/hook.h"
#include "uvm/hotpath.h"

#include "core/registry.h"

/* Without a trace (wo_events_all 0) a copy is an event only when it may
 * write a watched range: the prefetcher learns from it that the engine
 * writes that range (read-mostly copies of it would be invalidated). Reads
 * (the engine's .item() calls: 18% of all events in an eager decode) and
 * copies between untracked buffers feed nothing. O(1): one lock-free lookup. */
static bool copy_wanted(uint64_t dst, uint32_t kind)
{
    struct wo_hit h;
    bool watched;

    if (__atomic_load_n(&wo_events_all, __ATOMIC_RELAXED))
        return true;
    if (kind == WO_COPY_D2H || kind == WO_COPY_H2H || wo_registry_count() == 0)
        return false;
    wo_registry_read_begin();
    watched = wo_registry_lookup(dst, &h) && h.watched;
    wo_registry_read_end();
    return watched;
}

static void record_copy(uint64_t dst, uint64_t src, uint64_t bytes, uint32_t kind, uint64_t stream,
                        void *ra)
{
    struct wo_event ev = {.type = WO_EV_COPY, .stream = stream};

    wo_count(WO_CTR_copy_calls, 1);
    wo_count(WO_CTR_copy_bytes, bytes);
    switch (kind) {
    case WO_COPY_H2D:
        wo_count(WO_CTR_copy_h2d, 1);
        break;
    case WO_COPY_D2H:
        wo_count(WO_CTR_copy_d2h, 1);
        break;
    case WO_COPY_D2D:
        wo_count(WO_CTR_copy_d2d, 1);
        break;
    default:
        wo_count(WO_CTR_copy_other, 1);
        break;
    }
    wo_count_caller(ra, WO_CALLER_COPY);
    ev.c.dst = dst;
    ev.c.src = src;
    ev.c.bytes = bytes;
    ev.c.kind = kind;
    if (!__atomic_load_n(&wo_events, __ATOMIC_RELAXED))
        return;
    if (!copy_wanted(dst, kind)) {
        wo_count(WO_CTR_events_skipped, 1);
        return;
    }
    wo_push_event(&ev);
}

static uint32_t kind_of_types(CUmemorytype src, CUmemorytype dst)
{
    bool sh = src == CU_MEMORYTYPE_HOST, dh = dst == CU_MEMORYTYPE_HOST;
    if (src == CU_MEMORYTYPE_UNIFIED || dst == CU_MEMORYTYPE_UNIFIED)
        return WO_COPY_DEFAULT;
    if (sh && dh)
        return WO_COPY_H2H;
    if (sh)
        return WO_COPY_H2D;
    if (dh)
        return WO_COPY_D2H;
    return WO_COPY_D2D;
}

static uint64_t addr_of(CUmemorytype t, const void *host, CUdeviceptr dev)
{
    return t == CU_MEMORYTYPE_HOST                                   ? (uint64_t)(uintptr_t)host
           : t == CU_MEMORYTYPE_DEVICE || t == CU_MEMORYTYPE_UNIFIED ? (uint64_t)dev
                                                                     : 0; /* an array */
}

/* The bytes from a pitched copy's first byte to its last: rows of w bytes
 * `pitch` apart (at least w: a smaller pitch is refused by the driver),
 * h rows a slice, d slices `rows` rows apart. A copy's written range for
 * the streaming executor and the load's books is that span, from the first
 * byte (base + offsets), not base and w * h: a 2-D copy into the middle of
 * a staged weight, or one whose pitch spreads its rows, must drop the
 * slot of every range it writes (uvm/hotpath.h: wo_stream_note_write). */
static uint64_t pitched_span(size_t pitch, size_t w, size_t h, size_t rows, size_t d)
{
    uint64_t p = WO_MAX((uint64_t)pitch, (uint64_t)w);

    if (!w || !h || !d)
        return 0;
    return ((uint64_t)(d - 1) * WO_MAX((uint64_t)rows, (uint64_t)h) + (h - 1)) * p + w;
}

/* The first byte of a pitched copy's side: base at x bytes, row y, slice z
 * (pitch and rows as pitched_span's); 0 for a base of 0 (an array). */
static uint64_t pitched_at(uint64_t base, size_t x, size_t y, size_t z, size_t pitch, size_t rows,
                           size_t w, size_t h)
{
    if (!base)
        return 0;
    return base +
           ((uint64_t)z * WO_MAX((uint64_t)rows, (uint64_t)h) + y) *
               WO_MAX((uint64_t)pitch, (uint64_t)w) +
           x;
}

static uint32_t kind_of_runtime(enum cudaMemcpyKind k)
{
    switch (k) {
    case cudaMemcpyHostToHost:
        return WO_COPY_H2H;
    case cudaMemcpyHostToDevice:
        return WO_COPY_H2D;
    case cudaMemcpyDeviceToHost:
        return WO_COPY_D2H;
    case cudaMemcpyDeviceToDevice:
        return WO_COPY_D2D;
    default:
        return WO_COPY_DEFAULT;
    }
}

/* Whether a copy must go behind the copy engine's gate (uvm.h:
 * wo_uvm_quiesce_begin: the jobs queued are issued first, no new one
 * meanwhile): every copy while the copy engine may run. A synchronous copy,
 * or an async one into pageable memory, waits in the driver for the
 * engine's streams while it holds a lock the copy thread needs. Any other
 * copy waits on the GPU: the driver puts it, behind a wait for its stream's
 * earlier work, in a copy queue that streams share; the copy thread's
 * copies go there too, so a copy enqueued behind a job's wait would hold
 * the very copies that release the wait (transformers' mid-step copies
 * hung the H200 so, with every engine stream apart from the copy stream:
 * bench/results/engine-queues-*). Through the gate the jobs' copies are
 * ahead of it in that queue. With nothing queued the gate lets it through
 * at once (a look at two counters). A copy into a capture the shim knows
 * (stream, with the hook's per-thread flag) is not enqueued on the GPU: not
 * gated (the copy thread keeps out of strict captures, so the gate would
 * wait its 2 s for every such copy). */
static bool copy_waits(uint64_t stream)
{
    return wo_uvm_gate_armed() && !wo_capture_of(stream);
}

/* Before seal the engine's copies are timed and counted by where they land
 * (uvm/hotpath.h: wo_uvm_load_copy); 0, no clock read, after it. */
static inline uint64_t load_t0(void)
{
    return wo_uvm_load_timing() ? wo_now_ns() : 0;
}

/* The call behind the gate when it waits (copy_waits), counted in ctr. */
#define GATED(waits, res, call, ctr)                                                               \
    do {                                                                                           \
        bool g_ = (waits);                                                                         \
        if (g_) {                                                                                  \
            wo_count(ctr, 1);                                                                      \
            wo_uvm_quiesce_begin();                                                                \
        }                                                                                          \
        res = call;                                                                                \
        if (g_)                                                                                    \
            wo_uvm_quiesce_end();                                                                  \
    } while (0)

/* The common shape of every driver copy hook: span, the bytes from dst's
 * first written byte to its last (a pitched copy's rows and the gaps
 * between them), bytes what it moves. */
#define COPY_HOOK_SPAN(call, dst, span, src, bytes, kind, stream)                                  \
    do {                                                                                           \
        CUresult res_;                                                                             \
        WO_HOOK_ENTER(call);                                                                       \
        wo_stream_note_write((uint64_t)(dst), (uint64_t)(span));                                   \
        uint64_t sid_ = wo_stream_id(stream, wo_hook_pt[id]), t0_ = load_t0();                     \
        GATED(copy_waits(sid_), res_, call, WO_CTR_gated_copies);                                  \
        if (res_ == CUDA_SUCCESS && t0_)                                                           \
            wo_uvm_load_copy((uint64_t)(dst), (uint64_t)(bytes), wo_now_ns() - t0_);               \
        if (res_ == CUDA_SUCCESS)                                                                  \
            record_copy((uint64_t)(dst), (uint64_t)(src), (uint64_t)(bytes), kind, sid_, ra);      \
        wo_leave();                                                                                \
        return res_;                                                                               \
    } while (0)
#define COPY_HOOK(call, dst, src, bytes, kind, stream)                                             \
    COPY_HOOK_SPAN(call, dst, bytes, src, bytes, kind, stream)

CUresult wo_h_memcpy(wo_pfn_cuMemcpy real, int id, void *ra, CUdeviceptr dst, CUdeviceptr src,
                     size_t n)
{
    COPY_HOOK(real(dst, src, n), dst, src, n, WO_COPY_DEFAULT, NULL);
}

CUresult wo_h_memcpy_async(wo_pfn_cuMemcpyAsync real, int id, void *ra, CUdeviceptr dst,
                           CUdeviceptr src, size_t n, CUstream s)
{
    COPY_HOOK(real(dst, src, n, s), dst, src, n, WO_COPY_DEFAULT, s);
}

CUresult wo_h_memcpy_htod(wo_pfn_cuMemcpyHtoD_v2 real, int id, void *ra, CUdeviceptr dst,
                          const void *src, size_t n)
{
    COPY_HOOK(real(dst, src, n), dst, (uintptr_t)src, n, WO_COPY_H2D, NULL);
}

CUresult wo_h_memcpy_dtoh(wo_pfn_cuMemcpyDtoH_v2 real, int id, void *ra, void *dst, CUdeviceptr src,
                          size_t n)
{
    COPY_HOOK(real(dst, src, n), (uintptr_t)dst, src, n, WO_COPY_D2H, NULL);
}

CUresult wo_h_memcpy_dtod(wo_pfn_cuMemcpyDtoD_v2 real, int id, void *ra, CUdeviceptr dst,
                          CUdeviceptr src, size_t n)
{
    COPY_HOOK(real(dst, src, n), dst, src, n, WO_COPY_D2D, NULL);
}

CUresult wo_h_memcpy_htod_async(wo_pfn_cuMemcpyHtoDAsync_v2 real, int id, void *ra, CUdeviceptr dst,
                                const void *src, size_t n, CUstream s)
{
    COPY_HOOK(real(dst, src, n, s), dst, (uintptr_t)src, n, WO_COPY_H2D, s);
}

CUresult wo_h_memcpy_dtoh_async(wo_pfn_cuMemcpyDtoHAsync_v2 real, int id, void *ra, void *dst,
                                CUdeviceptr src, size_t n, CUstream s)
{
    COPY_HOOK(real(dst, src, n, s), (uintptr_t)dst, src, n, WO_COPY_D2H, s);
}

CUresult wo_h_memcpy_dtod_async(wo_pfn_cuMemcpyDtoDAsync_v2 real, int id, void *ra, CUdeviceptr dst,
                                CUdeviceptr src, size_t n, CUstream s)
{
    COPY_HOOK(real(dst, src, n, s), dst, src, n, WO_COPY_D2D, s);
}

/* A 2-D or 3-D copy's first byte on one side: base (0, an array: none)
 * at X bytes, row Y, slice Z, rows `pitch` apart, slices `rows` rows */
#define P_AT(p, S, z, rows)                                                                        \
    pitched_at(addr_of(p->S##MemoryType, p->S##Host, p->S##Device), p->S##XInBytes, p->S##Y, z,    \
               p->S##Pitch, rows, p->WidthInBytes, p->Height)
#define P2_KIND(p) (p ? kind_of_types(p->srcMemoryType, p->dstMemoryType) : WO_COPY_DEFAULT)
#define P2_DST(p) (p ? P_AT(p, dst, 0, 0) : 0)
#define P2_SRC(p) (p ? P_AT(p, src, 0, 0) : 0)
#define P2_SPAN(p) (p ? pitched_span(p->dstPitch, p->WidthInBytes, p->Height, 0, 1) : 0)
#define P2_BYTES(p) (p ? (uint64_t)p->WidthInBytes * p->Height : 0)
#define P3_DST(p) (p ? P_AT(p, dst, p->dstZ, p->dstHeight) : 0)
#define P3_SRC(p) (p ? P_AT(p, src, p->srcZ, p->srcHeight) : 0)
#define P3_SPAN(p)                                                                                 \
    (p ? pitched_span(p->dstPitch, p->WidthInBytes, p->Height, p->dstHeight,                       \
                      WO_MAX(p->Depth, (size_t)1))                                                 \
       : 0)
#define P3_BYTES(p) (p ? (uint64_t)p->WidthInBytes * p->Height * WO_MAX(p->Depth, (size_t)1) : 0)

CUresult wo_h_memcpy2d(wo_pfn_cuMemcpy2D_v2 real, int id, void *ra, const CUDA_MEMCPY2D *p)
{
    COPY_HOOK_SPAN(real(p), P2_DST(p), P2_SPAN(p), P2_SRC(p), P2_BYTES(p), P2_KIND(p), NULL);
}

CUresult wo_h_memcpy2d_async(wo_pfn_cuMemcpy2DAsync_v2 real, int id, void *ra,
                             const CUDA_MEMCPY2D *p, CUstream s)
{
    COPY_HOOK_SPAN(real(p, s), P2_DST(p), P2_SPAN(p), P2_SRC(p), P2_BYTES(p), P2_KIND(p), s);
}

CUresult wo_h_memcpy3d(wo_pfn_cuMemcpy3D_v2 real, int id, void *ra, const CUDA_MEMCPY3D *p)
{
    COPY_HOOK_SPAN(real(p), P3_DST(p), P3_SPAN(p), P3_SRC(p), P3_BYTES(p), P2_KIND(p), NULL);
}

CUresult wo_h_memcpy3d_async(wo_pfn_cuMemcpy3DAsync_v2 real, int id, void *ra,
                             const CUDA_MEMCPY3D *p, CUstream s)
{
    COPY_HOOK_SPAN(real(p, s), P3_DST(p), P3_SPAN(p), P3_SRC(p), P3_BYTES(p), P2_KIND(p), s);
}

CUresult wo_h_memcpy_peer(wo_pfn_cuMemcpyPeer real, int id, void *ra, CUdeviceptr dst,
                          CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n)
{
    COPY_HOOK(real(dst, dctx, src, sctx, n), dst, src, n, WO_COPY_D2D, NULL);
}

CUresult wo_h_memcpy_peer_async(wo_pfn_cuMemcpyPeerAsync real, int id, void *ra, CUdeviceptr dst,
                                CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n,
                                CUstream s)
{
    COPY_HOOK(real(dst, dctx, src, sctx, n, s), dst, src, n, WO_COPY_D2D, s);
}

/* --- memsets -------------------------------------------------------------- */

/* A memset is a copy engine's work too, queued as a copy is (copy_waits):
 * behind the gate while the copy engine may run. It writes device memory,
 * so a staged range it writes is dropped first, as for a copy; not an
 * event (nothing learns from it). */
#define MEMSET_HOOK(call, dst, bytes, stream)                                                      \
    do {                                                                                           \
        CUresult res_;                                                                             \
        WO_HOOK_ENTER(call);                                                                       \
        wo_stream_note_write((uint64_t)(dst), (uint64_t)(bytes));                                  \
        GATED(copy_waits(wo_stream_id(stream, wo_hook_pt[id])), res_, call, WO_CTR_gated_copies);  \
        wo_leave();                                                                                \
        return res_;                                                                               \
    } while (0)

#define MEMSET_FNS(W, T)                                                                           \
    CUresult wo_h_memset_d##W(wo_pfn_cuMemsetD##W##_v2 real, int id, void *ra, CUdeviceptr dst,    \
                              T v, size_t n)                                                       \
    {                                                                                              \
        (void)ra;                                                                                  \
        MEMSET_HOOK(real(dst, v, n), dst, (uint64_t)n * sizeof(T), NULL);                          \
    }                                                                                              \
    CUresult wo_h_memset_d##W##_async(wo_pfn_cuMemsetD##W##Async real, int id, void *ra,           \
                                      CUdeviceptr dst, T v, size_t n, CUstream s)                  \
    {                                                                                              \
        (void)ra;                                                                                  \
        MEMSET_HOOK(real(dst, v, n, s), dst, (uint64_t)n * sizeof(T), s);                          \
    }                                                                                              \
    CUresult wo_h_memset_2d##W(wo_pfn_cuMemsetD2D##W##_v2 real, int id, void *ra, CUdeviceptr dst, \
                               size_t pitch, T v, size_t w, size_t h)                              \
    {                                                                                              \
        (void)ra;                                                                                  \
        MEMSET_HOOK(real(dst, pitch, v, w, h), dst, pitched_span(pitch, w * sizeof(T), h, 0, 1),   \
                    NULL);                                                                         \
    }                                                                                              \
    CUresult wo_h_memset_2d##W##_async(wo_pfn_cuMemsetD2D##W##Async real, int id, void *ra,        \
                                       CUdeviceptr dst, size_t pitch, T v, size_t w, size_t h,     \
                                       CUstream s)                                                 \
    {                                                                                              \
        (void)ra;                                                                                  \
        MEMSET_HOOK(real(dst, pitch, v, w, h, s), dst,                                             \
                    pitched_span(pitch, w * sizeof(T), h, 0, 1), s);                               \
    }

MEMSET_FNS(8, unsigned char)
MEMSET_FNS(16, unsigned short)
MEMSET_FNS(32, unsigned int)

/* --- runtime -------------------------------------------------------------- */

#define RT_COPY_HOOK_SPAN(call, dst, span, src, bytes, kind, stream)                               \
    do {                                                                                           \
        cudaError_t res_;                                                                          \
        WO_RT_HOOK_ENTER(call);                                                                    \
        wo_stream_note_write((uint64_t)(uintptr_t)(dst), (uint64_t)(span));                        \
        uint64_t sid_ = wo_stream_id(stream, wo_rt_pt[id]), t0_ = load_t0();                       \
        GATED(copy_waits(sid_), res_, call, WO_CTR_gated_copies);                                  \
        if (res_ == cudaSuccess && t0_)                                                            \
            wo_uvm_load_copy((uint64_t)(uintptr_t)(dst), (uint64_t)(bytes), wo_now_ns() - t0_);    \
        if (res_ == cudaSuccess)                                                                   \
            record_copy((uint64_t)(uintptr_t)(dst), (uint64_t)(uintptr_t)(src), (uint64_t)(bytes), \
                        kind, sid_, ra);                                                           \
        wo_leave();                                                                                \
        return res_;                                                                               \
    } while (0)
#define RT_COPY_HOOK(call, dst, src, bytes, kind, stream)                                          \
    RT_COPY_HOOK_SPAN(call, dst, bytes, src, bytes, kind, stream)

cudaError_t wo_h_cuda_memcpy(wo_pfn_cudaMemcpy real, int id, void *ra, void *dst, const void *src,
                             size_t n, enum cudaMemcpyKind kind)
{
    RT_COPY_HOOK(real(dst, src, n, kind), dst, src, n, kind_of_runtime(kind), NULL);
}

cudaError_t wo_h_cuda_memcpy_async(wo_pfn_cudaMemcpyAsync real, int id, void *ra, void *dst,
                                   const void *src, size_t n, enum cudaMemcpyKind kind,
                                   cudaStream_t s)
{
    RT_COPY_HOOK(real(dst, src, n, kind, s), dst, src, n, kind_of_runtime(kind), s);
}

cudaError_t wo_h_cuda_memcpy2d(wo_pfn_cudaMemcpy2D real, int id, void *ra, void *dst, size_t dpitch,
                               const void *src, size_t spitch, size_t w, size_t h,
                               enum cudaMemcpyKind kind)
{
    RT_COPY_HOOK_SPAN(real(dst, dpitch, src, spitch, w, h, kind), dst,
                      pitched_span(dpitch, w, h, 0, 1), src, (uint64_t)w * h, kind_of_runtime(kind),
                      NULL);
}

cudaError_t wo_h_cuda_memcpy2d_async(wo_pfn_cudaMemcpy2DAsync real, int id, void *ra, void *dst,
                                     size_t dpitch, const void *src, size_t spitch, size_t w,
                                     size_t h, enum cudaMemcpyKind kind, cudaStream_t s)
{
    RT_COPY_HOOK_SPAN(real(dst, dpitch, src, spitch, w, h, kind, s), dst,
                      pitched_span(dpitch, w, h, 0, 1), src, (uint64_t)w * h, kind_of_runtime(kind),
                      s);
}

/* A runtime 3-D copy's side: its pitched pointer's first byte at its
 * position (NULL: an array), its extent's span; bytes, what it moves */
#define RT3_AT(q, pos, e)                                                                          \
    pitched_at((uint64_t)(uintptr_t)(q).ptr, (pos).x, (pos).y, (pos).z, (q).pitch, (q).ysize,      \
               (e).width, (e).height)
#define RT3_DST(p) (p ? RT3_AT(p->dstPtr, p->dstPos, p->extent) : 0)
#define RT3_SRC(p) (p ? RT3_AT(p->srcPtr, p->srcPos, p->extent) : 0)
#define RT3_SPAN(p)                                                                                \
    (p ? pitched_span(p->dstPtr.pitch, p->extent.width, WO_MAX(p->extent.height, (size_t)1),       \
                      p->dstPtr.ysize, WO_MAX(p->extent.depth, (size_t)1))                         \
       : 0)
#define RT3_BYTES(p)                                                                               \
    (p ? (uint64_t)p->extent.width * WO_MAX(p->extent.height, (size_t)1) *                         \
             WO_MAX(p->extent.depth, (size_t)1)                                                    \
       : 0)

cudaError_t wo_h_cuda_memcpy3d(wo_pfn_cudaMemcpy3D real, int id, void *ra,
                               const struct cudaMemcpy3DParms *p)
{
    RT_COPY_HOOK_SPAN(real(p), RT3_DST(p), RT3_SPAN(p), RT3_SRC(p), RT3_BYTES(p),
                      p ? kind_of_runtime(p->kind) : WO_COPY_DEFAULT, NULL);
}

cudaError_t wo_h_cuda_memcpy3d_async(wo_pfn_cudaMemcpy3DAsync real, int id, void *ra,
                                     const struct cudaMemcpy3DParms *p, cudaStream_t s)
{
    RT_COPY_HOOK_SPAN(real(p, s), RT3_DST(p), RT3_SPAN(p), RT3_SRC(p), RT3_BYTES(p),
                      p ? kind_of_runtime(p->kind) : WO_COPY_DEFAULT, s);
}

/* --- waits ------------------------------------------------------------------
 * Where the engine's thread waits for the GPU: the trace records a sync
 * event when the wait begins (the replay's host waits there, docs/prefetch.md).
 * When the copy engine may run, the wait passes its gate first (uvm.h:
 * wo_uvm_quiesce_begin); otherwise, with nothing recorded, the hook only
 * forwards. */

static void record_sync(uint64_t stream)
{
    struct wo_event ev = {.type = WO_EV_SYNC, .stream = stream};

    /* only a trace (its replay) uses waits */
    if (!__atomic_load_n(&wo_events_all, __ATOMIC_RELAXED)) {
        if (__atomic_load_n(&wo_events, __ATOMIC_RELAXED))
            wo_count(WO_CTR_events_skipped, 1);
        return;
    }
    wo_push_event(&ev);
}

#define SYNC_HOOK(call, stream)                                                                    \
    do {                                                                                           \
        CUresult res_;                                                                             \
        WO_HOOK_ENTER(call);                                                                       \
        record_sync(stream);                                                                       \
        GATED(wo_uvm_gate_armed(), res_, call, WO_CTR_gated_waits);                                \
        wo_leave();                                                                                \
        return res_;                                                                               \
    } while (0)

CUresult wo_h_stream_sync(wo_pfn_cuStreamSynchronize real, int id, void *ra, CUstream s)
{
    (void)ra;
    SYNC_HOOK(real(s), wo_stream_id(s, wo_hook_pt[id]));
}

CUresult wo_h_ctx_sync(wo_pfn_cuCtxSynchronize_v2 real, int id, void *ra, CUcontext ctx)
{
    (void)ra;
    SYNC_HOOK(real(ctx), 0);
}

CUresult wo_h_event_sync(wo_pfn_cuEventSynchronize real, int id, void *ra, CUevent e)
{
    (void)ra;
    SYNC_HOOK(real(e), 0);
}
