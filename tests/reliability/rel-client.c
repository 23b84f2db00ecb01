/* tests/reliability/rel-client.c: the engine stand-in of the reliability
 * suite. It reaches the fake driver the way an engine does (dlopen of
 * libcuda.so.1, dlsym of the ABI names, cuGetProcAddress_v2, and the fake
 * CUDA runtime it links), and the shim's public API through
 * dlsym(RTLD_DEFAULT) so it also runs without the shim.
 *
 * Every CUDA or API call that fails prints one line "err <label> <code>"
 * (labels are fixed, so two runs can be compared line by line) and the work
 * that depends on it is skipped; the client never stops at an error. Checks
 * of its own (data, leaks, registry) print "FAIL <what>" and make it exit 1.
 *
 * usage: rel-client MODE [options]
 *   work        alloc (scope, window, small, async, managed, VMM, runtime),
 *               tag, seal, copy, launch, capture + graph replay, free; then
 *               the fake's live bytes must be back to where they started and
 *               the shim's registry (stats "allocations.live") must count
 *               exactly the client's live allocations.
 *   threads N I N threads x I iterations of alloc/tag/copy/launch/free
 *               at once; exact counters in the stats JSON.
 *   flood T N E [B S R M]
 *               T threads launch N kernels in all, in bursts of B launches
 *               at full speed each followed by a S us pause (a decode step,
 *               then the engine's wait for its result; default 2000, 10000);
 *               one in E reads the thread's managed expert, the rest only a
 *               plain device buffer. R: the lowest launch rate (all threads,
 *               launches/s, pauses included) the run must reach (0: none).
 *               M: MiB of RSS growth allowed beyond the ring and the backlog
 *               (default 16; TSan's shadow memory needs more). No launch
 *               that touches the expert may be lost (stats: dropped_watched
 *               0, the consumer saw each one, per name), and the process
 *               may not grow by more than
 *               the ring and the consumer's bounded backlog (RSS). Run it
 *               with WOFAKE_DELAY on the prefetch calls to stall the
 *               consumer the way the real driver does.
 *   misuse      every misuse of include/woffload.h: the documented results.
 *   fork-fresh | fork-untouched | fork-nocuda | exec | exit-busy | sigterm
 *               process life-cycle cases (see lifecycle()).
 *   pin         one allocation in a host+pin tag scope under the RLIMIT_MEMLOCK
 *               the runner set: prints "pin <result>".
 * Environment: REL_COUNTS=1 (work: print the driver's call counts and the
 * stats), REL_CAPTURE_GLOBAL=1 (work: capture in global mode). */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/capability.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fakecuda.h"

/* RSS per byte the process touches: 1, and under TSan its shadow too */
#if defined(__SANITIZE_THREAD__)
#define TSAN_RSS_FACTOR 5
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TSAN_RSS_FACTOR 5
#endif
#endif
#ifndef TSAN_RSS_FACTOR
#define TSAN_RSS_FACTOR 1
#endif

#define MiB ((size_t)1 << 20)
#define KiB ((size_t)1 << 10)

static int failures;

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        printf("FAIL " __VA_ARGS__);                                                               \
        putchar('\n');                                                                             \
        failures++;                                                                                \
    } while (0)

/* Records a failed call by label; returns the result. */
static int op(const char *label, int res)
{
    if (res != 0)
        printf("err %s %d\n", label, res);
    return res;
}
#define OP(label, call) op(label, (int)(call))

/* --- the driver, as an engine resolves it --------------------------------- */

static struct {
    void *h;
    PFN_cuInit_v2000 init;
    PFN_cuDeviceGet_v2000 device_get;
    PFN_cuDevicePrimaryCtxRetain_v7000 ctx_retain;
    PFN_cuCtxSetCurrent_v4000 ctx_set;
    CUresult (*ctx_sync)(void);
    PFN_cuMemAlloc_v3020 alloc;
    PFN_cuMemFree_v3020 free;
    PFN_cuMemAllocAsync_v11020 alloc_async;
    PFN_cuMemFreeAsync_v11020 free_async;
    PFN_cuMemAllocManaged_v6000 alloc_managed;
    PFN_cuMemcpyHtoD_v3020 htod;
    PFN_cuMemcpyDtoH_v3020 dtoh; /* through cuGetProcAddress_v2 */
    PFN_cuMemcpyHtoDAsync_v3020 htod_async;
    PFN_cuMemcpyDtoD_v3020 dtod;
    PFN_cuMemcpy_v4000 memcpy_;
    PFN_cuLaunchKernel_v4000 launch;
    PFN_cuLaunchKernelEx_v11060 launch_ex;
    PFN_cuStreamCreate_v2000 stream_create;
    PFN_cuStreamDestroy_v4000 stream_destroy;
    PFN_cuStreamSynchronize_v2000 stream_sync;
    PFN_cuStreamBeginCapture_v10010 begin_capture;
    PFN_cuStreamEndCapture_v10000 end_capture;
    PFN_cuGraphInstantiateWithFlags_v11040 instantiate;
    PFN_cuGraphLaunch_v10000 graph_launch;
    PFN_cuGraphExecDestroy_v10000 exec_destroy;
    PFN_cuGraphDestroy_v10000 graph_destroy;
    PFN_cuMemAddressReserve_v10020 va_reserve;
    PFN_cuMemAddressFree_v10020 va_free;
    PFN_cuMemCreate_v10020 vmm_create;
    PFN_cuMemRelease_v10020 vmm_release;
    PFN_cuMemMap_v10020 vmm_map;
    PFN_cuMemUnmap_v10020 vmm_unmap;
    PFN_cuMemSetAccess_v10020 vmm_access;
    PFN_cuGetProcAddress_v12000 proc;
    /* fake-only */
    CUfunction (*kernel)(const char *, int, const size_t *, fakecuda_kernel_fn);
    uint64_t (*live)(int);
    size_t (*live_count)(int);
    uint64_t (*injected)(void);
    /* the shim's API (NULL without the shim) */
    int (*push)(const char *);
    int (*pop)(void);
    int (*tag)(const void *, size_t, const char *);
    int (*seal)(void);
    int (*wopen)(void);
    int (*wclose)(void);
    long (*stats)(char *, size_t);
    int (*expect)(const char *, size_t);
    int (*expect_end)(void);
} D;

static void *sym(const char *name)
{
    void *p = dlsym(D.h, name);
    if (!p) {
        printf("FAIL missing driver symbol %s\n", name);
        exit(1);
    }
    return p;
}

static int load(void)
{
    D.h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!D.h) {
        printf("FAIL dlopen libcuda.so.1: %s\n", dlerror());
        exit(1);
    }
#define S(f, name) *(void **)&D.f = sym(name)
    S(init, "cuInit");
    S(device_get, "cuDeviceGet");
    S(ctx_retain, "cuDevicePrimaryCtxRetain");
    S(ctx_set, "cuCtxSetCurrent");
    S(ctx_sync, "cuCtxSynchronize");
    S(alloc, "cuMemAlloc_v2");
    S(free, "cuMemFree_v2");
    S(alloc_async, "cuMemAllocAsync");
    S(free_async, "cuMemFreeAsync");
    S(alloc_managed, "cuMemAllocManaged");
    S(htod, "cuMemcpyHtoD_v2");
    S(htod_async, "cuMemcpyHtoDAsync_v2");
    S(dtod, "cuMemcpyDtoD_v2");
    S(memcpy_, "cuMemcpy");
    S(launch, "cuLaunchKernel");
    S(launch_ex, "cuLaunchKernelEx");
    S(stream_create, "cuStreamCreate");
    S(stream_destroy, "cuStreamDestroy_v2");
    S(stream_sync, "cuStreamSynchronize");
    S(begin_capture, "cuStreamBeginCapture_v2");
    S(end_capture, "cuStreamEndCapture");
    S(instantiate, "cuGraphInstantiateWithFlags");
    S(graph_launch, "cuGraphLaunch");
    S(exec_destroy, "cuGraphExecDestroy");
    S(graph_destroy, "cuGraphDestroy");
    S(va_reserve, "cuMemAddressReserve");
    S(va_free, "cuMemAddressFree");
    S(vmm_create, "cuMemCreate");
    S(vmm_release, "cuMemRelease");
    S(vmm_map, "cuMemMap");
    S(vmm_unmap, "cuMemUnmap");
    S(vmm_access, "cuMemSetAccess");
    S(proc, "cuGetProcAddress_v2");
    S(kernel, "fakecuda_kernel");
    S(live, "fakecuda_live_bytes");
    S(live_count, "fakecuda_live_count");
    S(injected, "fakecuda_injected");
