// bench/managed-read-cost.cu: what a kernel pays to read one expert-sized
// piece of managed memory in each state the prefetcher leaves it in.
//
// Managed memory advised as the shim advises it (preferred location host,
// accessed by the GPU, read-mostly); 2 GiB in 24 MiB pieces (an expert's
// gate_up slice). A streaming kernel on every SM reads one piece, timed
// with events, in these states:
//   host        never prefetched: read in place over PCIe
//   device      prefetched (a read-mostly duplicate on the GPU)
//   collapsed   prefetched, then evicted the shim's way (UNSET then SET
//               read-mostly: the GPU copy dropped), first read and second
//   in-flight   its prefetch enqueued on another stream just before
//   beside      a collapse of another piece running on another thread
//   plain       the range not read-mostly (read in place?), and a piece made
//               read-mostly for its prefetch and collapsed by unsetting it
// Prints the median of 9 pieces for each, in ms and GB/s.
//
// Build and run on the GPU machine (keeps 2 GiB managed, far below free):
//   nvcc -O2 -arch=sm_90 bench/managed-read-cost.cu -lcuda -o /tmp/mrc && /tmp/mrc
#include <cuda.h>
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda-check.h"

static const size_t PIECE = 24u << 20, N = 2ull << 30;
static const int NP = (int)(N / PIECE);
static CUdeviceptr base;
static CUcontext ctx;
static CUmemLocation cpu = {CU_MEM_LOCATION_TYPE_HOST, 0}, gpu = {CU_MEM_LOCATION_TYPE_DEVICE, 0};

__global__ void rd(const int4 *p, size_t n, int *sink)
{
    int4 a = make_int4(0, 0, 0, 0);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        int4 v = p[i];
        a.x ^= v.x; a.y ^= v.y; a.z ^= v.z; a.w ^= v.w;
    }
    if ((a.x ^ a.y ^ a.z ^ a.w) == 0x7fffffff)
        *sink = 1;
}

static int *sink;
static cudaEvent_t e0, e1;

static float read_ms(int piece)
{
    float ms;
    cudaEventRecord(e0, 0);
    rd<<<132 * 4, 512>>>((const int4 *)(base + (size_t)piece * PIECE), PIECE / 16, sink);
    cudaEventRecord(e1, 0);
    cudaEventSynchronize(e1);
    cudaEventElapsedTime(&ms, e0, e1);
    return ms;
}

static void collapse(int piece)
{
    CK(cuMemAdvise_v2(base + (size_t)piece * PIECE, PIECE, CU_MEM_ADVISE_UNSET_READ_MOSTLY, gpu));
    CK(cuMemAdvise_v2(base + (size_t)piece * PIECE, PIECE, CU_MEM_ADVISE_SET_READ_MOSTLY, gpu));
}

static void prefetch(int piece, CUstream s)
{
    CK(cuMemPrefetchAsync_v2(base + (size_t)piece * PIECE, PIECE, gpu, 0, s));
}

