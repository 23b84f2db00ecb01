/* tests/fake/cudart.c: a fake libcudart.so.13 that boots exactly like a real
 * cudart copy on the lent machine: dlopen("libcuda.so.1"),
 * dlsym("cuGetProcAddress_v2"), ask it for "cuGetProcAddress" (the inner
 * resolver), then resolve every driver function it uses through the inner
 * pointer with a NULL symbolStatus, once with flags 0 (legacy default
 * stream) and once with flags 2 (CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM:
 * the table behind the _ptsz/_ptds runtime entry points). It never links
 * libcuda, so an interposer sees exactly what a real runtime would show it.
 *
 * The runtime API subset is implemented on those pointers: device and
 * context (the primary context made current lazily per thread), memory,
 * copies, launches (host stubs mapped with fakecudart_register), streams,
 * capture and graphs, driver entry points, errors.
 *
 * Built with __CUDA_API_VERSION_INTERNAL so cuda_runtime_api.h declares the
 * plain and the _ptsz/_ptds names side by side. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "fakecuda.h"

#define RT_EXPORT __attribute__((visibility("default")))

/* The driver functions this runtime uses: field, name asked for, PFN. */
#define RT_DRV(X)                                                                                  \
    X(init, "cuInit", PFN_cuInit_v2000)                                                            \
    X(driver_version, "cuDriverGetVersion", PFN_cuDriverGetVersion_v2020)                          \
    X(device_count, "cuDeviceGetCount", PFN_cuDeviceGetCount_v2000)                                \
    X(device_get, "cuDeviceGet", PFN_cuDeviceGet_v2000)                                            \
    X(ctx_retain, "cuDevicePrimaryCtxRetain", PFN_cuDevicePrimaryCtxRetain_v7000)                  \
    X(ctx_set, "cuCtxSetCurrent", PFN_cuCtxSetCurrent_v4000)                                       \
    X(ctx_sync, "cuCtxSynchronize", PFN_cuCtxSynchronize_v13000)                                    \
    X(mem_info, "cuMemGetInfo", PFN_cuMemGetInfo_v3020)                                            \
    X(mem_alloc, "cuMemAlloc", PFN_cuMemAlloc_v3020)                                               \
    X(mem_free, "cuMemFree", PFN_cuMemFree_v3020)                                                  \
    X(mem_alloc_async, "cuMemAllocAsync", PFN_cuMemAllocAsync_v11020)                              \
    X(mem_free_async, "cuMemFreeAsync", PFN_cuMemFreeAsync_v11020)                                 \
    X(mem_alloc_managed, "cuMemAllocManaged", PFN_cuMemAllocManaged_v6000)                         \
    X(mem_alloc_host, "cuMemAllocHost", PFN_cuMemAllocHost_v3020)                                  \
    X(mem_host_alloc, "cuMemHostAlloc", PFN_cuMemHostAlloc_v2020)                                  \
    X(mem_free_host, "cuMemFreeHost", PFN_cuMemFreeHost_v2000)                                     \
    X(memcpy_, "cuMemcpy", PFN_cuMemcpy_v4000)                                                     \
    X(memcpy_async, "cuMemcpyAsync", PFN_cuMemcpyAsync_v4000)                                      \
    X(htod, "cuMemcpyHtoD", PFN_cuMemcpyHtoD_v3020)                                                \
    X(dtoh, "cuMemcpyDtoH", PFN_cuMemcpyDtoH_v3020)                                                \
    X(dtod, "cuMemcpyDtoD", PFN_cuMemcpyDtoD_v3020)                                                \
    X(htod_async, "cuMemcpyHtoDAsync", PFN_cuMemcpyHtoDAsync_v3020)                                \
    X(dtoh_async, "cuMemcpyDtoHAsync", PFN_cuMemcpyDtoHAsync_v3020)                                \
    X(dtod_async, "cuMemcpyDtoDAsync", PFN_cuMemcpyDtoDAsync_v3020)                                \
    X(memcpy2d, "cuMemcpy2D", PFN_cuMemcpy2D_v3020)                                                \
    X(memcpy2d_async, "cuMemcpy2DAsync", PFN_cuMemcpy2DAsync_v3020)                                \
    X(memcpy3d, "cuMemcpy3D", PFN_cuMemcpy3D_v3020)                                                \
    X(memcpy3d_async, "cuMemcpy3DAsync", PFN_cuMemcpy3DAsync_v3020)                                \
    X(memset8, "cuMemsetD8", PFN_cuMemsetD8_v3020)                                                 \
    X(memset8_async, "cuMemsetD8Async", PFN_cuMemsetD8Async_v3020)                                 \
    X(launch, "cuLaunchKernel", PFN_cuLaunchKernel_v4000)                                          \
    X(stream_create, "cuStreamCreate", PFN_cuStreamCreate_v2000)                                   \
    X(stream_destroy, "cuStreamDestroy", PFN_cuStreamDestroy_v4000)                                \
    X(stream_sync, "cuStreamSynchronize", PFN_cuStreamSynchronize_v2000)                           \
    X(begin_capture, "cuStreamBeginCapture", PFN_cuStreamBeginCapture_v10010)                      \
    X(end_capture, "cuStreamEndCapture", PFN_cuStreamEndCapture_v10000)                            \
    X(is_capturing, "cuStreamIsCapturing", PFN_cuStreamIsCapturing_v10000)                         \
    X(instantiate, "cuGraphInstantiateWithFlags", PFN_cuGraphInstantiateWithFlags_v11040)          \
    X(graph_launch, "cuGraphLaunch", PFN_cuGraphLaunch_v10000)                                     \
    X(exec_destroy, "cuGraphExecDestroy", PFN_cuGraphExecDestroy_v10000)                           \
    X(graph_destroy, "cuGraphDestroy", PFN_cuGraphDestroy_v10000)                                  \
    X(ptr_attrs, "cuPointerGetAttributes", PFN_cuPointerGetAttributes_v7000)                       \
    X(error_string, "cuGetErrorString", PFN_cuGetErrorString_v6000)

