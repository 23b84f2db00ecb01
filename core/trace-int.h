/* core/trace-int.h: the byte layouts of docs/trace-format.md shared by the
 * trace writer (trace.c) and reader (trace-read.c). Internal to core/.
 *
 * Every field goes through put/get helpers that store it little-endian at an
 * explicit offset, so the file layout never depends on a struct layout,
 * padding or the host's endianness. */
#pragma once

#include <endian.h>
#include <string.h>

#include "core/trace.h"

/* htole/letoh + memcpy: one unaligned move on little-endian hosts, a byte
 * swap on big-endian ones; the bytes in the file are the same either way. */
static inline void wo_put16(uint8_t *p, uint16_t v)
{
    v = htole16(v);
    memcpy(p, &v, 2);
}

static inline void wo_put32(uint8_t *p, uint32_t v)
{
    v = htole32(v);
    memcpy(p, &v, 4);
}

static inline void wo_put64(uint8_t *p, uint64_t v)
{
    v = htole64(v);
    memcpy(p, &v, 8);
}

static inline uint16_t wo_get16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return le16toh(v);
}

static inline uint32_t wo_get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return le32toh(v);
}

static inline uint64_t wo_get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return le64toh(v);
}

/* Event payloads: a common part, then a fixed part per event class. */
#define WO_TEV_COMMON 24 /* t_ns u64, stream u64, tid u32, api u16, zero u16 */
#define WO_TEV_A 40      /* base, size, seq u64; flags, device, id, gen u32 */
#define WO_TEV_C 32      /* dst, src, bytes u64; kind u32, zero u32 */
#define WO_TEV_L 40      /* func u64; grid[3], block[3] u32; nhits, overflow u16; zero u32 */
#define WO_TEV_HIT 24    /* id, gen u32; offset, hi u64 */
#define WO_TEV_G 16      /* handle, aux u64 */
#define WO_TEV_P 32      /* id, gen u32; offset, bytes u64; from, to u32 */

enum wo_tev_class { WO_TEV_CLASS_NONE, WO_TEV_CLASS_A, WO_TEV_CLASS_C, WO_TEV_CLASS_L,
                    WO_TEV_CLASS_G, WO_TEV_CLASS_P };

static inline enum wo_tev_class wo_tev_class(unsigned type)
{
    switch (type) {
    case WO_EV_ALLOC:
    case WO_EV_FREE:
    case WO_EV_TAG:
        return WO_TEV_CLASS_A;
    case WO_EV_COPY:
        return WO_TEV_CLASS_C;
    case WO_EV_LAUNCH:
        return WO_TEV_CLASS_L;
    case WO_EV_CAPTURE_BEGIN:
    case WO_EV_CAPTURE_END:
    case WO_EV_GRAPH_INSTANTIATE:
    case WO_EV_GRAPH_LAUNCH:
        return WO_TEV_CLASS_G;
    case WO_EV_PLACE:
    case WO_EV_PREFETCH:
    case WO_EV_EVICT:
        return WO_TEV_CLASS_P;
    default:
        return WO_TEV_CLASS_NONE; /* sync, seal, step: the common part only */
    }
}

/* Payload bytes of an event of this type with nhits hits. */
static inline uint32_t wo_tev_size(unsigned type, unsigned nhits)
{
    switch (wo_tev_class(type)) {
    case WO_TEV_CLASS_A:
        return WO_TEV_COMMON + WO_TEV_A;
    case WO_TEV_CLASS_C:
        return WO_TEV_COMMON + WO_TEV_C;
    case WO_TEV_CLASS_L:
        return WO_TEV_COMMON + WO_TEV_L + nhits * WO_TEV_HIT;
    case WO_TEV_CLASS_G:
        return WO_TEV_COMMON + WO_TEV_G;
    case WO_TEV_CLASS_P:
        return WO_TEV_COMMON + WO_TEV_P;
    default:
        return WO_TEV_COMMON;
    }
}

/* Fixed parts of the name records (the name's bytes follow). */
#define WO_TREC_KERNEL_FIXED 10 /* func u64, len u16 */
#define WO_TREC_TAG_FIXED 46    /* id, gen u32; base, offset, size u64; placement, rule, flags u32; len u16 */
#define WO_TREC_RULE_FIXED 6    /* index u32, len u16 */
#define WO_TREC_FOOTER_FIXED 28 /* t_end, ring_dropped, records u64; ntypes u32 */
#define WO_TREC_PICKS_FIXED 12  /* t_ns u64, n u32 */
#define WO_TREC_PICK                                                                               \
    88                     /* one tensor: id, gen u32; offset, bytes u64; n_experts, hot u32;      \
                            * regs, staged, reused, rows, resident, hot_rows, engine_rows u64 */
#define WO_TREC_PICK_V1 80 /* before the copy engine's rows: no engine_rows */
#define WO_TREC_PICK_V0 72 /* before hot experts: hot 0 and no hot_rows */
#define WO_TRACE_MAX_KEY 255u
