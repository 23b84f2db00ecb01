/* bench/bench-launch.c: the extra time the shim adds to one kernel launch.
 *
 * Primary figure, paired in one process: a child (not preloaded) dlopen()s
 * the shim and times the shim's exported cuLaunchKernel against the driver's
 * own in alternating batches (same context, stream, parameters), with no
 * tracked range and with N ranges allocated through the shim.
 *
 * Secondary, across processes: the parent runs itself as a child four times
 * per round: without and with
 * LD_PRELOAD=<shim>, each with no tracked range and with N tracked ranges
 * (N cuMemAlloc'ed buffers: the shim records each one, and a launch's
 * parameters then point into one of them, so the scan finds a hit as in a
 * real model). A child launches a trivial kernel (5 parameters: 3 pointers,
 * 2 scalars) through cuLaunchKernel, obtained the way cuBLAS gets it
 * (dlopen libcuda.so.1 + dlsym), times each launch, and prints the median
 * over all launches. The parent prints the medians of the rounds and the
 * differences: extra ns per launch with the shim.
 *
 * Real GPU: the kernel is PTX loaded with cuModuleLoadData (no nvcc needed).
 * Fake driver (tests/fake on LD_LIBRARY_PATH): the kernel is a registered
 * host function, found through cuModuleGetFunction the same way.
 *
 * usage: bench-launch --shim PATH [--launches N] [--ranges N] [--rounds N]
 *                     [--batch N]
 * (--child is internal) */
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char ptx[] = ".version 7.0\n"
                          ".target sm_75\n"
                          ".address_size 64\n"
                          ".visible .entry wo_bench_kernel(.param .u64 a, .param .u64 b,\n"
                          "    .param .u64 c, .param .u32 n, .param .f32 s)\n"
                          "{\n"
                          "    ret;\n"
                          "}\n";

typedef CUresult (*init_fn)(unsigned);
typedef CUresult (*device_get_fn)(CUdevice *, int);
typedef CUresult (*ctx_retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*ctx_set_fn)(CUcontext);
typedef CUresult (*module_load_fn)(CUmodule *, const void *);
typedef CUresult (*module_func_fn)(CUfunction *, CUmodule, const char *);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*stream_create_fn)(CUstream *, unsigned);
typedef CUresult (*sync_fn)(CUstream);
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);
typedef CUfunction (*fake_kernel_fn)(const char *, int, const size_t *,
                                     void (*)(void **, const uint32_t *, const uint32_t *));

