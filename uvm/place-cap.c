/* uvm/place-cap.c: the managed cap (place-int.h, docs/placement.md):
 * the managed bytes the shim serves never pass the free device memory less
 * a margin (past it managed memory thrashes, and on the lent GPU it can
 * hang it). What does not fit passes through as device memory or is
 * served as pinned host memory, and the counts say which. */
#include "uvm/place-int.h"

#include "core/log.h"

/* The managed cap: may size more bytes of managed memory be asked for now?
 * Every live managed byte the shim served counts as if it were on the
 * device, because a page the engine writes lands there
 * (bench/results/managed-residency-20261125-h100.txt) and the driver cannot
 * say how many did: live + size <= free - margin. A failed cuMemGetInfo
 * counts as no room. */
bool wo_place_cap_fits(const struct wo_driver *d, size_t size, int64_t *headroom,
                       size_t *free_ret)
{
    size_t free_b = 0, total_b = 0;

    wo_uvm.cap.checks++;
    *free_ret = 0;
    if (!d->cuMemGetInfo_v2 || d->cuMemGetInfo_v2(&free_b, &total_b) != CUDA_SUCCESS) {
        wo_uvm.cap.unknown_free++;
        return false;
    }
    *free_ret = free_b;
    *headroom = (int64_t)free_b - (int64_t)wo_uvm.cap.margin - (int64_t)wo_uvm.cap.live -
                (int64_t)size;
    return *headroom >= 0;
}

void wo_place_count_stuck(const struct wo_name *n, enum wo_placement want, uint64_t size)
{
    /* Under fit, a name no rule placed has no placement to miss: fit chooses
     * among what can move. */
    if (want == WO_PLACE_HOST || (wo_uvm.g->fit.enabled && n->rule < 0))
        return;
    wo_uvm.cap.stuck_tags++;
    wo_uvm.cap.stuck_bytes += size;
}

static void report_cap(const char *name, size_t size, const char *what)
{
    char b1[32], b2[32], b3[32];

    wo_log_once(WO_LOG_WARN,
                "managed memory would pass the free device memory minus %s: from here on "
                "placeable allocations placed on the device (or, with a default on the device, "
                "the window's while the device has room) pass through as device memory, and "
                "the others are served as pinned host memory (placement host); see "
                "docs/placement.md (the managed cap)",
                wo_format_size(wo_uvm.cap.margin, b1, sizeof(b1)));
    wo_debug("managed cap: %s%s%s%s (%s managed live) %s", wo_format_size(size, b2, sizeof(b2)),
             name ? " for '" : "", name ? name : "", name ? "'" : "",
             wo_format_size(wo_uvm.cap.live, b3, sizeof(b3)), what);
}

/* Past the managed cap. A device placement is what the engine asked
 * for anyway: its own call allocates device memory. So is the
 * window's memory when the default is the device (no fit:) and the
 * device still has room for it beyond the margin: a KV cache or
 * workspace made before seal stays device memory (the cap counts
 * managed pages the engine wrote twice, once in free and once in
 * live, so it binds near half the free memory). Anything else
 * (host, managed, fit, or no room left) is served as pinned host
 * memory, the placement that needs no device memory: the engine
 * never sees an out-of-memory the shim caused. */
bool wo_place_capped(const struct wo_driver *d, struct wo_alloc *a, const struct wo_name *n,
                     const struct wo_tag *pending, size_t free_now, CUdeviceptr *p)
{
    const char *nm = n ? n->s : NULL;
    size_t size = a->size;
    bool device_room = free_now >= size && free_now - size >= wo_uvm.cap.margin;
    CUresult r;

    if ((n && pending->place == WO_PLACE_DEVICE) ||
        (!n && !wo_uvm.g->fit.enabled && wo_uvm.g->default_place == WO_PLACE_DEVICE &&
         device_room)) {
        wo_uvm.cap.passed++;
        wo_uvm.cap.passed_bytes += size;
        report_cap(nm, size, "passes through as device memory");
        return false;
    }
    r = wo_place_can_pin(d) ? wo_place_serve_pinned(d, a, nm ? nm : "(window)", NULL, 0, p)
                            : CUDA_ERROR_NOT_SUPPORTED;
    if (r != CUDA_SUCCESS) {
        char b[32];
        wo_uvm.cap.failed++;
        wo_uvm.cap.failed_bytes += size;
        wo_error("%s%s%s: no room for managed memory and pinning %s of host memory failed "
                 "(%s): the allocation passes through as device memory; raise the memlock "
                 "limit (ulimit -l) or place less on the device",
                 nm ? "'" : "a placeable allocation", nm ? nm : "", nm ? "'" : "",
                 wo_format_size(size, b, sizeof(b)), wo_cu_error_name(r));
        if (pending->charged)
            wo_host_budget_release(&wo_uvm.host_budget, size);
        return false;
    }
    a->capped = true;
    wo_uvm.cap.pinned++;
    wo_uvm.cap.pinned_bytes += size;
    wo_uvm.cap.pinned_largest = WO_MAX(wo_uvm.cap.pinned_largest, size);
    report_cap(nm, size, "served as pinned host memory");
    if (n)
        wo_place_count_stuck(n, pending->place, size);
    return true;
}
