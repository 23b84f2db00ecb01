/* uvm/place-bind.c: placeable allocations served as late-bound VMM ranges
 * (WOFFLOAD_LATE_BIND=1; uvm/bind.h has the mechanism, docs/placement.md
 * "Late binding" the why).
 *
 * Instead of managed memory, a placeable allocation becomes a bound range:
 * backed on the device while the device has room beyond the managed cap's
 * margin (and, under fit, keep_free), on the host after that, and re-backed
 * at seal, at the same address, to what the tags then say. So whatever
 * order the engine's bytes arrive in, every tensor can still go anywhere
 * at seal: fit chooses among all of them, not among those that came first.
 *
 * Placements map onto two backings: device is device memory; host and
 * managed are host memory read in place (a bound range is not managed
 * memory, so UVM prefetch never touches it; the streaming executor copies
 * from it as from pinned memory). A 2 MiB granule holding bytes of two
 * placements is on the device if any of its bytes are placed there.
 * Everything here runs under wo_uvm.lock. */
#include "uvm/internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/settings.h"
#include "uvm/bind.h"

bool wo_place_bind_enabled(void)
{
    return wo_settings()->late_bind;
}

bool wo_place_bind_fit(void)
{
    const struct wo_settings *s = wo_settings();

    return s->fit_bind && !s->late_bind && wo_uvm.g && wo_uvm.g->fit.enabled;
}

static enum wo_bind_loc loc_of(enum wo_placement p)
{
    return p == WO_PLACE_DEVICE ? WO_BIND_DEVICE : WO_BIND_HOST;
}

/* The bytes backed on the device at allocation: as many as leave the
 * margin (and fit's keep_free) free. Loading then fills the device first,
 * and seal moves only what the choice changes. */
static size_t device_room(const struct wo_driver *d, size_t size, enum wo_placement known)
{
    size_t free_b = 0, total_b = 0;
    uint64_t keep = wo_uvm.cap.margin + (wo_uvm.g->fit.enabled ? wo_uvm.g->fit.keep_free : 0);

    if (known == WO_PLACE_HOST || known == WO_PLACE_MANAGED)
        return 0;
    if (!d->cuMemGetInfo_v2 || d->cuMemGetInfo_v2(&free_b, &total_b) != CUDA_SUCCESS)
        return 0;
    return free_b > keep ? WO_MIN(free_b - keep, size) : 0;
}

/* Granule bytes of every live bound range, by backing: derived from the
 * ranges when asked (stats, fit at seal), never kept beside them. */
void wo_place_bind_bytes(uint64_t *host, uint64_t *device)
{
    *host = *device = 0;
    for (size_t i = 0; i < wo_uvm.alloc_hash_size; i++)
        for (struct wo_alloc *a = wo_uvm.alloc_hash[i]; a; a = a->next)
            if (a->kind == WO_KIND_BOUND && a->bound) {
                struct wo_bind_stats st;
                wo_bind_stats(a->bound, &st);
                *host += st.host_bytes;
                *device += st.device_bytes;
            }
}

static void add_moves(const struct wo_bind_stats *before, const struct wo_bound *b)
{
    struct wo_bind_stats st;

    wo_bind_stats(b, &st);
    wo_uvm.bind.moves += st.moves - before->moves;
    wo_uvm.bind.moved_bytes += st.moved_bytes - before->moved_bytes;
    wo_uvm.bind.failures += st.failures - before->failures;
}