static void noop_kernel(void **p, const uint32_t *grid, const uint32_t *block)
{
    (void)p;
    (void)grid;
    (void)block;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

#define SYM(var, type, name)                                                                       \
    type var = (type)dlsym(lib, name);                                                             \
    if (!var) {                                                                                    \
        fprintf(stderr, "bench-launch: %s not found\n", name);                                    \
        return 1;                                                                                  \
    }
#define CU(call)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            fprintf(stderr, "bench-launch: %s failed: %d\n", #call, r_);                           \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

/* One measurement: prints "median_ns <n>" on stdout. */
static int child(long launches, long ranges, long batch)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    CUstream s;
    CUdeviceptr *bufs, a, b, c;
    uint32_t *t;
    unsigned n = 256;
    float scale = 1.0f;
    void *params[] = {&a, &b, &c, &n, &scale};
    fake_kernel_fn fake;

    if (!lib) {
        fprintf(stderr, "bench-launch: dlopen libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    SYM(init, init_fn, "cuInit");
    SYM(device_get, device_get_fn, "cuDeviceGet");
    SYM(retain, ctx_retain_fn, "cuDevicePrimaryCtxRetain");
    SYM(set, ctx_set_fn, "cuCtxSetCurrent");
    SYM(load, module_load_fn, "cuModuleLoadData");
    SYM(get, module_func_fn, "cuModuleGetFunction");
    SYM(alloc, alloc_fn, "cuMemAlloc_v2");
    SYM(mfree, free_fn, "cuMemFree_v2");
    SYM(stream_create, stream_create_fn, "cuStreamCreate");
    SYM(sync, sync_fn, "cuStreamSynchronize");
    SYM(launch, launch_fn, "cuLaunchKernel");
    fake = (fake_kernel_fn)dlsym(lib, "fakecuda_kernel");

    CU(init(0));
    CU(device_get(&dev, 0));
    CU(retain(&ctx, dev));
    CU(set(ctx));
    if (fake) {
        static const size_t sizes[] = {8, 8, 8, 4, 4};
        fake("wo_bench_kernel", 5, sizes, noop_kernel);
    }
    CU(load(&mod, ptx));
    CU(get(&f, mod, "wo_bench_kernel"));
    CU(stream_create(&s, CU_STREAM_NON_BLOCKING));

    bufs = calloc((size_t)ranges + 3, sizeof(*bufs));
    t = malloc((size_t)launches * sizeof(*t));
    if (!bufs || !t)
        return 1;
    for (long i = 0; i < ranges + 3; i++)
        CU(alloc(&bufs[i], 4096));
    /* Pointers into the middle of three of the buffers. */
    a = bufs[ranges / 2] + 64;
    b = bufs[ranges + 1];
    c = bufs[ranges + 2] + 128;

    /* Warm-up: the first launches build caches (driver and shim). */
    for (int i = 0; i < 1000; i++)
        CU(launch(f, 1, 1, 1, 32, 1, 1, 0, s, params, NULL));
    CU(sync(s));
    for (long done = 0; done < launches;) {
        long end = done + batch < launches ? done + batch : launches;
        for (long i = done; i < end; i++) {
            uint64_t t0 = now_ns();
            CUresult r = launch(f, 1, 1, 1, 32, 1, 1, 0, s, params, NULL);
            t[i] = (uint32_t)(now_ns() - t0);
            if (r != CUDA_SUCCESS) {
                fprintf(stderr, "bench-launch: launch failed: %d\n", r);
                return 1;
            }
        }
        /* Drain outside the timed region so the queue never fills. */
        CU(sync(s));
        done = end;
    }
    qsort(t, (size_t)launches, sizeof(*t), cmp_u32);
    printf("median_ns %u p10_ns %u p90_ns %u\n", t[launches / 2], t[launches / 10],
           t[launches * 9 / 10]);
    for (long i = 0; i < ranges + 3; i++)
        CU(mfree(bufs[i]));
    free(bufs);
    free(t);
    return 0;
}

/* Paired measurement in one process (not preloaded): the shim is dlopen()ed
 * and its exported cuLaunchKernel is timed against the driver's own, in
 * alternating batches, same context, same stream, same parameters. With
 * ranges > 0 the buffers come from the shim's cuMemAlloc_v2 (tracked);
 * with 0 from the driver's (nothing tracked: the no-range fast path).
 * Prints "real_ns R shim_ns S". */
static int child_inproc(const char *shim_path, long launches, long ranges, long batch)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL), *shim;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    CUstream s;
    CUdeviceptr *bufs, a, b, c;
    uint32_t *t_real, *t_shim;
    long n_real = 0, n_shim = 0;
    unsigned n = 256;
    float scale = 1.0f;
    void *params[] = {&a, &b, &c, &n, &scale};
    fake_kernel_fn fake;
    launch_fn s_launch;
    alloc_fn s_alloc;

    if (!lib) {
        fprintf(stderr, "bench-launch: dlopen libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    SYM(init, init_fn, "cuInit");
    SYM(device_get, device_get_fn, "cuDeviceGet");
    SYM(retain, ctx_retain_fn, "cuDevicePrimaryCtxRetain");
    SYM(set, ctx_set_fn, "cuCtxSetCurrent");
    SYM(load, module_load_fn, "cuModuleLoadData");
    SYM(get, module_func_fn, "cuModuleGetFunction");
    SYM(alloc, alloc_fn, "cuMemAlloc_v2");
    SYM(stream_create, stream_create_fn, "cuStreamCreate");
    SYM(sync, sync_fn, "cuStreamSynchronize");
    SYM(launch, launch_fn, "cuLaunchKernel");
    fake = (fake_kernel_fn)dlsym(lib, "fakecuda_kernel");
    shim = dlopen(shim_path, RTLD_NOW | RTLD_LOCAL);
    if (!shim) {
        fprintf(stderr, "bench-launch: dlopen %s: %s\n", shim_path, dlerror());
        return 1;
    }
    s_launch = (launch_fn)dlsym(shim, "cuLaunchKernel");
    s_alloc = (alloc_fn)dlsym(shim, "cuMemAlloc_v2");
    if (!s_launch || !s_alloc)
        return 1;

    CU(init(0));
    CU(device_get(&dev, 0));
    CU(retain(&ctx, dev));
    CU(set(ctx));
    if (fake) {
        static const size_t sizes[] = {8, 8, 8, 4, 4};
        fake("wo_bench_kernel", 5, sizes, noop_kernel);
    }
    CU(load(&mod, ptx));
    CU(get(&f, mod, "wo_bench_kernel"));
    CU(stream_create(&s, CU_STREAM_NON_BLOCKING));
    bufs = calloc((size_t)ranges + 3, sizeof(*bufs));
    t_real = malloc((size_t)launches * sizeof(*t_real));
    t_shim = malloc((size_t)launches * sizeof(*t_shim));
    if (!bufs || !t_real || !t_shim)
        return 1;
    for (long i = 0; i < ranges + 3; i++)
        CU((ranges > 0 ? s_alloc : alloc)(&bufs[i], 4096));
    a = bufs[ranges / 2] + 64;
    b = bufs[ranges + 1];
    c = bufs[ranges + 2] + 128;
    for (int i = 0; i < 1000; i++) {
        CU(launch(f, 1, 1, 1, 32, 1, 1, 0, s, params, NULL));
        CU(s_launch(f, 1, 1, 1, 32, 1, 1, 0, s, params, NULL));
    }
    CU(sync(s));
    /* launches per side; batches alternate so drift hits both alike */
    for (long k = 0; n_real < launches || n_shim < launches; k++) {
        int use_shim = (int)(k & 1);
        launch_fn fn = use_shim ? s_launch : launch;
        uint32_t *t = use_shim ? t_shim : t_real;
        long *done = use_shim ? &n_shim : &n_real;
        for (long i = 0; i < batch && *done < launches; i++) {
            uint64_t t0 = now_ns();
            CUresult r = fn(f, 1, 1, 1, 32, 1, 1, 0, s, params, NULL);
            t[(*done)++] = (uint32_t)(now_ns() - t0);
            if (r != CUDA_SUCCESS) {
                fprintf(stderr, "bench-launch: launch failed: %d\n", r);
                return 1;
            }
        }
        CU(sync(s));
    }
    qsort(t_real, (size_t)launches, sizeof(uint32_t), cmp_u32);
    qsort(t_shim, (size_t)launches, sizeof(uint32_t), cmp_u32);
    printf("real_ns %u shim_ns %u\n", t_real[launches / 2], t_shim[launches / 2]);
    return 0;
}

/* Runs one paired child; *real and *shim get its medians. 0 or -1. */
static int run_inproc(const char *self, const char *shim, long launches, long ranges, long batch,
                      double *real, double *shimmed)
{
    int fd[2], status;
    char buf[256] = "", a1[32], a2[32], a3[32];
    ssize_t n;
    pid_t pid;
    unsigned r = 0, sh = 0;

    if (pipe(fd) < 0)
        return -1;
    snprintf(a1, sizeof(a1), "%ld", launches);
    snprintf(a2, sizeof(a2), "%ld", ranges);
    snprintf(a3, sizeof(a3), "%ld", batch);
    pid = fork();
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        unsetenv("LD_PRELOAD");
        execl(self, self, "--child-inproc", shim, a1, a2, a3, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    n = read(fd[0], buf, sizeof(buf) - 1);
    close(fd[0]);
    waitpid(pid, &status, 0);
    if (n <= 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return -1;
    buf[n] = '\0';
    if (sscanf(buf, "real_ns %u shim_ns %u", &r, &sh) != 2)
        return -1;
    *real = r;
    *shimmed = sh;
    return 0;
}

/* Runs one child; returns its median in ns, or -1. */
static double run_child(const char *self, const char *shim, long launches, long ranges, long batch)
{
    int fd[2], status;
    char buf[256] = "", a1[32], a2[32], a3[32];
    ssize_t n;
    pid_t pid;
    unsigned med = 0;

    if (pipe(fd) < 0)
        return -1;
    snprintf(a1, sizeof(a1), "%ld", launches);
    snprintf(a2, sizeof(a2), "%ld", ranges);
    snprintf(a3, sizeof(a3), "%ld", batch);
    pid = fork();
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        if (shim)
            setenv("LD_PRELOAD", shim, 1);
        else
            unsetenv("LD_PRELOAD");
        execl(self, self, "--child", a1, a2, a3, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    n = read(fd[0], buf, sizeof(buf) - 1);
    close(fd[0]);
    waitpid(pid, &status, 0);
    if (n <= 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return -1;
    buf[n] = '\0';
    if (sscanf(buf, "median_ns %u", &med) != 1)
        return -1;
    return med;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static long arg(int argc, char **argv, const char *name, long def)
{
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], name) == 0)
            return strtol(argv[i + 1], NULL, 0);
    return def;
}

int main(int argc, char **argv)
{
    const char *shim = NULL;
    long launches, ranges, rounds, batch;
    enum { BASE0, SHIM0, BASEN, SHIMN, NCASES };
    static const char *const names[NCASES] = {"no shim, 0 ranges", "shim, 0 ranges",
                                              "no shim, N ranges", "shim, N ranges"};
    double med[NCASES][64], res[NCASES], paired[2][5];

    if (argc == 5 && strcmp(argv[1], "--child") == 0)
        return child(atol(argv[2]), atol(argv[3]), atol(argv[4]));
    if (argc == 6 && strcmp(argv[1], "--child-inproc") == 0)
        return child_inproc(argv[2], atol(argv[3]), atol(argv[4]), atol(argv[5]));
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--shim") == 0)
            shim = argv[i + 1];
    launches = arg(argc, argv, "--launches", 100000);
    ranges = arg(argc, argv, "--ranges", 10000);
    rounds = arg(argc, argv, "--rounds", 5);
    batch = arg(argc, argv, "--batch", 1000);
    if (!shim || launches < 10 || ranges < 0 || rounds < 1 || rounds > 64 || batch < 1) {
        fprintf(stderr, "usage: %s --shim PATH/libwoffload.so [--launches N] [--ranges N] "
                        "[--rounds N<=64] [--batch N]\n", argv[0]);
        return 2;
    }
    /* Interleaved rounds: drift of a noisy machine hits every case alike. */
    for (long r = 0; r < rounds; r++) {
        for (int c = 0; c < NCASES; c++) {
            med[c][r] = run_child("/proc/self/exe", (c == SHIM0 || c == SHIMN) ? shim : NULL,
                                  launches, (c == BASEN || c == SHIMN) ? ranges : 0, batch);
            if (med[c][r] < 0) {
                fprintf(stderr, "bench-launch: case '%s' failed\n", names[c]);
                return 1;
            }
        }
    }
    for (int c = 0; c < NCASES; c++) {
        qsort(med[c], (size_t)rounds, sizeof(double), cmp_double);
        res[c] = med[c][rounds / 2];
    }
    /* Paired, in one process: the primary figure. */
    for (int w = 0; w < 2; w++) {
        double d[64], real_m[64], shim_m[64];
        for (long r = 0; r < rounds; r++) {
            if (run_inproc("/proc/self/exe", shim, launches, w ? ranges : 0, batch, &real_m[r],
                           &shim_m[r]) < 0) {
                fprintf(stderr, "bench-launch: paired run failed\n");
                return 1;
            }
            d[r] = shim_m[r] - real_m[r];
        }
        qsort(d, (size_t)rounds, sizeof(double), cmp_double);
        qsort(real_m, (size_t)rounds, sizeof(double), cmp_double);
        qsort(shim_m, (size_t)rounds, sizeof(double), cmp_double);
        paired[w][0] = real_m[rounds / 2];
        paired[w][1] = shim_m[rounds / 2];
        paired[w][2] = d[rounds / 2];
        paired[w][3] = d[0];
        paired[w][4] = d[rounds - 1];
    }
    printf("launches per run %ld, tracked ranges N = %ld, rounds %ld\n\n", launches, ranges,
           rounds);
    printf("Paired, one process (the shim dlopen()ed; its cuLaunchKernel against the driver's, "
           "alternating batches of %ld; median of per-run medians, [min, max] of the differences):\n",
           batch);
    printf("| tracked ranges | driver ns | shim ns | extra ns per launch |\n|---|---|---|---|\n");
    for (int w = 0; w < 2; w++)
        printf("| %ld | %.0f | %.0f | %.0f [%.0f, %.0f] |\n", w ? ranges : 0L, paired[w][0],
               paired[w][1], paired[w][2], paired[w][3], paired[w][4]);
    printf("\nSeparate processes (LD_PRELOAD or not; 3 buffers tracked even in the 0 case; "
           "median of per-run medians):\n");
    printf("| case | median ns per launch |\n|---|---|\n");
    for (int c = 0; c < NCASES; c++)
        printf("| %s | %.0f |\n", names[c], res[c]);
    printf("| extra with the shim, 0 ranges | %.0f |\n", res[SHIM0] - res[BASE0]);
    printf("| extra with the shim, %ld ranges | %.0f |\n", ranges, res[SHIMN] - res[BASEN]);
    return 0;
}
