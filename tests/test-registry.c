/* tests/test-registry.c: the range registry (core/registry.c): adding,
 * overlap and adjacency, removal, lookups at range edges, ranges over many
 * granules and many ranges in one granule, id reuse with generations, a large
 * population, and lock-free readers racing a writer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/registry.h"

#define G2M (2 * WO_MiB)

static int setup(void **state)
{
    wo_registry_init();
    return 0;
}

static int teardown(void **state)
{
    wo_registry_reset();
    return 0;
}

/* Lookup in its own read section. 1 and *h, or 0. */
static int look(uint64_t addr, struct wo_hit *h)
{
    int r;
    wo_registry_read_begin();
    r = wo_registry_lookup(addr, h);
    wo_registry_read_end();
    return r;
}

static void expect_hit(uint64_t addr, uint32_t id, uint64_t offset)
{
    struct wo_hit h = {0};
    assert_int_equal(look(addr, &h), 1);
    assert_int_equal(h.id, id);
    assert_int_equal(h.offset, offset);
}

static void expect_miss(uint64_t addr)
{
    struct wo_hit h = {0};
    assert_int_equal(look(addr, &h), 0);
}

static void add_returns_range_and_lookup_hits_edges(void **state)
{
    struct wo_range r, g;
    uint64_t base = UINT64_C(0x7f0000100000);
    int owner;

    assert_int_equal(wo_registry_add(base, 4096, WO_RANGE_HOST, 2, &owner, &r), 0);
    assert_int_equal(r.base, base);
    assert_int_equal(r.size, 4096);
    assert_int_equal(r.flags, WO_RANGE_HOST);
    assert_int_equal(r.device, 2);
    assert_ptr_equal(r.owner, &owner);
    assert_true(r.gen != 0);

    expect_hit(base, r.id, 0);
    expect_hit(base + 4095, r.id, 4095);
    expect_miss(base + 4096);
    expect_miss(base - 1);

    assert_int_equal(wo_registry_get(r.id, &g), 0);
    assert_memory_equal(&g, &r, sizeof(r));
    assert_int_equal(wo_registry_find(base + 100, &g), 0);
    assert_int_equal(g.id, r.id);
    assert_int_equal(wo_registry_find(base + 4096, &g), -ENOENT);
    assert_int_equal(wo_registry_count(), 1);
    assert_int_equal(wo_registry_bytes(), 4096);
}

static void add_rejects_bad_sizes(void **state)
{
    assert_int_equal(wo_registry_add(0x10000, 0, 0, 0, NULL, NULL), -EINVAL);
    assert_int_equal(wo_registry_add(UINT64_MAX - 10, 100, 0, 0, NULL, NULL), -EINVAL);
    /* beyond 57-bit user address space */
    assert_int_equal(wo_registry_add(UINT64_C(1) << 57, 4096, 0, 0, NULL, NULL), -EINVAL);
    assert_int_equal(wo_registry_count(), 0);
}

static void overlap_is_rejected_and_adjacency_is_not(void **state)
{
    uint64_t base = UINT64_C(0x10000000);
    struct wo_range a, b, c;

    assert_int_equal(wo_registry_add(base, 0x3000, 0, 0, NULL, &a), 0);
    /* overlaps at either end, inside, around */
    assert_int_equal(wo_registry_add(base - 0x1000, 0x1001, 0, 0, NULL, NULL), -EEXIST);
    assert_int_equal(wo_registry_add(base + 0x2fff, 0x1000, 0, 0, NULL, NULL), -EEXIST);
    assert_int_equal(wo_registry_add(base + 0x1000, 0x10, 0, 0, NULL, NULL), -EEXIST);
    assert_int_equal(wo_registry_add(base - 0x1000, 0x5000, 0, 0, NULL, NULL), -EEXIST);
    assert_int_equal(wo_registry_add(base - 10 * G2M, 20 * G2M, 0, 0, NULL, NULL), -EEXIST);
    assert_int_equal(wo_registry_add(base, 0x3000, 0, 0, NULL, NULL), -EEXIST);
    /* adjacent on both sides */
    assert_int_equal(wo_registry_add(base - 0x1000, 0x1000, 0, 0, NULL, &b), 0);
    assert_int_equal(wo_registry_add(base + 0x3000, 0x1000, 0, 0, NULL, &c), 0);
    assert_int_equal(wo_registry_count(), 3);

    expect_hit(base - 1, b.id, 0xfff);
    expect_hit(base, a.id, 0);
    expect_hit(base + 0x2fff, a.id, 0x2fff);
    expect_hit(base + 0x3000, c.id, 0);
    expect_miss(base + 0x4000);
    expect_miss(base - 0x1001);
}

