/* uvm/place.c: allocation routing (the managed backend it places through:
 * place-apply.c).
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
 * the engine's.
 *
 * Placement's other ideas have files of their own, behind place-int.h:
 * pinned host memory (place-pin.c), the managed cap (place-cap.c), seal
 * (place-seal.c) and fit (place-fit.c). */
#include "uvm/place-int.h"

#include <inttypes.h>
#include <string.h>

#include "core/event.h"
#include "core/log.h"
#include "core/registry.h"
#include "uvm/picks.h"


/* Why a tag on an observed allocation cannot move it (one line, once each). */
void wo_report_unplaceable(const struct wo_alloc *a, const char *name)
{
    if (!wo_uvm.policy) {
        wo_log_once(WO_LOG_INFO, "tag '%s' recorded for stats only: no policy is loaded "
                                 "(WOFFLOAD_POLICY)", name);
    } else if (a->flags & WO_RANGE_ASYNC) {
        wo_log_once(WO_LOG_WARN,
                    "tag '%s' cannot move its memory: it came from a stream-ordered allocator "
                    "(cudaMallocAsync/cuMemAllocAsync), which the shim never serves; recorded for "
                    "stats only (see docs/placement.md)",
                    name);
    } else if (a->flags & (WO_RANGE_VMM | WO_RANGE_ENGINE_MANAGED)) {
        wo_log_once(WO_LOG_WARN,
                    "tag '%s' cannot move its memory: it is the engine's own %s memory; recorded "
                    "for stats only (for PyTorch, set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:"
                    "False; see docs/placement.md)",
                    name, a->flags & WO_RANGE_VMM ? "VMM (cuMemMap)" : "managed");
    } else if (a->below_min_size) {
        char b[32];
        wo_log_once(WO_LOG_WARN,
                    "tag '%s' cannot move its memory: its allocation (%llu bytes) was smaller "
                    "than the window's min_size (%s) when it was made; lower window.min_size, "
                    "see docs/placement.md (recorded for stats only; further such tags are "
                    "counted in the stats)",
                    name, (unsigned long long)a->size,
                    wo_format_size(wo_uvm.g->window.min_size, b, sizeof(b)));
    } else {
        wo_log_once(WO_LOG_WARN,
                    "tag '%s' cannot move its memory: it was allocated outside the placeable "
                    "window; open the window before loading, see docs/placement.md "
                    "(recorded for stats only; further such tags are counted in the stats)",
                    name);
    }
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
    int r;

    /* a bound range has no advice: its granules move when residency is due */
    if (a->kind == WO_KIND_BOUND)
        return residency ? wo_place_bind_tag(a, t) : 0;
    r = wo_place_apply_range(a, t->off, t->size, t->place, true, residency);

    if (r == 0)
        t->applied = true;
    if (residency) {
        int r2 = wo_place_sync();
        if (r == 0)
            r = r2;
    }
    return r;
}

int wo_place_tag_early(struct wo_alloc *a, struct wo_tag *t)
{
    /* An engine that names its weights before writing them (the ggml hook
     * tags a model buffer before load_all_data) then writes a host tensor
     * to the host: loading never holds it on the device, and what the
     * engine allocates next (llama.cpp's KV cache) finds the room. Device
     * tags keep what they had (the engine's writes land on the device
     * anyway; one that starts on the host waits for seal, which moves the
     * host tensors out first). Under fit nothing moves before seal: fit
     * chooses then, from every name. */
    if (t->place == WO_PLACE_DEVICE || wo_uvm.g->fit.enabled)
        return 0;
    /* Managed memory: the advice now; seal applies every tag again in
     * address order (t->applied stays false): residency, and the rule for
     * a page shared with a neighbour (the higher address wins). */
    if (a->kind == WO_KIND_MANAGED)
        return wo_place_apply_range(a, t->off, t->size, t->place, true, false);
    /* A late-bound range: the granules wholly inside the tag re-backed on
     * the host now (a granule shared with a neighbour is seal's: it goes
     * to the device if any of its bytes are placed there). */
    if (a->kind == WO_KIND_BOUND)
        return wo_place_bind_tag(a, t);
    return 0;
}

/* ---- allocation routing ----------------------------------------------------- */

