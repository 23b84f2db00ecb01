/* tests/test-picks-pool.c: the picked copies' buffers (uvm/picks-pool.c)
 * without a GPU: a driver of counters. A stream whose least recently used
 * buffer is too small for a tensor takes its other buffer that holds the
 * bytes, rather than growing the small one (a free and an allocation,
 * with a host wait, mid-step, and a pool past what its tensors need); an
 * empty entry is still made while the pool has room (early copies fill a
 * stream's second buffer while a launch reads its first), and with the
 * pool full it takes the stream's own buffer that holds the bytes, not
 * another stream's; and wo_pool_room says the same. Also where a
 * registration's share hands a host tensor to the streaming executor
 * (uvm/picks-geom.h, wo_picks_whole_of). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "uvm/picks-geom.h"
#include "uvm/picks-pool.h"
#include "uvm/uvm.h"

#define MiB (UINT64_C(1) << 20)

static CUdeviceptr next_addr = 0x100000000ull;
static unsigned allocs, frees, syncs;

static CUresult d_alloc(CUdeviceptr *p, size_t n)
{
    *p = next_addr;
    next_addr += n + 2 * MiB;
    allocs++;
    return CUDA_SUCCESS;
}

static CUresult d_free(CUdeviceptr p)
{
    (void)p;
    frees++;
    return CUDA_SUCCESS;
}

static CUresult d_sync(CUstream s)
{
    (void)s;
    syncs++;
    return CUDA_SUCCESS;
}

static struct wo_driver drv = {.cuMemAlloc_v2 = d_alloc,
                               .cuMemFree_v2 = d_free,
                               .cuStreamSynchronize = d_sync};
static uint64_t tick;

/* What picks.c does with a buffer it got: the span's rows at seq, used now. */
static struct wo_pool_buf *take(struct wo_pool_strm *t, int span, uint32_t seq, uint64_t need,
                                unsigned taken, bool *fresh)
{
    int64_t delta = 0;
    CUresult alloc = CUDA_SUCCESS;
    struct wo_pool_buf *b = wo_pool_buffer(&drv, t, span, seq, need, 2, taken, fresh, &delta, &alloc);

    assert_non_null(b);
    assert_int_equal(alloc, CUDA_SUCCESS);
    b->span = span;
    b->seq = seq;
    b->tick = ++tick;
    return b;
}

static uint64_t pool_bytes(void)
{
    struct wo_pool_figs f;

    wo_pool_figs(&f);
    return f.bytes;
}

/* Each test on an empty pool, the counters at 0. */
static int fresh_pool(void **state)
{
    (void)state;
    wo_pool_reset();
    allocs = frees = syncs = 0;
    return 0;
}

/* gate_up (768 "MiB", here 8) and down (4) in turn, some gate_ups read in
 * place (fit's yielded ones): the 8 MiB buffer serves the next gate_up
 * though the 4 MiB one is the least recently used; the pool stays at 12,
 * with two allocations and no free or host wait. */
static void test_fitting_buffer_before_growth(void **state)
{
    struct wo_pool_strm *t = wo_pool_stream(0x51);
    struct wo_pool_buf *g, *dn, *x;
    bool fresh;
    uint32_t seq = 0;

    (void)state;
    assert_non_null(t);
    g = take(t, 0, ++seq, 8 * MiB, 0, &fresh); /* layer 1's gate_up: entry 0 made */
    assert_true(fresh);
    dn = take(t, 1, ++seq, 4 * MiB, 0, &fresh); /* its down: entry 1 made (empty entry) */
    assert_ptr_not_equal(g, dn);
    assert_int_equal(allocs, 2);
    /* layer 2's gate_up read in place; its down: the least recently used
     * is the 8 MiB buffer, which holds it */
    x = take(t, 3, ++seq, 4 * MiB, 0, &fresh);
    assert_ptr_equal(x, g);
    /* layer 3's gate_up: the least recently used is now the 4 MiB buffer;
     * the 8 MiB one (the down's of layer 2, done) takes it, no growth */
    x = take(t, 4, ++seq, 8 * MiB, 0, &fresh);
    assert_ptr_equal(x, g);
    assert_true(fresh);
    assert_int_equal(allocs, 2);
    assert_int_equal(frees, 0);
    assert_int_equal(syncs, 0);
    assert_int_equal(pool_bytes(), 12 * MiB);
    assert_true(wo_pool_room(t, 8 * MiB, 2, 0));
    /* the 8 MiB one held by the launch (taken): the 4 MiB one grows */
    assert_false(wo_pool_room(t, 8 * MiB, 2, 1u << (unsigned)(g - t->b)));
    x = take(t, 5, ++seq, 8 * MiB, 1u << (unsigned)(g - t->b), &fresh);
    assert_ptr_equal(x, dn);
    assert_int_equal(allocs, 3);
    assert_int_equal(frees, 1);
    assert_int_equal(pool_bytes(), 16 * MiB);
    /* the same span at the same seq: that buffer, not fresh */
    x = take(t, 5, seq, 8 * MiB, 0, &fresh);
    assert_ptr_equal(x, dn);
    assert_false(fresh);
}