struct drv {
#define X(field, name, pfn) pfn field;
    RT_DRV(X)
#undef X
};

/* [0]: legacy default stream (flags 0), [1]: per-thread (flags 2). */
static struct drv drv[2];
static PFN_cuGetProcAddress_v12000 inner;
static void *libcuda;
static cudaError_t boot_err;
static int nresolved;
static pthread_once_t boot_once = PTHREAD_ONCE_INIT;

static __thread cudaError_t last_err;
static __thread int cur_device;
static __thread bool ctx_made; /* this thread has the primary context current */

static CUcontext primary[8];
static pthread_mutex_t rt_lock = PTHREAD_MUTEX_INITIALIZER;

#define MAX_STUBS 1024
static struct {
    const void *stub;
    CUfunction f;
} stubs[MAX_STUBS];
static int nstubs;

static void boot(void)
{
    libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!libcuda) {
        boot_err = cudaErrorInsufficientDriver;
        return;
    }
    PFN_cuGetProcAddress_v12000 gpa =
        (PFN_cuGetProcAddress_v12000)dlsym(libcuda, "cuGetProcAddress_v2");
    if (!gpa || gpa("cuGetProcAddress", (void **)&inner, CUDART_VERSION, 0, NULL) != CUDA_SUCCESS ||
        !inner) {
        boot_err = cudaErrorInsufficientDriver;
        return;
    }
    for (int t = 0; t < 2; t++) {
        cuuint64_t flags = t ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
#define X(field, name, pfn)                                                                        \
    if (inner(name, (void **)&drv[t].field, CUDART_VERSION, flags, NULL) == CUDA_SUCCESS &&        \
        drv[t].field)                                                                              \
        nresolved++;                                                                               \
    else                                                                                           \
        boot_err = cudaErrorInsufficientDriver;
        RT_DRV(X)
#undef X
    }
    if (boot_err)
        return;
    CUresult r = drv[0].init(0);
    if (r == CUDA_ERROR_NO_DEVICE)
        boot_err = cudaErrorNoDevice;
    else if (r != CUDA_SUCCESS)
        boot_err = cudaErrorInitializationError;
}

