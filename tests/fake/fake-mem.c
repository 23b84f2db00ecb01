/* tests/fake/fake-mem.c: the fake driver's memory: device, async, managed,
 * pinned and registered allocations (all ordinary host memory from mmap, so
 * host-function kernels can dereference "device" pointers), the memcpy and
 * memset families, managed-memory advice and residency, pointer and range
 * attributes, and the VMM calls (memfd-backed physical handles mapped into
 * PROT_NONE reservations).
 *
 * One sorted array of allocations under fk_lock; lookups by containing
 * address are binary searches. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fake-priv.h"

/* Internal kind: a cuMemMap'ed range (its bytes belong to a VMM handle). */
#define FK_K_MAPPING 100

struct page {
    uint8_t resident;    /* bit 0 host, bit 1+d device d */
    uint8_t accessed_by; /* same bits */
    int8_t preferred;    /* ordinal, -1 cpu, -2 none */
    int8_t last_prefetch;
    uint8_t read_mostly;
};

struct vmm_handle {
    uint32_t magic;
    int fd;
    size_t size;
    int device;
    int maps;
    bool released;
    struct vmm_handle *next;
};
#define VMM_MAGIC 0x766d6d68u

struct alloc {
    uintptr_t base;
    size_t size;   /* as requested */
    size_t maplen; /* mmap'ed length (page multiple) */
    int kind;
    unsigned flags;
    int device;
    uint64_t id;
    struct page *pages;       /* managed only */
    struct vmm_handle *vmm;   /* mappings only */
};

struct resv {
    uintptr_t base;
    size_t size;
    struct resv *next;
};

static struct alloc **allocs;
static size_t nallocs, capallocs;
static struct vmm_handle *handles;
static struct resv *resvs;
static uint64_t next_id = 1;
static uint64_t dev_bytes;        /* device + async + VMM handles */
static uint64_t managed_dev_pages; /* managed pages with a device copy */
/* WOFAKE_UVM_CACHE=1: the device memory of managed pages that lost their
 * device copy stays held, as UVM's cache does on driver 580 (bench/
 * uvm-release.cu on the H200): a managed page that comes to the device
 * takes one back, and an allocation takes them only once the free memory
 * is not enough. */
static uint64_t uvm_cached_pages;
static uint64_t migrated[9];       /* bytes that gained a copy: [0] host, [1+d] device d */
static uint64_t faults[9];         /* pages that faulted on access from a location */
static uint64_t remote[9];         /* bytes read or written in place over the bus */

/* mlock/munlock by system call: sanitizer runtimes intercept the libc
 * functions and turn them into no-ops, which would hide the RLIMIT_MEMLOCK
 * failures tests rely on. */
static int lock_pages(void *p, size_t n)
{
    return (int)syscall(SYS_mlock, p, n);
}

static int unlock_pages(void *p, size_t n)
{
    return (int)syscall(SYS_munlock, p, n);
}

/* --- the map ------------------------------------------------------------- */

