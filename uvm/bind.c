/* uvm/bind.c: late binding at the same address (uvm/bind.h says what).
 *
 * Layout: the reservation is covered by blocks, each one physical handle
 * mapped whole at one place (the driver maps a handle only from offset 0
 * and unmaps only whole mappings: cuda.h, cuMemMap; tests/fake/probe-real.txt,
 * vmm_unmap_partial). A block is at most BLOCK_MAX bytes when created.
 * Re-backing a block that the wanted layout cuts in parts splits it: each
 * part gets a handle of its own at its wanted location and a copy of its
 * bytes, the parts that do not change location too (a handle cannot be
 * mapped in pieces). Blocks never merge, so their number grows only with
 * the placement boundaries a caller asks for.
 *
 * One block at a time: its new handles are made and filled through a
 * scratch reservation while the old mapping still serves, then the old
 * mapping is swapped for the new ones. Nothing is lost on failure: until
 * the old handle is released its memory stays, and a failed swap maps it
 * back. The transient memory is one block's bytes. */
#include "uvm/bind.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/macro.h"

#define BLOCK_MAX ((size_t)64 << 20)

struct blk {
    CUmemGenericAllocationHandle h;
    size_t g0, n; /* first granule, granules */
    uint8_t loc;  /* enum wo_bind_loc */
};

struct wo_bound {
    const struct wo_driver *d;
    int dev;
    CUdeviceptr base;
    size_t size, gran, ngr;
    struct blk *b; /* sorted by g0, covering [0, ngr) */
    size_t nb, cap;
    CUstream copy_stream; /* the fills' copies (made at the first move) */
    struct wo_bind_stats st;
};

static bool has_vmm(const struct wo_driver *d)
{
    return d && d->cuMemCreate && d->cuMemRelease && d->cuMemAddressReserve &&
           d->cuMemAddressFree && d->cuMemMap && d->cuMemUnmap && d->cuMemSetAccess &&
           d->cuMemGetAllocationGranularity && d->cuMemcpyAsync && d->cuStreamCreate &&
           d->cuStreamSynchronize && d->cuStreamDestroy_v2;
}

static CUmemAllocationProp prop_of(int dev, enum wo_bind_loc loc)
{
    CUmemAllocationProp p;

    memset(&p, 0, sizeof(p));
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    /* one NUMA node on the machines measured; id 0 is also what the driver
     * asks for where NUMA is not available (cuda.h, cuMemCreate) */
    p.location.type = loc == WO_BIND_HOST ? CU_MEM_LOCATION_TYPE_HOST_NUMA
                                          : CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = loc == WO_BIND_HOST ? 0 : dev;
    return p;
}

static int cu_err(CUresult r)
{
    return r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM
           : r == CUDA_ERROR_NOT_SUPPORTED ? -ENOTSUP
                                           : -EIO;
}