#undef S
    *(void **)&D.push = dlsym(RTLD_DEFAULT, "woffload_tag_push");
    *(void **)&D.pop = dlsym(RTLD_DEFAULT, "woffload_tag_pop");
    *(void **)&D.tag = dlsym(RTLD_DEFAULT, "woffload_tag");
    *(void **)&D.seal = dlsym(RTLD_DEFAULT, "woffload_seal");
    *(void **)&D.wopen = dlsym(RTLD_DEFAULT, "woffload_window_open");
    *(void **)&D.wclose = dlsym(RTLD_DEFAULT, "woffload_window_close");
    *(void **)&D.stats = dlsym(RTLD_DEFAULT, "woffload_stats");
    *(void **)&D.expect = dlsym(RTLD_DEFAULT, "woffload_expect");
    *(void **)&D.expect_end = dlsym(RTLD_DEFAULT, "woffload_expect_end");
    return 0;
}

/* Without the shim the API calls are no-ops that succeed. */
static int api_push(const char *n) { return D.push ? D.push(n) : 0; }
static int api_pop(void) { return D.pop ? D.pop() : 0; }
static int api_tag(CUdeviceptr p, size_t s, const char *n) { return D.tag ? D.tag((const void *)(uintptr_t)p, s, n) : 0; }
static int api_seal(void) { return D.seal ? D.seal() : 0; }

/* --- stats ---------------------------------------------------------------- */

static char *stats_get(void)
{
    long n;
    char *b;

    if (!D.stats)
        return NULL;
    n = D.stats(NULL, 0);
    if (n < 0)
        return NULL;
    b = malloc((size_t)n + 4096);
    if (!b)
        return NULL;
    if (D.stats(b, (size_t)n + 4096) >= n + 4096) {
        free(b);
        return NULL;
    }
    return b;
}

/* The number after `key` (a unique JSON fragment such as
 * "\"allocations\":{\"live\":"), or -1. */
static long long json_num(const char *json, const char *key)
{
    const char *p = json ? strstr(json, key) : NULL;
    return p ? strtoll(p + strlen(key), NULL, 10) : -1;
}

/* --- kernels -------------------------------------------------------------- */

/* y[i] += x[i] */
static void k_axpy(void **p, const uint32_t g[3], const uint32_t b[3])
{
    float *y = *(float **)p[0];
    const float *x = *(const float **)p[1];
    int n = *(int *)p[2];
    (void)g;
    (void)b;
    for (int i = 0; i < n; i++)
        y[i] += x[i];
}
static const size_t k_axpy_sizes[3] = {8, 8, 4};

__attribute__((noinline)) static void stub_axpy(void)
{
    __asm__ volatile("");
}

static CUfunction kaxpy;

static CUresult launch_axpy(CUdeviceptr y, CUdeviceptr x, int n, CUstream s)
{
    void *params[3] = {&y, &x, &n};
    return D.launch(kaxpy, 1, 1, 1, 32, 1, 1, 0, s, params, NULL);
}

/* --- allocations the client tracks ----------------------------------------- */

enum { A_PINNED, A_SCOPE, A_WINDOW, A_SMALL, A_ASYNC, A_MANAGED, A_RT, A_N };
static const char *const a_names[A_N] = {"pinned", "scope", "window", "small", "async", "managed", "rt"};

struct buf {
    CUdeviceptr p;
    size_t size;
    int live;
};
static struct buf bufs[A_N];

static int client_live(void)
{
    int n = 0;
    for (int i = 0; i < A_N; i++)
        n += bufs[i].live;
    return n;
}

static void fill(CUdeviceptr p, size_t bytes, float v, const char *label)
{
    size_t n = bytes / sizeof(float);
    float *h = malloc(bytes);
    if (!h)
        return;
    for (size_t i = 0; i < n; i++)
        h[i] = v;
    OP(label, D.htod(p, h, bytes));
    free(h);
}

/* Frees one buffer; a failed free is retried once (the injected failure
 * fires once), as an engine that checks its errors would not, but the leak
 * check needs the memory back. */
static void release(int i, CUstream s)
{
    char label[64];
    int r;

    if (!bufs[i].live)
        return;
    snprintf(label, sizeof(label), "free.%s", a_names[i]);
    if (i == A_ASYNC)
        r = OP(label, D.free_async(bufs[i].p, s));
    else if (i == A_RT)
        r = OP(label, cudaFree((void *)(uintptr_t)bufs[i].p));
    else
        r = OP(label, D.free(bufs[i].p));
    if (r != 0) {
        snprintf(label, sizeof(label), "free2.%s", a_names[i]);
        if (i == A_ASYNC)
            r = OP(label, D.free_async(bufs[i].p, s));
        else if (i == A_RT)
            r = OP(label, cudaFree((void *)(uintptr_t)bufs[i].p));
        else
            r = OP(label, D.free(bufs[i].p));
    }
    if (i == A_ASYNC && s)
        D.stream_sync(s);
    bufs[i].live = r != 0;
}

/* The streaming executor (uvm/stream.c) gives its device staging slots
 * back once the ranges it streamed are freed; it learns of the frees on
 * the consumer thread, so a leak check waits for it (at most 2 s). */
static void wait_slots_back(void)
{
    for (int i = 0; i < 400; i++) {
        char *js = stats_get();
        const char *at = js ? strstr(js, "\"slot_bytes\":") : NULL;
        long long held = at ? json_num(js, "\"slot_bytes\":") : 0;

        free(js);
        if (held <= 0)
            return;
        usleep(5000);
    }
}

/* ... and the executor's worker frees the retired pinned copies of the
 * streamed managed ranges after the slots go, on its own thread (a flood
 * under ASan once found 7 of them, 14 MiB, still live when it looked):
 * a leak is what is still live after 2 s. */
static void wait_live_zero(void)
{
    for (int i = 0; i < 400 && D.live(FAKECUDA_ANY) != 0; i++)
        usleep(5000);
}

static void check_registry(const char *when)
{
    char *js = stats_get();
    long long live;

    /* A shim that could not start passes everything through and tracks
     * nothing: there is no registry to compare. */
    if (!js || strstr(js, "\"initialised\":false")) {
        free(js);
        return;
    }
    live = json_num(js, "\"allocations\":{\"live\":");
    printf("registry %s live=%lld client=%d\n", when, live, client_live());
    if (live != client_live())
        FAIL("registry %s: stats allocations.live %lld, the client holds %d", when, live,
             client_live());
    free(js);
}

static void extra(int pt, CUstream s);
static void extra_runtime(void);

