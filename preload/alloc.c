/* preload/alloc.c: the allocation and free hooks (runtime and driver) and
 * the VMM calls, which are observed only.
 *
 * Every allocation asks uvm/ first (wo_uvm_alloc: placeable allocations are
 * served there, in the memory their placement needs); anything else is
 * forwarded untouched and then reported (wo_uvm_observe_alloc) so tags can
 * find it and launches can be attributed to it. Frees likewise. */
#include "core/log.h"
#include "core/registry.h"
#include "preload/hook.h"

/* uvm/ speaks CUresult; a runtime caller gets the runtime's code for it. */
static cudaError_t to_runtime_error(CUresult r)
{
    switch (r) {
    case CUDA_SUCCESS:
        return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE:
        return cudaErrorInvalidValue;
    case CUDA_ERROR_OUT_OF_MEMORY:
        return cudaErrorMemoryAllocation;
    case CUDA_ERROR_NOT_INITIALIZED:
        return cudaErrorInitializationError;
    case CUDA_ERROR_NO_DEVICE:
        return cudaErrorNoDevice;
    case CUDA_ERROR_NOT_SUPPORTED:
        return cudaErrorNotSupported;
    default:
        return cudaErrorUnknown;
    }
}

/* 1 when uvm/ served the allocation (*res is the result to return). */
static int route(size_t size, int api, CUdeviceptr *ret, CUresult *res, void *ra)
{
    CUdeviceptr p = 0;

    if (!ret || !wo_uvm_alloc(size, api, &p, res))
        return 0;
    if (*res == CUDA_SUCCESS) {
        *ret = p;
        wo_count(WO_CTR_alloc_calls, 1);
        wo_count(WO_CTR_alloc_placed, 1);
        wo_count(WO_CTR_alloc_bytes, size);
        wo_count_caller(ra, WO_CALLER_ALLOC);
    } else {
        wo_count(WO_CTR_alloc_failed, 1);
    }
    return 1;
}

/* A forwarded allocation failed for want of device memory: uvm/ gives back
 * some of what it holds by choice (hot experts), and the hook tries again
 * while it gave something back (wo_uvm_engine_oom: finite, each time less
 * is held). */
static bool gave_back(size_t size, uint64_t *squeeze)
{
    return wo_uvm_engine_oom(size) > 0 || wo_uvm_squeeze_overlapped(squeeze);
}

/* The same for the runtime, which keeps the failure as the thread's last
 * error: a retry that succeeds clears it, as if the first had not failed
 * (an engine that checks cudaGetLastError after its next launch would take
 * the first failure for its own). Without cudaGetLastError, no retry. */
static bool rt_gave_back(size_t size, cudaError_t (**last)(void), uint64_t *squeeze)
{
    *last = (cudaError_t(*)(void))wo_real_runtime_sym("cudaGetLastError");
    return *last && gave_back(size, squeeze);
}

static void observed_alloc(bool ok, CUdeviceptr p, size_t size, uint32_t flags, int api, void *ra)
{
    if (!ok) {
        wo_count(WO_CTR_alloc_failed, 1);
        return;
    }
    wo_count(WO_CTR_alloc_calls, 1);
    wo_count(WO_CTR_alloc_bytes, size);
    wo_count_caller(ra, WO_CALLER_ALLOC);
    if (p)
        wo_uvm_observe_alloc(p, size, flags, api);
}

/* Frees are reported *before* they are forwarded: once the driver has the
 * memory back, another thread's allocation may get the same address, and a
 * late report would then drop that thread's new range (the threads test
 * caught exactly that). Returns whether the address was a tracked range and
 * fills *r, so that freed() can report a free the driver refused as an
 * allocation again; its name, if it had one, is lost then (logged). */
static bool forget_before_free(CUdeviceptr p, int api, struct wo_range *r)
{
    bool tracked = wo_registry_find(p, r) == 0 && r->base == p;
    wo_uvm_observe_free(p, api);
    return tracked;
}

