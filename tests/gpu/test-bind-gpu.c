/* tests/gpu/test-bind-gpu.c: late binding at the same address (uvm/bind.c)
 * on the real GPU (suite 'gpu'), and on the fake driver in CI.
 *
 * A bound range is created on the host (HOST_NUMA VMM memory), filled by an
 * H2D copy as an engine loads, then re-backed at the same address: all to the
 * device, a middle part cut back to the host (blocks split, granules that
 * straddle), all back to the host, then random runs to random places. After
 * every re-backing the *first* kernel read must give the right checksum (one
 * run on the H100 read one wrong checksum right after a remap:
 * ../shared/guide/device-facts.md, "VMM"), then a D2H copy must give back
 * every byte, and where each granule is must be what was asked.
 *
 * On the fake driver, failures are injected into each driver call a move
 * makes: the move must fail, and the bytes and the placement must stay
 * exactly as before it (a misprediction or a driver error costs speed,
 * never data).
 *
 * Safety: device memory only (VMM device handles are not managed memory),
 * at most a quarter of the free memory. Timings (create, moves) are
 * printed for the record; nothing is judged on them.
 *
 * Usage: test-bind-gpu [--size BYTES] [--cycles N] [--out FILE.md]
 * Exit: 0 pass, 1 fail, 77 no GPU or no HOST_NUMA VMM (skipped). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/macro.h"
#include "uvm/bind.h"
#include "wsum.h"

static struct wo_driver drv;
static CUresult (*mod_load)(CUmodule *m, const void *image);
static CUresult (*mod_get)(CUfunction *f, CUmodule m, const char *name);
static CUresult (*launch)(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                          unsigned by, unsigned bz, unsigned shmem, CUstream s, void **params,
                          void **extra);
static CUresult (*htod)(CUdeviceptr dst, const void *src, size_t n);
static CUresult (*dtoh)(void *dst, CUdeviceptr src, size_t n);
static CUresult (*ctx_sync)(void);
static int (*fake_fail)(const char *name, uint64_t nth, CUresult err);
static void (*fake_fail_clear)(void);
static int (*fake_where)(const void *p);

static void *lib;
static int failures;
static CUfunction wsum;
static CUdeviceptr dsum;
static unsigned grid = 64;

static void *need(void *ud, const char *name)
{
    void *p = dlsym(lib, name);

    (void)ud;
    if (!p) {
        fprintf(stderr, "test-bind-gpu: libcuda.so.1 lacks %s\n", name);
        exit(1);
    }
    return p;
}

#define CK(call)                                                                                   \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            const char *s_ = "?";                                                                  \
            drv.cuGetErrorName(r_, &s_);                                                           \
            fprintf(stderr, "test-bind-gpu: %s:%d: %s: %s\n", __FILE__, __LINE__, #call, s_);      \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static uint64_t kernel_sum(CUdeviceptr p, size_t bytes)
{
    uint64_t n = bytes / 8, out = 0;
    void *params[] = {&p, &n, &dsum};

    CK(drv.cuMemsetD8_v2(dsum, 0, 8));
    CK(launch(wsum, grid, 1, 1, 256, 1, 1, 0, NULL, params, NULL));
    CK(ctx_sync());
    CK(dtoh(&out, dsum, 8));
    return out;
}

static uint64_t xs = 88172645463325252ull;
static uint64_t rnd(void)
{
    return xorshift(&xs);
}

/* What the test asked for, per granule: the model of the range. */
static unsigned char *want;
static size_t ngr, gran;

static void model_move(size_t off, size_t len, enum wo_bind_loc loc)
{
    for (size_t g = off / gran; g < (off + len + gran - 1) / gran; g++)
        want[g] = (unsigned char)loc;
}

struct row {
    char what[80];
    double ms;
    int first_ok, copy_ok, where_ok;
    uint64_t host_b, dev_b;
};
static struct row rows[64];
static int nrows;
static int wrong_first; /* first reads that were wrong while the copy was right */