static cudaError_t set_err(cudaError_t e)
{
    if (e != cudaSuccess)
        last_err = e;
    return e;
}

/* Driver and runtime codes coincide for everything the fake driver returns
 * except a few renamed ones. */
static cudaError_t from_cu(CUresult r)
{
    switch (r) {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
    case CUDA_ERROR_NOT_INITIALIZED: return cudaErrorInitializationError;
    case CUDA_ERROR_INVALID_CONTEXT: return cudaErrorDeviceUninitialized;
    case CUDA_ERROR_INVALID_HANDLE: return cudaErrorInvalidResourceHandle;
    case CUDA_ERROR_NOT_FOUND: return cudaErrorSymbolNotFound;
    default: return (cudaError_t)r;
    }
}

#define RET(expr) return set_err(from_cu(expr))

/* Boots the runtime and makes the current device's primary context current
 * on this thread, as cudart does lazily on the first call that needs it. */
static cudaError_t ready(void)
{
    pthread_once(&boot_once, boot);
    if (boot_err)
        return set_err(boot_err);
    if (ctx_made)
        return cudaSuccess;
    pthread_mutex_lock(&rt_lock);
    CUresult r = CUDA_SUCCESS;
    if (!primary[cur_device]) {
        CUdevice dev;
        r = drv[0].device_get(&dev, cur_device);
        if (r == CUDA_SUCCESS)
            r = drv[0].ctx_retain(&primary[cur_device], dev);
    }
    CUcontext c = primary[cur_device];
    pthread_mutex_unlock(&rt_lock);
    if (r == CUDA_SUCCESS)
        r = drv[0].ctx_set(c);
    if (r != CUDA_SUCCESS)
        return set_err(from_cu(r));
    ctx_made = true;
    return cudaSuccess;
}

#define READY()                                                                                    \
    do {                                                                                           \
        cudaError_t e_ = ready();                                                                  \
        if (e_ != cudaSuccess)                                                                     \
            return e_;                                                                             \
    } while (0)

/* --- fake-only ----------------------------------------------------------- */

RT_EXPORT int fakecudart_register(const void *stub, CUfunction f)
{
    if (!stub || !f)
        return -EINVAL;
    int r = 0;
    pthread_mutex_lock(&rt_lock);
    int i;
    for (i = 0; i < nstubs && stubs[i].stub != stub; i++)
        ;
    if (i < nstubs)
        stubs[i].f = f;
    else if (nstubs < MAX_STUBS)
        stubs[nstubs++] = (typeof(stubs[0])){ stub, f };
    else
        r = -ENOSPC;
    pthread_mutex_unlock(&rt_lock);
    return r;
}

RT_EXPORT int fakecudart_resolved(void)
{
    pthread_once(&boot_once, boot);
    return nresolved;
}

static CUfunction stub_func(const void *stub)
{
    CUfunction f = NULL;
    pthread_mutex_lock(&rt_lock);
    for (int i = 0; i < nstubs && !f; i++)
        if (stubs[i].stub == stub)
            f = stubs[i].f;
    pthread_mutex_unlock(&rt_lock);
    return f;
}

/* --- device -------------------------------------------------------------- */

RT_EXPORT cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        return set_err(cudaErrorInvalidValue);
    pthread_once(&boot_once, boot);
    if (boot_err) {
        *count = 0;
        return set_err(boot_err);
    }
    RET(drv[0].device_count(count));
}

RT_EXPORT cudaError_t cudaSetDevice(int device)
{
    pthread_once(&boot_once, boot);
    if (boot_err)
        return set_err(boot_err);
    int n = 0;
    drv[0].device_count(&n);
    if (device < 0 || device >= n || device >= 8)
        return set_err(cudaErrorInvalidDevice);
    cur_device = device;
    ctx_made = false;
    return ready();
}

