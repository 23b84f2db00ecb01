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
 * usage: client-static [--allocs N] [--launches N] [--replays N]
 *                      [--size BYTES] [--per-thread] */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda.h"

static int failures;

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
} d;

struct io {
    const float *in;
    float *out;
    int n;
    int pad;
};

/* out[i] += in[i] * scale for a by-value struct io and a float scale. */
static void k_struct_axpy(void **p, const uint32_t grid[3], const uint32_t block[3])
{
    struct io a = *(struct io *)p[0];
    float scale = *(float *)p[1];
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
    for (int i = 0; i < n; i++)
        y[i] = x[i] + c;
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

#define RESOLVE(field, name)                                                                       \
    do {                                                                                           \
        CUresult r_ = inner(name, (void **)&d.field, 13000, flags, NULL);                          \
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
    CUdeviceptr *buf = calloc((size_t)nallocs, sizeof(*buf));
    float *host = malloc((size_t)n * sizeof(float));
    float *back = malloc((size_t)n * sizeof(float));
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
    CU(d.stream_destroy(s));

    for (long i = 0; i < nallocs; i++) {
        CU(d.mem_free(buf[i]));
        frees++;
    }
    CU(d.ctx_release(dev));

    uint64_t (*live)(int) = (uint64_t(*)(int))dlsym(h, "fakecuda_live_bytes");
    if (live)
        CHECK(live(FAKECUDA_DEVICE) == 0, "no device memory left behind (%llu bytes)",
              (unsigned long long)live(FAKECUDA_DEVICE));

    printf("count resolved %ld\n", resolved);
    printf("count allocs %ld\n", allocs);
    printf("count frees %ld\n", frees);
    printf("count h2d %ld\n", h2d);
    printf("count d2h %ld\n", d2h);
    printf("count launches %ld\n", launches);
    printf("count launches_ex %ld\n", launches_ex);
    printf("count captured_launches %d\n", 1);
    printf("count graph_launches %ld\n", graph_launches);
    printf("count failures %d\n", failures);
    free(buf);
    free(host);
    free(back);
    dlclose(h);
    return failures ? 1 : 0;
}