static void freed(CUresult res, bool tracked, const struct wo_range *r, int api)
{
    if (res == CUDA_SUCCESS) {
        wo_count(WO_CTR_free_calls, 1);
        return;
    }
    if (tracked) {
        wo_uvm_observe_alloc(r->base, r->size, r->flags, api);
        wo_log_once(WO_LOG_WARN, "the driver refused to free a tracked allocation (error %d): "
                                 "it is tracked again, without its name",
                    (int)res);
    }
}

/* --- driver --------------------------------------------------------------- */

CUresult wo_h_mem_alloc(wo_pfn_cuMemAlloc_v2 real, int id, void *ra, CUdeviceptr *dptr, size_t size)
{
    CUresult res;

    WO_HOOK_ENTER(real(dptr, size));
    if (!route(size, WO_API_CU_MEM_ALLOC, dptr, &res, ra)) {
        uint64_t sq;

        wo_uvm_engine_alloc_ahead(size);
        sq = wo_uvm_squeeze_gen();
        res = real(dptr, size);
        while (res == CUDA_ERROR_OUT_OF_MEMORY && gave_back(size, &sq))
            res = real(dptr, size);
        observed_alloc(res == CUDA_SUCCESS, dptr ? *dptr : 0, size, 0, WO_API_CU_MEM_ALLOC, ra);
    }
    wo_leave();
    return res;
}

CUresult wo_h_mem_alloc_async(wo_pfn_cuMemAllocAsync real, int id, void *ra, CUdeviceptr *dptr,
                              size_t size, CUstream s)
{
    CUresult res;

    WO_HOOK_ENTER(real(dptr, size, s));
    if (!route(size, WO_API_CU_MEM_ALLOC_ASYNC, dptr, &res, ra)) {
        uint64_t sq = wo_uvm_squeeze_gen();

        res = real(dptr, size, s);
        while (res == CUDA_ERROR_OUT_OF_MEMORY && gave_back(size, &sq))
            res = real(dptr, size, s);
        observed_alloc(res == CUDA_SUCCESS, dptr ? *dptr : 0, size, WO_RANGE_ASYNC,
                       WO_API_CU_MEM_ALLOC_ASYNC, ra);
    }
    wo_leave();
    return res;
}

CUresult wo_h_mem_alloc_managed(wo_pfn_cuMemAllocManaged real, int id, void *ra, CUdeviceptr *dptr,
                                size_t size, unsigned int flags)
{
    CUresult res;

    WO_HOOK_ENTER(real(dptr, size, flags));
    if (!route(size, WO_API_CU_MEM_ALLOC_MANAGED, dptr, &res, ra)) {
        res = real(dptr, size, flags);
        observed_alloc(res == CUDA_SUCCESS, dptr ? *dptr : 0, size, WO_RANGE_ENGINE_MANAGED,
                       WO_API_CU_MEM_ALLOC_MANAGED, ra);
    }
    wo_leave();
    return res;
}

static CUresult mem_free(wo_pfn_cuMemFree_v2 real, int id, void *ra, CUdeviceptr dptr)
{
    CUresult res;
    (void)ra;

    wo_count_call(id);
    if (WO_UNLIKELY(!real))
        return CUDA_ERROR_NOT_FOUND;
    if (!dptr || !wo_enter())
        return real(dptr);
    if (wo_uvm_free(dptr, &res)) {
        wo_count(WO_CTR_free_calls, 1);
    } else {
        struct wo_range r;
        bool tracked = forget_before_free(dptr, WO_API_CU_MEM_ALLOC, &r);
        res = real(dptr);
        freed(res, tracked, &r, WO_API_CU_MEM_ALLOC);
    }
    wo_leave();
    return res;
}

/* The frees that wait for the context's work hold the copy engine's queue
 * off first (uvm.h: wo_uvm_quiesce_begin): a wait on an engine stream for
 * a copy not yet issued would never end. */
