// bench/vmm-host-copy.cu: are copies out of a VMM range backed by host memory
// (cuMemCreate, location HOST_NUMA) right, by the copy engine and by a kernel?
//
// The case (docs/placement.md, Late binding): the streaming executor staged
// host experts out of a late-bound range with cuMemcpyAsync and llama-server died
// with an illegal address; picked copies by the picks kernel out of one gave
// other tokens; kernels reading the range in place were right. This probe
// copies spans of such a range into device memory and compares every byte
// with what was written, for three layouts of the range:
//   host      every granule host memory (HOST_NUMA);
//   reback    device memory first, written, then re-backed on the host at the
//             same address as a yield does (copy out, unmap, map the host
//             allocation), the freed device memory then overwritten;
//   mixed     the first and last granules device memory, the rest host memory
//             (late binding's granule rule: a granule shared with a neighbour
//             on the device stays there), so one copy spans both kinds;
// and for each: cuMemcpyAsync on a non-blocking stream (the executor's
// staging copy), cuMemcpyDtoDAsync, and a kernel that copies 16 bytes a
// thread (the picks kernel's way), each over spans that start and end on and
// off the 2 MiB granules. It also prints what cuPointerGetAttribute says of
// the range (the memory type the driver reports for each granule kind).
//
//   nvcc -O2 -o vmm-host-copy bench/vmm-host-copy.cu -lcuda
//   ./vmm-host-copy [ROUNDS=20]
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda-check.h"

#define G (2ull << 20) /* the granule */
#define NG 12ull       /* granules in the range */
#define N (NG * G)

__global__ void copy16(uint4 *dst, const uint4 *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

static CUmemAllocationProp prop(CUmemLocationType t)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof(p));
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = t;
    p.location.id = 0;
    return p;
}

static void map(CUdeviceptr va, size_t off, size_t bytes, CUmemGenericAllocationHandle h)
{
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof(acc));
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = 0;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CK(cuMemMap(va + off, bytes, 0, h, 0));
    CK(cuMemSetAccess(va + off, bytes, &acc, 1));
}

