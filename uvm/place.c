/* uvm/place.c: allocation routing and the placement backends.
 *
 * A placeable allocation (tag scope, or the open window) is served here with
 * cuMemAllocManaged, so its placement can change later at the same address:
 *   device:  advise preferred=GPU, prefetch to the GPU at seal;
 *   host:    advise preferred=host + accessed-by=GPU, resident on the host:
 *            kernels read it in place over PCIe (zero-copy) at the speed of
 *            pinned memory (device-facts.md: 50-51 GB/s against 49-51);
 *   managed: the same advice as host, left to the prefetch thread.
 * The one exception is a tag scope whose name the policy sends to pinned host
 * memory (host, pin: true): its placement is known before the allocation and
 * can never change, so it gets cuMemHostAlloc(DEVICEMAP|PORTABLE).
 * docs/placement.md explains the choice. Every function here runs under
 * wo_uvm.lock; seal-time prefetches go to a private stream, never to one of
 * the engine's. */
#include "uvm/internal.h"
#include "uvm/plan-stream.h"

#include <inttypes.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "core/event.h"
#include "core/log.h"
#include "core/registry.h"

#define PAGE 4096u
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels: EINVAL, the pages are touched */
#endif

const char *wo_cu_error_name(CUresult r)
{
    const struct wo_driver *d = wo_uvm_driver();
    const char *s = NULL;

    if (d && d->cuGetErrorName && d->cuGetErrorName(r, &s) == CUDA_SUCCESS && s)
        return s;
    return "CUDA error";
}

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
static int apply_range(struct wo_alloc *a, uint64_t off, uint64_t len, enum wo_placement p,
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

static int sync_private(void)
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

void wo_place_decide(struct wo_alloc *a, struct wo_tag *t)
{
    struct wo_name *n = t->name;
    struct wo_match m;
    size_t ci;
    char b1[32], b2[32], b3[32];

    if (!wo_uvm.policy) {
        n->rule = -1;
        n->want = n->place = t->place = WO_PLACE_DEVICE;
        return;
    }
    (void)wo_policy_match(wo_uvm.policy, n->s, t->size, &m);
    n->rule = m.rule;
    n->want = m.place;
    n->pin = m.r ? m.r->pin : false;
    ci = m.rule < 0 ? wo_uvm.nrule_counts - 1 : (size_t)m.rule;
    wo_uvm.rule_counts[ci].names++;
    wo_uvm.rule_counts[ci].bytes += t->size;
    t->place = m.place;
    if (a->kind == WO_KIND_OBSERVED) {
        /* Nothing moves; the name keeps what the policy asked for stats. */
        n->place = m.place;
        return;
    }
    if (m.place == WO_PLACE_HOST) {
        if (wo_host_budget_take(&wo_uvm.host_budget, t->size)) {
            t->charged = true;
        } else {
            t->place = WO_PLACE_DEVICE;
            n->over_budget = true;
            wo_uvm.over_budget_tags++;
            wo_uvm.over_budget_bytes += t->size;
            wo_uvm.rule_counts[ci].over_budget_names++;
            wo_uvm.rule_counts[ci].over_budget_bytes += t->size;
            wo_debug("'%s' (%s) stays on the device: host budget spent (%s used of %s)", n->s,
                     wo_format_size(t->size, b1, sizeof(b1)),
                     wo_format_size(wo_uvm.host_budget.used, b2, sizeof(b2)),
                     wo_format_size(wo_uvm.host_budget.limit, b3, sizeof(b3)));
        }
    }
    n->place = t->place;
}

int wo_place_apply_tag(struct wo_alloc *a, struct wo_tag *t, bool residency)
{
    int r = apply_range(a, t->off, t->size, t->place, true, residency);

    if (r == 0)
        t->applied = true;
    if (residency) {
        int r2 = sync_private();
        if (r == 0)
            r = r2;
    }
    return r;
}

/* ---- allocation routing ----------------------------------------------------- */

static void log_pin_failure(const char *name, size_t size, CUresult r, bool fallback)
{
    struct rlimit rl;
    char lim[64] = "unknown", hard[64] = "unknown", asked[32];

    if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
        if (rl.rlim_cur == RLIM_INFINITY)
            snprintf(lim, sizeof(lim), "unlimited");
        else
            wo_format_size(rl.rlim_cur, lim, sizeof(lim));
        if (rl.rlim_max == RLIM_INFINITY)
            snprintf(hard, sizeof(hard), "unlimited");
        else
            wo_format_size(rl.rlim_max, hard, sizeof(hard));
    }
    wo_error("pinning %s (%zu bytes) of host memory for '%s' failed (%s): RLIMIT_MEMLOCK is %s "
             "(hard limit %s); raise it (ulimit -l, docker --ulimit memlock=-1) or the cgroup's "
             "memory limit; %s",
             wo_format_size(size, asked, sizeof(asked)), size, name, wo_cu_error_name(r), lim, hard,
             fallback ? "falling back to managed memory kept on host (pin_fallback: managed)"
                      : "the allocation fails with CUDA_ERROR_OUT_OF_MEMORY (pin_fallback: stop)");
}