CUresult wo_h_mem_free(wo_pfn_cuMemFree_v2 real, int id, void *ra, CUdeviceptr dptr)
{
    if (!dptr)
        return mem_free(real, id, ra, dptr);
    wo_uvm_quiesce_begin();
    CUresult res = mem_free(real, id, ra, dptr);
    wo_uvm_quiesce_end();
    return res;
}

CUresult wo_h_mem_free_async(wo_pfn_cuMemFreeAsync real, int id, void *ra, CUdeviceptr dptr,
                             CUstream s)
{
    CUresult res;
    (void)ra;

    wo_count_call(id);
    if (WO_UNLIKELY(!real))
        return CUDA_ERROR_NOT_FOUND;
    if (!dptr || !wo_enter())
        return real(dptr, s);
    if (wo_uvm_free(dptr, &res)) {
        wo_count(WO_CTR_free_calls, 1);
    } else {
        struct wo_range r;
        bool tracked = forget_before_free(dptr, WO_API_CU_MEM_ALLOC_ASYNC, &r);
        res = real(dptr, s);
        freed(res, tracked, &r, WO_API_CU_MEM_ALLOC_ASYNC);
    }
    wo_leave();
    return res;
}

/* --- VMM: observed, never routed ------------------------------------------ */

CUresult wo_h_mem_create(wo_pfn_cuMemCreate real, int id, void *ra,
                         CUmemGenericAllocationHandle *h, size_t size,
                         const CUmemAllocationProp *prop, unsigned long long flags)
{
    CUresult res;

    wo_count_call(id);
    if (WO_UNLIKELY(!real))
        return CUDA_ERROR_NOT_FOUND;
    /* llama.cpp's VMM pool grows by cuMemCreate in a compute: made again
     * after a squeeze that held the free memory meanwhile */
    uint64_t sq = wo_uvm_squeeze_gen();
    res = real(h, size, prop, flags);
    while (res == CUDA_ERROR_OUT_OF_MEMORY && wo_uvm_squeeze_overlapped(&sq))
        res = real(h, size, prop, flags);
    if (res == CUDA_SUCCESS && wo_enter()) {
        wo_count(WO_CTR_vmm_create, 1);
        wo_count_caller(ra, WO_CALLER_ALLOC);
        wo_leave();
    }
    return res;
}

static CUresult mem_release(wo_pfn_cuMemRelease real, int id, void *ra,
                            CUmemGenericAllocationHandle h)
{
    CUresult res;
    (void)ra;

    wo_count_call(id);
    if (WO_UNLIKELY(!real))
        return CUDA_ERROR_NOT_FOUND;
    res = real(h);
    if (res == CUDA_SUCCESS && wo_enter()) {
        wo_count(WO_CTR_vmm_release, 1);
        wo_leave();
    }
    return res;
}

CUresult wo_h_mem_release(wo_pfn_cuMemRelease real, int id, void *ra, CUmemGenericAllocationHandle h)
{
    wo_uvm_quiesce_begin();
    CUresult res = mem_release(real, id, ra, h);
    wo_uvm_quiesce_end();
    return res;
}

CUresult wo_h_mem_map(wo_pfn_cuMemMap real, int id, void *ra, CUdeviceptr ptr, size_t size,
                      size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags)
{
    CUresult res;

    WO_HOOK_ENTER(real(ptr, size, offset, h, flags));
    res = real(ptr, size, offset, h, flags);
    if (res == CUDA_SUCCESS) {
        wo_count(WO_CTR_vmm_map, 1);
        wo_count_caller(ra, WO_CALLER_ALLOC);
        wo_uvm_observe_alloc(ptr, size, WO_RANGE_VMM, WO_API_CU_MEM_MAP);
    }
    wo_leave();
    return res;
}

#define UNMAP_BATCH 64

struct unmap_scan {
    uint64_t lo, hi;
    uint64_t base[UNMAP_BATCH];
    size_t n;
};

