/* tests/test-interpose-driver.c: the shim in front of a driver reached the
 * way cuBLAS/NCCL's static CUDA runtimes reach it (dlopen libcuda.so.1,
 * dlsym cuGetProcAddress_v2, the inner resolver with flags 0 and 2 and a
 * NULL status, plus direct dlsym of launch functions).
 *
 * Runs under LD_PRELOAD=libwoffload.so with the fake driver on
 * LD_LIBRARY_PATH and checks, from the shim's own stats: symbolStatus and
 * results exactly as the driver gives them (found / not found / version not
 * sufficient), NULL out-parameters, per-thread variants in their own slots,
 * the version picking the ABI, dlsym substitution limited to the driver's own
 * hooked functions, RTLD_NEXT relative to the caller, exact counts of
 * allocations, copies and launches, pointers inside by-value structs and the
 * `extra` form attributed, capture and graph launches attributed, VMM maps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <cudaTypedefs.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fakecuda.h"
#include "interpose-common.h"

/* From libinterpose-next-a.so (tests/interpose-next.c). */
int wo_next_probe(void);
int wo_next_from_a(void);
int wo_next_b_marker(void);

static void *lib;
static PFN_cuGetProcAddress_v12000 gpa, inner;
static CUfunction f_add, f_axpy, f_info;
static CUstream stream;
static CUcontext ctx;
static CUfunction (*reg)(const char *, int, const size_t *, fakecuda_kernel_fn);
static PFN_cuCtxSetCurrent_v4000 set_current;
static PFN_cuInit_v2000 init;
static PFN_cuDeviceGet_v2000 device_get;
static PFN_cuDevicePrimaryCtxRetain_v7000 retain;

static struct {
    PFN_cuMemAlloc_v3020 alloc;
    PFN_cuMemFree_v3020 free;
    PFN_cuMemcpyHtoD_v3020 htod;
    PFN_cuMemcpyDtoH_v3020 dtoh;
    PFN_cuMemcpyDtoD_v3020 dtod;
    PFN_cuMemcpyHtoDAsync_v3020 htod_async;
    PFN_cuLaunchKernel_v4000 launch;
    PFN_cuLaunchKernel_v4000 launch_pt;
    PFN_cuLaunchKernelEx_v11060 launch_ex;
    PFN_cuStreamSynchronize_v2000 sync;
    PFN_cuStreamBeginCapture_v10010 begin_capture;
    PFN_cuStreamEndCapture_v10000 end_capture;
    PFN_cuGraphInstantiateWithFlags_v11040 instantiate;
    PFN_cuGraphLaunch_v10000 graph_launch;
    PFN_cuMemCreate_v10020 create;
    PFN_cuMemRelease_v10020 release;
    PFN_cuMemMap_v10020 map;
    PFN_cuMemUnmap_v10020 unmap;
    PFN_cuMemAddressReserve_v10020 reserve;
    PFN_cuMemAddressFree_v10020 address_free;
    PFN_cuMemSetAccess_v10020 set_access;
} d;

struct io {
    const float *in;
    float *out;
    int n;
    int pad;
};

static void k_add(void **p, const uint32_t grid[3], const uint32_t block[3])
{
    const float *x = *(const float **)p[0];
    float *y = *(float **)p[1];
    float c = *(float *)p[2];
    int n = *(int *)p[3];
    (void)grid;
    (void)block;
    for (int i = 0; i < n; i++)
        y[i] = x[i] + c;
}

static void k_axpy(void **p, const uint32_t grid[3], const uint32_t block[3])
{
    struct io a;
    float scale = *(float *)p[1];
    (void)grid;
    (void)block;
    memcpy(&a, p[0], sizeof(a));
    for (int i = 0; i < a.n; i++)
        a.out[i] += a.in[i] * scale;
}

/* PyTorch's TensorInfo in small: a pointer, then sizes of which only the
 * first `dims` are filled (the rest hold what the caller's stack held). */
struct info {
    float *data;
    int64_t sizes[3];
    int64_t dims;
};

static void k_info(void **p, const uint32_t grid[3], const uint32_t block[3])
{
    struct info a;
    (void)grid;
    (void)block;
    memcpy(&a, p[0], sizeof(a));
    for (int64_t k = 0; k < a.dims && k < 3; k++)
        a.data[k] = (float)a.sizes[k];
}