/* Index of the first allocation with base > p. */
static size_t upper_locked(uintptr_t p)
{
    size_t lo = 0, hi = nallocs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (allocs[mid]->base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static struct alloc *find_locked(uintptr_t p)
{
    size_t i = upper_locked(p);
    if (i == 0)
        return NULL;
    struct alloc *a = allocs[i - 1];
    return p < a->base + a->size ? a : NULL;
}

/* The allocation holding all of [p, p+n) (n 0 counts as 1). */
static struct alloc *find_range_locked(uintptr_t p, size_t n)
{
    struct alloc *a = find_locked(p);
    if (!a)
        return NULL;
    if (n <= a->base + a->size - p)
        return a;
    /* VMM: a range may run across mappings that follow one another without
     * a gap (PyTorch's expandable segments copy tensors that span several
     * handles); the first mapping answers for the range */
    if (a->kind != FK_K_MAPPING)
        return NULL;
    for (uintptr_t end = a->base + a->size; end - p < n;) {
        struct alloc *b = find_locked(end);
        if (!b || b->kind != FK_K_MAPPING || b->base != end)
            return NULL;
        end = b->base + b->size;
    }
    return a;
}

static int insert_locked(struct alloc *a)
{
    if (nallocs == capallocs) {
        size_t cap = capallocs ? capallocs * 2 : 64;
        struct alloc **n = realloc(allocs, cap * sizeof(*n));
        if (!n)
            return -ENOMEM;
        allocs = n;
        capallocs = cap;
    }
    size_t i = upper_locked(a->base);
    memmove(&allocs[i + 1], &allocs[i], (nallocs - i) * sizeof(*allocs));
    allocs[i] = a;
    nallocs++;
    a->id = next_id++;
    return 0;
}

static void remove_locked(struct alloc *a)
{
    size_t i = upper_locked(a->base);
    if (i == 0 || allocs[i - 1] != a)
        return;
    i--;
    memmove(&allocs[i], &allocs[i + 1], (nallocs - i - 1) * sizeof(*allocs));
    nallocs--;
}

int fk_mem_kind(uintptr_t p, size_t n)
{
    fk_lock_();
    struct alloc *a = find_range_locked(p, n);
    int k = a ? a->kind : -1;
    fk_unlock_();
    return k;
}

/* Live managed bytes, for the managed guard (WOFAKE_MANAGED_GUARD). */
static uint64_t managed_bytes;

void fk_dev_bytes_add(int64_t delta)
{
    fk_lock_();
    dev_bytes += (uint64_t)delta;
    fk_unlock_();
}

uint64_t fk_device_used_locked(void)
{
    return dev_bytes + (managed_dev_pages + uvm_cached_pages) * FK_PAGE;
}

/* Whether size more bytes of device memory fit: the free memory first,
 * then UVM's cached pages, taken back as needed. */
static bool device_room_locked(uint64_t size)
{
    uint64_t held = dev_bytes + managed_dev_pages * FK_PAGE, over;

    if (held + size > fk_total_mem)
        return false;
    over = held + uvm_cached_pages * FK_PAGE + size;
    if (over > fk_total_mem) {
        uint64_t pages = (over - fk_total_mem + FK_PAGE - 1) / FK_PAGE;
        uvm_cached_pages -= pages < uvm_cached_pages ? pages : uvm_cached_pages;
    }
    return true;
}

static size_t page_round(size_t n)
{
    return (n + FK_PAGE - 1) & ~(size_t)(FK_PAGE - 1);
}

static void *map_anon(size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static uint8_t loc_bit(int loc)
{
    return loc < 0 ? 1u : (uint8_t)(1u << (1 + loc));
}

/* Current device of the calling thread's context (context-bound calls
 * have already checked there is one). */
static int cur_dev(void)
{
    CUcontext c = fk_current_ctx();
    return c ? c->device : 0;
}

/* Creates and registers an allocation of `kind`; *ret the base. */
static CUresult new_alloc(int kind, size_t size, unsigned flags, uintptr_t *ret)
{
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t len = page_round(size);
    if (len < size)
        return CUDA_ERROR_OUT_OF_MEMORY;
    bool counted = kind == FAKECUDA_DEVICE || kind == FAKECUDA_ASYNC;
    struct alloc *a = calloc(1, sizeof(*a));
    if (!a)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (kind == FAKECUDA_MANAGED) {
        a->pages = malloc((len / FK_PAGE) * sizeof(struct page));
        if (!a->pages) {
            free(a);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        for (size_t i = 0; i < len / FK_PAGE; i++)
            a->pages[i] = (struct page){ .preferred = CU_DEVICE_INVALID,
                                         .last_prefetch = CU_DEVICE_INVALID };
    }
    fk_lock_();
    if (counted && !device_room_locked(size)) {
        fk_unlock_();
        free(a->pages);
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (kind == FAKECUDA_MANAGED && fk_managed_guard) {
        /* The lent GPU's safety rule: never more managed memory than the
         * device has free. A real driver would hang later; the fake refuses
         * at once and says so, so a test sees the violation. */
        uint64_t used = fk_device_used_locked();
        uint64_t free_now = used >= fk_total_mem ? 0 : fk_total_mem - used;
        if (managed_bytes + size > free_now) {
            fk_managed_guard_violations++;
            fk_unlock_();
            fprintf(stderr,
                    "fakecuda: managed guard: %zu more bytes of managed memory would make %llu "
                    "live, more than the %llu bytes free\n",
                    size, (unsigned long long)(managed_bytes + size), (unsigned long long)free_now);
            free(a->pages);
            free(a);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    if (counted)
        dev_bytes += size; /* reserve before mapping, so racing allocs cannot overshoot */
    if (kind == FAKECUDA_MANAGED)
        managed_bytes += size;
    fk_unlock_();

    void *p = map_anon(len);
    if (p && kind == FAKECUDA_HOST && lock_pages(p, len) != 0) {
        /* What a real pinning failure looks like to the caller. */
        munmap(p, len);
        p = NULL;
    }
    fk_lock_();
    if (!p) {
        if (kind == FAKECUDA_MANAGED)
            managed_bytes -= size;
        if (counted)
            dev_bytes -= size;
        fk_unlock_();
        free(a->pages);
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->base = (uintptr_t)p;
    a->size = size;
    a->maplen = len;
    a->kind = kind;
    a->flags = flags;
    a->device = cur_dev();
    if (insert_locked(a) < 0) {
        if (kind == FAKECUDA_MANAGED)
            managed_bytes -= size;
        if (counted)
            dev_bytes -= size;
        fk_unlock_();
        munmap(p, len);
        free(a->pages);
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    fk_unlock_();
    *ret = (uintptr_t)p;
    return CUDA_SUCCESS;
}

static void destroy_locked(struct alloc *a)
{
    remove_locked(a);
    if (a->kind == FAKECUDA_DEVICE || a->kind == FAKECUDA_ASYNC)
        dev_bytes -= a->size;
    if (a->kind == FAKECUDA_MANAGED)
        managed_bytes -= a->size;
    if (a->pages) {
        for (size_t i = 0; i < a->maplen / FK_PAGE; i++)
            if (a->pages[i].resident & ~1u)
                managed_dev_pages--;
        free(a->pages);
    }
    if (a->kind == FAKECUDA_HOST)
        unlock_pages((void *)a->base, a->maplen);
    munmap((void *)a->base, a->maplen);
    free(a);
}

/* Frees the allocation starting at p if its kind is in `kinds` (bitmask of
 * 1 << kind). */
static CUresult free_kind(uintptr_t p, unsigned kinds)
{
    fk_lock_();
    struct alloc *a = find_locked(p);
    if (!a || a->base != p || !(kinds & (1u << a->kind))) {
        fk_unlock_();
        return CUDA_ERROR_INVALID_VALUE;
    }
    destroy_locked(a);
    fk_unlock_();
    return CUDA_SUCCESS;
}

void fk_mem_free_locked(uintptr_t p)
{
    struct alloc *a = find_locked(p);
    if (a && a->base == p)
        destroy_locked(a);
}

/* --- allocation entry points --------------------------------------------- */

FK_EXPORT CUresult cuMemGetInfo_v2(size_t *free_, size_t *total)
{
    FK_ENTER(cuMemGetInfo_v2);
    fk_lock_();
    uint64_t used = fk_device_used_locked();
    fk_unlock_();
    if (free_)
        *free_ = used >= fk_total_mem ? 0 : fk_total_mem - used;
    if (total)
        *total = fk_total_mem;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    FK_ENTER(cuMemAlloc_v2);
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_capture_check_unsafe();
    if (r != CUDA_SUCCESS)
        return r;
    uintptr_t p;
    r = new_alloc(FAKECUDA_DEVICE, bytesize, 0, &p);
    if (r == CUDA_SUCCESS)
        *dptr = p;
    return r;
}

FK_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    FK_ENTER(cuMemFree_v2);
    CUresult r = fk_capture_check_unsafe();
    if (r != CUDA_SUCCESS)
        return r;
    if (dptr == 0)
        return CUDA_SUCCESS; /* as measured on driver 580 */
    r = fk_quiet_wait();
    if (r != CUDA_SUCCESS)
        return r;
    return free_kind(dptr, 1u << FAKECUDA_DEVICE | 1u << FAKECUDA_ASYNC | 1u << FAKECUDA_MANAGED);
}

static CUresult alloc_async(CUdeviceptr *dptr, size_t bytesize, CUstream s, bool pt)
{
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    struct fk_capture *cap;
    CUresult r = fk_stream_begin_op(s, pt, &cap);
    if (r == CUDA_SUCCESS) /* a stream behind: after its work */
        r = fk_capture_settle(&cap);
    /* Outside the capture it belongs to, a stream-ordered allocation is an
     * unsafe call (driver 580: 900 from another thread's own stream). */
    if (r == CUDA_SUCCESS && !cap)
        r = fk_capture_check_unsafe();
    if (r != CUDA_SUCCESS)
        return r;
    /* Inside a capture the allocation is made now and lives until freed
     * outside the graph (enough for graphs that use it), and a memory
     * allocation node records it (what the shim's graph replay reads); it
     * takes the address of one the capture freed before it, when one fits,
     * as the driver does. */
    uintptr_t p = cap ? (uintptr_t)fk_capture_reuse(cap, bytesize) : 0;
    if (!p)
        r = new_alloc(FAKECUDA_ASYNC, bytesize, 0, &p);
    if (r == CUDA_SUCCESS && cap) {
        struct fk_op op = {.type = FK_OP_ALLOC, .mem = {.dptr = p, .size = bytesize}};
        r = fk_capture_add(cap, &op);
        if (r != CUDA_SUCCESS)
            return r;
    }
    if (r == CUDA_SUCCESS)
        *dptr = p;
    return r;
}

FK_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    FK_ENTER(cuMemAllocAsync);
    return alloc_async(dptr, bytesize, hStream, false);
}

FK_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    FK_ENTER(cuMemAllocAsync_ptsz);
    return alloc_async(dptr, bytesize, hStream, true);
}

static CUresult free_async(CUdeviceptr dptr, CUstream s, bool pt)
{
    struct fk_capture *cap;
    CUresult r = fk_stream_begin_op(s, pt, &cap);
    if (r == CUDA_SUCCESS) /* a stream behind: after its work */
        r = fk_capture_settle(&cap);
    if (r == CUDA_SUCCESS && !cap)
        r = fk_capture_check_unsafe(); /* like cuMemAllocAsync (not probed) */
    if (r != CUDA_SUCCESS)
        return r;
    if (cap) {
        /* A free captured into a graph: the memory stays valid (the graph
         * may use it); validated, and a memory free node added. */
        struct fk_op op = {.type = FK_OP_FREE, .mem = {.dptr = dptr}};
        if (fk_mem_kind(dptr, 1) < 0)
            return CUDA_ERROR_INVALID_VALUE;
        return fk_capture_add(cap, &op);
    }
    return free_kind(dptr, 1u << FAKECUDA_DEVICE | 1u << FAKECUDA_ASYNC);
}

FK_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    FK_ENTER(cuMemFreeAsync);
    return free_async(dptr, hStream, false);
}

FK_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    FK_ENTER(cuMemFreeAsync_ptsz);
    return free_async(dptr, hStream, true);
}

FK_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    FK_ENTER(cuMemAllocManaged);
    if (!dptr || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_capture_check_unsafe();
    if (r != CUDA_SUCCESS)
        return r;
    uintptr_t p;
    r = new_alloc(FAKECUDA_MANAGED, bytesize, flags, &p);
    if (r == CUDA_SUCCESS)
        *dptr = p;
    return r;
}

static CUresult host_alloc(void **pp, size_t bytesize, unsigned int flags)
{
    if (!pp)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                            CU_MEMHOSTALLOC_WRITECOMBINED))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_capture_check_unsafe();
    if (r != CUDA_SUCCESS)
        return r;
    uintptr_t p;
    r = new_alloc(FAKECUDA_HOST, bytesize, flags, &p);
    if (r == CUDA_SUCCESS)
        *pp = (void *)p;
    return r;
}

FK_EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    FK_ENTER(cuMemHostAlloc);
    return host_alloc(pp, bytesize, Flags);
}

FK_EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    FK_ENTER(cuMemAllocHost_v2);
    return host_alloc(pp, bytesize, 0);
}

/* Frees of pinned host memory wait for the context's work, as on the GPU
 * (cudaFreeHost synchronizes): under the quiet lock, as cuMemFree */
FK_EXPORT CUresult cuMemFreeHost(void *p)
{
    FK_ENTER(cuMemFreeHost);
    CUresult r = fk_capture_check_unsafe();
    if (r != CUDA_SUCCESS)
        return r;
    r = fk_quiet_wait();
    if (r != CUDA_SUCCESS)
        return r;
    return free_kind((uintptr_t)p, 1u << FAKECUDA_HOST);
}