static void remove_frees_address_and_reuses_id_with_new_gen(void **state)
{
    uint64_t base = UINT64_C(0x20000000);
    struct wo_range a, rm, b;

    assert_int_equal(wo_registry_add(base, 8192, 0, 0, NULL, &a), 0);
    assert_int_equal(wo_registry_remove(base + 1, NULL), -ENOENT); /* not a base */
    assert_int_equal(wo_registry_remove(base, &rm), 0);
    assert_int_equal(rm.id, a.id);
    assert_int_equal(rm.seq, a.seq);
    assert_int_equal(wo_registry_remove(base, NULL), -ENOENT);
    expect_miss(base);
    assert_int_equal(wo_registry_get(a.id, NULL), -ENOENT);
    assert_int_equal(wo_registry_set_flags(a.id, 1), -ENOENT);
    assert_int_equal(wo_registry_count(), 0);
    assert_int_equal(wo_registry_bytes(), 0);

    assert_int_equal(wo_registry_add(base + 4096, 8192, 0, 0, NULL, &b), 0);
    assert_int_equal(b.id, a.id);
    assert_int_not_equal(b.gen, a.gen);
    assert_true(b.seq > a.seq);
    {
        struct wo_hit h;
        assert_int_equal(look(base + 4096, &h), 1);
        assert_int_equal(h.gen, b.gen);
    }
    assert_int_equal(wo_registry_id_limit(), 1);
}

static void set_flags_updates_live_range(void **state)
{
    struct wo_range a, g;
    assert_int_equal(wo_registry_add(0x40000000, 4096, WO_RANGE_PLACEABLE, 0, NULL, &a), 0);
    assert_int_equal(wo_registry_set_flags(a.id, WO_RANGE_PLACEABLE | WO_RANGE_MANAGED), 0);
    assert_int_equal(wo_registry_get(a.id, &g), 0);
    assert_int_equal(g.flags, WO_RANGE_PLACEABLE | WO_RANGE_MANAGED);
    assert_int_equal(wo_registry_get(12345, NULL), -ENOENT);
}

/* A watched range is reported so by every lookup inside it, also through a
 * granule it shares with an unwatched neighbour; the mark goes with the range
 * (a reused id comes back unwatched). */
static void watch_marks_range_until_removed(void **state)
{
    uint64_t base = UINT64_C(0x50000000);
    struct wo_range a, b, c;
    struct wo_hit h;

    assert_int_equal(wo_registry_add(base, 4096, 0, 0, NULL, &a), 0);
    assert_int_equal(wo_registry_add(base + 4096, 3 << 20, 0, 0, NULL, &b), 0);
    assert_int_equal(look(base, &h), 1);
    assert_false(h.watched);
    assert_int_equal(wo_registry_watch(b.id, b.gen + 1), -ENOENT); /* not that range */
    assert_int_equal(wo_registry_watch(12345, 1), -ENOENT);
    assert_int_equal(wo_registry_watch(b.id, b.gen), 0);
    assert_int_equal(look(base + 4096, &h), 1);
    assert_true(h.watched);
    assert_int_equal(look(base + 4096 + (3 << 20) - 1, &h), 1);
    assert_true(h.watched);
    assert_int_equal(look(base + 100, &h), 1); /* the neighbour, same granule */
    assert_false(h.watched);
    assert_int_equal(wo_registry_remove(base + 4096, NULL), 0);
    assert_int_equal(wo_registry_add(base + 8192, 4096, 0, 0, NULL, &c), 0);
    assert_int_equal(c.id, b.id);
    assert_int_equal(look(base + 8192, &h), 1);
    assert_false(h.watched);
    assert_int_equal(wo_registry_watch(b.id, b.gen), -ENOENT); /* gone */
}

