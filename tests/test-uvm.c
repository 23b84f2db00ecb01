/* tests/test-uvm.c: uvm/ driven directly (no preload) against the fake
 * libcuda.so.1: placement decisions for scripted allocation sequences (tag
 * scope, window, tag after allocation), budgets, pinning failures under a
 * small RLIMIT_MEMLOCK with both fallbacks, every API misuse, the stats JSON,
 * bit-exact data across placement changes, launch accounting by the
 * consumer thread, graph launches expanded (uvm/graph.c), and no growth over 1,000 alloc/tag/free cycles.
 *
 * The fake driver's path comes from WO_FAKE_CUDA or argv[1]. */
#include <dlfcn.h>
#include <fcntl.h>
#include <malloc.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "fakecuda.h"
#include "core/log.h"
#include "core/registry.h"
#include "core/settings.h"
#include "uvm/graph.h"
#include "uvm/hotpath.h"
#include "uvm/internal.h"
#include "uvm/plan-budget.h"
#include "uvm/place-int.h"
#include "uvm/plan.h"
#include "uvm/plan-int.h"

static struct wo_driver drv;
static void *fake;
static CUcontext ctx;

/* fakecuda_* through dlsym, so the test works on the same handle. */
static uint64_t (*f_live_bytes)(int kind);
static size_t (*f_live_count)(int kind);
static int (*f_managed_state)(const void *p, struct fakecuda_page_state *out);
static int (*f_where)(const void *p);
static int (*f_fail)(const char *name, uint64_t nth, CUresult err);
static void (*f_fail_clear)(void);
static uint64_t (*f_calls)(const char *name);
static uint64_t (*f_injected)(void);

#define MiB ((size_t)1 << 20)

static void *sym(const char *name)
{
    void *p = dlsym(fake, name);
    if (!p)
        fail_msg("the fake driver lacks %s", name);
    return p;
}

/* struct wo_driver from the fake library (uvm.h: WO_DRIVER_FUNCS) */
static void *fake_lookup(void *ud, const char *name)
{
    return dlsym(ud, name);
}

static void load_fake(const char *path)
{
    CUdevice dev;

    fake = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!fake) {
        fprintf(stderr, "test-uvm: cannot load the fake driver %s: %s\n", path, dlerror());
        exit(1);
    }
    if (wo_driver_fill(&drv, fake_lookup, fake) != 0) {
        fprintf(stderr, "test-uvm: the fake driver lacks a function of struct wo_driver\n");
        exit(1);
    }
    f_live_bytes = (__typeof__(f_live_bytes))sym("fakecuda_live_bytes");
    f_live_count = (__typeof__(f_live_count))sym("fakecuda_live_count");
    f_managed_state = (__typeof__(f_managed_state))sym("fakecuda_managed_state");
    f_where = (__typeof__(f_where))sym("fakecuda_where");
    f_fail = (__typeof__(f_fail))sym("fakecuda_fail");
    f_fail_clear = (__typeof__(f_fail_clear))sym("fakecuda_fail_clear");
    f_calls = (__typeof__(f_calls))sym("fakecuda_calls");
    f_injected = (__typeof__(f_injected))sym("fakecuda_injected");
    if (drv.cuInit(0) != CUDA_SUCCESS || drv.cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        drv.cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
        drv.cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        fprintf(stderr, "test-uvm: the fake driver did not give a context\n");
        exit(1);
    }
}

/* ---- helpers ------------------------------------------------------------- */

static bool started;
static char policy_path[64];
static char log_path[64];
static int log_fd = -1;

static void start(const char *yaml)
{
    int fd;

    if (yaml) {
        snprintf(policy_path, sizeof(policy_path), "/tmp/test-uvm-policy-XXXXXX");
        fd = mkstemp(policy_path);
        assert_true(fd >= 0);
        assert_int_equal(write(fd, yaml, strlen(yaml)), (ssize_t)strlen(yaml));
        close(fd);
    }
    snprintf(log_path, sizeof(log_path), "/tmp/test-uvm-log-XXXXXX");
    log_fd = mkstemp(log_path);
    assert_true(log_fd >= 0);
    wo_log_set_fd(log_fd);
    wo_log_set_level(WO_LOG_DEBUG);
    wo_uvm_set_driver(&drv);
    started = true;
    (void)wo_uvm_init_policy(yaml ? policy_path : NULL);
}

static void stop(void)
{
    if (!started)
        return;
    started = false;
    wo_uvm_reset();
    wo_log_set_fd(2);
    wo_log_set_level(WO_LOG_WARN);
    if (policy_path[0])
        unlink(policy_path);
    policy_path[0] = '\0';
    if (log_fd >= 0) {
        if (getenv("TEST_UVM_SHOW_LOG")) {
            char cmd[128];
            snprintf(cmd, sizeof(cmd), "cat %s >&2", log_path);
            (void)system(cmd);
        }
        close(log_fd);
        unlink(log_path);
    }
    log_fd = -1;
    f_fail_clear();
}

/* 1 when the log so far holds s. */
static int log_has(const char *s)
{
    char buf[65536];
    ssize_t n = pread(log_fd, buf, sizeof(buf) - 1, 0);

    if (n < 0)
        return 0;
    buf[n] = '\0';
    return strstr(buf, s) != NULL;
}

static CUdeviceptr alloc_ok(size_t size)
{
    CUdeviceptr p = 0;
    CUresult r = CUDA_ERROR_UNKNOWN;

    assert_int_equal(wo_uvm_alloc(size, WO_API_CU_MEM_ALLOC, &p, &r), 1);
    assert_int_equal(r, CUDA_SUCCESS);
    assert_true(p != 0);
    return p;
}

static void free_ok(CUdeviceptr p)
{
    CUresult r = CUDA_ERROR_UNKNOWN;

    assert_int_equal(wo_uvm_free(p, &r), 1);
    assert_int_equal(r, CUDA_SUCCESS);
}

/* An allocation the shim only observes (the engine's own cuMemAlloc). */
static CUdeviceptr observed(size_t size)
{
    CUdeviceptr p = 0;

    assert_int_equal(drv.cuMemAlloc_v2(&p, size), CUDA_SUCCESS);
    wo_uvm_observe_alloc(p, size, 0, WO_API_CU_MEM_ALLOC);
    return p;
}

static void observed_free(CUdeviceptr p)
{
    wo_uvm_observe_free(p, WO_API_CU_MEM_ALLOC);
    assert_int_equal(drv.cuMemFree_v2(p), CUDA_SUCCESS);
}

static struct fakecuda_page_state page(CUdeviceptr p)
{
    struct fakecuda_page_state s;

    assert_int_equal(f_managed_state((const void *)(uintptr_t)p, &s), 0);
    return s;
}

/* preferred=host, accessed-by=GPU 0, resident on host only. */
static void assert_host_placed(CUdeviceptr p)
{
    struct fakecuda_page_state s = page(p);
    assert_int_equal(s.preferred, CU_DEVICE_CPU);
    assert_true(s.accessed_by & 2u);
}

static void assert_device_placed(CUdeviceptr p)
{
    struct fakecuda_page_state s = page(p);
    assert_int_equal(s.preferred, 0);
}

static char *stats(void)
{
    long n = wo_api_stats(NULL, 0), m;
    char *s = NULL;

    /* The snapshot may grow between calls (the consumer counts launches):
     * retry with the larger size, as the header tells callers to. */
    for (;;) {
        assert_true(n > 0);
        free(s);
        s = malloc((size_t)n + 1);
        assert_non_null(s);
        m = wo_api_stats(s, (size_t)n + 1);
        if (m <= n)
            break;
        n = m;
    }
    assert_int_equal(strlen(s), (size_t)m);
    return s;
}

/* ---- a strict little JSON validator (RFC 8259 grammar) ------------------- */

static const char *js_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    return p;
}

static const char *js_value(const char *p, int depth);

static const char *js_string(const char *p)
{
    if (*p++ != '"')
        return NULL;
    while (*p && *p != '"') {
        if ((unsigned char)*p < 0x20)
            return NULL;
        if (*p == '\\') {
            p++;
            if (*p == 'u') {
                for (int i = 1; i <= 4; i++)
                    if (!strchr("0123456789abcdefABCDEF", p[i]) || !p[i])
                        return NULL;
                p += 5;
                continue;
            }
            if (!*p || !strchr("\"\\/bfnrt", *p))
                return NULL;
        }
        p++;
    }
    return *p == '"' ? p + 1 : NULL;
}

static const char *js_number(const char *p)
{
    const char *s = p;

    if (*p == '-')
        p++;
    if (*p == '0')
        p++;
    else if (*p >= '1' && *p <= '9')
        while (*p >= '0' && *p <= '9')
            p++;
    else
        return NULL;
    if (*p == '.') {
        p++;
        if (!(*p >= '0' && *p <= '9'))
            return NULL;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    return p > s ? p : NULL;
}

static const char *js_value(const char *p, int depth)
{
    if (depth > 64)
        return NULL;
    p = js_ws(p);
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        bool obj = *p == '{';
        p = js_ws(p + 1);
        if (*p == close)
            return p + 1;
        for (;;) {
            if (obj) {
                p = js_string(js_ws(p));
                if (!p)
                    return NULL;
                p = js_ws(p);
                if (*p++ != ':')
                    return NULL;
            }
            p = js_value(p, depth + 1);
            if (!p)
                return NULL;
            p = js_ws(p);
            if (*p == ',') {
                p++;
                continue;
            }
            return *p == close ? p + 1 : NULL;
        }
    }
    if (*p == '"')
        return js_string(p);
    if (!strncmp(p, "true", 4))
        return p + 4;
    if (!strncmp(p, "false", 5))
        return p + 5;
    if (!strncmp(p, "null", 4))
        return p + 4;
    return js_number(p);
}

static void assert_valid_json(const char *s)
{
    const char *e = js_value(s, 0);
    if (!e || *js_ws(e) != '\0')
        fail_msg("invalid JSON near offset %ld: %s", e ? (long)(e - s) : -1L, s);
}

/* The object of the names[] entry for name, copied (NULL when absent). */
static char *name_entry(const char *json, const char *name)
{
    char key[1200];
    const char *p, *e;

    snprintf(key, sizeof(key), "{\"name\":\"%s\"", name);
    p = strstr(json, key);
    if (!p)
        return NULL;
    e = strchr(p, '}');
    return strndup(p, (size_t)(e - p + 1));
}

static void assert_name(const char *json, const char *name, const char *field_value)
{
    char *e = name_entry(json, name);
    if (!e)
        fail_msg("no stats entry for '%s' in %s", name, json);
    if (!strstr(e, field_value))
        fail_msg("stats entry for '%s' lacks %s: %s", name, field_value, e);
    free(e);
}

/* The name is no longer live: not in "names", in "released_names" (freed
 * memory leaves the record of where its names were) with field_value. */