FK_EXPORT CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    FK_ENTER(cuMemHostRegister_v2);
    if (!p || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (Flags & ~(unsigned)(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                            CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_capture_check_unsafe();
    if (r != CUDA_SUCCESS)
        return r;
    uintptr_t b = (uintptr_t)p;
    uintptr_t lo = b & ~(uintptr_t)(FK_PAGE - 1);
    uintptr_t hi = (b + bytesize + FK_PAGE - 1) & ~(uintptr_t)(FK_PAGE - 1);
    struct alloc *a = calloc(1, sizeof(*a));
    if (!a)
        return CUDA_ERROR_OUT_OF_MEMORY;
    fk_lock_();
    /* Any overlap with a known allocation is refused. */
    size_t i = upper_locked(b + bytesize - 1);
    if (i > 0 && allocs[i - 1]->base + allocs[i - 1]->size > b) {
        int k = allocs[i - 1]->kind;
        fk_unlock_();
        free(a);
        /* Driver 580: registering pinned cuMemHostAlloc memory is
         * CUDA_ERROR_INVALID_VALUE, a second registration 712. */
        return k == FAKECUDA_REGISTERED ? CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
                                        : CUDA_ERROR_INVALID_VALUE;
    }
    if (lock_pages((void *)lo, hi - lo) != 0) {
        fk_unlock_();
        free(a);
        return errno == ENOMEM || errno == EPERM || errno == EAGAIN ? CUDA_ERROR_OUT_OF_MEMORY
                                                                    : CUDA_ERROR_INVALID_VALUE;
    }
    a->base = b;
    a->size = bytesize;
    a->kind = FAKECUDA_REGISTERED;
    a->flags = Flags;
    a->device = cur_dev();
    if (insert_locked(a) < 0) {
        unlock_pages((void *)lo, hi - lo);
        fk_unlock_();
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    fk_unlock_();
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuMemHostUnregister(void *p)
{
    FK_ENTER(cuMemHostUnregister);
    CUresult r = fk_capture_check_unsafe();
    if (r != CUDA_SUCCESS)
        return r;
    r = fk_quiet_wait();
    if (r != CUDA_SUCCESS)
        return r;
    fk_lock_();
    struct alloc *a = find_locked((uintptr_t)p);
    if (!a || a->base != (uintptr_t)p || a->kind != FAKECUDA_REGISTERED) {
        fk_unlock_();
        return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    }
    remove_locked(a);
    uintptr_t lo = a->base & ~(uintptr_t)(FK_PAGE - 1);
    uintptr_t hi = (a->base + a->size + FK_PAGE - 1) & ~(uintptr_t)(FK_PAGE - 1);
    /* munlock would unlock pages shared with a neighbouring registration
     * too; tests register disjoint pages. */
    unlock_pages((void *)lo, hi - lo);
    fk_unlock_();
    free(a);
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
    FK_ENTER(cuMemHostGetDevicePointer_v2);
    if (!pdptr || Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    int k = fk_mem_kind((uintptr_t)p, 1);
    if (k != FAKECUDA_HOST && k != FAKECUDA_REGISTERED)
        return CUDA_ERROR_INVALID_VALUE;
    *pdptr = (CUdeviceptr)(uintptr_t)p; /* UVA: the same address */
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    FK_ENTER(cuMemGetAddressRange_v2);
    fk_lock_();
    /* Pinned host allocations have a range too (driver 580). */
    struct alloc *a = find_locked(dptr);
    if (!a) {
        fk_unlock_();
        return CUDA_ERROR_NOT_FOUND;
    }
    if (pbase)
        *pbase = a->base;
    if (psize)
        *psize = a->size;
    fk_unlock_();
    return CUDA_SUCCESS;
}

/* --- managed memory: advice, prefetch, range attributes ------------------ */

/* CUmemLocation -> -1 host, ordinal, or -2 invalid. */
static int loc_of(CUmemLocation l)
{
    switch (l.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
        return fk_device_valid(l.id) ? l.id : CU_DEVICE_INVALID;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT:
        return CU_DEVICE_CPU;
    default:
        return CU_DEVICE_INVALID;
    }
}

static struct alloc *managed_locked(uintptr_t p, size_t n)
{
    struct alloc *a = find_range_locked(p, n);
    return a && a->kind == FAKECUDA_MANAGED ? a : NULL;
}

static void page_span(const struct alloc *a, uintptr_t p, size_t n, size_t *first, size_t *end)
{
    *first = (p - a->base) / FK_PAGE;
    *end = (p - a->base + n + FK_PAGE - 1) / FK_PAGE;
}

static void set_resident(struct page *pg, uint8_t mask)
{
    bool was = pg->resident & ~1u, now = mask & ~1u;
    if (was != now)
        managed_dev_pages += now ? 1 : (uint64_t)-1;
    if (was && !now && fk_uvm_cache)
        uvm_cached_pages++;
    else if (!was && now && uvm_cached_pages)
        uvm_cached_pages--;
    pg->resident = mask;
}

static CUresult advise(uintptr_t p, size_t n, CUmem_advise advice, int loc)
{
    if (n == 0)
        return CUDA_ERROR_INVALID_VALUE;
    /* Driver 580: advice is an unsafe call during a global capture, even
     * from another thread: it fails and breaks the capture. */
    CUresult r = fk_capture_check_unsafe();
    if (r != CUDA_SUCCESS)
        return r;
    bool needs_loc = advice == CU_MEM_ADVISE_SET_PREFERRED_LOCATION ||
                     advice == CU_MEM_ADVISE_SET_ACCESSED_BY ||
                     advice == CU_MEM_ADVISE_UNSET_ACCESSED_BY;
    if (advice < CU_MEM_ADVISE_SET_READ_MOSTLY || advice > CU_MEM_ADVISE_UNSET_ACCESSED_BY)
        return CUDA_ERROR_INVALID_VALUE;
    if (needs_loc && loc == CU_DEVICE_INVALID)
        return CUDA_ERROR_INVALID_DEVICE;
    fk_lock_();
    struct alloc *a = managed_locked(p, n);
    if (!a) {
        fk_unlock_();
        return CUDA_ERROR_INVALID_VALUE;
    }
    size_t first, end;
    page_span(a, p, n, &first, &end);
    for (size_t i = first; i < end; i++) {
        struct page *pg = &a->pages[i];
        switch (advice) {
        case CU_MEM_ADVISE_SET_READ_MOSTLY: pg->read_mostly = 1; break;
        case CU_MEM_ADVISE_UNSET_READ_MOSTLY:
            pg->read_mostly = 0;
            /* Read-duplicated copies collapse to one: to the host when it
             * is the preferred location (the real driver drops the GPU
             * copy then, device-facts.md), else the device one (the last
             * place it was prefetched to). */
            if ((pg->resident & ~1u) && (pg->resident & 1u))
                set_resident(pg, pg->preferred == CU_DEVICE_CPU ? 1u : (uint8_t)(pg->resident & ~1u));
            break;
        case CU_MEM_ADVISE_SET_PREFERRED_LOCATION: pg->preferred = (int8_t)loc; break;
        case CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION: pg->preferred = CU_DEVICE_INVALID; break;
        case CU_MEM_ADVISE_SET_ACCESSED_BY: pg->accessed_by |= loc_bit(loc); break;
        case CU_MEM_ADVISE_UNSET_ACCESSED_BY: pg->accessed_by &= (uint8_t)~loc_bit(loc); break;
        default: break;
        }
    }
    fk_unlock_();
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                               CUdevice device)
{
    FK_ENTER(cuMemAdvise);
    int loc = device == CU_DEVICE_CPU ? CU_DEVICE_CPU
              : fk_device_valid(device) ? device
                                        : CU_DEVICE_INVALID;
    return advise(devPtr, count, advice, loc);
}

FK_EXPORT CUresult cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                                  CUmemLocation location)
{
    FK_ENTER(cuMemAdvise_v2);
    return advise(devPtr, count, advice, loc_of(location));
}

static void prefetch_apply(uintptr_t p, size_t n, int loc)
{
    fk_lock_();
    struct alloc *a = managed_locked(p, n);
    if (a) {
        size_t first, end;
        page_span(a, p, n, &first, &end);
        for (size_t i = first; i < end; i++) {
            struct page *pg = &a->pages[i];
            if (!(pg->resident & loc_bit(loc))) {
                size_t lo = i * FK_PAGE, hi = lo + FK_PAGE;
                migrated[loc < 0 ? 0 : 1 + loc] += (hi > a->size ? a->size : hi) - lo;
            }
            set_resident(pg, pg->read_mostly ? (uint8_t)(pg->resident | loc_bit(loc))
                                             : loc_bit(loc));
            pg->last_prefetch = (int8_t)loc;
        }
    }
    fk_unlock_();
}

static CUresult prefetch(uintptr_t p, size_t n, int loc, unsigned flags, CUstream s, bool pt)
{
    if (n == 0 || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (loc == CU_DEVICE_INVALID)
        return CUDA_ERROR_INVALID_DEVICE;
    fk_lock_();
    bool ok = managed_locked(p, n) != NULL;
    fk_unlock_();
    /* Like a driver without HMM: only managed memory can be prefetched. */
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    struct fk_capture *cap;
    CUresult r = fk_stream_begin_op(s, pt, &cap);
    if (r == CUDA_SUCCESS) /* a stream behind: after its work */
        r = fk_capture_settle(&cap);
    if (r != CUDA_SUCCESS)
        return r;
    if (cap) {
        /* Prefetches cannot be captured (driver 580: 900, capture lost). */
        fk_capture_invalidate(cap);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    prefetch_apply(p, n, loc);
    return CUDA_SUCCESS;
}

static int dev_loc(CUdevice d)
{
    return d == CU_DEVICE_CPU ? CU_DEVICE_CPU : fk_device_valid(d) ? d : CU_DEVICE_INVALID;
}

FK_EXPORT CUresult cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice,
                                      CUstream hStream)
{
    FK_ENTER(cuMemPrefetchAsync);
    return prefetch(devPtr, count, dev_loc(dstDevice), 0, hStream, false);
}

FK_EXPORT CUresult cuMemPrefetchAsync_ptsz(CUdeviceptr devPtr, size_t count, CUdevice dstDevice,
                                           CUstream hStream)
{
    FK_ENTER(cuMemPrefetchAsync_ptsz);
    return prefetch(devPtr, count, dev_loc(dstDevice), 0, hStream, true);
}

FK_EXPORT CUresult cuMemPrefetchAsync_v2(CUdeviceptr devPtr, size_t count, CUmemLocation location,
                                         unsigned int flags, CUstream hStream)
{
    FK_ENTER(cuMemPrefetchAsync_v2);
    return prefetch(devPtr, count, loc_of(location), flags, hStream, false);
}

FK_EXPORT CUresult cuMemPrefetchAsync_v2_ptsz(CUdeviceptr devPtr, size_t count,
                                              CUmemLocation location, unsigned int flags,
                                              CUstream hStream)
{
    FK_ENTER(cuMemPrefetchAsync_v2_ptsz);
    return prefetch(devPtr, count, loc_of(location), flags, hStream, true);
}

static CUmemLocationType loc_type(int loc)
{
    return loc >= 0 ? CU_MEM_LOCATION_TYPE_DEVICE
           : loc == CU_DEVICE_CPU ? CU_MEM_LOCATION_TYPE_HOST
                                  : CU_MEM_LOCATION_TYPE_INVALID;
}

FK_EXPORT CUresult cuMemRangeGetAttribute(void *data, size_t dataSize,
                                          CUmem_range_attribute attribute, CUdeviceptr devPtr,
                                          size_t count)
{
    FK_ENTER(cuMemRangeGetAttribute);
    if (!data || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (attribute == CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY ? (dataSize == 0 || dataSize % 4)
                                                        : dataSize != 4)
        return CUDA_ERROR_INVALID_VALUE;
    fk_lock_();
    struct alloc *a = managed_locked(devPtr, count);
    if (!a) {
        fk_unlock_();
        return CUDA_ERROR_INVALID_VALUE;
    }
    size_t first, end;
    page_span(a, devPtr, count, &first, &end);
    int rm = 1, pref = a->pages[first].preferred, last = a->pages[first].last_prefetch;
    uint8_t acc = 0xff;
    for (size_t i = first; i < end; i++) {
        const struct page *pg = &a->pages[i];
        rm &= pg->read_mostly;
        if (pg->preferred != pref)
            pref = CU_DEVICE_INVALID;
        if (pg->last_prefetch != last)
            last = CU_DEVICE_INVALID;
        acc &= pg->accessed_by;
    }
    fk_unlock_();
    int *out = data;
    switch ((int)attribute) {
    case CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY: *out = rm; break;
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION: *out = pref; break;
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION: *out = last; break;
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_TYPE: *out = (int)loc_type(pref); break;
    case CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION_ID: *out = pref >= 0 ? pref : 0; break;
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_TYPE: *out = (int)loc_type(last); break;
    case CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION_ID: *out = last >= 0 ? last : 0; break;
    case CU_MEM_RANGE_ATTRIBUTE_ACCESSED_BY: {
        size_t n = dataSize / 4, k = 0;
        if (acc & 1u && k < n)
            out[k++] = CU_DEVICE_CPU;
        for (int d = 0; d < fk_ndevices; d++)
            if (acc & loc_bit(d) && k < n)
                out[k++] = d;
        while (k < n)
            out[k++] = CU_DEVICE_INVALID;
        break;
    }
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* --- pointer attributes -------------------------------------------------- */

/* Fills one attribute for allocation a (NULL: not a CUDA pointer: defaults,
 * as cuPointerGetAttributes documents). Returns CUDA_ERROR_INVALID_VALUE for
 * unknown attributes, or for a NULL a when strict. */
static CUresult ptr_attr_locked(const struct alloc *a, uintptr_t p, CUpointer_attribute attr,
                                void *data, bool strict)
{
    if (!a && strict)
        return CUDA_ERROR_INVALID_VALUE;
    /* a mapping of host-located VMM memory reads as host memory, as the
     * re-backed range did on driver 580 (device-facts, "VMM") */
    bool host = a && (a->kind == FAKECUDA_HOST || a->kind == FAKECUDA_REGISTERED ||
                      (a->kind == FK_K_MAPPING && a->device == CU_DEVICE_CPU));
    uintptr_t base = a ? a->base : 0;
    size_t size = a ? a->size : 0;
    uintptr_t rbase = base;
    size_t rsize = size;
    if (a && a->kind == FK_K_MAPPING) {
        /* Driver 580: a VMM pointer's range is its whole VA reservation
         * (cuMemGetAddressRange gives the mapping). */
        for (struct resv *r = resvs; r; r = r->next)
            if (p >= r->base && p < r->base + r->size) {
                rbase = r->base;
                rsize = r->size;
            }
    }
    switch ((int)attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = a ? fk_primary_ctx(a->device < 0 ? 0 : a->device) : NULL;
        break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = !a ? 0u : host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
        *(CUdeviceptr *)data = a ? p : 0;
        break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (a && !host && a->kind != FAKECUDA_MANAGED) {
            if (strict)
                return CUDA_ERROR_INVALID_VALUE;
            *(void **)data = NULL;
        } else {
            *(void **)data = a ? (void *)p : NULL;
        }
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        /* "Booleans" are written as 4-byte integers, as measured on driver
         * 580: a caller passing a 1-byte bool gets its neighbours clobbered
         * on real hardware too. */
        *(unsigned int *)data = a && a->kind == FAKECUDA_MANAGED;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = a ? a->device : -2;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(CUdeviceptr *)data = rbase;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = rsize;
        break;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(unsigned int *)data = a != NULL;
        break;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
    case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
        *(unsigned int *)data = 0;
        break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
    case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
        *(unsigned long long *)data = a ? a->id : 0;
        break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
        *(unsigned long long *)data = 0;
        break;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
        *(unsigned int *)data = a ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE : 0;
        break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        *(CUmemoryPool *)data = NULL;
        break;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
        *(size_t *)data = size;
        break;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
        *(void **)data = (void *)base;
        break;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute,
                                         CUdeviceptr ptr)
{
    FK_ENTER(cuPointerGetAttribute);
    if (!data)
        return CUDA_ERROR_INVALID_VALUE;
    fk_lock_();
    CUresult r = ptr_attr_locked(find_locked(ptr), ptr, attribute, data, true);
    fk_unlock_();
    return r;
}

FK_EXPORT CUresult cuPointerGetAttributes(unsigned int numAttributes,
                                          CUpointer_attribute *attributes, void **data,
                                          CUdeviceptr ptr)
{
    FK_ENTER(cuPointerGetAttributes);
    if (numAttributes && (!attributes || !data))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS;
    fk_lock_();
    const struct alloc *a = find_locked(ptr);
    for (unsigned i = 0; i < numAttributes && r == CUDA_SUCCESS; i++)
        if (data[i])
            r = ptr_attr_locked(a, ptr, attributes[i], data[i], false);
    fk_unlock_();
    return r;
}

/* --- copies and memset --------------------------------------------------- */

/* A "device side" pointer must lie in memory the driver knows. */
static bool dev_ok(uintptr_t p, size_t n)
{
    return n == 0 || fk_mem_kind(p, n) >= 0;
}

static pthread_mutex_t dev_op = PTHREAD_MUTEX_INITIALIZER;

void fk_dev_enter(void)
{
    pthread_mutex_lock(&dev_op);
}

void fk_dev_leave(void)
{
    pthread_mutex_unlock(&dev_op);
}

void fk_dev_memmove(void *dst, const void *src, size_t n)
{
    fk_dev_enter();
    memmove(dst, src, n);
    fk_dev_leave();
}

static CUresult copy_sync(void *dst, const void *src, size_t n, bool pt)
{
    CUresult r = fk_sync_op(pt);
    if (r != CUDA_SUCCESS)
        return r;
    if (n)
        fk_dev_memmove(dst, src, n);
    return CUDA_SUCCESS;
}

static CUresult copy_async(void *dst, const void *src, size_t n, CUstream s, bool pt)
{
    struct fk_capture *cap;
    CUresult r = fk_stream_begin_op(s, pt, &cap);
    if (r != CUDA_SUCCESS)
        return r;
    struct fk_op op = { .type = FK_OP_COPY, .cp = { .dst = dst, .src = src, .n = n } };
    if (fk_copy_queue_took(s, pt, cap, &op, &r))
        return r;
    if (cap)
        return fk_capture_add(cap, &op);
    if (n)
        fk_dev_memmove(dst, src, n);
    return CUDA_SUCCESS;
}

#define P(x) ((void *)(uintptr_t)(x))

/* A copy into host memory the driver does not know (pageable) returns once
 * it is done: it waits for the context's work holding the quiet lock, as a
 * free does (fk_quiet_wait). On the H200, under fit with the shim's copy
 * engine, the engine's thread spun in a driver call (most likely such a
 * copy: PyTorch's .item()) while the shim's copy thread sat in
 * cuMemcpyAsync, and nothing went on. */
#define PAGEABLE_WAIT(dst, n)                                                                      \
    do {                                                                                           \
        if ((n) && (dst) && fk_mem_kind((uintptr_t)(dst), (n)) < 0) {                             \
            CUresult pw_ = fk_quiet_wait();                                                        \
            if (pw_ != CUDA_SUCCESS)                                                               \
                return pw_;                                                                        \
        }                                                                                          \
    } while (0)

/* Unified copies: any address works (UVA, pageable host memory included). */
static CUresult check_unified(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return n && (!dst || !src) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

#define COPY_SYNC(sym, dstp, srcp, n, check)                                                       \
    do {                                                                                           \
        FK_ENTER(sym);                                                                             \
        if (!(check))                                                                              \
            return CUDA_ERROR_INVALID_VALUE;                                                       \
        return copy_sync(dstp, srcp, n, strstr(#sym, "_ptds") != NULL);                            \
    } while (0)
#define COPY_ASYNC(sym, dstp, srcp, n, check, s, pt)                                               \
    do {                                                                                           \
        FK_ENTER(sym);                                                                             \
        if (!(check))                                                                              \
            return CUDA_ERROR_INVALID_VALUE;                                                       \
        return copy_async(dstp, srcp, n, s, pt);                                                   \
    } while (0)

FK_EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    COPY_SYNC(cuMemcpy, P(dst), P(src), ByteCount, !check_unified(dst, src, ByteCount));
}
FK_EXPORT CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    COPY_SYNC(cuMemcpy_ptds, P(dst), P(src), ByteCount, !check_unified(dst, src, ByteCount));
}
static CUresult cuMemcpyAsync_body(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
                                   CUstream hStream)
{
    COPY_ASYNC(cuMemcpyAsync, P(dst), P(src), ByteCount, !check_unified(dst, src, ByteCount),
               hStream, false);
}
/* enqueued under the driver's quiet lock (fk_quiet_wait) */
FK_EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
                                 CUstream hStream)
{
    PAGEABLE_WAIT(P(dst), ByteCount);
    fk_quiet_enter();
    CUresult r = cuMemcpyAsync_body(dst, src, ByteCount, hStream);
    fk_quiet_leave();
    return r;
}
FK_EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
                                      CUstream hStream)
{
    PAGEABLE_WAIT(P(dst), ByteCount);
    COPY_ASYNC(cuMemcpyAsync_ptsz, P(dst), P(src), ByteCount, !check_unified(dst, src, ByteCount),
               hStream, true);
}

#define HTOD_OK(d, h, n) (dev_ok(d, n) && ((h) || !(n)))
#define DTOD_OK(d, s, n) (dev_ok(d, n) && dev_ok(s, n))

FK_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    COPY_SYNC(cuMemcpyHtoD_v2, P(dstDevice), srcHost, ByteCount,
              HTOD_OK(dstDevice, srcHost, ByteCount));
}
FK_EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost,
                                        size_t ByteCount)
{
    COPY_SYNC(cuMemcpyHtoD_v2_ptds, P(dstDevice), srcHost, ByteCount,
              HTOD_OK(dstDevice, srcHost, ByteCount));
}
FK_EXPORT CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    PAGEABLE_WAIT(dstHost, ByteCount);
    COPY_SYNC(cuMemcpyDtoH_v2, dstHost, P(srcDevice), ByteCount,
              HTOD_OK(srcDevice, dstHost, ByteCount));
}
FK_EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    PAGEABLE_WAIT(dstHost, ByteCount);
    COPY_SYNC(cuMemcpyDtoH_v2_ptds, dstHost, P(srcDevice), ByteCount,
              HTOD_OK(srcDevice, dstHost, ByteCount));
}
FK_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
    COPY_SYNC(cuMemcpyDtoD_v2, P(dstDevice), P(srcDevice), ByteCount,
              DTOD_OK(dstDevice, srcDevice, ByteCount));
}
FK_EXPORT CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                        size_t ByteCount)
{
    COPY_SYNC(cuMemcpyDtoD_v2_ptds, P(dstDevice), P(srcDevice), ByteCount,
              DTOD_OK(dstDevice, srcDevice, ByteCount));
}
FK_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost,
                                        size_t ByteCount, CUstream hStream)
{
    COPY_ASYNC(cuMemcpyHtoDAsync_v2, P(dstDevice), srcHost, ByteCount,
               HTOD_OK(dstDevice, srcHost, ByteCount), hStream, false);
}
FK_EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost,
                                             size_t ByteCount, CUstream hStream)
{
    COPY_ASYNC(cuMemcpyHtoDAsync_v2_ptsz, P(dstDevice), srcHost, ByteCount,
               HTOD_OK(dstDevice, srcHost, ByteCount), hStream, true);
}
FK_EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                        CUstream hStream)
{
    PAGEABLE_WAIT(dstHost, ByteCount);
    COPY_ASYNC(cuMemcpyDtoHAsync_v2, dstHost, P(srcDevice), ByteCount,
               HTOD_OK(srcDevice, dstHost, ByteCount), hStream, false);
}
FK_EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice,
                                             size_t ByteCount, CUstream hStream)
{
    PAGEABLE_WAIT(dstHost, ByteCount);
    COPY_ASYNC(cuMemcpyDtoHAsync_v2_ptsz, dstHost, P(srcDevice), ByteCount,
               HTOD_OK(srcDevice, dstHost, ByteCount), hStream, true);
}
FK_EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                        size_t ByteCount, CUstream hStream)
{
    COPY_ASYNC(cuMemcpyDtoDAsync_v2, P(dstDevice), P(srcDevice), ByteCount,
               DTOD_OK(dstDevice, srcDevice, ByteCount), hStream, false);
}
FK_EXPORT CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                             size_t ByteCount, CUstream hStream)
{
    COPY_ASYNC(cuMemcpyDtoDAsync_v2_ptsz, P(dstDevice), P(srcDevice), ByteCount,
               DTOD_OK(dstDevice, srcDevice, ByteCount), hStream, true);
}