static void range_spanning_many_granules(void **state)
{
    /* unaligned both ends, 1000 granules, and across a 512 GiB leaf boundary */
    uint64_t base = (UINT64_C(512) << 30) - 300 * G2M + 12345;
    uint64_t size = 1000 * G2M + 777;
    struct wo_range a, n1, n2;

    assert_int_equal(wo_registry_add(base, size, 0, 0, NULL, &a), 0);
    for (uint64_t off = 0; off < size; off += G2M / 3)
        expect_hit(base + off, a.id, off);
    expect_hit(base + size - 1, a.id, size - 1);
    expect_miss(base + size);
    expect_miss(base - 1);
    /* neighbours sharing its first and last granules */
    assert_int_equal(wo_registry_add(base - 100, 100, 0, 0, NULL, &n1), 0);
    assert_int_equal(wo_registry_add(base + size, 100, 0, 0, NULL, &n2), 0);
    expect_hit(base - 1, n1.id, 99);
    expect_hit(base, a.id, 0);
    expect_hit(base + size - 1, a.id, size - 1);
    expect_hit(base + size, n2.id, 0);
    assert_int_equal(wo_registry_remove(base, NULL), 0);
    for (uint64_t off = 0; off < size; off += G2M / 3)
        expect_miss(base + off);
    expect_hit(base - 1, n1.id, 99);
    expect_hit(base + size, n2.id, 0);
    /* the space can be taken again */
    assert_int_equal(wo_registry_add(base, size, 0, 0, NULL, &a), 0);
    expect_hit(base + size / 2, a.id, size / 2);
}

static void many_small_ranges_in_one_granule(void **state)
{
    uint64_t base = UINT64_C(0x55550000000);
    enum { N = 512, SZ = 4096 };
    uint32_t ids[N];

    /* added in a shuffled order so each insert lands mid-array */
    for (uint32_t k = 0; k < N; k++) {
        uint32_t i = (k * 197) % N;
        struct wo_range r;
        /* every other page: gaps between ranges */
        assert_int_equal(wo_registry_add(base + (uint64_t)i * 2 * SZ, SZ, 0, 0, NULL, &r), 0);
        ids[i] = r.id;
    }
    for (uint32_t i = 0; i < N; i++) {
        uint64_t b = base + (uint64_t)i * 2 * SZ;
        expect_hit(b, ids[i], 0);
        expect_hit(b + SZ - 1, ids[i], SZ - 1);
        expect_miss(b + SZ);
        expect_miss(b + 2 * SZ - 1);
    }
    /* remove the even ones; odd ones stay exact */
    for (uint32_t i = 0; i < N; i += 2)
        assert_int_equal(wo_registry_remove(base + (uint64_t)i * 2 * SZ, NULL), 0);
    for (uint32_t i = 0; i < N; i++) {
        uint64_t b = base + (uint64_t)i * 2 * SZ;
        if (i % 2)
            expect_hit(b + 5, ids[i], 5);
        else
            expect_miss(b + 5);
    }
    assert_int_equal(wo_registry_count(), N / 2);
}

static void high_and_low_addresses(void **state)
{
    struct wo_range lo, hi47, hi56;
    uint64_t top57 = (UINT64_C(1) << 57) - 4096;

    assert_int_equal(wo_registry_add(0x1000, 4096, 0, 0, NULL, &lo), 0);
    assert_int_equal(wo_registry_add((UINT64_C(1) << 47) - G2M, G2M, 0, 0, NULL, &hi47), 0);
    assert_int_equal(wo_registry_add(top57, 4096, 0, 0, NULL, &hi56), 0);
    expect_hit(0x1000, lo.id, 0);
    expect_miss(0);
    expect_hit((UINT64_C(1) << 47) - 1, hi47.id, G2M - 1);
    expect_miss(UINT64_C(1) << 47);
    expect_hit(top57 + 4095, hi56.id, 4095);
    expect_miss(UINT64_C(1) << 57);
    expect_miss(UINT64_MAX);
    expect_miss(UINT64_C(0xffff800000001000)); /* kernel-half address */
}

static void read_sections_nest(void **state)
{
    struct wo_range a;
    struct wo_hit h;
    assert_int_equal(wo_registry_add(0x30000000, 64, 0, 0, NULL, &a), 0);
    wo_registry_read_begin();
    wo_registry_read_begin();
    assert_int_equal(wo_registry_lookup(0x30000010, &h), 1);
    wo_registry_read_end();
    /* still inside the outer section */
    assert_int_equal(wo_registry_lookup(0x30000020, NULL), 1);
    wo_registry_read_end();
}