/* The first kernel read after a change, the copy, and each granule's place. */
static void check(const char *what, double ms, struct wo_bound *b, const uint64_t *ref,
                  uint64_t *back, size_t size)
{
    struct row *r = nrows < (int)WO_ARRAY_SIZE(rows) ? &rows[nrows++] : &rows[nrows - 1];
    struct wo_bind_stats st;
    uint64_t wantsum = host_sum(ref, size / 8);

    snprintf(r->what, sizeof(r->what), "%s", what);
    r->ms = ms;
    r->first_ok = kernel_sum(wo_bind_base(b), size) == wantsum;
    memset(back, 0, size);
    CK(dtoh(back, wo_bind_base(b), size));
    r->copy_ok = memcmp(back, ref, size) == 0;
    r->where_ok = 1;
    for (size_t g = 0; g < ngr; g++) {
        void *p = (void *)(uintptr_t)(wo_bind_base(b) + g * gran);
        if (wo_bind_where(b, g * gran) != (enum wo_bind_loc)want[g])
            r->where_ok = 0;
        /* the fake knows where each mapping's memory is: -1 host, 0 device */
        if (fake_where && fake_where(p) != (want[g] == WO_BIND_HOST ? -1 : 0))
            r->where_ok = 0;
    }
    wo_bind_stats(b, &st);
    r->host_b = st.host_bytes;
    r->dev_b = st.device_bytes;
    if (!r->first_ok && r->copy_ok && kernel_sum(wo_bind_base(b), size) == wantsum)
        wrong_first++;
    if (!r->first_ok || !r->copy_ok || !r->where_ok) {
        failures++;
        fprintf(stderr, "FAIL %s: first kernel read %s, D2H copy %s, placement %s\n", what,
                r->first_ok ? "ok" : "WRONG", r->copy_ok ? "ok" : "WRONG",
                r->where_ok ? "ok" : "WRONG");
    }
}

/* reuse: the device memory the move gave back handed out again at once
 * (cuMemAlloc) and overwritten before the first read, as the shim's
 * picked-copy buffers and staging slots are right after seal's re-backing
 * (on the H200 llama.cpp late bound gave other tokens once picked copies
 * ran from the range so re-backed: bench/results/gpu-suite-20261201-
 * d9ab06b-h200.txt): a read through a stale mapping would see the new
 * owner's bytes. reuse 1: at once; 2: after a context synchronize (if only
 * the first fails, a wait after a re-backing is the fix) */
static void move_x(struct wo_bound *b, const char *what, size_t off, size_t len,
                   enum wo_bind_loc loc, const uint64_t *ref, uint64_t *back, size_t size,
                   int reuse)
{
    CUresult res;
    CUdeviceptr other = 0;
    double t0 = now_ms();
    int rc = wo_bind_move(b, off, len, loc, &res);
    double ms = now_ms() - t0;

    if (rc != 0) {
        const char *s = "?";
        drv.cuGetErrorName(res, &s);
        fprintf(stderr, "FAIL %s: wo_bind_move: %d (%s)\n", what, rc, s);
        failures++;
        return;
    }
    model_move(off, len, loc);
    if (reuse == 2)
        CK(ctx_sync());
    if (reuse && drv.cuMemAlloc_v2(&other, len) == CUDA_SUCCESS)
        CK(drv.cuMemsetD8_v2(other, 0x5a, len));
    else if (reuse)
        other = 0;
    check(what, ms, b, ref, back, size);
    if (other)
        CK(drv.cuMemFree_v2(other));
}

static void move(struct wo_bound *b, const char *what, size_t off, size_t len,
                 enum wo_bind_loc loc, const uint64_t *ref, uint64_t *back, size_t size)
{
    move_x(b, what, off, len, loc, ref, back, size, 0);
}

/* Fake only: each driver call a move makes fails once in turn; the move
 * must fail and leave bytes and places as they were. */
static void injected(struct wo_bound *b, const uint64_t *ref, uint64_t *back, size_t size)
{
    static const char *const calls[] = {"cuMemCreate", "cuMemAddressReserve", "cuMemMap",
                                        "cuMemSetAccess", "cuMemcpyAsync", "cuStreamSynchronize",
                                        "cuMemUnmap"};
    /* a run that cuts a block in three, host to device and back */
    size_t off = gran + gran / 2, len = 3 * gran;

    for (size_t i = 0; i < WO_ARRAY_SIZE(calls); i++) {
        for (uint64_t nth = 1; nth <= 4; nth++) {
            enum wo_bind_loc to = want[off / gran] == WO_BIND_HOST ? WO_BIND_DEVICE : WO_BIND_HOST;
            char what[80];
            CUresult res;
            int rc;

            (void)res;
            if (fake_fail(calls[i], nth, CUDA_ERROR_OUT_OF_MEMORY) != 0) {
                fprintf(stderr, "FAIL: the fake does not know %s\n", calls[i]);
                failures++;
                continue;
            }
            rc = wo_bind_move(b, off, len, to, &res);
            fake_fail_clear();
            snprintf(what, sizeof(what), "%s fails on call %d of the move", calls[i], (int)nth);
            if (rc == 0) {
                model_move(off, len, to); /* the move made fewer calls than nth */
            } else {
                /* blocks before the failed one moved (bind.h): each granule
                 * of the run is where it was or where it was sent, as the
                 * range's record says; check() then holds the record to
                 * where the fake says the memory is */
                for (size_t g = off / gran; g < (off + len + gran - 1) / gran; g++) {
                    enum wo_bind_loc w = wo_bind_where(b, g * gran);
                    if (w != (enum wo_bind_loc)want[g] && w != to) {
                        fprintf(stderr, "FAIL %s: granule %zu went neither way\n", what, g);
                        failures++;
                    }
                    want[g] = (unsigned char)w;
                }
            }
            check(what, 0, b, ref, back, size);
        }
    }
}