static bool api_servable(int api)
{
    /* Stream-ordered allocations are freed stream-ordered: serving one with
     * managed memory and freeing it at once could pull memory from under
     * queued kernels. The engine's own managed and VMM memory it manages. */
    return api == WO_API_CUDA_MALLOC || api == WO_API_CU_MEM_ALLOC || api == WO_API_UNKNOWN;
}

/* Whether an allocation of size bytes by api is placeable now: inside a
 * tag scope (*scope: its name) or while the placeable window is open (and
 * at least its minimum size), and by an API whose memory the shim may
 * serve. */
static bool placeable(size_t size, int api, const char **scope)
{
    wo_uvm_ensure_init();
    if (!__atomic_load_n(&wo_uvm.placing, __ATOMIC_ACQUIRE) || size == 0)
        return false;
    *scope = wo_scope_current();
    if (!*scope && (!__atomic_load_n(&wo_uvm.window_open, __ATOMIC_ACQUIRE) ||
                    size < wo_uvm.g->window.min_size))
        return false;
    if (!api_servable(api)) {
        wo_log_once(WO_LOG_INFO,
                    "stream-ordered and engine-managed allocations are never placeable; they "
                    "pass through (see docs/placement.md)");
        return false;
    }
    return true;
}

/* The placement a served allocation starts with: its tag scope's (advice
 * at once; residency too after seal), else under fit: or a default off the
 * device the host until seal, else after seal the default. */
static void place_served(struct wo_alloc *a, struct wo_name *n, const struct wo_tag *pending)
{
    struct wo_tag *t;
    const struct wo_tag *clash;

    if (n) {
        if (wo_alloc_add_tag(a, 0, a->size, n, &t, &clash) == 0) {
            t->place = pending->place;
            t->charged = pending->charged;
            if (a->kind == WO_KIND_PINNED) {
                t->applied = true;
            } else {
                /* Known now: advice at once (residency waits for seal; fresh
                 * memory has no pages to move). After seal, residency too. */
                (void)wo_place_apply_tag(a, t, wo_uvm.sealed);
            }
            wo_consumer_push_tag(a, t);
        } else if (pending->charged) {
            wo_host_budget_release(&wo_uvm.host_budget, a->size);
        }
    } else if (!wo_uvm.sealed &&
               (wo_uvm.g->fit.enabled || wo_uvm.g->default_place != WO_PLACE_DEVICE)) {
        /* Under fit the device set is chosen at seal, from every name; with
         * a default off the device, untagged bytes go to the host anyway.
         * Until seal the engine's writes land on the host (advised before
         * the first write; measured: bench/results/managed-residency-*), so
         * the device holds nothing it should not, and loading a model
         * larger than the device does not fill it first. */
        (void)wo_place_apply_range(a, 0, a->size, WO_PLACE_HOST, true, false);
    } else if (wo_uvm.sealed) {
        /* The window is open after seal (opened by the API): the default applies now. */
        enum wo_placement dp = wo_uvm.g->default_place;
        if (dp == WO_PLACE_HOST && !wo_host_budget_take(&wo_uvm.host_budget, a->size))
            dp = WO_PLACE_DEVICE;
        else if (dp == WO_PLACE_HOST) {
            a->default_charged = true;
            a->default_bytes = a->size;
        }
        a->place = dp;
        if (a->kind == WO_KIND_BOUND)
            (void)wo_place_bind_seal(a, dp);
        else
            (void)wo_place_apply_range(a, 0, a->size, dp, true, false);
    }
}