static void assert_released(char *json, const char *name, const char *field_value)
{
    char key[1200];
    char *rel = strstr(json, "\"released_names\":[");

    if (!rel)
        fail_msg("no released_names in %s", json);
    snprintf(key, sizeof(key), "{\"name\":\"%s\"", name);
    *rel = '\0';
    if (strstr(json, key))
        fail_msg("'%s' still live in %s", name, json);
    *rel = '"';
    assert_name(rel, name, field_value);
}

static size_t locked_nnames(void)
{
    size_t n;

    pthread_mutex_lock(&wo_uvm.lock);
    n = wo_uvm.nnames;
    pthread_mutex_unlock(&wo_uvm.lock);
    return n;
}

/* Waits (at most 2 s) for the consumer to let go of the names freed:
 * it holds one in flight until it drains the free. */
static void names_let_go(void)
{
    for (int tries = 0; tries < 2000 && locked_nnames() != 0; tries++)
        usleep(1000);
    assert_int_equal(locked_nnames(), 0);
}

/* The stats once name's record is among the released names: the consumer
 * may hold a freed name until it drains the free (at most 2 s). */
static char *stats_released(const char *name)
{
    char key[1200];
    char *js = NULL, *rel;

    snprintf(key, sizeof(key), "{\"name\":\"%s\"", name);
    for (int tries = 0; tries < 2000; tries++) {
        free(js);
        js = stats();
        rel = strstr(js, "\"released_names\":[");
        if (rel && strstr(rel, key))
            break;
        usleep(1000);
    }
    return js;
}

/* ---- placement decisions ------------------------------------------------- */

static const char *moe_policy = "version: 1\n"
                                "default: device\n"
                                "rules:\n"
                                "  - name: experts-pinned\n"
                                "    match: [w2_weight]\n"
                                "    place: host\n"
                                "  - name: experts-host\n"
                                "    match: [w13_weight]\n"
                                "    place: host\n"
                                "    pin: false\n"
                                "  - name: hot\n"
                                "    match: [hot]\n"
                                "    place: managed\n"
                                "  - name: never\n"
                                "    match: [no_such_tensor]\n"
                                "    place: host\n";

static void scope_pinned_host_is_pinned(void **state)
{
    uint64_t host0 = f_live_bytes(FAKECUDA_HOST), reg0 = f_live_bytes(FAKECUDA_REGISTERED);
    CUdeviceptr p;
    struct wo_range r;

    (void)state;
    start(moe_policy);
    /* The fast way: a huge-page mapping registered with the driver. */
    assert_int_equal(wo_api_tag_push("model.layers.0.mlp.experts.w2_weight"), 0);
    p = alloc_ok(4 * MiB);
    assert_int_equal(wo_api_tag_pop(), 0);
    assert_int_equal(f_live_bytes(FAKECUDA_REGISTERED), reg0 + 4 * MiB);
    assert_int_equal(f_live_bytes(FAKECUDA_HOST), host0);
    assert_int_equal(wo_registry_find(p, &r), 0);
    assert_true(r.flags & WO_RANGE_PLACEABLE);
    assert_true(r.flags & WO_RANGE_HOST);
    free_ok(p);
    assert_int_equal(f_live_bytes(FAKECUDA_REGISTERED), reg0);
    assert_int_equal(wo_registry_find(p, &r), -ENOENT);
    /* Registering fails (not for want of memory): cuMemHostAlloc serves it. */
    assert_int_equal(f_fail("cuMemHostRegister_v2", 1, CUDA_ERROR_NOT_SUPPORTED), 0);
    assert_int_equal(wo_api_tag_push("model.layers.0.mlp.experts.w2_weight"), 0);
    p = alloc_ok(4 * MiB);
    assert_int_equal(wo_api_tag_pop(), 0);
    assert_int_equal(f_live_bytes(FAKECUDA_HOST), host0 + 4 * MiB);
    assert_int_equal(f_where((void *)(uintptr_t)p), CU_DEVICE_CPU);
    free_ok(p);
    assert_int_equal(f_live_bytes(FAKECUDA_HOST), host0);
    stop();
}

static void scope_placements_known_at_allocation(void **state)
{
    CUdeviceptr ph, pm, pd;
    struct fakecuda_page_state s;

    (void)state;
    start(moe_policy);
    assert_int_equal(wo_api_tag_push("model.layers.0.mlp.experts.w13_weight"), 0);
    ph = alloc_ok(2 * MiB);
    assert_int_equal(wo_api_tag_push("layers.0.hot"), 0); /* nested: innermost wins */
    pm = alloc_ok(2 * MiB);
    assert_int_equal(wo_api_tag_pop(), 0);
    assert_int_equal(wo_api_tag_pop(), 0);
    assert_int_equal(wo_api_tag_push("model.layers.0.self_attn.q_proj.weight"), 0);
    pd = alloc_ok(2 * MiB);
    assert_int_equal(wo_api_tag_pop(), 0);

    /* Advice at once, before seal: the placement was known. */
    assert_host_placed(ph);
    assert_host_placed(pm);
    assert_device_placed(pd);
    /* Residency waits for seal. */
    assert_int_equal(wo_api_seal(), 0);
    s = page(pd);
    assert_true(s.resident & 2u);
    s = page(ph);
    assert_int_equal(s.resident, 1u);
    s = page(pm);
    assert_int_equal(s.resident, 1u);
    assert_true(log_has("rule 4 'never'"));
    assert_true(log_has("matched nothing"));
    free_ok(ph);
    free_ok(pm);
    free_ok(pd);
    stop();
}

static void window_and_tag_after_allocation(void **state)
{
    const char *pol = "version: 1\n"
                      "default: managed\n"
                      "window: {open: api, close: api, min_size: 1MiB}\n"
                      "rules:\n"
                      "  - {match: [experts], place: host, pin: false}\n"
                      "  - {match: [attn], place: device}\n";
    CUdeviceptr before, big, small, after;
    CUresult r;
    unsigned char *host;

    (void)state;
    start(pol);
    /* Closed window: passes through. */
    assert_int_equal(wo_uvm_alloc(8 * MiB, WO_API_CU_MEM_ALLOC, &before, &r), 0);
    assert_int_equal(wo_api_window_open(), 0);
    big = alloc_ok(8 * MiB);
    /* Below min_size, stream-ordered, or the engine's managed memory: untouched. */
    assert_int_equal(wo_uvm_alloc(512 * 1024, WO_API_CU_MEM_ALLOC, &small, &r), 0);
    assert_int_equal(wo_uvm_alloc(8 * MiB, WO_API_CU_MEM_ALLOC_ASYNC, &small, &r), 0);
    assert_int_equal(wo_uvm_alloc(8 * MiB, WO_API_CUDA_MALLOC_MANAGED, &small, &r), 0);
    assert_int_equal(wo_api_window_close(), 0);
    assert_int_equal(wo_uvm_alloc(8 * MiB, WO_API_CUDA_MALLOC, &after, &r), 0);

    /* Load data, then tag sub-ranges (the PyTorch way). */
    host = (unsigned char *)(uintptr_t)big;
    for (size_t i = 0; i < 8 * MiB; i++)
        host[i] = (unsigned char)(i * 131 + 7);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)big, 2 * MiB, "l0.mlp.experts.w1"), 0);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)(big + 2 * MiB), 2 * MiB, "l0.attn.qkv"), 0);
    /* Nothing moves before seal; with a default off the device the window's
     * memory was advised to the host before the engine wrote it (its pages
     * land there, not on the device: the managed cap, docs/placement.md). */
    assert_int_equal(page(big).preferred, CU_DEVICE_CPU);
    assert_int_equal(wo_api_seal(), 0);
    assert_host_placed(big);
    assert_int_equal(page(big).resident, 1u);
    assert_device_placed(big + 2 * MiB);
    assert_true(page(big + 2 * MiB).resident & 2u);
    /* The untagged rest gets the default (managed: preferred host, on host). */
    assert_host_placed(big + 5 * MiB);
    for (size_t i = 0; i < 8 * MiB; i++)
        if (host[i] != (unsigned char)(i * 131 + 7))
            fail_msg("byte %zu changed across placement", i);

    /* A tag after seal takes effect at once, same address. */
    assert_int_equal(wo_api_tag((void *)(uintptr_t)(big + 6 * MiB), MiB, "l0.attn.o"), 0);
    assert_device_placed(big + 6 * MiB);
    assert_true(page(big + 6 * MiB).resident & 2u);
    {
        char *js = stats();
        assert_valid_json(js);
        assert_name(js, "l0.mlp.experts.w1", "\"placement\":\"host\"");
        assert_name(js, "l0.attn.qkv", "\"placement\":\"device\"");
        assert_true(strstr(js, "\"managed\":{\"bytes\":3145728,\"tensors\":0,\"untagged_bytes\":3145728}") != NULL);
        free(js);
    }
    free_ok(big);
    stop();
}

static void window_opens_at_start_by_default(void **state)
{
    CUdeviceptr p, q;
    CUresult r;

    (void)state;
    start("version: 1\nrules:\n  - {match: [experts], place: host}\n");
    p = alloc_ok(4 * MiB); /* the window is open from the start */
    assert_int_equal(wo_api_tag((void *)(uintptr_t)p, 4 * MiB, "mlp.experts"), 0);
    assert_int_equal(wo_api_seal(), 0);
    /* Seal closed it. */
    assert_int_equal(wo_uvm_alloc(4 * MiB, WO_API_CU_MEM_ALLOC, &q, &r), 0);
    /* A tag range never pins: managed memory advised to the host. */
    assert_host_placed(p);
    free_ok(p);
    stop();
}

static void window_on_first_tag(void **state)
{
    CUdeviceptr p, q;
    CUresult r;

    (void)state;
    start("version: 1\nwindow: {open: at-start, close: on-first-tag}\n"
          "rules:\n  - {match: [experts], place: host}\n");
    p = alloc_ok(4 * MiB);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)p, 4 * MiB, "mlp.experts"), 0);
    assert_int_equal(wo_uvm_alloc(4 * MiB, WO_API_CU_MEM_ALLOC, &q, &r), 0);
    free_ok(p);
    stop();

    start("version: 1\nwindow: {open: on-first-tag, close: at-seal}\n"
          "rules:\n  - {match: [experts], place: host}\n");
    assert_int_equal(wo_uvm_alloc(4 * MiB, WO_API_CU_MEM_ALLOC, &q, &r), 0);
    assert_int_equal(wo_api_tag_push("scope.opens.it"), 0);
    assert_int_equal(wo_api_tag_pop(), 0);
    p = alloc_ok(4 * MiB);
    assert_int_equal(wo_api_seal(), 0);
    assert_int_equal(wo_uvm_alloc(4 * MiB, WO_API_CU_MEM_ALLOC, &q, &r), 0);
    free_ok(p);
    stop();
}

