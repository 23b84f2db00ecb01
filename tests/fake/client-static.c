/* tests/fake/client-static.c: a program that reaches the driver the way a
 * static cudart copy inside cuBLAS/NCCL does: dlopen("libcuda.so.1"),
 * dlsym("cuGetProcAddress_v2"), ask it for "cuGetProcAddress" (the inner
 * resolver), resolve every name the driver knows through the inner pointer
 * with flags 0 and 2 and a NULL symbolStatus, plus a few direct dlsym
 * look-ups (cuBLAS dlsyms cuLaunchKernel(Ex) itself). Then it allocates,
 * copies, launches kernels (one takes a pointer inside a by-value struct),
 * captures a graph and replays it.
 *
 * Run against the fake driver (LD_LIBRARY_PATH=tests/fake), alone or under
 * LD_PRELOAD=libwoffload.so. One "ok"/"FAIL" line per check, then
 * "count <name> <n>" lines a test can compare with the shim's stats. Exit
 * status 1 on any failure.
 *
 * Counts: allocs/frees cover cuMemAlloc, cuMemAllocManaged, cuMemAllocAsync
 * (and their frees); VMM mappings are counted apart.
 *
 * usage: client-static [--allocs N] [--launches N] [--replays N]
 *                      [--size BYTES] [--per-thread] [--threads N] [--check-driver]
 * --threads N: N more threads, each doing --launches rounds of alloc x2, H2D,
 * launch, D2H, free x2 on its own stream (the per-thread default stream with
 * --per-thread); their work is included in the counts.
 * --check-driver: also compare with the fake driver's own counters
 * (standalone runs only). */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda.h"

static int failures;
/* File-scope so an early exit on a failed check leaves them reachable:
 * leak checkers then report only what the code under test loses. */
static CUdeviceptr *buf;
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

#define CU(call) CHECK((call) == CUDA_SUCCESS, "%s", #call)

/* The driver table, as a runtime builds it. */
static struct {
    PFN_cuInit_v2000 init;
    PFN_cuDeviceGet_v2000 device_get;
    PFN_cuDevicePrimaryCtxRetain_v7000 ctx_retain;
    PFN_cuDevicePrimaryCtxRelease_v11000 ctx_release;
    PFN_cuCtxSetCurrent_v4000 ctx_set;
    PFN_cuMemAlloc_v3020 mem_alloc;
    PFN_cuMemFree_v3020 mem_free;
    PFN_cuMemcpyHtoD_v3020 htod;
    PFN_cuMemcpyDtoH_v3020 dtoh;
    PFN_cuMemcpyHtoDAsync_v3020 htod_async;
    PFN_cuLaunchKernel_v4000 launch;
    PFN_cuStreamCreate_v2000 stream_create;
    PFN_cuStreamDestroy_v4000 stream_destroy;
    PFN_cuStreamSynchronize_v2000 stream_sync;
    PFN_cuStreamBeginCapture_v10010 begin_capture;
    PFN_cuStreamEndCapture_v10000 end_capture;
    PFN_cuStreamIsCapturing_v10000 is_capturing;
    PFN_cuGraphInstantiateWithFlags_v11040 instantiate;
    PFN_cuGraphLaunch_v10000 graph_launch;
    PFN_cuGraphExecDestroy_v10000 exec_destroy;
    PFN_cuGraphDestroy_v10000 graph_destroy;
    PFN_cuFuncGetParamInfo_v12040 param_info;
    PFN_cuMemAllocManaged_v6000 alloc_managed;
    PFN_cuMemAdvise_v12020 advise;
    PFN_cuMemPrefetchAsync_v12020 prefetch;
    PFN_cuMemAllocAsync_v11020 alloc_async;
    PFN_cuMemFreeAsync_v11020 free_async;
    PFN_cuMemGetAllocationGranularity_v10020 granularity;
    PFN_cuMemCreate_v10020 vmm_create;
    PFN_cuMemRelease_v10020 vmm_release;
    PFN_cuMemAddressReserve_v10020 vmm_reserve;
    PFN_cuMemAddressFree_v10020 vmm_free;
    PFN_cuMemMap_v10020 vmm_map;
    PFN_cuMemUnmap_v10020 vmm_unmap;
    PFN_cuMemSetAccess_v10020 vmm_access;
} d;

