/* uvm/place-apply.c: the managed placement backend: a placement applied to
 * a range of a served managed allocation (cuMemAdvise, and with residency a
 * prefetch on uvm/'s private stream; uvm/place.c says which advice each
 * placement gets), and the wait for those prefetches. Below routing
 * (place.c), seal (place-seal.c) and fit (place-fit.c), which all apply
 * placements through it; it calls none of them. Every function here runs
 * under wo_uvm.lock. */
#include "uvm/place-int.h"

#include <inttypes.h>
#include <string.h>

#include "core/event.h"
#include "core/log.h"

static int cu_errno(CUresult r)
{
    switch (r) {
    case CUDA_SUCCESS:
        return 0;
    case CUDA_ERROR_OUT_OF_MEMORY:
        return -ENOMEM;
    case CUDA_ERROR_INVALID_VALUE:
        return -EINVAL;
    case CUDA_ERROR_NOT_SUPPORTED:
        return -EOPNOTSUPP;
    default:
        return -EIO;
    }
}

static CUmemLocation loc_device(void)
{
    CUmemLocation l = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = wo_uvm.device};
    return l;
}

static CUmemLocation loc_host(void)
{
    CUmemLocation l = {.type = CU_MEM_LOCATION_TYPE_HOST, .id = 0};
    return l;
}

/* The private stream for residency changes; NULL when it cannot be had (the
 * placement then takes effect by advice alone, on first touch). */
static CUstream private_stream(void)
{
    const struct wo_driver *d = wo_uvm_driver();

    if (wo_uvm.stream || wo_uvm.stream_failed)
        return wo_uvm.stream;
    if (!d || !d->cuStreamCreate || !d->cuMemPrefetchAsync_v2 || !d->cuStreamSynchronize ||
        d->cuStreamCreate(&wo_uvm.stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
        wo_uvm.stream = NULL;
        wo_uvm.stream_failed = true;
        wo_warn("no private stream for placement prefetches: placements take effect on first "
                "touch only");
    }
    return wo_uvm.stream;
}

static const char *tag_label(const struct wo_alloc *a, uint64_t off)
{
    for (size_t i = 0; i < a->ntags; i++)
        if (a->tags[i].off <= off && off < a->tags[i].off + a->tags[i].size)
            return a->tags[i].name->s;
    return "(untagged)";
}

/* Advice and, with residency, a prefetch on the private stream (the caller
 * synchronises it). The range is widened to whole pages inside the
 * allocation: advice works on pages, and neighbours that share a page get
 * the placement applied last. */
int wo_place_apply_range(struct wo_alloc *a, uint64_t off, uint64_t len, enum wo_placement p,
                         bool advice, bool residency)
{
    const struct wo_driver *d = wo_uvm_driver();
    uint64_t start = off & ~(uint64_t)(PAGE - 1);
    uint64_t end = WO_MIN(WO_ALIGN_UP(off + len, (uint64_t)PAGE), a->size);
    CUdeviceptr ptr = a->base + start;
    size_t n = end - start;
    CUresult r = CUDA_SUCCESS;
    const char *what = "";
    CUstream s;

    if (a->kind != WO_KIND_MANAGED || !d)
        return 0;
    if (advice && d->cuMemAdvise_v2) {
        if (p == WO_PLACE_DEVICE) {
            what = "advise preferred=GPU";
            r = d->cuMemAdvise_v2(ptr, n, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, loc_device());
        } else {
            what = "advise preferred=host";
            r = d->cuMemAdvise_v2(ptr, n, CU_MEM_ADVISE_SET_PREFERRED_LOCATION, loc_host());
            if (r == CUDA_SUCCESS) {
                what = "advise accessed-by=GPU";
                r = d->cuMemAdvise_v2(ptr, n, CU_MEM_ADVISE_SET_ACCESSED_BY, loc_device());
            }
        }
        if (r != CUDA_SUCCESS)
            goto fail;
    }
    if (advice && wo_events) {
        /* For the trace and the prefetcher (which then rescans its segments). */
        struct wo_event ev;
        memset(&ev, 0, sizeof(ev));
        ev.t_ns = wo_now_ns();
        ev.type = WO_EV_PLACE;
        ev.p.id = a->id;
        ev.p.gen = a->gen;
        ev.p.offset = start;
        ev.p.bytes = n;
        ev.p.from = WO_PLACE_UNSET; /* not tracked per page */
        ev.p.to = p;
        (void)wo_ring_push(wo_events, &ev);
    }
    if (residency && (s = private_stream())) {
        what = p == WO_PLACE_DEVICE ? "prefetch to the GPU" : "prefetch to host";
        r = d->cuMemPrefetchAsync_v2(ptr, n, p == WO_PLACE_DEVICE ? loc_device() : loc_host(), 0,
                                     s);
        if (r != CUDA_SUCCESS)
            goto fail;
    }
    return 0;
fail:
    wo_uvm.placement_errors++;
    wo_error("placing '%s' [0x%" PRIx64 ", +%zu) on %s: %s failed: %s; it stays where it was",
             tag_label(a, off), (uint64_t)ptr, n, wo_placement_to_string(p), what,
             wo_cu_error_name(r));
    return cu_errno(r);
}

int wo_place_sync(void)
{
    const struct wo_driver *d = wo_uvm_driver();
    CUresult r;

    if (!wo_uvm.stream)
        return 0;
    r = d->cuStreamSynchronize(wo_uvm.stream);
    if (r != CUDA_SUCCESS) {
        wo_error("waiting for placement prefetches: %s", wo_cu_error_name(r));
        return cu_errno(r);
    }
    return 0;
}
