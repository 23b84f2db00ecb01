/* tests/fake/client-runtime.c: the work client-static does, through the CUDA
 * runtime API of the fake libcudart.so.13 (which reaches the fake driver
 * only through dlopen + cuGetProcAddress, like the real one): allocations of
 * every kind, 1D/2D/3D copies, memset, launches through host stubs (one
 * with pointers inside a by-value struct), capture and graph replay, and
 * the VMM calls PyTorch's expandable segments make through
 * cudaGetDriverEntryPointByVersion.
 *
 * Built twice: client-runtime, and client-runtime-ptsz with
 * CUDA_API_PER_THREAD_DEFAULT_STREAM (the _ptsz/_ptds entry points, as
 * nvcc --default-stream per-thread produces).
 *
 * One "ok"/"FAIL" line per check, then "count <name> <n>" lines; exit 1 on
 * any failure.
 *
 * usage: client-runtime [--allocs N] [--launches N] [--replays N] [--size BYTES]
 *                       [--check-driver]   (last; standalone runs only) */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda.h"

static int failures;
/* File-scope so an early exit on a failed check leaves them reachable:
 * leak checkers then report only what the code under test loses. */
static float **buf;
static float *host, *back;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            printf("ok ");                                                                         \
        } else {                                                                                   \
            printf("FAIL ");                                                                       \
            failures++;                                                                            \
        }                                                                                          \
        printf(__VA_ARGS__);                                                                       \
        putchar('\n');                                                                             \
    } while (0)

#define RT(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        CHECK(e_ == cudaSuccess, "%s -> %s", #call, cudaGetErrorName(e_));                        \
    } while (0)
#define CU(call) CHECK((call) == CUDA_SUCCESS, "%s", #call)

struct io {
    const float *in;
    float *out;
    int n;
    int pad;
};

/* The fake's fakecuda_access (dlsym'ed at start): kernels declare what they
 * read and write, so managed memory faults and migrates as on a GPU. */
static long (*access_fn)(const void *, size_t, int, int);

static void declare(const void *p, size_t n, int write)
{
    if (access_fn && n)
        access_fn(p, n, 0, write);
}

static void k_struct_axpy(void **p, const uint32_t grid[3], const uint32_t block[3])
{
    struct io a = *(struct io *)p[0];
    float scale = *(float *)p[1];
    declare(a.in, (size_t)a.n * sizeof(float), 0);
    declare(a.out, (size_t)a.n * sizeof(float), 1);
    for (int i = 0; i < a.n; i++)
        a.out[i] += a.in[i] * scale;
}

static void k_add(void **p, const uint32_t grid[3], const uint32_t block[3])
{
    const float *x = *(const float **)p[0];
    float *y = *(float **)p[1];
    float c = *(float *)p[2];
    int n = *(int *)p[3];
    declare(x, (size_t)n * sizeof(float), 0);
    declare(y, (size_t)n * sizeof(float), 1);
    for (int i = 0; i < n; i++)
        y[i] = x[i] + c;
}

/* Host stubs: what nvcc generates and passes to cudaLaunchKernel. Distinct
 * bodies keep the linker from folding them into one address. */
static volatile int stub_calls;
__attribute__((noinline)) static void stub_struct_axpy(void) { stub_calls += 1; }
__attribute__((noinline)) static void stub_add(void) { stub_calls += 2; }
__attribute__((noinline)) static void stub_unregistered(void) { stub_calls += 3; }

static long arg(int argc, char **argv, const char *name, long def)
{
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return strtol(argv[i + 1], NULL, 0);
    return def;
}

