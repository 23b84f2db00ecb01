/* tools/woffload-calibrate.c: measures the device model (uvm/devmodel.h)
 * on the machine it runs on and writes the model file.
 *
 *   woffload-calibrate [-o FILE] [--device N] [--size MiB] [--reps N]
 *
 * GPU required. The driver API is reached with dlopen("libcuda.so.1") (the
 * project never links it); the read kernels are PTX text loaded with
 * cuModuleLoadData, so no nvcc is needed. Every figure is the median of
 * --reps runs after one warm-up. Managed memory stays below the free device
 * memory (device-facts.md's safety rule): the tool asks for at most
 * min(--size, free/4). */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cuda.h>

#include "uvm/devmodel.h"

#define X(ret, name, args) static ret(*p_##name) args;
#define CU_FUNCS                                                                                   \
    X(CUresult, cuInit, (unsigned))                                                                \
    X(CUresult, cuDeviceGet, (CUdevice *, int))                                                    \
    X(CUresult, cuDeviceGetName, (char *, int, CUdevice))                                          \
    X(CUresult, cuDeviceGetAttribute, (int *, CUdevice_attribute, CUdevice))                       \
    X(CUresult, cuDeviceTotalMem_v2, (size_t *, CUdevice))                                         \
    X(CUresult, cuDriverGetVersion, (int *))                                                       \
    X(CUresult, cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                                 \
    X(CUresult, cuCtxSetCurrent, (CUcontext))                                                      \
    X(CUresult, cuCtxSynchronize, (void))                                                          \
    X(CUresult, cuMemGetInfo_v2, (size_t *, size_t *))                                             \
    X(CUresult, cuMemAlloc_v2, (CUdeviceptr *, size_t))                                            \
    X(CUresult, cuMemFree_v2, (CUdeviceptr))                                                       \
    X(CUresult, cuMemAllocManaged, (CUdeviceptr *, size_t, unsigned))                              \
    X(CUresult, cuMemHostAlloc, (void **, size_t, unsigned))                                       \
    X(CUresult, cuMemFreeHost, (void *))                                                           \
    X(CUresult, cuMemHostGetDevicePointer_v2, (CUdeviceptr *, void *, unsigned))                   \
    X(CUresult, cuMemcpyHtoD_v2, (CUdeviceptr, const void *, size_t))                              \
    X(CUresult, cuMemcpyDtoH_v2, (void *, CUdeviceptr, size_t))                                    \
    X(CUresult, cuMemsetD8_v2, (CUdeviceptr, unsigned char, size_t))                               \
    X(CUresult, cuMemAdvise_v2, (CUdeviceptr, size_t, CUmem_advise, CUmemLocation))                \
    X(CUresult, cuMemPrefetchAsync_v2, (CUdeviceptr, size_t, CUmemLocation, unsigned, CUstream))   \
    X(CUresult, cuStreamCreate, (CUstream *, unsigned))                                            \
    X(CUresult, cuStreamSynchronize, (CUstream))                                                   \
    X(CUresult, cuModuleLoadData, (CUmodule *, const void *))                                      \
    X(CUresult, cuModuleGetFunction, (CUfunction *, CUmodule, const char *))                       \
    X(CUresult, cuLaunchKernel, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,     \
                                 unsigned, unsigned, CUstream, void **, void **))                  \
    X(CUresult, cuGetErrorName, (CUresult, const char **))
CU_FUNCS
#undef X

/* rd: streams n 16-byte words from p (grid-stride), stores only when the
 * xor of everything equals a value it never has (so no load is dropped).
 * nop: the empty kernel (launch cost). */
