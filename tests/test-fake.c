/* tests/test-fake.c: the fake CUDA driver's own behaviour (tests/fake/), so
 * the interposition and placement tests can trust what it reports: call
 * counters, fault injection (run-time and WOFAKE_FAIL), cuGetProcAddress
 * versions/flags/status, init and context rules, capture (recorded, not
 * run; the real driver's invalidation rules), managed advice and residency,
 * pinned allocation under a small RLIMIT_MEMLOCK, pointer attributes, VMM,
 * parameter layouts and launches, concurrent use, and streams behind their
 * callers (WOFAKE_STREAMS_BEHIND).
 *
 * Linked directly against the fake libcuda.so.1. Tests that need a fresh
 * process (environment read once, rlimits, uid) re-run this binary with
 * argv[1] = "child:<name>". */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "fakecuda.h"

static CUcontext ctx;
static char self_exe[4096];

static CUmemLocation dev0(void)
{
    return (CUmemLocation){ CU_MEM_LOCATION_TYPE_DEVICE, 0 };
}

static CUmemLocation hostloc(void)
{
    return (CUmemLocation){ CU_MEM_LOCATION_TYPE_HOST, 0 };
}

/* --- kernels ------------------------------------------------------------- */

struct io {
    const float *in;
    float *out;
    int n;
    int pad;
};

static void k_axpy(void **p, const uint32_t grid[3], const uint32_t block[3])
{
    struct io a = *(struct io *)p[0];
    float scale = *(float *)p[1];
    for (int i = 0; i < a.n; i++)
        a.out[i] += a.in[i] * scale;
}

static void k_nop(void **p, const uint32_t grid[3], const uint32_t block[3])
{
}

static CUfunction axpy(void)
{
    static CUfunction f;
    if (!f) {
        const size_t sz[] = { sizeof(struct io), sizeof(float) };
        f = fakecuda_kernel("test_axpy", 2, sz, k_axpy);
    }
    return f;
}