/* 2D/3D copies run as one row copy per (y, z); arrays are not supported. */
struct side {
    uintptr_t base;
    size_t x, y, z, pitch, height;
    bool device;
};

static CUresult side_of(CUmemorytype t, const void *host, CUdeviceptr dev, size_t x, size_t y,
                        size_t z, size_t pitch, size_t height, struct side *s)
{
    switch (t) {
    case CU_MEMORYTYPE_HOST: s->base = (uintptr_t)host; s->device = false; break;
    case CU_MEMORYTYPE_DEVICE: s->base = dev; s->device = true; break;
    case CU_MEMORYTYPE_UNIFIED: s->base = dev; s->device = false; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    if (!s->base)
        return CUDA_ERROR_INVALID_VALUE;
    s->x = x;
    s->y = y;
    s->z = z;
    s->pitch = pitch;
    s->height = height;
    return CUDA_SUCCESS;
}

static uintptr_t row_addr(const struct side *s, size_t y, size_t z)
{
    return s->base + ((s->z + z) * s->height + s->y + y) * s->pitch + s->x;
}

static CUresult copy_rows(const struct side *src, const struct side *dst, size_t width,
                          size_t height, size_t depth, bool async, CUstream st, bool pt)
{
    if (height > 1 && (src->pitch < width || dst->pitch < width))
        return CUDA_ERROR_INVALID_VALUE;
    if (depth > 1 && (src->height < height || dst->height < height))
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t z = 0; z < depth; z++)
        for (size_t y = 0; y < height; y++) {
            if (src->device && !dev_ok(row_addr(src, y, z), width))
                return CUDA_ERROR_INVALID_VALUE;
            if (dst->device && !dev_ok(row_addr(dst, y, z), width))
                return CUDA_ERROR_INVALID_VALUE;
        }
    struct fk_capture *cap = NULL;
    CUresult r = async ? fk_stream_begin_op(st, pt, &cap) : fk_sync_op(pt);
    if (r != CUDA_SUCCESS)
        return r;
    for (size_t z = 0; z < depth; z++)
        for (size_t y = 0; y < height; y++) {
            void *d = P(row_addr(dst, y, z));
            const void *s = P(row_addr(src, y, z));
            if (cap) {
                struct fk_op op = { .type = FK_OP_COPY, .cp = { .dst = d, .src = s, .n = width } };
                r = fk_capture_add(cap, &op);
                if (r != CUDA_SUCCESS)
                    return r;
            } else if (width) {
                memmove(d, s, width);
            }
        }
    return CUDA_SUCCESS;
}