static const char ptx[] =
    ".version 7.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    ".visible .entry rd(.param .u64 p, .param .u64 n, .param .u64 out)\n"
    "{\n"
    "  .reg .pred %q;\n"
    "  .reg .b32 %r<5>;\n"
    "  .reg .b64 %d<16>;\n"
    "  ld.param.u64 %d1, [p];\n"
    "  ld.param.u64 %d2, [n];\n"
    "  ld.param.u64 %d3, [out];\n"
    "  mov.u32 %r1, %ctaid.x;\n"
    "  mov.u32 %r2, %ntid.x;\n"
    "  mov.u32 %r3, %tid.x;\n"
    "  mov.u32 %r4, %nctaid.x;\n"
    "  cvt.u64.u32 %d4, %r1;\n"
    "  cvt.u64.u32 %d5, %r2;\n"
    "  cvt.u64.u32 %d6, %r3;\n"
    "  cvt.u64.u32 %d7, %r4;\n"
    "  mul.lo.u64 %d8, %d4, %d5;\n"
    "  add.u64 %d8, %d8, %d6;\n"
    "  mul.lo.u64 %d9, %d7, %d5;\n"
    "  mov.u64 %d10, 0;\n"
    "LOOP:\n"
    "  setp.ge.u64 %q, %d8, %d2;\n"
    "  @%q bra DONE;\n"
    "  shl.b64 %d11, %d8, 4;\n"
    "  add.u64 %d12, %d1, %d11;\n"
    "  ld.global.v2.u64 {%d13, %d14}, [%d12];\n"
    "  xor.b64 %d10, %d10, %d13;\n"
    "  xor.b64 %d10, %d10, %d14;\n"
    "  add.u64 %d8, %d8, %d9;\n"
    "  bra LOOP;\n"
    "DONE:\n"
    "  setp.ne.u64 %q, %d10, 81985529216486895;\n"
    "  @%q bra END;\n"
    "  st.global.u64 [%d3], %d10;\n"
    "END:\n"
    "  ret;\n"
    "}\n"
    ".visible .entry nop()\n"
    "{\n"
    "  ret;\n"
    "}\n";

static int reps = 5;
static CUstream stream;
static CUfunction f_rd, f_nop;
static unsigned grid;
static CUdeviceptr out_buf;

static double now(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int check(CUresult r, const char *what)
{
    const char *n = "?";

    if (r == CUDA_SUCCESS)
        return 0;
    if (p_cuGetErrorName)
        p_cuGetErrorName(r, &n);
    fprintf(stderr, "woffload-calibrate: %s: %s (%d)\n", what, n, (int)r);
    return -1;
}

#define CK(x)                                                                                      \
    do {                                                                                           \
        if (check((x), #x) < 0)                                                                    \
            goto fail;                                                                             \
    } while (0)

static int dcmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), dcmp);
    return v[n / 2];
}

static int load_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);

    if (!h) {
        fprintf(stderr, "woffload-calibrate: no CUDA driver (%s): this tool needs a GPU\n", dlerror());
        return -1;
    }
#define X(ret, name, args)                                                                         \
    if (!(*(void **)&p_##name = dlsym(h, #name))) {                                                \
        fprintf(stderr, "woffload-calibrate: the driver lacks %s\n", #name);                       \
        return -1;                                                                                 \
    }
    CU_FUNCS
#undef X
    return 0;
}

/* Seconds one read kernel takes over n bytes at p (median). */
static double read_time(CUdeviceptr p, uint64_t n)
{
    uint64_t words = n / 16;
    void *args[] = {&p, &words, &out_buf};
    double t[64];

    for (int i = -1; i < reps; i++) {
        double t0 = now();

        if (check(p_cuLaunchKernel(f_rd, grid, 1, 1, 256, 1, 1, 0, stream, args, NULL), "launch rd") < 0 ||
            check(p_cuStreamSynchronize(stream), "sync rd") < 0)
            return -1;
        if (i >= 0)
            t[i] = now() - t0;
    }
    return median(t, reps);
}

/* Prefetch n bytes of managed p to dst in pieces: GB/s, and the mean CPU
 * time one call took to enqueue (us) in *call_us. */
static double prefetch_gbs(CUdeviceptr p, uint64_t n, uint64_t piece, CUmemLocation dst,
                           CUmemLocation back, double *call_us)
{
    double t[64], c[64];

    for (int i = -1; i < reps; i++) {
        double t0, tq = 0;
        uint64_t calls = 0;

        /* start from the other side each time */
        if (check(p_cuMemPrefetchAsync_v2(p, n, back, 0, stream), "prefetch back") < 0 ||
            check(p_cuStreamSynchronize(stream), "sync") < 0)
            return -1;
        t0 = now();
        for (uint64_t o = 0; o < n; o += piece) {
            double q0 = now();

            if (check(p_cuMemPrefetchAsync_v2(p + o, WO_MIN(piece, n - o), dst, 0, stream), "prefetch") < 0)
                return -1;
            tq += now() - q0;
            calls++;
        }
        if (check(p_cuStreamSynchronize(stream), "sync") < 0)
            return -1;
        if (i >= 0) {
            t[i] = (double)n / (now() - t0) / 1e9;
            c[i] = tq / (double)calls * 1e6;
        }
    }
    if (call_us)
        *call_us = median(c, reps);
    return median(t, reps);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: woffload-calibrate [-o FILE] [--device N] [--size MiB] [--reps N]\n"
               "Measures the device model of this machine's GPU (docs/replay.md) and writes\n"
               "it to FILE (default: standard output). Needs a GPU and its driver.\n"
               "Exit status: 0 success; 2 usage error; 1 failure (no driver or GPU, a CUDA\n"
               "call failed, FILE cannot be written).\n");
}