struct io {
    const float *in;
    float *out;
    int n;
    int pad;
};

/* out[i] += in[i] * scale for a by-value struct io and a float scale. */
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

/* y[i] = x[i] + c */
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

/* --threads: each worker allocates, copies in, launches k_add on its own
 * stream, copies out and frees, `iters` times. */
struct worker {
    pthread_t tid;
    CUcontext ctx;
    CUfunction f;
    long iters;
    int n;
    int per_thread_stream; /* launch on the default (per-thread) stream */
    long fails;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    size_t bytes = (size_t)w->n * sizeof(float);
    float *in_ = calloc((size_t)w->n, sizeof(float)), *out_ = calloc((size_t)w->n, sizeof(float));
    CUstream s = NULL;
    if (!in_ || !out_ || d.ctx_set(w->ctx) != CUDA_SUCCESS ||
        (!w->per_thread_stream && d.stream_create(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)) {
        w->fails++;
        goto out;
    }
    for (long i = 0; i < w->iters; i++) {
        CUdeviceptr x = 0, y = 0;
        float c = (float)i;
        in_[w->n - 1] = (float)i;
        if (d.mem_alloc(&x, bytes) || d.mem_alloc(&y, bytes) || d.htod_async(x, in_, bytes, s)) {
            w->fails++;
            break;
        }
        void *params[] = { &x, &y, &c, &w->n };
        if (d.launch(w->f, 1, 1, 1, 32, 1, 1, 0, s, params, NULL) || d.stream_sync(s) ||
            d.dtoh(out_, y, bytes) || out_[w->n - 1] != 2.0f * (float)i)
            w->fails++;
        if (d.mem_free(x) || d.mem_free(y))
            w->fails++;
    }
    if (s)
        d.stream_destroy(s);
out:
    free(in_);
    free(out_);
    return NULL;
}

static long arg(int argc, char **argv, const char *name, long def)
{
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return strtol(argv[i + 1], NULL, 0);
    return def;
}

static int flag(int argc, char **argv, const char *name)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return 1;
    return 0;
}

