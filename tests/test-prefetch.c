/* tests/test-prefetch.c: the prefetch executor (uvm/prefetch.c) against a
 * driver table that records calls: actions become calls on a private
 * stream, read-mostly duplication and collapse for read-only ranges,
 * copy-back for written ones, only managed segments move, nothing is
 * enqueued while a global capture is under way, a freed range's held
 * actions are dropped, every call comes from the prefetcher's own context
 * when it has one. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "uvm/prefetch.h"

#define EXP (24 * WO_MiB)
#define BASE UINT64_C(0x7f0000000000)

struct call {
    char what[16];
    uint64_t p, n;
    int loc_type;
    int advice;
    CUstream s;
    CUcontext ctx; /* current when the call was made */
};

static struct call calls[20000];
static size_t ncalls;
static int streams_made;
static CUresult fail_prefetch;
static CUcontext cur_ctx; /* the calling thread's current context, as the table sees it */

static void log_call(const char *w, uint64_t p, uint64_t n, int lt, int adv, CUstream s)
{
    if (ncalls < WO_ARRAY_SIZE(calls)) {
        struct call *c = &calls[ncalls++];

        snprintf(c->what, sizeof(c->what), "%s", w);
        c->p = p;
        c->n = n;
        c->loc_type = lt;
        c->advice = adv;
        c->s = s;
        c->ctx = cur_ctx;
    }
}

static CUresult f_prefetch(CUdeviceptr p, size_t n, CUmemLocation loc, unsigned flags, CUstream s)
{
    (void)flags;
    log_call("prefetch", p, n, loc.type, 0, s);
    return fail_prefetch;
}

static CUresult f_advise(CUdeviceptr p, size_t n, CUmem_advise a, CUmemLocation loc)
{
    log_call("advise", p, n, loc.type, a, NULL);
    return CUDA_SUCCESS;
}

static CUresult f_stream_create(CUstream *s, unsigned flags)
{
    assert_int_equal(flags, CU_STREAM_NON_BLOCKING);
    streams_made++;
    *s = (CUstream)(uintptr_t)0x5eed;
    return CUDA_SUCCESS;
}

static CUresult f_stream_sync(CUstream s)
{
    (void)s;
    return CUDA_SUCCESS;
}

static CUresult f_stream_destroy(CUstream s)
{
    (void)s;
    return CUDA_SUCCESS;
}

static const struct wo_driver drv = {
    .cuMemPrefetchAsync_v2 = f_prefetch,
    .cuMemAdvise_v2 = f_advise,
    .cuStreamCreate = f_stream_create,
    .cuStreamSynchronize = f_stream_sync,
    .cuStreamDestroy_v2 = f_stream_destroy,
};

#define ENGINE_CTX ((CUcontext)(uintptr_t)0xe1)
#define OWN_CTX ((CUcontext)(uintptr_t)0x0c)
static int ctx_made, ctx_destroyed, stack_zeroed;
static CUresult fail_ctx;

static CUresult f_device_get(CUdevice *d, int ordinal)
{
    *d = ordinal;
    return CUDA_SUCCESS;
}

static CUresult f_ctx_set(CUcontext c)
{
    cur_ctx = c;
    return CUDA_SUCCESS;
}

static CUresult f_ctx_create(CUcontext *c, CUctxCreateParams *p, unsigned flags, CUdevice d)
{
    assert_null(p);
    assert_int_equal(flags, 0);
    assert_int_equal(d, 0);
    if (fail_ctx)
        return fail_ctx;
    ctx_made++;
    *c = cur_ctx = OWN_CTX; /* a new context is current on the caller */
    return CUDA_SUCCESS;
}

static CUresult f_ctx_destroy(CUcontext c)
{
    assert_ptr_equal(c, OWN_CTX);
    ctx_destroyed++;
    return CUDA_SUCCESS;
}

static CUresult f_ctx_set_limit(CUlimit l, size_t v)
{
    /* the prefetcher's own context gives back its stack reservation */
    assert_ptr_equal(cur_ctx, OWN_CTX);
    stack_zeroed += l == CU_LIMIT_STACK_SIZE && v == 0;
    return CUDA_SUCCESS;
}

static CUresult f_ctx_create_v2(CUcontext *c, unsigned flags, CUdevice d)
{
    return f_ctx_create(c, NULL, flags, d);
}


static int setup(void **state)
{
    (void)state;
    ncalls = 0;
    cur_ctx = NULL;
    ctx_made = ctx_destroyed = stack_zeroed = 0;
    fail_ctx = CUDA_SUCCESS;
    streams_made = 0;
    fail_prefetch = CUDA_SUCCESS;
    wo_captures_live = 0;
    return 0;
}