RT_EXPORT cudaError_t cudaGetDevice(int *device)
{
    if (!device)
        return set_err(cudaErrorInvalidValue);
    *device = cur_device;
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return set_err(cudaErrorInvalidValue);
    pthread_once(&boot_once, boot);
    if (!drv[0].driver_version) {
        *driverVersion = 0;
        return cudaSuccess;
    }
    RET(drv[0].driver_version(driverVersion));
}

RT_EXPORT cudaError_t cudaRuntimeGetVersion(int *runtimeVersion)
{
    if (!runtimeVersion)
        return set_err(cudaErrorInvalidValue);
    *runtimeVersion = CUDART_VERSION;
    return cudaSuccess;
}

RT_EXPORT cudaError_t cudaDeviceSynchronize(void)
{
    READY();
    RET(drv[0].ctx_sync(NULL)); /* 13.0: cuCtxSynchronize_v2(ctx), NULL = current */
}

RT_EXPORT cudaError_t cudaMemGetInfo(size_t *free_, size_t *total)
{
    READY();
    RET(drv[0].mem_info(free_, total));
}

/* --- errors -------------------------------------------------------------- */

RT_EXPORT cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_err;
    last_err = cudaSuccess;
    return e;
}

RT_EXPORT cudaError_t cudaPeekAtLastError(void)
{
    return last_err;
}

RT_EXPORT const char *cudaGetErrorString(cudaError_t error)
{
    switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInsufficientDriver:
        return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    default: break;
    }
    const char *s = NULL;
    if (drv[0].error_string && drv[0].error_string((CUresult)error, &s) == CUDA_SUCCESS && s)
        return s;
    return "unrecognized error code";
}

RT_EXPORT const char *cudaGetErrorName(cudaError_t error)
{
    switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    default: return "cudaErrorUnknown";
    }
}

/* --- memory -------------------------------------------------------------- */

RT_EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    if (!devPtr)
        return set_err(cudaErrorInvalidValue);
    READY();
    if (size == 0) {
        *devPtr = NULL;
        return cudaSuccess;
    }
    CUdeviceptr p = 0;
    CUresult r = drv[0].mem_alloc(&p, size);
    if (r == CUDA_SUCCESS)
        *devPtr = (void *)(uintptr_t)p;
    RET(r);
}

RT_EXPORT cudaError_t cudaFree(void *devPtr)
{
    READY();
    if (!devPtr)
        return cudaSuccess;
    RET(drv[0].mem_free((CUdeviceptr)(uintptr_t)devPtr));
}

static cudaError_t malloc_async(void **devPtr, size_t size, cudaStream_t s, int pt)
{
    if (!devPtr)
        return set_err(cudaErrorInvalidValue);
    READY();
    CUdeviceptr p = 0;
    CUresult r = drv[pt].mem_alloc_async(&p, size, s);
    if (r == CUDA_SUCCESS)
        *devPtr = (void *)(uintptr_t)p;
    RET(r);
}

static cudaError_t free_async(void *devPtr, cudaStream_t s, int pt)
{
    READY();
    RET(drv[pt].mem_free_async((CUdeviceptr)(uintptr_t)devPtr, s));
}

RT_EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
    return malloc_async(devPtr, size, hStream, 0);
}
RT_EXPORT cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream)
{
    return malloc_async(devPtr, size, hStream, 1);
}
RT_EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
    return free_async(devPtr, hStream, 0);
}
RT_EXPORT cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream)
{
    return free_async(devPtr, hStream, 1);
}

RT_EXPORT cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
    if (!devPtr)
        return set_err(cudaErrorInvalidValue);
    READY();
    CUdeviceptr p = 0;
    CUresult r = drv[0].mem_alloc_managed(&p, size, flags);
    if (r == CUDA_SUCCESS)
        *devPtr = (void *)(uintptr_t)p;
    RET(r);
}

