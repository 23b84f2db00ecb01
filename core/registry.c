/* core/registry.c: the range registry (see registry.h).
 *
 * Owns three things:
 *   - the records: one per live range, indexed by id, touched only under the
 *     writer mutex;
 *   - the lookup table, read without a lock: a two-level table keyed by 2 MiB
 *     granule (addr >> 21). A slot is empty (NULL) or points to an immutable
 *     array, sorted by base, of the ranges overlapping that granule. Each
 *     range owns a one-entry array that every granule it alone touches
 *     points to; only granules shared by several ranges get arrays of their
 *     own. A range shares at most two granules (its first and last), so a
 *     range of any size costs one small allocation plus one slot store per
 *     granule, and the reader runs the same code for both kinds;
 *   - the watch marks: per id, the generation of the range uvm/ marked as
 *     watched (0: none), read without a lock by every lookup that finds a
 *     range; a two-level table whose leaves are made on first use and kept
 *     to the end (ids are dense and reused, so it stays small);
 *   - epoch-based reclamation of the entries and arrays a writer unpublishes:
 *     each reading thread owns a slot announcing the epoch it entered its read
 *     section at; a retired object is freed once every active reader entered
 *     after it was retired.
 *
 * Why the orderings below suffice: a reader stores its epoch and then loads
 * table slots; a writer stores table slots and then loads reader epochs. All
 * four are seq_cst, so either the writer sees the reader's epoch (and keeps
 * what it retired at or after that epoch) or the reader sees the new table
 * (and never reaches the retired object). On x86 the reader's side costs one
 * xchg per read section and plain loads per lookup. Only __atomic builtins and
 * no standalone fences, so TSan models all of it. */
#include "core/registry.h"

#include <pthread.h>
#include <string.h>
#include <sys/mman.h>

#include "core/log.h"

/* User addresses: x86-64 with 5-level paging and arm64 with 52-bit VAs stay
 * below 2^57; CUDA UVA addresses stay below 2^47. A word at or above 2^57
 * cannot be a tracked address, which rejects most non-pointer parameter words
 * with one compare. */
#define ADDR_BITS 57
#define GRANULE_SHIFT 21
#define LEAF_BITS 18
#define TOP_BITS (ADDR_BITS - GRANULE_SHIFT - LEAF_BITS)
#define LEAF_SLOTS (UINT64_C(1) << LEAF_BITS)
#define TOP_SLOTS (UINT64_C(1) << TOP_BITS)
#define ADDR_LIMIT (UINT64_C(1) << ADDR_BITS)

/* What a reader needs of a range; immutable once published. */
struct gent {
    uint64_t base;
    uint64_t end;
    uint32_t id;
    uint32_t gen;
};

struct garr {
    uint32_t n;
    uint32_t own;    /* 1: a range's own one-entry array (freed with the range) */
    struct gent e[]; /* sorted by base; ranges never overlap, so also by end */
};

/* 2 MiB of slots covering 512 GiB of address space; mmap'ed, so only the
 * pages holding used slots ever become resident. */
struct leaf {
    struct garr *slot[LEAF_SLOTS];
};

/* LeakSanitizer does not scan mmap'ed memory: the shared granule arrays
 * only the leaves point to would look leaked when the process exits with
 * ranges live. In a process with LeakSanitizer the leaves are registered
 * as root regions; elsewhere the weak symbols are absent and not called. */
extern void __lsan_register_root_region(const void *p, size_t size) __attribute__((weak));
extern void __lsan_unregister_root_region(const void *p, size_t size) __attribute__((weak));

struct rec {
    struct wo_range r;
    struct garr *one; /* the range's own one-entry array; NULL: id free */
};

struct retired {
    void *p;
    uint64_t epoch;
};

/* One per reading thread, on a push-only list; reused after its thread exits. */
struct reader {
    uint64_t epoch; /* 0: not in a read section */
    int in_use;
    struct reader *next;
} __attribute__((aligned(64)));

/* 2 MiB of zero bss; untouched pages cost nothing. */
static struct leaf *top[TOP_SLOTS];

/* Watch marks: ids below 2^28 (the id space stays far below: ids are reused),
 * leaves of 4096 marks (16 KiB); 512 KiB of zero bss for the top level. */