static CUresult copy2d(const CUDA_MEMCPY2D *c, bool async, CUstream st, bool pt)
{
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    struct side s, d;
    CUresult r = side_of(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcXInBytes, c->srcY, 0,
                         c->srcPitch, 0, &s);
    if (r == CUDA_SUCCESS)
        r = side_of(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstXInBytes, c->dstY, 0,
                    c->dstPitch, 0, &d);
    if (r != CUDA_SUCCESS)
        return r;
    return copy_rows(&s, &d, c->WidthInBytes, c->Height, 1, async, st, pt);
}

static CUresult copy3d(const CUDA_MEMCPY3D *c, bool async, CUstream st, bool pt)
{
    if (!c || c->reserved0 || c->reserved1 || c->srcLOD || c->dstLOD)
        return CUDA_ERROR_INVALID_VALUE;
    struct side s, d;
    CUresult r = side_of(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcXInBytes, c->srcY,
                         c->srcZ, c->srcPitch, c->srcHeight, &s);
    if (r == CUDA_SUCCESS)
        r = side_of(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstXInBytes, c->dstY, c->dstZ,
                    c->dstPitch, c->dstHeight, &d);
    if (r != CUDA_SUCCESS)
        return r;
    return copy_rows(&s, &d, c->WidthInBytes, c->Height, c->Depth, async, st, pt);
}