int wo_place_bind_serve(const struct wo_driver *d, struct wo_alloc *a, enum wo_placement known,
                        CUdeviceptr *p)
{
    size_t room = device_room(d, a->size, known);
    struct wo_bound *b = NULL;
    CUresult res;
    int r;

    r = wo_bind_create(d, wo_uvm.device, a->size, room, &b, &res);
    if (r == -ENOMEM && room)
        /* the device filled up between the check and the call */
        r = wo_bind_create(d, wo_uvm.device, a->size, 0, &b, &res);
    if (r != 0) {
        wo_uvm.bind.fallbacks++;
        if (r == -ENOTSUP)
            wo_log_once(WO_LOG_WARN,
                        "WOFFLOAD_LATE_BIND=1: the driver cannot back VMM memory on the host "
                        "(device attribute 141); placeable allocations are served as managed "
                        "memory");
        else
            wo_error("late binding %zu bytes: %s; served as managed memory instead", a->size,
                     res != CUDA_SUCCESS ? wo_cu_error_name(res) : strerror(-r));
        return r;
    }
    a->kind = WO_KIND_BOUND;
    a->bound = b;
    *p = wo_bind_base(b);
    wo_uvm.bind.ranges++;
    return 0;
}

/* On the H200 llama-server died with an illegal address once the streaming
 * executor staged from a bound range, and llama.cpp gave other tokens once
 * picked copies were made from one (docs/placement.md, Late binding): read
 * in place until that is understood */
void wo_place_bind_in_place(void)
{
    if (!__atomic_exchange_n(&wo_uvm.bind.said_in_place, 1, __ATOMIC_RELAXED))
        wo_warn("late-bound ranges off the device (WOFFLOAD_LATE_BIND=1, or weights that yielded "
                "under WOFFLOAD_FIT_BIND=1) are read in place, never staged or copied picked: "
                "both failed on the GPU (docs/placement.md, Late binding)");
}

void wo_place_bind_free(struct wo_alloc *a)
{
    if (a->kind != WO_KIND_BOUND || !a->bound)
        return;
    wo_bind_destroy(a->bound);
    a->bound = NULL;
}

/* Every stream of the context idle: a re-backing swaps mappings, so no
 * copy or kernel may still be writing or reading the range (the engine's
 * last loading copies may still be in flight at seal). False when the
 * driver would not: then nothing moves (speed, never data). On true the
 * copy engine's gate stays raised until settle(): no picked copy may be
 * queued on it while the granules are unmapped and mapped again (the
 * streaming executor's copies wait for wo_uvm.lock, which the caller
 * holds). */
static bool quiesce(void)
{
    const struct wo_driver *d = wo_uvm_driver();
    CUresult r = CUDA_ERROR_NOT_SUPPORTED;

    /* behind the copy engine's gate, as every wait for the context */
    wo_uvm_quiesce_begin();
    if (d && d->cuCtxSynchronize_v2)
        r = d->cuCtxSynchronize_v2(NULL);
    else if (d && d->cuCtxSynchronize)
        r = d->cuCtxSynchronize();
    if (r != CUDA_SUCCESS) {
        wo_uvm_quiesce_end();
        wo_uvm.placement_errors++;
        wo_error("late binding: waiting for the engine's work before re-backing failed (%s); "
                 "the ranges stay as they are",
                 wo_cu_error_name(r));
        return false;
    }
    return true;
}

static void settle(void)
{
    wo_uvm_quiesce_end();
}

/* Re-backs the granules of [0, a->size) as want[] says: the moves to the
 * host first, so the device memory they free is there for the moves to
 * the device. A failed move leaves its bytes where they were (bind.h) and
 * is reported; the others still run. */
