/* examples/c-engine.c: a C engine that links libwoffload and names its
 * weights through include/woffload.h, instead of having the library
 * LD_PRELOADed.
 *
 *   cc c-engine.c $(pkg-config --cflags --libs woffload) -ldl -o c-engine
 *   WOFFLOAD_POLICY=moe-experts-host.yaml ./c-engine
 *
 * Linked (NEEDED libwoffload.so, ahead of libc), the library is loaded at
 * start and its hooks see the CUDA calls as they do when preloaded: here the
 * driver API is reached through dlopen + dlsym, as cuBLAS does. The engine
 * loads one MoE layer: the experts' stacked tensor in a tag scope, the
 * attention weights in the placeable window and tagged afterwards, then
 * seals, checks that its bytes round-trip and prints the shim's stats.
 * Exit 0 when every call gave what include/woffload.h documents.
 * tests/test-install.sh builds it against an installed tree and runs it on
 * the fake driver. */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <woffload.h>

/* The few driver API types used here, as cuda.h declares them (an engine
 * would include cuda.h; the example builds with pkg-config's flags alone). */
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;

#define MiB ((size_t)1 << 20)

static struct {
    CUresult (*init)(unsigned);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*ctx_retain)(CUcontext *, CUdevice);
    CUresult (*ctx_set)(CUcontext);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*free)(CUdeviceptr);
    CUresult (*htod)(CUdeviceptr, const void *, size_t);
    CUresult (*dtoh)(void *, CUdeviceptr, size_t);
} cu;

static int failures;

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "c-engine: FAIL %s\n", what);
        failures++;
    }
}

/* The example misuses the API on purpose, three times, to show what the
 * library answers; each time the library logs a warning. Say so first, so
 * the warning reads as what it is. */
static void expected(const char *what)
{
    fprintf(stderr, "c-engine: on purpose, the next warning is expected: %s\n", what);
}

static int load_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    struct {
        void *slot;
        const char *name;
    } fns[] = {
        {&cu.init, "cuInit"},
        {&cu.device_get, "cuDeviceGet"},
        {&cu.ctx_retain, "cuDevicePrimaryCtxRetain"},
        {&cu.ctx_set, "cuCtxSetCurrent"},
        {&cu.alloc, "cuMemAlloc_v2"},
        {&cu.free, "cuMemFree_v2"},
        {&cu.htod, "cuMemcpyHtoD_v2"},
        {&cu.dtoh, "cuMemcpyDtoH_v2"},
    };

    if (!h) {
        fprintf(stderr, "c-engine: no CUDA driver: %s\n", dlerror());
        return -1;
    }
    for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
        void *p = dlsym(h, fns[i].name);
        if (!p) {
            fprintf(stderr, "c-engine: the driver lacks %s\n", fns[i].name);
            return -1;
        }
        memcpy(fns[i].slot, &p, sizeof(p));
    }
    return 0;
}

/* Writes a pattern into [p, p+n) of device memory and reads it back. */
static int round_trip(CUdeviceptr p, size_t n, unsigned char seed)
{
    unsigned char *a = malloc(n), *b = malloc(n);
    int ok = a && b;

    for (size_t i = 0; ok && i < n; i++)
        a[i] = (unsigned char)(seed + i * 7);
    ok = ok && cu.htod(p, a, n) == 0 && cu.dtoh(b, p, n) == 0 && memcmp(a, b, n) == 0;
    free(a);
    free(b);
    return ok;
}

int main(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr experts = 0, attn = 0;
    char *stats;
    long need;
    int e;

    printf("libwoffload %s\n", woffload_version());
    if (load_driver() < 0)
        return 1;
    check(cu.init(0) == 0, "cuInit");
    check(cu.device_get(&dev, 0) == 0, "cuDeviceGet");
    check(cu.ctx_retain(&ctx, dev) == 0 && cu.ctx_set(ctx) == 0, "the primary context");

    /* A tag scope: what this thread allocates inside it carries the name. */
    check(woffload_tag_push("model.layers.0.mlp.experts.gate_up_proj") == 0, "tag_push");
    check(cu.alloc(&experts, 16 * MiB) == 0, "cuMemAlloc (experts)");
    check(woffload_tag_pop() == 0, "tag_pop");
    expected("a pop with no tag scope open is a misuse: -EPERM");
    check(woffload_tag_pop() == -EPERM, "a pop without a scope is -EPERM");

    /* The window: allocations made while it is open are placeable; names
     * come afterwards, for ranges inside them. A policy opens it at start
     * unless it says otherwise (window: open:), so it may be open already. */
    expected("the policy opened the window at start, so opening it again is -EALREADY");
    e = woffload_window_open();
    check(e == 0 || e == -EALREADY, "window_open");
    check(cu.alloc(&attn, 8 * MiB) == 0, "cuMemAlloc (attention)");
    check(woffload_window_close() == 0, "window_close");
    check(woffload_tag((void *)(uintptr_t)attn, 4 * MiB, "model.layers.0.self_attn.qkv_proj") == 0,
          "tag qkv_proj");
    check(woffload_tag((void *)(uintptr_t)(attn + 4 * MiB), 4 * MiB,
                       "model.layers.0.self_attn.o_proj") == 0,
          "tag o_proj");

    /* Loading is over: placements take effect, at the same addresses. */
    check(woffload_seal() == 0, "seal");
    expected("a second seal is -EALREADY");
    check(woffload_seal() == -EALREADY, "a second seal is -EALREADY");
    check(round_trip(experts, 16 * MiB, 1), "the experts' bytes round-trip");
    check(round_trip(attn, 8 * MiB, 2), "the attention bytes round-trip");

    /* Stats: the size the snapshot needs, then the snapshot. */
    need = woffload_stats(NULL, 0);
    check(need > 0, "stats size");
    stats = need > 0 ? malloc((size_t)need + 1) : NULL;
    check(stats && woffload_stats(stats, (size_t)need + 1) == need, "stats");
    if (stats)
        printf("stats: %s\n", stats);
    free(stats);

    check(cu.free(experts) == 0 && cu.free(attn) == 0, "cuMemFree");
    printf("c-engine: %s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
