// bench/managed-residency.cu: where do the pages of fresh managed memory land
// when an engine loads weights into it, and what does cuMemGetInfo say?
// Answers the question behind uvm/'s managed cap (docs/placement.md): does the
// shim's live managed total already show in the free device memory?
//
// For each way of writing fresh managed memory (2 GiB): cudaMemcpy from
// pageable host, from pinned host, a device kernel writing it, and nothing
// (allocated only): the free device memory before and after, and
// cuMemRangeGetAttribute(LAST_PREFETCH_LOCATION). Build: nvcc -O2 -o mr
// bench/managed-residency.cu 
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cuda-check.h"

__global__ void fill(unsigned *p, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = (unsigned)i;
}

static size_t free_now(void)
{
    size_t f, t;
    CR(cudaMemGetInfo(&f, &t));
    return f;
}

int main(void)
{
    const size_t sz = 2ull << 30;
    void *pageable = malloc(sz), *pinned;
    memset(pageable, 1, sz);
    CR(cudaMallocHost(&pinned, sz));
    memset(pinned, 1, sz);
    CR(cudaFree(0));
    const char *how[] = {"allocated only", "cudaMemcpy from pageable host", "cudaMemcpy from pinned host",
                         "kernel writes it", "advise preferred=host, then cudaMemcpy from pinned"};
    for (int k = 0; k < 5; k++) {
        void *m;
        size_t f0 = free_now();
        CR(cudaMallocManaged(&m, sz));
        size_t f1 = free_now();
        if (k == 4) {
            cudaMemLocation loc = {cudaMemLocationTypeHost, 0};
            CR(cudaMemAdvise(m, sz, cudaMemAdviseSetPreferredLocation, loc));
        }
        if (k == 1) CR(cudaMemcpy(m, pageable, sz, cudaMemcpyHostToDevice));
        if (k == 2 || k == 4) CR(cudaMemcpy(m, pinned, sz, cudaMemcpyHostToDevice));
        if (k == 3) { fill<<<1024, 256>>>((unsigned *)m, sz / 4); CR(cudaDeviceSynchronize()); }
        size_t f2 = free_now();
        printf("%-52s free: before %.2f GiB, after alloc %+.3f GiB, after writing %+.3f GiB\n", how[k],
               f0 / 1073741824.0, ((double)f1 - f0) / 1073741824.0, ((double)f2 - f0) / 1073741824.0);
        CR(cudaFree(m));
    }
    return 0;
}
