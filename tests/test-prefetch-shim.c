/* tests/test-prefetch-shim.c: the prefetcher inside uvm/ end to end on the
 * fake libcuda.so.1: a policy places stacked expert tensors `managed` under
 * a device budget, launch events go through the real ring and consumer
 * thread, and the fake driver's UVM state shows the result: the busiest
 * experts have a GPU copy (a read-mostly duplicate), the budget holds, the
 * data is intact, and shutdown makes no driver call hang.
 *
 * The fake driver's path is argv[1]. */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/trace.h"

#include "fakecuda.h"
#include "core/log.h"
#include "core/registry.h"
#include "uvm/internal.h"
#include "uvm/prefetch.h"

#define MiB ((uint64_t)1 << 20)
#define EXPERT (16 * MiB)
#define NEXP 4
#define LAYERS 4

static const char *fake_path;
static struct wo_driver drv;
static void *fake;
static int (*f_managed_state)(const void *p, struct fakecuda_page_state *out);
static uint64_t (*f_resident)(int loc);
static uint64_t (*f_calls)(const char *name);

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

static int setup(void **state)
{
    CUdevice dev;
    CUcontext ctx;

    (void)state;
    fake = dlopen(fake_path, RTLD_NOW | RTLD_LOCAL);
    if (!fake)
        fail_msg("cannot load %s: %s", fake_path, dlerror());
    if (wo_driver_fill(&drv, fake_lookup, fake) != 0)
        fail_msg("the fake driver lacks a function of struct wo_driver");
    f_managed_state = (__typeof__(f_managed_state))sym("fakecuda_managed_state");
    f_resident = (__typeof__(f_resident))sym("fakecuda_managed_resident");
    f_calls = (__typeof__(f_calls))sym("fakecuda_calls");
    assert_int_equal(drv.cuInit(0), CUDA_SUCCESS);
    assert_int_equal(drv.cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    assert_int_equal(drv.cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    assert_int_equal(drv.cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    return 0;
}

static void push(struct wo_event *ev)
{
    /* the ring is bounded: wait for the consumer rather than drop */
    for (int i = 0; i < 100000 && wo_ring_push(wo_events, ev) < 0; i++)
        usleep(100);
}

/* Events the consumer drained (it counts them under wo_uvm.lock). */
static uint64_t drained(void)
{
    uint64_t n;

    pthread_mutex_lock(&wo_uvm.lock);
    n = wo_uvm.events;
    pthread_mutex_unlock(&wo_uvm.lock);
    return n;
}

static void wait_idle(uint64_t pushed)
{
    struct timespec d = {0, 2000000};

    for (int i = 0; i < 5000 && drained() < pushed; i++)
        nanosleep(&d, NULL);
    /* the last batch is counted before it is dispatched: wait until the
     * prefetcher's step count stops moving */
    for (int i = 0, still = 0; i < 1000 && still < 5; i++) {
        struct wo_prefetch_totals a, b;

        wo_prefetch_totals(&a);
        nanosleep(&d, NULL);
        wo_prefetch_totals(&b);
        still = a.steps == b.steps && a.prefetches == b.prefetches ? still + 1 : 0;
    }
}

static void managed_experts_end_to_end(void **state)
{
    char path[] = "/tmp/test-prefetch-shim-XXXXXX";
    char trace_path[] = "/tmp/test-prefetch-shim-trace-XXXXXX";
    struct wo_trace_data *td = NULL;
    uint64_t tr_prefetch = 0, tr_evict = 0, tr_step = 0;
    const char *yaml = "version: 1\ndevice_budget: 40MiB\n"
                       "rules:\n  - {match: [experts], place: managed}\n";
    CUdeviceptr p[LAYERS];
    struct wo_range rg[LAYERS];
    struct wo_prefetch_totals t;
    struct fakecuda_page_state st;
    uint64_t rng = 1, pushed, base_events;
    int fd;

    (void)state;
    fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, yaml, strlen(yaml)), (ssize_t)strlen(yaml));
    close(fd);
    /* the run is recorded: the executor's actions must reach the trace
     * (settings are read once, at the first use: before init) */
    fd = mkstemp(trace_path);
    assert_true(fd >= 0);
    close(fd);
    setenv("WOFFLOAD_TRACE", trace_path, 1);
    wo_uvm_set_driver(&drv);
    assert_int_equal(wo_uvm_init_policy(path), 0);
    unlink(path);
    assert_non_null(wo_events);
    for (int l = 0; l < LAYERS; l++) {
        char name[64];
        CUresult r = CUDA_ERROR_UNKNOWN;

        assert_int_equal(wo_uvm_alloc(NEXP * EXPERT, WO_API_CU_MEM_ALLOC, &p[l], &r), 1);
        assert_int_equal(r, CUDA_SUCCESS);
        memset((void *)(uintptr_t)p[l], 0x40 + l, NEXP * EXPERT);
        snprintf(name, sizeof(name), "model.layers.%d.mlp.experts.w13_weight", l);
        assert_int_equal(wo_api_tag((void *)(uintptr_t)p[l], NEXP * EXPERT, name), 0);
        assert_int_equal(wo_registry_find(p[l], &rg[l]), 0);
    }
    assert_int_equal(wo_api_seal(), 0);
    assert_int_equal(wo_uvm_device_budget(), 40 * MiB);
    base_events = drained();
    pushed = 0;
    /* 80 decode steps: per layer expert 0 always, one other at random */
    for (int s = 0; s < 80; s++) {
        for (int l = 0; l < LAYERS; l++) {
            for (int k = 0; k < 2; k++) {
                struct wo_event ev;
                unsigned e;

                rng = rng * 6364136223846793005ULL + 1;
                e = k == 0 ? 0 : 1 + (unsigned)((rng >> 33) % (NEXP - 1));
                memset(&ev, 0, sizeof(ev));
                ev.type = WO_EV_LAUNCH;
                ev.t_ns = (uint64_t)(s * 1000 + l * 10 + k) * 10000;
                ev.stream = 1;
                /* runtime-stub keys (bit 63, uvm/record.c): the recorder
                 * names them with dladdr, never a driver call on a made-up
                 * CUfunction */
                ev.l.func = (UINT64_C(1) << 63) | (0x1000 + (uint64_t)k);
                ev.nhits = 1;
                ev.l.hits[0].id = rg[l].id;
                ev.l.hits[0].gen = rg[l].gen;
                ev.l.hits[0].offset = e * EXPERT;
                ev.l.hits[0].hi = e * EXPERT + 1;
                push(&ev);
                pushed++;
            }
        }
    }
    wait_idle(base_events + pushed);
    wo_prefetch_totals(&t);
    assert_true(t.steps > 30);
    assert_true(t.prefetches > 0);
    assert_int_equal(t.errors, 0);
    assert_true(f_calls("cuMemPrefetchAsync_v2") > 0);
    /* from a context of its own (WOFFLOAD_PREFETCH_OWN_CONTEXT defaults to on) */
    assert_int_equal(f_calls("cuCtxCreate_v4"), 1);
    assert_int_equal(f_calls("cuCtxSetLimit"), 1);
    {
        /* per-name figures reach the stats JSON (published by the consumer
         * thread at most every 100 ms: wait for a publication that has seen
         * the prefetches) */
        char js[65536];
        const char *at = NULL;
        for (int i = 0; i < 300 && !at; i++) {
            long n = wo_api_stats(js, sizeof(js));
            assert_true(n > 0 && (size_t)n < sizeof(js));
            at = strstr(js, "\"names\":{\"model.layers.0.mlp.experts.w13_weight\":{\"hits\":");
            if (at && strstr(at, "\"prefetched\":0,"))
                at = NULL;
            if (!at)
                usleep(2000);
        }
        assert_non_null(at);
        assert_non_null(strstr(js, "\"model.layers.3.mlp.experts.w13_weight\":{\"hits\":"));
        /* the planner's per-step figures (issue 22): steps counted, moves
         * and the cost rule's prediction, mean and last step */
        {
            const char *ps = strstr(js, "\"per_step\":{\"steps\":");
            unsigned long long steps = 0;

            assert_non_null(ps);
            assert_int_equal(sscanf(ps, "\"per_step\":{\"steps\":%llu,", &steps), 1);
            assert_true(steps > 0);
            assert_non_null(strstr(ps, "\"inplace_ms\":"));
            assert_non_null(strstr(ps, "\"plan_ms\":"));
            assert_non_null(strstr(ps, "\"last\":{\"in_bytes\":"));
        }
    }
    /* expert 0 of every layer is the hot set: a GPU duplicate of a
     * read-mostly page (4 x 16 MiB = 64 MiB would not fit 40 MiB, so at least
     * two layers' expert 0 are resident) */
    {
        int resident = 0;

        for (int l = 0; l < LAYERS; l++) {
            assert_int_equal(f_managed_state((const void *)(uintptr_t)p[l], &st), 0);
            if (st.resident & 2u) {
                resident++;
                assert_true(st.read_mostly); /* a duplicate, dropped by collapse */
            }
        }
        assert_true(resident >= 2);
    }
    /* the budget holds: what was moved in less what was dropped, and the
     * driver's own count of device pages (a collapse to the preferred
     * host location drops the GPU copy, device-facts.md; the kernels of
     * this test read nothing, so nothing faults a copy in) */
    assert_true(t.prefetch_bytes - t.evict_bytes <= 40 * MiB);
    assert_true(t.evictions == 0 || t.collapses == t.evictions);
    assert_true(f_resident(0) <= 40 * MiB);
    assert_true(f_resident(0) >= t.prefetch_bytes - t.evict_bytes);
    /* the data is what the engine wrote */
    for (int l = 0; l < LAYERS; l++)
        for (uint64_t o = 0; o < NEXP * EXPERT; o += 4096)
            if (((const unsigned char *)(uintptr_t)p[l])[o] != 0x40 + l)
                fail_msg("layer %d offset %llu changed", l, (unsigned long long)o);
    for (int l = 0; l < LAYERS; l++) {
        CUresult r = CUDA_ERROR_UNKNOWN;

        assert_int_equal(wo_uvm_free(p[l], &r), 1);
    }
    wo_uvm_reset();
    /* the trace holds what the executor did, as many actions as it counted */
    unsetenv("WOFFLOAD_TRACE");
    assert_int_equal(wo_trace_load(trace_path, 0, 0, &td), 0);
    unlink(trace_path);
    for (size_t i = 0; i < td->nevents; i++) {
        const struct wo_event *ev = &td->events[i].ev;

        tr_prefetch += ev->type == WO_EV_PREFETCH;
        tr_evict += ev->type == WO_EV_EVICT;
        tr_step += ev->type == WO_EV_STEP;
        if (ev->type == WO_EV_PREFETCH) {
            assert_int_equal(ev->p.to, WO_TRACE_PLACE_DEVICE);
            assert_true(ev->p.bytes > 0);
        }
    }
    /* the budget resolved at seal, for replays given no policy */
    assert_non_null(wo_trace_data_info(td, "device_budget"));
    assert_int_equal(strtoull(wo_trace_data_info(td, "device_budget"), NULL, 10), 40 * MiB);
    wo_trace_data_free(td);
    assert_int_equal(tr_prefetch, t.prefetches);
    assert_int_equal(tr_evict, t.evictions);
    assert_int_equal(tr_step, t.steps);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(managed_experts_end_to_end, setup),
    };

    if (argc < 2) {
        fprintf(stderr, "usage: test-prefetch-shim FAKE_LIBCUDA\n");
        return 2;
    }
    fake_path = argv[1];
    wo_log_set_level(WO_LOG_WARN);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
