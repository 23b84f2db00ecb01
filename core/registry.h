/* core/registry.h: tracked device-address ranges.
 *
 * Every CUDA allocation the shim sees (passed through or served by the shim
 * itself) is one *range*: [base, base+size), non-overlapping with every other
 * live range. Names (tags) live in uvm/, keyed by range id; the registry knows
 * only addresses.
 *
 * Writers (alloc/free hooks, uvm/) serialise on one internal mutex.
 * wo_registry_lookup() takes no lock, makes no syscall and allocates nothing:
 * the launch hook calls it for every 8-byte word of kernel parameters, between
 * wo_registry_read_begin()/_end() (an epoch-based read section: memory of a
 * removed range is reclaimed only once no reader can still see it). */
#pragma once

#include "core/macro.h"

/* Range flags (struct wo_range.flags). */
enum {
    WO_RANGE_PLACEABLE = 1u << 0, /* served by the shim: its placement may change */
    WO_RANGE_MANAGED = 1u << 1,   /* backed by managed memory */
    WO_RANGE_HOST = 1u << 2,      /* backed by (pinned) host memory */
    WO_RANGE_ASYNC = 1u << 3,     /* from a stream-ordered allocator (cuMemAllocAsync) */
    WO_RANGE_VMM = 1u << 4,       /* a cuMemMap mapping (observed only) */
    WO_RANGE_ENGINE_MANAGED = 1u << 5, /* the engine's own cuMemAllocManaged */
};

struct wo_range {
    uint64_t base;
    uint64_t size;
    uint32_t id;     /* dense slot index, reused after removal */
    uint32_t gen;    /* generation of the slot: (id, gen) is unique for the process */
    uint32_t flags;  /* WO_RANGE_* */
    uint32_t device; /* CUDA device ordinal */
    uint64_t seq;    /* allocation sequence number, unique, never reused */
    void *owner;     /* uvm/'s record for this range (opaque here) */
};

/* Result of a lookup: the range holding an address and the offset in it. */
struct wo_hit {
    uint32_t id;
    uint32_t gen;
    uint64_t offset;
    bool watched; /* the range is watched (wo_registry_watch) */
};

int wo_registry_init(void);
/* Frees everything; no reader may be active. For tests and exit. */
void wo_registry_reset(void);

/* Adds [base, base+size). Returns 0 and fills *ret (may be NULL), -EEXIST when
 * it overlaps a live range, -EINVAL for size 0, wrap-around or an end beyond
 * 2^57 (no user address lies there), -ENOMEM. */
int wo_registry_add(uint64_t base, uint64_t size, uint32_t flags, uint32_t device, void *owner,
                    struct wo_range *ret);

/* Removes the range starting exactly at base. Returns 0 and fills *ret (the
 * removed range; may be NULL), or -ENOENT. */
int wo_registry_remove(uint64_t base, struct wo_range *ret);

/* Copies the range with this id into *ret: 0 or -ENOENT. Locked. */
int wo_registry_get(uint32_t id, struct wo_range *ret);

/* Copies the live range holding addr (any address inside it): 0 or -ENOENT. Locked. */
int wo_registry_find(uint64_t addr, struct wo_range *ret);

/* Updates flags/owner of a live range (placement changes keep the address). */
int wo_registry_set_flags(uint32_t id, uint32_t flags);

/* Marks the live range (id, gen) as watched: uvm/ keeps books on it (it has
 * a name, or the shim serves it), so every launch that touches it is worth an
 * event (preload/launch.c). The mark goes with the range: a removed range's id
 * comes back unwatched. 0, -ENOENT (no such live range) or -ENOMEM. */
int wo_registry_watch(uint32_t id, uint32_t gen);

/* Lock-free: 1 and *ret when addr lies inside a live range, else 0. Must be
 * called between read_begin and read_end on this thread. */
int wo_registry_lookup(uint64_t addr, struct wo_hit *ret);
void wo_registry_read_begin(void);
void wo_registry_read_end(void);

/* Number of live ranges and their total bytes (relaxed; for stats). */
size_t wo_registry_count(void);
uint64_t wo_registry_bytes(void);

/* Calls fn for every live range, under the writer lock (fn must not call
 * back into the registry). Stops early when fn returns non-zero. */
int wo_registry_foreach(int (*fn)(const struct wo_range *r, void *ud), void *ud);

/* Largest id handed out so far + 1 (ids are dense: size per-id arrays by it). */
uint32_t wo_registry_id_limit(void);

/* Unpublished entries and arrays not yet freed because a reader may still
 * see them (for stats and tests; locked). */
size_t wo_registry_pending(void);
