/* uvm/load-copies.c: the engine's copies before seal, by where they land
 * (issue 41: a load under fit took 1.39x plain's, and its weights' loop
 * 6.4 s against 3.0 s, bench/results/bigload-20261204b-moe128-lazy-h200,
 * with the pins ready ahead of it: the copies into what the shim served
 * are the suspects). The copy hooks time each copy while the window is
 * open (uvm/hotpath.h: wo_uvm_load_copy); a destination the registry does
 * not hold (pageable host memory) is not counted. The seal line says the
 * figures, and the stats' load_copies holds them. */
#include "uvm/hotpath.h"
#include "uvm/internal.h"

#include <stdio.h>

#include "core/registry.h"

static const char *const where[WO_LOAD_COPY_KINDS] = {"device", "host", "managed", "bound"};

const char *wo_load_copy_kind_name(unsigned k)
{
    return k < WO_LOAD_COPY_KINDS ? where[k] : "?";
}

bool wo_uvm_load_timing(void)
{
    return __atomic_load_n(&wo_uvm.window_open, __ATOMIC_RELAXED) &&
           __atomic_load_n(&wo_uvm.placing, __ATOMIC_RELAXED);
}

void wo_uvm_load_copy(uint64_t dst, uint64_t bytes, uint64_t ns)
{
    struct wo_range r;
    unsigned k = WO_LOAD_COPY_DEVICE;

    if (wo_registry_find(dst, &r) < 0)
        return;
    if (r.flags & WO_RANGE_HOST)
        k = WO_LOAD_COPY_HOST;
    else if (r.flags & WO_RANGE_MANAGED)
        k = WO_LOAD_COPY_MANAGED;
    else if (r.flags & WO_RANGE_PLACEABLE)
        k = WO_LOAD_COPY_BOUND;
    __atomic_add_fetch(&wo_uvm.load_copies.calls[k], 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&wo_uvm.load_copies.bytes[k], bytes, __ATOMIC_RELAXED);
    __atomic_add_fetch(&wo_uvm.load_copies.ns[k], ns, __ATOMIC_RELAXED);
}

void wo_load_copies_line(char *out, size_t cap)
{
    size_t n = 0;

    out[0] = '\0';
    for (unsigned k = 0; k < WO_LOAD_COPY_KINDS && n < cap; k++) {
        uint64_t b = __atomic_load_n(&wo_uvm.load_copies.bytes[k], __ATOMIC_RELAXED);
        uint64_t ns = __atomic_load_n(&wo_uvm.load_copies.ns[k], __ATOMIC_RELAXED);
        char s[32];
        int w;

        if (!b)
            continue;
        w = snprintf(out + n, cap - n, "%sinto %s %s in %.2f s (%.1f GiB/s)", n ? ", " : "",
                     k == WO_LOAD_COPY_DEVICE ? "the engine's memory" : where[k],
                     wo_format_size(b, s, sizeof(s)), (double)ns / 1e9,
                     ns ? (double)b / (double)(1ull << 30) / ((double)ns / 1e9) : 0.0);
        if (w < 0)
            break;
        n += (size_t)w;
    }
}
