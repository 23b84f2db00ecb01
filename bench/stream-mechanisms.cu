// bench/stream-mechanisms.cu: which mechanism should stream a host range that
// a step reads several times (issue 18, deliverable 2)?
//
// The case: batched decode with transformers' default experts backend. Each
// layer's kernels are handed the whole stacked expert tensor and gather the
// picked experts per token, so at batch B a layer's ~1 GiB of experts is read
// up to B x top-k / distinct times. Read in place, every read crosses PCIe;
// streamed, the bytes cross once a step into device memory and the reads hit
// HBM. The probe runs a step of LAYERS layers of LAYER_BYTES each; a layer's
// "compute" is one kernel that reads the layer READS times (the read
// multiplicity). Per mechanism it prints the step time, the link rate it
// implies (LAYERS x LAYER_BYTES / step) and the distinct-bytes bound
// (LAYERS x LAYER_BYTES at the measured pinned H2D copy rate), and checks a
// checksum of every read against the host data.
//
//  resident   the layers in device memory (the floor: compute alone)
//  in-place   pinned host memory read by the kernel over PCIe (zero-copy)
//  stage      candidate (c): two device slots; a copy stream copies layer
//             i+1 into the free slot while the kernel reads layer i from the
//             other; events order copy after the slot's last reader and the
//             kernel after its copy (what launch redirection would do: the
//             kernel is handed the slot's address, the host copy stays the
//             truth)
//  stage-man  the same, copying from managed memory advised to the host
//             (preferred location host, accessed-by GPU: the shim's `host`
//             placement of a window allocation)
//  stage-kN   the same source, copied by a kernel on N blocks (the GPU
//             reads the managed pages in place over PCIe)
//  uvm        candidate (a): managed memory, preferred location host,
//             accessed-by GPU; a second thread prefetches layer i+1 to the
//             GPU (cuMemPrefetchAsync, one call a layer) and evicts layer i-1
//             (prefetch back to the host) while the kernel reads layer i
//  uvm-rm     (a) with read-mostly: the prefetch makes a GPU duplicate and
//             the eviction collapses it (UNSET_READ_MOSTLY, no copy back)
//  vmm        candidate (b): each layer a VMM range backed by host memory
//             (cuMemCreate, HOST_NUMA); streaming a layer copies it into a
//             device allocation, then unmaps the host backing and maps the
//             device one at the same address (and back after the kernel)
//
// Managed memory in use: LAYERS x LAYER_BYTES (8 GiB by default), far below
// the free memory of the lent GPU (the safety rule of device-facts.md). Build
// and run on the GPU machine:
//   nvcc -O2 -arch=sm_90 bench/stream-mechanisms.cu -lcuda -lpthread -o /tmp/sm && /tmp/sm
// Arguments: [layers] [layer MiB] [reads] [steps].
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda-check.h"

static int LAYERS = 8, READS = 4, STEPS = 4;
static size_t LAYER_BYTES = (size_t)1 << 30;
static CUdevice dev;
static CUcontext ctx;
static CUstream sc, sx; /* compute, copy */
static unsigned long long *d_sum;
static uint64_t *want; /* per layer: READS x the checksum of its bytes */

// Sums the layer's words READS times (grid-stride; one atomic a block).
__global__ void consume(const uint64_t *p, size_t n, int reads, unsigned long long *out)
{
    unsigned long long s = 0;
    for (int r = 0; r < reads; r++)
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
             i += (size_t)gridDim.x * blockDim.x)
            s += p[i] ^ (uint64_t)r;
    __shared__ unsigned long long b[32];
    for (int o = 16; o > 0; o /= 2)
        s += __shfl_down_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0)
        b[threadIdx.x / 32] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long t = 0;
        for (int w = 0; w < (int)(blockDim.x / 32); w++)
            t += b[w];
        atomicAdd(out, t);
    }
}