int main(int argc, char **argv)
{
    long nallocs = arg(argc, argv, "--allocs", 4);
    long nlaunch = arg(argc, argv, "--launches", 8);
    long nreplay = arg(argc, argv, "--replays", 3);
    long bytes = arg(argc, argv, "--size", 4096);
    int per_thread = flag(argc, argv, "--per-thread");
    cuuint64_t flags = per_thread ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
    if (nallocs < 2 || bytes < 64 || nlaunch < 0 || nreplay < 0) {
        fprintf(stderr, "usage: %s [--allocs N>=2] [--launches N] [--replays N] [--size B>=64] "
                        "[--per-thread]\n", argv[0]);
        return 2;
    }
    int n = (int)(bytes / sizeof(float));

    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK(h != NULL, "dlopen libcuda.so.1 (%s)", h ? "loaded" : dlerror());
    if (!h)
        return 1;
    PFN_cuGetProcAddress_v12000 gpa = (PFN_cuGetProcAddress_v12000)dlsym(h, "cuGetProcAddress_v2");
    CHECK(gpa != NULL, "dlsym cuGetProcAddress_v2");
    if (!gpa)
        return 1;
    PFN_cuGetProcAddress_v12000 inner = NULL;
    CU(gpa("cuGetProcAddress", (void **)&inner, 13000, 0, NULL));
    CHECK(inner != NULL, "inner resolver");
    if (!inner)
        return 1;

    /* Resolve everything the driver knows, both flavours, as cudart does. */
    long resolved = 0, tried = 0;
    const char *const *(*names_fn)(void) = (const char *const *(*)(void))dlsym(h, "fakecuda_proc_names");
    if (names_fn) {
        for (const char *const *nm = names_fn(); *nm; nm++) {
            for (cuuint64_t f = 0; f <= 2; f += 2) {
                void *p = NULL;
                tried++;
                if (inner(*nm, &p, 13000, f, NULL) == CUDA_SUCCESS && p)
                    resolved++;
            }
        }
    }
    CHECK(resolved == tried && resolved > 0, "resolved %ld of %ld names through the inner resolver",
          resolved, tried);
    void *bogus = (void *)1;
    CHECK(inner("cuNoSuchFunction", &bogus, 13000, 0, NULL) == CUDA_ERROR_NOT_FOUND && !bogus,
          "unknown name: CUDA_ERROR_NOT_FOUND and NULL");

    long nresolve = 0;
#define RESOLVE(field, name)                                                                       \
    do {                                                                                           \
        CUresult r_ = inner(name, (void **)&d.field, 13000, flags, NULL);                          \
        nresolve++;                                                                                \
        if (r_ != CUDA_SUCCESS || !d.field) {                                                      \
            CHECK(0, "resolve %s", name);                                                          \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)
    RESOLVE(init, "cuInit");
    RESOLVE(device_get, "cuDeviceGet");
    RESOLVE(ctx_retain, "cuDevicePrimaryCtxRetain");
    RESOLVE(ctx_release, "cuDevicePrimaryCtxRelease");
    RESOLVE(ctx_set, "cuCtxSetCurrent");
    RESOLVE(mem_alloc, "cuMemAlloc");
    RESOLVE(mem_free, "cuMemFree");
    RESOLVE(htod, "cuMemcpyHtoD");
    RESOLVE(dtoh, "cuMemcpyDtoH");
    RESOLVE(htod_async, "cuMemcpyHtoDAsync");
    RESOLVE(launch, "cuLaunchKernel");
    RESOLVE(stream_create, "cuStreamCreate");
    RESOLVE(stream_destroy, "cuStreamDestroy");
    RESOLVE(stream_sync, "cuStreamSynchronize");
    RESOLVE(begin_capture, "cuStreamBeginCapture");
    RESOLVE(end_capture, "cuStreamEndCapture");
    RESOLVE(is_capturing, "cuStreamIsCapturing");
    RESOLVE(instantiate, "cuGraphInstantiateWithFlags");
    RESOLVE(graph_launch, "cuGraphLaunch");
    RESOLVE(exec_destroy, "cuGraphExecDestroy");
    RESOLVE(graph_destroy, "cuGraphDestroy");
    RESOLVE(param_info, "cuFuncGetParamInfo");
    RESOLVE(alloc_managed, "cuMemAllocManaged");
    RESOLVE(advise, "cuMemAdvise");
    RESOLVE(prefetch, "cuMemPrefetchAsync");
    RESOLVE(alloc_async, "cuMemAllocAsync");
    RESOLVE(free_async, "cuMemFreeAsync");
    RESOLVE(granularity, "cuMemGetAllocationGranularity");
    RESOLVE(vmm_create, "cuMemCreate");
    RESOLVE(vmm_release, "cuMemRelease");
    RESOLVE(vmm_reserve, "cuMemAddressReserve");
    RESOLVE(vmm_free, "cuMemAddressFree");
    RESOLVE(vmm_map, "cuMemMap");
    RESOLVE(vmm_unmap, "cuMemUnmap");
    RESOLVE(vmm_access, "cuMemSetAccess");
    /* cuBLAS also dlsyms launch entry points directly. */
    PFN_cuLaunchKernelEx_v11060 launch_ex = (PFN_cuLaunchKernelEx_v11060)dlsym(
        h, per_thread ? "cuLaunchKernelEx_ptsz" : "cuLaunchKernelEx");
    CHECK(launch_ex != NULL, "dlsym cuLaunchKernelEx%s", per_thread ? "_ptsz" : "");
    if (!launch_ex)
        return 1;

    CU(d.init(0));
    CUdevice dev;
    CUcontext ctx;
    CU(d.device_get(&dev, 0));
    CU(d.ctx_retain(&ctx, dev));
    CU(d.ctx_set(ctx));

    /* Kernels: the fake's registration stands in for a fatbin. */
    CUfunction (*reg)(const char *, int, const size_t *, fakecuda_kernel_fn) =
        (CUfunction(*)(const char *, int, const size_t *, fakecuda_kernel_fn))dlsym(h, "fakecuda_kernel");
    CHECK(reg != NULL, "dlsym fakecuda_kernel (the fake driver is loaded)");
    access_fn = (long (*)(const void *, size_t, int, int))dlsym(h, "fakecuda_access");
    if (!reg)
        return 1;
    const size_t sz_axpy[] = { sizeof(struct io), sizeof(float) };
    const size_t sz_add[] = { sizeof(float *), sizeof(float *), sizeof(float), sizeof(int) };
    CUfunction f_axpy = reg("client_struct_axpy", 2, sz_axpy, k_struct_axpy);
    CUfunction f_add = reg("client_add", 4, sz_add, k_add);
    size_t off = 0, psz = 0;
    CU(d.param_info(f_axpy, 1, &off, &psz));
    CHECK(off == 24 && psz == 4, "param layout of client_struct_axpy: scale at %zu size %zu", off, psz);

    long allocs = 0, frees = 0, h2d = 0, d2h = 0, launches = 0, launches_ex = 0, graph_launches = 0;
    long managed_allocs = 0, async_allocs = 0, prefetches = 0, vmm_maps = 0, thread_allocs = 0;
    buf = calloc((size_t)nallocs, sizeof(*buf));
    host = malloc((size_t)n * sizeof(float));
    back = malloc((size_t)n * sizeof(float));
    if (!buf || !host || !back)
        return 1;
    for (int i = 0; i < n; i++)
        host[i] = (float)i;
    for (long i = 0; i < nallocs; i++) {
        CUresult r = d.mem_alloc(&buf[i], (size_t)bytes);
        CHECK(r == CUDA_SUCCESS, "cuMemAlloc #%ld (%ld bytes)", i, bytes);
        if (r != CUDA_SUCCESS)
            return 1;
        allocs++;
    }
    CU(d.htod(buf[0], host, (size_t)bytes));
    h2d++;

    CUstream s;
    CU(d.stream_create(&s, CU_STREAM_NON_BLOCKING));

    /* Plain launches: buf[1] = buf[0] + 1 each time. */
    for (long i = 0; i < nlaunch; i++) {
        float c = 1.0f;
        void *params[] = { &buf[0], &buf[1], &c, &n };
        if (i % 2 == 0) {
            CUresult r = d.launch(f_add, 1, 1, 1, 128, 1, 1, 0, s, params, NULL);
            if (r != CUDA_SUCCESS)
                CHECK(0, "cuLaunchKernel #%ld: %d", i, r);
            launches++;
        } else {
            CUlaunchConfig cfg = { .gridDimX = 2, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 64,
                                   .blockDimY = 1, .blockDimZ = 1, .hStream = s };
            CUresult r = launch_ex(&cfg, f_add, params, NULL);
            if (r != CUDA_SUCCESS)
                CHECK(0, "cuLaunchKernelEx #%ld: %d", i, r);
            launches_ex++;
        }
    }
    CU(d.stream_sync(s));
    if (nlaunch > 0) {
        CU(d.dtoh(back, buf[1], (size_t)bytes));
        d2h++;
        CHECK(back[0] == 1.0f && back[n - 1] == (float)(n - 1) + 1.0f, "kernel result y = x + 1");
    }

    /* Capture: a launch whose pointers sit inside a by-value struct. */
    memset(back, 0, (size_t)n * sizeof(float));
    CU(d.htod_async(buf[nallocs - 1], back, (size_t)bytes, s));
    h2d++;
    CU(d.begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CU(d.is_capturing(s, &st));
    CHECK(st == CU_STREAM_CAPTURE_STATUS_ACTIVE, "stream is capturing");
    struct io io = { (const float *)(uintptr_t)buf[0], (float *)(uintptr_t)buf[nallocs - 1], n, 0 };
    float scale = 2.0f;
    void *cparams[] = { &io, &scale };
    CU(d.launch(f_axpy, 1, 1, 1, 32, 1, 1, 0, s, cparams, NULL));
    launches++;
    /* Changing the struct after capture must not change the graph. */
    io.n = 0;
    CUgraph g = NULL;
    CU(d.end_capture(s, &g));
    CU(d.dtoh(back, buf[nallocs - 1], (size_t)bytes));
    d2h++;
    CHECK(back[1] == 0.0f, "captured launch did not run");
    CUgraphExec ge = NULL;
    CU(d.instantiate(&ge, g, 0));
    for (long i = 0; i < nreplay; i++) {
        CU(d.graph_launch(ge, s));
        graph_launches++;
    }
    CU(d.stream_sync(s));
    CU(d.dtoh(back, buf[nallocs - 1], (size_t)bytes));
    d2h++;
    CHECK(back[1] == 2.0f * (float)nreplay && back[n - 1] == 2.0f * (float)(n - 1) * (float)nreplay,
          "graph replayed %ld times: out[1] = %g", nreplay, (double)back[1]);
    CU(d.exec_destroy(ge));
    CU(d.graph_destroy(g));
    /* Managed memory advised and prefetched, a stream-ordered allocation,
     * and a VMM mapping, each read by a kernel. */
    {
        CUdeviceptr m = 0, a = 0;
        CUmemLocation dev0 = { CU_MEM_LOCATION_TYPE_DEVICE, 0 };
        CU(d.alloc_managed(&m, (size_t)bytes, CU_MEM_ATTACH_GLOBAL));
        managed_allocs++;
        CU(d.advise(m, (size_t)bytes, CU_MEM_ADVISE_SET_ACCESSED_BY, dev0));
        CU(d.prefetch(m, (size_t)bytes, dev0, 0, s));
        prefetches++;
        CU(d.alloc_async(&a, (size_t)bytes, s));
        async_allocs++;
        allocs += 2; /* allocs/frees count every kind but VMM */
        float c = 2.0f;
        void *p1[] = { &buf[0], &m, &c, &n };
        CU(d.launch(f_add, 1, 1, 1, 1, 1, 1, 0, s, p1, NULL));
        void *p2[] = { &m, &a, &c, &n };
        CU(d.launch(f_add, 1, 1, 1, 1, 1, 1, 0, s, p2, NULL));
        launches += 2;
        CU(d.dtoh(back, a, 16));
        d2h++;
        CHECK(back[3] == 7.0f, "managed and async memory through kernels");
        CU(d.free_async(a, s));
        CU(d.mem_free(m));
        frees += 2;

        CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                     .location = { CU_MEM_LOCATION_TYPE_DEVICE, 0 } };
        size_t gsz = 0;
        CUmemGenericAllocationHandle mh = 0;
        CUdeviceptr va = 0;
        CU(d.granularity(&gsz, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
        CU(d.vmm_create(&mh, gsz, &prop, 0));
        CU(d.vmm_reserve(&va, 2 * gsz, 0, 0, 0));
        CU(d.vmm_map(va, gsz, 0, mh, 0));
        vmm_maps++;
        CUmemAccessDesc ad = { .location = dev0, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
        CU(d.vmm_access(va, gsz, &ad, 1));
        void *p3[] = { &buf[0], &va, &c, &n };
        CU(d.launch(f_add, 1, 1, 1, 1, 1, 1, 0, per_thread ? NULL : s, p3, NULL));
        launches++;
        CU(d.dtoh(back, va, 16));
        d2h++;
        CHECK(back[3] == 5.0f, "VMM memory through a kernel");
        CU(d.vmm_unmap(va, gsz));
        CU(d.vmm_release(mh));
        CU(d.vmm_free(va, 2 * gsz));
    }
    CU(d.stream_destroy(s));

    /* Concurrent work, for race detectors and exact counts under a shim. */
    long nthreads = arg(argc, argv, "--threads", 0);
    if (nthreads > 0) {
        struct worker *w = calloc((size_t)nthreads, sizeof(*w));
        if (!w)
            return 1;
        long iters = nlaunch > 0 ? nlaunch : 1, fails = 0;
        for (long i = 0; i < nthreads; i++) {
            w[i] = (struct worker){ .ctx = ctx, .f = f_add, .iters = iters, .n = n,
                                    .per_thread_stream = per_thread };
            pthread_create(&w[i].tid, NULL, worker_main, &w[i]);
        }
        for (long i = 0; i < nthreads; i++) {
            pthread_join(w[i].tid, NULL);
            fails += w[i].fails;
        }
        CHECK(fails == 0, "%ld threads x %ld alloc/copy/launch/copy/free rounds", nthreads, iters);
        allocs += 2 * nthreads * iters;
        frees += 2 * nthreads * iters;
        h2d += nthreads * iters;
        d2h += nthreads * iters;
        launches += nthreads * iters;
        thread_allocs = 2 * nthreads * iters;
        free(w);
    }

    for (long i = 0; i < nallocs; i++) {
        CU(d.mem_free(buf[i]));
        frees++;
    }
    CU(d.ctx_release(dev));

    /* Standalone against the fake, what reached the driver must be exactly
     * what was asked for (under a shim the driver sees the shim's calls). */
    if (flag(argc, argv, "--check-driver")) {
        uint64_t (*live)(int) = (uint64_t(*)(int))dlsym(h, "fakecuda_live_bytes");
        uint64_t (*calls)(const char *) = (uint64_t(*)(const char *))dlsym(h, "fakecuda_calls");
        uint64_t (*runs)(void) = (uint64_t(*)(void))dlsym(h, "fakecuda_launches_run");
        if (!live || !calls || !runs) {
            CHECK(0, "fake driver instrumentation present");
        } else {
            CHECK(live(FAKECUDA_ANY) == 0, "nothing left allocated (%llu bytes)",
                  (unsigned long long)live(FAKECUDA_ANY));
            CHECK(calls("cuMemAlloc_v2") == (uint64_t)(nallocs + thread_allocs),
                  "driver saw %ld cuMemAlloc_v2", nallocs + thread_allocs);
            const char *lk = per_thread ? "cuLaunchKernel_ptsz" : "cuLaunchKernel";
            const char *lkx = per_thread ? "cuLaunchKernelEx_ptsz" : "cuLaunchKernelEx";
            const char *gl = per_thread ? "cuGraphLaunch_ptsz" : "cuGraphLaunch";
            CHECK(calls(lk) == (uint64_t)launches, "driver saw %ld %s", launches, lk);
            CHECK(calls(lkx) == (uint64_t)launches_ex, "driver saw %ld %s", launches_ex, lkx);
            CHECK(calls(gl) == (uint64_t)graph_launches, "driver saw %ld %s", graph_launches, gl);
            CHECK(runs() == (uint64_t)(launches - 1 + launches_ex + graph_launches),
                  "kernels run: all launches but the captured one, plus replays");
            CHECK(calls("cuGetProcAddress_v2") == (uint64_t)(2 + tried + nresolve),
                  "cuGetProcAddress_v2 calls: 1 outer + %ld + 1 unknown + %ld", tried, nresolve);
        }
    }

    printf("count resolved %ld\n", resolved);
    printf("count allocs %ld\n", allocs);
    printf("count frees %ld\n", frees);
    printf("count h2d %ld\n", h2d);
    printf("count d2h %ld\n", d2h);
    printf("count launches %ld\n", launches);
    printf("count launches_ex %ld\n", launches_ex);
    printf("count captured_launches %d\n", 1);
    printf("count graph_launches %ld\n", graph_launches);
    printf("count managed_allocs %ld\n", managed_allocs);
    printf("count async_allocs %ld\n", async_allocs);
    printf("count prefetches %ld\n", prefetches);
    printf("count vmm_maps %ld\n", vmm_maps);
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
    /* No dlclose: a CUDA runtime keeps the driver loaded for the process. */
    return failures ? 1 : 0;
}