static int work(int nlaunch)
{
    CUdevice dev;
    CUcontext ctx;
    CUstream s = NULL;
    uint64_t live0[FAKECUDA_KIND_MAX];
    int n = (int)(64 * KiB / sizeof(float));
    int ran = 0; /* launches that read x=1 into the window buffer */
    bool clean = true;

    load();
    for (int k = 0; k < FAKECUDA_KIND_MAX; k++)
        live0[k] = D.live(k);
    if (OP("cuInit", D.init(0)) || OP("cuDeviceGet", D.device_get(&dev, 0)) ||
        OP("ctxRetain", D.ctx_retain(&ctx, dev)) || OP("ctxSet", D.ctx_set(ctx)))
        goto leaks;
    kaxpy = D.kernel("rel_axpy", 3, k_axpy_sizes, k_axpy);
    if (OP("cuGetProcAddress", D.proc("cuMemcpyDtoH", (void **)&D.dtoh, 12000, 0, NULL)))
        D.dtoh = NULL;
    if (OP("streamCreate", D.stream_create(&s, CU_STREAM_NON_BLOCKING)))
        s = NULL;

    /* Names before their bytes, as the Python hook announces a meta-device
     * model: the window's two experts (2 MiB each, never matched to its one
     * 4 MiB allocation), then the end of the announcements, which plans
     * them by the policy (a policy that did not load: nothing to plan) */
    if (D.expect && D.expect_end) {
        OP("expect.w2", D.expect("model.layers.1.mlp.experts.w2", 2 * MiB));
        OP("expect.w3", D.expect("model.layers.1.mlp.experts.w3", 2 * MiB));
        OP("expect_end", D.expect_end());
    }

    /* Allocations of every route. */
    bufs[A_PINNED].size = 2 * MiB;
    OP("push.pinned", api_push("model.layers.0.pinned.w1"));
    bufs[A_PINNED].live = !OP("alloc.pinned", D.alloc(&bufs[A_PINNED].p, 2 * MiB));
    OP("pop.pinned", api_pop());
    bufs[A_SCOPE].size = 1 * MiB;
    OP("push.scope", api_push("model.layers.0.attn.q_proj"));
    bufs[A_SCOPE].live = !OP("alloc.scope", D.alloc(&bufs[A_SCOPE].p, 1 * MiB));
    OP("pop.scope", api_pop());
    bufs[A_WINDOW].size = 4 * MiB;
    bufs[A_WINDOW].live = !OP("alloc.window", D.alloc(&bufs[A_WINDOW].p, 4 * MiB));
    bufs[A_SMALL].size = 64 * KiB;
    bufs[A_SMALL].live = !OP("alloc.small", D.alloc(&bufs[A_SMALL].p, 64 * KiB));
    bufs[A_ASYNC].size = 64 * KiB;
    if (s)
        bufs[A_ASYNC].live = !OP("alloc.async", D.alloc_async(&bufs[A_ASYNC].p, 64 * KiB, s));
    bufs[A_MANAGED].size = 1 * MiB;
    bufs[A_MANAGED].live = !OP("alloc.managed", D.alloc_managed(&bufs[A_MANAGED].p, 1 * MiB,
                                                                 CU_MEM_ATTACH_GLOBAL));
    bufs[A_RT].size = 256 * KiB;
    {
        void *p = NULL;
        bufs[A_RT].live = !OP("alloc.rt", cudaMalloc(&p, 256 * KiB));
        bufs[A_RT].p = (CUdeviceptr)(uintptr_t)p;
    }

    /* Names. */
    if (bufs[A_WINDOW].live) {
        OP("tag.w2", api_tag(bufs[A_WINDOW].p, 2 * MiB, "model.layers.1.mlp.experts.w2"));
        OP("tag.w3", api_tag(bufs[A_WINDOW].p + 2 * MiB, 2 * MiB, "model.layers.1.mlp.experts.w3"));
    }
    if (bufs[A_SMALL].live)
        OP("tag.small", api_tag(bufs[A_SMALL].p, 4 * KiB, "model.norm.weight"));
    check_registry("loaded");
    OP("seal", api_seal());

    /* Copies. */
    if (bufs[A_WINDOW].live)
        fill(bufs[A_WINDOW].p, 64 * KiB, 2.0f, "htod.window");
    if (bufs[A_SMALL].live)
        fill(bufs[A_SMALL].p, 64 * KiB, 1.0f, "htod.small");
    if (bufs[A_SCOPE].live && bufs[A_SMALL].live)
        OP("dtod.scope", D.dtod(bufs[A_SCOPE].p, bufs[A_SMALL].p, 64 * KiB));
    if (bufs[A_PINNED].live && bufs[A_SMALL].live)
        OP("memcpy.pinned", D.memcpy_(bufs[A_PINNED].p, bufs[A_SMALL].p, 64 * KiB));
    if (bufs[A_ASYNC].live && s) {
        static float h[16];
        OP("htodAsync", D.htod_async(bufs[A_ASYNC].p, h, sizeof(h), s));
        OP("streamSync.1", D.stream_sync(s));
    }
    if (bufs[A_MANAGED].live && bufs[A_SMALL].live)
        OP("dtod.managed", D.dtod(bufs[A_MANAGED].p, bufs[A_SMALL].p, 64 * KiB));

    /* Launches: window += small, nlaunch times, over both launch APIs. */
    for (int i = 0; i < nlaunch && bufs[A_WINDOW].live && bufs[A_SMALL].live; i++) {
        char label[32];
        snprintf(label, sizeof(label), "launch.%d", i);
        if (i % 4 == 3) {
            CUlaunchConfig cfg = {.gridDimX = 1, .gridDimY = 1, .gridDimZ = 1,
                                  .blockDimX = 32, .blockDimY = 1, .blockDimZ = 1};
            CUdeviceptr y = bufs[A_WINDOW].p, x = bufs[A_SMALL].p;
            void *params[3] = {&y, &x, &n};
            if (!OP(label, D.launch_ex(&cfg, kaxpy, params, NULL)))
                ran++;
        } else if (!OP(label, launch_axpy(bufs[A_WINDOW].p, bufs[A_SMALL].p, n, NULL))) {
            ran++;
        }
    }
    /* Also read the scope and pinned buffers (launch attribution). */
    if (bufs[A_SCOPE].live && bufs[A_PINNED].live)
        OP("launch.pinned", launch_axpy(bufs[A_SCOPE].p, bufs[A_PINNED].p, n, NULL));
    OP("ctxSync", D.ctx_sync());

    /* Capture and replay: each replay adds small to window once more. */
    if (s && bufs[A_WINDOW].live && bufs[A_SMALL].live) {
        CUgraph g = NULL;
        CUgraphExec e = NULL;
        /* Thread-local mode; REL_CAPTURE_GLOBAL=1: global mode, which the
         * shim's prefetch thread must not invalidate (test
         * reliability-global-capture-with-prefetch). */
        if (!OP("beginCapture", D.begin_capture(s, getenv("REL_CAPTURE_GLOBAL")
                                                       ? CU_STREAM_CAPTURE_MODE_GLOBAL
                                                       : CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))) {
            OP("launch.captured", launch_axpy(bufs[A_WINDOW].p, bufs[A_SMALL].p, n, s));
            if (OP("endCapture", D.end_capture(s, &g))) {
                /* The injected failure fires once: end the capture for
                 * real, so the stream leaves capture mode, and drop it. */
                g = NULL;
                if (!OP("endCapture2", D.end_capture(s, &g)) && g &&
                    OP("graphDestroy0", D.graph_destroy(g)))
                    OP("graphDestroy0b", D.graph_destroy(g));
                g = NULL;
            }
        }
        if (g && OP("instantiate", D.instantiate(&e, g, 0)))
            e = NULL;
        for (int i = 0; e && i < 2; i++) {
            char label[32];
            snprintf(label, sizeof(label), "graphLaunch.%d", i);
            if (!OP(label, D.graph_launch(e, s)))
                ran++;
        }
        if (e) {
            OP("streamSync.2", D.stream_sync(s));
            if (OP("execDestroy", D.exec_destroy(e)))
                OP("execDestroy2", D.exec_destroy(e));
        }
        if (g && OP("graphDestroy", D.graph_destroy(g)))
            OP("graphDestroy2", D.graph_destroy(g));
    }

    /* The runtime path: rt = small, launched through a host stub. */
    if (bufs[A_RT].live && bufs[A_SMALL].live) {
        OP("rt.memcpy", cudaMemcpy((void *)(uintptr_t)bufs[A_RT].p,
                                   (const void *)(uintptr_t)bufs[A_SMALL].p, 64 * KiB,
                                   cudaMemcpyDeviceToDevice));
        if (fakecudart_register((const void *)stub_axpy, kaxpy) == 0) {
            void *y = (void *)(uintptr_t)bufs[A_RT].p, *x = (void *)(uintptr_t)bufs[A_SMALL].p;
            void *args[3] = {&y, &x, &n};
            OP("rt.launch", cudaLaunchKernel((const void *)stub_axpy, (dim3){1, 1, 1},
                                             (dim3){32, 1, 1}, args, 0, NULL));
            OP("rt.sync", cudaDeviceSynchronize());
        }
    }

    extra(0, s);
    extra(1, s);
    extra_runtime();

    /* VMM (PyTorch's expandable segments): reserve, create, map, unmap. */
    {
        CUdeviceptr va = 0;
        CUmemGenericAllocationHandle hd = 0;
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
        CUmemAccessDesc acc = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        if (!OP("vmm.reserve", D.va_reserve(&va, 2 * MiB, 0, 0, 0))) {
            if (!OP("vmm.create", D.vmm_create(&hd, 2 * MiB, &prop, 0))) {
                if (!OP("vmm.map", D.vmm_map(va, 2 * MiB, 0, hd, 0))) {
                    OP("vmm.access", D.vmm_access(va, 2 * MiB, &acc, 1));
                    if (OP("vmm.unmap", D.vmm_unmap(va, 2 * MiB)))
                        OP("vmm.unmap2", D.vmm_unmap(va, 2 * MiB));
                }
                if (OP("vmm.release", D.vmm_release(hd)))
                    OP("vmm.release2", D.vmm_release(hd));
            }
            if (OP("vmm.free", D.va_free(va, 2 * MiB)))
                OP("vmm.free2", D.va_free(va, 2 * MiB));
        }
    }

    /* Data: every launch that ran added 1.0 to 2.0. Only checked when the
     * whole chain succeeded (an injected failure legitimately skips work). */
    if (bufs[A_WINDOW].live && D.dtoh) {
        float *h = malloc(64 * KiB);
        if (h && !OP("dtoh.window", D.dtoh(h, bufs[A_WINDOW].p, 64 * KiB))) {
            printf("data window=%g launches=%d\n", (double)h[n - 1], ran);
            if (D.injected() == 0 && (h[0] != 2.0f + (float)ran || h[n - 1] != 2.0f + (float)ran))
                FAIL("data: window holds %g/%g, expected %g", (double)h[0], (double)h[n - 1],
                     2.0 + ran);
        }
        free(h);
    }
    check_registry("used");
    {
        char *js = stats_get();
        if (js)
            printf("policy loaded=%s served=%lld\n",
                   strstr(js, "\"loaded\":true") ? "true" : "false",
                   json_num(js, "\"served_managed\":") + json_num(js, "\"served_pinned\":"));
        free(js);
    }

    for (int i = 0; i < A_N; i++)
        release(i, s);
    if (s && OP("streamDestroy", D.stream_destroy(s)))
        OP("streamDestroy2", D.stream_destroy(s));
    check_registry("freed");

    wait_slots_back();

leaks:
    /* Everything the client allocated is back (the shim's own memory
     * included: it holds none once the engine freed its allocations). */
    for (int k = 1; k < FAKECUDA_KIND_MAX; k++) {
        if (k == FAKECUDA_REGISTERED)
            continue;
        if (D.live(k) != live0[k]) {
            FAIL("leak: %" PRIu64 " live bytes of fake kind %d (start %" PRIu64 ")", D.live(k), k,
                 live0[k]);
            clean = false;
        }
    }
    printf("injected %" PRIu64 "\n", D.injected());
    if (getenv("REL_COUNTS")) {
        /* Calls of every driver function (the fault test's discovery run). */
        const char *const *(*fns)(void) = (const char *const *(*)(void))sym("fakecuda_functions");
        uint64_t (*calls)(const char *) = (uint64_t(*)(const char *))sym("fakecuda_calls");
        char *js = stats_get();
        for (const char *const *f = fns(); *f; f++)
            if (calls(*f))
                printf("calls %s %" PRIu64 "\n", *f, calls(*f));
        if (js)
            printf("stats %s\n", js);
        free(js);
    }
    printf("done %s\n", clean ? "clean" : "leaky");
    return failures ? 1 : 0;
}