static bool api_servable(int api)
{
    /* Stream-ordered allocations are freed stream-ordered: serving one with
     * managed memory and freeing it at once could pull memory from under
     * queued kernels. The engine's own managed and VMM memory it manages. */
    return api == WO_API_CUDA_MALLOC || api == WO_API_CU_MEM_ALLOC || api == WO_API_UNKNOWN;
}

/* The pages of a pin: an anonymous mapping advised to transparent huge
 * pages, MADV_DONTFORK as the driver's own pinned memory (a forked child
 * must not share pages the GPU maps: copy-on-write would leave the GPU
 * reading the child's stale page), and faulted in here, not inside
 * cuMemHostRegister: the driver zeroes untouched pages inside the call,
 * and the engine's launches on other threads wait for it meanwhile (2 GiB
 * on the H100: launches stopped for 387 ms; populated first, 45 ms:
 * bench/results/pin-contention-20261126-h100.txt). */
void *wo_pin_pages(size_t size, size_t *n)
{
    const size_t huge = 2 * WO_MiB;
    void *p;

    *n = WO_ALIGN_UP(size, huge);
    if (size < huge)
        return NULL;
    p = mmap(NULL, *n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    (void)madvise(p, *n, MADV_HUGEPAGE);
    (void)madvise(p, *n, MADV_DONTFORK);
    if (madvise(p, *n, MADV_POPULATE_WRITE) != 0)
        for (size_t off = 0; off < *n; off += PAGE)
            ((volatile char *)p)[off] = 0;
    return p;
}

/* Pinned host memory, the fast way first: the pages registered
 * (bench/results/pin-cost-*: 295 ms per GiB against cuMemHostAlloc's 634
 * on the lent H100, and the engine's copies into it run at the same
 * 9.4 GB/s). Falls back to cuMemHostAlloc. */
CUresult wo_pin_host(const struct wo_driver *d, size_t size, void *pages, size_t n, void **host,
                     size_t *len)
{
    CUresult r;

    *len = 0;
    if (!pages && d->cuMemHostRegister_v2 && d->cuMemHostUnregister)
        pages = wo_pin_pages(size, &n);
    if (pages && (!d->cuMemHostRegister_v2 || !d->cuMemHostUnregister)) {
        munmap(pages, n);
        pages = NULL;
    }
    if (pages) {
        r = d->cuMemHostRegister_v2(pages, n,
                                    CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE);
        if (r == CUDA_SUCCESS) {
            *host = pages;
            *len = n;
            return CUDA_SUCCESS;
        }
        munmap(pages, n);
        if (r == CUDA_ERROR_OUT_OF_MEMORY)
            return r; /* the memlock limit: cuMemHostAlloc would fail the same way */
    }
    return d->cuMemHostAlloc(host, size, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE);
}

CUresult wo_unpin_host(const struct wo_driver *d, void *host, size_t len)
{
    CUresult r;

    if (!len)
        return d->cuMemFreeHost(host);
    r = d->cuMemHostUnregister(host);
    if (r == CUDA_SUCCESS)
        munmap(host, len);
    /* else the pages stay: unmapped while registered, the GPU could keep a
     * stale mapping */
    return r;
}

void wo_place_unpin(const struct wo_driver *d, struct wo_alloc *a, CUresult *ret)
{
    CUresult r = wo_unpin_host(d, a->host, a->host_len);

    if (ret)
        *ret = r;
}

/* Serves a with pinned, device-mapped host memory: 0 and *p, or the driver's error. */
static CUresult serve_pinned(const struct wo_driver *d, struct wo_alloc *a, const char *name,
                             CUdeviceptr *p)
{
    void *host = NULL;
    size_t len = 0;
    uint64_t t0;
    CUresult r;

    if (!wo_uvm.sealed)
        wo_progress_begin(&wo_uvm.pin_progress, "pinning host memory");
    t0 = wo_now_ns();
    r = wo_pin_host(d, a->size, NULL, 0, &host, &len);
    wo_uvm.pin_ns += wo_now_ns() - t0;
    if (r != CUDA_SUCCESS)
        return r;
    a->host = host;
    a->host_len = len;
    r = d->cuMemHostGetDevicePointer_v2(p, host, 0);
    if (r != CUDA_SUCCESS) {
        wo_error("cuMemHostGetDevicePointer for '%s' failed: %s", name, wo_cu_error_name(r));
        wo_place_unpin(d, a, NULL);
        a->host = NULL;
        a->host_len = 0;
        return r;
    }
    a->kind = WO_KIND_PINNED;
    if (!wo_uvm.sealed)
        wo_progress_add(&wo_uvm.pin_progress, a->size);
    return CUDA_SUCCESS;
}

static bool can_pin(const struct wo_driver *d)
{
    return d->cuMemHostAlloc && d->cuMemHostGetDevicePointer_v2 && d->cuMemFreeHost;
}

/* The managed cap: may size more bytes of managed memory be asked for now?
 * Every live managed byte the shim served counts as if it were on the
 * device, because a page the engine writes lands there
 * (bench/results/managed-residency-20261125-h100.txt) and the driver cannot
 * say how many did: live + size <= free - margin. A failed cuMemGetInfo
 * counts as no room. */
static bool managed_fits(const struct wo_driver *d, size_t size, int64_t *headroom, size_t *free_ret)
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

int wo_uvm_alloc(size_t size, int api, CUdeviceptr *ret_ptr, CUresult *ret_res)
{
    const struct wo_driver *d;
    const char *scope_name;
    struct wo_alloc *a = NULL;
    struct wo_name *n = NULL;
    struct wo_tag pending, *t;
    const struct wo_tag *clash;
    struct wo_range rr;
    CUdeviceptr p = 0;
    CUresult r;
    CUdevice dev;
    bool registered;
    int64_t headroom = 0;
    size_t free_now = 0;
    int served = 0;

    wo_uvm_ensure_init();
    if (!__atomic_load_n(&wo_uvm.placing, __ATOMIC_ACQUIRE) || size == 0)
        return 0;
    scope_name = wo_scope_current();
    if (!scope_name && (!__atomic_load_n(&wo_uvm.window_open, __ATOMIC_ACQUIRE) ||
                        size < wo_uvm.g->window.min_size))
        return 0;
    if (!api_servable(api)) {
        wo_log_once(WO_LOG_INFO,
                    "stream-ordered and engine-managed allocations are never placeable; they "
                    "pass through (see docs/placement.md)");
        return 0;
    }
    d = wo_uvm_driver();
    if (!d || !d->cuMemAllocManaged || !d->cuMemFree_v2)
        return 0;

    pthread_mutex_lock(&wo_uvm.lock);
    if (!wo_uvm.placing)
        goto out;
    a = calloc(1, sizeof(*a));
    if (!a)
        goto out;
    a->size = size;
    a->api = api;
    a->kind = WO_KIND_MANAGED;
    if (d->cuCtxGetDevice && d->cuCtxGetDevice(&dev) == CUDA_SUCCESS)
        wo_uvm.device = dev;
    memset(&pending, 0, sizeof(pending));
    if (scope_name) {
        n = wo_name_get(scope_name);
        if (!n)
            goto out;
        wo_name_ref(n); /* held until the tag is made (or given up) */
        pending.name = n;
        pending.size = size;
        wo_place_decide(a, &pending);
    }

    if (scope_name && pending.place == WO_PLACE_HOST && n->pin && can_pin(d)) {
        r = serve_pinned(d, a, n->s, &p);
        if (r != CUDA_SUCCESS && a->kind != WO_KIND_PINNED) {
            wo_uvm.pin_failures++;
            if (wo_uvm.g->pin_fallback == WO_PIN_FALLBACK_STOP) {
                log_pin_failure(n->s, size, r, false);
                if (pending.charged)
                    wo_host_budget_release(&wo_uvm.host_budget, size);
                *ret_ptr = 0;
                *ret_res = CUDA_ERROR_OUT_OF_MEMORY;
                served = 1;
                goto out;
            }
            log_pin_failure(n->s, size, r, true);
            wo_uvm.pin_fallbacks++;
        }
    }
    if (a->kind == WO_KIND_MANAGED && !managed_fits(d, size, &headroom, &free_now)) {
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
        const char *nm = n ? n->s : NULL;
        bool device_room = free_now >= size && free_now - size >= wo_uvm.cap.margin;
        if ((scope_name && pending.place == WO_PLACE_DEVICE) ||
            (!scope_name && !wo_uvm.g->fit.enabled &&
             wo_uvm.g->default_place == WO_PLACE_DEVICE && device_room)) {
            wo_uvm.cap.passed++;
            wo_uvm.cap.passed_bytes += size;
            report_cap(nm, size, "passes through as device memory");
            goto out;
        }
        r = can_pin(d) ? serve_pinned(d, a, nm ? nm : "(window)", &p) : CUDA_ERROR_NOT_SUPPORTED;
        if (r != CUDA_SUCCESS) {
            char b[32];
            wo_uvm.cap.failed++;
            wo_uvm.cap.failed_bytes += size;
            wo_error("%s%s%s: no room for managed memory and pinning %s of host memory failed "
                     "(%s): the allocation passes through as device memory; raise the memlock "
                     "limit (ulimit -l) or place less on the device",
                     nm ? "'" : "a placeable allocation", nm ? nm : "", nm ? "'" : "",
                     wo_format_size(size, b, sizeof(b)), wo_cu_error_name(r));
            if (pending.charged)
                wo_host_budget_release(&wo_uvm.host_budget, size);
            goto out;
        }
        a->capped = true;
        wo_uvm.cap.pinned++;
        wo_uvm.cap.pinned_bytes += size;
        report_cap(nm, size, "served as pinned host memory");
        if (scope_name)
            wo_place_count_stuck(n, pending.place, size);
    }
    if (a->kind == WO_KIND_MANAGED) {
        r = d->cuMemAllocManaged(&p, size, CU_MEM_ATTACH_GLOBAL);
        if (r != CUDA_SUCCESS) {
            /* The engine gets the driver's answer, as it would for cudaMalloc. */
            wo_error("serving a placeable allocation of %zu bytes%s%s%s: cuMemAllocManaged "
                     "failed: %s",
                     size, n ? " for '" : "", n ? n->s : "", n ? "'" : "", wo_cu_error_name(r));
            if (pending.charged)
                wo_host_budget_release(&wo_uvm.host_budget, size);
            *ret_ptr = 0;
            *ret_res = r;
            served = 1;
            goto out;
        }
        wo_uvm.cap.live += size;
        wo_uvm.cap.peak = WO_MAX(wo_uvm.cap.peak, wo_uvm.cap.live);
        wo_uvm.cap.min_headroom = WO_MIN(wo_uvm.cap.min_headroom, headroom);
    }
    a->base = p;
    a->flags = WO_RANGE_PLACEABLE | (a->kind == WO_KIND_PINNED ? WO_RANGE_HOST : WO_RANGE_MANAGED);
    registered = wo_registry_add(p, size, a->flags, (uint32_t)wo_uvm.device, a, &rr) == 0;
    if (!registered || wo_alloc_insert(a) < 0) {
        /* A live range already holds this address (uvm/ and the registry
         * disagree), or no memory for the record: give the memory back and
         * let the engine's call go through. */
        wo_error("cannot register the placeable range [0x%llx, +%zu): passing it through",
                 (unsigned long long)p, size);
        if (registered)
            (void)wo_registry_remove(p, NULL);
        if (a->kind == WO_KIND_PINNED) {
            wo_place_unpin(d, a, NULL);
        } else {
            d->cuMemFree_v2(p);
            wo_uvm.cap.live -= size;
        }
        if (pending.charged)
            wo_host_budget_release(&wo_uvm.host_budget, size);
        goto out;
    }
    a->id = rr.id;
    a->gen = rr.gen;
    a->ours_in_registry = true;
    /* Served memory may leave the device (untagged bytes too): every launch
     * that touches it is an event (preload/launch.c). */
    (void)wo_registry_watch(a->id, a->gen);
    if (a->kind == WO_KIND_PINNED)
        wo_uvm.served_pinned++;
    else
        wo_uvm.served_managed++;
    if (n) {
        if (wo_alloc_add_tag(a, 0, size, n, &t, &clash) == 0) {
            t->place = pending.place;
            t->charged = pending.charged;
            if (a->kind == WO_KIND_PINNED) {
                t->applied = true;
            } else {
                /* Known now: advice at once (residency waits for seal; fresh
                 * memory has no pages to move). After seal, residency too. */
                (void)wo_place_apply_tag(a, t, wo_uvm.sealed);
            }
            wo_consumer_push_tag(a, t);
        } else if (pending.charged) {
            wo_host_budget_release(&wo_uvm.host_budget, size);
        }
    } else if (!wo_uvm.sealed &&
               (wo_uvm.g->fit.enabled || wo_uvm.g->default_place != WO_PLACE_DEVICE)) {
        /* Under fit the device set is chosen at seal, from every name; with
         * a default off the device, untagged bytes go to the host anyway.
         * Until seal the engine's writes land on the host (advised before
         * the first write; measured: bench/results/managed-residency-*), so
         * the device holds nothing it should not, and loading a model
         * larger than the device does not fill it first. */
        (void)apply_range(a, 0, size, WO_PLACE_HOST, true, false);
    } else if (wo_uvm.sealed) {
        /* The window is open after seal (opened by the API): the default applies now. */
        enum wo_placement dp = wo_uvm.g->default_place;
        if (dp == WO_PLACE_HOST && !wo_host_budget_take(&wo_uvm.host_budget, size))
            dp = WO_PLACE_DEVICE;
        else if (dp == WO_PLACE_HOST) {
            a->default_charged = true;
            a->default_bytes = size;
        }
        a->place = dp;
        (void)apply_range(a, 0, size, dp, true, false);
    }
    wo_debug("served %s allocation of %zu bytes at 0x%llx%s%s%s",
             a->kind == WO_KIND_PINNED ? "a pinned host" : "a managed", size,
             (unsigned long long)p, n ? " for '" : " (window)", n ? n->s : "", n ? "'" : "");
    *ret_ptr = p;
    *ret_res = CUDA_SUCCESS;
    served = 1;
    a = NULL;
out:
    if (n)
        wo_name_unref(n);
    free(a);
    pthread_mutex_unlock(&wo_uvm.lock);
    return served;
}

void wo_uvm_wait_cpu_read(uint64_t base, uint64_t size)
{
    while (wo_uvm.cpu_read_lo < base + size && base < wo_uvm.cpu_read_hi)
        pthread_cond_wait(&wo_uvm.cpu_read_cv, &wo_uvm.lock);
}

int wo_uvm_free(CUdeviceptr ptr, CUresult *ret_res)
{
    const struct wo_driver *d = wo_uvm_driver();
    struct wo_alloc *a;
    CUresult r;

    if (!ptr || __atomic_load_n(&wo_uvm.state, __ATOMIC_ACQUIRE) == 0)
        return 0;
    pthread_mutex_lock(&wo_uvm.lock);
    a = wo_alloc_find_base(ptr);
    if (!a || a->kind == WO_KIND_OBSERVED) {
        pthread_mutex_unlock(&wo_uvm.lock);
        return 0;
    }
    wo_uvm_wait_cpu_read(a->base, a->size);
    if (a->kind == WO_KIND_PINNED)
        wo_place_unpin(d, a, &r);
    else
        r = d->cuMemFree_v2(ptr);
    if (r != CUDA_SUCCESS) {
        /* The memory is still there: keep its record so the engine can retry. */
        wo_error("freeing the placeable range 0x%llx failed: %s", (unsigned long long)ptr,
                 wo_cu_error_name(r));
    } else {
        wo_alloc_unlink(a);
        if (a->ours_in_registry)
            (void)wo_registry_remove(ptr, NULL);
        wo_alloc_destroy(a);
    }
    pthread_mutex_unlock(&wo_uvm.lock);
    *ret_res = r;
    return 1;
}

void wo_uvm_observe_alloc(CUdeviceptr ptr, size_t size, uint32_t range_flags, int api)
{
    const char *scope_name = wo_scope_current();
    struct wo_alloc *a, *old;
    struct wo_range rr;
    int r;

    if (!ptr || !size)
        return;
    a = calloc(1, sizeof(*a));
    if (!a)
        return;
    a->base = ptr;
    a->size = size;
    a->api = api;
    a->kind = WO_KIND_OBSERVED;
    a->flags = range_flags & ~(uint32_t)WO_RANGE_PLACEABLE;
    pthread_mutex_lock(&wo_uvm.lock);
    a->below_min_size = wo_uvm.g && wo_uvm.window_open && size < wo_uvm.g->window.min_size;
    old = wo_alloc_find_base(ptr);
    if (old && old->kind != WO_KIND_OBSERVED) {
        /* The engine got this address from uvm/: it cannot be a new allocation. */
        wo_debug("observed allocation at 0x%llx, which uvm/ serves: ignored",
                 (unsigned long long)ptr);
        free(a);
        goto out;
    }
    if (old) {
        /* Its free went unseen and the address came back. */
        wo_alloc_unlink(old);
        if (old->ours_in_registry)
            (void)wo_registry_remove(ptr, NULL);
        wo_alloc_destroy(old);
    }
    /* preload/ may have registered the range itself; then uvm/ only keeps
     * the record and leaves the registry entry to it. */
    r = wo_registry_add(ptr, size, a->flags, (uint32_t)wo_uvm.device, a, &rr);
    if (r == 0) {
        a->ours_in_registry = true;
    } else if (wo_registry_find(ptr, &rr) < 0 || rr.base != ptr) {
        wo_debug("observed allocation [0x%llx, +%zu) overlaps a tracked range: not recorded",
                 (unsigned long long)ptr, size);
        free(a);
        goto out;
    }
    a->id = rr.id;
    a->gen = rr.gen;
    a->size = rr.size;
    if (wo_alloc_insert(a) < 0) {
        if (a->ours_in_registry)
            (void)wo_registry_remove(ptr, NULL);
        free(a);
        goto out;
    }
    if (scope_name) {
        /* Made in a tag scope but not servable (stream-ordered, the engine's
         * managed memory, no policy): the name is kept for stats and traces. */
        struct wo_name *n = wo_name_get(scope_name);
        struct wo_tag *t;
        const struct wo_tag *clash;
        if (n) {
            wo_name_ref(n);
            if (wo_alloc_add_tag(a, 0, a->size, n, &t, &clash) == 0) {
                wo_place_decide(a, t);
                n->unplaceable = true;
                wo_uvm.unplaceable_tags++;
                wo_report_unplaceable(a, n->s);
                wo_consumer_push_tag(a, t);
            }
            wo_name_unref(n);
        }
    }
out:
    pthread_mutex_unlock(&wo_uvm.lock);
}

void wo_uvm_observe_free(CUdeviceptr ptr, int api)
{
    struct wo_alloc *a;

    if (!ptr)
        return;
    pthread_mutex_lock(&wo_uvm.lock);
    a = wo_alloc_find_base(ptr);
    if (a && a->kind == WO_KIND_OBSERVED) {
        wo_uvm_wait_cpu_read(a->base, a->size);
        wo_alloc_unlink(a);
        if (a->ours_in_registry)
            (void)wo_registry_remove(ptr, NULL);
        wo_alloc_destroy(a);
    }
    pthread_mutex_unlock(&wo_uvm.lock);
}

/* ---- seal --------------------------------------------------------------------- */

struct seg {
    uint64_t off, len;
    enum wo_placement place;
    bool advised;
};

/* Applies a served allocation's placements: tags as decided, the gaps
 * between them the policy's default. Neighbours with the same placement
 * become one call: small advice and prefetch calls cost ~100 us each. */
static int seal_alloc(struct wo_alloc *a)
{
    enum wo_placement dp = wo_uvm.g->default_place;
    uint64_t gap = 0, pos = 0;
    struct seg cur = {0, 0, WO_PLACE_UNSET, true};
    int ret = 0, r;

    if (a->kind != WO_KIND_MANAGED)
        return 0;
    for (size_t i = 0; i < a->ntags; i++) {
        gap += a->tags[i].off - pos;
        pos = a->tags[i].off + a->tags[i].size;
    }
    gap += a->size - pos;
    if (gap > 0 && dp == WO_PLACE_HOST) {
        if (wo_host_budget_take(&wo_uvm.host_budget, gap)) {
            a->default_charged = true;
            a->default_bytes = gap;
        } else {
            dp = WO_PLACE_DEVICE;
            wo_uvm.over_budget_bytes += gap;
            wo_debug("untagged [0x%llx, +%llu) stays on the device: host budget spent",
                     (unsigned long long)a->base, (unsigned long long)gap);
        }
    }
    if (gap > 0) {
        size_t ci = wo_uvm.nrule_counts - 1;
        wo_uvm.rule_counts[ci].names++;
        wo_uvm.rule_counts[ci].bytes += gap;
    }
    a->place = dp;

    pos = 0;
    for (size_t i = 0; i <= a->ntags; i++) {
        struct seg next[2];
        int nn = 0;
        uint64_t toff = i < a->ntags ? a->tags[i].off : a->size;

        if (toff > pos)
            next[nn++] = (struct seg){pos, toff - pos, dp, false};
        if (i < a->ntags) {
            next[nn++] = (struct seg){a->tags[i].off, a->tags[i].size, a->tags[i].place,
                                      a->tags[i].applied};
            a->tags[i].applied = true;
            pos = a->tags[i].off + a->tags[i].size;
        }
        for (int k = 0; k < nn; k++) {
            if (cur.len && cur.place == next[k].place && cur.off + cur.len == next[k].off) {
                cur.len += next[k].len;
                cur.advised = cur.advised && next[k].advised;
                continue;
            }
            if (cur.len && (r = apply_range(a, cur.off, cur.len, cur.place, !cur.advised, true)) < 0 &&
                ret == 0)
                ret = r;
            cur = next[k];
        }
    }
    if (cur.len && (r = apply_range(a, cur.off, cur.len, cur.place, !cur.advised, true)) < 0 &&
        ret == 0)
        ret = r;
    return ret;
}

/* ---- fit (policy fit:, docs/policy.md) ------------------------------------------ */

static bool engine_device_memory(const struct wo_alloc *a)
{
    return a->kind == WO_KIND_OBSERVED &&
           !(a->flags & (WO_RANGE_HOST | WO_RANGE_MANAGED | WO_RANGE_ENGINE_MANAGED));
}

/* The device bytes fit keeps for the streaming executor's slots when the
 * policy asks for streaming (prefetch.mode stream or auto): a slot holds
 * the tensors fit may send off the device (embeddings aside: they are
 * gathered by token, never streamed), sized as the executor sizes it
 * (wo_stream_slot_size: 90% of the bytes; larger ones read in place), and
 * the executor wants prefetch.slots of them. Never more than half the
 * budget: below that, fewer slots (uvm/stream.c takes as many as fit, at
 * least two). */
static uint64_t fit_staging(const struct wo_fit_item *v, size_t n, uint64_t budget)
{
    const struct wo_policy_globals *g = wo_uvm.g;
    uint64_t largest = 0, want, *sizes;
    size_t k = 0;

    if (!g->prefetch.enabled || g->prefetch.mode == WO_PREFETCH_MODE_HOT_SET)
        return 0;
    sizes = malloc((n ? n : 1) * sizeof(*sizes));
    if (!sizes)
        return 0;
    /* every tensor fit decides, pinned ones too: those are off the device
     * already, and exactly what the slots will carry */
    for (size_t i = 0; i < n; i++)
        if (v[i].fixed == WO_PLACE_UNSET && !wo_stream_gathered(v[i].name))
            sizes[k++] = v[i].size;
    largest = wo_stream_slot_size(sizes, k);
    free(sizes);
    want = largest * (g->prefetch.slots ? g->prefetch.slots : WO_STREAM_SLOTS_DEFAULT);
    while (want > budget / 2 && want > largest * WO_STREAM_SLOTS_MIN)
        want -= largest;
    return want <= budget / 2 ? want : 0;
}

/* Chooses, from every name the engine tagged, what stays on the device
 * under fit: (policy/fit.c decides; this gathers the items and applies the
 * answer to the tags, before seal_alloc() makes it so). Names an explicit
 * rule placed keep it; pinned memory (the managed cap) cannot move. */
static void place_fit(size_t free_b, size_t total_b)
{
    const struct wo_fit *fit = &wo_uvm.g->fit;
    struct wo_fit_item *v;
    struct wo_tag **tv;
    size_t n = 0;
    uint64_t engine = 0, resident = 0, chosen = 0, rest = 0, budget, reserve, weights, staging;
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32];

    for (size_t i = 0; i < wo_uvm.alloc_hash_size; i++)
        for (struct wo_alloc *a = wo_uvm.alloc_hash[i]; a; a = a->next)
            n += a->kind == WO_KIND_OBSERVED ? 0 : a->ntags;
    v = calloc(n ? n : 1, sizeof(*v));
    tv = calloc(n ? n : 1, sizeof(*tv));
    if (!v || !tv) {
        wo_error("fit: out of memory; the policy's placements apply as written");
        goto out;
    }
    n = 0;
    for (size_t i = 0; i < wo_uvm.alloc_hash_size; i++) {
        for (struct wo_alloc *a = wo_uvm.alloc_hash[i]; a; a = a->next) {
            if (engine_device_memory(a))
                engine += a->size;
            if (a->kind == WO_KIND_OBSERVED)
                continue;
            for (size_t k = 0; k < a->ntags; k++) {
                struct wo_tag *t = &a->tags[k];
                tv[n] = t;
                v[n] = (struct wo_fit_item){
                    .name = t->name->s,
                    .size = t->size,
                    .weight = -1,
                    .fixed = t->name->rule >= 0 ? t->place : WO_PLACE_UNSET,
                    .movable = a->kind == WO_KIND_MANAGED,
                };
                /* A name a rule sent to the device was advised there when it
                 * was made, so the engine's writes put its pages there and
                 * the free memory already lacks them (assumed: an engine
                 * that has not written all of it yet leaves less room than
                 * this counts, and the budget is that much too high). */
                if (a->kind == WO_KIND_MANAGED && v[n].fixed == WO_PLACE_DEVICE)
                    resident += t->size;
                n++;
            }
        }
    }
    budget = wo_fit_budget(fit, total_b, (uint64_t)free_b + resident, engine);
    /* the engine's allocations after seal come out of the same budget:
     * bigload's peak device memory was its weights plus 0.23-0.35 GiB */
    reserve = wo_fit_reserve(fit, budget);
    weights = budget - reserve;
    staging = fit_staging(v, n, weights);
    chosen = wo_fit_choose(fit, v, n, weights - staging);
    for (size_t i = 0; i < n; i++) {
        struct wo_tag *t = tv[i];
        if (v[i].fixed != WO_PLACE_UNSET)
            continue;
        if (t->place != v[i].out)
            t->applied = false; /* seal_alloc() applies the new placement */
        t->place = t->name->place = v[i].out;
        if (v[i].out != WO_PLACE_DEVICE)
            rest += t->size;
    }
    wo_uvm.fit.budget = budget;
    wo_uvm.fit.device_bytes = chosen;
    wo_uvm.fit.rest_bytes = rest;
    wo_uvm.fit.engine_bytes = engine;
    wo_uvm.fit.names = n;
    wo_uvm.fit.staging_bytes = staging;
    wo_uvm.fit.reserve_bytes = reserve;
    /* The prefetcher keeps managed bytes, and the streaming executor its
     * slots, within what fit left the weights (with no room kept for slots
     * there are none: the device stays within the fit budget). */
    if (wo_uvm.g->device_budget.kind == WO_BUDGET_AUTO)
        wo_uvm.device_budget = weights > chosen ? weights - chosen : 0;
    wo_log_write(WO_LOG_OFF,
                 "fit: %s of weights on the device (budget %s: the fit size less %s the engine "
                 "holds, within the free memory less keep_free; %s of it kept for what the "
                 "engine allocates after seal, %s for staging slots), %s %s over %zu names",
                 wo_format_size(chosen, b1, sizeof(b1)), wo_format_size(budget, b2, sizeof(b2)),
                 wo_format_size(engine, b3, sizeof(b3)), wo_format_size(reserve, b6, sizeof(b6)),
                 wo_format_size(staging, b5, sizeof(b5)), wo_format_size(rest, b4, sizeof(b4)),
                 wo_placement_to_string(fit->rest), n);
out:
    free(v);
    free(tv);
}