// The staging copy done by the GPU itself: a kernel reads the source over
// PCIe (zero-copy; managed memory advised to the host reads so at ~50 GB/s)
// and writes the slot. Few blocks: PCIe, not the SMs, is the limit.
__global__ void copy_words(uint4 *dst, const uint4 *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

static int copy_blocks = 0; /* > 0: staging copies by copy_words on that many blocks */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void fill(uint64_t *h, int layer)
{
    size_t n = LAYER_BYTES / 8;
    uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(layer + 1);
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        h[i] = x;
    }
    for (int r = 0; r < READS; r++)
        for (size_t i = 0; i < n; i++)
            s += h[i] ^ (uint64_t)r;
    want[layer] = s;
}

static int bad;

static void launch(CUdeviceptr p, int layer, unsigned long long *slot)
{
    (void)layer;
    consume<<<264, 1024, 0, (cudaStream_t)sc>>>((const uint64_t *)p, LAYER_BYTES / 8, READS, slot);
}

// Runs STEPS steps (after one warm-up), each reading every layer through
// addr(layer) after prepare(layer) and before release(layer); returns the
// median step time and checks each layer's sum.
typedef CUdeviceptr (*addr_fn)(int);
static double run(const char *name, addr_fn addr, void (*prepare)(int), void (*release)(int),
                  void (*step_begin)(void), void (*step_end)(void))
{
    double t[16];
    unsigned long long *sums;
    int n = STEPS + 1;

    CK(cuMemAllocHost((void **)&sums, sizeof(*sums) * LAYERS));
    for (int s = 0; s < n; s++) {
        CK(cuMemsetD8((CUdeviceptr)d_sum, 0, sizeof(*d_sum) * LAYERS));
        CK(cuCtxSynchronize());
        double t0 = now();
        if (step_begin)
            step_begin();
        for (int l = 0; l < LAYERS; l++) {
            if (prepare)
                prepare(l);
            launch(addr(l), l, d_sum + l);
            if (release)
                release(l);
        }
        if (step_end)
            step_end();
        CK(cuCtxSynchronize());
        t[s] = now() - t0;
        CK(cuMemcpyDtoH(sums, (CUdeviceptr)d_sum, sizeof(*sums) * LAYERS));
        for (int l = 0; l < LAYERS; l++)
            if (sums[l] != want[l]) {
                if (!bad)
                    fprintf(stderr, "%s: step %d layer %d: checksum %llx, want %llx\n", name, s, l,
                            sums[l], (unsigned long long)want[l]);
                bad++;
            }
    }
    CK(cuMemFreeHost(sums));
    // median of the timed steps (the first is the warm-up)
    for (int i = 1; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (t[j] < t[i]) {
                double x = t[i];
                t[i] = t[j], t[j] = x;
            }
    return t[1 + STEPS / 2];
}

/* --- resident and in place ------------------------------------------------ */
static CUdeviceptr *dres;
static uint64_t **hpin;
static CUdeviceptr addr_res(int l) { return dres[l]; }
static CUdeviceptr addr_pin(int l)
{
    CUdeviceptr p;
    CK(cuMemHostGetDevicePointer(&p, hpin[l], 0));
    return p;
}

/* --- stage: two device slots, a copy stream, events ----------------------- */
static CUdeviceptr slot[2];
static CUevent copied[2], read_done[2];
static CUdeviceptr *stage_from; /* NULL: from the pinned copies; else these (managed) */
static void stage_copy(int l)
{
    int k = l & 1;
    CK(cuStreamWaitEvent(sx, read_done[k], 0)); /* the slot's last reader is done */
    if (stage_from && copy_blocks)
        copy_words<<<copy_blocks, 512, 0, (cudaStream_t)sx>>>((uint4 *)slot[k],
                                                            (const uint4 *)stage_from[l],
                                                            LAYER_BYTES / 16);
    else if (stage_from)
        CK(cuMemcpyAsync(slot[k], stage_from[l], LAYER_BYTES, sx));
    else
        CK(cuMemcpyHtoDAsync(slot[k], hpin[l], LAYER_BYTES, sx));
    CK(cuEventRecord(copied[k], sx));
}
static void stage_begin(void)
{
    stage_copy(0);
}
static void stage_prepare(int l)
{
    if (l + 1 < LAYERS)
        stage_copy(l + 1); /* one ahead: overlaps this layer's reads */
    CK(cuStreamWaitEvent(sc, copied[l & 1], 0));
}
static void stage_release(int l)
{
    CK(cuEventRecord(read_done[l & 1], sc));
}
static CUdeviceptr addr_slot(int l) { return slot[l & 1]; }

/* --- uvm: managed, prefetch ahead and evict behind from a second thread --- */
static CUdeviceptr *man;
static bool read_mostly;
static CUstream sp;
static CUevent ready[64];
static CUmemLocation loc_gpu, loc_host;
static void uvm_prefetch(int l)
{
    if (read_mostly)
        CK(cuMemAdvise(man[l], LAYER_BYTES, CU_MEM_ADVISE_SET_READ_MOSTLY, loc_gpu));
    CK(cuMemPrefetchAsync_v2(man[l], LAYER_BYTES, loc_gpu, 0, sp));
    CK(cuEventRecord(ready[l], sp));
}
static void uvm_evict(int l)
{
    if (read_mostly)
        CK(cuMemAdvise(man[l], LAYER_BYTES, CU_MEM_ADVISE_UNSET_READ_MOSTLY, loc_gpu));
    else
        CK(cuMemPrefetchAsync_v2(man[l], LAYER_BYTES, loc_host, 0, sp));
}
static void uvm_begin(void)
{
    uvm_prefetch(0);
}
static void uvm_prepare(int l)
{
    /* The prefetch thread's order: evict two behind, then prefetch one ahead
     * (two layers resident at most: the budget). Issued from this thread:
     * cuMemPrefetchAsync migrates before it returns (device-facts.md), so
     * the compute stream is kept busy by the launch already queued. */
    if (l >= 2) {
        CK(cuEventSynchronize(read_done[l & 1]));
        uvm_evict(l - 2);
    }
    CK(cuStreamWaitEvent(sc, ready[l], 0));
}
static void uvm_release(int l)
{
    CK(cuEventRecord(read_done[l & 1], sc));
    if (l + 1 < LAYERS)
        uvm_prefetch(l + 1);
}
static void uvm_end(void)
{
    CK(cuCtxSynchronize());
    for (int l = LAYERS - 2; l < LAYERS; l++)
        if (l >= 0)
            uvm_evict(l);
    CK(cuStreamSynchronize(sp));
}
static CUdeviceptr addr_man(int l) { return man[l]; }

/* --- vmm: host-backed ranges re-backed by device memory at the same address */
static CUdeviceptr *va;
static CUmemGenericAllocationHandle *hh, dh[2];
static size_t gran;
static void map_to(CUdeviceptr p, CUmemGenericAllocationHandle h)
{
    CUmemAccessDesc a = {};
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = 0;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CK(cuMemMap(p, LAYER_BYTES, 0, h, 0));
    CK(cuMemSetAccess(p, LAYER_BYTES, &a, 1));
}
static CUdeviceptr dstage[2]; /* the device allocations, also mapped here for the copy */
static CUevent vcopied[64];
static void vmm_copy(int l)
{
    int k = l & 1;
    CK(cuStreamWaitEvent(sx, read_done[k], 0)); /* the device piece's last reader */
    CK(cuMemcpyDtoDAsync(dstage[k], va[l], LAYER_BYTES, sx)); /* host-backed VA -> device */
    CK(cuEventRecord(vcopied[l], sx));
}
static void vmm_begin(void)
{
    vmm_copy(0);
}
static void vmm_prepare(int l)
{
    /* The remap needs the copy done (cuMemMap is a host call); it overlapped
     * the previous layer's reads. */
    CK(cuEventSynchronize(vcopied[l]));
    CK(cuMemUnmap(va[l], LAYER_BYTES));
    map_to(va[l], dh[l & 1]);
}
static void vmm_release(int l)
{
    CK(cuEventRecord(read_done[l & 1], sc));
    if (l + 1 < LAYERS)
        vmm_copy(l + 1);
    /* The previous layer back on its host backing once its reads are done
     * (by now they are: this layer's kernel was queued behind them). */
    if (l >= 1) {
        CK(cuEventSynchronize(read_done[(l - 1) & 1]));
        CK(cuMemUnmap(va[l - 1], LAYER_BYTES));
        map_to(va[l - 1], hh[l - 1]);
    }
}
static void vmm_end(void)
{
    CK(cuCtxSynchronize());
    CK(cuMemUnmap(va[LAYERS - 1], LAYER_BYTES));
    map_to(va[LAYERS - 1], hh[LAYERS - 1]);
}
static CUdeviceptr addr_va(int l) { return va[l]; }

static void report(const char *name, double t, double h2d)
{
    double bytes = (double)LAYERS * LAYER_BYTES;
    printf("| %-9s | %8.1f | %7.1f | %5.2fx |\n", name, t * 1e3, bytes / t / 1e9,
           (bytes / (h2d * 1e9)) / t);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        LAYERS = atoi(argv[1]);
    if (argc > 2)
        LAYER_BYTES = (size_t)atoi(argv[2]) << 20;
    if (argc > 3)
        READS = atoi(argv[3]);
    if (argc > 4)
        STEPS = atoi(argv[4]);
    if (LAYERS < 2 || LAYERS > 64 || STEPS < 1 || STEPS > 15) {
        fprintf(stderr, "usage: %s [layers 2-64] [layer MiB] [reads] [steps 1-15]\n", argv[0]);
        return 2;
    }
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CK(cuStreamCreate(&sc, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&sx, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&sp, CU_STREAM_NON_BLOCKING));
    CK(cuMemAlloc((CUdeviceptr *)&d_sum, sizeof(*d_sum) * LAYERS));
    for (int k = 0; k < 2; k++) {
        CK(cuEventCreate(&copied[k], CU_EVENT_DISABLE_TIMING));
        CK(cuEventCreate(&read_done[k], CU_EVENT_DISABLE_TIMING));
        CK(cuEventRecord(read_done[k], sc));
    }
    for (int l = 0; l < LAYERS; l++)
        CK(cuEventCreate(&ready[l], CU_EVENT_DISABLE_TIMING));
    loc_gpu.type = CU_MEM_LOCATION_TYPE_DEVICE, loc_gpu.id = 0;
    loc_host.type = CU_MEM_LOCATION_TYPE_HOST, loc_host.id = 0;

    size_t freeb, total;
    CK(cuMemGetInfo(&freeb, &total));
    if ((double)LAYERS * LAYER_BYTES * 2 + (4ull << 30) > (double)freeb) {
        fprintf(stderr, "%d x %zu MiB does not fit twice in %zu MiB free\n", LAYERS,
                LAYER_BYTES >> 20, freeb >> 20);
        return 2;
    }
    want = (uint64_t *)calloc(LAYERS, sizeof(*want));
    hpin = (uint64_t **)calloc(LAYERS, sizeof(*hpin));
    dres = (CUdeviceptr *)calloc(LAYERS, sizeof(*dres));
    for (int l = 0; l < LAYERS; l++) {
        CK(cuMemHostAlloc((void **)&hpin[l], LAYER_BYTES, CU_MEMHOSTALLOC_DEVICEMAP));
        fill(hpin[l], l);
        CK(cuMemAlloc(&dres[l], LAYER_BYTES));
        CK(cuMemcpyHtoD(dres[l], hpin[l], LAYER_BYTES));
    }
    /* the copy engine's rate, for the bound */
    double t0 = now();
    for (int l = 0; l < LAYERS; l++)
        CK(cuMemcpyHtoDAsync(dres[l], hpin[l], LAYER_BYTES, sx));
    CK(cuStreamSynchronize(sx));
    double h2d = (double)LAYERS * LAYER_BYTES / (now() - t0) / 1e9;

    printf("# stream-mechanisms: %d layers x %zu MiB, each read %d times a step; pinned H2D %.1f GB/s\n",
           LAYERS, LAYER_BYTES >> 20, READS, h2d);
    printf("| mechanism | step ms | GB/s of distinct bytes | x bound |\n|---|---|---|---|\n");
    report("resident", run("resident", addr_res, NULL, NULL, NULL, NULL), h2d);
    report("in-place", run("in-place", addr_pin, NULL, NULL, NULL, NULL), h2d);
    for (int l = 0; l < LAYERS; l++)
        CK(cuMemFree(dres[l]));
    CK(cuMemAlloc(&slot[0], LAYER_BYTES));
    CK(cuMemAlloc(&slot[1], LAYER_BYTES));
    report("stage", run("stage", addr_slot, stage_prepare, stage_release, stage_begin, NULL), h2d);

    man = (CUdeviceptr *)calloc(LAYERS, sizeof(*man));
    for (int l = 0; l < LAYERS; l++) {
        CK(cuMemAllocManaged(&man[l], LAYER_BYTES, CU_MEM_ATTACH_GLOBAL));
        memcpy((void *)man[l], hpin[l], LAYER_BYTES);
        CK(cuMemAdvise(man[l], LAYER_BYTES, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, loc_host));
        CK(cuMemAdvise(man[l], LAYER_BYTES, CU_MEM_ADVISE_SET_ACCESSED_BY, loc_gpu));
    }
    /* stage from managed memory advised to the host: what the shim's `host`
     * placement is when the window serves it (docs/placement.md) */
    stage_from = man;
    report("stage-man", run("stage-man", addr_slot, stage_prepare, stage_release, stage_begin, NULL), h2d);
    for (int b = 16; b <= 64; b *= 2) {
        char nm[32];
        copy_blocks = b;
        snprintf(nm, sizeof(nm), "stage-k%d", b);
        report(nm, run(nm, addr_slot, stage_prepare, stage_release, stage_begin, NULL), h2d);
    }
    copy_blocks = 0;
    stage_from = NULL;
    read_mostly = false;
    report("uvm", run("uvm", addr_man, uvm_prepare, uvm_release, uvm_begin, uvm_end), h2d);
    read_mostly = true;
    report("uvm-rm", run("uvm-rm", addr_man, uvm_prepare, uvm_release, uvm_begin, uvm_end), h2d);
    for (int l = 0; l < LAYERS; l++)
        CK(cuMemFree(man[l]));
    CK(cuMemFree(slot[0]));
    CK(cuMemFree(slot[1]));

    CUmemAllocationProp hp = {}, dp = {};
    hp.type = dp.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    hp.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    hp.location.id = 0;
    dp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    dp.location.id = 0;
    CK(cuMemGetAllocationGranularity(&gran, &dp, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    va = (CUdeviceptr *)calloc(LAYERS, sizeof(*va));
    hh = (CUmemGenericAllocationHandle *)calloc(LAYERS, sizeof(*hh));
    for (int l = 0; l < LAYERS; l++) {
        CK(cuMemCreate(&hh[l], LAYER_BYTES, &hp, 0));
        CK(cuMemAddressReserve(&va[l], LAYER_BYTES, gran, 0, 0));
        map_to(va[l], hh[l]);
        CK(cuMemcpyHtoD(va[l], hpin[l], LAYER_BYTES));
    }
    for (int k = 0; k < 2; k++) {
        CK(cuMemCreate(&dh[k], LAYER_BYTES, &dp, 0));
        CK(cuMemAddressReserve(&dstage[k], LAYER_BYTES, gran, 0, 0));
        map_to(dstage[k], dh[k]);
    }
    for (int l = 0; l < LAYERS; l++)
        CK(cuEventCreate(&vcopied[l], CU_EVENT_DISABLE_TIMING));
    report("vmm", run("vmm", addr_va, vmm_prepare, vmm_release, vmm_begin, vmm_end), h2d);
    printf("\nchecksums: %s\n", bad ? "MISMATCH" : "every read of every step matched the host data");
    return bad ? 1 : 0;
}
