// bench/prefetch-contention.cu: does the prefetch thread's driver work hold
// up the engine's launches, and does a context of its own avoid it?
//
// A traced managed run (bench/results/e2e-20261122-202230-issue7-new-executor.md)
// showed the engine's launch gaps that contain the end of a prefetch call
// grow by the call's length (12 MiB: +319 us, 24 MiB: +648 us): the engine
// thread waits for the prefetch thread. This probe reproduces that outside
// the engine and tries the ways around it.
//
// Thread "engine": 20 us of its own work, then launches a small kernel;
// synchronises its stream every 16 launches (the eager MoE's pattern: a
// launch-bound host). Thread "prefetcher": the shim's cycle on 24 MiB pieces
// of managed memory advised as the shim advises it: SET_READ_MOSTLY and
// cuMemPrefetchAsync of piece p on its own non-blocking stream, then the
// eviction of piece p-16 (UNSET_READ_MOSTLY, SET_ACCESSED_BY), 1 ms apart.
// Modes: idle (no prefetcher), the cycle from the engine's context (the shim
// today), the cycle from a context of its own on the same GPU, and plain
// migrations (no read-mostly; evicted by prefetching back to the host).
// Prints per mode the engine's launches per second, its launch call time
// (median, p99), the time its launch calls spent beyond 100 us attributed
// to what the prefetcher was doing as the call returned, and the
// prefetcher's call times.
//
// First, what a context of its own costs in device memory and what giving
// back its stack reservation (CU_LIMIT_STACK_SIZE 0) returns.
//
// Keeps 1.1 GiB managed (far below free). Build and run on the GPU machine:
//   nvcc -O2 -arch=sm_90 bench/prefetch-contention.cu -lcuda -lpthread -o /tmp/pc && /tmp/pc
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <algorithm>
#include <vector>

#include "cuda-check.h"

static const size_t PIECE = 24u << 20;
static const int NP = 48, KEEP = 16;
static const double SECONDS = 1.5;
static CUdeviceptr base;
static CUcontext primary, own;
static CUdevice dev;
static CUmemLocation cpu = {CU_MEM_LOCATION_TYPE_HOST, 0}, gpu = {CU_MEM_LOCATION_TYPE_DEVICE, 0};

