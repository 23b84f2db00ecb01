// bench/uvm-release.cu: does a managed range prefetched to the host give its
// device memory back, and what makes the driver give it back (fit's yields,
// uvm/place-fit.c: a yielded weight's pages stayed in UVM's cache and the
// process's device use reached the whole free memory).
//
//   nvcc -O2 -o /tmp/uvm-release bench/uvm-release.cu && /tmp/uvm-release [GiB]
//
// Steps, the free memory (cudaMemGetInfo) after each:
//   1. a managed range of GiB (default 4; never more than half the free
//      memory) written on the device (its pages there);
//   2. prefetched to the host (cudaMemPrefetchAsync, synchronized);
//   3. the same after cudaMemAdvise(SetPreferredLocation, CPU) and a second
//      prefetch;
//   4. a device allocation of GiB/2 made and freed (does an allocation take
//      UVM's cached pages, or the free memory first?);
//   5. device allocations of 256 MiB made until one fails, then all freed
//      (the squeeze: whether an allocation past the free memory takes UVM's
//      cached pages back, and whether they stay with the driver after).
//   6. the range's bytes read back on the host against what was written.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda-check.h"


static size_t free_now(void)
{
    size_t f = 0, t = 0;
    CR(cudaMemGetInfo(&f, &t));
    return f;
}

static void say(const char *what, size_t base, size_t f)
{
    printf("%-58s free %8.3f GiB (%+.3f GiB against the start)\n", what, f / 1073741824.0,
           ((double)f - (double)base) / 1073741824.0);
}

__global__ void fill(unsigned *p, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = (unsigned)(i * 2654435761u);
}

int main(int argc, char **argv)
{
    double gib = argc > 1 ? atof(argv[1]) : 4.0;
    size_t bytes = (size_t)(gib * 1073741824.0), n = bytes / 4;
    unsigned *p = NULL;
    int dev = 0;
    cudaMemLocation cpu = {cudaMemLocationTypeHost, 0}, gpu = {cudaMemLocationTypeDevice, 0};

    CR(cudaSetDevice(dev));
    CR(cudaFree(0));
    size_t base = free_now();
    if (bytes > base / 2) {
        fprintf(stderr, "uvm-release: %.1f GiB is more than half the free memory\n", gib);
        return 2;
    }
    say("start", base, base);
    CR(cudaMallocManaged(&p, bytes));
    CR(cudaMemPrefetchAsync(p, bytes, gpu, 0, 0));
    fill<<<1024, 256>>>(p, n);
    CR(cudaDeviceSynchronize());
    say("1. managed range written on the device", base, free_now());
    CR(cudaMemPrefetchAsync(p, bytes, cpu, 0, 0));
    CR(cudaDeviceSynchronize());
    size_t after2 = free_now();
    say("2. prefetched to the host", base, after2);
    CR(cudaMemAdvise(p, bytes, cudaMemAdviseSetPreferredLocation, cpu));
    CR(cudaMemPrefetchAsync(p, bytes, cpu, 0, 0));
    CR(cudaDeviceSynchronize());
    say("3. preferred location CPU, prefetched again", base, free_now());
    {
        void *q = NULL;
        CR(cudaMalloc(&q, bytes / 2));
        say("4a. a device allocation of half the range, made", base, free_now());
        CR(cudaFree(q));
        say("4b. ... and freed", base, free_now());
    }
    {
        std::vector<void *> v;
        size_t took = 0, chunk = 256u << 20;
        /* until an allocation fails: past the free memory only if the
         * driver takes UVM's cached pages back for it */
        while (took < base + bytes) {
            void *q = NULL;
            if (cudaMalloc(&q, chunk) != cudaSuccess) {
                cudaGetLastError();
                break;
            }
            v.push_back(q);
            took += chunk;
        }
        printf("5. squeeze: %zu allocations of 256 MiB (%.3f GiB) made\n", v.size(),
               took / 1073741824.0);
        say("5a. ... while they are held", base, free_now());
        for (void *q : v)
            CR(cudaFree(q));
        say("5b. ... all freed", base, free_now());
    }
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += p[i] != (unsigned)(i * 2654435761u);
    printf("6. read back on the host: %zu of %zu words differ\n", bad, n);
    CR(cudaFree(p));
    say("7. the range freed", base, free_now());
    return bad ? 1 : 0;
}