/* --- the other entry points ---------------------------------------------------
 * Every other copy, launch and capture entry point the shim wraps, resolved
 * the way static runtimes resolve them: through cuGetProcAddress_v2 with
 * flags 0 (legacy stream) or CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
 * (the _ptsz/_ptds variants), and the runtime API's stream, capture, graph
 * and entry-point calls. Own buffers, freed before it returns. */

typedef CUresult (*pfn_generic)(void);
static void *resolve(const char *name, int ver, int pt, const char *label)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    if (OP(label, D.proc(name, &p, ver, pt ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0, &st)))
        return NULL;
    return p;
}

static void extra(int pt, CUstream s)
{
    const char *px = pt ? "pt." : "lg.";
    char l[64];
#define L(x) (snprintf(l, sizeof(l), "%s%s", px, x), l)
    PFN_cuMemAllocAsync_v11020 alloc_async = resolve("cuMemAllocAsync", 11020, pt, L("proc.allocAsync"));
    PFN_cuMemFreeAsync_v11020 free_async = resolve("cuMemFreeAsync", 11020, pt, L("proc.freeAsync"));
    PFN_cuMemcpyHtoD_v3020 htod = resolve("cuMemcpyHtoD", 3020, pt, L("proc.htod"));
    PFN_cuMemcpyDtoH_v3020 dtoh = resolve("cuMemcpyDtoH", 3020, pt, L("proc.dtoh"));
    PFN_cuMemcpyDtoD_v3020 dtod = resolve("cuMemcpyDtoD", 3020, pt, L("proc.dtod"));
    PFN_cuMemcpy_v4000 cpy = resolve("cuMemcpy", 4000, pt, L("proc.memcpy"));
    PFN_cuMemcpyAsync_v4000 cpy_async = resolve("cuMemcpyAsync", 4000, pt, L("proc.memcpyAsync"));
    PFN_cuMemcpyHtoDAsync_v3020 htod_a = resolve("cuMemcpyHtoDAsync", 3020, pt, L("proc.htodAsync"));
    PFN_cuMemcpyDtoHAsync_v3020 dtoh_a = resolve("cuMemcpyDtoHAsync", 3020, pt, L("proc.dtohAsync"));
    PFN_cuMemcpyDtoDAsync_v3020 dtod_a = resolve("cuMemcpyDtoDAsync", 3020, pt, L("proc.dtodAsync"));
    PFN_cuMemcpy2D_v3020 c2d = resolve("cuMemcpy2D", 3020, pt, L("proc.2d"));
    PFN_cuMemcpy2DUnaligned_v3020 c2du = resolve("cuMemcpy2DUnaligned", 3020, pt, L("proc.2du"));
    PFN_cuMemcpy2DAsync_v3020 c2da = resolve("cuMemcpy2DAsync", 3020, pt, L("proc.2dAsync"));
    PFN_cuMemcpy3D_v3020 c3d = resolve("cuMemcpy3D", 3020, pt, L("proc.3d"));
    PFN_cuMemcpy3DAsync_v3020 c3da = resolve("cuMemcpy3DAsync", 3020, pt, L("proc.3dAsync"));
    PFN_cuLaunchKernel_v4000 launch = resolve("cuLaunchKernel", 4000, pt, L("proc.launch"));
    PFN_cuLaunchKernelEx_v11060 launch_ex = resolve("cuLaunchKernelEx", 11060, pt, L("proc.launchEx"));
    PFN_cuStreamBeginCapture_v10010 begin = resolve("cuStreamBeginCapture", 10010, pt, L("proc.begin"));
    PFN_cuStreamEndCapture_v10000 end = resolve("cuStreamEndCapture", 10000, pt, L("proc.end"));
    PFN_cuGraphLaunch_v10000 glaunch = resolve("cuGraphLaunch", 10000, pt, L("proc.graphLaunch"));
    /* not "cuGraphInstantiate": that name is the 5-argument _v2 at every
     * version (preload/real.h, WO_DRIVER_PROCS) */
    PFN_cuGraphInstantiateWithFlags_v11040 inst = resolve("cuGraphInstantiateWithFlags", 11040, pt, L("proc.inst"));
    CUdeviceptr a = 0, b = 0;
    int n = 1024, ha = 0, hb = 0;
    static float h[1024];

    if (!alloc_async || !free_async || !s)
        return;
    ha = !OP(L("allocAsync.a"), alloc_async(&a, 4 * KiB, s));
    hb = !OP(L("allocAsync.b"), alloc_async(&b, 4 * KiB, s));
    if (ha && hb) {
        CUDA_MEMCPY2D m2 = {.srcMemoryType = CU_MEMORYTYPE_DEVICE, .srcDevice = a, .srcPitch = 256,
                            .dstMemoryType = CU_MEMORYTYPE_DEVICE, .dstDevice = b, .dstPitch = 256,
                            .WidthInBytes = 256, .Height = 4};
        CUDA_MEMCPY3D m3 = {.srcMemoryType = CU_MEMORYTYPE_DEVICE, .srcDevice = a, .srcPitch = 256,
                            .srcHeight = 4, .dstMemoryType = CU_MEMORYTYPE_DEVICE, .dstDevice = b,
                            .dstPitch = 256, .dstHeight = 4, .WidthInBytes = 256, .Height = 4,
                            .Depth = 1};
        if (htod)
            OP(L("htod"), htod(a, h, 4 * KiB));
        if (htod_a)
            OP(L("htodAsync"), htod_a(a, h, 4 * KiB, s));
        if (dtod)
            OP(L("dtod"), dtod(b, a, 4 * KiB));
        if (cpy)
            OP(L("memcpy"), cpy(b, a, 4 * KiB));
        if (cpy_async)
            OP(L("memcpyAsync"), cpy_async(b, a, 4 * KiB, s));
        if (dtod_a)
            OP(L("dtodAsync"), dtod_a(b, a, 4 * KiB, s));
        if (c2d)
            OP(L("2d"), c2d(&m2));
        if (c2du)
            OP(L("2du"), c2du(&m2));
        if (c2da)
            OP(L("2dAsync"), c2da(&m2, s));
        if (c3d)
            OP(L("3d"), c3d(&m3));
        if (c3da)
            OP(L("3dAsync"), c3da(&m3, s));
        if (launch) {
            void *params[3] = {&b, &a, &n};
            OP(L("launch"), launch(kaxpy, 1, 1, 1, 32, 1, 1, 0, s, params, NULL));
        }
        if (launch_ex) {
            CUlaunchConfig cfg = {.gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 32,
                                  .blockDimY = 1, .blockDimZ = 1, .hStream = s};
            void *params[3] = {&b, &a, &n};
            OP(L("launchEx"), launch_ex(&cfg, kaxpy, params, NULL));
        }
        if (begin && end && launch && inst && glaunch &&
            !OP(L("beginCapture"), begin(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))) {
            CUgraph g = NULL;
            CUgraphExec e = NULL;
            void *params[3] = {&b, &a, &n};
            OP(L("launch.captured"), launch(kaxpy, 1, 1, 1, 32, 1, 1, 0, s, params, NULL));
            if (OP(L("endCapture"), end(s, &g))) {
                g = NULL;
                if (!OP(L("endCapture2"), end(s, &g)) && g)
                    D.graph_destroy(g);
                g = NULL;
            }
            if (g && !OP(L("instantiate"), inst(&e, g, 0))) {
                OP(L("graphLaunch"), glaunch(e, s));
                OP(L("streamSync"), D.stream_sync(s));
                if (OP(L("execDestroy"), D.exec_destroy(e)))
                    OP(L("execDestroy2"), D.exec_destroy(e));
            }
            if (g && OP(L("graphDestroy"), D.graph_destroy(g)))
                OP(L("graphDestroy2"), D.graph_destroy(g));
        }
        if (dtoh_a)
            OP(L("dtohAsync"), dtoh_a(h, b, 4 * KiB, s));
        if (dtoh)
            OP(L("dtoh"), dtoh(h, b, 4 * KiB));
    }
    if (ha && OP(L("freeAsync.a"), free_async(a, s)))
        OP(L("freeAsync2.a"), free_async(a, s));
    if (hb && OP(L("freeAsync.b"), free_async(b, s)))
        OP(L("freeAsync2.b"), free_async(b, s));
    OP(L("streamSync.end"), D.stream_sync(s));
#undef L
}