#define MARK_LEAF_BITS 12
#define MARK_TOP_SLOTS (UINT32_C(1) << 16)
static uint32_t *marks[MARK_TOP_SLOTS];

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct rec *recs;      /* [nrecs], under lock */
static uint32_t nrecs;        /* id limit */
static uint32_t recs_cap;
static uint32_t *free_ids;    /* stack of free ids, under lock */
static uint32_t nfree, free_cap;
static uint64_t next_seq = 1; /* under lock */
static struct retired *retired;
static size_t nretired, retired_cap;

static size_t live_count; /* relaxed atomics: read without the lock for stats */
static uint64_t live_bytes;

static uint64_t global_epoch = 1;
static struct reader *readers;
/* One small thread-local object, initial-exec: read_begin/end run on every
 * launch and must not call __tls_get_addr. The library is STATIC_TLS already
 * (preload/ uses initial-exec too), so this adds 16 bytes to the block a
 * dlopen takes from the static TLS surplus. */
static __thread struct {
    struct reader *rd;
    unsigned depth;
} me __attribute__((tls_model("initial-exec")));

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static pthread_key_t reader_key;
static bool reader_key_ok;

static void reader_release(void *p)
{
    struct reader *rd = p;
    /* A thread exiting inside a read section is a bug of the caller; do not
     * let it block reclamation forever. */
    __atomic_store_n(&rd->epoch, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&rd->in_use, 0, __ATOMIC_RELEASE);
    /* A later destructor of this thread that reads again must not share the
     * slot another thread may now take. */
    me.rd = NULL;
    me.depth = 0;
}

static void atfork_prepare(void)
{
    pthread_mutex_lock(&lock);
}

static void atfork_parent(void)
{
    pthread_mutex_unlock(&lock);
}

/* Only the forking thread survives in the child: every other reader slot is
 * dead and must not hold back reclamation. */
static void atfork_child(void)
{
    for (struct reader *rd = __atomic_load_n(&readers, __ATOMIC_SEQ_CST); rd; rd = rd->next) {
        if (rd == me.rd)
            continue;
        __atomic_store_n(&rd->epoch, 0, __ATOMIC_SEQ_CST);
        __atomic_store_n(&rd->in_use, 0, __ATOMIC_RELEASE);
    }
    pthread_mutex_init(&lock, NULL);
}