int main(int argc, char **argv)
{
    const char *out_path = NULL;
    size_t size = 0, fr = 0, total = 0;
    int cycles = 20, ver = 0;
    char name[256] = "?";
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    struct wo_bound *b;
    uint64_t *ref, *back;
    CUresult res;
    double t0, create_ms;
    CUresult (*dev_name)(char *, int, CUdevice);

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--size") && i + 1 < argc)
            size = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--cycles") && i + 1 < argc)
            cycles = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out_path = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--size BYTES] [--cycles N] [--out FILE.md]\n", argv[0]);
            return 2;
        }
    }
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("SKIP: no CUDA driver (%s)\n", dlerror());
        return 77;
    }
    if (wo_driver_fill(&drv, need, NULL) != 0)
        return 1;
    *(void **)&mod_load = need(NULL, "cuModuleLoadData");
    *(void **)&mod_get = need(NULL, "cuModuleGetFunction");
    *(void **)&launch = need(NULL, "cuLaunchKernel");
    *(void **)&htod = need(NULL, "cuMemcpyHtoD_v2");
    *(void **)&dtoh = need(NULL, "cuMemcpyDtoH_v2");
    *(void **)&ctx_sync = need(NULL, "cuCtxSynchronize");
    *(void **)&dev_name = need(NULL, "cuDeviceGetName");
    *(void **)&fake_fail = dlsym(lib, "fakecuda_fail");
    *(void **)&fake_fail_clear = dlsym(lib, "fakecuda_fail_clear");
    *(void **)&fake_where = dlsym(lib, "fakecuda_where");
    if (fake_fail) {
        CUfunction (*reg)(const char *, int, const size_t *,
                          void (*)(void **, const uint32_t *, const uint32_t *));
        static const size_t sizes[3] = {8, 8, 8};
        *(void **)&reg = need(NULL, "fakecuda_kernel");
        reg("wsum", 3, sizes, wsum_host);
    }
    if (drv.cuInit(0) != CUDA_SUCCESS) {
        printf("SKIP: cuInit failed: no usable GPU\n");
        return 77;
    }
    CK(drv.cuDeviceGet(&dev, 0));
    CK(drv.cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(drv.cuCtxSetCurrent(ctx));
    CK(dev_name(name, sizeof(name), dev));
    CK(drv.cuDriverGetVersion(&ver));
    if (!wo_bind_supported(&drv, dev, &gran)) {
        printf("SKIP: the driver cannot back VMM memory on the host (attribute 141)\n");
        return 77;
    }
    CK(drv.cuMemGetInfo_v2(&fr, &total));
    if (!size)
        size = (size_t)1 << 30;
    size = WO_MIN(size, fr / 4) / gran * gran;
    if (size < 8 * gran) {
        printf("SKIP: only %zu bytes free on the GPU\n", fr);
        return 77;
    }
    ngr = size / gran;
    CK(mod_load(&mod, ptx));
    CK(mod_get(&wsum, mod, "wsum"));
    CK(drv.cuMemAlloc_v2(&dsum, 8));
    printf("GPU: %s, driver %d, %.1f GiB free; bound range %.2f GiB, granule %zu KiB\n", name, ver,
           fr / 1073741824.0, size / 1073741824.0, gran >> 10);

    ref = malloc(size);
    back = malloc(size);
    want = calloc(ngr, 1);
    if (!ref || !back || !want)
        return 1;
    fill_random(ref, size / 8, (uint64_t)time(NULL));

    t0 = now_ms();
    if (wo_bind_create(&drv, dev, size, 0, &b, &res) != 0) {
        const char *s = "?";
        drv.cuGetErrorName(res, &s);
        fprintf(stderr, "FAIL: wo_bind_create: %s\n", s);
        return 1;
    }
    create_ms = now_ms() - t0;
    CK(htod(wo_bind_base(b), ref, size));
    check("created on the host, loaded by an H2D copy", create_ms, b, ref, back, size);

    move(b, "all to the device", 0, size, WO_BIND_DEVICE, ref, back, size);
    /* a cut inside blocks, whose ends straddle granules */
    move(b, "a middle part back to the host", size / 4 + gran / 2, size / 4 + 2 * gran,
         WO_BIND_HOST, ref, back, size);
    move(b, "a granule inside it to the device", size / 4 + 3 * gran + 8, 16, WO_BIND_DEVICE, ref,
         back, size);
    move(b, "all to the host", 0, size, WO_BIND_HOST, ref, back, size);
    for (int c = 0; c < cycles; c++) {
        size_t off = rnd() % size, len = 1 + rnd() % (size - off);
        char what[80];
        snprintf(what, sizeof(what), "cycle %d: %zu granules from %zu", c + 1,
                 (len + off % gran + gran - 1) / gran, off / gran);
        move(b, what, off, len, rnd() & 1 ? WO_BIND_DEVICE : WO_BIND_HOST, ref, back, size);
    }
    /* device memory given back and handed out again before the first read,
     * four times at once, twice after a context synchronize */
    for (int c = 0; c < 6; c++) {
        char what[96];
        move(b, "all to the device (before a reuse)", 0, size, WO_BIND_DEVICE, ref, back, size);
        snprintf(what, sizeof(what), "reuse %d: all to the host, its device memory reused%s",
                 c + 1, c < 4 ? "" : " after a sync");
        move_x(b, what, 0, size, WO_BIND_HOST, ref, back, size, c < 4 ? 1 : 2);
    }
    if (fake_fail)
        injected(b, ref, back, size);
    /* a second range, created part on the device: whole blocks from the
     * start as far as on_device goes (never past it), the rest on the host */
    {
        struct wo_bound *b2;
        struct wo_bind_stats st;
        size_t on = size / 2 + gran;
        if (wo_bind_create(&drv, dev, size, on, &b2, &res) != 0) {
            fprintf(stderr, "FAIL: wo_bind_create with %zu bytes on the device\n", on);
            failures++;
        } else {
            int ok = 1;
            wo_bind_stats(b2, &st);
            for (size_t g = 0; g < ngr; g++) {
                enum wo_bind_loc w = wo_bind_where(b2, g * gran);
                void *p = (void *)(uintptr_t)(wo_bind_base(b2) + g * gran);
                if ((w == WO_BIND_DEVICE && (g + 1) * gran > on) ||
                    (g > 0 && w == WO_BIND_DEVICE && wo_bind_where(b2, (g - 1) * gran) != w) ||
                    (fake_where && fake_where(p) != (w == WO_BIND_HOST ? -1 : 0)))
                    ok = 0;
            }
            CK(htod(wo_bind_base(b2), ref, size));
            CK(dtoh(back, wo_bind_base(b2), size));
            if (!ok || memcmp(back, ref, size) != 0 || st.device_bytes > on ||
                st.device_bytes + st.host_bytes != size) {
                fprintf(stderr, "FAIL: a range created part on the device (%zu of %zu bytes "
                                "asked, %llu on the device)\n",
                        on, size, (unsigned long long)st.device_bytes);
                failures++;
            }
            printf("created with %zu bytes asked on the device: %llu there\n", on,
                   (unsigned long long)st.device_bytes);
            if (fake_fail) {
                /* Fake only: a range's copy stream is made by its first
                 * move that copies (the first range's was made long ago):
                 * when it cannot be made the move fails and nothing
                 * changes; the next move makes it and succeeds. The last
                 * granule is on the host (created so). */
                size_t g0 = (ngr - 1) * gran;
                enum wo_bind_loc w0 = wo_bind_where(b2, g0);
                enum wo_bind_loc to = w0 == WO_BIND_HOST ? WO_BIND_DEVICE : WO_BIND_HOST;
                int rc;

                if (fake_fail("cuStreamCreate", 1, CUDA_ERROR_OUT_OF_MEMORY) != 0) {
                    fprintf(stderr, "FAIL: the fake does not know cuStreamCreate\n");
                    failures++;
                }
                rc = wo_bind_move(b2, g0, gran, to, &res);
                fake_fail_clear();
                CK(dtoh(back, wo_bind_base(b2), size));
                if (rc == 0 || wo_bind_where(b2, g0) != w0 || memcmp(back, ref, size) != 0) {
                    fprintf(stderr, "FAIL: a move whose copy stream cannot be made: rc %d, "
                                    "granule on the %s, bytes %s\n",
                            rc, wo_bind_where(b2, g0) == WO_BIND_HOST ? "host" : "device",
                            memcmp(back, ref, size) ? "CHANGED" : "kept");
                    failures++;
                }
                rc = wo_bind_move(b2, g0, gran, to, &res);
                CK(dtoh(back, wo_bind_base(b2), size));
                if (rc != 0 || wo_bind_where(b2, g0) != to || memcmp(back, ref, size) != 0 ||
                    (fake_where && fake_where((void *)(uintptr_t)(wo_bind_base(b2) + g0)) !=
                                       (to == WO_BIND_HOST ? -1 : 0))) {
                    fprintf(stderr, "FAIL: the same move once the stream can be made: rc %d\n",
                            rc);
                    failures++;
                }
                printf("a move whose copy stream could not be made failed and changed nothing; "
                       "the next one moved the granule\n");
            }
            wo_bind_destroy(b2);
        }
    }
    /* a range whose size is not a whole number of granules, all of it
     * asked on the device: its last granule too (it once stayed on the
     * host, the rounded size being past what was asked) */
    {
        struct wo_bound *b3;
        struct wo_bind_stats st;
        size_t odd = 3 * gran + 4096;
        if (wo_bind_create(&drv, dev, odd, odd, &b3, &res) != 0) {
            fprintf(stderr, "FAIL: wo_bind_create of %zu bytes all on the device\n", odd);
            failures++;
        } else {
            wo_bind_stats(b3, &st);
            if (st.host_bytes != 0 || wo_bind_where(b3, 3 * gran) != WO_BIND_DEVICE) {
                fprintf(stderr, "FAIL: %zu bytes asked all on the device: %llu on the host\n",
                        odd, (unsigned long long)st.host_bytes);
                failures++;
            }
            wo_bind_destroy(b3);
        }
    }
    /* something on the device for destroy to give back */
    move(b, "the first quarter to the device", 0, size / 4, WO_BIND_DEVICE, ref, back, size);

    {
        struct wo_bind_stats st;
        size_t f1 = 0, f2 = 0;
        wo_bind_stats(b, &st);
        CK(drv.cuMemGetInfo_v2(&f1, &total));
        wo_bind_destroy(b);
        CK(drv.cuMemGetInfo_v2(&f2, &total));
        printf("moves %llu, bytes copied %llu, map calls %llu, failed moves %llu, leaked %llu B; "
               "device memory given back at destroy: %.1f MiB (%.1f MiB were on the device)\n",
               (unsigned long long)st.moves, (unsigned long long)st.moved_bytes,
               (unsigned long long)st.map_calls, (unsigned long long)st.failures,
               (unsigned long long)st.leaked_bytes,
               ((double)f2 - (double)f1) / 1048576.0, st.device_bytes / 1048576.0);
        /* what was on the device comes back (the real driver rounds; 1%) */
        if ((double)f2 - (double)f1 < 0.99 * (double)st.device_bytes) {
            fprintf(stderr, "FAIL: destroy gave back less device memory than the range held\n");
            failures++;
        }
    }

    FILE *out = out_path ? fopen(out_path, "w") : NULL;
    for (int pass = 0; pass < (out ? 2 : 1); pass++) {
        FILE *f = pass ? out : stdout;
        fprintf(f, "\n| step | ms | first kernel read | D2H copy | placement | host MiB | device MiB |\n");
        fprintf(f, "|---|---|---|---|---|---|---|\n");
        for (int i = 0; i < nrows; i++)
            fprintf(f, "| %s | %.1f | %s | %s | %s | %.0f | %.0f |\n", rows[i].what, rows[i].ms,
                    rows[i].first_ok ? "ok" : "WRONG", rows[i].copy_ok ? "ok" : "WRONG",
                    rows[i].where_ok ? "ok" : "WRONG", rows[i].host_b / 1048576.0,
                    rows[i].dev_b / 1048576.0);
        fprintf(f, "\n%s, driver %d; first reads wrong while the bytes were right: %d\n", name, ver,
                wrong_first);
    }
    if (out)
        fclose(out);
    free(ref);
    free(back);
    free(want);
    printf("%s: %d failure(s)\n", failures ? "FAIL" : "PASS", failures);
    return failures ? 1 : 0;
}