int wo_place_seal(void)
{
    const struct wo_driver *d = wo_uvm_driver();
    size_t free_b = 0, total_b = 0;
    int ret = 0, r;
    char b1[32], b2[32];

    if (wo_uvm.policy && d && d->cuMemGetInfo_v2 &&
        d->cuMemGetInfo_v2(&free_b, &total_b) == CUDA_SUCCESS) {
        wo_uvm.device_total = total_b;
        wo_uvm.device_budget = wo_policy_device_budget(wo_uvm.policy, total_b, free_b);
        if (wo_uvm.g->fit.enabled)
            place_fit(free_b, total_b);
        wo_debug("device budget for managed memory: %s of %s",
                 wo_format_size(wo_uvm.device_budget, b1, sizeof(b1)),
                 wo_format_size(total_b, b2, sizeof(b2)));
    }
    for (size_t i = 0; i < wo_uvm.alloc_hash_size; i++)
        for (struct wo_alloc *a = wo_uvm.alloc_hash[i]; a; a = a->next)
            if ((r = seal_alloc(a)) < 0 && ret == 0)
                ret = r;
    if ((r = sync_private()) < 0 && ret == 0)
        ret = r;
    return ret;
}

/* ---- explicit moves ------------------------------------------------------------- */

int wo_uvm_place_range(uint64_t addr, uint64_t size, enum wo_placement p)
{
    struct wo_alloc *a;
    int r;

    if (size == 0 || p <= WO_PLACE_UNSET || p >= WO_PLACE_MAX)
        return -EINVAL;
    pthread_mutex_lock(&wo_uvm.lock);
    a = wo_alloc_find_addr(addr);
    if (!a || a->kind != WO_KIND_MANAGED) {
        r = -ENOENT;
        goto out;
    }
    if (size > a->size - (addr - a->base)) {
        r = -ERANGE;
        goto out;
    }
    r = apply_range(a, addr - a->base, size, p, true, true);
    if (r == 0)
        r = sync_private();
    if (r == 0) {
        /* Keep the books: tags wholly inside the range now live at p. */
        for (size_t i = 0; i < a->ntags; i++) {
            struct wo_tag *t = &a->tags[i];
            if (t->off >= addr - a->base && t->off + t->size <= addr - a->base + size) {
                t->place = p;
                t->name->place = p;
            }
        }
        if (addr == a->base && size == a->size)
            a->place = p;
    }
out:
    pthread_mutex_unlock(&wo_uvm.lock);
    return r;
}