static struct wo_prefetcher *make(uint64_t budget)
{
    struct wo_plan_cfg cfg;
    struct wo_prefetcher *pf = NULL;

    wo_plan_cfg_default(&cfg);
    cfg.budget = budget;
    assert_int_equal(wo_prefetcher_new(&drv, &cfg, 0, NULL, &pf), 0);
    return pf;
}

static uint64_t t_now;

static void launch(struct wo_prefetcher *pf, uint32_t id, uint64_t off)
{
    struct wo_event ev;

    memset(&ev, 0, sizeof(ev));
    ev.type = WO_EV_LAUNCH;
    ev.t_ns = t_now += 10000;
    ev.l.func = 0x100 + id;
    ev.nhits = 1;
    ev.l.hits[0].id = id;
    ev.l.hits[0].gen = 1;
    ev.l.hits[0].offset = off;
    ev.l.hits[0].hi = off + 1;
    wo_prefetcher_event(pf, &ev);
}

static size_t count(const char *what, int advice)
{
    size_t n = 0;

    for (size_t i = 0; i < ncalls; i++)
        if (strcmp(calls[i].what, what) == 0 && (advice < 0 || calls[i].advice == advice))
            n++;
    return n;
}

static void test_new_invalid(void **state)
{
    struct wo_driver none = {0};
    struct wo_plan_cfg cfg;
    struct wo_prefetcher *pf = NULL;

    (void)state;
    wo_plan_cfg_default(&cfg);
    assert_int_equal(wo_prefetcher_new(&none, &cfg, 0, NULL, &pf), -EINVAL);
    assert_int_equal(wo_prefetcher_new(NULL, &cfg, 0, NULL, &pf), -EINVAL);
    pf = make(WO_GiB);
    assert_int_equal(wo_prefetcher_add_segment(pf, 1, 1, BASE, 100, 50, 60, 0, true), -EINVAL);
    assert_int_equal(wo_prefetcher_add_segment(pf, 1, 1, BASE, 100, 0, 0, 0, true), -EINVAL);
    wo_prefetcher_free(pf);
    wo_prefetcher_free(NULL);
}

/* A read-only range: read-mostly first, then the prefetch on our stream. */
static void test_prefetch_read_mostly(void **state)
{
    struct wo_prefetcher *pf = make(WO_GiB);
    struct wo_prefetch_totals t;

    (void)state;
    assert_int_equal(wo_prefetcher_add_segment(pf, 3, 1, BASE, 64 * WO_MiB, 0, 64 * WO_MiB, 0, true), 0);
    launch(pf, 3, 0);
    assert_int_equal(streams_made, 1);
    assert_int_equal(count("advise", CU_MEM_ADVISE_SET_READ_MOSTLY), 1);
    assert_int_equal(count("prefetch", -1), 1);
    for (size_t i = 0; i < ncalls; i++) {
        if (strcmp(calls[i].what, "prefetch") == 0) {
            assert_int_equal(calls[i].p, BASE);
            assert_int_equal(calls[i].n, 64 * WO_MiB);
            assert_int_equal(calls[i].loc_type, CU_MEM_LOCATION_TYPE_DEVICE);
            assert_ptr_equal(calls[i].s, (CUstream)(uintptr_t)0x5eed);
        }
    }
    /* advice comes before the prefetch that makes the duplicate */
    assert_string_equal(calls[0].what, "advise");
    wo_prefetcher_totals(pf, &t);
    assert_int_equal(t.prefetches, 1);
    assert_int_equal(t.prefetch_bytes, 64 * WO_MiB);
    assert_int_equal(wo_prefetcher_name(pf, 3, 1, "model.w"), 0);
    assert_int_equal(wo_prefetcher_name(pf, 3, 2, "model.w"), -ENOENT);
    wo_prefetcher_log_ranges(pf, 5);
    wo_prefetcher_free(pf);
}

/* Only the managed segments of an allocation move. */
static void test_segments_only(void **state)
{
    struct wo_prefetcher *pf = make(WO_GiB);
    uint64_t moved = 0;

    (void)state;
    /* a 64 MiB allocation with managed tags at [0,16) and [32,48) MiB */
    assert_int_equal(wo_prefetcher_add_segment(pf, 4, 1, BASE, 64 * WO_MiB, 0, 16 * WO_MiB, 0, true), 0);
    assert_int_equal(wo_prefetcher_add_segment(pf, 4, 1, BASE, 64 * WO_MiB, 32 * WO_MiB, 16 * WO_MiB, 0, true), 0);
    assert_int_equal(wo_prefetcher_add_segment(pf, 4, 1, BASE, 64 * WO_MiB, 32 * WO_MiB, 16 * WO_MiB, 0, true), 0);
    launch(pf, 4, 0);
    for (size_t i = 0; i < ncalls; i++) {
        if (strcmp(calls[i].what, "prefetch") == 0) {
            bool in = (calls[i].p >= BASE && calls[i].p + calls[i].n <= BASE + 16 * WO_MiB) ||
                      (calls[i].p >= BASE + 32 * WO_MiB && calls[i].p + calls[i].n <= BASE + 48 * WO_MiB);
            assert_true(in);
            moved += calls[i].n;
        }
    }
    assert_int_equal(moved, 32 * WO_MiB);
    wo_prefetcher_free(pf);
}