static void setup_ctx(void)
{
    CUdevice dev;
    assert_int_equal(cuInit(0), CUDA_SUCCESS);
    assert_int_equal(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    assert_int_equal(cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    assert_int_equal(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
}

/* --- init and context rules ---------------------------------------------- */

/* Must run first: nothing has called cuInit yet in this process. */
static void calls_before_init_fail_not_initialized(void **state)
{
    CUdeviceptr p;
    int n;
    assert_int_equal(cuMemAlloc_v2(&p, 16), CUDA_ERROR_NOT_INITIALIZED);
    assert_int_equal(cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    /* These work before cuInit on the real driver too. */
    int v = 0;
    assert_int_equal(cuDriverGetVersion(&v), CUDA_SUCCESS);
    assert_int_equal(v, 13000);
    void *fn = NULL;
    assert_int_equal(cuGetProcAddress_v2("cuInit", &fn, 13000, 0, NULL), CUDA_SUCCESS);
    assert_ptr_equal(fn, (void *)cuInit);
    setup_ctx();
}

static void *alloc_without_ctx(void *arg)
{
    CUdeviceptr p;
    *(CUresult *)arg = cuMemAlloc_v2(&p, 16);
    return NULL;
}

static void context_bound_calls_need_a_current_context(void **state)
{
    CUresult r = CUDA_SUCCESS;
    pthread_t t;
    pthread_create(&t, NULL, alloc_without_ctx, &r);
    pthread_join(t, NULL);
    assert_int_equal(r, CUDA_ERROR_INVALID_CONTEXT);
    CUcontext c = (CUcontext)1;
    assert_int_equal(cuCtxPushCurrent_v2(ctx), CUDA_SUCCESS);
    assert_int_equal(cuCtxPopCurrent_v2(&c), CUDA_SUCCESS);
    assert_ptr_equal(c, ctx);
    assert_int_equal(cuCtxGetCurrent(&c), CUDA_SUCCESS);
    assert_ptr_equal(c, ctx);
}

/* --- counters and fault injection ---------------------------------------- */

static void counters_count_every_call_by_abi_name(void **state)
{
    fakecuda_reset_counts();
    CUdeviceptr p;
    assert_int_equal(cuMemAlloc_v2(&p, 64), CUDA_SUCCESS);
    assert_int_equal(cuMemFree_v2(p), CUDA_SUCCESS);
    assert_int_equal(cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE); /* failed calls count too */
    assert_int_equal(fakecuda_calls("cuMemAlloc_v2"), 1);
    assert_int_equal(fakecuda_calls("cuMemFree_v2"), 2);
    assert_int_equal(fakecuda_calls("cuMemAlloc"), 0); /* not an ABI symbol */
    assert_int_equal(fakecuda_calls_total(), 3);
    fakecuda_reset_counts();
    assert_int_equal(fakecuda_calls("cuMemFree_v2"), 0);
}

static void function_list_names_every_exported_symbol(void **state)
{
    void *self = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(self);
    size_t n = 0;
    for (const char *const *f = fakecuda_functions(); *f; f++, n++)
        assert_non_null(dlsym(self, *f));
    assert_true(n > 140);
    dlclose(self);
}

static void fail_nth_call_fails_once_without_effect(void **state)
{
    CUdeviceptr p[4];
    size_t live = fakecuda_live_count(FAKECUDA_DEVICE);
    assert_int_equal(fakecuda_fail("cuMemAlloc_v2", 3, CUDA_ERROR_OUT_OF_MEMORY), 0);
    assert_int_equal(cuMemAlloc_v2(&p[0], 64), CUDA_SUCCESS);
    assert_int_equal(cuMemAlloc_v2(&p[1], 64), CUDA_SUCCESS);
    p[2] = 0xdead;
    assert_int_equal(cuMemAlloc_v2(&p[2], 64), CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(p[2], 0xdead); /* out-parameter untouched */
    assert_int_equal(cuMemAlloc_v2(&p[3], 64), CUDA_SUCCESS);
    assert_int_equal(fakecuda_live_count(FAKECUDA_DEVICE), live + 3);
    assert_int_equal(fakecuda_injected(), 1);
    for (int i = 0; i < 4; i++)
        if (i != 2)
            assert_int_equal(cuMemFree_v2(p[i]), CUDA_SUCCESS);
    fakecuda_fail_clear();
}

static void fail_every_fails_until_cleared(void **state)
{
    assert_int_equal(fakecuda_fail_every("cuLaunchKernel", CUDA_ERROR_LAUNCH_FAILED), 0);
    float scale = 1;
    struct io io = { NULL, NULL, 0, 0 };
    void *params[] = { &io, &scale };
    for (int i = 0; i < 3; i++)
        assert_int_equal(cuLaunchKernel(axpy(), 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL),
                         CUDA_ERROR_LAUNCH_FAILED);
    /* The per-thread variant is a separate injection point. */
    assert_int_equal(cuLaunchKernel_ptsz(axpy(), 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL),
                     CUDA_SUCCESS);
    fakecuda_fail_clear();
    assert_int_equal(cuLaunchKernel(axpy(), 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL), CUDA_SUCCESS);
}

static void fail_rejects_unknown_names_and_zero(void **state)
{
    assert_int_equal(fakecuda_fail("cuNoSuch", 1, CUDA_ERROR_UNKNOWN), -ENOENT);
    assert_int_equal(fakecuda_fail("cuInit", 0, CUDA_ERROR_UNKNOWN), -EINVAL);
    assert_int_equal(fakecuda_fail("cuInit", 1, CUDA_SUCCESS), -EINVAL);
}

static void fail_applies_to_every_listed_function(void **state)
{
    /* The reliability tests inject at each name: every one must accept. */
    for (const char *const *f = fakecuda_functions(); *f; f++) {
        assert_int_equal(fakecuda_fail(*f, 1000000, CUDA_ERROR_UNKNOWN), 0);
        fakecuda_fail_clear();
    }
}

/* --- cuGetProcAddress ---------------------------------------------------- */

static void proc_address_versions_flags_and_status(void **state)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult st = 99;
    assert_int_equal(cuGetProcAddress_v2("cuMemAlloc", &fn, 13000, 0, &st), CUDA_SUCCESS);
    assert_ptr_equal(fn, (void *)cuMemAlloc_v2);
    assert_int_equal(st, CU_GET_PROC_ADDRESS_SUCCESS);

    fn = (void *)1;
    assert_int_equal(cuGetProcAddress_v2("cuMemAlloc", &fn, 2000, 0, &st), CUDA_ERROR_NOT_FOUND);
    assert_null(fn);
    assert_int_equal(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);

    fn = (void *)1;
    assert_int_equal(cuGetProcAddress_v2("cuNoSuch", &fn, 13000, 0, &st), CUDA_ERROR_NOT_FOUND);
    assert_null(fn);
    assert_int_equal(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    /* A NULL status is allowed. */
    assert_int_equal(cuGetProcAddress_v2("cuNoSuch", &fn, 13000, 0, NULL), CUDA_ERROR_NOT_FOUND);

    /* Per-thread flag: the _ptsz/_ptds variant where one exists. */
    assert_int_equal(cuGetProcAddress_v2("cuLaunchKernel", &fn, 13000, 2, NULL), CUDA_SUCCESS);
    assert_ptr_equal(fn, (void *)cuLaunchKernel_ptsz);
    assert_int_equal(cuGetProcAddress_v2("cuLaunchKernel", &fn, 13000, 0, NULL), CUDA_SUCCESS);
    assert_ptr_equal(fn, (void *)cuLaunchKernel);
    assert_int_equal(cuGetProcAddress_v2("cuMemcpyHtoD", &fn, 13000, 2, NULL), CUDA_SUCCESS);
    assert_ptr_equal(fn, (void *)cuMemcpyHtoD_v2_ptds);
    assert_int_equal(cuGetProcAddress_v2("cuMemAlloc", &fn, 13000, 2, NULL), CUDA_SUCCESS);
    assert_ptr_equal(fn, (void *)cuMemAlloc_v2);
    assert_int_equal(cuGetProcAddress_v2("cuMemAlloc", &fn, 13000, 8, NULL),
                     CUDA_ERROR_INVALID_VALUE);
    /* A CUDA newer than the driver: an error, out-parameters untouched. */
    fn = (void *)1;
    st = 77;
    assert_int_equal(cuGetProcAddress_v2("cuMemAlloc", &fn, 13010, 0, &st),
                     CUDA_ERROR_INVALID_VALUE);
    assert_ptr_equal(fn, (void *)1);
    assert_int_equal(st, 77);

    /* The symbol's history. */
    assert_int_equal(cuGetProcAddress_v2("cuStreamGetCaptureInfo", &fn, 12030, 0, NULL), CUDA_SUCCESS);
    assert_ptr_equal(fn, (void *)cuStreamGetCaptureInfo_v3);
    assert_int_equal(cuGetProcAddress_v2("cuStreamGetCaptureInfo", &fn, 12020, 2, NULL), CUDA_SUCCESS);
    assert_ptr_equal(fn, (void *)cuStreamGetCaptureInfo_v2_ptsz);
    assert_int_equal(cuGetProcAddress_v2("cuMemAdvise", &fn, 12010, 0, NULL), CUDA_SUCCESS);
    assert_ptr_equal(fn, (void *)cuMemAdvise);
    assert_int_equal(cuGetProcAddress_v2("cuMemAdvise", &fn, 12020, 0, NULL), CUDA_SUCCESS);
    assert_ptr_equal(fn, (void *)cuMemAdvise_v2);

    /* "cuGetProcAddress" gives the inner resolver: cuGetProcAddress_v2. */
    assert_int_equal(cuGetProcAddress_v2("cuGetProcAddress", &fn, 13000, 0, NULL), CUDA_SUCCESS);
    assert_ptr_equal(fn, (void *)cuGetProcAddress_v2);
    assert_int_equal(cuGetProcAddress_v2("cuGetProcAddress", &fn, 11030, 0, NULL), CUDA_SUCCESS);
    assert_ptr_equal(fn, (void *)cuGetProcAddress);
    assert_int_equal(cuGetProcAddress("cuInit", &fn, 13000, 0), CUDA_SUCCESS);
    assert_ptr_equal(fn, (void *)cuInit);
}

static void proc_address_resolves_every_name_both_flavours(void **state)
{
    for (const char *const *nm = fakecuda_proc_names(); *nm; nm++) {
        void *a = NULL, *b = NULL;
        assert_int_equal(cuGetProcAddress_v2(*nm, &a, 13000, 0, NULL), CUDA_SUCCESS);
        assert_int_equal(cuGetProcAddress_v2(*nm, &b, 13000, 2, NULL), CUDA_SUCCESS);
        assert_non_null(a);
        assert_non_null(b);
    }
}

/* --- launches and parameter layouts -------------------------------------- */

static void param_info_uses_natural_alignment(void **state)
{
    const size_t sz[] = { 1, 4, 8, 12, 8, 2 };
    CUfunction f = fakecuda_kernel("layout", 6, sz, k_nop);
    const size_t want[] = { 0, 4, 8, 16, 32, 40 };
    for (size_t i = 0; i < 6; i++) {
        size_t off = 99, size = 99;
        assert_int_equal(cuFuncGetParamInfo(f, i, &off, &size), CUDA_SUCCESS);
        assert_int_equal(off, want[i]);
        assert_int_equal(size, sz[i]);
        assert_int_equal(cuKernelGetParamInfo(fakecuda_kernel_handle(f), i, &off, NULL),
                         CUDA_SUCCESS);
        assert_int_equal(off, want[i]);
    }
    assert_int_equal(cuFuncGetParamInfo(f, 6, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    const char *name = NULL;
    assert_int_equal(cuFuncGetName(&name, f), CUDA_SUCCESS);
    assert_string_equal(name, "layout");
    CUmodule m;
    CUfunction g = NULL;
    assert_int_equal(cuModuleLoadData(&m, "fatbin"), CUDA_SUCCESS);
    assert_int_equal(cuModuleGetFunction(&g, m, "layout"), CUDA_SUCCESS);
    assert_ptr_equal(g, f);
    assert_int_equal(cuModuleGetFunction(&g, m, "nope"), CUDA_ERROR_NOT_FOUND);
    assert_int_equal(cuModuleUnload(m), CUDA_SUCCESS);
}

static void launch_ex_honours_config_and_extra_buffer(void **state)
{
    float in[4] = { 1, 2, 3, 4 }, out[4] = { 0 };
    struct io io = { in, out, 4, 0 };
    float scale = 3;
    CUstream s;
    assert_int_equal(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUlaunchAttribute attr = { .id = CU_LAUNCH_ATTRIBUTE_PRIORITY };
    CUlaunchConfig cfg = { 2, 3, 4, 32, 2, 1, 128, s, &attr, 1 };
    void *params[] = { &io, &scale };
    assert_int_equal(cuLaunchKernelEx(&cfg, axpy(), params, NULL), CUDA_SUCCESS);
    assert_true(out[3] == 12.0f);
    struct fakecuda_launch l;
    assert_int_equal(fakecuda_last_launch(&l), 0);
    assert_ptr_equal(l.func, axpy());
    assert_int_equal(l.grid[2], 4);
    assert_int_equal(l.block[1], 2);
    assert_int_equal(l.shared_mem, 128);
    assert_ptr_equal(l.stream, s);
    assert_int_equal(l.captured, 0);

    /* Packed arguments through `extra`. */
    uint8_t buf[32];
    memcpy(buf, &io, sizeof(io));
    memcpy(buf + 24, &scale, sizeof(scale));
    size_t bsz = 28;
    void *extra[] = { CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &bsz,
                      CU_LAUNCH_PARAM_END };
    assert_int_equal(cuLaunchKernel(axpy(), 1, 1, 1, 1, 1, 1, 0, s, NULL, extra), CUDA_SUCCESS);
    assert_true(out[3] == 24.0f);
    bsz = 8;
    assert_int_equal(cuLaunchKernel(axpy(), 1, 1, 1, 1, 1, 1, 0, s, NULL, extra),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuLaunchKernel(axpy(), 1, 1, 1, 2048, 1, 1, 0, s, params, NULL),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

/* --- capture ------------------------------------------------------------- */

static void capture_records_launches_and_graph_replays_them(void **state)
{
    float in[4] = { 1, 2, 3, 4 }, out[4] = { 0 };
    struct io io = { in, out, 4, 0 };
    float scale = 1;
    void *params[] = { &io, &scale };
    CUstream s;
    assert_int_equal(cuStreamCreate(&s, 0), CUDA_SUCCESS);
    uint64_t runs = fakecuda_kernel_runs(axpy());
    assert_int_equal(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(fakecuda_capturing(), 1);
    CUstreamCaptureStatus st;
    cuuint64_t id = 0;
    CUgraph during = NULL;
    assert_int_equal(cuStreamGetCaptureInfo_v3(s, &st, &id, &during, NULL, NULL, NULL), CUDA_SUCCESS);
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
    assert_true(id > 0);
    assert_int_equal(cuLaunchKernel(axpy(), 1, 1, 1, 1, 1, 1, 0, s, params, NULL), CUDA_SUCCESS);
    scale = 100; /* parameters were copied at capture time */
    assert_int_equal(fakecuda_kernel_runs(axpy()), runs);
    assert_true(out[0] == 0.0f);
    struct fakecuda_launch l;
    fakecuda_last_launch(&l);
    assert_int_equal(l.captured, 1);
    CUgraph g = NULL;
    assert_int_equal(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    assert_ptr_equal(g, during);
    assert_int_equal(fakecuda_graph_ops(g), 1);
    assert_int_equal(fakecuda_capturing(), 0);
    CUgraphExec e;
    assert_int_equal(cuGraphInstantiateWithFlags(&e, g, 0), CUDA_SUCCESS);
    assert_int_equal(cuGraphLaunch(e, s), CUDA_SUCCESS);
    assert_int_equal(cuGraphLaunch(e, s), CUDA_SUCCESS);
    assert_int_equal(fakecuda_kernel_runs(axpy()), runs + 2);
    assert_true(out[2] == 6.0f);
    fakecuda_last_launch(&l);
    assert_int_equal(l.from_graph, 1);
    assert_int_equal(cuGraphExecDestroy(e), CUDA_SUCCESS);
    assert_int_equal(cuGraphDestroy(g), CUDA_SUCCESS);
    assert_int_equal(cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

struct unsafe_arg {
    CUstreamCaptureMode mode;
    CUresult r;
};

static void *alloc_from_other_thread(void *p)
{
    struct unsafe_arg *a = p;
    cuCtxSetCurrent(ctx);
    CUstreamCaptureMode m = a->mode;
    cuThreadExchangeStreamCaptureMode(&m);
    CUdeviceptr d = 0;
    a->r = cuMemAlloc_v2(&d, 64);
    if (a->r == CUDA_SUCCESS)
        cuMemFree_v2(d);
    return NULL;
}

static void capture_global_mode_forbids_unsafe_calls_elsewhere(void **state)
{
    CUstream s;
    assert_int_equal(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);

    /* A relaxed thread may allocate during a global capture. */
    assert_int_equal(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    struct unsafe_arg a = { CU_STREAM_CAPTURE_MODE_RELAXED, CUDA_ERROR_UNKNOWN };
    pthread_t t;
    pthread_create(&t, NULL, alloc_from_other_thread, &a);
    pthread_join(t, NULL);
    assert_int_equal(a.r, CUDA_SUCCESS);
    /* A global-mode thread may not, and the capture is lost. */
    a = (struct unsafe_arg){ CU_STREAM_CAPTURE_MODE_GLOBAL, CUDA_SUCCESS };
    pthread_create(&t, NULL, alloc_from_other_thread, &a);
    pthread_join(t, NULL);
    assert_int_equal(a.r, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CUstreamCaptureStatus st;
    assert_int_equal(cuStreamIsCapturing(s, &st), CUDA_SUCCESS);
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    CUgraph g = (CUgraph)1;
    assert_int_equal(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    assert_null(g);

    /* Thread-local mode: other threads are not affected. */
    assert_int_equal(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
    a = (struct unsafe_arg){ CU_STREAM_CAPTURE_MODE_GLOBAL, CUDA_ERROR_UNKNOWN };
    pthread_create(&t, NULL, alloc_from_other_thread, &a);
    pthread_join(t, NULL);
    assert_int_equal(a.r, CUDA_SUCCESS);
    /* but the capturing thread itself may not synchronise its stream. */
    assert_int_equal(cuStreamSynchronize(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_int_equal(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    assert_int_equal(cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

/* What a prefetch thread may do while another thread captures in global
 * mode (measured on driver 580, probe-real.txt r3_other_*). */
struct pf_arg {
    CUdeviceptr m;
    CUresult prefetch, copy, record, advise, query, sync, alloc_async;
};

static void *prefetch_thread(void *p)
{
    struct pf_arg *a = p;
    CUstream own;
    CUevent e;
    char buf[16] = { 0 };
    cuCtxSetCurrent(ctx);
    cuStreamCreate(&own, CU_STREAM_NON_BLOCKING);
    cuEventCreate(&e, CU_EVENT_DISABLE_TIMING);
    a->prefetch = cuMemPrefetchAsync_v2(a->m, 4096, dev0(), 0, own);
    a->copy = cuMemcpyHtoDAsync_v2(a->m, buf, sizeof(buf), own);
    a->record = cuEventRecord(e, own);
    a->advise = cuMemAdvise_v2(a->m, 4096, CU_MEM_ADVISE_SET_ACCESSED_BY, dev0());
    a->query = cuEventQuery(e);
    a->sync = cuStreamSynchronize(own);
    CUdeviceptr x;
    a->alloc_async = cuMemAllocAsync(&x, 64, own);
    cuEventDestroy_v2(e);
    cuStreamDestroy_v2(own);
    return NULL;
}

static void capture_global_mode_limits_a_prefetch_thread(void **state)
{
    struct pf_arg a = { 0 };
    CUstream s;
    CUgraph g;
    pthread_t t;
    assert_int_equal(cuMemAllocManaged(&a.m, 1 << 16, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    pthread_create(&t, NULL, prefetch_thread, &a);
    pthread_join(t, NULL);
    /* Enqueueing on its own stream is fine... */
    assert_int_equal(a.prefetch, CUDA_SUCCESS);
    assert_int_equal(a.copy, CUDA_SUCCESS);
    assert_int_equal(a.record, CUDA_SUCCESS);
    /* ...advising, waiting and stream-ordered allocation are not, and the
     * first of them already cost the capture. */
    assert_int_equal(a.advise, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_int_equal(a.query, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_int_equal(a.sync, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_int_equal(a.alloc_async, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_int_equal(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    cuStreamDestroy_v2(s);
    cuMemFree_v2(a.m);
}

static void capture_legacy_stream_use_is_an_implicit_dependency(void **state)
{
    CUstream s;
    assert_int_equal(cuStreamCreate(&s, 0), CUDA_SUCCESS); /* blocking */
    assert_int_equal(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    float in[1] = { 1 }, out[1] = { 0 };
    struct io io = { in, out, 1, 0 };
    float scale = 1;
    void *params[] = { &io, &scale };
    assert_int_equal(cuLaunchKernel(axpy(), 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL),
                     CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    CUgraph g;
    assert_int_equal(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    /* The legacy stream itself cannot be captured. */
    assert_int_equal(cuStreamBeginCapture_v2(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL),
                     CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    /* A non-blocking capture does not involve the legacy stream. */
    CUstream nb;
    assert_int_equal(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cuStreamBeginCapture_v2(nb, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    assert_int_equal(cuLaunchKernel(axpy(), 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL), CUDA_SUCCESS);
    assert_int_equal(cuStreamEndCapture(nb, &g), CUDA_SUCCESS);
    assert_int_equal(cuGraphDestroy(g), CUDA_SUCCESS);
    assert_int_equal(cuStreamDestroy_v2(nb), CUDA_SUCCESS);
    assert_int_equal(cuStreamDestroy_v2(s), CUDA_SUCCESS);
}

static void capture_fork_join_through_events(void **state)
{
    CUstream a, b;
    CUevent fork, join;
    assert_int_equal(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cuEventCreate(&fork, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    assert_int_equal(cuEventCreate(&join, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    assert_int_equal(cuStreamBeginCapture_v2(a, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(cuEventRecord(fork, a), CUDA_SUCCESS);
    assert_int_equal(cuStreamWaitEvent(b, fork, 0), CUDA_SUCCESS);
    CUstreamCaptureStatus st;
    assert_int_equal(cuStreamIsCapturing(b, &st), CUDA_SUCCESS);
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
    float scale = 1;
    struct io io = { NULL, NULL, 0, 0 };
    void *params[] = { &io, &scale };
    assert_int_equal(cuLaunchKernel(axpy(), 1, 1, 1, 1, 1, 1, 0, b, params, NULL), CUDA_SUCCESS);
    assert_int_equal(cuEventRecord(join, b), CUDA_SUCCESS);
    assert_int_equal(cuStreamWaitEvent(a, join, 0), CUDA_SUCCESS);
    CUgraph g;
    assert_int_equal(cuStreamEndCapture(b, &g), CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
    assert_int_equal(cuStreamEndCapture(a, &g), CUDA_SUCCESS);
    assert_int_equal(fakecuda_graph_ops(g), 1);
    assert_int_equal(cuStreamIsCapturing(b, &st), CUDA_SUCCESS);
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_NONE);
    /* An event whose record belongs to an ended capture cannot be waited on. */
    assert_int_equal(cuStreamWaitEvent(b, fork, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuStreamIsCapturing(b, &st), CUDA_SUCCESS);
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_NONE);
    cuGraphDestroy(g);
    cuEventDestroy_v2(fork);
    cuEventDestroy_v2(join);
    cuStreamDestroy_v2(a);
    cuStreamDestroy_v2(b);
}

/* --- memory -------------------------------------------------------------- */

static void managed_residency_follows_prefetch(void **state)
{
    CUdeviceptr m;
    const size_t pg = 4096;
    fakecuda_reset();
    assert_int_equal(cuMemAllocManaged(&m, 4 * pg, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    char *p = (char *)(uintptr_t)m;
    assert_int_equal(fakecuda_where(p), FAKECUDA_LOC_NONE);
    size_t free0, free1, total;
    cuMemGetInfo_v2(&free0, &total);

    assert_int_equal(cuMemPrefetchAsync_v2(m, 2 * pg, dev0(), 0, NULL), CUDA_SUCCESS);
    assert_int_equal(fakecuda_where(p), 0);
    assert_int_equal(fakecuda_where(p + 2 * pg - 1), 0);
    assert_int_equal(fakecuda_where(p + 2 * pg), FAKECUDA_LOC_NONE);
    assert_int_equal(fakecuda_managed_resident(0), 2 * pg);
    assert_int_equal(cuMemPrefetchAsync_v2(m, 2 * pg, dev0(), 0, NULL), CUDA_SUCCESS);
    assert_int_equal(fakecuda_migrated_bytes(0), 2 * pg); /* already there: nothing moved */
    cuMemGetInfo_v2(&free1, &total);
    assert_int_equal(free0 - free1, 2 * pg);

    assert_int_equal(cuMemPrefetchAsync_v2(m, pg, hostloc(), 0, NULL), CUDA_SUCCESS);
    assert_int_equal(fakecuda_where(p), CU_DEVICE_CPU);
    assert_int_equal(fakecuda_where(p + pg), 0);
    assert_int_equal(fakecuda_migrated_bytes(CU_DEVICE_CPU), pg);

    /* Read-mostly pages keep a copy on both sides. */
    assert_int_equal(cuMemAdvise_v2(m, pg, CU_MEM_ADVISE_SET_READ_MOSTLY, dev0()), CUDA_SUCCESS);
    assert_int_equal(cuMemPrefetchAsync_v2(m, pg, dev0(), 0, NULL), CUDA_SUCCESS);
    struct fakecuda_page_state ps;
    assert_int_equal(fakecuda_managed_state(p, &ps), 0);
    assert_int_equal(ps.resident, 1u | 2u);
    assert_int_equal(ps.read_mostly, 1);
    assert_int_equal(ps.last_prefetch, 0);

    /* Advice, as cuMemRangeGetAttribute reports it. */
    assert_int_equal(cuMemAdvise_v2(m, 4 * pg, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, hostloc()),
                     CUDA_SUCCESS);
    assert_int_equal(cuMemAdvise_v2(m, 4 * pg, CU_MEM_ADVISE_SET_ACCESSED_BY, dev0()), CUDA_SUCCESS);
    int v = 7;
    assert_int_equal(cuMemRangeGetAttribute(&v, 4, CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, m,
                                            4 * pg),
                     CUDA_SUCCESS);
    assert_int_equal(v, CU_DEVICE_CPU);
    int acc[2];
    assert_int_equal(cuMemRangeGetAttribute(acc, sizeof(acc), CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY, m,
                                            4 * pg),
                     CUDA_SUCCESS);
    assert_int_equal(acc[0], 0);
    assert_int_equal(acc[1], CU_DEVICE_INVALID);
    assert_int_equal(cuMemRangeGetAttribute(&v, 4, CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m,
                                            pg),
                     CUDA_SUCCESS);
    assert_int_equal(v, 0);
    assert_int_equal(cuMemRangeGetAttribute(&v, 4, CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, m, 2 * pg),
                     CUDA_SUCCESS);
    assert_int_equal(v, 0); /* only the first page is read-mostly */

    /* Validated like the real driver: managed memory only, flags 0. */
    CUdeviceptr d;
    assert_int_equal(cuMemAlloc_v2(&d, pg), CUDA_SUCCESS);
    assert_int_equal(cuMemPrefetchAsync_v2(d, pg, dev0(), 0, NULL), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemAdvise_v2(d, pg, CU_MEM_ADVISE_SET_READ_MOSTLY, dev0()),
                     CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemPrefetchAsync_v2(m, pg, dev0(), 1, NULL), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemPrefetchAsync_v2(m, 5 * pg, dev0(), 0, NULL), CUDA_ERROR_INVALID_VALUE);
    CUmemLocation bad = { CU_MEM_LOCATION_TYPE_DEVICE, 7 };
    assert_int_equal(cuMemPrefetchAsync_v2(m, pg, bad, 0, NULL), CUDA_ERROR_INVALID_DEVICE);
    /* The legacy (CUdevice) form. */
    assert_int_equal(cuMemPrefetchAsync(m + 3 * pg, pg, CU_DEVICE_CPU, NULL), CUDA_SUCCESS);
    assert_int_equal(fakecuda_where(p + 3 * pg), CU_DEVICE_CPU);

    assert_int_equal(cuMemFree_v2(d), CUDA_SUCCESS);
    assert_int_equal(cuMemFree_v2(m), CUDA_SUCCESS);
    assert_int_equal(fakecuda_managed_resident(0), 0);
}

static void declared_accesses_fault_migrate_or_go_remote(void **state)
{
    const size_t pg = 4096;
    CUdeviceptr m;
    assert_int_equal(cuMemAllocManaged(&m, 4 * pg, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    char *p = (char *)(uintptr_t)m;
    fakecuda_reset();
    /* First touch from the device: faults, migrates. */
    assert_int_equal(fakecuda_access(p, pg + 1, 0, 0), 2);
    assert_int_equal(fakecuda_where(p + pg), 0);
    assert_int_equal(fakecuda_access(p, pg, 0, 0), 0); /* resident now: a hit */
    assert_int_equal(fakecuda_faults(0), 2);
    assert_int_equal(fakecuda_migrated_bytes(0), 2 * pg);
    /* The host touching it pulls it back. */
    assert_int_equal(fakecuda_access(p, 1, CU_DEVICE_CPU, 1), 1);
    assert_int_equal(fakecuda_where(p), CU_DEVICE_CPU);
    /* Preferred host + accessed-by device: read in place, no migration. */
    assert_int_equal(cuMemAdvise_v2(m + 2 * pg, 2 * pg, CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
                                    hostloc()),
                     CUDA_SUCCESS);
    assert_int_equal(cuMemAdvise_v2(m + 2 * pg, 2 * pg, CU_MEM_ADVISE_SET_ACCESSED_BY, dev0()),
                     CUDA_SUCCESS);
    assert_int_equal(fakecuda_access(p + 2 * pg, 2 * pg, 0, 0), 0);
    assert_int_equal(fakecuda_remote_bytes(0), 2 * pg);
    assert_int_equal(fakecuda_where(p + 3 * pg), CU_DEVICE_CPU);
    /* Read-mostly: a device read duplicates, a host write collapses. */
    assert_int_equal(cuMemAdvise_v2(m, pg, CU_MEM_ADVISE_SET_READ_MOSTLY, dev0()), CUDA_SUCCESS);
    assert_int_equal(fakecuda_access(p, pg, 0, 0), 1);
    struct fakecuda_page_state ps;
    fakecuda_managed_state(p, &ps);
    assert_int_equal(ps.resident, 3);
    assert_int_equal(fakecuda_access(p, 8, CU_DEVICE_CPU, 1), 0);
    fakecuda_managed_state(p, &ps);
    assert_int_equal(ps.resident, 1);
    /* Fixed memory only counts bus traffic. */
    void *h;
    assert_int_equal(cuMemHostAlloc(&h, pg, 0), CUDA_SUCCESS);
    assert_int_equal(fakecuda_access(h, 100, 0, 0), 0);
    assert_int_equal(fakecuda_remote_bytes(0), 2 * pg + 100);
    int local;
    assert_int_equal(fakecuda_access(&local, 4, 0, 0), -ENOENT);
    cuMemFreeHost(h);
    cuMemFree_v2(m);
}

static void prefetch_on_capturing_stream_breaks_the_capture(void **state)
{
    CUdeviceptr m;
    CUstream s;
    assert_int_equal(cuMemAllocManaged(&m, 8192, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    /* Driver 580: prefetches cannot be captured, and the capture is lost. */
    assert_int_equal(cuMemPrefetchAsync_v2(m, 8192, dev0(), 0, s),
                     CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_int_equal(fakecuda_where((void *)(uintptr_t)m), FAKECUDA_LOC_NONE);
    CUgraph g;
    assert_int_equal(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    /* A prefetch on another stream during a capture is fine. */
    CUstream other;
    assert_int_equal(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(cuMemPrefetchAsync_v2(m, 8192, dev0(), 0, other), CUDA_SUCCESS);
    assert_int_equal(fakecuda_where((void *)(uintptr_t)m), 0);
    assert_int_equal(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
    cuGraphDestroy(g);
    cuStreamDestroy_v2(other);
    cuStreamDestroy_v2(s);
    assert_int_equal(cuMemFree_v2(m), CUDA_SUCCESS);
}

static void capture_sync_copies_and_event_queries(void **state)
{
    CUdeviceptr d;
    char buf[16] = { 0 };
    CUstream nb, b;
    CUgraph g;
    assert_int_equal(cuMemAlloc_v2(&d, 64), CUDA_SUCCESS);
    assert_int_equal(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cuStreamCreate(&b, 0), CUDA_SUCCESS);
    /* Driver 580: a synchronous copy while a non-blocking stream captures
     * (global mode, same thread) succeeds and keeps the capture. */
    assert_int_equal(cuStreamBeginCapture_v2(nb, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyHtoD_v2(d, buf, 16), CUDA_SUCCESS);
    assert_int_equal(cuMemsetD8_v2(d, 0, 16), CUDA_SUCCESS);
    assert_int_equal(cuStreamEndCapture(nb, &g), CUDA_SUCCESS);
    cuGraphDestroy(g);
    /* With a blocking stream capturing, it is an implicit dependency. */
    assert_int_equal(cuStreamBeginCapture_v2(b, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyHtoD_v2(d, buf, 16), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    assert_int_equal(cuStreamEndCapture(b, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    /* Querying an event recorded in a capture: 907, capture lost. */
    CUevent e;
    assert_int_equal(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    assert_int_equal(cuStreamBeginCapture_v2(nb, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(cuEventRecord(e, nb), CUDA_SUCCESS);
    assert_int_equal(cuEventQuery(e), CUDA_ERROR_CAPTURED_EVENT);
    assert_int_equal(cuStreamEndCapture(nb, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    /* Its record belongs to a capture that has ended: nothing to wait for. */
    assert_int_equal(cuStreamWaitEvent(b, e, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuEventRecord(e, b), CUDA_SUCCESS);
    assert_int_equal(cuStreamWaitEvent(nb, e, 0), CUDA_SUCCESS);
    cuEventDestroy_v2(e);
    cuStreamDestroy_v2(nb);
    cuStreamDestroy_v2(b);
    cuMemFree_v2(d);
}

static void live_bytes_track_each_kind(void **state)
{
    uint64_t before = fakecuda_live_bytes(FAKECUDA_ANY);
    CUdeviceptr d, a, m;
    void *h;
    CUstream s;
    assert_int_equal(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cuMemAlloc_v2(&d, 1000), CUDA_SUCCESS);
    assert_int_equal(cuMemAllocAsync(&a, 2000, s), CUDA_SUCCESS);
    assert_int_equal(cuMemAllocManaged(&m, 3000, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(cuMemHostAlloc(&h, 4000, 0), CUDA_SUCCESS);
    assert_int_equal(fakecuda_live_bytes(FAKECUDA_DEVICE), 1000);
    assert_int_equal(fakecuda_live_bytes(FAKECUDA_ASYNC), 2000);
    assert_int_equal(fakecuda_live_bytes(FAKECUDA_MANAGED), 3000);
    assert_int_equal(fakecuda_live_bytes(FAKECUDA_HOST), 4000);
    assert_int_equal(fakecuda_device_used(), 3000);
    CUdeviceptr hp;
    assert_int_equal(cuMemHostGetDevicePointer_v2(&hp, h, 0), CUDA_SUCCESS);
    assert_ptr_equal((void *)(uintptr_t)hp, h);
    assert_int_equal(cuMemHostGetDevicePointer_v2(&hp, (void *)(uintptr_t)d, 0),
                     CUDA_ERROR_INVALID_VALUE);
    /* Copies check the device side. */
    char buf[16] = "0123456789abcde";
    assert_int_equal(cuMemcpyHtoD_v2(d, buf, 16), CUDA_SUCCESS);
    assert_int_equal(cuMemcpyHtoD_v2(d + 990, buf, 16), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemcpyHtoD_v2((CUdeviceptr)(uintptr_t)buf, buf, 16), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cuMemcpyDtoDAsync_v2(a, d, 16, s), CUDA_SUCCESS);
    assert_memory_equal((void *)(uintptr_t)a, buf, 16);

    assert_int_equal(cuMemFreeAsync(a, s), CUDA_SUCCESS);
    assert_int_equal(cuMemFree_v2(d), CUDA_SUCCESS);
    assert_int_equal(cuMemFree_v2(m), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(h), CUDA_SUCCESS);
    assert_int_equal(cuMemFreeHost(h), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(fakecuda_live_bytes(FAKECUDA_ANY), before);
    cuStreamDestroy_v2(s);
}

static void device_memory_is_bounded_by_the_fake_total(void **state)
{
    size_t fr, total;
    assert_int_equal(cuMemGetInfo_v2(&fr, &total), CUDA_SUCCESS);
    CUdeviceptr p;
    assert_int_equal(cuMemAlloc_v2(&p, fr + 1), CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(cuMemAlloc_v2(&p, fr), CUDA_SUCCESS); /* MAP_NORESERVE: costs nothing */
    size_t fr2;
    cuMemGetInfo_v2(&fr2, &total);
    assert_int_equal(fr2, 0);
    assert_int_equal(cuMemFree_v2(p), CUDA_SUCCESS);
}

static void pointer_attributes_by_kind(void **state)
{
    CUdeviceptr d, m;
    void *h;
    assert_int_equal(cuMemAlloc_v2(&d, 256), CUDA_SUCCESS);
    assert_int_equal(cuMemAllocManaged(&m, 256, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(cuMemAllocHost_v2(&h, 256), CUDA_SUCCESS);
    unsigned int type = 0;
    unsigned int managed = 1; /* 4 bytes, as the real driver writes */
    CUdeviceptr start = 0;
    assert_int_equal(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d + 8), CUDA_SUCCESS);
    assert_int_equal(type, CU_MEMORYTYPE_DEVICE);
    assert_int_equal(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, d), CUDA_SUCCESS);
    assert_false(managed);
    assert_int_equal(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, d + 8),
                     CUDA_SUCCESS);
    assert_int_equal(start, d);
    assert_int_equal(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, m), CUDA_SUCCESS);
    assert_true(managed);
    assert_int_equal(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                           (CUdeviceptr)(uintptr_t)h),
                     CUDA_SUCCESS);
    assert_int_equal(type, CU_MEMORYTYPE_HOST);
    int local;
    assert_int_equal(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                           (CUdeviceptr)(uintptr_t)&local),
                     CUDA_ERROR_INVALID_VALUE);
    /* The plural form gives defaults for non-CUDA pointers. */
    CUpointer_attribute attrs[] = { CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_CONTEXT };
    CUcontext c = (CUcontext)1;
    type = 9;
    void *data[] = { &type, &c };
    assert_int_equal(cuPointerGetAttributes(2, attrs, data, (CUdeviceptr)(uintptr_t)&local),
                     CUDA_SUCCESS);
    assert_int_equal(type, 0);
    assert_null(c);
    assert_int_equal(cuPointerGetAttributes(2, attrs, data, d), CUDA_SUCCESS);
    assert_ptr_equal(c, ctx);
    cuMemFree_v2(d);
    cuMemFree_v2(m);
    cuMemFreeHost(h);
}

static void vmm_map_set_access_and_release(void **state)
{
    CUmemAllocationProp prop = { .type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                 .location = { CU_MEM_LOCATION_TYPE_DEVICE, 0 } };
    size_t g = 0;
    assert_int_equal(cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                     CUDA_SUCCESS);
    assert_int_equal(g, 2u << 20);
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    assert_int_equal(cuMemCreate(&h, g, &prop, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemCreate(&h, g + 1, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(fakecuda_live_bytes(FAKECUDA_VMM), g);
    assert_int_equal(cuMemAddressReserve(&va, 2 * g, 0, 0, 0), CUDA_SUCCESS);
    assert_int_equal(va % g, 0);
    assert_int_equal(cuMemMap(va, g, 0, h, 0), CUDA_SUCCESS);
    assert_int_equal(cuMemMap(va, g, 0, h, 0), CUDA_ERROR_INVALID_VALUE); /* overlap */
    CUmemAccessDesc ad = { .location = { CU_MEM_LOCATION_TYPE_DEVICE, 0 },
                           .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
    assert_int_equal(cuMemSetAccess(va, g, &ad, 1), CUDA_SUCCESS);
    memset((void *)(uintptr_t)va, 0x5a, 64);
    unsigned int type = 0;
    assert_int_equal(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va + 8),
                     CUDA_SUCCESS);
    assert_int_equal(type, CU_MEMORYTYPE_DEVICE);
    /* Release while mapped: the memory lives until the unmap. */
    assert_int_equal(cuMemRelease(h), CUDA_SUCCESS);
    assert_int_equal(fakecuda_live_bytes(FAKECUDA_VMM), g);
    assert_int_equal(*(unsigned char *)(uintptr_t)(va + 63), 0x5a);
    assert_int_equal(cuMemAddressFree(va, 2 * g), CUDA_ERROR_INVALID_VALUE); /* still mapped */
    assert_int_equal(cuMemUnmap(va, g), CUDA_SUCCESS);
    assert_int_equal(fakecuda_live_bytes(FAKECUDA_VMM), 0);
    assert_int_equal(cuMemAddressFree(va, 2 * g), CUDA_SUCCESS);
}

static void error_names_and_strings(void **state)
{
    const char *s = NULL;
    assert_int_equal(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s), CUDA_SUCCESS);
    assert_string_equal(s, "CUDA_ERROR_OUT_OF_MEMORY");
    assert_int_equal(cuGetErrorString(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, &s), CUDA_SUCCESS);
    assert_non_null(s);
    assert_int_equal(cuGetErrorName((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
    assert_null(s);
}

/* --- concurrency --------------------------------------------------------- */

#define NTHREADS 8
#define NITER 200

static void *worker(void *arg)
{
    cuCtxSetCurrent(ctx);
    CUstream s;
    cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
    float in[8] = { 1 }, out[8] = { 0 };
    struct io io = { in, out, 8, 0 };
    float scale = 1;
    void *params[] = { &io, &scale };
    for (int i = 0; i < NITER; i++) {
        CUdeviceptr p;
        if (cuMemAlloc_v2(&p, 4096) != CUDA_SUCCESS)
            return (void *)1;
        cuMemcpyHtoDAsync_v2(p, in, sizeof(in), s);
        cuLaunchKernel(axpy(), 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
        cuMemFree_v2(p);
    }
    cuStreamDestroy_v2(s);
    return out[0] == (float)NITER ? NULL : (void *)1;
}

static void concurrent_calls_count_exactly(void **state)
{
    fakecuda_reset_counts();
    uint64_t live = fakecuda_live_count(FAKECUDA_ANY);
    pthread_t t[NTHREADS];
    for (int i = 0; i < NTHREADS; i++)
        pthread_create(&t[i], NULL, worker, NULL);
    for (int i = 0; i < NTHREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        assert_null(r);
    }
    assert_int_equal(fakecuda_calls("cuMemAlloc_v2"), NTHREADS * NITER);
    assert_int_equal(fakecuda_calls("cuLaunchKernel"), NTHREADS * NITER);
    assert_int_equal(fakecuda_calls("cuMemFree_v2"), NTHREADS * NITER);
    assert_int_equal(fakecuda_live_count(FAKECUDA_ANY), live);
}

/* --- fork ---------------------------------------------------------------- */

static void forked_child_of_initialised_parent_cannot_use_cuda(void **state)
{
    pid_t pid = fork();
    if (pid == 0) {
        CUdeviceptr p;
        int ok = cuInit(0) == CUDA_ERROR_NOT_INITIALIZED &&
                 cuMemAlloc_v2(&p, 16) == CUDA_ERROR_NOT_INITIALIZED &&
                 fakecuda_calls("cuInit") > 0; /* instrumentation still works */
        _exit(ok ? 0 : 1);
    }
    int st = 1;
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    CUdeviceptr p;
    assert_int_equal(cuMemAlloc_v2(&p, 16), CUDA_SUCCESS); /* the parent is unaffected */
    assert_int_equal(cuMemFree_v2(p), CUDA_SUCCESS);
}

/* --- fresh-process tests ------------------------------------------------- */

static int run_child(const char *name, const char *const *env)
{
    pid_t pid = fork();
    if (pid == 0) {
        for (const char *const *e = env; e && *e; e++)
            putenv((char *)*e);
        char arg[64];
        snprintf(arg, sizeof(arg), "child:%s", name);
        execl(self_exe, self_exe, arg, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static int child_env_fail(void)
{
    CUdevice dev;
    CUcontext c;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&c, dev) || cuCtxSetCurrent(c))
        return 10;
    CUdeviceptr p;
    if (cuMemAlloc_v2(&p, 64) != CUDA_SUCCESS)
        return 11;
    if (cuMemAlloc_v2(&p, 64) != CUDA_ERROR_OUT_OF_MEMORY) /* WOFAKE_FAIL=cuMemAlloc_v2:2:2 */
        return 12;
    if (cuMemAlloc_v2(&p, 64) != CUDA_SUCCESS)
        return 13;
    CUstream s;
    for (int i = 0; i < 3; i++) /* cuStreamCreate:*:999 */
        if (cuStreamCreate(&s, 0) != CUDA_ERROR_UNKNOWN)
            return 14;
    size_t fr, total;
    if (cuMemGetInfo_v2(&fr, &total) || total != (size_t)3 << 30) /* WOFAKE_TOTAL_MEM=3G */
        return 15;
    return 0;
}

static int child_no_device(void)
{
    if (cuInit(0) != CUDA_ERROR_NO_DEVICE)
        return 20;
    int n;
    if (cuDeviceGetCount(&n) != CUDA_ERROR_NOT_INITIALIZED)
        return 21;
    return 0;
}

static int child_proc_missing_success(void)
{
    void *fn = (void *)1;
    CUdriverProcAddressQueryResult st = 77;
    if (cuGetProcAddress_v2("cuNoSuch", &fn, 13000, 0, &st) != CUDA_SUCCESS || fn ||
        st != CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)
        return 40;
    fn = (void *)1;
    if (cuGetProcAddress_v2("cuFuncGetParamInfo", &fn, 12000, 0, &st) != CUDA_SUCCESS || fn ||
        st != CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
        return 41;
    return 0;
}

static int child_memlock(void)
{
    struct rlimit rl = { 64 * 1024, 64 * 1024 };
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0)
        return 30;
    /* Root bypasses RLIMIT_MEMLOCK (CAP_IPC_LOCK): become nobody. */
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0))
        return 31;
    CUdevice dev;
    CUcontext c;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&c, dev) || cuCtxSetCurrent(c))
        return 32;
    void *h = NULL;
    if (cuMemHostAlloc(&h, 1 << 20, 0) != CUDA_ERROR_OUT_OF_MEMORY)
        return 33;
    if (cuMemAllocHost_v2(&h, 1 << 20) != CUDA_ERROR_OUT_OF_MEMORY)
        return 34;
    if (fakecuda_live_bytes(FAKECUDA_HOST) != 0)
        return 35;
    if (cuMemHostAlloc(&h, 4096, 0) != CUDA_SUCCESS)
        return 36;
    static char big[1 << 20];
    if (cuMemHostRegister_v2(big, sizeof(big), 0) != CUDA_ERROR_OUT_OF_MEMORY)
        return 37;
    return cuMemFreeHost(h) == CUDA_SUCCESS ? 0 : 38;
}

/* WOFAKE_STREAMS_BEHIND=1 (tests/fake/fake-behind.c): a stream wait not
 * met returns at once and what follows on its stream queues, in order,
 * until another thread writes the value; queries say not ready meanwhile,
 * a stream waiting on an event recorded there falls behind too (until the
 * record it waits for ran: the event's last when the wait was made), and a
 * free waits for the queues. */
static void *write_later(void *p)
{
    usleep(100 * 1000);
    __atomic_store_n((uint32_t *)p, 2, __ATOMIC_RELEASE);
    return NULL;
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int child_behind(void)
{
    CUdevice dev;
    CUcontext c;
    CUstream s, s2;
    CUevent e;
    CUdeviceptr a, b, x;
    uint32_t *flag = NULL;
    unsigned char src[256], got[256];
    pthread_t t;

    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&c, dev) ||
        cuCtxSetCurrent(c))
        return 40;
    if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) || cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING) ||
        cuEventCreate(&e, 0) || cuMemAlloc_v2(&a, sizeof(src)) || cuMemAlloc_v2(&b, sizeof(src)) ||
        cuMemAlloc_v2(&x, 64) || cuMemHostAlloc((void **)&flag, 4096, 0))
        return 41;
    memset(src, 7, sizeof(src));
    if (cuMemsetD8_v2(a, 0, sizeof(src)) || cuMemsetD8_v2(b, 0, sizeof(src)))
        return 42;
    *flag = 0;
    /* the wait returns at once; the copy and the record after it queue */
    if (cuStreamWaitValue32_v2(s, (CUdeviceptr)(uintptr_t)flag, 1, CU_STREAM_WAIT_VALUE_GEQ) ||
        cuMemcpyHtoDAsync_v2(a, src, sizeof(src), s) || cuEventRecord(e, s))
        return 43;
    if (((unsigned char *)(uintptr_t)a)[0] != 0)
        return 44; /* ran before the value was written */
    if (cuStreamQuery(s) != CUDA_ERROR_NOT_READY || cuEventQuery(e) != CUDA_ERROR_NOT_READY)
        return 45;
    if (fakecuda_behind_queued() != 3)
        return 46;
    /* s2 waits on the event: behind as well, its copy after s's */
    if (cuStreamWaitEvent(s2, e, 0) || cuMemcpyDtoDAsync_v2(b, a, sizeof(src), s2))
        return 47;
    if (cuStreamQuery(s2) != CUDA_ERROR_NOT_READY)
        return 48;
    __atomic_store_n(flag, 1, __ATOMIC_RELEASE);
    if (cuStreamSynchronize(s2) || cuEventQuery(e) != CUDA_SUCCESS ||
        cuStreamQuery(s) != CUDA_SUCCESS)
        return 49;
    if (cuMemcpyDtoH_v2(got, b, sizeof(got)) || memcmp(got, src, sizeof(src)) != 0)
        return 50; /* in order: a filled before b was copied from it */
    /* a free waits for the context's work: here a wait another thread
     * meets 100 ms later */
    if (cuStreamWaitValue32_v2(s, (CUdeviceptr)(uintptr_t)flag, 2, CU_STREAM_WAIT_VALUE_GEQ) ||
        cuStreamQuery(s) != CUDA_ERROR_NOT_READY || pthread_create(&t, NULL, write_later, flag))
        return 51;
    double t0 = now_ms();
    CUresult r = cuMemFree_v2(x);
    double waited = now_ms() - t0;
    pthread_join(t, NULL);
    if (r != CUDA_SUCCESS || waited < 80 || cuStreamQuery(s) != CUDA_SUCCESS)
        return 52;
    /* a wait is for the record that was the last when it was made (CUDA:
     * the event's most recent record), not for one made after: s2 waits on
     * e's record behind s's wait, then s waits on f, recorded on s2 after
     * that, and records e again. Waiting for every record of e, s2 would
     * wait on s and s on s2, for good */
    CUevent f;
    if (cuEventCreate(&f, 0) ||
        cuStreamWaitValue32_v2(s, (CUdeviceptr)(uintptr_t)flag, 3, CU_STREAM_WAIT_VALUE_GEQ) ||
        cuEventRecord(e, s) || cuStreamWaitEvent(s2, e, 0) || cuEventRecord(f, s2) ||
        cuStreamWaitEvent(s, f, 0) || cuEventRecord(e, s))
        return 54;
    if (cuEventQuery(e) != CUDA_ERROR_NOT_READY || cuEventQuery(f) != CUDA_ERROR_NOT_READY)
        return 55;
    __atomic_store_n(flag, 3, __ATOMIC_RELEASE);
    if (cuStreamSynchronize(s2) || cuStreamSynchronize(s) || cuEventQuery(e) != CUDA_SUCCESS ||
        cuEventQuery(f) != CUDA_SUCCESS)
        return 56;
    /* a record that ran (on an idle stream) is the last one: a wait on it
     * waits for nothing, though an earlier record still waits behind */
    if (cuStreamWaitValue32_v2(s, (CUdeviceptr)(uintptr_t)flag, 4, CU_STREAM_WAIT_VALUE_GEQ) ||
        cuEventRecord(e, s) || cuEventRecord(e, s2) || cuEventQuery(e) != CUDA_SUCCESS ||
        cuStreamWaitEvent(s2, e, 0) || cuStreamQuery(s2) != CUDA_SUCCESS)
        return 57;
    __atomic_store_n(flag, 4, __ATOMIC_RELEASE);
    if (cuStreamSynchronize(s) || cuEventDestroy_v2(f))
        return 58;
    if (cuEventDestroy_v2(e) || cuStreamDestroy_v2(s) || cuStreamDestroy_v2(s2) ||
        cuMemFree_v2(a) || cuMemFree_v2(b) || cuMemFreeHost(flag))
        return 53;
    return 0;
}

static void streams_behind_their_callers(void **state)
{
    const char *env[] = {"WOFAKE_STREAMS_BEHIND=1", "WOFAKE_WAIT_MS=2000", NULL};
    assert_int_equal(run_child("behind", env), 0);
}

static void env_fail_rules_and_total_mem(void **state)
{
    const char *env[] = { "WOFAKE_FAIL=cuMemAlloc_v2:2:2,cuStreamCreate:*:999",
                          "WOFAKE_TOTAL_MEM=3G", NULL };
    assert_int_equal(run_child("env_fail", env), 0);
}

static void env_no_device_fails_init(void **state)
{
    const char *env[] = { "WOFAKE_NO_DEVICE=1", NULL };
    assert_int_equal(run_child("no_device", env), 0);
}

static void env_proc_missing_success_as_driver_580(void **state)
{
    const char *env[] = { "WOFAKE_PROC_MISSING=success", NULL };
    assert_int_equal(run_child("proc_missing", env), 0);
}

static void pinned_alloc_fails_under_small_memlock(void **state)
{
    assert_int_equal(run_child("memlock", NULL), 0);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strncmp(argv[1], "child:", 6) == 0) {
        const char *n = argv[1] + 6;
        if (strcmp(n, "env_fail") == 0)
            return child_env_fail();
        if (strcmp(n, "no_device") == 0)
            return child_no_device();
        if (strcmp(n, "memlock") == 0)
            return child_memlock();
        if (strcmp(n, "proc_missing") == 0)
            return child_proc_missing_success();
        if (strcmp(n, "behind") == 0)
            return child_behind();
        return 126;
    }
    ssize_t len = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
    if (len <= 0)
        return 1;
    self_exe[len] = '\0';

    const struct CMUnitTest tests[] = {
        cmocka_unit_test(calls_before_init_fail_not_initialized),
        cmocka_unit_test(streams_behind_their_callers),
        cmocka_unit_test(context_bound_calls_need_a_current_context),
        cmocka_unit_test(counters_count_every_call_by_abi_name),
        cmocka_unit_test(function_list_names_every_exported_symbol),
        cmocka_unit_test(fail_nth_call_fails_once_without_effect),
        cmocka_unit_test(fail_every_fails_until_cleared),
        cmocka_unit_test(fail_rejects_unknown_names_and_zero),
        cmocka_unit_test(fail_applies_to_every_listed_function),
        cmocka_unit_test(proc_address_versions_flags_and_status),
        cmocka_unit_test(proc_address_resolves_every_name_both_flavours),
        cmocka_unit_test(param_info_uses_natural_alignment),
        cmocka_unit_test(launch_ex_honours_config_and_extra_buffer),
        cmocka_unit_test(capture_records_launches_and_graph_replays_them),
        cmocka_unit_test(capture_global_mode_forbids_unsafe_calls_elsewhere),
        cmocka_unit_test(capture_global_mode_limits_a_prefetch_thread),
        cmocka_unit_test(capture_legacy_stream_use_is_an_implicit_dependency),
        cmocka_unit_test(capture_fork_join_through_events),
        cmocka_unit_test(managed_residency_follows_prefetch),
        cmocka_unit_test(declared_accesses_fault_migrate_or_go_remote),
        cmocka_unit_test(prefetch_on_capturing_stream_breaks_the_capture),
        cmocka_unit_test(capture_sync_copies_and_event_queries),
        cmocka_unit_test(live_bytes_track_each_kind),
        cmocka_unit_test(device_memory_is_bounded_by_the_fake_total),
        cmocka_unit_test(pointer_attributes_by_kind),
        cmocka_unit_test(vmm_map_set_access_and_release),
        cmocka_unit_test(error_names_and_strings),
        cmocka_unit_test(concurrent_calls_count_exactly),
        cmocka_unit_test(forked_child_of_initialised_parent_cannot_use_cuda),
        cmocka_unit_test(env_fail_rules_and_total_mem),
        cmocka_unit_test(env_no_device_fails_init),
        cmocka_unit_test(env_proc_missing_success_as_driver_580),
        cmocka_unit_test(pinned_alloc_fails_under_small_memlock),
    };
    return cmocka_run_group_tests_name("fake", tests, NULL, NULL);
}