int wo_uvm_alloc(size_t size, int api, CUdeviceptr *ret_ptr, CUresult *ret_res)
{
    const struct wo_driver *d;
    const char *scope_name;
    struct wo_alloc *a = NULL;
    struct wo_name *n = NULL;
    struct wo_tag pending;
    struct wo_range rr;
    CUdeviceptr p = 0;
    CUresult r;
    CUdevice dev;
    bool registered;
    int64_t headroom = 0;
    size_t free_now = 0;
    int served = 0;
    enum wo_placement expected = WO_PLACE_UNSET;

    if (!placeable(size, api, &scope_name))
        return 0;
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

    if (scope_name && !wo_place_pin_named(d, a, n, &pending, &p)) {
        *ret_ptr = 0;
        *ret_res = CUDA_ERROR_OUT_OF_MEMORY;
        served = 1;
        goto out;
    }
    /* Names announced before their bytes (place-expect.c): one the plan
     * puts on the host is served as pinned host memory now, and leaves the
     * cap's room to what stays on the device. */
    if (!scope_name)
        expected = wo_place_expect_claim(d, a);
    if (expected == WO_PLACE_HOST && !wo_place_bind_enabled() && wo_place_can_pin(d)) {
        /* a buffer pinned ahead of the loader, when one is ready */
        void *ready = NULL;
        size_t ready_len = 0;

        (void)wo_place_prepin_take(a->size, &ready, &ready_len);
        wo_place_expect_served(a, wo_place_serve_pinned(d, a, "(announced host tensor)", ready,
                                                        ready_len, &p) == CUDA_SUCCESS);
    }
    /* Late binding: a VMM range instead of managed memory (place-bind.c);
     * no managed cap, since its device backing is plain device memory.
     * Under WOFFLOAD_FIT_BIND all but what was served as pinned host
     * memory for a name the plan puts on the host: a yield after seal then
     * gives its device memory back at once. */
    if (a->kind == WO_KIND_MANAGED && (wo_place_bind_enabled() || wo_place_bind_fit()))
        (void)wo_place_bind_serve(d, a, scope_name ? pending.place : expected, &p);
    if (a->kind == WO_KIND_MANAGED && !wo_place_cap_fits(d, size, &headroom, &free_now) &&
        !wo_place_capped(d, a, n, &pending, free_now, &p))
        goto out;
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
    a->flags = WO_RANGE_PLACEABLE | (a->kind == WO_KIND_PINNED  ? WO_RANGE_HOST
                                     : a->kind == WO_KIND_BOUND ? WO_RANGE_VMM
                                                                : WO_RANGE_MANAGED);
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
        } else if (a->kind == WO_KIND_BOUND) {
            wo_place_bind_free(a);
        } else {
            wo_quiet_mem_free(d, p);
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
    place_served(a, n, &pending);
    wo_debug("served %s allocation of %zu bytes at 0x%llx%s%s%s",
             a->kind == WO_KIND_PINNED  ? "a pinned host"
             : a->kind == WO_KIND_BOUND ? "a late-bound"
                                        : "a managed",
             size,
             (unsigned long long)p, n ? " for '" : " (window)", n ? n->s : "", n ? "'" : "");
    *ret_ptr = p;
    *ret_res = CUDA_SUCCESS;
    served = 1;
    a = NULL;
out:
    if (n)
        wo_name_unref(n);
    if (a)
        wo_place_expect_release(a);
    free(a);
    pthread_mutex_unlock(&wo_uvm.lock);
    return served;
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
    if (a->kind == WO_KIND_PINNED) {
        wo_place_unpin(d, a, &r);
    } else if (a->kind == WO_KIND_BOUND) {
        wo_place_bind_free(a);
        r = CUDA_SUCCESS;
    } else {
        r = d->cuMemFree_v2(ptr);
    }
    if (r != CUDA_SUCCESS) {
        /* The memory is still there: keep its record so the engine can retry. */
        wo_error("freeing the placeable range 0x%llx failed: %s", (unsigned long long)ptr,
                 wo_cu_error_name(r));
    } else {
        wo_alloc_unlink(a);
        if (a->ours_in_registry)
            (void)wo_registry_remove(ptr, NULL);
        wo_place_expect_release(a);
        wo_alloc_destroy(a);
    }
    pthread_mutex_unlock(&wo_uvm.lock);
    *ret_res = r;
    return 1;
}

#define OOM_AGAIN_NS (5ull * 1000000000ull)