int main(int argc, char **argv)
{
    const char *outp = NULL;
    int ordinal = 0, sms = 0, ver = 0;
    uint64_t size = 1024 * WO_MiB;
    struct wo_devmodel m;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUdeviceptr d = 0, zc_d = 0, mg = 0;
    void *h = NULL;
    size_t fr = 0, tot = 0;
    char gpu[128] = "?";
    CUmemLocation gpuloc, hostloc = {CU_MEM_LOCATION_TYPE_HOST, 0};
    double t, v[96], managed_remote_gbs = 0;
    time_t now_t = time(NULL);
    struct tm tmv;
    char date[32];
    FILE *f;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            usage(stderr);
            return 2;
        }
        if (strcmp(argv[i], "-o") == 0)
            outp = argv[++i];
        else if (strcmp(argv[i], "--device") == 0)
            ordinal = atoi(argv[++i]);
        else if (strcmp(argv[i], "--size") == 0)
            size = (uint64_t)strtoull(argv[++i], NULL, 10) * WO_MiB;
        else if (strcmp(argv[i], "--reps") == 0) {
            int n = atoi(argv[++i]);

            reps = WO_MAX(1, WO_MIN(n, 31)); /* v[] holds three series of 32 */
        }
        else {
            usage(stderr);
            return 2;
        }
    }
    if (size < 64 * WO_MiB) {
        fprintf(stderr, "woffload-calibrate: --size must be at least 64 MiB\n");
        return 2;
    }
    if (load_driver() < 0)
        return 1;
    wo_devmodel_default(&m);
    CK(p_cuInit(0));
    CK(p_cuDeviceGet(&dev, ordinal));
    CK(p_cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(p_cuCtxSetCurrent(ctx));
    CK(p_cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    p_cuDeviceGetName(gpu, sizeof(gpu), dev);
    p_cuDriverGetVersion(&ver);
    CK(p_cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    grid = (unsigned)sms * 8;
    CK(p_cuDeviceTotalMem_v2(&tot, dev));
    CK(p_cuMemGetInfo_v2(&fr, &tot));
    m.device_bytes = tot;
    /* the safety rule: managed memory well below what is free */
    size = WO_MIN(size, (uint64_t)fr / 4) & ~(2 * WO_MiB - 1);
    gpuloc = (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, dev};
    CK(p_cuModuleLoadData(&mod, ptx));
    CK(p_cuModuleGetFunction(&f_rd, mod, "rd"));
    CK(p_cuModuleGetFunction(&f_nop, mod, "nop"));
    CK(p_cuMemAlloc_v2(&out_buf, 64));

    /* device memory: kernel streaming read */
    CK(p_cuMemAlloc_v2(&d, size));
    CK(p_cuMemsetD8_v2(d, 1, size));
    CK(p_cuCtxSynchronize());
    t = read_time(d, size);
    if (t <= 0)
        goto fail;
    m.hbm_gbs = (double)size / t / 1e9;

    /* pinned host memory: copies and zero-copy reads */
    CK(p_cuMemHostAlloc(&h, size, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    memset(h, 3, size);
    CK(p_cuMemHostGetDevicePointer_v2(&zc_d, h, 0));
    for (int i = -1; i < reps; i++) {
        double t0 = now();

        CK(p_cuMemcpyHtoD_v2(d, h, size));
        if (i >= 0)
            v[i] = (double)size / (now() - t0) / 1e9;
    }
    m.h2d_gbs = median(v, reps);
    for (int i = -1; i < reps; i++) {
        double t0 = now();

        CK(p_cuMemcpyDtoH_v2(h, d, size));
        if (i >= 0)
            v[i] = (double)size / (now() - t0) / 1e9;
    }
    m.d2h_gbs = median(v, reps);
    t = read_time(zc_d, size);
    if (t <= 0)
        goto fail;
    m.zc_gbs = (double)size / t / 1e9;

    /* launch: enqueue cost of the empty kernel, and its GPU time back to back */
    {
        const int n = 2000;
        double t0, t1;

        CK(p_cuLaunchKernel(f_nop, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL));
        CK(p_cuStreamSynchronize(stream));
        t0 = now();
        for (int i = 0; i < n; i++)
            CK(p_cuLaunchKernel(f_nop, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL));
        t1 = now();
        CK(p_cuStreamSynchronize(stream));
        m.launch_us = (t1 - t0) / n * 1e6;
        m.kernel_us = (now() - t0) / n * 1e6;
        for (int i = -1; i < reps; i++) {
            t0 = now();
            CK(p_cuStreamSynchronize(stream));
            if (i >= 0)
                v[i] = (now() - t0) * 1e6;
        }
        /* the floor between a sync and the next launch: the sync's return
         * plus one launch */
        m.sync_us = median(v, reps) + m.launch_us;
    }

    /* managed memory: preferred host + accessed-by GPU, as uvm/ places it */
    CK(p_cuMemAllocManaged(&mg, size, CU_MEM_ATTACH_GLOBAL));
    memset((void *)mg, 5, size);
    CK(p_cuMemAdvise_v2(mg, size, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, hostloc));
    CK(p_cuMemAdvise_v2(mg, size, CU_MEM_ADVISE_SET_ACCESSED_BY, gpuloc));
    /* a managed miss: the kernel reads host-resident managed memory in
     * place (accessed-by); the model charges misses zc_gbs, this checks it */
    CK(p_cuMemPrefetchAsync_v2(mg, size, hostloc, 0, stream));
    CK(p_cuStreamSynchronize(stream));
    t = read_time(mg, size);
    if (t <= 0)
        goto fail;
    managed_remote_gbs = (double)size / t / 1e9;
    {
        static const uint64_t pieces[4] = {2 * WO_MiB, 16 * WO_MiB, 64 * WO_MiB, WO_GiB};
        double cu2 = 0;

        for (int k = 0; k < 4; k++) {
            double r = prefetch_gbs(mg, size, WO_MIN(pieces[k], size), gpuloc, hostloc,
                                    k == 0 ? &cu2 : NULL);

            if (r <= 0)
                goto fail;
            m.pf_gbs[k] = r;
        }
        /* the call's own CPU cost: 2 MiB calls are enqueue-bound */
        m.pf_call_us = cu2;
        /* copy-back: GPU -> host in 64 MiB pieces */
        m.copyback_gbs = prefetch_gbs(mg, size, 64 * WO_MiB, hostloc, gpuloc, NULL);
        if (m.copyback_gbs <= 0)
            goto fail;
    }
    /* read-mostly: the duplicate, then the collapse that drops it */
    CK(p_cuMemPrefetchAsync_v2(mg, size, hostloc, 0, stream));
    CK(p_cuStreamSynchronize(stream));
    CK(p_cuMemAdvise_v2(mg, size, CU_MEM_ADVISE_SET_READ_MOSTLY, gpuloc));
    for (int i = -1; i < reps; i++) {
        double t0, t1;

        t0 = now();
        CK(p_cuMemPrefetchAsync_v2(mg, size, gpuloc, 0, stream));
        CK(p_cuStreamSynchronize(stream));
        t1 = now();
        if (i >= 0)
            v[i] = (double)size / (t1 - t0) / 1e9;
        /* collapse in 64 MiB pieces (uvm/prefetch.c's way), then set again */
        t0 = now();
        for (uint64_t o = 0; o < size; o += 64 * WO_MiB)
            CK(p_cuMemAdvise_v2(mg + o, WO_MIN(64 * WO_MiB, size - o), CU_MEM_ADVISE_UNSET_READ_MOSTLY, gpuloc));
        t1 = now();
        if (i >= 0)
            v[32 + i] = (double)size / (t1 - t0) / 1e9;
        /* the collapsed pieces mapped for the GPU again, as the executor
         * does after each collapse (make_plain): the rest of an eviction's
         * cost, which the planner's cost rule charges (remap_gbs) */
        t0 = now();
        for (uint64_t o = 0; o < size; o += 64 * WO_MiB)
            CK(p_cuMemAdvise_v2(mg + o, WO_MIN(64 * WO_MiB, size - o),
                                CU_MEM_ADVISE_SET_ACCESSED_BY, gpuloc));
        t1 = now();
        if (i >= 0)
            v[64 + i] = (double)size / (t1 - t0) / 1e9;
        CK(p_cuMemAdvise_v2(mg, size, CU_MEM_ADVISE_SET_READ_MOSTLY, gpuloc));
    }
    m.rm_pf_gbs = median(v, reps);
    m.collapse_gbs = median(v + 32, reps);
    m.remap_gbs = median(v + 64, reps);
    /* the data survived the collapses (bit-exact placement) */
    {
        const unsigned char *c = (const unsigned char *)mg;

        for (uint64_t o = 0; o < size; o += 4096)
            if (c[o] != 5) {
                fprintf(stderr, "woffload-calibrate: managed data changed at offset %llu after collapse\n",
                        (unsigned long long)o);
                goto fail;
            }
    }
    /* one small advice call */
    for (int i = -1; i < reps; i++) {
        double t0 = now();

        CK(p_cuMemAdvise_v2(mg + (uint64_t)(i + 1) * 2 * WO_MiB, 2 * WO_MiB,
                            CU_MEM_ADVISE_SET_PREFERRED_LOCATION, hostloc));
        if (i >= 0)
            v[i] = (now() - t0) * 1e6;
    }
    m.advise_us = median(v, reps);

    gmtime_r(&now_t, &tmv);
    strftime(date, sizeof(date), "%Y-%m-%d", &tmv);
    snprintf(m.name, sizeof(m.name), "woffload-calibrate: %s, driver %d.%d, %d SMs, %llu MiB test size, %s",
             gpu, ver / 1000, (ver % 1000) / 10, sms, (unsigned long long)(size >> 20), date);
    f = outp ? fopen(outp, "w") : stdout;
    if (!f) {
        perror(outp);
        goto fail;
    }
    if (wo_devmodel_write(f, &m) < 0 || (outp && fclose(f) != 0)) {
        fprintf(stderr, "woffload-calibrate: %s: write failed\n", outp ? outp : "stdout");
        goto fail;
    }
    fprintf(stderr,
            "%s\n  hbm %.0f GB/s, zero-copy %.1f GB/s, copy H2D %.1f / D2H %.1f GB/s\n"
            "  prefetch 2M/16M/64M/1G %.1f / %.1f / %.1f / %.1f GB/s, %.0f us a 2 MiB call\n"
            "  read-mostly prefetch %.1f GB/s, collapse %.1f GB/s (%.1f ms/GiB), remap %.1f GB/s, "
            "copy-back %.1f GB/s\n"
            "  launch %.2f us, kernel %.2f us, sync floor %.1f us, advise %.1f us\n"
            "  (not in the model) managed memory read in place, as a miss: %.1f GB/s\n",
            m.name, m.hbm_gbs, m.zc_gbs, m.h2d_gbs, m.d2h_gbs, m.pf_gbs[0], m.pf_gbs[1],
            m.pf_gbs[2], m.pf_gbs[3], m.pf_call_us, m.rm_pf_gbs, m.collapse_gbs,
            1.073741824 / m.collapse_gbs * 1e3, m.remap_gbs, m.copyback_gbs, m.launch_us,
            m.kernel_us, m.sync_us, m.advise_us, managed_remote_gbs);
    return 0;
fail:
    return 1;
}