static int cmpf(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void report(const char *what, float *v, int n)
{
    qsort(v, n, sizeof(*v), cmpf);
    printf("%-44s %8.3f ms  %7.1f GB/s\n", what, v[n / 2], PIECE / (v[n / 2] * 1e-3) / 1e9);
}

static volatile int collapse_piece;
static void *collapser(void *x)
{
    (void)x;
    cuCtxSetCurrent(ctx);
    collapse(collapse_piece);
    return NULL;
}

/* Reads pieces first.. (prefetched first when `resident`) while a thread
 * collapses pieces other.. (prefetched first), nine of each. */
static void beside_collapse(int first, int other, CUstream side, bool resident, float *v)
{
    for (int i = 0; i < 9; i++) {
        pthread_t th;

        prefetch(other + i, side);
        if (resident)
            prefetch(first + i, side);
        cuStreamSynchronize(side);
        collapse_piece = other + i;
        pthread_create(&th, NULL, collapser, NULL);
        v[i] = read_ms(first + i);
        pthread_join(th, NULL);
    }
}

int main(void)
{
    CUstream side;
    float v[9];
    int p = 0;

    cudaFree(0);
    cuCtxGetCurrent(&ctx);
    cudaMalloc(&sink, sizeof(int));
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    CK(cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
    CK(cuMemAllocManaged(&base, N, CU_MEM_ATTACH_GLOBAL));
    memset((void *)base, 7, N);
    CK(cuMemAdvise_v2(base, N, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, cpu));
    CK(cuMemAdvise_v2(base, N, CU_MEM_ADVISE_SET_ACCESSED_BY, gpu));
    CK(cuMemAdvise_v2(base, N, CU_MEM_ADVISE_SET_READ_MOSTLY, gpu));
    read_ms(NP - 1); // warm up the kernel

    for (int i = 0; i < 9; i++)
        v[i] = read_ms(p++);
    report("host (never prefetched, read in place)", v, 9);

    for (int i = 0; i < 9; i++) {
        prefetch(p, side);
        cuStreamSynchronize(side);
        v[i] = read_ms(p++);
    }
    report("device (prefetched duplicate)", v, 9);

    float v2[9], v3[9];
    for (int i = 0; i < 9; i++) {
        prefetch(p, side);
        cuStreamSynchronize(side);
        read_ms(p);
        collapse(p);
        v[i] = read_ms(p);
        v2[i] = read_ms(p++);
    }
    report("collapsed, first read", v, 9);
    report("collapsed, second read", v2, 9);

    p = 0; // the first pieces are host-resident again: reuse
    for (int i = 0; i < 9; i++) {
        prefetch(p, side);
        v[i] = read_ms(p);
        cuStreamSynchronize(side);
        collapse(p++);
    }
    report("in-flight (prefetch enqueued just before)", v, 9);

    // a piece read while another piece collapses: host-resident, then prefetched
    beside_collapse(27, 60, side, false, v);
    report("host, beside a collapse of another piece", v, 9);
    beside_collapse(36, 70, side, true, v);
    report("device, beside a collapse of another piece", v, 9);

    // a plain range (read-mostly unset over all of it first); a piece made
    // read-mostly for its prefetch and collapsed by unsetting it; the same
    // with the piece mapped for the GPU again (the executor since a00c4b6)
    CK(cuMemAdvise_v2(base, N, CU_MEM_ADVISE_UNSET_READ_MOSTLY, gpu));
    p = 45;
    for (int i = 0; i < 9; i++) {
        v[i] = read_ms(p);
        v2[i] = read_ms(p++);
    }
    report("plain (never read-mostly), first read", v, 9);
    report("plain, second read", v2, 9);
    for (int i = 0; i < 9; i++) {
        CK(cuMemAdvise_v2(base + (size_t)p * PIECE, PIECE, CU_MEM_ADVISE_SET_READ_MOSTLY, gpu));
        prefetch(p, side);
        cuStreamSynchronize(side);
        read_ms(p);
        CK(cuMemAdvise_v2(base + (size_t)p * PIECE, PIECE, CU_MEM_ADVISE_UNSET_READ_MOSTLY, gpu));
        v[i] = read_ms(p);
        v2[i] = read_ms(p++);
    }
    report("piece-wise read-mostly, collapsed, first read", v, 9);
    report("piece-wise read-mostly, collapsed, second read", v2, 9);
    for (int i = 0; i < 9; i++) {
        double t0, t1;
        struct timespec ts;
        CK(cuMemAdvise_v2(base + (size_t)p * PIECE, PIECE, CU_MEM_ADVISE_SET_READ_MOSTLY, gpu));
        prefetch(p, side);
        cuStreamSynchronize(side);
        read_ms(p);
        clock_gettime(CLOCK_MONOTONIC, &ts);
        t0 = ts.tv_sec + ts.tv_nsec * 1e-9;
        CK(cuMemAdvise_v2(base + (size_t)p * PIECE, PIECE, CU_MEM_ADVISE_UNSET_READ_MOSTLY, gpu));
        CK(cuMemAdvise_v2(base + (size_t)p * PIECE, PIECE, CU_MEM_ADVISE_SET_ACCESSED_BY, gpu));
        clock_gettime(CLOCK_MONOTONIC, &ts);
        t1 = ts.tv_sec + ts.tv_nsec * 1e-9;
        v3[i] = (float)((t1 - t0) * 1e3);
        v[i] = read_ms(p);
        v2[i] = read_ms(p++);
    }
    report("collapsed + accessed-by again, first read", v, 9);
    report("collapsed + accessed-by again, second read", v2, 9);
    qsort(v3, 9, sizeof(*v3), cmpf);
    printf("%-44s %8.3f ms (host time of the two advice calls)\n", "the eviction itself", v3[4]);
    CK(cuMemFree(base));
    return 0;
}