/* A stream's first two tensors of the same size: the second gets an entry
 * of its own (made), not the first's buffer, though that one fits: early
 * copies fill the second while a launch reads the first; no room until it
 * exists. */
static void test_empty_entry_is_made(void **state)
{
    struct wo_pool_strm *t = wo_pool_stream(0x52);
    struct wo_pool_buf *a, *b;
    bool fresh;

    (void)state;
    assert_non_null(t);
    assert_false(wo_pool_room(t, 4 * MiB, 2, 0));
    a = take(t, 10, 1, 4 * MiB, 0, &fresh);
    assert_false(wo_pool_room(t, 4 * MiB, 2, 1u << (unsigned)(a - t->b)));
    b = take(t, 11, 2, 4 * MiB, 0, &fresh);
    assert_ptr_not_equal(a, b);
    assert_int_equal(allocs, 2);
    assert_true(wo_pool_room(t, 4 * MiB, 2, 0));
}

/* The pool full (another stream holds the rest of it): a stream's empty
 * entry is not made, its own buffer that holds the bytes serves, no lend
 * (this driver makes no events: a lend would fail) and no allocation. */
static void test_full_pool_takes_own_buffer(void **state)
{
    struct wo_pool_strm *t = wo_pool_stream(0x53), *u = wo_pool_stream(0x54);
    struct wo_pool_buf *a, *x;
    bool fresh;

    (void)state;
    assert_non_null(t);
    assert_non_null(u);
    a = take(t, 20, 1, 8 * MiB, 0, &fresh);
    (void)take(u, 21, 2, 8 * MiB, 0, &fresh);
    assert_int_equal(pool_bytes(), 16 * MiB); /* 2 x the largest: full */
    x = take(t, 22, 3, 4 * MiB, 0, &fresh);
    assert_ptr_equal(x, a);
    assert_true(fresh);
    assert_int_equal(allocs, 2);
    assert_int_equal(pool_bytes(), 16 * MiB);
}

/* uvm/picks-geom.h: when a registration's share hands a host tensor to
 * the streaming executor (WOFFLOAD_PICKS_WHOLE at 92): in from 92, out
 * below 4/5 of it (73.6), and never at 0; with the share of the Mixtral
 * shape's b8 (16 ids of 8: 88%) and b32 (64: 100%), the 128-expert
 * shape's b32 (256 ids: 86%) */
static void test_whole_line(void **state)
{
    (void)state;
    assert_false(wo_picks_whole_of(false, 91, 92));
    assert_true(wo_picks_whole_of(false, 92, 92));
    assert_true(wo_picks_whole_of(true, 74, 92));
    assert_false(wo_picks_whole_of(true, 73, 92));
    assert_false(wo_picks_whole_of(true, 100, 0));
    assert_int_equal(wo_picks_share_pct(16, 0, 8), 88);
    assert_int_equal(wo_picks_share_pct(64, 0, 8), 99);
    assert_true(wo_picks_whole_of(false, wo_picks_share_pct(64, 0, 8), 92));
    assert_false(wo_picks_whole_of(false, wo_picks_share_pct(16, 0, 8), 92));
    assert_int_equal(wo_picks_share_pct(256, 0, 128), 86);
    assert_false(wo_picks_whole_of(false, wo_picks_share_pct(256, 0, 128), 92));
}

/* The hot set's split (uvm/picks-geom.h), shared by make_hot and the gguf
 * tool: a 128-expert map takes 1 KiB, then whole rows, at most every
 * expert; nothing below the map or without rows */
static void test_hot_cap(void **state)
{
    (void)state;
    assert_int_equal(wo_hot_map_bytes(128), 1024);
    assert_int_equal(wo_hot_map_bytes(16), 256);
    assert_int_equal(wo_hot_cap(1024 + 10 * MiB + 1, 128, MiB), 10);
    assert_int_equal(wo_hot_cap(1024 + 200 * MiB, 128, MiB), 128);
    assert_int_equal(wo_hot_cap(1000, 128, MiB), 0);
    assert_int_equal(wo_hot_cap(64 * MiB, 128, 0), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_fitting_buffer_before_growth, fresh_pool),
        cmocka_unit_test_setup(test_empty_entry_is_made, fresh_pool),
        cmocka_unit_test_setup(test_full_pool_takes_own_buffer, fresh_pool),
        cmocka_unit_test(test_whole_line),
        cmocka_unit_test(test_hot_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