RT_EXPORT cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    if (!ptr)
        return set_err(cudaErrorInvalidValue);
    READY();
    RET(drv[0].mem_alloc_host(ptr, size));
}

RT_EXPORT cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    if (!pHost)
        return set_err(cudaErrorInvalidValue);
    READY();
    RET(drv[0].mem_host_alloc(pHost, size, flags));
}

RT_EXPORT cudaError_t cudaFreeHost(void *ptr)
{
    READY();
    if (!ptr)
        return cudaSuccess;
    RET(drv[0].mem_free_host(ptr));
}

RT_EXPORT cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes,
                                               const void *ptr)
{
    if (!attributes)
        return set_err(cudaErrorInvalidValue);
    READY();
    unsigned int type = 0;
    unsigned int managed = 0; /* the driver writes 4 bytes */
    int ordinal = -2;
    CUdeviceptr dptr = 0;
    void *hptr = NULL;
    CUpointer_attribute a[] = { CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
                                CU_POINTER_ATTRIBUTE_HOST_POINTER };
    void *data[] = { &type, &managed, &ordinal, &dptr, &hptr };
    CUresult r = drv[0].ptr_attrs(5, a, data, (CUdeviceptr)(uintptr_t)ptr);
    if (r != CUDA_SUCCESS)
        RET(r);
    memset(attributes, 0, sizeof(*attributes));
    attributes->type = managed                        ? cudaMemoryTypeManaged
                       : type == CU_MEMORYTYPE_DEVICE ? cudaMemoryTypeDevice
                       : type == CU_MEMORYTYPE_HOST   ? cudaMemoryTypeHost
                                                      : cudaMemoryTypeUnregistered;
    attributes->device = type ? ordinal : -2;
    attributes->devicePointer = (void *)(uintptr_t)dptr;
    attributes->hostPointer = attributes->type == cudaMemoryTypeUnregistered ? (void *)ptr : hptr;
    return cudaSuccess;
}

/* --- copies -------------------------------------------------------------- */

static CUresult copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, bool async,
                     cudaStream_t s, int pt)
{
    CUdeviceptr d = (CUdeviceptr)(uintptr_t)dst, sp = (CUdeviceptr)(uintptr_t)src;
    const struct drv *t = &drv[pt];
    switch (kind) {
    case cudaMemcpyHostToDevice:
        return async ? t->htod_async(d, src, n, s) : t->htod(d, src, n);
    case cudaMemcpyDeviceToHost:
        return async ? t->dtoh_async(dst, sp, n, s) : t->dtoh(dst, sp, n);
    case cudaMemcpyDeviceToDevice:
        return async ? t->dtod_async(d, sp, n, s) : t->dtod(d, sp, n);
    case cudaMemcpyHostToHost:
    case cudaMemcpyDefault:
        return async ? t->memcpy_async(d, sp, n, s) : t->memcpy_(d, sp, n);
    default:
        return (CUresult)cudaErrorInvalidMemcpyDirection;
    }
}