static void tag_on_observed_memory_is_recorded(void **state)
{
    CUdeviceptr p;
    char *js;

    (void)state;
    start("version: 1\nwindow: {open: api}\nrules:\n  - {match: [experts], place: host}\n");
    p = observed(4 * MiB);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)p, MiB, "l0.experts"), 0);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)(p + MiB), MiB, "l1.experts"), 0);
    assert_true(log_has("allocated outside the placeable window; open the window before loading, "
                        "see docs/placement.md"));
    assert_int_equal(wo_api_seal(), 0);
    js = stats();
    assert_valid_json(js);
    assert_name(js, "l0.experts", "\"placement\":\"unplaceable\"");
    assert_name(js, "l0.experts", "\"policy\":\"host\"");
    assert_true(strstr(js, "\"unplaceable_tags\":2") != NULL);
    assert_true(strstr(js, "\"unplaceable\":{\"bytes\":2097152,\"tensors\":2") != NULL);
    free(js);
    observed_free(p);
    js = stats_released("l0.experts");
    assert_released(js, "l0.experts", "\"placement\":\"unplaceable\",\"policy\":\"host\"");
    free(js);
    stop();
}

static void scope_on_stream_ordered_memory_is_recorded(void **state)
{
    CUdeviceptr p, q;
    CUresult r;
    char *js;

    (void)state;
    start(moe_policy);
    assert_int_equal(wo_api_tag_push("l0.mlp.experts.w2_weight"), 0);
    assert_int_equal(wo_uvm_alloc(4 * MiB, WO_API_CUDA_MALLOC_ASYNC, &q, &r), 0);
    /* The hook forwards it and reports it (fake: plain device memory). */
    assert_int_equal(drv.cuMemAlloc_v2(&p, 4 * MiB), CUDA_SUCCESS);
    wo_uvm_observe_alloc(p, 4 * MiB, WO_RANGE_ASYNC, WO_API_CUDA_MALLOC_ASYNC);
    assert_int_equal(wo_api_tag_pop(), 0);
    assert_true(log_has("stream-ordered allocator"));
    js = stats();
    assert_valid_json(js);
    assert_name(js, "l0.mlp.experts.w2_weight", "\"placement\":\"unplaceable\"");
    assert_name(js, "l0.mlp.experts.w2_weight", "\"bytes\":4194304");
    free(js);
    observed_free(p);
    js = stats_released("l0.mlp.experts.w2_weight");
    assert_released(js, "l0.mlp.experts.w2_weight", "\"peak_bytes\":4194304,");
    free(js);
    stop();
}

/* ---- what the prefetcher sees ------------------------------------------- */

struct segs {
    int n;
    struct wo_uvm_segment s[8];
    char names[8][64];
};

static int collect(const struct wo_uvm_segment *s, void *ud)
{
    struct segs *g = ud;

    if (g->n == 8)
        return 1;
    g->s[g->n] = *s;
    snprintf(g->names[g->n], sizeof(g->names[0]), "%s", s->name);
    g->n++;
    return 0;
}

static void managed_segments_for_the_prefetcher(void **state)
{
    struct segs g = {0};
    CUdeviceptr p;

    (void)state;
    start("version: 1\ndefault: managed\nrules:\n"
          "  - {match: [hot], place: managed, priority: 7}\n"
          "  - {match: [attn], place: device}\n");
    p = alloc_ok(8 * MiB);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)(p + MiB), MiB, "l0.hot"), 0);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)(p + 3 * MiB), MiB, "l0.attn"), 0);
    assert_int_equal(wo_api_seal(), 0);
    assert_int_equal(wo_uvm_foreach_managed(collect, &g), 0);
    /* [0,1) untagged, [1,2) l0.hot, [2,3) untagged, [4,8) untagged; attn is device. */
    assert_int_equal(g.n, 4);
    assert_string_equal(g.names[0], "(untagged)");
    assert_int_equal(g.s[0].offset, 0);
    assert_int_equal(g.s[0].size, MiB);
    assert_string_equal(g.names[1], "l0.hot");
    assert_int_equal(g.s[1].base, p + MiB);
    assert_int_equal(g.s[1].priority, 7);
    assert_int_equal(g.s[2].offset, 2 * MiB);
    assert_int_equal(g.s[3].offset, 4 * MiB);
    assert_int_equal(g.s[3].size, 4 * MiB);
    assert_true(g.s[1].id == g.s[0].id);
    free_ok(p);
    stop();
}

/* ---- budgets -------------------------------------------------------------- */

static void host_budget_in_tag_order(void **state)
{
    CUdeviceptr p;
    char *js;

    (void)state;
    start("version: 1\nhost_budget: 5MiB\nrules:\n  - {glob: '*.weight', place: host}\n");
    p = alloc_ok(8 * MiB);
    /* Tag order, not address order: a and b (2 MiB each) fit 5 MiB, c
     * (1.5 MiB) does not: c and every later host match stay on the device. */
    assert_int_equal(wo_api_tag((void *)(uintptr_t)(p + 6 * MiB), 2 * MiB, "a.weight"), 0);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)p, 2 * MiB, "b.weight"), 0);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)(p + 4 * MiB), MiB + MiB / 2, "c.weight"), 0);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)(p + 2 * MiB), MiB / 2, "d.weight"), 0);
    assert_true(log_has("'c.weight' (1.50 MiB) stays on the device: host budget spent"));
    assert_int_equal(wo_api_seal(), 0);
    assert_host_placed(p + 6 * MiB);
    assert_host_placed(p);
    assert_device_placed(p + 4 * MiB);
    /* Spent means spent: d (0.5 MiB) would fit but comes after c. */
    assert_device_placed(p + 2 * MiB);
    assert_true(log_has("stay on the device"));
    js = stats();
    assert_valid_json(js);
    assert_name(js, "a.weight", "\"over_budget\":false");
    assert_name(js, "c.weight", "\"placement\":\"device\"");
    assert_name(js, "c.weight", "\"over_budget\":true");
    assert_name(js, "d.weight", "\"over_budget\":true");
    assert_true(strstr(js, "\"host_limit\":5242880,\"host_used\":4194304,\"host_spent\":true") != NULL);
    assert_true(strstr(js, "\"over_budget_tensors\":2") != NULL);
    free(js);
    free_ok(p);
    /* Freeing gives the bytes back; a spent budget stays spent. */
    js = stats();
    assert_true(strstr(js, "\"host_used\":0,\"host_spent\":true") != NULL);
    free(js);
    stop();
}

static void device_budget_percent_of_total(void **state)
{
    size_t fr, total;

    (void)state;
    start("version: 1\ndevice_budget: 25%\nrules:\n  - {match: [experts], place: managed}\n");
    assert_int_equal(wo_uvm_device_budget(), 0);
    assert_int_equal(wo_api_seal(), 0);
    assert_int_equal(drv.cuMemGetInfo_v2(&fr, &total), CUDA_SUCCESS);
    assert_int_equal(wo_uvm_device_budget(), total / 4);
    stop();
    start("version: 1\ndevice_budget: 3GiB\nrules:\n  - {match: [experts], place: managed}\n");
    assert_int_equal(wo_api_seal(), 0);
    assert_int_equal(wo_uvm_device_budget(), 3ull << 30);
    stop();
}

/* ---- pinning failure ------------------------------------------------------- */

/* Root (CI containers) may lock any amount: CAP_IPC_LOCK overrides
 * RLIMIT_MEMLOCK. Dropping it from the effective set makes the limit real. */