/* The runtime API's other entry points (rel-client-ptsz: their _ptsz/_ptds
 * variants, as nvcc --default-stream per-thread builds call them). */
static void extra_runtime(void)
{
    cudaStream_t s = NULL;
    void *a = NULL, *b = NULL, *m = NULL;
    int ha, hb, hm;
    static char h[4096];

    if (OP("rt.streamCreate", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)))
        return;
    ha = !OP("rt.mallocAsync", cudaMallocAsync(&a, 4 * KiB, s));
    hb = !OP("rt.malloc", cudaMalloc(&b, 4 * KiB));
    hm = !OP("rt.mallocManaged", cudaMallocManaged(&m, 4 * KiB, cudaMemAttachGlobal));
    if (ha && hb) {
        struct cudaMemcpy3DParms p3 = {0};
        p3.srcPtr = (struct cudaPitchedPtr){.ptr = a, .pitch = 256, .xsize = 256, .ysize = 4};
        p3.dstPtr = (struct cudaPitchedPtr){.ptr = b, .pitch = 256, .xsize = 256, .ysize = 4};
        p3.extent = (struct cudaExtent){.width = 256, .height = 4, .depth = 1};
        p3.kind = cudaMemcpyDeviceToDevice;
        OP("rt.memcpyAsync", cudaMemcpyAsync(a, h, sizeof(h), cudaMemcpyHostToDevice, s));
        OP("rt.memcpy2D", cudaMemcpy2D(b, 256, a, 256, 256, 4, cudaMemcpyDeviceToDevice));
        OP("rt.memcpy2DAsync", cudaMemcpy2DAsync(b, 256, a, 256, 256, 4, cudaMemcpyDeviceToDevice, s));
        OP("rt.memcpy3D", cudaMemcpy3D(&p3));
        OP("rt.memcpy3DAsync", cudaMemcpy3DAsync(&p3, s));
        if (hm)
            OP("rt.memcpy.managed", cudaMemcpy(m, b, 4 * KiB, cudaMemcpyDeviceToDevice));
        if (fakecudart_register((const void *)stub_axpy, kaxpy) == 0 &&
            !OP("rt.beginCapture", cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal))) {
            cudaGraph_t g = NULL;
            cudaGraphExec_t e = NULL;
            int n = 1024;
            void *args[3] = {&b, &a, &n};
            OP("rt.launch.captured", cudaLaunchKernel((const void *)stub_axpy, (dim3){1, 1, 1},
                                                      (dim3){32, 1, 1}, args, 0, s));
            if (OP("rt.endCapture", cudaStreamEndCapture(s, &g))) {
                g = NULL;
                if (!OP("rt.endCapture2", cudaStreamEndCapture(s, &g)) && g)
                    cudaGraphDestroy(g);
                g = NULL;
            }
            if (g && !OP("rt.instantiate", cudaGraphInstantiate(&e, g, 0))) {
                OP("rt.graphLaunch", cudaGraphLaunch(e, s));
                OP("rt.streamSync", cudaStreamSynchronize(s));
                if (OP("rt.execDestroy", cudaGraphExecDestroy(e)))
                    OP("rt.execDestroy2", cudaGraphExecDestroy(e));
            }
            if (g && OP("rt.graphDestroy", cudaGraphDestroy(g)))
                OP("rt.graphDestroy2", cudaGraphDestroy(g));
        }
    }
    {
        void *fn = NULL;
        enum cudaDriverEntryPointQueryResult q;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
        OP("rt.entryPoint", cudaGetDriverEntryPoint("cuMemAlloc", &fn, cudaEnableDefault, &q));
#pragma GCC diagnostic pop
        OP("rt.entryPointByVersion",
           cudaGetDriverEntryPointByVersion("cuMemFree", &fn, 12000, cudaEnableDefault, &q));
    }
    if (ha && OP("rt.freeAsync", cudaFreeAsync(a, s)))
        OP("rt.freeAsync2", cudaFreeAsync(a, s));
    if (hb && OP("rt.free", cudaFree(b)))
        OP("rt.free2", cudaFree(b));
    if (hm && OP("rt.free.managed", cudaFree(m)))
        OP("rt.free2.managed", cudaFree(m));
    OP("rt.streamSync.end", cudaStreamSynchronize(s));
    if (OP("rt.streamDestroy", cudaStreamDestroy(s)))
        OP("rt.streamDestroy2", cudaStreamDestroy(s));
}

/* --- threads --------------------------------------------------------------- */

struct thr {
    int id, iters;
    pthread_barrier_t *bar;
    CUcontext ctx;
    long allocs, frees, copies, launches, hits_named;
    int errors;
};