/* ---- for the prefetcher ----------------------------------------------------------- */

/* One callback per managed piece of a: its managed tags, and the untagged
 * gaps when the allocation's default placement is managed. */
static bool wanted(enum wo_placement p, bool host)
{
    return p == WO_PLACE_MANAGED || (host && p == WO_PLACE_HOST);
}

static int foreach_managed_alloc(const struct wo_alloc *a,
                                 int (*fn)(const struct wo_uvm_segment *s, void *ud), void *ud,
                                 bool host)
{
    uint64_t pos = 0;
    int ret = 0;

    for (size_t k = 0; k <= a->ntags && !ret; k++) {
        uint64_t toff = k < a->ntags ? a->tags[k].off : a->size;
        struct wo_uvm_segment s = {.id = a->id, .gen = a->gen, .slices = WO_SLICES_AUTO};

        if (toff > pos && wanted(a->place, host)) {
            s.place = a->place;
            s.base = a->base + pos;
            s.offset = pos;
            s.size = toff - pos;
            s.name = "(untagged)";
            s.untagged = true;
            ret = fn(&s, ud);
        }
        if (k < a->ntags && !ret) {
            const struct wo_tag *t = &a->tags[k];
            const struct wo_rule *rule =
                t->name->rule >= 0 ? wo_policy_rule(wo_uvm.policy, (size_t)t->name->rule) : NULL;
            pos = t->off + t->size;
            if (!wanted(t->place, host))
                continue;
            s.place = t->place;
            s.untagged = false;
            s.base = a->base + t->off;
            s.offset = t->off;
            s.size = t->size;
            s.name = t->name->s;
            s.priority = rule ? rule->priority : 0;
            s.slices = rule ? rule->slices : WO_SLICES_AUTO;
            ret = fn(&s, ud);
        }
    }
    return ret;
}