static void drop_ipc_lock(void)
{
    struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct d[2];

    if (syscall(SYS_capget, &h, d) != 0)
        return;
    d[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
    (void)syscall(SYS_capset, &h, d);
}

static void pin_failure(const char *fallback, int expect_served_ok)
{
    char pol[256];
    struct rlimit old, small;
    CUdeviceptr p = 0;
    CUresult r = CUDA_SUCCESS;
    int served;

    snprintf(pol, sizeof(pol),
             "version: 1\npin_fallback: %s\nrules:\n  - {match: [experts], place: host}\n",
             fallback);
    start(pol);
    drop_ipc_lock();
    assert_int_equal(getrlimit(RLIMIT_MEMLOCK, &old), 0);
    small = old;
    small.rlim_cur = 64 * 1024;
    assert_int_equal(setrlimit(RLIMIT_MEMLOCK, &small), 0);
    assert_int_equal(wo_api_tag_push("l0.experts"), 0);
    served = wo_uvm_alloc(8 * MiB, WO_API_CUDA_MALLOC, &p, &r);
    if (served == 1 && r == CUDA_SUCCESS && f_where((void *)(uintptr_t)p) == CU_DEVICE_CPU &&
        f_managed_state((void *)(uintptr_t)p, &(struct fakecuda_page_state){0}) == -ENOENT) {
        /* Pinned anyway: mlock() is not enforced here (ASan makes it a
         * no-op). Make the driver fail the way it does at the limit. */
        free_ok(p);
        assert_int_equal(f_fail("cuMemHostRegister_v2", 1, CUDA_ERROR_OUT_OF_MEMORY), 0);
        served = wo_uvm_alloc(8 * MiB, WO_API_CUDA_MALLOC, &p, &r);
    }
    assert_int_equal(wo_api_tag_pop(), 0);
    assert_int_equal(setrlimit(RLIMIT_MEMLOCK, &old), 0);
    assert_int_equal(served, 1);
    assert_true(log_has("RLIMIT_MEMLOCK is 64.00 KiB"));
    assert_true(log_has("(8388608 bytes)"));
    if (expect_served_ok) {
        assert_int_equal(r, CUDA_SUCCESS);
        assert_true(log_has("falling back to managed memory"));
        assert_host_placed(p); /* managed, kept on host */
        free_ok(p);
    } else {
        assert_int_equal(r, CUDA_ERROR_OUT_OF_MEMORY);
        assert_int_equal(p, 0);
        assert_true(log_has("pin_fallback: stop"));
        assert_int_equal(wo_uvm.nallocs, 0);
    }
    {
        char *js = stats();
        assert_valid_json(js);
        assert_true(strstr(js, "\"pin_failures\":1") != NULL);
        free(js);
    }
    stop();
}

static void pin_failure_falls_back_to_managed(void **state)
{
    (void)state;
    pin_failure("managed", 1);
}

static void pin_failure_stops(void **state)
{
    (void)state;
    pin_failure("stop", 0);
}

/* ---- misuse ---------------------------------------------------------------- */

static void misuse_has_defined_results(void **state)
{
    char longname[1100], buf[16];
    CUdeviceptr p, o;
    long n, m;

    (void)state;
    start(moe_policy);
    p = alloc_ok(4 * MiB);
    o = observed(MiB);

    assert_int_equal(wo_api_tag(NULL, 10, "x"), -EINVAL);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)p, 10, NULL), -EINVAL);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)p, 10, ""), -EINVAL);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)p, 0, "x"), -EINVAL);
    memset(longname, 'a', sizeof(longname));
    longname[1024] = '\0';
    assert_int_equal(wo_api_tag((void *)(uintptr_t)p, 10, longname), -EINVAL);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)0x10, 10, "x"), -ENOENT);
    assert_true(log_has("not in any allocation the shim saw (-ENOENT)"));
    assert_int_equal(wo_api_tag((void *)(uintptr_t)(p + 3 * MiB), 2 * MiB, "x"), -ERANGE);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)(p + 4 * MiB - 1), 2, "x"), -ERANGE);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)(o + MiB - 1), 2, "x"), -ERANGE);

    assert_int_equal(wo_api_tag((void *)(uintptr_t)p, MiB, "first"), 0);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)p, MiB, "first"), 0);           /* repeat */
    assert_int_equal(wo_api_tag((void *)(uintptr_t)(p + 4096), 4096, "first"), 0); /* inside */
    assert_int_equal(wo_api_tag((void *)(uintptr_t)(p + MiB - 1), 2, "second"), -EEXIST);
    assert_true(log_has("overlaps the earlier tag 'first'"));
    assert_int_equal(wo_api_tag((void *)(uintptr_t)(p + MiB), MiB, "second"), 0); /* adjacent */
    {
        char *js = stats();
        assert_name(js, "first", "\"bytes\":1048576");
        assert_name(js, "second", "\"bytes\":1048576");
        free(js);
    }

    /* read-only to kernels: whole allocations only, each counted once */
    assert_int_equal(wo_api_readonly(NULL, 0), -EINVAL);
    assert_int_equal(wo_api_readonly((void *)(uintptr_t)0x10, 0), -ENOENT);
    assert_int_equal(wo_api_readonly((void *)(uintptr_t)(p + 4096), 0), -EINVAL);
    assert_true(log_has("not a whole allocation"));
    assert_int_equal(wo_api_readonly((void *)(uintptr_t)p, MiB), -EINVAL);
    assert_int_equal(wo_api_readonly((void *)(uintptr_t)p, 4 * MiB), 0);
    assert_int_equal(wo_api_readonly((void *)(uintptr_t)p, 0), 0); /* again: no-op */
    assert_int_equal(wo_api_readonly((void *)(uintptr_t)o, 0), 0); /* observed memory too */
    {
        struct wo_range rg;
        char *js = stats();

        assert_int_equal(wo_registry_find(p, &rg), 0);
        assert_true(wo_readonly(rg.id, rg.gen));
        assert_false(wo_readonly(rg.id, rg.gen + 1));
        assert_non_null(strstr(js, "\"readonly\":2}"));
        free(js);
    }

    /* the engine's departure lag: 1 or 2 ranges, 2 until it says */
    assert_int_equal(wo_stream_departure_lag(), 2);
    assert_int_equal(wo_api_departure_lag(0), -EINVAL);
    assert_true(log_has("woffload_departure_lag(0): expected 1 or 2 ranges (-EINVAL)"));
    assert_int_equal(wo_api_departure_lag(3), -EINVAL);
    assert_int_equal(wo_stream_departure_lag(), 2);
    assert_int_equal(wo_api_departure_lag(1), 0);
    assert_int_equal(wo_stream_departure_lag(), 1);
    assert_int_equal(wo_api_departure_lag(2), 0);
    assert_int_equal(wo_stream_departure_lag(), 2);

    assert_int_equal(wo_api_tag_pop(), -EPERM);
    assert_int_equal(wo_api_tag_push(NULL), -EINVAL);
    assert_int_equal(wo_api_tag_push(""), -EINVAL);
    assert_int_equal(wo_api_tag_push(longname), -E2BIG);
    longname[1023] = '\0';
    assert_int_equal(wo_api_tag_push(longname), 0); /* exactly 1023 bytes */
    assert_int_equal(wo_api_tag_pop(), 0);
    for (int i = 0; i < WO_TAG_DEPTH_MAX; i++)
        assert_int_equal(wo_api_tag_push("deep"), 0);
    assert_int_equal(wo_api_tag_push("deeper"), -E2BIG);
    for (int i = 0; i < WO_TAG_DEPTH_MAX; i++)
        assert_int_equal(wo_api_tag_pop(), 0);
    assert_int_equal(wo_api_tag_pop(), -EPERM);

    assert_int_equal(wo_api_window_open(), -EALREADY); /* open at start */
    assert_int_equal(wo_api_window_close(), 0);
    assert_int_equal(wo_api_window_close(), -EALREADY);

    assert_int_equal(wo_api_stats(NULL, 5), -EINVAL);
    n = wo_api_stats(NULL, 0);
    assert_true(n > (long)sizeof(buf));
    /* each call returns its own snapshot's whole length: the consumer
     * thread's counters may gain a digit between two calls (a clean-clone
     * CI saw 5788, then 5789) */
    m = wo_api_stats(buf, sizeof(buf));
    assert_true(m >= n - 16 && m <= n + 16);
    assert_int_equal(strlen(buf), sizeof(buf) - 1);
    m = wo_api_stats(buf, 1);
    assert_true(m >= n - 16 && m <= n + 16);
    assert_int_equal(buf[0], '\0');

    assert_int_equal(wo_api_seal(), 0);
    assert_int_equal(wo_api_seal(), -EALREADY);
    assert_true(log_has("sealed already (-EALREADY)"));
    free_ok(p);
    observed_free(o);
    stop();
}

static void bad_policy_passes_through(void **state)
{
    CUdeviceptr p;
    CUresult r;

    (void)state;
    start("version: 1\nrules:\n  - {match: [experts], place: hots}\n");
    assert_true(wo_uvm.policy_error < 0);
    assert_true(log_has(":3:"));
    assert_int_equal(wo_api_tag_push("l0.experts"), 0);
    assert_int_equal(wo_uvm_alloc(4 * MiB, WO_API_CU_MEM_ALLOC, &p, &r), 0);
    assert_int_equal(wo_api_tag_pop(), 0);
    assert_int_equal(wo_api_seal(), 0);
    {
        char *js = stats();
        assert_valid_json(js);
        assert_true(strstr(js, "\"loaded\":false") != NULL);
        free(js);
    }
    stop();
}

static void no_policy_passes_through(void **state)
{
    CUdeviceptr p, o;
    CUresult r;

    (void)state;
    start(NULL);
    assert_int_equal(wo_api_tag_push("x"), 0);
    assert_int_equal(wo_uvm_alloc(4 * MiB, WO_API_CU_MEM_ALLOC, &p, &r), 0);
    assert_int_equal(wo_api_tag_pop(), 0);
    o = observed(MiB);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)o, MiB, "x"), 0);
    assert_int_equal(wo_api_window_open(), 0);
    assert_int_equal(wo_uvm_alloc(4 * MiB, WO_API_CU_MEM_ALLOC, &p, &r), 0);
    assert_int_equal(wo_api_seal(), 0);
    observed_free(o);
    stop();
}

/* ---- driver failures --------------------------------------------------------- */

static void managed_alloc_failure_reaches_the_engine(void **state)
{
    CUdeviceptr p = 1;
    CUresult r = CUDA_SUCCESS;

    (void)state;
    start(moe_policy);
    assert_int_equal(f_fail("cuMemAllocManaged", 1, CUDA_ERROR_OUT_OF_MEMORY), 0);
    assert_int_equal(wo_uvm_alloc(4 * MiB, WO_API_CU_MEM_ALLOC, &p, &r), 1);
    assert_int_equal(r, CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(p, 0);
    assert_int_equal(wo_uvm.nallocs, 0);
    stop();
}

static void seal_advice_failure_is_reported(void **state)
{
    CUdeviceptr p;

    (void)state;
    start("version: 1\nwindow: {open: api}\nrules:\n  - {match: [experts], place: host}\n");
    assert_int_equal(wo_api_window_open(), 0);
    p = alloc_ok(4 * MiB);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)p, 4 * MiB, "l0.experts"), 0);
    assert_int_equal(f_fail("cuMemAdvise_v2", 1, CUDA_ERROR_INVALID_VALUE), 0);
    assert_int_equal(wo_api_seal(), -EINVAL);
    assert_true(log_has("placing 'l0.experts'"));
    assert_true(log_has("it stays where it was"));
    free_ok(p);
    stop();
}

/* Every driver call uvm/ makes, failing once in a scripted sequence: the
 * engine sees a CUDA error or success, never a crash; nothing leaks and the
 * books balance. */
static void every_driver_call_failing_once(void **state)
{
    static const char *const calls[] = {
        "cuMemAllocManaged", "cuMemHostRegister_v2", "cuMemHostGetDevicePointer_v2", "cuMemAdvise_v2",
        "cuMemPrefetchAsync_v2", "cuStreamCreate", "cuStreamSynchronize", "cuMemGetInfo_v2",
        "cuCtxGetDevice", "cuMemFree_v2", "cuMemHostUnregister",
    };
    uint64_t live0 = f_live_bytes(FAKECUDA_ANY);
    size_t reg0 = wo_registry_count();

    (void)state;
    for (size_t c = 0; c < WO_ARRAY_SIZE(calls); c++) {
        CUdeviceptr p[3] = {0, 0, 0};
        CUresult r[3];
        int served[3];

        uint64_t inj0;

        start(moe_policy);
        inj0 = f_injected();
        assert_int_equal(f_fail(calls[c], 1, CUDA_ERROR_UNKNOWN), 0);
        assert_int_equal(wo_api_tag_push("l0.experts.w2_weight"), 0); /* pinned */
        served[0] = wo_uvm_alloc(2 * MiB, WO_API_CU_MEM_ALLOC, &p[0], &r[0]);
        assert_int_equal(wo_api_tag_pop(), 0);
        assert_int_equal(wo_api_tag_push("l0.attn.weight"), 0); /* managed, device */
        served[1] = wo_uvm_alloc(2 * MiB, WO_API_CU_MEM_ALLOC, &p[1], &r[1]);
        assert_int_equal(wo_api_tag_pop(), 0);
        served[2] = wo_uvm_alloc(4 * MiB, WO_API_CU_MEM_ALLOC, &p[2], &r[2]); /* window */
        for (int i = 0; i < 3; i++) {
            /* A failed cuMemGetInfo is no room under the managed cap: the
             * device placement then passes through to the engine's call. */
            if (i == 1 && strcmp(calls[c], "cuMemGetInfo_v2") == 0) {
                assert_int_equal(served[i], 0);
                assert_int_equal(wo_uvm.cap.passed, 1);
                p[i] = 0;
                continue;
            }
            assert_int_equal(served[i], 1);
            if (r[i] != CUDA_SUCCESS)
                assert_int_equal(p[i], 0);
        }
        if (p[2])
            assert_int_equal(wo_api_tag((void *)(uintptr_t)p[2], MiB, "l1.hot"), 0);
        (void)wo_api_seal();
        if (p[2])
            (void)wo_uvm_place_range(p[2], 4 * MiB, WO_PLACE_DEVICE);
        for (int i = 0; i < 3; i++) {
            CUresult fr = CUDA_ERROR_UNKNOWN;
            if (!p[i])
                continue;
            assert_int_equal(wo_uvm_free(p[i], &fr), 1);
            if (fr != CUDA_SUCCESS) {
                /* The failed free left the memory and its record: a retry works. */
                assert_int_equal(wo_uvm_free(p[i], &fr), 1);
                assert_int_equal(fr, CUDA_SUCCESS);
            }
        }
        if (f_injected() != inj0 + 1)
            fail_msg("%s was never called in the sequence", calls[c]);
        assert_int_equal(wo_uvm.nallocs, 0);
        assert_int_equal(wo_registry_count(), reg0);
        assert_int_equal(f_live_bytes(FAKECUDA_ANY), live0);
        stop();
    }
}