static void *thr_main(void *arg)
{
    struct thr *t = arg;
    char name[64];
    CUdeviceptr keep = 0, a, b;
    size_t nb = 64 * KiB;
    int n = (int)(nb / sizeof(float));
    float *h = malloc(nb);

    if (!h || D.ctx_set(t->ctx)) {
        t->errors++;
        free(h);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        h[i] = 1.0f;
    /* Phase 1: a long-lived named allocation per thread (tag scope). */
    snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.w13", t->id);
    if (api_push(name) || D.alloc(&keep, 2 * MiB) || api_pop())
        t->errors++;
    t->allocs++;
    if (D.htod(keep, h, nb))
        t->errors++;
    t->copies++;
    pthread_barrier_wait(t->bar); /* main seals */
    pthread_barrier_wait(t->bar);
    /* Phase 2: short-lived allocations, tags, copies, launches, frees. */
    for (int it = 0; it < t->iters; it++) {
        void *params[3] = {&keep, &a, &n};
        snprintf(name, sizeof(name), "tmp.%d.%d", t->id, it);
        if (D.alloc(&a, nb)) {
            t->errors++;
            continue;
        }
        t->allocs++;
        if (api_tag(a, nb, name))
            t->errors++;
        if (D.htod(a, h, nb))
            t->errors++;
        t->copies++;
        params[1] = &a;
        if (D.launch(kaxpy, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL))
            t->errors++;
        t->launches++;
        if (D.alloc(&b, nb)) {
            t->errors++;
        } else {
            t->allocs++;
            if (D.dtod(b, a, nb))
                t->errors++;
            t->copies++;
            if (D.free(b))
                t->errors++;
            t->frees++;
        }
        if (D.free(a))
            t->errors++;
        t->frees++;
    }
    if (D.ctx_sync())
        t->errors++;
    /* keep += 1.0 per launch */
    if (D.dtoh(h, keep, nb))
        t->errors++;
    t->copies++;
    if (h[0] != 1.0f + (float)t->iters || h[n - 1] != 1.0f + (float)t->iters)
        t->errors++;
    pthread_barrier_wait(t->bar); /* main checks the stats */
    pthread_barrier_wait(t->bar);
    if (D.free(keep))
        t->errors++;
    t->frees++;
    free(h);
    return NULL;
}

static int threads(int nthr, int iters)
{
    CUdevice dev;
    CUcontext ctx;
    pthread_t tid[64];
    struct thr t[64];
    pthread_barrier_t bar;
    long allocs = 0, frees = 0, copies = 0, launches = 0;
    char *js = NULL;

    if (nthr < 1 || nthr > 64)
        return 2;
    load();
    if (!D.stats) {
        printf("FAIL threads mode needs the shim\n");
        return 1;
    }
    if (D.init(0) || D.device_get(&dev, 0) || D.ctx_retain(&ctx, dev) || D.ctx_set(ctx) ||
        !D.proc || D.proc("cuMemcpyDtoH", (void **)&D.dtoh, 12000, 0, NULL)) {
        printf("FAIL init\n");
        return 1;
    }
    kaxpy = D.kernel("rel_axpy", 3, k_axpy_sizes, k_axpy);
    pthread_barrier_init(&bar, NULL, (unsigned)nthr + 1);
    for (int i = 0; i < nthr; i++) {
        t[i] = (struct thr){.id = i, .iters = iters, .bar = &bar, .ctx = ctx};
        pthread_create(&tid[i], NULL, thr_main, &t[i]);
    }
    pthread_barrier_wait(&bar);
    if (api_seal())
        FAIL("seal");
    pthread_barrier_wait(&bar);
    pthread_barrier_wait(&bar);
    for (int i = 0; i < nthr; i++) {
        allocs += t[i].allocs;
        frees += t[i].frees;
        copies += t[i].copies;
        launches += t[i].launches;
        if (t[i].errors)
            FAIL("thread %d: %d errors", i, t[i].errors);
    }
    /* The consumer thread attributes launches asynchronously: wait (bounded)
     * until it has seen them all, then every count must be exact. */
    for (int i = 0; i < 5000; i++) {
        free(js);
        js = stats_get();
        if (json_num(js, "\"launches\":{\"seen\":") >= launches)
            break;
        usleep(2000);
    }
    {
        struct {
            const char *key;
            long long want;
        } want[] = {
            {"\"alloc_calls\":", allocs},
            {"\"free_calls\":", frees},
            {"\"copy_calls\":", copies},
            {"\"launch_calls\":", launches},
            {"\"launch_with_hits\":", launches},
            {"\"events_dropped\":", 0},
            {"\"launches\":{\"seen\":", launches},
            {"\"allocations\":{\"live\":", nthr},
            {"\"served_managed\":", nthr},
        };
        for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
            long long got = json_num(js, want[i].key);
            printf("count %s %lld (issued %lld)\n", want[i].key, got, want[i].want);
            if (got != want[i].want)
                FAIL("count %s: %lld, issued %lld", want[i].key, got, want[i].want);
        }
        /* Each thread's named allocation: exactly `iters` launches. */
        for (int i = 0; i < nthr; i++) {
            char key[128];
            const char *p;
            snprintf(key, sizeof(key), "{\"name\":\"model.layers.%d.mlp.experts.w13\"", i);
            p = js ? strstr(js, key) : NULL;
            if (!p || json_num(p, "\"launches\":") != iters)
                FAIL("name %s: launches %lld, issued %d", key, p ? json_num(p, "\"launches\":") : -1,
                     iters);
        }
    }
    free(js);
    pthread_barrier_wait(&bar);
    for (int i = 0; i < nthr; i++)
        pthread_join(tid[i], NULL);
    pthread_barrier_destroy(&bar);
    wait_slots_back();
    wait_live_zero();
    if (D.live(FAKECUDA_ANY) != 0)
        FAIL("leak: %" PRIu64 " live bytes", D.live(FAKECUDA_ANY));
    js = stats_get();
    if (json_num(js, "\"allocations\":{\"live\":") != 0)
        FAIL("registry: %lld live after every free", json_num(js, "\"allocations\":{\"live\":"));
    free(js);
    printf("threads %d iterations %d: allocs %ld frees %ld copies %ld launches %ld\n", nthr, iters,
           allocs, frees, copies, launches);
    return failures ? 1 : 0;
}

/* --- flood ---------------------------------------------------------------- */

struct fthr {
    int id, every;
    long n, watched, burst, pause_us;
    pthread_barrier_t *bar;
    CUcontext ctx;
    CUdeviceptr expert, plain;
    int errors;
};

static void k_touch(void **p, const uint32_t g[3], const uint32_t b[3])
{
    (void)p;
    (void)g;
    (void)b;
}

static const size_t k_touch_sizes[3] = {8, 8, 4};
static CUfunction ktouch;

static long rss_kib(void)
{
    char line[256];
    long v = -1;
    FILE *f = fopen("/proc/self/status", "r");

    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, "VmRSS:", 6) == 0)
            v = strtol(line + 6, NULL, 10);
    fclose(f);
    return v;
}

static void *flood_main(void *arg)
{
    struct fthr *t = arg;
    char name[64];
    int n = 16;

    if (D.ctx_set(t->ctx)) {
        t->errors++;
        return NULL;
    }
    /* placed: `experts` is managed in managed.yaml; plain: outside any scope */
    snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.w13", t->id);
    if (api_push(name) || D.alloc(&t->expert, 2 * MiB) || api_pop())
        t->errors++;
    if (D.alloc(&t->plain, 64 * KiB))
        t->errors++;
    pthread_barrier_wait(t->bar); /* main seals */
    pthread_barrier_wait(t->bar);
    for (long i = 0; i < t->n; i++) {
        bool hit = i % t->every == 0;
        void *params[3] = {hit ? &t->expert : &t->plain, &t->plain, &n};
        if (D.launch(ktouch, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL))
            t->errors++;
        t->watched += hit;
        if (t->pause_us && (i + 1) % t->burst == 0)
            usleep((useconds_t)t->pause_us);
    }
    pthread_barrier_wait(t->bar); /* main checks */
    pthread_barrier_wait(t->bar);
    if (D.free(t->expert) || D.free(t->plain))
        t->errors++;
    return NULL;
}