static int collect_mapped(const struct wo_range *r, void *ud)
{
    struct unmap_scan *u = ud;

    if (!(r->flags & WO_RANGE_VMM) || r->base + r->size <= u->lo || r->base >= u->hi)
        return 0;
    u->base[u->n++] = r->base;
    return u->n == UNMAP_BATCH;
}

static CUresult mem_unmap(wo_pfn_cuMemUnmap real, int id, void *ra, CUdeviceptr ptr, size_t size)
{
    CUresult res;
    (void)ra;

    WO_HOOK_ENTER(real(ptr, size));
    res = real(ptr, size);
    if (res == CUDA_SUCCESS) {
        /* One unmap may cover several mappings (a segment mapped piecewise). */
        struct unmap_scan u = {.lo = ptr, .hi = ptr + size};
        wo_count(WO_CTR_vmm_unmap, 1);
        do {
            u.n = 0;
            wo_registry_foreach(collect_mapped, &u);
            for (size_t i = 0; i < u.n; i++)
                wo_uvm_observe_free(u.base[i], WO_API_CU_MEM_MAP);
        } while (u.n == UNMAP_BATCH);
    }
    wo_leave();
    return res;
}

CUresult wo_h_mem_unmap(wo_pfn_cuMemUnmap real, int id, void *ra, CUdeviceptr ptr, size_t size)
{
    wo_uvm_quiesce_begin();
    CUresult res = mem_unmap(real, id, ra, ptr, size);
    wo_uvm_quiesce_end();
    return res;
}

/* The engine's pinned host memory given back (cudaFreeHost and
 * cudaHostUnregister reach these through the driver): both wait for the
 * context's work, as cuMemFree does, so they pass the copy engine's gate
 * too (a stream waiting for a copy not yet issued would never end). */
static CUresult host_gated(CUresult (*real)(void *), int id, void *p)
{
    wo_count_call(id);
    if (WO_UNLIKELY(!real))
        return CUDA_ERROR_NOT_FOUND;
    wo_uvm_quiesce_begin();
    CUresult res = real(p);
    wo_uvm_quiesce_end();
    return res;
}

CUresult wo_h_mem_free_host(wo_pfn_cuMemFreeHost real, int id, void *ra, void *p)
{
    (void)ra;
    return host_gated(real, id, p);
}

CUresult wo_h_mem_host_unregister(wo_pfn_cuMemHostUnregister real, int id, void *ra, void *p)
{
    (void)ra;
    return host_gated(real, id, p);
}

/* --- runtime -------------------------------------------------------------- */

cudaError_t wo_h_cuda_malloc(wo_pfn_cudaMalloc real, int id, void *ra, void **p, size_t size)
{
    CUresult cres;
    cudaError_t res, (*last)(void);

    WO_RT_HOOK_ENTER(real(p, size));
    if (route(size, WO_API_CUDA_MALLOC, (CUdeviceptr *)p, &cres, ra)) {
        res = to_runtime_error(cres);
    } else {
        uint64_t sq;

        wo_uvm_engine_alloc_ahead(size);
        sq = wo_uvm_squeeze_gen();
        res = real(p, size);
        while (res == cudaErrorMemoryAllocation && rt_gave_back(size, &last, &sq))
            if ((res = real(p, size)) == cudaSuccess)
                (void)last(); /* the failures before were the shim's to mend */
        observed_alloc(res == cudaSuccess, p ? (CUdeviceptr)(uintptr_t)*p : 0, size, 0,
                       WO_API_CUDA_MALLOC, ra);
    }
    wo_leave();
    return res;
}