/* ---- data across placement changes ------------------------------------------ */

static void data_bit_exact_across_moves(void **state)
{
    const size_t size = 16 * MiB;
    static const enum wo_placement cycle[] = {WO_PLACE_DEVICE, WO_PLACE_HOST, WO_PLACE_MANAGED,
                                              WO_PLACE_DEVICE, WO_PLACE_HOST};
    unsigned char *ref = malloc(size), *out = malloc(size);
    CUdeviceptr p, d;
    uint64_t x = 88172645463325252ull;

    (void)state;
    assert_non_null(ref);
    assert_non_null(out);
    start("version: 1\nrules:\n  - {match: [experts], place: host}\n");
    p = alloc_ok(size);
    for (size_t i = 0; i < size; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        ref[i] = (unsigned char)x;
    }
    assert_int_equal(drv.cuMemAlloc_v2(&d, size), CUDA_SUCCESS);
    memcpy((void *)(uintptr_t)d, ref, size); /* fake device memory is host memory */
    assert_int_equal(drv.cuMemcpy(p, d, size), CUDA_SUCCESS);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)p, size / 2, "l0.experts"), 0);
    assert_int_equal(wo_api_seal(), 0);
    for (size_t k = 0; k < WO_ARRAY_SIZE(cycle); k++) {
        assert_int_equal(wo_uvm_place_range(p, size, cycle[k]), 0);
        if (cycle[k] == WO_PLACE_DEVICE) {
            assert_device_placed(p);
            assert_true(page(p).resident & 2u);
        } else {
            assert_host_placed(p);
        }
        assert_int_equal(drv.cuMemcpy(d, p, size), CUDA_SUCCESS);
        memcpy(out, (void *)(uintptr_t)d, size);
        assert_memory_equal(out, ref, size);
    }
    assert_int_equal(wo_uvm_place_range(p + size, 1, WO_PLACE_HOST), -ENOENT);
    assert_int_equal(wo_uvm_place_range(p + 1, size, WO_PLACE_HOST), -ERANGE);
    assert_int_equal(drv.cuMemFree_v2(d), CUDA_SUCCESS);
    free_ok(p);
    free(ref);
    free(out);
    stop();
}

/* ---- consumer: launches resolved to names ------------------------------------ */

/* The stats JSON once it contains needle (the consumer thread drains the
 * ring asynchronously); the last one read otherwise. Free it. */
static char *stats_when(const char *needle)
{
    char *js = NULL;

    for (int tries = 0; tries < 2000; tries++) {
        free(js);
        js = stats();
        if (strstr(js, needle))
            break;
        usleep(1000);
    }
    return js;
}

/* A launch event with one hit on range r: pointers from offset to hi. */
static struct wo_event launch_hit(const struct wo_range *r, uint64_t offset, uint64_t hi)
{
    struct wo_event ev;

    memset(&ev, 0, sizeof(ev));
    ev.type = WO_EV_LAUNCH;
    ev.nhits = 1;
    ev.l.hits[0].id = r->id;
    ev.l.hits[0].gen = r->gen;
    ev.l.hits[0].offset = offset;
    ev.l.hits[0].hi = hi;
    return ev;
}

static void launches_are_attributed_to_names(void **state)
{
    CUdeviceptr p;
    struct wo_range r;
    struct wo_event ev;
    char *js = NULL;

    (void)state;
    start("version: 1\nrules:\n  - {match: [experts], place: managed}\n");
    p = alloc_ok(4 * MiB);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)p, MiB, "l0.experts"), 0);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)(p + MiB), MiB, "l1.experts"), 0);
    assert_int_equal(wo_registry_find(p, &r), 0);
    for (int i = 0; i < 10; i++) {
        /* Even launches touch l0 only, odd ones span both. */
        ev = launch_hit(&r, 4096, i % 2 ? MiB + 8 : 8192);
        assert_int_equal(wo_ring_push(wo_events, &ev), 0);
    }
    /* A stale hit (wrong generation) counts as stale, never as a name. */
    ev.l.hits[0].gen = r.gen + 1;
    assert_int_equal(wo_ring_push(wo_events, &ev), 0);
    js = stats_when("\"seen\":11,");
    assert_valid_json(js);
    assert_name(js, "l0.experts", "\"launches\":10,");
    assert_name(js, "l1.experts", "\"launches\":5,");
    assert_true(strstr(js, "\"stale_hits\":1") != NULL);
    free(js);
    free_ok(p);
    stop();
}

/* Bytes touched per name: a hit covers one slice (the gcd of the non-zero
 * offsets seen in the tag) from its lowest pointer, the whole tag while only
 * its start was seen; a hit that runs on into the next tag covers that tag
 * from its start. */
static void touched_bytes_follow_slices(void **state)
{
    static const uint64_t hits[][2] = {
        {0, 0},                   /* T0 whole: 4 MiB */
        {MiB, MiB},               /* slice 1 MiB: 1 MiB */
        {3 * MiB, 3 * MiB},       /* gcd 1 MiB: 1 MiB */
        {MiB / 2, MiB / 2},       /* gcd 512 KiB: 512 KiB */
        {3 * MiB, 4 * MiB + 8},   /* T0 [3, 4) MiB: 1 MiB; T1 from its start, no slice: 4 MiB */
    };
    CUdeviceptr p;
    struct wo_range r;
    struct wo_event ev;
    char *js = NULL;
    char want[64];

    (void)state;
    start("version: 1\nrules:\n  - {match: [experts], place: host}\n");
    p = alloc_ok(8 * MiB);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)p, 4 * MiB, "t0.experts"), 0);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)(p + 4 * MiB), 4 * MiB, "t1.experts"), 0);
    assert_int_equal(wo_registry_find(p, &r), 0);
    for (size_t i = 0; i < WO_ARRAY_SIZE(hits); i++) {
        ev = launch_hit(&r, hits[i][0], hits[i][1]);
        assert_int_equal(wo_ring_push(wo_events, &ev), 0);
    }
    js = stats_when("\"seen\":5,");
    assert_valid_json(js);
    snprintf(want, sizeof(want), "\"touched_bytes\":%llu,", (unsigned long long)(15 * MiB / 2));
    assert_name(js, "t0.experts", want);
    snprintf(want, sizeof(want), "\"touched_bytes\":%llu,", (unsigned long long)(4 * MiB));
    assert_name(js, "t1.experts", want);
    free(js);
    free_ok(p);
    stop();
}

/* A name whose memory the engine freed (llama.cpp frees its model buffer
 * before it exits) leaves "names" for "released_names", with its placement,
 * its peak and its launches; loaded and freed again, it keeps one record
 * whose launches add up over both lives. */
static void released_names_keep_their_placement(void **state)
{
    CUdeviceptr p;
    struct wo_range r;
    struct wo_event ev;
    char *js = NULL, *rel;
    char want[64];

    (void)state;
    start("version: 1\nrules:\n  - {match: [experts], place: host}\n");
    for (int life = 1; life <= 2; life++) {
        p = alloc_ok(8 * MiB);
        assert_int_equal(wo_api_tag((void *)(uintptr_t)p, 4 * MiB, "x.experts"), 0);
        assert_int_equal(wo_api_tag((void *)(uintptr_t)(p + 4 * MiB), 2 * MiB, "x.norm"), 0);
        assert_int_equal(wo_registry_find(p, &r), 0);
        for (int i = 0; i < 3; i++) {
            ev = launch_hit(&r, 0, 0);
            assert_int_equal(wo_ring_push(wo_events, &ev), 0);
        }
        snprintf(want, sizeof(want), "\"seen\":%d,", 3 * life);
        js = stats_when(want);
        free(js);
        free_ok(p);
        names_let_go();
    }
    js = stats();
    assert_valid_json(js);
    assert_released(js, "x.experts", "\"placement\":\"host\",\"policy\":\"host\"");
    rel = strstr(js, "\"released_names\":[");
    snprintf(want, sizeof(want), "\"peak_bytes\":%llu,", (unsigned long long)(4 * MiB));
    assert_name(rel, "x.experts", want);
    assert_name(rel, "x.experts", "\"peak_tensors\":1,\"lives\":2,\"launches\":6,");
    assert_name(rel, "x.norm", "\"placement\":\"device\"");
    assert_name(rel, "x.norm", "\"lives\":2,");
    assert_non_null(strstr(js, "\"released_names_dropped\":0"));
    free(js);
    stop();
}

/* Many names freed, then loaded and freed again: the records' index grows
 * (64, 128, 256 records) and still finds a name recorded before it grew. */
static void released_names_survive_growth(void **state)
{
    enum { N = 200 };
    CUdeviceptr p;
    char name[32], *js;

    (void)state;
    start("version: 1\nrules:\n  - {match: [experts], place: host}\n");
    for (int life = 0; life < 2; life++) {
        p = alloc_ok(N * 65536);
        for (int i = 0; i < N; i++) {
            snprintf(name, sizeof(name), "l%d.experts", i);
            assert_int_equal(wo_api_tag((void *)(uintptr_t)(p + (uint64_t)i * 65536), 65536, name),
                             0);
        }
        free_ok(p);
        names_let_go(); /* then the next life makes them again */
    }
    js = stats();
    assert_valid_json(js);
    assert_released(js, "l0.experts", "\"lives\":2,");
    assert_released(js, "l63.experts", "\"lives\":2,");
    assert_released(js, "l199.experts", "\"lives\":2,");
    assert_non_null(strstr(js, "\"released_names_dropped\":0"));
    free(js);
    stop();
}

/* A launch recorded into a stream capture runs when its graph is launched:
 * per-name accounting counts it once per graph launch, not at capture. */
static void graph_replays_are_accounted(void **state)
{
    CUdeviceptr p;
    struct wo_range r;
    struct wo_event ev;
    char *js = NULL;
    char want[64];

    (void)state;
    start("version: 1\nrules:\n  - {match: [experts], place: host}\n");
    p = alloc_ok(4 * MiB);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)p, 4 * MiB, "g.experts"), 0);
    assert_int_equal(wo_registry_find(p, &r), 0);
    memset(&ev, 0, sizeof(ev));
    ev.type = WO_EV_CAPTURE_BEGIN;
    ev.stream = 7;
    ev.g.handle = 42; /* capture id */
    assert_int_equal(wo_ring_push(wo_events, &ev), 0);
    ev = launch_hit(&r, 0, 0);
    ev.stream = 7;
    ev.capture = 42;
    assert_int_equal(wo_ring_push(wo_events, &ev), 0);
    memset(&ev, 0, sizeof(ev));
    ev.type = WO_EV_CAPTURE_END;
    ev.stream = 7;
    ev.g.handle = 0x1000; /* the graph */
    ev.g.aux = 42;
    assert_int_equal(wo_ring_push(wo_events, &ev), 0);
    ev.type = WO_EV_GRAPH_INSTANTIATE;
    ev.g.handle = 0x2000; /* the exec */
    ev.g.aux = 0x1000;
    assert_int_equal(wo_ring_push(wo_events, &ev), 0);
    for (int i = 0; i < 3; i++) {
        ev.type = WO_EV_GRAPH_LAUNCH;
        ev.g.handle = 0x2000;
        ev.g.aux = 0;
        assert_int_equal(wo_ring_push(wo_events, &ev), 0);
    }
    js = stats_when("\"events\":7}");
    assert_valid_json(js);
    assert_name(js, "g.experts", "\"launches\":3,");
    snprintf(want, sizeof(want), "\"touched_bytes\":%llu,", (unsigned long long)(12 * MiB));
    assert_name(js, "g.experts", want);
    free(js);
    free_ok(p);
    stop();
}