FK_EXPORT CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *pCopy)
{
    FK_ENTER(cuMemcpy2D_v2);
    return copy2d(pCopy, false, NULL, false);
}
FK_EXPORT CUresult cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D *pCopy)
{
    FK_ENTER(cuMemcpy2D_v2_ptds);
    return copy2d(pCopy, false, NULL, true);
}
FK_EXPORT CUresult cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D *pCopy)
{
    FK_ENTER(cuMemcpy2DUnaligned_v2);
    return copy2d(pCopy, false, NULL, false);
}
FK_EXPORT CUresult cuMemcpy2DUnaligned_v2_ptds(const CUDA_MEMCPY2D *pCopy)
{
    FK_ENTER(cuMemcpy2DUnaligned_v2_ptds);
    return copy2d(pCopy, false, NULL, true);
}
FK_EXPORT CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *pCopy, CUstream hStream)
{
    FK_ENTER(cuMemcpy2DAsync_v2);
    return copy2d(pCopy, true, hStream, false);
}
FK_EXPORT CUresult cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D *pCopy, CUstream hStream)
{
    FK_ENTER(cuMemcpy2DAsync_v2_ptsz);
    return copy2d(pCopy, true, hStream, true);
}
FK_EXPORT CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D *pCopy)
{
    FK_ENTER(cuMemcpy3D_v2);
    return copy3d(pCopy, false, NULL, false);
}
FK_EXPORT CUresult cuMemcpy3D_v2_ptds(const CUDA_MEMCPY3D *pCopy)
{
    FK_ENTER(cuMemcpy3D_v2_ptds);
    return copy3d(pCopy, false, NULL, true);
}
FK_EXPORT CUresult cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D *pCopy, CUstream hStream)
{
    FK_ENTER(cuMemcpy3DAsync_v2);
    return copy3d(pCopy, true, hStream, false);
}
FK_EXPORT CUresult cuMemcpy3DAsync_v2_ptsz(const CUDA_MEMCPY3D *pCopy, CUstream hStream)
{
    FK_ENTER(cuMemcpy3DAsync_v2_ptsz);
    return copy3d(pCopy, true, hStream, true);
}

static void fill(void *dst, uint32_t val, unsigned esz, size_t n)
{
    if (esz == 1) {
        memset(dst, (int)val, n);
    } else if (esz == 2) {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = (uint16_t)val;
    } else {
        uint32_t *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = val;
    }
}

static CUresult memset_(CUdeviceptr p, uint32_t val, unsigned esz, size_t n, bool async,
                        CUstream s, bool pt)
{
    if (p % esz || n > SIZE_MAX / esz || (n && !dev_ok(p, n * esz)))
        return CUDA_ERROR_INVALID_VALUE;
    struct fk_capture *cap = NULL;
    CUresult r = async ? fk_stream_begin_op(s, pt, &cap) : fk_sync_op(pt);
    if (r != CUDA_SUCCESS)
        return r;
    struct fk_op op = { .type = FK_OP_SET, .set = { .dst = P(p), .val = val, .esz = esz, .n = n } };
    if (async && fk_copy_queue_took(s, pt, cap, &op, &r))
        return r;
    if (cap)
        return fk_capture_add(cap, &op);
    fill(P(p), val, esz, n);
    return CUDA_SUCCESS;
}

#define MEMSET(sym, esz, async, pt)                                                                \
    do {                                                                                           \
        FK_ENTER(sym);                                                                             \
        return memset_(dstDevice, (uint32_t)v, esz, N, async, async ? hStream : NULL, pt);         \
    } while (0)

FK_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char v, size_t N)
{
    CUstream hStream = NULL;
    MEMSET(cuMemsetD8_v2, 1, false, false);
}
FK_EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char v, size_t N)
{
    CUstream hStream = NULL;
    MEMSET(cuMemsetD8_v2_ptds, 1, false, true);
}
FK_EXPORT CUresult cuMemsetD16_v2(CUdeviceptr dstDevice, unsigned short v, size_t N)
{
    CUstream hStream = NULL;
    MEMSET(cuMemsetD16_v2, 2, false, false);
}
FK_EXPORT CUresult cuMemsetD16_v2_ptds(CUdeviceptr dstDevice, unsigned short v, size_t N)
{
    CUstream hStream = NULL;
    MEMSET(cuMemsetD16_v2_ptds, 2, false, true);
}
FK_EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int v, size_t N)
{
    CUstream hStream = NULL;
    MEMSET(cuMemsetD32_v2, 4, false, false);
}
FK_EXPORT CUresult cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int v, size_t N)
{
    CUstream hStream = NULL;
    MEMSET(cuMemsetD32_v2_ptds, 4, false, true);
}
FK_EXPORT CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char v, size_t N,
                                   CUstream hStream)
{
    MEMSET(cuMemsetD8Async, 1, true, false);
}
FK_EXPORT CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char v, size_t N,
                                        CUstream hStream)
{
    MEMSET(cuMemsetD8Async_ptsz, 1, true, true);
}
FK_EXPORT CUresult cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short v, size_t N,
                                    CUstream hStream)
{
    MEMSET(cuMemsetD16Async, 2, true, false);
}
FK_EXPORT CUresult cuMemsetD16Async_ptsz(CUdeviceptr dstDevice, unsigned short v, size_t N,
                                         CUstream hStream)
{
    MEMSET(cuMemsetD16Async_ptsz, 2, true, true);
}
FK_EXPORT CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int v, size_t N,
                                    CUstream hStream)
{
    MEMSET(cuMemsetD32Async, 4, true, false);
}
FK_EXPORT CUresult cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int v, size_t N,
                                         CUstream hStream)
{
    MEMSET(cuMemsetD32Async_ptsz, 4, true, true);
}

void fk_op_run(const struct fk_op *op)
{
    switch (op->type) {
    case FK_OP_COPY:
        if (op->cp.n)
            fk_dev_memmove(op->cp.dst, op->cp.src, op->cp.n);
        break;
    case FK_OP_SET:
        fill(op->set.dst, op->set.val, op->set.esz, op->set.n);
        break;
    default:
        break;
    }
}