#define COPY_FN(name, async, pt)                                                                   \
    RT_EXPORT cudaError_t name(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind \
                                   COPY_STREAM_##async)                                           \
    {                                                                                              \
        READY();                                                                                   \
        RET(copy(dst, src, count, kind, async, COPY_S_##async, pt));                              \
    }
#define COPY_STREAM_0
#define COPY_STREAM_1 , cudaStream_t stream
#define COPY_S_0 NULL
#define COPY_S_1 stream
COPY_FN(cudaMemcpy, 0, 0)
COPY_FN(cudaMemcpy_ptds, 0, 1)
COPY_FN(cudaMemcpyAsync, 1, 0)
COPY_FN(cudaMemcpyAsync_ptsz, 1, 1)

static void kind_types(enum cudaMemcpyKind kind, CUmemorytype *src, CUmemorytype *dst)
{
    switch (kind) {
    case cudaMemcpyHostToDevice: *src = CU_MEMORYTYPE_HOST; *dst = CU_MEMORYTYPE_DEVICE; break;
    case cudaMemcpyDeviceToHost: *src = CU_MEMORYTYPE_DEVICE; *dst = CU_MEMORYTYPE_HOST; break;
    case cudaMemcpyDeviceToDevice: *src = *dst = CU_MEMORYTYPE_DEVICE; break;
    case cudaMemcpyHostToHost: *src = *dst = CU_MEMORYTYPE_HOST; break;
    default: *src = *dst = CU_MEMORYTYPE_UNIFIED; break;
    }
}

static void set_side(CUmemorytype t, const void *p, CUmemorytype *type, const void **host,
                     CUdeviceptr *dev)
{
    *type = t;
    if (t == CU_MEMORYTYPE_HOST)
        *host = p;
    else
        *dev = (CUdeviceptr)(uintptr_t)p;
}

static cudaError_t copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                          size_t height, enum cudaMemcpyKind kind, bool async, cudaStream_t s,
                          int pt)
{
    if (kind > cudaMemcpyDefault)
        return set_err(cudaErrorInvalidMemcpyDirection);
    READY();
    CUDA_MEMCPY2D c;
    memset(&c, 0, sizeof(c));
    CUmemorytype st, dt;
    kind_types(kind, &st, &dt);
    set_side(st, src, &c.srcMemoryType, &c.srcHost, &c.srcDevice);
    const void *dh = NULL;
    set_side(dt, dst, &c.dstMemoryType, &dh, &c.dstDevice);
    c.dstHost = (void *)dh;
    c.srcPitch = spitch;
    c.dstPitch = dpitch;
    c.WidthInBytes = width;
    c.Height = height;
    RET(async ? drv[pt].memcpy2d_async(&c, s) : drv[pt].memcpy2d(&c));
}

RT_EXPORT cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch,
                                   size_t width, size_t height, enum cudaMemcpyKind kind)
{
    return copy2d(dst, dpitch, src, spitch, width, height, kind, false, NULL, 0);
}
RT_EXPORT cudaError_t cudaMemcpy2D_ptds(void *dst, size_t dpitch, const void *src, size_t spitch,
                                        size_t width, size_t height, enum cudaMemcpyKind kind)
{
    return copy2d(dst, dpitch, src, spitch, width, height, kind, false, NULL, 1);
}
RT_EXPORT cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                                        size_t width, size_t height, enum cudaMemcpyKind kind,
                                        cudaStream_t stream)
{
    return copy2d(dst, dpitch, src, spitch, width, height, kind, true, stream, 0);
}
RT_EXPORT cudaError_t cudaMemcpy2DAsync_ptsz(void *dst, size_t dpitch, const void *src,
                                             size_t spitch, size_t width, size_t height,
                                             enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return copy2d(dst, dpitch, src, spitch, width, height, kind, true, stream, 1);
}

static cudaError_t copy3d(const struct cudaMemcpy3DParms *p, bool async, cudaStream_t s, int pt)
{
    if (!p || p->srcArray || p->dstArray)
        return set_err(cudaErrorInvalidValue); /* arrays are not modelled */
    if (p->kind > cudaMemcpyDefault)
        return set_err(cudaErrorInvalidMemcpyDirection);
    READY();
    CUDA_MEMCPY3D c;
    memset(&c, 0, sizeof(c));
    CUmemorytype st, dt;
    kind_types(p->kind, &st, &dt);
    set_side(st, p->srcPtr.ptr, &c.srcMemoryType, &c.srcHost, &c.srcDevice);
    const void *dh = NULL;
    set_side(dt, p->dstPtr.ptr, &c.dstMemoryType, &dh, &c.dstDevice);
    c.dstHost = (void *)dh;
    c.srcXInBytes = p->srcPos.x;
    c.srcY = p->srcPos.y;
    c.srcZ = p->srcPos.z;
    c.srcPitch = p->srcPtr.pitch;
    c.srcHeight = p->srcPtr.ysize;
    c.dstXInBytes = p->dstPos.x;
    c.dstY = p->dstPos.y;
    c.dstZ = p->dstPos.z;
    c.dstPitch = p->dstPtr.pitch;
    c.dstHeight = p->dstPtr.ysize;
    c.WidthInBytes = p->extent.width;
    c.Height = p->extent.height;
    c.Depth = p->extent.depth;
    RET(async ? drv[pt].memcpy3d_async(&c, s) : drv[pt].memcpy3d(&c));
}