/* uvm/graph.c on its own: what each event stands for. Captures match by
 * capture id (a launch on another stream joins the capture that id names)
 * or, without one, by stream; a graph launch replays the latest capture of
 * the graph its exec was last instantiated from. */
static struct wo_event gev(enum wo_ev_type type, uint64_t stream, uint64_t handle, uint64_t aux)
{
    struct wo_event ev;

    memset(&ev, 0, sizeof(ev));
    ev.type = type;
    ev.stream = stream;
    ev.g.handle = handle;
    ev.g.aux = aux;
    return ev;
}

static struct wo_event glaunch(uint64_t stream, uint32_t capture, uint64_t func)
{
    struct wo_event ev;

    memset(&ev, 0, sizeof(ev));
    ev.type = WO_EV_LAUNCH;
    ev.stream = stream;
    ev.capture = capture;
    ev.l.func = func;
    return ev;
}

static void graph_expansion(void **state)
{
    struct wo_graphs *g = wo_graphs_new();
    const struct wo_event *l;
    struct wo_event ev;

    (void)state;
    assert_non_null(g);
    /* an ordinary launch is itself */
    ev = glaunch(1, 0, 0xa);
    assert_int_equal(wo_graphs_expand(g, &ev, &l), 1);
    assert_ptr_equal(l, &ev);
    /* capture 5 on stream 7 (by id), capture on stream 9 (no id: by stream) */
    ev = gev(WO_EV_CAPTURE_BEGIN, 7, 5, 0);
    assert_int_equal(wo_graphs_expand(g, &ev, &l), 0);
    ev = gev(WO_EV_CAPTURE_BEGIN, 9, 0, 0);
    assert_int_equal(wo_graphs_expand(g, &ev, &l), 0);
    ev = glaunch(7, 5, 0xb);
    assert_int_equal(wo_graphs_expand(g, &ev, &l), 0);
    ev = glaunch(8, 5, 0xc); /* a forked stream joins capture 5 */
    assert_int_equal(wo_graphs_expand(g, &ev, &l), 0);
    ev = glaunch(9, 0, 0xd);
    assert_int_equal(wo_graphs_expand(g, &ev, &l), 0);
    ev = glaunch(1, 0, 0xe); /* not capturing: runs now */
    assert_int_equal(wo_graphs_expand(g, &ev, &l), 1);
    ev = gev(WO_EV_CAPTURE_END, 7, 0x100, 5);
    assert_int_equal(wo_graphs_expand(g, &ev, &l), 0);
    ev = gev(WO_EV_CAPTURE_END, 9, 0x200, 0);
    assert_int_equal(wo_graphs_expand(g, &ev, &l), 0);
    /* after the end, stream 9 runs its launches again */
    ev = glaunch(9, 0, 0xf);
    assert_int_equal(wo_graphs_expand(g, &ev, &l), 1);
    /* an exec nobody instantiated replays nothing */
    ev = gev(WO_EV_GRAPH_LAUNCH, 1, 0x1000, 0);
    assert_int_equal(wo_graphs_expand(g, &ev, &l), 0);
    ev = gev(WO_EV_GRAPH_INSTANTIATE, 0, 0x1000, 0x100);
    assert_int_equal(wo_graphs_expand(g, &ev, &l), 0);
    ev = gev(WO_EV_GRAPH_LAUNCH, 1, 0x1000, 0);
    assert_int_equal(wo_graphs_expand(g, &ev, &l), 2);
    assert_int_equal(l[0].l.func, 0xb);
    assert_int_equal(l[1].l.func, 0xc);
    /* the exec instantiated again, from the other graph: the latest wins */
    ev = gev(WO_EV_GRAPH_INSTANTIATE, 0, 0x1000, 0x200);
    assert_int_equal(wo_graphs_expand(g, &ev, &l), 0);
    ev = gev(WO_EV_GRAPH_LAUNCH, 1, 0x1000, 0);
    assert_int_equal(wo_graphs_expand(g, &ev, &l), 1);
    assert_int_equal(l[0].l.func, 0xd);
    /* other events stand for no launch */
    ev = gev(WO_EV_SYNC, 1, 0, 0);
    assert_int_equal(wo_graphs_expand(g, &ev, &l), 0);
    assert_null(l);
    wo_graphs_free(g);
    /* no table: launches as they come, even one a capture took */
    ev = glaunch(7, 5, 0xb);
    assert_int_equal(wo_graphs_expand(NULL, &ev, &l), 1);
    assert_ptr_equal(l, &ev);
    ev = gev(WO_EV_GRAPH_LAUNCH, 1, 0x1000, 0);
    assert_int_equal(wo_graphs_expand(NULL, &ev, &l), 0);
}

/* ---- stats --------------------------------------------------------------------- */

static void stats_json_content(void **state)
{
    CUdeviceptr p, q;
    char *js;
    char path[] = "/tmp/test-uvm-stats-XXXXXX";
    char buf[65536];
    int fd;
    ssize_t n;

    (void)state;
    start(moe_policy);
    assert_int_equal(wo_api_tag_push("m.layers.1.experts.w2_weight"), 0);
    p = alloc_ok(2 * MiB);
    assert_int_equal(wo_api_tag_pop(), 0);
    q = alloc_ok(4 * MiB); /* window */
    assert_int_equal(wo_api_tag((void *)(uintptr_t)q, MiB, "quote\"and\\back\nslash"), 0);
    assert_int_equal(wo_api_tag((void *)(uintptr_t)(q + MiB), 4096, "caf\xc3\xa9.\xff\xc3"), 0);
    js = stats();
    assert_valid_json(js);
    assert_true(strstr(js, "\"pending\":{\"bytes\":3141632,\"tensors\":1") != NULL);
    free(js);
    assert_int_equal(wo_api_seal(), 0);
    js = stats();
    assert_valid_json(js);
    assert_true(strncmp(js, "{\"version\":\"", 12) == 0);
    assert_true(strstr(js, "\"settings\":{") != NULL);
    assert_true(strstr(js, "\"ring_events\":") != NULL);
    assert_true(strstr(js, "\"policy\":{\"path\":\"/tmp/test-uvm-policy-") != NULL);
    assert_true(strstr(js, "\"loaded\":true") != NULL);
    assert_true(strstr(js, "\"host\":{\"bytes\":2097152,\"tensors\":1") != NULL);
    /* the odd name (rule: default, device) plus the untagged 3 MiB */
    assert_true(strstr(js, "\"device\":{\"bytes\":4194304,\"tensors\":2,\"untagged_bytes\":3141632}") != NULL);
    assert_name(js, "m.layers.1.experts.w2_weight", "\"placement\":\"host\"");
    assert_name(js, "m.layers.1.experts.w2_weight", "\"bytes\":2097152");
    assert_name(js, "m.layers.1.experts.w2_weight", "\"rule\":\"rule 1 'experts-pinned'");
    assert_name(js, "quote\\\"and\\\\back\\u000aslash", "\"placement\":\"device\"");
    assert_name(js, "caf\xc3\xa9.\\ufffd\\ufffd", "\"bytes\":4096");
    assert_true(strstr(js, "\"ring\":{\"capacity\":") != NULL);
    assert_true(strstr(js, "\"interpose\":{") != NULL);
    assert_true(strstr(js, "\"prefetch\":{\"prefetches\":") != NULL);
    assert_true(strstr(js, "\"served_pinned\":1") != NULL);
    assert_true(strstr(js, "\"served_managed\":1") != NULL);
    assert_true(strstr(js, "\"sealed\":true") != NULL);
    free(js);

    fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    /* the file is replaced whole (written beside it, renamed over it): read
     * it by its path, and nothing is left beside it */
    assert_int_equal(wo_stats_write_file(path), 0);
    fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    n = read(fd, buf, sizeof(buf) - 1);
    assert_true(n > 0);
    buf[n] = '\0';
    assert_int_equal(buf[n - 1], '\n');
    buf[n - 1] = '\0';
    assert_valid_json(buf);
    close(fd);
    {
        char tmp[sizeof(path) + 32];
        struct stat st;
        snprintf(tmp, sizeof(tmp), "%s.%ld.tmp", path, (long)getpid());
        assert_int_equal(stat(tmp, &st), -1);
        /* a path that is not a regular file is written in place, never
         * replaced: /dev/null stays the device */
        assert_int_equal(wo_stats_write_file("/dev/null"), 0);
        assert_int_equal(stat("/dev/null", &st), 0);
        assert_true(S_ISCHR(st.st_mode));
    }
    unlink(path);
    assert_int_equal(wo_stats_write_file("/nonexistent-dir/x.json"), -ENOENT);
    assert_true(log_has("cannot write the stats to /nonexistent-dir/x.json"));
    free_ok(p);
    free_ok(q);
    stop();
}

/* ---- release: no growth ----------------------------------------------------------- */

static size_t heap_in_use(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

static long rss_kib(void)
{
    long pages = -1, rss = -1;
    FILE *f = fopen("/proc/self/statm", "r");

    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
            rss = -1;
        fclose(f);
    }
    return rss < 0 ? -1 : rss * (sysconf(_SC_PAGESIZE) / 1024);
}

static void cycle_once(int i, bool unique)
{
    char name[64];
    CUdeviceptr p;

    snprintf(name, sizeof(name), unique ? "cycle.%d.experts.w2_weight" : "cycle.experts.w2_weight", i);
    assert_int_equal(wo_api_tag_push(i % 2 ? name : "cycle.scope"), 0);
    p = alloc_ok(MiB);
    assert_int_equal(wo_api_tag_pop(), 0);
    if (i % 2 == 0)
        assert_int_equal(wo_api_tag((void *)(uintptr_t)(p + 4096), 4096, "cycle.scope"), 0);
    free_ok(p);
}