/* Budget pressure evicts: collapse (unset read-mostly) for weights,
 * copy-back to the host after the engine wrote the range. */
static void test_evictions(void **state)
{
    struct wo_prefetcher *pf = make(2 * EXP);
    struct wo_event ev;
    struct wo_prefetch_totals t;
    uint64_t x = 9;

    (void)state;
    assert_int_equal(wo_prefetcher_add_segment(pf, 5, 1, BASE, 8 * EXP, 0, 8 * EXP, 0, true), 0);
    /* learn the slice and a step: experts 1..7 cycled, 1 and 2 hot */
    for (unsigned s = 0; s < 80; s++) {
        x = x * 6364136223846793005ULL + 1;
        launch(pf, 5, 1 * EXP);
        launch(pf, 5, ((x >> 33) % 2 ? 2 : 3 + (x >> 40) % 5) * EXP);
    }
    /* the hot set moves to experts 5 and 6: 1 and 2 must make room */
    for (unsigned s = 0; s < 200; s++) {
        x = x * 6364136223846793005ULL + 1;
        launch(pf, 5, 5 * EXP);
        launch(pf, 5, ((x >> 33) % 2 ? 6 : 1 + (x >> 40) % 4) * EXP);
    }
    wo_prefetcher_totals(pf, &t);
    assert_true(t.prefetches > 0);
    /* read-mostly only while a piece has its GPU copy: set before each
     * prefetch, unset by each eviction, which maps the piece for the GPU
     * again (a miss on a plain mapped piece is read in place; on a
     * read-mostly one it would fault a copy in, on an unmapped one it would
     * fault mappings in) */
    assert_true(t.evictions > 0);
    assert_int_equal(t.copy_backs, 0);
    assert_int_equal(count("advise", CU_MEM_ADVISE_SET_READ_MOSTLY), t.prefetches);
    assert_int_equal(count("advise", CU_MEM_ADVISE_UNSET_READ_MOSTLY), t.evictions);
    assert_int_equal(count("advise", CU_MEM_ADVISE_SET_ACCESSED_BY), t.evictions);
    /* the engine copies into it: read-mostly goes, evictions copy back */
    memset(&ev, 0, sizeof(ev));
    ev.type = WO_EV_COPY;
    ev.c.dst = BASE + 100;
    ev.c.bytes = 4096;
    ev.c.kind = WO_COPY_H2D;
    wo_prefetcher_event(pf, &ev);
    assert_int_equal(wo_plan_range_how(wo_prefetcher_plan(pf), 5, 1), WO_PLAN_COPY_BACK);
    /* the range goes plain and stays mapped for the GPU (one segment) */
    assert_int_equal(count("advise", CU_MEM_ADVISE_UNSET_READ_MOSTLY), t.evictions + 1);
    assert_int_equal(count("advise", CU_MEM_ADVISE_SET_ACCESSED_BY), t.evictions + 1);
    for (unsigned s = 0; s < 200; s++) {
        x = x * 6364136223846793005ULL + 1;
        launch(pf, 5, 1 * EXP);
        launch(pf, 5, (3 + (x >> 40) % 5) * EXP);
    }
    wo_prefetcher_totals(pf, &t);
    assert_true(t.copy_backs > 0);
    {
        bool host_prefetch = false;

        for (size_t i = 0; i < ncalls; i++)
            host_prefetch |= strcmp(calls[i].what, "prefetch") == 0 &&
                             calls[i].loc_type == CU_MEM_LOCATION_TYPE_HOST;
        assert_true(host_prefetch);
    }
    assert_true(wo_plan_resident_bytes(wo_prefetcher_plan(pf)) <= 2 * EXP);
    wo_prefetcher_free(pf);
}

/* While a global capture is under way nothing reaches the driver; the
 * actions go out after it; a free drops what was held for that range. */