static void registry_once(void)
{
    reader_key_ok = pthread_key_create(&reader_key, reader_release) == 0;
    if (!reader_key_ok)
        wo_warn("registry: pthread_key_create failed; reader slots of exited threads are not reused");
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

int wo_registry_init(void)
{
    pthread_once(&init_once, registry_once);
    return 0;
}

/* ---- readers ------------------------------------------------------------ */

/* A free slot of an exited thread, or NULL. */
static struct reader *reader_reuse(void)
{
    for (struct reader *rd = __atomic_load_n(&readers, __ATOMIC_SEQ_CST); rd; rd = rd->next) {
        int expect = 0;
        if (__atomic_compare_exchange_n(&rd->in_use, &expect, 1, false, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED))
            return rd;
    }
    return NULL;
}

static struct reader *reader_get(void)
{
    struct reader *rd;

    if (WO_LIKELY(me.rd != NULL))
        return me.rd;
    pthread_once(&init_once, registry_once);
    rd = reader_reuse();
    if (!rd) {
        rd = aligned_alloc(64, sizeof(*rd));
        if (!rd)
            return NULL;
        memset(rd, 0, sizeof(*rd));
        rd->in_use = 1;
        rd->next = __atomic_load_n(&readers, __ATOMIC_RELAXED);
        /* seq_cst: a writer that misses this slot on its scan is ordered
         * before our epoch store, so we see its table. */
        while (!__atomic_compare_exchange_n(&readers, &rd->next, rd, true, __ATOMIC_SEQ_CST,
                                            __ATOMIC_RELAXED))
            ;
    }
    me.rd = rd;
    if (reader_key_ok)
        pthread_setspecific(reader_key, rd);
    return rd;
}

void wo_registry_read_begin(void)
{
    struct reader *rd;

    if (me.depth++ > 0)
        return;
    rd = reader_get();
    if (WO_UNLIKELY(!rd)) {
        /* No slot (out of memory): readers cannot be tracked, so the writer
         * lock stands in. wo_registry_lookup stays lock-free for everybody
         * else. */
        pthread_mutex_lock(&lock);
        return;
    }
    __atomic_exchange_n(&rd->epoch, __atomic_load_n(&global_epoch, __ATOMIC_SEQ_CST),
                        __ATOMIC_SEQ_CST);
}

void wo_registry_read_end(void)
{
    if (WO_UNLIKELY(me.depth == 0))
        return;
    if (--me.depth > 0)
        return;
    if (WO_UNLIKELY(!me.rd)) {
        pthread_mutex_unlock(&lock);
        return;
    }
    __atomic_store_n(&me.rd->epoch, 0, __ATOMIC_RELEASE);
}

/* ---- the table ---------------------------------------------------------- */

static inline struct garr *slot_load(uint64_t g)
{
    struct leaf *l = __atomic_load_n(&top[g >> LEAF_BITS], __ATOMIC_SEQ_CST);
    if (!l)
        return NULL;
    return __atomic_load_n(&l->slot[g & (LEAF_SLOTS - 1)], __ATOMIC_SEQ_CST);
}

/* The leaf must exist (leaves_alloc). */
static inline void slot_store(uint64_t g, struct garr *v)
{
    struct leaf *l = top[g >> LEAF_BITS];
    __atomic_store_n(&l->slot[g & (LEAF_SLOTS - 1)], v, __ATOMIC_SEQ_CST);
}

static int leaves_alloc(uint64_t g0, uint64_t g1)
{
    for (uint64_t t = g0 >> LEAF_BITS; t <= g1 >> LEAF_BITS; t++) {
        void *p;
        if (top[t])
            continue;
        p = mmap(NULL, sizeof(struct leaf), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                 -1, 0);
        if (p == MAP_FAILED)
            return -ENOMEM;
        if (__lsan_register_root_region)
            __lsan_register_root_region(p, sizeof(struct leaf));
        __atomic_store_n(&top[t], (struct leaf *)p, __ATOMIC_SEQ_CST);
    }
    return 0;
}

/* The entry of `addr` in a granule's array, or NULL. */
static inline const struct gent *slot_find(const struct garr *a, uint64_t addr)
{
    const struct gent *e = a->e;
    uint32_t n = a->n;

    /* last entry with base <= addr (or the first), without branches to
     * mispredict: n is 1 for most granules */
    while (n > 1) {
        uint32_t half = n / 2;
        e = e[half].base <= addr ? e + half : e;
        n -= half;
    }
    /* unsigned: also rejects addr < base */
    if (addr - e->base >= e->end - e->base)
        return NULL;
    return e;
}

/* Relaxed: a mark set while a launch is being scanned may or may not be seen
 * by it, as if the tag had come a moment later; the generation check keeps a
 * reused id from inheriting its previous range's mark. */
static inline uint32_t mark_load(uint32_t id)
{
    uint32_t *leaf;

    if (id >> MARK_LEAF_BITS >= MARK_TOP_SLOTS)
        return 0;
    leaf = __atomic_load_n(&marks[id >> MARK_LEAF_BITS], __ATOMIC_ACQUIRE);
    return leaf ? __atomic_load_n(&leaf[id & ((1u << MARK_LEAF_BITS) - 1)], __ATOMIC_RELAXED) : 0;
}

/* Under lock. */
static int mark_store(uint32_t id, uint32_t gen)
{
    uint32_t **slot = &marks[id >> MARK_LEAF_BITS];
    uint32_t *leaf;

    if (id >> MARK_LEAF_BITS >= MARK_TOP_SLOTS)
        return -ENOMEM;
    leaf = *slot;
    if (!leaf) {
        if (!gen)
            return 0;
        leaf = calloc((size_t)1 << MARK_LEAF_BITS, sizeof(*leaf));
        if (!leaf)
            return -ENOMEM;
        __atomic_store_n(slot, leaf, __ATOMIC_RELEASE);
    }
    __atomic_store_n(&leaf[id & ((1u << MARK_LEAF_BITS) - 1)], gen, __ATOMIC_RELAXED);
    return 0;
}

int wo_registry_lookup(uint64_t addr, struct wo_hit *ret)
{
    const struct gent *e;
    const struct garr *a;

    if (addr >= ADDR_LIMIT)
        return 0;
    a = slot_load(addr >> GRANULE_SHIFT);
    if (!a)
        return 0;
    e = slot_find(a, addr);
    if (!e)
        return 0;
    if (ret) {
        ret->id = e->id;
        ret->gen = e->gen;
        ret->offset = addr - e->base;
        ret->watched = mark_load(e->id) == e->gen;
    }
    return 1;
}

static struct garr *garr_new(uint32_t n)
{
    struct garr *a = malloc(sizeof(*a) + (size_t)n * sizeof(struct gent));
    if (a) {
        a->n = n;
        a->own = 0;
    }
    return a;
}

/* ---- writer side (under lock) --------------------------------------------- */

/* Room was made by retire_reserve, so this cannot fail halfway through an
 * update that is already published. */
static void retire(void *p)
{
    retired[nretired].p = p;
    retired[nretired].epoch = __atomic_load_n(&global_epoch, __ATOMIC_SEQ_CST);
    nretired++;
}

/* Makes room so that `n` retire() calls cannot fail. */
static int retire_reserve(size_t n)
{
    if (nretired + n <= retired_cap)
        return 0;
    size_t cap = WO_MAX(retired_cap * 2, nretired + n + 64);
    struct retired *r = realloc(retired, cap * sizeof(*r));
    if (!r)
        return -ENOMEM;
    retired = r;
    retired_cap = cap;
    return 0;
}

static void reclaim(void)
{
    uint64_t min = UINT64_MAX;
    size_t k = 0;

    if (nretired == 0)
        return;
    /* Objects retired before this increment carry an older epoch than any
     * reader that enters from now on. */
    __atomic_fetch_add(&global_epoch, 1, __ATOMIC_SEQ_CST);
    for (struct reader *rd = __atomic_load_n(&readers, __ATOMIC_SEQ_CST); rd; rd = rd->next) {
        uint64_t e = __atomic_load_n(&rd->epoch, __ATOMIC_SEQ_CST);
        if (e != 0 && e < min)
            min = e;
    }
    for (size_t i = 0; i < nretired; i++) {
        if (retired[i].epoch < min)
            free(retired[i].p);
        else
            retired[k++] = retired[i];
    }
    nretired = k;
}

static inline bool overlaps(const struct gent *e, uint64_t base, uint64_t end)
{
    return e->base < end && base < e->end;
}

static int id_alloc(uint32_t *ret)
{
    if (nfree > 0) {
        *ret = free_ids[--nfree];
        return 0;
    }
    if (nrecs >= UINT32_MAX / 2)
        return -ENOSPC; /* keeps the doubling below from wrapping */
    if (nrecs == recs_cap) {
        uint32_t cap = recs_cap ? recs_cap * 2 : 256;
        struct rec *n;
        /* free_ids first and as large as recs: wo_registry_remove can always
         * push the id it frees. */
        if (free_cap < cap) {
            uint32_t *f = realloc(free_ids, (size_t)cap * sizeof(*f));
            if (!f)
                return -ENOMEM;
            free_ids = f;
            free_cap = cap;
        }
        n = realloc(recs, (size_t)cap * sizeof(*n));
        if (!n)
            return -ENOMEM;
        recs = n;
        memset(recs + recs_cap, 0, (size_t)(cap - recs_cap) * sizeof(*n));
        recs_cap = cap;
    }
    *ret = nrecs++;
    return 0;
}

/* The ranges of granule array `s` plus `g`: a new array (NULL on ENOMEM). */
static struct garr *garr_with(const struct garr *s, const struct gent *g)
{
    uint32_t k = 0;
    struct garr *a = garr_new(s->n + 1);

    if (!a)
        return NULL;
    for (uint32_t i = 0; i < s->n; i++) {
        if (k == i && g->base < s->e[i].base)
            a->e[k++] = *g;
        a->e[k++] = s->e[i];
    }
    if (k == s->n)
        a->e[k++] = *g;
    return a;
}

/* The ranges of granule array `s` minus range `id`: NULL (none left), the
 * remaining range's own array, or a new array. -ENOMEM. */
static int garr_without(const struct garr *s, uint32_t id, struct garr **ret)
{
    uint32_t k = 0;
    struct garr *a;

    if (s->own) {
        *ret = NULL;
        return 0;
    }
    if (s->n == 2) {
        *ret = recs[s->e[0].id == id ? s->e[1].id : s->e[0].id].one;
        return 0;
    }
    a = garr_new(s->n - 1);
    if (!a)
        return -ENOMEM;
    for (uint32_t i = 0; i < s->n; i++)
        if (s->e[i].id != id)
            a->e[k++] = s->e[i];
    *ret = a;
    return 0;
}

/* A granule's array is retired when replaced; a range's own array only
 * with its range. */
static void retire_granule(struct garr *s)
{
    if (s && !s->own)
        retire(s);
}

int wo_registry_add(uint64_t base, uint64_t size, uint32_t flags, uint32_t device, void *owner,
                    struct wo_range *ret)
{
    uint64_t end = base + size, g0, g1;
    struct garr *s0, *s1, *a0 = NULL, *a1 = NULL, *one = NULL;
    struct rec *rc;
    uint32_t id = UINT32_MAX;
    int r;

    if (size == 0 || end < base || end > ADDR_LIMIT)
        return -EINVAL;
    g0 = base >> GRANULE_SHIFT;
    g1 = (end - 1) >> GRANULE_SHIFT;

    /* the fork handlers must be in place before the lock is first taken */
    pthread_once(&init_once, registry_once);
    pthread_mutex_lock(&lock);
    /* Check everything and allocate everything first, so that publishing
     * below cannot fail halfway. */
    s0 = slot_load(g0);
    s1 = slot_load(g1);
    for (uint64_t gi = g0; gi <= g1; gi++) {
        const struct garr *s = gi == g0 ? s0 : gi == g1 ? s1 : slot_load(gi);
        if (!s)
            continue;
        for (uint32_t i = 0; i < s->n; i++) {
            if (overlaps(&s->e[i], base, end)) {
                r = -EEXIST;
                goto out;
            }
        }
    }
    r = leaves_alloc(g0, g1);
    if (r < 0)
        goto out;
    r = retire_reserve(2);
    if (r < 0)
        goto out;
    one = garr_new(1);
    if (!one) {
        r = -ENOMEM;
        goto out;
    }
    r = id_alloc(&id);
    if (r < 0)
        goto out;
    rc = &recs[id];
    if (rc->r.gen == 0)
        rc->r.gen = 1;
    one->own = 1;
    one->e[0] = (struct gent){.base = base, .end = end, .id = id, .gen = rc->r.gen};
    if (s0) {
        a0 = garr_with(s0, &one->e[0]);
        if (!a0) {
            r = -ENOMEM;
            goto out;
        }
    }
    if (s1 && g1 != g0) {
        a1 = garr_with(s1, &one->e[0]);
        if (!a1) {
            r = -ENOMEM;
            goto out;
        }
    }

    rc->r.base = base;
    rc->r.size = size;
    rc->r.id = id;
    rc->r.flags = flags;
    rc->r.device = device;
    rc->r.seq = next_seq++;
    rc->r.owner = owner;
    rc->one = one;
    for (uint64_t gi = g0; gi <= g1; gi++) {
        if (gi == g0 && a0)
            slot_store(gi, a0);
        else if (gi == g1 && a1)
            slot_store(gi, a1);
        else
            slot_store(gi, one);
    }
    if (a0)
        retire_granule(s0);
    if (a1)
        retire_granule(s1);
    a0 = a1 = one = NULL;
    id = UINT32_MAX;
    __atomic_fetch_add(&live_count, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&live_bytes, size, __ATOMIC_RELAXED);
    if (ret)
        *ret = rc->r;
    reclaim();
out:
    if (id != UINT32_MAX)
        free_ids[nfree++] = id; /* allocated, then a later step failed */
    pthread_mutex_unlock(&lock);
    free(a0);
    free(a1);
    free(one);
    return r;
}

/* The record of the live range holding addr, under lock. */
static struct rec *rec_find(uint64_t addr)
{
    const struct gent *e;
    const struct garr *a;

    if (addr >= ADDR_LIMIT)
        return NULL;
    a = slot_load(addr >> GRANULE_SHIFT);
    if (!a)
        return NULL;
    e = slot_find(a, addr);
    return e ? &recs[e->id] : NULL;
}

int wo_registry_remove(uint64_t base, struct wo_range *ret)
{
    uint64_t g0, g1;
    struct garr *s0, *s1, *n0 = NULL, *n1 = NULL;
    struct rec *rc;
    uint32_t id;
    int r;

    pthread_mutex_lock(&lock);
    rc = rec_find(base);
    if (!rc || rc->r.base != base) {
        r = -ENOENT;
        goto out;
    }
    id = rc->r.id;
    g0 = base >> GRANULE_SHIFT;
    g1 = (base + rc->r.size - 1) >> GRANULE_SHIFT;
    s0 = slot_load(g0);
    s1 = slot_load(g1);
    r = retire_reserve(3);
    if (r < 0)
        goto out;
    r = garr_without(s0, id, &n0);
    if (r < 0)
        goto out;
    if (g1 != g0) {
        r = garr_without(s1, id, &n1);
        if (r < 0) {
            if (n0 && !n0->own)
                free(n0);
            goto out;
        }
    }
    for (uint64_t gi = g0; gi <= g1; gi++)
        slot_store(gi, gi == g0 ? n0 : gi == g1 ? n1 : NULL);
    retire_granule(s0);
    if (g1 != g0)
        retire_granule(s1);
    retire(rc->one);

    if (ret)
        *ret = rc->r;
    __atomic_fetch_sub(&live_count, 1, __ATOMIC_RELAXED);
    __atomic_fetch_sub(&live_bytes, rc->r.size, __ATOMIC_RELAXED);
    rc->one = NULL;
    (void)mark_store(id, 0);
    rc->r.gen++;
    if (rc->r.gen == 0)
        rc->r.gen = 1;
    free_ids[nfree++] = id;
    reclaim();
out:
    pthread_mutex_unlock(&lock);
    return r;
}

int wo_registry_get(uint32_t id, struct wo_range *ret)
{
    int r = -ENOENT;

    pthread_mutex_lock(&lock);
    if (id < nrecs && recs[id].one) {
        if (ret)
            *ret = recs[id].r;
        r = 0;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

int wo_registry_find(uint64_t addr, struct wo_range *ret)
{
    struct rec *rc;
    int r = -ENOENT;

    pthread_mutex_lock(&lock);
    rc = rec_find(addr);
    if (rc) {
        if (ret)
            *ret = rc->r;
        r = 0;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

int wo_registry_watch(uint32_t id, uint32_t gen)
{
    int r = -ENOENT;

    pthread_mutex_lock(&lock);
    if (id < nrecs && recs[id].one && recs[id].r.gen == gen)
        r = mark_store(id, gen);
    pthread_mutex_unlock(&lock);
    return r;
}

int wo_registry_set_flags(uint32_t id, uint32_t flags)
{
    int r = -ENOENT;

    pthread_mutex_lock(&lock);
    if (id < nrecs && recs[id].one) {
        recs[id].r.flags = flags;
        r = 0;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

size_t wo_registry_count(void)
{
    return __atomic_load_n(&live_count, __ATOMIC_RELAXED);
}

uint64_t wo_registry_bytes(void)
{
    return __atomic_load_n(&live_bytes, __ATOMIC_RELAXED);
}

int wo_registry_foreach(int (*fn)(const struct wo_range *r, void *ud), void *ud)
{
    int r = 0;

    pthread_mutex_lock(&lock);
    for (uint32_t i = 0; i < nrecs && r == 0; i++)
        if (recs[i].one)
            r = fn(&recs[i].r, ud);
    pthread_mutex_unlock(&lock);
    return r;
}

uint32_t wo_registry_id_limit(void)
{
    uint32_t n;

    pthread_mutex_lock(&lock);
    n = nrecs;
    pthread_mutex_unlock(&lock);
    return n;
}

size_t wo_registry_pending(void)
{
    size_t n;

    pthread_mutex_lock(&lock);
    n = nretired;
    pthread_mutex_unlock(&lock);
    return n;
}

void wo_registry_reset(void)
{
    pthread_mutex_lock(&lock);
    /* Granule arrays only sit where a live range starts or ends. */
    for (uint32_t i = 0; i < nrecs; i++) {
        uint64_t gs[2];
        if (!recs[i].one)
            continue;
        gs[0] = recs[i].r.base >> GRANULE_SHIFT;
        gs[1] = (recs[i].r.base + recs[i].r.size - 1) >> GRANULE_SHIFT;
        for (int k = 0; k < 2; k++) {
            struct garr *s = slot_load(gs[k]);
            if (s && !s->own) {
                free(s);
                slot_store(gs[k], NULL);
            }
        }
    }
    for (uint64_t t = 0; t < TOP_SLOTS; t++) {
        struct leaf *l = top[t];
        if (!l)
            continue;
        __atomic_store_n(&top[t], NULL, __ATOMIC_SEQ_CST);
        if (__lsan_unregister_root_region)
            __lsan_unregister_root_region(l, sizeof(*l));
        munmap(l, sizeof(*l));
    }
    for (uint32_t i = 0; i < MARK_TOP_SLOTS; i++) {
        free(marks[i]);
        marks[i] = NULL;
    }
    for (uint32_t i = 0; i < nrecs; i++)
        free(recs[i].one);
    for (size_t i = 0; i < nretired; i++)
        free(retired[i].p);
    free(recs);
    free(free_ids);
    free(retired);
    recs = NULL;
    free_ids = NULL;
    retired = NULL;
    nrecs = recs_cap = nfree = free_cap = 0;
    nretired = retired_cap = 0;
    next_seq = 1;
    __atomic_store_n(&live_count, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&live_bytes, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&lock);
}