static const char *mtype(CUdeviceptr p)
{
    unsigned int t = 0;
    CUresult r = cuPointerGetAttribute(&t, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
    if (r != CUDA_SUCCESS)
        return "(no answer)";
    return t == CU_MEMORYTYPE_HOST ? "host" : t == CU_MEMORYTYPE_DEVICE ? "device" : "other";
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 20;
    CUdevice dev;
    CUcontext ctx;
    CUstream st;
    int numa = 0;
    unsigned char *src = (unsigned char *)malloc(N), *back = (unsigned char *)malloc(N);
    CUdeviceptr dst, junk;
    unsigned long bad_total = 0;

    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev));
    CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    CK(cuMemAlloc(&dst, N));
    for (size_t i = 0; i < N; i++)
        src[i] = (unsigned char)((i * 2654435761u) >> 13);
    printf("vmm-host-copy: %llu granules of 2 MiB, host NUMA id %d, %d rounds\n",
           (unsigned long long)NG, numa, rounds);

    const char *layouts[] = {"host", "reback", "mixed"};
    for (int L = 0; L < 3; L++) {
        unsigned long bad[3] = {0, 0, 0}, runs = 0;
        for (int round = 0; round < rounds; round++) {
            CUdeviceptr va;
            CUmemAllocationProp ph = prop(CU_MEM_LOCATION_TYPE_HOST_NUMA),
                                pd = prop(CU_MEM_LOCATION_TYPE_DEVICE);
            CUmemGenericAllocationHandle hh, hd, hd2 = 0;
            ph.location.id = numa;
            CK(cuMemAddressReserve(&va, N, G, 0, 0));
            if (L == 0) {
                CK(cuMemCreate(&hh, N, &ph, 0));
                map(va, 0, N, hh);
                CK(cuMemcpyHtoD(va, src, N));
            } else if (L == 1) {
                CUdeviceptr tmp;
                CK(cuMemCreate(&hd, N, &pd, 0));
                map(va, 0, N, hd);
                CK(cuMemcpyHtoD(va, src, N));
                CK(cuMemCreate(&hh, N, &ph, 0));
                CK(cuMemAddressReserve(&tmp, N, G, 0, 0));
                map(tmp, 0, N, hh);
                CK(cuMemcpyDtoDAsync(tmp, va, N, st));
                CK(cuStreamSynchronize(st));
                CK(cuMemUnmap(va, N));
                CK(cuMemUnmap(tmp, N));
                CK(cuMemAddressFree(tmp, N));
                CK(cuMemRelease(hd));
                map(va, 0, N, hh);
                /* the device memory it held, overwritten */
                CK(cuMemAlloc(&junk, N));
                CK(cuMemsetD8(junk, 0xAB, N));
                CK(cuCtxSynchronize());
                CK(cuMemFree(junk));
            } else {
                CK(cuMemCreate(&hd, G, &pd, 0));
                CK(cuMemCreate(&hd2, G, &pd, 0));
                CK(cuMemCreate(&hh, N - 2 * G, &ph, 0));
                map(va, 0, G, hd);
                map(va, G, N - 2 * G, hh);
                map(va, N - G, G, hd2);
                CK(cuMemcpyHtoD(va, src, N));
            }
            if (round == 0)
                printf("%-7s memory type: first granule %s, second %s, last %s\n", layouts[L],
                       mtype(va), mtype(va + G), mtype(va + N - 1));
            /* spans: whole, granule-aligned inside, off-granule crossing
             * the first boundary, off-granule crossing the last, small odd */
            size_t spans[][2] = {{0, N},
                                 {G, N - 2 * G},
                                 {G - 4096, 2 * G + 8192},
                                 {N - G - 3 * 65536, G + 3 * 65536},
                                 {5 * G + 48, 4096 * 3}};
            for (size_t s = 0; s < sizeof(spans) / sizeof(spans[0]); s++) {
                size_t off = spans[s][0], len = spans[s][1];
                for (int how = 0; how < 3; how++) {
                    CK(cuMemsetD8(dst, 0, N));
                    CK(cuCtxSynchronize());
                    if (how == 0)
                        CK(cuMemcpyAsync(dst + off, va + off, len, st));
                    else if (how == 1)
                        CK(cuMemcpyDtoDAsync(dst + off, va + off, len, st));
                    else
                        copy16<<<264, 512, 0, (cudaStream_t)st>>>((uint4 *)(dst + off),
                                                                   (const uint4 *)(va + off),
                                                                   len / 16);
                    CK(cuStreamSynchronize(st));
                    CK(cuMemcpyDtoH(back, dst + off, len));
                    if (memcmp(back, src + off, len) != 0) {
                        size_t k = 0;
                        while (k < len && back[k] == src[off + k])
                            k++;
                        if (bad[how]++ < 3)
                            printf("WRONG %s %s span [%zu, +%zu): first wrong byte at +%zu\n",
                                   layouts[L],
                                   how == 0 ? "cuMemcpyAsync" : how == 1 ? "DtoDAsync" : "kernel",
                                   off, len, k);
                    }
                    runs++;
                }
            }
            CK(cuMemUnmap(va, N));
            CK(cuMemAddressFree(va, N));
            CK(cuMemRelease(hh));
            if (L == 2) {
                CK(cuMemRelease(hd));
                CK(cuMemRelease(hd2));
            }
        }
        printf("%-7s %lu copies checked: wrong cuMemcpyAsync %lu, cuMemcpyDtoDAsync %lu, "
               "kernel %lu\n",
               layouts[L], runs, bad[0], bad[1], bad[2]);
        bad_total += bad[0] + bad[1] + bad[2];
    }
    printf("vmm-host-copy: %s\n", bad_total ? "WRONG copies above" : "every copy right");
    return bad_total ? 1 : 0;
}