static int flood(int nthr, long total, int every, long burst, long pause_us, long min_rate,
                 long slack_mib)
{
    CUdevice dev;
    CUcontext ctx;
    pthread_t tid[64];
    struct fthr t[64];
    pthread_barrier_t bar;
    long watched = 0, rss0, rss1;
    long long cap, backlog_limit, pinned, dev0, dev1, held, staged, populated;
    struct timespec t0, t1;
    double secs;
    char *js = NULL;

    if (nthr < 1 || nthr > 64 || total < nthr || every < 1 || burst < 1 || pause_us < 0)
        return 2;
    load();
    if (!D.stats) {
        printf("FAIL flood mode needs the shim\n");
        return 1;
    }
    if (D.init(0) || D.device_get(&dev, 0) || D.ctx_retain(&ctx, dev) || D.ctx_set(ctx)) {
        printf("FAIL init\n");
        return 1;
    }
    ktouch = D.kernel("rel_touch", 3, k_touch_sizes, k_touch);
    pthread_barrier_init(&bar, NULL, (unsigned)nthr + 1);
    for (int i = 0; i < nthr; i++) {
        t[i] = (struct fthr){.id = i,
                             .every = every,
                             .bar = &bar,
                             .ctx = ctx,
                             .n = total / nthr + (i < total % nthr),
                             .burst = burst,
                             .pause_us = pause_us};
        pthread_create(&tid[i], NULL, flood_main, &t[i]);
    }
    pthread_barrier_wait(&bar);
    if (api_seal())
        FAIL("seal");
    rss0 = rss_kib();
    dev0 = (long long)(D.live(FAKECUDA_DEVICE) + D.live(FAKECUDA_ASYNC));
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_barrier_wait(&bar);
    pthread_barrier_wait(&bar);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    for (int i = 0; i < nthr; i++) {
        watched += t[i].watched;
        if (t[i].errors)
            FAIL("thread %d: %d errors", i, t[i].errors);
    }
    /* The consumer attributes asynchronously: wait (bounded) until it has
     * seen every launch that touched an expert, or given up on some. */
    for (int i = 0; i < 10000; i++) {
        free(js);
        js = stats_get();
        if (json_num(js, "\"launches\":{\"seen\":") + json_num(js, "\"dropped_watched\":") >=
            watched)
            break;
        usleep(2000);
    }
    rss1 = rss_kib();
    dev1 = (long long)(D.live(FAKECUDA_DEVICE) + D.live(FAKECUDA_ASYNC));
    pinned = json_num(js ? strstr(js, "\"pinned_copies\":") : NULL, "\"bytes\":");
    cap = json_num(js, "\"ring\":{\"capacity\":");
    backlog_limit = json_num(js, "\"backlog\":{\"now\":") >= 0
                        ? json_num(strstr(js, "\"backlog\":"), "\"limit\":")
                        : -1;
    printf("flood %d threads: %ld launches in %.2f s (%.0f/s), %ld touch an expert\n", nthr, total,
           secs, (double)total / secs, watched);
    printf("ring capacity %lld pushed %lld dropped %lld (watched %lld, unwatched %lld, other %lld) "
           "skipped %lld backlog peak %lld limit %lld; rss %+ld KiB\n",
           cap, json_num(js, "\"ring\":{\"capacity\":") >= 0 ? json_num(js, "\"pushed\":") : -1,
           json_num(js, "\"dropped\":"), json_num(js, "\"dropped_watched\":"),
           json_num(js, "\"dropped_unwatched\":"), json_num(js, "\"dropped_other\":"),
           json_num(js, "\"skipped_launches\":"), json_num(strstr(js, "\"backlog\":"), "\"peak\":"),
           backlog_limit, rss1 - rss0);
    if (min_rate && (double)total / secs < (double)min_rate)
        FAIL("launch rate %.0f/s, below the %ld/s this run must show", (double)total / secs,
             min_rate);
    if (json_num(js, "\"dropped_watched\":") != 0)
        FAIL("dropped watched launches: %lld of %ld", json_num(js, "\"dropped_watched\":"),
             watched);
    if (json_num(js, "\"launch_watched\":") != watched)
        FAIL("launch_watched %lld, issued %ld", json_num(js, "\"launch_watched\":"), watched);
    /* The consumer saw each of them, and put each on its expert's books. */
    if (json_num(js, "\"launches\":{\"seen\":") < watched)
        FAIL("the consumer saw %lld launches of %ld that touch an expert",
             json_num(js, "\"launches\":{\"seen\":"), watched);
    for (int i = 0; i < nthr; i++) {
        char key[128];
        const char *p;
        snprintf(key, sizeof(key), "{\"name\":\"model.layers.%d.mlp.experts.w13\"", i);
        p = js ? strstr(js, key) : NULL;
        if (!p || json_num(p, "\"launches\":") != t[i].watched)
            FAIL("name %s: launches %lld, issued %ld", key, p ? json_num(p, "\"launches\":") : -1,
                 t[i].watched);
    }
    /* Bounded memory: the ring (its pages are touched as it cycles) and at
     * most the backlog's limit, 248 bytes a slot, plus what the shim holds
     * on purpose and reports: when `auto` streams the experts (it does in
     * some runs, as the consumer's timing falls), the streaming executor's
     * pinned copies of them (bounded by prefetch.pinned_copies), its slots
     * (device memory, which the fake driver keeps in host memory) and the
     * experts' managed ranges, which its collapses and copy-backs write
     * whole (the fake's managed memory is host memory too; without
     * streaming the kernel touches one page of each); plus slack for the
     * allocator and the fake's bookkeeping. */
    staged = json_num(js ? strstr(js, "\"stream\":") : NULL, "\"staged\":");
    populated = staged > 0 ? (long long)D.live(FAKECUDA_MANAGED) : 0;
    held = (pinned > 0 ? pinned : 0) + (dev1 > dev0 ? dev1 - dev0 : 0) + populated;
    printf("held on purpose: pinned copies %lld KiB, device memory %+lld KiB, managed ranges "
           "populated %lld KiB\n",
           pinned > 0 ? pinned / 1024 : 0, (dev1 - dev0) / 1024, populated / 1024);
    {
        /* where the consumer was (a failure's first clue: what kept it from
         * the ring), and what the two executors did */
        const char *lc = js ? strstr(js, "\"longest_call\":") : NULL;
        const char *who = lc ? strstr(lc, "\"executor\":\"") : NULL;
        const char *st = js ? strstr(js, "\"stream\":") : NULL;
        const char *pf = js ? strstr(js, "\"prefetch\":") : NULL;
        int wn = who ? (int)strcspn(who + 12, "\"") : 0;

        printf("consumer: longest executor call %lld ms (%.*s%s); prefetcher: %lld prefetches, "
               "%lld evictions; stream: %lld staged, %lld slot waits, %lld await timeouts, auto "
               "tried %lld, went back %lld\n",
               json_num(lc, "\"ms\":"), wn, who ? who + 12 : "", lc && strstr(lc, "\"tick\":true")
                   ? ", a tick" : "",
               json_num(pf, "\"prefetches\":"), json_num(pf, "\"evictions\":"), staged,
               json_num(st, "\"slot_waits\":"), json_num(st, "\"await_timeouts\":"),
               json_num(st, "\"auto_tries\":"), json_num(st, "\"auto_backs\":"));
    }
    /* Under TSan every byte the process touches costs its shadow too (4x
     * the application's bytes, and the meta map): a run in which auto
     * streamed grew by 104 MiB there, for 26 MiB held on purpose (a
     * clean-clone run, 2026-11-29) */
    if (cap <= 0 || backlog_limit < 0 || pinned < 0 ||
        rss1 - rss0 > (long)((cap + backlog_limit) * 248 / 1024 + held / 1024 * TSAN_RSS_FACTOR) +
                          slack_mib * 1024)
        FAIL("memory: rss grew by %ld KiB (ring %lld slots, backlog limit %lld, pinned copies "
             "and device memory %lld KiB)",
             rss1 - rss0, cap, backlog_limit, held / 1024);
    free(js);
    pthread_barrier_wait(&bar);
    for (int i = 0; i < nthr; i++)
        pthread_join(tid[i], NULL);
    pthread_barrier_destroy(&bar);
    wait_slots_back();
    wait_live_zero();
    if (D.live(FAKECUDA_ANY) != 0)
        FAIL("leak: %" PRIu64 " live bytes", D.live(FAKECUDA_ANY));
    return failures ? 1 : 0;
}

/* --- API misuse ------------------------------------------------------------ */

static int misuse(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p = 0;
    char big[1100], buf[64];
    long n;

    load();
    if (!D.tag) {
        printf("FAIL misuse needs the shim\n");
        return 1;
    }
#define EXPECT(call, want)                                                                         \
    do {                                                                                           \
        long r_ = (long)(call);                                                                    \
        printf("%s %s -> %ld (want %ld)\n", r_ == (long)(want) ? "ok" : "FAIL", #call, r_,         \
               (long)(want));                                                                      \
        if (r_ != (long)(want))                                                                    \
            failures++;                                                                            \
    } while (0)
    memset(big, 'x', sizeof(big));
    big[sizeof(big) - 1] = 0;
    /* Before CUDA is initialised at all. */
    EXPECT(D.pop(), -EPERM);
    EXPECT(D.push(NULL), -EINVAL);
    EXPECT(D.push(""), -EINVAL);
    EXPECT(D.push(big), -E2BIG);
    EXPECT(D.tag(NULL, 16, "x"), -EINVAL);
    EXPECT(D.tag((void *)0x1000, 16, "x"), -ENOENT);
    EXPECT(D.stats(NULL, 5), -EINVAL);
    EXPECT(D.stats(buf, 0) > 0, 1);

    if (D.init(0) || D.device_get(&dev, 0) || D.ctx_retain(&ctx, dev) || D.ctx_set(ctx)) {
        printf("FAIL init\n");
        return 1;
    }
    EXPECT(D.alloc(&p, 2 * MiB), CUDA_SUCCESS);
    EXPECT(D.tag((void *)(uintptr_t)p, 0, "x"), -EINVAL);
    EXPECT(D.tag((void *)(uintptr_t)p, 16, NULL), -EINVAL);
    EXPECT(D.tag((void *)(uintptr_t)p, 16, ""), -EINVAL);
    EXPECT(D.tag((void *)(uintptr_t)p, 16, big), -EINVAL);
    EXPECT(D.tag((void *)(uintptr_t)p, 1 * MiB, "a.experts"), 0);
    EXPECT(D.tag((void *)(uintptr_t)p, 1 * MiB, "a.experts"), 0);         /* repeat */
    EXPECT(D.tag((void *)(uintptr_t)(p + 512 * KiB), 1 * MiB, "b"), -EEXIST); /* overlap */
    EXPECT(D.tag((void *)(uintptr_t)(p + 1 * MiB), 2 * MiB, "c"), -ERANGE);
    EXPECT(D.tag((void *)(uintptr_t)(p + 4 * MiB), 16, "d"), -ENOENT);
    for (int i = 0; i < 64; i++)
        EXPECT(D.push("deep"), 0);
    EXPECT(D.push("deep"), -E2BIG);
    for (int i = 0; i < 64; i++)
        EXPECT(D.pop(), 0);
    EXPECT(D.pop(), -EPERM);
    EXPECT(D.seal(), 0);
    EXPECT(D.seal(), -EALREADY);
    EXPECT(D.wclose(), -EALREADY);
    EXPECT(D.wopen(), 0);
    EXPECT(D.wopen(), -EALREADY);
    EXPECT(D.wclose(), 0);
    /* Unknown pointers to the driver: the engine's error, untouched. */
    EXPECT(D.free((CUdeviceptr)0x10), CUDA_ERROR_INVALID_VALUE);
    n = D.stats(buf, sizeof(buf));
    EXPECT(n > (long)sizeof(buf) && strlen(buf) == sizeof(buf) - 1, 1);
    {
        char *js = stats_get();
        long long mis = json_num(js, "\"misuse\":");
        printf("misuse counted %lld\n", mis);
        if (mis < 10)
            FAIL("misuse counter %lld", mis);
        free(js);
    }
    /* The process and its CUDA work are unharmed. */
    EXPECT(D.free(p), CUDA_SUCCESS);
    EXPECT(D.live(FAKECUDA_ANY), 0);
#undef EXPECT
    return failures ? 1 : 0;
}