static void thousand_cycles_do_not_grow(void **state)
{
    uint64_t live0 = f_live_bytes(FAKECUDA_ANY);
    size_t count0 = f_live_count(FAKECUDA_ANY), reg0 = wo_registry_count(), heap1;
    long rss1;
    const int warm = 50;

    (void)state;
    start(moe_policy);
    assert_int_equal(wo_api_seal(), 0);
    for (int i = 0; i < warm; i++)
        cycle_once(i, true);
    heap1 = heap_in_use();
    rss1 = rss_kib();
    for (int i = warm; i < 1000; i++) {
        cycle_once(i, true);
        cycle_once(i, false);
    }
    assert_int_equal(f_live_bytes(FAKECUDA_ANY), live0);
    assert_int_equal(f_live_count(FAKECUDA_ANY), count0);
    assert_int_equal(wo_registry_count(), reg0);
    assert_int_equal(wo_uvm.nallocs, 0);
    names_let_go();
    /* 1,950 cycles with 1,000 distinct names: the heap stays where it was
     * (a little slack for allocator bookkeeping). */
    if (heap_in_use() > heap1 + 64 * 1024)
        fail_msg("heap grew from %zu to %zu bytes over 1,950 cycles", heap1, heap_in_use());
    /* The resident set too (1,950 MiB went through the fake driver). */
    if (rss1 > 0 && rss_kib() > rss1 + 8192)
        fail_msg("RSS grew from %ld to %ld KiB over 1,950 cycles", rss1, rss_kib());
    stop();
}

/* ---- threads, shutdown, fork ----------------------------------------------------------- */

static int worker_errors;