uint64_t wo_uvm_engine_oom(size_t size)
{
    const struct wo_driver *d = wo_uvm_driver();
    size_t free_b = 0, total_b = 0;
    uint64_t need = size, freed; /* short by rounding: the hook asks again */
    unsigned left = 0;
    char b1[32], b2[32];

    if (d && d->cuMemGetInfo_v2 && d->cuMemGetInfo_v2(&free_b, &total_b) == CUDA_SUCCESS)
        need = need > free_b ? need - free_b : 0;
    freed = wo_picks_give_back(d, need, &left);
    if (freed)
        wo_warn("the engine ran out of device memory (an allocation of %s): %s of hot experts "
                "given back, the allocation tried again; %u hot sets stay, no more are made",
                wo_format_size(size, b1, sizeof(b1)), wo_format_size(freed, b2, sizeof(b2)), left);
    if (freed < need && __atomic_load_n(&wo_uvm.state, __ATOMIC_ACQUIRE) == 1) {
        /* Then fit's weights (place-fit.c), but only at the second failure
         * within OOM_AGAIN_NS: an engine with a caching allocator (PyTorch)
         * answers the first by freeing its cached blocks and asking again,
         * which may be all it needed; weights moved for nothing would read
         * over PCIe for good. An engine that does not ask again gets the
         * failure it would have had without fit's weights on the device. */
        uint64_t now = wo_now_ns();

        pthread_mutex_lock(&wo_uvm.lock);
        if (wo_uvm.fit.oom_at && now - wo_uvm.fit.oom_at < OOM_AGAIN_NS) {
            freed += wo_place_fit_yield(need - freed, WO_FIT_YIELD_OOM);
            wo_uvm.fit.oom_at = 0;
        } else if (wo_uvm.sealed && wo_uvm.g && wo_uvm.g->fit.enabled) {
            wo_uvm.fit.oom_at = now;
        }
        pthread_mutex_unlock(&wo_uvm.lock);
    }
    return freed;
}

/* The engine's own device allocations counted against fit's reserve. */
static bool counted_after_seal(int api)
{
    return wo_uvm.sealed && wo_uvm.g && wo_uvm.g->fit.enabled && wo_uvm.fit.budget &&
           (api == WO_API_CU_MEM_ALLOC || api == WO_API_CUDA_MALLOC);
}

void wo_uvm_engine_alloc_ahead(size_t size)
{
    /* every engine allocation passes here: without fit, no lock (the
     * policy's globals are set before the state is published) */
    if (__atomic_load_n(&wo_uvm.state, __ATOMIC_ACQUIRE) != 1 || !wo_uvm.g ||
        !wo_uvm.g->fit.enabled)
        return;
    uint64_t need = 0;

    pthread_mutex_lock(&wo_uvm.lock);
    if (counted_after_seal(WO_API_CU_MEM_ALLOC)) {
        /* the context's own growth since seal (kernels, local memory: no
         * allocation shows it, wo_place_fit_sample measures it) takes the
         * same reserve: on the H200 0.46 GiB of a process that ran 1.02
         * GiB past the fit size (bench/results/bigload-20261203b-moe128-early-h200) */
        uint64_t will = wo_uvm.fit.engine_after + wo_uvm.fit.untracked + size;
        uint64_t over = will > wo_uvm.fit.reserve_bytes ? will - wo_uvm.fit.reserve_bytes : 0;

        if (over > wo_uvm.fit.yielded_bytes)
            (void)wo_place_fit_yield(over - wo_uvm.fit.yielded_bytes, WO_FIT_YIELD_RESERVE);
        need = wo_place_fit_short(size);
    }
    pthread_mutex_unlock(&wo_uvm.lock);
    if (need) {
        /* as at an out-of-memory (wo_uvm_engine_oom): hot experts first
         * (their own lock), then fit's late-bound weights */
        unsigned left = 0;
        uint64_t freed = wo_picks_give_back(wo_uvm_driver(), need, &left);

        if (freed < need) {
            pthread_mutex_lock(&wo_uvm.lock);
            (void)wo_place_fit_yield(need - freed, WO_FIT_YIELD_FREE);
            pthread_mutex_unlock(&wo_uvm.lock);
        }
    }
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
    if (counted_after_seal(api)) {
        a->after_seal = true;
        wo_uvm.fit.engine_after += size;
        wo_uvm.fit.engine_peak = WO_MAX(wo_uvm.fit.engine_peak, wo_uvm.fit.engine_after);
        wo_place_fit_sample_locked();
    }
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
        if (a->after_seal)
            wo_uvm.fit.engine_after -= WO_MIN(a->size, wo_uvm.fit.engine_after);
        wo_alloc_destroy(a);
    }
    pthread_mutex_unlock(&wo_uvm.lock);
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
    r = wo_place_apply_range(a, addr - a->base, size, p, true, true);
    if (r == 0)
        r = wo_place_sync();
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