RT_EXPORT cudaError_t cudaMemcpy3D(const struct cudaMemcpy3DParms *p)
{
    return copy3d(p, false, NULL, 0);
}
RT_EXPORT cudaError_t cudaMemcpy3D_ptds(const struct cudaMemcpy3DParms *p)
{
    return copy3d(p, false, NULL, 1);
}
RT_EXPORT cudaError_t cudaMemcpy3DAsync(const struct cudaMemcpy3DParms *p, cudaStream_t stream)
{
    return copy3d(p, true, stream, 0);
}
RT_EXPORT cudaError_t cudaMemcpy3DAsync_ptsz(const struct cudaMemcpy3DParms *p, cudaStream_t stream)
{
    return copy3d(p, true, stream, 1);
}

RT_EXPORT cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
    READY();
    RET(drv[0].memset8((CUdeviceptr)(uintptr_t)devPtr, (unsigned char)value, count));
}
RT_EXPORT cudaError_t cudaMemset_ptds(void *devPtr, int value, size_t count)
{
    READY();
    RET(drv[1].memset8((CUdeviceptr)(uintptr_t)devPtr, (unsigned char)value, count));
}
RT_EXPORT cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    READY();
    RET(drv[0].memset8_async((CUdeviceptr)(uintptr_t)devPtr, (unsigned char)value, count, stream));
}
RT_EXPORT cudaError_t cudaMemsetAsync_ptsz(void *devPtr, int value, size_t count,
                                           cudaStream_t stream)
{
    READY();
    RET(drv[1].memset8_async((CUdeviceptr)(uintptr_t)devPtr, (unsigned char)value, count, stream));
}

/* --- launches ------------------------------------------------------------ */

RT_EXPORT cudaError_t cudaGetFuncBySymbol(cudaFunction_t *functionPtr, const void *symbolPtr)
{
    if (!functionPtr || !symbolPtr)
        return set_err(cudaErrorInvalidValue);
    READY();
    CUfunction f = stub_func(symbolPtr);
    if (!f)
        return set_err(cudaErrorInvalidDeviceFunction);
    *functionPtr = f;
    return cudaSuccess;
}

static cudaError_t launch(const void *func, dim3 g, dim3 b, void **args, size_t shmem,
                          cudaStream_t s, int pt)
{
    READY();
    CUfunction f = stub_func(func);
    if (!f)
        return set_err(cudaErrorInvalidDeviceFunction);
    RET(drv[pt].launch(f, g.x, g.y, g.z, b.x, b.y, b.z, (unsigned)shmem, s, args, NULL));
}

RT_EXPORT cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                       size_t sharedMem, cudaStream_t stream)
{
    return launch(func, gridDim, blockDim, args, sharedMem, stream, 0);
}

RT_EXPORT cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 gridDim, dim3 blockDim,
                                            void **args, size_t sharedMem, cudaStream_t stream)
{
    return launch(func, gridDim, blockDim, args, sharedMem, stream, 1);
}

/* --- streams, capture, graphs -------------------------------------------- */

RT_EXPORT cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
    if (!pStream)
        return set_err(cudaErrorInvalidValue);
    READY();
    RET(drv[0].stream_create(pStream, 0));
}

RT_EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    if (!pStream)
        return set_err(cudaErrorInvalidValue);
    READY();
    RET(drv[0].stream_create(pStream, flags));
}

RT_EXPORT cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    READY();
    RET(drv[0].stream_destroy(stream));
}

RT_EXPORT cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    READY();
    RET(drv[0].stream_sync(stream));
}
RT_EXPORT cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream)
{
    READY();
    RET(drv[1].stream_sync(stream));
}

