// bench/pin-contention.cu: what pinning host memory on one thread costs an
// engine launching kernels on another (issue 18: the pinned-copy worker,
// uvm/stream-pin.c, slowed decode while it made its copies).
//
// The "engine" thread launches a short kernel and synchronises, in a loop;
// its rate and its longest iteration are measured alone and while a second
// thread pins 2 GiB: (a) mmap + MADV_HUGEPAGE + cuMemHostRegister of
// untouched pages (what uvm/place.c wo_pin_host did: the pages are faulted
// in and zeroed inside the driver call), (b) the same pages populated first
// (MADV_POPULATE_WRITE, outside the driver), then registered, (c) a CPU
// memcpy of 2 GiB into registered memory (the worker's copy).
// Build: nvcc -O2 -o pcn bench/pin-contention.cu -lcuda -lpthread
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "cuda-check.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

__global__ void spin(int n, int *out)
{
    int x = 0;
    for (int i = 0; i < n; i++)
        x += i * threadIdx.x;
    if (x == 42)
        *out = x;
}

static volatile int stop_engine;
static int *dout;
static double *stamps; // the engine's iteration end times
static size_t nstamps;
#define MAXSTAMPS (1u << 22)

static void *engine(void *arg)
{
    (void)arg;
    cudaStream_t s;
    CR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    nstamps = 0;
    while (!stop_engine && nstamps < MAXSTAMPS) {
        for (int k = 0; k < 8; k++)
            spin<<<1, 32, 0, s>>>(2000, dout);
        CR(cudaStreamSynchronize(s));
        stamps[nstamps++] = now();
    }
    CR(cudaStreamDestroy(s));
    return NULL;
}

static const size_t n = 2ull << 30;

// what the second thread does (which: 0 register untouched, 1 populate then
// register, 2 memcpy into registered memory, -1 nothing for 0.5 s)
static void work(int which, const char *src)
{
    if (which < 0) {
        struct timespec ts = {0, 500000000};
        nanosleep(&ts, NULL);
        return;
    }
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    madvise(p, n, MADV_HUGEPAGE);
    double a = now(), t_pop = 0;
    if (which >= 1) {
        if (madvise(p, n, MADV_POPULATE_WRITE) != 0)
            for (size_t off = 0; off < n; off += 4096)
                ((volatile char *)p)[off] = 0;
        t_pop = now() - a;
    }
    if (which == 2) {
        a = now();
        for (size_t off = 0; off < n; off += 16ull << 20)
            memcpy((char *)p + off, src + off, 16ull << 20);
        printf("    memcpy 2 GiB in 16 MiB pieces: %.0f ms\n", (now() - a) * 1e3);
        return; // not registered: the CPU copy alone
    }
    a = now();
    CK(cuMemHostRegister(p, n, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE));
    printf("    populate %.0f ms, cuMemHostRegister %.0f ms\n", t_pop * 1e3, (now() - a) * 1e3);
}

static double alone_rate;

static void window(const char *what, int which, const char *src)
{
    pthread_t th;
    struct timespec ts = {0, 200000000};
    stop_engine = 0;
    pthread_create(&th, NULL, engine, NULL);
    nanosleep(&ts, NULL);
    double t0 = now();
    work(which, src);
    double t1 = now();
    stop_engine = 1;
    pthread_join(th, NULL);
    size_t k = 0, in = 0;
    double worst = 0, prev = 0;
    for (; k < nstamps; k++) {
        if (stamps[k] < t0) {
            prev = stamps[k];
            continue;
        }
        if (stamps[k] > t1)
            break;
        in++;
        if (prev > 0 && stamps[k] - prev > worst)
            worst = stamps[k] - prev;
        prev = stamps[k];
    }
    double rate = in / (t1 - t0);
    if (which < 0)
        alone_rate = rate;
    printf("%-58s %.0f ms: engine %6.0f iterations/s (%.2fx alone), longest gap %.1f ms\n", what,
           (t1 - t0) * 1e3, rate, alone_rate > 0 ? rate / alone_rate : 0.0, worst * 1e3);
}

int main(void)
{
    CR(cudaFree(0));
    CR(cudaMalloc(&dout, 4));
    stamps = (double *)malloc(MAXSTAMPS * sizeof(double));
    char *src = (char *)malloc(n);
    memset(src, 7, n);
    printf("2 GiB on the second thread; the engine: 8 short kernels + a sync a loop\n");
    window("alone", -1, src);
    window("(a) mmap + THP + cuMemHostRegister (untouched pages)", 0, src);
    window("(b) mmap + THP + populate, then cuMemHostRegister", 1, src);
    window("(c) mmap + THP + populate + memcpy (no driver call)", 2, src);
    window("alone, again", -1, src);
    return 0;
}