/* --- process life cycle ------------------------------------------------------ */

static volatile sig_atomic_t stop_flag;
static void on_term(int sig)
{
    (void)sig;
    stop_flag = 1;
}

/* Initialise, allocate managed memory in scopes and launch on it so that the
 * consumer and the prefetch thread have work. Returns 0 or 1. */
static int busy_setup(CUdeviceptr *ret, int nbuf, size_t bytes)
{
    CUdevice dev;
    CUcontext ctx;

    load();
    if (D.init(0) || D.device_get(&dev, 0) || D.ctx_retain(&ctx, dev) || D.ctx_set(ctx))
        return 1;
    kaxpy = D.kernel("rel_axpy", 3, k_axpy_sizes, k_axpy);
    for (int i = 0; i < nbuf; i++) {
        char name[64];
        snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.w1", i);
        api_push(name);
        if (D.alloc(&ret[i], bytes))
            return 1;
        api_pop();
    }
    return api_seal() < 0;
}

static void busy_launch(CUdeviceptr *b, int nbuf, int rounds)
{
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < nbuf; i++)
            launch_axpy(b[i], b[(i + 1) % nbuf], 16, NULL);
}

/* Tiny CUDA work from scratch (a fresh process or a child): 0 when it
 * worked, else the first error. */
static int fresh_work(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    int r;

    if ((r = D.init(0)) || (r = D.device_get(&dev, 0)) || (r = D.ctx_retain(&ctx, dev)) ||
        (r = D.ctx_set(ctx)))
        return r;
    if (!kaxpy)
        kaxpy = D.kernel("rel_axpy", 3, k_axpy_sizes, k_axpy);
    api_push("child.experts");
    r = D.alloc(&p, 2 * MiB);
    api_pop();
    if (r)
        return r;
    if ((r = launch_axpy(p, p, 16, NULL)) || (r = D.ctx_sync()))
        return r;
    return D.free(p);
}

static int lifecycle(const char *mode, char **argv)
{
    CUdeviceptr b[6];
    const int nbuf = 6;

    if (strcmp(mode, "exec-target") == 0) {
        int r;
        load();
        r = fresh_work();
        if (r)
            printf("FAIL CUDA work in the new image: %d\n", r);
        return r ? 1 : 0;
    }
    if (strcmp(mode, "fork-nocuda") == 0) {
        /* The shim loaded, CUDA never touched, then fork: both exit cleanly. */
        pid_t pid = fork();
        int st;
        if (pid == 0)
            exit(0);
        return pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && !WEXITSTATUS(st) ? 0 : 1;
    }
    /* 6 x 4 MiB managed, 8 MiB device budget: the prefetcher keeps moving. */
    if (busy_setup(b, nbuf, 4 * MiB)) {
        printf("FAIL setup\n");
        return 1;
    }
    busy_launch(b, nbuf, 8);
    if (strcmp(mode, "fork-fresh") == 0 || strcmp(mode, "fork-untouched") == 0) {
        int fresh = mode[5] == 'f';
        pid_t pid = fork();
        int st;
        if (pid == 0) {
            int r = 0;
            if (fresh) {
                /* A child that starts CUDA afresh. The fake (like a real
                 * driver) refuses CUDA in the child of an initialised
                 * parent unless WOFAKE_FORK_OK=1: either way the child gets
                 * the driver's answer, never a hang. */
                const char *ok = getenv("WOFAKE_FORK_OK");
                char *js = stats_get();
                long long cached = json_num(js, "\"layouts_cached\":");
                free(js);
                r = fresh_work();
                if (ok && *ok == '1' ? r != 0 : r != CUDA_ERROR_NOT_INITIALIZED) {
                    printf("FAIL child: CUDA work returned %d\n", r);
                    fflush(stdout);
                    exit(1);
                }
                /* The parent's cached parameter layouts are forgotten in
                 * the child (preload/launch.c's fork handler): its first
                 * launch of the kernel the parent launched reads the
                 * layout from the driver again. */
                js = stats_get();
                if (ok && *ok == '1' && json_num(js, "\"layouts_cached\":") <= cached) {
                    printf("FAIL child: the parent's layout cache was used (layouts_cached %lld, "
                           "then %lld)\n",
                           cached, json_num(js, "\"layouts_cached\":"));
                    fflush(stdout);
                    exit(1);
                }
                free(js);
            }
            exit(0); /* runs the shim's exit path in the child */
        }
        busy_launch(b, nbuf, 8);
        if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) {
            printf("FAIL child status\n");
            return 1;
        }
        busy_launch(b, nbuf, 4);
        for (int i = 0; i < nbuf; i++)
            if (D.free(b[i]))
                return 1;
        return 0;
    }
    if (strcmp(mode, "exec") == 0) {
        char *av[] = {argv[0], (char *)"exec-target", NULL};
        busy_launch(b, nbuf, 8);
        execv("/proc/self/exe", av);
        return 1;
    }
    if (strcmp(mode, "exit-busy") == 0) {
        busy_launch(b, nbuf, 32);
        exit(0); /* nothing freed, the prefetch thread mid-work */
    }
    if (strcmp(mode, "sigterm") == 0 || strcmp(mode, "sigterm-handler") == 0) {
        if (mode[7] == '-')
            signal(SIGTERM, on_term);
        printf("ready\n");
        fflush(stdout);
        /* Launch until the runner's SIGTERM: the default action kills at
         * once; the handler makes us exit() (atexit handlers run) while the
         * prefetch thread is busy, as an engine's own handler does. */
        for (int i = 0; i < 200000 && !stop_flag; i++)
            busy_launch(b, nbuf, 1);
        exit(stop_flag ? 0 : 3);
    }
    printf("FAIL unknown mode %s\n", mode);
    return 2;
}

/* --- pinning under RLIMIT_MEMLOCK ------------------------------------------- */

static int pin(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p = 0;
    int r;
    char *js;

    /* Root (CI containers) may lock any amount: CAP_IPC_LOCK overrides
     * RLIMIT_MEMLOCK. Dropping it from the effective set makes the limit
     * the runner set real. */
    {
        struct __user_cap_header_struct ch = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
        struct __user_cap_data_struct cd[2];
        if (syscall(SYS_capget, &ch, cd) == 0) {
            cd[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
            (void)syscall(SYS_capset, &ch, cd);
        }
    }
    load();
    if (D.init(0) || D.device_get(&dev, 0) || D.ctx_retain(&ctx, dev) || D.ctx_set(ctx))
        return 1;
    api_push("model.layers.0.pinned.w1");
    r = D.alloc(&p, 8 * MiB);
    api_pop();
    js = stats_get();
    printf("pin result %d pinned %" PRIu64 " managed %" PRIu64 " failures %lld fallbacks %lld\n", r,
           D.live(FAKECUDA_HOST), D.live(FAKECUDA_MANAGED), json_num(js, "\"pin_failures\":"),
           json_num(js, "\"pin_fallbacks\":"));
    free(js);
    if (r == 0) {
        /* The engine's memory works wherever it landed. */
        float h[4] = {1, 2, 3, 4}, o[4] = {0};
        if (D.htod(p, h, sizeof(h)) || D.proc("cuMemcpyDtoH", (void **)&D.dtoh, 12000, 0, NULL) ||
            D.dtoh(o, p, sizeof(o)) || memcmp(h, o, sizeof(h)))
            FAIL("pinned fallback memory does not hold data");
        if (D.free(p))
            FAIL("free");
    }
    if (D.live(FAKECUDA_ANY) != 0)
        FAIL("leak %" PRIu64, D.live(FAKECUDA_ANY));
    return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "work";

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (strcmp(mode, "work") == 0)
        return work(argc > 2 ? atoi(argv[2]) : 8);
    if (strcmp(mode, "threads") == 0)
        return threads(argc > 2 ? atoi(argv[2]) : 8, argc > 3 ? atoi(argv[3]) : 100);
    if (strcmp(mode, "flood") == 0)
        return flood(argc > 2 ? atoi(argv[2]) : 8, argc > 3 ? atol(argv[3]) : 1000000,
                     argc > 4 ? atoi(argv[4]) : 8, argc > 5 ? atol(argv[5]) : 2000,
                     argc > 6 ? atol(argv[6]) : 10000, argc > 7 ? atol(argv[7]) : 0,
                     argc > 8 ? atol(argv[8]) : 16);
    if (strcmp(mode, "misuse") == 0)
        return misuse();
    if (strcmp(mode, "pin") == 0)
        return pin();
    return lifecycle(mode, argv);
}