static int count_cb(const struct wo_range *r, void *ud)
{
    uint64_t *sum = ud;
    *sum += r->size;
    return 0;
}

static int stop_cb(const struct wo_range *r, void *ud)
{
    int *n = ud;
    return ++*n == 3 ? 42 : 0;
}

static void foreach_visits_live_ranges_and_stops(void **state)
{
    uint64_t sum = 0;
    int n = 0;
    for (int i = 0; i < 10; i++)
        assert_int_equal(wo_registry_add(0x50000000 + (uint64_t)i * 0x10000, 100 + i, 0, 0, NULL, NULL), 0);
    assert_int_equal(wo_registry_remove(0x50000000, NULL), 0);
    assert_int_equal(wo_registry_foreach(count_cb, &sum), 0);
    assert_int_equal(sum, wo_registry_bytes());
    assert_int_equal(sum, 9 * 100 + 45 - 0);
    assert_int_equal(wo_registry_foreach(stop_cb, &n), 42);
    assert_int_equal(n, 3);
}

/* xorshift: deterministic and cheap */
static uint64_t rnd(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void hundred_thousand_ranges(void **state)
{
    enum { N = 100000 };
    uint64_t base = UINT64_C(0x7e0000000000);
    uint32_t *ids = malloc(N * sizeof(*ids));
    uint64_t seed = 88172645463325252ull;

    assert_non_null(ids);
    /* sizes from 256 B to 8 MiB, packed with gaps: mixes granule sharing and spanning */
    uint64_t *bases = malloc(N * sizeof(*bases)), *sizes = malloc(N * sizeof(*sizes));
    assert_non_null(bases);
    assert_non_null(sizes);
    uint64_t at = base;
    for (int i = 0; i < N; i++) {
        uint64_t r = rnd(&seed);
        sizes[i] = (r % 16 == 0) ? (r >> 8) % (8 * WO_MiB) + 1 : (r >> 8) % 65536 + 256;
        bases[i] = at;
        at += sizes[i] + ((r >> 40) % 4) * 4096;
    }
    for (int i = 0; i < N; i++) {
        struct wo_range r;
        assert_int_equal(wo_registry_add(bases[i], sizes[i], 0, 0, NULL, &r), 0);
        ids[i] = r.id;
    }
    assert_int_equal(wo_registry_count(), N);
    wo_registry_read_begin();
    for (int i = 0; i < N; i++) {
        struct wo_hit h;
        uint64_t off = rnd(&seed) % sizes[i];
        assert_int_equal(wo_registry_lookup(bases[i] + off, &h), 1);
        assert_int_equal(h.id, ids[i]);
        assert_int_equal(h.offset, off);
        assert_int_equal(wo_registry_lookup(bases[i] + sizes[i] - 1, &h), 1);
        assert_int_equal(h.id, ids[i]);
    }
    wo_registry_read_end();
    /* remove odd ranges, check all, remove the rest */
    for (int i = 1; i < N; i += 2)
        assert_int_equal(wo_registry_remove(bases[i], NULL), 0);
    wo_registry_read_begin();
    for (int i = 0; i < N; i++) {
        struct wo_hit h;
        int hit = wo_registry_lookup(bases[i], &h);
        assert_int_equal(hit, i % 2 == 0);
        if (hit)
            assert_int_equal(h.id, ids[i]);
    }
    wo_registry_read_end();
    for (int i = 0; i < N; i += 2)
        assert_int_equal(wo_registry_remove(bases[i], NULL), 0);
    assert_int_equal(wo_registry_count(), 0);
    assert_int_equal(wo_registry_bytes(), 0);
    for (int i = 0; i < N; i += 97)
        expect_miss(bases[i]);
    free(ids);
    free(bases);
    free(sizes);
}

/* Concurrent readers and one writer. The writer keeps a set of "stable"
 * ranges that never change, and churns ranges placed between them, sharing
 * their granules, plus a far range over 40 granules. Readers must always find
 * each stable range with its own id and offset; a hit in the churn area must
 * start where churn ranges start and never name a stable range; a hit near
 * the far range must start at its base. Use-after-free of retired arrays is
 * left to ASan (and TSan sees the orderings). */
enum { STABLE = 64, CHURN = 64, SLOT = 64 * 1024 };
static const uint64_t cbase = UINT64_C(0x6a0000000000);
static uint32_t stable_id[STABLE];
static int stop_flag;
enum { READERS = 3 };
static uint32_t sections_done[READERS]; /* read sections each reader finished */
static const uint64_t far_base = UINT64_C(0x6a0100000000);

/* slot k (0..STABLE+CHURN) at cbase + k*SLOT: even k stable, odd k churn.
 * A churn range in slot k covers [k*SLOT + 4096, k*SLOT + 4096 + len) and
 * sometimes a big one spans many granules further up. */
static void *reader_main(void *arg)
{
    uint32_t me = (uint32_t)(uintptr_t)arg;
    uint64_t seed = (uint64_t)(me + 1) * 2654435761u + 1;
    uint64_t errors = 0;

    while (!__atomic_load_n(&stop_flag, __ATOMIC_RELAXED)) {
        wo_registry_read_begin();
        for (int j = 0; j < 64; j++) {
            uint32_t k = (uint32_t)(rnd(&seed) % STABLE);
            uint64_t off = rnd(&seed) % SLOT;
            struct wo_hit h;
            if (wo_registry_lookup(cbase + (uint64_t)(2 * k) * SLOT + off, &h) != 1 ||
                h.id != stable_id[k] || h.offset != off)
                errors++;
            /* the churn area: a hit must be within a churn range's slot */
            uint32_t c = (uint32_t)(rnd(&seed) % CHURN);
            uint64_t a = cbase + (uint64_t)(2 * c + 1) * SLOT + rnd(&seed) % SLOT;
            if (wo_registry_lookup(a, &h) == 1) {
                /* churn ranges start at slot + 4096 */
                uint64_t start = a - h.offset;
                if ((start - cbase) % SLOT != 4096 || ((start - cbase) / SLOT) % 2 != 1)
                    errors++;
                for (uint32_t s = 0; s < STABLE; s++)
                    if (h.id == stable_id[s])
                        errors++;
            }
            /* the far range: any hit must start at its base */
            a = far_base + rnd(&seed) % (48 * G2M);
            if (wo_registry_lookup(a, &h) == 1 && a - h.offset != far_base)
                errors++;
        }
        wo_registry_read_end();
        __atomic_fetch_add(&sections_done[me], 1, __ATOMIC_RELAXED);
    }
    return (void *)(uintptr_t)errors;
}

static bool readers_busy(uint32_t min)
{
    for (int i = 0; i < READERS; i++)
        if (__atomic_load_n(&sections_done[i], __ATOMIC_RELAXED) < min)
            return false;
    return true;
}

static void concurrent_readers_with_writer(void **state)
{
    enum { ROUNDS = 20000, MIN_SECTIONS = 200 };
    pthread_t th[READERS];
    uint64_t seed = 12345;
    bool live[CHURN] = {0};

    for (uint32_t k = 0; k < STABLE; k++) {
        struct wo_range r;
        assert_int_equal(wo_registry_add(cbase + (uint64_t)(2 * k) * SLOT, SLOT, 0, 0, NULL, &r), 0);
        stable_id[k] = r.id;
    }
    __atomic_store_n(&stop_flag, 0, __ATOMIC_RELAXED);
    for (uintptr_t i = 0; i < READERS; i++) {
        __atomic_store_n(&sections_done[i], 0, __ATOMIC_RELAXED);
        assert_int_equal(pthread_create(&th[i], NULL, reader_main, (void *)i), 0);
    }
    /* far churn: big ranges spanning many granules, above the slots */
    uint64_t far = far_base;
    /* churn for ROUNDS, and on until every reader has overlapped with it
     * (on a loaded machine a reader may start late) */
    for (int round = 0; round < ROUNDS || !readers_busy(MIN_SECTIONS); round++) {
        uint32_t c = (uint32_t)(rnd(&seed) % CHURN);
        uint64_t b = cbase + (uint64_t)(2 * c + 1) * SLOT + 4096;
        if (live[c]) {
            assert_int_equal(wo_registry_remove(b, NULL), 0);
        } else {
            uint64_t len = rnd(&seed) % (SLOT - 8192) + 1;
            assert_int_equal(wo_registry_add(b, len, 0, 0, NULL, NULL), 0);
        }
        live[c] = !live[c];
        if (round % 64 == 0) {
            assert_int_equal(wo_registry_add(far, 40 * G2M + 5, 0, 0, NULL, NULL), 0);
            assert_int_equal(wo_registry_remove(far, NULL), 0);
        }
    }
    __atomic_store_n(&stop_flag, 1, __ATOMIC_RELAXED);
    for (int i = 0; i < READERS; i++) {
        void *ret;
        assert_int_equal(pthread_join(th[i], &ret), 0);
        assert_int_equal((uintptr_t)ret, 0);
    }
    /* readers gone: one more write reclaims everything retired */
    assert_int_equal(wo_registry_add(far_base, 4096, 0, 0, NULL, NULL), 0);
    assert_int_equal(wo_registry_pending(), 0);
}

/* A thread sits inside a read section while another forks: in the child
 * (where that thread no longer exists) the registry works, and memory the
 * dead reader could have pinned is still reclaimed without blocking. */
static int fork_reader_in;
static int fork_reader_stop;

static void *fork_reader(void *arg)
{
    wo_registry_read_begin();
    __atomic_store_n(&fork_reader_in, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&fork_reader_stop, __ATOMIC_ACQUIRE))
        sched_yield();
    wo_registry_read_end();
    return NULL;
}