static void *resolve(const char *name, cuuint64_t flags)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = inner(name, &p, 13000, flags, &st);
    if (r != CUDA_SUCCESS || st != CU_GET_PROC_ADDRESS_SUCCESS || !p)
        fail_msg("resolve %s flags %llu: %d/%d", name, (unsigned long long)flags, r, st);
    return p;
}

static int setup(void **state)
{
    PFN_cuStreamCreate_v2000 stream_create;
    CUdevice dev;
    static const size_t sz_add[] = {sizeof(float *), sizeof(float *), sizeof(float), sizeof(int)};
    static const size_t sz_axpy[] = {sizeof(struct io), sizeof(float)};
    static const size_t sz_info[] = {sizeof(struct info)};
    (void)state;

    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return -1;
    gpa = (PFN_cuGetProcAddress_v12000)dlsym(lib, "cuGetProcAddress_v2");
    if (!gpa || gpa("cuGetProcAddress", (void **)&inner, 13000, 0, NULL) != CUDA_SUCCESS || !inner)
        return -1;
    init = resolve("cuInit", 0);
    device_get = resolve("cuDeviceGet", 0);
    retain = resolve("cuDevicePrimaryCtxRetain", 0);
    set_current = resolve("cuCtxSetCurrent", 0);
    stream_create = resolve("cuStreamCreate", 0);
    d.alloc = resolve("cuMemAlloc", 0);
    d.free = resolve("cuMemFree", 0);
    d.htod = resolve("cuMemcpyHtoD", 0);
    d.dtoh = resolve("cuMemcpyDtoH", 0);
    d.dtod = resolve("cuMemcpyDtoD", 0);
    d.htod_async = resolve("cuMemcpyHtoDAsync", 0);
    d.launch = resolve("cuLaunchKernel", 0);
    d.launch_pt = resolve("cuLaunchKernel", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    d.sync = resolve("cuStreamSynchronize", 0);
    d.begin_capture = resolve("cuStreamBeginCapture", 0);
    d.end_capture = resolve("cuStreamEndCapture", 0);
    d.instantiate = resolve("cuGraphInstantiateWithFlags", 0);
    d.graph_launch = resolve("cuGraphLaunch", 0);
    d.create = resolve("cuMemCreate", 0);
    d.release = resolve("cuMemRelease", 0);
    d.map = resolve("cuMemMap", 0);
    d.unmap = resolve("cuMemUnmap", 0);
    d.reserve = resolve("cuMemAddressReserve", 0);
    d.address_free = resolve("cuMemAddressFree", 0);
    d.set_access = resolve("cuMemSetAccess", 0);
    /* cuBLAS looks launch functions up with dlsym directly. */
    d.launch_ex = (PFN_cuLaunchKernelEx_v11060)dlsym(lib, "cuLaunchKernelEx");
    if (!d.launch_ex || init(0) != CUDA_SUCCESS || device_get(&dev, 0) != CUDA_SUCCESS ||
        retain(&ctx, dev) != CUDA_SUCCESS || set_current(ctx) != CUDA_SUCCESS ||
        stream_create(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
        return -1;
    reg = (CUfunction(*)(const char *, int, const size_t *, fakecuda_kernel_fn))dlsym(
        lib, "fakecuda_kernel");
    if (!reg)
        return -1;
    f_add = reg("interpose_add", 4, sz_add, k_add);
    f_axpy = reg("interpose_axpy", 2, sz_axpy, k_axpy);
    f_info = reg("interpose_info", 1, sz_info, k_info);
    return f_add && f_axpy && f_info ? 0 : -1;
}

static uint64_t fake_calls(const char *name)
{
    uint64_t (*calls)(const char *) = (uint64_t(*)(const char *))dlsym(lib, "fakecuda_calls");
    assert_non_null(calls);
    return calls(name);
}

/* --- resolvers ------------------------------------------------------------ */

static void proc_status_found_not_found_version(void **state)
{
    void *p = (void *)1;
    CUdriverProcAddressQueryResult st = (CUdriverProcAddressQueryResult)99;
    (void)state;

    /* found, hooked: a wrapper from the shim, status as the driver says */
    assert_int_equal(inner("cuMemAlloc", &p, 13000, 0, &st), CUDA_SUCCESS);
    assert_int_equal(st, CU_GET_PROC_ADDRESS_SUCCESS);
    assert_true(wo_addr_in(p, "libwoffload"));
    /* found, not hooked: the driver's own function */
    assert_int_equal(inner("cuStreamQuery", &p, 13000, 0, &st), CUDA_SUCCESS);
    assert_int_equal(st, CU_GET_PROC_ADDRESS_SUCCESS);
    assert_true(wo_addr_in(p, "libcuda"));
    /* not found */
    p = (void *)1;
    assert_int_equal(inner("cuNoSuchFunction", &p, 13000, 0, &st), CUDA_ERROR_NOT_FOUND);
    assert_int_equal(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    assert_null(p);
    /* known, but only at a later version than asked */
    p = (void *)1;
    assert_int_equal(inner("cuLaunchKernelEx", &p, 11000, 0, &st), CUDA_ERROR_NOT_FOUND);
    assert_int_equal(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    assert_null(p);
    /* the outer resolver behaves the same */
    p = (void *)1;
    assert_int_equal(gpa("cuMemAlloc", &p, 3000, 0, &st), CUDA_ERROR_NOT_FOUND);
    assert_int_equal(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    assert_null(p);
}

static void proc_null_out_params(void **state)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    (void)state;

    /* NULL pfn: the driver's error, no crash */
    assert_int_equal(inner("cuMemAlloc", NULL, 13000, 0, &st), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(gpa("cuMemAlloc", NULL, 13000, 0, NULL), CUDA_ERROR_INVALID_VALUE);
    /* NULL status: found and not found */
    assert_int_equal(inner("cuLaunchKernel", &p, 13000, 0, NULL), CUDA_SUCCESS);
    assert_true(wo_addr_in(p, "libwoffload"));
    assert_int_equal(inner("cuNoSuchFunction", &p, 13000, 0, NULL), CUDA_ERROR_NOT_FOUND);
    assert_null(p);
    /* NULL name */
    assert_int_equal(inner(NULL, &p, 13000, 0, NULL), CUDA_ERROR_INVALID_VALUE);
}

static void proc_per_thread_variant_has_its_own_slot(void **state)
{
    void *p0 = resolve("cuLaunchKernel", 0), *p2 = resolve("cuLaunchKernel", 2);
    uint64_t legacy = fake_calls("cuLaunchKernel"), pt = fake_calls("cuLaunchKernel_ptsz");
    long long c_legacy = wo_calls("cuLaunchKernel"), c_pt = wo_calls("cuLaunchKernel_ptsz");
    float *x = malloc(64), *y = malloc(64), c = 1.0f;
    int n = 16;
    void *params[] = {&x, &y, &c, &n};
    (void)state;

    assert_true(p0 != p2);
    assert_true(wo_addr_in(p0, "libwoffload") && wo_addr_in(p2, "libwoffload"));
    /* Same (name, version, flags): the same wrapper again. */
    assert_ptr_equal(resolve("cuLaunchKernel", 2), p2);
    memset(x, 0, 64);
    assert_int_equal(((PFN_cuLaunchKernel_v4000)p0)(f_add, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL),
                     CUDA_SUCCESS);
    assert_int_equal(((PFN_cuLaunchKernel_v4000)p2)(f_add, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL),
                     CUDA_SUCCESS);
    /* Each wrapper reached its own real function. */
    assert_int_equal(fake_calls("cuLaunchKernel"), legacy + 1);
    assert_int_equal(fake_calls("cuLaunchKernel_ptsz"), pt + 1);
    assert_int_equal(wo_calls("cuLaunchKernel"), c_legacy + 1);
    assert_int_equal(wo_calls("cuLaunchKernel_ptsz"), c_pt + 1);
    free(x);
    free(y);
}

static void proc_version_selects_the_abi(void **state)
{
    PFN_cuGetProcAddress_v11030 v1 = NULL;
    void *p = NULL, *q = NULL;
    long long v1_calls = wo_calls("cuGetProcAddress");
    (void)state;

    /* 11.3 asks for "cuGetProcAddress": the four-argument resolver. */
    assert_int_equal(gpa("cuGetProcAddress", (void **)&v1, 11030, 0, NULL), CUDA_SUCCESS);
    assert_true(wo_addr_in((void *)v1, "libwoffload"));
    assert_int_equal(v1("cuMemAlloc", &p, 13000, 0), CUDA_SUCCESS);
    assert_true(wo_addr_in(p, "libwoffload"));
    assert_int_equal(wo_calls("cuGetProcAddress"), v1_calls + 1);
    /* A version newer than the driver: its error, out-parameters untouched
     * (driver 580 does that; the fake follows it). */
    q = (void *)1;
    assert_int_equal(inner("cuMemAlloc", &q, 14000, 0, NULL), CUDA_ERROR_INVALID_VALUE);
    assert_ptr_equal(q, (void *)1);
}

/* --- dlsym ------------------------------------------------------------------ */

static void dlsym_substitutes_only_hooked_driver_functions(void **state)
{
    void *p;
    (void)state;

    p = dlsym(lib, "cuLaunchKernel");
    assert_true(wo_addr_in(p, "libwoffload"));
    p = dlsym(lib, "cuLaunchKernel_ptsz");
    assert_true(wo_addr_in(p, "libwoffload"));
    assert_true(p != dlsym(lib, "cuLaunchKernel"));
    /* not hooked, or not CUDA: exactly what the driver library defines */
    assert_true(wo_addr_in(dlsym(lib, "cuFuncGetParamInfo"), "libcuda"));
    assert_true(wo_addr_in(dlsym(lib, "fakecuda_kernel"), "libcuda"));
    /* failures stay failures, with dlerror set */
    dlerror();
    assert_null(dlsym(lib, "cuNoSuchFunction"));
    assert_non_null(dlerror());
    assert_null(dlvsym(lib, "cuLaunchKernel", "NO_SUCH_VERSION"));
    /* other libraries' symbols */
    assert_ptr_equal(dlsym(RTLD_DEFAULT, "getpid"), (void *)getpid);
    assert_ptr_equal(dlvsym(RTLD_DEFAULT, "getpid", "GLIBC_2.2.5"), (void *)getpid);
}

static void dlsym_rtld_next_is_relative_to_the_caller(void **state)
{
    int (*probe)(void);
    (void)state;

    /* From the program: the first definition after it (library a). */
    probe = (int (*)(void))dlsym(RTLD_NEXT, "wo_next_probe");
    assert_non_null(probe);
    assert_int_equal(probe(), 'a');
    /* From library a: the next one after a (library b), not after the shim. */
    assert_int_equal(wo_next_from_a(), 'b');
    assert_int_equal(wo_next_probe(), 'a');
    assert_int_equal(wo_next_b_marker(), 'b');
    assert_null(dlsym(RTLD_NEXT, "wo_no_such_symbol_anywhere"));
}

/* --- counts ------------------------------------------------------------------ */

#define NALLOC 5
#define BYTES 4096

static void counts_allocs_copies_launches_exactly(void **state)
{
    long long a0 = wo_counter("alloc_calls"), f0 = wo_counter("free_calls");
    long long h2d0 = wo_counter("copy_h2d"), d2h0 = wo_counter("copy_d2h");
    long long d2d0 = wo_counter("copy_d2d"), bytes0 = wo_counter("copy_bytes");
    long long l0 = wo_counter("launch_calls"), ld0 = wo_counter("launch_driver");
    long long le0 = wo_counter("launch_ex");
    CUdeviceptr buf[NALLOC];
    float host[BYTES / sizeof(float)], c = 2.0f;
    int n = BYTES / sizeof(float);
    (void)state;

    for (int i = 0; i < n; i++)
        host[i] = (float)i;
    for (int i = 0; i < NALLOC; i++)
        assert_int_equal(d.alloc(&buf[i], BYTES), CUDA_SUCCESS);
    assert_int_equal(d.htod(buf[0], host, BYTES), CUDA_SUCCESS);
    assert_int_equal(d.htod_async(buf[1], host, BYTES, stream), CUDA_SUCCESS);
    assert_int_equal(d.dtod(buf[2], buf[0], BYTES), CUDA_SUCCESS);
    {
        void *params[] = {&buf[0], &buf[3], &c, &n};
        CUlaunchConfig cfg = {.gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 32,
                              .blockDimY = 1, .blockDimZ = 1, .hStream = stream};
        for (int i = 0; i < 3; i++)
            assert_int_equal(d.launch(f_add, 1, 1, 1, 32, 1, 1, 0, stream, params, NULL),
                             CUDA_SUCCESS);
        for (int i = 0; i < 2; i++)
            assert_int_equal(d.launch_ex(&cfg, f_add, params, NULL), CUDA_SUCCESS);
    }
    assert_int_equal(d.sync(stream), CUDA_SUCCESS);
    assert_int_equal(d.dtoh(host, buf[3], BYTES), CUDA_SUCCESS);
    assert_true(host[5] == 7.0f);
    for (int i = 0; i < NALLOC; i++)
        assert_int_equal(d.free(buf[i]), CUDA_SUCCESS);
    /* A failing call is not counted as an allocation. */
    {
        CUdeviceptr big = 0;
        long long failed0 = wo_counter("alloc_failed");
        assert_int_not_equal(d.alloc(&big, (size_t)1 << 62), CUDA_SUCCESS);
        assert_int_equal(wo_counter("alloc_failed"), failed0 + 1);
    }

    assert_int_equal(wo_counter("alloc_calls"), a0 + NALLOC);
    assert_int_equal(wo_counter("free_calls"), f0 + NALLOC);
    assert_int_equal(wo_counter("copy_h2d"), h2d0 + 2);
    assert_int_equal(wo_counter("copy_d2h"), d2h0 + 1);
    assert_int_equal(wo_counter("copy_d2d"), d2d0 + 1);
    assert_int_equal(wo_counter("copy_bytes"), bytes0 + 4 * BYTES);
    assert_int_equal(wo_counter("launch_calls"), l0 + 5);
    assert_int_equal(wo_counter("launch_driver"), ld0 + 3);
    assert_int_equal(wo_counter("launch_ex"), le0 + 2);
}

static void launch_pointers_inside_by_value_structs_are_attributed(void **state)
{
    CUdeviceptr in, out, other;
    float scale = 1.0f;
    float host_in[64];
    struct io io;
    void *params[] = {&io, &scale};
    long long w0, h0, w1, h1;
    (void)state;

    assert_int_equal(d.alloc(&in, 256), CUDA_SUCCESS);
    assert_int_equal(d.alloc(&out, 256), CUDA_SUCCESS);
    assert_int_equal(d.alloc(&other, 256), CUDA_SUCCESS);
    w0 = wo_counter("launch_with_hits");
    h0 = wo_counter("launch_hits");
    /* Both pointers inside the struct, one of them into the middle. */
    io = (struct io){(const float *)(uintptr_t)(in + 64), (float *)(uintptr_t)out, 8, 0};
    assert_int_equal(d.launch(f_axpy, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL), CUDA_SUCCESS);
    w1 = wo_counter("launch_with_hits");
    h1 = wo_counter("launch_hits");
    assert_int_equal(w1, w0 + 1);
    assert_int_equal(h1, h0 + 2);
    /* Host memory nobody allocated through CUDA: no hit. */
    io = (struct io){host_in, (float *)host_in, 0, 0};
    assert_int_equal(d.launch(f_axpy, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL), CUDA_SUCCESS);
    assert_int_equal(wo_counter("launch_with_hits"), w1);
    assert_int_equal(wo_counter("launch_hits"), h1);
    assert_int_equal(d.free(in), CUDA_SUCCESS);
    assert_int_equal(d.free(out), CUDA_SUCCESS);
    /* A freed range is no longer attributed. */
    io = (struct io){(const float *)(uintptr_t)in, (float *)(uintptr_t)other, 0, 0};
    assert_int_equal(d.launch(f_axpy, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL), CUDA_SUCCESS);
    assert_int_equal(wo_counter("launch_hits"), h1 + 1);
    assert_int_equal(d.free(other), CUDA_SUCCESS);
}

/* A word that held a small integer is a size, a stride or an unused struct
 * member, not a pointer slot: an address found there later (what the host
 * stack left in PyTorch's unfilled TensorInfo dimensions) is no read. */
static void launch_words_that_held_integers_are_no_pointers(void **state)
{
    CUdeviceptr data, other;
    struct info in;
    void *params[] = {&in};
    long long h0, n0;
    (void)state;

    assert_int_equal(d.alloc(&data, 256), CUDA_SUCCESS);
    assert_int_equal(d.alloc(&other, 256), CUDA_SUCCESS);
    /* first sight: an address in an unfilled size is taken for a pointer */
    h0 = wo_counter("launch_hits");
    n0 = wo_counter("launch_hit_notptr");
    in = (struct info){(float *)(uintptr_t)data, {4, (int64_t)(other + 64), 0}, 1};
    assert_int_equal(d.launch(f_info, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL), CUDA_SUCCESS);
    assert_int_equal(wo_counter("launch_hits"), h0 + 2);
    /* a launch with two dimensions fills it with an integer ... */
    in = (struct info){(float *)(uintptr_t)data, {4, 3, 0}, 2};
    assert_int_equal(d.launch(f_info, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL), CUDA_SUCCESS);
    assert_int_equal(wo_counter("launch_hits"), h0 + 3);
    /* ... and from then on an address there is no read */
    in = (struct info){(float *)(uintptr_t)data, {4, (int64_t)(other + 64), 0}, 1};
    assert_int_equal(d.launch(f_info, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL), CUDA_SUCCESS);
    assert_int_equal(wo_counter("launch_hits"), h0 + 4);
    assert_int_equal(wo_counter("launch_hit_notptr"), n0 + 1);
    /* the pointer slot still is one (the stale word is counted per word) */
    in.data = (float *)(uintptr_t)other;
    assert_int_equal(d.launch(f_info, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL), CUDA_SUCCESS);
    assert_int_equal(wo_counter("launch_hits"), h0 + 5);
    assert_int_equal(wo_counter("launch_hit_notptr"), n0 + 2);
    assert_int_equal(d.free(data), CUDA_SUCCESS);
    assert_int_equal(d.free(other), CUDA_SUCCESS);
}

static void launch_extra_buffer_form_is_scanned(void **state)
{
    CUdeviceptr x, y;
    struct {
        CUdeviceptr x, y;
        float c;
        int n;
    } args;
    size_t size = sizeof(args);
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &args, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                     CU_LAUNCH_PARAM_END};
    long long h0;
    (void)state;

    assert_int_equal(d.alloc(&x, 128), CUDA_SUCCESS);
    assert_int_equal(d.alloc(&y, 128), CUDA_SUCCESS);
    args.x = x;
    args.y = y;
    args.c = 1.0f;
    args.n = 4;
    h0 = wo_counter("launch_hits");
    assert_int_equal(d.launch(f_add, 1, 1, 1, 1, 1, 1, 0, stream, NULL, extra), CUDA_SUCCESS);
    assert_int_equal(wo_counter("launch_hits"), h0 + 2);
    assert_int_equal(d.free(x), CUDA_SUCCESS);
    assert_int_equal(d.free(y), CUDA_SUCCESS);
}

static void capture_and_graph_launches_are_attributed(void **state)
{
    CUdeviceptr in, out;
    float scale = 1.0f;
    struct io io;
    void *params[] = {&io, &scale};
    CUgraph g = NULL;
    CUgraphExec ge = NULL;
    long long cb = wo_counter("capture_begin"), ce = wo_counter("capture_end");
    long long lc = wo_counter("launch_captured"), gi = wo_counter("graph_instantiate");
    long long gl = wo_counter("graph_launch"), gla = wo_counter("graph_launch_attributed");
    long long glk = wo_counter("graph_launch_kernels"), glh = wo_counter("graph_launch_hits");
    long long lh;
    (void)state;

    assert_int_equal(d.alloc(&in, 256), CUDA_SUCCESS);
    assert_int_equal(d.alloc(&out, 256), CUDA_SUCCESS);
    io = (struct io){(const float *)(uintptr_t)in, (float *)(uintptr_t)out, 4, 0};
    assert_int_equal(d.begin_capture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    lh = wo_counter("launch_hits");
    assert_int_equal(d.launch(f_axpy, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL), CUDA_SUCCESS);
    assert_int_equal(d.launch(f_axpy, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL), CUDA_SUCCESS);
    assert_int_equal(wo_counter("launch_hits"), lh + 4);
    assert_int_equal(d.end_capture(stream, &g), CUDA_SUCCESS);
    assert_int_equal(d.instantiate(&ge, g, 0), CUDA_SUCCESS);
    for (int i = 0; i < 3; i++)
        assert_int_equal(d.graph_launch(ge, stream), CUDA_SUCCESS);
    assert_int_equal(d.sync(stream), CUDA_SUCCESS);
    /* Not capturing any more: a launch is an ordinary launch again. */
    assert_int_equal(d.launch(f_axpy, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL), CUDA_SUCCESS);

    assert_int_equal(wo_counter("capture_begin"), cb + 1);
    assert_int_equal(wo_counter("capture_end"), ce + 1);
    assert_int_equal(wo_counter("launch_captured"), lc + 2);
    assert_int_equal(wo_counter("graph_instantiate"), gi + 1);
    assert_int_equal(wo_counter("graph_launch"), gl + 3);
    assert_int_equal(wo_counter("graph_launch_attributed"), gla + 3);
    assert_int_equal(wo_counter("graph_launch_kernels"), glk + 6);
    assert_int_equal(wo_counter("graph_launch_hits"), glh + 12);
    assert_int_equal(d.free(in), CUDA_SUCCESS);
    assert_int_equal(d.free(out), CUDA_SUCCESS);
}

static void vmm_mappings_are_observed(void **state)
{
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CUmemAccessDesc access = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                              .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    size_t sz = 2 << 20;
    CUmemGenericAllocationHandle h1, h2;
    CUdeviceptr va;
    long long c0 = wo_counter("vmm_create"), m0 = wo_counter("vmm_map");
    long long u0 = wo_counter("vmm_unmap"), r0 = wo_counter("vmm_release"), lh;
    float c = 0.0f;
    int n = 0;
    CUdeviceptr x, y;
    void *params[] = {&x, &y, &c, &n};
    (void)state;

    assert_int_equal(d.create(&h1, sz, &prop, 0), CUDA_SUCCESS);
    assert_int_equal(d.create(&h2, sz, &prop, 0), CUDA_SUCCESS);
    assert_int_equal(d.reserve(&va, 2 * sz, 0, 0, 0), CUDA_SUCCESS);
    assert_int_equal(d.map(va, sz, 0, h1, 0), CUDA_SUCCESS);
    assert_int_equal(d.map(va + sz, sz, 0, h2, 0), CUDA_SUCCESS);
    assert_int_equal(d.set_access(va, 2 * sz, &access, 1), CUDA_SUCCESS);
    x = va + 16;
    y = va + sz + 16;
    lh = wo_counter("launch_hits");
    assert_int_equal(d.launch(f_add, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL), CUDA_SUCCESS);
    assert_int_equal(wo_counter("launch_hits"), lh + 2);
    /* One unmap over both mappings forgets both. */
    assert_int_equal(d.unmap(va, 2 * sz), CUDA_SUCCESS);
    lh = wo_counter("launch_hits");
    assert_int_equal(d.launch(f_add, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL), CUDA_SUCCESS);
    assert_int_equal(wo_counter("launch_hits"), lh);
    assert_int_equal(d.release(h1), CUDA_SUCCESS);
    assert_int_equal(d.release(h2), CUDA_SUCCESS);
    assert_int_equal(d.address_free(va, 2 * sz), CUDA_SUCCESS);
    assert_int_equal(wo_counter("vmm_create"), c0 + 2);
    assert_int_equal(wo_counter("vmm_map"), m0 + 2);
    assert_int_equal(wo_counter("vmm_unmap"), u0 + 1);
    assert_int_equal(wo_counter("vmm_release"), r0 + 2);
}

/* --- threads and fork --------------------------------------------------------- */

#define NTHREADS 4
#define PER_THREAD 200

static const size_t sz_add4[] = {sizeof(float *), sizeof(float *), sizeof(float), sizeof(int)};

static void *launch_worker(void *arg)
{
    CUfunction f = arg;
    float c = 1.0f;
    int n = 4;

    if (set_current(ctx) != CUDA_SUCCESS)
        return (void *)1;
    for (int i = 0; i < PER_THREAD; i++) {
        CUdeviceptr x, y;
        void *params[] = {&x, &y, &c, &n};
        if (d.alloc(&x, 64) != CUDA_SUCCESS || d.alloc(&y, 64) != CUDA_SUCCESS ||
            d.launch(f, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL) != CUDA_SUCCESS ||
            d.free(x) != CUDA_SUCCESS || d.free(y) != CUDA_SUCCESS)
            return (void *)1;
    }
    return NULL;
}

static void threads_allocating_and_launching_are_counted_exactly(void **state)
{
    /* A function nobody launched yet: every thread races to cache its layout. */
    CUfunction f = reg("interpose_threads", 4, sz_add4, k_add);
    pthread_t t[NTHREADS];
    long long l0 = wo_counter("launch_calls"), w0 = wo_counter("launch_with_hits");
    long long h0 = wo_counter("launch_hits"), a0 = wo_counter("alloc_calls");
    long long f0 = wo_counter("free_calls"), nl0 = wo_counter("launch_no_layout");
    (void)state;

    assert_non_null(f);
    for (int i = 0; i < NTHREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, launch_worker, f), 0);
    for (int i = 0; i < NTHREADS; i++) {
        void *ret;
        assert_int_equal(pthread_join(t[i], &ret), 0);
        assert_null(ret);
    }
    assert_int_equal(wo_counter("launch_calls"), l0 + NTHREADS * PER_THREAD);
    assert_int_equal(wo_counter("launch_with_hits"), w0 + NTHREADS * PER_THREAD);
    assert_int_equal(wo_counter("launch_hits"), h0 + 2 * NTHREADS * PER_THREAD);
    assert_int_equal(wo_counter("alloc_calls"), a0 + 2 * NTHREADS * PER_THREAD);
    assert_int_equal(wo_counter("free_calls"), f0 + 2 * NTHREADS * PER_THREAD);
    assert_int_equal(wo_counter("launch_no_layout"), nl0);
}

/* CUDA is not usable in the child of a process that initialised it (the
 * fake, like the real driver, says CUDA_ERROR_NOT_INITIALIZED): the hooks
 * must hand that error back unchanged, record nothing, and not hang on
 * state (locks, capture tables) the parent's other threads held. */
static void fork_child_gets_the_drivers_errors_and_no_hang(void **state)
{
    int status = 0;
    pid_t pid;
    (void)state;

    assert_int_equal(d.begin_capture(stream, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        long long l0 = wo_counter("launch_calls"), a0 = wo_counter("alloc_calls");
        CUdeviceptr x = 0;
        float c = 1.0f;
        int n = 0;
        void *params[] = {&x, &x, &c, &n};
        CUresult r1 = d.alloc(&x, 64);
        CUresult r2 = d.launch(f_add, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL);
        int ok = r1 == CUDA_ERROR_NOT_INITIALIZED && r2 == CUDA_ERROR_NOT_INITIALIZED &&
                 wo_counter("launch_calls") == l0 && wo_counter("alloc_calls") == a0 &&
                 wo_addr_in(dlsym(lib, "cuLaunchKernel"), "libwoffload");
        if (!ok)
            fprintf(stderr, "child: alloc %d launch %d\n", r1, r2);
        _exit(ok ? 0 : 1);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    {
        CUgraph g = NULL;
        assert_int_equal(d.end_capture(stream, &g), CUDA_SUCCESS);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(proc_status_found_not_found_version),
        cmocka_unit_test(proc_null_out_params),
        cmocka_unit_test(proc_per_thread_variant_has_its_own_slot),
        cmocka_unit_test(proc_version_selects_the_abi),
        cmocka_unit_test(dlsym_substitutes_only_hooked_driver_functions),
        cmocka_unit_test(dlsym_rtld_next_is_relative_to_the_caller),
        cmocka_unit_test(counts_allocs_copies_launches_exactly),
        cmocka_unit_test(launch_pointers_inside_by_value_structs_are_attributed),
        cmocka_unit_test(launch_words_that_held_integers_are_no_pointers),
        cmocka_unit_test(launch_extra_buffer_form_is_scanned),
        cmocka_unit_test(capture_and_graph_launches_are_attributed),
        cmocka_unit_test(vmm_mappings_are_observed),
        cmocka_unit_test(threads_allocating_and_launching_are_counted_exactly),
        cmocka_unit_test(fork_child_gets_the_drivers_errors_and_no_hang),
    };
    if (!dlsym(RTLD_DEFAULT, "woffload_stats")) {
        fprintf(stderr, "libwoffload.so is not preloaded\n");
        return 1;
    }
    return cmocka_run_group_tests(tests, setup, NULL);
}