bool wo_bind_supported(const struct wo_driver *d, int dev, size_t *granule)
{
    size_t gh = 0, gd = 0;
    int host_numa = 0;

    if (!has_vmm(d))
        return false;
    /* attribute 141 where the driver knows it; a driver that does not
     * answer is asked by the granularity query below */
    if (d->cuDeviceGetAttribute &&
        d->cuDeviceGetAttribute(&host_numa,
                                CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                dev) == CUDA_SUCCESS &&
        !host_numa)
        return false;
    CUmemAllocationProp ph = prop_of(dev, WO_BIND_HOST), pd = prop_of(dev, WO_BIND_DEVICE);
    if (d->cuMemGetAllocationGranularity(&gh, &ph, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
            CUDA_SUCCESS ||
        d->cuMemGetAllocationGranularity(&gd, &pd, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
            CUDA_SUCCESS ||
        !gh || !gd)
        return false;
    if (granule)
        *granule = WO_MAX(gh, gd);
    return true;
}

/* Read-write for the range's device; host-located memory needs nothing
 * more for the device's kernels and copies. */
static CUresult grant(const struct wo_bound *b, CUdeviceptr p, size_t len)
{
    CUmemAccessDesc a;

    memset(&a, 0, sizeof(a));
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = b->dev;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    return b->d->cuMemSetAccess(p, len, &a, 1);
}

static CUdeviceptr blk_ptr(const struct wo_bound *b, const struct blk *k)
{
    return b->base + k->g0 * b->gran;
}

/* An unmap the driver refused is asked once more: a transient refusal
 * must not strand memory. */
static CUresult unmap(struct wo_bound *b, CUdeviceptr p, size_t len)
{
    wo_uvm_quiesce_begin();
    CUresult r = b->d->cuMemUnmap(p, len);

    if (r != CUDA_SUCCESS)
        r = b->d->cuMemUnmap(p, len);
    wo_uvm_quiesce_end();
    return r;
}

/* A handle's memory given back, behind the copy engine's gate. */
static void release(struct wo_bound *b, CUmemGenericAllocationHandle h)
{
    wo_uvm_quiesce_begin();
    (void)b->d->cuMemRelease(h);
    wo_uvm_quiesce_end();
}

static CUresult map_blk(struct wo_bound *b, const struct blk *k)
{
    CUresult r = b->d->cuMemMap(blk_ptr(b, k), k->n * b->gran, 0, k->h, 0);

    b->st.map_calls++;
    if (r == CUDA_SUCCESS) {
        r = grant(b, blk_ptr(b, k), k->n * b->gran);
        if (r != CUDA_SUCCESS)
            (void)unmap(b, blk_ptr(b, k), k->n * b->gran);
    }
    return r;
}

static void count(struct wo_bound *b, const struct blk *k, int sign)
{
    uint64_t bytes = (uint64_t)k->n * b->gran;
    uint64_t *c = k->loc == WO_BIND_HOST ? &b->st.host_bytes : &b->st.device_bytes;

    *c = sign > 0 ? *c + bytes : *c - bytes;
}

static int reserve_blocks(struct wo_bound *b, size_t want)
{
    struct blk *nb;

    if (want <= b->cap)
        return 0;
    want = WO_MAX(want, b->cap * 2);
    nb = realloc(b->b, want * sizeof(*nb));
    if (!nb)
        return -ENOMEM;
    b->b = nb;
    b->cap = want;
    return 0;
}

void wo_bind_destroy(struct wo_bound *b)
{
    if (!b)
        return;
    for (size_t i = 0; i < b->nb; i++) {
        (void)unmap(b, blk_ptr(b, &b->b[i]), b->b[i].n * b->gran);
        release(b, b->b[i].h);
    }
    if (b->base)
        (void)b->d->cuMemAddressFree(b->base, b->size);
    if (b->copy_stream)
        (void)b->d->cuStreamDestroy_v2(b->copy_stream);
    free(b->b);
    free(b);
}

int wo_bind_create(const struct wo_driver *d, int dev, size_t size, size_t on_device,
                   struct wo_bound **out, CUresult *res)
{
    struct wo_bound *b;
    size_t gran = 0, per;
    CUresult r;

    *res = CUDA_SUCCESS;
    *out = NULL;
    if (!size)
        return -EINVAL;
    if (!wo_bind_supported(d, dev, &gran))
        return -ENOTSUP;
    b = calloc(1, sizeof(*b));
    if (!b)
        return -ENOMEM;
    b->d = d;
    b->dev = dev;
    b->gran = gran;
    b->ngr = (size + gran - 1) / gran;
    b->size = b->ngr * gran;
    /* all of it asked for: the last granule too, which the size rounds up
     * past what was asked (it was left on the host) */
    if (on_device >= size)
        on_device = b->size;
    per = WO_MAX(BLOCK_MAX / gran, (size_t)1);
    if (reserve_blocks(b, (b->ngr + per - 1) / per) < 0) {
        free(b);
        return -ENOMEM;
    }
    r = d->cuMemAddressReserve(&b->base, b->size, gran, 0, 0);
    if (r != CUDA_SUCCESS) {
        b->base = 0;
        goto fail;
    }
    for (size_t g = 0; g < b->ngr; g += per) {
        struct blk k = {.g0 = g, .n = WO_MIN(per, b->ngr - g)};
        CUmemAllocationProp p;

        k.loc = (k.g0 + k.n) * gran <= on_device ? WO_BIND_DEVICE : WO_BIND_HOST;
        p = prop_of(dev, (enum wo_bind_loc)k.loc);

        r = d->cuMemCreate(&k.h, k.n * gran, &p, 0);
        if (r != CUDA_SUCCESS)
            goto fail;
        r = map_blk(b, &k);
        if (r != CUDA_SUCCESS) {
            (void)d->cuMemRelease(k.h);
            goto fail;
        }
        b->b[b->nb++] = k;
        count(b, &k, +1);
    }
    *out = b;
    return 0;
fail:
    *res = r;
    wo_bind_destroy(b);
    return cu_err(r);
}

CUdeviceptr wo_bind_base(const struct wo_bound *b)
{
    return b->base;
}

size_t wo_bind_size(const struct wo_bound *b)
{
    return b->size;
}

size_t wo_bind_granule(const struct wo_bound *b)
{
    return b->gran;
}

/* The block holding granule g (blocks are sorted and cover every granule). */
static size_t blk_of(const struct wo_bound *b, size_t g)
{
    size_t lo = 0, hi = b->nb;

    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (b->b[mid].g0 <= g)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

enum wo_bind_loc wo_bind_where(const struct wo_bound *b, size_t off)
{
    size_t g = WO_MIN(off / b->gran, b->ngr - 1);
    return (enum wo_bind_loc)b->b[blk_of(b, g)].loc;
}

void wo_bind_stats(const struct wo_bound *b, struct wo_bind_stats *st)
{
    *st = b->st;
}

/* The new parts of block k: [k.g0, k.g0+k.n) cut where the wanted location
 * changes (inside [m0, m1) it is loc, elsewhere the block's own). */
static size_t cut(const struct blk *k, size_t m0, size_t m1, uint8_t loc, struct blk part[3])
{
    size_t e = k->g0 + k->n, np = 0;
    size_t edges[4] = {k->g0, WO_MAX(m0, k->g0), WO_MIN(m1, e), e};

    for (int i = 0; i < 3; i++) {
        if (edges[i + 1] <= edges[i])
            continue;
        part[np] = (struct blk){.g0 = edges[i], .n = edges[i + 1] - edges[i],
                                .loc = i == 1 ? loc : k->loc};
        np++;
    }
    return np;
}

/* Copies len bytes between two of the range's mappings and returns when
 * the copy is complete: the scratch mapping is unmapped and the source
 * swapped out right after. cuMemcpy is not enough: between two device
 * pointers (a HOST_NUMA mapping is one too) it returns before the copy
 * ends (cuda.h, "API synchronization behavior"), and on the H200 a 20 MiB
 * copy still running when its scratch mapping went faulted the context
 * (CUDA_ERROR_ILLEGAL_ADDRESS at the next synchronize). Its own stream,
 * non-blocking, so the engine's streams are neither waited for nor made
 * to wait; a stream that cannot be made fails the move. */
static CUresult copy_done(struct wo_bound *b, CUdeviceptr dst, CUdeviceptr src, size_t len)
{
    const struct wo_driver *d = b->d;
    CUresult r;

    if (!b->copy_stream) {
        r = d->cuStreamCreate(&b->copy_stream, CU_STREAM_NON_BLOCKING);
        if (r != CUDA_SUCCESS) {
            b->copy_stream = NULL;
            return r; /* the move fails: nothing has changed yet */
        }
    }
    r = d->cuMemcpyAsync(dst, src, len, b->copy_stream);
    return r == CUDA_SUCCESS ? d->cuStreamSynchronize(b->copy_stream) : r;
}

/* Fills part p from the old block's bytes through a scratch reservation. */
static CUresult fill(struct wo_bound *b, const struct blk *old, struct blk *p, int *made)
{
    const struct wo_driver *d = b->d;
    CUmemAllocationProp pr = prop_of(b->dev, (enum wo_bind_loc)p->loc);
    size_t len = p->n * b->gran;
    CUdeviceptr tmp = 0;
    CUresult r;

    r = d->cuMemCreate(&p->h, len, &pr, 0);
    if (r != CUDA_SUCCESS)
        return r;
    *made = 1;
    r = d->cuMemAddressReserve(&tmp, len, b->gran, 0, 0);
    if (r != CUDA_SUCCESS)
        return r;
    r = d->cuMemMap(tmp, len, 0, p->h, 0);
    b->st.map_calls++;
    if (r == CUDA_SUCCESS) {
        CUresult u;
        r = grant(b, tmp, len);
        if (r == CUDA_SUCCESS)
            r = copy_done(b, tmp, blk_ptr(b, old) + (p->g0 - old->g0) * b->gran, len);
        u = unmap(b, tmp, len);
        if (u != CUDA_SUCCESS) {
            /* the scratch mapping stays and keeps the part's memory after
             * its release: counted, and the move fails */
            b->st.leaked_bytes += len;
            return r != CUDA_SUCCESS ? r : u;
        }
    }
    (void)d->cuMemAddressFree(tmp, len);
    return r;
}

/* Replaces block i by its np parts (filled): unmap the old, map the parts;
 * on a failed map, the parts mapped so far go and the old comes back. */
static CUresult swap(struct wo_bound *b, size_t i, struct blk *part, size_t np)
{
    struct blk old = b->b[i];
    CUresult r;
    size_t j;

    r = unmap(b, blk_ptr(b, &old), old.n * b->gran);
    if (r != CUDA_SUCCESS)
        return r;
    for (j = 0; j < np; j++) {
        r = map_blk(b, &part[j]);
        if (r != CUDA_SUCCESS)
            break;
    }
    if (j < np) {
        while (j-- > 0)
            (void)unmap(b, blk_ptr(b, &part[j]), part[j].n * b->gran);
        /* the old handle was never released: its bytes are all there */
        if (map_blk(b, &old) != CUDA_SUCCESS)
            r = CUDA_ERROR_UNKNOWN; /* cannot happen short of a driver fault */
        return r;
    }
    release(b, old.h);
    count(b, &old, -1);
    for (j = 0; j < np; j++)
        count(b, &part[j], +1);
    memmove(&b->b[i + np], &b->b[i + 1], (b->nb - i - 1) * sizeof(*b->b));
    memcpy(&b->b[i], part, np * sizeof(*part));
    b->nb += np - 1;
    return CUDA_SUCCESS;
}

/* Re-backs the parts of block i that lie in [m0, m1) at loc. */
static CUresult move_blk(struct wo_bound *b, size_t i, size_t m0, size_t m1, uint8_t loc,
                         size_t *moved)
{
    struct blk old = b->b[i], part[3];
    int made[3] = {0, 0, 0};
    size_t np = cut(&old, m0, m1, loc, part);
    CUresult r = CUDA_SUCCESS;

    for (size_t j = 0; j < np && r == CUDA_SUCCESS; j++)
        r = fill(b, &old, &part[j], &made[j]);
    if (r == CUDA_SUCCESS)
        r = swap(b, i, part, np);
    if (r != CUDA_SUCCESS) {
        for (size_t j = 0; j < np; j++)
            if (made[j])
                release(b, part[j].h);
        return r;
    }
    *moved = np;
    b->st.moves++;
    b->st.moved_bytes += (uint64_t)old.n * b->gran;
    return CUDA_SUCCESS;
}

int wo_bind_move(struct wo_bound *b, size_t off, size_t len, enum wo_bind_loc loc, CUresult *res)
{
    size_t m0, m1, i;

    *res = CUDA_SUCCESS;
    if (!len || off >= b->size || len > b->size - off)
        return -EINVAL;
    m0 = off / b->gran;
    m1 = (off + len + b->gran - 1) / b->gran;
    /* each block's parts replace it; at most two more blocks per block */
    for (i = blk_of(b, m0); i < b->nb && b->b[i].g0 < m1;) {
        size_t np = 1;

        if (b->b[i].loc != (uint8_t)loc) {
            if (reserve_blocks(b, b->nb + 2) < 0)
                return -ENOMEM;
            CUresult r = move_blk(b, i, m0, m1, (uint8_t)loc, &np);
            if (r != CUDA_SUCCESS) {
                b->st.failures++;
                *res = r;
                return cu_err(r);
            }
        }
        i += np;
    }
    return 0;
}