/* cmocka's asserts are not for other threads: count failures instead. */
static void *worker(void *arg)
{
    int id = (int)(intptr_t)arg;
    char name[64];

    if (drv.cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
        __atomic_add_fetch(&worker_errors, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < 200; i++) {
        CUdeviceptr p = 0;
        CUresult r = CUDA_ERROR_UNKNOWN;
        int bad = 0;
        snprintf(name, sizeof(name), "t%d.layers.%d.experts.w13_weight", id, i % 7);
        bad |= wo_api_tag_push(name) != 0;
        bad |= wo_uvm_alloc(MiB, WO_API_CUDA_MALLOC, &p, &r) != 1 || r != CUDA_SUCCESS;
        bad |= wo_api_tag_pop() != 0;
        bad |= wo_api_tag((void *)(uintptr_t)p, MiB, name) != 0;
        if (i % 10 == 0) {
            char buf[256];
            bad |= wo_api_stats(buf, sizeof(buf)) <= 0;
        }
        bad |= wo_uvm_free(p, &r) != 1 || r != CUDA_SUCCESS;
        if (bad)
            __atomic_add_fetch(&worker_errors, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

static void concurrent_threads(void **state)
{
    pthread_t t[4];

    (void)state;
    start(moe_policy);
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    assert_int_equal(worker_errors, 0);
    assert_int_equal(wo_uvm.nallocs, 0);
    assert_int_equal(wo_uvm.served_managed, 800);
    stop();
}

/* A free of memory the pinned-copy worker is reading by CPU (uvm/stream-pin.c
 * copies outside wo_uvm.lock and announces the bytes in wo_uvm.cpu_read_*)
 * waits until they are read, served and observed ranges alike; a free of
 * other memory, and everything else that takes the lock, goes on. */
static CUdeviceptr freeing;
static int freed_flag;

static void *free_thread(void *arg)
{
    CUdeviceptr p = freeing;

    drv.cuCtxSetCurrent(ctx);
    if (arg)
        observed_free(p);
    else
        free_ok(p);
    __atomic_store_n(&freed_flag, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void free_waits_for_cpu_read(void **state)
{
    (void)state;
    start(moe_policy);
    for (int observed_range = 0; observed_range < 2; observed_range++) {
        CUdeviceptr p = observed_range ? observed(WO_MiB) : alloc_ok(WO_MiB);
        CUdeviceptr other = alloc_ok(WO_MiB);
        pthread_t t;
        /* either reader (the pinned-copy worker, the copy engine's mirror
         * thread) holds the free up */
        unsigned who = observed_range ? WO_READER_MIRROR : WO_READER_PIN;

        pthread_mutex_lock(&wo_uvm.lock);
        wo_uvm.cpu_read[who].lo = p + 64 * 1024;
        wo_uvm.cpu_read[who].hi = p + 128 * 1024;
        pthread_mutex_unlock(&wo_uvm.lock);
        freeing = p;
        __atomic_store_n(&freed_flag, 0, __ATOMIC_RELEASE);
        assert_int_equal(pthread_create(&t, NULL, free_thread, observed_range ? &t : NULL), 0);
        usleep(100000);
        assert_int_equal(__atomic_load_n(&freed_flag, __ATOMIC_ACQUIRE), 0);
        free_ok(other); /* not read: not held up, nor is the lock */
        assert_int_equal(__atomic_load_n(&freed_flag, __ATOMIC_ACQUIRE), 0);
        pthread_mutex_lock(&wo_uvm.lock);
        wo_uvm.cpu_read[who].lo = wo_uvm.cpu_read[who].hi = 0;
        pthread_cond_broadcast(&wo_uvm.cpu_read_cv);
        pthread_mutex_unlock(&wo_uvm.lock);
        assert_int_equal(pthread_join(t, NULL), 0);
        assert_int_equal(__atomic_load_n(&freed_flag, __ATOMIC_ACQUIRE), 1);
    }
    assert_int_equal(wo_uvm.nallocs, 0);
    stop();
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void consumer_sleeps_when_idle(void **state)
{
    struct wo_event ev;
    double c0, used;

    (void)state;
    start(moe_policy);
    memset(&ev, 0, sizeof(ev));
    ev.type = WO_EV_SYNC;
    assert_int_equal(wo_ring_push(wo_events, &ev), 0);
    usleep(50000);
    c0 = cpu_s();
    usleep(500000); /* the main thread sleeps: what the process burns is the consumer's */
    used = cpu_s() - c0;
    /* A spinning thread would burn ~0.5 s; a 2 ms timed sleep costs ~250 wakeups. */
    if (used > 0.05)
        fail_msg("the idle consumer used %.3f s of CPU in 0.5 s", used);
    /* And it still reacts: a new event is drained within a few sleep periods. */
    assert_int_equal(wo_ring_push(wo_events, &ev), 0);
    for (int i = 0; i < 200 && __atomic_load_n(&wo_uvm.events, __ATOMIC_RELAXED) < 2; i++)
        usleep(1000);
    assert_true(__atomic_load_n(&wo_uvm.events, __ATOMIC_RELAXED) >= 2);
    stop();
}

static void shutdown_is_prompt_and_idempotent(void **state)
{
    double t0;
    struct wo_event ev;

    (void)state;
    start(moe_policy);
    memset(&ev, 0, sizeof(ev));
    ev.type = WO_EV_SYNC;
    for (int i = 0; i < 1000; i++)
        (void)wo_ring_push(wo_events, &ev);
    usleep(20000); /* let the consumer go idle into its longest sleep */
    t0 = now_s();
    wo_uvm_shutdown();
    assert_true(now_s() - t0 < 0.5);
    wo_uvm_shutdown();
    assert_int_equal(wo_uvm.state, 2);
    assert_true(wo_uvm.events >= 1000);
    /* After shutdown the API still answers. */
    assert_int_equal(wo_api_tag_push("x"), 0);
    assert_int_equal(wo_api_tag_pop(), 0);
    stop();
}

static void fork_child_restarts(void **state)
{
    CUdeviceptr p;
    pid_t pid;
    int st;

    (void)state;
#if defined(__SANITIZE_THREAD__)
    /* TSan cannot start threads in the child of a multi-threaded fork. */
    skip();
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
    skip();
#endif
#endif
    start(moe_policy);
    p = alloc_ok(2 * MiB);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        wo_uvm_atfork_child();
        if (wo_uvm_init() != 0 || wo_uvm.state != 1)
            _exit(1);
        /* The parent's records came along: a tag finds the range. */
        if (wo_api_tag((void *)(uintptr_t)p, MiB, "child.tag") != 0)
            _exit(2);
        wo_uvm_shutdown();
        _exit(wo_uvm.state == 2 ? 0 : 3);
    }
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    free_ok(p);
    stop();
}

/* Four attention weights of 8 MiB, then eight expert tensors of 64 MiB. */
static void staging_items(struct wo_fit_item *v, char (*names)[48])
{
    for (int i = 0; i < 12; i++)
        v[i] = (struct wo_fit_item){.name = names[i],
                                    .size = (i < 4 ? 8 : 64) * MiB,
                                    .weight = -1,
                                    .fixed = WO_PLACE_UNSET,
                                    .movable = true};
}

/* fit's room for the streaming executor's slots (uvm/fit-split.c,
 * fit_staging) with WOFFLOAD_PICKS on (the default): routed experts sent
 * off the device count for the slots where their memory can be lent
 * (managed: llama.cpp's one model buffer, where a batch that picks nearly
 * every expert hands them to the executor), and the room is lent to them
 * while the slots stay empty; not in memory that cannot be lent (served
 * as pinned host memory), nor in the plan of names announced before their
 * bytes (lend_experts false). */
static void fit_staging_counts_lendable_experts(void **state)
{
    static const char pol[] = "version: 1\nfit: {device: 1GiB, keep_free: 0, reserve: 0}\n";
    char names[12][48];
    struct wo_fit_item v[12];
    bool lendable[12], pinned[12] = {false};
    struct wo_fit_split sp;
    const struct wo_settings *set = wo_settings();
    uint64_t band = wo_settings_given(set, "WOFFLOAD_GGML_PICKS_FROM") && set->ggml_picks_from > 0
                        ? 64 * MiB * (uint64_t)set->picks_buffers
                        : 0;

    (void)state;
    start(pol);
    assert_non_null(wo_uvm.g);
    for (int i = 0; i < 12; i++) {
        snprintf(names[i], sizeof(names[i]),
                 i < 4 ? "blk.%d.attn_q.weight" : "blk.%d.ffn_up_exps.weight", i);
        lendable[i] = true;
    }
    for (int pass = 0; pass < 3; pass++) {
        staging_items(v, names);
        /* 400 MiB: the attention weights and five experts first; three
         * experts off the device */
        memset(&sp, 0, sizeof(sp));
        wo_place_fit_split(wo_uvm.g, &wo_uvm.g->fit, v, pass == 1 ? pinned : lendable, pass != 2,
                           12, 400 * MiB, UINT64_MAX, &sp);
        if (pass == 0) {
            assert_true(sp.staging >= 2 * 57 * MiB);
            assert_true(sp.staging <= 200 * MiB);
            assert_true(sp.lent > 0);
            assert_true(sp.lent <= sp.staging);
        } else {
            assert_int_equal(sp.staging, 0);
            assert_int_equal(sp.lent, 0);
        }
        /* the picked copies' buffers, for the largest expert off the
         * device: llama.cpp's experts get picks under fit only where the
         * ggml hook's band (WOFFLOAD_GGML_PICKS_FROM) is given, or more
         * (fit_ggml_picks_rule) */
        assert_int_equal(sp.picks, band);
        assert_int_equal(sp.weights, 400 * MiB - sp.staging - sp.picks);
        for (int i = 0; i < 4; i++)
            assert_int_equal(v[i].out, WO_PLACE_DEVICE);
    }
    /* a budget where two slots take more than half of it (160 MiB, the
     * slots about 115): kept where the room is lent, as at llama.cpp's
     * own -ot memory; none where it cannot be lent, nor with
     * WOFFLOAD_FIT_LEND=0 (the rows' A/B) */
    for (int pass = 0; pass < 2; pass++) {
        staging_items(v, names);
        memset(&sp, 0, sizeof(sp));
        wo_place_fit_split(wo_uvm.g, &wo_uvm.g->fit, v, pass ? pinned : lendable, true, 12,
                           160 * MiB, UINT64_MAX, &sp);
        if (set->fit_lend && !pass) {
            assert_true(sp.staging > 80 * MiB);
            assert_true(sp.staging <= 160 * MiB);
            assert_int_equal(sp.weights + sp.staging + sp.picks, 160 * MiB);
        } else {
            assert_int_equal(sp.staging, 0);
        }
    }
    stop();
}

/* Whether fit keeps room for the picked copies of llama.cpp's experts
 * (uvm/fit-split.c, wo_place_fit_ggml_picks): where the ggml hook
 * registers picks under fit. The band (WOFFLOAD_GGML_PICKS_FROM) counts
 * only when the environment gave it, whatever its default; a band given as
 * 0, a bad value or another picks setting does not; WOFFLOAD_GGML_PICKS
 * and hot experts (the setting or the policy's) do. */
static void quiet_report(void *ud, const char *msg)
{
    (void)ud;
    (void)msg; /* the bad value's message: test-settings checks it */
}

static void fit_ggml_picks_rule(void **state)
{
    static const struct {
        const char *env;
        bool hot_policy, want;
    } cases[] = {
        {NULL, false, false},
        {"WOFFLOAD_GGML_PICKS_FROM=80", false, true},
        {"WOFFLOAD_GGML_PICKS_FROM=0", false, false},
        {"WOFFLOAD_GGML_PICKS_FROM=eighty", false, false},
        {"WOFFLOAD_PICKS_BUFFERS=4", false, false},
        {"WOFFLOAD_GGML_PICKS=30", false, true},
        {"WOFFLOAD_PICKS_HOT=512", false, true},
        {NULL, true, true},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *env[2] = {(char *)cases[i].env, NULL};
        struct wo_settings s;
        struct wo_policy_globals g;

        memset(&g, 0, sizeof(g));
        g.prefetch.hot_experts = cases[i].hot_policy ? 64 * MiB : 0;
        (void)wo_settings_parse(env, &s, quiet_report, NULL);
        if (wo_place_fit_ggml_picks(&s, &g) != cases[i].want)
            fail_msg("case %zu (%s%s): want %d", i, cases[i].env ? cases[i].env : "no setting",
                     cases[i].hot_policy ? ", hot experts in the policy" : "", cases[i].want);
    }
}

/* The device budget the executors share (uvm/plan-budget.h): the planner's
 * part is the device budget less what the stager's slots reserve, never
 * below 0; a range the stager takes or gives back reaches the resident
 * side, and the planner's queued actions run after each change; with no
 * resident side registered nothing happens and the questions answer 0. */
static uint64_t ledger_reserved;
static char ledger_log[16];

static uint64_t ledger_reserve_fn(void)
{
    return ledger_reserved;
}

static bool ledger_claims_fn(uint32_t id, uint32_t gen)
{
    return id == 7 && gen == 2;
}

static void ledger_note(char c)
{
    size_t n = strlen(ledger_log);

    if (n + 1 < sizeof(ledger_log)) {
        ledger_log[n] = c;
        ledger_log[n + 1] = 0;
    }
}

static void ledger_drop(uint32_t id, uint32_t gen)
{
    ledger_note(id == 7 && gen == 2 ? 'd' : '?');
}

static void ledger_admit(uint32_t id, uint32_t gen)
{
    ledger_note(id == 7 && gen == 2 ? 'a' : '?');
}

static void ledger_run(void)
{
    ledger_note('r');
}

static uint64_t ledger_blind;

static uint64_t ledger_blind_fn(void)
{
    return ledger_blind;
}

static void budget_ledger(void **state)
{
    const struct wo_budget_stager st = {.reserved = ledger_reserve_fn, .claims = ledger_claims_fn,
                                        .blind_unused = ledger_blind_fn};
    const struct wo_budget_resident res = {
        .drop = ledger_drop, .admit = ledger_admit, .run = ledger_run};
    uint64_t saved = wo_uvm.device_budget;
    struct wo_plan_cfg cfg;
    struct wo_plan *plan = NULL;

    (void)state;
    wo_uvm.device_budget = 100 * MiB;
    wo_budget_stager(NULL);
    wo_budget_resident(NULL, NULL);
    assert_int_equal(wo_budget_for_plan(), 100 * MiB);
    assert_false(wo_budget_claimed(7, 2));

    wo_budget_stager(&st);
    ledger_reserved = 30 * MiB;
    assert_int_equal(wo_budget_for_plan(), 70 * MiB);
    assert_true(wo_budget_claimed(7, 2));
    assert_false(wo_budget_claimed(7, 3));
    ledger_reserved = 200 * MiB;
    assert_int_equal(wo_budget_for_plan(), 0);
    wo_budget_take(7, 2);
    wo_budget_give(7, 2);
    wo_budget_reserve(MiB);
    assert_int_equal(wo_budget_hot_bytes(7, 2), 0);
    assert_string_equal(ledger_log, "");

    wo_plan_cfg_default(&cfg);
    cfg.budget = 100 * MiB;
    assert_int_equal(wo_plan_new(&cfg, &plan), 0);
    wo_budget_resident(plan, &res);
    wo_budget_take(7, 2);
    wo_budget_give(7, 2);
    wo_budget_reserve(MiB);
    assert_string_equal(ledger_log, "drarr");
    assert_int_equal(wo_budget_hot_bytes(7, 2), 0); /* a range the planner does not know */

    /* picked staging's buffers come off the planner's budget, at the
     * resident side's next tick (and only when they changed) */
    ledger_reserved = 30 * MiB;
    wo_budget_picks_bytes(20 * MiB);
    assert_int_equal(wo_budget_for_plan(), 50 * MiB);
    wo_budget_tick();
    assert_string_equal(ledger_log, "drarrr");
    wo_budget_tick();
    assert_string_equal(ledger_log, "drarrr");
    wo_budget_picks_bytes(0);
    assert_int_equal(wo_budget_for_plan(), 70 * MiB);
    wo_budget_tick();
    assert_string_equal(ledger_log, "drarrrr");
    /* the stager's slots come to count with no call of its own (its first
     * host range streamed: no take): the next tick sets the budget */
    ledger_reserved = 50 * MiB;
    wo_budget_tick();
    assert_string_equal(ledger_log, "drarrrrr");
    assert_int_equal(plan->cfg.budget, 50 * MiB); /* 100 less the slots' 50 */
    wo_budget_tick();
    assert_string_equal(ledger_log, "drarrrrr");
    ledger_reserved = 30 * MiB; /* and back */
    wo_budget_tick();
    assert_string_equal(ledger_log, "drarrrrrr");

    /* residency as the resident side reports it, by (id, gen) */
    assert_false(wo_budget_resident_whole(7, 2));
    wo_budget_note_resident(7, 2, true);
    assert_true(wo_budget_resident_whole(7, 2));
    assert_false(wo_budget_resident_whole(7, 3)); /* new memory under the id */
    wo_budget_note_resident(7, 2, false);
    assert_false(wo_budget_resident_whole(7, 2));
    assert_false(wo_budget_resident_whole(1u << 20, 0)); /* past every id */

    /* fit's staging room back to weights: after enough graph replays
     * through empty slots; then the planner's budget follows the smaller
     * device budget at once, and no range is streamed any more */
    ledger_blind = 31;
    assert_false(wo_budget_staging_unused(32));
    ledger_blind = 32;
    assert_true(wo_budget_staging_unused(32));
    assert_false(wo_budget_staging_closed());
    wo_uvm.device_budget = 40 * MiB;
    wo_budget_close_staging();
    assert_true(wo_budget_staging_closed());
    assert_string_equal(ledger_log, "drarrrrrrr");
    assert_int_equal(wo_budget_for_plan(), 10 * MiB);
    wo_budget_stager(&st); /* a new instance (reset, fork child) opens it again */
    assert_false(wo_budget_staging_closed());

    wo_budget_resident(NULL, NULL);
    wo_budget_stager(NULL);
    assert_false(wo_budget_staging_unused(0)); /* no stager: nothing to give back */
    wo_plan_free(plan);
    wo_uvm.device_budget = saved;
}

/* A failed assert leaves its test early: undo what start() did. */
static int teardown(void **state)
{
    (void)state;
    stop();
    return 0;
}

#define T(f) cmocka_unit_test_teardown(f, teardown)

int main(int argc, char **argv)
{
    const char *path = getenv("WO_FAKE_CUDA");
    const struct CMUnitTest tests[] = {
        T(scope_pinned_host_is_pinned),
        T(scope_placements_known_at_allocation),
        T(window_and_tag_after_allocation),
        T(window_opens_at_start_by_default),
        T(window_on_first_tag),
        T(tag_on_observed_memory_is_recorded),
        T(scope_on_stream_ordered_memory_is_recorded),
        T(managed_segments_for_the_prefetcher),
        T(host_budget_in_tag_order),
        T(device_budget_percent_of_total),
        T(pin_failure_falls_back_to_managed),
        T(pin_failure_stops),
        T(misuse_has_defined_results),
        T(bad_policy_passes_through),
        T(no_policy_passes_through),
        T(managed_alloc_failure_reaches_the_engine),
        T(seal_advice_failure_is_reported),
        T(every_driver_call_failing_once),
        T(data_bit_exact_across_moves),
        T(launches_are_attributed_to_names),
        T(touched_bytes_follow_slices),
        T(released_names_keep_their_placement),
        T(released_names_survive_growth),
        T(graph_replays_are_accounted),
        cmocka_unit_test(graph_expansion),
        T(stats_json_content),
        T(thousand_cycles_do_not_grow),
        T(concurrent_threads),
        T(free_waits_for_cpu_read),
        T(consumer_sleeps_when_idle),
        T(shutdown_is_prompt_and_idempotent),
        T(fork_child_restarts),
        cmocka_unit_test(budget_ledger),
        T(fit_staging_counts_lendable_experts),
        cmocka_unit_test(fit_ggml_picks_rule),
    };

    if (argc > 1)
        path = argv[1];
    if (!path) {
        fprintf(stderr, "usage: test-uvm PATH-TO-FAKE-libcuda.so.1 (or WO_FAKE_CUDA)\n");
        return 2;
    }
    load_fake(path);
    if (wo_registry_init() != 0)
        return 1;
    return cmocka_run_group_tests(tests, NULL, NULL);
}
