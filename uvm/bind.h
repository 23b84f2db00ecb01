/* uvm/bind.h: late binding at the same address (CUDA VMM).
 *
 * A bound range is a virtual address reservation whose 2 MiB granules are
 * each backed by physical memory on the device or in pinned host memory
 * (cuMemCreate with a HOST_NUMA location, read in place by kernels at
 * 49-51 GB/s on the lent machine). A granule can be re-backed later, at the
 * same address and with its contents kept: this is what lets placement be
 * decided once every name is known (at seal, by value) instead of in the
 * order the engine's bytes arrive (docs/placement.md, "Late binding").
 *
 * The mechanism only: which granule goes where is the caller's (uvm/place*).
 * A granule is the unit: a granule that straddles two tensors with
 * different placements takes one placement for both; the caller says which.
 *
 * Safety: every call keeps the contents. A re-backing copies into new
 * physical memory mapped at a scratch address first, and swaps mappings
 * only after the copy succeeded; a failure at any step leaves the old
 * backing in place (rolled back where the swap had begun) and returns the
 * driver's error. During wo_bind_move no kernel or copy may touch the moved
 * granules (the caller synchronises the engine's work first, as seal does).
 *
 * Not thread-safe on one range: the caller serialises calls on a range
 * (uvm/'s lock). No clock; the driver calls are the only side effects. */
#ifndef WO_UVM_BIND_H
#define WO_UVM_BIND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "uvm/uvm.h"

enum wo_bind_loc {
    WO_BIND_HOST = 0,   /* pinned host memory, HOST_NUMA node 0 */
    WO_BIND_DEVICE = 1, /* device memory of the range's device */
};

struct wo_bound;

/* Counters of one range (wo_bind_stats) or summed by the caller. */
struct wo_bind_stats {
    uint64_t host_bytes;   /* granule bytes backed on the host now */
    uint64_t device_bytes; /* ... on the device now */
    uint64_t moves;        /* runs of granules re-backed */
    uint64_t moved_bytes;  /* bytes copied by re-backing */
    uint64_t map_calls;    /* cuMemMap calls, creation included */
    uint64_t failures;     /* moves that failed and left the old backing */
    uint64_t leaked_bytes; /* scratch mappings the driver would not unmap */
};

/* True when the driver has every VMM entry point this needs and device
 * `dev` can back VMM memory on the host (CU_DEVICE_ATTRIBUTE 141,
 * HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, where the driver reports
 * it). *granule gets the allocation granularity (the larger of the host's
 * and the device's). */
bool wo_bind_supported(const struct wo_driver *d, int dev, size_t *granule);

/* Reserves size bytes (rounded up to the granule) on device dev and backs
 * the first `on_device` bytes (rounded down to a block; on_device >= size
 * means all of it) on the device and
 * the rest on the host: one allocation larger than the free device memory
 * (ggml's single model buffer) starts on the device as far as it can.
 * Returns 0 and *out, or -ENOMEM / -ENOTSUP / -EIO with *res the driver's
 * error (CUDA_SUCCESS when it was not a driver call); nothing is left
 * allocated on failure. */
int wo_bind_create(const struct wo_driver *d, int dev, size_t size, size_t on_device,
                   struct wo_bound **out, CUresult *res);

/* Unmaps every granule and frees the reservation and its physical memory. */
void wo_bind_destroy(struct wo_bound *b);

CUdeviceptr wo_bind_base(const struct wo_bound *b);
size_t wo_bind_size(const struct wo_bound *b);     /* reserved: a granule multiple */
size_t wo_bind_granule(const struct wo_bound *b);
/* Where the granule holding byte off is backed. */
enum wo_bind_loc wo_bind_where(const struct wo_bound *b, size_t off);
void wo_bind_stats(const struct wo_bound *b, struct wo_bind_stats *st);

/* Re-backs every granule that [off, off + len) touches at loc, contents
 * kept; granules already there are left alone. Returns 0, or a negative
 * errno with *res the driver's error: the granules of the run that failed
 * keep their old backing (runs before it were moved). */
int wo_bind_move(struct wo_bound *b, size_t off, size_t len, enum wo_bind_loc loc, CUresult *res);

#endif /* WO_UVM_BIND_H */
