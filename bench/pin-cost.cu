// bench/pin-cost.cu: what a load into the shim's host placements costs
// (issue 19's load time): pinning host memory several ways, and the engine's
// copy of a weight from pageable memory into each kind of destination.
//
// For 2 GiB: cuMemHostAlloc(DEVICEMAP|PORTABLE) (what uvm/ does past the
// managed cap); mmap + MADV_HUGEPAGE + cuMemHostRegister (transparent huge
// pages: fewer pages to pin); cuMemCreate(HOST_NUMA) + map (VMM host memory).
// Then cudaMemcpy from a pageable buffer (safetensors' CPU tensor) into:
// device memory, pinned host memory (its device pointer), managed memory
// advised preferred=host + accessed-by=GPU (the window under fit), fresh
// managed memory with no advice. Build: nvcc -O2 -o pc bench/pin-cost.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "cuda-check.h"


static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void copy_into(const char *what, void *dst, const void *src, size_t n)
{
    CR(cudaDeviceSynchronize());
    double t = now();
    for (size_t off = 0; off < n; off += 64ull << 20) // one weight at a time, as a loader does
        CR(cudaMemcpy((char *)dst + off, (const char *)src + off, 64ull << 20, cudaMemcpyHostToDevice));
    CR(cudaDeviceSynchronize());
    t = now() - t;
    printf("  copy 64 MiB pieces from pageable into %-46s %6.2f GB/s (%.0f ms)\n", what, n / t / 1e9, t * 1e3);
}

int main(void)
{
    const size_t n = 2ull << 30;
    CR(cudaFree(0));
    char *src = (char *)malloc(n);
    memset(src, 7, n);
    double t;

    t = now();
    void *pinned;
    CK(cuMemHostAlloc(&pinned, n, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    t = now() - t;
    printf("pin 2 GiB: cuMemHostAlloc(DEVICEMAP|PORTABLE)              %7.0f ms (%.0f ms/GiB)\n", t * 1e3, t * 1e3 / 2);

    t = now();
    void *thp = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    madvise(thp, n, MADV_HUGEPAGE);
    CK(cuMemHostRegister(thp, n, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE));
    t = now() - t;
    printf("pin 2 GiB: mmap + MADV_HUGEPAGE + cuMemHostRegister         %7.0f ms (%.0f ms/GiB)\n", t * 1e3, t * 1e3 / 2);

    t = now();
    void *plain = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CK(cuMemHostRegister(plain, n, CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE));
    t = now() - t;
    printf("pin 2 GiB: mmap (4 KiB pages) + cuMemHostRegister           %7.0f ms (%.0f ms/GiB)\n", t * 1e3, t * 1e3 / 2);

    {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof(prop));
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
        prop.location.id = 0;
        size_t gran = 0;
        CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
        t = now();
        CUmemGenericAllocationHandle h;
        CUdeviceptr va;
        CK(cuMemCreate(&h, n, &prop, 0));
        CK(cuMemAddressReserve(&va, n, 0, 0, 0));
        CK(cuMemMap(va, n, 0, h, 0));
        CUmemAccessDesc acc;
        memset(&acc, 0, sizeof(acc));
        acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        acc.location.id = 0;
        acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        CK(cuMemSetAccess(va, n, &acc, 1));
        t = now() - t;
        printf("pin 2 GiB: cuMemCreate(HOST_NUMA) + map (granularity %zu) %7.0f ms (%.0f ms/GiB)\n", gran, t * 1e3, t * 1e3 / 2);
        copy_into("VMM host memory (HOST_NUMA)", (void *)va, src, n);
    }

    void *dev;
    CR(cudaMalloc(&dev, n));
    copy_into("device memory", dev, src, n);
    CUdeviceptr pd;
    CK(cuMemHostGetDevicePointer(&pd, pinned, 0));
    copy_into("pinned host memory (its device pointer)", (void *)pd, src, n);
    CUdeviceptr td;
    CK(cuMemHostGetDevicePointer(&td, thp, 0));
    copy_into("THP-registered host memory", (void *)td, src, n);
    void *m;
    CR(cudaMallocManaged(&m, n));
    cudaMemLocation host = {cudaMemLocationTypeHost, 0}, gpu = {cudaMemLocationTypeDevice, 0};
    CR(cudaMemAdvise(m, n, cudaMemAdviseSetPreferredLocation, host));
    CR(cudaMemAdvise(m, n, cudaMemAdviseSetAccessedBy, gpu));
    copy_into("managed, preferred=host + accessed-by=GPU", m, src, n);
    void *m2;
    CR(cudaMallocManaged(&m2, n));
    copy_into("managed, no advice (pages land on the GPU)", m2, src, n);
    return 0;
}