__global__ void small(int *p)
{
    if (threadIdx.x == 0 && blockIdx.x == 0)
        p[0]++;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

enum kind { K_NONE, K_ADVISE_RM, K_PREFETCH, K_EVICT, K_N };
static const char *kname[K_N] = {"nothing", "set read-mostly", "prefetch call", "eviction"};

struct call {
    double a, b;
    int k;
};

enum mode { M_IDLE, M_SAME, M_OWN, M_PLAIN };
static const char *mname[] = {"idle (no prefetcher)", "engine's context, read-mostly (the shim)",
                              "context of its own, read-mostly", "engine's context, plain migrations"};

static volatile int stop;
static int cur_mode;
static std::vector<call> pcalls;
static std::vector<call> lcalls;
static int *dcount;

static void *engine(void *)
{
    CUstream s;
    CUfunction f;
    void *args[] = {&dcount};
    int n = 0;

    CK(cuCtxSetCurrent(primary));
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    if (cudaGetFuncBySymbol(&f, (const void *)small) != cudaSuccess) {
        fprintf(stderr, "prefetch-contention: cudaGetFuncBySymbol failed\n");
        exit(1);
    }
    while (!stop) {
        double t = now();
        while (now() - t < 20e-6)
            ; // the engine's own work
        double a = now();
        CK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
        lcalls.push_back({a, now(), 0});
        if (++n % 16 == 0)
            CK(cuStreamSynchronize(s));
    }
    CK(cuStreamSynchronize(s));
    CK(cuStreamDestroy(s));
    return NULL;
}

static void timed(int k, CUresult r, double a)
{
    CK(r);
    pcalls.push_back({a, now(), k});
}

static void *prefetcher(void *)
{
    CUstream s;
    int p = 0;
    bool rm = cur_mode != M_PLAIN;

    CK(cuCtxSetCurrent(cur_mode == M_OWN ? own : primary));
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    while (!stop) {
        CUdeviceptr q = base + (size_t)(p % NP) * PIECE;
        CUdeviceptr e = base + (size_t)((p + NP - KEEP) % NP) * PIECE;
        double a;

        if (rm) {
            a = now();
            timed(K_ADVISE_RM, cuMemAdvise_v2(q, PIECE, CU_MEM_ADVISE_SET_READ_MOSTLY, gpu), a);
        }
        a = now();
        timed(K_PREFETCH, cuMemPrefetchAsync_v2(q, PIECE, gpu, 0, s), a);
        if (p >= KEEP) {
            a = now();
            if (rm) {
                CUresult r = cuMemAdvise_v2(e, PIECE, CU_MEM_ADVISE_UNSET_READ_MOSTLY, gpu);
                if (r == CUDA_SUCCESS)
                    r = cuMemAdvise_v2(e, PIECE, CU_MEM_ADVISE_SET_ACCESSED_BY, gpu);
                timed(K_EVICT, r, a);
            } else {
                timed(K_EVICT, cuMemPrefetchAsync_v2(e, PIECE, cpu, 0, s), a);
            }
        }
        p++;
        double t = now();
        while (!stop && now() - t < 1e-3)
            ;
    }
    CK(cuStreamSynchronize(s));
    CK(cuStreamDestroy(s));
    return NULL;
}

static double pct(std::vector<double> v, double q)
{
    if (v.empty())
        return 0;
    std::sort(v.begin(), v.end());
    return v[(size_t)(q * (v.size() - 1))];
}

static void reset_memory(void)
{
    // every piece back to host, plain, mapped for the GPU
    CK(cuCtxSetCurrent(primary));
    CK(cuMemAdvise_v2(base, PIECE * NP, CU_MEM_ADVISE_UNSET_READ_MOSTLY, gpu));
    CK(cuMemPrefetchAsync_v2(base, PIECE * NP, cpu, 0, NULL));
    CK(cuCtxSynchronize());
    CK(cuMemAdvise_v2(base, PIECE * NP, CU_MEM_ADVISE_SET_ACCESSED_BY, gpu));
}

static void run(int mode)
{
    pthread_t te, tp;

    reset_memory();
    pcalls.clear();
    lcalls.clear();
    pcalls.reserve(1 << 16);
    lcalls.reserve(1 << 20);
    cur_mode = mode;
    stop = 0;
    pthread_create(&te, NULL, engine, NULL);
    if (mode != M_IDLE)
        pthread_create(&tp, NULL, prefetcher, NULL);
    double t0 = now();
    while (now() - t0 < SECONDS)
        ;
    stop = 1;
    pthread_join(te, NULL);
    if (mode != M_IDLE)
        pthread_join(tp, NULL);

    std::vector<double> d;
    double over[K_N] = {0};
    int nover[K_N] = {0};
    for (const call &c : lcalls) {
        double us = (c.b - c.a) * 1e6;
        d.push_back(us);
        if (us <= 100)
            continue;
        int k = K_NONE;
        for (const call &p : pcalls)
            if (p.a <= c.b && c.b <= p.b + 30e-6) {
                k = p.k;
                break;
            }
        over[k] += us * 1e-6;
        nover[k]++;
    }
    double span = lcalls.back().b - lcalls.front().a;
    printf("%s\n", mname[mode]);
    printf("  engine: %.0f launches/s, launch call median %.1f us, p99 %.1f us, max %.0f us\n",
           lcalls.size() / span, pct(d, 0.5), pct(d, 0.99), pct(d, 1.0));
    for (int k = 0; k < K_N; k++)
        if (nover[k])
            printf("  launch calls over 100 us returning while the prefetcher was in: %-16s %5d, %.1f ms/s\n",
                   kname[k], nover[k], over[k] * 1e3 / span);
    for (int k = 1; k < K_N; k++) {
        std::vector<double> v;
        for (const call &p : pcalls)
            if (p.k == k)
                v.push_back((p.b - p.a) * 1e6);
        if (!v.empty())
            printf("  prefetcher: %-16s %4zu calls, median %7.1f us (%.1f GB/s of 24 MiB), p90 %7.1f us\n",
                   kname[k], v.size(), pct(v, 0.5), PIECE / (pct(v, 0.5) * 1e3), pct(v, 0.9));
    }
}

static double free_mib(void)
{
    size_t f, t;
    CK(cuMemGetInfo(&f, &t));
    return f / 1048576.0;
}

// What a context of its own costs in device memory, and what its limits
// give back (it launches no kernel: no stack, printf FIFO or heap needed).
static void context_memory(void)
{
    static const struct {
        CUlimit l;
        const char *name;
    } lim[] = {{CU_LIMIT_STACK_SIZE, "stack size"},
               {CU_LIMIT_PRINTF_FIFO_SIZE, "printf FIFO"},
               {CU_LIMIT_MALLOC_HEAP_SIZE, "malloc heap"}};
    CUcontext c;
    double f0 = free_mib(), f1;
    CK(cuCtxCreate(&c, NULL, 0, dev));
    f1 = free_mib();
    printf("context memory: a new context takes %.0f MiB\n", f0 - f1);
    for (size_t i = 0; i < sizeof(lim) / sizeof(lim[0]); i++) {
        size_t v = 0;
        CK(cuCtxGetLimit(&v, lim[i].l));
        CUresult r = cuCtxSetLimit(lim[i].l, 0);
        size_t w = 0;
        cuCtxGetLimit(&w, lim[i].l);
        double f2 = free_mib();
        printf("context memory: %s %zu -> %zu bytes (%s): %.0f MiB given back\n", lim[i].name, v, w,
               r == CUDA_SUCCESS ? "set" : "refused", f2 - f1);
        f1 = f2;
    }
    printf("context memory: left %.0f MiB\n", f0 - f1);
    CK(cuCtxDestroy(c));
    printf("context memory: destroyed, %.0f MiB back\n", free_mib() - f1);
}

int main(void)
{
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&primary, dev));
    CK(cuCtxSetCurrent(primary));
    context_memory();
    CK(cuCtxSetCurrent(primary));
    CK(cuCtxCreate(&own, NULL, 0, dev));
    CK(cuCtxSetCurrent(primary));
    CK(cuMemAlloc((CUdeviceptr *)&dcount, sizeof(int)));
    CK(cuMemAllocManaged(&base, PIECE * NP, CU_MEM_ATTACH_GLOBAL));
    memset((void *)base, 7, PIECE * NP);
    CK(cuMemAdvise_v2(base, PIECE * NP, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, cpu));
    printf("prefetch-contention: 24 MiB pieces, %d of them, %d kept on the GPU; %.1f s a mode\n", NP, KEEP,
           SECONDS);
    // twice, interleaved, so drift shows
    for (int rep = 0; rep < 2; rep++)
        for (int m = M_IDLE; m <= M_PLAIN; m++)
            run(m);
    return 0;
}