RT_EXPORT cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    READY();
    RET(drv[0].begin_capture(stream, (CUstreamCaptureMode)mode));
}
RT_EXPORT cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream,
                                                  enum cudaStreamCaptureMode mode)
{
    READY();
    RET(drv[1].begin_capture(stream, (CUstreamCaptureMode)mode));
}

RT_EXPORT cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
    READY();
    RET(drv[0].end_capture(stream, pGraph));
}
RT_EXPORT cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph)
{
    READY();
    RET(drv[1].end_capture(stream, pGraph));
}

RT_EXPORT cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
                                            enum cudaStreamCaptureStatus *pCaptureStatus)
{
    READY();
    RET(drv[0].is_capturing(stream, (CUstreamCaptureStatus *)pCaptureStatus));
}
RT_EXPORT cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t stream,
                                                 enum cudaStreamCaptureStatus *pCaptureStatus)
{
    READY();
    RET(drv[1].is_capturing(stream, (CUstreamCaptureStatus *)pCaptureStatus));
}

RT_EXPORT cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                           unsigned long long flags)
{
    READY();
    RET(drv[0].instantiate(pGraphExec, graph, flags));
}

RT_EXPORT cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)
{
    READY();
    RET(drv[0].graph_launch(graphExec, stream));
}
RT_EXPORT cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t graphExec, cudaStream_t stream)
{
    READY();
    RET(drv[1].graph_launch(graphExec, stream));
}

RT_EXPORT cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec)
{
    READY();
    RET(drv[0].exec_destroy(graphExec));
}

RT_EXPORT cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    READY();
    RET(drv[0].graph_destroy(graph));
}

/* --- driver entry points ------------------------------------------------- */

/* Like the real runtime: straight through the inner resolver. The status
 * enum values coincide with CUdriverProcAddressQueryResult. */
static cudaError_t entry_point(const char *symbol, void **funcPtr, unsigned int version,
                               unsigned long long flags,
                               enum cudaDriverEntryPointQueryResult *status, int pt)
{
    if (!symbol || !funcPtr)
        return set_err(cudaErrorInvalidValue);
    pthread_once(&boot_once, boot);
    if (!inner)
        return set_err(boot_err ? boot_err : cudaErrorInsufficientDriver);
    if (pt && flags == cudaEnableDefault)
        flags = cudaEnablePerThreadDefaultStream;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = inner(symbol, funcPtr, (int)version, flags, &st);
    if (r == CUDA_ERROR_NOT_FOUND || (r == CUDA_SUCCESS && !*funcPtr)) {
        /* Measured on runtime 13.0.96 / driver 580: a missing or too-new
         * symbol is cudaSuccess with *funcPtr = NULL and the status set;
         * nothing is left in cudaGetLastError. */
        *funcPtr = NULL;
        if (status)
            *status = (enum cudaDriverEntryPointQueryResult)st;
        return cudaSuccess;
    }
    if (status)
        *status = (enum cudaDriverEntryPointQueryResult)st;
    RET(r);
}

RT_EXPORT cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr,
                                              unsigned long long flags,
                                              enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, CUDART_VERSION, flags, driverStatus, 0);
}
RT_EXPORT cudaError_t cudaGetDriverEntryPoint_ptsz(
    const char *symbol, void **funcPtr, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, CUDART_VERSION, flags, driverStatus, 1);
}

RT_EXPORT cudaError_t cudaGetDriverEntryPointByVersion(
    const char *symbol, void **funcPtr, unsigned int cudaVersion, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, cudaVersion, flags, driverStatus, 0);
}
RT_EXPORT cudaError_t cudaGetDriverEntryPointByVersion_ptsz(
    const char *symbol, void **funcPtr, unsigned int cudaVersion, unsigned long long flags,
    enum cudaDriverEntryPointQueryResult *driverStatus)
{
    return entry_point(symbol, funcPtr, cudaVersion, flags, driverStatus, 1);
}