static void fork_child_keeps_working(void **state)
{
    pthread_t th;
    int status;
    pid_t pid;

    assert_int_equal(wo_registry_add(0x70000000, 4096, 0, 0, NULL, NULL), 0);
    __atomic_store_n(&fork_reader_in, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&fork_reader_stop, 0, __ATOMIC_RELAXED);
    assert_int_equal(pthread_create(&th, NULL, fork_reader, NULL), 0);
    while (!__atomic_load_n(&fork_reader_in, __ATOMIC_ACQUIRE))
        sched_yield();
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* no cmocka in the child: exit codes say what failed */
        struct wo_hit h;
        for (int i = 0; i < 1000; i++) {
            uint64_t b = 0x70100000 + (uint64_t)i * 8192;
            if (wo_registry_add(b, 4096, 0, 0, NULL, NULL) != 0)
                _exit(2);
            if (!look(b + 10, &h) || h.offset != 10)
                _exit(3);
            if (wo_registry_remove(b, NULL) != 0)
                _exit(4);
        }
        if (!look(0x70000000, &h))
            _exit(5);
        /* the parent's reader is gone here: nothing may stay pinned */
        if (wo_registry_pending() != 0)
            _exit(6);
        _exit(0);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    /* in the parent the reader is alive and pins what it may see */
    assert_int_equal(wo_registry_add(0x70100000, 4096, 0, 0, NULL, NULL), 0);
    assert_int_equal(wo_registry_remove(0x70100000, NULL), 0);
    assert_true(wo_registry_pending() > 0);
    __atomic_store_n(&fork_reader_stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    /* the next write frees it all */
    assert_int_equal(wo_registry_add(0x70100000, 4096, 0, 0, NULL, NULL), 0);
    assert_int_equal(wo_registry_pending(), 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(add_returns_range_and_lookup_hits_edges, setup, teardown),
        cmocka_unit_test_setup_teardown(add_rejects_bad_sizes, setup, teardown),
        cmocka_unit_test_setup_teardown(overlap_is_rejected_and_adjacency_is_not, setup, teardown),
        cmocka_unit_test_setup_teardown(remove_frees_address_and_reuses_id_with_new_gen, setup, teardown),
        cmocka_unit_test_setup_teardown(set_flags_updates_live_range, setup, teardown),
        cmocka_unit_test_setup_teardown(watch_marks_range_until_removed, setup, teardown),
        cmocka_unit_test_setup_teardown(range_spanning_many_granules, setup, teardown),
        cmocka_unit_test_setup_teardown(many_small_ranges_in_one_granule, setup, teardown),
        cmocka_unit_test_setup_teardown(high_and_low_addresses, setup, teardown),
        cmocka_unit_test_setup_teardown(read_sections_nest, setup, teardown),
        cmocka_unit_test_setup_teardown(foreach_visits_live_ranges_and_stops, setup, teardown),
        cmocka_unit_test_setup_teardown(hundred_thousand_ranges, setup, teardown),
        cmocka_unit_test_setup_teardown(concurrent_readers_with_writer, setup, teardown),
        cmocka_unit_test_setup_teardown(fork_child_keeps_working, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
