/* tests/fake/probe-driver.c: asks a CUDA driver (whatever libcuda.so.1 the
 * loader finds) the questions the fake must answer like the real one:
 * cuGetProcAddress results and statuses, what "cuGetProcAddress" and the
 * per-thread flag resolve to, init/context errors, capture rules, managed-
 * only advise/prefetch, pointer attributes, error names, fork. Prints one
 * "key value" line per answer, sorted by nothing but program order.
 *
 * Run once on the lent GPU (the output is kept as probe-real.txt) and in CI
 * against the fake (test fake-probe-parity compares the two). */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void *lib;

#define SYM(type, name) ((type)dlsym(lib, name))
#define OUT(key, ...)                                                                              \
    do {                                                                                           \
        printf("%s ", key);                                                                        \
        printf(__VA_ARGS__);                                                                       \
        putchar('\n');                                                                             \
        fflush(stdout);                                                                            \
    } while (0)

typedef CUresult (*gpa_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
static gpa_t gpa;

/* Which exported symbol a resolved pointer is, among candidates. */
static const char *which(void *p, const char *const *names)
{
    if (!p)
        return "NULL";
    for (; *names; names++)
        if (dlsym(lib, *names) == p)
            return *names;
    return "other";
}

static void proc(const char *key, const char *name, int ver, cuuint64_t flags,
                 const char *const *cands)
{
    void *p = (void *)1;
    CUdriverProcAddressQueryResult st = 77;
    CUresult r = gpa(name, &p, ver, flags, &st);
    OUT(key, "rc=%d status=%d fn=%s", (int)r, (int)st, which(p, cands));
}

static CUcontext ctx;

static void *thread_alloc(void *arg)
{
    CUdeviceptr p = 0;
    CUresult r = SYM(CUresult(*)(CUdeviceptr *, size_t), "cuMemAlloc_v2")(&p, 256);
    if (r == CUDA_SUCCESS)
        SYM(CUresult(*)(CUdeviceptr), "cuMemFree_v2")(p);
    *(CUresult *)arg = r;
    return NULL;
}

static void *thread_alloc_ctx(void *arg)
{
    SYM(CUresult(*)(CUcontext), "cuCtxSetCurrent")(ctx);
    return thread_alloc(arg);
}

/* Round 3: what another thread (global capture mode, its own non-blocking
 * stream) may do while the main thread captures in global mode: the calls a
 * prefetch thread makes. Each op runs in a fresh capture; the capture's end
 * says whether it survived. */
struct r3 {
    int op;
    CUresult rc;
    CUdeviceptr managed, dev;
    void *pinned;
};

static void *r3_thread(void *arg)
{
    struct r3 *a = arg;
    CUstream st = NULL;
    CUevent ev = NULL;
    CUmemLocation dev0 = { CU_MEM_LOCATION_TYPE_DEVICE, 0 };
    CUdeviceptr x = 0;
    void *hp = NULL;
    char hb[64] = { 0 };
    SYM(CUresult(*)(CUcontext), "cuCtxSetCurrent")(ctx);
    SYM(CUresult(*)(CUstream *, unsigned), "cuStreamCreate")(&st, CU_STREAM_NON_BLOCKING);
    SYM(CUresult(*)(CUevent *, unsigned), "cuEventCreate")(&ev, CU_EVENT_DISABLE_TIMING);
    switch (a->op) {
    case 0: a->rc = SYM(CUresult(*)(CUdeviceptr, size_t, CUmem_advise, CUmemLocation), "cuMemAdvise_v2")(
                a->managed, 4096, CU_MEM_ADVISE_SET_ACCESSED_BY, dev0); break;
    case 1: a->rc = SYM(CUresult(*)(CUdeviceptr, size_t, CUmemLocation, unsigned, CUstream), "cuMemPrefetchAsync_v2")(
                a->managed, 4096, dev0, 0, st); break;
    case 2: a->rc = SYM(CUresult(*)(CUevent, CUstream), "cuEventRecord")(ev, st); break;
    case 3:
        SYM(CUresult(*)(CUevent, CUstream), "cuEventRecord")(ev, st);
        a->rc = SYM(CUresult(*)(CUevent), "cuEventQuery")(ev); break;
    case 4:
        SYM(CUresult(*)(CUevent, CUstream), "cuEventRecord")(ev, st);
        a->rc = SYM(CUresult(*)(CUevent), "cuEventSynchronize")(ev); break;
    case 5: a->rc = SYM(CUresult(*)(CUstream), "cuStreamSynchronize")(st); break;
    case 6: a->rc = SYM(CUresult(*)(CUstream), "cuStreamQuery")(st); break;
    case 7: a->rc = SYM(CUresult(*)(CUdeviceptr, const void *, size_t, CUstream), "cuMemcpyHtoDAsync_v2")(
                a->dev, hb, 16, st); break;
    case 8: a->rc = SYM(CUresult(*)(CUdeviceptr *, size_t, unsigned), "cuMemAllocManaged")(&x, 4096, CU_MEM_ATTACH_GLOBAL);
        if (!a->rc) SYM(CUresult(*)(CUdeviceptr), "cuMemFree_v2")(x);
        break;
    case 9: a->rc = SYM(CUresult(*)(void **, size_t, unsigned), "cuMemHostAlloc")(&hp, 4096, 0);
        if (!a->rc) SYM(CUresult(*)(void *), "cuMemFreeHost")(hp);
        break;
    case 10: a->rc = SYM(CUresult(*)(CUdeviceptr), "cuMemFree_v2")(a->dev); break;
    case 11: a->rc = SYM(CUresult(*)(void *), "cuMemFreeHost")(a->pinned); break;
    case 12: {
        static char region[1 << 14] __attribute__((aligned(4096)));
        a->rc = SYM(CUresult(*)(void *, size_t, unsigned), "cuMemHostRegister_v2")(region, sizeof(region), 0);
        if (!a->rc) SYM(CUresult(*)(void *), "cuMemHostUnregister")(region);
        break;
    }
    case 13: a->rc = SYM(CUresult(*)(CUdeviceptr, unsigned char, size_t, CUstream), "cuMemsetD8Async")(a->dev, 0, 16, st); break;
    case 14: {
        CUstream s2 = NULL;
        a->rc = SYM(CUresult(*)(CUstream *, unsigned), "cuStreamCreate")(&s2, CU_STREAM_NON_BLOCKING);
        if (!a->rc) SYM(CUresult(*)(CUstream), "cuStreamDestroy_v2")(s2);
        break;
    }
    case 15: a->rc = SYM(CUresult(*)(CUdeviceptr *, size_t, CUstream), "cuMemAllocAsync")(&x, 4096, st);
        if (!a->rc) SYM(CUresult(*)(CUdeviceptr, CUstream), "cuMemFreeAsync")(x, st);
        break;
    case 16: a->rc = SYM(CUresult(*)(void *, CUdeviceptr, size_t), "cuMemcpyDtoH_v2")(hb, a->dev, 16); break;
    case 17: a->rc = SYM(CUresult(*)(void *, CUdeviceptr, size_t), "cuMemcpyDtoH_v2_ptds")(hb, a->dev, 16); break;
    case 18: a->rc = SYM(CUresult(*)(CUdeviceptr *, size_t), "cuMemAlloc_v2")(&x, 4096);
        if (!a->rc) SYM(CUresult(*)(CUdeviceptr), "cuMemFree_v2")(x);
        break;
    case 19: a->rc = SYM(CUresult(*)(CUstream), "cuStreamSynchronize")(NULL); break;
    case 20: a->rc = SYM(CUresult(*)(void), "cuCtxSynchronize")(); break;
    case 21: {
        CUmemLocation host = { CU_MEM_LOCATION_TYPE_HOST, 0 };
        a->rc = SYM(CUresult(*)(CUdeviceptr, size_t, CUmemLocation, unsigned, CUstream), "cuMemPrefetchAsync_v2")(
            a->managed, 4096, host, 0, st);
        break;
    }
    default: a->rc = (CUresult)-1; break;
    }
    SYM(CUresult(*)(CUevent), "cuEventDestroy_v2")(ev);
    SYM(CUresult(*)(CUstream), "cuStreamDestroy_v2")(st);
    return NULL;
}

static const char *const r3_names[] = {
    "advise", "prefetch_own_stream", "event_record_own", "event_query_own", "event_sync_own",
    "stream_sync_own", "stream_query_own", "htod_async_own", "alloc_managed", "host_alloc",
    "mem_free", "free_host", "host_register", "memset_async_own", "stream_create",
    "alloc_async_own", "dtoh_sync", "dtoh_sync_ptds", "mem_alloc", "stream_sync_legacy",
    "ctx_sync", "prefetch_to_host_own", NULL,
};

int main(void)
{
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        OUT("dlopen", "fail %s", dlerror());
        return 1;
    }
    gpa = SYM(gpa_t, "cuGetProcAddress_v2");
    if (!gpa)
        return 1;
    CUresult (*mem_alloc)(CUdeviceptr *, size_t) = SYM(CUresult(*)(CUdeviceptr *, size_t), "cuMemAlloc_v2");
    CUresult (*mem_free)(CUdeviceptr) = SYM(CUresult(*)(CUdeviceptr), "cuMemFree_v2");
    CUdeviceptr d = 0;

    OUT("alloc_before_init", "rc=%d", (int)mem_alloc(&d, 256));

    static const char *const c_gpa[] = { "cuGetProcAddress", "cuGetProcAddress_v2", NULL };
    static const char *const c_lk[] = { "cuLaunchKernel", "cuLaunchKernel_ptsz", NULL };
    static const char *const c_alloc[] = { "cuMemAlloc", "cuMemAlloc_v2", NULL };
    static const char *const c_htod[] = { "cuMemcpyHtoD", "cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds", NULL };
    static const char *const c_sync[] = { "cuCtxSynchronize", "cuCtxSynchronize_v2", NULL };
    static const char *const c_info[] = { "cuStreamGetCaptureInfo", "cuStreamGetCaptureInfo_v2",
                                          "cuStreamGetCaptureInfo_v3", "cuStreamGetCaptureInfo_v2_ptsz",
                                          "cuStreamGetCaptureInfo_v3_ptsz", NULL };
    static const char *const c_inst[] = { "cuGraphInstantiate", "cuGraphInstantiate_v2",
                                          "cuGraphInstantiateWithFlags", NULL };
    static const char *const c_pf[] = { "cuMemPrefetchAsync", "cuMemPrefetchAsync_v2",
                                        "cuMemPrefetchAsync_ptsz", "cuMemPrefetchAsync_v2_ptsz", NULL };
    static const char *const c_none[] = { NULL };
    proc("proc_gpa_13000", "cuGetProcAddress", 13000, 0, c_gpa);
    proc("proc_gpa_11030", "cuGetProcAddress", 11030, 0, c_gpa);
    proc("proc_launch_f0", "cuLaunchKernel", 13000, 0, c_lk);
    proc("proc_launch_f2", "cuLaunchKernel", 13000, 2, c_lk);
    proc("proc_launch_f1", "cuLaunchKernel", 13000, 1, c_lk);
    proc("proc_alloc_f2", "cuMemAlloc", 13000, 2, c_alloc);
    proc("proc_alloc_3020", "cuMemAlloc", 3020, 0, c_alloc);
    proc("proc_htod_f2", "cuMemcpyHtoD", 13000, 2, c_htod);
    proc("proc_ctxsync_13000", "cuCtxSynchronize", 13000, 0, c_sync);
    proc("proc_ctxsync_12000", "cuCtxSynchronize", 12000, 0, c_sync);
    proc("proc_captureinfo_12030", "cuStreamGetCaptureInfo", 12030, 0, c_info);
    proc("proc_captureinfo_11030_f2", "cuStreamGetCaptureInfo", 11030, 2, c_info);
    proc("proc_instantiate_12000", "cuGraphInstantiate", 12000, 0, c_inst);
    proc("proc_prefetch_12020_f2", "cuMemPrefetchAsync", 12020, 2, c_pf);
    proc("proc_unknown", "cuNoSuchFunction", 13000, 0, c_none);
    proc("proc_abi_name", "cuMemAlloc_v2", 13000, 0, c_alloc);
    proc("proc_too_old", "cuFuncGetParamInfo", 12000, 0, c_none);
    proc("proc_bad_flags", "cuMemAlloc", 13000, 8, c_alloc);
    {
        void *p = (void *)1;
        CUresult r = gpa("cuNoSuchFunction", &p, 13000, 0, NULL);
        OUT("proc_unknown_null_status", "rc=%d fn=%s", (int)r, p ? "set" : "NULL");
    }

    CUresult (*init)(unsigned) = SYM(CUresult(*)(unsigned), "cuInit");
    OUT("init", "rc=%d", (int)init(0));
    int ver = 0;
    SYM(CUresult(*)(int *), "cuDriverGetVersion")(&ver);
    OUT("driver_version_at_least_13000", "%d", ver >= 13000);
    OUT("alloc_no_ctx", "rc=%d", (int)mem_alloc(&d, 256));
    CUdevice dev;
    SYM(CUresult(*)(CUdevice *, int), "cuDeviceGet")(&dev, 0);
    SYM(CUresult(*)(CUcontext *, CUdevice), "cuDevicePrimaryCtxRetain")(&ctx, dev);
    SYM(CUresult(*)(CUcontext), "cuCtxSetCurrent")(ctx);
    {
        CUresult r = CUDA_SUCCESS;
        pthread_t t;
        pthread_create(&t, NULL, thread_alloc, &r);
        pthread_join(t, NULL);
        OUT("alloc_other_thread_no_ctx", "rc=%d", (int)r);
    }
    OUT("alloc_zero", "rc=%d", (int)mem_alloc(&d, 0));
    OUT("free_zero", "rc=%d", (int)mem_free(0));
    OUT("alloc", "rc=%d", (int)mem_alloc(&d, 1 << 20));
    OUT("free_twice_first", "rc=%d", (int)mem_free(d));
    OUT("free_twice_second", "rc=%d", (int)mem_free(d));
    mem_alloc(&d, 1 << 20);

    /* Memory kinds and attributes. */
    CUdeviceptr m = 0;
    void *h = NULL;
    OUT("alloc_managed", "rc=%d",
        (int)SYM(CUresult(*)(CUdeviceptr *, size_t, unsigned), "cuMemAllocManaged")(&m, 1 << 20, CU_MEM_ATTACH_GLOBAL));
    OUT("host_alloc", "rc=%d", (int)SYM(CUresult(*)(void **, size_t, unsigned), "cuMemHostAlloc")(&h, 1 << 16, 0));
    CUresult (*pga)(void *, CUpointer_attribute, CUdeviceptr) =
        SYM(CUresult(*)(void *, CUpointer_attribute, CUdeviceptr), "cuPointerGetAttribute");
    unsigned char buf[8];
    memset(buf, 0xff, sizeof(buf));
    CUresult r = pga(buf, CU_POINTER_ATTRIBUTE_IS_MANAGED, m);
    OUT("is_managed_bytes", "rc=%d %02x %02x %02x %02x %02x", (int)r, buf[0], buf[1], buf[2], buf[3], buf[4]);
    memset(buf, 0xff, sizeof(buf));
    r = pga(buf, CU_POINTER_ATTRIBUTE_MAPPED, d);
    OUT("mapped_bytes", "rc=%d %02x %02x %02x %02x %02x", (int)r, buf[0], buf[1], buf[2], buf[3], buf[4]);
    unsigned int type = 99;
    r = pga(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d);
    OUT("memtype_device", "rc=%d type=%u", (int)r, type);
    type = 99;
    r = pga(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, m);
    OUT("memtype_managed", "rc=%d type=%u", (int)r, type);
    type = 99;
    r = pga(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)h);
    OUT("memtype_host", "rc=%d type=%u", (int)r, type);
    int local = 0;
    type = 99;
    r = pga(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)&local);
    OUT("memtype_pageable", "rc=%d type=%u", (int)r, type);
    void *hp = (void *)1;
    OUT("host_pointer_of_device", "rc=%d", (int)pga(&hp, CU_POINTER_ATTRIBUTE_HOST_POINTER, d));
    {
        CUpointer_attribute a[] = { CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_CONTEXT };
        CUcontext c = (CUcontext)1;
        type = 99;
        void *data[] = { &type, &c };
        r = SYM(CUresult(*)(unsigned, CUpointer_attribute *, void **, CUdeviceptr), "cuPointerGetAttributes")(
            2, a, data, (CUdeviceptr)(uintptr_t)&local);
        OUT("attrs_pageable", "rc=%d type=%u ctx=%s", (int)r, type, c ? "set" : "NULL");
    }
    CUdeviceptr dp = 0;
    OUT("host_dev_ptr_of_device", "rc=%d",
        (int)SYM(CUresult(*)(CUdeviceptr *, void *, unsigned), "cuMemHostGetDevicePointer_v2")(&dp, (void *)(uintptr_t)d, 0));

    CUmemLocation dev0 = { CU_MEM_LOCATION_TYPE_DEVICE, 0 };
    CUresult (*advise)(CUdeviceptr, size_t, CUmem_advise, CUmemLocation) =
        SYM(CUresult(*)(CUdeviceptr, size_t, CUmem_advise, CUmemLocation), "cuMemAdvise_v2");
    CUresult (*prefetch)(CUdeviceptr, size_t, CUmemLocation, unsigned, CUstream) =
        SYM(CUresult(*)(CUdeviceptr, size_t, CUmemLocation, unsigned, CUstream), "cuMemPrefetchAsync_v2");
    OUT("advise_device_mem", "rc=%d", (int)advise(d, 4096, CU_MEM_ADVISE_SET_READ_MOSTLY, dev0));
    OUT("advise_managed", "rc=%d", (int)advise(m, 4096, CU_MEM_ADVISE_SET_READ_MOSTLY, dev0));
    OUT("prefetch_device_mem", "rc=%d", (int)prefetch(d, 4096, dev0, 0, NULL));
    OUT("prefetch_managed", "rc=%d", (int)prefetch(m, 4096, dev0, 0, NULL));
    OUT("prefetch_flags", "rc=%d", (int)prefetch(m, 4096, dev0, 1, NULL));
    OUT("prefetch_past_end", "rc=%d", (int)prefetch(m, (2 << 20), dev0, 0, NULL));
    {
        CUmemLocation bad = { CU_MEM_LOCATION_TYPE_DEVICE, 7 };
        OUT("prefetch_bad_device", "rc=%d", (int)prefetch(m, 4096, bad, 0, NULL));
    }
    {
        int v = 0;
        OUT("range_attr_device_mem", "rc=%d",
            (int)SYM(CUresult(*)(void *, size_t, CUmem_range_attribute, CUdeviceptr, size_t), "cuMemRangeGetAttribute")(
                &v, 4, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, d, 4096));
    }
    char hb[64] = { 0 };
    CUresult (*htod)(CUdeviceptr, const void *, size_t) =
        SYM(CUresult(*)(CUdeviceptr, const void *, size_t), "cuMemcpyHtoD_v2");
    OUT("htod_to_pageable", "rc=%d", (int)htod((CUdeviceptr)(uintptr_t)hb, hb, 16));
    OUT("htod_past_end", "rc=%d", (int)htod(d + (1 << 20) - 8, hb, 16));
    OUT("memset32_misaligned", "rc=%d",
        (int)SYM(CUresult(*)(CUdeviceptr, unsigned, size_t), "cuMemsetD32_v2")(d + 2, 0, 4));

    /* Capture. */
    CUstream s = NULL, sb = NULL;
    CUresult (*screate)(CUstream *, unsigned) = SYM(CUresult(*)(CUstream *, unsigned), "cuStreamCreate");
    CUresult (*begin)(CUstream, CUstreamCaptureMode) = SYM(CUresult(*)(CUstream, CUstreamCaptureMode), "cuStreamBeginCapture_v2");
    CUresult (*end)(CUstream, CUgraph *) = SYM(CUresult(*)(CUstream, CUgraph *), "cuStreamEndCapture");
    CUresult (*ssync)(CUstream) = SYM(CUresult(*)(CUstream), "cuStreamSynchronize");
    CUresult (*memsetAsync)(CUdeviceptr, unsigned char, size_t, CUstream) =
        SYM(CUresult(*)(CUdeviceptr, unsigned char, size_t, CUstream), "cuMemsetD8Async");
    CUresult (*xmode)(CUstreamCaptureMode *) = SYM(CUresult(*)(CUstreamCaptureMode *), "cuThreadExchangeStreamCaptureMode");
    screate(&s, CU_STREAM_NON_BLOCKING);
    screate(&sb, 0);
    CUgraph g = NULL;
    OUT("capture_legacy", "rc=%d", (int)begin(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OUT("capture_begin", "rc=%d", (int)begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OUT("capture_begin_twice", "rc=%d", (int)begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    OUT("capture_memset_async", "rc=%d", (int)memsetAsync(d, 1, 16, s));
    OUT("capture_alloc_same_thread", "rc=%d", (int)mem_alloc(&dp, 256));
    {
        CUstreamCaptureStatus st = 9;
        SYM(CUresult(*)(CUstream, CUstreamCaptureStatus *), "cuStreamIsCapturing")(s, &st);
        OUT("capture_status_after_alloc", "%d", (int)st);
    }
    g = (CUgraph)1;
    r = end(s, &g);
    OUT("capture_end_invalidated", "rc=%d graph=%s", (int)r, g ? "set" : "NULL");
    OUT("capture_end_not_capturing", "rc=%d", (int)end(s, &g));

    begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
    {
        CUresult tr = CUDA_SUCCESS;
        pthread_t t;
        pthread_create(&t, NULL, thread_alloc_ctx, &tr);
        pthread_join(t, NULL);
        OUT("capture_alloc_other_thread", "rc=%d", (int)tr);
    }
    OUT("capture_end_after_other", "rc=%d", (int)end(s, &g));

    begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
    {
        CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
        xmode(&mode);
        OUT("capture_alloc_relaxed_thread", "rc=%d", (int)mem_alloc(&dp, 256));
        if (dp)
            mem_free(dp);
        xmode(&mode);
    }
    OUT("capture_sync_capturing", "rc=%d", (int)ssync(s));
    OUT("capture_end_after_sync", "rc=%d", (int)end(s, &g));

    begin(sb, CU_STREAM_CAPTURE_MODE_RELAXED);
    OUT("capture_legacy_use", "rc=%d", (int)memsetAsync(d, 1, 16, NULL));
    OUT("capture_end_after_legacy", "rc=%d", (int)end(sb, &g));
    begin(s, CU_STREAM_CAPTURE_MODE_RELAXED);
    OUT("capture_nb_legacy_use", "rc=%d", (int)memsetAsync(d, 1, 16, NULL));
    g = NULL;
    r = end(s, &g);
    OUT("capture_end_nb", "rc=%d", (int)r);
    if (g)
        SYM(CUresult(*)(CUgraph), "cuGraphDestroy")(g);

    {
        const char *str = (const char *)1;
        r = SYM(CUresult(*)(CUresult, const char **), "cuGetErrorName")((CUresult)12345, &str);
        OUT("error_name_unknown", "rc=%d str=%s", (int)r, str ? "set" : "NULL");
        SYM(CUresult(*)(CUresult, const char **), "cuGetErrorName")(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, &str);
        OUT("error_name_904", "%s", str);
    }
    {
        CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                     .location = { CU_MEM_LOCATION_TYPE_DEVICE, 0 } };
        size_t gsz = 0;
        r = SYM(CUresult(*)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags),
                "cuMemGetAllocationGranularity")(&gsz, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        OUT("vmm_granularity", "rc=%d %zu", (int)r, gsz);
    }

    /* Round 2. */
    proc("proc_instantiate_13000", "cuGraphInstantiate", 13000, 0, c_inst);
    proc("proc_instantiate_wf_13000", "cuGraphInstantiateWithFlags", 13000, 0, c_inst);
    proc("proc_alloc_future", "cuMemAlloc", 99000, 0, c_alloc);
    {
        CUresult (*hreg)(void *, size_t, unsigned) = SYM(CUresult(*)(void *, size_t, unsigned), "cuMemHostRegister_v2");
        CUresult (*hunreg)(void *) = SYM(CUresult(*)(void *), "cuMemHostUnregister");
        static char region[1 << 16] __attribute__((aligned(4096)));
        OUT("host_register", "rc=%d", (int)hreg(region, sizeof(region), 0));
        OUT("host_register_twice", "rc=%d", (int)hreg(region, sizeof(region), 0));
        OUT("host_register_pinned", "rc=%d", (int)hreg(h, 4096, 0));
        OUT("host_unregister", "rc=%d", (int)hunreg(region));
        OUT("host_unregister_twice", "rc=%d", (int)hunreg(region));
        OUT("host_alloc_bad_flags", "rc=%d",
            (int)SYM(CUresult(*)(void **, size_t, unsigned), "cuMemHostAlloc")(&hp, 4096, 0x40));
        OUT("free_host_device_ptr", "rc=%d", (int)SYM(CUresult(*)(void *), "cuMemFreeHost")((void *)(uintptr_t)d));
        OUT("free_pinned_with_memfree", "rc=%d", (int)mem_free((CUdeviceptr)(uintptr_t)h));
        CUdeviceptr b = 0;
        size_t sz = 0;
        OUT("address_range_pinned", "rc=%d",
            (int)SYM(CUresult(*)(CUdeviceptr *, size_t *, CUdeviceptr), "cuMemGetAddressRange_v2")(&b, &sz, (CUdeviceptr)(uintptr_t)h));
        OUT("managed_flags_0", "rc=%d",
            (int)SYM(CUresult(*)(CUdeviceptr *, size_t, unsigned), "cuMemAllocManaged")(&b, 4096, 0));
        OUT("memset8_pageable_n0", "rc=%d",
            (int)SYM(CUresult(*)(CUdeviceptr, unsigned char, size_t), "cuMemsetD8_v2")((CUdeviceptr)(uintptr_t)hb, 0, 0));
        OUT("memset8_pageable", "rc=%d",
            (int)SYM(CUresult(*)(CUdeviceptr, unsigned char, size_t), "cuMemsetD8_v2")((CUdeviceptr)(uintptr_t)hb, 0, 8));
        OUT("init_flags_1", "rc=%d", (int)init(1));
        CUcontext pc = NULL;
        CUresult (*pop)(CUcontext *) = SYM(CUresult(*)(CUcontext *), "cuCtxPopCurrent_v2");
        CUresult (*push)(CUcontext) = SYM(CUresult(*)(CUcontext), "cuCtxPushCurrent_v2");
        r = pop(&pc);
        OUT("ctx_pop", "rc=%d same=%d", (int)r, pc == ctx);
        OUT("ctx_pop_empty", "rc=%d", (int)pop(&pc));
        push(ctx);
        const char *str = (const char *)1;
        r = SYM(CUresult(*)(CUresult, const char **), "cuGetErrorString")((CUresult)12345, &str);
        OUT("error_string_unknown", "rc=%d str=%s", (int)r, str ? "set" : "NULL");
        int v = 99;
        CUresult (*rga)(void *, size_t, CUmem_range_attribute, CUdeviceptr, size_t) =
            SYM(CUresult(*)(void *, size_t, CUmem_range_attribute, CUdeviceptr, size_t), "cuMemRangeGetAttribute");
        CUdeviceptr m2 = 0;
        SYM(CUresult(*)(CUdeviceptr *, size_t, unsigned), "cuMemAllocManaged")(&m2, 1 << 16, CU_MEM_ATTACH_GLOBAL);
        r = rga(&v, 4, CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, m2, 4096);
        OUT("range_preferred_initial", "rc=%d v=%d", (int)r, v);
        v = 99;
        r = rga(&v, 4, CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m2, 4096);
        OUT("range_lastpf_initial", "rc=%d v=%d", (int)r, v);
        prefetch(m2, 4096, dev0, 0, NULL);
        SYM(CUresult(*)(void), "cuCtxSynchronize")();
        v = 99;
        r = rga(&v, 4, CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m2, 4096);
        OUT("range_lastpf_dev", "rc=%d v=%d", (int)r, v);
        v = 99;
        r = rga(&v, 4, CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m2, 8192);
        OUT("range_lastpf_mixed", "rc=%d v=%d", (int)r, v);
        advise(m2, 4096, CU_MEM_ADVISE_SET_ACCESSED_BY, dev0);
        int acc[3] = { 99, 99, 99 };
        r = rga(acc, sizeof(acc), CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY, m2, 4096);
        OUT("range_accessed_by", "rc=%d %d %d %d", (int)r, acc[0], acc[1], acc[2]);
        CUmemLocation host = { CU_MEM_LOCATION_TYPE_HOST, 0 };
        advise(m2, 4096, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, host);
        v = 99;
        r = rga(&v, 4, CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, m2, 4096);
        OUT("range_preferred_host", "rc=%d v=%d", (int)r, v);
        v = 99;
        r = rga(&v, 4, CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE, m2, 4096);
        OUT("range_preferred_type_host", "rc=%d v=%d", (int)r, v);
        mem_free(m2);
    }
    {
        /* Capture, round 2. */
        CUevent ev = NULL;
        CUresult (*ecreate)(CUevent *, unsigned) = SYM(CUresult(*)(CUevent *, unsigned), "cuEventCreate");
        CUresult (*erecord)(CUevent, CUstream) = SYM(CUresult(*)(CUevent, CUstream), "cuEventRecord");
        CUresult (*equery)(CUevent) = SYM(CUresult(*)(CUevent), "cuEventQuery");
        CUresult (*swait)(CUstream, CUevent, unsigned) = SYM(CUresult(*)(CUstream, CUevent, unsigned), "cuStreamWaitEvent");
        CUresult (*squery)(CUstream) = SYM(CUresult(*)(CUstream), "cuStreamQuery");
        CUresult (*aasync)(CUdeviceptr *, size_t, CUstream) = SYM(CUresult(*)(CUdeviceptr *, size_t, CUstream), "cuMemAllocAsync");
        CUresult (*fasync)(CUdeviceptr, CUstream) = SYM(CUresult(*)(CUdeviceptr, CUstream), "cuMemFreeAsync");
        ecreate(&ev, CU_EVENT_DISABLE_TIMING);
        begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
        OUT("cap2_event_record", "rc=%d", (int)erecord(ev, s));
        OUT("cap2_event_query", "rc=%d", (int)equery(ev));
        CUdeviceptr aa = 0;
        OUT("cap2_alloc_async", "rc=%d", (int)aasync(&aa, 4096, s));
        OUT("cap2_free_async_outside_mem", "rc=%d", (int)fasync(d, s));
        g = NULL;
        r = end(s, &g);
        OUT("cap2_end", "rc=%d", (int)r);
        if (g)
            SYM(CUresult(*)(CUgraph), "cuGraphDestroy")(g);
        CUstream s2 = NULL;
        screate(&s2, CU_STREAM_NON_BLOCKING);
        OUT("cap2_wait_ended_capture_event", "rc=%d", (int)swait(s2, ev, 0));
        begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
        OUT("cap2_stream_query", "rc=%d", (int)squery(s));
        r = end(s, &g);
        OUT("cap2_end_after_query", "rc=%d", (int)r);
        begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
        OUT("cap2_ctx_sync", "rc=%d", (int)SYM(CUresult(*)(void), "cuCtxSynchronize")());
        r = end(s, &g);
        OUT("cap2_end_after_ctx_sync", "rc=%d", (int)r);
        begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
        size_t fr = 0, tot = 0;
        OUT("cap2_mem_get_info", "rc=%d", (int)SYM(CUresult(*)(size_t *, size_t *), "cuMemGetInfo_v2")(&fr, &tot));
        OUT("cap2_prefetch_other_stream", "rc=%d", (int)prefetch(m, 4096, dev0, 0, s2));
        OUT("cap2_htod_sync", "rc=%d", (int)htod(d, hb, 16));
        g = NULL;
        r = end(s, &g);
        OUT("cap2_end_after_htod", "rc=%d", (int)r);
        if (g)
            SYM(CUresult(*)(CUgraph), "cuGraphDestroy")(g);
        begin(sb, CU_STREAM_CAPTURE_MODE_RELAXED);
        OUT("cap2_event_record_legacy", "rc=%d", (int)erecord(ev, NULL));
        r = end(sb, &g);
        OUT("cap2_end_after_event_legacy", "rc=%d", (int)r);
        begin(sb, CU_STREAM_CAPTURE_MODE_RELAXED);
        OUT("cap2_prefetch_legacy", "rc=%d", (int)prefetch(m, 4096, dev0, 0, NULL));
        r = end(sb, &g);
        OUT("cap2_end_after_prefetch_legacy", "rc=%d", (int)r);
        begin(s, CU_STREAM_CAPTURE_MODE_RELAXED);
        OUT("cap2_prefetch_capturing", "rc=%d", (int)prefetch(m, 4096, dev0, 0, s));
        g = NULL;
        r = end(s, &g);
        OUT("cap2_end_after_prefetch_capturing", "rc=%d", (int)r);
        if (g)
            SYM(CUresult(*)(CUgraph), "cuGraphDestroy")(g);
        SYM(CUresult(*)(CUevent), "cuEventDestroy_v2")(ev);
    }
    {
        CUresult (*alloch)(void **, size_t) = SYM(CUresult(*)(void **, size_t), "cuMemAllocHost_v2");
        CUresult (*allocm)(CUdeviceptr *, size_t, unsigned) = SYM(CUresult(*)(CUdeviceptr *, size_t, unsigned), "cuMemAllocManaged");
        for (int op = 0; r3_names[op]; op++) {
            struct r3 a = { .op = op };
            allocm(&a.managed, 1 << 16, CU_MEM_ATTACH_GLOBAL);
            mem_alloc(&a.dev, 4096);
            alloch(&a.pinned, 4096);
            CUdeviceptr dev_keep = a.dev;
            void *pinned_keep = a.pinned;
            begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL);
            pthread_t t;
            pthread_create(&t, NULL, r3_thread, &a);
            pthread_join(t, NULL);
            g = NULL;
            r = end(s, &g);
            char key[64];
            snprintf(key, sizeof(key), "r3_other_%s", r3_names[op]);
            OUT(key, "rc=%d end=%d", (int)a.rc, (int)r);
            if (g)
                SYM(CUresult(*)(CUgraph), "cuGraphDestroy")(g);
            mem_free(a.managed);
            if (op != 10)
                mem_free(dev_keep);
            if (op != 11)
                SYM(CUresult(*)(void *), "cuMemFreeHost")(pinned_keep);
        }
    }
    {
        /* Round 4: the VMM calls PyTorch's expandable segments make. */
        typedef CUresult (*create_t)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
        typedef CUresult (*reserve_t)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
        typedef CUresult (*map_t)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
        typedef CUresult (*access_t)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
        typedef CUresult (*unmap_t)(CUdeviceptr, size_t);
        typedef CUresult (*release_t)(CUmemGenericAllocationHandle);
        typedef CUresult (*afree_t)(CUdeviceptr, size_t);
        create_t vcreate = SYM(create_t, "cuMemCreate");
        reserve_t vreserve = SYM(reserve_t, "cuMemAddressReserve");
        map_t vmap = SYM(map_t, "cuMemMap");
        access_t vaccess = SYM(access_t, "cuMemSetAccess");
        unmap_t vunmap = SYM(unmap_t, "cuMemUnmap");
        release_t vrelease = SYM(release_t, "cuMemRelease");
        afree_t vafree = SYM(afree_t, "cuMemAddressFree");
        CUresult (*info)(size_t *, size_t *) = SYM(CUresult(*)(size_t *, size_t *), "cuMemGetInfo_v2");
        CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                     .location = { CU_MEM_LOCATION_TYPE_DEVICE, 0 } };
        const size_t G = 2u << 20;
        CUmemGenericAllocationHandle hd = 0, h2 = 0;
        CUdeviceptr va = 0;
        size_t f0 = 0, f1 = 0, tot = 0;
        OUT("vmm_create_odd", "rc=%d", (int)vcreate(&hd, G + 4096, &prop, 0));
        info(&f0, &tot);
        OUT("vmm_create", "rc=%d", (int)vcreate(&hd, 2 * G, &prop, 0));
        info(&f1, &tot);
        OUT("vmm_create_counts_in_meminfo", "%d", f0 - f1 >= 2 * G);
        vcreate(&h2, G, &prop, 0);
        OUT("vmm_reserve_odd", "rc=%d", (int)vreserve(&va, G + 4096, 0, 0, 0));
        r = vreserve(&va, 8 * G, 0, 0, 0);
        OUT("vmm_reserve", "rc=%d", (int)r);
        OUT("vmm_reserve_aligned", "%d", va % G == 0);
        OUT("vmm_map_odd_offset", "rc=%d", (int)vmap(va, G, 4096, hd, 0));
        OUT("vmm_map_past_handle", "rc=%d", (int)vmap(va, 2 * G, G, hd, 0));
        OUT("vmm_map_outside", "rc=%d", (int)vmap((CUdeviceptr)0x7e0000000000ull, G, 0, hd, 0));
        OUT("vmm_map", "rc=%d", (int)vmap(va, 2 * G, 0, hd, 0));
        OUT("vmm_map_overlap", "rc=%d", (int)vmap(va + G, G, 0, h2, 0));
        OUT("vmm_map_second", "rc=%d", (int)vmap(va + 2 * G, G, 0, h2, 0));
        CUmemAccessDesc ad = { .location = { CU_MEM_LOCATION_TYPE_DEVICE, 0 },
                               .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
        OUT("vmm_access_unmapped", "rc=%d", (int)vaccess(va + 4 * G, G, &ad, 1));
        OUT("vmm_access", "rc=%d", (int)vaccess(va, 3 * G, &ad, 1));
        type = 99;
        r = pga(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va + G + 8);
        OUT("vmm_memtype", "rc=%d type=%u", (int)r, type);
        CUdeviceptr rs = 0;
        size_t rsz = 0;
        r = pga(&rs, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, va + G + 8);
        OUT("vmm_range_start", "rc=%d is_va=%d", (int)r, rs == va);
        r = pga(&rsz, CU_POINTER_ATTRIBUTE_RANGE_SIZE, va + G + 8);
        OUT("vmm_range_size", "rc=%d granules=%zu", (int)r, rsz / G);
        CUdeviceptr ab = 0;
        size_t asz = 0;
        r = SYM(CUresult(*)(CUdeviceptr *, size_t *, CUdeviceptr), "cuMemGetAddressRange_v2")(&ab, &asz, va + G + 8);
        OUT("vmm_address_range", "rc=%d is_va=%d mapping=%d", (int)r, ab == va, asz == 2 * G);
        OUT("vmm_htod", "rc=%d", (int)htod(va + G, hb, 16));
        OUT("vmm_release_mapped", "rc=%d", (int)vrelease(hd));
        OUT("vmm_htod_after_release", "rc=%d", (int)htod(va + G, hb, 16));
        OUT("vmm_address_free_mapped", "rc=%d", (int)vafree(va, 8 * G));
        OUT("vmm_unmap_partial", "rc=%d", (int)vunmap(va, G));
        OUT("vmm_unmap_across", "rc=%d", (int)vunmap(va, 3 * G));
        type = 99;
        r = pga(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va + 2 * G + 8);
        OUT("vmm_memtype_after_unmap_across", "rc=%d", (int)r);
        r = pga(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va + 8);
        OUT("vmm_memtype_first_after_unmap_across", "rc=%d", (int)r);
        OUT("vmm_unmap_never_mapped", "rc=%d", (int)vunmap(va + 5 * G, G));
        OUT("vmm_unmap_second", "rc=%d", (int)vunmap(va + 2 * G, G));
        OUT("vmm_release_twice", "rc=%d", (int)vrelease(hd));
        OUT("vmm_release_h2", "rc=%d", (int)vrelease(h2));
        OUT("vmm_address_free", "rc=%d", (int)vafree(va, 8 * G));
        OUT("vmm_address_free_twice", "rc=%d", (int)vafree(va, 8 * G));
    }
    {
        /* The runtime's entry points, when a libcudart.so.13 is found. */
        void *rt = dlopen("libcudart.so.13", RTLD_NOW | RTLD_LOCAL);
        OUT("rt_loaded", "%d", rt != NULL);
        if (rt) {
            typedef int (*gdep_t)(const char *, void **, unsigned, unsigned long long, int *);
            gdep_t byver = (gdep_t)dlsym(rt, "cudaGetDriverEntryPointByVersion");
            void *p = (void *)1;
            int st = 77;
            int e = byver("cuNoSuchFunction", &p, 13000, 0, &st);
            OUT("rt_entry_unknown", "rc=%d status=%d fn=%s", e, st, p ? "set" : "NULL");
            p = (void *)1;
            e = byver("cuNoSuchFunction", &p, 13000, 0, NULL);
            OUT("rt_entry_unknown_null_status", "rc=%d fn=%s", e, p ? "set" : "NULL");
            p = (void *)1;
            st = 77;
            e = byver("cuFuncGetParamInfo", &p, 12000, 0, &st);
            OUT("rt_entry_too_old", "rc=%d status=%d fn=%s", e, st, p ? "set" : "NULL");
            p = NULL;
            st = 77;
            e = byver("cuMemCreate", &p, 12000, 0, &st);
            OUT("rt_entry_ok", "rc=%d status=%d fn=%s", e, st, which(p, (const char *const[]){ "cuMemCreate", NULL }));
            int (*gle)(void) = (int (*)(void))dlsym(rt, "cudaGetLastError");
            OUT("rt_last_error", "%d", gle ? gle() : -1);
        }
    }

    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        CUresult a = init(0);
        CUdeviceptr x;
        CUresult b = mem_alloc(&x, 256);
        printf("fork_child_init rc=%d\nfork_child_alloc rc=%d\n", (int)a, (int)b);
        fflush(stdout);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    return 0;
}