cudaError_t wo_h_cuda_malloc_async(wo_pfn_cudaMallocAsync real, int id, void *ra, void **p,
                                   size_t size, cudaStream_t s)
{
    CUresult cres;
    cudaError_t res, (*last)(void);

    WO_RT_HOOK_ENTER(real(p, size, s));
    if (route(size, WO_API_CUDA_MALLOC_ASYNC, (CUdeviceptr *)p, &cres, ra)) {
        res = to_runtime_error(cres);
    } else {
        uint64_t sq = wo_uvm_squeeze_gen();

        res = real(p, size, s);
        while (res == cudaErrorMemoryAllocation && rt_gave_back(size, &last, &sq))
            if ((res = real(p, size, s)) == cudaSuccess)
                (void)last(); /* the failures before were the shim's to mend */
        observed_alloc(res == cudaSuccess, p ? (CUdeviceptr)(uintptr_t)*p : 0, size,
                       WO_RANGE_ASYNC, WO_API_CUDA_MALLOC_ASYNC, ra);
    }
    wo_leave();
    return res;
}

cudaError_t wo_h_cuda_malloc_managed(wo_pfn_cudaMallocManaged real, int id, void *ra, void **p,
                                     size_t size, unsigned int flags)
{
    CUresult cres;
    cudaError_t res;

    WO_RT_HOOK_ENTER(real(p, size, flags));
    if (route(size, WO_API_CUDA_MALLOC_MANAGED, (CUdeviceptr *)p, &cres, ra)) {
        res = to_runtime_error(cres);
    } else {
        res = real(p, size, flags);
        observed_alloc(res == cudaSuccess, p ? (CUdeviceptr)(uintptr_t)*p : 0, size,
                       WO_RANGE_ENGINE_MANAGED, WO_API_CUDA_MALLOC_MANAGED, ra);
    }
    wo_leave();
    return res;
}

static cudaError_t cuda_free(wo_pfn_cudaFree real, int id, void *ra, void *p)
{
    CUresult cres;
    cudaError_t res;
    (void)ra;

    wo_count_call(WO_NHOOKS + id);
    if (WO_UNLIKELY(!real))
        return cudaErrorSharedObjectSymbolNotFound;
    /* cudaFree(NULL) is the idiom that creates the context: just forward. */
    if (!p || !wo_enter())
        return real(p);
    if (wo_uvm_free((CUdeviceptr)(uintptr_t)p, &cres)) {
        wo_count(WO_CTR_free_calls, 1);
        res = to_runtime_error(cres);
    } else {
        struct wo_range r;
        bool tracked = forget_before_free((CUdeviceptr)(uintptr_t)p, WO_API_CUDA_MALLOC, &r);
        res = real(p);
        freed(res == cudaSuccess ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN, tracked, &r,
              WO_API_CUDA_MALLOC);
    }
    wo_leave();
    return res;
}

cudaError_t wo_h_cuda_free(wo_pfn_cudaFree real, int id, void *ra, void *p)
{
    if (!p)
        return cuda_free(real, id, ra, p);
    wo_uvm_quiesce_begin();
    cudaError_t res = cuda_free(real, id, ra, p);
    wo_uvm_quiesce_end();
    return res;
}

cudaError_t wo_h_cuda_free_async(wo_pfn_cudaFreeAsync real, int id, void *ra, void *p,
                                 cudaStream_t s)
{
    CUresult cres;
    cudaError_t res;
    (void)ra;

    wo_count_call(WO_NHOOKS + id);
    if (WO_UNLIKELY(!real))
        return cudaErrorSharedObjectSymbolNotFound;
    if (!p || !wo_enter())
        return real(p, s);
    if (wo_uvm_free((CUdeviceptr)(uintptr_t)p, &cres)) {
        wo_count(WO_CTR_free_calls, 1);
        res = to_runtime_error(cres);
    } else {
        struct wo_range r;
        bool tracked =
            forget_before_free((CUdeviceptr)(uintptr_t)p, WO_API_CUDA_MALLOC_ASYNC, &r);
        res = real(p, s);
        freed(res == cudaSuccess ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN, tracked, &r,
              WO_API_CUDA_MALLOC_ASYNC);
    }
    wo_leave();
    return res;
}