static void test_capture_holds(void **state)
{
    struct wo_prefetcher *pf = make(WO_GiB);
    struct wo_prefetch_totals t;
    struct wo_event ev;

    (void)state;
    assert_int_equal(wo_prefetcher_add_segment(pf, 6, 1, BASE, 32 * WO_MiB, 0, 32 * WO_MiB, 0, true), 0);
    assert_int_equal(wo_prefetcher_add_segment(pf, 7, 1, BASE + WO_GiB, 32 * WO_MiB, 0, 32 * WO_MiB, 0, true), 0);
    wo_captures_live = 1;
    launch(pf, 6, 0);
    launch(pf, 7, 0);
    assert_int_equal(ncalls, 0);
    assert_int_equal(streams_made, 0);
    wo_prefetcher_tick(pf);
    assert_int_equal(ncalls, 0);
    wo_prefetcher_totals(pf, &t);
    assert_true(t.deferred >= 2);
    /* range 7 is freed while its prefetch waits */
    memset(&ev, 0, sizeof(ev));
    ev.type = WO_EV_FREE;
    ev.a.base = BASE + WO_GiB;
    wo_prefetcher_event(pf, &ev);
    wo_captures_live = 0;
    wo_prefetcher_tick(pf);
    assert_int_equal(count("prefetch", -1), 1);
    for (size_t i = 0; i < ncalls; i++)
        assert_true(calls[i].p < BASE + WO_GiB);
    wo_prefetcher_free(pf);
}

/* A failing driver call drops the action and counts it. */
static void test_driver_error(void **state)
{
    struct wo_prefetcher *pf = make(WO_GiB);
    struct wo_prefetch_totals t;

    (void)state;
    fail_prefetch = CUDA_ERROR_INVALID_VALUE;
    assert_int_equal(wo_prefetcher_add_segment(pf, 8, 1, BASE, 32 * WO_MiB, 0, 32 * WO_MiB, 0, true), 0);
    launch(pf, 8, 0);
    wo_prefetcher_totals(pf, &t);
    assert_int_equal(t.prefetches, 0);
    assert_true(t.errors >= 1);
    wo_prefetcher_free(pf);
}

/* With a context of its own, the stream and every call come from it (a
 * prefetch call from the engine's context holds up the engine's launches);
 * a driver without cuCtxCreate_v4 (before 12.5) makes it with _v2; if it
 * cannot make one, the calls come from the engine's; off, it never tries. */
static void test_own_context(void **state)
{
    enum { OWN, OWN_V2, CREATE_FAILS, OFF };

    for (int mode = OWN; mode <= OFF; mode++) {
        struct wo_driver d = drv; /* plus what a context of its own needs */
        bool own = mode == OWN || mode == OWN_V2;
        struct wo_plan_cfg cfg;
        struct wo_prefetcher *pf = NULL;
        struct wo_prefetch_totals t;

        setup(state);
        fail_ctx = mode == CREATE_FAILS ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
        d.cuDeviceGet = f_device_get;
        d.cuCtxSetCurrent = f_ctx_set;
        d.cuCtxDestroy_v2 = f_ctx_destroy;
        d.cuCtxSetLimit = f_ctx_set_limit;
        if (mode == OWN_V2)
            d.cuCtxCreate_v2 = f_ctx_create_v2;
        else
            d.cuCtxCreate_v4 = f_ctx_create;
        wo_plan_cfg_default(&cfg);
        cfg.budget = WO_GiB;
        assert_int_equal(wo_prefetcher_new(&d, &cfg, 0, ENGINE_CTX, &pf), 0);
        wo_prefetcher_own_context(pf, mode != OFF);
        assert_int_equal(wo_prefetcher_add_segment(pf, 8, 1, BASE, 32 * WO_MiB, 0, 32 * WO_MiB, 0, true), 0);
        launch(pf, 8, 0);
        wo_prefetcher_totals(pf, &t);
        assert_true(t.prefetches >= 1);
        assert_int_equal(t.errors, 0);
        assert_int_equal(streams_made, 1);
        for (size_t i = 0; i < ncalls; i++)
            assert_ptr_equal(calls[i].ctx, own ? OWN_CTX : ENGINE_CTX);
        wo_prefetcher_free(pf);
        assert_int_equal(ctx_made, own);
        assert_int_equal(ctx_destroyed, own);
        assert_int_equal(stack_zeroed, own);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_new_invalid, setup),
        cmocka_unit_test_setup(test_prefetch_read_mostly, setup),
        cmocka_unit_test_setup(test_segments_only, setup),
        cmocka_unit_test_setup(test_evictions, setup),
        cmocka_unit_test_setup(test_capture_holds, setup),
        cmocka_unit_test_setup(test_driver_error, setup),
        cmocka_unit_test_setup(test_own_context, setup),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
