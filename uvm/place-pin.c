/* uvm/place-pin.c: pinned host memory for placement (place-int.h): the
 * pages, registering them (or cuMemHostAlloc), serving an allocation with
 * them, and what a failure says (the memlock limit, most often). The
 * streaming executor's pinned copies (stream-pin.c) use the same pages. */
#include "uvm/place-int.h"

#include <sys/mman.h>
#include <sys/resource.h>

#include "core/log.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; older kernels: EINVAL, the pages are touched */
#endif

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
        return wo_quiet_free_host(d, host);
    wo_uvm_quiesce_begin();
    r = d->cuMemHostUnregister(host);
    wo_uvm_quiesce_end();
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

CUresult wo_place_serve_pinned(const struct wo_driver *d, struct wo_alloc *a, const char *name,
                               void *ready, size_t ready_len, CUdeviceptr *p)
{
    void *host = ready;
    size_t len = ready_len;
    uint64_t t0;
    CUresult r = CUDA_SUCCESS;

    if (!wo_uvm.sealed)
        wo_progress_begin(&wo_uvm.pin_progress, "pinning host memory");
    t0 = wo_now_ns();
    /* ready: pinned ahead of the loader (place-prepin.c) */
    if (!ready)
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

bool wo_place_can_pin(const struct wo_driver *d)
{
    return d->cuMemHostAlloc && d->cuMemHostGetDevicePointer_v2 && d->cuMemFreeHost;
}

bool wo_place_pin_named(const struct wo_driver *d, struct wo_alloc *a, const struct wo_name *n,
                        const struct wo_tag *pending, CUdeviceptr *p)
{
    CUresult r;

    if (pending->place != WO_PLACE_HOST || !n->pin || !wo_place_can_pin(d))
        return true;
    r = wo_place_serve_pinned(d, a, n->s, NULL, 0, p);
    if (r == CUDA_SUCCESS || a->kind == WO_KIND_PINNED)
        return true;
    wo_uvm.pin_failures++;
    if (wo_uvm.g->pin_fallback == WO_PIN_FALLBACK_STOP) {
        log_pin_failure(n->s, a->size, r, false);
        if (pending->charged)
            wo_host_budget_release(&wo_uvm.host_budget, a->size);
        return false;
    }
    log_pin_failure(n->s, a->size, r, true);
    wo_uvm.pin_fallbacks++;
    return true;
}