int main(int argc, char **argv)
{
    long nallocs = arg(argc, argv, "--allocs", 4);
    long nlaunch = arg(argc, argv, "--launches", 8);
    long nreplay = arg(argc, argv, "--replays", 3);
    long bytes = arg(argc, argv, "--size", 4096);
    if (nallocs < 2 || bytes < 256 || nlaunch < 0 || nreplay < 0) {
        fprintf(stderr, "usage: %s [--allocs N>=2] [--launches N] [--replays N] [--size B>=256]\n",
                argv[0]);
        return 2;
    }
    int n = (int)(bytes / sizeof(float));
    long allocs = 0, frees = 0, copies = 0, launches = 0, graph_launches = 0, vmm_maps = 0;

    int count = 0;
    RT(cudaGetDeviceCount(&count));
    CHECK(count >= 1, "device count %d", count);
    RT(cudaSetDevice(0));
    int rtv = 0, drvv = 0;
    RT(cudaRuntimeGetVersion(&rtv));
    RT(cudaDriverGetVersion(&drvv));
    CHECK(drvv >= rtv, "driver %d >= runtime %d", drvv, rtv);

    /* Kernels: the fake driver's registration stands in for the fatbin,
     * fakecudart_register for __cudaRegisterFunction. */
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CHECK(h != NULL, "libcuda.so.1 already loaded by the runtime");
    if (!h)
        return 1;
    CUfunction (*reg)(const char *, int, const size_t *, fakecuda_kernel_fn) =
        (CUfunction(*)(const char *, int, const size_t *, fakecuda_kernel_fn))dlsym(h, "fakecuda_kernel");
    CHECK(reg != NULL, "fakecuda_kernel");
    access_fn = (long (*)(const void *, size_t, int, int))dlsym(h, "fakecuda_access");
    if (!reg)
        return 1;
    const size_t sz_axpy[] = { sizeof(struct io), sizeof(float) };
    const size_t sz_add[] = { sizeof(float *), sizeof(float *), sizeof(float), sizeof(int) };
    CUfunction f_axpy = reg("rt_struct_axpy", 2, sz_axpy, k_struct_axpy);
    CUfunction f_add = reg("rt_add", 4, sz_add, k_add);
    CHECK(fakecudart_register((const void *)stub_struct_axpy, f_axpy) == 0, "register stub axpy");
    CHECK(fakecudart_register((const void *)stub_add, f_add) == 0, "register stub add");
    cudaFunction_t fn = NULL;
    RT(cudaGetFuncBySymbol(&fn, (const void *)stub_add));
    CHECK(fn == f_add, "cudaGetFuncBySymbol maps the stub to its function");

    buf = calloc((size_t)nallocs, sizeof(*buf));
    host = malloc((size_t)bytes);
    back = malloc((size_t)bytes);
    if (!buf || !host || !back)
        return 1;
    for (int i = 0; i < n; i++)
        host[i] = (float)i;
    for (long i = 0; i < nallocs; i++) {
        cudaError_t e = cudaMalloc((void **)&buf[i], (size_t)bytes);
        CHECK(e == cudaSuccess, "cudaMalloc #%ld", i);
        if (e != cudaSuccess)
            return 1;
        allocs++;
    }
    RT(cudaMemcpy(buf[0], host, (size_t)bytes, cudaMemcpyHostToDevice));
    copies++;
    RT(cudaMemset(buf[nallocs - 1], 0, (size_t)bytes));

    cudaStream_t s;
    RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (long i = 0; i < nlaunch; i++) {
        float c = 1.0f;
        void *args[] = { &buf[0], &buf[1], &c, &n };
        cudaError_t e = cudaLaunchKernel((const void *)stub_add, (dim3){ 1, 1, 1 },
                                         (dim3){ 128, 1, 1 }, args, 0, i % 2 ? s : 0);
        if (e != cudaSuccess)
            CHECK(0, "cudaLaunchKernel #%ld: %s", i, cudaGetErrorName(e));
        launches++;
    }
    RT(cudaStreamSynchronize(s));
    RT(cudaDeviceSynchronize());
    if (nlaunch) {
        RT(cudaMemcpy(back, buf[1], (size_t)bytes, cudaMemcpyDeviceToHost));
        copies++;
        CHECK(back[0] == 1.0f && back[n - 1] == (float)n, "kernel result y = x + 1");
    }
    {
        void *args[] = { NULL };
        cudaError_t e = cudaLaunchKernel((const void *)stub_unregistered, (dim3){ 1, 1, 1 },
                                         (dim3){ 1, 1, 1 }, args, 0, 0);
        CHECK(e == cudaErrorInvalidDeviceFunction, "unregistered stub: %s", cudaGetErrorName(e));
        CHECK(cudaGetLastError() == cudaErrorInvalidDeviceFunction && cudaGetLastError() == cudaSuccess,
              "cudaGetLastError returns the error once");
    }

    /* 2D and 3D copies between device buffers. */
    RT(cudaMemcpy2D(buf[1], 64, buf[0], 64, 32, 4, cudaMemcpyDeviceToDevice));
    copies++;
    struct cudaMemcpy3DParms p3 = { 0 };
    p3.srcPtr = (struct cudaPitchedPtr){ buf[0], 64, 64, 2 };
    p3.dstPtr = (struct cudaPitchedPtr){ buf[1], 64, 64, 2 };
    p3.extent = (struct cudaExtent){ 16, 2, 2 };
    p3.kind = cudaMemcpyDefault;
    RT(cudaMemcpy3D(&p3));
    copies++;
    RT(cudaMemcpyAsync(back, buf[1], 256, cudaMemcpyDefault, s));
    copies++;
    CHECK(back[0] == 0.0f && back[7] == 7.0f && back[16] == 16.0f && back[48] == 48.0f,
          "2D/3D copies moved the bytes");

    /* Capture a struct-parameter launch on s, replay it. */
    RT(cudaMemset(buf[nallocs - 1], 0, (size_t)bytes));
    RT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    RT(cudaStreamIsCapturing(s, &cs));
    CHECK(cs == cudaStreamCaptureStatusActive, "capturing");
    struct io io = { buf[0], buf[nallocs - 1], n, 0 };
    float scale = 2.0f;
    void *cargs[] = { &io, &scale };
    RT(cudaLaunchKernel((const void *)stub_struct_axpy, (dim3){ 1, 1, 1 }, (dim3){ 32, 1, 1 },
                        cargs, 0, s));
    launches++;
    cudaGraph_t g = NULL;
    RT(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t ge = NULL;
    RT(cudaGraphInstantiate(&ge, g, 0));
    for (long i = 0; i < nreplay; i++) {
        RT(cudaGraphLaunch(ge, s));
        graph_launches++;
    }
    RT(cudaStreamSynchronize(s));
    RT(cudaMemcpy(back, buf[nallocs - 1], (size_t)bytes, cudaMemcpyDeviceToHost));
    copies++;
    CHECK(back[3] == 6.0f * (float)nreplay, "graph replayed %ld times: out[3] = %g", nreplay,
          (double)back[3]);
    RT(cudaGraphExecDestroy(ge));
    RT(cudaGraphDestroy(g));

    /* Other allocation kinds. */
    void *managed = NULL, *pinned = NULL, *hostalloc = NULL, *async = NULL;
    RT(cudaMallocManaged(&managed, (size_t)bytes, cudaMemAttachGlobal));
    RT(cudaMallocHost(&pinned, 4096));
    RT(cudaHostAlloc(&hostalloc, 4096, cudaHostAllocMapped));
    RT(cudaMallocAsync(&async, (size_t)bytes, s));
    allocs += 4;
    struct cudaPointerAttributes pa;
    RT(cudaPointerGetAttributes(&pa, buf[0]));
    CHECK(pa.type == cudaMemoryTypeDevice && pa.devicePointer == buf[0], "device pointer attributes");
    RT(cudaPointerGetAttributes(&pa, managed));
    CHECK(pa.type == cudaMemoryTypeManaged, "managed pointer attributes");
    RT(cudaPointerGetAttributes(&pa, pinned));
    CHECK(pa.type == cudaMemoryTypeHost, "pinned pointer attributes");
    RT(cudaPointerGetAttributes(&pa, host));
    CHECK(pa.type == cudaMemoryTypeUnregistered, "pageable pointer attributes");
    size_t fr = 0, tot = 0;
    RT(cudaMemGetInfo(&fr, &tot));
    CHECK(tot > 0 && fr < tot, "cudaMemGetInfo free %zu of %zu", fr, tot);
    RT(cudaFreeAsync(async, s));
    RT(cudaFreeHost(hostalloc));
    RT(cudaFreeHost(pinned));
    RT(cudaFree(managed));
    frees += 4;

    /* The VMM path PyTorch's expandable segments take. */
    PFN_cuMemGetAllocationGranularity_v10020 gran_fn = NULL;
    PFN_cuMemCreate_v10020 create_fn = NULL;
    PFN_cuMemAddressReserve_v10020 reserve_fn = NULL;
    PFN_cuMemMap_v10020 map_fn = NULL;
    PFN_cuMemSetAccess_v10020 set_access_fn = NULL;
    PFN_cuMemUnmap_v10020 unmap_fn = NULL;
    PFN_cuMemRelease_v10020 release_fn = NULL;
    PFN_cuMemAddressFree_v10020 afree_fn = NULL;
    enum cudaDriverEntryPointQueryResult qr = cudaDriverEntryPointSymbolNotFound;
#define EP(var, name)                                                                              \
    RT(cudaGetDriverEntryPointByVersion(name, (void **)&var, 12000, cudaEnableDefault, &qr));     \
    CHECK(var && qr == cudaDriverEntryPointSuccess, "entry point %s", name)
    EP(gran_fn, "cuMemGetAllocationGranularity");
    EP(create_fn, "cuMemCreate");
    EP(reserve_fn, "cuMemAddressReserve");
    EP(map_fn, "cuMemMap");
    EP(set_access_fn, "cuMemSetAccess");
    EP(unmap_fn, "cuMemUnmap");
    EP(release_fn, "cuMemRelease");
    EP(afree_fn, "cuMemAddressFree");
    void *none = (void *)1;
    cudaGetDriverEntryPointByVersion("cuNoSuchThing", &none, 12000, cudaEnableDefault, &qr);
    CHECK(none == NULL && qr == cudaDriverEntryPointSymbolNotFound, "unknown entry point status");
    cudaGetDriverEntryPointByVersion("cuMemCreate", &none, 10000, cudaEnableDefault, &qr);
    CHECK(none == NULL && qr == cudaDriverEntryPointVersionNotSufficent,
          "entry point asked at too low a version");
    if (gran_fn && create_fn && reserve_fn && map_fn && set_access_fn && unmap_fn && release_fn &&
        afree_fn) {
        CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                     .location = { CU_MEM_LOCATION_TYPE_DEVICE, 0 } };
        size_t gsz = 0;
        CU(gran_fn(&gsz, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
        CUmemGenericAllocationHandle mh = 0;
        CUdeviceptr va = 0;
        CU(create_fn(&mh, gsz, &prop, 0));
        CU(reserve_fn(&va, 4 * gsz, 0, 0, 0));
        CU(map_fn(va, gsz, 0, mh, 0));
        vmm_maps++;
        CUmemAccessDesc ad = { .location = { CU_MEM_LOCATION_TYPE_DEVICE, 0 },
                               .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
        CU(set_access_fn(va, gsz, &ad, 1));
        float c = 5.0f;
        float *vp = (float *)(uintptr_t)va;
        void *args[] = { &buf[0], &vp, &c, &n };
        RT(cudaLaunchKernel((const void *)stub_add, (dim3){ 1, 1, 1 }, (dim3){ 1, 1, 1 }, args, 0, s));
        launches++;
        RT(cudaMemcpy(back, vp, 16, cudaMemcpyDeviceToHost));
        copies++;
        CHECK(back[2] == 7.0f, "kernel wrote through a VMM mapping");
        CU(unmap_fn(va, gsz));
        CU(release_fn(mh));
        CU(afree_fn(va, 4 * gsz));
    }

    /* A driver entry point fetched the deprecated way still works. */
    PFN_cuMemAlloc_v3020 alloc_fn = NULL;
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
    RT(cudaGetDriverEntryPoint("cuMemAlloc", (void **)&alloc_fn, cudaEnableDefault, &qr));
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
    if (alloc_fn) {
        CUdeviceptr dp = 0;
        CU(alloc_fn(&dp, 1024));
        allocs++;
        RT(cudaFree((void *)(uintptr_t)dp));
        frees++;
    }

    RT(cudaStreamDestroy(s));
    for (long i = 0; i < nallocs; i++) {
        RT(cudaFree(buf[i]));
        frees++;
    }

    /* Standalone against the fake: the driver saw exactly this. */
    if (argc > 1 && strcmp(argv[argc - 1], "--check-driver") == 0) {
        uint64_t (*live)(int) = (uint64_t(*)(int))dlsym(h, "fakecuda_live_bytes");
        uint64_t (*calls)(const char *) = (uint64_t(*)(const char *))dlsym(h, "fakecuda_calls");
        if (!live || !calls) {
            CHECK(0, "fake driver instrumentation present");
        } else {
#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
            const char *lk = "cuLaunchKernel_ptsz", *gl = "cuGraphLaunch_ptsz";
#else
            const char *lk = "cuLaunchKernel", *gl = "cuGraphLaunch";
#endif
            CHECK(live(FAKECUDA_ANY) == 0, "nothing left allocated (%llu bytes)",
                  (unsigned long long)live(FAKECUDA_ANY));
            CHECK(calls("cuMemAlloc_v2") == (uint64_t)nallocs + 1, "driver saw %ld cuMemAlloc_v2",
                  nallocs + 1);
            CHECK(calls(lk) == (uint64_t)launches, "driver saw %ld %s", launches, lk);
            CHECK(calls(gl) == (uint64_t)graph_launches, "driver saw %ld %s", graph_launches, gl);
            CHECK(calls("cuMemMap") == (uint64_t)vmm_maps, "driver saw %ld cuMemMap", vmm_maps);
        }
    }

    printf("count allocs %ld\n", allocs);
    printf("count frees %ld\n", frees);
    printf("count copies %ld\n", copies);
    printf("count launches %ld\n", launches);
    printf("count captured_launches %d\n", 1);
    printf("count graph_launches %ld\n", graph_launches);
    printf("count vmm_maps %ld\n", vmm_maps);
    printf("count resolved %d\n", fakecudart_resolved());
    /* What the fake saw of memory traffic ("fake" lines: informational,
     * they depend on placement when a shim is loaded). */
    uint64_t (*stat)(int) = NULL;
    static const char *const stat_names[] = { "fakecuda_faults", "fakecuda_remote_bytes",
                                              "fakecuda_migrated_bytes" };
    for (int i = 0; i < 3; i++)
        if ((stat = (uint64_t(*)(int))dlsym(h, stat_names[i])))
            printf("fake %s_dev0 %llu\n", stat_names[i] + 9, (unsigned long long)stat(0));
    printf("count failures %d\n", failures);
    free(buf);
    free(host);
    free(back);
    return failures ? 1 : 0;
}