void fk_op_copy_words(const struct fk_op *op)
{
    unsigned char *d = op->cp.dst;
    const unsigned char *s = op->cp.src;
    size_t n = op->cp.n, i = 0;

    if (op->type != FK_OP_COPY || !n || (d < s + n && s < d + n) ||
        ((uintptr_t)d | (uintptr_t)s) % 8) {
        fk_op_run(op);
        return;
    }
    for (; i + 8 <= n; i += 8)
        __atomic_store_n((uint64_t *)(d + i), __atomic_load_n((const uint64_t *)(s + i),
                                                              __ATOMIC_RELAXED),
                         __ATOMIC_RELAXED);
    for (; i < n; i++)
        __atomic_store_n(d + i, __atomic_load_n(s + i, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
}

/* --- VMM ----------------------------------------------------------------- */

/* A device location, or host NUMA node 0 (the lent machine's one node:
 * device attribute 141, HOST_NUMA VMM, is supported there; docs of
 * ../shared/guide/device-facts.md, "VMM"). */
static bool prop_ok(const CUmemAllocationProp *prop)
{
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return false;
    if (prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA)
        return prop->location.id == 0;
    return prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && fk_device_valid(prop->location.id);
}

static bool prop_host(const CUmemAllocationProp *prop)
{
    return prop->location.type == CU_MEM_LOCATION_TYPE_HOST_NUMA;
}

FK_EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity,
                                                 const CUmemAllocationProp *prop,
                                                 CUmemAllocationGranularity_flags option)
{
    FK_ENTER(cuMemGetAllocationGranularity);
    if (!granularity || !prop_ok(prop) ||
        (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = FK_GRANULE;
    return CUDA_SUCCESS;
}

static struct vmm_handle *handle_of_locked(CUmemGenericAllocationHandle h)
{
    for (struct vmm_handle *v = handles; v; v = v->next)
        if ((uintptr_t)v == (uintptr_t)h && !v->released)
            return v;
    return NULL;
}

static void handle_put_locked(struct vmm_handle *v)
{
    if (!v->released || v->maps > 0)
        return;
    for (struct vmm_handle **pp = &handles; *pp; pp = &(*pp)->next)
        if (*pp == v) {
            *pp = v->next;
            break;
        }
    if (v->device != CU_DEVICE_CPU)
        dev_bytes -= v->size;
    close(v->fd);
    v->magic = 0;
    free(v);
}

FK_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                               const CUmemAllocationProp *prop, unsigned long long flags)
{
    FK_ENTER(cuMemCreate);
    if (!handle || !prop_ok(prop) || flags != 0 || size == 0 || size % FK_GRANULE)
        return CUDA_ERROR_INVALID_VALUE;
    struct vmm_handle *v = calloc(1, sizeof(*v));
    if (!v)
        return CUDA_ERROR_OUT_OF_MEMORY;
    v->fd = memfd_create("fakecuda-vmm", MFD_CLOEXEC);
    if (v->fd < 0 || ftruncate(v->fd, (off_t)size) != 0) {
        if (v->fd >= 0)
            close(v->fd);
        free(v);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    v->magic = VMM_MAGIC;
    v->size = size;
    /* host-located physical memory: its mappings are host memory
     * (fakecuda_where says CPU) and it takes no device memory */
    v->device = prop_host(prop) ? CU_DEVICE_CPU : prop->location.id;
    fk_lock_();
    if (v->device != CU_DEVICE_CPU && !device_room_locked(size)) {
        fk_unlock_();
        close(v->fd);
        free(v);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (v->device != CU_DEVICE_CPU)
        dev_bytes += size;
    v->next = handles;
    handles = v;
    fk_unlock_();
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)v;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    FK_ENTER(cuMemRelease);
    fk_lock_();
    struct vmm_handle *v = handle_of_locked(handle);
    if (!v) {
        fk_unlock_();
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* Memory stays until the last mapping of it goes, as documented. */
    v->released = true;
    handle_put_locked(v);
    fk_unlock_();
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                       CUdeviceptr addr, unsigned long long flags)
{
    FK_ENTER(cuMemAddressReserve);
    if (!ptr || size == 0 || size % FK_GRANULE || flags != 0 ||
        (alignment & (alignment - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    size_t align = alignment > FK_GRANULE ? alignment : FK_GRANULE;
    /* Over-reserve and trim so the base honours the alignment. */
    size_t len = size + align;
    void *hint = addr ? P(addr) : NULL;
    void *m = mmap(hint, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t b = ((uintptr_t)m + align - 1) & ~(uintptr_t)(align - 1);
    if (b > (uintptr_t)m)
        munmap(m, b - (uintptr_t)m);
    uintptr_t e = (uintptr_t)m + len;
    if (e > b + size)
        munmap(P(b + size), e - (b + size));
    struct resv *r = calloc(1, sizeof(*r));
    if (!r) {
        munmap(P(b), size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    r->base = b;
    r->size = size;
    fk_lock_();
    r->next = resvs;
    resvs = r;
    fk_unlock_();
    *ptr = b;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    FK_ENTER(cuMemAddressFree);
    fk_lock_();
    for (struct resv **pp = &resvs; *pp; pp = &(*pp)->next) {
        struct resv *r = *pp;
        if (r->base == ptr && r->size == size) {
            /* Mappings still inside would dangle: the real driver refuses. */
            size_t i = upper_locked(ptr + size - 1);
            if (i > 0 && allocs[i - 1]->base + allocs[i - 1]->size > ptr) {
                fk_unlock_();
                return CUDA_ERROR_INVALID_VALUE;
            }
            *pp = r->next;
            fk_unlock_();
            munmap(P(r->base), r->size);
            free(r);
            return CUDA_SUCCESS;
        }
    }
    fk_unlock_();
    return CUDA_ERROR_INVALID_VALUE;
}

static bool in_resv_locked(uintptr_t p, size_t n)
{
    for (struct resv *r = resvs; r; r = r->next)
        if (p >= r->base && p + n <= r->base + r->size)
            return true;
    return false;
}

FK_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                            CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    FK_ENTER(cuMemMap);
    if (flags != 0 || size == 0 || size % FK_GRANULE || ptr % FK_GRANULE)
        return CUDA_ERROR_INVALID_VALUE;
    if (offset % FK_GRANULE)
        return CUDA_ERROR_NOT_SUPPORTED; /* as measured on driver 580 */
    struct alloc *a = calloc(1, sizeof(*a));
    if (!a)
        return CUDA_ERROR_OUT_OF_MEMORY;
    fk_lock_();
    struct vmm_handle *v = handle_of_locked(handle);
    size_t i = upper_locked(ptr + size - 1);
    bool overlap = i > 0 && allocs[i - 1]->base + allocs[i - 1]->size > ptr;
    if (!v || overlap) {
        fk_unlock_();
        free(a);
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* Driver 580 calls these "not supported" rather than invalid. */
    if (offset + size > v->size || !in_resv_locked(ptr, size)) {
        fk_unlock_();
        free(a);
        return CUDA_ERROR_NOT_SUPPORTED;
    }
    /* PROT_NONE until cuMemSetAccess, like an unmapped-for-access range. */
    void *m = mmap(P(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, v->fd, (off_t)offset);
    if (m == MAP_FAILED) {
        fk_unlock_();
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->base = ptr;
    a->size = size;
    a->maplen = size;
    a->kind = FK_K_MAPPING;
    a->device = v->device;
    a->vmm = v;
    if (insert_locked(a) < 0) {
        mmap(P(ptr), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
        fk_unlock_();
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    v->maps++;
    fk_unlock_();
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    FK_ENTER(cuMemUnmap);
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    fk_lock_();
    /* Driver 580: every mapping the range touches must lie wholly inside it;
     * reserved but unmapped parts are fine (unmapping them is a no-op). */
    if (!in_resv_locked(ptr, size)) {
        fk_unlock_();
        return CUDA_ERROR_INVALID_VALUE;
    }
    size_t first = upper_locked(ptr);
    if (first > 0 && allocs[first - 1]->base + allocs[first - 1]->size > ptr)
        first--;
    for (size_t i = first; i < nallocs && allocs[i]->base < ptr + size; i++) {
        struct alloc *a = allocs[i];
        if (a->kind != FK_K_MAPPING || a->base < ptr || a->base + a->size > ptr + size) {
            fk_unlock_();
            return CUDA_ERROR_INVALID_VALUE;
        }
    }
    while (first < nallocs && allocs[first]->base < ptr + size) {
        struct alloc *a = allocs[first];
        remove_locked(a);
        mmap(P(a->base), a->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
             -1, 0);
        a->vmm->maps--;
        handle_put_locked(a->vmm);
        free(a);
    }
    fk_unlock_();
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                  size_t count)
{
    FK_ENTER(cuMemSetAccess);
    if (!desc || count == 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    int prot = PROT_NONE;
    for (size_t i = 0; i < count; i++) {
        if (loc_of(desc[i].location) == CU_DEVICE_INVALID)
            return CUDA_ERROR_INVALID_DEVICE;
        if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
            prot = PROT_READ | PROT_WRITE;
        else if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ && prot == PROT_NONE)
            prot = PROT_READ;
    }
    fk_lock_();
    for (uintptr_t p = ptr; p < ptr + size;) {
        struct alloc *a = find_locked(p);
        if (!a || a->kind != FK_K_MAPPING) {
            fk_unlock_();
            return CUDA_ERROR_INVALID_VALUE;
        }
        p = a->base + a->size;
    }
    int rc = mprotect(P(ptr), size, prot);
    fk_unlock_();
    return rc == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* --- fakecuda_* memory queries ------------------------------------------- */

FK_EXPORT uint64_t fakecuda_live_bytes(int kind)
{
    uint64_t n = 0;
    fk_lock_();
    for (size_t i = 0; i < nallocs; i++)
        if (allocs[i]->kind != FK_K_MAPPING && (kind == FAKECUDA_ANY || kind == allocs[i]->kind))
            n += allocs[i]->size;
    if (kind == FAKECUDA_ANY || kind == FAKECUDA_VMM)
        for (struct vmm_handle *v = handles; v; v = v->next)
            n += v->size;
    fk_unlock_();
    return n;
}

FK_EXPORT size_t fakecuda_live_count(int kind)
{
    size_t n = 0;
    fk_lock_();
    for (size_t i = 0; i < nallocs; i++)
        if (allocs[i]->kind != FK_K_MAPPING && (kind == FAKECUDA_ANY || kind == allocs[i]->kind))
            n++;
    if (kind == FAKECUDA_ANY || kind == FAKECUDA_VMM)
        for (struct vmm_handle *v = handles; v; v = v->next)
            n++;
    fk_unlock_();
    return n;
}

FK_EXPORT size_t fakecuda_allocations(struct fakecuda_alloc *out, size_t max)
{
    size_t n = 0;
    fk_lock_();
    for (size_t i = 0; i < nallocs; i++) {
        if (allocs[i]->kind == FK_K_MAPPING)
            continue;
        if (out && n < max)
            out[n] = (struct fakecuda_alloc){ allocs[i]->base, allocs[i]->size, allocs[i]->kind,
                                              allocs[i]->flags };
        n++;
    }
    for (struct vmm_handle *v = handles; v; v = v->next) {
        if (out && n < max)
            out[n] = (struct fakecuda_alloc){ 0, v->size, FAKECUDA_VMM, 0 };
        n++;
    }
    fk_unlock_();
    return n;
}

FK_EXPORT uint64_t fakecuda_uvm_cached(void)
{
    fk_lock_();
    uint64_t n = uvm_cached_pages * FK_PAGE;
    fk_unlock_();
    return n;
}

FK_EXPORT uint64_t fakecuda_device_used(void)
{
    fk_lock_();
    uint64_t n = fk_device_used_locked();
    fk_unlock_();
    return n;
}

FK_EXPORT uint64_t fakecuda_process_bytes(void)
{
    fk_lock_();
    uint64_t n = dev_bytes;
    fk_unlock_();
    return n;
}

FK_EXPORT int fakecuda_where(const void *p)
{
    int r = CU_DEVICE_INVALID;
    fk_lock_();
    struct alloc *a = find_locked((uintptr_t)p);
    if (a) {
        switch (a->kind) {
        case FAKECUDA_HOST:
        case FAKECUDA_REGISTERED:
            r = CU_DEVICE_CPU;
            break;
        case FAKECUDA_MANAGED: {
            uint8_t m = a->pages[((uintptr_t)p - a->base) / FK_PAGE].resident;
            r = FAKECUDA_LOC_NONE;
            if (m & 1u)
                r = CU_DEVICE_CPU;
            for (int d = fk_ndevices - 1; d >= 0; d--)
                if (m & loc_bit(d))
                    r = d;
            break;
        }
        default:
            r = a->device;
            break;
        }
    }
    fk_unlock_();
    return r;
}

FK_EXPORT int fakecuda_managed_state(const void *p, struct fakecuda_page_state *out)
{
    fk_lock_();
    struct alloc *a = managed_locked((uintptr_t)p, 1);
    if (!a) {
        fk_unlock_();
        return -ENOENT;
    }
    const struct page *pg = &a->pages[((uintptr_t)p - a->base) / FK_PAGE];
    if (out)
        *out = (struct fakecuda_page_state){ .resident = pg->resident,
                                             .preferred = pg->preferred,
                                             .accessed_by = pg->accessed_by,
                                             .read_mostly = pg->read_mostly,
                                             .last_prefetch = pg->last_prefetch };
    fk_unlock_();
    return 0;
}

FK_EXPORT uint64_t fakecuda_managed_resident(int loc)
{
    uint64_t n = 0;
    uint8_t bit = loc_bit(loc);
    fk_lock_();
    for (size_t i = 0; i < nallocs; i++) {
        struct alloc *a = allocs[i];
        if (a->kind != FAKECUDA_MANAGED)
            continue;
        for (size_t j = 0; j < a->maplen / FK_PAGE; j++)
            if (a->pages[j].resident & bit) {
                size_t lo = j * FK_PAGE, hi = lo + FK_PAGE;
                n += (hi > a->size ? a->size : hi) - lo;
            }
    }
    fk_unlock_();
    return n;
}

FK_EXPORT uint64_t fakecuda_migrated_bytes(int loc)
{
    if (loc < CU_DEVICE_CPU || loc >= 8)
        return 0;
    fk_lock_();
    uint64_t n = migrated[loc < 0 ? 0 : 1 + loc];
    fk_unlock_();
    return n;
}

void fk_mem_reset_stats(void)
{
    fk_lock_();
    memset(migrated, 0, sizeof(migrated));
    memset(faults, 0, sizeof(faults));
    memset(remote, 0, sizeof(remote));
    fk_unlock_();
}

/* UVM on access, per managed page: a copy at loc is a hit; a page that loc
 * may reach in place (accessed-by loc, and populated elsewhere) is read or
 * written over the bus; anything else faults and migrates to loc (a read of
 * a read-mostly page duplicates it instead; a write collapses copies). */
FK_EXPORT long fakecuda_access(const void *ptr, size_t n, int loc, int write)
{
    if (n == 0 || loc < CU_DEVICE_CPU || (loc >= 0 && !fk_device_valid(loc)))
        return -EINVAL;
    int li = loc < 0 ? 0 : 1 + loc;
    uint8_t bit = loc_bit(loc);
    uintptr_t p = (uintptr_t)ptr;
    long nfault = 0;
    fk_lock_();
    struct alloc *a = find_range_locked(p, n);
    if (!a) {
        fk_unlock_();
        return -ENOENT;
    }
    if (a->kind != FAKECUDA_MANAGED) {
        /* Fixed memory: pinned host memory is always reached over the bus
         * from a device, device memory from the host. */
        bool host_mem = a->kind == FAKECUDA_HOST || a->kind == FAKECUDA_REGISTERED;
        if (host_mem != (loc < 0))
            remote[li] += n;
        fk_unlock_();
        return 0;
    }
    size_t first, end;
    page_span(a, p, n, &first, &end);
    for (size_t i = first; i < end; i++) {
        struct page *pg = &a->pages[i];
        size_t lo = i * FK_PAGE, hi = lo + FK_PAGE;
        uintptr_t plo = a->base + lo > p ? a->base + lo : p;
        uintptr_t phi = a->base + hi < p + n ? a->base + hi : p + n;
        size_t span = phi - plo;
        if (pg->resident & bit) {
            if (write && pg->resident != bit)
                set_resident(pg, bit); /* other copies are invalidated */
            continue;
        }
        if ((pg->accessed_by & bit) && pg->resident) {
            remote[li] += span;
            continue;
        }
        if ((pg->accessed_by & bit) && pg->preferred != CU_DEVICE_INVALID && pg->preferred != loc) {
            /* First touch populates the preferred location, mapped to loc. */
            set_resident(pg, loc_bit(pg->preferred));
            remote[li] += span;
            continue;
        }
        nfault++;
        migrated[li] += (hi > a->size ? a->size : hi) - lo;
        set_resident(pg, pg->read_mostly && !write ? (uint8_t)(pg->resident | bit) : bit);
    }
    faults[li] += (uint64_t)nfault;
    fk_unlock_();
    return nfault;
}

FK_EXPORT uint64_t fakecuda_faults(int loc)
{
    if (loc < CU_DEVICE_CPU || loc >= 8)
        return 0;
    fk_lock_();
    uint64_t n = faults[loc < 0 ? 0 : 1 + loc];
    fk_unlock_();
    return n;
}

FK_EXPORT uint64_t fakecuda_remote_bytes(int loc)
{
    if (loc < CU_DEVICE_CPU || loc >= 8)
        return 0;
    fk_lock_();
    uint64_t n = remote[loc < 0 ? 0 : 1 + loc];
    fk_unlock_();
    return n;
}