int wo_uvm_foreach_managed(int (*fn)(const struct wo_uvm_segment *s, void *ud), void *ud)
{
    int ret = 0;

    pthread_mutex_lock(&wo_uvm.lock);
    for (size_t i = 0; i < wo_uvm.alloc_hash_size && !ret; i++)
        for (struct wo_alloc *a = wo_uvm.alloc_hash[i]; a && !ret; a = a->next)
            if (a->kind == WO_KIND_MANAGED)
                ret = foreach_managed_alloc(a, fn, ud, false);
    pthread_mutex_unlock(&wo_uvm.lock);
    return ret;
}

int wo_uvm_foreach_offdevice(int (*fn)(const struct wo_uvm_segment *s, void *ud), void *ud)
{
    int ret = 0;

    pthread_mutex_lock(&wo_uvm.lock);
    for (size_t i = 0; i < wo_uvm.alloc_hash_size && !ret; i++)
        for (struct wo_alloc *a = wo_uvm.alloc_hash[i]; a && !ret; a = a->next)
            if (a->kind == WO_KIND_MANAGED || a->kind == WO_KIND_PINNED)
                ret = foreach_managed_alloc(a, fn, ud, true);
    pthread_mutex_unlock(&wo_uvm.lock);
    return ret;
}

uint64_t wo_uvm_device_budget(void)
{
    return __atomic_load_n(&wo_uvm.device_budget, __ATOMIC_RELAXED);
}

const struct wo_policy *wo_uvm_policy(void)
{
    return wo_uvm.policy;
}