static int apply_want(struct wo_alloc *a, const uint8_t *want, size_t ng)
{
    size_t gran = wo_bind_granule(a->bound);
    struct wo_bind_stats before;
    int ret = 0;
    size_t g0 = 0;

    /* a range already as wanted (most of them, loaded where they belong)
     * needs neither the wait nor a move */
    while (g0 < ng && wo_bind_where(a->bound, g0 * gran) == (enum wo_bind_loc)want[g0])
        g0++;
    if (g0 == ng)
        return 0;
    if (!quiesce())
        return -EIO;
    wo_bind_stats(a->bound, &before);
    for (int pass = 0; pass < 2; pass++) {
        uint8_t to = pass == 0 ? WO_BIND_HOST : WO_BIND_DEVICE;
        for (size_t g = 0; g < ng;) {
            size_t e = g;
            CUresult res;
            int r;

            while (e < ng && want[e] == to)
                e++;
            if (e == g) {
                g++;
                continue;
            }
            r = wo_bind_move(a->bound, g * gran, (e - g) * gran, (enum wo_bind_loc)to, &res);
            if (r != 0) {
                char b1[32];
                wo_uvm.placement_errors++;
                wo_error("re-backing %s of [0x%" PRIx64 ", +%" PRIu64 ") on the %s failed: %s; "
                         "those bytes stay where they are",
                         wo_format_size((e - g) * gran, b1, sizeof(b1)), a->base, a->size,
                         to == WO_BIND_DEVICE ? "device" : "host",
                         res != CUDA_SUCCESS ? wo_cu_error_name(res) : strerror(-r));
                if (!ret)
                    ret = r;
            }
            g = e;
        }
    }
    add_moves(&before, a->bound);
    settle();
    return ret;
}

static void mark(uint8_t *want, size_t gran, uint64_t off, uint64_t len)
{
    for (uint64_t g = off / gran; g < (off + len + gran - 1) / gran; g++)
        want[g] = WO_BIND_DEVICE;
}

int wo_place_bind_seal(struct wo_alloc *a, enum wo_placement gaps)
{
    size_t gran = wo_bind_granule(a->bound), ng = (a->size + gran - 1) / gran;
    uint8_t *want = malloc(ng ? ng : 1);
    uint64_t pos = 0;
    int r;

    if (!want) {
        wo_error("late binding: out of memory at seal; [0x%" PRIx64 ", +%" PRIu64
                 ") stays as loaded",
                 a->base, a->size);
        return -ENOMEM;
    }
    /* host everywhere, then every granule with a byte placed on the device */
    memset(want, WO_BIND_HOST, ng);
    for (size_t i = 0; i <= a->ntags; i++) {
        uint64_t toff = i < a->ntags ? a->tags[i].off : a->size;
        if (toff > pos && loc_of(gaps) == WO_BIND_DEVICE)
            mark(want, gran, pos, toff - pos);
        if (i < a->ntags) {
            if (loc_of(a->tags[i].place) == WO_BIND_DEVICE)
                mark(want, gran, a->tags[i].off, a->tags[i].size);
            a->tags[i].applied = true;
            pos = a->tags[i].off + a->tags[i].size;
        }
    }
    r = apply_want(a, want, ng);
    free(want);
    return r;
}

int wo_place_bind_tag(struct wo_alloc *a, struct wo_tag *t)
{
    CUresult res;
    struct wo_bind_stats before;
    enum wo_bind_loc to = loc_of(t->place);
    int r;

    if (!quiesce())
        return -EIO;
    /* after seal: this tag's granules alone; a granule it shares with a
     * device-placed neighbour stays on the device */
    if (to == WO_BIND_HOST) {
        size_t gran = wo_bind_granule(a->bound);
        uint64_t lo = WO_ALIGN_UP(t->off, (uint64_t)gran);
        uint64_t hi = (t->off + t->size) / gran * gran;
        if (t->off + t->size == a->size)
            hi = WO_ALIGN_UP(a->size, (uint64_t)gran);
        if (t->off == 0)
            lo = 0;
        if (hi <= lo) {
            settle();
            t->applied = true;
            return 0;
        }
        wo_bind_stats(a->bound, &before);
        r = wo_bind_move(a->bound, lo, hi - lo, to, &res);
    } else {
        wo_bind_stats(a->bound, &before);
        r = wo_bind_move(a->bound, t->off, t->size, to, &res);
    }
    add_moves(&before, a->bound);
    settle();
    if (r != 0) {
        wo_uvm.placement_errors++;
        wo_error("placing '%s' on the %s (late bound): %s; it stays where it was", t->name->s,
                 to == WO_BIND_DEVICE ? "device" : "host",
                 res != CUDA_SUCCESS ? wo_cu_error_name(res) : strerror(-r));
        return r;
    }
    t->applied = true;
    return 0;
}
